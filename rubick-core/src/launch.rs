//! The job contract: how a training script learns its plan and reports its speed.
//!
//! A `Job`'s versioned `launch` section says how to start it: an argv list whose
//! elements may hold placeholders (`{dp}`, `{gpus}`, `{metrics}`, ...), substituted
//! inside each element and never parsed by a shell (a name like `$(touch x)` stays
//! inert), an environment, a working directory, the checkpoint directory, the signal
//! that asks the job to checkpoint and exit, and how many iterations to warm up and
//! measure. Every job also gets `RUBICK_*` variables ([`environment`]) and a generated
//! DeepSpeed configuration ([`deepspeed_config`]). It reports JSON metric lines
//! ([`MetricLine`]). This module is the pure part of the contract (no processes):
//! the launch library that `rubick-profile` and `rubick-run` share executes it.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ValidationError, ensure};
use crate::plan::{Offload, Plan, Recompute};

mod context;
mod metrics;

pub use context::{LaunchContext, deepspeed_config, environment};
pub use metrics::{MetricLine, iteration_times, mean_sd, measured_iterations};

/// The version of the launch section this build understands.
pub const LAUNCH_VERSION: u32 = 1;

/// Every placeholder an argv element may hold.
pub const PLACEHOLDERS: [&str; 22] = [
    "dp",
    "tp",
    "pp",
    "zero",
    "offload",
    "ga",
    "gc",
    "recompute",
    "sp",
    "vp",
    "micro_batch",
    "gpus",
    "nodes",
    "node_rank",
    "gpus_per_node",
    "cpus",
    "cpus_per_process",
    "master_addr",
    "master_port",
    "deepspeed_config",
    "checkpoint_dir",
    "metrics",
];

/// The signal that asks a job to checkpoint and exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum StopSignal {
    #[default]
    #[serde(rename = "SIGUSR1")]
    Usr1,
    #[serde(rename = "SIGUSR2")]
    Usr2,
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGINT")]
    Int,
}

impl StopSignal {
    /// The signal's name, e.g. `SIGUSR1` (also `RUBICK_STOP_SIGNAL`).
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Usr1 => "SIGUSR1",
            StopSignal::Usr2 => "SIGUSR2",
            StopSignal::Term => "SIGTERM",
            StopSignal::Int => "SIGINT",
        }
    }
}

/// How to launch a job (the `launch` section of a `Job`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Launch {
    /// The contract's version (1).
    pub version: u32,
    /// argv: the program and its arguments; elements may hold `{placeholder}`s.
    pub command: Vec<String>,
    /// Extra environment variables (placeholders allowed in values).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: where the launcher runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Where the job saves and finds its checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_dir: Option<String>,
    #[serde(default)]
    pub stop_signal: StopSignal,
    /// Seconds a job may take to checkpoint and exit after the stop signal.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_s: f64,
    /// Iterations left out of a measurement.
    #[serde(default = "default_warmup")]
    pub warmup_iterations: u32,
    /// Iterations measured after the warm-up.
    #[serde(default = "default_measured")]
    pub measured_iterations: u32,
    /// A profiling run (`rubick-profile`) is killed, with its whole process group, after
    /// this many seconds. `rubick-run`'s runs train until done or stopped: no limit.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// The plan features the script implements; absent: every feature. Profiles, the
    /// selection, fits and the planner stay inside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supports: Option<PlanSupport>,
}

/// Plan features a job's script implements. Every field of the paper's dimensions left
/// out allows all of its values (`launch.supports: {}` is the same as no `supports`);
/// the newer dimensions (sequence parallelism, selective recompute, interleaving) are
/// allowed only where said, since a script written before them cannot know their flags.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlanSupport {
    /// Largest tensor-parallel degree (1: no tensor parallelism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tp: Option<u32>,
    /// Largest pipeline-parallel degree (1: no pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_pp: Option<u32>,
    /// ZeRO stages, 0 (plain data parallelism) to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero: Option<Vec<u8>>,
    /// Offload modes, as the `{offload}` placeholder names them: `none`, `optimizer`,
    /// `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<Vec<String>>,
    /// Activation checkpointing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointing: Option<bool>,
    /// Gradient accumulation (more than one micro-batch step per iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulation: Option<bool>,
    /// Sequence parallelism beside tensor parallelism; left out: not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_parallel: Option<bool>,
    /// Selective recompute (the attention core only); left out: not implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selective_recompute: Option<bool>,
    /// Most virtual pipeline stages per rank (an interleaved schedule); left out: 1, none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_vp: Option<u32>,
}

