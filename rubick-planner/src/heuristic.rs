//! Rubick's heuristic (paper, section 4): guaranteed jobs first with the cheapest
//! configuration that meets their guarantee, then queued jobs with their smallest
//! useful configuration, then resources move from the jobs with the lowest marginal
//! gain to those with the highest while the objective grows.
//!
//! Marginal gain is the change of a job's value (its throughput normalised by that of
//! its request, minus what a restart and the minimum gain cost) per unit of resource,
//! a resource unit being the sum of the shares of the cluster's GPUs, cores and memory
//! a configuration uses. Every accepted move raises the objective by a positive
//! amount, so the loop ends.
//!
//! Its two algorithms part here: admission ([`solve`], this file: running jobs keep
//! what they hold, then guaranteed and queued jobs are admitted, making room by
//! `state.rs`'s victims' index) and improvement (`improve.rs`: moves while the
//! objective grows).

use std::collections::BTreeSet;

use rubick_core::cluster::Cluster;

use super::curves::CurveBook;
use super::{Capacity, JobInput, PlannerConfig, objective};

const EPS: f64 = 1e-9;

mod improve;
mod state;

use improve::improve;
use state::State;

/// One candidate index (or none: the job waits) per job, and the objective.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub choice: Vec<Option<usize>>,
    pub objective: f64,
}

/// Guaranteed jobs that cannot all get their guarantee.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct Infeasible {
    pub jobs: Vec<String>,
    pub reason: String,
}

/// Runs the heuristic. Fails only when guaranteed jobs cannot all be satisfied.
pub fn solve(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
) -> Result<Decision, Infeasible> {
    solve_with(book, cluster, inputs, config, false)
}

/// [`solve`] without its indexes: every victim's offer ranked in each `make_room`,
/// every job's moves ranked afresh in each pass of the improvement. Slower (about
/// quadratic), and the same decision bit for bit: the reference the tests hold
/// [`solve`] to.
pub fn solve_exhaustive(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
) -> Result<Decision, Infeasible> {
    solve_with(book, cluster, inputs, config, true)
}

fn solve_with(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
    exhaustive: bool,
) -> Result<Decision, Infeasible> {
    let free: Vec<Capacity> = book.capacity.clone();
    let total = cluster.node_groups.iter().map(Capacity::of).fold(Capacity::default(), |a, c| Capacity {
        gpus: a.gpus + c.gpus,
        cpus: a.cpus + c.cpus,
        mem: a.mem + c.mem,
    });
    let n = book.jobs.len();
    let victims = (0..book.capacity.len()).map(|_| std::array::from_fn(|_| BTreeSet::new())).collect();
    let mut st = State {
        book,
        choice: vec![None; n],
        free,
        total,
        victims,
        keyed: vec![None; n],
        gives: vec![Vec::new(); n],
        stale: vec![false; n],
        restale: Vec::new(),
        exhaustive,
    };

    // Running jobs keep their allocation to begin with (locked ones first).
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| !book.jobs[j].locked);
    for &j in &order {
        if let Some(cur) = book.jobs[j].current
            && st.fits(j, cur)
        {
            st.set(j, Some(cur));
        }
    }

    // Guaranteed jobs: the cheapest candidate that meets the guarantee, making room
    // by shrinking or pausing non-guaranteed jobs when needed.
    let mut queue: Vec<usize> = (0..n).collect();
    queue.sort_by(|&a, &b| {
        let (ia, ib) = (&inputs[a], &inputs[b]);
        ib.weight(config)
            .total_cmp(&ia.weight(config))
            .then(ia.job.submit_time_s.total_cmp(&ib.job.submit_time_s))
            .then(a.cmp(&b))
    });
    // Only a guarantee may pause a job in its cooldown.
    let guaranteed = |k: usize| book.jobs[k].guaranteed;
    for &j in &queue {
        if !book.jobs[j].guaranteed || st.choice[j].is_some() {
            continue;
        }
        let mut by_cost: Vec<usize> = (0..book.jobs[j].candidates.len()).collect();
        by_cost.sort_by(|&a, &b| st.cost(st.cand(j, a)).total_cmp(&st.cost(st.cand(j, b))).then(a.cmp(&b)));
        let mut placed = false;
        for &c in &by_cost {
            if st.fits(j, c) {
                st.set(j, Some(c));
                placed = true;
                break;
            }
        }
        if !placed {
            for &c in &by_cost {
                let need = st.deficit(j, c);
                st.flush();
                if let Some((moves, _)) = st.make_room(j, st.cand(j, c).group, need, &guaranteed, f64::INFINITY) {
                    for (k, opt) in moves {
                        st.set(k, opt);
                    }
                    if st.fits(j, c) {
                        st.set(j, Some(c));
                        placed = true;
                        break;
                    }
                }
            }
        }
        if !placed && !book.jobs[j].must_run {
            continue; // waits in the queue for room for its guarantee
        }
        if !placed {
            let job = &book.jobs[j];
            let reason = if job.candidates.is_empty() {
                format!(
                    "guaranteed job `{}` has no configuration reaching its requested {:.3} samples/s on this cluster",
                    job.name, job.request_throughput
                )
            } else {
                let gpus = job.candidates.iter().map(|c| c.gpus).min().unwrap_or(0);
                format!(
                    "guaranteed job `{}` needs at least {gpus} GPUs for its requested {:.3} samples/s, and the other guaranteed jobs leave too little",
                    job.name, job.request_throughput
                )
            };
            return Err(Infeasible { jobs: vec![job.name.clone()], reason });
        }
    }

    // Starving jobs, oldest first: their cheapest useful candidate, making room
    // from younger, non-guaranteed jobs outside their cooldown. Everyone else is
    // admitted by marginal gain below.
    for &j in &queue {
        if st.choice[j].is_some() || book.jobs[j].candidates.is_empty() || !inputs[j].starving(config) {
            continue;
        }
        let jc = &book.jobs[j];
        let cheapest = (0..jc.candidates.len())
            .filter(|&c| jc.candidates[c].value > EPS)
            .min_by(|&a, &b| st.cost(st.cand(j, a)).total_cmp(&st.cost(st.cand(j, b))).then(a.cmp(&b)));
        let Some(c) = cheapest else { continue };
        if st.fits(j, c) {
            st.set(j, Some(c));
        } else {
            let need = st.deficit(j, c);
            let protect = |k: usize| book.jobs[k].guaranteed || book.jobs[k].locked || inputs[k].starving(config);
            st.flush();
            if let Some((moves, lost)) = st.make_room(j, st.cand(j, c).group, need, &protect, st.cand(j, c).value)
                && lost < st.cand(j, c).value
            {
                for (k, opt) in moves {
                    st.set(k, opt);
                }
                st.set(j, Some(c));
            }
        }
    }

    improve(&mut st);
    if let Some(j) = (0..n).find(|&j| book.jobs[j].must_run && st.choice[j].is_none()) {
        let name = book.jobs[j].name.clone();
        return Err(Infeasible {
            reason: format!("job `{name}` is in its cooldown but its current allocation no longer fits"),
            jobs: vec![name],
        });
    }
    let objective = objective(book, &st.choice);
    Ok(Decision { choice: st.choice, objective })
}
