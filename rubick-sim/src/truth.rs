//! The ground truth of a simulation: how fast a configuration *really* runs.
//!
//! A policy decides on its **belief**: a performance model fitted on a few profiled
//! rows. Judging its choices by the same belief rewards its own mistakes (the
//! optimizer's curse), so the truth is kept apart, in one of two modes:
//!
//! * [`TruthMode::Oracle`] (the default): a configuration the reference measured runs
//!   at its measured iteration time, scaled by the oracle's ratio when only the
//!   micro-batch, accumulation or CPU cores differ from what was measured; any other
//!   runs at the **oracle**'s prediction: the same model form fitted on *all* the
//!   model's measured rows (never seen by a policy). Each configuration is classed
//!   [`Basis::Measured`], [`Basis::Interpolated`] (a plan family the model was
//!   measured in, on a GPU count within the measured range) or
//!   [`Basis::Extrapolated`] (anything else), so a result can say how much of it rests
//!   on extrapolation.
//! * [`TruthMode::Belief`]: the old rule, for comparison: the measured row when the
//!   (code, placement) was measured, whatever the micro-batch, accumulation or cores,
//!   else the policy's own belief.
//!
//! The [`MeasuredTable`] is the one record of what was measured: as a
//! [`CandidateFilter`] it keeps the planner to the configurations that exist (a
//! simulation whose truth must be measured), the truth reads their times.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use rubick_core::cluster::NodeGroup;
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::{Plan, PlanCode, PlanFamily};
pub use rubick_core::simulation::TruthMode;
use rubick_model::fit::{FitError, FitOptions, Observation, fit};
use rubick_model::memory::MemoryEstimator;
use rubick_model::perfmodel::{Links, Params};
use rubick_model::reference::{MeasuredRow, resolve_rows};
use rubick_model::throughput::{self, iter_time_with_cpus};
use rubick_planner::CandidateFilter;

/// How the truth of a configuration was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// A measured row (scaled by the oracle for micro-batch, accumulation or cores).
    Measured,
    /// The oracle, within the plan families and GPU counts the model was measured at.
    Interpolated,
    /// The oracle (or, without one, the belief) outside them.
    Extrapolated,
}

impl Basis {
    pub const ALL: [Basis; 3] = [Basis::Measured, Basis::Interpolated, Basis::Extrapolated];
}

/// One measured configuration: its iteration time and the complete plan it ran (the
/// code resolved on the measured GPUs; `None` when no plan of the code fits).
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredEntry {
    pub iter_time_s: f64,
    pub plan: Option<Plan>,
}

/// The (model, plan code, placement) configurations a reference table measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MeasuredTable {
    rows: HashMap<(String, PlanCode, Placement), MeasuredEntry>,
}

/// Only configurations the table measured.
impl CandidateFilter for MeasuredTable {
    fn config(&self, model: &ModelSpec, plan: &Plan, placement: &Placement) -> bool {
        self.contains(&model.name, plan, placement)
    }

    fn placements(&self, model: &ModelSpec, plan: &Plan, gpus: u32) -> Option<Vec<Placement>> {
        Some(PlanCode::of(plan).map_or_else(Vec::new, |code| self.placements_of(&model.name, code, gpus)))
    }
}

impl MeasuredTable {
    /// Adds a model's rows (the first row of a configuration wins), each with the plan
    /// its code resolves to on the measured GPUs.
    pub fn add(&mut self, model: &ModelSpec, rows: &[MeasuredRow], estimator: &MemoryEstimator) {
        let resolved: HashMap<(PlanCode, &Placement), Plan> =
            resolve_rows(rows, model, estimator).into_iter().map(|(r, p)| ((r.code, &r.placement), p)).collect();
        for r in rows {
            let plan = resolved.get(&(r.code, &r.placement)).copied();
            self.rows
                .entry((model.name.clone(), r.code, r.placement.clone()))
                .or_insert(MeasuredEntry { iter_time_s: r.iter_time_s, plan });
        }
    }

