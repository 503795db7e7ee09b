//! The processes of a run, as the kernel knows them: signals (typed, each through one
//! checked function, [`send_checked`]), `/proc` (a process's state, parent and group;
//! descendants), and the run's mark.
//!
//! The mark: every process a run starts inherits the run's own `RUBICK_METRICS=PATH`
//! in its environment, so the run's processes are found by it, also those that left
//! its process group (torchrun's, DeepSpeed's and Accelerate's workers start sessions
//! of their own). A leaf: it names nothing else of this crate.

use std::path::Path;

/// A signal for a run's processes: the contract's stop signal, `TERM` (end now), or
/// `KILL`. Typed: sent through rustix ([`send_checked`]), never by a `kill` subprocess.
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

/// The one way a signal leaves this crate for another process: `pid` (never 0 or 1,
/// never this process) is opened as a pidfd first (a handle on that very process, so a
/// reused id cannot be mistaken for it afterwards), then `belongs(pid)` is asked (read
/// after the open: it sees the process the pidfd holds, or one that reused the id of a
/// process that has exited, which the pidfd's signal then cannot reach), and only then is
/// the signal sent, through the pidfd. Whether it was sent.
pub fn send_checked(pid: u32, signal: RunSignal, belongs: impl Fn(u32) -> bool) -> bool {
    if pid <= 1 || pid == std::process::id() {
        return false;
    }
    let Some(p) = pid_of(pid) else { return false };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => belongs(pid) && rustix::process::pidfd_send_signal(&fd, signal.raw()).is_ok(),
        // A kernel without pidfds (before 5.3): checked, then sent by id.
        Err(rustix::io::Errno::NOSYS) => belongs(pid) && rustix::process::kill_process(p, signal.raw()).is_ok(),
        Err(_) => false,
    }
}

/// Signals process `pid` only if it carries the run mark `metrics` at that moment (see
/// [`send_checked`]); whether it was sent.
pub fn signal_marked(pid: u32, metrics: &str, signal: RunSignal) -> bool {
    send_checked(pid, signal, |pid| carries_mark(pid, metrics))
}

/// Every live process of a run, found by the run's own `RUBICK_METRICS=PATH` in its
/// environment (every process a run starts inherits it): also those that started their
/// own session (torchrun's, DeepSpeed's and Accelerate's workers, a `setsid` grandchild),
/// which its process group does not hold. A scan of /proc (this user's processes). A
/// mark names the run by the path it was started through; the same file through
/// another path (a symlink, `..`) is the same run ([`Mark`]).
pub fn marked_processes(metrics: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    let mark = Mark::new(metrics);
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && mark.carried_by(pid))
        .collect()
}

/// Every live process (but this one) whose run mark (`RUBICK_METRICS=PATH`, see
/// [`marked_processes`]) lies under the directory `prefix` (canonical, ending in `/`),
/// with its mark made canonical: the runs of a state directory, recorded or not, also
/// those started through another path to it. A scan of /proc.
pub fn marked_under(prefix: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    // No `stat` first: a zombie's environment cannot be read (ESRCH), so it carries no
    // mark, and one read a process is half the cost of a scan (apply's no-op round).
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let mark = mark_of(pid)?;
            if mark.starts_with(prefix) {
                return Some((pid, mark));
            }
            let canonical = canonical_mark(&mark)?;
            canonical.starts_with(prefix).then_some((pid, canonical))
        })
        .collect()
}

/// A file of `/proc`, read whole: into a buffer of 16 KiB first, so that the usual
/// environment or `stat` comes in one read (`/proc` tells no size, and a plain
/// `std::fs::read` grows from 32 bytes: eight reads for an environment of 2 KiB, on
/// every look at every run).
fn read_proc(path: &str) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::with_capacity(16 * 1024);
    std::fs::File::open(path).ok()?.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The run mark process `pid` carries (`RUBICK_METRICS`), if it lives and has one.
