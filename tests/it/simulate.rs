//! End-to-end simulations on the authors' naive trace: every output, determinism,
//! the comparison table, and bad traces.

use rubick_tests::{Need, needs, repo, run_in, temp};

/// The reference data's directory (the simulator's truth).
fn reference_dir() -> Option<String> {
    rubick_tests::reference().map(|dir| dir.display().to_string())
}

fn simulate(dir: &std::path::Path, reference: &str, policy: &str, out: &str) -> rubick_tests::Run {
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let trace = format!("{reference}/workloads/naive.csv");
    run_in(
        dir,
        "rubick-plan",
        &[
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
            &format!("{out}.yaml"),
            "--jobs-out",
            &format!("{out}.csv"),
            "--plot-dir",
            &format!("{out}-plots"),
        ],
    )
}

#[test]
fn the_naive_trace_finishes_under_every_policy_and_replays_identically() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    for policy in [
        "rubick",
        "rubick-milp",
        "static",
        "static-backfill",
        "synergy",
        "static-guaranteed-first",
        "sia",
        "pollux",
        "rubick-gpus-only",
        "rubick-no-plan",
        "rubick-no-resize",
    ] {
        let run = simulate(dir.path(), &reference, policy, policy);
        assert_eq!(run.code, Some(0), "{policy}: {}", run.stderr);
        let summary: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(dir.path().join(format!("{policy}.yaml"))).unwrap())
                .unwrap();
        assert_eq!(summary["apiVersion"].as_str(), Some("rubick/v1"), "{policy}");
        assert_eq!(summary["kind"].as_str(), Some("SimulationSummary"), "{policy}");
        for key in [
            "avgJctS",
            "avgJctAllS",
            "medianJctS",
            "p99JctS",
            "makespanS",
            "restarts",
            "gpuHours",
            "guaranteeViolations",
            "unfinished",
        ] {
            assert!(summary[key].get("mean").is_some(), "{policy}: summary lacks {key}");
        }
        for basis in ["measured", "interpolated", "extrapolated"] {
            assert!(summary["truth"][basis]["mean"].as_f64().is_some(), "{policy}: no {basis} share");
        }
        // No wall time in an artifact: the same inputs give the same bytes.
        assert!(summary.get("simWallS").is_none() && summary.get("sim_wall_s").is_none());
        assert_eq!(summary["jobs"].as_u64(), Some(10), "{policy}");
        assert_eq!(summary["unfinished"]["max"].as_f64(), Some(0.0), "{policy}: every job finishes");
        assert_eq!(summary["truthMode"].as_str(), Some("oracle"), "{policy}");
        let csv = std::fs::read_to_string(dir.path().join(format!("{policy}.csv"))).unwrap();
        assert!(csv.starts_with("job,model,submit_s,first_start_s,finish_s,jct_s,queueing_s,restarts,"), "{csv}");
        assert_eq!(csv.lines().count(), 11);
        for plot in ["jct-cdf.png", "gpus-in-use.png", "gantt.png"] {
            let png = std::fs::read(dir.path().join(format!("{policy}-plots/{plot}"))).unwrap();
            assert!(png.starts_with(b"\x89PNG"), "{policy}: {plot}");
        }
    }
    // The static policies never reconfigure.
    let s: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.path().join("static.yaml")).unwrap()).unwrap();
    assert_eq!(s["restarts"]["max"].as_f64(), Some(0.0));
    // Same inputs, same per-job table and summary, byte for byte.
    let run = simulate(dir.path(), &reference, "rubick", "again");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    for ext in ["csv", "yaml"] {
        assert_eq!(
            std::fs::read(dir.path().join(format!("rubick.{ext}"))).unwrap(),
            std::fs::read(dir.path().join(format!("again.{ext}"))).unwrap(),
            "{ext}"
        );
    }
    // The summary is an artifact `check` validates.
    let run = run_in(dir.path(), "rubick-plan", &["check", "rubick.yaml"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Side by side.
    let run = run_in(dir.path(), "rubick-plan", &["compare", "rubick.yaml", "static.yaml", "--plot", "cdf.svg"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.starts_with("| trace | policy |"), "{}", run.stdout);
    assert!(run.stdout.contains("| naive | rubick |") && run.stdout.contains("| naive | static |"), "{}", run.stdout);
    assert!(std::fs::read_to_string(dir.path().join("cdf.svg")).unwrap().contains("<svg"));
}

#[test]
fn a_bad_trace_exits_2_naming_file_and_line() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    std::fs::write(
        dir.path().join("bad.csv"),
        "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n\
         a,0,10,vit,2,16,0,zero-dp,100,0\n\
         b,5,10,resnet,2,16,0,ga,100,0\n",
    )
    .unwrap();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", "bad.csv", "--summary", "s.yaml"],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("bad.csv") && run.stderr.contains("line 3") && run.stderr.contains("resnet"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("s.yaml").exists());
}

#[test]
fn a_job_batch_is_a_trace_too() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let run =
        run_in(dir.path(), "rubick-plan", &["synth", "--gpus", "64", "--jobs", "12", "--seed", "3", "--out-dir", "s"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &[
            "simulate",
            "--cluster",
            "s/cluster.yaml",
            "--reference",
            &reference,
            "--trace",
            "s/jobs.yaml",
            "--summary",
            "-",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let summary: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).unwrap();
    assert_eq!(summary["jobs"].as_u64(), Some(12));
    assert_eq!(summary["unfinished"]["max"].as_f64(), Some(0.0), "{}", run.stdout);
}

/// The naive trace on the 8x8 cluster with the summary on stdout, plus `extra` flags.
fn simulate_naive(dir: &std::path::Path, reference: &str, extra: &[&str]) -> rubick_tests::Run {
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let trace = format!("{reference}/workloads/naive.csv");
    let mut args =
        vec!["simulate", "--cluster", &cluster, "--reference", reference, "--trace", &trace, "--summary", "-"];
    args.extend_from_slice(extra);
    run_in(dir, "rubick-plan", &args)
}

#[test]
fn measured_only_keeps_the_truth_measured() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let share = |extra: &[&str]| {
        let run = simulate_naive(dir.path(), &reference, extra);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let s: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).unwrap();
        assert_eq!(s["unfinished"]["max"].as_f64(), Some(0.0));
        s["truth"]["measured"]["mean"].as_f64().unwrap()
    };
    // Scaling out without the efficiency bar reaches unmeasured GPU counts.
    let free = share(&["--scale-out-efficiency", "0"]);
    let measured = share(&["--scale-out-efficiency", "0", "--measured-only"]);
    assert!(free < 0.9, "the free planner runs unmeasured configurations here ({free})");
    assert_eq!(measured, 1.0, "every configuration measured");
}

