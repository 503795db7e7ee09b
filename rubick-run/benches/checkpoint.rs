//! `make bench`, what a reconfiguration of the PyTorch reference workload costs under
//! `rubick-run` (local backend), its checkpoint gathered whole on rank 0 (`full`, one
//! `torch.save` file) against sharded (`sharded`: `torch.distributed.checkpoint`, every
//! rank writing and then reading only its own slices):
//!
//! * `checkpoint_save_s_{full,sharded}`: the save alone (the run's `checkpointed` event,
//!   recorded by rubick-run as the reconfiguration's `checkpointSaveS`);
//! * `restart_cost_s_{full,sharded}`: what rubick-run records as the job's restart cost
//!   and hands the planner (`restartCostS` of `rubick-run jobs`): the stop (signal to the
//!   exit of the run, the save included) plus the relaunch to the new plan's first
//!   iteration (start-up, the load, one iteration);
//! * `restart_cost_sharded_over_full`: their ratio, measured in this one run.
//!
//! The workload at its largest CPU size: data/profiles/gpt-98m's width (12 layers,
//! hidden 768, 12 heads, vocab 8192; sequence 64, global batch 8 for a CPU), 97.7 M
//! parameters, 1.2 GB of weights and Adam moments; reconfigured dp2 -> tp2 on two
//! processes. It needs the workload's virtual environment in `RUBICK_VENV` (`make bench`
//! sets it from scripts/python-env.sh); without one it says so and prints nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MODEL: &str = "--layers=12 --hidden=768 --heads=12 --seq-len=64 --vocab=8192 --global-batch=8";
const PARAMETERS: u64 = 97_688_064; // train.py's own count at MODEL
const FROM: &str = "dp2-tp1-pp1-mb4-ga1";
const TO: &str = "dp1-tp2-pp1-mb8-ga1";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

fn rr(venv: &Path, state: &Path, args: &[&str]) -> anyhow::Result<String> {
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(env!("CARGO_BIN_EXE_rubick-run"))
        .args(args)
        .arg("--state")
        .arg(state)
        .current_dir(repo())
        .env("PATH", path)
        .output()?;
    anyhow::ensure!(out.status.success(), "rubick-run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn schedule(dir: &Path, round: u64, plan: &str) -> anyhow::Result<String> {
    let text = format!(
        "apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: {round}\npolicy: bench\nassignments:\n  - {{ job: gpt-98m-cpu, plan: {plan}, nodes: [{{ node: local-0, gpus: [0, 1], cpus: 2, hostMemoryGib: 8 }}], predictedThroughput: 1, change: started }}\ntotals: {{ gpusUsed: 0, gpusTotal: 2, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }}\nobjective: 0\nsolver: {{ method: bench, status: optimal }}\n"
    );
    let path = dir.join(format!("round{round}.yaml"));
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

fn iteration_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().filter(|l| l.contains("\"iter_time_s\"")).count())
}

fn wait(what: &str, log: &Path, until: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !until() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// One reconfiguration FROM -> TO with checkpoints of `format`: (save s, restart cost s).
fn reconfigure(venv: &Path, dir: &Path, format: &str) -> anyhow::Result<(f64, f64)> {
    let state = dir.join("state");
    let job = dir.join("job.yaml");
    let args: Vec<String> = MODEL.split(' ').map(|a| format!("\"{a}\"")).collect();
    std::fs::write(
        &job,
        format!(
            "apiVersion: rubick/v1\nkind: Job\nname: gpt-98m-cpu\nmodel: {{ name: gpt-98m-cpu, parameters: {PARAMETERS}, layers: 12, hidden: 768, heads: 12, seqLen: 64, vocab: 8192, globalBatch: 8 }}\niterations: 100000\nrequest: {{ gpus: 2, cpus: 2, plan: ga }}\nlaunch:\n  version: 1\n  command: [\"python\", \"examples/pytorch/train.py\", {}, \"--nproc-per-node={{gpus_per_node}}\", \"--master-port={{master_port}}\"]\n  env: {{ RUBICK_CHECKPOINT_FORMAT: {format} }}\n  stopSignal: SIGUSR1\n  stopTimeoutS: 300\n",
            args.join(", ")
        ),
    )?;
    let attempt = |n: u32| state.join(format!("jobs/gpt-98m-cpu/attempt-{n}"));
    rr(venv, &state, &["submit", &job.display().to_string()])?;
    rr(venv, &state, &["apply", &schedule(dir, 1, FROM)?])?;
    // Two iterations first: the stop then finds a run past its start-up.
    wait("the first run's 2 iterations", &attempt(1).join("log.txt"), || {
        iteration_lines(&attempt(1).join("metrics.jsonl")) >= 2
    })?;
    rr(venv, &state, &["apply", &schedule(dir, 2, TO)?])?;
    wait("the new plan's first iteration", &attempt(2).join("log.txt"), || {
        iteration_lines(&attempt(2).join("metrics.jsonl")) >= 1
    })?;
    rr(venv, &state, &["status"])?; // records the relaunch's first iteration
    let text = std::fs::read_to_string(state.join("state.yaml"))?;
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    let change = &doc["jobs"]["gpt-98m-cpu"]["reconfigurations"][0];
    let (stop, save, first) =
        (change["stopS"].as_f64(), change["checkpointSaveS"].as_f64(), change["firstIterationS"].as_f64());
    rr(venv, &state, &["stop", "gpt-98m-cpu"])?;
    let log = std::fs::read_to_string(attempt(2).join("log.txt")).unwrap_or_default();
    anyhow::ensure!(
        log.contains(&format!("({format}, loaded in")),
        "the new run did not resume from a {format} checkpoint:\n{log}"
    );
    match (stop, save, first) {
        (Some(stop), Some(save), Some(first)) => Ok((save, stop + first)),
        _ => anyhow::bail!("the reconfiguration's record lacks stopS, checkpointSaveS or firstIterationS:\n{text}"),
    }
}

fn main() -> anyhow::Result<()> {
    let Some(venv) = std::env::var_os("RUBICK_VENV").map(PathBuf::from) else {
        eprintln!("checkpoint bench: RUBICK_VENV is not set (scripts/python-env.sh makes one): no figures");
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let mut costs = Vec::new();
    for format in ["full", "sharded"] {
        let sub = dir.path().join(format);
        std::fs::create_dir_all(&sub)?;
        let (save, restart) = reconfigure(&venv, &sub, format)?;
        println!("bench: checkpoint_save_s_{format} {save:.2} s");
        println!("bench: restart_cost_s_{format} {restart:.2} s");
        costs.push(restart);
    }
    println!("bench: restart_cost_sharded_over_full {:.2} x", costs[1] / costs[0]);
    Ok(())
}
