//! Rounds of `apply` on the local backend (and the same on a real Slurm): jobs
//! started, reconfigured from their checkpoints and preempted; several stopped at once;
//! a finished or crashed job; two rounds at once; the cron loop of the README run
//! unattended.

use std::time::{Duration, Instant};

use rubick_tests::{Held, Reaper, SlurmShape, slurm_nodes, temp};

use super::{
    WORKLOAD, cron_round, first_iter, last_iter, ok, rr, schedule, setup, state, third_job, two_slot_cluster, wait_for,
    workers,
};

#[test]
fn rounds_start_reconfigure_and_preempt_and_a_resumed_job_continues() {
    rounds("local");
}

#[test]
fn the_same_rounds_run_through_a_real_slurm() {
    // DP 2 on one node's two GPUs.
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 2 }, Held::Shared) else { return };
    rounds("slurm");
}

/// Three rounds on `backend`: start two jobs; reconfigure one to DP 2 (it resumes from
/// its checkpoint) and preempt the other; stop both; nothing left running.
fn rounds(backend: &str) {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    ok(d, &["apply", "r1.yaml", "--backend", backend]);
    // a's first run measured past its 3 warm-up iterations, so the refit below has two
    // runs to fit on (a run stopped inside its warm-up measures nothing).
    wait_for("both jobs iterating", || last_iter(d, "a", 1) >= 6 && last_iter(d, "b", 1) >= 3);
    let cores = |job: &str| std::fs::read_to_string(d.join(format!("state/jobs/{job}/cores"))).unwrap_or_default();
    if backend == "local" && std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        // One core each (the schedule's cpus), and not the same one.
        assert_eq!((cores("a").trim(), cores("b").trim()), ("0", "1"));
    }
    // The same schedule again: nothing changes.
    ok(d, &["apply", "r1.yaml", "--backend", backend]);
    assert_eq!(state(d)["jobs"]["a"]["attempts"].as_u64(), Some(1));
    // Round 2: a to DP 2 on GPUs 0 and 1, b preempted.
    schedule(d, "r2.yaml", 2, &[("a", "dp2-tp1-pp1-mb4-ga2", &[0, 1])]);
    let (code, _, err) = rr(d, &["apply", "r2.yaml", "--backend", backend], None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("a: stopped (to reconfigure)") && err.contains("b: stopped (preempted)"), "{err}");
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["run"]["plan"].as_str(), Some("dp2-tp1-pp1-mb4-ga2"));
    assert_eq!(s["jobs"]["b"]["status"].as_str(), Some("queued"));
    let stopped_at = s["jobs"]["a"]["reconfigurations"][0]["checkpointedIter"].as_u64().unwrap();
    wait_for("a's second run", || first_iter(d, "a", 2).is_some());
    assert_eq!(first_iter(d, "a", 2), Some(stopped_at + 1), "resumed from its checkpoint, not from zero");
    let where_ = || std::fs::read_to_string(d.join("state/jobs/a/where")).unwrap_or_default();
    wait_for("a's second run to say where it runs", || where_().starts_with("2 "));
    let placed = where_();
    if backend == "local" {
        assert_eq!(placed.trim(), "2 0,1");
    } else {
        // Slurm picks the GPUs itself: two of them.
        assert!(
            placed.starts_with("2 ") && placed.trim().split_once(' ').is_some_and(|(_, g)| g.split(',').count() == 2),
            "{placed}"
        );
    }
    // The batch for the next round: a running on 2 GPUs, b queued, iterations left.
    let batch = ok(d, &["jobs"]);
    assert!(
        batch.contains("kind: JobBatch") && batch.contains("current:") && batch.contains("restartCostS"),
        "{batch}"
    );
    // With the cluster, a's model is refitted on its two runs' measurements.
    std::fs::write(
        d.join("cluster.yaml"),
        "apiVersion: rubick/v1\nkind: Cluster\nname: box\nnodeGroups:\n  - { name: local, count: 1, gpuType: cpu, gpusPerNode: 4, gpuMemoryGib: 8, cpuCores: 2, hostMemoryGib: 16, nvlinkGBps: 5, interNodeGBps: 1.25, pcieGBps: 5 }\n",
    )
    .unwrap();
    wait_for("a's second run measured", || last_iter(d, "a", 2) >= stopped_at + 5);
    let (code, batch, err) = rr(d, &["jobs", "--cluster", "cluster.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    let model = d.join("state/jobs/a/model.yaml");
    assert!(batch.contains(&format!("perfModel: {}", model.display())), "{batch}\n{err}");
    let profile = std::fs::read_to_string(d.join("state/jobs/a/profile.csv")).unwrap();
    assert_eq!(profile.lines().count(), 3, "a header and one row per run: {profile}");
    assert!(std::fs::read_to_string(&model).unwrap().contains("kind: PerfModel"));
    // The reconfiguration's phases: the stop, then the relaunch to the first iteration.
    let r = &state(d)["jobs"]["a"]["reconfigurations"][0];
    assert!(r["stopS"].as_f64().is_some_and(|s| s > 0.0), "{r:?}");
    assert!(r["firstIterationS"].as_f64().is_some_and(|s| (0.0..30.0).contains(&s)), "{r:?}");
    // Status in every format.
    let table = ok(d, &["status"]);
    assert!(table.lines().any(|l| l.starts_with("a ") && l.contains("running")), "{table}");
    assert!(table.lines().all(|l| l.chars().count() <= 100), "the table fits 100 columns: {table}");
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ok(d, &["status", "--format", "yaml"])).unwrap();
    assert!(yaml["jobs"]["a"]["predictedIterTimeS"].as_f64().is_some(), "predicted, from the applied round: {yaml:?}");
    let prom = ok(d, &["status", "--format", "prometheus"]);
    // Prometheus, where every series once carried a plan label: the plan is an info
    // metric; every other series is keyed by the job only; no `-0`.
    assert!(prom.contains("rubick_job_info{job=\"a\",plan=\"dp2-tp1-pp1-mb4-ga2\"} 1"), "{prom}");
    assert!(prom.contains("rubick_job_running{job=\"a\"} 1"), "{prom}");
    assert!(prom.contains("rubick_job_predicted_samples_per_second{job=\"a\"} 1"), "{prom}");
    assert!(prom.contains("rubick_job_status{job=\"b\",status=\"queued\"} 1"), "{prom}");
    assert!(prom.contains("# TYPE rubick_job_retries_left gauge"), "{prom}");
    assert!(
        prom.lines().filter(|l| !l.starts_with('#') && !l.starts_with("rubick_job_info")).all(|l| !l.contains("plan=")),
        "{prom}"
    );
    assert!(!prom.contains(" -0\n"), "{prom}");
    assert!(prom.contains("# TYPE rubick_job_queue_seconds gauge"), "{prom}");
    // Round 3: nothing scheduled; both stopped; no process left.
    schedule(d, "r3.yaml", 3, &[]);
    ok(d, &["apply", "r3.yaml", "--backend", backend]);
    wait_for("no process left", || workers(d).is_empty());
    ok(d, &["stop", "b"]);
    assert_eq!(state(d)["jobs"]["b"]["status"].as_str(), Some("stopped"));
}

