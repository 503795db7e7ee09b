//! The conventions every tool's CLI keeps, checked on its clap definition and its
//! binary: help text on every argument, examples that print as written, `--help`
//! snapshots, completions and man pages.

use std::path::Path;

/// Every `--help` of `command` and its subcommands, at 100 columns: what the
/// help-snapshot tests compare with the committed `tests/help/*.txt`.
pub fn help_texts(command: clap::Command) -> Vec<(String, String)> {
    fn walk(cmd: &mut clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        out.push((path.to_owned(), cmd.render_long_help().to_string()));
        let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_owned()).collect();
        for name in names.into_iter().filter(|n| n != "help") {
            if let Some(sub) = cmd.find_subcommand_mut(&name) {
                walk(sub, &format!("{path}-{name}"), out);
            }
        }
    }
    let mut command = command.term_width(100);
    command.build();
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    walk(&mut command, &name, &mut out);
    out
}

/// The narrowest terminal the help's examples are written for: at this width or wider
/// clap prints them as written, never wrapped mid-command.
pub const EXAMPLES_WIDTH: usize = 80;

/// Lines of the examples (the text after `Examples:` of every command's and
/// subcommand's after-help) that `--help` would not print as written on a terminal of
/// [`EXAMPLES_WIDTH`] columns, each as `path: line`: a command wrapped mid-line cannot be
/// copied and pasted.
pub fn wrapped_examples(command: clap::Command) -> Vec<String> {
    fn walk(cmd: &mut clap::Command, path: &str, out: &mut Vec<String>) {
        if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()).map(ToString::to_string)
            && let Some(at) = after.find("Examples:")
        {
            let rendered = cmd.clone().term_width(EXAMPLES_WIDTH).render_long_help().to_string();
            let lines: std::collections::HashSet<&str> = rendered.lines().map(str::trim_end).collect();
            for line in after[at..].lines().map(str::trim_end).filter(|l| !l.is_empty()) {
                if !lines.contains(line) {
                    out.push(format!("{path}: wrapped at {EXAMPLES_WIDTH} columns: {line}"));
                }
            }
        }
        let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_owned()).collect();
        for name in names.into_iter().filter(|n| n != "help") {
            if let Some(sub) = cmd.find_subcommand_mut(&name) {
                walk(sub, &format!("{path} {name}"), out);
            }
        }
    }
    let mut command = command;
    command.build();
    let name = command.get_name().to_owned();
    let mut out = Vec::new();
    walk(&mut command, &name, &mut out);
    out
}

/// Compares every `--help` of `command` with the files in `dir` (`NAME.txt`);
/// `RUBICK_UPDATE_HELP=1` rewrites them. The mismatches, named.
pub fn check_help_snapshots(command: clap::Command, dir: &Path) -> Vec<String> {
    let update = std::env::var("RUBICK_UPDATE_HELP").is_ok_and(|v| v == "1");
    let mut problems = Vec::new();
    for (name, text) in help_texts(command) {
        let path = dir.join(format!("{name}.txt"));
        if update {
            let _ = std::fs::create_dir_all(dir);
            if let Err(e) = std::fs::write(&path, &text) {
                problems.push(format!("{}: {e}", path.display()));
            }
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == text => {}
            Ok(_) => problems.push(format!("{name}: --help changed (RUBICK_UPDATE_HELP=1 to accept)")),
            Err(_) => problems.push(format!("{name}: no {} (RUBICK_UPDATE_HELP=1 writes it)", path.display())),
        }
    }
    problems
}

/// Every argument of `command` and its subcommands without help text, as
/// `path --flag` / `path <VALUE>`: each argument says what it is (`--help` is the manual).
pub fn undocumented_arguments(command: &clap::Command) -> Vec<String> {
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                let name = match arg.get_long() {
                    Some(long) => format!("--{long}"),
                    None => format!("<{}>", id.to_uppercase()),
                };
                out.push(format!("{path} {name}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(command, command.get_name(), &mut out);
    out
}

/// The conventions every tool's CLI keeps, checked on its definition and its binary:
/// every argument has help text; its examples print as written at 80 columns
/// ([`wrapped_examples`]); every `--help` equals its snapshot in
/// `MANIFEST_DIR/tests/help/` (`RUBICK_UPDATE_HELP=1` rewrites them); `completions`
/// prints a script for bash, zsh and fish; `man` prints a page and writes one per
/// command with `--out-dir`. The problems found, named.
pub fn cli_conventions(command: clap::Command, bin: &Path, manifest_dir: &Path) -> Vec<String> {
    let name = command.get_name().to_owned();
    let mut problems: Vec<String> =
        undocumented_arguments(&command).into_iter().map(|a| format!("{a}: no help text")).collect();
    problems.extend(wrapped_examples(command.clone()));
    problems.extend(check_help_snapshots(command, &manifest_dir.join("tests/help")));
    let run = |args: &[&str]| std::process::Command::new(bin).args(args).output();
    for shell in ["bash", "zsh", "fish"] {
        match run(&["completions", shell]) {
            Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains(&name) => {}
            _ => problems.push(format!("{name} completions {shell}: no script")),
        }
    }
    match run(&["man"]) {
        Ok(o) if o.status.success() && o.stdout.starts_with(b".ie") => {}
        _ => problems.push(format!("{name} man: no man page on stdout")),
    }
    match tempfile::tempdir() {
        Ok(dir) => {
            let out = dir.path().display().to_string();
            let wrote = run(&["man", "--out-dir", &out]).is_ok_and(|o| o.status.success())
                && dir.path().join(format!("{name}.1")).exists()
                && dir.path().join(format!("{name}-man.1")).exists();
            if !wrote {
                problems.push(format!("{name} man --out-dir: not one page per command"));
            }
        }
        Err(e) => problems.push(format!("a temporary directory: {e}")),
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_example_wider_than_80_columns_is_found_wrapped() {
        let long = format!("  tool run {}", "--flag value ".repeat(8));
        let command = |after: String| clap::Command::new("tool").after_help(after);
        let found = wrapped_examples(command(format!("Examples:\n  # a comment\n{long}\n")));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("--flag value"), "{found:?}");
        let short = "Examples:\n  # a comment\n  tool run --flag value \\\n      --other value\n".to_owned();
        assert!(wrapped_examples(command(short)).is_empty());
        // Prose before the examples may wrap.
        let prose = format!("{}\n\nExamples:\n  tool run\n", "words ".repeat(30));
        assert!(wrapped_examples(command(prose)).is_empty());
    }
}
