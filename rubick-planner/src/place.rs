//! Placement: the round's decision onto concrete nodes and GPU indices.
//!
//! Jobs whose allocation does not change stay exactly where they are. The others are
//! placed guaranteed first, then largest first: each part of a candidate's shape goes
//! to the node that fits it most tightly (preferring the job's current nodes), so a
//! tensor-parallel group never straddles nodes and a job spans nodes only when its
//! candidate does. When fragmentation leaves no room for the shape, the job is spread
//! over the nodes with the most free GPUs and its plan re-chosen for that placement;
//! failing that it takes a smaller candidate, or waits. No node is ever over-allocated.

use rubick_core::cluster::Cluster;
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;

use super::curves::{CurveBook, Evaluator};
use super::{Capacity, Current, JobInput, PlannerConfig, Restriction};

/// One node's free resources.
#[derive(Debug, Clone)]
pub struct NodeState {
    pub group: usize,
    /// Index within the group; the node is called `<group>-<index>` ([`NodeState::name`]).
    pub index: u32,
    /// `true` where the GPU is free.
    pub gpu_free: Vec<bool>,
    pub cpus_free: u32,
    pub mem_free: f64,
}

impl NodeState {
    /// The node's name: `<group>-<index>`, or its host name ([`rubick_core::cluster::NodeGroup::node_name`]).
    pub fn name(&self, cluster: &Cluster) -> String {
        cluster.node_groups[self.group].node_name(self.index)
    }

    pub fn free_gpus(&self) -> u32 {
        self.gpu_free.iter().filter(|&&f| f).count() as u32
    }
}

/// The nodes of a cluster, all free, group by group.
pub fn nodes_of(cluster: &Cluster) -> Vec<NodeState> {
    let mut nodes = Vec::new();
    for (gi, g) in cluster.node_groups.iter().enumerate() {
        for i in 0..g.count {
            nodes.push(NodeState {
                group: gi,
                index: i,
                gpu_free: vec![true; g.gpus_per_node as usize],
                cpus_free: g.cpu_cores,
                mem_free: g.host_memory_gib,
            });
        }
    }
    nodes
}

/// The nodes of each group by their free GPUs (`[group][free]`, node indices in
/// order), kept beside the node list while [`place`] takes from it: best fit and the
/// most-free-first spread read candidates in order instead of scanning every node.
/// Each set is a sorted vector: built in order at the cost of a push, and a node moves
/// between two sets by binary search (a few hundred indices at most per set).
struct ByFree {
    sets: Vec<Vec<Vec<usize>>>,
    /// Where each group's nodes start in the node list.
    offsets: Vec<usize>,
}

impl ByFree {
    fn of(nodes: &[NodeState]) -> Self {
        let groups = nodes.iter().map(|n| n.group + 1).max().unwrap_or(0);
        let mut sizes = vec![0; groups];
        let mut offsets = vec![usize::MAX; groups];
        for (i, n) in nodes.iter().enumerate() {
            sizes[n.group] = sizes[n.group].max(n.gpu_free.len());
            offsets[n.group] = offsets[n.group].min(i);
        }
        let mut sets: Vec<Vec<Vec<usize>>> = sizes.iter().map(|&s| vec![Vec::new(); s + 1]).collect();
        for (i, n) in nodes.iter().enumerate() {
            // In order: each set stays sorted.
            sets[n.group][n.free_gpus() as usize].push(i);
        }
        ByFree { sets, offsets }
    }

