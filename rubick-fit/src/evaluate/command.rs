//! `rubick-fit evaluate`, the command: the measured rows of one source (the authors'
//! reference, a job's table, others' published tables) judged by [`super`], and the
//! summary, rows, plot and model written where asked.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rubick_core::artifact::to_yaml;
use rubick_core::tables::TableSchema;
use rubick_core::{Cluster, Job};
use rubick_io::cli::{Outcome, ensure_one_stdin};
use rubick_io::files::{is_std, load_artifact};
use rubick_io::{Format, check_output, write_output};
use rubick_model::perfmodel::Links;

use super::{EvaluatedRow, Evaluation, brief, configs_of, evaluate_job, evaluate_model, samples_for, summarize};
use crate::fit::profile_observations;
use crate::{EvaluateArgs, plot};

pub(crate) fn run(args: &EvaluateArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.samples >= 2, "--samples: expected at least 2 rows (a fit needs two), got {}", args.samples);
    // The full YAML summary goes to --summary FILE, or to stdout with --all (or
    // `--summary -`); otherwise stdout gets the one-screen summary, unless the model is
    // written there.
    let model_on_stdout = args.model_out.as_deref().is_some_and(is_std);
    let yaml_out: Option<&Path> = match (&args.summary, args.all) {
        (Some(path), _) => Some(path),
        (None, true) => Some(Path::new("-")),
        (None, false) => None,
    };
    let yaml_on_stdout = yaml_out.is_some_and(is_std);
    anyhow::ensure!(
        !(model_on_stdout && yaml_on_stdout),
        "--model-out and the summary (--summary - or --all) cannot both be stdout"
    );
    anyhow::ensure!(
        !(args.all && yaml_out.is_some_and(|p| !is_std(p))),
        "--all prints the full summary on stdout; with --summary FILE it goes to the file: give one of them"
    );
    // Every output's name, before the first is written.
    if let Some(path) = yaml_out {
        check_output(path, Format::Yaml)?;
    }
    if let Some(path) = &args.model_out {
        check_output(path, Format::Yaml)?;
    }
    if let Some(path) = &args.rows {
        check_output(path, rubick_io::table::TableFormat::for_path(path, None).into())?;
    }
    let (source, evaluations) = if let Some(reference) = &args.source.reference {
        evaluate_reference(args, reference)?
    } else if let Some(table) = &args.source.table {
        ("table", vec![evaluate_table(args, table)?])
    } else {
        ("external", evaluate_external(&args.source.external, args.samples)?)
    };
    anyhow::ensure!(
        args.model_out.is_none() || evaluations.len() == 1,
        "--model-out: needs a single job, and {} were evaluated",
        evaluations.len()
    );
    let mut reports = Vec::new();
    let mut perf_models = Vec::new();
    for (name, Evaluation { report, rows, perf_model }) in evaluations {
        tracing::info!(
            "{name}: mean error {:.1} % over {} held-out rows",
            100.0 * report.metrics.mean_rel_error.unwrap_or(f64::NAN),
            report.metrics.rows - report.metrics.fitted_rows
        );
        perf_models.push(perf_model);
        reports.push((name, report, rows));
    }
    let (summary, rows) = summarize(source, args.samples, reports);
    if let Some(path) = &args.rows {
        write_rows(path, &rows)?;
    }
    if let Some(path) = &args.plot {
        plot::predicted_vs_measured(path, &rows)?;
    }
    if let Some(path) = yaml_out {
        write_output(path, Format::Yaml, serde_yaml_ng::to_string(&summary)?.as_bytes())?;
    }
    if let (Some(path), Some(model)) = (&args.model_out, perf_models.first()) {
        write_output(path, Format::Yaml, to_yaml(model).as_bytes())?;
    }
    if !yaml_on_stdout && !model_on_stdout {
        print!("{}", brief(&summary));
    }
    Ok(Outcome::Done)
}

type Evaluated = Vec<(String, Evaluation)>;

