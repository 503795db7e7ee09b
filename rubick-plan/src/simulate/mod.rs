//! `rubick-plan simulate` and `rubick-plan compare`: the command line of the simulator
//! (the simulator itself, its truth and summary are library code in [`rubick_sim`];
//! the policies it runs are [`rubick_policy`]'s).

mod plots;
mod render;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use rubick_core::artifact::to_yaml;
use rubick_core::simulation::SimulationSummary;
use rubick_core::tables::{SIM_JOBS, SimJobRow};
use rubick_io::cli::Outcome;
use rubick_io::files::load_artifact;
use rubick_io::flags;
use rubick_io::plot::write_figure;
use rubick_io::reference::ReferenceData;
use rubick_planner::PlannerConfig;
use rubick_sim::truth::TruthMode;

use plots::{CdfFigure, GanttFigure, RestartsFigure, UsageFigure};
use rubick_policy::Queue;
use rubick_policy::Registration;
use rubick_sim::summary::summarize;
use rubick_sim::trace::open_trace;
use rubick_sim::{SimConfig, SimJob, SimResult, simulate_seeds};

const SIMULATE_EXAMPLES: &str = "\
Examples:
  R=../shared/reference/rubick-artifact C=data/cluster-a800-8x8.yaml
  T=$R/workloads/workload-base.csv
  # Rubick on the authors' base trace: per-job table, summary, plots
  rubick-plan simulate --cluster $C --reference $R --trace $T \\
      --summary rubick.yaml --jobs-out rubick.parquet --plot-dir plots/

  # Every policy under shortest-remaining-work admission, then one table
  for p in rubick rubick-milp static static-backfill synergy sia pollux \\
           static-guaranteed-first rubick-gpus-only rubick-no-plan \\
           rubick-no-resize; do
    rubick-plan simulate -q --cluster $C --reference $R --trace $T \\
        --policy $p --queue srpt --summary $p.yaml
  done
  rubick-plan compare *.yaml --plot jct-cdf.png --restarts-plot restarts.png

  # Half the jobs guaranteed; only configurations the authors measured
  rubick-plan simulate --cluster $C --reference $R \\
      --trace $R/workloads/workload-bp.csv --guarantee-share 0.5 \\
      --measured-only --summary -

  # Five replicas with 2 % noise on true iteration times (mean and spread of
  # every figure); extrapolated configurations 30 % slower than the oracle
  rubick-plan simulate --cluster $C --reference $R --trace $T \\
      --seeds 5 --noise 0.02 --extrapolated-slowdown 0.3 --summary -

  # The old rule for comparison: unmeasured configurations run as the policy
  # believes
  rubick-plan simulate --cluster $C --reference $R --trace $T \\
      --truth belief --summary -";

