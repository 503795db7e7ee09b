//! The local executor: each run on this machine, in a process group of its own under
//! the run wrapper; and the blocking local run ([`run`]) `rubick-profile` makes.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use rubick_io::files::write_atomic;

use crate::contract::{KEPT_ENV, METRICS_FILE, RunRequest, prepare};
use crate::end::{Exit, RunOutcome};
use crate::error::{LaunchError, io};
use crate::executor::{Executor, Handle, RunState, Submission, run_to_end};
use crate::guard::{Guard, Watch, Watches, lock};
use crate::proc::{RunSignal, carries_mark, marked_processes, signal_run, status_code};
use crate::wrap::{Wrap, alive_lock_held};

/// A local run's process group id (its wrapper's pid), in its directory.
pub const PID_FILE: &str = "pgid";
/// A local run's exit status, in its directory, written as its last act.
pub const EXIT_FILE: &str = "exit-code";

/// Runs the request on this machine to its end (or its timeout) and reports what it did:
/// [`run_to_end`] over [`Local`], the run's directory the one of its metrics file
/// (which must be `metrics.jsonl`).
pub fn run(request: &RunRequest<'_>) -> Result<RunOutcome, LaunchError> {
    let run = Submission::attached(request);
    run_to_end(&Local::new(), &run)
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
    /// The local executor, holding no run yet.
    pub fn new() -> Local {
        Local::default()
    }
}

