//! The request driver for routed endpoints. `proxy_request` owns the branching and the one
//! retry loop; each phase is a plain function it calls, in this order:
//!
//! 1. **prepare** (`Router::prepare_or_defer`, once): the routing input read from the body (a
//!    routed body must be a JSON object, 400 otherwise), tokenized when the model has a
//!    tokenizer (a body past `TOKENIZE_RENDER_INLINE_BYTES` rendered and cut, and cold work
//!    past the inline bound encoded, each awaited from the tokenizer pool, then
//!    `Router::finish_prepare`), and for cache_aware the index lookup, kept in the connection's
//!    [`Prepared`] value; then the requested model's workers (404 when none).
//! 2. **select** (`Router::select`, once per attempt): the spec's decision flow over the
//!    published worker view, never a worker this request already tried.
//! 3. **credit**: an `InflightCredit` guard counts the request on that worker until the attempt
//!    ends, however it ends, and its prompt tokens as queued work until the first body byte.
//!    With the worker and the deadlines it makes the [`Attempt`] every later phase reads.
//! 4. **connect or reuse** (`Exchange::open`, the upstream seam: `http::upstream`): a pooled
//!    keep-alive connection or a new one.
//! 5. **forward** (`Exchange::forward`): the head (hop-by-hop headers dropped) and the complete
//!    body.
//! 6. **record** (`record_dispatch`, as soon as the worker has the request): spec step 7, a
//!    dispatch record with the index key for the control core.
//! 7. **stream back** (`relay::stream_back`): the response head, then the body as it arrives,
//!    written through without buffering; the connection goes back to the pool
//!    (`Exchange::give_back`) when the body was relayed whole.
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
//! a request gives up after finding `STALE_CONNECTION_RETRIES_MAX` of them. After the first
//! byte, a failure can only close both connections: the answer then closes the connection.

use std::time::Instant;

use super::core::DataCore;
use super::downstream::{write_to_client, Answered, ClientSide, Downstream, Forwarded, Request};
use super::relay::{stream_back, StreamEnd};
use super::upstream::{self, status_outcome, Attempt, Exchange, RetryableStatus};
use crate::error::{error_body, ErrorKind, ProxyError, Side};
use crate::ids::WorkerId;
use crate::index::kv::{FlightEnd, FlightId};
use crate::limits::{READ_BUF_BYTES_RETAINED_MAX, STALE_CONNECTION_RETRIES_MAX};
use crate::metrics::{Counter, Latency};
use crate::net::codec::{self, Connection};
use crate::net::memory;
use crate::policy::{Prepared, WorkerView};
use crate::request::id::RequestId;
use crate::request::{
    Endpoint, RequestError, RoutingHeaders, RoutingMode, ROUTING_KEY_HEADER, ROUTING_TOKENS_HEADER,
    TARGET_WORKER_HEADER,
};
use crate::tokenize::{Deferred, DeferredDone};
use crate::workers::breaker::AttemptOutcome;
use crate::workers::retry::{RetryConfig, TriedWorkers};

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
    let (mut forwarded, mut client) = split_downstream(down, request, endpoint, started);
    if let Err(refused) = prepare(core, &mut forwarded, endpoint).await {
        let answered = answer_unusable_body(&mut client, &refused).await;
        // Timed here, as `handle_request` leaves the first byte to the proxy.
        let key = (request.head.method, endpoint);
        core.metrics()
            .observe_latency(Latency::FirstByte, key, started.elapsed());
        return Ok(answered);
    }
    let catalog = core.shared.catalog.load();
    let models = catalog
        .workers_for(forwarded.prepared.get().model())
        .ok_or_else(|| ProxyError::downstream(ErrorKind::ModelNotFound, "model"))?;
    if let Some(pd) = &core.shared.config.pd {
        // Prefill/decode disaggregation: two workers per request, their own driver. Its future
        // (two upstream legs raced) is boxed: inline it would more than double every
        // connection's task, a held stream's included (`server`'s allocation-class test); a PD
        // request allocates its rewritten body anyway.
        let handshake = pd.handshake;
        let pair = upstream::proxy_pair(
            core,
            &mut client,
            &mut forwarded,
            models,
            &catalog,
            handshake,
        );
        return Box::pin(pair).await;
    }
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
        let request_id = forwarded.request_id;
        let picked = select_worker(core, forwarded.prepared.get(), request_id, view, &mut tried);
        let Some(worker) = picked.and_then(|id| roster.get(id)) else {
            break;
        };
        core.metrics().workers().selected(worker.id);
        let tokens = forwarded.prepared.get().request_tokens();
        let mut this = Attempt {
            worker,
            credit: core.shared.table.credit(core.core_id, worker.id, tokens),
            deadline,
            on_status: if attempts + 1 < attempts_max {
                RetryableStatus::Retry
            } else {
                RetryableStatus::Forward
            },
        };
        let failure = match attempt(core, &mut client, &mut forwarded, &mut this).await {
            Ok(done) => {
                report_outcome(core, worker.id, done.outcome);
                return Ok(done.answered);
            }
            Err(failure) => failure,
        };
        note_failure(core, worker.id, &failure);
        if !failure.error.may_retry() {
            return Err(failure.error);
        }
        if failure.on_reused_connection {
            // Its siblings in the pool are most likely stale too (engine restart).
            upstream::drop_idle_connections(core, worker.id);
            stale_retries += 1;
        } else {
            attempts += 1;
            tried.insert(worker.id);
            backoff(retry, attempts - 1, deadline).await;
        }
        core.metrics().incr(Counter::UpstreamRetries);
        core.metrics().workers().retried(worker.id, endpoint);
        last_error = Some(failure.error);
    }
    if last_error.is_some() {
        core.metrics().workers().retries_exhausted(endpoint);
    }
    Err(last_error
        .unwrap_or_else(|| ProxyError::new(ErrorKind::NoHealthyWorker, Side::Internal, "route")))
}

