//! The trace-driven cluster simulator: every policy on the same footing.
//!
//! Conventions (the authors' simulator's, see the reference README): a round every
//! `round_s` (60 s); at each round the policy sees the submitted, unfinished jobs and
//! their current allocations and returns new ones; any change of placement or plan,
//! including the first start, costs `restart_penalty_s` (260 s) with no progress; a
//! job ends after its iterations (the trace's steps + 1); JCT = completion -
//! submission; makespan = the end of the round in which the last job finishes.
//!
//! **Ground truth vs belief**: a job progresses at the *measured* iteration time of its
//! (plan, placement) row when the reference table has it (placements equal up to node
//! order), else at its fitted model's prediction (counted in `unmeasured_share`).
//! Policies only ever see predictions.

use std::collections::HashMap;
use std::time::Duration;

use rubick_core::perfmodel::Params;
use rubick_core::planner::curves::{Evaluator, host_memory_gib};
use rubick_core::planner::place::{NodeState, layout, nodes_of, split, take};
use rubick_core::planner::{Current, JobInput, PlannerConfig, Restriction, current_of_assignment};
use rubick_core::reference::MeasuredRow;
use rubick_core::space::resolve_code;
use rubick_core::{Cluster, Job, MemoryEstimator, Placement, Plan, PlanCode, PlanRequest};

use crate::round::{Policy as PlannerPolicy, plan_round_with};

/// A scheduling policy of the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SimPolicy {
    /// Rubick (this project's heuristic): plans and resources together.
    Rubick,
    /// Rubick with the exact MILP each round.
    RubickMilp,
    /// Strict FIFO, the user's plan and GPUs, never reconfigured (a plain batch queue).
    Static,
    /// The same with backfilling: later jobs start when the head does not fit (Slurm's
    /// backfill without reservations).
    StaticBackfill,
    /// Synergy (Mohan et al., OSDI 2022): the user's plan and GPUs, FIFO with
    /// backfilling, CPU cores by the job's sensitivity to them.
    Synergy,
    /// AntMan (Xiao et al., OSDI 2020): guaranteed jobs first, preempting best-effort
    /// ones; the user's plan and GPUs; GPUs are the only resource it manages.
    Antman,
    /// Pollux/Sia-style elastic training (Qiao et al., OSDI 2021; Jayaram Subramanya
    /// et al., SOSP 2023): the GPU count adapts (elastic data parallelism within the
    /// user's plan layout), the plan is fixed, cores follow GPUs (the node's fair
    /// share per GPU).
    Elastic,
    /// Ablation: Rubick without plan changes (resources only: GPUs, cores and memory
    /// within the user's plan layout).
    RubickNoPlan,
    /// Ablation: Rubick without resizing (plans only, the requested GPU count).
    RubickNoResize,
}

impl SimPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            SimPolicy::Rubick => "rubick",
            SimPolicy::RubickMilp => "rubick-milp",
            SimPolicy::Static => "static",
            SimPolicy::StaticBackfill => "static-backfill",
            SimPolicy::Synergy => "synergy",
            SimPolicy::Antman => "antman",
            SimPolicy::Elastic => "elastic",
            SimPolicy::RubickNoPlan => "rubick-no-plan",
            SimPolicy::RubickNoResize => "rubick-no-resize",
        }
    }
}

/// Order in which queued jobs are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Queue {
    /// First come, first served (the paper's).
    Fifo,
    /// Least attained service (GPU-seconds so far; Tiresias): needs no job sizes.
    Las,
    /// Shortest remaining work first: the iterations a job has left times the
    /// predicted GPU-seconds of one on its request (the 2-D counterpart of LAS's
    /// attained GPU-seconds). Rubick's policies weigh every job by it, running ones too.
    Srpt,
}

/// Knobs of a simulation.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub round_s: f64,
    pub restart_penalty_s: f64,
    pub policy: SimPolicy,
    pub queue: Queue,
    pub planner: PlannerConfig,
    pub milp_time_limit: Duration,
    /// Unmeasured configurations run this share slower than predicted (a pessimistic
    /// truth; 0: the prediction is the truth).
    pub unmeasured_slowdown: f64,
}

