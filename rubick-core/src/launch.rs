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

/// Where and how one run of a job is launched: the values of the placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchContext {
    pub job: String,
    pub plan: Plan,
    pub nodes: u32,
    /// This node's rank among `nodes` (0 on one node; one launcher per node, each
    /// with its own, on several).
    pub node_rank: u32,
    /// The most GPUs the run has on one node: its worker processes per node (one per
    /// GPU; on a CPU node the plan's "GPUs" are its worker processes).
    pub gpus_per_node: u32,
    /// The run's CPU cores, every node's together (`{cpus}`, `RUBICK_CPUS`); 0: not said.
    pub cpus: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub deepspeed_config: String,
    pub checkpoint_dir: String,
    pub metrics: String,
    /// GPU indices on this node (`CUDA_VISIBLE_DEVICES`); empty on CPU or where the
    /// backend places GPUs itself (the variable is then not set).
    pub visible_devices: Vec<u32>,
}

impl LaunchContext {
    /// The cores of one worker process, what its intra-op threads should be
    /// (`OMP_NUM_THREADS`, `torch.set_num_threads`): the run's cores per node (`cpus`
    /// over `nodes`) over the processes of a node (`gpus_per_node`), at least 1; 0 when
    /// the run's cores are not said. `{cpus}` is the run's cores in all: given to every
    /// worker as its threads, each of dp2's two workers on 2 cores ran 2 threads (issue
    /// 42: 2.9x slower than predicted). `{cpus_per_process}`, `RUBICK_CPUS_PER_PROCESS`.
    pub fn cpus_per_process(&self) -> u32 {
        if self.cpus == 0 {
            return 0;
        }
        let processes = u64::from(self.nodes.max(1)) * u64::from(self.gpus_per_node.max(1));
        u32::try_from(u64::from(self.cpus) / processes).unwrap_or(u32::MAX).max(1)
    }

    /// The value of a placeholder, if it is one.
    pub fn value(&self, name: &str) -> Option<String> {
        let p = &self.plan;
        Some(match name {
            "dp" => p.dp.to_string(),
            "tp" => p.tp.to_string(),
            "pp" => p.pp.to_string(),
            "zero" => p.zero.level().to_string(),
            "offload" => offload_name(p.offload).to_owned(),
            "ga" => p.ga.to_string(),
            "gc" => u8::from(p.checkpointing()).to_string(),
            "recompute" => p.recompute.as_str().to_owned(),
            "sp" => u8::from(p.sp).to_string(),
            "vp" => p.vp.to_string(),
            "micro_batch" => p.micro_batch.to_string(),
            "gpus" => p.gpus().to_string(),
            "nodes" => self.nodes.to_string(),
            "node_rank" => self.node_rank.to_string(),
            "gpus_per_node" => self.gpus_per_node.to_string(),
            "cpus" => self.cpus.to_string(),
            "cpus_per_process" => self.cpus_per_process().to_string(),
            "master_addr" => self.master_addr.clone(),
            "master_port" => self.master_port.to_string(),
            "deepspeed_config" => self.deepspeed_config.clone(),
            "checkpoint_dir" => self.checkpoint_dir.clone(),
            "metrics" => self.metrics.clone(),
            _ => return None,
        })
    }

    /// `text` with its placeholders replaced (inside the element: no shell, no word
    /// splitting); an unknown one is an error naming it.
    pub fn substitute(&self, text: &str) -> Result<String, String> {
        expand(text, |name| self.value(name).ok_or_else(|| format!("unknown placeholder `{{{name}}}`")))
    }

    /// The argv of `launch` for this run.
    pub fn argv(&self, launch: &Launch) -> Result<Vec<String>, String> {
        launch.command.iter().map(|a| self.substitute(a)).collect()
    }
}

