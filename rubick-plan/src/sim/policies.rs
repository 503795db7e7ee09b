//! The simulator's scheduling policies, behind one trait ([`Policy`]).
//!
//! Two families: the planner family (Rubick and its ablations, the elastic baseline)
//! decides through this project's planner (`plan_round_with`), and the queue family
//! (static, static-backfill, Synergy, AntMan) runs the user's plan on the user's GPUs
//! with a node allocator. Every policy sees the jobs as declared, their progress and
//! their fitted models: never the truth of their speed.

use std::collections::HashMap;
use std::time::Duration;

use rubick_core::Cluster;
use rubick_core::planner::curves::{Evaluator, host_memory_gib};
use rubick_core::planner::place::{NodeState, layout, nodes_of, split, take};
use rubick_core::planner::{Current, JobInput, PlannerConfig, Restriction, current_of_assignment};

use rubick_core::truth::MeasuredTable;

use super::{
    Alloc, Queue, SimConfig, SimJob, SimPolicy, State, request_placement, request_plan, traced_plan, users_plan,
};
use crate::round::{Policy as PlannerPolicy, plan_round_with};

/// What a policy sees at a decision.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub cluster: &'a Cluster,
    pub jobs: &'a [SimJob],
    pub state: &'a [State],
    /// Submitted, unfinished jobs (indices into `jobs`).
    pub active: &'a [usize],
    /// The simulated clock (seconds).
    pub now_s: f64,
    /// Which configurations the reference measured (not their times): where a static
    /// job's requested plan ran.
    pub measured: &'a MeasuredTable,
}

/// A scheduling policy of the simulator.
pub(super) trait Policy {
    /// Whether the policy reconfigures running jobs: the simulator then also asks it
    /// again when cooldowns end, not only on arrivals and completions.
    fn reconfigures(&self) -> bool;

    /// One decision: an allocation, or none, for every active job (in `view.active`'s
    /// order). A job whose allocation is unchanged keeps running; any other change
    /// costs it the restart penalty. `round` counts decisions.
    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Alloc>>;
}

/// The policy `config.policy` names, deciding with `planner` (the simulation's
/// planner knobs).
pub(super) fn build<'a>(cluster: &'a Cluster, config: &SimConfig, planner: &PlannerConfig) -> Box<dyn Policy + 'a> {
    let mut planner = planner.clone();
    match config.policy {
        SimPolicy::Static | SimPolicy::StaticBackfill | SimPolicy::Synergy | SimPolicy::Antman => {
            Box::new(QueuePolicy {
                kind: config.policy,
                queue: config.queue,
                evaluator: Evaluator::new(cluster, &planner),
            })
        }
        SimPolicy::Rubick
        | SimPolicy::RubickMilp
        | SimPolicy::Elastic
        | SimPolicy::RubickNoPlan
        | SimPolicy::RubickNoResize => {
            planner.fixed_gpus |= config.policy == SimPolicy::RubickNoResize;
            planner.fair_cores_only |= config.policy == SimPolicy::Elastic;
            Box::new(PlannerFamily {
                queue: config.queue,
                keep_layout: matches!(config.policy, SimPolicy::Elastic | SimPolicy::RubickNoPlan),
                exact: config.policy == SimPolicy::RubickMilp,
                milp_time_limit: config.milp_time_limit,
                evaluator: Evaluator::new(cluster, &planner),
            })
        }
    }
}

/// Places `per_node` (decreasing) best-fit on the nodes of group 0, with `cpus` and
/// `mem` split by GPUs; `None` when it does not fit.
fn place_shape(nodes: &mut [NodeState], per_node: &[u32], cpus: u32, mem: f64) -> Option<Vec<(u32, Vec<u32>)>> {
    let parts = layout(nodes, 0, per_node, cpus, mem, &[])?;
    Some(parts.into_iter().map(|(node, g, c, m)| (nodes[node].index, take(nodes, node, g, c, m, None).gpus)).collect())
}

/// Marks a running job's resources as used (cores and memory split as placement does).
fn occupy(nodes: &mut [NodeState], c: &Current) {
    let counts: Vec<u32> = c.nodes.iter().map(|(_, ix)| ix.len() as u32).collect();
    let total = counts.iter().sum::<u32>().max(1);
    for ((idx, ix), cores) in c.nodes.iter().zip(split(c.cpus, &counts)) {
        if let Some(n) = nodes.iter_mut().find(|n| n.group == c.group && n.index == *idx) {
            for &k in ix {
                if let Some(f) = n.gpu_free.get_mut(k as usize) {
                    *f = false;
                }
            }
            n.cpus_free = n.cpus_free.saturating_sub(cores);
            n.mem_free -= c.host_memory_gib * f64::from(ix.len() as u32) / f64::from(total);
        }
    }
}

