//! The Slurm commands this backend runs (`scontrol`, `sacct`, `sinfo`, `squeue`,
//! `scancel`) and what their output says, parsed: a job's state and exit status, the
//! nodes and their GPUs, the id `sbatch` gave.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::batch::sanitise_name;
use super::state::JobState;
use crate::error::LaunchError;

/// How long [`available`] waits for `scontrol ping`.
const PING_LIMIT: Duration = Duration::from_secs(10);

/// `Ok` when this machine can submit jobs: `sbatch`, `squeue` and `scontrol` are on
/// the `PATH` and the controller answers `scontrol ping`; else why not.
pub fn available() -> Result<(), String> {
    for program in ["sbatch", "squeue", "scontrol"] {
        if find_program(program).is_none() {
            return Err(format!("`{program}` is not on the PATH (no Slurm client here)"));
        }
    }
    // Bounded: with a missing or broken configuration scontrol retries for a minute.
    let mut child = Command::new("scontrol")
        .arg("ping")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `scontrol ping`: {e}"))?;
    let start = Instant::now();
    while child.try_wait().map_err(|e| format!("`scontrol ping`: {e}"))?.is_none() {
        if start.elapsed() >= PING_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("`scontrol ping` did not answer within {} s", PING_LIMIT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| format!("`scontrol ping`: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains("is UP") {
        Ok(())
    } else {
        let said = format!("{} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim());
        Err(format!("the Slurm controller does not answer `scontrol ping`: {}", said.trim()))
    }
}

/// The first file `name` in a directory of `PATH`.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

/// One node as `sinfo` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    /// Its partitions (`*`: the default one's mark dropped).
    pub partitions: Vec<String>,
    /// Whether it is in the cluster's default partition.
    pub in_default: bool,
    pub cpus: u32,
    pub memory_mb: u64,
    /// GPUs from its generic resources (`gpu:4`, `gpu:a100:4(S:0-1)`).
    pub gpus: u32,
    /// The GPUs' type when the gres names one (`gpu:a100:4`).
    pub gpu_type: Option<String>,
    /// Slurm's state, e.g. `idle`, `mixed`, `drained`, `down*`.
    pub state: String,
}

impl NodeInfo {
    /// Whether new jobs may start on it: responding (no `*`), neither drained nor
    /// draining, down, failing or in maintenance (a powered-down node, `~`, is started
    /// on demand).
    pub fn usable(&self) -> bool {
        if self.state.ends_with('*') {
            return false;
        }
        let base = self.state.trim_end_matches(['~', '#', '!', '%', '$', '@', '^', '-']);
        matches!(base, "idle" | "mixed" | "allocated" | "completing" | "planned")
    }
}

/// Every node Slurm knows, once each (`sinfo -N`: a node of several partitions lists
/// them all), in Slurm's order.
pub fn nodes() -> Result<Vec<NodeInfo>, LaunchError> {
    let mut sinfo = Command::new("sinfo");
    sinfo.args(["-N", "-h", "-o", "%N|%P|%c|%m|%G|%T"]).stdin(Stdio::null());
    Ok(parse_sinfo(&output(&mut sinfo, "sinfo")?))
}

/// `sinfo -N -h -o '%N|%P|%c|%m|%G|%T'`'s lines as nodes (lines it cannot read are
/// skipped).
pub(crate) fn parse_sinfo(text: &str) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [name, partition, cpus, memory, gres, state] = f[..] else { continue };
        let (partition, default) = match partition.strip_suffix('*') {
            Some(p) => (p, true),
            None => (partition, false),
        };
        if let Some(&k) = seen.get(name) {
            nodes[k].partitions.push(partition.to_owned());
            nodes[k].in_default |= default;
            continue;
        }
        seen.insert(name.to_owned(), nodes.len());
        let (gpus, gpu_type) = gpus_of(gres);
        nodes.push(NodeInfo {
            name: name.to_owned(),
            partitions: vec![partition.to_owned()],
            in_default: default,
            cpus: cpus.trim_end_matches('+').parse().unwrap_or(0),
            memory_mb: memory.trim_end_matches('+').parse().unwrap_or(0),
            gpus,
            gpu_type,
            state: state.to_owned(),
        });
    }
    nodes
}

/// The GPUs of a gres list (`gpu:2`, `gpu:a100:4(S:0-1),mps:100`, `(null)`): count and
/// type (the first typed entry's).
fn gpus_of(gres: &str) -> (u32, Option<String>) {
    let mut count = 0;
    let mut kind = None;
    for entry in gres.split(',') {
        let entry = entry.split('(').next().unwrap_or_default();
        let parts: Vec<&str> = entry.split(':').collect();
        match parts[..] {
            ["gpu", n] => count += n.parse::<u32>().unwrap_or(0),
            ["gpu", t, n] => {
                count += n.parse::<u32>().unwrap_or(0);
                kind.get_or_insert_with(|| t.to_owned());
            }
            _ => {}
        }
    }
    (count, kind)
}

