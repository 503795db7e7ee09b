//! # rubick-policy: who runs where, and how
//!
//! Scheduling policies: one trait ([`Policy`]), one module per policy, one registry
//! ([`REGISTRY`]) by name that `rubick-plan schedule --policy` and `simulate --policy`
//! share.
//!
//! Three families share their machinery: the planner family ([`planner`]: Rubick, its
//! MILP and its ablations) decides through this project's planner; the goodput-row
//! peers ([`goodput`]: Sia, Pollux) choose a GPU count per job from its goodput row
//! and solve their own objective exactly; the queue family ([`queue`]: static,
//! static-backfill, Synergy, guaranteed-first) runs the user's plan on the user's
//! GPUs with a node allocator. Every policy sees the jobs as
//! declared, their progress and their fitted models: never the truth of their speed.
//!
//! Adding a policy: a module with its documentation (the paper or system it follows)
//! and a `build` function, and one line in [`REGISTRY`].

use std::time::Duration;

use rubick_core::{Cluster, Job, Placement, Plan, PlanCode, PlanRequest};
use rubick_model::MemoryEstimator;
use rubick_model::perfmodel::Params;
use rubick_model::space::resolve_code;
use rubick_model::throughput;
use rubick_planner::curves::Evaluator;
use rubick_planner::{CandidateFilter, Current, JobInput, PlannerConfig, Restriction};

mod goodput;
pub mod planner;
mod pollux;
pub mod queue;
mod rubick;
mod rubick_gpus_only;
mod rubick_milp;
mod rubick_no_plan;
mod rubick_no_resize;
mod sia;
mod static_backfill;
mod static_guaranteed_first;
mod static_queue;
mod synergy;

/// Order in which queued jobs are admitted (for the planner family: their weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queue {
    /// First come, first served (the paper's).
    Fifo,
    /// Least attained service (GPU-seconds so far; Tiresias): needs no job sizes.
    Las,
    /// Shortest remaining work first: the iterations a job has left times the
    /// predicted GPU-seconds of one on its request (the 2-D counterpart of LAS's
    /// attained GPU-seconds). Rubick's policies weigh every job by it, running ones too.
    Srpt,
    /// Least attained service in two classes, with preemption: a job below the service
    /// quantum (the median service of the jobs finished in the last day) counts twice
    /// as much as one past it, first come first served within a class; a running job
    /// keeps its request only until it has had the quantum, then may be shrunk onto
    /// another plan or paused for jobs below it. Needs no job sizes (the queue family
    /// orders by attained service, as `las`).
    Service,
}

impl Queue {
    pub const ALL: [Queue; 4] = [Queue::Fifo, Queue::Las, Queue::Srpt, Queue::Service];

    pub fn as_str(self) -> &'static str {
        match self {
            Queue::Fifo => "fifo",
            Queue::Las => "las",
            Queue::Srpt => "srpt",
            Queue::Service => "service",
        }
    }
}

impl std::str::FromStr for Queue {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Queue::ALL
            .into_iter()
            .find(|q| q.as_str() == s)
            .ok_or_else(|| format!("unknown queue order `{s}` (expected one of: fifo, las, srpt, service)"))
    }
}

/// What every policy is built with.
#[derive(Debug, Clone)]
pub struct PolicyOptions {
    pub queue: Queue,
    /// The planner's knobs (the planner family's; the queue family reads the cores and
    /// memory every job gets from it).
    pub planner: PlannerConfig,
    /// Time limit of each MILP round.
    pub milp_time_limit: Duration,
}

/// What a policy sees at a decision.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub cluster: &'a Cluster,
    /// Submitted, unfinished jobs, each as the planner takes it: its belief, where it
    /// runs, what it may run ([`JobInput::allowed`], which a policy narrows), its
    /// progress.
    pub jobs: &'a [JobInput],
    /// The clock (seconds, the jobs' time).
    pub now_s: f64,
    /// Which configurations exist (e.g. those a reference measured: never their
    /// times), when known: where a job's requested plan runs as the user asked.
    pub configs: Option<&'a dyn CandidateFilter>,
}

/// [`Job::example`] waiting, believed by the FLOPs-based default (for tests).
#[cfg(test)]
pub(crate) fn example(name: &str, code: PlanCode, gpus: u32, cpus: u32) -> JobInput {
    let job = Job::example(name, code, gpus, cpus, false);
    let belief = rubick_model::belief::Belief::prior(&job.model);
    JobInput::example(job, belief, None, false)
}

