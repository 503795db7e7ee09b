//! `rubick-no-resize`: an ablation of Rubick without resizing: plans change, the GPU
//! count each job asked for does not.

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_planner::round::Solver;

pub(super) const SUMMARY: &str = "ablation: Rubick without resizing (plans only, the requested GPUs)";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("rubick-no-resize", cluster, options, Solver::Heuristic, false, |p| {
        p.fixed_gpus = true
    }))
}
