//! # rubick-launch: the job contract, executed
//!
//! One run of a job under a plan: its argv and environment from the contract
//! ([`rubick_core::launch`]), the generated DeepSpeed configuration written beside it,
//! started under one of three backends (a local process group of its own, a Slurm
//! job, a Kubeflow PyTorchJob on Kubernetes), its metric lines collected, and all of it
//! killed at `timeoutS`, so that no process of a run outlives it.
//! `rubick-profile` and `rubick-run` both use this crate; neither depends on the other.
//!
//! Modules, from the leaves up:
//! * [`proc`] — the processes of a run as the kernel knows them: typed signals,
//!   `/proc`, the run's mark (its `RUBICK_METRICS=PATH`); it names no other module;
//! * [`error`] — [`LaunchError`], what every backend returns;
//! * [`contract`] — a run's request, its argv and environment resolved, its files;
//! * [`metrics`] — the one reader of a run's metric lines (`metrics.jsonl`): its
//!   tail backwards for what a round asks, the whole file as a stream, memory bounded;
//! * [`end`] — how a run ended: what its backend saw ([`Exit`]) and the one
//!   classification of it ([`RunStatus`], [`end::classify`]);
//! * [`wrap`] — the run wrapper every launcher runs under: a child subreaper that leaves
//!   no process of the run behind;
//! * [`guard`] — watchdogs that end a run with the process that started it;
//! * [`requires`] — what a job requires of where it runs (a GPU, its driver, files),
//!   checked before a run starts;
//! * [`executor`] — the one [`Executor`] trait (submit, poll, signal, recover over
//!   typed handles) and the blocking [`run_to_end`] every backend shares;
//! * the backends: [`local`] (this machine), [`slurm`] (one `sbatch` job per run, on
//!   one node or one launcher per node, tested against a real Slurm that
//!   `scripts/slurm-up.sh` starts), [`kubernetes`] (Kubeflow manifests, applied with
//!   kubectl or written for GitOps).

pub mod contract;
pub mod end;
pub mod error;
pub mod executor;
pub mod guard;
pub mod kubernetes;
pub mod local;
pub mod metrics;
pub mod proc;
pub mod requires;
pub mod slurm;
pub mod wrap;

pub use contract::{RunRequest, free_port};
pub use end::{Exit, RunOutcome, RunStatus};
pub use error::LaunchError;
pub use executor::{Executor, Handle, RunState, Submission, run_to_end};
pub use local::{Local, run};
pub use proc::RunSignal;

/// FNV-1a over `bytes`: a digest stable across builds and platforms (std's hasher is
/// not), for names and keys written to disk.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// A digest of `bytes` stable across builds and platforms, eight bytes a step (FNV-1a
/// takes one): the keys of the caches every command checks against a file of a
/// hundred kilobytes or more. It tells a changed file from the one a cache was made of;
/// it is no defence against a forger.
pub fn digest(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mix = |h: u64, w: u64| {
        let h = (h ^ w).wrapping_mul(K);
        h ^ (h >> 32)
    };
    let mut words = bytes.chunks_exact(8);
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    for w in words.by_ref() {
        h = mix(h, u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix(mix(h, u64::from_le_bytes(tail)), 0x5bd1_e995)
}

#[cfg(test)]
mod digest_tests {
    use super::digest;

    #[test]
    fn the_digest_is_stable_and_tells_one_byte_apart() {
        assert_eq!(digest(b""), digest(b""));
        assert_eq!(format!("{:016x}", digest(b"rubick")), format!("{:016x}", digest(b"rubick")));
        let text = b"version: 1\nround: 3\njobs: {}\n".to_vec();
        for i in 0..text.len() {
            let mut other = text.clone();
            other[i] ^= 1;
            assert_ne!(digest(&text), digest(&other), "byte {i}");
        }
        assert_ne!(digest(b"a"), digest(b"a\0"), "a trailing zero byte is told apart");
        assert_ne!(digest(&text[..8]), digest(&text[..16]));
    }
}

#[cfg(test)]
mod testing;
