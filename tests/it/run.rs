//! End-to-end tests of `rubick-run` on the local backend: rounds that start,
//! reconfigure and preempt jobs; a `rubick-run apply` killed (SIGKILL) at every phase
//! of a reconfiguration, then repaired by the next; idempotence; the lock; bad input.
//! A stand-in workload (a shell script speaking the job contract: metric lines,
//! checkpoint on SIGUSR1, resume from the checkpoint) keeps them fast; the PyTorch
//! workload's rounds are in `pytorch.rs`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rubick_tests::{
    Held, Need, Reaper, SlurmShape, Undrain, alive, binary, drain, escaping_script, repo, slurm_nodes, temp, venv,
};

const WORKLOAD: &str = r#"#!/bin/sh
# A stand-in training job: resumes from its checkpoint, checkpoints and exits 0 on SIGUSR1.
ckpt="$RUBICK_CHECKPOINT_DIR/iter"
i=0
[ -f "$ckpt" ] && read -r i < "$ckpt"
echo "stand-in: starting at iteration $i"
stop=0
trap 'stop=1' USR1
grep Cpus_allowed_list /proc/$$/status | cut -f2 > "$RUBICK_CHECKPOINT_DIR/../cores.$$" && mv "$RUBICK_CHECKPOINT_DIR/../cores.$$" "$RUBICK_CHECKPOINT_DIR/../cores"
while [ "$i" -lt "${RUBICK_TOTAL_ITERATIONS:-100000}" ]; do
  i=$((i + 1))
  echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.05}" >> "$RUBICK_METRICS"
  echo "$RUBICK_DP $CUDA_VISIBLE_DEVICES" > "$RUBICK_CHECKPOINT_DIR/../where.$$" && mv "$RUBICK_CHECKPOINT_DIR/../where.$$" "$RUBICK_CHECKPOINT_DIR/../where"
  sleep 0.05
  if [ "$stop" = 1 ]; then
    echo "$i" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"
    echo "{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":$i}" >> "$RUBICK_METRICS"
    exit 0
  fi
done
echo "$i" > "$ckpt"
"#;

pub(crate) fn setup(dir: &Path, iterations: u64) {
    std::fs::write(dir.join("work.sh"), WORKLOAD).unwrap();
    for name in ["a", "b"] {
        let job = format!(
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
            dir.join("work.sh").display()
        );
        std::fs::write(dir.join(format!("{name}.yaml")), job).unwrap();
    }
}

/// `DIR/cluster.yaml`: this machine as a cluster of 2 worker slots on 2 cores.
pub(crate) fn two_slot_cluster(d: &Path) {
    std::fs::write(
        d.join("cluster.yaml"),
        "apiVersion: rubick/v1\nkind: Cluster\nname: box\nnodeGroups:\n  - { name: local, count: 1, gpuType: cpu, gpusPerNode: 2, gpuMemoryGib: 8, cpuCores: 2, hostMemoryGib: 16, nvlinkGBps: 5, interNodeGBps: 1.25, pcieGBps: 5 }\n",
    )
    .unwrap();
}

/// A third job, `c`, like `a` (after [`setup`]).
fn third_job(d: &Path) {
    let c = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace("name: a", "name: c");
    std::fs::write(d.join("c.yaml"), c).unwrap();
}

/// One round of the README's cron line in `d` (state `d/state`, `d/cluster.yaml`), with
/// `flags` for `schedule`: whether it succeeded, and its stderr.
pub(crate) fn cron_round(d: &Path, flags: &str) -> (bool, String) {
    tools_shell(
        d,
        &format!(
            "\"$RR\" jobs --state state | \"$RP\" schedule --cluster cluster.yaml --jobs - --current state/current.yaml {flags} \
             | \"$RR\" apply - --state state"
        ),
    )
}

