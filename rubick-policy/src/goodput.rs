//! The goodput-row peers: Sia and Pollux, each as its artifact decides, on this
//! project's cluster, beliefs and placement.
//!
//! Both value every job over a row of (GPU type, GPU count) configurations from its
//! fitted model, its plan layout fixed (TP, PP, ZeRO, offload: neither chooses them;
//! data parallelism takes the GPUs), cores the node's fair share per GPU (GPUs are the
//! only resource they manage), and choose one configuration or none per job. They
//! differ in the objective and the restart delay:
//!
//! * **Sia** (Jayaram Subramanya et al., SOSP 2023), following `siasosp23/artifacts`
//!   at aaf7a0d, `sia-simulator/sia.py`: `SiaPolicy.optimize_mip` (the goodput rows and
//!   their normalisation), `SiaPolicy.__solve_mip_rescaled` (the objective), and
//!   `sia-simulator/simulator_config.py` (`sia_default_p_val`, `sia_default_lambda_n`,
//!   `sia_goodput_clip_val`, `sia_solver_thresh`, `preserve_ckpt_allocs`). Each row is
//!   normalised so that its least goodput is worth the job's scale unit
//!   (`min_goodput_scale_unit`: in the artifact one replica, `num_stages` GPUs; here
//!   the GPUs of its smallest configuration, so a job that needs k GPUs at least is
//!   worth k there and its term is k^-0.5); the
//!   configurations other than the current one of a job that runs are scaled by the
//!   restart factor (`optimize_mip`, `if prev_config_idx is not None`: a waiting job's
//!   row is not)
//!   ([`rubick_planner::restart_factor`], the artifact's
//!   `sia_use_pollux_realloc_factor` form, 1 while the job is younger than one restart)
//!   with the job's own restart cost (the artifact's `get_restart_penalty`, 25-250 s
//!   per model, is what its simulator charges: here the job's measured
//!   `restart_cost_s`, else what the simulation charges every restart); the terms are
//!   raised to `p = -0.5`, rounded to 0.01 and clipped at 3,000; `lambda_n = 1.1` for
//!   each job left unallocated; minimised exactly (the artifact: CBC at a 1e-4
//!   relative gap). A job mid checkpoint-restore keeps its configuration
//!   (`preserve_ckpt_allocs`).
//! * **Pollux** (Qiao et al., OSDI 2021), following the Sia artifact's fork of AdaptDL's
//!   policy, `siasosp23/artifacts` at aaf7a0d, `adaptdl/sched/adaptdl_sched/policy/
//!   pollux.py`, `Problem._evaluate` (the same objective as the Sia simulator's
//!   `sia-simulator/pollux_unaware.py`, `PolluxPolicyUnaware`, `p_fairness = -1`):
//!   speedups, the restart factor with a fixed `delay = 30` s on every configuration
//!   but the current one, and the power mean with `p = -1` of `speedup + 1e-3` over
//!   the jobs maximised (an unallocated job's term is `1e-3^-1 = 1000`: Pollux gives
//!   every job it can a GPU first). Upstream `petuum/adaptdl` (542e123,
//!   `sched/adaptdl_sched/policy/pollux.py`) differs: it maximises the *sum* of the
//!   speedups, a restart costs a flat 10 % of a job's speedup (`_restart_penalty =
//!   0.1`), the cluster's size is a second objective (autoscaling, `_desired_nodes`),
//!   and the base goodput is the job's `min_replicas`; the fork replaced these with
//!   the power mean, the age-based restart factor and a fair-share base goodput. Both
//!   search with NSGA-II (pymoo); here the same objective is solved exactly. Left
//!   out of the fork: its base goodput at the fair share (`ceil(GPUs / jobs)`
//!   replicas) and its scaling of every speedup by the job's dominant share times the
//!   nodes; speedups here are over one GPU's goodput (the fork's base whenever there
//!   are at least as many jobs as GPUs, the busy case).
//!
//! Both solve their round exactly: on one GPU type whose cores and memory follow its
//! GPUs (the fair share of cores; memory within a GPU's share) the round is a
//! multiple-choice knapsack over the GPUs, the decomposition by GPU type Sia's paper
//! describes, solved by dynamic programming ([`rubick_milp::knapsack`]: exact, no time
//! limit, the same answer on any machine); otherwise by the MILP bounded by
//! branch-and-bound nodes ([`rubick_milp::Milp::deterministic`]), whose time limit
//! (the options', at least 60 s) is a safety net reported as `time-limit` with its gap.
//!
//! Shared, from the artifacts: the configurations of `CONFIGS_8GPU` (1, 2, 4 GPUs in a
//! node, then whole nodes; halving below a node for other node sizes), at most
//! `max(2 * the most GPUs the job has held, 1)` GPUs and at most 64
//! (`sia-simulator/cluster.py`, `max_replicas`): a job starts small and at most doubles
//! per round. Left out, and why: batch-size tuning (AdaptDL's goodput over batch size:
//! this project's jobs fix their global batch, so goodput is throughput); Sia's
//! heterogeneity projection (bootstrapping a new GPU type's throughput: the beliefs here
//! cover every type); `lambda_a` (defined, unused in the artifact's objective); Pollux's
//! cluster autoscaling and its interference avoidance. A job whose layout runs on none
//! of the configurations (e.g. TP 8 on a 4-GPU node) is offered its request.

