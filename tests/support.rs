//! Helpers for the end-to-end tests: run the real binaries in a temporary directory.

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

/// A built rubick binary, found beside the test executable's directory
/// (`target/<profile>/deps/..`). `cargo test --workspace` builds every tool's binary
/// before it runs any test, because each tool has integration tests of its own.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = dir.join(name);
    assert!(path.is_file(), "{} is not built: run the tests with `cargo test --workspace` (make test)", path.display());
    path
}

/// Result of one run of a binary.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
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

/// Kills, when dropped, every process whose command line or environment names `.0`:
/// a test that fails half-way leaves no workload of its temporary directory running.
#[derive(Debug)]
pub struct Reaper(pub PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let needle = self.0.display().to_string();
        let me = std::process::id();
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if pid == me {
                continue;
            }
            let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
            let named = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).contains(&needle);
            if named(read("cmdline")) || named(read("environ")) {
                let _ = Command::new("kill").args(["-s", "KILL", &pid.to_string()]).status();
            }
        }
    }
}

/// Whether process `pid` lives (exists and is not a zombie).
pub fn alive(pid: &str) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z")
}

/// `DIR/escaper.sh`: starts `sleep 300` in a session of its own (as torchrun starts its
/// workers), writes its pid to `DIR/escaped.pid`, then becomes `sh DIR/work.sh`.
pub fn escaping_script(dir: &Path) -> PathBuf {
    let script = dir.join("escaper.sh");
    let text = format!(
        "setsid sleep 300 &\necho $! > {}\nexec sh {}\n",
        dir.join("escaped.pid").display(),
        dir.join("work.sh").display()
    );
    std::fs::write(&script, text).expect("the escaper script");
    script
}

/// The usable nodes (with GPUs, when `gpus`) of the Slurm this machine submits to, in
/// Slurm's order, when there are at least `needed` (`scripts/slurm-up.sh --nodes 3
/// --gpus-per-node 2`, as CI starts it); else the test is reported skipped (failed
/// under CI's `RUBICK_REQUIRE_SLURM`) and `None`.
pub fn slurm_nodes(needed: usize, gpus: bool) -> Option<Vec<String>> {
    let require = |reason: &str| rubick_io::testing::skip_unless_required("RUBICK_REQUIRE_SLURM", reason);
    if let Err(reason) = rubick_launch::slurm::available() {
        require(&reason);
        return None;
    }
    let usable: Vec<String> = rubick_launch::slurm::nodes()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.usable() && (!gpus || n.gpus > 0))
        .map(|n| n.name)
        .collect();
    if usable.len() < needed {
        let with = if gpus { " with GPUs" } else { "" };
        require(&format!(
            "{} usable Slurm node(s){with}, {needed} needed (scripts/slurm-up.sh --nodes 3 --gpus-per-node 2)",
            usable.len()
        ));
        return None;
    }
    Some(usable)
}

/// Drains a node of the test Slurm (`scontrol update ... state=drain`).
pub fn drain(node: &str) {
    let ok = Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=drain", "reason=rubick-test"])
        .status()
        .expect("scontrol runs");
    assert!(ok.success(), "scontrol update nodename={node} state=drain");
}

/// Resumes the nodes when dropped (a failed test leaves none drained).
#[derive(Debug)]
pub struct Undrain(pub Vec<String>);

impl Drop for Undrain {
    fn drop(&mut self) {
        for node in &self.0 {
            // A node that was never drained refuses the resume: nothing to say.
            let _ = Command::new("scontrol").args(["update", &format!("nodename={node}"), "state=resume"]).output();
        }
    }
}
