//! The stream-back phase of an attempt: the response head, then the body as it arrives, written
//! through to the client without buffering, whatever kind of upstream it comes from (the
//! [`Exchange`] reads; this module writes, times and counts). Owns [`stream_back`].
//!
//! An event stream's bytes are relayed as soon as they are read, before the task yields
//! ([`Relay::Now`]), and once its head is written the request is committed: it keeps nothing
//! of its request while tokens trickle in. A worker gets `--upstream-first-byte-timeout-secs`
//! to its first body byte and `--upstream-idle-timeout-secs` between reads after it. A stream
//! the client was receiving that stops early (the worker closed or fell silent, shutdown) ends
//! with one SSE error event when the client's framing allows it ([`StreamCut`]); otherwise the
//! connection just closes. Nothing here is an error for the driver: once a byte reached the
//! client, a failure can only end the response ([`StreamEnd`]).

use std::time::Instant;

use super::core::DataCore;
use super::downstream::{write_to_client, Answered, ClientSide, Forwarded};
use super::upstream::{
    Attempt, BodyKind, BodySource, BodyStop, Exchange, HeadContext, HeadRead, ResponseStart,
};
use crate::error::{ErrorKind, ProxyError};
use crate::limits::{CLIENT_GONE_POLL_INTERVAL, READ_BUF_BYTES_RETAINED_MAX};
use crate::metrics::{Counter, Latency};
use crate::net::codec::{Connection, GatewayHeaders};
use crate::net::memory;
use crate::net::socket::Socket;
use crate::request::id::RequestId;

/// What streaming a response produced.
#[derive(Debug)]
pub struct Streamed {
    /// What the client got.
    pub answered: Answered,
    /// The body went to the client whole: the connection may serve another request.
    pub relayed_whole: bool,
    /// The worker failed mid-body (closed, reset, timed out or sent garbage).
    pub upstream_failed: bool,
}

/// How the stream-back phase ended.
#[derive(Debug)]
pub enum StreamEnd {
    /// The response (or part of it) went to the client.
    Done(Streamed),
    /// The worker answered a retryable status; nothing was written to the client.
    RetryableStatus(u16),
}

impl Streamed {
    /// The response ended: whole (`relayed_whole`) or cut short by the client or shutdown.
    fn ended(start: &ResponseStart, relayed_whole: bool) -> Streamed {
        Streamed {
            answered: Answered {
                status: start.status,
                connection: start.connection.and(Connection::keep_if(relayed_whole)),
            },
            relayed_whole,
            upstream_failed: false,
        }
    }

    /// The worker failed mid-body: the client connection closes, the breaker hears a failure.
    fn upstream_failed(status: u16) -> Streamed {
        Streamed {
            answered: Answered {
                status,
                connection: Connection::Close,
            },
            relayed_whole: false,
            upstream_failed: true,
        }
    }
}

/// The stream-back phase: head first, then every read written through as it arrives.
pub async fn stream_back(
    core: &DataCore,
    up: &mut Exchange,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    attempt: &mut Attempt<'_>,
) -> Result<StreamEnd, ProxyError> {
    // Until the first body byte the worker queues and prefills; after it, it decodes.
    let first_byte_deadline = attempt
        .deadline
        .min(Instant::now() + core.shared.config.upstream_first_byte_timeout);
    let context = head_context(request, attempt, client.request_id);
    let start = match up
        .read_head(core, client, context, first_byte_deadline)
        .await?
    {
        HeadRead::RetryableStatus(status) => return Ok(StreamEnd::RetryableStatus(status)),
        HeadRead::Relaying(start) => start,
    };
    let streamed = relay_started(
        core,
        up,
        client,
        request,
        attempt,
        start,
        first_byte_deadline,
    )
    .await;
    Ok(StreamEnd::Done(streamed))
}

/// The head context of `attempt`'s response (the headers the gateway adds, the worker whose
/// breaker hears the status): what `stream_back` reads the head with, and a prefill/decode
/// pair's decode side (`upstream::pd`).
pub fn head_context<'a>(
    request: &mut Forwarded<'_>,
    attempt: &'a Attempt<'_>,
    request_id: &'a RequestId,
) -> HeadContext<'a> {
    HeadContext {
        method: request.head.method,
        gateway_headers: GatewayHeaders {
            routed_worker_line: &attempt.worker.routed_header_line,
            predicted_cached_tokens: request
                .prepared
                .get()
                .predicted_cached_tokens(attempt.worker.id),
            request_id_line: request_id.header_line(),
        },
        worker: attempt.worker.id,
        on_status: attempt.on_status,
    }
}

