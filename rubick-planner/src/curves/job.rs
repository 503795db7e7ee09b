//! A job's candidates for a round ([`Evaluator::job_curves`]), in named steps: the
//! Pareto points of its curves, the churn rules' bounds, its current allocation and a
//! re-plan on it, its request, the scale-out and keep-request filters, the value of
//! each candidate (restart payback, evidence, guarantee) and the final order.

use rubick_core::job::Job;
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;
use rubick_model::belief::Support;

use super::{
    BandwidthClass, Candidate, CurvePoint, EPS_VALUE, Evaluator, JobCurves, LOCK_BONUS, Refused, RequestConfig,
    ScaledOut, host_memory_gib,
};
use crate::{JobInput, PlannerConfig, Restriction, eligible_groups};

/// What every step of [`Evaluator::job_curves`] reads of the job.
struct Facts<'i> {
    input: &'i JobInput,
    /// The cache key of its model ([`Evaluator::model_key`]).
    key: usize,
    restriction: Restriction,
    /// In its cooldown and running: it keeps its allocation.
    locked: bool,
    weight: f64,
}

/// A candidate before it is valued: no flags, no value yet.
fn unvalued(
    group: usize,
    cpus: u32,
    host_memory_gib: f64,
    placement: &Placement,
    plan: Plan,
    throughput: f64,
) -> Candidate {
    Candidate {
        group,
        gpus: placement.gpus(),
        cpus,
        host_memory_gib,
        placement: placement.clone(),
        plan,
        throughput,
        normalized: 0.0,
        value: 0.0,
        is_current: false,
        is_request: false,
        meets_guarantee: false,
    }
}

/// How a restart pays off for a running job of believed throughput `current_thr`:
/// over the horizon or the job's remaining time, whichever is shorter, progress lost
/// is `restart_s` of the new throughput. `None` for a job that does not run.
fn payback(input: &JobInput, config: &PlannerConfig, current_thr: Option<f64>) -> Option<f64> {
    current_thr.map(|thr| {
        let remaining = input.progress.remaining_iterations() * input.job.model.global_batch as f64 / thr.max(1e-12);
        let horizon = config.horizon_s.min(remaining).max(1e-9);
        (1.0 - input.restart_s(config) / horizon).max(0.0)
    })
}

/// Growth of a running job: at most `max_growth` times its GPUs in one round; once its
/// restarts are spent, it never shrinks. Returns whether they are spent.
fn bound_growth(candidates: &mut Vec<Candidate>, input: &JobInput, config: &PlannerConfig) -> bool {
    if let (Some(cur), Some(k)) = (&input.current, config.max_growth) {
        let cap = cur.placement.gpus().saturating_mul(k.max(1));
        candidates.retain(|c| c.gpus <= cap);
    }
    let spent = input.restarts_spent(config);
    if let (Some(cur), true) = (&input.current, spent) {
        candidates.retain(|c| c.gpus >= cur.placement.gpus());
    }
    spent
}

/// The samples per second of the job's request: its configuration's, else the best
/// candidate's, else 1.
fn request_throughput(request: Option<&RequestConfig>, candidates: &[Candidate]) -> f64 {
    request
        .map(|r| r.throughput)
        .filter(|t| t.is_finite() && *t > 0.0)
        .or_else(|| candidates.iter().map(|c| c.throughput).reduce(f64::max))
        .unwrap_or(1.0)
}

/// GPUs beyond the request must each buy their share of the request's throughput per
/// GPU, at least `scale_out_efficiency` of it. Returns the fastest configuration
/// dropped that beats the current one (for `--explain`).
fn drop_scale_out(
    candidates: &mut Vec<Candidate>,
    job: &Job,
    config: &PlannerConfig,
    request_throughput: f64,
    current_thr: Option<f64>,
) -> Option<ScaledOut> {
    let mut scaled_out: Option<ScaledOut> = None;
    if config.scale_out_efficiency > 0.0 {
        let (req_gpus, eff) = (f64::from(job.request.gpus.max(1)), config.scale_out_efficiency);
        let per_gpu = request_throughput / req_gpus;
        let floor = current_thr.unwrap_or(f64::INFINITY);
        candidates.retain(|c| {
            let extra = f64::from(c.gpus) - req_gpus;
            let keep = c.is_current
                || c.is_request
                || extra <= 0.0
                || (c.throughput - request_throughput) >= eff * per_gpu * extra;
            if !keep
                && c.throughput > floor
                && scaled_out.is_none_or(|s: ScaledOut| c.throughput > s.normalized * request_throughput)
            {
                let needed = 1.0 + eff * extra / req_gpus;
                scaled_out = Some(ScaledOut { gpus: c.gpus, normalized: c.throughput / request_throughput, needed });
            }
            keep
        });
    }
    scaled_out
}

