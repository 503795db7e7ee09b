//! A job's lifecycle after one of its runs ended: the one, pure rule (no I/O) of what
//! the job becomes — finished, queued again (with or without spending a retry, with a
//! plan it refused marked unsupported), or failed — and why, in words for `status`.
//! The callers observe (the backend's exit and scheduler, the run's log and metric
//! lines, classified once by [`rubick_launch::end::classify`]) and hand the run's
//! [`RunStatus`] here.

use rubick_launch::RunStatus;

use crate::MAX_REFUSED_PLANS;
use crate::state::{JobRecord, JobStatus};

/// How far a run that ended got, as its metric lines say: what tells a job that is done
/// from one that exited 0 short of its iterations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reached {
    /// The highest iteration any of the job's runs reported (this one included).
    pub iterations_done: u64,
    /// Whether this run reported an iteration of its own.
    pub progressed: bool,
    /// The iteration of this run's last checkpoint, when it reported one.
    pub checkpointed: Option<u64>,
}

/// The job after its run ended with `status` (its exit code `code`, none when unknown)
/// having `reached` so far: status, reason, exit code, retries and unsupported plans
/// updated, the run cleared.
///
/// Exit 0 is the job done only when its metric lines reach its iterations (or it never
/// reported any: then its word is all there is). Short of them, exit 0 is a stop
/// rubick-run did not send (a user's signal, a framework's at shutdown): after a
/// checkpoint and some progress of its own, the job is queued to resume (no retry
/// spent); without either, it is a failure (a retry spent), so that a script that
/// always exits early cannot be restarted for ever.
pub fn after(rec: &mut JobRecord, code: Option<i32>, status: RunStatus, reached: Reached) {
    let plan = rec.run.as_ref().map(|r| r.plan);
    let plan_text = plan.map_or_else(String::new, |p| p.to_string());
    let name = rec.job.name.clone();
    rec.exit_code = code;
    let exit = code.map_or_else(|| "no exit code".to_owned(), |c| format!("exit {c}"));
    let (status, reason) = match status {
        RunStatus::Preempted => {
            tracing::warn!("`{name}` was preempted by the backend's scheduler: queued again");
            (JobStatus::Queued, "preempted by the backend's scheduler (or its node failed)".to_owned())
        }
        RunStatus::Ok if reached.iterations_done == 0 || reached.iterations_done >= rec.job.iterations => {
            (JobStatus::Finished, "finished".to_owned())
        }
        RunStatus::Ok if reached.progressed && reached.checkpointed.is_some() => {
            let (done, total) = (reached.iterations_done, rec.job.iterations);
            tracing::warn!(
                "`{name}` exited 0 at iteration {done} of {total} after a checkpoint: stopped by a signal rubick-run did not send; queued to resume"
            );
            (
                JobStatus::Queued,
                format!(
                    "exit 0 at iteration {done} of {total} after its checkpoint at {}: stopped by someone else (a signal rubick-run did not send); queued to resume",
                    reached.checkpointed.unwrap_or(done)
                ),
            )
        }
        RunStatus::Ok => {
            let (done, total) = (reached.iterations_done, rec.job.iterations);
            let what = if reached.progressed { "without a checkpoint" } else { "without progress" };
            let short = format!("exit 0 at iteration {done} of {total} {what}");
            if rec.retries_left > 0 {
                rec.retries_left -= 1;
                tracing::warn!("`{name}`: {short}: not finished; retried ({} retries left)", rec.retries_left);
                (JobStatus::Queued, format!("{short} under {plan_text}: retried ({} retries left)", rec.retries_left))
            } else {
                (JobStatus::Failed, format!("{short} under {plan_text}: not finished, no retries left"))
            }
        }
        // Exit 2 is about the plan: never offered again; another plan may run. A script
        // that refuses plan after plan has a bad argument, not a bad plan.
        RunStatus::Unsupported if let Some(plan) = plan => {
            if !rec.job.unsupported_plans.contains(&plan) {
                rec.job.unsupported_plans.push(plan);
            }
            let status = if rec.job.unsupported_plans.len() >= MAX_REFUSED_PLANS {
                tracing::error!(
                    "`{name}` refused {} plans (exit 2 each: {}); failed: its arguments, not a plan, are likely wrong",
                    rec.job.unsupported_plans.len(),
                    rec.job.unsupported_plans.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                );
                JobStatus::Failed
            } else {
                tracing::warn!(
                    "`{name}` exited 2 under `{plan}` (the contract's bad plan): the plan is marked unsupported and never offered again; queued for another"
                );
                JobStatus::Queued
            };
            (status, format!("{exit}: the script refused plan {plan} (bad plan)"))
        }
        RunStatus::Unsupported => (JobStatus::Failed, format!("{exit}: bad arguments")),
        RunStatus::Oom => (JobStatus::Failed, format!("{exit}: out of memory under {plan_text}")),
        RunStatus::NotRunnable => (
            JobStatus::Failed,
            format!("{exit}: the command could not be run (not found or not executable; see the log)"),
        ),
        // The work is done and saved: a crash in the script's teardown after its last
        // iteration and its checkpoint there (gloo's threads aborting a rank at the
        // interpreter's exit) does not undo it, and a retry would resume at the end.
        RunStatus::Failed
            if reached.progressed
                && reached.iterations_done >= rec.job.iterations
                && reached.checkpointed.is_some_and(|c| c >= rec.job.iterations) =>
        {
            let total = rec.job.iterations;
            tracing::warn!(
                "`{name}` reached its {total} iterations and its checkpoint there, then failed ({exit}): finished (see its log for the crash at exit)"
            );
            (
                JobStatus::Finished,
                format!(
                    "finished: {exit} after its last iteration ({total}) and its checkpoint there (a crash at exit)"
                ),
            )
        }
        RunStatus::Failed | RunStatus::Timeout if rec.retries_left > 0 => {
            rec.retries_left -= 1;
            tracing::warn!("`{name}` failed ({exit}): retryable, queued again ({} retries left)", rec.retries_left);
            (JobStatus::Queued, format!("{exit} under {plan_text}: retried ({} retries left)", rec.retries_left))
        }
        RunStatus::Failed | RunStatus::Timeout => {
            (JobStatus::Failed, format!("{exit} under {plan_text}: no retries left"))
        }
    };
    settle(rec, status, reason);
}

