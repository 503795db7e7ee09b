//! Placements: how many GPUs a job uses on each node it spans.
//!
//! The reference data writes a placement as one digit per node (`88888888` = 8 nodes
//! x 8 GPUs, `111122` = six nodes with 1,1,1,1,2,2 GPUs). A placement is a multiset:
//! two placements that differ only in node order are equal. We keep the counts sorted
//! in decreasing order, which makes equality, hashing and printing canonical.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;

/// GPUs per node of one job, up to node order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    /// GPUs on each node, decreasing, all positive.
    per_node: Vec<u32>,
}

impl Placement {
    /// A placement from GPU counts per node in any order. Nodes with zero GPUs are
    /// dropped; `None` when no GPU is left.
    pub fn new(mut per_node: Vec<u32>) -> Option<Self> {
        per_node.retain(|&g| g > 0);
        if per_node.is_empty() {
            return None;
        }
        per_node.sort_unstable_by(|a, b| b.cmp(a));
        Some(Placement { per_node })
    }

    /// `gpus` GPUs packed onto nodes of `gpus_per_node`: full nodes first.
    pub fn packed(gpus: u32, gpus_per_node: u32) -> Option<Self> {
        if gpus_per_node == 0 {
            return None;
        }
        let mut per_node = vec![gpus_per_node; (gpus / gpus_per_node) as usize];
        per_node.push(gpus % gpus_per_node);
        Self::new(per_node)
    }

    pub fn per_node(&self) -> &[u32] {
        &self.per_node
    }

    pub fn nodes(&self) -> u32 {
        self.per_node.len() as u32
    }

    pub fn gpus(&self) -> u32 {
        self.per_node.iter().sum()
    }

    /// Fewest GPUs on any node of the placement.
    pub fn min_per_node(&self) -> u32 {
        self.per_node.last().copied().unwrap_or(0)
    }

    pub fn max_per_node(&self) -> u32 {
        self.per_node.first().copied().unwrap_or(0)
    }

    /// Whether the job spans more than one node.
    pub fn is_multi_node(&self) -> bool {
        self.per_node.len() > 1
    }
}

impl fmt::Display for Placement {
    /// Digits when every node has at most 9 GPUs (`8844`), else comma-separated
    /// counts (`16,16,8`; a single wide node is `16,`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.per_node.iter().all(|&g| g < 10) {
            for g in &self.per_node {
                write!(f, "{g}")?;
            }
            Ok(())
        } else {
            let parts: Vec<String> = self.per_node.iter().map(u32::to_string).collect();
            f.write_str(&parts.join(","))?;
            // One wide node: a trailing comma keeps `16,` apart from two nodes `16`.
            if parts.len() == 1 { f.write_str(",") } else { Ok(()) }
        }
    }
}

impl FromStr for Placement {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let err = |why: &str| ParseError::new("placement", s, why.to_owned());
        let counts: Vec<u32> = if text.contains(',') {
            text.strip_suffix(',')
                .unwrap_or(text)
                .split(',')
                .map(|part| part.trim().parse::<u32>())
                .collect::<Result<_, _>>()
                .map_err(|_| err("expected GPU counts separated by commas, e.g. 16,16,8"))?
        } else {
            if text.is_empty() || !text.chars().all(|c| c.is_ascii_digit()) {
                return Err(err("expected one digit per node, e.g. 8844"));
            }
            text.chars().filter_map(|c| c.to_digit(10)).collect()
        };
        if counts.contains(&0) {
            return Err(err("a node with 0 GPUs"));
        }
        Placement::new(counts).ok_or_else(|| err("no GPUs"))
    }
}

crate::string_serde!(
    Placement,
    "GPUs per node: one digit per node (8844) or comma-separated counts (16,16,8).",
    r"^([1-9]+|[0-9]+(,[0-9]+)*)$"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_up_to_node_order() {
        let a: Placement = "111122".parse().unwrap();
        let b: Placement = "221111".parse().unwrap();
        let c: Placement = "121211".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a.to_string(), "221111");
        assert_eq!(a.gpus(), 8);
        assert_eq!(a.nodes(), 6);
        assert_eq!(a.min_per_node(), 1);
        assert_ne!(a, "2222".parse().unwrap());
    }

    #[test]
    fn wide_nodes_use_commas() {
        let p: Placement = "8,16,16".parse().unwrap();
        assert_eq!(p.to_string(), "16,16,8");
        assert_eq!(p.to_string().parse::<Placement>().unwrap(), p);
        // Regression: one node of 10 printed as `10`, which reads as two nodes.
        let wide = Placement::new(vec![10]).unwrap();
        assert_eq!(wide.to_string(), "10,");
        assert_eq!(wide.to_string().parse::<Placement>().unwrap(), wide);
    }

    #[test]
    fn packing_fills_nodes_first() {
        assert_eq!(Placement::packed(20, 8).unwrap().to_string(), "884");
        assert_eq!(Placement::packed(0, 8), None);
    }

    #[test]
    fn rejects_bad_text() {
        for bad in ["", "80", "8a", "8,,8", "-1", "8,0"] {
            assert!(bad.parse::<Placement>().is_err(), "{bad}");
        }
    }
}
