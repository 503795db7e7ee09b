//! The one reader of a run's metric lines (`metrics.jsonl`, the contract's
//! [`MetricLine`]s): the whole file as a stream ([`lines`], [`iterations_in`]), what
//! its tail says of the run ([`progress`], and at its end [`at_end`]: its last
//! checkpoint and an `oom` event too), and where it began ([`first_iteration`]).
//!
//! Every round asks this of every running job, and a job that has run for a week wrote
//! a hundred thousand lines: a tail is read backwards, a few kilobytes first, and
//! memory is bounded whatever the file holds: a line over [`MAX_METRIC_LINE_BYTES`] (a
//! runaway print into the file) or not UTF-8 is skipped, never held. A line naming an
//! iteration beyond the job's (`"iter": 2^64-1`) is not the run's progress: ignored,
//! with a warning naming the file once per read.

use std::io::{BufRead as _, Read as _};
use std::path::Path;

use rubick_core::launch::{MetricLine, mean_sd};

/// The longest line a metrics reader takes: a protocol line is a few hundred bytes; a
/// longer one is skipped, never held in memory.
pub const MAX_METRIC_LINE_BYTES: usize = 16 * 1024;

/// How far back from its end a metrics file is read for its last iterations and an
/// `oom` event: whatever the file holds (a week of lines, or one line of 100 MB).
pub const TAIL_BYTES: u64 = 1024 * 1024;

/// How far back the end of a run looks for its last checkpoint event.
pub const CHECKPOINT_SCAN_BYTES: u64 = 16 * 1024 * 1024;

/// How many of the last iterations [`Progress::recent_iter_time_s`] averages.
pub const RECENT: usize = 10;

/// What a run's metric lines say so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// The last iteration's number.
    pub last: Option<u64>,
    /// Mean time of the last [`RECENT`] iterations.
    pub recent_iter_time_s: Option<f64>,
    /// The iteration of its last checkpoint (looked for as far as the read went: the
    /// tail's last iterations for [`progress`], [`CHECKPOINT_SCAN_BYTES`] for
    /// [`at_end`]).
    pub checkpointed: Option<u64>,
    /// How long that checkpoint's save took, when the run said (`save_s`).
    pub checkpoint_save_s: Option<f64>,
    /// The last iteration's loss, when the run said: NaN or an infinity when the job
    /// diverges.
    pub loss: Option<f64>,
    /// An `oom` event within the file's last [`TAIL_BYTES`] (looked for by [`at_end`]
    /// only).
    pub oom: bool,
}

/// Calls `visit` on the lines of the last `limit` bytes of the file at `path`, the last
/// line first, with how far from the file's end each starts, until it returns false. Memory is bounded: the file is read backwards
/// in blocks (the first of 4 KiB: a round's question is answered by the last few
/// lines; then larger, up to 64 KiB); a line over [`MAX_METRIC_LINE_BYTES`], a line
/// that is not UTF-8, and the line cut by the limit are skipped.
pub fn lines_backwards(path: &Path, limit: u64, mut visit: impl FnMut(&str, u64) -> bool) {
    const FIRST: usize = 4 * 1024;
    const BLOCK: usize = 64 * 1024;
    use std::os::unix::fs::FileExt as _;
    let Ok(file) = std::fs::File::open(path) else { return };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return };
    let floor = len.saturating_sub(limit);
    let mut pos = len;
    // The end of the line being read (its bytes after the current block); `None` once
    // it grew over the limit (skipped up to its start).
    let mut pending: Option<Vec<u8>> = Some(Vec::new());
    let mut block = vec![0u8; FIRST];
    let mut emit = |at: u64, head: &[u8], tail: Option<Vec<u8>>| -> bool {
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
        line.is_none_or(|l| visit(&l, len - at))
    };
    while pos > floor {
        let start = pos.saturating_sub(block.len() as u64).max(floor);
        let n = (pos - start) as usize;
        if file.read_exact_at(&mut block[..n], start).is_err() {
            return;
        }
        pos = start;
        let chunk = &block[..n];
        let mut end = n;
        while let Some(i) = chunk[..end].iter().rposition(|&b| b == b'\n') {
            if !emit(start + i as u64 + 1, &chunk[i + 1..end], pending.take()) {
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
        if block.len() < BLOCK {
            block.resize(BLOCK, 0);
        }
    }
    // At the file's start the first line is whole; at the limit it is cut.
    if floor == 0 {
        emit(0, &[], pending);
    }
}

/// Calls `visit` on every line of the file at `path`, first to last, read as a stream:
/// `Some(line)`, or `None` for a line skipped (over [`MAX_METRIC_LINE_BYTES`], or not
/// UTF-8), which is never held in memory. A missing file has no lines.
pub fn lines_forward(path: &Path, mut visit: impl FnMut(Option<&str>)) {
    let Ok(file) = std::fs::File::open(path) else { return };
    let mut reader = std::io::BufReader::new(file);
    let (mut line, mut overlong) = (Vec::new(), false);
    let mut emit = |line: &[u8], overlong: bool| visit(if overlong { None } else { std::str::from_utf8(line).ok() });
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
            emit(&line, overlong);
            line.clear();
            overlong = false;
        }
    }
    if overlong || !line.is_empty() {
        emit(&line, overlong);
    }
}

