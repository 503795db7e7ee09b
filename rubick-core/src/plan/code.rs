//! The plan codes of the authors' reference data ([`PlanCode`]: `ga`, `gc`, `zero-dp`,
//! `zero-offload`, or three digits P T D) and what a job may ask for ([`PlanRequest`]: a
//! complete plan or a code).

use std::fmt;
use std::str::FromStr;

use super::{Offload, Plan, PlanFamily, Recompute, ZeroStage};
use crate::error::ParseError;

/// A plan code of the authors' reference data: a family, and for 3-D plans the
/// pipeline, tensor and data-parallel degrees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlanCode {
    /// `ga`: data parallelism with gradient accumulation.
    Ga,
    /// `gc`: data parallelism with activation checkpointing.
    Gc,
    /// `zero-dp`: ZeRO stage 2.
    ZeroDp,
    /// `zero-offload`: ZeRO stage 2 with the optimizer on the CPU.
    ZeroOffload,
    /// Three digits P T D: pipeline, tensor and data-parallel degree.
    ThreeD { pp: u32, tp: u32, dp: u32 },
}

impl PlanCode {
    /// The family of the plan this code resolves to.
    pub fn family(&self) -> PlanFamily {
        match self {
            Self::Ga => PlanFamily::Dp,
            Self::Gc => PlanFamily::DpGc,
            Self::ZeroDp => PlanFamily::ZeroDp,
            Self::ZeroOffload => PlanFamily::ZeroOffload,
            Self::ThreeD { .. } => PlanFamily::TpPp,
        }
    }

    /// GPUs the code implies, where it fixes them (3-D codes only).
    pub fn gpus(&self) -> Option<u32> {
        match self {
            Self::ThreeD { pp, tp, dp } => Some(pp * tp * dp),
            _ => None,
        }
    }

    /// The reference code of a complete plan, if the reference data has its kind:
    /// `ga`, `gc`, `zero-dp` (ZeRO-2), `zero-offload` (ZeRO-2 + optimizer offload), or
    /// P T D for tensor/pipeline plans without ZeRO, offload or checkpointing. On one
    /// GPU `ga` and `zero-dp` are the same plan; this returns `ga`.
    pub fn of(plan: &Plan) -> Option<PlanCode> {
        if plan.tp * plan.pp > 1 {
            let plain = plan.recompute == Recompute::None
                && plan.zero == ZeroStage::None
                && plan.offload == Offload::None
                && !plan.uses_newer_dimensions();
            return plain.then_some(Self::ThreeD { pp: plan.pp, tp: plan.tp, dp: plan.dp });
        }
        if plan.uses_newer_dimensions() {
            return None;
        }
        match (plan.zero, plan.offload, plan.recompute) {
            (ZeroStage::None, Offload::None, Recompute::None) => Some(Self::Ga),
            (ZeroStage::None, Offload::None, Recompute::Full) => Some(Self::Gc),
            (ZeroStage::Two, Offload::None, Recompute::None) => Some(Self::ZeroDp),
            (ZeroStage::Two, Offload::Optimizer, Recompute::None) => Some(Self::ZeroOffload),
            _ => None,
        }
    }

    /// The plan skeleton on `gpus` GPUs: degrees, ZeRO, offload and checkpointing,
    /// with micro-batch 1 and accumulation 1 (not yet fitted to a global batch).
    pub fn skeleton(&self, gpus: u32) -> Plan {
        let mut plan = Plan::data_parallel(gpus, 1);
        match *self {
            Self::Ga => {}
            Self::Gc => plan.recompute = Recompute::Full,
            Self::ZeroDp => plan.zero = ZeroStage::Two,
            Self::ZeroOffload => {
                plan.zero = ZeroStage::Two;
                plan.offload = Offload::Optimizer;
            }
            Self::ThreeD { pp, tp, dp } => {
                plan.dp = dp;
                plan.tp = tp;
                plan.pp = pp;
            }
        }
        // The reference data runs ZeRO-2 on one GPU too; stage 2 on one rank shards
        // nothing, so it is stage 0 there unless offload needs it.
        if plan.dp == 1 && plan.offload == Offload::None {
            plan.zero = ZeroStage::None;
        }
        plan
    }
}

impl fmt::Display for PlanCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ga => f.write_str("ga"),
            Self::Gc => f.write_str("gc"),
            Self::ZeroDp => f.write_str("zero-dp"),
            Self::ZeroOffload => f.write_str("zero-offload"),
            Self::ThreeD { pp, tp, dp } if *pp < 10 && *tp < 10 && *dp < 10 => {
                write!(f, "{pp}{tp}{dp}")
            }
            Self::ThreeD { pp, tp, dp } => write!(f, "pp{pp}-tp{tp}-dp{dp}"),
        }
    }
}