#[test]
fn srpt_orders_by_predicted_remaining_gpu_time() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    // Both want the whole cluster. The ViT job has 160x the samples left but a small
    // fraction of the GPU-time: shortest remaining work first starts it first.
    std::fs::write(
        dir.path().join("two.yaml"),
        "apiVersion: rubick/v1\nkind: JobBatch\njobs:\n\
         - name: big-batch\n  model: { name: vit, parameters: 85952456, layers: 12, hidden: 768, heads: 12, seqLen: 1024, globalBatch: 64 }\n  iterations: 10000\n  submitTimeS: 0\n  request: { gpus: 64, plan: zero-dp }\n\
         - name: long\n  model: { name: llama30, parameters: 32528943616, layers: 60, hidden: 6656, heads: 52, seqLen: 1024, globalBatch: 4 }\n  iterations: 1000\n  submitTimeS: 0\n  request: { gpus: 64, plan: \"444\" }\n",
    )
    .unwrap();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &[
            "simulate",
            "--cluster",
            &cluster,
            "--reference",
            &reference,
            "--trace",
            "two.yaml",
            "--policy",
            "static",
            "--queue",
            "srpt",
            "--summary",
            "s.yaml",
            "--jobs-out",
            "-",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let start = |name: &str| -> f64 {
        let line = run.stdout.lines().find(|l| l.starts_with(&format!("{name},"))).unwrap();
        line.split(',').nth(3).unwrap().parse().unwrap()
    };
    assert!(start("big-batch") < start("long"), "{}", run.stdout);
}

#[test]
fn a_pessimistic_truth_slows_only_extrapolated_configurations() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let sim = |extra: &[&str]| simulate_naive(dir.path(), &reference, extra);
    let summary = |run: &rubick_tests::Run| -> serde_yaml_ng::Value {
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        serde_yaml_ng::from_str(&run.stdout).unwrap()
    };
    // Everything measured: the slowdown changes nothing but the record of it.
    let (a, b) =
        (summary(&sim(&["--measured-only"])), summary(&sim(&["--measured-only", "--extrapolated-slowdown", "0.5"])));
    assert_eq!(a["avgJctS"], b["avgJctS"]);
    assert_eq!(a["jctS"], b["jctS"]);
    assert_eq!(b["extrapolatedSlowdown"].as_f64(), Some(0.5));
    let bad = sim(&["--extrapolated-slowdown", "1.5"]);
    assert_eq!(bad.code, Some(2));
    assert!(bad.stderr.contains("--extrapolated-slowdown"), "{}", bad.stderr);
    // Two artifacts cannot share stdout.
    let bad = sim(&["--jobs-out", "-"]);
    assert_eq!(bad.code, Some(2));
    assert!(bad.stderr.contains("--jobs-out") && bad.stdout.is_empty(), "{}", bad.stderr);
}

