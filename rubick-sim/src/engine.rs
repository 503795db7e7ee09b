//! The trace-driven cluster simulator: every policy on the same footing.
//!
//! Conventions (the authors' simulator's, see the reference README): a round every
//! `round_s` (60 s); at each round the policy sees the submitted, unfinished jobs and
//! their current allocations and returns new ones; any change of placement or plan,
//! including the first start, costs `restart_penalty_s` (260 s) with no progress; a
//! job ends after its iterations (the trace's steps + 1); JCT = completion -
//! submission; makespan = the end of the round in which the last job finishes (with a
//! job left unfinished, at least when the simulation stopped: a lower bound).
//!
//! **Ground truth vs belief**: a job progresses at the truth's iteration time of its
//! allocation ([`crate::truth`]: measured rows, scaled by an oracle fitted on all
//! of them for micro-batch, accumulation and cores, the oracle elsewhere; each second
//! classed measured, interpolated or extrapolated), times a log-normal noise drawn per
//! allocation. Policies only ever see their beliefs (models fitted on a few rows).
//!
//! **Guarantees**: a guaranteed job, once admitted, violates its guarantee for every
//! second it is paused or runs below the truth of its request (noise aside: it would
//! have hit the request alike), unless it runs exactly as requested (its plan on its
//! GPUs, packed or where the request was measured, with its cores).

use std::borrow::Borrow;
use std::time::Duration;

use crate::truth::Truth;
use rubick_core::{Cluster, Job, PlanCode};
use rubick_model::belief::Belief;
use rubick_model::perfmodel::Params;
use rubick_planner::curves::Evaluator;
use rubick_planner::{Candidates, Current, JobInput, PlannerConfig, Progress, ReferencePlans};

use rubick_policy::{Policy, PolicyOptions, Queue, Registration, View};

mod job;
use job::{Running, State};

/// Knobs of a simulation.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub round_s: f64,
    /// Every policy decides every this many seconds (rounded up to whole rounds), and
    /// whenever a job arrives or finishes; `None`: on those events only (and, for a
    /// policy that reconfigures, when cooldowns end: the simulator's earlier behaviour).
    pub interval_s: Option<f64>,
    pub restart_penalty_s: f64,
    /// The policy, from [`rubick_policy::REGISTRY`].
    pub policy: &'static Registration,
    pub queue: Queue,
    pub planner: PlannerConfig,
    /// Only configurations the truth measured are offered (besides a job's request and
    /// current allocation): the truth stays measured.
    pub measured_only: bool,
    pub milp_time_limit: Duration,
    /// Log-normal noise on true iteration times: each allocation of a job runs
    /// `exp(sigma * z)` times its truth, `z` standard normal (0: none).
    pub noise_sigma: f64,
    /// Seed of the noise (a replica of the simulation).
    pub seed: u64,
}

impl SimConfig {
    /// The authors' conventions (60 s rounds, 260 s restarts) and this project's
    /// defaults for replaying traces: plans of the kinds the reference measured,
    /// guaranteed jobs admitted when their guarantee fits and kept to their plan's
    /// layout with a 30 % margin on predictions, the planner's restart rules
    /// (restart factor, 2x growth, 5-restart cap, requests kept, scale-out efficiency;
    /// see [`PlannerConfig`]), decisions every 60 s, the reference's profiled cores per
    /// GPU. The earlier defaults: changes worth half a request, 20-round cooldowns and
    /// decisions on events only (`--change-min-gain 0.5 --cooldown 20 --interval 0
    /// --restart-factor false --max-growth 0 --restart-cap 0 --keep-request false
    /// --scale-out-efficiency 0`).
    pub fn defaults(policy: &'static Registration, queue: Queue) -> Self {
        SimConfig {
            round_s: 60.0,
            interval_s: Some(DEFAULT_INTERVAL_S),
            restart_penalty_s: 260.0,
            policy,
            queue,
            planner: PlannerConfig {
                candidates: Candidates::default().and(std::sync::Arc::new(ReferencePlans)),
                queue_guaranteed: true,
                guarantee_margin: 0.3,
                guarantee_keeps_layout: true,
                change_min_gain: PlannerConfig::default().change_min_gain,
                cooldown_rounds: PlannerConfig::default().cooldown_rounds,
                profiled_cpus_per_gpu: Some(rubick_model::reference::TESTBED_PROFILED_CPUS_PER_GPU),
                ..PlannerConfig::default()
            },
            milp_time_limit: Duration::from_secs(2),
            measured_only: false,
            noise_sigma: 0.0,
            seed: 0,
        }
    }
}

