//! What the smaller commands print and where a job's paths resolve: `apply
//! --dry-run`, `logs`, `status --format prometheus`; a relative argv[0] and a relative
//! `--state`.

use std::process::Command;
use std::time::Duration;

use rubick_tests::{Reaper, binary, temp};

use super::{last_iter, ok, rr, schedule, setup, state, wait_for, workers};

/// Item 8: `apply --dry-run` prints the actions and takes none; `logs` prints
/// a run's log, `--follow` until the run ends.
#[test]
fn apply_dry_run_takes_no_action_and_logs_print_the_run() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let out = ok(d, &["apply", "r1.yaml", "--dry-run"]);
    assert_eq!(out.trim(), "start a dp1-tp1-pp1-mb4-ga4 on local-0:0", "{out}");
    assert_eq!(state(d)["jobs"]["a"]["status"].as_str(), Some("queued"));
    assert!(workers(d).is_empty() && !d.join("state/jobs/a/attempt-1").exists());
    let (code, _, err) = rr(d, &["logs", "a"], None);
    assert_eq!(code, Some(2), "no run yet: {err}");
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a training", || last_iter(d, "a", 1) >= 2);
    let log = ok(d, &["logs", "a"]);
    assert!(log.contains("stand-in: starting at iteration 0"), "{log}");
    let follower = Command::new(binary("rubick-run"))
        .args(["logs", "a", "--follow", "--state"])
        .arg(d.join("state"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    ok(d, &["stop", "a"]);
    let out = follower.wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("starting at iteration 0"));
}

/// Regression, "Prometheus: every series, counters included, carries a `plan` label ... a
/// counter prints `-0`; no job status, failures or retries-left metric".
#[test]
fn prometheus_series_are_labelled_as_their_kind_needs() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    let prom = ok(d, &["status", "--format", "prometheus"]);
    for line in prom.lines().filter(|l| !l.starts_with('#')) {
        assert!(line.starts_with("rubick_job_info") || !line.contains("plan="), "{line}");
        assert!(!line.ends_with(" -0"), "{line}");
    }
    assert!(prom.contains("rubick_job_info{job=\"a\",plan=\"dp1-tp1-pp1-mb4-ga4\"} 1"), "{prom}");
    assert!(prom.contains("rubick_job_status{job=\"b\",status=\"queued\"} 1"), "{prom}");
    assert!(prom.contains("rubick_job_retries_left{job=\"a\"} 3"), "{prom}");
    ok(d, &["stop", "a"]);
}

/// Regression, "a relative argv[0] resolves against the cwd of whichever apply starts
/// it": relative paths resolve against where the job was submitted; a command that
/// cannot be run (exit 127) is failed, not retried.
#[test]
fn a_relative_argv0_resolves_against_where_the_job_was_submitted() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    let sub = d.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::copy(d.join("work.sh"), sub.join("work.sh")).unwrap();
    std::fs::set_permissions(sub.join("work.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let a = std::fs::read_to_string(d.join("a.yaml"))
        .unwrap()
        .replace(&format!("command: [sh, {}]", d.join("work.sh").display()), "command: [./work.sh]");
    assert!(a.contains("command: [./work.sh]"), "{a}");
    std::fs::write(sub.join("a.yaml"), &a).unwrap();
    std::fs::write(sub.join("gone.yaml"), a.replace("name: a", "name: gone").replace("./work.sh", "./missing.sh"))
        .unwrap();
    let submit = Command::new(binary("rubick-run"))
        .args(["submit", "a.yaml", "gone.yaml", "--retries", "3", "--state"])
        .arg(d.join("state"))
        .current_dir(&sub)
        .output()
        .unwrap();
    assert!(submit.status.success(), "{}", String::from_utf8_lossy(&submit.stderr));
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("gone", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a training from its own directory", || last_iter(d, "a", 1) >= 2);
    wait_for("gone exited", || d.join("state/jobs/gone/attempt-1/exit-code").exists());
    ok(d, &["apply", "r1.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["gone"]["status"].as_str(), Some("failed"), "exit 127 is not retried: {s:?}");
    assert_eq!(s["jobs"]["gone"]["attempts"].as_u64(), Some(1), "{s:?}");
    assert!(s["jobs"]["gone"]["reason"].as_str().unwrap_or_default().contains("could not be run"), "{s:?}");
    ok(d, &["stop", "a"]);
}

/// Regression, "a relative `--state` breaks a run whose `workdir` differs (its wrapper
/// cannot write its exit code)": the state directory is made absolute once, so a run
/// in another working directory still records how it ended.
#[test]
fn a_relative_state_works_for_a_run_whose_workdir_differs() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 20);
    std::fs::create_dir_all(d.join("elsewhere")).unwrap();
    let a = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace(
        "  stopTimeoutS: 10\n",
        &format!("  stopTimeoutS: 10\n  workdir: {}\n", d.join("elsewhere").display()),
    );
    std::fs::write(d.join("a.yaml"), a).unwrap();
    let rel = |args: &[&str]| {
        let out =
            Command::new(binary("rubick-run")).args(args).args(["--state", "state"]).current_dir(d).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    rel(&["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    rel(&["apply", "r1.yaml"]);
    wait_for("the run's exit code", || d.join("state/jobs/a/attempt-1/exit-code").exists());
    rel(&["apply", "r1.yaml"]);
    assert_eq!(state(d)["jobs"]["a"]["status"].as_str(), Some("finished"), "{:?}", state(d));
}
