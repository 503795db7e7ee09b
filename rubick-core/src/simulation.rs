//! The `SimulationSummary` artifact: what one policy did on one trace, over seeds.
//!
//! Every figure is a [`Spread`] over the replicas (seeds of the truth's noise): one
//! run of a scheduler on a trace is chaotic, so a comparison reads means and spreads.
//! No wall time goes in (the same inputs give the same bytes); `make bench` reports
//! how long a simulation takes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{ApiVersion, Artifact, Kind};
use crate::error::{ValidationError, ensure};

/// A figure over the replicas: mean, sample standard deviation, least and most.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub mean: f64,
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (NaN ones left out; all NaN or none: NaN), rounded to
    /// 0.01 (to 1e-4 below 10, for shares).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Spread { mean: f64::NAN, sd: f64::NAN, min: f64::NAN, max: f64::NAN };
        }
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let sd = if v.len() > 1 { (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let r = |x: f64| if x.abs() < 10.0 { (x * 1e4).round() / 1e4 } else { (x * 100.0).round() / 100.0 };
        Spread { mean: r(mean), sd: r(sd), min: r(min), max: r(max) }
    }
}

impl Spread {
    /// No replica had the figure (all NaN): what a summary written before the figure
    /// existed reads as.
    pub fn none() -> Self {
        Spread { mean: f64::NAN, sd: f64::NAN, min: f64::NAN, max: f64::NAN }
    }

    /// A spread as [`Spread::of`] writes it: all NaN (no replica had the figure), or
    /// finite with `0 <= min <= mean <= max` and `sd >= 0` (every figure of a summary
    /// is a duration, a count or a share, none negative); `share`: at most 1 too.
    fn check(&self, field: &str, share: bool) -> Result<(), ValidationError> {
        let all = [self.mean, self.sd, self.min, self.max];
        if all.iter().all(|x| x.is_nan()) {
            return Ok(());
        }
        ensure(all.iter().all(|x| x.is_finite()), field, || {
            "mean, sd, min and max must be finite numbers (or all .nan: no replica had the figure)".into()
        })?;
        ensure(self.sd >= 0.0, &format!("{field}.sd"), || format!("must be at least 0, not {}", self.sd))?;
        ensure(self.min >= 0.0, &format!("{field}.min"), || format!("must be at least 0, not {}", self.min))?;
        ensure(self.min <= self.mean && self.mean <= self.max, field, || {
            format!("must have min <= mean <= max, not {} <= {} <= {}", self.min, self.mean, self.max)
        })?;
        ensure(!share || self.max <= 1.0, &format!("{field}.max"), || {
            format!("is a share: at most 1, not {}", self.max)
        })
    }
}

impl TruthShares {
    fn check(&self, field: &str) -> Result<(), ValidationError> {
        self.measured.check(&format!("{field}.measured"), true)?;
        self.interpolated.check(&format!("{field}.interpolated"), true)?;
        self.extrapolated.check(&format!("{field}.extrapolated"), true)
    }
}

/// Share of running time by how the truth of its configuration was known.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TruthShares {
    pub measured: Spread,
    pub interpolated: Spread,
    pub extrapolated: Spread,
}

/// One model's jobs in a simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelOutcome {
    pub model: String,
    pub jobs: usize,
    /// Average JCT of its finished jobs.
    pub avg_jct_s: Spread,
    pub unfinished: Spread,
    pub truth: TruthShares,
    /// The oracle's in-sample mean relative error on this model's measured rows
    /// (absent without an oracle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle_error: Option<f64>,
    /// Measured rows the oracle was fitted on.
    #[serde(default)]
    pub oracle_rows: usize,
}

/// A `SimulationSummary` artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimulationSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// The trace's name (its file stem).
    pub trace: String,
    pub policy: String,
    pub queue: String,
    /// How unmeasured configurations got their truth.
    pub truth_mode: TruthMode,
    /// Only measured configurations were offered.
    #[serde(default)]
    pub measured_only: bool,
    /// Extrapolated configurations ran this share slower than the truth otherwise says.
    #[serde(default)]
    pub extrapolated_slowdown: f64,
    /// Log-normal noise (sigma) on true iteration times.
    pub noise: f64,
    /// Replicas, seeds `firstSeed..firstSeed + seeds`.
    pub seeds: u32,
    pub first_seed: u64,
    pub jobs: usize,
    pub guaranteed_jobs: usize,
    /// Jobs that had not finished when the simulation stopped (they never could start,
    /// or the 90-day limit came): the averages below leave them out, `avgJctAllS`
    /// counts them up to the end.
    pub unfinished: Spread,
    /// Average JCT of the finished jobs.
    pub avg_jct_s: Spread,
    /// Average over every job, an unfinished one counted until the simulation ended (a
    /// lower bound of its JCT).
    pub avg_jct_all_s: Spread,
    pub median_jct_s: Spread,
    pub p99_jct_s: Spread,
    /// The end of the round the last job finished in; with jobs unfinished, at least
    /// when the simulation stopped (censored: a lower bound).
    pub makespan_s: Spread,
    pub restarts: Spread,
    /// The most restarts of any one job.
    #[serde(default = "Spread::none")]
    pub restarts_max: Spread,
    /// Pauses of running jobs (each resume is a restart).
    #[serde(default = "Spread::none")]
    pub pauses: Spread,
    pub plan_changes: Spread,
    pub gpu_hours: Spread,
    /// GPU-hours held while restarting (checkpoint, relaunch, warm-up; first starts
    /// left out).
    #[serde(default = "Spread::none")]
    pub restart_gpu_hours: Spread,
    /// Guaranteed jobs whose guarantee did not hold at some point after admission
    /// (paused, or below the truth of their request).
    pub guarantee_violations: Spread,
    /// Hours guaranteed jobs spent paused or below their guarantee, in all.
    pub violation_hours: Spread,
    pub truth: TruthShares,
    pub rounds: Spread,
    pub decisions: Spread,
    pub per_model: Vec<ModelOutcome>,
    /// JCT of every finished job of the first replica, sorted (for CDF plots).
    pub jct_s: Vec<f64>,
    /// Jobs of the first replica by their restarts: entry `k` counts the jobs restarted
    /// `k` times, the last entry those restarted that many times or more (for
    /// histograms).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_counts: Vec<u64>,
}

