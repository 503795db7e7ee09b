//! Watching a run that is not detached, so that it ends with the process that started
//! it: a [`Guard`] (a watchdog process that cleans up when its launcher dies, however
//! it dies) or the run wrapper's stdin pipe ([`Watch`]), held per run ([`Watches`]).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::executor::Handle;

/// A watchdog that runs a cleanup when the launcher dies, however it dies (`kill -9`
/// included): it waits for the end of a pipe only the launcher holds. Dropping it
/// without [`Guard::disarm`] fires the cleanup too. Started in a process group of its
/// own, so a Ctrl-C meant for the launcher does not take it down before it has cleaned up.
#[derive(Debug)]
pub struct Guard {
    child: std::process::Child,
}

impl Guard {
    /// Runs `cleanup` (e.g. `scancel JOB`) when the launcher dies: the run wrapper's
    /// `--watchdog` mode when a `wrapper` command is given ([`crate::wrap`], Rust), else
    /// (a library caller that has none) a `sh` reading its stdin.
    pub fn command(wrapper: Option<&[String]>, cleanup: &[&str]) -> std::io::Result<Guard> {
        let mut command = match wrapper {
            Some([program, rest @ ..]) => {
                let mut c = Command::new(program);
                c.args(rest).args([crate::wrap::WATCHDOG, "--"]);
                c
            }
            _ => {
                let mut c = Command::new("sh");
                c.args(["-c", r#"cat >/dev/null; exec "$@" >/dev/null 2>&1"#, "rubick-guard"]);
                c
            }
        };
        Guard::spawn(command.args(cleanup))
    }

    /// Kills a run without a wrapper (which would watch it itself) when the launcher
    /// dies: its process group `pgid` (while its leader carries the run's mark) and every
    /// process marked with its `metrics` path
    /// (see [`crate::proc::marked_processes`]); a `sh`.
    pub fn run(pgid: u32, metrics: &str) -> std::io::Result<Guard> {
        // The group only while its leader carries the run's mark (a group id alone may
        // have been reused); then every marked process, wherever it is.
        const CLEANUP: &str = r#"[ "$1" -gt 1 ] && tr '\000' '\n' < "/proc/$1/environ" 2>/dev/null | grep -qxF "RUBICK_METRICS=$2" && kill -s KILL -- "-$1"
for f in /proc/[0-9]*/environ; do
  if tr '\000' '\n' < "$f" 2>/dev/null | grep -qxF "RUBICK_METRICS=$2"; then
    p=${f#/proc/}; kill -s KILL "${p%/environ}"
  fi
done"#;
        Guard::command(None, &["sh", "-c", CLEANUP, "rubick-cleanup", &pgid.to_string(), metrics])
    }

    fn spawn(command: &mut Command) -> std::io::Result<Guard> {
        let child =
            command.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0).spawn()?;
        Ok(Guard { child })
    }

    /// The guarded work ended normally: stop the watchdog without its cleanup.
    pub fn disarm(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What watches a run that is not detached, so that it ends with this process.
#[derive(Debug)]
pub enum Watch {
    /// The run wrapper's stdin (`--watch-stdin`): end of file kills the run.
    Pipe(#[allow(dead_code)] std::process::ChildStdin),
    /// A watchdog process ([`Guard`]).
    Guard(Guard),
}

/// The watches an executor holds for the runs it submitted not detached, by handle; let
/// go when the run is released (a guard disarmed: its cleanup is for this process's
/// death, not for a run's normal end).
#[derive(Debug, Default)]
pub struct Watches(Mutex<BTreeMap<String, Watch>>);

impl Watches {
    /// Holds the watch of the run `handle` until [`Watches::release`].
    pub fn hold(&self, handle: &Handle, watch: Watch) {
        lock(&self.0).insert(handle.to_string(), watch);
    }

    /// Lets go of the run's watch; whether there was one.
    pub fn release(&self, handle: &Handle) -> bool {
        let watch = lock(&self.0).remove(&handle.to_string());
        match watch {
            Some(Watch::Guard(guard)) => guard.disarm(),
            Some(Watch::Pipe(_)) => {}
            None => return false,
        }
        true
    }
}

/// The mutex's value, also after a panic of another holder.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
