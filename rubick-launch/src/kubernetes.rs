//! Kubernetes: each run becomes Kubeflow resources, applied with `kubectl` or written
//! as files for someone else (GitOps) to apply.
//!
//! # What is generated
//!
//! For a run in `.../jobs/JOB/attempt-N`, named `rubick-JOB-N` (a DNS-1123 label:
//! lowercase `[a-z0-9-]`, at most 48 characters so that the pods' and services' names
//! derived from it, `NAME-worker-12` or `NAME-node-0-12`, stay within 63; a job name
//! that had to be changed or shortened gets a hash of the original so that two jobs
//! never share a name), three manifests, labelled `rubick.dev/job`, `rubick.dev/attempt`
//! and `rubick.dev/run`:
//!
//! * a `ConfigMap` (`v1`) holding the plan: the job contract's environment (the
//!   `RUBICK_*` variables and the launch section's own, as
//!   [`crate::supervise::prepare`] resolves them) and the generated
//!   `deepspeed.json`;
//! * a `PyTorchJob` (Kubeflow Training Operator v1, `kubeflow.org/v1`): a `Master`
//!   (1 replica) and `Worker`s (nodes - 1, left out when 0), `restartPolicy: OnFailure`,
//!   one container `pytorch` (the name the operator requires) running the launch
//!   section's argv (`command` = its program, `args` = the rest) with `envFrom` the
//!   ConfigMap, `nvidia.com/gpu` (when the run has GPUs), `cpu` and `memory` as both
//!   limits and requests, `nprocPerNode` = GPUs per node, and the port
//!   `pytorchjob-port` 23456 declared (the operator's `MASTER_PORT`);
//! * a `TrainJob` (Kubeflow Trainer v2, `trainer.kubeflow.org/v1alpha1`) on the default
//!   `ClusterTrainingRuntime` `torch-distributed`: `trainer.numNodes`, `image`,
//!   `command`, `args`, `numProcPerNode`, `resourcesPerNode` and `env` inline (the
//!   trainer has no `envFrom` in the CRD); the volumes go through `podSpecOverrides`
//!   (replicated job and container `node`, the torch runtimes' names).
//!
//! Both training resources are generated, but only one is active: the other carries
//! `suspend: true` (`runPolicy.suspend` / `spec.suspend`), so applying the whole file
//! never trains twice. `RUBICK_K8S_KIND=TrainJob` makes the TrainJob the active one
//! (default: `PyTorchJob`, still the most widely installed operator).
//!
//! Paths inside the pods are the run's own paths, so that the contract's variables
//! (`RUBICK_METRICS`, `RUBICK_DEEPSPEED_CONFIG`, `RUBICK_CHECKPOINT_DIR`) and argv
//! placeholders hold true there: an `emptyDir` is mounted at the run's directory, the
//! ConfigMap's `deepspeed.json` at `DIR/deepspeed.json` (a `subPath` mount), and the
//! checkpoint volume at the job's checkpoint directory. `{master_addr}` becomes
//! `$(MASTER_ADDR)` (PyTorchJob; the operator sets it and the kubelet expands it in
//! `command`/`args`) or `$(PET_MASTER_ADDR)` (TrainJob, the torch plugin's variable);
//! `{master_port}` 23456 or 29400 (Trainer v2's torch port). The metric lines are
//! written inside the pods: `rubick-run` does not see a Kubernetes run's progress, and
//! a profile cannot measure one, unless a **runs volume** is configured ([`RunsVolume`]:
//! `runsPvc` + `runsRoot`): a claim mounted at `runsRoot` in the pods and on this
//! machine alike, which then holds every run directory under it (metric lines, log,
//! checkpoints: they survive the run without a checkpoint claim). `rubick-profile run
//! --backend kubernetes` needs one (and kubectl mode); a profile's run is watched (the
//! run wrapper's `--watchdog`: `kubectl delete` when rubick-profile dies).
//!
//! # Modes
//!
//! * **kubectl**, when `RUBICK_KUBECTL=1`, or when it is not `0`, `kubectl` is on `PATH`
//!   and `KUBECONFIG` is set: `kubectl apply -f DIR/apply.yaml` (the ConfigMap and the
//!   active training resource, since the other kind's operator may not be installed);
//!   a run is alive while its resource exists without a `Succeeded`/`Complete`/`Failed`
//!   condition, or while any of its pods is pending or running (deleting the resource
//!   leaves its pods terminating for their grace period); any signal is
//!   `kubectl delete -f DIR/apply.yaml --wait=false` (`KILL`: with `--grace-period=0
//!   --force`, the pods too); the exit code is 0 after `Succeeded`/`Complete`, 1 after
//!   `Failed`. The current context's namespace applies.
//! * **directory** (otherwise): nothing is applied. The manifests are written, as one
//!   multi-document YAML, to `DIR/manifests.yaml` (both modes write it: the record) and,
//!   when `RUBICK_K8S_MANIFEST_DIR` is set, also to `THAT_DIR/NAME.yaml` for a GitOps
//!   tool to apply (both atomically: a temporary file, then a rename). A run is alive
//!   while `manifests.yaml` exists and `DIR/deleted` does not; any signal removes the
//!   GitOps copy (its path is kept in `DIR/gitops-path`) and writes the `deleted`
//!   marker; `recover` finds a run whose manifests exist and were not deleted; the exit
//!   code is unknown (`None`).
//!
//! The handle is `NAME@DIR` (the resource name and the run's absolute directory: the
//! trait's `alive` and `signal` get only the handle, and directory mode needs the
//! directory).
//!
//! # Settings
//!
//! `rubick-run apply --backend kubernetes --kubernetes FILE` takes them as YAML
//! ([`Settings`]: `image`, `context`, `namespace`, `checkpointPvc`, `manifestDir`,
//! `kubectl: true|false`, `kind`, `runsPvc`, `runsRoot`; `rubick-profile run --kubernetes
//! FILE` reads the same) and keeps a copy in the state directory
//! (`kubernetes.yaml`) that every later command of that state reads; `context` and
//! `namespace` go to every kubectl call. In kubectl mode without a `context`, kubectl
//! must have a current one: a start fails, saying so, when it has none. A field left
//! out falls back to its environment variable:
//!
//! * `RUBICK_K8S_IMAGE`: the container image (default `pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime`,
//!   an official PyTorch CUDA runtime; set it to an image that holds the training code
//!   and its dependencies, DeepSpeed included, at the paths the launch section names).
//! * `RUBICK_K8S_CHECKPOINT_PVC`: a PersistentVolumeClaim mounted at the checkpoint
//!   directory (multi-node runs need a `ReadWriteMany` one). Without it the checkpoints
//!   go to an `emptyDir`: they do **not** survive the run, so a restarted or
//!   reconfigured job starts from scratch.
//! * `RUBICK_K8S_MANIFEST_DIR`: the GitOps directory (directory mode, and as a copy in
//!   kubectl mode too).
//! * `RUBICK_KUBECTL`: `1` forces kubectl mode, `0` forces directory mode.
//! * `RUBICK_K8S_KIND`: `PyTorchJob` (default) or `TrainJob`, the active resource.
//! * `RUBICK_K8S_RUNS_PVC` and `RUBICK_K8S_RUNS_ROOT`: the runs volume (both or neither).
//!
//! # The stop signal
//!
//! Kubernetes stops a pod with SIGTERM (then SIGKILL after
//! `terminationGracePeriodSeconds`, set here to the launch section's `stopTimeoutS`
//! on the PyTorchJob's pods; a TrainJob's pods keep the runtime's grace period, since
//! `podSpecOverrides` cannot set it); a `preStop` hook cannot send another signal to
//! the training process. So a job run on this backend should say `stopSignal: SIGTERM`
//! and checkpoint on it; `start` logs a warning when it does not (the job is then
//! killed without a checkpoint when it is stopped).
//!
//! # Validation
//!
//! The tests parse the generated manifests back and validate the PyTorchJob and the
//! TrainJob against the OpenAPI v3 schemas of their CRDs (read from
//! `shared/reference/engines/kubeflow/` beside the workspace; skipped when absent) with a
//! structural validator that, like `kubectl apply --validate=strict`, rejects unknown
//! fields: `type`, `properties`, `required`, `additionalProperties`, `items`, `enum`,
//! `anyOf`, `x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-fields`,
//! `nullable`, `format: int32`, `minimum`, `minLength`/`maxLength`, the uniqueness of
//! `x-kubernetes-list-type: map`/`set` lists, and the resource-quantity `pattern` (by
//! hand; other patterns and the CEL rules `x-kubernetes-validations` are not checked).
//! A broken manifest (an unknown field, a wrong type, a missing required field) must
//! fail it. The ConfigMap (a core kind, no CRD) is checked by hand: `v1`, a DNS-1123
//! name, string values, under 1 MiB. No API server or operator ran: whether the
//! operators accept and run these resources is not tested here.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use rubick_core::launch::{LaunchContext, StopSignal};
use serde_yaml_ng::{Mapping, Value};

