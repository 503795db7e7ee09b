//! The planner family: policies that decide through this project's planner (curves,
//! the heuristic or the MILP, placement), each round from where jobs run now. Queue
//! order becomes a weight in the objective.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rubick_core::schedule::Schedule;
use rubick_core::{Cluster, PlanRequest};
use rubick_planner::curves::Evaluator;
use rubick_planner::{Current, JobInput, Restriction, current_of_assignment};

use super::queue::queue_order;
use super::{PolicyOptions, Queue, View, home_group, request_plan, traced_plan};
use rubick_milp::Milp;
use rubick_planner::round::{Solver, plan_round_with};

/// The last round of a planner-family policy, for `schedule`.
#[derive(Debug, Clone)]
pub enum RoundReport {
    /// The schedule and one explanation line per job.
    Planned(Box<Schedule>, Vec<String>),
    /// Guaranteed jobs that cannot all get their guarantee: why.
    Infeasible(String),
}

/// A policy deciding through the planner.
pub(super) struct PlannerFamily<'a> {
    pub name: &'static str,
    pub queue: Queue,
    /// Plans keep the user's plan's layout (TP, PP, ZeRO, offload).
    pub keep_layout: bool,
    pub solver: Solver,
    /// The exact round (the MILP with the options' time limit).
    pub exact: Milp,
    /// Kept across decisions: curves are cached per model.
    pub evaluator: Evaluator<'a>,
    pub last: Option<RoundReport>,
    /// The `service` queue's record of finished jobs.
    pub history: ServiceHistory,
}

/// What the `service` queue's quantum is defined from: the service (GPU-seconds) each
/// finished job received, over the last day.
#[derive(Debug, Default)]
pub struct ServiceHistory {
    /// Jobs seen running or waiting at the last decision, with their service then.
    seen: BTreeMap<String, f64>,
    /// (when it finished, its service) over the window, oldest first; the newest is
    /// kept however old.
    finished: VecDeque<(f64, f64)>,
    /// The window's services, sorted.
    services: Vec<f64>,
    /// The quantum of the window as it stands, when the queue is not and is
    /// oversubscribed (recomputed when the window changes).
    quantum: [Option<f64>; 2],
}

impl ServiceHistory {
    /// The window the quantum looks back over: a day, the cycle of a cluster's load.
    pub const WINDOW_S: f64 = 86_400.0;

    /// Notes which jobs left since the last decision (finished, with the service they
    /// had then) and returns the quantum `rule` gives over the jobs finished in the
    /// last [`Self::WINDOW_S`] (the last one finished when none did); `None` before
    /// any finished (unless fixed).
    pub fn update(
        &mut self,
        jobs: &[JobInput],
        now_s: f64,
        rule: rubick_planner::ServiceQuantum,
        oversubscribed: bool,
    ) -> Option<f64> {
        let now: BTreeMap<&str, f64> = jobs.iter().map(|j| (j.job.name.as_str(), j.progress.attained_gpu_s)).collect();
        let mut changed = false;
        // In place: only a job new to the view allocates its name.
        self.seen.retain(|name, service| match now.get(name.as_str()) {
            Some(&s) => {
                *service = s;
                true
            }
            None => {
                self.finished.push_back((now_s, *service));
                changed = true;
                false
            }
        });
        if self.seen.len() < now.len() {
            for (&name, &s) in &now {
                if !self.seen.contains_key(name) {
                    self.seen.insert(name.to_owned(), s);
                }
            }
        }
        while self.finished.len() > 1 && self.finished.front().is_some_and(|&(t, _)| t < now_s - Self::WINDOW_S) {
            self.finished.pop_front();
            changed = true;
        }
        if changed || self.quantum == [None, None] {
            self.services = self.finished.iter().map(|&(_, s)| s).collect();
            self.services.sort_by(f64::total_cmp);
            self.quantum = [false, true].map(|o| rule.of(&self.services, o));
        }
        self.quantum[usize::from(oversubscribed)]
    }
}

impl<'a> PlannerFamily<'a> {
    /// `name` on `cluster`; `adjust` sets the planner knobs of an ablation.
    pub fn new(
        name: &'static str,
        cluster: &'a Cluster,
        options: &PolicyOptions,
        solver: Solver,
        keep_layout: bool,
        adjust: impl FnOnce(&mut rubick_planner::PlannerConfig),
    ) -> Self {
        let mut planner = options.planner.clone();
        adjust(&mut planner);
        PlannerFamily {
            name,
            queue: options.queue,
            keep_layout,
            solver,
            exact: Milp::new(options.milp_time_limit),
            evaluator: Evaluator::new(cluster, &planner),
            last: None,
            history: ServiceHistory::default(),
        }
    }
}

