//! `rubick-run status`: what runs where and how fast. The command builds a
//! [`StatusReport`] from the state and the last applied round; one renderer per format
//! writes it (a table for a person, YAML for a program, Prometheus text for
//! node-exporter's textfile collector); `--plot` draws every job's runs.

use std::path::{Path, PathBuf};

use rubick_core::schedule::Schedule;
use rubick_io::cli::Outcome;
use rubick_io::files::load_artifact;

use crate::plot;
use crate::runs::{Look, Seen};
use crate::state::{JobRecord, JobStatus, RunRecord, State, StateDir};
use crate::{StateArgs, StatusFormat, ensure_outside, refreshed, unix_now, where_};

use rubick_core::schedule::Assignment;

pub(crate) fn status(
    args: &StateArgs,
    format: StatusFormat,
    output: &Path,
    plot: Option<&Path>,
) -> anyhow::Result<Outcome> {
    rubick_io::check_output(output, format.file_format())?;
    let dir = locked!(args, false);
    ensure_outside(&dir, output)?;
    if let Some(p) = plot {
        ensure_outside(&dir, p)?;
    }
    let (state, seen) = refreshed(&dir, Look::Recent)?;
    let applied: Option<Schedule> =
        dir.current_path().exists().then(|| load_artifact(&dir.current_path())).transpose().unwrap_or(None);
    let report = StatusReport::new(&dir, &state, &seen, applied.as_ref());
    rubick_io::write_output(output, format.file_format(), format.render(&report)?.as_bytes())?;
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

/// What `status` reports: the state's records and, per job, what its run measured and
/// what the last applied round decided for it.
pub(crate) struct StatusReport<'a> {
    state: &'a State,
    /// In the state's order (by name).
    jobs: Vec<JobLine<'a>>,
    /// When the report was made (Unix seconds): the end of a queued job's wait.
    now_s: f64,
}

/// One job of a [`StatusReport`].
struct JobLine<'a> {
    name: &'a str,
    record: &'a JobRecord,
    /// Seconds per iteration of the current run's recent iterations.
    measured_iter_s: Option<f64>,
    /// The current run's last iteration and its loss, when the run reports one (NaN or
    /// an infinity: the job diverges).
    loss: Option<(u64, f64)>,
    /// The last applied round's assignment of the job.
    assignment: Option<&'a Assignment>,
    /// The log of the job's last run, once it ran.
    log: Option<PathBuf>,
}

impl<'a> StatusReport<'a> {
    /// The report on `state` (of `dir`), with what the refresh read of its runs
    /// (`seen`) and `applied`, the last applied schedule.
    fn new(dir: &StateDir, state: &'a State, seen: &Seen, applied: Option<&'a Schedule>) -> Self {
        let jobs = state
            .jobs
            .iter()
            .map(|(name, r)| {
                let progress = r.run.as_ref().and(seen.get(name));
                JobLine {
                    name,
                    record: r,
                    measured_iter_s: progress.and_then(|p| p.recent_iter_time_s),
                    loss: progress.and_then(|p| p.last.zip(p.loss)),
                    assignment: applied.and_then(|s| s.assignments.iter().find(|a| a.job == *name)),
                    log: (r.attempts > 0).then(|| dir.attempt_dir(name, r.attempts).join("log.txt")),
                }
            })
            .collect();
        StatusReport { state, jobs, now_s: unix_now() }
    }
}

impl JobLine<'_> {
    fn running(&self) -> bool {
        self.record.status == JobStatus::Running
    }

    /// What the round that placed the running job predicted, in seconds per iteration.
    fn predicted_iter_s(&self) -> Option<f64> {
        let a = self.assignment?;
        (self.running() && a.predicted_throughput > 0.0)
            .then(|| self.record.job.model.global_batch as f64 / a.predicted_throughput)
    }

    /// The current run's loss when it is not a number (NaN, or an infinity: the job
    /// diverges), and the iteration that reported it.
    fn diverged(&self) -> Option<(u64, f64)> {
        self.loss.filter(|(_, loss)| !loss.is_finite())
    }

    /// The last applied round's assignment, when it did not keep the job's guarantee.
    fn guarantee_not_held(&self) -> Option<&Assignment> {
        self.assignment.filter(|a| a.guarantee.as_ref().is_some_and(|g| !g.holds))
    }

    /// The retries the job has left, where they matter: a queued job (its next failure
    /// may spend one) whose reason does not already say; nothing for a finished, failed
    /// or stopped job, which is never retried.
    fn retries_note(&self) -> String {
        let r = self.record;
        let said = r.reason.as_deref().is_some_and(|why| why.contains("retries left"));
        if r.status == JobStatus::Queued && !said {
            format!("; {} {} left", r.retries_left, if r.retries_left == 1 { "retry" } else { "retries" })
        } else {
            String::new()
        }
    }
}

