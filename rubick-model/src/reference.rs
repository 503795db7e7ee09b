//! The Rubick authors' reference data (arXiv 2408.08586 artifact), as core types.
//!
//! Only text and values come in here; `rubick-io` reads the files
//! (`models.yaml`, `placements/*.csv`, `workloads/*.csv`, `profiles/<model>/`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::memory::MemoryEstimator;
use rubick_core::error::{ValidationError, ensure};
use rubick_core::limits;
use rubick_core::model::{MeasuredLimits, ModelSpec, StateBytes, TpPp};
use rubick_core::placement::Placement;
use rubick_core::plan::{Offload, Plan, PlanCode, PlanFamily, Recompute, ZeroStage};

/// GPU memory of the authors' testbed (A800-80GB).
pub const TESTBED_GPU_MEMORY_GIB: f64 = 80.0;

/// CPU cores per GPU the authors' measurements were taken with: every ZeRO-Offload
/// profiling run of `profiles/*/config.csv` has `num_cpu_threads` 4 (the CPU Adam's
/// threads per GPU process), and the traces request 4 or 8 per GPU.
pub const TESTBED_PROFILED_CPUS_PER_GPU: u32 = 4;

/// `models.yaml`: facts about the seven models.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceModels {
    pub models: BTreeMap<String, ModelFacts>,
}

/// Facts about one model, as transcribed by the reference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFacts {
    pub parameters: Option<u64>,
    pub hidden: u32,
    pub heads: u32,
    pub layers: u32,
    pub seq_len: u32,
    pub global_batch: u64,
    pub requested_iter_s: f64,
    #[serde(default)]
    pub forward_1gpu_ms: Option<f64>,
    pub max_micro_batch: BTreeMap<PlanFamily, u32>,
    #[serde(default)]
    pub fitted_bandwidth_gbps: BTreeMap<String, f64>,
}

impl ReferenceModels {
    /// Parses `models.yaml`; the error carries the YAML path and line.
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    }
}

impl ModelFacts {
    /// The model as a [`ModelSpec`], with its measured micro-batch limits; the 3-D
    /// limits hold at the TP x PP degrees of its measured rows `rows` (the only 3-D
    /// configurations known to have run).
    pub fn model_spec(&self, name: &str, rows: &[MeasuredRow]) -> ModelSpec {
        let mut tp_pp_degrees: Vec<TpPp> = rows
            .iter()
            .filter_map(|r| match r.code {
                PlanCode::ThreeD { pp, tp, .. } if tp * pp > 1 => Some(TpPp { tp, pp }),
                _ => None,
            })
            .collect();
        tp_pp_degrees.sort_unstable();
        tp_pp_degrees.dedup();
        ModelSpec {
            api_version: None,
            kind: None,
            name: name.to_owned(),
            parameters: self.parameters,
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            seq_len: self.seq_len,
            vocab: None,
            global_batch: self.global_batch,
            state_bytes: StateBytes::default(),
            activation_factor: 34.0,
            flash_attention: true,
            forward_1gpu_ms: self.forward_1gpu_ms,
            measured_limits: Some(MeasuredLimits {
                gpu_memory_gib: TESTBED_GPU_MEMORY_GIB,
                max_micro_batch: self.max_micro_batch.clone(),
                tp_pp_degrees,
            }),
        }
    }
}

/// Per-phase times of one iteration, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Phases {
    pub forward_s: f64,
    pub backward_sync_s: f64,
    pub optimizer_s: f64,
}

/// One measured row of `placements/<model>.csv`: the ground truth.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredRow {
    pub code: PlanCode,
    pub placement: Placement,
    pub iter_time_s: f64,
    /// Phases in seconds, when the row has them (some files use ms: normalised here).
    pub phases: Option<Phases>,
}

