use rubick_core::Cluster;
use rubick_core::schedule::Change;

use super::*;
use crate::curves;
use crate::synth;

/// Jobs the decision paused (or moved where placement found no room) were paused even
/// when nobody took their resources, and resumed, restarted, a round later: the
/// simulator's pause/resume thrash.
#[test]
fn a_running_job_whose_freed_resources_go_unused_keeps_running() {
    let mut kept = 0;
    for seed in 0..40 {
        let (cluster, inputs, config) = synth::varied(seed, 2, 8, 96, 1600.0, 6);
        let book = curves::build(&cluster, &config, &inputs);
        let mut evaluator = Evaluator::new(&cluster, &config);
        let nobody = vec![None; inputs.len()];
        let (placed, _) = place(&mut evaluator, &book, &inputs, &nobody, Repack::None);
        for (input, p) in inputs.iter().zip(&placed) {
            match (&input.current, p) {
                (Some(cur), Some(p)) if !cur.nodes.is_empty() => {
                    let nodes: Vec<(u32, Vec<u32>)> =
                        p.shares.iter().map(|s| (cluster_node_index(&cluster, s.node), s.gpus.clone())).collect();
                    assert_eq!(cur.change_to(p.group, &p.plan, &p.placement, &nodes, p.cpus), Change::Kept);
                    kept += 1;
                }
                (Some(cur), None) => assert!(cur.nodes.is_empty(), "{}: paused for nothing", input.job.name),
                (None, Some(_)) => panic!("{}: started without a decision", input.job.name),
                _ => {}
            }
        }
    }
    assert!(kept > 0, "the instances have running jobs");
}

/// The index within its group of the cluster's `node`-th node (see `nodes_of`).
fn cluster_node_index(cluster: &Cluster, node: usize) -> u32 {
    nodes_of(cluster)[node].index
}
