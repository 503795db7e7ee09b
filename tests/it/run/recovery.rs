//! A `rubick-run` killed (SIGKILL) at every phase of an apply or a stop, a start
//! it never recorded, a state that lost a run's record, a full disk: the next command
//! repairs each, and no run is orphaned or doubled.

use std::path::Path;
use std::time::Duration;

use rubick_tests::{Held, Need, Reaper, SlurmShape, slurm_nodes, temp};

use super::{SmallDisk, first_iter, last_iter, ok, rr, schedule, setup, start_a, state, wait_for, workers};

#[test]
fn an_apply_killed_at_any_phase_of_a_reconfiguration_is_repaired_by_the_next() {
    kill_matrix("local");
}

#[test]
fn the_kill_matrix_holds_on_the_real_slurm_too() {
    // DP 2 on one node's two GPUs.
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 2 }, Held::Shared) else { return };
    kill_matrix("slurm");
}

/// `rubick-run apply` killed with SIGKILL at each phase of a reconfiguration on
/// `backend`; the next apply must converge: one run at the new plan, resumed.
fn kill_matrix(backend: &str) {
    for point in [
        "locked",
        "stop-recorded",
        "stop-signalled",
        "stopped",
        "start-intended",
        "start-recorded",
        "spawned",
        "applied",
    ] {
        let dir = temp();
        let _reaper = Reaper(dir.path().to_path_buf());
        let _reaper = Reaper(dir.path().to_path_buf());
        let d = dir.path();
        setup(d, 100_000);
        ok(d, &["submit", "a.yaml"]);
        schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
        ok(d, &["apply", "r1.yaml", "--backend", backend]);
        wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
        schedule(d, "r2.yaml", 2, &[("a", "dp2-tp1-pp1-mb4-ga2", &[0, 1])]);
        let (code, _, err) = rr(d, &["apply", "r2.yaml", "--backend", backend], Some(point));
        assert_eq!(code, None, "{point}: killed by a signal: {err}");
        // The next round converges: one run of a, at DP 2, nothing else alive.
        let (code, _, err) = rr(d, &["apply", "r2.yaml", "--backend", backend], None);
        assert_eq!(code, Some(0), "{point}: {err}");
        let s = state(d);
        assert_eq!(s["jobs"]["a"]["run"]["plan"].as_str(), Some("dp2-tp1-pp1-mb4-ga2"), "{point}");
        let attempt = s["jobs"]["a"]["run"]["attempt"].as_u64().unwrap();
        wait_for("a's new run", || first_iter(d, "a", attempt).is_some());
        std::thread::sleep(Duration::from_millis(300));
        wait_for("the old run gone", || workers(d).len() <= 1);
        assert_eq!(workers(d).len(), 1, "{point}: exactly one run of a: {:?}", workers(d));
        assert!(first_iter(d, "a", attempt).unwrap() > 1, "{point}: resumed, not restarted from zero");
        // Idempotent from here.
        ok(d, &["apply", "r2.yaml", "--backend", backend]);
        assert_eq!(state(d)["jobs"]["a"]["run"]["attempt"].as_u64(), Some(attempt), "{point}");
        ok(d, &["stop", "a"]);
        wait_for("no process left", || workers(d).is_empty());
    }
}

/// A rubick-run killed after it launched a run and before it recorded the run's handle,
/// the run's wrapper not having written its process group yet (a loaded machine): the
/// next command cannot find the run from its directory and queues the job again, but the
/// round's intent of starts (`state/starting`) is there, so it searches the processes and
/// stops the run no record holds. The next start is then the only copy, never a second
/// one on the same checkpoints; and once a round's starts are recorded, no intent is
/// left (a no-op round searches nothing).
#[test]
fn an_interrupted_start_is_searched_for_and_never_left_running_beside_a_new_one() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], Some("spawned"));
    assert_eq!(code, None, "killed by a signal: {err}");
    wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
    assert!(d.join("state/starting").exists(), "the intent outlives the killed apply");
    // As if the wrapper had not yet recorded its group when the next command looked.
    std::fs::remove_file(d.join("state/jobs/a/attempt-1/pgid")).unwrap();
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("without a record"), "the run the records lost is found and named: {err}");
    assert!(!d.join("state/starting").exists(), "searched: the intent is gone");
    let attempt = state(d)["jobs"]["a"]["run"]["attempt"].as_u64().unwrap();
    assert_eq!(attempt, 2, "started again, as a new attempt");
    wait_for("a's new run", || first_iter(d, "a", attempt).is_some());
    wait_for("the lost run gone", || workers(d).len() <= 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(workers(d).len(), 1, "exactly one run of a: {:?}", workers(d));
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("without a record") && !d.join("state/starting").exists(), "{err}");
    ok(d, &["stop", "a"]);
    wait_for("no process left", || workers(d).is_empty());
}

