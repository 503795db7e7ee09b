//! The run wrapper: the process that runs a job's launcher on its node (rubick-run's
//! local runs; every node's launcher of a Slurm job), in Rust rather than shell text.
//!
//! Every tool that launches runs answers the hidden first argument [`SUBCOMMAND`] by
//! calling [`main`]; [`command`] is the argv prefix that starts it (this executable).
//!
//! What it does, and why:
//! * it becomes a **child subreaper** (`PR_SET_CHILD_SUBREAPER`), so that every process
//!   the run starts stays its descendant whatever it does: one that starts its own
//!   session (`setsid`, as torchrun, DeepSpeed and Accelerate start their workers) or
//!   daemonizes (a double fork) is re-parented to the wrapper, not to init, when its
//!   parent dies;
//! * it outlives the contract's stop signal and `TERM` (they are meant for the run,
//!   which receives them from its process group or from Slurm's `scancel --full`) and
//!   waits for the launcher;
//! * once the launcher ended, every descendant left is asked to end (`TERM`), and
//!   killed after `--grace` seconds: nothing a run started outlives it;
//! * with `--watch-stdin` it is also the run's watchdog: its standard input is a pipe
//!   only the supervising tool writes; end of file (the tool died, `kill -9` included)
//!   kills the launcher and every descendant at once (the launcher's own stdin is null);
//! * it records its own pid (`--pid-file`, before the launcher starts: the run's process
//!   group when started as a group's leader) and the launcher's exit status
//!   (`--exit-file`: the code, or 128 + the signal that killed it), each written
//!   atomically, and exits with that status.
//!
//! Signals go through `rustix` (typed, no `kill` subprocess); the wrapper is Linux's
//! (subreapers are a Linux feature).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use rubick_io::files::write_atomic;
use rustix::process::{Pid, WaitOptions};

use crate::proc::{RunSignal, descendants, descends_from, send_checked};

/// The hidden first argument that makes a tool the run wrapper.
pub const SUBCOMMAND: &str = "__rubick-run-wrapper";

/// The wrapper's first argument that makes it a watchdog instead: `--watchdog --
/// CLEANUP...` reads its standard input (a pipe only the supervising tool holds) to its
/// end, then runs the cleanup command (e.g. `scancel JOB`). The tool disarms it by
/// killing it first ([`crate::guard::Guard`]).
pub const WATCHDOG: &str = "--watchdog";

/// How long descendants left behind get between `TERM` and `KILL`, by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// What one wrapper runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Wrap {
    pub pid_file: Option<PathBuf>,
    pub exit_file: Option<PathBuf>,
    pub grace: Duration,
    /// Kill the run when standard input reaches end of file (the supervisor died).
    pub watch_stdin: bool,
    pub argv: Vec<OsString>,
}

