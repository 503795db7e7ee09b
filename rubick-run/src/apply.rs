//! `rubick-run apply`: a schedule checked against the state (`desired_of`), then
//! reconciled with what runs: the round's stops together, then its starts together.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, bail};
use rubick_core::Cluster;
use rubick_core::artifact::to_yaml;
use rubick_core::schedule::{Change, Schedule};
use rubick_io::cli::Outcome;
use rubick_io::files::load_artifact;

use crate::backends::{self, Executor};
use crate::reconcile::{self, Action, Allocation, StopReason};
use crate::runs::Look;
use crate::state::{self, JobStatus, RunPhase, RunRecord, State, StateDir};
use crate::{StateArgs, failpoint, refresh, stop_runs, unix_now, where_};

/// A run an apply has recorded and is about to launch.
pub(crate) struct Starting {
    spec: backends::StartSpec,
    attempt: u32,
}

/// The schedule's desired allocations, checked: known jobs, no GPU given twice, the
/// cluster's names and GPU indices when it is given, one node for the local backend.
pub(crate) fn desired_of(
    schedule: &Schedule,
    path: &Path,
    state: &State,
    cluster: Option<&Cluster>,
    backend: &dyn Executor,
) -> anyhow::Result<BTreeMap<String, Allocation>> {
    let at = |i: usize, what: &str| format!("{}: assignments[{i}].{what}", rubick_io::files::display(path));
    if let Some(c) = cluster {
        anyhow::ensure!(
            schedule.cluster == c.name,
            "{}: cluster: the schedule is for `{}`, not `{}`",
            rubick_io::files::display(path),
            schedule.cluster,
            c.name
        );
    }
    if let Some(known) = state.cluster.as_deref().filter(|c| *c != schedule.cluster) {
        bail!(
            "{}: cluster: the schedule is for `{}`, but this state runs cluster `{known}`",
            rubick_io::files::display(path),
            schedule.cluster
        );
    }
    let cwd = std::env::current_dir().context("the current directory")?;
    let mut desired = BTreeMap::new();
    for (i, a) in schedule.assignments.iter().enumerate() {
        let Some(rec) = state.jobs.get(&a.job) else {
            bail!("{}: `{}` is not a job of this state (submit it first)", at(i, "job"), a.job);
        };
        let (Some(plan), false) = (a.plan, a.nodes.is_empty()) else { continue };
        if matches!(rec.status, JobStatus::Finished | JobStatus::Failed | JobStatus::Stopped) {
            tracing::warn!("`{}` is {:?}: its assignment is ignored", a.job, rec.status);
            continue;
        }
        if rec.job.unsupported_plans.contains(&plan) {
            tracing::warn!("`{}`: `{plan}` is a plan its runs refused (exit 2): the assignment is ignored", a.job);
            continue;
        }
        // What the job requires of where it runs (a GPU, its driver, its files), checked
        // on the assignment's node group, this machine (local runs) and the directory the
        // runs start in (Kubernetes runs start in their image: not checked).
        let group = cluster.and_then(|c| {
            let (g, _) = c.node_by_name(&a.nodes.first()?.node)?;
            c.node_groups.get(g)
        });
        let site = rubick_launch::requires::Site {
            cluster,
            group,
            local: backend.name() == "local",
            dir: (backend.name() != "kubernetes").then_some(cwd.as_path()),
        };
        if let Some(why) = rubick_launch::requires::unmet(&rec.job, site) {
            bail!(
                "{}: `{}` cannot run here: {why}; nothing was done (`rubick-run delete {}` removes the job)",
                at(i, "job"),
                a.job,
                a.job
            );
        }
        for (k, share) in a.nodes.iter().enumerate() {
            if let Some(c) = cluster {
                let (g, _) = c.node_by_name(&share.node).with_context(|| {
                    at(i, &format!("nodes[{k}].node: `{}` is not a node of cluster `{}`", share.node, c.name))
                })?;
                let group = &c.node_groups[g];
                if let Some(g) = share.gpus.iter().find(|g| **g >= group.gpus_per_node) {
                    bail!(
                        "{}: GPU {g} is out of range (the node has {})",
                        at(i, &format!("nodes[{k}].gpus")),
                        group.gpus_per_node
                    );
                }
                anyhow::ensure!(
                    share.cpus <= group.cpu_cores,
                    "{}: {} cores on a node of {}",
                    at(i, &format!("nodes[{k}].cpus")),
                    share.cpus,
                    group.cpu_cores
                );
            }
            let mut seen = share.gpus.clone();
            seen.sort_unstable();
            seen.dedup();
            anyhow::ensure!(
                seen.len() == share.gpus.len(),
                "{}: a GPU is listed twice",
                at(i, &format!("nodes[{k}].gpus"))
            );
        }
        if backend.name() == "local" && a.nodes.len() > 1 {
            bail!("{}: {} nodes; the local backend runs a job on this one machine", at(i, "nodes"), a.nodes.len());
        }
        desired.insert(a.job.clone(), Allocation { plan, nodes: a.nodes.clone() });
    }
    // Without a cluster to check against, the local backend still knows this machine:
    // a schedule asking for more cores than it has was planned for another cluster.
    if cluster.is_none() && backend.name() == "local" {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) as u32;
        let asked: u32 = desired.values().flat_map(|a| a.nodes.iter().map(|n| n.cpus)).sum();
        anyhow::ensure!(
            asked <= cores,
            "{}: the schedule asks for {asked} cores in all, and this machine has {cores}: a schedule for another cluster? (plan it with this machine's cluster, `rubick-profile devices --cluster-out`, and pass that as --cluster)",
            rubick_io::files::display(path)
        );
    }
    if let Some((a, b, node, gpu)) = reconcile::shared_gpu(&desired) {
        bail!("{}: GPU {gpu} of {node} is given to both `{a}` and `{b}`", rubick_io::files::display(path));
    }
    Ok(desired)
}

