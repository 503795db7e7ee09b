//! The Sia artifact's own workloads, replayed with its measured step times as the truth.
//!
//! Source: siasosp23/artifacts at aaf7a0d, `sia-simulator/` (`applications.py`,
//! `job.py`), whose `workloads/` and `traces/` are under `../shared/reference/sia/`.
//! Only the figures are read here; the rules below follow the artifact's code.
//!
//! * **A workload** (`workloads/<set>/workload-N.csv`: `name, time, application,
//!   num_replicas, batch_size`): one job per row, submitted at `time`, asking for
//!   `num_replicas` GPUs, training at the global batch `batch_size` throughout (no
//!   batch-size tuning, for every policy: the artifact's `disable_bsz_tuning`).
//! * **A job's work** (`job.py`, `Job::step`): the artifact's job ends when its
//!   progress reaches `get_progress(max_epochs)` (the smallest progress over the
//!   application's validation runs), progress growing per iteration by the gradient
//!   noise gain `(var + sqr) / (var / scale + sqr)` at `scale = batch / init_batch`,
//!   with `sqr`, `var` of the epoch interpolated between the validated batch sizes. At
//!   a fixed batch that is `sum over epochs of (progress(e + 1) - progress(e)) /
//!   gain(batch, e)` iterations: the job's `iterations`. `max_epochs` and the restart
//!   times are `applications.py`'s.
//! * **The truth** of an iteration on `dp` GPUs of a type (`update_local_bsz`,
//!   `get_throughput`): local batch `batch / dp`, accumulation steps
//!   `ceil(local / max_local) - 1` (at least 1 on one GPU above the initial batch),
//!   atomic batch `ceil(local / (accum + 1))` capped by the largest measured on that
//!   many GPUs; time `step(atomic) + accum * (step(atomic) - sync(atomic))`. `step`
//!   and `sync` come from `placements-<type>.csv` at the placement (as the artifact
//!   names it: the smallest rotation of its per-node counts), linearly interpolated in
//!   the local batch ([`Basis::Measured`]). A placement the table lacks is
//!   interpolated from the rows of the same node and GPU counts (the table's means
//!   and `scalability-<type>.csv`), then between GPU counts, then between node counts
//!   ([`Basis::Interpolated`]); the artifact uses one `LinearNDInterpolator` over
//!   (nodes, GPUs, local batch) there, a Delaunay interpolation this separable one
//!   approximates. A batch outside the measured range is clamped to it
//!   ([`Basis::Extrapolated`]; the artifact returns no throughput there).
//! * **The belief** every policy sees ([`belief_rows`]): the performance model fitted
//!   on 5 rows of the truth as `rubick-profile` would measure them, all on the A100
//!   (`dgx-ext`) nodes: 1, 2, 4 and 8 GPUs of one node and 2 x 8 GPUs, at the job's
//!   own batch. Other GPU types are predicted through the cluster's `computeSpeed` (one
//!   number per type, not per application: the belief is wrong there, the truth is not).
//! * **The plan**: the artifact's applications run data parallelism with accumulation
//!   only, so each job's `launch.supports` refuses TP, PP, ZeRO, offload and
//!   checkpointing; the plans that remain differ in GPUs and placement only.
//! * **Deviation**: this project's plans keep the global batch exactly (`dp` divides
//!   it), where the artifact rounds the local batch up. A job asking for a GPU count
//!   that does not divide its batch (6 GPUs at batch 2,048) asks for the largest
//!   count below that does, and no policy is offered such counts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rubick_core::cluster::{Cluster, NodeGroup};
use rubick_core::job::{JobRequest, Resharding};
use rubick_core::launch::{Launch, PlanSupport, StopSignal};
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::{Plan, PlanCode, PlanRequest};
use rubick_core::{Job, limits};
use rubick_io::files::read_text;
use rubick_model::fit::{FitOptions, Observation, fit};
use rubick_model::perfmodel::{Links, Params};

use crate::truth::Basis;

mod steps;
pub use steps::{StepTable, placement_id};

/// The GPU types of the artifact's heterogeneous cluster: a node group's `gpuType` and
/// the suffix of its tables (`placements-<suffix>.csv`).
pub const GPU_TYPES: [(&str, &str); 3] = [("T4", "aws"), ("RTX-2080Ti", "rtx"), ("A100", "dgx-ext")];

