//! The reconcile decision: desired schedule + actual runs -> actions. Pure (no I/O).
//!
//! A job runs as desired when it runs with the same plan on the same GPUs and cores of
//! the same nodes; it is left alone. Every other running job is stopped (not
//! scheduled any more, or to be reconfigured), and every desired job not left alone is
//! started. Stops come first, so the GPUs a start is given are free by then.

use std::collections::BTreeMap;

use rubick_core::Plan;
use rubick_core::schedule::{NodeSet, NodeShare};

/// Where a job should run, or runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub plan: Plan,
    pub nodes: Vec<NodeShare>,
}

impl Allocation {
    /// Same plan, and on every node the same GPUs (in any order) and cores
    /// ([`NodeSet`], each node with its cores; a schedule names every GPU); host memory
    /// is not enforced by any backend, so a change of it alone restarts nothing.
    pub fn same_as(&self, other: &Allocation) -> bool {
        fn set(a: &Allocation) -> NodeSet<(&str, u32)> {
            NodeSet::new(a.nodes.iter().map(|n| ((n.node.as_str(), n.cpus), Some(&n.gpus[..]))))
        }
        self.plan == other.plan && set(self).matches(&set(other))
    }

    /// `(node, gpu)` pairs it holds.
    pub fn gpus(&self) -> impl Iterator<Item = (&str, u32)> {
        self.nodes.iter().flat_map(|n| n.gpus.iter().map(move |g| (n.node.as_str(), *g)))
    }
}

/// Why a running job is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Scheduled elsewhere or under another plan: started again right after.
    Reconfigure,
    /// Not scheduled this round: it waits (its checkpoint keeps its progress).
    Preempt,
}

/// One step of a reconciliation.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Stop { job: String, reason: StopReason },
    Start { job: String, allocation: Allocation },
}

/// The actions that make `actual` (running jobs) what `desired` says, stops first.
pub fn reconcile(desired: &BTreeMap<String, Allocation>, actual: &BTreeMap<String, Allocation>) -> Vec<Action> {
    let mut stops = Vec::new();
    let mut starts = Vec::new();
    for (job, running) in actual {
        match desired.get(job) {
            Some(want) if want.same_as(running) => {}
            Some(_) => stops.push(Action::Stop { job: job.clone(), reason: StopReason::Reconfigure }),
            None => stops.push(Action::Stop { job: job.clone(), reason: StopReason::Preempt }),
        }
    }
    for (job, want) in desired {
        if !actual.get(job).is_some_and(|running| want.same_as(running)) {
            starts.push(Action::Start { job: job.clone(), allocation: want.clone() });
        }
    }
    stops.extend(starts);
    stops
}

/// `actual` after `actions` succeeded.
pub fn apply(actual: &BTreeMap<String, Allocation>, actions: &[Action]) -> BTreeMap<String, Allocation> {
    let mut next = actual.clone();
    for action in actions {
        match action {
            Action::Stop { job, .. } => {
                next.remove(job);
            }
            Action::Start { job, allocation } => {
                next.insert(job.clone(), allocation.clone());
            }
        }
    }
    next
}

