//! JSON Schemas of the artifacts and tables, generated from the Rust types.
//!
//! The committed copies live in `schemas/` at the repository root; a test fails when
//! they drift from what the types generate (`make schemas` rewrites them).

use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::perf::PerfModel;
use rubick_core::artifact::{Artifact, Kind};
use rubick_core::tables::{ProfileRow, SimJobRow, TableSchema};
use rubick_core::{Cluster, Job, JobBatch, ModelSpec, schedule::Schedule};

fn artifact_schema<T: Artifact>() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Value::Object(root) = &mut schema {
        root.insert("$id".into(), json!(format!("https://rubick.invalid/schemas/{}.json", file_stem(T::KIND))));
        if let Some(Value::Object(props)) = root.get_mut("properties") {
            props.insert("apiVersion".into(), json!({ "const": "rubick/v1" }));
            props.insert("kind".into(), json!({ "const": T::KIND.as_str() }));
        }
        let required = root.entry("required").or_insert_with(|| json!([]));
        if let Value::Array(list) = required {
            for key in ["kind", "apiVersion"] {
                if !list.iter().any(|v| v == key) {
                    list.insert(0, json!(key));
                }
            }
        }
    }
    schema
}

fn table_schema<T: JsonSchema>(table: &TableSchema) -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    if let Value::Object(root) = &mut schema {
        root.insert("$id".into(), json!(format!("https://rubick.invalid/schemas/table-{}.json", table.name)));
        root.insert(
            "description".into(),
            json!(format!(
                "One row of the `{}` table (CSV or Parquet; Parquet files carry `rubick.schema = {} {}` in their metadata).",
                table.name,
                rubick_core::tables::TABLE_SCHEMA_VERSION,
                table.name
            )),
        );
    }
    schema
}

fn file_stem(kind: Kind) -> String {
    let mut out = String::new();
    for (i, c) in kind.as_str().chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Every schema as (file name, pretty JSON with a final newline), in a fixed order.
pub fn all_schemas() -> Vec<(String, String)> {
    let schemas = [
        (file_stem(Kind::Cluster), artifact_schema::<Cluster>()),
        (file_stem(Kind::Job), artifact_schema::<Job>()),
        (file_stem(Kind::JobBatch), artifact_schema::<JobBatch>()),
        (file_stem(Kind::ModelSpec), artifact_schema::<ModelSpec>()),
        (file_stem(Kind::PerfModel), artifact_schema::<PerfModel>()),
        (file_stem(Kind::Schedule), artifact_schema::<Schedule>()),
        (file_stem(Kind::SimulationSummary), artifact_schema::<rubick_core::simulation::SimulationSummary>()),
        (
            format!("table-{}", rubick_core::tables::PROFILE.name),
            table_schema::<ProfileRow>(&rubick_core::tables::PROFILE),
        ),
        (
            format!("table-{}", rubick_core::tables::SIM_JOBS.name),
            table_schema::<SimJobRow>(&rubick_core::tables::SIM_JOBS),
        ),
    ];
    schemas
        .into_iter()
        .map(|(stem, value)| {
            let text = serde_json::to_string_pretty(&value).unwrap_or_default();
            (format!("{stem}.json"), text + "\n")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rubick_core::tables::{PROFILE, SIM_JOBS};

    fn properties(schema: &str) -> Vec<(String, bool)> {
        let value: Value = serde_json::from_str(schema).unwrap();
        let required: Vec<String> = value["required"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default();
        value["properties"].as_object().unwrap().keys().map(|k| (k.clone(), required.contains(k))).collect()
    }

    #[test]
    fn column_specs_match_the_row_types() {
        let schemas = all_schemas();
        for table in [PROFILE, SIM_JOBS] {
            let (_, text) = schemas.iter().find(|(name, _)| name == &format!("table-{}.json", table.name)).unwrap();
            let mut from_type = properties(text);
            from_type.sort();
            let mut from_spec: Vec<(String, bool)> =
                table.columns.iter().map(|c| (c.name.to_owned(), c.required)).collect();
            from_spec.sort();
            assert_eq!(from_type, from_spec, "table {}", table.name);
        }
    }

    #[test]
    fn artifacts_require_their_header() {
        for (name, text) in all_schemas().iter().filter(|(n, _)| !n.starts_with("table-")) {
            let value: Value = serde_json::from_str(text).unwrap();
            let required = value["required"].as_array().unwrap();
            assert!(required.iter().any(|v| v == "apiVersion"), "{name}");
            assert!(required.iter().any(|v| v == "kind"), "{name}");
            assert_eq!(value["additionalProperties"], Value::Bool(false), "{name}");
        }
    }
}
