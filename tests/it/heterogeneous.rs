//! Simulated clusters of several GPU types: the queue policies place a job on any
//! group of its GPU type, the planner's on the best one, and the truth on another GPU
//! type is the measured hardware's scaled by the model (and called extrapolated).

use rubick_core::{Cluster, PlanCode};
use rubick_model::perfmodel::Links;
use rubick_policy::Queue;
use rubick_policy::lookup;
use rubick_sim::truth::{Basis, Truth, TruthMode};
use rubick_sim::{SimConfig, SimJob, SimResult, simulate};

/// 2 nodes of the testbed's A800s and 2 of a GPU twice as fast.
fn mixed() -> Cluster {
    let mut c = Cluster::example();
    c.name = "mixed".into();
    c.node_groups[0].count = 2;
    let mut fast = c.node_groups[0].clone();
    fast.name = "h800".into();
    fast.gpu_type = "H800-80GB".into();
    fast.compute_speed = 2.0;
    c.node_groups.push(fast);
    c
}

/// `n` LLaMA-2-7B-like ZeRO-DP jobs of 8 GPUs, all submitted at 0, of `gpu_type`.
fn jobs(n: usize, gpu_type: Option<&str>) -> Vec<SimJob> {
    (0..n)
        .map(|i| {
            let mut sj = SimJob::example(&format!("j{i}"), PlanCode::ZeroDp, 8, 32, false);
            sj.job.iterations = 2_000;
            sj.job.request.gpu_type = gpu_type.map(str::to_owned);
            sj
        })
        .collect()
}

/// No measured rows: the truth is the belief, on the testbed's links.
fn truth(cluster: &Cluster) -> Truth {
    Truth::new(TruthMode::Oracle, &[], Links::from(&cluster.node_groups[0]), 4).expect("a truth without rows")
}

fn run(policy: &str, cluster: &Cluster, jobs: &[SimJob]) -> SimResult {
    let config = SimConfig::defaults(lookup(policy).expect("a registered policy"), Queue::Fifo);
    simulate(cluster, jobs, &truth(cluster), &config, |_, _| {})
}

fn peak(r: &SimResult) -> u32 {
    r.usage.iter().map(|(_, g)| *g).max().unwrap_or(0)
}

#[test]
fn a_queue_policy_runs_jobs_on_every_group_of_their_type() {
    let cluster = mixed();
    let any = run("static", &cluster, &jobs(4, None));
    assert_eq!(peak(&any), 32, "4 jobs of 8 GPUs on 2 + 2 nodes: all at once");
    assert!(any.jobs.iter().all(|j| j.finish_s.is_some()));
    // The two on the faster GPUs take about half the GPU-hours.
    let mut hours: Vec<f64> = any.jobs.iter().map(|j| j.gpu_hours).collect();
    hours.sort_by(f64::total_cmp);
    assert!(hours[1] < hours[2] * 0.75, "{hours:?}");
    let typed = run("static", &cluster, &jobs(4, Some("H800-80GB")));
    assert_eq!(peak(&typed), 16, "jobs asking for H800s only run on the 2 H800 nodes");
    assert!(typed.jobs.iter().all(|j| j.finish_s.is_some()));
}

#[test]
fn the_planner_family_uses_every_group_too() {
    let cluster = mixed();
    for policy in ["rubick", "rubick-gpus-only", "synergy", "static-guaranteed-first", "static-backfill"] {
        let r = run(policy, &cluster, &jobs(6, None));
        assert!(r.jobs.iter().all(|j| j.finish_s.is_some()), "{policy}: unfinished");
        assert!(peak(&r) > 16, "{policy}: used at most one group ({} GPUs)", peak(&r));
    }
}

#[test]
fn the_truth_on_other_hardware_is_scaled_and_extrapolated() {
    let cluster = mixed();
    let truth = truth(&cluster);
    let sj = &jobs(1, None)[0];
    let plan = rubick_policy::request_plan(&sj.job, &cluster, 0).unwrap();
    let placement = rubick_core::Placement::new(vec![8]).unwrap();
    let (slow, _) = truth.iter_time_s(&sj.job.model, &sj.params, &cluster.node_groups[0], &plan, &placement, 32);
    let (fast, basis) = truth.iter_time_s(&sj.job.model, &sj.params, &cluster.node_groups[1], &plan, &placement, 32);
    assert!(fast < slow * 0.8, "twice the compute speed: {fast} vs {slow}");
    assert_eq!(basis, Basis::Extrapolated);
}
