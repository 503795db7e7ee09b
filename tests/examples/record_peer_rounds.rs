//! Records the inputs of a goodput peer's rounds (`sia`, `pollux`) from a replay, for
//! running the authors' own policy code on them (`scripts/conformance.py`) and for the
//! conformance test (`tests/it/conformance.rs`); see data/conformance/README.md.
//!
//! `record_peer_rounds POLICY CLUSTER TRACE REFERENCE ROUNDS OUT.json [MIN_JOBS]`:
//! replays TRACE on CLUSTER under POLICY (the simulator's defaults, no noise) until
//! POLICY has decided ROUNDS times with at least MIN_JOBS (default 2) jobs present, and writes each job once (its `Job`,
//! belief, restart cost, its goodput row over the artifacts' configurations and, for
//! Pollux, its goodput over every (nodes, GPUs) split: its genetic algorithm searches
//! them all) and each round (the clock, each
//! job's allocation, restarts, restore and most GPUs held, and what POLICY allocated).
//!
//! The row is computed here as `rubick-policy`'s goodput peers compute theirs (the
//! job's requested layout, its best plan on each configuration's packed GPUs, the
//! node's fair cores per GPU); the conformance test fails if the two drift apart,
//! since it reruns the policy on these inputs.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rubick_core::{Cluster, Placement};
use rubick_io::reference::ReferenceData;
use rubick_model::throughput;
use rubick_planner::curves::Evaluator;
use rubick_planner::{JobInput, Restriction, eligible_groups};
use rubick_policy::{Policy, PolicyOptions, Queue, View, request_config, request_plan, traced_plan};
use rubick_sim::SimConfig;
use rubick_sim::engine::{JobSource, Simulation, planner_config};
use rubick_sim::trace::open_trace;
use rubick_sim::truth::TruthMode;
use serde_json::{Value, json};

/// The artifacts' largest allocation (`cluster.py`: "simulator can't handle more").
const MAX_GPUS: u32 = 64;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Exit 0 when written, 2 on an error (named on stderr).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("record_peer_rounds: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (policy, cluster, trace, reference, rounds, out, min_jobs) = match args.as_slice() {
        [p, c, t, r, n, o] => (p, c, t, r, n, o, "2"),
        [p, c, t, r, n, o, m] => (p, c, t, r, n, o, m.as_str()),
        _ => return Err("usage: record_peer_rounds POLICY CLUSTER TRACE REFERENCE ROUNDS OUT.json [MIN_JOBS]".into()),
    };
    let min_jobs: usize = min_jobs.parse().map_err(|e| format!("MIN_JOBS `{min_jobs}`: {e}"))?;
    let registration = rubick_policy::lookup(policy)?;
    let rounds: usize = rounds.parse().map_err(|e| format!("ROUNDS `{rounds}`: {e}"))?;
    let cluster_path = PathBuf::from(cluster);
    let cluster = rubick_plan::load_cluster(&cluster_path)?;
    let reference = ReferenceData::open(&PathBuf::from(reference))?;
    let (jobs, truth) = open_trace(&PathBuf::from(trace), &cluster, &reference, TruthMode::Oracle)?;
    let config = SimConfig::defaults(registration, Queue::Fifo);
    let planner = planner_config(&config, &truth);
    let options =
        PolicyOptions { queue: config.queue, planner: planner.clone(), milp_time_limit: config.milp_time_limit };
    let mut recorder = Recorder {
        inner: registration.build(&cluster, &options),
        evaluator: Evaluator::new(&cluster, &{
            let mut p = planner.clone();
            p.fair_cores_only = true;
            p
        }),
        default_restart_s: planner.default_restart_s,
        jobs: BTreeMap::new(),
        rounds: Vec::new(),
        limit: rounds,
        min_jobs,
        table: registration.name == "pollux",
    };
    let mut sim = Simulation::new(&cluster, (jobs.count(), jobs.arrivals()), &truth, &config, &planner, true);
    while recorder.rounds.len() < rounds && sim.arrive() {
        sim.decide(&mut recorder);
        if !sim.advance() {
            break;
        }
    }
    let doc = json!({
        "policy": policy,
        "cluster": serde_json::to_value(&cluster)?,
        "defaultRestartS": planner.default_restart_s,
        "jobs": recorder.jobs,
        "rounds": recorder.rounds,
    });
    let text = serde_json::to_string(&doc)? + "\n";
    let tmp = PathBuf::from(format!("{out}.tmp"));
    std::fs::write(&tmp, text).map_err(|e| format!("{}: cannot write: {e}", tmp.display()))?;
    std::fs::rename(&tmp, out).map_err(|e| format!("{out}: cannot write: {e}"))?;
    eprintln!("{out}: {} rounds, {} jobs", recorder.rounds.len(), recorder.jobs.len());
    Ok(())
}

