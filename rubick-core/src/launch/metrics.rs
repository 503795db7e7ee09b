//! The metric protocol: the JSON lines a run reports ([`MetricLine`], the one parser of
//! them), and the figures read from them.

use serde::{Deserialize, Serialize};

/// One line of the metric protocol (`{"rubick":1,...}`). Its numbers may be Python's
/// `NaN`, `Infinity` and `-Infinity`, which `json.dumps` writes by default (a diverging
/// job's loss): see [`MetricLine::parse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetricLine {
    /// A finished iteration.
    Iteration {
        rubick: u32,
        iter: u64,
        #[serde(deserialize_with = "number")]
        iter_time_s: f64,
        #[serde(default, deserialize_with = "optional_number")]
        forward_s: Option<f64>,
        #[serde(default, deserialize_with = "optional_number")]
        backward_sync_s: Option<f64>,
        #[serde(default, deserialize_with = "optional_number")]
        optimizer_s: Option<f64>,
        #[serde(default)]
        samples: Option<u64>,
        #[serde(default, deserialize_with = "optional_number")]
        peak_memory_gib: Option<f64>,
        /// The training loss as the script reported it: NaN or an infinity when the job
        /// diverges (never a time: nothing fits or plans on it).
        #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "optional_number")]
        loss: Option<f64>,
    },
    /// `checkpointed` (at `iter`; `save_s`: the seconds its save took, when the script
    /// says) or `oom`.
    Event {
        rubick: u32,
        event: String,
        #[serde(default)]
        iter: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "optional_number")]
        save_s: Option<f64>,
    },
}

/// Python's names of the numbers JSON has none for, as `json.dumps` writes them.
const NON_FINITE: [(&str, f64); 3] = [("-Infinity", f64::NEG_INFINITY), ("Infinity", f64::INFINITY), ("NaN", f64::NAN)];

/// `line` with Python's bare `NaN`, `Infinity` and `-Infinity` (outside strings) quoted,
/// so that a JSON parser takes them, as strings [`number`] reads back.
fn quote_non_finite(line: &str) -> std::borrow::Cow<'_, str> {
    if !NON_FINITE.iter().any(|(name, _)| line.contains(name)) {
        return line.into();
    }
    let mut out = String::with_capacity(line.len() + 8);
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if !in_string && let Some((name, _)) = NON_FINITE.iter().find(|(name, _)| rest.starts_with(name)) {
            out.push('"');
            out.push_str(name);
            out.push('"');
            rest = &rest[name.len()..];
            continue;
        }
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.into()
}

/// A JSON number, or one of Python's non-finite names that [`quote_non_finite`] quoted.
#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Finite(f64),
    Named(String),
}

impl Number {
    fn value<E: serde::de::Error>(self) -> Result<f64, E> {
        match self {
            Number::Finite(v) => Ok(v),
            Number::Named(name) => NON_FINITE
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| E::custom(format!("expected a number, got `{name}`"))),
        }
    }
}

fn number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Number::deserialize(d)?.value()
}

fn optional_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<Number>::deserialize(d)?.map(Number::value).transpose()
}

impl MetricLine {
    /// The protocol line `line` holds, or `None` for any other output (which a
    /// reader counts and otherwise ignores). Every reader of metric lines reads them
    /// here. Python's `NaN`, `Infinity` and `-Infinity` are numbers: a line whose loss
    /// is one is still its iteration (a diverging job is not idle), and keeps the loss;
    /// but no time is ever one. An iteration needs a finite, positive `iter_time_s` (a
    /// line without one is not the protocol); a phase time, peak memory or `save_s`
    /// that is not finite and non-negative is left out, as if not said.
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"rubick\"") {
            return None;
        }
        let mut parsed: MetricLine = serde_json::from_str(&quote_non_finite(line)).ok()?;
        let measured = |v: &mut Option<f64>| {
            if v.is_some_and(|x| !(x.is_finite() && x >= 0.0)) {
                *v = None;
            }
        };
        match &mut parsed {
            MetricLine::Iteration {
                rubick: 1,
                iter_time_s,
                forward_s,
                backward_sync_s,
                optimizer_s,
                peak_memory_gib,
                ..
            } if iter_time_s.is_finite() && *iter_time_s > 0.0 => {
                for v in [forward_s, backward_sync_s, optimizer_s, peak_memory_gib] {
                    measured(v);
                }
            }
            MetricLine::Event { rubick: 1, event, save_s, .. } if event == "checkpointed" || event == "oom" => {
                measured(save_s);
            }
            _ => return None,
        }
        Some(parsed)
    }
}

/// The measured iterations among a run's metric lines: the iteration lines after the
/// first `warmup` of them (by order, since a resumed run numbers on), at most `measured`.
pub fn measured_iterations(lines: &[MetricLine], warmup: u32, measured: Option<u32>) -> Vec<&MetricLine> {
    lines
        .iter()
        .filter(|m| matches!(m, MetricLine::Iteration { .. }))
        .skip(warmup as usize)
        .take(measured.map_or(usize::MAX, |m| m as usize))
        .collect()
}

