//! The request driver for routed endpoints. `proxy_request` owns the branching and the one
//! retry loop; each phase is a plain function it calls, in this order:
//!
//! 1. **prepare** (`Router::prepare_or_defer`, once): the routing input read from the body (a
//!    routed body must be a JSON object, 400 otherwise), tokenized when the model has a
//!    tokenizer (cold work past the inline bound awaited from the tokenizer pool, then
//!    `Router::finish_prepare`), and for cache_aware the index lookup, kept in the connection's
//!    [`Prepared`] value; then the requested model's workers (404 when none).
//! 2. **select** (`Router::select`, once per attempt): the spec's decision flow over the
//!    published worker view, never a worker this request already tried.
//! 3. **credit**: an `InflightCredit` guard counts the request on that worker until the attempt
//!    ends, however it ends, and its prompt tokens as queued work until the first body byte.
//! 4. **connect or reuse** (`connect_or_reuse`): a pooled keep-alive connection or a new one.
//! 5. **forward** (`forward`): the head (hop-by-hop headers dropped) and the complete body.
//! 6. **record** (`record_dispatch`, as soon as the worker has the request): spec step 7, a
//!    dispatch record with the index key for the control core.
//! 7. **stream back** (`stream_back`): the response head, then the body as it arrives, written
//!    through without buffering; chunked framing is tracked so the connection can be pooled.
//!    Every upstream read also watches the client (`read_upstream`): a client gone before the
//!    head ends the attempt as `ClientClosed` (499), one gone mid-body ends the stream; both
//!    close the upstream connection so the engine stops generating.
//!
//! A worker gets `--upstream-first-byte-timeout-secs` from the request forwarded to its first
//! body byte and `--upstream-idle-timeout-secs` between body reads after it (both within
//! `--request-timeout-secs`): a timeout is a 504, or mid-stream an SSE error event, and a
//! failure for the worker's circuit breaker on a pooled connection as on a new one.
//!
//! Errors before any response byte reached the client come back as `ProxyError`s; those marked
//! retryable (refused, reset, stale pooled socket, a retryable status) are tried again on
//! another worker, up to the first attempt plus `--retry-max-retries`, with the retry settings'
//! backoff in between. A stale pooled socket is retried on a fresh connection apart from those;
//! a request gives up after finding `STALE_CONNECTION_RETRIES_MAX` of them. After the first byte, a failure can only close
//! both connections: the answer then closes the connection.

use std::time::Instant;

use super::buffers::SpareBuffers;
use super::core::DataCore;
use super::downstream::{write_to_client, Answered, Downstream, PreparedSlot, Request};
use super::pool::UpstreamConn;
use crate::copy;
use crate::error::{ErrorKind, ProxyError, Retry, Side};
use crate::ids::WorkerId;
use crate::limits::{
    CLIENT_GONE_POLL_INTERVAL, FORWARD_BODY_COPY_BYTES_MAX, STALE_CONNECTION_RETRIES_MAX,
    STREAM_READ_BYTES, UPSTREAM_READ_BYTES,
};
use crate::metrics::{Counter, Latency};
use crate::net::body::BodyFramer;
use crate::net::codec::{
    self, Connection, DownstreamFraming, Framing, GatewayHeaders, RequestHead, ResponseHead,
};
use crate::net::socket::{Cut, Socket, Watched};
use crate::policy::{Prepared, WorkerView};
use crate::request::{
    Endpoint, Method, RoutingHeaders, RoutingMode, ROUTING_KEY_HEADER, ROUTING_TOKENS_HEADER,
    TARGET_WORKER_HEADER,
};
use crate::workers::breaker::AttemptOutcome;
use crate::workers::retry::{is_retryable_status, RetryConfig, TriedWorkers};
use crate::workers::table::{InflightCredit, WorkerEntry};

/// The request as the prepare phase reads it: its head and complete body, in the client's
/// read buffer.
#[derive(Clone, Copy)]
struct Outgoing<'a> {
    head: &'a RequestHead,
    /// The buffer the head's spans index.
    head_buf: &'a [u8],
    body: &'a [u8],
}

/// The request as the forward phase writes it: the client's read buffer itself, so a large
/// body is written from where it was read (the buffer is lent to the write and comes back).
struct Forwarded<'a> {
    head: &'a RequestHead,
    /// The client's read buffer: the head's spans and `body` index it.
    read_buf: &'a mut Vec<u8>,
    body: std::ops::Range<usize>,
    /// How many bytes at the front of `read_buf` are this request's.
    request_end: &'a mut usize,
}