pub(crate) fn apply(
    path: &Path,
    args: &StateArgs,
    backend_name: &str,
    cluster: Option<&Path>,
    dry_run: bool,
    kubernetes: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let clock = Instant::now();
    let lap = |what: &str| tracing::debug!("apply: {what} at {:.2} ms", clock.elapsed().as_secs_f64() * 1e3);
    let loaded = state::load_schedule(path, &args.state)?;
    let schedule = &loaded.schedule;
    let given: Option<Cluster> = cluster.map(load_artifact).transpose()?;
    lap("schedule and cluster read");
    let settings = kubernetes.map(|p| backends::kubernetes::Settings::load(p).map(|s| (p, s))).transpose()?;
    let dir = locked!(args, true);
    failpoint("locked");
    // The backend's settings (Kubernetes) are the state's from now on.
    if let Some((from, s)) = &settings {
        let text = serde_yaml_ng::to_string(s)?;
        state::write_private(&dir.root.join(backends::kubernetes::SETTINGS_FILE), text.as_bytes())
            .with_context(|| format!("--kubernetes {}", from.display()))?;
    }
    let backend = backends::backend(backend_name, Some(&dir.root))?
        .with_context(|| format!("--backend: unknown `{backend_name}`"))?;
    let mut state = dir.load()?;
    lap("state loaded");
    // The state remembers the cluster its first apply with --cluster named: later
    // schedules are checked against it (nodes, GPU indices, cores) without the flag.
    let remembered = dir.root.join("cluster.yaml");
    let cluster: Option<Cluster> = match &given {
        Some(c) => Some(c.clone()),
        None if remembered.exists() => Some(load_artifact(&remembered)?),
        None => None,
    };
    if let Some(known) =
        state.backend.as_deref().filter(|b| *b != backend_name && state.jobs.values().any(|r| r.run.is_some()))
    {
        bail!("--backend {backend_name}: the runs of {} are on backend `{known}`; stop them first", dir.root.display());
    }
    // Bad input is refused before anything is touched; then the records are brought up
    // to date (a job may have finished since) and the schedule read against them.
    desired_of(schedule, path, &state, cluster.as_ref(), backend.as_ref())?;
    lap("schedule checked");
    refresh(&dir, &mut state, backend.as_ref(), Look::Last)?;
    lap("runs refreshed");
    // No write failure holds a stop back (a full disk): the round's stops save their
    // intent themselves, or leave a mark; a start is never made without its record.
    if let Err(e) = dir.save(&state) {
        tracing::warn!("{e:#}: the round goes on; the state is written when it can be");
    }
    lap("state saved");
    let desired = desired_of(schedule, path, &state, cluster.as_ref(), backend.as_ref())?;
    let actual: BTreeMap<String, Allocation> = state
        .jobs
        .iter()
        .filter_map(|(n, r)| {
            r.run.as_ref().filter(|run| run.phase == RunPhase::Running).map(|run| (n.clone(), run.allocation()))
        })
        .collect();
    let actions = reconcile::reconcile(&desired, &actual);
    if dry_run {
        // What this apply would do, and nothing done (the refresh above only recorded
        // runs that ended).
        for action in &actions {
            match action {
                Action::Stop { job, reason } => println!(
                    "stop {job} ({})",
                    if *reason == StopReason::Reconfigure { "to reconfigure" } else { "preempted" }
                ),
                Action::Start { job, allocation } => {
                    println!("start {job} {} on {}", allocation.plan, where_(&allocation.nodes));
                }
            }
        }
        if actions.is_empty() {
            println!("nothing to change");
        }
        return Ok(Outcome::Done);
    }
    let new_round = state.round != Some(schedule.round);
    if new_round {
        for rec in state.jobs.values_mut() {
            if let Some(run) = rec
                .run
                .as_mut()
                .filter(|_| !actions.iter().any(|a| matches!(a, Action::Stop { job, .. } if *job == rec.job.name)))
            {
                run.rounds_since_change += 1;
            }
        }
    }
    tracing::info!("round {}: {} action(s)", schedule.round, actions.len());
    let mut start_failures = Vec::new();
    // Every stop of the round at once (a checkpoint may take minutes), then the starts.
    let stops: Vec<(&str, StopReason)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Stop { job, reason } => Some((job.as_str(), *reason)),
            Action::Start { .. } => None,
        })
        .collect();
    let names: Vec<&str> = stops.iter().map(|(job, _)| *job).collect();
    let stopped = stop_runs(&dir, &mut state, &names, backend.as_ref())?;
    for (&(job, reason), (secs, clean)) in stops.iter().zip(stopped).filter_map(|(s, r)| Some((s, r?))) {
        if reason != StopReason::Reconfigure
            && let Some(rec) = state.jobs.get_mut(job)
        {
            rec.reason = Some(format!("paused by round {}: its resources went to other jobs", schedule.round));
        }
        // A move the planner did not choose: it planned the job as a waiting one (its
        // node or GPU left, or it ran slower after a move) and started it again. Counted
        // apart from its restarts (`Reconfiguration::forced`).
        let started = schedule.assignments.iter().any(|a| a.job == job && a.change == Change::Started);
        if reason == StopReason::Reconfigure
            && started
            && let Some(last) = state.jobs.get_mut(job).and_then(|r| r.reconfigurations.last_mut())
        {
            last.forced = true;
        }
        eprintln!(
            "{job}: stopped ({}) in {secs:.1} s{}",
            if reason == StopReason::Reconfigure { "to reconfigure" } else { "preempted" },
            if clean { "" } else { " (killed after stopTimeoutS)" }
        );
    }
    // The starts: each recorded first (phase starting, its attempt and cores; one save),
    // then all launched at once (an sbatch or kubectl each may take a while), then their
    // handles recorded (one save). A rubick-run killed in between leaves runs in phase
    // starting, which the next one adopts from their directories or queues again.
    let mut starting: Vec<Starting> = Vec::new();
    for action in &actions {
        let Action::Start { job, allocation } = action else { continue };
        // A run of this job the records do not know (a state that lost them) is found
        // from its directory: never a second copy beside it.
        if let Some((attempt, handle)) = live_unrecorded_run(&dir, &state, job, backend.as_ref()) {
            tracing::error!(
                "`{job}`: attempt {attempt} is still running (handle {handle}) but the state does not record it; not starting a second copy (stop it, or `rubick-run stop {job}`)"
            );
            continue;
        }
        if let Err(e) = ensure_own_dirs(&dir, job) {
            eprintln!("{job}: not started: {e:#}");
            start_failures.push(format!("{job}: {e:#}"));
            continue;
        }
        let rec = state.jobs.get_mut(job).context("a desired job has a record")?;
        // Never an attempt directory that exists: its files are another run's. Never past
        // the bound either (a counter that wrapped would name attempt 0).
        let next = (rec.attempts + 1..=state::MAX_ATTEMPTS).find(|&a| {
            let exists = dir.attempt_dir(job, a).exists();
            if exists {
                tracing::warn!(
                    "`{job}`: {} exists already; skipping that attempt number",
                    dir.attempt_dir(job, a).display()
                );
            }
            !exists
        });
        let Some(attempt) = next else {
            let why = format!("{job}: not started: it has used all {} attempts a job may have", state::MAX_ATTEMPTS);
            eprintln!("{why}");
            start_failures.push(why);
            continue;
        };
        rec.attempts = attempt;
        // Cores no other run holds, the ones recorded just before included.
        let cores = if backend.name() == "local" {
            let held: Vec<u32> = state_cores(&state, job);
            let want: u32 = allocation.nodes.iter().map(|n| n.cpus).sum();
            free_cores(&held, want)
        } else {
            Vec::new()
        };
        let rec = state.jobs.get_mut(job).context("a desired job has a record")?;
        let run = RunRecord {
            plan: allocation.plan,
            nodes: allocation.nodes.clone(),
            attempt,
            phase: RunPhase::Starting,
            handle: None,
            started_unix_s: unix_now(),
            rounds_since_change: 0,
            cores: cores.clone(),
        };
        if let Some(last) = rec.reconfigurations.last_mut().filter(|r| r.to.is_none()) {
            last.to = Some(allocation.plan.to_string());
        }
        rec.first_started_unix_s.get_or_insert(run.started_unix_s);
        rec.run = Some(run);
        rec.status = JobStatus::Running;
        let mut launch = rec.job.launch.clone().context("a submitted job has a launch section")?;
        // Relative paths of the command resolve against where the job was submitted,
        // not against wherever this apply runs (a container's working directory is the
        // image's business).
        if let Some(from) = rec.submitted_from.as_ref().filter(|_| backend.name() != "kubernetes") {
            let from = from.display().to_string().replace('{', "{{").replace('}', "}}");
            launch.workdir = Some(match launch.workdir.take() {
                Some(w) if w.starts_with('/') || w.starts_with('{') => w,
                Some(w) => format!("{from}/{w}"),
                None => from,
            });
        }
        let total = rec.job.iterations.to_string();
        launch.env.entry("RUBICK_TOTAL_ITERATIONS".into()).or_insert_with(|| total.clone());
        launch.env.entry("RUBICK_ITERATIONS".into()).or_insert(total);
        let spec = backends::StartSpec {
            job: rec.job.clone(),
            launch,
            allocation: allocation.clone(),
            dir: dir.attempt_dir(job, attempt),
            checkpoint_dir: dir.job_dir(job).join("checkpoints"),
            cores,
        };
        starting.push(Starting { spec, attempt });
    }
    // The intent first: a rubick-run killed from here until the runs are recorded with
    // their handles leaves it, and the next command searches the processes for a run
    // no record holds (`StateDir::needs_search`).
    if !starting.is_empty() {
        let dirs: Vec<&Path> = starting.iter().map(|s| s.spec.dir.as_path()).collect();
        dir.intend_starts(&dirs)?;
        failpoint("start-intended");
        dir.save(&state)?;
        failpoint("start-recorded");
    }
    let started: Vec<anyhow::Result<backends::Handle>> = std::thread::scope(|scope| {
        let launches: Vec<_> = starting
            .iter()
            .map(|s| {
                let backend = backend.as_ref();
                scope.spawn(move || Ok(backend.submit(&s.spec.submission()?)?))
            })
            .collect();
        launches.into_iter().map(|l| l.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    if !starting.is_empty() {
        failpoint("spawned");
    }
    for (s, result) in starting.iter().zip(started) {
        let job = s.spec.job.name.as_str();
        let rec = state.jobs.get_mut(job).context("record")?;
        let handle = match result {
            Ok(handle) => handle,
            Err(e) => {
                // One job that cannot start never blocks the others.
                let why = format!("could not start under {}: {e:#}", s.spec.allocation.plan);
                eprintln!("{job}: failed: {why}");
                rec.run = None;
                rec.status = JobStatus::Failed;
                rec.reason = Some(why.clone());
                start_failures.push(format!("{job}: {why}"));
                continue;
            }
        };
        if let Some(run) = rec.run.as_mut() {
            run.handle = Some(handle.to_string());
            run.phase = RunPhase::Running;
            // What this run was, beside what it measures (the online refit reads both).
            state::write_private(&s.spec.dir.join("run.yaml"), serde_yaml_ng::to_string(&*run)?.as_bytes())?;
        }
        eprintln!(
            "{job}: started {} on {} (run {}, {} {})",
            s.spec.allocation.plan,
            where_(&s.spec.allocation.nodes),
            s.attempt,
            match handle {
                backends::Handle::Local { .. } => "process group",
                backends::Handle::Slurm { .. } => "Slurm job",
                backends::Handle::Kubernetes { .. } => "resources",
            },
            handle.short()
        );
    }
    dir.save(&state)?;
    if !starting.is_empty() {
        // Every start is recorded (its handle, or its failure): no run lacks a record.
        dir.searched();
    }
    lap("actions taken");
    if let Some(c) = &given {
        state::write_if_changed(&remembered, to_yaml(c).as_bytes())?;
    }
    state.round = Some(schedule.round);
    state.cluster = Some(schedule.cluster.clone());
    state.backend = Some(backend_name.to_owned());
    dir.save(&state)?;
    dir.write_current(&loaded)?;
    lap("state and schedule saved");
    failpoint("applied");
    if actions.is_empty() {
        tracing::info!("nothing to change");
    }
    if !start_failures.is_empty() {
        return Ok(Outcome::Negative(format!(
            "{} job(s) could not start and are failed (the others were applied): {}",
            start_failures.len(),
            start_failures.join("; ")
        )));
    }
    Ok(Outcome::Done)
}

/// Refuses a job directory (or `jobs/`) that is a symlink: the state writes only into
/// directories it made.
pub(crate) fn ensure_own_dirs(dir: &StateDir, job: &str) -> anyhow::Result<()> {
    for path in [dir.root.join("jobs"), dir.job_dir(job)] {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            bail!("{}: a symlink the state did not make; refusing to write through it", path.display());
        }
    }
    Ok(())
}

/// A live run in one of `job`'s attempt directories that its record does not hold.
pub(crate) fn live_unrecorded_run(
    dir: &StateDir,
    state: &State,
    job: &str,
    backend: &dyn Executor,
) -> Option<(u32, String)> {
    let recorded = state.jobs.get(job).and_then(|r| r.run.as_ref()).map(|r| r.attempt);
    let entries = std::fs::read_dir(dir.job_dir(job)).ok()?;
    let mut attempts: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("attempt-")?.parse().ok())
        .filter(|a| Some(*a) != recorded)
        .collect();
    attempts.sort_unstable();
    attempts.into_iter().find_map(|a| {
        let attempt_dir = dir.attempt_dir(job, a);
        let handle = backend.recover(&attempt_dir, backends::run_name(&attempt_dir).as_deref())?;
        backend.poll(&handle, &attempt_dir, &[]).alive().then(|| (a, handle.to_string()))
    })
}

/// Cores the runs of jobs other than `job` are pinned to.
pub(crate) fn state_cores(state: &State, job: &str) -> Vec<u32> {
    state
        .jobs
        .iter()
        .filter(|(n, _)| n.as_str() != job)
        .filter_map(|(_, r)| r.run.as_ref())
        .flat_map(|r| r.cores.clone())
        .collect()
}

/// `want` of this machine's cores that none of `held` is, lowest first; fewer when
/// there are not enough (then the run is pinned to what is free, or not at all).
pub(crate) fn free_cores(held: &[u32], want: u32) -> Vec<u32> {
    let total = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let free: Vec<u32> = (0..total).filter(|c| !held.contains(c)).take(want as usize).collect();
    if (free.len() as u32) < want {
        tracing::warn!("{want} cores asked, {} free on this machine: pinned to those", free.len());
    }
    free
}