/// The queue order of the waiting jobs `ids`.
fn queue_order(ids: &mut [usize], jobs: &[SimJob], state: &[State], queue: Queue) {
    ids.sort_by(|&a, &b| {
        let key = |j: usize| match queue {
            Queue::Fifo => jobs[j].job.submit_time_s,
            Queue::Las => state[j].gpu_s,
            Queue::Srpt => state[j].remaining_work(),
        };
        key(a).total_cmp(&key(b)).then(jobs[a].job.submit_time_s.total_cmp(&jobs[b].job.submit_time_s)).then(a.cmp(&b))
    });
}

/// The policies that run the user's plan on the user's GPUs: `static` (strict queue,
/// a plain batch system), `static-backfill` (later jobs start when the head does not
/// fit: Slurm's backfill without reservations), `synergy` (Mohan et al., OSDI 2022:
/// backfill; cores by the job's sensitivity to them) and `antman` (Xiao et al., OSDI
/// 2020: guaranteed jobs first, preempting best-effort ones; GPUs only).
struct QueuePolicy<'a> {
    kind: SimPolicy,
    queue: Queue,
    /// For jobs without a usable plan of their own: the best plan on their GPUs.
    evaluator: Evaluator<'a>,
}

impl Policy for QueuePolicy<'_> {
    fn reconfigures(&self) -> bool {
        false
    }

    fn decide(&mut self, view: &View<'_>, _round: u64) -> Vec<Option<Alloc>> {
        let View { cluster, jobs, state, active, measured, .. } = *view;
        let evaluator = &mut self.evaluator;
        let mut nodes = nodes_of(cluster);
        let mut out: Vec<Option<Alloc>> = active.iter().map(|&j| state[j].alloc.clone()).collect();
        for a in out.iter().flatten() {
            occupy(&mut nodes, &a.current);
        }
        let mut waiting: Vec<usize> = active.iter().copied().filter(|&j| state[j].alloc.is_none()).collect();
        queue_order(&mut waiting, jobs, state, self.queue);
        if self.kind == SimPolicy::Antman {
            // Guaranteed jobs first (stable: queue order within each class).
            waiting.sort_by_key(|&j| !jobs[j].job.guaranteed);
        }
        let g = &cluster.node_groups[0];
        let fair = g.fair_cpus_per_gpu();
        for j in waiting {
            let job = &jobs[j].job;
            let placement = request_placement(&jobs[j], cluster, Some(measured));
            let requested_cpus = job.request.cpus.unwrap_or(fair * job.request.gpus);
            // The user's plan (the trace's code as measured when our model of the job
            // rejects it; the best plan on the requested GPUs when there is none).
            let plan = placement.as_ref().and_then(|p| users_plan(&jobs[j], cluster, evaluator, p, requested_cpus));
            let (Some(plan), Some(placement)) = (plan, placement) else { continue };
            let mem = host_memory_gib(&evaluator.config, g, &job.model, &plan);
            let gpus = placement.gpus();
            // Cores: the request; Synergy gives the fewest cores per GPU within 1 % of the
            // best predicted throughput (sensitive jobs more, others less), else the most
            // it can place, down to the least (its fallback under contention: never the
            // request's own count unless that is one of its levels); AntMan manages GPUs
            // only (cores as requested, or whatever is left on the nodes).
            let core_options: Vec<u32> = match self.kind {
                SimPolicy::Synergy => {
                    let widest = placement.max_per_node().max(1);
                    let mut levels: Vec<u32> = [evaluator.config.base_cpus_per_gpu(g), fair, fair * 2]
                        .into_iter()
                        .filter(|l| l * widest <= g.cpu_cores)
                        .map(|l| l * gpus)
                        .collect();
                    levels.sort_unstable();
                    levels.dedup();
                    let cpu_ref = evaluator.config.cpu_reference(g);
                    let thr =
                        |c: u32| Evaluator::throughput(&job.model, &jobs[j].params, g, &plan, &placement, c, cpu_ref);
                    let best = levels.iter().map(|&c| thr(c)).fold(0.0, f64::max);
                    let (mut ok, rest): (Vec<u32>, Vec<u32>) = levels.into_iter().partition(|&c| thr(c) >= best * 0.99);
                    ok.truncate(1);
                    ok.extend(rest.into_iter().rev());
                    ok
                }
                SimPolicy::Antman => vec![requested_cpus, gpus],
                _ => vec![requested_cpus],
            };
            let on_nodes = |nodes: Vec<(u32, Vec<u32>)>, cpus: u32| Current {
                group: 0,
                plan,
                placement: placement.clone(),
                nodes,
                cpus,
                host_memory_gib: mem,
                rounds_since_change: 0,
            };
            let mut placed = None;
            for cpus in core_options {
                if let Some(ix) = place_shape(&mut nodes, placement.per_node(), cpus, mem) {
                    placed = Some(on_nodes(ix, cpus));
                    break;
                }
            }
            // AntMan: a guaranteed job preempts best-effort jobs, latest started first.
            if placed.is_none() && self.kind == SimPolicy::Antman && job.guaranteed {
                let before = out.clone();
                let mut victims: Vec<usize> =
                    (0..active.len()).filter(|&k| out[k].is_some() && !jobs[active[k]].job.guaranteed).collect();
                victims.sort_by(|&a, &b| {
                    let start = |k: usize| state[active[k]].first_start.unwrap_or(f64::INFINITY);
                    start(b).total_cmp(&start(a)).then(b.cmp(&a))
                });
                for k in victims {
                    out[k] = None;
                    nodes = nodes_of(cluster);
                    for a in out.iter().flatten() {
                        occupy(&mut nodes, &a.current);
                    }
                    if let Some(ix) = place_shape(&mut nodes, placement.per_node(), requested_cpus, mem) {
                        placed = Some(on_nodes(ix, requested_cpus));
                        break;
                    }
                }
                if placed.is_none() {
                    // Preempting did not make room: restore.
                    out = before;
                    nodes = nodes_of(cluster);
                    for a in out.iter().flatten() {
                        occupy(&mut nodes, &a.current);
                    }
                }
            }
            if placed.is_none() {
                tracing::trace!("{}: {plan} on {placement} does not fit now", job.name);
            }
            let k = active.iter().position(|&a| a == j).unwrap_or(0);
            match placed {
                Some(current) => out[k] = Some(Alloc { current }),
                None if self.kind == SimPolicy::Static => break,
                None => {}
            }
        }
        out
    }
}

