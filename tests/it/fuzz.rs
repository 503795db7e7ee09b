//! A fuzzing harness: artifacts mutated at random — numbers replaced by
//! absurd ones, lines dropped, repeated or swapped, bytes flipped, the text cut — fed
//! through every artifact parser and, when they parse, through the code that consumes
//! them (plan spaces, memory estimates, predictions, a planning round on small
//! clusters, the profile table reader). A case passes when it is an error or a result:
//! never a panic, never over a second of CPU. Deterministic for a seed.
//!
//! `cargo test -p rubick-tests --test it fuzz::` runs a short pass (FUZZ_CASES, default 2,000);
//! `make fuzz` a long one in release (1,000,000), printing `bench:`-style figures.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use rubick_core::artifact::parse_yaml;
use rubick_core::{Cluster, Job, JobBatch};
use rubick_milp::Milp;
use rubick_model::MemoryEstimator;
use rubick_planner::rng::SplitMix64;
use rubick_tests::repo;

mod state;

/// Values that have broken code: zero, negatives, huge, tiny, not-a-number, the integer
/// limits.
const ABSURD: &[&str] = &[
    "0",
    "-1",
    "1e300",
    "-1e300",
    "1e-300",
    ".nan",
    ".inf",
    "-.inf",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "2147483648",
    "9007199254740993",
    "0.5",
    "65536",
    "1048576",
    "\"\"",
    "null",
    "[]",
    "{}",
];

/// The seeds: the project's own (valid) example artifacts, then the bad-input corpus;
/// and how many of them are valid.
fn corpus() -> (Vec<String>, usize) {
    let root = repo();
    let mut texts: Vec<String> = [
        "data/cluster-a800-8x8.yaml",
        "data/cluster-a800-8x8-cpu-tight.yaml",
        "data/jobs-paper.yaml",
        "examples/pytorch/job.yaml",
    ]
    .iter()
    .map(|p| std::fs::read_to_string(root.join(p)).unwrap())
    .collect();
    texts.push(SCHEDULE.to_owned());
    texts.push(PERF_MODEL.to_owned());
    texts.push(PROFILE.to_owned());
    let valid = texts.len();
    let bad = root.join("tests/bad-input");
    let mut names: Vec<_> = std::fs::read_dir(&bad).unwrap().filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    texts.extend(names.iter().filter_map(|p| std::fs::read_to_string(p).ok()));
    (texts, valid)
}

const SCHEDULE: &str = "apiVersion: rubick/v1
kind: Schedule
cluster: a800-8x8
round: 3
policy: rubick
assignments:
  - { job: a, plan: dp2-tp1-pp1-mb4-ga2, nodes: [{ node: a800-0, gpus: [0, 1], cpus: 16, hostMemoryGib: 64 }], predictedThroughput: 12.5, change: started, roundsSinceChange: 0, reason: x }
  - { job: b, predictedThroughput: 0, change: pending }
totals: { gpusUsed: 2, gpusTotal: 64, cpusUsed: 16, hostMemoryGibUsed: 64, normalizedThroughput: 1 }
objective: 1
solver: { method: heuristic, status: heuristic }
";

const PERF_MODEL: &str = "apiVersion: rubick/v1
kind: PerfModel
model: bert
form: rubick-whitebox/2
parameters:
  compute_s_per_sample: { value: 0.01, stdError: 0.001 }
  gc_factor: { value: 1.3 }
  step_s_per_layer: { value: 0.0002 }
fittedFrom: { source: profile.csv, rows: 4 }
diagnostics:
  meanRelError: 0.05
  rows:
    - { plan: dp8-tp1-pp1-mb4-ga1-z2, placement: '8', measuredS: 0.35, predictedS: 0.34 }
";

const PROFILE: &str = "job,model,plan,placement,status,iter_time_s,iter_time_sd_s,iterations
j,bert,dp1-tp1-pp1-mb16-ga2,1,ok,2.1,0.01,10
j,bert,dp2-tp1-pp1-mb16-ga1-z2,2,ok,1.12,0.02,10
j,bert,dp8-tp1-pp1-mb4-ga1-z2,8,oom,,,
";

