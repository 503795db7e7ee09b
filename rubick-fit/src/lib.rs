//! # rubick-fit: a job's performance model, fitted from a few profiling runs
//!
//! * `fit` — fit the model form `rubick-whitebox/3` (in `rubick_core::perfmodel`) to a
//!   profile table and write a `PerfModel`;
//! * `predict` — iteration time (with a ~95 % interval) of configurations;
//! * `evaluate` — against measured tables (the authors', a job's own, or others'
//!   published ones): profile K rows chosen by the selection rule (or use the authors'
//!   own profiling runs), predict the rest, report error and plan-choice regret;
//! * `check` — validate `PerfModel` files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use rubick_core::artifact::to_yaml;
use rubick_core::fit::{Fit, FitOptions, Observation, fit};
use rubick_core::perf::PerfModel;
use rubick_core::perfmodel::{Links, Params, predict};
use rubick_core::tables::{ProfileRow, ProfileStatus};
use rubick_core::{Cluster, Job, ModelSpec, Placement, Plan};
use rubick_io::cli::{LogArgs, Outcome, ensure_one_stdin};
use rubick_io::files::load_artifact;

pub mod evaluate;
pub mod plot;

const EXAMPLES: &str = "\
Examples:
  C=data/cluster-a800-8x8.yaml R=../shared/reference/rubick-artifact

  # How good is the model? Profile 8 rows per model of the authors' data,
  # predict the rest (one screen; every figure: --all or --summary FILE)
  rubick-fit evaluate --reference $R --model all --cluster $C --samples 8 \\
      --summary summary.yaml --plot fit.svg

  # Fit a job's model from its profile table
  rubick-fit fit profile.csv --job job.yaml --cluster $C -o model.yaml

  # Predict a configuration
  rubick-fit predict model.yaml --cluster $C --plan dp8-mb1-ga1-z2 \\
      --placement 44

  # Which 8 configurations should the profile run? (the rule that
  # `rubick-profile run --budget` uses)
  rubick-fit select --job job.yaml --cluster local.yaml --budget 8 -o chosen.csv
  rubick-fit select --job job.yaml --cluster local.yaml --budget 4 \\
      --from candidates.csv

  # Judge the model on a job's own measured table, or on others' published
  # measurements
  rubick-fit evaluate --table measured.csv --job job.yaml --cluster local.yaml \\
      --samples 4
  rubick-fit evaluate --samples 8 \\
      --external ../shared/reference/external/vtrain_single.csv

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
        /// The Cluster the profile ran on (YAML): its links (NVLink, network, PCIe) and
        /// GPU type (a profile taken on another GPU type is refused)
        #[arg(long)]
        cluster: PathBuf,
        /// Output PerfModel, `-` for stdout
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Predict iteration times of configurations with a fitted PerfModel
    Predict {
        /// The fitted PerfModel (YAML), as `fit` writes it
        model: PathBuf,
        /// The Cluster to predict on (YAML): its links decide the communication terms,
        /// and a placement it cannot hold is refused
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
        /// Predictions as CSV (plan, placement, iter_time_s with its ~95 % interval
        /// low_s / high_s, samples_per_s), `-` for stdout
        #[arg(short, long, default_value = "-")]
        output: PathBuf,
    },
    /// Evaluate the model against measured tables: the authors', a job's, or others'
    /// published measurements
    Evaluate(EvaluateArgs),
    /// Choose which configurations to profile: K that identify the model's terms,
    /// covering every dimension the planner varies (families, GPU counts, TP / PP / DP,
    /// micro-batch and accumulation); the rule `rubick-profile run --budget` uses
    Select(SelectArgs),
    /// Validate PerfModel files (YAML); exit 2 naming the first bad file and field
    Check {
        /// PerfModel files, `-` for stdin
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print the man page (section 1), or write one page per command into --out-dir
    Man {
        /// Write `TOOL.1` and `TOOL-COMMAND.1` here instead
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// Which measured rows `evaluate` judges the model on: exactly one source.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct EvaluateSource {
    /// The authors' reference directory (rubick-artifact); with --cluster
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// A measured table of one job (the `profile` table's columns: plan, placement,
    /// iter_time_s, status); with --job and --cluster
    #[arg(long, requires_all = ["job", "cluster"])]
    pub table: Option<PathBuf>,
    /// Others' published measurements (vTrain, Sailor or Calculon CSV tables of
    /// shared/reference/external/): each row's job and cluster come from the table;
    /// repeat for several tables
    #[arg(long, num_args = 1..)]
    pub external: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct EvaluateArgs {
    #[command(flatten)]
    pub source: EvaluateSource,
    /// With --reference: a model of models.yaml, or `all`
    #[arg(long, default_value = "all")]
    pub model: String,
    /// The Job the --table measured (YAML)
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// The cluster the rows were measured on (--reference, --table)
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Rows to "profile" per job, chosen by the selection rule (at most all but one)
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
    /// Fit from the authors' own profiling runs (profiles/<model>/) instead
    #[arg(long, requires = "reference")]
    pub from_profiles: bool,
    /// SUMMARY.yaml to write: every job's and family's figures and fitted parameters
    /// (`-`: on stdout, as --all). Without it or --all, stdout gets a one-screen summary
    #[arg(long)]
    pub summary: Option<PathBuf>,
    /// Print the full summary (YAML, every job, family and fitted parameter) on stdout
    /// instead of the one-screen summary
    #[arg(long)]
    pub all: bool,
    /// Every row with its prediction (CSV or Parquet)
    #[arg(long)]
    pub rows: Option<PathBuf>,
    /// Predicted vs measured, log-log, one colour per plan family (PNG or SVG)
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the fitted PerfModel of the (single) job here, `-` for stdout
    #[arg(long)]
    pub model_out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct SelectArgs {
    /// The Job to profile (YAML)
    #[arg(long)]
    pub job: PathBuf,
    /// The cluster it will be profiled on (one node of its largest group)
    #[arg(long)]
    pub cluster: PathBuf,
    /// How many configurations to choose
    #[arg(long)]
    pub budget: usize,
    /// Choose among these configurations (CSV or Parquet with columns `plan` and
    /// `placement`; other columns, measured times included, are never read) instead of
    /// the job's plan space on one node
    #[arg(long)]
    pub from: Option<PathBuf>,
    /// The chosen configurations (`plan,placement` CSV, as `rubick-profile run
    /// --configs` reads), in the order chosen; `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Completions { shell } => rubick_io::cli::completions(<Cli as clap::CommandFactory>::command(), shell),
        Command::Man { out_dir } => {
            rubick_io::cli::man_pages(<Cli as clap::CommandFactory>::command(), out_dir.as_deref())
        }
        Command::Select(args) => run_select(&args),
        Command::Check { files } => rubick_io::cli::check_command::<PerfModel>(&files),
        Command::Evaluate(args) => run_evaluate(&args),
        Command::Fit { profile, job, cluster, output } => run_fit(&profile, &job, &cluster, &output),
        Command::Predict { model, cluster, plan, placement, table, output } => {
            run_predict(&model, &cluster, plan.zip(placement), table.as_deref(), &output)
        }
    }
}

fn links_of(cluster: &Cluster) -> Links {
    Links::of_cluster(cluster)
}

fn run_evaluate(args: &EvaluateArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.samples >= 2, "--samples: expected at least 2 rows (a fit needs two), got {}", args.samples);
    // The full YAML summary goes to --summary FILE, or to stdout with --all (or
    // `--summary -`); otherwise stdout gets the one-screen summary, unless the model is
    // written there.
    let model_on_stdout = args.model_out.as_deref().is_some_and(rubick_io::files::is_std);
    let yaml_out: Option<&Path> = match (&args.summary, args.all) {
        (Some(path), _) => Some(path),
        (None, true) => Some(Path::new("-")),
        (None, false) => None,
    };
    let yaml_on_stdout = yaml_out.is_some_and(rubick_io::files::is_std);
    anyhow::ensure!(
        !(model_on_stdout && yaml_on_stdout),
        "--model-out and the summary (--summary - or --all) cannot both be stdout"
    );
    anyhow::ensure!(
        !(args.all && yaml_out.is_some_and(|p| !rubick_io::files::is_std(p))),
        "--all prints the full summary on stdout; with --summary FILE it goes to the file: give one of them"
    );
    // Every output's name, before the first is written.
    if let Some(path) = yaml_out {
        rubick_io::check_output(path, rubick_io::Format::Yaml)?;
    }
    if let Some(path) = &args.model_out {
        rubick_io::check_output(path, rubick_io::Format::Yaml)?;
    }
    if let Some(path) = &args.rows {
        rubick_io::check_output(path, rubick_io::table::TableFormat::for_path(path, None).into())?;
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
    for (name, evaluate::Evaluation { report, rows, perf_model }) in evaluations {
        tracing::info!(
            "{name}: mean error {:.1} % over {} held-out rows",
            100.0 * report.metrics.mean_rel_error.unwrap_or(f64::NAN),
            report.metrics.rows - report.metrics.fitted_rows
        );
        perf_models.push(perf_model);
        reports.push((name, report, rows));
    }
    let (summary, rows) = evaluate::summarize(source, args.samples, reports);
    if let Some(path) = &args.rows {
        write_rows(path, &rows)?;
    }
    if let Some(path) = &args.plot {
        plot::predicted_vs_measured(path, &rows)?;
    }
    if let Some(path) = yaml_out {
        rubick_io::write_output(path, rubick_io::Format::Yaml, serde_yaml_ng::to_string(&summary)?.as_bytes())?;
    }
    if let (Some(path), Some(model)) = (&args.model_out, perf_models.first()) {
        rubick_io::write_output(path, rubick_io::Format::Yaml, to_yaml(model).as_bytes())?;
    }
    if !yaml_on_stdout && !model_on_stdout {
        print!("{}", evaluate::brief(&summary));
    }
    Ok(Outcome::Done)
}

type Evaluated = Vec<(String, evaluate::Evaluation)>;

fn evaluate_reference(args: &EvaluateArgs, reference: &Path) -> anyhow::Result<(&'static str, Evaluated)> {
    let cluster_path = args.cluster.as_deref().context("--reference needs --cluster (the testbed)")?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let links = links_of(&cluster);
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
        let evaluation = evaluate::evaluate_model(name, &model, &measured, links, args.samples, profiles.as_deref())?;
        out.push((name.clone(), evaluation));
    }
    Ok((if args.from_profiles { "profiles" } else { "placements" }, out))
}

fn evaluate_table(args: &EvaluateArgs, table: &Path) -> anyhow::Result<(String, evaluate::Evaluation)> {
    let job_path = args.job.as_deref().context("--table needs --job")?;
    let cluster_path = args.cluster.as_deref().context("--table needs --cluster")?;
    ensure_one_stdin(&[table, job_path, cluster_path])?;
    let job: Job = load_artifact(job_path)?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let rows = profile_observations(table, &job, &cluster)?;
    let configs = evaluate::configs_of(rows.into_iter().map(|o| (o.plan, o.placement, o.iter_time_s)));
    let evaluation = evaluate::evaluate_job(
        &job.name,
        &job.model,
        &configs,
        links_of(&cluster),
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
            if evaluate::samples_for(job.rows.len(), samples).is_none() {
                tracing::info!("{name}: {} row(s), too few to fit two and predict one; left out", job.rows.len());
                continue;
            }
            let configs = evaluate::configs_of(job.rows.iter().map(|r| (r.plan, r.placement.clone(), r.iter_time_s)));
            let links = links_of(&job.cluster);
            let source = format!("{} ({})", path.display(), job.name);
            let evaluation = evaluate::evaluate_job(&name, &job.model, &configs, links, samples, None, &source)?;
            out.push((name, evaluation));
        }
    }
    Ok(out)
}

