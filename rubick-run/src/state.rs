//! The state directory: what was submitted, what runs where, what it cost.
//!
//! ```text
//! DIR/state.yaml        every job: its spec, status, current run, restarts, reconfigurations
//! DIR/state.cache.json  the same, parsed faster; used only while it matches state.yaml
//! DIR/state.seal        state.yaml's and the cache's identities when this build last
//!                       wrote or checked them: while state.yaml's holds, no process
//!                       search for runs without a record is made; while both hold,
//!                       the cache is read
//! DIR/starting          the intent of a round's starts: written before any is
//!                       launched, removed once they are recorded; while it is there,
//!                       a start may have been interrupted, and the next command
//!                       searches the processes for runs without a record
//! DIR/current.yaml      the schedule as last applied (the planner's --current)
//! DIR/lock              held by the one rubick-run that may act
//! DIR/jobs/NAME/        checkpoints/ (kept across runs), attempt-N/ (log, metric lines,
//!                       pid and exit-code files of each run)
//! ```
//!
//! `state.yaml` is rewritten atomically and durably ([`write_atomic_as`]: temporary
//! file, fsync, rename, fsync of the directory) before and
//! after every action, so a `rubick-run` killed at any point leaves a state that says
//! what it was doing: a run `starting` (its process may or may not exist: its pid file
//! decides), `running`, or `stopping` (stop it again).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use rubick_core::schedule::NodeShare;
use rubick_core::{Job, Plan};
use rubick_io::files::{Access, write_atomic_as, write_atomic_unsynced};
use serde::{Deserialize, Serialize};

use crate::reconcile::Allocation;

/// The state format this build reads and writes.
pub const STATE_VERSION: u32 = 1;

/// The most runs a job may have started (`attempts`): far beyond any real job's, and
/// far from the counter's limit, so that the next start never wraps.
pub const MAX_ATTEMPTS: u32 = 1_000_000;

/// The most restarts a job may be given (`submit --retries`, `retriesLeft`).
pub const MAX_RETRIES: u32 = 10_000;

/// CPU core numbers a run may be pinned to are below this (Linux's `NR_CPUS` limit).
pub const MAX_CORES: u32 = 8192;

/// A job's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobStatus {
    /// Submitted or preempted: waits for a round to schedule it.
    Queued,
    Running,
    /// Ran all its iterations (exited 0 on its own).
    Finished,
    /// Exited non-zero on its own.
    Failed,
    /// Stopped by `rubick-run stop`: no round schedules it again.
    Stopped,
}

impl JobStatus {
    /// Every status, in the order of a job's life.
    pub const ALL: [JobStatus; 5] =
        [JobStatus::Queued, JobStatus::Running, JobStatus::Finished, JobStatus::Failed, JobStatus::Stopped];
}

impl std::fmt::Display for JobStatus {
    /// The status as the state file writes it (`queued`, `running`, ...).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Finished => "finished",
            JobStatus::Failed => "failed",
            JobStatus::Stopped => "stopped",
        })
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunPhase {
    /// About to start (or started, not yet recorded: its pid file tells).
    Starting,
    Running,
    /// Asked to stop (checkpoint and exit).
    Stopping,
}

/// One run of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRecord {
    pub plan: Plan,
    pub nodes: Vec<NodeShare>,
    pub attempt: u32,
    pub phase: RunPhase,
    /// The backend's handle: the process group (local).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// Seconds since the Unix epoch when it was started.
    pub started_unix_s: f64,
    /// Rounds it has run unchanged.
    #[serde(default)]
    pub rounds_since_change: u32,
    /// CPU cores it is pinned to (local backend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cores: Vec<u32>,
}

impl RunRecord {
    pub fn allocation(&self) -> Allocation {
        Allocation { plan: self.plan, nodes: self.nodes.clone() }
    }
}

/// What one reconfiguration (or preemption) cost, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reconfiguration {
    pub from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Stop signal to the exit of the whole process group (checkpoint save + teardown).
    pub stop_s: f64,
    /// Whether it exited within `stopTimeoutS` (else its group was killed).
    pub clean: bool,
    /// Iteration of its checkpoint, when it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_iter: Option<u64>,
    /// Seconds that checkpoint's save took, when it said (part of `stop_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_save_s: Option<f64>,
    /// Start of the new run to its first metric line (seen by a later round; estimated
    /// from the metrics file's last change when more lines were written by then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_iteration_s: Option<f64>,
    /// The mean iteration time of the run before it and of the run it started, once that
    /// run measured as many iterations as a profile would (the safety net after every
    /// move, `runs::judge_move`: judged once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_iter_time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_iter_time_s: Option<f64>,
    /// A restart the planner did not choose: the round started the job again because
    /// its run's node or GPU left, or because it ran slower after a move (`slowPlans`).
    /// Counted apart: it does not raise the job's restart factor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
}

