//! `elastic`: Pollux/Sia-style elastic training (Qiao et al., OSDI 2021; Jayaram
//! Subramanya et al., SOSP 2023): the GPU count adapts (elastic data parallelism within
//! the user's plan layout), the plan layout is fixed, cores follow GPUs (the node's
//! fair share per GPU).

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_core::planner::round::Solver;

pub(super) const SUMMARY: &str =
    "Pollux/Sia-style (OSDI 2021, SOSP 2023): elastic GPU count, the user's plan layout, fair-share cores";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("elastic", cluster, options, Solver::Heuristic, true, |p| p.fair_cores_only = true))
}
