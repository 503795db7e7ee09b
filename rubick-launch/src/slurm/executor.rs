//! Slurm as an [`Executor`]: each run one `sbatch` job, polled with `scontrol`; and
//! the blocking run ([`run`]) `rubick-profile` makes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::batch::{SlurmResources, batch_script, check_resources};
use super::query::{
    JobInfo, NodeInfo, available, cancel, completion_log, find_by_name, output, parse_job_id, query, scancel,
};
use super::state::JobState;
use crate::contract::{KEPT_ENV as CONTRACT_ENV, Prepared, RunRequest, prepare, resolve};
use crate::end::{Exit, RunOutcome};
use crate::error::LaunchError;
use crate::executor::{Executor, Handle, RunState, Submission, run_to_end};
use crate::guard::{Guard, Watch, Watches};
use crate::proc::RunSignal;

/// Variables kept for sbatch (and so for the job) when the request clears the environment.
const KEPT_ENV: [&str; 6] = {
    let [a, b, c, d, e] = CONTRACT_ENV;
    [a, b, c, d, e, "SLURM_CONF"]
};

/// Runs the request as one Slurm job with these resources, to its end (or its timeout),
/// and reports what it did ([`run_to_end`] over [`Slurm`]). `wall` counts from the
/// moment the job was seen running.
pub fn run(request: &RunRequest<'_>, resources: &SlurmResources) -> Result<RunOutcome, LaunchError> {
    let run = Submission {
        name: resources.job_name.clone(),
        partition: resources.partition.clone(),
        ..Submission::attached(request)
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
    /// The Slurm executor: each submission's own resources, no run watched yet.
    pub fn new() -> Slurm {
        Slurm::default()
    }

    /// The sbatch resources of a submission (asks `sinfo` which nodes Slurm knows).
    pub fn resources(run: &Submission<'_>) -> Result<SlurmResources, LaunchError> {
        let names: Vec<String> = run.nodes.iter().map(|n| n.node.clone()).collect();
        let known = if names.iter().any(|n| !n.is_empty()) { super::query::nodes()? } else { Vec::new() };
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
        // Resources that cannot make a job are refused first, with or without a Slurm.
        if let Some(fixed) = &self.resources {
            check_resources(fixed)?;
        }
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
            return RunState::Ended(Exit { note: Some(format!("{handle}: not a Slurm job")), ..Exit::default() });
        };
        let info = match query(job) {
            Ok(Some(info)) => info,
            Ok(None) => {
                return match completion_log(job) {
                    Ok(info) => RunState::Ended(info.map_or_else(Exit::default, |i| ended(job, &i))),
                    Err(e) => RunState::Unknown(format!("slurm job {job}: {e}")),
                };
            }
            Err(e) => return RunState::Unknown(format!("slurm job {job}: {e}")),
        };
        if info.state.is_terminal() {
            return RunState::Ended(ended(job, &info));
        }
        if info.waits_after_requeue() {
            return match stranded(job, &info.reason, nodes) {
                Some(why) => RunState::Stranded(why),
                None => RunState::Waiting,
            };
        }
        if info.state.waits() { RunState::Waiting } else { RunState::Running }
    }

    fn signal(&self, handle: &Handle, signal: RunSignal) {
        let Handle::Slurm { job } = handle else { return };
        let result = if signal == RunSignal::Kill { cancel(job) } else { super::query::signal(job, signal.name()) };
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
fn ended(job: &str, info: &JobInfo) -> Exit {
    Exit {
        code: info.exit_code(),
        preempted: matches!(info.state, JobState::Preempted | JobState::NodeFail),
        timed_out: info.state == JobState::Timeout,
        note: end_note(job, info.state),
    }
}

/// Why a job Slurm requeued cannot run again where it is pinned (one of its `nodes`
/// not usable), if it cannot; `None` when it is not pinned to nodes Slurm knows (Slurm
/// runs it again wherever it can) or they are all usable.
fn stranded(job: &str, reason: &str, nodes: &[String]) -> Option<String> {
    if nodes.is_empty() {
        return None;
    }
    let known = super::query::nodes().ok()?;
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
        let (argv, env) = resolve(&ctx, request.launch)?;
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

/// The line appended to the log for a job that ended otherwise than by its own exit.
/// `OUT_OF_MEMORY` carries one of `collect`'s out-of-memory markers.
pub(crate) fn end_note(job: &str, state: JobState) -> Option<String> {
    match state {
        JobState::Completed | JobState::Failed => None,
        JobState::OutOfMemory => Some(format!("rubick: Slurm job {job} ended OUT_OF_MEMORY (Cannot allocate memory)")),
        other => Some(format!("rubick: Slurm job {job} ended {other}")),
    }
}
