//! Restart-aware decisions: the restart factor's hysteresis, the growth cap,
//! the restart cap and the checkpoint-restore pin, each against the same rounds without
//! it, and `--explain` saying when a change was refused for churn.

use std::time::Duration;

use rubick_core::schedule::{Change, Schedule};
use rubick_milp::Milp;
use rubick_planner::round::{Solver, plan_round};
use rubick_planner::synth;
use rubick_planner::{JobInput, PlannerConfig, restart_factor};

/// Random instances of `jobs` jobs on `nodes` 8-GPU nodes, at one hour on the clock,
/// every running job out of its cooldown (so that rules, not cooldowns, decide).
fn instances(nodes: u32, jobs: u32, seeds: std::ops::Range<u64>) -> Vec<(rubick_core::Cluster, Vec<JobInput>)> {
    seeds
        .filter_map(|seed| {
            let cluster = synth::cluster(nodes * 8);
            let config = PlannerConfig { now_s: 3600.0, ..PlannerConfig::default() };
            let mut batch = synth::jobs(&cluster, jobs, seed).ok()?;
            for j in &mut batch.jobs {
                j.submit_time_s = 0.0;
            }
            let mut inputs = rubick_plan::round::job_inputs(
                std::path::Path::new("<synthetic>"),
                rubick_plan::round::on_priors(batch.jobs),
                &cluster,
                &config,
                None,
            )
            .ok()?;
            for i in &mut inputs {
                if let Some(c) = &mut i.current {
                    c.rounds_since_change = 100;
                }
            }
            Some((cluster, inputs))
        })
        .collect()
}

fn round(cluster: &rubick_core::Cluster, inputs: &[JobInput], config: &PlannerConfig) -> Option<Schedule> {
    plan_round(cluster, config, inputs, Solver::Heuristic, &Milp::new(Duration::from_secs(5)), 0)
        .ok()
        .map(|r| r.outcome.schedule)
}

fn base() -> PlannerConfig {
    PlannerConfig { now_s: 3600.0, restart_cap: None, ..PlannerConfig::default() }
}

/// Changes of running jobs (not starts, not pauses).
fn changed(s: &Schedule) -> usize {
    s.assignments
        .iter()
        .filter(|a| matches!(a.change, Change::Resized | Change::Replanned | Change::Moved | Change::Recored))
        .count()
}

#[test]
fn the_factor_is_sia_and_polluxs() {
    // Age 1 h, 250 s restarts: a move must gain 7 % after no restart, 64 % after five.
    let f0 = restart_factor(3600.0, 0, 250.0);
    let f5 = restart_factor(3600.0, 5, 250.0);
    assert!((1.0 / f0 - 1.069).abs() < 0.01, "{}", 1.0 / f0);
    assert!((1.0 / f5 - 1.641).abs() < 0.01, "{}", 1.0 / f5);
    // Younger than one restart: exempt; more restart time than life: never moved.
    assert_eq!(restart_factor(100.0, 3, 250.0), 1.0);
    assert_eq!(restart_factor(3600.0, 20, 250.0), 0.0);
    assert_eq!(restart_factor(3600.0, 2, 0.0), 1.0);
}

/// With every running job restarted often for its age, the factor refuses the changes
/// the same rounds make without it, and the explanation says so.
#[test]
fn restarts_raise_the_bar_for_a_change_and_explain_says_why() {
    let (mut without, mut with, mut explained) = (0, 0, 0);
    for (cluster, mut inputs) in instances(2, 8, 0..30) {
        let off = PlannerConfig { restart_factor: false, ..base() };
        let Some(plain) = round(&cluster, &inputs, &off) else { continue };
        without += changed(&plain);
        for i in &mut inputs {
            i.restarts = 12; // 12 x 260 s of one hour: the factor is 0.12
        }
        let Some(s) = round(&cluster, &inputs, &base()) else { continue };
        with += changed(&s);
        explained += s.assignments.iter().filter(|a| a.reason.starts_with("kept for churn: a change to")).count();
    }
    assert!(without > 0, "the instances change running jobs without the factor: the test tests something");
    assert!(with * 4 < without, "the factor refused few changes: {with} with it, {without} without");
    assert!(explained > 0, "no `kept for churn` explanation");
}

