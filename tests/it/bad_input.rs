//! The bad-input corpus (`tests/bad-input/`): every malformed input exits 2 with a
//! message naming the file and the field or line, never panics, and writes no output.

use rubick_tests::{repo, run_in, temp};

/// (file, tool + arguments with FILE and OUT placeholders, fragments the message must hold)
const CASES: &[(&str, &str, &[&str])] = &[
    ("cluster-malformed.yaml", CLUSTER, &["line 3"]),
    ("cluster-unknown-field.yaml", CLUSTER, &["unknown field `gpuz`", "nodeGroups[0]"]),
    ("cluster-wrong-type.yaml", CLUSTER, &["nodeGroups[0].gpusPerNode", "invalid type"]),
    ("cluster-zero-gpus.yaml", CLUSTER, &["nodeGroups[0].gpusPerNode", "must be 1 to 1024, got 0"]),
    ("cluster-negative-gpus.yaml", CLUSTER, &["nodeGroups[0].gpusPerNode", "-8"]),
    ("cluster-empty.yaml", CLUSTER, &["empty"]),
    ("cluster-comments-only.yaml", CLUSTER, &["empty"]),
    ("cluster-binary.yaml", CLUSTER, &["not UTF-8"]),
    ("cluster-missing-kind.yaml", CLUSTER, &["kind: missing"]),
    ("cluster-wrong-kind.yaml", CLUSTER, &["kind: expected `Cluster`, found `JobBatch`"]),
    ("cluster-bad-version.yaml", CLUSTER, &["apiVersion", "rubick/v2"]),
    ("cluster-negative-bandwidth.yaml", CLUSTER, &["nodeGroups[0].interNodeGBps", "above 0", "got -1"]),
    ("cluster-duplicate-group.yaml", CLUSTER, &["nodeGroups[1].name", "earlier group"]),
    ("cluster-zero-count.yaml", CLUSTER, &["nodeGroups[0].count"]),
    ("cluster-not-a-mapping.yaml", CLUSTER, &["invalid type"]),
    ("jobs-batch-not-divisible.yaml", JOBS, &["jobs[0].request.plan", "not divisible"]),
    ("jobs-tp-heads.yaml", JOBS, &["jobs[0].request.plan", "tp 3 does not divide the 32 attention heads"]),
    ("jobs-pp-layers.yaml", JOBS, &["jobs[0].request.plan", "pp 3 does not divide the 32 layers"]),
    ("jobs-zero-gpus.yaml", JOBS, &["jobs[0].request.gpus", "must be 1 to 524288, got 0"]),
    (
        "jobs-launch-unknown-placeholder.yaml",
        JOBS,
        &["jobs[0].launch.command[3]", "unknown placeholder `{world_size}`"],
    ),
    ("jobs-negative-gpus.yaml", JOBS, &["gpus", "-2"]),
    ("jobs-unknown-field.yaml", JOBS, &["unknown field `priority`", "line"]),
    ("jobs-duplicate-name.yaml", JOBS, &["jobs[1].name", "earlier job"]),
    ("jobs-bad-plan-code.yaml", JOBS, &["plan", "2x8"]),
    ("jobs-global-batch-mismatch.yaml", JOBS, &["jobs[0].request.plan", "global batch is 16"]),
    ("jobs-missing-field.yaml", JOBS, &["missing field `iterations`"]),
    ("jobs-zero-global-batch.yaml", JOBS, &["jobs[0].model.globalBatch"]),
    ("jobs-wrong-type.yaml", JOBS, &["iterations", "invalid type"]),
    ("jobs-tabs.yaml", JOBS, &["line 5"]),
    ("jobs-bad-placement.yaml", JOBS, &["placement", "8x"]),
    ("does-not-exist.yaml", JOBS, &["No such file"]),
    ("perf-model-out-of-bounds.yaml", "rubick-fit check FILE", &["parameters.k_bwd", "below its lower bound"]),
    ("schedule-gpu-mismatch.yaml", "rubick-run check FILE", &["assignments[0].nodes", "needs 8"]),
    ("model-spec-negative-factor.yaml", "rubick-plan check FILE", &["activationFactor"]),
    ("schedule-unknown-node.yaml", CURRENT, &["assignments[0].nodes[0].node", "`b800-3` is not a node"]),
    ("jobs-current-unknown-node.yaml", SCHEDULE, &["jobs[0].current.nodes[1]", "`a800-8` is not a node"]),
    ("jobs-missing-perf-model.yaml", SCHEDULE, &["no-such-model.yaml", "No such file"]),
    // Well-formed, absurd values are bounded where they are read.
    ("cluster-count-absurd.yaml", CLUSTER, &["nodeGroups[0].count", "got 4294967295"]),
    ("cluster-gpus-per-node-absurd.yaml", CLUSTER, &["nodeGroups[0].gpusPerNode", "must be 1 to 1024, got 100000"]),
    ("jobs-gpus-absurd.yaml", JOBS, &["jobs[0].request.gpus", "got 4294967295"]),
    ("jobs-global-batch-absurd.yaml", JOBS, &["jobs[0].model.globalBatch", "got 2147483648"]),
    ("jobs-stop-timeout-absurd.yaml", JOBS, &["jobs[0].launch.stopTimeoutS", "(a week)"]),
    ("jobs-many-aliases.yaml", JOBS, &["100 YAML aliases", "at most 64"]),
    ("jobs-timeout-absurd.yaml", JOBS, &["jobs[0].launch.timeoutS", "(a week)"]),
    ("jobs-env-key-equals.yaml", JOBS, &["jobs[0].launch.env.A=B", "no `=`"]),
    ("schedule-zero-cpus.yaml", CURRENT, &["assignments[0].nodes[0].cpus", "at least 1"]),
    ("schedule-nan-memory.yaml", CURRENT, &["assignments[0].nodes[0].hostMemoryGib", "got NaN"]),
    ("summary-nan-beside-numbers.yaml", "rubick-plan check FILE", &["avgJctS", "finite", "all .nan"]),
    ("summary-share-above-one.yaml", "rubick-plan check FILE", &["truth.measured.max", "at most 1"]),
];

