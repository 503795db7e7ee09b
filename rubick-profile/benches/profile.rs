//! `make bench`, the profiler's figures: the PyTorch reference workload profiled for
//! real on this machine across the configurations of `examples/pytorch/configs-bench.csv`
//! (sequentially, as on a CPU cluster), its model fitted on 4 of them (chosen by
//! rubick-core's selection rule) and checked on the others.
//!
//! * `pytorch_cpu_holdout_error_pct`: mean |predicted - measured| / measured of the
//!   held-out configurations' iteration times;
//! * `profile_overhead_pct`: wall time of `rubick-profile run` over the sum of its
//!   runs' own wall times (each from its start to its exit), minus 1.
//!
//! Needs the workload's venv (`scripts/python-env.sh`; `make bench` runs it): without
//! it, says why on stderr and prints no figure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rubick_core::tables::{PROFILE, ProfileRow};
use rubick_core::{Cluster, Job};
use rubick_model::fit::{FitOptions, Observation, fit};
use rubick_model::perfmodel::predict;
use rubick_model::select::{Candidate, select};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
}

fn main() -> anyhow::Result<()> {
    let venv = std::env::var_os("RUBICK_VENV").map_or_else(|| PathBuf::from("/var/tmp/rubick-venv"), PathBuf::from);
    if !venv.join(".rubick-ok").exists() {
        eprintln!("bench profile: no PyTorch venv at {} (scripts/python-env.sh); no figures", venv.display());
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let exe = env!("CARGO_BIN_EXE_rubick-profile");
    let cluster_path = dir.path().join("local.yaml");
    let status = Command::new(exe).args(["-q", "devices", "--cluster-out"]).arg(&cluster_path).output()?;
    anyhow::ensure!(status.status.success(), "devices: {}", String::from_utf8_lossy(&status.stderr));
    let output = dir.path().join("profile.csv");
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let start = Instant::now();
    let run = Command::new(exe)
        .args(["run", "examples/pytorch/job.yaml", "--configs", "examples/pytorch/configs-bench.csv", "--cluster"])
        .arg(&cluster_path)
        .arg("-o")
        .arg(&output)
        .current_dir(repo())
        .env("PATH", path)
        .output()?;
    let wall = start.elapsed().as_secs_f64();
    anyhow::ensure!(run.status.success(), "rubick-profile run: {}", String::from_utf8_lossy(&run.stderr));
    let rows: Vec<ProfileRow> = rubick_io::table::read_rows(&output, &PROFILE)?;
    let own: f64 = rows.iter().filter_map(|r| r.wall_s).sum();
    eprintln!("{}", String::from_utf8_lossy(&run.stderr));

    let job: Job = rubick_io::files::load_artifact(&repo().join("examples/pytorch/job.yaml"))?;
    let cluster: Cluster = rubick_io::files::load_artifact(&cluster_path)?;
    let observations: Vec<Observation> = rubick_fit::profile_observations(&output, &job, &cluster)?;
    let candidates: Vec<Candidate> =
        observations.iter().map(|o| Candidate { plan: o.plan, placement: o.placement.clone() }).collect();
    let chosen = select(&candidates, 4);
    let (train, held): (Vec<_>, Vec<_>) = observations.iter().enumerate().partition(|(i, _)| chosen.contains(i));
    let train: Vec<Observation> = train.into_iter().map(|(_, o)| o.clone()).collect();
    let fitted = fit(&job.model, &train, &FitOptions::default()).map_err(|e| anyhow::anyhow!("fit: {e}"))?;
    let errors: Vec<f64> = held
        .iter()
        .map(|(_, o)| {
            let t = predict(&job.model, &o.plan, &o.placement, &o.links, &fitted.params).total;
            eprintln!(
                "bench profile: held out {} on {}: measured {:.4} s, predicted {t:.4} s",
                o.plan, o.placement, o.iter_time_s
            );
            (t - o.iter_time_s).abs() / o.iter_time_s
        })
        .collect();
    anyhow::ensure!(!errors.is_empty(), "no held-out configuration measured");
    let error = errors.iter().sum::<f64>() / errors.len() as f64;
    println!("bench: pytorch_cpu_configurations {} count", rows.len());
    println!("bench: pytorch_cpu_holdout_error_pct {:.1} %", error * 100.0);
    println!("bench: profile_overhead_pct {:.2} %", (wall / own - 1.0) * 100.0);
    println!("bench: profile_wall_s {wall:.1} s");
    Ok(())
}
