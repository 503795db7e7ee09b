//! `rubick-gpus-only`: an ablation of Rubick that only changes GPU counts: the user's
//! plan layout is kept (data parallelism takes the GPUs) and every job gets the node's
//! fair share of cores per GPU. Rubick's own planner, valuation and restart rule:
//! what Rubick gains from choosing plans and cores, not a model of Sia or Pollux
//! (those are `sia` and `pollux`). Formerly called `elastic`.

use rubick_core::Cluster;

use super::planner::PlannerFamily;
use super::{Policy, PolicyOptions};
use rubick_planner::round::Solver;

pub(super) const SUMMARY: &str = "ablation: Rubick with the user's plan layout and fair-share cores (GPU counts only)";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(PlannerFamily::new("rubick-gpus-only", cluster, options, Solver::Heuristic, true, |p| {
        p.fair_cores_only = true
    }))
}
