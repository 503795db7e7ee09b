//! Fitting the performance model: bounded nonlinear least squares on log error.
//!
//! Residuals are `ln(predicted / measured) / sigma` for every measured row, plus weak
//! log-normal priors that pull each parameter toward its physical default, so that a
//! handful of rows identify what they can and leave the rest at sensible values.
//! Bounds are enforced by the parametrisation `ln θ = ln lo + (ln hi - ln lo) · s(φ)`
//! with the logistic `s`, so the Levenberg-Marquardt solver (crate
//! `levenberg-marquardt`) works on unconstrained `φ`. Several deterministic starts;
//! the lowest cost wins. Standard errors come from `(JᵀJ)⁻¹` at the optimum.

use levenberg_marquardt::{LeastSquaresProblem, LevenbergMarquardt};
use nalgebra::{DMatrix, DVector, Dyn, Owned};

use crate::perfmodel::{Links, PARAMS, Params, idx, predict};
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;

const N: usize = PARAMS.len();
/// Patience of each start's short search, and of the winner's run to convergence.
const SCOUT_PATIENCE: usize = 12;
const POLISH_PATIENCE: usize = 60;

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub plan: Plan,
    pub placement: Placement,
    pub links: Links,
    pub iter_time_s: f64,
}

/// Why a fit could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("no measured rows to fit")]
    NoRows,
    #[error(
        "{rows} row(s) of {distinct} distinct configuration(s): a fit needs at least {needed} different configurations"
    )]
    TooFewConfigurations { rows: usize, distinct: usize, needed: usize },
    #[error("row {row}: iteration time must be a positive, finite number of seconds, got {value}")]
    BadTime { row: usize, value: f64 },
    #[error("row {row}: plan `{plan}` uses {plan_gpus} GPUs but the placement has {placement_gpus}")]
    GpuMismatch { row: usize, plan: Plan, plan_gpus: u32, placement_gpus: u32 },
    #[error("the solver found no finite solution (the rows may contradict the model's form)")]
    NoSolution,
}

/// Settings of a fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitOptions {
    /// Expected log error of one measurement (0.1 ≈ 10 %).
    pub sigma: f64,
    /// Fewest distinct configurations a fit accepts: 2 for a model a user relies on
    /// (one row cannot tell compute from communication); 1 where the question is what
    /// the form's priors and structure alone predict beyond the row (the benchmark of
    /// new terms on two-row jobs).
    pub min_configurations: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions { sigma: 0.1, min_configurations: 2 }
    }
}

/// A fitted model with its uncertainty.
#[derive(Debug, Clone)]
pub struct Fit {
    pub params: Params,
    /// Standard error of each parameter (delta method from the φ covariance).
    pub std_errors: [f64; N],
    /// Covariance of φ, for prediction intervals.
    covariance: DMatrix<f64>,
    phi: DVector<f64>,
    /// Final cost (half the sum of squared residuals incl. priors).
    pub cost: f64,
    /// Start index that won.
    pub start: usize,
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn bounds(i: usize) -> (f64, f64) {
    (PARAMS[i].lower.ln(), PARAMS[i].upper.ln())
}

fn theta_of(phi: &DVector<f64>) -> Params {
    let mut values = [0.0; N];
    for (i, v) in values.iter_mut().enumerate() {
        let (lo, hi) = bounds(i);
        *v = (lo + (hi - lo) * logistic(phi[i].clamp(-40.0, 40.0))).exp();
    }
    Params { values }
}

fn phi_of(theta: &Params) -> DVector<f64> {
    DVector::from_iterator(
        N,
        (0..N).map(|i| {
            let (lo, hi) = bounds(i);
            let t = ((theta.values[i].ln() - lo) / (hi - lo)).clamp(1e-6, 1.0 - 1e-6);
            (t / (1.0 - t)).ln()
        }),
    )
}

/// The compute prior: from the model's measured forward time when it has one
/// (forward ≈ a third of forward + backward), else from the rows themselves.
pub fn compute_prior(model: &ModelSpec, rows: &[Observation]) -> f64 {
    let batch = model.global_batch.max(1) as f64;
    if let Some(ms) = model.forward_1gpu_ms {
        return 3.0 * ms / 1e3 / batch;
    }
    let mut per_sample: Vec<f64> =
        rows.iter().map(|r| 0.7 * r.iter_time_s * f64::from(r.plan.gpus().max(1)) / batch).collect();
    per_sample.sort_by(f64::total_cmp);
    per_sample.get(per_sample.len() / 2).copied().unwrap_or(PARAMS[idx::COMPUTE].prior)
}

struct Problem<'a> {
    model: &'a ModelSpec,
    rows: &'a [Observation],
    /// How many measured rows each (aggregated) row stands for.
    weights: &'a [f64],
    prior: Params,
    sigma: f64,
    phi: DVector<f64>,
}

