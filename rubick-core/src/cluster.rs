//! The cluster: groups of identical nodes, possibly of several GPU types.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::artifact::{ApiVersion, Artifact, Kind};
use crate::error::{ValidationError, ensure};

/// A `Cluster` artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<ApiVersion>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// A name for humans and logs.
    pub name: String,
    /// Groups of identical nodes. Node `i` of group `g` is called `g-i`, or by its
    /// host name when the group lists them (`hosts`).
    pub node_groups: Vec<NodeGroup>,
}

/// `count` identical nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGroup {
    /// Unique within the cluster; node names are `<name>-<index>`.
    pub name: String,
    /// Number of nodes in the group.
    #[schemars(range(min = 1))]
    pub count: u32,
    /// GPU model, e.g. `A800-80GB`. Jobs may ask for a type.
    pub gpu_type: String,
    #[schemars(range(min = 1))]
    pub gpus_per_node: u32,
    /// Memory of one GPU in GiB.
    pub gpu_memory_gib: f64,
    /// CPU cores (or vCPUs) per node.
    #[schemars(range(min = 1))]
    pub cpu_cores: u32,
    /// Host memory per node in GiB.
    pub host_memory_gib: f64,
    /// GPU-to-GPU bandwidth inside a node (NVLink), GB/s per GPU, one direction.
    #[serde(rename = "nvlinkGBps")]
    pub nvlink_gbps: f64,
    /// Network bandwidth between nodes, GB/s per node, one direction.
    #[serde(rename = "interNodeGBps")]
    pub inter_node_gbps: f64,
    /// Host-to-GPU bandwidth (PCIe), GB/s per GPU, one direction.
    #[serde(rename = "pcieGBps")]
    pub pcie_gbps: f64,
    /// Compute speed of the GPU relative to the one the jobs' performance models were
    /// fitted on (1 = the same; 2 = twice as fast).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub compute_speed: f64,
    /// The nodes' own names (host names, a batch system's node names), one per node:
    /// schedules name node `i` by `hosts[i]` instead of `<name>-<i>`, so that a backend
    /// can place runs on them (`rubick-run cluster --backend slurm` writes them). A
    /// cluster that lists hosts describes the nodes up now: a job running on a node it
    /// lacks is planned afresh (its run moves) instead of refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// The GPU type of a node group whose "GPUs" are worker slots of CPU cores (what
/// `rubick-profile devices` describes a machine without a GPU driver as): a job that
/// requires a GPU (`requires.gpu`) cannot run there.
pub const CPU_GPU_TYPE: &str = "cpu";

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

impl NodeGroup {
    pub fn total_gpus(&self) -> u32 {
        self.count.saturating_mul(self.gpus_per_node)
    }

    /// The name of node `index`: its host name when the group lists them, else
    /// `<name>-<index>`.
    pub fn node_name(&self, index: u32) -> String {
        match self.hosts.get(index as usize) {
            Some(host) => host.clone(),
            None => format!("{}-{index}", self.name),
        }
    }

    /// The index of the node called `name` in this group, if it is one of its nodes.
    pub fn node_index(&self, name: &str) -> Option<u32> {
        if !self.hosts.is_empty() {
            return self.hosts.iter().position(|h| h == name).map(|i| i as u32);
        }
        let index: u32 = name.strip_prefix(self.name.as_str())?.strip_prefix('-')?.parse().ok()?;
        (index < self.count).then_some(index)
    }

    /// Whether the group's GPUs are GPUs, not worker slots of CPU cores
    /// ([`CPU_GPU_TYPE`]).
    pub fn has_gpus(&self) -> bool {
        !self.gpu_type.eq_ignore_ascii_case(CPU_GPU_TYPE)
    }

    /// A GPU's fair share of its node's CPU cores (at least 1).
    pub fn fair_cpus_per_gpu(&self) -> u32 {
        (self.cpu_cores / self.gpus_per_node.max(1)).max(1)
    }

    fn validate(&self) -> Result<(), ValidationError> {
        use crate::limits::{self, check_range, check_real};
        let at = |field: &'static str| move |why: String| ValidationError::new(field, why);
        ensure(!self.name.trim().is_empty(), "name", || "must not be empty".into())?;
        check_range(self.count, 1, limits::MAX_NODES).map_err(at("count"))?;
        ensure(!self.gpu_type.trim().is_empty(), "gpuType", || "must not be empty".into())?;
        check_range(self.gpus_per_node, 1, limits::MAX_GPUS_PER_NODE).map_err(at("gpusPerNode"))?;
        check_range(self.cpu_cores, 1, limits::MAX_CPU_CORES).map_err(at("cpuCores"))?;
        for (field, value, max) in [
            ("gpuMemoryGib", self.gpu_memory_gib, limits::MAX_MEMORY_GIB),
            ("hostMemoryGib", self.host_memory_gib, limits::MAX_MEMORY_GIB),
            ("nvlinkGBps", self.nvlink_gbps, limits::MAX_BANDWIDTH_GBPS),
            ("interNodeGBps", self.inter_node_gbps, limits::MAX_BANDWIDTH_GBPS),
            ("pcieGBps", self.pcie_gbps, limits::MAX_BANDWIDTH_GBPS),
            ("computeSpeed", self.compute_speed, limits::MAX_COMPUTE_SPEED),
        ] {
            check_real(value, 0.0, max, true).map_err(at(field))?;
        }
        if !self.hosts.is_empty() {
            ensure(self.hosts.len() == self.count as usize, "hosts", || {
                format!("{} host names for {} nodes: one per node, or none", self.hosts.len(), self.count)
            })?;
            for (i, host) in self.hosts.iter().enumerate() {
                if host.is_empty() || !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
                    return Err(ValidationError::new(
                        format!("hosts[{i}]"),
                        format!("`{host}`: a host name is [A-Za-z0-9._-]+"),
                    ));
                }
            }
        }
        let gpus = u64::from(self.count) * u64::from(self.gpus_per_node);
        ensure(gpus <= limits::MAX_GPUS, "count", || {
            format!(
                "{} nodes of {} GPUs = {gpus} GPUs; at most {} in a cluster",
                self.count,
                self.gpus_per_node,
                limits::MAX_GPUS
            )
        })?;
        Ok(())
    }
}

