//! # rubick-io: the edge between the rubick domain and the outside world
//!
//! * [`files`]: artifact files (YAML) and atomic writes, `-` for stdin/stdout;
//! * `table` (the `table` feature): CSV and Parquet tables through polars, checked
//!   against the column schemas of `rubick_core::tables`; and on it (the same feature)
//!   `reference`: the Rubick authors' reference data as core types, `external`:
//!   others' measurements (`reference/external/`) as profile rows, `beliefs`: the
//!   fitted models a simulation's policies believe, per model;
//! * [`csv`]: a table's rows written as CSV without polars (what polars writes of
//!   them), for the tools built without the `table` feature (`rubick-run`);
//! * [`plot`]: figures as PNG or SVG with a bundled font;
//! * [`cli`]: conventions every rubick binary shares (logging, exit codes, formats);
//!   [`flags`]: the bounds of the command line's numbers, one parser per concept.
//!
//! What the tests share (skips, the CLI conventions) is `rubick-testkit`, a
//! dev-dependency: none of it is compiled into this library.

#[cfg(feature = "table")]
pub mod beliefs;
pub mod cli;
pub mod csv;
#[cfg(feature = "table")]
pub mod external;
pub mod files;
pub mod flags;
pub mod plot;
#[cfg(feature = "table")]
pub mod reference;
#[cfg(feature = "table")]
pub mod table;

pub use files::{Format, IoError, check_artifacts, check_output, load_artifact, read_text, write_atomic, write_output};
