//! Conventions every rubick binary shares.
//!
//! * logs (tracing) go to stderr: `-v`/`-vv`/`-vvv`, `-q`, or `RUST_LOG`;
//! * stdout carries only the artifact; `-` means stdin/stdout;
//! * exit 0 = done, 1 = a valid negative answer, 2 = an error (bad input, I/O);
//!   a closed stdout pipe exits 0 quietly.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

/// Logging flags, flattened into every tool's top-level arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LogArgs {
    /// More log output on stderr (-v info, -vv debug, -vvv trace); RUST_LOG overrides
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only errors on stderr
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// Installs the stderr logger. `RUST_LOG` wins over the flags; colour only on a
/// terminal and never with `NO_COLOR`.
pub fn init_logging(args: &LogArgs) {
    let level = match (args.quiet, args.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .without_time()
        .try_init();
}

/// What a command concluded, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: exit 0.
    Done,
    /// A valid negative answer (nothing schedulable, a guarantee cannot be met): the
    /// reason goes to stderr, exit 1.
    Negative(String),
}

pub const EXIT_NEGATIVE: u8 = 1;
pub const EXIT_ERROR: u8 = 2;

/// Turns a command's result into the process exit code, printing errors with their
/// cause chain on stderr.
pub fn report(result: anyhow::Result<Outcome>) -> ExitCode {
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Negative(reason)) => {
            eprintln!("{reason}");
            ExitCode::from(EXIT_NEGATIVE)
        }
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprint!("{}", error_text(&error));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// An error with its cause chain, each message once: a cause whose text the lines above
/// already hold (an error that displays its source) is not repeated.
pub fn error_text(error: &anyhow::Error) -> String {
    let mut out = format!("error: {error}\n");
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(&format!("  caused by: {text}\n"));
        }
    }
    out
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            || matches!(
                cause.downcast_ref::<crate::IoError>(),
                Some(crate::IoError::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe
            )
    })
}

/// Fails when more than one input is `-`: stdin can be read only once.
pub fn ensure_one_stdin(inputs: &[&Path]) -> anyhow::Result<()> {
    let stdin_count = inputs.iter().filter(|p| crate::files::is_std(p)).count();
    anyhow::ensure!(stdin_count <= 1, "only one input can be `-` (stdin); {stdin_count} are");
    Ok(())
}

