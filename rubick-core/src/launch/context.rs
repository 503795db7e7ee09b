//! What one run gets: the values of its placeholders ([`LaunchContext`]), its
//! `RUBICK_*` environment ([`environment`]) and its DeepSpeed configuration
//! ([`deepspeed_config`]).

use std::collections::BTreeMap;

use super::{Launch, expand, offload_name};
use crate::plan::{Offload, Plan};

/// Where and how one run of a job is launched: the values of the placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchContext {
    pub job: String,
    pub plan: Plan,
    pub nodes: u32,
    /// This node's rank among `nodes` (0 on one node; one launcher per node, each
    /// with its own, on several).
    pub node_rank: u32,
    /// The most GPUs the run has on one node: its worker processes per node (one per
    /// GPU; on a CPU node the plan's "GPUs" are its worker processes).
    pub gpus_per_node: u32,
    /// The run's CPU cores, every node's together (`{cpus}`, `RUBICK_CPUS`); 0: not said.
    pub cpus: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub deepspeed_config: String,
    pub checkpoint_dir: String,
    pub metrics: String,
    /// GPU indices on this node (`CUDA_VISIBLE_DEVICES`); empty on CPU or where the
    /// backend places GPUs itself (the variable is then not set).
    pub visible_devices: Vec<u32>,
}

impl LaunchContext {
    /// The cores of one worker process, what its intra-op threads should be
    /// (`OMP_NUM_THREADS`, `torch.set_num_threads`): the run's cores per node (`cpus`
    /// over `nodes`) over the processes of a node (`gpus_per_node`), at least 1; 0 when
    /// the run's cores are not said. `{cpus}` is the run's cores in all: given to every
    /// worker as its threads, each of dp2's two workers on 2 cores ran 2 threads (issue
    /// 42: 2.9x slower than predicted). `{cpus_per_process}`, `RUBICK_CPUS_PER_PROCESS`.
    pub fn cpus_per_process(&self) -> u32 {
        if self.cpus == 0 {
            return 0;
        }
        let processes = u64::from(self.nodes.max(1)) * u64::from(self.gpus_per_node.max(1));
        u32::try_from(u64::from(self.cpus) / processes).unwrap_or(u32::MAX).max(1)
    }

    /// The value of a placeholder, if it is one.
    pub fn value(&self, name: &str) -> Option<String> {
        let p = &self.plan;
        Some(match name {
            "dp" => p.dp.to_string(),
            "tp" => p.tp.to_string(),
            "pp" => p.pp.to_string(),
            "zero" => p.zero.level().to_string(),
            "offload" => offload_name(p.offload).to_owned(),
            "ga" => p.ga.to_string(),
            "gc" => u8::from(p.checkpointing()).to_string(),
            "recompute" => p.recompute.as_str().to_owned(),
            "sp" => u8::from(p.sp).to_string(),
            "vp" => p.vp.to_string(),
            "micro_batch" => p.micro_batch.to_string(),
            "gpus" => p.gpus().to_string(),
            "nodes" => self.nodes.to_string(),
            "node_rank" => self.node_rank.to_string(),
            "gpus_per_node" => self.gpus_per_node.to_string(),
            "cpus" => self.cpus.to_string(),
            "cpus_per_process" => self.cpus_per_process().to_string(),
            "master_addr" => self.master_addr.clone(),
            "master_port" => self.master_port.to_string(),
            "deepspeed_config" => self.deepspeed_config.clone(),
            "checkpoint_dir" => self.checkpoint_dir.clone(),
            "metrics" => self.metrics.clone(),
            _ => return None,
        })
    }

    /// `text` with its placeholders replaced (inside the element: no shell, no word
    /// splitting); an unknown one is an error naming it.
    pub fn substitute(&self, text: &str) -> Result<String, String> {
        expand(text, |name| self.value(name).ok_or_else(|| format!("unknown placeholder `{{{name}}}`")))
    }

    /// The argv of `launch` for this run.
    pub fn argv(&self, launch: &Launch) -> Result<Vec<String>, String> {
        launch.command.iter().map(|a| self.substitute(a)).collect()
    }
}

