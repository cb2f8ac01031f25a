//! A one-shot HTTP/1.1 `GET` for the control core's requests to workers (health checks, load
//! polls, model discovery, the admin API's admission probe), and a one-shot JSON `POST` for a
//! prefill/decode pair whose two answers are merged, read whole or, for the decode's stream, as
//! it arrives ([`StreamingResponse`], merged event by event by the caller): one
//! connection per request, closed after it, the whole body buffered up to a cap, everything
//! within one deadline. It speaks through the same codec, body framer (`body::BodyFramer`) and
//! socket as the proxy, over TLS for an `https://` worker. Not for relayed answers, which pool.
//!
//! Failures are `ProxyError`s on the upstream side: `UpstreamConnect` (refused, unreachable),
//! `UpstreamTimeout` (the deadline passed), `UpstreamClosed` (closed early) and
//! `UpstreamMalformed` (not HTTP/1.x, or a body over the cap).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::body::BodyFramer;
use super::codec::{self, Framing, ResponseHead};
use super::socket::Socket;
use crate::error::{ErrorKind, ProxyError};
use crate::limits::UPSTREAM_READ_BYTES;
use crate::request::Method;
use crate::workers::spec::{authority_host, Scheme};

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

fn too_large() -> ProxyError {
    ProxyError::upstream(ErrorKind::UpstreamMalformed, "response body over its cap")
}

fn io_error(e: std::io::Error, context: &'static str) -> ProxyError {
    let kind = if e.kind() == std::io::ErrorKind::TimedOut {
        ErrorKind::UpstreamTimeout
    } else {
        ErrorKind::UpstreamClosed
    };
    ProxyError::upstream(kind, context).because(e)
}

/// `GET path` on the worker at `addr` (`authority` is its `Host`, and for `Scheme::Https` the
/// name its certificate must carry), within `timeout`, reading a body of at most `body_max`
/// bytes; with `bearer`, as `Authorization: Bearer <bearer>` (the workers' API key: vLLM's
/// `--api-key` guards every `/v1` route, `/v1/models` included).
pub async fn get(
    addr: SocketAddr,
    scheme: Scheme,
    authority: &str,
    path: &str,
    bearer: Option<&str>,
    timeout: Duration,
    body_max: usize,
) -> Result<ClientResponse, ProxyError> {
    let authorization = match bearer {
        Some(key) => format!("authorization: Bearer {key}\r\n"),
        None => String::new(),
    };
    let head = format!(
        "GET {path} HTTP/1.1\r\nhost: {authority}\r\naccept: application/json\r\nuser-agent: kvgate\r\n{authorization}connection: close\r\n\r\n"
    );
    let deadline = Instant::now() + timeout;
    exchange(
        addr,
        scheme,
        authority,
        head.into_bytes(),
        Method::Get,
        deadline,
        body_max,
    )
    .await
}

/// `POST path` of a JSON `body` to the worker at `addr` (`authority` is its `Host`; the
/// client's `authorization` passed on when given), answered by `deadline`, reading a body of at
/// most `body_max` bytes. The one data-path use: both sides of a prefill/decode pair whose
/// answers are merged (`http::upstream::pd`, logprobs asked for), read whole, never relayed.
#[allow(clippy::too_many_arguments)]
pub async fn post_json(
    addr: SocketAddr,
    scheme: Scheme,
    authority: &str,
    path: &str,
    authorization: Option<&[u8]>,
    body: &[u8],
    deadline: Instant,
    body_max: usize,
) -> Result<ClientResponse, ProxyError> {
    let request = post_request(authority, path, authorization, body, "application/json");
    exchange(
        addr,
        scheme,
        authority,
        request,
        Method::Post,
        deadline,
        body_max,
    )
    .await
}