impl SimConfig {
    /// The authors' conventions (60 s rounds, 260 s restarts) and this project's
    /// defaults for replaying traces: plans of the kinds the reference measured,
    /// guaranteed jobs admitted when their guarantee fits and kept to their plan's
    /// layout with a 30 % margin on predictions, changes worth half a request,
    /// 20-round cooldowns.
    pub fn defaults(policy: SimPolicy, queue: Queue) -> Self {
        SimConfig {
            round_s: 60.0,
            restart_penalty_s: 260.0,
            policy,
            queue,
            planner: PlannerConfig {
                reference_plans_only: true,
                queue_guaranteed: true,
                guarantee_margin: 0.3,
                guarantee_keeps_layout: true,
                change_min_gain: 0.5,
                cooldown_rounds: 20,
                ..PlannerConfig::default()
            },
            milp_time_limit: Duration::from_secs(2),
            unmeasured_slowdown: 0.0,
        }
    }
}

/// One job of a simulation: what the trace says, and the policy's belief of its speed.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub job: Job,
    /// The fitted performance model (belief).
    pub params: Params,
    /// The plan code of the trace when the job's model rejects it (the request then
    /// has no plan); the static policies run it as measured.
    pub trace_code: Option<PlanCode>,
}

/// Measured iteration times by (model, code, placement): the ground truth.
#[derive(Debug, Default, Clone)]
pub struct Truth {
    rows: HashMap<(String, PlanCode, Placement), f64>,
}

impl Truth {
    /// Every measured configuration, for a planner limited to them.
    pub fn measured_set(&self) -> rubick_core::planner::MeasuredSet {
        let mut set = rubick_core::planner::MeasuredSet::default();
        for (model, code, placement) in self.rows.keys() {
            set.insert(model, *code, placement.clone());
        }
        set
    }

    pub fn add(&mut self, model: &str, rows: &[MeasuredRow]) {
        for r in rows {
            self.rows.entry((model.to_owned(), r.code, r.placement.clone())).or_insert(r.iter_time_s);
        }
    }

