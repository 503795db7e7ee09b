//! Backends: where runs execute, each a [`rubick_launch::Executor`] (submit, poll,
//! signal, recover over typed handles), one registry.
//!
//! * `local` — [`rubick_launch::local::Local`]: detached processes on this machine,
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

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rubick_core::Job;
use rubick_core::launch::{Launch, LaunchContext, StopSignal};
pub use rubick_launch::{Executor, Exit, Handle, RunSignal, RunState};
use rubick_launch::{RunRequest, Submission};

use crate::reconcile::Allocation;

pub use rubick_launch::kubernetes;

/// What a backend needs to start a run.
#[derive(Debug)]
pub struct StartSpec {
    pub job: Job,
    /// The job's launch section as this run takes it (its working directory resolved,
    /// its iterations in the environment).
    pub launch: Launch,
    pub allocation: Allocation,
    /// This run's directory (log, metric lines, pid and exit files).
    pub dir: PathBuf,
    /// The job's checkpoints, kept across its runs.
    pub checkpoint_dir: PathBuf,
    /// CPU cores to pin the run to (local backend); empty: not pinned.
    pub cores: Vec<u32>,
}

impl StartSpec {
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
        let a = &self.allocation;
        let path = |name: &str| dir.join(name).display().to_string();
        Ok(RunRequest {
            launch: &self.launch,
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
        let a = &self.allocation;
        let gpus = a.nodes.first().map(|n| n.gpus.clone()).unwrap_or_default();
        let request = self.request(&self.dir, &self.checkpoint_dir, ("127.0.0.1", rubick_launch::free_port()), gpus)?;
        Ok(Submission {
            request,
            dir: self.dir.clone(),
            nodes: a.nodes.clone(),
            cores: self.cores.clone(),
            name: run_name(&self.dir),
            detached: true,
            partition: None,
        })
    }
}

/// Makes a backend.
pub type MakeBackend = fn(Option<&Path>) -> anyhow::Result<Box<dyn Executor>>;

/// Backends by name.
pub const REGISTRY: [(&str, MakeBackend); 3] = [
    ("local", |_| Ok(Box::new(rubick_launch::Local::new()))),
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
    /// How long that checkpoint's save took, when the run said (`save_s`).
    pub checkpoint_save_s: Option<f64>,
    /// The last iteration's loss, when the run said: NaN or an infinity when the job
    /// diverges.
    pub loss: Option<f64>,
}

/// The longest line a metrics reader takes: a protocol line is a few hundred bytes; a
/// longer one (a runaway print into the file) is skipped, never held in memory.
pub const MAX_METRIC_LINE_BYTES: usize = 16 * 1024;

/// How far back from its end a metrics file is read for its last iterations (and an
/// `oom` event): every round, `status` and `stop` ask this of every run, whatever the
/// file holds (a week of lines, or one line of 100 MB).
const TAIL_BYTES: u64 = 1024 * 1024;

/// How far back a stop looks for the run's last checkpoint event.
const CHECKPOINT_SCAN_BYTES: u64 = 16 * 1024 * 1024;

/// Calls `visit` on the lines of the last `limit` bytes of the file at `path`, the
/// last line first, until it returns false. Memory is bounded: the file is read
/// backwards in blocks; a line over [`MAX_METRIC_LINE_BYTES`], a line that is not
/// UTF-8, and the line cut by the limit are skipped.
pub fn lines_backwards(path: &Path, limit: u64, mut visit: impl FnMut(&str) -> bool) {
    use std::io::{Read as _, Seek as _, SeekFrom};
    const BLOCK: usize = 64 * 1024;
    let Ok(mut file) = std::fs::File::open(path) else { return };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return };
    let floor = len.saturating_sub(limit);
    let mut pos = len;
    // The end of the line being read (its bytes after the current block); `None` once
    // it grew over the limit (skipped up to its start).
    let mut pending: Option<Vec<u8>> = Some(Vec::new());
    let mut block = vec![0u8; BLOCK];
    let mut emit = |head: &[u8], tail: Option<Vec<u8>>| -> bool {
        let Some(mut tail) = tail else { return true };
        if head.len() + tail.len() > MAX_METRIC_LINE_BYTES {
            return true;
        }
        let line = if tail.is_empty() {
            std::str::from_utf8(head).ok().map(str::to_owned)
        } else {
            tail.splice(0..0, head.iter().copied());
            String::from_utf8(tail).ok()
        };
        line.is_none_or(|l| visit(&l))
    };
    while pos > floor {
        let start = pos.saturating_sub(BLOCK as u64).max(floor);
        let n = (pos - start) as usize;
        if file.seek(SeekFrom::Start(start)).is_err() || file.read_exact(&mut block[..n]).is_err() {
            return;
        }
        pos = start;
        let chunk = &block[..n];
        let mut end = n;
        while let Some(i) = chunk[..end].iter().rposition(|&b| b == b'\n') {
            if !emit(&chunk[i + 1..end], pending.take()) {
                return;
            }
            pending = Some(Vec::new());
            end = i;
        }
        // The rest belongs to a line that starts in an earlier block.
        pending = pending.and_then(|p| {
            (end + p.len() <= MAX_METRIC_LINE_BYTES).then(|| {
                let mut whole = chunk[..end].to_vec();
                whole.extend(p);
                whole
            })
        });
    }
    // At the file's start the first line is whole; at the limit it is cut.
    if floor == 0 {
        emit(&[], pending);
    }
}