impl Artifact for SimulationSummary {
    crate::artifact_header!(Kind::SimulationSummary);

    fn validate(&self) -> Result<(), ValidationError> {
        ensure(self.seeds >= 1, "seeds", || "must be at least 1".into())?;
        ensure(self.noise.is_finite() && self.noise >= 0.0, "noise", || "must be a non-negative number".into())?;
        ensure(self.jct_s.windows(2).all(|w| w[0] <= w[1]), "jctS", || "must be sorted".into())?;
        ensure(self.jct_s.iter().all(|x| x.is_finite() && *x >= 0.0), "jctS", || {
            "must be finite, non-negative seconds".into()
        })?;
        ensure(
            self.extrapolated_slowdown.is_finite() && self.extrapolated_slowdown >= 0.0,
            "extrapolatedSlowdown",
            || "must be a non-negative number".into(),
        )?;
        let figures = [
            ("unfinished", &self.unfinished),
            ("avgJctS", &self.avg_jct_s),
            ("avgJctAllS", &self.avg_jct_all_s),
            ("medianJctS", &self.median_jct_s),
            ("p99JctS", &self.p99_jct_s),
            ("makespanS", &self.makespan_s),
            ("restarts", &self.restarts),
            ("restartsMax", &self.restarts_max),
            ("pauses", &self.pauses),
            ("planChanges", &self.plan_changes),
            ("gpuHours", &self.gpu_hours),
            ("restartGpuHours", &self.restart_gpu_hours),
            ("guaranteeViolations", &self.guarantee_violations),
            ("violationHours", &self.violation_hours),
            ("rounds", &self.rounds),
            ("decisions", &self.decisions),
        ];
        for (field, spread) in figures {
            spread.check(field, false)?;
        }
        self.truth.check("truth")?;
        for (i, m) in self.per_model.iter().enumerate() {
            let at = format!("perModel[{i}]");
            m.avg_jct_s.check(&format!("{at}.avgJctS"), false)?;
            m.unfinished.check(&format!("{at}.unfinished"), false)?;
            m.truth.check(&format!("{at}.truth"))?;
            ensure(m.oracle_error.is_none_or(|e| e.is_finite() && e >= 0.0), &format!("{at}.oracleError"), || {
                "must be a non-negative number".into()
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_replicas() {
        let s = Spread::of([1.0, 2.0, 3.0]);
        assert_eq!((s.mean, s.sd, s.min, s.max), (2.0, 1.0, 1.0, 3.0));
        assert_eq!(Spread::of([5.0]).sd, 0.0);
        assert!(Spread::of([f64::NAN]).mean.is_nan());
    }

    #[test]
    fn a_spread_is_all_nan_or_ordered_finite_figures() {
        let ok = |s: Spread, share| s.check("f", share).is_ok();
        assert!(ok(Spread::of([1.0, 2.0, 3.0]), false));
        assert!(ok(Spread::of([f64::NAN]), false));
        assert!(ok(Spread::of([0.25, 0.5]), true));
        let nan = f64::NAN;
        assert!(!ok(Spread { mean: nan, sd: 0.0, min: 1.0, max: 1.0 }, false), "NaN beside numbers");
        assert!(!ok(Spread { mean: f64::INFINITY, sd: 0.0, min: 1.0, max: f64::INFINITY }, false));
        assert!(!ok(Spread { mean: 1.0, sd: -0.5, min: 1.0, max: 1.0 }, false), "negative sd");
        assert!(!ok(Spread { mean: -1.0, sd: 0.0, min: -1.0, max: -1.0 }, false), "negative figure");
        assert!(!ok(Spread { mean: 5.0, sd: 0.0, min: 1.0, max: 2.0 }, false), "mean above max");
        assert!(!ok(Spread { mean: 1.5, sd: 0.0, min: 1.5, max: 1.5 }, true), "a share above 1");
        let e = Spread { mean: 1.0, sd: -1.0, min: 1.0, max: 1.0 }.check("avgJctS", false).unwrap_err();
        assert_eq!(e.field, "avgJctS.sd");
    }
}

/// Which rule gives the truth of an unmeasured configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TruthMode {
    /// Measured rows, scaled by an oracle fitted on all of them; the oracle elsewhere.
    Oracle,
    /// Measured rows as they are; the policy's own belief elsewhere (the old rule).
    Belief,
}

impl TruthMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TruthMode::Oracle => "oracle",
            TruthMode::Belief => "belief",
        }
    }
}
