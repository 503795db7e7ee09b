//! Supervising one run: start it in its own process group, wait, read its metric
//! lines, kill the whole group when it overruns.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rubick_core::launch::{Launch, LaunchContext, MetricLine, deepspeed_config, environment};

/// Why a run could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("launch: {0}")]
    Contract(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot start `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// A scheduler command failed or its job could not be followed.
    #[error("slurm: {0}")]
    Slurm(String),
    /// Another backend's failure, its message prefixed with the backend.
    #[error("{0}")]
    Backend(String),
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError + '_ {
    move |source| LaunchError::Io { path: path.to_path_buf(), source }
}

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
    /// `RUBICK_ITERATIONS`: a profile needs no more. Only [`run`] (local) does this.
    pub stop_after_iterations: Option<u32>,
    /// Run the launcher under the run wrapper (`wrap::command()`): whatever it leaves
    /// behind ends with it, marked or not. Only [`run`] (local) reads it.
    pub wrapper: Option<Vec<String>>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Exited 0.
    Ok,
    /// Out of GPU (or host) memory: the configuration is infeasible, not a crash.
    Oom,
    /// Exited 2, the contract's "bad plan": the script cannot run this configuration.
    Unsupported,
    /// Exited otherwise.
    Failed,
    /// Overran `timeoutS`: its process group was killed.
    Timeout,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Oom => "oom",
            RunStatus::Unsupported => "unsupported",
            RunStatus::Failed => "failed",
            RunStatus::Timeout => "timeout",
        }
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    /// Metric lines in order (iterations and events).
    pub metrics: Vec<MetricLine>,
    /// Lines of the metrics file (and stdout) that were not the protocol.
    pub ignored_lines: usize,
    pub wall: Duration,
}

/// A TCP port nobody listens on now (the OS picks it): a run's `{master_port}`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(29500, |a| a.port())
}

/// A signal for a run's processes: the contract's stop signal, `TERM` (end now), or
/// `KILL`. Typed: sent with `kill(2)` through rustix, never by a `kill` subprocess.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSignal {
    Stop(rubick_core::launch::StopSignal),
    Term,
    Kill,
}

impl RunSignal {
    /// Its name without `SIG` (as `scancel --signal` takes it), e.g. `USR1`.
    pub fn name(self) -> &'static str {
        match self {
            RunSignal::Stop(s) => s.name().trim_start_matches("SIG"),
            RunSignal::Term => "TERM",
            RunSignal::Kill => "KILL",
        }
    }

    fn raw(self) -> rustix::process::Signal {
        use rubick_core::launch::StopSignal;
        use rustix::process::Signal;
        match self {
            RunSignal::Stop(StopSignal::Usr1) => Signal::USR1,
            RunSignal::Stop(StopSignal::Usr2) => Signal::USR2,
            RunSignal::Stop(StopSignal::Term) | RunSignal::Term => Signal::TERM,
            RunSignal::Stop(StopSignal::Int) => Signal::INT,
            RunSignal::Kill => Signal::KILL,
        }
    }
}

pub(crate) fn pid_of(pid: u32) -> Option<rustix::process::Pid> {
    i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw)
}

/// Signals a whole process group.
pub fn signal_group(pgid: u32, signal: RunSignal) {
    if let Some(pgid) = pid_of(pgid) {
        let _ = rustix::process::kill_process_group(pgid, signal.raw());
    }
}

/// Every live process of a run, found by the run's own `RUBICK_METRICS=PATH` in its
/// environment (every process a run starts inherits it): also those that started their
/// own session (torchrun's, DeepSpeed's and Accelerate's workers, a `setsid` grandchild),
/// which its process group does not hold. A scan of /proc (this user's processes).
pub fn marked_processes(metrics: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && carries_mark(pid, metrics))
        .collect()
}

/// Every live process (but this one) whose run mark (`RUBICK_METRICS=PATH`, see
/// [`marked_processes`]) lies under `prefix`, with its mark: the runs of a state
/// directory, recorded or not. A scan of /proc.
pub fn marked_under(prefix: &str) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let me = std::process::id();
    let key = format!("RUBICK_METRICS={prefix}");
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && proc_stat(pid).is_some_and(|s| !s.zombie))
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let mark = env.split(|b| *b == 0).find(|v| v.starts_with(key.as_bytes()))?;
            let mark = std::str::from_utf8(mark).ok()?.strip_prefix("RUBICK_METRICS=")?.to_owned();
            Some((pid, mark))
        })
        .collect()
}

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// A zombie (exited, not yet reaped): no longer a live process of anything.
    pub zombie: bool,
    pub ppid: u32,
    pub pgrp: u32,
}

/// `/proc/PID/stat` of a process, if it exists (`pid (comm) state ppid pgrp ...`: the
/// command name may hold spaces and parentheses, so fields count from its last `)`).
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let zombie = fields.next()? == "Z";
    Some(ProcStat { zombie, ppid: fields.next()?.parse().ok()?, pgrp: fields.next()?.parse().ok()? })
}

/// Whether process `pid` lives (not a zombie) and carries the mark of the run whose
/// metrics file is `metrics` (see [`marked_processes`]): one process, no scan.
pub fn carries_mark(pid: u32, metrics: &str) -> bool {
    let live = proc_stat(pid).is_some_and(|s| !s.zombie);
    let marker = format!("RUBICK_METRICS={metrics}");
    live && std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
}

/// Signals every process of a run: its process group and [`marked_processes`].
///
/// A `KILL` also reaches their descendants, first: what the run wrapper (a child
/// subreaper, marked) holds that carries no mark (a helper started with `env -i` in a
/// session of its own) would otherwise be re-parented to init once the wrapper dies,
/// and outlive the run.
pub fn signal_run(pgid: Option<u32>, metrics: &str, signal: RunSignal) {
    let marked = marked_processes(metrics);
    if matches!(signal, RunSignal::Kill) {
        // Of the marked processes only: a group id may have been reused.
        for pid in crate::wrap::descendants_of(&marked).into_iter().filter_map(pid_of) {
            let _ = rustix::process::kill_process(pid, signal.raw());
        }
    }
    if let Some(pgid) = pgid {
        signal_group(pgid, signal);
    }
    for pid in marked.into_iter().filter_map(pid_of) {
        let _ = rustix::process::kill_process(pid, signal.raw());
    }
}

/// Messages by which frameworks report running out of memory.
const OOM_MARKERS: [&str; 5] =
    ["CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "std::bad_alloc", "Cannot allocate memory"];

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

/// A watchdog that runs a cleanup when the launcher dies, however it dies (`kill -9`
/// included): it waits for the end of a pipe only the launcher holds. Dropping it
/// without [`Guard::disarm`] fires the cleanup too. Started in a process group of its
/// own, so a Ctrl-C meant for the launcher does not take it down before it has cleaned up.
#[derive(Debug)]
pub struct Guard {
    child: std::process::Child,
}

impl Guard {
    /// Runs `cleanup` (e.g. `scancel JOB`) when the launcher dies: the run wrapper's
    /// `--watchdog` mode when a `wrapper` command is given ([`crate::wrap`], Rust), else
    /// (a library caller that has none) a `sh` reading its stdin.
    pub fn command(wrapper: Option<&[String]>, cleanup: &[&str]) -> std::io::Result<Guard> {
        let mut command = match wrapper {
            Some([program, rest @ ..]) => {
                let mut c = Command::new(program);
                c.args(rest).args([crate::wrap::WATCHDOG, "--"]);
                c
            }
            _ => {
                let mut c = Command::new("sh");
                c.args(["-c", r#"cat >/dev/null; exec "$@" >/dev/null 2>&1"#, "rubick-guard"]);
                c
            }
        };
        Guard::spawn(command.args(cleanup))
    }

    /// Kills a run without a wrapper (which would watch it itself) when the launcher
    /// dies: its process group `pgid` and every process marked with its `metrics` path
    /// (see [`marked_processes`]); a `sh`.
    pub fn run(pgid: u32, metrics: &str) -> std::io::Result<Guard> {
        const CLEANUP: &str = r#"kill -s KILL -- "-$1"
for f in /proc/[0-9]*/environ; do
  if tr '\000' '\n' < "$f" 2>/dev/null | grep -qxF "RUBICK_METRICS=$2"; then
    p=${f#/proc/}; kill -s KILL "${p%/environ}"
  fi
done"#;
        Guard::command(None, &["sh", "-c", CLEANUP, "rubick-cleanup", &pgid.to_string(), metrics])
    }

    fn spawn(command: &mut Command) -> std::io::Result<Guard> {
        let child =
            command.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0).spawn()?;
        Ok(Guard { child })
    }

    /// The guarded work ended normally: stop the watchdog without its cleanup.
    pub fn disarm(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Iteration lines a metrics file holds so far (the whole file read).
pub fn iterations_in(metrics: &Path) -> usize {
    let Ok(file) = std::fs::File::open(metrics) else { return 0 };
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter(|l| matches!(MetricLine::parse(l), Some(MetricLine::Iteration { .. })))
        .count()
}

/// Variables a run started from an empty environment keeps (`RunRequest::clear_env`).
pub(crate) const KEPT_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "TMPDIR", "USER"];

/// Runs the request on this machine to its end (or its timeout) and reports what it did:
/// [`run_to_end`](crate::executor::run_to_end) over [`Local`](crate::executor::Local),
/// the run's directory the one of its metrics file (which must be `metrics.jsonl`).
pub fn run(request: &RunRequest<'_>) -> Result<RunOutcome, LaunchError> {
    let dir = Path::new(&request.context.metrics).parent().unwrap_or(Path::new(".")).to_path_buf();
    let run = crate::executor::Submission {
        request: request.clone(),
        dir,
        nodes: Vec::new(),
        cores: Vec::new(),
        name: None,
        detached: false,
        partition: None,
    };
    crate::executor::run_to_end(&crate::executor::Local::new(), &run)
}

/// What a finished run did, from its metrics file and its log: the metric lines (the
/// file's, then any the run printed), how many lines of the file were not the
/// protocol, and its status (a timeout first, then out of memory, then the exit code).
pub fn collect(metrics: &Path, log: &Path, timed_out: bool, exit_code: Option<i32>, wall: Duration) -> RunOutcome {
    let (mut lines, mut ignored) = (Vec::new(), 0);
    for path in [metrics, log] {
        let Ok(file) = std::fs::File::open(path) else { continue };
        for line in BufReader::new(file).lines().map_while(Result::ok) {
            match MetricLine::parse(&line) {
                Some(m) => lines.push(m),
                None if path == metrics => ignored += 1,
                None => {}
            }
        }
    }
    let oom_event = lines.iter().any(|m| matches!(m, MetricLine::Event { event, .. } if event == "oom"));
    let status = classify(timed_out, exit_code, oom_event, log);
    RunOutcome { status, exit_code, metrics: lines, ignored_lines: ignored, wall }
}

/// How a run ended — the one rule, for `rubick-profile` and `rubick-run` alike: over
/// its time limit; out of memory (the contract's `oom` event, exit 3, or a framework's
/// out-of-memory message in its log); exit 0; exit 2 (the contract's bad plan); any
/// other end.
pub fn classify(timed_out: bool, exit_code: Option<i32>, oom_event: bool, log: &Path) -> RunStatus {
    if timed_out {
        return RunStatus::Timeout;
    }
    if oom_event || exit_code == Some(3) || log_says_oom(log) {
        return RunStatus::Oom;
    }
    match exit_code {
        Some(0) => RunStatus::Ok,
        Some(2) => RunStatus::Unsupported,
        _ => RunStatus::Failed,
    }
}

/// Whether a run's log holds a framework's out-of-memory message (its last 1 MiB: a
/// long log is not read whole).
pub fn log_says_oom(log: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(log) else { return false };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
    let mut tail = Vec::new();
    let _ = file.read_to_end(&mut tail);
    let text = String::from_utf8_lossy(&tail);
    OOM_MARKERS.iter().any(|m| text.contains(m))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    #[test]
    fn a_run_reports_its_metric_lines_and_is_inert_to_its_name() {
        let dir = tempfile::tempdir().unwrap();
        // Braces of the script itself are doubled: single ones are placeholders.
        let script = r#"test "$1" = 2 || exit 3
for i in 1 2 3 4; do echo "{{\"rubick\":1,\"iter\":$i,\"iter_time_s\":0.$i}}" >> "$RUBICK_METRICS"; done
echo "not a metric" >> "$RUBICK_METRICS"; echo "job $RUBICK_JOB plan $RUBICK_PLAN""#;
        let l = launch(script, 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!(out.status, RunStatus::Ok, "{}", std::fs::read_to_string(dir.path().join("log.txt")).unwrap());
        assert_eq!(out.metrics.len(), 4);
        assert_eq!(out.ignored_lines, 1);
        let times =
            rubick_core::launch::iteration_times(rubick_core::launch::measured_iterations(&out.metrics, 1, Some(3)));
        assert_eq!(times, [0.2, 0.3, 0.4]);
        assert!(!dir.path().join("pwned").exists() && !Path::new("pwned").exists());
        let log = std::fs::read_to_string(dir.path().join("log.txt")).unwrap();
        assert!(log.contains("job $(touch pwned) plan dp2-tp1-pp1-mb2-ga2"), "{log}");
        let ds: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("ds.json")).unwrap()).unwrap();
        assert_eq!(ds["train_batch_size"], 8);
    }

    #[test]
    fn a_hanging_run_is_killed_with_its_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        // A worker in the background that would outlive its launcher.
        let pidfile = dir.path().join("worker.pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let l = launch(&script, 1.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!(out.status, RunStatus::Timeout);
        assert!(out.wall < Duration::from_secs(10));
        let pid = std::fs::read_to_string(&pidfile).unwrap().trim().to_owned();
        std::thread::sleep(Duration::from_millis(100));
        // Gone, or a zombie waiting for init to reap it: not running either way.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z");
        assert!(!running, "worker {pid} survived its run: {state}");
    }

    #[test]
    fn out_of_memory_is_an_infeasible_configuration_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let l = launch("echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; exit 1", 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch(r#"echo '{{"rubick":1,"event":"oom"}}' >> "$RUBICK_METRICS"; exit 0"#, 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch("exit 7", 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!((out.status, out.exit_code), (RunStatus::Failed, Some(7)));
        // Issue 19: exit 3 is the contract's out of memory, for every tool alike.
        let l = launch("exit 3", 30.0);
        assert_eq!(run(&request(dir.path(), &l)).unwrap().status, RunStatus::Oom);
        let l = launch("echo 'zero 2 is not implemented' >&2; exit 2", 30.0);
        let out = run(&request(dir.path(), &l)).unwrap();
        assert_eq!((out.status, out.exit_code), (RunStatus::Unsupported, Some(2)), "exit 2: the plan is refused");
    }
}
