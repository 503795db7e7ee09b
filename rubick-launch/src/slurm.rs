//! The Slurm backend: one run of the job contract as one `sbatch` job.
//!
//! [`Slurm`] is the [`Executor`]: it prepares the run like the local backend
//! ([`prepare`]), writes a batch script beside the run's log (`<log>.sbatch`: `#SBATCH`
//! lines for the resources, the time limit, the log as `--output`, the working
//! directory; then the contract's environment, each value single-quoted, and `exec` of
//! the argv, each element single-quoted, so nothing of a job's name or arguments is ever
//! shell-parsed) and submits it with `sbatch --parsable`; a poll is one `scontrol show
//! job -o`. A blocking run ([`run`], rubick-profile's) is [`run_to_end`]: polled every
//! 0.2 s until the job reaches a terminal state, watched by a [`Guard`] that cancels
//! the job (`scancel`) when the launcher dies, however it dies.
//!
//! Time: `timeoutS` counts from the moment the job is seen running (time pending in
//! the queue does not count). At the timeout every process of the job is sent
//! SIGTERM (`scancel --signal=TERM --full`); a job still there 0.2 s later is cancelled
//! (Slurm then sends SIGKILL after its `KillWait`), and the run returns once Slurm
//! has finished killing it (or 90 s later): its status is `Timeout`. A job still pending
//! [`PENDING_LIMIT`](crate::executor::PENDING_LIMIT) past its `timeoutS` is cancelled and
//! reported as an error. The job's own `--time` limit is `timeoutS + stopTimeoutS`
//! (rounded up to minutes), a backstop should the launcher be gone.
//!
//! Status and exit code: from the job's `ExitCode=A:B` (A, or none when the job was
//! killed by signal B). A job record already purged (`MinJobAge`) is looked up in the
//! job completion log (`sacct -c`), else the exit code is unknown. Slurm's
//! `OUT_OF_MEMORY` appends a marker line to the log so that [`collect`](crate::supervise::collect) reports `Oom`;
//! Slurm's own `TIMEOUT` (its time limit) is a `Timeout`.
//!
//! Environment: with `clear_env` the job starts from `PATH`, `HOME`, `LANG`, `TMPDIR`
//! and `USER` (sbatch runs with only those and `SLURM_CONF`, and exports what it has)
//! plus Slurm's own `SLURM_*` variables; otherwise from the launcher's environment.
//! `CUDA_VISIBLE_DEVICES` is Slurm's, from the `--gres=gpu:N` allocation: give the
//! request's context no `visible_devices`.
//!
//! Several nodes: the run names them (`nodelist`, in rank order: `--nodelist`), so the
//! first one is `{master_addr}` before the job is submitted. The batch script then
//! starts one launcher per node, `srun --nodes=1 --ntasks=1 --nodelist=NODE` with that
//! node's `{node_rank}` / `RUBICK_NODE_RANK` (and its per-node GPUs and cores), and
//! waits for all of them; its own exit status is the first failing node's (rank order).
//! The stop signal reaches every node's processes through Slurm (`scancel --signal
//! --full`); the batch shell traps it only to outlive it. Metric lines and checkpoints
//! come from rank 0 (the contract), into paths every node must see (a shared file
//! system).
//!
//! Limitations:
//! - On one node the argv runs once, as the batch step; on several, once per node.
//!   `ntasks_per_node` only sizes the allocation (a launcher like `torchrun` starts its
//!   workers itself).
//! - With `proctrack/linuxproc` (no cgroups) Slurm finds a job's processes by their
//!   parent pids: a signal reaches every process of the tree, but a process orphaned
//!   *before* the signal (daemonized, or left behind by a job that exited) is no longer
//!   in it and survives. `proctrack/cgroup` has no such hole; `wrapper` closes it
//!   (every launcher under a child subreaper that ends what it left behind).

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::executor::{End, Executor, Handle, RunState, Submission, Watch, Watches, run_to_end};
use crate::supervise::{Guard, LaunchError, Prepared, RunOutcome, RunRequest, RunSignal, prepare};

/// Resources of one sbatch job.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmResources {
    /// Nodes of the allocation; more than one needs `nodelist`.
    pub nodes: u32,
    /// The nodes, in rank order (`--nodelist`; the first is `{master_addr}`): `nodes`
    /// of them, or none (one node, Slurm's choice).
    pub nodelist: Vec<String>,
    pub ntasks_per_node: u32,
    /// GPUs per node (`--gres=gpu:N`); 0: none asked, no `--gres`.
    pub gpus_per_node: u32,
    pub cpus_per_task: u32,
    /// `--mem` in MiB (per node); none: the partition's default.
    pub mem_mb: Option<u64>,
    /// none: the cluster's default partition.
    pub partition: Option<String>,
    /// `--job-name` (sanitised); none: the job's name.
    pub job_name: Option<String>,
    /// Slurm's time limit in seconds; none: the launch's `timeoutS + stopTimeoutS`;
    /// zero: none asked (the partition's default applies).
    pub time_limit_s: Option<f64>,
    /// `--requeue`: Slurm may requeue the job (preemption, node failure); the job
    /// resumes from its checkpoint.
    pub requeue: bool,
    /// `--signal=B:SIG@N`: the launch's stop signal N seconds before Slurm ends the job
    /// (its time limit, a preemption), so that it checkpoints first.
    pub signal_before_end_s: Option<u64>,
    /// The run wrapper each node's launcher runs under (`wrap::command()`: a child
    /// subreaper that ends whatever the launcher left behind, `setsid` workers and
    /// daemons included, which `proctrack/linuxproc` loses); none: the launcher alone.
    /// The executable must be at the same path on the nodes (as the run's files are).
    pub wrapper: Option<Vec<String>>,
}

impl Default for SlurmResources {
    fn default() -> Self {
        SlurmResources {
            nodes: 1,
            nodelist: Vec::new(),
            ntasks_per_node: 1,
            gpus_per_node: 0,
            cpus_per_task: 1,
            mem_mb: None,
            partition: None,
            job_name: None,
            time_limit_s: None,
            requeue: false,
            signal_before_end_s: None,
            wrapper: None,
        }
    }
}

/// How long [`available`] waits for `scontrol ping`.
const PING_LIMIT: Duration = Duration::from_secs(10);

/// States a job does not leave.
const TERMINAL: [&str; 9] =
    ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"];

/// Variables kept for sbatch (and so for the job) when the request clears the environment.
const KEPT_ENV: [&str; 6] = {
    let [a, b, c, d, e] = crate::supervise::KEPT_ENV;
    [a, b, c, d, e, "SLURM_CONF"]
};

