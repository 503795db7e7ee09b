//! Small contracts of the tools' outputs and inputs: `status` says the retries left only
//! where they matter and `check` confirms what it checked; `compare` refuses a corrupted
//! time, `space` refuses an output named for another format, a run's metric lines are
//! bounds-checked and `status` and `stop` read only a metrics file's tail.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rubick_tests::{Reaper, Run, binary, repo, run_in, temp};

/// `DIR/NAME.yaml`: a 1-GPU job of `iterations` iterations running `sh DIR/NAME.sh`
/// (the script's text).
pub(crate) fn job(d: &Path, name: &str, iterations: u64, script: &str) {
    std::fs::write(d.join(format!("{name}.sh")), script).unwrap();
    let text = format!(
        "apiVersion: rubick/v1
kind: Job
name: {name}
model: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}
iterations: {iterations}
request: {{ gpus: 1, plan: ga }}
launch:
  version: 1
  command: [sh, {}]
  stopTimeoutS: 10
",
        d.join(format!("{name}.sh")).display()
    );
    std::fs::write(d.join(format!("{name}.yaml")), text).unwrap();
}

/// `DIR/FILE`: a schedule placing each job on one GPU of `local-0`.
pub(crate) fn schedule(d: &Path, file: &str, jobs: &[(&str, u32)]) {
    let mut text =
        "apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: 1\npolicy: test\nassignments:\n".to_owned();
    for (job, gpu) in jobs {
        text.push_str(&format!(
            "  - {{ job: {job}, plan: dp1-tp1-pp1-mb4-ga4, nodes: [{{ node: local-0, gpus: [{gpu}], cpus: 1, hostMemoryGib: 1 }}], predictedThroughput: 1, change: started }}\n"
        ));
    }
    text.push_str(
        "totals: { gpusUsed: 0, gpusTotal: 4, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }\nobjective: 0\nsolver: { method: test, status: optimal }\n",
    );
    std::fs::write(d.join(file), text).unwrap();
}

/// `rubick-run ARGS --state DIR/state`, with `prefix` (a shell line's start, e.g. a
/// `ulimit`) when given.
fn rr(d: &Path, args: &[&str], prefix: Option<&str>) -> Run {
    let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    args.extend(["--state".to_owned(), d.join("state").display().to_string()]);
    let mut c = match prefix {
        Some(p) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("{p}; exec \"$0\" \"$@\"")).arg(binary("rubick-run")).args(&args);
            c
        }
        None => {
            let mut c = Command::new(binary("rubick-run"));
            c.args(&args);
            c
        }
    };
    c.current_dir(d).env_remove("RUST_LOG").env("NO_COLOR", "1").output().unwrap().into()
}

pub(crate) fn ok(d: &Path, args: &[&str]) -> Run {
    let run = rr(d, args, None);
    assert_eq!(run.code, Some(0), "rubick-run {args:?}: {}", run.stderr);
    run
}

pub(crate) fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state(d: &Path) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("state/state.yaml")).unwrap()).unwrap()
}

/// The `why:` line under job `name` in a status table.
fn why<'a>(table: &'a str, name: &str) -> &'a str {
    let mut after = table.lines().skip_while(|l| !l.starts_with(&format!("{name} "))).skip(1);
    after.next().unwrap_or_default()
}

#[test]
fn status_says_retries_left_only_where_they_matter() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    job(
        d,
        "done",
        2,
        "for i in 1 2; do echo \"{\\\"rubick\\\":1,\\\"iter\\\":$i,\\\"iter_time_s\\\":0.05}\" >> \"$RUBICK_METRICS\"; done\n",
    );
    job(d, "crash", 2, "exit 9\n");
    ok(d, &["submit", "done.yaml", "crash.yaml", "--retries", "0"]);
    schedule(d, "r.yaml", &[("done", 0), ("crash", 1)]);
    ok(d, &["apply", "r.yaml"]);
    wait_for("both ended", || {
        d.join("state/jobs/done/attempt-1/exit-code").exists()
            && d.join("state/jobs/crash/attempt-1/exit-code").exists()
    });
    let table = ok(d, &["status"]).stdout;
    // A finished job is never retried: its retries are noise.
    assert_eq!(why(&table, "done").trim(), "why: finished", "{table}");
    // A failed one's reason already says it has none left: said once.
    let crash = why(&table, "crash");
    assert!(crash.contains("exit 9") && crash.matches("retries left").count() == 1, "{table}");
}

