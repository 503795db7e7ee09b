//! `make bench`: every figure as one line `bench: NAME VALUE UNIT`.
//!
//! Figures measured in one run, so ratios between them are meaningful on a shared,
//! noisy machine.

use std::time::Instant;

use rubick_io::reference::{ReferenceData, locate};
use rubick_milp::Milp;
use rubick_model::reference::{Agreement, agreement_table, memory_agreement};
use rubick_model::space::Dimensions;
use rubick_model::{MemoryEstimator, PlanSpace};
use rubick_planner::PlannerConfig;
use rubick_planner::round::{Solver, plan_round};
use rubick_sim::trace::load_trace;
use rubick_sim::truth::TruthMode;

/// The allocator `rubick-plan` runs with (its `main.rs`), so the figures are the tool's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn lookup(name: &str) -> anyhow::Result<&'static rubick_policy::Registration> {
    rubick_policy::lookup(name).map_err(anyhow::Error::msg)
}
use rubick_planner::synth;
use std::time::Duration;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn round_ms(gpus: u32, jobs: u32, policy: Solver, runs: usize) -> anyhow::Result<(f64, f64)> {
    let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
    let (cluster, inputs) = synth::instance(gpus, jobs, 1, &config)?;
    let mut samples = Vec::new();
    let mut objective = 0.0;
    for _ in 0..runs {
        let start = Instant::now();
        let r = plan_round(&cluster, &config, &inputs, policy, &Milp::new(Duration::from_secs(10)), 0)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        samples.push(start.elapsed().as_secs_f64());
        objective = r.outcome.schedule.objective;
    }
    Ok((median(samples) * 1e3, objective))
}

