//! `state.yaml` parsed as the document it is, its jobs' records on a few threads: what a
//! command does when the state's parsed copy cannot be read (lost, another build's, a
//! hand edit), where the YAML of a hundred jobs takes milliseconds to parse.

use std::collections::BTreeMap;

use super::{JobRecord, State};

/// Jobs below this many are parsed as one document: threads would cost more.
const PARTS_FROM: usize = 16;

/// `text` parsed as a [`State`]. In the layout this build writes (top-level keys, then
/// `jobs:` and under it each job's record at two spaces, every line of it at four or
/// more) each record is a document of its own, parsed on a few threads, and the rest a
/// document with no jobs; any other text (flow style, anchors, tags, directives, keys
/// after `jobs`), and any part that does not parse, is parsed as one document, which
/// decides and names any error. A record parsed alone is the record the whole document
/// holds: nothing in the layout refers across records.
pub(super) fn parse_state(text: &str) -> Result<State, serde_yaml_ng::Error> {
    match in_parts(text) {
        Some(state) => Ok(state),
        None => serde_yaml_ng::from_str(text),
    }
}

/// The parse in parts, or `None` where the text is not in the layout or a part does not
/// parse (then the whole document is parsed).
fn in_parts(text: &str) -> Option<State> {
    // No anchors, aliases, tags or directives anywhere: a record could then depend on
    // another part (the same bytes in a string only cost the parse in parts).
    if text.bytes().any(|b| matches!(b, b'&' | b'*' | b'!' | b'%' | b'\t' | b'\r')) {
        return None;
    }
    let jobs_at = if text.starts_with("jobs:\n") { 0 } else { text.find("\njobs:\n")? + 1 };
    let (head, body) = (&text[..jobs_at], &text[jobs_at + "jobs:\n".len()..]);
    // The head: top-level `key: value` lines only.
    if !head.lines().all(|l| l.bytes().next().is_some_and(|b| b.is_ascii_lowercase())) {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    let mut start = 0;
    for (at, line) in line_starts(body) {
        if line.is_empty() || line.starts_with("    ") {
            if parts.is_empty() && at == 0 {
                return None;
            }
            continue;
        }
        // A job's key: two spaces, then the key (not a comment, a sequence, or more).
        let key = line.strip_prefix("  ")?;
        if key.starts_with([' ', '#', '-']) || !key.ends_with(':') {
            return None;
        }
        if at > start {
            parts.push(&body[start..at]);
        }
        start = at;
    }
    parts.push(&body[start..]);
    if parts.len() < PARTS_FROM || parts.first().is_none_or(|p| !p.starts_with("  ")) {
        return None;
    }
    let mut state: State = serde_yaml_ng::from_str(&format!("{head}jobs: {{}}\n")).ok()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
    let chunk = parts.len().div_ceil(threads);
    let parsed: Vec<Option<Vec<BTreeMap<String, JobRecord>>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .chunks(chunk)
            .map(|some| {
                scope.spawn(move || some.iter().map(|p| serde_yaml_ng::from_str(p).ok()).collect::<Option<Vec<_>>>())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    for records in parsed {
        for record in records? {
            // One record a part, each key once (a duplicate is the whole parse's to name).
            let mut record = record.into_iter();
            let (name, job) = record.next()?;
            if record.next().is_some() || state.jobs.insert(name, job).is_some() {
                return None;
            }
        }
    }
    Some(state)
}

/// Each line of `text` (without its newline) with the offset it starts at.
fn line_starts(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut at = 0;
    text.split_inclusive('\n').map(move |l| {
        let start = at;
        at += l.len();
        (start, l.strip_suffix('\n').unwrap_or(l))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;
    use crate::lifecycle;

    fn state(jobs: usize) -> State {
        let mut state = State { round: Some(7), cluster: Some("c".into()), ..State::default() };
        for k in 0..jobs {
            let mut rec = lifecycle::record(1, if k % 3 == 0 { "running" } else { "starting" }, None, 2, &[]);
            rec.job.name = format!("j{k:03}");
            rec.reason = (k % 5 == 0).then(|| format!("a reason\nover two lines: {k}"));
            state.jobs.insert(rec.job.name.clone(), rec);
        }
        state
    }

    /// What this build writes is parsed in parts, to the very state one parse gives.
    #[test]
    fn the_state_this_build_writes_parses_in_parts_as_one_document() {
        for jobs in [PARTS_FROM, 40, 101] {
            let state = state(jobs);
            let text = serde_yaml_ng::to_string(&state).unwrap();
            let whole: State = serde_yaml_ng::from_str(&text).unwrap();
            assert_eq!(in_parts(&text).as_ref(), Some(&whole), "{jobs} jobs");
            assert_eq!(parse_state(&text).unwrap(), whole);
        }
        let few = serde_yaml_ng::to_string(&state(3)).unwrap();
        assert_eq!(in_parts(&few), None, "a few jobs: one document");
        assert_eq!(parse_state(&few).unwrap(), serde_yaml_ng::from_str::<State>(&few).unwrap());
    }

    /// Any text out of the layout, or a part that does not parse, is parsed as one
    /// document: the same state, or the same error.
    #[test]
    fn text_out_of_the_layout_is_parsed_as_one_document() {
        let text = serde_yaml_ng::to_string(&state(20)).unwrap();
        let first = text.find("\n  j001:").unwrap() + 1;
        let edits = [
            // Another top-level key after the jobs.
            format!("{text}round: 9\n"),
            // A duplicate job: the whole parse's to name.
            format!("{text}{}", &text[first..text.find("\n  j002:").unwrap() + 1]),
            // An anchor and its alias across records.
            text.replacen("retriesLeft: 2", "retriesLeft: &r 2", 1).replacen("retriesLeft: 2", "retriesLeft: *r", 1),
            // A record that does not parse.
            text.replacen("attempts: 1", "attempts: many", 1),
            // Comments, a flow mapping, CRLF.
            text.replacen("\n  j001:", "\n  # a comment\n  j001:", 1),
            text.replace('\n', "\r\n"),
            "version: 1\njobs: {}\n".into(),
        ];
        for edit in &edits {
            assert!(in_parts(edit).is_none(), "{edit}");
            let whole = serde_yaml_ng::from_str::<State>(edit);
            let parsed = parse_state(edit);
            match (&whole, &parsed) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{edit}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                _ => panic!("one parse and the other differ: {whole:?} / {parsed:?}"),
            }
        }
    }
}
