//! # rubick-run: launch and reconfigure training runs from a schedule
//!
//! * `submit` — queue jobs in a state directory;
//! * `jobs` — the `JobBatch` of the state (queued and running jobs, where they run,
//!   iterations left) for `rubick-plan schedule --jobs -`;
//! * `apply` — reconcile a schedule with what runs: start, reconfigure (stop signal,
//!   checkpoint, relaunch under the new plan), preempt; idempotent and crash-safe;
//! * `status` — what runs where and how fast (table, YAML, Prometheus text);
//! * `stop` — stop a job for good; `check` — validate schedules.
//!
//! The reconcile decision is a pure function ([`reconcile`]); the state directory
//! ([`state`]) is locked and rewritten atomically around every action; backends are
//! behind one trait ([`backend`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use rubick_core::artifact::{ApiVersion, Kind, to_yaml};
use rubick_core::job::CurrentAllocation;
use rubick_core::schedule::Schedule;
use rubick_core::{Cluster, Job, JobBatch, Placement, Plan};
use rubick_io::cli::{LogArgs, Outcome};
use rubick_io::files::load_artifact;

pub mod backends;
pub mod cluster;
pub mod lifecycle;
pub mod plot;
pub mod reconcile;
pub mod state;

use backends::Backend;
use reconcile::{Action, Allocation, StopReason};
use state::{JobRecord, JobStatus, Reconfiguration, RunPhase, RunRecord, State, StateDir};

const EXAMPLES: &str = "\
Examples:
  # Queue a job (its Job YAML has a launch section: see the README, \"The job contract\")
  rubick-run submit examples/pytorch/job.yaml --state /var/lib/rubick

  # One round, every minute from cron: the state's jobs, scheduled, applied
  rubick-run jobs --state /var/lib/rubick \\
    | rubick-plan schedule --cluster cluster.yaml --jobs - --current /var/lib/rubick/current.yaml \\
    | rubick-run apply - --state /var/lib/rubick

  # What runs where, and how fast (also --format yaml | prometheus)
  rubick-run status --state /var/lib/rubick

  # The Slurm partition's nodes that can take jobs now, as the round's cluster
  rubick-run cluster --backend slurm -o cluster.yaml

  # Validate the schedule a round produced before applying it
  rubick-run check schedule.yaml";

