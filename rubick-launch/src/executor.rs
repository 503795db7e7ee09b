//! One executor for every run: where it executes is a backend behind one trait,
//! [`Executor`] — submit, poll, signal, recover — over typed values: a [`Handle`] per
//! backend, the [`RunSignal`], the run's [`RunState`].
//!
//! Both tools use it: `rubick-run` submits runs that outlive it (`detached`) and polls
//! them every round; `rubick-profile`'s blocking run is [`run_to_end`]: submit, then
//! poll until the run ended (stopping it once it measured enough, killing it at its
//! `timeoutS`), then [`collect`] what it did and [`classify`](crate::supervise::classify)
//! how it ended — the same rule for every backend.
//!
//! Backends: [`Local`] (this machine, each run under the run wrapper in a process group
//! of its own), [`crate::slurm::Slurm`] (one `sbatch` job per run, one launcher per
//! node); `rubick-run`'s Kubernetes backend implements the trait too.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::supervise::{Guard, LaunchError, RunOutcome, RunRequest, RunSignal, RunStatus, collect, io, prepare};

/// A run as its backend knows it. Written in a state file as text ([`Handle`]'s
/// `Display`), read back by the backend that made it ([`Executor::handle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handle {
    /// A local run: its wrapper's process group and its directory, whose
    /// `metrics.jsonl` path every process of the run carries in its environment (the
    /// mark: a process group id reused by another program is never taken for the run).
    /// No directory: an older state's plain group id.
    Local { pgid: u32, dir: Option<PathBuf> },
    /// A Slurm job id.
    Slurm { job: String },
    /// A Kubernetes run: its resources' name and the run's directory.
    Kubernetes { name: String, dir: PathBuf },
}

impl std::fmt::Display for Handle {
    /// `PGID@DIR` (or `PGID`), `JOBID`, `NAME@DIR`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Local { pgid, dir: Some(dir) } => write!(f, "{pgid}@{}", dir.display()),
            Handle::Local { pgid, dir: None } => write!(f, "{pgid}"),
            Handle::Slurm { job } => f.write_str(job),
            Handle::Kubernetes { name, dir } => write!(f, "{name}@{}", dir.display()),
        }
    }
}

impl Handle {
    /// What a person is shown: the process group, the job id, the resources' name.
    pub fn short(&self) -> String {
        match self {
            Handle::Local { pgid, .. } => pgid.to_string(),
            Handle::Slurm { job } => job.clone(),
            Handle::Kubernetes { name, .. } => name.clone(),
        }
    }

    /// A local handle's text (`PGID@DIR` or `PGID`).
    pub fn parse_local(text: &str) -> Option<Handle> {
        match text.split_once('@') {
            Some((pgid, dir)) => Some(Handle::Local { pgid: pgid.parse().ok()?, dir: Some(PathBuf::from(dir)) }),
            None => Some(Handle::Local { pgid: text.parse().ok()?, dir: None }),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct End {
    /// Its exit status (128 + the signal when a signal ended it), when known.
    pub code: Option<i32>,
    /// The backend's scheduler ended it to make room (Slurm's `PREEMPTED`, or
    /// `NODE_FAIL` without a requeue): the job waits again, no retry spent.
    pub preempted: bool,
    /// The scheduler's own time limit ended it (Slurm's `TIMEOUT`).
    pub timed_out: bool,
    /// What the scheduler says of an end that was not the run's own exit (appended to
    /// the run's log by [`run_to_end`]).
    pub note: Option<String>,
}

/// What one look at a run says ([`Executor::poll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Submitted and waiting for its resources (Slurm's `PENDING`, a requeued job).
    Waiting,
    /// Running.
    Running,
    /// Alive, but it cannot go on where it was placed: Slurm requeued it after one of
    /// the nodes it is pinned to failed, and it would wait until that node returns. Why.
    Stranded(String),
    /// Ended.
    Ended(End),
    /// The backend does not answer now (a controller restarting): why. Taken for alive
    /// (a run is never started twice).
    Unknown(String),
}

impl RunState {
    /// Whether the run may still hold resources (every state but `Ended`).
    pub fn alive(&self) -> bool {
        !matches!(self, RunState::Ended(_))
    }
}

/// One node of a run: its name (none: the backend's choice), the GPU indices, cores
/// and host memory it was given there.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSlot {
    pub name: String,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub host_memory_gib: f64,
}

/// A run to submit.
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    /// The contract's launch, context and log.
    pub request: RunRequest<'a>,
    /// The run's directory: its `metrics.jsonl` (the context's `metrics` must be that
    /// file: it marks the run's processes), pid and exit files, scripts.
    pub dir: PathBuf,
    /// Where it runs, in rank order; a backend that places runs itself (Slurm without
    /// node names it knows) ignores the names.
    pub nodes: Vec<NodeSlot>,
    /// Cores of this machine to pin a local run to; empty: not pinned.
    pub cores: Vec<u32>,
    /// A name the backend can find the run by again ([`Executor::recover`]), e.g.
    /// Slurm's job name.
    pub name: Option<String>,
    /// `true`: the run outlives this process and is requeued by a scheduler that
    /// preempts it (`rubick-run`); `false`: it is this process's (a profile run): it
    /// ends when this process dies, however it dies, and a scheduler bounds it by its
    /// `timeoutS`.
    pub detached: bool,
    /// Slurm's partition (none: the default one).
    pub partition: Option<String>,
}

