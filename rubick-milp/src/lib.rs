//! # rubick-milp: the planner's exact round, solved by HiGHS
//!
//! A mixed-integer program over the Pareto candidates, the planner's
//! [`ExactSolver`]: the only crate that links HiGHS (its C++ library). The policies
//! of `rubick-policy` that solve exactly (`rubick`'s fallback, `rubick-milp`, Sia,
//! Pollux) build it, so only `rubick-plan` among the binaries links it.
//!
//! One binary `x[j, c]` per job and candidate, maximising `sum value[j, c] x[j, c]`
//! (normalised throughput, with each running job's restart and minimum-gain cost
//! already in the value of the candidates that change it) subject to
//!
//! * `sum_c x[j, c] <= 1` per job, `= 1` for guaranteed and locked jobs (a guaranteed
//!   job's candidates all meet its guarantee, a locked job's is its current one);
//! * per node group: GPUs, CPU cores and host memory of the chosen candidates within
//!   the group's totals; a candidate inside one node fits one node by construction.
//!
//! Warm-started from the heuristic's choice, single-threaded with a fixed seed, with a
//! time limit; the relative gap HiGHS proves is reported. A time limit makes the result
//! depend on the machine's load; [`Milp::deterministic`] bounds the search by
//! branch-and-bound nodes instead (the time limit stays as a safety net whose reaching
//! is reported, `time-limit` with its gap, and logged).
//!
//! [`knapsack`] solves the rounds whose only binding resource is one group's GPUs
//! exactly by dynamic programming (the goodput peers' rounds on one GPU type).

use std::num::NonZeroU32;
use std::time::Duration;

use highs::{HighsModelStatus, RowProblem, Sense};
use rubick_core::Cluster;
use rubick_core::schedule::ExactStatus;
use rubick_planner::CurveBook;
use rubick_planner::exact::{ExactError, ExactSolution, ExactSolver};

pub mod knapsack;
#[cfg(test)]
mod rounds;

/// The MILP with a time limit per round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Milp {
    pub time_limit: Duration,
    /// Branch-and-bound nodes per round at most (HiGHS' `mip_max_nodes`): a bound that
    /// does not depend on the machine's speed. `None`: unbounded.
    pub node_limit: Option<u64>,
    /// The relative gap at which a solution counts as optimal (`mip_rel_gap`).
    pub rel_gap: f64,
}

impl Milp {
    /// The MILP stopping each round after `time_limit` (with the best solution then).
    pub fn new(time_limit: Duration) -> Self {
        Milp { time_limit, node_limit: None, rel_gap: 1e-6 }
    }

    /// The MILP stopping at `rel_gap` or after `node_limit` branch-and-bound nodes,
    /// whichever first: the same book gives the same choice on any machine unless
    /// `time_limit` (a safety net) is reached first, which the solution's status says.
    pub fn deterministic(node_limit: u64, rel_gap: f64, time_limit: Duration) -> Self {
        Milp { time_limit, node_limit: Some(node_limit), rel_gap }
    }
}

impl ExactSolver for Milp {
    fn solve(
        &self,
        book: &CurveBook,
        cluster: &Cluster,
        warm: Option<&[Option<usize>]>,
    ) -> Result<ExactSolution, ExactError> {
        solve(book, cluster, warm, self)
    }
}

/// The solver's failure, as schedules report it.
fn failed(why: impl std::fmt::Display) -> ExactError {
    ExactError::Solver(format!("HiGHS found no solution: {why}"))
}

