//! The README's commands run as written, and a job without a
//! performance model is planned with a warning.
//!
//! The convention (README, "Every command"): a fenced block whose info string is `sh` is
//! run, in README order, by `bash -euo pipefail` in a scratch directory laid out as the
//! clone (its inputs linked, `../shared` beside it where the checkout has one, the built
//! tools first on `PATH`); `sh needs=A,B` runs only where A and B are (`pytorch`,
//! `slurm`, `slurm-accounting`, `reference`) and is reported skipped elsewhere (failed
//! under CI's `RUBICK_REQUIRE_*`); `sh no-run: WHY` is never run. Every `sh` block, run
//! or not, is also checked statically: each rubick tool's command line parses (the
//! words as written, then `--help`: an unknown flag or subcommand fails), each `make`
//! target exists, each script it names is there. Other languages (`yaml`, `python`) are
//! examples, not commands; a `bash` / `shell` / `console` block is refused, so that
//! nothing escapes the convention.

use std::path::{Path, PathBuf};
use std::process::Command;

use rubick_testkit::missing;
use rubick_tests::{Held, Need, Reaper, SlurmShape, binary, needs, repo, run_in, slurm_nodes, temp};

/// The tools a README command may name.
const TOOLS: [&str; 4] = ["rubick-profile", "rubick-fit", "rubick-plan", "rubick-run"];
/// A block's time limit (the slowest, the quick start, profiles 4 configurations).
const BLOCK_LIMIT_S: u32 = 300;

/// One fenced block of the README.
#[derive(Debug)]
struct Block {
    /// 1-based line of its opening fence.
    line: usize,
    lang: String,
    /// What follows the language in the info string.
    rest: String,
    text: String,
}

/// What the convention makes of an `sh` block.
#[derive(Debug, PartialEq)]
enum Mode {
    Run { needs: Vec<Need> },
    NoRun,
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).expect("README.md")
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    let info = info.trim();
                    let (lang, rest) = info.split_once(char::is_whitespace).unwrap_or((info, ""));
                    open = Some(Block {
                        line: i + 1,
                        lang: lang.to_owned(),
                        rest: rest.trim().to_owned(),
                        text: String::new(),
                    });
                }
            }
            Some(block) => {
                if line.trim_end() == "```" {
                    out.push(open.take().unwrap());
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "README.md: a fenced block is never closed");
    out
}

/// The mode of an `sh` block from its info string, or why the string is wrong.
fn mode(block: &Block) -> Result<Mode, String> {
    if let Some(why) = block.rest.strip_prefix("no-run") {
        let why = why.strip_prefix(':').map(str::trim).unwrap_or_default();
        if why.is_empty() {
            return Err("`no-run` needs its reason: ```sh no-run: WHY".into());
        }
        return Ok(Mode::NoRun);
    }
    let mut needs = Vec::new();
    for word in block.rest.split_whitespace() {
        let Some(list) = word.strip_prefix("needs=") else {
            return Err(format!("unknown `{word}` in the info string (sh, sh needs=A,B, sh no-run: WHY)"));
        };
        for need in list.split(',') {
            needs.push(match need {
                "pytorch" => Need::PyTorch,
                "slurm" => Need::Slurm,
                "slurm-accounting" => Need::SlurmAccounting,
                "reference" => Need::Reference,
                _ => return Err(format!("unknown need `{need}` (pytorch, slurm, slurm-accounting, reference)")),
            });
        }
    }
    Ok(Mode::Run { needs })
}

/// The `sh` blocks with their modes; every other block that looks like a shell fails.
fn sh_blocks(text: &str) -> Vec<(Block, Mode)> {
    let mut out = Vec::new();
    for block in blocks(text) {
        assert!(
            !["bash", "shell", "console", "shell-session", "zsh"].contains(&block.lang.as_str()),
            "README.md:{}: a ```{} block: commands are ```sh (run by tests/it/readme.rs) or ```sh no-run: WHY",
            block.line,
            block.lang
        );
        if block.lang == "sh" {
            let mode = mode(&block).unwrap_or_else(|e| panic!("README.md:{}: {e}", block.line));
            out.push((block, mode));
        }
    }
    out
}

// ---------------------------------------------------------------------------------
// The static check: a small reading of shell command lines (words, quotes, `$(...)`,
// operators, redirections, here-documents), enough for the README's blocks.

