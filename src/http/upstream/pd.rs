//! The driver of a prefill/decode pair (`--pd-disaggregation`): one client request, two
//! upstream requests, one relayed answer. It sits beside the regular driver (`proxy`) rather
//! than behind [`Exchange`] because a pair is two selections, two credits and two concurrent
//! upstreams whose failures mean different things, which one attempt on one worker (the seam's
//! unit) cannot say; its decode side is an ordinary [`Exchange`] relayed by `relay`, so the
//! relay (SSE error events, time to first byte, buffers lent between tokens) is the regular
//! one. Owns [`proxy_pair`]; what the engines' handshakes do to the bodies is `pd::handshake`.
//!
//! Per attempt: **select** a prefill worker (the core's router, the index's policy: the prefix
//! cache lives on the prefill engines; the routing input as in regular mode) and a decode worker
//! (the decode router, its own policy, no index), each among its role only; **credit** both;
//! then the handshake:
//!
//! - **SGLang** ([`sglang_pair`]): the body with `bootstrap_host`, `bootstrap_port` and a fresh
//!   `bootstrap_room` (per item for a batch) goes to both at once, each on a pooled connection;
//!   the prefill's answer is read whole (`Exchange::read_whole`) while the decode's head is
//!   awaited, and the decode's answer is relayed only once the prefill's succeeded. With
//!   logprobs asked for, the prefill's answer is read whole (`net::client::post_json`) and its
//!   input logprobs put ahead of the decode's: in the decode's answer read whole
//!   ([`merged_pair`]), or in each event of its stream, relayed as it comes
//!   (`net::client::post_json_streaming`, [`merged_stream_pair`]).
//! - **vLLM** ([`vllm_pair`]): the prefill first (one token, `kv_transfer_params` asking for a
//!   remote decode), then the decode with the `kv_transfer_params` it returned.
//!
//! Failures: a prefill that fails before the decode's answer reached the client retries the
//! pair (the decode leg is dropped, closing its connection, so its engine stops waiting); a
//! decode that fails first drops the prefill leg (cancelling it); a client gone ends both, as
//! every upstream wait races the client. Each side's worker hears its own outcome (breaker,
//! error counters) and a retry avoids the worker at fault. A fleet without an eligible prefill
//! or decode worker is answered 503 naming the missing role. The record (spec step 7) is the
//! prefill worker's and is not broadcast over the mesh; `x-smg-routing-tokens` is ignored
//! (`proxy::prepare` reads the head in `RoutingMode::PrefillDecode`).

use std::future::Future;
use std::pin::pin;
use std::time::Instant;

use futures::future::{select, Either};

use super::{Attempt, Exchange, HeadRead, RetryableStatus};
use crate::error::{error_body, ErrorKind, ProxyError, Side};
use crate::http::core::DataCore;
use crate::http::downstream::{write_to_client, Answered, ClientSide, Forwarded};
use crate::http::relay::{
    head_context, relay_started, stream_back, write_cut_event_chunk, StreamEnd, Streamed,
};
use crate::ids::WorkerId;
use crate::limits::{PD_ANSWER_BYTES_MAX, STALE_CONNECTION_RETRIES_MAX};
use crate::metrics::Counter;
use crate::net::client::{self, ClientResponse};
use crate::net::codec::{self, Connection};
use crate::pd::handshake::{
    kv_transfer_params_of, merge_event_logprobs, merge_input_logprobs, write_bootstrap_body,
    write_vllm_decode_body, write_vllm_prefill_body, Bootstrap, RequestShape,
};
use crate::pd::Handshake;
use crate::policy::{MeshShare, Router, WorkerView};
use crate::workers::breaker::AttemptOutcome;
use crate::workers::catalog::{ModelCatalog, ModelWorkers};
use crate::workers::retry::{is_retryable_status, TriedWorkers};
use crate::workers::role::PdSide;
use crate::workers::table::WorkerEntry;

/// A failed pair attempt, before any byte reached the client: the error, and the worker at
/// fault (whose breaker hears it, and whom the retry avoids).
struct PairFailure {
    error: ProxyError,
    worker: WorkerId,
    /// The worker answered this status, which was not forwarded.
    status: Option<u16>,
    /// A pooled decode connection the engine had closed (a restart): not the worker failing,
    /// tried again on a fresh connection apart from the attempts, as the regular driver does.
    stale: bool,
}

