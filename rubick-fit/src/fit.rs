//! `rubick-fit fit`: a job's `PerfModel` fitted from its profile table.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use rubick_core::artifact::to_yaml;
use rubick_core::tables::{ProfileRow, ProfileStatus};
use rubick_core::{Cluster, Job, ModelSpec, Placement, Plan};
use rubick_io::cli::{Outcome, ensure_not_an_input, ensure_one_stdin};
use rubick_io::files::load_artifact;
use rubick_model::fit::{Fit, FitOptions, Observation, fit};
use rubick_model::perf::PerfModel;
use rubick_model::perfmodel::Links;

pub(crate) fn run(profile: &Path, job: &Path, cluster: &Path, output: &Path) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&[profile, job, cluster])?;
    ensure_not_an_input(output, &[profile, job, cluster])?;
    let job: Job = load_artifact(job)?;
    let cluster: Cluster = load_artifact(cluster)?;
    let rows = profile_observations(profile, &job, &cluster)?;
    let fitted =
        fit(&job.model, &rows, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{}: {e}", profile.display()))?;
    let model = perf_model_artifact(&job.model, &rows, &fitted, &profile.display().to_string());
    if let Some(d) = &model.diagnostics {
        for r in &d.inconsistent_rows {
            tracing::warn!(
                "{}: {} on {} measured {:.4} s, the fit predicts {:.4} s: more than {}x off, listed in \
                 diagnostics.inconsistentRows (a noisy or broken run, or a term the model lacks): the planner \
                 believes the measurement for this configuration and widens the interval of its family \
                 (`rubick-profile run --repeat 3` tells noise from a real difference)",
                profile.display(),
                r.plan,
                r.placement,
                r.measured_s,
                r.predicted_s,
                rubick_model::perf::FLAG_FACTOR
            );
        }
        tracing::info!("fit: {} rows, mean in-sample error {:.1} %", rows.len(), d.mean_rel_error * 100.0);
    }
    rubick_io::write_output(output, rubick_io::Format::Yaml, to_yaml(&model).as_bytes())?;
    Ok(Outcome::Done)
}

/// Reads a profile table into observations of `job` on `cluster`: its measured runs
/// (status `ok`, or no status column); out-of-memory, failed and timed-out runs are
/// counted and left out.
pub fn profile_observations(path: &Path, job: &Job, cluster: &Cluster) -> anyhow::Result<Vec<Observation>> {
    let table: Vec<ProfileRow> = rubick_io::table::read_rows(path, &rubick_core::tables::PROFILE)?;
    anyhow::ensure!(!table.is_empty(), "{}: no measured rows to fit (only a header)", path.display());
    let links = Links::of_cluster(cluster);
    let mut rows = Vec::with_capacity(table.len());
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    for (i, row) in table.iter().enumerate() {
        let at = |what: &str| format!("{}: line {}: {what}", path.display(), i + 2);
        if row.model != job.model.name {
            bail!(
                "{}: the profile measured model `{}` (job `{}`), but --job `{}` is model `{}`",
                at("model"),
                row.model,
                row.job,
                job.name,
                job.model.name
            );
        }
        if let Some(gpu) = row.gpu_type.as_deref().filter(|g| !cluster.gpu_types().contains(g)) {
            bail!(
                "{}: the profile ran on GPU type `{gpu}`, but --cluster `{}` has {}",
                at("gpu_type"),
                cluster.name,
                cluster.gpu_types().iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
            );
        }
        let plan: Plan = row.plan.parse().with_context(|| at("plan"))?;
        let placement: Placement = row.placement.parse().with_context(|| at("placement"))?;
        if let Some(status) = row.status.filter(|s| *s != ProfileStatus::Ok) {
            *skipped.entry(status.to_string()).or_default() += 1;
            continue;
        }
        let iter_time_s = row.iter_time_s.with_context(|| {
            at("iter_time_s: a measured run needs a positive, finite number of seconds (empty or not a number)")
        })?;
        plan.check(&job.model, placement.gpus())
            .map_err(|v| anyhow::anyhow!("{}", at(&format!("plan `{plan}`: {v}"))))?;
        if let Some(why) = job.refusal(&plan) {
            tracing::warn!(
                "{}",
                at(&format!("`{plan}` left out: it uses {why}, which the job's script does not implement"))
            );
            continue;
        }
        rows.push(Observation { plan, placement, links, iter_time_s });
    }
    if !skipped.is_empty() {
        let what: Vec<String> = skipped.iter().map(|(s, n)| format!("{n} {s}")).collect();
        tracing::info!("{}: left out runs that did not measure: {}", path.display(), what.join(", "));
    }
    anyhow::ensure!(
        !rows.is_empty(),
        "{}: no run measured its configuration (status ok); nothing to fit",
        path.display()
    );
    Ok(rows)
}

/// The `PerfModel` artifact of a fit (see [`PerfModel::of_fit`]).
pub fn perf_model_artifact(spec: &ModelSpec, rows: &[Observation], fitted: &Fit, source: &str) -> PerfModel {
    PerfModel::of_fit(spec, rows, fitted, source)
}
