//! How simulation summaries read: one summary as the log lines `simulate` prints, several
//! side by side as the Markdown table of `compare`, and the labels of their figures.

use std::time::Duration;

use rubick_core::markdown;
use rubick_core::simulation::{SimulationSummary, Spread};
use rubick_sim::truth::TruthMode;

/// A figure over replicas: mean ± sample standard deviation with `decimals` decimals
/// (the mean alone for one replica).
fn spread(x: &Spread, seeds: u32, decimals: usize) -> String {
    if seeds > 1 {
        format!("{:.*} ± {:.*}", decimals, x.mean, decimals, x.sd)
    } else {
        format!("{:.*}", decimals, x.mean)
    }
}

/// How a run's truth differs from the default, for labels: `""`, `" (measured only)"`,
/// `" (belief truth)"`, `" (extrapolated 30 % slower)"`.
fn truth_label(s: &SimulationSummary) -> String {
    let mut parts = Vec::new();
    if s.truth_mode == TruthMode::Belief {
        parts.push("belief truth".to_owned());
    }
    if s.measured_only {
        parts.push("measured only".to_owned());
    }
    if s.extrapolated_slowdown > 0.0 {
        parts.push(format!("extrapolated {:.0} % slower", s.extrapolated_slowdown * 100.0));
    }
    if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
}

/// The policy and its admission order, e.g. `rubick (fifo)`: a run's series in the
/// figures of `simulate`.
pub(super) fn policy_label(s: &SimulationSummary) -> String {
    format!("{} ({})", s.policy, s.queue)
}

/// The trace, its truth, the policy and its admission order: a run's series in the
/// figures of `compare`.
pub(super) fn run_label(s: &SimulationSummary) -> String {
    format!("{}{} {}", s.trace, truth_label(s), policy_label(s))
}

/// The summary on stderr, taking `wall`: one line, the unfinished jobs, the per-model
/// truth shares.
pub(super) fn log(s: &SimulationSummary, wall: Duration) {
    let pm = |x: &Spread| spread(x, s.seeds, 0);
    tracing::info!(
        "{} on {}: avg JCT {} s, makespan {} s, {} restarts ({:.2} per job, at most {:.0}), {:.1} % extrapolated; {} replica(s) in {:.2} s",
        policy_label(s),
        s.trace,
        pm(&s.avg_jct_s),
        pm(&s.makespan_s),
        pm(&s.restarts),
        s.restarts.mean / s.jobs.max(1) as f64,
        s.restarts_max.max,
        s.truth.extrapolated.mean * 100.0,
        s.seeds,
        wall.as_secs_f64()
    );
    if s.unfinished.max > 0.0 {
        tracing::warn!(
            "{} of {} jobs did not finish (mean over replicas {:.1}): average JCT counts finished jobs only; with \
             the unfinished ones counted until the end: {} s (a lower bound)",
            s.unfinished.max,
            s.jobs,
            s.unfinished.mean,
            pm(&s.avg_jct_all_s)
        );
    }
    for m in &s.per_model {
        tracing::debug!(
            "{}: {} jobs, avg JCT {} s; time measured {:.1} %, interpolated {:.1} %, extrapolated {:.1} %",
            m.model,
            m.jobs,
            pm(&m.avg_jct_s),
            m.truth.measured.mean * 100.0,
            m.truth.interpolated.mean * 100.0,
            m.truth.extrapolated.mean * 100.0
        );
    }
}

/// The summaries side by side, one row each.
pub(super) fn markdown(summaries: &[SimulationSummary]) -> String {
    let mut table = markdown::Table::new(&[
        "trace",
        "policy",
        "queue",
        "seeds",
        "unfinished",
        "avg JCT (s)",
        "median JCT (s)",
        "p99 JCT (s)",
        "makespan (s)",
        "restarts",
        "restarts per job (most)",
        "GPU-hours",
        "GPU-hours restarting",
        "guarantee violations",
        "extrapolated",
    ]);
    for s in summaries {
        let pm = |x: &Spread, decimals: usize| spread(x, s.seeds, decimals);
        let most = if s.restarts_max.mean.is_nan() { "-".to_owned() } else { format!("{:.0}", s.restarts_max.max) };
        table.row(&[
            format!("{}{}", s.trace, truth_label(s)),
            s.policy.clone(),
            s.queue.clone(),
            s.seeds.to_string(),
            pm(&s.unfinished, 1),
            pm(&s.avg_jct_s, 0),
            pm(&s.median_jct_s, 0),
            pm(&s.p99_jct_s, 0),
            pm(&s.makespan_s, 0),
            pm(&s.restarts, 1),
            format!("{:.2} ({most})", s.restarts.mean / s.jobs.max(1) as f64),
            pm(&s.gpu_hours, 1),
            pm(&s.restart_gpu_hours, 1),
            pm(&s.guarantee_violations, 1),
            format!("{:.1} %", s.truth.extrapolated.mean * 100.0),
        ]);
    }
    table.to_string()
}
