//! Real clusters' job logs as traces the simulator replays (the reference workload's
//! CSV format): `rubick-plan trace`.
//!
//! Inputs: the Philly trace (`timestamp,duration,num_gpus,gpu_time,cluster`, Microsoft's
//! 2017 GPU clusters as the Pollux authors summarised it) or a Slurm cluster's own
//! history (`sacct -P` output with a header: `JobID`, `Submit`, `Elapsed` or
//! `ElapsedRaw`, GPUs from `AllocTRES`, `ReqTRES` or `AllocGRES`, optionally `State`).
//!
//! Neither says what a job trained, so each job is mapped, reproducibly, to a model
//! of the reference data and a request:
//!
//! 1. **GPUs**: the job's own, at most the cluster's. When no model has a plan on
//!    that many GPUs of the cluster (a 3-GPU job of a model whose heads need 2 or 4),
//!    the next smaller count that has one.
//! 2. **Model**: among the reference models with a plan there, one drawn with weight
//!    `2^-|log2(gpus / typical)|`, `typical` being the GPUs the model's job asks for in
//!    `data/jobs-paper.yaml` (the paper's workload): a 1-GPU job is most likely a small
//!    model, a 64-GPU one LLaMA. The draw uses a generator seeded by `--seed` and the
//!    job's line, so a job keeps its model whatever window or limit selects it.
//! 3. **Plan**: the best plan of the reference's plan families (those the trace format
//!    can name) for that many GPUs packed on the cluster's nodes, as the model fitted
//!    on the reference's profiled rows predicts; cores: the node's fair share per GPU.
//! 4. **Length**: iterations = duration x that throughput / global batch (at least 1),
//!    so the job run alone at its request takes about as long as it did.
//! 5. **Guarantee**: drawn with probability `--guaranteed-share` (same generator).
//!
//! Jobs without GPUs, with a duration of 0, Slurm job steps (`123.batch`) and jobs
//! that never started are left out and counted. Submission times start at 0 at the
//! first selected job.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use anyhow::{Context, bail};
use rubick_core::artifact::parse_yaml;
use rubick_core::limits::MAX_CLOCK_SECONDS;
use rubick_core::plan::PlanCode;
use rubick_core::{Cluster, Job, JobBatch, Placement};
use rubick_io::beliefs::{ModelSource, job_params};
use rubick_io::reference::ReferenceData;
use rubick_model::reference::TraceJob;
use rubick_planner::curves::Evaluator;
use rubick_planner::rng::SplitMix64;
use rubick_planner::{Candidates, PlannerConfig, ReferencePlans, Restriction};

static PAPER_JOBS: &str = include_str!("../../data/jobs-paper.yaml");

/// How jobs are mapped, for `trace --help`.
pub const MAPPING: &str = "\
How a job is mapped (neither log says what a job trained):
  GPUs   the job's, at most the cluster's; else the next count some model has a plan on
  model  one of the reference models with a plan there, drawn with weight
         2^-|log2(gpus / typical)| (typical: the model's GPUs in data/jobs-paper.yaml), by a
         generator seeded with --seed and the job's line (a job keeps its model under any
         window or limit)
  plan   the best plan of the reference's families on the packed GPUs (the model fitted on
         the reference's profiled rows); cores: the node's fair share per GPU
  steps  duration x that throughput / global batch: alone at its request, the job takes
         about as long as it did
Left out and counted: jobs without GPUs, of duration 0, Slurm job steps, unfinished jobs.

Examples:
  rubick-plan trace ../shared/reference/traces/philly.csv --format philly \\
      --cluster data/cluster-a800-8x8.yaml --virtual-cluster 6214e9 \\
      --to-s 604800 -o week.csv
  sacct -a -P -S now-30days \\
      -o JobID,Partition,Submit,Elapsed,State,AllocTRES > sacct.txt
  rubick-plan trace sacct.txt --format sacct --cluster cluster.yaml -o slurm.csv";

/// One job of a log: its line, submission (seconds since the epoch), duration and GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedJob {
    pub line: usize,
    pub submit_s: f64,
    pub duration_s: f64,
    pub gpus: u32,
    pub group: Option<String>,
}

/// Jobs a log holds that a trace leaves out, by why.
pub type LeftOut = BTreeMap<&'static str, usize>;

