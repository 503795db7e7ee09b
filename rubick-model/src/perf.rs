//! The `PerfModel` artifact: a job's fitted performance-model parameters.
//!
//! The model form itself (how parameters turn into iteration time) is versioned by
//! `form`; fitting is [`crate::fit`], evaluation [`crate::perfmodel`].

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use rubick_core::artifact::{ApiVersion, Artifact, Kind};
use rubick_core::error::{ValidationError, ensure};
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;

/// A `PerfModel` artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PerfModel {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// The model (job) these parameters describe.
    pub model: String,
    /// The model's specification, so that the fitted model predicts on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_spec: Option<rubick_core::model::ModelSpec>,
    /// Name and version of the model form, e.g. `rubick-whitebox/3`.
    pub form: String,
    /// Fitted parameters by name.
    pub parameters: BTreeMap<String, FittedParameter>,
    /// Where the fit came from.
    pub fitted_from: FitSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<FitDiagnostics>,
}

/// One parameter with its uncertainty and bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FittedParameter {
    pub value: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std_error: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper: Option<f64>,
}

/// The data a model was fitted from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FitSource {
    /// Profile table path or description.
    pub source: String,
    pub rows: u32,
}

/// How well the model explains its data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FitDiagnostics {
    pub mean_rel_error: f64,
    /// Covariance of the parameters' natural logarithms, rows and columns in the
    /// form's parameter order: what `predict` turns into ~95 % intervals.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_covariance: Vec<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cv_mean_rel_error: Option<f64>,
    #[serde(default)]
    pub rows: Vec<RowFit>,
    /// Rows the model cannot explain (off by more than 2x), listed for humans.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inconsistent_rows: Vec<RowFit>,
}

/// The fit on one profiled row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowFit {
    pub plan: Plan,
    pub placement: Placement,
    pub measured_s: f64,
    pub predicted_s: f64,
}

impl PerfModel {
    /// The parameters in the form's order (unlisted ones at their prior centre);
    /// another form or an unknown parameter name is an error naming the field.
    pub fn params(&self) -> Result<crate::perfmodel::Params, ValidationError> {
        use crate::perfmodel::{FORM, FORM_V1, FORM_V2, PARAMS, Params, idx};
        ensure([FORM, FORM_V2, FORM_V1].contains(&self.form.as_str()), "form", || {
            format!("`{}` is not supported (expected `{FORM}`, `{FORM_V2}` or `{FORM_V1}`)", self.form)
        })?;
        let mut params = Params::prior(PARAMS[0].prior);
        if self.form == FORM_V1 {
            // The old form had no cost per micro-batch step.
            params.values[idx::STEP] = PARAMS[idx::STEP].lower;
            ensure(!self.parameters.contains_key(PARAMS[idx::STEP].name), "parameters", || {
                format!("`{}` is not a parameter of {FORM_V1}", PARAMS[idx::STEP].name)
            })?;
        }
        for (name, p) in &self.parameters {
            let i = PARAMS.iter().position(|s| s.name == name).ok_or_else(|| {
                ValidationError::new(format!("parameters.{name}"), format!("not a parameter of {FORM}"))
            })?;
            params.values[i] = p.value;
        }
        Ok(params)
    }
}

/// A measured time more than this factor from its prediction is listed apart.
pub const FLAG_FACTOR: f64 = 2.0;

/// Whether a measured time is more than [`FLAG_FACTOR`] away from its prediction.
pub fn is_inconsistent(measured_s: f64, predicted_s: f64) -> bool {
    !(1.0 / FLAG_FACTOR..=FLAG_FACTOR).contains(&(measured_s / predicted_s))
}

