//! `rubick-plan simulate` and `rubick-plan compare`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use plotters::prelude::*;
use polars::prelude::*;
use rubick_core::job::{JobRequest, Resharding};
use rubick_core::planner::PlannerConfig;
use rubick_core::tables::SIM_JOBS;
use rubick_core::{Cluster, Job, JobBatch, PlanRequest};
use rubick_io::cli::Outcome;
use rubick_io::files::{parse_artifact, read_text};
use rubick_io::plot::{Figure, PALETTE, drawing_error, legend, write_figure};
use rubick_io::reference::{ReferenceData, read_trace};
use serde::{Deserialize, Serialize};

use crate::round::{ModelSource, job_params};
use crate::sim::{Queue, SimConfig, SimJob, SimPolicy, SimResult, Truth, simulate};

const SIMULATE_EXAMPLES: &str = "\
Examples:
  R=../shared/reference/rubick-artifact; C=data/cluster-a800-8x8.yaml
  # Rubick on the authors' base trace: per-job table, summary, plots
  rubick-plan simulate --cluster $C --reference $R --trace $R/workloads/workload-base.csv \\
      --summary rubick.yaml --jobs-out rubick.parquet --plot-dir plots/

  # Every policy under shortest-remaining-work admission, then one table
  for p in rubick rubick-milp static static-backfill synergy antman elastic \\
           rubick-no-plan rubick-no-resize; do
    rubick-plan simulate -q --cluster $C --reference $R \\
        --trace $R/workloads/workload-base.csv --policy $p --queue srpt --summary $p.yaml
  done
  rubick-plan compare *.yaml --plot jct-cdf.png

  # Half the jobs guaranteed; only configurations the authors measured
  rubick-plan simulate --cluster $C --reference $R --trace $R/workloads/workload-bp.csv \\
      --guarantee-share 0.5 --measured-only --summary -

  # How much does a result rest on the model? Unmeasured configurations 30 % slower
  rubick-plan simulate --cluster $C --reference $R --trace $R/workloads/workload-base.csv \\
      --unmeasured-slowdown 0.3 --summary -";

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
    #[arg(long, value_enum, default_value = "rubick")]
    pub policy: SimPolicy,
    /// Admission order of queued jobs
    #[arg(long, value_enum, default_value = "fifo")]
    pub queue: Queue,
    /// The authors' reference data: measured iteration times (the truth) and the rows
    /// each model's performance model (the belief) is fitted from
    #[arg(long)]
    pub reference: PathBuf,
    /// Seconds per scheduling round
    #[arg(long = "round", default_value_t = 60.0)]
    pub round_s: f64,
    /// Seconds without progress after any placement change, incl. the first start
    #[arg(long, default_value_t = 260.0)]
    pub restart_penalty: f64,
    /// Time limit of each MILP round (rubick-milp), seconds
    #[arg(long, default_value_t = 2.0)]
    pub time_limit: f64,
    /// Per-job results, CSV or Parquet by extension (`-` for CSV on stdout)
    #[arg(long)]
    pub jobs_out: Option<PathBuf>,
    /// The summary (YAML), `-` for stdout
    #[arg(long)]
    pub summary: PathBuf,
    /// Directory for the plots (JCT CDF, GPUs in use over time, Gantt chart of jobs)
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// A change of a running job must raise the objective by this much (in requests)
    #[arg(long, default_value_t = 0.5)]
    pub change_min_gain: f64,
    /// Rounds a job's allocation is left alone after a change
    #[arg(long, default_value_t = 20)]
    pub cooldown: u32,
    /// Seconds over which a restart must pay for itself
    #[arg(long, default_value_t = PlannerConfig::default().horizon_s)]
    pub horizon: f64,
    /// Mark this share of the trace's jobs guaranteed (evenly spread, deterministic),
    /// on top of its own is_sla
    #[arg(long, default_value_t = 0.0)]
    pub guarantee_share: f64,
    /// A configuration other than a guaranteed job's own request must be predicted this
    /// share faster than the request (the belief's error; the truth decides violations)
    #[arg(long, default_value_t = 0.3)]
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
    /// A pessimistic truth: configurations the reference did not measure run this
    /// share slower than the belief predicts (0.15: the fit's held-out error), to see
    /// how much a result rests on the policy's own predictions
    #[arg(long, default_value_t = 0.0)]
    pub unmeasured_slowdown: f64,
}