const CURRENT: &str = "rubick-plan schedule --cluster CLUSTER --jobs JOBS --current FILE -o OUT";
const SCHEDULE: &str = "rubick-plan schedule --cluster CLUSTER --jobs FILE -o OUT";

const CLUSTER: &str = "rubick-plan space JOBS --cluster FILE --gpus 8 -o OUT";
const JOBS: &str = "rubick-plan space FILE --cluster CLUSTER -o OUT";

#[test]
fn every_bad_input_exits_2_naming_file_and_field_and_writes_nothing() {
    let corpus = repo().join("tests/bad-input");
    let data = repo().join("data");
    let mut failures = Vec::new();
    for (file, command, fragments) in CASES {
        let dir = temp();
        let out = dir.path().join("out.yaml");
        let input = corpus.join(file);
        let args: Vec<String> = command
            .split_whitespace()
            .map(|a| match a {
                "FILE" => input.display().to_string(),
                "OUT" => out.display().to_string(),
                "JOBS" => data.join("jobs-paper.yaml").display().to_string(),
                "CLUSTER" => data.join("cluster-a800-8x8.yaml").display().to_string(),
                other => other.to_owned(),
            })
            .collect();
        let refs: Vec<&str> = args[1..].iter().map(String::as_str).collect();
        let run = run_in(dir.path(), &args[0], &refs);
        let mut problems = Vec::new();
        if run.code != Some(2) {
            problems.push(format!("exit code {:?}, expected 2", run.code));
        }
        if !run.stderr.contains(file) {
            problems.push("the message does not name the file".to_owned());
        }
        for fragment in *fragments {
            if !run.stderr.contains(fragment) {
                problems.push(format!("the message lacks `{fragment}`"));
            }
        }
        if run.stderr.contains("panicked") {
            problems.push("panicked".to_owned());
        }
        if out.exists() {
            problems.push("an output file was written".to_owned());
        }
        if std::fs::read_dir(dir.path()).map(|d| d.count()).unwrap_or(0) != 0 {
            problems.push("files were left in the working directory".to_owned());
        }
        if !problems.is_empty() {
            failures.push(format!("{file}: {}\n    stderr: {}", problems.join("; "), run.stderr.trim()));
        }
    }
    assert!(CASES.len() >= 20, "the corpus must hold at least 20 cases");
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}

