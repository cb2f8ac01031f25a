//! A small one-shot HTTP/1.1 client for the control core's own requests to workers
//! (`/v1/models` now; health checks and load polls later): one connection per request, closed
//! after it, the whole body buffered up to a cap. Not for the data path, which pools.
//! Failures are `ProxyError`s on the upstream side.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::codec::{self, ChunkedDecoder, Framing, Method, ResponseHead};
use super::error::{ErrorKind, ProxyError};
use super::io::Socket;
use crate::limits::UPSTREAM_READ_BYTES;

/// A complete response.
#[derive(Debug)]
pub struct ClientResponse {
    /// The status code.
    pub status: u16,
    /// The de-chunked body.
    pub body: Vec<u8>,
}

fn closed(context: &'static str) -> ProxyError {
    ProxyError::upstream(ErrorKind::UpstreamClosed, context)
}

fn io_error(e: std::io::Error, context: &'static str) -> ProxyError {
    let kind = if e.kind() == std::io::ErrorKind::TimedOut {
        ErrorKind::UpstreamTimeout
    } else {
        ErrorKind::UpstreamClosed
    };
    ProxyError::upstream(kind, context).because(e)
}

/// `GET path` on the worker at `addr`, within `timeout`, with a body of at most `body_max`.
pub async fn get(
    addr: SocketAddr,
    authority: &str,
    path: &str,
    timeout: Duration,
    body_max: usize,
) -> Result<ClientResponse, ProxyError> {
    let deadline = Instant::now() + timeout;
    let mut socket = Socket::connect(addr)
        .await
        .map_err(|e| ProxyError::upstream(ErrorKind::UpstreamConnect, "connect").because(e))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: {authority}\r\naccept: application/json\r\nconnection: close\r\n\r\n"
    );
    let (result, _) = socket.write_all(request.into_bytes(), deadline).await;
    result.map_err(|e| io_error(e, "write request"))?;
    let mut buf = Vec::with_capacity(UPSTREAM_READ_BYTES);
    let head = loop {
        if let Some(head) = codec::parse_response_head(&buf, Method::Get)? {
            break head;
        }
        let (result, b) = socket.read_more(buf, UPSTREAM_READ_BYTES, deadline).await;
        buf = b;
        if result.map_err(|e| io_error(e, "read response head"))? == 0 {
            return Err(closed("read response head"));
        }
    };
    let body = read_body(&mut socket, buf, &head, deadline, body_max).await?;
    Ok(ClientResponse {
        status: head.status,
        body,
    })
}

/// Reads and de-chunks the body that follows `head` (whose bytes start `buf`).
async fn read_body(
    socket: &mut Socket,
    mut buf: Vec<u8>,
    head: &ResponseHead,
    deadline: Instant,
    body_max: usize,
) -> Result<Vec<u8>, ProxyError> {
    let mut body = Vec::new();
    let mut decoder = ChunkedDecoder::new();
    let mut fed = head.head_len;
    loop {
        let fresh = &buf[fed..];
        let done = match head.framing {
            Framing::Empty => true,
            Framing::Length(n) => {
                let take = (n as usize).saturating_sub(body.len()).min(fresh.len());
                body.extend_from_slice(&fresh[..take]);
                body.len() as u64 >= n
            }
            Framing::Chunked => {
                decoder
                    .feed(fresh, |d| body.extend_from_slice(d))
                    .map_err(|_| {
                        ProxyError::upstream(ErrorKind::UpstreamMalformed, "chunked body")
                    })?;
                decoder.is_done()
            }
            Framing::UntilClose => {
                body.extend_from_slice(fresh);
                false
            }
        };
        fed = buf.len();
        if body.len() > body_max {
            return Err(ProxyError::upstream(
                ErrorKind::UpstreamMalformed,
                "body over cap",
            ));
        }
        if done {
            return Ok(body);
        }
        let (result, b) = socket.read_more(buf, UPSTREAM_READ_BYTES, deadline).await;
        buf = b;
        match result.map_err(|e| io_error(e, "read response body"))? {
            0 if head.framing == Framing::UntilClose => return Ok(body),
            0 => return Err(closed("read response body")),
            _ => {}
        }
    }
}
