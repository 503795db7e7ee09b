//! `pollux`: Pollux's allocation (Qiao et al., OSDI 2021), from AdaptDL's policy
//! (`sched/adaptdl_sched/policy/pollux.py`), without its batch-size tuning: see
//! [`super::goodput`] for what it follows and what it leaves out.

use rubick_core::Cluster;

use super::goodput::{GoodputPolicy, POLLUX};
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "Pollux (OSDI 2021) without batch-size tuning: speedups, p = -1, 30 s restart factor, 2x growth, exact";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(GoodputPolicy::new(POLLUX, cluster, options))
}
