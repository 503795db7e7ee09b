//! The real thing: `rubick-profile` measures the PyTorch reference workload
//! (`examples/pytorch/`) on this machine's CPU, locally and through a real Slurm, and
//! `rubick-fit` fits what it measured. Timing cannot break these tests: they assert
//! rows, columns, statuses, a fit, an out-of-memory configuration recorded as `oom`.
//!
//! They need the workload's virtual environment (`scripts/python-env.sh`, which `make
//! test` runs) and, for Slurm, a running controller (`scripts/slurm-up.sh`, which CI
//! runs). Without one they skip with the reason, unless `RUBICK_REQUIRE_PYTORCH=1` /
//! `RUBICK_REQUIRE_SLURM=1` (CI sets both) makes the absence a failure.

use std::path::Path;
use std::process::Command;

use rubick_tests::{
    Held, Lock, Reaper, SlurmShape, Undrain, alive, binary, drain, lock, repo, slurm_nodes, temp, venv,
};

/// DP 1 and 2, accumulation, checkpointing, ZeRO-1 and ZeRO-3: what runs on a CPU.
const CONFIGS: &str = "plan,placement
dp1-tp1-pp1-mb4-ga4,1
dp1-tp1-pp1-mb8-ga2,1
dp1-tp1-pp1-mb4-ga4-gc,1
dp2-tp1-pp1-mb4-ga2,2
dp2-tp1-pp1-mb4-ga2-z1,2
dp2-tp1-pp1-mb8-ga1-z3,2
";

/// `rubick-profile run JOB` on this machine's cluster with the venv's python.
fn profile(dir: &Path, venv: &Path, job: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(binary("rubick-profile"))
        .args(["-v", "run"])
        .arg(job)
        .arg("--cluster")
        .arg(dir.join("local.yaml"))
        .args(extra)
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .expect("rubick-profile starts");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn cluster_of_this_machine(dir: &Path) {
    let out = Command::new(binary("rubick-profile"))
        .args(["devices", "--cluster-out"])
        .arg(dir.join("local.yaml"))
        .output()
        .expect("rubick-profile starts");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Columns of a CSV profile by name.
fn column(csv: &str, name: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let i = header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name}: {header:?}"));
    lines.map(|l| l.split(',').nth(i).unwrap_or_default().to_owned()).collect()
}

fn check_profile(csv: &str, stderr: &str) {
    assert_eq!(column(csv, "status"), vec!["ok"; 6], "every configuration measured: {csv}\n{stderr}");
    assert_eq!(column(csv, "job"), vec!["gpt-tiny"; 6]);
    for name in ["iter_time_s", "iter_time_sd_s", "samples_per_s", "wall_s", "peak_gpu_memory_gib"] {
        let values = column(csv, name);
        assert!(values.iter().all(|v| v.parse::<f64>().is_ok_and(|x| x >= 0.0)), "{name}: {values:?}");
    }
    assert!(column(csv, "iterations").iter().all(|v| v.parse::<u32>().is_ok_and(|n| n >= 3)), "{csv}");
}

fn fit(dir: &Path, profile: &Path) {
    fit_job(dir, profile, "examples/pytorch/job.yaml");
}

/// `rubick-fit fit PROFILE --job JOB` into `DIR/model.yaml`, which must be a PerfModel.
fn fit_job(dir: &Path, profile: &Path, job: &str) {
    let out = Command::new(binary("rubick-fit"))
        .args(["fit"])
        .arg(profile)
        .args(["--job", job, "--cluster"])
        .arg(dir.join("local.yaml"))
        .arg("-o")
        .arg(dir.join("model.yaml"))
        .current_dir(repo())
        .output()
        .expect("rubick-fit starts");
    assert!(out.status.success(), "the fit of a real profile: {}", String::from_utf8_lossy(&out.stderr));
    let model = std::fs::read_to_string(dir.join("model.yaml")).unwrap();
    assert!(model.contains("kind: PerfModel") && model.contains("parameters:"), "{model}");
}

/// `job` profiled on this machine's cluster (`DIR/local.yaml`) at `configs` (a CSV of
/// plan,placement) into `DIR/profile.csv`: the table and the profiler's stderr.
fn profile_configs(dir: &Path, venv: &Path, job: &str, configs: &str) -> (String, String) {
    cluster_of_this_machine(dir);
    std::fs::write(dir.join("configs.csv"), configs).unwrap();
    let out = dir.join("profile.csv");
    let (code, stderr) = profile(
        dir,
        venv,
        Path::new(job),
        &["--configs", dir.join("configs.csv").to_str().unwrap(), "-o", out.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    (std::fs::read_to_string(&out).unwrap(), stderr)
}

#[test]
fn the_pytorch_workload_is_profiled_for_real_and_fitted() {
    let Some(venv) = venv() else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let (csv, stderr) = profile_configs(dir.path(), &venv, "examples/pytorch/job.yaml", CONFIGS);
    check_profile(&csv, &stderr);
    fit(dir.path(), &dir.path().join("profile.csv"));

    // A memory cap the workload cannot meet: the configuration is infeasible, recorded
    // as such, and the profile goes on (exit 0: out of memory is an answer).
    std::fs::write(dir.path().join("one.csv"), "plan,placement\ndp1-tp1-pp1-mb16-ga1,1\n").unwrap();
    let capped = dir.path().join("capped.yaml");
    let job = std::fs::read_to_string(repo().join("examples/pytorch/job.yaml")).unwrap();
    let job = job.replace("  version: 1\n", "  version: 1\n  env: { RUBICK_MAX_MEMORY_GIB: \"0.05\" }\n");
    assert!(job.contains("RUBICK_MAX_MEMORY_GIB"), "{job}");
    std::fs::write(&capped, job).unwrap();
    let (code, stderr) = profile(
        dir.path(),
        &venv,
        &capped,
        &[
            "--configs",
            dir.path().join("one.csv").to_str().unwrap(),
            "-o",
            dir.path().join("oom.csv").to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let oom = std::fs::read_to_string(dir.path().join("oom.csv")).unwrap();
    assert_eq!(column(&oom, "status"), ["oom"], "{oom}");
}

#[test]
fn the_same_profile_runs_through_a_real_slurm() {
    let Some(venv) = venv() else { return };
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 0 }, Held::Shared) else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    cluster_of_this_machine(dir.path());
    std::fs::write(dir.path().join("configs.csv"), CONFIGS).unwrap();
    let out = dir.path().join("slurm.csv");
    let (code, stderr) = profile(
        dir.path(),
        &venv,
        Path::new("examples/pytorch/job.yaml"),
        &[
            "--backend",
            "slurm",
            "--configs",
            dir.path().join("configs.csv").to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    check_profile(&std::fs::read_to_string(&out).unwrap(), &stderr);
    fit(dir.path(), &out);
}

/// rubick-profile measures multi-node placements through Slurm: a
/// configuration on placement `11` (one GPU on each of two nodes) runs as one sbatch job
/// on two of the test Slurm's nodes, one launcher per node under the run wrapper, rank 0
/// on the first (its master); measured like any row, and the fit takes it.
#[test]
fn a_profile_measures_a_placement_across_slurm_nodes() {
    let Some(venv) = venv() else { return };
    // rubick-profile's rule on a CPU cluster: any usable node.
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 2, gpus_per_node: 0 }, Held::Shared) else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    cluster_of_this_machine(d);
    std::fs::write(d.join("configs.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\ndp2-tp1-pp1-mb4-ga2,11\n").unwrap();
    let out = d.join("nodes.csv");
    let work = d.join("runs");
    let (code, stderr) = profile(
        d,
        &venv,
        Path::new("examples/pytorch/job.yaml"),
        &[
            "--backend",
            "slurm",
            "--configs",
            d.join("configs.csv").to_str().unwrap(),
            "--work-dir",
            work.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    let csv = std::fs::read_to_string(&out).unwrap();
    assert_eq!(column(&csv, "status"), vec!["ok"; 2], "{csv}\n{stderr}");
    assert!(column(&csv, "placement").contains(&"11".to_owned()), "{csv}");
    let script = std::fs::read_dir(&work)
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("log.txt.sbatch")).ok())
        .find(|s| s.contains("RUBICK_NODE_RANK=1"))
        .unwrap_or_else(|| panic!("no two-node sbatch in {}", work.display()));
    assert!(
        script.contains(&format!("#SBATCH --nodelist=\"{},{}\"", usable[0], usable[1]))
            && script.contains("'RUBICK_NODE_RANK=1'")
            && script.contains(&format!("'--master-addr={}'", usable[0]))
            && script.contains(rubick_launch::wrap::SUBCOMMAND),
        "{script}"
    );
    fit(d, &out);
}

/// `(iter, loss)` of a run's metric lines.
fn losses(path: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(l).ok()?;
            Some((v["iter"].as_u64()?, v["loss"].as_f64()?))
        })
        .collect()
}

/// Processes of the workload whose environment points into `dir`.
fn workload_processes(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid = e.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?).into_owned();
            let env = String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).ok()?).into_owned();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let zombie = stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            (!zombie && cmd.contains("train.py") && env.contains(&needle)).then_some(pid)
        })
        .collect()
}

