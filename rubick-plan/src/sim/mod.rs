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
use rubick_core::planner::curves::Evaluator;
use rubick_core::planner::{Current, PlannerConfig, Restriction};
use rubick_core::reference::MeasuredRow;
use rubick_core::space::resolve_code;
use rubick_core::{Cluster, Job, MemoryEstimator, Placement, Plan, PlanCode, PlanRequest};

mod policies;

use policies::View;

/// A scheduling policy of the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
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

/// The plan a job runs as its user asked, on `placement` (its requested GPUs) with
/// `cpus`: the request's plan, else the trace's code taken literally, else (no plan
/// requested) the best plan the belief finds there.
fn users_plan(
    sj: &SimJob,
    cluster: &Cluster,
    evaluator: &mut Evaluator<'_>,
    placement: &Placement,
    cpus: u32,
) -> Option<Plan> {
    request_plan(&sj.job, cluster).or_else(|| traced_plan(sj)).or_else(|| {
        evaluator.best_plan(&sj.job.model, &sj.params, 0, placement, cpus, Restriction::Any).map(|(plan, _)| plan)
    })
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
            let thr = placement.as_ref().and_then(|p| {
                let plan = users_plan(sj, cluster, &mut evaluator, p, cpus)?;
                Some(Evaluator::throughput(&job.model, &sj.params, g, &plan, p, cpus))
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
    let mut policy = policies::build(cluster, config, &planner_config);
    let reconfigures = policy.reconfigures();
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
        if changed || (reconfigures && since_plan == cooldown) {
            decisions += 1;
            since_plan = 0;
            changed = false;
            let view = View { cluster, jobs, state: &state, active: &active, now_s: t };
            let new = policy.decide(&view, round_no);
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
                        if tracing::enabled!(tracing::Level::DEBUG) {
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
                        }
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