use crate::executor::{End, Executor, Handle, RunState, Submission, Watch, Watches};
use crate::supervise::{Guard, LaunchError, RunSignal};

/// The default container image.
pub const DEFAULT_IMAGE: &str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime";
/// The `ClusterTrainingRuntime` a TrainJob refers to.
pub const TRAINING_RUNTIME: &str = "torch-distributed";
/// The longest resource name generated (pods and services append to it).
pub const MAX_NAME: usize = 48;
/// The PyTorchJob's master port (declared as `pytorchjob-port`).
const PYTORCHJOB_PORT: u16 = 23456;
/// Trainer v2's torch port (`PET_MASTER_PORT`).
const TRAINJOB_PORT: u16 = 29400;
/// The TrainJob torch runtimes' replicated job and container.
const TRAINJOB_NODE: &str = "node";

const MANIFESTS: &str = "manifests.yaml";
const APPLY: &str = "apply.yaml";
const DELETED: &str = "deleted";
const GITOPS_PATH: &str = "gitops-path";
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
    fn resource(self) -> &'static str {
        match self {
            TrainingKind::PyTorchJob => "pytorchjobs.kubeflow.org",
            TrainingKind::TrainJob => "trainjobs.trainer.kubeflow.org",
        }
    }

    /// A label selector of its pods.
    fn pod_selector(self, name: &str) -> String {
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
    watches: std::sync::Arc<Watches>,
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

    /// kubectl's arguments with the settings' context and namespace first.
    fn kubectl_args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all: Vec<&str> = Vec::with_capacity(args.len() + 4);
        if let Some(c) = &self.context {
            all.extend(["--context", c]);
        }
        if let Some(n) = &self.namespace {
            all.extend(["--namespace", n]);
        }
        all.extend(args);
        all
    }

    /// kubectl with the settings' context and namespace.
    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubectl_args(args))
    }

    /// Fails with what to do when kubectl has no context to apply to.
    fn ensure_context(&self) -> anyhow::Result<()> {
        if self.context.is_some() {
            return Ok(());
        }
        kubectl(&["config", "current-context"]).map(drop).map_err(|e| {
            anyhow::anyhow!(
                "kubectl mode, but kubectl has no current context ({e}): set one (`kubectl config use-context`), \
                 name one (`context:` in the settings of `apply --kubernetes FILE`), or write manifests for GitOps \
                 (`kubectl: false`)"
            )
        })
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

/// `text` as a DNS-1123 label's characters: lowercase, runs of anything but
/// `[a-z0-9]` as one `-`, no `-` at either end.
fn dns_chars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

/// Whether `name` is a DNS-1123 label (what the resources' names must be here).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The resources' name of attempt `attempt` of job `job`: `rubick-JOB-ATTEMPT`,
/// sanitised (see the module's documentation).
pub fn resource_name(job: &str, attempt: &str) -> String {
    let attempt = {
        let a = dns_chars(attempt);
        let a = if a.is_empty() { "0".to_owned() } else { a };
        if a.len() > 10 { format!("{:08x}", crate::fnv1a(attempt.as_bytes()) as u32) } else { a }
    };
    let budget = MAX_NAME - "rubick-".len() - 1 - attempt.len();
    let clean = dns_chars(job);
    let part = if clean == job && !clean.is_empty() && clean.len() <= budget {
        clean
    } else {
        let hash = format!("{:06x}", crate::fnv1a(job.as_bytes()) & 0xff_ffff);
        let mut head = clean;
        head.truncate(budget - hash.len() - 1);
        let head = head.trim_end_matches('-');
        if head.is_empty() { hash } else { format!("{head}-{hash}") }
    };
    format!("rubick-{part}-{attempt}")
}

/// `text` as a label value: `[A-Za-z0-9_.-]`, at most 63, alphanumeric at both ends.
fn label_value(text: &str) -> String {
    let mapped: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' }).collect();
    let mut v: String = mapped.chars().take(63).collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    v.trim_start_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The attempt of a run's directory `.../attempt-N`.
fn attempt_of(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.strip_prefix("attempt-").unwrap_or(name).to_owned()
}

fn s(text: impl Into<String>) -> Value {
    Value::String(text.into())
}

fn seq(items: impl IntoIterator<Item = Value>) -> Value {
    Value::Sequence(items.into_iter().collect())
}

fn strings<'a>(items: impl IntoIterator<Item = &'a String>) -> Value {
    seq(items.into_iter().map(|x| s(x.as_str())))
}

/// A mapping from `(key, value)` pairs, in order.
fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(s(k), v);
    }
    Value::Mapping(m)
}

/// Adds `key: value` to the mapping `target`.
fn put(target: &mut Value, key: &str, value: Value) {
    if let Value::Mapping(m) = target {
        m.insert(s(key), value);
    }
}

/// What the manifests are made of.
#[derive(Debug, Clone)]
pub struct RunShape {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    pub host_memory_gib: f64,
    /// The ConfigMap's data: the environment and `deepspeed.json`.
    pub data: BTreeMap<String, String>,
    /// The PyTorchJob's argv.
    pub argv: Vec<String>,
    /// The TrainJob's argv and (inline) environment.
    pub trainjob_argv: Vec<String>,
    pub trainjob_env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub run_dir: String,
    pub checkpoint_dir: String,
    pub stop_timeout_s: f64,
}