use std::collections::HashMap;

use rubick_core::schedule::{SolverStats, SolverStatus};
use rubick_core::{Cluster, Placement, Plan};
use rubick_milp::Milp;
use rubick_model::belief::Belief;
use rubick_model::throughput;
use rubick_planner::curves::{Candidate, CurveBook, Evaluator, JobCurves, host_memory_gib};
use rubick_planner::exact::ExactSolver;
use rubick_planner::place::Repack;
use rubick_planner::round::assemble;
use rubick_planner::{CandidateFilter, Current, JobInput, Restriction, current_of_assignment, eligible_groups};

use super::planner::RoundReport;
use super::{Policy, PolicyOptions, View, home_group, request_config, request_plan, traced_plan, users_plan};

/// Which peer's objective and constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rule {
    pub name: &'static str,
    /// Exponent of the power mean (both minimise `sum term^p` for `p < 0`).
    pub p: f64,
    /// What an unallocated job costs in the sum (Sia's `lambda_n`; Pollux's `1e-3^p`).
    pub unallocated: f64,
    /// Added to the (factored) speedup before the power (Pollux: 1e-3).
    pub offset: f64,
    /// Rows normalised to their minimum (Sia) or to one GPU's goodput (Pollux).
    pub normalise_to_min: bool,
    /// Terms rounded to 0.01 and clipped at this (Sia: 3,000).
    pub round_and_clip: Option<f64>,
    /// The restart delay of the factor: `None`, the job's own restart cost (Sia).
    pub delay_s: Option<f64>,
    /// A job mid checkpoint-restore keeps its configuration.
    pub pin_restoring: bool,
    /// The restart factor scales only the rows of jobs that hold GPUs now (Sia:
    /// `sia.py` `optimize_mip`, `if prev_config_idx is not None`); Pollux's fork scales
    /// every configuration but the current one, a waiting job's too.
    pub factor_only_running: bool,
    /// The MILP's relative gap (Sia: CBC's `allowablePercentageGap` of
    /// `sia_solver_thresh`, 1e-4).
    pub rel_gap: f64,
}

/// Sia's constants (`simulator_config.py`: `sia_default_p_val`, `sia_default_lambda_n`,
/// `sia_goodput_clip_val`).
pub(super) const SIA: Rule = Rule {
    name: "sia",
    p: -0.5,
    unallocated: 1.1,
    offset: 0.0,
    normalise_to_min: true,
    round_and_clip: Some(3000.0),
    delay_s: None,
    pin_restoring: true,
    factor_only_running: true,
    rel_gap: 1e-4,
};