/// `script` run by `sh` in `d` with `$RR` and `$RP` the tools: whether it succeeded, and
/// its stderr.
pub(crate) fn tools_shell(d: &Path, script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(d)
        .env("RR", binary("rubick-run"))
        .env("RP", binary("rubick-plan"))
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A schedule: `(job, plan, gpus)` on node `local-0`.
#[allow(clippy::type_complexity)]
pub(crate) fn schedule(dir: &Path, file: &str, round: u64, jobs: &[(&str, &str, &[u32])]) {
    let mut text =
        format!("apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: {round}\npolicy: test\nassignments:\n");
    for (job, plan, gpus) in jobs {
        text.push_str(&format!(
            "  - {{ job: {job}, plan: {plan}, nodes: [{{ node: local-0, gpus: {gpus:?}, cpus: 1, hostMemoryGib: 1 }}], predictedThroughput: 1, change: started }}\n"
        ));
    }
    text.push_str(
        "totals: { gpusUsed: 0, gpusTotal: 4, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }\nobjective: 0\nsolver: { method: test, status: optimal }\n",
    );
    std::fs::write(dir.join(file), text).unwrap();
}

pub(crate) fn rr(dir: &Path, args: &[&str], failpoint: Option<&str>) -> (Option<i32>, String, String) {
    let mut c = Command::new(binary("rubick-run"));
    c.args(args).arg("--state").arg(dir.join("state")).current_dir(dir).env("NO_COLOR", "1");
    if let Some(p) = failpoint {
        c.env("RUBICK_RUN_FAILPOINT", p);
    }
    let out = c.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn ok(dir: &Path, args: &[&str]) -> String {
    let (code, out, err) = rr(dir, args, None);
    assert_eq!(code, Some(0), "rubick-run {args:?}: {err}");
    out
}

pub(crate) fn state(dir: &Path) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("state/state.yaml")).unwrap()).unwrap()
}

pub(crate) fn last_iter(dir: &Path, job: &str, attempt: u64) -> u64 {
    let path = dir.join(format!("state/jobs/{job}/attempt-{attempt}/metrics.jsonl"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|l| l.split("\"iter\":").nth(1)?.split([',', '}']).next()?.parse().ok()).max().unwrap_or(0)
}

pub(crate) fn first_iter(dir: &Path, job: &str, attempt: u64) -> Option<u64> {
    let path = dir.join(format!("state/jobs/{job}/attempt-{attempt}/metrics.jsonl"));
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| l.split("\"iter\":").nth(1)?.split([',', '}']).next()?.parse().ok())
}

/// Submits `a` (after [`setup`]) and starts it on slot 0 at DP 1 (`r1.yaml`).
pub(crate) fn start_a(d: &Path) {
    ok(d, &["submit", "a.yaml"]);
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    ok(d, &["apply", "r1.yaml"]);
}

pub(crate) fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Live processes running the stand-in for `dir` (by their command line), without the
/// stand-in's own short-lived subshells (forks that share its command line).
pub(crate) fn workers(dir: &Path) -> Vec<String> {
    let needle = dir.join("work.sh").display().to_string();
    let found: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid = e.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let zombie = fields.next()? == "Z";
            let ppid = fields.next()?.parse().ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (!zombie && cmd.contains(&needle) && !cmd.contains(rubick_launch::wrap::SUBCOMMAND))
                .then_some((pid, ppid, cmd))
        })
        .collect();
    found
        .iter()
        .filter(|(_, ppid, _)| !found.iter().any(|(p, _, _)| p == ppid))
        .map(|(pid, _, cmd)| format!("{pid} {cmd}"))
        .collect()
}

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

