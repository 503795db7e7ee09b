//! # rubick-launch: the job contract, executed
//!
//! One run of a job under a plan: its argv and environment from the contract
//! ([`rubick_core::launch`]), the generated DeepSpeed configuration written beside it,
//! the process started in a process group of its own, its metric lines collected, and
//! the whole group killed at `timeoutS`, so that no process of a run outlives it.
//! `rubick-profile` and `rubick-run` both use this crate; neither depends on the other.
//!
//! Status: the local supervision of one run, and the Slurm backend ([`slurm`]: one run
//! as one single-node `sbatch` job, tested against a real Slurm that
//! `scripts/slurm-up.sh` starts). Kubernetes, GPU metrics and reconfiguration build on
//! them.

pub mod slurm;
pub mod supervise;

pub use supervise::{RunOutcome, RunRequest, RunStatus, run};
