//! The summary of a simulation's replicas: every figure as mean and spread.

use crate::truth::Truth;
use rubick_core::simulation::{ModelOutcome, SimulationSummary, Spread, TruthShares};

use crate::engine::{SimConfig, SimResult};

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Shares of running time by basis, of the jobs `keep` selects, per replica.
fn shares(results: &[SimResult], keep: impl Fn(&crate::JobResult) -> bool) -> TruthShares {
    let per: Vec<[f64; 3]> = results
        .iter()
        .map(|r| {
            let mut s = [0.0; 3];
            for j in r.jobs.iter().filter(|j| keep(j)) {
                for (k, v) in j.basis_s.iter().enumerate() {
                    s[k] += v;
                }
            }
            let total: f64 = s.iter().sum();
            s.map(|x| if total > 0.0 { x / total } else { f64::NAN })
        })
        .collect();
    TruthShares {
        measured: Spread::of(per.iter().map(|s| s[0])),
        interpolated: Spread::of(per.iter().map(|s| s[1])),
        extrapolated: Spread::of(per.iter().map(|s| s[2])),
    }
}

/// The summary of the replicas `results` (one per seed, in seed order) of a simulation
/// of `trace` under `config`, judged by `truth`.
pub fn summarize(trace: &str, config: &SimConfig, truth: &Truth, results: &[SimResult]) -> SimulationSummary {
    let figure = |f: &dyn Fn(&SimResult) -> f64| Spread::of(results.iter().map(f));
    let finished_jct = |r: &SimResult| {
        let mut v: Vec<f64> = r.jobs.iter().filter_map(|j| j.jct_s()).map(r2).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let mut models: Vec<&str> =
        results.first().map(|r| r.jobs.iter().map(|j| j.model.as_str()).collect()).unwrap_or_default();
    models.sort_unstable();
    models.dedup();
    let per_model = models
        .iter()
        .map(|&m| {
            let oracle = truth.oracles.get(m);
            ModelOutcome {
                model: m.to_owned(),
                jobs: results.first().map_or(0, |r| r.jobs.iter().filter(|j| j.model == m).count()),
                avg_jct_s: figure(&|r| {
                    mean(&r.jobs.iter().filter(|j| j.model == m).filter_map(|j| j.jct_s()).collect::<Vec<_>>())
                }),
                unfinished: figure(&|r| r.jobs.iter().filter(|j| j.model == m && j.finish_s.is_none()).count() as f64),
                truth: shares(results, |j| j.model == m),
                oracle_error: oracle.map(|o| (o.mean_error * 1e4).round() / 1e4),
                oracle_rows: oracle.map_or(0, |o| o.rows),
            }
        })
        .collect();
    let mut summary = SimulationSummary {
        api_version: None,
        kind: None,
        trace: trace.to_owned(),
        policy: config.policy.name.to_owned(),
        queue: config.queue.as_str().to_owned(),
        truth_mode: truth.mode,
        measured_only: config.measured_only,
        extrapolated_slowdown: truth.extrapolated_slowdown,
        noise: config.noise_sigma,
        seeds: results.len() as u32,
        first_seed: config.seed,
        jobs: results.first().map_or(0, |r| r.jobs.len()),
        guaranteed_jobs: results.first().map_or(0, |r| r.jobs.iter().filter(|j| j.guaranteed).count()),
        unfinished: figure(&|r| r.jobs.iter().filter(|j| j.finish_s.is_none()).count() as f64),
        avg_jct_s: figure(&|r| mean(&finished_jct(r))),
        avg_jct_all_s: figure(&|r| {
            mean(&r.jobs.iter().map(|j| j.finish_s.unwrap_or(r.end_s.max(j.submit_s)) - j.submit_s).collect::<Vec<_>>())
        }),
        median_jct_s: figure(&|r| quantile(&finished_jct(r), 0.5)),
        p99_jct_s: figure(&|r| quantile(&finished_jct(r), 0.99)),
        makespan_s: figure(&|r| r.makespan_s),
        restarts: figure(&|r| r.jobs.iter().map(|j| f64::from(j.restarts)).sum()),
        restarts_max: figure(&|r| r.jobs.iter().map(|j| f64::from(j.restarts)).fold(0.0, f64::max)),
        pauses: figure(&|r| r.jobs.iter().map(|j| f64::from(j.pauses)).sum()),
        plan_changes: figure(&|r| r.jobs.iter().map(|j| f64::from(j.plan_changes)).sum()),
        gpu_hours: figure(&|r| r.jobs.iter().map(|j| j.gpu_hours).sum()),
        restart_gpu_hours: figure(&|r| r.jobs.iter().map(|j| j.restart_gpu_hours).sum()),
        guarantee_violations: figure(&|r| r.jobs.iter().filter(|j| j.guaranteed && !j.guarantee_held()).count() as f64),
        violation_hours: figure(&|r| r.jobs.iter().map(|j| j.violation_s).sum::<f64>() / 3600.0),
        truth: shares(results, |_| true),
        rounds: figure(&|r| r.rounds as f64),
        decisions: figure(&|r| r.decisions as f64),
        per_model,
        jct_s: results.first().map(finished_jct).unwrap_or_default(),
        restart_counts: results.first().map(|r| restart_counts(&r.jobs)).unwrap_or_default(),
    };
    rubick_core::Artifact::stamp(&mut summary);
    summary
}

/// The last bucket of [`SimulationSummary::restart_counts`]: this many restarts or more.
pub const RESTART_BUCKETS: usize = 11;

/// Jobs by their restarts, the last bucket ([`RESTART_BUCKETS`] - 1) and more together.
pub fn restart_counts(jobs: &[crate::JobResult]) -> Vec<u64> {
    let mut counts = vec![0u64; RESTART_BUCKETS];
    for j in jobs {
        counts[(j.restarts as usize).min(RESTART_BUCKETS - 1)] += 1;
    }
    counts
}
