//! # rubick-fit: a job's performance model, fitted from a few profiling runs
//!
//! * `fit` — fit the model form `rubick-whitebox/3` (in `rubick_model::perfmodel`) to a
//!   profile table and write a `PerfModel`;
//! * `predict` — iteration time (with a ~95 % interval) of configurations;
//! * `evaluate` — against measured tables (the authors', a job's own, or others'
//!   published ones): profile K rows chosen by the selection rule (or use the authors'
//!   own profiling runs), predict the rest, report error and plan-choice regret;
//! * `check` — validate `PerfModel` files.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rubick_core::{Placement, Plan};
use rubick_io::cli::{CheckArgs, Common, LogArgs, Outcome};
use rubick_model::perf::PerfModel;

pub mod evaluate;
mod fit;
pub mod plot;
mod predict;
mod select;

pub use evaluate::evaluate_external;
pub use fit::{perf_model_artifact, profile_observations};
pub use predict::params_of;

const EXAMPLES: &str = "\
Examples:
  C=data/cluster-a800-8x8.yaml R=../shared/reference/rubick-artifact

  # How good is the model? Profile 8 rows per model of the authors' data,
  # predict the rest (one screen; every figure: --all or --summary FILE)
  rubick-fit evaluate --reference $R --model all --cluster $C --samples 8 \\
      --summary summary.yaml --plot fit.svg

  # Fit a job's model from its profile table
  rubick-fit fit profile.csv --job job.yaml --cluster $C -o model.yaml

  # Predict a configuration
  rubick-fit predict model.yaml --cluster $C --plan dp8-mb1-ga1-z2 \\
      --placement 44

  # Which 8 configurations should the profile run? (the rule that
  # `rubick-profile run --budget` uses)
  rubick-fit select --job job.yaml --cluster local.yaml --budget 8 -o chosen.csv
  rubick-fit select --job job.yaml --cluster local.yaml --budget 4 \\
      --from candidates.csv

  # Judge the model on a job's own measured table, or on others' published
  # measurements
  rubick-fit evaluate --table measured.csv --job job.yaml --cluster local.yaml \\
      --samples 4
  rubick-fit evaluate --samples 8 \\
      --external ../shared/reference/external/vtrain_single.csv

  # Validate a fitted model
  rubick-fit check model.yaml";

/// Fit the performance model of a training job: iteration time across execution plans
/// and placements, from a few profiled runs (Rubick, arXiv 2408.08586).
#[derive(Debug, Parser)]
#[command(name = "rubick-fit", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fit a job's model from a profile table (CSV or Parquet) into a PerfModel
    Fit {
        /// Profile table (columns of the `profile` table schema), `-` for stdin (CSV)
        profile: PathBuf,
        /// The Job the profile measured (YAML)
        #[arg(long)]
        job: PathBuf,
        /// The Cluster the profile ran on (YAML): its links (NVLink, network, PCIe) and
        /// GPU type (a profile taken on another GPU type is refused)
        #[arg(long)]
        cluster: PathBuf,
        /// Output PerfModel, `-` for stdout
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Predict iteration times of configurations with a fitted PerfModel
    Predict {
        /// The fitted PerfModel (YAML), as `fit` writes it
        model: PathBuf,
        /// The Cluster to predict on (YAML): its links decide the communication terms,
        /// and a placement it cannot hold is refused
        #[arg(long)]
        cluster: PathBuf,
        /// A plan (dp4-tp2-pp1-mb2-ga1); with --placement
        #[arg(long, requires = "placement")]
        plan: Option<Plan>,
        /// GPUs per node, e.g. 44
        #[arg(long, requires = "plan")]
        placement: Option<Placement>,
        /// A table of configurations (columns `plan`, `placement`), instead of one
        #[arg(long, conflicts_with = "plan")]
        table: Option<PathBuf>,
        /// Predictions as CSV (plan, placement, iter_time_s with its ~95 % interval
        /// low_s / high_s, samples_per_s), `-` for stdout
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Evaluate the model against measured tables: the authors', a job's, or others'
    /// published measurements
    Evaluate(EvaluateArgs),
    /// Choose which configurations to profile: K that identify the model's terms,
    /// covering every dimension the planner varies (families, GPU counts, TP / PP / DP,
    /// micro-batch and accumulation); the rule `rubick-profile run --budget` uses
    Select(SelectArgs),
    /// Validate PerfModel files (YAML); exit 2 naming the first bad file and field
    #[command(mut_arg("files", |files| files.help("PerfModel files, `-` for stdin")))]
    Check(CheckArgs),
    #[command(flatten)]
    Common(Common),
}

/// Which measured rows `evaluate` judges the model on: exactly one source.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct EvaluateSource {
    /// The authors' reference directory (rubick-artifact); with --cluster
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// A measured table of one job (the `profile` table's columns: plan, placement,
    /// iter_time_s, status); with --job and --cluster
    #[arg(long, requires_all = ["job", "cluster"])]
    pub table: Option<PathBuf>,
    /// Others' published measurements (vTrain, Sailor or Calculon CSV tables of
    /// shared/reference/external/): each row's job and cluster come from the table;
    /// repeat for several tables
    #[arg(long, num_args = 1..)]
    pub external: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    #[command(flatten)]
    pub source: EvaluateSource,
    /// With --reference: a model of models.yaml, or `all`
    #[arg(long, default_value = "all")]
    pub model: String,
    /// The Job the --table measured (YAML)
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// The cluster the rows were measured on (--reference, --table)
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Rows to "profile" per job, chosen by the selection rule (at most all but one)
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
    /// Fit from the authors' own profiling runs (profiles/<model>/) instead
    #[arg(long, requires = "reference")]
    pub from_profiles: bool,
    /// SUMMARY.yaml to write: every job's and family's figures and fitted parameters
    /// (`-`: on stdout, as --all). Without it or --all, stdout gets a one-screen summary
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Print the full summary (YAML, every job, family and fitted parameter) on stdout
    /// instead of the one-screen summary
    #[arg(long)]
    pub all: bool,
    /// Every row with its prediction (CSV or Parquet)
    #[arg(long)]
    pub rows: Option<PathBuf>,
    /// Predicted vs measured, log-log, one colour per plan family (PNG or SVG)
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the fitted PerfModel of the (single) job here, `-` for stdout
    #[arg(long)]
    pub model_out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct SelectArgs {
    /// The Job to profile (YAML)
    #[arg(long)]
    pub job: PathBuf,
    /// The cluster it will be profiled on (one node of its largest group)
    #[arg(long)]
    pub cluster: PathBuf,
    /// How many configurations to choose
    #[arg(long)]
    pub budget: usize,
    /// Choose among these configurations (CSV or Parquet with columns `plan` and
    /// `placement`; other columns, measured times included, are never read) instead of
    /// the job's plan space on one node
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// The chosen configurations (`plan,placement` CSV, as `rubick-profile run
    /// --configs` reads), in the order chosen; `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Common(common) => common.run::<Cli>(),
        Command::Select(args) => select::run(&args),
        Command::Check(CheckArgs { files }) => rubick_io::cli::check_command::<PerfModel>(&files),
        Command::Evaluate(args) => evaluate::run(&args),
        Command::Fit { profile, job, cluster, output } => fit::run(&profile, &job, &cluster, &output),
        Command::Predict { model, cluster, plan, placement, table, output } => {
            predict::run(&model, &cluster, plan.zip(placement), table.as_deref(), &output)
        }
    }
}