/// `Ok` when this machine can submit jobs: `sbatch`, `squeue` and `scontrol` are on
/// the `PATH` and the controller answers `scontrol ping`; else why not.
pub fn available() -> Result<(), String> {
    for program in ["sbatch", "squeue", "scontrol"] {
        if find_program(program).is_none() {
            return Err(format!("`{program}` is not on the PATH (no Slurm client here)"));
        }
    }
    // Bounded: with a missing or broken configuration scontrol retries for a minute.
    let mut child = Command::new("scontrol")
        .arg("ping")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `scontrol ping`: {e}"))?;
    let start = Instant::now();
    while child.try_wait().map_err(|e| format!("`scontrol ping`: {e}"))?.is_none() {
        if start.elapsed() >= PING_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("`scontrol ping` did not answer within {} s", PING_LIMIT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| format!("`scontrol ping`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains("is UP") {
        Ok(())
    } else {
        let said = format!("{} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim());
        Err(format!("the Slurm controller does not answer `scontrol ping`: {}", said.trim()))
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// Runs the request as one Slurm job with these resources, to its end (or its timeout),
/// and reports what it did ([`run_to_end`] over [`Slurm`]). `wall` counts from the
/// moment the job was seen running.
pub fn run(request: &RunRequest<'_>, resources: &SlurmResources) -> Result<RunOutcome, LaunchError> {
    let dir = Path::new(&request.context.metrics).parent().unwrap_or(Path::new(".")).to_path_buf();
    let run = Submission {
        request: request.clone(),
        dir,
        nodes: Vec::new(),
        cores: Vec::new(),
        name: resources.job_name.clone(),
        detached: false,
        partition: resources.partition.clone(),
    };
    run_to_end(&Slurm { resources: Some(resources.clone()), ..Slurm::default() }, &run)
}

/// Slurm as an [`Executor`]: each run one `sbatch` job (see the module's documentation).
/// A run that is not detached is watched by a [`Guard`] that cancels its job when this
/// process dies; a detached one is requeued by Slurm (`--requeue`) after a preemption
/// or a node failure, gets its stop signal before Slurm ends it, and asks no time
/// limit (the partition's default applies).
///
/// Nodes: when Slurm knows every node the submission names, the run is placed on them
/// (`--nodelist`, in rank order: the first is `{master_addr}`), one launcher per node;
/// a run on several nodes needs that. Otherwise (one node of a cluster file of its own
/// naming) Slurm picks the node. GPUs are Slurm's to pick (`--gres`), so
/// `CUDA_VISIBLE_DEVICES` is Slurm's.
#[derive(Debug, Default)]
pub struct Slurm {
    watches: Watches,
    /// The resources of every run (what [`run`] is given), instead of each submission's
    /// ([`Slurm::resources`]).
    resources: Option<SlurmResources>,
}

impl Slurm {
    pub fn new() -> Slurm {
        Slurm::default()
    }

    /// The sbatch resources of a submission (asks `sinfo` which nodes Slurm knows).
    pub fn resources(run: &Submission<'_>) -> Result<SlurmResources, LaunchError> {
        let names: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).collect();
        let known = if names.iter().any(|n| !n.is_empty()) { nodes()? } else { Vec::new() };
        let pinned = !names.is_empty() && names.iter().all(|n| known.iter().any(|k| k.name == *n));
        if names.len() > 1 && !pinned {
            return Err(LaunchError::Contract(format!(
                "{} nodes ({}), not all of them Slurm's: a run on several nodes is placed on the nodes it was \
                 planned on (plan on `rubick-run cluster --backend slurm`)",
                names.len(),
                names.join(", ")
            )));
        }
        // Per node, the most any node of the run was given: Slurm asks alike of each.
        let memory_gib = run.nodes.iter().map(|n| n.host_memory_gib).fold(0.0, f64::max);
        let wrapper = run.wrapper()?;
        Ok(SlurmResources {
            nodes: run.nodes.len().max(1) as u32,
            nodelist: if pinned { names } else { Vec::new() },
            ntasks_per_node: 1,
            gpus_per_node: run.nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0),
            cpus_per_task: run.nodes.iter().map(|n| n.cpus).max().unwrap_or(1).max(1),
            mem_mb: Some((memory_gib * 1024.0).ceil() as u64).filter(|m| *m > 0),
            partition: run.partition.clone(),
            job_name: run.name.clone(),
            time_limit_s: if run.detached { Some(0.0) } else { None },
            requeue: run.detached,
            signal_before_end_s: run.detached.then(|| run.request.launch.stop_timeout_s.ceil() as u64),
            wrapper,
        })
    }

    fn submit_with(&self, run: &Submission<'_>, resources: &SlurmResources) -> Result<Handle, LaunchError> {
        let mut request = run.request.clone();
        // Slurm sets CUDA_VISIBLE_DEVICES from its own GPU allocation.
        request.context.visible_devices = Vec::new();
        let (job, _, script) = submit_job(&request, resources)?;
        tracing::info!(job = %job, script = %script.display(), "submitted to Slurm");
        if !run.detached {
            // From here on, this process killed by anything cancels the job.
            match Guard::command(resources.wrapper.as_deref(), &["scancel", &job]) {
                Ok(guard) => self.watches.hold(&Handle::Slurm { job: job.clone() }, Watch::Guard(guard)),
                Err(source) => {
                    let _ = scancel(&job, &[]);
                    return Err(LaunchError::Spawn { program: "sh (the watchdog)".into(), source });
                }
            }
        }
        Ok(Handle::Slurm { job })
    }
}

impl Executor for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn submit(&self, run: &Submission<'_>) -> Result<Handle, LaunchError> {
        available().map_err(LaunchError::Slurm)?;
        match &self.resources {
            Some(fixed) => self.submit_with(run, fixed),
            None => self.submit_with(run, &Slurm::resources(run)?),
        }
    }

    /// One `scontrol show job` (the completion log once the record is gone; `sinfo`
    /// only for a job Slurm requeued).
    fn poll(&self, handle: &Handle, _dir: &Path, nodes: &[String]) -> RunState {
        let Handle::Slurm { job } = handle else {
            return RunState::Ended(End { note: Some(format!("{handle}: not a Slurm job")), ..End::default() });
        };
        let info = match query(job) {
            Ok(Some(info)) => info,
            Ok(None) => return RunState::Ended(completion_log(job).map_or_else(End::default, |i| ended(job, &i))),
            Err(e) => return RunState::Unknown(format!("slurm job {job}: {e}")),
        };
        if is_terminal(&info.state) {
            return RunState::Ended(ended(job, &info));
        }
        if info.waits_after_requeue() {
            return match stranded(job, &info.reason, nodes) {
                Some(why) => RunState::Stranded(why),
                None => RunState::Waiting,
            };
        }
        match info.state.as_str() {
            "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "SUSPENDED" => RunState::Waiting,
            _ => RunState::Running,
        }
    }

    fn signal(&self, handle: &Handle, signal: RunSignal) {
        let Handle::Slurm { job } = handle else { return };
        let result = if signal == RunSignal::Kill { cancel(job) } else { self::signal(job, signal.name()) };
        if let Err(e) = result {
            tracing::warn!("slurm job {job}: {e}");
        }
    }

    fn recover(&self, _dir: &Path, name: Option<&str>) -> Option<Handle> {
        find_by_name(name?).map(|job| Handle::Slurm { job })
    }

    fn handle(&self, text: &str) -> Option<Handle> {
        parse_job_id(text).filter(|id| id == text).map(|job| Handle::Slurm { job })
    }

    fn release(&self, handle: &Handle) {
        self.watches.release(handle);
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(200)
    }
}

/// How a job in a terminal state ended.
fn ended(job: &str, info: &JobInfo) -> End {
    End {
        code: info.exit_code(),
        preempted: info.state == "PREEMPTED" || info.state == "NODE_FAIL",
        timed_out: info.state == "TIMEOUT",
        note: end_note(job, &info.state),
    }
}

/// Why a job Slurm requeued cannot run again where it is pinned (one of its `nodes`
/// not usable), if it cannot; `None` when it is not pinned to nodes Slurm knows (Slurm
/// runs it again wherever it can) or they are all usable.
fn stranded(job: &str, reason: &str, nodes: &[String]) -> Option<String> {
    if nodes.is_empty() {
        return None;
    }
    let known = self::nodes().ok()?;
    let found: Vec<(&String, Option<&NodeInfo>)> =
        nodes.iter().map(|name| (name, known.iter().find(|k| k.name == *name))).collect();
    if found.iter().all(|(_, k)| k.is_none()) {
        return None;
    }
    let down: Vec<String> = found
        .iter()
        .filter_map(|(name, k)| match k {
            Some(k) if k.usable() => None,
            Some(k) => Some(format!("{name} {}", k.state)),
            None => Some(format!("{name} gone")),
        })
        .collect();
    (!down.is_empty()).then(|| format!("Slurm requeued job {job} ({reason}); not usable: {}", down.join(", ")))
}

/// Writes the batch script and submits it: the job id, the log and the script paths.
fn submit_job(request: &RunRequest<'_>, resources: &SlurmResources) -> Result<(String, PathBuf, PathBuf), LaunchError> {
    check_resources(resources)?;
    // The allocation's nodes; the first one named is the master; each node's launcher
    // has its own rank.
    let mut request = request.clone();
    request.context.nodes = resources.nodes;
    if let Some(first) = resources.nodelist.first() {
        request.context.master_addr = first.clone();
    }
    let request = &request;
    let mut ranks = vec![prepare(request)?];
    for rank in 1..resources.nodes {
        let mut ctx = request.context.clone();
        ctx.node_rank = rank;
        let (argv, env) = crate::supervise::resolve(&ctx, request.launch)?;
        ranks.push(Prepared { argv, env, workdir: ranks[0].workdir.clone() });
    }
    let cwd = std::env::current_dir().map_err(|source| LaunchError::Io { path: ".".into(), source })?;
    let log = cwd.join(&request.log);
    // A fresh log, as the local backend's: a job that never starts leaves no stale one.
    std::fs::File::create(&log).map_err(|source| LaunchError::Io { path: log.clone(), source })?;
    let script_path = {
        let mut name: OsString = log.clone().into_os_string();
        name.push(".sbatch");
        PathBuf::from(name)
    };
    let script = batch_script(&request.context.job, &ranks, resources, request.launch, &log, &cwd)?;
    std::fs::write(&script_path, script).map_err(|source| LaunchError::Io { path: script_path.clone(), source })?;
    let mut sbatch = Command::new("sbatch");
    sbatch.arg("--parsable").arg(&script_path).stdin(Stdio::null());
    if request.clear_env {
        sbatch.env_clear();
        for keep in KEPT_ENV {
            if let Some(v) = std::env::var_os(keep) {
                sbatch.env(keep, v);
            }
        }
    }
    let out = output(&mut sbatch, "sbatch")?;
    let job = parse_job_id(&out)
        .ok_or_else(|| LaunchError::Slurm(format!("sbatch: no job id in its output `{}`", out.trim())))?;
    Ok((job, log, script_path))
}

/// One node as `sinfo` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    /// Its partitions (`*`: the default one's mark dropped).
    pub partitions: Vec<String>,
    /// Whether it is in the cluster's default partition.
    pub in_default: bool,
    pub cpus: u32,
    pub memory_mb: u64,
    /// GPUs from its generic resources (`gpu:4`, `gpu:a100:4(S:0-1)`).
    pub gpus: u32,
    /// The GPUs' type when the gres names one (`gpu:a100:4`).
    pub gpu_type: Option<String>,
    /// Slurm's state, e.g. `idle`, `mixed`, `drained`, `down*`.
    pub state: String,
}

impl NodeInfo {
    /// Whether new jobs may start on it: responding (no `*`), neither drained nor
    /// draining, down, failing or in maintenance (a powered-down node, `~`, is started
    /// on demand).
    pub fn usable(&self) -> bool {
        if self.state.ends_with('*') {
            return false;
        }
        let base = self.state.trim_end_matches(['~', '#', '!', '%', '$', '@', '^', '-']);
        matches!(base, "idle" | "mixed" | "allocated" | "completing" | "planned")
    }
}

/// Every node Slurm knows, once each (`sinfo -N`: a node of several partitions lists
/// them all), in Slurm's order.
pub fn nodes() -> Result<Vec<NodeInfo>, LaunchError> {
    let mut sinfo = Command::new("sinfo");
    sinfo.args(["-N", "-h", "-o", "%N|%P|%c|%m|%G|%T"]).stdin(Stdio::null());
    Ok(parse_sinfo(&output(&mut sinfo, "sinfo")?))
}

/// `sinfo -N -h -o '%N|%P|%c|%m|%G|%T'`'s lines as nodes (lines it cannot read are
/// skipped).
fn parse_sinfo(text: &str) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [name, partition, cpus, memory, gres, state] = f[..] else { continue };
        let (partition, default) = match partition.strip_suffix('*') {
            Some(p) => (p, true),
            None => (partition, false),
        };
        if let Some(&k) = seen.get(name) {
            nodes[k].partitions.push(partition.to_owned());
            nodes[k].in_default |= default;
            continue;
        }
        seen.insert(name.to_owned(), nodes.len());
        let (gpus, gpu_type) = gpus_of(gres);
        nodes.push(NodeInfo {
            name: name.to_owned(),
            partitions: vec![partition.to_owned()],
            in_default: default,
            cpus: cpus.trim_end_matches('+').parse().unwrap_or(0),
            memory_mb: memory.trim_end_matches('+').parse().unwrap_or(0),
            gpus,
            gpu_type,
            state: state.to_owned(),
        });
    }
    nodes
}

