//! The Kubernetes backend as an [`Executor`]: a run's manifests written (and applied
//! in kubectl mode), polled, deleted, recovered from its directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use rubick_core::launch::StopSignal;
use rubick_io::files::{Access, write_atomic_as};

use super::kubectl::{resource_conditions, terminal};
use super::manifests::{multi_document, parse_documents};
use super::settings::{Kubernetes, Mode, TrainingKind};
use crate::end::Exit;
use crate::error::LaunchError;
use crate::executor::{Executor, Handle, RunState, Submission};
use crate::guard::{Guard, Watch};
use crate::proc::RunSignal;

/// The run's manifests, in its directory: the record (both modes write it).
pub(crate) const MANIFESTS: &str = "manifests.yaml";
/// What kubectl mode applies (the ConfigMap and the active resource), in its directory.
pub(crate) const APPLY: &str = "apply.yaml";
/// The marker of a run signalled in directory mode.
pub(crate) const DELETED: &str = "deleted";
/// Where the run's GitOps copy was written.
pub(crate) const GITOPS_PATH: &str = "gitops-path";

/// `(name, run directory)` of a handle `NAME@DIR`.
fn parse_handle(handle: &str) -> Option<(&str, &Path)> {
    let (name, dir) = handle.split_once('@')?;
    (!name.is_empty() && !dir.is_empty()).then_some((name, Path::new(dir)))
}

/// The name in a run's `manifests.yaml`.
fn recorded_name(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(MANIFESTS)).ok()?;
    let docs = parse_documents(&text).ok()?;
    docs.first()?.get("metadata")?.get("name")?.as_str().map(str::to_owned)
}

/// The active training kind recorded in a run's `apply.yaml`.
fn applied_kind(dir: &Path) -> Option<TrainingKind> {
    let text = std::fs::read_to_string(dir.join(APPLY)).ok()?;
    parse_documents(&text).ok()?.iter().find_map(|d| match d.get("kind")?.as_str()? {
        "PyTorchJob" => Some(TrainingKind::PyTorchJob),
        "TrainJob" => Some(TrainingKind::TrainJob),
        _ => None,
    })
}

impl Kubernetes {
    /// Writes a run's manifests (and its GitOps copy), applies them in kubectl mode
    /// (watched by a guard unless the run is detached); its handle.
    fn start(&self, run: &Submission<'_>) -> anyhow::Result<Handle> {
        let launch = run.request.launch;
        if launch.stop_signal != StopSignal::Term {
            tracing::warn!(
                "{}: stopSignal {} cannot reach a Kubernetes pod (it is stopped with SIGTERM): \
                 use stopSignal: SIGTERM, or it is stopped without a checkpoint",
                run.request.context.job,
                launch.stop_signal.name()
            );
        }
        let shape = self.shape(run)?;
        let dir = PathBuf::from(&shape.run_dir);
        let docs = self.manifests(&shape);
        let text = multi_document(&docs)?;
        let _ = std::fs::remove_file(dir.join(DELETED));
        write_atomic_as(&dir.join(MANIFESTS), text.as_bytes(), Access::Private)?;
        if let Some(gitops) = &self.manifest_dir {
            let copy = std::path::absolute(gitops.join(format!("{}.yaml", shape.name)))?;
            if let Some(parent) = copy.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("{}: cannot create", parent.display()))?;
            }
            write_atomic_as(&copy, text.as_bytes(), Access::Private)?;
            write_atomic_as(&dir.join(GITOPS_PATH), copy.display().to_string().as_bytes(), Access::Private)?;
        }
        if self.mode == Mode::Kubectl {
            let [config_map, pytorch_job, train_job] = docs;
            let active = if self.kind == TrainingKind::PyTorchJob { pytorch_job } else { train_job };
            let apply = dir.join(APPLY);
            write_atomic_as(&apply, multi_document(&[config_map, active])?.as_bytes(), Access::Private)?;
            self.ensure_context()?;
            let apply = apply.display().to_string();
            self.kubectl(&["apply", "-f", &apply])?;
            if !run.detached {
                // This tool's run: deleted when the tool dies, however it dies.
                let delete = ["delete", "-f", &apply, "--ignore-not-found", "--wait=false"];
                let cleanup: Vec<&str> = std::iter::once("kubectl").chain(self.kubectl_args(&delete)).collect();
                match Guard::command(run.request.wrapper.as_deref(), &cleanup) {
                    Ok(guard) => self
                        .watches
                        .hold(&Handle::Kubernetes { name: shape.name.clone(), dir: dir.clone() }, Watch::Guard(guard)),
                    Err(e) => {
                        let _ = self.kubectl(&delete);
                        anyhow::bail!("{}: cannot start its watchdog: {e}", shape.name);
                    }
                }
            }
        }
        Ok(Handle::Kubernetes { name: shape.name, dir })
    }
}