impl Wrap {
    /// The wrapper's own arguments (after [`SUBCOMMAND`]):
    /// `[--pid-file P] [--exit-file P] [--grace S] -- ARGV...`.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Wrap, String> {
        let mut args = args.into_iter();
        let mut wrap =
            Wrap { pid_file: None, exit_file: None, grace: DEFAULT_GRACE, watch_stdin: false, argv: Vec::new() };
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.to_str() {
                Some("--pid-file") => wrap.pid_file = Some(value("--pid-file")?.into()),
                Some("--exit-file") => wrap.exit_file = Some(value("--exit-file")?.into()),
                Some("--grace") => {
                    let text = value("--grace")?;
                    let secs: f64 = text
                        .to_str()
                        .and_then(|t| t.parse().ok())
                        .filter(|s: &f64| s.is_finite() && (0.0..=rubick_core::launch::MAX_SECONDS).contains(s))
                        .ok_or_else(|| format!("--grace {text:?}: seconds, 0 to a week"))?;
                    wrap.grace = Duration::from_secs_f64(secs);
                }
                Some("--watch-stdin") => wrap.watch_stdin = true,
                Some("--") => {
                    wrap.argv = args.collect();
                    break;
                }
                _ => return Err(format!("unexpected argument {arg:?} (before `-- ARGV...`)")),
            }
        }
        if wrap.argv.is_empty() {
            return Err("no command to run (`-- ARGV...`)".into());
        }
        Ok(wrap)
    }

    /// A wrapper of `argv` with the defaults: no pid or exit file, the default grace,
    /// no watching of stdin.
    pub fn of(argv: &[String]) -> Wrap {
        Wrap {
            pid_file: None,
            exit_file: None,
            grace: DEFAULT_GRACE,
            watch_stdin: false,
            argv: argv.iter().map(Into::into).collect(),
        }
    }

    /// The whole command line that runs it: `wrapper` ([`command`]) then its arguments.
    pub fn command_line(&self, wrapper: &[String]) -> Vec<String> {
        let args = self.args().into_iter().map(|a| a.to_string_lossy().into_owned());
        wrapper.iter().cloned().chain(args).collect()
    }

    /// Its arguments, as [`Wrap::parse`] reads them.
    pub fn args(&self) -> Vec<OsString> {
        let mut out = Vec::new();
        if let Some(p) = &self.pid_file {
            out.extend(["--pid-file".into(), p.clone().into_os_string()]);
        }
        if let Some(p) = &self.exit_file {
            out.extend(["--exit-file".into(), p.clone().into_os_string()]);
        }
        if self.watch_stdin {
            out.push("--watch-stdin".into());
        }
        out.extend(["--grace".into(), format!("{}", self.grace.as_secs_f64()).into(), "--".into()]);
        out.extend(self.argv.iter().cloned());
        out
    }
}

/// The argv prefix that runs the wrapper: this executable and [`SUBCOMMAND`] (a tool
/// calls [`main`] for it); an error when this executable cannot be named.
pub fn command() -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the run wrapper: this executable's path: {e}"))?;
    let exe = exe.to_str().ok_or_else(|| format!("the run wrapper: {} is not UTF-8", exe.display()))?;
    Ok(vec![exe.to_owned(), SUBCOMMAND.to_owned()])
}

/// Runs the wrapper with its arguments (those after [`SUBCOMMAND`]); the exit status for
/// the process (2 for bad arguments, 127 when the command cannot be started).
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let mut args = args.into_iter().peekable();
    if args.peek().is_some_and(|a| a == WATCHDOG) {
        args.next();
        return match watchdog_cleanup(args) {
            Ok(cleanup) => watchdog(&cleanup),
            Err(e) => {
                eprintln!("rubick watchdog: {e}");
                2
            }
        };
    }
    let wrap = match Wrap::parse(args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("rubick run wrapper: {e}");
            return 2;
        }
    };
    match run(&wrap) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rubick run wrapper: {e}");
            127
        }
    }
}

/// The watchdog's cleanup command: its arguments after [`WATCHDOG`], `-- CLEANUP...`.
pub fn watchdog_cleanup(args: impl IntoIterator<Item = OsString>) -> Result<Vec<OsString>, String> {
    let mut args = args.into_iter();
    match args.next() {
        Some(dash) if dash == "--" => {}
        other => return Err(format!("expected `-- CLEANUP...`, found {other:?}")),
    }
    let cleanup: Vec<OsString> = args.collect();
    if cleanup.is_empty() {
        return Err("no cleanup command (`-- CLEANUP...`)".into());
    }
    Ok(cleanup)
}

/// The watchdog mode ([`WATCHDOG`]): waits for the end of standard input, then runs
/// `cleanup`; its exit status.
fn watchdog(cleanup: &[OsString]) -> i32 {
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    let Some((program, rest)) = cleanup.split_first() else { return 0 };
    Command::new(program)
        .args(rest)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_or(127, |s| s.code().unwrap_or(1))
}

