//! Others' published measurements (`shared/reference/external/`) read from disk; the
//! reading itself is `rubick_model::external`.

use std::path::{Path, PathBuf};

use rubick_model::external::{ExternalSet, parse};

/// The four public tables, by file stem, in the order reports list them.
pub const SETS: [&str; 4] = ["vtrain_single", "vtrain_multi", "sailor", "calculon_tab5"];

/// Finds `shared/reference/external` above `start` (or `$RUBICK_EXTERNAL`).
pub fn locate(start: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("RUBICK_EXTERNAL") {
        let dir = PathBuf::from(dir);
        return dir.join("vtrain_single.csv").is_file().then_some(dir);
    }
    start.ancestors().map(|a| a.join("shared/reference/external")).find(|d| d.join("vtrain_single.csv").is_file())
}

/// Reads one external table; the set is named by the file stem. Errors name the file
/// and line.
pub fn read(path: &Path) -> anyhow::Result<(String, ExternalSet)> {
    if !path.exists() {
        anyhow::bail!("{}: no such file; {}", path.display(), crate::reference::WHERE_IT_IS);
    }
    let text = crate::files::read_text(path)?;
    let set = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "external".into());
    let data = parse(&set, &text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((set, data))
}
