//! The performance model: iteration time of a job under a plan and placement.
//!
//! Form `rubick-whitebox/2`, a white-box model after the Rubick paper's (see
//! `shared/reference/PERF_MODEL.md`) with its weak spots fixed: bandwidths come from
//! the cluster (NVLink inside a node, the network across nodes, PCIe for offload), a
//! pipeline bubble, TP and PP communication that scale with micro-batch, hidden,
//! sequence and layers per stage, ZeRO stages 1-3 and offload, accumulation and
//! checkpointing multipliers, and (new in `/2`) a fixed cost per layer and micro-batch
//! step, so that a GPU (or core) runs small micro-batches less efficiently than large
//! ones: every family pays it once per micro-batch step, so accumulation over many small
//! micro-batches costs more than one large one. Nothing in it is specific to one model: everything
//! model-specific is a fitted [`Params`] value or a [`ModelSpec`] field.
//!
//! `/3` adds the dimensions of today's large-model plans, with no new parameter (a
//! job's few profiled rows could not tell one apart; each term follows from the
//! plan's arithmetic, after Korthikanti et al. 2022 and Narayanan et al. 2021):
//!
//! * **Full recompute** repeats each layer's forward: compute times `gc_factor`, as
//!   before. Its repeated forward also runs that forward's 2 TP all-reduces per layer
//!   again (6 in all, not 4); a term for that (TP traffic times 3/2) was tried and left
//!   out: it brought Calculon's ratio error from 3.8 to 1.2 points but vTrain's
//!   multi-node error from 8.4 to 8.6 % (the external pooled error 10.2 -> 10.3 %), and
//!   the plans of the paper's space keep their `/2` predictions without it.
//! * **Selective recompute** repeats the attention core only (scores, softmax, the
//!   product with V: `4 s² h` of a layer's `24 s h² + 4 s² h` forward FLOPs per
//!   sample), so it pays `gc_factor - 1` times that share, `s / (6h + s)`; no
//!   collective lies inside the core.
//! * **Sequence parallelism** replaces each TP all-reduce by a reduce-scatter and an
//!   all-gather, which move the same bytes: no time term. What it saves (the layer
//!   norms' and dropouts' element-wise work, split over tp) is a few percent of a layer
//!   and left to `compute_3d`; its gain is memory ([`crate::memory`]).
//! * **Interleaving** (`vp` virtual stages per rank) divides the bubble's `pp - 1`
//!   slots by `vp` and multiplies the stage boundaries a micro-batch crosses, `pp - 1`,
//!   to `vp * pp - 1`.
//!
//! `/2` models are read as `/3`: the same parameters, the same predictions of every plan
//! `/2` could express.
//!
//! All times are seconds per iteration (one global batch).

use rubick_core::cluster::NodeGroup;
use rubick_core::model::ModelSpec;
use rubick_core::placement::Placement;
use rubick_core::plan::{Offload, Plan, Recompute, ZeroStage};

/// Name and version of the model form, stored in every `PerfModel`.
pub const FORM: &str = "rubick-whitebox/3";

/// The previous form: the same parameters and predictions, without the plans of
/// sequence parallelism, selective recompute and interleaving.
pub const FORM_V2: &str = "rubick-whitebox/2";

/// The first form: without the fixed cost per micro-batch step (`step_s_per_layer`),
/// which its models read as zero.
pub const FORM_V1: &str = "rubick-whitebox/1";

/// One parameter of the form: its name, default (prior centre), bounds, prior width
/// (standard deviation of the log-normal prior) and meaning.
#[derive(Debug, Clone, Copy)]
pub struct ParamSpec {
    pub name: &'static str,
    pub prior: f64,
    pub lower: f64,
    pub upper: f64,
    pub prior_sigma: f64,
    pub doc: &'static str,
}

const fn spec(
    name: &'static str,
    prior: f64,
    lower: f64,
    upper: f64,
    prior_sigma: f64,
    doc: &'static str,
) -> ParamSpec {
    ParamSpec { name, prior, lower, upper, prior_sigma, doc }
}