/// The policies that decide through the planner: `rubick` (Rubick, MLSys 2025: plans
/// and resources together, the heuristic), `rubick-milp` (the exact MILP each round),
/// `elastic` (Pollux/Sia-style: the user's plan layout, GPU count adapts, cores follow
/// GPUs), and the ablations `rubick-no-plan` (the user's plan layout; GPUs, cores and
/// memory adapt) and `rubick-no-resize` (plans change, the GPU count does not). Queue
/// order becomes a weight in the objective.
struct PlannerFamily<'a> {
    queue: Queue,
    /// Plans keep the user's plan's layout (TP, PP, ZeRO, offload).
    keep_layout: bool,
    /// The MILP rather than the heuristic.
    exact: bool,
    milp_time_limit: Duration,
    /// Kept across decisions: curves are cached per model.
    evaluator: Evaluator<'a>,
}

impl Policy for PlannerFamily<'_> {
    fn reconfigures(&self) -> bool {
        true
    }

    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<Alloc>> {
        self.evaluator.config.now_s = view.now_s;
        let View { cluster, jobs, state, active, .. } = *view;
        let evaluator = &mut self.evaluator;
        // Queue order becomes weight: the head of the queue counts up to twice as much.
        let mut waiting: Vec<usize> = active.iter().copied().filter(|&j| state[j].alloc.is_none()).collect();
        queue_order(&mut waiting, jobs, state, self.queue);
        let rank: HashMap<usize, usize> = waiting.iter().enumerate().map(|(r, &j)| (j, r)).collect();
        let median_work = if self.queue == Queue::Srpt {
            let mut w: Vec<f64> = active.iter().map(|&j| state[j].remaining_work()).collect();
            w.sort_by(f64::total_cmp);
            w.get(w.len() / 2).copied().unwrap_or(1.0).max(1.0)
        } else {
            1.0 // unused: only srpt weighs by remaining work
        };
        let inputs: Vec<JobInput> = active
            .iter()
            .map(|&j| {
                let sj = &jobs[j];
                let mut job = sj.job.clone();
                job.iterations = state[j].remaining.ceil().max(1.0) as u64;
                let allowed = if self.keep_layout {
                    request_plan(&job, cluster).map_or(Restriction::Any, |p| Restriction::layout_of(&p))
                } else {
                    Restriction::Any
                };
                // A request the model's shape rejects is still what the user ran: the
                // planner's guarantee is its throughput.
                if job.request.plan.is_none() {
                    job.request.plan = traced_plan(sj, cluster).map(rubick_core::PlanRequest::Exact);
                }
                let priority = match self.queue {
                    // Shortest remaining work first: every job, running ones too, weighs
                    // by the median remaining work over its own (Smith's rule: the
                    // objective then counts the share of remaining work done per second),
                    // within 1/16..16.
                    Queue::Srpt => (median_work / state[j].remaining_work().max(1.0)).clamp(1.0 / 16.0, 16.0),
                    _ => rank.get(&j).map_or(1.0, |&r| 1.0 + (waiting.len() - r) as f64 / waiting.len().max(1) as f64),
                };
                JobInput {
                    job,
                    params: sj.params.clone(),
                    current: state[j].alloc.as_ref().map(|a| a.current.clone()),
                    allowed,
                    priority,
                }
            })
            .collect();
        let policy = if self.exact { PlannerPolicy::RubickMilp } else { PlannerPolicy::Rubick };
        match plan_round_with(evaluator, &inputs, policy, self.milp_time_limit, round) {
            Ok(r) => r
                .outcome
                .schedule
                .assignments
                .iter()
                .map(|a| current_of_assignment(a, cluster).ok().flatten().map(|current| Alloc { current }))
                .collect(),
            Err(e) => {
                tracing::debug!("round at {}: {e}; allocations kept", evaluator.config.now_s);
                active.iter().map(|&j| state[j].alloc.clone()).collect()
            }
        }
    }
}
