//! What the scheduler knows of a model before profiling it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{ApiVersion, Artifact, Kind};
use crate::error::{ValidationError, ensure};
use crate::plan::PlanFamily;

/// A `ModelSpec` artifact, also embedded in a `Job`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    pub name: String,
    /// Exact parameter count. When absent, estimated as 12 * layers * hidden^2
    /// (+ vocab * hidden when `vocab` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    #[schemars(range(min = 1))]
    pub layers: u32,
    #[schemars(range(min = 1))]
    pub hidden: u32,
    #[schemars(range(min = 1))]
    pub heads: u32,
    /// Tokens per sample.
    #[schemars(range(min = 1))]
    pub seq_len: u32,
    /// Vocabulary size, for the logits' memory. Optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<u32>,
    /// Samples per iteration, fixed across plans (accumulation adjusts).
    #[schemars(range(min = 1))]
    pub global_batch: u64,
    /// Bytes of model state per parameter.
    #[serde(default)]
    pub state_bytes: StateBytes,
    /// Activation bytes stored per token, layer and hidden unit for the backward pass,
    /// without checkpointing: 34 for a GPT-style layer in 16-bit precision (Korthikanti
    /// et al., 2022, with memory-efficient attention); 10 of the 34 are not split by
    /// tensor parallelism.
    #[serde(default = "default_activation_factor")]
    pub activation_factor: f64,
    /// Attention without the s^2 score matrix in memory (FlashAttention or
    /// memory-efficient attention). When false, 5 * heads * seq_len bytes per token and
    /// layer are added.
    #[serde(default = "default_true")]
    pub flash_attention: bool,
    /// The measured forward time of one global batch on one GPU, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_1gpu_ms: Option<f64>,
    /// Memory limits measured on a GPU of a given size; they decide feasibility on GPUs
    /// of that size instead of the estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_limits: Option<MeasuredLimits>,
}

/// Bytes per parameter of each kind of model state (mixed-precision Adam by default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateBytes {
    /// Working weights (2 for fp16/bf16).
    pub param: f64,
    /// Gradients (2 for fp16/bf16).
    pub grad: f64,
    /// Optimizer states incl. the fp32 master copy (12 for Adam: master, m, v).
    pub optimizer: f64,
}

impl Default for StateBytes {
    fn default() -> Self {
        StateBytes { param: 2.0, grad: 2.0, optimizer: 12.0 }
    }
}

/// Largest micro-batch per plan family that was seen to fit on a GPU of `gpuMemoryGib`.
///
/// A limit decides feasibility only where it was measured: the data-parallel families
/// (`dp`, `dp_gc`, `zero_dp`, `zero_offload`) at TP = PP = 1, the 3-D families
/// (`tp_pp`, `tp_pp_gc`) only at the TP x PP degrees listed in `tpPpDegrees` (per-GPU
/// memory of a 3-D plan depends on them: a limit measured on 16-way model parallelism
/// says nothing about 2-way). Elsewhere the analytic estimate decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeasuredLimits {
    pub gpu_memory_gib: f64,
    /// 0 means the family does not fit at all.
    pub max_micro_batch: BTreeMap<PlanFamily, u32>,
    /// The (TP, PP) degrees at which the 3-D limits were measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tp_pp_degrees: Vec<TpPp>,
}

/// A tensor x pipeline degree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TpPp {
    pub tp: u32,
    pub pp: u32,
}

impl MeasuredLimits {
    /// The measured limit that decides `plan`'s feasibility, if one was measured at its
    /// family and degree.
    pub fn limit_for(&self, plan: &crate::plan::Plan) -> Option<u32> {
        let family = plan.family();
        // The limits were measured without the newer dimensions (sequence parallelism,
        // selective recompute, interleaving), which change activation memory.
        if plan.uses_newer_dimensions() {
            return None;
        }
        let measured_here = match family {
            PlanFamily::TpPp | PlanFamily::TpPpGc => self.tp_pp_degrees.contains(&TpPp { tp: plan.tp, pp: plan.pp }),
            _ => plan.tp == 1 && plan.pp == 1,
        };
        if measured_here { self.max_micro_batch(family) } else { None }
    }

