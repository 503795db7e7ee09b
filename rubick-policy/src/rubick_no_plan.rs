//! `rubick-no-plan`: an ablation of Rubick without plan changes: resources only (GPUs,
//! cores and memory) within the user's plan layout.

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_planner::round::Solver;

pub(super) const SUMMARY: &str = "ablation: Rubick without plan changes (resources only)";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("rubick-no-plan", cluster, options, Solver::Heuristic, true, |_| {}))
}