impl PairFailure {
    fn of(worker: &WorkerEntry, error: ProxyError) -> Self {
        PairFailure {
            error,
            worker: worker.id,
            status: None,
            stale: false,
        }
    }

    /// A failure of a side's exchange `up`: stale when it failed retryably on a connection
    /// that served a request before.
    fn of_exchange(worker: &WorkerEntry, up: &Exchange, error: ProxyError) -> Self {
        let stale = up.reused() && error.may_retry();
        PairFailure {
            stale,
            ..PairFailure::of(worker, error)
        }
    }

    /// The worker answered `status`, a failure: retried while attempts are left.
    fn status(worker: &WorkerEntry, status: u16) -> Self {
        let error = ProxyError::upstream(ErrorKind::UpstreamClosed, "failure status").retryable();
        PairFailure {
            error,
            worker: worker.id,
            status: Some(status),
            stale: false,
        }
    }
}

/// A pair that answered the client, and what it means for each side's breaker.
struct PairDone {
    answered: Answered,
    decode: Option<AttemptOutcome>,
}

/// The tried workers of each side.
#[derive(Default)]
struct TriedPair {
    prefill: TriedWorkers,
    decode: TriedWorkers,
}

/// One attempt's two sides.
struct Pair<'a> {
    prefill: Attempt<'a>,
    decode: Attempt<'a>,
}

/// Proxies one routed request to a prefill/decode pair (the PD driver; `proxy::proxy_request`
/// hands it every routed request under `--pd-disaggregation`, once prepared). `configured` is
/// `--backend`'s handshake; without it each pair speaks its prefill engine's, as `catalog`
/// found it in the worker's `/v1/models` (SMG's detection).
pub async fn proxy_pair(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    models: ModelWorkers<'_>,
    catalog: &ModelCatalog,
    configured: Option<Handshake>,
) -> Result<Answered, ProxyError> {
    let body = &request.read_buf[request.body.clone()];
    let shape = match RequestShape::read(client.endpoint, body) {
        Ok(shape) => shape,
        Err(e) => {
            return Ok(answer_local(client, 400, "invalid_request_error", &e.to_string()).await)
        }
    };
    let deadline = Instant::now() + core.shared.config.request_timeout;
    let retry = &core.shared.config.worker_settings.retry;
    let attempts_max = retry.attempts_allowed();
    let (mut attempts, mut stale_retries) = (0usize, 0usize);
    let mut tried = TriedPair::default();
    let mut last_error = None;
    let mut rewritten = Vec::new();
    while attempts < attempts_max && stale_retries < STALE_CONNECTION_RETRIES_MAX {
        let roster = core.shared.table.roster();
        let view = WorkerView {
            roster: &roster,
            table: &core.shared.table,
            models,
        };
        let picked = select_pair(core, request, view, &mut tried);
        let (prefill, decode) = match picked {
            Ok((p, d)) => match (roster.get(p), roster.get(d)) {
                (Some(p), Some(d)) => (p, d),
                _ => break,
            },
            Err(_) if last_error.is_some() => break,
            Err(side) => {
                let message = format!(
                    "no healthy {} worker available (PD mode needs a prefill and a decode \
                     worker for the request's model)",
                    side.name()
                );
                return Ok(answer_local(client, 503, "service_unavailable", &message).await);
            }
        };
        core.metrics().workers().selected(prefill.id);
        core.metrics().workers().selected(decode.id);
        let tokens = request.prepared.get().request_tokens();
        let on_status = match attempts + 1 < attempts_max {
            true => RetryableStatus::Retry,
            false => RetryableStatus::Forward,
        };
        let mut pair = Pair {
            prefill: Attempt {
                worker: prefill,
                credit: core.shared.table.credit(core.core_id, prefill.id, tokens),
                deadline,
                on_status,
            },
            decode: Attempt {
                worker: decode,
                credit: core.shared.table.credit(core.core_id, decode.id, 0),
                deadline,
                on_status,
            },
        };
        let handshake = Handshake::of_pair(configured, catalog.owner_of(prefill.id));
        let done = match (handshake, shape.return_logprob) {
            (Handshake::Sglang, false) => {
                sglang_pair(core, client, request, &shape, &mut pair, &mut rewritten).await
            }
            (Handshake::Sglang, true) if shape.stream => {
                merged_stream_pair(core, client, request, &shape, &mut pair, &mut rewritten).await
            }
            (Handshake::Sglang, true) => {
                merged_pair(core, client, request, &shape, &mut pair, &mut rewritten).await
            }
            (Handshake::Vllm, _) => {
                vllm_pair(core, client, request, &shape, &mut pair, &mut rewritten).await
            }
        };
        let failure = match done {
            Ok(done) => {
                core.report_attempt(prefill.id, AttemptOutcome::Success);
                if let Some(outcome) = done.decode {
                    core.report_attempt(decode.id, outcome);
                }
                return Ok(done.answered);
            }
            Err(failure) => failure,
        };
        note_failure(core, &failure);
        if !failure.error.may_retry() {
            return Err(failure.error);
        }
        if failure.stale {
            // Its siblings in the pool are most likely stale too (an engine restart).
            super::drop_idle_connections(core, failure.worker);
            stale_retries += 1;
        } else {
            attempts += 1;
            match failure.worker == prefill.id {
                true => tried.prefill.insert(prefill.id),
                false => tried.decode.insert(decode.id),
            }
            backoff(core, attempts - 1, deadline).await;
        }
        core.metrics().incr(Counter::UpstreamRetries);
        core.metrics()
            .workers()
            .retried(failure.worker, client.endpoint);
        last_error = Some(failure.error);
    }
    if last_error.is_some() {
        core.metrics().workers().retries_exhausted(client.endpoint);
    }
    Err(last_error
        .unwrap_or_else(|| ProxyError::new(ErrorKind::NoHealthyWorker, Side::Internal, "route")))
}