/// Concurrent reconfiguration: one apply asks every run it stops at once and
/// waits for them together. Two jobs whose checkpoint takes 2 s each (one per core of
/// a 2-core machine): both were signalled before either finished its checkpoint (one
/// after another, the second would be signalled after the first's 2 s).
#[test]
fn an_apply_stops_its_runs_together_not_one_after_another() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    // The stand-in, with a slow checkpoint that says when it began and ended.
    let slow = WORKLOAD.replace(
        "  if [ \"$stop\" = 1 ]; then\n",
        "  if [ \"$stop\" = 1 ]; then\n    date +%s.%N > \"$RUBICK_CHECKPOINT_DIR/../signalled\"; sleep 2\n    date +%s.%N > \"$RUBICK_CHECKPOINT_DIR/../saved\"\n",
    );
    assert_ne!(slow, WORKLOAD);
    std::fs::write(d.join("work.sh"), slow).unwrap();
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    let jobs = ["a", "b"];
    let gpus: [&[u32]; 2] = [&[0], &[1]];
    let at = |plan| jobs.iter().zip(gpus).map(|(j, g)| (*j, plan, g)).collect::<Vec<_>>();
    schedule(d, "r1.yaml", 1, &at("dp1-tp1-pp1-mb4-ga4"));
    ok(d, &["apply", "r1.yaml"]);
    wait_for("both jobs iterating", || jobs.iter().all(|j| last_iter(d, j, 1) >= 2));
    schedule(d, "r2.yaml", 2, &at("dp1-tp1-pp1-mb2-ga8"));
    let (code, _, err) = rr(d, &["apply", "r2.yaml"], None);
    assert_eq!(code, Some(0), "{err}");
    let time = |job: &str, what: &str| -> f64 {
        let text = std::fs::read_to_string(d.join(format!("state/jobs/{job}/{what}"))).unwrap_or_default();
        text.trim().parse().unwrap_or_else(|_| panic!("{job}/{what}: {text:?}\n{err}"))
    };
    let last_signalled = jobs.iter().map(|j| time(j, "signalled")).fold(f64::MIN, f64::max);
    let first_saved = jobs.iter().map(|j| time(j, "saved")).fold(f64::MAX, f64::min);
    assert!(
        last_signalled < first_saved,
        "a stop waited for another: signalled by {last_signalled}, one saved at {first_saved}\n{err}"
    );
    for job in jobs {
        assert!(err.contains(&format!("{job}: stopped (to reconfigure)")), "{err}");
        wait_for("the relaunch", || first_iter(d, job, 2).is_some());
    }
    schedule(d, "r3.yaml", 3, &[]);
    ok(d, &["apply", "r3.yaml"]);
    wait_for("no process left", || workers(d).is_empty());
}

