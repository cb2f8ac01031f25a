//! The I/O under an HTTP/2 connection: a TCP stream to a gRPC worker on the calling thread's
//! monoio runtime, in the readiness-based form `h2` drives. monoio's `poll-io` streams
//! implement the I/O traits `h2` reads and writes through (tokio's `AsyncRead`/`AsyncWrite`,
//! the traits alone: no tokio runtime runs), on the same ring or epoll driver as every other
//! socket of the core; their `unsafe` (a borrowed buffer handed to the driver for one poll) is
//! monoio's, so none is needed here. Owns [`connect`].
//!
//! Errors are `std::io::Error`s (`TimedOut` after `UPSTREAM_CONNECT_TIMEOUT`), which
//! `grpc::call` turns into a retryable connect failure.

use std::io;
use std::net::SocketAddr;

use monoio::io::IntoPollIo;
use monoio::net::tcp::stream_poll::TcpStreamPoll;

use crate::limits::UPSTREAM_CONNECT_TIMEOUT;

/// The stream type an HTTP/2 connection runs on.
pub type GrpcIo = TcpStreamPoll;

/// Connects to `addr` (giving up after `UPSTREAM_CONNECT_TIMEOUT`), with Nagle off: a call is a
/// HEADERS frame then a DATA frame, and the worker should not wait for the second.
pub async fn connect(addr: SocketAddr) -> io::Result<GrpcIo> {
    let connecting = monoio::net::TcpStream::connect(addr);
    let stream = monoio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    stream.into_poll_io()
}
