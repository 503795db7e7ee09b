//! Every process a run starts ends with it: workers in a session of their own,
//! daemons and unmarked helpers, the run wrapper's watchdog.

use std::process::Command;
use std::time::{Duration, Instant};

use rubick_tests::{Reaper, alive, binary, escaping_script, temp};

use super::{last_iter, ok, schedule, setup, start_a, wait_for};

/// Regression, "torchrun's workers start in their own sessions and escape the process
/// group: a stop leaves them running": a process the job started in a session of its
/// own (as torchrun, DeepSpeed and Accelerate start their workers) is found by the
/// run's mark and stopped with the run.
#[test]
fn workers_in_their_own_session_are_stopped_with_their_run() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    let escaper = escaping_script(d);
    let job = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace(
        &format!("command: [sh, {}]", d.join("work.sh").display()),
        &format!("command: [sh, {}]", escaper.display()),
    );
    std::fs::write(d.join("a.yaml"), job).unwrap();
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("the escaped worker", || d.join("escaped.pid").exists() && last_iter(d, "a", 1) >= 2);
    let pid = std::fs::read_to_string(d.join("escaped.pid")).unwrap().trim().to_owned();
    assert!(alive(&pid), "the worker runs in its own session");
    ok(d, &["stop", "a"]);
    wait_for("the escaped worker gone", || !alive(&pid));
}

/// Regression, "every process a run starts is found, signalled and killed, even one that
/// starts its own session or daemonizes": the run wrapper (the hidden subcommand every
/// launcher runs under) ends a `setsid` child, a double-forked daemon and a child that
/// ignores TERM (killed after the grace) once the launcher exited, without any mark in
/// their environment, and records the launcher's exit status.
#[test]
fn the_run_wrapper_leaves_nothing_its_launcher_started_behind() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let script = "setsid sleep 300 & echo $! > setsid.pid\n\
                  (setsid sh -c 'sleep 300 & echo $! > daemon.pid' &)\n\
                  setsid sh -c 'trap \"\" TERM; while :; do sleep 1; done' & echo $! > stubborn.pid\n\
                  while [ ! -s daemon.pid ]; do sleep 0.05; done\nexit 7\n";
    let started = Instant::now();
    let out = Command::new(binary("rubick-run"))
        .arg(rubick_launch::wrap::SUBCOMMAND)
        .args(["--pid-file", "wrapper.pid", "--exit-file", "exit-code", "--grace", "1", "--", "sh", "-c", script])
        .current_dir(d)
        .env_remove("RUBICK_METRICS")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(d.join("exit-code")).unwrap(), "7\n");
    assert!(std::fs::read_to_string(d.join("wrapper.pid")).unwrap().trim().parse::<u32>().is_ok());
    for file in ["setsid.pid", "daemon.pid", "stubborn.pid"] {
        let pid = std::fs::read_to_string(d.join(file)).unwrap().trim().to_owned();
        assert!(!alive(&pid), "{file}: {pid} outlived the wrapper");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "the grace, not a hang: {:?}", started.elapsed());
    // The watchdog: end of file on the wrapper's stdin (its supervisor died) kills the
    // run at once, a helper in a session of its own included.
    let mut watched = Command::new(binary("rubick-run"))
        .arg(rubick_launch::wrap::SUBCOMMAND)
        .args(["--watch-stdin", "--", "sh", "-c", "setsid sleep 300 & echo $! > watched.pid; sleep 300"])
        .current_dir(d)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the watched run's helper", || {
        std::fs::read_to_string(d.join("watched.pid")).is_ok_and(|p| p.ends_with('\n'))
    });
    let helper = std::fs::read_to_string(d.join("watched.pid")).unwrap().trim().to_owned();
    assert!(alive(&helper));
    drop(watched.stdin.take());
    let status = watched.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 9), "the launcher killed: {status:?}");
    assert!(!alive(&helper), "the helper {helper} outlived its supervisor");
    // A command that cannot start: 127, recorded.
    let out = Command::new(binary("rubick-run"))
        .arg(rubick_launch::wrap::SUBCOMMAND)
        .args(["--exit-file", "missing-code", "--", "/nonexistent/launcher"])
        .current_dir(d)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(std::fs::read_to_string(d.join("missing-code")).unwrap(), "127\n");
}

/// A helper started with `env -i` (no mark) under `setsid` (no
/// process group of the run), ignoring TERM, does not survive a stop, whether the
/// launcher ignores the stop signal (killed after stopTimeoutS) or exits at once (within
/// the wrapper's grace).
#[test]
fn unmarked_setsid_helpers_do_not_survive_a_stop() {
    for (case, launcher) in [
        ("the launcher ignores the stop", "trap '' USR1 TERM INT; while :; do sleep 0.1; done"),
        ("the launcher exits at once", "trap 'exit 0' USR1; while :; do sleep 0.1; done"),
    ] {
        let dir = temp();
        let _reaper = Reaper(dir.path().to_path_buf());
        let d = dir.path();
        setup(d, 100_000);
        let pid_file = d.join("helper.pid");
        let script = format!(
            "env -i setsid sh -c 'trap \"\" TERM USR1; echo $$ > {}; while :; do sleep 1; done' &\n\
             echo '{{\"rubick\":1,\"iter\":1,\"iter_time_s\":0.1}}' >> \"$RUBICK_METRICS\"\n{launcher}\n",
            pid_file.display()
        );
        std::fs::write(d.join("work.sh"), script).unwrap();
        let job = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("stopTimeoutS: 10", "stopTimeoutS: 2");
        std::fs::write(d.join("a.yaml"), job).unwrap();
        start_a(d);
        wait_for("the helper", || std::fs::read_to_string(&pid_file).is_ok_and(|t| t.trim().parse::<u32>().is_ok()));
        let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
        assert!(alive(&pid), "{case}: the helper runs");
        ok(d, &["stop", "a"]);
        wait_for(&format!("{case}: the helper gone"), || !alive(&pid));
    }
}