/// The first GPU two allocations share, if any (a schedule that gives one GPU twice
/// is refused before anything is done).
pub fn shared_gpu<'a>(
    allocations: impl IntoIterator<Item = (&'a String, &'a Allocation)>,
) -> Option<(String, String, String, u32)> {
    let mut owner: BTreeMap<(String, u32), &String> = BTreeMap::new();
    for (job, a) in allocations {
        for (node, gpu) in a.gpus() {
            if let Some(first) = owner.insert((node.to_owned(), gpu), job)
                && first != job
            {
                return Some((first.clone(), job.clone(), node.to_owned(), gpu));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn alloc(plan: &str, node: &str, gpus: Vec<u32>, cpus: u32) -> Allocation {
        Allocation {
            plan: plan.parse().unwrap(),
            nodes: vec![NodeShare { node: node.into(), gpus, cpus, host_memory_gib: 8.0 }],
        }
    }

    #[test]
    fn unchanged_jobs_are_left_alone_and_changed_ones_restart_after_every_stop() {
        let desired = BTreeMap::from([
            ("a".to_owned(), alloc("dp1-tp1-pp1-mb4-ga4", "n-0", vec![0], 2)),
            ("b".to_owned(), alloc("dp2-tp1-pp1-mb4-ga2", "n-0", vec![2, 1], 4)),
            ("c".to_owned(), alloc("dp1-tp1-pp1-mb4-ga4", "n-0", vec![3], 2)),
        ]);
        let actual = BTreeMap::from([
            ("a".to_owned(), alloc("dp1-tp1-pp1-mb4-ga4", "n-0", vec![0], 2)),
            ("b".to_owned(), alloc("dp1-tp1-pp1-mb4-ga4", "n-0", vec![1], 2)),
            ("d".to_owned(), alloc("dp1-tp1-pp1-mb4-ga4", "n-0", vec![2], 2)),
        ]);
        let actions = reconcile(&desired, &actual);
        let names: Vec<String> = actions
            .iter()
            .map(|a| match a {
                Action::Stop { job, reason } => format!("stop {job} {reason:?}"),
                Action::Start { job, .. } => format!("start {job}"),
            })
            .collect();
        assert_eq!(names, ["stop b Reconfigure", "stop d Preempt", "start b", "start c"]);
        // GPU order within a node does not matter.
        let again = apply(&actual, &actions);
        let mut reordered = desired.clone();
        reordered.get_mut("b").unwrap().nodes[0].gpus = vec![1, 2];
        assert!(reconcile(&reordered, &again).is_empty());
    }

    fn arb_allocations(gpus: u32) -> impl Strategy<Value = BTreeMap<String, Allocation>> {
        // Up to 5 jobs, each 0-2 GPUs of one 8-GPU node, disjoint by construction.
        (proptest::collection::vec((0u32..3, 0u32..2, 1u32..4), 0..5), Just(gpus)).prop_map(|(jobs, total)| {
            let mut next = 0;
            let mut out = BTreeMap::new();
            for (i, (n, plan, cpus)) in jobs.into_iter().enumerate() {
                if n == 0 || next + n > total {
                    continue;
                }
                let plan = match (n, plan) {
                    (1, 0) => "dp1-tp1-pp1-mb4-ga4",
                    (1, _) => "dp1-tp1-pp1-mb2-ga8-gc",
                    (_, 0) => "dp2-tp1-pp1-mb4-ga2",
                    _ => "dp2-tp1-pp1-mb4-ga2-z1",
                };
                out.insert(format!("j{i}"), alloc(plan, "n-0", (next..next + n).collect(), cpus));
                next += n;
            }
            out
        })
    }

    proptest! {
        #[test]
        fn reconciling_converges_in_one_step_and_never_double_books(
            desired in arb_allocations(8),
            actual in arb_allocations(8),
        ) {
            let actions = reconcile(&desired, &actual);
            let after = apply(&actual, &actions);
            // Converged: the result is what was desired, and nothing is left to do.
            prop_assert!(reconcile(&desired, &after).is_empty());
            prop_assert_eq!(after.len(), desired.len());
            // No job is started twice, and every stop precedes every start.
            let starts: Vec<&String> = actions.iter().filter_map(|a| match a { Action::Start { job, .. } => Some(job), _ => None }).collect();
            let mut unique = starts.clone();
            unique.dedup();
            prop_assert_eq!(unique.len(), starts.len());
            let first_start = actions.iter().position(|a| matches!(a, Action::Start { .. })).unwrap_or(actions.len());
            let all_starts = actions[first_start..].iter().all(|a| matches!(a, Action::Start { .. }));
            prop_assert!(all_starts, "a stop after a start");
            // Before any start, every job still running holds GPUs no started job is given.
            let mut running = actual.clone();
            for a in &actions {
                match a {
                    Action::Stop { job, .. } => { running.remove(job); }
                    Action::Start { job, allocation } => {
                        for (other, held) in &running {
                            prop_assert!(other == job || !held.gpus().any(|g| allocation.gpus().any(|h| h == g)),
                                "{job} given a GPU {other} holds");
                        }
                        running.insert(job.clone(), allocation.clone());
                    }
                }
            }
            // Jobs running as desired are never touched.
            for (job, a) in &actual {
                if desired.get(job).is_some_and(|d| d.same_as(a)) {
                    let touched = actions.iter().any(|x| matches!(x, Action::Stop { job: j, .. } | Action::Start { job: j, .. } if j == job));
                    prop_assert!(!touched, "a job running as desired was touched");
                }
            }
        }
    }
}