#[test]
fn check_confirms_a_valid_schedule_on_stderr() {
    let dir = temp();
    let d = dir.path();
    schedule(d, "r.yaml", &[("a", 0)]);
    let run = run_in(d, "rubick-run", &["check", "r.yaml"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, "", "stdout carries artifacts only");
    assert!(run.stderr.contains("r.yaml: valid Schedule"), "{}", run.stderr);
    // The other tools' `check` says so too.
    let cluster = repo().join("data/cluster-a800-8x8.yaml").display().to_string();
    let run = run_in(d, "rubick-plan", &["check", &cluster]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("cluster-a800-8x8.yaml: valid Cluster"), "{}", run.stderr);
}

#[test]
fn compare_refuses_an_infinite_iteration_time() {
    let dir = temp();
    let d = dir.path();
    let header = "job,model,plan,placement,status,repeat,iterations,iter_time_s,iter_time_sd_s,samples_per_s\n";
    let rows = |t: &str| {
        format!(
            "{header}j,m,dp1-tp1-pp1-mb4-ga4,1,ok,0,10,{t},0.01,16\nj,m,dp1-tp1-pp1-mb8-ga2,1,ok,0,10,1.0,0.01,16\n"
        )
    };
    std::fs::write(d.join("new.csv"), rows("1.0")).unwrap();
    for (value, shown) in [("inf", "got inf"), ("NaN", "got NaN"), ("-1", "got -1"), ("", "got none")] {
        std::fs::write(d.join("base.csv"), rows(value)).unwrap();
        let run = run_in(d, "rubick-profile", &["compare", "base.csv", "new.csv"]);
        assert_eq!(run.code, Some(2), "`{value}`: a corrupted baseline row is an error: {}", run.stdout);
        assert!(
            run.stderr.contains("base.csv: line 2: iter_time_s") && run.stderr.contains(shown),
            "`{value}`: {}",
            run.stderr
        );
        assert_eq!(run.stdout, "", "`{value}`: no report from a corrupted profile");
        // The same in the new profile.
        let run = run_in(d, "rubick-profile", &["compare", "new.csv", "base.csv"]);
        assert_eq!(run.code, Some(2), "`{value}`: {}", run.stdout);
        assert!(run.stderr.contains("base.csv: line 2: iter_time_s"), "`{value}`: {}", run.stderr);
    }
    // A row that did not measure needs no time.
    std::fs::write(d.join("base.csv"), rows("1.0").replace(",ok,0,10,1.0,0.01,16\nj", ",oom,0,,,,\nj")).unwrap();
    let run = run_in(d, "rubick-profile", &["compare", "base.csv", "new.csv"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
}

#[test]
fn space_refuses_an_output_named_for_another_format() {
    let dir = temp();
    let d = dir.path();
    let data = repo().join("data");
    let (jobs, cluster) =
        (data.join("jobs-paper.yaml").display().to_string(), data.join("cluster-a800-8x8.yaml").display().to_string());
    let space = |out: &str, format: Option<&str>| {
        let mut args = vec!["space", &jobs, "--cluster", &cluster, "--gpus", "8", "-o", out];
        if let Some(f) = format {
            args.extend(["--format", f]);
        }
        run_in(d, "rubick-plan", &args)
    };
    // Written in the format its name says.
    let run = space("space.parquet", None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(&std::fs::read(d.join("space.parquet")).unwrap()[..4], b"PAR1", "Parquet, not YAML");
    let run = space("space.csv", None);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(std::fs::read_to_string(d.join("space.csv")).unwrap().starts_with("job,"));
    // Refused where the name and the format disagree, or name one it is not written in.
    for (out, format, said) in [
        ("a.parquet", Some("yaml"), "names parquet, but --format is yaml"),
        ("b.yaml", Some("csv"), "names yaml, but --format is csv"),
        ("c.csv", Some("parquet"), "names csv, but --format is parquet"),
        ("d.json", None, "names json"),
    ] {
        let run = space(out, format);
        assert_eq!(run.code, Some(2), "{out} {format:?}: {}", run.stderr);
        assert!(run.stderr.contains(out) && run.stderr.contains(said), "{out}: {}", run.stderr);
        assert!(!d.join(out).exists(), "{out}: written anyway");
    }
}

/// Regression, "outputs whose extension names another format are still written (only
/// `space` refuses): `rubick-plan schedule -o s.parquet` writes YAML, `trace -o t.yaml`
/// writes CSV, `rubick-run jobs -o j.parquet`, `rubick-run status -o s.csv`, `status
/// --format prometheus -o s.yaml`": one check of an output's name, knowing the format
/// written, refuses them (exit 2, nothing written); `-`, no extension and `.txt` stay.
#[test]
fn outputs_named_for_another_format_are_refused() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let data = repo().join("data");
    let (jobs, cluster) =
        (data.join("jobs-paper.yaml").display().to_string(), data.join("cluster-a800-8x8.yaml").display().to_string());
    job(d, "a", 10, "exit 0\n");
    ok(d, &["submit", "a.yaml"]);
    let state = d.join("state").display().to_string();
    let plan = |out: &str| -> Vec<String> {
        ["schedule", "--jobs", &jobs, "--cluster", &cluster, "-o", out].map(str::to_owned).to_vec()
    };
    let run = |out: &str, args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.extend(["--state".to_owned(), state.clone(), "-o".to_owned(), out.to_owned()]);
        all
    };
    let mut refused: Vec<(&str, Vec<String>, &str, &str)> = vec![
        ("rubick-plan", plan("s.parquet"), "s.parquet", "names parquet, but this output is yaml"),
        ("rubick-plan", plan("s.md"), "s.md", "names markdown, but this output is yaml"),
        ("rubick-run", run("j.parquet", &["jobs"]), "j.parquet", "names parquet, but this output is yaml"),
        ("rubick-run", run("s.csv", &["status"]), "s.csv", "names csv, but this output is text"),
        (
            "rubick-run",
            run("s.yaml", &["status", "--format", "prometheus"]),
            "s.yaml",
            "names yaml, but this output is prometheus",
        ),
        (
            "rubick-run",
            run("s.prom", &["status", "--format", "yaml"]),
            "s.prom",
            "names prometheus, but this output is yaml",
        ),
    ];
    if let Some(reference) = rubick_tests::reference() {
        std::fs::write(
            d.join("philly.csv"),
            "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66,1,66,a\n",
        )
        .unwrap();
        let reference = reference.display().to_string();
        let trace = [
            "trace",
            "philly.csv",
            "--format",
            "philly",
            "--cluster",
            &cluster,
            "--reference",
            &reference,
            "-o",
            "t.yaml",
        ];
        refused.push((
            "rubick-plan",
            trace.map(str::to_owned).to_vec(),
            "t.yaml",
            "names yaml, but this output is csv",
        ));
    }
    for (tool, args, out, said) in &refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run_in(d, tool, &args);
        assert_eq!(r.code, Some(2), "{tool} {args:?}: {}", r.stderr);
        assert!(r.stderr.contains(out) && r.stderr.contains(said), "{tool} {args:?}: {}", r.stderr);
        assert!(!d.join(out).exists(), "{tool} {args:?}: written anyway");
    }
    // What a name does not contradict is written.
    for (tool, args, out) in [
        ("rubick-plan", plan("schedule"), "schedule"),
        ("rubick-plan", plan("s.yml"), "s.yml"),
        ("rubick-run", run("status.txt", &["status"]), "status.txt"),
        ("rubick-run", run("rubick.prom", &["status", "--format", "prometheus"]), "rubick.prom"),
        ("rubick-run", run("j.yaml", &["jobs"]), "j.yaml"),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run_in(d, tool, &args);
        assert_eq!(r.code, Some(0), "{tool} {args:?}: {}", r.stderr);
        assert!(d.join(out).exists(), "{tool} {args:?}: not written");
    }
}

#[test]
fn metrics_iterations_beyond_the_job_are_ignored() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let script = r#"for i in 1 2 18446744073709551615 101; do
  echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.05}" >> "$RUBICK_METRICS"
