//! Execution plans: how one training job is laid out over its GPUs.
//!
//! A [`Plan`] fixes every degree of freedom the scheduler may change: data, tensor and
//! pipeline parallel degrees, the ZeRO stage, CPU offload, gradient accumulation,
//! activation recomputation (none, selective or full), sequence parallelism beside
//! tensor parallelism, interleaved pipeline stages and the per-GPU micro-batch. Two
//! textual forms exist:
//!
//! * our readable form, e.g. `dp4-tp2-pp1-mb2-ga1-z1-gc` or `dp1-tp2-pp2-mb1-ga4-vp2-sp-sel`
//!   (see [`Plan::from_str`]);
//! * the plan *codes* of the authors' reference data (`ga`, `gc`, `zero-dp`,
//!   `zero-offload`, or three digits P T D), parsed into [`PlanCode`]. A code names a
//!   family and its degrees but not the micro-batch; [`PlanCode::candidates`] lists
//!   the plans it stands for, and `rubick_model::space::resolve_code` picks the one
//!   that fits.
//!
//! This module knows plans alone: the rules that hold whatever the job
//! ([`Plan::check_shape`]). What a model adds (a plan's validity for it, the plans a
//! code stands for) is in `check.rs`; what fits in memory is `rubick-model`'s.
//!
//! The readable form is the one jobs get in `RUBICK_PLAN`; `data/plan-vectors.json`
//! holds its test vectors, shared with the Python package's parser (`python/rubick/plan.py`).

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ParseError;

mod check;
mod code;

pub use check::divisors;
pub use code::{PlanCode, PlanRequest};

/// ZeRO stage (Rajbhandari et al., 2020): which model states are sharded over the
/// data-parallel group. 1 = optimizer states, 2 = + gradients, 3 = + parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ZeroStage {
    #[default]
    None,
    One,
    Two,
    Three,
}

impl ZeroStage {
    pub const ALL: [ZeroStage; 4] = [Self::None, Self::One, Self::Two, Self::Three];

    pub fn level(self) -> u8 {
        match self {
            Self::None => 0,
            Self::One => 1,
            Self::Two => 2,
            Self::Three => 3,
        }
    }

    pub fn from_level(level: u8) -> Option<Self> {
        Self::ALL.get(usize::from(level)).copied()
    }
}

/// What ZeRO-Offload moves to host memory and the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Offload {
    #[default]
    None,
    /// Optimizer states and the optimizer step on the CPU (ZeRO-Offload).
    Optimizer,
    /// Optimizer and parameters on the host (ZeRO-Infinity style, needs ZeRO-3).
    OptimizerAndParams,
}

impl Offload {
    pub const ALL: [Offload; 3] = [Self::None, Self::Optimizer, Self::OptimizerAndParams];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Optimizer => "optimizer",
            Self::OptimizerAndParams => "optimizer+params",
        }
    }

    fn token(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Optimizer => Some("offopt"),
            Self::OptimizerAndParams => Some("offall"),
        }
    }
}

/// Which activations the backward pass recomputes instead of keeping from the forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Recompute {
    /// Every activation kept.
    #[default]
    None,
    /// The attention core (scores, softmax, dropout, the product with V) recomputed,
    /// the rest kept (Korthikanti et al. 2022): its memory goes, most of the forward
    /// is not repeated.
    Selective,
    /// Each layer's input kept, the whole layer recomputed (full activation
    /// checkpointing).
    Full,
}

impl Recompute {
    pub const ALL: [Recompute; 3] = [Self::None, Self::Selective, Self::Full];

    /// The name in `launch.supports`, the `{recompute}` placeholder and `RUBICK_RECOMPUTE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Selective => "selective",
            Self::Full => "full",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == name)
    }

    fn token(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Selective => Some("sel"),
            Self::Full => Some("gc"),
        }
    }
}