/// One mutation of `text`.
fn mutate(text: &str, rng: &mut SplitMix64) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if lines.is_empty() {
        return String::new();
    }
    let i = rng.below(lines.len() as u64) as usize;
    match rng.below(8) {
        // A number (or any scalar after a `: `) replaced by an absurd value.
        0..=2 => {
            let absurd = ABSURD[rng.below(ABSURD.len() as u64) as usize];
            let line = &lines[i];
            let spots: Vec<usize> = line.match_indices(": ").map(|(k, _)| k + 2).collect();
            if let Some(&at) = spots.get(rng.below(spots.len().max(1) as u64) as usize) {
                let end = line[at..].find([',', '}', ' ']).map_or(line.len(), |e| at + e);
                lines[i] = format!("{}{absurd}{}", &line[..at], &line[end..]);
            } else if line.contains(',') {
                let cells: Vec<&str> = line.split(',').collect();
                let k = rng.below(cells.len() as u64) as usize;
                let mut cells: Vec<String> = cells.iter().map(|c| (*c).to_owned()).collect();
                cells[k] = absurd.to_owned();
                lines[i] = cells.join(",");
            }
        }
        3 => {
            lines.remove(i);
        }
        4 => {
            let copy = lines[i].clone();
            let n = 1 + rng.below(3) as usize;
            for _ in 0..n {
                lines.insert(i, copy.clone());
            }
        }
        5 => {
            let j = rng.below(lines.len() as u64) as usize;
            lines.swap(i, j);
        }
        6 => {
            let mut bytes = lines[i].clone().into_bytes();
            if !bytes.is_empty() {
                let k = rng.below(bytes.len() as u64) as usize;
                const NOISE: &[u8] = b" -:{}[],.0123456789e#&*!|>'\"\t";
                bytes[k] = NOISE[rng.below(NOISE.len() as u64) as usize];
            }
            lines[i] = String::from_utf8_lossy(&bytes).into_owned();
        }
        _ => lines.truncate(i.max(1)),
    }
    lines.join("\n") + "\n"
}

/// Feeds one text to every parser and, when it parses, to its consumers; whether some
/// parser accepted it.
fn exercise(text: &str, cluster: &Cluster, jobs: &[Job]) -> bool {
    let estimator = MemoryEstimator::default();
    let mut valid = false;
    if let Ok(c) = parse_yaml::<Cluster>(text) {
        valid = true;
        let small = c.total_gpus() <= 64;
        for job in jobs.iter().take(3) {
            for group in &c.node_groups {
                for gpus in [1, group.gpus_per_node.min(8)] {
                    let _ = rubick_model::space::PlanSpace::enumerate(
                        &job.model,
                        gpus,
                        group,
                        &estimator,
                        rubick_model::space::Dimensions::of(job.supports()),
                    );
                }
            }
        }
        if small {
            round(&c, &jobs[..jobs.len().min(4)]);
        }
    }
    let parsed_jobs: Option<Vec<Job>> =
        parse_yaml::<JobBatch>(text).ok().map(|b| b.jobs).or_else(|| parse_yaml::<Job>(text).ok().map(|j| vec![j]));
    if let Some(js) = parsed_jobs {
        valid = true;
        for job in js.iter().take(4) {
            let group = &cluster.node_groups[0];
            for gpus in [1, 8] {
                let space = rubick_model::space::PlanSpace::enumerate(
                    &job.model,
                    gpus,
                    group,
                    &estimator,
                    rubick_model::space::Dimensions::of(job.supports()),
                );
                let params = rubick_model::belief::default_params(&job.model);
                let links = rubick_model::perfmodel::Links::of_cluster(cluster);
                for entry in space.plans.iter().take(5) {
                    if let Some(placement) = rubick_core::Placement::packed(gpus, group.gpus_per_node) {
                        let _ = rubick_model::perfmodel::predict(&job.model, &entry.plan, &placement, &links, &params);
                    }
                }
            }
        }
        round(cluster, &js[..js.len().min(6)]);
    }
    if let Ok(s) = parse_yaml::<rubick_core::schedule::Schedule>(text) {
        valid = true;
        let _ = rubick_core::artifact::to_yaml(&s);
    }
    if let Ok(m) = parse_yaml::<rubick_model::perf::PerfModel>(text)
        && let Ok(params) = m.params()
        && let Some(spec) = &m.model_spec
    {
        let placement = rubick_core::Placement::packed(8, 8).unwrap();
        let plan: rubick_core::Plan = "dp8-tp1-pp1-mb2-ga1".parse().unwrap();
        let links = rubick_model::perfmodel::Links::of_cluster(cluster);
        let _ = m.predict_interval(&params, &plan, &placement, &links);
        let _ = rubick_model::perfmodel::predict(spec, &plan, &placement, &links, &params);
    }
    valid |= parse_yaml::<rubick_core::ModelSpec>(text).is_ok();
    let _ = rubick_model::external::parse("fuzz", text);
    let _ = rubick_model::external::csv_records(text);
    valid
}