/// The cluster's name (`ClusterName` of `scontrol show config`), if it has one.
pub fn cluster_name() -> Option<String> {
    let out = Command::new("scontrol").args(["show", "config"]).stdin(Stdio::null()).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "ClusterName").then(|| v.trim().to_owned()).filter(|v| !v.is_empty() && v != "(null)")
    })
}

/// Sends `signal` (e.g. `USR1`, `TERM`) to every process of the job.
pub fn signal(job: &str, signal: &str) -> Result<(), LaunchError> {
    scancel(job, &[&format!("--signal={signal}"), "--full"]).map(|_| ())
}

/// Cancels the job (Slurm kills what is left after its `KillWait`).
pub fn cancel(job: &str) -> Result<(), LaunchError> {
    scancel(job, &[]).map(|_| ())
}

/// The id of a job Slurm still knows by this name (as submitted: sanitised), if any.
pub fn find_by_name(name: &str) -> Option<String> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%i", "-n", &sanitise_name(name)])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_owned)
}

/// The job id of `sbatch --parsable`'s output (`JOBID` or `JOBID;cluster`).
pub(crate) fn parse_job_id(stdout: &str) -> Option<String> {
    let id = stdout.trim().split(';').next()?.trim();
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit())).then(|| id.to_owned())
}

/// What the controller says of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobInfo {
    pub(crate) state: JobState,
    /// `ExitCode=A:B`: the exit status and the signal that ended it.
    pub(crate) exit: Option<(i32, i32)>,
    /// Why it is where it is (`Reason=`), e.g. `ReqNodeNotAvail,_UnavailableNodes:mn2`.
    pub(crate) reason: String,
    /// How often Slurm requeued it (`Restarts=`: node failure, preemption).
    pub(crate) restarts: u32,
}

impl JobInfo {
    /// From one line of `scontrol show job -o` (space-separated `Key=Value` pairs; the
    /// first of each key is the job's own: a name or path further on cannot forge it);
    /// `None` for a line without a state, an error for a state Slurm does not document.
    pub(crate) fn parse(line: &str) -> Result<Option<JobInfo>, LaunchError> {
        let field = |key: &str| line.split_whitespace().find_map(|kv| kv.strip_prefix(key)).map(str::to_owned);
        let Some(state) = field("JobState=") else { return Ok(None) };
        let exit = field("ExitCode=").and_then(|e| parse_exit(&e));
        let restarts = field("Restarts=").and_then(|r| r.parse().ok()).unwrap_or(0);
        Ok(Some(JobInfo { state: state.parse()?, exit, reason: field("Reason=").unwrap_or_default(), restarts }))
    }

    /// Requeued (by a node failure or a preemption) and not running again yet.
    pub(crate) fn waits_after_requeue(&self) -> bool {
        self.restarts > 0 && (self.state == JobState::Pending || self.state.requeueing())
    }

    /// The exit status, none when a signal ended the job.
    pub(crate) fn exit_code(&self) -> Option<i32> {
        match self.exit {
            Some((code, 0)) => Some(code),
            _ => None,
        }
    }
}

/// `A:B` of `ExitCode=A:B`.
fn parse_exit(text: &str) -> Option<(i32, i32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The job's state; `None` when the controller no longer knows the job.
pub(crate) fn query(job: &str) -> Result<Option<JobInfo>, LaunchError> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", job])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LaunchError::Spawn { program: "scontrol".into(), source })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("Invalid job id") {
            return Ok(None);
        }
        return Err(LaunchError::Slurm(format!(
            "`scontrol show job -o {job}` exited {}: {}",
            out.status,
            stderr.trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with(&format!("JobId={job} ")));
    line.map_or(Ok(None), JobInfo::parse)
}

/// The job's end from the job completion log (`sacct -c`: no accounting database
/// needed), the last record of that id; none when there is no such log or record, an
/// error for a state Slurm does not document.
pub(crate) fn completion_log(job: &str) -> Result<Option<JobInfo>, LaunchError> {
    let Ok(out) = Command::new("sacct")
        .args(["-c", "-j", job, "-n", "-P", "-o", "JobID,State,ExitCode"])
        .stdin(Stdio::null())
        .output()
    else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let record = text.lines().rev().find_map(|l| {
        let mut f = l.split('|');
        (f.next()? == job).then_some(())?;
        // sacct writes `CANCELLED by 0`.
        let state = f.next()?.split_whitespace().next()?.to_owned();
        Some((state, f.next().and_then(parse_exit)))
    });
    let Some((state, exit)) = record else { return Ok(None) };
    Ok(Some(JobInfo { state: state.parse()?, exit, reason: String::new(), restarts: 0 }))
}

/// `scancel OPTIONS JOB`; its stdout.
pub(crate) fn scancel(job: &str, options: &[&str]) -> Result<String, LaunchError> {
    output(Command::new("scancel").args(options).arg(job).stdin(Stdio::null()), "scancel")
}

/// Runs a Slurm command; its stdout, or an error naming it with its stderr.
pub(crate) fn output(command: &mut Command, program: &str) -> Result<String, LaunchError> {
    let out = command.output().map_err(|source| LaunchError::Spawn { program: program.into(), source })?;
    if !out.status.success() {
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        return Err(LaunchError::Slurm(format!(
            "`{program} {}` exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