/// The planner's figures (issue: rubick-plan one round).
fn planner_figures() -> anyhow::Result<()> {
    let (ms, _) = round_ms(64, 60, Solver::Heuristic, 21)?;
    println!("bench: plan_64gpu_60jobs_ms {ms:.3} ms");
    let mut last = 0.0;
    for gpus in [256u32, 512, 1024, 2048, 4096] {
        let jobs = (u64::from(gpus) * 2000 / 4096) as u32;
        let (ms, _) = round_ms(gpus, jobs, Solver::Heuristic, if gpus >= 2048 { 3 } else { 5 })?;
        let growth = if last > 0.0 { format!(" ({:.2}x the previous size)", ms / last) } else { String::new() };
        eprintln!("heuristic round {gpus} GPUs / {jobs} jobs: {ms:.1} ms{growth}");
        println!("bench: plan_{gpus}gpu_{jobs}jobs_ms {ms:.3} ms");
        last = ms;
    }
    // Issues 21 and 22: the largest rounds (65,536 GPUs, 20,000 and 32,000 jobs), once,
    // and a JobBatch's check at 20,000 and 80,000 jobs (linear: the ratio is about 4).
    let (ms, _) = round_ms(65_536, 20_000, Solver::Heuristic, 1)?;
    println!("bench: plan_65536gpu_20000jobs_ms {ms:.1} ms");
    let (ms, _) = round_ms(65_536, 32_000, Solver::Heuristic, 1)?;
    println!("bench: plan_65536gpu_32000jobs_s {:.3} s", ms / 1e3);
    // The heuristic's indexes against its exhaustive form (same decision), one run.
    {
        use rubick_planner::curves::Evaluator;
        use rubick_planner::{CurveBook, heuristic};
        let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
        let (cluster, inputs) = synth::instance(4096, 2000, 1, &config)?;
        let mut evaluator = Evaluator::new(&cluster, &config);
        let jobs = inputs.iter().map(|i| evaluator.job_curves(i, None)).collect();
        let mut book = CurveBook::new(jobs, &cluster);
        // As `plan_round` does when running jobs held by the churn rules leave a
        // guarantee no room: they may be paused.
        if heuristic::solve(&book, &cluster, &inputs, &config).is_err() {
            book.soften_locks();
        }
        let time = |f: &dyn Fn() -> bool| {
            let mut samples = Vec::new();
            for _ in 0..3 {
                let start = Instant::now();
                anyhow::ensure!(f(), "the heuristic failed on the synthetic round");
                samples.push(start.elapsed().as_secs_f64() * 1e3);
            }
            Ok(median(samples))
        };
        let indexed = time(&|| heuristic::solve(&book, &cluster, &inputs, &config).is_ok())?;
        let plain = time(&|| heuristic::solve_exhaustive(&book, &cluster, &inputs, &config).is_ok())?;
        println!("bench: heuristic_4096gpu_2000jobs_ms {indexed:.1} ms");
        println!("bench: heuristic_exhaustive_over_indexed_4096gpu {:.2} x", plain / indexed);
    }
    let mut check_ms = Vec::new();
    for jobs in [20_000usize, 80_000] {
        let mut text = String::from("apiVersion: rubick/v1\nkind: JobBatch\njobs:\n");
        for i in 0..jobs {
            text.push_str(&format!(
                "  - {{ name: j{i}, model: {{ name: bert, parameters: 336297858, layers: 24, hidden: 1536, heads: 16, seqLen: 1024, globalBatch: 32 }}, iterations: 100, request: {{ gpus: 8 }} }}\n"
            ));
        }
        let start = std::time::Instant::now();
        let batch: rubick_core::JobBatch = rubick_core::artifact::parse_yaml(&text)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(batch.jobs.len() == jobs);
        println!("bench: check_jobbatch_{jobs}_jobs_ms {ms:.1} ms");
        check_ms.push(ms);
    }
    println!("bench: check_jobbatch_80k_over_20k_ratio {:.2} x", check_ms[1] / check_ms[0]);
    // The exact round at 1,024 GPUs / 256 jobs, and the heuristic against it.
    let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
    let (cluster, inputs) = synth::instance(1024, 256, 1, &config)?;
    let start = Instant::now();
    let r = plan_round(&cluster, &config, &inputs, Solver::Milp, &Milp::new(Duration::from_secs(10)), 0)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("bench: milp_256jobs_1024gpu_s {:.3} s", start.elapsed().as_secs_f64());
    println!("bench: milp_gap_pct {:.4} %", r.outcome.schedule.solver.gap.unwrap_or(f64::NAN) * 100.0);
    eprintln!("MILP status: {} ({})", r.outcome.schedule.solver.status, r.outcome.schedule.solver.method);
    let mut gaps = Vec::new();
    for (gpus, jobs) in [(64, 60), (256, 128), (1024, 256)] {
        for seed in 1..=3 {
            let (cluster, inputs) = synth::instance(gpus, jobs, seed, &config)?;
            let r = plan_round(&cluster, &config, &inputs, Solver::Milp, &Milp::new(Duration::from_secs(10)), 0)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let (Some(h), milp) = (r.heuristic_objective, r.outcome.schedule.objective) else { continue };
            let pct = if milp.abs() > 1e-12 { (milp - h) / milp.abs() * 100.0 } else { 0.0 };
            eprintln!("heuristic vs MILP, {gpus} GPUs / {jobs} jobs, seed {seed}: {h:.3} vs {milp:.3} ({pct:.2} %)");
            gaps.push(pct);
        }
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len().max(1) as f64;
    println!("bench: heuristic_vs_milp_pct {mean:.3} %");
    println!("bench: heuristic_vs_milp_max_pct {:.3} %", gaps.iter().copied().fold(0.0, f64::max));
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let root = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
    )
    .join("..");
    let cluster = rubick_plan::load_cluster(&root.join("data/cluster-a800-8x8.yaml"))?;
    let jobs = rubick_plan::load_jobs(&root.join("data/jobs-paper.yaml"))?;
    let group = &cluster.node_groups[0];
    let estimator = MemoryEstimator::default();

    // Plan space of the seven example jobs on 8 and on 64 GPUs.
    for gpus in [8, 64] {
        let mut samples = Vec::new();
        let mut plans = 0;
        for _ in 0..21 {
            let start = Instant::now();
            plans = jobs
                .iter()
                .map(|j| {
                    PlanSpace::enumerate(&j.model, gpus, group, &estimator, Dimensions::of(j.supports())).plans.len()
                })
                .sum();
            samples.push(start.elapsed().as_secs_f64());
        }
        println!("bench: plan_space_7jobs_{gpus}gpu_ms {:.3} ms", median(samples) * 1e3);
        println!("bench: plan_space_7jobs_{gpus}gpu_plans {plans} plans");
    }

    planner_figures()?;

    // The memory estimate against the reference's measured micro-batch limits.
    match locate(&root) {
        None => eprintln!("bench: skipping the memory table: ../shared/reference/rubick-artifact is absent"),
        Some(dir) => {
            let start = Instant::now();
            let data = ReferenceData::open(&dir)?;
            let rows: usize =
                data.model_names().iter().map(|m| data.measured_rows(m).map(|r| r.len())).sum::<Result<_, _>>()?;
            println!("bench: reference_load_512_rows_ms {:.3} ms", start.elapsed().as_secs_f64() * 1e3);
            println!("bench: reference_rows {rows} rows");
            let mut table = Vec::new();
            for model in data.model_names() {
                table.extend(memory_agreement(model, data.facts(model).expect("listed model"), &estimator, 80.0, 8));
            }
            eprintln!("\n{}", agreement_table(&table));
            let count = |a: Agreement| table.iter().filter(|r| r.agreement == a).count();
            println!("bench: memory_facts_total {} facts", table.len());
            println!("bench: memory_facts_agree {} facts", count(Agreement::Agree));
            println!("bench: memory_facts_fact_below_estimate {} facts", count(Agreement::FactBelowEstimate));
            println!("bench: memory_facts_fact_above_estimate {} facts", count(Agreement::FactAboveEstimate));

            // Fitting one model: K = 8 rows chosen by the selection rule, median over
            // the seven models of the median of 5 runs each.
            let links = rubick_model::perfmodel::Links::from(group);
            let mut per_model = Vec::new();
            for model in data.model_names() {
                let spec = data.model_spec(model)?.expect("listed model");
                let measured = data.measured_rows(model)?;
                let resolved = rubick_model::reference::resolve_rows(&measured, &spec, &estimator);
                let (_, obs) = rubick_model::reference::profiled_rows(&resolved, 8, links);
                let mut samples = Vec::new();
                for _ in 0..5 {
                    let start = Instant::now();
                    rubick_model::fit::fit(&spec, &obs, &rubick_model::fit::FitOptions::default())?;
                    samples.push(start.elapsed().as_secs_f64());
                }
                let ms = median(samples) * 1e3;
                eprintln!("fit {model}: {ms:.2} ms");
                per_model.push(ms);
            }
            println!("bench: fit_one_model_ms {:.2} ms", median(per_model.clone()));

            // One simulation of the 406-job base trace with Rubick (FIFO admission).
            let trace = dir.join("workloads/workload-base.csv");
            let (jobs, truth) = load_trace(&trace, &cluster, &data, TruthMode::Oracle)?;
            let config = rubick_sim::SimConfig::defaults(lookup("rubick")?, rubick_policy::Queue::Fifo);
            let mut samples = Vec::new();
            for _ in 0..5 {
                let start = Instant::now();
                rubick_sim::simulate(&cluster, &jobs, &truth, &config, |_, _| {});
                samples.push(start.elapsed().as_secs_f64());
            }
            println!("bench: simulate_base_rubick_s {:.3} s", median(samples));
            let start = Instant::now();
            let (_, oracle_truth) = load_trace(&trace, &cluster, &data, TruthMode::Oracle)?;
            println!("bench: load_trace_with_oracles_s {:.3} s", start.elapsed().as_secs_f64());
            for (model, o) in &oracle_truth.oracles {
                println!("bench: oracle_{model}_in_sample_error_pct {:.1} %", o.mean_error * 100.0);
            }
            println!("bench: fit_one_model_max_ms {:.2} ms", per_model.iter().copied().fold(0.0, f64::max));
            philly_figures(&data, &dir)?;
            philly_scales(&root, &data, &dir)?;
            sia_workloads(&root, &data, &dir)?;
            simulation_figures(&cluster, &data, &dir)?;
        }
    }
    Ok(())
}

