//! The downstream side of a data core: one task per client connection runs `serve_connection`,
//! which loops over keep-alive requests: parse (head, then body: `Content-Length` or chunked,
//! `Expect: 100-continue`, limits and timeouts), classify, then either answer locally (health,
//! models), refuse (`refused_routed`: 401 without the `--api-key` token, 508 when the `Via`
//! shows the request looped back; admin calls by `workers::admin::check_access`) or hand the
//! request to the proxy driver (`proxy::proxy_request`). A request its head already refuses gets
//! no `100 Continue`. Bytes after a request stay in the read buffer for the next one, so
//! pipelined requests are served in order.
//!
//! A body is held once, in the read buffer it arrived in: a `Content-Length` body is read into
//! room that doubles as its bytes arrive, never past its size, a chunked one is de-chunked in
//! place (`ChunkedDecoder::decode_in_place`), and every body is charged to the core's
//! [`BodyBudget`](super::core::BodyBudget) as its bytes arrive, while its request runs (503 past
//! it). What a client announces costs nothing until it sends it; a body must arrive whole
//! within `--stream-body-stall-timeout-secs` (408), and a request its head refuses is answered
//! without waiting for its body.
//!
//! Errors become JSON answers through `answer_error`, using `ErrorKind`'s status and its
//! keep-or-close decision; a client that is gone gets nothing.

use std::rc::Rc;
use std::time::Instant;

use super::core::DataCore;
use super::downstream::{
    answer_error, write_to_client, Answered, Downstream, PreparedSlot, Request,
};
use super::{admin, proxy};
use crate::config::Config;
use crate::error::{ErrorKind, ProxyError};
use crate::limits::{KEEPALIVE_BUFFERED_WAIT, READ_BUF_BYTES_INITIAL, READ_BUF_BYTES_RETAINED_MAX};
use crate::metrics::{Counter, Latency};
use crate::net::codec::{self, ChunkError, ChunkedDecoder, Connection, Framing, RequestHead};
use crate::net::memory;
use crate::net::socket::{self, read_spare, Socket};
use crate::request::id::RequestId;
use crate::request::{Endpoint, Handling, Method};
use crate::workers::admin::{bearer_matches, check_access, route_admin};

/// Serves one client connection until it closes, errs or the gateway shuts down. With
/// `--tls-cert-path` the TLS handshake comes first, within `--tls-handshake-timeout-ms`; a
/// client that fails it or runs out of time is closed without an answer (nothing can reach it).
pub async fn serve_connection(core: Rc<DataCore>, mut socket: Socket) {
    core.metrics().incr(Counter::DownstreamConnectionsAccepted);
    let tls = &core.shared.config.tls;
    if let Some(server) = &tls.server {
        let deadline = Instant::now() + tls.handshake_timeout;
        if let Err(e) = socket.accept_tls(server, deadline).await {
            tracing::debug!("TLS handshake with a client failed: {e}");
            return;
        }
    }
    let mut down = Downstream {
        socket,
        read_buf: Vec::with_capacity(READ_BUF_BYTES_INITIAL),
        write_buf: Vec::with_capacity(READ_BUF_BYTES_INITIAL),
        prepared: PreparedSlot::default(),
        body_charged_bytes: 0,
        request_end: 0,
        request_id: RequestId::default(),
    };
    serve_requests(&core, &mut down).await;
    core.body_budget.release(&mut down.body_charged_bytes);
    if down.read_buf.capacity() > READ_BUF_BYTES_RETAINED_MAX {
        // A large body's buffer, freed with the connection.
        drop(down);
        core.return_memory_soon();
    }
}

/// The keep-alive loop of `serve_connection`.
async fn serve_requests(core: &Rc<DataCore>, down: &mut Downstream) {
    loop {
        let Some(request) = next_request(core, down).await else {
            return;
        };
        if core.shared.is_shutting_down() {
            // Listeners are closed; a request on a connection still open is refused, and the
            // client told to go elsewhere.
            let answered = answer_error(down, ErrorKind::ShuttingDown, Connection::Close).await;
            let endpoint = Endpoint::of_path(request.head.path(&down.read_buf));
            core.metrics()
                .record_request(request.head.method, endpoint, answered.status);
            return;
        }
        let in_flight = core.requests_in_flight.get() + 1;
        core.requests_in_flight.set(in_flight);
        core.metrics().set_requests_in_flight(in_flight);
        down.request_end = request.end;
        let connection = handle_request(core, down, &request).await;
        let in_flight = core.requests_in_flight.get() - 1;
        core.requests_in_flight.set(in_flight);
        core.metrics().set_requests_in_flight(in_flight);
        finish_request(core, down);
        if !connection.is_kept() || core.shared.is_shutting_down() {
            return;
        }
    }
}

