//! `rubick-run cluster`: the cluster a backend really has, as a `Cluster` artifact,
//! so that each round of the cron loop plans on what is up.
//!
//! Slurm: every node of the partition (`--partition`, else the default one) that new
//! jobs may start on (`sinfo`: up, not drained or draining, responding), grouped by
//! shape (GPUs, GPU type, cores, memory) into node groups whose `hosts` are Slurm's
//! node names, so that the schedule names them and the Slurm backend places each run
//! where it was planned (`--nodelist`). Nodes left out are named on stderr with why.
//! What Slurm does not know (GPU memory, link bandwidths) comes from the flags.

use std::collections::BTreeMap;
use std::path::Path;

use rubick_core::artifact::{ApiVersion, Kind};
use rubick_core::cluster::{Cluster, NodeGroup};
use rubick_launch::slurm::NodeInfo;

/// What Slurm does not say about the hardware.
#[derive(Debug, Clone, clap::Args)]
pub struct Hardware {
    /// The cluster's name (default: Slurm's `ClusterName`)
    #[arg(long)]
    pub name: Option<String>,
    /// Only this partition's nodes (default: the default partition's)
    #[arg(long)]
    pub partition: Option<String>,
    /// GPU type of nodes whose gres names none (`gpu:4`)
    #[arg(long, default_value = "gpu")]
    pub gpu_type: String,
    /// Memory of one GPU, GiB
    #[arg(long, default_value_t = 80.0)]
    pub gpu_memory_gib: f64,
    /// GPU-to-GPU bandwidth inside a node (NVLink), GB/s per GPU
    #[arg(long, default_value_t = 200.0)]
    pub nvlink_gbps: f64,
    /// Network bandwidth between nodes, GB/s per node
    #[arg(long, default_value_t = 25.0)]
    pub inter_node_gbps: f64,
    /// Host-to-GPU bandwidth (PCIe), GB/s per GPU
    #[arg(long, default_value_t = 25.0)]
    pub pcie_gbps: f64,
}

/// A node's shape: GPUs, GPU type, cores, memory (MB).
type Shape = (u32, String, u32, u64);

/// The cluster of `nodes` (as `sinfo` lists them) for `hw`; with the nodes left out
/// and why. An error when no node is left.
pub fn from_slurm(nodes: &[NodeInfo], hw: &Hardware, name: &str) -> anyhow::Result<(Cluster, Vec<String>)> {
    let mut left_out = Vec::new();
    // Shape -> hosts, in Slurm's order of first appearance.
    let mut shapes: Vec<(Shape, Vec<String>)> = Vec::new();
    for n in nodes {
        let in_partition = match &hw.partition {
            Some(p) => n.partitions.iter().any(|x| x == p),
            None => n.in_default,
        };
        if !in_partition {
            continue;
        }
        if !n.usable() {
            left_out.push(format!("{}: left out ({})", n.name, n.state));
            continue;
        }
        if n.gpus == 0 {
            left_out.push(format!("{}: left out (no GPU in its gres)", n.name));
            continue;
        }
        let gpu_type = n.gpu_type.clone().unwrap_or_else(|| hw.gpu_type.clone());
        let key = (n.gpus, gpu_type, n.cpus.max(1), n.memory_mb);
        match shapes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, hosts)) => hosts.push(n.name.clone()),
            None => shapes.push((key, vec![n.name.clone()])),
        }
    }
    let where_ = hw.partition.as_deref().map_or("the default partition".to_owned(), |p| format!("partition `{p}`"));
    anyhow::ensure!(!shapes.is_empty(), "slurm: no node of {where_} can take jobs now");
    let mut names: BTreeMap<String, u32> = BTreeMap::new();
    let node_groups = shapes
        .into_iter()
        .map(|((gpus, gpu_type, cpus, memory_mb), hosts)| {
            let base: String = format!("{gpu_type}-{gpus}")
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c.to_ascii_lowercase() } else { '-' })
                .collect();
            let seen = names.entry(base.clone()).or_insert(0);
            *seen += 1;
            let group = if *seen == 1 { base } else { format!("{base}-{seen}") };
            NodeGroup {
                name: group,
                count: hosts.len() as u32,
                gpu_type,
                gpus_per_node: gpus,
                gpu_memory_gib: hw.gpu_memory_gib,
                cpu_cores: cpus,
                host_memory_gib: (memory_mb as f64 / 1024.0 * 1000.0).floor() / 1000.0,
                nvlink_gbps: hw.nvlink_gbps,
                inter_node_gbps: hw.inter_node_gbps,
                pcie_gbps: hw.pcie_gbps,
                compute_speed: 1.0,
                hosts,
            }
        })
        .collect();
    let cluster = Cluster {
        api_version: Some(ApiVersion::CURRENT),
        kind: Some(Kind::Cluster),
        name: name.to_owned(),
        node_groups,
    };
    rubick_core::artifact::Artifact::validate(&cluster).map_err(|e| anyhow::anyhow!("slurm: the cluster made: {e}"))?;
    Ok((cluster, left_out))
}

