//! # rubick-fit: a job's performance model, fitted from a few profiling runs
//!
//! Today: `check` validates `PerfModel` files. Fitting (`fit`), prediction
//! (`predict`) and evaluation against the reference data (`evaluate`) come with the
//! rubick-fit issue; the model's artifact type lives in `rubick_core::perf`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rubick_core::perf::PerfModel;
use rubick_io::cli::{LogArgs, Outcome, ensure_one_stdin};

const EXAMPLES: &str = "\
Examples:
  # Validate a fitted model before a scheduling round uses it
  rubick-fit check models/llama7.yaml

  # From a pipeline
  cat models/llama7.yaml | rubick-fit check -";

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
    /// Validate PerfModel files (YAML); exit 2 naming the first bad file and field
    Check {
        /// PerfModel files, `-` for stdin
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check { files } => {
            ensure_one_stdin(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
            rubick_io::check_artifacts::<PerfModel>(&files)?;
            Ok(Outcome::Done)
        }
    }
}