/// The rest of the stream-back phase once a head is ready in the client's buffer (`start`):
/// the head written, then the body relayed. `stream_back` calls it after reading the head; a
/// prefill/decode pair (`upstream::pd`) after the prefill side answered too.
pub async fn relay_started(
    core: &DataCore,
    up: &mut Exchange,
    client: &mut ClientSide<'_>,
    request: &mut Forwarded<'_>,
    attempt: &mut Attempt<'_>,
    start: ResponseStart,
    first_byte_deadline: Instant,
) -> Streamed {
    let method = request.head.method;
    // The first body byte is the first token (or, unstreamed, the whole answer): the prompt is
    // no longer queued work on the worker.
    if start.body_begun {
        attempt.credit.prefill_done();
        if start.body_kind == BodyKind::EventStream {
            let ttft = client.started.elapsed();
            core.metrics().workers().observe_ttft(client.endpoint, ttft);
        }
    }
    let head_written = write_to_client(client.socket, client.write_buf, 0).await;
    let elapsed = client.started.elapsed();
    core.metrics()
        .observe_latency(Latency::FirstByte, (method, client.endpoint), elapsed);
    if !head_written {
        core.metrics().incr(Counter::DownstreamAborts);
        return Streamed::ended(&start, false);
    }
    if start.body_kind == BodyKind::EventStream {
        // Committed, and a stream may last minutes: it keeps nothing of its request (bytes,
        // routing scratch) while the tokens trickle in.
        let large_body = request.read_buf.capacity() > READ_BUF_BYTES_RETAINED_MAX;
        request.release(&mut core.spare_buffers.borrow_mut());
        if large_body {
            // Its buffer went back to the allocator: its pages go back to the system now, not
            // when the core next allocates (`net::memory`).
            memory::return_freed_pages();
        }
    }
    relay_body(core, up, client, attempt, &start, first_byte_deadline).await
}

/// The body loop of `stream_back`: one read, one write, until the body ends or stops.
async fn relay_body(
    core: &DataCore,
    up: &mut Exchange,
    client: &mut ClientSide<'_>,
    attempt: &mut Attempt<'_>,
    start: &ResponseStart,
    first_byte_deadline: Instant,
) -> Streamed {
    let relay = match start.body_kind {
        BodyKind::EventStream => Relay::Now,
        BodyKind::Other => Relay::Queued,
    };
    let mut body_begun = start.body_begun;
    // A stream whose reads never wait a poll interval never polls for its client in them: it
    // polls here, as often, so a client's half-close (its socket still takes writes) is seen.
    let mut next_gone_check = Instant::now() + CLIENT_GONE_POLL_INTERVAL;
    while !up.body_done() {
        // Between two reads a stream holds no buffer.
        client.write_buf.clear();
        core.spare_buffers.borrow_mut().lend(client.write_buf);
        let read_deadline = if body_begun {
            attempt
                .deadline
                .min(Instant::now() + core.shared.config.upstream_idle_timeout)
        } else {
            first_byte_deadline
        };
        let source = match next_body_read(core, up, client, start, read_deadline).await {
            Ok(Some(source)) => source,
            Ok(None) => break,
            Err(BodyStop::ClientGone) => {
                core.metrics().incr(Counter::DownstreamAborts);
                return Streamed::ended(start, false);
            }
            Err(BodyStop::ShutdownCut) => return Streamed::ended(start, false),
            Err(BodyStop::WorkerFailed(_)) => return Streamed::upstream_failed(start.status),
        };
        if !body_begun && start.body_kind == BodyKind::EventStream {
            let ttft = client.started.elapsed();
            core.metrics().workers().observe_ttft(client.endpoint, ttft);
        }
        body_begun = true;
        attempt.credit.prefill_done();
        let bytes = match source {
            BodySource::Exchange => up.relay_buf(),
            BodySource::Client => &mut *client.write_buf,
        };
        if !write_body(client.socket, bytes, relay).await {
            core.metrics().incr(Counter::DownstreamAborts);
            return Streamed::ended(start, false);
        }
        let now = Instant::now();
        if now >= next_gone_check {
            next_gone_check = now + CLIENT_GONE_POLL_INTERVAL;
            if client.socket.peer_closed() {
                core.metrics().incr(Counter::DownstreamAborts);
                return Streamed::ended(start, false);
            }
        }
    }
    Streamed::ended(start, true)
}