/// Seconds since 1970-01-01 of `YYYY-MM-DD[ T]HH:MM:SS` (UTC).
pub fn parse_time(text: &str) -> Option<f64> {
    let text = text.trim();
    let (date, time) = text.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    // A calendar year: the arithmetic below overflows i64 on a year of 15 digits.
    if !(0..=9999).contains(&y) {
        return None;
    }
    let mut t = time.splitn(3, ':').map(str::parse::<f64>);
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next().unwrap_or(Ok(0.0)).ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || !(0.0..24.0).contains(&hh) || !(0.0..60.0).contains(&mm) {
        return None;
    }
    if !(0.0..61.0).contains(&ss) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + hh * 3600.0 + mm * 60.0 + ss)
}

/// Seconds of Slurm's `[DD-]HH:MM:SS` (or `MM:SS`, `MM:SS.mmm`).
pub fn parse_elapsed(text: &str) -> Option<f64> {
    let text = text.trim();
    let (days, rest) = match text.split_once('-') {
        Some((d, r)) => (d.parse::<f64>().ok()?, r),
        None => (0.0, text),
    };
    let parts: Vec<f64> = rest.split(':').map(str::parse::<f64>).collect::<Result<_, _>>().ok()?;
    let (h, m, s) = match parts[..] {
        [h, m, s] => (h, m, s),
        [m, s] => (0.0, m, s),
        _ => return None,
    };
    let total = days * 86_400.0 + h * 3600.0 + m * 60.0 + s;
    (total.is_finite() && total >= 0.0).then_some(total)
}

/// GPUs of a TRES list (`cpu=4,gres/gpu=2,mem=16G`; typed `gres/gpu:a100=2` counts when
/// no untyped entry does) or of a GRES list (`gpu:2`, `gpu:a100:2`).
pub fn parse_gpus(text: &str) -> Option<u32> {
    let mut untyped = None;
    let mut typed = 0u32;
    for item in text.split(',').map(str::trim) {
        if let Some(n) = item.strip_prefix("gres/gpu=") {
            untyped = Some(n.parse().ok()?);
        } else if let Some(rest) = item.strip_prefix("gres/gpu:") {
            let (_, n) = rest.split_once('=')?;
            typed = typed.checked_add(n.parse().ok()?)?;
        } else if let Some(rest) = item.strip_prefix("gpu:") {
            let rest = rest.split('(').next()?; // `gpu:2(IDX:0-1)`
            let n = rest.rsplit(':').next()?;
            typed = typed.checked_add(n.parse().ok()?)?;
        }
    }
    Some(untyped.unwrap_or(typed))
}

/// Keeps a job that used GPUs for some time; counts the others in `left`.
fn keep(jobs: &mut Vec<LoggedJob>, left: &mut LeftOut, job: LoggedJob) {
    if job.gpus == 0 {
        *left.entry("no GPUs").or_default() += 1;
    } else if job.duration_s <= 0.0 {
        *left.entry("a duration of 0 (never started)").or_default() += 1;
    } else {
        jobs.push(job);
    }
}

/// A row of a delimited table: its line number and fields.
type Row<'t> = (usize, Vec<&'t str>);

/// A delimited table's header and its non-empty rows.
fn table<'t>(path: &str, text: &'t str, sep: char) -> anyhow::Result<(Vec<&'t str>, impl Iterator<Item = Row<'t>>)> {
    let mut lines = text.lines().enumerate();
    let Some((_, header)) = lines.next() else { bail!("{path}: empty") };
    let rows = lines
        .filter(|(_, row)| !row.trim().is_empty())
        .map(move |(i, row)| (i + 1, row.split(sep).map(str::trim).collect()));
    Ok((header.split(sep).map(str::trim).collect(), rows))
}

fn bad(path: &str, line: usize, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{path}: line {line}: {what}")
}

/// The jobs of a Philly CSV, and what it left out.
pub fn read_philly(path: &str, text: &str) -> anyhow::Result<(Vec<LoggedJob>, LeftOut)> {
    let (cols, rows) = table(path, text, ',')?;
    let at = |name: &str| {
        cols.iter().position(|c| *c == name).with_context(|| format!("{path}: line 1: no `{name}` column"))
    };
    let (ts, dur, gpus, vc) = (at("timestamp")?, at("duration")?, at("num_gpus")?, at("cluster").ok());
    let mut jobs = Vec::new();
    let mut left = LeftOut::new();
    for (line, f) in rows {
        let field = |k: usize, name: &str| f.get(k).copied().ok_or_else(|| bad(path, line, format!("no {name}")));
        let submit_s = parse_time(field(ts, "timestamp")?)
            .ok_or_else(|| bad(path, line, "timestamp: expected YYYY-MM-DD HH:MM:SS, a year 0 to 9999"))?;
        let duration_s: f64 = field(dur, "duration")?
            .parse()
            .ok()
            .filter(|d: &f64| d.is_finite() && *d >= 0.0 && *d <= 1e9)
            .ok_or_else(|| bad(path, line, "duration: expected seconds, 0 to 1e9"))?;
        let n: f64 = field(gpus, "num_gpus")?
            .parse()
            .ok()
            .filter(|g: &f64| g.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(g))
            .ok_or_else(|| bad(path, line, "num_gpus: expected a whole number of GPUs"))?;
        let group = vc.and_then(|k| f.get(k)).map(|s| (*s).to_owned());
        keep(&mut jobs, &mut left, LoggedJob { line, submit_s, duration_s, gpus: n as u32, group });
    }
    Ok((jobs, left))
}

