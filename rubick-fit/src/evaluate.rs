//! `rubick-fit evaluate`: treat measured tables as the truth, "profile" only the K rows
//! the selection rule picks (or, for the authors' data, their own profiling runs), fit,
//! predict every other row, and report the errors and the plan choices.
//!
//! Any measured table can be judged: the authors' (`--reference`), a profile table of
//! one job (`--table` with `--job`), or others' published measurements
//! (`--external`, read by `rubick_model::external`). Held-out error is over the rows the
//! fit did not see; plan-choice regret, among held-out rows with the same GPU count, is
//! the measured time of the row the model ranks fastest over the fastest measured,
//! minus 1.

use std::collections::BTreeMap;
use std::time::Instant;

use rubick_core::plan::PlanCode;
use rubick_core::{ModelSpec, Placement};
use rubick_model::MemoryEstimator;
use rubick_model::fit::{FitOptions, Observation, fit};
use rubick_model::perfmodel::Links;
use rubick_model::reference::{MeasuredRow, ProfileRun, TESTBED_GPU_MEMORY_GIB, resolve_rows};
use rubick_model::select::{Candidate, select};
use rubick_model::space::resolve_code;
use serde::Serialize;

pub use rubick_model::perf::{FLAG_FACTOR, is_inconsistent};

mod command;

pub use command::evaluate_external;
pub(crate) use command::run;

/// One measured row with its prediction.
#[derive(Debug, Clone, Serialize)]
pub struct EvaluatedRow {
    pub model: String,
    pub code: String,
    pub family: String,
    pub plan: String,
    pub placement: String,
    pub gpus: u32,
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
    /// GPU counts with several held-out rows where the model's first choice is the best.
    pub plan_choice_accuracy: Option<f64>,
    /// Mean of (measured time of the model's choice / best measured time - 1).
    pub plan_regret_mean: Option<f64>,
    pub plan_regret_max: Option<f64>,
    /// (job, GPU count) groups of two or more held-out rows the plan choice was judged on.
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

/// Errors over held-out rows, and plan choice among the held-out rows of each job with
/// the same GPU count.
pub fn metrics(rows: &[&EvaluatedRow]) -> Metrics {
    let mut errors: Vec<f64> = rows.iter().filter(|r| !r.fitted).map(|r| r.rel_error()).collect();
    errors.sort_by(f64::total_cmp);
    let mean = (!errors.is_empty()).then(|| errors.iter().sum::<f64>() / errors.len() as f64);
    let median = (!errors.is_empty()).then(|| {
        let n = errors.len();
        if n % 2 == 1 { errors[n / 2] } else { (errors[n / 2 - 1] + errors[n / 2]) / 2.0 }
    });
    let mut by_gpus: BTreeMap<(String, u32), Vec<&EvaluatedRow>> = BTreeMap::new();
    for r in rows.iter().filter(|r| !r.fitted) {
        by_gpus.entry((r.model.clone(), r.gpus)).or_default().push(r);
    }
    let mut hits = 0;
    let mut regrets = Vec::new();
    for group in by_gpus.values().filter(|g| g.len() >= 2) {
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
    pub perf_model: rubick_model::perf::PerfModel,
}

/// One measured configuration of a job, as the evaluation reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredConfig {
    pub plan: rubick_core::Plan,
    pub placement: Placement,
    pub iter_time_s: f64,
    /// How the source names the configuration (the authors' plan code, or the plan).
    pub code: String,
    /// The family label rows are grouped by in the report.
    pub family: String,
}

/// Evaluates the authors' rows of one model: which rows were fitted is decided by
/// `select` over all rows (`samples` of them), or the fit uses `profiles` when given.
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
    let configs: Vec<MeasuredConfig> = usable
        .iter()
        .map(|(row, plan)| MeasuredConfig {
            plan: *plan,
            placement: row.placement.clone(),
            iter_time_s: row.iter_time_s,
            code: row.code.to_string(),
            family: family_label(&row.code),
        })
        .collect();
    let observations = profiles.map(|runs| runs.iter().filter_map(|r| profile_observation(r, model, links)).collect());
    let source = if profiles.is_some() { "profiles" } else { "placements" };
    evaluate_job(name, model, &configs, links, samples, observations, &format!("reference {source} of {name}"))
}

/// The family label of a plan outside the authors' codes.
pub fn plan_family_label(plan: &rubick_core::Plan) -> String {
    match PlanCode::of(plan) {
        Some(code) => family_label(&code),
        None => plan.family().as_str().to_owned(),
    }
}

/// Measured configurations of another source (a profile table, external rows).
pub fn configs_of(rows: impl IntoIterator<Item = (rubick_core::Plan, Placement, f64)>) -> Vec<MeasuredConfig> {
    rows.into_iter()
        .map(|(plan, placement, iter_time_s)| MeasuredConfig {
            code: plan.to_string(),
            family: plan_family_label(&plan),
            plan,
            placement,
            iter_time_s,
        })
        .collect()
}