fn mark_of(pid: u32) -> Option<String> {
    let env = read_proc(&format!("/proc/{pid}/environ"))?;
    let mark = env.split(|b| *b == 0).find_map(|v| v.strip_prefix(b"RUBICK_METRICS="))?;
    std::str::from_utf8(mark).ok().map(str::to_owned)
}

/// A mark's path with its directory resolved (symlinks, `.` and `..`), if that exists.
fn canonical_mark(mark: &str) -> Option<String> {
    let path = std::path::Path::new(mark);
    let dir = path.parent()?.canonicalize().ok()?;
    Some(dir.join(path.file_name()?).to_str()?.to_owned())
}

/// A run's mark as searched for: its text, and its canonical form (resolved once, when
/// first needed) for processes started through another path to the same run directory.
struct Mark<'a> {
    text: &'a str,
    canonical: std::cell::OnceCell<Option<String>>,
}

impl<'a> Mark<'a> {
    fn new(text: &'a str) -> Mark<'a> {
        Mark { text, canonical: std::cell::OnceCell::new() }
    }

    /// Whether process `pid` lives (not a zombie: its environment cannot be read) and
    /// carries this mark, through whichever path.
    fn carried_by(&self, pid: u32) -> bool {
        let Some(found) = mark_of(pid) else { return false };
        if found == self.text {
            return true;
        }
        if Path::new(&found).file_name() != Path::new(self.text).file_name() {
            return false;
        }
        let canonical = self.canonical.get_or_init(|| canonical_mark(self.text));
        canonical.is_some() && canonical_mark(&found) == *canonical
    }
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
    let stat = String::from_utf8(read_proc(&format!("/proc/{pid}/stat"))?).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let zombie = fields.next()? == "Z";
    Some(ProcStat { zombie, ppid: fields.next()?.parse().ok()?, pgrp: fields.next()?.parse().ok()? })
}

/// Whether process `pid` lives (not a zombie) and carries the mark of the run whose
/// metrics file is `metrics`, through whichever path (see [`marked_processes`]): one
/// process, no scan.
pub fn carries_mark(pid: u32, metrics: &str) -> bool {
    Mark::new(metrics).carried_by(pid)
}

/// Signals every process of a run: those that carry its mark `metrics` (see
/// [`marked_processes`]), each checked at the moment of signalling ([`signal_marked`]).
/// Never a process group: a group id outlives nothing it can be trusted with.
///
/// A `KILL` also reaches their descendants, first: what the run wrapper (a child
/// subreaper, marked) holds that carries no mark (a helper started with `env -i` in a
/// session of its own) would otherwise be re-parented to init once the wrapper dies,
/// and outlive the run. Each is checked, when signalled, to be still the child of one
/// of the run's processes.
pub fn signal_run(metrics: &str, signal: RunSignal) {
    let marked = marked_processes(metrics);
    if matches!(signal, RunSignal::Kill) {
        let unmarked = descendants_of(&marked);
        let family: std::collections::BTreeSet<u32> = marked.iter().chain(&unmarked).copied().collect();
        for pid in unmarked {
            send_checked(pid, signal, |pid| proc_stat(pid).is_some_and(|s| !s.zombie && family.contains(&s.ppid)));
        }
    }
    for pid in marked {
        signal_marked(pid, metrics, signal);
    }
}

/// Whether `pid` is a live (not zombie) descendant of `root`, by its chain of parents
/// as `/proc` says now (the check [`send_checked`] makes for a process found by ancestry).
pub fn descends_from(pid: u32, root: u32) -> bool {
    let mut at = pid;
    // A chain of parents is finite; the bound only guards against a /proc that lies.
    for _ in 0..4096 {
        match proc_stat(at) {
            Some(s) if !s.zombie || at != pid => {
                if s.ppid == root {
                    return true;
                }
                if s.ppid <= 1 {
                    return false;
                }
                at = s.ppid;
            }
            _ => return false,
        }
    }
    false
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
