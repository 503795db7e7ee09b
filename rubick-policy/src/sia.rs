//! `sia`: Sia's policy (Jayaram Subramanya et al., SOSP 2023), from its artifact
//! (`siasosp23/artifacts` at aaf7a0d: `sia-simulator/sia.py`, `SiaPolicy.optimize_mip`
//! and `SiaPolicy.__solve_mip_rescaled`, with `sia-simulator/simulator_config.py`'s
//! constants): see [`super::goodput`] for what it follows and what it leaves out.

use rubick_core::Cluster;

use super::goodput::{GoodputPolicy, SIA};
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Sia (SOSP 2023): goodput rows at the scale unit, p = -0.5, restart factor, 2x growth, exact";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(GoodputPolicy::new(SIA, cluster, options))
}
