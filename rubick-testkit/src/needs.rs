//! A skip a person sees, for tests that need something absent (a GPU, Slurm, PyTorch,
//! `../shared`). `cargo test` captures a test's stderr, so `make test` sets
//! `RUBICK_SKIPPED` to a file, each skip appends a line to it (the test's name and the
//! reason), and the Makefile lists them after the run. What CI has ([`Need`]) is
//! required there: a test that cannot run for want of it fails instead of skipping.

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

/// What a test may need beyond cargo and this checkout. CI has every one of them, so
/// under `CI=true` each is required; elsewhere its `RUBICK_REQUIRE_*` variable set to
/// `1` requires it, and set to `0` lets its tests skip even under CI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Need {
    /// A Slurm controller this machine submits to (`scripts/slurm-up.sh`).
    Slurm,
    /// Slurm's accounting: `sacct` answers (`SLURM_ACCOUNTING=1 scripts/slurm-up.sh`).
    SlurmAccounting,
    /// The PyTorch workload's virtual environment (`scripts/python-env.sh`).
    PyTorch,
    /// The authors' reference data: `../shared/reference` beside the checkout, or
    /// `$RUBICK_REFERENCE`.
    Reference,
    /// The Kubeflow CRDs (`../shared/reference/engines/kubeflow`).
    Crds,
    /// Root, to mount a small file system.
    Root,
}

impl Need {
    /// The variable that requires (`1`) or excuses (`0`) this need.
    pub fn variable(self) -> &'static str {
        match self {
            Need::Slurm => "RUBICK_REQUIRE_SLURM",
            Need::SlurmAccounting => "RUBICK_REQUIRE_SLURM_ACCOUNTING",
            Need::PyTorch => "RUBICK_REQUIRE_PYTORCH",
            Need::Reference => "RUBICK_REQUIRE_REFERENCE",
            Need::Crds => "RUBICK_REQUIRE_CRDS",
            Need::Root => "RUBICK_REQUIRE_ROOT",
        }
    }

    /// Whether a test that lacks this need fails rather than skips: its variable is
    /// `1`, or `CI` is `true` and its variable is not `0`.
    pub fn required(self) -> bool {
        let var = std::env::var(self.variable());
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        var.as_deref() == Ok("1") || (ci && var.as_deref() != Ok("0"))
    }
}

/// Reports that the calling test did not run because `need` is missing (`reason` says
/// how, and what to start); fails it where the need is required ([`Need::required`]).
pub fn missing(need: Need, reason: &str) {
    let variable = need.variable();
    assert!(
        !need.required(),
        "{need:?} is required here (CI=true or {variable}=1; {variable}=0 excuses it) but {reason}"
    );
    skip(reason);
}
