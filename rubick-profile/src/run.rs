//! `rubick-profile run`: measure a job under a few configurations.
//!
//! The configurations come from `--configs` or from rubick-core's selection over the
//! job's plan space on one node of the cluster. Each (configuration, repetition) is a
//! run of the job contract through the shared launch crate: locally (in parallel on
//! disjoint GPU sets) or as an `sbatch` job. After every finished run the whole table
//! is rewritten atomically, so a profile killed at any moment keeps what it measured,
//! and a second `run` with the same `-o` measures only what is missing. Each run's
//! files (log, metric lines, DeepSpeed JSON, checkpoints) stay in the work directory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rubick_core::launch::{Launch, LaunchContext, MetricLine, iteration_times, mean_sd, measured_iterations};
use rubick_core::schedule::NodeShare;
use rubick_core::tables::{PROFILE, ProfileRow, ProfileStatus};
use rubick_core::{Cluster, Job, NodeGroup, Placement, Plan};
use rubick_io::cli::Outcome;
use rubick_io::files::{is_std, load_artifact};
use rubick_launch::{Executor, RunOutcome, RunRequest, RunStatus, Submission};
use rubick_model::MemoryEstimator;
use rubick_model::select::{Candidate, select};

use crate::devices::{self, CPU_GPU_TYPE, GpuMetrics, Sampler};

/// Where runs execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Processes on this machine, each in a process group of its own
    Local,
    /// One `sbatch` job per run on the Slurm cluster this machine submits to
    Slurm,
    /// A Kubeflow PyTorchJob (or TrainJob) per run, applied with kubectl; the runs'
    /// directories on a volume this machine shares with the pods (runsPvc + runsRoot)
    Kubernetes,
}

/// Arguments of `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The Job to profile (YAML), with its `launch` section (see the README: the job contract)
    pub job: PathBuf,
    /// The cluster the runs use (one node of its first group); default: this machine,
    /// as `rubick-profile devices --cluster-out` describes it
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// How many configurations rubick-core's selection picks from the plan space
    #[arg(long, default_value_t = 8, conflicts_with = "configs")]
    pub budget: usize,
    /// Run these configurations instead: a table (CSV or Parquet) with columns `plan`
    /// (readable form, e.g. dp2-tp1-pp1-mb4-ga2-z1) and `placement` (e.g. 2)
    #[arg(long)]
    pub configs: Option<PathBuf>,
    /// Runs of every configuration (for `compare`'s noise)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Where the runs execute
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// Runs at a time [default: as many as the node's GPUs allow; 1 on a CPU cluster,
    /// whose runs would share cores and memory bandwidth]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: Option<u32>,
    /// Slurm partition (default: the cluster's default)
    #[arg(long)]
    pub partition: Option<String>,
    /// Kubernetes settings (YAML: image, context, namespace, checkpointPvc, kubectl, kind,
    /// runsPvc, runsRoot; a field left out falls back to its RUBICK_K8S_* variable)
    #[arg(long, value_name = "FILE")]
    pub kubernetes: Option<PathBuf>,
    /// Where each run's log, metric lines and checkpoints go [default: OUTPUT.runs/]
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Start over: ignore the rows OUTPUT already holds (default: keep them and run only
    /// the missing configurations)
    #[arg(long)]
    pub fresh: bool,
    /// The profile table (CSV or Parquet by extension; `-`: CSV on stdout at the end)
    #[arg(short, long)]
    pub output: PathBuf,
}

/// One run to make: a configuration and its repetition.
#[derive(Debug, Clone)]
struct Planned {
    index: usize,
    plan: Plan,
    placement: Placement,
    repeat: u32,
    cpus: u32,
    host_memory_gib: f64,
}

impl Planned {
    fn key(&self) -> (String, String, i64) {
        (self.plan.to_string(), self.placement.to_string(), i64::from(self.repeat))
    }

    fn dir_name(&self) -> String {
        format!("{:03}-{}-{}-r{}", self.index, self.plan, self.placement, self.repeat)
    }
}

