//! What a test needs beyond cargo and this checkout ([`Need`]): found, or the test is
//! reported skipped (the list `make test` prints at the end), or fails where the need
//! is required (`CI=true`, or its `RUBICK_REQUIRE_*=1`).

use std::fs::File;
use std::path::PathBuf;

pub use rubick_testkit::Need;
use rubick_testkit::missing;

use crate::locks::{Held, Lock, lock};
use crate::repo;

/// Whether `need` is met here; when not, the calling test is reported skipped (or
/// fails, where the need is required) and should return.
pub fn needs(need: Need) -> bool {
    match find(need) {
        Ok(()) => true,
        Err(reason) => {
            missing(need, &reason);
            false
        }
    }
}

/// `Ok` when `need` is met, else why not and what to start.
fn find(need: Need) -> Result<(), String> {
    match need {
        Need::Slurm => rubick_launch::slurm::available().map_err(|e| format!("{e} (scripts/slurm-up.sh)")),
        Need::SlurmAccounting => {
            find(Need::Slurm)?;
            let out = std::process::Command::new("sacct")
                .args(["-n", "-P", "-o", "JobID", "-S", "now-1minutes"])
                .output()
                .map_err(|e| format!("cannot run sacct: {e}"))?;
            if out.status.success() {
                return Ok(());
            }
            Err(format!(
                "this Slurm keeps no accounting (`SLURM_ACCOUNTING=1 scripts/slurm-up.sh` starts slurmdbd): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
        Need::PyTorch => venv_dir().map(drop),
        Need::Reference => rubick_io::reference::locate(&repo()).map(drop).ok_or_else(|| {
            "no reference data: ../shared/reference/rubick-artifact beside the checkout, or $RUBICK_REFERENCE"
                .to_owned()
        }),
        Need::Crds => {
            let dir = repo().join("../shared/reference/engines/kubeflow");
            dir.is_dir().then_some(()).ok_or_else(|| format!("no Kubeflow CRDs at {}", dir.display()))
        }
        Need::Root => match rustix::process::geteuid().is_root() {
            true => Ok(()),
            false => Err("not root".to_owned()),
        },
    }
}

/// The authors' reference data set's directory ([`Need::Reference`]).
pub fn reference() -> Option<PathBuf> {
    needs(Need::Reference).then(|| rubick_io::reference::locate(&repo())).flatten()
}

/// Others' published measurements (vTrain, Sailor, Calculon) beside the reference data:
/// `../shared/reference/external`, or `$RUBICK_EXTERNAL` ([`Need::Reference`]).
pub fn external() -> Option<PathBuf> {
    let found = rubick_io::external::locate(&repo());
    if found.is_none() {
        missing(Need::Reference, "no ../shared/reference/external (set RUBICK_EXTERNAL to its path)");
    }
    found
}

/// The PyTorch workload's virtual environment ([`Need::PyTorch`]).
pub fn venv() -> Option<PathBuf> {
    match venv_dir() {
        Ok(dir) => Some(dir),
        Err(reason) => {
            missing(Need::PyTorch, &reason);
            None
        }
    }
}

/// `$RUBICK_VENV`, else `/var/tmp/rubick-venv`, when `scripts/python-env.sh` completed
/// it; else why not.
fn venv_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("RUBICK_VENV").map_or_else(|| PathBuf::from("/var/tmp/rubick-venv"), PathBuf::from);
    if !dir.join(".rubick-ok").exists() || !dir.join("bin/python").exists() {
        return Err(format!("no PyTorch virtual environment at {} (run scripts/python-env.sh)", dir.display()));
    }
    Ok(dir)
}

/// The shape of Slurm a test needs: at least `nodes` usable nodes with at least
/// `gpus_per_node` GPUs each.
#[derive(Debug, Clone, Copy)]
pub struct SlurmShape {
    /// Usable nodes.
    pub nodes: usize,
    /// GPUs on each of them (0: any node).
    pub gpus_per_node: u32,
}

/// The usable nodes of the test Slurm a test runs on, with the [`Lock::SlurmNodes`]
/// lock held for as long as the test keeps them.
#[derive(Debug)]
pub struct SlurmNodes {
    names: Vec<String>,
    _held: File,
}

impl std::ops::Deref for SlurmNodes {
    type Target = Vec<String>;

    fn deref(&self) -> &Vec<String> {
        &self.names
    }
}

/// The usable nodes of the Slurm this machine submits to that have the GPUs `shape`
/// asks for, in Slurm's order, when there are enough ([`Need::Slurm`]); else `None`,
/// the test reported skipped (or failed where Slurm is required) with the
/// `scripts/slurm-up.sh` line that starts a Slurm every test fits. The nodes' lock is
/// taken `how` before they are counted ([`Held::Exclusive`] for a test that drains or
/// fails nodes, which others must not count meanwhile).
pub fn slurm_nodes(shape: SlurmShape, how: Held) -> Option<SlurmNodes> {
    if !needs(Need::Slurm) {
        return None;
    }
    let held = lock(Lock::SlurmNodes, how);
    let names: Vec<String> = rubick_launch::slurm::nodes()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.usable() && n.gpus >= shape.gpus_per_node)
        .map(|n| n.name)
        .collect();
    if names.len() < shape.nodes {
        let SlurmShape { nodes, gpus_per_node } = shape;
        missing(
            Need::Slurm,
            &format!(
                "{} usable Slurm node(s) with {gpus_per_node}+ GPU(s), {nodes} needed \
                 (CI's Slurm fits every test: scripts/slurm-up.sh --nodes 3 --gpus-per-node 2)",
                names.len()
            ),
        );
        return None;
    }
    Some(SlurmNodes { names, _held: held })
}