    /// The group's nodes with at least `least` free GPUs, fewest first (then in order).
    fn by_free(&self, group: usize, least: u32) -> impl Iterator<Item = usize> + '_ {
        self.sets.get(group).into_iter().flat_map(move |sets| sets.iter().skip(least as usize).flatten().copied())
    }

    /// The group's nodes with a free GPU, most free first (then in order).
    fn most_free_first(&self, group: usize) -> impl Iterator<Item = usize> + '_ {
        self.sets.get(group).into_iter().flat_map(|sets| sets.iter().skip(1).rev().flatten().copied())
    }

    /// The position of node `index` of `group` (nodes as [`nodes_of`] lists them).
    fn position(&self, nodes: &[NodeState], group: usize, index: u32) -> Option<usize> {
        let at = self.offsets.get(group)?.checked_add(index as usize)?;
        nodes.get(at).filter(|n| n.group == group && n.index == index).map(|_| at)
    }

    /// [`take`], keeping the index.
    fn take(
        &mut self,
        nodes: &mut [NodeState],
        node: usize,
        gpus: u32,
        cpus: u32,
        mem: f64,
        exact: Option<&[u32]>,
    ) -> Share {
        let before = nodes[node].free_gpus() as usize;
        let share = take(nodes, node, gpus, cpus, mem, exact);
        let after = nodes[node].free_gpus() as usize;
        if before != after {
            let sets = &mut self.sets[nodes[node].group];
            if let Ok(at) = sets[before].binary_search(&node) {
                sets[before].remove(at);
            }
            if let Err(at) = sets[after].binary_search(&node) {
                sets[after].insert(at, node);
            }
        }
        share
    }

    /// [`layout`]: best fit read from the index (the preferred nodes first).
    fn layout(
        &self,
        nodes: &[NodeState],
        group: usize,
        per_node: &[u32],
        cpus: u32,
        mem: f64,
        prefer: &[usize],
    ) -> Option<Vec<(usize, u32, u32, f64)>> {
        let total: u32 = per_node.iter().sum();
        let cpu_parts = split(cpus, per_node);
        let mut used: Vec<usize> = Vec::new();
        let mut out = Vec::new();
        for (part, &g) in per_node.iter().enumerate() {
            let c = cpu_parts[part];
            let m = mem * f64::from(g) / f64::from(total.max(1));
            let ok = |i: usize| {
                let n = &nodes[i];
                n.group == group
                    && !used.contains(&i)
                    && n.free_gpus() >= g
                    && n.cpus_free >= c
                    && n.mem_free + 1e-6 >= m
            };
            // The preferred nodes first (best fit among them), then best fit among all.
            let best = prefer
                .iter()
                .copied()
                .filter(|&i| ok(i))
                .min_by_key(|&i| (nodes[i].free_gpus() - g, i))
                .or_else(|| self.by_free(group, g).find(|&i| ok(i)))?;
            used.push(best);
            out.push((best, g, c, m));
        }
        Some(out)
    }

    /// The order [`spread`] reads nodes in: the preferred ones, then the rest, most
    /// free GPUs first (nodes with none are of no use to it).
    fn spread_order<'s>(
        &'s self,
        nodes: &[NodeState],
        group: usize,
        prefer: &'s [usize],
    ) -> impl Iterator<Item = usize> + 's {
        let mut first: Vec<usize> = prefer.iter().copied().filter(|&i| nodes[i].group == group).collect();
        first.sort_by_key(|&i| (std::cmp::Reverse(nodes[i].free_gpus()), i));
        first.dedup();
        let rest = self.most_free_first(group).filter(|i| !prefer.contains(i));
        first.into_iter().chain(rest)
    }
}

/// What one job receives on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// Index into the cluster's node list (see [`nodes_of`]).
    pub node: usize,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub mem: f64,
}

/// Where a job ends up.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    pub group: usize,
    pub plan: Plan,
    pub placement: Placement,
    pub shares: Vec<Share>,
    pub cpus: u32,
    pub host_memory_gib: f64,
    pub throughput: f64,
    /// Why the placement differs from the decision, if it does.
    pub note: Option<String>,
}

/// Splits `total` over parts proportionally to `weights` (largest remainders first).
pub fn split(total: u32, weights: &[u32]) -> Vec<u32> {
    let sum: u32 = weights.iter().sum::<u32>().max(1);
    let mut out: Vec<u32> =
        weights.iter().map(|w| (u64::from(total) * u64::from(*w) / u64::from(sum)) as u32).collect();
    let mut left = total - out.iter().sum::<u32>();
    let mut i = 0;
    while left > 0 && !out.is_empty() {
        out[i % weights.len()] += 1;
        left -= 1;
        i += 1;
    }
    out
}

/// Takes `gpus` GPUs (the lowest free indices, or exactly `exact`), `cpus` cores and
/// `mem` GiB of memory on node `node`.
pub fn take(nodes: &mut [NodeState], node: usize, gpus: u32, cpus: u32, mem: f64, exact: Option<&[u32]>) -> Share {
    let n = &mut nodes[node];
    let picked: Vec<u32> = match exact {
        Some(ix) => ix.to_vec(),
        None => (0..n.gpu_free.len() as u32).filter(|&i| n.gpu_free[i as usize]).take(gpus as usize).collect(),
    };
    for &i in &picked {
        n.gpu_free[i as usize] = false;
    }
    n.cpus_free -= cpus;
    n.mem_free -= mem;
    Share { node, gpus: picked, cpus, mem }
}