/// A job the state knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobRecord {
    pub job: Job,
    pub status: JobStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRecord>,
    /// Runs started so far.
    #[serde(default)]
    pub attempts: u32,
    /// Highest iteration any of its runs reported.
    #[serde(default)]
    pub iterations_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why the job is where it is after its last run ended or failed to start (for
    /// `status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reconfigurations: Vec<Reconfiguration>,
    /// Restarts left after retryable failures (`submit --retries`).
    #[serde(default)]
    pub retries_left: u32,
    /// When it was submitted, and first started (seconds since the Unix epoch).
    #[serde(default)]
    pub submitted_unix_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_started_unix_s: Option<f64>,
    /// The directory `submit` ran in: the local and Slurm backends run the command there
    /// (its relative paths resolve against it, not against wherever an apply runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_from: Option<std::path::PathBuf>,
}

/// The state's file in its directory.
pub const STATE_FILE: &str = "state.yaml";

/// The state as JSON (parsed several times faster than its YAML: every command of every
/// round reads the state), after a first line naming what it is a copy of: this build
/// and a digest of `state.yaml`'s bytes. Used only when both match (a hand edit, a
/// restore, another build, a crash between the two writes: `state.yaml` is parsed,
/// and the copy written again); never the record.
pub const CACHE_FILE: &str = "state.cache.json";

/// The first line of a cache of `yaml` written by this build.
fn cache_key(yaml: &[u8]) -> String {
    let digest = rubick_launch::fnv1a(yaml);
    format!("rubick-run {} state {STATE_VERSION} yaml {} {digest:016x}", env!("CARGO_PKG_VERSION"), yaml.len())
}

/// `state.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct State {
    pub version: u32,
    /// Round of the schedule last applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<u64>,
    /// The cluster its schedules are for (set by the first apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The backend its runs are on (set by apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default)]
    pub jobs: BTreeMap<String, JobRecord>,
}