/// The connection's next request; `None` when the client is done, or when its request could not
/// be read (answered here; the connection closes). A function of its own so that the read's
/// result is not held across the error answer's wait in `serve_requests`, where it would take
/// 640 bytes of every connection's task, streams included.
async fn next_request(core: &DataCore, down: &mut Downstream) -> Option<Request> {
    // A head that does not parse gets an answer without the last request's id.
    down.request_id.clear();
    match read_request(down, core).await {
        Ok(request) => request,
        Err(error) => {
            let answered = answer_error(down, error.kind, Connection::Close).await;
            core.metrics()
                .record_request(Method::Other, Endpoint::Unknown, answered.status);
            None
        }
    }
}

/// Drops the served request's bytes, keeping any pipelined bytes after it, and gives its body
/// bytes back to the core's budget, and a buffer a large body grew back to the system.
fn finish_request(core: &Rc<DataCore>, down: &mut Downstream) {
    down.read_buf.drain(..std::mem::take(&mut down.request_end));
    if down.read_buf.capacity() > READ_BUF_BYTES_RETAINED_MAX {
        down.read_buf.shrink_to(READ_BUF_BYTES_INITIAL);
        core.return_memory_soon();
    }
    core.body_budget.release(&mut down.body_charged_bytes);
    down.prepared.shed_large_buffers();
}

/// The classify phase and dispatch; returns what becomes of the connection.
async fn handle_request(core: &DataCore, down: &mut Downstream, request: &Request) -> Connection {
    let endpoint = Endpoint::of_path(request.head.path(&down.read_buf));
    let method = request.head.method;
    let connection = request.head.connection;
    if endpoint == Endpoint::Unknown {
        let path = std::str::from_utf8(request.head.path(&down.read_buf)).unwrap_or("");
        let method_text = request.head.method_text(&down.read_buf);
        if let Some(route) = route_admin(method_text, path) {
            let answered = admin::answer_admin_call(core, down, request, route).await;
            core.metrics()
                .record_request(method, endpoint, answered.status);
            return answered.connection;
        }
    }
    let started = Instant::now();
    let handling = endpoint.handling(method);
    let refused = match handling {
        Handling::Proxy => refused_routed(&core.shared.config, &request.head, &down.read_buf),
        _ => None,
    };
    let (answered, head_timed) = match (handling, refused) {
        (_, Some(kind)) => (answer_error(down, kind, connection).await, false),
        (Handling::Proxy, None) => {
            match proxy::proxy_request(core, down, request, endpoint, started).await {
                // The proxy timed the response head when it wrote it.
                Ok(answered) => (answered, true),
                Err(error) => (answer_error(down, error.kind, connection).await, false),
            }
        }
        (Handling::Local, None) => {
            let answered = answer_local(core, down, endpoint, method, connection).await;
            (answered, false)
        }
        (Handling::WrongMethod, None) => {
            let answered = answer_error(down, ErrorKind::MethodNotAllowed, connection).await;
            (answered, false)
        }
        (Handling::NotFound, None) => (
            answer_error(down, ErrorKind::NotFound, connection).await,
            false,
        ),
    };
    let metrics = core.metrics();
    let elapsed = started.elapsed();
    if !head_timed {
        // A local answer is written in one piece: its head and its end are the same moment.
        metrics.observe_latency(Latency::FirstByte, (method, endpoint), elapsed);
    }
    metrics.observe_latency(Latency::EndToEnd, (method, endpoint), elapsed);
    metrics.record_request(method, endpoint, answered.status);
    log_finished(&down.request_id, method, answered.status, elapsed);
    answered.connection
}

/// The request's last log line, after its answer (SMG's `smg::response` line, at debug: a
/// line per request at the default level would cost every request its formatting). It reads
/// nothing of the request's bytes: a streamed answer let go of them when it committed.
fn log_finished(id: &RequestId, method: Method, status: u16, elapsed: std::time::Duration) {
    tracing::debug!(
        target: "smg::response",
        request_id = id.as_str(),
        method = method.as_str(),
        status,
        latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        "finished processing request"
    );
}

