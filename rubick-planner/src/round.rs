//! One round end to end, the one place a round is assembled: jobs (with their
//! performance models and current allocations) in, curves, a decision (the heuristic
//! or the injected exact solver), placement, and a `Schedule` with a per-job explanation out.
//! A policy that allocates without planning (the queue family) has its allocations
//! written here too ([`assemble_allocations`]), by the same rules of change.

use std::time::{Duration, Instant};

use rubick_core::Cluster;
use rubick_core::schedule::{
    Assignment, Change, GuaranteeStatus, NodeShare, Schedule, SolverStats, SolverStatus, Uses, round6,
};

use super::curves::{CurveBook, Evaluator};
use super::exact::{ExactError, ExactSolver};
use super::place::{NodeState, Repack, place, stranded};
use rubick_model::belief::Support;
use rubick_model::throughput;

use super::{Current, Infeasible, JobInput, PlannerConfig, heuristic};

/// The schedule of a decision, and one explanation line per job.
#[derive(Debug)]
pub struct Outcome {
    pub schedule: Schedule,
    pub explain: Vec<String>,
    /// The nodes' free resources after placement.
    pub nodes: Vec<NodeState>,
}

fn describe(plan: &rubick_core::plan::Plan, placement: &rubick_core::placement::Placement, cpus: u32) -> String {
    format!("{plan} on {placement} ({} GPUs, {cpus} cores)", placement.gpus())
}

