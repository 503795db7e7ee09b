//! Rubick (arXiv 2408.08586, MLSys 2025): every job's plan and resources chosen
//! together each round by the greedy heuristic (guaranteed jobs first, then resources
//! to the highest marginal gain), the MILP only when the greedy misses a guarantee.

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_planner::round::Solver;

pub(super) const SUMMARY: &str = "Rubick (MLSys 2025): plans and resources together, the heuristic";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("rubick", cluster, options, Solver::Heuristic, false, |_| {}))
}
