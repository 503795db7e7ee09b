//! Resource sensitivity curves: a job's best predicted throughput as a function of
//! its GPUs, CPU cores, host memory and bandwidth class, with the plan that achieves
//! it, Pareto-pruned into the candidates a round chooses from.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use rubick_core::cluster::{Cluster, NodeGroup};
use rubick_core::job::Job;
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::{Offload, Plan, PlanRequest};
use rubick_model::memory::{GIB, MemoryEstimator};
use rubick_model::perfmodel::{Links, Params, Prediction, idx, predict};
use rubick_model::space::{Dimensions, resolve_code, valid_plans};

use rubick_model::belief::{Belief, Evidence, Support, believed, iter_time_with_cpus};

use super::{Capacity, JobInput, PlannerConfig, Restriction, eligible_groups};

/// Whether a configuration's collectives stay inside one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BandwidthClass {
    /// All GPUs in one node (NVLink).
    Intra,
    /// Across nodes (the network).
    Cross,
}

impl BandwidthClass {
    pub fn of(placement: &Placement) -> Self {
        if placement.is_multi_node() { BandwidthClass::Cross } else { BandwidthClass::Intra }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BandwidthClass::Intra => "intra-node",
            BandwidthClass::Cross => "cross-node",
        }
    }
}

/// Added to the value of a locked job's current allocation, so that once locks are
/// softened (see [`CurveBook::soften_locks`]) a job in its cooldown is paused only when
/// a guarantee needs its resources. Reported objectives leave it out (see
/// [`super::objective`]).
pub const LOCK_BONUS: f64 = 100.0;

/// One configuration of one job: resources, the best plan on them, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Index of the node group in the cluster.
    pub group: usize,
    pub gpus: u32,
    pub cpus: u32,
    pub host_memory_gib: f64,
    /// GPUs per node the candidate assumes (its bandwidth class).
    pub placement: Placement,
    pub plan: Plan,
    /// Predicted samples per second.
    pub throughput: f64,
    /// Throughput over that of the job's request.
    pub normalized: f64,
    /// Contribution to the round's objective when chosen.
    pub value: f64,
    /// The job's present allocation.
    pub is_current: bool,
    /// Exactly the job's request (its plan on its GPUs, packed, with its cores).
    pub is_request: bool,
    pub meets_guarantee: bool,
}

impl Candidate {
    pub fn class(&self) -> BandwidthClass {
        BandwidthClass::of(&self.placement)
    }
}

/// A job's own request as a configuration.
#[derive(Debug, Clone)]
struct RequestConfig {
    group: usize,
    /// The user's plan, when the request names one that resolves.
    plan: Option<Plan>,
    placement: Placement,
    cpus: u32,
    /// Predicted samples per second (of the best plan when the user gave none).
    throughput: f64,
}

/// A point of a curve as the `curves` command shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CurvePoint {
    pub group: usize,
    pub gpus: u32,
    pub cpus: u32,
    pub class: BandwidthClass,
    pub plan: Plan,
    pub throughput: f64,
    /// Kept by Pareto pruning.
    pub pareto: bool,
}

/// A job's candidates for the round.
#[derive(Debug, Clone, PartialEq)]
pub struct JobCurves {
    pub name: String,
    /// Samples per second of the job's own request (its guarantee when guaranteed).
    pub request_throughput: f64,
    pub guaranteed: bool,
    /// The job keeps its allocation this round (cooldown after a change).
    pub locked: bool,
    /// The job must hold a candidate: it is guaranteed, or locked (see
    /// [`CurveBook::soften_locks`]).
    pub must_run: bool,
    pub weight: f64,
    /// Sorted by group, GPUs, cores, memory; guaranteed jobs only keep candidates that
    /// meet their guarantee, locked jobs only their current one.
    pub candidates: Vec<Candidate>,
    /// Index of the current allocation in `candidates`.
    pub current: Option<usize>,
    /// The best change of a running job that its restart factor alone made not worth
    /// its restart (for `--explain`).
    pub refused: Option<Refused>,
    /// The fastest configuration of a running job, faster than its current one, that
    /// the scale-out efficiency dropped (for `--explain`).
    pub scaled_out: Option<ScaledOut>,
    /// For a running job, the share of a new configuration's value that repays its
    /// restart (payback over the horizon, times the restart factor).
    pub keep_share: Option<f64>,
}

impl JobCurves {
    /// What a configuration of `throughput` other than the current one is worth to
    /// this job (as the decision values its candidates, without evidence).
    pub fn value_of_change(&self, throughput: f64, change_min_gain: f64) -> f64 {
        let normalized = throughput / self.request_throughput;
        match self.keep_share {
            Some(share) => self.weight * normalized * share - change_min_gain,
            None => self.weight * normalized,
        }
    }
}