/// Places `choice` and writes the schedule.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    evaluator: &mut Evaluator<'_>,
    book: &CurveBook,
    inputs: &[JobInput],
    choice: &[Option<usize>],
    objective: f64,
    round: u64,
    policy: &str,
    solver: SolverStats,
    repack: super::place::Repack,
) -> Outcome {
    let (placed, nodes) = place(evaluator, book, inputs, choice, repack);
    let cluster = evaluator.cluster;
    let mut schedule = Schedule::builder(cluster, round, policy, solver);
    let mut explain = Vec::with_capacity(inputs.len());
    for (j, input) in inputs.iter().enumerate() {
        let jc = &book.jobs[j];
        let cur = input.current.as_ref();
        let p = placed[j].as_ref();
        let next = p.map(|p| Current {
            group: p.group,
            plan: p.plan,
            placement: p.placement.clone(),
            nodes: p.shares.iter().map(|s| (nodes[s.node].index, s.gpus.clone())).collect(),
            cpus: p.cpus,
            host_memory_gib: p.host_memory_gib,
            rounds_since_change: 0,
        });
        let change = Current::change(cur, next.as_ref());
        let throughput = p.map_or(0.0, |p| p.throughput);
        let guarantee = jc.guaranteed.then(|| GuaranteeStatus {
            required_throughput: round6(jc.request_throughput),
            holds: throughput >= jc.request_throughput * (1.0 - 1e-9),
        });
        let normalized = throughput / jc.request_throughput;
        // Reasons are words for people: a simulation, which reads only the allocations,
        // asks for none.
        let reason = if evaluator.config.explain {
            // With the model's evidence: how the prediction rests on measurements, and its
            // ~95 % interval; a gain is claimed only as far as the interval's low end goes.
            let evidence = p.and_then(|p| evaluator.uncertainty(input, p.group, &p.plan, &p.placement));
            let (low, high) =
                evidence.map_or((normalized, normalized), |(_, h)| (normalized * (-h).exp(), normalized * h.exp()));
            let gain = |x: f64| match evidence {
                Some((_, h)) if h > 0.0 => format!("{x:.2}x (95 %: {low:.2}-{high:.2}x)"),
                _ => format!("{x:.2}x"),
            };
            let mut reason = match change {
                Change::Pending if jc.candidates.is_empty() => "no feasible plan on this cluster".to_string(),
                Change::Pending => "waits: the resources are worth more to other jobs this round".to_string(),
                Change::Started if evidence.is_some() && low < 1.0 && normalized > 1.0 => {
                    format!("starts at {}: no faster than its request as far as the data show", gain(normalized))
                }
                Change::Started => format!("starts at {} its request's throughput", gain(normalized)),
                Change::Kept if input.restoring => "kept: in the middle of a checkpoint-restore".to_string(),
                Change::Kept if jc.locked => "kept: in its cooldown after a change".to_string(),
                Change::Kept if input.restarts_spent(&evaluator.config) => {
                    if input.restart_cap(&evaluator.config) == evaluator.config.restart_cap {
                        format!(
                            "kept for churn: restarted {} times, the most a job is shrunk or paused",
                            input.restarts
                        )
                    } else {
                        format!(
                            "kept for churn: restarted {} times, the most for its service (one restart per doubling of it past the service quantum)",
                            input.restarts
                        )
                    }
                }
                Change::Kept => match jc.refused {
                    Some(r) => format!(
                        "kept for churn: a change to {:.2}x its request's throughput (now {:.2}x) would repay its restart, but after {} restart(s) its restart factor is {:.2} (a change must gain {:.2}x)",
                        r.normalized,
                        jc.current.map_or(0.0, |c| jc.candidates[c].normalized),
                        input.restarts,
                        r.factor,
                        1.0 / r.factor.max(1e-9)
                    ),
                    None => match jc.scaled_out {
                        Some(s) => format!(
                            "kept: {} GPUs would give {:.2}x its request's throughput, under the scale-out efficiency ({:.2}x needed: each GPU beyond the request must add {} of the request's per GPU)",
                            s.gpus, s.normalized, s.needed, evaluator.config.scale_out_efficiency
                        ),
                        None => "kept: no change pays for its restart".to_string(),
                    },
                },
                Change::Preempted => "paused: its resources are worth more to other jobs".to_string(),
                Change::Resized | Change::Replanned | Change::Moved | Change::Recored => {
                    let old = cur.and_then(|_| jc.current.map(|c| jc.candidates[c].normalized)).unwrap_or(0.0);
                    format!("{old:.2}x -> {} its request's throughput, worth a restart", gain(normalized))
                }
            };
            if let Some((support, _)) = evidence {
                reason = format!("{reason}; {}", support.as_str());
                // Which row says so: the family's slowest against the model.
                let slower =
                    p.zip(input.belief.evidence.as_ref()).and_then(|(p, e)| e.family_slower(&p.plan, &p.placement));
                if let (Support::FamilySlower, Some(m)) = (support, slower) {
                    reason = format!(
                        "{reason} ({} on {} ran {:.4} s per iteration, {:.1}x the model's {:.4} s; the interval widened by as much)",
                        m.plan,
                        m.placement,
                        m.measured_s,
                        m.ratio(),
                        m.predicted_s
                    );
                }
            }
            if let Some(note) = p.and_then(|p| p.note.as_ref()) {
                reason = format!("{reason}; {note}");
            }
            // Taken off a plan it ran slower under (the safety net after every move).
            let slow = input.job.current.as_ref().and_then(|c| input.job.slow_plans.iter().find(|s| s.plan == c.plan));
            if let (None, Some(slow)) = (cur, slow) {
                reason = format!("moves back: {}; {reason}", slow.describe());
            }
            reason
        } else {
            String::new()
        };
        if evaluator.config.explain {
            let old = cur.map_or("-".to_string(), |c| describe(&c.plan, &c.placement, c.cpus));
            let new = p.map_or("-".to_string(), |p| describe(&p.plan, &p.placement, p.cpus));
            let guarantee_text = match &guarantee {
                Some(g) => {
                    format!(", guarantee {:.3} {}", g.required_throughput, if g.holds { "held" } else { "NOT held" })
                }
                None => String::new(),
            };
            explain.push(format!(
                "{}: {change:?}: {old} -> {new}; {throughput:.3} samples/s{guarantee_text}; {reason}",
                input.job.name
            ));
        }
        let uses = p.map(|p| Uses {
            gpus: p.placement.gpus(),
            cpus: p.cpus,
            host_memory_gib: p.host_memory_gib,
            normalized_throughput: p.throughput / jc.request_throughput,
        });
        // Its share of each node as placed (cores as the placement split them).
        let shares = p.map_or_else(Vec::new, |p| {
            p.shares
                .iter()
                .map(|s| NodeShare {
                    node: nodes[s.node].name(cluster),
                    gpus: s.gpus.clone(),
                    cpus: s.cpus,
                    host_memory_gib: round6(s.mem),
                })
                .collect()
        });
        let assignment = assignment(input, (change, next.as_ref(), shares), throughput, guarantee, reason);
        schedule.push(assignment, uses);
    }
    let schedule = schedule.build(objective);
    Outcome { schedule, explain, nodes }
}

