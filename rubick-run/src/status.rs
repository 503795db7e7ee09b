//! `rubick-run status`: what runs where and how fast (table, YAML, Prometheus, plot).

#[allow(clippy::wildcard_imports)]
use crate::*;

/// The retries a job has left, where they matter: a queued job (its next failure may
/// spend one) whose reason does not already say; nothing for a finished, failed or
/// stopped job, which is never retried.
fn retries_note(r: &JobRecord) -> String {
    let said = r.reason.as_deref().is_some_and(|why| why.contains("retries left"));
    if r.status == JobStatus::Queued && !said {
        format!("; {} {} left", r.retries_left, if r.retries_left == 1 { "retry" } else { "retries" })
    } else {
        String::new()
    }
}

pub(crate) fn status(
    args: &StateArgs,
    format: StatusFormat,
    output: &Path,
    plot: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    ensure_outside(&dir, output)?;
    if let Some(p) = plot {
        ensure_outside(&dir, p)?;
    }
    let (state, _) = refreshed(&dir)?;
    let mut rows = Vec::new();
    for (name, r) in &state.jobs {
        let mean = r.run.as_ref().and_then(|run| {
            backends::progress(&dir.attempt_dir(name, run.attempt), r.job.iterations).recent_iter_time_s
        });
        rows.push((name, r, mean));
    }
    // What the round that placed each running job predicted (seconds per iteration).
    let applied: Option<Schedule> =
        dir.current_path().exists().then(|| load_artifact(&dir.current_path())).transpose().unwrap_or(None);
    let predicted_s = |name: &str, r: &JobRecord| -> Option<f64> {
        let a = applied.as_ref()?.assignments.iter().find(|a| a.job == name)?;
        (r.status == JobStatus::Running && a.predicted_throughput > 0.0)
            .then(|| r.job.model.global_batch as f64 / a.predicted_throughput)
    };
    let log_of =
        |name: &str, r: &JobRecord| (r.attempts > 0).then(|| dir.attempt_dir(name, r.attempts).join("log.txt"));
    // The last applied round's assignment of a job whose guarantee it did not keep.
    let not_held = |name: &str| {
        let a = applied.as_ref()?.assignments.iter().find(|a| a.job == name)?;
        a.guarantee.as_ref().is_some_and(|g| !g.holds).then_some(a)
    };
    let text = match format {
        StatusFormat::Yaml => {
            // The records, with what a person reads in the table: why, the measured and
            // predicted seconds per iteration, the log.
            let mut doc = serde_yaml_ng::to_value(&state)?;
            for (name, r, mean) in &rows {
                let entry = &mut doc["jobs"][name.as_str()];
                entry["measuredIterTimeS"] = serde_yaml_ng::to_value(mean)?;
                entry["predictedIterTimeS"] = serde_yaml_ng::to_value(predicted_s(name, r))?;
                entry["log"] = serde_yaml_ng::to_value(log_of(name, r))?;
                if let Some(a) = not_held(name) {
                    entry["guaranteeNotHeld"] = serde_yaml_ng::to_value(&a.reason)?;
                }
            }
            serde_yaml_ng::to_string(&doc)?
        }
        StatusFormat::Table => {
            // 100 columns; a job that is not running says why on a line of its own.
            let fit = |text: String, width: usize| {
                if text.chars().count() > width {
                    format!("{}~", text.chars().take(width - 1).collect::<String>())
                } else {
                    text
                }
            };
            let mut out = format!(
                "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
                "job", "status", "plan", "where", "run", "iterations", "iter_s (pred)"
            );
            for (name, r, mean) in &rows {
                let times = match (mean, predicted_s(name, r)) {
                    (Some(m), Some(p)) => format!("{m:.3} ({p:.3})"),
                    (Some(m), None) => format!("{m:.3}"),
                    (None, Some(p)) => format!("- ({p:.3})"),
                    (None, None) => "-".to_owned(),
                };
                out.push_str(&format!(
                    "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
                    fit((*name).clone(), 14),
                    format!("{:?}", r.status).to_lowercase(),
                    fit(r.run.as_ref().map_or("-".to_owned(), |run| run.plan.to_string()), 30),
                    fit(r.run.as_ref().map_or("-".to_owned(), |run| where_(&run.nodes)), 14),
                    r.attempts,
                    fit(format!("{}/{}", r.iterations_done, r.job.iterations), 11),
                    fit(times, 13),
                ));
                if r.status != JobStatus::Running
                    && let Some(reason) = &r.reason
                {
                    // The reason within the 100 columns (whole in `--format yaml`); the
                    // log on a line of its own.
                    out.push_str(&fit(format!("  why: {reason}{}", retries_note(r)), 100));
                    out.push('\n');
                    if let Some(log) = log_of(name, r) {
                        out.push_str(&format!("  log: {}\n", log.display()));
                    }
                }
                // A guarantee the last round could not keep, running or not.
                if let Some(a) = not_held(name) {
                    let why = if a.reason.starts_with("guarantee NOT held") {
                        a.reason.clone()
                    } else {
                        format!("guarantee NOT held: {}", a.reason)
                    };
                    out.push_str(&fit(format!("  {why}"), 100));
                    out.push('\n');
                }
            }
            out
        }
        StatusFormat::Prometheus => {
            let mut out = String::new();
            let metric = |out: &mut String, name: &str, kind: &str, help: &str, values: &[(String, f64)]| {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
                for (labels, v) in values {
                    out.push_str(&format!("{name}{{{labels}}} {v}\n"));
                }
            };
            // Label values escaped as the exposition format says (\\, \", \n); series keyed by
            // the job only, so a reconfiguration never starts new ones (the plan is in
            // rubick_job_info).
            let escape = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            let label = |name: &str, _: &JobRecord| format!("job=\"{}\"", escape(name));
            let of = |f: &dyn Fn(&JobRecord, Option<f64>) -> f64| -> Vec<(String, f64)> {
                rows.iter().map(|(n, r, mean)| (label(n, r), f(r, *mean))).collect()
            };
            let info: Vec<(String, f64)> = rows
                .iter()
                .map(|(n, r, _)| {
                    let plan = r.run.as_ref().map_or("none".to_owned(), |run| run.plan.to_string());
                    (format!("job=\"{}\",plan=\"{}\"", escape(n), escape(&plan)), 1.0)
                })
                .collect();
            metric(&mut out, "rubick_job_info", "gauge", "the plan the job runs (none when it does not)", &info);
            let statuses: Vec<(String, f64)> = rows
                .iter()
                .flat_map(|(n, r, _)| {
                    ["queued", "running", "finished", "failed", "stopped"].map(|s| {
                        let on = format!("{:?}", r.status).to_lowercase() == s;
                        (format!("job=\"{}\",status=\"{s}\"", escape(n)), f64::from(u8::from(on)))
                    })
                })
                .collect();
            metric(&mut out, "rubick_job_status", "gauge", "1 for the job's status, 0 for the others", &statuses);
            metric(
                &mut out,
                "rubick_job_running",
                "gauge",
                "1 while the job runs",
                &of(&|r, _| f64::from(u8::from(r.status == JobStatus::Running))),
            );
            metric(
                &mut out,
                "rubick_job_retries_left",
                "gauge",
                "restarts left after retryable failures",
                &of(&|r, _| f64::from(r.retries_left)),
            );
            metric(
                &mut out,
                "rubick_job_iterations_done",
                "gauge",
                "highest iteration reported",
                &of(&|r, _| r.iterations_done as f64),
            );
            metric(
                &mut out,
                "rubick_job_runs_total",
                "counter",
                "runs started (first start and restarts)",
                &of(&|r, _| f64::from(r.attempts)),
            );
            metric(
                &mut out,
                "rubick_job_reconfigure_seconds_total",
                "counter",
                "seconds spent stopping for reconfigurations and preemptions",
                // `+ 0.0`: an empty f64 sum is -0.0, which prints `-0`.
                &of(&|r, _| r.reconfigurations.iter().map(|c| c.stop_s).sum::<f64>() + 0.0),
            );
            let measured: Vec<(String, f64)> = rows
                .iter()
                .filter_map(|(n, r, mean)| mean.map(|m| (label(n, r), r.job.model.global_batch as f64 / m)))
                .collect();
            metric(
                &mut out,
                "rubick_job_measured_samples_per_second",
                "gauge",
                "throughput of the last ten iterations",
                &measured,
            );
            // What the round that placed it predicted, and whether its guarantee held.
            let assignment = |name: &str| applied.as_ref().and_then(|s| s.assignments.iter().find(|a| a.job == name));
            let predicted: Vec<(String, f64)> = rows
                .iter()
                .filter(|(_, r, _)| r.status == JobStatus::Running)
                .filter_map(|(n, r, _)| assignment(n).map(|a| (label(n, r), a.predicted_throughput)))
                .collect();
            metric(
                &mut out,
                "rubick_job_predicted_samples_per_second",
                "gauge",
                "throughput the schedule predicted for the running job",
                &predicted,
            );
            let held: Vec<(String, f64)> = rows
                .iter()
                .filter_map(|(n, r, _)| {
                    assignment(n)?.guarantee.as_ref().map(|g| (label(n, r), f64::from(u8::from(g.holds))))
                })
                .collect();
            metric(&mut out, "rubick_job_guarantee_held", "gauge", "1 when the guaranteed job's request is met", &held);
            metric(
                &mut out,
                "rubick_job_queue_seconds",
                "gauge",
                "submission to first start (to now while it waits)",
                &of(&|r, _| r.first_started_unix_s.unwrap_or_else(unix_now) - r.submitted_unix_s),
            );
            out
        }
    };
    rubick_io::write_output(output, text.as_bytes())?;
    if let Some(path) = plot {
        let rows = run_history(&dir, &state);
        rubick_io::plot::write_figure(
            path,
            (1200, 160 + 40 * rows.len().max(1) as u32),
            &plot::RunsFigure { jobs: &rows, now_s: unix_now() },
        )?;
    }
    Ok(Outcome::Done)
}

