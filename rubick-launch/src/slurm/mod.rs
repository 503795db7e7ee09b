//! The Slurm backend: one run of the job contract as one `sbatch` job.
//!
//! [`Slurm`] is the [`Executor`](crate::executor::Executor): it prepares the run like the local backend
//! ([`prepare`](crate::contract::prepare)), writes a batch script beside the run's log (`<log>.sbatch`: `#SBATCH`
//! lines for the resources, the time limit, the log as `--output`, the working
//! directory; then the contract's environment, each value single-quoted, and `exec` of
//! the argv, each element single-quoted, so nothing of a job's name or arguments is ever
//! shell-parsed) and submits it with `sbatch --parsable`; a poll is one `scontrol show
//! job -o`. A blocking run ([`run`], rubick-profile's) is [`run_to_end`](crate::executor::run_to_end): polled every
//! 0.2 s until the job reaches a terminal state, watched by a [`Guard`](crate::guard::Guard) that cancels
//! the job (`scancel`) when the launcher dies, however it dies.
//!
//! Time: `timeoutS` counts from the moment the job is seen running (time pending in
//! the queue does not count). At the timeout every process of the job is sent
//! SIGTERM (`scancel --signal=TERM --full`); a job still there 0.2 s later is cancelled
//! (Slurm then sends SIGKILL after its `KillWait`), and the run returns once Slurm
//! has finished killing it (or 90 s later): its status is `Timeout`. A job still pending
//! [`PENDING_LIMIT`](crate::executor::PENDING_LIMIT) past its `timeoutS` is cancelled and
//! reported as an error. The job's own `--time` limit is `timeoutS + stopTimeoutS`
//! (rounded up to minutes), a backstop should the launcher be gone.
//!
//! Status and exit code: from the job's `ExitCode=A:B` (A, or none when the job was
//! killed by signal B). A job record already purged (`MinJobAge`) is looked up in the
//! job completion log (`sacct -c`), else the exit code is unknown. Slurm's
//! `OUT_OF_MEMORY` appends a marker line to the log so that [`collect`](crate::end::collect) reports `Oom`;
//! Slurm's own `TIMEOUT` (its time limit) is a `Timeout`.
//!
//! Environment: with `clear_env` the job starts from `PATH`, `HOME`, `LANG`, `TMPDIR`
//! and `USER` (sbatch runs with only those and `SLURM_CONF`, and exports what it has)
//! plus Slurm's own `SLURM_*` variables; otherwise from the launcher's environment.
//! `CUDA_VISIBLE_DEVICES` is Slurm's, from the `--gres=gpu:N` allocation: give the
//! request's context no `visible_devices`.
//!
//! Several nodes: the run names them (`nodelist`, in rank order: `--nodelist`), so the
//! first one is `{master_addr}` before the job is submitted. The batch script then
//! starts one launcher per node, `srun --nodes=1 --ntasks=1 --nodelist=NODE` with that
//! node's `{node_rank}` / `RUBICK_NODE_RANK` (and its per-node GPUs and cores), and
//! waits for all of them; its own exit status is the first failing node's (rank order).
//! The stop signal reaches every node's processes through Slurm (`scancel --signal
//! --full`); the batch shell traps it only to outlive it. Metric lines and checkpoints
//! come from rank 0 (the contract), into paths every node must see (a shared file
//! system).
//!
//! Limitations:
//! - On one node the argv runs once, as the batch step; on several, once per node.
//!   `ntasks_per_node` only sizes the allocation (a launcher like `torchrun` starts its
//!   workers itself).
//! - With `proctrack/linuxproc` (no cgroups) Slurm finds a job's processes by their
//!   parent pids: a signal reaches every process of the tree, but a process orphaned
//!   *before* the signal (daemonized, or left behind by a job that exited) is no longer
//!   in it and survives. `proctrack/cgroup` has no such hole; `wrapper` closes it
//!   (every launcher under a child subreaper that ends what it left behind).
//!
//! Files: [`batch`] (the resources of a job and its batch script), [`state`] (Slurm's job
//! states), [`query`] (the Slurm commands run, and what `scontrol`, `sacct` and `sinfo`
//! print, parsed), [`executor`] (the executor and the blocking run).

pub mod batch;
pub mod executor;
pub mod query;
pub mod state;

pub use batch::SlurmResources;
pub use executor::{Slurm, run};
pub use query::{NodeInfo, available, cancel, cluster_name, find_by_name, nodes, signal};
pub use state::JobState;

#[cfg(test)]
mod tests;
