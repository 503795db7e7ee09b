//! # rubick-fit: a job's performance model, fitted from a few profiling runs
//!
//! * `fit` — fit the model form `rubick-whitebox/1` (in `rubick_core::perfmodel`) to a
//!   profile table and write a `PerfModel`;
//! * `predict` — iteration time (with a ~95 % interval) of configurations;
//! * `evaluate` — against the authors' measured tables: profile K rows chosen by the
//!   selection rule (or use their own profiling runs), predict the rest, report;
//! * `check` — validate `PerfModel` files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use rubick_core::artifact::to_yaml;
use rubick_core::fit::{Fit, FitOptions, Observation, fit};
use rubick_core::perf::PerfModel;
use rubick_core::perfmodel::{Links, Params, predict};
use rubick_core::tables::ProfileRow;
use rubick_core::{Cluster, Job, ModelSpec, Placement, Plan};
use rubick_io::cli::{LogArgs, Outcome, ensure_one_stdin};
use rubick_io::files::load_artifact;

pub mod evaluate;
pub mod plot;

const EXAMPLES: &str = "\
Examples:
  # How good is the model? Profile 8 rows per model of the authors' data, predict the rest
  rubick-fit evaluate --reference ../shared/reference/rubick-artifact --model all \\
      --cluster data/cluster-a800-8x8.yaml --samples 8 --summary summary.yaml --plot fit.svg

  # Fit a job's model from its profile table
  rubick-fit fit profile.csv --job job.yaml --cluster data/cluster-a800-8x8.yaml -o model.yaml

  # Predict a configuration
  rubick-fit predict model.yaml --cluster data/cluster-a800-8x8.yaml --plan dp8-mb1-ga1-z2 --placement 44

  # Validate a fitted model
  rubick-fit check model.yaml";

/// Fit the performance model of a training job: iteration time across execution plans
/// and placements, from a few profiled runs (Rubick, arXiv 2408.08586).
#[derive(Debug, Parser)]
#[command(name = "rubick-fit", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fit a job's model from a profile table (CSV or Parquet) into a PerfModel
    Fit {
        /// Profile table (columns of the `profile` table schema), `-` for stdin (CSV)
        profile: PathBuf,
        /// The Job the profile measured (YAML)
        #[arg(long)]
        job: PathBuf,
        #[arg(long)]
        cluster: PathBuf,
        /// Output PerfModel, `-` for stdout
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Predict iteration times of configurations with a fitted PerfModel
    Predict {
        model: PathBuf,
        #[arg(long)]
        cluster: PathBuf,
        /// A plan (dp4-tp2-pp1-mb2-ga1); with --placement
        #[arg(long, requires = "placement")]
        plan: Option<Plan>,
        /// GPUs per node, e.g. 44
        #[arg(long, requires = "plan")]
        placement: Option<Placement>,
        /// A table of configurations (columns `plan`, `placement`), instead of one
        #[arg(long, conflicts_with = "plan")]
        table: Option<PathBuf>,
    },
    /// Evaluate the model against the authors' measured tables
    Evaluate(EvaluateArgs),
    /// Validate PerfModel files (YAML); exit 2 naming the first bad file and field
    Check {
        /// PerfModel files, `-` for stdin
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    /// The reference directory (rubick-artifact)
    #[arg(long)]
    pub reference: PathBuf,
    /// A model of models.yaml, or `all`
    #[arg(long, default_value = "all")]
    pub model: String,
    #[arg(long)]
    pub cluster: PathBuf,
    /// Rows to "profile" per model, chosen by the selection rule
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
    /// Fit from the authors' own profiling runs (profiles/<model>/) instead
    #[arg(long)]
    pub from_profiles: bool,
    /// SUMMARY.yaml to write, `-` for stdout
    #[arg(long, default_value = "-")]
    pub summary: PathBuf,
    /// Every row with its prediction (CSV or Parquet)
    #[arg(long)]
    pub rows: Option<PathBuf>,
    /// Predicted vs measured, log-log, one colour per plan family (PNG or SVG)
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the fitted PerfModel of the (single) --model here, `-` for stdout
    #[arg(long)]
    pub model_out: Option<PathBuf>,
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Check { files } => rubick_io::cli::check_command::<PerfModel>(&files),
        Command::Evaluate(args) => run_evaluate(&args),
        Command::Fit { profile, job, cluster, output } => run_fit(&profile, &job, &cluster, &output),
        Command::Predict { model, cluster, plan, placement, table } => {
            run_predict(&model, &cluster, plan.zip(placement), table.as_deref())
        }
    }
}

fn links_of(cluster: &Cluster) -> Links {
    Links::of_cluster(cluster)
}

