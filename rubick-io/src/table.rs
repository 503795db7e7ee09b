//! Tables (CSV or Parquet, chosen by extension) through polars.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use polars::prelude::*;
use rubick_core::tables::{ColumnType, SCHEMA_KEY, TABLE_SCHEMA_VERSION, TableSchema};

use crate::files::{Format, IoError, check_output, display, read_bytes, write_output};

/// The on-disk form of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    Csv,
    Parquet,
}

impl TableFormat {
    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            TableFormat::Csv => "csv",
            TableFormat::Parquet => "parquet",
        }
    }

    /// The format a path's extension names: `.parquet`/`.pq` or `.csv`; `-` and
    /// unknown extensions are CSV unless `flag` says otherwise.
    pub fn for_path(path: &Path, flag: Option<TableFormat>) -> TableFormat {
        flag.unwrap_or_else(|| match crate::files::extension_format(path) {
            Some(Format::Parquet) => TableFormat::Parquet,
            _ => TableFormat::Csv,
        })
    }
}

impl From<TableFormat> for Format {
    fn from(format: TableFormat) -> Self {
        match format {
            TableFormat::Csv => Format::Csv,
            TableFormat::Parquet => Format::Parquet,
        }
    }
}

/// Reads a table. `text_columns` are read as strings whatever they look like (plan
/// codes like `248` and placements like `88888888` are text, not numbers).
pub fn read_table(path: &Path, format: Option<TableFormat>, text_columns: &[&str]) -> Result<DataFrame, IoError> {
    let overwrite: Schema = text_columns.iter().map(|name| Field::new((*name).into(), DataType::String)).collect();
    read_table_with(path, format, overwrite)
}

/// Reads a table whose CSV columns named in `schema` get its types (a CSV column that
/// is empty in every row would otherwise read as text).
pub fn read_typed_table(path: &Path, schema: &TableSchema) -> Result<DataFrame, IoError> {
    use rubick_core::tables::ColumnType;
    let overwrite: Schema = schema
        .columns
        .iter()
        .map(|c| {
            let dtype = match c.dtype {
                ColumnType::Str => DataType::String,
                ColumnType::Int => DataType::Int64,
                ColumnType::Float => DataType::Float64,
                ColumnType::Bool => DataType::Boolean,
            };
            Field::new(c.name.into(), dtype)
        })
        .collect();
    read_table_with(path, None, overwrite)
}

fn read_table_with(path: &Path, format: Option<TableFormat>, overwrite: Schema) -> Result<DataFrame, IoError> {
    let bytes = read_bytes(path)?;
    let wrap = |e: PolarsError| IoError::table(path, e);
    match TableFormat::for_path(path, format) {
        TableFormat::Csv => {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Err(IoError::table(path, "empty table (expected a header line)"));
            }
            if let Err(e) = std::str::from_utf8(&bytes) {
                return Err(IoError::NotText { path: display(path), offset: e.valid_up_to() });
            }
            CsvReadOptions::default()
                .with_has_header(true)
                .with_infer_schema_length(None)
                .with_schema_overwrite(Some(Arc::new(overwrite)))
                .into_reader_with_file_handle(Cursor::new(bytes))
                .finish()
                .map_err(wrap)
        }
        TableFormat::Parquet => ParquetReader::new(Cursor::new(bytes)).finish().map_err(wrap),
    }
}

/// Checks that every required column of `schema` is present with a compatible type.
pub fn check_columns(path: &Path, df: &DataFrame, schema: &TableSchema) -> Result<(), IoError> {
    for spec in schema.columns {
        let Ok(column) = df.column(spec.name) else {
            if spec.required {
                return Err(IoError::table(
                    path,
                    format!(
                        "column `{}` is missing (a {} table needs it: {})",
                        spec.name, schema.name, spec.description
                    ),
                ));
            }
            continue;
        };
        let dtype = column.dtype();
        let ok = match spec.dtype {
            ColumnType::Str => dtype.is_string(),
            ColumnType::Int => dtype.is_integer(),
            ColumnType::Float => dtype.is_primitive_numeric(),
            ColumnType::Bool => dtype.is_bool(),
        } || dtype.is_null();
        if !ok {
            return Err(IoError::table(
                path,
                format!("column `{}`: expected {}, found {dtype}", spec.name, spec.dtype.as_str()),
            ));
        }
    }
    Ok(())
}