/// Index of each parameter in [`PARAMS`] and [`Params::values`].
pub mod idx {
    pub const COMPUTE: usize = 0;
    pub const GC: usize = 1;
    pub const NVLINK: usize = 2;
    pub const NET: usize = 3;
    pub const NET_SHARE: usize = 4;
    pub const OVERLAP: usize = 5;
    pub const OPT: usize = 6;
    pub const GATHER: usize = 7;
    pub const OFFLOAD: usize = 8;
    pub const OFFLOAD_CONST: usize = 9;
    pub const CONST: usize = 10;
    pub const COMPUTE_3D: usize = 11;
    pub const PIPE_ETA: usize = 12;
    pub const STAGE: usize = 13;
    pub const TP_COMM: usize = 14;
    pub const STEP: usize = 15;
}

/// The parameters of the form. The compute prior is replaced per job (from the
/// model's measured forward time or the data).
pub const PARAMS: [ParamSpec; 16] = [
    spec("compute_s_per_sample", 0.01, 1e-6, 100.0, 2.0, "forward + backward seconds per sample on one GPU"),
    spec("gc_factor", 1.33, 1.0, 2.5, 0.3, "compute multiplier with activation checkpointing"),
    spec("nvlink_efficiency", 0.5, 0.01, 2.0, 1.0, "share of the cluster's NVLink bandwidth collectives reach"),
    spec("network_efficiency", 0.5, 0.005, 4.0, 1.0, "share of the cluster's inter-node bandwidth collectives reach"),
    spec("nic_scale_exp", 0.5, 0.001, 1.5, 1.0, "node network bandwidth grows as gcd(GPUs per node)^exp"),
    spec(
        "overlap_k",
        1.1,
        1.0,
        12.0,
        0.7,
        "backward and gradient sync overlap as (a^k + b^k)^(1/k); prior chosen by leave-one-out on profiled rows",
    ),
    spec("optimizer_s_per_gparam", 0.03, 1e-5, 10.0, 1.5, "GPU optimizer step, seconds per 1e9 parameters"),
    spec("zero_gather", 0.3, 0.01, 10.0, 1.0, "multiplier of the ZeRO parameter all-gather"),
    spec("offload_s_per_gparam", 0.6, 1e-3, 200.0, 0.7, "CPU optimizer, seconds per 1e9 parameters of a GPU's shard"),
    spec(
        "offload_shared_s_per_gparam",
        0.3,
        1e-3,
        200.0,
        0.7,
        "offload cost a node shares (host memory), s per 1e9 parameters",
    ),
    spec("const_s", 0.01, 1e-5, 5.0, 1.5, "fixed cost per iteration"),
    spec("compute_3d", 1.0, 0.2, 5.0, 0.7, "compute multiplier of TP/PP implementations"),
    spec("pipeline_eta", 0.9, 0.01, 1.0, 0.3, "effective share of extra micro-batches that fill the pipeline"),
    spec("stage_cost_s", 0.01, 1e-5, 2.0, 1.5, "fixed cost per pipeline stage"),
    spec("tp_comm", 1.0, 0.05, 20.0, 1.0, "multiplier of the tensor-parallel all-reduce time"),
    spec(
        "step_s_per_layer",
        2e-4,
        1e-7,
        0.5,
        2.0,
        "fixed cost of one layer's forward + backward per micro-batch step (kernel launches, small GEMMs): micro-batch efficiency",
    ),
];

/// Values of every parameter, in the order of [`PARAMS`].
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub values: [f64; PARAMS.len()],
}

impl Params {
    /// The prior centres, with the compute prior set to `compute_s_per_sample`.
    pub fn prior(compute_s_per_sample: f64) -> Self {
        let mut values = PARAMS.map(|p| p.prior);
        values[idx::COMPUTE] = compute_s_per_sample.clamp(PARAMS[idx::COMPUTE].lower, PARAMS[idx::COMPUTE].upper);
        Params { values }
    }

    fn v(&self, i: usize) -> f64 {
        self.values[i]
    }
}

