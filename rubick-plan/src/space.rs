//! `rubick-plan space`: a job's feasible plans on N GPUs.

use polars::prelude::*;
use rubick_core::plan::Offload;
use rubick_core::tables::TableSchema;
use rubick_io::cli::{ListFormat, Outcome, ensure_one_stdin};
use rubick_io::table::TableFormat;
use rubick_model::{MemoryEstimator, PlanSpace};
use serde::Serialize;

use crate::{SpaceArgs, job_spaces, load_cluster, load_jobs};

/// One job's plan space on one node group, as listed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JobSpace {
    job: String,
    #[serde(flatten)]
    space: PlanSpace,
}

/// The CSV listing has no fixed artifact schema of its own; it is named for Parquet
/// metadata only.
const SPACE_TABLE: TableSchema = TableSchema { name: "plan-space", columns: &[] };

pub fn run(args: &SpaceArgs) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&[&args.jobs, &args.cluster])?;
    rubick_io::cli::ensure_not_an_input(&args.output, &[args.jobs.as_path(), args.cluster.as_path()])?;
    let format = ListFormat::resolve(args.format, &args.output)?;
    let cluster = load_cluster(&args.cluster)?;
    let jobs = load_jobs(&args.jobs)?;
    let estimator = MemoryEstimator { reserve_gib: args.reserve_gib };

    let mut listing = Vec::new();
    let mut empty_jobs = Vec::new();
    for job in &jobs {
        let gpus = args.gpus.unwrap_or(job.request.gpus);
        let spaces = job_spaces(job, &cluster, gpus, &estimator);
        if spaces.iter().all(|s| s.plans.is_empty()) {
            tracing::warn!("job `{}`: no feasible plan on {gpus} GPUs of cluster `{}`", job.name, cluster.name);
            empty_jobs.push(format!("{} ({gpus} GPUs)", job.name));
        }
        for space in spaces {
            tracing::info!(
                "job `{}` on {} x {}: {} feasible of {} valid plans",
                job.name,
                space.gpus,
                space.gpu_type,
                space.plans.len(),
                space.valid_plans
            );
            listing.push(JobSpace { job: job.name.clone(), space });
        }
    }

    match format {
        ListFormat::Yaml => rubick_io::write_output(
            &args.output,
            rubick_io::Format::Yaml,
            serde_yaml_ng::to_string(&listing)?.as_bytes(),
        )?,
        ListFormat::Csv => {
            let mut df = to_frame(&listing)?;
            rubick_io::table::write_table(&mut df, &args.output, Some(TableFormat::Csv), &SPACE_TABLE)?;
        }
        ListFormat::Parquet => {
            let mut df = to_frame(&listing)?;
            rubick_io::table::write_table(&mut df, &args.output, Some(TableFormat::Parquet), &SPACE_TABLE)?;
        }
    }

    if empty_jobs.len() == jobs.len() {
        return Ok(Outcome::Negative(format!("no feasible plan for any job: {}", empty_jobs.join(", "))));
    }
    Ok(Outcome::Done)
}

fn to_frame(listing: &[JobSpace]) -> PolarsResult<DataFrame> {
    let rows: Vec<(&JobSpace, &rubick_model::SpaceEntry)> =
        listing.iter().flat_map(|js| js.space.plans.iter().map(move |e| (js, e))).collect();
    let text =
        |f: &dyn Fn(&(&JobSpace, &rubick_model::SpaceEntry)) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let int = |f: &dyn Fn(&(&JobSpace, &rubick_model::SpaceEntry)) -> u32| rows.iter().map(f).collect::<Vec<u32>>();
    let num = |f: &dyn Fn(&(&JobSpace, &rubick_model::SpaceEntry)) -> f64| {
        rows.iter().map(|r| (f(r) * 1000.0).round() / 1000.0).collect::<Vec<f64>>()
    };
    DataFrame::new_infer_height(vec![
        Column::new("job".into(), text(&|r| r.0.job.clone())),
        Column::new("node_group".into(), text(&|r| r.0.space.node_group.clone())),
        Column::new("gpu_type".into(), text(&|r| r.0.space.gpu_type.clone())),
        Column::new("gpus".into(), int(&|r| r.0.space.gpus)),
        Column::new("plan".into(), text(&|r| r.1.plan.to_string())),
        Column::new("family".into(), text(&|r| r.1.family.to_string())),
        Column::new("dp".into(), int(&|r| r.1.plan.dp)),
        Column::new("tp".into(), int(&|r| r.1.plan.tp)),
        Column::new("pp".into(), int(&|r| r.1.plan.pp)),
        Column::new("zero".into(), int(&|r| u32::from(r.1.plan.zero.level()))),
        Column::new("offload".into(), text(&|r| Offload::as_str(r.1.plan.offload).to_owned())),
        Column::new("ga".into(), int(&|r| r.1.plan.ga)),
        Column::new("checkpointing".into(), rows.iter().map(|r| r.1.plan.checkpointing()).collect::<Vec<bool>>()),
        Column::new("recompute".into(), text(&|r| r.1.plan.recompute.as_str().to_owned())),
        Column::new("sequence_parallel".into(), rows.iter().map(|r| r.1.plan.sp).collect::<Vec<bool>>()),
        Column::new("virtual_stages".into(), int(&|r| r.1.plan.vp)),
        Column::new("micro_batch".into(), int(&|r| r.1.plan.micro_batch)),
        Column::new("weights_gib".into(), num(&|r| r.1.memory.weights_gib)),
        Column::new("gradients_gib".into(), num(&|r| r.1.memory.gradients_gib)),
        Column::new("optimizer_gib".into(), num(&|r| r.1.memory.optimizer_gib)),
        Column::new("activations_gib".into(), num(&|r| r.1.memory.activations_gib)),
        Column::new("total_gib".into(), num(&|r| r.1.memory.total_gib)),
        Column::new("gpu_memory_gib".into(), num(&|r| r.0.space.gpu_memory_gib)),
    ])
}