/// Answers `/health`, `/liveness`, `/readiness` and `/v1/models`.
async fn answer_local(
    core: &DataCore,
    down: &mut Downstream,
    endpoint: Endpoint,
    method: Method,
    connection: Connection,
) -> Answered {
    let catalog;
    let (status, body): (u16, &[u8]) = match endpoint {
        Endpoint::Models => {
            catalog = core.shared.catalog.load();
            (200, catalog.models_body())
        }
        Endpoint::Readiness if !core.shared.table.has_eligible_worker() => (
            503,
            br#"{"status":"not ready","reason":"no healthy worker"}"#,
        ),
        Endpoint::Readiness => (200, br#"{"status":"ready"}"#),
        _ => (200, br#"{"status":"ok"}"#),
    };
    down.write_buf.clear();
    codec::write_local_response_with_id(
        &mut down.write_buf,
        status,
        "application/json",
        body,
        connection,
        down.request_id.header_line(),
    );
    if method == Method::Head {
        down.write_buf.truncate(down.write_buf.len() - body.len());
    }
    let written = write_to_client(&mut down.socket, &mut down.write_buf, 0).await;
    Answered {
        status,
        connection: connection.and(Connection::keep_if(written)),
    }
}

/// Where in the request stream a read happens: between requests the client may close (a clean
/// end), within one it may not (its request is cut short).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadPhase {
    /// Nothing of the next request has arrived yet.
    BetweenRequests,
    /// Part of a request has arrived.
    WithinRequest,
}

/// Why reading from the client stopped.
enum ReadEnd {
    /// Bytes arrived.
    Data,
    /// The client closed or the idle timeout passed with nothing pending: a clean end.
    Closed,
}

/// Reads more client bytes into `read_buf` (room for at least `spare` more made first),
/// mapping failures to the error kind that fits the phase of the request stream.
async fn read_client(
    down: &mut Downstream,
    deadline: Instant,
    phase: ReadPhase,
    spare: usize,
) -> Result<ReadEnd, ProxyError> {
    let (result, buf) = down
        .socket
        .read_more(std::mem::take(&mut down.read_buf), spare, deadline)
        .await;
    down.read_buf = buf;
    match result {
        Ok(n) if n > 0 => Ok(ReadEnd::Data),
        _ if phase == ReadPhase::BetweenRequests => Ok(ReadEnd::Closed),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            Err(ProxyError::downstream(ErrorKind::RequestTimeout, "read request").because(e))
        }
        Ok(_) => Err(ProxyError::downstream(
            ErrorKind::ClientClosed,
            "read request",
        )),
        Err(e) => Err(ProxyError::downstream(ErrorKind::ClientClosed, "read request").because(e)),
    }
}

/// Charges `bytes` of body to the core's budget, or refuses the request (503, counted).
fn charge_body(core: &DataCore, down: &mut Downstream, bytes: usize) -> Result<(), ProxyError> {
    if core
        .body_budget
        .charge_up_to(&mut down.body_charged_bytes, bytes)
    {
        return Ok(());
    }
    core.metrics().incr(Counter::BodyBudgetRejections);
    Err(ProxyError::downstream(
        ErrorKind::BodyBudgetExceeded,
        "charge request body",
    ))
}

