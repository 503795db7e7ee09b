//! Versioned artifacts: the documents the rubick tools exchange.
//!
//! Every YAML artifact starts with `apiVersion: rubick/v1` and `kind: <Kind>`.
//! Unknown fields are errors that name the field; after parsing, [`Artifact::validate`]
//! checks the rules of the domain and names the offending field. Parsing here works on
//! text; reading files is the job of `rubick-io`.

use std::fmt;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{ArtifactError, ValidationError};

/// The version of the artifact format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
pub enum ApiVersion {
    #[default]
    #[serde(rename = "rubick/v1")]
    V1,
}

impl ApiVersion {
    pub const CURRENT: ApiVersion = ApiVersion::V1;

    pub fn as_str(self) -> &'static str {
        "rubick/v1"
    }
}

/// The kinds of artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Kind {
    Cluster,
    Job,
    JobBatch,
    ModelSpec,
    PerfModel,
    Schedule,
    SimulationSummary,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Cluster,
        Kind::Job,
        Kind::JobBatch,
        Kind::ModelSpec,
        Kind::PerfModel,
        Kind::Schedule,
        Kind::SimulationSummary,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cluster => "Cluster",
            Kind::Job => "Job",
            Kind::JobBatch => "JobBatch",
            Kind::ModelSpec => "ModelSpec",
            Kind::PerfModel => "PerfModel",
            Kind::Schedule => "Schedule",
            Kind::SimulationSummary => "SimulationSummary",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A document type with a version, a kind and validation rules.
///
/// Artifacts that can also be embedded in another one (a `ModelSpec` inside a `Job`,
/// `Job`s inside a `JobBatch`) keep `apiVersion` and `kind` optional in the type;
/// [`parse_yaml`] requires both at the top of a document.
pub trait Artifact: Serialize + DeserializeOwned + JsonSchema {
    const KIND: Kind;

    /// The `apiVersion` and `kind` the value carries.
    fn header(&self) -> (Option<ApiVersion>, Option<Kind>);

    /// Sets `apiVersion` and `kind` to this type's.
    fn stamp(&mut self);

    /// Rules of the domain beyond the types; the error names the field.
    fn validate(&self) -> Result<(), ValidationError>;
}

/// Implements the header part of [`Artifact`] for a type with `api_version` and
/// `kind` fields of type `Option`.
#[macro_export]
#[doc(hidden)]
macro_rules! artifact_header {
    ($kind:expr) => {
        const KIND: $crate::artifact::Kind = $kind;
        fn header(&self) -> (Option<$crate::artifact::ApiVersion>, Option<$crate::artifact::Kind>) {
            (self.api_version, self.kind)
        }
        fn stamp(&mut self) {
            self.api_version = Some($crate::artifact::ApiVersion::CURRENT);
            self.kind = Some($kind);
        }
    };
}

/// The two header fields, read leniently when a document is not the artifact asked for,
/// so that a file of the wrong kind is reported as such rather than as a list of
/// unknown fields.
#[derive(Deserialize)]
struct Probe {
    #[serde(rename = "apiVersion")]
    api_version: Option<serde_yaml_ng::Value>,
    kind: Option<serde_yaml_ng::Value>,
}

/// The `kind:` a YAML document declares, when it is one of ours; `None` for text that
/// is not a mapping, has no `kind` or an unknown one. Lets a tool that accepts several
/// kinds (a `Job` or a `JobBatch`) pick the parser before parsing.
pub fn declared_kind(text: &str) -> Option<Kind> {
    let probe: Probe = serde_yaml_ng::from_str(text).ok()?;
    serde_yaml_ng::from_value(probe.kind?).ok()
}

/// The largest artifact document read (64 MiB: a batch of ~300,000 jobs).
pub const MAX_DOCUMENT_BYTES: usize = 64 << 20;
/// The most YAML aliases (`*name`) an artifact may use: each is a copy of its anchor.
pub const MAX_ALIASES: usize = 64;

/// Bounds a YAML text before it is parsed: its size, and its aliases (a few kilobytes
/// of aliases can expand to gigabytes).
pub fn check_size(text: &str) -> Result<(), ArtifactError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(ArtifactError::TooLarge(format!(
            "{} bytes; an artifact may have at most {MAX_DOCUMENT_BYTES}",
            text.len()
        )));
    }
    // An alias is `*` starting a value: after `: `, `- `, `[`, `{`, `,` or a line's indent.
    let mut aliases = 0;
    for line in text.lines() {
        let code = line.split(" #").next().unwrap_or_default();
        let bytes = code.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'*' && bytes.get(i + 1).is_some_and(|n| n.is_ascii_alphanumeric() || *n == b'_') {
                let before = code[..i].trim_end();
                if before.is_empty() || before.ends_with([':', '-', '[', '{', ',']) {
                    aliases += 1;
                }
            }
        }
    }
    if aliases > MAX_ALIASES {
        return Err(ArtifactError::TooLarge(format!(
            "{aliases} YAML aliases (`*name`); at most {MAX_ALIASES} (each one copies its anchor)"
        )));
    }
    Ok(())
}

/// Parses and validates one YAML document of artifact `T`.
pub fn parse_yaml<T: Artifact>(text: &str) -> Result<T, ArtifactError> {
    check_size(text)?;
    let meaningful =
        text.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#') && l.trim() != "---");
    if !meaningful {
        return Err(ArtifactError::Empty { expected: T::KIND.as_str() });
    }
    // The document parsed once; only one that is not a `T` is probed for its header, so
    // that a file of another kind (or none) is named as such rather than by the first
    // field `T` lacks.
    let value: T = match serde_yaml_ng::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            if let Ok(probe) = serde_yaml_ng::from_str::<Probe>(text) {
                match probe.kind {
                    None => return Err(ArtifactError::MissingKind { expected: T::KIND.as_str() }),
                    Some(serde_yaml_ng::Value::String(found)) if found != T::KIND.as_str() => {
                        return Err(ArtifactError::WrongKind { expected: T::KIND.as_str(), found });
                    }
                    _ => {}
                }
                if probe.api_version.is_none() {
                    return Err(ArtifactError::MissingApiVersion);
                }
            }
            return Err(ArtifactError::Syntax(e.to_string()));
        }
    };
    match value.header() {
        (None, _) => return Err(ArtifactError::MissingApiVersion),
        (_, None) => return Err(ArtifactError::MissingKind { expected: T::KIND.as_str() }),
        (_, Some(kind)) if kind != T::KIND => {
            return Err(ArtifactError::WrongKind { expected: T::KIND.as_str(), found: kind.to_string() });
        }
        _ => {}
    }
    value.validate()?;
    Ok(value)
}

/// Renders an artifact as YAML with its header stamped.
pub fn to_yaml<T: Artifact + Clone>(value: &T) -> String {
    let mut stamped = value.clone();
    stamped.stamp();
    // Serialising plain data structures into a String cannot fail.
    serde_yaml_ng::to_string(&stamped).unwrap_or_else(|e| format!("# serialisation failed: {e}\n"))
}