/// One heuristic round of `jobs` on `cluster` (FLOPs-based models).
fn round(cluster: &Cluster, jobs: &[Job]) {
    let config = rubick_planner::PlannerConfig::default();
    let believed = rubick_plan::round::on_priors(jobs.to_vec());
    let Ok(inputs) = rubick_plan::round::job_inputs(std::path::Path::new("<fuzz>"), believed, cluster, &config, None)
    else {
        return;
    };
    let _ = rubick_planner::round::plan_round(
        cluster,
        &config,
        &inputs,
        rubick_planner::round::Solver::Heuristic,
        &Milp::new(Duration::from_secs(1)),
        0,
    );
}

/// The CPU time this thread has used, in seconds: a case is bounded by the work it
/// does, not by how long it waited for a core on a loaded machine.
fn thread_cpu_s() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Runs `cases` cases from `seed`; `(cases, seconds, slowest case seconds, cases some
/// parser accepted)`. Panics with the input that failed.
pub fn fuzz(cases: u64, seed: u64) -> (u64, f64, f64, u64) {
    let (seeds, valid) = corpus();
    let cluster: Cluster = parse_yaml(&seeds[0]).unwrap();
    let jobs: Vec<Job> = parse_yaml::<JobBatch>(&seeds[2]).unwrap().jobs;
    let mut rng = SplitMix64::new(seed);
    // The panics the harness catches would print their message: keep the output to the
    // finding itself (the hook is restored before a finding is reported).
    std::panic::set_hook(Box::new(|_| {}));
    let start = Instant::now();
    let mut slowest = 0.0f64;
    let mut accepted = 0;
    for case in 0..cases {
        // Mostly a valid artifact mutated once: most cases still parse and reach the code
        // that consumes them; sometimes the bad-input corpus, mutated further.
        let pick = if rng.below(5) == 0 { rng.below(seeds.len() as u64) } else { rng.below(valid as u64) };
        let base = &seeds[pick as usize];
        let text = catch_unwind(AssertUnwindSafe(|| {
            let mut text = mutate(base, &mut rng);
            for _ in 0..rng.below(4).saturating_sub(2) {
                text = mutate(&text, &mut rng);
            }
            text
        }));
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                let _ = std::panic::take_hook();
                let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
                panic!("case {case} (seed {seed}): the mutator itself failed ({why}) on:\n{base}");
            }
        };
        let (t, cpu) = (Instant::now(), thread_cpu_s());
        let outcome = catch_unwind(AssertUnwindSafe(|| exercise(&text, &cluster, &jobs)));
        slowest = slowest.max(t.elapsed().as_secs_f64());
        let took = thread_cpu_s() - cpu;
        if outcome.as_ref().is_ok_and(|valid| *valid) {
            accepted += 1;
        }
        if let Err(e) = outcome {
            let _ = std::panic::take_hook();
            let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()));
            let report = format!("case {case} (seed {seed}) panicked ({}) on:\n{text}", why.unwrap_or_default());
            let _ = std::fs::write(std::env::temp_dir().join("rubick-fuzz-finding.txt"), &report);
            panic!("{report}");
        }
        if took >= 1.0 {
            let _ = std::panic::take_hook();
            panic!("case {case} (seed {seed}) took {took:.2} s of CPU on:\n{text}");
        }
    }
    let _ = std::panic::take_hook();
    (cases, start.elapsed().as_secs_f64(), slowest, accepted)
}

