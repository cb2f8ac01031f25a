//! gRPC workers' transport: HTTP/2 (the `h2` crate) on the calling thread's monoio runtime, the
//! calls' framing and status (the engines' protobuf messages are `crate::engine_proto`). Both
//! planes use it: a data core runs `Generate` calls on its own connections
//! (`http::upstream::grpc`), the control core its health, load and model calls on its own
//! (`control::probes`); no connection is shared between threads and no tokio runtime runs.
//!
//! One concept per module: [`io`] (the socket `h2` drives), [`connection`] (one multiplexed
//! connection with its keep-alive), [`channels`] (a thread's connections per worker),
//! [`call`] (one call: request, messages, status), [`framing`] (the 5-byte message prefix),
//! [`status`] (`grpc-status` and its HTTP mapping), [`backend`] (SGLang's or vLLM's service, detection, control calls) and [`generate`] (the
//! `Generate` call in engine-neutral terms).

pub mod backend;
pub mod call;
pub mod channels;
pub mod connection;
pub mod framing;
pub mod generate;
pub mod io;
pub mod status;

pub use backend::Backend;
pub use call::{Call, CallError};
pub use channels::{connection_for, Channels};
pub use connection::Connection;

#[cfg(test)]
mod tests;