/// The environment every job gets: `RUBICK_JOB`, `RUBICK_PLAN` (readable form), one
/// variable per plan field, `RUBICK_GPUS`, `RUBICK_NODES`, `RUBICK_NODE_RANK`, `RUBICK_CPUS`,
/// `RUBICK_CPUS_PER_PROCESS` ([`LaunchContext::cpus_per_process`]), `RUBICK_METRICS`, `RUBICK_CHECKPOINT_DIR`, `RUBICK_DEEPSPEED_CONFIG`,
/// `CUDA_VISIBLE_DEVICES` (when the context names devices), `RUBICK_STOP_SIGNAL` and
/// `RUBICK_STOP_TIMEOUT_S` (with a launch section); then the launch section's own `env` (substituted).
pub fn environment(ctx: &LaunchContext, launch: Option<&Launch>) -> Result<BTreeMap<String, String>, String> {
    let p = &ctx.plan;
    let mut env: BTreeMap<String, String> = [
        ("RUBICK_JOB", ctx.job.clone()),
        ("RUBICK_PLAN", p.to_string()),
        ("RUBICK_GPUS", p.gpus().to_string()),
        ("RUBICK_NODES", ctx.nodes.to_string()),
        ("RUBICK_NODE_RANK", ctx.node_rank.to_string()),
        ("RUBICK_CPUS", ctx.cpus.to_string()),
        ("RUBICK_CPUS_PER_PROCESS", ctx.cpus_per_process().to_string()),
        ("RUBICK_METRICS", ctx.metrics.clone()),
        ("RUBICK_CHECKPOINT_DIR", ctx.checkpoint_dir.clone()),
        ("RUBICK_DEEPSPEED_CONFIG", ctx.deepspeed_config.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    // A scheduler that places GPUs itself (Slurm) sets it; so does a CPU run's absence of one.
    if !ctx.visible_devices.is_empty() {
        let devices: Vec<String> = ctx.visible_devices.iter().map(ToString::to_string).collect();
        env.insert("CUDA_VISIBLE_DEVICES".to_owned(), devices.join(","));
    }
    for (var, field) in [
        ("RUBICK_DP", "dp"),
        ("RUBICK_TP", "tp"),
        ("RUBICK_PP", "pp"),
        ("RUBICK_ZERO", "zero"),
        ("RUBICK_OFFLOAD", "offload"),
        ("RUBICK_GA", "ga"),
        ("RUBICK_GC", "gc"),
        ("RUBICK_RECOMPUTE", "recompute"),
        ("RUBICK_SP", "sp"),
        ("RUBICK_VP", "vp"),
        ("RUBICK_MICRO_BATCH", "micro_batch"),
    ] {
        env.insert(var.to_owned(), ctx.value(field).unwrap_or_default());
    }
    if let Some(l) = launch {
        env.insert("RUBICK_STOP_SIGNAL".to_owned(), l.stop_signal.name().to_owned());
        // How long the run has to checkpoint and exit (`python -m rubick.torchrun` gives
        // torchrun's shutdown as long).
        env.insert("RUBICK_STOP_TIMEOUT_S".to_owned(), format!("{}", l.stop_timeout_s));
    }
    for (k, v) in launch.map(|l| &l.env).into_iter().flatten() {
        env.insert(k.clone(), ctx.substitute(v)?);
    }
    Ok(env)
}

/// The DeepSpeed configuration of a plan: batch sizes, ZeRO stage, optimizer (and
/// parameter) offload to the CPU, bf16.
pub fn deepspeed_config(plan: &Plan) -> serde_json::Value {
    let mut zero = serde_json::json!({ "stage": plan.zero.level() });
    if plan.offload != Offload::None {
        zero["offload_optimizer"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    if plan.offload == Offload::OptimizerAndParams {
        zero["offload_param"] = serde_json::json!({ "device": "cpu", "pin_memory": true });
    }
    serde_json::json!({
        "train_batch_size": plan.global_batch(),
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.ga,
        "zero_optimization": zero,
        "bf16": { "enabled": true },
        "activation_checkpointing": { "partition_activations": false, "contiguous_memory_optimization": false },
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::tests::launch;

    fn ctx() -> LaunchContext {
        LaunchContext {
            job: "$(touch x)".into(),
            plan: "dp2-tp2-pp1-mb2-ga4-z1".parse().unwrap(),
            nodes: 1,
            node_rank: 0,
            gpus_per_node: 4,
            cpus: 16,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            deepspeed_config: "/s/ds.json".into(),
            checkpoint_dir: "/s/ckpt dir".into(),
            metrics: "/s/metrics.jsonl".into(),
            visible_devices: vec![2, 3, 4, 5],
        }
    }

    #[test]
    fn placeholders_are_substituted_inside_elements_and_never_shell_parsed() {
        let l = launch(&[
            "torchrun",
            "--nproc-per-node={gpus_per_node}",
            "train.py",
            "--ckpt",
            "{checkpoint_dir}",
            "{{literal}}",
        ]);
        l.check().unwrap();
        let argv = ctx().argv(&l).unwrap();
        assert_eq!(argv, ["torchrun", "--nproc-per-node=4", "train.py", "--ckpt", "/s/ckpt dir", "{literal}"]);
        let env = environment(&ctx(), Some(&l)).unwrap();
        assert_eq!(env["RUBICK_JOB"], "$(touch x)");
        assert_eq!(env["RUBICK_PLAN"], "dp2-tp2-pp1-mb2-ga4-z1");
        assert_eq!(env["RUBICK_ZERO"], "1");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "2,3,4,5");
    }

    #[test]
    fn threads_per_process_divide_a_nodes_cores_among_its_workers() {
        // issue 42: `OMP_NUM_THREADS: "{cpus}"` gave each of dp2's two workers on 2 cores
        // 2 threads. A dp2 plan on 2 cores: 1 thread per worker.
        let mut l = launch(&["torchrun", "--nproc-per-node={gpus_per_node}", "train.py", "-j{cpus_per_process}"]);
        l.env.insert("OMP_NUM_THREADS".into(), "{cpus_per_process}".into());
        l.check().unwrap();
        let dp2 = LaunchContext { plan: "dp2-mb8-ga1".parse().unwrap(), gpus_per_node: 2, cpus: 2, ..ctx() };
        let env = environment(&dp2, Some(&l)).unwrap();
        let threads = |env: &BTreeMap<String, String>| {
            [&env["RUBICK_CPUS"], &env["RUBICK_CPUS_PER_PROCESS"], &env["OMP_NUM_THREADS"]].map(|v| v.to_owned())
        };
        assert_eq!(threads(&env), ["2", "1", "1"]);
        assert_eq!(dp2.argv(&l).unwrap(), ["torchrun", "--nproc-per-node=2", "train.py", "-j1"]);
        // Per node: 2 nodes of 4 GPUs, 64 cores in all, 8 per worker; 16 cores on 4: 4.
        let wide = LaunchContext { plan: "dp8-mb1-ga1".parse().unwrap(), nodes: 2, cpus: 64, ..ctx() };
        assert_eq!(threads(&environment(&wide, Some(&l)).unwrap()), ["64", "8", "8"]);
        assert_eq!(ctx().value("cpus_per_process").as_deref(), Some("4"));
        // Fewer cores than workers: 1 each, never 0; no cores said: 0 (not said).
        assert_eq!(LaunchContext { cpus: 3, ..ctx() }.cpus_per_process(), 1);
        assert_eq!(LaunchContext { cpus: 0, ..ctx() }.cpus_per_process(), 0);
        assert_eq!(LaunchContext { cpus: 9, gpus_per_node: 0, ..ctx() }.cpus_per_process(), 9);
    }

    #[test]
    fn the_deepspeed_config_follows_the_plan() {
        let c = deepspeed_config(&"dp4-mb2-ga2-z2-offopt".parse().unwrap());
        assert_eq!(c["train_batch_size"], 16);
        assert_eq!(c["gradient_accumulation_steps"], 2);
        assert_eq!(c["zero_optimization"]["stage"], 2);
        assert_eq!(c["zero_optimization"]["offload_optimizer"]["device"], "cpu");
        assert!(c["zero_optimization"].get("offload_param").is_none());
    }
}