/// A resource quantity of `gib` GiB (`64Gi`, or in MiB when fractional).
fn memory_quantity(gib: f64) -> String {
    if gib.fract() == 0.0 { format!("{gib:.0}Gi") } else { format!("{:.0}Mi", (gib * 1024.0).ceil()) }
}

impl Kubernetes {
    fn metadata(shape: &RunShape) -> Value {
        let labels = Value::Mapping(shape.labels.iter().map(|(k, v)| (s(k.as_str()), s(v.as_str()))).collect());
        map([("name", s(shape.name.as_str())), ("labels", labels)])
    }

    fn resources(shape: &RunShape) -> Value {
        let mut amounts = Mapping::new();
        if shape.gpus_per_node > 0 {
            amounts.insert(s("nvidia.com/gpu"), s(shape.gpus_per_node.to_string()));
        }
        if shape.cpus_per_node > 0 {
            amounts.insert(s("cpu"), s(shape.cpus_per_node.to_string()));
        }
        if shape.host_memory_gib > 0.0 {
            amounts.insert(s("memory"), s(memory_quantity(shape.host_memory_gib)));
        }
        map([("limits", Value::Mapping(amounts.clone())), ("requests", Value::Mapping(amounts))])
    }

    /// Where the run's directory lives: the runs volume holding it, if one does.
    fn runs_volume(&self, shape: &RunShape) -> Option<&RunsVolume> {
        self.runs.as_ref().filter(|_| self.shares(Path::new(&shape.run_dir)))
    }

    /// Whether the checkpoints get a volume of their own: their claim, else an `emptyDir`
    /// unless the runs volume holds them.
    fn checkpoint_volume(&self, shape: &RunShape) -> bool {
        self.checkpoint_pvc.is_some() || !self.shares(Path::new(&shape.checkpoint_dir))
    }

    /// The run's directory: on the runs volume (mounted at its root) when it is under
    /// it, else an `emptyDir`; the checkpoints: their claim, else the runs volume when it
    /// holds them (no volume of their own), else an `emptyDir`.
    fn volumes(&self, shape: &RunShape) -> Value {
        let claim = |name: &str, claim: &str| {
            map([("name", s(name)), ("persistentVolumeClaim", map([("claimName", s(claim))]))])
        };
        let scratch = |name: &str| map([("name", s(name)), ("emptyDir", map([]))]);
        let mut volumes = Vec::new();
        if self.checkpoint_volume(shape) {
            volumes.push(
                self.checkpoint_pvc.as_deref().map_or_else(|| scratch("checkpoints"), |c| claim("checkpoints", c)),
            );
        }
        volumes.push(self.runs_volume(shape).map_or_else(|| scratch("run"), |r| claim("run", &r.claim)));
        volumes.push(map([("name", s("plan")), ("configMap", map([("name", s(shape.name.as_str()))]))]));
        Value::Sequence(volumes)
    }

    fn volume_mounts(&self, shape: &RunShape) -> Value {
        let mount = |name: &str, at: String| map([("name", s(name)), ("mountPath", s(at))]);
        let mut mounts = Vec::new();
        if self.checkpoint_volume(shape) {
            mounts.push(mount("checkpoints", shape.checkpoint_dir.clone()));
        }
        let run_at = self.runs_volume(shape).map_or_else(|| shape.run_dir.clone(), |r| r.root.display().to_string());
        mounts.push(mount("run", run_at));
        mounts.push(map([
            ("name", s("plan")),
            ("mountPath", s(format!("{}/deepspeed.json", shape.run_dir.trim_end_matches('/')))),
            ("subPath", s("deepspeed.json")),
            ("readOnly", Value::Bool(true)),
        ]));
        Value::Sequence(mounts)
    }

    /// The ConfigMap.
    pub fn config_map(&self, shape: &RunShape) -> Value {
        let data = Value::Mapping(shape.data.iter().map(|(k, v)| (s(k.as_str()), s(v.as_str()))).collect());
        map([("apiVersion", s("v1")), ("kind", s("ConfigMap")), ("metadata", Self::metadata(shape)), ("data", data)])
    }

    /// The PyTorchJob.
    pub fn pytorch_job(&self, shape: &RunShape) -> Value {
        let mut container = map([
            ("name", s("pytorch")),
            ("image", s(self.image.as_str())),
            ("command", strings(shape.argv.first())),
            ("args", strings(shape.argv.iter().skip(1))),
            ("envFrom", seq([map([("configMapRef", map([("name", s(shape.name.as_str()))]))])])),
            (
                "ports",
                seq([map([
                    ("name", s("pytorchjob-port")),
                    ("containerPort", Value::from(PYTORCHJOB_PORT)),
                    ("protocol", s("TCP")),
                ])]),
            ),
            ("resources", Self::resources(shape)),
            ("volumeMounts", self.volume_mounts(shape)),
        ]);
        if let Some(dir) = &shape.workdir {
            put(&mut container, "workingDir", s(dir.as_str()));
        }
        let template = map([
            ("metadata", map([("labels", Self::metadata(shape).get("labels").cloned().unwrap_or_default())])),
            (
                "spec",
                map([
                    ("terminationGracePeriodSeconds", Value::from(shape.stop_timeout_s.max(0.0).ceil() as u64)),
                    ("containers", seq([container])),
                    ("volumes", self.volumes(shape)),
                ]),
            ),
        ]);
        let replica = |replicas: u32| {
            map([
                ("replicas", Value::from(replicas)),
                ("restartPolicy", s("OnFailure")),
                ("template", template.clone()),
            ])
        };
        let mut replicas = map([("Master", replica(1))]);
        if shape.nodes > 1 {
            put(&mut replicas, "Worker", replica(shape.nodes - 1));
        }
        let mut spec = map([("pytorchReplicaSpecs", replicas)]);
        if shape.gpus_per_node > 0 {
            put(&mut spec, "nprocPerNode", s(shape.gpus_per_node.to_string()));
        }
        if self.kind != TrainingKind::PyTorchJob {
            put(&mut spec, "runPolicy", map([("suspend", Value::Bool(true))]));
        }
        map([
            ("apiVersion", s("kubeflow.org/v1")),
            ("kind", s("PyTorchJob")),
            ("metadata", Self::metadata(shape)),
            ("spec", spec),
        ])
    }