/// The rows of a table's row type as a `DataFrame` with `schema`'s columns, in its
/// order and types: the row type and the schema are the table's only descriptions
/// (a test keeps them in step), never a third list of columns by hand.
pub fn frame_of<T: serde::Serialize>(rows: &[T], schema: &TableSchema) -> Result<DataFrame, IoError> {
    use rubick_core::tables::ColumnType;
    let values: Vec<serde_json::Value> = rows
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()
        .map_err(|e| IoError::table(Path::new(schema.name), e))?;
    let field = |v: &serde_json::Value, name: &str| v.get(name).cloned().unwrap_or(serde_json::Value::Null);
    let columns = schema
        .columns
        .iter()
        .map(|c| {
            let cells = values.iter().map(|v| field(v, c.name));
            let name = c.name.into();
            match c.dtype {
                ColumnType::Str => Column::new(name, cells.map(|x| x.as_str().map(str::to_owned)).collect::<Vec<_>>()),
                ColumnType::Int => Column::new(name, cells.map(|x| x.as_i64()).collect::<Vec<_>>()),
                ColumnType::Float => Column::new(name, cells.map(|x| x.as_f64()).collect::<Vec<_>>()),
                ColumnType::Bool => Column::new(name, cells.map(|x| x.as_bool()).collect::<Vec<_>>()),
            }
        })
        .collect();
    DataFrame::new_infer_height(columns).map_err(|e| IoError::table(Path::new(schema.name), e))
}

/// The rows of a table as its row type: the inverse of [`frame_of`]. Columns of
/// `schema` absent from the table read as empty; an error names the line.
pub fn rows_of<T: serde::de::DeserializeOwned>(
    path: &Path,
    df: &DataFrame,
    schema: &TableSchema,
) -> Result<Vec<T>, IoError> {
    use rubick_core::tables::ColumnType;
    use serde_json::Value;
    check_columns(path, df, schema)?;
    let mut rows: Vec<serde_json::Map<String, Value>> = vec![serde_json::Map::new(); df.height()];
    for spec in schema.columns {
        let values: Vec<Value> = if df.column(spec.name).is_err() {
            vec![Value::Null; df.height()]
        } else {
            match spec.dtype {
                ColumnType::Str => {
                    str_column(path, df, spec.name)?.into_iter().map(|v| v.map_or(Value::Null, Value::from)).collect()
                }
                ColumnType::Float => {
                    f64_column(path, df, spec.name)?.into_iter().map(|v| v.map_or(Value::Null, Value::from)).collect()
                }
                ColumnType::Int => {
                    let column = df.column(spec.name).map_err(|e| IoError::table(path, e))?;
                    let cast = column.cast(&DataType::Int64).map_err(|e| IoError::table(path, e))?;
                    cast.i64()
                        .map_err(|e| IoError::table(path, e))?
                        .iter()
                        .map(|v| v.map_or(Value::Null, Value::from))
                        .collect()
                }
                ColumnType::Bool => {
                    let column = df.column(spec.name).map_err(|e| IoError::table(path, e))?;
                    let cast = column.cast(&DataType::Boolean).map_err(|e| IoError::table(path, e))?;
                    cast.bool()
                        .map_err(|e| IoError::table(path, e))?
                        .iter()
                        .map(|v| v.map_or(Value::Null, Value::from))
                        .collect()
                }
            }
        };
        for (row, value) in rows.iter_mut().zip(values) {
            row.insert(spec.name.to_owned(), value);
        }
    }
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            serde_json::from_value(Value::Object(row)).map_err(|e| IoError::table(path, format!("line {}: {e}", i + 2)))
        })
        .collect()
}