impl super::Policy for PlannerFamily<'_> {
    fn reconfigures(&self) -> bool {
        true
    }

    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Current>> {
        self.evaluator.config.now_s = view.now_s;
        let View { cluster, jobs, .. } = *view;
        if self.queue == Queue::Service {
            let asked: u32 = jobs.iter().filter(|j| j.current.is_none()).map(|j| j.job.request.gpus).sum();
            let oversubscribed = asked >= cluster.total_gpus();
            self.evaluator.config.service_quantum_gpu_s =
                self.history.update(jobs, view.now_s, self.evaluator.config.service_quantum, oversubscribed);
        }
        let quantum = self.evaluator.config.service_quantum_gpu_s;
        // Queue order becomes weight: the head of the queue counts up to twice as much.
        // Running jobs hold their place in it: weighing only the waiting ones made an
        // older running job worth less than a younger waiting one, so rounds paused it
        // for that one and resumed it (restarted) a round later.
        let mut waiting: Vec<usize> = (0..jobs.len()).collect();
        queue_order(&mut waiting, jobs, self.queue);
        let rank: HashMap<usize, usize> = waiting.iter().enumerate().map(|(r, &j)| (j, r)).collect();
        let median_work = if self.queue == Queue::Srpt {
            let mut w: Vec<f64> = jobs.iter().map(|j| j.progress.remaining_work).collect();
            w.sort_by(f64::total_cmp);
            w.get(w.len() / 2).copied().unwrap_or(1.0).max(1.0)
        } else {
            1.0 // unused: only srpt weighs by remaining work
        };
        let inputs: Vec<JobInput> = jobs
            .iter()
            .enumerate()
            .map(|(j, pj)| {
                let mut input = pj.clone();
                let job = &pj.job;
                // What the job's checkpoint allows (a moved job), narrowed by the
                // policy's own rule.
                if self.keep_layout {
                    let layout = request_plan(job, cluster, home_group(job, cluster))
                        .map_or(Restriction::Any, |p| Restriction::layout_of(&p));
                    input.allowed = input.allowed.narrowed_by(layout);
                }
                // A request the model's shape rejects is still what the user ran: the
                // planner's guarantee is its throughput.
                let traced = job
                    .request
                    .plan
                    .is_none()
                    .then(|| traced_plan(job, pj.trace_code, cluster, home_group(job, cluster)));
                if let Some(plan) = traced.flatten() {
                    std::sync::Arc::make_mut(&mut input.job).request.plan = Some(PlanRequest::Exact(plan));
                }
                input.priority = match self.queue {
                    // Shortest remaining work first: every job, running ones too, weighs
                    // by the median remaining work over its own (Smith's rule: the
                    // objective then counts the share of remaining work done per second),
                    // within 1/16..16.
                    Queue::Srpt => (median_work / pj.progress.remaining_work.max(1.0)).clamp(1.0 / 16.0, 16.0),
                    // Two classes, as flat as Tiresias's queues (a finer order would
                    // pause one long job for another slightly less served): below the
                    // quantum, twice the weight of past it.
                    Queue::Service => {
                        if quantum.is_some_and(|q| pj.progress.attained_gpu_s >= q) {
                            1.0
                        } else {
                            2.0
                        }
                    }
                    _ => rank.get(&j).map_or(1.0, |&r| 1.0 + (waiting.len() - r) as f64 / waiting.len().max(1) as f64),
                };
                input
            })
            .collect();
        match plan_round_with(&mut self.evaluator, &inputs, self.solver, &self.exact, round) {
            Ok(r) => {
                let mut schedule = r.outcome.schedule;
                schedule.policy = self.name.to_owned();
                let out =
                    schedule.assignments.iter().map(|a| current_of_assignment(a, cluster).ok().flatten()).collect();
                self.last = Some(RoundReport::Planned(Box::new(schedule), r.outcome.explain));
                out
            }
            Err(e) => {
                tracing::debug!("round at {}: {e}; allocations kept", self.evaluator.config.now_s);
                self.last = Some(RoundReport::Infeasible(e.reason));
                jobs.iter().map(|j| j.current.clone()).collect()
            }
        }
    }

    fn last_round(&mut self) -> Option<RoundReport> {
        self.last.take()
    }
}

#[cfg(test)]
mod tests {
    use rubick_core::PlanCode;
    use rubick_planner::{JobInput, ServiceQuantum};

    use super::ServiceHistory;

    /// The history notes a job as finished when it leaves the view, with the service it
    /// had then; the quantum is over the last day's finished jobs, the newest kept
    /// however old; by load, the median or the weighted median.
    #[test]
    fn the_quantum_follows_the_jobs_that_finished_in_the_last_day() {
        let [a, b, c] = ["a", "b", "c"].map(|n| crate::example(n, PlanCode::ZeroDp, 1, 4));
        fn view(jobs: &[(&JobInput, f64)]) -> Vec<JobInput> {
            let served = |(j, s): &(&JobInput, f64)| {
                let mut j = (*j).clone();
                j.progress.attained_gpu_s = *s;
                j
            };
            jobs.iter().map(served).collect()
        }
        let mut h = ServiceHistory::default();
        let rule = ServiceQuantum::Median;
        assert_eq!(h.update(&view(&[(&a, 100.0), (&b, 200.0), (&c, 1.0)]), 0.0, rule, false), None);
        // `a` finished with 100 GPU-seconds.
        assert_eq!(h.update(&view(&[(&b, 300.0), (&c, 2.0)]), 60.0, rule, false), Some(100.0));
        // A day later nothing else finished: the newest is kept.
        let later = 60.0 + ServiceHistory::WINDOW_S + 1.0;
        assert_eq!(h.update(&view(&[(&b, 400.0), (&c, 3.0)]), later, rule, false), Some(100.0));
        // `b` finishes with the 400 it had when last seen: `a` is now older than a day
        // and leaves the window.
        assert_eq!(h.update(&view(&[(&c, 4.0)]), later + 60.0, rule, false), Some(400.0));
        // By load: the same window either way with one job in it.
        let mut h = ServiceHistory::default();
        let load = ServiceQuantum::Load;
        h.update(&view(&[(&a, 100.0), (&b, 900.0), (&c, 100.0)]), 0.0, load, false);
        // `a` and `b` finish: median 500, weighted median 900 (900 of the 1,000 GPU-seconds).
        assert_eq!(h.update(&view(&[(&c, 200.0)]), 60.0, load, true), Some(500.0));
        assert_eq!(h.update(&view(&[(&c, 300.0)]), 120.0, load, false), Some(900.0));
    }
}
