//! One executor for every run: where it executes is a backend behind one trait,
//! [`Executor`] — submit, poll, signal, recover — over typed values: a [`Handle`] per
//! backend, the [`RunSignal`], the run's [`RunState`].
//!
//! Both tools use it: `rubick-run` submits runs that outlive it (`detached`) and polls
//! them every round; `rubick-profile`'s blocking run is [`run_to_end`]: submit, then
//! poll until the run ended (stopping it once it measured enough, killing it at its
//! `timeoutS`), then [`collect`] what it did and [`classify`](crate::end::classify)
//! how it ended — the same rule for every backend.
//!
//! Backends: [`crate::local::Local`] (this machine, each run under the run wrapper in a
//! process group of its own), [`crate::slurm::Slurm`] (one `sbatch` job per run, one
//! launcher per node), [`crate::kubernetes::Kubernetes`] (Kubeflow resources).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rubick_core::schedule::NodeShare;

use crate::contract::{METRICS_FILE, RunRequest, append};
use crate::end::{Exit, RunOutcome, RunStatus, collect};
use crate::error::LaunchError;
use crate::metrics::iterations_in;
use crate::proc::RunSignal;

/// A run as its backend knows it. Written in a state file as text ([`Handle`]'s
/// `Display`), read back by the backend that made it ([`Executor::handle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handle {
    /// A local run: its wrapper's process group and its directory, whose
    /// `metrics.jsonl` path every process of the run carries in its environment (the
    /// mark: a process group id reused by another program is never taken for the run).
    /// (An older state's plain group id is no handle: a group id alone names whatever
    /// holds it now; such a run is found from its directory's pid file and its mark.)
    Local { pgid: u32, dir: PathBuf },
    /// A Slurm job id.
    Slurm { job: String },
    /// A Kubernetes run: its resources' name and the run's directory.
    Kubernetes { name: String, dir: PathBuf },
}

impl std::fmt::Display for Handle {
    /// `PGID@DIR`, `JOBID`, `NAME@DIR`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handle::Local { pgid, dir } => write!(f, "{pgid}@{}", dir.display()),
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

    /// A handle's text as the backend `backend` writes it (see its `Display`): what a
    /// file says of a run, parsed without the backend's settings; `None` when it is not
    /// one (an unknown backend included).
    pub fn parse(backend: &str, text: &str) -> Option<Handle> {
        match backend {
            "local" => Handle::parse_local(text),
            "slurm" => (!text.is_empty() && text.chars().all(|c| c.is_ascii_digit()))
                .then(|| Handle::Slurm { job: text.into() }),
            "kubernetes" => {
                let (name, dir) = text.split_once('@')?;
                let dir = PathBuf::from(dir);
                (crate::kubernetes::is_dns_label(name) && dir.is_absolute())
                    .then(|| Handle::Kubernetes { name: name.into(), dir })
            }
            _ => None,
        }
    }

    /// The run's directory the handle names (local and Kubernetes runs).
    pub fn dir(&self) -> Option<&std::path::Path> {
        match self {
            Handle::Local { dir, .. } | Handle::Kubernetes { dir, .. } => Some(dir),
            Handle::Slurm { .. } => None,
        }
    }

    /// A local handle's text, `PGID@DIR`: a group id above 1 (never "every process" or
    /// init's) and an absolute directory; anything else is no handle.
    pub fn parse_local(text: &str) -> Option<Handle> {
        let (pgid, dir) = text.split_once('@')?;
        let pgid: u32 = pgid.parse().ok().filter(|&p| p > 1)?;
        let dir = PathBuf::from(dir);
        dir.is_absolute().then_some(Handle::Local { pgid, dir })
    }
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
    Ended(Exit),
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
    pub nodes: Vec<NodeShare>,
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

impl<'a> Submission<'a> {
    /// A run of this process (not detached) on the backend's choice of nodes and
    /// cores, its directory the one of its metrics file.
    pub fn attached(request: &RunRequest<'a>) -> Self {
        let dir = Path::new(&request.context.metrics).parent().unwrap_or(Path::new(".")).to_path_buf();
        Submission {
            request: request.clone(),
            dir,
            nodes: Vec::new(),
            cores: Vec::new(),
            name: None,
            detached: false,
            partition: None,
        }
    }

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

    /// Refuses a run whose metrics file is not its directory's `metrics.jsonl`.
    pub(crate) fn check_dir(&self) -> Result<(), LaunchError> {
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
pub fn wait_ended(exec: &dyn Executor, handle: &Handle, dir: &Path, limit: Duration) -> Option<Exit> {
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
/// complete (its status `Ok` whatever its exit; where the exit was not 0, its outcome's
/// `counted_complete` says so); at `timeoutS` (counted from when it was seen running) `TERM`, then `KILL`.
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
    let (mut timed_out, mut killed_after_stop) = (false, false);
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
            if iterations_in(metrics) >= want as usize {
                tracing::info!("{want} iterations measured: stopping the run ({})", launch.stop_signal.name());
                exec.signal(&handle, RunSignal::Stop(launch.stop_signal));
                stopping = Some(Instant::now());
            }
        }
        if let Some(since) = stopping
            && since.elapsed() >= rubick_core::launch::duration(launch.stop_timeout_s)
        {
            tracing::warn!("the run ignored its stop signal for {} s: killed", launch.stop_timeout_s);
            killed_after_stop = true;
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
    let exit = Exit { timed_out: timed_out || end.timed_out, ..end };
    let mut outcome = collect(metrics, &request.log, &exit, wall);
    // Stopped by us with its iterations measured: a complete run, whatever its exit (a
    // script's teardown may fail, or die of the stop, after its last measured iteration),
    // and the outcome says why its status is not its exit's.
    let failed = matches!(outcome.status, RunStatus::Failed | RunStatus::NotRunnable | RunStatus::Preempted);
    if let (Some(_), Some(want)) = (stopping, request.stop_after_iterations)
        && failed
    {
        let signal = launch.stop_signal.name();
        let end = match outcome.exit_code {
            _ if killed_after_stop => format!("killed {} s (stopTimeoutS) after", launch.stop_timeout_s),
            Some(code) if code > 128 => format!("exit {code} (signal {}) after", code - 128),
            Some(code) => format!("exit {code} after"),
            None => "an end of unknown status after".to_owned(),
        };
        outcome.counted_complete = Some(format!(
            "{end} the stop rubick sent ({signal}) once its {want} iterations were measured: complete (counted ok)"
        ));
        outcome.status = RunStatus::Ok;
    }
    Ok(outcome)
}

/// How long a killed run may take to be seen ended (a Slurm job's `KillWait` included).
const KILL_LIMIT: Duration = Duration::from_secs(90);