impl StatusFormat {
    /// The format of the file this report is (for the check of an output's name).
    fn file_format(self) -> rubick_io::Format {
        match self {
            StatusFormat::Table => rubick_io::Format::Text,
            StatusFormat::Yaml => rubick_io::Format::Yaml,
            StatusFormat::Prometheus => rubick_io::Format::Prometheus,
        }
    }

    /// `report` in this format.
    fn render(self, report: &StatusReport<'_>) -> anyhow::Result<String> {
        Ok(match self {
            StatusFormat::Table => table(report),
            StatusFormat::Yaml => yaml(report)?,
            StatusFormat::Prometheus => prometheus(report),
        })
    }
}

/// The state's records, with what a person reads in the table: why, the measured and
/// predicted seconds per iteration, the log.
fn yaml(report: &StatusReport<'_>) -> anyhow::Result<String> {
    let mut doc = serde_yaml_ng::to_value(report.state)?;
    for line in &report.jobs {
        let entry = &mut doc["jobs"][line.name];
        entry["measuredIterTimeS"] = serde_yaml_ng::to_value(line.measured_iter_s)?;
        entry["predictedIterTimeS"] = serde_yaml_ng::to_value(line.predicted_iter_s())?;
        entry["log"] = serde_yaml_ng::to_value(&line.log)?;
        if let Some((_, loss)) = line.loss {
            entry["loss"] = serde_yaml_ng::to_value(loss)?;
        }
        if let Some(a) = line.guarantee_not_held() {
            entry["guaranteeNotHeld"] = serde_yaml_ng::to_value(&a.reason)?;
        }
    }
    Ok(serde_yaml_ng::to_string(&doc)?)
}

/// `v` as a number, or in `words` (`[NaN, +infinity, -infinity]`) when it is not finite.
fn float_text(v: f64, words: [&str; 3]) -> String {
    match v {
        _ if v.is_nan() => words[0].to_owned(),
        f64::INFINITY => words[1].to_owned(),
        f64::NEG_INFINITY => words[2].to_owned(),
        _ => format!("{v}"),
    }
}

/// A loss as the script's Python wrote it: `NaN`, `Infinity`, `-Infinity`, or the number.
fn loss_text(loss: f64) -> String {
    float_text(loss, ["NaN", "Infinity", "-Infinity"])
}

/// A sample value in the Prometheus text format (`NaN`, `+Inf`, `-Inf` as it spells them).
fn prometheus_value(v: f64) -> String {
    float_text(v, ["NaN", "+Inf", "-Inf"])
}

/// `text` cut to `width` characters, a `~` marking the cut.
fn fit(text: String, width: usize) -> String {
    if text.chars().count() > width { format!("{}~", text.chars().take(width - 1).collect::<String>()) } else { text }
}

