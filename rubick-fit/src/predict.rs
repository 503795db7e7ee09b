//! `rubick-fit predict`: iteration times, with their ~95 % intervals, of configurations
//! under a fitted `PerfModel`.

use std::path::Path;

use anyhow::{Context, bail};
use rubick_core::{Cluster, ModelSpec, Placement, Plan};
use rubick_io::cli::{Outcome, ensure_not_an_input, ensure_one_stdin};
use rubick_io::files::load_artifact;
use rubick_model::perf::PerfModel;
use rubick_model::perfmodel::{Links, Params, predict};

pub(crate) fn run(
    model_path: &Path,
    cluster_path: &Path,
    one: Option<(Plan, Placement)>,
    table: Option<&Path>,
    output: &Path,
) -> anyhow::Result<Outcome> {
    let inputs: Vec<&Path> = [Some(model_path), Some(cluster_path), table].into_iter().flatten().collect();
    ensure_one_stdin(&inputs)?;
    ensure_not_an_input(output, &inputs)?;
    let model: PerfModel = load_artifact(model_path)?;
    let cluster: Cluster = load_artifact(cluster_path)?;
    let spec: ModelSpec = model
        .model_spec
        .clone()
        .with_context(|| format!("{}: modelSpec: missing (needed to predict)", model_path.display()))?;
    let params = params_of(&model, model_path)?;
    let links = Links::of_cluster(&cluster);
    if model.log_covariance().is_none() {
        tracing::warn!(
            "{}: no diagnostics.logCovariance (fitted by an older rubick-fit): no intervals, low_s = high_s",
            model_path.display()
        );
    }
    // Where each configuration comes from, for messages: the table's line or the flags.
    let configs: Vec<(String, Plan, Placement)> = match (one, table) {
        (Some((plan, placement)), _) => vec![("--plan/--placement".to_owned(), plan, placement)],
        (None, Some(path)) => rubick_io::table::read_configurations(path)?
            .into_iter()
            .enumerate()
            .map(|(i, (plan, placement))| (format!("{}: line {}", path.display(), i + 2), plan, placement))
            .collect(),
        (None, None) => bail!("give --plan and --placement, or --table"),
    };
    let mut out = String::from("plan,placement,iter_time_s,low_s,high_s,samples_per_s\n");
    let mut bad = Vec::new();
    for (at, plan, placement) in &configs {
        let problem = plan
            .check(&spec, placement.gpus())
            .err()
            .map(|v| v.to_string())
            .or_else(|| cluster_cannot_hold(&cluster, placement));
        if let Some(why) = problem {
            bad.push(format!("{at}: plan `{plan}` on placement {placement}: {why}"));
            continue;
        }
        let (low, t, high) = model.predict_interval(&params, plan, placement, &links).unwrap_or_else(|| {
            let t = predict(&spec, plan, placement, &links, &params).total;
            (t, t, t)
        });
        out.push_str(&format!("{plan},{placement},{t:.6},{low:.6},{high:.6},{:.4}\n", spec.global_batch as f64 / t));
    }
    if configs.len() == bad.len() {
        bail!("{}", bad.join("\n"));
    }
    for b in &bad {
        tracing::error!("{b}; not predicted");
    }
    rubick_io::write_output(output, rubick_io::Format::Csv, out.as_bytes())?;
    // Some rows were predicted, some refused: the output is written, the exit says so.
    if bad.is_empty() {
        Ok(Outcome::Done)
    } else {
        bail!("{} of {} configurations refused (above)", bad.len(), configs.len())
    }
}

/// Why `cluster` cannot hold `placement` (no node group with enough nodes of enough
/// GPUs), or `None` when one can.
fn cluster_cannot_hold(cluster: &Cluster, placement: &Placement) -> Option<String> {
    let fits =
        cluster.node_groups.iter().any(|g| placement.max_per_node() <= g.gpus_per_node && placement.nodes() <= g.count);
    (!fits).then(|| {
        format!(
            "the cluster `{}` has no group of {} node(s) with {} GPUs each",
            cluster.name,
            placement.nodes(),
            placement.max_per_node()
        )
    })
}

/// The parameters of a PerfModel in the form's order; unknown names are errors.
pub fn params_of(model: &PerfModel, path: &Path) -> anyhow::Result<Params> {
    model.params().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
