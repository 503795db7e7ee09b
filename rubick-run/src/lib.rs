//! # rubick-run: launch and reconfigure training runs from a schedule
//!
//! * `submit` — queue jobs in a state directory;
//! * `jobs` — the `JobBatch` of the state (queued and running jobs, where they run,
//!   iterations left) for `rubick-plan schedule --jobs -`;
//! * `apply` — reconcile a schedule with what runs: start, reconfigure (stop signal,
//!   checkpoint, relaunch under the new plan), preempt; idempotent and crash-safe;
//! * `status` — what runs where and how fast (table, YAML, Prometheus text);
//! * `stop` — stop a job for good; `logs` — a run's log; `delete` — forget a job
//!   that ended; `cluster` — the cluster a backend really has; `check` — validate
//!   schedules.
//!
//! The reconcile decision is a pure function ([`reconcile`]), and so is what a job
//! becomes after its run ended ([`lifecycle`]); the state directory ([`state`]) is
//! locked and rewritten atomically around every action; backends are behind one trait
//! ([`backends`]). The commands: `apply.rs`, `jobs.rs`, `status.rs`; the runs' records
//! brought up to date and stopped: `runs.rs`; the smaller commands and the CLI here.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use rubick_core::schedule::Schedule;
use rubick_io::cli::{CheckArgs, Common, LogArgs, Outcome};

pub mod backends;
pub mod cluster;
pub mod lifecycle;
pub mod plot;
pub mod reconcile;
pub mod state;

use state::{JobRecord, State, StateDir};

const EXAMPLES: &str = "\
Examples:
  # Queue a job (its Job YAML has a launch section: see the README,
  # \"The job contract\")
  rubick-run submit examples/pytorch/job.yaml --state /var/lib/rubick

  # One round, every minute from cron: the state's jobs, scheduled, applied
  rubick-run jobs --state /var/lib/rubick \\
    | rubick-plan schedule --cluster cluster.yaml --jobs - \\
        --current /var/lib/rubick/current.yaml \\
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
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(..=i64::from(state::MAX_RETRIES)))]
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
        /// checkpointPvc, manifestDir, kubectl: true|false, kind: PyTorchJob|TrainJob,
        /// runsPvc + runsRoot: a claim holding the runs' directories, mounted at that
        /// path here and in the pods, so their progress is seen); kept in the state
        /// directory for every later command. Fields left out fall back to
        /// RUBICK_K8S_IMAGE, RUBICK_K8S_CHECKPOINT_PVC, RUBICK_K8S_MANIFEST_DIR,
        /// RUBICK_KUBECTL, RUBICK_K8S_KIND, RUBICK_K8S_RUNS_PVC/_ROOT, then the defaults
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
    #[command(mut_arg("files", |files| files.help("Schedule files, `-` for stdin")))]
    Check(CheckArgs),
    #[command(flatten)]
    Common(Common),
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
        match $crate::open($args, $create)? {
            Ok(dir) => dir,
            Err(busy) => return Ok(rubick_io::cli::Outcome::Negative(busy)),
        }
    };
}

mod apply;
mod jobs;
mod logs;
mod runs;
mod status;
mod stop;
mod submit;

use apply::apply;
use jobs::jobs;
use logs::logs;
pub use runs::{MAX_REFUSED_PLANS, classify};
use runs::{refresh, refreshed, stop_runs};
use status::status;
use stop::{delete_job, stop_job};
use submit::submit;

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Common(common) => common.run::<Cli>(),
        Command::Submit { jobs, state, retries, replace } => submit(&jobs, &state, retries, replace),
        Command::Jobs { state, output, cluster } => jobs(&state, &output, cluster.as_deref()),
        Command::Apply { schedule, state, backend, cluster, dry_run, kubernetes } => {
            apply(&schedule, &state, &backend, cluster.as_deref(), dry_run, kubernetes.as_deref())
        }
        Command::Status { state, format, output, plot } => status(&state, format, &output, plot.as_deref()),
        Command::Stop { job, state } => stop_job(&job, &state),
        Command::Delete { job, state } => delete_job(&job, &state),
        Command::Logs { job, attempt, follow, state } => logs(&job, attempt, follow, &state),
        Command::Check(CheckArgs { files }) => rubick_io::cli::check_command::<Schedule>(&files),
        Command::Cluster { backend, hardware, output } => cluster::command(&backend, &hardware, &output),
    }
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

/// The record of `job`, or an error naming the state.
fn record<'a>(dir: &StateDir, state: &'a State, job: &str) -> anyhow::Result<&'a JobRecord> {
    state.jobs.get(job).with_context(|| format!("`{job}` is not a job of {}", dir.root.display()))
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