/// Splits the client connection for the attempts: the request they forward (in the read
/// buffer, with the routing scratch) and the side the response goes to.
fn split_downstream<'d>(
    down: &'d mut Downstream,
    request: &'d Request,
    endpoint: Endpoint,
    started: Instant,
) -> (Forwarded<'d>, ClientSide<'d>) {
    let Downstream {
        socket,
        read_buf,
        write_buf,
        prepared,
        request_end,
        request_id,
        ..
    } = down;
    let request_id: &RequestId = request_id;
    let forwarded = Forwarded {
        head: &request.head,
        read_buf,
        body: request.body.clone(),
        request_end,
        prepared,
        request_id,
    };
    let client = ClientSide {
        socket,
        write_buf,
        version_minor: request.head.version_minor,
        connection: request.head.connection,
        endpoint,
        started,
        request_id,
    };
    (forwarded, client)
}

/// The prepare phase: one pass over the body reads the routing input (model, key, partition)
/// without building a document, and the router looks it up; a body that is not a JSON object
/// is a 400. A prompt whose uncached part is too long to tokenize on the data core goes to the
/// tokenizer pool: the request's task waits for it there, the core serves its other
/// connections meanwhile, and the router completes the preparation with the IDs (or, when the
/// pool's queue was full, with the text).
async fn prepare(
    core: &DataCore,
    request: &mut Forwarded<'_>,
    endpoint: Endpoint,
) -> Result<(), RequestError> {
    let Forwarded {
        head,
        read_buf,
        body,
        prepared,
        ..
    } = request;
    let prepared = prepared.get();
    let header = |name| head.headers.get(read_buf, name);
    // In PD mode the spec ignores `x-smg-routing-tokens` (it applies in regular mode only).
    let mode = match core.shared.config.pd {
        Some(_) => RoutingMode::PrefillDecode,
        None => RoutingMode::Regular,
    };
    let headers = RoutingHeaders {
        mode,
        routing_tokens: header(ROUTING_TOKENS_HEADER),
        routing_key: header(ROUTING_KEY_HEADER),
        target_worker: header(TARGET_WORKER_HEADER),
    };
    let now_ms = core.shared.tick_now();
    let mut deferred = core.router.borrow_mut().prepare_or_defer(
        prepared,
        endpoint,
        headers,
        &read_buf[body.clone()],
        now_ms,
    )?;
    // At most twice: a long body rendered and cut, then its cold segments encoded.
    while let Some(work) = deferred {
        let done = monoio::spawn_blocking(move || run_off_core(work))
            .await
            .ok();
        deferred = core.router.borrow_mut().finish_prepare(prepared, done);
    }
    Ok(())
}

/// Runs deferred tokenization on a pool thread; after work on a large body or prompt that
/// thread gives its freed pages back (the body's document and the template's values: 5 MB of
/// tool definitions took 816 MB, kept by the allocator until the thread allocated again).
fn run_off_core(work: Deferred) -> DeferredDone {
    let large = work.bytes() > READ_BUF_BYTES_RETAINED_MAX;
    let done = work.run();
    if large {
        memory::return_freed_pages();
    }
    done
}

