//! The comparison's report, one renderer per format: a text table for a terminal,
//! Markdown for a pull request, JUnit XML for a CI's test view.

use std::fmt::Write as _;

use rubick_core::markdown;

use super::{Comparison, Format, Report, Side, Verdict};

impl Format {
    /// The format of the file this report is (for the check of an output's name).
    pub fn file_format(self) -> rubick_io::Format {
        match self {
            Format::Text => rubick_io::Format::Text,
            Format::Markdown => rubick_io::Format::Markdown,
            Format::Junit => rubick_io::Format::Xml,
        }
    }

    /// `report` in this format.
    pub fn render(self, report: &Report) -> String {
        match self {
            Format::Text => text(report),
            Format::Markdown => markdown(report),
            Format::Junit => junit(report),
        }
    }
}

/// A side's cell: its median and spread, the statuses of the runs that did not
/// measure, or `-` when the profile lacks the configuration.
fn side(side: Option<&Side>) -> String {
    match side {
        Some(s) if s.runs > 0 => format!("{:.3} ± {:.3} (n={})", s.median, s.spread, s.runs),
        Some(s) => s.not_measured.join(","),
        None => "-".into(),
    }
}

/// The cells every format shows: baseline, new, change, p (slower).
fn cells(c: &Comparison) -> [String; 4] {
    [
        side(c.baseline.as_ref()),
        side(c.new.as_ref()),
        c.change.map_or_else(|| "-".to_owned(), |x| format!("{:+.1}%", x * 100.0)),
        c.p_slower.map_or_else(|| "-".to_owned(), |x| format!("{x:.3}")),
    ]
}

/// Aligned columns, the verdict and its reason last.
fn text(report: &Report) -> String {
    let mut out = format!(
        "{:<34} {:>9} {:>26} {:>26} {:>8} {:>7}  verdict\n",
        "plan", "placement", "baseline samples/s", "new samples/s", "change", "p"
    );
    for c in &report.comparisons {
        let [base, new, change, p] = cells(c);
        let _ = writeln!(
            out,
            "{:<34} {:>9} {base:>26} {new:>26} {change:>8} {p:>7}  {}: {}",
            c.plan, c.placement, c.verdict, c.reason
        );
    }
    out
}

/// A Markdown table, regressions in bold.
fn markdown(report: &Report) -> String {
    let mut table = markdown::Table::new(&[
        "plan",
        "placement",
        "baseline samples/s",
        "new samples/s",
        "change",
        "p (slower)",
        "verdict",
    ]);
    for c in &report.comparisons {
        let verdict = if c.verdict == Verdict::Regressed {
            format!("**{}**: {}", c.verdict, c.reason)
        } else {
            format!("{}: {}", c.verdict, c.reason)
        };
        let [base, new, change, p] = cells(c);
        table.row(&[format!("`{}`", c.plan), c.placement.clone(), base, new, change, p, verdict]);
    }
    table.to_string()
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
}

/// JUnit XML: one test suite (the job), one test case per configuration, a failure
/// per regression, a skip per configuration not compared.
fn junit(report: &Report) -> String {
    let comparisons = &report.comparisons;
    let failures = comparisons.iter().filter(|c| c.verdict == Verdict::Regressed).count();
    let skipped = comparisons.iter().filter(|c| c.verdict == Verdict::Incomparable).count();
    let n = comparisons.len();
    let suite = xml_escape(&report.suite);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"rubick-profile compare\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">"
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"{suite}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">"
    );
    for c in comparisons {
        let name = xml_escape(&format!("{} on {}", c.plan, c.placement));
        let [base, new, change, p] = cells(c);
        let detail = xml_escape(&format!("baseline {base}; new {new}; change {change}; p(slower) {p}"));
        let _ = write!(out, "    <testcase classname=\"{suite}\" name=\"{name}\">");
        match c.verdict {
            Verdict::Regressed => {
                let _ = write!(
                    out,
                    "<failure message=\"{}\" type=\"regression\">{detail}</failure>",
                    xml_escape(&c.reason)
                );
            }
            Verdict::Incomparable => {
                let _ = write!(out, "<skipped message=\"{}\"/>", xml_escape(&c.reason));
            }
            Verdict::Ok | Verdict::Improved => {
                let _ = write!(out, "<system-out>{detail}</system-out>");
            }
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}
