//! The simulated engine fleet behind `sim-engine`: N independent models of one GPU server each,
//! speaking the SGLang / vLLM / OpenAI / Anthropic HTTP surface a gateway sees.
//!
//! - [`engine`]: the model of one server ([`Engine`]): [`cache`] (paged prefix cache, LRU),
//!   a continuous-batching scheduler and [`cost`] (step durations), on a simulated clock, with no
//!   I/O, so tests drive it step by step.
//! - [`driver`]: runs an engine on tokio in (scaled) real time.
//! - [`api`], [`output`], [`body`], [`metrics`]: request parsing, deterministic responses, SSE
//!   bodies, load reports.
//! - [`kv_events`], [`publisher`]: the engines' KV events (vLLM / SGLang msgpack batches) on ZMQ
//!   PUB and replay ROUTER sockets, fed from the cache's event log (`cache::CacheEvent`).
//! - [`grpc`]: the engines' gRPC services (`--grpc sglang|vllm`) over the same engine model;
//! - [`disagg`]: `--role prefill|decode`, SGLang's bootstrap and vLLM's `kv_transfer_params`
//!   handshakes with a simulated KV-cache transfer.
//! - [`faults`]: injected failures; [`instant`]: the `--instant` answer cache; [`server`]: the hyper servers; [`options`]: the CLI.

pub mod api;
pub mod body;
pub mod cache;
pub mod cost;
pub mod disagg;
pub mod driver;
pub mod engine;
pub mod faults;
pub mod grpc;
pub mod instant;
pub mod kv_events;
pub mod metrics;
pub mod options;
pub mod output;
pub mod publisher;
pub mod server;

pub use engine::{Emit, Engine, EngineConfig, LoadSnapshot, SimRequest};
pub use options::{Options, SimArgs};
