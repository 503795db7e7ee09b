//! A job's lifecycle after one of its runs ended: the one, pure rule (no I/O) of what
//! the job becomes — finished, queued again (with or without spending a retry, with a
//! plan it refused marked unsupported), or failed — and why, in words for `status`.
//! The callers observe (the backend's exit code and scheduler, the run's log and metric
//! lines through [`crate::classify`]) and hand the observation here.

use crate::state::{JobRecord, JobStatus};
use crate::{Failure, MAX_REFUSED_PLANS};

/// How a run ended, as observed.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// On its own: its exit code (none when unknown) and how that is classified (none:
    /// success).
    Exited { code: Option<i32>, failure: Option<Failure> },
    /// Ended by the backend's scheduler to make room, or because its node failed
    /// (Slurm's `PREEMPTED`, `NODE_FAIL`): not the job's fault.
    Preempted { code: Option<i32> },
    /// Alive but stranded: its node failed and it cannot go on where it was placed (the
    /// backend's reason); the caller has killed it.
    Lost { why: String },
}

/// The job after its run ended: status, reason, exit code, retries and unsupported
/// plans updated, the run cleared.
pub fn after(rec: &mut JobRecord, end: Ended) {
    let plan = rec.run.as_ref().map(|r| r.plan);
    let plan_text = plan.map_or_else(String::new, |p| p.to_string());
    let attempt = rec.run.as_ref().map_or(0, |r| r.attempt);
    let name = rec.job.name.clone();
    let (status, reason) = match end {
        Ended::Lost { why } => {
            tracing::warn!("`{name}`: run {attempt} lost its node ({why}): queued again, no retry spent");
            (JobStatus::Queued, format!("node failure under run {attempt}: {why}"))
        }
        Ended::Preempted { code } => {
            rec.exit_code = code;
            tracing::warn!("`{name}` was preempted by the backend's scheduler: queued again");
            (JobStatus::Queued, "preempted by the backend's scheduler (or its node failed)".to_owned())
        }
        Ended::Exited { code, failure } => {
            rec.exit_code = code;
            let exit = code.map_or_else(|| "no exit code".to_owned(), |c| format!("exit {c}"));
            match failure {
                None => (JobStatus::Finished, "finished".to_owned()),
                // Exit 2 is about the plan: never offered again; another plan may run. A
                // script that refuses plan after plan has a bad argument, not a bad plan.
                Some(Failure::BadInput) if let Some(plan) = plan => {
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
                Some(Failure::BadInput) => (JobStatus::Failed, format!("{exit}: bad arguments")),
                Some(Failure::OutOfMemory) => (JobStatus::Failed, format!("{exit}: out of memory under {plan_text}")),
                Some(Failure::NotRunnable) => (
                    JobStatus::Failed,
                    format!("{exit}: the command could not be run (not found or not executable; see the log)"),
                ),
                Some(Failure::Retryable) if rec.retries_left > 0 => {
                    rec.retries_left -= 1;
                    tracing::warn!(
                        "`{name}` failed ({exit}): retryable, queued again ({} retries left)",
                        rec.retries_left
                    );
                    (
                        JobStatus::Queued,
                        format!("{exit} under {plan_text}: retried ({} retries left)", rec.retries_left),
                    )
                }
                Some(Failure::Retryable) => (JobStatus::Failed, format!("{exit} under {plan_text}: no retries left")),
            }
        }
    };
    tracing::info!("`{name}` ended: {} ({reason})", format!("{status:?}").to_lowercase());
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

    fn exited(code: i32, failure: Option<Failure>) -> Ended {
        Ended::Exited { code: Some(code), failure }
    }

    #[test]
    fn every_end_leads_to_one_state_and_says_why() {
        // (ended how, retries before, refused before) -> (status, retries after, unsupported after, reason holds)
        type Case<'a> = (Ended, u32, Vec<&'a str>, JobStatus, u32, usize, &'a str);
        let cases: Vec<Case> = vec![
            (exited(0, None), 1, vec![], JobStatus::Finished, 1, 0, "finished"),
            (exited(1, Some(Failure::Retryable)), 1, vec![], JobStatus::Queued, 0, 0, "retried (0 retries left)"),
            (exited(1, Some(Failure::Retryable)), 0, vec![], JobStatus::Failed, 0, 0, "no retries left"),
            (exited(2, Some(Failure::BadInput)), 1, vec![], JobStatus::Queued, 1, 1, "refused plan dp2"),
            (
                exited(2, Some(Failure::BadInput)),
                1,
                vec!["dp1-tp1-pp1-mb4-ga4", "dp1-tp1-pp1-mb2-ga8"],
                JobStatus::Failed,
                1,
                3,
                "bad plan",
            ),
            (exited(3, Some(Failure::OutOfMemory)), 1, vec![], JobStatus::Failed, 1, 0, "out of memory under dp2"),
            (exited(127, Some(Failure::NotRunnable)), 1, vec![], JobStatus::Failed, 1, 0, "could not be run"),
            (Ended::Preempted { code: None }, 0, vec![], JobStatus::Queued, 0, 0, "preempted"),
            (
                Ended::Lost { why: "mn2 down".into() },
                0,
                vec![],
                JobStatus::Queued,
                0,
                0,
                "node failure under run 2: mn2",
            ),
        ];
        for (end, retries, refused, status, retries_after, unsupported, why) in cases {
            let mut rec = running(retries, &refused);
            after(&mut rec, end.clone());
            assert_eq!(rec.status, status, "{end:?}");
            assert_eq!(rec.retries_left, retries_after, "{end:?}: the retry budget");
            assert_eq!(rec.job.unsupported_plans.len(), unsupported, "{end:?}");
            assert!(rec.reason.as_deref().is_some_and(|r| r.contains(why)), "{end:?}: {:?}", rec.reason);
            assert!(rec.run.is_none(), "{end:?}: the run is over");
        }
    }

    #[test]
    fn a_plan_refused_twice_is_recorded_once_and_the_exit_code_is_kept() {
        let mut rec = running(1, &["dp2-tp1-pp1-mb4-ga2"]);
        after(&mut rec, exited(2, Some(Failure::BadInput)));
        assert_eq!(rec.job.unsupported_plans.len(), 1);
        assert_eq!((rec.status, rec.exit_code), (JobStatus::Queued, Some(2)));
        // A node failure keeps the exit code of the last run that exited.
        let mut rec = running(1, &[]);
        rec.exit_code = Some(1);
        after(&mut rec, Ended::Lost { why: "gone".into() });
        assert_eq!(rec.exit_code, Some(1));
    }
}
