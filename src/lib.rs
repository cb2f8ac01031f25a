//! kvgate: a thread-per-core, io_uring gateway that routes LLM requests to the engine most likely
//! to hold their prompt prefix in KV cache (SMG's `cache_aware` policy), unless that engine is much
//! busier than the rest of the fleet.
//!
//! The modules form layers; each imports only from the layers below it (`tests/layers.rs`
//! checks this, and `ARCHITECTURE.md` is the map):
//!
//! 1. leaves: `limits`, `ids`, `error`, `copy`, `engine_proto` (the engines' generated gRPC
//!    messages: plain data, sent by the gRPC client and read by the KV-event index);
//! 2. the domain, free of I/O: `config`, `request`, `index`, `kv_events`, `policy`, `tokenize`,
//!    `workers`, `metrics`, `mesh`, `frontend`, `pd` (importing each other only as
//!    `ARCHITECTURE.md`'s edge table lists);
//! 3. `shared`: the state published between threads and the messages on their channels;
//! 4. `net`: HTTP/1.1 on sockets, for both planes; `grpc`: HTTP/2 gRPC calls to engines, for both
//!    planes;
//! 5. the planes: the data plane `http` and the control plane `control`, which never import
//!    each other;
//! 6. `runtime`: threads, pinning, listeners and shutdown, imported by `main.rs` alone.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod config;
pub mod control;
pub mod copy;
pub mod engine_proto;
pub mod error;
pub mod frontend;
pub mod grpc;
pub mod http;
pub mod ids;
pub mod index;
pub mod kv_events;
pub mod limits;
pub mod mesh;
pub mod metrics;
pub mod net;
pub mod pd;
pub mod policy;
pub mod request;
pub mod runtime;
pub mod shared;
pub mod tokenize;
pub mod workers;
