//! A Slurm job's state: every state Slurm documents (`JOB STATE CODES` of squeue(1);
//! `scontrol show job` and `sacct` print the same names). A state this list does not
//! know is an error that names it, never taken for running.

use std::fmt;
use std::str::FromStr;

use crate::error::LaunchError;

/// A job's state, as Slurm names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    /// Ended by a launch failure (a node that could not boot); not requeued.
    BootFail,
    /// Cancelled by its user or an administrator.
    Cancelled,
    /// Every process of every node exited 0.
    Completed,
    /// Allocated, waiting for its nodes to boot.
    Configuring,
    /// Ending: some processes of some nodes still run.
    Completing,
    /// Ended on its deadline.
    Deadline,
    /// Exited non-zero (or another failure).
    Failed,
    /// One of its nodes failed.
    NodeFail,
    /// Ran out of memory.
    OutOfMemory,
    /// Waiting for its resources.
    Pending,
    /// Ended by preemption.
    Preempted,
    /// Running.
    Running,
    /// Held after its reservation was deleted.
    ResvDelHold,
    /// Being requeued by a federation.
    RequeueFed,
    /// Held after a requeue.
    RequeueHold,
    /// Being requeued.
    Requeued,
    /// Changing size.
    Resizing,
    /// Removed from this cluster: a sibling cluster of the federation started it.
    Revoked,
    /// Being signalled.
    Signaling,
    /// Requeued in a special state (an exit value the site chose).
    SpecialExit,
    /// Staging out its data.
    StageOut,
    /// Stopped (`SIGSTOP`), its cores kept.
    Stopped,
    /// Suspended, its cores given to other jobs.
    Suspended,
    /// Ended by its time limit.
    Timeout,
}

/// Every state with Slurm's name for it.
const NAMES: [(JobState, &str); 24] = [
    (JobState::BootFail, "BOOT_FAIL"),
    (JobState::Cancelled, "CANCELLED"),
    (JobState::Completed, "COMPLETED"),
    (JobState::Configuring, "CONFIGURING"),
    (JobState::Completing, "COMPLETING"),
    (JobState::Deadline, "DEADLINE"),
    (JobState::Failed, "FAILED"),
    (JobState::NodeFail, "NODE_FAIL"),
    (JobState::OutOfMemory, "OUT_OF_MEMORY"),
    (JobState::Pending, "PENDING"),
    (JobState::Preempted, "PREEMPTED"),
    (JobState::Running, "RUNNING"),
    (JobState::ResvDelHold, "RESV_DEL_HOLD"),
    (JobState::RequeueFed, "REQUEUE_FED"),
    (JobState::RequeueHold, "REQUEUE_HOLD"),
    (JobState::Requeued, "REQUEUED"),
    (JobState::Resizing, "RESIZING"),
    (JobState::Revoked, "REVOKED"),
    (JobState::Signaling, "SIGNALING"),
    (JobState::SpecialExit, "SPECIAL_EXIT"),
    (JobState::StageOut, "STAGE_OUT"),
    (JobState::Stopped, "STOPPED"),
    (JobState::Suspended, "SUSPENDED"),
    (JobState::Timeout, "TIMEOUT"),
];

impl JobState {
    /// Slurm's name for it, e.g. `OUT_OF_MEMORY`.
    pub fn name(self) -> &'static str {
        NAMES.iter().find(|(s, _)| *s == self).map_or("", |(_, n)| n)
    }

    /// Whether the job will not run again (it ended; a requeued job is `PENDING` or
    /// `REQUEUED` again, never in one of these).
    pub fn is_terminal(self) -> bool {
        use JobState::*;
        matches!(
            self,
            BootFail | Cancelled | Completed | Deadline | Failed | NodeFail | OutOfMemory | Preempted | Timeout
        )
    }

    /// Whether the job waits for its resources (submitted, requeued, held or suspended)
    /// rather than runs.
    pub fn waits(self) -> bool {
        use JobState::*;
        matches!(self, Pending | Requeued | RequeueHold | RequeueFed | Suspended)
    }

    /// Whether Slurm is requeueing the job (`REQUEUED`, `REQUEUE_HOLD`, `REQUEUE_FED`).
    pub fn requeueing(self) -> bool {
        matches!(self, JobState::Requeued | JobState::RequeueHold | JobState::RequeueFed)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for JobState {
    type Err = LaunchError;

    /// Slurm's name of a state; an unknown one is an error naming it.
    fn from_str(text: &str) -> Result<JobState, LaunchError> {
        NAMES.iter().find(|(_, n)| *n == text).map(|(s, _)| *s).ok_or_else(|| {
            LaunchError::Slurm(format!("job state `{text}` is none Slurm documents (squeue(1), JOB STATE CODES)"))
        })
    }
}
