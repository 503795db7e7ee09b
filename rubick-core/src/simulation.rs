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
use crate::truth::TruthMode;

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
    pub makespan_s: Spread,
    pub restarts: Spread,
    pub plan_changes: Spread,
    pub gpu_hours: Spread,
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
}

impl Artifact for SimulationSummary {
    crate::artifact_header!(Kind::SimulationSummary);

    fn validate(&self) -> Result<(), ValidationError> {
        ensure(self.seeds >= 1, "seeds", || "must be at least 1".into())?;
        ensure(self.noise.is_finite() && self.noise >= 0.0, "noise", || "must be a non-negative number".into())?;
        ensure(self.jct_s.windows(2).all(|w| w[0] <= w[1]), "jctS", || "must be sorted".into())?;
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
}