/// Fails when the output `-o` names one of the inputs (the same file, through any path):
/// writing it would replace what is being read.
pub fn ensure_not_an_input(output: &Path, inputs: &[&Path]) -> anyhow::Result<()> {
    if crate::files::is_std(output) {
        return Ok(());
    }
    use std::os::unix::fs::MetadataExt as _;
    let Ok(out) = std::fs::metadata(output) else { return Ok(()) };
    for input in inputs.iter().filter(|p| !crate::files::is_std(p)) {
        // The same file by any path: a symlink, `..`, or a hard link.
        if std::fs::metadata(input).is_ok_and(|i| (i.dev(), i.ino()) == (out.dev(), out.ino())) {
            anyhow::bail!(
                "the output {} is also an input ({}); write it elsewhere, inputs are never overwritten",
                output.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// The body of every tool's `check FILES...` command for one artifact kind: one
/// stdin at most, each file parsed and validated, the first bad one is the error.
pub fn check_command<T: rubick_core::Artifact>(files: &[PathBuf]) -> anyhow::Result<Outcome> {
    ensure_one_stdin(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    crate::check_artifacts::<T>(files)?;
    Ok(Outcome::Done)
}

/// The arguments of every tool's `check FILES...`. The tool names what it validates in
/// the command's doc and in the files' help (`#[command(mut_arg("files", |a|
/// a.help("Schedule files, `-` for stdin")))]`).
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Files to validate (YAML), `-` for stdin
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// The subcommands every tool shares, flattened after its own (`#[command(flatten)]
/// Common(Common)`): its completion scripts and man pages, generated from its CLI's one
/// definition.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Common {
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print the man page (section 1), or write one page per command into --out-dir
    Man {
        /// Write `TOOL.1` and `TOOL-COMMAND.1` here instead
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

impl Common {
    /// Runs the command for the tool whose CLI is `Cli`.
    pub fn run<Cli: clap::CommandFactory>(self) -> anyhow::Result<Outcome> {
        match self {
            Common::Completions { shell } => completions(Cli::command(), shell),
            Common::Man { out_dir } => man_pages(Cli::command(), out_dir.as_deref()),
        }
    }
}

/// Output format of a listing: YAML (the default), CSV or Parquet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    Yaml,
    Csv,
    Parquet,
}

impl ListFormat {
    fn name(self) -> &'static str {
        match self {
            ListFormat::Yaml => "yaml",
            ListFormat::Csv => "csv",
            ListFormat::Parquet => "parquet",
        }
    }

    /// `--format` when given, else by the output's extension, else YAML. An output whose
    /// extension names another format (`-o space.parquet --format yaml`, `-o
    /// space.json`) is an error naming both: a file is never written in a format its
    /// name contradicts.
    pub fn resolve(flag: Option<ListFormat>, output: &Path) -> anyhow::Result<ListFormat> {
        use crate::files::Format;
        let named = match crate::files::extension_format(output) {
            Some(Format::Yaml) => Some(ListFormat::Yaml),
            Some(Format::Csv) => Some(ListFormat::Csv),
            Some(Format::Parquet) => Some(ListFormat::Parquet),
            Some(other) => anyhow::bail!(
                "-o {}: the extension names {other}, which this listing is not written in (yaml, csv or parquet)",
                output.display()
            ),
            None => None,
        };
        match (flag, named) {
            (Some(asked), Some(named)) if asked != named => anyhow::bail!(
                "-o {}: the extension names {}, but --format is {}",
                output.display(),
                named.name(),
                asked.name()
            ),
            (Some(format), _) | (None, Some(format)) => Ok(format),
            (None, None) => Ok(ListFormat::Yaml),
        }
    }
}

/// A progress bar on stderr when it is a terminal (none in pipes, files and CI logs);
/// `what` follows the count, e.g. `jobs finished`.
pub fn progress_bar(len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} {{msg}}"
    )) {
        bar.set_style(style);
    }
    Some(bar)
}

/// `<tool> completions SHELL`: the shell's completion script for `command`, on stdout.
pub fn completions(mut command: clap::Command, shell: clap_complete::Shell) -> anyhow::Result<Outcome> {
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut out);
    crate::write_output(Path::new("-"), crate::Format::Text, &out)?;
    Ok(Outcome::Done)
}

/// `<tool> man [--out-dir DIR]`: the tool's man page (section 1) on stdout, or one page
/// per command (`rubick-plan.1`, `rubick-plan-schedule.1`, ...) written into DIR.
pub fn man_pages(command: clap::Command, out_dir: Option<&Path>) -> anyhow::Result<Outcome> {
    let command = command.term_width(80);
    let Some(dir) = out_dir else {
        let mut out = Vec::new();
        clap_mangen::Man::new(command).render(&mut out)?;
        crate::write_output(Path::new("-"), crate::Format::Text, &out)?;
        return Ok(Outcome::Done);
    };
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let tool = command.get_name().to_owned();
    let mut pages = vec![(tool.clone(), command.clone())];
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        // A subcommand's page is named as man(1) expects: `tool-sub`.
        let name = format!("{tool}-{}", sub.get_name());
        let shown = format!("{tool} {}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name).bin_name(shown)));
    }
    for (name, page) in pages {
        let mut out = Vec::new();
        clap_mangen::Man::new(page).render(&mut out)?;
        crate::files::write_atomic(&dir.join(format!("{name}.1")), &out)?;
    }
    Ok(Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error is printed once: a cause already in the message is not
    /// printed again; a cause that adds something is.
    #[test]
    fn every_error_is_printed_twice() {
        let inner = std::io::Error::other("mapping values are not allowed at line 5");
        let e = anyhow::Error::new(inner).context("jobs.yaml: mapping values are not allowed at line 5");
        assert_eq!(error_text(&e), "error: jobs.yaml: mapping values are not allowed at line 5\n");
        let e = anyhow::Error::new(std::io::Error::other("permission denied")).context("state.yaml: cannot write");
        assert_eq!(error_text(&e), "error: state.yaml: cannot write\n  caused by: permission denied\n");
    }
}