#[test]
fn seeds_report_the_spread_and_replay_identically() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let flags = ["--policy", "static-backfill", "--seeds", "3", "--noise", "0.05"];
    let a = simulate_naive(dir.path(), &reference, &flags);
    assert_eq!(a.code, Some(0), "{}", a.stderr);
    let s: serde_yaml_ng::Value = serde_yaml_ng::from_str(&a.stdout).unwrap();
    assert_eq!(s["seeds"].as_u64(), Some(3));
    let jct = &s["avgJctS"];
    assert!(jct["sd"].as_f64().unwrap() > 0.0, "noise moves the replicas apart: {jct:?}");
    assert!(jct["min"].as_f64().unwrap() < jct["max"].as_f64().unwrap());
    let b = simulate_naive(dir.path(), &reference, &flags);
    assert_eq!(a.stdout, b.stdout, "same seeds, same bytes");
    // No noise: every replica is the same run.
    let c = simulate_naive(dir.path(), &reference, &["--policy", "static-backfill", "--seeds", "2"]);
    let s: serde_yaml_ng::Value = serde_yaml_ng::from_str(&c.stdout).unwrap();
    assert_eq!(s["avgJctS"]["sd"].as_f64(), Some(0.0));
}

/// A JobBatch trace in a temp dir, simulated with `flags` and the summary on stdout.
fn simulate_batch(dir: &std::path::Path, reference: &str, batch: &str, flags: &[&str]) -> rubick_tests::Run {
    std::fs::write(dir.join("batch.yaml"), batch).unwrap();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let mut args =
        vec!["simulate", "--cluster", &cluster, "--reference", reference, "--trace", "batch.yaml", "--summary", "-"];
    args.extend_from_slice(flags);
    run_in(dir, "rubick-plan", &args)
}

const LLAMA30: &str =
    "{ name: llama30, parameters: 32528943616, layers: 60, hidden: 6656, heads: 52, seqLen: 1024, globalBatch: 4 }";

/// Averages once covered finished jobs only: a cluster where most jobs could never
/// start reported a short average JCT.
#[test]
fn unfinished_jobs_are_counted_and_reported() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let batch = format!(
        "apiVersion: rubick/v1\nkind: JobBatch\njobs:\n\
         - name: fits\n  model: {LLAMA30}\n  iterations: 20\n  submitTimeS: 0\n  request: {{ gpus: 48, plan: \"344\" }}\n\
         - name: too-big\n  model: {LLAMA30}\n  iterations: 20\n  submitTimeS: 0\n  request: {{ gpus: 96, plan: \"644\" }}\n"
    );
    let run = simulate_batch(dir.path(), &reference, &batch, &["--policy", "static-backfill"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("did not finish"), "{}", run.stderr);
    let s: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).unwrap();
    assert_eq!(s["unfinished"]["mean"].as_f64(), Some(1.0));
    let (finished, all) = (s["avgJctS"]["mean"].as_f64().unwrap(), s["avgJctAllS"]["mean"].as_f64().unwrap());
    assert!(all > finished, "the unfinished job counts until the end: {all} vs {finished}");
    // So does the makespan (issue 41, 7: Sia's makespan read 2,195 h with a job still
    // running, at least 2,652 h): at least when the simulation stopped.
    let makespan = s["makespanS"]["mean"].as_f64().unwrap();
    assert!(
        makespan + 1.0 >= 2.0 * all - finished,
        "the makespan counts the unfinished job: {makespan} s, JCTs {all} s"
    );
}

