//! One scheduling round: every job's execution plan *and* resources, chosen together.
//!
//! The pieces, in the order a round uses them:
//!
//! 1. [`curves`]: per job and node group, the best predicted throughput over all the
//!    plans the job may run as a function of GPUs, CPU cores, host memory and
//!    bandwidth class, Pareto-pruned into [`Candidate`]s (the decision space).
//! 2. [`heuristic`]: Rubick's greedy (guaranteed jobs first, then resources move from
//!    the lowest to the highest normalised marginal gain). The exact round over the
//!    same candidates is an [`exact::ExactSolver`] the caller injects (the MILP of
//!    `rubick-milp`, which links HiGHS).
//! 3. [`place`]: the chosen candidates onto concrete nodes and GPU indices.
//!
//! The decision works on node-group totals (GPUs, cores, memory of all a group's
//! nodes); placement then packs onto nodes and, where fragmentation leaves no room for
//! a candidate's shape, spreads the job or falls back to a smaller candidate, so no
//! node is ever over-allocated. Everything here is deterministic.
//!
//! A job in a round is a [`JobInput`] (this file, with [`Current`], [`Restriction`],
//! [`Progress`]); the round's knobs are [`PlannerConfig`]; [`synth`] makes synthetic
//! rounds for `rubick-plan synth`, the benches and the tests.

pub mod brute;
mod config;
pub mod curves;
pub mod exact;
pub mod heuristic;
pub mod place;
pub mod rng;
pub mod round;
pub mod synth;

use rubick_core::cluster::{Cluster, NodeGroup};
use rubick_core::job::{Job, Resharding};
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;
use rubick_model::belief::Belief;

pub use config::{CandidateFilter, Candidates, PlannerConfig, ReferencePlans, ServiceQuantum};
pub use curves::{Candidate, CurveBook, CurvePoint, JobCurves};
pub use heuristic::{Decision, Infeasible};

/// The restart factor of Pollux (Qiao et al., OSDI 2021; AdaptDL
/// `sched/adaptdl_sched/policy/pollux.py`, `_evaluate`) and Sia (Jayaram Subramanya et
/// al., SOSP 2023; `sia-simulator/sia.py`, `get_allocation`): a job `age_s` seconds
/// after its submission, restarted `restarts` times at `restart_s` seconds each, values
/// any configuration but its current one at `max(age - restarts * restart_s, 0) /
/// (age + restart_s)` of its worth. A move must gain `1 / factor`: with age 1 h and
/// 250 s restarts, 7 % after no restart, 64 % after five; a job that lost more of its
/// life to restarts than it ran is never moved again. Jobs younger than one restart
/// are exempt (Sia: `realloc_factor = 1 if job.age < job_restart_penalty`).
pub fn restart_factor(age_s: f64, restarts: u32, restart_s: f64) -> f64 {
    if restart_s.is_nan() || restart_s <= 0.0 || age_s < restart_s {
        return 1.0;
    }
    (age_s - f64::from(restarts) * restart_s).max(0.0) / (age_s + restart_s)
}

/// Where a running job is now, resolved against the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    pub group: usize,
    pub plan: Plan,
    pub placement: Placement,
    /// (node index within the group, GPU indices) per node, when known.
    pub nodes: Vec<(u32, Vec<u32>)>,
    pub cpus: u32,
    pub host_memory_gib: f64,
    pub rounds_since_change: u32,
}

