//! Jobs: what users submit, and what the planner schedules.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{ApiVersion, Artifact, Kind};
use crate::error::{ValidationError, ensure};
use crate::model::ModelSpec;
use crate::placement::Placement;
use crate::plan::{Plan, PlanRequest};

/// A `Job` artifact, also an entry of a `JobBatch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// Unique within a batch; 1 to 63 letters, digits, `.`, `_`, `-`, starting with a
    /// letter or digit (it becomes a directory and a Slurm / Kubernetes name).
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"))]
    pub name: String,
    pub model: ModelSpec,
    /// Path of the job's fitted `PerfModel`, relative to the job file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perf_model: Option<String>,
    /// Submission time in seconds (trace time or Unix time).
    #[serde(default)]
    pub submit_time_s: f64,
    /// Iterations (global batches) left to run.
    #[schemars(range(min = 1))]
    pub iterations: u64,
    /// What the user asked for; the guarantee is the throughput of this request.
    pub request: JobRequest,
    /// Whether the job's throughput must stay at least that of its request.
    #[serde(default)]
    pub guaranteed: bool,
    /// Which plan changes the job's checkpoints can be resumed under.
    #[serde(default)]
    pub resharding: Resharding,
    /// Seconds lost by a restart (checkpoint save + relaunch + warm-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_cost_s: Option<f64>,
    /// Where the job runs now, if it is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<CurrentAllocation>,
    /// How to launch it (the job contract, [`crate::launch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<crate::launch::Launch>,
    /// Plans whose runs exited 2 (the contract's "bad plan"): never offered again.
    /// `rubick-run jobs` fills it from the job's runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported_plans: Vec<Plan>,
    /// Plans the job ran measurably slower under than under the plan before them
    /// (`rubick-run`'s safety net after every move): the round after it was seen, the job
    /// moves back to the plan before; never offered again. `rubick-run jobs` fills it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow_plans: Vec<SlowPlan>,
    /// What the job needs of where it runs (a GPU and its driver, files its runs read),
    /// checked before anything runs: `rubick-profile run`, `rubick-run submit` and
    /// `rubick-run apply` refuse a job whose cluster or machine lacks it, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<Requirements>,
}

/// What a job needs of where it runs (`requires:`). Every field left out needs nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirements {
    /// GPUs that compute: a cluster whose only GPUs are worker slots of CPU cores
    /// (`gpuType: cpu`, what `rubick-profile devices` writes on a machine without a GPU
    /// driver) cannot run the job. `nvidia`: also the NVIDIA driver on the machine of a
    /// local run (`/proc/driver/nvidia/version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuNeed>,
    /// Files or directories the runs read, relative to the directory they start in
    /// (`launch.workdir`, else the one `rubick-profile` or `rubick-run apply` runs in; on
    /// Slurm the same path on every node: a shared filesystem). Each must exist before a
    /// run starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The command that makes the `files` (named when one is missing), e.g.
    /// `python examples/torchtitan/assets.py examples/torchtitan/assets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
}

/// Which GPU a job requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GpuNeed {
    /// Any GPU: not CPU worker slots.
    Any,
    /// An NVIDIA GPU with its driver (CUDA).
    Nvidia,
}

impl GpuNeed {
    pub fn name(self) -> &'static str {
        match self {
            GpuNeed::Any => "any",
            GpuNeed::Nvidia => "nvidia",
        }
    }
}

impl Requirements {
    /// What `cluster` lacks of these requirements: `None` when it has a group with GPUs
    /// or none are required; `group`, when given, is the one the runs use.
    pub fn unmet_by(&self, cluster: &crate::Cluster, group: Option<&crate::NodeGroup>) -> Option<String> {
        let need = self.gpu?;
        let has = match group {
            Some(g) => g.has_gpus(),
            None => cluster.node_groups.iter().any(crate::NodeGroup::has_gpus),
        };
        if has {
            return None;
        }
        let which = group.map_or_else(|| format!("cluster `{}`", cluster.name), |g| format!("node group `{}`", g.name));
        Some(format!(
            "it requires a GPU (requires.gpu: {}), and {which} has none (its worker slots are CPU cores, gpuType {})",
            need.name(),
            crate::cluster::CPU_GPU_TYPE
        ))
    }