/// The table suffix of a node group's GPU type (its `gpuType`, or the suffix itself).
pub fn suffix_of(gpu_type: &str) -> Option<&'static str> {
    GPU_TYPES
        .iter()
        .find(|(t, s)| t.eq_ignore_ascii_case(gpu_type) || s.eq_ignore_ascii_case(gpu_type))
        .map(|(_, s)| *s)
}

/// The suffix whose rows the belief is fitted on.
pub const BELIEF_SUFFIX: &str = "dgx-ext";

/// An application of the artifact: its `applications.py` constants and, for this
/// project's performance model, an approximate shape (the fit absorbs the constants).
#[derive(Debug, Clone, Copy)]
pub struct Application {
    pub name: &'static str,
    /// `max_epochs` of `applications.py`.
    pub max_epochs: usize,
    /// `rescale_time`: seconds a restart costs the job.
    pub restart_s: f64,
    pub parameters: u64,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub seq_len: u32,
}

/// The applications of the artifact's Philly workloads (`gpt_pmp` and `ncf` are not in
/// them). Parameter counts are the published models' (ResNet-18 for CIFAR-10,
/// DeepSpeech2, BERT-base on SQuAD, YOLOv3, ResNet-50); layers, width and "tokens"
/// per sample only shape the model's memory and FLOPs estimates.
pub const APPLICATIONS: [Application; 5] = [
    Application {
        name: "cifar10",
        max_epochs: 100,
        restart_s: 50.0,
        parameters: 11_173_962,
        layers: 18,
        hidden: 512,
        heads: 8,
        seq_len: 64,
    },
    Application {
        name: "deepspeech2",
        max_epochs: 80,
        restart_s: 25.0,
        parameters: 38_000_000,
        layers: 7,
        hidden: 1024,
        heads: 8,
        seq_len: 256,
    },
    Application {
        name: "bert",
        max_epochs: 2,
        restart_s: 120.0,
        parameters: 110_000_000,
        layers: 12,
        hidden: 768,
        heads: 12,
        seq_len: 384,
    },
    Application {
        name: "yolov3",
        max_epochs: 50,
        restart_s: 80.0,
        parameters: 61_949_149,
        layers: 75,
        hidden: 512,
        heads: 8,
        seq_len: 416,
    },
    Application {
        name: "imagenet",
        max_epochs: 90,
        restart_s: 250.0,
        parameters: 25_557_032,
        layers: 50,
        hidden: 2048,
        heads: 8,
        seq_len: 224,
    },
];

/// A CSV's rows as maps from its header's names, with the line of each (for errors).
fn csv_rows(path: &Path) -> anyhow::Result<Vec<(usize, BTreeMap<String, String>)>> {
    let text = read_text(path)?;
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .with_context(|| format!("{}: empty, expected a header", path.display()))?
        .1
        .split(',')
        .map(|h| h.trim().to_owned())
        .collect();
    lines
        .map(|(i, l)| {
            let cells: Vec<&str> = l.split(',').collect();
            if cells.len() != header.len() {
                bail!("{}: line {}: {} fields, the header has {}", path.display(), i + 1, cells.len(), header.len());
            }
            Ok((i + 1, header.iter().cloned().zip(cells.into_iter().map(|c| c.trim().to_owned())).collect()))
        })
        .collect()
}

/// Field `name` of a row as a finite number, errors naming the file, line and field.
fn number(path: &Path, (line, row): &(usize, BTreeMap<String, String>), name: &str) -> anyhow::Result<f64> {
    let text = row.get(name).with_context(|| format!("{}: no column `{name}`", path.display()))?;
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => bail!("{}: line {line}: field `{name}`: expected a number >= 0, got `{text}`", path.display()),
    }
}

/// One epoch of a validation run: (progress at its end, grad_sqr, grad_var).
type Epoch = (f64, f64, f64);

/// An application's tables: step times per GPU type and its validation runs.
#[derive(Debug, Clone)]
pub struct AppData {
    pub app: Application,
    /// By table suffix.
    pub tables: BTreeMap<&'static str, StepTable>,
    /// By validated batch size.
    validation: BTreeMap<u64, Vec<Epoch>>,
}