impl Submission<'_> {
    /// The metrics file every process of the run carries in its environment.
    pub fn mark(&self) -> &str {
        &self.request.context.metrics
    }

    /// The run wrapper its launchers run under: the request's, else (a detached run: it
    /// must outlive this process and leave nothing behind) this executable's; none for
    /// a watched run of a caller that names none.
    pub fn wrapper(&self) -> Result<Option<Vec<String>>, LaunchError> {
        match (&self.request.wrapper, self.detached) {
            (Some(w), _) => Ok(Some(w.clone())),
            (None, true) => crate::wrap::command().map(Some).map_err(LaunchError::Contract),
            (None, false) => Ok(None),
        }
    }

    fn check_dir(&self) -> Result<(), LaunchError> {
        let expected = self.dir.join(METRICS_FILE);
        if Path::new(&self.request.context.metrics) != expected {
            return Err(LaunchError::Contract(format!(
                "a run's metrics file is its directory's {METRICS_FILE} ({}), not {}",
                expected.display(),
                self.request.context.metrics
            )));
        }
        Ok(())
    }
}

/// A run's metric lines, in its directory.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// A local run's process group id (its wrapper's pid), in its directory.
pub const PID_FILE: &str = "pgid";
/// A local run's exit status, in its directory, written as its last act.
pub const EXIT_FILE: &str = "exit-code";

/// A place runs execute.
pub trait Executor: std::fmt::Debug + Send + Sync {
    /// Its name (`local`, `slurm`, `kubernetes`).
    fn name(&self) -> &'static str;

