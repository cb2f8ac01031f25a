//! The HTTP/1.1 upstream: the client's request forwarded on a pooled keep-alive connection
//! (`http::pool`), the worker's response head rebuilt for the client and its body relayed as it
//! arrives, framed by `net::body::BodyFramer` so the connection can be pooled again. Owns
//! [`Http1Exchange`], the five steps of the seam for an HTTP/1.1 worker, and the whole-answer
//! read of a prefill/decode pair's prefill side (`read_whole`).
//!
//! The body goes through as the worker framed it (no copy: the client gets the bytes of the
//! worker's read buffer), except for an HTTP/1.0 client of a chunked worker, which gets it
//! de-chunked and delimited by the close. Between two reads an event stream holds no buffer
//! (`Waiting::Unbuffered`): a decode step that wakes every stream of a core at once costs one
//! buffer, not one per stream.
//!
//! Errors: `UpstreamConnect` (retryable), `UpstreamClosed` (retryable until a byte of the answer
//! came), `UpstreamTimeout`, `UpstreamMalformed`; a client gone meanwhile is `ClientClosed`,
//! shutdown's cut `ShuttingDown`.

use std::time::Instant;

use super::{
    interruption, Attempt, BodyKind, BodySource, BodyStop, HeadContext, HeadRead, Interrupted,
    ResponseStart,
};
use crate::copy;
use crate::error::{ErrorKind, ProxyError, Retry, Side};
use crate::http::core::DataCore;
use crate::http::downstream::{ClientSide, Forwarded};
use crate::http::pool::UpstreamConn;
use crate::ids::WorkerId;
use crate::limits::{
    FORWARD_BODY_COPY_BYTES_MAX, STREAM_READ_BYTES, UPSTREAM_CONNECT_TIMEOUT, UPSTREAM_READ_BYTES,
};
use crate::metrics::Counter;
use crate::net::body::BodyFramer;
use crate::net::client::ClientResponse;
use crate::net::codec::{
    self, Connection, DownstreamFraming, Framing, GatewayHeaders, ResponseHead,
};
use crate::net::socket::{Socket, Watched};
use crate::request::id::REQUEST_ID_HEADER;
use crate::request::Method;
use crate::workers::table::WorkerEntry;

/// One attempt on an HTTP/1.1 connection, and where its response stands.
#[derive(Debug)]
pub struct Http1Exchange {
    conn: UpstreamConn,
    /// Where the worker's body ends (set with the head).
    body: BodyFramer,
    /// How the client's body is framed.
    client_framing: DownstreamFraming,
    /// Whether the body is de-chunked for the client (an HTTP/1.0 client of a chunked worker).
    dechunk: bool,
    body_kind: BodyKind,
    /// The worker's head keeps the connection open.
    worker_keeps_connection: bool,
    /// Bytes came after the body's end: the connection's framing is not to be trusted again.
    leftover: bool,
}

/// How a read waits for the worker's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiting {
    /// With the read buffer handed to the kernel: one operation, for answers that come soon.
    Buffered,
    /// Holding no buffer until bytes are ready (a poll, then the read): for a stream between
    /// two tokens, which waits far longer than it moves bytes.
    Unbuffered,
}

impl Http1Exchange {
    /// Step 1: a pooled keep-alive connection to `worker`, or a new one.
    pub(super) async fn connect_or_reuse(
        core: &DataCore,
        worker: &WorkerEntry,
    ) -> Result<Self, ProxyError> {
        let pooled = core
            .pool
            .borrow_mut()
            .take(worker.id, worker.spec.addr, Instant::now());
        let conn = match pooled {
            Some(conn) => {
                core.metrics().incr(Counter::UpstreamConnectionsReused);
                conn
            }
            None => {
                let spec = &worker.spec;
                let deadline = Instant::now() + UPSTREAM_CONNECT_TIMEOUT;
                let connected = Socket::connect_to(spec.addr, spec.scheme, spec.host(), deadline);
                let socket = connected.await.map_err(|e| {
                    ProxyError::upstream(ErrorKind::UpstreamConnect, "connect")
                        .because(e)
                        .retryable()
                })?;
                core.metrics().incr(Counter::UpstreamConnectionsOpened);
                UpstreamConn::new(socket, worker.spec.addr)
            }
        };
        Ok(Http1Exchange {
            conn,
            body: BodyFramer::new(Framing::Empty),
            client_framing: DownstreamFraming::Empty,
            dechunk: false,
            body_kind: BodyKind::Other,
            worker_keeps_connection: false,
            leftover: false,
        })
    }

