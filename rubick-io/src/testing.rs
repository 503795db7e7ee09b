//! For tests that need something absent (a GPU, Slurm, PyTorch, `../shared`): a skip
//! a person sees. `cargo test` captures a test's stderr, so `make test` sets
//! `RUBICK_SKIPPED` to a file, each skip appends a line to it (the test's name and the
//! reason), and the Makefile lists them after the run.

use std::io::Write as _;

/// Reports that the calling test did not run, and why.
pub fn skip(reason: &str) {
    eprintln!("skipped: {reason}");
    if let Some(path) = std::env::var_os("RUBICK_SKIPPED")
        && let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        // One line per skip, whatever the reason quotes.
        let reason: Vec<&str> = reason.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        // One write of the whole line: appends from parallel tests do not interleave.
        let line = format!("{test}: {}\n", reason.join(" / "));
        let _ = file.write_all(line.as_bytes());
    }
}
