//! Tables (CSV or Parquet, chosen by extension) through polars.

use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use polars::prelude::*;
use rubick_core::tables::{ColumnType, SCHEMA_KEY, TABLE_SCHEMA_VERSION, TableSchema};

use crate::files::{IoError, display, is_std, read_bytes, write_output};

/// The on-disk form of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    Csv,
    Parquet,
}

impl TableFormat {
    /// The format a path's extension names: `.parquet`/`.pq` or `.csv`; `-` and
    /// unknown extensions are CSV unless `flag` says otherwise.
    pub fn for_path(path: &Path, flag: Option<TableFormat>) -> TableFormat {
        flag.unwrap_or_else(|| match path.extension().and_then(|e| e.to_str()) {
            Some("parquet" | "pq") => TableFormat::Parquet,
            _ => TableFormat::Csv,
        })
    }
}

/// Reads a table. `text_columns` are read as strings whatever they look like (plan
/// codes like `248` and placements like `88888888` are text, not numbers).
pub fn read_table(path: &Path, format: Option<TableFormat>, text_columns: &[&str]) -> Result<DataFrame, IoError> {
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
            let overwrite: Schema =
                text_columns.iter().map(|name| Field::new((*name).into(), DataType::String)).collect();
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

/// Writes a table (CSV to stdout for `-`), atomically. Parquet files carry the schema
/// version and table name under the `rubick.schema` metadata key.
pub fn write_table(
    df: &mut DataFrame,
    path: &Path,
    format: Option<TableFormat>,
    schema: &TableSchema,
) -> Result<(), IoError> {
    let mut bytes = Vec::new();
    let wrap = |e: PolarsError| IoError::table(path, e);
    let format = if is_std(path) { format.unwrap_or(TableFormat::Csv) } else { TableFormat::for_path(path, format) };
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
    write_output(path, &bytes)
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

    #[test]
    fn missing_required_columns_are_named() {
        let df = df!("job" => ["a"]).unwrap();
        let err = check_columns(Path::new("p.csv"), &df, &rubick_core::tables::PROFILE).unwrap_err().to_string();
        assert!(err.contains("p.csv") && err.contains("`model`"), "{err}");
    }
}
