//! `static`: a plain batch queue. Strict FIFO (or the `--queue` order), the user's plan
//! on the user's GPUs with the cores it asked for, never reconfigured; when the head of
//! the queue does not fit, nothing behind it starts.

use rubick_core::Cluster;

use super::queue::QueuePolicy;
use super::{Policy, PolicyOptions};

pub(super) const SUMMARY: &str =
    "a plain batch queue: the user's plan and GPUs, strict queue order, never reconfigured";

pub(super) fn build<'a>(cluster: &'a Cluster, options: &PolicyOptions) -> Box<dyn Policy + 'a> {
    Box::new(QueuePolicy { backfill: false, ..QueuePolicy::new(cluster, options) })
}
