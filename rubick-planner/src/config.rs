//! The knobs of a round ([`PlannerConfig`], [`ServiceQuantum`]) and which
//! configurations exist at all ([`CandidateFilter`]: the simulator's measured table, the
//! reference's plans).

use rubick_core::cluster::NodeGroup;
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;

/// Knobs of a round. Defaults follow the paper where it states one.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerConfig {
    /// More resources must buy at least this much more throughput (Pareto pruning).
    pub min_gain: f64,
    /// A change of a running job must raise the objective by at least this much
    /// (in units of one job's requested throughput).
    pub change_min_gain: f64,
    /// Rounds after a change during which a job's allocation is left alone.
    pub cooldown_rounds: u32,
    /// Seconds over which a restart must pay for itself (capped by the job's
    /// predicted remaining time).
    pub horizon_s: f64,
    /// Restart cost of jobs that declare none: checkpoint save + relaunch + warm-up.
    pub default_restart_s: f64,
    /// A pending job that has waited this long is admitted before younger ones, and
    /// counts double in the objective per this much waiting (up to 4x).
    pub starvation_s: f64,
    /// A job gets at most this many times its requested GPUs (at least one node).
    pub max_scale: u32,
    /// CPU cores per GPU a job always gets.
    pub min_cpus_per_gpu: u32,
    /// Host memory per GPU a job always gets (process, data loader, pinned buffers), GiB.
    pub host_gib_per_gpu: f64,
    /// Time of the round (seconds, the jobs' clock), for waiting times.
    pub now_s: f64,
    /// Which configurations may be offered at all (besides a job's request and current
    /// allocation): every one unless filters say otherwise (e.g. only the plan kinds a
    /// reference measured, [`ReferencePlans`], or only measured configurations).
    pub candidates: Candidates,
    /// Every job keeps the GPU count it asked for (plans and cores still change).
    pub fixed_gpus: bool,
    /// A configuration other than the job's own request meets a guarantee only when
    /// its predicted throughput beats the request's by this share (the model's error).
    pub guarantee_margin: f64,
    /// Besides the request itself, a guaranteed job only gets configurations with its
    /// requested plan's layout (TP, PP, ZeRO, offload; data parallelism, accumulation
    /// and checkpointing may change): where the model extrapolates least.
    pub guarantee_keeps_layout: bool,
    /// Cores are not a decision: every job gets the node's fair share of cores per GPU
    /// (a GPU-only scheduler's allocation, e.g. Pollux/Sia's elastic data parallelism).
    pub fair_cores_only: bool,
    /// A guaranteed job that is not running yet waits in the queue when its guarantee
    /// does not fit (admission control); once running, its guarantee holds. When false,
    /// every guaranteed job must run this round.
    pub queue_guaranteed: bool,
    /// CPU cores per GPU the jobs' performance models were profiled with (their CPU
    /// optimizer's time is scaled from it); `None`: each group's fair share.
    pub profiled_cpus_per_gpu: Option<u32>,
    /// Write the round's reasons (each assignment's `reason`, an explanation line per
    /// job); a simulation, which reads only the allocations, leaves them out.
    pub explain: bool,
    /// Hysteresis that grows with a job's restarts: every configuration of a running
    /// job but its current one is worth [`restart_factor`] of its value (Sia's and
    /// Pollux's rule), on top of the payback share and minimum gain. `false`: those two
    /// alone (the planner's earlier rule).
    pub restart_factor: bool,
    /// A running job gets at most this many times its present GPUs in one round (Sia
    /// and Pollux: 2); `None`: no cap.
    pub max_growth: Option<u32>,
    /// A running job restarted this many times is never shrunk or paused again (only a
    /// guarantee may still take its resources; it may still grow when that repays its
    /// restart): the Rubick artifact's cap of 5 shrinks per job. `None`: no cap.
    pub restart_cap: Option<u32>,
    /// Past the service quantum, a job's restart cap is one restart per doubling of
    /// the service it has received: `1 + floor(log2(service / quantum))` (the doubling
    /// trick: each restart is repaid by as much service as all before it), instead of
    /// [`Self::restart_cap`], which still holds below the quantum and without one. A
    /// fixed cap shields the long jobs once they have made way five times, so the
    /// short ones past a small quantum are the only jobs left to pause, again and again
    /// (`data/restarts-churn-and-peers.md`, the later windows); this one lets a job
    /// make way for others as often as its service has doubled.
    pub restart_cap_doubles: bool,
    /// A running job is never shrunk below its request's throughput (or below what it
    /// has, when that is less) nor paused, except for a guarantee: resources beyond a
    /// request are lent, and taken back first. Waiting jobs still gain weight by
    /// `starvation_s` (admitted first, and first to what is lent or freed), but no
    /// longer time-share by pausing running ones: `false` brings that back.
    pub keep_request: bool,
    /// The service quantum (GPU-seconds): `keep_request` protects a running job only
    /// until it has received this much service ([`Progress::attained_gpu_s`]); past
    /// it, the job may be shrunk onto another plan or paused for jobs that have not
    /// (least attained service, in two classes: Tiresias's discretised queues), and it
    /// no longer gains weight by waiting. A policy sets it each round from recent
    /// history ([`ServiceQuantum`], `rubick_policy`'s `service` queue); `None`: every
    /// running job keeps its request.
    pub service_quantum_gpu_s: Option<f64>,
    /// How the `service` queue sets [`Self::service_quantum_gpu_s`] each round.
    pub service_quantum: ServiceQuantum,
    /// Each GPU a job gets beyond its request must add at least this share of its
    /// request's throughput per GPU (0: any gain beyond `min_gain`). 0.5: the middle
    /// of the utilities Pollux's autoscaler keeps jobs at (`_min_util` 0.35 to
    /// `_max_util` 0.65, AdaptDL `policy/pollux.py`): a GPU that buys less than half of
    /// what the request's GPUs do is spent on the GPU-hours, not on the job.
    pub scale_out_efficiency: f64,
}

