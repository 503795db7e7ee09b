//! One round end to end: jobs (with their performance models and current
//! allocations) in, a `Schedule` out, by the heuristic or the MILP.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use rubick_core::perf::PerfModel;
use rubick_core::perfmodel::{Links, Params};
use rubick_core::planner::curves::{Evaluator, default_params};
use rubick_core::planner::place::{Repack, stranded};
use rubick_core::planner::round::{Outcome, assemble};
use rubick_core::planner::{
    CurveBook, Infeasible, JobInput, PlannerConfig, current_of_assignment, current_of_job, heuristic,
};
use rubick_core::schedule::{Schedule, SolverStats};
use rubick_core::{Cluster, Job, MemoryEstimator};
use rubick_io::files::load_artifact;
use rubick_io::reference::ReferenceData;

use crate::milp;

/// How a round decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    /// Rubick's greedy heuristic (the MILP only when the greedy misses a guarantee).
    Heuristic,
    /// The exact MILP over the Pareto candidates, warm-started from the heuristic.
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
    status: String,
}

fn decide(
    book: &CurveBook,
    cluster: &Cluster,
    config: &PlannerConfig,
    inputs: &[JobInput],
    policy: Solver,
    time_limit: Duration,
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
            status: "heuristic".into(),
        }),
        (Solver::Milp, greedy) => {
            let warm = greedy.as_ref().ok().map(|d| d.choice.clone());
            match milp::solve(book, cluster, warm.as_deref(), time_limit) {
                Ok(s) if greedy.as_ref().is_ok_and(|d| d.objective > s.objective + 1e-9) => greedy.map(|d| Decided {
                    choice: d.choice,
                    objective: d.objective,
                    method: "heuristic",
                    gap: Some(s.gap),
                    status: format!("fallback: MILP {}", s.status),
                }),
                Ok(s) => Ok(Decided {
                    choice: s.choice,
                    objective: s.objective,
                    method: "milp",
                    gap: Some(s.gap),
                    status: s.status.into(),
                }),
                Err(milp::MilpError::Infeasible) => Err(greedy.err().unwrap_or_else(|| infeasible(book))),
                Err(e) => greedy.map(|d| {
                    tracing::warn!("{e}; using the heuristic's schedule");
                    Decided {
                        choice: d.choice,
                        objective: d.objective,
                        method: "heuristic",
                        gap: None,
                        status: "fallback".into(),
                    }
                }),
            }
        }
        // The greedy missed a guarantee: let the exact search decide feasibility.
        (Solver::Heuristic, Err(why)) if !milp_fallback => Err(why),
        (Solver::Heuristic, Err(why)) => match milp::solve(book, cluster, None, time_limit) {
            Ok(s) => Ok(Decided {
                choice: s.choice,
                objective: s.objective,
                method: "milp",
                gap: Some(s.gap),
                status: "heuristic-missed-guarantee".into(),
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
    time_limit: Duration,
    round: u64,
) -> Result<RoundResult, Infeasible> {
    let mut evaluator = Evaluator::new(cluster, config);
    plan_round_with(&mut evaluator, inputs, policy, time_limit, round)
}

/// [`plan_round`] with an evaluator kept across rounds (its caches of plan spaces and
/// curves stay warm; set `evaluator.config.now_s` for each round).
pub fn plan_round_with(
    evaluator: &mut Evaluator<'_>,
    inputs: &[JobInput],
    policy: Solver,
    time_limit: Duration,
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
        let hard_locks = book.jobs.iter().any(|j| j.locked && j.must_run);
        let deciding = Instant::now();
        let (mut decided, mut heuristic_objective) =
            decide(&book, cluster, config, inputs, policy, time_limit, !hard_locks);
        if decided.is_err() && hard_locks {
            // Guarantees need resources of jobs in their cooldown: let those be paused.
            tracing::debug!("guarantees cannot be met with every job in its cooldown kept; softening the locks");
            book.soften_locks();
            (decided, heuristic_objective) = decide(&book, cluster, config, inputs, policy, time_limit, true);
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

/// Where jobs' performance models come from.
#[derive(Debug, Default)]
pub struct ModelSource<'a> {
    /// The jobs file: relative `perfModel` paths start from its directory.
    pub jobs_path: Option<&'a Path>,
    /// The authors' reference data: jobs of its models without a `perfModel` get one
    /// fitted from 8 profiled rows.
    pub reference: Option<&'a ReferenceData>,
}

/// What the planner believes of one job: its model's parameters and, when its
/// `PerfModel` lists measured rows, what they rest on.
pub type Belief = (Params, Option<std::sync::Arc<rubick_core::planner::Evidence>>);

/// Each job's belief, reading every `perfModel` once: from its file, else a fit on the
/// reference data when that has the model, else the FLOPs-based default. A job whose
/// `perfModel` cannot be used (missing, unreadable, another form) is `Err` with why
/// (`perfModel: ...`); a reference fit that fails is the error of the whole.
pub fn job_beliefs(
    jobs: &[Job],
    cluster: &Cluster,
    source: &ModelSource<'_>,
) -> anyhow::Result<Vec<Result<Belief, String>>> {
    let mut fitted: HashMap<String, Params> = HashMap::new();
    let links = cluster.node_groups.iter().max_by_key(|g| g.total_gpus()).map(Links::from);
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        if let Some(path) = perf_model_path(job, source) {
            out.push(match load_artifact::<PerfModel>(&path) {
                Err(e) => Err(format!("perfModel: {e}")),
                Ok(model) => match model.params() {
                    Err(e) => Err(format!("perfModel: {}: {e}", path.display())),
                    Ok(params) => {
                        Ok((params, rubick_core::planner::Evidence::of_model(&model).map(std::sync::Arc::new)))
                    }
                },
            });
            continue;
        }
        let name = &job.model.name;
        let from_reference = match (source.reference, links) {
            (Some(data), Some(links)) if data.facts(name).is_some() => {
                if let Some(p) = fitted.get(name) {
                    Some(p.clone())
                } else {
                    let params = fit_reference(data, name, links)
                        .with_context(|| format!("fitting `{name}` on the reference data"))?;
                    fitted.insert(name.clone(), params.clone());
                    Some(params)
                }
            }
            _ => None,
        };
        out.push(Ok((from_reference.unwrap_or_else(|| default_params(&job.model)), None)));
    }
    Ok(out)
}

/// Performance-model parameters of every job ([`job_beliefs`]); a job whose
/// `perfModel` cannot be used is an error naming it.
pub fn job_params(jobs: &[Job], cluster: &Cluster, source: &ModelSource<'_>) -> anyhow::Result<Vec<Params>> {
    let file = source.jobs_path.map_or_else(|| "jobs".into(), rubick_io::files::display);
    job_beliefs(jobs, cluster, source)?
        .into_iter()
        .enumerate()
        .map(|(i, belief)| belief.map(|(params, _)| params).map_err(|why| anyhow::anyhow!("{file}: jobs[{i}].{why}")))
        .collect()
}

/// Where a job's `perfModel` is: relative to the jobs file.
pub fn perf_model_path(job: &Job, source: &ModelSource<'_>) -> Option<std::path::PathBuf> {
    let base = source.jobs_path.filter(|p| !rubick_io::files::is_std(p)).and_then(Path::parent);
    let path = job.perf_model.as_deref()?;
    Some(base.map_or_else(|| Path::new(path).to_path_buf(), |b| b.join(path)))
}

fn fit_reference(data: &ReferenceData, model: &str, links: Links) -> anyhow::Result<Params> {
    let spec = data.model_spec(model)?.context("listed model")?;
    let measured = data.measured_rows(model)?;
    let resolved = rubick_core::reference::resolve_rows(&measured, &spec, &MemoryEstimator::default());
    let (_, obs) = rubick_core::reference::profiled_rows(&resolved, 8, links);
    Ok(rubick_core::fit::fit(&spec, &obs, &rubick_core::fit::FitOptions::default())?.params)
}

/// The planner's inputs: jobs with parameters and current allocations, taken from the
/// previous round's schedule where it names the job, else from the job's `current`.
pub fn job_inputs(
    (jobs_path, jobs): (&Path, Vec<Job>),
    params: Vec<Params>,
    cluster: &Cluster,
    config: &PlannerConfig,
    previous: Option<(&Path, &Schedule)>,
) -> anyhow::Result<Vec<JobInput>> {
    let mut inputs = Vec::with_capacity(jobs.len());
    // Each job's assignment in the previous schedule (the first, if named twice).
    let mut assigned: HashMap<&str, usize> = HashMap::new();
    for (k, a) in previous.map_or(&[][..], |(_, s)| &s.assignments).iter().enumerate() {
        assigned.entry(a.job.as_str()).or_insert(k);
    }
    for (i, (job, params)) in jobs.into_iter().zip(params).enumerate() {
        let from_schedule = match (previous, assigned.get(job.name.as_str())) {
            (Some((path, schedule)), Some(&k)) => Some(
                current_of_assignment(&schedule.assignments[k], cluster)
                    .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.within(&format!("assignments[{k}]"))))?,
            ),
            _ => None,
        };
        let current = match from_schedule {
            Some(c) => c,
            None => current_of_job(&job, cluster, config)
                .map_err(|e| anyhow::anyhow!("{}: {}", jobs_path.display(), e.within(&format!("jobs[{i}]"))))?,
        };
        inputs.push(JobInput {
            job,
            params,
            evidence: None,
            current,
            allowed: rubick_core::planner::Restriction::Any,
            priority: 1.0,
        });
    }
    Ok(inputs)
}