/// The summary of one simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub struct Summary {
    pub trace: String,
    pub policy: String,
    pub queue: String,
    pub jobs: usize,
    pub finished: usize,
    pub avg_jct_s: f64,
    pub median_jct_s: f64,
    pub p99_jct_s: f64,
    pub makespan_s: f64,
    pub restarts: u64,
    pub plan_changes: u64,
    pub gpu_hours: f64,
    pub guarantee_violations: usize,
    pub unmeasured_share: f64,
    /// Only measured configurations were offered (`--measured-only`).
    #[serde(default)]
    pub measured_only: bool,
    /// Unmeasured configurations ran this share slower than predicted.
    #[serde(default)]
    pub unmeasured_slowdown: f64,
    pub rounds: u64,
    pub decisions: u64,
    pub sim_wall_s: f64,
    /// JCT of every finished job, sorted (for CDF plots across runs).
    pub jct_s: Vec<f64>,
}

impl Summary {
    /// How the run's truth differs from the default, for labels: `""`,
    /// `" (measured only)"` or `" (unmeasured 30 % slower)"`.
    fn truth_label(&self) -> String {
        if self.measured_only {
            " (measured only)".to_owned()
        } else if self.unmeasured_slowdown > 0.0 {
            format!(" (unmeasured {:.0} % slower)", self.unmeasured_slowdown * 100.0)
        } else {
            String::new()
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Marks `share` of the jobs guaranteed, evenly spread over the trace's order
/// (deterministic), on top of those the trace marks.
pub fn mark_guaranteed(jobs: &mut [SimJob], share: f64) {
    for (i, j) in jobs.iter_mut().enumerate() {
        if share > 0.0 && (i as f64 * share).floor() != ((i + 1) as f64 * share).floor() {
            j.job.guaranteed = true;
        }
    }
}

/// The summary of a result.
pub fn summarize(trace: &str, config: &SimConfig, result: &SimResult, wall: Duration) -> Summary {
    let mut jct: Vec<f64> = result.jobs.iter().filter_map(|j| j.jct_s()).map(r2).collect();
    jct.sort_by(f64::total_cmp);
    let avg = if jct.is_empty() { f64::NAN } else { jct.iter().sum::<f64>() / jct.len() as f64 };
    Summary {
        trace: trace.to_owned(),
        policy: config.policy.as_str().to_owned(),
        queue: format!("{:?}", config.queue).to_lowercase(),
        jobs: result.jobs.len(),
        finished: jct.len(),
        avg_jct_s: r2(avg),
        median_jct_s: quantile(&jct, 0.5),
        p99_jct_s: quantile(&jct, 0.99),
        makespan_s: r2(result.makespan_s),
        restarts: result.jobs.iter().map(|j| u64::from(j.restarts)).sum(),
        plan_changes: result.jobs.iter().map(|j| u64::from(j.plan_changes)).sum(),
        gpu_hours: r2(result.jobs.iter().map(|j| j.gpu_hours).sum()),
        guarantee_violations: result.jobs.iter().filter(|j| j.guaranteed && !j.guarantee_held).count(),
        unmeasured_share: (result.unmeasured_share * 1e4).round() / 1e4,
        measured_only: config.planner.measured_only.is_some(),
        unmeasured_slowdown: config.unmeasured_slowdown,
        rounds: result.rounds,
        decisions: result.decisions,
        sim_wall_s: (wall.as_secs_f64() * 1e3).round() / 1e3,
        jct_s: jct,
    }
}

/// The jobs of a trace, with their beliefs, and the truth.
pub fn load_trace(trace: &Path, cluster: &Cluster, reference: &ReferenceData) -> anyhow::Result<(Vec<SimJob>, Truth)> {
    let mut trace_codes = Vec::new();
    let jobs: Vec<Job> = if trace.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        let text = read_text(trace)?;
        parse_artifact::<JobBatch>(trace, &text)?.jobs
    } else {
        let rows = read_trace(trace)?;
        let mut jobs = Vec::with_capacity(rows.len());
        // Requested plans the job's model rejects, by reason: the lines.
        let mut unusable_plans: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
        for (i, r) in rows.iter().enumerate() {
            let facts = reference.facts(&r.application).with_context(|| {
                format!(
                    "{}: line {}: application `{}` is not a model of the reference data",
                    trace.display(),
                    i + 2,
                    r.application
                )
            })?;
            let job = Job {
                api_version: None,
                kind: None,
                name: r.name.clone(),
                model: facts.model_spec(&r.application),
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
            };
            let mut job = job;
            trace_codes.push(None);
            if let Err(e) = job.check() {
                // The reference's model shapes disagree with a few of its own plans
                // (e.g. PP5 of a 24-layer model): the job asks for its GPUs only.
                if e.field == "request.plan" {
                    unusable_plans.entry(e.to_string()).or_default().push(i + 2);
                    job.request.plan = None;
                    trace_codes[i] = Some(r.exec_plan);
                }
                job.check().map_err(|e| anyhow::anyhow!("{}: line {}: {e}", trace.display(), i + 2))?;
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
    let mut truth = Truth::default();
    let mut models: Vec<&str> = jobs.iter().map(|j| j.model.name.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    for m in models {
        if reference.facts(m).is_some() {
            truth.add(m, &reference.measured_rows(m)?);
        }
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

pub fn run(args: &SimulateArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.round_s.is_finite() && args.round_s > 0.0, "--round: must be positive, got {}", args.round_s);
    anyhow::ensure!(
        args.restart_penalty.is_finite() && args.restart_penalty >= 0.0,
        "--restart-penalty: must be non-negative, got {}",
        args.restart_penalty
    );
    anyhow::ensure!(args.time_limit > 0.0, "--time-limit: must be positive");
    anyhow::ensure!(
        !(rubick_io::files::is_std(&args.summary) && args.jobs_out.as_deref().is_some_and(rubick_io::files::is_std)),
        "--summary and --jobs-out: only one of them can go to stdout (`-`)"
    );
    anyhow::ensure!(
        (0.0..1.0).contains(&args.unmeasured_slowdown),
        "--unmeasured-slowdown: must be in [0, 1), got {}",
        args.unmeasured_slowdown
    );
    let cluster = crate::load_cluster(&args.cluster)?;
    let reference = ReferenceData::open(&args.reference)?;
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.guarantee_share),
        "--guarantee-share: must be between 0 and 1, got {}",
        args.guarantee_share
    );
    let (mut jobs, truth) = load_trace(&args.trace, &cluster, &reference)?;
    mark_guaranteed(&mut jobs, args.guarantee_share);
    let mut config = SimConfig::defaults(args.policy, args.queue);
    config.round_s = args.round_s;
    config.restart_penalty_s = args.restart_penalty;
    config.milp_time_limit = Duration::from_secs_f64(args.time_limit);
    config.planner.guarantee_margin = args.guarantee_margin;
    config.planner.guarantee_keeps_layout = args.guarantee_keeps_layout;
    if args.measured_only {
        config.planner.measured_only = Some(std::sync::Arc::new(truth.measured_set()));
    }
    config.unmeasured_slowdown = args.unmeasured_slowdown;
    config.planner.change_min_gain = args.change_min_gain;
    config.planner.cooldown_rounds = args.cooldown;
    config.planner.horizon_s = args.horizon;
    let bar = progress_bar(jobs.len() as u64);
    let start = Instant::now();
    let result = simulate(&cluster, &jobs, &truth, &config, |done, _| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    });
    let wall = start.elapsed();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let trace_name = args.trace.file_stem().map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
    let summary = summarize(&trace_name, &config, &result, wall);
    tracing::info!(
        "{} on {}: {} of {} jobs finished, avg JCT {:.0} s, makespan {:.0} s, {} restarts, {:.2} s",
        summary.policy,
        trace_name,
        summary.finished,
        summary.jobs,
        summary.avg_jct_s,
        summary.makespan_s,
        summary.restarts,
        summary.sim_wall_s
    );
    if let Some(path) = &args.jobs_out {
        write_jobs(path, &result)?;
    }
    if let Some(dir) = &args.plot_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the directory", dir.display()))?;
        let label = format!("{} ({})", summary.policy, summary.queue);
        write_figure(
            &dir.join("jct-cdf.png"),
            (900, 600),
            &CdfFigure { series: vec![(label, summary.jct_s.clone())] },
        )?;
        write_figure(
            &dir.join("gpus-in-use.png"),
            (900, 500),
            &UsageFigure { usage: &result.usage, total: cluster.total_gpus() },
        )?;
        write_figure(&dir.join("gantt.png"), (1100, 900), &GanttFigure { jobs: &result.jobs })?;
    }
    let yaml = serde_yaml_ng::to_string(&summary).context("serialising the summary")?;
    rubick_io::write_output(&args.summary, yaml.as_bytes())?;
    Ok(Outcome::Done)
}

fn progress_bar(len: u64) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} jobs finished")
    {
        bar.set_style(style);
    }
    Some(bar)
}

fn write_jobs(path: &Path, result: &SimResult) -> anyhow::Result<()> {
    let j = &result.jobs;
    let mut df = DataFrame::new_infer_height(vec![
        Column::new("job".into(), j.iter().map(|r| r.name.clone()).collect::<Vec<_>>()),
        Column::new("model".into(), j.iter().map(|r| r.model.clone()).collect::<Vec<_>>()),
        Column::new("submit_s".into(), j.iter().map(|r| r.submit_s).collect::<Vec<_>>()),
        Column::new("first_start_s".into(), j.iter().map(|r| r.first_start_s).collect::<Vec<_>>()),
        Column::new("finish_s".into(), j.iter().map(|r| r.finish_s.map(r2)).collect::<Vec<_>>()),
        Column::new("jct_s".into(), j.iter().map(|r| r.jct_s().map(r2)).collect::<Vec<_>>()),
        Column::new(
            "queueing_s".into(),
            j.iter().map(|r| r.first_start_s.map(|f| r2(f - r.submit_s))).collect::<Vec<_>>(),
        ),
        Column::new("restarts".into(), j.iter().map(|r| i64::from(r.restarts)).collect::<Vec<_>>()),
        Column::new("plan_changes".into(), j.iter().map(|r| i64::from(r.plan_changes)).collect::<Vec<_>>()),
        Column::new("gpu_hours".into(), j.iter().map(|r| (r.gpu_hours * 1e4).round() / 1e4).collect::<Vec<_>>()),
        Column::new("guaranteed".into(), j.iter().map(|r| r.guaranteed).collect::<Vec<_>>()),
        Column::new(
            "guarantee_held".into(),
            j.iter().map(|r| r.guaranteed.then_some(r.guarantee_held)).collect::<Vec<_>>(),
        ),
    ])?;
    rubick_io::table::write_table(&mut df, path, None, &SIM_JOBS)?;
    Ok(())
}

struct CdfFigure {
    series: Vec<(String, Vec<f64>)>,
}

impl Figure for CdfFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let all = self.series.iter().flat_map(|(_, v)| v.iter().copied());
        let lo = all.clone().fold(f64::INFINITY, f64::min).max(1.0);
        let hi = all.fold(10.0, f64::max) * 1.2;
        let mut chart = ChartBuilder::on(&root)
            .caption("Job completion time (CDF)", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((lo.min(hi / 10.0)..hi).log_scale(), 0.0..1.0)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("JCT (s)")
            .y_desc("share of jobs")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        for (i, (label, values)) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let n = values.len().max(1) as f64;
            let points = values.iter().enumerate().map(|(k, &v)| (v.max(lo), (k + 1) as f64 / n));
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                .map_err(err)?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

/// One bar per job: queueing (thin, grey) then running (by model), in submit order.
struct GanttFigure<'a> {
    jobs: &'a [crate::sim::JobResult],
}

impl Figure for GanttFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let mut order: Vec<&crate::sim::JobResult> = self.jobs.iter().collect();
        order.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.name.cmp(&b.name)));
        let end = order.iter().filter_map(|j| j.finish_s).fold(1.0, f64::max) / 3600.0;
        let n = order.len().max(1) as f64;
        let mut models: Vec<&str> = order.iter().map(|j| j.model.as_str()).collect();
        models.sort_unstable();
        models.dedup();
        let mut chart = ChartBuilder::on(&root)
            .caption("Jobs over time (grey: queued; colour: holding GPUs, by model)", ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..end * 1.02, 0.0..n)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("time (h)")
            .y_desc("job (submission order)")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(order.iter().enumerate().map(|(i, j)| {
                let until = j.first_start_s.or(j.finish_s).unwrap_or(j.submit_s);
                let y = i as f64;
                Rectangle::new(
                    [(j.submit_s / 3600.0, y + 0.45), (until / 3600.0, y + 0.55)],
                    RGBColor(170, 170, 170).filled(),
                )
            }))
            .map_err(err)?;
        for (m, model) in models.iter().enumerate() {
            let colour = PALETTE[m % PALETTE.len()];
            let bars = order.iter().enumerate().filter(|(_, j)| j.model == *model).filter_map(|(i, j)| {
                let (start, finish) = (j.first_start_s?, j.finish_s?);
                let y = i as f64;
                Some(Rectangle::new([(start / 3600.0, y + 0.1), (finish / 3600.0, y + 0.9)], colour.filled()))
            });
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(model.to_string())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

struct UsageFigure<'a> {
    usage: &'a [(f64, u32)],
    total: u32,
}

