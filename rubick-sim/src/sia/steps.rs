//! The truth of an iteration in the Sia artifact's tables: one application's step
//! times on one GPU type ([`StepTable`], from `placements-<type>.csv` and
//! `scalability-<type>.csv`), a placement as the artifact names it ([`placement_id`]),
//! and the interpolation between measured batches, GPU and node counts (the module
//! doc of [`crate::sia`] says how, and where it deviates).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use rubick_core::limits;
use rubick_core::placement::Placement;

use super::{csv_rows, number};
use crate::truth::Basis;

/// One measured row: (local batch, step time, sync time).
pub(super) type Row = (f64, f64, f64);

/// The rows of one configuration, sorted by batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Curve(Vec<Row>);

impl Curve {
    /// Averages rows of the same batch, sorted by batch.
    fn of(mut rows: Vec<Row>) -> Curve {
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out: Vec<(f64, f64, f64, f64)> = Vec::new();
        for (b, s, y) in rows {
            match out.last_mut() {
                Some(l) if l.0 == b => (l.1, l.2, l.3) = (l.1 + s, l.2 + y, l.3 + 1.0),
                _ => out.push((b, s, y, 1.0)),
            }
        }
        Curve(out.into_iter().map(|(b, s, y, n)| (b, s / n, y / n)).collect())
    }

    fn max_batch(&self) -> f64 {
        self.0.last().map_or(0.0, |r| r.0)
    }

    /// (step, sync) at `batch`, linear between measured batches; `false` when clamped.
    fn at(&self, batch: f64) -> Option<(f64, f64, bool)> {
        let (first, last) = (self.0.first()?, self.0.last()?);
        if batch <= first.0 {
            return Some((first.1, first.2, batch == first.0));
        }
        if batch >= last.0 {
            return Some((last.1, last.2, batch == last.0));
        }
        let i = self.0.partition_point(|r| r.0 <= batch);
        let (a, b) = (self.0[i - 1], self.0[i]);
        let w = (batch - a.0) / (b.0 - a.0);
        Some((a.1 + w * (b.1 - a.1), a.2 + w * (b.2 - a.2), true))
    }
}

/// One application's step times on one GPU type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTable {
    /// By placement id (the artifact's: per-node counts as digits).
    pub(super) placements: BTreeMap<String, Curve>,
    /// By (nodes, GPUs): the placements' means and the scalability rows.
    pub(super) grid: BTreeMap<(u32, u32), Curve>,
}

/// The artifact's name of a placement: the smallest rotation of its per-node counts.
pub fn placement_id(per_node: &[u32]) -> String {
    let counts: Vec<u32> = per_node.iter().copied().filter(|&c| c > 0).collect();
    (0..counts.len().max(1))
        .map(|i| counts[i..].iter().chain(&counts[..i]).map(ToString::to_string).collect::<String>())
        .min()
        .unwrap_or_default()
}