/// A job's assignment: where it runs next (`next`, on its node `shares`) and its
/// `change` from where it runs now, with its rounds since the last change.
fn assignment(
    input: &JobInput,
    (change, next, shares): (Change, Option<&Current>, Vec<NodeShare>),
    throughput: f64,
    guarantee: Option<GuaranteeStatus>,
    reason: String,
) -> Assignment {
    let rounds_since_change = match (change, &input.current) {
        (Change::Kept, Some(c)) => c.rounds_since_change.saturating_add(1),
        _ => 0,
    };
    Assignment {
        job: input.job.name.clone(),
        plan: next.map(|c| c.plan),
        nodes: shares,
        predicted_throughput: round6(throughput),
        guarantee,
        change,
        rounds_since_change,
        reason,
    }
}

/// The allocations a policy decided without planning (the queue family: every running
/// job on its request) as a round's schedule, with one explanation line per job.
/// Throughputs are the belief's; each running job counts 1 in the objective.
pub fn assemble_allocations(
    evaluator: &Evaluator<'_>,
    inputs: &[JobInput],
    allocations: &[Option<Current>],
    policy: &str,
    round: u64,
) -> (Schedule, Vec<String>) {
    let cluster = evaluator.cluster;
    let solver = SolverStats { method: "queue".into(), gap: None, wall_s: None, status: SolverStatus::Allocated };
    let mut schedule = Schedule::builder(cluster, round, policy, solver);
    let mut explain = Vec::with_capacity(inputs.len());
    for (input, alloc) in inputs.iter().zip(allocations) {
        let change = Current::change(input.current.as_ref(), alloc.as_ref());
        let throughput = alloc.as_ref().map_or(0.0, |c| {
            let g = &cluster.node_groups[c.group];
            let cpu_ref = evaluator.config.cpu_reference(g);
            throughput::samples_per_s(&input.job.model, &input.belief.params, g, &c.plan, &c.placement, c.cpus, cpu_ref)
        });
        let reason = match change {
            Change::Pending => "waits: its request does not fit now".to_owned(),
            Change::Started => "starts as requested".to_owned(),
            Change::Preempted => "preempted for a guaranteed job".to_owned(),
            _ => "kept: this policy never reconfigures".to_owned(),
        };
        // Every running job runs its request: it counts 1 in the objective.
        let uses = alloc.as_ref().map(|c| Uses {
            gpus: c.placement.gpus(),
            cpus: c.cpus,
            host_memory_gib: c.host_memory_gib,
            normalized_throughput: 1.0,
        });
        explain.push(format!(
            "{}: {change:?}: {}; {throughput:.3} samples/s; {reason}",
            input.job.name,
            alloc
                .as_ref()
                .map_or_else(|| "-".to_owned(), |c| format!("{} on {} with {} cores", c.plan, c.placement, c.cpus))
        ));
        let shares = alloc.as_ref().map_or_else(Vec::new, |c| c.shares(cluster));
        schedule.push(assignment(input, (change, alloc.as_ref(), shares), throughput, None, reason), uses);
    }
    let running = allocations.iter().flatten().count() as f64;
    (schedule.build(running), explain)
}