/// `rubick-run ARGS --state STATE` from the repository's root with the venv first on the
/// PATH; it must succeed: (stdout, stderr).
fn rubick_run(venv: &Path, state: &Path, args: &[&str]) -> (String, String) {
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(binary("rubick-run"))
        .args(args)
        .arg("--state")
        .arg(state)
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rubick-run {args:?}: {err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// A shell line of the cron loop, run from the repository's root with the venv first on
/// the PATH and `$RR`, `$RP` (the tools), `$STATE`, `$CLUSTER` and `$D` (the state's
/// directory) set; it must succeed: its stderr.
fn cron_shell(venv: &Path, state: &Path, cluster: &Path, script: &str) -> String {
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(repo())
        .env("PATH", path)
        .env("RR", binary("rubick-run"))
        .env("RP", binary("rubick-plan"))
        .env("STATE", state)
        .env("CLUSTER", cluster)
        .env("D", state.parent().unwrap_or(state))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{script}: {err}");
    err
}

/// A training script adopting the contract, as a job of the rounds below.
struct Workload {
    /// Its Job YAML (in the repository).
    job: &'static str,
    /// The Job's `name:` line and `iterations:` line (replaced per copy).
    name: &'static str,
    iterations: &'static str,
    /// Its plan on one worker slot, and at DP 2 on two (the same global batch).
    dp1: &'static str,
    dp2: &'static str,
}

const REFERENCE: Workload = Workload {
    job: "examples/pytorch/job.yaml",
    name: "name: gpt-tiny\n",
    iterations: "iterations: 200\n",
    dp1: "dp1-tp1-pp1-mb4-ga4",
    dp2: "dp2-tp1-pp1-mb4-ga2",
};

/// A Hugging Face Trainer under torchrun, adopting the contract with the
/// `rubick` Python package (`examples/hf-trainer`).
const HF_TRAINER: Workload = Workload {
    job: "examples/hf-trainer/job.yaml",
    name: "name: hf-gpt2\n",
    iterations: "iterations: 200\n",
    dp1: "dp1-tp1-pp1-mb4-ga2",
    dp2: "dp2-tp1-pp1-mb4-ga1",
};

/// A PyTorch Lightning script adopting the contract with `rubick.integrations.lightning`
/// (`examples/lightning`).
const LIGHTNING: Workload = Workload {
    job: "examples/lightning/job.yaml",
    name: "name: lightning-mlp\n",
    iterations: "iterations: 200\n",
    dp1: "dp1-tp1-pp1-mb16-ga2",
    dp2: "dp2-tp1-pp1-mb16-ga1",
};

/// A plain DDP loop under torchrun adopting the contract with the `rubick`
/// Python package (`examples/torchrun-ddp`).
const TORCHRUN_DDP: Workload = Workload {
    job: "examples/torchrun-ddp/job.yaml",
    name: "name: torchrun-ddp\n",
    iterations: "iterations: 60\n",
    dp1: "dp1-tp1-pp1-mb16-ga1",
    dp2: "dp2-tp1-pp1-mb8-ga1",
};

/// A DeepSpeed engine loop under DeepSpeed's own launcher, adopting the
/// contract with the `rubick` Python package (`examples/deepspeed`); its DP 2 plan also
/// changes the ZeRO stage, so the resume crosses both.
const DEEPSPEED: Workload = Workload {
    job: "examples/deepspeed/job.yaml",
    name: "name: deepspeed-mlp\n",
    iterations: "iterations: 60\n",
    dp1: "dp1-tp1-pp1-mb8-ga2",
    dp2: "dp2-tp1-pp1-mb8-ga1-z2",
};

/// The torchrun example stops cleanly (every worker, in sessions of their
/// own, found by the launcher's process tracking) and resumes at DP 2 and back.
#[test]
fn a_plain_ddp_loop_under_torchrun_is_reconfigured_through_rounds() {
    rubick_run_rounds(&TORCHRUN_DDP, "local");
}

#[test]
fn rubick_run_starts_reconfigures_and_stops_the_pytorch_workload() {
    rubick_run_rounds(&REFERENCE, "local");
}

#[test]
fn the_same_rubick_run_rounds_pass_through_a_real_slurm() {
    // DP 2 on one node's two GPUs.
    let Some(_nodes) = slurm_nodes(SlurmShape { nodes: 1, gpus_per_node: 2 }, Held::Shared) else { return };
    rubick_run_rounds(&REFERENCE, "slurm");
}

/// The PyTorch workload trains with data parallelism across two nodes of the
/// test Slurm (`scripts/slurm-up.sh --nodes 3`): one launcher per node through
/// `rubick-run --backend slurm`, rank 0's node the master; then reconfigured onto a
/// third node alone, resuming at the next iteration with the loss continuing; a stop
/// leaves no process on any node.
#[test]
fn the_pytorch_workload_trains_across_two_slurm_nodes_and_moves_to_a_third() {
    across_slurm_nodes(Launcher::BuiltIn);
}

/// The same with the workload launched by torchrun, and a `setsid` grandchild that is
/// killed on stop: each node's launcher is torchrun (static
/// rendezvous at `{master_addr}:{master_port}`, its node rank from `{node_rank}`; its
/// workers in sessions of their own), started by a shell that first leaves a helper in
/// a session of its own; after the move and after the stop, no worker and no helper is
/// left on any node.
#[test]
fn the_same_across_slurm_nodes_under_torchrun_with_a_setsid_helper() {
    across_slurm_nodes(Launcher::Torchrun);
}

/// The PyTorch workload under the cron loop on the 3-node test
/// Slurm, every round planned on what `rubick-run cluster --backend slurm` says is up
/// (`cluster | jobs | schedule | apply`): data parallelism across two nodes; one of them
/// drained, it moves to the other two; one more drained, it shrinks onto the last;
/// both resumed, it grows back to two; every change resumes at the next iteration with
/// the loss continuing; a stop leaves no process on any node. (The Job's `model:` is a
/// 1.3B GPT for the planner, so that it uses the GPUs the nodes up offer: GPUs beyond
/// its request at any scale-out efficiency, and without the restart factor, which
/// would keep a job a minute old that the drains restarted twice where it is; the
/// script trains its tiny GPT whatever the plan.)
#[test]
fn the_pytorch_workload_follows_the_slurm_nodes_that_are_up_through_cron_rounds() {
    let Some(venv) = venv() else { return };
    // CI's shape, which the rounds' plans assume; the nodes alone (it drains some).
    let Some(usable) = slurm_nodes(SlurmShape { nodes: 3, gpus_per_node: 2 }, Held::Exclusive) else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let tiny = "model: { name: gpt-tiny, parameters: 932608, layers: 4, hidden: 128, heads: 4, seqLen: 64, vocab: 512, globalBatch: 16 }";
    let job = std::fs::read_to_string(repo().join(REFERENCE.job)).unwrap();
    assert!(job.contains(tiny) && job.trim_end().ends_with("timeoutS: 600"), "{job}");
    let job = job.replace(REFERENCE.iterations, "iterations: 100000\n").replace(
        tiny,
        "model: { name: gpt-1.3b, parameters: 1300000000, layers: 24, hidden: 2048, heads: 16, seqLen: 1024, globalBatch: 16 }",
    ) + "  supports: { maxTp: 1, maxPp: 1, zero: [0], offload: [none], checkpointing: false }\n";
    std::fs::write(d.join("job.yaml"), job).unwrap();
    let state = d.join("state");
    rubick_run(&venv, &state, &["submit", d.join("job.yaml").to_str().unwrap()]);
    let metrics = |attempt: u64| state.join(format!("jobs/gpt-tiny/attempt-{attempt}/metrics.jsonl"));
    let log = |attempt: u64| {
        std::fs::read_to_string(state.join(format!("jobs/gpt-tiny/attempt-{attempt}/log.txt"))).unwrap_or_default()
    };
    let wait = |what: &str, attempt: u64, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}:\n{}", log(attempt));
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    // One round of the cron loop: the job's run after it (attempt, nodes) and the log.
    let round = |what: &str| {
        let err = cron_shell(
            &venv,
            &state,
            &d.join("cluster.yaml"),
            "\"$RR\" cluster --backend slurm -o \"$CLUSTER\" && \"$RR\" jobs --state \"$STATE\" \
             | \"$RP\" schedule --cluster \"$CLUSTER\" --jobs - --current \"$STATE/current.yaml\" --cooldown 0 \
               --scale-out-efficiency 0 --restart-factor false --explain \
             | \"$RR\" apply - --state \"$STATE\" --backend slurm",
        );
        let s: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(state.join("state.yaml")).unwrap()).unwrap();
        let run = &s["jobs"]["gpt-tiny"]["run"];
        let nodes: Vec<String> = run["nodes"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{what}: the job runs nowhere: {s:?}\n{err}"))
            .iter()
            .map(|n| n["node"].as_str().unwrap().to_owned())
            .collect();
        (run["attempt"].as_u64().unwrap(), nodes, err)
    };
    // A run training, then (for a change) resumed where the one before stopped.
    let training = |what: &str, attempt: u64, before: Option<u64>| {
        wait(what, attempt, &|| losses(&metrics(attempt)).len() >= 3);
        if let Some(before) = before {
            let (old, new) = (losses(&metrics(before)), losses(&metrics(attempt)));
            let (stopped_iter, stopped_loss) = *old.last().unwrap();
            assert_eq!(new[0].0, stopped_iter + 1, "{what}: the iteration counter continues: {old:?} {new:?}");
            let initial = losses(&metrics(1))[0].1;
            assert!(
                (new[0].1 - stopped_loss).abs() < 0.5 * (initial - stopped_loss).abs(),
                "{what}: the loss continues where it stopped ({stopped_loss} at {stopped_iter}), not from the start ({initial}): {new:?}"
            );
        }
    };
    let (a1, n1, err) = round("round 1");
    assert_eq!(n1.len(), 2, "the job spans two nodes: {n1:?}\n{err}");
    training("round 1's run on two nodes", a1, None);
    let _undrain = Undrain(usable.clone());
    drain(&n1[1]);
    let (a2, n2, err) = round("round 2");
    assert!(a2 > a1 && n2.len() == 2 && !n2.contains(&n1[1]), "moved off {}: {n2:?}\n{err}", n1[1]);
    training("the run on the two nodes left", a2, Some(a1));
    drain(&n2[1]);
    let (a3, n3, err) = round("round 3");
    assert!(a3 > a2 && n3 == [n2[0].clone()], "shrunk onto {}: {n3:?}\n{err}", n2[0]);
    training("the run on the last node", a3, Some(a2));
    drop(_undrain);
    wait("the nodes resumed", a3, &|| {
        let up = rubick_launch::slurm::nodes().unwrap_or_default();
        usable.iter().all(|u| up.iter().any(|n| n.name == *u && n.usable()))
    });
    let (a4, n4, err) = round("round 4");
    assert!(a4 > a3 && n4.len() == 2, "grown back to two nodes: {n4:?}\n{err}");
    training("the run on two nodes again", a4, Some(a3));
    rubick_run(&venv, &state, &["stop", "gpt-tiny"]);
    wait("no workload process surviving the stop on any node", a4, &|| workload_processes(d).is_empty());
}

/// How each node's part of the PyTorch workload is started.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Launcher {
    /// `train.py --nproc-per-node --nnodes --master-addr --master-port` (job.yaml's).
    BuiltIn,
    /// `torchrun` after `setsid sleep` (a helper in a session of its own).
    Torchrun,
}

