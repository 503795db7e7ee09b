//! The Sia artifact's Philly workloads replayed on its heterogeneous cluster, with its
//! measured step times as the truth (`rubick_sim::sia`, `data/sia-workloads.md`).

use std::path::{Path, PathBuf};

use rubick_tests::{Need, repo, run_in, temp};

/// The Sia artifact's data beside the reference (`../shared/reference/sia`), and the
/// rubick reference the simulator also opens.
fn sia_dir() -> Option<(PathBuf, String)> {
    let reference = rubick_tests::reference()?;
    let sia = reference.parent()?.join("sia");
    if !sia.join("traces/cifar10").is_dir() {
        rubick_testkit::missing(Need::Reference, "../shared/reference/sia is absent (the Sia artifact's data)");
        return None;
    }
    Some((sia, reference.display().to_string()))
}

/// The first `jobs` jobs of Philly workload 1 as a workload of `dir`, beside a link to
/// the artifact's `traces/` (where the reader finds them).
fn small_workload(dir: &Path, sia: &Path, jobs: usize) -> PathBuf {
    std::os::unix::fs::symlink(sia.join("traces"), dir.join("traces")).unwrap();
    std::fs::create_dir_all(dir.join("workloads/philly")).unwrap();
    let text = std::fs::read_to_string(sia.join("workloads/philly/workload-1.csv")).unwrap();
    let head: Vec<&str> = text.lines().take(jobs + 1).collect();
    let path = dir.join("workloads/philly/head.csv");
    std::fs::write(&path, head.join("\n") + "\n").unwrap();
    path
}

fn simulate(dir: &Path, reference: &str, trace: &Path, policy: &str) -> rubick_tests::Run {
    let cluster = repo().join("data/cluster-sia-64.yaml").display().to_string();
    let trace = trace.display().to_string();
    let summary = format!("{policy}.yaml");
    let args = [
        "simulate",
        "--cluster",
        &cluster,
        "--reference",
        reference,
        "--trace",
        &trace,
        "--policy",
        policy,
        "--summary",
        &summary,
    ];
    run_in(dir, "rubick-plan", &args)
}

fn summary(dir: &Path, policy: &str) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join(format!("{policy}.yaml"))).unwrap()).unwrap()
}

/// Every job of the workload's head finishes under rubick, Sia and a static queue,
/// each replay byte-identical to the next, and the truth is the artifact's tables
/// (mostly measured rows, never the belief).
#[test]
fn the_sia_workloads_replay_under_every_policy_on_the_artifacts_step_times() {
    let Some((sia, reference)) = sia_dir() else { return };
    let dir = temp();
    let trace = small_workload(dir.path(), &sia, 24);
    for policy in ["rubick", "sia", "static"] {
        let run = simulate(dir.path(), &reference, &trace, policy);
        assert_eq!(run.code, Some(0), "{policy}: {}", run.stderr);
        let s = summary(dir.path(), policy);
        assert_eq!(s["jobs"].as_u64(), Some(24), "{policy}");
        assert_eq!(s["unfinished"]["mean"].as_f64(), Some(0.0), "{policy}");
        let measured = s["truth"]["measured"]["mean"].as_f64().unwrap();
        assert!(measured > 0.5, "{policy}: {measured} of the running time on measured rows");
    }
    let first = std::fs::read(dir.path().join("rubick.yaml")).unwrap();
    let again = simulate(dir.path(), &reference, &trace, "rubick");
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert_eq!(first, std::fs::read(dir.path().join("rubick.yaml")).unwrap(), "the same inputs, the same summary");
}

/// A bad row names the file, the line and the field, and exits 2.
#[test]
fn a_bad_sia_workload_row_names_its_line_and_field() {
    let Some((sia, reference)) = sia_dir() else { return };
    let dir = temp();
    let trace = small_workload(dir.path(), &sia, 3);
    let text = std::fs::read_to_string(&trace).unwrap();
    for (bad, field) in [(",cifar10,", "application"), (",6,", "num_replicas")] {
        let broken = match field {
            "application" => text.replacen(bad, ",resnet9000,", 1),
            _ => text.replacen(bad, ",0.5,", 1),
        };
        assert_ne!(broken, text, "{field}: the fixture changed");
        std::fs::write(&trace, &broken).unwrap();
        let run = simulate(dir.path(), &reference, &trace, "rubick");
        assert_eq!(run.code, Some(2), "{field}: {}", run.stderr);
        assert!(run.stderr.contains("head.csv: line ") && run.stderr.contains(field), "{field}: {}", run.stderr);
    }
}
