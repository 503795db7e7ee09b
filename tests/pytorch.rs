//! The real thing: `rubick-profile` measures the PyTorch reference workload
//! (`examples/pytorch/`) on this machine's CPU, locally and through a real Slurm, and
//! `rubick-fit` fits what it measured. Timing cannot break these tests: they assert
//! rows, columns, statuses, a fit, an out-of-memory configuration recorded as `oom`.
//!
//! They need the workload's virtual environment (`scripts/python-env.sh`, which `make
//! test` runs) and, for Slurm, a running controller (`scripts/slurm-up.sh`, which CI
//! runs). Without one they skip with the reason, unless `RUBICK_REQUIRE_PYTORCH=1` /
//! `RUBICK_REQUIRE_SLURM=1` (CI sets both) makes the absence a failure.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use rubick_tests::{binary, repo, temp};

/// The runs share this machine's few cores: one test at a time.
static MACHINE: Mutex<()> = Mutex::new(());

/// DP 1 and 2, accumulation, checkpointing, ZeRO-1 and ZeRO-3: what runs on a CPU.
const CONFIGS: &str = "plan,placement
dp1-tp1-pp1-mb4-ga4,1
dp1-tp1-pp1-mb8-ga2,1
dp1-tp1-pp1-mb4-ga4-gc,1
dp2-tp1-pp1-mb4-ga2,2
dp2-tp1-pp1-mb4-ga2-z1,2
dp2-tp1-pp1-mb8-ga1-z3,2
";

fn require(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// The workload's venv, or why there is none.
fn venv() -> Result<PathBuf, String> {
    let dir = std::env::var_os("RUBICK_VENV").map_or_else(|| PathBuf::from("/var/tmp/rubick-venv"), PathBuf::from);
    let python = dir.join("bin/python");
    if !dir.join(".rubick-ok").exists() || !python.exists() {
        return Err(format!("no PyTorch virtual environment at {} (run scripts/python-env.sh)", dir.display()));
    }
    Ok(dir)
}

/// Skips (printing why) or, when required, fails.
fn skip(var: &str, reason: &str) {
    assert!(!require(var), "{var}=1 but {reason}");
    eprintln!("skipped: {reason}");
}

fn profile(dir: &Path, venv: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(binary("rubick-profile"))
        .arg("-v")
        .args(["run", "examples/pytorch/job.yaml", "--cluster"])
        .arg(dir.join("local.yaml"))
        .args(extra)
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .expect("rubick-profile starts");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn cluster_of_this_machine(dir: &Path) {
    let out = Command::new(binary("rubick-profile"))
        .args(["devices", "--cluster-out"])
        .arg(dir.join("local.yaml"))
        .output()
        .expect("rubick-profile starts");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Columns of a CSV profile by name.
fn column(csv: &str, name: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let i = header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}: {header:?}"));
    lines.map(|l| l.split(',').nth(i).unwrap_or_default().to_owned()).collect()
}

fn check_profile(csv: &str, stderr: &str) {
    assert_eq!(column(csv, "status"), vec!["ok"; 6], "every configuration measured: {csv}\n{stderr}");
    assert_eq!(column(csv, "job"), vec!["gpt-tiny"; 6]);
    for name in ["iter_time_s", "iter_time_sd_s", "samples_per_s", "wall_s", "peak_gpu_memory_gib"] {
        let values = column(csv, name);
        assert!(values.iter().all(|v| v.parse::<f64>().is_ok_and(|x| x >= 0.0)), "{name}: {values:?}");
    }
    assert!(column(csv, "iterations").iter().all(|v| v.parse::<u32>().is_ok_and(|n| n >= 3)), "{csv}");
}

fn fit(dir: &Path, profile: &Path) {
    let out = Command::new(binary("rubick-fit"))
        .args(["fit"])
        .arg(profile)
        .args(["--job", "examples/pytorch/job.yaml", "--cluster"])
        .arg(dir.join("local.yaml"))
        .arg("-o")
        .arg(dir.join("model.yaml"))
        .current_dir(repo())
        .output()
        .expect("rubick-fit starts");
    assert!(out.status.success(), "the fit of a real profile: {}", String::from_utf8_lossy(&out.stderr));
    let model = std::fs::read_to_string(dir.join("model.yaml")).unwrap();
    assert!(model.contains("kind: PerfModel") && model.contains("parameters:"), "{model}");
}

#[test]
fn the_pytorch_workload_is_profiled_for_real_and_fitted() {
    let venv = match venv() {
        Ok(v) => v,
        Err(reason) => return skip("RUBICK_REQUIRE_PYTORCH", &reason),
    };
    let _machine = MACHINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = temp();
    cluster_of_this_machine(dir.path());
    std::fs::write(dir.path().join("configs.csv"), CONFIGS).unwrap();
    let out = dir.path().join("profile.csv");
    let (code, stderr) = profile(
        dir.path(),
        &venv,
        &["--configs", dir.path().join("configs.csv").to_str().unwrap(), "-o", out.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let csv = std::fs::read_to_string(&out).unwrap();
    check_profile(&csv, &stderr);
    fit(dir.path(), &out);

    // A memory cap the workload cannot meet: the configuration is infeasible, recorded
    // as such, and the profile goes on (exit 0: out of memory is an answer).
    std::fs::write(dir.path().join("one.csv"), "plan,placement\ndp1-tp1-pp1-mb16-ga1,1\n").unwrap();
    let capped = dir.path().join("capped.yaml");
    let job = std::fs::read_to_string(repo().join("examples/pytorch/job.yaml")).unwrap();
    let job = job.replace("  version: 1\n", "  version: 1\n  env: { RUBICK_MAX_MEMORY_GIB: \"0.05\" }\n");
    assert!(job.contains("RUBICK_MAX_MEMORY_GIB"), "{job}");
    std::fs::write(&capped, job).unwrap();
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new(binary("rubick-profile"))
        .arg("run")
        .arg(&capped)
        .arg("--cluster")
        .arg(dir.path().join("local.yaml"))
        .arg("--configs")
        .arg(dir.path().join("one.csv"))
        .arg("-o")
        .arg(dir.path().join("oom.csv"))
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let oom = std::fs::read_to_string(dir.path().join("oom.csv")).unwrap();
    assert_eq!(column(&oom, "status"), ["oom"], "{oom}");
}

#[test]
fn the_same_profile_runs_through_a_real_slurm() {
    let venv = match venv() {
        Ok(v) => v,
        Err(reason) => return skip("RUBICK_REQUIRE_PYTORCH", &reason),
    };
    if let Err(reason) = rubick_launch::slurm::available() {
        return skip("RUBICK_REQUIRE_SLURM", &reason);
    }
    let _machine = MACHINE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = temp();
    cluster_of_this_machine(dir.path());
    std::fs::write(dir.path().join("configs.csv"), CONFIGS).unwrap();
    let out = dir.path().join("slurm.csv");
    let (code, stderr) = profile(
        dir.path(),
        &venv,
        &[
            "--backend",
            "slurm",
            "--configs",
            dir.path().join("configs.csv").to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    check_profile(&std::fs::read_to_string(&out).unwrap(), &stderr);
    fit(dir.path(), &out);
}