/// The GPUs of a gres list (`gpu:2`, `gpu:a100:4(S:0-1),mps:100`, `(null)`): count and
/// type (the first typed entry's).
fn gpus_of(gres: &str) -> (u32, Option<String>) {
    let mut count = 0;
    let mut kind = None;
    for entry in gres.split(',') {
        let entry = entry.split('(').next().unwrap_or_default();
        let parts: Vec<&str> = entry.split(':').collect();
        match parts[..] {
            ["gpu", n] => count += n.parse::<u32>().unwrap_or(0),
            ["gpu", t, n] => {
                count += n.parse::<u32>().unwrap_or(0);
                kind.get_or_insert_with(|| t.to_owned());
            }
            _ => {}
        }
    }
    (count, kind)
}

/// The cluster's name (`ClusterName` of `scontrol show config`), if it has one.
pub fn cluster_name() -> Option<String> {
    let out = Command::new("scontrol").args(["show", "config"]).stdin(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "ClusterName").then(|| v.trim().to_owned()).filter(|v| !v.is_empty() && v != "(null)")
    })
}

/// Whether a state is final (the job will not run again).
pub fn is_terminal(state: &str) -> bool {
    TERMINAL.contains(&state)
}

/// Sends `signal` (e.g. `USR1`, `TERM`) to every process of the job.
pub fn signal(job: &str, signal: &str) -> Result<(), LaunchError> {
    scancel(job, &[&format!("--signal={signal}"), "--full"]).map(|_| ())
}