/// Static baselines ran LLaMA-30B's `641` packed on 888, a placement never measured,
/// at the belief's speed; the authors charge the measured 444444.
#[test]
fn a_static_job_runs_its_plan_where_it_was_measured() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let batch = format!(
        "apiVersion: rubick/v1\nkind: JobBatch\njobs:\n\
         - name: l\n  model: {LLAMA30}\n  iterations: 50\n  submitTimeS: 0\n  request: {{ gpus: 24, plan: \"641\" }}\n"
    );
    for policy in ["static", "static-backfill", "synergy", "static-guaranteed-first"] {
        let run = simulate_batch(dir.path(), &reference, &batch, &["--policy", policy]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let s: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).unwrap();
        assert_eq!(s["truth"]["measured"]["mean"].as_f64(), Some(1.0), "{policy}: {}", run.stdout);
    }
}

/// Regression, "a trace with `steps 0`, duplicate names or `duration inf`: all accepted":
/// each is exit 2 naming the line.
#[test]
fn a_trace_with_steps_0_duplicate_names_or_duration_inf() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let text = std::fs::read_to_string(format!("{reference}/workloads/naive.csv")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let first: Vec<String> = lines[1].split(',').map(str::to_owned).collect();
    let with = |col: usize, value: &str| {
        let mut row = first.clone();
        row[col] = value.to_owned();
        row.join(",")
    };
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    for (name, row, says) in [
        ("steps0.csv", with(8, "0"), "steps must be at least 1"),
        ("inf.csv", with(2, "inf"), "duration must be"),
        ("dup.csv", lines[1].clone(), "used by an earlier job"),
    ] {
        lines.insert(2, row);
        std::fs::write(dir.path().join(name), lines.join("\n") + "\n").unwrap();
        lines.remove(2);
        let run = run_in(
            dir.path(),
            "rubick-plan",
            &["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", name, "--summary", "s.yaml"],
        );
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        assert!(run.stderr.contains("line 3") && run.stderr.contains(says), "{name}: {}", run.stderr);
        assert!(!dir.path().join("s.yaml").exists());
    }
}

/// A real cluster's log becomes a trace the simulator replays. The Philly
/// trace (82,247 jobs) maps reproducibly (the same seed: the same bytes; a job keeps
/// its model whatever the selection), and a Slurm cluster's `sacct -P` history does too.
#[test]
fn real_cluster_logs_become_traces_the_simulator_replays() {
    let Some(reference) = reference_dir() else { return };
    let philly = repo().join("../shared/reference/traces/philly.csv");
    if !philly.is_file() {
        rubick_testkit::missing(Need::Reference, "../shared/reference/traces/philly.csv is absent (the Philly trace)");
        return;
    }
    let dir = temp();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let philly = philly.display().to_string();
    let trace = |args: &[&str]| {
        let mut all = vec!["trace", "--cluster", cluster.as_str(), "--reference", reference.as_str()];
        all.extend_from_slice(args);
        let run = run_in(dir.path(), "rubick-plan", &all);
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        run
    };
    trace(&[&philly, "--format", "philly", "--limit", "150", "--guaranteed-share", "0.3", "-o", "a.csv"]);
    trace(&[&philly, "--format", "philly", "--limit", "150", "--guaranteed-share", "0.3", "-o", "b.csv"]);
    trace(&[&philly, "--format", "philly", "--limit", "60", "--guaranteed-share", "0.3", "-o", "short.csv"]);
    trace(&[&philly, "--format", "philly", "--limit", "150", "--seed", "2", "-o", "seed2.csv"]);
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    let (a, short) = (read("a.csv"), read("short.csv"));
    assert_eq!(a, read("b.csv"), "the same seed, the same trace");
    assert_ne!(a, read("seed2.csv"), "another seed maps jobs to other models");
    assert_eq!(a.lines().count(), 151);
    assert!(
        a.starts_with("name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n")
    );
    assert!(short.lines().all(|l| a.contains(l)), "a job keeps its mapping whatever the limit");
    let models: std::collections::BTreeSet<&str> = a.lines().skip(1).map(|l| l.split(',').nth(3).unwrap()).collect();
    assert!(models.len() >= 4, "jobs map to several models: {models:?}");
    assert!(a.lines().skip(1).any(|l| l.ends_with(",1")) && a.lines().skip(1).any(|l| l.ends_with(",0")));
    // One virtual cluster, a time window.
    let run = trace(&[&philly, "--format", "philly", "--virtual-cluster", "6214e9", "--to-s", "86400", "-o", "vc.csv"]);
    assert!(run.stderr.is_empty() || !run.stderr.contains("ERROR"), "{}", run.stderr);
    // A Slurm history: job steps, CPU-only and unfinished jobs left out.
    std::fs::write(
        dir.path().join("sacct.txt"),
        "JobID|JobName|Partition|Submit|Elapsed|State|AllocTRES\n\
         101|train|gpu|2026-11-30T08:00:00|02:00:00|COMPLETED|billing=8,cpu=8,gres/gpu=8,mem=64G,node=1\n\
         101.batch|batch|gpu|2026-11-30T08:00:00|02:00:00|COMPLETED|cpu=8,gres/gpu=8,mem=64G,node=1\n\
         102|prep|cpu|2026-11-30T08:10:00|00:05:00|COMPLETED|cpu=2,mem=4G,node=1\n\
         103|ft|gpu|2026-11-30T08:20:00|00:45:00|FAILED|cpu=4,gres/gpu:a800=2,mem=32G,node=1\n\
         104|big|gpu|2026-11-30T09:00:00|1-00:00:00|TIMEOUT|cpu=128,gres/gpu=16,mem=512G,node=2\n\
         105|next|gpu|2026-11-30T09:30:00|00:00:00|PENDING|cpu=8,gres/gpu=8\n",
    )
    .unwrap();
    trace(&["sacct.txt", "--format", "sacct", "-o", "slurm.csv"]);
    let slurm = read("slurm.csv");
    let names: Vec<&str> = slurm.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(names, ["slurm-2", "slurm-5", "slurm-6"], "{slurm}");
    // Both replay.
    for (t, out) in [("a.csv", "philly"), ("slurm.csv", "slurm")] {
        let run = run_in(
            dir.path(),
            "rubick-plan",
            &[
                "simulate",
                "--cluster",
                &cluster,
                "--reference",
                &reference,
                "--trace",
                t,
                "--summary",
                &format!("{out}.yaml"),
            ],
        );
        assert_eq!(run.code, Some(0), "{t}: {}", run.stderr);
        let summary = read(&format!("{out}.yaml"));
        assert!(summary.contains("kind: SimulationSummary"), "{summary}");
    }
    // A bad line is named.
    std::fs::write(dir.path().join("bad.txt"), "JobID|Submit|Elapsed|AllocTRES\n7|tomorrow|01:00:00|gres/gpu=1\n")
        .unwrap();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["trace", "bad.txt", "--format", "sacct", "--cluster", &cluster, "--reference", &reference, "-o", "x.csv"],
    );
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("bad.txt: line 2: Submit"), "{}", run.stderr);
    assert!(!dir.path().join("x.csv").exists());
}