    fn check(&self) -> Result<(), ValidationError> {
        for (i, file) in self.files.iter().enumerate() {
            let at = format!("files[{i}]");
            ensure(!file.trim().is_empty(), &at, || "must not be empty".into())?;
            if let Some(c) = file.chars().find(|c| c.is_control()) {
                return Err(ValidationError::new(at, format!("{c:?}: a control character")));
            }
        }
        if let Some(setup) = &self.setup
            && let Some(c) = setup.chars().find(|c| c.is_control())
        {
            return Err(ValidationError::new("setup", format!("{c:?}: a control character")));
        }
        Ok(())
    }
}

/// A plan a job ran measurably slower under than under the plan before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlowPlan {
    pub plan: Plan,
    /// Its run's mean iteration time (seconds, after the warm-up).
    pub iter_time_s: f64,
    /// The plan the job ran before it.
    pub before: Plan,
    /// That run's mean iteration time (seconds, after the warm-up).
    pub before_iter_time_s: f64,
}

impl SlowPlan {
    /// The rules of its fields: times finite and positive.
    pub fn check(&self) -> Result<(), ValidationError> {
        for (field, v) in [("iterTimeS", self.iter_time_s), ("beforeIterTimeS", self.before_iter_time_s)] {
            ensure(v.is_finite() && v > 0.0 && v <= crate::limits::MAX_CLOCK_SECONDS, field, || {
                format!("a time in seconds, finite and above 0, got {v}")
            })?;
        }
        Ok(())
    }

    /// In words, for `status`, `--explain` and the logs.
    pub fn describe(&self) -> String {
        format!(
            "{} ran {:.4} s per iteration, {:.2}x the {:.4} s of {} before it",
            self.plan,
            self.iter_time_s,
            self.iter_time_s / self.before_iter_time_s,
            self.before_iter_time_s,
            self.before
        )
    }
}

/// The user's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobRequest {
    #[schemars(range(min = 1))]
    pub gpus: u32,
    /// CPU cores in all (not per GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory_gib: Option<f64>,
    /// The user's plan: complete (`dp4-tp2-pp1-mb2-ga1`) or a code (`zero-dp`, `248`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanRequest>,
    /// GPU type the job must run on; any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
}

/// Plan changes a job's checkpoints survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Resharding {
    /// The plan never changes (only the same plan may be resumed).
    None,
    /// Only the data-parallel degree (and accumulation, micro-batch) may change.
    #[default]
    DataParallel,
    /// Any TP/PP/DP layout: checkpoints are resharded on load.
    Full,
}

/// A running job's plan and placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CurrentAllocation {
    pub plan: Plan,
    pub placement: Placement,
    /// Nodes the job runs on, in placement order, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Rounds since the allocation last changed.
    #[serde(default)]
    pub rounds_since_change: u32,
    /// Restarts the job has had so far (reconfigurations and resumes; not its first
    /// start): the restart factor's hysteresis grows with them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// The job is in the middle of a checkpoint-restore (started, no iteration yet): it
    /// keeps its allocation this round.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restoring: bool,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

