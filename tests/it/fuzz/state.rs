//! Mutated states through every `rubick-run` command: `state.yaml`, its cache
//! (`state.cache.json`, under the first line that keys it to the YAML) and a run's pid
//! file, mutated at random (the artifact mutations of [`super::mutate`], and handles,
//! pid files and marks that name processes that are not the state's), each case one
//! command on a scratch state whose job `a` runs (a marked `sleep`), beside decoys that
//! are not its runs: a process in a group of its own, one carrying the mark of a run
//! outside the state, one carrying another state's mark. A case passes when the
//! command exits 0, 1 or 2 without a panic and every decoy lives.
//!
//! `cargo test -p rubick-tests --test it fuzz::state` runs FUZZ_STATE_CASES cases
//! (default 2,000); `make fuzz` runs more.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use rubick_planner::rng::SplitMix64;
use rubick_tests::{Reaper, alive, binary};

/// A `sleep` in a process group of its own, carrying `mark` (a run's metrics path) when
/// given. Killed when dropped.
struct Sleeper(Child);

impl Sleeper {
    fn start(mark: Option<&Path>) -> Sleeper {
        let mut c = Command::new("sleep");
        c.arg("3600").process_group(0);
        if let Some(mark) = mark {
            c.env("RUBICK_METRICS", mark);
        }
        Sleeper(c.spawn().expect("sleep starts"))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Whether it lives; reaps it when it died.
    fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None)) && alive(&self.pid().to_string())
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const JOB: &str = "apiVersion: rubick/v1
kind: Job
name: NAME
model: { name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }
iterations: 100
request: { gpus: 1, plan: ga }
launch: { version: 1, command: ['true'], stopTimeoutS: 2 }
";

/// The state's first line of a cache of `yaml` (rubick-run's `cache_key`; checked
/// against what rubick-run writes when the harness starts).
fn cache_key(yaml: &str) -> String {
    let digest = rubick_launch::digest(yaml.as_bytes());
    format!("rubick-run {} state 1 yaml {} {digest:016x}", env!("CARGO_PKG_VERSION"), yaml.len())
}

struct Tree {
    dir: PathBuf,
    root: PathBuf,
    /// `state.yaml` with job `a` running under `{PID}` (its run's wrapper) and `b` queued.
    template: String,
}

impl Tree {
    fn attempt(&self) -> PathBuf {
        self.root.join("jobs/a/attempt-1")
    }

