//! The processes a test starts: reaped when it ends, however it ends.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Kills, when dropped, every process whose command line or environment names `.0`:
/// a test that fails half-way leaves no workload of its temporary directory running.
#[derive(Debug)]
pub struct Reaper(pub PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        let needle = self.0.display().to_string();
        let me = std::process::id();
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if pid == me {
                continue;
            }
            let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
            let named = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).contains(&needle);
            if named(read("cmdline")) || named(read("environ")) {
                let _ = Command::new("kill").args(["-s", "KILL", &pid.to_string()]).status();
            }
        }
    }
}

/// Whether process `pid` lives (exists and is not a zombie).
pub fn alive(pid: &str) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    state.rsplit(')').next().and_then(|s| s.split_whitespace().next()).is_some_and(|s| s != "Z")
}

/// `DIR/escaper.sh`: starts `sleep 300` in a session of its own (as torchrun starts its
/// workers), writes its pid to `DIR/escaped.pid`, then becomes `sh DIR/work.sh`.
pub fn escaping_script(dir: &Path) -> PathBuf {
    let script = dir.join("escaper.sh");
    let text = format!(
        "setsid sleep 300 &\necho $! > {}\nexec sh {}\n",
        dir.join("escaped.pid").display(),
        dir.join("work.sh").display()
    );
    std::fs::write(&script, text).expect("the escaper script");
    script
}
