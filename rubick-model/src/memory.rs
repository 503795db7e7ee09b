//! The GPU-memory estimate of a (model, plan): it decides which plans are feasible.
//!
//! Per GPU, in bytes:
//!
//! * **model states** of the pipeline stage, `P / (tp * pp)` parameters: weights
//!   (sharded over dp by ZeRO-3, streamed layer by layer when parameters are
//!   offloaded), gradients (sharded by ZeRO-2 and up) and optimizer states (sharded by
//!   ZeRO-1 and up, on the host with offload);
//! * **activations** of `layers / pp` layers per micro-batch in flight (1F1B keeps up
//!   to `min(pp, ga)` micro-batches on the first stage; an interleaved schedule of `vp`
//!   virtual stages `1 + (pp - 1) / (pp vp)` times that, Korthikanti et al. 2022, 4.2.3):
//!   `factor * s * b * h` bytes per layer, of which 24/34 are split by tensor
//!   parallelism and, with sequence parallelism, the other 10/34 (layer norms,
//!   dropouts) too, plus `5 a s^2 b / tp` without memory-efficient attention unless
//!   selective recompute drops it (the attention core is what it recomputes); with full
//!   recompute only each layer's input (`2 s b h`, split by tp with sequence
//!   parallelism) is kept, plus one layer's full working set for the recompute;
//! * the logits (`4 s b vocab / tp`) when the vocabulary is known;
//! * a fixed **reserve** for the CUDA context, NCCL and allocator fragmentation.
//!
//! Where a model carries measured limits for GPUs of the cluster's size, those decide
//! feasibility instead (see [`MemoryEstimator::fits`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use rubick_core::model::ModelSpec;
use rubick_core::plan::{Offload, Plan, Recompute, ZeroStage};

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Share of the activation factor that tensor parallelism splits (24 of 34).
const TP_SPLIT_SHARE: f64 = 24.0 / 34.0;

/// Estimated GPU memory of one GPU, GiB per part.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryBreakdown {
    pub weights_gib: f64,
    pub gradients_gib: f64,
    pub optimizer_gib: f64,
    pub activations_gib: f64,
    pub reserve_gib: f64,
    pub total_gib: f64,
}

impl MemoryBreakdown {
    /// The same figures rounded to 1 MiB, for listings.
    pub fn rounded(self) -> Self {
        let r = |x: f64| (x * 1024.0).round() / 1024.0;
        MemoryBreakdown {
            weights_gib: r(self.weights_gib),
            gradients_gib: r(self.gradients_gib),
            optimizer_gib: r(self.optimizer_gib),
            activations_gib: r(self.activations_gib),
            reserve_gib: r(self.reserve_gib),
            total_gib: r(self.total_gib),
        }
    }
}

/// How feasibility was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FitBasis {
    /// The analytic estimate.
    Estimate,
    /// The model's measured limits for GPUs of this size.
    Measured,
}

/// The memory model with its one free constant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimator {
    /// GiB kept free on every GPU (context, NCCL buffers, fragmentation).
    pub reserve_gib: f64,
}

impl Default for MemoryEstimator {
    fn default() -> Self {
        MemoryEstimator { reserve_gib: 2.5 }
    }
}