/// See the module's documentation; the launcher's exit status.
pub fn run(wrap: &Wrap) -> std::io::Result<i32> {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!("rubick run wrapper: cannot become a child subreaper ({e}): processes that leave the run may escape");
    }
    // The stop signals and TERM are the run's: the wrapper outlives them.
    let noted = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGUSR1,
        signal_hook::consts::SIGUSR2,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGQUIT,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&noted))?;
    }
    if let Some(path) = &wrap.pid_file {
        write_atomic(path, format!("{}\n", std::process::id()).as_bytes()).map_err(std::io::Error::other)?;
    }
    // Held while the run is on, released before its exit status is written: a look at
    // the run is one lock attempt ([`alive_lock_held`]), no read of /proc.
    let alive = wrap.pid_file.as_deref().and_then(hold_alive_lock);
    if let Some(path) = &wrap.exit_file {
        // Best effort: without it the status is still written while the disk has room.
        let _ = std::fs::write(reserved(path), " ".repeat(RESERVED_EXIT_BYTES));
    }
    let (program, rest) = wrap.argv.split_first().ok_or_else(|| std::io::Error::other("no command"))?;
    let mut command = Command::new(program);
    command.args(rest);
    if wrap.watch_stdin {
        command.stdin(std::process::Stdio::null());
    }
    let child = command
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start {}: {e}", Path::new(program).display())));
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rubick run wrapper: {e}");
            drop(alive);
            if let Some(path) = &wrap.exit_file {
                write_exit(path, 127)?;
            }
            return Ok(127);
        }
    };
    let launcher = Pid::from_child(&child);
    if wrap.watch_stdin {
        // The watchdog: the supervisor holds the pipe's other end; its end of file
        // (however the supervisor ended) takes the run down at once.
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            let me = std::process::id();
            for pid in descendants(me) {
                send_checked(pid, RunSignal::Kill, |pid| descends_from(pid, me));
            }
        });
    }
    // Reaps every child (orphans re-parented here too) until the launcher ends.
    let code = loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid == launcher => {
                break status.exit_status().or_else(|| status.terminating_signal().map(|s| 128 + s)).unwrap_or(1);
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    end_descendants(wrap.grace);
    drop(alive);
    if let Some(path) = &wrap.exit_file {
        write_exit(path, code)?;
    }
    Ok(code)
}

/// The lock on the pid file the wrapper holds while its run is on (its launcher or
/// what it left behind): an exclusive `flock`, opened close-on-exec so that no process
/// of the run inherits it, released when the wrapper drops it or dies (`kill -9`
/// included). Best effort, and never a wait on a lock that does not come (a file
/// system whose locks hang): tried for a moment (a look holds it shared for
/// microseconds), else the run goes on without it and a look reads /proc instead.
fn hold_alive_lock(pid_file: &Path) -> Option<std::fs::File> {
    let file = std::fs::File::open(pid_file).ok()?;
    for _ in 0..100 {
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            Err(std::fs::TryLockError::Error(_)) => return None,
        }
    }
    None
}

/// Whether a run wrapper holds the lock on `pid_file` ([`hold_alive_lock`]): the run
/// it wraps is on and has not written its exit status. `false` also when the file
/// cannot be opened or locked for another reason (a wrapper of an older build locked
/// nothing): the caller then looks as it did without the lock.
pub fn alive_lock_held(pid_file: &Path) -> bool {
    std::fs::File::open(pid_file).is_ok_and(|f| matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock)))
}

/// Asks every descendant of this process to end (`TERM`), kills what is left after
/// `grace`, and reaps them.
fn end_descendants(grace: Duration) {
    let start = Instant::now();
    let mut termed = false;
    loop {
        let left = descendants(std::process::id());
        if left.is_empty() {
            break;
        }
        let signal = if start.elapsed() >= grace { RunSignal::Kill } else { RunSignal::Term };
        if signal == RunSignal::Kill || !termed {
            let me = std::process::id();
            for pid in left.iter().copied() {
                send_checked(pid, signal, |pid| descends_from(pid, me));
            }
            termed = true;
        }
        // Reap what ended; a moment for the rest.
        while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        std::thread::sleep(Duration::from_millis(20));
    }
    while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
}