impl AppData {
    /// Reads `traces/<app>/` for the GPU types of [`GPU_TYPES`].
    pub fn open(traces: &Path, app: Application) -> anyhow::Result<AppData> {
        let dir = traces.join(app.name);
        let mut tables = BTreeMap::new();
        for (_, suffix) in GPU_TYPES {
            tables.insert(suffix, StepTable::open(&dir, suffix)?);
        }
        let mut validation = BTreeMap::new();
        let entries = std::fs::read_dir(&dir).with_context(|| format!("{}: cannot list", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let Some(batch) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("validation-")?.strip_suffix(".csv")?.parse::<u64>().ok())
            else {
                continue;
            };
            let epochs = csv_rows(&path)?
                .iter()
                .map(|r| {
                    Ok((number(&path, r, "progress")?, number(&path, r, "grad_sqr")?, number(&path, r, "grad_var")?))
                })
                .collect::<anyhow::Result<Vec<Epoch>>>()?;
            validation.insert(batch, epochs);
        }
        anyhow::ensure!(!validation.is_empty(), "{}: no validation-<batch>.csv", dir.display());
        let shortest = validation.values().map(Vec::len).min().unwrap_or(0);
        anyhow::ensure!(
            shortest >= app.max_epochs,
            "{}: validation runs of {shortest} epochs, {} needs {}",
            dir.display(),
            app.name,
            app.max_epochs
        );
        Ok(AppData { app, tables, validation })
    }

    /// `init_batch_size`: the smallest validated batch.
    pub fn init_batch(&self) -> u64 {
        self.validation.keys().next().copied().unwrap_or(1)
    }

    /// `max_batch_size`: the largest validated batch.
    pub fn max_batch(&self) -> u64 {
        self.validation.keys().next_back().copied().unwrap_or(1)
    }

    /// `get_progress(epoch)`: the smallest progress over the validation runs.
    fn progress(&self, epoch: usize) -> f64 {
        if epoch == 0 {
            return 0.0;
        }
        self.validation.values().map(|v| v[epoch - 1].0).fold(f64::INFINITY, f64::min)
    }

    /// `get_grad_stats(batch, epoch)`: linear between the validated batches around it.
    fn grad_stats(&self, batch: u64, epoch: usize) -> (f64, f64) {
        let lower = self.validation.range(..=batch).next_back();
        let upper = self.validation.range(batch..).next();
        match (lower, upper) {
            (Some((&b0, v0)), Some((&b1, v1))) if b1 > b0 => {
                let w = (batch - b0) as f64 / (b1 - b0) as f64;
                (v0[epoch].1 + w * (v1[epoch].1 - v0[epoch].1), v0[epoch].2 + w * (v1[epoch].2 - v0[epoch].2))
            }
            (Some((_, v)), _) | (None, Some((_, v))) => (v[epoch].1, v[epoch].2),
            (None, None) => (0.0, 0.0),
        }
    }

    /// Iterations a job of global batch `batch` trains for (see the module doc).
    pub fn iterations(&self, batch: u64) -> u64 {
        let scale = batch as f64 / self.init_batch() as f64;
        let total: f64 = (0..self.app.max_epochs)
            .map(|e| {
                let (sqr, var) = self.grad_stats(batch, e);
                let gain = if var + sqr > 0.0 { (var + sqr) / (var / scale + sqr) } else { 1.0 };
                (self.progress(e + 1) - self.progress(e)) / gain
            })
            .sum();
        total.ceil().max(1.0) as u64
    }

    /// The model spec of a job of global batch `batch`, its activation memory set so
    /// that the largest local batch measured on one T4 (`aws`) fills 12 GiB of its
    /// 16 GiB (a memory limit `rubick-profile` finds by running out).
    pub fn spec(&self, batch: u64) -> ModelSpec {
        let a = &self.app;
        let max_local =
            self.tables.get("aws").map_or(1.0, |t| t.max_local(&Placement::new(vec![1]).expect("one GPU"))).max(1.0);
        let per_sample = f64::from(a.seq_len) * f64::from(a.layers) * f64::from(a.hidden);
        ModelSpec {
            api_version: None,
            kind: None,
            name: a.name.into(),
            parameters: Some(a.parameters),
            layers: a.layers,
            hidden: a.hidden,
            heads: a.heads,
            seq_len: a.seq_len,
            vocab: None,
            global_batch: batch,
            state_bytes: Default::default(),
            activation_factor: 12.0 * (1u64 << 30) as f64 / (max_local * per_sample),
            flash_attention: true,
            forward_1gpu_ms: None,
            measured_limits: None,
        }
    }