#[test]
fn mutated_artifacts_never_panic_or_hang() {
    let cases = std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let seed = std::env::var("FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let (n, secs, slowest, accepted) = fuzz(cases, seed);
    // Most mutations must still parse, or the consumers are never reached.
    assert!(accepted * 10 >= n, "only {accepted} of {n} cases parsed: the mutations are too destructive");
    println!("bench: fuzz_cases {n} cases");
    println!("bench: fuzz_cases_per_s {:.0} cases/s", n as f64 / secs.max(1e-9));
    println!("bench: fuzz_slowest_case_ms {:.1} ms", slowest * 1e3);
    println!("bench: fuzz_cases_accepted_pct {:.1} %", 100.0 * accepted as f64 / n.max(1) as f64);
}

/// The same mutations through the tools themselves: every subcommand that reads an
/// artifact answers 0, 1 or 2 — never a panic (101) or a signal — and an error leaves
/// no output. A few hundred cases (processes are slow); FUZZ_CLI_CASES for more.
#[test]
fn mutated_artifacts_through_every_subcommand() {
    let cases: u64 = std::env::var("FUZZ_CLI_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let (seeds, valid) = corpus();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = repo().join("data");
    let cluster = data.join("cluster-a800-8x8.yaml").display().to_string();
    let jobs = data.join("jobs-paper.yaml").display().to_string();
    let mut rng = SplitMix64::new(7);
    for case in 0..cases {
        let pick = if rng.below(5) == 0 { rng.below(seeds.len() as u64) } else { rng.below(valid as u64) };
        let text = mutate(&seeds[pick as usize], &mut rng);
        let input = d.join("input.yaml");
        std::fs::write(&input, &text).unwrap();
        let input = input.display().to_string();
        let out = d.join("out.yaml");
        let _ = std::fs::remove_file(&out);
        let o = out.display().to_string();
        let state = d.join(format!("state-{case}")).display().to_string();
        let commands: Vec<(&str, Vec<&str>)> = vec![
            ("rubick-plan", vec!["check", &input]),
            ("rubick-plan", vec!["space", &input, "--cluster", &cluster, "--gpus", "8", "-o", &o]),
            ("rubick-plan", vec!["space", &jobs, "--cluster", &input, "--gpus", "8", "-o", &o]),
            ("rubick-plan", vec!["schedule", "--cluster", &cluster, "--jobs", &input, "-o", &o]),
            ("rubick-plan", vec!["schedule", "--cluster", &input, "--jobs", &jobs, "-o", &o]),
            ("rubick-fit", vec!["check", &input]),
            ("rubick-run", vec!["check", &input]),
            ("rubick-run", vec!["submit", &input, "--state", &state]),
        ];
        for (tool, args) in &commands {
            let run = rubick_tests::run_in(d, tool, args);
            let ok = matches!(run.code, Some(0..=2));
            assert!(
                ok && !run.stderr.contains("panicked"),
                "case {case}: {tool} {args:?} exited {:?}:\n{}\non:\n{text}",
                run.code,
                run.stderr
            );
            // An error (exit 2) writes nothing; a negative answer (exit 1) may be a listing.
            if run.code == Some(2) {
                assert!(!out.exists(), "case {case}: {tool} {args:?} failed but wrote {o}");
            }
            let _ = std::fs::remove_file(&out);
        }
    }
}
