//! HTTP/1.1 over sockets, the I/O both planes share: the data plane (`http`) proxies with it,
//! the control plane (`control`) probes workers and serves `/metrics` with it. Nothing here knows
//! about routing or workers.
//!
//! - `socket`: the owned-buffer socket every connection goes through, with deadlines that cancel
//!   the kernel operation and give the buffer back.
//! - `codec`: the one HTTP/1.1 codec, sans I/O: head parsing, body framing, the chunked decoder,
//!   head writers.
//! - `body`: the one response-body framer (where a body ends, which bytes are data), for the
//!   proxy and the client alike.
//! - `client`: a one-shot `GET` on a fresh connection, for the control core's probes.
//! - `memory`: gives the pages of freed I/O buffers back to the system.
//! - `tls`: TLS on a socket (rustls driven by readiness), for `Socket` when it is encrypted.

pub mod body;
pub mod client;
pub mod codec;
pub mod date;
pub mod memory;
pub mod socket;
pub mod tls;