/// Answers a body that cannot be routed (400, `ErrorKind::InvalidJson`): one that is not UTF-8
/// is told so (`RequestError`'s message, with the offset), any other gets `InvalidJson`'s
/// message (not JSON, or a field of the wrong type). The connection stays.
async fn answer_unusable_body(client: &mut ClientSide<'_>, refused: &RequestError) -> Answered {
    let kind = ErrorKind::InvalidJson;
    let message = match refused {
        RequestError::InvalidUtf8 { .. } => refused.to_string(),
        RequestError::MalformedJson { .. } => kind.message().to_string(),
    };
    let body = serde_json::to_vec(&error_body(kind.status(), kind.error_type(), &message))
        .unwrap_or_default();
    client.write_buf.clear();
    codec::write_local_response_with_id(
        client.write_buf,
        kind.status(),
        "application/json",
        &body,
        client.connection,
        client.request_id.header_line(),
    );
    let written = write_to_client(client.socket, client.write_buf, 0).await;
    Answered {
        status: kind.status(),
        connection: client
            .connection
            .and(Connection::keep_if(written && kind.keeps_connection())),
    }
}

/// The select phase of one attempt: a worker this request has not tried, else (every eligible
/// worker was tried) any eligible one: a retry in place beats giving up early. The decision's
/// logs name the request's id (a span, built only when debug logs are on).
fn select_worker(
    core: &DataCore,
    prepared: &Prepared,
    request_id: &RequestId,
    view: WorkerView<'_>,
    tried: &mut TriedWorkers,
) -> Option<WorkerId> {
    let span = tracing::debug_span!("request", request_id = request_id.as_str());
    let _in_request = span.enter();
    let mut router = core.router.borrow_mut();
    let picked = router.select(prepared, view, tried);
    if picked.is_some() || tried.is_empty() {
        return picked;
    }
    tried.clear();
    router.select(prepared, view, tried)
}

/// Reports a failed attempt to the worker's circuit breaker and the error counters. A stale
/// pooled socket is counted apart (and retried on a fresh connection): after an engine restart
/// every pooled connection to it fails once this way.
fn note_failure(core: &DataCore, worker: WorkerId, failure: &AttemptFailure) {
    if failure.is_stale_connection() {
        core.metrics().incr(Counter::UpstreamStaleConnections);
        return;
    }
    report_outcome(core, worker, failure.breaker_outcome());
    if failure.status.is_none() {
        core.count_error(failure.error.kind);
        core.metrics().workers().error(worker, failure.error.kind);
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

/// One upstream attempt, through the upstream seam: connect or reuse, forward, record, stream
/// back, give the connection back.
async fn attempt(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    attempt: &mut Attempt<'_>,
) -> Result<AttemptDone, AttemptFailure> {
    let fail = |error, on_reused_connection| AttemptFailure {
        error,
        on_reused_connection,
        status: None,
    };
    let worker = attempt.worker;
    let mut up = Exchange::open(core, worker)
        .await
        .map_err(|e| fail(e, false))?;
    let reused = up.reused();
    up.forward(core, request, attempt)
        .await
        .map_err(|e| fail(e, reused))?;
    // The worker has the request: the index learns it now, not when the response ends.
    let mut flight = record_dispatch(core, request.prepared.get(), worker.id);
    let streamed = stream_back(core, &mut up, client, request, attempt)
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
    if streamed.relayed_whole {
        up.give_back(core, worker.id);
    }
    // The attempt's final outcome: a failure status was reported when it arrived (a body cut
    // short after it adds a failure); a success status counts only now, once its body is whole,
    // and a body the worker stalled or cut makes the attempt a failure.
    let outcome = match (
        status_outcome(streamed.answered.status),
        streamed.upstream_failed,
    ) {
        (_, true) => Some(AttemptOutcome::Failure),
        (AttemptOutcome::Success, false) => Some(AttemptOutcome::Success),
        (AttemptOutcome::Failure, false) => None,
    };
    if outcome == Some(AttemptOutcome::Success) {
        flight.answered();
    }
    Ok(AttemptDone {
        answered: streamed.answered,
        outcome,
    })
}

/// The record phase (spec step 7): the index learns where this request went, and the
/// KV-event index's in-flight overlay that the worker has its blocks until the attempt ends.
fn record_dispatch<'c>(core: &'c DataCore, prepared: &Prepared, worker: WorkerId) -> Flight<'c> {
    let tick = core.shared.tick_now();
    let mut router = core.router.borrow_mut();
    if let Some(key) = router.record(prepared, worker, tick) {
        core.send_dispatch_record(worker, tick, key);
    }
    let keys = router.flight_keys(prepared, worker);
    Flight {
        core,
        id: keys.and_then(|keys| core.send_flight_start(worker, keys)),
    }
}

/// An attempt the in-flight overlay follows: its end is sent when it is dropped, a failure
/// unless [`Flight::answered`] said otherwise first (an error, a timeout or a client gone end
/// the attempt by returning early, and each drops it).
struct Flight<'c> {
    core: &'c DataCore,
    id: Option<FlightId>,
}

impl Flight<'_> {
    /// The worker answered whole.
    fn answered(&mut self) {
        if let Some(id) = self.id.take() {
            self.core.send_flight_end(id, FlightEnd::Answered);
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.core.send_flight_end(id, FlightEnd::Failed);
        }
    }
}