    pub(super) fn reused(&self) -> bool {
        self.conn.reused
    }

    /// Step 2: the rebuilt head (hop-by-hop headers dropped, `Via` added), then the complete
    /// body, in a buffer borrowed from the core for the write and lent back once it is sent.
    pub(super) async fn forward(
        &mut self,
        core: &DataCore,
        request: &mut Forwarded<'_>,
        attempt: &Attempt<'_>,
    ) -> Result<(), ProxyError> {
        let up = &mut self.conn;
        core.spare_buffers
            .borrow_mut()
            .borrow_into(&mut up.write_buf);
        let authority = &attempt.worker.spec.authority;
        write_request(up, request, authority, core, attempt.deadline).await?;
        // Sent: the request's buffer is not needed while the response streams.
        up.write_buf.clear();
        core.spare_buffers.borrow_mut().lend(&mut up.write_buf);
        Ok(())
    }

    /// Step 2 with a body of the gateway's own in place of the client's (a prefill/decode
    /// pair's rewritten body): the client's rebuilt head with `body`'s length, then `body`.
    pub(super) async fn forward_body(
        &mut self,
        core: &DataCore,
        request: &Forwarded<'_>,
        body: &[u8],
        attempt: &Attempt<'_>,
    ) -> Result<(), ProxyError> {
        let up = &mut self.conn;
        core.spare_buffers
            .borrow_mut()
            .borrow_into(&mut up.write_buf);
        up.write_buf.clear();
        codec::write_upstream_request_head_via(
            &mut up.write_buf,
            request.head,
            request.read_buf,
            &attempt.worker.spec.authority,
            core.shared.config.via_pseudonym.as_str(),
            upstream_request_id_line(request),
            body.len(),
        );
        copy::extend_from_slice(&mut up.write_buf, body);
        let (result, buf) = up
            .socket
            .write_all(std::mem::take(&mut up.write_buf), attempt.deadline)
            .await;
        up.write_buf = buf;
        result.map_err(|e| upstream_io_error(e, "forward request"))?;
        up.write_buf.clear();
        core.spare_buffers.borrow_mut().lend(&mut up.write_buf);
        Ok(())
    }

    /// Steps 3 and 4 for an answer the gateway reads rather than relays (a prefill/decode
    /// pair's prefill side): the head and the whole de-chunked body, at most `body_max` bytes,
    /// by `deadline`. It watches no client (the pair's relayed side does); the connection can
    /// then be given back as after a relayed body.
    pub(super) async fn read_whole(
        &mut self,
        method: Method,
        deadline: Instant,
        body_max: usize,
    ) -> Result<ClientResponse, ProxyError> {
        let up = &mut self.conn;
        up.read_buf.clear();
        let head = loop {
            if let Some(head) = codec::parse_response_head(&up.read_buf, method)? {
                if head.status >= 200 {
                    break head;
                }
                // An interim 1xx answer: the final one follows it.
                up.read_buf.drain(..head.head_len);
                continue;
            }
            let buf = std::mem::take(&mut up.read_buf);
            let (result, buf) = up
                .socket
                .read_more(buf, UPSTREAM_READ_BYTES, deadline)
                .await;
            up.read_buf = buf;
            if result.map_err(|e| upstream_io_error(e, "read answer head"))? == 0 {
                return Err(upstream_io_error(closed_early(), "read answer head"));
            }
        };
        let too_large =
            || ProxyError::upstream(ErrorKind::UpstreamMalformed, "answer over its cap");
        if matches!(head.framing, Framing::Length(n) if n > body_max as u64) {
            return Err(too_large());
        }
        self.body = BodyFramer::new(head.framing);
        self.worker_keeps_connection = head.connection.is_kept();
        let mut body = Vec::new();
        let mut fed = head.head_len;
        loop {
            let available = &up.read_buf[fed..];
            let consumed = self
                .body
                .advance(available, |data| copy::extend_from_slice(&mut body, data))?;
            self.leftover |= consumed < available.len();
            if body.len() > body_max {
                return Err(too_large());
            }
            if self.body.is_done() {
                break;
            }
            up.read_buf.clear();
            fed = 0;
            let buf = std::mem::take(&mut up.read_buf);
            let (result, buf) = up
                .socket
                .read_more(buf, UPSTREAM_READ_BYTES, deadline)
                .await;
            up.read_buf = buf;
            match result.map_err(|e| upstream_io_error(e, "read answer body"))? {
                0 if self.body.ends_at_close() => break,
                0 => return Err(upstream_io_error(closed_early(), "read answer body")),
                _ => {}
            }
        }
        Ok(ClientResponse {
            status: head.status,
            body,
        })
    }

