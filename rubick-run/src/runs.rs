//! What the records say of the runs: brought up to date with the backend (`refresh`),
//! stopped (`stop_runs`, every run of a round at once), and how a run ended (`classify`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use rubick_core::Job;

use rubick_launch::contract::METRICS_FILE;
use rubick_launch::metrics::{self, Progress};

use crate::backends::{self, Executor};
use crate::failpoint;
use crate::lifecycle;
use crate::state::{JobRecord, JobStatus, Reconfiguration, RunPhase, RunRecord, State, StateDir};

use backends::{Exit, Handle, RunState};

/// What one look at each live run read of its metric lines (by job): a command reads a
/// run's metrics once, and what it reports of the run comes from this look.
pub(crate) type Seen = BTreeMap<String, Progress>;

/// How much of a live run's metrics a command needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Look {
    /// Its last iteration (what the records keep): [`metrics::last`].
    Last,
    /// Its recent iterations' mean time and loss too (`status`): [`metrics::progress`].
    Recent,
}

/// Brings the records up to date with the backend: runs that ended, runs a killed
/// rubick-run started but never recorded, stops it never finished. Each run's metric
/// lines are read once: the tail a live run's `look` needs, or what the end of one that
/// ended needs ([`metrics::at_end`]).
pub(crate) fn refresh(dir: &StateDir, state: &mut State, backend: &dyn Executor, look: Look) -> anyhow::Result<Seen> {
    let mut unfinished = Vec::new();
    let mut seen = Seen::new();
    let mut looked = look_at_running(dir, state, backend, look);
    for (name, rec) in &mut state.jobs {
        let Some(run) = rec.run.clone() else { continue };
        let attempt_dir = dir.attempt_dir(name, run.attempt);
        let nodes: Vec<String> = run.nodes.iter().map(|n| n.node.clone()).collect();
        let recover = || backend.recover(&attempt_dir, backends::run_name(&attempt_dir).as_deref());
        let look = |rec: &mut JobRecord| {
            let path = attempt_dir.join(METRICS_FILE);
            let progress = match look {
                Look::Last => metrics::last(&path, rec.job.iterations),
                Look::Recent => metrics::progress(&path, rec.job.iterations),
            };
            rec.iterations_done = rec.iterations_done.max(progress.last.unwrap_or(0));
            progress
        };
        match run.phase {
            // A run whose start was recorded but not its handle: spawned (its wrapper
            // records its group first thing: give it a moment when the spawn began,
            // i.e. its log exists) or never started.
            RunPhase::Starting => {
                let found = recover().or_else(|| {
                    attempt_dir.join("log.txt").exists().then(|| {
                        std::thread::sleep(Duration::from_millis(1500));
                        recover()
                    })?
                });
                match found.map(|h| (backend.poll(&h, &attempt_dir, &nodes), h)) {
                    Some((RunState::Ended(end), _)) => ended(rec, end, &attempt_dir),
                    Some((_, handle)) => {
                        tracing::warn!("`{name}`: adopting run {} started by an interrupted rubick-run", run.attempt);
                        if let Some(r) = rec.run.as_mut() {
                            r.handle = Some(handle.to_string());
                            r.phase = RunPhase::Running;
                        }
                        seen.insert(name.clone(), look(rec));
                    }
                    None => {
                        tracing::warn!(
                            "`{name}`: run {} was never started (interrupted rubick-run); queued again",
                            run.attempt
                        );
                        rec.run = None;
                        rec.status = JobStatus::Queued;
                    }
                }
            }
            RunPhase::Running => {
                // One look at the run (taken above, with the others'): ended (its exit
                // code is written as its last act: ended, even if a wrapper lingers),
                // stranded, or running on.
                let Some(Looked { handle, state: run_state, progress }) = looked.remove(name) else { continue };
                let Some(handle) = handle else {
                    ended(rec, Exit::default(), &attempt_dir);
                    continue;
                };
                let look = |rec: &mut JobRecord| match progress {
                    Some(p) => {
                        rec.iterations_done = rec.iterations_done.max(p.last.unwrap_or(0));
                        p
                    }
                    None => look(rec),
                };
                match run_state {
                    RunState::Ended(_) if attempt_dir.join(STOP_MARK).exists() => {
                        tracing::warn!("`{name}`: run {} ended by a stop that could not write the state", run.attempt);
                        look(rec);
                        rec.run = None;
                        rec.status = JobStatus::Stopped;
                        rec.reason = Some("stopped by `rubick-run stop`".into());
                    }
                    RunState::Ended(end) => ended(rec, end, &attempt_dir),
                    RunState::Stranded(why) => {
                        look(rec);
                        lost(rec, backend, &handle, &why);
                    }
                    RunState::Unknown(why) => {
                        tracing::warn!("`{name}`: {why} (taken for running)");
                        seen.insert(name.clone(), look(rec));
                    }
                    RunState::Waiting | RunState::Running => {
                        let progress = look(rec);
                        if let Some(last) =
                            rec.reconfigurations.last_mut().filter(|r| r.first_iteration_s.is_none() && r.to.is_some())
                        {
                            last.first_iteration_s =
                                first_iteration_s(&attempt_dir, &progress, run.started_unix_s, rec.job.iterations);
                        }
                        judge_move(dir, name, rec, &run);
                        seen.insert(name.clone(), progress);
                    }
                }
            }
            RunPhase::Stopping => {
                tracing::warn!("`{name}`: finishing the stop an interrupted rubick-run began");
                unfinished.push(name.clone());
            }
        }
    }
    let unfinished: Vec<&str> = unfinished.iter().map(String::as_str).collect();
    stop_runs(dir, state, &unfinished, backend)?;
    // Runs without a record can live only where the state is not the file this build
    // last wrote or checked (restored, edited), or where a round's starts were
    // interrupted (their intent is there): only then is every process searched (a
    // no-op round spends nothing on it). Decided when the state was read, before any
    // save above sealed it.
    if dir.needs_search() {
        if backend.name() == "local" {
            stop_unrecorded(dir, state);
        }
        dir.searched();
    }
    Ok(seen)
}