    /// The truth of `batch` on `placement` of GPU type `suffix`.
    pub fn iteration_s(&self, suffix: &str, placement: &Placement, batch: u64) -> Option<(f64, Basis)> {
        self.tables.get(suffix)?.iteration_s(placement, batch, self.init_batch(), self.max_batch())
    }
}

/// The step times of every application of a workload: the truth of a simulation of it.
#[derive(Debug, Clone, Default)]
pub struct StepTimes {
    apps: BTreeMap<String, AppData>,
}

impl StepTimes {
    /// The true iteration time of `plan` on `placement` of `group` for a job of `model`,
    /// when the tables know the model and the group's GPU type. The plan's micro-batch
    /// and accumulation are the artifact's (from the batch and the GPUs), not the plan's.
    pub fn iter_time_s(
        &self,
        model: &ModelSpec,
        group: &NodeGroup,
        plan: &Plan,
        placement: &Placement,
    ) -> Option<(f64, Basis)> {
        let app = self.apps.get(&model.name)?;
        let suffix = suffix_of(&group.gpu_type)?;
        let (t, basis) = app.iteration_s(suffix, placement, model.global_batch)?;
        // Only data parallelism was measured: another layout is no measurement.
        let dp_only = plan.tp == 1 && plan.pp == 1 && plan.dp == placement.gpus();
        Some((t, if dp_only { basis } else { Basis::Extrapolated }))
    }

    pub fn app(&self, name: &str) -> Option<&AppData> {
        self.apps.get(name)
    }
}

/// Whether `text` is a Sia workload (its header).
pub fn is_workload(text: &str) -> bool {
    text.lines()
        .next()
        .is_some_and(|h| h.split(',').map(str::trim).eq(["name", "time", "application", "num_replicas", "batch_size"]))
}

/// The artifact's `traces/` folder for a workload at `path`
/// (`<sia>/workloads/<set>/workload-N.csv` -> `<sia>/traces`).
pub fn traces_dir(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(path).with_context(|| format!("{}: cannot resolve", path.display()))?;
    abs.ancestors().skip(1).map(|d| d.join("traces")).find(|d| d.join("cifar10").is_dir()).with_context(|| {
        format!(
            "{}: a Sia workload, but no `traces/` folder of the Sia artifact above it (expected \
                 <sia>/workloads/<set>/workload-N.csv beside <sia>/traces/<application>/)",
            path.display()
        )
    })
}

/// The plans the artifact's applications run: data parallelism with accumulation.
fn data_parallel_only() -> Launch {
    Launch {
        version: 1,
        command: vec!["sia-application".into()],
        env: BTreeMap::new(),
        workdir: None,
        checkpoint_dir: None,
        stop_signal: StopSignal::default(),
        stop_timeout_s: 120.0,
        warmup_iterations: 3,
        measured_iterations: 10,
        timeout_s: 1800.0,
        supports: Some(PlanSupport {
            max_tp: Some(1),
            max_pp: Some(1),
            zero: Some(vec![0]),
            offload: Some(vec!["none".into()]),
            checkpointing: Some(false),
            accumulation: Some(true),
            sequence_parallel: None,
            selective_recompute: None,
            max_vp: None,
        }),
    }
}

/// The rows of the truth the belief of a job of `batch` is fitted on (see the module
/// doc): (plan, placement, iteration time) on the A100 nodes.
pub fn belief_rows(app: &AppData, batch: u64) -> Vec<(Plan, Placement, f64)> {
    [vec![1], vec![2], vec![4], vec![8], vec![8, 8]]
        .into_iter()
        .filter_map(|per_node| {
            let placement = Placement::new(per_node)?;
            let dp = placement.gpus();
            if !batch.is_multiple_of(u64::from(dp)) {
                return None;
            }
            let (t, _) = app.iteration_s(BELIEF_SUFFIX, &placement, batch)?;
            let local = u32::try_from(batch / u64::from(dp)).ok()?;
            let max_local = app.tables.get(BELIEF_SUFFIX)?.max_local(&placement).max(1.0);
            // The smallest accumulation that fits the measured batch and divides it.
            let ga = (1..=local).find(|g| local.is_multiple_of(*g) && f64::from(local / g) <= max_local)?;
            Some((Plan { micro_batch: local / ga, ga, ..Plan::data_parallel(dp, local / ga) }, placement, t))
        })
        .collect()
}