impl Forwarded<'_> {
    /// Lets go of the request once its response is committed to the client (no attempt will
    /// send it again): its bytes leave the client's read buffer now instead of when a stream
    /// that may last minutes ends, and the emptied buffer is lent to the core. The head's
    /// spans and `body` are stale afterwards.
    fn release(&mut self, spare: &mut SpareBuffers) {
        self.read_buf.drain(..std::mem::take(self.request_end));
        spare.lend(self.read_buf);
    }
}

/// The client half of a connection, split from its read buffer (which holds the request).
struct ClientSide<'a> {
    socket: &'a mut Socket,
    write_buf: &'a mut Vec<u8>,
    version_minor: u8,
    connection: Connection,
    /// The path's metrics slot and when the request was read: the time to first byte is
    /// observed when the response head is written.
    endpoint: Endpoint,
    started: Instant,
}

/// What an attempt does with a retryable status (408, 429, 5xx) from the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RetryableStatus {
    /// Another attempt is allowed: do not forward it, try again.
    Retry,
    /// This is the last attempt: forward it to the client.
    Forward,
}

/// A failed attempt, before any response byte reached the client.
struct AttemptFailure {
    error: ProxyError,
    /// The attempt used a pooled connection: the worker may be fine and the socket stale.
    on_reused_connection: bool,
    /// The worker answered with this retryable status (408, 429, 5xx), which was not forwarded.
    status: Option<u16>,
}

impl AttemptFailure {
    /// What the failure means for the worker's circuit (`None`: not the worker's fault).
    fn breaker_outcome(&self) -> Option<AttemptOutcome> {
        // A stale pooled socket fails at once; a silent worker times out on any connection.
        if self.is_stale_connection() {
            return None;
        }
        if self.status.is_some() {
            return Some(AttemptOutcome::Failure);
        }
        match self.error.kind {
            ErrorKind::UpstreamConnect
            | ErrorKind::UpstreamClosed
            | ErrorKind::UpstreamMalformed
            | ErrorKind::UpstreamTimeout => Some(AttemptOutcome::Failure),
            _ => None,
        }
    }

    /// A pooled socket the worker had closed: not the worker failing a request.
    fn is_stale_connection(&self) -> bool {
        self.on_reused_connection && self.error.may_retry()
    }
}

/// A forwarded response and what it means for the worker's circuit.
struct AttemptDone {
    answered: Answered,
    outcome: Option<AttemptOutcome>,
}

/// Proxies one routed request (the driver).
pub async fn proxy_request(
    core: &DataCore,
    down: &mut Downstream,
    request: &Request,
    endpoint: Endpoint,
    started: Instant,
) -> Result<Answered, ProxyError> {
    let Downstream {
        socket,
        read_buf,
        write_buf,
        prepared,
        request_end,
        ..
    } = down;
    let outgoing = Outgoing {
        head: &request.head,
        head_buf: read_buf,
        body: request.body(read_buf),
    };
    prepare(core, prepared.get(), endpoint, outgoing).await?;
    let catalog = core.shared.catalog.load();
    let models = catalog
        .workers_for(prepared.get().model())
        .ok_or_else(|| ProxyError::downstream(ErrorKind::ModelNotFound, "model"))?;
    let mut forwarded = Forwarded {
        head: &request.head,
        read_buf,
        body: request.body.clone(),
        request_end,
    };
    let mut client = ClientSide {
        socket,
        write_buf,
        version_minor: request.head.version_minor,
        connection: request.head.connection,
        endpoint,
        started,
    };
    let deadline = Instant::now() + core.shared.config.request_timeout;
    let retry = &core.shared.config.worker_settings.retry;
    let attempts_max = retry.attempts_allowed();
    let (mut attempts, mut stale_retries) = (0usize, 0usize);
    let mut tried = TriedWorkers::default();
    let mut last_error = None;
    while attempts < attempts_max && stale_retries < STALE_CONNECTION_RETRIES_MAX {
        let roster = core.shared.table.roster();
        let view = WorkerView {
            roster: &roster,
            table: &core.shared.table,
            models,
        };
        let picked = select_worker(core, prepared.get(), view, &mut tried);
        let Some(worker) = picked.and_then(|id| roster.get(id)) else {
            break;
        };
        let mut credit =
            core.shared
                .table
                .credit(core.core_id, worker.id, prepared.get().request_tokens());
        let on_status = if attempts + 1 < attempts_max {
            RetryableStatus::Retry
        } else {
            RetryableStatus::Forward
        };
        let attempted = attempt(
            core,
            &mut client,
            (&mut forwarded, &mut *prepared),
            (worker, &mut credit),
            deadline,
            on_status,
        );
        let failure = match attempted.await {
            Ok(done) => {
                report_outcome(core, worker.id, done.outcome);
                return Ok(done.answered);
            }
            Err(failure) => failure,
        };
        // A stale pooled socket is counted apart and retried on a fresh connection: after an
        // engine restart every pooled connection to it fails once this way.
        if failure.is_stale_connection() {
            core.metrics().incr(Counter::UpstreamStaleConnections);
        } else {
            note_failure(core, worker.id, &failure);
        }
        if !failure.error.may_retry() {
            return Err(failure.error);
        }
        if failure.on_reused_connection {
            // Its siblings in the pool are most likely stale too (engine restart).
            core.pool.borrow_mut().clear_worker(worker.id);
            stale_retries += 1;
        } else {
            attempts += 1;
            tried.insert(worker.id);
            backoff(retry, attempts - 1, deadline).await;
        }
        core.metrics().incr(Counter::UpstreamRetries);
        last_error = Some(failure.error);
    }
    Err(last_error
        .unwrap_or_else(|| ProxyError::new(ErrorKind::NoHealthyWorker, Side::Internal, "route")))
}