impl MeasuredRow {
    /// A row from its raw fields. Phase columns come in seconds or milliseconds
    /// depending on the file; they are taken as milliseconds when their sum is more
    /// than 20 times the iteration time.
    pub fn from_fields(
        code: &str,
        placement: &str,
        iter_time_s: f64,
        phases: Option<[f64; 3]>,
    ) -> Result<Self, String> {
        let code: PlanCode = code.parse().map_err(|e: rubick_core::ParseError| e.to_string())?;
        let placement: Placement = placement.parse().map_err(|e: rubick_core::ParseError| e.to_string())?;
        if !(iter_time_s.is_finite() && iter_time_s > 0.0) {
            return Err(format!("iter_time must be a positive number, got {iter_time_s}"));
        }
        if let Some(gpus) = code.gpus()
            && gpus != placement.gpus()
        {
            return Err(format!("plan `{code}` uses {gpus} GPUs but placement {placement} has {}", placement.gpus()));
        }
        let phases = phases.and_then(|[f, o, p]| {
            if ![f, o, p].iter().all(|x| x.is_finite() && *x >= 0.0) {
                return None;
            }
            let scale = if f + o + p > 20.0 * iter_time_s { 1e-3 } else { 1.0 };
            Some(Phases { forward_s: f * scale, backward_sync_s: o * scale, optimizer_s: p * scale })
        });
        Ok(MeasuredRow { code, placement, iter_time_s, phases })
    }
}

/// One job of a reference trace (`workloads/*.csv`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    pub name: String,
    pub submission_time_s: f64,
    /// Original runtime; informative only (`steps` is what to replay).
    pub duration_s: f64,
    pub application: String,
    pub num_gpus: u32,
    pub num_cpus: u32,
    /// Requested inter-node bandwidth class (0 or 1.25).
    pub bandwidth: f64,
    pub exec_plan: PlanCode,
    pub steps: u64,
    pub is_sla: bool,
}

impl TraceJob {
    /// Checks the row's values, for the simulator that reads a trace and for `rubick-plan
    /// trace` that writes one (so that it never writes a row the reader refuses): times
    /// on the jobs' clock ([`limits::MAX_CLOCK_SECONDS`]), 1 to [`limits::MAX_GPUS`]
    /// GPUs, at least one step; the error's field is the trace's column.
    pub fn check(&self) -> Result<(), ValidationError> {
        let at = |column: &'static str| move |why: String| ValidationError::new(column, why);
        ensure(!self.name.is_empty(), "name", || "is empty".to_owned())?;
        ensure(!self.application.is_empty(), "application", || "is empty".to_owned())?;
        for (column, v) in [("submission_time", self.submission_time_s), ("duration", self.duration_s)] {
            ensure(v.is_finite() && (0.0..=limits::MAX_CLOCK_SECONDS).contains(&v), column, || {
                format!("must be 0 to {:e} seconds, got {}", limits::MAX_CLOCK_SECONDS, limits::shown(v))
            })?;
        }
        limits::check_range(u64::from(self.num_gpus), 1, limits::MAX_GPUS).map_err(at("num_gpus"))?;
        limits::check_range(u64::from(self.num_cpus), 0, limits::MAX_GPUS * u64::from(limits::MAX_CPU_CORES))
            .map_err(at("num_cpus"))?;
        limits::check_real(self.bandwidth, 0.0, limits::MAX_BANDWIDTH_GBPS, false).map_err(at("bandwidth"))?;
        ensure(self.steps >= 1, "steps", || "must be at least 1".to_owned())?;
        limits::check_range(self.steps, 1, u64::from(u32::MAX)).map_err(at("steps"))?;
        Ok(())
    }
}

/// One profiling run of `profiles/<model>/config.csv` + `data.csv` (paired by row).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRun {
    pub nodes: u32,
    pub gpus: u32,
    /// Parameters / 2^20.
    pub parameter_mib: f64,
    pub micro_batch: u32,
    /// Sequence length x hidden x layers.
    pub seq_hid: f64,
    pub cpu_threads: u32,
    /// 0 none, 1 ZeRO-Offload, 2 ZeRO-DP.
    pub zero_type: u32,
    pub is_tp: bool,
    pub is_pp: bool,
    pub forward_ms: f64,
    pub backward_sync_ms: f64,
    pub optimizer_ms: f64,
    pub iter_ms: f64,
    /// Four digits; the first is the forward multiplier (2 with checkpointing).
    pub strategy: String,
}