/// Pollux's constants (`pollux.py`: `delay = 30`, `p = -1`, `+ 1e-3`).
pub(super) const POLLUX: Rule = Rule {
    name: "pollux",
    p: -1.0,
    unallocated: 1000.0,
    offset: 1e-3,
    normalise_to_min: false,
    round_and_clip: None,
    delay_s: Some(30.0),
    pin_restoring: false,
    factor_only_running: false,
    rel_gap: 1e-6,
};

/// Speedups below this count as this (Sia's `ZERO_ALLOC_GAIN`).
const ZERO_ALLOC_GAIN: f64 = 1e-4;
/// Branch-and-bound nodes of a MILP round at most (rounds the knapsack cannot solve:
/// several GPU types, or memory that binds before GPUs).
const MILP_NODES: u64 = 2_000;
/// The MILP's time limit at least this: a safety net that deterministic rounds never
/// reach (reaching it is logged and reported as `time-limit` with its gap).
const MILP_SAFETY: std::time::Duration = std::time::Duration::from_secs(60);
/// The artifacts' largest allocation ("simulator can't handle more").
const MAX_GPUS: u32 = 64;

/// A job's row: (node group, GPUs, its best plan there, predicted throughput, host
/// memory of that plan) per configuration.
type Row = std::rc::Rc<Vec<(usize, u32, Plan, f64, f64)>>;

/// A goodput-row peer.
pub(super) struct GoodputPolicy<'a> {
    rule: Rule,
    evaluator: Evaluator<'a>,
    /// The exact objective's solver (the MILP with the options' time limit).
    exact: Milp,
    /// Each present job's row: (group, GPUs, best plan of its layout, throughput) for
    /// every configuration up to the artifacts' largest, the same every round while the
    /// plans it may run (`JobInput::allowed`) are.
    rows: HashMap<String, (Restriction, Row)>,
    last: Option<RoundReport>,
}

impl<'a> GoodputPolicy<'a> {
    pub fn new(rule: Rule, cluster: &'a Cluster, options: &PolicyOptions) -> Self {
        let mut planner = options.planner.clone();
        planner.fair_cores_only = true;
        GoodputPolicy {
            rule,
            evaluator: Evaluator::new(cluster, &planner),
            exact: Milp::deterministic(MILP_NODES, rule.rel_gap, options.milp_time_limit.max(MILP_SAFETY)),
            rows: HashMap::new(),
            last: None,
        }
    }

    /// GPU counts of the artifacts' configurations on a group of `gpn`-GPU nodes.
    fn counts(gpn: u32, nodes: u32) -> Vec<u32> {
        let mut below: Vec<u32> =
            std::iter::successors(Some(1u32), |&k| Some(k * 2)).take_while(|&k| k < gpn).collect();
        below.extend((1..=nodes).map(|k| k * gpn));
        below
    }

    /// The job's layout: its request's plan (the trace's when the model rejects it),
    /// else the best plan on its requested GPUs.
    fn layout(&mut self, pj: &JobInput) -> Restriction {
        let cluster = self.evaluator.cluster;
        let (job, params) = (&pj.job, &pj.belief.params);
        let group = home_group(job, cluster);
        let plan = request_plan(job, cluster, group).or_else(|| traced_plan(job, pj.trace_code, cluster, group));
        let plan = plan.or_else(|| {
            let placement = Placement::packed(job.request.gpus, cluster.node_groups[group].gpus_per_node)?;
            let cpus = cluster.node_groups[group].fair_cpus_per_gpu() * job.request.gpus;
            users_plan(job, params, pj.trace_code, &mut self.evaluator, (group, &placement), cpus)
        });
        plan.map_or(Restriction::Any, |p| Restriction::layout_of(&p))
    }

