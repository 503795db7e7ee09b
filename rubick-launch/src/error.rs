//! Why a run could not be started or followed: the error every backend returns.

use std::path::{Path, PathBuf};

/// Why a run could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The job contract cannot be honoured (an empty command, a bad placeholder, a
    /// request a backend cannot place).
    #[error("launch: {0}")]
    Contract(String),
    /// A file of the run could not be written or read.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A program (the launcher, a scheduler's command, a watchdog) could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// A scheduler command failed or its job could not be followed.
    #[error("slurm: {0}")]
    Slurm(String),
    /// Another backend's failure, its message prefixed with the backend.
    #[error("{0}")]
    Backend(String),
}

/// The [`LaunchError::Io`] of an operation on `path`.
pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LaunchError + '_ {
    move |source| LaunchError::Io { path: path.to_path_buf(), source }
}