impl Current {
    /// How an allocation `next` (group, plan, placement, (node, GPU indices) per node,
    /// cores) differs from this one: the one rule of what counts as a change, for the
    /// schedule's explanation and the simulator's restarts alike. Nodes are compared
    /// only when both sides know them; a change of cores alone is a change (a training
    /// process's CPU threads are fixed at launch).
    pub fn change_to(
        &self,
        group: usize,
        plan: &Plan,
        placement: &Placement,
        nodes: &[(u32, Vec<u32>)],
        cpus: u32,
    ) -> rubick_core::schedule::Change {
        use rubick_core::schedule::{Change, NodeSet};
        // Same nodes, and the same GPUs on each where both sides name them.
        let set = |n: &[(u32, Vec<u32>)]| match n {
            [] => NodeSet::unknown(),
            _ => NodeSet::new(n.iter().map(|(i, g)| (*i, (!g.is_empty()).then_some(&g[..])))),
        };
        let same_nodes = set(&self.nodes).matches(&set(nodes));
        if self.placement.gpus() != placement.gpus() {
            Change::Resized
        } else if self.plan != *plan {
            Change::Replanned
        } else if self.group != group || self.placement != *placement || !same_nodes {
            Change::Moved
        } else if self.cpus != cpus {
            Change::Recored
        } else {
            Change::Kept
        }
    }

    /// Its share of each node, named as `cluster` names them: its GPUs there, and its
    /// cores and host memory split by its GPUs on each.
    pub fn shares(&self, cluster: &Cluster) -> Vec<rubick_core::schedule::NodeShare> {
        let g = &cluster.node_groups[self.group];
        let counts: Vec<u32> = self.nodes.iter().map(|(_, ix)| ix.len() as u32).collect();
        let cores = place::split(self.cpus, &counts);
        let total = counts.iter().sum::<u32>().max(1);
        self.nodes
            .iter()
            .zip(cores)
            .map(|((i, ix), cpus)| rubick_core::schedule::NodeShare {
                node: g.node_name(*i),
                gpus: ix.clone(),
                cpus,
                host_memory_gib: rubick_core::schedule::round6(
                    self.host_memory_gib * f64::from(ix.len() as u32) / f64::from(total),
                ),
            })
            .collect()
    }

    /// [`Current::change_to`] another `Current`, or from/to not running.
    pub fn change(old: Option<&Current>, new: Option<&Current>) -> rubick_core::schedule::Change {
        use rubick_core::schedule::Change;
        match (old, new) {
            (None, None) => Change::Pending,
            (None, Some(_)) => Change::Started,
            (Some(_), None) => Change::Preempted,
            (Some(a), Some(b)) => a.change_to(b.group, &b.plan, &b.placement, &b.nodes, b.cpus),
        }
    }
}

/// How far a job has come: what it has left and what it has had.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// Iterations left.
    pub remaining: f64,
    /// Predicted GPU-seconds of work left on its request (what `srpt` orders by).
    pub remaining_work: f64,
    /// GPU-seconds of service it has received so far (what `las` orders by; against
    /// [`PlannerConfig::service_quantum_gpu_s`]).
    pub attained_gpu_s: f64,
    /// When it first started, if it did.
    pub first_start_s: Option<f64>,
    /// The most GPUs it has held (0: it never ran): Sia's and Pollux's growth bound.
    pub max_gpus: u32,
}

impl Progress {
    /// A job before its first start: all its iterations left (its remaining work
    /// counted at one GPU-second each), nothing received.
    pub fn not_started(job: &Job) -> Self {
        let iterations = job.iterations as f64;
        Progress {
            remaining: iterations,
            remaining_work: iterations,
            attained_gpu_s: 0.0,
            first_start_s: None,
            max_gpus: 0,
        }
    }

    /// Whole iterations left, at least one: what a restart must pay for itself over.
    pub fn remaining_iterations(&self) -> f64 {
        self.remaining.ceil().max(1.0)
    }
}