/// Reads a whole table of `schema` as its row type (text columns read as text).
pub fn read_rows<T: serde::de::DeserializeOwned>(path: &Path, schema: &TableSchema) -> Result<Vec<T>, IoError> {
    let df = read_typed_table(path, schema)?;
    rows_of(path, &df, schema)
}

/// A table of configurations: columns `plan` (readable form) and
/// `placement` (GPUs per node), one per line.
pub fn read_configurations(path: &Path) -> Result<Vec<(rubick_core::Plan, rubick_core::Placement)>, IoError> {
    let df = read_table(path, None, &["plan", "placement"])?;
    let plans = str_column(path, &df, "plan")?;
    let placements = str_column(path, &df, "placement")?;
    plans
        .iter()
        .zip(&placements)
        .enumerate()
        .map(|(i, (p, q))| {
            let at = |what: &str| IoError::table(path, format!("line {}: {what}", i + 2));
            let plan = p.ok_or_else(|| at("plan is empty"))?;
            let placement = q.ok_or_else(|| at("placement is empty"))?;
            Ok((
                plan.parse().map_err(|e| at(&format!("plan `{plan}`: {e}")))?,
                placement.parse().map_err(|e| at(&format!("placement `{placement}`: {e}")))?,
            ))
        })
        .collect()
}

/// Writes a table (CSV to stdout for `-`), atomically. Parquet files carry the schema
/// version and table name under the `rubick.schema` metadata key.
pub fn write_table(
    df: &mut DataFrame,
    path: &Path,
    format: Option<TableFormat>,
    schema: &TableSchema,
) -> Result<(), IoError> {
    // The format asked, else the one the name says, else CSV; a name that says another
    // format is refused by the one check of an output's name, before any work.
    let format = format.or_else(|| match crate::files::extension_format(path) {
        Some(Format::Parquet) => Some(TableFormat::Parquet),
        _ => None,
    });
    let format = format.unwrap_or(TableFormat::Csv);
    check_output(path, format.into())?;
    let mut bytes = Vec::new();
    let wrap = |e: PolarsError| IoError::table(path, e);
    match format {
        TableFormat::Csv => {
            CsvWriter::new(&mut bytes).include_header(true).finish(df).map_err(wrap)?;
        }
        TableFormat::Parquet => {
            let metadata = KeyValueMetadata::from_static(vec![(
                SCHEMA_KEY.to_owned(),
                format!("{TABLE_SCHEMA_VERSION} {}", schema.name),
            )]);
            ParquetWriter::new(&mut bytes).with_key_value_metadata(Some(metadata)).finish(df).map_err(wrap)?;
        }
    }
    write_output(path, format.into(), &bytes)
}

/// The values of a string column (nulls as `None`).
pub fn str_column<'a>(path: &Path, df: &'a DataFrame, name: &str) -> Result<Vec<Option<&'a str>>, IoError> {
    let column = df.column(name).map_err(|_| IoError::table(path, format!("column `{name}` is missing")))?;
    let values = column
        .str()
        .map_err(|_| IoError::table(path, format!("column `{name}`: expected text, found {}", column.dtype())))?;
    Ok(values.iter().collect())
}

/// The values of a numeric column as `f64` (nulls as `None`).
pub fn f64_column(path: &Path, df: &DataFrame, name: &str) -> Result<Vec<Option<f64>>, IoError> {
    let column = df.column(name).map_err(|_| IoError::table(path, format!("column `{name}` is missing")))?;
    if !column.dtype().is_primitive_numeric() && !column.dtype().is_null() {
        return Err(IoError::table(path, format!("column `{name}`: expected a number, found {}", column.dtype())));
    }
    let cast = column.cast(&DataType::Float64).map_err(|e| IoError::table(path, e))?;
    let values = cast.f64().map_err(|e| IoError::table(path, e))?;
    Ok(values.iter().collect())
}