/// The environment every job gets: `RUBICK_JOB`, `RUBICK_PLAN` (readable form), one
/// variable per plan field, `RUBICK_GPUS`, `RUBICK_NODES`, `RUBICK_NODE_RANK`, `RUBICK_CPUS`,
/// `RUBICK_CPUS_PER_PROCESS` ([`LaunchContext::cpus_per_process`]), `RUBICK_METRICS`, `RUBICK_CHECKPOINT_DIR`, `RUBICK_DEEPSPEED_CONFIG`,
/// `CUDA_VISIBLE_DEVICES` (when the context names devices), `RUBICK_STOP_SIGNAL` and
/// `RUBICK_STOP_TIMEOUT_S` (with a launch section); then the launch section's own `env` (substituted).
pub fn environment(ctx: &LaunchContext, launch: Option<&Launch>) -> Result<BTreeMap<String, String>, String> {
    let p = &ctx.plan;
    let mut env: BTreeMap<String, String> = [
        ("RUBICK_JOB", ctx.job.clone()),
        ("RUBICK_PLAN", p.to_string()),
        ("RUBICK_GPUS", p.gpus().to_string()),
        ("RUBICK_NODES", ctx.nodes.to_string()),
        ("RUBICK_NODE_RANK", ctx.node_rank.to_string()),
        ("RUBICK_CPUS", ctx.cpus.to_string()),
        ("RUBICK_CPUS_PER_PROCESS", ctx.cpus_per_process().to_string()),
        ("RUBICK_METRICS", ctx.metrics.clone()),
        ("RUBICK_CHECKPOINT_DIR", ctx.checkpoint_dir.clone()),
        ("RUBICK_DEEPSPEED_CONFIG", ctx.deepspeed_config.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    // A scheduler that places GPUs itself (Slurm) sets it; so does a CPU run's absence of one.
    if !ctx.visible_devices.is_empty() {
        let devices: Vec<String> = ctx.visible_devices.iter().map(ToString::to_string).collect();
        env.insert("CUDA_VISIBLE_DEVICES".to_owned(), devices.join(","));
    }
    for (var, field) in [
        ("RUBICK_DP", "dp"),
        ("RUBICK_TP", "tp"),
        ("RUBICK_PP", "pp"),
        ("RUBICK_ZERO", "zero"),
        ("RUBICK_OFFLOAD", "offload"),
        ("RUBICK_GA", "ga"),
        ("RUBICK_GC", "gc"),
        ("RUBICK_RECOMPUTE", "recompute"),
        ("RUBICK_SP", "sp"),
        ("RUBICK_VP", "vp"),
        ("RUBICK_MICRO_BATCH", "micro_batch"),
    ] {
        env.insert(var.to_owned(), ctx.value(field).unwrap_or_default());
    }
    if let Some(l) = launch {
        env.insert("RUBICK_STOP_SIGNAL".to_owned(), l.stop_signal.name().to_owned());
        // How long the run has to checkpoint and exit (`python -m rubick.torchrun` gives
        // torchrun's shutdown as long).
        env.insert("RUBICK_STOP_TIMEOUT_S".to_owned(), format!("{}", l.stop_timeout_s));
    }
    for (k, v) in launch.map(|l| &l.env).into_iter().flatten() {
        env.insert(k.clone(), ctx.substitute(v)?);
    }
    Ok(env)
}

/// The DeepSpeed configuration of a plan: batch sizes, ZeRO stage, optimizer (and
/// parameter) offload to the CPU, bf16.
pub fn deepspeed_config(plan: &Plan) -> serde_json::Value {
    let mut zero = serde_json::json!({ "stage": plan.zero.level() });
    if plan.offload != Offload::None {
        zero["offload_optimizer"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    if plan.offload == Offload::OptimizerAndParams {
        zero["offload_param"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    serde_json::json!({
        "train_batch_size": plan.global_batch(),
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.ga,
        "zero_optimization": zero,
        "bf16": { "enabled": true },
        "activation_checkpointing": { "partition_activations": false, "contiguous_memory_optimization": false },
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": false,
    })
}

/// One line of the metric protocol (`{"rubick":1,...}`). Its numbers may be Python's
/// `NaN`, `Infinity` and `-Infinity`, which `json.dumps` writes by default (a diverging
/// job's loss): see [`MetricLine::parse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetricLine {
    /// A finished iteration.
    Iteration {
        rubick: u32,
        iter: u64,
        #[serde(deserialize_with = "number")]
        iter_time_s: f64,
        #[serde(default, deserialize_with = "optional_number")]
        forward_s: Option<f64>,
        #[serde(default, deserialize_with = "optional_number")]
        backward_sync_s: Option<f64>,
        #[serde(default, deserialize_with = "optional_number")]
        optimizer_s: Option<f64>,
        #[serde(default)]
        samples: Option<u64>,
        #[serde(default, deserialize_with = "optional_number")]
        peak_memory_gib: Option<f64>,
        /// The training loss as the script reported it: NaN or an infinity when the job
        /// diverges (never a time: nothing fits or plans on it).
        #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "optional_number")]
        loss: Option<f64>,
    },
    /// `checkpointed` (at `iter`; `save_s`: the seconds its save took, when the script
    /// says) or `oom`.
    Event {
        rubick: u32,
        event: String,
        #[serde(default)]
        iter: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "optional_number")]
        save_s: Option<f64>,
    },
}

/// Python's names of the numbers JSON has none for, as `json.dumps` writes them.
const NON_FINITE: [(&str, f64); 3] = [("-Infinity", f64::NEG_INFINITY), ("Infinity", f64::INFINITY), ("NaN", f64::NAN)];

/// `line` with Python's bare `NaN`, `Infinity` and `-Infinity` (outside strings) quoted,
/// so that a JSON parser takes them, as strings [`number`] reads back.
fn quote_non_finite(line: &str) -> std::borrow::Cow<'_, str> {
    if !NON_FINITE.iter().any(|(name, _)| line.contains(name)) {
        return line.into();
    }
    let mut out = String::with_capacity(line.len() + 8);
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if !in_string && let Some((name, _)) = NON_FINITE.iter().find(|(name, _)| rest.starts_with(name)) {
            out.push('"');
            out.push_str(name);
            out.push('"');
            rest = &rest[name.len()..];
            continue;
        }
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.into()
}

/// A JSON number, or one of Python's non-finite names that [`quote_non_finite`] quoted.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Finite(f64),
    Named(String),
}

impl Number {
    fn value<E: serde::de::Error>(self) -> Result<f64, E> {
        match self {
            Number::Finite(v) => Ok(v),
            Number::Named(name) => NON_FINITE
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| E::custom(format!("expected a number, got `{name}`"))),
        }
    }
}