    /// Step 3: the worker's head (interim 1xx answers skipped), then, when it is relayed, the
    /// client's head with the body bytes that came with it.
    pub(super) async fn read_head(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        context: HeadContext<'_>,
        deadline: Instant,
    ) -> Result<HeadRead, ProxyError> {
        // The head (512 bytes of header spans) lives in this call only: a stream does not carry
        // it through its waits.
        let head = read_response_head(
            core,
            &mut self.conn,
            client.socket,
            context.method,
            deadline,
        )
        .await?;
        if !context.admit_status(core, head.status) {
            return Ok(HeadRead::RetryableStatus(head.status));
        }
        self.start_response(core, client, &head, context.gateway_headers)
            .map(HeadRead::Relaying)
    }

    /// Chooses the client's framing and connection for `head`, writes the client's head into
    /// `client.write_buf` and passes the body bytes read with the head behind it.
    fn start_response(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        head: &ResponseHead,
        gateway_headers: GatewayHeaders<'_>,
    ) -> Result<ResponseStart, ProxyError> {
        let up = &self.conn;
        let event_stream = head
            .headers
            .get(&up.read_buf, "content-type")
            .is_some_and(|v| v.starts_with(b"text/event-stream"));
        self.body_kind = if event_stream {
            BodyKind::EventStream
        } else {
            BodyKind::Other
        };
        let framing = DownstreamFraming::choose(head.framing, client.version_minor);
        let connection = client.connection.and(Connection::keep_if(
            framing != DownstreamFraming::UntilClose && !core.shared.is_shutting_down(),
        ));
        self.body = BodyFramer::new(head.framing);
        self.client_framing = framing;
        self.dechunk = head.framing == Framing::Chunked && framing == DownstreamFraming::UntilClose;
        self.worker_keeps_connection = head.connection.is_kept();
        client.write_buf.clear();
        codec::write_downstream_response_head(
            client.write_buf,
            head,
            &up.read_buf,
            gateway_headers,
            framing,
            connection,
        );
        let available = &up.read_buf[head.head_len..];
        let consumed = advance(&mut self.body, self.dechunk, available, client.write_buf)?;
        if !self.dechunk {
            copy::extend_from_slice(client.write_buf, &available[..consumed]);
        }
        self.leftover = consumed < available.len();
        Ok(ResponseStart {
            status: head.status,
            body_kind: self.body_kind,
            connection,
            body_begun: !available.is_empty(),
        })
    }

    /// Step 4: one read of the body. Its bytes stay in the read buffer, cut to the body's end
    /// (`BodySource::Exchange`), or are de-chunked into `client.write_buf`.
    pub(super) async fn read_body(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        deadline: Instant,
    ) -> Result<Option<BodySource>, BodyStop> {
        // Between two reads a stream holds no buffer (see `read_upstream`).
        self.conn.read_buf.clear();
        let waiting = match self.body_kind {
            BodyKind::EventStream => Waiting::Unbuffered,
            BodyKind::Other => Waiting::Buffered,
        };
        let read = read_upstream(core, &mut self.conn, client.socket, waiting, deadline).await;
        let n = match read {
            Err(Interrupted::ClientGone) => return Err(BodyStop::ClientGone),
            Err(Interrupted::ShutdownCut) => return Err(BodyStop::ShutdownCut),
            Ok(Ok(0)) if self.body.ends_at_close() => return Ok(None),
            Ok(Ok(n)) if n > 0 => n,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamTimeout))
            }
            Ok(_) => return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamClosed)),
        };
        if self.dechunk {
            core.spare_buffers
                .borrow_mut()
                .borrow_into(client.write_buf);
        }
        let up = &mut self.conn;
        let consumed = advance(&mut self.body, self.dechunk, &up.read_buf, client.write_buf)
            .map_err(|e| BodyStop::WorkerFailed(e.kind))?;
        self.leftover |= consumed < n;
        if self.dechunk {
            return Ok(Some(BodySource::Client));
        }
        // What follows the body's end is not this response's.
        up.read_buf.truncate(consumed);
        Ok(Some(BodySource::Exchange))
    }

    pub(super) fn body_done(&self) -> bool {
        self.body.is_done()
    }

    pub(super) fn relay_buf(&mut self) -> &mut Vec<u8> {
        &mut self.conn.read_buf
    }

    /// The client's body is the worker's chunked framing passed through, and that stands
    /// between two chunks.
    pub(super) fn client_at_chunk_boundary(&self) -> bool {
        self.client_framing == DownstreamFraming::ChunkedPassthrough
            && self.body.at_chunk_boundary()
    }

    /// Step 5: pools the connection when the worker keeps it and every byte read was the
    /// body's; an idle connection holds no buffer.
    pub(super) fn give_back(mut self, core: &DataCore, worker: WorkerId) {
        if !self.worker_keeps_connection || self.leftover || !self.body.is_done() {
            return;
        }
        self.conn.read_buf.clear();
        core.spare_buffers
            .borrow_mut()
            .lend(&mut self.conn.read_buf);
        core.pool
            .borrow_mut()
            .put(worker, self.conn, Instant::now());
    }
}