/// The values of a numeric column as `f64` (nulls as `None`), whether the table holds it
/// as numbers (Parquet) or as text (a CSV column read with [`read_table`]'s
/// `text_columns`, so that a cell no number type holds, a 301-digit integer, is read
/// here and not refused in polars' words): a cell that is not a number is an error
/// naming its CSV line and the column.
pub fn number_column(path: &Path, df: &DataFrame, name: &str) -> Result<Vec<Option<f64>>, IoError> {
    let column = df.column(name).map_err(|_| IoError::table(path, format!("column `{name}` is missing")))?;
    if !column.dtype().is_string() {
        return f64_column(path, df, name);
    }
    str_column(path, df, name)?
        .into_iter()
        .enumerate()
        .map(|(i, cell)| {
            let Some(text) = cell.map(str::trim).filter(|t| !t.is_empty()) else { return Ok(None) };
            text.parse().map(Some).map_err(|_| {
                let shown: String = text.chars().take(40).collect();
                let more = if shown.len() < text.len() { "..." } else { "" };
                IoError::table(path, format!("line {}: column `{name}`: expected a number, got `{shown}{more}`", i + 2))
            })
        })
        .collect()
}

/// A required numeric cell: the error names the column and the CSV line.
pub fn required(path: &Path, name: &str, row: usize, value: Option<f64>) -> Result<f64, IoError> {
    value.ok_or_else(|| IoError::table(path, format!("line {}: column `{name}` is empty", row + 2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_and_parquet_round_trip_with_text_columns() {
        let dir = tempfile::tempdir().unwrap();
        let mut df = df!(
            "plan" => ["248", "ga"],
            "placement" => ["88888888", "11"],
            "iter_time_s" => [0.67, 0.44],
        )
        .unwrap();
        let schema = rubick_core::tables::PROFILE;
        for name in ["t.csv", "t.parquet"] {
            let path = dir.path().join(name);
            write_table(&mut df, &path, None, &schema).unwrap();
            let back = read_table(&path, None, &["plan", "placement"]).unwrap();
            assert_eq!(back, df, "{name}");
        }
    }

    /// A table is never written under a name that says another format.
    #[test]
    fn a_table_named_for_another_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut df = df!("plan" => ["ga"]).unwrap();
        let schema = rubick_core::tables::PROFILE;
        for (name, format, said) in [
            ("t.yaml", None, "names yaml"),
            ("t.json", None, "names json"),
            ("t.parquet", Some(TableFormat::Csv), "names parquet, but this output is csv"),
            ("t.CSV", Some(TableFormat::Parquet), "names csv, but this output is parquet"),
            ("t.Yml", Some(TableFormat::Csv), "names yaml"),
        ] {
            let path = dir.path().join(name);
            let err = write_table(&mut df, &path, format, &schema).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(said), "{name}: {err}");
            assert!(!path.exists(), "{name}: written anyway");
        }
        // Unnamed formats keep the default (CSV); a named one is written as named.
        write_table(&mut df, &dir.path().join("t.out"), None, &schema).unwrap();
        write_table(&mut df, &dir.path().join("t.pq"), Some(TableFormat::Parquet), &schema).unwrap();
        write_table(&mut df, &dir.path().join("t.PARQUET"), None, &schema).unwrap();
        assert_eq!(&std::fs::read(dir.path().join("t.PARQUET")).unwrap()[..4], b"PAR1");
    }

    #[test]
    fn missing_required_columns_are_named() {
        let df = df!("job" => ["a"]).unwrap();
        let err = check_columns(Path::new("p.csv"), &df, &rubick_core::tables::PROFILE).unwrap_err().to_string();
        assert!(err.contains("p.csv") && err.contains("`model`"), "{err}");
    }
}
