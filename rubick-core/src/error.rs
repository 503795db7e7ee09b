//! Errors of the domain. Every message names what was wrong and where.

use std::fmt;

/// A value that could not be parsed from its textual form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{input}`: {why}")]
pub struct ParseError {
    pub what: &'static str,
    pub input: String,
    pub why: String,
}

impl ParseError {
    pub fn new(what: &'static str, input: &str, why: String) -> Self {
        ParseError { what, input: input.to_owned(), why }
    }
}

/// A field of an artifact whose value breaks a rule of the domain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// Path of the field, e.g. `nodeGroups[1].gpusPerNode` or `jobs[3].request.gpus`.
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl fmt::Display) -> Self {
        ValidationError { field: field.into(), message: message.to_string() }
    }

    /// The same error, one level deeper: `prefix.field`.
    pub fn within(self, prefix: &str) -> Self {
        let field = if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        ValidationError { field, ..self }
    }
}

/// Checks a condition of a field, building the error lazily.
pub fn ensure(ok: bool, field: &str, message: impl FnOnce() -> String) -> Result<(), ValidationError> {
    if ok { Ok(()) } else { Err(ValidationError::new(field, message())) }
}

/// An artifact document that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// The text is not valid YAML for this artifact: syntax, unknown field, wrong type.
    /// The message carries the field path and line from the YAML parser.
    #[error("{0}")]
    Syntax(String),
    #[error("the document is empty (expected `apiVersion: rubick/v1` and `kind: {expected}`)")]
    Empty { expected: &'static str },
    #[error("apiVersion: missing (expected `rubick/v1`)")]
    MissingApiVersion,
    #[error("kind: missing (expected `{expected}`)")]
    MissingKind { expected: &'static str },
    #[error("kind: expected `{expected}`, found `{found}`")]
    WrongKind { expected: &'static str, found: String },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Too large a document, or too many YAML aliases: each alias is a copy of its
    /// anchor, so a small file can expand to gigabytes.
    #[error("{0}")]
    TooLarge(String),
}
