//! `make bench`, rubick-run's figures, on the local backend with a stand-in workload
//! (a shell loop speaking the job contract: checkpoint on SIGUSR1, resume):
//!
//! * `apply_noop_ms`: an `apply` with nothing to change, 100 jobs running (median of 5);
//!   `apply_noop_uncached_ms` the same with the state's parsed copy removed before each
//!   (its YAML parsed; `RUBICK_BENCH_TRACE=1` prints one apply's phases);
//! * `reconfigure_overhead_s`: the wall time of an `apply` that reconfigures one job,
//!   beyond the workload's own stop (signal to exit, recorded by rubick-run) — state
//!   writes, process-group checks, the relaunch (median of 5);
//! * `apply_reconfigure_20_jobs_s`: an `apply` reconfiguring 20 jobs whose checkpoint
//!   takes 2 s each (stopped together: about one stop, not twenty).
//!
//! `RUBICK_BENCH_RUN=PATH` measures another `rubick-run` binary (an older build: a
//! before and after under the same load); `RUBICK_BENCH_ONLY=noop` stops after the two
//! no-op figures.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

const WORKLOAD: &str = r#"ckpt="$RUBICK_CHECKPOINT_DIR/iter"; i=0; [ -f "$ckpt" ] && i=$(cat "$ckpt")
stop=0; trap 'stop=1' USR1
while :; do i=$((i + 1)); echo "{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.2}" >> "$RUBICK_METRICS"; sleep 0.2
  if [ "$stop" = 1 ]; then sleep "${CHECKPOINT_S:-0}"; echo "$i" > "$ckpt"; exit 0; fi; done"#;

fn rr(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    rr_in(&dir.join("state"), args)
}

/// The binary measured: this build's, or `RUBICK_BENCH_RUN`.
fn binary() -> std::ffi::OsString {
    std::env::var_os("RUBICK_BENCH_RUN").unwrap_or_else(|| env!("CARGO_BIN_EXE_rubick-run").into())
}

fn rr_in(state: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(binary()).args(args).arg("--state").arg(state).output()?;
    anyhow::ensure!(out.status.success(), "rubick-run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Job files `PREFIX000..` running the stand-in workload, whose checkpoint takes
/// `checkpoint_s`.
fn job_files(dir: &Path, prefix: &str, n: usize, checkpoint_s: u32) -> anyhow::Result<Vec<String>> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i:03}");
            let file = dir.join(format!("{name}.yaml"));
            std::fs::write(
                &file,
                format!(
                    "apiVersion: rubick/v1\nkind: Job\nname: {name}\nmodel: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}\niterations: 1000000\nrequest: {{ gpus: 1, plan: ga }}\nlaunch: {{ version: 1, command: [sh, {}], env: {{ CHECKPOINT_S: \"{checkpoint_s}\" }}, stopTimeoutS: 10 }}\n",
                    dir.join("work.sh").display()
                ),
            )?;
            Ok(file.display().to_string())
        })
        .collect()
}