/// `rubick-run cluster --backend BACKEND`: the cluster, written to `output`.
pub fn command(backend: &str, hw: &Hardware, output: &Path) -> anyhow::Result<rubick_io::cli::Outcome> {
    anyhow::ensure!(
        backend == "slurm",
        "--backend {backend}: only Slurm can be asked for its nodes (this machine: `rubick-profile devices --cluster-out FILE`)"
    );
    rubick_launch::slurm::available().map_err(|reason| anyhow::anyhow!("--backend slurm: {reason}"))?;
    let nodes = rubick_launch::slurm::nodes()?;
    let name = hw.name.clone().or_else(rubick_launch::slurm::cluster_name).unwrap_or_else(|| "slurm".into());
    let (cluster, left_out) = from_slurm(&nodes, hw, &name)?;
    for line in &left_out {
        eprintln!("{line}");
    }
    tracing::info!("{}: {} node(s) of {} GPU(s) in all", cluster.name, cluster.total_nodes(), cluster.total_gpus());
    rubick_io::write_output(output, rubick_io::Format::Yaml, rubick_core::artifact::to_yaml(&cluster).as_bytes())?;
    Ok(rubick_io::cli::Outcome::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw(partition: Option<&str>) -> Hardware {
        Hardware {
            name: None,
            partition: partition.map(str::to_owned),
            gpu_type: "gpu".into(),
            gpu_memory_gib: 80.0,
            nvlink_gbps: 200.0,
            inter_node_gbps: 25.0,
            pcie_gbps: 25.0,
        }
    }

    fn node(name: &str, gpus: u32, kind: Option<&str>, state: &str, partitions: &[&str], default: bool) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            partitions: partitions.iter().map(|p| (*p).to_owned()).collect(),
            in_default: default,
            cpus: 64,
            memory_mb: 512_000,
            gpus,
            gpu_type: kind.map(str::to_owned),
            state: state.into(),
        }
    }

    #[test]
    fn usable_nodes_become_groups_of_one_shape_named_by_their_hosts() {
        let nodes = [
            node("a1", 8, Some("a100"), "idle", &["gpu"], true),
            node("a2", 8, Some("a100"), "mixed", &["gpu"], true),
            node("a3", 8, Some("a100"), "drained", &["gpu"], true),
            node("h1", 4, None, "allocated", &["gpu", "long"], true),
            node("c1", 0, None, "idle", &["gpu"], true),
            node("x1", 8, Some("a100"), "idle", &["other"], false),
            node("d1", 8, Some("a100"), "down*", &["gpu"], true),
        ];
        let (c, left_out) = from_slurm(&nodes, &hw(None), "prod").unwrap();
        assert_eq!(c.node_groups.len(), 2);
        let (a, h) = (&c.node_groups[0], &c.node_groups[1]);
        assert_eq!(
            (a.name.as_str(), a.count, a.gpu_type.as_str(), a.hosts.clone()),
            ("a100-8", 2, "a100", vec!["a1".to_owned(), "a2".to_owned()])
        );
        assert_eq!((h.name.as_str(), h.gpu_type.as_str(), h.hosts.clone()), ("gpu-4", "gpu", vec!["h1".to_owned()]));
        assert_eq!(a.node_name(1), "a2");
        assert_eq!(left_out, ["a3: left out (drained)", "c1: left out (no GPU in its gres)", "d1: left out (down*)"]);
        let (long, _) = from_slurm(&nodes, &hw(Some("long")), "prod").unwrap();
        assert_eq!(long.node_groups.len(), 1);
        assert!(from_slurm(&nodes, &hw(Some("none")), "prod").is_err());
    }
}