/// A `POST path` of a JSON `body`, accepting `accept`, the connection closed after it.
fn post_request(
    authority: &str,
    path: &str,
    authorization: Option<&[u8]>,
    body: &[u8],
    accept: &str,
) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: {}\r\naccept: {accept}\r\nuser-agent: kvgate\r\nconnection: close\r\n",
        body.len()
    )
    .into_bytes();
    if let Some(value) = authorization {
        request.extend_from_slice(b"authorization: ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    request
}

/// Connects (over TLS for `Scheme::Https`, `authority`'s host the name its certificate must
/// carry), writes `request` whole, and reads the answer to a `method` request.
async fn exchange(
    addr: SocketAddr,
    scheme: Scheme,
    authority: &str,
    request: Vec<u8>,
    method: Method,
    deadline: Instant,
    body_max: usize,
) -> Result<ClientResponse, ProxyError> {
    let (mut socket, buf, head) = open(addr, scheme, authority, request, method, deadline).await?;
    if matches!(head.framing, Framing::Length(n) if n > body_max as u64) {
        return Err(too_large());
    }
    let body = read_body(&mut socket, buf, &head, deadline, body_max).await?;
    Ok(ClientResponse {
        status: head.status,
        body,
    })
}

/// `exchange`'s first half: connects, writes `request`, reads the response head (whose bytes,
/// and any body bytes that came with them, start the returned buffer).
async fn open(
    addr: SocketAddr,
    scheme: Scheme,
    authority: &str,
    request: Vec<u8>,
    method: Method,
    deadline: Instant,
) -> Result<(Socket, Vec<u8>, ResponseHead), ProxyError> {
    let mut socket = Socket::connect_to(addr, scheme, authority_host(authority), deadline)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => io_error(e, "connect"),
            _ => ProxyError::upstream(ErrorKind::UpstreamConnect, "connect").because(e),
        })?;
    let (result, _) = socket.write_all(request, deadline).await;
    result.map_err(|e| io_error(e, "write request"))?;
    let mut buf = Vec::with_capacity(UPSTREAM_READ_BYTES);
    let head = loop {
        if let Some(head) = codec::parse_response_head(&buf, method)? {
            break head;
        }
        let (result, b) = socket.read_more(buf, UPSTREAM_READ_BYTES, deadline).await;
        buf = b;
        if result.map_err(|e| io_error(e, "read response head"))? == 0 {
            return Err(closed("read response head"));
        }
    };
    Ok((socket, buf, head))
}

/// An answer whose body is read as it arrives: the decode side of a prefill/decode pair whose
/// stream gets the prefill's input logprobs merged into its events (`http::upstream::pd`),
/// relayed event by event. The connection closes with it.
#[derive(Debug)]
pub struct StreamingResponse {
    /// The status code.
    pub status: u16,
    socket: Socket,
    /// Bytes read and not yet fed to the framer, from `fed`.
    buf: Vec<u8>,
    fed: usize,
    framer: BodyFramer,
}

/// [`post_json`] whose answer is returned once its head is read, its body then read as it
/// arrives ([`StreamingResponse::read_more`]).
#[allow(clippy::too_many_arguments)]
pub async fn post_json_streaming(
    addr: SocketAddr,
    scheme: Scheme,
    authority: &str,
    path: &str,
    authorization: Option<&[u8]>,
    body: &[u8],
    deadline: Instant,
) -> Result<StreamingResponse, ProxyError> {
    let request = post_request(authority, path, authorization, body, "text/event-stream");
    let (socket, buf, head) =
        open(addr, scheme, authority, request, Method::Post, deadline).await?;
    Ok(StreamingResponse {
        status: head.status,
        socket,
        buf,
        fed: head.head_len,
        framer: BodyFramer::new(head.framing),
    })
}

impl StreamingResponse {
    /// Appends to `out` the de-chunked body bytes of the next read (those already read first);
    /// `Ok(false)` once the body ended. A read waits until `deadline`.
    pub async fn read_more(
        &mut self,
        out: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<bool, ProxyError> {
        loop {
            if self.framer.is_done() {
                return Ok(false);
            }
            let before = out.len();
            self.framer
                .advance(&self.buf[self.fed..], |data| out.extend_from_slice(data))?;
            self.buf.clear();
            self.fed = 0;
            if out.len() > before {
                return Ok(true);
            }
            if self.framer.is_done() {
                return Ok(false);
            }
            let buf = std::mem::take(&mut self.buf);
            let (result, buf) = self
                .socket
                .read_more(buf, UPSTREAM_READ_BYTES, deadline)
                .await;
            self.buf = buf;
            match result.map_err(|e| io_error(e, "read response body"))? {
                0 if self.framer.ends_at_close() => return Ok(false),
                0 => return Err(closed("read response body")),
                _ => {}
            }
        }
    }
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
    let mut framer = BodyFramer::new(head.framing);
    let mut fed = head.head_len;
    loop {
        framer.advance(&buf[fed..], |data| body.extend_from_slice(data))?;
        if body.len() > body_max {
            return Err(too_large());
        }
        if framer.is_done() {
            return Ok(body);
        }
        // Only the unread tail is kept: a long body never sits twice in memory.
        buf.clear();
        fed = 0;
        let (result, b) = socket.read_more(buf, UPSTREAM_READ_BYTES, deadline).await;
        buf = b;
        match result.map_err(|e| io_error(e, "read response body"))? {
            0 if framer.ends_at_close() => return Ok(body),
            0 => return Err(closed("read response body")),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Serves one canned response, in parts `delay` apart, on a fresh port; returns its address.
    fn serve_once(parts: Vec<&'static [u8]>, delay: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let mut request = [0u8; 1024];
                let _ = s.read(&mut request);
                for part in parts {
                    std::thread::sleep(delay);
                    let _ = s.write_all(part);
                }
            }
        });
        addr
    }

