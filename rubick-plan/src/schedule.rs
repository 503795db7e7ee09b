//! `rubick-plan schedule`: one round for a batch of jobs.

use std::path::{Path, PathBuf};

use rubick_core::artifact::to_yaml;
use rubick_core::schedule::Schedule;
use rubick_io::cli::Outcome;
use rubick_io::files::{load_artifact, write_output};
use rubick_io::flags;
use rubick_io::reference::ReferenceData;
use rubick_planner::round::assemble_allocations;
use rubick_planner::{PlannerConfig, ServiceQuantum};

use crate::round::job_inputs;
use rubick_io::beliefs::ModelSource;
use rubick_policy::planner::RoundReport;
use rubick_policy::{PolicyOptions, Queue, Registration, View, request_config, work_per_iteration};

/// The planner's restart rules (restart factor, growth bound, restart cap, kept requests, scale-out efficiency), shared by `schedule`, `curves` and
/// `simulate`; each off for ablation.
#[derive(Debug, Clone, clap::Args)]
pub struct ChurnArgs {
    /// The restart factor (Sia/Pollux): a running job's move must gain more the more
    /// it has restarted for its age (`current.restarts`); `false`: the payback share,
    /// minimum gain and cooldown alone
    #[arg(long, default_value_t = PlannerConfig::default().restart_factor, action = clap::ArgAction::Set)]
    pub restart_factor: bool,
    /// A running job grows to at most this many times its GPUs per round (0: no cap)
    #[arg(long, default_value_t = PlannerConfig::default().max_growth.unwrap_or(0))]
    pub max_growth: u32,
    /// A running job is never shrunk below its request nor paused, except for a
    /// guarantee (resources beyond a request are lent); `false`: waiting jobs that
    /// starve (`--starvation`) time-share by pausing running ones
    #[arg(long, default_value_t = PlannerConfig::default().keep_request, action = clap::ArgAction::Set)]
    pub keep_request: bool,
    /// Each GPU beyond a job's request must add at least this share of the request's
    /// throughput per GPU (0: any gain)
    #[arg(long, default_value_t = PlannerConfig::default().scale_out_efficiency, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub scale_out_efficiency: f64,
    /// A running job restarted this many times (`current.restarts`) is never shrunk or
    /// paused again (only a guarantee may take its resources; the Rubick artifact's 5);
    /// 0: no cap
    #[arg(long, default_value_t = PlannerConfig::default().restart_cap.unwrap_or(0))]
    pub restart_cap: u32,
    /// Past the `service` queue's quantum, the restart cap is one restart per doubling
    /// of the job's service (1 + log2(service / quantum)) instead of `--restart-cap`,
    /// which holds below the quantum and without one; `false`: `--restart-cap` for every
    /// job
    #[arg(long, default_value_t = PlannerConfig::default().restart_cap_doubles, action = clap::ArgAction::Set)]
    pub restart_cap_doubles: bool,
    /// The `service` queue's quantum, from the service of the jobs finished in the last
    /// day: `load` (the median while the waiting jobs ask for as many GPUs as the
    /// cluster has, else the weighted median), `weighted-median` (half the service went
    /// to jobs that needed less), `median` (half the jobs needed less), `mean`, or
    /// fixed, in GPU-hours (0: no job is protected)
    #[arg(long, default_value = "load", value_parser = service_quantum)]
    pub service_quantum: ServiceQuantum,
}

/// `--service-quantum`: a rule over the finished jobs, or GPU-hours.
fn service_quantum(text: &str) -> Result<ServiceQuantum, String> {
    match text.trim() {
        "median" => Ok(ServiceQuantum::Median),
        "mean" => Ok(ServiceQuantum::Mean),
        "load" => Ok(ServiceQuantum::Load),
        "weighted-median" => Ok(ServiceQuantum::WeightedMedian),
        _ => flags::ratio(text)
            .map(|h| ServiceQuantum::Fixed(h * 3600.0))
            .map_err(|why| format!("expected `load`, `weighted-median`, `median`, `mean` or GPU-hours: {why}")),
    }
}

impl ChurnArgs {
    /// Sets the rules on `config` (their numbers bounded where they were parsed).
    pub fn apply(&self, config: &mut PlannerConfig) {
        config.restart_factor = self.restart_factor;
        config.max_growth = (self.max_growth > 0).then_some(self.max_growth);
        config.keep_request = self.keep_request;
        config.scale_out_efficiency = self.scale_out_efficiency;
        config.restart_cap = (self.restart_cap > 0).then_some(self.restart_cap);
        config.restart_cap_doubles = self.restart_cap_doubles;
        config.service_quantum = self.service_quantum;
    }
}

/// `--max-scale`: at least 1 (a job gets at least its request).
pub fn max_scale() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..)
}

