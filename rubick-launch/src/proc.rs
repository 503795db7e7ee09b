//! The processes of a run, as the kernel knows them: signals (typed, through `kill(2)`),
//! `/proc` (a process's state, parent and group; descendants), and the run's mark.
//!
//! The mark: every process a run starts inherits the run's own `RUBICK_METRICS=PATH`
//! in its environment, so the run's processes are found by it, also those that left
//! its process group (torchrun's, DeepSpeed's and Accelerate's workers start sessions
//! of their own). A leaf: it names nothing else of this crate.

/// A signal for a run's processes: the contract's stop signal, `TERM` (end now), or
/// `KILL`. Typed: sent with `kill(2)` through rustix, never by a `kill` subprocess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSignal {
    Stop(rubick_core::launch::StopSignal),
    Term,
    Kill,
}

impl RunSignal {
    /// Its name without `SIG` (as `scancel --signal` takes it), e.g. `USR1`.
    pub fn name(self) -> &'static str {
        match self {
            RunSignal::Stop(s) => s.name().trim_start_matches("SIG"),
            RunSignal::Term => "TERM",
            RunSignal::Kill => "KILL",
        }
    }

    fn raw(self) -> rustix::process::Signal {
        use rubick_core::launch::StopSignal;
        use rustix::process::Signal;
        match self {
            RunSignal::Stop(StopSignal::Usr1) => Signal::USR1,
            RunSignal::Stop(StopSignal::Usr2) => Signal::USR2,
            RunSignal::Stop(StopSignal::Term) | RunSignal::Term => Signal::TERM,
            RunSignal::Stop(StopSignal::Int) => Signal::INT,
            RunSignal::Kill => Signal::KILL,
        }
    }
}

/// A process id as rustix takes it (`None` for 0 or one out of range).
pub(crate) fn pid_of(pid: u32) -> Option<rustix::process::Pid> {
    i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw)
}

/// Signals a whole process group.
pub fn signal_group(pgid: u32, signal: RunSignal) {
    if let Some(pgid) = pid_of(pgid) {
        let _ = rustix::process::kill_process_group(pgid, signal.raw());
    }
}

/// Every live process of a run, found by the run's own `RUBICK_METRICS=PATH` in its
/// environment (every process a run starts inherits it): also those that started their
/// own session (torchrun's, DeepSpeed's and Accelerate's workers, a `setsid` grandchild),
/// which its process group does not hold. A scan of /proc (this user's processes).
pub fn marked_processes(metrics: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && carries_mark(pid, metrics))
        .collect()
}

/// Every live process (but this one) whose run mark (`RUBICK_METRICS=PATH`, see
/// [`marked_processes`]) lies under `prefix`, with its mark: the runs of a state
/// directory, recorded or not. A scan of /proc.
pub fn marked_under(prefix: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    let key = format!("RUBICK_METRICS={prefix}");
    // No `stat` first: a zombie's environment cannot be read (ESRCH), so it carries no
    // mark, and one read a process is half the cost of a scan (apply's no-op round).
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let mark = env.split(|b| *b == 0).find(|v| v.starts_with(key.as_bytes()))?;
            let mark = std::str::from_utf8(mark).ok()?.strip_prefix("RUBICK_METRICS=")?.to_owned();
            Some((pid, mark))
        })
        .collect()
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// A zombie (exited, not yet reaped): no longer a live process of anything.
    pub zombie: bool,
    pub ppid: u32,
    pub pgrp: u32,
}

/// `/proc/PID/stat` of a process, if it exists (`pid (comm) state ppid pgrp ...`: the
/// command name may hold spaces and parentheses, so fields count from its last `)`).
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let zombie = fields.next()? == "Z";
    Some(ProcStat { zombie, ppid: fields.next()?.parse().ok()?, pgrp: fields.next()?.parse().ok()? })
}

