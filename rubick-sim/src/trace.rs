//! Loading a trace for simulation: its jobs with their beliefs, and the truth.

use std::borrow::Cow;
use std::path::Path;

use crate::truth::{Truth, TruthMode};
use anyhow::Context;
use rubick_core::job::{JobRequest, Resharding};
use rubick_core::{Cluster, Job, JobBatch, ModelSpec, PlanCode, PlanRequest};
use rubick_io::files::{parse_artifact, read_text};
use rubick_io::reference::{ReferenceData, read_trace};
use rubick_model::perfmodel::Links;
use rubick_model::perfmodel::Params;
use rubick_model::reference::TESTBED_PROFILED_CPUS_PER_GPU;
use rubick_model::reference::TraceJob;

use crate::SimJob;
use crate::engine::JobSource;
use rubick_io::beliefs::{ModelSource, job_params};

/// The jobs of a trace (the reference's workload CSV, or a `JobBatch` whose jobs carry
/// `submitTimeS` and `iterations`), each with its belief (a model fitted on 8 reference
/// rows, or its `perfModel`), and the truth of `mode` over the reference's models.
pub fn load_trace(
    trace: &Path,
    cluster: &Cluster,
    reference: &ReferenceData,
    mode: TruthMode,
) -> anyhow::Result<(Vec<SimJob>, Truth)> {
    let (trace, truth) = open_trace(trace, cluster, reference, mode)?;
    Ok((trace.jobs(), truth))
}

/// A trace whose jobs are made when a simulation reaches them (a [`JobSource`]): of a
/// workload CSV only its rows are held (each checked when opened), one model and belief
/// per application; a `JobBatch`'s jobs are held as they are.
#[derive(Debug, Clone)]
pub struct Trace {
    /// A `JobBatch`'s jobs.
    made: Vec<SimJob>,
    /// A workload CSV's rows: the row, its model (in `models`), and the plan code its
    /// model rejects (the job then asks for its GPUs only).
    rows: Vec<(TraceJob, usize, Option<PlanCode>)>,
    models: Vec<(ModelSpec, Params)>,
    /// Share of jobs marked guaranteed on top of the trace's (see [`marked`]).
    guaranteed_share: f64,
}

/// Whether job `i` is among `share` of the jobs marked guaranteed, evenly spread over
/// the trace's order (deterministic).
pub fn marked(i: usize, share: f64) -> bool {
    share > 0.0 && (i as f64 * share).floor() != ((i + 1) as f64 * share).floor()
}

impl Trace {
    /// How many jobs.
    pub fn len(&self) -> usize {
        self.made.len() + self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks `share` of the jobs guaranteed (see [`marked`]), on top of those the
    /// trace marks.
    pub fn mark_guaranteed(&mut self, share: f64) {
        self.guaranteed_share = share;
        for (i, j) in self.made.iter_mut().enumerate() {
            j.job.guaranteed |= marked(i, share);
        }
    }

    /// Job `i` (in trace order).
    pub fn job(&self, i: usize) -> Cow<'_, SimJob> {
        if let Some(j) = self.made.get(i) {
            return Cow::Borrowed(j);
        }
        let (row, model, code) = &self.rows[i];
        let (spec, params) = &self.models[*model];
        let mut job = job_of(row, spec);
        if code.is_some() {
            job.request.plan = None;
        }
        job.guaranteed |= marked(i, self.guaranteed_share);
        Cow::Owned(SimJob { job, params: params.clone(), trace_code: *code })
    }

    /// Every job, in trace order.
    pub fn jobs(&self) -> Vec<SimJob> {
        (0..self.len()).map(|i| self.job(i).into_owned()).collect()
    }

    fn submit_s(&self, i: usize) -> f64 {
        self.made.get(i).map_or_else(|| self.rows[i].0.submission_time_s, |j| j.job.submit_time_s)
    }
}

impl JobSource for Trace {
    type Job<'s> = Cow<'s, SimJob>;

    fn count(&self) -> usize {
        self.len()
    }

    fn arrivals(&self) -> impl Iterator<Item = (usize, Cow<'_, SimJob>)> {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|&a, &b| self.submit_s(a).total_cmp(&self.submit_s(b)).then(a.cmp(&b)));
        order.into_iter().map(|i| (i, self.job(i)))
    }
}

/// The job of a workload CSV's row, of model `spec`.
fn job_of(r: &TraceJob, spec: &ModelSpec) -> Job {
    Job {
        api_version: None,
        kind: None,
        name: r.name.clone(),
        model: spec.clone(),
        perf_model: None,
        submit_time_s: r.submission_time_s,
        // The authors' convention: a job ends after steps + 1 iterations.
        iterations: r.steps + 1,
        request: JobRequest {
            gpus: r.num_gpus,
            cpus: Some(r.num_cpus),
            host_memory_gib: None,
            plan: Some(PlanRequest::Code(r.exec_plan)),
            gpu_type: None,
        },
        guaranteed: r.is_sla,
        resharding: Resharding::Full,
        restart_cost_s: None,
        current: None,
        launch: None,
        unsupported_plans: Vec::new(),
        slow_plans: Vec::new(),
        requires: None,
    }
}