/// The bandwidths a configuration sees, from the node group it runs on (GB/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Links {
    pub nvlink_gbps: f64,
    pub network_gbps: f64,
    pub pcie_gbps: f64,
}

impl Links {
    /// The links of a cluster's node group with the most GPUs (where multi-node jobs
    /// run); 1 GB/s everywhere for a cluster without groups.
    pub fn of_cluster(cluster: &rubick_core::Cluster) -> Links {
        cluster.node_groups.iter().max_by_key(|g| g.total_gpus()).map(Links::from).unwrap_or(Links {
            nvlink_gbps: 1.0,
            network_gbps: 1.0,
            pcie_gbps: 1.0,
        })
    }
}

impl From<&NodeGroup> for Links {
    fn from(g: &NodeGroup) -> Self {
        Links { nvlink_gbps: g.nvlink_gbps, network_gbps: g.inter_node_gbps, pcie_gbps: g.pcie_gbps }
    }
}

/// Iteration time split by phase (seconds). `total` is what the job sees.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Prediction {
    pub forward: f64,
    /// Backward overlapped with gradient synchronisation (and the pipeline for 3-D).
    pub backward_sync: f64,
    /// Optimizer step, incl. offload and ZeRO gathers.
    pub optimizer: f64,
    /// Communication that is not hidden (for diagnostics; part of the phases above).
    pub communication: f64,
    pub total: f64,
}

/// Time of a collective over a group laid out as `placement`, where each GPU holds
/// `bytes` and the collective moves `factor * (d - 1) / d * bytes` per GPU in a ring of
/// `d` (2 for all-reduce, 1 for reduce-scatter or all-gather). Inside one node it runs
/// over NVLink. Across nodes it is hierarchical (as NCCL does): a ring inside each node
/// over NVLink, then a ring over the `N` nodes whose inter-node part moves
/// `factor * (N - 1) / N * bytes` through each node's link, whose bandwidth grows with
/// the thinnest node's GPU count (see [`nic_scale`]).
fn collective_s(factor: f64, bytes: f64, placement: &Placement, links: &Links, p: &Params) -> f64 {
    let gpus = f64::from(placement.gpus());
    if bytes <= 0.0 || gpus <= 1.0 {
        return 0.0;
    }
    let nvlink = links.nvlink_gbps * p.v(idx::NVLINK) * 1e9;
    if !placement.is_multi_node() {
        return factor * (gpus - 1.0) / gpus * bytes / nvlink;
    }
    let per_node = f64::from(placement.max_per_node());
    let nodes = f64::from(placement.nodes());
    let network = links.network_gbps * p.v(idx::NET) * 1e9;
    let intra = factor * (per_node - 1.0) / per_node * bytes / nvlink;
    let inter = factor * (nodes - 1.0) / nodes * bytes / (network * nic_scale(placement, p));
    intra + inter
}

/// How the network bandwidth of a node grows with the GPUs that use it: with one NIC
/// per GPU (as on the paper's testbed) NCCL builds as many symmetric inter-node rings
/// as every node can feed equally, the greatest common divisor of the per-node GPU
/// counts (8 for 8888, 4 for 44, 1 for 53); `gcd^exp`.
fn nic_scale(placement: &Placement, p: &Params) -> f64 {
    fn gcd(a: u32, b: u32) -> u32 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let rings = placement.per_node().iter().fold(0, |acc, &g| gcd(acc, g)).max(1);
    // 1^x is 1: no `powf` for the common single ring.
    if rings == 1 { 1.0 } else { f64::from(rings).powf(p.v(idx::NET_SHARE)) }
}

/// The compute multiplier of the plan's recomputation: `gc_factor` for full, its
/// attention-core share `s / (6h + s)` for selective (see the module's notes).
fn recompute_factor(model: &ModelSpec, plan: &Plan, p: &Params) -> f64 {
    match plan.recompute {
        Recompute::None => 1.0,
        Recompute::Full => p.v(idx::GC),
        Recompute::Selective => {
            let (s, h) = (f64::from(model.seq_len), f64::from(model.hidden));
            1.0 + (p.v(idx::GC) - 1.0) * s / (6.0 * h + s)
        }
    }
}

