//! # rubick-profile: measure a job under a few plans on real GPUs
//!
//! Today: `devices` lists the GPUs NVML sees (or says clearly why it cannot). Running
//! and measuring profiling configurations comes with its issue.

use clap::{Parser, Subcommand};
use rubick_io::cli::{LogArgs, Outcome};
use serde::Serialize;

const EXAMPLES: &str = "\
Examples:
  # Which GPUs would a profile run on?
  rubick-profile devices";

/// Measure a training job under a few execution plans on real GPUs (NVML metrics), to
/// fit its performance model with rubick-fit.
#[derive(Debug, Parser)]
#[command(name = "rubick-profile", version, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List this machine's NVIDIA GPUs through NVML, as YAML on stdout
    Devices,
}

/// One GPU as NVML reports it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_gib: f64,
    pub driver_version: String,
}

/// The GPUs NVML sees. Fails with a message naming the missing driver library when
/// there is no NVIDIA driver.
pub fn devices() -> anyhow::Result<Vec<GpuDevice>> {
    use anyhow::Context;
    let nvml = nvml_wrapper::Nvml::init().context(
        "NVML is not available: no NVIDIA driver on this machine (libnvidia-ml.so.1), so no GPU can be profiled here",
    )?;
    let driver_version = nvml.sys_driver_version().context("NVML: driver version")?;
    let count = nvml.device_count().context("NVML: device count")?;
    (0..count)
        .map(|index| {
            let device = nvml.device_by_index(index).with_context(|| format!("NVML: GPU {index}"))?;
            let memory = device.memory_info().with_context(|| format!("NVML: memory of GPU {index}"))?;
            Ok(GpuDevice {
                index,
                name: device.name().with_context(|| format!("NVML: name of GPU {index}"))?,
                uuid: device.uuid().with_context(|| format!("NVML: UUID of GPU {index}"))?,
                memory_gib: memory.total as f64 / (1u64 << 30) as f64,
                driver_version: driver_version.clone(),
            })
        })
        .collect()
}

pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match cli.command {
        Command::Devices => {
            let devices = devices()?;
            tracing::info!("{} GPU(s)", devices.len());
            rubick_io::write_output(std::path::Path::new("-"), serde_yaml_ng::to_string(&devices)?.as_bytes())?;
            Ok(Outcome::Done)
        }
    }
}