/// The jobs of `sacct -P` output (with its header), and what it left out.
pub fn read_sacct(path: &str, text: &str) -> anyhow::Result<(Vec<LoggedJob>, LeftOut)> {
    let (cols, rows) = table(path, text, '|')?;
    let at = |name: &str| cols.iter().position(|c| c.eq_ignore_ascii_case(name));
    let id =
        at("JobID").with_context(|| format!("{path}: line 1: no `JobID` column (run sacct with -P and a header)"))?;
    let submit = at("Submit").with_context(|| format!("{path}: line 1: no `Submit` column"))?;
    let elapsed_raw = at("ElapsedRaw");
    let elapsed = at("Elapsed");
    if elapsed_raw.is_none() && elapsed.is_none() {
        bail!("{path}: line 1: no `Elapsed` or `ElapsedRaw` column");
    }
    let tres: Vec<usize> = ["AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES"].iter().filter_map(|c| at(c)).collect();
    if tres.is_empty() {
        bail!("{path}: line 1: no `AllocTRES`, `ReqTRES` or `AllocGRES` column: the GPUs of a job are unknown");
    }
    let state = at("State");
    let partition = at("Partition");
    let mut jobs = Vec::new();
    let mut left = LeftOut::new();
    for (line, f) in rows {
        let get = |k: usize| f.get(k).copied().unwrap_or("");
        if get(id).contains('.') {
            *left.entry("job steps").or_default() += 1;
            continue;
        }
        let st = state.map(get).unwrap_or("");
        if ["PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED"].iter().any(|s| st.starts_with(s)) {
            *left.entry("not finished").or_default() += 1;
            continue;
        }
        let Some(submit_s) = parse_time(get(submit)) else {
            return Err(bad(
                path,
                line,
                format!("Submit: expected YYYY-MM-DDTHH:MM:SS, a year 0 to 9999, got `{}`", get(submit)),
            ));
        };
        let (column, duration_s) = match (elapsed_raw, elapsed) {
            (Some(k), _) if !get(k).is_empty() => ("ElapsedRaw", get(k).parse::<f64>().ok()),
            (_, Some(k)) => ("Elapsed", parse_elapsed(get(k))),
            _ => ("Elapsed", None),
        };
        let duration_s =
            duration_s.filter(|d| d.is_finite() && (0.0..=MAX_CLOCK_SECONDS).contains(d)).ok_or_else(|| {
                bad(
                    path,
                    line,
                    format!(
                        "{column}: expected [DD-]HH:MM:SS (or ElapsedRaw seconds), 0 to {MAX_CLOCK_SECONDS:e} seconds"
                    ),
                )
            })?;
        let gpus = tres.iter().map(|&k| get(k)).find(|t| !t.is_empty()).map_or(Some(0), parse_gpus);
        let Some(gpus) = gpus else {
            return Err(bad(path, line, "AllocTRES: expected gres/gpu=N among its entries"));
        };
        let group = partition.map(|k| get(k).to_owned());
        keep(&mut jobs, &mut left, LoggedJob { line, submit_s, duration_s, gpus, group });
    }
    Ok((jobs, left))
}

/// What one model offers the mapping: its job template and, per GPU count, its best
/// coded plan and throughput (memoised).
struct Candidate {
    job: Job,
    params: rubick_model::perfmodel::Params,
    typical: u32,
    plans: HashMap<u32, Option<(PlanCode, f64)>>,
}