/// Chooses a node for every part of `per_node` (decreasing), best fit, preferring the
/// nodes in `prefer`: (node, GPUs, cores, memory) per part, or `None`.
pub fn layout(
    nodes: &[NodeState],
    group: usize,
    per_node: &[u32],
    cpus: u32,
    mem: f64,
    prefer: &[usize],
) -> Option<Vec<(usize, u32, u32, f64)>> {
    ByFree::of(nodes).layout(nodes, group, per_node, cpus, mem, prefer)
}

/// Spreads `gpus` over the nodes of `order` (the group's, current nodes first, then
/// those with the most free GPUs), each node's share of cores and memory
/// proportional to its GPUs.
fn spread(
    nodes: &[NodeState],
    order: impl Iterator<Item = usize>,
    gpus: u32,
    cpus: u32,
    mem: f64,
) -> Option<Vec<(usize, u32, u32, f64)>> {
    let cpu_per_gpu = f64::from(cpus) / f64::from(gpus.max(1));
    let mem_per_gpu = mem / f64::from(gpus.max(1));
    let mut left = gpus;
    let mut parts = Vec::new();
    for i in order {
        if left == 0 {
            break;
        }
        let n = &nodes[i];
        let by_cpu = (f64::from(n.cpus_free) / cpu_per_gpu.max(1e-9)).floor() as u32;
        let by_mem = if mem_per_gpu > 0.0 { (n.mem_free / mem_per_gpu + 1e-9).floor() as u32 } else { u32::MAX };
        let g = n.free_gpus().min(by_cpu).min(by_mem).min(left);
        if g > 0 {
            parts.push((i, g));
            left -= g;
        }
    }
    if left > 0 {
        return None;
    }
    let weights: Vec<u32> = parts.iter().map(|p| p.1).collect();
    let cpu_parts = split(cpus, &weights);
    let out: Vec<(usize, u32, u32, f64)> = parts
        .iter()
        .zip(cpu_parts)
        .map(|(&(i, g), c)| (i, g, c, mem * f64::from(g) / f64::from(gpus.max(1))))
        .collect();
    out.iter().all(|&(i, _, c, m)| nodes[i].cpus_free >= c && nodes[i].mem_free + 1e-6 >= m).then_some(out)
}

/// Which running jobs placement may move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repack {
    /// Every job the decision keeps stays on its GPUs.
    None,
    /// Jobs in their cooldown stay; the others are placed afresh.
    Unlocked,
    /// Every job is placed afresh.
    All,
}