impl ProfileRun {
    /// The plan family the run measured.
    pub fn family(&self) -> PlanFamily {
        match (self.is_tp || self.is_pp, self.zero_type) {
            (true, _) => PlanFamily::TpPp,
            (false, 1) => PlanFamily::ZeroOffload,
            (false, 2) => PlanFamily::ZeroDp,
            _ if self.strategy.starts_with('2') => PlanFamily::DpGc,
            _ => PlanFamily::Dp,
        }
    }
}

/// The measured rows with the complete plan each code stands for on the testbed's
/// GPUs (the largest micro-batch that fits); rows no plan fits are left out.
pub fn resolve_rows<'a>(
    rows: &'a [MeasuredRow],
    model: &ModelSpec,
    estimator: &MemoryEstimator,
) -> Vec<(&'a MeasuredRow, Plan)> {
    rows.iter()
        .filter_map(|row| {
            let plan =
                crate::space::resolve_code(&row.code, model, row.placement.gpus(), TESTBED_GPU_MEMORY_GIB, estimator)?;
            Some((row, plan))
        })
        .collect()
}

/// The `k` rows the selection rule would profile (indices into `resolved`), and their
/// observations on `links`.
pub fn profiled_rows(
    resolved: &[(&MeasuredRow, Plan)],
    k: usize,
    links: crate::perfmodel::Links,
) -> (Vec<usize>, Vec<crate::fit::Observation>) {
    let candidates: Vec<crate::select::Candidate> = resolved
        .iter()
        .map(|(row, plan)| crate::select::Candidate { plan: *plan, placement: row.placement.clone() })
        .collect();
    let chosen = crate::select::select(&candidates, k);
    let observations = chosen
        .iter()
        .map(|&i| crate::fit::Observation {
            plan: resolved[i].1,
            placement: resolved[i].0.placement.clone(),
            links,
            iter_time_s: resolved[i].0.iter_time_s,
        })
        .collect();
    (chosen, observations)
}

/// How an estimated micro-batch limit compares with the measured fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agreement {
    Agree,
    /// The fact allows less than memory would: a cap of the authors' table, not a
    /// memory limit (the estimate finds room for more).
    FactBelowEstimate,
    /// The fact allows more than the estimate: the estimate is too conservative.
    FactAboveEstimate,
}

/// One line of the memory-estimate comparison table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgreementRow {
    pub model: String,
    pub family: PlanFamily,
    pub global_batch: u64,
    /// The reference's `max_micro_batch`.
    pub fact: u32,
    /// Our estimate of the largest micro-batch that fits (at most the global batch).
    pub estimate: u32,
    /// The configuration that decided the estimate's limit.
    pub deciding_plan: Option<Plan>,
    pub deciding_total_gib: Option<f64>,
    pub agreement: Agreement,
}

/// The configurations of `family` with micro-batch `mb` that the comparison tries:
/// data parallelism over `global_batch / mb` GPUs with no accumulation, and for 3-D
/// every tensor x pipeline layout of 2 to `gpus_per_node` GPUs the model allows.
fn family_configs(model: &ModelSpec, family: PlanFamily, mb: u32, gpus_per_node: u32) -> Vec<Plan> {
    let dp = (model.global_batch / u64::from(mb)) as u32;
    let base = Plan::data_parallel(dp, mb);
    let zero = if dp > 1 { ZeroStage::Two } else { ZeroStage::None };
    match family {
        PlanFamily::Dp => vec![base],
        PlanFamily::DpGc => vec![Plan { recompute: Recompute::Full, ..base }],
        PlanFamily::ZeroDp => vec![Plan { zero, ..base }],
        PlanFamily::ZeroOffload => vec![Plan { zero: ZeroStage::Two, offload: Offload::Optimizer, ..base }],
        PlanFamily::TpPp | PlanFamily::TpPpGc => {
            let mut plans = Vec::new();
            for tp in 1..=gpus_per_node {
                for pp in 1..=gpus_per_node / tp {
                    let recompute = if family == PlanFamily::TpPpGc { Recompute::Full } else { Recompute::None };
                    let plan = Plan { tp, pp, recompute, ..base };
                    let shape_ok = tp * pp >= 2
                        && model.heads.is_multiple_of(tp)
                        && model.hidden.is_multiple_of(tp)
                        && model.layers.is_multiple_of(pp);
                    if shape_ok {
                        plans.push(plan);
                    }
                }
            }
            plans
        }
    }
}