/// One job in a round, from its belief to its assignment: the job as declared, what
/// the planner believes of it, where it runs now and how far it has come. What a
/// policy sees of a job (`rubick_policy::View`) and what the planner plans.
#[derive(Debug, Clone)]
pub struct JobInput {
    /// The job as declared (shared: a simulation hands the same job to every decision).
    pub job: std::sync::Arc<Job>,
    pub belief: Belief,
    /// The plan code of a trace whose model's shape rejects it (the request then has no
    /// plan): the user's plan taken literally (`rubick_policy::traced_plan`).
    pub trace_code: Option<rubick_core::plan::PlanCode>,
    /// Where it runs now.
    pub current: Option<Current>,
    /// The plans it may run this round whatever the policy prefers: those its
    /// checkpoint resumes at when its run must move (a node or GPU that left), the plan
    /// before a slower one (`slowPlans`); `Any` otherwise. A policy narrows it
    /// ([`Restriction::narrowed_by`]), never widens it.
    pub allowed: Restriction,
    /// Multiplies the job's weight in the objective (queue order: earlier in the queue,
    /// more weight); 1 by default.
    pub priority: f64,
    /// Restarts the job has had so far (its restart factor's hysteresis).
    pub restarts: u32,
    /// The job is in the middle of a checkpoint-restore: it keeps its allocation.
    pub restoring: bool,
    pub progress: Progress,
}

impl JobInput {
    /// `job` before its first start, believed as `belief`: waiting, on any plan, of
    /// weight 1.
    pub fn new(job: impl Into<std::sync::Arc<Job>>, belief: Belief) -> Self {
        let job = job.into();
        let progress = Progress::not_started(&job);
        JobInput {
            job,
            belief,
            trace_code: None,
            current: None,
            allowed: Restriction::Any,
            priority: 1.0,
            restarts: 0,
            restoring: false,
            progress,
        }
    }

    /// `job` as a round of `rubick-plan schedule` sees it where nothing forces a move:
    /// running on `current` (or waiting), its restarts and checkpoint-restore from its
    /// `current:`, all its iterations left and no service received (a real round knows
    /// none), the most GPUs it has held those it holds.
    pub fn at(job: Job, belief: Belief, current: Option<Current>) -> Self {
        let restarts = job.current.as_ref().map_or(0, |c| c.restarts);
        let restoring = job.current.as_ref().is_some_and(|c| c.restoring);
        let progress =
            Progress { max_gpus: current.as_ref().map_or(0, |c| c.placement.gpus()), ..Progress::not_started(&job) };
        JobInput {
            restoring: restoring && current.is_some(),
            current,
            restarts,
            progress,
            ..JobInput::new(job, belief)
        }
    }

    /// A job as a test or an example hands it to a policy: 1,000 iterations left (1
    /// GPU-second of work), running on `current` since 0 (the most GPUs it has held)
    /// or waiting, `restoring` whether it restarts now.
    pub fn example(
        job: impl Into<std::sync::Arc<Job>>,
        belief: Belief,
        current: Option<Current>,
        restoring: bool,
    ) -> Self {
        let progress = Progress {
            remaining: 1000.0,
            remaining_work: 1.0,
            attained_gpu_s: 0.0,
            first_start_s: current.as_ref().map(|_| 0.0),
            max_gpus: current.as_ref().map_or(0, |c| c.placement.gpus()),
        };
        JobInput { current, restoring, progress, ..JobInput::new(job, belief) }
    }

    /// Seconds a restart of this job costs.
    pub fn restart_s(&self, config: &PlannerConfig) -> f64 {
        self.job.restart_cost_s.unwrap_or(config.default_restart_s)
    }

    /// Which plans the job may run this round, given its checkpoints.
    pub fn restriction(&self) -> Restriction {
        match (&self.current, self.job.resharding) {
            (None, _) | (Some(_), Resharding::Full) => self.allowed,
            (Some(c), resharding) => Restriction::of_checkpoint(&c.plan, resharding),
        }
    }

    /// Whether the job must keep its allocation this round (cooldown after a change,
    /// or a checkpoint-restore under way).
    pub fn in_cooldown(&self, config: &PlannerConfig) -> bool {
        self.current.as_ref().is_some_and(|c| self.restoring || c.rounds_since_change < config.cooldown_rounds)
    }