/// Selects each side among its own role (a side whose workers were all tried starts over, as
/// the regular driver does); `Err` names the side with no eligible worker.
fn select_pair(
    core: &DataCore,
    request: &mut Forwarded<'_>,
    view: WorkerView<'_>,
    tried: &mut TriedPair,
) -> Result<(WorkerId, WorkerId), PdSide> {
    let prepared = request.prepared.get();
    let pick = |router: &mut Router, tried: &mut TriedWorkers, side| {
        let picked = router.select_serving(prepared, view, tried, Some(side));
        if picked.is_some() || tried.is_empty() {
            return picked.ok_or(side);
        }
        tried.clear();
        router
            .select_serving(prepared, view, tried, Some(side))
            .ok_or(side)
    };
    let prefill = pick(
        &mut core.router.borrow_mut(),
        &mut tried.prefill,
        PdSide::Prefill,
    )?;
    let Some(decode_router) = core.decode_router.as_ref() else {
        return Err(PdSide::Decode);
    };
    let decode = pick(
        &mut decode_router.borrow_mut(),
        &mut tried.decode,
        PdSide::Decode,
    )?;
    Ok((prefill, decode))
}

/// SGLang's handshake, relayed: both sides get the bootstrap body at once; the decode's answer
/// goes to the client once the prefill answered with success.
async fn sglang_pair(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    shape: &RequestShape,
    pair: &mut Pair<'_>,
    body: &mut Vec<u8>,
) -> Result<PairDone, PairFailure> {
    let (prefill, decode) = (pair.prefill.worker, pair.decode.worker);
    write_sglang_body(request, shape, prefill, body);
    let mut prefill_up = Exchange::open(core, prefill)
        .await
        .map_err(|e| PairFailure::of(prefill, e))?;
    prefill_up
        .forward_body(core, request, body, &pair.prefill)
        .await
        .map_err(|e| PairFailure::of_exchange(prefill, &prefill_up, e))?;
    record_prefill(core, request, prefill.id);
    let mut up = Exchange::open(core, decode)
        .await
        .map_err(|e| PairFailure::of(decode, e))?;
    up.forward_body(core, request, body, &pair.decode)
        .await
        .map_err(|e| PairFailure::of_exchange(decode, &up, e))?;
    let first_byte_deadline = pair
        .decode
        .deadline
        .min(Instant::now() + core.shared.config.upstream_first_byte_timeout);
    let method = request.head.method;
    let prefill_reused = prefill_up.reused();
    let prefill_answer = prefill_up.read_whole(method, first_byte_deadline, PD_ANSWER_BYTES_MAX);
    let context = head_context(request, &pair.decode, client.request_id);
    let reused = up.reused();
    let decode_failed = |e: ProxyError| PairFailure {
        stale: reused && e.may_retry(),
        ..PairFailure::of(decode, e)
    };
    let start = {
        let prefill_answer = pin!(prefill_answer);
        let decode_head = pin!(up.read_head(core, client, context, first_byte_deadline));
        match select(prefill_answer, decode_head).await {
            Either::Left((answered, decode_head)) => {
                match check_prefill(prefill, prefill_reused, answered) {
                    Ok(_) => decode_head.await.map_err(decode_failed),
                    Err(failure) => Err(failure),
                }
            }
            // A decode that fails first ends the pair: the prefill leg is dropped, cancelled.
            Either::Right((Err(e), _)) => Err(decode_failed(e)),
            Either::Right((Ok(head), prefill_answer)) => {
                check_prefill(prefill, prefill_reused, prefill_answer.await).map(|_| head)
            }
        }
    };
    // A failure leaves nothing sent: a decode head read meanwhile is dropped, and the pair is
    // tried again.
    let start = start.inspect_err(|_| client.write_buf.clear())?;
    pair.prefill.credit.prefill_done();
    prefill_up.give_back(core, prefill.id);
    let start = match start {
        HeadRead::RetryableStatus(status) => return Err(PairFailure::status(decode, status)),
        HeadRead::Relaying(start) => start,
    };
    let streamed = relay_started(
        core,
        &mut up,
        client,
        request,
        &mut pair.decode,
        start,
        first_byte_deadline,
    )
    .await;
    Ok(finish_relay(core, up, decode.id, streamed))
}