struct Recorder<'a> {
    inner: Box<dyn Policy + 'a>,
    evaluator: Evaluator<'a>,
    default_restart_s: f64,
    jobs: BTreeMap<String, Value>,
    rounds: Vec<Value>,
    limit: usize,
    min_jobs: usize,
    /// Record Pollux's goodput over every (nodes, GPUs) split.
    table: bool,
}

impl Recorder<'_> {
    /// The job's layout (as `goodput.rs`'s `layout`): its request's plan, the trace's
    /// when the model rejects it, else its best plan on its requested GPUs.
    fn layout(&mut self, pj: &JobInput) -> Restriction {
        let cluster = self.evaluator.cluster;
        let group = rubick_policy::home_group(&pj.job, cluster);
        let plan =
            request_plan(&pj.job, cluster, group).or_else(|| traced_plan(&pj.job, pj.trace_code, cluster, group));
        let plan = plan.or_else(|| {
            let g = &cluster.node_groups[group];
            let placement = Placement::packed(pj.job.request.gpus, g.gpus_per_node)?;
            let cpus = g.fair_cpus_per_gpu() * pj.job.request.gpus;
            rubick_policy::users_plan(
                &pj.job,
                &pj.belief.params,
                pj.trace_code,
                &mut self.evaluator,
                (group, &placement),
                cpus,
            )
        });
        plan.map_or(Restriction::Any, |p| Restriction::layout_of(&p))
    }

    /// Throughput of the job's best plan of `layout` on `placement` of `group`.
    fn throughput(&mut self, pj: &JobInput, layout: Restriction, group: usize, placement: &Placement) -> f64 {
        let g = &self.evaluator.cluster.node_groups[group];
        let cpus = g.fair_cpus_per_gpu() * placement.gpus();
        let point = self.evaluator.best_plan(&pj.job, &pj.belief.params, group, placement, cpus, layout);
        point.filter(|(p, t)| t.is_finite() && *t > 0.0 && pj.job.can_run(p)).map_or(0.0, |(_, t)| t)
    }

    /// The job, once: its artifact, belief, restart cost, goodput row and table.
    fn record_job(&mut self, pj: &JobInput, configs: Option<&dyn rubick_planner::CandidateFilter>) {
        if self.jobs.contains_key(&pj.job.name) {
            return;
        }
        let layout = pj.allowed.narrowed_by(self.layout(pj));
        let cluster: &Cluster = self.evaluator.cluster;
        let largest = MAX_GPUS.max(pj.job.request.gpus);
        let (mut row, mut table) = (Vec::new(), Vec::new());
        for (group, g) in eligible_groups(&pj.job, cluster) {
            let gpn = g.gpus_per_node;
            let counts = std::iter::successors(Some(1u32), |&k| Some(k * 2))
                .take_while(|&k| k < gpn)
                .chain((1..=g.count).map(|k| k * gpn))
                .filter(|&n| n <= largest);
            for gpus in counts.collect::<Vec<_>>() {
                let Some(placement) = Placement::packed(gpus, gpn) else { continue };
                let thr = self.throughput(pj, layout, group, &placement);
                if thr > 0.0 {
                    row.push(json!([group, gpus, thr]));
                }
            }
            // Pollux's search space: any number of replicas (GPUs) on any number of
            // nodes; the replicas spread as evenly as the nodes allow.
            let splits = if self.table { MAX_GPUS.min(g.count * gpn) } else { 0 };
            for gpus in 1..=splits {
                for nodes in gpus.div_ceil(gpn)..=gpus.min(g.count) {
                    let per_node: Vec<u32> = (0..nodes).map(|k| gpus / nodes + u32::from(k < gpus % nodes)).collect();
                    let Some(placement) = Placement::new(per_node) else { continue };
                    let thr = self.throughput(pj, layout, group, &placement);
                    if thr > 0.0 {
                        table.push(json!([group, nodes, gpus, thr]));
                    }
                }
            }
        }
        // A job whose layout runs on no configuration: its request, a rigid job.
        let rigid = row
            .is_empty()
            .then(|| request_config(&pj.job, &pj.belief.params, pj.trace_code, &mut self.evaluator, configs));
        let rigid = rigid.flatten().map(|r| {
            let g = &cluster.node_groups[r.group];
            let cpu_ref = self.evaluator.config.cpu_reference(g);
            let thr =
                throughput::samples_per_s(&pj.job.model, &pj.belief.params, g, &r.plan, &r.placement, r.cpus, cpu_ref);
            json!({"group": r.group, "gpus": r.placement.gpus(), "throughput": thr})
        });
        self.jobs.insert(
            pj.job.name.clone(),
            json!({
                "job": serde_json::to_value(&pj.job).expect("a Job serialises"),
                "params": pj.belief.params.values.to_vec(),
                "traceCode": pj.trace_code.map(|c| c.to_string()),
                "restartS": pj.job.restart_cost_s.unwrap_or(self.default_restart_s),
                "row": row,
                "rigid": rigid,
                "table": table,
            }),
        );
    }
}

