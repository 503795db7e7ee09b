//! Slurm: each run one `sbatch` job (rubick-launch's batch script: resources as
//! `#SBATCH` lines, every value single-quoted), named `rubick-JOB-ATTEMPT-HASH` (HASH: of the state directory) so that a
//! run submitted by a `rubick-run` killed before recording its id is found again,
//! with `--requeue` (a preempted or failed node's job is requeued by Slurm and resumes
//! from its checkpoint: REQUEUED and PENDING count as alive, not as failures) and
//! `--signal=B:STOP@stopTimeoutS` (the stop signal before Slurm ends it). No time limit
//! is asked: the partition's default applies. GPUs are Slurm's to pick (`--gres`): the
//! schedule's GPU indices are not pinned.
//!
//! A node failing under a run: Slurm requeues the job, which, pinned to its nodes,
//! would wait for the failed one; `stranded` says so and the run is ended and its job
//! queued (no retry spent) for the next round to place on the nodes that are up. A job
//! Slurm ended `NODE_FAIL` (not requeued) counts as preempted, likewise.
//!
//! Nodes: when Slurm knows every node the schedule names (a cluster described by
//! `rubick-run cluster --backend slurm`), the run is placed on them (`--nodelist`, in
//! the schedule's order: the first is `{master_addr}`), one launcher per node; a run
//! on several nodes needs that. Otherwise (one node of a cluster file of its own
//! naming) Slurm picks the node.

use std::path::Path;

use rubick_launch::slurm;

use super::{Backend, RunSignal, StartSpec};

#[derive(Debug, Clone, Copy)]
pub struct Slurm;

/// The Slurm job name of a run, from its directory `STATE/jobs/JOB/attempt-N`:
/// `rubick-JOB-N-HASH`, HASH a digest of the state directory's path, so that two state
/// directories submitting to one cluster never find each other's jobs.
fn job_name(dir: &Path) -> Option<String> {
    let attempt = dir.file_name()?.to_str()?.strip_prefix("attempt-")?;
    let job_dir = dir.parent()?;
    let job = job_dir.file_name()?.to_str()?;
    let state = std::path::absolute(job_dir.parent()?.parent()?).ok()?;
    // FNV-1a: stable across builds and platforms (std's hasher is not).
    let hash = state
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    Some(format!("rubick-{job}-{attempt}-{:08x}", hash & 0xffff_ffff))
}

impl Backend for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn start(&self, spec: &StartSpec<'_>) -> anyhow::Result<String> {
        slurm::available().map_err(|reason| anyhow::anyhow!("--backend slurm: {reason}"))?;
        let a = spec.allocation;
        let names: Vec<String> = a.nodes.iter().map(|n| n.node.clone()).collect();
        let known = slurm::nodes()?;
        let pinned = !names.is_empty() && names.iter().all(|n| known.iter().any(|k| k.name == *n));
        if names.len() > 1 && !pinned {
            anyhow::bail!(
                "{} nodes ({}), not all of them Slurm's: a run on several nodes is placed on the nodes it was \
                 planned on (plan on `rubick-run cluster --backend slurm`)",
                names.len(),
                names.join(", ")
            );
        }
        // Slurm sets CUDA_VISIBLE_DEVICES from its own GPU allocation; a pinned run's
        // master is its first node (rubick-launch sets it).
        let request = spec.request(
            spec.dir,
            spec.checkpoint_dir,
            ("127.0.0.1", rubick_launch::supervise::free_port()),
            Vec::new(),
        )?;
        // Per node, the most any node of the run was given: Slurm asks alike of each.
        let memory_gib = a.nodes.iter().map(|n| n.host_memory_gib).fold(0.0, f64::max);
        let resources = slurm::SlurmResources {
            nodes: a.nodes.len().max(1) as u32,
            nodelist: if pinned { names } else { Vec::new() },
            ntasks_per_node: 1,
            gpus_per_node: request.context.gpus_per_node,
            cpus_per_task: a.nodes.iter().map(|n| n.cpus).max().unwrap_or(1).max(1),
            mem_mb: Some((memory_gib * 1024.0).ceil() as u64).filter(|m| *m > 0),
            job_name: job_name(spec.dir),
            time_limit_s: Some(0.0),
            requeue: true,
            signal_before_end_s: Some(spec.launch.stop_timeout_s.ceil() as u64),
            wrapper: Some(rubick_launch::wrap::command().map_err(anyhow::Error::msg)?),
            ..slurm::SlurmResources::default()
        };
        Ok(slurm::submit(&request, &resources)?)
    }

    fn alive(&self, handle: &str) -> bool {
        match slurm::job_state(handle) {
            Ok(Some((state, _))) => !slurm::is_terminal(&state),
            Ok(None) => false,
            // The controller does not answer: assume it still runs (never start it twice).
            Err(e) => {
                tracing::warn!("slurm job {handle}: {e}");
                true
            }
        }
    }

    fn signal(&self, handle: &str, signal: RunSignal) {
        let result =
            if signal == RunSignal::Kill { slurm::cancel(handle) } else { slurm::signal(handle, signal.name()) };
        if let Err(e) = result {
            tracing::warn!("slurm job {handle}: {e}");
        }
    }

    fn recover(&self, dir: &Path) -> Option<String> {
        slurm::find_by_name(&job_name(dir)?)
    }

    fn preempted(&self, handle: Option<&str>) -> bool {
        handle.is_some_and(
            |h| matches!(slurm::job_state(h), Ok(Some((state, _))) if state == "PREEMPTED" || state == "NODE_FAIL"),
        )
    }

    fn stranded(&self, handle: &str, nodes: &[String]) -> Option<String> {
        let why = match slurm::requeued(handle) {
            Ok(why) => why?,
            Err(e) => {
                tracing::warn!("slurm job {handle}: {e}");
                return None;
            }
        };
        let known = slurm::nodes().ok()?;
        let found: Vec<(&String, Option<&slurm::NodeInfo>)> =
            nodes.iter().map(|name| (name, known.iter().find(|k| k.name == *name))).collect();
        // Not pinned (nodes of a cluster file of its own naming): Slurm runs it again
        // wherever it can.
        if found.iter().all(|(_, k)| k.is_none()) {
            return None;
        }
        let down: Vec<String> = found
            .iter()
            .filter_map(|(name, k)| match k {
                Some(k) if k.usable() => None,
                Some(k) => Some(format!("{name} {}", k.state)),
                None => Some(format!("{name} gone")),
            })
            .collect();
        (!down.is_empty()).then(|| format!("Slurm requeued job {handle} ({why}); not usable: {}", down.join(", ")))
    }

    fn exit_code(&self, handle: Option<&str>, _dir: &Path) -> Option<i32> {
        match slurm::job_state(handle?) {
            Ok(Some((state, code))) if slurm::is_terminal(&state) => Some(code.unwrap_or(-1)),
            _ => None,
        }
    }
}