/// A stand-in for a run across nodes: every node's launcher says where it runs (host
/// name, node rank, nodes, DP) in `node-RANK`; rank 0 alone writes the metric lines and
/// the checkpoint (the contract); all stop on SIGUSR1.
const MULTI_NODE_WORKLOAD: &str = r#"#!/bin/sh
ckpt="$RUBICK_CHECKPOINT_DIR/iter"
i=0
[ -f "$ckpt" ] && read -r i < "$ckpt"
here="$RUBICK_CHECKPOINT_DIR/../node-$RUBICK_NODE_RANK"
echo "$(hostname) $RUBICK_NODE_RANK $RUBICK_NODES $RUBICK_DP" > "$here.$$" && mv "$here.$$" "$here"
# A helper in a session of its own on every node (as torchrun starts its workers).
setsid sleep 600 &
echo $! > "$RUBICK_CHECKPOINT_DIR/../escaped.$!"
stop=0
trap 'stop=1' USR1
while :; do
  i=$((i + 1))
  [ "$RUBICK_NODE_RANK" = 0 ] && echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.1}" >> "$RUBICK_METRICS"
  sleep 0.1
  if [ "$stop" = 1 ]; then
    if [ "$RUBICK_NODE_RANK" = 0 ]; then
      echo "$i" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"
      echo "{\"rubick\":1,\"event\":\"checkpointed\",\"iter\":$i}" >> "$RUBICK_METRICS"
    fi
    exit 0
  fi
done
"#;