/// Knobs of the planner shared by `schedule` and `curves` (`simulate` takes the same
/// numbers through the same parsers of [`flags`]).
#[derive(Debug, Clone, clap::Args)]
pub struct PlannerArgs {
    /// More resources must buy at least this share more throughput (Pareto pruning)
    #[arg(long, default_value_t = PlannerConfig::default().min_gain, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub min_gain: f64,
    /// A change of a running job must raise the objective by this much (in requests)
    #[arg(long, default_value_t = PlannerConfig::default().change_min_gain, value_parser = flags::ratio, allow_hyphen_values = true)]
    pub change_min_gain: f64,
    /// Rounds a job's allocation is left alone after a change
    #[arg(long, default_value_t = PlannerConfig::default().cooldown_rounds)]
    pub cooldown: u32,
    /// Seconds over which a restart must pay for itself
    #[arg(long, default_value_t = PlannerConfig::default().horizon_s, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub horizon: f64,
    /// Restart cost (s) of jobs that declare none
    #[arg(long, default_value_t = PlannerConfig::default().default_restart_s, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub restart_cost: f64,
    /// Seconds of waiting after which a queued job is admitted first
    #[arg(long, default_value_t = PlannerConfig::default().starvation_s, value_parser = flags::seconds, allow_hyphen_values = true)]
    pub starvation: f64,
    /// A job gets at most this many times its requested GPUs (at least a node)
    #[arg(long, default_value_t = PlannerConfig::default().max_scale, value_parser = max_scale(), allow_hyphen_values = true)]
    pub max_scale: u32,
    /// The restart rules
    #[command(flatten)]
    pub churn: ChurnArgs,
    /// Time of the round on the jobs' clock (s); default: the batch's `nowS` (`rubick-run
    /// jobs` writes the time it was taken), else the latest submission
    #[arg(long, value_parser = flags::clock_seconds, allow_hyphen_values = true)]
    pub now: Option<f64>,
    /// The authors' reference data: jobs of its models without a perfModel get one
    /// fitted from 8 profiled rows (else the model's FLOPs decide its speed)
    #[arg(long)]
    pub reference: Option<PathBuf>,
}

impl PlannerArgs {
    pub fn config(&self, jobs: &[rubick_core::Job]) -> PlannerConfig {
        self.config_at(jobs, None)
    }

    /// [`PlannerArgs::config`] with the batch's own time as the default `--now`.
    pub fn config_at(&self, jobs: &[rubick_core::Job], batch_now: Option<f64>) -> PlannerConfig {
        let latest = || jobs.iter().map(|j| j.submit_time_s).fold(0.0, f64::max);
        let now = self.now.or(batch_now).unwrap_or_else(latest);
        let mut config = PlannerConfig {
            min_gain: self.min_gain,
            change_min_gain: self.change_min_gain,
            cooldown_rounds: self.cooldown,
            horizon_s: self.horizon,
            default_restart_s: self.restart_cost,
            starvation_s: self.starvation,
            max_scale: self.max_scale,
            now_s: now,
            ..PlannerConfig::default()
        };
        self.churn.apply(&mut config);
        config
    }