/// The prepare phase: one pass over the body reads the routing input (model, key, partition)
/// without building a document, and the router looks it up; a body that is not a JSON object
/// is a 400. A prompt whose uncached part is too long to tokenize on the data core goes to the
/// tokenizer pool: the request's task waits for it there, the core serves its other
/// connections meanwhile, and the router completes the preparation with the IDs (or, when the
/// pool's queue was full, with the text).
async fn prepare(
    core: &DataCore,
    prepared: &mut Prepared,
    endpoint: Endpoint,
    outgoing: Outgoing<'_>,
) -> Result<(), ProxyError> {
    let header = |name| outgoing.head.headers.get(outgoing.head_buf, name);
    let headers = RoutingHeaders {
        mode: RoutingMode::Regular,
        routing_tokens: header(ROUTING_TOKENS_HEADER),
        routing_key: header(ROUTING_KEY_HEADER),
        target_worker: header(TARGET_WORKER_HEADER),
    };
    let now_ms = core.shared.tick_now();
    let cold = core
        .router
        .borrow_mut()
        .prepare_or_defer(prepared, endpoint, headers, outgoing.body, now_ms)
        .map_err(|_| ProxyError::downstream(ErrorKind::InvalidJson, "validate body"))?;
    if let Some(work) = cold {
        let done = monoio::spawn_blocking(move || work.run()).await.ok();
        core.router.borrow_mut().finish_prepare(prepared, done);
    }
    Ok(())
}

/// The select phase of one attempt: a worker this request has not tried, else (every eligible
/// worker was tried) any eligible one: a retry in place beats giving up early.
fn select_worker(
    core: &DataCore,
    prepared: &Prepared,
    view: WorkerView<'_>,
    tried: &mut TriedWorkers,
) -> Option<WorkerId> {
    let mut router = core.router.borrow_mut();
    let picked = router.select(prepared, view, tried);
    if picked.is_some() || tried.is_empty() {
        return picked;
    }
    tried.clear();
    router.select(prepared, view, tried)
}

/// Reports a failed attempt to the worker's circuit breaker and the error counters.
fn note_failure(core: &DataCore, worker: WorkerId, failure: &AttemptFailure) {
    report_outcome(core, worker, failure.breaker_outcome());
    if failure.status.is_none() {
        count_error(core, failure.error.kind);
    }
}

/// Waits the retry settings' backoff before retry `retry_index`, never past the deadline.
async fn backoff(retry: &RetryConfig, retry_index: usize, deadline: Instant) {
    let index = u32::try_from(retry_index).unwrap_or(u32::MAX);
    let wait = retry.backoff(index, fastrand::f64());
    let wait = wait.min(deadline.saturating_duration_since(Instant::now()));
    if !wait.is_zero() {
        monoio::time::sleep(wait).await;
    }
}

/// Tells the control core what an attempt means for the worker's circuit breaker.
fn report_outcome(core: &DataCore, worker: WorkerId, outcome: Option<AttemptOutcome>) {
    if let Some(outcome) = outcome {
        core.report_attempt(worker, outcome);
    }
}