/// What a finished run sends back.
struct Finished {
    planned: Planned,
    devices: Vec<u32>,
    result: Result<RunOutcome, String>,
    gpu: Option<GpuMetrics>,
    log: PathBuf,
}

/// The Slurm nodes a run across nodes of `placement` is placed on, of `known` (`sinfo`):
/// the first usable ones (in Slurm's order) with the GPUs the busiest node of the
/// placement needs (any usable node on a CPU cluster), as many as it spans.
fn slurm_nodes_for(
    known: &[rubick_launch::slurm::NodeInfo],
    placement: &Placement,
    on_cpu: bool,
) -> anyhow::Result<Vec<String>> {
    let per_node = placement.max_per_node();
    let nodes: Vec<String> = known
        .iter()
        .filter(|n| n.usable() && (on_cpu || n.gpus >= per_node))
        .map(|n| n.name.clone())
        .take(placement.nodes() as usize)
        .collect();
    anyhow::ensure!(
        nodes.len() == placement.nodes() as usize,
        "placement {placement} spans {} nodes of {per_node} GPUs; Slurm has {} usable",
        placement.nodes(),
        nodes.len()
    );
    Ok(nodes)
}

/// The Kubernetes backend for a profile: the environment's settings under `settings`'s;
/// kubectl mode, and the work directory on the runs volume (the profile reads each run's
/// metric lines back), else an error saying what is missing.
fn kubernetes(settings: Option<&Path>, work_dir: &Path) -> anyhow::Result<rubick_launch::kubernetes::Kubernetes> {
    use rubick_launch::kubernetes::{Kubernetes, Mode, Settings};
    let mut k = Kubernetes::from_env();
    if let Some(path) = settings {
        k = k.with(Settings::load(path)?);
    }
    anyhow::ensure!(
        k.mode == Mode::Kubectl,
        "--backend kubernetes: the runs are applied to a cluster with kubectl: set `kubectl: true` in --kubernetes \
         FILE (or KUBECONFIG, with kubectl on PATH); writing manifests alone measures nothing"
    );
    anyhow::ensure!(
        k.shares(work_dir),
        "--backend kubernetes: the profile reads each run's metric lines from its directory, so the work directory \
         ({}) must be on a volume the pods share with this machine: `runsPvc` (the claim) and `runsRoot` (where it \
         is mounted, here and in the pods) in --kubernetes FILE, and --work-dir under runsRoot{}",
        work_dir.display(),
        k.runs.as_ref().map_or(String::new(), |r| format!(" (runsRoot is {})", r.root.display()))
    );
    Ok(k)
}

/// The configurations to run: the table's, checked against the job and the node, or
/// the selection's over the job's plan space on 1..=gpusPerNode GPUs of one node.
fn configurations(args: &RunArgs, job: &Job, group: &NodeGroup) -> anyhow::Result<Vec<(Plan, Placement)>> {
    if let Some(path) = &args.configs {
        let configs = rubick_io::table::read_configurations(path)?;
        // Slurm's nodes, asked once, when a placement spans nodes.
        let mut known: Option<Vec<rubick_launch::slurm::NodeInfo>> = None;
        anyhow::ensure!(!configs.is_empty(), "{}: no configurations", path.display());
        for (i, (plan, placement)) in configs.iter().enumerate() {
            let at = || format!("{}: line {}", path.display(), i + 2);
            plan.check(&job.model, placement.gpus())
                .map_err(|v| anyhow::anyhow!("{}: plan `{plan}` on placement {placement}: {v}", at()))?;
            if let Some(why) = job.refusal(plan) {
                bail!("{}: plan `{plan}` uses {why}, which the job's script does not implement", at());
            }
            if placement.is_multi_node() {
                match args.backend {
                    // Across nodes: through Slurm, on as many of its usable nodes.
                    Backend::Slurm => {
                        let known = match &mut known {
                            Some(k) => k,
                            None => known.insert(rubick_launch::slurm::nodes()?),
                        };
                        slurm_nodes_for(known, placement, group.gpu_type == CPU_GPU_TYPE)
                            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
                    }
                    // Master and Workers (numNodes), where the cluster puts them.
                    Backend::Kubernetes => {}
                    Backend::Local => bail!(
                        "{}: placement {placement} spans {} nodes: a profile across nodes runs through Slurm \
                         (--backend slurm) or Kubernetes (--backend kubernetes)",
                        at(),
                        placement.nodes()
                    ),
                }
            } else {
                anyhow::ensure!(
                    placement.gpus() <= group.gpus_per_node,
                    "{}: placement {placement}: a profile runs on one node of {} GPUs (group `{}`), or across nodes through Slurm",
                    at(),
                    group.gpus_per_node,
                    group.name
                );
            }
        }
        return Ok(configs);
    }
    anyhow::ensure!(args.budget >= 1, "--budget: must be at least 1");
    let estimator = MemoryEstimator::default();
    let candidates: Vec<Candidate> = rubick_model::select::one_node_candidates(job, group, &estimator);
    anyhow::ensure!(
        !candidates.is_empty(),
        "job `{}`: no plan of its model fits one node of group `{}` ({} x {} GiB)",
        job.name,
        group.name,
        group.gpus_per_node,
        group.gpu_memory_gib
    );
    let chosen = select(&candidates, args.budget.min(candidates.len()));
    tracing::info!("selected {} of {} configurations of the plan space", chosen.len(), candidates.len());
    Ok(chosen.into_iter().map(|i| (candidates[i].plan, candidates[i].placement.clone())).collect())
}

