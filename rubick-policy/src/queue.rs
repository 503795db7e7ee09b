//! The queue family: the user's plan on the user's GPUs, never reconfigured, placed by
//! a node allocator in queue order. The policies differ in what happens when the head
//! of the queue does not fit and in how they hand out CPU cores.

use rubick_core::Placement;
use rubick_planner::curves::{Evaluator, host_memory_gib};
use rubick_planner::place::{NodeState, layout, nodes_of, split, take};
use rubick_planner::{Current, JobInput, eligible_groups};

use super::{PolicyOptions, Queue, View, request_placement, users_plan};

/// How a queue policy hands out cores (per GPU),
/// given the job's plan and placement on a group, and the group's fair share per GPU.
pub(super) type CoreRule = fn(&Evaluator<'_>, &JobInput, &rubick_core::Plan, (usize, &Placement), u32) -> Vec<u32>;

/// A node allocator in queue order.
pub(super) struct QueuePolicy<'a> {
    pub queue: Queue,
    /// Later jobs start when the head does not fit.
    pub backfill: bool,
    /// Guaranteed jobs first, preempting best-effort ones (latest started first).
    pub guaranteed_first: bool,
    /// The core counts to try, in order (the request's by default).
    pub cores: CoreRule,
    /// Synergy-TUNE's peer adjustment: a job that fits at none of its core counts
    /// takes cores from running jobs above the fair share on its group, each brought
    /// down to the fair share (restarted with it).
    pub tune: bool,
    /// For jobs without a usable plan of their own: the best plan on their GPUs.
    pub evaluator: Evaluator<'a>,
}

impl<'a> QueuePolicy<'a> {
    pub fn new(cluster: &'a rubick_core::Cluster, options: &PolicyOptions) -> Self {
        QueuePolicy {
            queue: options.queue,
            backfill: true,
            guaranteed_first: false,
            cores: requested_cores,
            tune: false,
            evaluator: Evaluator::new(cluster, &options.planner),
        }
    }
}

/// The cores the job asked for (the node's fair share per GPU when it did not say).
pub(super) fn requested_cores(
    _evaluator: &Evaluator<'_>,
    job: &JobInput,
    _plan: &rubick_core::Plan,
    (_, placement): (usize, &Placement),
    fair: u32,
) -> Vec<u32> {
    vec![job.job.request.cpus.unwrap_or(fair * placement.gpus())]
}

/// Places `per_node` (decreasing) best-fit on the nodes of `group`, with `cpus` and
/// `mem` split by GPUs; `None` when it does not fit.
fn place_shape(
    nodes: &mut [NodeState],
    group: usize,
    per_node: &[u32],
    cpus: u32,
    mem: f64,
) -> Option<Vec<(u32, Vec<u32>)>> {
    let parts = layout(nodes, group, per_node, cpus, mem, &[])?;
    Some(parts.into_iter().map(|(node, g, c, m)| (nodes[node].index, take(nodes, node, g, c, m, None).gpus)).collect())
}

/// The job's allocation: `plan` on `placement` of `group`, on `nodes` with `cpus`.
fn on_nodes(
    group: usize,
    plan: rubick_core::Plan,
    placement: &Placement,
    nodes: Vec<(u32, Vec<u32>)>,
    cpus: u32,
    host_memory_gib: f64,
) -> Current {
    Current { group, plan, placement: placement.clone(), nodes, cpus, host_memory_gib, rounds_since_change: 0 }
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

/// Sorts `ids` (indices into `jobs`) in queue order; ties by submission, then index.
pub(super) fn queue_order(ids: &mut [usize], jobs: &[JobInput], queue: Queue) {
    ids.sort_by(|&a, &b| {
        let key = |j: usize| match queue {
            Queue::Fifo => jobs[j].job.submit_time_s,
            Queue::Las | Queue::Service => jobs[j].progress.attained_gpu_s,
            Queue::Srpt => jobs[j].progress.remaining_work,
        };
        key(a).total_cmp(&key(b)).then(jobs[a].job.submit_time_s.total_cmp(&jobs[b].job.submit_time_s)).then(a.cmp(&b))
    });
}

/// Synergy-TUNE (`simulator/resources/cluster.py`, `_tune` and `_reallocate_peer`):
/// the job at the fair share, room made by bringing running jobs of `group` that
/// hold more than the fair share of cores down to it, single-node jobs first, the
/// most cores per GPU first, until it fits. `None` (and nothing changed): it does not.
fn tune_peers(
    jobs: &[JobInput],
    out: &mut [Option<Current>],
    nodes: &mut Vec<NodeState>,
    (cluster, group): (&rubick_core::Cluster, usize),
    (plan, placement, mem, cpus): (rubick_core::Plan, &Placement, f64, u32),
) -> Option<Current> {
    let fair = cluster.node_groups[group].fair_cpus_per_gpu();
    let mut peers: Vec<usize> = (0..out.len())
        .filter(|&k| out[k].as_ref().is_some_and(|c| c.group == group && c.cpus > fair * c.placement.gpus()))
        .collect();
    peers.sort_by(|&a, &b| {
        let key = |k: usize| {
            let c = out[k]
                .as_ref()
                .map_or((0, 0.0), |c| (c.nodes.len(), f64::from(c.cpus) / f64::from(c.placement.gpus().max(1))));
            (c.0, -c.1)
        };
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0)
            .then(ka.1.total_cmp(&kb.1))
            .then(jobs[a].job.submit_time_s.total_cmp(&jobs[b].job.submit_time_s))
            .then(a.cmp(&b))
    });
    let before: Vec<Option<Current>> = out.to_vec();
    for k in peers {
        if let Some(c) = out[k].as_mut() {
            c.cpus = fair * c.placement.gpus();
        }
        *nodes = occupied(cluster, out);
        if let Some(ix) = place_shape(nodes, group, placement.per_node(), cpus, mem) {
            return Some(on_nodes(group, plan, placement, ix, cpus, mem));
        }
    }
    out.clone_from_slice(&before);
    *nodes = occupied(cluster, out);
    None
}

