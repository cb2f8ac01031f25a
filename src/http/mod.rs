//! The data plane: what a data core does with a client connection, from the first byte of a
//! request to the last byte of its response. Everything here runs on a data core's monoio
//! runtime and never blocks; shared state is read lock-free, and whatever the control core must
//! know is pushed onto the core's own bounded queues.
//!
//! - `core`: [`core::DataCore`], one data core's state (its router, upstream pool, counters).
//! - `downstream`: the client connection's types ([`downstream::Downstream`], `Request`,
//!   `Answered`, `PreparedSlot`) and the one write to the client, shared by the modules below.
//! - `server`: the client connection loop: read a request (parse, limits, timeouts), classify
//!   it, answer it locally (health, models) or hand it on; errors become JSON answers.
//! - `proxy`: the request driver of routed endpoints, the phases and the one retry loop.
//! - `upstream`: the upstream seam, how a request reaches its worker and the answer comes back
//!   ([`upstream::Exchange`]; HTTP/1.1 today). `relay`: the stream-back phase, which writes the
//!   answer through to the client (SSE events as they come).
//! - `pool`: the upstream keep-alive pool. `admin`: the admin API's handler.
//! - `buffers`: the core's spare I/O buffers, lent by streams while they wait.

pub mod admin;
pub mod buffers;
pub mod core;
pub mod downstream;
pub mod pool;
pub mod proxy;
pub mod relay;
pub mod server;
pub mod upstream;
