//! How a run ended and which processes are the run: rubick-run reads both as the launch
//! library does.

/// One classification of how a run ended: rubick-run's reading
/// is the launch library's — exit 3 and a framework's out-of-memory message in the log
/// are out of memory (never retried), exit 2 a refused plan, 127 not runnable.
#[test]
fn two_functions_decide_how_a_run_ended_and_disagree() {
    use rubick_launch::{Exit, RunStatus};
    use rubick_run::classify;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let exit = |code: i32| Exit { code: Some(code), ..Exit::default() };
    assert_eq!(classify(&exit(0), dir.path()), RunStatus::Ok);
    assert_eq!(classify(&exit(3), dir.path()), RunStatus::Oom);
    assert_eq!(classify(&exit(2), dir.path()), RunStatus::Unsupported);
    assert_eq!(classify(&exit(127), dir.path()), RunStatus::NotRunnable);
    assert_eq!(classify(&exit(1), dir.path()), RunStatus::Failed);
    std::fs::write(dir.path().join("log.txt"), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n")
        .expect("a log");
    assert_eq!(classify(&exit(1), dir.path()), RunStatus::Oom, "the log's OOM, under rubick-run too");
    assert_eq!(
        rubick_launch::end::classify(&exit(3), false, &dir.path().join("none")),
        RunStatus::Oom,
        "exit 3 under rubick-profile too"
    );
}

/// A run is not its process-group id alone (after the group died the id can be reused
/// by an unrelated process, which `rubick-run stop` must not signal): a run is its marked processes; an unrelated process holding the id is
/// neither counted as the run nor signalled.
#[test]
fn a_reused_process_group_id_is_never_signalled() {
    use rubick_launch::{Executor, Local};
    use rubick_run::backends::RunSignal;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut other = std::process::Command::new("sleep").arg("60").process_group(0).spawn().expect("sleep starts");
    // The handle a finished run left, whose group id the unrelated `sleep` now holds.
    let local = Local::new();
    let handle = local.handle(&format!("{}@{}", other.id(), dir.path().display())).expect("a local handle");
    assert!(!local.poll(&handle, dir.path(), &[]).alive(), "an unrelated process is not the run");
    local.signal(&handle, RunSignal::Kill);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(other.try_wait().expect("status").is_none(), "the unrelated process was signalled");
    let _ = other.kill();
    let _ = other.wait();
}
