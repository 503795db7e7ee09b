//! `rubick-fit evaluate`: treat the authors' measured tables as the truth, "profile"
//! only the K rows the selection rule picks (or use the authors' own profiling runs),
//! fit, predict every other row, and report the errors and the plan choices.

use std::collections::BTreeMap;
use std::time::Instant;

use rubick_core::fit::{FitOptions, Observation, fit};
use rubick_core::perfmodel::{Links, predict};
use rubick_core::plan::PlanCode;
use rubick_core::reference::{MeasuredRow, ProfileRun, TESTBED_GPU_MEMORY_GIB, profiled_rows, resolve_rows};
use rubick_core::space::resolve_code;
use rubick_core::{MemoryEstimator, ModelSpec, Placement};
use serde::Serialize;

pub use rubick_core::perf::{FLAG_FACTOR, is_inconsistent};

/// One measured row with its prediction.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluatedRow {
    pub model: String,
    pub code: String,
    pub family: String,
    pub plan: String,
    pub placement: String,
    pub measured_s: f64,
    pub predicted_s: f64,
    pub lower_s: f64,
    pub upper_s: f64,
    pub fitted: bool,
    pub flagged: bool,
}

impl EvaluatedRow {
    pub fn rel_error(&self) -> f64 {
        (self.predicted_s - self.measured_s).abs() / self.measured_s
    }
}

/// Error and plan-choice figures over a set of rows.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Metrics {
    pub rows: usize,
    pub fitted_rows: usize,
    pub mean_rel_error: Option<f64>,
    pub median_rel_error: Option<f64>,
    pub max_rel_error: Option<f64>,
    /// Placements with several measured plans where the model's first choice is the best.
    pub plan_choice_accuracy: Option<f64>,
    /// Mean of (measured time of the model's choice / best measured time - 1).
    pub plan_regret_mean: Option<f64>,
    pub plan_regret_max: Option<f64>,
    pub placements_compared: usize,
}

/// The report of one model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelReport {
    #[serde(flatten)]
    pub metrics: Metrics,
    /// The same error figures without the rows flagged as inconsistent.
    pub unflagged: Metrics,
    pub families: BTreeMap<String, Metrics>,
    /// The rows the fit used, as `code@placement`.
    pub fitted: Vec<String>,
    /// Held-out rows more than 2x off the prediction.
    pub flagged_rows: Vec<String>,
    /// Fitted parameter values by name.
    pub parameters: BTreeMap<String, f64>,
}

/// The whole SUMMARY.yaml.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `placements` (K selected rows) or `profiles` (the authors' profiling runs).
    pub source: String,
    pub samples: usize,
    pub overall: Metrics,
    pub overall_unflagged: Metrics,
    pub overall_families: BTreeMap<String, Metrics>,
    pub models: BTreeMap<String, ModelReport>,
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn family_label(code: &PlanCode) -> String {
    match code {
        PlanCode::ThreeD { .. } => "3d".to_owned(),
        other => other.to_string(),
    }
}

/// Errors over held-out rows and plan choice over all rows of each placement.
pub fn metrics(rows: &[&EvaluatedRow]) -> Metrics {
    let mut errors: Vec<f64> = rows.iter().filter(|r| !r.fitted).map(|r| r.rel_error()).collect();
    errors.sort_by(f64::total_cmp);
    let mean = (!errors.is_empty()).then(|| errors.iter().sum::<f64>() / errors.len() as f64);
    let median = (!errors.is_empty()).then(|| {
        let n = errors.len();
        if n % 2 == 1 { errors[n / 2] } else { (errors[n / 2 - 1] + errors[n / 2]) / 2.0 }
    });
    let mut by_placement: BTreeMap<(String, String), Vec<&EvaluatedRow>> = BTreeMap::new();
    for r in rows {
        by_placement.entry((r.model.clone(), r.placement.clone())).or_default().push(r);
    }
    let mut hits = 0;
    let mut regrets = Vec::new();
    for group in by_placement.values().filter(|g| g.len() >= 2) {
        let best = group.iter().map(|r| r.measured_s).fold(f64::INFINITY, f64::min);
        let Some(chosen) = group.iter().min_by(|a, b| a.predicted_s.total_cmp(&b.predicted_s)) else { continue };
        if chosen.measured_s <= best {
            hits += 1;
        }
        regrets.push(chosen.measured_s / best - 1.0);
    }
    let compared = regrets.len();
    Metrics {
        rows: rows.len(),
        fitted_rows: rows.iter().filter(|r| r.fitted).count(),
        mean_rel_error: mean.map(round4),
        median_rel_error: median.map(round4),
        max_rel_error: errors.last().copied().map(round4),
        plan_choice_accuracy: (compared > 0).then(|| round4(hits as f64 / compared as f64)),
        plan_regret_mean: (compared > 0).then(|| round4(regrets.iter().sum::<f64>() / compared as f64)),
        plan_regret_max: regrets.iter().copied().reduce(f64::max).map(round4),
        placements_compared: compared,
    }
}

fn family_metrics(rows: &[&EvaluatedRow]) -> BTreeMap<String, Metrics> {
    let mut families: BTreeMap<String, Vec<&EvaluatedRow>> = BTreeMap::new();
    for r in rows {
        families.entry(r.family.clone()).or_default().push(r);
    }
    families.into_iter().map(|(f, rs)| (f, metrics(&rs))).collect()
}