/// How a round decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    /// Rubick's greedy heuristic (the MILP only when the greedy misses a guarantee).
    Heuristic,
    /// The exact solver (the MILP) over the Pareto candidates, warm-started from the
    /// heuristic.
    Milp,
}

impl Solver {
    /// The policy this solver is on its own (the schedule's `policy`).
    pub fn as_str(self) -> &'static str {
        match self {
            Solver::Heuristic => "rubick",
            Solver::Milp => "rubick-milp",
        }
    }
}

/// A round's result with what was computed on the way.
#[derive(Debug)]
pub struct RoundResult {
    pub outcome: Outcome,
    pub book: CurveBook,
    /// Objective of the heuristic's decision, when it found one.
    pub heuristic_objective: Option<f64>,
    pub wall: Duration,
}

/// A decision: the choice, its objective, and how it was reached.
struct Decided {
    choice: Vec<Option<usize>>,
    objective: f64,
    method: &'static str,
    gap: Option<f64>,
    status: SolverStatus,
}

fn decide(
    book: &CurveBook,
    cluster: &Cluster,
    config: &PlannerConfig,
    inputs: &[JobInput],
    policy: Solver,
    exact: &dyn ExactSolver,
    milp_fallback: bool,
) -> (Result<Decided, Infeasible>, Option<f64>) {
    let greedy = heuristic::solve(book, cluster, inputs, config);
    let heuristic_objective = greedy.as_ref().ok().map(|d| d.objective);
    let decided = match (policy, greedy) {
        (Solver::Heuristic, Ok(d)) => Ok(Decided {
            choice: d.choice,
            objective: d.objective,
            method: "heuristic",
            gap: None,
            status: SolverStatus::Heuristic,
        }),
        (Solver::Milp, greedy) => {
            let warm = greedy.as_ref().ok().map(|d| d.choice.clone());
            match exact.solve(book, cluster, warm.as_deref()) {
                Ok(s) if greedy.as_ref().is_ok_and(|d| d.objective > s.objective + 1e-9) => greedy.map(|d| Decided {
                    choice: d.choice,
                    objective: d.objective,
                    method: "heuristic",
                    gap: Some(s.gap),
                    status: SolverStatus::HeuristicBeatExact(s.status),
                }),
                Ok(s) => Ok(Decided {
                    choice: s.choice,
                    objective: s.objective,
                    method: "milp",
                    gap: Some(s.gap),
                    status: SolverStatus::Exact(s.status),
                }),
                Err(ExactError::Infeasible) => Err(greedy.err().unwrap_or_else(|| infeasible(book))),
                Err(e) => greedy.map(|d| {
                    tracing::warn!("{e}; using the heuristic's schedule");
                    Decided {
                        choice: d.choice,
                        objective: d.objective,
                        method: "heuristic",
                        gap: None,
                        status: SolverStatus::Fallback,
                    }
                }),
            }
        }
        // The greedy missed a guarantee: let the exact search decide feasibility.
        (Solver::Heuristic, Err(why)) if !milp_fallback => Err(why),
        (Solver::Heuristic, Err(why)) => match exact.solve(book, cluster, None) {
            Ok(s) => Ok(Decided {
                choice: s.choice,
                objective: s.objective,
                method: "milp",
                gap: Some(s.gap),
                status: SolverStatus::HeuristicMissedGuarantee,
            }),
            Err(_) => Err(why),
        },
    };
    (decided, heuristic_objective)
}

/// Plans one round. The decision sees each node group's totals; when placement then
/// cannot give a guaranteed job its resources (cores or memory stranded beside GPUs
/// on different nodes), the stranded resources are taken out and the round decided
/// again, a few times at most.
pub fn plan_round(
    cluster: &Cluster,
    config: &PlannerConfig,
    inputs: &[JobInput],
    policy: Solver,
    exact: &dyn ExactSolver,
    round: u64,
) -> Result<RoundResult, Infeasible> {
    let mut evaluator = Evaluator::new(cluster, config);
    plan_round_with(&mut evaluator, inputs, policy, exact, round)
}