impl State {
    /// The state checked as any input is (a hand edit, a restored backup, an edited
    /// cache): every job's key a job name (`submit`'s rule: it becomes a directory, so
    /// `../x` is refused), its record's Job valid and named as its key, its run within
    /// its attempts and its plan's GPUs on its nodes, where `submit` ran an absolute
    /// path. The error names the key and field.
    pub fn validate(&self) -> Result<(), rubick_core::ValidationError> {
        use rubick_core::ValidationError;
        for (key, r) in &self.jobs {
            let at = |field: &str| {
                if field.is_empty() { format!("jobs.{key:?}") } else { format!("jobs.{key:?}.{field}") }
            };
            rubick_core::job::check_name(key).map_err(|why| ValidationError::new(at(""), why))?;
            r.job.check().map_err(|e| e.within(&at("job")))?;
            if r.job.name != *key {
                return Err(ValidationError::new(
                    at("job.name"),
                    format!("`{}` is not the job's key `{key}`", r.job.name.escape_debug()),
                ));
            }
            if r.attempts > MAX_ATTEMPTS {
                return Err(ValidationError::new(
                    at("attempts"),
                    format!("{} is more runs than any job may start (at most {MAX_ATTEMPTS})", r.attempts),
                ));
            }
            if r.retries_left > MAX_RETRIES {
                return Err(ValidationError::new(
                    at("retriesLeft"),
                    format!("{} is more than a job may be given (at most {MAX_RETRIES})", r.retries_left),
                ));
            }
            let time = |field: &str, t: f64| {
                if t.is_finite() && t >= 0.0 {
                    Ok(())
                } else {
                    Err(ValidationError::new(at(field), format!("{t} is not a time (non-negative seconds)")))
                }
            };
            time("submittedUnixS", r.submitted_unix_s)?;
            if let Some(t) = r.first_started_unix_s {
                time("firstStartedUnixS", t)?;
            }
            for (k, c) in r.reconfigurations.iter().enumerate() {
                time(&format!("reconfigurations[{k}].stopS"), c.stop_s)?;
                if let Some(t) = c.checkpoint_save_s {
                    time(&format!("reconfigurations[{k}].checkpointSaveS"), t)?;
                }
                for (field, t) in [
                    ("firstIterationS", c.first_iteration_s),
                    ("beforeIterTimeS", c.before_iter_time_s),
                    ("afterIterTimeS", c.after_iter_time_s),
                ] {
                    if let Some(t) = t {
                        time(&format!("reconfigurations[{k}].{field}"), t)?;
                    }
                }
            }
            if let Some(run) = &r.run {
                if let Some(&core) = run.cores.iter().find(|&&c| c >= MAX_CORES) {
                    return Err(ValidationError::new(
                        at("run.cores"),
                        format!("{core} is not a CPU core of any machine (at most {})", MAX_CORES - 1),
                    ));
                }
                if run.attempt == 0 || run.attempt > r.attempts {
                    return Err(ValidationError::new(
                        at("run.attempt"),
                        format!("{} is not one of the job's {} attempt(s)", run.attempt, r.attempts),
                    ));
                }
                let gpus: usize = run.nodes.iter().map(|n| n.gpus.len()).sum();
                if gpus != run.plan.gpus() as usize {
                    return Err(ValidationError::new(
                        at("run.nodes"),
                        format!("{gpus} GPUs on the nodes but plan `{}` needs {}", run.plan, run.plan.gpus()),
                    ));
                }
                for (k, n) in run.nodes.iter().enumerate() {
                    let bad = n.node.is_empty() || n.node.contains(['/', '\\', '\0']) || n.node.starts_with('.');
                    if bad {
                        return Err(ValidationError::new(
                            at(&format!("run.nodes[{k}].node")),
                            format!("`{}` is not a node name", n.node.escape_debug()),
                        ));
                    }
                }
                if !(run.started_unix_s.is_finite() && run.started_unix_s >= 0.0) {
                    return Err(ValidationError::new(at("run.startedUnixS"), "must be a time (non-negative seconds)"));
                }
            }
            if let Some(from) = &r.submitted_from
                && !from.is_absolute()
            {
                return Err(ValidationError::new(
                    at("submittedFrom"),
                    format!("`{}` is not an absolute path", from.display()),
                ));
            }
        }
        Ok(())
    }

