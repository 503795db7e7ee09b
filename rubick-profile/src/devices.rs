//! This machine: its GPUs through NVML (or, without a driver, its CPU), and a
//! `Cluster` of it so that `run` works here without hand-written YAML.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use nvml_wrapper::Nvml;
use rubick_core::artifact::{ApiVersion, Kind};
use rubick_core::{Cluster, NodeGroup};
use serde::Serialize;

/// The GPU type of a node group whose "GPUs" are worker slots of a CPU-only machine.
pub use rubick_core::cluster::CPU_GPU_TYPE;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_gib: f64,
    pub driver_version: String,
}

/// What this machine offers a profile.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    pub hostname: String,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub host_memory_gib: f64,
    /// Why there are no GPUs, when there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_gpu_reason: Option<String>,
    pub gpus: Vec<GpuDevice>,
}

/// NVML, when this machine has an NVIDIA driver; else why not (one message).
pub fn nvml() -> Result<Arc<Nvml>, String> {
    Nvml::init().map(Arc::new).map_err(|e| {
        format!("NVML is not available ({e}): no NVIDIA driver on this machine (libnvidia-ml.so.1), so no GPU metrics")
    })
}

/// The GPUs NVML sees.
pub fn gpus(nvml: &Nvml) -> anyhow::Result<Vec<GpuDevice>> {
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
                memory_gib: memory.total as f64 / GIB,
                driver_version: driver_version.clone(),
            })
        })
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

/// This machine: its GPUs, or why it has none, and its CPU and memory.
pub fn machine() -> anyhow::Result<Machine> {
    let (gpus, no_gpu_reason) = match nvml() {
        Ok(nvml) => (gpus(&nvml)?, None),
        Err(reason) => (Vec::new(), Some(reason)),
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cpu_cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("/proc/meminfo")?;
    let kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("/proc/meminfo: no MemTotal")?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".into(), |h| h.trim().to_owned());
    Ok(Machine { hostname, cpu_model, cpu_cores, host_memory_gib: kib / (1u64 << 20) as f64, no_gpu_reason, gpus })
}

/// Host memory-copy bandwidth in GB/s (best of a few copies of 64 MiB): what a CPU
/// "cluster" moves gradients and offloaded state at.
pub fn memcpy_gbps() -> f64 {
    let n = 64usize << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(start.elapsed().as_secs_f64());
    }
    n as f64 / best.max(1e-9) / 1e9
}

/// The host memory jobs may ask for: 90 % of it (the system and a scheduler's own
/// daemons keep the rest; Slurm refuses a job asking more than its node declares).
fn host_memory_gib(machine: &Machine) -> f64 {
    (machine.host_memory_gib * 0.9).floor().max(1.0)
}

/// A `Cluster` of this one machine. With GPUs: one node of them (NVLink and PCIe at
/// the figures of the GPU's generation are unknown to NVML, so nominal values of a
/// PCIe 4 x16 host; edit them if you know better). Without: one node of
/// `min(cores, 8)` worker slots of type `cpu`, each slot a share of the cores and of
/// the memory, links at the measured memory-copy bandwidth.
pub fn local_cluster(machine: &Machine) -> Cluster {
    let group = if let Some(first) = machine.gpus.first() {
        NodeGroup {
            name: "local".into(),
            count: 1,
            gpu_type: first.name.clone(),
            gpus_per_node: machine.gpus.len() as u32,
            gpu_memory_gib: (first.memory_gib * 100.0).floor() / 100.0,
            cpu_cores: machine.cpu_cores,
            host_memory_gib: host_memory_gib(machine),
            nvlink_gbps: 25.0,
            inter_node_gbps: 1.25,
            pcie_gbps: 25.0,
            compute_speed: 1.0,
            hosts: Vec::new(),
        }
    } else {
        let slots = machine.cpu_cores.clamp(1, 8);
        let bandwidth = (memcpy_gbps() * 10.0).round() / 10.0;
        NodeGroup {
            name: "local".into(),
            count: 1,
            gpu_type: CPU_GPU_TYPE.into(),
            gpus_per_node: slots,
            gpu_memory_gib: (machine.host_memory_gib / f64::from(slots)).floor().max(1.0),
            cpu_cores: machine.cpu_cores,
            host_memory_gib: host_memory_gib(machine),
            nvlink_gbps: bandwidth.max(0.1),
            inter_node_gbps: 1.25,
            pcie_gbps: bandwidth.max(0.1),
            compute_speed: 1.0,
            hosts: Vec::new(),
        }
    };
    Cluster {
        api_version: Some(ApiVersion::CURRENT),
        kind: Some(Kind::Cluster),
        name: machine.hostname.clone(),
        node_groups: vec![group],
    }
}

