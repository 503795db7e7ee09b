//! A realistic synthetic cluster and job batch for benchmarks and tests, deterministic
//! in its seed (`rubick-plan synth` writes them).
//!
//! The jobs use the seven models of the Rubick evaluation (`data/jobs-paper.yaml`,
//! embedded): small models more often than large ones, requests around each model's
//! typical size, about half guaranteed (while the guarantees need at most 60 % of
//! the GPUs, as admission control would keep them), about a third already running (placed on the
//! cluster without overlap, with the best plan for their placement), restart costs
//! from one to seven minutes, and the resharding rules their frameworks allow.

use rubick_core::ArtifactError;
use rubick_core::artifact::{ApiVersion, Kind, parse_yaml};
use rubick_core::error::ValidationError;
use rubick_core::job::{CurrentAllocation, Resharding};
use rubick_core::schedule::Schedule;
use rubick_core::{Cluster, Job, JobBatch, Placement, PlanRequest};
use rubick_model::belief::{Belief, default_params};

use crate::curves::{Evaluator, host_memory_gib};
use crate::place::nodes_of;
use crate::rng::SplitMix64;
use crate::{JobInput, PlannerConfig, Restriction, current_of_assignment, current_of_job};

static PAPER_JOBS: &str = include_str!("../../data/jobs-paper.yaml");

/// Why a synthetic instance could not be made: the embedded templates did not parse, or
/// a job's `current` does not fit the cluster (neither happens; a test says so).
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("the embedded job templates: {0}")]
    Templates(#[from] ArtifactError),
    #[error("{0}")]
    Job(#[from] ValidationError),
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
pub fn jobs(cluster: &Cluster, count: u32, seed: u64) -> Result<JobBatch, SynthError> {
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
            let mem = host_memory_gib(&config, group, &job.model, &plan);
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

/// A synthetic round ready to plan: the cluster and the jobs' planner inputs, each
/// believed as its model's FLOPs-based default ([`Belief::prior`]), running where its
/// `current` says.
pub fn instance(
    gpus: u32,
    count: u32,
    seed: u64,
    config: &PlannerConfig,
) -> Result<(Cluster, Vec<JobInput>), SynthError> {
    let cluster = cluster(gpus);
    let batch = jobs(&cluster, count, seed)?;
    let inputs = inputs_of(&cluster, batch.jobs, config)?;
    Ok((cluster, inputs))
}

/// A small varied round for property tests: `nodes` nodes of `per_node` GPUs with
/// `cores` cores and `mem` GiB of host memory each, and `jobs` synthetic jobs (some
/// running, some guaranteed, some locked), planned at one hour.
pub fn varied(
    seed: u64,
    nodes: u32,
    per_node: u32,
    cores: u32,
    mem: f64,
    jobs: u32,
) -> (Cluster, Vec<JobInput>, PlannerConfig) {
    let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
    let mut cluster = cluster(nodes * 8);
    let g = &mut cluster.node_groups[0];
    g.gpus_per_node = per_node;
    g.cpu_cores = cores;
    g.host_memory_gib = mem;
    let batch = self::jobs(&cluster, jobs, seed).expect("synthetic jobs");
    let inputs = inputs_of(&cluster, batch.jobs, &config).expect("inputs");
    (cluster, inputs, config)
}

/// The planner's inputs of synthetic jobs on `cluster`: each believed as its model's
/// FLOPs-based default ([`Belief::prior`]), running where its `current` says.
fn inputs_of(cluster: &Cluster, jobs: Vec<Job>, config: &PlannerConfig) -> Result<Vec<JobInput>, SynthError> {
    let mut inputs = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.into_iter().enumerate() {
        let current = current_of_job(&job, cluster, config).map_err(|e| e.within(&format!("jobs[{i}]")))?;
        let belief = Belief::prior(&job.model);
        inputs.push(JobInput::at(job, belief, current));
    }
    Ok(inputs)
}

/// The next round's inputs: the same jobs and beliefs, each running where `schedule`
/// (the round planned for `inputs`, one assignment per input in order) put it.
pub fn next_round(cluster: &Cluster, inputs: &[JobInput], schedule: &Schedule) -> Result<Vec<JobInput>, SynthError> {
    let mut next = Vec::with_capacity(inputs.len());
    for (k, (input, a)) in inputs.iter().zip(&schedule.assignments).enumerate() {
        let current = current_of_assignment(a, cluster).map_err(|e| e.within(&format!("assignments[{k}]")))?;
        next.push(JobInput::at(Job::clone(&input.job), input.belief.clone(), current));
    }
    Ok(next)
}