/// A change the restart factor refused (see [`super::restart_factor`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refused {
    /// Its value without the factor.
    pub value: f64,
    /// Its predicted throughput over the request's.
    pub normalized: f64,
    /// The job's restart factor: a change must gain `1 / factor`.
    pub factor: f64,
}

/// A configuration the scale-out efficiency dropped: its GPUs beyond the request add
/// too little (see [`super::PlannerConfig::scale_out_efficiency`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaledOut {
    pub gpus: u32,
    /// Its predicted throughput over the request's.
    pub normalized: f64,
    /// What it would need over the request's throughput to stay.
    pub needed: f64,
}

/// Values below this are no gain.
const EPS_VALUE: f64 = 1e-9;

/// The candidates of every job of a round, in the batch's order, and what each node
/// group offers them.
#[derive(Debug, Clone, PartialEq)]
pub struct CurveBook {
    pub jobs: Vec<JobCurves>,
    /// Per node group: its totals, less what placement found stranded (GPUs on nodes
    /// without cores or memory left, and the reverse) in an earlier attempt.
    pub capacity: Vec<Capacity>,
}

impl CurveBook {
    pub fn new(jobs: Vec<JobCurves>, cluster: &Cluster) -> Self {
        CurveBook { jobs, capacity: cluster.node_groups.iter().map(Capacity::of).collect() }
    }

    /// Lets jobs in their cooldown, and running jobs held by the churn rules (their
    /// request kept, their restarts spent), be paused (they stay locked against any
    /// other change, and keeping a locked one is still worth [`LOCK_BONUS`]): for
    /// rounds whose guarantees cannot all be met otherwise.
    pub fn soften_locks(&mut self) {
        for j in &mut self.jobs {
            j.must_run = j.guaranteed;
        }
    }
}

#[derive(Debug, Clone)]
struct Raw {
    group: usize,
    gpus: u32,
    cpus: u32,
    mem: f64,
    placement: Placement,
    plan: Plan,
    throughput: f64,
}

/// Every point of a curve, and which survive Pareto pruning.
type RawCurve = (Vec<Raw>, Vec<bool>);

/// Evaluates throughput and caches plan spaces and curves across the jobs of a round
/// (a synthetic batch of 2,000 jobs has a handful of distinct models).
#[allow(missing_debug_implementations)]
pub struct Evaluator<'a> {
    pub cluster: &'a Cluster,
    /// The round's knobs; `now_s` may change between rounds, the rest may not (the
    /// caches depend on them).
    pub config: PlannerConfig,
    pub estimator: MemoryEstimator,
    /// Also evaluate jobs of up to a node split over two nodes (for display: such
    /// points never survive pruning, as one node is faster for the same resources).
    pub cross_splits: bool,
    /// Models with their parameters, the features their script supports, the plans
    /// their runs refused and their measurements: a job's plan space depends on the
    /// first four, its curves on all five.
    models: Vec<ModelEntry>,
    spaces: HashMap<(usize, usize, u32), Rc<Vec<Plan>>>,
    /// Per (model, group, restriction): the largest GPU count computed, the points
    /// and which survive Pareto pruning. Pruning only looks at points with fewer
    /// resources, so a job with a smaller cap takes a prefix of the same curve.
    curves: HashMap<(usize, usize, Restriction), (u32, Rc<RawCurve>)>,
    /// Per (model, group, placement, cores, restriction, score): the best plan and its
    /// throughput ([`Evaluator::best_plan_by`]). A job's request and current allocation
    /// are asked every round; a simulation asks the same few thousand many times.
    best: HashMap<BestKey, Option<(Plan, f64)>>,
    /// Per (model, group, plan, placement, cores): the believed throughput
    /// ([`Evaluator::believed_throughput`]).
    believed: RefCell<HashMap<BelievedKey, f64>>,
    /// Per (model, request's GPUs, cores, plan and GPU type): the request as a
    /// configuration ([`Evaluator::request_config`]).
    requests: HashMap<RequestKey, Option<RequestConfig>>,
}

/// The cache key of [`Evaluator::believed_throughput`]: model, group, plan,
/// placement and cores.
type BelievedKey = (usize, usize, Plan, Placement, u32);

/// The cache key of [`Evaluator::request_config`].
type RequestKey = (usize, u32, Option<u32>, Option<PlanRequest>, Option<String>);