    /// The measured iteration time of a plan on a placement, if the table has it.
    pub fn measured(&self, model: &str, plan: &Plan, placement: &Placement) -> Option<f64> {
        let code = PlanCode::of(plan)?;
        let key = |c: PlanCode| (model.to_owned(), c, placement.clone());
        self.rows.get(&key(code)).copied().or_else(|| {
            // On one GPU `ga` and `zero-dp` are the same plan.
            (plan.dp == 1 && code == PlanCode::Ga).then(|| self.rows.get(&key(PlanCode::ZeroDp)).copied()).flatten()
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Alloc {
    current: Current,
}

#[derive(Debug, Clone, Default)]
struct State {
    remaining: f64,
    alloc: Option<Alloc>,
    penalty_until: f64,
    first_start: Option<f64>,
    finish: Option<f64>,
    restarts: u32,
    plan_changes: u32,
    gpu_s: f64,
    guarantee_held: bool,
    measured_s: f64,
    unmeasured_s: f64,
    /// Required samples/s (truth of the request), for guaranteed jobs.
    required: f64,
    /// Predicted GPU-seconds per iteration on the request (belief): remaining work.
    work_per_iter: f64,
}

impl State {
    /// Predicted GPU-seconds of work left on the job's request (what `srpt` orders by).
    fn remaining_work(&self) -> f64 {
        self.remaining * self.work_per_iter
    }
}

/// Per-job outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    pub name: String,
    pub model: String,
    pub submit_s: f64,
    pub first_start_s: Option<f64>,
    pub finish_s: Option<f64>,
    pub restarts: u32,
    pub plan_changes: u32,
    pub gpu_hours: f64,
    pub guaranteed: bool,
    pub guarantee_held: bool,
}

impl JobResult {
    pub fn jct_s(&self) -> Option<f64> {
        self.finish_s.map(|f| f - self.submit_s)
    }
}

/// A simulation's outcome.
#[derive(Debug, Clone)]
pub struct SimResult {
    pub jobs: Vec<JobResult>,
    pub makespan_s: f64,
    /// Share of job running time spent in configurations the reference did not measure.
    pub unmeasured_share: f64,
    /// GPUs in use at each round: (time, GPUs).
    pub usage: Vec<(f64, u32)>,
    pub rounds: u64,
    pub decisions: u64,
}

/// The truth's iteration time of a job's allocation, and whether it was measured.
fn true_iter_s(job: &SimJob, truth: &Truth, cluster: &Cluster, c: &Current, slowdown: f64) -> (f64, bool) {
    match truth.measured(&job.job.model.name, &c.plan, &c.placement) {
        Some(t) => (t, true),
        None => {
            let g = &cluster.node_groups[c.group];
            let thr = Evaluator::throughput(&job.job.model, &job.params, g, &c.plan, &c.placement, c.cpus);
            (job.job.model.global_batch as f64 / (thr * (1.0 - slowdown)), false)
        }
    }
}

/// The user's request as a concrete allocation shape: the plan its code resolves to on
/// its GPUs.
fn request_plan(job: &Job, cluster: &Cluster) -> Option<Plan> {
    let g = &cluster.node_groups[0];
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
fn traced_plan(sj: &SimJob) -> Option<Plan> {
    let code = sj.trace_code?;
    let gpus = sj.job.request.gpus;
    let mut plan = code.skeleton(gpus);
    if plan.gpus() != gpus {
        return None;
    }
    let per_replica = (sj.job.model.global_batch / u64::from(plan.dp.max(1))).max(1);
    plan.micro_batch = u32::try_from(per_replica).ok()?;
    Some(plan)
}

/// Places `per_node` (decreasing) best-fit on the nodes of group 0, with `cpus` and
/// `mem` split by GPUs; `None` when it does not fit.
fn place_shape(nodes: &mut [NodeState], per_node: &[u32], cpus: u32, mem: f64) -> Option<Vec<(u32, Vec<u32>)>> {
    let parts = layout(nodes, 0, per_node, cpus, mem, &[])?;
    Some(parts.into_iter().map(|(node, g, c, m)| (nodes[node].index, take(nodes, node, g, c, m, None).gpus)).collect())
}

/// Marks a running job's resources as used (cores and memory split as placement does).
fn occupy(nodes: &mut [NodeState], c: &Current) {
    let counts: Vec<u32> = c.nodes.iter().map(|(_, ix)| ix.len() as u32).collect();
    let total = counts.iter().sum::<u32>().max(1);
    for ((idx, ix), cores) in c.nodes.iter().zip(split(c.cpus, &counts)) {
        if let Some(n) = nodes.iter_mut().find(|n| n.group == c.group && n.index == *idx) {
            for &k in ix {
                if let Some(f) = n.gpu_free.get_mut(k as usize) {
                    *f = false;
                }
            }
            n.cpus_free = n.cpus_free.saturating_sub(cores);
            n.mem_free -= c.host_memory_gib * f64::from(ix.len() as u32) / f64::from(total);
        }
    }
}

/// The queue order of the waiting jobs `ids`.
fn queue_order(ids: &mut [usize], jobs: &[SimJob], state: &[State], queue: Queue) {
    ids.sort_by(|&a, &b| {
        let key = |j: usize| match queue {
            Queue::Fifo => jobs[j].job.submit_time_s,
            Queue::Las => state[j].gpu_s,
            Queue::Srpt => state[j].remaining_work(),
        };
        key(a).total_cmp(&key(b)).then(jobs[a].job.submit_time_s.total_cmp(&jobs[b].job.submit_time_s)).then(a.cmp(&b))
    });
}

/// Runs the simulation. `progress` is called after each round with (finished, total).
pub fn simulate(
    cluster: &Cluster,
    jobs: &[SimJob],
    truth: &Truth,
    config: &SimConfig,
    mut progress: impl FnMut(usize, usize),
) -> SimResult {
    let n = jobs.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| jobs[a].job.submit_time_s.total_cmp(&jobs[b].job.submit_time_s).then(a.cmp(&b)));
    let mut state: Vec<State> = jobs
        .iter()
        .map(|j| State { remaining: j.job.iterations as f64, guarantee_held: true, ..State::default() })
        .collect();
    // Remaining work as the policies see it: iterations x predicted GPU-seconds per
    // iteration on the request.
    {
        let g = &cluster.node_groups[0];
        let mut evaluator = Evaluator::new(cluster, &config.planner);
        for (j, sj) in jobs.iter().enumerate() {
            let job = &sj.job;
            let placement = Placement::packed(job.request.gpus, g.gpus_per_node);
            let cpus = job.request.cpus.unwrap_or(g.fair_cpus_per_gpu() * job.request.gpus);
            let thr = placement.as_ref().and_then(|p| match request_plan(job, cluster).or_else(|| traced_plan(sj)) {
                Some(plan) => Some(Evaluator::throughput(&job.model, &sj.params, g, &plan, p, cpus)),
                None => evaluator.best_plan(&job.model, &sj.params, 0, p, cpus, Restriction::Any).map(|(_, t)| t),
            });
            let thr = thr.filter(|t| t.is_finite() && *t > 0.0).unwrap_or(1.0);
            state[j].work_per_iter = job.model.global_batch as f64 / thr * f64::from(job.request.gpus.max(1));
        }
    }
    // Required throughput of guaranteed jobs: the truth of their request.
    for (j, job) in jobs.iter().enumerate() {
        if let (true, Some(plan), Some(placement)) = (
            job.job.guaranteed,
            request_plan(&job.job, cluster),
            Placement::packed(job.job.request.gpus, cluster.node_groups[0].gpus_per_node),
        ) {
            let c = Current {
                group: 0,
                plan,
                placement,
                nodes: Vec::new(),
                cpus: job.job.request.cpus.unwrap_or(4 * job.job.request.gpus),
                host_memory_gib: 0.0,
                rounds_since_change: 0,
            };
            let (t, _) = true_iter_s(job, truth, cluster, &c, config.unmeasured_slowdown);
            state[j].required = job.job.model.global_batch as f64 / t;
        }
    }
    let round = config.round_s;
    let mut planner_config = config.planner.clone();
    // A job must be able to progress between two changes: a cooldown shorter than the
    // restart penalty lets a policy restart it forever.
    let min_cooldown = (config.restart_penalty_s / round).ceil() as u32 + 1;
    planner_config.cooldown_rounds = planner_config.cooldown_rounds.max(min_cooldown);
    let cooldown = planner_config.cooldown_rounds;
    let deadline = jobs.iter().map(|j| j.job.submit_time_s).fold(0.0, f64::max) + 90.0 * 86_400.0;
    planner_config.default_restart_s = config.restart_penalty_s;
    planner_config.fixed_gpus = config.policy == SimPolicy::RubickNoResize;
    planner_config.fair_cores_only |= config.policy == SimPolicy::Elastic;
    let mut evaluator = Evaluator::new(cluster, &planner_config);
    let mut t = order.first().map_or(0.0, |&j| (jobs[j].job.submit_time_s / round).ceil() * round);
    let mut next_arrival = 0; // index into `order`
    let mut finished = 0;
    let mut usage = Vec::new();
    let (mut rounds, mut decisions) = (0u64, 0u64);
    let mut changed = true;
    let mut since_plan = 0u32;
    let mut round_no = 0u64;
    while finished < n {
        if t > deadline {
            tracing::warn!("{} jobs unfinished 90 days after the last submission; stopping", n - finished);
            break;
        }
        while next_arrival < n && jobs[order[next_arrival]].job.submit_time_s <= t + 1e-9 {
            next_arrival += 1;
            changed = true;
        }
        let active: Vec<usize> = order[..next_arrival].iter().copied().filter(|&j| state[j].finish.is_none()).collect();
        if active.is_empty() {
            // Idle: jump to the round of the next submission.
            if next_arrival < n {
                t = (jobs[order[next_arrival]].job.submit_time_s / round).ceil() * round;
                continue;
            }
            break;
        }
        rounds += 1;
        // Re-plan on arrivals and completions, and when cooldowns end.
        let elastic = !matches!(
            config.policy,
            SimPolicy::Static | SimPolicy::StaticBackfill | SimPolicy::Synergy | SimPolicy::Antman
        );
        if changed || (elastic && since_plan == cooldown) {
            decisions += 1;
            since_plan = 0;
            changed = false;
            evaluator.config.now_s = t;
            let view = View { cluster, jobs, state: &state, active: &active, config };
            let new = decide(&view, &mut evaluator, round_no);
            round_no += 1;
            for (&j, alloc) in active.iter().zip(new) {
                let s = &mut state[j];
                let differs = match (&s.alloc, &alloc) {
                    (None, None) => false,
                    (Some(a), Some(b)) => {
                        a.current.plan != b.current.plan
                            || a.current.group != b.current.group
                            || a.current.nodes != b.current.nodes
                    }
                    _ => true,
                };
                if differs {
                    if let Some(new) = &alloc {
                        let (iter_s, measured) =
                            true_iter_s(&jobs[j], truth, cluster, &new.current, config.unmeasured_slowdown);
                        tracing::debug!(
                            "t={t}: {} -> {} on {} with {} cores ({:.3} samples/s, {}; request {} GPUs)",
                            jobs[j].job.name,
                            new.current.plan,
                            new.current.placement,
                            new.current.cpus,
                            jobs[j].job.model.global_batch as f64 / iter_s,
                            if measured { "measured" } else { "predicted" },
                            jobs[j].job.request.gpus
                        );
                        if s.alloc.is_some() || s.first_start.is_some() {
                            s.restarts += 1;
                        }
                        if s.alloc.as_ref().is_some_and(|a| a.current.plan != new.current.plan) {
                            s.plan_changes += 1;
                        }
                        s.first_start.get_or_insert(t);
                        s.penalty_until = t + config.restart_penalty_s;
                    }
                    if alloc.is_none() {
                        tracing::debug!("t={t}: {} paused", jobs[j].job.name);
                    }
                    s.alloc = alloc.map(|mut a| {
                        a.current.rounds_since_change = 0;
                        a
                    });
                } else if let Some(a) = &mut s.alloc {
                    a.current.rounds_since_change = a.current.rounds_since_change.saturating_add(1);
                }
            }
        } else {
            since_plan += 1;
            for &j in &active {
                if let Some(a) = &mut state[j].alloc {
                    a.current.rounds_since_change = a.current.rounds_since_change.saturating_add(1);
                }
            }
        }
        // Advance the round under the truth.
        let end = t + round;
        let mut in_use = 0;
        for &j in &active {
            let s = &mut state[j];
            let Some(a) = &s.alloc else { continue };
            let gpus = a.current.placement.gpus();
            in_use += gpus;
            let (iter_s, measured) = true_iter_s(&jobs[j], truth, cluster, &a.current, config.unmeasured_slowdown);
            let start = s.penalty_until.max(t);
            let mut stop = end;
            if start < end {
                let can = (end - start) / iter_s;
                if s.remaining <= can {
                    stop = start + s.remaining * iter_s;
                    s.remaining = 0.0;
                    s.finish = Some(stop);
                } else {
                    s.remaining -= can;
                }
            }
            let held = stop - t;
            s.gpu_s += f64::from(gpus) * held;
            if measured {
                s.measured_s += held;
            } else {
                s.unmeasured_s += held;
            }
            if jobs[j].job.guaranteed
                && s.required > 0.0
                && jobs[j].job.model.global_batch as f64 / iter_s < s.required * 0.99
            {
                if s.guarantee_held {
                    tracing::debug!(
                        "{}: {} on {} runs at {:.3} samples/s ({}), below its guarantee {:.3}",
                        jobs[j].job.name,
                        a.current.plan,
                        a.current.placement,
                        jobs[j].job.model.global_batch as f64 / iter_s,
                        if measured { "measured" } else { "predicted" },
                        s.required
                    );
                }
                s.guarantee_held = false;
            }
            if s.finish.is_some() {
                s.alloc = None;
                finished += 1;
                changed = true;
            }
        }
        if in_use == 0 && next_arrival == n && !changed {
            // Nothing runs and nothing will arrive: the rest can never start.
            tracing::warn!("{} jobs can never start on this cluster under {}", n - finished, config.policy.as_str());
            usage.push((t, 0));
            break;
        }
        usage.push((t, in_use));
        progress(finished, n);
        t = end;
    }
    let results: Vec<JobResult> = jobs
        .iter()
        .zip(&state)
        .map(|(j, s)| JobResult {
            name: j.job.name.clone(),
            model: j.job.model.name.clone(),
            submit_s: j.job.submit_time_s,
            first_start_s: s.first_start,
            finish_s: s.finish,
            restarts: s.restarts,
            plan_changes: s.plan_changes,
            gpu_hours: s.gpu_s / 3600.0,
            guaranteed: j.job.guaranteed,
            guarantee_held: s.guarantee_held,
        })
        .collect();
    let last = results.iter().filter_map(|r| r.finish_s).fold(0.0, f64::max);
    let makespan_s = (last / round).ceil() * round;
    let (m, u): (f64, f64) = state.iter().fold((0.0, 0.0), |(m, u), s| (m + s.measured_s, u + s.unmeasured_s));
    SimResult {
        jobs: results,
        makespan_s,
        unmeasured_share: if m + u > 0.0 { u / (m + u) } else { 0.0 },
        usage,
        rounds,
        decisions,
    }
}

/// What a policy sees at a decision.
#[derive(Clone, Copy)]
struct View<'a> {
    cluster: &'a Cluster,
    jobs: &'a [SimJob],
    state: &'a [State],
    /// Submitted, unfinished jobs (indices into `jobs`).
    active: &'a [usize],
    config: &'a SimConfig,
}

/// One decision of the policy: an allocation (or none) per active job.
fn decide(view: &View<'_>, evaluator: &mut Evaluator<'_>, round: u64) -> Vec<Option<Alloc>> {
    match view.config.policy {
        SimPolicy::Static | SimPolicy::StaticBackfill | SimPolicy::Synergy | SimPolicy::Antman => {
            static_policy(view, evaluator)
        }
        _ => planner_policy(view, evaluator, round),
    }
}

/// The policies that run the user's plan on the user's GPUs: `static` (strict FIFO),
/// `static-backfill`, `synergy` (backfill; cores by sensitivity) and `antman`
/// (guaranteed first, preempting best-effort jobs; GPUs only).
fn static_policy(view: &View<'_>, evaluator: &mut Evaluator<'_>) -> Vec<Option<Alloc>> {
    let View { cluster, jobs, state, active, config } = *view;
    let mut nodes = nodes_of(cluster);
    let mut out: Vec<Option<Alloc>> = active.iter().map(|&j| state[j].alloc.clone()).collect();
    for a in out.iter().flatten() {
        occupy(&mut nodes, &a.current);
    }
    let mut waiting: Vec<usize> = active.iter().copied().filter(|&j| state[j].alloc.is_none()).collect();
    queue_order(&mut waiting, jobs, state, config.queue);
    if config.policy == SimPolicy::Antman {
        // Guaranteed jobs first (stable: queue order within each class).
        waiting.sort_by_key(|&j| !jobs[j].job.guaranteed);
    }
    let g = &cluster.node_groups[0];
    let fair = g.fair_cpus_per_gpu();
    for j in waiting {
        let job = &jobs[j].job;
        let placement = Placement::packed(job.request.gpus, g.gpus_per_node);
        let requested_cpus = job.request.cpus.unwrap_or(fair * job.request.gpus);
        // The user's plan; without one (or one our model of the job rejects), the best
        // plan on the requested GPUs.
        let plan = request_plan(job, cluster).or_else(|| traced_plan(&jobs[j])).or_else(|| {
            let p = placement.as_ref()?;
            evaluator
                .best_plan(&job.model, &jobs[j].params, 0, p, requested_cpus, Restriction::Any)
                .map(|(plan, _)| plan)
        });
        let (Some(plan), Some(placement)) = (plan, placement) else { continue };
        let mem = host_memory_gib(&config.planner, g, &job.model, &plan);
        let gpus = placement.gpus();
        // Cores: the request; Synergy gives the fewest cores per GPU within 1 % of the
        // best predicted throughput (sensitive jobs more, others less); AntMan manages
        // GPUs only (cores as requested, or whatever is left on the nodes).
        let core_options: Vec<u32> = match config.policy {
            SimPolicy::Synergy => {
                let widest = placement.max_per_node().max(1);
                let levels: Vec<u32> = [config.planner.base_cpus_per_gpu(g), fair, fair * 2]
                    .into_iter()
                    .filter(|l| l * widest <= g.cpu_cores)
                    .map(|l| l * gpus)
                    .collect();
                let thr = |c: u32| Evaluator::throughput(&job.model, &jobs[j].params, g, &plan, &placement, c);
                let best = levels.iter().map(|&c| thr(c)).fold(0.0, f64::max);
                let mut ok: Vec<u32> = levels.into_iter().filter(|&c| thr(c) >= best * 0.99).collect();
                ok.push(requested_cpus);
                ok.sort_unstable();
                ok.dedup();
                ok
            }
            SimPolicy::Antman => vec![requested_cpus, gpus],
            _ => vec![requested_cpus],
        };
        let on_nodes = |nodes: Vec<(u32, Vec<u32>)>, cpus: u32| Current {
            group: 0,
            plan,
            placement: placement.clone(),
            nodes,
            cpus,
            host_memory_gib: mem,
            rounds_since_change: 0,
        };
        let mut placed = None;
        for cpus in core_options {
            if let Some(ix) = place_shape(&mut nodes, placement.per_node(), cpus, mem) {
                placed = Some(on_nodes(ix, cpus));
                break;
            }
        }
        // AntMan: a guaranteed job preempts best-effort jobs, latest started first.
        if placed.is_none() && config.policy == SimPolicy::Antman && job.guaranteed {
            let before = out.clone();
            let mut victims: Vec<usize> =
                (0..active.len()).filter(|&k| out[k].is_some() && !jobs[active[k]].job.guaranteed).collect();
            victims.sort_by(|&a, &b| {
                let start = |k: usize| state[active[k]].first_start.unwrap_or(f64::INFINITY);
                start(b).total_cmp(&start(a)).then(b.cmp(&a))
            });
            for k in victims {
                out[k] = None;
                nodes = nodes_of(cluster);
                for a in out.iter().flatten() {
                    occupy(&mut nodes, &a.current);
                }
                if let Some(ix) = place_shape(&mut nodes, placement.per_node(), requested_cpus, mem) {
                    placed = Some(on_nodes(ix, requested_cpus));
                    break;
                }
            }
            if placed.is_none() {
                // Preempting did not make room: restore.
                out = before;
                nodes = nodes_of(cluster);
                for a in out.iter().flatten() {
                    occupy(&mut nodes, &a.current);
                }
            }
        }
        if placed.is_none() {
            tracing::trace!("{}: {plan} on {placement} does not fit now", job.name);
        }
        let k = active.iter().position(|&a| a == j).unwrap_or(0);
        match placed {
            Some(current) => out[k] = Some(Alloc { current }),
            None if config.policy == SimPolicy::Static => break,
            None => {}
        }
    }
    out
}

fn planner_policy(view: &View<'_>, evaluator: &mut Evaluator<'_>, round: u64) -> Vec<Option<Alloc>> {
    let View { cluster, jobs, state, active, config } = *view;
    // Queue order becomes weight: the head of the queue counts up to twice as much.
    let mut waiting: Vec<usize> = active.iter().copied().filter(|&j| state[j].alloc.is_none()).collect();
    queue_order(&mut waiting, jobs, state, config.queue);
    let rank: HashMap<usize, usize> = waiting.iter().enumerate().map(|(r, &j)| (j, r)).collect();
    let median_work = {
        let mut w: Vec<f64> = active.iter().map(|&j| state[j].remaining_work()).collect();
        w.sort_by(f64::total_cmp);
        w.get(w.len() / 2).copied().unwrap_or(1.0).max(1.0)
    };
    let inputs: Vec<JobInput> = active
        .iter()
        .map(|&j| {
            let sj = &jobs[j];
            let mut job = sj.job.clone();
            job.iterations = state[j].remaining.ceil().max(1.0) as u64;
            let allowed = match config.policy {
                SimPolicy::RubickNoPlan | SimPolicy::Elastic => {
                    request_plan(&job, cluster).map_or(Restriction::Any, |p| Restriction::layout_of(&p))
                }
                _ => Restriction::Any,
            };
            let priority = match config.queue {
                // Shortest remaining work first: every job, running ones too, weighs
                // by the median remaining work over its own (Smith's rule: the
                // objective then counts the share of remaining work done per second),
                // within 1/16..16.
                Queue::Srpt => (median_work / state[j].remaining_work().max(1.0)).clamp(1.0 / 16.0, 16.0),
                _ => rank.get(&j).map_or(1.0, |&r| 1.0 + (waiting.len() - r) as f64 / waiting.len().max(1) as f64),
            };
            JobInput {
                job,
                params: sj.params.clone(),
                current: state[j].alloc.as_ref().map(|a| a.current.clone()),
                allowed,
                priority,
            }
        })
        .collect();
    let policy = if config.policy == SimPolicy::RubickMilp { PlannerPolicy::RubickMilp } else { PlannerPolicy::Rubick };
    match plan_round_with(evaluator, &inputs, policy, config.milp_time_limit, round) {
        Ok(r) => r
            .outcome
            .schedule
            .assignments
            .iter()
            .map(|a| current_of_assignment(a, cluster).ok().flatten().map(|current| Alloc { current }))
            .collect(),
        Err(e) => {
            tracing::debug!("round at {}: {e}; allocations kept", evaluator.config.now_s);
            active.iter().map(|&j| state[j].alloc.clone()).collect()
        }
    }
}
