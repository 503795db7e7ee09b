//! What a job requires of where it runs (its `requires:`), checked before any run
//! starts: a GPU in the cluster (rubick-core's [`Requirements::unmet_by`]), the NVIDIA
//! driver on this machine for a local run, and the files its runs read. `rubick-profile
//! run`, `rubick-run submit` and `rubick-run apply` refuse a job that lacks any of them,
//! in one line naming every missing thing, before anything is written.

use std::path::{Path, PathBuf};

use rubick_core::job::{GpuNeed, Requirements};
use rubick_core::{Cluster, Job, NodeGroup};

/// The file the NVIDIA kernel driver exposes once it is loaded (also inside containers
/// given the GPUs): what a local run of a job requiring `gpu: nvidia` needs.
pub const NVIDIA_DRIVER: &str = "/proc/driver/nvidia/version";

/// Where a job's runs would go: the cluster (and the node group the runs use, when
/// one), whether they run on this machine, and the directory they start in.
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    pub cluster: Option<&'a Cluster>,
    pub group: Option<&'a NodeGroup>,
    /// The local backend: the runs start on this machine, so its driver is checked.
    pub local: bool,
    /// The directory the runs start in (`None`: not checked, e.g. at submit).
    pub dir: Option<&'a Path>,
}

/// Everything `job` requires that `site` lacks, as one sentence (`None`: nothing is
/// missing). The cluster is checked first: a cluster without GPUs makes the driver moot.
pub fn unmet(job: &Job, site: Site<'_>) -> Option<String> {
    let requires = job.requires.as_ref()?;
    let mut missing: Vec<String> = Vec::new();
    let cluster_lacks = site.cluster.and_then(|c| requires.unmet_by(c, site.group));
    let lacks_gpus = cluster_lacks.is_some();
    missing.extend(cluster_lacks);
    if site.local && !lacks_gpus && requires.gpu == Some(GpuNeed::Nvidia) && !Path::new(NVIDIA_DRIVER).exists() {
        missing.push(format!(
            "it requires the NVIDIA driver (requires.gpu: nvidia), and this machine, where the local backend runs it, \
             has none loaded (no {NVIDIA_DRIVER})"
        ));
    }
    if let Some(dir) = site.dir {
        missing.extend(missing_files(requires, &workdir(job, dir)));
    }
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// The directory a job's runs start in: `launch.workdir` (relative to `dir`) when it
/// names one without placeholders, else `dir`.
fn workdir(job: &Job, dir: &Path) -> PathBuf {
    match job.launch.as_ref().and_then(|l| l.workdir.as_deref()) {
        Some(w) if !w.contains('{') => dir.join(w),
        _ => dir.to_path_buf(),
    }
}

/// The required files absent from `dir`, as one clause with the setup command.
fn missing_files(requires: &Requirements, dir: &Path) -> Option<String> {
    let absent: Vec<&str> = requires.files.iter().map(String::as_str).filter(|f| !dir.join(f).exists()).collect();
    if absent.is_empty() {
        return None;
    }
    let make = match &requires.setup {
        Some(setup) => {
            format!(": make {} with `{setup}` (requires.setup)", if absent.len() == 1 { "it" } else { "them" })
        }
        None => String::new(),
    };
    Some(format!("it requires {} (requires.files), absent from {}{make}", absent.join(", "), shown(dir)))
}

/// `dir` as written, `.` for the current directory.
fn shown(dir: &Path) -> String {
    if dir.as_os_str().is_empty() { ".".into() } else { dir.display().to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(requires: Requirements) -> Job {
        let mut job = Job::example("j", rubick_core::PlanCode::Ga, 1, 1, false);
        job.requires = Some(requires);
        job
    }

    fn cpu_cluster() -> Cluster {
        let mut c = Cluster::example();
        c.name = "vm".into();
        c.node_groups[0].gpu_type = "cpu".into();
        c
    }

    #[test]
    fn a_gpu_job_on_cpu_slots_is_refused_naming_both() {
        let j = job(Requirements { gpu: Some(GpuNeed::Any), ..Requirements::default() });
        let c = cpu_cluster();
        let why = unmet(&j, Site { cluster: Some(&c), group: None, local: true, dir: None }).unwrap();
        assert!(why.contains("requires a GPU") && why.contains("cluster `vm`") && why.contains("gpuType cpu"), "{why}");
        assert!(!why.contains('\n'), "one line: {why}");
        let gpus = Cluster::example();
        assert_eq!(unmet(&j, Site { cluster: Some(&gpus), group: None, local: true, dir: None }), None);
        assert_eq!(
            unmet(
                &Job::example("j", rubick_core::PlanCode::Ga, 1, 1, false),
                Site { cluster: Some(&c), group: None, local: true, dir: None }
            ),
            None
        );
    }

    #[test]
    fn missing_files_are_named_with_the_command_that_makes_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("here")).unwrap();
        let j = job(Requirements {
            gpu: None,
            files: vec!["here".into(), "assets/tokenizer".into()],
            setup: Some("python assets.py assets".into()),
        });
        let site = Site { cluster: None, group: None, local: true, dir: Some(dir.path()) };
        let why = unmet(&j, site).unwrap();
        assert!(why.contains("assets/tokenizer") && !why.contains("here,"), "{why}");
        assert!(why.contains("`python assets.py assets`"), "{why}");
        std::fs::create_dir_all(dir.path().join("assets/tokenizer")).unwrap();
        assert_eq!(unmet(&j, site), None);
    }
}
