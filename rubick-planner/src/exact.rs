//! The exact round as the planner sees it: a solver of the whole decision over the
//! Pareto candidates, injected by its callers (the MILP of `rubick-milp`, which links
//! HiGHS, built by the policies of `rubick-policy` that solve exactly), so that only
//! the binaries that plan link a solver.

use super::curves::CurveBook;
use rubick_core::Cluster;
use rubick_core::schedule::ExactStatus;

/// A solved round.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactSolution {
    /// One optional candidate index per job.
    pub choice: Vec<Option<usize>>,
    /// The choice's objective (see [`super::objective`]).
    pub objective: f64,
    /// Relative gap between the solution and the best bound.
    pub gap: f64,
    pub status: ExactStatus,
}

/// Why an exact solve has no solution.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExactError {
    #[error("no schedule gives every guaranteed job its guarantee")]
    Infeasible,
    /// The solver failed: its message.
    #[error("{0}")]
    Solver(String),
}

/// A solver of the exact round: the candidate per job (or none) that maximises the
/// objective within every node group's GPUs, cores and host memory, every guaranteed
/// and locked job running.
pub trait ExactSolver: std::fmt::Debug {
    /// Solves the round. `warm` is a feasible choice to start from (the heuristic's).
    fn solve(
        &self,
        book: &CurveBook,
        cluster: &Cluster,
        warm: Option<&[Option<usize>]>,
    ) -> Result<ExactSolution, ExactError>;
}
