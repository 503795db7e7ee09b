//! The ranges of every count and size rubick reads: checked once where an artifact is
//! parsed (exit 2 naming the field and the range), so that no arithmetic downstream can
//! overflow and no loop is driven by an absurd value. Each bound is far beyond any real
//! cluster or job, and far below what the planner's integer types hold.

/// GPUs of a cluster, and of a job's request (2^19: the largest clusters today have
/// ~10^5). With [`MAX_CPU_CORES`], cores per GPU times GPUs stays below 2^31.
pub const MAX_GPUS: u64 = 1 << 19;
/// GPUs of one node (the largest NVLink domains today: 72).
pub const MAX_GPUS_PER_NODE: u32 = 1024;
/// Nodes of a node group.
pub const MAX_NODES: u32 = 1 << 20;
/// CPU cores of one node.
pub const MAX_CPU_CORES: u32 = 1 << 12;
/// Memory of a GPU or a node, GiB (a PiB).
pub const MAX_MEMORY_GIB: f64 = 1024.0 * 1024.0;
/// A link's bandwidth, GB/s.
pub const MAX_BANDWIDTH_GBPS: f64 = 1e6;
/// A group's compute speed relative to the reference GPU.
pub const MAX_COMPUTE_SPEED: f64 = 1e4;
/// A job's global batch (samples per iteration; plan spaces enumerate its divisors).
pub const MAX_GLOBAL_BATCH: u64 = 1 << 24;
/// Layers, heads of a model.
pub const MAX_LAYERS: u32 = 1 << 16;
/// Hidden size, sequence length, vocabulary of a model.
pub const MAX_WIDTH: u32 = 1 << 24;
/// Parameters of a model (10^15).
pub const MAX_PARAMETERS: u64 = 1_000_000_000_000_000;
/// Iterations of a job.
pub const MAX_JOB_ITERATIONS: u64 = 1 << 40;
/// A time on the jobs' clock: a submission, a round's time, a trace's times and
/// durations (seconds; 1e11 is about 3,000 years, where a float's second still counts).
pub const MAX_CLOCK_SECONDS: f64 = 1e11;
/// Bytes per parameter of a model state, and the activation factor.
pub const MAX_FACTOR: f64 = 1e4;

/// `Err` with the range when `value` is outside `lo..=hi`.
pub fn check_range<T: PartialOrd + std::fmt::Display + Copy>(value: T, lo: T, hi: T) -> Result<(), String> {
    if value >= lo && value <= hi { Ok(()) } else { Err(format!("must be {lo} to {hi}, got {value}")) }
}

/// A number as a message shows it: `1e300`, not its 301 digits.
pub fn shown(value: f64) -> String {
    if value.abs() < 1e15 { format!("{value}") } else { format!("{value:e}") }
}

/// `Err` with the range when `value` is not a finite number in `lo..=hi` (`lo`
/// excluded when `open_low`).
pub fn check_real(value: f64, lo: f64, hi: f64, open_low: bool) -> Result<(), String> {
    let low_ok = if open_low { value > lo } else { value >= lo };
    if value.is_finite() && low_ok && value <= hi {
        Ok(())
    } else {
        let low = if open_low { format!("above {lo}") } else { format!("{lo}") };
        Err(format!("must be a number from {low} to {hi}, got {}", shown(value)))
    }
}
