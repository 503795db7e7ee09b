//! `static-guaranteed-first`: a static queue that admits guaranteed jobs first and
//! preempts best-effort ones (the latest started first) when a guaranteed job does not
//! fit; the user's plan and GPUs; GPUs are the only resource it manages (cores as
//! requested, else one per GPU from whatever the nodes have left).
//!
//! This is the scheduling half of AntMan (Xiao et al., OSDI 2020), and only that: it
//! was formerly called `antman`. AntMan's mechanism is GPU sharing: opportunistic
//! jobs packed onto the GPUs of resource-guarantee jobs, using their idle memory and
//! cycles under a dynamic memory and compute limit enforced inside the framework. This
//! simulator allocates whole GPUs and has no model of co-located jobs' interference
//! (nor the reference any measurement of it), so that mechanism cannot be modelled
//! here honestly, and no policy claims it.

use rubick_core::{Cluster, Placement, Plan};
use rubick_planner::JobInput;
use rubick_planner::curves::Evaluator;

use super::queue::QueuePolicy;
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "static queue, guaranteed jobs first preempting best-effort ones (AntMan's scheduling without its GPU sharing)";

fn cores(evaluator: &Evaluator<'_>, job: &JobInput, plan: &Plan, on: (usize, &Placement), fair: u32) -> Vec<u32> {
    let placement = on.1;
    let mut out = super::queue::requested_cores(evaluator, job, plan, on, fair);
    out.push(placement.gpus());
    out
}

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { guaranteed_first: true, cores, ..QueuePolicy::new(cluster, options) })
}