impl Cluster {
    pub fn total_gpus(&self) -> u32 {
        self.node_groups.iter().map(NodeGroup::total_gpus).sum()
    }

    pub fn total_nodes(&self) -> u32 {
        self.node_groups.iter().map(|g| g.count).sum()
    }

    pub fn group(&self, name: &str) -> Option<&NodeGroup> {
        self.node_groups.iter().find(|g| g.name == name)
    }

    /// The (group, index) of a node named `<group>-<index>` (or by a group's `hosts`).
    pub fn node_by_name(&self, name: &str) -> Option<(usize, u32)> {
        self.node_groups.iter().enumerate().find_map(|(gi, g)| Some((gi, g.node_index(name)?)))
    }

    /// Distinct GPU types in the order they first appear.
    pub fn gpu_types(&self) -> Vec<&str> {
        let mut types: Vec<&str> = Vec::new();
        for g in &self.node_groups {
            if !types.contains(&g.gpu_type.as_str()) {
                types.push(&g.gpu_type);
            }
        }
        types
    }

    /// The paper's testbed: 8 nodes x 8 A800-80GB, 96 vCPUs and 1,600 GB per node.
    pub fn example() -> Self {
        Cluster {
            api_version: Some(ApiVersion::CURRENT),
            kind: Some(Kind::Cluster),
            name: "a800-8x8".into(),
            node_groups: vec![NodeGroup {
                name: "a800".into(),
                count: 8,
                gpu_type: "A800-80GB".into(),
                gpus_per_node: 8,
                gpu_memory_gib: 80.0,
                cpu_cores: 96,
                host_memory_gib: 1600.0,
                nvlink_gbps: 200.0,
                inter_node_gbps: 25.0,
                pcie_gbps: 25.0,
                compute_speed: 1.0,
                hosts: Vec::new(),
            }],
        }
    }
}

impl Artifact for Cluster {
    crate::artifact_header!(Kind::Cluster);

    fn validate(&self) -> Result<(), ValidationError> {
        ensure(!self.name.trim().is_empty(), "name", || "must not be empty".into())?;
        ensure(!self.node_groups.is_empty(), "nodeGroups", || "at least one node group is needed".into())?;
        let mut hosts = std::collections::HashSet::new();
        for (i, group) in self.node_groups.iter().enumerate() {
            group.validate().map_err(|e| e.within(&format!("nodeGroups[{i}]")))?;
            if self.node_groups[..i].iter().any(|g| g.name == group.name) {
                return Err(ValidationError::new(
                    format!("nodeGroups[{i}].name"),
                    format!("`{}` is used by an earlier group", group.name),
                ));
            }
            // Every node's name once in the cluster: a host named twice, or like another
            // group's `<name>-<index>` (generated names cannot collide among themselves).
            for (k, host) in group.hosts.iter().enumerate() {
                let generated = || self.node_groups.iter().filter(|g| g.hosts.is_empty());
                if !hosts.insert(host.as_str()) || generated().any(|g| g.node_index(host).is_some()) {
                    return Err(ValidationError::new(
                        format!("nodeGroups[{i}].hosts[{k}]"),
                        format!("`{host}` names another node too"),
                    ));
                }
            }
        }
        let total: u64 = self.node_groups.iter().map(|g| u64::from(g.count) * u64::from(g.gpus_per_node)).sum::<u64>();
        ensure(total <= crate::limits::MAX_GPUS, "nodeGroups", || {
            format!("{total} GPUs in all; at most {} in a cluster", crate::limits::MAX_GPUS)
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_listing_hosts_names_its_nodes_by_them_once_each() {
        let mut c = Cluster::example();
        c.node_groups[0].count = 2;
        c.node_groups[0].hosts = vec!["gpu-a".into(), "gpu-b".into()];
        assert!(c.validate().is_ok());
        let g = &c.node_groups[0];
        assert_eq!((g.node_name(1), g.node_index("gpu-b"), g.node_index("a800-1")), ("gpu-b".into(), Some(1), None));
        let plain = &Cluster::example().node_groups[0];
        assert_eq!(
            (plain.node_name(7), plain.node_index("a800-7"), plain.node_index("a800-8")),
            ("a800-7".into(), Some(7), None)
        );
        for (hosts, field) in [
            (vec!["gpu-a"], "hosts"),
            (vec!["gpu-a", "gpu-a"], "nodeGroups[0].hosts[1]"),
            (vec!["gpu-a", "$(x)"], "hosts[1]"),
        ] {
            let mut bad = c.clone();
            bad.node_groups[0].hosts = hosts.into_iter().map(str::to_owned).collect();
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        // A host of one group named like a node of another.
        let mut two = c.clone();
        two.node_groups.push(NodeGroup {
            name: "b".into(),
            count: 1,
            hosts: vec!["a800-0".into()],
            ..c.node_groups[0].clone()
        });
        two.node_groups[0].hosts.clear();
        assert!(two.validate().unwrap_err().to_string().contains("nodeGroups[1].hosts[0]"));
    }
}