/// The service quantum of the `service` queue, from the service (GPU-seconds) of the
/// jobs finished in the last day.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceQuantum {
    /// The median job's: half the jobs finish within it.
    Median,
    /// The mean job's.
    Mean,
    /// The service-weighted median: half the service went to jobs that needed less.
    /// Past it are only the few jobs that hold most of the GPUs over time, whose
    /// restarts are repaid over their long runs.
    WeightedMedian,
    /// The median while the queue is oversubscribed (the waiting jobs ask for at least
    /// as many GPUs as the cluster has: they would not all start if every running job
    /// finished now), else the weighted median: mid-sized jobs make way only when the
    /// queue is too long for turnover to absorb.
    Load,
    /// Fixed, in GPU-seconds.
    Fixed(f64),
}

impl ServiceQuantum {
    /// The quantum of `services` (sorted ascending); `None` when empty (unless fixed).
    /// `oversubscribed`: whether the waiting jobs ask for as many GPUs as the cluster
    /// has ([`ServiceQuantum::Load`]).
    pub fn of(self, services: &[f64], oversubscribed: bool) -> Option<f64> {
        let n = services.len();
        match self {
            ServiceQuantum::Load if oversubscribed => ServiceQuantum::Median.of(services, true),
            ServiceQuantum::Load => ServiceQuantum::WeightedMedian.of(services, false),
            ServiceQuantum::Fixed(q) => Some(q),
            _ if n == 0 => None,
            ServiceQuantum::Median if n % 2 == 1 => Some(services[n / 2]),
            ServiceQuantum::Median => Some(0.5 * (services[n / 2 - 1] + services[n / 2])),
            ServiceQuantum::Mean => Some(services.iter().sum::<f64>() / n as f64),
            ServiceQuantum::WeightedMedian => {
                let total: f64 = services.iter().sum();
                let mut below = 0.0;
                services.iter().copied().find(|&s| {
                    below += s;
                    below >= 0.5 * total
                })
            }
        }
    }
}

/// A rule on which configurations the planner may offer.
pub trait CandidateFilter: Send + Sync + std::fmt::Debug {
    /// Whether `plan` may be offered to a job of `model` at all.
    fn plan(&self, model: &rubick_core::ModelSpec, plan: &Plan) -> bool {
        let _ = (model, plan);
        true
    }

