//! Fixtures the backends' tests share: a launch section and a run request.

use std::collections::BTreeMap;
use std::path::Path;

use rubick_core::launch::{Launch, LaunchContext};

use crate::contract::RunRequest;

/// A launch section running `sh -c SCRIPT job {micro_batch}` (shared by the
/// backends' tests).
pub(crate) fn launch(script: &str, timeout_s: f64) -> Launch {
    Launch {
        version: 1,
        command: vec!["sh".into(), "-c".into(), script.into(), "job".into(), "{micro_batch}".into()],
        env: BTreeMap::new(),
        workdir: None,
        checkpoint_dir: None,
        stop_signal: Default::default(),
        stop_timeout_s: 5.0,
        warmup_iterations: 1,
        measured_iterations: 3,
        timeout_s,
        supports: None,
    }
}

/// A run of job `$(touch pwned)` (a name that must stay inert) under
/// dp2-mb2-ga2 with its files in `dir`, no GPU indices (a scheduler may place them).
pub(crate) fn request<'a>(dir: &Path, launch: &'a Launch) -> RunRequest<'a> {
    let p = |n: &str| dir.join(n).display().to_string();
    RunRequest {
        launch,
        context: LaunchContext {
            job: "$(touch pwned)".into(),
            plan: "dp2-mb2-ga2".parse().unwrap(),
            nodes: 1,
            node_rank: 0,
            gpus_per_node: 1,
            cpus: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            deepspeed_config: p("ds.json"),
            checkpoint_dir: p("ckpt"),
            metrics: p("metrics.jsonl"),
            visible_devices: vec![],
        },
        log: dir.join("log.txt"),
        clear_env: true,
        stop_after_iterations: None,
        wrapper: None,
    }
}