impl Job {
    /// An example: a LLaMA-2-7B-like job of 5,000 iterations submitted at 0, asking
    /// for `code` on `gpus` GPUs with `cpus` cores (for tests and examples).
    pub fn example(name: &str, code: crate::PlanCode, gpus: u32, cpus: u32, guaranteed: bool) -> Job {
        Job {
            api_version: None,
            kind: None,
            name: name.into(),
            model: ModelSpec::example(),
            perf_model: None,
            submit_time_s: 0.0,
            iterations: 5_000,
            request: JobRequest {
                gpus,
                cpus: Some(cpus),
                host_memory_gib: None,
                plan: Some(PlanRequest::Code(code)),
                gpu_type: None,
            },
            guaranteed,
            resharding: Resharding::Full,
            restart_cost_s: None,
            current: None,
            launch: None,
            unsupported_plans: Vec::new(),
            slow_plans: Vec::new(),
            requires: None,
        }
    }

    /// The plan features the job's script implements (`launch.supports`), if it says.
    pub fn supports(&self) -> Option<&crate::launch::PlanSupport> {
        self.launch.as_ref().and_then(|l| l.supports.as_ref())
    }

    /// Why the job's script cannot run `plan`: a feature outside `launch.supports`, or
    /// a plan one of its runs exited 2 under (`unsupportedPlans`).
    pub fn refusal(&self, plan: &Plan) -> Option<String> {
        if self.unsupported_plans.contains(plan) {
            return Some("a plan a run of the job refused (exit 2; unsupportedPlans)".into());
        }
        if let Some(slow) = self.slow_plans.iter().find(|s| s.plan == *plan) {
            return Some(format!("a plan the job ran slower under ({}; slowPlans)", slow.describe()));
        }
        self.supports().and_then(|s| s.refusal(plan))
    }

    /// The plans never offered again: those its runs refused (`unsupportedPlans`) and
    /// those it ran slower under (`slowPlans`).
    pub fn refused_plans(&self) -> impl Iterator<Item = Plan> + '_ {
        self.unsupported_plans.iter().copied().chain(self.slow_plans.iter().map(|s| s.plan))
    }

    /// Whether the job's script can run `plan`.
    pub fn can_run(&self, plan: &Plan) -> bool {
        self.refusal(plan).is_none()
    }

    /// The job's rules; errors name the field relative to the job.
    pub fn check(&self) -> Result<(), ValidationError> {
        check_name(&self.name).map_err(|why| ValidationError::new("name", why))?;
        self.model.check().map_err(|e| e.within("model"))?;
        if let Some(launch) = &self.launch {
            launch.check().map_err(|e| e.within("launch"))?;
        }
        if let Some(requires) = &self.requires {
            requires.check().map_err(|e| e.within("requires"))?;
        }
        for (i, slow) in self.slow_plans.iter().enumerate() {
            slow.check().map_err(|e| e.within(&format!("slowPlans[{i}]")))?;
        }
        use crate::limits::{self, check_range, check_real};
        let at = |field: &'static str| move |why: String| ValidationError::new(field, why);
        check_range(self.iterations, 1, limits::MAX_JOB_ITERATIONS).map_err(at("iterations"))?;
        // Submit times are trace seconds or Unix seconds: up to the year 5000.
        check_real(self.submit_time_s, 0.0, limits::MAX_CLOCK_SECONDS, false).map_err(at("submitTimeS"))?;
        if let Some(cost) = self.restart_cost_s {
            crate::launch::check_seconds(cost, true).map_err(at("restartCostS"))?;
        }
        let request = &self.request;
        let gpus = request.gpus;
        check_range(u64::from(gpus), 1, limits::MAX_GPUS).map_err(at("request.gpus"))?;
        if let Some(cpus) = request.cpus {
            check_range(u64::from(cpus), 1, limits::MAX_GPUS * u64::from(limits::MAX_CPU_CORES) / 4)
                .map_err(at("request.cpus"))?;
        }
        if let Some(mem) = request.host_memory_gib {
            check_real(mem, 0.0, limits::MAX_MEMORY_GIB * 1024.0, true).map_err(at("request.hostMemoryGib"))?;
        }
        match request.plan {
            Some(PlanRequest::Exact(plan)) => {
                plan.check(&self.model, gpus)
                    .map_err(|v| ValidationError::new("request.plan", format!("`{plan}`: {v}")))?;
                if let Some(why) = self.supports().and_then(|s| s.refusal(&plan)) {
                    return Err(ValidationError::new(
                        "request.plan",
                        format!("`{plan}` uses {why}: outside what launch.supports says the script implements"),
                    ));
                }
            }
            Some(PlanRequest::Code(code)) => {
                if let Some(code_gpus) = code.gpus() {
                    ensure(code_gpus == gpus, "request.plan", || {
                        format!("`{code}` uses {code_gpus} GPUs but request.gpus is {gpus}")
                    })?;
                }
                let candidates = code.candidates(&self.model, gpus);
                let first = candidates.first().ok_or_else(|| {
                    ValidationError::new(
                        "request.plan",
                        format!(
                            "`{code}` on {gpus} GPUs: the global batch {} is not divisible by the data-parallel degree",
                            self.model.global_batch
                        ),
                    )
                })?;
                first
                    .check(&self.model, gpus)
                    .map_err(|v| ValidationError::new("request.plan", format!("`{code}` on {gpus} GPUs: {v}")))?;
            }
            None => {}
        }
        if let Some(current) = &self.current {
            let plan = current.plan;
            plan.check(&self.model, current.placement.gpus()).map_err(|v| {
                ValidationError::new("current.plan", format!("`{plan}` on placement {}: {v}", current.placement))
            })?;
            ensure(
                current.nodes.is_empty() || current.nodes.len() == current.placement.per_node().len(),
                "current.nodes",
                || format!("{} nodes named for placement {}", current.nodes.len(), current.placement),
            )?;
        }
        Ok(())
    }
}

