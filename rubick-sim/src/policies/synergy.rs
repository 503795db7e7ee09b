//! `synergy`: Synergy (Mohan et al., OSDI 2022). The user's plan and GPUs, the queue
//! with backfilling, and CPU cores by the job's sensitivity to them: the fewest cores
//! per GPU (of the base level, the node's fair share and twice it) within 1 % of the
//! best predicted throughput; when that does not fit, the most it can place, down to
//! the least. Never the request's own count unless that is one of its levels.

use rubick_core::planner::curves::Evaluator;
use rubick_core::{Cluster, Placement, Plan};

use super::queue::QueuePolicy;
use super::{Policy, PolicyJob, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Synergy (OSDI 2022): the user's plan and GPUs with backfilling; cores by the job's sensitivity";

/// The core counts to try: the sensitivity-optimal level, then the others from the most.
pub(super) fn cores(
    evaluator: &Evaluator<'_>,
    job: &PolicyJob<'_>,
    plan: &Plan,
    (group, placement): (usize, &Placement),
    fair: u32,
) -> Vec<u32> {
    let g = &evaluator.cluster.node_groups[group];
    let (gpus, widest) = (placement.gpus(), placement.max_per_node().max(1));
    let mut levels: Vec<u32> = [evaluator.config.base_cpus_per_gpu(g), fair, fair * 2]
        .into_iter()
        .filter(|l| l * widest <= g.cpu_cores)
        .map(|l| l * gpus)
        .collect();
    levels.sort_unstable();
    levels.dedup();
    let cpu_ref = evaluator.config.cpu_reference(g);
    let thr = |c: u32| Evaluator::throughput(&job.job.model, job.params, g, plan, placement, c, cpu_ref);
    let best = levels.iter().map(|&c| thr(c)).fold(0.0, f64::max);
    let (mut ok, rest): (Vec<u32>, Vec<u32>) = levels.into_iter().partition(|&c| thr(c) >= best * 0.99);
    ok.truncate(1);
    ok.extend(rest.into_iter().rev());
    ok
}

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { cores, ..QueuePolicy::new(cluster, options) })
}
