//! Files in and out: `-` is stdin/stdout, every written file is atomic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use rubick_core::artifact::{self, Artifact};
use rubick_core::error::ArtifactError;

/// An input or output that failed, with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not UTF-8 text (invalid byte at offset {offset}); is this a binary file?")]
    NotText { path: String, offset: usize },
    #[error("{path}: {source}")]
    Artifact { path: String, source: ArtifactError },
    #[error("{path}: {message}")]
    Table { path: String, message: String },
    /// An output that cannot be written under its name (see [`check_output`]).
    #[error("{path}: {message}")]
    Output { path: String, message: String },
}

impl IoError {
    pub fn table(path: &Path, message: impl std::fmt::Display) -> Self {
        IoError::Table { path: display(path), message: message.to_string() }
    }
}

/// How a path is shown in messages (`-` as `<stdin>`).
pub fn display(path: &Path) -> String {
    if is_std(path) { "<stdin>".to_owned() } else { path.display().to_string() }
}

/// Whether the path means stdin/stdout.
pub fn is_std(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// What an output holds, for the check of its name ([`check_output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
    Csv,
    Tsv,
    Parquet,
    Markdown,
    /// The Prometheus text exposition format (node-exporter's textfile collector reads
    /// `*.prom`).
    Prometheus,
    Xml,
    /// Text for a person (a table, a report, a script): no extension names it; `.txt`
    /// names no format.
    Text,
}

impl Format {
    const ALL: [Format; 9] = [
        Format::Yaml,
        Format::Json,
        Format::Csv,
        Format::Tsv,
        Format::Parquet,
        Format::Markdown,
        Format::Prometheus,
        Format::Xml,
        Format::Text,
    ];

    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Yaml => "yaml",
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Tsv => "tsv",
            Format::Parquet => "parquet",
            Format::Markdown => "markdown",
            Format::Prometheus => "prometheus",
            Format::Xml => "xml",
            Format::Text => "text",
        }
    }

    /// The extensions that name the format (lower case), the usual one first.
    pub fn extensions(self) -> &'static [&'static str] {
        match self {
            Format::Yaml => &["yaml", "yml"],
            Format::Json => &["json", "jsonl"],
            Format::Csv => &["csv"],
            Format::Tsv => &["tsv"],
            Format::Parquet => &["parquet", "pq"],
            Format::Markdown => &["md", "markdown"],
            Format::Prometheus => &["prom"],
            Format::Xml => &["xml"],
            Format::Text => &[],
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The format a file's extension names, case-insensitively (see
/// [`Format::extensions`]); `None` for stdout, no extension or any other (`.txt`
/// included). An output whose extension names another format than the one written is
/// refused ([`check_output`]), never written silently.
pub fn extension_format(path: &Path) -> Option<Format> {
    if is_std(path) {
        return None;
    }
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Format::ALL.into_iter().find(|f| f.extensions().contains(&ext.as_str()))
}

/// The one check of an output's name, for every output written: a path whose extension
/// names another format than `format` (`schedule -o s.parquet`, a table `-o t.yaml`,
/// `status --format prometheus -o s.yaml`) is refused, naming both; `-` (stdout), no
/// extension and an extension no format has (`.txt`) are taken. A command with several
/// outputs checks them all before it writes the first.
pub fn check_output(path: &Path, format: Format) -> Result<(), IoError> {
    match extension_format(path) {
        Some(named) if named != format => {
            let rename = match format.extensions().first() {
                Some(ext) => format!("name it .{ext}, or give it no extension"),
                None => "give it no extension (or .txt)".to_owned(),
            };
            Err(IoError::Output {
                path: display(path),
                message: format!("the extension names {named}, but this output is {format}: {rename}"),
            })
        }
        _ => Ok(()),
    }
}

/// Reads a whole file (or stdin for `-`) as bytes.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, IoError> {
    let mut bytes = Vec::new();
    let result = if is_std(path) {
        std::io::stdin().lock().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::read(path).map(|b| bytes = b)
    };
    result.map_err(|source| IoError::Io { path: display(path), source })?;
    Ok(bytes)
}

/// Reads a whole file (or stdin for `-`) as UTF-8 text.
pub fn read_text(path: &Path) -> Result<String, IoError> {
    let bytes = read_bytes(path)?;
    String::from_utf8(bytes).map_err(|e| IoError::NotText { path: display(path), offset: e.utf8_error().valid_up_to() })
}

/// Reads, parses and validates one artifact document.
pub fn load_artifact<T: Artifact>(path: &Path) -> Result<T, IoError> {
    let text = read_text(path)?;
    parse_artifact(path, &text)
}

/// Parses text read from `path` as artifact `T`; errors name the path.
pub fn parse_artifact<T: Artifact>(path: &Path, text: &str) -> Result<T, IoError> {
    if text.contains('\0') {
        return Err(IoError::NotText { path: display(path), offset: text.find('\0').unwrap_or(0) });
    }
    artifact::parse_yaml(text).map_err(|source| IoError::Artifact { path: display(path), source })
}

/// Writes `bytes` to `path` atomically and durably: into a temporary file in the same
/// directory, synced, renamed over the target, then the directory synced (so that the
/// rename survives a crash too). A crash leaves either the old file or the new one,
/// never a partial one; a failed write (a full disk) leaves no temporary file behind.
/// The one atomic write of the workspace: artifacts, the run wrapper's pid and exit
/// files, `rubick-run`'s state, Kubernetes manifests.
///
/// A target that exists and is not a regular file (`/dev/null`, a FIFO, a terminal)
/// is written in place: renaming over it would replace the device.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    write_atomic_as(path, bytes, Access::Plain)
}