#[test]
fn two_stdin_inputs_are_refused() {
    let dir = temp();
    let run = run_in(dir.path(), "rubick-plan", &["space", "-", "--cluster", "-"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("only one input can be `-`"), "{}", run.stderr);
}

#[test]
fn bad_flags_exit_2() {
    let dir = temp();
    let data = repo().join("data");
    let jobs = data.join("jobs-paper.yaml").display().to_string();
    let cluster = data.join("cluster-a800-8x8.yaml").display().to_string();
    for extra in [&["--gpus", "0"][..], &["--gpus", "-4"], &["--reserve-gib", "-1"], &["--format", "xml"]] {
        let mut args = vec!["space", jobs.as_str(), "--cluster", cluster.as_str()];
        args.extend_from_slice(extra);
        let run = run_in(dir.path(), "rubick-plan", &args);
        assert_eq!(run.code, Some(2), "{extra:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{extra:?}");
    }
}

#[test]
fn bad_schedule_flags_exit_2() {
    let dir = temp();
    let data = repo().join("data");
    let jobs = data.join("jobs-paper.yaml").display().to_string();
    let cluster = data.join("cluster-a800-8x8.yaml").display().to_string();
    for extra in [
        &["--time-limit", "0"][..],
        &["--time-limit", "1e300"],
        &["--min-gain", "-1"],
        &["--policy", "fifo"],
        &["--max-scale", "0"],
    ] {
        let mut args = vec!["schedule", "--jobs", jobs.as_str(), "--cluster", cluster.as_str(), "-o", "out.yaml"];
        args.extend_from_slice(extra);
        let run = run_in(dir.path(), "rubick-plan", &args);
        assert_eq!(run.code, Some(2), "{extra:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{extra:?}");
        assert!(!dir.path().join("out.yaml").exists(), "{extra:?}: output written");
    }
}

/// Regression, "panics (exit 101) from values `check` accepts": durations beyond a week
/// are refused where they are read, and a state an older version wrote with one never
/// panics a command.
#[test]
fn values_check_accepts_never_panic() {
    let dir = temp();
    let reference = repo().join("../shared/reference/rubick-artifact");
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let mut cases: Vec<(&str, Vec<String>)> =
        vec![("rubick-run", vec!["status".into(), "--state".into(), "s".into(), "--lock-wait".into(), "1e300".into()])];
    if reference.join("workloads/naive.csv").exists() {
        let trace = reference.join("workloads/naive.csv").display().to_string();
        let reference = reference.display().to_string();
        for flag in [["--round", "1e-300"], ["--restart-penalty", "1e300"], ["--time-limit", "1e300"]] {
            let mut args: Vec<String> =
                ["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", &trace]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
            args.extend(flag.iter().map(|s| (*s).to_owned()));
            args.extend(["--summary".to_owned(), "out.yaml".to_owned()]);
            cases.push(("rubick-plan", args));
        }
    }
    for (tool, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = run_in(dir.path(), tool, &args);
        assert_eq!(run.code, Some(2), "{tool} {args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{tool} {args:?}: {}", run.stderr);
        assert!(run.stderr.contains("--"), "names the flag: {}", run.stderr);
    }
}

/// Regression, "outputs over inputs: `-o` equal to an input replaces it" (`fit` was fixed
/// before; `schedule`, `space`, `curves` here): by the same path, a symlink or a hard
/// link, exit 2 and the input intact.
#[test]
fn an_output_named_as_an_input_is_refused() {
    let dir = temp();
    let d = dir.path();
    let data = repo().join("data");
    std::fs::copy(data.join("jobs-paper.yaml"), d.join("jobs.yaml")).unwrap();
    std::fs::copy(data.join("cluster-a800-8x8.yaml"), d.join("cluster.yaml")).unwrap();
    std::fs::hard_link(d.join("jobs.yaml"), d.join("hard.yaml")).unwrap();
    std::os::unix::fs::symlink(d.join("cluster.yaml"), d.join("soft.yaml")).unwrap();
    let before = std::fs::read(d.join("jobs.yaml")).unwrap();
    for args in [
        &["schedule", "--cluster", "cluster.yaml", "--jobs", "jobs.yaml", "-o", "jobs.yaml"][..],
        &["schedule", "--cluster", "cluster.yaml", "--jobs", "jobs.yaml", "-o", "hard.yaml"],
        &["schedule", "--cluster", "cluster.yaml", "--jobs", "jobs.yaml", "-o", "soft.yaml"],
        &["space", "jobs.yaml", "--cluster", "cluster.yaml", "-o", "hard.yaml"],
        &["curves", "jobs.yaml", "--cluster", "cluster.yaml", "-o", "jobs.yaml"],
    ] {
        let run = run_in(d, "rubick-plan", args);
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("is also an input"), "{args:?}: {}", run.stderr);
    }
    assert_eq!(std::fs::read(d.join("jobs.yaml")).unwrap(), before, "the input is intact");
    assert!(std::fs::read_to_string(d.join("cluster.yaml")).unwrap().contains("kind: Cluster"));
}