/// [`plan_round`] with an evaluator kept across rounds (its caches of plan spaces and
/// curves stay warm; set `evaluator.config.now_s` for each round).
///
/// A guarantee that cannot be kept never fails the round: the job it belongs to is
/// planned best-effort (run degraded where there is room, else paused), its
/// assignment's guarantee `holds: false` and its reason saying why, and every other job
/// is planned as usual. Only a round with no job to demote fails.
pub fn plan_round_with(
    evaluator: &mut Evaluator<'_>,
    inputs: &[JobInput],
    policy: Solver,
    exact: &dyn ExactSolver,
    round: u64,
) -> Result<RoundResult, Infeasible> {
    let mut demoted: Vec<(String, String)> = Vec::new();
    let mut owned: Option<Vec<JobInput>> = None;
    loop {
        let now = owned.as_deref().unwrap_or(inputs);
        let e = match plan_round_once(evaluator, now, policy, exact, round) {
            Ok(mut r) => {
                mark_demoted(&mut r, inputs, &demoted);
                return Ok(r);
            }
            Err(e) => e,
        };
        // The job the round could not keep its guarantee (the last named when several).
        let Some(victim) = e.jobs.iter().rev().find(|n| now.iter().any(|i| i.job.guaranteed && i.job.name == **n))
        else {
            return Err(e);
        };
        tracing::warn!("{}; `{victim}` is planned best-effort this round", e.reason);
        demoted.push((victim.clone(), e.reason.clone()));
        owned = Some(
            now.iter()
                .map(|i| {
                    let mut i = i.clone();
                    if i.job.name == *victim {
                        std::sync::Arc::make_mut(&mut i.job).guaranteed = false;
                    }
                    i
                })
                .collect(),
        );
    }
}

/// The demoted jobs' guarantees, not held, in the schedule and its explanation.
fn mark_demoted(r: &mut RoundResult, inputs: &[JobInput], demoted: &[(String, String)]) {
    for (name, why) in demoted {
        let Some(j) = inputs.iter().position(|i| i.job.name == *name) else { continue };
        let required = r.book.jobs[j].request_throughput;
        let a = &mut r.outcome.schedule.assignments[j];
        a.guarantee = Some(GuaranteeStatus { required_throughput: round6(required), holds: false });
        let note = format!("guarantee NOT held: {why}; planned best-effort");
        a.reason = if a.reason.is_empty() { note.clone() } else { format!("{note}; {}", a.reason) };
        let prefix = format!("{name}: ");
        if let Some(line) = r.outcome.explain.iter_mut().find(|l| l.starts_with(&prefix)) {
            line.push_str(&format!(" [{note}]"));
        }
    }
}

/// [`plan_round`] that fails when a guarantee cannot be kept (naming the job), rather
/// than planning its job best-effort: the decision's feasibility as the exact search
/// and brute force see it.
pub fn plan_round_strict(
    cluster: &Cluster,
    config: &PlannerConfig,
    inputs: &[JobInput],
    policy: Solver,
    exact: &dyn ExactSolver,
    round: u64,
) -> Result<RoundResult, Infeasible> {
    plan_round_once(&mut Evaluator::new(cluster, config), inputs, policy, exact, round)
}

