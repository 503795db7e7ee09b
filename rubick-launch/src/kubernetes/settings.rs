//! The Kubernetes backend's settings: a file (`kubernetes.yaml` in a state directory),
//! over the environment's `RUBICK_K8S_*` variables, over the defaults.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::guard::Watches;

/// The default container image.
pub const DEFAULT_IMAGE: &str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime";
/// The backend's settings in a state directory (see [`Settings`]).
pub const SETTINGS_FILE: &str = "kubernetes.yaml";

/// Where manifests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `kubectl apply` / `delete` / `get`.
    Kubectl,
    /// Files only.
    Directory,
}

/// The training resource that runs (the other is generated suspended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainingKind {
    PyTorchJob,
    TrainJob,
}

impl TrainingKind {
    /// Its resource for `kubectl`.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            TrainingKind::PyTorchJob => "pytorchjobs.kubeflow.org",
            TrainingKind::TrainJob => "trainjobs.trainer.kubeflow.org",
        }
    }

    /// A label selector of its pods.
    pub(crate) fn pod_selector(self, name: &str) -> String {
        match self {
            TrainingKind::PyTorchJob => format!("rubick.dev/run={name}"),
            TrainingKind::TrainJob => format!("jobset.sigs.k8s.io/jobset-name={name}"),
        }
    }
}

/// The Kubernetes backend and its settings (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Kubernetes {
    pub mode: Mode,
    pub image: String,
    pub checkpoint_pvc: Option<String>,
    pub manifest_dir: Option<PathBuf>,
    pub kind: TrainingKind,
    /// kubectl's `--context` (default: its current context).
    pub context: Option<String>,
    /// kubectl's `--namespace` (default: the context's).
    pub namespace: Option<String>,
    /// A volume holding the runs' directories, mounted at the same path in the pods and
    /// on the machines that read the runs (see [`RunsVolume`]); none: each run's
    /// directory is an `emptyDir` in its pods.
    pub runs: Option<RunsVolume>,
    /// The watchdogs of runs that are not detached (a profile's): `kubectl delete` of
    /// the run when the submitting tool dies.
    pub(crate) watches: std::sync::Arc<Watches>,
}

/// A PersistentVolumeClaim (`claim`) mounted at `root` in every pod, where the machine
/// that submits the runs sees the same files (an NFS export, a cluster file system, a
/// `hostPath`-backed volume on a one-node cluster): a run whose directory is under
/// `root` writes its metric lines, log and checkpoints where `rubick-run` reads its
/// progress and `rubick-profile` its measurement; its checkpoints survive it without a
/// checkpoint claim of their own.
#[derive(Debug, Clone, PartialEq)]
pub struct RunsVolume {
    pub claim: String,
    pub root: PathBuf,
}

/// The backend's settings as a file: `apply --kubernetes FILE` keeps a copy in the state
/// directory (`kubernetes.yaml`), which every later command of that state reads. A field
/// left out falls back to its environment variable, then to the default.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// The container image (`RUBICK_K8S_IMAGE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// kubectl's context (default: its current one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The namespace the resources go to (default: the context's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A PersistentVolumeClaim for the checkpoints (`RUBICK_K8S_CHECKPOINT_PVC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_pvc: Option<String>,
    /// The GitOps directory (`RUBICK_K8S_MANIFEST_DIR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_dir: Option<PathBuf>,
    /// `true`: apply with kubectl; `false`: write manifests only (`RUBICK_KUBECTL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubectl: Option<bool>,
    /// `PyTorchJob` or `TrainJob` (`RUBICK_K8S_KIND`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A claim holding the runs' directories (`RUBICK_K8S_RUNS_PVC`; see [`RunsVolume`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_pvc: Option<String>,
    /// Where that claim is mounted, in the pods and on this machine alike
    /// (`RUBICK_K8S_RUNS_ROOT`; an absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_root: Option<PathBuf>,
}