    /// The TrainJob.
    pub fn train_job(&self, shape: &RunShape) -> Value {
        let env = seq(shape.trainjob_env.iter().map(|(k, v)| map([("name", s(k.as_str())), ("value", s(v.as_str()))])));
        let mut trainer = map([
            ("numNodes", Value::from(shape.nodes.max(1))),
            ("image", s(self.image.as_str())),
            ("command", strings(shape.trainjob_argv.first())),
            ("args", strings(shape.trainjob_argv.iter().skip(1))),
            ("env", env),
            ("resourcesPerNode", Self::resources(shape)),
        ]);
        if shape.gpus_per_node > 0 {
            put(&mut trainer, "numProcPerNode", Value::from(shape.gpus_per_node));
        }
        let labels = Self::metadata(shape).get("labels").cloned().unwrap_or_default();
        let overrides = map([
            ("targetJobs", seq([map([("name", s(TRAINJOB_NODE))])])),
            ("volumes", self.volumes(shape)),
            ("containers", seq([map([("name", s(TRAINJOB_NODE)), ("volumeMounts", self.volume_mounts(shape))])])),
        ]);
        let mut spec = map([
            ("runtimeRef", map([("name", s(TRAINING_RUNTIME))])),
            ("labels", labels),
            ("trainer", trainer),
            ("podSpecOverrides", seq([overrides])),
        ]);
        if self.kind != TrainingKind::TrainJob {
            put(&mut spec, "suspend", Value::Bool(true));
        }
        map([
            ("apiVersion", s("trainer.kubeflow.org/v1alpha1")),
            ("kind", s("TrainJob")),
            ("metadata", Self::metadata(shape)),
            ("spec", spec),
        ])
    }

    /// The three manifests: ConfigMap, PyTorchJob, TrainJob.
    pub fn manifests(&self, shape: &RunShape) -> [Value; 3] {
        [self.config_map(shape), self.pytorch_job(shape), self.train_job(shape)]
    }

    /// Prepares a run (its DeepSpeed configuration, metrics file and checkpoint
    /// directory, as every backend does) and what its manifests are made of.
    pub fn shape(&self, run: &Submission<'_>) -> anyhow::Result<RunShape> {
        let dir = std::path::absolute(&run.dir).with_context(|| run.dir.display().to_string())?;
        let checkpoint_dir = std::path::absolute(&run.request.context.checkpoint_dir)
            .with_context(|| run.request.context.checkpoint_dir.clone())?;
        let launch = run.request.launch;
        let job = run.request.context.job.clone();
        // The operator sets MASTER_ADDR (the kubelet expands it in command and args); the
        // device plugin picks the GPUs.
        let mut request = run.request.clone();
        request.context.master_addr = "$(MASTER_ADDR)".into();
        request.context.master_port = PYTORCHJOB_PORT;
        request.context.visible_devices = Vec::new();
        let prepared = crate::supervise::prepare(&request)?;
        let ds = dir.join("deepspeed.json");
        let deepspeed = std::fs::read_to_string(&ds).with_context(|| ds.display().to_string())?;
        let trainjob_context = LaunchContext {
            master_addr: "$(PET_MASTER_ADDR)".into(),
            master_port: TRAINJOB_PORT,
            ..request.context.clone()
        };
        let trainjob_argv = trainjob_context.argv(launch).map_err(anyhow::Error::msg)?;
        let trainjob_env =
            rubick_core::launch::environment(&trainjob_context, Some(launch)).map_err(anyhow::Error::msg)?;
        let mut data = prepared.env;
        for key in data.keys() {
            anyhow::ensure!(
                !key.is_empty()
                    && key.len() <= 253
                    && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')),
                "launch.env: `{key}` cannot be a ConfigMap key ([-._a-zA-Z0-9]+)"
            );
        }
        data.insert("deepspeed.json".to_owned(), deepspeed);
        let attempt = attempt_of(&dir);
        let name = resource_name(&job, &attempt);
        let labels = BTreeMap::from([
            ("rubick.dev/job".to_owned(), label_value(&job)),
            ("rubick.dev/attempt".to_owned(), label_value(&attempt)),
            ("rubick.dev/run".to_owned(), name.clone()),
        ]);
        let share = run.nodes.first();
        Ok(RunShape {
            name,
            labels,
            nodes: run.nodes.len().max(1) as u32,
            gpus_per_node: request.context.gpus_per_node,
            cpus_per_node: run.nodes.iter().map(|n| n.cpus).max().unwrap_or(0),
            host_memory_gib: share.map_or(0.0, |n| n.host_memory_gib).max(0.0),
            data,
            argv: prepared.argv,
            trainjob_argv,
            trainjob_env,
            workdir: prepared.workdir.map(|w| w.display().to_string()),
            run_dir: dir.display().to_string(),
            checkpoint_dir: checkpoint_dir.display().to_string(),
            stop_timeout_s: launch.stop_timeout_s,
        })
    }
}

/// Documents as one multi-document YAML.
fn multi_document(docs: &[Value]) -> anyhow::Result<String> {
    let mut text = String::new();
    for doc in docs {
        text.push_str("---\n");
        text.push_str(&serde_yaml_ng::to_string(doc)?);
    }
    Ok(text)
}

/// The documents of a multi-document YAML.
pub fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).map_err(anyhow::Error::from))
        .filter(|doc| !matches!(doc, Ok(Value::Null)))
        .collect()
}

/// Writes `text` to `path` atomically (a temporary file beside it, synced, renamed).
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("{}: temporary file", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}

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

/// Runs `kubectl ARGS`; its stdout, or an error with its stderr.
fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("kubectl").args(args).stdin(Stdio::null()).output().context("kubectl: cannot run it")?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `(exists, true conditions)` of a training resource.
fn resource_conditions(k: &Kubernetes, kind: TrainingKind, name: &str) -> anyhow::Result<Option<Vec<String>>> {
    let path = r#"jsonpath={.metadata.name}{range .status.conditions[?(@.status=="True")]} {.type}{end}"#;
    let out = k.kubectl(&["get", kind.resource(), name, "--ignore-not-found", "-o", path])?;
    let mut words = out.split_whitespace();
    Ok(words.next().map(|_| words.map(str::to_owned).collect()))
}

fn terminal(conditions: &[String]) -> Option<i32> {
    if conditions.iter().any(|c| c == "Failed") {
        Some(1)
    } else if conditions.iter().any(|c| c == "Succeeded" || c == "Complete") {
        Some(0)
    } else {
        None
    }
}

