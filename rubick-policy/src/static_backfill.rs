//! `static-backfill`: the batch queue with backfilling: later jobs start when the head
//! does not fit (Slurm's backfill without reservations). The user's plan, GPUs and
//! cores; never reconfigured.

use rubick_core::Cluster;

use super::queue::QueuePolicy;
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str = "the batch queue with backfilling (Slurm's, without reservations)";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy::new(cluster, options))
}
