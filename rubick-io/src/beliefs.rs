//! What the planner believes of each job: its performance model's parameters, read
//! from the job's `perfModel` file, else fitted on the authors' reference data, else
//! the FLOPs-based default.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use rubick_core::{Cluster, Job};
use rubick_model::MemoryEstimator;
use rubick_model::belief::Belief;
use rubick_model::perf::PerfModel;
use rubick_model::perfmodel::{Links, Params};

use crate::files::load_artifact;
use crate::reference::ReferenceData;

/// Where jobs' performance models come from.
#[derive(Debug, Default)]
pub struct ModelSource<'a> {
    /// The jobs file: relative `perfModel` paths start from its directory.
    pub jobs_path: Option<&'a Path>,
    /// The authors' reference data: jobs of its models without a `perfModel` get one
    /// fitted from 8 profiled rows.
    pub reference: Option<&'a ReferenceData>,
}

/// Each job's belief, reading every `perfModel` once: from its file, else a fit on the
/// reference data when that has the model, else the FLOPs-based default. A job whose
/// `perfModel` cannot be used (missing, unreadable, another form) is `Err` with why
/// (`perfModel: ...`); a reference fit that fails is the error of the whole. Jobs left on
/// the default are named on stderr (a warning with the commands that fit a model).
pub fn job_beliefs(
    jobs: &[Job],
    cluster: &Cluster,
    source: &ModelSource<'_>,
) -> anyhow::Result<Vec<Result<Belief, String>>> {
    let mut fitted: HashMap<String, Params> = HashMap::new();
    let links = cluster.node_groups.iter().max_by_key(|g| g.total_gpus()).map(Links::from);
    let mut out = Vec::with_capacity(jobs.len());
    let mut defaulted: Vec<&Job> = Vec::new();
    for job in jobs {
        if let Some(path) = perf_model_path(job, source) {
            out.push(match load_artifact::<PerfModel>(&path) {
                Err(e) => Err(format!("perfModel: {e}")),
                Ok(model) => Belief::of(&model).map_err(|e| format!("perfModel: {}: {e}", path.display())),
            });
            continue;
        }
        let name = &job.model.name;
        let from_reference = match (source.reference, links) {
            (Some(data), Some(links)) if data.facts(name).is_some() => {
                if let Some(p) = fitted.get(name) {
                    Some(p.clone())
                } else {
                    let params = fit_reference(data, name, links)
                        .with_context(|| format!("fitting `{name}` on the reference data"))?;
                    fitted.insert(name.clone(), params.clone());
                    Some(params)
                }
            }
            _ => None,
        };
        if from_reference.is_none() {
            defaulted.push(job);
        }
        out.push(Ok(from_reference.map_or_else(|| Belief::prior(&job.model), Belief::from)));
    }
    warn_default_models(&defaulted, source);
    Ok(out)
}

/// How many jobs on the default model are named in the warning (the rest counted).
const NAMED_DEFAULTS: usize = 8;

/// Jobs without a `perfModel` (and none fitted on the reference data) are planned on the
/// FLOPs-based default, which can be off by an order of magnitude for a real script:
/// said on stderr in one line, naming the jobs and the commands that fit a model. The
/// file to profile is named only when it is one: the jobs file when it is a single Job,
/// else `JOB.yaml` (a JobBatch or stdin is not a job file).
fn warn_default_models(jobs: &[&Job], source: &ModelSource<'_>) {
    let file = match (jobs, source.jobs_path.filter(|p| !crate::files::is_std(p))) {
        ([job], Some(path)) if job.kind == Some(rubick_core::artifact::Kind::Job) => crate::files::display(path),
        _ => "JOB.yaml".to_owned(),
    };
    let fit = format!(
        "fit one: `rubick-profile run {file} --cluster CLUSTER.yaml -o profile.csv`, then `rubick-fit fit profile.csv \
         --job {file} --cluster CLUSTER.yaml -o model.yaml`, and name it in the job: `perfModel: model.yaml` (README: \
         Quick start)"
    );
    match jobs {
        [] => {}
        [job] => tracing::warn!(
            "job `{}` has no perfModel: it is planned on a default model guessed from its FLOPs, which can be far \
             from its real speed; {fit}",
            job.name
        ),
        _ => {
            let named: Vec<String> = jobs.iter().take(NAMED_DEFAULTS).map(|j| format!("`{}`", j.name)).collect();
            let more = jobs.len().saturating_sub(NAMED_DEFAULTS);
            let rest = if more > 0 { format!(" and {more} more") } else { String::new() };
            let reference = if source.reference.is_none() {
                " (the paper's models: --reference fits them on the authors' data)"
            } else {
                ""
            };
            tracing::warn!(
                "{} jobs have no perfModel ({}{rest}): they are planned on default models guessed from their FLOPs, \
                 which can be far from their real speed{reference}; for each, {fit}",
                jobs.len(),
                named.join(", ")
            );
        }
    }
}

/// Performance-model parameters of every job ([`job_beliefs`]); a job whose
/// `perfModel` cannot be used is an error naming it.
pub fn job_params(jobs: &[Job], cluster: &Cluster, source: &ModelSource<'_>) -> anyhow::Result<Vec<Params>> {
    let file = source.jobs_path.map_or_else(|| "jobs".into(), crate::files::display);
    job_beliefs(jobs, cluster, source)?
        .into_iter()
        .enumerate()
        .map(|(i, belief)| belief.map(|b| b.params).map_err(|why| anyhow::anyhow!("{file}: jobs[{i}].{why}")))
        .collect()
}

/// Where a job's `perfModel` is: relative to the jobs file.
pub fn perf_model_path(job: &Job, source: &ModelSource<'_>) -> Option<std::path::PathBuf> {
    let base = source.jobs_path.filter(|p| !crate::files::is_std(p)).and_then(Path::parent);
    let path = job.perf_model.as_deref()?;
    Some(base.map_or_else(|| Path::new(path).to_path_buf(), |b| b.join(path)))
}

fn fit_reference(data: &ReferenceData, model: &str, links: Links) -> anyhow::Result<Params> {
    let spec = data.model_spec(model)?.context("listed model")?;
    let measured = data.measured_rows(model)?;
    let resolved = rubick_model::reference::resolve_rows(&measured, &spec, &MemoryEstimator::default());
    let (_, obs) = rubick_model::reference::profiled_rows(&resolved, 8, links);
    Ok(rubick_model::fit::fit(&spec, &obs, &rubick_model::fit::FitOptions::default())?.params)
}
