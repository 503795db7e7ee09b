//! Snapshots (insta, in `snapshots/`) of the outputs people read: `rubick-run status`
//! as a table, YAML and Prometheus text; `rubick-profile compare` as text, Markdown and
//! JUnit; `rubick-plan schedule`'s schedule and its `--explain`; the Kubernetes
//! manifests `rubick-run` writes. A change to any of them shows in review as a changed
//! snapshot (`INSTA_UPDATE=always` rewrites them); under CI a missing or changed one
//! fails. Temporary paths, the checkout's path, times and durations are filtered out.

use std::path::Path;
use std::process::Command;

use rubick_tests::{Reaper, binary, repo, run_in, temp};

use crate::status_and_bounds::{job, ok, schedule, wait_for};

/// Snapshot settings for outputs of a test in `dir`: its path and the checkout's
/// replaced by `[TEMP]` and `[REPO]`, timestamps, ages and measured durations by
/// placeholders.
fn settings(dir: &Path) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    for (path, name) in [(dir.to_path_buf(), "[TEMP]"), (repo(), "[REPO]")] {
        settings.add_filter(&escape(&path.display().to_string()), name);
        if let Ok(canonical) = path.canonicalize() {
            settings.add_filter(&escape(&canonical.display().to_string()), name);
        }
    }
    settings.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?", "[TIMESTAMP]");
    // The state's clock readings (`submittedUnixS: 1796490036.81`) and a queued job's wait.
    settings.add_filter(r"(UnixS: )\d+(\.\d+)?", "${1}[UNIX_S]");
    settings.add_filter(r"(rubick_job_queue_seconds\{[^}]*\} )[0-9.e+-]+", "${1}[SECONDS]");
    settings
}

/// `text` as a regular expression that matches it literally.
fn escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

#[test]
fn status_as_a_table_yaml_and_prometheus() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let lines =
        (1..=4).map(|i| format!("echo '{{\"rubick\":1,\"iter\":{i},\"iter_time_s\":0.5}}' >> \"$RUBICK_METRICS\"\n"));
    job(d, "done", 4, &lines.collect::<String>());
    job(d, "crash", 2, "exit 9\n");
    job(d, "waiting", 2, "exit 0\n");
    ok(d, &["submit", "done.yaml", "crash.yaml", "waiting.yaml", "--retries", "0"]);
    schedule(d, "r.yaml", &[("done", 0), ("crash", 1)]);
    ok(d, &["apply", "r.yaml"]);
    wait_for("both ended", || {
        d.join("state/jobs/done/attempt-1/exit-code").exists()
            && d.join("state/jobs/crash/attempt-1/exit-code").exists()
    });
    settings(d).bind(|| {
        insta::assert_snapshot!("status_table", ok(d, &["status"]).stdout);
        insta::assert_snapshot!("status_yaml", ok(d, &["status", "--format", "yaml"]).stdout);
        insta::assert_snapshot!("status_prometheus", ok(d, &["status", "--format", "prometheus"]).stdout);
    });
}

#[test]
fn compare_as_text_markdown_and_junit() {
    let dir = temp();
    let d = dir.path();
    let header = "job,model,plan,placement,status,repeat,iterations,iter_time_s,iter_time_sd_s,samples_per_s\n";
    // The same; 30 % slower (a regression); 20 % faster; measured, then out of memory.
    std::fs::write(
        d.join("base.csv"),
        format!(
            "{header}j,m,dp1-tp1-pp1-mb4-ga4,1,ok,0,20,1.0,0.01,16\nj,m,dp1-tp1-pp1-mb8-ga2,1,ok,0,20,1.0,0.01,16\n\
             j,m,dp2-tp1-pp1-mb4-ga2,2,ok,0,20,1.0,0.01,16\nj,m,dp2-tp1-pp1-mb8-ga1,2,ok,0,20,1.0,0.01,16\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("new.csv"),
        format!(
            "{header}j,m,dp1-tp1-pp1-mb4-ga4,1,ok,0,20,1.0,0.01,16\nj,m,dp1-tp1-pp1-mb8-ga2,1,ok,0,20,1.3,0.01,12.3\n\
             j,m,dp2-tp1-pp1-mb4-ga2,2,ok,0,20,0.8,0.01,20\nj,m,dp2-tp1-pp1-mb8-ga1,2,oom,0,,,,\n"
        ),
    )
    .unwrap();
    settings(d).bind(|| {
        for format in ["text", "markdown", "junit"] {
            let run = run_in(d, "rubick-profile", &["compare", "base.csv", "new.csv", "--format", format]);
            assert_eq!(run.code, Some(1), "a regression and a configuration that no longer measures: {}", run.stderr);
            insta::assert_snapshot!(format!("compare_{format}"), run.stdout);
        }
    });
}

#[test]
fn a_schedule_and_its_explanation() {
    let dir = temp();
    let d = dir.path();
    let data = repo().join("data");
    let (cluster, jobs) =
        (data.join("cluster-a800-8x8.yaml").display().to_string(), data.join("jobs-paper.yaml").display().to_string());
    let run = run_in(d, "rubick-plan", &["schedule", "--cluster", &cluster, "--jobs", &jobs, "--explain"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // The seven jobs without a perfModel: one warning, suggesting no file that does not
    // exist (`vit-0.yaml`: the jobs are a JobBatch's).
    let warnings: Vec<&str> = run.stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(warnings[0].contains("7 jobs have no perfModel") && !warnings[0].contains("vit-0.yaml"), "{}", warnings[0]);
    // The placement code (`on 88`) is explained where it is printed, before the jobs.
    let legend = run.stderr.lines().position(|l| l.contains("`88`: 8 on each of 2 nodes"));
    let first_job = run.stderr.lines().position(|l| l.starts_with("vit-0: "));
    assert!(legend.is_some() && legend < first_job, "{}", run.stderr);
    settings(d).bind(|| {
        insta::assert_snapshot!("schedule", run.stdout);
        insta::assert_snapshot!("schedule_explain", run.stderr);
    });
}

#[test]
fn the_kubernetes_manifests_of_a_run() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    job(d, "a", 100, "exit 0\n");
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r.yaml", &[("a", 0)]);
    let gitops = d.join("gitops");
    std::fs::write(
        d.join("k8s.yaml"),
        format!("image: registry.example/train:1\nkubectl: false\nmanifestDir: {}\n", gitops.display()),
    )
    .unwrap();
    let out = Command::new(binary("rubick-run"))
        .args(["apply", "r.yaml", "--backend", "kubernetes", "--kubernetes", "k8s.yaml", "--state", "state"])
        .current_dir(d)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = std::fs::read_to_string(gitops.join("rubick-a-1.yaml")).unwrap();
    settings(d).bind(|| insta::assert_snapshot!("kubernetes_manifests", manifest));
}