fn mark_of(dir: &Path) -> String {
    dir.join(METRICS_FILE).display().to_string()
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
            Some(w) => Wrap {
                pid_file: Some(dir.join(PID_FILE)),
                exit_file: Some(dir.join(EXIT_FILE)),
                watch_stdin: !run.detached,
                ..Wrap::of(&prepared.argv)
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
            for keep in KEPT_ENV {
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
                        signal_run(run.mark(), RunSignal::Kill);
                        let _ = child.wait();
                        return Err(LaunchError::Spawn { program: "sh (the watchdog)".into(), source });
                    }
                }
            }
            _ => None,
        };
        let handle = Handle::Local { pgid, dir: dir.clone() };
        if let Some(watch) = watch {
            self.watches.hold(&handle, watch);
        }
        let recorder = wrapper.is_none().then(|| dir.clone());
        if let Some(dir) = &recorder {
            let _ = write_atomic(&dir.join(PID_FILE), format!("{pgid}\n").as_bytes());
        }
        lock(&self.unreaped).insert(pgid);
        let unreaped = std::sync::Arc::clone(&self.unreaped);
        // Reaped here while this process lives; by init once it has exited. Without a
        // wrapper, the exit status is recorded here.
        std::thread::spawn(move || {
            let status = child.wait();
            if let (Some(dir), Ok(status)) = (recorder, status) {
                let code = status_code(status).map_or_else(String::new, |c| c.to_string());
                let _ = write_atomic(&dir.join(EXIT_FILE), format!("{code}\n").as_bytes());
            }
            lock(&unreaped).remove(&pgid);
        });
        Ok(handle)
    }

    fn poll(&self, handle: &Handle, _dir: &Path, _nodes: &[String]) -> RunState {
        let Handle::Local { pgid, dir: own } = handle else {
            return RunState::Ended(Exit { note: Some(format!("{handle}: not a local run")), ..Exit::default() });
        };
        // The run's own directory (a caller that read the handle from a file checked it
        // is the directory of the run it means).
        let dir = own.as_path();
        // Its wrapper holds a lock while the run is on, until just before it writes the
        // exit status: one lock attempt, no /proc.
        if alive_lock_held(&dir.join(PID_FILE)) {
            return RunState::Running;
        }
        // Its exit status is written as its last act: ended, even if the wrapper lingers.
        if let Ok(text) = std::fs::read_to_string(dir.join(EXIT_FILE)) {
            return RunState::Ended(Exit { code: text.trim().parse().ok(), ..Exit::default() });
        }
        // The run is its marked processes; its wrapper, the group's leader, lives as long
        // as the job: one read; a scan of /proc only once the leader is gone.
        let mark = mark_of(dir);
        let alive =
            lock(&self.unreaped).contains(pgid) || carries_mark(*pgid, &mark) || !marked_processes(&mark).is_empty();
        if alive {
            return RunState::Running;
        }
        // Ended between the two reads: the file is there now.
        let code = std::fs::read_to_string(dir.join(EXIT_FILE)).ok().and_then(|t| t.trim().parse().ok());
        RunState::Ended(Exit { code, ..Exit::default() })
    }

    fn signal(&self, handle: &Handle, signal: RunSignal) {
        // Only the run's own (marked) processes: never whatever holds a reused id.
        if let Handle::Local { dir, .. } = handle {
            signal_run(&mark_of(dir), signal);
        }
    }

    fn recover(&self, dir: &Path, _name: Option<&str>) -> Option<Handle> {
        let pgid: u32 = std::fs::read_to_string(dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
        Some(Handle::Local { pgid, dir: std::path::absolute(dir).ok()? }).filter(|_| pgid > 1)
    }

    fn handle(&self, text: &str) -> Option<Handle> {
        Handle::parse_local(text)
    }

    fn release(&self, handle: &Handle) {
        // Whatever the launcher left behind goes with it, in its group or not: by the
        // run's mark only, since the reaped leader's group id may belong to another.
        if self.watches.release(handle)
            && let Handle::Local { dir, .. } = handle
        {
            signal_run(&mark_of(dir), RunSignal::Kill);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::path::PathBuf;

    use super::*;
    use crate::end::RunStatus;
    use crate::executor::wait_ended;
    use crate::testing::{launch, request};

    #[test]
    fn handles_read_back_what_they_wrote() {
        let local = Handle::Local { pgid: 42, dir: PathBuf::from("/s/jobs/a/attempt-1") };
        assert_eq!(local.to_string(), "42@/s/jobs/a/attempt-1");
        assert_eq!(Local::new().handle(&local.to_string()), Some(local.clone()));
        // A group id alone, init's or "every process", or a relative directory: no handle.
        for text in ["42", "x@/d", "1@/s/jobs/a/attempt-1", "0@/d", "-1@/d", "42@s/jobs/a/attempt-1"] {
            assert_eq!(Local::new().handle(text), None, "{text}");
        }
        assert_eq!(local.short(), "42");
    }

    /// A blocking run and a detached one (under no wrapper: the library's own test
    /// binary cannot be one), followed by polls: running, then ended with its code.
    #[test]
    fn a_local_run_is_polled_to_its_end_and_recovered_from_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let launch = launch("sleep 0.3; exit 5", 30.0);
        let request = request(dir.path(), &launch);
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

    #[test]
    fn a_run_reports_its_metric_lines_and_is_inert_to_its_name() {
        let dir = tempfile::tempdir().unwrap();
        // Braces of the script itself are doubled: single ones are placeholders.
        let script = r#"test "$1" = 2 || exit 3
for i in 1 2 3 4; do echo "{{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.$i}}" >> "$RUBICK_METRICS"; done
echo "not a metric" >> "$RUBICK_METRICS"; echo "job $RUBICK_JOB plan $RUBICK_PLAN""#;
        let l = launch(script, 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!(out.status, RunStatus::Ok, "{}", std::fs::read_to_string(dir.path().join("log.txt")).unwrap());
        assert_eq!(out.metrics.len(), 4);
        assert_eq!(out.ignored_lines, 1);
        let times =
            rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&out.metrics, 1, Some(3)));
        assert_eq!(times, [0.2, 0.3, 0.4]);
        assert!(!dir.path().join("pwned").exists() && !Path::new("pwned").exists());
        let log = std::fs::read_to_string(dir.path().join("log.txt")).unwrap();
        assert!(log.contains("job $(touch pwned) plan dp2-tp1-pp1-mb2-ga2"), "{log}");
        let ds: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("ds.json")).unwrap()).unwrap();
        assert_eq!(ds["train_batch_size"], 8);
    }

    /// issue 42: profile rows `ok` with exit code 1 and nothing saying why. A run stopped
    /// once its iterations were measured, which then exits 1 in its teardown (or is
    /// killed by the stop), is complete, and its outcome says why its exit is not 0.
    #[test]
    fn a_run_stopped_once_measured_is_complete_and_says_why_it_did_not_exit_0() {
        let dir = tempfile::tempdir().unwrap();
        let lines = r#"for i in 1 2 3 4; do echo "{{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.1}}" >> "$RUBICK_METRICS"; done"#;
        let outcome = |on_stop: &str| {
            let l = launch(&format!("{on_stop}\n{lines}\nwhile :; do sleep 0.05; done"), 30.0);
            let mut request = request(dir.path(), &l);
            request.stop_after_iterations = Some(4);
            let out = run(&request).unwrap();
            (out.status, out.exit_code, out.counted_complete.unwrap_or_default())
        };
        let (status, code, why) = outcome("trap 'exit 1' USR1");
        assert_eq!((status, code), (RunStatus::Ok, Some(1)), "{why}");
        assert!(
            why.starts_with("exit 1 after the stop rubick sent (SIGUSR1) once its 4 iterations were measured"),
            "{why}"
        );
        // Exit 0 on the stop: status and exit agree, nothing to say.
        assert_eq!(outcome("trap 'exit 0' USR1"), (RunStatus::Ok, Some(0), String::new()));
    }

    #[test]
    fn a_hanging_run_is_killed_with_its_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        // A worker in the background that would outlive its launcher.
        let pidfile = dir.path().join("worker.pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let l = launch(&script, 1.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!(out.status, RunStatus::Timeout);
        assert!(out.wall < Duration::from_secs(10));
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
        std::thread::sleep(Duration::from_millis(100));
        // Gone, or a zombie waiting for init to reap it: not running either way.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
        assert!(!running, "worker {pid} survived its run: {state}");
    }

    #[test]
    fn out_of_memory_is_an_infeasible_configuration_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let l = launch("echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; exit 1", 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch(r#"echo '{{"rubick":1,"event":"oom"}}' >> "$RUBICK_METRICS"; exit 0"#, 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch("exit 7", 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!((out.status, out.exit_code), (RunStatus::Failed, Some(7)));
        // Exit 3 is the contract's out of memory, for every tool alike.
        let l = launch("exit 3", 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch("echo 'zero 2 is not implemented' >&2; exit 2", 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!((out.status, out.exit_code), (RunStatus::Unsupported, Some(2)), "exit 2: the plan is refused");
    }
}