/// The job's command under torchrun: every node's shell leaves a helper in a session of
/// its own (its pid in `helper.RANK.PID` beside the checkpoints), then becomes torchrun.
const TORCHRUN_COMMAND: &str = r#"command: ["sh", "-c", "setsid sleep 600 & echo $! > \"$RUBICK_CHECKPOINT_DIR/../helper.$RUBICK_NODE_RANK.$!\"; exec python -m torch.distributed.run --nnodes={nodes} --node-rank={node_rank} --master-addr={master_addr} --master-port={master_port} --nproc-per-node={gpus_per_node} --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 examples/pytorch/train.py"]"#;

fn across_slurm_nodes(launcher: Launcher) {
    let Some(venv) = venv() else { return };
    let Some(nodes) = slurm_nodes(SlurmShape { nodes: 3, gpus_per_node: 1 }, Held::Shared) else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let mut job = std::fs::read_to_string(repo().join(REFERENCE.job))
        .unwrap()
        .replace(REFERENCE.iterations, "iterations: 5000\n");
    if launcher == Launcher::Torchrun {
        let built_in = job.lines().find(|l| l.trim_start().starts_with("command:")).unwrap().trim().to_owned();
        job = job.replace(&built_in, TORCHRUN_COMMAND);
    }
    std::fs::write(d.join("job.yaml"), job).unwrap();
    let rr = |args: &[&str]| rubick_run(&venv, &d.join("state"), args).1;
    let schedule = |round: u64, plan: &str, on: &[&str]| {
        let shares: Vec<String> = on
            .iter()
            .map(|n| format!("{{ node: {n}, gpus: [0], cpus: {}, hostMemoryGib: 2 }}", 2 / on.len()))
            .collect();
        let text = format!(
            "apiVersion: rubick/v1\nkind: Schedule\ncluster: rubick\nround: {round}\npolicy: test\nassignments:\n  - {{ job: gpt-tiny, plan: {plan}, nodes: [{}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 0, gpusTotal: 0, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }}\nobjective: 0\nsolver: {{ method: test, status: optimal }}\n",
            shares.join(", ")
        );
        let file = d.join(format!("round{round}.yaml"));
        std::fs::write(&file, text).unwrap();
        file.display().to_string()
    };
    let metrics = |attempt: u32| d.join(format!("state/jobs/gpt-tiny/attempt-{attempt}/metrics.jsonl"));
    let log = |attempt: u32| {
        std::fs::read_to_string(d.join(format!("state/jobs/gpt-tiny/attempt-{attempt}/log.txt"))).unwrap_or_default()
    };
    let wait = |what: &str, attempt: u32, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}:\n{}", log(attempt));
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    rr(&["submit", d.join("job.yaml").to_str().unwrap()]);
    // DP 2 on two nodes, one GPU (and core) each.
    rr(&["apply", &schedule(1, REFERENCE.dp2, &[&nodes[0], &nodes[1]]), "--backend", "slurm"]);
    wait("the run across two nodes training", 1, &|| losses(&metrics(1)).len() >= 6);
    let script = std::fs::read_to_string(d.join("state/jobs/gpt-tiny/attempt-1/log.txt.sbatch")).unwrap();
    let master = match launcher {
        Launcher::BuiltIn => format!("'--master-addr={}'", nodes[0]),
        Launcher::Torchrun => format!("--master-addr={} ", nodes[0]),
    };
    assert!(
        script.contains(&format!("#SBATCH --nodelist=\"{},{}\"", nodes[0], nodes[1]))
            && script.contains("'RUBICK_NODE_RANK=1'")
            && script.contains(&master)
            && script.contains(rubick_launch::wrap::SUBCOMMAND),
        "{script}"
    );
    // Torchrun's helpers, one per node and run so far, by pid.
    let helpers = || -> Vec<String> {
        std::fs::read_dir(d.join("state/jobs/gpt-tiny"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().to_str()?.rsplit('.').next().map(str::to_owned))
                    .filter(|pid| pid.chars().all(|c| c.is_ascii_digit()))
                    .collect()
            })
            .unwrap_or_default()
    };
    if launcher == Launcher::Torchrun {
        assert_eq!(helpers().len(), 2, "a helper per node: {:?}", helpers());
        assert!(helpers().iter().all(|p| alive(p)), "the helpers run in sessions of their own");
    }
    // Onto the third node alone: checkpoint, relaunch, resume.
    rr(&["apply", &schedule(2, REFERENCE.dp1, &[&nodes[2]]), "--backend", "slurm"]);
    let before = losses(&metrics(1));
    let (stopped_iter, stopped_loss) = *before.last().unwrap();
    wait("the run on the third node", 2, &|| !losses(&metrics(2)).is_empty());
    let after = losses(&metrics(2));
    assert_eq!(after[0].0, stopped_iter + 1, "the iteration counter continues: {before:?} {after:?}");
    let initial = before[0].1;
    assert!(
        (after[0].1 - stopped_loss).abs() < 0.5 * (initial - stopped_loss).abs(),
        "the loss continues where it stopped ({stopped_loss} at {stopped_iter}), not from the start ({initial}): {after:?}"
    );
    rr(&["stop", "gpt-tiny"]);
    wait("no workload process surviving the stop", 2, &|| workload_processes(d).is_empty());
    if launcher == Launcher::Torchrun {
        let all = helpers();
        assert_eq!(all.len(), 3, "a helper per node of each run: {all:?}");
        wait("no helper surviving its run on any node", 2, &|| all.iter().all(|p| !alive(p)));
    }
}