/// The simple commands of a block, each as its words (quotes removed, variables left).
fn commands(text: &str) -> Vec<Vec<String>> {
    // Here-document bodies are data, not commands.
    let mut lines = Vec::new();
    let mut heredoc: Option<String> = None;
    for line in text.lines() {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        if let Some(at) = line.find("<<") {
            let tag: String = line[at + 2..]
                .trim_start_matches(['-', '\'', '"', ' '])
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !tag.is_empty() {
                heredoc = Some(tag);
            }
        }
        lines.push(line);
    }
    let text = lines.join("\n").replace("\\\n", " ");
    let chars: Vec<char> = text.chars().collect();
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut word: Option<String> = None;
    // The next word is a redirection's target, not an argument.
    let mut target = false;
    let mut i = 0;
    let finish_word = |word: &mut Option<String>, current: &mut Vec<String>, target: &mut bool| {
        if let Some(w) = word.take() {
            if *target {
                *target = false;
            } else {
                current.push(w);
            }
        }
    };
    let finish_command = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if !current.is_empty() {
            out.push(std::mem::take(current));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' if word.is_none() => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            ' ' | '\t' => finish_word(&mut word, &mut current, &mut target),
            '\n' | ';' | '|' | '&' | '(' | ')' => {
                finish_word(&mut word, &mut current, &mut target);
                finish_command(&mut current, &mut out);
                if (c == '&' || c == '|') && chars.get(i + 1) == Some(&c) {
                    i += 1;
                }
            }
            '>' | '<' => {
                // A redirection: `>`, `>>`, `2>`, `<`, `<<`, `>&1`; its target follows
                // (glued or as the next word) unless it names a descriptor.
                let fd = word.as_deref().is_some_and(|w| w.chars().all(|c| c.is_ascii_digit()));
                if !fd {
                    finish_word(&mut word, &mut current, &mut target);
                } else {
                    word = None;
                }
                while i + 1 < chars.len() && matches!(chars[i + 1], '>' | '<') {
                    i += 1;
                }
                if chars.get(i + 1) == Some(&'&') {
                    i += 1;
                    while i + 1 < chars.len() && chars[i + 1].is_ascii_digit() {
                        i += 1;
                    }
                } else {
                    target = true;
                }
            }
            '\'' => {
                let w = word.get_or_insert_default();
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '"' => {
                let w = word.get_or_insert_default();
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                // A command substitution is one piece of a word.
                let w = word.get_or_insert_default();
                let mut depth = 0;
                while i < chars.len() {
                    match chars[i] {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                w.push(')');
                                break;
                            }
                        }
                        _ => {}
                    }
                    w.push(chars[i]);
                    i += 1;
                }
            }
            '\\' if i + 1 < chars.len() => {
                i += 1;
                word.get_or_insert_default().push(chars[i]);
            }
            _ => word.get_or_insert_default().push(c),
        }
        i += 1;
    }
    finish_word(&mut word, &mut current, &mut target);
    finish_command(&mut current, &mut out);
    // Assignments and keywords before a command are not the command.
    out.into_iter()
        .filter_map(|mut words| {
            while let Some(first) = words.first() {
                let assignment = first.split_once('=').is_some_and(|(name, _)| {
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                if assignment || ["!", "{", "do", "then", "else", "time"].contains(&first.as_str()) {
                    words.remove(0);
                } else {
                    break;
                }
            }
            let first = words.first()?;
            (!["for", "while", "until", "if", "case", "done", "fi", "esac", "}"].contains(&first.as_str()))
                .then_some(words)
        })
        .collect()
}

/// What is wrong with the commands of a block (empty when every one checks).
fn check_block(block: &Block) -> Vec<String> {
    let mut problems = Vec::new();
    let makefile = std::fs::read_to_string(repo().join("Makefile")).expect("Makefile");
    for words in commands(&block.text) {
        let program = words[0].as_str();
        let shown = words.join(" ");
        if program.starts_with("rubick") {
            if !TOOLS.contains(&program) {
                problems.push(format!("`{shown}`: no tool `{program}`"));
                continue;
            }
            // Everything as written, then --help: clap parses the words before it (an
            // unknown flag, subcommand or value is exit 2) and then prints the help.
            let out = Command::new(binary(program))
                .args(&words[1..])
                .arg("--help")
                .current_dir(repo())
                .env("NO_COLOR", "1")
                .output()
                .expect("the tool starts");
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                problems.push(format!("`{shown}` does not parse: {}", err.trim()));
            }
        } else if program == "make" {
            for target in words[1..].iter().filter(|w| !w.starts_with('-') && !w.contains('=')) {
                if !makefile.lines().any(|l| l.starts_with(&format!("{target}:"))) {
                    problems.push(format!("`{shown}`: the Makefile has no target `{target}`"));
                }
            }
        } else if program.contains('/')
            && !program.starts_with('/')
            && !program.starts_with('$')
            && !repo().join(program).is_file()
        {
            problems.push(format!("`{shown}`: no `{program}` in the clone"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------
// Running the blocks.

/// A scratch directory laid out as the clone: `DIR/rubick` (the repository's inputs
/// linked, the built tools in `bin/`), `DIR/shared` where the checkout has one beside it.
struct Scratch {
    _dir: tempfile::TempDir,
    root: PathBuf,
    bin: PathBuf,
    home: PathBuf,
}

fn scratch() -> Scratch {
    let dir = temp();
    let root = dir.path().join("rubick");
    let bin = dir.path().join("bin");
    let home = dir.path().join("home");
    for d in [&root, &bin, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    for entry in ["examples", "data", "scripts", "python", "Makefile", "schemas"] {
        std::os::unix::fs::symlink(repo().join(entry), root.join(entry)).unwrap();
    }
    let shared = repo().join("../shared");
    if shared.is_dir() {
        std::os::unix::fs::symlink(std::fs::canonicalize(&shared).unwrap(), dir.path().join("shared")).unwrap();
    }
    // The binaries linked (else copied): a rebuild of the target directory while the
    // blocks run does not pull one away from under a run that re-executes it.
    for tool in TOOLS {
        let to = bin.join(tool);
        if std::fs::hard_link(binary(tool), &to).is_err() {
            std::fs::copy(binary(tool), &to).unwrap();
        }
    }
    Scratch { _dir: dir, root, bin, home }
}

/// Whether a block's need is met here; when not, the test is reported skipped for it
/// (or fails, where the need is required). The PyTorch environment, when met, goes
/// into `venv` for the blocks that run.
fn need_met(need: Need, scratch: &Scratch, venv: &mut Option<PathBuf>) -> bool {
    match need {
        Need::PyTorch => {
            *venv = rubick_tests::venv();
            venv.is_some()
        }
        Need::Slurm => slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 1 }, Held::Shared).is_some(),
        // The blocks read the reference data beside the scratch clone, as beside a clone.
        Need::Reference if !scratch.root.join("../shared/reference/rubick-artifact/models.yaml").is_file() => {
            missing(Need::Reference, "../shared/reference is absent beside the clone (the README's reference data)");
            false
        }
        need => needs(need),
    }
}

/// `bash -euo pipefail` on a block's text in the scratch clone; `(exit code, output)`.
fn run_block(scratch: &Scratch, venv: Option<&Path>, text: &str) -> (Option<i32>, String) {
    let path = format!("{}:{}", scratch.bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", &BLOCK_LIMIT_S.to_string(), "bash", "-euo", "pipefail", "-c", text])
        .current_dir(&scratch.root)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("RUBICK_STATE")
        .env_remove("RUBICK_REFERENCE");
    if let Some(venv) = venv {
        cmd.env("RUBICK_VENV", venv);
    }
    let out = cmd.output().expect("bash starts");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs the line of the crontab the quick start wrote as cron would: `sh -c`, from
/// the home directory, with nothing in the environment but the crontab's own
/// variables and what cron sets (HOME, LOGNAME, SHELL).
fn run_crontab(scratch: &Scratch) {
    let crontab =
        std::fs::read_to_string(scratch.root.join("rubick.crontab")).expect("the quick start wrote rubick.crontab");
    let mut cmd = Command::new("/bin/sh");
    cmd.env_clear().env("HOME", &scratch.home).env("LOGNAME", "rubick").env("SHELL", "/bin/sh");
    cmd.current_dir(&scratch.home);
    let mut line = None;
    for l in crontab.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some((name, value)) = l.split_once('=').filter(|(n, _)| !n.contains(' ')) {
            cmd.env(name, value);
        } else {
            assert!(line.is_none(), "one job line in rubick.crontab:\n{crontab}");
            line = Some(l);
        }
    }
    let line = line.unwrap_or_else(|| panic!("a job line in rubick.crontab:\n{crontab}"));
    let fields: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(fields.len(), 6, "five time fields and the command: {line}");
    assert_eq!(&fields[..5], ["*"; 5], "every minute: {line}");
    let round = || {
        let text = std::fs::read_to_string(scratch.root.join("state/current.yaml")).unwrap_or_default();
        text.lines().find_map(|l| l.strip_prefix("round: ")?.trim().parse::<u64>().ok())
    };
    let before = round();
    let out = cmd.args(["-c", fields[5]]).output().expect("sh starts");
    let log = std::fs::read_to_string(scratch.root.join("state/rounds.log")).unwrap_or_default();
    assert!(out.status.success(), "the crontab line failed as cron runs it: {line}\n{log}");
    for bad in ["not found", "No module named", "error"] {
        assert!(!log.contains(bad), "the crontab's round says `{bad}`:\n{log}");
    }
    assert_eq!(round(), before.map(|r| r + 1), "the crontab's line applied the next round:\n{log}");
}

/// Every `sh` block of the README runs as
/// written, in order, in a scratch clone; the quick start's crontab line runs as cron
/// would run it; blocks that cannot run here are checked statically and said skipped.
#[test]
fn every_readme_command_block_runs_as_written() {
    let text = readme();
    let blocks = sh_blocks(&text);
    assert!(blocks.len() >= 8, "the README's command blocks: {}", blocks.len());
    let scratch = scratch();
    let _reaper = Reaper(scratch.root.clone());
    let mut venv = None;
    let mut met: std::collections::HashMap<Need, bool> = Default::default();
    let mut summary = Vec::new();
    for (block, mode) in &blocks {
        let problems = check_block(block);
        assert!(problems.is_empty(), "README.md:{}: {}", block.line, problems.join("\n"));
        let Mode::Run { needs } = mode else {
            summary.push(format!("README.md:{}: checked ({})", block.line, block.rest));
            continue;
        };
        let unmet: Vec<&Need> =
            needs.iter().filter(|n| !*met.entry(**n).or_insert_with(|| need_met(**n, &scratch, &mut venv))).collect();
        if !unmet.is_empty() {
            summary.push(format!("README.md:{}: checked, not run (needs {unmet:?})", block.line));
            continue;
        }
        let start = std::time::Instant::now();
        let (code, out) = run_block(&scratch, venv.as_deref(), &block.text);
        assert_eq!(
            code,
            Some(0),
            "README.md:{}: the block failed as written (exit {code:?}):\n{}\n---\n{}",
            block.line,
            block.text,
            tail(&out, 40)
        );
        summary.push(format!("README.md:{}: ran in {:.1} s", block.line, start.elapsed().as_secs_f64()));
        if block.text.contains("rubick.crontab <<") {
            let start = std::time::Instant::now();
            run_crontab(&scratch);
            // The quick start's job names its model: no default-model warning.
            assert!(!out.contains("has no perfModel"), "the quick start's job has its model:\n{}", tail(&out, 40));
            summary.push(format!(
                "README.md:{}: its crontab line ran as cron would in {:.1} s",
                block.line,
                start.elapsed().as_secs_f64()
            ));
        }
    }
    eprintln!("{}", summary.join("\n"));
}

/// The static check refuses a wrong flag in any README block, run or
/// not (`make test` then fails), and passes the README as it is.
#[test]
fn a_wrong_flag_in_any_readme_block_fails_the_check() {
    let text = readme();
    let mut tools = 0;
    for (block, _) in sh_blocks(&text) {
        assert!(check_block(&block).is_empty(), "README.md:{}: {:?}", block.line, check_block(&block));
        for words in commands(&block.text).iter().filter(|w| TOOLS.contains(&w[0].as_str())) {
            tools += 1;
            // The command's line with one flag misspelled.
            let Some(flag) = words.iter().find(|w| w.starts_with("--")) else { continue };
            let line = block
                .text
                .lines()
                .find(|l| !l.trim_start().starts_with('#') && l.split_whitespace().any(|w| w == flag))
                .unwrap();
            let broken = Block {
                line: block.line,
                lang: "sh".into(),
                rest: String::new(),
                text: block.text.replacen(line, &line.replacen(flag.as_str(), &format!("{flag}x"), 1), 1),
            };
            let problems = check_block(&broken);
            assert!(
                problems.iter().any(|p| p.contains(&format!("{flag}x"))),
                "README.md:{}: `{flag}x` in `{}` not caught: {problems:?}",
                block.line,
                words.join(" ")
            );
        }
    }
    assert!(tools >= 30, "the README's tool commands: {tools}");
    // The words of a command line, as the check reads them.
    let words =
        commands("A=1 PATH=$(x y)/bin:$PATH rubick-fit fit p.csv \\\n  --job 'j k.yaml' > out 2>&1 # c\nmake test");
    assert_eq!(words, vec![vec!["rubick-fit", "fit", "p.csv", "--job", "j k.yaml"], vec!["make", "test"]]);
    assert!(
        !check_block(&Block { line: 0, lang: "sh".into(), rest: String::new(), text: "make no-such-target\n".into() })
            .is_empty()
    );
}

/// A job without `perfModel:` is planned on the FLOPs default with a
/// warning on stderr naming the job and the commands that fit a model; with its model,
/// no warning.
#[test]
fn a_job_without_a_model_is_scheduled_with_a_warning() {
    let dir = temp();
    let profile = "job,model,plan,placement,iter_time_s
bert-0,bert,dp1-tp1-pp1-mb16-ga2,1,2.10
bert-0,bert,dp2-tp1-pp1-mb16-ga1-z2,2,1.12
bert-0,bert,dp4-tp1-pp1-mb8-ga1-z2,4,0.61
bert-0,bert,dp8-tp1-pp1-mb4-ga1-z2,8,0.35
";
    let job = "apiVersion: rubick/v1
kind: Job
name: bert-0
model: { name: bert, parameters: 336297858, layers: 24, hidden: 1536, heads: 16, seqLen: 1024, globalBatch: 32 }
iterations: 20000
request: { gpus: 4, cpus: 32, plan: dp4-tp1-pp1-mb8-ga1-z2 }
";
    std::fs::write(dir.path().join("profile.csv"), profile).unwrap();
    std::fs::write(dir.path().join("job.yaml"), job).unwrap();
    std::fs::write(dir.path().join("modelled.yaml"), format!("{job}perfModel: model.yaml\n")).unwrap();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let schedule = |jobs: &str| {
        let args = ["schedule", "--cluster", cluster.as_str(), "--jobs", jobs, "-o", "s.yaml"];
        let run = run_in(dir.path(), "rubick-plan", &args);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        run.stderr
    };
    let err = schedule("job.yaml");
    let warning = err.lines().find(|l| l.contains("WARN") && l.contains("`bert-0`")).unwrap_or_else(|| panic!("{err}"));
    assert!(warning.contains("no perfModel") && warning.contains("default model"), "{warning}");
    assert!(
        warning.contains("rubick-fit fit profile.csv --job job.yaml") && warning.contains("perfModel: model.yaml"),
        "how to fit one: {warning}"
    );
    // From stdin (the cron round) too, the job named.
    let piped = Command::new(binary("rubick-plan"))
        .args(["schedule", "--cluster", cluster.as_str(), "--jobs", "-", "-o", "s.yaml"])
        .current_dir(dir.path())
        .env_remove("RUST_LOG")
        .stdin(std::fs::File::open(dir.path().join("job.yaml")).unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&piped.stderr);
    // The job is named; its file is not known (stdin), so none is guessed.
    assert!(err.contains("job `bert-0` has no perfModel") && err.contains("--job JOB.yaml"), "{err}");
    let fit = run_in(
        dir.path(),
        "rubick-fit",
        &["fit", "profile.csv", "--job", "job.yaml", "--cluster", cluster.as_str(), "-o", "model.yaml"],
    );
    assert_eq!(fit.code, Some(0), "{}", fit.stderr);
    let err = schedule("modelled.yaml");
    assert!(!err.contains("perfModel"), "a job with its model is planned without the warning:\n{err}");
}

/// The README says where the reference data must be (and the blocks
/// read it from there), and no command of a block writes outside the directory it
/// runs in (`/var/lib/rubick` is a server's, and the tests run as root).
#[test]
fn the_readme_says_where_the_reference_data_must_be() {
    let text = readme();
    assert!(text.contains("`../shared/reference/`, a directory beside the clone"), "README: where the reference lives");
    for (block, _) in sh_blocks(&text) {
        for words in commands(&block.text) {
            let shown = words.join(" ");
            assert!(!shown.contains("/var/lib/"), "README.md:{}: `{shown}` writes under /var/lib", block.line);
            if shown.contains("shared/reference") {
                assert!(shown.contains("../shared/reference/"), "README.md:{}: `{shown}`", block.line);
            }
        }
    }
}
