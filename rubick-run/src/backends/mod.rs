//! Backends: where runs execute. One trait, one registry.
//!
//! * `local` — detached processes on this machine, each run in a process group of its
//!   own under the run wrapper ([`rubick_launch::wrap`]: a child subreaper that records
//!   the group's id (its pid file) before the job starts and the job's exit code after
//!   it ends, both written atomically in the run's directory, and ends whatever the job
//!   left behind): a `rubick-run` killed between starting a run and recording it
//!   finds it again from its pid file; `CUDA_VISIBLE_DEVICES` from the placement's GPU
//!   indices; pinned (`taskset`) to as many of this machine's cores as it was given,
//!   cores no other running job holds; a log file per run.
//!
//! * `slurm` — one `sbatch` job per run ([`slurm`]).
//!
//! * `kubernetes` — Kubeflow PyTorchJob / TrainJob manifests and a ConfigMap, applied with
//!   kubectl when a cluster is configured, else written to a directory ([`kubernetes`]).

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rubick_core::Job;
use rubick_core::launch::{Launch, LaunchContext, StopSignal};
use rubick_launch::RunRequest;
pub use rubick_launch::supervise::RunSignal;

use crate::reconcile::Allocation;

pub mod kubernetes;
pub mod slurm;

/// What a backend needs to start a run.
#[derive(Debug)]
pub struct StartSpec<'a> {
    pub job: &'a Job,
    pub launch: &'a Launch,
    pub allocation: &'a Allocation,
    /// This run's directory (log, metric lines, pid and exit files).
    pub dir: &'a Path,
    /// The job's checkpoints, kept across its runs.
    pub checkpoint_dir: &'a Path,
    /// CPU cores to pin the run to (local backend); empty: not pinned.
    pub cores: &'a [u32],
}

impl StartSpec<'_> {
    /// Creates the run's directory (`dir`) and the job's checkpoint directory, and
    /// builds the run's launch request: the contract's context for this allocation
    /// (files in `dir`), with the master address and port and the GPU indices the
    /// backend decides (none: the backend's scheduler sets `CUDA_VISIBLE_DEVICES`).
    pub fn request(
        &self,
        dir: &Path,
        checkpoint_dir: &Path,
        master: (&str, u16),
        visible_devices: Vec<u32>,
    ) -> anyhow::Result<RunRequest<'_>> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
        std::fs::create_dir_all(checkpoint_dir)
            .with_context(|| format!("{}: cannot create", checkpoint_dir.display()))?;
        let a = self.allocation;
        let path = |name: &str| dir.join(name).display().to_string();
        Ok(RunRequest {
            launch: self.launch,
            context: LaunchContext {
                job: self.job.name.clone(),
                plan: a.plan,
                nodes: a.nodes.len() as u32,
                node_rank: 0,
                gpus_per_node: a.nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0),
                cpus: a.nodes.iter().map(|n| n.cpus).sum(),
                master_addr: master.0.to_owned(),
                master_port: master.1,
                deepspeed_config: path("deepspeed.json"),
                checkpoint_dir: checkpoint_dir.display().to_string(),
                metrics: path("metrics.jsonl"),
                visible_devices,
            },
            log: dir.join("log.txt"),
            clear_env: false,
            stop_after_iterations: None,
            wrapper: None,
        })
    }
}

