//! One job in a simulation: its state under the truth (work left, allocation and its
//! restart penalty, noise, GPU-seconds, a guarantee's violations), what a decision
//! makes of it ([`State::apply`]), a round's progress ([`State::advance`]) and its
//! outcome ([`State::result`]).

use rubick_core::schedule::Change;
use rubick_core::{Cluster, Placement, Plan};
use rubick_planner::Current;
use rubick_planner::curves::Evaluator;
use rubick_policy::{Request, request_config, work_per_iteration};

use super::{JobResult, SimConfig, SimJob};
use crate::truth::{Basis, Truth};

#[derive(Debug, Clone, Default)]
pub(super) struct State {
    pub(super) remaining: f64,
    pub(super) alloc: Option<Current>,
    pub(super) penalty_until: f64,
    pub(super) first_start: Option<f64>,
    pub(super) finish: Option<f64>,
    pub(super) restarts: u32,
    /// Times it was paused (preempted) while running.
    pub(super) pauses: u32,
    pub(super) plan_changes: u32,
    pub(super) gpu_s: f64,
    /// GPU-seconds held while restarting (no progress).
    pub(super) restart_gpu_s: f64,
    /// The most GPUs it has held.
    pub(super) max_gpus: u32,
    /// Its allocation began with a restart (not its first start).
    pub(super) restarting: bool,
    /// Seconds a guaranteed, admitted job was paused or below its guarantee.
    pub(super) violation_s: f64,
    /// Running time by how its truth was known (`Basis::ALL` order).
    pub(super) basis_s: [f64; 3],
    /// Required samples/s (truth of the request), for guaranteed jobs.
    pub(super) required: f64,
    /// The request of a guaranteed job: its plan, the placements it counts on (packed,
    /// or where it was measured) and its cores. Running it is meeting the guarantee.
    pub(super) request: Option<(usize, Plan, Vec<Placement>, u32)>,
    /// Predicted GPU-seconds per iteration on the request (belief): remaining work.
    pub(super) work_per_iter: f64,
    /// The noise factor of the current allocation, and how many allocations it had.
    pub(super) noise: f64,
    /// The truth of the current allocation (iteration time, basis): it only changes
    /// with the allocation.
    pub(super) truth: Option<(f64, Basis)>,
    pub(super) allocations: u64,
}

impl State {
    /// Predicted GPU-seconds of work left on the job's request (what `srpt` orders by).
    pub(super) fn remaining_work(&self) -> f64 {
        self.remaining * self.work_per_iter
    }
}

/// The truth's iteration time of a job's allocation, and its basis.
pub(super) fn true_iter_s(job: &SimJob, truth: &Truth, cluster: &Cluster, c: &Current) -> (f64, Basis) {
    let g = &cluster.node_groups[c.group];
    truth.iter_time_s(&job.job.model, &job.params, g, &c.plan, &c.placement, c.cpus)
}

