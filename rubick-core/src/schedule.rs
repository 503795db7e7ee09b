//! The `Schedule` artifact: the outcome of one scheduling round.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{ApiVersion, Artifact, Kind};
use crate::error::{ValidationError, ensure};
use crate::plan::Plan;

/// A `Schedule` artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Schedule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// Name of the cluster the schedule is for.
    pub cluster: String,
    /// Round number (0 for a one-off round).
    #[serde(default)]
    pub round: u64,
    /// Policy that produced it, e.g. `rubick` or `rubick-milp`.
    pub policy: String,
    pub assignments: Vec<Assignment>,
    pub totals: Totals,
    /// Value of the policy's objective.
    pub objective: f64,
    pub solver: SolverStats,
}

/// The decision for one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assignment {
    pub job: String,
    /// None when the job waits this round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeShare>,
    /// Predicted samples per second.
    pub predicted_throughput: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantee: Option<GuaranteeStatus>,
    pub change: Change,
    /// Rounds since the allocation last changed (0 when it changed this round).
    #[serde(default)]
    pub rounds_since_change: u32,
    /// Why the allocation is what it is, for humans.
    #[serde(default)]
    pub reason: String,
}

/// What a job receives on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeShare {
    pub node: String,
    /// GPU indices on the node.
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub host_memory_gib: f64,
}

/// The GPUs a job holds, node by node, in any order: the one comparison of where a job
/// runs, for a schedule's change rule (`Current::change_to`) and `rubick-run`'s
/// reconciliation alike. What is not known matches anything: a node's GPU indices
/// (`None`: a job's `current` names its nodes only), or the nodes themselves
/// ([`NodeSet::unknown`]: a `current` that names none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet<K>(Option<Vec<(K, Option<Vec<u32>>)>>);

impl<K: Ord> NodeSet<K> {
    /// Nodes not known.
    pub fn unknown() -> Self {
        NodeSet(None)
    }

    /// The set of `nodes`: (node, its GPU indices when known).
    pub fn new<'a>(nodes: impl IntoIterator<Item = (K, Option<&'a [u32]>)>) -> Self {
        let mut nodes: Vec<(K, Option<Vec<u32>>)> = nodes
            .into_iter()
            .map(|(node, gpus)| {
                let gpus = gpus.map(|g| {
                    let mut g = g.to_vec();
                    g.sort_unstable();
                    g
                });
                (node, gpus)
            })
            .collect();
        nodes.sort();
        NodeSet(Some(nodes))
    }

    /// Whether both hold the same GPUs of the same nodes, as far as both know.
    pub fn matches(&self, other: &Self) -> bool {
        let (Some(a), Some(b)) = (&self.0, &other.0) else { return true };
        a.len() == b.len() && a.iter().zip(b).all(|((i, g), (k, h))| i == k && (g.is_none() || h.is_none() || g == h))
    }
}

/// A guaranteed job's required and predicted throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GuaranteeStatus {
    /// Samples per second of the job's own request.
    pub required_throughput: f64,
    pub holds: bool,
}

/// How a job's allocation changed this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Not running, not started.
    Pending,
    /// Started this round.
    Started,
    /// Same plan and placement.
    Kept,
    /// Different GPU count.
    Resized,
    /// Same resources, different plan.
    Replanned,
    /// Same plan and GPU count on other nodes.
    Moved,
    /// Same plan and GPUs, other CPU cores.
    Recored,
    /// Was running, now waits.
    Preempted,
}

/// Resources used in all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Totals {
    pub gpus_used: u32,
    pub gpus_total: u32,
    pub cpus_used: u32,
    pub host_memory_gib_used: f64,
    /// Sum of the jobs' predicted throughput normalised by their requests.
    pub normalized_throughput: f64,
}

/// How the schedule was computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SolverStats {
    /// `heuristic` or `milp`.
    pub method: String,
    /// Relative optimality gap of a MILP solve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<f64>,
    /// Seconds the decision took; only recorded on request (`--record-time`), as it
    /// would make otherwise identical schedules differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// How the decision ended, e.g. `optimal`, `time-limit`, `fallback`.
    pub status: SolverStatus,
}

