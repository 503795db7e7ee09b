//! Bad input refused before anything is done, naming what is wrong: schedules,
//! states (a newer version, a hand-edited one naming a path outside), job names, a
//! missing state directory, a planted symlink, more cores than this machine has, a
//! huge stop timeout; one bad job never blocks the others.

use std::process::Command;
use std::time::Duration;

use rubick_tests::{Reaper, binary, temp};

use super::{last_iter, ok, rr, schedule, setup, state, two_slot_cluster, wait_for, workers};

#[test]
fn bad_schedules_and_states_are_refused_before_anything_is_done() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    type Assignments<'a> = &'a [(&'a str, &'a str, &'a [u32])];
    let cases: [(&str, Assignments<'_>, &str); 2] = [
        ("unknown.yaml", &[("zz", "dp1-tp1-pp1-mb4-ga4", &[0])], "assignments[0].job"),
        ("twice.yaml", &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[0])], "given to both"),
    ];
    for (file, jobs, expected) in cases {
        schedule(d, file, 1, jobs);
        let (code, _, err) = rr(d, &["apply", file], None);
        assert_eq!(code, Some(2), "{file}: {err}");
        assert!(err.contains(expected) && err.contains(file), "{file}: {err}");
        assert!(!d.join("state/jobs").exists(), "{file}: something was started");
    }
    // Out of the cluster's range, or for another cluster.
    two_slot_cluster(d);
    schedule(d, "range.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[7])]);
    let (code, _, err) = rr(d, &["apply", "range.yaml", "--cluster", "cluster.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("assignments[0].nodes[0].gpus") && err.contains("GPU 7"), "{err}");
    let other = std::fs::read_to_string(d.join("range.yaml")).unwrap().replace("cluster: box", "cluster: other");
    std::fs::write(d.join("other.yaml"), other).unwrap();
    let (code, _, err) = rr(d, &["apply", "other.yaml", "--cluster", "cluster.yaml"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("cluster") && err.contains("`other`"), "{err}");
    // A state from a newer rubick-run.
    let text = std::fs::read_to_string(d.join("state/state.yaml")).unwrap().replace("version: 1", "version: 99");
    std::fs::write(d.join("state/state.yaml"), text).unwrap();
    let (code, _, err) = rr(d, &["status"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("state.yaml") && err.contains("version: 99"), "{err}");
}

/// Regression, "re-submitting a job name runs it twice": an existing name is refused; a
/// `--replace` of a stopped job is a new incarnation whose first run never reads the
/// old one's files; `delete` removes a stopped job; a state that lost a run's record
/// never starts a second copy beside the live one.
#[test]
fn a_job_name_is_submitted_once_and_never_runs_twice() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    let (code, _, err) = rr(d, &["submit", "a.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("already exists") && err.contains("queued") && err.contains("stop it first"), "{err}");
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a training", || last_iter(d, "a", 1) >= 3);
    ok(d, &["stop", "a"]);
    // The old attempt leaves an exit code behind.
    assert!(d.join("state/jobs/a/attempt-1/exit-code").exists());
    let (code, _, err) = rr(d, &["submit", "a.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--replace") && err.contains("delete"), "{err}");
    let (code, _, err) = rr(d, &["submit", "a.yaml", "--replace"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("a: queued"), "submit says what it queued: {err}");
    assert!(d.join("state/jobs/a.replaced-1/attempt-1/exit-code").exists(), "the old files are kept aside");
    schedule(d, "r2.yaml", 2, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r2.yaml"]);
    wait_for("the new incarnation training", || last_iter(d, "a", 1) >= 3);
    ok(d, &["apply", "r2.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("running"), "no old exit code read as the new run's: {s:?}");
    assert_eq!(workers(d).len(), 1, "{:?}", workers(d));
    // A state that lost the run's record: the next apply finds the live run by its mark
    // and stops it before it starts the job again: one copy.
    let text = std::fs::read_to_string(d.join("state/state.yaml")).unwrap();
    let mut lost: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    lost["jobs"]["a"]["run"] = serde_yaml_ng::Value::Null;
    lost["jobs"]["a"]["status"] = "queued".into();
    std::fs::write(d.join("state/state.yaml"), serde_yaml_ng::to_string(&lost).unwrap()).unwrap();
    let (code, _, err) = rr(d, &["apply", "r2.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("without a record"), "{err}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(workers(d).len(), 1, "one copy: {:?}", workers(d));
    ok(d, &["stop", "a"]);
    wait_for("no copy left", || workers(d).is_empty());
    let (code, _, err) = rr(d, &["delete", "a"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(state(d)["jobs"]["a"].is_null() && !d.join("state/jobs/a").exists());
}

/// Regression, "a job name escapes the state directory": a name that is not a plain
/// file name is refused at submit, naming the field, and nothing is written outside.
#[test]
fn a_job_name_stays_inside_the_state_directory() {
    let dir = temp();
    let d = dir.path();
    setup(d, 10);
    for bad in ["../../escaped", "a/b", "..", "x\\ny", &"n".repeat(300)] {
        let job = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("name: a", &format!("name: \"{bad}\""));
        std::fs::write(d.join("bad.yaml"), job).unwrap();
        let (code, _, err) = rr(d, &["submit", "bad.yaml"], None);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("name"), "{bad}: {err}");
    }
    assert!(!d.join("escaped").exists() && !d.parent().unwrap().join("escaped").exists());
}

/// Regression, "one bad job blocks every job": a job whose `perfModel` is missing is
/// refused at submit; one whose start fails (an environment value with a NUL) is failed
/// with its reason while the other job of the round starts; `status` says why.
#[test]
fn one_bad_job_never_blocks_the_others() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    let missing = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("name: a", "name: nomodel")
        + "perfModel: no-such-model.yaml\n";
    std::fs::write(d.join("nomodel.yaml"), missing).unwrap();
    let (code, _, err) = rr(d, &["submit", "nomodel.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("perfModel") && err.contains("no-such-model.yaml"), "{err}");
    // A NUL in an environment value cannot reach a process: refused at submit.
    let nul = std::fs::read_to_string(d.join("b.yaml"))
        .unwrap()
        .replace("  stopTimeoutS: 10\n", "  stopTimeoutS: 10\n  env: { BAD: \"x\\0y\" }\n");
    std::fs::write(d.join("nul.yaml"), nul).unwrap();
    let (code, _, err) = rr(d, &["submit", "nul.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("env.BAD") && err.contains("control character"), "{err}");
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    // b cannot start: its job directory is taken by a file.
    std::fs::create_dir_all(d.join("state/jobs")).unwrap();
    std::fs::write(d.join("state/jobs/b"), "not a directory").unwrap();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(1), "a negative answer naming the job that could not start: {err}");
    assert!(err.contains("b: failed: could not start"), "{err}");
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("running"), "the other job started: {s:?}");
    assert_eq!(s["jobs"]["b"]["status"].as_str(), Some("failed"), "{s:?}");
    let table = ok(d, &["status"]);
    assert!(table.contains("why: could not start"), "{table}");
    // The next round is not blocked by it.
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    ok(d, &["stop", "a"]);
}

/// Regression, "a schedule for the A800 testbed applied to a fresh state ... `status
/// --state TYPO` creates the directory": a directory that holds no state is an error
/// for every command but `submit` and `apply`, and nothing is created; the cluster of
/// the first `apply --cluster` is remembered, so a later schedule for more GPUs than it
/// has is refused without the flag.
#[test]
fn a_directory_without_a_state_is_an_error_and_nothing_is_created() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    for args in [&["status"][..], &["jobs"], &["stop", "a"], &["delete", "a"]] {
        let (code, _, err) = rr(d, args, None);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("not a rubick-run state"), "{err}");
    }
    assert!(!d.join("state").exists(), "nothing created");
    setup(d, 100_000);
    two_slot_cluster(d);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml", "--cluster", "cluster.yaml"]);
    schedule(d, "r2.yaml", 2, &[("a", "dp1-tp1-pp1-mb4-ga4", &[7])]);
    let (code, _, err) = rr(d, &["apply", "r2.yaml"], None);
    assert_eq!(code, Some(2), "GPU 7 of a 2-GPU node, known from the first apply: {err}");
    // An output inside the state is refused; the state is intact.
    let (code, _, err) = rr(d, &["status", "-o", "state/state.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(state(d)["jobs"]["a"]["status"].as_str(), Some("running"));
    ok(d, &["stop", "a"]);
}

/// Regression, "a symlink planted at jobs/NAME is followed": the job is not started
/// through it, and the file it points at is untouched.
#[test]
fn a_symlink_planted_at_jobs_name_is_never_followed() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    std::fs::create_dir_all(d.join("elsewhere")).unwrap();
    std::fs::create_dir_all(d.join("state/jobs")).unwrap();
    std::os::unix::fs::symlink(d.join("elsewhere"), d.join("state/jobs/a")).unwrap();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("symlink"), "{err}");
    assert_eq!(std::fs::read_dir(d.join("elsewhere")).unwrap().count(), 0, "nothing written through the link");
    assert!(workers(d).is_empty());
}

/// Regression, "a schedule for the A800 testbed applied to a fresh state without
/// `--cluster` started 8 workers on a 2-core machine": without a cluster to check
/// against, the local backend refuses a schedule of more cores than this machine has.
#[test]
fn a_schedule_of_more_cores_than_this_machine_has_is_refused() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) + 1;
    let text = format!(
        "apiVersion: rubick/v1\nkind: Schedule\ncluster: a800-8x8\nround: 0\npolicy: rubick\nassignments:\n  - {{ job: a, plan: dp8-tp1-pp1-mb2-ga1, nodes: [{{ node: a800-0, gpus: [0, 1, 2, 3, 4, 5, 6, 7], cpus: {cores}, hostMemoryGib: 64 }}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 8, gpusTotal: 64, cpusUsed: {cores}, hostMemoryGibUsed: 64, normalizedThroughput: 1 }}\nobjective: 1\nsolver: {{ method: test, status: optimal }}\n"
    );
    std::fs::write(d.join("a800.yaml"), text).unwrap();
    let (code, _, err) = rr(d, &["apply", "a800.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("cores in all") && err.contains("another cluster"), "{err}");
    assert!(workers(d).is_empty() && state(d)["jobs"]["a"]["status"].as_str() == Some("queued"));
}

/// Regression, "`stopTimeoutS: 1e300` panics `stop` after it saved `phase: stopping`, and
/// from then on every rubick-run command on that state panics": such a value is refused
/// at submit, and one already in a state (an older version's) is clamped to a week.
#[test]
fn a_huge_stop_timeout_is_refused_or_clamped_never_a_panic() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    let absurd = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("stopTimeoutS: 10", "stopTimeoutS: 1e300");
    std::fs::write(d.join("absurd.yaml"), absurd).unwrap();
    let (code, _, err) = rr(d, &["submit", "absurd.yaml"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("launch.stopTimeoutS") && err.contains("a week"), "{err}");
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a training", || last_iter(d, "a", 1) >= 2);
    let text = std::fs::read_to_string(d.join("state/state.yaml"))
        .unwrap()
        .replace("stopTimeoutS: 10.0", "stopTimeoutS: 1.0e300");
    assert!(text.contains("1.0e300"), "{text}");
    std::fs::write(d.join("state/state.yaml"), &text).unwrap();
    // The state is input: refused, naming the field, no panic.
    let (code, _, err) = rr(d, &["stop", "a"], None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("stopTimeoutS") && !err.contains("panicked"), "{err}");
    std::fs::write(d.join("state/state.yaml"), text.replace("stopTimeoutS: 1.0e300", "stopTimeoutS: 10.0")).unwrap();
    ok(d, &["stop", "a"]);
    ok(d, &["status"]);
}

/// The state is input. A hand-edited state.yaml whose job key is
/// `../../victim` (a directory outside the state) is refused by every command that
/// reads the state (exit 2, naming the key), and nothing outside is touched: no
/// `delete` of the victim, no run started there. Its cache edited to say the same is
/// never read; `check` refuses a Schedule naming such a job.
#[test]
fn a_hand_edited_state_naming_a_path_outside_is_exit_2_for_every_command() {
    let dir = temp();
    let d = dir.path();
    setup(d, 100);
    two_slot_cluster(d);
    ok(d, &["submit", "a.yaml"]);
    std::fs::create_dir_all(d.join("victim")).unwrap();
    std::fs::write(d.join("victim/keep"), "precious").unwrap();
    let text = std::fs::read_to_string(d.join("state/state.yaml")).unwrap();
    assert!(text.contains("\n  a:\n") && text.contains("name: a\n"), "{text}");
    let edited = text.replace("\n  a:\n", "\n  ../../victim:\n").replace("name: a\n", "name: ../../victim\n");
    std::fs::write(d.join("state/state.yaml"), &edited).unwrap();
    schedule(d, "evil.yaml", 1, &[("../../victim", "dp1-tp1-pp1-mb16-ga1", &[0])]);
    schedule(d, "fine.yaml", 1, &[("a", "dp1-tp1-pp1-mb16-ga1", &[0])]);
    let commands: [&[&str]; 8] = [
        &["submit", "b.yaml"],
        &["jobs"],
        &["apply", "fine.yaml"],
        &["status"],
        &["stop", "../../victim"],
        &["delete", "../../victim"],
        &["logs", "../../victim"],
        &["apply", "evil.yaml"],
    ];
    let check = |what: &str| {
        for args in commands {
            let (code, out, err) = rr(d, args, None);
            assert_eq!(code, Some(2), "{what}: rubick-run {args:?} exit 2: {out}{err}");
            assert!(err.contains("victim"), "{what}: rubick-run {args:?} names the key: {err}");
            assert_eq!(std::fs::read_to_string(d.join("victim/keep")).unwrap(), "precious", "{args:?}");
            assert!(!d.join("victim/attempt-1").exists() && !d.join("victim/checkpoints").exists(), "{args:?}");
            assert!(!d.join("outside").exists(), "{args:?}");
        }
    };
    check("state.yaml edited");
    // The cache, keyed by the original YAML, edited to say the same: not the cache the
    // seal vouches for, so never read (state.yaml is the record): no command knows a
    // job `../../victim`, and nothing outside is touched.
    std::fs::write(d.join("state/state.yaml"), &text).unwrap();
    ok(d, &["status"]);
    let cache = std::fs::read_to_string(d.join("state/state.cache.json")).unwrap();
    let (key, json) = cache.split_once('\n').unwrap();
    let json = json.replace("\"a\":{", "\"../../victim\":{").replace("\"name\":\"a\"", "\"name\":\"../../victim\"");
    std::fs::write(d.join("state/state.cache.json"), format!("{key}\n{json}")).unwrap();
    let status = ok(d, &["status"]);
    assert!(!status.contains("victim") && status.contains("a "), "{status}");
    for args in [&["stop", "../../victim"][..], &["delete", "../../victim"], &["logs", "../../victim"]] {
        let (code, out, err) = rr(d, args, None);
        assert_eq!(code, Some(2), "the cache edited: rubick-run {args:?}: {out}{err}");
        assert_eq!(std::fs::read_to_string(d.join("victim/keep")).unwrap(), "precious", "{args:?}");
    }
    let out = Command::new(binary("rubick-run")).args(["check", "evil.yaml"]).current_dir(d).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "check refuses a schedule naming ../../victim: {err}");
    assert!(err.contains("assignments[0].job"), "{err}");
}
