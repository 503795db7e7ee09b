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
//! DIR/current.cache.json the same, parsed faster; used only for the very bytes it
//!                       was parsed from, while it and current.yaml are intact
//! DIR/lock              held by the one rubick-run that may act
//! DIR/jobs/NAME/        checkpoints/ (kept across runs), attempt-N/ (log, metric lines,
//!                       pid and exit-code files of each run)
//! ```
//!
//! `state.yaml` is rewritten atomically and durably
//! ([`write_atomic_as`](rubick_io::files::write_atomic_as): temporary file, fsync,
//! rename, fsync of the directory) before and after every action, so a `rubick-run`
//! killed at any point leaves a state that says what it was doing: a run `starting`
//! (its process may or may not exist: its pid file decides), `running`, or `stopping`
//! (stop it again).
//!
//! This file holds the records (what `state.yaml` says, and its validation); `dir.rs`
//! the directory on disk ([`StateDir`]: the lock, the cache, the seal, the intent).

use std::collections::BTreeMap;
use std::path::Path;

use rubick_core::schedule::NodeShare;
use rubick_core::{Job, Plan};
use serde::{Deserialize, Serialize};

use crate::reconcile::Allocation;

mod applied;
mod dir;

pub use applied::{CURRENT_CACHE_FILE, Loaded, load_schedule};
pub use dir::{CACHE_FILE, INTENT_FILE, SEAL_FILE, STATE_FILE, StateDir, write_if_changed, write_private};

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
                name == other_name && (a == b || (a.run.is_some() && a.equal_but_progress(b)))
            })
    }
}

impl JobRecord {
    /// Equal but for `iterations_done` (compared field by field: no copy of a record
    /// made for it, and a field added to the record is a compile error here).
    fn equal_but_progress(&self, other: &JobRecord) -> bool {
        let JobRecord {
            job,
            status,
            run,
            attempts,
            iterations_done: _,
            exit_code,
            reason,
            reconfigurations,
            retries_left,
            submitted_unix_s,
            first_started_unix_s,
            submitted_from,
        } = self;
        *job == other.job
            && *status == other.status
            && *run == other.run
            && *attempts == other.attempts
            && *exit_code == other.exit_code
            && *reason == other.reason
            && *reconfigurations == other.reconfigurations
            && *retries_left == other.retries_left
            && *submitted_unix_s == other.submitted_unix_s
            && *first_started_unix_s == other.first_started_unix_s
            && *submitted_from == other.submitted_from
    }
}

impl Default for State {
    fn default() -> Self {
        State { version: STATE_VERSION, round: None, cluster: None, backend: None, jobs: BTreeMap::new() }
    }
}

/// Whether two paths name the same file or directory: equal, or equal once resolved
/// (symlinks, `.`, `..`) where they exist.
pub fn same_path(a: &Path, b: &Path) -> bool {
    a == b || a.canonicalize().is_ok_and(|a| b.canonicalize().is_ok_and(|b| a == b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use std::time::Duration;

    use super::*;

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
}