/// Regression, "`rubick-plan simulate` accepts NaN, negative or infinite `--horizon`,
/// `--change-min-gain`, `--guarantee-margin` that `rubick-plan schedule` refuses
/// (`--change-min-gain nan` ran 7x longer, `--horizon nan` changed the restarts)": every
/// number of `schedule`, `simulate` and `trace` is bounded where clap parses it, one
/// parser per concept, so a flag two commands share takes the same values in both; a
/// refused value names the flag and what it expects, exits 2 and writes nothing.
#[test]
fn simulate_refuses_the_numbers_schedule_refuses() {
    let Some(reference) = rubick_tests::reference() else { return };
    let dir = temp();
    let d = dir.path();
    let data = repo().join("data");
    let (jobs, cluster) = (data.join("jobs-paper.yaml"), data.join("cluster-a800-8x8.yaml"));
    let (jobs, cluster) = (jobs.display().to_string(), cluster.display().to_string());
    let naive = reference.join("workloads/naive.csv").display().to_string();
    let reference = reference.display().to_string();
    std::fs::write(
        d.join("philly.csv"),
        "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66,1,66,a\n",
    )
    .unwrap();
    let schedule: &[&str] = &["schedule", "--jobs", &jobs, "--cluster", &cluster, "-o", "out"];
    let simulate: &[&str] =
        &["simulate", "--cluster", &cluster, "--reference", &reference, "--trace", &naive, "--summary", "out"];
    let trace: &[&str] =
        &["trace", "philly.csv", "--format", "philly", "--cluster", &cluster, "--reference", &reference, "-o", "out"];
    let unbounded: &[&str] = &["nan", "NaN", "inf", "-inf", "-1", "1e300"];
    // (flag, values refused, the commands that take it)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a [&'a str]]);
    let cases: &[Case<'_>] = &[
        ("--horizon", unbounded, &[schedule, simulate]),
        ("--change-min-gain", unbounded, &[schedule, simulate]),
        ("--min-gain", unbounded, &[schedule, simulate]),
        ("--scale-out-efficiency", unbounded, &[schedule, simulate]),
        ("--time-limit", &["nan", "inf", "0", "-1", "1e300"], &[schedule, simulate]),
        ("--max-scale", &["0", "-1", "nan"], &[schedule, simulate]),
        ("--restart-cost", unbounded, &[schedule]),
        ("--starvation", unbounded, &[schedule]),
        ("--now", unbounded, &[schedule]),
        ("--guarantee-margin", unbounded, &[simulate]),
        ("--restart-penalty", unbounded, &[simulate]),
        ("--interval", unbounded, &[simulate]),
        ("--round", &["nan", "inf", "0.5", "1e300"], &[simulate]),
        ("--noise", &["nan", "inf", "-0.1", "2"], &[simulate]),
        ("--guarantee-share", &["nan", "inf", "-0.1", "2"], &[simulate]),
        ("--extrapolated-slowdown", &["nan", "inf", "-0.1", "1"], &[simulate]),
        ("--seeds", &["0", "1001"], &[simulate]),
        ("--guaranteed-share", &["nan", "inf", "-0.1", "2"], &[trace]),
        ("--from-s", unbounded, &[trace]),
        ("--to-s", unbounded, &[trace]),
    ];
    for (flag, values, commands) in cases {
        for command in *commands {
            for value in *values {
                let mut args = command.to_vec();
                args.extend([*flag, *value]);
                let run = run_in(d, "rubick-plan", &args);
                let said = format!("{} {flag} {value}", command[0]);
                assert_eq!(run.code, Some(2), "{said}: {}", run.stderr);
                assert!(run.stderr.contains(flag), "{said}: names the flag: {}", run.stderr);
                assert!(!run.stderr.contains("panicked"), "{said}: {}", run.stderr);
                assert!(!d.join("out").exists(), "{said}: written anyway");
            }
        }
    }
    // The same edge values are taken by both.
    for command in [schedule, simulate] {
        let mut args = command.to_vec();
        args.extend(["--horizon", "0", "--change-min-gain", "0", "--min-gain", "0"]);
        let run = run_in(d, "rubick-plan", &args);
        assert_eq!(run.code, Some(0), "{} at the bounds: {}", command[0], run.stderr);
        std::fs::remove_file(d.join("out")).unwrap();
    }
}