/// Longest job name: a directory name, a Slurm job name and a Kubernetes label value
/// all hold it.
pub const MAX_NAME_LEN: usize = 63;

/// A job's name becomes a directory, a Slurm job name, a Kubernetes name and a metric
/// label: 1 to 63 letters, digits, `.`, `_` and `-`, starting with a letter or digit,
/// without `..`. The one check of it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("{} characters; at most {MAX_NAME_LEN}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!(
            "`{}`: {c:?} is not allowed (letters, digits, `.`, `_` and `-` only)",
            name.escape_debug()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) || name.contains("..") {
        return Err(format!("`{name}`: must start with a letter or digit and not contain `..`"));
    }
    Ok(())
}

impl Artifact for Job {
    crate::artifact_header!(Kind::Job);

    fn validate(&self) -> Result<(), ValidationError> {
        self.check()
    }
}

/// A `JobBatch` artifact: the jobs of one scheduling round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobBatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    pub jobs: Vec<Job>,
    /// When the batch was taken, on its jobs' clock (`rubick-run jobs`: Unix seconds,
    /// as its jobs' `submitTimeS`): a round's time unless `--now` says otherwise, so
    /// that waiting time and starvation grow in the cron loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now_s: Option<f64>,
}

impl Artifact for JobBatch {
    crate::artifact_header!(Kind::JobBatch);

    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(now) = self.now_s {
            ensure(now.is_finite() && now >= 0.0, "nowS", || format!("must be a non-negative number, got {now}"))?;
        }
        // One pass (a set of names): a batch of many jobs is checked in linear time.
        let mut seen = std::collections::HashSet::with_capacity(self.jobs.len());
        for (i, job) in self.jobs.iter().enumerate() {
            job.check().map_err(|e| e.within(&format!("jobs[{i}]")))?;
            if let Some(kind) = job.kind {
                ensure(kind == Kind::Job, &format!("jobs[{i}].kind"), || format!("expected `Job`, found `{kind}`"))?;
            }
            if !seen.insert(job.name.as_str()) {
                return Err(ValidationError::new(
                    format!("jobs[{i}].name"),
                    format!("`{}` is used by an earlier job", job.name),
                ));
            }
        }
        Ok(())
    }
}
