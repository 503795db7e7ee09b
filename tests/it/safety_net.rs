//! The safety net after every move (issue 42): a plan that runs measurably slower
//! than the plan before it is moved off the round after rubick-run saw it, and never
//! offered again; `status`, the round's `--explain` and the state say so.

use std::path::Path;

use rubick_tests::temp;

use crate::run::{ok, schedule, setup, state, tools_shell, two_slot_cluster, wait_for};

/// Lines of `job`'s run `attempt` that carry an iteration.
fn iterations(dir: &Path, job: &str, attempt: u32) -> usize {
    let path = dir.join(format!("state/jobs/{job}/attempt-{attempt}/metrics.jsonl"));
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.contains("\"iter_time_s\"")).count()
}

/// The README's cron round with the online refit (`jobs --cluster`) and `--explain`:
/// its stderr.
fn round(d: &Path) -> String {
    let script = "\"$RR\" jobs --state state --cluster cluster.yaml \
        | \"$RP\" schedule --cluster cluster.yaml --jobs - --current state/current.yaml --explain \
        | \"$RR\" apply - --state state";
    let (ok, stderr) = tools_shell(d, script);
    assert!(ok, "{stderr}");
    stderr
}

fn plan_of(d: &Path, job: &str) -> String {
    state(d)["jobs"][job]["run"]["plan"].as_str().unwrap_or("-").to_owned()
}

/// A job whose dp2 plan is secretly slow (the stand-in sleeps 3x as long per iteration
/// under DP 2: two workers that fight over the cores). Moved from dp1 to dp2, it is seen
/// slower once dp2 measured its iterations, moved back to dp1 by the next round, and
/// stays there: the refit believes both measurements.
#[test]
fn a_move_to_a_slower_plan_is_undone_the_round_after_it_is_seen() {
    let dir = temp();
    let d = dir.path();
    setup(d, 100_000);
    two_slot_cluster(d);
    let work = std::fs::read_to_string(d.join("work.sh")).unwrap();
    let slow = work.replace("sleep 0.05", "if [ \"$RUBICK_DP\" = 2 ]; then t=0.15; else t=0.05; fi; sleep $t").replace(
        "\\\"iter_time_s\\\":0.05",
        "\\\"iter_time_s\\\":$( [ \"$RUBICK_DP\" = 2 ] && echo 0.15 || echo 0.05 )",
    );
    assert_ne!(slow, work, "the stand-in's speed depends on its plan");
    std::fs::write(d.join("work.sh"), slow).unwrap();
    ok(d, &["submit", "a.yaml"]);
    // Its request, then a move to dp2 (as a round's plan would be).
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("dp1's warm-up and measured iterations", || iterations(d, "a", 1) >= 14);
    schedule(d, "r2.yaml", 2, &[("a", "dp2-tp1-pp1-mb4-ga2", &[0, 1])]);
    // A move the planner chose: a resize of a running job (not a start).
    let r2 = std::fs::read_to_string(d.join("r2.yaml")).unwrap().replace("change: started", "change: resized");
    std::fs::write(d.join("r2.yaml"), r2).unwrap();
    ok(d, &["apply", "r2.yaml"]);
    assert_eq!(plan_of(d, "a"), "dp2-tp1-pp1-mb4-ga2");
    wait_for("dp2's warm-up and measured iterations", || iterations(d, "a", 2) >= 14);
    // Seen by the next look at the state: slower beyond noise, remembered.
    let status = ok(d, &["status"]);
    assert!(
        status.contains("slower: dp2-tp1-pp1-mb4-ga2 0.150 s/iter vs 0.050 s on dp1-tp1-pp1-mb4-ga4: moves back\n"),
        "{status}"
    );
    let slow = &state(d)["jobs"]["a"]["job"]["slowPlans"][0];
    assert_eq!(slow["plan"].as_str(), Some("dp2-tp1-pp1-mb4-ga2"), "{slow:?}");
    assert_eq!(slow["before"].as_str(), Some("dp1-tp1-pp1-mb4-ga4"), "{slow:?}");
    // The next round moves it back, cooldown or not, and says why.
    let explain = round(d);
    assert_eq!(plan_of(d, "a"), "dp1-tp1-pp1-mb4-ga4", "{explain}");
    let line = explain.lines().find(|l| l.starts_with("a: ")).unwrap_or_default();
    assert!(line.contains("moves back: dp2-tp1-pp1-mb4-ga2 ran 0.1500 s per iteration"), "{explain}");
    let status = ok(d, &["status"]);
    assert!(status.contains("moved back for good"), "{status}");
    // A move the planner did not choose (issue 41, 6): counted apart, so the restart
    // factor sees the one move it chose, not the move back.
    let st = state(d);
    let moves = st["jobs"]["a"]["reconfigurations"].as_sequence().cloned().unwrap_or_default();
    assert_eq!(moves.len(), 2, "{st:?}");
    assert_eq!((moves[0]["forced"].as_bool(), moves[1]["forced"].as_bool()), (None, Some(true)), "{moves:?}");
    let batch = ok(d, &["jobs"]);
    assert!(batch.contains("restarts: 1\n"), "{batch}");
    // And stays: the refit knows both runs, dp2 is never offered again.
    wait_for("dp1 again measured", || iterations(d, "a", 3) >= 14);
    for _ in 0..2 {
        let explain = round(d);
        assert!(plan_of(d, "a").starts_with("dp1-"), "{explain}");
    }
    ok(d, &["stop", "a"]);
}