/// The Hugging Face Trainer example is profiled (5 configurations), fitted,
/// and run through three rounds of the cron loop (`jobs | schedule | apply`) on a model
/// fitted to given speeds (DP 2 faster, as on a quiet machine): the planner moves it
/// from DP 1 to DP 2 once the other job stopped (the Trainer resumes
/// at the next global step, the loss continuing) and back to DP 1 when a third job
/// arrives; stopped, nothing left (torchrun's workers live in sessions of their own).
#[test]
fn a_hugging_face_trainer_is_profiled_fitted_and_reconfigured_through_rounds() {
    let configs = "plan,placement\ndp1-tp1-pp1-mb4-ga2,1\ndp1-tp1-pp1-mb8-ga1,1\ndp1-tp1-pp1-mb2-ga4,1\n\
                   dp2-tp1-pp1-mb4-ga1,2\ndp2-tp1-pp1-mb2-ga2,2\n";
    profiled_fitted_and_reconfigured(&HF_TRAINER, configs, Rounds::Planned);
}

/// A PyTorch Lightning `Trainer` (`examples/lightning`), the same way.
#[test]
fn a_lightning_trainer_is_profiled_fitted_and_reconfigured_through_rounds() {
    let configs = "plan,placement\ndp1-tp1-pp1-mb16-ga2,1\ndp1-tp1-pp1-mb32-ga1,1\ndp1-tp1-pp1-mb8-ga4,1\n\
                   dp2-tp1-pp1-mb16-ga1,2\ndp2-tp1-pp1-mb8-ga2,2\n";
    profiled_fitted_and_reconfigured(&LIGHTNING, configs, Rounds::Written);
}

