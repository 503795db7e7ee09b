//! # rubick-testkit: what the workspace's tests share
//!
//! A dev-dependency of the crates whose unit tests use it and of the integration tests
//! (`tests/`, whose own kit in `tests/src` runs the real binaries); no tool links it,
//! so no test support is compiled into a production library.
//!
//! * [`needs`]: what a test needs that may be absent (a Slurm, PyTorch, the reference
//!   data): [`skip`]ped visibly, [`missing`] a failure where it is required (CI);
//! * [`cli`]: the conventions every tool's CLI keeps ([`cli_conventions`]: help text,
//!   examples at 80 columns, `--help` snapshots, completions, man pages).

pub mod cli;
pub mod needs;

pub use cli::cli_conventions;
pub use needs::{Need, missing, skip};