/// A place runs execute (shared by the threads that stop a round's runs together).
pub trait Backend: std::fmt::Debug + Sync {
    fn name(&self) -> &'static str;
    /// Starts a run; its handle.
    fn start(&self, spec: &StartSpec<'_>) -> anyhow::Result<String>;
    /// Whether any process of the run is alive.
    fn alive(&self, handle: &str) -> bool;
    /// Sends `signal` to every process of the run.
    fn signal(&self, handle: &str, signal: RunSignal);
    /// The handle of a run started in `dir` but maybe never recorded (crash recovery).
    fn recover(&self, dir: &Path) -> Option<String>;
    /// The run's exit code, once it ended.
    fn exit_code(&self, handle: Option<&str>, dir: &Path) -> Option<i32>;
    /// Whether the backend's scheduler ended the run to make room (Slurm's PREEMPTED
    /// without a requeue): the job waits again, no retry spent.
    fn preempted(&self, _handle: Option<&str>) -> bool {
        false
    }
    /// Why a live run can no longer go on where it was placed, if it cannot: Slurm
    /// requeued it after one of its `nodes` failed and, pinned to them, it would wait
    /// until that node returns. The caller ends it and queues the job (no retry spent),
    /// so the next round places it on the nodes that are up.
    fn stranded(&self, _handle: &str, _nodes: &[String]) -> Option<String> {
        None
    }
}

/// Makes a backend.
pub type MakeBackend = fn(Option<&Path>) -> anyhow::Result<Box<dyn Backend>>;

/// Backends by name.
pub const REGISTRY: [(&str, MakeBackend); 3] = [
    ("local", |_| Ok(Box::new(Local))),
    ("slurm", |_| Ok(Box::new(slurm::Slurm))),
    ("kubernetes", |root| Ok(Box::new(kubernetes::Kubernetes::configured(root)?))),
];

/// Whether a backend is called `name`.
pub fn known(name: &str) -> bool {
    REGISTRY.iter().any(|(n, _)| *n == name)
}

/// The backend called `name`, with the settings the state directory `root` keeps for
/// it (Kubernetes: `kubernetes.yaml`); `None` for an unknown name.
pub fn backend(name: &str, root: Option<&Path>) -> anyhow::Result<Option<Box<dyn Backend>>> {
    REGISTRY.iter().find(|(n, _)| *n == name).map(|(_, make)| make(root)).transpose()
}

/// Asks a run to stop (the contract's stop signal), waits up to `timeout` for all its
/// processes to exit, then kills what is left; `(seconds, exited cleanly)`.
pub fn stop(backend: &dyn Backend, handle: &str, signal: StopSignal, timeout: Duration) -> (f64, bool) {
    let start = Instant::now();
    backend.signal(handle, RunSignal::Stop(signal));
    crate::failpoint("stop-signalled");
    let clean = wait_gone(backend, handle, timeout);
    if !clean {
        backend.signal(handle, RunSignal::Kill);
        wait_gone(backend, handle, Duration::from_secs(10));
    }
    (start.elapsed().as_secs_f64(), clean)
}

fn wait_gone(backend: &dyn Backend, handle: &str, timeout: Duration) -> bool {
    let start = Instant::now();
    while backend.alive(handle) {
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Local processes.
#[derive(Debug, Clone, Copy)]
pub struct Local;

const PID_FILE: &str = "pgid";
const EXIT_FILE: &str = "exit-code";

/// A local run's handle: its process group and its directory (`PGID@DIR`), so that
/// the processes that left the group are found by the run's mark
/// (`RUBICK_METRICS=DIR/metrics.jsonl`). A plain `PGID` (older states) still works.
fn local_handle(pgid: u32, dir: &Path) -> String {
    format!("{pgid}@{}", dir.display())
}

/// `(process group, metrics path)` of a local handle.
fn parse_local(handle: &str) -> (Option<u32>, Option<String>) {
    match handle.split_once('@') {
        Some((pgid, dir)) => (pgid.parse().ok(), Some(Path::new(dir).join("metrics.jsonl").display().to_string())),
        None => (handle.parse().ok(), None),
    }
}

/// Whether `pid` is a live (not zombie) member of process group `pgid`.
fn in_group(pid: u32, pgid: u32) -> bool {
    rubick_launch::supervise::proc_stat(pid).is_some_and(|s| !s.zombie && s.pgrp == pgid)
}

/// Non-zombie processes of process group `pgid` (a scan of /proc).
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).filter(|pid| in_group(*pid, pgid)).collect()
}

impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start(&self, spec: &StartSpec<'_>) -> anyhow::Result<String> {
        let gpus = spec.allocation.nodes.first().map(|n| n.gpus.clone()).unwrap_or_default();
        let request =
            spec.request(spec.dir, spec.checkpoint_dir, ("127.0.0.1", rubick_launch::supervise::free_port()), gpus)?;
        let prepared = rubick_launch::supervise::prepare(&request)?;
        let log = std::fs::File::create(&request.log).with_context(|| request.log.display().to_string())?;
        let log2 = log.try_clone()?;
        // The run wrapper (rubick_launch::wrap: records the group id, outlives the stop
        // signal, ends whatever the job left behind, records the exit code), pinned to
        // the run's cores (`taskset`, inherited by every process of the run).
        // Detached (no watching of stdin): the run outlives this rubick-run.
        let line = rubick_launch::wrap::Wrap {
            pid_file: Some(spec.dir.join(PID_FILE)),
            exit_file: Some(spec.dir.join(EXIT_FILE)),
            ..rubick_launch::wrap::Wrap::of(&prepared.argv)
        }
        .command_line(&rubick_launch::wrap::command().map_err(anyhow::Error::msg)?);
        let pin =
            !spec.cores.is_empty() && Command::new("taskset").arg("-V").output().is_ok_and(|o| o.status.success());
        let mut command = if pin {
            let cores: Vec<String> = spec.cores.iter().map(ToString::to_string).collect();
            let mut c = Command::new("taskset");
            c.args(["-c", &cores.join(",")]).args(&line);
            c
        } else {
            let mut c = Command::new(&line[0]);
            c.args(&line[1..]);
            c
        };
        command.envs(&prepared.env).stdin(Stdio::null()).stdout(log).stderr(log2).process_group(0);
        if let Some(dir) = &prepared.workdir {
            command.current_dir(dir);
        }
        let mut child = command.spawn().with_context(|| format!("cannot start the run of `{}`", spec.job.name))?;
        let pgid = child.id();
        // Reaped here while this rubick-run lives; by init once it has exited.
        std::thread::spawn(move || child.wait());
        Ok(local_handle(pgid, spec.dir))
    }