/// The cache key of [`Evaluator::best_plan_by`]: model, group, placement, cores,
/// restriction, and whether plans rank by the low end of their interval.
type BestKey = (usize, usize, Placement, u32, Restriction, bool);

/// What a job's candidates depend on, besides the cluster and the round's knobs.
#[derive(Debug)]
struct ModelEntry {
    model: ModelSpec,
    params: Params,
    supports: Option<rubick_core::launch::PlanSupport>,
    refused: Vec<Plan>,
    evidence: Option<Arc<Evidence>>,
}

/// Host memory a plan needs in all: a share per GPU plus offloaded model states.
pub fn host_memory_gib(config: &PlannerConfig, group: &NodeGroup, model: &ModelSpec, plan: &Plan) -> f64 {
    let params = model.parameter_count() as f64;
    let sb = model.state_bytes;
    let offloaded = match plan.offload {
        Offload::None => 0.0,
        Offload::Optimizer => (sb.optimizer + sb.grad) * params,
        Offload::OptimizerAndParams => (sb.optimizer + sb.grad + sb.param) * params,
    };
    config.base_host_gib_per_gpu(group) * f64::from(plan.gpus()) + offloaded / GIB
}

impl<'a> Evaluator<'a> {
    pub fn new(cluster: &'a Cluster, config: &PlannerConfig) -> Self {
        Evaluator {
            cluster,
            config: config.clone(),
            estimator: MemoryEstimator::default(),
            cross_splits: false,
            models: Vec::new(),
            spaces: HashMap::new(),
            curves: HashMap::new(),
            best: HashMap::new(),
            believed: RefCell::new(HashMap::new()),
            requests: HashMap::new(),
        }
    }

    /// The cache key of a job's model, parameters, the plan features its script
    /// supports (`launch.supports`: plans outside it are never in its space), the plans
    /// its runs refused and its measurements.
    fn model_key(&mut self, job: &Job, params: &Params, evidence: Option<&Arc<Evidence>>) -> usize {
        if let Some(i) = self.known_model(job, params, evidence) {
            return i;
        }
        self.models.push(ModelEntry {
            model: job.model.clone(),
            params: params.clone(),
            supports: job.supports().cloned(),
            refused: job.refused_plans().collect(),
            evidence: evidence.cloned(),
        });
        self.models.len() - 1
    }

