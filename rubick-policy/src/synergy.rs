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

use rubick_core::{Cluster, Placement, Plan};
use rubick_model::throughput;
use rubick_planner::JobInput;
use rubick_planner::curves::Evaluator;

use super::queue::QueuePolicy;
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Synergy-TUNE (OSDI 2022): the user's plan and GPUs with backfilling; cores by sensitivity, peers to fair share";

/// The core counts to try: the sensitivity-optimal demand, then the fair share when the
/// demand is above it (Synergy's `_make_fair_share`).
pub(super) fn cores(
    evaluator: &Evaluator<'_>,
    job: &JobInput,
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
    let thr = |c: u32| throughput::samples_per_s(&job.job.model, &job.belief.params, g, plan, placement, c, cpu_ref);
    let best = levels.iter().map(|&c| thr(c)).fold(0.0, f64::max);
    let Some(demand) = levels.iter().copied().find(|&c| thr(c) >= best * 0.99) else { return vec![fair * gpus] };
    if demand > fair * gpus { vec![demand, fair * gpus] } else { vec![demand] }
}

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { cores, tune: true, ..QueuePolicy::new(cluster, options) })
}

#[cfg(test)]
mod tests {
    use crate::{PolicyOptions, View, example, lookup, running};
    use rubick_core::{Cluster, PlanCode};

    /// Where cores bind (one node of 8 GPUs and 48 cores), an offloading job first gets
    /// twice the fair share, and a job arriving later takes it back down to the fair
    /// share (TUNE's peer adjustment) instead of waiting: what static-backfill, which
    /// gives the request, never does.
    #[test]
    fn tune_brings_a_peer_down_to_the_fair_share_where_cores_bind() {
        let mut cluster = Cluster::example();
        cluster.node_groups[0].count = 1;
        cluster.node_groups[0].cpu_cores = 48;
        let options = PolicyOptions {
            queue: crate::Queue::Fifo,
            planner: rubick_planner::PlannerConfig { profiled_cpus_per_gpu: Some(4), ..Default::default() },
            milp_time_limit: std::time::Duration::from_secs(1),
        };
        let offload = example("offload", PlanCode::ZeroOffload, 4, 24);
        let mut later = example("later", PlanCode::ZeroDp, 4, 24);
        std::sync::Arc::make_mut(&mut later.job).submit_time_s = 60.0;
        let mut policy = lookup("synergy").unwrap().build(&cluster, &options);
        let jobs = [offload.clone()];
        let first = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 0.0, configs: None }, 0);
        let first = first[0].clone().expect("it starts");
        assert_eq!(first.cpus, 48, "the offloading job's demand: twice the fair share");
        let jobs = [running(&offload, &first, false), later];
        let next = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 60.0, configs: None }, 1);
        let cores: Vec<Option<u32>> = next.iter().map(|c| c.as_ref().map(|c| c.cpus)).collect();
        assert_eq!(cores[0], Some(24), "the peer at the fair share");
        assert!(cores[1].is_some_and(|c| c <= 24), "the newcomer placed at its demand: {cores:?}");
        // Static-backfill gives each its request: both fit from the start.
        let mut backfill = lookup("static-backfill").unwrap().build(&cluster, &options);
        let jobs = [offload.clone()];
        let out = backfill.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 0.0, configs: None }, 0);
        assert_eq!(out[0].as_ref().map(|c| c.cpus), Some(24));
    }
}