done
sleep 60
"#;
    run_until_four_lines(d, script);
    let run = ok(d, &["status"]);
    assert!(run.stdout.contains("2/100"), "{}", run.stdout);
    assert!(run.stderr.contains("iteration 101, beyond the job's 100 iterations: ignored"), "{}", run.stderr);
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ok(d, &["status", "--format", "yaml"]).stdout).unwrap();
    assert_eq!(yaml["jobs"]["a"]["iterationsDone"].as_u64(), Some(2), "{yaml:?}");
    let batch = ok(d, &["jobs"]).stdout;
    assert!(batch.contains("iterations: 98"), "the remaining iterations: {batch}");
}

/// Job `a` of 100 iterations running `script` in `d`, once it wrote 4 metric lines.
fn run_until_four_lines(d: &Path, script: &str) {
    job(d, "a", 100, script);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r.yaml", &[("a", 0)]);
    ok(d, &["apply", "r.yaml"]);
    let metrics = d.join("state/jobs/a/attempt-1/metrics.jsonl");
    wait_for("the lines", || std::fs::read_to_string(&metrics).unwrap_or_default().lines().count() == 4);
}

/// Regression, "a diverging job looks idle: Python writes metric lines with
/// `"loss":NaN` / `Infinity` / `-Infinity` (json.dumps allow_nan default), serde rejects
/// those lines, and `rubick-run status` shows 0 iterations done": the lines are its
/// iterations, the table, YAML and Prometheus text show the loss, and the measured time
/// stays a number.
#[test]
fn a_diverging_job_is_not_idle() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    // As `rubick.metrics` writes them (json.dumps, compact separators).
    let script = r#"for loss in 2.5 Infinity -Infinity NaN; do
  echo "{\"rubick\":1,\"iter\":$((n = n + 1)),\"iter_time_s\":0.05,\"samples\":16,\"loss\":$loss}" >> "$RUBICK_METRICS"