impl FromStr for PlanCode {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let code = s.trim();
        match code {
            "ga" => return Ok(Self::Ga),
            "gc" => return Ok(Self::Gc),
            "zero-dp" => return Ok(Self::ZeroDp),
            "zero-offload" => return Ok(Self::ZeroOffload),
            _ => {}
        }
        // The long form `Display` writes for degrees of 10 or more: ppP-tpT-dpD.
        let long = code.strip_prefix("pp").and_then(|rest| {
            let (pp, rest) = rest.split_once("-tp")?;
            let (tp, dp) = rest.split_once("-dp")?;
            Some((pp.parse::<u32>().ok()?, tp.parse::<u32>().ok()?, dp.parse::<u32>().ok()?))
        });
        if let Some((pp, tp, dp)) = long {
            if pp == 0 || tp == 0 || dp == 0 {
                return Err(ParseError::new("plan code", s, "a degree of 0 in ppP-tpT-dpD".into()));
            }
            return Ok(Self::ThreeD { pp, tp, dp });
        }
        let digits: Vec<u32> = code.chars().filter_map(|c| c.to_digit(10)).collect();
        if code.len() == 3 && digits.len() == 3 {
            if digits.contains(&0) {
                return Err(ParseError::new("plan code", s, "a degree of 0 in P T D".into()));
            }
            return Ok(Self::ThreeD { pp: digits[0], tp: digits[1], dp: digits[2] });
        }
        Err(ParseError::new(
            "plan code",
            s,
            "expected ga, gc, zero-dp, zero-offload, three digits P T D (e.g. 248) or ppP-tpT-dpD (e.g. pp2-tp4-dp16)"
                .into(),
        ))
    }
}

/// A plan as a user may write it in a job: a complete plan or a reference code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlanRequest {
    Exact(Plan),
    Code(PlanCode),
}

impl PlanRequest {
    pub fn family(&self) -> PlanFamily {
        match self {
            Self::Exact(plan) => plan.family(),
            Self::Code(code) => code.family(),
        }
    }
}

impl fmt::Display for PlanRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(plan) => plan.fmt(f),
            Self::Code(code) => code.fmt(f),
        }
    }
}

impl FromStr for PlanRequest {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(code) = s.parse::<PlanCode>() {
            return Ok(Self::Code(code));
        }
        match s.parse::<Plan>() {
            Ok(plan) => Ok(Self::Exact(plan)),
            Err(e) if s.contains("mb") || s.contains("dp") => Err(e),
            Err(_) => Err(ParseError::new(
                "plan",
                s,
                "expected a plan like dp4-tp2-pp1-mb2-ga1 or a code (ga, gc, zero-dp, zero-offload, 248)".into(),
            )),
        }
    }
}

crate::string_serde!(
    PlanCode,
    "A reference plan code: ga, gc, zero-dp, zero-offload or P T D digits.",
    r"^(ga|gc|zero-dp|zero-offload|[1-9]{3})$"
);
crate::string_serde!(
    PlanRequest,
    "A complete plan (dp4-tp2-pp1-mb2-ga1) or a reference plan code (ga, gc, zero-dp, zero-offload, 248).",
    r"^\S+$"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ZeroStage;

    #[test]
    fn reference_codes_parse_and_print() {
        for code in ["ga", "gc", "zero-dp", "zero-offload", "248", "151"] {
            assert_eq!(code.parse::<PlanCode>().unwrap().to_string(), code);
        }
        assert_eq!("248".parse::<PlanCode>().unwrap(), PlanCode::ThreeD { pp: 2, tp: 4, dp: 8 });
        assert!("208".parse::<PlanCode>().is_err());
        assert!("zero".parse::<PlanCode>().is_err());
    }

    #[test]
    fn every_code_display_writes_parses_back() {
        for code in [
            PlanCode::Ga,
            PlanCode::Gc,
            PlanCode::ZeroDp,
            PlanCode::ZeroOffload,
            PlanCode::ThreeD { pp: 2, tp: 4, dp: 8 },
            PlanCode::ThreeD { pp: 2, tp: 1, dp: 16 },
            PlanCode::ThreeD { pp: 12, tp: 8, dp: 64 },
        ] {
            assert_eq!(code.to_string().parse::<PlanCode>().unwrap(), code, "{code}");
        }
        assert_eq!("pp2-tp1-dp16".parse::<PlanCode>().unwrap(), PlanCode::ThreeD { pp: 2, tp: 1, dp: 16 });
        assert!("pp0-tp1-dp16".parse::<PlanCode>().is_err());
        assert!("pp2-tp1".parse::<PlanCode>().is_err());
    }

    #[test]
    fn a_codes_skeleton_maps_back_to_the_code() {
        let codes = [
            PlanCode::Ga,
            PlanCode::Gc,
            PlanCode::ZeroDp,
            PlanCode::ZeroOffload,
            PlanCode::ThreeD { pp: 2, tp: 4, dp: 2 },
            PlanCode::ThreeD { pp: 1, tp: 8, dp: 1 },
        ];
        for code in codes {
            for gpus in [2, 4, 8, 16] {
                let plan = code.skeleton(gpus);
                if plan.gpus() != gpus {
                    continue;
                }
                assert_eq!(PlanCode::of(&plan), Some(code), "{code} on {gpus}");
            }
        }
        // ZeRO-1 and ZeRO-3 are not kinds the reference measured.
        let mut plan = PlanCode::ZeroDp.skeleton(8);
        plan.zero = ZeroStage::Three;
        assert_eq!(PlanCode::of(&plan), None);
    }
}