/// Seconds between decisions by default: Sia's and Pollux's 60 s rounds (Gavel and
/// others decide every 360 s).
pub const DEFAULT_INTERVAL_S: f64 = 60.0;

/// One job of a simulation: what the trace says, and the policy's belief of its speed.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub job: Job,
    /// The fitted performance model (belief).
    pub params: Params,
    /// The plan code of the trace when the job's model rejects it (the request then
    /// has no plan; e.g. the reference's GPT-2 `151`, TP 5 of 19 heads): the static
    /// policies run it as measured.
    pub trace_code: Option<PlanCode>,
}

impl SimJob {
    /// [`Job::example`] with its belief the FLOPs-based default (for tests and examples).
    pub fn example(name: &str, code: PlanCode, gpus: u32, cpus: u32, guaranteed: bool) -> SimJob {
        let job = Job::example(name, code, gpus, cpus, guaranteed);
        let params = rubick_model::belief::default_params(&job.model);
        SimJob { job, params, trace_code: None }
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
    /// Times it was paused while running (each resume is one of its restarts).
    pub pauses: u32,
    pub plan_changes: u32,
    pub gpu_hours: f64,
    /// GPU-hours it held while restarting (checkpoint, relaunch, warm-up: no progress).
    pub restart_gpu_hours: f64,
    pub guaranteed: bool,
    /// Seconds this guaranteed job was paused or below its guarantee after admission.
    pub violation_s: f64,
    /// Running seconds by basis of the truth (measured, interpolated, extrapolated).
    pub basis_s: [f64; 3],
}

impl JobResult {
    pub fn jct_s(&self) -> Option<f64> {
        self.finish_s.map(|f| f - self.submit_s)
    }

    /// Whether a guaranteed job's guarantee held all along.
    pub fn guarantee_held(&self) -> bool {
        self.violation_s <= 0.0
    }
}

/// A simulation's outcome.
#[derive(Debug, Clone)]
pub struct SimResult {
    pub jobs: Vec<JobResult>,
    /// The end of the round in which the last job finished.
    pub makespan_s: f64,
    /// When the simulation stopped (unfinished jobs are censored there).
    pub end_s: f64,
    /// GPUs in use at each round: (time, GPUs).
    pub usage: Vec<(f64, u32)>,
    pub rounds: u64,
    pub decisions: u64,
}

/// Where a simulation's jobs come from: each job with its index in the trace, by
/// submission time (then index), made as the simulation reaches them. A slice of jobs
/// lends them; a [`crate::trace::Trace`] makes each when it arrives, so memory holds
/// the jobs present, not the whole trace.
pub trait JobSource: Sync {
    /// A job as the simulation holds it while present.
    type Job<'s>: Borrow<SimJob>
    where
        Self: 's;

    /// How many jobs there are.
    fn count(&self) -> usize;

    /// The jobs by submission time (then index), each with its index.
    fn arrivals(&self) -> impl Iterator<Item = (usize, Self::Job<'_>)>;
}

impl JobSource for [SimJob] {
    type Job<'s> = &'s SimJob;

    fn count(&self) -> usize {
        self.len()
    }

    fn arrivals(&self) -> impl Iterator<Item = (usize, &SimJob)> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|a, b| self[*a].job.submit_time_s.total_cmp(&self[*b].job.submit_time_s).then(a.cmp(b)));
        order.into_iter().map(|j| (j, &self[j]))
    }
}

