//! A table's rows written as CSV without polars: what `rubick-run` writes of its runs
//! (`jobs/NAME/profile.csv`), byte for byte as `table::write_table` (the `table`
//! feature's polars writer) writes the same rows (a test with the feature compares
//! them), so that a tool that needs no other table links no polars.

use std::path::Path;

use rubick_core::tables::{ColumnType, TableSchema};
use serde_json::Value;

use crate::files::{Format, IoError, check_output, write_output};

/// The rows of a table's row type as CSV text with `schema`'s columns, in its order and
/// types (the header first): a cell of another type than its column's, or absent, is
/// empty; a text cell is quoted when it must be (empty, or holding a comma, a quote or
/// a line break; quotes doubled); a float is written in its shortest round-trip form
/// (`1.0`, `0.25`, `1e-7`; `NaN`, `inf`).
pub fn to_csv<T: serde::Serialize>(rows: &[T], schema: &TableSchema) -> Result<Vec<u8>, IoError> {
    let mut out = Vec::new();
    let header: Vec<&str> = schema.columns.iter().map(|c| c.name).collect();
    for (k, name) in header.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        text_cell(&mut out, name);
    }
    out.push(b'\n');
    for row in rows {
        let value = serde_json::to_value(row).map_err(|e| IoError::table(Path::new(schema.name), e))?;
        for (k, column) in schema.columns.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            let cell = value.get(column.name).unwrap_or(&Value::Null);
            match column.dtype {
                ColumnType::Str => {
                    if let Some(text) = cell.as_str() {
                        text_cell(&mut out, text);
                    }
                }
                ColumnType::Int => {
                    if let Some(n) = cell.as_i64() {
                        out.extend_from_slice(n.to_string().as_bytes());
                    }
                }
                ColumnType::Float => {
                    if let Some(x) = cell.as_f64() {
                        float_cell(&mut out, x);
                    }
                }
                ColumnType::Bool => {
                    if let Some(b) = cell.as_bool() {
                        out.extend_from_slice(if b { b"true" } else { b"false" });
                    }
                }
            }
        }
        out.push(b'\n');
    }
    Ok(out)
}

/// Writes the rows as a CSV table at `path` (`-`: stdout), atomically; a name that says
/// another format (`.parquet`, `.yaml`) is refused before anything is written.
pub fn write_csv<T: serde::Serialize>(rows: &[T], path: &Path, schema: &TableSchema) -> Result<(), IoError> {
    check_output(path, Format::Csv)?;
    let bytes = to_csv(rows, schema)?;
    write_output(path, Format::Csv, &bytes)
}

/// A text cell: empty text quoted (an empty cell is a missing value), text holding a
/// comma or a line break quoted, quotes doubled (and the cell quoted).
fn text_cell(out: &mut Vec<u8>, text: &str) {
    if text.is_empty() {
        out.extend_from_slice(b"\"\"");
        return;
    }
    let quoted = text.contains([',', '\n', '\r', '"']);
    if quoted {
        out.push(b'"');
    }
    for b in text.bytes() {
        if b == b'"' {
            out.push(b'"');
        }
        out.push(b);
    }
    if quoted {
        out.push(b'"');
    }
}

/// A float in its shortest round-trip form, as serde_json writes it (`1.0`, `1e-7`);
/// the non-finite as `NaN`, `inf`, `-inf`.
fn float_cell(out: &mut Vec<u8>, x: f64) {
    if x.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if x.is_infinite() {
        out.extend_from_slice(if x > 0.0 { b"inf" } else { b"-inf" });
    } else {
        // serde_json writes a finite float as its shortest round-trip digits.
        out.extend_from_slice(serde_json::to_string(&x).unwrap_or_default().as_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use rubick_core::tables::{PROFILE, ProfileRow, ProfileStatus};

    use super::*;

    fn rows() -> Vec<ProfileRow> {
        let row = |job: &str, plan: &str, t: f64| ProfileRow {
            job: job.to_owned(),
            model: "m".to_owned(),
            plan: plan.to_owned(),
            placement: "8".to_owned(),
            cpus: Some(4),
            status: Some(ProfileStatus::Ok),
            repeat: Some(1),
            iterations: Some(10),
            iter_time_s: Some(t),
            iter_time_sd_s: Some(t / 10.0),
            samples_per_s: Some(16.0 / t),
            ..ProfileRow::default()
        };
        vec![
            row("a", "dp1-tp1-pp1-mb4-ga4", 0.1),
            row("b,c", "dp2-tp1-pp1-mb2-ga4", 1.0),
            row("say \"hi\"", "ga", 1e-7),
            row("", "x\ny", 123_456_789.125),
        ]
    }

    #[test]
    fn cells_are_quoted_only_where_they_must_be_and_floats_are_shortest() {
        let text = String::from_utf8(to_csv(&rows(), &PROFILE).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("job,model,plan,placement,"), "{}", lines[0]);
        assert!(lines[1].starts_with("a,m,dp1-tp1-pp1-mb4-ga4,8,,4,"), "{}", lines[1]);
        assert!(lines[1].contains(",0.1,") && lines[2].contains(",1.0,"), "{text}");
        assert!(lines[2].starts_with("\"b,c\","), "{}", lines[2]);
        assert!(lines[3].starts_with("\"say \"\"hi\"\"\",") && lines[3].contains(",1e-7,"), "{}", lines[3]);
        assert!(lines[4].starts_with("\"\",m,\"x"), "an empty text is quoted, a line break too: {text}");
    }

    /// The one writer without polars writes what polars writes of the same rows.
    #[cfg(feature = "table")]
    #[test]
    fn the_csv_is_what_the_polars_writer_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let mut df = crate::table::frame_of(&rows(), &PROFILE).unwrap();
        crate::table::write_table(&mut df, &path, None, &PROFILE).unwrap();
        let polars = String::from_utf8(std::fs::read(&path).unwrap()).unwrap();
        let ours = String::from_utf8(to_csv(&rows(), &PROFILE).unwrap()).unwrap();
        assert_eq!(ours, polars);
        let back: Vec<ProfileRow> = crate::table::read_rows(&path, &PROFILE).unwrap();
        assert_eq!(back, rows());
    }

    #[test]
    fn a_name_for_another_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let e = write_csv(&rows(), &path, &PROFILE).unwrap_err().to_string();
        assert!(e.contains("t.parquet"), "{e}");
        assert!(!path.exists());
    }
}
