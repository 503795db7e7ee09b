//! # rubick-launch: the job contract, executed
//!
//! One run of a job under a plan: its argv and environment from the contract
//! ([`rubick_core::launch`]), the generated DeepSpeed configuration written beside it,
//! the process started in a process group of its own, its metric lines collected, and
//! the whole group killed at `timeoutS`, so that no process of a run outlives it.
//! `rubick-profile` and `rubick-run` both use this crate; neither depends on the other.
//!
//! Modules: [`executor`] (the one executor: a trait over typed handles and run states,
//! the local backend, the blocking run every backend shares), [`kubernetes`] (Kubeflow
//! manifests, applied with kubectl or written for GitOps), [`supervise`] (a run's
//! contract prepared, its processes and signals, its metric lines, how it ended), [`slurm`]
//! (one run as one `sbatch` job, on one node or one launcher per node, tested against a
//! real Slurm that `scripts/slurm-up.sh` starts), [`wrap`] (the run wrapper every
//! launcher runs under: a child subreaper that leaves no process of the run behind).

pub mod executor;
pub mod kubernetes;
pub mod slurm;
pub mod supervise;
pub mod wrap;

pub use executor::{End, Executor, Handle, NodeSlot, RunState, Submission, run_to_end};
pub use supervise::{RunOutcome, RunRequest, RunStatus, run};

/// FNV-1a over `bytes`: a digest stable across builds and platforms (std's hasher is
/// not), for names and keys written to disk.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