fn number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Number::deserialize(d)?.value()
}

fn optional_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<Number>::deserialize(d)?.map(Number::value).transpose()
}

impl MetricLine {
    /// The protocol line `line` holds, or `None` for any other output (which a
    /// reader counts and otherwise ignores). Every reader of metric lines reads them
    /// here. Python's `NaN`, `Infinity` and `-Infinity` are numbers: a line whose loss
    /// is one is still its iteration (a diverging job is not idle), and keeps the loss;
    /// but no time is ever one. An iteration needs a finite, positive `iter_time_s` (a
    /// line without one is not the protocol); a phase time, peak memory or `save_s`
    /// that is not finite and non-negative is left out, as if not said.
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"rubick\"") {
            return None;
        }
        let mut parsed: MetricLine = serde_json::from_str(&quote_non_finite(line)).ok()?;
        let measured = |v: &mut Option<f64>| {
            if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
                *v = None;
            }
        };
        match &mut parsed {
            MetricLine::Iteration {
                rubick: 1,
                iter_time_s,
                forward_s,
                backward_sync_s,
                optimizer_s,
                peak_memory_gib,
                ..
            } if iter_time_s.is_finite() && *iter_time_s > 0.0 => {
                for v in [forward_s, backward_sync_s, optimizer_s, peak_memory_gib] {
                    measured(v);
                }
            }
            MetricLine::Event { rubick: 1, event, save_s, .. } if event == "checkpointed" || event == "oom" => {
                measured(save_s);
            }
            _ => return None,
        }
        Some(parsed)
    }
}

/// The measured iterations among a run's metric lines: the iteration lines after the
/// first `warmup` of them (by order, since a resumed run numbers on), at most `measured`.
pub fn measured_iterations(lines: &[MetricLine], warmup: u32, measured: Option<u32>) -> Vec<&MetricLine> {
    lines
        .iter()
        .filter(|m| matches!(m, MetricLine::Iteration { .. }))
        .skip(warmup as usize)
        .take(measured.map_or(usize::MAX, |m| m as usize))
        .collect()
}

/// The iteration times of metric lines.
pub fn iteration_times<'a>(lines: impl IntoIterator<Item = &'a MetricLine>) -> Vec<f64> {
    lines
        .into_iter()
        .filter_map(|m| if let MetricLine::Iteration { iter_time_s, .. } = m { Some(*iter_time_s) } else { None })
        .collect()
}