/// Maps the jobs of the log at `path` onto the reference's models (see the module's
/// rules): one row of the trace per job, in order, each checked as the simulator checks
/// the rows it reads ([`TraceJob::check`]; an error names the log's line).
pub fn map_jobs(
    path: &str,
    jobs: &[LoggedJob],
    prefix: &str,
    cluster: &Cluster,
    reference: &ReferenceData,
    seed: u64,
    guaranteed_share: f64,
) -> anyhow::Result<Vec<TraceJob>> {
    let group = cluster.node_groups.first().context("the cluster has no node group")?;
    let paper: JobBatch = parse_yaml(PAPER_JOBS)?;
    let mut templates = Vec::new();
    for name in reference.model_names() {
        let Some(spec) = reference.model_spec(name)? else { continue };
        let Some(paper_job) = paper.jobs.iter().find(|j| j.model.name == name) else { continue };
        let mut job = paper_job.clone();
        job.model = spec;
        job.request.plan = None;
        job.current = None;
        templates.push(job);
    }
    anyhow::ensure!(!templates.is_empty(), "the reference data has none of the paper's models");
    let params = job_params(&templates, cluster, &ModelSource { jobs_path: None, reference: Some(reference) })?;
    let mut models: Vec<Candidate> = templates
        .into_iter()
        .zip(params)
        .map(|(job, params)| Candidate { typical: job.request.gpus.max(1), job, params, plans: HashMap::new() })
        .collect();
    let candidates = Candidates::default().and(std::sync::Arc::new(ReferencePlans));
    let config = PlannerConfig { candidates, ..PlannerConfig::default() };
    let mut evaluator = Evaluator::new(cluster, &config);
    let fair = group.fair_cpus_per_gpu();
    let cap = group.total_gpus();
    let plan_of = |m: &mut Candidate, gpus: u32, ev: &mut Evaluator<'_>| -> Option<(PlanCode, f64)> {
        *m.plans.entry(gpus).or_insert_with(|| {
            let placement = Placement::packed(gpus, group.gpus_per_node)?;
            let (plan, thr) = ev.best_plan(&m.job, &m.params, 0, &placement, gpus * fair, Restriction::Any)?;
            Some((PlanCode::of(&plan)?, thr))
        })
    };
    let first = jobs.iter().map(|j| j.submit_s).fold(f64::INFINITY, f64::min);
    let mut rows = Vec::with_capacity(jobs.len());
    for job in jobs {
        // The largest count at most the job's (and the cluster's) that some model can run.
        let mut gpus = job.gpus.min(cap);
        let feasible = loop {
            let f: Vec<usize> =
                (0..models.len()).filter(|&i| plan_of(&mut models[i], gpus, &mut evaluator).is_some()).collect();
            if !f.is_empty() || gpus <= 1 {
                break f;
            }
            gpus -= 1;
        };
        anyhow::ensure!(!feasible.is_empty(), "no reference model has a plan on 1 GPU of `{}`", group.name);
        let mut rng = SplitMix64::new(seed ^ (job.line as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let weights: Vec<(usize, f64)> = feasible
            .iter()
            .map(|&i| (i, 0.5f64.powf((f64::from(gpus) / f64::from(models[i].typical)).log2().abs())))
            .collect();
        let i = *rng.weighted(&weights);
        let Some((plan, throughput)) = plan_of(&mut models[i], gpus, &mut evaluator) else { continue };
        let m = &models[i];
        let batch = m.job.model.global_batch as f64;
        let steps = (job.duration_s * throughput / batch).round().clamp(1.0, f64::from(u32::MAX) - 1.0) as u64;
        let guaranteed = rng.unit() < guaranteed_share;
        let row = TraceJob {
            name: format!("{prefix}-{}", job.line),
            submission_time_s: (job.submit_s - first).max(0.0),
            duration_s: job.duration_s,
            application: m.job.model.name.clone(),
            num_gpus: gpus,
            num_cpus: gpus * fair,
            bandwidth: 0.0,
            exec_plan: plan,
            steps,
            is_sla: guaranteed,
        };
        row.check().map_err(|e| bad(path, job.line, format!("the trace's {} {}", e.field, e.message)))?;
        rows.push(row);
    }
    Ok(rows)
}

/// The trace as CSV, in the reference workload's columns.
pub fn to_csv(rows: &[TraceJob]) -> String {
    let mut out =
        String::from("name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{}",
            r.name,
            r.submission_time_s,
            r.duration_s,
            r.application,
            r.num_gpus,
            r.num_cpus,
            r.bandwidth,
            r.exec_plan,
            r.steps,
            u8::from(r.is_sla)
        );
    }
    out
}

/// Which jobs of a log a trace takes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// Only jobs of this group (Philly's virtual cluster, Slurm's partition).
    pub group: Option<String>,
    /// Only jobs submitted at least this many seconds after the log's first (selected) job.
    pub from_s: f64,
    /// Only jobs submitted before this many seconds after it.
    pub to_s: Option<f64>,
    /// At most this many jobs (the first submitted, after the window).
    pub limit: Option<usize>,
}