/// Regression, "without ../shared a reference command fails with a bare 'No such file
/// or directory' and no URL, no variable": every reader of the reference data, pointed
/// where it is not, exits 2 naming the path, what the data is and where it comes from,
/// and the variable and flag that point the tools at it.
#[test]
fn a_reference_command_without_the_data_names_the_path_and_the_variable() {
    let dir = temp();
    let d = dir.path();
    let data = |f: &str| repo().join("data").join(f).display().to_string();
    let (cluster, jobs) = (data("cluster-a800-8x8.yaml"), data("jobs-paper.yaml"));
    let gone = d.join("shared/reference/rubick-artifact").display().to_string();
    let trace = format!("{gone}/workloads/workload-base.csv");
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("rubick-plan", vec!["schedule", "--cluster", &cluster, "--jobs", &jobs, "--reference", &gone], gone.as_str()),
        (
            "rubick-plan",
            vec!["curves", &jobs, "--cluster", &cluster, "--reference", &gone, "-o", "c.csv"],
            gone.as_str(),
        ),
        (
            "rubick-plan",
            vec!["simulate", "--cluster", &cluster, "--reference", &gone, "--trace", &trace, "--summary", "s.yaml"],
            gone.as_str(),
        ),
        (
            "rubick-fit",
            vec!["evaluate", "--reference", &gone, "--model", "llama7", "--cluster", &cluster],
            gone.as_str(),
        ),
        (
            "rubick-fit",
            vec!["evaluate", "--external", "shared/reference/external/vtrain_single.csv"],
            "vtrain_single.csv",
        ),
        (
            "rubick-plan",
            vec!["trace", "shared/reference/traces/philly.csv", "--format", "philly", "--cluster", &cluster],
            "rubick-artifact",
        ),
    ];
    for (tool, args, path) in cases {
        let run = run_in(d, tool, &args);
        assert_eq!(run.code, Some(2), "{tool} {args:?}: {}", run.stderr);
        for says in
            [path, "RUBICK_REFERENCE", "--reference", "../shared/reference", "AlibabaPAI/reconfigurable-dl-scheduler"]
        {
            assert!(run.stderr.contains(says), "{tool} {args:?}: `{says}` in {}", run.stderr);
        }
        assert!(!run.stderr.contains("os error"), "{tool} {args:?}: not a bare I/O error: {}", run.stderr);
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0, "{tool} {args:?}: nothing written");
    }
}
