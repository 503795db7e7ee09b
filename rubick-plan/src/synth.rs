//! `rubick-plan synth`: writes `rubick_planner::synth`'s cluster and job batch.

use std::path::{Path, PathBuf};

use rubick_core::artifact::to_yaml;
use rubick_io::cli::Outcome;
use rubick_io::files::write_atomic;
use rubick_planner::synth::{cluster, jobs};

#[derive(Debug, clap::Args)]
pub struct SynthArgs {
    /// GPUs of the cluster (8 per node; rounded up to whole nodes)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=rubick_core::limits::MAX_GPUS as i64), allow_hyphen_values = true)]
    pub gpus: u32,
    /// Jobs in the batch (at most a million)
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000), allow_hyphen_values = true)]
    pub jobs: u32,
    /// Seed of the generator: the same seed gives the same cluster and batch
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for cluster.yaml and jobs.yaml (created)
    #[arg(long)]
    pub out_dir: PathBuf,
}

pub fn run(args: &SynthArgs) -> anyhow::Result<Outcome> {
    let cluster = cluster(args.gpus);
    let batch = jobs(&cluster, args.jobs, args.seed)?;
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| anyhow::anyhow!("{}: cannot create the directory: {e}", args.out_dir.display()))?;
    write_atomic(&Path::new(&args.out_dir).join("cluster.yaml"), to_yaml(&cluster).as_bytes())?;
    write_atomic(&Path::new(&args.out_dir).join("jobs.yaml"), to_yaml(&batch).as_bytes())?;
    tracing::info!("wrote {} jobs on {} GPUs to {}", batch.jobs.len(), cluster.total_gpus(), args.out_dir.display());
    Ok(Outcome::Done)
}