/// Bytes reserved for the exit status (`--exit-file`) while the disk has room.
const RESERVED_EXIT_BYTES: usize = 32;

/// The exit file's reservation: written when the run starts, so that its status can be
/// recorded whatever the run does to the disk ([`write_exit`]).
fn reserved(path: &Path) -> PathBuf {
    path.with_extension("reserved")
}

/// Writes the launcher's exit status: atomically, else (a disk the run filled) into the
/// reservation made at the start, in place (no new block), renamed over the exit file.
fn write_exit(path: &Path, code: i32) -> std::io::Result<()> {
    let text = format!("{code}\n");
    let reservation = reserved(path);
    match write_atomic(path, text.as_bytes()) {
        Ok(()) => {
            let _ = std::fs::remove_file(&reservation);
            Ok(())
        }
        Err(e) => {
            use std::io::Write as _;
            let padded = format!("{text:<RESERVED_EXIT_BYTES$}");
            let mut file =
                std::fs::OpenOptions::new().write(true).open(&reservation).map_err(|_| std::io::Error::other(e))?;
            file.write_all(padded.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&reservation, path)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock a wrapper holds while its run is on is seen by a look, and gone once
    /// dropped (the wrapper about to write the exit status, or dead); a pid file no
    /// wrapper locked (an older build's) or none at all reads as not held.
    #[test]
    fn the_alive_lock_is_seen_while_held_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pgid");
        assert!(!alive_lock_held(&pid_file), "no file");
        std::fs::write(&pid_file, "42\n").unwrap();
        assert!(!alive_lock_held(&pid_file), "a file no wrapper locked");
        let held = hold_alive_lock(&pid_file).unwrap();
        assert!(alive_lock_held(&pid_file));
        assert!(alive_lock_held(&pid_file), "a look takes nothing away");
        drop(held);
        assert!(!alive_lock_held(&pid_file));
        // A lock that does not come is not waited for: the run goes on without it.
        let other = std::fs::File::open(&pid_file).unwrap();
        other.lock_shared().unwrap();
        assert!(hold_alive_lock(&pid_file).is_none());
        drop(other);
        assert!(hold_alive_lock(&pid_file).is_some());
    }

    #[test]
    fn arguments_round_trip_and_bad_ones_are_named() {
        let wrap = Wrap {
            pid_file: Some("/r/pgid".into()),
            exit_file: Some("/r/exit-code".into()),
            grace: Duration::from_millis(2500),
            watch_stdin: true,
            argv: vec!["python".into(), "--".into(), "train.py".into()],
        };
        assert_eq!(Wrap::parse(wrap.args()), Ok(wrap));
        let bad = |args: &[&str]| Wrap::parse(args.iter().map(OsString::from)).unwrap_err();
        assert!(bad(&["--grace", "-1", "--", "x"]).contains("--grace"), "{}", bad(&["--grace", "-1", "--", "x"]));
        assert!(bad(&["--grace", "1e300", "--", "x"]).contains("a week"));
        assert!(bad(&["--pid-file"]).contains("needs a value"));
        assert!(bad(&["--"]).contains("no command"));
        assert!(bad(&["python"]).contains("unexpected argument"));
        let dog = |args: &[&str]| watchdog_cleanup(args.iter().map(OsString::from));
        assert_eq!(dog(&["--", "scancel", "7"]), Ok(vec!["scancel".into(), "7".into()]));
        assert!(dog(&["--"]).unwrap_err().contains("no cleanup"));
        assert!(dog(&["scancel", "7"]).unwrap_err().contains("expected `--"));
    }
}
