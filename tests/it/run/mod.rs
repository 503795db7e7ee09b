//! End-to-end tests of `rubick-run`, by subject: [`rounds`] (start, reconfigure and
//! preempt jobs, on the local backend and a real Slurm; the cron loop), [`recovery`] (a
//! `rubick-run` killed at every phase, then repaired by the next; lost records; a full
//! disk), [`refusals`] (bad input refused before anything is done), [`processes`] (no
//! process of a run outlives it), [`commands`] (dry run, logs, status, relative
//! paths), [`slurm`] (runs across the test Slurm's nodes), [`kubernetes`]. A stand-in
//! workload (a shell script speaking the job contract: metric lines, checkpoint on
//! SIGUSR1, resume from the checkpoint) keeps them fast; this module is their kit, also
//! used by `safety_net.rs` and `trust.rs`; the PyTorch workload's rounds are in
//! `pytorch.rs`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rubick_tests::binary;

mod commands;
mod kubernetes;
mod processes;
mod recovery;
mod refusals;
mod rounds;
mod slurm;

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