    fn fetch(
        addr: SocketAddr,
        timeout: Duration,
        body_max: usize,
    ) -> Result<ClientResponse, ProxyError> {
        let mut runtime = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        runtime.block_on(get(
            addr,
            Scheme::Http,
            "worker",
            "/health",
            None,
            timeout,
            body_max,
        ))
    }

    const SECOND: Duration = Duration::from_secs(1);
    const SOON: Duration = Duration::from_millis(5);

    #[test]
    fn bodies_are_read_whatever_their_framing() {
        let length = serve_once(
            vec![
                b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello",
                b" world",
            ],
            SOON,
        );
        let r = fetch(length, SECOND, 1024).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello world"[..]));
        let chunked = serve_once(
            vec![
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
                b"lo\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
            ],
            SOON,
        );
        assert_eq!(fetch(chunked, SECOND, 1024).unwrap().body, b"hello world");
        let until_close = serve_once(vec![b"HTTP/1.1 503 Busy\r\n\r\ndown"], Duration::ZERO);
        let r = fetch(until_close, SECOND, 1024).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (503, &b"down"[..]));
    }

    #[test]
    fn a_streaming_body_is_read_as_it_arrives() {
        let addr = serve_once(
            vec![
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: ",
                b"\r\n1\r\n1\r\n",
                b"2\r\n\n\n\r\n0\r\n\r\n",
            ],
            Duration::from_millis(20),
        );
        let mut runtime = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        let reads = runtime.block_on(async {
            let deadline = Instant::now() + SECOND;
            let mut answer = post_json_streaming(
                addr,
                Scheme::Http,
                "worker",
                "/generate",
                None,
                b"{}",
                deadline,
            )
            .await?;
            let mut reads = Vec::new();
            let mut out = Vec::new();
            while answer.read_more(&mut out, deadline).await? {
                reads.push(std::mem::take(&mut out));
            }
            Ok::<_, ProxyError>((answer.status, reads))
        });
        let (status, reads) = reads.unwrap();
        assert_eq!(status, 200);
        // One read per part that carried body bytes, de-chunked, in order.
        assert_eq!(reads.concat(), b"data: 1\n\n");
        assert!(reads.len() > 1, "{reads:?}");
    }

    #[test]
    fn failures_are_typed() {
        let kind = |r: Result<ClientResponse, ProxyError>| r.map(|r| r.status).unwrap_err().kind;
        let over_cap = serve_once(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"],
            SOON,
        );
        assert_eq!(
            kind(fetch(over_cap, SECOND, 10)),
            ErrorKind::UpstreamMalformed
        );
        let chunked_over_cap = serve_once(
            vec![b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n"],
            SOON,
        );
        assert_eq!(
            kind(fetch(chunked_over_cap, SECOND, 10)),
            ErrorKind::UpstreamMalformed
        );
        let garbage = serve_once(vec![b"SSH-2.0-OpenSSH\r\n\r\n"], SOON);
        assert_eq!(
            kind(fetch(garbage, SECOND, 10)),
            ErrorKind::UpstreamMalformed
        );
        let short = serve_once(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
            SOON,
        );
        assert_eq!(kind(fetch(short, SECOND, 100)), ErrorKind::UpstreamClosed);
        let refused = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(kind(fetch(refused, SECOND, 10)), ErrorKind::UpstreamConnect);
    }

    #[test]
    fn a_hanging_worker_times_out_by_the_deadline() {
        let hanging = serve_once(vec![b"HTTP/1.1 200 OK\r\n"], Duration::from_secs(3));
        let started = Instant::now();
        let result = fetch(hanging, Duration::from_millis(200), 10);
        assert_eq!(result.unwrap_err().kind, ErrorKind::UpstreamTimeout);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