fn current_json(c: Option<&rubick_planner::Current>) -> Value {
    c.map_or(Value::Null, |c| {
        json!({
            "group": c.group,
            "gpus": c.placement.gpus(),
            "plan": serde_json::to_value(c.plan).expect("a Plan serialises"),
            "placement": c.placement.to_string(),
            "nodes": c.nodes,
            "cpus": c.cpus,
            "hostMemoryGib": c.host_memory_gib,
            "roundsSinceChange": c.rounds_since_change,
        })
    })
}

impl Policy for Recorder<'_> {
    fn reconfigures(&self) -> bool {
        self.inner.reconfigures()
    }

    fn decide(&mut self, view: &View<'_>, round: u64) -> Vec<Option<rubick_planner::Current>> {
        self.evaluator.config.now_s = view.now_s;
        let record = self.rounds.len() < self.limit && view.jobs.len() >= self.min_jobs.max(1);
        if record {
            for pj in view.jobs {
                self.record_job(pj, view.configs);
            }
        }
        let out = self.inner.decide(view, round);
        if record {
            let jobs: Vec<Value> = view
                .jobs
                .iter()
                .zip(&out)
                .map(|(pj, alloc)| {
                    json!({
                        "name": pj.job.name,
                        "current": current_json(pj.current.as_ref()),
                        "restarts": pj.restarts,
                        "restoring": pj.restoring,
                        "maxGpus": pj.progress.max_gpus,
                        "attainedGpuS": pj.progress.attained_gpu_s,
                        "remaining": pj.progress.remaining,
                        "remainingWork": pj.progress.remaining_work,
                        "firstStartS": pj.progress.first_start_s,
                        "ours": alloc.as_ref().map(|c| json!({"group": c.group, "gpus": c.placement.gpus()})),
                    })
                })
                .collect();
            self.rounds.push(json!({"round": round, "nowS": view.now_s, "jobs": jobs}));
        }
        out
    }
}
