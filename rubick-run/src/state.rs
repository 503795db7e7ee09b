//! The state directory: what was submitted, what runs where, what it cost.
//!
//! ```text
//! DIR/state.yaml        every job: its spec, status, current run, restarts, reconfigurations
//! DIR/state.cache.json  the same, parsed faster; used only while it matches state.yaml
//! DIR/state.seal        state.yaml's identity when this build last wrote or checked it:
//!                       while it holds, no process search for runs without a record
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
use rubick_io::files::{Access, write_atomic_as};
use serde::{Deserialize, Serialize};

use crate::reconcile::Allocation;

/// The state format this build reads and writes.
pub const STATE_VERSION: u32 = 1;

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
            if let Some(run) = &r.run {
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
}

/// Where the identity of the `state.yaml` this build last wrote, or last found to
/// agree with the live runs, is kept: see [`StateDir::sealed`].
pub const SEAL_FILE: &str = "state.seal";

/// A file's identity as the file system tells it (device, inode, modification time to
/// the nanosecond, length): any write, copy or restore of the file changes it.
fn file_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!("{} {} {}.{:09} {}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

impl StateDir {
    /// Opens (with `create`: makes) the state directory at `root`, made absolute once, and
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
        // Taken before the read: a change in between reads as unsealed (the safe side).
        *self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = file_identity(&path);
        if !path.exists() {
            return Ok(State::default());
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}: cannot read", path.display()))?;
        let key = cache_key(text.as_bytes());
        let valid = |state: State| -> anyhow::Result<State> {
            state.validate().map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e}; the state is refused as it is (fix or restore it; nothing was done)",
                    path.display()
                )
            })?;
            Ok(state)
        };
        if let Some(state) = self.cached(&key) {
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
        self.write_cache(&key, &state);
        *self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(state.clone());
        Ok(state)
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
            write_atomic_as(&self.root.join(CACHE_FILE), &text, Access::Private)?;
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
        *self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = file_identity(&self.state_path());
        self.seal();
        Ok(())
    }

    /// Whether the `state.yaml` this process read is the very file this build last
    /// wrote or found to agree with the live runs ([`StateDir::seal`]): not edited,
    /// copied or restored since. Only then may a command trust that every live run of
    /// the directory has its record, and skip the search of all processes for runs
    /// without one. A missing or unreadable seal, or a state that was absent, is not
    /// sealed.
    pub fn sealed(&self) -> bool {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        identity.is_some_and(|id| std::fs::read_to_string(self.root.join(SEAL_FILE)).is_ok_and(|s| s == id))
    }

    /// Records that the `state.yaml` last read or written agrees with the live runs
    /// (this build wrote it, or a search found no run without a record). Not durable:
    /// a seal lost is one more search.
    pub fn seal(&self) {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(id) = identity else { return };
        if let Err(e) = write_atomic_as(&self.root.join(SEAL_FILE), id.as_bytes(), Access::Private) {
            tracing::debug!("{}: not written: {e}", self.root.join(SEAL_FILE).display());
        }
    }
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
        // A cache keyed by this YAML is what a load reads (one that says otherwise is
        // believed: the proof that it is read)...
        dir.write_cache(&cache_key(yaml.as_bytes()), &State { round: Some(4), ..State::default() });
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