    /// Starts a run; its handle.
    fn submit(&self, run: &Submission<'_>) -> Result<Handle, LaunchError>;

    /// One look at the run (one scheduler query): waiting, running, stranded, ended.
    /// `dir` is the run's directory and `nodes` the nodes it was placed on.
    fn poll(&self, handle: &Handle, dir: &Path, nodes: &[String]) -> RunState;

    /// Sends `signal` to every process of the run (on every node).
    fn signal(&self, handle: &Handle, signal: RunSignal);

    /// The run started in `dir` (under the [`Submission::name`] `name`), alive or ended,
    /// when its handle was never recorded (a crash between the start and the record).
    fn recover(&self, dir: &Path, name: Option<&str>) -> Option<Handle>;

    /// A handle this backend wrote (`Display`), read back.
    fn handle(&self, text: &str) -> Option<Handle>;

    /// The run is done with (ended and observed): what this process held for it (the
    /// watchdog of a run that is not detached) is let go.
    fn release(&self, _handle: &Handle) {}

    /// How often [`run_to_end`] looks at a run.
    fn poll_interval(&self) -> Duration {
        Duration::from_millis(20)
    }
}

/// Asks a run to stop (the contract's stop signal), waits up to `timeout` for it to
/// end, then kills what is left; `(seconds, exited cleanly)`. `signalled` runs between
/// the signal and the wait (rubick-run's crash tests kill it there).
pub fn stop(
    exec: &dyn Executor,
    handle: &Handle,
    dir: &Path,
    signal: rubick_core::launch::StopSignal,
    timeout: Duration,
    signalled: impl FnOnce(),
) -> (f64, bool) {
    let start = Instant::now();
    exec.signal(handle, RunSignal::Stop(signal));
    signalled();
    let clean = wait_ended(exec, handle, dir, timeout).is_some();
    if !clean {
        exec.signal(handle, RunSignal::Kill);
        wait_ended(exec, handle, dir, Duration::from_secs(10));
    }
    (start.elapsed().as_secs_f64(), clean)
}

/// Polls until the run ended (its end), or `None` after `limit`.
pub fn wait_ended(exec: &dyn Executor, handle: &Handle, dir: &Path, limit: Duration) -> Option<End> {
    let start = Instant::now();
    loop {
        if let RunState::Ended(end) = exec.poll(handle, dir, &[]) {
            return Some(end);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(exec.poll_interval().max(Duration::from_millis(50)));
    }
}

/// How long a run may wait for its resources, past its `timeoutS`, before
/// [`run_to_end`] gives up on it.
pub const PENDING_LIMIT: Duration = Duration::from_secs(3600);

/// How long a backend may not answer before [`run_to_end`] gives up (and kills the run).
const UNKNOWN_LIMIT: Duration = Duration::from_secs(60);

/// A blocking run: submits `run` (not detached), follows it to its end and reports what
/// it did. `stop_after_iterations` (its request's): the contract's stop signal once the
/// metrics hold that many iterations, a kill `stopTimeoutS` later, and the run counts as
/// complete; at `timeoutS` (counted from when it was seen running) `TERM`, then `KILL`.
/// `wall` counts from the moment it was seen running.
pub fn run_to_end(exec: &dyn Executor, run: &Submission<'_>) -> Result<RunOutcome, LaunchError> {
    let request = &run.request;
    let launch = request.launch;
    let handle = exec.submit(run)?;
    let submitted = Instant::now();
    tracing::debug!(backend = exec.name(), handle = %handle, "submitted");
    let timeout = rubick_core::launch::duration(launch.timeout_s);
    let (mut started, mut stopping, mut unknown_since): (Option<Instant>, Option<Instant>, Option<Instant>) =
        (None, None, None);
    let mut timed_out = false;
    let mut last_check = submitted;
    let metrics = Path::new(&request.context.metrics);
    let end = loop {
        match exec.poll(&handle, &run.dir, &[]) {
            RunState::Ended(end) => break end,
            RunState::Waiting => started = None,
            RunState::Running | RunState::Stranded(_) => {
                started.get_or_insert_with(Instant::now);
            }
            RunState::Unknown(why) => {
                if unknown_since.get_or_insert_with(Instant::now).elapsed() >= UNKNOWN_LIMIT {
                    exec.signal(&handle, RunSignal::Kill);
                    exec.release(&handle);
                    return Err(LaunchError::Backend(format!("{}: {why}", exec.name())));
                }
                std::thread::sleep(exec.poll_interval());
                continue;
            }
        }
        unknown_since = None;
        if let (Some(want), None) = (request.stop_after_iterations, stopping)
            && last_check.elapsed() >= Duration::from_millis(200)
        {
            last_check = Instant::now();
            if crate::supervise::iterations_in(metrics) >= want as usize {
                tracing::info!("{want} iterations measured: stopping the run ({})", launch.stop_signal.name());
                exec.signal(&handle, RunSignal::Stop(launch.stop_signal));
                stopping = Some(Instant::now());
            }
        }
        if let Some(since) = stopping
            && since.elapsed() >= rubick_core::launch::duration(launch.stop_timeout_s)
        {
            tracing::warn!("the run ignored its stop signal for {} s: killed", launch.stop_timeout_s);
            exec.signal(&handle, RunSignal::Kill);
            break wait_ended(exec, &handle, &run.dir, KILL_LIMIT).unwrap_or_default();
        }
        match started {
            Some(t) if t.elapsed() >= timeout => {
                timed_out = true;
                tracing::warn!(handle = %handle, "timeout: ending the run");
                // Ask, then make sure: every process of the run, on every node.
                exec.signal(&handle, RunSignal::Term);
                if let Some(end) = wait_ended(exec, &handle, &run.dir, Duration::from_millis(200)) {
                    break end;
                }
                exec.signal(&handle, RunSignal::Kill);
                break wait_ended(exec, &handle, &run.dir, KILL_LIMIT).unwrap_or_default();
            }
            None if submitted.elapsed() >= timeout + PENDING_LIMIT => {
                exec.signal(&handle, RunSignal::Kill);
                exec.release(&handle);
                return Err(LaunchError::Backend(format!(
                    "{}: run {handle} still waiting for its resources after {:.0} s: cancelled",
                    exec.name(),
                    submitted.elapsed().as_secs_f64()
                )));
            }
            _ => {}
        }
        std::thread::sleep(exec.poll_interval());
    };
    let wall = started.unwrap_or(submitted).elapsed();
    exec.release(&handle);
    tracing::debug!(handle = %handle, ?end, "ended");
    let note = if timed_out {
        Some(format!("rubick: {} run {handle} ran past timeoutS ({} s): ended", exec.name(), launch.timeout_s))
    } else {
        end.note.clone()
    };
    if let Some(note) = note {
        append(&request.log, &note);
    }
    let mut outcome = collect(metrics, &request.log, timed_out || end.timed_out, end.code, wall);
    // Stopped by us with its iterations measured: a complete run, whatever its exit.
    if stopping.is_some() && outcome.status == RunStatus::Failed {
        outcome.status = RunStatus::Ok;
    }
    Ok(outcome)
}

/// How long a killed run may take to be seen ended (a Slurm job's `KillWait` included).
const KILL_LIMIT: Duration = Duration::from_secs(90);

/// Appends a line to a run's log (a warning when it cannot).
pub fn append(path: &Path, line: &str) {
    use std::io::Write;
    let file = std::fs::OpenOptions::new().append(true).create(true).open(path);
    if let Err(e) = file.and_then(|mut f| writeln!(f, "{line}")) {
        tracing::warn!(path = %path.display(), error = %e, "cannot append to the log");
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

/// This machine: each run in a process group of its own, under the run wrapper
/// ([`crate::wrap`]: a child subreaper that records the group's id before the job
/// starts and the job's exit status after it ends, both atomically in the run's
/// directory, and ends whatever the job left behind), pinned (`taskset`) to its cores,
/// `CUDA_VISIBLE_DEVICES` from the context. A run is its marked processes (the wrapper,
/// the job, whatever they started in any session). Without a wrapper (a request that
/// names none, not detached) the group is watched by a `sh` watchdog and the exit
/// status is recorded by this process.
#[derive(Debug, Default)]
pub struct Local {
    watches: Watches,
    /// Runs this process started whose leader it has not reaped yet: alive, whatever
    /// `/proc` says (a child between its fork and its exec still carries this
    /// process's environment, not the run's mark).
    unreaped: std::sync::Arc<Mutex<std::collections::BTreeSet<u32>>>,
}

impl Local {
    pub fn new() -> Local {
        Local::default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `pid` is a live (not zombie) member of process group `pgid`.
fn in_group(pid: u32, pgid: u32) -> bool {
    crate::supervise::proc_stat(pid).is_some_and(|s| !s.zombie && s.pgrp == pgid)
}

/// Non-zombie processes of process group `pgid` (a scan of /proc).
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).filter(|pid| in_group(*pid, pgid)).collect()
}

fn mark_of(dir: &Path) -> String {
    dir.join(METRICS_FILE).display().to_string()
}

/// The exit status a wait reports: the code, or 128 + the signal.
fn status_code(status: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    status.code().or_else(|| status.signal().map(|s| 128 + s))
}

impl Executor for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn submit(&self, run: &Submission<'_>) -> Result<Handle, LaunchError> {
        run.check_dir()?;
        let request = &run.request;
        let dir = std::path::absolute(&run.dir).map_err(io(&run.dir))?;
        for stale in [PID_FILE, EXIT_FILE] {
            let _ = std::fs::remove_file(dir.join(stale));
        }
        let prepared = prepare(request)?;
        let log = std::fs::File::create(&request.log).map_err(io(&request.log))?;
        let log2 = log.try_clone().map_err(io(&request.log))?;
        let wrapper = run.wrapper()?;
        // Watched (not detached): the wrapper's stdin is a pipe only this process holds.
        let line = match &wrapper {
            Some(w) => crate::wrap::Wrap {
                pid_file: Some(dir.join(PID_FILE)),
                exit_file: Some(dir.join(EXIT_FILE)),
                watch_stdin: !run.detached,
                ..crate::wrap::Wrap::of(&prepared.argv)
            }
            .command_line(w),
            None => prepared.argv.clone(),
        };
        let pin = !run.cores.is_empty() && Command::new("taskset").arg("-V").output().is_ok_and(|o| o.status.success());
        let mut command = if pin {
            let cores: Vec<String> = run.cores.iter().map(ToString::to_string).collect();
            let mut c = Command::new("taskset");
            c.args(["-c", &cores.join(",")]).args(&line);
            c
        } else {
            let (program, args) = line.split_first().ok_or_else(|| LaunchError::Contract("command: empty".into()))?;
            let mut c = Command::new(program);
            c.args(args);
            c
        };
        let stdin = if wrapper.is_some() && !run.detached { Stdio::piped() } else { Stdio::null() };
        command.stdin(stdin).stdout(log).stderr(log2).process_group(0);
        if request.clear_env {
            command.env_clear();
            for keep in crate::supervise::KEPT_ENV {
                if let Some(v) = std::env::var_os(keep) {
                    command.env(keep, v);
                }
            }
        }
        command.envs(&prepared.env);
        if let Some(workdir) = &prepared.workdir {
            command.current_dir(workdir);
        }
        let program = command.get_program().to_string_lossy().into_owned();
        let mut child = command.spawn().map_err(|source| LaunchError::Spawn { program, source })?;
        let pgid = child.id();
        let watch = match (child.stdin.take(), &wrapper, run.detached) {
            (Some(pipe), ..) => Some(Watch::Pipe(pipe)),
            (None, None, false) => {
                // From here on, this process killed by anything takes the run with it.
                match Guard::run(pgid, run.mark()) {
                    Ok(guard) => Some(Watch::Guard(guard)),
                    Err(source) => {
                        crate::supervise::signal_run(Some(pgid), run.mark(), RunSignal::Kill);
                        let _ = child.wait();
                        return Err(LaunchError::Spawn { program: "sh (the watchdog)".into(), source });
                    }
                }
            }
            _ => None,
        };
        let handle = Handle::Local { pgid, dir: Some(dir.clone()) };
        if let Some(watch) = watch {
            self.watches.hold(&handle, watch);
        }
        let recorder = wrapper.is_none().then(|| dir.clone());
        if let Some(dir) = &recorder {
            let _ = crate::wrap::write_atomically(&dir.join(PID_FILE), &format!("{pgid}\n"));
        }
        lock(&self.unreaped).insert(pgid);
        let unreaped = std::sync::Arc::clone(&self.unreaped);
        // Reaped here while this process lives; by init once it has exited. Without a
        // wrapper, the exit status is recorded here.
        std::thread::spawn(move || {
            let status = child.wait();
            if let (Some(dir), Ok(status)) = (recorder, status) {
                let code = status_code(status).map_or_else(String::new, |c| c.to_string());
                let _ = crate::wrap::write_atomically(&dir.join(EXIT_FILE), &format!("{code}\n"));
            }
            lock(&unreaped).remove(&pgid);
        });
        Ok(handle)
    }

    fn poll(&self, handle: &Handle, dir: &Path, _nodes: &[String]) -> RunState {
        let Handle::Local { pgid, dir: own } = handle else {
            return RunState::Ended(End { note: Some(format!("{handle}: not a local run")), ..End::default() });
        };
        let dir = own.as_deref().unwrap_or(dir);
        // Its exit status is written as its last act: ended, even if the wrapper lingers.
        if let Ok(text) = std::fs::read_to_string(dir.join(EXIT_FILE)) {
            return RunState::Ended(End { code: text.trim().parse().ok(), ..End::default() });
        }
        let alive = match own {
            _ if lock(&self.unreaped).contains(pgid) => true,
            // The run is its marked processes; its wrapper, the group's leader, lives as
            // long as the job: one read; a scan of /proc only once the leader is gone.
            Some(own) => {
                let mark = mark_of(own);
                crate::supervise::carries_mark(*pgid, &mark) || !crate::supervise::marked_processes(&mark).is_empty()
            }
            // An older state's plain group id: its leader, else its members.
            None => in_group(*pgid, *pgid) || !group_members(*pgid).is_empty(),
        };
        if alive {
            return RunState::Running;
        }
        // Ended between the two reads: the file is there now.
        let code = std::fs::read_to_string(dir.join(EXIT_FILE)).ok().and_then(|t| t.trim().parse().ok());
        RunState::Ended(End { code, ..End::default() })
    }

    fn signal(&self, handle: &Handle, signal: RunSignal) {
        match handle {
            // Only the run's own (marked) processes: never whatever holds a reused id.
            Handle::Local { dir: Some(dir), .. } => crate::supervise::signal_run(None, &mark_of(dir), signal),
            Handle::Local { pgid, dir: None } => crate::supervise::signal_group(*pgid, signal),
            _ => {}
        }
    }

    fn recover(&self, dir: &Path, _name: Option<&str>) -> Option<Handle> {
        let pgid: u32 = std::fs::read_to_string(dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
        Some(Handle::Local { pgid, dir: Some(std::path::absolute(dir).ok()?) })
    }

    fn handle(&self, text: &str) -> Option<Handle> {
        Handle::parse_local(text)
    }

    fn release(&self, handle: &Handle) {
        // Whatever the launcher left behind goes with it, in its group or not: by the
        // run's mark only, since the reaped leader's group id may belong to another.
        if self.watches.release(handle)
            && let Handle::Local { dir: Some(dir), .. } = handle
        {
            crate::supervise::signal_run(None, &mark_of(dir), RunSignal::Kill);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_read_back_what_they_wrote() {
        let local = Handle::Local { pgid: 42, dir: Some(PathBuf::from("/s/jobs/a/attempt-1")) };
        assert_eq!(local.to_string(), "42@/s/jobs/a/attempt-1");
        assert_eq!(Local::new().handle(&local.to_string()), Some(local.clone()));
        assert_eq!(Local::new().handle("42"), Some(Handle::Local { pgid: 42, dir: None }));
        assert_eq!(Local::new().handle("x@/d"), None);
        assert_eq!(local.short(), "42");
        let slurm = Handle::Slurm { job: "17".into() };
        assert_eq!(crate::slurm::Slurm::new().handle(&slurm.to_string()), Some(slurm));
        assert_eq!(crate::slurm::Slurm::new().handle("17; rm -rf"), None);
    }

    /// A blocking run and a detached one (under no wrapper: the library's own test
    /// binary cannot be one), followed by polls: running, then ended with its code.
    #[test]
    fn a_local_run_is_polled_to_its_end_and_recovered_from_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let launch = crate::supervise::tests::launch("sleep 0.3; exit 5", 30.0);
        let request = crate::supervise::tests::request(dir.path(), &launch);
        let local = Local::new();
        let run = Submission {
            request,
            dir: dir.path().to_path_buf(),
            nodes: Vec::new(),
            cores: Vec::new(),
            name: None,
            detached: false,
            partition: None,
        };
        let handle = local.submit(&run).unwrap();
        assert_eq!(local.poll(&handle, dir.path(), &[]), RunState::Running);
        assert_eq!(local.recover(dir.path(), None), Some(handle.clone()));
        let end = wait_ended(&local, &handle, dir.path(), Duration::from_secs(10)).unwrap();
        assert_eq!(end.code, Some(5));
        local.release(&handle);
        // Its metrics file named otherwise than its directory's: refused.
        let mut odd = run.clone();
        odd.request.context.metrics = dir.path().join("m.jsonl").display().to_string();
        assert!(matches!(local.submit(&odd), Err(LaunchError::Contract(_))));
    }
}