/// `job` running on `current` since 0, `restoring` whether it restarts now (for tests).
#[cfg(test)]
pub(crate) fn running(job: &JobInput, current: &Current, restoring: bool) -> JobInput {
    JobInput::example(job.job.clone(), job.belief.clone(), Some(current.clone()), restoring)
}

/// A scheduling policy.
pub trait Policy {
    /// Whether the policy reconfigures running jobs: a simulation then also asks it
    /// again when cooldowns end, not only on arrivals and completions.
    fn reconfigures(&self) -> bool;

    /// One decision: an allocation, or none, for every job of `view` (in its order). A
    /// job whose allocation is unchanged keeps running; any other change restarts it.
    /// `round` counts decisions.
    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Current>>;

    /// The last decision as the planner reported it (a `Schedule` with an explanation
    /// per job, or why guarantees cannot hold), for policies that plan (the planner
    /// family); `None`: the allocations are all there is.
    fn last_round(&mut self) -> Option<planner::RoundReport> {
        None
    }
}

/// A policy in the registry.
pub struct Registration {
    pub name: &'static str,
    /// One line: what it does and what it follows.
    pub summary: &'static str,
    build: for<'a> fn(&'a Cluster, &PolicyOptions) -> Box<dyn Policy + 'a>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Registration {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Registration {
    /// The policy, deciding on `cluster` with `options`.
    pub fn build<'a>(&self, cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
        (self.build)(cluster, options)
    }
}

/// Every policy, by name.
pub static REGISTRY: [Registration; 11] = [
    Registration { name: "rubick", summary: rubick::SUMMARY, build: rubick::build },
    Registration { name: "rubick-milp", summary: rubick_milp::SUMMARY, build: rubick_milp::build },
    Registration { name: "static", summary: static_queue::SUMMARY, build: static_queue::build },
    Registration { name: "static-backfill", summary: static_backfill::SUMMARY, build: static_backfill::build },
    Registration { name: "synergy", summary: synergy::SUMMARY, build: synergy::build },
    Registration {
        name: "static-guaranteed-first",
        summary: static_guaranteed_first::SUMMARY,
        build: static_guaranteed_first::build,
    },
    Registration { name: "sia", summary: sia::SUMMARY, build: sia::build },
    Registration { name: "pollux", summary: pollux::SUMMARY, build: pollux::build },
    Registration { name: "rubick-gpus-only", summary: rubick_gpus_only::SUMMARY, build: rubick_gpus_only::build },
    Registration { name: "rubick-no-plan", summary: rubick_no_plan::SUMMARY, build: rubick_no_plan::build },
    Registration { name: "rubick-no-resize", summary: rubick_no_resize::SUMMARY, build: rubick_no_resize::build },
];

/// The registered policy called `name`.
pub fn lookup(name: &str) -> Result<&'static Registration, String> {
    REGISTRY.iter().find(|r| r.name == name).ok_or_else(|| {
        let names: Vec<&str> = REGISTRY.iter().map(|r| r.name).collect();
        format!("unknown policy `{name}` (expected one of: {})", names.join(", "))
    })
}

/// The node group a job's request is resolved on: the first of its requested GPU type
/// (the first group when it names none, or none matches). What its remaining work and
/// its guarantee are measured by.
pub fn home_group(job: &Job, cluster: &Cluster) -> usize {
    rubick_planner::eligible_groups(job, cluster).next().map_or(0, |(i, _)| i)
}

/// The user's request as a concrete plan: its code resolved on its GPUs of `group`.
pub fn request_plan(job: &Job, cluster: &Cluster, group: usize) -> Option<Plan> {
    let g = &cluster.node_groups[group];
    match job.request.plan {
        Some(PlanRequest::Exact(p)) => Some(p),
        Some(PlanRequest::Code(code)) => {
            resolve_code(&code, &job.model, job.request.gpus, g.gpu_memory_gib, &MemoryEstimator::default())
        }
        None => None,
    }
}

/// The plan a trace job ran with, taken literally from its code when the model's
/// shape (as the reference describes it) rejects it: the measured row is the truth.
/// Its micro-batch is the largest that fits the GPUs of `group` (accumulation makes up
/// the rest of the batch), as for a code that resolves.
pub fn traced_plan(job: &Job, code: Option<PlanCode>, cluster: &Cluster, group: usize) -> Option<Plan> {
    let code = code?;
    let gpus = job.request.gpus;
    let mut plan = code.skeleton(gpus);
    if plan.gpus() != gpus {
        return None;
    }
    let per_replica = u32::try_from((job.model.global_batch / u64::from(plan.dp.max(1))).max(1)).ok()?;
    let memory = cluster.node_groups[group].gpu_memory_gib;
    let estimator = MemoryEstimator::default();
    let fitting = rubick_core::plan::divisors(u64::from(per_replica)).rev().find_map(|mb| {
        let mb = u32::try_from(mb).ok()?;
        let p = Plan { micro_batch: mb, ga: per_replica / mb, ..plan };
        estimator.fits(&job.model, &p, memory).0.then_some(mb)
    });
    let mb = fitting.unwrap_or(per_replica);
    (plan.micro_batch, plan.ga) = (mb, per_replica / mb);
    Some(plan)
}

