//! # rubick-model: the performance model and its numerics
//!
//! What a job's speed and memory are under a plan, and what is believed of them:
//!
//! - `memory.rs`: the GPU-memory estimate ([`MemoryEstimator`]); `space.rs`: plan
//!   spaces, every valid plan that fits ([`PlanSpace::enumerate`], `resolve_code`).
//! - `perfmodel.rs` (form `rubick-whitebox/3`, `predict`), `fit.rs` (the
//!   Levenberg-Marquardt fit and its intervals), `select.rs` (which K configurations get
//!   profiled): the module docs explain the model, the fit and the choice.
//! - `perf.rs`: `PerfModel`, the fitted model's artifact; `schema.rs`: every
//!   artifact's JSON Schema (here because `PerfModel` is one of them).
//! - `belief.rs`: what a round believes of a job (`Belief`, `Evidence`, `Support`,
//!   `believed`, `default_params`): measured beats modelled.
//! - `throughput.rs`: a configuration's predicted samples per second on a node group
//!   (its compute speed, the CPU optimizer's cores).
//! - `reference.rs`, `external.rs`: measurements parsed from text (the authors'
//!   reference data, others' simulators).
//!
//! **No I/O, no clock, no logs**, like `rubick-core` beneath it: everything here is a
//! deterministic function of its inputs. nalgebra and levenberg-marquardt are linked
//! here and nowhere else among the libraries.

pub mod belief;
pub mod external;
pub mod fit;
pub mod memory;
pub mod perf;
pub mod perfmodel;
pub mod reference;
pub mod schema;
pub mod select;
pub mod space;
pub mod throughput;

pub use memory::{MemoryBreakdown, MemoryEstimator};
pub use space::{PlanSpace, SpaceEntry};
