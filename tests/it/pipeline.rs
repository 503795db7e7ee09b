//! End-to-end runs of the tools on the example inputs in data/.

use rubick_tests::{repo, run_in, temp};

fn data(name: &str) -> String {
    repo().join("data").join(name).display().to_string()
}

#[test]
fn demo_lists_the_plan_space_of_every_example_job() {
    let dir = temp();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["space", &data("jobs-paper.yaml"), "--cluster", &data("cluster-a800-8x8.yaml"), "--gpus", "8"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let listing: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).expect("stdout is YAML");
    let spaces = listing.as_sequence().expect("a list of plan spaces");
    let jobs: Vec<&str> = spaces.iter().filter_map(|s| s["job"].as_str()).collect();
    assert_eq!(jobs, ["vit-0", "roberta-0", "bert-0", "t5-0", "gpt2-0", "llama7-0", "llama30-0"]);
    for space in spaces {
        let plans = space["plans"].as_sequence().unwrap();
        assert!(!plans.is_empty(), "{:?} has no plan", space["job"]);
        for plan in plans {
            assert!(plan["memory"]["totalGib"].as_f64().unwrap() <= 80.0);
        }
    }
    // LLaMA-2-7B: plain data parallelism never fits on 80 GB.
    let llama = spaces.iter().find(|s| s["job"].as_str() == Some("llama7-0")).unwrap();
    assert!(llama["plans"].as_sequence().unwrap().iter().all(|p| p["family"] != "dp" && p["family"] != "dp_gc"));
}

#[test]
fn output_is_byte_identical_across_runs_and_csv_goes_to_a_file() {
    let dir = temp();
    let args = |out: &str| {
        vec![
            "space".to_owned(),
            data("jobs-paper.yaml"),
            "--cluster".into(),
            data("cluster-a800-8x8.yaml"),
            "-o".into(),
            out.to_owned(),
        ]
    };
    for name in ["a.yaml", "b.yaml", "a.csv", "b.csv"] {
        let a = args(name);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let run = run_in(dir.path(), "rubick-plan", &refs);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        assert!(run.stdout.is_empty(), "stdout must stay empty with -o");
    }
    let read = |n: &str| std::fs::read(dir.path().join(n)).unwrap();
    assert_eq!(read("a.yaml"), read("b.yaml"));
    assert_eq!(read("a.csv"), read("b.csv"));
    let csv = String::from_utf8(read("a.csv")).unwrap();
    assert!(csv.starts_with("job,node_group,gpu_type,gpus,plan,family,"), "{csv}");
}

#[test]
fn too_many_gpus_is_a_negative_answer() {
    let dir = temp();
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["space", &data("jobs-paper.yaml"), "--cluster", &data("cluster-a800-8x8.yaml"), "--gpus", "1000"],
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("no feasible plan"), "{}", run.stderr);
}

#[test]
fn stdin_works_for_the_jobs() {
    let jobs = std::fs::read(repo().join("data/jobs-paper.yaml")).unwrap();
    let mut child = std::process::Command::new(rubick_tests::binary("rubick-plan"))
        .args(["space", "-", "--cluster", &data("cluster-a800-8x8.yaml"), "--gpus", "4", "--format", "csv"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(&jobs).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).lines().count() > 100);
}

#[test]
fn example_inputs_are_valid_artifacts() {
    let dir = temp();
    let run = run_in(dir.path(), "rubick-plan", &["check", &data("cluster-a800-8x8.yaml"), &data("jobs-paper.yaml")]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn schema_command_prints_the_committed_schemas() {
    let dir = temp();
    for name in ["cluster", "job-batch", "schedule", "table-profile"] {
        let run = run_in(dir.path(), "rubick-plan", &["schema", name]);
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let committed = std::fs::read_to_string(repo().join("schemas").join(format!("{name}.json"))).unwrap();
        assert_eq!(run.stdout, committed, "{name}");
    }
    let run = run_in(dir.path(), "rubick-plan", &["schema", "nope"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("expected one of"), "{}", run.stderr);
}

#[test]
fn no_gpu_is_reported_clearly() {
    let dir = temp();
    let run = run_in(dir.path(), "rubick-profile", &["devices"]);
    // Without a driver the machine is still described (its CPU as worker slots), with
    // the reason on stderr.
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    if !run.stderr.contains("NVML is not available") {
        rubick_testkit::skip("this machine has NVIDIA GPUs; the no-driver message is not testable here");
        return;
    }
    assert!(run.stderr.contains("no NVIDIA driver") && run.stderr.contains("the CPU"), "{}", run.stderr);
    assert!(run.stdout.contains("cpu"), "{}", run.stdout);
}

/// A 3-D limit measured at 16-way model parallelism once let LLaMA-30B (published
/// shape) run on 2 and 8 GPUs with plans needing 245-270 GiB per 80 GiB GPU.
#[test]
fn a_measured_limit_admits_no_plan_beyond_the_memory_where_it_was_not_measured() {
    let dir = temp();
    std::fs::write(
        dir.path().join("llama30.yaml"),
        "apiVersion: rubick/v1\nkind: Job\nname: llama30\nmodel:\n  name: llama30\n  parameters: 32528943616\n  \
         layers: 60\n  hidden: 6656\n  heads: 52\n  seqLen: 1024\n  globalBatch: 4\n  measuredLimits:\n    \
         gpuMemoryGib: 80\n    maxMicroBatch: { tp_pp: 8 }\n    tpPpDegrees: [{ tp: 4, pp: 4 }, { tp: 2, pp: 6 }]\n\
         iterations: 10\nrequest: { gpus: 8 }\n",
    )
    .unwrap();
    for gpus in ["2", "8", "16"] {
        let run = run_in(
            dir.path(),
            "rubick-plan",
            &["space", "llama30.yaml", "--cluster", &data("cluster-a800-8x8.yaml"), "--gpus", gpus],
        );
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let listing: serde_yaml_ng::Value = serde_yaml_ng::from_str(&run.stdout).unwrap();
        let plans = listing[0]["plans"].as_sequence().unwrap();
        assert!(!plans.is_empty(), "{gpus} GPUs");
        for plan in plans {
            let total = plan["memory"]["totalGib"].as_f64().unwrap();
            let measured = plan["fitBasis"].as_str() == Some("measured");
            assert!(total <= 80.0 || measured, "{gpus} GPUs: {:?} needs {total} GiB", plan["plan"]);
        }
    }
    // On 16 GPUs, TP 4 x PP 4 is where the limit was measured: it decides there.
    let run = run_in(
        dir.path(),
        "rubick-plan",
        &["space", "llama30.yaml", "--cluster", &data("cluster-a800-8x8.yaml"), "--gpus", "16"],
    );
    assert!(run.stdout.contains("tp4-pp4"), "{}", run.stdout);
}