    /// The job's row: its best plan of its layout on each configuration's packed GPUs
    /// (up to the artifacts' largest, or its request when that is larger), with its
    /// predicted throughput; computed once per job.
    fn row(&mut self, pj: &JobInput) -> Row {
        if let Some((_, row)) = self.rows.get(&pj.job.name).filter(|(allowed, _)| *allowed == pj.allowed) {
            return row.clone();
        }
        // The request's layout, within what the job's checkpoint allows (a moved job).
        let layout = pj.allowed.narrowed_by(self.layout(pj));
        let cluster = self.evaluator.cluster;
        let largest = MAX_GPUS.max(pj.job.request.gpus);
        let mut row = Vec::new();
        for (group, g) in eligible_groups(&pj.job, cluster) {
            for gpus in Self::counts(g.gpus_per_node, g.count).into_iter().filter(|&n| n <= largest) {
                let Some(placement) = Placement::packed(gpus, g.gpus_per_node) else { continue };
                let cpus = g.fair_cpus_per_gpu() * gpus;
                let point = self.evaluator.best_plan(&pj.job, &pj.belief.params, group, &placement, cpus, layout);
                if let Some((plan, thr)) = point.filter(|(p, t)| t.is_finite() && *t > 0.0 && pj.job.can_run(p)) {
                    row.push((
                        group,
                        gpus,
                        plan,
                        thr,
                        host_memory_gib(&self.evaluator.config, g, &pj.job.model, &plan),
                    ));
                }
            }
        }
        let row = Row::new(row);
        self.rows.insert(pj.job.name.clone(), (pj.allowed, row.clone()));
        row
    }