impl StepTable {
    /// Reads `placements-<suffix>.csv` and `scalability-<suffix>.csv` of `app_dir`.
    pub fn open(app_dir: &Path, suffix: &str) -> anyhow::Result<StepTable> {
        let path = app_dir.join(format!("placements-{suffix}.csv"));
        let mut by_id: BTreeMap<String, Vec<Row>> = BTreeMap::new();
        let mut grid: BTreeMap<(u32, u32), Vec<Row>> = BTreeMap::new();
        for row in csv_rows(&path)? {
            let id = row.1.get("placement").with_context(|| format!("{}: no column `placement`", path.display()))?;
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit() && b != b'0') {
                bail!("{}: line {}: field `placement`: expected digits 1-9, got `{id}`", path.display(), row.0);
            }
            let counts: Vec<u32> = id.bytes().map(|b| u32::from(b - b'0')).collect();
            let r = (
                number(&path, &row, "local_bsz")?,
                number(&path, &row, "step_time")?,
                number(&path, &row, "sync_time")?,
            );
            by_id.entry(placement_id(&counts)).or_default().push(r);
            grid.entry((counts.len() as u32, counts.iter().sum())).or_default().push(r);
        }
        // The artifact appends the scalability rows to the placements' means.
        let mut grid: BTreeMap<(u32, u32), Vec<Row>> =
            grid.into_iter().map(|(k, rows)| (k, Curve::of(rows).0)).collect();
        let path = app_dir.join(format!("scalability-{suffix}.csv"));
        if path.exists() {
            for row in csv_rows(&path)? {
                let (nodes, gpus) = (number(&path, &row, "num_nodes")?, number(&path, &row, "num_replicas")?);
                if nodes < 1.0 || gpus < nodes || gpus > f64::from(limits::MAX_GPUS_PER_NODE) * nodes {
                    bail!("{}: line {}: {nodes} nodes with {gpus} GPUs", path.display(), row.0);
                }
                let r = (
                    number(&path, &row, "local_bsz")?,
                    number(&path, &row, "step_time")?,
                    number(&path, &row, "sync_time")?,
                );
                grid.entry((nodes as u32, gpus as u32)).or_default().push(r);
            }
        }
        anyhow::ensure!(!by_id.is_empty(), "{}: no rows", app_dir.join(format!("placements-{suffix}.csv")).display());
        Ok(StepTable {
            placements: by_id.into_iter().map(|(k, v)| (k, Curve::of(v))).collect(),
            grid: grid.into_iter().map(|(k, v)| (k, Curve::of(v))).collect(),
        })
    }

    /// The largest local batch measured on `placement` (`get_max_local_bsz`).
    pub(super) fn max_local(&self, placement: &Placement) -> f64 {
        if let Some(c) = self.placements.get(&placement_id(placement.per_node())) {
            return c.max_batch();
        }
        let (n, g) = (placement.nodes(), placement.gpus());
        self.grid.iter().filter(|((nn, gg), _)| *nn >= n && *gg >= g).map(|(_, c)| c.max_batch()).fold(0.0, f64::max)
    }

    /// The largest local batch measured on any placement of `gpus` GPUs, if any.
    fn max_local_of_count(&self, gpus: u32) -> Option<f64> {
        self.placements
            .iter()
            .filter(|(id, _)| id.bytes().map(|b| u32::from(b - b'0')).sum::<u32>() == gpus)
            .map(|(_, c)| c.max_batch())
            .reduce(f64::max)
    }

    /// (step, sync) at (nodes, gpus, batch) from the grid: the same key, else between
    /// GPU counts of the same node count, else between node counts.
    fn grid_at(&self, nodes: u32, gpus: u32, batch: f64) -> Option<(f64, f64, bool)> {
        let on_nodes = |n: u32| -> Option<(f64, f64, bool)> {
            if let Some(c) = self.grid.get(&(n, gpus)) {
                return c.at(batch);
            }
            let below = self.grid.range((n, 0)..(n, gpus)).next_back();
            let above = self.grid.range((n, gpus + 1)..=(n, u32::MAX)).next();
            match (below, above) {
                (Some((&(_, g0), c0)), Some((&(_, g1), c1))) => {
                    let (a, b) = (c0.at(batch)?, c1.at(batch)?);
                    let w = f64::from(gpus - g0) / f64::from(g1 - g0);
                    Some((a.0 + w * (b.0 - a.0), a.1 + w * (b.1 - a.1), a.2 && b.2))
                }
                _ => None,
            }
        };
        if let Some(r) = on_nodes(nodes) {
            return Some(r);
        }
        let mut counts: Vec<u32> = self.grid.keys().map(|k| k.0).collect();
        counts.dedup();
        let below = counts.iter().rev().find(|&&n| n < nodes).and_then(|&n| on_nodes(n).map(|r| (n, r)));
        let above = counts.iter().find(|&&n| n > nodes).and_then(|&n| on_nodes(n).map(|r| (n, r)));
        match (below, above) {
            (Some((n0, a)), Some((n1, b))) => {
                let w = f64::from(nodes - n0) / f64::from(n1 - n0);
                Some((a.0 + w * (b.0 - a.0), a.1 + w * (b.1 - a.1), a.2 && b.2))
            }
            (Some((_, r)), None) | (None, Some((_, r))) => Some((r.0, r.1, false)),
            (None, None) => None,
        }
    }

    /// (step, sync, basis) of `placement` at local batch `batch`.
    fn step(&self, placement: &Placement, batch: f64) -> Option<(f64, f64, Basis)> {
        if let Some(c) = self.placements.get(&placement_id(placement.per_node())) {
            let (s, y, inside) = c.at(batch)?;
            return Some((s, y, if inside { Basis::Measured } else { Basis::Extrapolated }));
        }
        let (s, y, inside) = self.grid_at(placement.nodes(), placement.gpus(), batch)?;
        Some((s, y, if inside { Basis::Interpolated } else { Basis::Extrapolated }))
    }

    /// The artifact's iteration time of a global `batch` on `placement`, and its basis
    /// (`update_local_bsz`, then `Job::step`'s `step_time + accum_time * accum_steps`).
    pub fn iteration_s(
        &self,
        placement: &Placement,
        batch: u64,
        init_batch: u64,
        max_batch: u64,
    ) -> Option<(f64, Basis)> {
        let gpus = placement.gpus().max(1);
        let local = (batch as f64 / f64::from(gpus) - 1e-8).ceil();
        let max_local = self.max_local(placement).max(1.0);
        let mut accum = ((local / max_local - 1e-8).ceil() - 1.0).max(0.0);
        if gpus == 1 && batch > init_batch {
            accum = accum.max(1.0);
        }
        let mut atomic = (local / (accum + 1.0) - 1e-8).ceil();
        if let Some(m) = self.max_local_of_count(gpus) {
            atomic = atomic.min(m.floor());
        }
        atomic = atomic.min((max_batch as f64 / (f64::from(gpus) * (accum + 1.0))).floor()).max(1.0);
        let (step, sync, basis) = self.step(placement, atomic)?;
        Some((step + accum * (step - sync).max(0.0), basis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_is_named_by_its_smallest_rotation() {
        assert_eq!(placement_id(&[3, 2, 1]), "132");
        assert_eq!(placement_id(&[4, 4]), "44");
        assert_eq!(placement_id(&[2, 1]), "12");
        assert_eq!(placement_id(&[1]), "1");
    }

    #[test]
    fn a_curve_interpolates_and_says_when_it_clamps() {
        let c = Curve::of(vec![(4.0, 1.0, 0.1), (8.0, 2.0, 0.3), (4.0, 3.0, 0.1)]);
        assert_eq!(c.at(4.0), Some((2.0, 0.1, true)));
        let (s, y, inside) = c.at(6.0).unwrap();
        assert!((s - 2.0).abs() < 1e-12 && (y - 0.2).abs() < 1e-12 && inside);
        assert_eq!(c.at(16.0), Some((2.0, 0.3, false)));
        assert_eq!(c.at(1.0), Some((2.0, 0.1, false)));
    }

    fn table() -> StepTable {
        let curve = |k: f64| Curve::of(vec![(4.0, k, 0.1 * k), (16.0, 2.0 * k, 0.1 * k)]);
        StepTable {
            placements: [("1".to_owned(), curve(1.0)), ("2".to_owned(), curve(1.2))].into(),
            grid: [((1, 1), curve(1.0)), ((1, 2), curve(1.2)), ((1, 4), curve(1.6)), ((2, 8), curve(3.0))].into(),
        }
    }

    /// A batch of 64 on one GPU (16 at most): 4 micro-steps of 16, each after the first
    /// without the sync; on two GPUs 2 of 16.
    #[test]
    fn accumulation_follows_the_artifact() {
        let t = table();
        let one = Placement::new(vec![1]).unwrap();
        let (s, basis) = t.iteration_s(&one, 64, 8, 1024).unwrap();
        assert_eq!(basis, Basis::Measured);
        assert!((s - (2.0 + 3.0 * 1.9)).abs() < 1e-9, "{s}");
        let two = Placement::new(vec![2]).unwrap();
        let (s, _) = t.iteration_s(&two, 64, 8, 1024).unwrap();
        assert!((s - (2.4 + (2.4 - 0.12))).abs() < 1e-9, "{s}");
        // One GPU above the initial batch accumulates at least once.
        let (s, _) = t.iteration_s(&one, 16, 8, 1024).unwrap();
        let step = 1.0 + 4.0 / 12.0;
        assert!((s - (step + step - 0.1)).abs() < 1e-9, "{s}");
    }

    #[test]
    fn an_unmeasured_placement_is_interpolated_between_gpu_and_node_counts() {
        let t = table();
        // 3 GPUs on one node: between (1, 2) and (1, 4).
        let (s, _, basis) = t.step(&Placement::new(vec![3]).unwrap(), 4.0).unwrap();
        assert_eq!(basis, Basis::Interpolated);
        assert!((s - 1.4).abs() < 1e-9, "{s}");
        // 8 GPUs over 3 nodes: no 3-node row; the nearest node count answers, clamped.
        let (s, _, basis) = t.step(&Placement::new(vec![4, 2, 2]).unwrap(), 4.0).unwrap();
        assert_eq!(basis, Basis::Extrapolated);
        assert!((s - 3.0).abs() < 1e-9, "{s}");
        // 64 GPUs: nothing near.
        assert_eq!(t.step(&Placement::new(vec![8; 8]).unwrap(), 4.0), None);
    }
}
