//! Every tool's CLI definition checks itself, its binary answers `--help` with examples,
//! and the conventions hold: help text for every argument, `--help` equal to its committed
//! snapshot in `<tool>/tests/help/` (`RUBICK_UPDATE_HELP=1` rewrites them: a change of
//! interface shows in review), completions and man pages from the same definitions.

use clap::CommandFactory;
use rubick_tests::{binary, repo};

/// The four tools, each with its CLI definition.
fn tools() -> [(&'static str, clap::Command); 4] {
    [
        ("rubick-fit", rubick_fit::Cli::command()),
        ("rubick-plan", rubick_plan::Cli::command()),
        ("rubick-profile", rubick_profile::Cli::command()),
        ("rubick-run", rubick_run::Cli::command()),
    ]
}

#[test]
fn cli_definition_is_consistent() {
    for (_, command) in tools() {
        command.debug_assert();
    }
}

#[test]
fn help_has_examples() {
    for (tool, _) in tools() {
        let out = std::process::Command::new(binary(tool)).arg("--help").output().expect("binary runs");
        assert!(out.status.success(), "{tool} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Examples:") && help.contains(tool), "{help}");
    }
}

#[test]
fn cli_conventions_hold() {
    for (tool, command) in tools() {
        let problems = rubick_testkit::cli_conventions(command, &binary(tool), &repo().join(tool));
        assert!(problems.is_empty(), "{tool}: {problems:#?}");
    }
}

/// Regression, "`make install` installs four 538 MB binaries (31 MB stripped: release
/// keeps line tables of every dependency)": the release profile strips them, and where
/// release binaries are built beside the debug ones, the four together stay under the
/// 200 MB the README promises (142 MB measured).
#[test]
fn release_binaries_are_stripped_and_small() {
    let toml = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let release = toml.split("[profile.release]").nth(1).and_then(|s| s.split("\n[").next()).unwrap_or_default();
    assert!(release.contains("strip = true") && release.contains("debug = false"), "[profile.release]:{release}");
    let target = binary("rubick-plan").parent().and_then(std::path::Path::parent).unwrap().join("release");
    let sizes: Option<Vec<u64>> =
        tools().iter().map(|(tool, _)| std::fs::metadata(target.join(tool)).ok().map(|m| m.len())).collect();
    if let Some(sizes) = sizes {
        assert!(sizes.iter().sum::<u64>() <= 200_000_000, "the release tools in {}: {sizes:?} bytes", target.display());
    }
}