impl JobSource for Vec<SimJob> {
    type Job<'s> = &'s SimJob;

    fn count(&self) -> usize {
        self.len()
    }

    fn arrivals(&self) -> impl Iterator<Item = (usize, &SimJob)> {
        self.as_slice().arrivals()
    }
}

/// Runs the simulation under `config.policy`. `progress` is called after each round
/// with (finished, total).
pub fn simulate<S: JobSource + ?Sized>(
    cluster: &Cluster,
    jobs: &S,
    truth: &Truth,
    config: &SimConfig,
    progress: impl FnMut(usize, usize),
) -> SimResult {
    let planner = planner_config(config, truth);
    let options =
        PolicyOptions { queue: config.queue, planner: planner.clone(), milp_time_limit: config.milp_time_limit };
    let mut policy = config.policy.build(cluster, &options);
    let reconfigures = policy.reconfigures();
    Simulation::new(cluster, (jobs.count(), jobs.arrivals()), truth, config, &planner, reconfigures)
        .run(policy.as_mut(), progress)
}

/// The planner knobs of a simulation: a job must be able to progress between two
/// changes (a cooldown shorter than the restart penalty lets a policy restart it
/// forever), a restart costs the penalty, and with `measured_only` only configurations
/// the truth measured are offered.
pub fn planner_config(config: &SimConfig, truth: &Truth) -> PlannerConfig {
    let mut planner = config.planner.clone();
    let min_cooldown = (config.restart_penalty_s / config.round_s).ceil() as u32 + 1;
    planner.cooldown_rounds = planner.cooldown_rounds.max(min_cooldown);
    planner.default_restart_s = config.restart_penalty_s;
    planner.explain = false;
    if config.measured_only {
        planner.candidates = planner.candidates.and(std::sync::Arc::clone(&truth.table) as _);
    }
    planner
}

/// A job present in a simulation: submitted, not finished.
struct Present<J> {
    /// Its index in the trace.
    index: usize,
    job: J,
    state: State,
}

/// `into` made `from`, keeping its allocations when the job holds the same GPUs (only
/// its rounds since a change, cores or plan differ).
fn refresh(into: &mut Option<Current>, from: Option<&Current>) {
    match (into.as_mut(), from) {
        (Some(a), Some(b)) if a.placement == b.placement && a.nodes == b.nodes => {
            (a.group, a.plan, a.cpus) = (b.group, b.plan, b.cpus);
            (a.host_memory_gib, a.rounds_since_change) = (b.host_memory_gib, b.rounds_since_change);
        }
        _ => *into = from.cloned(),
    }
}

/// A simulation in progress, as steps: [`Simulation::arrive`] (submitted jobs join;
/// the clock skips idle time), [`Simulation::decide`] (the policy decides when a job
/// arrived or finished, or a cooldown ended), [`Simulation::advance`] (one round under
/// the truth) and [`Simulation::results`]. [`Simulation::run`] drives them. Only the
/// jobs present are held (and one line of outcome per finished job).
pub struct Simulation<'a, J, I: Iterator<Item = (usize, J)>> {
    cluster: &'a Cluster,
    truth: &'a Truth,
    config: &'a SimConfig,
    /// Resolves each arriving job's request (its own caches).
    evaluator: Evaluator<'a>,
    /// Rounds after a change before a reconfiguring policy is asked again.
    cooldown: u32,
    reconfigures: bool,
    /// Jobs still to arrive, by submission time (then index).
    pending: std::iter::Peekable<I>,
    /// How many jobs in all.
    total: usize,
    /// Submitted, unfinished jobs, in submission order.
    active: Vec<Present<J>>,
    /// The active jobs as the policy sees them (in the same order), refreshed in place
    /// before each decision: a decision every round reallocates nothing that stayed.
    seen: Vec<JobInput>,
    /// Outcomes of the jobs that left, with their index.
    done: Vec<(usize, JobResult)>,
    /// The latest submission so far (from 0).
    last_submit_s: f64,
    /// The clock: the start of the current round.
    t: f64,
    usage: Vec<(f64, u32)>,
    rounds: u64,
    decisions: u64,
    /// Decisions asked of the policy so far (the round number it sees).
    round_no: u64,
    /// Rounds since the last decision.
    since_plan: u32,
    /// A job arrived or finished since the last decision.
    changed: bool,
}