/// A `rubick-run stop` killed (SIGKILL) after it recorded its intent,
/// after it signalled the run, or after the run stopped stays a stop: the next command
/// finishes it, the job is `stopped` (not queued), no round lists or starts it again,
/// and no process of it is left.
#[test]
fn a_killed_stop_stays_a_stop() {
    for point in ["stop-recorded", "stop-signalled", "stopped"] {
        let dir = temp();
        let _reaper = Reaper(dir.path().to_path_buf());
        let d = dir.path();
        setup(d, 100_000);
        start_a(d);
        wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
        let (code, _, err) = rr(d, &["stop", "a"], Some(point));
        assert_eq!(code, None, "{point}: killed by a signal: {err}");
        let status = ok(d, &["status"]);
        assert_eq!(state(d)["jobs"]["a"]["status"].as_str(), Some("stopped"), "{point}: {status}");
        assert!(!ok(d, &["jobs"]).contains("name: a"), "{point}: a stopped job is in no round");
        ok(d, &["apply", "r1.yaml"]);
        let s = state(d);
        assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("stopped"), "{point}: not started again");
        assert!(s["jobs"]["a"]["run"].is_null(), "{point}: {s:?}");
        assert_eq!(s["jobs"]["a"]["attempts"].as_u64(), Some(1), "{point}");
        wait_for("no process left", || workers(d).is_empty());
    }
}

/// A state that lost a live run's record (restored from a backup taken
/// before the run started): the run is found by its mark and stopped by the next
/// command, so `stop` reaches it, and a new start (the job queued again) is one run, not
/// a second copy on the same checkpoints.
#[test]
fn a_run_whose_record_was_lost_is_found_by_its_mark_never_orphaned_or_doubled() {
    // `a` running, then its state restored from a backup taken before it started.
    let restored = |d: &Path| {
        setup(d, 100_000);
        ok(d, &["submit", "a.yaml"]);
        let backup = std::fs::read_to_string(d.join("state/state.yaml")).unwrap();
        schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
        ok(d, &["apply", "r1.yaml"]);
        wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
        assert_eq!(workers(d).len(), 1);
        std::fs::write(d.join("state/state.yaml"), &backup).unwrap();
        let _ = std::fs::remove_file(d.join("state/state.cache.json"));
    };
    // `stop`: the unrecorded run stopped, nothing left.
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    restored(d);
    let (code, _, err) = rr(d, &["stop", "a"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("without a record"), "the unrecorded run is named: {err}");
    wait_for("the unrecorded run stopped", || workers(d).is_empty());
    // A start: one run of a, never two.
    let dir = temp();
    let _reaper2 = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    restored(d);
    let (code, _, err) = rr(d, &["apply", "r1.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("without a record"), "{err}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(workers(d).len(), 1, "one run of a, not a second copy: {:?}", workers(d));
    ok(d, &["stop", "a"]);
    wait_for("no process left", || workers(d).is_empty());
}

/// A run fills the disk its state lives on. Its `stop` still stops it
/// (exit 2: the state cannot be written, and says so), the wrapper's exit status is
/// recorded in the space reserved at the start, no empty temporary file is left in the
/// run's directory, and once there is room again the next command records the job as
/// stopped with no retry spent.
#[test]
fn a_full_disk_loses_no_stop_and_no_exit_status() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    let disk = match SmallDisk::mount(&d.join("state"), "2m") {
        Ok(disk) => disk,
        Err(why) => {
            return rubick_testkit::missing(Need::Root, &format!("a small tmpfs: {why}"));
        }
    };
    let script = "echo '{\"rubick\":1,\"iter\":1,\"iter_time_s\":0.1}' >> \"$RUBICK_METRICS\"\n\
                  dd if=/dev/zero of=\"$RUBICK_CHECKPOINT_DIR/fill\" bs=64k 2>/dev/null\n\
                  touch \"$RUBICK_CHECKPOINT_DIR/full\"\n\
                  trap 'exit 0' USR1\nwhile :; do sleep 0.1; done\n";
    std::fs::write(d.join("work.sh"), script).unwrap();
    start_a(d);
    let ckpt = d.join("state/jobs/a/checkpoints");
    wait_for("the disk full", || ckpt.join("full").exists());
    let retries = state(d)["jobs"]["a"]["retriesLeft"].as_u64();
    let (code, _, err) = rr(d, &["stop", "a"], None);
    assert_eq!(code, Some(2), "the state cannot be written: {err}");
    assert!(err.contains("the runs stopped"), "{err}");
    wait_for("no process left", || workers(d).is_empty());
    let attempt = d.join("state/jobs/a/attempt-1");
    assert_eq!(std::fs::read_to_string(attempt.join("exit-code")).unwrap().trim(), "0", "the exit status kept");
    let empty: Vec<_> = std::fs::read_dir(&attempt)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("tmp") && e.metadata().is_ok_and(|m| m.len() == 0))
        .map(|e| e.file_name())
        .collect();
    assert!(empty.is_empty(), "empty temporary files left: {empty:?}");
    std::fs::remove_file(ckpt.join("fill")).unwrap();
    ok(d, &["status"]);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("stopped"), "{s:?}");
    assert_eq!(s["jobs"]["a"]["retriesLeft"].as_u64(), retries, "no retry spent");
    assert!(!ok(d, &["jobs"]).contains("name: a"));
    drop(disk);
}