    /// Whether the job runs and has had as many restarts as its cap allows
    /// ([`PlannerConfig::restart_cap`], or past the service quantum one per doubling
    /// of its service: [`PlannerConfig::restart_cap_doubles`]): it is never shrunk or
    /// paused again.
    pub fn restarts_spent(&self, config: &PlannerConfig) -> bool {
        self.current.is_some() && self.restart_cap(config).is_some_and(|cap| self.restarts >= cap)
    }

    /// The most restarts after which the job is never shrunk or paused again (`None`:
    /// no cap).
    pub fn restart_cap(&self, config: &PlannerConfig) -> Option<u32> {
        let service = self.progress.attained_gpu_s;
        match config.service_quantum_gpu_s {
            Some(quantum) if config.restart_cap_doubles && quantum > 0.0 && service >= quantum => {
                // log2 of a ratio of f64s: at most 1,024; bounded to be safe in a u32.
                Some(1 + (service / quantum).log2().floor().min(f64::from(u16::MAX)) as u32)
            }
            _ => config.restart_cap,
        }
    }

    /// The job's [`restart_factor`] this round (1 when the rule is off).
    pub fn restart_factor(&self, config: &PlannerConfig) -> f64 {
        if !config.restart_factor {
            return 1.0;
        }
        restart_factor((config.now_s - self.job.submit_time_s).max(0.0), self.restarts, self.restart_s(config))
    }

    /// Whether the job has received its service quantum
    /// ([`PlannerConfig::service_quantum_gpu_s`]): it no longer keeps its request
    /// against jobs below it, nor gains weight by waiting.
    pub fn past_quantum(&self, config: &PlannerConfig) -> bool {
        config.service_quantum_gpu_s.is_some_and(|q| self.progress.attained_gpu_s >= q)
    }

    /// The job's weight in the objective: 1, more for jobs starving in the queue.
    pub fn weight(&self, config: &PlannerConfig) -> f64 {
        self.priority * self.starvation_weight(config)
    }

    fn starvation_weight(&self, config: &PlannerConfig) -> f64 {
        if self.current.is_some() || config.starvation_s <= 0.0 || self.past_quantum(config) {
            return 1.0;
        }
        let waited = (config.now_s - self.job.submit_time_s).max(0.0);
        (1.0 + (waited / config.starvation_s).floor()).min(4.0)
    }

    pub fn starving(&self, config: &PlannerConfig) -> bool {
        self.starvation_weight(config) > 1.0
    }
}

/// The plans a job's checkpoints allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Restriction {
    Any,
    /// Same TP, PP, ZeRO stage and offload; data parallelism, accumulation,
    /// micro-batch and checkpointing may change.
    Layout {
        tp: u32,
        pp: u32,
        zero: rubick_core::plan::ZeroStage,
        offload: rubick_core::plan::Offload,
    },
    /// Only this plan.
    Exact(Plan),
}

impl Restriction {
    /// The plans with `plan`'s TP, PP, ZeRO stage and offload.
    pub fn layout_of(plan: &Plan) -> Self {
        Restriction::Layout { tp: plan.tp, pp: plan.pp, zero: plan.zero, offload: plan.offload }
    }

    /// The plans a checkpoint saved under `plan` resumes at, given how the job reshards.
    pub fn of_checkpoint(plan: &Plan, resharding: Resharding) -> Self {
        match resharding {
            Resharding::Full => Restriction::Any,
            Resharding::DataParallel => Restriction::layout_of(plan),
            Resharding::None => Restriction::Exact(*plan),
        }
    }

    /// This restriction (a hard one: what a checkpoint resumes at) narrowed by `other`
    /// (a policy's preference, e.g. the request's layout) where the two agree; where
    /// they conflict, this one alone.
    pub fn narrowed_by(self, other: Restriction) -> Restriction {
        match (self, other) {
            (Restriction::Any, o) => o,
            (Restriction::Exact(_), _) | (_, Restriction::Any) => self,
            (Restriction::Layout { .. }, Restriction::Exact(p)) if self.allows(&p) => other,
            (Restriction::Layout { .. }, _) => self,
        }
    }