/// A running job grows to at most twice its GPUs in one round.
#[test]
fn growth_is_at_most_twice_per_round() {
    let mut grew = 0;
    for (cluster, inputs) in instances(8, 3, 0..30) {
        let uncapped = PlannerConfig { max_growth: None, ..base() };
        let gpus = |s: &Schedule, j: usize| s.assignments[j].nodes.iter().map(|n| n.gpus.len()).sum::<usize>();
        let (Some(capped), Some(free)) = (round(&cluster, &inputs, &base()), round(&cluster, &inputs, &uncapped))
        else {
            continue;
        };
        for (j, input) in inputs.iter().enumerate() {
            let Some(cur) = &input.current else { continue };
            let before = cur.placement.gpus() as usize;
            assert!(gpus(&capped, j) <= 2 * before, "{}: {before} -> {} GPUs", input.job.name, gpus(&capped, j));
            grew += usize::from(gpus(&free, j) > 2 * before);
        }
    }
    assert!(grew > 0, "without the cap some job grows beyond twice: the test tests something");
}

/// A job restarted as often as the cap allows, or in the middle of a restore, keeps its
/// allocation; the explanation says which.
#[test]
fn spent_restarts_and_restores_keep_the_allocation() {
    let mut held = 0;
    for (cluster, inputs) in instances(2, 8, 0..20) {
        for (rule, reason) in
            [(0, "kept for churn: restarted 5 times"), (1, "kept: in the middle of a checkpoint-restore")]
        {
            let mut inputs = inputs.clone();
            for i in &mut inputs {
                if rule == 0 {
                    i.restarts = 5;
                } else {
                    i.restoring = i.current.is_some();
                }
            }
            let config = PlannerConfig { restart_cap: Some(5), ..base() };
            let Some(s) = round(&cluster, &inputs, &config) else { continue };
            for (a, i) in s.assignments.iter().zip(&inputs) {
                if i.current.is_some() && !i.job.guaranteed {
                    assert!(matches!(a.change, Change::Kept | Change::Preempted), "{}: {:?}", a.job, a.change);
                    if a.change == Change::Kept {
                        assert!(a.reason.starts_with(reason), "{}: {}", a.job, a.reason);
                        held += 1;
                    }
                }
            }
        }
    }
    assert!(held > 0);
}

/// The `service` queue's quantum: a running job keeps its request until it has had the
/// quantum; past it, it may be paused or shrunk for a waiting job below it (weighed
/// twice, as the policy weighs them), and without a quantum nobody is.
#[test]
fn jobs_past_the_service_quantum_make_way_for_waiting_jobs_below_it() {
    const QUANTUM: f64 = 3600.0;
    let (mut made_way, mut instances_with_waiting) = (0, 0);
    for (cluster, inputs) in instances(1, 24, 0..12) {
        let mut inputs = inputs.clone();
        let mut k = 0;
        for i in &mut inputs {
            std::sync::Arc::make_mut(&mut i.job).guaranteed = false;
            if i.current.is_some() {
                // Every other running job is past the quantum.
                let past = k % 2 == 0;
                k += 1;
                i.progress.attained_gpu_s = if past { 100.0 * QUANTUM } else { 0.5 * QUANTUM };
                i.priority = if past { 1.0 } else { 2.0 };
            } else {
                i.progress.attained_gpu_s = 0.0;
                i.priority = 2.0;
            }
        }
        if inputs.iter().all(|i| i.current.is_some()) {
            continue;
        }
        instances_with_waiting += 1;
        // Paused, or moved onto fewer GPUs than it held.
        let shrunk_or_paused = |i: &JobInput, a: &rubick_core::schedule::Assignment| {
            let gpus: usize = a.nodes.iter().map(|n| n.gpus.len()).sum();
            a.change == Change::Preempted
                || (a.change != Change::Kept && (gpus as u32) < i.current.as_ref().map_or(0, |c| c.placement.gpus()))
        };
        for quantum in [None, Some(QUANTUM)] {
            let config = PlannerConfig { service_quantum_gpu_s: quantum, ..base() };
            let s = round(&cluster, &inputs, &config).expect("a round");
            for (a, i) in s.assignments.iter().zip(&inputs) {
                if i.current.is_none() {
                    continue;
                }
                let gave_way = shrunk_or_paused(i, a);
                if quantum.is_none() || i.progress.attained_gpu_s < QUANTUM {
                    assert!(!gave_way, "{} kept its request below the quantum: {:?} {}", a.job, a.change, a.reason);
                } else if gave_way {
                    made_way += 1;
                }
            }
        }
    }
    assert!(instances_with_waiting > 0, "no instance had a waiting job");
    assert!(made_way > 0, "no job past the quantum made way for a waiting one");
}
