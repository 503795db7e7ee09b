//! A structural validator of a value against a CRD's OpenAPI v3 schema, as strict as
//! `kubectl apply --validate=strict` about unknown fields (see the module documentation
//! of [`crate::kubernetes`] for what it checks and what it does not).

use serde_yaml_ng::Value;

use crate::kubernetes::names::{is_dns_label, label_value};

/// The resource-quantity pattern of Kubernetes' CRDs, checked by hand below.
const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// `[+-]?(digits(.digits*)?|.digits+)`: the rest after it, if it starts with one.
fn decimal(text: &str) -> Option<&str> {
    let t = text.strip_prefix(['+', '-']).unwrap_or(text);
    let digits = |x: &str| x.len() - x.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let whole = digits(t);
    let mut rest = &t[whole..];
    if let Some(after) = rest.strip_prefix('.') {
        let frac = digits(after);
        if whole == 0 && frac == 0 {
            return None;
        }
        rest = &after[frac..];
    } else if whole == 0 {
        return None;
    }
    Some(rest)
}

/// Whether `text` matches [`QUANTITY_PATTERN`].
pub(super) fn is_quantity(text: &str) -> bool {
    let Some(suffix) = decimal(text) else { return false };
    matches!(suffix, "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E")
        || suffix
            .strip_prefix(['e', 'E'])
            .filter(|e| !e.starts_with(['+', '-']) || e.len() > 1)
            .and_then(decimal)
            .is_some_and(str::is_empty)
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "array",
        Value::Mapping(_) => "object",
        Value::Tagged(_) => "tagged",
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Appends to `errors` every way `value` (at `path`) breaks `schema`.
fn validate(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if !flag(schema, "nullable") {
            errors.push(format!("{path}: null is not allowed"));
        }
        return;
    }
    let actual = type_name(value);
    if flag(schema, "x-kubernetes-int-or-string") {
        if !matches!(actual, "integer" | "string") {
            errors.push(format!("{path}: {actual}, not an integer or a string"));
            return;
        }
    } else if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let ok = expected == actual || (expected == "number" && actual == "integer");
        if !ok {
            errors.push(format!("{path}: {actual}, not {expected}"));
            return;
        }
    }
    if let Some(branches) = schema.get("anyOf").and_then(Value::as_sequence) {
        let any = branches.iter().any(|b| {
            let mut e = Vec::new();
            validate(value, b, path, &mut e);
            e.is_empty()
        });
        if !any {
            errors.push(format!("{path}: matches none of anyOf"));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_sequence)
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: {value:?} is not one of {allowed:?}"));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str)
        && pattern == QUANTITY_PATTERN
        && let Some(text) = value.as_str()
        && !is_quantity(text)
    {
        errors.push(format!("{path}: `{text}` is not a resource quantity"));
    }
    if let Some(text) = value.as_str() {
        let len = text.chars().count() as u64;
        if schema.get("maxLength").and_then(Value::as_u64).is_some_and(|m| len > m) {
            errors.push(format!("{path}: longer than maxLength"));
        }
        if schema.get("minLength").and_then(Value::as_u64).is_some_and(|m| len < m) {
            errors.push(format!("{path}: shorter than minLength"));
        }
    }
    if let Some(n) = value.as_f64().filter(|_| matches!(actual, "integer" | "number")) {
        if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| n < m) {
            errors.push(format!("{path}: below its minimum"));
        }
        if schema.get("format").and_then(Value::as_str) == Some("int32")
            && (n < f64::from(i32::MIN) || n > f64::from(i32::MAX))
        {
            errors.push(format!("{path}: out of int32"));
        }
    }
    match value {
        Value::Mapping(m) => {
            let properties = schema.get("properties").and_then(Value::as_mapping);
            for key in schema.get("required").and_then(Value::as_sequence).into_iter().flatten() {
                if !m.contains_key(key) {
                    errors.push(format!("{path}: `{}` is required", key.as_str().unwrap_or("?")));
                }
            }
            let additional = schema.get("additionalProperties");
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            for (k, v) in m {
                let Some(key) = k.as_str() else {
                    errors.push(format!("{path}: a key that is not a string"));
                    continue;
                };
                let at = format!("{path}.{key}");
                if let Some(sub) = properties.and_then(|p| p.get(key)) {
                    validate(v, sub, &at, errors);
                } else if let Some(sub) = additional.filter(|a| a.is_mapping()) {
                    validate(v, sub, &at, errors);
                } else if additional.and_then(Value::as_bool) == Some(true) || preserve {
                } else {
                    errors.push(format!("{at}: unknown field"));
                }
            }
        }
        Value::Sequence(items) => {
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item, sub, &format!("{path}[{i}]"), errors);
                }
            }
            match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => {
                    for (i, item) in items.iter().enumerate() {
                        if items[..i].contains(item) {
                            errors.push(format!("{path}[{i}]: a duplicate in a set"));
                        }
                    }
                }
                Some("map") => {
                    let keys: Vec<&Value> = schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_sequence)
                        .into_iter()
                        .flatten()
                        .collect();
                    let key_of = |item: &Value| keys.iter().map(|k| item.get(*k).cloned()).collect::<Vec<_>>();
                    for (i, item) in items.iter().enumerate() {
                        if items[..i].iter().any(|other| key_of(other) == key_of(item)) {
                            errors.push(format!("{path}[{i}]: a duplicate key in a map list"));
                        }
                    }
                }
                _ => {}
            }
        }
        _ => {}
    }
}

/// The errors of a custom resource against its CRD: apiVersion and kind, the
/// metadata's name and labels (the API server's part), then the schema.
pub(super) fn validate_resource(resource: &Value, crd: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
    let api_version = resource.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let Some((_, version)) = api_version.split_once('/').filter(|(g, _)| *g == group) else {
        return vec![format!("apiVersion `{api_version}` is not in group {group}")];
    };
    if resource.get("kind").and_then(Value::as_str) != Some(kind) {
        errors.push(format!("kind: not {kind}"));
    }
    let Some(schema) = crd["spec"]["versions"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|v| v["name"].as_str() == Some(version) && flag(v, "served"))
        .map(|v| &v["schema"]["openAPIV3Schema"])
    else {
        return vec![format!("version {version} is not served")];
    };
    errors.extend(metadata_errors(resource));
    // The API server validates metadata itself; the schema says only `type: object`.
    let mut rest = resource.clone();
    if let Value::Mapping(m) = &mut rest {
        m.remove("metadata");
    }
    validate(&rest, schema, "", &mut errors);
    errors
}

pub(super) fn metadata_errors(resource: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let name = resource["metadata"]["name"].as_str().unwrap_or_default();
    if !is_dns_label(name) {
        errors.push(format!("metadata.name `{name}` is not a DNS-1123 label"));
    }
    for (k, v) in resource["metadata"]["labels"].as_mapping().into_iter().flatten() {
        let v = v.as_str().unwrap_or("\u{0}");
        if v != label_value(v) {
            errors.push(format!("metadata.labels.{k:?}: `{v}` is not a label value"));
        }
    }
    errors
}