/// Feeds `input` to the worker's body; appends its de-chunked data to `decoded` when
/// de-chunking. Returns the bytes that were the body's.
fn advance(
    body: &mut BodyFramer,
    dechunk: bool,
    input: &[u8],
    decoded: &mut Vec<u8>,
) -> Result<usize, ProxyError> {
    body.advance(input, |data| {
        if dechunk {
            copy::extend_from_slice(decoded, data)
        }
    })
}

/// The worker closed before its answer ended.
fn closed_early() -> std::io::Error {
    std::io::Error::from(std::io::ErrorKind::UnexpectedEof)
}

fn upstream_io_error(error: std::io::Error, context: &'static str) -> ProxyError {
    if error.kind() == std::io::ErrorKind::TimedOut {
        ProxyError::upstream(ErrorKind::UpstreamTimeout, context).because(error)
    } else {
        ProxyError::upstream(ErrorKind::UpstreamClosed, context)
            .because(error)
            .retryable()
    }
}

/// Writes the request: the rebuilt head, then the complete body. A small body is copied behind
/// the head (one write); a larger one is written from the client's read buffer, where it lies,
/// so the gateway never holds a body twice.
async fn write_request(
    up: &mut UpstreamConn,
    request: &mut Forwarded<'_>,
    authority: &str,
    core: &DataCore,
    deadline: Instant,
) -> Result<(), ProxyError> {
    let body = request.body.clone();
    up.write_buf.clear();
    codec::write_upstream_request_head_via(
        &mut up.write_buf,
        request.head,
        request.read_buf,
        authority,
        core.shared.config.via_pseudonym.as_str(),
        upstream_request_id_line(request),
        body.len(),
    );
    let body_copied = body.len() <= FORWARD_BODY_COPY_BYTES_MAX;
    if body_copied {
        copy::extend_from_slice(&mut up.write_buf, &request.read_buf[body.clone()]);
    }
    let (result, buf) = up
        .socket
        .write_all(std::mem::take(&mut up.write_buf), deadline)
        .await;
    up.write_buf = buf;
    result.map_err(|e| upstream_io_error(e, "forward request"))?;
    if body_copied {
        return Ok(());
    }
    let read_buf = std::mem::take(request.read_buf);
    let (result, buf) = up.socket.write_range(read_buf, body, deadline).await;
    *request.read_buf = buf;
    result.map_err(|e| upstream_io_error(e, "forward request body"))
}

/// The id line the worker gets: the gateway's, unless the client sent its own `x-request-id`,
/// which goes through untouched with the other end-to-end headers.
fn upstream_request_id_line<'r>(request: &'r Forwarded<'_>) -> &'r [u8] {
    let sent = request
        .head
        .headers
        .get(request.read_buf, REQUEST_ID_HEADER);
    match sent {
        Some(_) => b"",
        None => request.request_id.header_line(),
    }
}