/// How many rows of a job of `n` are "profiled" at `samples`: at most `n - 1`, so that
/// one row is held out. `None` when the job has too few rows to judge (a fit needs two
/// configurations, and one must be left to predict).
pub fn samples_for(n: usize, samples: usize) -> Option<usize> {
    (n >= 3).then(|| samples.min(n - 1).max(2))
}

/// The `k` configurations the selection rule would profile, by index, and their
/// measurements as fit observations (only plans and placements decide which).
pub fn profiled(configs: &[MeasuredConfig], k: usize, links: Links) -> (Vec<usize>, Vec<Observation>) {
    let candidates: Vec<Candidate> =
        configs.iter().map(|c| Candidate { plan: c.plan, placement: c.placement.clone() }).collect();
    let chosen = select(&candidates, k);
    let observations = chosen
        .iter()
        .map(|&i| Observation {
            plan: configs[i].plan,
            placement: configs[i].placement.clone(),
            links,
            iter_time_s: configs[i].iter_time_s,
        })
        .collect();
    (chosen, observations)
}

/// Evaluates one job: its `configs` are the truth; the fit sees `samples` of them
/// chosen by the selection rule (at most all but one), or `observations` when given
/// (then every config is held out); every config is predicted.
pub fn evaluate_job(
    name: &str,
    model: &ModelSpec,
    configs: &[MeasuredConfig],
    links: Links,
    samples: usize,
    observations: Option<Vec<Observation>>,
    source: &str,
) -> anyhow::Result<Evaluation> {
    let (chosen, observations): (Vec<usize>, Vec<Observation>) = match observations {
        Some(obs) => (Vec::new(), obs),
        None => {
            let k = samples_for(configs.len(), samples).ok_or_else(|| {
                anyhow::anyhow!(
                    "{name}: {} measured row(s): at least 3 are needed to fit 2 and predict 1",
                    configs.len()
                )
            })?;
            profiled(configs, k, links)
        }
    };
    let start = Instant::now();
    let fitted = fit(model, &observations, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    // Wall time goes to the log, not the summary, which stays byte-identical.
    tracing::info!("{name}: fitted {} rows in {:.1} ms", observations.len(), start.elapsed().as_secs_f64() * 1e3);
    let log_cov = fitted.log_covariance();
    let rows: Vec<EvaluatedRow> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (lower, predicted, upper) =
                rubick_model::fit::interval(model, &c.plan, &c.placement, &links, &fitted.params, &log_cov);
            let is_fitted = chosen.contains(&i);
            EvaluatedRow {
                model: name.to_owned(),
                code: c.code.clone(),
                family: c.family.clone(),
                plan: c.plan.to_string(),
                placement: c.placement.to_string(),
                gpus: c.placement.gpus(),
                measured_s: c.iter_time_s,
                predicted_s: predicted,
                lower_s: lower,
                upper_s: upper,
                fitted: is_fitted,
                flagged: !is_fitted && is_inconsistent(c.iter_time_s, predicted),
            }
        })
        .collect();
    let all: Vec<&EvaluatedRow> = rows.iter().collect();
    let unflagged: Vec<&EvaluatedRow> = rows.iter().filter(|r| !r.flagged).collect();
    let report = ModelReport {
        metrics: metrics(&all),
        unflagged: metrics(&unflagged),
        families: family_metrics(&all),
        fitted: chosen.iter().map(|&i| format!("{}@{}", configs[i].code, configs[i].placement)).collect(),
        flagged_rows: rows
            .iter()
            .filter(|r| r.flagged)
            .map(|r| {
                format!("{}@{} measured {:.3}s predicted {:.3}s", r.code, r.placement, r.measured_s, r.predicted_s)
            })
            .collect(),
        parameters: rubick_model::perfmodel::PARAMS
            .iter()
            .zip(fitted.params.values)
            .map(|(p, v)| (p.name.to_owned(), (v * 1e6).round() / 1e6))
            .collect(),
    };
    let perf_model = crate::perf_model_artifact(model, &observations, &fitted, source);
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

/// What the form's structure alone says of a change of plan: one row of a job fitted
/// (with the form's priors), another predicted, as the ratio of their times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RatioCheck {
    pub model: String,
    /// The fitted row's plan and the predicted one's.
    pub from: String,
    pub to: String,
    pub measured: f64,
    pub predicted: f64,
}

impl RatioCheck {
    /// The error of the predicted ratio, in points (100 x the absolute difference).
    pub fn error_points(&self) -> f64 {
        (self.predicted - self.measured).abs() * 100.0
    }
}

