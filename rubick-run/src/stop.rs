//! `rubick-run stop` and `delete`: one job's run stopped (the record kept), or the
//! job removed once nothing of it runs.

use anyhow::{Context, bail};
use rubick_io::cli::Outcome;

use crate::runs::{self, Look, refresh, refreshed, stop_run};
use crate::state::JobStatus;
use crate::{StateArgs, record};

pub(crate) fn delete_job(job: &str, args: &StateArgs) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    let (mut state, _) = refreshed(&dir, Look::Last)?;
    let rec = record(&dir, &state, job)?;
    if matches!(rec.status, JobStatus::Queued | JobStatus::Running) {
        bail!("`{job}` is {:?}; stop it first (`rubick-run stop {job}`)", rec.status);
    }
    // The record goes first: a crash then leaves files of no job, never a job without
    // its files.
    state.jobs.remove(job);
    dir.save(&state)?;
    let files = dir.job_dir(job);
    if files.exists() {
        std::fs::remove_dir_all(&files).with_context(|| format!("{}: cannot remove it", files.display()))?;
    }
    eprintln!("{job}: deleted");
    Ok(Outcome::Done)
}

pub(crate) fn stop_job(job: &str, args: &StateArgs) -> anyhow::Result<Outcome> {
    let dir = locked!(args, false);
    // A stop signals first and records after: what the refresh learnt (another run's
    // end) is written when it can be, never before the signal (a full disk).
    let mut state = dir.load()?;
    let backend = runs::state_backend(&dir, &state)?;
    refresh(&dir, &mut state, backend.as_ref(), Look::Last)?;
    if let Err(e) = dir.save(&state) {
        tracing::warn!("{e:#}: stopping `{job}` all the same; the state is written when it can be");
    }
    let was = record(&dir, &state, job)?.status;
    // The intent first, saved with the run's phase (stopping) before any signal: a stop
    // killed midway is finished as a stop by the next command, never repaired into a
    // pause that a round would start again.
    if matches!(was, JobStatus::Queued | JobStatus::Running) {
        let rec = state.jobs.get_mut(job).context("record")?;
        rec.status = JobStatus::Stopped;
        rec.reason = Some("stopped by `rubick-run stop`".into());
    }
    if let Some((secs, clean)) = stop_run(&dir, &mut state, job, backend.as_ref())? {
        eprintln!("{job}: stopped in {secs:.1} s{}", if clean { "" } else { " (killed after stopTimeoutS)" });
    }
    dir.save(&state)?;
    Ok(Outcome::Done)
}
