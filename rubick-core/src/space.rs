//! Plan spaces: every valid, memory-feasible plan of a job on a number of GPUs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::NodeGroup;
use crate::memory::{FitBasis, MemoryBreakdown, MemoryEstimator};
use crate::model::ModelSpec;
use crate::plan::{Offload, Plan, PlanFamily, ZeroStage};

/// One feasible plan with its memory estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpaceEntry {
    pub plan: Plan,
    pub family: PlanFamily,
    pub memory: MemoryBreakdown,
    /// Whether measured limits or the estimate decided feasibility.
    pub fit_basis: FitBasis,
}

/// The feasible plans of one model on `gpus` GPUs of one node group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanSpace {
    pub model: String,
    pub gpus: u32,
    pub node_group: String,
    pub gpu_type: String,
    pub gpu_memory_gib: f64,
    /// Plans considered before the memory check (valid for the model and GPU count).
    pub valid_plans: usize,
    pub plans: Vec<SpaceEntry>,
}

/// The divisors of `n` in increasing order, in O(sqrt n).
pub fn divisors(n: u64) -> impl DoubleEndedIterator<Item = u64> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.into_iter().chain(high.into_iter().rev())
}

/// Every valid plan of `model` on `gpus` GPUs with tensor parallelism inside a node of
/// `gpus_per_node`, in a fixed order (by pp, tp, dp, ZeRO, offload, checkpointing,
/// micro-batch). Memory is not checked.
pub fn valid_plans(model: &ModelSpec, gpus: u32, gpus_per_node: u32) -> Vec<Plan> {
    let mut plans = Vec::new();
    for tp in divisors(u64::from(gpus)).filter(|&t| t <= u64::from(gpus_per_node)) {
        for pp in divisors(u64::from(gpus) / tp) {
            let dp = u64::from(gpus) / tp / pp;
            if !model.global_batch.is_multiple_of(dp) {
                continue;
            }
            let per_replica = model.global_batch / dp;
            for zero in ZeroStage::ALL {
                for offload in Offload::ALL {
                    for checkpointing in [false, true] {
                        for mb in divisors(per_replica) {
                            let (Ok(micro_batch), Ok(ga)) = (u32::try_from(mb), u32::try_from(per_replica / mb)) else {
                                continue;
                            };
                            let plan = Plan {
                                dp: dp as u32,
                                tp: tp as u32,
                                pp: pp as u32,
                                zero,
                                offload,
                                ga,
                                checkpointing,
                                micro_batch,
                            };
                            if plan.check(model, gpus).is_ok() {
                                plans.push(plan);
                            }
                        }
                    }
                }
            }
        }
    }
    plans
}

impl PlanSpace {
    /// The feasible plans of `model` on `gpus` GPUs of `group`'s type.
    pub fn enumerate(model: &ModelSpec, gpus: u32, group: &NodeGroup, estimator: &MemoryEstimator) -> PlanSpace {
        let valid = valid_plans(model, gpus, group.gpus_per_node);
        let valid_count = valid.len();
        let plans = valid
            .into_iter()
            .filter_map(|plan| {
                let (fits, fit_basis) = estimator.fits(model, &plan, group.gpu_memory_gib);
                fits.then(|| SpaceEntry {
                    plan,
                    family: plan.family(),
                    memory: estimator.estimate(model, &plan).rounded(),
                    fit_basis,
                })
            })
            .collect();
        PlanSpace {
            model: model.name.clone(),
            gpus,
            node_group: group.name.clone(),
            gpu_type: group.gpu_type.clone(),
            gpu_memory_gib: group.gpu_memory_gib,
            valid_plans: valid_count,
            plans,
        }
    }
}

/// The complete plan a reference code stands for on `gpus` GPUs: the largest
/// micro-batch that fits (measured limits first, then the estimate), else the smallest.
pub fn resolve_code(
    code: &crate::plan::PlanCode,
    model: &ModelSpec,
    gpus: u32,
    gpu_memory_gib: f64,
    estimator: &MemoryEstimator,
) -> Option<Plan> {
    let candidates = code.candidates(model, gpus);
    candidates.iter().find(|p| estimator.fits(model, p, gpu_memory_gib).0).or(candidates.last()).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;

    #[test]
    fn every_plan_is_valid_and_fits() {
        let cluster = Cluster::example();
        let group = &cluster.node_groups[0];
        let model = ModelSpec::example();
        let estimator = MemoryEstimator::default();
        for gpus in [1, 2, 3, 4, 8, 16] {
            let space = PlanSpace::enumerate(&model, gpus, group, &estimator);
            assert!(space.plans.len() <= space.valid_plans);
            for entry in &space.plans {
                assert_eq!(entry.plan.check(&model, gpus), Ok(()));
                assert!(entry.memory.total_gib <= group.gpu_memory_gib);
                assert!(entry.plan.tp <= group.gpus_per_node);
            }
        }
    }

    #[test]
    fn order_is_deterministic_and_has_no_duplicates() {
        let model = ModelSpec::example();
        let a = valid_plans(&model, 8, 8);
        let b = valid_plans(&model, 8, 8);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), a.len());
    }

    #[test]
    fn llama7_plain_data_parallel_never_fits_on_80gb() {
        let cluster = Cluster::example();
        let model = ModelSpec::example();
        let space = PlanSpace::enumerate(&model, 8, &cluster.node_groups[0], &MemoryEstimator::default());
        assert!(!space.plans.is_empty());
        assert!(space.plans.iter().all(|e| e.family != PlanFamily::Dp && e.family != PlanFamily::DpGc));
    }
}
