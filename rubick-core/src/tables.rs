//! Column schemas of the tables the tools exchange (CSV or Parquet).
//!
//! A table is described twice on purpose: as a row type (serde + JSON Schema, for
//! documentation and conversion) and as a list of [`ColumnSpec`]s (for checking a
//! table's columns before reading it). A test keeps the two in step; writers build
//! their frames from row values through the spec (`rubick_io::table::frame_of`),
//! never from a third list of columns.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Version of the table schemas, stored in Parquet metadata under [`SCHEMA_KEY`].
pub const TABLE_SCHEMA_VERSION: &str = "rubick/v1";
/// Parquet key-value metadata key holding `<version> <table name>`.
pub const SCHEMA_KEY: &str = "rubick.schema";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Str,
    Int,
    Float,
    Bool,
}

impl ColumnType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Str => "string",
            Self::Int => "integer",
            Self::Float => "number",
            Self::Bool => "boolean",
        }
    }
}

/// One column of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: &'static str,
    pub dtype: ColumnType,
    pub required: bool,
    pub description: &'static str,
}

const fn col(name: &'static str, dtype: ColumnType, required: bool, description: &'static str) -> ColumnSpec {
    ColumnSpec { name, dtype, required, description }
}

use ColumnType::{Bool, Float, Int, Str};

/// A named table schema.
#[derive(Debug, Clone, Copy)]
pub struct TableSchema {
    pub name: &'static str,
    pub columns: &'static [ColumnSpec],
}

impl TableSchema {
    pub fn column(&self, name: &str) -> Option<&ColumnSpec> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// One measured run of a job under a plan and placement (`rubick-profile` output).
/// A run that did not measure (`status` oom / unsupported / failed / timeout) has no times: an
/// out-of-memory run marks its configuration infeasible. Tables without `status`
/// (hand-made, older) are all measured runs.
pub const PROFILE: TableSchema = TableSchema {
    name: "profile",
    columns: &[
        col("job", Str, true, "job name"),
        col("model", Str, true, "model name"),
        col("plan", Str, true, "complete plan, readable form"),
        col("placement", Str, true, "GPUs per node, e.g. 8844"),
        col("gpu_type", Str, false, "GPU model"),
        col("cpus", Int, false, "CPU cores given to the job"),
        col("host_memory_gib", Float, false, "host memory given to the job"),
        col(
            "status",
            Str,
            false,
            "ok, oom (infeasible), unsupported (exit 2: the script refuses the plan), failed or timeout; absent: ok",
        ),
        col("exit_code", Int, false, "the run's exit code, when it exited"),
        col(
            "reason",
            Str,
            false,
            "why a run did not measure (exit code, timeout, no metric lines), or why an ok run did not exit 0 \
             (stopped by rubick once measured)",
        ),
        col("repeat", Int, false, "which repetition of the configuration (0, 1, ...)"),
        col("iterations", Int, false, "iterations measured (after the warm-up)"),
        col("iter_time_s", Float, false, "seconds per iteration (one global batch), mean of the measured ones"),
        col("iter_time_sd_s", Float, false, "standard deviation of the measured iterations' times"),
        col("forward_s", Float, false, "forward time per iteration"),
        col("backward_sync_s", Float, false, "backward overlapped with gradient sync"),
        col("optimizer_s", Float, false, "optimizer step"),
        col("samples_per_s", Float, false, "throughput"),
        col("peak_gpu_memory_gib", Float, false, "peak GPU memory of the busiest GPU"),
        col("gpu_util_pct", Float, false, "mean GPU utilisation (NVML)"),
        col("power_w", Float, false, "mean power per GPU (NVML)"),
        col("sm_clock_mhz", Float, false, "mean SM clock (NVML)"),
        col("per_gpu", Str, false, "per GPU (NVML): index:util%/peak GiB/W/MHz, `;`-separated"),
        col("wall_s", Float, false, "wall time of the run, start to exit"),
    ],
};

/// Per-job results of a simulation (`rubick-plan simulate --jobs-out`).
pub const SIM_JOBS: TableSchema = TableSchema {
    name: "sim-jobs",
    columns: &[
        col("job", Str, true, "job name"),
        col("model", Str, true, "model name"),
        col("submit_s", Float, true, "submission time"),
        col("first_start_s", Float, false, "first time the job held GPUs"),
        col("finish_s", Float, false, "completion time"),
        col("jct_s", Float, false, "completion - submission"),
        col("queueing_s", Float, false, "first start - submission"),
        col("restarts", Int, true, "placement changes incl. the first start"),
        col("plan_changes", Int, true, "times the plan changed"),
        col("gpu_hours", Float, true, "GPU time consumed"),
        col("guaranteed", Bool, true, "whether the job had a throughput guarantee"),
        col("guarantee_held", Bool, false, "never below the guarantee while holding GPUs"),
    ],
};

/// How a profiling run ended: the `status` column of [`PROFILE`], written as today's
/// files hold it (`ok`, `oom`, `unsupported`, `failed`, `timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProfileStatus {
    /// Measured its configuration.
    Ok,
    /// Out of memory: the configuration is infeasible.
    Oom,
    /// The script refused the plan (exit 2).
    Unsupported,
    /// Exited otherwise, or measured nothing.
    Failed,
    /// Overran its time limit.
    Timeout,
}

impl ProfileStatus {
    /// The status as the column holds it.
    pub fn as_str(self) -> &'static str {
        match self {
            ProfileStatus::Ok => "ok",
            ProfileStatus::Oom => "oom",
            ProfileStatus::Unsupported => "unsupported",
            ProfileStatus::Failed => "failed",
            ProfileStatus::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for ProfileStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A row of [`PROFILE`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileRow {
    pub job: String,
    pub model: String,
    pub plan: String,
    pub placement: String,
    pub gpu_type: Option<String>,
    pub cpus: Option<i64>,
    pub host_memory_gib: Option<f64>,
    pub status: Option<ProfileStatus>,
    #[serde(default)]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub reason: Option<String>,
    pub repeat: Option<i64>,
    pub iterations: Option<i64>,
    pub iter_time_s: Option<f64>,
    pub iter_time_sd_s: Option<f64>,
    pub forward_s: Option<f64>,
    pub backward_sync_s: Option<f64>,
    pub optimizer_s: Option<f64>,
    pub samples_per_s: Option<f64>,
    pub peak_gpu_memory_gib: Option<f64>,
    pub gpu_util_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub sm_clock_mhz: Option<f64>,
    pub per_gpu: Option<String>,
    pub wall_s: Option<f64>,
}

impl ProfileRow {
    /// Whether the run measured its configuration (`status` ok or absent) with a time.
    pub fn measured(&self) -> bool {
        matches!(self.status, None | Some(ProfileStatus::Ok)) && self.iter_time_s.is_some()
    }
}

/// A row of [`SIM_JOBS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimJobRow {
    pub job: String,
    pub model: String,
    pub submit_s: f64,
    pub first_start_s: Option<f64>,
    pub finish_s: Option<f64>,
    pub jct_s: Option<f64>,
    pub queueing_s: Option<f64>,
    pub restarts: i64,
    pub plan_changes: i64,
    pub gpu_hours: f64,
    pub guaranteed: bool,
    pub guarantee_held: Option<bool>,
}