/// Mean and sample standard deviation (0 for one value); `None` for none.
pub fn mean_sd(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = if values.len() > 1 {
        (values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Some((mean, sd))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> LaunchContext {
        LaunchContext {
            job: "$(touch x)".into(),
            plan: "dp2-tp2-pp1-mb2-ga4-z1".parse().unwrap(),
            nodes: 1,
            node_rank: 0,
            gpus_per_node: 4,
            cpus: 16,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            deepspeed_config: "/s/ds.json".into(),
            checkpoint_dir: "/s/ckpt dir".into(),
            metrics: "/s/metrics.jsonl".into(),
            visible_devices: vec![2, 3, 4, 5],
        }
    }

    fn launch(command: &[&str]) -> Launch {
        serde_yaml_ng::from_str(&format!("version: 1\ncommand: {command:?}\n")).unwrap()
    }

    #[test]
    fn placeholders_are_substituted_inside_elements_and_never_shell_parsed() {
        let l = launch(&[
            "torchrun",
            "--nproc-per-node={gpus_per_node}",
            "train.py",
            "--ckpt",
            "{checkpoint_dir}",
            "{{literal}}",
        ]);
        l.check().unwrap();
        let argv = ctx().argv(&l).unwrap();
        assert_eq!(argv, ["torchrun", "--nproc-per-node=4", "train.py", "--ckpt", "/s/ckpt dir", "{literal}"]);
        let env = environment(&ctx(), Some(&l)).unwrap();
        assert_eq!(env["RUBICK_JOB"], "$(touch x)");
        assert_eq!(env["RUBICK_PLAN"], "dp2-tp2-pp1-mb2-ga4-z1");
        assert_eq!(env["RUBICK_ZERO"], "1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,3,4,5");
    }

    #[test]
    fn threads_per_process_divide_a_nodes_cores_among_its_workers() {
        // issue 42: `OMP_NUM_THREADS: "{cpus}"` gave each of dp2's two workers on 2 cores
        // 2 threads. A dp2 plan on 2 cores: 1 thread per worker.
        let mut l = launch(&["torchrun", "--nproc-per-node={gpus_per_node}", "train.py", "-j{cpus_per_process}"]);
        l.env.insert("OMP_NUM_THREADS".into(), "{cpus_per_process}".into());
        l.check().unwrap();
        let dp2 = LaunchContext { plan: "dp2-mb8-ga1".parse().unwrap(), gpus_per_node: 2, cpus: 2, ..ctx() };
        let env = environment(&dp2, Some(&l)).unwrap();
        let threads = |env: &BTreeMap<String, String>| {
            [&env["RUBICK_CPUS"], &env["RUBICK_CPUS_PER_PROCESS"], &env["OMP_NUM_THREADS"]].map(|v| v.to_owned())
        };
        assert_eq!(threads(&env), ["2", "1", "1"]);
        assert_eq!(dp2.argv(&l).unwrap(), ["torchrun", "--nproc-per-node=2", "train.py", "-j1"]);
        // Per node: 2 nodes of 4 GPUs, 64 cores in all, 8 per worker; 16 cores on 4: 4.
        let wide = LaunchContext { plan: "dp8-mb1-ga1".parse().unwrap(), nodes: 2, cpus: 64, ..ctx() };
        assert_eq!(threads(&environment(&wide, Some(&l)).unwrap()), ["64", "8", "8"]);
        assert_eq!(ctx().value("cpus_per_process").as_deref(), Some("4"));
        // Fewer cores than workers: 1 each, never 0; no cores said: 0 (not said).
        assert_eq!(LaunchContext { cpus: 3, ..ctx() }.cpus_per_process(), 1);
        assert_eq!(LaunchContext { cpus: 0, ..ctx() }.cpus_per_process(), 0);
        assert_eq!(LaunchContext { cpus: 9, gpus_per_node: 0, ..ctx() }.cpus_per_process(), 9);
    }

    #[test]
    fn an_unknown_placeholder_is_an_error_naming_it() {
        let e = launch(&["python", "{dp}", "{nproc}"]).check().unwrap_err();
        assert!(e.to_string().contains("command[2]") && e.to_string().contains("{nproc}"), "{e}");
        assert!(launch(&["a{b"]).check().is_err());
        assert!(launch(&[]).check().is_err());
    }

    #[test]
    fn the_deepspeed_config_follows_the_plan() {
        let c = deepspeed_config(&"dp4-mb2-ga2-z2-offopt".parse().unwrap());
        assert_eq!(c["train_batch_size"], 16);
        assert_eq!(c["gradient_accumulation_steps"], 2);
        assert_eq!(c["zero_optimization"]["stage"], 2);
        assert_eq!(c["zero_optimization"]["offload_optimizer"]["device"], "cpu");
        assert!(c["zero_optimization"].get("offload_param").is_none());
    }

    #[test]
    fn metric_lines_are_recognised_and_other_output_ignored() {
        let it = MetricLine::parse(r#"{"rubick":1,"iter":7,"iter_time_s":0.5,"samples":16}"#).unwrap();
        assert!(matches!(it, MetricLine::Iteration { iter: 7, .. }));
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9}"#).unwrap();
        assert!(matches!(ev, MetricLine::Event { iter: Some(9), save_s: None, .. }));
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9,"save_s":1.5,"format":"sharded"}"#);
        assert!(matches!(ev, Some(MetricLine::Event { iter: Some(9), save_s: Some(s), .. }) if s == 1.5));
        assert!(MetricLine::parse(r#"{"rubick":1,"event":"oom"}"#).is_some());
        for other in
            ["loss 2.3", "{}", r#"{"rubick":2,"iter":1,"iter_time_s":1}"#, r#"{"rubick":1,"iter":1,"iter_time_s":-1}"#]
        {
            assert!(MetricLine::parse(other).is_none(), "{other}");
        }
    }

    /// Regression, "a diverging job looks idle: Python writes metric lines with
    /// `"loss":NaN` / `Infinity` / `-Infinity` (json.dumps allow_nan default), serde
    /// rejects those lines, and `rubick-run status` shows 0 iterations done": the line is
    /// its iteration, with its loss; no time is ever non-finite.
    #[test]
    fn a_diverging_jobs_lines_are_still_its_iterations() {
        for (token, is) in [
            ("NaN", f64::is_nan as fn(f64) -> bool),
            ("Infinity", |v| v == f64::INFINITY),
            ("-Infinity", |v| v == f64::NEG_INFINITY),
        ] {
            let line = format!(r#"{{"rubick":1,"iter":7,"iter_time_s":0.5,"samples":16,"loss":{token}}}"#);
            let Some(MetricLine::Iteration { iter: 7, iter_time_s, loss: Some(loss), .. }) = MetricLine::parse(&line)
            else {
                panic!("{line}: not an iteration");
            };
            assert!(is(loss) && iter_time_s == 0.5, "{line}: {loss}");
        }
        // A name inside a string stays text; Python's spacing (`json.dumps` without
        // separators) parses too.
        let m = MetricLine::parse(
            r#"{"rubick": 1, "iter": 2, "iter_time_s": 0.5, "note": "NaN \"Infinity\"", "loss": NaN}"#,
        );
        assert!(matches!(m, Some(MetricLine::Iteration { iter: 2, loss: Some(l), .. }) if l.is_nan()), "{m:?}");
        // No time is ever one: an iteration without a finite time is not the protocol; a
        // phase time, peak memory or save time that is not finite is left out.
        for time in ["NaN", "Infinity", "-Infinity"] {
            let line = format!(r#"{{"rubick":1,"iter":1,"iter_time_s":{time},"loss":1.0}}"#);
            assert!(MetricLine::parse(&line).is_none(), "{line}");
        }
        let m = MetricLine::parse(
            r#"{"rubick":1,"iter":3,"iter_time_s":0.5,"forward_s":NaN,"backward_sync_s":Infinity,"optimizer_s":-Infinity,"peak_memory_gib":NaN}"#,
        );
        assert!(
            matches!(
                m,
                Some(MetricLine::Iteration {
                    iter: 3,
                    forward_s: None,
                    backward_sync_s: None,
                    optimizer_s: None,
                    peak_memory_gib: None,
                    loss: None,
                    ..
                })
            ),
            "{m:?}"
        );
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9,"save_s":NaN}"#);
        assert!(matches!(ev, Some(MetricLine::Event { iter: Some(9), save_s: None, .. })), "{ev:?}");
        assert_eq!(
            iteration_times(&[MetricLine::parse(r#"{"rubick":1,"iter":1,"iter_time_s":2,"loss":NaN}"#).unwrap()]),
            [2.0]
        );
        // Other bare words are still not JSON.
        assert!(MetricLine::parse(r#"{"rubick":1,"iter":1,"iter_time_s":0.5,"loss":nan}"#).is_none());
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
