//! The test Slurm's nodes: drained by a test, resumed when it ends.

use std::process::Command;

/// Drains a node of the test Slurm (`scontrol update ... state=drain`).
pub fn drain(node: &str) {
    let ok = Command::new("scontrol")
        .args(["update", &format!("nodename={node}"), "state=drain", "reason=rubick-test"])
        .status()
        .expect("scontrol runs");
    assert!(ok.success(), "scontrol update nodename={node} state=drain");
}

/// Resumes the nodes when dropped (a failed test leaves none drained).
#[derive(Debug)]
pub struct Undrain(pub Vec<String>);

impl Drop for Undrain {
    fn drop(&mut self) {
        for node in &self.0 {
            // A node that was never drained refuses the resume: nothing to say.
            let _ = Command::new("scontrol").args(["update", &format!("nodename={node}"), "state=resume"]).output();
        }
    }
}