    fn alive(&self, handle: &str) -> bool {
        match parse_local(handle) {
            // The run is its marked processes (its wrapper, the job, whatever they
            // started in any session): a process group id reused by another program
            // after the run ended is never taken for it.
            // Its wrapper, the group's leader, lives as long as the job: one read; a
            // scan of /proc only once the leader is gone.
            (pgid, Some(metrics)) => {
                pgid.is_some_and(|p| rubick_launch::supervise::carries_mark(p, &metrics))
                    || !rubick_launch::supervise::marked_processes(&metrics).is_empty()
            }
            // An older state's plain group id: its leader, else its members.
            (Some(pgid), None) => in_group(pgid, pgid) || !group_members(pgid).is_empty(),
            (None, None) => false,
        }
    }

    fn signal(&self, handle: &str, signal: RunSignal) {
        match parse_local(handle) {
            // Only the run's own (marked) processes: never whatever holds a reused id.
            (_, Some(metrics)) => rubick_launch::supervise::signal_run(None, &metrics, signal),
            (Some(pgid), None) => rubick_launch::supervise::signal_group(pgid, signal),
            (None, None) => {}
        }
    }

    fn recover(&self, dir: &Path) -> Option<String> {
        let pgid: u32 = std::fs::read_to_string(dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
        let handle = local_handle(pgid, &std::path::absolute(dir).ok()?);
        self.alive(&handle).then_some(handle)
    }

    fn exit_code(&self, _handle: Option<&str>, dir: &Path) -> Option<i32> {
        std::fs::read_to_string(dir.join(EXIT_FILE)).ok()?.trim().parse().ok()
    }
}

/// A run's metric lines so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// The last iteration's number.
    pub last: Option<u64>,
    /// Mean time of the last ten iterations.
    pub recent_iter_time_s: Option<f64>,
    /// The iteration of its last checkpoint.
    pub checkpointed: Option<u64>,
}

/// How much of the end of a metrics file a round reads: the last iterations' lines.
const TAIL_BYTES: usize = 64 * 1024;

