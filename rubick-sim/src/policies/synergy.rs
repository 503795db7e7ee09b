//! `synergy`: Synergy-TUNE (Mohan et al., OSDI 2022), from its artifact
//! (`msr-fiddle/synergy`, `simulator/resources/cluster.py`: `allocate_synergy_tune`,
//! `_tune`, `_make_fair_share`, `_reallocate_peer`). The user's plan and GPUs (the GPU
//! count is never a decision), the queue with backfilling, and CPU cores by the job's
//! sensitivity to them:
//!
//! 1. its demand: the fewest cores per GPU (of the base level, the node's fair share
//!    and twice it) within 1 % of its best predicted throughput;
//! 2. when that does not fit and is above the fair share: the fair share;
//! 3. when that does not fit either: running jobs of the group holding more than the
//!    fair share are brought down to it (single-node jobs first, the most cores per GPU
//!    first; each restarts with its new cores), until the job fits.
//!
//! Left out: host memory as a sensitivity (this project's jobs gain nothing from more
//! page cache; memory is what the plan needs), Synergy's optimal LP variant
//! (`Synergy-OPT`, which its paper finds impractical), and its 300 s leases (every
//! policy runs under the simulator's rounds). Where neither cores nor memory bind,
//! Synergy is static-backfill: on the paper's testbed (12 cores per GPU) with the
//! authors' trace the two give the same figures; on the CPU-tight testbed (6 per GPU)
//! offloading jobs get 12 and the others give them up.

use rubick_core::planner::curves::Evaluator;
use rubick_core::{Cluster, Placement, Plan};

use super::queue::QueuePolicy;
use super::{Policy, PolicyJob, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Synergy-TUNE (OSDI 2022): the user's plan and GPUs with backfilling; cores by sensitivity, peers to fair share";

/// The core counts to try: the sensitivity-optimal demand, then the fair share when the
/// demand is above it (Synergy's `_make_fair_share`).
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
    let Some(demand) = levels.iter().copied().find(|&c| thr(c) >= best * 0.99) else { return vec![fair * gpus] };
    if demand > fair * gpus { vec![demand, fair * gpus] } else { vec![demand] }
}

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { cores, tune: true, ..QueuePolicy::new(cluster, options) })
}
