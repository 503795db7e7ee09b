//! `rubick-run submit`: jobs into the state, each name once (`--replace`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rubick_core::{Cluster, Job};
use rubick_io::cli::Outcome;
use rubick_io::files::load_artifact;

use crate::state::{JobRecord, JobStatus};
use crate::{StateArgs, unix_now};

pub(crate) fn submit(paths: &[PathBuf], args: &StateArgs, retries: u32, replace: bool) -> anyhow::Result<Outcome> {
    rubick_io::cli::ensure_one_stdin(&paths.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;
    let mut jobs = Vec::new();
    for path in paths {
        let mut job: Job = load_artifact(path)?;
        anyhow::ensure!(
            job.launch.is_some(),
            "{}: launch: missing (rubick-run starts a job through its launch section)",
            path.display()
        );
        // Kept absolute: the state outlives the submitting directory.
        if let Some(model) = &job.perf_model {
            let base = path.parent().unwrap_or(Path::new("."));
            let abs =
                std::path::absolute(base.join(model)).with_context(|| format!("{}: perfModel", path.display()))?;
            job.perf_model = Some(abs.display().to_string());
            let model: rubick_model::perf::PerfModel =
                load_artifact(&abs).with_context(|| format!("{}: perfModel", path.display()))?;
            model.params().map_err(|e| anyhow::anyhow!("{}: perfModel: {}: {e}", path.display(), abs.display()))?;
        }
        jobs.push(job);
    }
    // A state that remembers its cluster (its first `apply --cluster`) refuses now a job
    // that requires what the cluster lacks (a GPU), before anything is written.
    let remembered = args.state.join("cluster.yaml");
    if remembered.is_file() {
        let cluster: Cluster = load_artifact(&remembered)?;
        for (path, job) in paths.iter().zip(&jobs) {
            let site = rubick_launch::requires::Site { cluster: Some(&cluster), group: None, local: false, dir: None };
            if let Some(why) = rubick_launch::requires::unmet(job, site) {
                bail!(
                    "{}: job `{}` cannot run on this state's cluster ({}): {why}; nothing was submitted",
                    path.display(),
                    job.name,
                    remembered.display()
                );
            }
        }
    }
    let dir = locked!(args, true);
    let mut state = dir.load()?;
    for (i, job) in jobs.iter().enumerate() {
        if jobs[..i].iter().any(|j| j.name == job.name) {
            bail!("{}: job `{}` is submitted twice", paths[i].display(), job.name);
        }
        if let Some(old) = state.jobs.get(&job.name) {
            let status = old.status.to_string();
            if matches!(old.status, JobStatus::Queued | JobStatus::Running) {
                bail!(
                    "{}: job `{}` already exists in {} and is {status}; stop it first (`rubick-run stop {}`)",
                    paths[i].display(),
                    job.name,
                    dir.root.display(),
                    job.name
                );
            }
            if !replace {
                bail!(
                    "{}: job `{}` already exists in {} ({status}); `submit --replace` starts a new incarnation, `rubick-run delete {}` removes it",
                    paths[i].display(),
                    job.name,
                    dir.root.display(),
                    job.name
                );
            }
        }
    }
    for job in jobs {
        if state.jobs.contains_key(&job.name) {
            // The old incarnation's files move aside first: nothing of it is ever read
            // as the new one's (a crash after the move leaves a record without files,
            // which is not running).
            let old = dir.job_dir(&job.name);
            if old.exists() {
                let aside = (1..)
                    .map(|n| dir.root.join("jobs").join(format!("{}.replaced-{n}", job.name)))
                    .find(|p| !p.exists())
                    .context("a free name")?;
                std::fs::rename(&old, &aside)
                    .with_context(|| format!("{}: cannot move it to {}", old.display(), aside.display()))?;
                eprintln!("{}: the replaced incarnation's files are in {}", job.name, aside.display());
            }
        }
        eprintln!("{}: queued ({} iterations, request {} GPUs)", job.name, job.iterations, job.request.gpus);
        state.jobs.insert(
            job.name.clone(),
            JobRecord {
                job,
                status: JobStatus::Queued,
                run: None,
                attempts: 0,
                iterations_done: 0,
                exit_code: None,
                reason: None,
                reconfigurations: Vec::new(),
                retries_left: retries,
                submitted_unix_s: unix_now(),
                submitted_from: std::env::current_dir().ok(),
                first_started_unix_s: None,
            },
        );
    }
    dir.save(&state)?;
    Ok(Outcome::Done)
}
