//! Which configurations to profile: the K that best identify the model's parameters.
//!
//! Shared by `rubick-fit evaluate` (choosing which reference rows to "profile") and
//! `rubick-profile` (choosing what to run). The rule looks only at plans and
//! placements, never at measured times:
//!
//! 1. one configuration of every plan family first (compute, checkpointing, ZeRO,
//!    offload and 3-D parameters each need one), starting from the largest
//!    single-node configuration;
//! 2. then farthest-point selection in a feature space of plan family, log GPUs,
//!    log nodes, multi-node, log TP / PP / DP, the smallest per-node GPU count, and
//!    log accumulation, so that the extremes (1 GPU, many nodes, thin nodes, the
//!    smallest and largest micro-batch) are covered: the micro-batch is what identifies
//!    the fixed cost per micro-batch step, and the planner varies it. The micro-batch
//!    itself is no coordinate: at a job's global batch it follows from DP and
//!    accumulation, and a second copy of that axis outweighed the nodes (authors' rows,
//!    K = 8: 15.6 % pooled with it, 14.8 % without; external sets 10.1 % and 10.2 %).
//!
//! Ties go to the earlier candidate, so the selection is deterministic for a given
//! candidate order.

use crate::memory::MemoryEstimator;
use crate::space::{Dimensions, PlanSpace};
use rubick_core::cluster::NodeGroup;
use rubick_core::job::Job;
use rubick_core::placement::Placement;
use rubick_core::plan::{Plan, PlanFamily};

/// A configuration that could be profiled.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub plan: Plan,
    pub placement: Placement,
}

fn family_index(f: PlanFamily) -> usize {
    PlanFamily::ALL.iter().position(|x| *x == f).unwrap_or(0)
}

fn features(c: &Candidate) -> Vec<f64> {
    let lg = |x: u32| f64::from(x.max(1)).log2() / 3.0;
    let mut v = vec![0.0; PlanFamily::ALL.len()];
    v[family_index(c.plan.family())] = 1.5;
    v.extend([
        lg(c.placement.gpus()),
        lg(c.placement.nodes()),
        if c.placement.is_multi_node() { 1.0 } else { 0.0 },
        lg(c.plan.tp),
        lg(c.plan.pp),
        lg(c.plan.dp),
        lg(c.placement.min_per_node()),
        lg(c.plan.ga),
    ]);
    v
}

fn distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt()
}

/// What a profile can run: every valid, memory-feasible plan of the job's plan space on
/// 1 to `gpusPerNode` GPUs of one node of `group` (packed) that its script supports
/// (`launch.supports`), in the plan space's order.
pub fn one_node_candidates(job: &Job, group: &NodeGroup, estimator: &MemoryEstimator) -> Vec<Candidate> {
    (1..=group.gpus_per_node)
        .flat_map(|gpus| {
            let placement = Placement::packed(gpus, group.gpus_per_node);
            PlanSpace::enumerate(&job.model, gpus, group, estimator, Dimensions::of(job.supports()))
                .plans
                .into_iter()
                .filter(|e| job.can_run(&e.plan))
                .filter_map(move |e| placement.clone().map(|placement| Candidate { plan: e.plan, placement }))
        })
        .collect()
}

/// Indices of the `k` candidates to profile, in the order they were chosen.
pub fn select(candidates: &[Candidate], k: usize) -> Vec<usize> {
    let k = k.min(candidates.len());
    if k == 0 {
        return Vec::new();
    }
    let feats: Vec<Vec<f64>> = candidates.iter().map(features).collect();
    let first = (0..candidates.len())
        .max_by(|&a, &b| {
            let key = |i: usize| {
                let c = &candidates[i];
                (!c.placement.is_multi_node(), c.placement.gpus(), std::cmp::Reverse(i))
            };
            key(a).cmp(&key(b))
        })
        .unwrap_or(0);
    let mut chosen = vec![first];
    let mut seen_families = vec![candidates[first].plan.family()];
    while chosen.len() < k {
        let unseen: Vec<usize> = (0..candidates.len())
            .filter(|i| !chosen.contains(i) && !seen_families.contains(&candidates[*i].plan.family()))
            .collect();
        let pool: Vec<usize> =
            if unseen.is_empty() { (0..candidates.len()).filter(|i| !chosen.contains(i)).collect() } else { unseen };
        let Some(next) = pool.into_iter().max_by(|&a, &b| {
            let d = |i: usize| chosen.iter().map(|&c| distance(&feats[i], &feats[c])).fold(f64::INFINITY, f64::min);
            d(a).total_cmp(&d(b)).then(b.cmp(&a))
        }) else {
            break;
        };
        seen_families.push(candidates[next].plan.family());
        chosen.push(next);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(plan: &str, placement: &str) -> Candidate {
        Candidate { plan: plan.parse().unwrap(), placement: placement.parse().unwrap() }
    }

    #[test]
    fn families_first_then_spread() {
        let cands = vec![
            cand("dp1-mb8", "1"),
            cand("dp8-mb1", "8"),
            cand("dp8-mb1", "44"),
            cand("dp8-mb1", "11111111"),
            cand("dp8-mb1-gc", "8"),
            cand("dp8-mb1-z2", "8"),
            cand("dp8-mb1-z2-offopt", "8"),
            cand("dp2-mb4", "2"),
        ];
        let picked = select(&cands, 5);
        assert_eq!(picked[0], 1, "starts from the largest single-node configuration");
        let families: Vec<PlanFamily> = picked[..4].iter().map(|&i| cands[i].plan.family()).collect();
        for f in [PlanFamily::Dp, PlanFamily::DpGc, PlanFamily::ZeroDp, PlanFamily::ZeroOffload] {
            assert!(families.contains(&f), "{families:?}");
        }
        assert_eq!(select(&cands, 5), picked, "deterministic");
        assert_eq!(select(&cands, 100).len(), cands.len());
        assert!(select(&[], 3).is_empty());
    }
}