/// SGLang's handshake with logprobs asked for, unstreamed: both answers read whole, the
/// prefill's input logprobs merged into the decode's, and the result answered.
async fn merged_pair(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    shape: &RequestShape,
    pair: &mut Pair<'_>,
    body: &mut Vec<u8>,
) -> Result<PairDone, PairFailure> {
    let (prefill, decode) = (pair.prefill.worker, pair.decode.worker);
    write_sglang_body(request, shape, prefill, body);
    let path = target(request);
    let deadline = pair.decode.deadline;
    let (p_spec, d_spec) = (&prefill.spec, &decode.spec);
    let auth = authorization(request);
    let auth = auth.as_deref();
    let body = body.as_slice();
    record_prefill(core, request, prefill.id);
    let prefill_answer = client::post_json(
        p_spec.addr,
        p_spec.scheme,
        &p_spec.authority,
        &path,
        auth,
        body,
        deadline,
        PD_ANSWER_BYTES_MAX,
    );
    let decode_answer = client::post_json(
        d_spec.addr,
        d_spec.scheme,
        &d_spec.authority,
        &path,
        auth,
        body,
        deadline,
        PD_ANSWER_BYTES_MAX,
    );
    let answers = await_both(core, client, pair, prefill_answer, decode_answer).await;
    let (prefill_answer, decode_answer) = answers?;
    pair.prefill.credit.prefill_done();
    let decode_answer = decode_answer.map_err(|e| PairFailure::of(decode, e))?;
    let status = decode_answer.status;
    if is_retryable_status(status) && pair.decode.on_status == RetryableStatus::Retry {
        return Err(PairFailure::status(decode, status));
    }
    let prefill_json: serde_json::Value =
        serde_json::from_slice(&prefill_answer.body).unwrap_or_default();
    let merged = merge_answer(&prefill_json, decode_answer);
    let answered = answer_bytes(client, status, "application/json", &merged).await;
    let outcome = match status >= 500 {
        true => AttemptOutcome::Failure,
        false => AttemptOutcome::Success,
    };
    Ok(PairDone {
        answered,
        decode: Some(outcome),
    })
}