    /// The job's candidates: its row of configurations, valued for maximisation as
    /// `unallocated - term` (the minimised sum's saving over leaving it out).
    fn curves(
        &mut self,
        pj: &JobInput,
        (now_s, restart_s): (f64, f64),
        configs: Option<&dyn CandidateFilter>,
    ) -> JobCurves {
        let cluster = self.evaluator.cluster;
        let cap = (2 * pj.progress.max_gpus).max(1).min(MAX_GPUS.max(pj.job.request.gpus));
        let row = self.row(pj);
        // The artifacts' valid configurations: up to the cap, but at least the smallest
        // the layout runs on (its scale unit).
        let least = row.iter().map(|r| r.1).min();
        let raw: Vec<_> = row.iter().filter(|r| r.1 <= cap || Some(r.1) == least).collect();
        let mut fallback = None;
        if raw.is_empty() {
            // No configuration runs its layout (e.g. the trace's TP 5 of GPT-2): its
            // request as the user ran it, a rigid job.
            fallback = request_config(&pj.job, &pj.belief.params, pj.trace_code, &mut self.evaluator, configs);
        }
        // The request as a rigid job: its throughput, and (Sia's `_get_rigid_goodputs`)
        // its goodput normalised to its GPU count.
        let rigid = fallback.as_ref().map(|r| {
            let g = &cluster.node_groups[r.group];
            let cpu_ref = self.evaluator.config.cpu_reference(g);
            let thr =
                throughput::samples_per_s(&pj.job.model, &pj.belief.params, g, &r.plan, &r.placement, r.cpus, cpu_ref);
            let thr = if thr.is_finite() && thr > 0.0 { thr } else { 1.0 };
            (r.clone(), thr, host_memory_gib(&self.evaluator.config, g, &pj.job.model, &r.plan))
        });
        let base = match &rigid {
            Some((r, thr, _)) => thr / f64::from(r.placement.gpus().max(1)),
            // Sia (`optimize_mip`, `min_goodput_scale_unit`): the row's least goodput is
            // worth the job's scale unit, the GPUs of its smallest configuration (in the
            // artifact one replica, `num_stages` GPUs; here what the job's memory allows
            // at least, TP x PP or more).
            None if self.rule.normalise_to_min => raw
                .iter()
                .min_by(|a, b| a.3.total_cmp(&b.3).then(a.1.cmp(&b.1)))
                .map_or(f64::INFINITY, |r| r.3 / f64::from(r.1.max(1))),
            // One GPU's goodput; a layout that needs more: its smallest configuration per GPU.
            None => raw.iter().min_by_key(|r| r.1).map_or(1.0, |r| r.3 / f64::from(r.1)),
        };
        let base = if base.is_finite() && base > 0.0 { base } else { 1.0 };
        let delay = self.rule.delay_s.unwrap_or(restart_s);
        let cur = pj.current.as_ref();
        let factor = if cur.is_none() && self.rule.factor_only_running {
            1.0
        } else {
            rubick_planner::restart_factor((now_s - pj.job.submit_time_s).max(0.0), pj.restarts, delay)
        };
        let mut candidates: Vec<Candidate> = Vec::with_capacity(raw.len() + 1);
        let mut has_current = false;
        for &&(group, gpus, plan, thr, mem) in &raw {
            let g = &cluster.node_groups[group];
            let is_current = cur.is_some_and(|c| c.group == group && c.placement.gpus() == gpus);
            has_current |= is_current;
            let (plan, placement, cpus, mem) = match cur.filter(|_| is_current) {
                // The current configuration stays as it runs (placement, plan, cores).
                Some(c) => (c.plan, c.placement.clone(), c.cpus, c.host_memory_gib),
                None => {
                    let Some(placement) = Placement::packed(gpus, g.gpus_per_node) else { continue };
                    (plan, placement, g.fair_cpus_per_gpu() * gpus, mem)
                }
            };
            candidates.push(self.candidate(group, (gpus, cpus, mem), placement, plan, thr, base, is_current, factor));
        }
        if let (Some((r, thr, mem)), None) = (&rigid, cur) {
            let resources = (r.placement.gpus(), r.cpus, *mem);
            candidates.push(self.candidate(r.group, resources, r.placement.clone(), r.plan, *thr, base, false, factor));
        }
        if let (Some(c), false) = (cur, has_current) {
            // A current configuration outside the row (e.g. 3 GPUs): exempt, as it runs.
            let g = &cluster.node_groups[c.group];
            let cpu_ref = self.evaluator.config.cpu_reference(g);
            let thr =
                throughput::samples_per_s(&pj.job.model, &pj.belief.params, g, &c.plan, &c.placement, c.cpus, cpu_ref);
            let resources = (c.placement.gpus(), c.cpus, c.host_memory_gib);
            candidates.push(self.candidate(c.group, resources, c.placement.clone(), c.plan, thr, base, true, factor));
        }
        let pinned = self.rule.pin_restoring && pj.restoring && cur.is_some();
        if pinned {
            candidates.retain(|c| c.is_current);
        }
        candidates.sort_by(|a, b| {
            (a.group, a.gpus, a.cpus).cmp(&(b.group, b.gpus, b.cpus)).then(b.is_current.cmp(&a.is_current))
        });
        let current = candidates.iter().position(|c| c.is_current);
        JobCurves {
            name: pj.job.name.clone(),
            request_throughput: base,
            guaranteed: false,
            locked: pinned && current.is_some(),
            must_run: pinned && current.is_some(),
            weight: 1.0,
            candidates,
            current,
            refused: None,
            scaled_out: None,
            keep_share: None,
        }
    }

    /// One configuration valued as the peer does.
    #[allow(clippy::too_many_arguments)]
    fn candidate(
        &self,
        group: usize,
        (gpus, cpus, mem): (u32, u32, f64),
        placement: Placement,
        plan: Plan,
        throughput: f64,
        base: f64,
        is_current: bool,
        factor: f64,
    ) -> Candidate {
        let rule = &self.rule;
        let speedup = (throughput / base.max(1e-12)).max(ZERO_ALLOC_GAIN);
        let scaled = if is_current { speedup } else { speedup * factor };
        let mut term = (scaled + rule.offset).powf(rule.p);
        if let Some(clip) = rule.round_and_clip {
            term = ((term * 100.0).round() / 100.0).min(clip);
        }
        Candidate {
            group,
            gpus,
            cpus,
            host_memory_gib: mem,
            placement,
            plan,
            throughput,
            normalized: speedup,
            value: rule.unallocated - term,
            is_current,
            is_request: false,
            meets_guarantee: false,
        }
    }
}

