//! `rubick-plan trace`: a real cluster's job log as a trace that `simulate --trace`
//! replays; the reading and mapping are [`rubick_sim::logs`]'s.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use rubick_io::cli::{Outcome, ensure_not_an_input};
use rubick_io::files::{display, read_text};
use rubick_io::flags;
use rubick_io::reference::{ReferenceData, locate};
use rubick_sim::logs::{Window, map_jobs, read_philly, read_sacct, to_csv};

pub use rubick_sim::logs::MAPPING;

/// Where the job log comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The Philly trace's CSV: timestamp,duration,num_gpus,gpu_time,cluster
    Philly,
    /// `sacct -P` output with a header (JobID, Submit, Elapsed or ElapsedRaw, AllocTRES)
    Sacct,
}

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// The job log, `-` for stdin
    pub input: PathBuf,
    /// What the job log is
    #[arg(long, value_enum)]
    pub format: Format,
    /// The cluster the trace is for: its size caps a job's GPUs, and a job's plan must
    /// fit its nodes
    #[arg(long)]
    pub cluster: PathBuf,
    /// The authors' reference data (its models are what jobs are mapped to); default:
    /// `shared/reference/rubick-artifact` in a parent directory, or $RUBICK_REFERENCE
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Seed of the mapping: the same seed gives the same trace
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Only jobs of this virtual cluster (Philly's `cluster` column)
    #[arg(long)]
    pub virtual_cluster: Option<String>,
    /// Only jobs submitted at least this many seconds after the log's first job
    #[arg(long, default_value_t = 0.0, value_parser = flags::clock_seconds, allow_hyphen_values = true)]
    pub from_s: f64,
    /// Only jobs submitted before this many seconds after the log's first job
    #[arg(long, value_parser = flags::clock_seconds, allow_hyphen_values = true)]
    pub to_s: Option<f64>,
    /// At most this many jobs (the first ones submitted, after the window)
    #[arg(long)]
    pub limit: Option<usize>,
    /// Share of jobs that ask for a throughput guarantee (0 to 1)
    #[arg(long, default_value_t = 0.0, value_parser = flags::share, allow_hyphen_values = true)]
    pub guaranteed_share: f64,
    /// Output trace (CSV), `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

pub fn run(args: &TraceArgs) -> anyhow::Result<Outcome> {
    if let Some(to) = args.to_s {
        anyhow::ensure!(to > args.from_s, "--to-s: expected a number above --from-s ({}), got {to}", args.from_s);
    }
    ensure_not_an_input(&args.output, &[&args.input, &args.cluster])?;
    let cluster = crate::load_cluster(&args.cluster)?;
    let dir = match &args.reference {
        Some(dir) => dir.clone(),
        None => locate(&std::env::current_dir()?).with_context(|| {
            format!(
                "--reference: not given, and no shared/reference/rubick-artifact in a parent directory; {}",
                rubick_io::reference::WHERE_IT_IS
            )
        })?,
    };
    let reference = ReferenceData::open(&dir)?;
    // A log under a reference directory that is not there: say where such data comes
    // from (Philly's trace is one of the reference sets).
    if !args.input.exists() && args.input.to_string_lossy().contains("reference/") {
        anyhow::bail!("{}: no such file; {}", display(&args.input), rubick_io::reference::WHERE_IT_IS);
    }
    let text = read_text(&args.input)?;
    let path = display(&args.input);
    let (mut jobs, left) = match args.format {
        Format::Philly => read_philly(&path, &text)?,
        Format::Sacct => read_sacct(&path, &text)?,
    };
    let read = jobs.len();
    let window =
        Window { group: args.virtual_cluster.clone(), from_s: args.from_s, to_s: args.to_s, limit: args.limit };
    window.select(&mut jobs);
    anyhow::ensure!(!jobs.is_empty(), "{path}: no job left after the selection ({read} read)");
    let prefix = match args.format {
        Format::Philly => "philly",
        Format::Sacct => "slurm",
    };
    let rows = map_jobs(&path, &jobs, prefix, &cluster, &reference, args.seed, args.guaranteed_share)?;
    let capped = rows.iter().zip(&jobs).filter(|(r, j)| r.num_gpus < j.gpus).count();
    for (why, n) in &left {
        tracing::info!("{path}: {n} job(s) left out: {why}");
    }
    if capped > 0 {
        tracing::info!("{capped} job(s) got fewer GPUs than they used (the cluster's size, or no plan on their count)");
    }
    let mut by_model: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &rows {
        *by_model.entry(r.application.as_str()).or_default() += 1;
    }
    tracing::info!(
        "{} jobs from {path} ({read} read): {}",
        rows.len(),
        by_model.iter().map(|(m, n)| format!("{m} {n}")).collect::<Vec<_>>().join(", ")
    );
    rubick_io::write_output(&args.output, rubick_io::Format::Csv, to_csv(&rows).as_bytes())?;
    Ok(Outcome::Done)
}