    /// The measured configuration `plan` on `placement` belongs to (placements equal up
    /// to node order; on one GPU `ga` and `zero-dp` are the same plan).
    pub fn get(&self, model: &str, plan: &Plan, placement: &Placement) -> Option<&MeasuredEntry> {
        let code = PlanCode::of(plan)?;
        let key = |c: PlanCode| (model.to_owned(), c, placement.clone());
        self.rows
            .get(&key(code))
            .or_else(|| (plan.dp == 1 && code == PlanCode::Ga).then(|| self.rows.get(&key(PlanCode::ZeroDp))).flatten())
    }

    /// Whether `plan` on `placement` was measured for `model`.
    pub fn contains(&self, model: &str, plan: &Plan, placement: &Placement) -> bool {
        self.get(model, plan, placement).is_some()
    }

    /// The placements on which `code` was measured with `gpus` GPUs for `model`, the
    /// most packed first (fewest nodes, then the placement's order).
    pub fn placements_of(&self, model: &str, code: PlanCode, gpus: u32) -> Vec<Placement> {
        let mut out: Vec<Placement> = self
            .rows
            .keys()
            .filter(|(m, c, p)| m == model && *c == code && p.gpus() == gpus)
            .map(|(_, _, p)| p.clone())
            .collect();
        out.sort_by(|a, b| a.nodes().cmp(&b.nodes()).then(a.cmp(b)));
        out
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A model's oracle: the performance model fitted on every measured row of it.
#[derive(Debug, Clone)]
pub struct Oracle {
    pub params: Params,
    /// Rows it was fitted on.
    pub rows: usize,
    /// Its mean relative error on those rows (in-sample).
    pub mean_error: f64,
    /// Its largest relative error on them.
    pub max_error: f64,
    /// GPU counts measured per plan family: (fewest, most).
    families: BTreeMap<PlanFamily, (u32, u32)>,
}

impl Oracle {
    /// Fits the oracle of `model` on all its measured `rows`, on `links`.
    pub fn fit(model: &ModelSpec, rows: &[MeasuredRow], links: Links) -> Result<Self, FitError> {
        let resolved = resolve_rows(rows, model, &MemoryEstimator::default());
        let observations: Vec<Observation> = resolved
            .iter()
            .map(|(row, plan)| Observation {
                plan: *plan,
                placement: row.placement.clone(),
                links,
                iter_time_s: row.iter_time_s,
            })
            .collect();
        let fitted = fit(model, &observations, &FitOptions::default())?;
        let errors: Vec<f64> = observations
            .iter()
            .map(|o| {
                let t = rubick_model::perfmodel::predict(model, &o.plan, &o.placement, &links, &fitted.params).total;
                (t / o.iter_time_s - 1.0).abs()
            })
            .collect();
        let mut families: BTreeMap<PlanFamily, (u32, u32)> = BTreeMap::new();
        for (_, plan) in &resolved {
            let g = plan.gpus();
            let e = families.entry(plan.family()).or_insert((g, g));
            *e = (e.0.min(g), e.1.max(g));
        }
        Ok(Oracle {
            params: fitted.params,
            rows: observations.len(),
            mean_error: errors.iter().sum::<f64>() / errors.len().max(1) as f64,
            max_error: errors.iter().copied().fold(0.0, f64::max),
            families,
        })
    }

    /// Whether an unmeasured configuration stays within what was measured: its plan
    /// family, on a GPU count between the fewest and the most measured in it.
    pub fn interpolates(&self, plan: &Plan) -> bool {
        self.families.get(&plan.family()).is_some_and(|&(lo, hi)| (lo..=hi).contains(&plan.gpus()))
    }
}

/// The ground truth of a simulation.
#[derive(Debug, Clone)]
pub struct Truth {
    pub mode: TruthMode,
    /// What was measured (shared with a planner restricted to it).
    pub table: Arc<MeasuredTable>,
    /// Per model name.
    pub oracles: BTreeMap<String, Oracle>,
    /// CPU cores per GPU the measured rows were taken with.
    pub profiled_cpus_per_gpu: u32,
    /// Extrapolated configurations run this share slower than the truth otherwise
    /// says (throughput x (1 - share)): how much a result rests on extrapolation.
    pub extrapolated_slowdown: f64,
    /// The links the rows were measured with (on GPUs of compute speed 1): a node group
    /// with other links or another speed is other hardware (see [`Truth::iter_time_s`]).
    pub links: Links,
    /// Step times measured per GPU type (the Sia artifact's tables): where they know a
    /// job's model and a node group's GPU type, they are the truth there.
    pub steps: Option<Arc<crate::sia::StepTimes>>,
}

impl Truth {
    /// The truth of `models` (each with its measured rows): the table, and an oracle
    /// per model with rows (on `links`). A model whose oracle cannot be fitted is an
    /// error naming it.
    pub fn new(
        mode: TruthMode,
        models: &[(ModelSpec, Vec<MeasuredRow>)],
        links: Links,
        profiled_cpus_per_gpu: u32,
    ) -> Result<Self, (String, FitError)> {
        let estimator = MemoryEstimator::default();
        let mut table = MeasuredTable::default();
        let mut oracles = BTreeMap::new();
        for (model, rows) in models {
            if rows.is_empty() {
                continue;
            }
            table.add(model, rows, &estimator);
            let oracle = Oracle::fit(model, rows, links).map_err(|e| (model.name.clone(), e))?;
            oracles.insert(model.name.clone(), oracle);
        }
        Ok(Truth {
            mode,
            table: Arc::new(table),
            oracles,
            profiled_cpus_per_gpu: profiled_cpus_per_gpu.max(1),
            extrapolated_slowdown: 0.0,
            links,
            steps: None,
        })
    }

    /// How the truth of `plan` on `placement` is obtained for `model`.
    pub fn basis(&self, model: &str, plan: &Plan, placement: &Placement) -> Basis {
        if self.table.contains(model, plan, placement) {
            return Basis::Measured;
        }
        match self.oracles.get(model) {
            Some(o) if o.interpolates(plan) => Basis::Interpolated,
            _ => Basis::Extrapolated,
        }
    }

    /// The true iteration time of `plan` on `placement` of `group` with `cpus` cores,
    /// and its basis. On other hardware than the rows were measured on (another
    /// compute speed or other links), a measured row is carried over by the ratio of
    /// the oracle's predictions there and on the measured hardware, and every truth
    /// there is [`Basis::Extrapolated`]: the model's hardware scaling is assumed, not
    /// measured.
    pub fn iter_time_s(
        &self,
        model: &ModelSpec,
        belief: &Params,
        group: &NodeGroup,
        plan: &Plan,
        placement: &Placement,
        cpus: u32,
    ) -> (f64, Basis) {
        if let Some(measured) = self.steps.as_ref().and_then(|s| s.iter_time_s(model, group, plan, placement)) {
            let slowdown = if measured.1 == Basis::Extrapolated { self.extrapolated_slowdown } else { 0.0 };
            return (measured.0 / (1.0 - slowdown).max(1e-6), measured.1);
        }
        let reference = f64::from(self.profiled_cpus_per_gpu);
        let predict_on = |g: &NodeGroup, params: &Params, plan: &Plan, cpus: u32| {
            let pred = throughput::predicted(model, params, g, plan, placement);
            iter_time_with_cpus(plan, &pred, cpus, reference)
        };
        let predict = |params: &Params, plan: &Plan, cpus: u32| predict_on(group, params, plan, cpus);
        let oracle = self.oracles.get(&model.name).filter(|_| self.mode == TruthMode::Oracle);
        let native = group.compute_speed == 1.0 && Links::from(group) == self.links;
        let mut basis = self.basis(&model.name, plan, placement);
        let row = self.table.get(&model.name, plan, placement);
        let mut t = match (row, oracle) {
            (Some(row), None) => row.iter_time_s,
            (Some(row), Some(o)) => match row.plan {
                // Only micro-batch, accumulation or cores differ from the measured run:
                // the oracle's ratio carries the row over.
                Some(measured) => {
                    let measured_cpus = self.profiled_cpus_per_gpu * measured.gpus();
                    row.iter_time_s * predict(&o.params, plan, cpus) / predict(&o.params, &measured, measured_cpus)
                }
                None => row.iter_time_s,
            },
            (None, Some(o)) => predict(&o.params, plan, cpus),
            (None, None) => predict(belief, plan, cpus),
        };
        if !native {
            if row.is_some() {
                // The row's time on the measured hardware, carried over to this group.
                let measured_hw = NodeGroup {
                    compute_speed: 1.0,
                    nvlink_gbps: self.links.nvlink_gbps,
                    inter_node_gbps: self.links.network_gbps,
                    pcie_gbps: self.links.pcie_gbps,
                    ..group.clone()
                };
                let params = oracle.map_or(belief, |o| &o.params);
                t *= predict(params, plan, cpus) / predict_on(&measured_hw, params, plan, cpus);
            }
            basis = Basis::Extrapolated;
        }
        let slowdown = if basis == Basis::Extrapolated { self.extrapolated_slowdown } else { 0.0 };
        (t / (1.0 - slowdown).max(1e-6), basis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rubick_core::cluster::Cluster;

    fn group() -> NodeGroup {
        Cluster::example().node_groups[0].clone()
    }

    /// Rows of LLaMA-2-7B-like ZeRO-DP and ZeRO-Offload runs on 2 to 8 GPUs of one node,
    /// timed by a known model.
    fn fixture() -> (ModelSpec, Vec<MeasuredRow>, Truth) {
        let model = ModelSpec::example();
        let g = group();
        let links = Links::from(&g);
        let params = rubick_model::belief::default_params(&model);
        let mut rows = Vec::new();
        let codes = [PlanCode::ZeroDp, PlanCode::ZeroOffload, PlanCode::ThreeD { pp: 2, tp: 2, dp: 1 }];
        for code in codes {
            for gpus in [2u32, 4, 8] {
                if code.gpus().is_some_and(|g| g != gpus) {
                    continue;
                }
                let placement = Placement::new(vec![gpus]).unwrap();
                let plan =
                    rubick_model::space::resolve_code(&code, &model, gpus, 80.0, &MemoryEstimator::default()).unwrap();
                let t = rubick_model::perfmodel::predict(&model, &plan, &placement, &links, &params).total;
                rows.push(MeasuredRow { code, placement, iter_time_s: t * 1.1, phases: None });
            }
        }
        let truth = Truth::new(TruthMode::Oracle, &[(model.clone(), rows.clone())], links, 4).unwrap();
        (model, rows, truth)
    }

    /// The measured row of LLaMA-2-7B's `zero-dp` on 4 GPUs, its plan and the belief.
    fn measured_row(code: PlanCode) -> (ModelSpec, MeasuredRow, Plan, Truth) {
        let (model, rows, truth) = fixture();
        let row = rows.into_iter().find(|r| r.code == code && r.placement.gpus() == 4).unwrap();
        let skeleton = row.code.skeleton(4);
        let plan = truth.table.get(&model.name, &skeleton, &row.placement).unwrap().plan.unwrap();
        (model, row, plan, truth)
    }

    #[test]
    fn a_measured_configuration_runs_at_its_row() {
        let (model, row, plan, truth) = measured_row(PlanCode::ZeroDp);
        let belief = rubick_model::belief::default_params(&model);
        let (t, basis) = truth.iter_time_s(&model, &belief, &group(), &plan, &row.placement, 16);
        assert_eq!(basis, Basis::Measured);
        assert!((t / row.iter_time_s - 1.0).abs() < 1e-9, "{t} vs {}", row.iter_time_s);
    }

    /// The truth charged a plan with accumulation the row measured without it (and a
    /// micro-batch-1 plan the large-micro-batch row): the belief was 1.8x faster, the
    /// truth 1.68x slower than believed.
    /// A row measured on the testbed holds there; on GPUs twice as fast (or with
    /// other links) it is carried over by the model and called extrapolated.
    #[test]
    fn a_measured_row_on_other_hardware_is_scaled_and_extrapolated() {
        let (model, row, plan, truth) = measured_row(PlanCode::ZeroDp);
        let belief = rubick_model::belief::default_params(&model);
        let g = group();
        let (native, basis) = truth.iter_time_s(&model, &belief, &g, &plan, &row.placement, 16);
        assert_eq!(basis, Basis::Measured);
        let fast = NodeGroup { compute_speed: 2.0, ..g.clone() };
        let (t, basis) = truth.iter_time_s(&model, &belief, &fast, &plan, &row.placement, 16);
        assert_eq!(basis, Basis::Extrapolated);
        assert!(t < native * 0.8 && t > native * 0.4, "{t} vs {native}");
        let slow_links = NodeGroup { nvlink_gbps: g.nvlink_gbps / 4.0, ..g };
        let (t, basis) = truth.iter_time_s(&model, &belief, &slow_links, &plan, &row.placement, 16);
        assert_eq!(basis, Basis::Extrapolated);
        assert!(t > native, "{t} vs {native}");
    }

    #[test]
    fn the_truth_of_a_measured_row_follows_its_accumulation_and_micro_batch() {
        // A pipeline: its bubble shrinks with more micro-batches.
        let (model, row, plan, truth) = measured_row(PlanCode::ThreeD { pp: 2, tp: 2, dp: 1 });
        let (g, belief) = (group(), rubick_model::belief::default_params(&model));
        let t = truth.iter_time_s(&model, &belief, &g, &plan, &row.placement, 16).0;
        let mut ga = plan;
        (ga.micro_batch, ga.ga) = (1, plan.ga * plan.micro_batch);
        assert_ne!(ga, plan, "the row's plan has a micro-batch above 1");
        let (t2, basis) = truth.iter_time_s(&model, &belief, &g, &ga, &row.placement, 16);
        assert_eq!(basis, Basis::Measured);
        assert!((t2 / t - 1.0).abs() > 1e-3, "accumulation changes the truth: {t2} vs {t}");
        let o = &truth.oracles[&model.name].params;
        let oracle = |p: &Plan| rubick_model::perfmodel::predict(&model, p, &row.placement, &Links::from(&g), o).total;
        assert!((t2 / t - oracle(&ga) / oracle(&plan)).abs() < 1e-9, "{t2} vs {t}");
        // The old rule ignores it.
        let old = Truth { mode: TruthMode::Belief, ..truth.clone() };
        assert_eq!(old.iter_time_s(&model, &belief, &g, &ga, &row.placement, 16).0, row.iter_time_s);
    }

    /// Measured rows ignored the cores a job got: Synergy's and Rubick's core decisions
    /// changed nothing.
    #[test]
    fn the_truth_of_an_offload_row_follows_its_cores() {
        let (model, row, plan, truth) = measured_row(PlanCode::ZeroOffload);
        let (g, belief) = (group(), rubick_model::belief::default_params(&model));
        // Taken with 4 cores per GPU: 16 cores is the row, more is faster, fewer slower.
        let at = |cpus| truth.iter_time_s(&model, &belief, &g, &plan, &row.placement, cpus).0;
        assert!((at(16) / row.iter_time_s - 1.0).abs() < 1e-9);
        assert!(at(48) < at(16) && at(16) < at(8), "{} {} {}", at(48), at(16), at(8));
    }

    #[test]
    fn unmeasured_configurations_are_interpolated_or_extrapolated() {
        let (model, _, truth) = fixture();
        let three = Placement::new(vec![3]).unwrap();
        if let Some(p3) =
            rubick_model::space::resolve_code(&PlanCode::ZeroDp, &model, 3, 80.0, &MemoryEstimator::default())
        {
            assert_eq!(truth.basis(&model.name, &p3, &three), Basis::Interpolated);
        }
        // Sixteen GPUs over two nodes: beyond every measured count.
        let sixteen = Placement::new(vec![8, 8]).unwrap();
        let p16 = rubick_model::space::resolve_code(&PlanCode::ZeroDp, &model, 16, 80.0, &MemoryEstimator::default())
            .unwrap();
        assert_eq!(truth.basis(&model.name, &p16, &sixteen), Basis::Extrapolated);
        let slow = Truth { extrapolated_slowdown: 0.3, ..truth.clone() };
        let belief = rubick_model::belief::default_params(&model);
        let (a, b) = (
            truth.iter_time_s(&model, &belief, &group(), &p16, &sixteen, 64).0,
            slow.iter_time_s(&model, &belief, &group(), &p16, &sixteen, 64).0,
        );
        assert!((b * 0.7 / a - 1.0).abs() < 1e-9, "{a} {b}");
    }

    #[test]
    fn the_oracle_fits_its_own_rows() {
        let (model, _, truth) = fixture();
        let o = &truth.oracles[&model.name];
        assert_eq!(o.rows, 7);
        assert!(o.mean_error < 0.1, "{}", o.mean_error);
    }
}