/// Every job's runs from its attempt directories (`run.yaml`: plan and start; the end:
/// its exit code's time, the next run's start, or now), in submission order.
pub(crate) fn run_history(dir: &StateDir, state: &State) -> Vec<plot::JobRow> {
    let modified = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
    };
    let now = unix_now();
    let mut rows: Vec<plot::JobRow> = state
        .jobs
        .iter()
        .map(|(name, rec)| {
            let mut runs: Vec<plot::RunSpan> = Vec::new();
            for attempt in 1..=rec.attempts {
                let adir = dir.attempt_dir(name, attempt);
                let Ok(text) = std::fs::read_to_string(adir.join("run.yaml")) else { continue };
                let Ok(run) = serde_yaml_ng::from_str::<RunRecord>(&text) else { continue };
                let live = rec.run.as_ref().is_some_and(|r| r.attempt == attempt);
                let exit = adir.join("exit-code");
                let end = if live {
                    now
                } else {
                    modified(&exit).or_else(|| modified(&adir.join("metrics.jsonl"))).unwrap_or(run.started_unix_s)
                };
                runs.push(plot::RunSpan {
                    plan: run.plan.to_string(),
                    gpus: run.plan.gpus(),
                    start_s: run.started_unix_s,
                    end_s: end.max(run.started_unix_s),
                    stopped: !live,
                });
            }
            // The last run of a job that ended on its own was not stopped.
            if matches!(rec.status, JobStatus::Finished | JobStatus::Failed)
                && let Some(last) = runs.last_mut()
            {
                last.stopped = false;
            }
            plot::JobRow { name: name.clone(), submitted_s: rec.submitted_unix_s, runs }
        })
        .collect();
    rows.sort_by(|a, b| a.submitted_s.total_cmp(&b.submitted_s).then(a.name.cmp(&b.name)));
    rows
}
