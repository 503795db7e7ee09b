//! The test kit of the workspace's integration tests (`tests/it`, one binary): the real
//! tools run in temporary directories ([`run_in`], [`temp`]), the processes a test
//! started reaped ([`Reaper`]), what a test needs beyond cargo found or the test skipped
//! visibly and failed under CI ([`needs`], [`reference`], [`venv`], [`slurm_nodes`]),
//! and locks that hold across every `cargo test` on this machine ([`lock`]).

mod locks;
mod needs;
mod processes;
mod slurm;

pub use locks::{Held, Lock, lock};
pub use needs::{Need, SlurmNodes, SlurmShape, external, needs, reference, slurm_nodes, venv};
pub use processes::{Reaper, alive, escaping_script};
pub use slurm::{Undrain, drain};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (the workspace). Read at run time, so that a test binary built
/// from another checkout sharing the target directory still looks here.
pub fn repo() -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .parent()
    .expect("tests/ has a parent")
    .to_path_buf()
}

/// A built rubick tool, found beside the test executable's directory
/// (`target/<profile>/deps/..`). `make test` builds the tools first (`cargo build
/// --workspace --bins`): cargo builds a package's binaries for its own integration tests
/// only, and the tools have none.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built: `cargo build --workspace --bins` first (make test does)", path.display());
    path
}

/// Result of one run of a binary.
#[derive(Debug)]
pub struct Run {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its standard output, lossily decoded.
    pub stdout: String,
    /// Its standard error, lossily decoded.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Runs `name args...` in `dir` with logs off unless asked.
pub fn run_in(dir: &Path, name: &str, args: &[&str]) -> Run {
    Command::new(binary(name))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("binary starts")
        .into()
}

/// A fresh temporary directory for one test.
pub fn temp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}