/// The fixed cost of one micro-batch step through all layers (forward + backward).
fn step_overhead(model: &ModelSpec, p: &Params) -> f64 {
    p.v(idx::STEP) * f64::from(model.layers)
}

fn overlap(a: f64, b: f64, k: f64) -> f64 {
    let m = a.max(b);
    if m <= 0.0 {
        return 0.0;
    }
    // Nothing to overlap with: (1^k + 0^k)^(1/k) is exactly 1 (no `powf`, the same bits).
    if k > 0.0 && (a == 0.0 || b == 0.0) {
        return m;
    }
    m * ((a / m).powf(k) + (b / m).powf(k)).powf(1.0 / k)
}

/// Predicts the iteration time of `plan` on `placement` for `model`.
pub fn predict(model: &ModelSpec, plan: &Plan, placement: &Placement, links: &Links, p: &Params) -> Prediction {
    if plan.tp * plan.pp > 1 {
        predict_3d(model, plan, placement, links, p)
    } else {
        predict_dp(model, plan, placement, links, p)
    }
}

fn predict_dp(model: &ModelSpec, plan: &Plan, placement: &Placement, links: &Links, p: &Params) -> Prediction {
    let n = f64::from(plan.gpus().max(1));
    let batch = model.global_batch as f64;
    let params = model.parameter_count() as f64;
    let grad_bytes = model.state_bytes.grad * params;
    let gc = recompute_factor(model, plan, p);
    let ga = f64::from(plan.ga.max(1));
    // Work per sample, plus a fixed cost per layer and micro-batch step: a micro-batch
    // of m samples runs at efficiency m / (m + step * layers / compute).
    let compute = p.v(idx::COMPUTE) * batch / n + step_overhead(model, p) * ga;
    let forward = compute / 3.0;
    let backward = compute * (gc - 1.0 / 3.0);
    let (sync_factor, gathers) = match plan.zero {
        ZeroStage::None | ZeroStage::One => (2.0, 0.0),
        ZeroStage::Two => (1.0, 1.0),
        ZeroStage::Three => (3.0, 1.0),
    };
    // DDP (and ZeRO-1) accumulate locally and reduce once per iteration; ZeRO-2/3 keep
    // only their shard of the gradients, so they reduce-scatter after every micro-batch
    // step (and ZeRO-3 gathers the parameters for each step's forward and backward).
    let reductions = if plan.zero >= ZeroStage::Two { ga } else { 1.0 };
    let sync = reductions * collective_s(sync_factor, grad_bytes, placement, links, p);
    let gather = collective_s(1.0, grad_bytes, placement, links, p);
    // DeepSpeed's ZeRO-2/3 reduce gradients bucket by bucket inside the backward hooks
    // (overlap_comm is off by default): the reduction adds to the backward. Plain DDP
    // overlaps its all-reduce with the backward.
    let k = if plan.zero >= ZeroStage::Two { 1.0 } else { p.v(idx::OVERLAP) };
    let backward_sync = backward * (ga - 1.0) / ga + overlap(backward / ga, sync, k);
    let optimizer = match (plan.offload, plan.zero) {
        (Offload::None, ZeroStage::None) => p.v(idx::OPT) * params / 1e9,
        (Offload::None, ZeroStage::One) => p.v(idx::OPT) * params / n / 1e9 + p.v(idx::GATHER) * gather,
        (Offload::None, _) => p.v(idx::OPT) * params / n / 1e9 + gathers * p.v(idx::GATHER) * gather,
        (_, _) => {
            // CPU Adam over the GPU's shard, plus a part the node's host memory and
            // cores share whatever the shard (both per 1e9 parameters), plus PCIe.
            let pcie = 2.0 * grad_bytes / n / (links.pcie_gbps * 1e9);
            (p.v(idx::OFFLOAD) / n + p.v(idx::OFFLOAD_CONST)) * params / 1e9 + pcie
        }
    };
    let total = forward + backward_sync + optimizer + p.v(idx::CONST);
    Prediction { forward, backward_sync, optimizer, communication: (backward_sync - backward).max(0.0), total }
}