/// How an exact solve ended with a solution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExactStatus {
    /// Proved optimal (within the solver's gap tolerances).
    Optimal,
    /// The time limit stopped the search: the best solution found so far.
    TimeLimit,
    /// Stopped for another reason with a feasible solution.
    Stopped,
}

impl ExactStatus {
    /// The status as schedules write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ExactStatus::Optimal => "optimal",
            ExactStatus::TimeLimit => "time-limit",
            ExactStatus::Stopped => "stopped",
        }
    }
}

/// How a round's decision ended (a schedule's `solver.status`, written as the string
/// each variant names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(into = "String", from = "String")]
#[schemars(with = "String")]
pub enum SolverStatus {
    /// Rubick's heuristic decided (`heuristic`).
    Heuristic,
    /// The exact solver decided (`optimal`, `time-limit`, `stopped`).
    Exact(ExactStatus),
    /// The heuristic's choice beat the exact solver's, which ended so (`fallback: MILP
    /// optimal`, ...).
    HeuristicBeatExact(ExactStatus),
    /// The exact solver failed; the heuristic decided (`fallback`).
    Fallback,
    /// The heuristic missed a guarantee; the exact solver decided
    /// (`heuristic-missed-guarantee`).
    HeuristicMissedGuarantee,
    /// A queue policy gave the jobs their requests (`allocated`).
    Allocated,
    /// The exact solver found no solution and the allocations were kept: its message
    /// (any other string reads as this).
    Failed(String),
}

const FALLBACK_FROM: &str = "fallback: MILP ";

impl std::fmt::Display for SolverStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SolverStatus::Heuristic => f.write_str("heuristic"),
            SolverStatus::Exact(s) => f.write_str(s.as_str()),
            SolverStatus::HeuristicBeatExact(s) => write!(f, "{FALLBACK_FROM}{}", s.as_str()),
            SolverStatus::Fallback => f.write_str("fallback"),
            SolverStatus::HeuristicMissedGuarantee => f.write_str("heuristic-missed-guarantee"),
            SolverStatus::Allocated => f.write_str("allocated"),
            SolverStatus::Failed(why) => f.write_str(why),
        }
    }
}

impl From<SolverStatus> for String {
    fn from(status: SolverStatus) -> String {
        status.to_string()
    }
}

impl From<String> for SolverStatus {
    fn from(s: String) -> SolverStatus {
        const EXACT: [ExactStatus; 3] = [ExactStatus::Optimal, ExactStatus::TimeLimit, ExactStatus::Stopped];
        let exact = |s: &str| EXACT.into_iter().find(|e| e.as_str() == s);
        match s.as_str() {
            "heuristic" => SolverStatus::Heuristic,
            "fallback" => SolverStatus::Fallback,
            "heuristic-missed-guarantee" => SolverStatus::HeuristicMissedGuarantee,
            "allocated" => SolverStatus::Allocated,
            other => match (exact(other), other.strip_prefix(FALLBACK_FROM).and_then(exact)) {
                (Some(e), _) => SolverStatus::Exact(e),
                (None, Some(e)) => SolverStatus::HeuristicBeatExact(e),
                (None, None) => SolverStatus::Failed(s),
            },
        }
    }
}

impl Schedule {
    /// The one way a round's schedule is made: assignments are pushed in job order
    /// (each running one with its host memory and throughput normalised by its request)
    /// and totals summed from them.
    pub fn builder(cluster: &crate::Cluster, round: u64, policy: &str, solver: SolverStats) -> ScheduleBuilder {
        ScheduleBuilder {
            schedule: Schedule {
                api_version: Some(ApiVersion::CURRENT),
                kind: Some(Kind::Schedule),
                cluster: cluster.name.clone(),
                round,
                policy: policy.to_owned(),
                assignments: Vec::new(),
                totals: Totals {
                    gpus_used: 0,
                    gpus_total: cluster.total_gpus(),
                    cpus_used: 0,
                    host_memory_gib_used: 0.0,
                    normalized_throughput: 0.0,
                },
                objective: 0.0,
                solver,
            },
            host_memory_gib: Vec::new(),
            normalized: Vec::new(),
        }
    }
}

