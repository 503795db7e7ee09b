//! Runs across the test Slurm's nodes (`scripts/slurm-up.sh --nodes 3`): a run
//! follows the nodes that are up (drained, failed, back), a guarantee the drained nodes
//! cannot keep, and the kill matrix of a run on two nodes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rubick_tests::{Held, Reaper, SlurmShape, Undrain, alive, drain, repo, slurm_nodes, temp};

use super::{first_iter, last_iter, ok, rr, setup, state, tools_shell, wait_for, workers};

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