/// One read of the worker's response, given up (the read cancelled) when the client goes or
/// shutdown cuts the request. Waiting `Unbuffered` with nothing partial in the read buffer,
/// the empty buffer is lent to the core and one is borrowed back when bytes are ready.
async fn read_upstream(
    core: &DataCore,
    up: &mut UpstreamConn,
    client: &Socket,
    waiting: Waiting,
    deadline: Instant,
) -> Result<std::io::Result<usize>, Interrupted> {
    if waiting == Waiting::Unbuffered && up.read_buf.is_empty() {
        return read_upstream_when_ready(core, up, client, deadline).await;
    }
    let read_bytes = match waiting {
        Waiting::Buffered => UPSTREAM_READ_BYTES,
        Waiting::Unbuffered => STREAM_READ_BYTES,
    };
    let read_buf = std::mem::take(&mut up.read_buf);
    let stop = std::pin::pin!(interruption(core, client, deadline));
    let (watched, buf) = up.socket.read_more_unless(read_buf, read_bytes, stop).await;
    up.read_buf = buf;
    match watched {
        Watched::Read(result) => Ok(result),
        Watched::Stopped => Err(Interrupted::of(client)),
    }
}

/// `read_upstream` holding no buffer: waits for readiness, then reads what is there at once.
async fn read_upstream_when_ready(
    core: &DataCore,
    up: &mut UpstreamConn,
    client: &Socket,
    deadline: Instant,
) -> Result<std::io::Result<usize>, Interrupted> {
    core.spare_buffers.borrow_mut().lend(&mut up.read_buf);
    loop {
        let ready = up
            .socket
            .readable_unless(std::pin::pin!(interruption(core, client, deadline)))
            .await;
        match ready {
            None => return Err(Interrupted::of(client)),
            Some(Err(e)) => return Ok(Err(e)),
            Some(Ok(())) => {}
        }
        // Read now, and the relay writes now (`Relay::Now`): when a decode step ends every
        // stream of the core wakes at once, and a stream that held its buffer across a ring
        // read and write would make that burst cost a buffer per stream. Within one poll of the
        // task, one buffer serves them all.
        core.spare_buffers
            .borrow_mut()
            .borrow_into(&mut up.read_buf);
        match up.socket.read_now(&mut up.read_buf, STREAM_READ_BYTES) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                core.spare_buffers.borrow_mut().lend(&mut up.read_buf);
            }
            read => return Ok(read),
        }
    }
}

/// Reads the worker's response head, skipping interim (1xx) responses. A client that goes
/// meanwhile ends the attempt (`ClientClosed`, nginx's 499): the caller closes the upstream
/// connection, so the engine stops working on a request nobody waits for. Shutdown's cut
/// ends it too (`ShuttingDown`, a 503).
async fn read_response_head(
    core: &DataCore,
    up: &mut UpstreamConn,
    client: &Socket,
    method: Method,
    deadline: Instant,
) -> Result<ResponseHead, ProxyError> {
    loop {
        if !up.read_buf.is_empty() {
            if let Some(head) = codec::parse_response_head(&up.read_buf, method)? {
                if (100..200).contains(&head.status) {
                    up.read_buf.drain(..head.head_len);
                    continue;
                }
                return Ok(head);
            }
        }
        let nothing_yet = up.read_buf.is_empty();
        let read = read_upstream(core, up, client, Waiting::Buffered, deadline).await;
        match read.map_err(head_interrupted)? {
            Ok(n) if n > 0 => {}
            Ok(_) => {
                let error = ProxyError::upstream(ErrorKind::UpstreamClosed, "read response head");
                // Closed before a byte of the answer: the worker dropped the request unanswered.
                return Err(if nothing_yet {
                    error.retryable()
                } else {
                    error
                });
            }
            Err(e) => {
                let error = upstream_io_error(e, "read response head");
                return Err(if nothing_yet {
                    error
                } else {
                    ProxyError {
                        retry: Retry::No,
                        ..error
                    }
                });
            }
        }
    }
}

/// The error of a head read the client's close or shutdown interrupted.
fn head_interrupted(interrupted: Interrupted) -> ProxyError {
    match interrupted {
        Interrupted::ClientGone => ProxyError::downstream(
            ErrorKind::ClientClosed,
            "client gone while waiting for the response",
        ),
        Interrupted::ShutdownCut => ProxyError::new(
            ErrorKind::ShuttingDown,
            Side::Internal,
            "shutdown grace period over while waiting for the response",
        ),
    }
}