/// Places the decision. `choice[j]` is job `j`'s candidate; the result has one entry
/// per job, `None` for jobs that wait. With `repack`, only jobs in their cooldown stay
/// where they are; the others are placed afresh (they may move), for rounds where
/// keeping everyone in place leaves no room for a guarantee; [`Repack::All`] moves
/// jobs in their cooldown too (the last resort of a guarantee).
pub fn place(
    evaluator: &mut Evaluator<'_>,
    book: &CurveBook,
    inputs: &[JobInput],
    choice: &[Option<usize>],
    repack: Repack,
) -> (Vec<Option<Placed>>, Vec<NodeState>) {
    let cluster = evaluator.cluster;
    let mut nodes = nodes_of(cluster);
    let mut index = ByFree::of(&nodes);
    let mut out: Vec<Option<Placed>> = vec![None; inputs.len()];

    // Unchanged allocations stay where they are.
    for (j, input) in inputs.iter().enumerate() {
        let (Some(c), Some(cur)) = (choice[j], &input.current) else { continue };
        let cand = &book.jobs[j].candidates[c];
        let moves = match repack {
            Repack::None => false,
            Repack::Unlocked => !book.jobs[j].locked,
            Repack::All => true,
        };
        if !cand.is_current || cur.nodes.is_empty() || moves {
            continue;
        }
        out[j] = keep_in_place(&mut nodes, &mut index, cur, || cand.throughput, None);
    }

    // Everyone else: guaranteed first, then largest first.
    let mut order: Vec<usize> = (0..inputs.len()).filter(|&j| choice[j].is_some() && out[j].is_none()).collect();
    order.sort_by_key(|&j| {
        let c = &book.jobs[j].candidates[choice[j].unwrap_or(0)];
        (!book.jobs[j].must_run, std::cmp::Reverse(c.gpus), j)
    });
    for j in order {
        let Some(c) = choice[j] else { continue };
        let jc = &book.jobs[j];
        let input = &inputs[j];
        let prefer: Vec<usize> = input
            .current
            .iter()
            .flat_map(|cur| cur.nodes.iter().filter_map(|(idx, _)| index.position(&nodes, cur.group, *idx)))
            .collect();
        // The chosen candidate, then cheaper ones of the same job, best value first.
        let mut tries = vec![c];
        let mut others: Vec<usize> =
            (0..jc.candidates.len()).filter(|&k| k != c && jc.candidates[k].gpus <= jc.candidates[c].gpus).collect();
        others.sort_by(|&a, &b| jc.candidates[b].value.total_cmp(&jc.candidates[a].value).then(a.cmp(&b)));
        tries.extend(others);
        // A running job whose chosen configuration found no room is restarted into a
        // stand-in only when the stand-in repays the restart as the decision values a
        // change (else it stays where it is, when that is still free): placement must
        // not restart a job the decision would not have.
        // (What it runs now: its current candidate, when the decision kept one.)
        let current_thr = jc.current.map(|k| jc.candidates[k].throughput);
        let change_min_gain = evaluator.config.change_min_gain;
        let stays = |nodes: &mut Vec<NodeState>, index: &mut ByFree, thr: f64| -> Option<Placed> {
            let (cur, now) = (input.current.as_ref().filter(|c| !c.nodes.is_empty())?, current_thr?);
            if jc.value_of_change(thr, change_min_gain) > jc.weight * now / jc.request_throughput + 1e-12 {
                return None;
            }
            let note = "kept where it runs: its chosen configuration found no room, and no stand-in repays a restart";
            keep_in_place(nodes, index, cur, || now, Some(note.into()))
        };
        for (attempt, &k) in tries.iter().enumerate() {
            let cand = &jc.candidates[k];
            let note = |what: &str| {
                (attempt > 0).then(|| format!("{what}: no node layout for the chosen {} GPUs", jc.candidates[c].gpus))
            };
            if attempt > 0
                && let Some(kept) = stays(&mut nodes, &mut index, cand.throughput)
            {
                out[j] = Some(kept);
                break;
            }
            if let Some(parts) =
                index.layout(&nodes, cand.group, cand.placement.per_node(), cand.cpus, cand.host_memory_gib, &prefer)
            {
                let shares =
                    parts.into_iter().map(|(node, g, cc, m)| index.take(&mut nodes, node, g, cc, m, None)).collect();
                out[j] = Some(Placed {
                    group: cand.group,
                    plan: cand.plan,
                    placement: cand.placement.clone(),
                    shares,
                    cpus: cand.cpus,
                    host_memory_gib: cand.host_memory_gib,
                    throughput: cand.throughput,
                    note: note("took a smaller configuration"),
                });
                break;
            }
            // Fragmented: spread the same resources and re-choose the plan (not for a
            // guaranteed job when guarantees are conservative: an unprofiled spread is
            // where the model errs most).
            if jc.guaranteed && evaluator.config.guarantee_keeps_layout {
                continue;
            }
            let order = index.spread_order(&nodes, cand.group, &prefer);
            if let Some(parts) = spread(&nodes, order, cand.gpus, cand.cpus, cand.host_memory_gib) {
                let Some(placement) = Placement::new(parts.iter().map(|p| p.1).collect()) else { continue };
                let restriction: Restriction = input.restriction();
                let Some((plan, thr)) = evaluator.best_plan_of(input, cand.group, &placement, cand.cpus, restriction)
                else {
                    continue;
                };
                let margin = evaluator.config.guarantee_margin;
                if jc.guaranteed && thr < jc.request_throughput * (1.0 + margin) * (1.0 - 1e-9) {
                    continue;
                }
                if let Some(kept) = stays(&mut nodes, &mut index, thr) {
                    out[j] = Some(kept);
                    break;
                }
                let shares =
                    parts.into_iter().map(|(node, g, cc, m)| index.take(&mut nodes, node, g, cc, m, None)).collect();
                out[j] = Some(Placed {
                    group: cand.group,
                    plan,
                    placement: placement.clone(),
                    shares,
                    cpus: cand.cpus,
                    host_memory_gib: cand.host_memory_gib,
                    throughput: thr,
                    note: Some(format!(
                        "spread as {placement} (fragmentation left no {} layout); plan re-chosen for it",
                        cand.placement
                    )),
                });
                break;
            }
        }
    }
    // A running job the decision paused, or moved to a configuration that found no
    // room, keeps running where it is when nobody took its resources: pausing it would
    // free them for nothing (and resume it, restarted, a round later).
    for (j, input) in inputs.iter().enumerate() {
        let Some(cur) = &input.current else { continue };
        if out[j].is_some() || cur.nodes.is_empty() {
            continue;
        }
        let throughput = || evaluator.believed_throughput(input, cur.group, &cur.plan, &cur.placement, cur.cpus);
        let note = "kept where it runs: the resources the round freed went unused";
        out[j] = keep_in_place(&mut nodes, &mut index, cur, throughput, Some(note.into()));
    }
    (out, nodes)
}

