//! The planner's inputs of a `schedule` round: jobs with their beliefs and where
//! they run now.

use std::collections::HashMap;
use std::path::Path;

use rubick_core::schedule::Schedule;
use rubick_core::{Cluster, Job};
use rubick_model::belief::Belief;
use rubick_planner::{JobInput, PlannerConfig, Restriction, current_of_assignment, current_of_job};

/// Each job believed as the FLOPs-based default of its model ([`Belief::prior`]).
pub fn on_priors(jobs: Vec<Job>) -> Vec<(Job, Belief)> {
    jobs.into_iter()
        .map(|job| {
            let belief = Belief::prior(&job.model);
            (job, belief)
        })
        .collect()
}

/// The planner's inputs: jobs with their beliefs and current allocations, taken from
/// the previous round's schedule where it names the job, else from the job's `current`.
/// Each has all its iterations left and has received no service (a real round knows
/// none: no quantum, every running job keeps its request).
pub fn job_inputs(
    jobs_path: &Path,
    jobs: Vec<(Job, Belief)>,
    cluster: &Cluster,
    config: &PlannerConfig,
    previous: Option<(&Path, &Schedule)>,
) -> anyhow::Result<Vec<JobInput>> {
    let mut inputs = Vec::with_capacity(jobs.len());
    // Each job's assignment in the previous schedule (the first, if named twice).
    let mut assigned: HashMap<&str, usize> = HashMap::new();
    for (k, a) in previous.map_or(&[][..], |(_, s)| &s.assignments).iter().enumerate() {
        assigned.entry(a.job.as_str()).or_insert(k);
    }
    let hosted = cluster.node_groups.iter().any(|g| !g.hosts.is_empty());
    for (i, (job, belief)) in jobs.into_iter().enumerate() {
        // The job's assignment in the previous schedule, with where that schedule is.
        let before = previous.zip(assigned.get(job.name.as_str())).map(|((path, s), &k)| (path, &s.assignments[k], k));
        // A cluster naming its hosts (`rubick-run cluster --backend slurm`) is what is up
        // now: a run on a node it no longer has (drained, down, removed) must move, and
        // the job is planned as a waiting one, on plans its checkpoint can resume at. In
        // a cluster of `<group>-<index>` names an unknown node is a mistake (exit 2).
        let previous_nodes: Vec<&str> = match before {
            Some((_, a, _)) => a.nodes.iter().map(|n| n.node.as_str()).collect(),
            None => job.current.iter().flat_map(|c| c.nodes.iter().map(String::as_str)).collect(),
        };
        // A GPU the node no longer has (its group's `gpusPerNode` went down: a GPU failed
        // and was taken out) is a resource that left, like a drained node: the run moves.
        let previous_gpus: Vec<(&str, u32)> = before.map_or_else(Vec::new, |(_, a, _)| {
            a.nodes.iter().filter_map(|n| Some((n.node.as_str(), n.gpus.iter().copied().max()?))).collect()
        });
        let gone_node = previous_nodes.iter().find(|n| hosted && cluster.node_by_name(n).is_none());
        let gone_gpu = previous_gpus.iter().find_map(|&(node, top)| {
            let (g, _) = cluster.node_by_name(node)?;
            let per_node = cluster.node_groups[g].gpus_per_node;
            (top >= per_node).then(|| {
                format!(
                    "GPU {top} of node `{node}` is not in cluster `{}` now (it has {per_node} per node)",
                    cluster.name
                )
            })
        });
        let gone =
            gone_node.map(|gone| format!("its node `{gone}` is not in cluster `{}` now", cluster.name)).or(gone_gpu);
        let restarts = job.current.as_ref().map_or(0, |c| c.restarts);
        if let Some(gone) = gone {
            tracing::warn!("`{}`: {gone}: its run moves", job.name);
            // The plan it ran: the previous schedule's, else the job's `current`.
            let ran = before.map_or_else(|| job.current.as_ref().map(|c| c.plan), |(_, a, _)| a.plan);
            let allowed = ran.map_or(Restriction::Any, |plan| Restriction::of_checkpoint(&plan, job.resharding));
            inputs.push(JobInput { allowed, restarts, ..JobInput::new(job, belief) });
            continue;
        }
        let current = match before {
            Some((path, a, k)) => current_of_assignment(a, cluster)
                .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.within(&format!("assignments[{k}]"))))?,
            None => current_of_job(&job, cluster, config)
                .map_err(|e| anyhow::anyhow!("{}: {}", jobs_path.display(), e.within(&format!("jobs[{i}]"))))?,
        };
        // The safety net after every move: a run measured slower than the plan before it
        // (`slowPlans`, seen by rubick-run) moves back to that plan this round, whatever
        // its cooldown or restart factor, planned as a waiting job (where the checkpoint
        // cannot resume at the plan before: wherever it can).
        let slow = current.as_ref().and_then(|c| Some((c, job.slow_plans.iter().find(|s| s.plan == c.plan)?)));
        if let Some((c, slow)) = slow {
            let checkpoint = Restriction::of_checkpoint(&c.plan, job.resharding);
            let allowed = if checkpoint.allows(&slow.before) { Restriction::Exact(slow.before) } else { checkpoint };
            tracing::warn!("`{}`: {}: it moves back", job.name, slow.describe());
            inputs.push(JobInput { allowed, restarts, ..JobInput::new(job, belief) });
            continue;
        }
        inputs.push(JobInput::at(job, belief, current));
    }
    Ok(inputs)
}