/// Whether process `pid` lives (not a zombie) and carries the mark of the run whose
/// metrics file is `metrics` (see [`marked_processes`]): one process, no scan.
pub fn carries_mark(pid: u32, metrics: &str) -> bool {
    // A zombie's environment cannot be read (ESRCH): it carries no mark.
    let marker = format!("RUBICK_METRICS={metrics}");
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
}

/// Signals every process of a run: its process group and [`marked_processes`].
///
/// A `KILL` also reaches their descendants, first: what the run wrapper (a child
/// subreaper, marked) holds that carries no mark (a helper started with `env -i` in a
/// session of its own) would otherwise be re-parented to init once the wrapper dies,
/// and outlive the run.
pub fn signal_run(pgid: Option<u32>, metrics: &str, signal: RunSignal) {
    let marked = marked_processes(metrics);
    if matches!(signal, RunSignal::Kill) {
        // Of the marked processes only: a group id may have been reused.
        for pid in descendants_of(&marked).into_iter().filter_map(pid_of) {
            let _ = rustix::process::kill_process(pid, signal.raw());
        }
    }
    if let Some(pgid) = pgid {
        signal_group(pgid, signal);
    }
    for pid in marked.into_iter().filter_map(pid_of) {
        let _ = rustix::process::kill_process(pid, signal.raw());
    }
}

/// Live (not zombie) processes whose ancestry leads to `root`, from `/proc`.
pub fn descendants(root: u32) -> Vec<u32> {
    descendants_of(&[root])
}

/// Live (not zombie) processes whose ancestry leads to any of `roots` (the roots
/// themselves not included unless one descends from another), from one read of `/proc`.
pub fn descendants_of(roots: &[u32]) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let procs: Vec<(u32, u32)> = dir
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = proc_stat(pid).filter(|s| !s.zombie)?;
            Some((pid, stat.ppid))
        })
        .collect();
    let mut found: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    let mut frontier = roots.to_vec();
    while let Some(parent) = frontier.pop() {
        for &(pid, _) in procs.iter().filter(|(_, ppid)| *ppid == parent) {
            if found.insert(pid) {
                frontier.push(pid);
            }
        }
    }
    found.into_iter().collect()
}

/// Whether `pid` is a live (not zombie) member of process group `pgid`.
pub fn in_group(pid: u32, pgid: u32) -> bool {
    proc_stat(pid).is_some_and(|s| !s.zombie && s.pgrp == pgid)
}

/// Non-zombie processes of process group `pgid` (a scan of /proc).
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).filter(|pid| in_group(*pid, pgid)).collect()
}

/// The exit status a wait reports: the code, or 128 + the signal.
pub fn status_code(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    status.code().or_else(|| status.signal().map(|s| 128 + s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process carries its run's mark while it lives; once it exited, unreaped (a
    /// zombie), it carries none: no `stat` needed to tell.
    #[test]
    fn a_zombie_carries_no_mark() {
        let mark = format!("/nonexistent/rubick-proc-test-{}/metrics.jsonl", std::process::id());
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read _"])
            .env("RUBICK_METRICS", &mark)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("sh starts");
        let pid = child.id();
        // Until its exec, the child has this process's environment: wait for the mark.
        let start = std::time::Instant::now();
        while !carries_mark(pid, &mark) {
            assert!(start.elapsed().as_secs() < 10, "a live marked process");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!carries_mark(pid, "/elsewhere/metrics.jsonl"), "another run's mark");
        assert_eq!(marked_under(mark.trim_end_matches("metrics.jsonl")), vec![(pid, mark.clone())]);
        drop(child.stdin.take());
        let start = std::time::Instant::now();
        while !proc_stat(pid).is_some_and(|s| s.zombie) {
            assert!(start.elapsed().as_secs() < 10, "the child did not exit");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!carries_mark(pid, &mark), "a zombie");
        assert!(marked_under(mark.trim_end_matches("metrics.jsonl")).is_empty());
        child.wait().expect("reaped");
    }
}