/// One look at a running run: its handle (recorded, else recovered from its directory),
/// what its backend says of it, and, while it runs, what its metric lines say.
struct Looked {
    handle: Option<Handle>,
    state: RunState,
    progress: Option<Progress>,
}

/// [`Looked`] of every run in phase running, taken on a few threads when there are many
/// (each look reads a few small files: a hundred runs take milliseconds one after
/// another, a round's whole wait on a machine of several cores).
fn look_at_running(dir: &StateDir, state: &State, backend: &dyn Executor, look: Look) -> BTreeMap<String, Looked> {
    let runs: Vec<(&String, &JobRecord, &RunRecord)> = state
        .jobs
        .iter()
        .filter_map(|(name, rec)| rec.run.as_ref().filter(|r| r.phase == RunPhase::Running).map(|r| (name, rec, r)))
        .collect();
    let one = |&(name, rec, run): &(&String, &JobRecord, &RunRecord)| {
        let attempt_dir = dir.attempt_dir(name, run.attempt);
        let handle = run
            .handle
            .as_deref()
            .and_then(|h| backend.handle(h))
            .or_else(|| backend.recover(&attempt_dir, backends::run_name(&attempt_dir).as_deref()));
        let nodes: Vec<String> = run.nodes.iter().map(|n| n.node.clone()).collect();
        let run_state =
            handle.as_ref().map_or(RunState::Ended(Exit::default()), |h| backend.poll(h, &attempt_dir, &nodes));
        let progress = matches!(run_state, RunState::Waiting | RunState::Running | RunState::Unknown(_)).then(|| {
            let path = attempt_dir.join(METRICS_FILE);
            match look {
                Look::Last => metrics::last(&path, rec.job.iterations),
                Look::Recent => metrics::progress(&path, rec.job.iterations),
            }
        });
        (name.clone(), Looked { handle, state: run_state, progress })
    };
    const PER_THREAD: usize = 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8).min(runs.len() / PER_THREAD);
    if threads <= 1 {
        return runs.iter().map(one).collect();
    }
    let chunk = runs.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> =
            runs.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(one).collect::<Vec<_>>())).collect();
        parts.into_iter().flat_map(|p| p.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// Runs of this state's jobs that live without a record (a state restored from a
/// backup, an edited cache): found by their mark, stopped (the contract's signal, its
/// timeout, then KILL), so that nothing runs that no record knows of: a stop of the job
/// reaches them, a delete orphans nothing, a new start is never a second copy.
fn stop_unrecorded(dir: &StateDir, state: &State) {
    let jobs = dir.root.join("jobs");
    let prefix = format!("{}/", jobs.display());
    let mut orphans: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for (_, mark) in rubick_launch::proc::marked_under(&prefix) {
        let Some(rest) = mark.strip_prefix(&prefix) else { continue };
        let mut parts = rest.split('/');
        let (Some(job), Some(attempt)) = (parts.next(), parts.next()) else { continue };
        let attempt = attempt.strip_prefix("attempt-").and_then(|a| a.parse::<u32>().ok()).unwrap_or(0);
        let recorded = state.jobs.get(job).and_then(|r| r.run.as_ref()).is_some_and(|r| r.attempt == attempt);
        if !recorded {
            orphans.entry(mark.clone()).or_insert((job.to_owned(), attempt));
        }
    }
    for (mark, (job, attempt)) in orphans {
        let (signal, timeout) =
            state.jobs.get(&job).map_or((Default::default(), Duration::from_secs(120)), |r| stop_settings(&r.job));
        tracing::warn!(
            "`{job}`: run {attempt} lives without a record (a state restored or edited?): stopping it ({:.0} s at most)",
            timeout.as_secs_f64()
        );
        use rubick_launch::proc::{RunSignal, marked_processes, signal_run};
        signal_run(&mark, RunSignal::Stop(signal));
        let start = Instant::now();
        while !marked_processes(&mark).is_empty() && start.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !marked_processes(&mark).is_empty() {
            signal_run(&mark, RunSignal::Kill);
        }
    }
}

/// Seconds from a run's start to its first metric line: the metrics file's last change,
/// less the iterations written since (the last one's number, from `progress`, less the
/// first's: the file's head and tail, never all of it) at their mean time (exact when
/// one line is there).
pub(crate) fn first_iteration_s(
    attempt_dir: &Path,
    progress: &Progress,
    started_unix_s: f64,
    iterations: u64,
) -> Option<f64> {
    let last = progress.last?;
    let path = attempt_dir.join(METRICS_FILE);
    let first_iter = metrics::first_iteration(&path, iterations)?;
    let modified =
        std::fs::metadata(&path).ok()?.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    let since = last.saturating_sub(first_iter);
    let first = modified - (since as f64) * progress.recent_iter_time_s.unwrap_or(0.0);
    (first >= started_unix_s).then_some(first - started_unix_s)
}

/// The job's stop signal and how long it may take to checkpoint and exit (the
/// contract's defaults for a job without a launch section).
pub(crate) fn stop_settings(job: &Job) -> (rubick_core::launch::StopSignal, Duration) {
    job.launch.as_ref().map_or((Default::default(), Duration::from_secs(120)), |l| {
        (l.stop_signal, rubick_core::launch::duration(l.stop_timeout_s))
    })
}

/// Stops the job's run (see [`stop_runs`]); `(seconds, exited cleanly)`, or `None`
/// when the job has no run.
pub(crate) fn stop_run(
    dir: &StateDir,
    state: &mut State,
    job: &str,
    backend: &dyn Executor,
) -> anyhow::Result<Option<(f64, bool)>> {
    Ok(stop_runs(dir, state, &[job], backend)?.pop().flatten())
}

/// The empty file a stop for good leaves in its run's directory when it could not write
/// the state: the run's end is then the stop's, not its own.
pub(crate) const STOP_MARK: &str = "stopped-for-good";

/// Stops the runs of `jobs` together: every intent recorded durably first (phase
/// stopping, which an interrupted rubick-run finishes next time), then each run asked
/// to stop (the contract's signal, `stopTimeoutS`, KILL of what is left) on a thread of
/// its own, so the round waits for the slowest checkpoint, not for their sum; then what
/// each cost recorded and the jobs queued. Per job, in the order given: `(seconds,
/// exited cleanly)`, or `None` when it had no run.
pub(crate) fn stop_runs(
    dir: &StateDir,
    state: &mut State,
    jobs: &[&str],
    backend: &dyn Executor,
) -> anyhow::Result<Vec<Option<(f64, bool)>>> {
    let mut runs = Vec::new();
    for (k, &job) in jobs.iter().enumerate() {
        let rec = state.jobs.get_mut(job).with_context(|| format!("`{job}` is not a job of {}", dir.root.display()))?;
        let (signal, timeout) = stop_settings(&rec.job);
        let Some(run) = rec.run.as_mut() else { continue };
        run.phase = RunPhase::Stopping;
        let handle = run.handle.as_deref().and_then(|h| backend.handle(h));
        runs.push((k, run.clone(), handle, dir.attempt_dir(job, run.attempt), signal, timeout));
    }
    let mut out = vec![None; jobs.len()];
    if runs.is_empty() {
        return Ok(out);
    }
    // A stop needs no state write to signal: when the state cannot be written (a full
    // disk, perhaps filled by the very run to stop), a stop for good leaves an empty
    // mark in the run's directory (no data block needed) that the next command reads.
    if let Err(e) = dir.save(state) {
        tracing::warn!("{e:#}: the runs are stopped all the same; the state is written when it can be");
        for (k, run, ..) in &runs {
            let for_good = state.jobs.get(jobs[*k]).is_some_and(|r| r.status == JobStatus::Stopped);
            if for_good {
                let _ = std::fs::File::create(dir.attempt_dir(jobs[*k], run.attempt).join(STOP_MARK));
            }
        }
    }
    failpoint("stop-recorded");
    let stopped: Vec<(f64, bool)> = std::thread::scope(|scope| {
        let waits: Vec<_> = runs
            .iter()
            .map(|(_, _, handle, attempt_dir, signal, timeout)| {
                scope.spawn(move || match handle {
                    Some(handle) => backends::stop(backend, handle, attempt_dir, *signal, *timeout),
                    None => (0.0, true),
                })
            })
            .collect();
        waits.into_iter().map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    failpoint("stopped");
    for ((k, run, ..), (secs, clean)) in runs.iter().zip(stopped) {
        let rec = state.jobs.get_mut(jobs[*k]).context("record")?;
        record_stop(rec, &dir.attempt_dir(jobs[*k], run.attempt), run, secs, clean);
        rec.run = None;
        // A stop for good (`rubick-run stop`, its intent saved first) stays one.
        if rec.status != JobStatus::Stopped {
            rec.status = JobStatus::Queued;
        }
        out[*k] = Some((secs, clean));
    }
    dir.save(state).context("the runs stopped, but the state could not be written (the next command records it)")?;
    Ok(out)
}

/// A live run that cannot go on where it was placed (its node failed): killed, and
/// its job queued for the next round without spending a retry ([`lifecycle::lost`]).
pub(crate) fn lost(rec: &mut JobRecord, backend: &dyn Executor, handle: &Handle, why: &str) {
    backend.signal(handle, backends::RunSignal::Kill);
    lifecycle::lost(rec, why);
}

/// A run that ended on its own: what the backend and the run's files say of its end
/// (a scheduler's note on an end that was not the run's own exit is added to its log,
/// where the classifier reads it: Slurm's `OUT_OF_MEMORY`), then the job's next state
/// ([`lifecycle::after`]).
pub(crate) fn ended(rec: &mut JobRecord, end: Exit, attempt_dir: &Path) {
    if let Some(note) = &end.note {
        rubick_launch::contract::append(&attempt_dir.join("log.txt"), note);
    }
    let progress = metrics::at_end(&attempt_dir.join(METRICS_FILE), rec.job.iterations);
    rec.iterations_done = rec.iterations_done.max(progress.last.unwrap_or(0));
    let reached = lifecycle::Reached {
        iterations_done: rec.iterations_done,
        progressed: progress.last.is_some(),
        checkpointed: progress.checkpointed,
    };
    let status = rubick_launch::end::classify(&end, progress.oom, &attempt_dir.join("log.txt"));
    lifecycle::after(rec, end.code, status, reached);
}

/// Distinct plans a job may refuse (exit 2) before it is failed rather than requeued.
pub const MAX_REFUSED_PLANS: usize = 3;

/// How a run in `attempt_dir` ended: [`rubick_launch::end::classify`] of what its backend
/// saw, its log, and its metric lines' `oom` event (read from the file's tail).
pub fn classify(end: &Exit, attempt_dir: &Path) -> rubick_launch::RunStatus {
    let oom = metrics::at_end(&attempt_dir.join(METRICS_FILE), u64::MAX).oom;
    rubick_launch::end::classify(end, oom, &attempt_dir.join("log.txt"))
}

/// Records what a stop of `run` cost (seconds, whether it exited cleanly, its last
/// checkpoint) and the iterations its metric lines reached.
pub(crate) fn record_stop(rec: &mut JobRecord, attempt_dir: &Path, run: &RunRecord, secs: f64, clean: bool) {
    let progress = metrics::at_end(&attempt_dir.join(METRICS_FILE), rec.job.iterations);
    rec.iterations_done = rec.iterations_done.max(progress.last.unwrap_or(0));
    rec.reconfigurations.push(Reconfiguration {
        from: run.plan.to_string(),
        to: None,
        stop_s: secs,
        clean,
        checkpointed_iter: progress.checkpointed,
        checkpoint_save_s: progress.checkpoint_save_s,
        first_iteration_s: None,
        before_iter_time_s: None,
        after_iter_time_s: None,
        forced: false,
    });
}

/// The safety net after every move. Once the run a reconfiguration started under
/// another plan has measured as many iterations after its warm-up as a profile would
/// (`measuredIterations`), its mean iteration time is compared with the run's before
/// it: slower by more than [`RUN_NOISE`] (run-to-run noise) and by more than twice the
/// standard error of the difference, its plan joins the job's `slowPlans`, and the next
/// round moves the job back to the plan before (never offering the slow one again).
/// Judged once: the reconfiguration records both means. Plans of one job share its
/// global batch, so iteration times compare as throughputs do.
fn judge_move(dir: &StateDir, name: &str, rec: &mut JobRecord, run: &RunRecord) {
    use rubick_core::launch::{iteration_times, mean_sd, measured_iterations};
    use rubick_model::belief::RUN_NOISE;
    let plan = run.plan.to_string();
    let Some(last) = rec.reconfigurations.last() else { return };
    if last.after_iter_time_s.is_some() || last.to.as_deref() != Some(plan.as_str()) || last.from == plan {
        return;
    }
    let (warmup, wanted) = rec.job.launch.as_ref().map_or((3, 10), |l| (l.warmup_iterations, l.measured_iterations));
    let measure = |attempt: u32| {
        let lines = metrics::lines(&dir.attempt_dir(name, attempt).join(METRICS_FILE), Some(rec.job.iterations));
        let times = iteration_times(measured_iterations(&lines, warmup, None));
        mean_sd(&times).map(|(mean, sd)| (mean, sd, times.len()))
    };
    let Some((after, after_sd, n)) = measure(run.attempt).filter(|m| m.2 >= wanted.max(2) as usize) else { return };
    // The run before: the attempt the reconfiguration stopped, under the plan it names.
    let before_run: Option<RunRecord> = run
        .attempt
        .checked_sub(1)
        .filter(|&a| a >= 1)
        .and_then(|a| std::fs::read_to_string(dir.attempt_dir(name, a).join("run.yaml")).ok())
        .and_then(|text| serde_yaml_ng::from_str(&text).ok())
        .filter(|r: &RunRecord| r.plan.to_string() == last.from);
    let before = before_run.as_ref().and_then(|r| measure(r.attempt).map(|m| (r.plan, m)));
    let last = rec.reconfigurations.last_mut().expect("looked at above");
    last.after_iter_time_s = Some(after);
    let Some((before_plan, (before_s, before_sd, m))) = before else { return };
    last.before_iter_time_s = Some(before_s);
    let noise = 2.0 * (after_sd.powi(2) / n as f64 + before_sd.powi(2) / m as f64).sqrt();
    if after > before_s * (1.0 + RUN_NOISE)
        && after - before_s > noise
        && !rec.job.refused_plans().any(|p| p == run.plan)
    {
        let slow = rubick_core::job::SlowPlan {
            plan: run.plan,
            iter_time_s: after,
            before: before_plan,
            before_iter_time_s: before_s,
        };
        tracing::warn!("`{name}`: {}: the next round moves it back (slowPlans)", slow.describe());
        rec.job.slow_plans.push(slow);
    }
}

/// The state brought up to date with its backend (runs that ended, starts and stops
/// an interrupted rubick-run left) and saved, with that backend: what every command
/// but `submit` and `apply` starts from.
pub(crate) fn refreshed(dir: &StateDir, look: Look) -> anyhow::Result<(State, Seen)> {
    let mut state = dir.load()?;
    let backend = state_backend(dir, &state)?;
    let seen = refresh(dir, &mut state, backend.as_ref(), look)?;
    dir.save(&state)?;
    Ok((state, seen))
}

/// The backend the state's runs are on (local until an apply says otherwise).
pub(crate) fn state_backend(dir: &StateDir, state: &State) -> anyhow::Result<Box<dyn Executor>> {
    let name = state.backend.as_deref().unwrap_or("local");
    backends::backend(name, Some(&dir.root))?
        .with_context(|| format!("state: backend: `{name}` is not known to this rubick-run"))
}

/// `refresh` and `stop_runs` over a fake executor: what each state a look at a run can
/// return makes of its job, without processes, Slurm or Kubernetes.
#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Mutex;

    use rubick_launch::LaunchError;

    use super::*;
    use crate::backends::RunSignal;

    /// Runs as scripted states by handle text; recoverable runs by directory; every
    /// signal recorded. A stop signal ends a run that is `Running`; a kill, any run.
    #[derive(Debug, Default)]
    struct Fake {
        states: Mutex<BTreeMap<String, RunState>>,
        recoverable: BTreeMap<PathBuf, Handle>,
        signals: Mutex<Vec<(String, RunSignal)>>,
    }

    impl Executor for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn submit(&self, _run: &rubick_launch::Submission<'_>) -> Result<Handle, LaunchError> {
            Err(LaunchError::Backend("the fake submits nothing".into()))
        }
        fn poll(&self, handle: &Handle, _dir: &Path, _nodes: &[String]) -> RunState {
            self.states.lock().unwrap().get(&handle.to_string()).cloned().unwrap_or(RunState::Ended(Exit::default()))
        }
        fn signal(&self, handle: &Handle, signal: RunSignal) {
            self.signals.lock().unwrap().push((handle.to_string(), signal));
            let mut states = self.states.lock().unwrap();
            if let Some(state) = states.get_mut(&handle.to_string())
                && (signal == RunSignal::Kill || *state == RunState::Running)
            {
                *state = RunState::Ended(Exit { code: Some(0), ..Exit::default() });
            }
        }
        fn recover(&self, dir: &Path, _name: Option<&str>) -> Option<Handle> {
            self.recoverable.get(dir).cloned()
        }
        fn handle(&self, text: &str) -> Option<Handle> {
            Some(Handle::Slurm { job: text.to_owned() })
        }
    }

    fn record(phase: &str, handle: Option<&str>) -> JobRecord {
        lifecycle::record(1, phase, handle, 1, &[])
    }

    #[test]
    fn every_state_a_look_returns_moves_the_job_as_the_lifecycle_says() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        let ended = |code: Option<i32>, preempted: bool| RunState::Ended(Exit { code, preempted, ..Exit::default() });
        let mut fake = Fake::default();
        let mut state = State::default();
        // name -> (phase, handle, what a look says)
        let runs: [(&str, &str, Option<&str>, Option<RunState>); 8] = [
            ("done", "running", Some("1"), Some(ended(Some(0), false))),
            ("preempted", "running", Some("2"), Some(ended(None, true))),
            ("stranded", "running", Some("3"), Some(RunState::Stranded("mn1 down*".into()))),
            ("silent", "running", Some("4"), Some(RunState::Unknown("the controller does not answer".into()))),
            ("crashed", "running", Some("5"), Some(ended(Some(1), false))),
            ("adopted", "starting", None, Some(RunState::Running)),
            ("unstarted", "starting", None, None),
            ("stopping", "stopping", Some("8"), Some(RunState::Running)),
        ];
        for (k, (name, phase, handle, look)) in runs.iter().enumerate() {
            let mut rec = record(phase, *handle);
            rec.job.name = (*name).to_owned();
            state.jobs.insert((*name).to_owned(), rec);
            let text = handle.map_or_else(|| format!("{}", k + 1), str::to_owned);
            if let Some(look) = look {
                fake.states.lock().unwrap().insert(text.clone(), look.clone());
            }
            if *name == "adopted" {
                fake.recoverable.insert(dir.attempt_dir(name, 1), Handle::Slurm { job: text });
            }
        }
        refresh(&dir, &mut state, &fake, Look::Last).unwrap();
        fn status(state: &State, name: &str) -> (JobStatus, u32) {
            (state.jobs[name].status, state.jobs[name].retries_left)
        }
        assert_eq!(status(&state, "done"), (JobStatus::Finished, 1));
        assert_eq!(status(&state, "preempted"), (JobStatus::Queued, 1), "preempted: no retry spent");
        assert_eq!(status(&state, "stranded"), (JobStatus::Queued, 1), "its node failed: no retry spent");
        assert!(state.jobs["stranded"].reason.as_deref().is_some_and(|r| r.contains("mn1 down*")));
        assert_eq!(status(&state, "silent"), (JobStatus::Running, 1), "a backend that does not answer: still running");
        assert_eq!(status(&state, "crashed"), (JobStatus::Queued, 0), "a crash spends a retry");
        let adopted = state.jobs["adopted"].run.as_ref().unwrap();
        assert_eq!((adopted.phase, adopted.handle.as_deref()), (RunPhase::Running, Some("6")));
        assert_eq!(status(&state, "unstarted"), (JobStatus::Queued, 1), "never started: queued again");
        assert!(state.jobs["unstarted"].run.is_none());
        assert_eq!(status(&state, "stopping"), (JobStatus::Queued, 1), "the interrupted stop finished");
        let signals = fake.signals.lock().unwrap().clone();
        assert_eq!(
            signals,
            [("3".to_owned(), RunSignal::Kill), ("8".to_owned(), RunSignal::Stop(Default::default()))],
            "the stranded run killed, the stopping one asked to stop; nothing else signalled"
        );
        let stop = &state.jobs["stopping"].reconfigurations[0];
        assert!(stop.clean, "{stop:?}");
        // A run that ignores its stop signal is killed after stopTimeoutS.
        let mut rec = record("running", Some("9"));
        rec.job.name = "stubborn".into();
        state.jobs.insert("stubborn".into(), rec);
        fake.states.lock().unwrap().insert("9".into(), RunState::Waiting);
        let out = stop_runs(&dir, &mut state, &["stubborn"], &fake).unwrap();
        let (secs, clean) = out[0].unwrap();
        assert!(!clean && secs >= 1.0, "{secs} {clean}");
        assert_eq!(fake.signals.lock().unwrap().last(), Some(&("9".to_owned(), RunSignal::Kill)));
        assert_eq!(status(&state, "stubborn"), (JobStatus::Queued, 1));
    }
}
