//! Plan spaces: every valid, memory-feasible plan of a job on a number of GPUs.
//!
//! Here plans meet models: [`crate::plan`] knows plans alone (their forms and the rules
//! that hold whatever the job), this module adds what a model decides, a plan's
//! validity for it ([`Plan::check`]) and the plans a reference code stands for
//! ([`PlanCode::candidates`], [`resolve_code`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::NodeGroup;
use crate::launch::PlanSupport;
use crate::memory::{FitBasis, MemoryBreakdown, MemoryEstimator};
use crate::model::ModelSpec;
use crate::plan::{Offload, Plan, PlanCode, PlanFamily, PlanViolation, Recompute, ZeroStage};

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

impl Plan {
    /// All validity rules of this plan for `model` on `gpus` GPUs.
    pub fn check(&self, model: &ModelSpec, gpus: u32) -> Result<(), PlanViolation> {
        self.check_shape()?;
        if self.gpus() != gpus {
            return Err(PlanViolation::GpuCount { product: self.gpus(), gpus });
        }
        if self.global_batch() != model.global_batch {
            return Err(PlanViolation::GlobalBatch { product: self.global_batch(), global_batch: model.global_batch });
        }
        if !model.heads.is_multiple_of(self.tp) {
            return Err(PlanViolation::TpHeads { tp: self.tp, heads: model.heads });
        }
        if !model.hidden.is_multiple_of(self.tp) {
            return Err(PlanViolation::TpHidden { tp: self.tp, hidden: model.hidden });
        }
        if !model.layers.is_multiple_of(self.pp) {
            return Err(PlanViolation::PpLayers { pp: self.pp, layers: model.layers });
        }
        if self.vp > 1 && !model.layers.is_multiple_of(self.pp * self.vp) {
            return Err(PlanViolation::VirtualStagesLayers { chunks: self.pp * self.vp, layers: model.layers });
        }
        Ok(())
    }
}

impl PlanCode {
    /// The complete plans this code stands for on `gpus` GPUs for `model`: every
    /// micro-batch that divides the per-replica batch, largest first. The caller
    /// picks the first that fits in memory.
    pub fn candidates(&self, model: &ModelSpec, gpus: u32) -> Vec<Plan> {
        let skeleton = self.skeleton(gpus);
        let dp = u64::from(skeleton.dp);
        if gpus == 0 || skeleton.gpus() != gpus || !model.global_batch.is_multiple_of(dp) {
            return Vec::new();
        }
        let per_replica = model.global_batch / dp;
        divisors(per_replica)
            .rev()
            .filter_map(|mb| {
                let micro_batch = u32::try_from(mb).ok()?;
                let ga = u32::try_from(per_replica / mb).ok()?;
                Some(Plan { micro_batch, ga, ..skeleton })
            })
            .collect()
    }
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
    use crate::cluster::Cluster;

    #[test]
    fn zero_is_dropped_on_one_gpu_without_offload() {
        let model = ModelSpec::example();
        let plans = PlanCode::ZeroDp.candidates(&model, 1);
        assert!(plans.iter().all(|p| p.zero == ZeroStage::None));
        let plans = PlanCode::ZeroOffload.candidates(&model, 1);
        assert!(plans.iter().all(|p| p.zero == ZeroStage::Two && p.offload == Offload::Optimizer));
    }

    #[test]
    fn candidates_keep_the_global_batch() {
        let model = ModelSpec::example();
        for gpus in 1..=16 {
            for plan in PlanCode::Ga.candidates(&model, gpus) {
                assert_eq!(plan.global_batch(), model.global_batch);
                assert_eq!(plan.gpus(), gpus);
            }
        }
    }

    #[test]
    fn validity_rules_name_the_violation() {
        let model = ModelSpec::example(); // 32 heads, hidden 4096, 32 layers, batch 16
        let mut plan = Plan::data_parallel(4, 4);
        assert_eq!(plan.check(&model, 4), Ok(()));
        assert_eq!(plan.check(&model, 8), Err(PlanViolation::GpuCount { product: 4, gpus: 8 }));
        plan.micro_batch = 3;
        assert!(matches!(plan.check(&model, 4), Err(PlanViolation::GlobalBatch { .. })));
        let plan = Plan { tp: 3, dp: 1, micro_batch: 16, ..Plan::data_parallel(1, 16) };
        assert!(matches!(plan.check(&model, 3), Err(PlanViolation::TpHeads { .. })));
        let plan = Plan { pp: 3, dp: 1, micro_batch: 16, ..Plan::data_parallel(1, 16) };
        assert!(matches!(plan.check(&model, 3), Err(PlanViolation::PpLayers { .. })));
    }

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