fn run_evaluate(args: &EvaluateArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.samples >= 1, "--samples: expected at least 1 row, got 0");
    let cluster: Cluster = load_artifact(&args.cluster)?;
    let links = links_of(&cluster);
    let data = rubick_io::reference::ReferenceData::open(&args.reference)?;
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
    anyhow::ensure!(args.model_out.is_none() || names.len() == 1, "--model-out: needs a single --model, not `all`");
    anyhow::ensure!(
        !(args.model_out.as_deref().is_some_and(rubick_io::files::is_std) && rubick_io::files::is_std(&args.summary)),
        "--model-out and --summary cannot both be stdout"
    );
    let mut reports = Vec::new();
    let mut perf_models = Vec::new();
    for name in &names {
        let model = data.model_spec(name)?.context("listed model")?;
        let measured = data.measured_rows(name)?;
        let profiles = if args.from_profiles { Some(data.profiles(name)?) } else { None };
        let evaluate::Evaluation { report, rows, perf_model } =
            evaluate::evaluate_model(name, &model, &measured, links, args.samples, profiles.as_deref())?;
        perf_models.push(perf_model);
        tracing::info!(
            "{name}: mean error {:.1} % over {} held-out rows",
            100.0 * report.metrics.mean_rel_error.unwrap_or(f64::NAN),
            report.metrics.rows - report.metrics.fitted_rows
        );
        reports.push((name.clone(), report, rows));
    }
    let source = if args.from_profiles { "profiles" } else { "placements" };
    let (summary, rows) = evaluate::summarize(source, args.samples, reports);
    if let Some(path) = &args.rows {
        write_rows(path, &rows)?;
    }
    if let Some(path) = &args.plot {
        plot::predicted_vs_measured(path, &rows)?;
    }
    rubick_io::write_output(&args.summary, serde_yaml_ng::to_string(&summary)?.as_bytes())?;
    if let (Some(path), Some(model)) = (&args.model_out, perf_models.first()) {
        rubick_io::write_output(path, to_yaml(model).as_bytes())?;
    }
    Ok(Outcome::Done)
}

fn write_rows(path: &Path, rows: &[evaluate::EvaluatedRow]) -> anyhow::Result<()> {
    use polars::prelude::*;
    let text = |f: fn(&evaluate::EvaluatedRow) -> &str| rows.iter().map(|r| f(r).to_owned()).collect::<Vec<String>>();
    let num = |f: fn(&evaluate::EvaluatedRow) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
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
    const TABLE: rubick_core::tables::TableSchema =
        rubick_core::tables::TableSchema { name: "evaluate-rows", columns: &[] };
    rubick_io::table::write_table(&mut df, path, None, &TABLE)?;
    Ok(())
}

/// Reads a profile table into observations of `job` on `cluster`: its measured runs
/// (status `ok`, or no status column); out-of-memory, failed and timed-out runs are
/// counted and left out.
pub fn profile_observations(path: &Path, job: &Job, cluster: &Cluster) -> anyhow::Result<Vec<Observation>> {
    let table: Vec<ProfileRow> = rubick_io::table::read_rows(path, &rubick_core::tables::PROFILE)?;
    anyhow::ensure!(!table.is_empty(), "{}: no measured rows to fit (only a header)", path.display());
    let links = links_of(cluster);
    let mut rows = Vec::with_capacity(table.len());
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    for (i, row) in table.iter().enumerate() {
        let at = |what: &str| format!("{}: line {}: {what}", path.display(), i + 2);
        let plan: Plan = row.plan.parse().with_context(|| at("plan"))?;
        let placement: Placement = row.placement.parse().with_context(|| at("placement"))?;
        if let Some(status) = row.status.as_deref().filter(|s| *s != "ok") {
            *skipped.entry(status.to_owned()).or_default() += 1;
            continue;
        }
        let iter_time_s = row.iter_time_s.with_context(|| {
            at("iter_time_s: a measured run needs a positive, finite number of seconds (empty or not a number)")
        })?;
        plan.check(&job.model, placement.gpus())
            .map_err(|v| anyhow::anyhow!("{}", at(&format!("plan `{plan}`: {v}"))))?;
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

fn run_fit(profile: &Path, job: &Path, cluster: &Path, output: &Path) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&[profile, job, cluster])?;
    let job: Job = load_artifact(job)?;
    let cluster: Cluster = load_artifact(cluster)?;
    let rows = profile_observations(profile, &job, &cluster)?;
    let fitted =
        fit(&job.model, &rows, &FitOptions::default()).map_err(|e| anyhow::anyhow!("{}: {e}", profile.display()))?;
    let model = perf_model_artifact(&job.model, &rows, &fitted, &profile.display().to_string());
    rubick_io::write_output(output, to_yaml(&model).as_bytes())?;
    Ok(Outcome::Done)
}

/// The `PerfModel` artifact of a fit (see [`PerfModel::of_fit`]).
pub fn perf_model_artifact(spec: &ModelSpec, rows: &[Observation], fitted: &Fit, source: &str) -> PerfModel {
    PerfModel::of_fit(spec, rows, fitted, source)
}

/// The parameters of a PerfModel in the form's order; unknown names are errors.
pub fn params_of(model: &PerfModel, path: &Path) -> anyhow::Result<Params> {
    model.params().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn run_predict(
    model_path: &Path,
    cluster: &Path,
    one: Option<(Plan, Placement)>,
    table: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let model: PerfModel = load_artifact(model_path)?;
    let cluster: Cluster = load_artifact(cluster)?;
    let spec: ModelSpec = model
        .model_spec
        .clone()
        .with_context(|| format!("{}: modelSpec: missing (needed to predict)", model_path.display()))?;
    let params = params_of(&model, model_path)?;
    let links = links_of(&cluster);
    let configs: Vec<(Plan, Placement)> = match (one, table) {
        (Some(c), _) => vec![c],
        (None, Some(path)) => rubick_io::table::read_configurations(path)?,
        (None, None) => bail!("give --plan and --placement, or --table"),
    };
    let mut out = String::from("plan,placement,iter_time_s,samples_per_s\n");
    for (plan, placement) in configs {
        plan.check(&spec, placement.gpus()).map_err(|v| anyhow::anyhow!("plan `{plan}` on {placement}: {v}"))?;
        let t = predict(&spec, &plan, &placement, &links, &params).total;
        out.push_str(&format!("{plan},{placement},{t:.6},{:.4}\n", spec.global_batch as f64 / t));
    }
    rubick_io::write_output(Path::new("-"), out.as_bytes())?;
    Ok(Outcome::Done)
}