impl MemoryEstimator {
    pub fn estimate(&self, model: &ModelSpec, plan: &Plan) -> MemoryBreakdown {
        let dp = f64::from(plan.dp);
        let tp = f64::from(plan.tp);
        let pp = f64::from(plan.pp);
        let bytes = model.state_bytes;
        let stage_params = model.parameter_count() as f64 / (tp * pp);
        let layers_per_stage = f64::from(model.layers) / pp;

        let weights = match (plan.offload, plan.zero) {
            // Parameters live on the host; one layer is fetched at a time.
            (Offload::OptimizerAndParams, _) => bytes.param * stage_params / layers_per_stage.max(1.0),
            (_, ZeroStage::Three) => bytes.param * stage_params / dp,
            _ => bytes.param * stage_params,
        };
        let gradients =
            if plan.zero >= ZeroStage::Two { bytes.grad * stage_params / dp } else { bytes.grad * stage_params };
        let optimizer = match (plan.offload, plan.zero) {
            (Offload::Optimizer | Offload::OptimizerAndParams, _) => 0.0,
            (_, ZeroStage::None) => bytes.optimizer * stage_params,
            _ => bytes.optimizer * stage_params / dp,
        };

        let s = f64::from(model.seq_len);
        let h = f64::from(model.hidden);
        let b = f64::from(plan.micro_batch);
        let factor = model.activation_factor;
        let split = if plan.sp { 1.0 / tp } else { (1.0 - TP_SPLIT_SHARE) + TP_SPLIT_SHARE / tp };
        let mut kept_layer = s * b * h * factor * split;
        let scores = if model.flash_attention { 0.0 } else { 5.0 * f64::from(model.heads) * s * s * b / tp };
        let full_layer = kept_layer + scores;
        if plan.recompute != Recompute::Selective {
            kept_layer += scores;
        }
        let mut in_flight = if plan.pp > 1 { f64::from(plan.pp.min(plan.ga)) } else { 1.0 };
        if plan.vp > 1 {
            in_flight *= 1.0 + (pp - 1.0) / (pp * f64::from(plan.vp));
        }
        let input = if plan.sp { 2.0 * s * b * h / tp } else { 2.0 * s * b * h };
        let mut activations = if plan.checkpointing() {
            in_flight * layers_per_stage * input + full_layer
        } else {
            in_flight * layers_per_stage * kept_layer
        };
        if let Some(vocab) = model.vocab {
            activations += 4.0 * s * b * f64::from(vocab) / tp;
        }

        let parts = [weights, gradients, optimizer, activations].map(|x| x / GIB);
        MemoryBreakdown {
            weights_gib: parts[0],
            gradients_gib: parts[1],
            optimizer_gib: parts[2],
            activations_gib: parts[3],
            reserve_gib: self.reserve_gib,
            total_gib: parts.iter().sum::<f64>() + self.reserve_gib,
        }
    }