    /// The measured limit for a family; checkpointed 3-D falls back to plain 3-D.
    pub fn max_micro_batch(&self, family: PlanFamily) -> Option<u32> {
        self.max_micro_batch.get(&family).copied().or_else(|| match family {
            PlanFamily::TpPpGc => self.max_micro_batch.get(&PlanFamily::TpPp).copied(),
            _ => None,
        })
    }

    /// Whether these limits were measured on GPUs of this size (within 1 %).
    pub fn applies_to(&self, gpu_memory_gib: f64) -> bool {
        (self.gpu_memory_gib - gpu_memory_gib).abs() <= 0.01 * self.gpu_memory_gib
    }
}

fn default_activation_factor() -> f64 {
    34.0
}

fn default_true() -> bool {
    true
}

impl ModelSpec {
    /// Parameters, exact or estimated from the shape.
    pub fn parameter_count(&self) -> u64 {
        self.parameters.unwrap_or_else(|| {
            let h = u64::from(self.hidden);
            12 * u64::from(self.layers) * h * h + u64::from(self.vocab.unwrap_or(0)) * h
        })
    }

    /// A LLaMA-2-7B-like model, for examples and tests.
    pub fn example() -> Self {
        ModelSpec {
            api_version: None,
            kind: None,
            name: "llama7".into(),
            parameters: Some(6_738_423_808),
            layers: 32,
            hidden: 4096,
            heads: 32,
            seq_len: 2048,
            vocab: None,
            global_batch: 16,
            state_bytes: StateBytes::default(),
            activation_factor: default_activation_factor(),
            flash_attention: true,
            forward_1gpu_ms: None,
            measured_limits: None,
        }
    }

    /// Rules of a model spec; errors name the field relative to the spec.
    pub fn check(&self) -> Result<(), ValidationError> {
        use crate::limits::{self, check_range, check_real};
        let at = |field: &'static str| move |why: String| ValidationError::new(field, why);
        ensure(!self.name.trim().is_empty(), "name", || "must not be empty".into())?;
        if let Some(p) = self.parameters {
            check_range(p, 1, limits::MAX_PARAMETERS).map_err(at("parameters"))?;
        }
        check_range(self.layers, 1, limits::MAX_LAYERS).map_err(at("layers"))?;
        check_range(self.heads, 1, limits::MAX_LAYERS).map_err(at("heads"))?;
        check_range(self.hidden, 1, limits::MAX_WIDTH).map_err(at("hidden"))?;
        check_range(self.seq_len, 1, limits::MAX_WIDTH).map_err(at("seqLen"))?;
        if let Some(v) = self.vocab {
            check_range(v, 1, limits::MAX_WIDTH).map_err(at("vocab"))?;
        }
        check_range(self.global_batch, 1, limits::MAX_GLOBAL_BATCH).map_err(at("globalBatch"))?;
        for (field, value) in [
            ("stateBytes.param", self.state_bytes.param),
            ("stateBytes.grad", self.state_bytes.grad),
            ("stateBytes.optimizer", self.state_bytes.optimizer),
        ] {
            check_real(value, 0.0, limits::MAX_FACTOR, false).map_err(at(field))?;
        }
        check_real(self.activation_factor, 0.0, limits::MAX_FACTOR, true).map_err(at("activationFactor"))?;
        if let Some(ms) = self.forward_1gpu_ms {
            check_real(ms, 0.0, 1e9, true).map_err(at("forward1gpuMs"))?;
        }
        if let Some(m) = &self.measured_limits {
            check_real(m.gpu_memory_gib, 0.0, limits::MAX_MEMORY_GIB, true)
                .map_err(at("measuredLimits.gpuMemoryGib"))?;
        }
        Ok(())
    }
}

impl Artifact for ModelSpec {
    crate::artifact_header!(Kind::ModelSpec);

    fn validate(&self) -> Result<(), ValidationError> {
        self.check()
    }
}