/// A Sia workload ([`crate::sia`]): its jobs with their beliefs, and a truth whose step
/// times are the artifact's tables (no oracle: every configuration the tables lack is
/// interpolated from them).
fn open_sia_workload(path: &Path, cluster: &Cluster, mode: TruthMode) -> anyhow::Result<(Trace, Truth)> {
    let (jobs, steps) = crate::sia::open_workload(path, cluster)?;
    let links = cluster.node_groups.first().map(Links::from).context("the cluster has no node group")?;
    let mut truth = Truth::new(mode, &[], links, TESTBED_PROFILED_CPUS_PER_GPU)
        .map_err(|(model, e)| anyhow::anyhow!("the truth of `{model}`: {e}"))?;
    truth.steps = Some(std::sync::Arc::new(steps));
    let made = jobs.into_iter().map(|(job, params)| SimJob { job, params, trace_code: None }).collect();
    Ok((Trace { made, rows: Vec::new(), models: Vec::new(), guaranteed_share: 0.0 }, truth))
}

/// [`load_trace`] with the jobs made as a simulation reaches them: every row is checked
/// now, and the beliefs fitted, but only one model and belief per application is held.
pub fn open_trace(
    path: &Path,
    cluster: &Cluster,
    reference: &ReferenceData,
    mode: TruthMode,
) -> anyhow::Result<(Trace, Truth)> {
    let mut trace = Trace { made: Vec::new(), rows: Vec::new(), models: Vec::new(), guaranteed_share: 0.0 };
    let source = ModelSource { jobs_path: Some(path), reference: Some(reference) };
    let yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
    if !yaml && crate::sia::is_workload(&read_text(path)?) {
        return open_sia_workload(path, cluster, mode);
    }
    if yaml {
        let text = read_text(path)?;
        let jobs = parse_artifact::<JobBatch>(path, &text)?.jobs;
        let params = job_params(&jobs, cluster, &source)?;
        trace.made =
            jobs.into_iter().zip(params).map(|(job, params)| SimJob { job, params, trace_code: None }).collect();
    } else {
        let rows = read_trace(path)?;
        let mut models: std::collections::BTreeMap<String, usize> = Default::default();
        let mut specs: Vec<ModelSpec> = Vec::new();
        // Requested plans the job's model rejects, by reason: the lines.
        let mut unusable_plans: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        let mut kept = Vec::with_capacity(rows.len());
        for (i, r) in rows.into_iter().enumerate() {
            let line = i + 2;
            let model = match models.get(&r.application) {
                Some(&m) => m,
                None => {
                    let spec = reference.model_spec(&r.application)?.with_context(|| {
                        format!(
                            "{}: line {line}: application `{}` is not a model of the reference data",
                            path.display(),
                            r.application
                        )
                    })?;
                    specs.push(spec);
                    models.insert(r.application.clone(), specs.len() - 1);
                    specs.len() - 1
                }
            };
            let mut job = job_of(&r, &specs[model]);
            let mut code = None;
            if let Err(e) = job.check() {
                // The reference's model shapes disagree with a few of its own plans
                // (GPT-2's `151`: TP 5 of 19 heads): the job asks for its GPUs only.
                if e.field == "request.plan" {
                    unusable_plans.entry(e.to_string()).or_default().push(line);
                    job.request.plan = None;
                    code = Some(r.exec_plan);
                }
                job.check().map_err(|e| anyhow::anyhow!("{}: line {line}: {e}", path.display()))?;
            }
            kept.push((r, model, code));
        }
        for (reason, lines) in &unusable_plans {
            let shown: Vec<String> = lines.iter().take(6).map(ToString::to_string).collect();
            let more = if lines.len() > shown.len() { ", ..." } else { "" };
            tracing::warn!(
                "{}: {} job(s) (line {}{more}): {reason}; they keep their GPUs, not their plan (static policies run \
                 the plan as measured)",
                path.display(),
                lines.len(),
                shown.join(", ")
            );
        }
        // One belief per model: a job of the model stands for all of them.
        let typical: Vec<Job> = specs
            .iter()
            .enumerate()
            .filter_map(|(m, _)| kept.iter().find(|(_, k, _)| *k == m).map(|(r, _, _)| job_of(r, &specs[m])))
            .collect();
        let params = job_params(&typical, cluster, &source)?;
        trace.models = specs.into_iter().zip(params).collect();
        trace.rows = kept;
    }
    let mut names: Vec<&str> = trace
        .made
        .iter()
        .map(|j| j.job.model.name.as_str())
        .chain(trace.models.iter().map(|(m, _)| m.name.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut models = Vec::new();
    for name in names {
        if let Some(spec) = reference.model_spec(name)? {
            let rows = reference.measured_rows(name)?;
            models.push((spec, rows));
        }
    }
    let links = cluster
        .node_groups
        .iter()
        .max_by_key(|g| g.total_gpus())
        .map(Links::from)
        .context("the cluster has no node group")?;
    let truth = Truth::new(mode, &models, links, TESTBED_PROFILED_CPUS_PER_GPU)
        .map_err(|(model, e)| anyhow::anyhow!("fitting the oracle of `{model}` on all its measured rows: {e}"))?;
    for (name, o) in &truth.oracles {
        tracing::debug!(
            "oracle of {name}: {} rows, in-sample error mean {:.1} %, max {:.1} %",
            o.rows,
            o.mean_error * 100.0,
            o.max_error * 100.0
        );
    }
    Ok((trace, truth))
}