impl Executor for Kubernetes {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn submit(&self, run: &Submission<'_>) -> Result<Handle, LaunchError> {
        self.start(run).map_err(|e| LaunchError::Backend(format!("kubernetes: {e:#}")))
    }

    /// kubectl: alive while its resource exists without a terminal condition or any of
    /// its pods is pending or running; its code 0 after `Succeeded`/`Complete`, 1 after
    /// `Failed`. Directory mode: alive while its manifests are there and not deleted.
    fn poll(&self, handle: &Handle, _dir: &Path, _nodes: &[String]) -> RunState {
        let Handle::Kubernetes { name, dir } = handle else {
            return RunState::Ended(Exit { note: Some(format!("{handle}: not a Kubernetes run")), ..Exit::default() });
        };
        if self.mode == Mode::Kubectl && dir.join(APPLY).exists() {
            let kind = applied_kind(dir).unwrap_or(TrainingKind::PyTorchJob);
            let state = resource_conditions(self, kind, name).and_then(|conditions| {
                let code = conditions.as_deref().and_then(terminal);
                if (conditions.is_some() && code.is_none()) || self.pods_left(kind, name)? {
                    return Ok(RunState::Running);
                }
                Ok(RunState::Ended(Exit { code, ..Exit::default() }))
            });
            // The API server does not answer: taken for alive (never started twice).
            return state.unwrap_or_else(|e| RunState::Unknown(format!("{name}: {e:#}")));
        }
        if dir.join(MANIFESTS).exists() && !dir.join(DELETED).exists() {
            RunState::Running
        } else {
            RunState::Ended(Exit::default())
        }
    }

    fn signal(&self, handle: &Handle, signal: RunSignal) {
        let Handle::Kubernetes { name, dir } = handle else { return };
        if self.mode == Mode::Kubectl && dir.join(APPLY).exists() {
            let apply = dir.join(APPLY).display().to_string();
            let mut args = vec!["delete", "-f", &apply, "--ignore-not-found", "--wait=false"];
            if signal == RunSignal::Kill {
                args.extend(["--grace-period=0", "--force"]);
            }
            if let Err(e) = self.kubectl(&args) {
                tracing::warn!("{name}: {e}");
            }
            if signal == RunSignal::Kill {
                let kind = applied_kind(dir).unwrap_or(TrainingKind::PyTorchJob);
                let selector = kind.pod_selector(name);
                let args = ["delete", "pods", "-l", &selector, "--grace-period=0", "--force", "--wait=false"];
                if let Err(e) = self.kubectl(&args) {
                    tracing::warn!("{name}: {e}");
                }
            }
        }
        if let Ok(copy) = std::fs::read_to_string(dir.join(GITOPS_PATH)) {
            let copy = copy.trim();
            if let Err(e) = std::fs::remove_file(copy)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("{copy}: cannot remove: {e}");
            }
        }
        if let Err(e) = write_atomic_as(&dir.join(DELETED), format!("{}\n", signal.name()).as_bytes(), Access::Private)
        {
            tracing::warn!("{name}: {e}");
        }
    }

    fn recover(&self, dir: &Path, _name: Option<&str>) -> Option<Handle> {
        let dir = std::path::absolute(dir).ok()?;
        Some(Handle::Kubernetes { name: recorded_name(&dir)?, dir })
    }

    fn handle(&self, text: &str) -> Option<Handle> {
        let (name, dir) = parse_handle(text)?;
        Some(Handle::Kubernetes { name: name.to_owned(), dir: dir.to_path_buf() })
    }

    fn release(&self, handle: &Handle) {
        self.watches.release(handle);
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(500)
    }
}