/// Cancels the job (Slurm kills what is left after its `KillWait`).
pub fn cancel(job: &str) -> Result<(), LaunchError> {
    scancel(job, &[]).map(|_| ())
}

/// The id of a job Slurm still knows by this name (as submitted: sanitised), if any.
pub fn find_by_name(name: &str) -> Option<String> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i", "-n", &sanitise_name(name)])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_owned)
}

fn check_resources(r: &SlurmResources) -> Result<(), LaunchError> {
    let bad = |what: &str| Err(LaunchError::Contract(format!("slurm: {what}")));
    match r {
        SlurmResources { nodes: 0, .. } => bad("nodes must be at least 1"),
        SlurmResources { nodes: 2.., nodelist, .. } if nodelist.len() != r.nodes as usize => bad(&format!(
            "a run on {} nodes names them, in rank order (nodelist: {} given): the first is its master address",
            r.nodes,
            nodelist.len()
        )),
        SlurmResources { nodes: 1, nodelist, .. } if nodelist.len() > 1 => {
            bad(&format!("one node, {} named in nodelist", nodelist.len()))
        }
        SlurmResources { nodelist, .. } if nodelist.iter().any(|n| n.is_empty() || sanitise_name(n) != *n) => {
            bad(&format!("nodelist {nodelist:?}: node names are [A-Za-z0-9._-]"))
        }
        SlurmResources { ntasks_per_node: 0, .. } => bad("ntasks_per_node must be at least 1"),
        SlurmResources { cpus_per_task: 0, .. } => bad("cpus_per_task must be at least 1"),
        SlurmResources { mem_mb: Some(0), .. } => bad("mem_mb must be at least 1"),
        _ => Ok(()),
    }
}

/// The line appended to the log for a job that ended otherwise than by its own exit.
/// `OUT_OF_MEMORY` carries one of `collect`'s out-of-memory markers.
fn end_note(job: &str, state: &str) -> Option<String> {
    match state {
        "COMPLETED" | "FAILED" => None,
        "OUT_OF_MEMORY" => Some(format!("rubick: Slurm job {job} ended OUT_OF_MEMORY (Cannot allocate memory)")),
        other => Some(format!("rubick: Slurm job {job} ended {other}")),
    }
}

/// The batch script of a run.
fn batch_script(
    job_name: &str,
    ranks: &[Prepared],
    r: &SlurmResources,
    launch: &rubick_core::launch::Launch,
    log: &Path,
    cwd: &Path,
) -> Result<String, LaunchError> {
    let prepared = ranks.first().ok_or_else(|| LaunchError::Contract("slurm: no node to run on".into()))?;
    let mut s = String::from("#!/bin/sh\n# generated by rubick (rubick-launch, Slurm backend)\n");
    let mut directive = |option: &str, value: &str| -> Result<(), LaunchError> {
        let _ = writeln!(s, "#SBATCH --{option}={}", directive_value(option, value)?);
        Ok(())
    };
    directive("job-name", &sanitise_name(r.job_name.as_deref().unwrap_or(job_name)))?;
    directive("nodes", &r.nodes.to_string())?;
    if !r.nodelist.is_empty() {
        directive("nodelist", &r.nodelist.join(","))?;
    }
    directive("ntasks-per-node", &r.ntasks_per_node.to_string())?;
    directive("cpus-per-task", &r.cpus_per_task.to_string())?;
    if r.gpus_per_node > 0 {
        directive("gres", &format!("gpu:{}", r.gpus_per_node))?;
    }
    if let Some(mem) = r.mem_mb {
        directive("mem", &mem.to_string())?;
    }
    if let Some(partition) = &r.partition {
        directive("partition", partition)?;
    }
    let limit = r.time_limit_s.unwrap_or(launch.timeout_s + launch.stop_timeout_s);
    if limit.is_finite() && limit > 0.0 {
        directive("time", &time_limit_minutes(limit).to_string())?;
    }
    if let Some(before) = r.signal_before_end_s {
        let sig = launch.stop_signal.name().trim_start_matches("SIG");
        directive("signal", &format!("B:{sig}@{before}"))?;
    }
    let log = path_text(log, "the log")?;
    if log.contains('\\') {
        return Err(LaunchError::Contract(format!("slurm: the log path `{log}` holds a backslash")));
    }
    // `%` starts one of sbatch's filename patterns (`%j`...); `%%` is a literal one.
    directive("output", &log.replace('%', "%%"))?;
    if let Some(dir) = &prepared.workdir {
        directive("chdir", path_text(&cwd.join(dir), "the working directory")?)?;
    }
    if r.requeue {
        s.push_str("#SBATCH --requeue\n");
    }
    s.push('\n');
    for (k, _) in ranks.iter().flat_map(|p| &p.env) {
        if !is_env_name(k) {
            return Err(LaunchError::Contract(format!("env: `{k}` is not a valid variable name")));
        }
    }
    // The variables every node shares are exported; a node's own go on its line.
    let shared = |k: &str| ranks.iter().all(|p| p.env.get(k) == prepared.env.get(k));
    for (k, v) in prepared.env.iter().filter(|(k, _)| shared(k)) {
        let _ = writeln!(s, "export {k}={}", sh_quote(v));
    }
    // Each launcher under the run wrapper, when one is given.
    let quoted = |argv: &[String]| {
        let line = match &r.wrapper {
            Some(wrapper) => crate::wrap::Wrap::of(argv).command_line(wrapper),
            None => argv.to_vec(),
        };
        line.iter().map(|a| sh_quote(a)).collect::<Vec<_>>().join(" ")
    };
    if let [only] = ranks {
        let _ = writeln!(s, "exec {}", quoted(&only.argv));
        return Ok(s);
    }
    if ranks.len() != r.nodelist.len() {
        return Err(LaunchError::Contract(format!("slurm: {} launchers for {} nodes", ranks.len(), r.nodelist.len())));
    }
    let sig = launch.stop_signal.name().trim_start_matches("SIG");
    let _ = writeln!(
        s,
        "# One launcher per node, each with its node rank, all waited for. The stop signal\n\
         # reaches them through Slurm (scancel --full); this shell only outlives it.\n\
         trap : {sig}\npids="
    );
    for (p, node) in ranks.iter().zip(&r.nodelist) {
        let own: Vec<String> =
            p.env.iter().filter(|(k, _)| !shared(k)).map(|(k, v)| sh_quote(&format!("{k}={v}"))).collect();
        let gres = if r.gpus_per_node > 0 { format!(" --gres=gpu:{}", r.gpus_per_node) } else { String::new() };
        let _ = writeln!(
            s,
            "srun --nodes=1 --ntasks=1 --nodelist={} --cpus-per-task={}{gres} env {} {} &\npids=\"$pids $!\"",
            sh_quote(node),
            r.cpus_per_task,
            own.join(" "),
            quoted(&p.argv)
        );
    }
    s.push_str(
        "rc=0\nfor pid in $pids; do\n  while :; do\n    wait \"$pid\"; status=$?\n    \
         # a trapped signal ended the wait, not the launcher: wait again\n    \
         [ \"$status\" -gt 128 ] && kill -0 \"$pid\" 2>/dev/null && continue\n    break\n  done\n  \
         [ \"$rc\" -ne 0 ] || rc=$status\ndone\nexit \"$rc\"\n",
    );
    Ok(s)
}