/// A complete execution plan of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Plan {
    /// Data-parallel degree.
    pub dp: u32,
    /// Tensor-parallel degree (inside a node).
    pub tp: u32,
    /// Pipeline-parallel degree (number of stages).
    pub pp: u32,
    pub zero: ZeroStage,
    pub offload: Offload,
    /// Gradient-accumulation steps (pipeline micro-batches when pp > 1).
    pub ga: u32,
    /// Activation recomputation (`Full`: activation checkpointing).
    pub recompute: Recompute,
    /// Samples per GPU per micro-step.
    pub micro_batch: u32,
    /// Sequence parallelism (Korthikanti et al. 2022): the activations outside the
    /// tensor-parallel regions (layer norms, dropouts) sharded along the sequence
    /// between the TP ranks; each all-reduce becomes a reduce-scatter and an
    /// all-gather. Needs tp > 1.
    pub sp: bool,
    /// Virtual pipeline stages per rank (interleaved 1F1B; 1: none): each rank holds
    /// `vp` chunks of `layers / (pp * vp)` layers, which shrinks the bubble by `vp`
    /// for `vp` times the stage-to-stage messages. Needs pp > 1, `ga` a multiple of pp.
    pub vp: u32,
}

/// The memory/behaviour family of a plan, the granularity of the reference data's
/// measured limits (`max_micro_batch` in models.yaml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanFamily {
    /// Plain data parallelism (with gradient accumulation).
    Dp,
    /// Data parallelism with activation checkpointing.
    DpGc,
    /// ZeRO sharding without offload.
    ZeroDp,
    /// ZeRO with CPU offload.
    ZeroOffload,
    /// Tensor and/or pipeline parallelism (3-D).
    TpPp,
    /// 3-D with activation checkpointing.
    TpPpGc,
}

impl PlanFamily {
    pub const ALL: [PlanFamily; 6] = [Self::Dp, Self::DpGc, Self::ZeroDp, Self::ZeroOffload, Self::TpPp, Self::TpPpGc];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dp => "dp",
            Self::DpGc => "dp_gc",
            Self::ZeroDp => "zero_dp",
            Self::ZeroOffload => "zero_offload",
            Self::TpPp => "tp_pp",
            Self::TpPpGc => "tp_pp_gc",
        }
    }
}

impl fmt::Display for PlanFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a plan is not valid for a job on a number of GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanViolation {
    #[error("a parallel degree or batch factor is zero")]
    ZeroDegree,
    #[error("dp*tp*pp = {product} but the job has {gpus} GPUs")]
    GpuCount { product: u32, gpus: u32 },
    #[error("dp*micro_batch*ga = {product} but the global batch is {global_batch}")]
    GlobalBatch { product: u64, global_batch: u64 },
    #[error("tp {tp} does not divide the {heads} attention heads")]
    TpHeads { tp: u32, heads: u32 },
    #[error("tp {tp} does not divide the hidden size {hidden}")]
    TpHidden { tp: u32, hidden: u32 },
    #[error("pp {pp} does not divide the {layers} layers")]
    PpLayers { pp: u32, layers: u32 },
    #[error("ZeRO needs data parallelism (dp > 1) or offload")]
    ZeroWithoutDp,
    #[error("offload needs ZeRO stage 1 or higher")]
    OffloadWithoutZero,
    #[error("offloading parameters needs ZeRO stage 3")]
    ParamOffloadWithoutZero3,
    #[error("ZeRO stage {0} cannot be combined with pipeline parallelism (stage 1 at most)")]
    ZeroWithPipeline(u8),
    #[error("sequence parallelism needs tensor parallelism (tp > 1)")]
    SequenceParallelWithoutTp,
    #[error("virtual pipeline stages (vp {0}) need pipeline parallelism (pp > 1)")]
    InterleavingWithoutPipeline(u32),
    #[error("an interleaved pipeline needs the micro-batches (ga {ga}) to be a multiple of pp {pp}")]
    InterleavingMicroBatches { ga: u32, pp: u32 },
    #[error("pp*vp = {chunks} does not divide the {layers} layers")]
    VirtualStagesLayers { chunks: u32, layers: u32 },
}

impl Plan {
    /// Plain data parallelism on `dp` GPUs, one micro-step, no extras.
    pub fn data_parallel(dp: u32, micro_batch: u32) -> Self {
        Plan {
            dp,
            tp: 1,
            pp: 1,
            zero: ZeroStage::None,
            offload: Offload::None,
            ga: 1,
            recompute: Recompute::None,
            micro_batch,
            sp: false,
            vp: 1,
        }
    }

    /// Full activation checkpointing (`-gc`).
    pub fn checkpointing(&self) -> bool {
        self.recompute == Recompute::Full
    }

