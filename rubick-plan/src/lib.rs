//! # rubick-plan: one scheduling round, and the tools around it
//!
//! * `schedule`: one round, every job's plan and resources together (heuristic or
//!   exact MILP), placed on nodes;
//! * `curves`: every job's resource sensitivity curve, as a table and a plot;
//! * `synth`: a realistic synthetic cluster and batch;
//! * `trace` (a real cluster's job log, Philly's or Slurm's `sacct`, as a trace),
//!   `simulate` (replay a trace against a policy of `rubick_policy` under the
//!   simulator of `rubick_sim`) and `compare` (simulation summaries side by side);
//! * `space` (a job's feasible plans on N GPUs, with their memory estimate), `check`
//!   (validate artifacts) and `schema` (print the JSON Schemas).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use rubick_core::artifact::{self, Kind};
use rubick_core::{Cluster, Job, JobBatch};
use rubick_io::cli::{CheckArgs, Common, ListFormat, LogArgs, Outcome, ensure_one_stdin};
use rubick_io::files::{load_artifact, parse_artifact, read_text};
use rubick_model::space::Dimensions;
use rubick_model::{MemoryEstimator, PlanSpace};

pub mod curves;
pub mod round;
pub mod schedule;
pub mod simulate;
pub mod space;
pub mod synth;
pub mod trace;

const EXAMPLES: &str = "\
Examples:
  C=data/cluster-a800-8x8.yaml J=data/jobs-paper.yaml
  R=../shared/reference/rubick-artifact

  # One round for the example jobs, with an explanation per job on stderr
  rubick-plan schedule --cluster $C --jobs $J --explain -o round.yaml

  # The next round, exact MILP, from where the jobs run now
  rubick-plan schedule --cluster $C --jobs $J --current round.yaml \\
      --policy rubick-milp --time-limit 5 -o round2.yaml

  # Resource sensitivity curves, models fitted on the authors' data, plotted
  rubick-plan curves $J --cluster $C --reference $R --plot curves.png \\
      -o curves.csv

  # Replay the authors' base trace with Rubick, then compare with a static
  # FIFO queue
  rubick-plan simulate --cluster $C --reference $R \\
      --trace $R/workloads/workload-base.csv --summary rubick.yaml \\
      --plot-dir plots/
  rubick-plan compare rubick.yaml static.yaml --plot jct-cdf.png

  # The first 2,000 jobs of the Philly trace as a trace for a 64-GPU cluster,
  # replayed
  rubick-plan trace ../shared/reference/traces/philly.csv --format philly \\
      --cluster $C --limit 2000 -o philly.csv
  rubick-plan simulate --cluster $C --reference $R --trace philly.csv \\
      --summary philly-rubick.yaml

  # A Slurm cluster's own last month, as a trace
  sacct -a -P -S now-30days \\
      -o JobID,Partition,Submit,Elapsed,State,AllocTRES > sacct.txt
  rubick-plan trace sacct.txt --format sacct --cluster cluster.yaml -o slurm.csv

  # A synthetic 64-GPU cluster with 60 jobs, for benchmarks
  rubick-plan synth --gpus 64 --jobs 60 --seed 1 --out-dir synth/

  # Feasible plans of the example jobs on 8 GPUs of the paper's testbed
  rubick-plan space $J --cluster $C --gpus 8

  # The same as CSV, for a spreadsheet
  rubick-plan space $J --cluster $C --gpus 8 -o space.csv

  # Validate artifacts before a round
  rubick-plan check $C $J

  # JSON Schema of the Cluster artifact, for editors and CI
  rubick-plan schema cluster";