/// A running job on its current allocation, taken from `nodes`, if all of it is free.
/// `throughput` is asked only then.
fn keep_in_place(
    nodes: &mut [NodeState],
    index: &mut ByFree,
    cur: &Current,
    throughput: impl FnOnce() -> f64,
    note: Option<String>,
) -> Option<Placed> {
    let parts = current_parts(nodes, index, cur)?;
    let shares = parts.into_iter().map(|(node, g, c, m, ix)| index.take(nodes, node, g, c, m, ix.as_deref())).collect();
    Some(Placed {
        group: cur.group,
        plan: cur.plan,
        placement: cur.placement.clone(),
        shares,
        cpus: cur.cpus,
        host_memory_gib: cur.host_memory_gib,
        throughput: throughput(),
        note,
    })
}

/// Where a running job's current allocation lies on `nodes`, per node (node, GPUs,
/// cores, memory, GPU indices), if all of it is free there.
#[allow(clippy::type_complexity)]
fn current_parts(
    nodes: &[NodeState],
    index: &ByFree,
    cur: &Current,
) -> Option<Vec<(usize, u32, u32, f64, Option<Vec<u32>>)>> {
    let weights: Vec<u32> = cur.nodes.iter().map(|(_, ix)| ix.len() as u32).collect();
    let counts: Vec<u32> = if weights.iter().all(|&w| w > 0) {
        weights
    } else {
        // Only node names known: the placement's counts in node order.
        cur.placement.per_node().to_vec()
    };
    if counts.len() != cur.nodes.len() {
        return None;
    }
    let cpu_parts = split(cur.cpus, &counts);
    let total: u32 = counts.iter().sum();
    let mut parts = Vec::new();
    for (k, (idx, ix)) in cur.nodes.iter().enumerate() {
        let node = index.position(nodes, cur.group, *idx)?;
        let g = counts[k];
        let m = cur.host_memory_gib * f64::from(g) / f64::from(total.max(1));
        let n = &nodes[node];
        let gpus_ok = if ix.is_empty() {
            n.free_gpus() >= g
        } else {
            ix.iter().all(|&i| n.gpu_free.get(i as usize).copied().unwrap_or(false))
        };
        if !gpus_ok || n.cpus_free < cpu_parts[k] || n.mem_free + 1e-6 < m {
            return None;
        }
        parts.push((node, g, cpu_parts[k], m, (!ix.is_empty()).then(|| ix.clone())));
    }
    Some(parts)
}

/// Per node group, the resources no job can use after a placement: free GPUs on nodes
/// whose free cores or memory cannot feed them (at the least a job gets per GPU), and
/// free cores and memory on nodes with no usable GPU left.
pub fn stranded(nodes: &[NodeState], cluster: &Cluster, config: &PlannerConfig) -> Vec<Capacity> {
    let mut out = vec![Capacity::default(); cluster.node_groups.len()];
    for n in nodes {
        let g = &cluster.node_groups[n.group];
        let fg = n.free_gpus();
        let by_cpu = n.cpus_free / config.base_cpus_per_gpu(g);
        let per_gpu = config.base_host_gib_per_gpu(g);
        let by_mem = if per_gpu > 0.0 { (n.mem_free / per_gpu + 1e-9).floor() as u32 } else { u32::MAX };
        let usable = fg.min(by_cpu).min(by_mem);
        let s = &mut out[n.group];
        s.gpus += f64::from(fg - usable);
        if usable == 0 {
            s.cpus += f64::from(n.cpus_free);
            s.mem += n.mem_free.max(0.0);
        }
    }
    out
}

#[cfg(test)]
mod tests;