fn schedule(dir: &Path, round: u64, jobs: &[(String, &str, u32)]) -> anyhow::Result<String> {
    let mut text =
        format!("apiVersion: rubick/v1\nkind: Schedule\ncluster: bench\nround: {round}\npolicy: bench\nassignments:\n");
    for (job, plan, gpu) in jobs {
        text.push_str(&format!(
            "  - {{ job: {job}, plan: {plan}, nodes: [{{ node: n-0, gpus: [{gpu}], cpus: 1, hostMemoryGib: 1 }}], predictedThroughput: 1, change: started }}\n"
        ));
    }
    text.push_str("totals: { gpusUsed: 0, gpusTotal: 0, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }\nobjective: 0\nsolver: { method: bench, status: optimal }\n");
    let path = dir.join(format!("round{round}.yaml"));
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    std::fs::write(d.join("work.sh"), WORKLOAD)?;
    let files = job_files(d, "j", 100, 0)?;
    let jobs: Vec<(String, &str, u32)> = (0..100).map(|i| (format!("j{i:03}"), "dp1-tp1-pp1-mb4-ga4", i)).collect();
    // The schedules' cluster (one node `n-0` of 100 worker slots): without one, apply
    // refuses a schedule asking for more cores than this machine has.
    std::fs::write(
        d.join("cluster.yaml"),
        "apiVersion: rubick/v1\nkind: Cluster\nname: bench\nnodeGroups:\n  - { name: n, count: 1, gpuType: slot, gpusPerNode: 100, gpuMemoryGib: 80, cpuCores: 100, hostMemoryGib: 1000, nvlinkGBps: 100, interNodeGBps: 10, pcieGBps: 10 }\n",
    )?;
    let cluster = d.join("cluster.yaml").display().to_string();
    let mut args = vec!["submit"];
    args.extend(files.iter().map(String::as_str));
    rr(d, &args)?;
    let round1 = schedule(d, 1, &jobs)?;
    rr(d, &["apply", &round1, "--cluster", &cluster])?;
    let mut noop = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        rr(d, &["apply", &round1, "--cluster", &cluster])?;
        noop.push(start.elapsed().as_secs_f64() * 1e3);
    }
    println!("bench: apply_noop_ms {:.1} ms", median(noop));
    // The same without the state's parsed copy (state.cache.json): the YAML parsed.
    let mut uncached = Vec::new();
    for _ in 0..5 {
        std::fs::remove_file(d.join("state/state.cache.json"))?;
        let start = Instant::now();
        rr(d, &["apply", &round1, "--cluster", &cluster])?;
        uncached.push(start.elapsed().as_secs_f64() * 1e3);
    }
    println!("bench: apply_noop_uncached_ms {:.1} ms", median(uncached));
    if std::env::var_os("RUBICK_BENCH_TRACE").is_some() {
        let out = Command::new(binary())
            .args(["apply", &round1, "--cluster", &cluster, "--state"])
            .arg(d.join("state"))
            .env("RUST_LOG", "rubick_run=debug")
            .output()?;
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    if std::env::var("RUBICK_BENCH_ONLY").is_ok_and(|o| o == "noop") {
        rr(d, &["apply", &schedule(d, 2, &[])?, "--cluster", &cluster])?;
        return Ok(());
    }
    // Reconfigure job j000 back and forth between two plans (same GPU), 5 times.
    let mut overhead = Vec::new();
    for k in 0..5u64 {
        let plan = if k % 2 == 0 { "dp1-tp1-pp1-mb2-ga8" } else { "dp1-tp1-pp1-mb4-ga4" };
        let mut next = jobs.clone();
        next[0].1 = plan;
        let path = schedule(d, 2 + k, &next)?;
        std::thread::sleep(std::time::Duration::from_millis(500));
        let start = Instant::now();
        rr(d, &["apply", &path, "--cluster", &cluster])?;
        let wall = start.elapsed().as_secs_f64();
        let state: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(d.join("state/state.yaml"))?)?;
        let stops = state["jobs"]["j000"]["reconfigurations"].as_sequence().map_or(0, Vec::len);
        let stop_s = state["jobs"]["j000"]["reconfigurations"][stops - 1]["stopS"].as_f64().unwrap_or(0.0);
        overhead.push(wall - stop_s);
    }
    println!("bench: reconfigure_overhead_s {:.3} s", median(overhead));
    let out = Command::new(binary()).args(["status", "--state"]).arg(d.join("state")).output()?;
    anyhow::ensure!(out.status.success());
    for i in 0..100 {
        rr(d, &["stop", &format!("j{i:03}")])?;
    }
    // 20 jobs, each checkpointing for 2 s, all reconfigured by one apply.
    let slow = d.join("slow");
    let files = job_files(d, "s", 20, 2)?;
    let mut args = vec!["submit"];
    args.extend(files.iter().map(String::as_str));
    rr_in(&slow, &args)?;
    let at = |plan| (0..20).map(|i| (format!("s{i:03}"), plan, i)).collect::<Vec<(String, &str, u32)>>();
    rr_in(&slow, &["apply", &schedule(d, 100, &at("dp1-tp1-pp1-mb4-ga4"))?, "--cluster", &cluster])?;
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let round = schedule(d, 101, &at("dp1-tp1-pp1-mb2-ga8"))?;
    let start = Instant::now();
    rr_in(&slow, &["apply", &round, "--cluster", &cluster])?;
    println!("bench: apply_reconfigure_20_jobs_s {:.2} s", start.elapsed().as_secs_f64());
    // All preempted together by an empty round: no run outlives the bench.
    rr_in(&slow, &["apply", &schedule(d, 102, &[])?, "--cluster", &cluster])?;
    Ok(())
}
