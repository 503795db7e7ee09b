//! A model's raw curves ([`Evaluator::raw_curve`]): its memory-feasible plans on each
//! GPU count of a group, the best plan on every placement and core count, and which
//! points survive Pareto pruning.

use std::rc::Rc;

use rubick_core::cluster::NodeGroup;
use rubick_core::placement::Placement;
use rubick_core::plan::{Offload, Plan};
use rubick_model::belief::believed;
use rubick_model::space::{Dimensions, valid_plans};
use rubick_model::throughput::{self, iter_time_with_cpus};

use super::{Evaluator, ModelEntry, Raw, RawCurve, host_memory_gib};
use crate::Restriction;

impl Evaluator<'_> {
    /// Memory-feasible plans of a model on `gpus` GPUs of a group, cached.
    pub(super) fn space(&mut self, key: usize, group: usize, gpus: u32) -> Rc<Vec<Plan>> {
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
    pub(super) fn raw_curve(
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
                        let thr = throughput::samples_per_s(model, params, &g, plan, &placement, base_cpus, cpu_ref);
                        let thr = believed(evidence, plan, &placement, thr);
                        if best[0].is_none_or(|(_, b, _)| thr > b) {
                            best[0] = Some((*plan, thr, base_cpus));
                        }
                    } else {
                        let pred = throughput::predicted(model, params, &g, plan, &placement);
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