/// The DeepSpeed engine example, profiled across ZeRO stages, optimizer
/// offload and activation checkpointing, fitted, and run through the same rounds.
#[test]
fn a_deepspeed_engine_loop_is_profiled_fitted_and_reconfigured_through_rounds() {
    let configs = "plan,placement\ndp1-tp1-pp1-mb8-ga2,1\ndp1-tp1-pp1-mb16-ga1,1\ndp1-tp1-pp1-mb4-ga4-gc,1\n\
                   dp2-tp1-pp1-mb8-ga1-z2,2\ndp2-tp1-pp1-mb4-ga2-z1-offopt,2\n";
    profiled_fitted_and_reconfigured(&DEEPSPEED, configs, Rounds::Written);
}

/// How the rounds after a profile are driven.
#[derive(Clone, Copy, PartialEq)]
enum Rounds {
    /// The README's cron loop ([`cron_rounds`]): the planner itself moves the job to DP 2.
    Planned,
    /// Written schedules ([`rubick_run_rounds`]): on this 2-core machine the fitted
    /// models of the small MLPs rightly find DP 2 no faster, so the loop keeps DP 1.
    Written,
}

/// `workload` profiled on this machine (`configs`: a CSV of plan,placement; all must
/// measure `ok`), fitted, then through three rounds (`rounds`).
fn profiled_fitted_and_reconfigured(workload: &Workload, configs: &str, rounds: Rounds) {
    let Some(venv) = venv() else { return };
    {
        let _measuring = lock(Lock::Measure, Held::Exclusive);
        let dir = temp();
        let _reaper = Reaper(dir.path().to_path_buf());
        let (csv, stderr) = profile_configs(dir.path(), &venv, workload.job, configs);
        let rows = configs.lines().count() - 1;
        assert_eq!(column(&csv, "status"), vec!["ok"; rows], "every configuration measured: {csv}\n{stderr}");
        fit_job(dir.path(), &dir.path().join("profile.csv"), workload.job);
        if rounds == Rounds::Planned {
            // The rounds decide on the speeds they are given, not on what this machine
            // measured while other tests loaded its cores.
            std::fs::write(dir.path().join("given.csv"), with_dp2_faster(&csv)).unwrap();
            fit_job(dir.path(), &dir.path().join("given.csv"), workload.job);
            return cron_rounds(workload, &venv, dir.path());
        }
    }
    rubick_run_rounds(workload, "local");
}

