//! The state directory on disk: [`StateDir`], locked while it lives; `state.yaml`
//! read (through its cache while the seal vouches for both) and written atomically;
//! the seal and the intent of a round's starts, which decide when the processes are
//! searched for runs without a record.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use rubick_io::files::{Access, write_atomic_as, write_atomic_unsynced};
use serde::Deserialize;

use super::{STATE_VERSION, State};

/// The state's file in its directory.
pub const STATE_FILE: &str = "state.yaml";

/// The state as JSON (parsed several times faster than its YAML: every command of every
/// round reads the state), after a first line naming what it is a copy of: this build
/// and a digest of `state.yaml`'s bytes. Used only when both match (a hand edit, a
/// restore, another build, a crash between the two writes: `state.yaml` is parsed,
/// and the copy written again); never the record.
pub const CACHE_FILE: &str = "state.cache.json";

/// The first line of a cache of `yaml` written by this build.
fn cache_key(yaml: &[u8]) -> String {
    let digest = rubick_launch::digest(yaml);
    format!("rubick-run {} state {STATE_VERSION} yaml {} {digest:016x}", env!("CARGO_PKG_VERSION"), yaml.len())
}

/// An open state directory, locked for as long as it lives.
#[derive(Debug)]
pub struct StateDir {
    pub root: PathBuf,
    _lock: File,
    /// The state as this process last read or wrote it (under the lock, nobody else
    /// writes it): a save of an equal state writes nothing (a no-op round spends no
    /// serialisation, no temporary file and no fsyncs).
    on_disk: std::sync::Mutex<Option<State>>,
    /// `state.yaml`'s identity (see [`file_identity`]) when this process last read or
    /// wrote it.
    identity: std::sync::Mutex<Option<String>>,
    /// Whether the state last loaded may not record every live run (see
    /// [`StateDir::needs_search`]): decided when it is read, before any save seals it.
    search: std::sync::atomic::AtomicBool,
}

/// Where the identities of the `state.yaml` (and of its cache) this build last wrote, or
/// last found to agree with the live runs, are kept: see [`StateDir::sealed`].
pub const SEAL_FILE: &str = "state.seal";

/// The intent of a round's starts (their run directories, one a line): written before
/// the first is launched, removed once every one is recorded with its handle (or found
/// by the next command): see [`StateDir::needs_search`].
pub const INTENT_FILE: &str = "starting";