fn offload_name(offload: Offload) -> &'static str {
    match offload {
        Offload::None => "none",
        Offload::Optimizer => "optimizer",
        Offload::OptimizerAndParams => "all",
    }
}

impl PlanSupport {
    /// Why `plan` uses a feature the script does not implement; `None` when it does not.
    pub fn refusal(&self, plan: &Plan) -> Option<String> {
        if let Some(max) = self.max_tp.filter(|&m| plan.tp > m) {
            return Some(format!("tensor parallelism {} (supports.maxTp is {max})", plan.tp));
        }
        if let Some(max) = self.max_pp.filter(|&m| plan.pp > m) {
            return Some(format!("{} pipeline stages (supports.maxPp is {max})", plan.pp));
        }
        let zero = plan.zero.level();
        if self.zero.as_ref().is_some_and(|z| !z.contains(&zero)) {
            return Some(format!("ZeRO stage {zero} (supports.zero: {:?})", self.zero.as_deref().unwrap_or_default()));
        }
        let offload = offload_name(plan.offload);
        if self.offload.as_ref().is_some_and(|o| !o.iter().any(|x| x == offload)) {
            return Some(format!(
                "offload `{offload}` (supports.offload: {:?})",
                self.offload.as_deref().unwrap_or_default()
            ));
        }
        if plan.checkpointing() && self.checkpointing == Some(false) {
            return Some("activation checkpointing (supports.checkpointing is false)".into());
        }
        if plan.ga > 1 && self.accumulation == Some(false) {
            return Some(format!(
                "gradient accumulation over {} micro-batches (supports.accumulation is false)",
                plan.ga
            ));
        }
        if plan.sp && self.sequence_parallel != Some(true) {
            return Some("sequence parallelism (supports.sequenceParallel is not true)".into());
        }
        if plan.recompute == Recompute::Selective && self.selective_recompute != Some(true) {
            return Some("selective recompute (supports.selectiveRecompute is not true)".into());
        }
        let max_vp = self.max_vp.unwrap_or(1);
        if plan.vp > max_vp {
            return Some(format!("{} virtual pipeline stages per rank (supports.maxVp is {max_vp})", plan.vp));
        }
        None
    }

    pub fn allows(&self, plan: &Plan) -> bool {
        self.refusal(plan).is_none()
    }

    fn check(&self) -> Result<(), ValidationError> {
        for (field, v) in [("maxTp", self.max_tp), ("maxPp", self.max_pp), ("maxVp", self.max_vp)] {
            if let Some(v) = v {
                ensure(v >= 1, field, || format!("must be at least 1, got {v}"))?;
            }
        }
        if let Some(z) = &self.zero {
            ensure(!z.is_empty(), "zero", || "must list at least one stage".into())?;
            if let Some(bad) = z.iter().find(|&&s| s > 3) {
                return Err(ValidationError::new("zero", format!("ZeRO stages are 0 to 3, got {bad}")));
            }
        }
        if let Some(o) = &self.offload {
            ensure(!o.is_empty(), "offload", || "must list at least one mode (`none` for no offload)".into())?;
            if let Some(bad) = o.iter().find(|x| !Offload::ALL.iter().any(|m| offload_name(*m) == x.as_str())) {
                return Err(ValidationError::new(
                    "offload",
                    format!("`{bad}` is not an offload mode (expected none, optimizer or all)"),
                ));
            }
        }
        Ok(())
    }
}

/// The most warm-up or measured iterations a profile run may ask for.
pub const MAX_ITERATIONS: u32 = 1_000_000;

/// The longest duration any rubick setting may name: a week. Longer is a typo, and a
/// `Duration` cannot hold every float anyway.
pub const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// Checks a duration setting: finite, positive (or zero when `zero_ok`), at most
/// [`MAX_SECONDS`]; the error says the range.
pub fn check_seconds(value: f64, zero_ok: bool) -> Result<(), String> {
    let low_ok = if zero_ok { value >= 0.0 } else { value > 0.0 };
    if value.is_finite() && low_ok && value <= MAX_SECONDS {
        Ok(())
    } else {
        let low = if zero_ok { "0" } else { "above 0" };
        Err(format!(
            "must be a number of seconds from {low} to {MAX_SECONDS} (a week), got {}",
            crate::limits::shown(value)
        ))
    }
}