    /// Every run's handle checked against the state directory `root` (canonical) and the
    /// state's backend: a handle is what a stop signals, so it must be one this state's
    /// backend wrote for that very run (a local or Kubernetes handle names the run's own
    /// `ROOT/jobs/KEY/attempt-N`; a local group id is above 1; a Slurm handle is a job
    /// id). A handle that names anything else (a bare group id, `1`, another state's run)
    /// is refused: nothing would be signalled through it. The error names the field.
    pub fn check_handles(&self, root: &Path) -> Result<(), rubick_core::ValidationError> {
        use rubick_core::ValidationError;
        let backend = self.backend.as_deref().unwrap_or("local");
        for (key, r) in &self.jobs {
            let Some(run) = &r.run else { continue };
            let Some(text) = &run.handle else { continue };
            let field = format!("jobs.{key:?}.run.handle");
            let handle = rubick_launch::Handle::parse(backend, text).ok_or_else(|| {
                let want = match backend {
                    "local" => "PGID@DIR (a process group id above 1 and the run's directory)",
                    "slurm" => "a Slurm job id",
                    "kubernetes" => "NAME@DIR (the run's resources and its directory)",
                    _ => "a handle of a known backend",
                };
                ValidationError::new(
                    &field,
                    format!("`{}` is not a {backend} run's handle: expected {want}", text.escape_debug()),
                )
            })?;
            if let Some(dir) = handle.dir() {
                let own = root.join("jobs").join(key).join(format!("attempt-{}", run.attempt));
                if !same_path(dir, &own) {
                    return Err(ValidationError::new(
                        &field,
                        format!(
                            "`{}` names {}, not this run's directory {}: it is refused (a stop would signal another run)",
                            text.escape_debug(),
                            dir.display(),
                            own.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Equal, or different only in the iterations done of jobs that run.
    fn equal_but_progress(&self, other: &State) -> bool {
        let State { version, round, cluster, backend, jobs } = self;
        *version == other.version
            && *round == other.round
            && *cluster == other.cluster
            && *backend == other.backend
            && jobs.len() == other.jobs.len()
            && jobs.iter().zip(&other.jobs).all(|((name, a), (other_name, b))| {
                name == other_name
                    && (a == b
                        || (a.run.is_some() && {
                            let mut b = b.clone();
                            b.iterations_done = a.iterations_done;
                            *a == b
                        }))
            })
    }
}

impl Default for State {
    fn default() -> Self {
        State { version: STATE_VERSION, round: None, cluster: None, backend: None, jobs: BTreeMap::new() }
    }
}

/// An open state directory, locked for as long as it lives.
#[derive(Debug)]
pub struct StateDir {
    pub root: PathBuf,
    _lock: File,
    /// The state as this process last read or wrote it (under the lock, nobody else
    /// writes it): a save of an equal state writes nothing (a no-op round spends no
    /// serialisation, no temporary file and no fsyncs).
    on_disk: std::sync::Mutex<Option<State>>,
    /// `state.yaml`'s identity (see [`file_identity`]) when this process last read or
    /// wrote it.
    identity: std::sync::Mutex<Option<String>>,
    /// Whether the state last loaded may not record every live run (see
    /// [`StateDir::needs_search`]): decided when it is read, before any save seals it.
    search: std::sync::atomic::AtomicBool,
}

/// Where the identities of the `state.yaml` (and of its cache) this build last wrote, or
/// last found to agree with the live runs, are kept: see [`StateDir::sealed`].
pub const SEAL_FILE: &str = "state.seal";

/// The intent of a round's starts (their run directories, one a line): written before
/// the first is launched, removed once every one is recorded with its handle (or found
/// by the next command): see [`StateDir::needs_search`].
pub const INTENT_FILE: &str = "starting";

/// Whether two paths name the same file or directory: equal, or equal once resolved
/// (symlinks, `.`, `..`) where they exist.
pub fn same_path(a: &Path, b: &Path) -> bool {
    a == b || a.canonicalize().is_ok_and(|a| b.canonicalize().is_ok_and(|b| a == b))
}

/// A file's identity as the file system tells it (device, inode, modification time to
/// the nanosecond, length): any write, copy or restore of the file changes it.
fn file_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!("{} {} {}.{:09} {}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

impl StateDir {
    /// Opens (with `create`: makes) the state directory at `root`, resolved once, and
    /// takes its lock, waiting up to `wait` for a round in progress; then fails with a
    /// message saying so (the caller exits 1). Without `create`, a directory that holds
    /// no state is an error.
    pub fn open(root: &Path, wait: Duration, create: bool) -> anyhow::Result<Result<StateDir, String>> {
        let root = &std::path::absolute(root).with_context(|| format!("{}: not a usable path", root.display()))?;
        if !create && !root.join(STATE_FILE).exists() {
            anyhow::bail!(
                "{}: not a rubick-run state (no {STATE_FILE}); `rubick-run submit` makes one",
                root.display()
            );
        }
        std::fs::create_dir_all(root)
            .with_context(|| format!("{}: cannot create the state directory", root.display()))?;
        // Resolved once (symlinks, `..`): the runs' marks, handles and directories name
        // the state by this one path, whichever path a command was given.
        let root = &root.canonicalize().with_context(|| format!("{}: cannot resolve", root.display()))?;
        let path = root.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("{}: cannot open", path.display()))?;
        let start = Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Ok(Err(format!(
                        "{}: another rubick-run holds it (a round in progress); waited {:.0} s, did nothing",
                        path.display(),
                        wait.as_secs_f64()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("{}: lock", path.display()));
                }
            }
        }
        Ok(Ok(StateDir {
            root: root.to_path_buf(),
            _lock: lock,
            on_disk: std::sync::Mutex::new(None),
            identity: std::sync::Mutex::new(None),
            search: std::sync::atomic::AtomicBool::new(true),
        }))
    }

    pub fn state_path(&self) -> PathBuf {
        self.root.join(STATE_FILE)
    }

    pub fn current_path(&self) -> PathBuf {
        self.root.join("current.yaml")
    }

    pub fn job_dir(&self, job: &str) -> PathBuf {
        self.root.join("jobs").join(job)
    }

    pub fn attempt_dir(&self, job: &str, attempt: u32) -> PathBuf {
        self.job_dir(job).join(format!("attempt-{attempt}"))
    }

    /// The state (empty when there is none yet). A newer format is refused.
    pub fn load(&self) -> anyhow::Result<State> {
        let path = self.state_path();
        // Taken before the reads: a change in between reads as unsealed (the safe side).
        let yaml_id = file_identity(&path);
        let cache_id = file_identity(&self.root.join(CACHE_FILE));
        self.set_identity(yaml_id.as_deref(), cache_id.as_deref());
        let seal = std::fs::read_to_string(self.root.join(SEAL_FILE)).ok();
        // The records are the state.yaml this build last wrote or searched for, and no
        // start was interrupted: every live run of the directory has its record.
        let records_sealed = yaml_id.as_ref().is_some_and(|y| seal_of_yaml(seal.as_deref()) == Some(y.as_str()));
        let interrupted = self.root.join(INTENT_FILE).exists();
        self.search.store(!records_sealed || interrupted, std::sync::atomic::Ordering::Relaxed);
        if !path.exists() {
            return Ok(State::default());
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}: cannot read", path.display()))?;
        let key = cache_key(text.as_bytes());
        let valid = |state: State| -> anyhow::Result<State> {
            state.validate().and_then(|()| state.check_handles(&self.root)).map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e}; the state is refused as it is (fix or restore it; nothing was done)",
                    path.display()
                )
            })?;
            Ok(state)
        };
        // The cache only while the seal vouches for both files as this build left them.
        if self.identity_is(seal.as_deref())
            && let Some(state) = self.cached(&key)
        {
            let state = valid(state)?;
            *self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(state.clone());
            return Ok(state);
        }
        let newer = |version: u32| {
            anyhow::anyhow!(
                "{}: version: {version} is newer than this rubick-run understands ({STATE_VERSION}); use a newer rubick-run",
                path.display(),
            )
        };
        // Parsed once (every command reads it); a state this build cannot read is told
        // apart by its version alone: a newer one is named as such.
        let state: State = match serde_yaml_ng::from_str(&text) {
            Ok(state) => state,
            Err(e) => {
                #[derive(Deserialize)]
                struct Version {
                    version: u32,
                }
                let version: Version =
                    serde_yaml_ng::from_str(&text).with_context(|| format!("{}: version", path.display()))?;
                if version.version > STATE_VERSION {
                    return Err(newer(version.version));
                }
                return Err(anyhow::Error::new(e).context(format!("{}: not a rubick-run state", path.display())));
            }
        };
        if state.version > STATE_VERSION {
            return Err(newer(state.version));
        }
        let state = valid(state)?;
        // A new cache is a new file: sealed with the state.yaml it copies when the seal
        // vouched for that file (the records need no search for the cache's sake: it
        // was not read), else once a search for unrecorded runs found them true.
        self.write_cache(&key, &state);
        self.set_identity(yaml_id.as_deref(), file_identity(&self.root.join(CACHE_FILE)).as_deref());
        if records_sealed {
            self.seal();
        }
        *self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(state.clone());
        Ok(state)
    }

    /// What this process knows of the two files the seal vouches for: `state.yaml`'s
    /// identity and the cache's (none when `state.yaml` is absent).
    fn set_identity(&self, yaml: Option<&str>, cache: Option<&str>) {
        *self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            yaml.map(|y| format!("{y}\n{}", cache.unwrap_or("-")));
    }

    /// Whether `seal` (the seal file's text) holds the identities this process knows.
    fn identity_is(&self, seal: Option<&str>) -> bool {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        identity.as_deref().is_some_and(|id| seal == Some(id))
    }

    /// The cached state, if the cache is a copy of the YAML whose key is `key`.
    fn cached(&self, key: &str) -> Option<State> {
        let text = std::fs::read_to_string(self.root.join(CACHE_FILE)).ok()?;
        let (first, json) = text.split_once('\n')?;
        (first == key).then(|| serde_json::from_str(json).ok())?
    }

    /// Writes the cache of the state whose YAML has `key` (atomically; a cache that
    /// cannot be written is only parsed again next time).
    fn write_cache(&self, key: &str, state: &State) {
        let write = || -> anyhow::Result<()> {
            let mut text = format!("{key}\n").into_bytes();
            serde_json::to_writer(&mut text, state)?;
            write_atomic_unsynced(&self.root.join(CACHE_FILE), &text, Access::Private)?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::debug!("{}: not written: {e:#}", self.root.join(CACHE_FILE).display());
        }
    }

    /// Writes the state atomically and durably, unless it equals what is on disk but
    /// for the iterations runs have done (what every command reads from their metric
    /// lines again: not worth an fsync of its own; written with the next real change).
    pub fn save(&self, state: &State) -> anyhow::Result<()> {
        let mut on_disk = self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if on_disk.as_ref().is_some_and(|old| old.equal_but_progress(state)) {
            return Ok(());
        }
        let yaml = serde_yaml_ng::to_string(state)?;
        write_private(&self.state_path(), yaml.as_bytes())?;
        self.write_cache(&cache_key(yaml.as_bytes()), state);
        *on_disk = Some(state.clone());
        let yaml_id = file_identity(&self.state_path());
        self.set_identity(yaml_id.as_deref(), file_identity(&self.root.join(CACHE_FILE)).as_deref());
        self.seal();
        Ok(())
    }

    /// Whether the `state.yaml` this process read, and the cache beside it, are the very
    /// files this build last wrote or found to agree with the live runs
    /// ([`StateDir::seal`]): not edited, copied or restored since. Only then is the cache
    /// read, and may a command trust that every live run of the directory has its
    /// record and skip the search of all processes for runs without one. A missing or
    /// unreadable seal, a cache that is not the one sealed (edited under its first line,
    /// rewritten, lost), or a state that was absent, is not sealed.
    pub fn sealed(&self) -> bool {
        self.identity_is(std::fs::read_to_string(self.root.join(SEAL_FILE)).ok().as_deref())
    }

    /// Whether a live run of the directory may lack a record, as the state last loaded
    /// says: its `state.yaml` is not the file this build last wrote or found to agree
    /// with the live runs (restored, edited, or absent), or the intent of a round's
    /// starts is there ([`INTENT_FILE`]: a rubick-run was killed between writing it and
    /// recording the runs it launched). Then, and only then, a command searches every
    /// process for the directory's runs (a no-op round spends none on it); a cache
    /// rewritten or lost is not a reason (it was not read).
    pub fn needs_search(&self) -> bool {
        self.search.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the intent of starting runs in `dirs`, before the first is launched
    /// (readable by its owner only; not synced: a machine that loses it lost the runs
    /// with it).
    pub fn intend_starts(&self, dirs: &[&Path]) -> anyhow::Result<()> {
        let text: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        let path = self.root.join(INTENT_FILE);
        write_atomic_unsynced(&path, text.as_bytes(), Access::Private)
            .with_context(|| format!("{}: the intent of the round's starts", path.display()))
    }

    /// Records that the live runs agree with the records again (the starts recorded, or a
    /// search found every run without one): the intent removed, the state sealed.
    pub fn searched(&self) {
        let path = self.root.join(INTENT_FILE);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("{}: cannot remove it ({e}): the next command searches the processes again", path.display());
        }
        self.search.store(false, std::sync::atomic::Ordering::Relaxed);
        self.seal();
    }

    /// Records that the `state.yaml` last read or written agrees with the live runs
    /// (this build wrote it, or a search found no run without a record). Not durable:
    /// a seal lost is one more search.
    pub fn seal(&self) {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(id) = identity else { return };
        if let Err(e) = write_atomic_unsynced(&self.root.join(SEAL_FILE), id.as_bytes(), Access::Private) {
            tracing::debug!("{}: not written: {e}", self.root.join(SEAL_FILE).display());
        }
    }
}

/// `state.yaml`'s identity in the text of a seal (its first line).
fn seal_of_yaml(seal: Option<&str>) -> Option<&str> {
    seal.map(|s| s.split_once('\n').map_or(s, |(yaml, _)| yaml))
}

/// [`write_atomic_as`] (readable by its owner only) unless the file already holds
/// exactly `bytes` (a no-op round rewrites nothing).
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    write_private(path, bytes)
}

/// A file of the state directory, written atomically and durably, readable by its owner
/// only (the state holds jobs' environments).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(write_atomic_as(path, bytes, Access::Private)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_read_only_while_it_copies_state_yaml() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        let state = State { round: Some(3), ..State::default() };
        dir.save(&state).unwrap();
        let yaml = std::fs::read_to_string(dir.state_path()).unwrap();
        let cache = std::fs::read_to_string(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(cache.lines().next(), Some(cache_key(yaml.as_bytes()).as_str()));
        assert_eq!(dir.load().unwrap(), state);
        // A cache keyed by this YAML, written and sealed by this build, is what a load
        // reads (one that says otherwise is believed: the proof that it is read)...
        dir.write_cache(&cache_key(yaml.as_bytes()), &State { round: Some(4), ..State::default() });
        dir.set_identity(
            file_identity(&dir.state_path()).as_deref(),
            file_identity(&root.path().join(CACHE_FILE)).as_deref(),
        );
        dir.seal();
        assert_eq!(dir.load().unwrap().round, Some(4));
        // ...and any change to state.yaml (a hand edit) outdates it: the YAML is parsed,
        // and the cache written again for it.
        let edited = yaml.replace("round: 3", "round: 5");
        assert_ne!(edited, yaml);
        std::fs::write(dir.state_path(), &edited).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(5));
        let cache = std::fs::read_to_string(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(cache.lines().next(), Some(cache_key(edited.as_bytes()).as_str()));
        // A cache that is not JSON of a state is passed over.
        std::fs::write(root.path().join(CACHE_FILE), format!("{}\n{{garbage", cache_key(edited.as_bytes()))).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(5));
    }

    /// Found by an adversarial pass: "a `state.cache.json` edited under its unchanged
    /// first line (run removed, status queued) is trusted and the search for unrecorded
    /// runs is skipped: `stop` reaches nothing, `delete` orphans the wrapper and its
    /// child". The edited cache is never read (state.yaml, the record, is), so the
    /// records need no search for it; the cache is written anew and sealed.
    #[test]
    fn a_cache_edited_under_its_first_line_is_not_read_and_is_written_anew() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        dir.save(&State { round: Some(3), ..State::default() }).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3));
        assert!(dir.sealed());
        let cache = root.path().join(CACHE_FILE);
        let text = std::fs::read_to_string(&cache).unwrap();
        let edited = text.replace("\"round\":3", "\"round\":9");
        assert_ne!(edited, text);
        std::fs::write(&cache, &edited).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3), "state.yaml is the record, not an edited cache");
        assert!(!dir.needs_search(), "the records are the state.yaml this build wrote");
        assert_eq!(std::fs::read_to_string(&cache).unwrap(), text, "the cache written anew from the record");
        assert!(dir.sealed(), "and sealed with it");
        assert_eq!(dir.load().unwrap().round, Some(3));
    }

    /// The search of every process for runs without a record is made only when a live
    /// run may lack one: a state.yaml this build did not write (restored) or an
    /// interrupted round's starts (their intent left); never for a cache lost.
    #[test]
    fn a_search_is_needed_only_for_a_state_not_written_here_or_an_interrupted_start() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "no state yet: nothing vouches for the directory's processes");
        dir.save(&State { round: Some(3), ..State::default() }).unwrap();
        dir.load().unwrap();
        assert!(!dir.needs_search());
        std::fs::remove_file(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3));
        assert!(!dir.needs_search(), "a lost cache is rebuilt, not searched for");
        assert!(dir.sealed(), "the rebuilt cache is sealed: the next command reads it");
        dir.intend_starts(&[&dir.attempt_dir("a", 1)]).unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "a start may have been interrupted");
        dir.save(&State { round: Some(4), ..State::default() }).unwrap();
        assert!(dir.needs_search(), "decided when read: a save does not clear it");
        dir.searched();
        assert!(!root.path().join(INTENT_FILE).exists() && !dir.needs_search());
        dir.load().unwrap();
        assert!(!dir.needs_search());
        let yaml = std::fs::read(dir.state_path()).unwrap();
        std::fs::write(dir.state_path(), &yaml).unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "the same bytes restored are another file");
    }

    /// Found by an adversarial pass: "`State::validate` does not check `run.handle`. A
    /// plain number is taken as an older state's process-group id and `stop` calls
    /// `kill(-pgid)`": `'1'` is every process, a foreign group's id kills it, and
    /// `PGID@<another state>/jobs/a/attempt-1` stops another state's run.
    #[test]
    fn a_handle_is_accepted_only_when_it_names_this_runs_own_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        let own = dir.attempt_dir("a", 1);
        std::fs::create_dir_all(&own).unwrap();
        let state = |handle: &str, backend: Option<&str>| {
            let mut rec = crate::lifecycle::record(1, "running", Some(handle), 1, &[]);
            rec.job.name = "a".into();
            State { backend: backend.map(str::to_owned), jobs: [("a".to_owned(), rec)].into(), ..State::default() }
        };
        let other = tempfile::tempdir().unwrap();
        let refused = [
            "1".to_owned(),
            "4242".to_owned(),
            "0@/x".to_owned(),
            format!("1@{}", own.display()),
            format!("-1@{}", own.display()),
            format!("4242@{}", other.path().join("jobs/a/attempt-1").display()),
            format!("4242@{}", dir.attempt_dir("a", 2).display()),
            format!("4242@{}", dir.attempt_dir("b", 1).display()),
            "4242@jobs/a/attempt-1".to_owned(),
        ];
        for text in &refused {
            let e = state(text, None).check_handles(&dir.root).unwrap_err().to_string();
            assert!(e.contains("jobs.\"a\".run.handle"), "{text}: {e}");
        }
        state(&format!("4242@{}", own.display()), None).check_handles(&dir.root).unwrap();
        // Through a symlink to the state, the same directory.
        let link = other.path().join("link");
        std::os::unix::fs::symlink(&dir.root, &link).unwrap();
        state(&format!("4242@{}/jobs/a/attempt-1", link.display()), Some("local")).check_handles(&dir.root).unwrap();
        // Each backend's own form only.
        state("123", Some("slurm")).check_handles(&dir.root).unwrap();
        assert!(state("123@/x", Some("slurm")).check_handles(&dir.root).is_err());
        state(&format!("rubick-a-1@{}", own.display()), Some("kubernetes")).check_handles(&dir.root).unwrap();
        assert!(state("rubick-a-1@/elsewhere", Some("kubernetes")).check_handles(&dir.root).is_err());
    }

    /// Found by an adversarial pass: "`attempts: 4294967295` passes validation; the next
    /// start wraps to attempt 0 and every later command refuses the state, so the live
    /// run cannot be stopped".
    #[test]
    fn counters_and_times_read_from_the_state_are_bounded() {
        let mut rec = crate::lifecycle::record(1, "running", None, 1, &[]);
        rec.job.name = "a".into();
        let ok = State { jobs: [("a".to_owned(), rec.clone())].into(), ..State::default() };
        ok.validate().unwrap();
        type Spoil = fn(&mut JobRecord);
        let cases: [(&str, Spoil); 6] = [
            ("attempts", |r| r.attempts = u32::MAX),
            ("retriesLeft", |r| r.retries_left = u32::MAX),
            ("submittedUnixS", |r| r.submitted_unix_s = f64::NAN),
            ("firstStartedUnixS", |r| r.first_started_unix_s = Some(-1.0)),
            ("run.cores", |r| r.run.as_mut().unwrap().cores = vec![u32::MAX]),
            ("reconfigurations[0].stopS", |r| {
                r.reconfigurations.push(Reconfiguration {
                    from: "x".into(),
                    to: None,
                    stop_s: f64::INFINITY,
                    clean: true,
                    checkpointed_iter: None,
                    checkpoint_save_s: None,
                    first_iteration_s: None,
                    before_iter_time_s: None,
                    after_iter_time_s: None,
                    forced: false,
                })
            }),
        ];
        for (field, spoil) in cases {
            let mut bad = rec.clone();
            spoil(&mut bad);
            let e = State { jobs: [("a".to_owned(), bad)].into(), ..State::default() }.validate().unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn a_state_is_sealed_only_while_it_is_the_file_this_build_wrote_or_checked() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        assert!(!dir.sealed(), "no state yet: nothing says the runs all have records");
        let state = State { round: Some(3), ..State::default() };
        dir.save(&state).unwrap();
        assert!(dir.sealed());
        dir.load().unwrap();
        assert!(dir.sealed(), "read back as written");
        // The same bytes written again (a backup restored over it) are another file.
        let yaml = std::fs::read(dir.state_path()).unwrap();
        std::fs::write(dir.state_path(), &yaml).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed(), "restored: its runs must be searched for");
        dir.seal();
        assert!(dir.sealed(), "searched");
        // A copy put in place by rename, and a lost seal, are not sealed either.
        let copy = root.path().join("copy.yaml");
        std::fs::write(&copy, &yaml).unwrap();
        std::fs::rename(&copy, dir.state_path()).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed());
        dir.seal();
        std::fs::remove_file(root.path().join(SEAL_FILE)).unwrap();
        assert!(!dir.sealed());
        // A directory that lost its state.yaml is never sealed.
        dir.seal();
        std::fs::remove_file(dir.state_path()).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed());
    }
}
