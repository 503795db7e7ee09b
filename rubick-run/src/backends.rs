//! Backends: where runs execute, each a [`rubick_launch::Executor`] (submit, poll,
//! signal, recover over typed handles), one registry.
//!
//! * `local` — [`rubick_launch::local::Local`]: detached processes on this machine,
//!   each run in a process group of its own under the run wrapper (a child subreaper
//!   that records the group's id before the job starts and the job's exit code after it
//!   ends, both atomically in the run's directory, and ends whatever the job left
//!   behind): a `rubick-run` killed between starting a run and recording it finds it
//!   again from its pid file; `CUDA_VISIBLE_DEVICES` from the placement's GPU indices;
//!   pinned (`taskset`) to as many of this machine's cores as it was given, cores no
//!   other running job holds; a log file per run.
//!
//! * `slurm` — [`rubick_launch::slurm::Slurm`]: one `sbatch` job per run, named
//!   [`run_name`], requeued by Slurm after a preemption or a node failure.
//!
//! * `kubernetes` — [`rubick_launch::kubernetes::Kubernetes`]: Kubeflow PyTorchJob /
//!   TrainJob manifests and a ConfigMap, applied with kubectl when a cluster is
//!   configured, else written to a directory; its settings from the state directory's
//!   `kubernetes.yaml`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rubick_core::Job;
use rubick_core::launch::{Launch, LaunchContext, StopSignal};
pub use rubick_launch::{Executor, Exit, Handle, RunSignal, RunState};
use rubick_launch::{RunRequest, Submission};

use crate::reconcile::Allocation;

pub use rubick_launch::kubernetes;

/// What a backend needs to start a run.
#[derive(Debug)]
pub struct StartSpec {
    pub job: Job,
    /// The job's launch section as this run takes it (its working directory resolved,
    /// its iterations in the environment).
    pub launch: Launch,
    pub allocation: Allocation,
    /// This run's directory (log, metric lines, pid and exit files).
    pub dir: PathBuf,
    /// The job's checkpoints, kept across its runs.
    pub checkpoint_dir: PathBuf,
    /// CPU cores to pin the run to (local backend); empty: not pinned.
    pub cores: Vec<u32>,
}

impl StartSpec {
    /// Creates the run's directory (`dir`) and the job's checkpoint directory, and
    /// builds the run's launch request: the contract's context for this allocation
    /// (files in `dir`), with the master address and port and the GPU indices the
    /// backend decides (none: the backend's scheduler sets `CUDA_VISIBLE_DEVICES`).
    pub fn request(
        &self,
        dir: &Path,
        checkpoint_dir: &Path,
        master: (&str, u16),
        visible_devices: Vec<u32>,
    ) -> anyhow::Result<RunRequest<'_>> {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
        std::fs::create_dir_all(checkpoint_dir)
            .with_context(|| format!("{}: cannot create", checkpoint_dir.display()))?;
        let a = &self.allocation;
        let path = |name: &str| dir.join(name).display().to_string();
        Ok(RunRequest {
            launch: &self.launch,
            context: LaunchContext {
                job: self.job.name.clone(),
                plan: a.plan,
                nodes: a.nodes.len() as u32,
                node_rank: 0,
                gpus_per_node: a.nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0),
                cpus: a.nodes.iter().map(|n| n.cpus).sum(),
                master_addr: master.0.to_owned(),
                master_port: master.1,
                deepspeed_config: path("deepspeed.json"),
                checkpoint_dir: checkpoint_dir.display().to_string(),
                metrics: path("metrics.jsonl"),
                visible_devices,
            },
            log: dir.join("log.txt"),
            clear_env: false,
            stop_after_iterations: None,
            wrapper: None,
        })
    }

    /// The run as the executors take it: detached (it outlives this rubick-run), on the
    /// allocation's nodes, named [`run_name`], its master this machine on a free port
    /// (Slurm's runs: their first node), the first node's GPU indices (the local
    /// backend's; Slurm's and Kubernetes' schedulers pick their own).
    pub fn submission(&self) -> anyhow::Result<Submission<'_>> {
        let a = &self.allocation;
        let gpus = a.nodes.first().map(|n| n.gpus.clone()).unwrap_or_default();
        let request = self.request(&self.dir, &self.checkpoint_dir, ("127.0.0.1", rubick_launch::free_port()), gpus)?;
        Ok(Submission {
            request,
            dir: self.dir.clone(),
            nodes: a.nodes.clone(),
            cores: self.cores.clone(),
            name: run_name(&self.dir),
            detached: true,
            partition: None,
        })
    }
}

/// Makes a backend.
pub type MakeBackend = fn(Option<&Path>) -> anyhow::Result<Box<dyn Executor>>;

/// Backends by name.
pub const REGISTRY: [(&str, MakeBackend); 3] = [
    ("local", |_| Ok(Box::new(rubick_launch::Local::new()))),
    ("slurm", |_| Ok(Box::new(rubick_launch::slurm::Slurm::new()))),
    ("kubernetes", |root| Ok(Box::new(kubernetes::Kubernetes::configured(root)?))),
];

/// Whether a backend is called `name`.
pub fn known(name: &str) -> bool {
    REGISTRY.iter().any(|(n, _)| *n == name)
}

/// The backend called `name`, with the settings the state directory `root` keeps for
/// it (Kubernetes: `kubernetes.yaml`); `None` for an unknown name.
pub fn backend(name: &str, root: Option<&Path>) -> anyhow::Result<Option<Box<dyn Executor>>> {
    REGISTRY.iter().find(|(n, _)| *n == name).map(|(_, make)| make(root)).transpose()
}

/// Asks a run to stop (the contract's stop signal), waits up to `timeout` for all its
/// processes to exit, then kills what is left; `(seconds, exited cleanly)`.
pub fn stop(backend: &dyn Executor, handle: &Handle, dir: &Path, signal: StopSignal, timeout: Duration) -> (f64, bool) {
    rubick_launch::executor::stop(backend, handle, dir, signal, timeout, || crate::failpoint("stop-signalled"))
}

/// The name of a run, from its directory `STATE/jobs/JOB/attempt-N`:
/// `rubick-JOB-N-HASH`, HASH a digest of the state directory's path, so that two state
/// directories submitting to one cluster never find each other's runs (Slurm's job
/// name, by which a run a killed rubick-run never recorded is found again).
pub fn run_name(dir: &Path) -> Option<String> {
    let attempt = dir.file_name()?.to_str()?.strip_prefix("attempt-")?;
    let job_dir = dir.parent()?;
    let job = job_dir.file_name()?.to_str()?;
    let state = std::path::absolute(job_dir.parent()?.parent()?).ok()?;
    let hash = rubick_launch::fnv1a(state.as_os_str().as_encoded_bytes());
    Some(format!("rubick-{job}-{attempt}-{:08x}", hash & 0xffff_ffff))
}

#[cfg(test)]
mod registry_tests {
    #[test]
    fn the_registry_knows_every_backend_by_its_name() {
        for name in ["local", "slurm", "kubernetes"] {
            assert!(super::backend(name, None).unwrap().is_some_and(|b| b.name() == name), "{name}");
        }
        assert!(super::backend("yarn", None).unwrap().is_none());
    }
}
