//! `rubick-plan synth`: a realistic synthetic cluster and job batch for benchmarks
//! and tests, deterministic in its seed.
//!
//! The jobs use the seven models of the Rubick evaluation (`data/jobs-paper.yaml`,
//! embedded): small models more often than large ones, requests around each model's
//! typical size, about half guaranteed (while the guarantees need at most 60 % of
//! the GPUs, as admission control would keep them), about a third already running (placed on the
//! cluster without overlap, with the best plan for their placement), restart costs
//! from one to seven minutes, and the resharding rules their frameworks allow.

use std::path::{Path, PathBuf};

use rubick_core::artifact::{ApiVersion, Kind, parse_yaml, to_yaml};
use rubick_core::job::{CurrentAllocation, Resharding};
use rubick_core::{Cluster, JobBatch, Placement, PlanRequest};
use rubick_io::cli::Outcome;
use rubick_io::files::write_atomic;
use rubick_model::belief::default_params;
use rubick_planner::curves::Evaluator;
use rubick_planner::place::nodes_of;
use rubick_planner::rng::SplitMix64;
use rubick_planner::{PlannerConfig, Restriction};

static PAPER_JOBS: &str = include_str!("../../data/jobs-paper.yaml");

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

/// The synthetic cluster: `gpus` GPUs as 8-GPU A800 nodes of the paper's testbed.
pub fn cluster(gpus: u32) -> Cluster {
    let mut c = Cluster::example();
    let nodes = gpus.div_ceil(8).max(1);
    c.name = format!("synth-{}gpu", nodes * 8);
    c.node_groups[0].count = nodes;
    c
}

/// The synthetic batch on `cluster`.
pub fn jobs(cluster: &Cluster, count: u32, seed: u64) -> anyhow::Result<JobBatch> {
    let templates: JobBatch = parse_yaml(PAPER_JOBS)?;
    let weights: Vec<(usize, f64)> = templates
        .jobs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (
                i,
                match t.model.name.as_str() {
                    "llama30" => 0.04,
                    "llama7" => 0.09,
                    "gpt2" => 0.12,
                    "t5" => 0.15,
                    _ => 0.2,
                },
            )
        })
        .collect();
    let mut rng = SplitMix64::new(seed ^ 0x5275_6269_636B);
    let group = &cluster.node_groups[0];
    let total = cluster.total_gpus();
    let config = PlannerConfig::default();
    let mut evaluator = Evaluator::new(cluster, &config);
    let mut nodes = nodes_of(cluster);
    let mut out = Vec::with_capacity(count as usize);
    let now = 3600.0;
    let mut guaranteed_gpus = 0;
    // Requests and running jobs take the node's fair share of cores per GPU.
    let fair = group.fair_cpus_per_gpu().min(12);
    for i in 0..count {
        let t = &templates.jobs[*rng.weighted(&weights)];
        let mut job = t.clone();
        job.name = format!("{}-{i:04}", t.model.name);
        let params = default_params(&job.model);
        // A request around the model's usual size, a power of two within a quarter of
        // the cluster, large enough for some plan to fit.
        let scale = [0.25, 0.5, 1.0, 1.0, 2.0][rng.below(5) as usize];
        let cap = (total / 4).max(1);
        let mut gpus = ((f64::from(t.request.gpus) * scale).max(1.0) as u32).next_power_of_two().min(cap);
        let fits = |g: u32, ev: &mut Evaluator<'_>| {
            Placement::packed(g, group.gpus_per_node)
                .and_then(|p| ev.best_plan(&job, &params, 0, &p, g * fair, Restriction::Any))
        };
        while fits(gpus, &mut evaluator).is_none() && gpus < cap {
            gpus *= 2;
        }
        let Some(placement) = Placement::packed(gpus, group.gpus_per_node) else { continue };
        let Some((plan, _)) = fits(gpus, &mut evaluator) else { continue };
        job.request.gpus = gpus;
        job.request.cpus = Some(fair * gpus);
        job.request.plan = match t.request.plan {
            Some(PlanRequest::Code(code)) if code.gpus().is_none() => Some(PlanRequest::Code(code)),
            _ => Some(PlanRequest::Exact(plan)),
        };
        if job.check().is_err() {
            job.request.plan = Some(PlanRequest::Exact(plan));
        }
        // Admission control keeps the guarantees within 60 % of the cluster's GPUs.
        job.guaranteed = rng.unit() < 0.5 && guaranteed_gpus + gpus <= total * 3 / 5;
        if job.guaranteed {
            guaranteed_gpus += gpus;
        }
        job.iterations = 200 + rng.below(20_000);
        job.submit_time_s = (rng.unit() * now).round();
        job.restart_cost_s = Some(60.0 + (rng.below(7) * 60) as f64);
        job.resharding = match rng.below(10) {
            0 => Resharding::None,
            1..=3 => Resharding::Full,
            _ => Resharding::DataParallel,
        };
        job.current = None;
        // About a third run already, where the cluster has room for their request.
        if rng.unit() < 0.35 {
            let mem = rubick_planner::curves::host_memory_gib(&config, group, &job.model, &plan);
            let mem_of = |part: u32| mem * f64::from(part) / f64::from(gpus);
            let mut chosen = Vec::new();
            for &part in placement.per_node() {
                if let Some(n) = (0..nodes.len())
                    .filter(|k| {
                        !chosen.contains(k)
                            && nodes[*k].free_gpus() >= part
                            && nodes[*k].cpus_free >= fair * part
                            && nodes[*k].mem_free >= mem_of(part)
                    })
                    .min_by_key(|&k| (nodes[k].free_gpus(), k))
                {
                    chosen.push(n);
                } else {
                    chosen.clear();
                    break;
                }
            }
            if chosen.len() == placement.per_node().len() {
                for (&k, &part) in chosen.iter().zip(placement.per_node()) {
                    let free: Vec<usize> = (0..nodes[k].gpu_free.len()).filter(|&g| nodes[k].gpu_free[g]).collect();
                    for &g in free.iter().take(part as usize) {
                        nodes[k].gpu_free[g] = false;
                    }
                    nodes[k].cpus_free -= fair * part;
                    nodes[k].mem_free -= mem_of(part);
                }
                job.current = Some(CurrentAllocation {
                    plan,
                    placement: placement.clone(),
                    nodes: chosen.iter().map(|&k| nodes[k].name(cluster)).collect(),
                    cpus: Some(fair * gpus),
                    rounds_since_change: rng.below(8) as u32,
                    restarts: 0,
                    restoring: false,
                });
            }
        }
        out.push(job);
    }
    out.sort_by(|a, b| a.submit_time_s.total_cmp(&b.submit_time_s).then(a.name.cmp(&b.name)));
    Ok(JobBatch { api_version: Some(ApiVersion::CURRENT), kind: Some(Kind::JobBatch), jobs: out, now_s: None })
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

/// A synthetic round ready to plan: the cluster and the jobs' planner inputs (with
/// the FLOPs-based default performance models).
pub fn instance(
    gpus: u32,
    count: u32,
    seed: u64,
    config: &PlannerConfig,
) -> anyhow::Result<(Cluster, Vec<rubick_planner::JobInput>)> {
    let cluster = cluster(gpus);
    let batch = jobs(&cluster, count, seed)?;
    let jobs = crate::round::on_priors(batch.jobs);
    let inputs = crate::round::job_inputs(Path::new("<synthetic>"), jobs, &cluster, config, None)?;
    Ok((cluster, inputs))
}