fn plan_round_once(
    evaluator: &mut Evaluator<'_>,
    inputs: &[JobInput],
    policy: Solver,
    exact: &dyn ExactSolver,
    round: u64,
) -> Result<RoundResult, Infeasible> {
    let start = Instant::now();
    let cluster = evaluator.cluster;
    let config = &evaluator.config.clone();
    let jobs = inputs.iter().map(|i| evaluator.job_curves(i, None)).collect();
    let mut book = CurveBook::new(jobs, cluster);
    tracing::debug!("round {round}: curves of {} jobs in {:.1} ms", inputs.len(), ms(start));
    let mut attempt = 0;
    let mut previous: Option<RoundResult> = None;
    loop {
        attempt += 1;
        // With jobs locked in their cooldown, a failed greedy first softens the locks
        // (cheap) before the exact search decides feasibility.
        // (Running jobs that keep their request, or spent their restarts, are held
        // like locked ones.)
        let hard_locks = book.jobs.iter().any(|j| j.must_run && !j.guaranteed);
        let deciding = Instant::now();
        let (mut decided, mut heuristic_objective) = decide(&book, cluster, config, inputs, policy, exact, !hard_locks);
        if decided.is_err() && hard_locks {
            // Guarantees need resources of jobs in their cooldown: let those be paused.
            tracing::debug!("guarantees cannot be met with every job in its cooldown kept; softening the locks");
            book.soften_locks();
            (decided, heuristic_objective) = decide(&book, cluster, config, inputs, policy, exact, true);
        }
        let d = match (decided, previous) {
            (Ok(d), _) => d,
            // Without the stranded resources there is no decision: keep the last one.
            (Err(_), Some(prev)) => return Ok(prev),
            (Err(e), None) => return Err(e),
        };
        tracing::debug!("round {round}, attempt {attempt}: decided in {:.1} ms", ms(deciding));
        let placing = Instant::now();
        let solver = SolverStats { method: d.method.into(), gap: d.gap, wall_s: None, status: d.status };
        // Guarantees that must hold: of running jobs, and of every guaranteed job
        // unless guaranteed jobs may wait in the queue.
        let holds = |o: &Outcome| {
            o.schedule
                .assignments
                .iter()
                .zip(&book.jobs)
                .all(|(a, jc)| a.guarantee.as_ref().is_none_or(|g| g.holds || (a.plan.is_none() && !jc.must_run)))
        };
        let place = |evaluator: &mut Evaluator<'_>, repack| {
            assemble(evaluator, &book, inputs, &d.choice, d.objective, round, policy.as_str(), solver.clone(), repack)
        };
        let mut outcome = place(evaluator, Repack::None);
        // Keeping running jobs in place left no room for a guarantee: let them move,
        // those in their cooldown only as the last resort.
        for repack in [Repack::Unlocked, Repack::All] {
            if holds(&outcome) {
                break;
            }
            let repacked = place(evaluator, repack);
            if holds(&repacked) {
                outcome = repacked;
            }
        }
        let held = holds(&outcome);
        tracing::debug!("round {round}, attempt {attempt}: placed in {:.1} ms (guarantees held: {held})", ms(placing));
        let stranded = stranded(&outcome.nodes, cluster, config);
        let progress = stranded.iter().any(|s| s.gpus > 0.0 || s.cpus > 0.0 || s.mem > 1e-6);
        if held || attempt >= 4 || !progress {
            return Ok(RoundResult { outcome, book, heuristic_objective, wall: start.elapsed() });
        }
        previous = Some(RoundResult { outcome, book: book.clone(), heuristic_objective, wall: start.elapsed() });
        tracing::debug!(
            "attempt {attempt}: a guaranteed job could not be placed; deciding again without stranded resources"
        );
        for (cap, s) in book.capacity.iter_mut().zip(&stranded) {
            cap.gpus -= s.gpus;
            cap.cpus -= s.cpus;
            cap.mem -= s.mem;
        }
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn infeasible(book: &CurveBook) -> Infeasible {
    let jobs: Vec<String> = book.jobs.iter().filter(|j| j.guaranteed).map(|j| j.name.clone()).collect();
    Infeasible {
        reason: format!("the guaranteed jobs ({}) cannot all get their guarantee on this cluster", jobs.join(", ")),
        jobs,
    }
}