/// One read of a response body in the relay loop; a stop is counted, and one the client can be
/// told of gets its SSE error event written here.
async fn next_body_read(
    core: &DataCore,
    up: &mut Exchange,
    client: &mut ClientSide<'_>,
    start: &ResponseStart,
    read_deadline: Instant,
) -> Result<Option<BodySource>, BodyStop> {
    // A stream whose reads never wait a whole poll interval is cut here.
    let read = if core.cutting_requests.get() {
        Err(BodyStop::ShutdownCut)
    } else {
        up.read_body(core, client, read_deadline).await
    };
    let stop = match read {
        Err(stop) => stop,
        body => return body,
    };
    let cut = match stop {
        BodyStop::ClientGone => return Err(stop),
        BodyStop::ShutdownCut => Some(StreamCut::ShuttingDown),
        BodyStop::WorkerFailed(kind) => {
            core.count_error(kind);
            core.metrics().incr(Counter::UpstreamResponsesCut);
            StreamCut::of_worker_failure(kind)
        }
    };
    let can_tell = start.body_kind == BodyKind::EventStream && up.client_at_chunk_boundary();
    if let Some(cut) = cut.filter(|_| can_tell) {
        client.write_buf.clear();
        write_error_event_chunk(client.write_buf, cut);
        write_to_client(client.socket, client.write_buf, 0).await;
    }
    Err(stop)
}

/// Why a stream the client was receiving ends early: each has its SSE error event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamCut {
    /// The worker closed or reset the connection.
    WorkerClosed,
    /// The worker sent nothing within `--upstream-first-byte-timeout-secs` (body not begun) or
    /// `--upstream-idle-timeout-secs`.
    WorkerSilent,
    /// Shutdown's grace period ran out first.
    ShuttingDown,
}

impl StreamCut {
    /// The event for a worker that failed mid-body, if the client can be told: not after
    /// garbage, which leaves the client's framing in doubt.
    fn of_worker_failure(kind: ErrorKind) -> Option<StreamCut> {
        match kind {
            ErrorKind::UpstreamTimeout => Some(StreamCut::WorkerSilent),
            ErrorKind::UpstreamMalformed => None,
            _ => Some(StreamCut::WorkerClosed),
        }
    }

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

/// The last chunk of a stream the gateway frames itself (a prefill/decode pair's merged stream,
/// `upstream::pd`) cut by the worker failing (`Some(kind)`) or by shutdown (`None`): the SSE
/// error event the relay writes, when the client can be told; returns whether one was written.
/// The failure is counted as the relay counts it.
pub fn write_cut_event_chunk(
    core: &DataCore,
    out: &mut Vec<u8>,
    failed: Option<ErrorKind>,
) -> bool {
    let cut = match failed {
        None => Some(StreamCut::ShuttingDown),
        Some(kind) => {
            core.count_error(kind);
            core.metrics().incr(Counter::UpstreamResponsesCut);
            StreamCut::of_worker_failure(kind)
        }
    };
    match cut {
        Some(cut) => {
            write_error_event_chunk(out, cut);
            true
        }
        None => false,
    }
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

/// When body bytes leave for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relay {
    /// Through a ring write, awaited.
    Queued,
    /// What the client's socket takes at once, before the task yields (the rest through a ring
    /// write): an event stream's bytes, read at once when ready, so its buffer is free again
    /// before the next stream of the same decode step reads.
    Now,
}

/// Writes all of `bytes` (a body read) to the client; returns whether it all went out.
async fn write_body(client: &mut Socket, bytes: &mut Vec<u8>, relay: Relay) -> bool {
    let sent = match relay {
        Relay::Queued => 0,
        Relay::Now => match client.write_now(bytes) {
            Ok(sent) => sent,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(_) => return false,
        },
    };
    sent == bytes.len() || write_to_client(client, bytes, sent).await
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

    #[test]
    fn a_worker_that_sent_garbage_gets_no_error_event() {
        let cut = StreamCut::of_worker_failure;
        assert_eq!(
            cut(ErrorKind::UpstreamTimeout),
            Some(StreamCut::WorkerSilent)
        );
        assert_eq!(
            cut(ErrorKind::UpstreamClosed),
            Some(StreamCut::WorkerClosed)
        );
        assert_eq!(cut(ErrorKind::UpstreamMalformed), None);
    }
}
