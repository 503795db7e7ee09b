//! The CLI definition checks itself, and the real binary answers --help with examples.

use clap::CommandFactory;

#[test]
fn cli_definition_is_consistent() {
    rubick_fit::Cli::command().debug_assert();
}

#[test]
fn help_has_examples() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rubick-fit")).arg("--help").output().expect("binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Examples:"), "{help}");
    assert!(help.contains("rubick-fit"), "{help}");
}

/// Issues 18 and 20: every argument has help text, every `--help` equals its committed
/// snapshot in `tests/help/` (`RUBICK_UPDATE_HELP=1` rewrites them: a change of interface
/// shows in review), and completions and man pages come from the same definitions.
#[test]
fn cli_conventions_hold() {
    let problems = rubick_io::testing::cli_conventions(
        rubick_fit::Cli::command(),
        env!("CARGO_BIN_EXE_rubick-fit").as_ref(),
        env!("CARGO_MANIFEST_DIR").as_ref(),
    );
    assert!(problems.is_empty(), "{problems:#?}");
}