/// One upstream attempt: connect or reuse, forward, record, stream back, pool the connection.
async fn attempt(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    (request, prepared): (&mut Forwarded<'_>, &mut PreparedSlot),
    (worker, credit): (&WorkerEntry, &mut InflightCredit<'_>),
    deadline: Instant,
    on_status: RetryableStatus,
) -> Result<AttemptDone, AttemptFailure> {
    let fail = |error, on_reused_connection| AttemptFailure {
        error,
        on_reused_connection,
        status: None,
    };
    let mut up = connect_or_reuse(core, worker)
        .await
        .map_err(|e| fail(e, false))?;
    let reused = up.reused;
    let via = core.shared.config.via_pseudonym.as_str();
    core.spare_buffers
        .borrow_mut()
        .borrow_into(&mut up.write_buf);
    forward(&mut up, request, (&worker.spec.authority, via), deadline)
        .await
        .map_err(|e| fail(e, reused))?;
    // Sent: the request's buffer is not needed while the response streams.
    up.write_buf.clear();
    core.spare_buffers.borrow_mut().lend(&mut up.write_buf);
    // The worker has the request: the index learns it now, not when the response ends.
    record_dispatch(core, prepared.get(), worker.id);
    let gateway_headers = GatewayHeaders {
        routed_worker_line: &worker.routed_header_line,
        predicted_cached_tokens: prepared.get().predicted_cached_tokens(worker.id),
    };
    let streamed = stream_back(
        core,
        &mut up,
        client,
        (worker, credit, gateway_headers),
        (request, prepared),
        deadline,
        on_status,
    )
    .await
    .map_err(|e| fail(e, reused))?;
    let streamed = match streamed {
        StreamEnd::RetryableStatus(status) => {
            let error =
                ProxyError::upstream(ErrorKind::UpstreamClosed, "retryable status").retryable();
            return Err(AttemptFailure {
                error,
                on_reused_connection: false,
                status: Some(status),
            });
        }
        StreamEnd::Done(streamed) => streamed,
    };
    if streamed.upstream_reusable {
        // Reusable means every byte read was forwarded: an idle connection holds no buffer.
        up.read_buf.clear();
        core.spare_buffers.borrow_mut().lend(&mut up.read_buf);
        core.pool.borrow_mut().put(worker.id, up, Instant::now());
    }
    // The head's outcome was recorded when it arrived; a body cut short adds a failure.
    let outcome = streamed.upstream_failed.then_some(AttemptOutcome::Failure);
    Ok(AttemptDone {
        answered: streamed.answered,
        outcome,
    })
}

/// The connect-or-reuse phase.
async fn connect_or_reuse(
    core: &DataCore,
    worker: &WorkerEntry,
) -> Result<UpstreamConn, ProxyError> {
    let pooled = core
        .pool
        .borrow_mut()
        .take(worker.id, worker.spec.addr, Instant::now());
    if let Some(conn) = pooled {
        core.metrics().incr(Counter::UpstreamConnectionsReused);
        return Ok(conn);
    }
    let socket = Socket::connect(worker.spec.addr).await.map_err(|e| {
        ProxyError::upstream(ErrorKind::UpstreamConnect, "connect")
            .because(e)
            .retryable()
    })?;
    core.metrics().incr(Counter::UpstreamConnectionsOpened);
    Ok(UpstreamConn::new(socket, worker.spec.addr))
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

/// The forward phase: the rebuilt head, then the complete body. A small body is copied behind
/// the head (one write); a larger one is written from the client's read buffer, where it lies,
/// so the gateway never holds a body twice.
async fn forward(
    up: &mut UpstreamConn,
    request: &mut Forwarded<'_>,
    (authority, via): (&str, &str),
    deadline: Instant,
) -> Result<(), ProxyError> {
    let body = request.body.clone();
    up.write_buf.clear();
    codec::write_upstream_request_head_via(
        &mut up.write_buf,
        request.head,
        request.read_buf,
        authority,
        via,
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

/// Why a request stopped waiting on its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupted {
    /// The client closed or reset its connection.
    ClientGone,
    /// Shutdown's grace period is over.
    ShutdownCut,
}

/// Completes at `deadline` (`Cut::Deadline`), or once the client has gone (closed or reset its
/// connection) or shutdown cuts the requests still running (`Cut::Stop`), checked every
/// `CLIENT_GONE_POLL_INTERVAL` without reading: bytes of a pipelined request stay unread. One
/// timer serves both.
async fn interruption(core: &DataCore, client: &Socket, deadline: Instant) -> Cut {
    loop {
        let wake = deadline.min(Instant::now() + CLIENT_GONE_POLL_INTERVAL);
        monoio::time::sleep_until(monoio::time::Instant::from_std(wake)).await;
        if client.peer_closed() || core.cutting_requests.get() {
            return Cut::Stop;
        }
        if Instant::now() >= deadline {
            return Cut::Deadline;
        }
    }
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

/// One read of the worker's response, given up (the read cancelled) when the client goes or
/// shutdown cuts the request. Waiting `Unbuffered` with nothing partial in the read buffer,
/// the empty buffer is lent to the core and one is borrowed back when bytes are ready.
async fn read_upstream(
    core: &DataCore,
    up: &mut UpstreamConn,
    (client, waiting): (&Socket, Waiting),
    deadline: Instant,
) -> Result<std::io::Result<usize>, Interrupted> {
    let interrupted = || {
        if client.peer_closed() {
            Interrupted::ClientGone
        } else {
            Interrupted::ShutdownCut
        }
    };
    if waiting == Waiting::Unbuffered && up.read_buf.is_empty() {
        core.spare_buffers.borrow_mut().lend(&mut up.read_buf);
        loop {
            let ready = up
                .socket
                .readable_unless(std::pin::pin!(interruption(core, client, deadline)))
                .await;
            match ready {
                None => return Err(interrupted()),
                Some(Err(e)) => return Ok(Err(e)),
                Some(Ok(())) => {}
            }
            // Read now, and the caller relays now (`write_client_from` with `Relay::Now`):
            // when a decode step ends every stream of the core wakes at once, and a stream
            // that held its buffer across a ring read and write would make that burst cost a
            // buffer per stream. Within one poll of the task, one buffer serves them all.
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
        Watched::Stopped => Err(interrupted()),
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
        let result = match read_upstream(core, up, (client, Waiting::Buffered), deadline).await {
            Ok(result) => result,
            Err(Interrupted::ClientGone) => {
                return Err(ProxyError::downstream(
                    ErrorKind::ClientClosed,
                    "client gone while waiting for the response",
                ))
            }
            Err(Interrupted::ShutdownCut) => {
                return Err(ProxyError::new(
                    ErrorKind::ShuttingDown,
                    Side::Internal,
                    "shutdown grace period over while waiting for the response",
                ))
            }
        };
        match result {
            Ok(n) if n > 0 => {}
            Ok(_) => {
                let error = ProxyError::upstream(ErrorKind::UpstreamClosed, "read response head");
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

/// What a response body carries, as far as ending it early goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyKind {
    /// Server-sent events: a cut stream can end with an SSE error event.
    EventStream,
    /// Anything else: a cut body can only close the connection.
    Other,
}

/// How a response body is tracked on its way through: where it ends ([`BodyFramer`]), and
/// whether it is de-chunked for an HTTP/1.0 client of a chunked worker.
struct BodyTracker {
    body: BodyFramer,
    dechunk: bool,
}

impl BodyTracker {
    fn new(up: Framing, down: DownstreamFraming) -> Self {
        let dechunk = up == Framing::Chunked && down == DownstreamFraming::UntilClose;
        BodyTracker {
            body: BodyFramer::new(up),
            dechunk,
        }
    }

    fn is_done(&self) -> bool {
        self.body.is_done()
    }

    /// Consumes the body's share of `input`; appends de-chunked data to `decoded` when
    /// de-chunking. Returns the bytes consumed.
    fn advance(&mut self, input: &[u8], decoded: &mut Vec<u8>) -> Result<usize, ProxyError> {
        let dechunk = self.dechunk;
        self.body.advance(input, |data| {
            if dechunk {
                copy::extend_from_slice(decoded, data)
            }
        })
    }
}

/// What streaming a response produced.
struct Streamed {
    answered: Answered,
    upstream_reusable: bool,
    /// The worker failed mid-body (closed, reset, timed out or sent garbage).
    upstream_failed: bool,
}

/// How the stream-back phase ended.
enum StreamEnd {
    /// The response (or part of it) went to the client.
    Done(Streamed),
    /// The worker answered a retryable status; nothing was written to the client.
    RetryableStatus(u16),
}

/// The stream-back phase: head first, then every read written through as it arrives.
async fn stream_back(
    core: &DataCore,
    up: &mut UpstreamConn,
    client: &mut ClientSide<'_>,
    (worker, credit, gateway_headers): (&WorkerEntry, &mut InflightCredit<'_>, GatewayHeaders<'_>),
    (request, prepared): (&mut Forwarded<'_>, &mut PreparedSlot),
    deadline: Instant,
    on_status: RetryableStatus,
) -> Result<StreamEnd, ProxyError> {
    let config = &core.shared.config;
    let method = request.head.method;
    // Until the first body byte the worker queues and prefills; after it, it decodes.
    let first_byte_deadline = deadline.min(Instant::now() + config.upstream_first_byte_timeout);
    // The head (512 bytes of header spans) lives in this block only: a stream does not carry it
    // through its waits.
    let (status, upstream_keeps_connection, body_kind, framing, connection);
    let (mut tracker, mut body_begun, mut leftover);
    {
        let head = read_response_head(core, up, client.socket, method, first_byte_deadline).await?;
        if on_status == RetryableStatus::Retry && is_retryable_status(head.status) {
            return Ok(StreamEnd::RetryableStatus(head.status));
        }
        // The breaker hears the answer now, not when a long stream ends: otherwise successes would
        // lag failures by a generation's length and a burst of quick errors would look consecutive.
        let head_outcome = if head.status >= 500 || is_retryable_status(head.status) {
            AttemptOutcome::Failure
        } else {
            AttemptOutcome::Success
        };
        core.report_attempt(worker.id, head_outcome);
        let event_stream = head
            .headers
            .get(&up.read_buf, "content-type")
            .is_some_and(|v| v.starts_with(b"text/event-stream"));
        body_kind = if event_stream {
            BodyKind::EventStream
        } else {
            BodyKind::Other
        };
        framing = DownstreamFraming::choose(head.framing, client.version_minor);
        connection = client.connection.and(Connection::keep_if(
            framing != DownstreamFraming::UntilClose && !core.shared.is_shutting_down(),
        ));
        tracker = BodyTracker::new(head.framing, framing);
        client.write_buf.clear();
        codec::write_downstream_response_head(
            client.write_buf,
            &head,
            &up.read_buf,
            gateway_headers,
            framing,
            connection,
        );
        let available = &up.read_buf[head.head_len..];
        // The first body byte is the first token (or, unstreamed, the whole answer): the prompt is
        // no longer queued work on the worker.
        body_begun = !available.is_empty();
        if body_begun {
            credit.prefill_done();
        }
        let consumed = tracker.advance(available, client.write_buf)?;
        if !tracker.dechunk {
            copy::extend_from_slice(client.write_buf, &available[..consumed]);
        }
        leftover = consumed < available.len();
        (status, upstream_keeps_connection) = (head.status, head.connection.is_kept());
    }
    let ended = |complete: bool, reusable: bool| {
        StreamEnd::Done(Streamed {
            answered: Answered {
                status,
                connection: connection.and(Connection::keep_if(complete)),
            },
            upstream_reusable: reusable,
            upstream_failed: false,
        })
    };
    let head_written = write_client(client).await;
    core.metrics().observe_latency(
        Latency::FirstByte,
        (method, client.endpoint),
        client.started.elapsed(),
    );
    if !head_written {
        core.metrics().incr(Counter::DownstreamAborts);
        return Ok(ended(false, false));
    }
    if body_kind == BodyKind::EventStream {
        // Committed, and a stream may last minutes: it keeps nothing of its request (bytes,
        // routing scratch) while the tokens trickle in.
        request.release(&mut core.spare_buffers.borrow_mut());
        prepared.release();
    }
    while !tracker.is_done() {
        // Between two reads a stream holds no buffer (see `read_upstream`).
        up.read_buf.clear();
        client.write_buf.clear();
        core.spare_buffers.borrow_mut().lend(client.write_buf);
        let read_deadline = if body_begun {
            deadline.min(Instant::now() + config.upstream_idle_timeout)
        } else {
            first_byte_deadline
        };
        let n = match next_body_read(
            core,
            up,
            client,
            &tracker,
            (body_kind, framing),
            read_deadline,
        )
        .await
        {
            Ok(BodyRead::Bytes(n)) => n,
            Ok(BodyRead::End) => break,
            Err(BodyStop::ClientGone) => {
                core.metrics().incr(Counter::DownstreamAborts);
                return Ok(ended(false, false));
            }
            Err(BodyStop::ShutdownCut) => return Ok(ended(false, false)),
            Err(BodyStop::WorkerFailed) => return Ok(StreamEnd::upstream_failed(status)),
        };
        body_begun = true;
        credit.prefill_done();
        if tracker.dechunk {
            core.spare_buffers
                .borrow_mut()
                .borrow_into(client.write_buf);
        }
        let consumed = match tracker.advance(&up.read_buf, client.write_buf) {
            Ok(consumed) => consumed,
            Err(e) => {
                count_error(core, e.kind);
                core.metrics().incr(Counter::UpstreamResponsesCut);
                return Ok(StreamEnd::upstream_failed(status));
            }
        };
        leftover |= consumed < n;
        let raw = (!tracker.dechunk).then_some(consumed);
        let relay = match body_kind {
            BodyKind::EventStream => Relay::Now,
            BodyKind::Other => Relay::Queued,
        };
        if !write_client_from(client, up, raw, relay).await {
            core.metrics().incr(Counter::DownstreamAborts);
            return Ok(ended(false, false));
        }
    }
    Ok(ended(
        true,
        upstream_keeps_connection && !leftover && tracker.is_done(),
    ))
}

/// What one read of a response body brought.
enum BodyRead {
    /// This many bytes, in `up.read_buf`.
    Bytes(usize),
    /// The end of a close-delimited body.
    End,
}

/// Why a response body stopped before its end.
enum BodyStop {
    /// The client went while the worker was silent (a prefill, a slow decode).
    ClientGone,
    /// Shutdown's grace period ran out (the client was told, when the framing allows).
    ShutdownCut,
    /// The worker closed, reset, timed out or sent garbage (counted; the client was told,
    /// when the framing allows).
    WorkerFailed,
}

/// One read of a response body in the stream-back loop; a stop that the client can be told
/// of gets its SSE error event written here.
async fn next_body_read(
    core: &DataCore,
    up: &mut UpstreamConn,
    client: &mut ClientSide<'_>,
    tracker: &BodyTracker,
    kinds: (BodyKind, DownstreamFraming),
    read_deadline: Instant,
) -> Result<BodyRead, BodyStop> {
    // A stream whose reads never wait a whole poll interval is cut here.
    let read = if core.cutting_requests.get() {
        Err(Interrupted::ShutdownCut)
    } else {
        let waiting = if kinds.0 == BodyKind::EventStream {
            Waiting::Unbuffered
        } else {
            Waiting::Buffered
        };
        read_upstream(core, up, (client.socket, waiting), read_deadline).await
    };
    let (stop, cut, kind) = match read {
        Err(Interrupted::ClientGone) => return Err(BodyStop::ClientGone),
        Err(Interrupted::ShutdownCut) => (BodyStop::ShutdownCut, StreamCut::ShuttingDown, None),
        Ok(Ok(0)) if tracker.body.ends_at_close() => return Ok(BodyRead::End),
        Ok(Ok(n)) if n > 0 => return Ok(BodyRead::Bytes(n)),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => (
            BodyStop::WorkerFailed,
            StreamCut::WorkerSilent,
            Some(ErrorKind::UpstreamTimeout),
        ),
        Ok(_) => (
            BodyStop::WorkerFailed,
            StreamCut::WorkerClosed,
            Some(ErrorKind::UpstreamClosed),
        ),
    };
    if let Some(kind) = kind {
        count_error(core, kind);
        core.metrics().incr(Counter::UpstreamResponsesCut);
    }
    if end_stream_with_error_event(client, tracker, kinds, cut) {
        write_client(client).await;
    }
    Err(stop)
}

impl StreamEnd {
    /// The worker failed mid-body: the client connection closes, the breaker hears a failure.
    fn upstream_failed(status: u16) -> StreamEnd {
        StreamEnd::Done(Streamed {
            answered: Answered {
                status,
                connection: Connection::Close,
            },
            upstream_reusable: false,
            upstream_failed: true,
        })
    }
}

/// Why a stream the client was receiving ends early: each has its SSE error event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamCut {
    /// The worker closed or reset the connection, or sent garbage.
    WorkerClosed,
    /// The worker sent nothing within `--upstream-first-byte-timeout-secs` (body not begun) or
    /// `--upstream-idle-timeout-secs`.
    WorkerSilent,
    /// Shutdown's grace period ran out first.
    ShuttingDown,
}

impl StreamCut {
    /// The event's message, `type` and `code`.
    fn event(self) -> (&'static str, &'static str, u16) {
        match self {
            StreamCut::WorkerClosed => (
                "the worker closed the stream before it finished",
                "upstream_error",
                502,
            ),
            StreamCut::WorkerSilent => (
                "the worker sent nothing in time (--upstream-first-byte-timeout-secs, --upstream-idle-timeout-secs)",
                "gateway_timeout",
                504,
            ),
            StreamCut::ShuttingDown => (
                "the gateway is shutting down (--shutdown-grace-period-secs)",
                "service_unavailable",
                503,
            ),
        }
    }
}

/// Puts the SSE error event and the final chunk in `client.write_buf` when the client is being
/// streamed chunked SSE and the body stopped between two chunks (elsewhere a new chunk would
/// break the framing, so the connection just closes). Returns whether it did.
fn end_stream_with_error_event(
    client: &mut ClientSide<'_>,
    tracker: &BodyTracker,
    (body_kind, framing): (BodyKind, DownstreamFraming),
    cut: StreamCut,
) -> bool {
    let at_boundary = tracker.body.at_chunk_boundary();
    let can_tell = body_kind == BodyKind::EventStream
        && framing == DownstreamFraming::ChunkedPassthrough
        && at_boundary;
    if can_tell {
        client.write_buf.clear();
        write_error_event_chunk(client.write_buf, cut);
    }
    can_tell
}

/// The last chunk written to a streaming client whose stream is cut: one SSE error event, then
/// the terminating chunk, so the client sees a clear error instead of a cut stream. (Failure
/// path only: the formatting allocates.)
fn write_error_event_chunk(out: &mut Vec<u8>, cut: StreamCut) {
    let (message, error_type, code) = cut.event();
    let event = format!(
        "data: {{\"error\":{{\"message\":\"{message}\",\"type\":\"{error_type}\",\"code\":{code}}}}}\n\n"
    );
    out.extend_from_slice(format!("{:x}\r\n{event}\r\n0\r\n\r\n", event.len()).as_bytes());
}

/// Writes `client.write_buf` to the client.
async fn write_client(client: &mut ClientSide<'_>) -> bool {
    write_to_client(client.socket, client.write_buf, 0).await
}

/// When body bytes leave for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relay {
    /// Through a ring write, awaited.
    Queued,
    /// What the client's socket takes at once, before the task yields (the rest through a ring
    /// write): an event stream's bytes, read with `Socket::read_now`, so its buffer is free
    /// again before the next stream of the same decode step reads.
    Now,
}

/// Writes body bytes: `raw = Some(n)` writes the first `n` bytes of the worker's read buffer
/// without copying (what follows them is not the body's, and is dropped); `None` writes the
/// de-chunked bytes in `client.write_buf`.
async fn write_client_from(
    client: &mut ClientSide<'_>,
    up: &mut UpstreamConn,
    raw: Option<usize>,
    relay: Relay,
) -> bool {
    let buf = match raw {
        Some(n) => {
            up.read_buf.truncate(n);
            &mut up.read_buf
        }
        None => &mut *client.write_buf,
    };
    let sent = match relay {
        Relay::Queued => 0,
        Relay::Now => match client.socket.write_now(buf) {
            Ok(sent) => sent,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(_) => return false,
        },
    };
    sent == buf.len() || write_to_client(client.socket, buf, sent).await
}

/// The record phase (spec step 7): the index learns where this request went.
fn record_dispatch(core: &DataCore, prepared: &Prepared, worker: WorkerId) {
    let tick = core.shared.tick_now();
    let record = core.router.borrow_mut().record(prepared, worker, tick);
    if let Some(key) = record {
        core.send_dispatch_record(worker, tick, key);
    }
}

fn count_error(core: &DataCore, kind: ErrorKind) {
    let counter = match kind {
        ErrorKind::UpstreamConnect => Counter::UpstreamConnectErrors,
        ErrorKind::UpstreamClosed => Counter::UpstreamClosedErrors,
        ErrorKind::UpstreamMalformed => Counter::UpstreamMalformedErrors,
        ErrorKind::UpstreamTimeout => Counter::UpstreamTimeouts,
        ErrorKind::ClientClosed => Counter::DownstreamAborts,
        _ => return,
    };
    core.metrics().incr(counter);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_event_chunk_is_framed_to_its_length() {
        let mut out = Vec::new();
        write_error_event_chunk(&mut out, StreamCut::WorkerClosed);
        let expected: &[u8] = b"72\r\ndata: {\"error\":{\"message\":\"the worker closed the stream before it finished\",\"type\":\"upstream_error\",\"code\":502}}\n\n\r\n0\r\n\r\n";
        assert_eq!(out, expected);
        out.clear();
        write_error_event_chunk(&mut out, StreamCut::WorkerSilent);
        let text = String::from_utf8(out).unwrap();
        let (size, rest) = text.split_once("\r\n").unwrap();
        let event = rest.strip_suffix("\r\n0\r\n\r\n").unwrap();
        assert_eq!(usize::from_str_radix(size, 16).unwrap(), event.len());
        assert!(event.contains("\"code\":504"), "{event}");
    }
}