/// What a running job's assignment uses, for the totals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uses {
    pub gpus: u32,
    pub cpus: u32,
    /// GiB, unrounded.
    pub host_memory_gib: f64,
    /// Its throughput over its request's.
    pub normalized_throughput: f64,
}

/// A schedule being made (see [`Schedule::builder`]).
#[derive(Debug)]
pub struct ScheduleBuilder {
    schedule: Schedule,
    host_memory_gib: Vec<f64>,
    normalized: Vec<f64>,
}

impl Schedule {
    /// A job left out of the round after it was planned (its model unreadable, or what
    /// it requires missing here), `why`: it waits, and uses nothing, so the totals
    /// stand.
    pub fn leave_out(&mut self, job: String, why: &str) {
        self.assignments.push(Assignment {
            job,
            plan: None,
            nodes: Vec::new(),
            predicted_throughput: 0.0,
            guarantee: None,
            change: Change::Pending,
            rounds_since_change: 0,
            reason: format!("left out: {why}"),
        });
    }
}

impl ScheduleBuilder {
    /// The next job's assignment, with what it uses when it runs.
    pub fn push(&mut self, assignment: Assignment, uses: Option<Uses>) {
        if let Some(u) = uses {
            let totals = &mut self.schedule.totals;
            totals.gpus_used += u.gpus;
            totals.cpus_used += u.cpus;
            self.host_memory_gib.push(u.host_memory_gib);
            self.normalized.push(u.normalized_throughput);
        }
        self.schedule.assignments.push(assignment);
    }

    /// The schedule, its figures rounded to six decimals (the same on every platform).
    pub fn build(mut self, objective: f64) -> Schedule {
        let totals = &mut self.schedule.totals;
        // From +0.0 (an empty `sum` is -0.0, printed `-0.0`).
        let sum = |xs: &[f64]| xs.iter().fold(0.0, |a, b| a + b);
        totals.host_memory_gib_used = round6(sum(&self.host_memory_gib));
        totals.normalized_throughput = round6(sum(&self.normalized));
        self.schedule.objective = round6(objective);
        self.schedule
    }
}

/// Six significant decimals: plans print the same on every platform.
pub fn round6(x: f64) -> f64 {
    if x.is_finite() { (x * 1e6).round() / 1e6 } else { x }
}

impl Artifact for Schedule {
    crate::artifact_header!(Kind::Schedule);

    fn validate(&self) -> Result<(), ValidationError> {
        ensure(!self.policy.trim().is_empty(), "policy", || "must not be empty".into())?;
        // One pass (a set of names): a schedule of many jobs is checked in linear time.
        let mut seen = std::collections::HashSet::with_capacity(self.assignments.len());
        for (i, a) in self.assignments.iter().enumerate() {
            let field = format!("assignments[{i}]");
            crate::job::check_name(&a.job).map_err(|why| ValidationError::new(format!("{field}.job"), why))?;
            if !seen.insert(a.job.as_str()) {
                return Err(ValidationError::new(format!("{field}.job"), format!("`{}` is assigned twice", a.job)));
            }
            for (k, n) in a.nodes.iter().enumerate() {
                let at = format!("{field}.nodes[{k}]");
                ensure(n.cpus >= 1, &format!("{at}.cpus"), || "must be at least 1, got 0".into())?;
                crate::limits::check_real(n.host_memory_gib, 0.0, crate::limits::MAX_MEMORY_GIB, false)
                    .map_err(|why| ValidationError::new(format!("{at}.hostMemoryGib"), why))?;
            }
            if let Some(plan) = a.plan {
                let gpus: u32 = a.nodes.iter().map(|n| n.gpus.len() as u32).sum();
                ensure(gpus == plan.gpus(), &format!("{field}.nodes"), || {
                    format!("{gpus} GPUs on the nodes but plan `{plan}` needs {}", plan.gpus())
                })?;
            }
            ensure(
                a.predicted_throughput.is_finite() && a.predicted_throughput >= 0.0,
                &format!("{field}.predictedThroughput"),
                || format!("must be non-negative, got {}", a.predicted_throughput),
            )?;
        }
        Ok(())
    }
}