/// A standard normal draw for (seed, job, allocation): the same on every platform.
pub(super) fn normal(seed: u64, job: usize, allocation: u64) -> f64 {
    let mut rng = rubick_planner::rng::SplitMix64::new(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (job as u64).wrapping_mul(0xD1B5_4A32_D192_ED03) ^ allocation,
    );
    let (u1, u2) = (rng.unit().max(1e-300), rng.unit());
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Whether a job ran on in a round, or finished in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Running {
    No,
    Yes,
    Finished,
}

impl State {
    /// The outcome of `sj` so far.
    pub(super) fn result(&self, sj: &SimJob) -> JobResult {
        JobResult {
            name: sj.job.name.clone(),
            model: sj.job.model.name.clone(),
            submit_s: sj.job.submit_time_s,
            first_start_s: self.first_start,
            finish_s: self.finish,
            restarts: self.restarts,
            pauses: self.pauses,
            plan_changes: self.plan_changes,
            gpu_hours: self.gpu_s / 3600.0,
            restart_gpu_hours: self.restart_gpu_s / 3600.0,
            guaranteed: sj.job.guaranteed,
            violation_s: if sj.job.guaranteed { self.violation_s } else { 0.0 },
            basis_s: self.basis_s,
        }
    }

    /// A job not yet submitted: its remaining work as the policies see it, and for a
    /// guaranteed job its request and the truth of the request's throughput.
    pub(super) fn of(sj: &SimJob, cluster: &Cluster, truth: &Truth, evaluator: &mut Evaluator<'_>) -> State {
        let job = &sj.job;
        let mut s = State { remaining: job.iterations as f64, noise: 1.0, ..State::default() };
        let request = request_config(job, &sj.params, sj.trace_code, evaluator, Some(truth.table.as_ref()));
        // Remaining work as the policies see it: iterations x predicted GPU-seconds per
        // iteration on the request.
        s.work_per_iter = work_per_iteration(job, &sj.params, request.as_ref(), evaluator);
        // Required throughput of a guaranteed job: the truth of its request.
        if let (true, Some(Request { group, plan, placement, cpus })) = (job.guaranteed, request) {
            let mut on = vec![placement.clone()];
            let g = &cluster.node_groups[group];
            on.extend(Placement::packed(job.request.gpus, g.gpus_per_node).filter(|p| *p != placement));
            s.request = Some((group, plan, on, cpus));
            let c = Current {
                group,
                plan,
                placement,
                nodes: Vec::new(),
                cpus,
                host_memory_gib: 0.0,
                rounds_since_change: 0,
            };
            let (t, _) = true_iter_s(sj, truth, cluster, &c);
            s.required = job.model.global_batch as f64 / t;
        }
        s
    }

    /// The policy's decision for job `j` at `t`: kept (its rounds since the change
    /// count on), or a change that restarts it (noise drawn anew) or pauses it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &mut self,
        j: usize,
        sj: &SimJob,
        alloc: Option<Current>,
        t: f64,
        cluster: &Cluster,
        truth: &Truth,
        config: &SimConfig,
    ) {
        let change = Current::change(self.alloc.as_ref(), alloc.as_ref());
        if matches!(change, Change::Kept | Change::Pending) {
            if let Some(a) = &mut self.alloc {
                a.rounds_since_change = a.rounds_since_change.saturating_add(1);
            }
            return;
        }
        if let Some(new) = &alloc {
            if tracing::enabled!(tracing::Level::DEBUG) {
                let (iter_s, basis) = true_iter_s(sj, truth, cluster, new);
                tracing::debug!(
                    "t={t}: {} {change:?} -> {} on {} with {} cores ({:.3} samples/s, {basis:?}; request {} GPUs)",
                    sj.job.name,
                    new.plan,
                    new.placement,
                    new.cpus,
                    sj.job.model.global_batch as f64 / iter_s,
                    sj.job.request.gpus
                );
            }
            // Every start but the first is a restart.
            self.restarting = self.alloc.is_some() || self.first_start.is_some();
            if self.restarting {
                self.restarts += 1;
            }
            if self.alloc.as_ref().is_some_and(|a| a.plan != new.plan) {
                self.plan_changes += 1;
            }
            self.first_start.get_or_insert(t);
            self.max_gpus = self.max_gpus.max(new.placement.gpus());
            self.penalty_until = t + config.restart_penalty_s;
            self.allocations += 1;
            self.noise = if config.noise_sigma > 0.0 {
                (config.noise_sigma * normal(config.seed, j, self.allocations)).exp()
            } else {
                1.0
            };
        } else {
            tracing::debug!("t={t}: {} paused", sj.job.name);
            self.pauses += 1;
        }
        self.truth = alloc.as_ref().map(|a| true_iter_s(sj, truth, cluster, a));
        self.alloc = alloc.map(|mut a| {
            a.rounds_since_change = 0;
            a
        });
    }

    /// The round from `t` to `t + round` under the truth: progress after the restart
    /// penalty, GPU-seconds, the basis of the truth, a guarantee's violation. Returns
    /// whether it ran (or finished) and on how many GPUs.
    pub(super) fn advance(
        &mut self,
        sj: &SimJob,
        t: f64,
        round: f64,
        cluster: &Cluster,
        truth: &Truth,
    ) -> (Running, u32) {
        let end = t + round;
        let guaranteed = sj.job.guaranteed && self.first_start.is_some();
        let Some(a) = &self.alloc else {
            if guaranteed {
                // Admitted, then paused: the guarantee does not hold.
                self.violation_s += round;
            }
            return (Running::No, 0);
        };
        let gpus = a.placement.gpus();
        let (true_s, basis) = self.truth.unwrap_or_else(|| true_iter_s(sj, truth, cluster, a));
        let iter_s = true_s * self.noise;
        let start = self.penalty_until.max(t);
        let mut stop = end;
        if start < end {
            let can = (end - start) / iter_s;
            if self.remaining <= can {
                stop = start + self.remaining * iter_s;
                self.remaining = 0.0;
                self.finish = Some(stop);
            } else {
                self.remaining -= can;
            }
        }
        let held = stop - t;
        self.gpu_s += f64::from(gpus) * held;
        if self.restarting {
            self.restart_gpu_s += f64::from(gpus) * (start.min(end) - t).max(0.0);
        }
        self.basis_s[basis as usize] += held;
        // A guarantee compares configurations: the truth of this one against the truth
        // of the request (the noise is the environment's luck, and would have hit the
        // request alike).
        let speed = sj.job.model.global_batch as f64 / true_s;
        let as_requested = self.request.as_ref().is_some_and(|(group, plan, on, cpus)| {
            a.group == *group && a.plan == *plan && on.contains(&a.placement) && a.cpus >= *cpus
        });
        if guaranteed && !as_requested && speed < self.required * 0.99 {
            if self.violation_s <= 0.0 {
                tracing::debug!(
                    "{}: {} on {} runs at {speed:.3} samples/s ({basis:?}), below its guarantee {:.3}",
                    sj.job.name,
                    a.plan,
                    a.placement,
                    self.required
                );
            }
            self.violation_s += held;
        }
        if self.finish.is_some() {
            self.alloc = None;
            self.truth = None;
            return (Running::Finished, gpus);
        }
        (Running::Yes, gpus)
    }
}