    /// Whether the plan uses a dimension beyond the paper's space (sequence parallelism,
    /// selective recompute, interleaving): a script runs one only where its
    /// `launch.supports` says so.
    pub fn uses_newer_dimensions(&self) -> bool {
        self.sp || self.recompute == Recompute::Selective || self.vp > 1
    }

    /// GPUs the plan occupies.
    pub fn gpus(&self) -> u32 {
        self.dp.saturating_mul(self.tp).saturating_mul(self.pp)
    }

    /// Samples per iteration (one optimizer step).
    pub fn global_batch(&self) -> u64 {
        u64::from(self.dp) * u64::from(self.micro_batch) * u64::from(self.ga)
    }

    pub fn family(&self) -> PlanFamily {
        match (self.tp * self.pp > 1, self.checkpointing()) {
            (true, false) => PlanFamily::TpPp,
            (true, true) => PlanFamily::TpPpGc,
            (false, _) if self.offload != Offload::None => PlanFamily::ZeroOffload,
            (false, _) if self.zero != ZeroStage::None => PlanFamily::ZeroDp,
            (false, true) => PlanFamily::DpGc,
            (false, false) => PlanFamily::Dp,
        }
    }

    /// Rules that hold whatever the job: degrees positive, ZeRO/offload consistent.
    pub fn check_shape(&self) -> Result<(), PlanViolation> {
        if [self.dp, self.tp, self.pp, self.ga, self.micro_batch, self.vp].contains(&0) {
            return Err(PlanViolation::ZeroDegree);
        }
        if self.zero != ZeroStage::None && self.dp == 1 && self.offload == Offload::None {
            return Err(PlanViolation::ZeroWithoutDp);
        }
        if self.offload != Offload::None && self.zero == ZeroStage::None {
            return Err(PlanViolation::OffloadWithoutZero);
        }
        if self.offload == Offload::OptimizerAndParams && self.zero != ZeroStage::Three {
            return Err(PlanViolation::ParamOffloadWithoutZero3);
        }
        if self.pp > 1 && self.zero > ZeroStage::One {
            return Err(PlanViolation::ZeroWithPipeline(self.zero.level()));
        }
        if self.sp && self.tp == 1 {
            return Err(PlanViolation::SequenceParallelWithoutTp);
        }
        if self.vp > 1 && self.pp == 1 {
            return Err(PlanViolation::InterleavingWithoutPipeline(self.vp));
        }
        if self.vp > 1 && !self.ga.is_multiple_of(self.pp) {
            return Err(PlanViolation::InterleavingMicroBatches { ga: self.ga, pp: self.pp });
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    /// The readable form: `dp4-tp2-pp1-mb2-ga1`, then `-vp2`.., `-z1`..`-z3`, `-offopt`
    /// or `-offall`, `-sp`, and `-sel` or `-gc` when they apply.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dp{}-tp{}-pp{}-mb{}-ga{}", self.dp, self.tp, self.pp, self.micro_batch, self.ga)?;
        if self.vp > 1 {
            write!(f, "-vp{}", self.vp)?;
        }
        if self.zero != ZeroStage::None {
            write!(f, "-z{}", self.zero.level())?;
        }
        if let Some(token) = self.offload.token() {
            write!(f, "-{token}")?;
        }
        if self.sp {
            f.write_str("-sp")?;
        }
        if let Some(token) = self.recompute.token() {
            write!(f, "-{token}")?;
        }
        Ok(())
    }
}

impl FromStr for Plan {
    type Err = ParseError;