/// The iteration times of metric lines.
pub fn iteration_times<'a>(lines: impl IntoIterator<Item = &'a MetricLine>) -> Vec<f64> {
    lines
        .into_iter()
        .filter_map(|m| if let MetricLine::Iteration { iter_time_s, .. } = m { Some(*iter_time_s) } else { None })
        .collect()
}

/// Mean and sample standard deviation (0 for one value); `None` for none.
pub fn mean_sd(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = if values.len() > 1 {
        (values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    Some((mean, sd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines_are_recognised_and_other_output_ignored() {
        let it = MetricLine::parse(r#"{"rubick":1,"iter":7,"iter_time_s":0.5,"samples":16}"#).unwrap();
        assert!(matches!(it, MetricLine::Iteration { iter: 7, .. }));
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9}"#).unwrap();
        assert!(matches!(ev, MetricLine::Event { iter: Some(9), save_s: None, .. }));
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9,"save_s":1.5,"format":"sharded"}"#);
        assert!(matches!(ev, Some(MetricLine::Event { iter: Some(9), save_s: Some(s), .. }) if s == 1.5));
        assert!(MetricLine::parse(r#"{"rubick":1,"event":"oom"}"#).is_some());
        for other in
            ["loss 2.3", "{}", r#"{"rubick":2,"iter":1,"iter_time_s":1}"#, r#"{"rubick":1,"iter":1,"iter_time_s":-1}"#]
        {
            assert!(MetricLine::parse(other).is_none(), "{other}");
        }
    }

    /// Regression, "a diverging job looks idle: Python writes metric lines with
    /// `"loss":NaN` / `Infinity` / `-Infinity` (json.dumps allow_nan default), serde
    /// rejects those lines, and `rubick-run status` shows 0 iterations done": the line is
    /// its iteration, with its loss; no time is ever non-finite.
    #[test]
    fn a_diverging_jobs_lines_are_still_its_iterations() {
        for (token, is) in [
            ("NaN", f64::is_nan as fn(f64) -> bool),
            ("Infinity", |v| v == f64::INFINITY),
            ("-Infinity", |v| v == f64::NEG_INFINITY),
        ] {
            let line = format!(r#"{{"rubick":1,"iter":7,"iter_time_s":0.5,"samples":16,"loss":{token}}}"#);
            let Some(MetricLine::Iteration { iter: 7, iter_time_s, loss: Some(loss), .. }) = MetricLine::parse(&line)
            else {
                panic!("{line}: not an iteration");
            };
            assert!(is(loss) && iter_time_s == 0.5, "{line}: {loss}");
        }
        // A name inside a string stays text; Python's spacing (`json.dumps` without
        // separators) parses too.
        let m = MetricLine::parse(
            r#"{"rubick": 1, "iter": 2, "iter_time_s": 0.5, "note": "NaN \"Infinity\"", "loss": NaN}"#,
        );
        assert!(matches!(m, Some(MetricLine::Iteration { iter: 2, loss: Some(l), .. }) if l.is_nan()), "{m:?}");
        // No time is ever one: an iteration without a finite time is not the protocol; a
        // phase time, peak memory or save time that is not finite is left out.
        for time in ["NaN", "Infinity", "-Infinity"] {
            let line = format!(r#"{{"rubick":1,"iter":1,"iter_time_s":{time},"loss":1.0}}"#);
            assert!(MetricLine::parse(&line).is_none(), "{line}");
        }
        let m = MetricLine::parse(
            r#"{"rubick":1,"iter":3,"iter_time_s":0.5,"forward_s":NaN,"backward_sync_s":Infinity,"optimizer_s":-Infinity,"peak_memory_gib":NaN}"#,
        );
        assert!(
            matches!(
                m,
                Some(MetricLine::Iteration {
                    iter: 3,
                    forward_s: None,
                    backward_sync_s: None,
                    optimizer_s: None,
                    peak_memory_gib: None,
                    loss: None,
                    ..
                })
            ),
            "{m:?}"
        );
        let ev = MetricLine::parse(r#"{"rubick":1,"event":"checkpointed","iter":9,"save_s":NaN}"#);
        assert!(matches!(ev, Some(MetricLine::Event { iter: Some(9), save_s: None, .. })), "{ev:?}");
        assert_eq!(
            iteration_times(&[MetricLine::parse(r#"{"rubick":1,"iter":1,"iter_time_s":2,"loss":NaN}"#).unwrap()]),
            [2.0]
        );
        // Other bare words are still not JSON.
        assert!(MetricLine::parse(r#"{"rubick":1,"iter":1,"iter_time_s":0.5,"loss":nan}"#).is_none());
    }
}