    pub fn allows(&self, plan: &Plan) -> bool {
        match *self {
            Restriction::Any => true,
            Restriction::Layout { tp, pp, zero, offload } => {
                plan.tp == tp && plan.pp == pp && plan.zero == zero && plan.offload == offload
            }
            Restriction::Exact(p) => *plan == p,
        }
    }
}

/// The node groups a job may run on (its GPU type, when it asks for one).
pub fn eligible_groups<'a>(job: &'a Job, cluster: &'a Cluster) -> impl Iterator<Item = (usize, &'a NodeGroup)> + 'a {
    cluster
        .node_groups
        .iter()
        .enumerate()
        .filter(move |(_, g)| job.request.gpu_type.as_ref().is_none_or(|t| *t == g.gpu_type))
}

/// Capacity of one node group in all.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Capacity {
    pub gpus: f64,
    pub cpus: f64,
    pub mem: f64,
}

impl Capacity {
    pub fn of(group: &NodeGroup) -> Self {
        let n = f64::from(group.count);
        Capacity {
            gpus: f64::from(group.total_gpus()),
            cpus: n * f64::from(group.cpu_cores),
            mem: n * group.host_memory_gib,
        }
    }

    pub fn fits(&self, c: &Candidate) -> bool {
        f64::from(c.gpus) <= self.gpus + 1e-9
            && f64::from(c.cpus) <= self.cpus + 1e-9
            && c.host_memory_gib <= self.mem + 1e-6
    }

    pub fn take(&mut self, c: &Candidate) {
        self.gpus -= f64::from(c.gpus);
        self.cpus -= f64::from(c.cpus);
        self.mem -= c.host_memory_gib;
    }

    pub fn give(&mut self, c: &Candidate) {
        self.gpus += f64::from(c.gpus);
        self.cpus += f64::from(c.cpus);
        self.mem += c.host_memory_gib;
    }
}

/// Total objective of a choice (one optional candidate index per job), without the
/// [`curves::LOCK_BONUS`] of the locked jobs it keeps.
pub fn objective(book: &CurveBook, choice: &[Option<usize>]) -> f64 {
    choice
        .iter()
        .enumerate()
        .filter_map(|(j, c)| {
            let jc = &book.jobs[j];
            c.map(|c| jc.candidates[c].value - if jc.locked { curves::LOCK_BONUS } else { 0.0 })
        })
        .sum()
}

/// A job's `current` allocation resolved against the cluster. Cores default to the
/// node's fair share and host memory to the planner's estimate.
pub fn current_of_job(
    job: &Job,
    cluster: &Cluster,
    config: &PlannerConfig,
) -> Result<Option<Current>, rubick_core::error::ValidationError> {
    use rubick_core::error::ValidationError;
    let Some(cur) = &job.current else { return Ok(None) };
    let mut nodes = Vec::new();
    let mut group = None;
    for (i, name) in cur.nodes.iter().enumerate() {
        let (g, index) = cluster.node_by_name(name).ok_or_else(|| {
            ValidationError::new(format!("current.nodes[{i}]"), format!("`{name}` is not a node of the cluster"))
        })?;
        if group.is_some_and(|x| x != g) {
            return Err(ValidationError::new(format!("current.nodes[{i}]"), "a job's nodes must be of one node group"));
        }
        group = Some(g);
        nodes.push((index, Vec::new()));
    }
    let group = match group {
        Some(g) => g,
        None => eligible_groups(job, cluster)
            .map(|(i, _)| i)
            .next()
            .ok_or_else(|| ValidationError::new("request.gpuType", "no node group of the cluster has this GPU type"))?,
    };
    let g = &cluster.node_groups[group];
    let gpus = cur.placement.gpus();
    let fair = g.fair_cpus_per_gpu();
    let host = curves::host_memory_gib(config, g, &job.model, &cur.plan);
    Ok(Some(Current {
        group,
        plan: cur.plan,
        placement: cur.placement.clone(),
        nodes,
        cpus: cur.cpus.unwrap_or(fair * gpus),
        host_memory_gib: host,
        rounds_since_change: cur.rounds_since_change,
    }))
}

