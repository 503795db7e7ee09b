//! The schedule `apply` reads, and the one it applied last: `current.yaml` (the
//! planner's `--current`) and its parsed copy, `current.cache.json`, which spares a
//! round that applies the very same bytes again (a no-op round, cron's retry) the YAML
//! parse of the schedule and the rendering of `current.yaml`.

use std::path::Path;

use anyhow::Context;
use rubick_core::artifact::{Artifact, to_yaml};
use rubick_core::schedule::Schedule;
use rubick_io::files::{Access, parse_artifact, read_text, write_atomic_unsynced};

use super::dir::{StateDir, file_identity, write_if_changed};

/// The schedule last applied as JSON (parsed several times faster than its YAML),
/// after a first line naming what it is a copy of: this build, the length and digest
/// of the bytes it was parsed from, the digest of the JSON below, and the identity of
/// the `current.yaml` written from it. Used only when all of them match (the same
/// bytes applied again, the copy intact); never the record: a copy that does not match
/// is passed over, and written anew once the schedule is applied.
pub const CURRENT_CACHE_FILE: &str = "current.cache.json";

/// A schedule as `apply` read it.
#[derive(Debug)]
pub struct Loaded {
    pub schedule: Schedule,
    /// The first line's start for these bytes (build, length, digest).
    key: String,
    /// The identity of the `current.yaml` made of these very bytes, as the copy recorded
    /// it (`None` when the schedule was parsed).
    current: Option<String>,
}

/// The start of the first line of a copy of a schedule read as `text`.
fn key_of(text: &str) -> String {
    let digest = rubick_launch::digest(text.as_bytes());
    format!("rubick-run {} schedule {} {digest:016x}", env!("CARGO_PKG_VERSION"), text.len())
}

/// Reads and checks the schedule at `path` (`-`: stdin): from the parsed copy in the
/// state directory `root` when it was made of these very bytes and is intact, else
/// parsed (errors name the path). Needs no lock: the copy vouches for itself.
pub fn load_schedule(path: &Path, root: &Path) -> anyhow::Result<Loaded> {
    let text = read_text(path)?;
    let key = key_of(&text);
    if let Some((schedule, current)) = cached(&root.join(CURRENT_CACHE_FILE), &key) {
        return Ok(Loaded { schedule, key, current: Some(current) });
    }
    let schedule: Schedule = parse_artifact(path, &text)?;
    Ok(Loaded { schedule, key, current: None })
}

/// The copy at `cache` if it was made of the bytes whose key is `key` and its JSON is
/// the one it was written with: the schedule, and the identity of `current.yaml` then.
fn cached(cache: &Path, key: &str) -> Option<(Schedule, String)> {
    let bytes = std::fs::read(cache).ok()?;
    let newline = bytes.iter().position(|&b| b == b'\n')?;
    let (first, json) = (std::str::from_utf8(&bytes[..newline]).ok()?, &bytes[newline + 1..]);
    let rest = first.strip_prefix(key)?.strip_prefix(' ')?;
    let (body, current) = rest.split_once(' ')?;
    if body != format!("{:016x}", rubick_launch::digest(json)) {
        return None;
    }
    let schedule: Schedule = serde_json::from_slice(json).ok()?;
    schedule.validate().ok()?;
    Some((schedule, current.to_owned()))
}