/// The plan a job runs as its user asked, on `placement` (its requested GPUs) of
/// `group` with `cpus`: the request's plan, else the trace's code taken literally, else
/// (no plan requested) the best plan the belief finds there.
pub fn users_plan(
    job: &Job,
    params: &Params,
    trace_code: Option<PlanCode>,
    evaluator: &mut Evaluator<'_>,
    (group, placement): (usize, &Placement),
    cpus: u32,
) -> Option<Plan> {
    let cluster = evaluator.cluster;
    request_plan(job, cluster, group)
        .or_else(|| traced_plan(job, trace_code, cluster, group))
        .or_else(|| evaluator.best_plan(job, params, group, placement, cpus, Restriction::Any).map(|(plan, _)| plan))
}

/// Where the user's request runs: the requested GPUs packed onto nodes, unless
/// `configs` lists the requested plan's kind only on other placements of as many GPUs
/// (the authors' simulator charges a static job the placement its plan was measured
/// on: LLaMA-30B's `641` on `444444`, not on `888`).
pub fn request_placement(
    job: &Job,
    trace_code: Option<PlanCode>,
    (cluster, group): (&Cluster, usize),
    configs: Option<&dyn CandidateFilter>,
) -> Option<Placement> {
    let gpus = job.request.gpus;
    let g = &cluster.node_groups[group];
    let packed = Placement::packed(gpus, g.gpus_per_node)?;
    let Some(filter) = configs else { return Some(packed) };
    // The requested plan when it has a kind, else the trace's kind on these GPUs.
    let plan = request_plan(job, cluster, group)
        .filter(|p| PlanCode::of(p).is_some())
        .or_else(|| trace_code.map(|code| code.skeleton(gpus)));
    let Some(plan) = plan else { return Some(packed) };
    let placements = filter.placements(&job.model, &plan, gpus).unwrap_or_default();
    if placements.is_empty() || placements.contains(&packed) {
        return Some(packed);
    }
    placements.into_iter().find(|p| p.max_per_node() <= g.gpus_per_node && p.nodes() <= g.count).or(Some(packed))
}

/// The user's request as a concrete configuration: the plan (see [`users_plan`]) on
/// the placement it runs on (see [`request_placement`]) with its cores (the node's
/// fair share per GPU when it did not say), on its [`home_group`].
pub fn request_config(
    job: &Job,
    params: &Params,
    trace_code: Option<PlanCode>,
    evaluator: &mut Evaluator<'_>,
    configs: Option<&dyn CandidateFilter>,
) -> Option<Request> {
    let cluster = evaluator.cluster;
    let group = home_group(job, cluster);
    let cpus = job.request.cpus.unwrap_or(cluster.node_groups[group].fair_cpus_per_gpu() * job.request.gpus);
    let placement = request_placement(job, trace_code, (cluster, group), configs)?;
    let plan = users_plan(job, params, trace_code, evaluator, (group, &placement), cpus)?;
    Some(Request { group, plan, placement, cpus })
}

/// The user's request as a concrete configuration (see [`request_config`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub group: usize,
    pub plan: Plan,
    pub placement: Placement,
    pub cpus: u32,
}

/// Predicted GPU-seconds of one iteration of `job` on its `request` configuration (the
/// belief): what remaining work is measured in (`srpt`). 1 GPU-second per sample when
/// there is no request to evaluate.
pub fn work_per_iteration(job: &Job, params: &Params, request: Option<&Request>, evaluator: &Evaluator<'_>) -> f64 {
    let thr = request.map(|r| {
        let g = &evaluator.cluster.node_groups[r.group];
        let cpu_ref = evaluator.config.cpu_reference(g);
        throughput::samples_per_s(&job.model, params, g, &r.plan, &r.placement, r.cpus, cpu_ref)
    });
    let thr = thr.filter(|t| t.is_finite() && *t > 0.0).unwrap_or(1.0);
    job.model.global_batch as f64 / thr * f64::from(job.request.gpus.max(1))
}
