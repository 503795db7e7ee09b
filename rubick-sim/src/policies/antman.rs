//! `antman`: AntMan (Xiao et al., OSDI 2020). Guaranteed jobs first, preempting
//! best-effort ones (the latest started first) when they do not fit; the user's plan
//! and GPUs; GPUs are the only resource it manages: cores as requested, else one per
//! GPU from whatever the nodes have left.

use rubick_core::planner::curves::Evaluator;
use rubick_core::{Cluster, Placement, Plan};

use super::queue::QueuePolicy;
use super::{Policy, PolicyJob, PolicyOptions};

pub(super) const SUMMARY: &str = "AntMan (OSDI 2020): guaranteed jobs first, preempting best-effort ones; GPUs only";

fn cores(evaluator: &Evaluator<'_>, job: &PolicyJob<'_>, plan: &Plan, on: (usize, &Placement), fair: u32) -> Vec<u32> {
    let placement = on.1;
    let mut out = super::queue::requested_cores(evaluator, job, plan, on, fair);
    out.push(placement.gpus());
    out
}

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { guaranteed_first: true, cores, ..QueuePolicy::new(cluster, options) })
}