fn occupied(cluster: &rubick_core::Cluster, out: &[Option<Current>]) -> Vec<NodeState> {
    let mut nodes = nodes_of(cluster);
    for c in out.iter().flatten() {
        occupy(&mut nodes, c);
    }
    nodes
}

impl super::Policy for QueuePolicy<'_> {
    fn reconfigures(&self) -> bool {
        false
    }

    fn decide(&mut self, view: &View<'_>, _round: u64) -> Vec<Option<Current>> {
        let View { cluster, jobs, configs, .. } = *view;
        let evaluator = &mut self.evaluator;
        let mut out: Vec<Option<Current>> = jobs.iter().map(|j| j.current.clone()).collect();
        let mut nodes = occupied(cluster, &out);
        let mut waiting: Vec<usize> = (0..jobs.len()).filter(|&j| jobs[j].current.is_none()).collect();
        queue_order(&mut waiting, jobs, self.queue);
        if self.guaranteed_first {
            // Guaranteed jobs first (stable: queue order within each class).
            waiting.sort_by_key(|&j| !jobs[j].job.guaranteed);
        }
        for j in waiting {
            let pj = &jobs[j];
            let job = &pj.job;
            // The first group of its GPU type where its request fits now; a guaranteed
            // job that fits none preempts on the first where its request resolves.
            let mut placed = None;
            let mut first: Option<(usize, rubick_core::Plan, Placement, f64, u32)> = None;
            for (group, g) in eligible_groups(job, cluster) {
                let fair = g.fair_cpus_per_gpu();
                let placement = request_placement(job, pj.trace_code, (cluster, group), configs);
                let requested_cpus = job.request.cpus.unwrap_or(fair * job.request.gpus);
                // The user's plan (the trace's code as measured when our model of the job
                // rejects it; the best plan on the requested GPUs when there is none).
                let plan = placement.as_ref().and_then(|p| {
                    users_plan(job, &pj.belief.params, pj.trace_code, evaluator, (group, p), requested_cpus)
                });
                let (Some(plan), Some(placement)) = (plan, placement) else { continue };
                let mem = host_memory_gib(&evaluator.config, g, &job.model, &plan);
                for cpus in (self.cores)(evaluator, pj, &plan, (group, &placement), fair) {
                    if let Some(ix) = place_shape(&mut nodes, group, placement.per_node(), cpus, mem) {
                        placed = Some(on_nodes(group, plan, &placement, ix, cpus, mem));
                        break;
                    }
                }
                if placed.is_some() {
                    break;
                }
                tracing::trace!("{}: {plan} on {placement} of group {group} does not fit now", job.name);
                first.get_or_insert((group, plan, placement, mem, requested_cpus));
            }
            if placed.is_none() && first.is_none() {
                continue; // no plan of its own on any group
            }
            if let (None, true, Some((group, plan, placement, mem, _))) = (&placed, self.tune, &first) {
                // At the least of its core counts (its demand made fair).
                let fair = cluster.node_groups[*group].fair_cpus_per_gpu();
                let levels = (self.cores)(evaluator, pj, plan, (*group, placement), fair);
                let cpus = levels.iter().copied().min().unwrap_or(fair * placement.gpus());
                placed = tune_peers(jobs, &mut out, &mut nodes, (cluster, *group), (*plan, placement, *mem, cpus));
            }
            // A guaranteed job preempts best-effort jobs, latest started first.
            if let (None, true, true, Some((group, plan, placement, mem, cpus))) =
                (&placed, self.guaranteed_first, job.guaranteed, &first)
            {
                let before = out.clone();
                let mut victims: Vec<usize> =
                    (0..jobs.len()).filter(|&k| out[k].is_some() && !jobs[k].job.guaranteed).collect();
                victims.sort_by(|&a, &b| {
                    let start = |k: usize| jobs[k].progress.first_start_s.unwrap_or(f64::INFINITY);
                    start(b).total_cmp(&start(a)).then(b.cmp(&a))
                });
                for k in victims {
                    out[k] = None;
                    nodes = occupied(cluster, &out);
                    if let Some(ix) = place_shape(&mut nodes, *group, placement.per_node(), *cpus, *mem) {
                        placed = Some(on_nodes(*group, *plan, placement, ix, *cpus, *mem));
                        break;
                    }
                }
                if placed.is_none() {
                    // Preempting did not make room: restore.
                    out = before;
                    nodes = occupied(cluster, &out);
                }
            }
            match placed {
                Some(current) => out[j] = Some(current),
                None if !self.backfill => break,
                None => {}
            }
        }
        out
    }
}
