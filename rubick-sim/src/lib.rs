//! # rubick-sim: what a scheduling policy would do to a cluster's history
//!
//! A trace-driven cluster simulator, every policy on the same footing:
//!
//! * [`truth`]: how fast a configuration *really* runs (measured rows, an oracle fitted
//!   on all of them), kept apart from what a policy believes;
//! * the policies it runs are `rubick_policy`'s (one registry by name, shared with
//!   `rubick-plan schedule`); they see what [`engine`] hands them, never [`truth`];
//! * [`engine`]: the simulation as steps (jobs arrive, the policy decides, the round
//!   advances under the truth, results), driven by [`simulate`];
//! * [`trace`]: a trace's jobs with their beliefs; [`logs`]: real clusters' job logs
//!   (Philly, Slurm's `sacct`) turned into traces;
//! * [`sia`]: the Sia artifact's workloads, with its measured step times as the truth;
//! * [`summary`]: replicas summarised as a `SimulationSummary`.
//!
//! `rubick-plan simulate`, `compare` and `trace` are its commands.

pub mod engine;
pub mod logs;
pub mod sia;
pub mod summary;
pub mod trace;
pub mod truth;

pub use engine::{JobResult, SimConfig, SimJob, SimResult, simulate, simulate_seeds};