/// Solves the round. `warm` is a feasible choice to start from (the heuristic's).
fn solve(
    book: &CurveBook,
    cluster: &Cluster,
    warm: Option<&[Option<usize>]>,
    milp: &Milp,
) -> Result<ExactSolution, ExactError> {
    let mut pb = RowProblem::default();
    let mut cols = Vec::new(); // (job, candidate, column)
    for (j, jc) in book.jobs.iter().enumerate() {
        for (c, cand) in jc.candidates.iter().enumerate() {
            cols.push((j, c, pb.add_integer_column(cand.value, 0..=1)));
        }
    }
    let mut start = 0;
    for (j, jc) in book.jobs.iter().enumerate() {
        let n = jc.candidates.len();
        let row: Vec<_> = cols[start..start + n].iter().map(|&(_, _, col)| (col, 1.0)).collect();
        start += n;
        if jc.must_run {
            if n == 0 {
                return Err(ExactError::Infeasible);
            }
            pb.add_row(1.0..=1.0, row);
        } else if n > 1 {
            pb.add_row(..=1.0, row);
        }
        debug_assert!(cols[start - n..start].iter().all(|&(jj, _, _)| jj == j));
    }
    for g in 0..cluster.node_groups.len() {
        let cap = book.capacity[g];
        let in_group: Vec<_> =
            cols.iter().filter(|&&(j, c, _)| book.jobs[j].candidates[c].group == g).copied().collect();
        if in_group.is_empty() {
            continue;
        }
        // GPUs, cores and memory of the chosen candidates within the group's.
        let use_of = |j: usize, c: usize| {
            let cand = &book.jobs[j].candidates[c];
            [f64::from(cand.gpus), f64::from(cand.cpus), cand.host_memory_gib]
        };
        for (dim, limit) in [cap.gpus, cap.cpus, cap.mem].into_iter().enumerate() {
            pb.add_row(..=limit, in_group.iter().map(|&(j, c, col)| (col, use_of(j, c)[dim])));
        }
    }
    if cols.is_empty() {
        return Ok(ExactSolution {
            choice: vec![None; book.jobs.len()],
            objective: 0.0,
            gap: 0.0,
            status: ExactStatus::Optimal,
        });
    }
    let mut model = pb.try_optimise(Sense::Maximise).map_err(|e| failed(format_args!("{e:?}")))?;
    model.set_threads(NonZeroU32::MIN);
    model.set_option("time_limit", milp.time_limit.as_secs_f64().max(0.01));
    if let Some(nodes) = milp.node_limit {
        model.set_option("mip_max_nodes", i32::try_from(nodes).unwrap_or(i32::MAX));
    }
    model.set_option("mip_rel_gap", milp.rel_gap);
    model.set_option("mip_abs_gap", 1e-7);
    model.set_option("random_seed", 0);
    if let Some(warm) = warm {
        let mut x = vec![0.0; cols.len()];
        for (i, &(j, c, _)) in cols.iter().enumerate() {
            if warm[j] == Some(c) {
                x[i] = 1.0;
            }
        }
        if model.try_set_solution(Some(&x), None, None, None).is_err() {
            tracing::debug!("HiGHS refused the warm start");
        }
    }
    let solved = model.try_solve().map_err(|e| failed(format_args!("{e:?}")))?;
    let status = match solved.status() {
        HighsModelStatus::Optimal => ExactStatus::Optimal,
        HighsModelStatus::ReachedTimeLimit => {
            tracing::warn!(
                "the MILP reached its {:.1} s time limit: this round depends on the machine's load",
                milp.time_limit.as_secs_f64()
            );
            ExactStatus::TimeLimit
        }
        HighsModelStatus::Infeasible => return Err(ExactError::Infeasible),
        other => {
            if solved.primal_solution_status() != highs::HighsSolutionStatus::Feasible {
                return Err(failed(format_args!("{other:?}")));
            }
            ExactStatus::Stopped
        }
    };
    if solved.primal_solution_status() != highs::HighsSolutionStatus::Feasible {
        return Err(failed(format_args!("{} without a feasible solution", status.as_str())));
    }
    let x = solved.get_solution();
    let mut choice = vec![None; book.jobs.len()];
    for (i, &(j, c, _)) in cols.iter().enumerate() {
        if x.columns()[i] > 0.5 {
            choice[j] = Some(c);
        }
    }
    let objective = rubick_planner::objective(book, &choice);
    let gap = solved.mip_gap();
    Ok(ExactSolution { choice, objective, gap: if gap.is_finite() { gap.max(0.0) } else { 0.0 }, status })
}