#[test]
fn a_finished_job_is_recorded_and_not_started_again() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 5);
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
    wait_for("a to finish", || d.join("state/jobs/a/attempt-1/exit-code").exists());
    ok(d, &["apply", "r1.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("finished"));
    assert_eq!(s["jobs"]["a"]["attempts"].as_u64(), Some(1));
    assert!(!ok(d, &["jobs"]).contains("name: a"));
}

#[test]
fn a_second_round_at_the_same_time_waits_then_does_nothing() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml"]);
    let lock = std::fs::File::options().write(true).open(d.join("state/lock")).unwrap();
    lock.lock().unwrap();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let (code, _, err) = rr(d, &["apply", "r1.yaml", "--lock-wait", "0.5"], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("another rubick-run holds it"), "{err}");
    assert!(!d.join("state/jobs").exists());
    lock.unlock().unwrap();
    ok(d, &["apply", "r1.yaml"]);
    ok(d, &["stop", "a"]);
}

#[test]
fn the_cron_loop_runs_rounds_unattended_until_every_job_finished() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 40);
    // A third job, and a cluster of 2 worker slots: three jobs must share them.
    third_job(d);
    two_slot_cluster(d);
    ok(d, &["submit", "a.yaml", "b.yaml", "c.yaml"]);
    let round = || cron_round(d, "");
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let s = state(d);
        let statuses: Vec<&str> =
            ["a", "b", "c"].iter().map(|j| s["jobs"][*j]["status"].as_str().unwrap_or("")).collect();
        if statuses.iter().all(|x| *x == "finished") {
            break;
        }
        assert!(Instant::now() < deadline, "not finished: {statuses:?}\n{log}");
        let (success, err) = round();
        log.push_str(&err);
        assert!(success, "a round failed: {err}");
        std::thread::sleep(Duration::from_millis(700));
    }
    let s = state(d);
    for job in ["a", "b", "c"] {
        assert!(s["jobs"][job]["iterationsDone"].as_u64().unwrap() >= 40, "{job}: {s:?}");
    }
    assert!(log.contains("started"), "{log}");
    assert!(workers(d).is_empty(), "{:?}", workers(d));
}