/// What a run's metric lines (in its directory) say so far. Every round asks this of
/// every running job, and a job that has run for a week wrote a hundred thousand lines:
/// only the file's tail is parsed (the whole file only when the tail holds fewer than
/// ten iterations, and, for a checkpoint event older than the tail, only the lines that
/// name one).
pub fn progress(dir: &Path) -> Progress {
    use rubick_core::launch::{MetricLine, iteration_times, mean_sd};
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let mut start = text.len().saturating_sub(TAIL_BYTES);
    while start > 0 && !text.is_char_boundary(start) {
        start -= 1;
    }
    // The first whole line of the tail.
    let start = if start == 0 { 0 } else { text[start..].find('\n').map_or(text.len(), |i| start + i + 1) };
    let mut lines: Vec<MetricLine> = text[start..].lines().filter_map(MetricLine::parse).collect();
    let mut head = &text[..start];
    if start > 0 && iteration_times(&lines).len() < 10 {
        lines = text.lines().filter_map(MetricLine::parse).collect();
        head = "";
    }
    let times = iteration_times(&lines);
    fn checkpointed(mut lines: impl Iterator<Item = MetricLine>) -> Option<u64> {
        lines.find_map(|m| match m {
            MetricLine::Event { event, iter, .. } if event == "checkpointed" => iter,
            _ => None,
        })
    }
    Progress {
        last: lines
            .iter()
            .rev()
            .find_map(|m| if let MetricLine::Iteration { iter, .. } = m { Some(*iter) } else { None }),
        recent_iter_time_s: mean_sd(&times[times.len().saturating_sub(10)..]).map(|(mean, _)| mean),
        checkpointed: checkpointed(lines.iter().rev().cloned()).or_else(|| {
            checkpointed(head.lines().rev().filter(|l| l.contains("checkpointed")).filter_map(MetricLine::parse))
        }),
    }
}

/// The last iteration a run's metric lines name (what every command records of every
/// run): read from the file's last few kilobytes, backwards; [`progress`] when they name
/// none.
pub fn last_iteration(dir: &Path) -> Option<u64> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    const END: u64 = 4096;
    let mut file = std::fs::File::open(dir.join("metrics.jsonl")).ok()?;
    let len = file.metadata().ok()?.len();
    let from = len.saturating_sub(END);
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::with_capacity((len - from) as usize);
    file.read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    // A line cut by the start of the window is skipped (it cannot parse).
    let found = text.lines().rev().find_map(|l| match rubick_core::launch::MetricLine::parse(l)? {
        rubick_core::launch::MetricLine::Iteration { iter, .. } => Some(iter),
        _ => None,
    });
    if found.is_some() || from == 0 {
        return found;
    }
    progress(dir).last
}

/// How many iteration lines a run's metrics file holds (the whole file is read).
pub fn iterations_written(dir: &Path) -> usize {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let lines: Vec<rubick_core::launch::MetricLine> =
        text.lines().filter_map(rubick_core::launch::MetricLine::parse).collect();
    rubick_core::launch::iteration_times(&lines).len()
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    fn line(i: u64, t: f64) -> String {
        format!("{{\"rubick\":1,\"iter\":{i},\"iter_time_s\":{t}}}\n")
    }

    /// A week-long run's file: the tail answers, as the whole file would.
    #[test]
    fn a_long_metrics_file_reads_its_tail_and_finds_an_old_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":7}\n");
        for i in 8..50_000u64 {
            text.push_str(&line(i, 0.1 + (i % 10) as f64 / 100.0));
        }
        text.push_str("not json\n");
        std::fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        let p = progress(dir.path());
        assert_eq!(p.last, Some(49_999));
        assert_eq!(p.checkpointed, Some(7), "an event older than the tail is found");
        let recent: f64 = (49_990..50_000u64).map(|i| 0.1 + (i % 10) as f64 / 100.0).sum::<f64>() / 10.0;
        assert!((p.recent_iter_time_s.unwrap() - recent).abs() < 1e-12);
        assert_eq!(iterations_written(dir.path()), 49_992);
        // A newer checkpoint in the tail wins; a short file is read whole.
        text.push_str("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":49999}\n");
        std::fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        assert_eq!(progress(dir.path()).checkpointed, Some(49_999));
        std::fs::write(dir.path().join("metrics.jsonl"), line(1, 0.5) + &line(2, 0.7)).unwrap();
        let p = progress(dir.path());
        assert_eq!((p.last, p.checkpointed), (Some(2), None));
        assert!((p.recent_iter_time_s.unwrap() - 0.6).abs() < 1e-12);
    }
}