fn path_text<'p>(path: &'p Path, what: &str) -> Result<&'p str, LaunchError> {
    path.to_str().ok_or_else(|| LaunchError::Contract(format!("slurm: {what} `{}` is not UTF-8", path.display())))
}

/// `--time` in minutes: whole minutes, rounded up, at least one.
fn time_limit_minutes(seconds: f64) -> u64 {
    let minutes = (seconds / 60.0).ceil();
    if minutes.is_finite() && minutes >= 1.0 { minutes as u64 } else { 1 }
}

/// A job name Slurm and any shell take as it is: `[A-Za-z0-9._-]`, others as `_`.
fn sanitise_name(name: &str) -> String {
    let s: String = name
        .chars()
        .take(100)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    if s.is_empty() { "rubick".into() } else { s }
}

/// A value of an `#SBATCH` line: quoted, with sbatch's own escapes (`\` before `\`,
/// `"` and `#`, which would otherwise start a comment even inside quotes).
fn directive_value(option: &str, value: &str) -> Result<String, LaunchError> {
    if value.contains(['\n', '\r', '\0']) {
        return Err(LaunchError::Contract(format!("slurm: --{option} `{value}` holds a line break")));
    }
    let mut out = String::from('"');
    for c in value.chars() {
        if matches!(c, '\\' | '"' | '#') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// POSIX single quoting: the text exactly, `'` written as `'\''`.
fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The job id of `sbatch --parsable`'s output (`JOBID` or `JOBID;cluster`).
fn parse_job_id(stdout: &str) -> Option<String> {
    let id = stdout.trim().split(';').next()?.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit())).then(|| id.to_owned())
}

/// What the controller says of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
struct JobInfo {
    state: String,
    /// `ExitCode=A:B`: the exit status and the signal that ended it.
    exit: Option<(i32, i32)>,
    reason: String,
    /// How often Slurm requeued it (`Restarts=`: node failure, preemption).
    restarts: u32,
}

impl JobInfo {
    /// From one line of `scontrol show job -o` (space-separated `Key=Value` pairs; the
    /// first of each key is the job's own: a name or path further on cannot forge it).
    fn parse(line: &str) -> Option<JobInfo> {
        let field = |key: &str| line.split_whitespace().find_map(|kv| kv.strip_prefix(key)).map(str::to_owned);
        let state = field("JobState=")?;
        let exit = field("ExitCode=").and_then(|e| parse_exit(&e));
        let restarts = field("Restarts=").and_then(|r| r.parse().ok()).unwrap_or(0);
        Some(JobInfo { state, exit, reason: field("Reason=").unwrap_or_default(), restarts })
    }

    /// Requeued (by a node failure or a preemption) and not running again yet.
    fn waits_after_requeue(&self) -> bool {
        self.restarts > 0 && (self.state == "PENDING" || self.state.starts_with("REQUEUE"))
    }

    /// The exit status, none when a signal ended the job.
    fn exit_code(&self) -> Option<i32> {
        match self.exit {
            Some((code, 0)) => Some(code),
            _ => None,
        }
    }
}