/// Launch and reconfigure training runs so that they follow a rubick schedule.
#[derive(Debug, Parser)]
#[command(name = "rubick-run", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The state directory, shared by every command.
#[derive(Debug, Clone, clap::Args)]
pub struct StateArgs {
    /// The state directory (`submit` and `apply` create it; the other commands need one)
    #[arg(long, env = "RUBICK_STATE", hide_env_values = true)]
    pub state: PathBuf,
    /// Seconds to wait for another rubick-run holding the state (a round in progress)
    /// before giving up with exit 1
    #[arg(long, default_value_t = 10.0)]
    pub lock_wait: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Table,
    Yaml,
    /// Prometheus text format (for node-exporter's textfile collector)
    Prometheus,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Queue jobs (Job YAML with a launch section)
    Submit {
        /// Job files (YAML, each with a launch section and a unique name)
        #[arg(required = true)]
        jobs: Vec<PathBuf>,
        #[command(flatten)]
        state: StateArgs,
        /// Restarts a job gets after it fails on its own with a retryable exit (killed
        /// by a signal, a crash). Exit 2 (the contract's bad plan) marks the plan
        /// unsupported: never offered again, the job queued for another, failed after
        /// 3 refused plans. Out of memory (exit 3, the `oom` event) is permanent
        #[arg(long, default_value_t = 3)]
        retries: u32,
        /// Replace a job of the same name that is stopped, failed or finished: a new
        /// incarnation, with fresh attempt and checkpoint directories (the old ones are
        /// kept as `jobs/NAME.replaced-N/`). Without it, an existing name is refused
        #[arg(long)]
        replace: bool,
    },
    /// The state's queued and running jobs as a JobBatch (stdout), for rubick-plan
    Jobs {
        #[command(flatten)]
        state: StateArgs,
        /// Where to write it (`-`: stdout)
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
        /// Refit each job's performance model online, from its first measured run, on
        /// what its runs measured (`jobs/NAME/profile.csv`) and the profiled rows its
        /// submitted `perfModel` was fitted on, into `jobs/NAME/model.yaml`, which
        /// `perfModel` then names (a job with fewer than 2 configurations among them
        /// keeps its own model): a plan the model got wrong is corrected by the next
        /// round. The cluster gives the links
        #[arg(long)]
        cluster: Option<PathBuf>,
    },
    /// Make what runs follow a schedule: start, reconfigure, preempt; idempotent
    ///
    /// Jobs running with the schedule's plan on its GPUs and cores are left alone;
    /// others are asked to checkpoint and exit (their stop signal; killed with their
    /// whole process group after stopTimeoutS) and started again under the new plan,
    /// resuming from their checkpoint; jobs not scheduled are stopped and queued. The
    /// state is saved before and after every action: a rubick-run killed at any point
    /// is repaired by the next apply. The schedule is refused (exit 2, nothing done)
    /// when it names unknown jobs, gives a GPU twice, is for another cluster, or does
    /// not fit the --cluster.
    Apply {
        /// The Schedule (YAML), `-` for stdin
        schedule: PathBuf,
        #[command(flatten)]
        state: StateArgs,
        /// Where runs execute: `local` (process groups on this machine, pinned to
        /// cores), `slurm` (one sbatch job per run), `kubernetes` (Kubeflow manifests,
        /// applied with kubectl or written for GitOps)
        #[arg(long, default_value = "local", value_parser = backend_name)]
        backend: String,
        /// Check the schedule against this cluster (names, GPU indices, cores); the
        /// state remembers it, and checks later schedules against it without the flag
        #[arg(long)]
        cluster: Option<PathBuf>,
        /// Print the actions (stops, starts) the schedule asks for and take none
        #[arg(long)]
        dry_run: bool,
        /// The Kubernetes backend's settings (YAML: image, context, namespace,
        /// checkpointPvc, manifestDir, kubectl: true|false, kind: PyTorchJob|TrainJob);
        /// kept in the state directory for every later command. Fields left out fall
        /// back to RUBICK_K8S_IMAGE, RUBICK_K8S_CHECKPOINT_PVC, RUBICK_K8S_MANIFEST_DIR,
        /// RUBICK_KUBECTL, RUBICK_K8S_KIND, then the defaults
        #[arg(long)]
        kubernetes: Option<PathBuf>,
    },
    /// What runs where, how far and how fast
    Status {
        #[command(flatten)]
        state: StateArgs,
        /// The report's format: a table for people, YAML for tools, Prometheus text for
        /// a node exporter's textfile collector
        #[arg(long, value_enum, default_value_t = StatusFormat::Table)]
        format: StatusFormat,
        /// Where to write it (`-`: stdout)
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
        /// Also draw every job's runs over time (coloured by plan, stops marked), PNG
        /// or SVG
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Stop a job for good (checkpoint and exit); no round starts it again
    Stop {
        /// The job's name
        job: String,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Print a job's run log (stdout and stderr of its last run, or of --attempt N)
    Logs {
        /// The job's name
        job: String,
        /// Which run (1 is the first); default: the last
        #[arg(long)]
        attempt: Option<u32>,
        /// Keep printing what the run writes until it ends
        #[arg(short, long)]
        follow: bool,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Remove a stopped, failed or finished job: its record and its directory (runs,
    /// logs, checkpoints)
    Delete {
        /// The job's name
        job: String,
        #[command(flatten)]
        state: StateArgs,
    },
    /// Describe the cluster a backend really has, as a Cluster (YAML) to plan on
    ///
    /// Slurm: the nodes of the partition that can take jobs now (up, not drained or
    /// draining), grouped by shape, each group listing its nodes' names (`hosts`), so
    /// that schedules name Slurm's nodes and runs are placed on them (several nodes
    /// per run included). Nodes left out are named on stderr. Slurm does not know GPU
    /// memory or link bandwidths: give yours.
    Cluster {
        /// The backend to ask (only `slurm` can be asked)
        #[arg(long, default_value = "slurm", value_parser = backend_name)]
        backend: String,
        #[command(flatten)]
        hardware: cluster::Hardware,
        /// Where to write it (`-`: stdout)
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Validate Schedule files (YAML); exit 2 naming the first bad file and field
    Check {
        /// Schedule files, `-` for stdin
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print the man page (section 1), or write one page per command into --out-dir
    Man {
        /// Write `TOOL.1` and `TOOL-COMMAND.1` here instead
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

fn backend_name(name: &str) -> Result<String, String> {
    backends::known(name).then(|| name.to_owned()).ok_or_else(|| {
        let known: Vec<&str> = backends::REGISTRY.iter().map(|(n, _)| *n).collect();
        format!("`{name}`: known backends: {}", known.join(", "))
    })
}

/// Kills this process with SIGKILL when `RUBICK_RUN_FAILPOINT` names `point`: how the
/// tests prove that a rubick-run killed at any phase leaves a state the next one repairs.
pub fn failpoint(point: &str) {
    if std::env::var("RUBICK_RUN_FAILPOINT").is_ok_and(|p| p == point) {
        let me = rustix::process::getpid();
        let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        std::process::abort();
    }
}

fn open(args: &StateArgs, create: bool) -> anyhow::Result<Result<StateDir, String>> {
    rubick_core::launch::check_seconds(args.lock_wait, true).map_err(|why| anyhow::anyhow!("--lock-wait: {why}"))?;
    StateDir::open(&args.state, rubick_core::launch::duration(args.lock_wait), create)
}

/// The locked state directory (`create`: `submit` and `apply` make one; the other
/// commands refuse a directory that holds no state), or the command's negative answer.
macro_rules! locked {
    ($args:expr, $create:expr) => {
        match open($args, $create)? {
            Ok(dir) => dir,
            Err(busy) => return Ok(Outcome::Negative(busy)),
        }
    };
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Completions { shell } => rubick_io::cli::completions(<Cli as clap::CommandFactory>::command(), shell),
        Command::Man { out_dir } => {
            rubick_io::cli::man_pages(<Cli as clap::CommandFactory>::command(), out_dir.as_deref())
        }
        Command::Submit { jobs, state, retries, replace } => submit(&jobs, &state, retries, replace),
        Command::Jobs { state, output, cluster } => jobs(&state, &output, cluster.as_deref()),
        Command::Apply { schedule, state, backend, cluster, dry_run, kubernetes } => {
            apply(&schedule, &state, &backend, cluster.as_deref(), dry_run, kubernetes.as_deref())
        }
        Command::Status { state, format, output, plot } => status(&state, format, &output, plot.as_deref()),
        Command::Stop { job, state } => stop_job(&job, &state),
        Command::Delete { job, state } => delete_job(&job, &state),
        Command::Logs { job, attempt, follow, state } => logs(&job, attempt, follow, &state),
        Command::Check { files } => rubick_io::cli::check_command::<Schedule>(&files),
        Command::Cluster { backend, hardware, output } => cluster::command(&backend, &hardware, &output),
    }
}

fn submit(paths: &[PathBuf], args: &StateArgs, retries: u32, replace: bool) -> anyhow::Result<Outcome> {
    rubick_io::cli::ensure_one_stdin(&paths.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    let mut jobs = Vec::new();
    for path in paths {
        let mut job: Job = load_artifact(path)?;
        anyhow::ensure!(
            job.launch.is_some(),
            "{}: launch: missing (rubick-run starts a job through its launch section)",
            path.display()
        );
        // Kept absolute: the state outlives the submitting directory.
        if let Some(model) = &job.perf_model {
            let base = path.parent().unwrap_or(Path::new("."));
            let abs =
                std::path::absolute(base.join(model)).with_context(|| format!("{}: perfModel", path.display()))?;
            job.perf_model = Some(abs.display().to_string());
            let model: rubick_core::perf::PerfModel =
                load_artifact(&abs).with_context(|| format!("{}: perfModel", path.display()))?;
            model.params().map_err(|e| anyhow::anyhow!("{}: perfModel: {}: {e}", path.display(), abs.display()))?;
        }
        jobs.push(job);
    }
    let dir = locked!(args, true);
    let mut state = dir.load()?;
    for (i, job) in jobs.iter().enumerate() {
        if jobs[..i].iter().any(|j| j.name == job.name) {
            bail!("{}: job `{}` is submitted twice", paths[i].display(), job.name);
        }
        if let Some(old) = state.jobs.get(&job.name) {
            let status = format!("{:?}", old.status).to_lowercase();
            if matches!(old.status, JobStatus::Queued | JobStatus::Running) {
                bail!(
                    "{}: job `{}` already exists in {} and is {status}; stop it first (`rubick-run stop {}`)",
                    paths[i].display(),
                    job.name,
                    dir.root.display(),
                    job.name
                );
            }
            if !replace {
                bail!(
                    "{}: job `{}` already exists in {} ({status}); `submit --replace` starts a new incarnation, `rubick-run delete {}` removes it",
                    paths[i].display(),
                    job.name,
                    dir.root.display(),
                    job.name
                );
            }
        }
    }
    for job in jobs {
        if state.jobs.contains_key(&job.name) {
            // The old incarnation's files move aside first: nothing of it is ever read
            // as the new one's (a crash after the move leaves a record without files,
            // which is not running).
            let old = dir.job_dir(&job.name);
            if old.exists() {
                let aside = (1..)
                    .map(|n| dir.root.join("jobs").join(format!("{}.replaced-{n}", job.name)))
                    .find(|p| !p.exists())
                    .context("a free name")?;
                std::fs::rename(&old, &aside)
                    .with_context(|| format!("{}: cannot move it to {}", old.display(), aside.display()))?;
                eprintln!("{}: the replaced incarnation's files are in {}", job.name, aside.display());
            }
        }
        eprintln!("{}: queued ({} iterations, request {} GPUs)", job.name, job.iterations, job.request.gpus);
        state.jobs.insert(
            job.name.clone(),
            JobRecord {
                job,
                status: JobStatus::Queued,
                run: None,
                attempts: 0,
                iterations_done: 0,
                exit_code: None,
                reason: None,
                reconfigurations: Vec::new(),
                retries_left: retries,
                submitted_unix_s: unix_now(),
                submitted_from: std::env::current_dir().ok(),
                first_started_unix_s: None,
            },
        );
    }
    dir.save(&state)?;
    Ok(Outcome::Done)
}

/// Brings the records up to date with the backend: runs that ended, runs a killed
/// rubick-run started but never recorded, stops it never finished.
fn refresh(dir: &StateDir, state: &mut State, backend: &dyn Backend) -> anyhow::Result<()> {
    let mut unfinished = Vec::new();
    for (name, rec) in &mut state.jobs {
        let Some(run) = rec.run.clone() else { continue };
        let attempt_dir = dir.attempt_dir(name, run.attempt);
        rec.iterations_done = rec.iterations_done.max(backends::last_iteration(&attempt_dir).unwrap_or(0));
        match run.phase {
            // A run whose start was recorded but not its handle: spawned (its wrapper
            // records its group first thing: give it a moment when the spawn began,
            // i.e. its log exists) or never started.
            RunPhase::Starting => match backend.recover(&attempt_dir).or_else(|| {
                attempt_dir.join("log.txt").exists().then(|| {
                    std::thread::sleep(Duration::from_millis(1500));
                    backend.recover(&attempt_dir)
                })?
            }) {
                Some(handle) => {
                    tracing::warn!("`{name}`: adopting run {} started by an interrupted rubick-run", run.attempt);
                    if let Some(r) = rec.run.as_mut() {
                        r.handle = Some(handle);
                        r.phase = RunPhase::Running;
                    }
                }
                None if backend.exit_code(None, &attempt_dir).is_some() => ended(rec, backend, None, &attempt_dir),
                None => {
                    tracing::warn!(
                        "`{name}`: run {} was never started (interrupted rubick-run); queued again",
                        run.attempt
                    );
                    rec.run = None;
                    rec.status = JobStatus::Queued;
                }
            },
            RunPhase::Running => {
                // Its exit code is written as its last act: ended, even if the wrapper lingers.
                let handle = run.handle.as_deref();
                let nodes: Vec<String> = run.nodes.iter().map(|n| n.node.clone()).collect();
                if backend.exit_code(handle, &attempt_dir).is_some() || !handle.is_some_and(|h| backend.alive(h)) {
                    ended(rec, backend, handle, &attempt_dir);
                } else if let Some((h, why)) = handle.and_then(|h| Some((h, backend.stranded(h, &nodes)?))) {
                    lost(rec, backend, h, &why);
                } else if let Some(last) =
                    rec.reconfigurations.last_mut().filter(|r| r.first_iteration_s.is_none() && r.to.is_some())
                {
                    last.first_iteration_s = first_iteration_s(&attempt_dir, run.started_unix_s);
                }
            }
            RunPhase::Stopping => {
                tracing::warn!("`{name}`: finishing the stop an interrupted rubick-run began");
                unfinished.push(name.clone());
            }
        }
    }
    let unfinished: Vec<&str> = unfinished.iter().map(String::as_str).collect();
    stop_runs(dir, state, &unfinished, backend)?;
    Ok(())
}

/// Seconds from a run's start to its first metric line: the metrics file's last change,
/// less the iterations written since at their mean time (exact when one line is there).
fn first_iteration_s(attempt_dir: &Path, started_unix_s: f64) -> Option<f64> {
    let progress = backends::progress(attempt_dir);
    progress.last?;
    let path = attempt_dir.join("metrics.jsonl");
    let modified =
        std::fs::metadata(&path).ok()?.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    let written = backends::iterations_written(attempt_dir);
    let first = modified - (written.saturating_sub(1) as f64) * progress.recent_iter_time_s.unwrap_or(0.0);
    (first >= started_unix_s).then_some(first - started_unix_s)
}

/// The job's stop signal and how long it may take to checkpoint and exit (the
/// contract's defaults for a job without a launch section).
fn stop_settings(job: &Job) -> (rubick_core::launch::StopSignal, Duration) {
    job.launch.as_ref().map_or((Default::default(), Duration::from_secs(120)), |l| {
        (l.stop_signal, rubick_core::launch::duration(l.stop_timeout_s))
    })
}

/// Stops the job's run (see [`stop_runs`]); `(seconds, exited cleanly)`, or `None`
/// when the job has no run.
fn stop_run(
    dir: &StateDir,
    state: &mut State,
    job: &str,
    backend: &dyn Backend,
) -> anyhow::Result<Option<(f64, bool)>> {
    Ok(stop_runs(dir, state, &[job], backend)?.pop().flatten())
}

/// Stops the runs of `jobs` together: every intent recorded durably first (phase
/// stopping, which an interrupted rubick-run finishes next time), then each run asked
/// to stop (the contract's signal, `stopTimeoutS`, KILL of what is left) on a thread of
/// its own, so the round waits for the slowest checkpoint, not for their sum; then what
/// each cost recorded and the jobs queued. Per job, in the order given: `(seconds,
/// exited cleanly)`, or `None` when it had no run.
fn stop_runs(
    dir: &StateDir,
    state: &mut State,
    jobs: &[&str],
    backend: &dyn Backend,
) -> anyhow::Result<Vec<Option<(f64, bool)>>> {
    let mut runs = Vec::new();
    for (k, &job) in jobs.iter().enumerate() {
        let rec = state.jobs.get_mut(job).with_context(|| format!("`{job}` is not a job of {}", dir.root.display()))?;
        let (signal, timeout) = stop_settings(&rec.job);
        let Some(run) = rec.run.as_mut() else { continue };
        run.phase = RunPhase::Stopping;
        runs.push((k, run.clone(), signal, timeout));
    }
    let mut out = vec![None; jobs.len()];
    if runs.is_empty() {
        return Ok(out);
    }
    dir.save(state)?;
    failpoint("stop-recorded");
    let stopped: Vec<(f64, bool)> = std::thread::scope(|scope| {
        let waits: Vec<_> = runs
            .iter()
            .map(|(_, run, signal, timeout)| {
                scope.spawn(move || match &run.handle {
                    Some(handle) => backends::stop(backend, handle, *signal, *timeout),
                    None => (0.0, true),
                })
            })
            .collect();
        waits.into_iter().map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    failpoint("stopped");
    for ((k, run, ..), (secs, clean)) in runs.iter().zip(stopped) {
        let rec = state.jobs.get_mut(jobs[*k]).context("record")?;
        record_stop(rec, &dir.attempt_dir(jobs[*k], run.attempt), run, secs, clean);
        rec.run = None;
        rec.status = JobStatus::Queued;
        out[*k] = Some((secs, clean));
    }
    dir.save(state)?;
    Ok(out)
}

/// A live run that cannot go on where it was placed (its node failed): killed, and
/// its job queued for the next round without spending a retry ([`lifecycle`]).
fn lost(rec: &mut JobRecord, backend: &dyn Backend, handle: &str, why: &str) {
    backend.signal(handle, backends::RunSignal::Kill);
    lifecycle::after(rec, lifecycle::Ended::Lost { why: why.to_owned() });
}

/// A run an apply has recorded and is about to launch.
struct Starting {
    job: Job,
    launch: rubick_core::launch::Launch,
    allocation: Allocation,
    attempt: u32,
    dir: PathBuf,
    checkpoints: PathBuf,
    cores: Vec<u32>,
}

/// A run that ended on its own: what the backend and the run's files say of its end,
/// then the job's next state ([`lifecycle::after`]).
fn ended(rec: &mut JobRecord, backend: &dyn Backend, handle: Option<&str>, attempt_dir: &Path) {
    let code = backend.exit_code(handle, attempt_dir);
    let end = if backend.preempted(handle) {
        lifecycle::Ended::Preempted { code }
    } else {
        lifecycle::Ended::Exited { code, failure: classify(code, attempt_dir) }
    };
    lifecycle::after(rec, end);
}

/// Distinct plans a job may refuse (exit 2) before it is failed rather than requeued.
pub const MAX_REFUSED_PLANS: usize = 3;

/// Why a run ended badly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Killed by a signal, crashed, or its end unknown: a restart may succeed.
    Retryable,
    /// Bad arguments or plan (exit 2): restarting changes nothing.
    BadInput,
    /// Out of memory (exit 3, the `oom` event, a framework's message): not under this plan.
    OutOfMemory,
    /// The command could not be run (exit 126 or 127: not executable, not found): no
    /// restart changes that.
    NotRunnable,
}

/// The failure an exit code (and the run's files) says, `None` for success: the one
/// classifier of how a run ended ([`rubick_launch::supervise::classify`]: the `oom`
/// event, exit 3 or a framework's out-of-memory message in the log; exit 2; ...), with
/// exit 126/127 (the command could not be run) apart.
pub fn classify(code: Option<i32>, attempt_dir: &Path) -> Option<Failure> {
    use rubick_launch::RunStatus;
    let text = std::fs::read_to_string(attempt_dir.join("metrics.jsonl")).unwrap_or_default();
    let oom_event = text
        .lines()
        .filter_map(rubick_core::launch::MetricLine::parse)
        .any(|m| matches!(m, rubick_core::launch::MetricLine::Event { event, .. } if event == "oom"));
    match rubick_launch::supervise::classify(false, code, oom_event, &attempt_dir.join("log.txt")) {
        RunStatus::Ok => None,
        RunStatus::Oom => Some(Failure::OutOfMemory),
        RunStatus::Unsupported => Some(Failure::BadInput),
        _ if matches!(code, Some(126 | 127)) => Some(Failure::NotRunnable),
        RunStatus::Failed | RunStatus::Timeout => Some(Failure::Retryable),
    }
}

fn record_stop(rec: &mut JobRecord, attempt_dir: &Path, run: &RunRecord, secs: f64, clean: bool) {
    let progress = backends::progress(attempt_dir);
    rec.iterations_done = rec.iterations_done.max(progress.last.unwrap_or(0));
    rec.reconfigurations.push(Reconfiguration {
        from: run.plan.to_string(),
        to: None,
        stop_s: secs,
        clean,
        checkpointed_iter: progress.checkpointed,
        first_iteration_s: None,
    });
}

/// The schedule's desired allocations, checked: known jobs, no GPU given twice, the
/// cluster's names and GPU indices when it is given, one node for the local backend.
fn desired_of(
    schedule: &Schedule,
    path: &Path,
    state: &State,
    cluster: Option<&Cluster>,
    backend: &dyn Backend,
) -> anyhow::Result<BTreeMap<String, Allocation>> {
    let at = |i: usize, what: &str| format!("{}: assignments[{i}].{what}", rubick_io::files::display(path));
    if let Some(c) = cluster {
        anyhow::ensure!(
            schedule.cluster == c.name,
            "{}: cluster: the schedule is for `{}`, not `{}`",
            rubick_io::files::display(path),
            schedule.cluster,
            c.name
        );
    }
    if let Some(known) = state.cluster.as_deref().filter(|c| *c != schedule.cluster) {
        bail!(
            "{}: cluster: the schedule is for `{}`, but this state runs cluster `{known}`",
            rubick_io::files::display(path),
            schedule.cluster
        );
    }
    let mut desired = BTreeMap::new();
    for (i, a) in schedule.assignments.iter().enumerate() {
        let Some(rec) = state.jobs.get(&a.job) else {
            bail!("{}: `{}` is not a job of this state (submit it first)", at(i, "job"), a.job);
        };
        let (Some(plan), false) = (a.plan, a.nodes.is_empty()) else { continue };
        if matches!(rec.status, JobStatus::Finished | JobStatus::Failed | JobStatus::Stopped) {
            tracing::warn!("`{}` is {:?}: its assignment is ignored", a.job, rec.status);
            continue;
        }
        if rec.job.unsupported_plans.contains(&plan) {
            tracing::warn!("`{}`: `{plan}` is a plan its runs refused (exit 2): the assignment is ignored", a.job);
            continue;
        }
        for (k, share) in a.nodes.iter().enumerate() {
            if let Some(c) = cluster {
                let (g, _) = rubick_core::planner::node_by_name(c, &share.node).with_context(|| {
                    at(i, &format!("nodes[{k}].node: `{}` is not a node of cluster `{}`", share.node, c.name))
                })?;
                let group = &c.node_groups[g];
                if let Some(g) = share.gpus.iter().find(|g| **g >= group.gpus_per_node) {
                    bail!(
                        "{}: GPU {g} is out of range (the node has {})",
                        at(i, &format!("nodes[{k}].gpus")),
                        group.gpus_per_node
                    );
                }
                anyhow::ensure!(
                    share.cpus <= group.cpu_cores,
                    "{}: {} cores on a node of {}",
                    at(i, &format!("nodes[{k}].cpus")),
                    share.cpus,
                    group.cpu_cores
                );
            }
            let mut seen = share.gpus.clone();
            seen.sort_unstable();
            seen.dedup();
            anyhow::ensure!(
                seen.len() == share.gpus.len(),
                "{}: a GPU is listed twice",
                at(i, &format!("nodes[{k}].gpus"))
            );
        }
        if backend.name() == "local" && a.nodes.len() > 1 {
            bail!("{}: {} nodes; the local backend runs a job on this one machine", at(i, "nodes"), a.nodes.len());
        }
        desired.insert(a.job.clone(), Allocation { plan, nodes: a.nodes.clone() });
    }
    // Without a cluster to check against, the local backend still knows this machine:
    // a schedule asking for more cores than it has was planned for another cluster.
    if cluster.is_none() && backend.name() == "local" {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) as u32;
        let asked: u32 = desired.values().flat_map(|a| a.nodes.iter().map(|n| n.cpus)).sum();
        anyhow::ensure!(
            asked <= cores,
            "{}: the schedule asks for {asked} cores in all, and this machine has {cores}: a schedule for another cluster? (plan it with this machine's cluster, `rubick-profile devices --cluster-out`, and pass that as --cluster)",
            rubick_io::files::display(path)
        );
    }
    if let Some((a, b, node, gpu)) = reconcile::shared_gpu(&desired) {
        bail!("{}: GPU {gpu} of {node} is given to both `{a}` and `{b}`", rubick_io::files::display(path));
    }
    Ok(desired)
}

fn apply(
    path: &Path,
    args: &StateArgs,
    backend_name: &str,
    cluster: Option<&Path>,
    dry_run: bool,
    kubernetes: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let clock = Instant::now();
    let lap = |what: &str| tracing::debug!("apply: {what} at {:.2} ms", clock.elapsed().as_secs_f64() * 1e3);
    let schedule: Schedule = load_artifact(path)?;
    let given: Option<Cluster> = cluster.map(load_artifact).transpose()?;
    lap("schedule and cluster read");
    let settings = kubernetes.map(|p| backends::kubernetes::Settings::load(p).map(|s| (p, s))).transpose()?;
    let dir = locked!(args, true);
    failpoint("locked");
    // The backend's settings (Kubernetes) are the state's from now on.
    if let Some((from, s)) = &settings {
        let text = serde_yaml_ng::to_string(s)?;
        state::write_durably(&dir.root.join(backends::kubernetes::SETTINGS_FILE), text.as_bytes())
            .with_context(|| format!("--kubernetes {}", from.display()))?;
    }
    let backend = backends::backend(backend_name, Some(&dir.root))?
        .with_context(|| format!("--backend: unknown `{backend_name}`"))?;
    let mut state = dir.load()?;
    lap("state loaded");
    // The state remembers the cluster its first apply with --cluster named: later
    // schedules are checked against it (nodes, GPU indices, cores) without the flag.
    let remembered = dir.root.join("cluster.yaml");
    let cluster: Option<Cluster> = match &given {
        Some(c) => Some(c.clone()),
        None if remembered.exists() => Some(load_artifact(&remembered)?),
        None => None,
    };
    if let Some(known) =
        state.backend.as_deref().filter(|b| *b != backend_name && state.jobs.values().any(|r| r.run.is_some()))
    {
        bail!("--backend {backend_name}: the runs of {} are on backend `{known}`; stop them first", dir.root.display());
    }
    // Bad input is refused before anything is touched; then the records are brought up
    // to date (a job may have finished since) and the schedule read against them.
    desired_of(&schedule, path, &state, cluster.as_ref(), backend.as_ref())?;
    lap("schedule checked");
    refresh(&dir, &mut state, backend.as_ref())?;
    lap("runs refreshed");
    dir.save(&state)?;
    lap("state saved");
    let desired = desired_of(&schedule, path, &state, cluster.as_ref(), backend.as_ref())?;
    let actual: BTreeMap<String, Allocation> = state
        .jobs
        .iter()
        .filter_map(|(n, r)| {
            r.run.as_ref().filter(|run| run.phase == RunPhase::Running).map(|run| (n.clone(), run.allocation()))
        })
        .collect();
    let actions = reconcile::reconcile(&desired, &actual);
    if dry_run {
        // What this apply would do, and nothing done (the refresh above only recorded
        // runs that ended).
        for action in &actions {
            match action {
                Action::Stop { job, reason } => println!(
                    "stop {job} ({})",
                    if *reason == StopReason::Reconfigure { "to reconfigure" } else { "preempted" }
                ),
                Action::Start { job, allocation } => {
                    println!("start {job} {} on {}", allocation.plan, where_(&allocation.nodes));
                }
            }
        }
        if actions.is_empty() {
            println!("nothing to change");
        }
        return Ok(Outcome::Done);
    }
    let new_round = state.round != Some(schedule.round);
    if new_round {
        for rec in state.jobs.values_mut() {
            if let Some(run) = rec
                .run
                .as_mut()
                .filter(|_| !actions.iter().any(|a| matches!(a, Action::Stop { job, .. } if *job == rec.job.name)))
            {
                run.rounds_since_change += 1;
            }
        }
    }
    tracing::info!("round {}: {} action(s)", schedule.round, actions.len());
    let mut start_failures = Vec::new();
    // Every stop of the round at once (a checkpoint may take minutes), then the starts.
    let stops: Vec<(&str, StopReason)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Stop { job, reason } => Some((job.as_str(), *reason)),
            Action::Start { .. } => None,
        })
        .collect();
    let names: Vec<&str> = stops.iter().map(|(job, _)| *job).collect();
    let stopped = stop_runs(&dir, &mut state, &names, backend.as_ref())?;
    for (&(job, reason), (secs, clean)) in stops.iter().zip(stopped).filter_map(|(s, r)| Some((s, r?))) {
        if reason != StopReason::Reconfigure
            && let Some(rec) = state.jobs.get_mut(job)
        {
            rec.reason = Some(format!("paused by round {}: its resources went to other jobs", schedule.round));
        }
        eprintln!(
            "{job}: stopped ({}) in {secs:.1} s{}",
            if reason == StopReason::Reconfigure { "to reconfigure" } else { "preempted" },
            if clean { "" } else { " (killed after stopTimeoutS)" }
        );
    }
    // The starts: each recorded first (phase starting, its attempt and cores; one save),
    // then all launched at once (an sbatch or kubectl each may take a while), then their
    // handles recorded (one save). A rubick-run killed in between leaves runs in phase
    // starting, which the next one adopts from their directories or queues again.
    let mut starting: Vec<Starting> = Vec::new();
    for action in &actions {
        let Action::Start { job, allocation } = action else { continue };
        // A run of this job the records do not know (a state that lost them) is found
        // from its directory: never a second copy beside it.
        if let Some((attempt, handle)) = live_unrecorded_run(&dir, &state, job, backend.as_ref()) {
            tracing::error!(
                "`{job}`: attempt {attempt} is still running (handle {handle}) but the state does not record it; not starting a second copy (stop it, or `rubick-run stop {job}`)"
            );
            continue;
        }
        if let Err(e) = ensure_own_dirs(&dir, job) {
            eprintln!("{job}: not started: {e:#}");
            start_failures.push(format!("{job}: {e:#}"));
            continue;
        }
        let rec = state.jobs.get_mut(job).context("a desired job has a record")?;
        rec.attempts += 1;
        // Never an attempt directory that exists: its files are another run's.
        while dir.attempt_dir(job, rec.attempts).exists() {
            tracing::warn!(
                "`{job}`: {} exists already; skipping that attempt number",
                dir.attempt_dir(job, rec.attempts).display()
            );
            rec.attempts += 1;
        }
        let attempt = rec.attempts;
        // Cores no other run holds, the ones recorded just before included.
        let cores = if backend.name() == "local" {
            let held: Vec<u32> = state_cores(&state, job);
            let want: u32 = allocation.nodes.iter().map(|n| n.cpus).sum();
            free_cores(&held, want)
        } else {
            Vec::new()
        };
        let rec = state.jobs.get_mut(job).context("a desired job has a record")?;
        let run = RunRecord {
            plan: allocation.plan,
            nodes: allocation.nodes.clone(),
            attempt,
            phase: RunPhase::Starting,
            handle: None,
            started_unix_s: unix_now(),
            rounds_since_change: 0,
            cores: cores.clone(),
        };
        if let Some(last) = rec.reconfigurations.last_mut().filter(|r| r.to.is_none()) {
            last.to = Some(allocation.plan.to_string());
        }
        rec.first_started_unix_s.get_or_insert(run.started_unix_s);
        rec.run = Some(run);
        rec.status = JobStatus::Running;
        let mut launch = rec.job.launch.clone().context("a submitted job has a launch section")?;
        // Relative paths of the command resolve against where the job was submitted,
        // not against wherever this apply runs (a container's working directory is the
        // image's business).
        if let Some(from) = rec.submitted_from.as_ref().filter(|_| backend.name() != "kubernetes") {
            let from = from.display().to_string().replace('{', "{{").replace('}', "}}");
            launch.workdir = Some(match launch.workdir.take() {
                Some(w) if w.starts_with('/') || w.starts_with('{') => w,
                Some(w) => format!("{from}/{w}"),
                None => from,
            });
        }
        let total = rec.job.iterations.to_string();
        launch.env.entry("RUBICK_TOTAL_ITERATIONS".into()).or_insert_with(|| total.clone());
        launch.env.entry("RUBICK_ITERATIONS".into()).or_insert(total);
        starting.push(Starting {
            job: rec.job.clone(),
            launch,
            allocation: allocation.clone(),
            attempt,
            dir: dir.attempt_dir(job, attempt),
            checkpoints: dir.job_dir(job).join("checkpoints"),
            cores,
        });
    }
    if !starting.is_empty() {
        dir.save(&state)?;
        failpoint("start-recorded");
    }
    let started: Vec<anyhow::Result<String>> = std::thread::scope(|scope| {
        let launches: Vec<_> = starting
            .iter()
            .map(|s| {
                let backend = backend.as_ref();
                scope.spawn(move || {
                    backend.start(&backends::StartSpec {
                        job: &s.job,
                        launch: &s.launch,
                        allocation: &s.allocation,
                        dir: &s.dir,
                        checkpoint_dir: &s.checkpoints,
                        cores: &s.cores,
                    })
                })
            })
            .collect();
        launches.into_iter().map(|l| l.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    if !starting.is_empty() {
        failpoint("spawned");
    }
    for (s, result) in starting.iter().zip(started) {
        let job = s.job.name.as_str();
        let rec = state.jobs.get_mut(job).context("record")?;
        let handle = match result {
            Ok(handle) => handle,
            Err(e) => {
                // One job that cannot start never blocks the others.
                let why = format!("could not start under {}: {e:#}", s.allocation.plan);
                eprintln!("{job}: failed: {why}");
                rec.run = None;
                rec.status = JobStatus::Failed;
                rec.reason = Some(why.clone());
                start_failures.push(format!("{job}: {why}"));
                continue;
            }
        };
        if let Some(run) = rec.run.as_mut() {
            run.handle = Some(handle.clone());
            run.phase = RunPhase::Running;
            // What this run was, beside what it measures (the online refit reads both).
            state::write_durably(&s.dir.join("run.yaml"), serde_yaml_ng::to_string(&*run)?.as_bytes())?;
        }
        let shown = if backend.name() == "local" { handle.split('@').next().unwrap_or(&handle) } else { &handle };
        eprintln!(
            "{job}: started {} on {} (run {}, {} {shown})",
            s.allocation.plan,
            where_(&s.allocation.nodes),
            s.attempt,
            if backend.name() == "local" { "process group" } else { "handle" }
        );
    }
    dir.save(&state)?;
    lap("actions taken");
    if let Some(c) = &given {
        state::write_if_changed(&remembered, to_yaml(c).as_bytes())?;
    }
    state.round = Some(schedule.round);
    state.cluster = Some(schedule.cluster.clone());
    state.backend = Some(backend_name.to_owned());
    dir.save(&state)?;
    state::write_if_changed(&dir.current_path(), to_yaml(&schedule).as_bytes())?;
    lap("state and schedule saved");
    failpoint("applied");
    if actions.is_empty() {
        tracing::info!("nothing to change");
    }
    if !start_failures.is_empty() {
        return Ok(Outcome::Negative(format!(
            "{} job(s) could not start and are failed (the others were applied): {}",
            start_failures.len(),
            start_failures.join("; ")
        )));
    }
    Ok(Outcome::Done)
}

/// Refuses an output inside the state directory: it would replace the state's own files.
fn ensure_outside(dir: &StateDir, output: &Path) -> anyhow::Result<()> {
    if rubick_io::files::is_std(output) {
        return Ok(());
    }
    let out = std::path::absolute(output)?;
    let parent = out.parent().and_then(|p| p.canonicalize().ok()).unwrap_or_else(|| out.clone());
    let root = dir.root.canonicalize().unwrap_or_else(|_| dir.root.clone());
    anyhow::ensure!(
        !parent.starts_with(&root),
        "{}: inside the state directory {}; write it elsewhere (the state's files are never overwritten)",
        output.display(),
        dir.root.display()
    );
    Ok(())
}

/// Refuses a job directory (or `jobs/`) that is a symlink: the state writes only into
/// directories it made.
fn ensure_own_dirs(dir: &StateDir, job: &str) -> anyhow::Result<()> {
    for path in [dir.root.join("jobs"), dir.job_dir(job)] {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            bail!("{}: a symlink the state did not make; refusing to write through it", path.display());
        }
    }
    Ok(())
}

/// A live run in one of `job`'s attempt directories that its record does not hold.
fn live_unrecorded_run(dir: &StateDir, state: &State, job: &str, backend: &dyn Backend) -> Option<(u32, String)> {
    let recorded = state.jobs.get(job).and_then(|r| r.run.as_ref()).map(|r| r.attempt);
    let entries = std::fs::read_dir(dir.job_dir(job)).ok()?;
    let mut attempts: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("attempt-")?.parse().ok())
        .filter(|a| Some(*a) != recorded)
        .collect();
    attempts.sort_unstable();
    attempts.into_iter().find_map(|a| backend.recover(&dir.attempt_dir(job, a)).map(|h| (a, h)))
}

/// Cores the runs of jobs other than `job` are pinned to.
fn state_cores(state: &State, job: &str) -> Vec<u32> {
    state
        .jobs
        .iter()
        .filter(|(n, _)| n.as_str() != job)
        .filter_map(|(_, r)| r.run.as_ref())
        .flat_map(|r| r.cores.clone())
        .collect()
}

/// `want` of this machine's cores that none of `held` is, lowest first; fewer when
/// there are not enough (then the run is pinned to what is free, or not at all).
fn free_cores(held: &[u32], want: u32) -> Vec<u32> {
    let total = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let free: Vec<u32> = (0..total).filter(|c| !held.contains(c)).take(want as usize).collect();
    if (free.len() as u32) < want {
        tracing::warn!("{want} cores asked, {} free on this machine: pinned to those", free.len());
    }
    free
}

/// The state brought up to date with its backend (runs that ended, starts and stops
/// an interrupted rubick-run left) and saved, with that backend: what every command
/// but `submit` and `apply` starts from.
fn refreshed(dir: &StateDir) -> anyhow::Result<(State, Box<dyn Backend>)> {
    let mut state = dir.load()?;
    let backend = state_backend(dir, &state)?;
    refresh(dir, &mut state, backend.as_ref())?;
    dir.save(&state)?;
    Ok((state, backend))
}

/// The record of `job`, or an error naming the state.
fn record<'a>(dir: &StateDir, state: &'a State, job: &str) -> anyhow::Result<&'a JobRecord> {
    state.jobs.get(job).with_context(|| format!("`{job}` is not a job of {}", dir.root.display()))
}

/// The backend the state's runs are on (local until an apply says otherwise).
fn state_backend(dir: &StateDir, state: &State) -> anyhow::Result<Box<dyn Backend>> {
    let name = state.backend.as_deref().unwrap_or("local");
    backends::backend(name, Some(&dir.root))?
        .with_context(|| format!("state: backend: `{name}` is not known to this rubick-run"))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn where_(nodes: &[rubick_core::schedule::NodeShare]) -> String {
    nodes
        .iter()
        .map(|n| format!("{}:{}", n.node, n.gpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn jobs(args: &StateArgs, output: &Path, cluster: Option<&Path>) -> anyhow::Result<Outcome> {
    let cluster: Option<Cluster> = cluster.map(load_artifact).transpose()?;
    let dir = locked!(args, false);
    ensure_outside(&dir, output)?;
    let (state, _) = refreshed(&dir)?;
    let mut refitted: BTreeMap<String, PathBuf> = BTreeMap::new();
    if let Some(cluster) = &cluster {
        for (name, rec) in state.jobs.iter().filter(|(_, r)| matches!(r.status, JobStatus::Queued | JobStatus::Running))
        {
            match refit(&dir, name, rec, cluster) {
                Ok(Some(path)) => {
                    refitted.insert(name.clone(), path);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("`{name}`: no online refit: {e:#}"),
            }
        }
    }
    let jobs: Vec<Job> = state
        .jobs
        .values()
        .filter(|r| matches!(r.status, JobStatus::Queued | JobStatus::Running))
        .map(|r| {
            let mut job = r.job.clone();
            job.kind = None;
            job.api_version = None;
            job.iterations = job.iterations.saturating_sub(r.iterations_done).max(1);
            // The job clock: when it was submitted (Unix seconds), against the batch's nowS.
            job.submit_time_s = r.submitted_unix_s;
            let costs: Vec<f64> = r
                .reconfigurations
                .iter()
                .filter(|c| c.to.is_some())
                .map(|c| c.stop_s + c.first_iteration_s.unwrap_or(0.0))
                .collect();
            if !costs.is_empty() {
                job.restart_cost_s = Some(costs.iter().sum::<f64>() / costs.len() as f64);
            }
            if let Some(path) = refitted.get(&r.job.name) {
                job.perf_model = Some(path.display().to_string());
            }
            job.current = r.run.as_ref().and_then(|run| {
                Some(CurrentAllocation {
                    plan: run.plan,
                    placement: Placement::new(run.nodes.iter().map(|n| n.gpus.len() as u32).collect())?,
                    nodes: run.nodes.iter().map(|n| n.node.clone()).collect(),
                    cpus: Some(run.nodes.iter().map(|n| n.cpus).sum()),
                    rounds_since_change: run.rounds_since_change,
                })
            });
            job
        })
        .collect();
    let batch =
        JobBatch { api_version: Some(ApiVersion::CURRENT), kind: Some(Kind::JobBatch), jobs, now_s: Some(unix_now()) };
    rubick_io::write_output(output, to_yaml(&batch).as_bytes())?;
    Ok(Outcome::Done)
}

/// The job's own measurements as a profile table (`jobs/NAME/profile.csv`: one row per
/// run, its iterations after the warm-up) and, from its first measured run, its model
/// refitted on those runs *and* the rows its submitted model was fitted on (its
/// profile: `diagnostics.rows` and `inconsistentRows` of `perfModel`), when together
/// they span 2 or more configurations (`jobs/NAME/model.yaml`, whose path is returned).
/// A plan the model got wrong is measured by its run, and the next round's plan is
/// chosen by a model that knows it.
fn refit(dir: &StateDir, name: &str, rec: &JobRecord, cluster: &Cluster) -> anyhow::Result<Option<PathBuf>> {
    use rubick_core::fit::{FitOptions, Observation, fit};
    use rubick_core::launch::MetricLine;
    use rubick_core::tables::{PROFILE, ProfileRow};
    let warmup = rec.job.launch.as_ref().map_or(3, |l| l.warmup_iterations);
    let links = rubick_core::perfmodel::Links::of_cluster(cluster);
    let (mut rows, mut observations) = (Vec::new(), Vec::new());
    for attempt in 1..=rec.attempts {
        let adir = dir.attempt_dir(name, attempt);
        let Ok(text) = std::fs::read_to_string(adir.join("run.yaml")) else { continue };
        let run: RunRecord =
            serde_yaml_ng::from_str(&text).with_context(|| format!("{}", adir.join("run.yaml").display()))?;
        let metrics = std::fs::read_to_string(adir.join("metrics.jsonl")).unwrap_or_default();
        let lines: Vec<MetricLine> = metrics.lines().filter_map(MetricLine::parse).collect();
        let times =
            rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&lines, warmup, None));
        let Some(placement) = Placement::new(run.nodes.iter().map(|n| n.gpus.len() as u32).collect()) else { continue };
        let Some((mean, sd)) = rubick_core::launch::mean_sd(&times) else { continue };
        rows.push(ProfileRow {
            job: name.to_owned(),
            model: rec.job.model.name.clone(),
            plan: run.plan.to_string(),
            placement: placement.to_string(),
            cpus: Some(i64::from(run.nodes.iter().map(|n| n.cpus).sum::<u32>())),
            status: Some("ok".into()),
            repeat: Some(i64::from(attempt)),
            iterations: Some(times.len() as i64),
            iter_time_s: Some(mean),
            iter_time_sd_s: Some(sd),
            samples_per_s: Some(run.plan.global_batch() as f64 / mean),
            ..ProfileRow::default()
        });
        observations.push(Observation { plan: run.plan, placement, links, iter_time_s: mean });
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let mut df = rubick_io::table::frame_of(&rows, &PROFILE)?;
    let table = dir.job_dir(name).join("profile.csv");
    rubick_io::table::write_table(&mut df, &table, None, &PROFILE)?;
    let runs = observations.len();
    let mut source = table.display().to_string();
    if let Some(path) = &rec.job.perf_model {
        let submitted: rubick_core::perf::PerfModel = load_artifact(Path::new(path))?;
        if let Some(d) = &submitted.diagnostics {
            let profiled: Vec<Observation> = d
                .rows
                .iter()
                .chain(&d.inconsistent_rows)
                .filter(|r| r.measured_s.is_finite() && r.measured_s > 0.0 && r.plan.gpus() == r.placement.gpus())
                .map(|r| Observation { plan: r.plan, placement: r.placement.clone(), links, iter_time_s: r.measured_s })
                .collect();
            if !profiled.is_empty() {
                source = format!("{} + {} row(s) of {path}", source, profiled.len());
            }
            observations.extend(profiled);
        }
    }
    let mut configs: Vec<(Plan, Placement)> = observations.iter().map(|o| (o.plan, o.placement.clone())).collect();
    configs.sort();
    configs.dedup();
    if configs.len() < 2 {
        return Ok(None);
    }
    let fitted = fit(&rec.job.model, &observations, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let model = rubick_core::perf::PerfModel::of_fit(&rec.job.model, &observations, &fitted, &source);
    let path = std::path::absolute(dir.job_dir(name).join("model.yaml"))?;
    state::write_durably(&path, to_yaml(&model).as_bytes())?;
    tracing::info!(
        "`{name}`: model refitted on {runs} run(s) and {} profiled row(s): {} configurations",
        observations.len() - runs,
        configs.len()
    );
    Ok(Some(path))
}

fn logs(job: &str, attempt: Option<u32>, follow: bool, args: &StateArgs) -> anyhow::Result<Outcome> {
    use std::io::{Read, Write};
    // The lock only while the records are read: following a log must not hold rounds up.
    let (path, exit_file, state_file, attempt) = {
        let dir = locked!(args, false);
        let state = dir.load()?;
        let rec = record(&dir, &state, job)?;
        anyhow::ensure!(rec.attempts > 0, "`{job}` has not run yet");
        let attempt = attempt.unwrap_or(rec.attempts);
        anyhow::ensure!(
            (1..=rec.attempts).contains(&attempt),
            "--attempt {attempt}: `{job}` has runs 1 to {}",
            rec.attempts
        );
        let adir = dir.attempt_dir(job, attempt);
        (adir.join("log.txt"), adir.join("exit-code"), dir.state_path(), attempt)
    };
    // Whether the run still runs, as the state (rewritten atomically) or its exit code says.
    let running = || {
        !exit_file.exists()
            && std::fs::read_to_string(&state_file)
                .ok()
                .and_then(|t| serde_yaml_ng::from_str::<State>(&t).ok())
                .and_then(|s| s.jobs.get(job).and_then(|r| r.run.as_ref()).map(|r| r.attempt))
                == Some(attempt)
    };
    let mut file = std::fs::File::open(&path).with_context(|| format!("{}: no log", path.display()))?;
    let mut out = std::io::stdout().lock();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        file.read_to_end(&mut buf).with_context(|| path.display().to_string())?;
        out.write_all(&buf)?;
        out.flush()?;
        if !follow || !running() {
            // One last read: what the run wrote before its exit code.
            buf.clear();
            file.read_to_end(&mut buf)?;
            out.write_all(&buf)?;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(Outcome::Done)
}

fn delete_job(job: &str, args: &StateArgs) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    let (mut state, _) = refreshed(&dir)?;
    let rec = record(&dir, &state, job)?;
    if matches!(rec.status, JobStatus::Queued | JobStatus::Running) {
        bail!("`{job}` is {:?}; stop it first (`rubick-run stop {job}`)", rec.status);
    }
    // The record goes first: a crash then leaves files of no job, never a job without
    // its files.
    state.jobs.remove(job);
    dir.save(&state)?;
    let files = dir.job_dir(job);
    if files.exists() {
        std::fs::remove_dir_all(&files).with_context(|| format!("{}: cannot remove it", files.display()))?;
    }
    eprintln!("{job}: deleted");
    Ok(Outcome::Done)
}

fn stop_job(job: &str, args: &StateArgs) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    let (mut state, backend) = refreshed(&dir)?;
    let was = record(&dir, &state, job)?.status;
    if let Some((secs, clean)) = stop_run(&dir, &mut state, job, backend.as_ref())? {
        eprintln!("{job}: stopped in {secs:.1} s{}", if clean { "" } else { " (killed after stopTimeoutS)" });
    }
    let rec = state.jobs.get_mut(job).context("record")?;
    if matches!(was, JobStatus::Queued | JobStatus::Running) {
        rec.status = JobStatus::Stopped;
        rec.reason = Some("stopped by `rubick-run stop`".into());
    }
    dir.save(&state)?;
    Ok(Outcome::Done)
}

fn status(args: &StateArgs, format: StatusFormat, output: &Path, plot: Option<&Path>) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    ensure_outside(&dir, output)?;
    if let Some(p) = plot {
        ensure_outside(&dir, p)?;
    }
    let (state, _) = refreshed(&dir)?;
    let mut rows = Vec::new();
    for (name, r) in &state.jobs {
        let mean =
            r.run.as_ref().and_then(|run| backends::progress(&dir.attempt_dir(name, run.attempt)).recent_iter_time_s);
        rows.push((name, r, mean));
    }
    // What the round that placed each running job predicted (seconds per iteration).
    let applied: Option<Schedule> =
        dir.current_path().exists().then(|| load_artifact(&dir.current_path())).transpose().unwrap_or(None);
    let predicted_s = |name: &str, r: &JobRecord| -> Option<f64> {
        let a = applied.as_ref()?.assignments.iter().find(|a| a.job == name)?;
        (r.status == JobStatus::Running && a.predicted_throughput > 0.0)
            .then(|| r.job.model.global_batch as f64 / a.predicted_throughput)
    };
    let log_of =
        |name: &str, r: &JobRecord| (r.attempts > 0).then(|| dir.attempt_dir(name, r.attempts).join("log.txt"));
    let text = match format {
        StatusFormat::Yaml => {
            // The records, with what a person reads in the table: why, the measured and
            // predicted seconds per iteration, the log.
            let mut doc = serde_yaml_ng::to_value(&state)?;
            for (name, r, mean) in &rows {
                let entry = &mut doc["jobs"][name.as_str()];
                entry["measuredIterTimeS"] = serde_yaml_ng::to_value(mean)?;
                entry["predictedIterTimeS"] = serde_yaml_ng::to_value(predicted_s(name, r))?;
                entry["log"] = serde_yaml_ng::to_value(log_of(name, r))?;
            }
            serde_yaml_ng::to_string(&doc)?
        }
        StatusFormat::Table => {
            // 100 columns; a job that is not running says why on a line of its own.
            let fit = |text: String, width: usize| {
                if text.chars().count() > width {
                    format!("{}~", text.chars().take(width - 1).collect::<String>())
                } else {
                    text
                }
            };
            let mut out = format!(
                "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
                "job", "status", "plan", "where", "run", "iterations", "iter_s (pred)"
            );
            for (name, r, mean) in &rows {
                let times = match (mean, predicted_s(name, r)) {
                    (Some(m), Some(p)) => format!("{m:.3} ({p:.3})"),
                    (Some(m), None) => format!("{m:.3}"),
                    (None, Some(p)) => format!("- ({p:.3})"),
                    (None, None) => "-".to_owned(),
                };
                out.push_str(&format!(
                    "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
                    fit((*name).clone(), 14),
                    format!("{:?}", r.status).to_lowercase(),
                    fit(r.run.as_ref().map_or("-".to_owned(), |run| run.plan.to_string()), 30),
                    fit(r.run.as_ref().map_or("-".to_owned(), |run| where_(&run.nodes)), 14),
                    r.attempts,
                    fit(format!("{}/{}", r.iterations_done, r.job.iterations), 11),
                    fit(times, 13),
                ));
                if r.status != JobStatus::Running
                    && let Some(reason) = &r.reason
                {
                    // The reason within the 100 columns (whole in `--format yaml`); the
                    // log on a line of its own.
                    out.push_str(&fit(format!("  why: {reason}; {} retries left", r.retries_left), 100));
                    out.push('\n');
                    if let Some(log) = log_of(name, r) {
                        out.push_str(&format!("  log: {}\n", log.display()));
                    }
                }
            }
            out
        }
        StatusFormat::Prometheus => {
            let mut out = String::new();
            let metric = |out: &mut String, name: &str, kind: &str, help: &str, values: &[(String, f64)]| {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
                for (labels, v) in values {
                    out.push_str(&format!("{name}{{{labels}}} {v}\n"));
                }
            };
            // Label values escaped as the exposition format says (\\, \", \n); series keyed by
            // the job only, so a reconfiguration never starts new ones (the plan is in
            // rubick_job_info).
            let escape = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let label = |name: &str, _: &JobRecord| format!("job=\"{}\"", escape(name));
            let of = |f: &dyn Fn(&JobRecord, Option<f64>) -> f64| -> Vec<(String, f64)> {
                rows.iter().map(|(n, r, mean)| (label(n, r), f(r, *mean))).collect()
            };
            let info: Vec<(String, f64)> = rows
                .iter()
                .map(|(n, r, _)| {
                    let plan = r.run.as_ref().map_or("none".to_owned(), |run| run.plan.to_string());
                    (format!("job=\"{}\",plan=\"{}\"", escape(n), escape(&plan)), 1.0)
                })
                .collect();
            metric(&mut out, "rubick_job_info", "gauge", "the plan the job runs (none when it does not)", &info);
            let statuses: Vec<(String, f64)> = rows
                .iter()
                .flat_map(|(n, r, _)| {
                    ["queued", "running", "finished", "failed", "stopped"].map(|s| {
                        let on = format!("{:?}", r.status).to_lowercase() == s;
                        (format!("job=\"{}\",status=\"{s}\"", escape(n)), f64::from(u8::from(on)))
                    })
                })
                .collect();
            metric(&mut out, "rubick_job_status", "gauge", "1 for the job's status, 0 for the others", &statuses);
            metric(
                &mut out,
                "rubick_job_running",
                "gauge",
                "1 while the job runs",
                &of(&|r, _| f64::from(u8::from(r.status == JobStatus::Running))),
            );
            metric(
                &mut out,
                "rubick_job_retries_left",
                "gauge",
                "restarts left after retryable failures",
                &of(&|r, _| f64::from(r.retries_left)),
            );
            metric(
                &mut out,
                "rubick_job_iterations_done",
                "gauge",
                "highest iteration reported",
                &of(&|r, _| r.iterations_done as f64),
            );
            metric(
                &mut out,
                "rubick_job_runs_total",
                "counter",
                "runs started (first start and restarts)",
                &of(&|r, _| f64::from(r.attempts)),
            );
            metric(
                &mut out,
                "rubick_job_reconfigure_seconds_total",
                "counter",
                "seconds spent stopping for reconfigurations and preemptions",
                // `+ 0.0`: an empty f64 sum is -0.0, which prints `-0`.
                &of(&|r, _| r.reconfigurations.iter().map(|c| c.stop_s).sum::<f64>() + 0.0),
            );
            let measured: Vec<(String, f64)> = rows
                .iter()
                .filter_map(|(n, r, mean)| mean.map(|m| (label(n, r), r.job.model.global_batch as f64 / m)))
                .collect();
            metric(
                &mut out,
                "rubick_job_measured_samples_per_second",
                "gauge",
                "throughput of the last ten iterations",
                &measured,
            );
            // What the round that placed it predicted, and whether its guarantee held.
            let assignment = |name: &str| applied.as_ref().and_then(|s| s.assignments.iter().find(|a| a.job == name));
            let predicted: Vec<(String, f64)> = rows
                .iter()
                .filter(|(_, r, _)| r.status == JobStatus::Running)
                .filter_map(|(n, r, _)| assignment(n).map(|a| (label(n, r), a.predicted_throughput)))
                .collect();
            metric(
                &mut out,
                "rubick_job_predicted_samples_per_second",
                "gauge",
                "throughput the schedule predicted for the running job",
                &predicted,
            );
            let held: Vec<(String, f64)> = rows
                .iter()
                .filter_map(|(n, r, _)| {
                    assignment(n)?.guarantee.as_ref().map(|g| (label(n, r), f64::from(u8::from(g.holds))))
                })
                .collect();
            metric(&mut out, "rubick_job_guarantee_held", "gauge", "1 when the guaranteed job's request is met", &held);
            metric(
                &mut out,
                "rubick_job_queue_seconds",
                "gauge",
                "submission to first start (to now while it waits)",
                &of(&|r, _| r.first_started_unix_s.unwrap_or_else(unix_now) - r.submitted_unix_s),
            );
            out
        }
    };
    rubick_io::write_output(output, text.as_bytes())?;
    if let Some(path) = plot {
        let rows = run_history(&dir, &state);
        rubick_io::plot::write_figure(
            path,
            (1200, 160 + 40 * rows.len().max(1) as u32),
            &plot::RunsFigure { jobs: &rows, now_s: unix_now() },
        )?;
    }
    Ok(Outcome::Done)
}

/// Every job's runs from its attempt directories (`run.yaml`: plan and start; the end:
/// its exit code's time, the next run's start, or now), in submission order.
fn run_history(dir: &StateDir, state: &State) -> Vec<plot::JobRow> {
    let modified = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
    };
    let now = unix_now();
    let mut rows: Vec<plot::JobRow> = state
        .jobs
        .iter()
        .map(|(name, rec)| {
            let mut runs: Vec<plot::RunSpan> = Vec::new();
            for attempt in 1..=rec.attempts {
                let adir = dir.attempt_dir(name, attempt);
                let Ok(text) = std::fs::read_to_string(adir.join("run.yaml")) else { continue };
                let Ok(run) = serde_yaml_ng::from_str::<RunRecord>(&text) else { continue };
                let live = rec.run.as_ref().is_some_and(|r| r.attempt == attempt);
                let exit = adir.join("exit-code");
                let end = if live {
                    now
                } else {
                    modified(&exit).or_else(|| modified(&adir.join("metrics.jsonl"))).unwrap_or(run.started_unix_s)
                };
                runs.push(plot::RunSpan {
                    plan: run.plan.to_string(),
                    gpus: run.plan.gpus(),
                    start_s: run.started_unix_s,
                    end_s: end.max(run.started_unix_s),
                    stopped: !live,
                });
            }
            // The last run of a job that ended on its own was not stopped.
            if matches!(rec.status, JobStatus::Finished | JobStatus::Failed)
                && let Some(last) = runs.last_mut()
            {
                last.stopped = false;
            }
            plot::JobRow { name: name.clone(), submitted_s: rec.submitted_unix_s, runs }
        })
        .collect();
    rows.sort_by(|a, b| a.submitted_s.total_cmp(&b.submitted_s).then(a.name.cmp(&b.name)));
    rows
}
