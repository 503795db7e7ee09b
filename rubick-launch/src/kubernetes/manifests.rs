//! A run's manifests: what they are made of ([`RunShape`], from the submission), and
//! the ConfigMap, the PyTorchJob and the TrainJob built from it as YAML values.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use rubick_core::launch::LaunchContext;
use serde_yaml_ng::{Mapping, Value};

use super::names::{attempt_of, label_value, resource_name};
use super::settings::{Kubernetes, RunsVolume, TrainingKind};
use crate::contract::prepare;
use crate::executor::Submission;

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

pub(crate) fn s(text: impl Into<String>) -> Value {
    Value::String(text.into())
}

pub(crate) fn seq(items: impl IntoIterator<Item = Value>) -> Value {
    Value::Sequence(items.into_iter().collect())
}

fn strings<'a>(items: impl IntoIterator<Item = &'a String>) -> Value {
    seq(items.into_iter().map(|x| s(x.as_str())))
}

/// A mapping from `(key, value)` pairs, in order.
pub(crate) fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in entries {
        m.insert(s(k), v);
    }
    Value::Mapping(m)
}

/// Adds `key: value` to the mapping `target`.
pub(crate) fn put(target: &mut Value, key: &str, value: Value) {
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
        let prepared = prepare(&request)?;
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
pub(crate) fn multi_document(docs: &[Value]) -> anyhow::Result<String> {
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