/// A job's allocation as a previous round's schedule gave it.
pub fn current_of_assignment(
    a: &rubick_core::schedule::Assignment,
    cluster: &Cluster,
) -> Result<Option<Current>, rubick_core::error::ValidationError> {
    use rubick_core::error::ValidationError;
    let Some(plan) = a.plan else { return Ok(None) };
    if a.nodes.is_empty() {
        return Ok(None);
    }
    let mut nodes = Vec::new();
    let mut group = None;
    for (i, share) in a.nodes.iter().enumerate() {
        let (g, index) = cluster.node_by_name(&share.node).ok_or_else(|| {
            ValidationError::new(format!("nodes[{i}].node"), format!("`{}` is not a node of the cluster", share.node))
        })?;
        if group.is_some_and(|x| x != g) {
            return Err(ValidationError::new(format!("nodes[{i}].node"), "a job's nodes must be of one node group"));
        }
        let per_node = cluster.node_groups[g].gpus_per_node;
        if let Some(&bad) = share.gpus.iter().find(|&&x| x >= per_node) {
            return Err(ValidationError::new(
                format!("nodes[{i}].gpus"),
                format!("GPU {bad} does not exist on a node of {per_node} GPUs"),
            ));
        }
        group = Some(g);
        nodes.push((index, share.gpus.clone()));
    }
    let placement = Placement::new(a.nodes.iter().map(|s| s.gpus.len() as u32).collect())
        .ok_or_else(|| ValidationError::new("nodes", "no GPUs assigned"))?;
    Ok(Some(Current {
        group: group.unwrap_or(0),
        plan,
        placement,
        nodes,
        cpus: a.nodes.iter().map(|s| s.cpus).sum(),
        host_memory_gib: a.nodes.iter().map(|s| s.host_memory_gib).sum(),
        rounds_since_change: a.rounds_since_change,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint's restriction is never widened by a policy's: narrowed where they
    /// agree, kept where they conflict.
    #[test]
    fn a_restriction_is_narrowed_never_widened() {
        let p = |s: &str| s.parse::<Plan>().unwrap();
        let (dp4, dp8, tp2) = (p("dp4-tp1-pp1-mb4-ga4"), p("dp8-tp1-pp1-mb4-ga2"), p("dp2-tp2-pp1-mb4-ga8"));
        let layout = Restriction::layout_of(&dp4);
        assert_eq!(Restriction::Any.narrowed_by(layout), layout);
        assert_eq!(layout.narrowed_by(Restriction::Any), layout);
        assert_eq!(layout.narrowed_by(Restriction::Exact(dp8)), Restriction::Exact(dp8));
        assert_eq!(layout.narrowed_by(Restriction::Exact(tp2)), layout, "a conflict keeps the checkpoint's");
        assert_eq!(layout.narrowed_by(Restriction::layout_of(&tp2)), layout);
        assert_eq!(Restriction::Exact(dp4).narrowed_by(Restriction::layout_of(&tp2)), Restriction::Exact(dp4));
    }

    /// The quantum's rules over the same finished jobs: the median job's service, the
    /// service-weighted median (half the GPU-time went to jobs below it), either by
    /// load, or fixed.
    #[test]
    fn the_service_quantum_is_the_median_or_the_weighted_median() {
        // Nine one-GPU-hour jobs and one of 91: the median job needs 1 h, but 91 of the
        // 100 GPU-hours went to the long one.
        let mut services = vec![3600.0; 9];
        services.push(91.0 * 3600.0);
        assert_eq!(ServiceQuantum::Median.of(&services, false), Some(3600.0));
        assert_eq!(ServiceQuantum::WeightedMedian.of(&services, false), Some(91.0 * 3600.0));
        assert_eq!(ServiceQuantum::Median.of(&[1.0, 2.0, 4.0, 8.0], false), Some(3.0));
        assert_eq!(ServiceQuantum::WeightedMedian.of(&[1.0, 2.0, 4.0, 8.0], false), Some(8.0));
        assert_eq!(ServiceQuantum::WeightedMedian.of(&[1.0, 1.0, 1.0, 1.0], false), Some(1.0));
        assert_eq!(ServiceQuantum::Median.of(&[], false), None);
        assert_eq!(ServiceQuantum::Fixed(5.0).of(&[], false), Some(5.0));
        // By load: the median while the queue is oversubscribed, else the weighted one.
        assert_eq!(ServiceQuantum::Load.of(&services, true), Some(3600.0));
        assert_eq!(ServiceQuantum::Load.of(&services, false), Some(91.0 * 3600.0));
    }

    /// Past the service quantum a job may make way once per doubling of its service;
    /// below it, without a quantum or with the rule off, the fixed cap holds.
    #[test]
    fn past_the_quantum_the_restart_cap_doubles_with_the_service() {
        let (_, inputs, _) = crate::synth::varied(3, 1, 8, 96, 1600.0, 4);
        let mut job = inputs.iter().find(|i| i.current.is_some()).expect("a running job").clone();
        let quantum = 100.0;
        let config = PlannerConfig { service_quantum_gpu_s: Some(quantum), ..PlannerConfig::default() };
        let cap_at = |job: &mut JobInput, service: f64, config: &PlannerConfig| {
            job.progress.attained_gpu_s = service;
            job.restart_cap(config)
        };
        assert_eq!(cap_at(&mut job, 50.0, &config), Some(5), "below the quantum: the fixed cap");
        assert_eq!(cap_at(&mut job, 100.0, &config), Some(1));
        assert_eq!(cap_at(&mut job, 399.0, &config), Some(2));
        assert_eq!(cap_at(&mut job, 400.0, &config), Some(3));
        assert_eq!(cap_at(&mut job, 100.0 * 1024.0, &config), Some(11), "a long job makes way more often");
        job.restarts = 11;
        assert!(job.restarts_spent(&config));
        job.restarts = 10;
        assert!(!job.restarts_spent(&config));
        let fixed = PlannerConfig { restart_cap_doubles: false, ..config.clone() };
        assert_eq!(cap_at(&mut job, 100.0 * 1024.0, &fixed), Some(5));
        let no_quantum = PlannerConfig { service_quantum_gpu_s: None, ..config.clone() };
        assert_eq!(cap_at(&mut job, 100.0 * 1024.0, &no_quantum), Some(5));
        let no_cap = PlannerConfig { restart_cap: None, ..no_quantum };
        assert_eq!(cap_at(&mut job, 100.0 * 1024.0, &no_cap), None);
    }

    /// The schedule's explanation and the simulator used different rules for "changed";
    /// cores alone did not count.
    #[test]
    fn a_change_of_cores_alone_is_a_change() {
        let (cluster, inputs, _) = crate::synth::varied(3, 1, 8, 96, 1600.0, 4);
        let cur = inputs.iter().find_map(|i| i.current.clone()).expect("a running job");
        let _ = cluster;
        assert_eq!(
            cur.change_to(cur.group, &cur.plan, &cur.placement, &cur.nodes, cur.cpus),
            rubick_core::schedule::Change::Kept
        );
        assert_eq!(
            cur.change_to(cur.group, &cur.plan, &cur.placement, &cur.nodes, cur.cpus + 4),
            rubick_core::schedule::Change::Recored
        );
    }
}