    fn rr(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = Command::new(binary("rubick-run"))
            .args(args)
            .arg("--state")
            .arg(&self.root)
            .args(["--lock-wait", "0"])
            .current_dir(&self.dir)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn tree(dir: &Path) -> Tree {
    for name in ["a", "b", "c"] {
        std::fs::write(dir.join(format!("{name}.yaml")), JOB.replace("NAME", name)).unwrap();
    }
    std::fs::write(
        dir.join("r.yaml"),
        "apiVersion: rubick/v1\nkind: Schedule\ncluster: box\nround: 1\npolicy: test\nassignments:\n  \
         - { job: a, plan: dp1-tp1-pp1-mb4-ga4, nodes: [{ node: local-0, gpus: [0], cpus: 1, hostMemoryGib: 1 }], predictedThroughput: 1, change: started }\n  \
         - { job: b, plan: dp1-tp1-pp1-mb4-ga4, nodes: [{ node: local-0, gpus: [1], cpus: 1, hostMemoryGib: 1 }], predictedThroughput: 1, change: started }\n\
         totals: { gpusUsed: 0, gpusTotal: 4, cpusUsed: 0, hostMemoryGibUsed: 0, normalizedThroughput: 0 }\nobjective: 0\nsolver: { method: test, status: optimal }\n",
    )
    .unwrap();
    let mut t = Tree { dir: dir.to_path_buf(), root: dir.join("state"), template: String::new() };
    let (code, err) = t.rr(&["submit", "a.yaml", "b.yaml"]);
    assert_eq!(code, Some(0), "{err}");
    let root = t.root.canonicalize().unwrap();
    t.root = root;
    let text = std::fs::read_to_string(t.root.join("state.yaml")).unwrap();
    let mut state: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let a = &mut state["jobs"]["a"];
    a["status"] = "running".into();
    a["attempts"] = 1.into();
    let run = format!(
        "{{ plan: dp1-tp1-pp1-mb4-ga4, nodes: [{{ node: local-0, gpus: [0], cpus: 1, hostMemoryGib: 1 }}], attempt: 1, phase: running, handle: '{{PID}}@{}', startedUnixS: 1 }}",
        t.attempt().display()
    );
    a["run"] = serde_yaml_ng::from_str(&run).unwrap();
    state["backend"] = "local".into();
    t.template = serde_yaml_ng::to_string(&state).unwrap();
    std::fs::create_dir_all(t.attempt()).unwrap();
    t
}

/// One mutation of the handle, the pid file or a mark-bearing path, naming one of the
/// decoys, init, every process, or another run's directory.
fn targeted(text: &str, rng: &mut SplitMix64, decoys: &[u32], tree: &Tree, other: &Path, pid: u32) -> String {
    let d = decoys[rng.below(decoys.len() as u64) as usize];
    let own = tree.attempt();
    let choices = [
        d.to_string(),
        "1".to_owned(),
        "0".to_owned(),
        "-1".to_owned(),
        format!("1@{}", own.display()),
        format!("-1@{}", own.display()),
        format!("{d}@{}", own.display()),
        format!("{d}@{}", other.display()),
        format!("{d}@{}", tree.dir.join("elsewhere").display()),
        format!("{pid}@{}", tree.root.join("jobs/b/attempt-1").display()),
        format!("{pid}@{}/../state/jobs/a/attempt-1", tree.root.display()),
        format!("{d}@{}/jobs/a/attempt-1/../../../elsewhere", tree.root.display()),
    ];
    let pick = &choices[rng.below(choices.len() as u64) as usize];
    let handle = format!("{pid}@{}", own.display());
    text.replacen(&handle, pick, 1)
}

/// Runs `cases` cases from `seed`; `(cases, cases whose state a command accepted)`.
pub fn fuzz_states(cases: u64, seed: u64) -> (u64, u64) {
    let scratch = tempfile::tempdir().unwrap();
    let _reaper = Reaper(scratch.path().to_path_buf());
    let t = tree(scratch.path());
    // The decoys: not this state's runs.
    let other = scratch.path().join("other/state/jobs/a/attempt-1");
    std::fs::create_dir_all(&other).unwrap();
    let elsewhere = scratch.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let mut decoys = [
        Sleeper::start(None),
        Sleeper::start(Some(&elsewhere.join("metrics.jsonl"))),
        Sleeper::start(Some(&other.join("metrics.jsonl"))),
    ];
    std::fs::write(other.join("pgid"), format!("{}\n", decoys[2].pid())).unwrap();
    let decoy_pids: Vec<u32> = decoys.iter().map(Sleeper::pid).collect();
    let mark = t.attempt().join("metrics.jsonl");
    let mut run = Sleeper::start(Some(&mark));
    let commands: [&[&str]; 10] = [
        &["status"],
        &["status", "--format", "prometheus"],
        &["jobs"],
        &["stop", "a"],
        &["stop", "b"],
        &["delete", "b"],
        &["logs", "a"],
        &["apply", "r.yaml"],
        &["apply", "r.yaml", "--dry-run"],
        &["submit", "c.yaml"],
    ];
    // The key this harness computes is the one rubick-run writes.
    let base = t.template.replace("{PID}", &run.pid().to_string());
    std::fs::write(t.root.join("state.yaml"), &base).unwrap();
    let (code, err) = t.rr(&["jobs"]);
    assert_eq!(code, Some(0), "the base state is valid: {err}");
    let cache = std::fs::read_to_string(t.root.join("state.cache.json")).unwrap();
    assert_eq!(cache.lines().next(), Some(cache_key(&base).as_str()), "the cache's key as rubick-run writes it");
    let mut rng = SplitMix64::new(seed);
    let mut accepted = 0;
    for case in 0..cases {
        if !run.alive() {
            run = Sleeper::start(Some(&mark));
        }
        let base = t.template.replace("{PID}", &run.pid().to_string());
        // The case's files: a mutated state.yaml, or the base state.yaml and a mutated
        // cache under its key; now and then a pid file naming a decoy.
        for stale in ["state.cache.json", "state.seal"] {
            let _ = std::fs::remove_file(t.root.join(stale));
        }
        let _ = std::fs::remove_dir_all(t.root.join("jobs/b"));
        let _ = std::fs::remove_dir_all(t.root.join("jobs/c"));
        for extra in std::fs::read_dir(t.root.join("jobs/a")).unwrap().filter_map(Result::ok) {
            if extra.file_name() != "attempt-1" && extra.file_name() != "checkpoints" {
                let _ = std::fs::remove_dir_all(extra.path());
            }
        }
        let mut yaml = base.clone();
        let mut cache = None;
        match rng.below(4) {
            0 => yaml = targeted(&base, &mut rng, &decoy_pids, &t, &other, run.pid()),
            1 => {
                let state: serde_yaml_ng::Value = serde_yaml_ng::from_str(&base).unwrap();
                let json = serde_json::to_string_pretty(&serde_json::to_value(&state).unwrap()).unwrap();
                let json = if rng.below(2) == 0 {
                    targeted(&json, &mut rng, &decoy_pids, &t, &other, run.pid())
                } else {
                    super::mutate(&json, &mut rng)
                };
                cache = Some(format!("{}\n{json}", cache_key(&base)));
            }
            _ => {
                for _ in 0..1 + rng.below(2) {
                    yaml = super::mutate(&yaml, &mut rng);
                }
            }
        }
        std::fs::write(t.root.join("state.yaml"), &yaml).unwrap();
        if let Some(cache) = &cache {
            std::fs::write(t.root.join("state.cache.json"), cache).unwrap();
        }
        let pid_file = if rng.below(5) == 0 { decoy_pids[rng.below(3) as usize] } else { run.pid() };
        std::fs::write(t.attempt().join("pgid"), format!("{pid_file}\n")).unwrap();
        let args = commands[rng.below(commands.len() as u64) as usize];
        let (code, err) = t.rr(args);
        if code == Some(0) {
            accepted += 1;
        }
        let report = || {
            let report = format!(
                "case {case} (seed {seed}): rubick-run {args:?} exited {code:?}:\n{err}\nstate.yaml:\n{yaml}\ncache:\n{}",
                cache.as_deref().unwrap_or("(none)")
            );
            let _ = std::fs::write(std::env::temp_dir().join("rubick-fuzz-state-finding.txt"), &report);
            report
        };
        assert!(matches!(code, Some(0..=2)) && !err.contains("panicked"), "{}", report());
        for (k, decoy) in decoys.iter_mut().enumerate() {
            assert!(decoy.alive(), "decoy {k} was signalled: {}", report());
        }
    }
    (cases, accepted)
}

/// Found by an adversarial pass (issue 40): a hand-edited handle made `stop` signal
/// any process group, or every process; an edited cache hid a live run.
#[test]
fn mutated_states_never_make_rubick_run_signal_what_is_not_their_run() {
    let cases = std::env::var("FUZZ_STATE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let seed = std::env::var("FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let start = std::time::Instant::now();
    let (n, accepted) = fuzz_states(cases, seed);
    let secs = start.elapsed().as_secs_f64();
    // Some cases must get through validation, or the signalling code is never reached.
    assert!(accepted * 20 >= n, "only {accepted} of {n} mutated states were accepted by a command");
    println!("bench: fuzz_state_cases {n} cases");
    println!("bench: fuzz_state_cases_accepted_pct {:.1} %", 100.0 * accepted as f64 / n.max(1) as f64);
    println!("bench: fuzz_state_cases_per_s {:.1} cases/s", n as f64 / secs.max(1e-9));
}