impl PerfModel {
    /// The artifact of a fit: parameters with standard errors and bounds, the model
    /// spec, and the fit on every row (rows more than [`FLAG_FACTOR`] off listed apart).
    /// Shared by `rubick-fit fit` and `rubick-run`'s online refit.
    pub fn of_fit(
        spec: &rubick_core::ModelSpec,
        rows: &[crate::fit::Observation],
        fitted: &crate::fit::Fit,
        source: &str,
    ) -> PerfModel {
        use crate::perfmodel::{FORM, PARAMS, predict};
        let row_fits: Vec<RowFit> = rows
            .iter()
            .map(|r| RowFit {
                plan: r.plan,
                placement: r.placement.clone(),
                measured_s: r.iter_time_s,
                predicted_s: predict(spec, &r.plan, &r.placement, &r.links, &fitted.params).total,
            })
            .collect();
        let mean = row_fits.iter().map(|r| (r.predicted_s / r.measured_s - 1.0).abs()).sum::<f64>()
            / row_fits.len().max(1) as f64;
        let (inconsistent, consistent): (Vec<RowFit>, Vec<RowFit>) =
            row_fits.into_iter().partition(|r| is_inconsistent(r.measured_s, r.predicted_s));
        let parameters = PARAMS
            .iter()
            .zip(fitted.params.values)
            .zip(fitted.std_errors)
            .map(|((spec, value), se)| {
                (
                    spec.name.to_owned(),
                    FittedParameter {
                        value,
                        std_error: se.is_finite().then_some(se),
                        lower: Some(spec.lower),
                        upper: Some(spec.upper),
                    },
                )
            })
            .collect();
        PerfModel {
            api_version: None,
            kind: None,
            model: spec.name.clone(),
            model_spec: Some(spec.clone()),
            form: FORM.to_owned(),
            parameters,
            fitted_from: FitSource { source: source.to_owned(), rows: rows.len() as u32 },
            diagnostics: Some(FitDiagnostics {
                mean_rel_error: mean,
                log_covariance: {
                    let cov = fitted.log_covariance();
                    (0..cov.nrows())
                        .map(|i| {
                            (0..cov.ncols()).map(|j| if cov[(i, j)].is_finite() { cov[(i, j)] } else { 0.0 }).collect()
                        })
                        .collect()
                },
                cv_mean_rel_error: None,
                rows: consistent,
                inconsistent_rows: inconsistent,
            }),
        }
    }
}

impl PerfModel {
    /// The stored covariance of the parameters' logarithms, when it has the form's shape.
    pub fn log_covariance(&self) -> Option<nalgebra::DMatrix<f64>> {
        let cov = &self.diagnostics.as_ref()?.log_covariance;
        let n = crate::perfmodel::PARAMS.len();
        if cov.len() != n
            || cov.iter().any(|r| r.len() != n)
            || ![crate::perfmodel::FORM, crate::perfmodel::FORM_V2].contains(&self.form.as_str())
        {
            return None;
        }
        Some(nalgebra::DMatrix::from_fn(n, n, |i, j| cov[i][j]))
    }

    /// A ~95 % interval `(low, mid, high)` of the iteration time; without a stored
    /// covariance the interval is the point itself.
    pub fn predict_interval(
        &self,
        params: &crate::perfmodel::Params,
        plan: &Plan,
        placement: &Placement,
        links: &crate::perfmodel::Links,
    ) -> Option<(f64, f64, f64)> {
        let spec = self.model_spec.as_ref()?;
        let cov = self.log_covariance()?;
        Some(crate::fit::interval(spec, plan, placement, links, params, &cov))
    }
}

impl Artifact for PerfModel {
    rubick_core::artifact_header!(Kind::PerfModel);

    fn validate(&self) -> Result<(), ValidationError> {
        ensure(!self.model.trim().is_empty(), "model", || "must not be empty".into())?;
        ensure(!self.form.trim().is_empty(), "form", || "must not be empty".into())?;
        for (name, p) in &self.parameters {
            let field = format!("parameters.{name}");
            ensure(p.value.is_finite(), &field, || format!("value must be finite, got {}", p.value))?;
            if let (Some(lo), Some(hi)) = (p.lower, p.upper) {
                ensure(lo <= hi, &field, || format!("lower bound {lo} exceeds upper bound {hi}"))?;
            }
            if let Some(lo) = p.lower {
                ensure(p.value >= lo, &field, || format!("value {} is below its lower bound {lo}", p.value))?;
            }
            if let Some(hi) = p.upper {
                ensure(p.value <= hi, &field, || format!("value {} is above its upper bound {hi}", p.value))?;
            }
            if let Some(se) = p.std_error {
                ensure(se.is_finite() && se >= 0.0, &format!("{field}.stdError"), || {
                    format!("must be a non-negative number, got {se}")
                })?;
            }
        }
        if let Some(d) = &self.diagnostics {
            ensure(d.log_covariance.iter().flatten().all(|x| x.is_finite()), "diagnostics.logCovariance", || {
                "every entry must be a finite number".into()
            })?;
        }
        // What `predict` will refuse is refused here: another form, an unknown parameter.
        self.params()?;
        Ok(())
    }
}