impl Kubernetes {
    /// Whether any pod of the run is pending or running (deleting the resource leaves
    /// its pods terminating for their grace period).
    fn pods_left(&self, kind: TrainingKind, name: &str) -> anyhow::Result<bool> {
        let pods = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &kind.pod_selector(name),
            "--field-selector=status.phase!=Succeeded,status.phase!=Failed",
            "-o",
            "name",
        ])?;
        Ok(!pods.trim().is_empty())
    }

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
        write_atomic(&dir.join(MANIFESTS), &text)?;
        if let Some(gitops) = &self.manifest_dir {
            let copy = std::path::absolute(gitops.join(format!("{}.yaml", shape.name)))?;
            write_atomic(&copy, &text)?;
            write_atomic(&dir.join(GITOPS_PATH), &copy.display().to_string())?;
        }
        if self.mode == Mode::Kubectl {
            let [config_map, pytorch_job, train_job] = docs;
            let active = if self.kind == TrainingKind::PyTorchJob { pytorch_job } else { train_job };
            let apply = dir.join(APPLY);
            write_atomic(&apply, &multi_document(&[config_map, active])?)?;
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
            return RunState::Ended(End { note: Some(format!("{handle}: not a Kubernetes run")), ..End::default() });
        };
        if self.mode == Mode::Kubectl && dir.join(APPLY).exists() {
            let kind = applied_kind(dir).unwrap_or(TrainingKind::PyTorchJob);
            let state = resource_conditions(self, kind, name).and_then(|conditions| {
                let code = conditions.as_deref().and_then(terminal);
                if (conditions.is_some() && code.is_none()) || self.pods_left(kind, name)? {
                    return Ok(RunState::Running);
                }
                Ok(RunState::Ended(End { code, ..End::default() }))
            });
            // The API server does not answer: taken for alive (never started twice).
            return state.unwrap_or_else(|e| RunState::Unknown(format!("{name}: {e:#}")));
        }
        if dir.join(MANIFESTS).exists() && !dir.join(DELETED).exists() {
            RunState::Running
        } else {
            RunState::Ended(End::default())
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
        if let Err(e) = write_atomic(&dir.join(DELETED), &format!("{}\n", signal.name())) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;
    use crate::executor::NodeSlot;
    use rubick_core::{Job, Plan};

    // ---- A structural validator of a value against a CRD's OpenAPI v3 schema ----

    /// The resource-quantity pattern of Kubernetes' CRDs, checked by hand below.
    const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

    /// `[+-]?(digits(.digits*)?|.digits+)`: the rest after it, if it starts with one.
    fn decimal(text: &str) -> Option<&str> {
        let t = text.strip_prefix(['+', '-']).unwrap_or(text);
        let digits = |x: &str| x.len() - x.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let whole = digits(t);
        let mut rest = &t[whole..];
        if let Some(after) = rest.strip_prefix('.') {
            let frac = digits(after);
            if whole == 0 && frac == 0 {
                return None;
            }
            rest = &after[frac..];
        } else if whole == 0 {
            return None;
        }
        Some(rest)
    }

    /// Whether `text` matches [`QUANTITY_PATTERN`].
    fn is_quantity(text: &str) -> bool {
        let Some(suffix) = decimal(text) else { return false };
        matches!(
            suffix,
            "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
        ) || suffix
            .strip_prefix(['e', 'E'])
            .filter(|e| !e.starts_with(['+', '-']) || e.len() > 1)
            .and_then(decimal)
            .is_some_and(str::is_empty)
    }

    fn type_name(value: &Value) -> &'static str {
        match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Sequence(_) => "array",
            Value::Mapping(_) => "object",
            Value::Tagged(_) => "tagged",
        }
    }

    fn flag(schema: &Value, key: &str) -> bool {
        schema.get(key).and_then(Value::as_bool).unwrap_or(false)
    }

    /// Appends to `errors` every way `value` (at `path`) breaks `schema`.
    fn validate(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
        if value.is_null() {
            if !flag(schema, "nullable") {
                errors.push(format!("{path}: null is not allowed"));
            }
            return;
        }
        let actual = type_name(value);
        if flag(schema, "x-kubernetes-int-or-string") {
            if !matches!(actual, "integer" | "string") {
                errors.push(format!("{path}: {actual}, not an integer or a string"));
                return;
            }
        } else if let Some(expected) = schema.get("type").and_then(Value::as_str) {
            let ok = expected == actual || (expected == "number" && actual == "integer");
            if !ok {
                errors.push(format!("{path}: {actual}, not {expected}"));
                return;
            }
        }
        if let Some(branches) = schema.get("anyOf").and_then(Value::as_sequence) {
            let any = branches.iter().any(|b| {
                let mut e = Vec::new();
                validate(value, b, path, &mut e);
                e.is_empty()
            });
            if !any {
                errors.push(format!("{path}: matches none of anyOf"));
            }
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_sequence)
            && !allowed.contains(value)
        {
            errors.push(format!("{path}: {value:?} is not one of {allowed:?}"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
            && pattern == QUANTITY_PATTERN
            && let Some(text) = value.as_str()
            && !is_quantity(text)
        {
            errors.push(format!("{path}: `{text}` is not a resource quantity"));
        }
        if let Some(text) = value.as_str() {
            let len = text.chars().count() as u64;
            if schema.get("maxLength").and_then(Value::as_u64).is_some_and(|m| len > m) {
                errors.push(format!("{path}: longer than maxLength"));
            }
            if schema.get("minLength").and_then(Value::as_u64).is_some_and(|m| len < m) {
                errors.push(format!("{path}: shorter than minLength"));
            }
        }
        if let Some(n) = value.as_f64().filter(|_| matches!(actual, "integer" | "number")) {
            if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| n < m) {
                errors.push(format!("{path}: below its minimum"));
            }
            if schema.get("format").and_then(Value::as_str) == Some("int32")
                && (n < f64::from(i32::MIN) || n > f64::from(i32::MAX))
            {
                errors.push(format!("{path}: out of int32"));
            }
        }
        match value {
            Value::Mapping(m) => {
                let properties = schema.get("properties").and_then(Value::as_mapping);
                for key in schema.get("required").and_then(Value::as_sequence).into_iter().flatten() {
                    if !m.contains_key(key) {
                        errors.push(format!("{path}: `{}` is required", key.as_str().unwrap_or("?")));
                    }
                }
                let additional = schema.get("additionalProperties");
                let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
                for (k, v) in m {
                    let Some(key) = k.as_str() else {
                        errors.push(format!("{path}: a key that is not a string"));
                        continue;
                    };
                    let at = format!("{path}.{key}");
                    if let Some(sub) = properties.and_then(|p| p.get(key)) {
                        validate(v, sub, &at, errors);
                    } else if let Some(sub) = additional.filter(|a| a.is_mapping()) {
                        validate(v, sub, &at, errors);
                    } else if additional.and_then(Value::as_bool) == Some(true) || preserve {
                    } else {
                        errors.push(format!("{at}: unknown field"));
                    }
                }
            }
            Value::Sequence(items) => {
                if let Some(sub) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        validate(item, sub, &format!("{path}[{i}]"), errors);
                    }
                }
                match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => {
                        for (i, item) in items.iter().enumerate() {
                            if items[..i].contains(item) {
                                errors.push(format!("{path}[{i}]: a duplicate in a set"));
                            }
                        }
                    }
                    Some("map") => {
                        let keys: Vec<&Value> = schema
                            .get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_sequence)
                            .into_iter()
                            .flatten()
                            .collect();
                        let key_of = |item: &Value| keys.iter().map(|k| item.get(*k).cloned()).collect::<Vec<_>>();
                        for (i, item) in items.iter().enumerate() {
                            if items[..i].iter().any(|other| key_of(other) == key_of(item)) {
                                errors.push(format!("{path}[{i}]: a duplicate key in a map list"));
                            }
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The errors of a custom resource against its CRD: apiVersion and kind, the
    /// metadata's name and labels (the API server's part), then the schema.
    fn validate_resource(resource: &Value, crd: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
        let api_version = resource.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let Some((_, version)) = api_version.split_once('/').filter(|(g, _)| *g == group) else {
            return vec![format!("apiVersion `{api_version}` is not in group {group}")];
        };
        if resource.get("kind").and_then(Value::as_str) != Some(kind) {
            errors.push(format!("kind: not {kind}"));
        }
        let Some(schema) = crd["spec"]["versions"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"].as_str() == Some(version) && flag(v, "served"))
            .map(|v| &v["schema"]["openAPIV3Schema"])
        else {
            return vec![format!("version {version} is not served")];
        };
        errors.extend(metadata_errors(resource));
        // The API server validates metadata itself; the schema says only `type: object`.
        let mut rest = resource.clone();
        if let Value::Mapping(m) = &mut rest {
            m.remove("metadata");
        }
        validate(&rest, schema, "", &mut errors);
        errors
    }

    fn metadata_errors(resource: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        let name = resource["metadata"]["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            errors.push(format!("metadata.name `{name}` is not a DNS-1123 label"));
        }
        for (k, v) in resource["metadata"]["labels"].as_mapping().into_iter().flatten() {
            let v = v.as_str().unwrap_or("\u{0}");
            if v != label_value(v) {
                errors.push(format!("metadata.labels.{k:?}: `{v}` is not a label value"));
            }
        }
        errors
    }

    // ---- Fixtures ----

    fn job(name: &str, stop_signal: &str) -> Job {
        serde_yaml_ng::from_str(&format!(
            "apiVersion: rubick/v1
kind: Job
name: {name}
model: {{ name: tiny, parameters: 1000000, layers: 4, hidden: 128, heads: 4, seqLen: 64, globalBatch: 16 }}
iterations: 100
request: {{ gpus: 1, plan: ga }}
launch:
  version: 1
  command: [python, train.py, --deepspeed, '{{deepspeed_config}}', --master, '{{master_addr}}:{{master_port}}']
  env: {{ OMP_NUM_THREADS: '{{cpus}}' }}
  stopSignal: {stop_signal}
  stopTimeoutS: 90
"
        ))
        .unwrap()
    }

    /// A plan on `nodes` nodes of `gpus` GPUs each (8 cores and 64 GiB per GPU).
    struct Allocation {
        plan: Plan,
        nodes: Vec<NodeSlot>,
    }

    fn allocation(plan: &str, nodes: u32, gpus: u32) -> Allocation {
        Allocation {
            plan: plan.parse::<Plan>().unwrap(),
            nodes: (0..nodes)
                .map(|i| NodeSlot {
                    name: format!("node-{i}"),
                    gpus: (0..gpus).collect(),
                    cpus: 8 * gpus,
                    host_memory_gib: 64.0 * f64::from(gpus),
                })
                .collect(),
        }
    }

    fn backend(kind: TrainingKind, pvc: Option<&str>, manifest_dir: Option<PathBuf>) -> Kubernetes {
        Kubernetes {
            mode: Mode::Directory,
            image: DEFAULT_IMAGE.to_owned(),
            checkpoint_pvc: pvc.map(str::to_owned),
            manifest_dir,
            kind,
            context: None,
            namespace: None,
            runs: None,
            watches: Default::default(),
        }
    }

    /// Starts a run in directory mode; `(handle, manifests.yaml's documents)`.
    fn start(k: &Kubernetes, root: &Path, job: &Job, a: &Allocation) -> (String, Vec<Value>) {
        let dir = root.join("jobs").join(&job.name).join("attempt-3");
        let checkpoints = root.join("jobs").join(&job.name).join("checkpoints");
        std::fs::create_dir_all(&dir).unwrap();
        let path = |name: &str| dir.join(name).display().to_string();
        let run = Submission {
            request: crate::RunRequest {
                launch: job.launch.as_ref().unwrap(),
                context: LaunchContext {
                    job: job.name.clone(),
                    plan: a.plan,
                    nodes: a.nodes.len() as u32,
                    node_rank: 0,
                    gpus_per_node: a.nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0),
                    cpus: a.nodes.iter().map(|n| n.cpus).sum(),
                    master_addr: "127.0.0.1".into(),
                    master_port: 29500,
                    deepspeed_config: path("deepspeed.json"),
                    checkpoint_dir: checkpoints.display().to_string(),
                    metrics: path("metrics.jsonl"),
                    visible_devices: Vec::new(),
                },
                log: dir.join("log.txt"),
                clear_env: false,
                stop_after_iterations: None,
                wrapper: None,
            },
            dir: dir.clone(),
            nodes: a.nodes.clone(),
            cores: Vec::new(),
            name: None,
            detached: true,
            partition: None,
        };
        let handle = k.submit(&run).unwrap();
        let docs = parse_documents(&std::fs::read_to_string(dir.join(MANIFESTS)).unwrap()).unwrap();
        (handle.to_string(), docs)
    }

    fn crd(file: &str) -> Option<Value> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/engines/kubeflow").join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            rubick_io::testing::missing(rubick_io::testing::Need::Crds, &format!("{} is absent", path.display()));
            return None;
        };
        Some(serde_yaml_ng::from_str(&text).unwrap())
    }

    fn config_map_errors(cm: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        if cm["apiVersion"].as_str() != Some("v1") || cm["kind"].as_str() != Some("ConfigMap") {
            errors.push("not a v1 ConfigMap".to_owned());
        }
        errors.extend(metadata_errors(cm));
        let data = cm["data"].as_mapping().cloned().unwrap_or_default();
        let mut size = 0;
        for (k, v) in &data {
            let key = k.as_str().unwrap_or_default();
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
                errors.push(format!("data key `{key}` is invalid"));
            }
            match v.as_str() {
                Some(text) => size += key.len() + text.len(),
                None => errors.push(format!("data.{key}: not a string")),
            }
        }
        if size >= 1 << 20 {
            errors.push(format!("data: {size} bytes, not under 1 MiB"));
        }
        errors
    }

    fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
        path.iter().fold(value, |v, k| match k.parse::<usize>() {
            Ok(i) => &v[i],
            Err(_) => &v[*k],
        })
    }

    // ---- Tests ----

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(resource_name("bert", "3"), "rubick-bert-3");
        for job in ["Bert_Large", "a..b", "--", "x".repeat(200).as_str(), "ünï", ""] {
            let name = resource_name(job, "12");
            assert!(is_dns_label(&name) && name.len() <= MAX_NAME, "{job:?} -> {name}");
            assert!(name.ends_with("-12"), "{name}");
        }
        assert_ne!(resource_name("A_b", "1"), resource_name("a-b", "1"));
        assert_eq!(label_value("-a b-"), "a-b");
        assert!(is_quantity("64Gi") && is_quantity("1.5") && is_quantity("100m") && is_quantity("1e3"));
        assert!(!is_quantity("64 Gi") && !is_quantity("Gi") && !is_quantity("1.2.3") && !is_quantity("1e"));
    }

    /// A runs volume: the run's directory is on it (mounted at its root, where this
    /// machine sees the same files), the checkpoints too (no volume of their own unless a
    /// claim is named); still valid against both CRDs; a run elsewhere keeps its
    /// `emptyDir`. Settings: both fields or neither, an absolute root.
    #[test]
    fn a_runs_volume_holds_the_runs_directories_where_this_machine_reads_them() {
        let root = tempfile::tempdir().unwrap();
        let runs = RunsVolume { claim: "rubick-runs".into(), root: root.path().to_path_buf() };
        let mut k = backend(TrainingKind::PyTorchJob, None, None);
        k.runs = Some(runs.clone());
        let job = job("bert", "SIGTERM");
        let (_, docs) = start(&k, root.path(), &job, &allocation("dp4-tp1-pp1-mb4-ga1", 2, 2));
        let dir = root.path().join("jobs/bert/attempt-3");
        assert!(k.shares(&dir) && !k.shares(Path::new("/elsewhere")));
        for (doc, pod) in [
            (&docs[1], &["spec", "pytorchReplicaSpecs", "Worker", "template", "spec"][..]),
            (&docs[2], &["spec", "podSpecOverrides", "0"][..]),
        ] {
            let pod = at(doc, pod);
            let volumes = pod["volumes"].as_sequence().unwrap();
            let names: Vec<&str> = volumes.iter().map(|v| v["name"].as_str().unwrap()).collect();
            assert_eq!(names, ["run", "plan"], "the checkpoints are on the runs volume: {pod:?}");
            assert_eq!(volumes[0]["persistentVolumeClaim"]["claimName"].as_str(), Some("rubick-runs"));
        }
        let c = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", "0"]);
        let mounts: Vec<(&str, &str)> = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
            .collect();
        let ds = dir.join("deepspeed.json").display().to_string();
        assert_eq!(mounts, [("run", root.path().to_str().unwrap()), ("plan", ds.as_str())]);
        if let (Some(pytorch_crd), Some(trainjob_crd)) =
            (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
        {
            assert_eq!(validate_resource(&docs[1], &pytorch_crd), Vec::<String>::new());
            assert_eq!(validate_resource(&docs[2], &trainjob_crd), Vec::<String>::new());
        }
        // With a checkpoint claim, the checkpoints keep it.
        k.checkpoint_pvc = Some("ckpt".into());
        let (_, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
        let pod = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]);
        let names: Vec<&str> =
            pod["volumes"].as_sequence().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["checkpoints", "run", "plan"]);
        // A run outside the volume: its directory is an emptyDir, as without one.
        let elsewhere = tempfile::tempdir().unwrap();
        k.runs = Some(RunsVolume { claim: "rubick-runs".into(), root: elsewhere.path().to_path_buf() });
        let (_, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
        let pod = at(&docs[1], &["spec", "pytorchReplicaSpecs", "Master", "template", "spec"]);
        assert!(pod["volumes"][1]["emptyDir"].is_mapping(), "{pod:?}");
        // Settings: the two fields together, the root absolute.
        let file = root.path().join("k8s.yaml");
        for (text, says) in [
            ("runsPvc: x\n", "go together"),
            ("runsRoot: /r\n", "go together"),
            ("runsPvc: x\nrunsRoot: rel/dir\n", "absolute"),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = format!("{:#}", Settings::load(&file).unwrap_err());
            assert!(e.contains(says) && e.contains("k8s.yaml"), "{text}: {e}");
        }
        std::fs::write(&file, "runsPvc: x\nrunsRoot: /r\n").unwrap();
        let k = backend(TrainingKind::PyTorchJob, None, None).with(Settings::load(&file).unwrap());
        assert_eq!(k.runs, Some(RunsVolume { claim: "x".into(), root: "/r".into() }));
    }

    #[test]
    fn manifests_are_valid_against_the_crds() {
        let (Some(pytorch_crd), Some(trainjob_crd)) =
            (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
        else {
            return;
        };
        let root = tempfile::tempdir().unwrap();
        let job = job("Bert_Large", "SIGTERM");
        let cases = [
            (backend(TrainingKind::PyTorchJob, None, None), allocation("dp2-tp1-pp1-mb4-ga2", 1, 2), 1u32, 2u32),
            (backend(TrainingKind::TrainJob, Some("ckpt"), None), allocation("dp8-tp1-pp1-mb4-ga2", 2, 4), 2, 4),
        ];
        for (k, a, nodes, gpus) in &cases {
            let (handle, docs) = start(k, root.path(), &job, a);
            assert_eq!(docs.len(), 3);
            let [cm, pj, tj] = [&docs[0], &docs[1], &docs[2]];
            let name = cm["metadata"]["name"].as_str().unwrap();
            assert!(handle.starts_with(&format!("{name}@")), "{handle}");
            assert!(name.starts_with("rubick-bert-large-") && name.ends_with("-3"), "{name}");
            assert_eq!(config_map_errors(cm), Vec::<String>::new());
            assert_eq!(validate_resource(pj, &pytorch_crd), Vec::<String>::new());
            assert_eq!(validate_resource(tj, &trainjob_crd), Vec::<String>::new());

            // The ConfigMap holds the plan.
            assert_eq!(cm["data"]["RUBICK_NODES"].as_str(), Some(nodes.to_string().as_str()));
            assert_eq!(cm["data"]["RUBICK_STOP_SIGNAL"].as_str(), Some("SIGTERM"));
            assert!(cm["data"]["deepspeed.json"].as_str().unwrap().contains("train_batch_size"));
            assert!(cm["data"].get("CUDA_VISIBLE_DEVICES").is_none());

            // The PyTorchJob.
            let specs = &pj["spec"]["pytorchReplicaSpecs"];
            assert_eq!(specs["Master"]["replicas"].as_u64(), Some(1));
            assert_eq!(specs.get("Worker").map(|w| w["replicas"].as_u64()), (*nodes > 1).then_some(Some(1)));
            assert_eq!(specs["Master"]["restartPolicy"].as_str(), Some("OnFailure"));
            assert_eq!(pj["spec"]["nprocPerNode"].as_str(), Some(gpus.to_string().as_str()));
            let c = at(specs, &["Master", "template", "spec", "containers", "0"]);
            assert_eq!(c["name"].as_str(), Some("pytorch"));
            assert_eq!(c["image"].as_str(), Some(DEFAULT_IMAGE));
            assert_eq!(c["command"][0].as_str(), Some("python"));
            assert_eq!(c["args"][4].as_str(), Some("$(MASTER_ADDR):23456"));
            assert_eq!(c["envFrom"][0]["configMapRef"]["name"].as_str(), Some(name));
            for side in ["limits", "requests"] {
                let r = &c["resources"][side];
                assert_eq!(r["nvidia.com/gpu"].as_str(), Some(gpus.to_string().as_str()));
                assert_eq!(r["cpu"].as_str(), Some((8 * gpus).to_string().as_str()));
                assert_eq!(r["memory"].as_str(), Some(format!("{}Gi", 64 * gpus).as_str()));
            }
            let pod = at(specs, &["Master", "template", "spec"]);
            assert_eq!(pod["terminationGracePeriodSeconds"].as_u64(), Some(90));
            let checkpoints = &pod["volumes"][0];
            match &k.checkpoint_pvc {
                Some(claim) => {
                    assert_eq!(checkpoints["persistentVolumeClaim"]["claimName"].as_str(), Some(claim.as_str()))
                }
                None => assert!(checkpoints["emptyDir"].is_mapping()),
            }
            assert_eq!(
                c["volumeMounts"][0]["mountPath"].as_str(),
                cm["data"]["RUBICK_CHECKPOINT_DIR"].as_str(),
                "the checkpoint volume is mounted at the contract's checkpoint directory"
            );
            assert_eq!(
                c["volumeMounts"][2]["mountPath"].as_str(),
                cm["data"]["RUBICK_DEEPSPEED_CONFIG"].as_str(),
                "deepspeed.json is where the contract says"
            );

            // The TrainJob.
            let t = &tj["spec"]["trainer"];
            assert_eq!(tj["spec"]["runtimeRef"]["name"].as_str(), Some("torch-distributed"));
            assert_eq!(t["numNodes"].as_u64(), Some(u64::from(*nodes)));
            assert_eq!(t["numProcPerNode"].as_u64(), Some(u64::from(*gpus)));
            assert_eq!(t["args"][4].as_str(), Some("$(PET_MASTER_ADDR):29400"));
            let env: BTreeMap<&str, &str> = t["env"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
                .collect();
            assert_eq!(env["RUBICK_PLAN"], cm["data"]["RUBICK_PLAN"].as_str().unwrap());
            assert_eq!(env["OMP_NUM_THREADS"], (8 * nodes * gpus).to_string());
            assert_eq!(t["resourcesPerNode"], c["resources"]);

            // Exactly one of the two is active.
            let pj_suspended = pj["spec"]["runPolicy"]["suspend"].as_bool() == Some(true);
            let tj_suspended = tj["spec"]["suspend"].as_bool() == Some(true);
            assert_eq!(pj_suspended, k.kind != TrainingKind::PyTorchJob);
            assert_eq!(tj_suspended, k.kind != TrainingKind::TrainJob);
        }
    }

    #[test]
    fn broken_manifests_fail_the_validator() {
        let (Some(pytorch_crd), Some(trainjob_crd)) =
            (crd("kubeflow.org_pytorchjobs.yaml"), crd("trainer.kubeflow.org_trainjobs.yaml"))
        else {
            return;
        };
        let root = tempfile::tempdir().unwrap();
        let k = backend(TrainingKind::PyTorchJob, None, None);
        let (_, docs) = start(&k, root.path(), &job("bert", "SIGTERM"), &allocation("dp8-tp1-pp1-mb4-ga2", 2, 4));
        let (pj, tj) = (&docs[1], &docs[2]);
        type Break = fn(&mut Value);
        let pytorch_breaks: [(&str, Break); 7] = [
            ("an unknown field in the container", |v| {
                put(
                    &mut v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0],
                    "gpus",
                    Value::from(4),
                )
            }),
            ("an unknown field in the spec", |v| put(&mut v["spec"], "replicas", Value::from(2))),
            ("replicas a string", |v| v["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = s("one")),
            ("nprocPerNode an integer", |v| v["spec"]["nprocPerNode"] = Value::from(4)),
            ("a bad quantity", |v| {
                v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["limits"]
                    ["memory"] = s("64 GiB")
            }),
            ("no pytorchReplicaSpecs", |v| {
                v["spec"].as_mapping_mut().unwrap().remove("pytorchReplicaSpecs");
            }),
            ("a container without a name", |v| {
                v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
                    .as_mapping_mut()
                    .unwrap()
                    .remove("name");
            }),
        ];
        for (what, break_it) in pytorch_breaks {
            let mut broken = pj.clone();
            break_it(&mut broken);
            let errors = validate_resource(&broken, &pytorch_crd);
            assert!(!errors.is_empty(), "{what}: the validator let it pass");
        }
        let trainjob_breaks: [(&str, Break); 5] = [
            ("envFrom in the trainer (not in the CRD)", |v| {
                put(&mut v["spec"]["trainer"], "envFrom", seq([map([("configMapRef", map([("name", s("x"))]))])]))
            }),
            ("numNodes a string", |v| v["spec"]["trainer"]["numNodes"] = s("2")),
            ("no runtimeRef", |v| {
                v["spec"].as_mapping_mut().unwrap().remove("runtimeRef");
            }),
            ("a duplicate env name", |v| {
                let env = v["spec"]["trainer"]["env"].as_sequence_mut().unwrap();
                let first = env[0].clone();
                env.push(first);
            }),
            ("numProcPerNode a list", |v| v["spec"]["trainer"]["numProcPerNode"] = seq([])),
        ];
        for (what, break_it) in trainjob_breaks {
            let mut broken = tj.clone();
            break_it(&mut broken);
            let errors = validate_resource(&broken, &trainjob_crd);
            assert!(!errors.is_empty(), "{what}: the validator let it pass");
        }
        // A wrong kind or group fails too, and so does a bad name.
        let mut wrong = pj.clone();
        wrong["apiVersion"] = s("kubeflow.org/v2");
        assert!(!validate_resource(&wrong, &pytorch_crd).is_empty());
        let mut wrong = pj.clone();
        wrong["metadata"]["name"] = s("Rubick_Bert");
        assert!(!validate_resource(&wrong, &pytorch_crd).is_empty());
        let mut cm = docs[0].clone();
        cm["data"]["RUBICK_NODES"] = Value::from(2);
        assert!(!config_map_errors(&cm).is_empty());
    }

    #[test]
    fn directory_mode_end_to_end() {
        let root = tempfile::tempdir().unwrap();
        let gitops = root.path().join("gitops");
        let k = backend(TrainingKind::PyTorchJob, None, Some(gitops.clone()));
        let job = job("bert", "SIGUSR1"); // warns: the pods get SIGTERM
        let (handle, docs) = start(&k, root.path(), &job, &allocation("dp2-tp1-pp1-mb4-ga2", 1, 2));
        let dir = root.path().join("jobs/bert/attempt-3");
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ConfigMap", "PyTorchJob", "TrainJob"]);
        assert_eq!(handle, format!("rubick-bert-3@{}", dir.display()));
        let copy = gitops.join("rubick-bert-3.yaml");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), std::fs::read_to_string(dir.join(MANIFESTS)).unwrap());
        assert!(!dir.join(APPLY).exists(), "directory mode applies nothing");
        let handle = k.handle(&handle).unwrap();
        assert_eq!(k.poll(&handle, &dir, &[]), RunState::Running);
        assert_eq!(k.recover(&dir, None), Some(handle.clone()));

        k.signal(&handle, RunSignal::Stop(Default::default()));
        assert_eq!(k.poll(&handle, &dir, &[]), RunState::Ended(End::default()), "ended, its code unknown");
        assert!(!copy.exists(), "the GitOps copy is removed");
        assert!(dir.join(MANIFESTS).exists(), "the record stays");
        assert_eq!(k.recover(&dir, None), Some(handle.clone()), "found again, ended");
        // Stopping a run through the trait's helper ends at once.
        let (_, clean) =
            crate::executor::stop(&k, &handle, &dir, StopSignal::Term, std::time::Duration::from_secs(1), || {});
        assert!(clean);

        // Nothing there: ended, nothing to recover, a malformed handle is refused.
        let gone = k.handle("rubick-x-1@/nonexistent/dir").unwrap();
        assert!(!k.poll(&gone, &dir, &[]).alive());
        assert_eq!(k.handle("garbage"), None);
        k.signal(&Handle::Slurm { job: "1".into() }, RunSignal::Term);
        assert_eq!(k.recover(&root.path().join("nowhere"), None), None);
    }
}
