//! What the model predicts of a configuration on a node group: the prediction with the
//! group's compute speed applied ([`predicted`]), the CPU optimizer's dependence on
//! cores ([`iter_time_with_cpus`]) and the samples per second that follow
//! ([`samples_per_s`]).

use rubick_core::cluster::NodeGroup;
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::{Offload, Plan};

use crate::perfmodel::{Links, Params, Prediction, idx, predict};

/// Predicted samples per second of `plan` on `placement` of `group` with `cpus`
/// cores. The CPU optimizer of offloading plans speeds up with cores beyond
/// `cpu_reference` per GPU (those the model's profile was taken with: the planner's
/// `PlannerConfig::cpu_reference`) and slows down below it.
pub fn samples_per_s(
    model: &ModelSpec,
    params: &Params,
    group: &NodeGroup,
    plan: &Plan,
    placement: &Placement,
    cpus: u32,
    cpu_reference: f64,
) -> f64 {
    let pred = predicted(model, params, group, plan, placement);
    model.global_batch as f64 / iter_time_with_cpus(plan, &pred, cpus, cpu_reference).max(1e-12)
}

/// The performance model's prediction of `plan` on `placement` of `group` (its
/// compute speed applied), before the CPU adjustment.
pub fn predicted(
    model: &ModelSpec,
    params: &Params,
    group: &NodeGroup,
    plan: &Plan,
    placement: &Placement,
) -> Prediction {
    if (group.compute_speed - 1.0).abs() > 1e-12 {
        let mut p = params.clone();
        p.values[idx::COMPUTE] /= group.compute_speed;
        predict(model, plan, placement, &Links::from(group), &p)
    } else {
        predict(model, plan, placement, &Links::from(group), params)
    }
}

/// The iteration time of a prediction with `cpus` cores: the CPU optimizer of
/// offloading plans runs `reference / cores-per-GPU` times as long as predicted
/// (within 0.5..8: memory bandwidth caps the gain), where `reference` is the cores per
/// GPU the prediction's rows were measured with.
pub fn iter_time_with_cpus(plan: &Plan, pred: &Prediction, cpus: u32, reference: f64) -> f64 {
    let mut t = pred.total;
    if plan.offload != Offload::None {
        let per_gpu = f64::from(cpus.max(1)) / f64::from(plan.gpus().max(1));
        t += pred.optimizer * ((reference / per_gpu).clamp(0.5, 8.0) - 1.0);
    }
    t
}
