//! `pollux`: Pollux's allocation (Qiao et al., OSDI 2021) as the Sia artifact's fork of
//! AdaptDL's policy decides it (`siasosp23/artifacts` at aaf7a0d:
//! `adaptdl/sched/adaptdl_sched/policy/pollux.py`, `Problem._evaluate`; p = -1, a 30 s
//! restart factor), not upstream `petuum/adaptdl`'s, without its batch-size tuning:
//! see [`super::goodput`] for what it follows, how the fork differs from upstream and
//! what it leaves out.

use rubick_core::Cluster;

use super::goodput::{GoodputPolicy, POLLUX};
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Pollux (OSDI 2021) without batch-size tuning: speedups, p = -1, 30 s restart factor, 2x growth, exact";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(GoodputPolicy::new(POLLUX, cluster, options))
}
