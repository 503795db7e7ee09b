//! `rubick-fit select`: which configurations a profile should run (the rule
//! `rubick-profile run --budget` uses, `rubick_model::select`).

use std::path::Path;

use anyhow::Context;
use rubick_core::{Cluster, Job};
use rubick_io::cli::{Outcome, ensure_not_an_input, ensure_one_stdin};
use rubick_io::files::load_artifact;
use rubick_model::MemoryEstimator;
use rubick_model::select::{Candidate, one_node_candidates, select};

use crate::SelectArgs;

pub(crate) fn run(args: &SelectArgs) -> anyhow::Result<Outcome> {
    anyhow::ensure!(args.budget >= 1, "--budget: expected at least 1 configuration, got 0");
    let inputs: Vec<&Path> =
        [Some(args.job.as_path()), Some(args.cluster.as_path()), args.from.as_deref()].into_iter().flatten().collect();
    ensure_one_stdin(&inputs)?;
    ensure_not_an_input(&args.output, &inputs)?;
    let job: Job = load_artifact(&args.job)?;
    let cluster: Cluster = load_artifact(&args.cluster)?;
    let candidates: Vec<Candidate> = match &args.from {
        Some(path) => {
            let configs = rubick_io::table::read_configurations(path)?;
            let mut kept = Vec::with_capacity(configs.len());
            for (i, (plan, placement)) in configs.into_iter().enumerate() {
                plan.check(&job.model, placement.gpus()).map_err(|v| {
                    anyhow::anyhow!("{}: line {}: plan `{plan}` on placement {placement}: {v}", path.display(), i + 2)
                })?;
                match job.refusal(&plan) {
                    Some(why) => tracing::warn!(
                        "{}: line {}: `{plan}` left out: it uses {why}, which the job's script does not implement",
                        path.display(),
                        i + 2
                    ),
                    None => kept.push(Candidate { plan, placement }),
                }
            }
            kept
        }
        None => {
            let group = cluster
                .node_groups
                .iter()
                .max_by_key(|g| g.gpus_per_node)
                .with_context(|| format!("{}: no node group", args.cluster.display()))?;
            one_node_candidates(&job, group, &MemoryEstimator::default())
        }
    };
    anyhow::ensure!(!candidates.is_empty(), "job `{}`: no configuration to choose from", job.name);
    let chosen = select(&candidates, args.budget);
    if chosen.len() < args.budget {
        tracing::warn!("--budget {}: only {} configurations to choose from; all chosen", args.budget, chosen.len());
    }
    let mut out = String::from("plan,placement\n");
    for i in chosen {
        out.push_str(&format!("{},{}\n", candidates[i].plan, candidates[i].placement));
    }
    rubick_io::write_output(&args.output, rubick_io::Format::Csv, out.as_bytes())?;
    Ok(Outcome::Done)
}