/// The job after its live run was lost: its node failed and it cannot go on where it
/// was placed (the backend's reason `why`); the caller has killed it. Queued again, no
/// retry spent, the exit code of the last run that exited kept.
pub fn lost(rec: &mut JobRecord, why: &str) {
    let attempt = rec.run.as_ref().map_or(0, |r| r.attempt);
    tracing::warn!("`{}`: run {attempt} lost its node ({why}): queued again, no retry spent", rec.job.name);
    settle(rec, JobStatus::Queued, format!("node failure under run {attempt}: {why}"));
}

/// The job's new status and reason; its run cleared.
fn settle(rec: &mut JobRecord, status: JobStatus, reason: String) {
    tracing::info!("`{}` ended: {} ({reason})", rec.job.name, format!("{status:?}").to_lowercase());
    rec.status = status;
    rec.reason = Some(reason);
    rec.run = None;
}

/// A record of job `a` with a run of plan dp2 on node `n-0` (attempt `attempt`, in
/// `phase`, with `handle` when given), `retries` left and `refused` plans unsupported;
/// its launch section's stop timeout 1 s (the tests of the lifecycle and of `refresh`).
#[cfg(test)]
pub(crate) fn record(attempt: u32, phase: &str, handle: Option<&str>, retries: u32, refused: &[&str]) -> JobRecord {
    let handle = handle.map_or(String::new(), |h| format!(", handle: '{h}'"));
    let text = format!(
        "job:
  apiVersion: rubick/v1
  kind: Job
  name: a
  model: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}
  iterations: 100
  request: {{ gpus: 1, plan: ga }}
  launch: {{ version: 1, command: [train], stopTimeoutS: 1 }}
  unsupportedPlans: {refused:?}
status: running
run: {{ plan: dp2-tp1-pp1-mb4-ga2, nodes: [{{ node: n-0, gpus: [0, 1], cpus: 2, hostMemoryGib: 1 }}], attempt: {attempt}, phase: {phase}, startedUnixS: 0{handle} }}
attempts: {attempt}
retriesLeft: {retries}
"
    );
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job running attempt 2 of plan dp2 with `retries` left and `refused` plans
    /// already unsupported.
    fn running(retries: u32, refused: &[&str]) -> JobRecord {
        record(2, "running", None, retries, refused)
    }

    /// How a run of the tests ended: with an exit code and status, or lost.
    #[derive(Debug, Clone)]
    enum How {
        Ran(Option<i32>, RunStatus),
        Lost(&'static str),
    }

    fn end(rec: &mut JobRecord, end: &How) {
        match end {
            How::Ran(code, status) => {
                after(rec, *code, *status, Reached { iterations_done: 100, ..Reached::default() })
            }
            How::Lost(why) => lost(rec, why),
        }
    }

    fn exited(code: i32, status: RunStatus) -> How {
        How::Ran(Some(code), status)
    }

    #[test]
    fn every_end_leads_to_one_state_and_says_why() {
        // (ended how, retries before, refused before) -> (status, retries after, unsupported after, reason holds)
        type Case<'a> = (How, u32, Vec<&'a str>, JobStatus, u32, usize, &'a str);
        let cases: Vec<Case> = vec![
            (exited(0, RunStatus::Ok), 1, vec![], JobStatus::Finished, 1, 0, "finished"),
            (exited(1, RunStatus::Failed), 1, vec![], JobStatus::Queued, 0, 0, "retried (0 retries left)"),
            (exited(1, RunStatus::Failed), 0, vec![], JobStatus::Failed, 0, 0, "no retries left"),
            (How::Ran(None, RunStatus::Timeout), 1, vec![], JobStatus::Queued, 0, 0, "retried (0 retries left)"),
            (exited(2, RunStatus::Unsupported), 1, vec![], JobStatus::Queued, 1, 1, "refused plan dp2"),
            (
                exited(2, RunStatus::Unsupported),
                1,
                vec!["dp1-tp1-pp1-mb4-ga4", "dp1-tp1-pp1-mb2-ga8"],
                JobStatus::Failed,
                1,
                3,
                "bad plan",
            ),
            (exited(3, RunStatus::Oom), 1, vec![], JobStatus::Failed, 1, 0, "out of memory under dp2"),
            (exited(127, RunStatus::NotRunnable), 1, vec![], JobStatus::Failed, 1, 0, "could not be run"),
            (How::Ran(None, RunStatus::Preempted), 0, vec![], JobStatus::Queued, 0, 0, "preempted"),
            (How::Lost("mn2 down"), 0, vec![], JobStatus::Queued, 0, 0, "node failure under run 2: mn2"),
        ];
        for (how, retries, refused, status, retries_after, unsupported, why) in cases {
            let mut rec = running(retries, &refused);
            end(&mut rec, &how);
            assert_eq!(rec.status, status, "{how:?}");
            assert_eq!(rec.retries_left, retries_after, "{how:?}: the retry budget");
            assert_eq!(rec.job.unsupported_plans.len(), unsupported, "{how:?}");
            assert!(rec.reason.as_deref().is_some_and(|r| r.contains(why)), "{how:?}: {:?}", rec.reason);
            assert!(rec.run.is_none(), "{how:?}: the run is over");
        }
    }

    /// Found by an adversarial pass: "a run that checkpoints and exits 0 after a signal
    /// rubick-run did not send (a user's `kill -USR1`, a torchtitan rank's SIGTERM at
    /// shutdown) is recorded `finished` at 11 of 100000 iterations and never scheduled
    /// again".
    #[test]
    fn exit_0_is_finished_only_once_the_iterations_are_reached() {
        let reached = |done: u64, progressed: bool, checkpointed: Option<u64>| Reached {
            iterations_done: done,
            progressed,
            checkpointed,
        };
        // (what it reached, retries) -> (status, retries after, reason holds)
        let cases = [
            (reached(100, true, Some(100)), 1, JobStatus::Finished, 1, "finished"),
            (reached(0, false, None), 1, JobStatus::Finished, 1, "finished"),
            (reached(11, true, Some(11)), 1, JobStatus::Queued, 1, "iteration 11 of 100 after its checkpoint at 11"),
            (reached(11, true, Some(11)), 0, JobStatus::Queued, 0, "stopped by someone else"),
            (reached(11, true, None), 1, JobStatus::Queued, 0, "without a checkpoint"),
            (reached(11, false, Some(11)), 1, JobStatus::Queued, 0, "without progress"),
            (reached(11, false, Some(11)), 0, JobStatus::Failed, 0, "not finished, no retries left"),
        ];
        for (r, retries, status, retries_after, why) in cases {
            let mut rec = running(retries, &[]);
            after(&mut rec, Some(0), RunStatus::Ok, r);
            assert_eq!((rec.status, rec.retries_left), (status, retries_after), "{r:?}");
            assert!(rec.reason.as_deref().is_some_and(|x| x.contains(why)), "{r:?}: {:?}", rec.reason);
        }
    }

    /// A script that reached its iterations, saved there, then crashed at exit (a
    /// Hugging Face Trainer job whose gloo threads abort a rank in the interpreter's
    /// teardown: exit 1 after iteration 400 of 400) is finished, not retried; short of
    /// its iterations, or without that last checkpoint, the failure is retried.
    #[test]
    fn a_crash_at_exit_after_the_last_iteration_and_its_checkpoint_is_finished() {
        let reached =
            |done: u64, checkpointed: Option<u64>| Reached { iterations_done: done, progressed: true, checkpointed };
        let cases = [
            (reached(100, Some(100)), JobStatus::Finished, 1, "exit 1 after its last iteration (100)"),
            (reached(100, Some(90)), JobStatus::Queued, 0, "retried"),
            (reached(100, None), JobStatus::Queued, 0, "retried"),
            (reached(99, Some(99)), JobStatus::Queued, 0, "retried"),
        ];
        for (r, status, retries_after, why) in cases {
            let mut rec = running(1, &[]);
            after(&mut rec, Some(1), RunStatus::Failed, r);
            assert_eq!((rec.status, rec.retries_left), (status, retries_after), "{r:?}");
            assert!(rec.reason.as_deref().is_some_and(|x| x.contains(why)), "{r:?}: {:?}", rec.reason);
        }
    }

    #[test]
    fn a_plan_refused_twice_is_recorded_once_and_the_exit_code_is_kept() {
        let mut rec = running(1, &["dp2-tp1-pp1-mb4-ga2"]);
        end(&mut rec, &exited(2, RunStatus::Unsupported));
        assert_eq!(rec.job.unsupported_plans.len(), 1);
        assert_eq!((rec.status, rec.exit_code), (JobStatus::Queued, Some(2)));
        // A node failure keeps the exit code of the last run that exited.
        let mut rec = running(1, &[]);
        rec.exit_code = Some(1);
        end(&mut rec, &How::Lost("gone"));
        assert_eq!(rec.exit_code, Some(1));
    }
}
