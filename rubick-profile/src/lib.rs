//! # rubick-profile: measure a job under a few plans
//!
//! * `devices` — this machine's GPUs through NVML (or its CPU when there is no
//!   driver), and a `Cluster` of it for `run`;
//! * `run` — measure the job's configurations through its `launch` section (the job
//!   contract of `rubick_core::launch`, executed by `rubick-launch`), locally, on
//!   Slurm or on Kubernetes, into a profile table that `rubick-fit fit` reads;
//! * `compare` — the CI gate: per configuration, the throughput change of two
//!   profiles with its noise; exit 1 on a regression beyond threshold and noise.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rubick_io::cli::{Common, LogArgs, Outcome};

pub mod compare;
pub mod devices;
pub mod run;

const EXAMPLES: &str = "\
Examples:
  # What would a profile run on? Write a Cluster of this machine
  rubick-profile devices --cluster-out local.yaml

  # Measure the PyTorch reference workload under 8 configurations chosen
  # from its plan space
  PATH=$(scripts/python-env.sh)/bin:$PATH \\
    rubick-profile run examples/pytorch/job.yaml --cluster local.yaml \\
      --budget 8 -o profile.csv

  # Given configurations, three runs each, through Slurm
  rubick-profile run job.yaml --cluster cluster.yaml --configs configs.csv \\
      --repeat 3 --backend slurm -o profile.parquet

  # Then fit the job's performance model
  rubick-fit fit profile.csv --job examples/pytorch/job.yaml \\
      --cluster local.yaml -o model.yaml

  # CI gate: fail when a configuration got more than 5% slower beyond the noise
  rubick-profile compare baseline.csv profile.csv --max-regression 5% \\
      --format junit > report.xml";

/// Measure a training job under a few execution plans (on GPUs through NVML, or on the
/// CPU), to fit its performance model with rubick-fit, or to gate a CI run on its speed.
#[derive(Debug, Parser)]
#[command(name = "rubick-profile", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// This machine's GPUs (NVML) or, without a driver, its CPU, as YAML on stdout
    Devices {
        /// Also write a Cluster of this machine here (`-` for stdout instead of the listing)
        #[arg(long)]
        cluster_out: Option<PathBuf>,
    },
    /// Run the job's configurations and write the profile table
    ///
    /// Every run is the job's `launch` section with the configuration's placeholders
    /// and RUBICK_* variables; its metric lines give the iteration times (after
    /// `warmupIterations`, at most `measuredIterations`). A run that runs out of memory
    /// is recorded as `oom` (an infeasible configuration); one that overruns
    /// `timeoutS` is killed with its whole process group and recorded as `timeout`.
    /// The table is rewritten atomically after every run: a profile killed at any
    /// moment keeps its finished rows, its runs' processes die with it, and running
    /// the same command again measures only what is missing. Exit 1 when a run failed
    /// or timed out (the table still records it).
    Run(run::RunArgs),
    /// Compare two profiles per configuration (the CI benchmarking gate)
    ///
    /// For each configuration: median throughput of each side with its spread, the
    /// change, and a one-sided Welch t-test on iteration times. A side's sample is its
    /// repetitions' iteration times when it has two or more measured runs (`run
    /// --repeat`), else its one run's measured iterations (mean, standard deviation
    /// and count). Exit 1 only when a configuration's median throughput fell by more
    /// than --max-regression AND the slowdown is significant (p < --alpha), or when a
    /// configuration measured in the baseline no longer does (oom, failed, timeout);
    /// exit 0 otherwise.
    Compare(compare::CompareArgs),
    #[command(flatten)]
    Common(Common),
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Common(common) => common.run::<Cli>(),
        Command::Devices { cluster_out } => {
            let machine = devices::machine()?;
            match &machine.no_gpu_reason {
                Some(reason) => {
                    tracing::warn!("{reason}; the CPU: {} ({} cores)", machine.cpu_model, machine.cpu_cores)
                }
                None => tracing::info!("{} GPU(s)", machine.gpus.len()),
            }
            let listing = serde_yaml_ng::to_string(&machine)?;
            match cluster_out {
                Some(path) => {
                    let cluster = devices::local_cluster(&machine);
                    let yaml = rubick_core::artifact::to_yaml(&cluster);
                    if !rubick_io::files::is_std(&path) {
                        rubick_io::write_output(
                            std::path::Path::new("-"),
                            rubick_io::Format::Yaml,
                            listing.as_bytes(),
                        )?;
                    }
                    rubick_io::write_output(&path, rubick_io::Format::Yaml, yaml.as_bytes())?;
                }
                None => {
                    rubick_io::write_output(std::path::Path::new("-"), rubick_io::Format::Yaml, listing.as_bytes())?
                }
            }
            Ok(Outcome::Done)
        }
        Command::Run(args) => run::run(&args),
        Command::Compare(args) => compare::run(&args),
    }
}