/// The parse phase: reads one complete request, or `None` when the client is done.
///
/// A request its head already refuses (`refused_before_body`: no `--api-key` token, no such
/// route, the admin API closed or its key missing) is answered before its body is read when
/// that body has not all arrived: nothing of it is waited for or held, and the connection
/// closes after the answer (its unread body stands where the next request would).
pub async fn read_request(
    down: &mut Downstream,
    core: &DataCore,
) -> Result<Option<Request>, ProxyError> {
    let config = &core.shared.config;
    let max_payload = config.max_payload_bytes;
    let Some(head) = read_request_head(down, core).await? else {
        return Ok(None);
    };
    // Every answer from here on carries the id, the early refusals included.
    let read_buf = &down.read_buf;
    down.request_id.assign(
        &config.request_id_headers,
        |name| head.headers.get(read_buf, name),
        head.path(read_buf),
    );
    let head_len = head.head_len;
    let body_pending = match head.framing {
        Framing::Length(n) => (down.read_buf.len() as u64) < (head_len as u64).saturating_add(n),
        Framing::Chunked => true,
        Framing::Empty | Framing::UntilClose => false,
    };
    // `100 Continue` invites the body: never to a caller who will be refused anyway.
    if head.expect_continue || body_pending {
        if let Some(kind) = refused_before_body(&head, &down.read_buf, config) {
            return Err(ProxyError::downstream(kind, "refuse from the head"));
        }
    }
    // The body's whole-arrival deadline (`--stream-body-stall-timeout-secs`).
    let body_deadline = config.body_read_timeout.map(|t| Instant::now() + t);
    match head.framing {
        Framing::Length(n) if n > max_payload as u64 => Err(ProxyError::downstream(
            ErrorKind::PayloadTooLarge,
            "read request body",
        )),
        Framing::Length(n) => {
            let end = head_len + n as usize;
            send_continue_if_expected(down, &head, end).await?;
            loop {
                // Charged as its bytes arrive, not as announced: a client that announces a
                // large body and sends little of it holds little of the core's budget.
                let arrived = down.read_buf.len().min(end) - head_len;
                charge_body(core, down, arrived)?;
                if down.read_buf.len() >= end {
                    break;
                }
                make_room_for_body(&mut down.read_buf, end);
                let spare = down.read_buf.capacity() - down.read_buf.len();
                let deadline = body_read_deadline(config, body_deadline);
                // A partial request never ends cleanly: EOF is an error here.
                read_client(down, deadline, ReadPhase::WithinRequest, spare).await?;
            }
            Ok(Some(Request {
                head,
                body: head_len..end,
                end,
            }))
        }
        // Boxed: the de-chunking reader's state (4 KB) would otherwise be part of every
        // connection's task for its whole life, streams included; chunked request bodies are
        // the rare framing, and one allocation each is cheap beside reading them.
        Framing::Chunked => Box::pin(read_chunked_body(down, head, core, body_deadline))
            .await
            .map(Some),
        Framing::Empty | Framing::UntilClose => Ok(Some(Request {
            head,
            body: head_len..head_len,
            end: head_len,
        })),
    }
}

/// The deadline of the next body read: `header_read_timeout` from now (a pause between two
/// reads), never past the whole body's deadline.
fn body_read_deadline(config: &Config, body_deadline: Option<Instant>) -> Instant {
    let pause = Instant::now() + config.header_read_timeout;
    body_deadline.map_or(pause, |whole| pause.min(whole))
}

/// Makes room in `buf` for the next read of a body that ends at `end`, as its bytes arrive:
/// the capacity doubles, never past `end`, so what a connection holds follows what it was sent,
/// not the length it announced, and a body that does arrive whole takes at most one and a half
/// times its size while the last doubling copies it.
fn make_room_for_body(buf: &mut Vec<u8>, end: usize) {
    let room = buf.capacity() - buf.len();
    let wanted = (end - buf.len()).min(READ_BUF_BYTES_INITIAL);
    if room >= wanted {
        return;
    }
    let target = (buf.capacity() * 2)
        .max(buf.len() + READ_BUF_BYTES_INITIAL)
        .min(end);
    grow_read_buf(buf, target);
}

/// Grows a request's read buffer to `capacity` (exactly), and when the buffer it outgrew was
/// large, has the allocator give that one's pages back at once: otherwise the buffers a large
/// body outgrows on its way (half its size, all told) stay with the allocator and a body
/// peaks at one more copy of itself (`perf/results-chaos.md`).
fn grow_read_buf(buf: &mut Vec<u8>, capacity: usize) {
    let outgrown = buf.capacity();
    if outgrown >= capacity {
        return;
    }
    buf.reserve_exact(capacity - buf.len());
    if outgrown > READ_BUF_BYTES_RETAINED_MAX {
        memory::return_freed_pages();
    }
}

async fn read_request_head(
    down: &mut Downstream,
    core: &DataCore,
) -> Result<Option<RequestHead>, ProxyError> {
    let config = &core.shared.config;
    let mut head_deadline = None;
    loop {
        if !down.read_buf.is_empty() {
            if let Some(head) = codec::parse_request_head(&down.read_buf)? {
                return Ok(Some(head));
            }
        }
        let (phase, deadline) = if down.read_buf.is_empty() {
            let idle_deadline = Instant::now() + config.client_idle_timeout;
            (ReadPhase::BetweenRequests, idle_deadline)
        } else {
            let head_deadline =
                *head_deadline.get_or_insert_with(|| Instant::now() + config.header_read_timeout);
            (ReadPhase::WithinRequest, head_deadline)
        };
        let read = if phase == ReadPhase::BetweenRequests {
            wait_for_next_request(down, core, deadline).await?
        } else {
            let spare = read_spare(&down.read_buf, READ_BUF_BYTES_INITIAL);
            read_client(down, deadline, phase, spare).await?
        };
        if let ReadEnd::Closed = read {
            return Ok(None);
        }
    }
}