#[derive(Debug, clap::Args)]
#[command(after_help = SIMULATE_EXAMPLES)]
pub struct SimulateArgs {
    /// The Cluster (YAML)
    #[arg(long)]
    pub cluster: PathBuf,
    /// The trace: the reference workload format (CSV) or a JobBatch (YAML) whose jobs
    /// carry submitTimeS and iterations
    #[arg(long)]
    pub trace: PathBuf,
    /// The scheduling policy
    #[arg(long, default_value = "rubick", value_parser = crate::policy_parser())]
    pub policy: &'static Registration,
    /// Admission order of queued jobs (`service` by default: it needs no job sizes,
    /// and on a busy cluster's history it lets short jobs past long ones; `schedule`'s
    /// single round, with no history of finished jobs, keeps `fifo`)
    #[arg(long, default_value = "service", value_parser = crate::queue_parser())]
    pub queue: Queue,
    /// The authors' reference data: measured iteration times (the truth) and the rows
    /// each model's performance model (the belief) is fitted from
    #[arg(long)]
    pub reference: PathBuf,
    /// Seconds per scheduling round
    #[arg(long = "round", default_value_t = 60.0, value_parser = flags::round_seconds, allow_hyphen_values = true)]
    pub round_s: f64,
    /// Seconds without progress after any placement change, incl. the first start
    #[arg(long, default_value_t = 260.0, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub restart_penalty: f64,
    /// Time limit of each MILP round (rubick-milp), seconds
    #[arg(long, default_value_t = 2.0, value_parser = flags::positive_seconds, allow_hyphen_values = true)]
    pub time_limit: f64,
    /// Per-job results, CSV or Parquet by extension (`-` for CSV on stdout)
    #[arg(long)]
    pub jobs_out: Option<PathBuf>,
    /// The summary (YAML), `-` for stdout
    #[arg(long)]
    pub summary: PathBuf,
    /// Directory for the plots (JCT CDF, GPUs in use over time, Gantt chart of jobs,
    /// restarts per job)
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// A change of a running job must raise the objective by this much (in requests;
    /// formerly 0.5)
    #[arg(long, default_value_t = PlannerConfig::default().change_min_gain, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub change_min_gain: f64,
    /// Rounds a job's allocation is left alone after a change (at least the restart
    /// penalty's rounds + 1; formerly 20)
    #[arg(long, default_value_t = PlannerConfig::default().cooldown_rounds)]
    pub cooldown: u32,
    /// Seconds over which a restart must pay for itself
    #[arg(long, default_value_t = PlannerConfig::default().horizon_s, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub horizon: f64,
    /// Every policy decides every this many seconds (and when a job arrives or
    /// finishes); 0: on those events only, and when cooldowns end (the simulator's
    /// earlier behaviour)
    #[arg(long, default_value_t = rubick_sim::engine::DEFAULT_INTERVAL_S, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub interval: f64,
    /// A job gets at most this many times its requested GPUs (at least a node)
    #[arg(long, default_value_t = PlannerConfig::default().max_scale, value_parser = crate::schedule::max_scale(), allow_hyphen_values = true)]
    pub max_scale: u32,
    /// More resources must buy at least this share more throughput (Pareto pruning)
    #[arg(long, default_value_t = PlannerConfig::default().min_gain, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub min_gain: f64,
    /// The restart rules
    #[command(flatten)]
    pub churn: crate::schedule::ChurnArgs,
    /// Mark this share of the trace's jobs guaranteed (evenly spread, deterministic),
    /// on top of its own is_sla
    #[arg(long, default_value_t = 0.0, value_parser = flags::share, allow_hyphen_values = true)]
    pub guarantee_share: f64,
    /// A configuration other than a guaranteed job's own request must be predicted this
    /// share faster than the request (the belief's error; the truth decides violations)
    #[arg(long, default_value_t = 0.3, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub guarantee_margin: f64,
    /// Guaranteed jobs keep their requested plan's layout (TP/PP/ZeRO/offload) and are
    /// never spread over fragments, unless they run exactly as requested (`false`
    /// trades guarantee safety for speed)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub guarantee_keeps_layout: bool,
    /// Offer only (plan, placement) configurations the reference measured (besides a
    /// job's request and current allocation), so that the truth is measured
    #[arg(long)]
    pub measured_only: bool,
    /// The truth of configurations the reference did not measure: `oracle` (a model
    /// fitted on all the measured rows, never seen by the policies) or `belief` (the
    /// policy's own prediction: the old rule, for comparison)
    #[arg(long, value_enum, default_value = "oracle")]
    pub truth: TruthArg,
    /// A pessimistic truth: extrapolated configurations (plan families or GPU counts
    /// outside the measured ones) run this share slower than the truth says, to see how
    /// much a result rests on extrapolation
    #[arg(long, default_value_t = 0.0, value_parser = flags::share_below_one, allow_hyphen_values = true)]
    pub extrapolated_slowdown: f64,
    /// Log-normal noise on true iteration times (sigma of the log; 0.02: about 2 %),
    /// drawn per job and allocation
    #[arg(long, default_value_t = 0.0, value_parser = flags::share, allow_hyphen_values = true)]
    pub noise: f64,
    /// Replicas of the simulation, one per seed: the summary reports the mean and
    /// spread of every figure (per-job table and plots: the first replica)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000), allow_hyphen_values = true)]
    pub seeds: u32,
    /// The first replica's seed
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `--truth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TruthArg {
    Oracle,
    Belief,
}

impl From<TruthArg> for TruthMode {
    fn from(t: TruthArg) -> Self {
        match t {
            TruthArg::Oracle => TruthMode::Oracle,
            TruthArg::Belief => TruthMode::Belief,
        }
    }
}

/// Marks `share` of the jobs guaranteed, evenly spread over the trace's order
/// (deterministic), on top of those the trace marks.
pub fn mark_guaranteed(jobs: &mut [SimJob], share: f64) {
    for (i, j) in jobs.iter_mut().enumerate() {
        j.job.guaranteed |= rubick_sim::trace::marked(i, share);
    }
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub fn run(args: &SimulateArgs) -> anyhow::Result<Outcome> {
    // Every number was bounded where clap parsed it (`rubick_io::flags`); every output's
    // name is checked before the first is written.
    rubick_io::check_output(&args.summary, rubick_io::Format::Yaml)?;
    if let Some(path) = &args.jobs_out {
        rubick_io::check_output(path, rubick_io::table::TableFormat::for_path(path, None).into())?;
    }
    for out in std::iter::once(&args.summary).chain(args.jobs_out.as_ref()) {
        rubick_io::cli::ensure_not_an_input(out, &[args.cluster.as_path(), args.trace.as_path()])?;
    }
    anyhow::ensure!(
        !(rubick_io::files::is_std(&args.summary) && args.jobs_out.as_deref().is_some_and(rubick_io::files::is_std)),
        "--summary and --jobs-out: only one of them can go to stdout (`-`)"
    );
    let cluster = crate::load_cluster(&args.cluster)?;
    let reference = ReferenceData::open(&args.reference)?;
    // Jobs are made as the simulation reaches them: memory holds the jobs present.
    let (mut jobs, mut truth) = open_trace(&args.trace, &cluster, &reference, args.truth.into())?;
    truth.extrapolated_slowdown = args.extrapolated_slowdown;
    jobs.mark_guaranteed(args.guarantee_share);
    let mut config = SimConfig::defaults(args.policy, args.queue);
    config.round_s = args.round_s;
    config.restart_penalty_s = args.restart_penalty;
    config.milp_time_limit = rubick_core::launch::duration(args.time_limit);
    config.planner.guarantee_margin = args.guarantee_margin;
    config.planner.guarantee_keeps_layout = args.guarantee_keeps_layout;
    config.measured_only = args.measured_only;
    config.noise_sigma = args.noise;
    config.seed = args.seed;
    config.planner.change_min_gain = args.change_min_gain;
    config.planner.cooldown_rounds = args.cooldown;
    config.planner.horizon_s = args.horizon;
    config.planner.max_scale = args.max_scale;
    config.planner.min_gain = args.min_gain;
    args.churn.apply(&mut config.planner);
    config.interval_s = (args.interval > 0.0).then_some(args.interval);
    let bar = rubick_io::cli::progress_bar(jobs.len() as u64 * u64::from(args.seeds), "jobs finished");
    let start = Instant::now();
    let done = std::sync::Mutex::new(vec![0usize; args.seeds as usize]);
    let results = simulate_seeds(&cluster, &jobs, &truth, &config, args.seeds, |finished, _| {
        if let Some(b) = &bar {
            // Replicas run side by side: the bar shows their finished jobs in all.
            let mut d = done.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(slot) = d.iter_mut().find(|s| **s <= finished) {
                *slot = finished;
            }
            b.set_position(d.iter().sum::<usize>() as u64);
        }
    });
    let wall = start.elapsed();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let trace_name = args.trace.file_stem().map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
    let summary = summarize(&trace_name, &config, &truth, &results);
    render::log(&summary, wall);
    let first = results.first().context("no replica ran")?;
    if let Some(path) = &args.jobs_out {
        write_jobs(path, first)?;
    }
    if let Some(dir) = &args.plot_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the directory", dir.display()))?;
        write_figure(
            &dir.join("jct-cdf.png"),
            (900, 600),
            &CdfFigure { series: vec![(render::policy_label(&summary), summary.jct_s.clone())] },
        )?;
        write_figure(
            &dir.join("gpus-in-use.png"),
            (900, 500),
            &UsageFigure { usage: &first.usage, total: cluster.total_gpus() },
        )?;
        write_figure(&dir.join("gantt.png"), (1100, 900), &GanttFigure { jobs: &first.jobs })?;
        write_figure(
            &dir.join("restarts.png"),
            (900, 600),
            &RestartsFigure { series: vec![(render::policy_label(&summary), summary.restart_counts.clone())] },
        )?;
    }
    rubick_io::write_output(&args.summary, rubick_io::Format::Yaml, to_yaml(&summary).as_bytes())?;
    Ok(Outcome::Done)
}

fn write_jobs(path: &Path, result: &SimResult) -> anyhow::Result<()> {
    let rows: Vec<SimJobRow> = result
        .jobs
        .iter()
        .map(|r| SimJobRow {
            job: r.name.clone(),
            model: r.model.clone(),
            submit_s: r.submit_s,
            first_start_s: r.first_start_s,
            finish_s: r.finish_s.map(r2),
            jct_s: r.jct_s().map(r2),
            queueing_s: r.first_start_s.map(|f| r2(f - r.submit_s)),
            restarts: i64::from(r.restarts),
            plan_changes: i64::from(r.plan_changes),
            gpu_hours: (r.gpu_hours * 1e4).round() / 1e4,
            guaranteed: r.guaranteed,
            guarantee_held: r.guaranteed.then_some(r.guarantee_held()),
        })
        .collect();
    let mut df = rubick_io::table::frame_of(&rows, &SIM_JOBS)?;
    rubick_io::table::write_table(&mut df, path, None, &SIM_JOBS)?;
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Summaries written by `simulate --summary`
    #[arg(required = true)]
    pub summaries: Vec<PathBuf>,
    /// The JCT CDFs of all runs on one chart (.png or .svg)
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Restarts per job of all runs (first replicas) as one histogram (.png or .svg)
    #[arg(long)]
    pub restarts_plot: Option<PathBuf>,
}

pub fn compare(args: &CompareArgs) -> anyhow::Result<Outcome> {
    let mut rows = Vec::new();
    for path in &args.summaries {
        rows.push(load_artifact::<SimulationSummary>(path)?);
    }
    rubick_io::write_output(Path::new("-"), rubick_io::Format::Markdown, render::markdown(&rows).as_bytes())?;
    if let Some(plot) = &args.plot {
        let series = rows.iter().map(|s| (render::run_label(s), s.jct_s.clone())).collect();
        write_figure(plot, (900, 600), &CdfFigure { series })?;
    }
    if let Some(plot) = &args.restarts_plot {
        let series = rows.iter().map(|s| (render::run_label(s), s.restart_counts.clone())).collect();
        write_figure(plot, (900, 600), &RestartsFigure { series })?;
    }
    Ok(Outcome::Done)
}