impl Policy for GoodputPolicy<'_> {
    fn reconfigures(&self) -> bool {
        true
    }

    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Current>> {
        self.evaluator.config.now_s = view.now_s;
        let View { cluster, jobs, now_s, .. } = *view;
        let restart_s = self.evaluator.config.default_restart_s;
        let mut curves = Vec::with_capacity(jobs.len());
        let mut inputs = Vec::with_capacity(jobs.len());
        for pj in jobs {
            let own = pj.job.restart_cost_s.unwrap_or(restart_s);
            curves.push(self.curves(pj, (now_s, own), view.configs));
            // Their rows rest on the fitted model alone: so does their placement.
            inputs.push(JobInput { belief: Belief::from(pj.belief.params.clone()), ..pj.clone() });
        }
        // Rows of jobs that left are dropped.
        let present: std::collections::HashSet<&str> = jobs.iter().map(|pj| pj.job.name.as_str()).collect();
        self.rows.retain(|name, _| present.contains(name.as_str()));
        let book = CurveBook::new(curves, cluster);
        let kept: Vec<Option<usize>> = book.jobs.iter().map(|j| j.current).collect();
        // One GPU type whose cores and memory follow its GPUs: the knapsack, exact;
        // otherwise the MILP, bounded by nodes (deterministic).
        let solved = match rubick_milp::knapsack::solve(&book) {
            Some(r) => r.map(|s| (s, "knapsack")),
            None => self.exact.solve(&book, cluster, None).map(|s| (s, "milp")),
        };
        let (choice, stats) = match solved {
            Ok((s, method)) => {
                if s.status != rubick_core::schedule::ExactStatus::Optimal {
                    tracing::debug!(
                        "{} round at {now_s}: the MILP stopped ({}) with a gap of {:.2e}",
                        self.rule.name,
                        s.status.as_str(),
                        s.gap
                    );
                }
                let stats = SolverStats {
                    method: method.into(),
                    gap: Some(s.gap),
                    wall_s: None,
                    status: SolverStatus::Exact(s.status),
                };
                (s.choice, stats)
            }
            Err(e) => {
                tracing::debug!("{} round at {now_s}: {e}; allocations kept", self.rule.name);
                let stats = SolverStats {
                    method: "kept".into(),
                    gap: None,
                    wall_s: None,
                    status: SolverStatus::Failed(e.to_string()),
                };
                (kept, stats)
            }
        };
        let objective = rubick_planner::objective(&book, &choice);
        let outcome = assemble(
            &mut self.evaluator,
            &book,
            &inputs,
            &choice,
            objective,
            round,
            self.rule.name,
            stats,
            Repack::None,
        );
        let out =
            outcome.schedule.assignments.iter().map(|a| current_of_assignment(a, cluster).ok().flatten()).collect();
        self.last = Some(RoundReport::Planned(Box::new(outcome.schedule), outcome.explain));
        out
    }

    fn last_round(&mut self) -> Option<RoundReport> {
        self.last.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{example, lookup, running};
    use rubick_core::PlanCode;

    fn options() -> PolicyOptions {
        PolicyOptions {
            queue: crate::Queue::Fifo,
            planner: rubick_planner::PlannerConfig { explain: false, ..Default::default() },
            milp_time_limit: std::time::Duration::from_secs(5),
        }
    }

    /// A job starts on one GPU and at most doubles per round (the artifacts'
    /// `max_replicas`), under both peers; mid-restore, Sia keeps it where it is.
    #[test]
    fn a_job_starts_small_doubles_per_round_and_sia_pins_a_restore() {
        let cluster = Cluster::example();
        let job = example("a", PlanCode::ZeroDp, 8, 96);
        for name in ["sia", "pollux"] {
            let mut policy = lookup(name).unwrap().build(&cluster, &options());
            let jobs = [job.clone()];
            let first = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 0.0, configs: None }, 0);
            let first = first[0].clone().expect("the job starts");
            // Its scale unit: the fewest GPUs its layout (ZeRO data parallelism of a
            // 7B model) fits.
            let unit = first.placement.gpus();
            assert!(unit <= 2, "{name}: {unit}");
            let jobs = [running(&job, &first, false)];
            let next = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 60.0, configs: None }, 1);
            let next = next[0].clone().expect("it runs");
            assert_eq!(next.placement.gpus(), 2 * unit, "{name}: doubles with the whole cluster free");
            let jobs = [running(&job, &next, true)];
            let pinned = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 120.0, configs: None }, 2);
            let pinned = pinned[0].clone().expect("it runs");
            if name == "sia" {
                assert_eq!(pinned.placement.gpus(), 2 * unit, "sia pins a job mid-restore");
            } else {
                assert_eq!(pinned.placement.gpus(), 4 * unit, "pollux does not");
            }
        }
    }

    /// With more jobs than GPUs, Pollux's unallocated term (1,000) makes it give its
    /// scale unit (the fewest GPUs its layout fits) to as many jobs as it can; so does
    /// Sia once a job is worth its smallest configuration's GPUs (`sia.py`'s scale
    /// unit, here 2): starting a waiting job saves `1.1 - 2^-0.5 = 0.39`, growing one
    /// from 2 to 4 GPUs at most `2^-0.5 - 4^-0.5 = 0.21`.
    #[test]
    fn pollux_and_sia_give_their_scale_unit_to_as_many_jobs_as_they_can() {
        let mut cluster = Cluster::example();
        cluster.node_groups[0].count = 1;
        let jobs: Vec<_> = (0..10).map(|k| example(&format!("j{k}"), PlanCode::ZeroDp, 4, 48)).collect();
        let mut unit = 0;
        for name in ["pollux", "sia"] {
            let mut policy = lookup(name).unwrap().build(&cluster, &options());
            let seen: Vec<JobInput> = jobs
                .iter()
                .map(|j| {
                    let mut j = j.clone();
                    j.progress.max_gpus = 4;
                    j
                })
                .collect();
            let out = policy.decide(&View { cluster: &cluster, jobs: &seen, now_s: 0.0, configs: None }, 0);
            let running: Vec<u32> = out.iter().flatten().map(|c| c.placement.gpus()).collect();
            assert_eq!(running.iter().sum::<u32>(), 8, "{name}: {running:?}");
            if name == "pollux" {
                unit = running.iter().copied().min().unwrap_or(0);
                assert_eq!(running, vec![unit; (8 / unit.max(1)) as usize], "{name}");
            } else {
                assert_eq!(running, vec![unit; (8 / unit.max(1)) as usize], "{name}");
            }
        }
    }

    /// Sia values a job at its scale unit as `sia.py` does (`min_goodput_scale_unit`):
    /// a TP-4 job's least configuration is worth 4, its term `4^-0.5 = 0.5`, so starting
    /// it saves `1.1 - 0.5`; normalised to 1 there (the port before) it saved only 0.1.
    /// Its round is a knapsack over the one GPU type.
    #[test]
    fn sia_values_a_job_at_its_scale_unit() {
        let cluster = Cluster::example();
        let job = example("tp4", PlanCode::ThreeD { pp: 1, tp: 4, dp: 1 }, 4, 48);
        let mut policy = lookup("sia").unwrap().build(&cluster, &options());
        let jobs = [job];
        let out = policy.decide(&View { cluster: &cluster, jobs: &jobs, now_s: 0.0, configs: None }, 0);
        let running = out[0].clone().expect("the job starts");
        assert_eq!((running.plan.tp, running.placement.gpus()), (4, 4));
        let Some(RoundReport::Planned(schedule, _)) = policy.last_round() else { panic!("a schedule") };
        assert!((schedule.objective - (1.1 - 0.5)).abs() < 1e-9, "{}", schedule.objective);
        assert_eq!(schedule.solver.method, "knapsack");
    }

    #[test]
    fn the_artifacts_configurations() {
        assert_eq!(GoodputPolicy::counts(8, 3), vec![1, 2, 4, 8, 16, 24]);
        assert_eq!(GoodputPolicy::counts(4, 2), vec![1, 2, 4, 8]);
    }
}
