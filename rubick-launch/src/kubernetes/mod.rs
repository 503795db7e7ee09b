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
//!   [`crate::contract::prepare`] resolves them) and the generated
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
//! The tests (`kubernetes/tests.rs`) parse the generated manifests back and validate the PyTorchJob and the
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
//!
//! # Files
//!
//! [`settings`] (the backend's settings: file, environment, defaults), [`names`] (the
//! resources' names and labels), [`manifests`] (the ConfigMap, PyTorchJob and TrainJob
//! of a run), [`kubectl`] (the calls to kubectl and what they say of a run),
//! [`executor`] (the [`Executor`](crate::executor::Executor)).

pub mod executor;
pub mod kubectl;
pub mod manifests;
pub mod names;
pub mod settings;

pub use manifests::{RunShape, TRAINING_RUNTIME, parse_documents};
pub use names::{MAX_NAME, is_dns_label, resource_name};
pub use settings::{DEFAULT_IMAGE, Kubernetes, Mode, RunsVolume, SETTINGS_FILE, Settings, TrainingKind};

#[cfg(test)]
mod tests;
