//! What the disk says is checked before it is acted on: a state's run handles, its
//! cache, the path it is reached through, a run's exit short of its iterations, and a
//! stop on a full disk. Each test quotes the adversarial pass (issue 40) that found
//! the behaviour it guards; each runs the real `rubick-run` on the local backend with
//! the stand-in workload of `run.rs`, beside a live decoy process that must survive.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use rubick_tests::{Need, Reaper, alive, binary, temp};

use crate::run::{SmallDisk, first_iter, last_iter, ok, rr, schedule, setup, start_a, state, wait_for, workers};

/// A process that is not rubick-run's: a `sleep` in a session (and process group) of its
/// own, carrying the mark of a run directory outside any state. Killed when dropped.
pub(crate) struct Decoy(Child);

impl Decoy {
    pub(crate) fn start(mark_dir: &Path) -> Decoy {
        std::fs::create_dir_all(mark_dir).unwrap();
        let child = Command::new("sleep")
            .arg("600")
            .env("RUBICK_METRICS", mark_dir.join("metrics.jsonl"))
            .process_group(0)
            .spawn()
            .expect("sleep starts");
        Decoy(child)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    pub(crate) fn alive(&self) -> bool {
        alive(&self.pid().to_string())
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A temporary directory, and the reaper of whatever runs under it once the test ends.
fn scratch() -> (tempfile::TempDir, Reaper) {
    let dir = temp();
    let reaper = Reaper(dir.path().to_path_buf());
    (dir, reaper)
}

/// `a` (the stand-in of `run.rs`, [`setup`]) started and iterating in `d`.
fn a_running(d: &Path) {
    setup(d, 100_000);
    start_a(d);
    wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
}

/// `a` stopped for good, and none of its processes left.
fn stop_a(d: &Path) {
    ok(d, &["stop", "a"]);
    wait_for("no process left", || workers(d).is_empty());
}

/// `state.yaml` of `d` with `from` replaced by `to` (the cache and seal left as they are).
fn edit_state(d: &Path, from: &str, to: &str) {
    let path = d.join("state/state.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from:?} in {text}");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// Found by an adversarial pass (issue 40, 1): "`State::validate` does not check
/// `run.handle`. A plain number is taken as an older state's process-group id and
/// `stop` (or a preempting `apply`) calls `kill(-pgid)`: `handle: 'V'` (V a foreign
/// `setsid sleep`'s group): `rubick-run stop a` prints 'a: stopped in 0.1 s' and the
/// unrelated process dies; [...] `handle: 'PGID@<another state>/jobs/a/attempt-1'`
/// stops another state's run, which that state then records `finished`". (`'1'`,
/// `kill(-1)`, is refused by the unit tests of the state: run here, the bug it guards
/// would kill the test harness.) Also (6): "`attempts: 4294967295` passes validation".
#[test]
fn a_handle_that_names_anything_but_its_own_run_signals_nothing() {
    let (dir, _reaper) = scratch();
    let d = dir.path();
    let decoy = Decoy::start(&d.join("elsewhere"));
    // Another state with a run of its own `a`.
    let other = d.join("other");
    std::fs::create_dir_all(&other).unwrap();
    a_running(&other);
    a_running(d);
    let handle = state(d)["jobs"]["a"]["run"]["handle"].as_str().unwrap().to_owned();
    let other_handle = state(&other)["jobs"]["a"]["run"]["handle"].as_str().unwrap().to_owned();
    let original = std::fs::read_to_string(d.join("state/state.yaml")).unwrap();
    let bad = [
        ("run.handle", format!("'{}'", decoy.pid())),
        ("run.handle", format!("'{}@{}'", decoy.pid(), d.join("elsewhere").display())),
        ("run.handle", format!("'{other_handle}'")),
        ("attempts", "4294967295".to_owned()),
    ];
    for (field, value) in &bad {
        if *field == "attempts" {
            edit_state(d, "attempts: 1", &format!("attempts: {value}"));
        } else {
            edit_state(d, &format!("handle: {handle}"), &format!("handle: {value}"));
        }
        for args in [&["stop", "a"][..], &["status"], &["apply", "r1.yaml"], &["delete", "a"]] {
            let (code, out, err) = rr(d, args, None);
            assert_eq!(code, Some(2), "{field} {value}: rubick-run {args:?}: {out}{err}");
            assert!(err.contains(field), "{field} {value}: the field is named: {err}");
            assert!(decoy.alive(), "{field} {value}: rubick-run {args:?} signalled the decoy");
            assert_eq!(workers(&other).len(), 1, "{field} {value}: rubick-run {args:?} stopped another state's run");
            assert_eq!(workers(d).len(), 1, "{field} {value}: nothing was done");
        }
        std::fs::write(d.join("state/state.yaml"), &original).unwrap();
    }
    ok(d, &["stop", "a"]);
    ok(&other, &["stop", "a"]);
    wait_for("no process left", || workers(d).is_empty() && workers(&other).is_empty());
    assert!(decoy.alive());
    assert_eq!(state(&other)["jobs"]["a"]["status"].as_str(), Some("stopped"));
}

/// Found by an adversarial pass (issue 40, 2): "the seal compares only state.yaml's
/// identity, so a `state.cache.json` edited under its unchanged first line (run removed,
/// status queued) is trusted and the search for unrecorded runs is skipped: `stop`
/// reaches nothing, `delete` orphans the wrapper and its child".
#[test]
fn an_edited_cache_never_hides_a_live_run() {
    let (dir, _reaper) = scratch();
    let d = dir.path();
    a_running(d);
    ok(d, &["status"]);
    let cache = d.join("state/state.cache.json");
    let text = std::fs::read_to_string(&cache).unwrap();
    let (key, json) = text.split_once('\n').unwrap();
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap();
    let a = &mut value["jobs"]["a"];
    a.as_object_mut().unwrap().remove("run");
    a["status"] = "queued".into();
    std::fs::write(&cache, format!("{key}\n{value}")).unwrap();
    // Believed, the cache would make this a stop of a queued job that reaches nothing.
    ok(d, &["stop", "a"]);
    wait_for("a's run stopped", || workers(d).is_empty());
    assert_eq!(state(d)["jobs"]["a"]["status"].as_str(), Some("stopped"));
    assert!(state(d)["jobs"]["a"]["run"].is_null());
}

/// Found by an adversarial pass (issue 40, 3): "marks hold the path as typed
/// (`std::path::absolute` keeps symlinks and `..`). Restore an older state.yaml, then
/// `apply --state stlink` (a symlink to the state): a second run of the job starts
/// beside the first, both writing `jobs/a/checkpoints`".
#[test]
fn the_same_state_through_another_path_never_starts_a_second_copy() {
    let (dir, _reaper) = scratch();
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml"]);
    let backup = std::fs::read_to_string(d.join("state/state.yaml")).unwrap();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a iterating", || last_iter(d, "a", 1) >= 2);
    std::fs::write(d.join("state/state.yaml"), &backup).unwrap();
    std::os::unix::fs::symlink(d.join("state"), d.join("stlink")).unwrap();
    for state_path in ["stlink", "stlink/../state"] {
        let out = Command::new(binary("rubick-run"))
            .args(["apply", "r1.yaml", "--state", state_path])
            .current_dir(d)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{state_path}: {err}");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(workers(d).len(), 1, "{state_path}: one run of a, not a second copy: {:?}\n{err}", workers(d));
    }
    stop_a(d);
}

/// Found by an adversarial pass (issue 40, 4): "a run that checkpoints and exits 0
/// after a signal rubick-run did not send (a user's `kill -USR1`, a torchtitan rank's
/// SIGTERM at shutdown) is recorded `finished` at 11 of 100000 iterations and never
/// scheduled again".
#[test]
fn a_run_stopped_by_someone_else_is_resumed_not_finished() {
    let (dir, _reaper) = scratch();
    let d = dir.path();
    setup(d, 100_000);
    start_a(d);
    wait_for("a iterating", || last_iter(d, "a", 1) >= 3);
    let worker = workers(d)[0].split_whitespace().next().unwrap().to_owned();
    assert!(Command::new("kill").args(["-s", "USR1", &worker]).status().unwrap().success());
    wait_for("a's run ended", || d.join("state/jobs/a/attempt-1/exit-code").exists());
    let table = ok(d, &["status"]);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("queued"), "{table}\n{s:?}");
    let reason = s["jobs"]["a"]["reason"].as_str().unwrap();
    assert!(reason.contains("someone else") && reason.contains("of 100000"), "{reason}");
    assert_eq!(s["jobs"]["a"]["retriesLeft"].as_u64(), Some(3), "a stop spends no retry");
    assert!(ok(d, &["jobs"]).contains("name: a"), "the next round schedules it");
    // The next round resumes it from its checkpoint.
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a iterating again", || last_iter(d, "a", 2) >= 1);
    assert!(first_iter(d, "a", 2).unwrap() > 1, "resumed, not restarted from zero");
    stop_a(d);
}

/// Found by an adversarial pass (issue 40, 5): "Full disk: with a second run's end
/// waiting to be recorded, `stop` fails on the state write (ENOSPC) before it signals;
/// the run keeps running".
#[test]
fn a_full_disk_never_holds_a_stop_back() {
    let (dir, _reaper) = scratch();
    let d = dir.path();
    setup(d, 100_000);
    let disk = match SmallDisk::mount(&d.join("state"), "2m") {
        Ok(disk) => disk,
        Err(why) => return rubick_testkit::missing(Need::Root, &format!("a small tmpfs: {why}")),
    };
    // `a` fills the disk once `b` runs (its wrapper has reserved the bytes of its exit
    // status); `b` ends once the disk is full, so that recording it is a state write that
    // fails. The two meet through files outside the small disk.
    let up = d.join("b-up").display().to_string();
    let full = d.join("full").display().to_string();
    let a = format!(
        "echo '{{\"rubick\":1,\"iter\":1,\"iter_time_s\":0.1}}' >> \"$RUBICK_METRICS\"\n\
         while [ ! -e {up} ]; do sleep 0.1; done\n\
         dd if=/dev/zero of=\"$RUBICK_CHECKPOINT_DIR/fill\" bs=64k 2>/dev/null\n\
         touch {full}\n\
         trap 'exit 0' USR1\nwhile :; do sleep 0.1; done\n"
    );
    let b = format!("touch {up}\nwhile [ ! -e {full} ]; do sleep 0.1; done\nexit 1\n");
    std::fs::write(d.join("work.sh"), a).unwrap();
    std::fs::write(d.join("b.sh"), b).unwrap();
    let job_b = std::fs::read_to_string(d.join("b.yaml")).unwrap().replace("work.sh", "b.sh");
    std::fs::write(d.join("b.yaml"), job_b).unwrap();
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("the disk full", || d.join("full").exists());
    wait_for("b ended", || d.join("state/jobs/b/attempt-1/exit-code").exists());
    let (code, _, err) = rr(d, &["stop", "a"], None);
    assert_eq!(code, Some(2), "the state cannot be written: {err}");
    wait_for("a's run stopped all the same", || workers(d).is_empty());
    std::fs::remove_file(d.join("state/jobs/a/checkpoints/fill")).unwrap();
    ok(d, &["status"]);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("stopped"), "{s:?}");
    assert_eq!(s["jobs"]["b"]["status"].as_str(), Some("queued"), "b's end recorded (a retry spent): {s:?}");
    drop(disk);
}