impl Problem<'_> {
    fn residuals_at(&self, phi: &DVector<f64>) -> DVector<f64> {
        let theta = theta_of(phi);
        let data = self.rows.iter().zip(self.weights).map(|(r, w)| {
            let pred = predict(self.model, &r.plan, &r.placement, &r.links, &theta).total;
            w.sqrt() * (pred.max(1e-12).ln() - r.iter_time_s.ln()) / self.sigma
        });
        let priors =
            (0..N).map(|i| (theta.values[i].ln() - self.prior.values[i].ln()) / PARAMS[i].prior_sigma.max(1e-6));
        DVector::from_iterator(self.rows.len() + N, data.chain(priors))
    }
}

fn jacobian_of(f: impl Fn(&DVector<f64>) -> DVector<f64>, phi: &DVector<f64>, rows: usize) -> DMatrix<f64> {
    let base = f(phi);
    let mut jac = DMatrix::zeros(rows, phi.len());
    for j in 0..phi.len() {
        let h = 1e-6 * (1.0 + phi[j].abs());
        let mut moved = phi.clone();
        moved[j] += h;
        let col = (f(&moved) - &base) / h;
        jac.set_column(j, &col);
    }
    jac
}

impl LeastSquaresProblem<f64, Dyn, Dyn> for Problem<'_> {
    type ResidualStorage = Owned<f64, Dyn>;
    type JacobianStorage = Owned<f64, Dyn, Dyn>;
    type ParameterStorage = Owned<f64, Dyn>;

    fn set_params(&mut self, x: &DVector<f64>) {
        self.phi.copy_from(x);
    }

    fn params(&self) -> DVector<f64> {
        self.phi.clone()
    }

    fn residuals(&self) -> Option<DVector<f64>> {
        let r = self.residuals_at(&self.phi);
        r.iter().all(|x| x.is_finite()).then_some(r)
    }

    fn jacobian(&self) -> Option<DMatrix<f64>> {
        let jac = jacobian_of(|p| self.residuals_at(p), &self.phi, self.rows.len() + N);
        jac.iter().all(|x| x.is_finite()).then_some(jac)
    }
}

/// Checks rows before fitting (at least `min_configurations` distinct ones); the error
/// names the row.
pub fn check_rows(rows: &[Observation], min_configurations: usize) -> Result<(), FitError> {
    if rows.is_empty() {
        return Err(FitError::NoRows);
    }
    for (row, r) in rows.iter().enumerate() {
        if !(r.iter_time_s.is_finite() && r.iter_time_s > 0.0) {
            return Err(FitError::BadTime { row, value: r.iter_time_s });
        }
        if r.plan.gpus() != r.placement.gpus() {
            return Err(FitError::GpuMismatch {
                row,
                plan: r.plan,
                plan_gpus: r.plan.gpus(),
                placement_gpus: r.placement.gpus(),
            });
        }
    }
    let mut distinct: Vec<(&Plan, &Placement)> = rows.iter().map(|r| (&r.plan, &r.placement)).collect();
    distinct.sort();
    distinct.dedup();
    if distinct.len() < min_configurations {
        return Err(FitError::TooFewConfigurations {
            rows: rows.len(),
            distinct: distinct.len(),
            needed: min_configurations,
        });
    }
    Ok(())
}