/// NVML readings of a run's GPUs, summarised.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuMetrics {
    pub util_pct: f64,
    pub peak_memory_gib: f64,
    pub power_w: f64,
    pub sm_clock_mhz: f64,
    /// `index:util%/peak GiB/W/MHz` per GPU, `;`-separated.
    pub per_gpu: String,
}

/// Samples the given GPUs every `period` on a thread of its own until stopped.
#[derive(Debug)]
pub struct Sampler {
    stop: std::sync::mpsc::Sender<()>,
    handle: std::thread::JoinHandle<Option<GpuMetrics>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Acc {
    n: u32,
    util: f64,
    peak_mem: f64,
    power: f64,
    sm: f64,
}

impl Sampler {
    pub fn start(nvml: Arc<Nvml>, indices: Vec<u32>, period: Duration) -> Sampler {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            let mut acc = vec![Acc::default(); indices.len()];
            loop {
                for (a, &index) in acc.iter_mut().zip(&indices) {
                    let Ok(device) = nvml.device_by_index(index) else { continue };
                    if let (Ok(u), Ok(m)) = (device.utilization_rates(), device.memory_info()) {
                        a.n += 1;
                        a.util += f64::from(u.gpu);
                        a.peak_mem = a.peak_mem.max(m.used as f64 / GIB);
                        a.power += device.power_usage().map_or(0.0, |mw| f64::from(mw) / 1000.0);
                        a.sm +=
                            device.clock_info(nvml_wrapper::enum_wrappers::device::Clock::SM).map_or(0.0, f64::from);
                    }
                }
                if !matches!(stopped.recv_timeout(period), Err(std::sync::mpsc::RecvTimeoutError::Timeout)) {
                    break;
                }
            }
            let sampled: Vec<(u32, Acc)> = indices.iter().copied().zip(acc).filter(|(_, a)| a.n > 0).collect();
            if sampled.is_empty() {
                return None;
            }
            let mean = |f: fn(&Acc) -> f64| {
                sampled.iter().map(|(_, a)| f(a) / f64::from(a.n)).sum::<f64>() / sampled.len() as f64
            };
            Some(GpuMetrics {
                util_pct: mean(|a| a.util),
                peak_memory_gib: sampled.iter().map(|(_, a)| a.peak_mem).fold(0.0, f64::max),
                power_w: mean(|a| a.power),
                sm_clock_mhz: mean(|a| a.sm),
                per_gpu: sampled
                    .iter()
                    .map(|(i, a)| {
                        let n = f64::from(a.n);
                        format!("{i}:{:.0}%/{:.2}GiB/{:.0}W/{:.0}MHz", a.util / n, a.peak_mem, a.power / n, a.sm / n)
                    })
                    .collect::<Vec<_>>()
                    .join(";"),
            })
        });
        Sampler { stop, handle }
    }

    /// Stops sampling; the summary, or `None` when no reading succeeded.
    pub fn finish(self) -> Option<GpuMetrics> {
        let _ = self.stop.send(());
        self.handle.join().ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_gpus_is_a_cpu_cluster_that_validates() {
        let machine = Machine {
            hostname: "box".into(),
            cpu_model: "x".into(),
            cpu_cores: 2,
            host_memory_gib: 23.4,
            no_gpu_reason: Some("none".into()),
            gpus: vec![],
        };
        let cluster = local_cluster(&machine);
        let g = &cluster.node_groups[0];
        assert_eq!((g.gpu_type.as_str(), g.gpus_per_node, g.cpu_cores), (CPU_GPU_TYPE, 2, 2));
        assert!(g.nvlink_gbps > 0.0 && g.gpu_memory_gib >= 1.0);
        let yaml = rubick_core::artifact::to_yaml(&cluster);
        let back: Cluster = rubick_io::files::parse_artifact(std::path::Path::new("c.yaml"), &yaml).unwrap();
        assert_eq!(back.node_groups[0].gpus_per_node, 2);
    }
}