/// The ratio time(sequence parallelism + selective recompute) / time(full recompute)
/// of an external job that measured both (Calculon's Table 5 rows), predicted by a model
/// fitted on the full-recompute row alone; `None` when the job lacks either row.
pub fn sp_selective_ratio(job: &rubick_model::external::ExternalJob) -> anyhow::Result<Option<RatioCheck>> {
    use rubick_core::plan::Recompute;
    let full = job.rows.iter().find(|r| r.plan.recompute == Recompute::Full && !r.plan.sp);
    let seqsel = job.rows.iter().find(|r| r.plan.recompute == Recompute::Selective && r.plan.sp);
    let (Some(full), Some(seqsel)) = (full, seqsel) else { return Ok(None) };
    let links = Links::of_cluster(&job.cluster);
    let observation =
        Observation { plan: full.plan, placement: full.placement.clone(), links, iter_time_s: full.iter_time_s };
    let options = FitOptions { min_configurations: 1, ..FitOptions::default() };
    let fitted = fit(&job.model, &[observation], &options).map_err(|e| anyhow::anyhow!("{}: {e}", job.name))?;
    let predict = |r: &rubick_model::external::ExternalRow| {
        rubick_model::perfmodel::predict(&job.model, &r.plan, &r.placement, &links, &fitted.params).total
    };
    Ok(Some(RatioCheck {
        model: job.name.clone(),
        from: full.plan.to_string(),
        to: seqsel.plan.to_string(),
        measured: seqsel.iter_time_s / full.iter_time_s,
        predicted: predict(seqsel) / predict(full),
    }))
}

/// Jobs listed by name in [`brief`] (the worst first); the rest are counted.
pub const BRIEF_JOBS: usize = 8;

/// The one-screen summary `evaluate` prints unless `--all` (at most 25 lines, whatever
/// the number of jobs): the held-out error, the plan choice, per plan family, the worst
/// jobs, the rows set aside, and where the rest is.
pub fn brief(summary: &Summary) -> String {
    use std::fmt::Write as _;
    let pct = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{:.1} %", 100.0 * x));
    let held = |m: &Metrics| m.rows - m.fitted_rows;
    let o = &summary.overall;
    let mut s = String::new();
    let jobs = summary.models.len();
    let _ = writeln!(
        s,
        "{jobs} job(s), {} measured row(s) ({}): {} per job profiled (chosen by the selection rule), the other {} \
         predicted",
        o.rows,
        summary.source,
        summary.samples,
        held(o)
    );
    let _ = writeln!(
        s,
        "held-out error: mean {}, median {}, max {}",
        pct(o.mean_rel_error),
        pct(o.median_rel_error),
        pct(o.max_rel_error)
    );
    if o.placements_compared > 0 {
        let right = o.plan_choice_accuracy.map_or(0, |a| (a * o.placements_compared as f64).round() as usize);
        let _ = writeln!(
            s,
            "plan choice: the fastest measured plan chosen at {right} of {} GPU count(s); regret mean {}, max {}",
            o.placements_compared,
            pct(o.plan_regret_mean),
            pct(o.plan_regret_max)
        );
    } else {
        s.push_str("plan choice: no GPU count with two held-out rows to compare\n");
    }
    s.push_str("by plan family: held out, mean and max error\n");
    for (family, m) in summary.overall_families.iter().take(8) {
        let _ = writeln!(s, "  {family:<14} {:>5}  {:>8}  {:>8}", held(m), pct(m.mean_rel_error), pct(m.max_rel_error));
    }
    if jobs > 1 {
        let mut worst: Vec<(&String, &ModelReport)> = summary.models.iter().collect();
        worst.sort_by(|a, b| {
            b.1.metrics.mean_rel_error.unwrap_or(-1.0).total_cmp(&a.1.metrics.mean_rel_error.unwrap_or(-1.0))
        });
        let shown = worst.len().min(BRIEF_JOBS);
        let _ = writeln!(s, "jobs, worst first ({shown} of {jobs}): held out, mean and max error, plan regret");
        for (name, r) in worst.iter().take(shown) {
            let m = &r.metrics;
            let name: String = name.chars().take(30).collect();
            let _ = writeln!(
                s,
                "  {name:<30} {:>5}  {:>8}  {:>8}  {:>8}",
                held(m),
                pct(m.mean_rel_error),
                pct(m.max_rel_error),
                pct(m.plan_regret_mean)
            );
        }
    } else if let Some((_, r)) = summary.models.iter().next() {
        let fitted: Vec<&str> = r.fitted.iter().map(String::as_str).take(6).collect();
        let more = if r.fitted.len() > fitted.len() { ", ..." } else { "" };
        let _ = writeln!(s, "profiled rows: {}{more}", fitted.join(", "));
    }
    let flagged: Vec<&str> = summary.models.values().flat_map(|r| r.flagged_rows.iter().map(String::as_str)).collect();
    if flagged.is_empty() {
        s.push_str("rows more than 2x off the prediction: none\n");
    } else {
        let shown: Vec<&str> = flagged.iter().copied().take(2).collect();
        let more = if flagged.len() > shown.len() {
            format!(" and {} more", flagged.len() - shown.len())
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "rows more than 2x off the prediction: {}{more}; without them: mean {}",
            shown.join(", "),
            pct(summary.overall_unflagged.mean_rel_error)
        );
    }
    s.push_str("every job, family and fitted parameter: --all (YAML), or --summary FILE; every row: --rows FILE\n");
    s
}
