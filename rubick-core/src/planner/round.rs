//! A round's outcome as a `Schedule` artifact, with a per-job explanation.

use crate::artifact::{ApiVersion, Kind};
use crate::schedule::{Assignment, Change, GuaranteeStatus, NodeShare, Schedule, SolverStats, Totals};

use super::JobInput;
use super::curves::{CurveBook, Evaluator};
use super::place::{NodeState, place};

/// The schedule of a decision, and one explanation line per job.
#[derive(Debug)]
pub struct Outcome {
    pub schedule: Schedule,
    pub explain: Vec<String>,
    /// The nodes' free resources after placement.
    pub nodes: Vec<NodeState>,
}

fn describe(plan: &crate::plan::Plan, placement: &crate::placement::Placement, cpus: u32) -> String {
    format!("{plan} on {placement} ({} GPUs, {cpus} cores)", placement.gpus())
}

/// Places `choice` and writes the schedule.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    evaluator: &mut Evaluator<'_>,
    book: &CurveBook,
    inputs: &[JobInput],
    choice: &[Option<usize>],
    objective: f64,
    round: u64,
    policy: &str,
    solver: SolverStats,
    repack: super::place::Repack,
) -> Outcome {
    let (placed, nodes) = place(evaluator, book, inputs, choice, repack);
    let cluster = evaluator.cluster;
    let mut assignments = Vec::with_capacity(inputs.len());
    let mut explain = Vec::with_capacity(inputs.len());
    for (j, input) in inputs.iter().enumerate() {
        let jc = &book.jobs[j];
        let cur = input.current.as_ref();
        let p = placed[j].as_ref();
        let change = match (cur, p) {
            (None, None) => Change::Pending,
            (None, Some(_)) => Change::Started,
            (Some(_), None) => Change::Preempted,
            (Some(c), Some(p)) => {
                let on: Vec<(u32, Vec<u32>)> = p.shares.iter().map(|s| (nodes[s.node].index, s.gpus.clone())).collect();
                c.change_to(p.group, &p.plan, &p.placement, &on, p.cpus)
            }
        };
        let throughput = p.map_or(0.0, |p| p.throughput);
        let guarantee = jc.guaranteed.then(|| GuaranteeStatus {
            required_throughput: round6(jc.request_throughput),
            holds: throughput >= jc.request_throughput * (1.0 - 1e-9),
        });
        let normalized = throughput / jc.request_throughput;
        // With the model's evidence: how the prediction rests on measurements, and its
        // ~95 % interval; a gain is claimed only as far as the interval's low end goes.
        let evidence = p.and_then(|p| evaluator.uncertainty(input, p.group, &p.plan, &p.placement));
        let (low, high) =
            evidence.map_or((normalized, normalized), |(_, h)| (normalized * (-h).exp(), normalized * h.exp()));
        let gain = |x: f64| match evidence {
            Some((_, h)) if h > 0.0 => format!("{x:.2}x (95 %: {low:.2}-{high:.2}x)"),
            _ => format!("{x:.2}x"),
        };
        let mut reason = match change {
            Change::Pending if jc.candidates.is_empty() => "no feasible plan on this cluster".to_string(),
            Change::Pending => "waits: the resources are worth more to other jobs this round".to_string(),
            Change::Started if evidence.is_some() && low < 1.0 && normalized > 1.0 => {
                format!("starts at {}: no faster than its request as far as the data show", gain(normalized))
            }
            Change::Started => format!("starts at {} its request's throughput", gain(normalized)),
            Change::Kept if jc.locked => "kept: in its cooldown after a change".to_string(),
            Change::Kept => "kept: no change pays for its restart".to_string(),
            Change::Preempted => "paused: its resources are worth more to other jobs".to_string(),
            Change::Resized | Change::Replanned | Change::Moved | Change::Recored => {
                let old = cur.and_then(|_| jc.current.map(|c| jc.candidates[c].normalized)).unwrap_or(0.0);
                format!("{old:.2}x -> {} its request's throughput, worth a restart", gain(normalized))
            }
        };
        if let Some((support, _)) = evidence {
            reason = format!("{reason}; {}", support.as_str());
        }
        if let Some(note) = p.and_then(|p| p.note.as_ref()) {
            reason = format!("{reason}; {note}");
        }
        let rounds_since_change = match (change, cur) {
            (Change::Kept, Some(c)) => c.rounds_since_change.saturating_add(1),
            _ => 0,
        };
        let old = cur.map_or("-".to_string(), |c| describe(&c.plan, &c.placement, c.cpus));
        let new = p.map_or("-".to_string(), |p| describe(&p.plan, &p.placement, p.cpus));
        let guarantee_text = match &guarantee {
            Some(g) => {
                format!(", guarantee {:.3} {}", g.required_throughput, if g.holds { "held" } else { "NOT held" })
            }
            None => String::new(),
        };
        explain.push(format!(
            "{}: {change:?}: {old} -> {new}; {throughput:.3} samples/s{guarantee_text}; {reason}",
            input.job.name
        ));
        assignments.push(Assignment {
            job: input.job.name.clone(),
            plan: p.map(|p| p.plan),
            nodes: p.map_or_else(Vec::new, |p| {
                p.shares
                    .iter()
                    .map(|s| NodeShare {
                        node: nodes[s.node].name.clone(),
                        gpus: s.gpus.clone(),
                        cpus: s.cpus,
                        host_memory_gib: round6(s.mem),
                    })
                    .collect()
            }),
            predicted_throughput: round6(throughput),
            guarantee,
            change,
            rounds_since_change,
            reason,
        });
    }
    let gpus_used = placed.iter().flatten().map(|p| p.placement.gpus()).sum();
    let cpus_used = placed.iter().flatten().map(|p| p.cpus).sum();
    let mem_used: f64 = placed.iter().flatten().map(|p| p.host_memory_gib).sum();
    let normalized: f64 = placed
        .iter()
        .zip(&book.jobs)
        .filter_map(|(p, jc)| p.as_ref().map(|p| p.throughput / jc.request_throughput))
        .sum();
    let schedule = Schedule {
        api_version: Some(ApiVersion::CURRENT),
        kind: Some(Kind::Schedule),
        cluster: cluster.name.clone(),
        round,
        policy: policy.to_string(),
        assignments,
        totals: Totals {
            gpus_used,
            gpus_total: cluster.total_gpus(),
            cpus_used,
            host_memory_gib_used: round6(mem_used),
            normalized_throughput: round6(normalized),
        },
        objective: round6(objective),
        solver,
    };
    Outcome { schedule, explain, nodes }
}

/// Six significant decimals: plans print the same on every platform.
pub fn round6(x: f64) -> f64 {
    if x.is_finite() { (x * 1e6).round() / 1e6 } else { x }
}