/// A Sia workload's jobs (each with its belief) and the step times of their
/// applications, for `cluster` (whose groups' `gpuType`s name [`GPU_TYPES`]).
pub fn open_workload(path: &Path, cluster: &Cluster) -> anyhow::Result<(Vec<(Job, Params)>, StepTimes)> {
    for g in &cluster.node_groups {
        anyhow::ensure!(
            suffix_of(&g.gpu_type).is_some(),
            "node group `{}`: gpuType `{}` has no Sia table (expected one of {})",
            g.name,
            g.gpu_type,
            GPU_TYPES.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
        );
    }
    let traces = traces_dir(path)?;
    let rows = csv_rows(path)?;
    let reference = cluster
        .node_groups
        .iter()
        .find(|g| suffix_of(&g.gpu_type) == Some(BELIEF_SUFFIX))
        .with_context(|| format!("the cluster has no `{BELIEF_SUFFIX}` node group, where beliefs are profiled"))?;
    let links = Links::from(reference);
    let mut times = StepTimes::default();
    let mut beliefs: BTreeMap<(String, u64), Params> = BTreeMap::new();
    let mut jobs = Vec::with_capacity(rows.len());
    for row in &rows {
        let line = row.0;
        let field = |name: &str| row.1.get(name).cloned().unwrap_or_default();
        let name = field("name");
        let application = field("application");
        let app = APPLICATIONS.iter().find(|a| a.name == application).with_context(|| {
            format!(
                "{}: line {line}: field `application`: `{application}` is not one of {}",
                path.display(),
                APPLICATIONS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
            )
        })?;
        if !times.apps.contains_key(app.name) {
            times.apps.insert(app.name.into(), AppData::open(&traces, *app)?);
        }
        let data = &times.apps[app.name];
        let submit = number(path, row, "time")?;
        let asked = number(path, row, "num_replicas")?;
        let batch = number(path, row, "batch_size")?;
        if asked < 1.0 || asked.fract() != 0.0 || asked > f64::from(limits::MAX_GPUS_PER_NODE * limits::MAX_NODES) {
            bail!(
                "{}: line {line}: field `num_replicas`: expected a whole number of GPUs, got {asked}",
                path.display()
            );
        }
        let batch = batch as u64;
        if batch < data.init_batch() || batch > data.max_batch() {
            bail!(
                "{}: line {line}: field `batch_size`: {batch} is outside {}'s validated batches ({} to {})",
                path.display(),
                app.name,
                data.init_batch(),
                data.max_batch()
            );
        }
        // The largest GPU count up to the request that divides the batch.
        let gpus = (1..=asked as u32).rev().find(|g| batch.is_multiple_of(u64::from(*g))).unwrap_or(1);
        let spec = data.spec(batch);
        let key = (app.name.to_owned(), batch);
        if !beliefs.contains_key(&key) {
            let observations: Vec<Observation> = belief_rows(data, batch)
                .into_iter()
                .map(|(plan, placement, t)| Observation { plan, placement, links, iter_time_s: t })
                .collect();
            let fitted = fit(&spec, &observations, &FitOptions::default())
                .map_err(|e| anyhow::anyhow!("fitting the belief of {} at batch {batch}: {e}", app.name))?;
            beliefs.insert(key.clone(), fitted.params);
        }
        let job = Job {
            api_version: None,
            kind: None,
            name,
            model: spec,
            perf_model: None,
            submit_time_s: submit,
            iterations: data.iterations(batch),
            request: JobRequest {
                gpus,
                cpus: None,
                host_memory_gib: None,
                plan: Some(PlanRequest::Code(PlanCode::Ga)),
                gpu_type: None,
            },
            guaranteed: false,
            resharding: Resharding::DataParallel,
            restart_cost_s: Some(app.restart_s),
            current: None,
            launch: Some(data_parallel_only()),
            unsupported_plans: Vec::new(),
            slow_plans: Vec::new(),
            requires: None,
        };
        job.check().map_err(|e| anyhow::anyhow!("{}: line {line}: {e}", path.display()))?;
        jobs.push((job, beliefs[&key].clone()));
    }
    anyhow::ensure!(!jobs.is_empty(), "{}: no jobs", path.display());
    Ok((jobs, times))
}