/// Rows of the same configuration (plan, placement, links) as one row at their
/// geometric mean time, weighted by their number: the same least-squares optimum as
/// every row apart (the sum of squared log errors differs by a constant), at the cost
/// of the distinct configurations only. First occurrence order: deterministic.
fn aggregate(rows: &[Observation]) -> (Vec<Observation>, Vec<f64>) {
    let key = |r: &Observation| {
        (r.plan, r.placement.clone(), [r.links.nvlink_gbps, r.links.network_gbps, r.links.pcie_gbps].map(f64::to_bits))
    };
    let mut index: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    let (mut out, mut sums, mut counts): (Vec<Observation>, Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new(), Vec::new());
    for r in rows {
        let i = *index.entry(key(r)).or_insert_with(|| {
            out.push(r.clone());
            sums.push(0.0);
            counts.push(0.0);
            out.len() - 1
        });
        sums[i] += r.iter_time_s.ln();
        counts[i] += 1.0;
    }
    for ((o, s), n) in out.iter_mut().zip(&sums).zip(&counts) {
        o.iter_time_s = (s / n).exp();
    }
    (out, counts)
}

/// Fits the model of `model` to `rows`.
pub fn fit(model: &ModelSpec, rows: &[Observation], options: &FitOptions) -> Result<Fit, FitError> {
    check_rows(rows, options.min_configurations.max(1))?;
    let (rows, weights) = aggregate(rows);
    let (rows, weights) = (rows.as_slice(), weights.as_slice());
    let prior = Params::prior(compute_prior(model, rows));
    // Deterministic starts: the prior, and the prior with compute or communication
    // scaled, so that a bad basin of either kind is escaped.
    let mut starts = Vec::new();
    for (param, factor) in [(None, 1.0), (Some(idx::COMPUTE), 0.5), (Some(idx::COMPUTE), 1.6), (Some(idx::NET), 0.2)] {
        let mut theta = prior.clone();
        if let Some(i) = param {
            theta.values[i] *= factor;
        }
        starts.push(phi_of(&theta));
    }
    // Every start runs a short search (patience 12: at most 12·(N+1) evaluations), and
    // only the best is then run to convergence. The starts agree on most jobs, and a
    // start crawling along a flat valley no longer costs its full patience.
    let mut best: Option<(f64, usize, DVector<f64>)> = None;
    for (start, phi) in starts.into_iter().enumerate() {
        let problem = Problem { model, rows, weights, prior: prior.clone(), sigma: options.sigma, phi };
        let (solved, _) = LevenbergMarquardt::new().with_patience(SCOUT_PATIENCE).minimize(problem);
        let Some(r) = solved.residuals() else { continue };
        let cost = 0.5 * r.norm_squared();
        if cost.is_finite() && best.as_ref().is_none_or(|(c, _, _)| cost < *c - 1e-12) {
            best = Some((cost, start, solved.phi));
        }
    }
    if let Some((cost, start, phi)) = best.take() {
        let problem = Problem { model, rows, weights, prior: prior.clone(), sigma: options.sigma, phi: phi.clone() };
        let (solved, _) = LevenbergMarquardt::new().with_patience(POLISH_PATIENCE).minimize(problem);
        best = match solved.residuals().map(|r| 0.5 * r.norm_squared()) {
            Some(c) if c.is_finite() && c <= cost => Some((c, start, solved.phi)),
            _ => Some((cost, start, phi)),
        };
    }
    let (cost, start, phi) = best.ok_or(FitError::NoSolution)?;
    let problem = Problem { model, rows, weights, prior, sigma: options.sigma, phi: phi.clone() };
    // Directions the solver cannot move in (a parameter pinned at a bound) may give
    // non-finite differences; they carry no information.
    let jac =
        jacobian_of(|p| problem.residuals_at(p), &phi, rows.len() + N).map(|x| if x.is_finite() { x } else { 0.0 });
    let information = jac.transpose() * &jac;
    // A tiny ridge: a parameter pinned at a bound has no curvature left in φ, and its
    // standard error (dθ/dφ ≈ 0 there) comes out as ~0 instead of undefined.
    let ridge = DMatrix::from_diagonal_element(N, N, 1e-9);
    let covariance = (information + ridge).try_inverse().unwrap_or_else(|| DMatrix::from_element(N, N, f64::NAN));
    let params = theta_of(&phi);
    let mut std_errors = [f64::NAN; N];
    for (i, se) in std_errors.iter_mut().enumerate() {
        let (lo, hi) = bounds(i);
        let s = logistic(phi[i]);
        let dtheta = params.values[i] * (hi - lo) * s * (1.0 - s);
        let var = dtheta * dtheta * covariance[(i, i)];
        *se = if var > 0.0 { var.sqrt() } else { f64::NAN };
    }
    Ok(Fit { params, std_errors, covariance, phi: phi_of(&theta_of(&phi)), cost, start })
}