/// The rows a previous run of this profile left in `output` (none when absent or
/// `--fresh`); rows of another job are an error rather than silently mixed.
fn existing_rows(output: &Path, job: &Job, fresh: bool) -> anyhow::Result<Vec<ProfileRow>> {
    if fresh || is_std(output) || !output.exists() {
        return Ok(Vec::new());
    }
    let rows: Vec<ProfileRow> = rubick_io::table::read_rows(output, &PROFILE)
        .with_context(|| format!("{}: cannot resume from it (use --fresh to start over)", output.display()))?;
    if let Some(other) = rows.iter().find(|r| r.job != job.name) {
        bail!(
            "{}: holds a profile of job `{}`, not `{}`; use --fresh to overwrite it or another -o",
            output.display(),
            other.job,
            job.name
        );
    }
    Ok(rows)
}

fn write_rows(output: &Path, rows: &mut [ProfileRow]) -> anyhow::Result<()> {
    rows.sort_by(|a, b| (&a.plan, &a.placement, a.repeat).cmp(&(&b.plan, &b.placement, b.repeat)));
    let mut df = rubick_io::table::frame_of(rows, &PROFILE)?;
    rubick_io::table::write_table(&mut df, output, None, &PROFILE)?;
    Ok(())
}

/// Runs the profile.
pub fn run(args: &RunArgs) -> anyhow::Result<Outcome> {
    let job: Job = load_artifact(&args.job)?;
    let launch = job.launch.clone().with_context(|| {
        format!(
            "{}: launch: missing (rubick-profile starts the job through its `launch` section; see the README, \"The job contract\")",
            args.job.display()
        )
    })?;
    // Without --cluster, this machine; the warning that it has no GPU waits for the
    // job's requirements (a job that requires one is refused in one line instead).
    let mut on_this_cpu = None;
    let cluster: Cluster = match &args.cluster {
        Some(path) => load_artifact(path)?,
        None => {
            let machine = devices::machine()?;
            if let Some(reason) = &machine.no_gpu_reason {
                on_this_cpu = Some(format!("{reason}; profiling on the CPU ({} cores)", machine.cpu_cores));
            }
            devices::local_cluster(&machine)
        }
    };
    let group = cluster.node_groups.first().context("the cluster has no node group")?.clone();
    // What the job requires of where it runs, before anything is run or written.
    let cwd = std::env::current_dir().context("the current directory")?;
    let site = rubick_launch::requires::Site {
        cluster: Some(&cluster),
        group: Some(&group),
        local: args.backend == Backend::Local,
        // Kubernetes runs start in their image: its files are not this machine's.
        dir: (args.backend != Backend::Kubernetes).then_some(cwd.as_path()),
    };
    if let Some(why) = rubick_launch::requires::unmet(&job, site) {
        bail!("{}: job `{}` cannot be profiled here: {why}; nothing was run", args.job.display(), job.name);
    }
    if let Some(warning) = on_this_cpu {
        tracing::warn!("{warning}");
    }
    let on_cpu = group.gpu_type == CPU_GPU_TYPE;
    let configs = configurations(args, &job, &group)?;
    let work_dir = match (&args.work_dir, is_std(&args.output)) {
        (Some(dir), _) => dir.clone(),
        (None, false) => PathBuf::from(format!("{}.runs", args.output.display())),
        (None, true) => PathBuf::from("rubick-profile.runs"),
    };
    std::fs::create_dir_all(&work_dir).with_context(|| format!("{}: cannot create it", work_dir.display()))?;
    let work_dir = work_dir.canonicalize().with_context(|| work_dir.display().to_string())?;

    let mut rows = existing_rows(&args.output, &job, args.fresh)?;
    // Failed and timed-out runs are measured again (an answer — ok, oom, unsupported —
    // is kept).
    let before = rows.len();
    rows.retain(|r| !matches!(r.status, Some(ProfileStatus::Failed | ProfileStatus::Timeout)));
    if rows.len() < before {
        tracing::warn!("{}: {} failed or timed-out run(s) are run again", args.output.display(), before - rows.len());
    }
    let done: BTreeSet<(String, String, i64)> =
        rows.iter().map(|r| (r.plan.clone(), r.placement.clone(), r.repeat.unwrap_or(0))).collect();
    let cpus_per_gpu = group.fair_cpus_per_gpu();
    let host_per_gpu = group.host_memory_gib / f64::from(group.gpus_per_node);
    // Repetition-major: a profile stopped early has every configuration once first.
    let all: Vec<Planned> = (0..args.repeat)
        .flat_map(|repeat| configs.iter().map(move |c| (repeat, c)))
        .enumerate()
        .map(|(index, (repeat, (plan, placement)))| Planned {
            index,
            plan: *plan,
            placement: placement.clone(),
            repeat,
            cpus: cpus_per_gpu * placement.gpus(),
            host_memory_gib: host_per_gpu * f64::from(placement.gpus()),
        })
        .collect();
    let todo: Vec<Planned> = all.iter().filter(|p| !done.contains(&p.key())).cloned().collect();
    if todo.len() < all.len() {
        tracing::warn!(
            "{}: {} of {} runs already measured; running the other {} (--fresh starts over)",
            args.output.display(),
            all.len() - todo.len(),
            all.len(),
            todo.len()
        );
    }
    if args.backend == Backend::Slurm {
        rubick_launch::slurm::available().map_err(|reason| anyhow::anyhow!("--backend slurm: {reason}"))?;
    }
    let executor: Arc<dyn Executor> = match args.backend {
        Backend::Local => Arc::new(rubick_launch::Local::new()),
        Backend::Slurm => Arc::new(rubick_launch::slurm::Slurm::new()),
        Backend::Kubernetes => Arc::new(kubernetes(args.kubernetes.as_deref(), &work_dir)?),
    };
    let nvml = if on_cpu || args.backend != Backend::Local {
        None
    } else {
        devices::nvml().map_err(|reason| tracing::warn!("{reason}; GPU metric columns stay empty")).ok()
    };
    let parallel = args.parallel.unwrap_or(if on_cpu { 1 } else { group.gpus_per_node }).max(1) as usize;
    let mut launch = launch;
    // A script that honours it stops once the measurement is complete.
    launch
        .env
        .entry("RUBICK_ITERATIONS".into())
        .or_insert_with(|| (launch.warmup_iterations + launch.measured_iterations).to_string());
    let launch = Arc::new(launch);

    let started = Instant::now();
    let bar = rubick_io::cli::progress_bar(todo.len() as u64, "runs");
    let (tx, rx) = mpsc::channel::<Finished>();
    let mut pending: std::collections::VecDeque<Planned> = todo.into();
    let mut free: Vec<bool> = vec![true; group.gpus_per_node as usize];
    let (mut running, mut failures, mut measured_wall) = (0usize, Vec::new(), Duration::ZERO);
    while !pending.is_empty() || running > 0 {
        // Start, in order, every run whose GPUs are free (a smaller later one may fill a gap).
        let mut i = 0;
        while i < pending.len() && running < parallel {
            let need = pending[i].placement.gpus() as usize;
            let slots: Vec<u32> = (0..free.len()).filter(|&s| free[s]).take(need).map(|s| s as u32).collect();
            if slots.len() < need && args.backend == Backend::Local {
                i += 1;
                continue;
            }
            let planned = pending.remove(i).context("queue")?;
            let devices = if args.backend == Backend::Local { slots } else { Vec::new() };
            for &s in &devices {
                free[s as usize] = false;
            }
            running += 1;
            if let Some(bar) = &bar {
                bar.set_message(format!("{} running", planned.plan));
            }
            tracing::info!(
                "run {}: {} on {} (repeat {})",
                planned.index,
                planned.plan,
                planned.placement,
                planned.repeat
            );
            start_run(
                planned,
                devices,
                StartContext {
                    job: job.name.clone(),
                    launch: Arc::clone(&launch),
                    work_dir: work_dir.clone(),
                    executor: Arc::clone(&executor),
                    partition: args.partition.clone(),
                    on_cpu,
                    nvml: nvml.clone(),
                },
                tx.clone(),
            );
        }
        let finished = rx.recv().context("a run's thread vanished")?;
        running -= 1;
        for &s in &finished.devices {
            free[s as usize] = true;
        }
        let row = row_of(&job, &group, &launch, &finished);
        if let Ok(outcome) = &finished.result {
            measured_wall += outcome.wall;
        }
        let status = row.status.map_or_else(String::new, |s| s.to_string());
        // Out of memory and unsupported (exit 2) are answers about the configuration.
        if !matches!(row.status, Some(ProfileStatus::Ok | ProfileStatus::Oom | ProfileStatus::Unsupported)) {
            failures.push(format!("{} on {} ({status}; log {})", row.plan, row.placement, finished.log.display()));
        }
        match &finished.result {
            Ok(_) => tracing::info!("run {} ({}): {status}", finished.planned.index, finished.planned.plan),
            Err(e) => tracing::error!("run {} ({}): {e}", finished.planned.index, finished.planned.plan),
        }
        rows.push(row);
        if !is_std(&args.output) {
            write_rows(&args.output, &mut rows)?;
        }
        if let Some(bar) = &bar {
            bar.inc(1);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    write_rows(&args.output, &mut rows)?;
    let wall = started.elapsed();
    summary(&rows);
    if !measured_wall.is_zero() {
        tracing::info!(
            "profile wall time {:.1} s; the runs' own {:.1} s",
            wall.as_secs_f64(),
            measured_wall.as_secs_f64()
        );
    }
    if failures.is_empty() {
        Ok(Outcome::Done)
    } else {
        Ok(Outcome::Negative(format!(
            "{} run(s) did not measure (the table records them): {}",
            failures.len(),
            failures.join("; ")
        )))
    }
}

/// What every run's thread needs besides its configuration.
struct StartContext {
    job: String,
    launch: Arc<Launch>,
    work_dir: PathBuf,
    executor: Arc<dyn Executor>,
    partition: Option<String>,
    on_cpu: bool,
    nvml: Option<Arc<nvml_wrapper::Nvml>>,
}

fn start_run(planned: Planned, devices: Vec<u32>, ctx: StartContext, tx: mpsc::Sender<Finished>) {
    std::thread::spawn(move || {
        let dir = ctx.work_dir.join(planned.dir_name());
        let log = dir.join("log.txt");
        let result = (|| -> Result<(RunOutcome, Option<GpuMetrics>), String> {
            // A run killed half-way before leaves its files: start clean.
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = |name: &str| dir.join(name).display().to_string();
            let request = RunRequest {
                launch: &ctx.launch,
                context: LaunchContext {
                    job: ctx.job.clone(),
                    plan: planned.plan,
                    nodes: planned.placement.nodes(),
                    node_rank: 0,
                    gpus_per_node: planned.placement.max_per_node(),
                    cpus: planned.cpus,
                    master_addr: "127.0.0.1".into(),
                    master_port: rubick_launch::free_port(),
                    deepspeed_config: path("deepspeed.json"),
                    checkpoint_dir: path("checkpoints"),
                    metrics: path("metrics.jsonl"),
                    visible_devices: if ctx.on_cpu { Vec::new() } else { devices.clone() },
                },
                log: log.clone(),
                clear_env: false,
                stop_after_iterations: Some(ctx.launch.warmup_iterations + ctx.launch.measured_iterations),
                wrapper: rubick_launch::wrap::command().ok(),
            };
            let sampler = ctx
                .nvml
                .as_ref()
                .filter(|_| !devices.is_empty())
                .map(|nvml| Sampler::start(Arc::clone(nvml), devices.clone(), Duration::from_millis(200)));
            // Across nodes (Slurm): one launcher per node (its `{node_rank}`), the first
            // node `{master_addr}`; each node asks its share of cores and memory.
            let nodes = planned.placement.nodes();
            let names = if nodes > 1 && ctx.executor.name() == "slurm" {
                let known = rubick_launch::slurm::nodes().map_err(|e| e.to_string())?;
                slurm_nodes_for(&known, &planned.placement, ctx.on_cpu).map_err(|e| e.to_string())?
            } else {
                vec![String::new(); nodes as usize]
            };
            let per_node: Vec<u32> = planned.placement.per_node().to_vec();
            let run = Submission {
                request,
                dir: dir.clone(),
                nodes: names
                    .into_iter()
                    .zip(per_node)
                    .map(|(node, gpus)| NodeShare {
                        node,
                        gpus: if ctx.on_cpu { Vec::new() } else { (0..gpus).collect() },
                        cpus: planned.cpus.div_ceil(nodes).max(1),
                        host_memory_gib: planned.host_memory_gib / f64::from(nodes),
                    })
                    .collect(),
                cores: Vec::new(),
                name: None,
                detached: false,
                partition: ctx.partition.clone(),
            };
            // Submit, then follow it to its end: the same on every backend.
            let outcome = rubick_launch::run_to_end(ctx.executor.as_ref(), &run);
            let gpu = sampler.and_then(Sampler::finish);
            outcome.map(|o| (o, gpu)).map_err(|e| e.to_string())
        })();
        let (result, gpu) = match result {
            Ok((o, g)) => (Ok(o), g),
            Err(e) => (Err(e), None),
        };
        let _ = tx.send(Finished { planned, devices, result, gpu, log });
    });
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// The table row of a finished run.
fn row_of(job: &Job, group: &NodeGroup, launch: &Launch, finished: &Finished) -> ProfileRow {
    let p = &finished.planned;
    let mut row = ProfileRow {
        job: job.name.clone(),
        model: job.model.name.clone(),
        plan: p.plan.to_string(),
        placement: p.placement.to_string(),
        gpu_type: Some(group.gpu_type.clone()),
        cpus: Some(i64::from(p.cpus)),
        host_memory_gib: Some((p.host_memory_gib * 100.0).round() / 100.0),
        repeat: Some(i64::from(p.repeat)),
        ..ProfileRow::default()
    };
    let outcome = match &finished.result {
        Ok(outcome) => outcome,
        Err(e) => {
            row.status = Some(ProfileStatus::Failed);
            row.reason = Some(format!("could not run: {e}"));
            return row;
        }
    };
    row.wall_s = Some(outcome.wall.as_secs_f64());
    row.exit_code = outcome.exit_code.map(i64::from);
    let mut status = outcome.status;
    let lines = measured_iterations(&outcome.metrics, launch.warmup_iterations, Some(launch.measured_iterations));
    let exit = outcome.exit_code.map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
    row.reason = match status {
        RunStatus::Ok if lines.is_empty() => {
            tracing::warn!(
                "{} on {}: exited 0 but reported no iteration after the {} warm-up ones; recorded as failed",
                p.plan,
                p.placement,
                launch.warmup_iterations
            );
            status = RunStatus::Failed;
            Some(format!("{exit} without a metric line after the {} warm-up iterations", launch.warmup_iterations))
        }
        // Stopped by rubick once measured, then exited otherwise than 0: still ok, and
        // the row says why its exit code is not 0 (they never disagree silently).
        RunStatus::Ok => outcome.counted_complete.clone().inspect(|why| {
            tracing::info!("{} on {}: {why}", p.plan, p.placement);
        }),
        RunStatus::Oom => Some(format!("{exit}: out of memory")),
        RunStatus::Unsupported => Some(format!("{exit}: the script refused the plan")),
        RunStatus::Timeout => Some(format!("over timeoutS ({} s): its process group was killed", launch.timeout_s)),
        RunStatus::Failed | RunStatus::NotRunnable | RunStatus::Preempted => Some(exit),
    };
    row.status = Some(match status {
        RunStatus::Ok => ProfileStatus::Ok,
        RunStatus::Oom => ProfileStatus::Oom,
        RunStatus::Unsupported => ProfileStatus::Unsupported,
        RunStatus::Failed | RunStatus::NotRunnable | RunStatus::Preempted => ProfileStatus::Failed,
        RunStatus::Timeout => ProfileStatus::Timeout,
    });
    if status == RunStatus::Ok {
        let field = |f: fn(&MetricLine) -> Option<f64>| mean(&lines.iter().copied().filter_map(f).collect::<Vec<_>>());
        let times = iteration_times(lines.iter().copied());
        let (t, sd) = mean_sd(&times).unwrap_or((f64::NAN, 0.0));
        row.iterations = Some(times.len() as i64);
        row.iter_time_s = Some(t);
        row.iter_time_sd_s = Some(sd);
        row.forward_s = field(|m| if let MetricLine::Iteration { forward_s, .. } = m { *forward_s } else { None });
        row.backward_sync_s =
            field(|m| if let MetricLine::Iteration { backward_sync_s, .. } = m { *backward_sync_s } else { None });
        row.optimizer_s =
            field(|m| if let MetricLine::Iteration { optimizer_s, .. } = m { *optimizer_s } else { None });
        let samples =
            field(|m| if let MetricLine::Iteration { samples, .. } = m { samples.map(|s| s as f64) } else { None })
                .unwrap_or(p.plan.global_batch() as f64);
        row.samples_per_s = Some(samples / t);
    }
    let reported_peak = outcome
        .metrics
        .iter()
        .filter_map(|m| if let MetricLine::Iteration { peak_memory_gib, .. } = m { *peak_memory_gib } else { None })
        .reduce(f64::max);
    match &finished.gpu {
        Some(g) => {
            row.peak_gpu_memory_gib = Some(g.peak_memory_gib);
            row.gpu_util_pct = Some(g.util_pct);
            row.power_w = Some(g.power_w);
            row.sm_clock_mhz = Some(g.sm_clock_mhz);
            row.per_gpu = Some(g.per_gpu.clone());
        }
        None => row.peak_gpu_memory_gib = reported_peak,
    }
    row
}

/// The profile as an aligned table on stderr.
fn summary(rows: &[ProfileRow]) {
    let f = |v: Option<f64>, digits: usize| v.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"));
    let mut lines = vec![format!(
        "{:<34} {:>9} {:>6} {:>8} {:>12} {:>12} {:>9}",
        "plan", "placement", "repeat", "status", "iter_time_s", "samples/s", "wall_s"
    )];
    for r in rows {
        lines.push(format!(
            "{:<34} {:>9} {:>6} {:>8} {:>12} {:>12} {:>9}",
            r.plan,
            r.placement,
            r.repeat.unwrap_or(0),
            r.status.unwrap_or(ProfileStatus::Ok),
            f(r.iter_time_s, 4),
            f(r.samples_per_s, 2),
            f(r.wall_s, 1)
        ));
    }
    eprintln!("{}", lines.join("\n"));
}
