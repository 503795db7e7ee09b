//! Loading a trace for simulation: its jobs with their beliefs, and the truth.

use std::path::Path;

use crate::truth::{Truth, TruthMode};
use anyhow::Context;
use rubick_core::job::{JobRequest, Resharding};
use rubick_core::perfmodel::Links;
use rubick_core::reference::TESTBED_PROFILED_CPUS_PER_GPU;
use rubick_core::{Cluster, Job, JobBatch, PlanRequest};
use rubick_io::files::{parse_artifact, read_text};
use rubick_io::reference::{ReferenceData, read_trace};

use crate::SimJob;
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
    let mut trace_codes = Vec::new();
    let jobs: Vec<Job> = if trace.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        let text = read_text(trace)?;
        parse_artifact::<JobBatch>(trace, &text)?.jobs
    } else {
        let rows = read_trace(trace)?;
        let mut specs = std::collections::BTreeMap::new();
        // Requested plans the job's model rejects, by reason: the lines.
        let mut unusable_plans: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        let mut jobs = Vec::with_capacity(rows.len());
        for (i, r) in rows.iter().enumerate() {
            let line = i + 2;
            if !specs.contains_key(&r.application) {
                let spec = reference.model_spec(&r.application)?.with_context(|| {
                    format!(
                        "{}: line {line}: application `{}` is not a model of the reference data",
                        trace.display(),
                        r.application
                    )
                })?;
                specs.insert(r.application.clone(), spec);
            }
            let mut job = Job {
                api_version: None,
                kind: None,
                name: r.name.clone(),
                model: specs[&r.application].clone(),
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
            };
            trace_codes.push(None);
            if let Err(e) = job.check() {
                // The reference's model shapes disagree with a few of its own plans
                // (GPT-2's `151`: TP 5 of 19 heads): the job asks for its GPUs only.
                if e.field == "request.plan" {
                    unusable_plans.entry(e.to_string()).or_default().push(line);
                    job.request.plan = None;
                    trace_codes[i] = Some(r.exec_plan);
                }
                job.check().map_err(|e| anyhow::anyhow!("{}: line {line}: {e}", trace.display()))?;
            }
            jobs.push(job);
        }
        for (reason, lines) in &unusable_plans {
            let shown: Vec<String> = lines.iter().take(6).map(ToString::to_string).collect();
            let more = if lines.len() > shown.len() { ", ..." } else { "" };
            tracing::warn!(
                "{}: {} job(s) (line {}{more}): {reason}; they keep their GPUs, not their plan (static policies run \
                 the plan as measured)",
                trace.display(),
                lines.len(),
                shown.join(", ")
            );
        }
        jobs
    };
    let params = job_params(&jobs, cluster, &ModelSource { jobs_path: Some(trace), reference: Some(reference) })?;
    let mut names: Vec<&str> = jobs.iter().map(|j| j.model.name.as_str()).collect();
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
    trace_codes.resize(jobs.len(), None);
    let sim_jobs = jobs
        .into_iter()
        .zip(params)
        .zip(trace_codes)
        .map(|((job, params), trace_code)| SimJob { job, params, trace_code })
        .collect();
    Ok((sim_jobs, truth))
}