/// 100 columns; a job that is not running says why on a line of its own.
fn table(report: &StatusReport<'_>) -> String {
    let mut out = format!(
        "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
        "job", "status", "plan", "where", "run", "iterations", "iter_s (pred)"
    );
    for line in &report.jobs {
        let r = line.record;
        let times = match (line.measured_iter_s, line.predicted_iter_s()) {
            (Some(m), Some(p)) => format!("{m:.3} ({p:.3})"),
            (Some(m), None) => format!("{m:.3}"),
            (None, Some(p)) => format!("- ({p:.3})"),
            (None, None) => "-".to_owned(),
        };
        out.push_str(&format!(
            "{:<14} {:<9} {:<30} {:<14} {:>3} {:>11} {:>13}\n",
            fit(line.name.to_owned(), 14),
            r.status.to_string(),
            fit(r.run.as_ref().map_or("-".to_owned(), |run| run.plan.to_string()), 30),
            fit(r.run.as_ref().map_or("-".to_owned(), |run| where_(&run.nodes)), 14),
            r.attempts,
            fit(format!("{}/{}", r.iterations_done, r.job.iterations), 11),
            fit(times, 13),
        ));
        // Plans it ran slower under than before (the safety net after every move).
        for slow in &r.job.slow_plans {
            let moved = if r.run.as_ref().is_some_and(|run| run.plan == slow.plan) {
                "moves back"
            } else {
                "moved back for good"
            };
            out.push_str(&fit(
                format!(
                    "  slower: {} {:.3} s/iter vs {:.3} s on {}: {moved}",
                    slow.plan, slow.iter_time_s, slow.before_iter_time_s, slow.before
                ),
                100,
            ));
            out.push('\n');
        }
        // A diverging job runs on, its iterations counted: its loss says so.
        if let Some((iter, loss)) = line.diverged() {
            out.push_str(&format!("  loss {} at iteration {iter}: the job diverges\n", loss_text(loss)));
        }
        if !line.running()
            && let Some(reason) = &r.reason
        {
            // The reason within the 100 columns (whole in `--format yaml`); the log on a
            // line of its own.
            out.push_str(&fit(format!("  why: {reason}{}", line.retries_note()), 100));
            out.push('\n');
            if let Some(log) = &line.log {
                out.push_str(&format!("  log: {}\n", log.display()));
            }
        }
        // A guarantee the last round could not keep, running or not.
        if let Some(a) = line.guarantee_not_held() {
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

/// The Prometheus text exposition format. Label values are escaped as the format says
/// (`\\`, `\"`, `\n`); series are keyed by the job only, so that a reconfiguration never
/// starts new ones (the plan is in `rubick_job_info`).
fn prometheus(report: &StatusReport<'_>) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, values: &[(String, f64)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in values {
            out.push_str(&format!("{name}{{{labels}}} {}\n", prometheus_value(*v)));
        }
    };
    let escape = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
    let label = |line: &JobLine<'_>| format!("job=\"{}\"", escape(line.name));
    // One series per job, of `f`.
    let of = |f: &dyn Fn(&JobLine<'_>) -> f64| -> Vec<(String, f64)> {
        report.jobs.iter().map(|line| (label(line), f(line))).collect()
    };
    let info: Vec<(String, f64)> = report
        .jobs
        .iter()
        .map(|line| {
            let plan = line.record.run.as_ref().map_or("none".to_owned(), |run| run.plan.to_string());
            (format!("job=\"{}\",plan=\"{}\"", escape(line.name), escape(&plan)), 1.0)
        })
        .collect();
    metric("rubick_job_info", "gauge", "the plan the job runs (none when it does not)", &info);
    let statuses: Vec<(String, f64)> = report
        .jobs
        .iter()
        .flat_map(|line| {
            JobStatus::ALL.map(|s| {
                let on = line.record.status == s;
                (format!("job=\"{}\",status=\"{s}\"", escape(line.name)), f64::from(u8::from(on)))
            })
        })
        .collect();
    metric("rubick_job_status", "gauge", "1 for the job's status, 0 for the others", &statuses);
    metric("rubick_job_running", "gauge", "1 while the job runs", &of(&|l| f64::from(u8::from(l.running()))));
    metric(
        "rubick_job_retries_left",
        "gauge",
        "restarts left after retryable failures",
        &of(&|l| f64::from(l.record.retries_left)),
    );
    metric(
        "rubick_job_iterations_done",
        "gauge",
        "highest iteration reported",
        &of(&|l| l.record.iterations_done as f64),
    );
    metric(
        "rubick_job_runs_total",
        "counter",
        "runs started (first start and restarts)",
        &of(&|l| f64::from(l.record.attempts)),
    );
    metric(
        "rubick_job_reconfigure_seconds_total",
        "counter",
        "seconds spent stopping for reconfigurations and preemptions",
        // `+ 0.0`: an empty f64 sum is -0.0, which prints `-0`.
        &of(&|l| l.record.reconfigurations.iter().map(|c| c.stop_s).sum::<f64>() + 0.0),
    );
    let measured: Vec<(String, f64)> = report
        .jobs
        .iter()
        .filter_map(|l| l.measured_iter_s.map(|m| (label(l), l.record.job.model.global_batch as f64 / m)))
        .collect();
    metric("rubick_job_measured_samples_per_second", "gauge", "throughput of the last ten iterations", &measured);
    let loss: Vec<(String, f64)> =
        report.jobs.iter().filter_map(|l| l.loss.map(|(_, loss)| (label(l), loss))).collect();
    metric(
        "rubick_job_loss",
        "gauge",
        "the loss of the run's last iteration (NaN or an infinity when the job diverges)",
        &loss,
    );
    // What the round that placed it predicted, and whether its guarantee held.
    let predicted: Vec<(String, f64)> = report
        .jobs
        .iter()
        .filter(|l| l.running())
        .filter_map(|l| l.assignment.map(|a| (label(l), a.predicted_throughput)))
        .collect();
    metric(
        "rubick_job_predicted_samples_per_second",
        "gauge",
        "throughput the schedule predicted for the running job",
        &predicted,
    );
    let held: Vec<(String, f64)> = report
        .jobs
        .iter()
        .filter_map(|l| l.assignment?.guarantee.as_ref().map(|g| (label(l), f64::from(u8::from(g.holds)))))
        .collect();
    metric("rubick_job_guarantee_held", "gauge", "1 when the guaranteed job's request is met", &held);
    metric(
        "rubick_job_queue_seconds",
        "gauge",
        "submission to first start (to now while it waits)",
        &of(&|l| l.record.first_started_unix_s.unwrap_or(report.now_s) - l.record.submitted_unix_s),
    );
    out
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