impl Window {
    /// Keeps the jobs of the window, sorted by submission (then line).
    pub fn select(&self, jobs: &mut Vec<LoggedJob>) {
        if let Some(g) = &self.group {
            jobs.retain(|j| j.group.as_deref() == Some(g.as_str()));
        }
        jobs.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s).then(a.line.cmp(&b.line)));
        let start = jobs.first().map_or(0.0, |j| j.submit_s);
        jobs.retain(|j| j.submit_s - start >= self.from_s && self.to_s.is_none_or(|to| j.submit_s - start < to));
        if let Some(n) = self.limit {
            jobs.truncate(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_parse() {
        assert_eq!(parse_time("1970-01-01 00:00:00"), Some(0.0));
        assert_eq!(parse_time("2017-10-09 07:01:55"), Some(1_507_532_515.0));
        assert_eq!(parse_time("2026-12-04T05:00:00"), Some(1_796_360_400.0));
        assert_eq!(parse_time("2017-13-09 07:01:55"), None);
        assert_eq!(parse_time("yesterday"), None);
        // A year of 18 digits overflowed i64 (silently, in a release build).
        assert_eq!(parse_time("999999999999999999-10-09 07:01:55"), None);
        assert_eq!(parse_time("9999-12-31 23:59:59"), Some(253_402_300_799.0));
        assert_eq!(parse_elapsed("1-02:03:04"), Some(93_784.0));
        assert_eq!(parse_elapsed("00:01:05"), Some(65.0));
        assert_eq!(parse_elapsed("01:05"), Some(65.0));
        assert_eq!(parse_elapsed("x"), None);
    }

    #[test]
    fn gpus_from_tres_and_gres() {
        assert_eq!(parse_gpus("billing=4,cpu=4,gres/gpu=2,mem=16G,node=1"), Some(2));
        assert_eq!(parse_gpus("cpu=4,gres/gpu:a100=3,mem=16G"), Some(3));
        assert_eq!(parse_gpus("cpu=4,gres/gpu=2,gres/gpu:a100=2"), Some(2));
        assert_eq!(parse_gpus("gpu:a100:4(IDX:0-3)"), Some(4));
        assert_eq!(parse_gpus("cpu=4,mem=1G"), Some(0));
        assert_eq!(parse_gpus("gres/gpu=lots"), None);
    }

    #[test]
    fn sacct_rows_skip_steps_and_unfinished_jobs() {
        let text = "JobID|JobName|Partition|Submit|Elapsed|State|AllocTRES\n\
            11|train|gpu|2026-12-01T10:00:00|01:00:00|COMPLETED|cpu=8,gres/gpu=4,mem=32G\n\
            11.batch|batch|gpu|2026-12-01T10:00:00|01:00:00|COMPLETED|cpu=8,gres/gpu=4,mem=32G\n\
            12|prep|cpu|2026-12-01T10:05:00|00:10:00|COMPLETED|cpu=2,mem=4G\n\
            13|train|gpu|2026-12-01T10:06:00|00:00:00|RUNNING|cpu=8,gres/gpu=8\n\
            14|train|gpu|2026-12-01T10:07:00|2-00:00:00|TIMEOUT|cpu=8,gres/gpu=8\n";
        let (jobs, left) = read_sacct("sacct.txt", text).unwrap();
        assert_eq!(
            jobs.iter().map(|j| (j.line, j.gpus, j.duration_s)).collect::<Vec<_>>(),
            [(2, 4, 3600.0), (6, 8, 172_800.0)]
        );
        assert_eq!(left.values().sum::<usize>(), 3);
        let e = read_sacct("sacct.txt", "JobID|Submit|Elapsed|AllocTRES\n1|soon|01:00|gres/gpu=1\n").unwrap_err();
        assert!(e.to_string().contains("sacct.txt: line 2: Submit"), "{e}");
        let e = read_sacct("sacct.txt", "JobID|Submit|ElapsedRaw|AllocTRES\n1|2026-12-01T10:00:00|1e300|gres/gpu=1\n")
            .unwrap_err();
        assert!(e.to_string().contains("sacct.txt: line 2: ElapsedRaw"), "{e}");
    }

    #[test]
    fn philly_rows_name_their_line_when_bad() {
        let ok = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
                  2017-10-09 07:02:00,0.0,2,0.0,11cb48\n";
        let (jobs, left) = read_philly("p.csv", ok).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(left.values().sum::<usize>(), 1);
        let e = read_philly("p.csv", "timestamp,duration,num_gpus\n2017-10-09 07:01:55,-3,1\n").unwrap_err();
        assert!(e.to_string().contains("p.csv: line 2: duration"), "{e}");
    }
}
