//! `rubick-milp`: Rubick with the exact MILP (HiGHS) over the same Pareto candidates
//! each round, warm-started from the heuristic, within a time limit.

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_planner::round::Solver;

pub(super) const SUMMARY: &str = "Rubick with the exact MILP each round (HiGHS)";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("rubick-milp", cluster, options, Solver::Milp, false, |_| {}))
}