/// The metric lines of a run's whole file (in its directory) within the job's
/// `iterations`, in order, read as a stream: a line over [`MAX_METRIC_LINE_BYTES`] is
/// skipped, never held in memory.
pub fn metric_lines(dir: &Path, iterations: u64) -> Vec<rubick_core::launch::MetricLine> {
    use std::io::BufRead as _;
    let path = dir.join("metrics.jsonl");
    let Ok(file) = std::fs::File::open(&path) else { return Vec::new() };
    let mut reader = std::io::BufReader::new(file);
    let (mut lines, mut line, mut overlong, mut warned) = (Vec::new(), Vec::new(), false, false);
    while let Ok(buf) = reader.fill_buf()
        && !buf.is_empty()
    {
        let (part, used, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        if !overlong {
            if line.len() + part.len() > MAX_METRIC_LINE_BYTES {
                overlong = true;
                line.clear();
            } else {
                line.extend_from_slice(part);
            }
        }
        reader.consume(used);
        if ended {
            if !overlong && let Ok(text) = std::str::from_utf8(&line) {
                lines.extend(in_range(text, iterations, &path, &mut warned));
            }
            line.clear();
            overlong = false;
        }
    }
    if !overlong && let Ok(text) = std::str::from_utf8(&line) {
        lines.extend(in_range(text, iterations, &path, &mut warned));
    }
    lines
}

/// A metric line whose iteration is within the job's `iterations` (a line naming
/// another, e.g. `"iter": 2^64-1`, is not the run's progress: `None`, with a warning
/// naming the file once per read through `warned`).
fn in_range(line: &str, iterations: u64, path: &Path, warned: &mut bool) -> Option<rubick_core::launch::MetricLine> {
    use rubick_core::launch::MetricLine;
    let m = MetricLine::parse(line)?;
    let iter = match &m {
        MetricLine::Iteration { iter, .. } => Some(*iter),
        MetricLine::Event { iter, .. } => *iter,
    };
    match iter {
        Some(i) if i > iterations => {
            if !std::mem::replace(warned, true) {
                tracing::warn!(
                    "{}: a metric line names iteration {i}, beyond the job's {iterations} iterations: ignored",
                    path.display()
                );
            }
            None
        }
        _ => Some(m),
    }
}

/// What a run's metric lines (in its directory) say so far, for a job of `iterations`
/// iterations. Every round asks this of every running job, and a job that has run for
/// a week wrote a hundred thousand lines: only the file's tail is read, backwards, up to
/// the last ten iterations (within its last MiB), lines over
/// [`MAX_METRIC_LINE_BYTES`] skipped; a checkpoint event only as far as that (see
/// [`progress_and_checkpoint`]). Iterations beyond the job's are ignored with a warning.
pub fn progress(dir: &Path, iterations: u64) -> Progress {
    read_progress(dir, iterations, false)
}

/// [`progress`], and the run's last checkpoint event even when it is older than the
/// tail (what a stop records): looked for within the file's last 16 MiB.
pub fn progress_and_checkpoint(dir: &Path, iterations: u64) -> Progress {
    read_progress(dir, iterations, true)
}

fn read_progress(dir: &Path, iterations: u64, checkpoint: bool) -> Progress {
    use rubick_core::launch::{MetricLine, mean_sd};
    let path = dir.join("metrics.jsonl");
    let (mut times, mut last, mut checkpointed, mut warned) = (Vec::new(), None, None, false);
    let (mut checkpoint_save_s, mut last_loss) = (None, None);
    let limit = if checkpoint { CHECKPOINT_SCAN_BYTES } else { TAIL_BYTES };
    lines_backwards(&path, limit, |line| {
        let enough = times.len() >= 10;
        if enough && (!checkpoint || checkpointed.is_some()) {
            return false;
        }
        if enough && !line.contains("checkpointed") {
            return true;
        }
        match in_range(line, iterations, &path, &mut warned) {
            Some(MetricLine::Iteration { iter, iter_time_s, loss, .. }) if !enough => {
                if last.is_none() {
                    (last, last_loss) = (Some(iter), loss);
                }
                times.push(iter_time_s);
            }
            Some(MetricLine::Event { event, iter: Some(i), save_s, .. })
                if event == "checkpointed" && checkpointed.is_none() =>
            {
                checkpointed = Some(i);
                checkpoint_save_s = save_s.filter(|s| s.is_finite() && *s >= 0.0);
            }
            _ => {}
        }
        true
    });
    times.reverse();
    Progress {
        last,
        recent_iter_time_s: mean_sd(&times).map(|(mean, _)| mean),
        checkpointed,
        checkpoint_save_s,
        loss: last_loss,
    }
}

/// The first iteration a run's metric lines name (read from the file's first 64 KiB,
/// within the job's `iterations`).
pub fn first_iteration(dir: &Path, iterations: u64) -> Option<u64> {
    use std::io::Read as _;
    let path = dir.join("metrics.jsonl");
    let mut bytes = Vec::new();
    std::fs::File::open(&path).ok()?.take(64 * 1024).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut warned = false;
    text.lines().find_map(|l| match in_range(l, iterations, &path, &mut warned)? {
        rubick_core::launch::MetricLine::Iteration { iter, .. } => Some(iter),
        _ => None,
    })
}

/// Whether a run's metrics file ends with an `oom` event (within its last MiB).
pub fn oom_event(dir: &Path) -> bool {
    use rubick_core::launch::MetricLine;
    let mut found = false;
    lines_backwards(&dir.join("metrics.jsonl"), TAIL_BYTES, |line| {
        found = line.contains("oom")
            && matches!(MetricLine::parse(line), Some(MetricLine::Event { event, .. }) if event == "oom");
        !found
    });
    found
}

/// The last iteration a run's metric lines name within the job's `iterations` (what
/// every command records of every run): read from the file's last few kilobytes,
/// backwards; [`progress`] when they name none.
pub fn last_iteration(dir: &Path, iterations: u64) -> Option<u64> {
    const END: u64 = 4096;
    let path = dir.join("metrics.jsonl");
    let (mut found, mut warned) = (None, false);
    lines_backwards(&path, END, |line| {
        if let Some(rubick_core::launch::MetricLine::Iteration { iter, .. }) =
            in_range(line, iterations, &path, &mut warned)
        {
            found = Some(iter);
        }
        found.is_none()
    });
    let small = std::fs::metadata(&path).is_ok_and(|m| m.len() <= END);
    if found.is_some() || small {
        return found;
    }
    progress(dir, iterations).last
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    fn line(i: u64, t: f64) -> String {
        format!("{{\"rubick\":1,\"iter\":{i},\"iter_time_s\":{t}}}\n")
    }

    /// A line of 100 MB (a hole in a sparse file) is skipped, never
    /// held; the lines after it are read, the ones before it beyond the tail are not;
    /// iterations beyond the job's are ignored.
    #[test]
    fn a_metrics_file_is_read_from_its_tail_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        std::fs::write(&path, line(1, 0.5)).unwrap();
        let file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.set_len(file.metadata().unwrap().len() + 100 * 1024 * 1024).unwrap();
        drop(file);
        let mut text = String::from("\n");
        text.push_str(&line(2, 0.3));
        text.push_str(&line(u64::MAX, 0.1));
        text.push_str("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":2}\n");
        text.push_str(&line(3, 0.4));
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        drop(file);
        let mut seen = Vec::new();
        lines_backwards(&path, u64::MAX, |l| {
            seen.push(l.len());
            true
        });
        assert_eq!(seen.len(), 6, "five short lines and the first; the long one skipped: {seen:?}");
        let p = progress_and_checkpoint(dir.path(), 100);
        assert_eq!((p.last, p.checkpointed), (Some(3), Some(2)));
        assert!((p.recent_iter_time_s.unwrap() - 0.35).abs() < 1e-12, "{p:?}");
        assert_eq!(last_iteration(dir.path(), 100), Some(3));
        assert_eq!(first_iteration(dir.path(), 100), Some(1));
        assert_eq!(last_iteration(dir.path(), 2), Some(2), "iteration 3 is beyond a job of 2");
        let lines = metric_lines(dir.path(), 100);
        assert_eq!(lines.len(), 4, "{lines:?}");
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
        let p = progress_and_checkpoint(dir.path(), 100_000);
        assert_eq!(p.last, Some(49_999));
        assert_eq!(p.checkpointed, Some(7), "an event older than the tail is found");
        let recent: f64 = (49_990..50_000u64).map(|i| 0.1 + (i % 10) as f64 / 100.0).sum::<f64>() / 10.0;
        assert!((p.recent_iter_time_s.unwrap() - recent).abs() < 1e-12);
        assert_eq!(rubick_launch::contract::iterations_in(&dir.path().join("metrics.jsonl")), 49_992);
        // A newer checkpoint in the tail wins; a short file is read whole.
        text.push_str("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":49999}\n");
        std::fs::write(dir.path().join("metrics.jsonl"), &text).unwrap();
        assert_eq!(progress(dir.path(), 100_000).checkpointed, Some(49_999));
        std::fs::write(dir.path().join("metrics.jsonl"), line(1, 0.5) + &line(2, 0.7)).unwrap();
        let p = progress_and_checkpoint(dir.path(), 100_000);
        assert_eq!((p.last, p.checkpointed), (Some(2), None));
        assert!((p.recent_iter_time_s.unwrap() - 0.6).abs() < 1e-12);
    }
}