/// A guarantee the cluster can no longer keep does not stop the
/// rounds. On the 3-node test Slurm two guaranteed jobs ask for a node each (2 GPUs; a
/// small model whose speed scales with its GPUs: one GPU cannot match two); two nodes
/// drained, one node is left for both: each round still succeeds, one job keeps its
/// guarantee on the node up, the other is planned best-effort (waits, or runs on what
/// is left) with its guarantee reported not held and why (schedule, `--explain`,
/// Prometheus), and no job stays on a drained node.
#[test]
fn a_guarantee_the_drained_nodes_cannot_keep_pauses_or_degrades_its_job_and_the_rounds_go_on() {
    // CI's shape, which the rounds' plans assume; the nodes alone (it drains some).
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 3, gpus_per_node: 2 }, Held::Exclusive) else { return };
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 1_000_000);
    std::fs::write(d.join("work.sh"), MULTI_NODE_WORKLOAD).unwrap();
    for name in ["a", "b"] {
        let file = d.join(format!("{name}.yaml"));
        let job = std::fs::read_to_string(&file)
            .unwrap()
            .replace("globalBatch: 16 }", "globalBatch: 1024 }")
            .replace("request: { gpus: 1, plan: ga }", "request: { gpus: 2, plan: ga }\nguaranteed: true");
        assert!(job.contains("guaranteed: true") && job.contains("globalBatch: 1024"), "{job}");
        std::fs::write(file, job).unwrap();
    }
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    let round = |what: &str| {
        let script = "\"$RR\" cluster --backend slurm -o cluster.yaml \
            && \"$RR\" jobs --state state \
            | \"$RP\" schedule --cluster cluster.yaml --jobs - --current state/current.yaml --cooldown 0 --explain \
            | tee round.yaml | \"$RR\" apply - --state state --backend slurm";
        let (ok, err) = tools_shell(d, script);
        assert!(ok, "{what}: the round failed: {err}");
        let schedule: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("round.yaml")).unwrap()).unwrap();
        (schedule, err)
    };
    let nodes_of = |job: &str| -> Vec<String> {
        state(d)["jobs"][job]["run"]["nodes"]
            .as_sequence()
            .map(|n| n.iter().map(|n| n["node"].as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let held = |s: &serde_yaml_ng::Value, job: &str| {
        let a = s["assignments"].as_sequence().unwrap().iter().find(|a| a["job"].as_str() == Some(job)).unwrap();
        (a["guarantee"]["holds"].as_bool(), a["reason"].as_str().unwrap_or_default().to_owned())
    };
    let (s1, log) = round("round 1");
    for job in ["a", "b"] {
        assert_eq!(held(&s1, job).0, Some(true), "{job}: {log}");
        assert_eq!(state(d)["jobs"][job]["status"].as_str(), Some("running"), "{job}: {log}");
    }
    let _undrain = Undrain(usable.clone());
    let (drained, up) = (&usable[..2], &usable[2]);
    for node in drained {
        drain(node);
    }
    for what in ["the round after the drains", "the round after that"] {
        let (s, log) = round(what);
        let (ha, hb) = (held(&s, "a"), held(&s, "b"));
        let (kept, demoted) = match (ha.0, hb.0) {
            (Some(true), Some(false)) => ("a", hb.1),
            (Some(false), Some(true)) => ("b", ha.1),
            other => panic!("{what}: one guarantee kept, one not: {other:?}\n{log}"),
        };
        assert!(demoted.contains("guarantee NOT held") && demoted.contains("best-effort"), "{what}: {demoted}");
        assert!(log.contains("guarantee NOT held"), "{what}: --explain says it:\n{log}");
        assert_eq!(nodes_of(kept), std::slice::from_ref(up), "{what}: {kept} keeps its guarantee on {up}\n{log}");
        for job in ["a", "b"] {
            let on = nodes_of(job);
            assert!(on.iter().all(|n| !drained.contains(n)), "{what}: {job} on {on:?}, drained {drained:?}\n{log}");
        }
        let other = if kept == "a" { "b" } else { "a" };
        let out = ok(d, &["status", "--format", "prometheus"]);
        assert!(out.contains(&format!("rubick_job_guarantee_held{{job=\"{other}\"}} 0")), "{what}: {out}");
        let table = ok(d, &["status"]);
        let under: Vec<&str> = table
            .lines()
            .skip_while(|l| !l.starts_with(&format!("{other} ")))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        assert!(
            under.iter().any(|l| l.contains("guarantee NOT held")),
            "{what}: status says why {other} has no guarantee:\n{table}"
        );
    }
    ok(d, &["stop", "a"]);
    ok(d, &["stop", "b"]);
    // The nodes back before the lock goes: the next Slurm test counts them.
    drop(_undrain);
    wait_for("the drained nodes resumed", || {
        let up = rubick_launch::slurm::nodes().unwrap_or_default();
        usable.iter().all(|u| up.iter().any(|n| n.name == *u && n.usable()))
    });
}

/// Multi-node on Slurm: on the 3-node test Slurm (`scripts/slurm-up.sh --nodes
/// 3`), the cron loop plans each round on `rubick-run cluster --backend slurm`: a job
/// runs across two nodes (one launcher per node, each with its rank; rank 0's host the
/// master); a drained node moves it to the other two, draining one more shrinks it to
/// one node, resuming both grows it back; a node of the run failing (its slurmd and
/// processes killed) moves it to the nodes up in the round after Slurm noticed, no retry
/// spent, and the node is planned on once back; every run resumes from the checkpoint; a stop leaves
/// no process on any node.
#[test]
fn a_run_spans_slurm_nodes_and_follows_the_nodes_that_are_up() {
    // CI's shape, which the rounds' plans assume; the nodes alone (it drains and fails some).
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 3, gpus_per_node: 2 }, Held::Exclusive) else { return };
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 1_000_000);
    std::fs::write(d.join("work.sh"), MULTI_NODE_WORKLOAD).unwrap();
    // A model whose compute scales with GPUs (a 1.3B GPT), so the planner uses as many
    // as the nodes up offer (the stand-in itself computes nothing). The rounds go
    // without the restart factor, which would keep a job a minute old that the drains
    // restarted twice where it is.
    let job = std::fs::read_to_string(d.join("a.yaml")).unwrap().replace(
        "model: { name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }",
        "model: { name: gpt-1.3b, parameters: 1300000000, layers: 24, hidden: 2048, heads: 16, seqLen: 1024, globalBatch: 64 }",
    );
    assert!(job.contains("gpt-1.3b"), "{job}");
    std::fs::write(d.join("a.yaml"), job).unwrap();
    ok(d, &["submit", "a.yaml"]);
    // One round: the job's run after it (attempt, nodes), if any, and the round's log.
    let round_any = |what: &str| {
        let script = "\"$RR\" cluster --backend slurm -o cluster.yaml \
            && \"$RR\" jobs --state state \
            | \"$RP\" schedule --cluster cluster.yaml --jobs - --current state/current.yaml --cooldown 0 \
              --restart-factor false --explain \
            | \"$RR\" apply - --state state --backend slurm";
        let (ok, err) = tools_shell(d, script);
        assert!(ok, "{what}: {err}");
        let s = state(d);
        let run = &s["jobs"]["a"]["run"];
        let nodes = run["nodes"].as_sequence().map(|nodes| {
            let names = nodes.iter().map(|n| n["node"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
            (run["attempt"].as_u64().unwrap(), names)
        });
        (nodes, err)
    };
    let round = |what: &str| match round_any(what) {
        (Some((attempt, nodes)), err) => (attempt, nodes, err),
        (None, err) => panic!("{what}: a runs nowhere: {:?}\n{err}", state(d)),
    };
    // Where each node's launcher of `attempt` says it runs: (host, rank, nodes), by rank.
    let launchers = |nodes: usize| -> Vec<(String, String, String)> {
        (0..nodes)
            .filter_map(|k| {
                let text = std::fs::read_to_string(d.join(format!("state/jobs/a/node-{k}"))).ok()?;
                let f: Vec<&str> = text.split_whitespace().collect();
                Some((f.first()?.to_string(), f.get(1)?.to_string(), f.get(2)?.to_string()))
            })
            .collect()
    };
    let slow = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{:?}", state(d));
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let expect = |what: &str, attempt: u64, nodes: &[String], previous: Option<u64>| {
        let n = nodes.len();
        slow(what, &|| {
            let l = launchers(n);
            l.len() == n
                && l.iter().zip(nodes).all(|((host, _, count), node)| host == node && *count == n.to_string())
                && last_iter(d, "a", attempt) >= 3
        });
        if let Some(stopped) = previous {
            assert_eq!(first_iter(d, "a", attempt), Some(stopped + 1), "{what}: resumed from the checkpoint");
        }
        for k in 0..n {
            std::fs::remove_file(d.join(format!("state/jobs/a/node-{k}"))).unwrap();
        }
    };
    let checkpointed =
        || state(d)["jobs"]["a"]["reconfigurations"].as_sequence().and_then(|r| r.last()?["checkpointedIter"].as_u64());
    // Round 1: every node up: the job spans two of them.
    let (attempt, nodes, log) = round("round 1");
    assert_eq!(nodes.len(), 2, "the job spans two nodes: {nodes:?}\n{log}");
    expect("round 1's run on two nodes", attempt, &nodes, None);
    // One of its nodes drained: it moves to the other two.
    let _undrain = Undrain(usable.clone());
    drain(&nodes[1]);
    let (attempt2, nodes2, log) = round("round 2");
    assert!(
        attempt2 > attempt && nodes2.len() == 2 && !nodes2.contains(&nodes[1]),
        "moved off {}: {nodes2:?}\n{log}",
        nodes[1]
    );
    assert!(log.contains(&format!("{}: left out (drain", nodes[1])), "{log}");
    expect("the run on the two nodes left", attempt2, &nodes2, checkpointed());
    // One more drained: one node left, the job shrinks onto it.
    drain(&nodes2[1]);
    let (attempt3, nodes3, log) = round("round 3");
    assert!(
        attempt3 > attempt2 && nodes3.len() == 1 && nodes3[0] == nodes2[0],
        "shrunk onto {}: {nodes3:?}\n{log}",
        nodes2[0]
    );
    expect("the run on the last node", attempt3, &nodes3, checkpointed());
    // Both back (once the controller hears from them again): it grows to two nodes.
    drop(_undrain);
    slow("the nodes resumed", &|| {
        let up = rubick_launch::slurm::nodes().unwrap_or_default();
        usable.iter().all(|u| up.iter().any(|n| n.name == *u && n.usable()))
    });
    let (attempt4, nodes4, log) = round("round 4");
    assert!(attempt4 > attempt3 && nodes4.len() == 2, "grown back: {nodes4:?}\n{log}");
    expect("the run on two nodes again", attempt4, &nodes4, checkpointed());
    // A node of the run fails (its slurmd and every process on it killed). Slurm notices
    // (DOWN after 26-42 s here) and requeues the run, which, pinned to its nodes, would
    // wait for the dead one: the next round ends it and runs the job on the nodes that
    // are up, from its checkpoint, no retry spent (one round of a cron of a minute).
    let failed = nodes4[1].clone();
    let _revive = Revive(failed.clone());
    let retries = state(d)["jobs"]["a"]["retriesLeft"].as_u64();
    let resumed_from = checkpointed();
    let slurm_job = state(d)["jobs"]["a"]["run"]["handle"].as_str().unwrap().to_owned();
    slurm_node("fail", &failed);
    slow("Slurm requeues the run", &|| {
        let out = Command::new("scontrol").args(["show", "job", "-o", &slurm_job]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains("JobState=PENDING") && !text.contains("Restarts=0 ")
    });
    let (attempt5, nodes5, log) = round(&format!("the round after {failed} failed"));
    assert!(attempt5 > attempt4 && !nodes5.contains(&failed), "moved off {failed}: {nodes5:?}\n{log}");
    assert!(log.contains("lost its node") && log.contains(&format!("{failed} down")), "{log}");
    expect("the run on the nodes left after a failure", attempt5, &nodes5, resumed_from);
    let s = state(d);
    assert_eq!(s["jobs"]["a"]["retriesLeft"].as_u64(), retries, "a node failure spends no retry:\n{log}");
    assert_eq!(s["jobs"]["a"]["status"].as_str(), Some("running"), "{log}");
    // The node back: the cluster the rounds plan on has it again.
    drop(_revive);
    slow("the failed node back", &|| {
        rubick_launch::slurm::nodes().unwrap_or_default().iter().any(|n| n.name == failed && n.usable())
    });
    let (_, _, log) = round("the round after the node came back");
    let cluster = std::fs::read_to_string(d.join("cluster.yaml")).unwrap();
    assert!(cluster.contains(&failed), "{failed} planned on again:\n{cluster}\n{log}");
    ok(d, &["stop", "a"]);
    slow("no process left on any node", &|| workers(d).is_empty());
    // Nor any helper a run started in a session of its own, on any node, in any attempt.
    let escaped: Vec<String> = std::fs::read_dir(d.join("state/jobs/a"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("escaped.").map(str::to_owned))
        .collect();
    assert!(escaped.len() >= 2 * 3, "a helper per node and run: {escaped:?}");
    slow("every helper in a session of its own gone", &|| escaped.iter().all(|pid| !alive(pid)));
}

/// `scripts/slurm-node.sh ACTION NODE` (fail: its slurmd and processes killed; start).
fn slurm_node(action: &str, node: &str) {
    let script = repo().join("scripts/slurm-node.sh");
    let out = Command::new(&script).args([action, node]).output().unwrap();
    assert!(out.status.success(), "{} {action} {node}: {}", script.display(), String::from_utf8_lossy(&out.stderr));
}

/// Starts a failed node's slurmd again when dropped (a failed test leaves none dead).
struct Revive(String);

impl Drop for Revive {
    fn drop(&mut self) {
        slurm_node("start", &self.0);
    }
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
fn an_apply_killed_at_any_phase_of_a_reconfiguration_is_repaired_by_the_next() {
    kill_matrix("local");
}

#[test]
fn the_kill_matrix_holds_on_the_real_slurm_too() {
    // DP 2 on one node's two GPUs.
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 2 }, Held::Shared) else { return };
    kill_matrix("slurm");
}

/// `kill -9` of rubick-run at every failpoint of a multi-node apply converges: on the 3-node test Slurm, a job running on two nodes (one launcher each)
/// moves to another pair; the apply is killed at each phase, the next one converges: one
/// run, on the new pair, a launcher on each of its nodes, resumed from the checkpoint;
/// nothing left on any node after a stop.
#[test]
fn the_kill_matrix_holds_for_a_run_across_slurm_nodes() {
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 3, gpus_per_node: 1 }, Held::Shared) else { return };
    let on = |d: &Path, file: &str, round: u64, nodes: &[&String]| {
        let shares: Vec<String> =
            nodes.iter().map(|n| format!("{{ node: {n}, gpus: [0], cpus: 1, hostMemoryGib: 1 }}")).collect();
        std::fs::write(
            d.join(file),
            format!(
                "apiVersion: rubick/v1\nkind: Schedule\ncluster: rubick\nround: {round}\npolicy: test\nassignments:\n  - {{ job: a, plan: dp2-tp1-pp1-mb8-ga1, nodes: [{}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 0, gpusTotal: 0, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }}\nobjective: 0\nsolver: {{ method: test, status: optimal }}\n",
                shares.join(", ")
            ),
        )
        .unwrap();
    };
    let hosts = |d: &Path, attempt: u64| -> Vec<String> {
        (0..2)
            .filter_map(|k| {
                let path = d.join(format!("state/jobs/a/attempt-{attempt}.node-{k}"));
                Some(std::fs::read_to_string(path).ok()?.split_whitespace().next()?.to_owned())
            })
            .collect()
    };
    for point in ["locked", "stop-recorded", "stop-signalled", "stopped", "start-recorded", "spawned", "applied"] {
        let dir = temp();
        let _reaper = Reaper(dir.path().to_path_buf());
        let d = dir.path();
        setup(d, 100_000);
        // The multi-node stand-in, each launcher saying where it runs per attempt.
        let workload = MULTI_NODE_WORKLOAD.replace(
            "here=\"$RUBICK_CHECKPOINT_DIR/../node-$RUBICK_NODE_RANK\"",
            "here=\"$(dirname \"$RUBICK_METRICS\").node-$RUBICK_NODE_RANK\"",
        );
        assert_ne!(workload, MULTI_NODE_WORKLOAD);
        std::fs::write(d.join("work.sh"), workload).unwrap();
        ok(d, &["submit", "a.yaml"]);
        on(d, "r1.yaml", 1, &[&usable[0], &usable[1]]);
        ok(d, &["apply", "r1.yaml", "--backend", "slurm"]);
        wait_for("a iterating on two nodes", || last_iter(d, "a", 1) >= 2 && hosts(d, 1).len() == 2);
        on(d, "r2.yaml", 2, &[&usable[1], &usable[2]]);
        let (code, _, err) = rr(d, &["apply", "r2.yaml", "--backend", "slurm"], Some(point));
        assert_eq!(code, None, "{point}: killed by a signal: {err}");
        let (code, _, err) = rr(d, &["apply", "r2.yaml", "--backend", "slurm"], None);
        assert_eq!(code, Some(0), "{point}: {err}");
        let s = state(d);
        let attempt = s["jobs"]["a"]["run"]["attempt"].as_u64().unwrap();
        wait_for("a's new run on both nodes", || first_iter(d, "a", attempt).is_some() && hosts(d, attempt).len() == 2);
        assert_eq!(hosts(d, attempt), [usable[1].clone(), usable[2].clone()], "{point}: on the new pair");
        wait_for("the old run gone", || workers(d).len() <= 2);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(workers(d).len(), 2, "{point}: one launcher per node of one run: {:?}", workers(d));
        assert!(first_iter(d, "a", attempt).unwrap() > 1, "{point}: resumed, not restarted from zero");
        ok(d, &["apply", "r2.yaml", "--backend", "slurm"]);
        assert_eq!(state(d)["jobs"]["a"]["run"]["attempt"].as_u64(), Some(attempt), "{point}: idempotent");
        ok(d, &["stop", "a"]);
        wait_for("no process left on any node", || workers(d).is_empty());
    }
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

#[test]
fn the_kubernetes_backend_writes_manifests_a_gitops_tool_applies() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml"]);
    let gitops = d.join("gitops");
    let k8s = |args: &[&str]| {
        let out = Command::new(binary("rubick-run"))
            .args(args)
            .arg("--state")
            .arg(d.join("state"))
            .current_dir(d)
            .env("RUBICK_KUBECTL", "0")
            .env("RUBICK_K8S_MANIFEST_DIR", &gitops)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let listed = || {
        let mut names: Vec<String> = std::fs::read_dir(&gitops)
            .map(|r| r.filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_owned())).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    k8s(&["apply", "r1.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-1.yaml"]);
    let manifest = std::fs::read_to_string(gitops.join("rubick-a-1.yaml")).unwrap();
    // The core kind against Kubernetes' published schemas (the CRDs are checked against
    // theirs in the backend's unit tests).
    // (kubernetes-validate is in the PyTorch workload's virtual environment.)
    if let Some(venv) = venv() {
        let validator = venv.join("bin/kubernetes-validate");
        let out = Command::new(&validator).arg("--strict").arg(gitops.join("rubick-a-1.yaml")).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && said.contains("passed for resource configmap/rubick-a-1"), "{said}");
    }
    assert!(
        manifest.contains("kind: PyTorchJob")
            && manifest.contains("kind: TrainJob")
            && manifest.contains("kind: ConfigMap")
    );
    // Idempotent; then a reconfiguration replaces the resources; a stop removes them.
    k8s(&["apply", "r1.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-1.yaml"]);
    schedule(d, "r2.yaml", 2, &[("a", "dp2-tp1-pp1-mb4-ga2", &[0, 1])]);
    k8s(&["apply", "r2.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-2.yaml"]);
    k8s(&["stop", "a"]);
    assert!(listed().is_empty(), "{:?}", listed());
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

/// Regression, "Kubernetes settings exist only as undocumented environment variables ...
/// without a kubectl context the status says running": `apply --kubernetes FILE` takes
/// the settings (kept in the state for every later command); in kubectl mode without a
/// context, the start fails saying what to do, and the job is not reported running.
#[test]
fn kubernetes_settings_are_a_file_kept_in_the_state() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    let gitops = d.join("gitops");
    std::fs::write(
        d.join("k8s.yaml"),
        format!("image: registry.example/train:1\nkubectl: false\nmanifestDir: {}\n", gitops.display()),
    )
    .unwrap();
    let k8s = |args: &[&str], path: &str| {
        let out = Command::new(binary("rubick-run"))
            .args(args)
            .arg("--state")
            .arg(d.join("state"))
            .current_dir(d)
            .env("PATH", path)
            .env_remove("RUBICK_KUBECTL")
            .env_remove("RUBICK_K8S_MANIFEST_DIR")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let path = std::env::var("PATH").unwrap_or_default();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let (code, err) = k8s(&["apply", "r1.yaml", "--backend", "kubernetes", "--kubernetes", "k8s.yaml"], &path);
    assert_eq!(code, Some(0), "{err}");
    let manifest = std::fs::read_to_string(gitops.join("rubick-a-1.yaml")).unwrap();
    assert!(manifest.contains("image: registry.example/train:1"), "{manifest}");
    assert!(d.join("state/kubernetes.yaml").exists(), "kept for later commands");
    // A bad settings file names its field.
    std::fs::write(d.join("bad.yaml"), "kind: CronJob\n").unwrap();
    let (code, err) = k8s(&["apply", "r1.yaml", "--backend", "kubernetes", "--kubernetes", "bad.yaml"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("kind") && err.contains("CronJob"), "{err}");
    // kubectl mode with a kubectl that has no context: b's start fails with what to do.
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("kubectl"), "#!/bin/sh\necho 'error: current-context is not set' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(bin.join("kubectl"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(d.join("k8s.yaml"), "kubectl: true\n").unwrap();
    schedule(d, "r2.yaml", 2, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    let path = format!("{}:{path}", bin.display());
    let (code, err) = k8s(&["apply", "r2.yaml", "--backend", "kubernetes", "--kubernetes", "k8s.yaml"], &path);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no current context") && err.contains("use-context"), "{err}");
    assert_eq!(state(d)["jobs"]["b"]["status"].as_str(), Some("failed"), "not reported running");
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

/// A tmpfs of `size` mounted on `dir` (root only), unmounted when dropped.
pub(crate) struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    pub(crate) fn mount(dir: &Path, size: &str) -> Result<SmallDisk, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
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