fn run_select(args: &SelectArgs) -> anyhow::Result<Outcome> {
    use rubick_core::select::{Candidate, one_node_candidates, select};
    anyhow::ensure!(args.budget >= 1, "--budget: expected at least 1 configuration, got 0");
    let inputs: Vec<&Path> =
        [Some(args.job.as_path()), Some(args.cluster.as_path()), args.from.as_deref()].into_iter().flatten().collect();
    ensure_one_stdin(&inputs)?;
    rubick_io::cli::ensure_not_an_input(&args.output, &inputs)?;
    let job: Job = load_artifact(&args.job)?;
    let cluster: Cluster = load_artifact(&args.cluster)?;
    let candidates: Vec<Candidate> = match &args.from {
        Some(path) => {
            let configs = rubick_io::table::read_configurations(path)?;
            let mut kept = Vec::with_capacity(configs.len());
            for (i, (plan, placement)) in configs.into_iter().enumerate() {
                plan.check(&job.model, placement.gpus()).map_err(|v| {
                    anyhow::anyhow!("{}: line {}: plan `{plan}` on placement {placement}: {v}", path.display(), i + 2)
                })?;
                match job.refusal(&plan) {
                    Some(why) => tracing::warn!(
                        "{}: line {}: `{plan}` left out: it uses {why}, which the job's script does not implement",
                        path.display(),
                        i + 2
                    ),
                    None => kept.push(Candidate { plan, placement }),
                }
            }
            kept
        }
        None => {
            let group = cluster
                .node_groups
                .iter()
                .max_by_key(|g| g.gpus_per_node)
                .with_context(|| format!("{}: no node group", args.cluster.display()))?;
            one_node_candidates(&job, group, &rubick_core::MemoryEstimator::default())
        }
    };
    anyhow::ensure!(!candidates.is_empty(), "job `{}`: no configuration to choose from", job.name);
    let chosen = select(&candidates, args.budget);
    if chosen.len() < args.budget {
        tracing::warn!("--budget {}: only {} configurations to choose from; all chosen", args.budget, chosen.len());
    }
    let mut out = String::from("plan,placement\n");
    for i in chosen {
        out.push_str(&format!("{},{}\n", candidates[i].plan, candidates[i].placement));
    }
    rubick_io::write_output(&args.output, rubick_io::Format::Csv, out.as_bytes())?;
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

fn run_fit(profile: &Path, job: &Path, cluster: &Path, output: &Path) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&[profile, job, cluster])?;
    rubick_io::cli::ensure_not_an_input(output, &[profile, job, cluster])?;
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
                rubick_core::perf::FLAG_FACTOR
            );
        }
        tracing::info!("fit: {} rows, mean in-sample error {:.1} %", rows.len(), d.mean_rel_error * 100.0);
    }
    rubick_io::write_output(output, rubick_io::Format::Yaml, to_yaml(&model).as_bytes())?;
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
    cluster_path: &Path,
    one: Option<(Plan, Placement)>,
    table: Option<&Path>,
    output: &Path,
) -> anyhow::Result<Outcome> {
    let inputs: Vec<&Path> = [Some(model_path), Some(cluster_path), table].into_iter().flatten().collect();
    ensure_one_stdin(&inputs)?;
    rubick_io::cli::ensure_not_an_input(output, &inputs)?;
    let model: PerfModel = load_artifact(model_path)?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let spec: ModelSpec = model
        .model_spec
        .clone()
        .with_context(|| format!("{}: modelSpec: missing (needed to predict)", model_path.display()))?;
    let params = params_of(&model, model_path)?;
    let links = links_of(&cluster);
    if model.log_covariance().is_none() {
        tracing::warn!(
            "{}: no diagnostics.logCovariance (fitted by an older rubick-fit): no intervals, low_s = high_s",
            model_path.display()
        );
    }
    // Where each configuration comes from, for messages: the table's line or the flags.
    let configs: Vec<(String, Plan, Placement)> = match (one, table) {
        (Some((plan, placement)), _) => vec![("--plan/--placement".to_owned(), plan, placement)],
        (None, Some(path)) => rubick_io::table::read_configurations(path)?
            .into_iter()
            .enumerate()
            .map(|(i, (plan, placement))| (format!("{}: line {}", path.display(), i + 2), plan, placement))
            .collect(),
        (None, None) => bail!("give --plan and --placement, or --table"),
    };
    let mut out = String::from("plan,placement,iter_time_s,low_s,high_s,samples_per_s\n");
    let mut bad = Vec::new();
    for (at, plan, placement) in &configs {
        let problem = plan
            .check(&spec, placement.gpus())
            .err()
            .map(|v| v.to_string())
            .or_else(|| cluster_cannot_hold(&cluster, placement));
        if let Some(why) = problem {
            bad.push(format!("{at}: plan `{plan}` on placement {placement}: {why}"));
            continue;
        }
        let (low, t, high) = model.predict_interval(&params, plan, placement, &links).unwrap_or_else(|| {
            let t = predict(&spec, plan, placement, &links, &params).total;
            (t, t, t)
        });
        out.push_str(&format!("{plan},{placement},{t:.6},{low:.6},{high:.6},{:.4}\n", spec.global_batch as f64 / t));
    }
    if configs.len() == bad.len() {
        bail!("{}", bad.join("\n"));
    }
    for b in &bad {
        tracing::error!("{b}; not predicted");
    }
    rubick_io::write_output(output, rubick_io::Format::Csv, out.as_bytes())?;
    // Some rows were predicted, some refused: the output is written, the exit says so.
    if bad.is_empty() {
        Ok(Outcome::Done)
    } else {
        bail!("{} of {} configurations refused (above)", bad.len(), configs.len())
    }
}

/// Why `cluster` cannot hold `placement` (no node group with enough nodes of enough
/// GPUs), or `None` when one can.
fn cluster_cannot_hold(cluster: &Cluster, placement: &Placement) -> Option<String> {
    let fits =
        cluster.node_groups.iter().any(|g| placement.max_per_node() <= g.gpus_per_node && placement.nodes() <= g.count);
    (!fits).then(|| {
        format!(
            "the cluster `{}` has no group of {} node(s) with {} GPUs each",
            cluster.name,
            placement.nodes(),
            placement.max_per_node()
        )
    })
}