fn parse_exit(text: &str) -> Option<(i32, i32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The job's state; `None` when the controller no longer knows the job.
fn query(job: &str) -> Result<Option<JobInfo>, LaunchError> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LaunchError::Spawn { program: "scontrol".into(), source })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("Invalid job id") {
            return Ok(None);
        }
        return Err(LaunchError::Slurm(format!(
            "`scontrol show job -o {job}` exited {}: {}",
            out.status,
            stderr.trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with(&format!("JobId={job} ")));
    Ok(line.and_then(JobInfo::parse))
}

/// The job's end from the job completion log (`sacct -c`: no accounting database
/// needed), the last record of that id; none when there is no such log.
fn completion_log(job: &str) -> Option<JobInfo> {
    let out = Command::new("sacct")
        .args(["-c", "-j", job, "-n", "-P", "-o", "JobID,State,ExitCode"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().rev().find_map(|l| {
        let mut f = l.split('|');
        (f.next()? == job).then_some(())?;
        // sacct writes `CANCELLED by 0`.
        let state = f.next()?.split_whitespace().next()?.to_owned();
        Some(JobInfo { state, exit: f.next().and_then(parse_exit), reason: String::new(), restarts: 0 })
    })
}

fn scancel(job: &str, options: &[&str]) -> Result<String, LaunchError> {
    output(Command::new("scancel").args(options).arg(job).stdin(Stdio::null()), "scancel")
}

/// Runs a Slurm command; its stdout, or an error naming it with its stderr.
fn output(command: &mut Command, program: &str) -> Result<String, LaunchError> {
    let out = command.output().map_err(|source| LaunchError::Spawn { program: program.into(), source })?;
    if !out.status.success() {
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        return Err(LaunchError::Slurm(format!(
            "`{program} {}` exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::executor::append;
    use crate::supervise::tests::{launch, request};
    use crate::supervise::{RunStatus, collect};

    /// Whether a Slurm is here to test against; without one the test is skipped, or
    /// fails where Slurm is required (CI).
    fn slurm_here() -> bool {
        let found = available();
        if let Err(reason) = &found {
            rubick_io::testing::missing(
                rubick_io::testing::Need::Slurm,
                &format!("{reason} (run scripts/slurm-up.sh)"),
            );
        }
        found.is_ok()
    }

    /// A directory whose path holds what `#SBATCH` lines and `--output` patterns
    /// must escape: a space, `#` and `%`.
    fn tempdir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("rubick slurm #%j ").tempdir().unwrap()
    }

    fn one_cpu(gpus: u32) -> SlurmResources {
        SlurmResources { gpus_per_node: gpus, ..SlurmResources::default() }
    }

    fn log_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default()
    }

    #[test]
    fn a_job_reports_its_metric_lines_and_sees_its_resources() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        // Braces of the script itself are doubled: single ones are placeholders.
        let script = r#"test "$1" = 2 || exit 3
for i in 1 2 3 4; do echo "{{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.$i}}" >> "$RUBICK_METRICS"; done
echo "not a metric" >> "$RUBICK_METRICS"
echo "cpus=$SLURM_CPUS_PER_TASK gpus=$CUDA_VISIBLE_DEVICES plan=$RUBICK_PLAN job=$SLURM_JOB_NAME""#;
        let l = launch(script, 30.0);
        let out = run(&request(dir.path(), &l), &one_cpu(1)).unwrap();
        let log = log_of(dir.path());
        assert_eq!((out.status, out.exit_code), (RunStatus::Ok, Some(0)), "{log}");
        assert_eq!(out.metrics.len(), 4);
        assert_eq!(out.ignored_lines, 1);
        let times =
            rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&out.metrics, 1, Some(3)));
        assert_eq!(times, [0.2, 0.3, 0.4]);
        let line = log.lines().find(|l| l.starts_with("cpus=")).unwrap_or_else(|| panic!("{log}"));
        let fields: BTreeMap<&str, &str> = line.split(' ').filter_map(|kv| kv.split_once('=')).collect();
        assert_eq!(fields["cpus"], "1", "{line}");
        // One of the four fake GPUs, chosen by Slurm.
        assert!(fields["gpus"].parse::<u32>().is_ok_and(|g| g < 4), "{line}");
        assert_eq!(fields["plan"], "dp2-tp1-pp1-mb2-ga2", "{line}");
        assert_eq!(fields["job"], "__touch_pwned_", "{line}");
        let ds: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("ds.json")).unwrap()).unwrap();
        assert_eq!(ds["train_batch_size"], 8);
        assert!(dir.path().join("log.txt.sbatch").is_file());
        eprintln!("a_job_reports_its_metric_lines: {:.1} s", t.elapsed().as_secs_f64());
    }

    #[test]
    fn a_job_name_and_values_are_never_shell_parsed() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        let mut l = launch(r#"echo "job $RUBICK_JOB quote $QUOTE arg $0"; pwd"#, 30.0);
        l.env.insert("QUOTE".into(), "it's $(touch pwned2) `touch pwned3`".into());
        l.workdir = Some(dir.path().display().to_string().replace('{', "{{").replace('}', "}}"));
        l.command[3] = "a'b $(touch pwned4)".into();
        let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
        let log = log_of(dir.path());
        assert_eq!(out.status, RunStatus::Ok, "{log}");
        assert!(
            log.contains("job $(touch pwned) quote it's $(touch pwned2) `touch pwned3` arg a'b $(touch pwned4)"),
            "{log}"
        );
        assert!(log.contains(&dir.path().display().to_string()), "the job ran in its workdir: {log}");
        for name in ["pwned", "pwned2", "pwned3", "pwned4"] {
            assert!(!dir.path().join(name).exists() && !Path::new(name).exists(), "{name} was created");
        }
        eprintln!("a_job_name_and_values_are_never_shell_parsed: {:.1} s", t.elapsed().as_secs_f64());
    }

    #[test]
    fn a_hanging_job_is_cancelled_at_its_timeout_with_every_process() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        // A worker in the background that would outlive its job.
        let pidfile = dir.path().join("worker.pid");
        let script = format!("sleep 60 & echo $! > '{}'; wait", pidfile.display());
        let l = launch(&script.replace('{', "{{").replace('}', "}}"), 2.0);
        let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
        assert_eq!(out.status, RunStatus::Timeout, "{}", log_of(dir.path()));
        assert!(out.wall >= Duration::from_secs(2) && out.wall < Duration::from_secs(10), "{:?}", out.wall);
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
        // Gone, or a zombie waiting for init to reap it: not running either way.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
        assert!(!running, "worker {pid} survived its job: {state}");
        eprintln!("a_hanging_job_is_cancelled_at_its_timeout: {:.1} s", t.elapsed().as_secs_f64());
    }

    /// Slow (Slurm's `KillWait`, 30 s by default): `cargo test -- --ignored`.
    #[test]
    #[ignore]
    fn a_job_that_ignores_sigterm_is_killed_all_the_same() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        let pidfile = dir.path().join("worker.pid");
        // SIGTERM ignored, by the job and (inherited) by its worker.
        let script = format!("trap '' TERM; sleep 300 & echo $! > '{}'; exec sleep 301", pidfile.display());
        let l = launch(&script.replace('{', "{{").replace('}', "}}"), 1.0);
        let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
        assert_eq!(out.status, RunStatus::Timeout, "{}", log_of(dir.path()));
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
        assert!(!running, "worker {pid} survived its job: {state}");
        eprintln!("a_job_that_ignores_sigterm_is_killed_all_the_same: {:.1} s", t.elapsed().as_secs_f64());
    }

    #[test]
    fn an_exit_status_is_the_jobs() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        let l = launch(r#"echo "job id $SLURM_JOB_ID"; exit 7"#, 30.0);
        let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
        let log = log_of(dir.path());
        assert_eq!((out.status, out.exit_code), (RunStatus::Failed, Some(7)), "{log}");
        // What a run reads once the controller has forgotten the job (MinJobAge): the job
        // completion log, where the cluster keeps one (scripts/slurm-up.sh does).
        let id = log.lines().find_map(|l| l.strip_prefix("job id ")).unwrap_or_else(|| panic!("{log}"));
        match completion_log(id) {
            Some(info) => assert_eq!((info.state.as_str(), info.exit_code()), ("FAILED", Some(7))),
            None => eprintln!("no job completion log here: the fallback is not checked"),
        }
        eprintln!("an_exit_status_is_the_jobs: {:.1} s", t.elapsed().as_secs_f64());
    }

    #[test]
    fn out_of_memory_is_an_infeasible_configuration() {
        if !slurm_here() {
            return;
        }
        let t = Instant::now();
        let dir = tempdir();
        let l = launch(r#"echo '{{"rubick":1,"event":"oom"}}' >> "$RUBICK_METRICS"; exit 1"#, 30.0);
        let out = run(&request(dir.path(), &l), &one_cpu(0)).unwrap();
        assert_eq!(out.status, RunStatus::Oom, "{}", log_of(dir.path()));
        eprintln!("out_of_memory_is_an_infeasible_configuration: {:.1} s", t.elapsed().as_secs_f64());
    }

    #[test]
    fn more_than_one_node_without_their_names_is_refused_before_anything_is_written() {
        // `run` finds the Slurm client before it reads the resources.
        if !slurm_here() {
            return;
        }
        let dir = tempdir();
        let l = launch("true", 30.0);
        for r in [
            SlurmResources { nodes: 2, ..SlurmResources::default() },
            SlurmResources { nodes: 2, nodelist: vec!["mn1".into()], ..SlurmResources::default() },
            SlurmResources { nodes: 1, nodelist: vec!["mn1".into(), "mn2".into()], ..SlurmResources::default() },
            SlurmResources { nodes: 1, nodelist: vec!["$(x)".into()], ..SlurmResources::default() },
        ] {
            let e = run(&request(dir.path(), &l), &r).unwrap_err();
            assert!(matches!(e, LaunchError::Contract(_)) && e.to_string().contains("nodelist"), "{e}");
            assert!(!dir.path().join("log.txt.sbatch").exists());
        }
    }

    #[test]
    fn a_run_on_two_nodes_starts_one_launcher_per_node_with_its_rank() {
        let p0 = prepared(&[("A", "same"), ("RUBICK_NODE_RANK", "0")], &["python", "t.py", "--rank=0"], None);
        let p1 = prepared(&[("A", "same"), ("RUBICK_NODE_RANK", "1")], &["python", "t.py", "--rank=1"], None);
        let r = SlurmResources {
            nodes: 2,
            nodelist: vec!["mn2".into(), "mn1".into()],
            gpus_per_node: 1,
            cpus_per_task: 2,
            ..SlurmResources::default()
        };
        let l = launch("true", 61.0);
        let s = batch_script("j", &[p0, p1], &r, &l, Path::new("/l"), Path::new("/")).unwrap();
        assert!(s.contains("#SBATCH --nodes=\"2\"\n#SBATCH --nodelist=\"mn2,mn1\"\n"), "{s}");
        assert!(s.contains("export A='same'\n") && !s.contains("export RUBICK_NODE_RANK"), "{s}");
        assert!(
            s.contains("srun --nodes=1 --ntasks=1 --nodelist='mn2' --cpus-per-task=2 --gres=gpu:1 env 'RUBICK_NODE_RANK=0' 'python' 't.py' '--rank=0' &"),
            "{s}"
        );
        assert!(
            s.contains(
                "--nodelist='mn1' --cpus-per-task=2 --gres=gpu:1 env 'RUBICK_NODE_RANK=1' 'python' 't.py' '--rank=1' &"
            ),
            "{s}"
        );
        assert!(s.contains("trap : USR1\n") && !s.contains("exec "), "{s}");
    }

    #[test]
    fn the_batch_of_several_nodes_waits_for_all_and_exits_as_the_first_failing() {
        // The generated shell itself, `srun` stood in by a function running the rest.
        let dir = tempfile::tempdir().unwrap();
        let node = |rank: &str, code: &str| {
            prepared(
                &[("RUBICK_NODE_RANK", rank)],
                &["sh", "-c", &format!("sleep 0.{rank}; echo $RUBICK_NODE_RANK >> ranks; exit {code}")],
                None,
            )
        };
        let r = SlurmResources { nodes: 2, nodelist: vec!["a".into(), "b".into()], ..SlurmResources::default() };
        for (codes, expect) in [(("0", "0"), 0), (("0", "5"), 5), (("3", "5"), 3)] {
            let s = batch_script(
                "n",
                &[node("1", codes.0), node("2", codes.1)],
                &r,
                &launch("true", 1.0),
                Path::new("/l"),
                Path::new("/"),
            )
            .unwrap();
            let s = s.replacen("\n\n", "\nsrun() { while [ \"${1#--}\" != \"$1\" ]; do shift; done; \"$@\"; }\n", 1);
            let _ = std::fs::remove_file(dir.path().join("ranks"));
            let out = Command::new("sh").arg("-c").arg(&s).current_dir(dir.path()).output().unwrap();
            assert_eq!(out.status.code(), Some(expect), "{s}\n{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(std::fs::read_to_string(dir.path().join("ranks")).unwrap(), "1\n2\n");
        }
    }

    fn prepared(env: &[(&str, &str)], argv: &[&str], workdir: Option<&str>) -> Prepared {
        Prepared {
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            workdir: workdir.map(PathBuf::from),
        }
    }

    #[test]
    fn the_batch_script_quotes_everything_and_asks_for_the_resources() {
        let p = prepared(&[("RUBICK_JOB", "$(touch pwned) it's")], &["python", "a b", "'"], Some("work dir"));
        let r = SlurmResources {
            nodes: 1,
            ntasks_per_node: 2,
            gpus_per_node: 0,
            cpus_per_task: 3,
            mem_mb: Some(4096),
            partition: Some("gpu#1".into()),
            ..SlurmResources::default()
        };
        let mut l = launch("true", 61.0);
        l.stop_timeout_s = 0.5;
        let s = batch_script(
            "$(touch pwned)",
            std::slice::from_ref(&p),
            &r,
            &l,
            Path::new("/r/log %j #1.txt"),
            Path::new("/cwd"),
        )
        .unwrap();
        let expected = r#"#!/bin/sh
# generated by rubick (rubick-launch, Slurm backend)
#SBATCH --job-name="__touch_pwned_"
#SBATCH --nodes="1"
#SBATCH --ntasks-per-node="2"
#SBATCH --cpus-per-task="3"
#SBATCH --mem="4096"
#SBATCH --partition="gpu\#1"
#SBATCH --time="2"
#SBATCH --output="/r/log %%j \#1.txt"
#SBATCH --chdir="/cwd/work dir"

export RUBICK_JOB='$(touch pwned) it'\''s'
exec 'python' 'a b' ''\'''
"#;
        assert_eq!(s, expected);
        let with_gpu =
            batch_script("j", std::slice::from_ref(&p), &one_cpu(2), &l, Path::new("/l"), Path::new("/")).unwrap();
        assert!(with_gpu.contains("#SBATCH --gres=\"gpu:2\"\n") && with_gpu.contains("--time=\"2\""), "{with_gpu}");
        assert!(
            !batch_script("j", std::slice::from_ref(&p), &one_cpu(0), &l, Path::new("/l"), Path::new("/"))
                .unwrap()
                .contains("gres")
        );
        let bad = prepared(&[("A B", "x")], &["true"], None);
        assert!(batch_script("j", &[bad], &one_cpu(0), &l, Path::new("/l"), Path::new("/")).is_err());
        assert!(
            batch_script("j", std::slice::from_ref(&p), &one_cpu(0), &l, Path::new("/l\nx"), Path::new("/")).is_err()
        );
        assert_eq!((time_limit_minutes(0.1), time_limit_minutes(60.0), time_limit_minutes(60.5)), (1, 1, 2));
    }

    #[test]
    fn the_quoted_script_runs_in_a_shell_as_written() {
        // The quoting itself, through a real sh: every byte comes back as it was.
        let dir = tempfile::tempdir().unwrap();
        let nasty = "it's $(touch pwned) `x` \"q\" \\ \n$HOME *";
        let p = prepared(&[("V", nasty)], &["sh", "-c", r#"printf '%s|%s' "$V" "$1""#, "x", nasty], None);
        let s = batch_script("n", &[p], &one_cpu(0), &launch("true", 1.0), Path::new("/l"), Path::new("/")).unwrap();
        let out = Command::new("sh").arg("-c").arg(&s).current_dir(dir.path()).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{nasty}|{nasty}"));
        assert!(!dir.path().join("pwned").exists());
    }

    #[test]
    fn every_launcher_runs_under_the_wrapper_when_one_is_given() {
        let wrapper = Some(vec!["/opt/rubick run".to_owned(), crate::wrap::SUBCOMMAND.to_owned()]);
        let under = format!("'/opt/rubick run' '{}' '--grace' '10' '--' 'python' 'train.py'", crate::wrap::SUBCOMMAND);
        let p = prepared(&[("RUBICK_NODE_RANK", "0")], &["python", "train.py"], None);
        let one = SlurmResources { wrapper: wrapper.clone(), ..one_cpu(0) };
        let s =
            batch_script("n", std::slice::from_ref(&p), &one, &launch("true", 1.0), Path::new("/l"), Path::new("/"))
                .unwrap();
        assert!(s.contains(&format!("exec {under}")), "{s}");
        let mut q = p.clone();
        q.env.insert("RUBICK_NODE_RANK".into(), "1".into());
        let two = SlurmResources { nodes: 2, nodelist: vec!["a".into(), "b".into()], wrapper, ..one_cpu(0) };
        let s = batch_script("n", &[p, q], &two, &launch("true", 1.0), Path::new("/l"), Path::new("/")).unwrap();
        assert_eq!(s.matches(&under).count(), 2, "{s}");
    }

    #[test]
    fn sinfo_describes_each_node_once_with_its_gpus_and_state() {
        let text = "mn1|debug*|2|23000|gpu:2|idle\nmn1|long|2|23000|gpu:2|idle\n\
                    mn2|debug*|2|23000|gpu:a100:4(S:0-1),mps:100|drained\nmn3|debug*|64+|512000|(null)|down*\nbad line\n";
        let nodes = parse_sinfo(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].partitions, ["debug", "long"]);
        assert!(nodes[0].in_default && nodes[0].usable());
        assert_eq!(
            (nodes[0].cpus, nodes[0].memory_mb, nodes[0].gpus, nodes[0].gpu_type.as_deref()),
            (2, 23000, 2, None)
        );
        assert_eq!((nodes[1].gpus, nodes[1].gpu_type.as_deref(), nodes[1].usable()), (4, Some("a100"), false));
        assert_eq!((nodes[2].cpus, nodes[2].gpus, nodes[2].usable()), (64, 0, false));
        // `allocated*`: not responding; `idle~`: powered down, started on demand.
        for (state, usable) in
            [("mixed", true), ("allocated*", false), ("draining", false), ("idle~", true), ("maint", false)]
        {
            let n = NodeInfo { state: state.into(), ..nodes[0].clone() };
            assert_eq!(n.usable(), usable, "{state}");
        }
    }

    #[test]
    fn job_states_and_exit_codes_are_read_from_scontrol() {
        let line = "JobId=12 JobName=a_JobState=FAKE UserId=root(0) JobState=CANCELLED Reason=None \
                    Dependency=(null) ExitCode=0:15 RunTime=00:00:03 WorkDir=/x JobState=EVIL";
        let info = JobInfo::parse(line).unwrap();
        assert_eq!((info.state.as_str(), info.exit, info.exit_code()), ("CANCELLED", Some((0, 15)), None));
        let info = JobInfo::parse("JobId=3 JobState=FAILED Reason=NonZeroExitCode ExitCode=7:0").unwrap();
        assert_eq!((info.exit_code(), info.reason.as_str()), (Some(7), "NonZeroExitCode"));
        assert!(!info.waits_after_requeue());
        // As seen after a node of the job failed (its slurmd and processes killed).
        let requeued = "JobId=355 JobName=job.sh JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:mn2 \
                        Requeue=1 Restarts=1 ReqNodeList=mn[1-2] NodeList=(null)";
        let info = JobInfo::parse(requeued).unwrap();
        assert!(info.waits_after_requeue(), "{info:?}");
        assert_eq!(info.reason, "ReqNodeNotAvail,_UnavailableNodes:mn2");
        let first = JobInfo::parse("JobId=356 JobState=PENDING Reason=Resources Restarts=0").unwrap();
        assert!(!first.waits_after_requeue(), "pending for the first time: {first:?}");
        assert_eq!(parse_job_id("42\n"), Some("42".into()));
        assert_eq!(parse_job_id("42;rubick\n"), Some("42".into()));
        assert_eq!(parse_job_id("Submitted batch job 42"), None);
        assert_eq!(sanitise_name("$(touch pwned)"), "__touch_pwned_");
        assert_eq!(sanitise_name("gpt-2.small_v1"), "gpt-2.small_v1");
        assert_eq!(sanitise_name(""), "rubick");
    }

    #[test]
    fn slurms_out_of_memory_state_makes_the_run_an_oom() {
        let dir = tempfile::tempdir().unwrap();
        let (metrics, log) = (dir.path().join("m"), dir.path().join("log"));
        std::fs::write(&log, "Killed\n").unwrap();
        append(&log, &end_note("9", "OUT_OF_MEMORY").unwrap());
        let out = collect(&metrics, &log, false, None, Duration::ZERO);
        assert_eq!(out.status, RunStatus::Oom);
        assert_eq!(end_note("9", "COMPLETED"), None);
        assert_eq!(end_note("9", "NODE_FAIL").as_deref(), Some("rubick: Slurm job 9 ended NODE_FAIL"));
    }
}
