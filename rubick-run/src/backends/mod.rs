//! Backends: where runs execute, each a [`rubick_launch::Executor`] (submit, poll,
//! signal, recover over typed handles), one registry.
//!
//! * `local` — [`rubick_launch::executor::Local`]: detached processes on this machine,
//!   each run in a process group of its own under the run wrapper (a child subreaper
//!   that records the group's id before the job starts and the job's exit code after it
//!   ends, both atomically in the run's directory, and ends whatever the job left
//!   behind): a `rubick-run` killed between starting a run and recording it finds it
//!   again from its pid file; `CUDA_VISIBLE_DEVICES` from the placement's GPU indices;
//!   pinned (`taskset`) to as many of this machine's cores as it was given, cores no
//!   other running job holds; a log file per run.
//!
//! * `slurm` — [`rubick_launch::slurm::Slurm`]: one `sbatch` job per run, named
//!   [`run_name`], requeued by Slurm after a preemption or a node failure.
//!
//! * `kubernetes` — [`rubick_launch::kubernetes::Kubernetes`]: Kubeflow PyTorchJob /
//!   TrainJob manifests and a ConfigMap, applied with kubectl when a cluster is
//!   configured, else written to a directory; its settings from the state directory's
//!   `kubernetes.yaml`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use rubick_core::Job;
use rubick_core::launch::{Launch, LaunchContext, StopSignal};
pub use rubick_launch::executor::{End, Executor, Handle, RunState};
pub use rubick_launch::supervise::RunSignal;
use rubick_launch::{NodeSlot, RunRequest, Submission};

use crate::reconcile::Allocation;

pub use rubick_launch::kubernetes;

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

    /// The run as the executors take it: detached (it outlives this rubick-run), on the
    /// allocation's nodes, named [`run_name`], its master this machine on a free port
    /// (Slurm's runs: their first node), the first node's GPU indices (the local
    /// backend's; Slurm's and Kubernetes' schedulers pick their own).
    pub fn submission(&self) -> anyhow::Result<Submission<'_>> {
        let a = self.allocation;
        let gpus = a.nodes.first().map(|n| n.gpus.clone()).unwrap_or_default();
        let request =
            self.request(self.dir, self.checkpoint_dir, ("127.0.0.1", rubick_launch::supervise::free_port()), gpus)?;
        Ok(Submission {
            request,
            dir: self.dir.to_path_buf(),
            nodes: a
                .nodes
                .iter()
                .map(|n| NodeSlot {
                    name: n.node.clone(),
                    gpus: n.gpus.clone(),
                    cpus: n.cpus,
                    host_memory_gib: n.host_memory_gib,
                })
                .collect(),
            cores: self.cores.to_vec(),
            name: run_name(self.dir),
            detached: true,
            partition: None,
        })
    }
}

/// Makes a backend.
pub type MakeBackend = fn(Option<&Path>) -> anyhow::Result<Box<dyn Executor>>;

/// Backends by name.
pub const REGISTRY: [(&str, MakeBackend); 3] = [
    ("local", |_| Ok(Box::new(rubick_launch::executor::Local::new()))),
    ("slurm", |_| Ok(Box::new(rubick_launch::slurm::Slurm::new()))),
    ("kubernetes", |root| Ok(Box::new(kubernetes::Kubernetes::configured(root)?))),
];

/// Whether a backend is called `name`.
pub fn known(name: &str) -> bool {
    REGISTRY.iter().any(|(n, _)| *n == name)
}

/// The backend called `name`, with the settings the state directory `root` keeps for
/// it (Kubernetes: `kubernetes.yaml`); `None` for an unknown name.
pub fn backend(name: &str, root: Option<&Path>) -> anyhow::Result<Option<Box<dyn Executor>>> {
    REGISTRY.iter().find(|(n, _)| *n == name).map(|(_, make)| make(root)).transpose()
}

/// Asks a run to stop (the contract's stop signal), waits up to `timeout` for all its
/// processes to exit, then kills what is left; `(seconds, exited cleanly)`.
pub fn stop(backend: &dyn Executor, handle: &Handle, dir: &Path, signal: StopSignal, timeout: Duration) -> (f64, bool) {
    rubick_launch::executor::stop(backend, handle, dir, signal, timeout, || crate::failpoint("stop-signalled"))
}

/// The name of a run, from its directory `STATE/jobs/JOB/attempt-N`:
/// `rubick-JOB-N-HASH`, HASH a digest of the state directory's path, so that two state
/// directories submitting to one cluster never find each other's runs (Slurm's job
/// name, by which a run a killed rubick-run never recorded is found again).
pub fn run_name(dir: &Path) -> Option<String> {
    let attempt = dir.file_name()?.to_str()?.strip_prefix("attempt-")?;
    let job_dir = dir.parent()?;
    let job = job_dir.file_name()?.to_str()?;
    let state = std::path::absolute(job_dir.parent()?.parent()?).ok()?;
    let hash = rubick_launch::fnv1a(state.as_os_str().as_encoded_bytes());
    Some(format!("rubick-{job}-{attempt}-{:08x}", hash & 0xffff_ffff))
}

#[cfg(test)]
mod registry_tests {
    #[test]
    fn the_registry_knows_every_backend_by_its_name() {
        for name in ["local", "slurm", "kubernetes"] {
            assert!(super::backend(name, None).unwrap().is_some_and(|b| b.name() == name), "{name}");
        }
        assert!(super::backend("yarn", None).unwrap().is_none());
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
        assert_eq!(rubick_launch::supervise::iterations_in(&dir.path().join("metrics.jsonl")), 49_992);
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
