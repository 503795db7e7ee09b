//! The resources' names and labels: DNS-1123 labels and label values made of a job's
//! name and attempt, never shared by two jobs.

use std::path::Path;

/// The longest resource name generated (pods and services append to it).
pub const MAX_NAME: usize = 48;

/// `text` as a DNS-1123 label's characters: lowercase, runs of anything but
/// `[a-z0-9]` as one `-`, no `-` at either end.
fn dns_chars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars().map(|c| c.to_ascii_lowercase()) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

/// Whether `name` is a DNS-1123 label (what the resources' names must be here).
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The resources' name of attempt `attempt` of job `job`: `rubick-JOB-ATTEMPT`,
/// sanitised (see the module's documentation).
pub fn resource_name(job: &str, attempt: &str) -> String {
    let attempt = {
        let a = dns_chars(attempt);
        let a = if a.is_empty() { "0".to_owned() } else { a };
        if a.len() > 10 { format!("{:08x}", crate::fnv1a(attempt.as_bytes()) as u32) } else { a }
    };
    let budget = MAX_NAME - "rubick-".len() - 1 - attempt.len();
    let clean = dns_chars(job);
    let part = if clean == job && !clean.is_empty() && clean.len() <= budget {
        clean
    } else {
        let hash = format!("{:06x}", crate::fnv1a(job.as_bytes()) & 0xff_ffff);
        let mut head = clean;
        head.truncate(budget - hash.len() - 1);
        let head = head.trim_end_matches('-');
        if head.is_empty() { hash } else { format!("{head}-{hash}") }
    };
    format!("rubick-{part}-{attempt}")
}

/// `text` as a label value: `[A-Za-z0-9_.-]`, at most 63, alphanumeric at both ends.
pub(crate) fn label_value(text: &str) -> String {
    let mapped: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' }).collect();
    let mut v: String = mapped.chars().take(63).collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    v.trim_start_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The attempt of a run's directory `.../attempt-N`.
pub(crate) fn attempt_of(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name.strip_prefix("attempt-").unwrap_or(name).to_owned()
}
