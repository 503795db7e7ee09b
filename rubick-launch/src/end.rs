//! The end of a run: what its backend saw ([`Exit`]), and how it ended, classified
//! once for every tool and backend ([`RunStatus`], by [`classify`]). `rubick-profile`
//! records the status in its row; `rubick-run`'s lifecycle decides from it what the
//! job becomes.

use std::path::Path;
use std::time::Duration;

use rubick_core::launch::MetricLine;

/// What a backend saw when a run ended (the answer of one poll): its exit status, and
/// what its scheduler did to it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Exit {
    /// Its exit status (128 + the signal when a signal ended it), when known.
    pub code: Option<i32>,
    /// The backend's scheduler ended it to make room (Slurm's `PREEMPTED`, or
    /// `NODE_FAIL` without a requeue): the job waits again, no retry spent.
    pub preempted: bool,
    /// A time limit ended it (the scheduler's, Slurm's `TIMEOUT`; or `timeoutS`).
    pub timed_out: bool,
    /// What the scheduler says of an end that was not the run's own exit (appended to
    /// the run's log, where [`classify`] reads it).
    pub note: Option<String>,
}

/// How a run ended, classified by [`classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Exited 0.
    Ok,
    /// Out of GPU (or host) memory: the configuration is infeasible, not a crash.
    Oom,
    /// Exited 2, the contract's "bad plan": the script cannot run this configuration.
    Unsupported,
    /// Exited 126 or 127: its command could not be run (not executable, not found); no
    /// restart changes that.
    NotRunnable,
    /// Exited otherwise, was killed by a signal, or its end is unknown: a restart may
    /// succeed.
    Failed,
    /// Overran its time limit: its processes were killed.
    Timeout,
    /// Its backend's scheduler ended it to make room, or its node failed: not the
    /// run's fault.
    Preempted,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    /// Metric lines in order (iterations and events).
    pub metrics: Vec<MetricLine>,
    /// Lines of the metrics file (and stdout) that were not the protocol.
    pub ignored_lines: usize,
    pub wall: Duration,
    /// Why `status` is `Ok` though the run did not exit 0: the launcher stopped it once
    /// its iterations were measured ([`run_to_end`](crate::executor::run_to_end)'s
    /// `stop_after_iterations`) and its end (an exit in its teardown, or the kill after
    /// `stopTimeoutS`) came after the measurement. `None` where status and exit agree:
    /// they never disagree without saying why.
    pub counted_complete: Option<String>,
}

/// Messages by which frameworks report running out of memory.
const OOM_MARKERS: [&str; 5] =
    ["CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "std::bad_alloc", "Cannot allocate memory"];

/// What a finished run did, from its metrics file and its log: the metric lines (the
/// file's, then any the run printed), how many lines of the file were not the
/// protocol, and its status ([`classify`]).
pub fn collect(metrics: &Path, log: &Path, exit: &Exit, wall: Duration) -> RunOutcome {
    // The file's lines, then any the run printed (its log's other lines are its own).
    let (mut lines, ignored) = crate::metrics::parsed(metrics, None);
    lines.extend(crate::metrics::lines(log, None));
    let oom_event = lines.iter().any(|m| matches!(m, MetricLine::Event { event, .. } if event == "oom"));
    let status = classify(exit, oom_event, log);
    RunOutcome { status, exit_code: exit.code, metrics: lines, ignored_lines: ignored, wall, counted_complete: None }
}

/// How a run ended — the one rule, for `rubick-profile` and `rubick-run` alike, for
/// every backend: ended by its scheduler to make room; over its time limit; out of
/// memory (the contract's `oom` event, exit 3, or a framework's out-of-memory message
/// in its log); exit 0; exit 2 (the contract's bad plan); exit 126 or 127 (its command
/// could not be run); any other end.
pub fn classify(exit: &Exit, oom_event: bool, log: &Path) -> RunStatus {
    if exit.preempted {
        return RunStatus::Preempted;
    }
    if exit.timed_out {
        return RunStatus::Timeout;
    }
    if oom_event || exit.code == Some(3) || log_says_oom(log) {
        return RunStatus::Oom;
    }
    match exit.code {
        Some(0) => RunStatus::Ok,
        Some(2) => RunStatus::Unsupported,
        Some(126 | 127) => RunStatus::NotRunnable,
        _ => RunStatus::Failed,
    }
}

/// Whether a run's log holds a framework's out-of-memory message (its last 1 MiB: a
/// long log is not read whole).
pub fn log_says_oom(log: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(log) else { return false };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
    let mut tail = Vec::new();
    let _ = file.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    OOM_MARKERS.iter().any(|m| text.contains(m))
}
