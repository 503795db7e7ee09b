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