    /// Parses the readable form. Tokens are separated by `-` and may come in any
    /// order; `dp`, `tp`, `pp`, `ga` and `vp` default to 1, `mb` is required; `gc`
    /// (full recompute) and `sel` (selective) exclude each other.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: String| ParseError::new("plan", s, why);
        let mut plan = Plan::data_parallel(1, 0);
        let mut seen_mb = false;
        let mut seen = Vec::new();
        for token in s.trim().split('-') {
            let key: String = token.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
            if seen.contains(&key) {
                return Err(err(format!("`{key}` is given twice")));
            }
            let digits = &token[key.len()..];
            let number = || -> Result<u32, ParseError> {
                unsigned::<u32>(digits)
                    .filter(|&n| n > 0)
                    .ok_or_else(|| err(format!("`{token}`: expected a positive integer after `{key}`")))
            };
            match key.as_str() {
                "dp" => plan.dp = number()?,
                "tp" => plan.tp = number()?,
                "pp" => plan.pp = number()?,
                "ga" => plan.ga = number()?,
                "vp" => plan.vp = number()?,
                "mb" => {
                    plan.micro_batch = number()?;
                    seen_mb = true;
                }
                "z" => {
                    plan.zero = unsigned::<u8>(digits)
                        .and_then(ZeroStage::from_level)
                        .ok_or_else(|| err(format!("`{token}`: expected a ZeRO stage z0..z3")))?;
                }
                "offopt" | "offall" | "gc" | "sel" | "sp" if !digits.is_empty() => {
                    return Err(err(format!("`{token}`: unexpected digits")));
                }
                "offopt" | "offall" if plan.offload != Offload::None => {
                    return Err(err("`offopt` and `offall` are both given".into()));
                }
                "gc" | "sel" if plan.recompute != Recompute::None => {
                    return Err(err("`gc` (full recompute) and `sel` (selective) are both given".into()));
                }
                "offopt" => plan.offload = Offload::Optimizer,
                "offall" => plan.offload = Offload::OptimizerAndParams,
                "gc" => plan.recompute = Recompute::Full,
                "sel" => plan.recompute = Recompute::Selective,
                "sp" => plan.sp = true,
                _ => {
                    return Err(err(format!(
                        "unknown token `{token}` (expected dpN, tpN, ppN, mbN, gaN, vpN, zN, offopt, offall, sp, sel, gc)"
                    )));
                }
            }
            seen.push(key);
        }
        if !seen_mb {
            return Err(err("the micro-batch `mbN` is missing".into()));
        }
        plan.check_shape().map_err(|v| err(v.to_string()))?;
        Ok(plan)
    }
}

/// `digits` as a number when they are ASCII digits only (no sign, as the schema says).
fn unsigned<T: FromStr>(digits: &str) -> Option<T> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

crate::string_serde!(
    Plan,
    "A complete execution plan, e.g. `dp4-tp2-pp1-mb2-ga1-z1-gc`.",
    r"^(dp|tp|pp|mb|ga|vp|z|offopt|offall|sp|sel|gc)[0-9]*(-(dp|tp|pp|mb|ga|vp|z|offopt|offall|sp|sel|gc)[0-9]*)*$"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// `data/plan-vectors.json`, shared with the Python package's tests.
    fn vectors() -> serde_json::Value {
        serde_json::from_str(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../data/plan-vectors.json"))).unwrap()
    }

    /// The plan a vector's `plan` object names.
    fn vector_plan(fields: &serde_json::Value) -> Plan {
        let number = |name: &str| u32::try_from(fields[name].as_u64().unwrap()).unwrap();
        Plan {
            dp: number("dp"),
            tp: number("tp"),
            pp: number("pp"),
            zero: ZeroStage::from_level(u8::try_from(number("zero")).unwrap()).unwrap(),
            offload: match fields["offload"].as_str().unwrap() {
                "none" => Offload::None,
                "optimizer" => Offload::Optimizer,
                "all" => Offload::OptimizerAndParams,
                other => panic!("offload {other} in data/plan-vectors.json"),
            },
            ga: number("ga"),
            recompute: Recompute::from_name(fields["recompute"].as_str().unwrap()).unwrap(),
            micro_batch: number("micro_batch"),
            sp: fields["sp"].as_bool().unwrap(),
            vp: number("vp"),
        }
    }

    #[test]
    fn the_shared_plan_vectors_parse_print_and_refuse_as_written() {
        let vectors = vectors();
        for case in vectors["accepted"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let plan: Plan = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(plan, vector_plan(&case["plan"]), "{text:?}");
            assert_eq!(plan.to_string(), case["canonical"].as_str().unwrap(), "{text:?}");
        }
        for case in vectors["rejected"].as_array().unwrap().iter().chain(vectors["python_only"].as_array().unwrap()) {
            let text = case["text"].as_str().unwrap();
            assert!(text.parse::<Plan>().is_err(), "{text:?} parsed, but {}", case["why"]);
        }
    }
}