fn predict_3d(model: &ModelSpec, plan: &Plan, placement: &Placement, links: &Links, p: &Params) -> Prediction {
    let (tp, pp, dp) = (f64::from(plan.tp), f64::from(plan.pp), f64::from(plan.dp.max(1)));
    let batch = model.global_batch as f64;
    let per_replica = batch / dp;
    let params = model.parameter_count() as f64;
    let (s, h) = (f64::from(model.seq_len), f64::from(model.hidden));
    let layers_per_stage = f64::from(model.layers) / pp;
    let gc = recompute_factor(model, plan, p);
    let per_node = f64::from(placement.max_per_node().max(1));

    // Compute of one replica's batch, split over its tp * pp GPUs.
    let micro_batches = f64::from(plan.ga.max(1));
    let stage_compute = (p.v(idx::COMPUTE) * p.v(idx::COMPUTE_3D) * per_replica / (tp * pp)
        + step_overhead(model, p) / pp * micro_batches)
        * gc;
    // Megatron: 4 all-reduces of s * b * h activations per layer (2 forward, 2 backward).
    let nvlink = links.nvlink_gbps * p.v(idx::NVLINK) * 1e9;
    let network = links.network_gbps * p.v(idx::NET) * 1e9;
    let tp_bytes = 4.0 * layers_per_stage * per_replica * s * h * 2.0 * 2.0 * (tp - 1.0) / tp;
    // A TP group stays inside a node only when every node's GPU count is a multiple of
    // tp; otherwise some groups straddle two nodes and the slowest sets the pace.
    let aligned = placement.per_node().iter().all(|&g| f64::from(g) % tp == 0.0);
    let tp_link = if aligned { nvlink } else { network * nic_scale(placement, p) };
    let tp_comm = p.v(idx::TP_COMM) * tp_bytes / tp_link;
    // Pipeline: (M + (pp - 1) / vp) slots of one micro-batch each (interleaving
    // shortens the bubble's slots by vp); only part of the extra micro-batches fill
    // the bubble in practice.
    let vp = f64::from(plan.vp.max(1));
    let m_eff = 1.0 + p.v(idx::PIPE_ETA) * (micro_batches - 1.0);
    let bubble = (m_eff + (pp - 1.0) / vp) / m_eff;
    // Point-to-point activations between stages (forward and backward), across nodes
    // when a stage boundary leaves the node.
    let stage_gpus = tp * dp;
    let p2p_link = if stage_gpus * pp <= per_node { nvlink } else { network };
    // Each sample crosses the vp * pp - 1 chunk boundaries forward and backward.
    let p2p = if pp > 1.0 { 2.0 * (vp * pp - 1.0) * per_replica * s * h * 2.0 / tp / p2p_link } else { 0.0 };
    let pipeline = bubble * (stage_compute + tp_comm) + p2p + p.v(idx::STAGE) * pp;
    // Data-parallel gradient all-reduce of one stage's shard; the DP group stays in a
    // node when a stage's tp * dp GPUs fit in one.
    let stage_grad_bytes = model.state_bytes.grad * params / (tp * pp);
    let dp_comm = if dp <= 1.0 {
        0.0
    } else if stage_gpus <= f64::from(placement.min_per_node()) {
        2.0 * (dp - 1.0) / dp * stage_grad_bytes / nvlink
    } else {
        // A stage's DP groups span nodes: tp groups (one per TP rank), each with
        // per_node / tp members on a node, reduce hierarchically and share the link.
        let nodes = (stage_gpus / per_node).ceil().max(2.0);
        let local = (per_node / tp).max(1.0);
        let intra = 2.0 * (local - 1.0) / local * stage_grad_bytes / nvlink;
        let inter = 2.0 * (nodes - 1.0) / nodes * stage_grad_bytes * tp / network;
        intra + inter / nic_scale(placement, p)
    };
    let backward_sync = overlap(pipeline * 2.0 / 3.0, dp_comm, p.v(idx::OVERLAP));
    let forward = pipeline / 3.0;
    let shard = if plan.zero >= ZeroStage::One { dp } else { 1.0 };
    let optimizer = p.v(idx::OPT) * params / (tp * pp * shard) / 1e9;
    let total = forward + backward_sync + optimizer + p.v(idx::CONST);
    Prediction {
        forward,
        backward_sync,
        optimizer,
        communication: tp_comm + p2p + (backward_sync - pipeline * 2.0 / 3.0).max(0.0),
        total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rubick_core::cluster::Cluster;

    fn links() -> Links {
        Links::from(&Cluster::example().node_groups[0])
    }

    fn time(plan: &str, placement: &str) -> f64 {
        let mut model = ModelSpec::example();
        model.global_batch = 16;
        let p = Params::prior(0.5);
        predict(&model, &plan.parse().unwrap(), &placement.parse().unwrap(), &links(), &p).total
    }

    #[test]
    fn more_gpus_are_faster_and_nodes_cost_bandwidth() {
        assert!(time("dp8-mb2-z2", "8") < time("dp4-mb4-z2", "4"));
        assert!(time("dp8-mb2-z2", "8") < time("dp8-mb2-z2", "44"));
        assert!(time("dp8-mb2-z2", "44") < time("dp8-mb2-z2", "11111111") * 1.5);
    }

    #[test]
    fn checkpointing_and_offload_cost_time() {
        assert!(time("dp8-mb2-z2-gc", "8") > time("dp8-mb2-z2", "8"));
        assert!(time("dp8-mb2-z2-offopt", "8") > time("dp8-mb2-z2", "8"));
    }

    #[test]
    fn phases_add_up() {
        let model = ModelSpec::example();
        for (plan, placement) in [("dp8-mb2-z2", "8"), ("dp2-tp4-pp2-mb1-ga8", "88")] {
            let pred =
                predict(&model, &plan.parse().unwrap(), &placement.parse().unwrap(), &links(), &Params::prior(0.5));
            let sum = pred.forward + pred.backward_sync + pred.optimizer + PARAMS[idx::CONST].prior;
            assert!((sum - pred.total).abs() < 1e-12, "{plan}");
            assert!(pred.total.is_finite() && pred.total > 0.0);
        }
    }

    #[test]
    fn selective_recompute_costs_a_little_full_recompute_a_forward_and_interleaving_shrinks_the_bubble() {
        let none = time("dp1-tp2-pp2-mb1-ga16", "4");
        let selective = time("dp1-tp2-pp2-mb1-ga16-sel", "4");
        let full = time("dp1-tp2-pp2-mb1-ga16-gc", "4");
        assert!(none < selective && selective < full, "{none} {selective} {full}");
        // The attention core's share of the forward: s / (6h + s) of the repeat.
        let model = ModelSpec::example();
        let share = f64::from(model.seq_len) / (6.0 * f64::from(model.hidden) + f64::from(model.seq_len));
        assert!((selective - none) < (full - none) * share * 1.01, "{none} {selective} {full} {share}");
        // Sequence parallelism moves the same bytes: the same time.
        assert_eq!(time("dp1-tp2-pp2-mb1-ga16-sp-sel", "4"), selective);
        // Two virtual stages halve the bubble's slots for twice the boundaries.
        let interleaved = time("dp1-tp2-pp2-mb1-ga16-vp2", "4");
        assert!(interleaved < none, "{interleaved} {none}");
        let few = time("dp1-tp1-pp4-mb4-ga4", "4");
        let few_interleaved = time("dp1-tp1-pp4-mb4-ga4-vp2", "4");
        assert!(few_interleaved < few, "{few_interleaved} {few}");
    }

    #[test]
    fn pipeline_bubble_shrinks_with_micro_batches() {
        let few = time("dp1-tp1-pp4-mb16-ga1", "4");
        let many = time("dp1-tp1-pp4-mb1-ga16", "4");
        assert!(many < few, "{many} {few}");
    }
}