#[test]
fn a_crashed_job_is_retried_within_its_budget_and_a_refused_plan_is_never_offered_again() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    // A job that crashes (exit 9) at once, and one whose arguments are bad (exit 2).
    for (name, code) in [("crash", 9), ("bad", 2)] {
        let job =
            std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("name: a", &format!("name: {name}")).replace(
                &format!("command: [sh, {}]", d.join("work.sh").display()),
                &format!("command: [sh, -c, \"exit {code}\"]"),
            );
        std::fs::write(d.join(format!("{name}.yaml")), job).unwrap();
    }
    ok(d, &["submit", "crash.yaml", "bad.yaml", "--retries", "1"]);
    schedule(d, "r.yaml", 1, &[("crash", "dp1-tp1-pp1-mb4-ga4", &[0]), ("bad", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    ok(d, &["apply", "r.yaml"]);
    wait_for("both exited", || {
        d.join("state/jobs/crash/attempt-1/exit-code").exists() && d.join("state/jobs/bad/attempt-1/exit-code").exists()
    });
    ok(d, &["apply", "r.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["bad"]["status"].as_str(), Some("queued"), "exit 2 refuses the plan, not the job: {s:?}");
    assert_eq!(s["jobs"]["bad"]["attempts"].as_u64(), Some(1), "the refused plan is not started again: {s:?}");
    assert_eq!(s["jobs"]["bad"]["job"]["unsupportedPlans"][0].as_str(), Some("dp1-tp1-pp1-mb4-ga4"), "{s:?}");
    let batch = ok(d, &["jobs"]);
    assert!(batch.contains("unsupportedPlans:") && batch.contains("dp1-tp1-pp1-mb4-ga4"), "{batch}");
    assert_eq!(s["jobs"]["crash"]["status"].as_str(), Some("running"), "retried once: {s:?}");
    assert_eq!(s["jobs"]["crash"]["attempts"].as_u64(), Some(2));
    wait_for("the retry exited", || d.join("state/jobs/crash/attempt-2/exit-code").exists());
    ok(d, &["apply", "r.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["crash"]["status"].as_str(), Some("failed"), "budget spent: {s:?}");
    assert_eq!(s["jobs"]["crash"]["exitCode"].as_i64(), Some(9));
    // Regression, "the status table shows `queued` for a failed or requeued job with no
    // exit code, reason or log path": it says why, in the table and in YAML.
    let table = ok(d, &["status"]);
    let mut after = table.lines().skip_while(|l| !l.starts_with("crash ")).skip(1);
    let (why, log) = (after.next().unwrap_or_default(), after.next().unwrap_or_default());
    assert!(why.contains("why: exit 9") && why.contains("no retries left"), "{table}");
    assert!(log.starts_with("  log: ") && log.ends_with("attempt-2/log.txt"), "{table}");
    assert!(!table.contains("Some("), "{table}");
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(&ok(d, &["status", "--format", "yaml"])).unwrap();
    assert!(yaml["jobs"]["crash"]["reason"].as_str().is_some_and(|r| r.contains("exit 9")), "{yaml:?}");
    assert!(yaml["jobs"]["crash"]["log"].as_str().is_some_and(|l| l.ends_with("log.txt")), "{yaml:?}");
    // Two more plans refused: three in all is a bad argument, not a bad plan.
    for (attempt, plan) in [(2, "dp1-tp1-pp1-mb8-ga2"), (3, "dp1-tp1-pp1-mb16-ga1")] {
        schedule(d, "r.yaml", 2 + attempt, &[("bad", plan, &[1])]);
        ok(d, &["apply", "r.yaml"]);
        wait_for("the plan refused", || d.join(format!("state/jobs/bad/attempt-{attempt}/exit-code")).exists());
    }
    ok(d, &["apply", "r.yaml"]);
    let s = state(d);
    assert_eq!(s["jobs"]["bad"]["status"].as_str(), Some("failed"), "three plans refused: {s:?}");
    assert_eq!(s["jobs"]["bad"]["job"]["unsupportedPlans"].as_sequence().map(Vec::len), Some(3), "{s:?}");
}

/// Regression, "the job clock never moves in the README's pipeline": the README's cron
/// loop (`jobs | schedule --current | apply`) run unattended with 3 jobs on 2 worker
/// slots. `jobs` writes real submit times and the batch's time, so waiting time grows
/// and starvation (here after 2 s) gets the waiting job its turn: every job progresses,
/// none ever runs twice.
#[test]
fn the_job_clock_moves_in_the_readmes_pipeline() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100_000);
    third_job(d);
    two_slot_cluster(d);
    ok(d, &["submit", "a.yaml", "b.yaml", "c.yaml"]);
    let round = || {
        // Time-sharing by starvation pauses running jobs: they no longer keep their
        // request (the default).
        let (success, err) = cron_round(d, "--starvation 2 --cooldown 1 --max-scale 1 --keep-request false --explain");
        assert!(success, "{err}");
        err
    };
    let mut table = String::from("round | a | b | c (status:iterations)\n");
    let mut log = String::new();
    for r in 1..=10 {
        log.push_str(&round());
        // Live runs by their process groups (a worker's own subshells share its command
        // line, so processes are not the measure).
        let live: Vec<String> = ["a", "b", "c"]
            .iter()
            .flat_map(|j| {
                std::fs::read_dir(d.join("state/jobs").join(j))
                    .into_iter()
                    .flatten()
                    .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("pgid")).ok())
                    .filter(|pgid| {
                        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pgid.trim())).unwrap_or_default();
                        stat.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
                    })
                    .map(move |pgid| format!("{j}:{}", pgid.trim()))
            })
            .collect();
        assert!(live.len() <= 2, "round {r}: at most one run per slot: {live:?}");
        for j in ["a", "b", "c"] {
            assert!(
                live.iter().filter(|l| l.starts_with(&format!("{j}:"))).count() <= 1,
                "round {r}: {j} twice: {live:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(1500));
        let s = state(d);
        let cell = |j: &str| {
            format!(
                "{}:{}",
                s["jobs"][j]["status"].as_str().unwrap_or("?"),
                s["jobs"][j]["iterationsDone"].as_u64().unwrap_or(0)
            )
        };
        table.push_str(&format!("{r} | {} | {} | {}\n", cell("a"), cell("b"), cell("c")));
    }
    let s = state(d);
    for j in ["a", "b", "c"] {
        assert!(s["jobs"][j]["iterationsDone"].as_u64().unwrap_or(0) > 0, "{j} never progressed:\n{table}\n{log}");
    }
    let batch = ok(d, &["jobs"]);
    assert!(batch.contains("nowS:") && !batch.contains("submitTimeS: 0.0"), "{batch}");
    eprintln!("{table}");
    // A picture of what the cluster did.
    ok(d, &["status", "--plot", "runs.svg"]);
    let svg = std::fs::read_to_string(d.join("runs.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("dp1-tp1-pp1-mb") && svg.contains("Runs over time"), "{svg}");
    ok(d, &["status", "--plot", "runs.png"]);
    assert!(std::fs::metadata(d.join("runs.png")).unwrap().len() > 1000);
    for j in ["a", "b", "c"] {
        ok(d, &["stop", j]);
    }
    wait_for("no process left", || workers(d).is_empty());
}