/// The metric lines of the whole file at `path`, in order, within the job's
/// `iterations` (`None`: any).
pub fn lines(path: &Path, iterations: Option<u64>) -> Vec<MetricLine> {
    parsed(path, iterations).0
}

/// [`lines`], and how many lines of the file were not the protocol (or were skipped).
pub fn parsed(path: &Path, iterations: Option<u64>) -> (Vec<MetricLine>, usize) {
    let (mut out, mut ignored, mut warned) = (Vec::new(), 0, false);
    lines_forward(path, |line| match line.and_then(MetricLine::parse) {
        Some(m) => out.extend(within(m, iterations, path, &mut warned)),
        None => ignored += 1,
    });
    (out, ignored)
}

/// Iteration lines the metrics file at `path` holds so far (the whole file read).
pub fn iterations_in(path: &Path) -> usize {
    let mut n = 0;
    lines_forward(path, |line| {
        n += usize::from(matches!(line.and_then(MetricLine::parse), Some(MetricLine::Iteration { .. })));
    });
    n
}

/// A metric line whose iteration is within the job's `iterations` (a line naming
/// another is `None`, with a warning naming the file once per read through `warned`).
fn in_range(line: &str, iterations: Option<u64>, path: &Path, warned: &mut bool) -> Option<MetricLine> {
    within(MetricLine::parse(line)?, iterations, path, warned)
}

/// The metric line `m` if its iteration is within the job's `iterations` (see
/// [`in_range`]).
fn within(m: MetricLine, iterations: Option<u64>, path: &Path, warned: &mut bool) -> Option<MetricLine> {
    let iter = match &m {
        MetricLine::Iteration { iter, .. } => Some(*iter),
        MetricLine::Event { iter, .. } => *iter,
    };
    match (iter, iterations) {
        (Some(i), Some(bound)) if i > bound => {
            if !std::mem::replace(warned, true) {
                tracing::warn!(
                    "{}: a metric line names iteration {i}, beyond the job's {bound} iterations: ignored",
                    path.display()
                );
            }
            None
        }
        _ => Some(m),
    }
}

/// What the metrics file at `path` says so far, for a job of `iterations` iterations:
/// its last [`RECENT`] iterations (within its last [`TAIL_BYTES`]) and a checkpoint
/// among them: one read of its tail, backwards, usually of one block.
pub fn progress(path: &Path, iterations: u64) -> Progress {
    read_progress(path, iterations, RECENT, false)
}

/// [`progress`] as far as its last iteration only (its number and loss;
/// `recent_iter_time_s` is that iteration's time): what a round records of every run,
/// one line parsed rather than ten.
pub fn last(path: &Path, iterations: u64) -> Progress {
    read_progress(path, iterations, 1, false)
}

/// [`progress`] of a run that ended or stopped, in the same one backward read: its
/// last checkpoint even when older than the tail (within [`CHECKPOINT_SCAN_BYTES`]),
/// and whether an `oom` event is within its last [`TAIL_BYTES`].
pub fn at_end(path: &Path, iterations: u64) -> Progress {
    read_progress(path, iterations, RECENT, true)
}

/// The tail read backwards: the last `recent` iterations, a checkpoint among them (at
/// the `end`: within [`CHECKPOINT_SCAN_BYTES`]), and at the `end` an `oom` event.
fn read_progress(path: &Path, iterations: u64, recent: usize, end: bool) -> Progress {
    let (mut times, mut p, mut warned) = (Vec::new(), Progress::default(), false);
    let limit = if end { CHECKPOINT_SCAN_BYTES } else { TAIL_BYTES };
    lines_backwards(path, limit, |line, back| {
        let enough = times.len() >= recent;
        let oom_settled = !end || p.oom || back > TAIL_BYTES;
        if enough && (!end || p.checkpointed.is_some()) && oom_settled {
            return false;
        }
        if end && !p.oom && back <= TAIL_BYTES && line.contains("oom") {
            p.oom = matches!(MetricLine::parse(line), Some(MetricLine::Event { event, .. }) if event == "oom");
        }
        if enough && !line.contains("checkpointed") {
            return true;
        }
        match in_range(line, Some(iterations), path, &mut warned) {
            Some(MetricLine::Iteration { iter, iter_time_s, loss, .. }) if !enough => {
                if p.last.is_none() {
                    (p.last, p.loss) = (Some(iter), loss);
                }
                times.push(iter_time_s);
            }
            Some(MetricLine::Event { event, iter: Some(i), save_s, .. })
                if event == "checkpointed" && p.checkpointed.is_none() =>
            {
                p.checkpointed = Some(i);
                p.checkpoint_save_s = save_s.filter(|s| s.is_finite() && *s >= 0.0);
            }
            _ => {}
        }
        true
    });
    times.reverse();
    p.recent_iter_time_s = mean_sd(&times).map(|(mean, _)| mean);
    p
}