    /// Whether `plan` on `placement` may be offered to a job of `model`.
    fn config(&self, model: &rubick_core::ModelSpec, plan: &Plan, placement: &Placement) -> bool {
        let _ = (model, plan, placement);
        true
    }

    /// The placements of `gpus` GPUs on which `plan` may be offered to a job of `model`,
    /// the most packed first (fewest nodes, then the placement's order), when the filter
    /// allows only a known list; `None`: it lists none (any placement may pass
    /// [`CandidateFilter::config`]).
    fn placements(&self, model: &rubick_core::ModelSpec, plan: &Plan, gpus: u32) -> Option<Vec<Placement>> {
        let _ = (model, plan, gpus);
        None
    }
}

/// The filters a configuration must pass (all of them; none: every one passes).
#[derive(Debug, Clone, Default)]
pub struct Candidates(Vec<std::sync::Arc<dyn CandidateFilter>>);

/// The same filters (the same objects, in the same order).
impl PartialEq for Candidates {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| std::sync::Arc::ptr_eq(a, b))
    }
}

impl Candidates {
    /// These filters and `filter`.
    #[must_use]
    pub fn and(mut self, filter: std::sync::Arc<dyn CandidateFilter>) -> Self {
        self.0.push(filter);
        self
    }

    /// Whether any filter applies.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether every filter lets `plan` be offered to a job of `model`.
    pub fn plan(&self, model: &rubick_core::ModelSpec, plan: &Plan) -> bool {
        self.0.iter().all(|f| f.plan(model, plan))
    }

    /// Whether every filter lets `plan` on `placement` be offered to a job of `model`.
    pub fn config(&self, model: &rubick_core::ModelSpec, plan: &Plan, placement: &Placement) -> bool {
        self.0.iter().all(|f| f.config(model, plan, placement))
    }
}

/// Only plans the authors' reference data has a kind of (see
/// [`rubick_core::plan::PlanCode::of`]): what a simulation replaying their measurements can
/// take the truth of.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferencePlans;

impl CandidateFilter for ReferencePlans {
    fn plan(&self, _model: &rubick_core::ModelSpec, plan: &Plan) -> bool {
        rubick_core::plan::PlanCode::of(plan).is_some()
    }
}

impl PlannerConfig {
    /// Cores per GPU every job gets on a group: the configured minimum, or the node's
    /// fair share when that is lower.
    pub fn base_cpus_per_gpu(&self, group: &NodeGroup) -> u32 {
        if self.fair_cores_only {
            return group.fair_cpus_per_gpu();
        }
        self.min_cpus_per_gpu.min(group.fair_cpus_per_gpu())
    }

    /// Cores per GPU at which predictions hold as fitted (see `profiled_cpus_per_gpu`).
    pub fn cpu_reference(&self, group: &NodeGroup) -> f64 {
        f64::from(self.profiled_cpus_per_gpu.unwrap_or_else(|| group.fair_cpus_per_gpu()))
    }

    /// Host memory per GPU every job gets on a group (GiB), likewise.
    pub fn base_host_gib_per_gpu(&self, group: &NodeGroup) -> f64 {
        self.host_gib_per_gpu.min(group.host_memory_gib / f64::from(group.gpus_per_node.max(1)))
    }
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            min_gain: 0.01,
            change_min_gain: 0.05,
            cooldown_rounds: 3,
            horizon_s: 3600.0,
            default_restart_s: 260.0,
            starvation_s: 3600.0,
            max_scale: 4,
            min_cpus_per_gpu: 4,
            host_gib_per_gpu: 16.0,
            now_s: 0.0,
            candidates: Candidates::default(),
            fixed_gpus: false,
            queue_guaranteed: false,
            guarantee_margin: 0.0,
            guarantee_keeps_layout: false,
            fair_cores_only: false,
            profiled_cpus_per_gpu: None,
            explain: true,
            restart_factor: true,
            max_growth: Some(2),
            restart_cap: Some(5),
            restart_cap_doubles: true,
            keep_request: true,
            service_quantum_gpu_s: None,
            service_quantum: ServiceQuantum::Load,
            scale_out_efficiency: 0.5,
        }
    }
}