impl Settings {
    /// Reads and checks a settings file; errors name the file and field.
    pub fn load(path: &Path) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
        let settings: Settings = serde_yaml_ng::from_str(&text).with_context(|| path.display().to_string())?;
        if let Some(kind) = &settings.kind {
            anyhow::ensure!(
                matches!(kind.to_ascii_lowercase().as_str(), "pytorchjob" | "trainjob"),
                "{}: kind: `{kind}` is neither PyTorchJob nor TrainJob",
                path.display()
            );
        }
        anyhow::ensure!(
            settings.runs_pvc.is_some() == settings.runs_root.is_some(),
            "{}: runsPvc and runsRoot go together (the claim, and where it is mounted)",
            path.display()
        );
        if let Some(root) = &settings.runs_root {
            anyhow::ensure!(
                root.is_absolute(),
                "{}: runsRoot: `{}` is not an absolute path",
                path.display(),
                root.display()
            );
        }
        for (field, value) in [("context", &settings.context), ("namespace", &settings.namespace)] {
            if let Some(v) = value {
                anyhow::ensure!(
                    !v.is_empty() && !v.starts_with('-') && !v.chars().any(char::is_control),
                    "{}: {field}: `{}` is not a kubectl name",
                    path.display(),
                    v.escape_debug()
                );
            }
        }
        Ok(settings)
    }
}

impl Kubernetes {
    /// The settings from `RUBICK_KUBECTL`, `KUBECONFIG`, `PATH`, `RUBICK_K8S_IMAGE`,
    /// `RUBICK_K8S_CHECKPOINT_PVC`, `RUBICK_K8S_MANIFEST_DIR` and `RUBICK_K8S_KIND`.
    pub fn from_env() -> Kubernetes {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let mode = match var("RUBICK_KUBECTL").as_deref().map(str::trim) {
            Some("1" | "true" | "yes") => Mode::Kubectl,
            Some("0" | "false" | "no") => Mode::Directory,
            _ if var("KUBECONFIG").is_some() && on_path("kubectl") => Mode::Kubectl,
            _ => Mode::Directory,
        };
        let kind = match var("RUBICK_K8S_KIND").map(|k| k.trim().to_ascii_lowercase()).as_deref() {
            Some("trainjob") => TrainingKind::TrainJob,
            Some(k) if k != "pytorchjob" => {
                tracing::warn!("RUBICK_K8S_KIND=`{k}`: neither PyTorchJob nor TrainJob; PyTorchJob is used");
                TrainingKind::PyTorchJob
            }
            _ => TrainingKind::PyTorchJob,
        };
        Kubernetes {
            mode,
            image: var("RUBICK_K8S_IMAGE").unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
            checkpoint_pvc: var("RUBICK_K8S_CHECKPOINT_PVC"),
            manifest_dir: var("RUBICK_K8S_MANIFEST_DIR").map(PathBuf::from),
            kind,
            context: None,
            namespace: None,
            runs: match (var("RUBICK_K8S_RUNS_PVC"), var("RUBICK_K8S_RUNS_ROOT").map(PathBuf::from)) {
                (Some(claim), Some(root)) if root.is_absolute() => Some(RunsVolume { claim, root }),
                (None, None) => None,
                _ => {
                    tracing::warn!("RUBICK_K8S_RUNS_PVC and RUBICK_K8S_RUNS_ROOT (absolute) go together: ignored");
                    None
                }
            },
            watches: Default::default(),
        }
    }

    /// The environment's settings, overridden by a state's `kubernetes.yaml` (see
    /// [`Settings`]) when it has one.
    pub fn configured(state_root: Option<&Path>) -> anyhow::Result<Kubernetes> {
        let k = Kubernetes::from_env();
        let Some(path) = state_root.map(|r| r.join(SETTINGS_FILE)).filter(|p| p.exists()) else { return Ok(k) };
        Ok(k.with(Settings::load(&path)?))
    }

    /// These settings over this backend's (a field left out keeps its value).
    #[must_use]
    pub fn with(mut self, s: Settings) -> Kubernetes {
        let k = &mut self;
        if let (Some(claim), Some(root)) = (s.runs_pvc, s.runs_root) {
            k.runs = Some(RunsVolume { claim, root });
        }
        if let Some(v) = s.image {
            k.image = v;
        }
        if let Some(v) = s.checkpoint_pvc {
            k.checkpoint_pvc = Some(v);
        }
        if let Some(v) = s.manifest_dir {
            k.manifest_dir = Some(v);
        }
        if let Some(v) = s.kubectl {
            k.mode = if v { Mode::Kubectl } else { Mode::Directory };
        }
        if let Some(v) = s.kind {
            k.kind = if v.eq_ignore_ascii_case("trainjob") { TrainingKind::TrainJob } else { TrainingKind::PyTorchJob };
        }
        k.context = s.context;
        k.namespace = s.namespace;
        self
    }

    /// Whether a run in `dir` is on the runs volume: its files (metric lines, log) are
    /// seen here as its pods write them.
    pub fn shares(&self, dir: &Path) -> bool {
        self.runs.as_ref().is_some_and(|r| dir.starts_with(&r.root))
    }
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            std::fs::metadata(d.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}
