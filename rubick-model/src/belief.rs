//! What the planner believes of a job's speed: a performance model's parameters
//! ([`Belief`]), the measurements they rest on ([`Evidence`]) and how much a prediction
//! of one configuration rests on them ([`Support`]). Measured beats modelled: a
//! configuration that was measured is believed as measured ([`believed`]), whatever the
//! fit says, and a family the model got wrong widens its interval
//! ([`Evidence::family_spread`], [`Belief::uncertainty`]).

use crate::perfmodel::{Links, Params};
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::Plan;

/// How much a prediction of one configuration rests on measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Support {
    /// This plan on this placement shape was measured: the planner believes the
    /// measurement, whatever the fit says of it.
    Measured,
    /// A measured configuration has the same layout (TP, PP, ZeRO stage, offload,
    /// checkpointing), single- or multi-node alike, within a factor 2 of its GPU count
    /// and micro-batch.
    Near,
    /// A configuration of its family (the same layout on the same placement shape,
    /// another micro-batch or accumulation) ran more than [`RUN_NOISE`] slower than the
    /// model predicts ([`Evidence::family_slower`]): the model is known to be wrong
    /// here, and the prediction's interval is widened by as much.
    FamilySlower,
    /// Nothing measured is near: the model's form carries the prediction.
    Extrapolated,
}

impl Support {
    pub fn as_str(self) -> &'static str {
        match self {
            Support::Measured => "measured",
            Support::Near => "near measured",
            Support::FamilySlower => "its family measured slower than modelled",
            Support::Extrapolated => "extrapolated",
        }
    }
}

/// Differences of iteration time under this share are run-to-run noise: the same
/// configuration profiled again repeats within 3-15 % (data/profiles/README.md,
/// `gpt-98m-h200-repeat.csv`); `rubick-profile compare` says the same.
pub const RUN_NOISE: f64 = 0.15;

/// One measured configuration behind a fitted model: its measured iteration time and
/// what the fit predicted for it (on the cluster it was measured on).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub plan: Plan,
    pub placement: Placement,
    pub measured_s: f64,
    pub predicted_s: f64,
}

impl Measured {
    /// How many times the prediction the measurement took (> 1: slower than modelled).
    pub fn ratio(&self) -> f64 {
        self.measured_s / self.predicted_s
    }

    /// Whether `plan` on `placement` is of this measurement's family: the same layout
    /// (TP, PP, ZeRO, offload, recompute, SP, VP) and data parallelism on the same
    /// placement shape; only the micro-batch and accumulation differ.
    fn same_family(&self, plan: &Plan, placement: &Placement) -> bool {
        same_layout(&self.plan, plan) && self.plan.dp == plan.dp && self.placement.per_node() == placement.per_node()
    }
}

fn same_layout(a: &Plan, b: &Plan) -> bool {
    (a.tp, a.pp, a.zero, a.offload, a.recompute, a.sp, a.vp) == (b.tp, b.pp, b.zero, b.offload, b.recompute, b.sp, b.vp)
}

/// The evidence behind a job's fitted model: what was measured (and how long it took),
/// and the covariance of its parameters' logarithms (for ~95 % prediction intervals).
#[derive(Debug, Clone, PartialEq)]
pub struct Evidence {
    /// Every measured row (the model's `diagnostics.rows` and `inconsistentRows`).
    pub measured: Vec<Measured>,
    /// Covariance of `ln θ` in the form's order (`diagnostics.logCovariance`).
    pub log_covariance: Option<nalgebra::DMatrix<f64>>,
}

impl Evidence {
    /// Reads a `PerfModel`'s evidence; `None` when it lists no measured row. A row the
    /// fit could not explain (`inconsistentRows`) is evidence like any other: it is what
    /// the planner believes of its configuration, and it widens its family's interval.
    pub fn of_model(model: &crate::perf::PerfModel) -> Option<Evidence> {
        let d = model.diagnostics.as_ref()?;
        let measured: Vec<Measured> = d
            .rows
            .iter()
            .chain(&d.inconsistent_rows)
            .map(|r| Measured {
                plan: r.plan,
                placement: r.placement.clone(),
                measured_s: r.measured_s,
                predicted_s: r.predicted_s,
            })
            .collect();
        if measured.is_empty() {
            return None;
        }
        Some(Evidence { measured, log_covariance: model.log_covariance() })
    }

