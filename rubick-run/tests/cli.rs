//! The CLI definition checks itself, and the real binary answers --help with examples.

use clap::CommandFactory;

#[test]
fn cli_definition_is_consistent() {
    rubick_run::Cli::command().debug_assert();
}

#[test]
fn help_has_examples() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rubick-run")).arg("--help").output().expect("binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Examples:"), "{help}");
    assert!(help.contains("rubick-run"), "{help}");
}

/// Issue 18, "`--help` has no text for ...": every argument of every subcommand says
/// what it is.
#[test]
fn every_argument_has_help_text() {
    use clap::CommandFactory;
    let missing = rubick_io::cli::undocumented_arguments(&rubick_run::Cli::command());
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
}

/// Issue 20: every `--help` (100 columns) is committed under `tests/help/`: a change of
/// interface shows in review. `RUBICK_UPDATE_HELP=1` rewrites them.
#[test]
fn help_snapshots_match() {
    use clap::CommandFactory;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/help");
    let problems = rubick_io::cli::check_help_snapshots(rubick_run::Cli::command(), &dir);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Issue 20: completions for the shells and man pages from the same definitions.
#[test]
fn completions_and_man_pages() {
    let bin = env!("CARGO_BIN_EXE_rubick-run");
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(bin).args(["completions", shell]).output().expect("binary runs");
        assert!(out.status.success() && out.stdout.len() > 200, "{shell}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("rubick-run"), "{shell}");
    }
    let out = std::process::Command::new(bin).arg("man").output().expect("binary runs");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with(".ie"),
        "{:?}",
        &out.stdout[..40.min(out.stdout.len())]
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out =
        std::process::Command::new(bin).arg("man").arg("--out-dir").arg(dir.path()).output().expect("binary runs");
    assert!(out.status.success());
    assert!(dir.path().join("rubick-run.1").exists() && dir.path().join("rubick-run-man.1").exists());
}

/// Issue 19, "two functions decide how a run ended, and disagree": rubick-run's reading
/// is the launch library's — exit 3 and a framework's out-of-memory message in the log
/// are out of memory (never retried), exit 2 a refused plan, 127 not runnable.
#[test]
fn two_functions_decide_how_a_run_ended_and_disagree() {
    use rubick_run::{Failure, classify};
    let dir = tempfile::tempdir().expect("a temporary directory");
    assert_eq!(classify(Some(0), dir.path()), None);
    assert_eq!(classify(Some(3), dir.path()), Some(Failure::OutOfMemory));
    assert_eq!(classify(Some(2), dir.path()), Some(Failure::BadInput));
    assert_eq!(classify(Some(127), dir.path()), Some(Failure::NotRunnable));
    assert_eq!(classify(Some(1), dir.path()), Some(Failure::Retryable));
    std::fs::write(dir.path().join("log.txt"), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n")
        .expect("a log");
    assert_eq!(classify(Some(1), dir.path()), Some(Failure::OutOfMemory), "the log's OOM, under rubick-run too");
    assert_eq!(
        rubick_launch::supervise::classify(false, Some(3), false, &dir.path().join("none")),
        rubick_launch::RunStatus::Oom,
        "exit 3 under rubick-profile too"
    );
}

/// Issue 19, "a run is identified by its process-group id alone: after the group died
/// and the id was reused by an unrelated process, `rubick-run stop` signalled that
/// process": a run is its marked processes; an unrelated process holding the id is
/// neither counted as the run nor signalled.
#[test]
fn a_reused_process_group_id_is_never_signalled() {
    use rubick_run::backends::{Backend, Local};
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut other = std::process::Command::new("sleep").arg("60").process_group(0).spawn().expect("sleep starts");
    // The handle a finished run left, whose group id the unrelated `sleep` now holds.
    let handle = format!("{}@{}", other.id(), dir.path().display());
    assert!(!Local.alive(&handle), "an unrelated process is not the run");
    Local.signal(&handle, "KILL");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(other.try_wait().expect("status").is_none(), "the unrelated process was signalled");
    let _ = other.kill();
    let _ = other.wait();
}
