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
