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
use rubick_model::perfmodel::{Links, Params};
use rubick_model::space::resolve_code;

use rubick_model::belief::{Belief, Evidence, Support, believed};
use rubick_model::throughput;

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
        let thr = throughput::samples_per_s(&input.job.model, &input.belief.params, g, plan, placement, cpus, cpu_ref);
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
                throughput::samples_per_s(model, params, g, plan, placement, cpus, cpu_ref),
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
}

/// Candidates of every job of a round.
pub fn build(cluster: &Cluster, config: &PlannerConfig, inputs: &[JobInput]) -> CurveBook {
    let mut evaluator = Evaluator::new(cluster, config);
    let jobs = inputs.iter().map(|i| evaluator.job_curves(i, None)).collect();
    CurveBook::new(jobs, cluster)
}

mod job;
mod raw;
#[cfg(test)]
mod tests;