/// A profiling run of the authors' `profiles/` as an observation (one node).
pub fn profile_observation(run: &ProfileRun, model: &ModelSpec, links: Links) -> Option<Observation> {
    let gpus = run.gpus.max(1);
    let code = match (run.zero_type, run.strategy.starts_with('2')) {
        (1, _) => PlanCode::ZeroOffload,
        (2, _) => PlanCode::ZeroDp,
        (_, true) => PlanCode::Gc,
        _ => PlanCode::Ga,
    };
    let plan = resolve_code(&code, model, gpus, TESTBED_GPU_MEMORY_GIB, &MemoryEstimator::default())?;
    let placement = Placement::new(vec![gpus])?;
    Some(Observation { plan, placement, links, iter_time_s: run.iter_ms / 1e3 })
}

/// The outcome of evaluating one model.
#[derive(Debug)]
pub struct Evaluation {
    pub report: ModelReport,
    pub rows: Vec<EvaluatedRow>,
    /// The fitted model, as `rubick-fit fit` would write it.
    pub perf_model: rubick_core::perf::PerfModel,
}

/// Evaluates one model: which rows were fitted is decided by `select` over all rows
/// (`samples` of them), or the fit uses `profiles` when given.
pub fn evaluate_model(
    name: &str,
    model: &ModelSpec,
    measured: &[MeasuredRow],
    links: Links,
    samples: usize,
    profiles: Option<&[ProfileRun]>,
) -> anyhow::Result<Evaluation> {
    let estimator = MemoryEstimator::default();
    let usable = resolve_rows(measured, model, &estimator);
    if usable.len() < measured.len() {
        tracing::warn!("{name}: {} rows have no plan that fits; left out", measured.len() - usable.len());
    }
    let (chosen, observations): (Vec<usize>, Vec<Observation>) = match profiles {
        None => profiled_rows(&usable, samples, links),
        Some(runs) => (Vec::new(), runs.iter().filter_map(|r| profile_observation(r, model, links)).collect()),
    };
    let start = Instant::now();
    let fitted = fit(model, &observations, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    // Wall time goes to the log, not the summary, which stays byte-identical.
    tracing::info!("{name}: fitted {} rows in {:.1} ms", observations.len(), start.elapsed().as_secs_f64() * 1e3);
    let rows: Vec<EvaluatedRow> = usable
        .iter()
        .enumerate()
        .map(|(i, (row, plan))| {
            let predicted = predict(model, plan, &row.placement, &links, &fitted.params).total;
            let (lower, _, upper) = fitted.predict_interval(model, plan, &row.placement, &links);
            let is_fitted = chosen.contains(&i);
            EvaluatedRow {
                model: name.to_owned(),
                code: row.code.to_string(),
                family: family_label(&row.code),
                plan: plan.to_string(),
                placement: row.placement.to_string(),
                measured_s: row.iter_time_s,
                predicted_s: predicted,
                lower_s: lower,
                upper_s: upper,
                fitted: is_fitted,
                flagged: !is_fitted && is_inconsistent(row.iter_time_s, predicted),
            }
        })
        .collect();
    let all: Vec<&EvaluatedRow> = rows.iter().collect();
    let unflagged: Vec<&EvaluatedRow> = rows.iter().filter(|r| !r.flagged).collect();
    let report = ModelReport {
        metrics: metrics(&all),
        unflagged: metrics(&unflagged),
        families: family_metrics(&all),
        fitted: chosen.iter().map(|&i| format!("{}@{}", usable[i].0.code, usable[i].0.placement)).collect(),
        flagged_rows: rows
            .iter()
            .filter(|r| r.flagged)
            .map(|r| {
                format!("{}@{} measured {:.3}s predicted {:.3}s", r.code, r.placement, r.measured_s, r.predicted_s)
            })
            .collect(),
        parameters: rubick_core::perfmodel::PARAMS
            .iter()
            .zip(fitted.params.values)
            .map(|(p, v)| (p.name.to_owned(), (v * 1e6).round() / 1e6))
            .collect(),
    };
    let source = if profiles.is_some() { "profiles" } else { "placements" };
    let perf_model =
        crate::perf_model_artifact(model, &observations, &fitted, &format!("reference {source} of {name}"));
    Ok(Evaluation { report, rows, perf_model })
}

/// Pools the rows of several models into the overall block.
pub fn summarize(
    source: &str,
    samples: usize,
    reports: Vec<(String, ModelReport, Vec<EvaluatedRow>)>,
) -> (Summary, Vec<EvaluatedRow>) {
    let mut models = BTreeMap::new();
    let mut rows = Vec::new();
    for (name, report, model_rows) in reports {
        models.insert(name, report);
        rows.extend(model_rows);
    }
    let all: Vec<&EvaluatedRow> = rows.iter().collect();
    let unflagged: Vec<&EvaluatedRow> = rows.iter().filter(|r| !r.flagged).collect();
    let summary = Summary {
        source: source.to_owned(),
        samples,
        overall: metrics(&all),
        overall_unflagged: metrics(&unflagged),
        overall_families: family_metrics(&all),
        models,
    };
    (summary, rows)
}