/// An operator replays their own cluster. Jobs run on the project's test
/// Slurm (1, 2 and 3 fake GPUs, and one without), its `sacct -P` history becomes a
/// trace (the GPU jobs, with their GPUs and run times), and the simulator replays it.
#[test]
fn the_test_slurms_own_history_becomes_a_trace_the_simulator_replays() {
    let Some(reference) = reference_dir() else { return };
    if !needs(Need::SlurmAccounting) {
        return;
    }
    let dir = temp();
    let mut ids = Vec::new();
    // (nodes, GPUs per node, seconds): the last GPU job spans two nodes of the test
    // Slurm (`scripts/slurm-up.sh --nodes 3 --gpus-per-node 2`): 4 GPUs in all.
    for (nodes, gpus, secs) in [(1, 1, 2), (1, 2, 3), (2, 2, 5), (1, 0, 1)] {
        let mut sbatch = std::process::Command::new("sbatch");
        sbatch.args(["--parsable", "-c", "1", "-o", "/dev/null", "-J", "rubick-sacct-test"]);
        sbatch.arg(format!("--nodes={nodes}"));
        if gpus > 0 {
            sbatch.arg(format!("--gres=gpu:{gpus}"));
        }
        let out = sbatch.arg("--wrap").arg(format!("sleep {secs}")).output().unwrap();
        assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
        ids.push(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let jobs = ids.join(",");
    let sacct = |fields: &str| {
        let out = std::process::Command::new("sacct").args(["-a", "-P", "-j", &jobs, "-o", fields]).output().unwrap();
        assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Every job (steps aside) completed, as the accounting records it.
    let start = std::time::Instant::now();
    loop {
        let states = sacct("JobID,State");
        let done = states.lines().skip(1).filter(|l| !l.contains('.')).filter(|l| l.ends_with("|COMPLETED")).count();
        if done == ids.len() {
            break;
        }
        assert!(start.elapsed().as_secs() < 240, "the jobs did not complete in 240 s:\n{states}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    std::fs::write(dir.path().join("sacct.txt"), sacct("JobID,Partition,Submit,Elapsed,State,AllocTRES")).unwrap();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["trace", "sacct.txt", "--format", "sacct", "--cluster", &cluster, "--reference", &reference, "-o", "own.csv"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let trace = std::fs::read_to_string(dir.path().join("own.csv")).unwrap();
    // name,submission_time,duration,application,num_gpus,...: the three GPU jobs.
    let rows: Vec<Vec<&str>> = trace.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3, "the CPU-only job and the job steps are left out:\n{trace}");
    let mut gpus: Vec<&str> = rows.iter().map(|r| r[4]).collect();
    gpus.sort_unstable();
    assert_eq!(gpus, ["1", "2", "4"], "{trace}");
    for r in &rows {
        let duration: f64 = r[2].parse().unwrap();
        let slept = f64::from(r[4].parse::<u32>().unwrap() + 1);
        assert!(duration >= slept && duration < slept + 30.0, "a job's duration is its run time: {r:?}");
    }
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", "own.csv", "--summary", "own.yaml"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let summary = std::fs::read_to_string(dir.path().join("own.yaml")).unwrap();
    assert!(summary.contains("jobs: 3"), "{summary}");
}

/// Regression, "`rubick-plan trace` writes what `simulate` refuses: a Philly year
/// overflows i64 silently; sacct `ElapsedRaw=1e300` becomes a 301-digit duration that
/// simulate reports in polars' words (\"increasing infer_schema_length ...
/// ignore_errors=True\")": `trace` checks every row it writes as `simulate` checks every
/// row it reads (one check), each error naming the input file, its line and the field,
/// nothing written; `simulate` reads a trace's numbers itself and says what is wrong in
/// our words.
#[test]
fn trace_writes_only_what_simulate_reads() {
    let Some(reference) = reference_dir() else { return };
    let dir = temp();
    let d = dir.path();
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let philly = |rows: &str| format!("timestamp,duration,num_gpus,gpu_time,cluster\n{rows}");
    let sacct =
        |elapsed: &str| format!("JobID|Submit|ElapsedRaw|AllocTRES\n7|2026-11-30T08:00:00|{elapsed}|gres/gpu=1\n");
    for (name, format, text, says) in [
        (
            "year.csv",
            "philly",
            philly("2017-10-09 07:01:55,66,1,66,a\n999999999999999999-10-09 07:01:55,66,1,66,a\n"),
            "year.csv: line 3: timestamp",
        ),
        (
            "years.csv",
            "philly",
            philly("0001-01-01 00:00:00,66,1,66,a\n9999-12-31 00:00:00,66,1,66,a\n"),
            "years.csv: line 3: the trace's submission_time must be 0 to 1e11 seconds",
        ),
        ("sacct.txt", "sacct", sacct("1e300"), "sacct.txt: line 2: ElapsedRaw"),
        ("nan.txt", "sacct", sacct("NaN"), "nan.txt: line 2: ElapsedRaw"),
    ] {
        std::fs::write(d.join(name), text).unwrap();
        let run = run_in(
            d,
            "rubick-plan",
            &["trace", name, "--format", format, "--cluster", &cluster, "--reference", &reference, "-o", "t.csv"],
        );
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{name}: {}", run.stderr);
        assert!(!d.join("t.csv").exists(), "{name}: written anyway");
    }
    // What a trace with such a row says when simulated: the file, the line, the column.
    let header = "name,submission_time,duration,application,num_gpus,num_cpus,bandwidth,exec_plan,steps,is_sla\n";
    let digits = format!("1{}", "0".repeat(300));
    for (name, duration, says) in [
        ("digits.csv", digits.as_str(), "digits.csv: line 3: duration must be 0 to 1e11 seconds, got 1e300"),
        ("word.csv", "soon", "word.csv: line 3: column `duration`: expected a number, got `soon`"),
    ] {
        let rows =
            format!("{header}vit-0,0,3163,vit,2,16,0,zero-dp,37239,0\nvit-1,5,{duration},vit,2,16,0,zero-dp,10,0\n");
        std::fs::write(d.join(name), rows).unwrap();
        let run = run_in(
            d,
            "rubick-plan",
            &["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", name, "--summary", "s.yaml"],
        );
        assert_eq!(run.code, Some(2), "{name}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{name}: {}", run.stderr);
        for polars in ["infer_schema_length", "ignore_errors", "dtype"] {
            assert!(!run.stderr.contains(polars), "{name}: in polars' words: {}", run.stderr);
        }
        assert!(!d.join("s.yaml").exists(), "{name}: written anyway");
    }
}