impl<J, I: Iterator<Item = (usize, J)>> std::fmt::Debug for Simulation<'_, J, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("t", &self.t)
            .field("total", &self.total)
            .field("active", &self.active.len())
            .field("done", &self.done.len())
            .field("rounds", &self.rounds)
            .finish_non_exhaustive()
    }
}

/// A simulation is stopped this long after the last submission.
const GIVE_UP_AFTER_S: f64 = 90.0 * 86_400.0;

impl<'a, J: Borrow<SimJob>, I: Iterator<Item = (usize, J)>> Simulation<'a, J, I> {
    /// A simulation of `total` jobs arriving from `arrivals` (by submission time, then
    /// index) on `cluster`, nothing submitted yet. `planner` is the policy's (see
    /// [`planner_config`]); `reconfigures`: whether the policy also decides when
    /// cooldowns end.
    pub fn new(
        cluster: &'a Cluster,
        (total, arrivals): (usize, I),
        truth: &'a Truth,
        config: &'a SimConfig,
        planner: &PlannerConfig,
        reconfigures: bool,
    ) -> Self {
        let mut pending = arrivals.peekable();
        let round = config.round_s;
        let t = pending.peek().map_or(0.0, |(_, j)| (j.borrow().job.submit_time_s / round).ceil() * round);
        Simulation {
            cluster,
            truth,
            config,
            evaluator: Evaluator::new(cluster, planner),
            cooldown: planner.cooldown_rounds,
            reconfigures,
            pending,
            total,
            active: Vec::new(),
            seen: Vec::new(),
            done: Vec::new(),
            last_submit_s: 0.0,
            t,
            usage: Vec::new(),
            rounds: 0,
            decisions: 0,
            round_no: 0,
            since_plan: 0,
            changed: true,
        }
    }

    /// Every step until every job finished, none can, or 90 days passed after the last
    /// submission; `progress` after each round with (finished, total).
    pub fn run(mut self, policy: &mut dyn Policy, mut progress: impl FnMut(usize, usize)) -> SimResult {
        while self.arrive() {
            self.decide(policy);
            if !self.advance() {
                break;
            }
            progress(self.done.len(), self.total);
        }
        self.results()
    }

    /// The jobs submitted by the current round join (each job's request, and for a
    /// guaranteed job the truth of its request, resolved once); while none is active,
    /// the clock jumps to the round of the next submission. `false`: the simulation is
    /// over.
    pub fn arrive(&mut self) -> bool {
        let round = self.config.round_s;
        loop {
            // Before the last arrival the clock cannot pass the give-up time (it only
            // ever runs a round past a submission).
            if self.pending.peek().is_none() && self.t > self.last_submit_s + GIVE_UP_AFTER_S {
                if !self.active.is_empty() {
                    tracing::warn!("{} jobs unfinished 90 days after the last submission; stopping", self.active.len());
                }
                return false;
            }
            while let Some((index, job)) = self.pending.next_if(|(_, j)| j.borrow().job.submit_time_s <= self.t + 1e-9)
            {
                let sj = job.borrow();
                self.last_submit_s = self.last_submit_s.max(sj.job.submit_time_s);
                let state = State::of(sj, self.cluster, self.truth, &mut self.evaluator);
                let mut seen = JobInput::new(sj.job.clone(), Belief::from(sj.params.clone()));
                seen.trace_code = sj.trace_code;
                self.seen.push(seen);
                self.active.push(Present { index, job, state });
                self.changed = true;
            }
            if !self.active.is_empty() {
                self.rounds += 1;
                return true;
            }
            let Some((_, next)) = self.pending.peek() else { return false };
            // Idle: jump to the round of the next submission.
            self.t = (next.borrow().job.submit_time_s / round).ceil() * round;
        }
    }

