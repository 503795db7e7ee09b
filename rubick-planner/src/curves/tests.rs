use super::*;
use crate::synth;

/// The elastic baseline's cores: with `fair_cores_only`, every configuration the
/// planner builds gives a job the node's fair share of cores per GPU; without it, the
/// planner uses cores as a decision (fewer for jobs that do not need them, more for
/// CPU offload).
#[test]
fn fair_cores_only_gives_every_configuration_the_fair_share() {
    let (cluster, inputs, config) = synth::varied(7, 4, 8, 96, 1600.0, 12);
    let fair = cluster.node_groups[0].fair_cpus_per_gpu();
    let built = |config: &PlannerConfig| {
        let book = build(&cluster, config, &inputs);
        book.jobs
            .iter()
            .flat_map(|j| j.candidates.iter().filter(|c| !c.is_request && !c.is_current))
            .map(|c| (c.gpus, c.cpus))
            .collect::<Vec<_>>()
    };
    let free = built(&config);
    assert!(free.iter().any(|&(g, c)| c != fair * g), "cores are a decision by default");
    let fixed = built(&PlannerConfig { fair_cores_only: true, ..config.clone() });
    assert!(!fixed.is_empty());
    for (g, c) in fixed {
        assert_eq!(c, fair * g, "{g} GPUs got {c} cores, not the fair {fair} per GPU");
    }
}