    /// The reference data of `--reference`.
    pub fn reference(&self) -> anyhow::Result<Option<ReferenceData>> {
        match &self.reference {
            Some(dir) => Ok(Some(ReferenceData::open(dir)?)),
            None => Ok(None),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ScheduleArgs {
    /// The Cluster (YAML)
    #[arg(long)]
    pub cluster: PathBuf,
    /// A JobBatch or a Job (YAML), `-` for stdin
    #[arg(long)]
    pub jobs: PathBuf,
    /// The previous round's Schedule: where jobs run now (overrides jobs' `current`).
    /// A file that does not exist yet is the first round: nothing runs
    #[arg(long)]
    pub current: Option<PathBuf>,
    /// The scheduling policy (every policy the simulator has)
    #[arg(long, default_value = "rubick", value_parser = crate::policy_parser())]
    pub policy: &'static Registration,
    /// Order of queued jobs: their weight in Rubick's objective, the queue policies' order
    #[arg(long, default_value = "fifo", value_parser = crate::queue_parser())]
    pub queue: Queue,
    /// Time limit of the MILP, seconds
    #[arg(long, default_value_t = 10.0, value_parser = flags::positive_seconds, allow_hyphen_values = true)]
    pub time_limit: f64,
    /// Output Schedule, `-` for stdout
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Print, per job, the old and new plan and resources and why, on stderr, after a
    /// line saying how to read them (`on 88`: the placement, GPUs per node: 8 on each of
    /// 2 nodes)
    #[arg(long)]
    pub explain: bool,
    /// Record the decision's wall time in the schedule (makes outputs differ run to run)
    #[arg(long)]
    pub record_time: bool,
    #[command(flatten)]
    pub planner: PlannerArgs,
}

/// The first line of `--explain`: how to read the lines after it, the placement code
/// above all (`on 88`).
pub const EXPLAIN_LEGEND: &str = "# per job: its change, its old plan and the new one on PLACEMENT (GPUs, cores), \
throughput, why; PLACEMENT is the GPUs it gets on each node, one digit per node (`8`: 8 GPUs on one node, `88`: 8 \
on each of 2 nodes, `422`: 4, 2 and 2 on 3 nodes; `16,8` where a node has 10 or more)";

pub fn run(args: &ScheduleArgs) -> anyhow::Result<Outcome> {
    rubick_io::cli::ensure_one_stdin(&[args.jobs.as_path(), args.cluster.as_path()])?;
    let mut inputs = vec![args.jobs.as_path(), args.cluster.as_path()];
    inputs.extend(args.current.as_deref());
    rubick_io::cli::ensure_not_an_input(&args.output, &inputs)?;
    let cluster = crate::load_cluster(&args.cluster)?;
    let (jobs, batch_now) = crate::load_batch(&args.jobs)?;
    // The cron loop's first round has no applied schedule yet: nothing runs.
    let current = args.current.as_deref().filter(|p| {
        let first = !rubick_io::files::is_std(p) && !p.exists();
        if first {
            tracing::info!("--current {}: no such file yet; the first round (nothing runs)", p.display());
        }
        !first
    });
    let previous: Option<Schedule> = current.map(load_artifact).transpose()?;
    let config = args.planner.config_at(&jobs, batch_now);
    let reference = args.planner.reference()?;
    let source = ModelSource { jobs_path: Some(&args.jobs), reference: reference.as_ref() };
    // A job whose model cannot be read is left out of the round with why; the others
    // are planned (one bad job never blocks the rest). When no job can be planned,
    // that is the answer: an error naming the first. Each perfModel is read once.
    let beliefs = rubick_io::beliefs::job_beliefs(&jobs, &cluster, &source)?;
    if let Some((i, Err(why))) =
        beliefs.iter().enumerate().find(|(_, b)| b.is_err()).filter(|_| beliefs.iter().all(Result::is_err))
    {
        anyhow::bail!("{}: jobs[{i}].{why}", rubick_io::files::display(&args.jobs));
    }
    let (mut kept, mut left_out) = (Vec::new(), Vec::new());
    for (i, (job, belief)) in jobs.into_iter().zip(beliefs).enumerate() {
        // A job that needs what this cluster lacks (`requires:`, e.g. a GPU on a cluster
        // of CPU worker slots) is left out with why: planned, `apply` would refuse it.
        let belief = match job.requires.as_ref().and_then(|r| r.unmet_by(&cluster, None)) {
            Some(unmet) => Err(format!("requires: {unmet}")),
            None => belief,
        };
        match belief {
            Ok(belief) => kept.push((job, belief)),
            Err(why) => {
                tracing::error!("`{}` (jobs[{i}]) is left out of this round: {why}", job.name);
                left_out.push((job.name, why));
            }
        }
    }
    let prev = current.zip(previous.as_ref());
    let mut jobs = job_inputs(&args.jobs, kept, &cluster, &config, prev.map(|(p, s)| (p as &Path, s)))?;
    let round = previous.as_ref().map_or(0, |s| s.round + 1);
    let options = PolicyOptions {
        queue: args.queue,
        planner: config.clone(),
        milp_time_limit: rubick_core::launch::duration(args.time_limit),
    };
    let start = std::time::Instant::now();
    let mut evaluator = rubick_planner::curves::Evaluator::new(&cluster, &config);
    // Its remaining work: every iteration, each the GPU-seconds its request takes.
    for input in &mut jobs {
        let request = request_config(&input.job, &input.belief.params, None, &mut evaluator, None);
        let work = work_per_iteration(&input.job, &input.belief.params, request.as_ref(), &evaluator);
        input.progress.remaining_work = input.job.iterations as f64 * work;
    }
    let mut policy = args.policy.build(&cluster, &options);
    let view = View { cluster: &cluster, jobs: &jobs, now_s: config.now_s, configs: None };
    let allocations = policy.decide(&view, round);
    let (mut schedule, mut explain) = match policy.last_round() {
        Some(RoundReport::Planned(schedule, explain)) => (*schedule, explain),
        Some(RoundReport::Infeasible(reason)) => return Ok(Outcome::Negative(reason)),
        None => assemble_allocations(&evaluator, &jobs, &allocations, args.policy.name, round),
    };
    for (job, why) in left_out {
        explain.push(format!("{job}: Pending: left out: {why}"));
        schedule.leave_out(job, &why);
    }
    let wall = start.elapsed();
    tracing::info!(
        "round {round}: {} jobs, {}/{} GPUs used, objective {:.4} ({}, {}) in {:.1} ms",
        jobs.len(),
        schedule.totals.gpus_used,
        schedule.totals.gpus_total,
        schedule.objective,
        schedule.solver.method,
        schedule.solver.status,
        wall.as_secs_f64() * 1e3
    );
    if args.record_time {
        schedule.solver.wall_s = Some(wall.as_secs_f64());
    }
    if args.explain {
        eprintln!("{EXPLAIN_LEGEND}");
        for line in &explain {
            eprintln!("{line}");
        }
    }
    write_output(&args.output, rubick_io::Format::Yaml, to_yaml(&schedule).as_bytes())?;
    Ok(Outcome::Done)
}