/// Reads the first bytes of a kept-alive connection's next request. For its first
/// `KEEPALIVE_BUFFERED_WAIT` it waits in a read (one operation: a busy client's next request
/// comes at once); a connection idle longer gives its empty buffers to the core and waits for
/// readiness holding none, so thousands of idle connections cost their tasks, not their
/// buffers. `Closed` when the client closes or `idle_deadline` passes.
async fn wait_for_next_request(
    down: &mut Downstream,
    core: &DataCore,
    idle_deadline: Instant,
) -> Result<ReadEnd, ProxyError> {
    let buffered_until = idle_deadline.min(Instant::now() + KEEPALIVE_BUFFERED_WAIT);
    let spare = read_spare(&down.read_buf, READ_BUF_BYTES_INITIAL);
    let (result, buf) = down
        .socket
        .read_more(std::mem::take(&mut down.read_buf), spare, buffered_until)
        .await;
    down.read_buf = buf;
    match result {
        Ok(n) if n > 0 => return Ok(ReadEnd::Data),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut && buffered_until < idle_deadline => {}
        _ => return Ok(ReadEnd::Closed),
    }
    {
        let mut spare_buffers = core.spare_buffers.borrow_mut();
        spare_buffers.lend(&mut down.read_buf);
        spare_buffers.lend(&mut down.write_buf);
    }
    let ready = down
        .socket
        .readable_unless(std::pin::pin!(socket::at_deadline(idle_deadline)))
        .await;
    core.spare_buffers
        .borrow_mut()
        .borrow_into(&mut down.read_buf);
    match ready {
        Some(Ok(())) => read_client(down, idle_deadline, ReadPhase::BetweenRequests, spare).await,
        _ => Ok(ReadEnd::Closed),
    }
}

/// Why a routed request is refused before it is prepared: without the client key
/// (`--api-key`, 401), or looped back here (its `Via` names this process, 508). One compare of
/// the key, no allocation.
fn refused_routed(config: &Config, head: &RequestHead, buf: &[u8]) -> Option<ErrorKind> {
    if let Some(key) = &config.api_key {
        if !bearer_matches(key, head.headers.get(buf, "authorization")) {
            return Some(ErrorKind::Unauthorized);
        }
    }
    head.via_names(buf, config.via_pseudonym.as_bytes())
        .then_some(ErrorKind::LoopDetected)
}

/// Why a request is refused whatever its body says, read from its head alone: a routed request
/// `refused_routed` refuses, an admin call while the admin API is closed or without its key, a
/// path with no endpoint (404) or an endpoint that takes no such method (405). `None`: read the
/// body.
fn refused_before_body(head: &RequestHead, buf: &[u8], config: &Config) -> Option<ErrorKind> {
    match Endpoint::of_path(head.path(buf)).handling(head.method) {
        Handling::Proxy => return refused_routed(config, head, buf),
        Handling::Local => return None,
        Handling::WrongMethod => return Some(ErrorKind::MethodNotAllowed),
        Handling::NotFound => {}
    }
    let path = std::str::from_utf8(head.path(buf)).unwrap_or("");
    // Any admin path, even one with the wrong method: authentication answers first.
    if route_admin(head.method_text(buf), path).is_none() {
        return Some(ErrorKind::NotFound);
    }
    let authorization = head.headers.get(buf, "authorization");
    check_access(&config.worker_settings.admin_access, authorization).err()
}

/// Answers `Expect: 100-continue` when the body has not fully arrived yet.
async fn send_continue_if_expected(
    down: &mut Downstream,
    head: &RequestHead,
    body_end: usize,
) -> Result<(), ProxyError> {
    if !head.expect_continue || down.read_buf.len() >= body_end {
        return Ok(());
    }
    down.write_buf.clear();
    down.write_buf
        .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
    if write_to_client(&mut down.socket, &mut down.write_buf, 0).await {
        Ok(())
    } else {
        Err(ProxyError::downstream(
            ErrorKind::ClientClosed,
            "write 100 continue",
        ))
    }
}