fn evaluate_reference(args: &EvaluateArgs, reference: &Path) -> anyhow::Result<(&'static str, Evaluated)> {
    let cluster_path = args.cluster.as_deref().context("--reference needs --cluster (the testbed)")?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let links = Links::of_cluster(&cluster);
    let data = rubick_io::reference::ReferenceData::open(reference)?;
    let names: Vec<String> = if args.model == "all" {
        data.model_names().into_iter().map(str::to_owned).collect()
    } else {
        if data.facts(&args.model).is_none() {
            bail!(
                "--model: `{}` is not in models.yaml (expected one of: {}, or all)",
                args.model,
                data.model_names().join(", ")
            );
        }
        vec![args.model.clone()]
    };
    let mut out = Vec::new();
    for name in &names {
        let model = data.model_spec(name)?.context("listed model")?;
        let measured = data.measured_rows(name)?;
        let profiles = if args.from_profiles { Some(data.profiles(name)?) } else { None };
        let evaluation = evaluate_model(name, &model, &measured, links, args.samples, profiles.as_deref())?;
        out.push((name.clone(), evaluation));
    }
    Ok((if args.from_profiles { "profiles" } else { "placements" }, out))
}

fn evaluate_table(args: &EvaluateArgs, table: &Path) -> anyhow::Result<(String, Evaluation)> {
    let job_path = args.job.as_deref().context("--table needs --job")?;
    let cluster_path = args.cluster.as_deref().context("--table needs --cluster")?;
    ensure_one_stdin(&[table, job_path, cluster_path])?;
    let job: Job = load_artifact(job_path)?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let rows = profile_observations(table, &job, &cluster)?;
    let configs = configs_of(rows.into_iter().map(|o| (o.plan, o.placement, o.iter_time_s)));
    let evaluation = evaluate_job(
        &job.name,
        &job.model,
        &configs,
        Links::of_cluster(&cluster),
        args.samples,
        None,
        &table.display().to_string(),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", table.display()))?;
    Ok((job.name.clone(), evaluation))
}

/// Every job of external tables with at least 3 rows, named `set/job`; jobs with fewer
/// rows, and rows rubick cannot write, are logged as left out.
pub fn evaluate_external(paths: &[PathBuf], samples: usize) -> anyhow::Result<Evaluated> {
    let mut out = Vec::new();
    for path in paths {
        let (set, data) = rubick_io::external::read(path)?;
        for aside in &data.set_aside {
            tracing::info!("{}: line {}: left out: {}", path.display(), aside.line, aside.reason);
        }
        for job in &data.jobs {
            let name = format!("{set}/{}", job.name);
            if samples_for(job.rows.len(), samples).is_none() {
                tracing::info!("{name}: {} row(s), too few to fit two and predict one; left out", job.rows.len());
                continue;
            }
            let configs = configs_of(job.rows.iter().map(|r| (r.plan, r.placement.clone(), r.iter_time_s)));
            let links = Links::of_cluster(&job.cluster);
            let source = format!("{} ({})", path.display(), job.name);
            let evaluation = evaluate_job(&name, &job.model, &configs, links, samples, None, &source)?;
            out.push((name, evaluation));
        }
    }
    Ok(out)
}

fn write_rows(path: &Path, rows: &[EvaluatedRow]) -> anyhow::Result<()> {
    use polars::prelude::*;
    let text = |f: fn(&EvaluatedRow) -> &str| rows.iter().map(|r| f(r).to_owned()).collect::<Vec<String>>();
    let num = |f: fn(&EvaluatedRow) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
    let mut df = DataFrame::new_infer_height(vec![
        Column::new("model".into(), text(|r| &r.model)),
        Column::new("code".into(), text(|r| &r.code)),
        Column::new("family".into(), text(|r| &r.family)),
        Column::new("plan".into(), text(|r| &r.plan)),
        Column::new("placement".into(), text(|r| &r.placement)),
        Column::new("measured_s".into(), num(|r| r.measured_s)),
        Column::new("predicted_s".into(), num(|r| r.predicted_s)),
        Column::new("lower_s".into(), num(|r| r.lower_s)),
        Column::new("upper_s".into(), num(|r| r.upper_s)),
        Column::new("rel_error".into(), num(|r| r.rel_error())),
        Column::new("fitted".into(), rows.iter().map(|r| r.fitted).collect::<Vec<bool>>()),
        Column::new("flagged".into(), rows.iter().map(|r| r.flagged).collect::<Vec<bool>>()),
    ])?;
    const TABLE: TableSchema = TableSchema { name: "evaluate-rows", columns: &[] };
    rubick_io::table::write_table(&mut df, path, None, &TABLE)?;
    Ok(())
}