    /// The policy decides, when a job arrived or finished since it last did, or (a
    /// policy that reconfigures) when cooldowns end; any change restarts a job.
    pub fn decide(&mut self, policy: &mut dyn Policy) {
        let round = self.config.round_s;
        let periodic = match self.config.interval_s {
            Some(every) => f64::from(self.since_plan + 1) * round >= every - 1e-9,
            None => self.reconfigures && self.since_plan == self.cooldown,
        };
        if !(self.changed || periodic) {
            self.since_plan += 1;
            for p in &mut self.active {
                if let Some(a) = &mut p.state.alloc {
                    a.rounds_since_change = a.rounds_since_change.saturating_add(1);
                }
            }
            return;
        }
        self.decisions += 1;
        self.since_plan = 0;
        self.changed = false;
        let t = self.t;
        for (p, seen) in self.active.iter().zip(&mut self.seen) {
            let s = &p.state;
            refresh(&mut seen.current, s.alloc.as_ref());
            // A paused job resumes at any plan here (its checkpoint restriction applies
            // only while it runs: `JobInput::restriction`): `allowed` stays `Any`.
            seen.restarts = s.restarts;
            seen.restoring = s.alloc.is_some() && s.penalty_until > t + 1e-9;
            seen.progress = Progress {
                remaining: s.remaining,
                remaining_work: s.remaining_work(),
                attained_gpu_s: s.gpu_s,
                first_start_s: s.first_start,
                max_gpus: s.max_gpus,
            };
        }
        let configs: Option<&dyn rubick_planner::CandidateFilter> = Some(self.truth.table.as_ref());
        let view = View { cluster: self.cluster, jobs: &self.seen, now_s: t, configs };
        let new = policy.decide(&view, self.round_no);
        self.round_no += 1;
        for (p, alloc) in self.active.iter_mut().zip(new) {
            p.state.apply(p.index, p.job.borrow(), alloc, t, self.cluster, self.truth, self.config);
        }
    }

    /// One round under the truth: jobs progress at their allocation's true speed after
    /// any restart penalty, guarantees are checked, finished jobs leave. `false`: nothing
    /// runs and nothing will arrive, so the rest can never start.
    pub fn advance(&mut self) -> bool {
        let (round, t) = (self.config.round_s, self.t);
        let end = t + round;
        let mut in_use = 0;
        let mut left = false;
        for p in &mut self.active {
            let (running, gpus) = p.state.advance(p.job.borrow(), t, round, self.cluster, self.truth);
            in_use += gpus;
            left |= running == Running::Finished;
        }
        if left {
            let (active, done) = (std::mem::take(&mut self.active), &mut self.done);
            let seen = std::mem::take(&mut self.seen);
            for (p, seen) in active.into_iter().zip(seen) {
                if p.state.finish.is_some() {
                    done.push((p.index, p.state.result(p.job.borrow())));
                } else {
                    self.active.push(p);
                    self.seen.push(seen);
                }
            }
            self.changed = true;
        }
        if in_use == 0 && self.pending.peek().is_none() && !self.changed {
            // Nothing runs and nothing will arrive: the rest can never start.
            tracing::warn!(
                "{} jobs can never start on this cluster under {}",
                self.active.len(),
                self.config.policy.name
            );
            self.usage.push((t, 0));
            self.t = end;
            return false;
        }
        self.usage.push((t, in_use));
        self.t = end;
        true
    }