/// `profile` (a measured CSV) with every DP-2 row's iteration time set to 0.55 of the
/// DP-1 rows' median: the speed-up a second worker slot brings on a quiet machine, which
/// the planner's decision below must rest on (measured while other tests load the
/// cores, a second slot may add nothing).
fn with_dp2_faster(profile: &str) -> String {
    let mut lines = profile.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (plan, time) = (column("plan"), column("iter_time_s"));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_owned).collect()).collect();
    let dp1 = rows.iter().filter(|r| r[plan].starts_with("dp1-")).map(|r| r[time].parse().unwrap()).collect();
    let fast = 0.55 * median(dp1);
    let mut out = header.join(",") + "\n";
    for mut row in rows {
        if row[plan].starts_with("dp2-") {
            row[time] = fast.to_string();
        }
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// Three rounds of the README's cron loop (`rubick-run jobs | rubick-plan schedule |
/// rubick-run apply`, no cooldown) for copies of `workload` (a million iterations each,
/// as a real training job: a faster plan then pays for its restart) with the model fitted in
/// `d` (`d/model.yaml`) on this machine's two worker slots (`d/local.yaml`): jobs a and
/// b get a slot each; b is stopped, and the planner moves a to DP 2 on both slots (it
/// resumes at the next global step, the loss continuing); c is submitted, and a goes
/// back to DP 1 beside it, resuming again. Stops leave no process.
fn cron_rounds(workload: &Workload, venv: &Path, d: &Path) {
    let job = std::fs::read_to_string(repo().join(workload.job)).unwrap();
    for name in ["a", "b", "c"] {
        let text = job
            .replace(workload.name, &format!("name: {name}\n"))
            .replace(workload.iterations, "iterations: 1000000\n");
        assert!(text.contains(&format!("name: {name}\n")) && text.contains("iterations: 1000000"), "{text}");
        std::fs::write(
            d.join(format!("{name}.yaml")),
            // A restart of this small model (torchrun, imports, checkpoint) takes seconds.
            format!("{text}perfModel: {}\nguaranteed: true\nrestartCostS: 10\n", d.join("model.yaml").display()),
        )
        .unwrap();
    }
    let state = d.join("state");
    let sh = |script: &str| cron_shell(venv, &state, &d.join("local.yaml"), script);
    let mut log = String::new();
    // On this machine a second worker slot adds little (two cores), under the default
    // scale-out efficiency: the rounds lower it so that the planner moves a to DP 2.
    // Without Sia's restart factor too: it weighs a change by the job's progress as
    // measured, which a loaded machine slows (a kept for churn, not moved).
    let round = |log: &mut String| {
        log.push_str(&sh("\"$RR\" jobs --state \"$STATE\" --cluster \"$CLUSTER\" \\
            | \"$RP\" schedule --cluster \"$CLUSTER\" --jobs - --current \"$STATE/current.yaml\" --cooldown 0 --explain \\
              --scale-out-efficiency 0 --restart-factor false \\
            | \"$RR\" apply - --state \"$STATE\""));
    };
    // (plan, attempt) of a job's run as the state says.
    let run_of = |job: &str| {
        let s: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(state.join("state.yaml")).unwrap()).unwrap();
        let run = &s["jobs"][job]["run"];
        (run["plan"].as_str().unwrap_or_default().to_owned(), run["attempt"].as_u64().unwrap_or(0))
    };
    let metrics = |job: &str, attempt: u64| state.join(format!("jobs/{job}/attempt-{attempt}/metrics.jsonl"));
    let diagnose = |log: &str| {
        let mut text = std::fs::read_to_string(state.join("state.yaml")).unwrap_or_default();
        for job in ["a", "b", "c"] {
            for attempt in 1..=4 {
                if let Ok(t) = std::fs::read_to_string(state.join(format!("jobs/{job}/attempt-{attempt}/log.txt"))) {
                    let tail: Vec<&str> = t.lines().rev().take(15).collect();
                    text.push_str(&format!(
                        "--- {job} attempt {attempt}:\n{}\n",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ));
                }
            }
        }
        format!("{text}\n--- rounds:\n{log}")
    };
    let wait = |what: &str, log: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}:\n{}", diagnose(log));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    sh("\"$RR\" submit \"$D/a.yaml\" \"$D/b.yaml\" --state \"$STATE\"");
    // Round 1: a and b, one slot each (each is guaranteed its request of one).
    round(&mut log);
    let ((a1, attempt), (b1, _)) = (run_of("a"), run_of("b"));
    assert!(a1.starts_with("dp1-") && b1.starts_with("dp1-"), "a on {a1}, b on {b1}:\n{log}");
    wait("a and b training", &log, &|| {
        losses(&metrics("a", attempt)).len() >= 6 && !losses(&metrics("b", 1)).is_empty()
    });
    // Round 2: b stopped for good. With the default rules a grows only if the second
    // slot adds half a slot's throughput and the change repays its restart, and says
    // which held it back when it does not (which one depends on the speeds measured,
    // i.e. on how loaded the machine is).
    sh("\"$RR\" stop b --state \"$STATE\"");
    let default = sh("\"$RR\" jobs --state \"$STATE\" --cluster \"$CLUSTER\" \\
        | \"$RP\" schedule --cluster \"$CLUSTER\" --jobs - --current \"$STATE/current.yaml\" --cooldown 0 --explain \\
        > \"$D/round2-default.yaml\"");
    let kept = std::fs::read_to_string(d.join("round2-default.yaml")).unwrap().contains(&format!("plan: {a1}"));
    assert!(
        !kept || default.contains("under the scale-out efficiency") || default.contains("kept for churn"),
        "a kept on {a1} by the default rules, saying neither why:\n{default}"
    );
    // a grows to DP 2 on both slots.
    round(&mut log);
    let (a2, attempt2) = run_of("a");
    assert!(
        a2.starts_with("dp2-") && attempt2 == attempt + 1,
        "a on {a2} (attempt {attempt2}) once b stopped:\n{}",
        diagnose(&log)
    );
    let before = losses(&metrics("a", attempt));
    let (stopped_iter, stopped_loss) = *before.last().unwrap();
    wait("a's run at DP 2", &log, &|| !losses(&metrics("a", attempt2)).is_empty());
    let after = losses(&metrics("a", attempt2));
    assert_eq!(after[0].0, stopped_iter + 1, "the global step continues from the checkpoint: {before:?} {after:?}");
    let initial = before[0].1;
    assert!(
        (after[0].1 - stopped_loss).abs() < 0.5 * (initial - stopped_loss).abs(),
        "the loss continues where it stopped ({stopped_loss} at {stopped_iter}), not from the start ({initial}): {after:?}"
    );
    wait("a's run at DP 2 stepping", &log, &|| losses(&metrics("a", attempt2)).len() >= 3);
    // Round 3: c arrives; a goes back to DP 1 beside it and resumes again.
    sh("\"$RR\" submit \"$D/c.yaml\" --state \"$STATE\"");
    round(&mut log);
    let ((a3, attempt3), (c3, _)) = (run_of("a"), run_of("c"));
    assert!(
        a3.starts_with("dp1-") && c3.starts_with("dp1-") && attempt3 == attempt2 + 1,
        "a on {a3}, c on {c3}:\n{}",
        diagnose(&log)
    );
    let at_dp2 = losses(&metrics("a", attempt2));
    wait("a resumed beside c", &log, &|| {
        !losses(&metrics("a", attempt3)).is_empty() && !losses(&metrics("c", 1)).is_empty()
    });
    assert_eq!(
        losses(&metrics("a", attempt3))[0].0,
        at_dp2.last().unwrap().0 + 1,
        "a resumed at the next step: {at_dp2:?}"
    );
    eprintln!("rounds: a {a1} -> {a2} -> {a3}, b {b1}, c {c3}\n{log}");
    sh("\"$RR\" stop a --state \"$STATE\" && \"$RR\" stop c --state \"$STATE\"");
    wait("no workload process surviving the stops", &log, &|| workload_processes(d).is_empty());
}