/// Compares the memory estimate with the measured `max_micro_batch` facts of one model
/// on GPUs of `gpu_memory_gib`. The estimate alone decides here (measured limits are
/// ignored), micro-batches range over the divisors of the global batch.
pub fn memory_agreement(
    name: &str,
    facts: &ModelFacts,
    estimator: &MemoryEstimator,
    gpu_memory_gib: f64,
    gpus_per_node: u32,
) -> Vec<AgreementRow> {
    let mut model = facts.model_spec(name, &[]);
    model.measured_limits = None;
    let batch = model.global_batch;
    facts
        .max_micro_batch
        .iter()
        .map(|(&family, &fact)| {
            let mut estimate = 0;
            let mut deciding = None;
            for mb in rubick_core::plan::divisors(batch) {
                let mb = mb as u32;
                let best = family_configs(&model, family, mb, gpus_per_node)
                    .into_iter()
                    .map(|plan| (plan, estimator.estimate(&model, &plan).total_gib))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                if let Some((plan, total)) = best {
                    deciding = Some((plan, total));
                    if total <= gpu_memory_gib {
                        estimate = mb;
                    } else {
                        break;
                    }
                }
            }
            let capped_fact = u64::from(fact).min(batch) as u32;
            let agreement = match capped_fact.cmp(&estimate) {
                std::cmp::Ordering::Equal => Agreement::Agree,
                std::cmp::Ordering::Less => Agreement::FactBelowEstimate,
                std::cmp::Ordering::Greater => Agreement::FactAboveEstimate,
            };
            AgreementRow {
                model: name.to_owned(),
                family,
                global_batch: batch,
                fact,
                estimate,
                deciding_plan: deciding.map(|d| d.0),
                deciding_total_gib: deciding.map(|d| d.1),
                agreement,
            }
        })
        .collect()
}

/// The comparison as a Markdown table, one line per (model, family).
pub fn agreement_table(rows: &[AgreementRow]) -> String {
    let mut table = rubick_core::markdown::Table::new(&[
        "model",
        "family",
        "global batch",
        "fact max mb",
        "estimated max mb",
        "deciding plan",
        "its GiB",
        "verdict",
    ]);
    for r in rows {
        let verdict = match r.agreement {
            Agreement::Agree => "agree",
            Agreement::FactBelowEstimate => "fact below estimate (a cap, not memory)",
            Agreement::FactAboveEstimate => "FACT ABOVE ESTIMATE (estimate too conservative)",
        };
        table.row(&[
            r.model.clone(),
            r.family.to_string(),
            r.global_batch.to_string(),
            r.fact.to_string(),
            r.estimate.to_string(),
            r.deciding_plan.map_or_else(|| "-".into(), |p| p.to_string()),
            r.deciding_total_gib.map_or_else(|| "-".into(), |g| format!("{g:.1}")),
            verdict.to_owned(),
        ]);
    }
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_in_milliseconds_are_normalised() {
        let row = MeasuredRow::from_fields("248", "88888888", 0.6729, Some([0.0, 353.94, 24.27])).unwrap();
        let phases = row.phases.unwrap();
        assert!((phases.backward_sync_s - 0.35394).abs() < 1e-9);
        let row = MeasuredRow::from_fields("ga", "233", 0.299, Some([0.032, 0.083, 0.142])).unwrap();
        assert!((row.phases.unwrap().optimizer_s - 0.142).abs() < 1e-12);
    }

    #[test]
    fn rows_whose_plan_and_placement_disagree_are_rejected() {
        let err = MeasuredRow::from_fields("248", "8888", 1.0, None).unwrap_err();
        assert!(err.contains("64 GPUs"), "{err}");
    }
}
