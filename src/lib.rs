//! kvgate: a thread-per-core, io_uring gateway that routes LLM requests to the engine most likely
//! to hold their prompt prefix in KV cache (SMG's `cache_aware` policy), unless that engine is much
//! busier than the rest of the fleet.
//!
//! The map of the crate follows `DESIGN.md` section 5: one concept per module.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod control;
pub mod copy;
pub mod http;
pub mod index;
pub mod limits;
pub mod mesh;
pub mod metrics;
pub mod policy;
pub mod request;
pub mod runtime;
pub mod workers;