/// A file's identity as the file system tells it (device, inode, modification time to
/// the nanosecond, length): any write, copy or restore of the file changes it.
pub(super) fn file_identity(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(format!("{} {} {}.{:09} {}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.len()))
}

impl StateDir {
    /// Opens (with `create`: makes) the state directory at `root`, resolved once, and
    /// takes its lock, waiting up to `wait` for a round in progress; then fails with a
    /// message saying so (the caller exits 1). Without `create`, a directory that holds
    /// no state is an error.
    pub fn open(root: &Path, wait: Duration, create: bool) -> anyhow::Result<Result<StateDir, String>> {
        let root = &std::path::absolute(root).with_context(|| format!("{}: not a usable path", root.display()))?;
        if !create && !root.join(STATE_FILE).exists() {
            anyhow::bail!(
                "{}: not a rubick-run state (no {STATE_FILE}); `rubick-run submit` makes one",
                root.display()
            );
        }
        std::fs::create_dir_all(root)
            .with_context(|| format!("{}: cannot create the state directory", root.display()))?;
        // Resolved once (symlinks, `..`): the runs' marks, handles and directories name
        // the state by this one path, whichever path a command was given.
        let root = &root.canonicalize().with_context(|| format!("{}: cannot resolve", root.display()))?;
        let path = root.join("lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("{}: cannot open", path.display()))?;
        let start = Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Ok(Err(format!(
                        "{}: another rubick-run holds it (a round in progress); waited {:.0} s, did nothing",
                        path.display(),
                        wait.as_secs_f64()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("{}: lock", path.display()));
                }
            }
        }
        Ok(Ok(StateDir {
            root: root.to_path_buf(),
            _lock: lock,
            on_disk: std::sync::Mutex::new(None),
            identity: std::sync::Mutex::new(None),
            search: std::sync::atomic::AtomicBool::new(true),
        }))
    }

    pub fn state_path(&self) -> PathBuf {
        self.root.join(STATE_FILE)
    }

    pub fn current_path(&self) -> PathBuf {
        self.root.join("current.yaml")
    }

    pub fn job_dir(&self, job: &str) -> PathBuf {
        self.root.join("jobs").join(job)
    }

    pub fn attempt_dir(&self, job: &str, attempt: u32) -> PathBuf {
        self.job_dir(job).join(format!("attempt-{attempt}"))
    }

    /// The state (empty when there is none yet). A newer format is refused.
    pub fn load(&self) -> anyhow::Result<State> {
        let path = self.state_path();
        // Taken before the reads: a change in between reads as unsealed (the safe side).
        let yaml_id = file_identity(&path);
        let cache_id = file_identity(&self.root.join(CACHE_FILE));
        self.set_identity(yaml_id.as_deref(), cache_id.as_deref());
        let seal = std::fs::read_to_string(self.root.join(SEAL_FILE)).ok();
        // The records are the state.yaml this build last wrote or searched for, and no
        // start was interrupted: every live run of the directory has its record.
        let records_sealed = yaml_id.as_ref().is_some_and(|y| seal_of_yaml(seal.as_deref()) == Some(y.as_str()));
        let interrupted = self.root.join(INTENT_FILE).exists();
        self.search.store(!records_sealed || interrupted, std::sync::atomic::Ordering::Relaxed);
        if !path.exists() {
            return Ok(State::default());
        }
        // Its bytes are digested for the cache's key; they are checked as text only when
        // parsed (the cache spares a no-op round that pass over a hundred kilobytes).
        let bytes = std::fs::read(&path).with_context(|| format!("{}: cannot read", path.display()))?;
        let key = cache_key(&bytes);
        let valid = |state: State| -> anyhow::Result<State> {
            state.validate().and_then(|()| state.check_handles(&self.root)).map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e}; the state is refused as it is (fix or restore it; nothing was done)",
                    path.display()
                )
            })?;
            Ok(state)
        };
        // The cache only while the seal vouches for both files as this build left them.
        if self.identity_is(seal.as_deref())
            && let Some(state) = self.cached(&key)
        {
            let state = valid(state)?;
            *self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(state.clone());
            return Ok(state);
        }
        let newer = |version: u32| {
            anyhow::anyhow!(
                "{}: version: {version} is newer than this rubick-run understands ({STATE_VERSION}); use a newer rubick-run",
                path.display(),
            )
        };
        let text = String::from_utf8(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            .with_context(|| format!("{}: cannot read", path.display()))?;
        // Parsed once (every command reads it); a state this build cannot read is told
        // apart by its version alone: a newer one is named as such.
        let state: State = match serde_yaml_ng::from_str(&text) {
            Ok(state) => state,
            Err(e) => {
                #[derive(Deserialize)]
                struct Version {
                    version: u32,
                }
                let version: Version =
                    serde_yaml_ng::from_str(&text).with_context(|| format!("{}: version", path.display()))?;
                if version.version > STATE_VERSION {
                    return Err(newer(version.version));
                }
                return Err(anyhow::Error::new(e).context(format!("{}: not a rubick-run state", path.display())));
            }
        };
        if state.version > STATE_VERSION {
            return Err(newer(state.version));
        }
        let state = valid(state)?;
        // A new cache is a new file: sealed with the state.yaml it copies when the seal
        // vouched for that file (the records need no search for the cache's sake: it
        // was not read), else once a search for unrecorded runs found them true.
        self.write_cache(&key, &state);
        self.set_identity(yaml_id.as_deref(), file_identity(&self.root.join(CACHE_FILE)).as_deref());
        if records_sealed {
            self.seal();
        }
        *self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(state.clone());
        Ok(state)
    }

    /// What this process knows of the two files the seal vouches for: `state.yaml`'s
    /// identity and the cache's (none when `state.yaml` is absent).
    fn set_identity(&self, yaml: Option<&str>, cache: Option<&str>) {
        *self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            yaml.map(|y| format!("{y}\n{}", cache.unwrap_or("-")));
    }

    /// Whether `seal` (the seal file's text) holds the identities this process knows.
    fn identity_is(&self, seal: Option<&str>) -> bool {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        identity.as_deref().is_some_and(|id| seal == Some(id))
    }

    /// The cached state, if the cache is a copy of the YAML whose key is `key`.
    fn cached(&self, key: &str) -> Option<State> {
        let bytes = std::fs::read(self.root.join(CACHE_FILE)).ok()?;
        let newline = bytes.iter().position(|&b| b == b'\n')?;
        let (first, json) = (&bytes[..newline], &bytes[newline + 1..]);
        (first == key.as_bytes()).then(|| serde_json::from_slice(json).ok())?
    }

    /// Writes the cache of the state whose YAML has `key` (atomically; a cache that
    /// cannot be written is only parsed again next time).
    fn write_cache(&self, key: &str, state: &State) {
        let write = || -> anyhow::Result<()> {
            let mut text = format!("{key}\n").into_bytes();
            serde_json::to_writer(&mut text, state)?;
            write_atomic_unsynced(&self.root.join(CACHE_FILE), &text, Access::Private)?;
            Ok(())
        };
        if let Err(e) = write() {
            tracing::debug!("{}: not written: {e:#}", self.root.join(CACHE_FILE).display());
        }
    }

    /// Writes the state atomically and durably, unless it equals what is on disk but
    /// for the iterations runs have done (what every command reads from their metric
    /// lines again: not worth an fsync of its own; written with the next real change).
    pub fn save(&self, state: &State) -> anyhow::Result<()> {
        let mut on_disk = self.on_disk.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if on_disk.as_ref().is_some_and(|old| old.equal_but_progress(state)) {
            return Ok(());
        }
        let yaml = serde_yaml_ng::to_string(state)?;
        write_private(&self.state_path(), yaml.as_bytes())?;
        self.write_cache(&cache_key(yaml.as_bytes()), state);
        *on_disk = Some(state.clone());
        let yaml_id = file_identity(&self.state_path());
        self.set_identity(yaml_id.as_deref(), file_identity(&self.root.join(CACHE_FILE)).as_deref());
        self.seal();
        Ok(())
    }

    /// Whether the `state.yaml` this process read, and the cache beside it, are the very
    /// files this build last wrote or found to agree with the live runs
    /// ([`StateDir::seal`]): not edited, copied or restored since. Only then is the cache
    /// read, and may a command trust that every live run of the directory has its
    /// record and skip the search of all processes for runs without one. A missing or
    /// unreadable seal, a cache that is not the one sealed (edited under its first line,
    /// rewritten, lost), or a state that was absent, is not sealed.
    pub fn sealed(&self) -> bool {
        self.identity_is(std::fs::read_to_string(self.root.join(SEAL_FILE)).ok().as_deref())
    }

    /// Whether a live run of the directory may lack a record, as the state last loaded
    /// says: its `state.yaml` is not the file this build last wrote or found to agree
    /// with the live runs (restored, edited, or absent), or the intent of a round's
    /// starts is there ([`INTENT_FILE`]: a rubick-run was killed between writing it and
    /// recording the runs it launched). Then, and only then, a command searches every
    /// process for the directory's runs (a no-op round spends none on it); a cache
    /// rewritten or lost is not a reason (it was not read).
    pub fn needs_search(&self) -> bool {
        self.search.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the intent of starting runs in `dirs`, before the first is launched
    /// (readable by its owner only; not synced: a machine that loses it lost the runs
    /// with it).
    pub fn intend_starts(&self, dirs: &[&Path]) -> anyhow::Result<()> {
        let text: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        let path = self.root.join(INTENT_FILE);
        write_atomic_unsynced(&path, text.as_bytes(), Access::Private)
            .with_context(|| format!("{}: the intent of the round's starts", path.display()))
    }

    /// Records that the live runs agree with the records again (the starts recorded, or a
    /// search found every run without one): the intent removed, the state sealed.
    pub fn searched(&self) {
        let path = self.root.join(INTENT_FILE);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("{}: cannot remove it ({e}): the next command searches the processes again", path.display());
        }
        self.search.store(false, std::sync::atomic::Ordering::Relaxed);
        self.seal();
    }

    /// Records that the `state.yaml` last read or written agrees with the live runs
    /// (this build wrote it, or a search found no run without a record). Not durable:
    /// a seal lost is one more search.
    pub fn seal(&self) {
        let identity = self.identity.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(id) = identity else { return };
        if let Err(e) = write_atomic_unsynced(&self.root.join(SEAL_FILE), id.as_bytes(), Access::Private) {
            tracing::debug!("{}: not written: {e}", self.root.join(SEAL_FILE).display());
        }
    }
}