    /// Every job's outcome (in trace order), the makespan and the usage over time.
    pub fn results(self) -> SimResult {
        let round = self.config.round_s;
        let mut results = self.done;
        results.extend(self.active.iter().map(|p| (p.index, p.state.result(p.job.borrow()))));
        // Jobs that never arrived (none do, unless a caller stops early): never started.
        results.extend(self.pending.map(|(index, job)| (index, State::default().result(job.borrow()))));
        results.sort_by_key(|(j, _)| *j);
        let results: Vec<JobResult> = results.into_iter().map(|(_, r)| r).collect();
        // Censored where a job is left unfinished: at least when the simulation stopped
        // (a lower bound), never the last finish alone.
        let last = results.iter().filter_map(|r| r.finish_s).fold(0.0, f64::max);
        let last = if results.iter().any(|r| r.finish_s.is_none()) { last.max(self.t) } else { last };
        let makespan_s = (last / round).ceil() * round;
        SimResult {
            jobs: results,
            makespan_s,
            end_s: self.t,
            usage: self.usage,
            rounds: self.rounds,
            decisions: self.decisions,
        }
    }
}

/// Runs `seeds` replicas of the simulation (seeds `config.seed`, `+1`, ...), two at a
/// time; results in seed order, each as deterministic as one run.
pub fn simulate_seeds<S: JobSource + ?Sized>(
    cluster: &Cluster,
    jobs: &S,
    truth: &Truth,
    config: &SimConfig,
    seeds: u32,
    progress: impl Fn(usize, usize) + Sync,
) -> Vec<SimResult> {
    let configs: Vec<SimConfig> =
        (0..u64::from(seeds.max(1))).map(|k| SimConfig { seed: config.seed + k, ..config.clone() }).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let mut results: Vec<Option<SimResult>> = vec![None; configs.len()];
    for batch in configs.chunks(threads).zip(results.chunks_mut(threads)) {
        let (cs, out) = batch;
        std::thread::scope(|scope| {
            let handles: Vec<_> =
                cs.iter().map(|c| scope.spawn(|| simulate(cluster, jobs, truth, c, &progress))).collect();
            for (h, slot) in handles.into_iter().zip(out.iter_mut()) {
                // A replica that panicked is a bug: never a summary of fewer seeds.
                *slot = Some(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            }
        });
    }
    results.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use rubick_core::Placement;
    use rubick_model::perfmodel::Links;

    use crate::truth::TruthMode;
    use rubick_policy::request_plan;

    use super::job::normal;
    use super::*;

    /// A LLaMA-2-7B-like job on `gpus` GPUs of the testbed asking `cpus` cores.
    fn job(name: &str, code: PlanCode, gpus: u32, cpus: u32, guaranteed: bool) -> SimJob {
        SimJob::example(name, code, gpus, cpus, guaranteed)
    }

    /// No measured rows: the truth is the belief.
    fn no_rows() -> Truth {
        Truth::new(TruthMode::Oracle, &[], Links::from(&Cluster::example().node_groups[0]), 4).unwrap()
    }

    /// The user's plan on the first GPUs of node 0 with `cpus` cores.
    fn alloc(sj: &SimJob, cluster: &Cluster, cpus: u32) -> Current {
        let gpus = sj.job.request.gpus;
        Current {
            group: 0,
            plan: request_plan(&sj.job, cluster, 0).unwrap(),
            placement: Placement::new(vec![gpus]).unwrap(),
            nodes: vec![(0, (0..gpus).collect())],
            cpus,
            host_memory_gib: 64.0,
            rounds_since_change: 0,
        }
    }

    /// Decision k gives job 0 `script[k]` (the last entry from then on).
    struct Scripted(Vec<Option<Current>>);

    impl Policy for Scripted {
        fn reconfigures(&self) -> bool {
            true
        }

        fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Current>> {
            let k = (round as usize).min(self.0.len() - 1);
            view.jobs.iter().map(|_| self.0[k].clone()).collect()
        }
    }

    fn run(jobs: &[SimJob], script: Vec<Option<Current>>) -> SimResult {
        let cluster = Cluster::example();
        let config = SimConfig::defaults(rubick_policy::lookup("rubick").unwrap(), Queue::Fifo);
        let truth = no_rows();
        let planner = planner_config(&config, &truth);
        Simulation::new(&cluster, (jobs.len(), jobs.arrivals()), &truth, &config, &planner, true)
            .run(&mut Scripted(script), |_, _| {})
    }

    /// A guaranteed job paused after admission was once reported as holding its
    /// guarantee (only running below it counted).
    #[test]
    fn a_paused_guaranteed_job_violates_its_guarantee() {
        let cluster = Cluster::example();
        let sj = job("g", PlanCode::ZeroDp, 4, 32, true);
        let a = alloc(&sj, &cluster, 32);
        let kept = run(std::slice::from_ref(&sj), vec![Some(a.clone())]);
        assert!(kept.jobs[0].guarantee_held() && kept.jobs[0].finish_s.is_some());
        let paused = run(&[sj], vec![Some(a), None]);
        assert!(!paused.jobs[0].guarantee_held());
        assert!(paused.jobs[0].violation_s >= 60.0, "{}", paused.jobs[0].violation_s);
        assert!(paused.jobs[0].finish_s.is_none(), "paused for good: it never finishes");
    }

    /// A change of cores alone was silently dropped: the job kept its old cores and
    /// paid no restart.
    #[test]
    fn a_change_of_cores_alone_restarts_the_job() {
        let cluster = Cluster::example();
        let sj = job("c", PlanCode::ZeroOffload, 4, 16, false);
        let same = run(std::slice::from_ref(&sj), vec![Some(alloc(&sj, &cluster, 16))]);
        assert_eq!(same.jobs[0].restarts, 0);
        let more = run(std::slice::from_ref(&sj), vec![Some(alloc(&sj, &cluster, 16)), Some(alloc(&sj, &cluster, 48))]);
        assert_eq!(more.jobs[0].restarts, 1);
    }

    /// Synergy's rule was bypassed: the request's core count was always tried first.
    #[test]
    fn synergy_gives_the_sensitivity_optimal_cores_not_the_request() {
        let cluster = Cluster::example();
        let config = SimConfig::defaults(rubick_policy::lookup("synergy").unwrap(), Queue::Fifo);
        let options = PolicyOptions {
            queue: config.queue,
            planner: planner_config(&config, &no_rows()),
            milp_time_limit: config.milp_time_limit,
        };
        let mut policy = config.policy.build(&cluster, &options);
        // ZeRO-Offload on 4 GPUs asking 8 cores per GPU; profiled at 4 per GPU, its CPU
        // optimizer gains up to 2x: 12 per GPU (the fair share) gets all of it.
        let sj = job("s", PlanCode::ZeroOffload, 4, 32, false);
        let jobs = [JobInput::example(sj.job.clone(), Belief::from(sj.params.clone()), None, false)];
        let view = View { cluster: &cluster, jobs: &jobs, now_s: 0.0, configs: None };
        let out = policy.decide(&view, 0);
        assert_eq!(out[0].as_ref().map(|a| a.cpus), Some(48));
    }

    /// Queue order weighed only the waiting jobs: a younger waiting job outweighed an
    /// older running one, so rounds paused the running job for it (and resumed it,
    /// restarted, later): the pause/resume thrash.
    #[test]
    fn a_younger_waiting_job_does_not_preempt_an_older_running_one() {
        let cluster = Cluster::example();
        let old = job("old", PlanCode::ZeroDp, 64, 512, false);
        let mut young = job("young", PlanCode::ZeroDp, 64, 512, false);
        young.job.submit_time_s = 120.0;
        let config = SimConfig::defaults(rubick_policy::lookup("rubick-no-resize").unwrap(), Queue::Fifo);
        let r = simulate(&cluster, &[old, young][..], &no_rows(), &config, |_, _| {});
        let (o, y) = (&r.jobs[0], &r.jobs[1]);
        assert_eq!(o.restarts, 0, "the running job was paused");
        assert!(o.finish_s.unwrap() <= y.first_start_s.unwrap(), "{o:?} {y:?}");
    }

    #[test]
    fn noise_is_reproducible_and_centred() {
        let draws: Vec<f64> = (0..2000).map(|k| normal(7, k, 1)).collect();
        assert_eq!(draws[5], normal(7, 5, 1));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "{mean} {var}");
    }
}