/// SGLang's handshake with logprobs asked for, streamed: the prefill's answer read whole while
/// the decode's head is awaited, then the decode's events relayed as they come, each with the
/// prefill's input logprobs put ahead of its own (`merge_stream_events`), as SGLang's router
/// and SMG's do: the first event the client gets already carries them.
async fn merged_stream_pair(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    shape: &RequestShape,
    pair: &mut Pair<'_>,
    body: &mut Vec<u8>,
) -> Result<PairDone, PairFailure> {
    let (prefill, decode) = (pair.prefill.worker, pair.decode.worker);
    write_sglang_body(request, shape, prefill, body);
    let path = target(request);
    let deadline = pair.decode.deadline;
    let (p_spec, d_spec) = (&prefill.spec, &decode.spec);
    let auth = authorization(request);
    let (auth, body) = (auth.as_deref(), body.as_slice());
    record_prefill(core, request, prefill.id);
    let prefill_answer = client::post_json(
        p_spec.addr,
        p_spec.scheme,
        &p_spec.authority,
        &path,
        auth,
        body,
        deadline,
        PD_ANSWER_BYTES_MAX,
    );
    let decode_head = client::post_json_streaming(
        d_spec.addr,
        d_spec.scheme,
        &d_spec.authority,
        &path,
        auth,
        body,
        deadline,
    );
    let answers = await_both(core, client, pair, prefill_answer, decode_head).await;
    let (prefill_answer, decode_answer) = answers?;
    pair.prefill.credit.prefill_done();
    let mut decode_answer = decode_answer.map_err(|e| PairFailure::of(decode, e))?;
    let status = decode_answer.status;
    if is_retryable_status(status) && pair.decode.on_status == RetryableStatus::Retry {
        return Err(PairFailure::status(decode, status));
    }
    let prefill_json: serde_json::Value =
        serde_json::from_slice(&prefill_answer.body).unwrap_or_default();
    let streamed = relay_merged_events(
        core,
        client,
        decode,
        &prefill_json,
        &mut decode_answer,
        deadline,
    )
    .await;
    let outcome = match (status >= 500, streamed.upstream_failed) {
        (false, false) => AttemptOutcome::Success,
        _ => AttemptOutcome::Failure,
    };
    Ok(PairDone {
        answered: streamed.answered,
        decode: Some(outcome),
    })
}

/// `merged_stream_pair`'s relay: the head, then each read of the decode's body, its whole lines
/// merged (`merge_stream_events`) and written as one chunk; a line still arriving waits for its
/// end, within `PD_ANSWER_BYTES_MAX`. A client gone is seen at the next write.
async fn relay_merged_events(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    worker: &WorkerEntry,
    prefill: &serde_json::Value,
    decode: &mut client::StreamingResponse,
    deadline: Instant,
) -> Streamed {
    let chunked = client.version_minor >= 1;
    let connection = match chunked {
        true => client.connection,
        // An HTTP/1.0 client's body ends when the connection closes.
        false => Connection::Close,
    };
    let status = decode.status;
    let ended = |whole: bool, upstream_failed: bool| Streamed {
        answered: Answered {
            status,
            connection: connection.and(Connection::keep_if(whole)),
        },
        relayed_whole: whole,
        upstream_failed,
    };
    client.write_buf.clear();
    write_stream_head(client, worker, status, chunked, connection);
    if !write_to_client(client.socket, client.write_buf, 0).await {
        core.metrics().incr(Counter::DownstreamAborts);
        return ended(false, false);
    }
    let (mut pending, mut merged) = (Vec::new(), Vec::new());
    loop {
        let read_deadline = deadline.min(Instant::now() + core.shared.config.upstream_idle_timeout);
        let read = match core.cutting_requests.get() {
            true => Err(None),
            false => {
                (decode.read_more(&mut pending, read_deadline).await).map_err(|e| Some(e.kind))
            }
        };
        let more = match read {
            Ok(more) => more,
            Err(failed) => {
                // Cut: the client gets the relay's SSE error event (our chunks are whole).
                client.write_buf.clear();
                if chunked && write_cut_event_chunk(core, client.write_buf, failed) {
                    write_to_client(client.socket, client.write_buf, 0).await;
                }
                return ended(false, failed.is_some());
            }
        };
        // The whole lines read so far (an event's `data:` line is merged on its own); a line
        // still arriving waits for its end, or the body's.
        let complete = match more {
            true => (pending.iter().rposition(|b| *b == b'\n')).map_or(0, |i| i + 1),
            false => pending.len(),
        };
        if complete == 0 && more && pending.len() > PD_ANSWER_BYTES_MAX {
            return ended(false, true);
        }
        merged.clear();
        merge_stream_events(prefill, &pending[..complete], &mut merged);
        pending.drain(..complete);
        client.write_buf.clear();
        if !merged.is_empty() {
            write_body_part(client.write_buf, &merged, chunked);
        }
        if !more && chunked {
            client.write_buf.extend_from_slice(b"0\r\n\r\n");
        }
        if !client.write_buf.is_empty()
            && !write_to_client(client.socket, client.write_buf, 0).await
        {
            core.metrics().incr(Counter::DownstreamAborts);
            return ended(false, false);
        }
        if !more {
            return ended(chunked, false);
        }
    }
}

