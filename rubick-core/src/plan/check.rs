//! What a model makes of a plan, memory aside: a plan's validity for it
//! ([`Plan::check`]) and the complete plans a reference code stands for
//! ([`PlanCode::candidates`]). Which of them fit in memory is `rubick-model`'s
//! (`space`).

use crate::model::ModelSpec;
use crate::plan::{Plan, PlanCode, PlanViolation};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Offload, ZeroStage};

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
}
