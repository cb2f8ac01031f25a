//! The HTTP/1.1 data path: codec (on `httparse`), body limits, the upstream keep-alive pool,
//! the request driver and response streaming.
//!
//! - `codec`: sans-I/O parsing and head writing; `error`: the one error type and its responses.
//! - `io`: the owned-buffer socket with deadlines; `pool`: per-core upstream keep-alive pools.
//! - `server`: the client connection loop (parse, classify, local answers).
//! - `endpoint`: the classify phase; `route`: the policy seam; `proxy`: the phase driver.
//! - `client`: a small one-shot HTTP client for the control core (`/v1/models`, health, loads).

pub mod client;
pub mod codec;
pub mod endpoint;
pub mod error;
pub mod io;
pub mod pool;
pub mod proxy;
pub mod route;
pub mod server;
