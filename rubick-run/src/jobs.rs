//! `rubick-run jobs`: the state as a `JobBatch` for the planner, with online refits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rubick_core::artifact::{ApiVersion, Kind, to_yaml};
use rubick_core::job::CurrentAllocation;
use rubick_core::{Cluster, Job, JobBatch, Placement, Plan};
use rubick_io::cli::Outcome;
use rubick_io::files::load_artifact;

use crate::runs::Look;
use crate::state::{self, JobRecord, JobStatus, RunRecord, StateDir};
use crate::{StateArgs, ensure_outside, refreshed, unix_now};

pub(crate) fn jobs(args: &StateArgs, output: &Path, cluster: Option<&Path>) -> anyhow::Result<Outcome> {
    // A name for another format is refused before any refit is written.
    rubick_io::check_output(output, rubick_io::Format::Yaml)?;
    let cluster: Option<Cluster> = cluster.map(load_artifact).transpose()?;
    let dir = locked!(args, false);
    ensure_outside(&dir, output)?;
    let (state, _) = refreshed(&dir, Look::Last)?;
    let mut refitted: BTreeMap<String, PathBuf> = BTreeMap::new();
    if let Some(cluster) = &cluster {
        for (name, rec) in state.jobs.iter().filter(|(_, r)| matches!(r.status, JobStatus::Queued | JobStatus::Running))
        {
            match refit(&dir, name, rec, cluster) {
                Ok(Some(path)) => {
                    refitted.insert(name.clone(), path);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("`{name}`: no online refit: {e:#}"),
            }
        }
    }
    let jobs: Vec<Job> = state
        .jobs
        .values()
        .filter(|r| matches!(r.status, JobStatus::Queued | JobStatus::Running))
        .map(|r| {
            let mut job = r.job.clone();
            job.kind = None;
            job.api_version = None;
            job.iterations = job.iterations.saturating_sub(r.iterations_done).max(1);
            // The job clock: when it was submitted (Unix seconds), against the batch's nowS.
            job.submit_time_s = r.submitted_unix_s;
            let costs: Vec<f64> = r
                .reconfigurations
                .iter()
                .filter(|c| c.to.is_some())
                .map(|c| c.stop_s + c.first_iteration_s.unwrap_or(0.0))
                .collect();
            if !costs.is_empty() {
                job.restart_cost_s = Some(costs.iter().sum::<f64>() / costs.len() as f64);
            }
            if let Some(path) = refitted.get(&r.job.name) {
                job.perf_model = Some(path.display().to_string());
            }
            job.current = r.run.as_ref().and_then(|run| {
                Some(CurrentAllocation {
                    plan: run.plan,
                    placement: Placement::new(run.nodes.iter().map(|n| n.gpus.len() as u32).collect())?,
                    nodes: run.nodes.iter().map(|n| n.node.clone()).collect(),
                    cpus: Some(run.nodes.iter().map(|n| n.cpus).sum()),
                    rounds_since_change: run.rounds_since_change,
                    // Every reconfiguration that started a run again is a restart, but
                    // those the planner did not choose (`forced`: a node that left, the
                    // safety net); the last one restores until its first iteration is seen.
                    restarts: r.reconfigurations.iter().filter(|c| c.to.is_some() && !c.forced).count() as u32,
                    restoring: r
                        .reconfigurations
                        .last()
                        .is_some_and(|c| c.to.is_some() && c.first_iteration_s.is_none()),
                })
            });
            job
        })
        .collect();
    let batch =
        JobBatch { api_version: Some(ApiVersion::CURRENT), kind: Some(Kind::JobBatch), jobs, now_s: Some(unix_now()) };
    rubick_io::write_output(output, rubick_io::Format::Yaml, to_yaml(&batch).as_bytes())?;
    Ok(Outcome::Done)
}

/// The job's own measurements as a profile table (`jobs/NAME/profile.csv`: one row per
/// run, its iterations after the warm-up) and, from its first measured run, its model
/// refitted on those runs *and* the rows its submitted model was fitted on (its
/// profile: `diagnostics.rows` and `inconsistentRows` of `perfModel`), when together
/// they span 2 or more configurations (`jobs/NAME/model.yaml`, whose path is returned).
/// A plan the model got wrong is measured by its run, and the next round's plan is
/// chosen by a model that knows it.
pub(crate) fn refit(dir: &StateDir, name: &str, rec: &JobRecord, cluster: &Cluster) -> anyhow::Result<Option<PathBuf>> {
    use rubick_core::launch::MetricLine;
    use rubick_core::tables::{PROFILE, ProfileRow, ProfileStatus};
    use rubick_model::fit::{FitOptions, Observation, fit};
    let warmup = rec.job.launch.as_ref().map_or(3, |l| l.warmup_iterations);
    let links = rubick_model::perfmodel::Links::of_cluster(cluster);
    let (mut rows, mut observations) = (Vec::new(), Vec::new());
    for attempt in 1..=rec.attempts {
        let adir = dir.attempt_dir(name, attempt);
        let Ok(text) = std::fs::read_to_string(adir.join("run.yaml")) else { continue };
        let run: RunRecord =
            serde_yaml_ng::from_str(&text).with_context(|| format!("{}", adir.join("run.yaml").display()))?;
        let lines: Vec<MetricLine> =
            rubick_launch::metrics::lines(&adir.join(rubick_launch::contract::METRICS_FILE), Some(rec.job.iterations));
        let times =
            rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&lines, warmup, None));
        let Some(placement) = Placement::new(run.nodes.iter().map(|n| n.gpus.len() as u32).collect()) else { continue };
        let Some((mean, sd)) = rubick_core::launch::mean_sd(&times) else { continue };
        rows.push(ProfileRow {
            job: name.to_owned(),
            model: rec.job.model.name.clone(),
            plan: run.plan.to_string(),
            placement: placement.to_string(),
            cpus: Some(i64::from(run.nodes.iter().map(|n| n.cpus).sum::<u32>())),
            status: Some(ProfileStatus::Ok),
            repeat: Some(i64::from(attempt)),
            iterations: Some(times.len() as i64),
            iter_time_s: Some(mean),
            iter_time_sd_s: Some(sd),
            samples_per_s: Some(run.plan.global_batch() as f64 / mean),
            ..ProfileRow::default()
        });
        observations.push(Observation { plan: run.plan, placement, links, iter_time_s: mean });
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let table = dir.job_dir(name).join("profile.csv");
    rubick_io::csv::write_csv(&rows, &table, &PROFILE)?;
    let runs = observations.len();
    let mut source = table.display().to_string();
    if let Some(path) = &rec.job.perf_model {
        let submitted: rubick_model::perf::PerfModel = load_artifact(Path::new(path))?;
        if let Some(d) = &submitted.diagnostics {
            let profiled: Vec<Observation> = d
                .rows
                .iter()
                .chain(&d.inconsistent_rows)
                .filter(|r| r.measured_s.is_finite() && r.measured_s > 0.0 && r.plan.gpus() == r.placement.gpus())
                .map(|r| Observation { plan: r.plan, placement: r.placement.clone(), links, iter_time_s: r.measured_s })
                .collect();
            if !profiled.is_empty() {
                source = format!("{} + {} row(s) of {path}", source, profiled.len());
            }
            observations.extend(profiled);
        }
    }
    let mut configs: Vec<(Plan, Placement)> = observations.iter().map(|o| (o.plan, o.placement.clone())).collect();
    configs.sort();
    configs.dedup();
    if configs.len() < 2 {
        return Ok(None);
    }
    let fitted = fit(&rec.job.model, &observations, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let model = rubick_model::perf::PerfModel::of_fit(&rec.job.model, &observations, &fitted, &source);
    let path = std::path::absolute(dir.job_dir(name).join("model.yaml"))?;
    state::write_private(&path, to_yaml(&model).as_bytes())?;
    tracing::info!(
        "`{name}`: model refitted on {runs} run(s) and {} profiled row(s): {} configurations",
        observations.len() - runs,
        configs.len()
    );
    Ok(Some(path))
}