/// Choose every job's execution plan and resources together, each scheduling round.
///
/// rubick-plan follows the Rubick paper (arXiv 2408.08586, MLSys 2025): a job's plan
/// (data, tensor and pipeline parallelism, ZeRO, offload, accumulation,
/// checkpointing) and its GPUs, CPUs and memory are chosen jointly, guided by a
/// performance model, so that every guaranteed job keeps at least the throughput it
/// asked for.
#[derive(Debug, Parser)]
#[command(name = "rubick-plan", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Plan one round: every job's plan, GPUs, cores, memory and nodes; exit 1 when a
    /// guaranteed job cannot get its guarantee
    Schedule(schedule::ScheduleArgs),
    /// Print (CSV) and plot every job's resource sensitivity curve
    Curves(curves::CurvesArgs),
    /// Write a synthetic cluster and job batch (DIR/cluster.yaml, DIR/jobs.yaml)
    Synth(synth::SynthArgs),
    /// Turn a real cluster's job log (Philly, or Slurm's sacct) into a trace that
    /// simulate replays, each job mapped to a model and a request
    #[command(after_help = trace::MAPPING)]
    Trace(trace::TraceArgs),
    /// Replay a job trace against a policy: policies decide on fitted beliefs, jobs run at
    /// the truth (measured rows, an oracle elsewhere), over seeds with noise
    Simulate(simulate::SimulateArgs),
    /// Side-by-side table (Markdown) of simulation summaries, and their JCT CDFs
    Compare(simulate::CompareArgs),
    /// List a job's valid, memory-feasible plans on N GPUs with their GPU memory
    Space(SpaceArgs),
    /// Validate artifact files (kind taken from each file); exit 2 on the first bad one
    #[command(mut_arg("files", |files| files.help("Artifact files (YAML), `-` for stdin")))]
    Check(CheckArgs),
    /// Print the JSON Schema of an artifact kind or table
    Schema {
        /// cluster, job, job-batch, model-spec, perf-model, schedule, simulation-summary,
        /// table-profile, table-sim-jobs
        name: String,
    },
    #[command(flatten)]
    Common(Common),
}

#[derive(Debug, clap::Args)]
pub struct SpaceArgs {
    /// A Job or a JobBatch (YAML), `-` for stdin
    pub jobs: PathBuf,
    /// The Cluster (YAML)
    #[arg(long)]
    pub cluster: PathBuf,
    /// GPUs to plan for; default: each job's requested GPUs
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=rubick_core::limits::MAX_GPUS as i64), allow_hyphen_values = true)]
    pub gpus: Option<u32>,
    /// Output format; default by the extension of -o (.yaml, .csv, .parquet), else YAML; an extension naming another format is an error
    #[arg(long, value_enum)]
    pub format: Option<ListFormat>,
    /// Output file, `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// GiB kept free on every GPU for context, NCCL and fragmentation
    #[arg(long, default_value_t = MemoryEstimator::default().reserve_gib, value_parser = rubick_io::flags::gib, allow_hyphen_values = true)]
    pub reserve_gib: f64,
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Common(common) => common.run::<Cli>(),
        Command::Schedule(args) => schedule::run(&args),
        Command::Curves(args) => curves::run(&args),
        Command::Synth(args) => synth::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Simulate(args) => simulate::run(&args),
        Command::Compare(args) => simulate::compare(&args),
        Command::Space(args) => space::run(&args),
        Command::Check(CheckArgs { files }) => check(&files),
        Command::Schema { name } => schema(&name),
    }
}

/// Loads a Job or a JobBatch, whichever the file holds.
pub fn load_jobs(path: &Path) -> anyhow::Result<Vec<Job>> {
    Ok(load_batch(path)?.0)
}

/// A Job or a JobBatch, with the batch's `nowS` when it has one.
pub fn load_batch(path: &Path) -> anyhow::Result<(Vec<Job>, Option<f64>)> {
    let text = read_text(path)?;
    let kind = artifact::declared_kind(&text);
    if kind == Some(Kind::Job) {
        Ok((vec![parse_artifact::<Job>(path, &text)?], None))
    } else {
        let batch = parse_artifact::<JobBatch>(path, &text)?;
        Ok((batch.jobs, batch.now_s))
    }
}

