//! # rubick-core: the vocabulary of rubick
//!
//! Plans, placements, clusters, model specifications, jobs, schedules, the job contract's
//! pure part and the versioned artifacts that the rubick tools exchange: what every tool
//! means by them. The performance model and its numerics are `rubick-model`'s, one round
//! of planning is `rubick-planner`'s.
//!
//! **No I/O, no clock, no logs**: no files, processes, network, environment or GPUs, no
//! time of day, no log lines. Everything here is a deterministic function of its
//! inputs, and cannot fail for reasons outside its arguments. Reading and writing
//! files lives in `rubick-io`.

pub mod artifact;
pub mod cluster;
pub mod error;
pub mod job;
pub mod launch;
pub mod limits;
pub mod markdown;
pub mod model;
pub mod placement;
pub mod plan;
pub mod schedule;
pub mod simulation;
pub mod tables;

pub use artifact::{ApiVersion, Artifact, Kind};
pub use cluster::{Cluster, NodeGroup};
pub use error::{ArtifactError, ParseError, ValidationError};
pub use job::{Job, JobBatch, JobRequest};
pub use model::ModelSpec;
pub use placement::Placement;
pub use plan::{Offload, Plan, PlanCode, PlanFamily, PlanRequest, Recompute, ZeroStage};

/// Implements `Serialize`, `Deserialize` and `JsonSchema` for a type through its
/// `Display` and `FromStr`, so that it reads and writes as one string.
#[macro_export]
#[doc(hidden)]
macro_rules! string_serde {
    ($ty:ty, $description:expr, $pattern:expr) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $ty;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($description)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        v.parse().map_err(E::custom)
                    }
                    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<$ty, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<$ty, E> {
                        self.visit_str(&v.to_string())
                    }
                }
                deserializer.deserialize_any(Visitor)
            }
        }

        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": ["string", "integer"],
                    "description": $description,
                    "pattern": $pattern,
                })
            }
        }
    };
}