impl Figure for UsageFigure<'_> {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, plotters::coord::Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let err = drawing_error::<DB::ErrorType>;
        root.fill(&WHITE).map_err(err)?;
        let end = self.usage.last().map_or(1.0, |u| u.0 / 3600.0).max(0.1);
        let mut chart = ChartBuilder::on(&root)
            .caption("GPUs in use", ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..end, 0.0..f64::from(self.total) * 1.05)
            .map_err(err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc("time (h)")
            .y_desc("GPUs")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        chart
            .draw_series(LineSeries::new(self.usage.iter().map(|&(t, g)| (t / 3600.0, f64::from(g))), PALETTE[0]))
            .map_err(err)?;
        root.present().map_err(err)?;
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Summaries written by `simulate --summary`
    #[arg(required = true)]
    pub summaries: Vec<PathBuf>,
    /// The JCT CDFs of all runs on one chart (.png or .svg)
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

pub fn compare(args: &CompareArgs) -> anyhow::Result<Outcome> {
    let mut rows = Vec::new();
    for path in &args.summaries {
        let text = read_text(path)?;
        let s: Summary = serde_yaml_ng::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        rows.push(s);
    }
    let mut md = String::from(
        "| trace | policy | queue | finished | avg JCT (s) | median JCT (s) | p99 JCT (s) | makespan (s) | restarts | GPU-hours | guarantee violations | unmeasured | wall (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &rows {
        let truth = s.truth_label();
        let _ = writeln!(
            md,
            "| {}{truth} | {} | {} | {}/{} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {} | {:.1} % | {:.2} |",
            s.trace,
            s.policy,
            s.queue,
            s.finished,
            s.jobs,
            s.avg_jct_s,
            s.median_jct_s,
            s.p99_jct_s,
            s.makespan_s,
            s.restarts,
            s.gpu_hours,
            s.guarantee_violations,
            s.unmeasured_share * 100.0,
            s.sim_wall_s
        );
    }
    rubick_io::write_output(Path::new("-"), md.as_bytes())?;
    if let Some(plot) = &args.plot {
        let series = rows
            .iter()
            .map(|s| (format!("{}{} {} ({})", s.trace, s.truth_label(), s.policy, s.queue), s.jct_s.clone()))
            .collect();
        write_figure(plot, (900, 600), &CdfFigure { series })?;
    }
    Ok(Outcome::Done)
}
