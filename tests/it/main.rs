//! The workspace's integration tests, one binary (`cargo test -p rubick-tests --test
//! it`; a module's name filters, e.g. `-- schedule::` or `-- run::`): the real tools run
//! end to end on the example inputs, the reference data, a stand-in workload and the
//! PyTorch workload, with the kit of `tests/src` (temporary directories, reapers, needs,
//! locks). The tools must be built first (`cargo build --workspace --bins`; `make test`
//! does). Snapshots of the outputs people read are in `snapshots/` (insta).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly on purpose

mod architecture;
mod artifacts;
mod bad_input;
mod churn;
mod cli;
mod conformance;
mod evaluate;
mod fuzz;
mod heterogeneous;
mod launch;
mod outputs;
mod pipeline;
mod profile;
mod pytorch;
mod readme;
mod reference;
mod run;
mod safety_net;
mod schedule;
mod sia_workloads;
mod simulate;
mod status_and_bounds;
mod trust;
