//! End-to-end tests of `rubick-profile` with a stand-in workload: a shell script that
//! speaks the job contract (RUBICK_* in, metric lines out) in a fraction of a second.
//! What the real PyTorch workload adds is tested in `pytorch.rs`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rubick_tests::{Held, SlurmShape, alive, binary, escaping_script, run_in, slurm_nodes, temp};

const WORKLOAD: &str = r#"#!/bin/sh
# A stand-in training script: its iteration time grows with micro-batch x GA.
dir=$(dirname "$0")
mb=$RUBICK_MICRO_BATCH
if [ "$RUBICK_GC" = 1 ] && [ -n "${HANG_ON_GC:-}" ]; then
  sleep 300 &
  echo $! > "$dir/hang.pid"
  wait
fi
if [ "$RUBICK_ZERO" = 3 ]; then
  echo 'ZeRO-3 is not implemented by this script' >&2
  exit 2
fi
n=$RUBICK_ITERATIONS
[ -f "$dir/ignore-iterations" ] && n=1000000
if [ "$mb" -ge 8 ]; then
  echo 'torch.OutOfMemoryError: CUDA out of memory (stand-in)' >&2
  exit 3
fi
i=1
while [ "$i" -le "$n" ]; do
  t=$(awk -v mb="$mb" -v ga="$RUBICK_GA" -v s="${SLOW:-1}" -v i="$i" 'BEGIN { printf "%.6f", 0.002 * mb * ga * s * (1 + 0.01 * (i % 3 - 1)) }')
  echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":$t,\"samples\":16}" >> "$RUBICK_METRICS"
  i=$((i + 1))
  [ -n "${STEP_SLEEP:-}" ] && sleep "$STEP_SLEEP"
done
echo "not a metric line" >> "$RUBICK_METRICS"
exit 0
"#;

const CLUSTER: &str = "apiVersion: rubick/v1
kind: Cluster
name: box
nodeGroups:
  - { name: local, count: 1, gpuType: cpu, gpusPerNode: 2, gpuMemoryGib: 8, cpuCores: 2, hostMemoryGib: 16,
      nvlinkGBps: 5, interNodeGBps: 1.25, pcieGBps: 5 }
";

fn setup(dir: &Path, timeout_s: f64) {
    std::fs::write(dir.join("work.sh"), WORKLOAD).unwrap();
    std::fs::write(dir.join("cluster.yaml"), CLUSTER).unwrap();
    let job = format!(
        "apiVersion: rubick/v1
kind: Job
name: stand-in
model: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}
iterations: 100
request: {{ gpus: 1, plan: ga }}
launch:
  version: 1
  command: [sh, {}]
  warmupIterations: 2
  measuredIterations: 5
  timeoutS: {timeout_s}
",
        dir.join("work.sh").display()
    );
    std::fs::write(dir.join("job.yaml"), job).unwrap();
    std::fs::write(
        dir.join("configs.csv"),
        "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\ndp1-tp1-pp1-mb2-ga8,1\ndp1-tp1-pp1-mb16-ga1,1\ndp2-tp1-pp1-mb2-ga4-z1,2\ndp2-tp1-pp1-mb2-ga4-z3,2\n",
    )
    .unwrap();
}

fn profile_args<'a>(out: &'a str, configs: &'a str) -> Vec<&'a str> {
    vec!["run", "job.yaml", "--cluster", "cluster.yaml", "--configs", configs, "-o", out]
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Column `name` of a CSV as strings.
fn column(csv: &str, name: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let i = header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}: {header:?}"));
    lines.map(|l| l.split(',').nth(i).unwrap_or_default().to_owned()).collect()
}