fn check(files: &[PathBuf]) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    for path in files {
        let text = read_text(path)?;
        let Some(kind) = artifact::declared_kind(&text) else {
            // Let the Cluster parser explain what is wrong (missing kind, syntax).
            parse_artifact::<Cluster>(path, &text)?;
            bail!("{}: kind: not a rubick artifact kind", path.display());
        };
        match kind {
            Kind::Cluster => drop(parse_artifact::<Cluster>(path, &text)?),
            Kind::Job => drop(parse_artifact::<Job>(path, &text)?),
            Kind::JobBatch => drop(parse_artifact::<JobBatch>(path, &text)?),
            Kind::ModelSpec => drop(parse_artifact::<rubick_core::ModelSpec>(path, &text)?),
            Kind::PerfModel => drop(parse_artifact::<rubick_model::perf::PerfModel>(path, &text)?),
            Kind::Schedule => drop(parse_artifact::<rubick_core::schedule::Schedule>(path, &text)?),
            Kind::SimulationSummary => drop(parse_artifact::<rubick_core::simulation::SimulationSummary>(path, &text)?),
        }
        eprintln!("{}: valid {kind}", rubick_io::files::display(path));
    }
    Ok(Outcome::Done)
}

fn schema(name: &str) -> anyhow::Result<Outcome> {
    let file = format!("{name}.json");
    let schemas = rubick_model::schema::all_schemas();
    let (_, text) = schemas.iter().find(|(n, _)| *n == file).with_context(|| {
        let names: Vec<&str> = schemas.iter().map(|(n, _)| n.trim_end_matches(".json")).collect();
        format!("unknown schema `{name}` (expected one of: {})", names.join(", "))
    })?;
    rubick_io::write_output(Path::new("-"), rubick_io::Format::Json, text.as_bytes())?;
    Ok(Outcome::Done)
}

/// `--policy`: a name of [`rubick_policy::REGISTRY`], each listed with its summary.
pub fn policy_parser() -> impl clap::builder::TypedValueParser<Value = &'static rubick_policy::Registration> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(rubick_policy::REGISTRY.iter().map(|r| PossibleValue::new(r.name).help(r.summary)))
        .map(|name| rubick_policy::lookup(&name).unwrap_or(&rubick_policy::REGISTRY[0]))
}

/// `--queue`: fifo, las, srpt or service.
pub fn queue_parser() -> impl clap::builder::TypedValueParser<Value = rubick_policy::Queue> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let help = |q: rubick_policy::Queue| match q {
        rubick_policy::Queue::Fifo => "first come, first served (the paper's)",
        rubick_policy::Queue::Las => "least attained service (GPU-seconds so far; Tiresias)",
        rubick_policy::Queue::Srpt => "shortest remaining work (iterations left x predicted GPU-seconds each)",
        rubick_policy::Queue::Service => {
            "least attained service in two classes: a running job past the service quantum (`--service-quantum`) may be shrunk or paused for jobs below it"
        }
    };
    PossibleValuesParser::new(rubick_policy::Queue::ALL.map(|q| PossibleValue::new(q.as_str()).help(help(q))))
        .map(|name| name.parse().unwrap_or(rubick_policy::Queue::Fifo))
}

/// Loads the cluster of `--cluster`.
pub fn load_cluster(path: &Path) -> anyhow::Result<Cluster> {
    Ok(load_artifact::<Cluster>(path)?)
}

/// The plan spaces of one job on `gpus` GPUs, one per node group that can hold them.
pub fn job_spaces(job: &Job, cluster: &Cluster, gpus: u32, estimator: &MemoryEstimator) -> Vec<PlanSpace> {
    cluster
        .node_groups
        .iter()
        .filter(|g| job.request.gpu_type.as_ref().is_none_or(|t| *t == g.gpu_type))
        .filter(|g| g.total_gpus() >= gpus)
        .map(|g| PlanSpace::enumerate(&job.model, gpus, g, estimator, Dimensions::of(job.supports())))
        .collect()
}
