//! The job contract, made ready for one run: the request (launch section, placeholder
//! values, log), its argv and environment resolved, its files written (the generated
//! DeepSpeed configuration, an empty metrics file, the checkpoint directory), and what
//! is read of them while it runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rubick_core::launch::{Launch, LaunchContext, deepspeed_config, environment};

use crate::error::{LaunchError, io};

/// A run's metric lines, in its directory.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// One run to make.
#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    pub launch: &'a Launch,
    /// The placeholders' values; its `metrics`, `deepspeed_config` and `checkpoint_dir`
    /// paths are where the run's files go.
    pub context: LaunchContext,
    /// The run's stdout and stderr.
    pub log: PathBuf,
    /// Start from an empty environment (keeping only `PATH`, `HOME`, `LANG`, `TMPDIR`
    /// and `USER`) rather than the launcher's, before the contract's variables.
    pub clear_env: bool,
    /// Stop the run (the contract's stop signal, then a kill after `stopTimeoutS`) once
    /// its metrics hold this many iterations, whether or not the script honours
    /// `RUBICK_ITERATIONS`: a profile needs no more. Read by [`run_to_end`](crate::executor::run_to_end).
    pub stop_after_iterations: Option<u32>,
    /// Run the launcher under the run wrapper ([`crate::wrap::command`]): whatever it leaves
    /// behind ends with it, marked or not.
    pub wrapper: Option<Vec<String>>,
}

/// Variables a run started from an empty environment keeps (`RunRequest::clear_env`).
pub(crate) const KEPT_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "TMPDIR", "USER"];

/// A TCP port nobody listens on now (the OS picks it): a run's `{master_port}`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(29500, |a| a.port())
}

/// A run made ready: its files written, its argv and environment resolved.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub argv: Vec<String>,
    /// The contract's variables (and the launch section's own).
    pub env: BTreeMap<String, String>,
    pub workdir: Option<PathBuf>,
}

/// The argv and environment of `launch` under `ctx` (no file touched).
pub fn resolve(ctx: &LaunchContext, launch: &Launch) -> Result<(Vec<String>, BTreeMap<String, String>), LaunchError> {
    let argv = ctx.argv(launch).map_err(LaunchError::Contract)?;
    if argv.is_empty() {
        return Err(LaunchError::Contract("command: empty".into()));
    }
    let env = environment(ctx, Some(launch)).map_err(LaunchError::Contract)?;
    Ok((argv, env))
}

/// Writes the run's DeepSpeed configuration and an empty metrics file, creates its
/// checkpoint directory, and resolves argv, environment and working directory.
pub fn prepare(request: &RunRequest<'_>) -> Result<Prepared, LaunchError> {
    let ctx = &request.context;
    let (argv, env) = resolve(ctx, request.launch)?;
    let ds = Path::new(&ctx.deepspeed_config);
    let text = serde_json::to_string_pretty(&deepspeed_config(&ctx.plan)).unwrap_or_default();
    std::fs::write(ds, text + "\n").map_err(io(ds))?;
    let metrics = Path::new(&ctx.metrics);
    std::fs::write(metrics, "").map_err(io(metrics))?;
    std::fs::create_dir_all(&ctx.checkpoint_dir).map_err(io(Path::new(&ctx.checkpoint_dir)))?;
    let workdir = match &request.launch.workdir {
        Some(dir) => Some(PathBuf::from(ctx.substitute(dir).map_err(LaunchError::Contract)?)),
        None => None,
    };
    Ok(Prepared { argv, env, workdir })
}

/// Appends a line to a run's log (a warning when it cannot).
pub fn append(path: &Path, line: &str) {
    use std::io::Write;
    let file = std::fs::OpenOptions::new().append(true).create(true).open(path);
    if let Err(e) = file.and_then(|mut f| writeln!(f, "{line}")) {
        tracing::warn!(path = %path.display(), error = %e, "cannot append to the log");
    }
}