#[test]
fn a_profile_records_every_run_with_its_status_and_times() {
    let dir = temp();
    setup(dir.path(), 60.0);
    let run = run_in(dir.path(), "rubick-profile", &profile_args("profile.csv", "configs.csv"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let csv = read(dir.path(), "profile.csv");
    for col in ["job", "plan", "placement", "status", "repeat", "iterations", "iter_time_s", "iter_time_sd_s", "wall_s"]
    {
        column(&csv, col);
    }
    assert_eq!(
        column(&csv, "status"),
        ["oom", "ok", "ok", "ok", "unsupported"],
        "sorted by plan: dp1 mb16 is out of memory, ZeRO-3 exits 2: {csv}"
    );
    assert_eq!(column(&csv, "iterations"), ["", "5", "5", "5", ""]);
    // mb2 x ga8 = mb4 x ga4: 0.032 s (dp2: half); the measured 5 after the 2 warm-up ones.
    let t: Vec<f64> = column(&csv, "iter_time_s").iter().filter_map(|x| x.parse().ok()).collect();
    assert_eq!(t.len(), 3);
    assert!(t.iter().zip([0.032, 0.032, 0.016]).all(|(t, e)| (t - e).abs() < 0.0005), "{t:?}");
    assert!(run.stderr.contains("status") && run.stderr.contains("oom"), "summary on stderr: {}", run.stderr);
    // Each run's files stay for inspection.
    assert!(dir.path().join("profile.csv.runs").read_dir().unwrap().count() == 5);
}

/// A script that ignores `RUBICK_ITERATIONS` is stopped once it has its warm-up and
/// measured iterations (the stop signal), and its row is kept as measured; killed by
/// the stop (it has no handler), its row says why an `ok` row's exit code is not 0
/// (issue 42: "profile rows `ok` with exit code 1 and a traceback", nothing said).
#[test]
fn a_run_that_ignores_its_iteration_count_is_stopped_once_measured() {
    let dir = temp();
    setup(dir.path(), 120.0);
    std::fs::write(dir.path().join("ignore-iterations"), "").unwrap();
    let job = read(dir.path(), "job.yaml").replace("  version: 1\n", "  version: 1\n  env: { STEP_SLEEP: \"0.05\" }\n");
    std::fs::write(dir.path().join("job.yaml"), job).unwrap();
    std::fs::write(dir.path().join("one.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\n").unwrap();
    let started = Instant::now();
    let run = run_in(dir.path(), "rubick-profile", &profile_args("p.csv", "one.csv"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(started.elapsed() < Duration::from_secs(60), "stopped long before its timeout: {:?}", started.elapsed());
    let csv = read(dir.path(), "p.csv");
    assert_eq!(column(&csv, "status"), ["ok"], "{csv}");
    assert_eq!(column(&csv, "iterations"), ["5"], "{csv}");
    assert_eq!(column(&csv, "exit_code"), ["138"], "killed by SIGUSR1: {csv}");
    assert!(
        csv.contains("exit 138 (signal 10) after the stop rubick sent (SIGUSR1) once its 7 iterations were measured"),
        "the reason of an ok row that did not exit 0: {csv}"
    );
}

#[test]
fn a_hung_run_is_killed_at_its_timeout_with_its_whole_process_group() {
    let dir = temp();
    setup(dir.path(), 2.0);
    std::fs::write(dir.path().join("hang.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4-gc,1\ndp1-tp1-pp1-mb4-ga4,1\n")
        .unwrap();
    let start = Instant::now();
    let out = Command::new(binary("rubick-profile"))
        .args(profile_args("p.csv", "hang.csv"))
        .current_dir(dir.path())
        .env("HANG_ON_GC", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a timeout is a run that did not measure: {stderr}");
    assert!(start.elapsed() < Duration::from_secs(60));
    let csv = read(dir.path(), "p.csv");
    assert_eq!(column(&csv, "status"), ["ok", "timeout"], "{csv}");
    assert!(stderr.contains("timeout"), "{stderr}");
    let pid = read(dir.path(), "hang.pid").trim().to_owned();
    std::thread::sleep(Duration::from_millis(200));
    assert!(!alive(&pid), "the hung run's worker {pid} survived");
}

/// `rubick-profile ARGS` started in `dir` with `HANG_ON_GC=1`, once its hung run's worker
/// recorded its pid: (the profile, that pid).
fn hung_profile(dir: &Path, args: &[&str]) -> (std::process::Child, String) {
    let child = Command::new(binary("rubick-profile"))
        .args(args)
        .current_dir(dir)
        .env("HANG_ON_GC", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.join("hang.pid").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, read(dir, "hang.pid").trim().to_owned())
}

#[test]
fn a_killed_profile_keeps_its_finished_rows_leaves_no_worker_and_resumes() {
    let dir = temp();
    setup(dir.path(), 600.0);
    std::fs::write(
        dir.path().join("three.csv"),
        "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\ndp1-tp1-pp1-mb4-ga4-gc,1\ndp1-tp1-pp1-mb2-ga8,1\n",
    )
    .unwrap();
    // Until the hung second run has started.
    let (mut child, pid) = hung_profile(dir.path(), &profile_args("p.parquet", "three.csv"));
    assert!(alive(&pid));
    child.kill().unwrap(); // SIGKILL: no chance to clean up itself
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(&pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(&pid), "worker {pid} of the killed profile survived it");
    // The table is readable and holds the finished run; fitting tools can read it.
    let back = run_in(dir.path(), "rubick-profile", &["compare", "p.parquet", "p.parquet"]);
    assert_eq!(back.code, Some(0), "{}", back.stderr);
    assert_eq!(back.stdout.lines().count(), 2, "one finished row: {}", back.stdout);
    // Again, without the hang: only the two missing runs are made.
    let again = run_in(
        dir.path(),
        "rubick-profile",
        &["-v", "run", "job.yaml", "--cluster", "cluster.yaml", "--configs", "three.csv", "-o", "p.parquet"],
    );
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(again.stderr.contains("1 of 3 runs already measured"), "{}", again.stderr);
    let all = run_in(dir.path(), "rubick-profile", &["compare", "p.parquet", "p.parquet"]);
    assert_eq!(all.stdout.lines().count(), 4, "{}", all.stdout);
}

/// The watchdog of a profile's Slurm run is the run wrapper's `--watchdog`
/// mode (Rust, not shell text): `kill -9` of rubick-profile cancels the Slurm job, and
/// the hung worker on its node goes with it.
#[test]
fn a_killed_profile_through_slurm_leaves_no_job_behind() {
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 0 }, Held::Shared) else { return };
    let dir = temp();
    setup(dir.path(), 600.0);
    std::fs::write(dir.path().join("hang.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4-gc,1\n").unwrap();
    let mut args = profile_args("p.csv", "hang.csv");
    args.extend(["--backend", "slurm"]);
    let (mut child, pid) = hung_profile(dir.path(), &args);
    // The profile's Slurm jobs: those whose working directory is this test's.
    let here = dir.path().canonicalize().unwrap().display().to_string();
    let jobs = || {
        let out = Command::new("squeue").args(["-h", "-o", "%i %Z"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_once(' ').is_some_and(|(_, wd)| wd == here))
            .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
            .collect::<Vec<String>>()
    };
    assert_eq!(jobs().len(), 1, "one Slurm job runs the hung configuration");
    child.kill().unwrap(); // SIGKILL: no chance to clean up itself
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (alive(&pid) || !jobs().is_empty()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(jobs().is_empty(), "the killed profile's Slurm job is still there: {:?}", jobs());
    assert!(!alive(&pid), "the worker {pid} of the killed profile's Slurm job survived it");
}

/// Profiles through every backend: through Kubernetes a profile needs kubectl
/// (manifests alone measure nothing) and its runs' directories on a volume the pods
/// share with this machine (it reads their metric lines back); without either it is
/// refused before any run, saying what is missing. (No cluster runs here: the manifests
/// are validated against the Kubeflow CRDs in rubick-launch's tests.)
#[test]
fn a_profile_through_kubernetes_needs_kubectl_and_its_runs_on_a_shared_volume() {
    let dir = temp();
    setup(dir.path(), 60.0);
    let mut args = profile_args("p.csv", "configs.csv");
    args.extend(["--backend", "kubernetes", "--kubernetes", "k8s.yaml"]);
    for (settings, says) in [
        ("kubectl: false\n", "kubectl: true"),
        ("kubectl: true\n", "runsPvc"),
        ("kubectl: true\nrunsPvc: runs\nrunsRoot: /nonexistent-runs-root\n", "runsRoot is /nonexistent-runs-root"),
        ("kubectl: true\nrunsPvc: runs\n", "k8s.yaml: runsPvc and runsRoot go together"),
    ] {
        std::fs::write(dir.path().join("k8s.yaml"), settings).unwrap();
        let run = run_in(dir.path(), "rubick-profile", &args);
        assert_eq!(run.code, Some(2), "{settings}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{settings}: {}", run.stderr);
        assert!(!dir.path().join("p.csv").exists(), "{settings}: no table written");
    }
}

#[test]
fn compare_passes_the_same_code_and_fails_a_slower_configuration() {
    let dir = temp();
    setup(dir.path(), 60.0);
    let profile = |out: &str, slow: &str| {
        let o = Command::new(binary("rubick-profile"))
            .args([
                "run",
                "job.yaml",
                "--cluster",
                "cluster.yaml",
                "--configs",
                "configs.csv",
                "--repeat",
                "2",
                "-o",
                out,
            ])
            .current_dir(dir.path())
            .env("SLOW", slow)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    };
    profile("base.csv", "1");
    profile("same.csv", "1");
    profile("slow.csv", "1.3");
    let same = run_in(dir.path(), "rubick-profile", &["compare", "base.csv", "same.csv"]);
    assert_eq!(same.code, Some(0), "{}{}", same.stdout, same.stderr);
    let slow = run_in(dir.path(), "rubick-profile", &["compare", "base.csv", "slow.csv", "--format", "junit"]);
    assert_eq!(slow.code, Some(1), "{}{}", slow.stdout, slow.stderr);
    assert!(slow.stdout.starts_with("<?xml") && slow.stdout.contains("<testsuite "), "{}", slow.stdout);
    assert!(slow.stdout.contains("failures=\"3\""), "three configurations measured, all slower: {}", slow.stdout);
    assert!(slow.stderr.contains("regressed"), "{}", slow.stderr);
    let md = run_in(
        dir.path(),
        "rubick-profile",
        &["compare", "base.csv", "slow.csv", "--format", "markdown", "--max-regression", "40%"],
    );
    assert_eq!(md.code, Some(0), "30% slower is within a 40% threshold: {}", md.stdout);
    assert!(md.stdout.starts_with("| plan |"), "{}", md.stdout);
    // Another job's profile: no comparison, an error naming both.
    let other = read(dir.path(), "same.csv").replace("stand-in,", "other-job,");
    std::fs::write(dir.path().join("other.csv"), other).unwrap();
    let mixed = run_in(dir.path(), "rubick-profile", &["compare", "base.csv", "other.csv"]);
    assert_eq!(mixed.code, Some(2), "{}{}", mixed.stdout, mixed.stderr);
    assert!(mixed.stderr.contains("other-job") && mixed.stderr.contains("stand-in"), "{}", mixed.stderr);
    assert!(mixed.stdout.is_empty(), "{}", mixed.stdout);
}

#[test]
fn a_job_without_a_launch_section_or_another_jobs_table_is_a_clear_error() {
    let dir = temp();
    setup(dir.path(), 60.0);
    let job = read(dir.path(), "job.yaml");
    std::fs::write(dir.path().join("bare.yaml"), &job[..job.find("launch:").unwrap()]).unwrap();
    let run = run_in(dir.path(), "rubick-profile", &["run", "bare.yaml", "--cluster", "cluster.yaml", "-o", "p.csv"]);
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("bare.yaml") && run.stderr.contains("launch"), "{}", run.stderr);
    std::fs::write(dir.path().join("other.csv"), "job,model,plan,placement\nother,tiny,dp1-tp1-pp1-mb4-ga4,1\n")
        .unwrap();
    let run = run_in(dir.path(), "rubick-profile", &profile_args("other.csv", "configs.csv"));
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("`other`") && run.stderr.contains("--fresh"), "{}", run.stderr);
    std::fs::write(dir.path().join("bad.csv"), "plan,placement\ndp3-tp1-pp1-mb4-ga4,1\n").unwrap();
    let run = run_in(dir.path(), "rubick-profile", &profile_args("p.csv", "bad.csv"));
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("bad.csv: line 2"), "{}", run.stderr);
    // A placement across nodes runs through Slurm only: said with its line.
    std::fs::write(dir.path().join("nodes.csv"), "plan,placement\ndp2-tp1-pp1-mb4-ga2,11\n").unwrap();
    let run = run_in(dir.path(), "rubick-profile", &profile_args("p.csv", "nodes.csv"));
    assert_eq!(run.code, Some(2));
    assert!(run.stderr.contains("nodes.csv: line 2") && run.stderr.contains("--backend slurm"), "{}", run.stderr);
}

#[test]
fn devices_describes_this_machine_and_writes_a_cluster_of_it() {
    let dir = temp();
    let run = run_in(dir.path(), "rubick-profile", &["devices", "--cluster-out", "local.yaml"]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stdout.contains("cpuCores:"), "{}", run.stdout);
    let cluster: rubick_core::Cluster = serde_yaml_ng::from_str(&read(dir.path(), "local.yaml")).unwrap();
    let g = &cluster.node_groups[0];
    assert!(g.gpus_per_node >= 1 && g.cpu_cores >= 1);
    if run.stdout.contains("gpus: []") {
        assert_eq!(g.gpu_type, "cpu");
        assert!(run.stderr.contains("NVML"), "says once why there is no GPU: {}", run.stderr);
    }
}

/// Regression, "wrong verdicts from garbage": compare refuses a zero or negative time or
/// spread, an unknown placement or plan (naming file and line), and fails a new profile
/// that lacks a configuration the baseline measured; a profile run again re-measures its
/// failed rows, each recorded with its exit code and reason.
#[test]
fn compare_refuses_garbage_rather_than_give_a_verdict() {
    let dir = temp();
    let d = dir.path();
    setup(d, 60.0);
    let run = run_in(d, "rubick-profile", &profile_args("base.csv", "configs.csv"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let base = read(d, "base.csv");
    let header = base.lines().next().unwrap();
    let col = |name: &str| header.split(',').position(|h| h == name).unwrap();
    let edit = |line: usize, column: usize, value: &str| -> String {
        let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
        let mut cells: Vec<String> = lines[line - 1].split(',').map(str::to_owned).collect();
        cells[column] = value.to_owned();
        lines[line - 1] = cells.join(",");
        lines.join("\n") + "\n"
    };
    // Line 3 is a measured row (sorted by plan: line 2 is the out-of-memory one).
    for (name, text, says) in [
        ("zero.csv", edit(3, col("iter_time_s"), "0"), "iter_time_s"),
        ("negsd.csv", edit(3, col("iter_time_sd_s"), "-0.72"), "iter_time_sd_s"),
        ("placement.csv", edit(3, col("placement"), "x"), "placement `x`"),
        ("plan.csv", edit(3, col("plan"), "dp1-nonsense"), "plan `dp1-nonsense`"),
    ] {
        std::fs::write(d.join(name), text).unwrap();
        let run = run_in(d, "rubick-profile", &["compare", "base.csv", name]);
        assert_eq!(run.code, Some(2), "{name}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains("line 3") && run.stderr.contains(says), "{name}: {}", run.stderr);
    }
    // A new profile without one of the measured configurations fails the gate.
    let fewer: String = base.lines().enumerate().filter(|(i, _)| *i != 2).map(|(_, l)| format!("{l}\n")).collect();
    std::fs::write(d.join("fewer.csv"), fewer).unwrap();
    let run = run_in(d, "rubick-profile", &["compare", "base.csv", "fewer.csv"]);
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("missing from the new profile"), "{}", run.stdout);
    // Failed rows carry their exit code and reason, and a second run measures them again.
    let failed = edit(3, col("status"), "failed");
    std::fs::write(d.join("again.csv"), failed).unwrap();
    let run = run_in(
        d,
        "rubick-profile",
        &["-v", "run", "job.yaml", "--cluster", "cluster.yaml", "--configs", "configs.csv", "-o", "again.csv"],
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("1 failed or timed-out run(s) are run again"), "{}", run.stderr);
    let again = read(d, "again.csv");
    assert!(column(&again, "status").iter().all(|s| s != "failed"), "{again}");
    let oom = column(&again, "reason");
    assert!(oom.iter().any(|r| r.contains("exit 3: out of memory")), "{again}");
    assert!(column(&again, "exit_code").iter().any(|c| c == "2"), "the refused ZeRO-3 row: {again}");
}

/// Regression, "a `setsid` child of a profile run outlived the run's timeout and its end":
/// every process marked with the run's metrics path goes with the run.
#[test]
fn a_setsid_child_ends_with_its_profile_run() {
    let dir = temp();
    let d = dir.path();
    setup(d, 60.0);
    let script = escaping_script(d);
    let job = read(d, "job.yaml").replace(
        &format!("command: [sh, {}]", d.join("work.sh").display()),
        &format!("command: [sh, {}]", script.display()),
    );
    std::fs::write(d.join("job.yaml"), job).unwrap();
    std::fs::write(d.join("one.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\n").unwrap();
    let run = run_in(d, "rubick-profile", &profile_args("p.csv", "one.csv"));
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let pid = read(d, "escaped.pid").trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(&pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(&pid), "the setsid child {pid} outlived its run");
}

/// Every file under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Regression, "torchtitan without a GPU ran four 15-20 s runs that each failed, left
/// its outputs/ in the clone, rc 1, the cause only in the logs": the example's job says
/// what it requires (`requires:` a GPU with NVIDIA's driver, its assets), and where that
/// is missing, `rubick-profile run` refuses it in one line naming every missing thing,
/// exit 2, in under a second, with nothing written in the directory laid out as the
/// clone; so do `rubick-run apply` (a schedule placing it on CPU worker slots) and
/// `submit` to a state whose cluster has no GPU.
#[test]
fn a_job_requiring_a_gpu_is_refused_up_front_where_there_is_none() {
    let dir = temp();
    let d = dir.path();
    std::fs::create_dir_all(d.join("examples/torchtitan")).unwrap();
    let job = rubick_tests::repo().join("examples/torchtitan/job.yaml");
    std::fs::copy(&job, d.join("examples/torchtitan/job.yaml")).unwrap();
    std::fs::write(d.join("cluster.yaml"), CLUSTER).unwrap();
    let before = tree(d);
    let refused = |args: &[&str], what: &str| -> String {
        let start = Instant::now();
        let run = run_in(d, "rubick-profile", args);
        let took = start.elapsed();
        assert_eq!(run.code, Some(2), "{what}: {}", run.stderr);
        assert_eq!(run.stderr.trim_end().lines().count(), 1, "{what}: one line: {}", run.stderr);
        assert!(took < Duration::from_secs(1), "{what}: refused in {took:?}");
        assert_eq!(tree(d), before, "{what}: nothing written: {}", run.stderr);
        run.stderr
    };
    // The issue's command, on a cluster whose GPUs are worker slots of CPU cores.
    let args = ["run", "examples/torchtitan/job.yaml", "--cluster", "cluster.yaml", "--budget", "4", "-o", "p.csv"];
    let err = refused(&args, "a CPU cluster");
    assert!(err.contains("examples/torchtitan/job.yaml") && err.contains("torchtitan-llama3-debug"), "{err}");
    assert!(err.contains("requires a GPU") && err.contains("gpuType cpu"), "{err}");
    assert!(
        err.contains("examples/torchtitan/assets/tokenizer")
            && err.contains("`python examples/torchtitan/assets.py examples/torchtitan/assets`"),
        "the assets and the command that makes them: {err}"
    );
    // Without a driver here, this machine (no --cluster) and a GPU cluster run locally
    // are refused too, the second naming the driver.
    if !Path::new(rubick_launch::requires::NVIDIA_DRIVER).exists() {
        let err = refused(&["run", "examples/torchtitan/job.yaml", "--budget", "4", "-o", "p.csv"], "this machine");
        assert!(err.contains("requires a GPU"), "{err}");
        std::fs::copy(rubick_tests::repo().join("data/cluster-a800-8x8.yaml"), d.join("a800.yaml")).unwrap();
        let before_a800 = tree(d);
        let run = run_in(
            d,
            "rubick-profile",
            &["run", "examples/torchtitan/job.yaml", "--cluster", "a800.yaml", "--budget", "1", "-o", "p.csv"],
        );
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(run.stderr.contains("NVIDIA driver") && !run.stderr.contains("requires a GPU"), "{}", run.stderr);
        assert_eq!(tree(d), before_a800, "{}", run.stderr);
        std::fs::remove_file(d.join("a800.yaml")).unwrap();
    }
    // rubick-run: apply refuses a schedule that places it on the CPU slots, before any
    // action; submit refuses it to a state that remembers such a cluster.
    let rr = |args: &[&str]| run_in(d, "rubick-run", args);
    let submit = rr(&["submit", "examples/torchtitan/job.yaml", "--state", "state"]);
    assert_eq!(submit.code, Some(0), "no cluster known yet: {}", submit.stderr);
    crate::run::schedule(d, "r1.yaml", 1, &[("torchtitan-llama3-debug", "dp1-tp1-pp1-mb8-ga1", &[0])]);
    let apply = rr(&["apply", "r1.yaml", "--state", "state", "--cluster", "cluster.yaml"]);
    assert_eq!(apply.code, Some(2), "{}", apply.stderr);
    assert_eq!(apply.stderr.trim_end().lines().count(), 1, "{}", apply.stderr);
    assert!(apply.stderr.contains("requires a GPU") && apply.stderr.contains("rubick-run delete"), "{}", apply.stderr);
    assert!(!d.join("state/jobs/torchtitan-llama3-debug/attempt-1").exists(), "nothing started");
    assert!(!d.join("state/cluster.yaml").exists(), "the refused apply remembers nothing");
    std::fs::copy(d.join("cluster.yaml"), d.join("state/cluster.yaml")).unwrap();
    let again = rr(&["submit", "examples/torchtitan/job.yaml", "--state", "state", "--replace"]);
    assert_eq!(again.code, Some(2), "{}", again.stderr);
    assert!(again.stderr.contains("requires a GPU") && again.stderr.contains("state/cluster.yaml"), "{}", again.stderr);
}

/// A stand-in of the torchtitan job: every path it reads is relative to the directory it
/// starts in (its command, `ASSETS`), each node's launcher says where it started and
/// whether it found the assets, and its own outputs go to the run's directory.
const TITAN_STAND_IN: &str = r#"#!/bin/sh
run=$(dirname "$RUBICK_METRICS")
here="$run/node-$RUBICK_NODE_RANK"
tokenizer=missing
[ -f "$ASSETS/tokenizer/tokenizer.json" ] && tokenizer=found
echo "$(hostname) $RUBICK_NODE_RANK $(pwd -P) $tokenizer" > "$here.$$" && mv "$here.$$" "$here"
mkdir -p "$run/torchtitan" && echo "rank $RUBICK_NODE_RANK" > "$run/torchtitan/rank-$RUBICK_NODE_RANK.log"
i=0
while [ "$i" -lt "$RUBICK_ITERATIONS" ]; do
  i=$((i + 1))
  [ "$RUBICK_NODE_RANK" = 0 ] && echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.05,\"samples\":16}" >> "$RUBICK_METRICS"
  sleep 0.05
done
"#;

/// The Slurm path of the torchtitan example, with a stand-in of its job: run from the
/// clone's root with paths relative to it (command, environment, `requires.files`), a
/// profile's configuration on placement `11` starts a launcher on each of two nodes, both
/// in the clone (the directory rubick-profile ran in, shared by every node) finding the
/// assets there, and the job's own outputs land in the run's directory, none in the
/// clone; before the assets exist, the profile is refused naming them and the command
/// that makes them.
#[test]
fn a_job_with_relative_paths_runs_from_the_clone_on_every_slurm_node() {
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 2, gpus_per_node: 1 }, Held::Shared) else { return };
    let dir = temp();
    let _reaper = rubick_tests::Reaper(dir.path().to_path_buf());
    let d = dir.path();
    std::fs::create_dir_all(d.join("stand-in")).unwrap();
    std::fs::write(d.join("stand-in/train.sh"), TITAN_STAND_IN).unwrap();
    std::fs::write(
        d.join("stand-in/assets.sh"),
        "mkdir -p assets/tokenizer && echo '{}' > assets/tokenizer/tokenizer.json\n",
    )
    .unwrap();
    std::fs::write(
        d.join("gpus.yaml"),
        "apiVersion: rubick/v1\nkind: Cluster\nname: slurm\nnodeGroups:\n  - { name: gpu, count: 3, gpuType: gpu, gpusPerNode: 2, \
         gpuMemoryGib: 8, cpuCores: 2, hostMemoryGib: 4, nvlinkGBps: 5, interNodeGBps: 1.25, pcieGBps: 5 }\n",
    )
    .unwrap();
    std::fs::write(
        d.join("job.yaml"),
        "apiVersion: rubick/v1
kind: Job
name: titan-stand-in
model: { name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }
iterations: 100
request: { gpus: 1, plan: ga }
requires: { gpu: any, files: [assets/tokenizer], setup: sh stand-in/assets.sh }
launch:
  version: 1
  command: [sh, stand-in/train.sh]
  env: { ASSETS: assets }
  warmupIterations: 2
  measuredIterations: 5
  timeoutS: 120
",
    )
    .unwrap();
    std::fs::write(d.join("configs.csv"), "plan,placement\ndp2-tp1-pp1-mb4-ga2,11\n").unwrap();
    let args =
        ["run", "job.yaml", "--cluster", "gpus.yaml", "--configs", "configs.csv", "--backend", "slurm", "-o", "p.csv"];
    let refused = run_in(d, "rubick-profile", &args);
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("assets/tokenizer") && refused.stderr.contains("`sh stand-in/assets.sh`"),
        "{}",
        refused.stderr
    );
    assert!(!d.join("p.csv.runs").exists(), "nothing written before the refusal");
    let setup = Command::new("sh").arg("stand-in/assets.sh").current_dir(d).status().unwrap();
    assert!(setup.success());
    let run = run_in(d, "rubick-profile", &args);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let csv = read(d, "p.csv");
    assert_eq!(column(&csv, "status"), vec!["ok"], "{csv}\n{}", run.stderr);
    let run_dir = std::fs::read_dir(d.join("p.csv.runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("node-1").exists())
        .unwrap_or_else(|| panic!("no run with a launcher of rank 1:\n{}", run.stderr));
    let clone = d.canonicalize().unwrap().display().to_string();
    let mut hosts = Vec::new();
    for rank in 0..2 {
        let said = std::fs::read_to_string(run_dir.join(format!("node-{rank}"))).unwrap();
        let f: Vec<&str> = said.split_whitespace().collect();
        assert_eq!(f[1..], [rank.to_string().as_str(), clone.as_str(), "found"], "rank {rank}: {said}");
        assert!(
            run_dir.join(format!("torchtitan/rank-{rank}.log")).exists(),
            "rank {rank}'s outputs in the run's directory"
        );
        hosts.push(f[0].to_owned());
    }
    assert!(hosts[0] != hosts[1] && hosts.iter().all(|h| usable.contains(h)), "two nodes: {hosts:?} of {usable:?}");
    assert!(!d.join("outputs").exists() && !d.join("torchtitan").exists(), "nothing of the job's in the clone's root");
}