impl StateDir {
    /// Records `loaded` as the schedule applied: `current.yaml` written unless it is the
    /// very file made of these bytes (or holds them already), then its parsed copy
    /// (not synced: a copy lost is one more parse). The copy is written only when its
    /// JSON reads back as the very schedule the YAML gave (every float to the bit), so
    /// that a round reading it acts as one parsing the YAML would.
    pub fn write_current(&self, loaded: &Loaded) -> anyhow::Result<()> {
        let path = self.current_path();
        let identity = file_identity(&path);
        if loaded.current.is_some() && loaded.current == identity {
            return Ok(());
        }
        write_if_changed(&path, to_yaml(&loaded.schedule).as_bytes())?;
        let Some(identity) = file_identity(&path) else { return Ok(()) };
        let cache = self.root.join(CURRENT_CACHE_FILE);
        let write = || -> anyhow::Result<()> {
            let json = serde_json::to_string(&loaded.schedule)?;
            let back: Schedule = serde_json::from_str(&json)?;
            if back != loaded.schedule || serde_json::to_string(&back)? != json {
                let _ = std::fs::remove_file(&cache);
                return Ok(());
            }
            let digest = rubick_launch::digest(json.as_bytes());
            let text = format!("{} {digest:016x} {identity}\n{json}", loaded.key);
            write_atomic_unsynced(&cache, text.as_bytes(), Access::Private)
                .with_context(|| format!("{}: not written", cache.display()))?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::debug!("{e:#}");
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use std::time::Duration;

    use super::*;

    const SCHEDULE: &str = "apiVersion: rubick/v1\nkind: Schedule\ncluster: c\nround: 1\npolicy: p\nassignments:\n  - { job: a, plan: dp1-tp1-pp1-mb4-ga4, nodes: [{ node: n-0, gpus: [0], cpus: 1, hostMemoryGib: 0.1 }], predictedThroughput: 0.30000000000000004, change: started }\ntotals: { gpusUsed: 1, gpusTotal: 8, cpusUsed: 1, hostMemoryGibUsed: 0.1, normalizedThroughput: 1 }\nobjective: 1.7976931348623157e308\nsolver: { method: bench, status: optimal }\n";

    /// The same bytes applied again are read from the copy, and `current.yaml` is left
    /// alone; other bytes, an edited copy or an edited `current.yaml` are not: parsed,
    /// and `current.yaml` written as before.
    #[test]
    fn the_copy_is_read_only_for_the_same_bytes_and_an_intact_copy() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        let input = root.path().join("round.yaml");
        std::fs::write(&input, SCHEDULE).unwrap();
        let first = load_schedule(&input, root.path()).unwrap();
        assert!(first.current.is_none(), "no copy yet: parsed");
        let parsed: Schedule = parse_artifact(&input, SCHEDULE).unwrap();
        assert_eq!(first.schedule, parsed);
        dir.write_current(&first).unwrap();
        let current = std::fs::read_to_string(dir.current_path()).unwrap();
        assert_eq!(current, to_yaml(&parsed));
        // Read back from the copy: the very schedule, every float to the bit.
        let again = load_schedule(&input, root.path()).unwrap();
        assert!(again.current.is_some(), "the copy is read");
        assert_eq!(again.schedule, parsed);
        assert_eq!(serde_json::to_string(&again.schedule).unwrap(), serde_json::to_string(&parsed).unwrap());
        let id = file_identity(&dir.current_path());
        dir.write_current(&again).unwrap();
        assert_eq!(file_identity(&dir.current_path()), id, "current.yaml is not rewritten");
        // current.yaml edited: written again from the schedule.
        std::fs::write(dir.current_path(), "edited").unwrap();
        let again = load_schedule(&input, root.path()).unwrap();
        dir.write_current(&again).unwrap();
        assert_eq!(std::fs::read_to_string(dir.current_path()).unwrap(), current);
        // The copy edited under its first line: passed over.
        let cache = root.path().join(CURRENT_CACHE_FILE);
        let text = std::fs::read_to_string(&cache).unwrap();
        let edited = text.replace("\"gpus\":[0]", "\"gpus\":[1]");
        assert_ne!(edited, text);
        std::fs::write(&cache, &edited).unwrap();
        let read = load_schedule(&input, root.path()).unwrap();
        assert!(read.current.is_none(), "an edited copy is not read");
        assert_eq!(read.schedule, parsed);
        // Other bytes (the next round): parsed.
        std::fs::write(&input, SCHEDULE.replace("round: 1", "round: 2")).unwrap();
        let next = load_schedule(&input, root.path()).unwrap();
        assert!(next.current.is_none());
        assert_eq!(next.schedule.round, 2);
    }
}