done
sleep 60
"#;
    run_until_four_lines(d, script);
    let table = ok(d, &["status"]).stdout;
    assert!(table.contains("4/100"), "{table}");
    assert!(table.contains("loss NaN at iteration 4"), "{table}");
    assert!(table.contains("0.050"), "the measured time: {table}");
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ok(d, &["status", "--format", "yaml"]).stdout).unwrap();
    let a = &yaml["jobs"]["a"];
    assert_eq!(a["iterationsDone"].as_u64(), Some(4), "{yaml:?}");
    assert!(a["loss"].as_f64().is_some_and(f64::is_nan), "{yaml:?}");
    assert_eq!(a["measuredIterTimeS"].as_f64(), Some(0.05), "{yaml:?}");
    let prometheus = ok(d, &["status", "--format", "prometheus"]).stdout;
    assert!(prometheus.contains("rubick_job_loss{job=\"a\"} NaN"), "{prometheus}");
    assert!(prometheus.contains("rubick_job_iterations_done{job=\"a\"} 4"), "{prometheus}");
    let batch = ok(d, &["jobs"]).stdout;
    assert!(batch.contains("iterations: 96"), "the remaining iterations: {batch}");
}

#[test]
fn status_and_stop_read_only_the_tail_of_a_metrics_file() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    // Three iterations, a fourth once told to (`go`), then waits; on SIGUSR1 records a
    // checkpoint and exits 0.
    let script = r#"line() { echo "$1" >> "$RUBICK_METRICS"; }
it() { line "{\"rubick\":1,\"iter\":$1,\"iter_time_s\":0.05}"; }
trap 'line "{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":4}"; exit 0' USR1
it 1; it 2; it 3
touch "$RUBICK_METRICS.ready"
while [ ! -f "$RUBICK_METRICS.go" ]; do sleep 0.05; done
it 4
touch "$RUBICK_METRICS.done"
while :; do sleep 0.05; done
"#;
    job(d, "a", 100, script);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r.yaml", &[("a", 0)]);
    ok(d, &["apply", "r.yaml"]);
    let metrics = d.join("state/jobs/a/attempt-1/metrics.jsonl");
    let beside = |ext: &str| d.join(format!("state/jobs/a/attempt-1/metrics.jsonl.{ext}"));
    wait_for("three iterations", || beside("ready").exists());
    assert!(ok(d, &["status"]).stdout.contains("3/100"));
    // A line of 100 MB (a hole: no disk), then the run goes on.
    let file = std::fs::OpenOptions::new().append(true).open(&metrics).unwrap();
    file.set_len(file.metadata().unwrap().len() + 100 * 1024 * 1024).unwrap();
    drop(file);
    let mut file = std::fs::OpenOptions::new().append(true).open(&metrics).unwrap();
    std::io::Write::write_all(&mut file, b"\n").unwrap();
    drop(file);
    std::fs::write(beside("go"), "").unwrap();
    wait_for("the fourth iteration", || beside("done").exists());
    // Neither command may hold the line: 48 MiB of heap at most (a whole-file read needs
    // over 100).
    let limit = Some("ulimit -d 49152");
    let run = rr(d, &["status"], limit);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("4/100"), "{}", run.stdout);
    let run = rr(d, &["stop", "a"], limit);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("stopped"), "{s:?}");
    assert_eq!(s["jobs"]["a"]["iterationsDone"].as_u64(), Some(4), "{s:?}");
    let last = s["jobs"]["a"]["reconfigurations"].as_sequence().unwrap().last().unwrap().clone();
    assert_eq!(last["checkpointedIter"].as_u64(), Some(4), "the checkpoint after the long line is found: {s:?}");
}