impl Fit {
    /// The covariance of the parameters' logarithms, `ln θ`, in the form's order (from
    /// the covariance of φ: `d ln θ / d φ = (ln hi - ln lo) s (1 - s)`). Stored in a
    /// `PerfModel` so that `predict` gives the same intervals as the fit.
    pub fn log_covariance(&self) -> DMatrix<f64> {
        let d = DVector::from_iterator(
            N,
            (0..N).map(|i| {
                let (lo, hi) = bounds(i);
                let s = logistic(self.phi[i]);
                (hi - lo) * s * (1.0 - s)
            }),
        );
        let mut cov = self.covariance.clone();
        for i in 0..N {
            for j in 0..N {
                cov[(i, j)] *= d[i] * d[j];
            }
        }
        cov
    }

    /// A prediction with a ~95 % interval from the parameters' covariance (delta
    /// method on the log of the iteration time).
    pub fn predict_interval(
        &self,
        model: &ModelSpec,
        plan: &Plan,
        placement: &Placement,
        links: &Links,
    ) -> (f64, f64, f64) {
        interval(model, plan, placement, links, &self.params, &self.log_covariance())
    }
}

/// A prediction `(low, mid, high)` with a ~95 % interval, from parameters and the
/// covariance of their logarithms (delta method on the log of the iteration time). A
/// covariance that is not finite gives the point prediction only.
pub fn interval(
    model: &ModelSpec,
    plan: &Plan,
    placement: &Placement,
    links: &Links,
    params: &Params,
    log_cov: &DMatrix<f64>,
) -> (f64, f64, f64) {
    let mid = predict(model, plan, placement, links, params).total;
    if log_cov.nrows() != N || log_cov.ncols() != N {
        return (mid, mid, mid);
    }
    let ln_mid = mid.max(1e-12).ln();
    let grad = DVector::from_iterator(
        N,
        (0..N).map(|i| {
            let h: f64 = 1e-5;
            let mut moved = params.clone();
            moved.values[i] *= h.exp();
            (predict(model, plan, placement, links, &moved).total.max(1e-12).ln() - ln_mid) / h
        }),
    );
    let var = (grad.transpose() * log_cov * &grad)[(0, 0)];
    let half = 1.96 * var.max(0.0).sqrt();
    if half.is_finite() { (mid * (-half).exp(), mid, mid * half.exp()) } else { (mid, mid, mid) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rubick_core::cluster::Cluster;

    fn rows(truth: &Params, model: &ModelSpec) -> Vec<Observation> {
        let links = Links::from(&Cluster::example().node_groups[0]);
        [
            ("dp1-mb8-ga2-z0", "1"),
            ("dp2-mb8-z2", "2"),
            ("dp8-mb2-z2", "8"),
            ("dp8-mb2-z2", "44"),
            ("dp16-mb1-z2", "88"),
            ("dp8-mb2-z2-offopt", "8"),
            ("dp4-mb4-z2-gc", "4"),
            ("dp16-mb1", "88"),
        ]
        .iter()
        .map(|(plan, placement)| {
            let plan: Plan = plan.parse().unwrap();
            let placement: Placement = placement.parse().unwrap();
            let iter_time_s = predict(model, &plan, &placement, &links, truth).total;
            Observation { plan, placement, links, iter_time_s }
        })
        .collect()
    }

    #[test]
    fn recovers_what_it_generated() {
        let mut model = ModelSpec::example();
        model.global_batch = 16;
        let mut truth = Params::prior(0.3);
        truth.values[idx::NET] = 0.2;
        truth.values[idx::GC] = 1.4;
        let data = rows(&truth, &model);
        let fit = fit(&model, &data, &FitOptions::default()).unwrap();
        for r in &data {
            let pred = predict(&model, &r.plan, &r.placement, &r.links, &fit.params).total;
            assert!((pred / r.iter_time_s - 1.0).abs() < 0.03, "{} {} {pred} {}", r.plan, r.placement, r.iter_time_s);
        }
        let (lo, mid, hi) = fit.predict_interval(&model, &data[2].plan, &data[2].placement, &data[2].links);
        assert!(lo <= mid && mid <= hi);
    }

    /// A profile of a million rows fits in seconds: repeated configurations are fitted as
    /// one weighted row, with the same optimum as every row apart.
    #[test]
    fn repeated_rows_fit_as_their_configurations() {
        let mut model = ModelSpec::example();
        model.global_batch = 16;
        let data = rows(&Params::prior(0.3), &model);
        let mut many = Vec::new();
        for k in 0..2000 {
            for r in &data {
                let mut r = r.clone();
                r.iter_time_s *= 1.0 + 0.01 * f64::from(k % 3) - 0.01;
                many.push(r);
            }
        }
        let (agg, weights) = aggregate(&many);
        assert_eq!(agg.len(), data.len());
        assert!(weights.iter().all(|w| (*w - 2000.0).abs() < 1e-9));
        let big = fit(&model, &many, &FitOptions::default()).unwrap();
        for r in &data {
            let pred = predict(&model, &r.plan, &r.placement, &r.links, &big.params).total;
            assert!((pred / r.iter_time_s - 1.0).abs() < 0.05, "{} {pred} {}", r.plan, r.iter_time_s);
        }
    }

    #[test]
    fn degenerate_rows_are_errors_not_panics() {
        let model = ModelSpec::example();
        assert_eq!(fit(&model, &[], &FitOptions::default()).unwrap_err(), FitError::NoRows);
        let mut data = rows(&Params::prior(0.3), &model);
        data[1].iter_time_s = f64::NAN;
        assert!(matches!(fit(&model, &data, &FitOptions::default()), Err(FitError::BadTime { row: 1, .. })));
        data[1].iter_time_s = 0.0;
        assert!(matches!(fit(&model, &data, &FitOptions::default()), Err(FitError::BadTime { row: 1, .. })));
        // One row, or all rows measuring one configuration: nothing to fit.
        let one = vec![rows(&Params::prior(0.3), &model)[0].clone()];
        assert!(matches!(fit(&model, &one, &FitOptions::default()), Err(FitError::TooFewConfigurations { .. })));
        let same = vec![one[0].clone(); 5];
        assert!(matches!(fit(&model, &same, &FitOptions::default()), Err(FitError::TooFewConfigurations { .. })));
        // Two configurations are enough: the priors keep the problem well posed.
        let two = rows(&Params::prior(0.3), &model)[..2].to_vec();
        assert!(fit(&model, &two, &FitOptions::default()).is_ok());
    }
}