/// Who may read a file [`write_atomic_as`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A plain new file's permissions (0666 less the umask): outputs.
    Plain,
    /// Its owner only (0600): records that may hold secrets (a state directory's jobs
    /// and their environments, the manifests made of them).
    Private,
}

/// [`write_atomic`], the file created with the permissions `access` says.
pub fn write_atomic_as(path: &Path, bytes: &[u8], access: Access) -> Result<(), IoError> {
    replace(path, bytes, access, true)
}

/// [`write_atomic_as`] without its syncs: a reader sees the old bytes or the new, never
/// a part, but a machine that stops may lose the file (or leave it empty) where a
/// process killed cannot. For what is rebuilt when lost or found wrong (a cache, a
/// seal), where two fsyncs would cost more than the write.
pub fn write_atomic_unsynced(path: &Path, bytes: &[u8], access: Access) -> Result<(), IoError> {
    replace(path, bytes, access, false)
}

fn replace(path: &Path, bytes: &[u8], access: Access, sync: bool) -> Result<(), IoError> {
    let err = |source| IoError::Io { path: path.display().to_string(), source };
    if is_special(path) {
        return std::fs::OpenOptions::new().write(true).open(path).and_then(|mut f| f.write_all(bytes)).map_err(err);
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = format!(".{}.", path.file_name().and_then(|n| n.to_str()).unwrap_or("out"));
    let mut tmp = match access {
        Access::Plain => temp_file_in(&dir, &prefix, ".tmp"),
        Access::Private => tempfile::Builder::new().prefix(&prefix).suffix(".tmp").tempfile_in(&dir),
    }
    .map_err(err)?;
    tmp.write_all(bytes).map_err(err)?;
    if sync {
        tmp.as_file().sync_all().map_err(err)?;
    }
    tmp.persist(path).map_err(|e| err(e.error))?;
    // Best effort: some file systems cannot sync a directory; the file itself is synced.
    if sync && let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Whether `path` exists and is neither a regular file nor a directory (a device, a
/// FIFO, a socket): an output there is written in place, never renamed over.
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// A temporary file in `dir` for an output that is renamed into place once written:
/// created with the permissions a plain new file gets (0666 less the umask), not the
/// 0600 of a private temporary file, so outputs stay readable as users expect.
pub fn temp_file_in(dir: &Path, prefix: &str, suffix: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix).suffix(suffix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    builder.tempfile_in(dir)
}

/// Writes an output of `format`: to stdout for `-` (a closed pipe is not an error: see
/// [`crate::cli::report`]), else atomically to the file, unless its name says another
/// format ([`check_output`]: then nothing is written).
pub fn write_output(path: &Path, format: Format, bytes: &[u8]) -> Result<(), IoError> {
    check_output(path, format)?;
    if is_std(path) {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes).and_then(|_| out.flush()).map_err(|source| IoError::Io { path: "<stdout>".into(), source })
    } else {
        write_atomic(path, bytes)
    }
}

/// Validates artifact files of kind `T`, confirming each on stderr (`FILE: valid
/// KIND`: a `check` that prints nothing cannot be told from one that checked nothing);
/// the first bad one is the error.
pub fn check_artifacts<T: Artifact>(paths: &[PathBuf]) -> Result<(), IoError> {
    for path in paths {
        load_artifact::<T>(path)?;
        eprintln!("{}: valid {}", display(path), T::KIND);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rubick_core::Cluster;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.yaml");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_device_is_written_in_place_never_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let null = Path::new("/dev/null");
        if !std::fs::metadata(null).is_ok_and(|m| m.file_type().is_char_device()) {
            rubick_testkit::skip("/dev/null is not a character device here");
            return;
        }
        write_atomic(null, b"discarded").unwrap();
        assert!(std::fs::metadata(null).unwrap().file_type().is_char_device(), "/dev/null was replaced");
    }

    #[cfg(unix)]
    #[test]
    fn outputs_get_a_plain_files_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (atomic, plain) = (dir.path().join("atomic"), dir.path().join("plain"));
        write_atomic(&atomic, b"x").unwrap();
        std::fs::write(&plain, b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&atomic), mode(&plain));
        let private = dir.path().join("private");
        write_atomic_as(&private, b"x", Access::Private).unwrap();
        assert_eq!(mode(&private), 0o600);
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, "apiVersion: rubick/v1\nkind: Cluster\nname: x\nnodeGroups: []\n").unwrap();
        let err = load_artifact::<Cluster>(&path).unwrap_err().to_string();
        assert!(err.starts_with(&path.display().to_string()), "{err}");
        assert!(err.contains("nodeGroups"), "{err}");
        std::fs::write(&path, [0xff_u8, 0xfe, 0x00, 0x41]).unwrap();
        let err = load_artifact::<Cluster>(&path).unwrap_err().to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }
}