/// The first iteration the metrics file at `path` names (read from its first 64 KiB,
/// within the job's `iterations`).
pub fn first_iteration(path: &Path, iterations: u64) -> Option<u64> {
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(64 * 1024).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut warned = false;
    text.lines().find_map(|l| match in_range(l, Some(iterations), path, &mut warned)? {
        MetricLine::Iteration { iter, .. } => Some(iter),
        _ => None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
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
        lines_backwards(&path, u64::MAX, |l, _| {
            seen.push(l.len());
            true
        });
        assert_eq!(seen.len(), 6, "five short lines and the first; the long one skipped: {seen:?}");
        let p = at_end(&path, 100);
        assert_eq!((p.last, p.checkpointed, p.oom), (Some(3), Some(2), false));
        assert!((p.recent_iter_time_s.unwrap() - 0.35).abs() < 1e-12, "{p:?}");
        assert_eq!(progress(&path, 100).last, Some(3));
        assert_eq!(last(&path, 100).last, Some(3));
        assert_eq!(last(&path, 100).recent_iter_time_s, Some(0.4), "the last iteration's own time");
        assert_eq!(first_iteration(&path, 100), Some(1));
        assert_eq!(progress(&path, 2).last, Some(2), "iteration 3 is beyond a job of 2");
        assert_eq!(lines(&path, Some(100)).len(), 4);
        let mut skipped = 0;
        lines_forward(&path, |l| skipped += usize::from(l.is_none()));
        assert_eq!(skipped, 1, "the long line is skipped, and said to be");
        assert_eq!(iterations_in(&path), 4, "every iteration line, whatever its number");
    }

    /// A week-long run's file: the tail answers, as the whole file would.
    #[test]
    fn a_long_metrics_file_reads_its_tail_and_finds_an_old_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut text = String::from("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":7}\n");
        for i in 8..50_000u64 {
            text.push_str(&line(i, 0.1 + (i % 10) as f64 / 100.0));
        }
        text.push_str("not json\n");
        std::fs::write(&path, &text).unwrap();
        let p = at_end(&path, 100_000);
        assert_eq!(p.last, Some(49_999));
        assert_eq!(p.checkpointed, Some(7), "an event older than the tail is found");
        let recent: f64 = (49_990..50_000u64).map(|i| 0.1 + (i % 10) as f64 / 100.0).sum::<f64>() / 10.0;
        assert!((p.recent_iter_time_s.unwrap() - recent).abs() < 1e-12);
        assert_eq!(iterations_in(&path), 49_992);
        assert_eq!(progress(&path, 100_000).checkpointed, None, "not looked for beyond the tail's iterations");
        // A newer checkpoint in the tail wins; a short file is read whole.
        text.push_str("{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":49999}\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(progress(&path, 100_000).checkpointed, Some(49_999));
        std::fs::write(&path, line(1, 0.5) + &line(2, 0.7)).unwrap();
        let p = at_end(&path, 100_000);
        assert_eq!((p.last, p.checkpointed), (Some(2), None));
        assert!((p.recent_iter_time_s.unwrap() - 0.6).abs() < 1e-12);
    }

    /// An `oom` event is seen by the end's one read when it is within the last MiB,
    /// after the last iterations or among them, and not when it is older.
    #[test]
    fn the_end_read_finds_an_oom_event_within_the_tail_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let oom = "{\"rubick\":1,\"event\":\"oom\"}\n";
        let mut text: String = (1..=20u64).map(|i| line(i, 0.1)).collect();
        text.push_str(oom);
        std::fs::write(&path, &text).unwrap();
        assert!(at_end(&path, 100).oom);
        assert!(!progress(&path, 100).oom, "only the end looks for it");
        let mut early = String::from(oom);
        early.push_str(&text[..text.len() - oom.len()]);
        std::fs::write(&path, &early).unwrap();
        assert!(at_end(&path, 100).oom, "before the last iterations, within the tail");
        let filler = line(5, 0.1);
        let mut old = String::from(oom);
        while old.len() < TAIL_BYTES as usize + 4096 {
            old.push_str(&filler);
        }
        std::fs::write(&path, &old).unwrap();
        assert!(!at_end(&path, 100).oom, "older than the last MiB");
    }
}