/// Three rounds of rubick-run on `backend` with `workload`.
fn rubick_run_rounds(workload: &Workload, backend: &str) {
    let Some(venv) = venv() else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let job = std::fs::read_to_string(repo().join(workload.job)).unwrap();
    for name in ["a", "b"] {
        let text =
            job.replace(workload.name, &format!("name: {name}\n")).replace(workload.iterations, "iterations: 5000\n");
        assert!(text.contains(&format!("name: {name}\n")) && text.contains("iterations: 5000"), "{text}");
        std::fs::write(d.join(format!("{name}.yaml")), text).unwrap();
    }
    let rr = |args: &[&str]| rubick_run(&venv, &d.join("state"), args);
    let schedule = |round: u64, jobs: &[(&str, &str, &[u32])]| {
        let mut text = format!(
            "apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: {round}\npolicy: test\nassignments:\n"
        );
        for (job, plan, gpus) in jobs {
            text.push_str(&format!(
                "  - {{ job: {job}, plan: {plan}, nodes: [{{ node: local-0, gpus: {gpus:?}, cpus: {}, hostMemoryGib: 4 }}], predictedThroughput: 1, change: started }}\n",
                gpus.len()
            ));
        }
        text.push_str("totals: { gpusUsed: 0, gpusTotal: 2, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }\nobjective: 0\nsolver: { method: test, status: optimal }\n");
        let file = d.join(format!("round{round}.yaml"));
        std::fs::write(&file, text).unwrap();
        file.display().to_string()
    };
    let metrics = |job: &str, attempt: u32| d.join(format!("state/jobs/{job}/attempt-{attempt}/metrics.jsonl"));
    // On a timeout: what the state says of the jobs, and the tails of their run logs.
    let diagnose = || {
        let state = std::fs::read_to_string(d.join("state/state.yaml")).unwrap_or_default();
        let mut logs = String::new();
        for job in ["a", "b"] {
            for attempt in 1..=4 {
                let log = d.join(format!("state/jobs/{job}/attempt-{attempt}/log.txt"));
                if let Ok(text) = std::fs::read_to_string(&log) {
                    let tail: Vec<&str> = text.lines().rev().take(15).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    logs.push_str(&format!("--- {job} attempt {attempt}:\n{}\n", tail.join("\n")));
                }
            }
        }
        format!("{state}\n{logs}")
    };
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}:\n{}", diagnose());
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    rr(&["submit", d.join("a.yaml").to_str().unwrap(), d.join("b.yaml").to_str().unwrap()]);
    // Round 1: two jobs, one worker slot each.
    rr(&["apply", &schedule(1, &[("a", workload.dp1, &[0]), ("b", workload.dp1, &[1])]), "--backend", backend]);
    wait("a and b training", &|| losses(&metrics("a", 1)).len() >= 6 && !losses(&metrics("b", 1)).is_empty());
    // Round 2: a to DP 2 on both slots (checkpoint, relaunch, resume); b preempted.
    let (_, err) = rr(&["apply", &schedule(2, &[("a", workload.dp2, &[0, 1])]), "--backend", backend]);
    assert!(err.contains("a: stopped (to reconfigure)") && err.contains("b: stopped (preempted)"), "{err}");
    let before = losses(&metrics("a", 1));
    let (stopped_iter, stopped_loss) = *before.last().unwrap();
    wait("a's run at DP 2", &|| !losses(&metrics("a", 2)).is_empty());
    let after = losses(&metrics("a", 2));
    let (first_iter, first_loss) = after[0];
    assert_eq!(
        first_iter,
        stopped_iter + 1,
        "the iteration counter continues from the checkpoint: {before:?} {after:?}"
    );
    let initial = before[0].1;
    assert!(
        (first_loss - stopped_loss).abs() < 0.5 * (initial - stopped_loss).abs(),
        "the loss continues where it stopped ({stopped_loss} at {stopped_iter}), not from the start ({initial}): {first_loss}"
    );
    let (table, _) = rr(&["status"]);
    assert!(table.lines().any(|l| l.starts_with("a ") && l.contains(workload.dp2)), "{table}");
    // Round 3: b back on one slot, a down to one; then both stopped for good.
    let round3 = schedule(3, &[("a", workload.dp1, &[0]), ("b", workload.dp1, &[1])]);
    rr(&["apply", &round3, "--backend", backend]);
    // b's newest run (a start that failed is retried by the next round, as the cron loop
    // would: the same schedule applied again, at most twice).
    let newest = |job: &str| (2..=4).rev().map(|k| metrics(job, k)).find(|m| m.exists()).unwrap_or(metrics(job, 2));
    for retry in 0..=2 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while losses(&newest("b")).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        if !losses(&newest("b")).is_empty() || retry == 2 {
            break;
        }
        rr(&["apply", &round3, "--backend", backend]);
    }
    wait("b resumed", &|| !losses(&newest("b")).is_empty());
    assert!(losses(&newest("b"))[0].0 > 1, "b resumed from its checkpoint");
    rr(&["stop", "a"]);
    rr(&["stop", "b"]);
    // Gone at once locally; Slurm may take a moment to reap the job's steps.
    wait("no workload process surviving the stops", &|| workload_processes(d).is_empty());
}

/// Iteration times (`iter_time_s`) of a run's metric lines after `warmup` iterations.
fn iteration_times(path: &Path, warmup: u64) -> Vec<f64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(l).ok()?;
            (v["iter"].as_u64()? > warmup).then_some(v["iter_time_s"].as_f64()?)
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The loop closed: a job runs on a plan its fitted model mispredicts (micro-
/// batch 1 with 16 accumulation steps: the profile never measured a micro-batch below
/// 4); `rubick-run jobs --cluster` refits the model on the profiled rows and that run,
/// which then explains the run, and the next round of the cron loop moves the job to a
/// plan whose run is measured faster — within two rounds.
#[test]
fn a_job_started_on_a_mispredicted_plan_moves_to_a_faster_one_within_two_rounds() {
    let Some(venv) = venv() else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    cluster_of_this_machine(d);
    // A real profile of two splits of the batch, and its fit.
    std::fs::write(d.join("configs.csv"), "plan,placement\ndp1-tp1-pp1-mb4-ga4,1\ndp1-tp1-pp1-mb8-ga2,1\n").unwrap();
    let out = d.join("profile.csv");
    let (code, stderr) = profile(
        d,
        &venv,
        Path::new("examples/pytorch/job.yaml"),
        &["--configs", d.join("configs.csv").to_str().unwrap(), "-o", out.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{stderr}");
    fit(d, &out);
    let job = std::fs::read_to_string(repo().join("examples/pytorch/job.yaml"))
        .unwrap()
        .replace("iterations: 200\n", "iterations: 100000\n");
    // Its restart takes seconds (a small model): a gain of a tenth repays it.
    std::fs::write(
        d.join("job.yaml"),
        format!("{job}perfModel: {}\nrestartCostS: 10\n", d.join("model.yaml").display()),
    )
    .unwrap();
    // One worker slot: the plan, not more slots, must make the job faster.
    let mut cluster: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("local.yaml")).unwrap()).unwrap();
    cluster["nodeGroups"][0]["gpusPerNode"] = 1.into();
    std::fs::write(d.join("one.yaml"), serde_yaml_ng::to_string(&cluster).unwrap()).unwrap();
    let state = d.join("state");
    let sh = |script: &str| cron_shell(&venv, &state, &d.join("one.yaml"), script);
    sh(&format!("\"$RR\" submit {} --state \"$STATE\"", d.join("job.yaml").display()));
    // The job starts on micro-batch 1 (an earlier round's choice).
    let first = format!(
        "apiVersion: rubick/v1\nkind: Schedule\ncluster: {}\nround: 1\npolicy: test\nassignments:\n  - {{ job: gpt-tiny, plan: dp1-tp1-pp1-mb1-ga16, nodes: [{{ node: {}-0, gpus: [0], cpus: 1, hostMemoryGib: 4 }}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 1, gpusTotal: 1, cpusUsed: 1, hostMemoryGibUsed: 4, normalizedThroughput: 1 }}\nobjective: 0\nsolver: {{ method: test, status: optimal }}\n",
        cluster["name"].as_str().unwrap(),
        cluster["nodeGroups"][0]["name"].as_str().unwrap()
    );
    std::fs::write(d.join("round1.yaml"), first).unwrap();
    sh(&format!("\"$RR\" apply {} --state \"$STATE\"", d.join("round1.yaml").display()));
    // Rounds of the cron loop (the README's), without the cooldown and the restart
    // factor (which holds a job seconds old where it is): the refitted model decides the
    // next round.
    let round = || {
        sh("\"$RR\" jobs --state \"$STATE\" --cluster \"$CLUSTER\" \
            | \"$RP\" schedule --cluster \"$CLUSTER\" --jobs - --current \"$STATE/current.yaml\" --cooldown 0 --explain \
               --restart-factor false \
            | \"$RR\" apply - --state \"$STATE\"")
    };
    let current_plan = || {
        let s: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(state.join("state.yaml")).unwrap()).unwrap();
        let run = &s["jobs"]["gpt-tiny"]["run"];
        (run["plan"].as_str().unwrap_or_default().to_owned(), run["attempt"].as_u64().unwrap_or(0))
    };
    let metrics = |attempt: u64| state.join(format!("jobs/gpt-tiny/attempt-{attempt}/metrics.jsonl"));
    let wait_times = |attempt: u64| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        while iteration_times(&metrics(attempt), 3).len() < 4 {
            assert!(std::time::Instant::now() < deadline, "attempt {attempt} measured no 4 iterations");
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        median(iteration_times(&metrics(attempt), 3))
    };
    let (start, attempt) = current_plan();
    let slow = wait_times(attempt);
    let mut log = String::new();
    for _ in 0..2 {
        log.push_str(&round());
        // The refit explains the run it learned from.
        let refit: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(state.join("jobs/gpt-tiny/model.yaml")).unwrap()).unwrap();
        assert!(refit["fittedFrom"]["source"].as_str().unwrap_or_default().contains("row(s) of"), "{refit:?}");
        let (plan, attempt) = current_plan();
        if plan != start {
            let row = refit["diagnostics"]["rows"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|r| r["plan"].as_str() == Some(start.as_str()))
                .unwrap_or_else(|| panic!("the run's row in the refit: {refit:?}"));
            let (m, p) = (row["measuredS"].as_f64().unwrap(), row["predictedS"].as_f64().unwrap());
            assert!((p / m - 1.0).abs() < 0.3, "the refit predicts the run it saw: {p} s against {m} s");
            let fast = wait_times(attempt);
            assert!(fast < slow, "moved to {plan}, measured {fast} s against {slow} s at {start}\n{log}");
            eprintln!("moved {start} ({slow} s) -> {plan} ({fast} s); refit {p} s for {m} s measured\n{log}");
            sh("\"$RR\" stop gpt-tiny --state \"$STATE\"");
            return;
        }
    }
    sh("\"$RR\" stop gpt-tiny --state \"$STATE\"");
    panic!("still on {start} after two rounds; measured {slow} s\n{log}");
}

