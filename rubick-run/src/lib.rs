//! # rubick-run: launch and reconfigure training runs from a schedule
//!
//! Today: `check` validates `Schedule` files. Reconciling a schedule with running jobs
//! (`apply`) on the local, Slurm and Kubernetes backends comes with its issue.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rubick_core::schedule::Schedule;
use rubick_io::cli::{LogArgs, Outcome};

const EXAMPLES: &str = "\
Examples:
  # Validate the schedule a round produced before applying it
  rubick-run check schedule.yaml";

/// Launch and reconfigure training runs so that they follow a rubick schedule:
/// locally, on Slurm or on Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "rubick-run", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate Schedule files (YAML); exit 2 naming the first bad file and field
    Check {
        /// Schedule files, `-` for stdin
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check { files } => rubick_io::cli::check_command::<Schedule>(&files),
    }
}