/// The head of a merged stream the gateway writes itself.
fn write_stream_head(
    client: &mut ClientSide<'_>,
    worker: &WorkerEntry,
    status: u16,
    chunked: bool,
    connection: Connection,
) {
    let out = &mut *client.write_buf;
    out.extend_from_slice(
        format!("HTTP/1.1 {status} {}\r\n", codec::reason_phrase(status)).as_bytes(),
    );
    out.extend_from_slice(b"content-type: text/event-stream\r\ncache-control: no-cache\r\n");
    crate::net::date::write_date_header(out);
    out.extend_from_slice(&worker.routed_header_line);
    out.extend_from_slice(client.request_id.header_line());
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if connection == Connection::Close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `data` as one chunk (or raw, unchunked).
fn write_body_part(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if chunked {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    }
    out.extend_from_slice(data);
    if chunked {
        out.extend_from_slice(b"\r\n");
    }
}

/// The two legs of a merged pair (`merged_pair`, `merged_stream_pair`) awaited at once, racing
/// the client: the prefill's answer checked as soon as it is in (a failure ends the pair), then
/// the decode's (its whole answer, or its head); a decode that fails first ends the pair too,
/// the prefill's request dropped.
async fn await_both<T>(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    pair: &Pair<'_>,
    prefill_answer: impl Future<Output = Result<ClientResponse, ProxyError>>,
    decode_answer: impl Future<Output = Result<T, ProxyError>>,
) -> Result<(ClientResponse, Result<T, ProxyError>), PairFailure> {
    let (prefill, decode) = (pair.prefill.worker, pair.decode.worker);
    let (prefill_answer, decode_answer) = (pin!(prefill_answer), pin!(decode_answer));
    let waits = select(prefill_answer, decode_answer);
    let interrupted = pin!(super::interruption(
        core,
        client.socket,
        pair.decode.deadline
    ));
    match select(waits, interrupted).await {
        Either::Right(_) => {
            let error = ProxyError::new(ErrorKind::ClientClosed, Side::Downstream, "pd pair");
            Err(PairFailure::of(decode, error))
        }
        Either::Left((Either::Left((answered, decode_answer)), _)) => {
            match check_prefill(prefill, false, answered) {
                Ok(prefill_answer) => Ok((prefill_answer, decode_answer.await)),
                Err(failure) => Err(failure),
            }
        }
        Either::Left((Either::Right((Err(e), _)), _)) => Err(PairFailure::of(decode, e)),
        Either::Left((Either::Right((Ok(answer), prefill_answer)), _)) => {
            check_prefill(prefill, false, prefill_answer.await).map(|p| (p, Ok(answer)))
        }
    }
}

/// vLLM's handshake: the prefill answered whole first, then the decode relayed.
async fn vllm_pair(
    core: &DataCore,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    shape: &RequestShape,
    pair: &mut Pair<'_>,
    body: &mut Vec<u8>,
) -> Result<PairDone, PairFailure> {
    let (prefill, decode) = (pair.prefill.worker, pair.decode.worker);
    write_vllm_prefill_body(&request.read_buf[request.body.clone()], shape, body);
    let first_byte_deadline = pair
        .prefill
        .deadline
        .min(Instant::now() + core.shared.config.upstream_first_byte_timeout);
    let mut prefill_up = Exchange::open(core, prefill)
        .await
        .map_err(|e| PairFailure::of(prefill, e))?;
    prefill_up
        .forward_body(core, request, body, &pair.prefill)
        .await
        .map_err(|e| PairFailure::of_exchange(prefill, &prefill_up, e))?;
    record_prefill(core, request, prefill.id);
    let (method, reused) = (request.head.method, prefill_up.reused());
    let answer = {
        let answer = prefill_up.read_whole(method, first_byte_deadline, PD_ANSWER_BYTES_MAX);
        let interrupted = pin!(super::interruption(
            core,
            client.socket,
            first_byte_deadline
        ));
        match select(pin!(answer), interrupted).await {
            Either::Left((answer, _)) => check_prefill(prefill, reused, answer),
            Either::Right(_) => {
                let error =
                    ProxyError::new(ErrorKind::ClientClosed, Side::Downstream, "pd prefill");
                Err(PairFailure::of(prefill, error))
            }
        }
    }?;
    pair.prefill.credit.prefill_done();
    prefill_up.give_back(core, prefill.id);
    let params = kv_transfer_params_of(&answer.body).map_err(|_| {
        let error = ProxyError::upstream(ErrorKind::UpstreamMalformed, "kv_transfer_params");
        PairFailure::of(prefill, error.retryable())
    })?;
    write_vllm_decode_body(&request.read_buf[request.body.clone()], params, body);
    let mut up = Exchange::open(core, decode)
        .await
        .map_err(|e| PairFailure::of(decode, e))?;
    up.forward_body(core, request, body, &pair.decode)
        .await
        .map_err(|e| PairFailure::of_exchange(decode, &up, e))?;
    let streamed = stream_back(core, &mut up, client, request, &mut pair.decode)
        .await
        .map_err(|e| PairFailure::of_exchange(decode, &up, e))?;
    match streamed {
        StreamEnd::RetryableStatus(status) => Err(PairFailure::status(decode, status)),
        StreamEnd::Done(streamed) => Ok(finish_relay(core, up, decode.id, streamed)),
    }
}

/// The decode's connection back to the pool when its body went whole, and its outcome.
fn finish_relay(core: &DataCore, up: Exchange, decode: WorkerId, streamed: Streamed) -> PairDone {
    if streamed.relayed_whole {
        up.give_back(core, decode);
    }
    let outcome = match (
        super::status_outcome(streamed.answered.status),
        streamed.upstream_failed,
    ) {
        (_, true) => Some(AttemptOutcome::Failure),
        (AttemptOutcome::Success, false) => Some(AttemptOutcome::Success),
        (AttemptOutcome::Failure, false) => None,
    };
    PairDone {
        answered: streamed.answered,
        decode: outcome,
    }
}

/// The prefill's answer, or the failure it is: unreachable, cut, timed out, or a status other
/// than 2xx (whatever it is, the decode will not get its KV cache).
fn check_prefill(
    prefill: &WorkerEntry,
    reused: bool,
    answered: Result<ClientResponse, ProxyError>,
) -> Result<ClientResponse, PairFailure> {
    let answer = answered.map_err(|e| PairFailure {
        // A pooled connection the engine had closed fails at once: tried again apart.
        stale: reused && e.may_retry(),
        // Nothing of the pair reached the client: any prefill failure may be retried.
        ..PairFailure::of(prefill, e.retryable())
    })?;
    match answer.status {
        200..=299 => Ok(answer),
        status => Err(PairFailure::status(prefill, status)),
    }
}

/// Writes into `body` the client's request with SGLang's bootstrap fields for the pair's
/// `prefill` worker (its host and bootstrap port, a fresh random room per item).
fn write_sglang_body(
    request: &Forwarded<'_>,
    shape: &RequestShape,
    prefill: &WorkerEntry,
    body: &mut Vec<u8>,
) {
    let bootstrap = Bootstrap {
        host: prefill.spec.host(),
        port: prefill.spec.role.bootstrap_port(),
    };
    let client_body = &request.read_buf[request.body.clone()];
    write_bootstrap_body(
        client_body,
        shape,
        bootstrap,
        &mut fastrand::Rng::new(),
        body,
    );
}

/// The client's `Authorization`, passed on to the side read whole (engines started with an API
/// key want it on both requests; the relayed side gets the client's head as it is).
fn authorization(request: &Forwarded<'_>) -> Option<Vec<u8>> {
    (request.head.headers)
        .get(request.read_buf, "authorization")
        .map(<[u8]>::to_vec)
}

/// The request's path and query, for the prefill's request.
fn target(request: &Forwarded<'_>) -> String {
    String::from_utf8_lossy(request.head.target(request.read_buf)).into_owned()
}

/// Spec step 7 for the prefill worker, which now has the request: its engine holds the
/// prefix. PD records stay on this gateway (the spec: not broadcast over the mesh).
fn record_prefill(core: &DataCore, request: &mut Forwarded<'_>, prefill: WorkerId) {
    let tick = core.shared.tick_now();
    let record = core
        .router
        .borrow_mut()
        .record(request.prepared.get(), prefill, tick);
    if let Some(mut key) = record {
        key.mesh = MeshShare::Local;
        core.send_dispatch_record(prefill, tick, key);
    }
}

/// The decode's answer with the prefill's input logprobs merged in (an answer that does not
/// parse goes through unchanged).
fn merge_answer(prefill: &serde_json::Value, decode: ClientResponse) -> Vec<u8> {
    let Ok(mut answer) = serde_json::from_slice::<serde_json::Value>(&decode.body) else {
        return decode.body;
    };
    merge_input_logprobs(prefill, &mut answer);
    serde_json::to_vec(&answer).unwrap_or(decode.body)
}

/// Appends to `merged` the SSE `events` (whole lines) with the prefill's input logprobs merged
/// into each `data:` event (an event that does not parse, `[DONE]`, goes through unchanged).
fn merge_stream_events(prefill: &serde_json::Value, events: &[u8], merged: &mut Vec<u8>) {
    for line in events.split_inclusive(|b| *b == b'\n') {
        let data = line.strip_prefix(b"data: ").map(<[u8]>::trim_ascii);
        match data.and_then(|data| merge_event_logprobs(prefill, data)) {
            Some(event) => {
                merged.extend_from_slice(b"data: ");
                merged.extend_from_slice(&event);
                merged.push(b'\n');
            }
            None => merged.extend_from_slice(line),
        }
    }
}

/// Answers `status` with `body` written by the gateway (a merged answer).
async fn answer_bytes(
    client: &mut ClientSide<'_>,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> Answered {
    client.write_buf.clear();
    codec::write_local_response(
        client.write_buf,
        status,
        content_type,
        body,
        client.connection,
    );
    let written = write_to_client(client.socket, client.write_buf, 0).await;
    Answered {
        status,
        connection: client.connection.and(Connection::keep_if(written)),
    }
}

/// Answers the gateway's own JSON error, with its own message (the 503 that names the role).
async fn answer_local(
    client: &mut ClientSide<'_>,
    status: u16,
    error_type: &str,
    message: &str,
) -> Answered {
    let body = serde_json::to_vec(&error_body(status, error_type, message)).unwrap_or_default();
    answer_bytes(client, status, "application/json", &body).await
}

/// The side at fault's breaker and error counters hear a failed pair.
fn note_failure(core: &DataCore, failure: &PairFailure) {
    if failure.stale {
        core.metrics().incr(Counter::UpstreamStaleConnections);
        return;
    }
    let at_fault = match failure.error.kind {
        ErrorKind::UpstreamConnect
        | ErrorKind::UpstreamClosed
        | ErrorKind::UpstreamMalformed
        | ErrorKind::UpstreamTimeout => true,
        _ => failure.status.is_some(),
    };
    if at_fault {
        core.report_attempt(failure.worker, AttemptOutcome::Failure);
    }
    if failure.status.is_none() {
        core.count_error(failure.error.kind);
        core.metrics()
            .workers()
            .error(failure.worker, failure.error.kind);
    }
}

/// The retry settings' backoff before retry `retry_index`, never past the deadline.
async fn backoff(core: &DataCore, retry_index: usize, deadline: Instant) {
    let retry = &core.shared.config.worker_settings.retry;
    let index = u32::try_from(retry_index).unwrap_or(u32::MAX);
    let wait = retry.backoff(index, fastrand::f64());
    let wait = wait.min(deadline.saturating_duration_since(Instant::now()));
    if !wait.is_zero() {
        monoio::time::sleep(wait).await;
    }
}