/// The newer plan dimensions in the reference workload: tensor parallelism with
/// sequence parallelism and selective recompute (torch's `SequenceParallel` styles, the
/// attention core recomputed), and an interleaved pipeline of 2 virtual stages per rank
/// (`ScheduleInterleaved1F1B`), each profiled on this machine and fitted; then a run
/// reconfigured from the first to the second, resumed at the next iteration with the
/// loss continuing.
#[test]
fn sequence_parallel_selective_and_interleaved_plans_are_profiled_fitted_and_reconfigured() {
    let Some(venv) = venv() else { return };
    let _measuring = lock(Lock::Measure, Held::Exclusive);
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    let (sp_sel, interleaved) = ("dp1-tp2-pp1-mb4-ga4-sp-sel", "dp1-tp1-pp2-mb2-ga8-vp2");
    let job = std::fs::read_to_string(repo().join(REFERENCE.job))
        .unwrap()
        .replace(REFERENCE.iterations, "iterations: 5000\n")
        + "  supports: { sequenceParallel: true, selectiveRecompute: true, maxVp: 2 }\n";
    std::fs::write(d.join("job.yaml"), &job).unwrap();
    let job_path = d.join("job.yaml").display().to_string();
    let configs =
        format!("plan,placement\n{sp_sel},2\n{interleaved},2\ndp1-tp1-pp1-mb4-ga4,1\ndp1-tp2-pp1-mb4-ga4,2\n");
    let (csv, stderr) = profile_configs(d, &venv, &job_path, &configs);
    assert_eq!(column(&csv, "status"), vec!["ok"; 4], "every configuration measured: {csv}\n{stderr}");
    let plans = column(&csv, "plan");
    assert!(plans.iter().any(|p| p == sp_sel) && plans.iter().any(|p| p == interleaved), "{csv}");
    fit_job(d, &d.join("profile.csv"), &job_path);

    let rr = |args: &[&str]| rubick_run(&venv, &d.join("state"), args);
    let schedule = |round: u64, plan: &str| {
        let text = format!(
            "apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: {round}\npolicy: test\nassignments:\n  - {{ job: gpt-tiny, plan: {plan}, nodes: [{{ node: local-0, gpus: [0, 1], cpus: 2, hostMemoryGib: 4 }}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 0, gpusTotal: 2, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }}\nobjective: 0\nsolver: {{ method: test, status: optimal }}\n"
        );
        let file = d.join(format!("round{round}.yaml"));
        std::fs::write(&file, text).unwrap();
        file.display().to_string()
    };
    let metrics = |attempt: u32| d.join(format!("state/jobs/gpt-tiny/attempt-{attempt}/metrics.jsonl"));
    let log = |attempt: u32| {
        std::fs::read_to_string(d.join(format!("state/jobs/gpt-tiny/attempt-{attempt}/log.txt"))).unwrap_or_default()
    };
    let wait = |what: &str, attempt: u32, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}:\n{}", log(attempt));
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    rr(&["submit", &job_path]);
    rr(&["apply", &schedule(1, sp_sel)]);
    wait("the sequence-parallel run training", 1, &|| losses(&metrics(1)).len() >= 4);
    assert!(log(1).contains("+ TP + SP + selective recompute"), "{}", log(1));
    let (_, err) = rr(&["apply", &schedule(2, interleaved)]);
    assert!(err.contains("stopped (to reconfigure)"), "{err}");
    wait("the interleaved run training", 2, &|| !losses(&metrics(2)).is_empty());
    assert!(log(2).contains("interleaved 1F1B, 2 chunks per rank"), "{}", log(2));
    let (before, after) = (losses(&metrics(1)), losses(&metrics(2)));
    let (stopped_iter, stopped_loss) = *before.last().unwrap();
    assert_eq!(after[0].0, stopped_iter + 1, "the iteration counter continues: {before:?} {after:?}");
    let initial = before[0].1;
    assert!(
        (after[0].1 - stopped_loss).abs() < 0.5 * (initial - stopped_loss).abs(),
        "the loss continues where it stopped ({stopped_loss} at {stopped_iter}), not from the start ({initial}): {after:?}"
    );
    rr(&["stop", "gpt-tiny"]);
    wait("no workload process left", 2, &|| workload_processes(d).is_empty());
}