/// `seconds` as a `Duration`, clamped to 0..=[`MAX_SECONDS`] (NaN: 0): never a panic,
/// whatever a state written by an older version holds.
pub fn duration(seconds: f64) -> std::time::Duration {
    let s = if seconds.is_nan() { 0.0 } else { seconds.clamp(0.0, MAX_SECONDS) };
    std::time::Duration::from_secs_f64(s)
}

fn default_stop_timeout() -> f64 {
    120.0
}
fn default_warmup() -> u32 {
    3
}
fn default_measured() -> u32 {
    10
}
fn default_timeout() -> f64 {
    1800.0
}

/// `text` with each `{name}` replaced by `value(name)`; `{{` and `}}` are literal
/// braces. The one scanner of placeholders: checking and substituting share it.
fn expand(text: &str, mut value: impl FnMut(&str) -> Result<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let (c, after) = (rest.as_bytes()[i] as char, &rest[i + 1..]);
        if after.starts_with(c) {
            out.push(c);
            rest = &after[1..];
            continue;
        }
        if c == '}' {
            return Err(format!("`{text}`: a `}}` without its `{{` (write `}}}}` for a literal one)"));
        }
        let end = after.find('}').ok_or_else(|| format!("`{text}`: a `{{` without its `}}`"))?;
        out.push_str(&value(&after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Launch {
    /// Rules of a launch section; errors name the field relative to it.
    pub fn check(&self) -> Result<(), ValidationError> {
        ensure(self.version == LAUNCH_VERSION, "version", || {
            format!("this rubick understands launch version {LAUNCH_VERSION}, got {}", self.version)
        })?;
        ensure(!self.command.is_empty(), "command", || "must name the program to run".into())?;
        let fields = self
            .command
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("command[{i}]"), a))
            .chain(self.env.iter().map(|(k, v)| (format!("env.{k}"), v)));
        for (field, text) in fields {
            // A NUL cannot be passed to a process; other control characters (but tab and
            // newline) are a paste accident.
            if let Some(c) = text.chars().find(|c| *c == '\0' || (c.is_control() && !matches!(c, '\t' | '\n'))) {
                return Err(ValidationError::new(&field, format!("{c:?}: a control character")));
            }
            let known = |name: &str| match PLACEHOLDERS.contains(&name) {
                true => Ok(String::new()),
                false => {
                    Err(format!("unknown placeholder `{{{name}}}` (expected one of: {})", PLACEHOLDERS.join(", ")))
                }
            };
            expand(text, known).map_err(|e| ValidationError::new(&field, e))?;
        }
        for (field, v) in [("stopTimeoutS", self.stop_timeout_s), ("timeoutS", self.timeout_s)] {
            check_seconds(v, false).map_err(|why| ValidationError::new(field, why))?;
        }
        for (field, v) in
            [("warmupIterations", self.warmup_iterations), ("measuredIterations", self.measured_iterations)]
        {
            ensure(v <= MAX_ITERATIONS, field, || format!("at most {MAX_ITERATIONS} iterations, got {v}"))?;
        }
        for key in self.env.keys() {
            ensure(
                !key.is_empty() && !key.contains('=') && !key.chars().any(char::is_control),
                &format!("env.{}", key.escape_debug()),
                || "an environment variable's name: not empty, no `=`, no control character".into(),
            )?;
        }
        ensure(self.measured_iterations >= 1, "measuredIterations", || "must be at least 1".into())?;
        if let Some(supports) = &self.supports {
            supports.check().map_err(|e| e.within("supports"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch section running `command` (the other tests of the contract use it too).
    pub(super) fn launch(command: &[&str]) -> Launch {
        serde_yaml_ng::from_str(&format!("version: 1\ncommand: {command:?}\n")).unwrap()
    }

    #[test]
    fn an_unknown_placeholder_is_an_error_naming_it() {
        let e = launch(&["python", "{dp}", "{nproc}"]).check().unwrap_err();
        assert!(e.to_string().contains("command[2]") && e.to_string().contains("{nproc}"), "{e}");
        assert!(launch(&["a{b"]).check().is_err());
        assert!(launch(&[]).check().is_err());
    }

    #[test]
    fn supports_keeps_plans_inside_the_scripts_features() {
        let mut l = launch(&["python", "train.py"]);
        l.supports = Some(
            serde_yaml_ng::from_str("{ maxTp: 1, maxPp: 1, zero: [0, 1], offload: [none], accumulation: true }")
                .unwrap(),
        );
        l.check().unwrap();
        let s = l.supports.as_ref().unwrap();
        assert!(s.allows(&"dp2-mb4-ga2-z1".parse().unwrap()));
        assert!(s.allows(&"dp2-mb4-ga2-gc".parse().unwrap()), "checkpointing left out: allowed");
        for (plan, says) in [
            ("dp1-tp2-mb4", "tensor parallelism 2"),
            ("dp1-pp2-mb4", "2 pipeline stages"),
            ("dp2-mb4-z2", "ZeRO stage 2"),
            ("dp2-mb4-z1-offopt", "offload `optimizer`"),
        ] {
            let why = s.refusal(&plan.parse().unwrap()).unwrap_or_default();
            assert!(why.contains(says), "{plan}: {why}");
        }
        for (bad, field) in [
            ("{ maxTp: 0 }", "supports.maxTp"),
            ("{ zero: [4] }", "supports.zero"),
            ("{ zero: [] }", "supports.zero"),
            ("{ offload: [cpu] }", "supports.offload"),
        ] {
            l.supports = Some(serde_yaml_ng::from_str(bad).unwrap());
            let e = l.check().unwrap_err();
            assert!(e.to_string().contains(field), "{bad}: {e}");
        }
        assert!(serde_yaml_ng::from_str::<PlanSupport>("{ tp: 2 }").is_err(), "unknown fields are refused");
    }

    #[test]
    fn the_newer_dimensions_run_only_where_supports_says_so() {
        let plan: Plan = "dp1-tp2-pp2-mb1-ga4-vp2-sp-sel".parse().unwrap();
        // No supports, or one silent on them: a script written before them is never given them.
        let silent = PlanSupport::default();
        let why = silent.refusal(&plan).unwrap_or_default();
        assert!(why.contains("sequence parallelism"), "{why}");
        assert!(silent.allows(&"dp1-tp2-pp2-mb1-ga4-gc".parse().unwrap()), "the paper's dimensions stay allowed");
        let said: PlanSupport =
            serde_yaml_ng::from_str("{ sequenceParallel: true, selectiveRecompute: true, maxVp: 2 }").unwrap();
        assert!(said.allows(&plan));
        for (plan, says) in [
            ("dp1-tp2-pp2-mb1-ga4-vp4", "4 virtual pipeline stages"),
            ("dp1-tp2-pp1-mb1-ga4-sel", "selective recompute"),
        ] {
            let only_sp: PlanSupport = serde_yaml_ng::from_str("{ sequenceParallel: true }").unwrap();
            let why = only_sp.refusal(&plan.parse().unwrap()).unwrap_or_default();
            assert!(why.contains(says), "{plan}: {why}");
        }
        // The run sees them as placeholders and variables.
        let ctx = LaunchContext {
            job: "j".into(),
            plan,
            nodes: 1,
            node_rank: 0,
            gpus_per_node: 4,
            cpus: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            deepspeed_config: String::new(),
            checkpoint_dir: String::new(),
            metrics: String::new(),
            visible_devices: Vec::new(),
        };
        assert_eq!(ctx.substitute("{recompute} {sp} {vp} {gc}").unwrap(), "selective 1 2 0");
        let env = environment(&ctx, None).unwrap();
        assert_eq!(env["RUBICK_PLAN"], "dp1-tp2-pp2-mb1-ga4-vp2-sp-sel");
        assert_eq!(
            (env["RUBICK_RECOMPUTE"].as_str(), env["RUBICK_SP"].as_str(), env["RUBICK_VP"].as_str()),
            ("selective", "1", "2")
        );
        assert_eq!(env["RUBICK_GC"], "0", "RUBICK_GC is full recompute alone");
    }
}