/// A running job is never shrunk below its request's throughput (or what it has, when
/// that is less) nor paused, unless a guarantee needs its resources
/// (`CurveBook::soften_locks`): what it holds beyond is lent, and taken back first.
/// Past its service quantum it is held no longer. Returns whether it is held.
fn keep_request(
    candidates: &mut Vec<Candidate>,
    input: &JobInput,
    config: &PlannerConfig,
    request_throughput: f64,
    current_thr: Option<f64>,
) -> bool {
    let keeps = config.keep_request && current_thr.is_some() && !input.past_quantum(config);
    if let Some(thr) = current_thr.filter(|_| keeps) {
        let floor = thr.min(request_throughput) * (1.0 - 1e-9);
        candidates.retain(|c| c.is_current || c.throughput >= floor);
    }
    keeps
}

/// The order of a job's candidates: by group, GPUs, cores, memory, the current one
/// first among equals, then placement and plan.
fn sort(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        (a.group, a.gpus, a.cpus)
            .cmp(&(b.group, b.gpus, b.cpus))
            .then(a.host_memory_gib.total_cmp(&b.host_memory_gib))
            .then(b.is_current.cmp(&a.is_current))
            .then(a.placement.cmp(&b.placement))
            .then(a.plan.cmp(&b.plan))
    });
}