/// `state.yaml`'s identity in the text of a seal (its first line).
fn seal_of_yaml(seal: Option<&str>) -> Option<&str> {
    seal.map(|s| s.split_once('\n').map_or(s, |(yaml, _)| yaml))
}

/// [`write_atomic_as`] (readable by its owner only) unless the file already holds
/// exactly `bytes` (a no-op round rewrites nothing).
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    write_private(path, bytes)
}

/// A file of the state directory, written atomically and durably, readable by its owner
/// only (the state holds jobs' environments).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(write_atomic_as(path, bytes, Access::Private)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_read_only_while_it_copies_state_yaml() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        let state = State { round: Some(3), ..State::default() };
        dir.save(&state).unwrap();
        let yaml = std::fs::read_to_string(dir.state_path()).unwrap();
        let cache = std::fs::read_to_string(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(cache.lines().next(), Some(cache_key(yaml.as_bytes()).as_str()));
        assert_eq!(dir.load().unwrap(), state);
        // A cache keyed by this YAML, written and sealed by this build, is what a load
        // reads (one that says otherwise is believed: the proof that it is read)...
        dir.write_cache(&cache_key(yaml.as_bytes()), &State { round: Some(4), ..State::default() });
        dir.set_identity(
            file_identity(&dir.state_path()).as_deref(),
            file_identity(&root.path().join(CACHE_FILE)).as_deref(),
        );
        dir.seal();
        assert_eq!(dir.load().unwrap().round, Some(4));
        // ...and any change to state.yaml (a hand edit) outdates it: the YAML is parsed,
        // and the cache written again for it.
        let edited = yaml.replace("round: 3", "round: 5");
        assert_ne!(edited, yaml);
        std::fs::write(dir.state_path(), &edited).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(5));
        let cache = std::fs::read_to_string(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(cache.lines().next(), Some(cache_key(edited.as_bytes()).as_str()));
        // A cache that is not JSON of a state is passed over.
        std::fs::write(root.path().join(CACHE_FILE), format!("{}\n{{garbage", cache_key(edited.as_bytes()))).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(5));
    }

    /// Found by an adversarial pass: "a `state.cache.json` edited under its unchanged
    /// first line (run removed, status queued) is trusted and the search for unrecorded
    /// runs is skipped: `stop` reaches nothing, `delete` orphans the wrapper and its
    /// child". The edited cache is never read (state.yaml, the record, is), so the
    /// records need no search for it; the cache is written anew and sealed.
    #[test]
    fn a_cache_edited_under_its_first_line_is_not_read_and_is_written_anew() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        dir.save(&State { round: Some(3), ..State::default() }).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3));
        assert!(dir.sealed());
        let cache = root.path().join(CACHE_FILE);
        let text = std::fs::read_to_string(&cache).unwrap();
        let edited = text.replace("\"round\":3", "\"round\":9");
        assert_ne!(edited, text);
        std::fs::write(&cache, &edited).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3), "state.yaml is the record, not an edited cache");
        assert!(!dir.needs_search(), "the records are the state.yaml this build wrote");
        assert_eq!(std::fs::read_to_string(&cache).unwrap(), text, "the cache written anew from the record");
        assert!(dir.sealed(), "and sealed with it");
        assert_eq!(dir.load().unwrap().round, Some(3));
    }

    /// The search of every process for runs without a record is made only when a live
    /// run may lack one: a state.yaml this build did not write (restored) or an
    /// interrupted round's starts (their intent left); never for a cache lost.
    #[test]
    fn a_search_is_needed_only_for_a_state_not_written_here_or_an_interrupted_start() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "no state yet: nothing vouches for the directory's processes");
        dir.save(&State { round: Some(3), ..State::default() }).unwrap();
        dir.load().unwrap();
        assert!(!dir.needs_search());
        std::fs::remove_file(root.path().join(CACHE_FILE)).unwrap();
        assert_eq!(dir.load().unwrap().round, Some(3));
        assert!(!dir.needs_search(), "a lost cache is rebuilt, not searched for");
        assert!(dir.sealed(), "the rebuilt cache is sealed: the next command reads it");
        dir.intend_starts(&[&dir.attempt_dir("a", 1)]).unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "a start may have been interrupted");
        dir.save(&State { round: Some(4), ..State::default() }).unwrap();
        assert!(dir.needs_search(), "decided when read: a save does not clear it");
        dir.searched();
        assert!(!root.path().join(INTENT_FILE).exists() && !dir.needs_search());
        dir.load().unwrap();
        assert!(!dir.needs_search());
        let yaml = std::fs::read(dir.state_path()).unwrap();
        std::fs::write(dir.state_path(), &yaml).unwrap();
        dir.load().unwrap();
        assert!(dir.needs_search(), "the same bytes restored are another file");
    }

    #[test]
    fn a_state_is_sealed_only_while_it_is_the_file_this_build_wrote_or_checked() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), Duration::ZERO, true).unwrap().unwrap();
        assert!(!dir.sealed(), "no state yet: nothing says the runs all have records");
        let state = State { round: Some(3), ..State::default() };
        dir.save(&state).unwrap();
        assert!(dir.sealed());
        dir.load().unwrap();
        assert!(dir.sealed(), "read back as written");
        // The same bytes written again (a backup restored over it) are another file.
        let yaml = std::fs::read(dir.state_path()).unwrap();
        std::fs::write(dir.state_path(), &yaml).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed(), "restored: its runs must be searched for");
        dir.seal();
        assert!(dir.sealed(), "searched");
        // A copy put in place by rename, and a lost seal, are not sealed either.
        let copy = root.path().join("copy.yaml");
        std::fs::write(&copy, &yaml).unwrap();
        std::fs::rename(&copy, dir.state_path()).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed());
        dir.seal();
        std::fs::remove_file(root.path().join(SEAL_FILE)).unwrap();
        assert!(!dir.sealed());
        // A directory that lost its state.yaml is never sealed.
        dir.seal();
        std::fs::remove_file(dir.state_path()).unwrap();
        dir.load().unwrap();
        assert!(!dir.sealed());
    }
}