/// Reads a chunked body, de-chunking it in place: the body's data ends up right after the head
/// in `read_buf` and the framing is dropped as it is read, so the buffer holds the body once.
async fn read_chunked_body(
    down: &mut Downstream,
    head: RequestHead,
    core: &DataCore,
    body_deadline: Option<Instant>,
) -> Result<Request, ProxyError> {
    let config = &core.shared.config;
    let mut decoder = ChunkedDecoder::new();
    let body_start = head.head_len;
    // Body data lies in `body_start..kept`; bytes after `kept` are not decoded yet.
    let mut kept = body_start;
    send_continue_if_expected(down, &head, usize::MAX).await?;
    loop {
        let (consumed, decoded) = decoder
            .decode_in_place(&mut down.read_buf, kept, kept)
            .map_err(|e| {
                let kind = match e {
                    ChunkError::Malformed => ErrorKind::MalformedRequest,
                    ChunkError::TooLong => ErrorKind::HeadersTooLarge,
                    // Past any `--max-payload-size`: the early 413 of a large announced chunk.
                    ChunkError::SizeTooLarge => ErrorKind::PayloadTooLarge,
                };
                ProxyError::downstream(kind, "decode chunked request body")
            })?;
        // The framing read is dropped; what follows the body (a pipelined request) moves down.
        down.read_buf.drain(decoded..consumed);
        kept = decoded;
        let body_len = kept - body_start;
        // The size line announces the chunk: refuse it then, not after reading it.
        let announced = (body_len as u64).saturating_add(decoder.announced_len_pending());
        if announced > config.max_payload_bytes as u64 {
            return Err(ProxyError::downstream(
                ErrorKind::PayloadTooLarge,
                "read chunked body",
            ));
        }
        charge_body(core, down, body_len)?;
        if decoder.is_done() {
            return Ok(Request {
                head,
                body: body_start..kept,
                end: kept,
            });
        }
        let deadline = body_read_deadline(config, body_deadline);
        let spare = read_spare(&down.read_buf, READ_BUF_BYTES_INITIAL);
        let buf = &mut down.read_buf;
        if buf.capacity() - buf.len() < spare {
            // Doubling, as `Vec::reserve` would, through the one place that returns what a
            // large buffer leaves behind.
            grow_read_buf(buf, (buf.capacity() * 2).max(buf.len() + spare));
        }
        read_client(down, deadline, ReadPhase::WithinRequest, spare).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn of two arguments returns, without calling it.
    fn future_size<A, B, F: std::future::Future>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_body_buffer_grows_with_the_bytes_that_arrive_never_past_the_body() {
        let end = 1 << 20;
        let mut buf = Vec::with_capacity(READ_BUF_BYTES_INITIAL);
        buf.resize(READ_BUF_BYTES_INITIAL, b'a');
        // A 1 MiB body announced, its first bytes here: room for the next read, not the body.
        make_room_for_body(&mut buf, end);
        assert!(
            buf.capacity() <= 2 * READ_BUF_BYTES_INITIAL + 64,
            "{}",
            buf.capacity()
        );
        let mut capacities = vec![buf.capacity()];
        while buf.len() < end {
            make_room_for_body(&mut buf, end);
            assert!(buf.capacity() > buf.len(), "room to read into");
            let room = buf.capacity() - buf.len();
            buf.resize(buf.len() + room, b'a');
            capacities.push(buf.capacity());
        }
        // Doubling: a handful of steps, and the last one ends at the body's end.
        assert!(capacities.len() <= 12, "{capacities:?}");
        assert_eq!(buf.capacity(), end, "{capacities:?}");
        // A buffer with room for the next read is left alone.
        let mut roomy: Vec<u8> = Vec::with_capacity(4 * READ_BUF_BYTES_INITIAL);
        let block = roomy.as_ptr();
        make_room_for_body(&mut roomy, end);
        assert_eq!(roomy.as_ptr(), block);
    }

    #[test]
    fn a_connection_task_stays_within_its_allocation_class() {
        // Every connection, a held stream included, costs this future plus monoio's task header
        // (384 bytes) in one allocation, and mimalloc's size classes above 4 KiB are 1 KiB
        // apart: up to 4,736 bytes the task takes a 5 KiB block. It was 5,888 bytes, in a 7 KiB
        // block (10.0 KiB of RSS per stream with 9,000 streams, `scripts/bench-streams.sh`).
        let size = future_size(serve_connection);
        let bound = 4_736;
        assert!(size <= bound, "{size} bytes (bound {bound})");
    }
}
