//! Plan spaces: every valid, memory-feasible plan of a job on a number of GPUs.
//!
//! Here plans meet models: [`rubick_core::plan`] knows plans alone (their forms and the rules
//! that hold whatever the job), this module adds what a model decides, a plan's
//! validity for it ([`Plan::check`]) and the plans a reference code stands for
//! ([`PlanCode::candidates`], [`resolve_code`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::memory::{FitBasis, MemoryBreakdown, MemoryEstimator};
use rubick_core::cluster::NodeGroup;
use rubick_core::launch::PlanSupport;
use rubick_core::model::ModelSpec;
use rubick_core::plan::{Offload, Plan, PlanCode, PlanFamily, Recompute, ZeroStage, divisors};

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

/// Which of the dimensions beyond the paper's a plan space enumerates: those the job's
/// script says it implements (`launch.supports`); none for a job that says nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dimensions {
    pub sequence_parallel: bool,
    pub selective_recompute: bool,
    /// Most virtual pipeline stages per rank (1: no interleaving).
    pub max_vp: u32,
}

impl Dimensions {
    /// The paper's space: no sequence parallelism, no selective recompute, no interleaving.
    pub const PAPER: Dimensions = Dimensions { sequence_parallel: false, selective_recompute: false, max_vp: 1 };

    /// Every dimension, interleaving up to `max_vp` (tests, the exhaustive planner).
    pub const fn all(max_vp: u32) -> Dimensions {
        Dimensions { sequence_parallel: true, selective_recompute: true, max_vp }
    }

    /// The dimensions a script's `launch.supports` names.
    pub fn of(supports: Option<&PlanSupport>) -> Dimensions {
        supports.map_or(Self::PAPER, |s| Dimensions {
            sequence_parallel: s.sequence_parallel == Some(true),
            selective_recompute: s.selective_recompute == Some(true),
            max_vp: s.max_vp.unwrap_or(1).max(1),
        })
    }
}

/// Every valid plan of `model` on `gpus` GPUs with tensor parallelism inside a node of
/// `gpus_per_node`, in a fixed order (by pp, tp, dp, ZeRO, offload, recompute, sequence
/// parallelism, virtual stages, micro-batch), with the newer dimensions `dims` allows.
/// Memory is not checked.
pub fn valid_plans(model: &ModelSpec, gpus: u32, gpus_per_node: u32, dims: Dimensions) -> Vec<Plan> {
    let recomputes: &[Recompute] = if dims.selective_recompute {
        &[Recompute::None, Recompute::Full, Recompute::Selective]
    } else {
        &[Recompute::None, Recompute::Full]
    };
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
                    for &recompute in recomputes {
                        let sps: &[bool] = if dims.sequence_parallel && tp > 1 { &[false, true] } else { &[false] };
                        let max_vp = if pp > 1 { dims.max_vp.max(1) } else { 1 };
                        for &sp in sps {
                            for vp in 1..=max_vp {
                                for mb in divisors(per_replica) {
                                    let (Ok(micro_batch), Ok(ga)) =
                                        (u32::try_from(mb), u32::try_from(per_replica / mb))
                                    else {
                                        continue;
                                    };
                                    let plan = Plan {
                                        dp: dp as u32,
                                        tp: tp as u32,
                                        pp: pp as u32,
                                        zero,
                                        offload,
                                        ga,
                                        recompute,
                                        micro_batch,
                                        sp,
                                        vp,
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
        }
    }
    plans
}

impl PlanSpace {
    /// The feasible plans of `model` on `gpus` GPUs of `group`'s type, with the newer
    /// dimensions `dims` allows.
    pub fn enumerate(
        model: &ModelSpec,
        gpus: u32,
        group: &NodeGroup,
        estimator: &MemoryEstimator,
        dims: Dimensions,
    ) -> PlanSpace {
        let valid = valid_plans(model, gpus, group.gpus_per_node, dims);
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
    code: &PlanCode,
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
    use rubick_core::cluster::Cluster;

    #[test]
    fn every_plan_is_valid_and_fits() {
        let cluster = Cluster::example();
        let group = &cluster.node_groups[0];
        let model = ModelSpec::example();
        let estimator = MemoryEstimator::default();
        for gpus in [1, 2, 3, 4, 8, 16] {
            let space = PlanSpace::enumerate(&model, gpus, group, &estimator, Dimensions::PAPER);
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
        let a = valid_plans(&model, 8, 8, Dimensions::PAPER);
        let b = valid_plans(&model, 8, 8, Dimensions::PAPER);
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
        let space =
            PlanSpace::enumerate(&model, 8, &cluster.node_groups[0], &MemoryEstimator::default(), Dimensions::PAPER);
        assert!(!space.plans.is_empty());
        assert!(space.plans.iter().all(|e| e.family != PlanFamily::Dp && e.family != PlanFamily::DpGc));
    }
}