    /// Whether the plan fits on GPUs of `gpu_memory_gib`, and on what basis: the
    /// model's measured limits when they were taken on GPUs of this size, at the plan's
    /// family and degree ([`rubick_core::model::MeasuredLimits::limit_for`]), the estimate
    /// otherwise.
    pub fn fits(&self, model: &ModelSpec, plan: &Plan, gpu_memory_gib: f64) -> (bool, FitBasis) {
        if let Some(limits) = &model.measured_limits
            && limits.applies_to(gpu_memory_gib)
            && let Some(max) = limits.limit_for(plan)
        {
            return (max > 0 && plan.micro_batch <= max, FitBasis::Measured);
        }
        (self.estimate(model, plan).total_gib <= gpu_memory_gib, FitBasis::Estimate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(plan: &str) -> f64 {
        let mut model = ModelSpec::example();
        model.global_batch = 8;
        MemoryEstimator::default().estimate(&model, &plan.parse().unwrap()).total_gib
    }

    #[test]
    fn zero_stages_shrink_model_states() {
        let plain = total("dp8-mb1");
        let z1 = total("dp8-mb1-z1");
        let z2 = total("dp8-mb1-z2");
        let z3 = total("dp8-mb1-z3");
        assert!(plain > z1 && z1 > z2 && z2 > z3, "{plain} {z1} {z2} {z3}");
        // LLaMA-7B with mixed-precision Adam needs 16 bytes/parameter: ~100 GiB.
        assert!(plain > 100.0);
    }

    #[test]
    fn offload_moves_the_optimizer_off_the_gpu() {
        assert!(total("dp2-mb4-z2-offopt") < total("dp2-mb4-z2") - 30.0);
        assert!(total("dp2-mb4-z3-offall") < total("dp2-mb4-z2-offopt"));
    }

    #[test]
    fn activations_scale_with_micro_batch_and_shrink_with_checkpointing() {
        let e = MemoryEstimator::default();
        let model = ModelSpec::example();
        let a1 = e.estimate(&model, &"dp8-mb1-ga2-z3".parse().unwrap()).activations_gib;
        let a2 = e.estimate(&model, &"dp8-mb2-z3".parse().unwrap()).activations_gib;
        let gc = e.estimate(&model, &"dp8-mb2-z3-gc".parse().unwrap()).activations_gib;
        assert!((a2 / a1 - 2.0).abs() < 1e-9);
        assert!(gc < a2 / 5.0);
    }

    #[test]
    fn sequence_parallelism_and_selective_recompute_shrink_activations_interleaving_grows_them() {
        let e = MemoryEstimator::default();
        let mut model = ModelSpec::example();
        (model.flash_attention, model.vocab) = (false, None);
        let with = |model: &ModelSpec, plan: &str| e.estimate(model, &plan.parse().unwrap()).activations_gib;
        let act = |plan: &str| with(&model, plan);
        let base = act("dp1-tp4-pp2-mb2-ga8");
        // Sequence parallelism splits the 10/34 that tensor parallelism leaves whole.
        assert!(act("dp1-tp4-pp2-mb2-ga8-sp") < base);
        // Selective recompute drops the attention scores, full recompute keeps only inputs.
        let selective = act("dp1-tp4-pp2-mb2-ga8-sel");
        assert!(selective < base && act("dp1-tp4-pp2-mb2-ga8-gc") < selective);
        assert!(act("dp1-tp4-pp2-mb2-ga8-sp-sel") < selective);
        // Interleaving keeps 1 + (pp - 1) / (pp vp) = 1.25 times the in-flight activations.
        let (one, two) = (act("dp1-tp4-pp2-mb2-ga8"), act("dp1-tp4-pp2-mb2-ga8-vp2"));
        assert!((two / one - 1.25).abs() < 1e-9, "{one} {two}");
        // With memory-efficient attention there are no scores to drop.
        let flash = ModelSpec { flash_attention: true, ..model.clone() };
        assert_eq!(with(&flash, "dp1-tp4-pp2-mb2-ga8-sel"), with(&flash, "dp1-tp4-pp2-mb2-ga8"));
    }

    /// A 3-D limit measured at 16-way model parallelism once let LLaMA-30B run 2-way
    /// model parallel on 80 GiB GPUs needing ~245 GiB each.
    #[test]
    fn a_measured_limit_decides_only_at_its_family_and_degree() {
        use rubick_core::model::{MeasuredLimits, TpPp};
        let mut model = ModelSpec::example();
        model.name = "llama30".into();
        model.parameters = Some(32_528_943_616);
        (model.layers, model.hidden, model.heads, model.seq_len, model.global_batch) = (60, 6656, 52, 1024, 4);
        model.measured_limits = Some(MeasuredLimits {
            gpu_memory_gib: 80.0,
            max_micro_batch: [(rubick_core::plan::PlanFamily::TpPp, 8)].into_iter().collect(),
            tp_pp_degrees: vec![TpPp { tp: 4, pp: 4 }],
        });
        let e = MemoryEstimator::default();
        let small: Plan = "dp1-tp2-pp1-mb2-ga2".parse().unwrap();
        assert!(e.estimate(&model, &small).total_gib > 200.0);
        assert_eq!(e.fits(&model, &small, 80.0), (false, FitBasis::Estimate));
        let measured: Plan = "dp1-tp4-pp4-mb1-ga4".parse().unwrap();
        assert_eq!(e.fits(&model, &measured, 80.0), (true, FitBasis::Measured));
        // Data-parallel families have no measured limit here: the estimate decides.
        assert_eq!(e.fits(&model, &"dp4-mb1".parse().unwrap(), 80.0).1, FitBasis::Estimate);
    }

    #[test]
    fn tensor_and_pipeline_parallelism_split_the_model() {
        let tp = total("tp8-mb8");
        let pp = total("pp8-mb1-ga8");
        assert!(tp < total("dp8-mb1"));
        assert!(pp < 40.0, "{pp}");
    }
}