    /// The rows of `plan` on `placement`'s shape whose times can be believed.
    fn exact<'e>(&'e self, plan: &'e Plan, placement: &'e Placement) -> impl Iterator<Item = &'e Measured> + 'e {
        self.measured.iter().filter(move |m| {
            let r = m.ratio();
            m.plan == *plan && m.placement.per_node() == placement.per_node() && r.is_finite() && r > 0.0
        })
    }

    /// What to multiply the model's iteration time of `plan` on `placement` by so that
    /// it reads as measured: the geometric mean of measured / predicted over the rows of
    /// this configuration; `None` when it was never measured. Applied to the prediction
    /// on another node group, it carries the measurement over at that group's speed.
    pub fn time_factor(&self, plan: &Plan, placement: &Placement) -> Option<f64> {
        let (n, sum) = self.exact(plan, placement).fold((0u32, 0.0), |(n, s), m| (n + 1, s + m.ratio().ln()));
        (n > 0).then(|| (sum / f64::from(n)).exp())
    }

    /// The row of `plan`'s family (not `plan` itself) that ran slowest against its
    /// prediction, when it ran more than [`RUN_NOISE`] slower than the model said.
    pub fn family_slower(&self, plan: &Plan, placement: &Placement) -> Option<&Measured> {
        self.measured
            .iter()
            .filter(|m| m.plan != *plan && m.same_family(plan, placement) && m.ratio().is_finite())
            .filter(|m| m.ratio() > 1.0 + RUN_NOISE)
            .max_by(|a, b| a.ratio().total_cmp(&b.ratio()))
    }

    /// How far the model is off on `plan`'s family: the largest |ln(measured /
    /// predicted)| among its other rows (0 without any). An interval is at least this wide.
    pub fn family_spread(&self, plan: &Plan, placement: &Placement) -> f64 {
        self.measured
            .iter()
            .filter(|m| m.plan != *plan && m.same_family(plan, placement))
            .map(|m| m.ratio().ln().abs())
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max)
    }

    /// How much the prediction of `plan` on `placement` rests on measurements.
    pub fn support(&self, plan: &Plan, placement: &Placement) -> Support {
        if self.exact(plan, placement).next().is_some() {
            return Support::Measured;
        }
        if self.family_slower(plan, placement).is_some() {
            return Support::FamilySlower;
        }
        let near = |a: u32, b: u32| {
            let (a, b) = (f64::from(a.max(1)), f64::from(b.max(1)));
            (a / b).log2().abs() <= 1.0 + 1e-9
        };
        let close = self.measured.iter().any(|m| {
            same_layout(&m.plan, plan)
                && m.placement.is_multi_node() == placement.is_multi_node()
                && near(m.placement.gpus(), placement.gpus())
                && near(m.plan.micro_batch, plan.micro_batch)
        });
        if close { Support::Near } else { Support::Extrapolated }
    }
}

/// What the planner believes of a job's speed: its performance model's parameters and,
/// when its `PerfModel` lists measured rows, what they rest on.
#[derive(Debug, Clone)]
pub struct Belief {
    pub params: Params,
    /// What the parameters rest on: then a measured configuration is traded for an
    /// unmeasured one only when the gain holds at the low end of its ~95 % interval,
    /// and a guarantee is met by an unmeasured configuration only when its low end
    /// meets it.
    pub evidence: Option<std::sync::Arc<Evidence>>,
}

impl Belief {
    /// The FLOPs-based default of a model nothing was fitted for
    /// ([`default_params`]), resting on no measurement.
    pub fn prior(model: &ModelSpec) -> Self {
        Belief { params: default_params(model), evidence: None }
    }

    /// A fitted `PerfModel`'s belief: its parameters and the rows they rest on.
    pub fn of(model: &crate::perf::PerfModel) -> Result<Self, rubick_core::error::ValidationError> {
        Ok(Belief { params: model.params()?, evidence: Evidence::of_model(model).map(std::sync::Arc::new) })
    }
}

impl Belief {
    /// How the prediction of `plan` on `placement` (with the links of where it would
    /// run) rests on the measurements, and the half-width of its ~95 % interval in log
    /// throughput (0 for a measured configuration, or without a covariance); `None`
    /// when nothing is known of the evidence.
    pub fn uncertainty(
        &self,
        model: &ModelSpec,
        links: &Links,
        plan: &Plan,
        placement: &Placement,
    ) -> Option<(Support, f64)> {
        let evidence = self.evidence.as_ref()?;
        let support = evidence.support(plan, placement);
        if support == Support::Measured {
            return Some((support, 0.0));
        }
        let spread = match &evidence.log_covariance {
            None => 0.0,
            Some(cov) => {
                let (_, mid, high) = crate::fit::interval(model, plan, placement, links, &self.params, cov);
                (high / mid).ln().max(0.0)
            }
        };
        let spread = if spread.is_finite() { spread } else { 0.0 };
        // A family the model got wrong: the interval is at least as wide as it was off.
        Some((support, spread.max(evidence.family_spread(plan, placement))))
    }
}

/// Parameters alone (e.g. fitted on reference data here), resting on no evidence.
impl From<Params> for Belief {
    fn from(params: Params) -> Self {
        Belief { params, evidence: None }
    }
}

/// The throughput the planner believes of `plan` on `placement`: the model's
/// `predicted`, or, where this configuration was measured, the measurement
/// ([`Evidence::time_factor`]): measured beats modelled.
pub fn believed(evidence: Option<&Evidence>, plan: &Plan, placement: &Placement, predicted: f64) -> f64 {
    match evidence.and_then(|e| e.time_factor(plan, placement)) {
        Some(f) => predicted / f,
        None => predicted,
    }
}

/// Fallback performance-model parameters of a job without a fitted model: the compute
/// time from the model's measured forward time, else from its FLOPs (6 x parameters x
/// tokens per sample at 125 TFLOP/s, 40 % of an A100/A800's bf16 peak).
pub fn default_params(model: &ModelSpec) -> Params {
    let per_sample = match model.forward_1gpu_ms {
        Some(ms) => 3.0 * ms / 1e3 / model.global_batch.max(1) as f64,
        None => 6.0 * model.parameter_count() as f64 * f64::from(model.seq_len) / 125e12,
    };
    Params::prior(per_sample)
}