/// The Sia artifact's Philly workloads on its heterogeneous 64-GPU cluster, with its
/// measured step times as the truth (`rubick_sim::sia`; no batch-size tuning for anyone):
/// Sia's average JCT over Rubick's, unfinished jobs counted, the mean over the workloads
/// of `SIA_WORKLOADS`, one seed without noise (the truth is the artifact's tables).
fn sia_workloads(root: &std::path::Path, data: &ReferenceData, reference: &std::path::Path) -> anyhow::Result<()> {
    let Some(dir) = reference.parent().map(|r| r.join("sia/workloads/philly")).filter(|p| p.is_dir()) else {
        eprintln!("bench: skipping the Sia workloads: ../shared/reference/sia is absent");
        return Ok(());
    };
    let cluster = rubick_plan::load_cluster(&root.join("data/cluster-sia-64.yaml"))?;
    let start = Instant::now();
    let mut ratios = Vec::new();
    for n in SIA_WORKLOADS {
        let (jobs, truth) =
            rubick_sim::trace::open_trace(&dir.join(format!("workload-{n}.csv")), &cluster, data, TruthMode::Oracle)?;
        let mut avg = Vec::new();
        for policy in ["rubick", "sia"] {
            let config = rubick_sim::SimConfig::defaults(lookup(policy)?, rubick_policy::Queue::Service);
            let r = rubick_sim::simulate(&cluster, &jobs, &truth, &config, |_, _| {});
            let s = rubick_sim::summary::summarize("sia-philly", &config, &truth, std::slice::from_ref(&r));
            avg.push(s.avg_jct_all_s.mean);
        }
        ratios.push(avg[1] / avg[0]);
    }
    println!("bench: sim_sia_philly_sia_over_rubick_avg_jct {:.3} x", ratios.iter().sum::<f64>() / ratios.len() as f64);
    println!("bench: sim_sia_philly_s {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The Sia workloads `make bench` replays: all 8 (rubick and sia; Sia's exact solve
/// takes most of the time).
const SIA_WORKLOADS: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

/// Replicas of every JCT figure: seeds with this much log-normal noise.
const SEEDS: u32 = 5;
const NOISE: f64 = 0.02;

/// The simulator's figures on the authors' base trace (the fidelity issue's bars), all
/// under the oracle truth unless named otherwise, each the mean of `SEEDS` replicas
/// with its standard deviation: avg JCT per policy and queue order, the ratios, per-model
/// JCT and extrapolated shares, guarantees on a half-guaranteed trace, Rubick under the
/// stricter and the old truths.
/// The whole Philly trace (82,247 jobs) mapped onto a 4,096-GPU cluster, and
/// a 100,000-job trace (the Philly log replayed once more after its end, from its first
/// job, until 100,000) simulated once under Rubick (FIFO), one seed.
fn philly_figures(data: &ReferenceData, reference: &std::path::Path) -> anyhow::Result<()> {
    let Some(philly) = reference.parent().map(|r| r.join("traces/philly.csv")).filter(|p| p.is_file()) else {
        eprintln!("bench: skipping the Philly figures: ../shared/reference/traces/philly.csv is absent");
        return Ok(());
    };
    let cluster = synth::cluster(4096);
    let path = philly.display().to_string();
    let start = Instant::now();
    let (mut logged, _) = rubick_sim::logs::read_philly(&path, &std::fs::read_to_string(&philly)?)?;
    let rows = rubick_sim::logs::map_jobs(&path, &logged, "philly", &cluster, data, 1, 0.0)?;
    println!("bench: trace_philly_82k_jobs_ms {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
    drop(rows);
    rubick_sim::logs::Window::default().select(&mut logged);
    let (first, last) = (logged[0].submit_s, logged[logged.len() - 1].submit_s);
    let lines = logged.iter().map(|j| j.line).max().unwrap_or(0);
    let again: Vec<_> = logged
        .iter()
        .take(100_000usize.saturating_sub(logged.len()))
        .map(|j| rubick_sim::logs::LoggedJob {
            line: j.line + lines,
            submit_s: j.submit_s - first + last + 3600.0,
            ..j.clone()
        })
        .collect();
    logged.extend(again);
    let rows = rubick_sim::logs::map_jobs(&path, &logged, "philly", &cluster, data, 1, 0.0)?;
    let dir = tempfile::tempdir()?;
    let trace = dir.path().join("philly-100k.csv");
    std::fs::write(&trace, rubick_sim::logs::to_csv(&rows))?;
    // Jobs made as the simulation reaches them (as `rubick-plan simulate` does).
    let (jobs, truth) = rubick_sim::trace::open_trace(&trace, &cluster, data, TruthMode::Oracle)?;
    let config = rubick_sim::SimConfig::defaults(lookup("rubick")?, rubick_policy::Queue::Fifo);
    let start = Instant::now();
    let r = rubick_sim::simulate(&cluster, &jobs, &truth, &config, |_, _| {});
    println!("bench: sim_100k_jobs_4096gpu_s {:.1} s", start.elapsed().as_secs_f64());
    println!("bench: sim_100k_jobs_4096gpu_jobs {} jobs", jobs.len());
    println!("bench: sim_100k_jobs_4096gpu_rounds {} rounds", r.rounds);
    println!("bench: sim_100k_jobs_4096gpu_decisions {} decisions", r.decisions);
    Ok(())
}

/// Philly-derived traces on the A800 testbed's node shape (`rubick-plan trace
/// --format philly --seed 1 --limit N` onto 8 and 64 nodes: the first 1,000 jobs on 64
/// GPUs, the first 8,000 on 512), with the usual noise, the mean over seeds 1-3: every
/// policy's restarts per job, makespan, GPU-hours and average JCT, and Rubick's against
/// the queues' and the peers' (`_sim_s`: the wall time of all its seeds, two at a time
/// on this machine's 2 cores).
fn philly_scales(root: &std::path::Path, data: &ReferenceData, reference: &std::path::Path) -> anyhow::Result<()> {
    use rubick_sim::logs::{Window, map_jobs, read_philly, to_csv};
    let Some(philly) = reference.parent().map(|r| r.join("traces/philly.csv")).filter(|p| p.is_file()) else {
        eprintln!("bench: skipping the Philly scales: ../shared/reference/traces/philly.csv is absent");
        return Ok(());
    };
    let text = std::fs::read_to_string(&philly)?;
    let base = rubick_plan::load_cluster(&root.join("data/cluster-a800-8x8.yaml"))?;
    let dir = tempfile::tempdir()?;
    for (gpus, nodes, limit, seeds, policies) in [
        // (Sia and Pollux: their rounds are knapsacks over one GPU type, exact and
        // fast.) The mean over seeds 1-3: no peer is compared on one seed.
        (64u32, 8u32, 1000usize, 3u32, &["rubick", "static", "static-backfill", "sia", "pollux"][..]),
        (512, 64, 8000, 3, &["rubick", "static", "static-backfill", "sia", "pollux"][..]),
    ] {
        let mut cluster = base.clone();
        cluster.name = format!("a800-{gpus}");
        cluster.node_groups[0].count = nodes;
        let path = philly.display().to_string();
        let (mut logged, _) = read_philly(&path, &text)?;
        Window { limit: Some(limit), ..Window::default() }.select(&mut logged);
        let rows = map_jobs(&path, &logged, "philly", &cluster, data, 1, 0.0)?;
        let trace = dir.path().join(format!("philly-{gpus}.csv"));
        std::fs::write(&trace, to_csv(&rows))?;
        let (jobs, truth) = rubick_sim::trace::open_trace(&trace, &cluster, data, TruthMode::Oracle)?;
        let mut got = std::collections::HashMap::new();
        for &policy in policies {
            // `simulate`'s default queue (the queue family and the peers order by
            // attained service, which is first come first served for jobs that never ran).
            let mut config = rubick_sim::SimConfig::defaults(lookup(policy)?, rubick_policy::Queue::Service);
            (config.noise_sigma, config.seed) = (NOISE, 1);
            let start = Instant::now();
            let r = rubick_sim::simulate_seeds(&cluster, &jobs, &truth, &config, seeds, |_, _| {});
            let wall = start.elapsed().as_secs_f64();
            let s = rubick_sim::summary::summarize("philly", &config, &truth, &r);
            let name = format!("sim_philly_{gpus}gpu_{}", policy.replace('-', "_"));
            let per_job = s.restarts.mean / s.jobs.max(1) as f64;
            println!("bench: {name}_restarts_per_job {per_job:.2} restarts");
            println!("bench: {name}_restarts_max {:.0} restarts", s.restarts_max.mean);
            println!("bench: {name}_avg_jct_s {:.0} s", s.avg_jct_s.mean);
            // Unfinished jobs counted until the simulation stopped (a lower bound).
            println!("bench: {name}_avg_jct_all_s {:.0} s", s.avg_jct_all_s.mean);
            println!("bench: {name}_p99_jct_s {:.0} s", s.p99_jct_s.mean);
            println!("bench: {name}_makespan_s {:.0} s", s.makespan_s.mean);
            println!("bench: {name}_gpu_hours {:.0} h", s.gpu_hours.mean);
            println!("bench: {name}_restart_gpu_hours {:.0} h", s.restart_gpu_hours.mean);
            println!("bench: {name}_unfinished {:.0} jobs", s.unfinished.mean);
            println!("bench: {name}_sim_s {wall:.1} s");
            got.insert(policy, s);
        }
        let (r, st, bf) = (&got["rubick"], &got["static"], &got["static-backfill"]);
        let p = format!("sim_philly_{gpus}gpu_rubick");
        println!("bench: {p}_makespan_over_static {:.3} x", r.makespan_s.mean / st.makespan_s.mean);
        println!("bench: {p}_gpu_hours_over_static {:.3} x", r.gpu_hours.mean / st.gpu_hours.mean);
        println!("bench: {p}_avg_jct_over_backfill {:.3} x", r.avg_jct_all_s.mean / bf.avg_jct_all_s.mean);
        // The peers' average JCT over Rubick's, unfinished jobs counted in both.
        for peer in ["sia", "pollux"].into_iter().filter(|peer| got.contains_key(peer)) {
            let ratio = got[peer].avg_jct_all_s.mean / r.avg_jct_all_s.mean;
            println!("bench: sim_philly_{gpus}gpu_{peer}_over_rubick_avg_jct {ratio:.3} x");
        }
    }
    Ok(())
}

fn simulation_figures(
    cluster: &rubick_core::Cluster,
    data: &ReferenceData,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use rubick_policy::Queue;
    use rubick_sim::summary::summarize;
    use rubick_sim::{SimConfig, simulate_seeds};
    let trace = dir.join("workloads/workload-base.csv");
    let (jobs, truth) = load_trace(&trace, cluster, data, TruthMode::Oracle)?;
    let run = |jobs: &[rubick_sim::SimJob], truth: &rubick_sim::truth::Truth, mut config: SimConfig| {
        config.noise_sigma = NOISE;
        config.seed = 1;
        let results = simulate_seeds(cluster, jobs, truth, &config, SEEDS, |_, _| {});
        summarize("workload-base", &config, truth, &results)
    };
    let print = |name: &str, x: &rubick_core::simulation::Spread, unit: &str| {
        println!("bench: {name} {:.0} {unit}", x.mean);
        println!("bench: {name}_sd {:.0} {unit}", x.sd);
    };
    let mut avg = std::collections::HashMap::new();
    let mut makespan = std::collections::HashMap::new();
    let all = [Queue::Fifo, Queue::Las, Queue::Srpt];
    for (policy, queues) in [
        ("rubick", &all[..]),
        ("rubick-milp", &all[..]),
        ("static", &all[..]),
        ("static-backfill", &all[..]),
        ("synergy", &[Queue::Fifo][..]),
        ("static-guaranteed-first", &[Queue::Fifo][..]),
        ("sia", &[Queue::Fifo][..]),
        ("pollux", &[Queue::Fifo][..]),
        ("rubick-gpus-only", &all[..]),
        ("rubick-no-plan", &all[..]),
        ("rubick-no-resize", &all[..]),
    ] {
        for &queue in queues {
            let s = run(&jobs, &truth, SimConfig::defaults(lookup(policy)?, queue));
            let name = format!("sim_base_{}_{}", policy.replace('-', "_"), s.queue);
            print(&format!("{name}_avg_jct_s"), &s.avg_jct_s, "s");
            if s.unfinished.max > 0.0 {
                println!("bench: {name}_unfinished {:.1} jobs", s.unfinished.mean);
            }
            if policy == "rubick" && queue == Queue::Fifo {
                print(&format!("{name}_makespan_s"), &s.makespan_s, "s");
                println!("bench: {name}_restarts {:.1} restarts", s.restarts.mean);
                println!("bench: {name}_unfinished {:.1} jobs", s.unfinished.mean);
                println!("bench: {name}_measured_pct {:.1} %", s.truth.measured.mean * 100.0);
                println!("bench: {name}_interpolated_pct {:.1} %", s.truth.interpolated.mean * 100.0);
                println!("bench: {name}_extrapolated_pct {:.1} %", s.truth.extrapolated.mean * 100.0);
                for m in &s.per_model {
                    println!("bench: {name}_{}_avg_jct_s {:.0} s", m.model, m.avg_jct_s.mean);
                    println!("bench: {name}_{}_extrapolated_pct {:.1} %", m.model, m.truth.extrapolated.mean * 100.0);
                }
            }
            avg.insert((policy, queue), s.avg_jct_s.mean);
            makespan.insert((policy, queue), s.makespan_s.mean);
            if queue == Queue::Fifo {
                println!("bench: {name}_restarts_per_job {:.2} restarts", s.restarts.mean / s.jobs.max(1) as f64);
            }
        }
    }
    // The peers against Rubick on the paper's setting (FIFO).
    for peer in ["sia", "pollux", "synergy", "static-guaranteed-first", "rubick-gpus-only"] {
        let (key, rubick) = ((peer, Queue::Fifo), ("rubick", Queue::Fifo));
        let name = peer.replace('-', "_");
        println!("bench: sim_base_{name}_over_rubick_fifo {:.2} x", avg[&key] / avg[&rubick]);
        println!("bench: sim_base_{name}_over_rubick_fifo_makespan {:.2} x", makespan[&key] / makespan[&rubick]);
    }
    for queue in all {
        let q = queue.as_str();
        let rubick = avg[&("rubick", queue)];
        println!("bench: sim_base_static_over_rubick_{q} {:.2} x", avg[&("static", queue)] / rubick);
        println!("bench: sim_base_backfill_over_rubick_{q} {:.2} x", avg[&("static-backfill", queue)] / rubick);
    }
    let mut sla = jobs.clone();
    rubick_plan::simulate::mark_guaranteed(&mut sla, 0.5);
    for policy in ["rubick", "rubick-milp"] {
        let s = run(&sla, &truth, SimConfig::defaults(lookup(policy)?, Queue::Fifo));
        let name = policy.replace('-', "_");
        println!("bench: sim_base_half_guaranteed_{name}_violations {:.1} jobs", s.guarantee_violations.mean);
        println!("bench: sim_base_half_guaranteed_{name}_violation_hours {:.2} h", s.violation_hours.mean);
        print(&format!("sim_base_half_guaranteed_{name}_avg_jct_s"), &s.avg_jct_s, "s");
    }
    let mut slow = truth.clone();
    slow.extrapolated_slowdown = 0.3;
    let (_, belief) = load_trace(&trace, cluster, data, TruthMode::Belief)?;
    for queue in [Queue::Fifo, Queue::Srpt] {
        let q = queue.as_str();
        let mut config = SimConfig::defaults(lookup("rubick")?, queue);
        config.measured_only = true;
        print(&format!("sim_base_measured_only_rubick_{q}_avg_jct_s"), &run(&jobs, &truth, config).avg_jct_s, "s");
        let s = run(&jobs, &slow, SimConfig::defaults(lookup("rubick")?, queue));
        print(&format!("sim_base_extrapolated_30pct_slower_rubick_{q}_avg_jct_s"), &s.avg_jct_s, "s");
        let s = run(&jobs, &belief, SimConfig::defaults(lookup("rubick")?, queue));
        print(&format!("sim_base_belief_truth_rubick_{q}_avg_jct_s"), &s.avg_jct_s, "s");
    }
    // The CPU-tight cluster: policies that manage cores against those that do not.
    let mut tight = cluster.clone();
    tight.node_groups[0].cpu_cores = 48;
    let (jobs, truth) = load_trace(&trace, &tight, data, TruthMode::Oracle)?;
    let mut tight_jct = std::collections::HashMap::new();
    for policy in
        ["rubick", "rubick-no-plan", "rubick-gpus-only", "synergy", "static-guaranteed-first", "static-backfill"]
    {
        let s = {
            let mut config = SimConfig::defaults(lookup(policy)?, Queue::Fifo);
            (config.noise_sigma, config.seed) = (NOISE, 1);
            let results = simulate_seeds(&tight, &jobs, &truth, &config, SEEDS, |_, _| {});
            summarize("workload-base", &config, &truth, &results)
        };
        let name = format!("sim_cpu_tight_{}", policy.replace('-', "_"));
        print(&format!("{name}_avg_jct_s"), &s.avg_jct_s, "s");
        println!("bench: {name}_unfinished {:.1} jobs", s.unfinished.mean);
        // Over every job, an unfinished one counted until the end (static-backfill
        // cannot start the jobs whose requested cores no node has).
        println!("bench: {name}_avg_jct_all_s {:.0} s", s.avg_jct_all_s.mean);
        tight_jct.insert(policy, s.avg_jct_all_s.mean);
    }
    // Synergy-TUNE acts where cores bind (offloading jobs get twice the fair
    // share, others give theirs back): it differs from static-backfill here.
    println!(
        "bench: sim_cpu_tight_synergy_over_static_backfill_all_jobs {:.3} x",
        tight_jct["synergy"] / tight_jct["static-backfill"]
    );
    Ok(())
}