    /// The cache key of a model already seen ([`Evaluator::model_key`]).
    fn known_model(&self, job: &Job, params: &Params, evidence: Option<&Arc<Evidence>>) -> Option<usize> {
        let supports = job.supports();
        self.models.iter().position(|e| {
            e.model == job.model
                && e.params == *params
                && e.supports.as_ref() == supports
                && e.refused.iter().copied().eq(job.refused_plans())
                && match (&e.evidence, evidence) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
                    _ => false,
                }
        })
    }

    /// Memory-feasible plans of a model on `gpus` GPUs of a group, cached.
    fn space(&mut self, key: usize, group: usize, gpus: u32) -> Rc<Vec<Plan>> {
        if let Some(s) = self.spaces.get(&(key, group, gpus)) {
            return Rc::clone(s);
        }
        let g = &self.cluster.node_groups[group];
        let ModelEntry { model, supports, refused, .. } = &self.models[key];
        let candidates = &self.config.candidates;
        let plans: Vec<Plan> = valid_plans(model, gpus, g.gpus_per_node, Dimensions::of(supports.as_ref()))
            .into_iter()
            .filter(|p| supports.as_ref().is_none_or(|s| s.allows(p)) && !refused.contains(p))
            .filter(|p| candidates.plan(model, p))
            .filter(|p| self.estimator.fits(model, p, g.gpu_memory_gib).0)
            .collect();
        let plans = Rc::new(plans);
        self.spaces.insert((key, group, gpus), Rc::clone(&plans));
        plans
    }

    /// CPU cores per GPU the options of offloading plans offer on a group: half, all
    /// and twice the node's fair share, within the node (only the fair share when
    /// cores are not a decision).
    fn offload_cpu_levels(&self, group: &NodeGroup, max_per_node: u32) -> Vec<u32> {
        let fair = group.fair_cpus_per_gpu();
        if self.config.fair_cores_only {
            return vec![fair.min(group.cpu_cores / max_per_node.max(1)).max(1)];
        }
        let mut levels: Vec<u32> = [fair / 2, fair, fair * 2]
            .into_iter()
            .map(|l| l.max(self.config.base_cpus_per_gpu(group)))
            .filter(|l| l * max_per_node <= group.cpu_cores)
            .collect();
        levels.dedup();
        if levels.is_empty() {
            levels.push((group.cpu_cores / max_per_node.max(1)).max(1));
        }
        levels
    }

    /// Predicted samples per second of `plan` on `placement` of `group` with `cpus`
    /// cores. The CPU optimizer of offloading plans speeds up with cores beyond
    /// `cpu_reference` per GPU (those the model's profile was taken with:
    /// [`PlannerConfig::cpu_reference`]) and slows down below it.
    pub fn throughput(
        model: &ModelSpec,
        params: &Params,
        group: &NodeGroup,
        plan: &Plan,
        placement: &Placement,
        cpus: u32,
        cpu_reference: f64,
    ) -> f64 {
        let pred = Self::prediction(model, params, group, plan, placement);
        model.global_batch as f64 / iter_time_with_cpus(plan, &pred, cpus, cpu_reference).max(1e-12)
    }

    /// The performance model's prediction of `plan` on `placement` of `group` (its
    /// compute speed applied), before the CPU adjustment.
    pub fn prediction(
        model: &ModelSpec,
        params: &Params,
        group: &NodeGroup,
        plan: &Plan,
        placement: &Placement,
    ) -> Prediction {
        if (group.compute_speed - 1.0).abs() > 1e-12 {
            let mut p = params.clone();
            p.values[idx::COMPUTE] /= group.compute_speed;
            predict(model, plan, placement, &Links::from(group), &p)
        } else {
            predict(model, plan, placement, &Links::from(group), params)
        }
    }

    /// How the prediction of `plan` on `placement` rests on the job's measurements, and
    /// the half-width of its ~95 % interval in log throughput (0 for a measured
    /// configuration, or without a covariance); `None` when the job's model says
    /// nothing of its evidence.
    pub fn uncertainty(
        &self,
        input: &JobInput,
        group: usize,
        plan: &Plan,
        placement: &Placement,
    ) -> Option<(Support, f64)> {
        let links = Links::from(&self.cluster.node_groups[group]);
        input.belief.uncertainty(&input.job.model, &links, plan, placement)
    }

    /// The best allowed plan of a model on a concrete placement with `cpus` cores.
    pub fn best_plan(
        &mut self,
        job: &Job,
        params: &Params,
        group: usize,
        placement: &Placement,
        cpus: u32,
        restriction: Restriction,
    ) -> Option<(Plan, f64)> {
        self.best_plan_by(job, params, None, group, placement, cpus, restriction, None)
    }

    /// [`Evaluator::best_plan`] of a job with its evidence: measured configurations at
    /// their measured throughput.
    pub fn best_plan_of(
        &mut self,
        input: &JobInput,
        group: usize,
        placement: &Placement,
        cpus: u32,
        restriction: Restriction,
    ) -> Option<(Plan, f64)> {
        let Belief { params, evidence } = &input.belief;
        self.best_plan_by(&input.job, params, evidence.as_ref(), group, placement, cpus, restriction, None)
    }

    /// The throughput the planner believes of a job's `plan` on `placement` of `group`
    /// with `cpus` cores: predicted, or measured where it was ([`believed`]).
    pub fn believed_throughput(
        &self,
        input: &JobInput,
        group: usize,
        plan: &Plan,
        placement: &Placement,
        cpus: u32,
    ) -> f64 {
        let key = self.known_model(&input.job, &input.belief.params, input.belief.evidence.as_ref());
        self.believed_keyed(key, input, group, plan, placement, cpus)
    }

    /// [`Evaluator::believed_throughput`] of a job whose model's cache key is known
    /// (`None`: not cached).
    fn believed_keyed(
        &self,
        key: Option<usize>,
        input: &JobInput,
        group: usize,
        plan: &Plan,
        placement: &Placement,
        cpus: u32,
    ) -> f64 {
        let cache_key = key.map(|k| (k, group, *plan, placement.clone(), cpus));
        if let Some(hit) = cache_key.as_ref().and_then(|k| self.believed.borrow().get(k).copied()) {
            return hit;
        }
        let g = &self.cluster.node_groups[group];
        let cpu_ref = self.config.cpu_reference(g);
        let thr = Self::throughput(&input.job.model, &input.belief.params, g, plan, placement, cpus, cpu_ref);
        let thr = believed(input.belief.evidence.as_deref(), plan, placement, thr);
        if let Some(k) = cache_key {
            self.believed.borrow_mut().insert(k, thr);
        }
        thr
    }

    /// The allowed plan of a job on a concrete placement with `cpus` cores whose
    /// throughput at the low end of its ~95 % interval is highest (as the decision
    /// values a change), with its predicted throughput.
    fn best_plan_at_low_end(
        &mut self,
        input: &JobInput,
        group: usize,
        placement: &Placement,
        cpus: u32,
        restriction: Restriction,
    ) -> Option<(Plan, f64)> {
        let Belief { params, evidence } = &input.belief;
        self.best_plan_by(&input.job, params, evidence.as_ref(), group, placement, cpus, restriction, Some(input))
    }

    /// The allowed plan of highest believed throughput, or of the highest low end of
    /// its interval when `low_end` gives the job, with its believed throughput; cached.
    #[allow(clippy::too_many_arguments)]
    fn best_plan_by(
        &mut self,
        job: &Job,
        params: &Params,
        evidence: Option<&Arc<Evidence>>,
        group: usize,
        placement: &Placement,
        cpus: u32,
        restriction: Restriction,
        low_end: Option<&JobInput>,
    ) -> Option<(Plan, f64)> {
        let model = &job.model;
        let key = self.model_key(job, params, evidence);
        let cache_key = (key, group, placement.clone(), cpus, restriction, low_end.is_some());
        if let Some(&hit) = self.best.get(&cache_key) {
            return hit;
        }
        let space = self.space(key, group, placement.gpus());
        let g = &self.cluster.node_groups[group];
        let cpu_ref = self.config.cpu_reference(g);
        let mut best: Option<(Plan, f64, f64)> = None;
        let candidates = &self.config.candidates;
        for plan in space.iter().filter(|p| restriction.allows(p) && candidates.config(model, p, placement)) {
            let thr = believed(
                evidence.map(|e| &**e),
                plan,
                placement,
                Self::throughput(model, params, g, plan, placement, cpus, cpu_ref),
            );
            let s = match low_end {
                Some(input) => thr * (-self.uncertainty(input, group, plan, placement).map_or(0.0, |(_, h)| h)).exp(),
                None => thr,
            };
            if best.as_ref().is_none_or(|(_, _, b)| s > *b) {
                best = Some((*plan, thr, s));
            }
        }
        let out = best.map(|(plan, thr, _)| (plan, thr));
        self.best.insert(cache_key, out);
        out
    }

    /// GPU counts a job may get on a group: every count up to a node, then whole nodes.
    fn gpu_counts(&self, group: &NodeGroup, request_gpus: u32) -> Vec<u32> {
        let gpn = group.gpus_per_node;
        let max = group.total_gpus().min((request_gpus.saturating_mul(self.config.max_scale)).max(gpn));
        let mut counts: Vec<u32> = (1..=gpn.min(max)).collect();
        counts.extend((2..).map(|k| k * gpn).take_while(|&n| n <= max));
        counts
    }

    /// Every (resources, best plan) point of a model on a group, and which survive
    /// Pareto pruning; cached per model, group, restriction and size cap.
    fn raw_curve(
        &mut self,
        key: usize,
        group: usize,
        restriction: Restriction,
        request_gpus: u32,
    ) -> (u32, Rc<RawCurve>) {
        let g = self.cluster.node_groups[group].clone();
        let counts = match restriction {
            Restriction::Exact(plan) => vec![plan.gpus()],
            _ => self.gpu_counts(&g, request_gpus),
        };
        let cap = counts.last().copied().unwrap_or(0);
        let cache_key = (key, group, restriction);
        if let Some((computed, c)) = self.curves.get(&cache_key)
            && *computed >= cap
        {
            return (cap, Rc::clone(c));
        }
        let mut raw = Vec::new();
        for n in counts {
            if n > g.total_gpus() {
                continue;
            }
            let space = self.space(key, group, n);
            let ModelEntry { model, params, evidence, .. } = &self.models[key];
            let evidence = evidence.as_deref();
            let gpn = g.gpus_per_node;
            let mut shapes = Vec::new();
            if n <= gpn {
                shapes.extend(Placement::new(vec![n]));
                if self.cross_splits && n >= 2 && g.count >= 2 {
                    shapes.extend(Placement::new(vec![n.div_ceil(2), n / 2]));
                }
            } else {
                shapes.extend(Placement::packed(n, gpn));
            }
            for placement in shapes {
                let base_cpus = self.config.base_cpus_per_gpu(&g) * n;
                let cpu_ref = self.config.cpu_reference(&g);
                let levels = self.offload_cpu_levels(&g, placement.max_per_node());
                let mut best: Vec<Option<(Plan, f64, u32)>> = vec![None; 1 + levels.len()];
                let candidates = &self.config.candidates;
                let ok = |p: &Plan| candidates.config(model, p, &placement);
                for plan in space.iter().filter(|p| restriction.allows(p) && ok(p)) {
                    if plan.offload == Offload::None {
                        let thr = Self::throughput(model, params, &g, plan, &placement, base_cpus, cpu_ref);
                        let thr = believed(evidence, plan, &placement, thr);
                        if best[0].is_none_or(|(_, b, _)| thr > b) {
                            best[0] = Some((*plan, thr, base_cpus));
                        }
                    } else {
                        let pred = Self::prediction(model, params, &g, plan, &placement);
                        for (i, level) in levels.iter().enumerate() {
                            let cpus = level * n;
                            let t = iter_time_with_cpus(plan, &pred, cpus, cpu_ref);
                            let thr = believed(evidence, plan, &placement, model.global_batch as f64 / t.max(1e-12));
                            if best[i + 1].is_none_or(|(_, b, _)| thr > b) {
                                best[i + 1] = Some((*plan, thr, cpus));
                            }
                        }
                    }
                }
                for (plan, throughput, cpus) in best.into_iter().flatten() {
                    let mem = host_memory_gib(&self.config, &g, model, &plan);
                    // Every node's part of the cores and memory must fit a node.
                    let parts = placement.per_node();
                    let biggest = f64::from(parts[0]) / f64::from(n);
                    if (f64::from(cpus) * biggest).ceil() > f64::from(g.cpu_cores) || mem * biggest > g.host_memory_gib
                    {
                        continue;
                    }
                    raw.push(Raw { group, gpus: n, cpus, mem, placement: placement.clone(), plan, throughput });
                }
            }
        }
        raw.sort_by(|a, b| {
            (a.gpus, a.cpus)
                .cmp(&(b.gpus, b.cpus))
                .then(a.mem.total_cmp(&b.mem))
                .then(b.throughput.total_cmp(&a.throughput))
                .then(a.placement.cmp(&b.placement))
                .then(a.plan.cmp(&b.plan))
        });
        let keep = pareto(&raw, self.config.min_gain);
        let entry = Rc::new((raw, keep));
        self.curves.insert(cache_key, (cap, Rc::clone(&entry)));
        (cap, entry)
    }

    /// The job's own request as a configuration: its plan (or the best one) on its GPUs
    /// packed onto the first group that can hold them, with its cores.
    fn request_config(&mut self, key: usize, input: &JobInput) -> Option<RequestConfig> {
        let job = &input.job;
        let r = &job.request;
        let cache_key = (key, r.gpus, r.cpus, r.plan, r.gpu_type.clone());
        if let Some(hit) = self.requests.get(&cache_key) {
            return hit.clone();
        }
        let out = self.request_config_uncached(key, input);
        self.requests.insert(cache_key, out.clone());
        out
    }

    fn request_config_uncached(&mut self, key: usize, input: &JobInput) -> Option<RequestConfig> {
        let job = &input.job;
        let (group, g) = eligible_groups(job, self.cluster)
            .find(|(_, g)| g.total_gpus() >= job.request.gpus)
            .or_else(|| eligible_groups(job, self.cluster).next())?;
        let g = g.clone();
        let gpus = job.request.gpus.min(g.total_gpus());
        let placement = Placement::packed(gpus, g.gpus_per_node)?;
        let fair = g.fair_cpus_per_gpu();
        let cpus = job.request.cpus.unwrap_or(fair * gpus);
        let plan = match job.request.plan {
            Some(PlanRequest::Exact(p)) if p.gpus() == gpus => Some(p),
            Some(PlanRequest::Code(code)) => resolve_code(&code, &job.model, gpus, g.gpu_memory_gib, &self.estimator),
            _ => None,
        };
        match plan {
            Some(plan) => {
                let throughput = self.believed_keyed(Some(key), input, group, &plan, &placement, cpus);
                Some(RequestConfig { group, plan: Some(plan), placement, cpus, throughput })
            }
            None => self
                .best_plan_of(input, group, &placement, cpus, Restriction::Any)
                .map(|(_, throughput)| RequestConfig { group, plan: None, placement, cpus, throughput }),
        }
    }

    /// A job's candidates and, when `points` is set, every curve point for display.
    pub fn job_curves(&mut self, input: &JobInput, mut points: Option<&mut Vec<CurvePoint>>) -> JobCurves {
        let job = &input.job;
        let config = self.config.clone();
        let key = self.model_key(job, &input.belief.params, input.belief.evidence.as_ref());
        let restriction = input.restriction();
        let locked = input.in_cooldown(&config) && input.current.is_some();
        let weight = input.weight(&config);
        let mut candidates = Vec::new();
        let groups: Vec<usize> = eligible_groups(job, self.cluster).map(|(i, _)| i).collect();
        if !locked || points.is_some() {
            for group in groups {
                let (cap, curve) = self.raw_curve(key, group, restriction, job.request.gpus);
                let (raw, keep) = &*curve;
                // Fixed GPU counts: the request's, or the nearest count with a plan.
                let fixed = config.fixed_gpus.then(|| {
                    let want = job.request.gpus.min(cap);
                    raw.iter().map(|r| r.gpus).min_by_key(|&g| (g.abs_diff(want), g)).unwrap_or(want)
                });
                for (r, &pareto) in
                    raw.iter().zip(keep).filter(|(r, _)| r.gpus <= cap && fixed.is_none_or(|g| r.gpus == g))
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
                    if k && !locked {
                        candidates.push(Candidate {
                            group: r.group,
                            gpus: r.gpus,
                            cpus: r.cpus,
                            host_memory_gib: r.mem,
                            placement: r.placement.clone(),
                            plan: r.plan,
                            throughput: r.throughput,
                            normalized: 0.0,
                            value: 0.0,
                            is_current: false,
                            is_request: false,
                            meets_guarantee: false,
                        });
                    }
                }
            }
        }
        // Growth of a running job: at most `max_growth` times its GPUs in one round;
        // once its restarts are spent, it never shrinks.
        if let (Some(cur), Some(k)) = (&input.current, config.max_growth) {
            let cap = cur.placement.gpus().saturating_mul(k.max(1));
            candidates.retain(|c| c.gpus <= cap);
        }
        let spent = input.restarts_spent(&config);
        if let (Some(cur), true) = (&input.current, spent) {
            candidates.retain(|c| c.gpus >= cur.placement.gpus());
        }
        let mut current_thr = None;
        if let Some(cur) = &input.current {
            let thr = self.believed_keyed(Some(key), input, cur.group, &cur.plan, &cur.placement, cur.cpus);
            current_thr = Some(thr);
            // The same configuration found by the curve is the current one.
            candidates.retain(|c| {
                !(c.group == cur.group && c.plan == cur.plan && c.placement == cur.placement && c.cpus == cur.cpus)
            });
            candidates.push(Candidate {
                group: cur.group,
                gpus: cur.placement.gpus(),
                cpus: cur.cpus,
                host_memory_gib: cur.host_memory_gib,
                placement: cur.placement.clone(),
                plan: cur.plan,
                throughput: thr,
                normalized: 0.0,
                value: 0.0,
                is_current: true,
                is_request: false,
                meets_guarantee: false,
            });
            // A re-plan on the resources it holds, the plan valued as a change is (at
            // the low end of its interval): the curve's points have the group's base
            // cores, which a running job may not hold, and its best predicted plans.
            if !locked
                && let Some((plan, throughput)) =
                    self.best_plan_at_low_end(input, cur.group, &cur.placement, cur.cpus, restriction)
            {
                let same = |c: &Candidate| {
                    c.group == cur.group && c.placement == cur.placement && c.cpus == cur.cpus && c.plan == plan
                };
                if plan != cur.plan && !candidates.iter().any(same) {
                    let g = &self.cluster.node_groups[cur.group];
                    candidates.push(Candidate {
                        group: cur.group,
                        gpus: cur.placement.gpus(),
                        cpus: cur.cpus,
                        host_memory_gib: host_memory_gib(&config, g, &job.model, &plan),
                        placement: cur.placement.clone(),
                        plan,
                        throughput,
                        normalized: 0.0,
                        value: 0.0,
                        is_current: false,
                        is_request: false,
                        meets_guarantee: false,
                    });
                }
            }
        }
        let request = self.request_config(key, input);
        // A guaranteed job may always run exactly as it asked (when its plan fits and
        // its checkpoints allow it): that configuration meets the guarantee whatever
        // the model's error.
        if let (true, false, Some(RequestConfig { group, plan: Some(plan), placement, cpus, throughput: thr })) =
            (job.guaranteed, locked, &request)
        {
            let g = &self.cluster.node_groups[*group];
            let mem = host_memory_gib(&config, g, &job.model, plan);
            let share = f64::from(placement.max_per_node()) / f64::from(placement.gpus().max(1));
            let fits_node = f64::from(*cpus) * share <= f64::from(g.cpu_cores) && mem * share <= g.host_memory_gib;
            if restriction.allows(plan)
                && job.can_run(plan)
                && fits_node
                && self.estimator.fits(&job.model, plan, g.gpu_memory_gib).0
            {
                let same = |c: &Candidate| {
                    c.group == *group && c.plan == *plan && c.placement == *placement && c.cpus == *cpus
                };
                match candidates.iter_mut().find(|c| same(c)) {
                    Some(c) => c.is_request = true,
                    None => candidates.push(Candidate {
                        group: *group,
                        gpus: placement.gpus(),
                        cpus: *cpus,
                        host_memory_gib: mem,
                        placement: placement.clone(),
                        plan: *plan,
                        throughput: *thr,
                        normalized: 0.0,
                        value: 0.0,
                        is_current: false,
                        is_request: true,
                        meets_guarantee: true,
                    }),
                }
            }
        }
        let request_layout = request.as_ref().and_then(|r| r.plan).map(|p| Restriction::layout_of(&p));
        let request_throughput = request
            .map(|r| r.throughput)
            .filter(|t| t.is_finite() && *t > 0.0)
            .or_else(|| candidates.iter().map(|c| c.throughput).reduce(f64::max))
            .unwrap_or(1.0);
        // GPUs beyond the request must each buy their share of the request's throughput
        // per GPU, at least `scale_out_efficiency` of it.
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
                    scaled_out =
                        Some(ScaledOut { gpus: c.gpus, normalized: c.throughput / request_throughput, needed });
                }
                keep
            });
        }
        // A running job is never shrunk below its request's throughput (or what it
        // has, when that is less) nor paused, unless a guarantee needs its resources
        // (`CurveBook::soften_locks`): what it holds beyond is lent, and taken back
        // first. Past its service quantum it is held no longer.
        let keeps = config.keep_request && current_thr.is_some() && !input.past_quantum(&config);
        if let Some(thr) = current_thr.filter(|_| keeps) {
            let floor = thr.min(request_throughput) * (1.0 - 1e-9);
            candidates.retain(|c| c.is_current || c.throughput >= floor);
        }
        // A restart pays off over the horizon or the job's remaining time, whichever
        // is shorter: progress lost is restart_s of the new throughput.
        // With the restart factor (hysteresis growing with the job's restarts), a change
        // must also gain 1 / factor.
        let factor = input.restart_factor(&config);
        let payback = current_thr.map(|thr| {
            let remaining = input.progress.remaining_iterations() * job.model.global_batch as f64 / thr.max(1e-12);
            let horizon = config.horizon_s.min(remaining).max(1e-9);
            (1.0 - input.restart_s(&config) / horizon).max(0.0)
        });
        let keep_share = payback.map(|p| p * factor);
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
        // A guaranteed job keeps only configurations that meet its guarantee. When
        // guaranteed jobs queue and none can (its request does not fit, the margin is
        // out of reach), it is admitted best-effort rather than never.
        let guaranteed = job.guaranteed && (!config.queue_guaranteed || candidates.iter().any(|c| c.meets_guarantee));
        if guaranteed {
            candidates.retain(|c| c.meets_guarantee);
        }
        candidates.sort_by(|a, b| {
            (a.group, a.gpus, a.cpus)
                .cmp(&(b.group, b.gpus, b.cpus))
                .then(a.host_memory_gib.total_cmp(&b.host_memory_gib))
                .then(b.is_current.cmp(&a.is_current))
                .then(a.placement.cmp(&b.placement))
                .then(a.plan.cmp(&b.plan))
        });
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
            weight,
            candidates,
            current,
        }
    }
}

/// Which points survive: a point is dropped when another point of the same group with
/// no more GPUs, cores and memory reaches at least `1 / (1 + min_gain)` of its
/// throughput. `raw` is sorted by resources, so dominating points come first.
fn pareto(raw: &[Raw], min_gain: f64) -> Vec<bool> {
    let mut keep = vec![false; raw.len()];
    for (i, r) in raw.iter().enumerate() {
        let dominated = raw[..i].iter().zip(&keep).any(|(d, &k)| {
            k && d.group == r.group
                && d.gpus <= r.gpus
                && d.cpus <= r.cpus
                && d.mem <= r.mem + 1e-9
                && r.throughput <= d.throughput * (1.0 + min_gain)
        });
        keep[i] = !dominated;
    }
    keep
}

/// Candidates of every job of a round.
pub fn build(cluster: &Cluster, config: &PlannerConfig, inputs: &[JobInput]) -> CurveBook {
    let mut evaluator = Evaluator::new(cluster, config);
    let jobs = inputs.iter().map(|i| evaluator.job_curves(i, None)).collect();
    CurveBook::new(jobs, cluster)
}