impl Evaluator<'_> {
    /// A job's candidates and, when `points` is set, every curve point for display.
    pub fn job_curves(&mut self, input: &JobInput, points: Option<&mut Vec<CurvePoint>>) -> JobCurves {
        let job = &input.job;
        let config = self.config.clone();
        let facts = Facts {
            input,
            key: self.model_key(job, &input.belief.params, input.belief.evidence.as_ref()),
            restriction: input.restriction(),
            locked: input.in_cooldown(&config) && input.current.is_some(),
            weight: input.weight(&config),
        };
        let locked = facts.locked;
        let mut candidates =
            if !locked || points.is_some() { self.curve_candidates(&facts, points) } else { Vec::new() };
        let spent = bound_growth(&mut candidates, input, &config);
        let current_thr = self.add_current(&facts, &mut candidates);
        let request = self.request_config(facts.key, input);
        self.add_request(&facts, request.as_ref(), &mut candidates);
        let request_layout = request.as_ref().and_then(|r| r.plan).map(|p| Restriction::layout_of(&p));
        let request_throughput = request_throughput(request.as_ref(), &candidates);
        let scaled_out = drop_scale_out(&mut candidates, job, &config, request_throughput, current_thr);
        let keeps = keep_request(&mut candidates, input, &config, request_throughput, current_thr);
        // With the restart factor (hysteresis growing with the job's restarts), a change
        // must also gain 1 / factor.
        let factor = input.restart_factor(&config);
        let payback = payback(input, &config, current_thr);
        let keep_share = payback.map(|p| p * factor);
        let refused =
            self.value(&facts, &mut candidates, request_throughput, request_layout, payback, keep_share, factor);
        // A guaranteed job keeps only configurations that meet its guarantee. When
        // guaranteed jobs queue and none can (its request does not fit, the margin is
        // out of reach), it is admitted best-effort rather than never.
        let guaranteed = job.guaranteed && (!config.queue_guaranteed || candidates.iter().any(|c| c.meets_guarantee));
        if guaranteed {
            candidates.retain(|c| c.meets_guarantee);
        }
        sort(&mut candidates);
        let current = candidates.iter().position(|c| c.is_current);
        // A change the factor refused: one worth more than staying without it.
        let refused = refused.filter(|r| {
            !locked && current.is_some_and(|k| r.value > candidates[k].value + 1e-12 && r.value > EPS_VALUE)
        });
        JobCurves {
            refused,
            scaled_out: scaled_out.filter(|_| !locked),
            keep_share,
            name: job.name.clone(),
            request_throughput,
            guaranteed,
            locked: locked && current.is_some(),
            must_run: (guaranteed && (input.current.is_some() || !config.queue_guaranteed))
                || ((locked || spent || keeps) && current.is_some()),
            weight: facts.weight,
            candidates,
            current,
        }
    }

    /// The Pareto points of the job's curves on every group it may run on (with fixed
    /// GPU counts, every configuration of the request's count), as candidates unless
    /// the job is locked; every point into `points` when asked.
    fn curve_candidates(&mut self, facts: &Facts<'_>, mut points: Option<&mut Vec<CurvePoint>>) -> Vec<Candidate> {
        let job = &facts.input.job;
        let mut candidates = Vec::new();
        let groups: Vec<usize> = eligible_groups(job, self.cluster).map(|(i, _)| i).collect();
        for group in groups {
            let (cap, curve) = self.raw_curve(facts.key, group, facts.restriction, job.request.gpus);
            let (raw, keep) = &*curve;
            // Fixed GPU counts: the request's, or the nearest count with a plan.
            let fixed = self.config.fixed_gpus.then(|| {
                let want = job.request.gpus.min(cap);
                raw.iter().map(|r| r.gpus).min_by_key(|&g| (g.abs_diff(want), g)).unwrap_or(want)
            });
            for (r, &pareto) in raw.iter().zip(keep).filter(|(r, _)| r.gpus <= cap && fixed.is_none_or(|g| r.gpus == g))
            {
                // With fixed GPU counts, every configuration of that count stays.
                let k = pareto || fixed.is_some();
                if let Some(points) = points.as_deref_mut() {
                    points.push(CurvePoint {
                        group,
                        gpus: r.gpus,
                        cpus: r.cpus,
                        class: BandwidthClass::of(&r.placement),
                        plan: r.plan,
                        throughput: r.throughput,
                        pareto: k,
                    });
                }
                if k && !facts.locked {
                    candidates.push(Candidate {
                        gpus: r.gpus,
                        ..unvalued(r.group, r.cpus, r.mem, &r.placement, r.plan, r.throughput)
                    });
                }
            }
        }
        candidates
    }

    /// A running job's current allocation as a candidate (in place of the same
    /// configuration found by the curve), and a re-plan on the resources it holds.
    /// Returns its believed throughput; `None` for a job that does not run.
    fn add_current(&mut self, facts: &Facts<'_>, candidates: &mut Vec<Candidate>) -> Option<f64> {
        let input = facts.input;
        let cur = input.current.as_ref()?;
        let thr = self.believed_keyed(Some(facts.key), input, cur.group, &cur.plan, &cur.placement, cur.cpus);
        // The same configuration found by the curve is the current one.
        candidates.retain(|c| {
            !(c.group == cur.group && c.plan == cur.plan && c.placement == cur.placement && c.cpus == cur.cpus)
        });
        candidates.push(Candidate {
            is_current: true,
            ..unvalued(cur.group, cur.cpus, cur.host_memory_gib, &cur.placement, cur.plan, thr)
        });
        // A re-plan on the resources it holds, the plan valued as a change is (at the
        // low end of its interval): the curve's points have the group's base cores,
        // which a running job may not hold, and its best predicted plans.
        if !facts.locked
            && let Some((plan, throughput)) =
                self.best_plan_at_low_end(input, cur.group, &cur.placement, cur.cpus, facts.restriction)
        {
            let same = |c: &Candidate| {
                c.group == cur.group && c.placement == cur.placement && c.cpus == cur.cpus && c.plan == plan
            };
            if plan != cur.plan && !candidates.iter().any(same) {
                let g = &self.cluster.node_groups[cur.group];
                let mem = host_memory_gib(&self.config, g, &input.job.model, &plan);
                candidates.push(unvalued(cur.group, cur.cpus, mem, &cur.placement, plan, throughput));
            }
        }
        Some(thr)
    }

    /// A guaranteed job may always run exactly as it asked (when its plan fits and its
    /// checkpoints allow it): that configuration meets the guarantee whatever the
    /// model's error. Marks it among the candidates, or adds it.
    fn add_request(&self, facts: &Facts<'_>, request: Option<&RequestConfig>, candidates: &mut Vec<Candidate>) {
        let job = &facts.input.job;
        let Some(RequestConfig { group, plan: Some(plan), placement, cpus, throughput: thr }) = request else {
            return;
        };
        if !job.guaranteed || facts.locked {
            return;
        }
        let g = &self.cluster.node_groups[*group];
        let mem = host_memory_gib(&self.config, g, &job.model, plan);
        let share = f64::from(placement.max_per_node()) / f64::from(placement.gpus().max(1));
        let fits_node = f64::from(*cpus) * share <= f64::from(g.cpu_cores) && mem * share <= g.host_memory_gib;
        if facts.restriction.allows(plan)
            && job.can_run(plan)
            && fits_node
            && self.estimator.fits(&job.model, plan, g.gpu_memory_gib).0
        {
            let same =
                |c: &Candidate| c.group == *group && c.plan == *plan && c.placement == *placement && c.cpus == *cpus;
            match candidates.iter_mut().find(|c| same(c)) {
                Some(c) => c.is_request = true,
                None => candidates.push(Candidate {
                    is_request: true,
                    meets_guarantee: true,
                    ..unvalued(*group, *cpus, mem, placement, *plan, *thr)
                }),
            }
        }
    }

    /// Values every candidate: its throughput over the request's, whether it meets the
    /// guarantee (at the low end of its ~95 % interval, with the margin the model's
    /// error calls for), and its value in the objective (a change repays its restart,
    /// a measured configuration is left only for a gain at the other's low end, a
    /// locked current one is worth [`LOCK_BONUS`] more). Returns the best change the
    /// restart factor alone refused.
    #[allow(clippy::too_many_arguments)]
    fn value(
        &self,
        facts: &Facts<'_>,
        candidates: &mut [Candidate],
        request_throughput: f64,
        request_layout: Option<Restriction>,
        payback: Option<f64>,
        keep_share: Option<f64>,
        factor: f64,
    ) -> Option<Refused> {
        let (input, config, weight, locked) = (facts.input, &self.config, facts.weight, facts.locked);
        // With the model's evidence: each candidate's throughput at the low end of its
        // ~95 % interval (measured ones: as predicted).
        let low: Vec<f64> = candidates
            .iter()
            .map(|c| {
                let spread = self.uncertainty(input, c.group, &c.plan, &c.placement).map_or(0.0, |(_, h)| h);
                c.throughput * (-spread).exp()
            })
            .collect();
        let current_measured = input.current.as_ref().is_some_and(|cur| {
            self.uncertainty(input, cur.group, &cur.plan, &cur.placement).is_some_and(|(s, _)| s == Support::Measured)
        });
        let mut refused: Option<Refused> = None;
        for (c, &low) in candidates.iter_mut().zip(&low) {
            c.normalized = c.throughput / request_throughput;
            // Other configurations must beat the request by the margin the model's
            // error calls for, at the low end of their interval: a measured request is
            // a floor that only evidence lifts.
            let layout_ok = !config.guarantee_keeps_layout
                || request_layout.is_none_or(|r: Restriction| r.allows(&c.plan) || c.is_current);
            c.meets_guarantee = c.is_request
                || (layout_ok && low >= request_throughput * (1.0 + config.guarantee_margin) * (1.0 - 1e-9));
            // A measured configuration is left for another only for a gain that holds
            // at the other's low end; a job with evidence that does not run yet starts
            // on the configuration whose low end is best (a family measured slower than
            // modelled widens its interval: `Evidence::family_spread`).
            let at_low_end = current_measured || (input.current.is_none() && input.belief.evidence.is_some());
            let valued = if at_low_end && !c.is_current { low / request_throughput } else { c.normalized };
            c.value = match keep_share {
                Some(share) if !c.is_current => weight * valued * share - config.change_min_gain,
                _ if c.is_current && locked => weight * c.normalized + LOCK_BONUS,
                _ => weight * valued,
            };
            // What the change would be worth without the restart factor: whether the
            // factor alone refused it (for `--explain`).
            if let (Some(p), false, true) = (payback, c.is_current, factor < 1.0) {
                let unfactored = weight * valued * p - config.change_min_gain;
                if refused.as_ref().is_none_or(|r: &Refused| unfactored > r.value) {
                    refused = Some(Refused { value: unfactored, normalized: c.normalized, factor });
                }
            }
        }
        refused
    }
}
