//! The upstream seam: how a prepared request reaches the worker an attempt selected, and how its
//! answer comes back. Routing decides *which* worker; an [`Exchange`] is one attempt's
//! conversation with it, in five steps the driver (`proxy`) and the relay (`relay`) call in
//! order, whatever the worker speaks:
//!
//! 1. **connect or reuse** ([`Exchange::open`]): a pooled connection or a new one;
//! 2. **forward** ([`Exchange::forward`]): the request, complete;
//! 3. **read the head** ([`Exchange::read_head`]): the worker's answer begins; a retryable status
//!    is handed back unrelayed while another attempt may follow ([`HeadContext::admit_status`], which
//!    also tells the worker's circuit breaker), otherwise the client's response head is written
//!    into its buffer with the body bytes that came with it ([`ResponseStart`]);
//! 4. **relay the body** ([`Exchange::read_body`], once per read, until [`Exchange::body_done`]):
//!    each read says where the bytes for the client lie ([`BodySource`]) or why the body stopped
//!    ([`BodyStop`]); the relay writes them, and the SSE error event when the client can take one
//!    ([`Exchange::client_at_chunk_boundary`]);
//! 5. **give the connection back** ([`Exchange::give_back`]) once the body was relayed whole.
//!
//! Every upstream read also watches the client and shutdown ([`interruption`]): a client gone
//! before the head ends the attempt as `ClientClosed` (499), one gone mid-body ends the stream;
//! both close the upstream connection so the engine stops generating.
//!
//! HTTP/1.1 (`http1`) and gRPC (`grpc`, a `grpc://` worker: the gateway builds the engine's
//! `Generate` call and writes its answer) are the kinds today. A new kind (a prefill/decode
//! pair) is a module beside them with the same five steps and a variant of [`Exchange`], picked
//! in [`Exchange::open`] from the worker's spec; the driver and the relay do not change.
//! Dispatch is a `match` over the variants; the gRPC variant is boxed (it holds the request's
//! output so far), so an HTTP/1.1 exchange stays as small as before and nothing is boxed for
//! it.
//!
//! Errors before the first response byte reached the client are `ProxyError`s the driver's
//! retry loop reads (`ErrorKind::Upstream*`, with the retry permission each kind sets); after it,
//! a [`BodyStop`].

mod grpc;
mod http1;
mod pd;

pub use pd::proxy_pair;

use std::time::Instant;

use super::core::DataCore;
use super::downstream::{ClientSide, Forwarded};
use crate::error::{ErrorKind, ProxyError};
use crate::ids::WorkerId;
use crate::limits::CLIENT_GONE_POLL_INTERVAL;
use crate::net::client::ClientResponse;
use crate::net::codec::{Connection, GatewayHeaders};
use crate::net::socket::{Cut, Socket};
use crate::request::Method;
use crate::workers::breaker::AttemptOutcome;
use crate::workers::retry::is_retryable_status;
use crate::workers::spec::WorkerProtocol;
use crate::workers::table::{InflightCredit, WorkerEntry};

/// One attempt of a request: the worker it goes to, the credit that counts it there, and what
/// bounds it. The driver builds one per attempt and every phase reads it.
#[derive(Debug)]
pub struct Attempt<'a> {
    /// The worker selected for this attempt.
    pub worker: &'a WorkerEntry,
    /// The request counted on the worker until the attempt ends, however it ends (its prompt
    /// as queued work until the first body byte).
    pub credit: InflightCredit<'a>,
    /// The request's deadline (`--request-timeout-secs`), shared by all its attempts.
    pub deadline: Instant,
    /// What a retryable status from the worker does.
    pub on_status: RetryableStatus,
}

/// What an attempt does with a retryable status (408, 429, 5xx) from the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryableStatus {
    /// Another attempt is allowed: do not forward it, try again.
    Retry,
    /// This is the last attempt: forward it to the client.
    Forward,
}

/// What the head step needs to know of the request and the attempt.
#[derive(Clone, Copy, Debug)]
pub struct HeadContext<'a> {
    /// The request's method (the answer to a `HEAD` has no body).
    pub method: Method,
    /// The headers the gateway adds to the client's response head.
    pub gateway_headers: GatewayHeaders<'a>,
    /// The worker, whose circuit breaker hears the status.
    pub worker: WorkerId,
    /// What a retryable status does.
    pub on_status: RetryableStatus,
}

impl HeadContext<'_> {
    /// Admits the worker's answer of `status` into the relay, or not: a retryable status is
    /// not relayed while another attempt may follow (`false`; the driver notes the failure).
    /// An admitted failure status (5xx, 408, 429) is reported to the worker's circuit breaker
    /// now: whatever its body does, the attempt failed. A success status is not: the attempt's
    /// outcome is known only when its body ends (`status_outcome`, then the driver), since a
    /// worker that answers its head and then stalls or cuts the body has failed, and a success
    /// reported at the head would reset the failure streak a stalling worker builds.
    pub fn admit_status(&self, core: &DataCore, status: u16) -> bool {
        if self.on_status == RetryableStatus::Retry && is_retryable_status(status) {
            return false;
        }
        if status_outcome(status) == AttemptOutcome::Failure {
            core.report_attempt(self.worker, AttemptOutcome::Failure);
        }
        true
    }
}

/// What a worker's answer of `status` means for its circuit breaker, before its body.
pub fn status_outcome(status: u16) -> AttemptOutcome {
    if status >= 500 || is_retryable_status(status) {
        AttemptOutcome::Failure
    } else {
        AttemptOutcome::Success
    }
}

/// How the head step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadRead {
    /// The worker answered a retryable status; nothing was written for the client.
    RetryableStatus(u16),
    /// The client's response head (and the body bytes that came with it) is in its write buffer.
    Relaying(ResponseStart),
}

/// A response whose head is ready for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseStart {
    /// The worker's status, relayed.
    pub status: u16,
    /// What the body is, for ending it early.
    pub body_kind: BodyKind,
    /// What becomes of the client's connection if the body is relayed whole.
    pub connection: Connection,
    /// Whether body bytes came with the head (the worker has begun answering).
    pub body_begun: bool,
}

/// What a response body carries, as far as relaying and ending it early go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// Server-sent events: relayed as each token comes, and a cut stream can end with an SSE
    /// error event.
    EventStream,
    /// Anything else: a cut body can only close the connection.
    Other,
}

/// Where the bytes of one body read lie, ready for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodySource {
    /// In the exchange's own buffer ([`Exchange::relay_buf`]), relayed without a copy.
    Exchange,
    /// In the client's write buffer (the exchange framed them anew, e.g. de-chunked).
    Client,
}

/// Why a response body stopped before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyStop {
    /// The client went while the worker was silent (a prefill, a slow decode).
    ClientGone,
    /// Shutdown's grace period ran out.
    ShutdownCut,
    /// The worker closed or reset (`UpstreamClosed`), fell silent (`UpstreamTimeout`) or broke
    /// its framing (`UpstreamMalformed`).
    WorkerFailed(ErrorKind),
}

/// Why a request stopped waiting on its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupted {
    /// The client closed or reset its connection.
    ClientGone,
    /// Shutdown's grace period is over.
    ShutdownCut,
}

impl Interrupted {
    /// Which interruption a stopped wait was: the client's close, else shutdown.
    fn of(client: &Socket) -> Interrupted {
        if client.peer_closed() {
            Interrupted::ClientGone
        } else {
            Interrupted::ShutdownCut
        }
    }
}

/// Completes at `deadline` (`Cut::Deadline`), or once the client has gone (closed or reset its
/// connection) or shutdown cuts the requests still running (`Cut::Stop`), checked every
/// `CLIENT_GONE_POLL_INTERVAL` without reading: bytes of a pipelined request stay unread. One
/// timer serves both; every kind of upstream races its waits against it.
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

/// Closes every idle connection to `worker`: after one reused connection turned out dead (an
/// engine restart), its siblings most likely are too.
pub fn drop_idle_connections(core: &DataCore, worker: WorkerId) {
    core.pool.borrow_mut().clear_worker(worker);
}

/// One attempt's exchange with its worker, by the protocol the worker speaks. The HTTP/1.1
/// variant stays inline (boxing it would allocate on every proxied request); the gRPC one,
/// larger and off the HTTP path, is boxed.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Exchange {
    /// HTTP/1.1 on a pooled keep-alive connection.
    Http1(http1::Http1Exchange),
    /// A gRPC `Generate` call on the core's HTTP/2 connection to the worker.
    Grpc(Box<grpc::GrpcExchange>),
}

impl Exchange {
    /// Step 1, connect or reuse, by the protocol of the worker's URL.
    pub async fn open(core: &DataCore, worker: &WorkerEntry) -> Result<Exchange, ProxyError> {
        match worker.spec.protocol {
            WorkerProtocol::Http => http1::Http1Exchange::connect_or_reuse(core, worker)
                .await
                .map(Exchange::Http1),
            WorkerProtocol::Grpc(_) => grpc::GrpcExchange::open(core, worker)
                .await
                .map(|exchange| Exchange::Grpc(Box::new(exchange))),
        }
    }

    /// Whether the connection served a request before (a failure on it may just be a stale
    /// socket, which the driver retries apart).
    pub fn reused(&self) -> bool {
        match self {
            Exchange::Http1(exchange) => exchange.reused(),
            // A refused call on a shared connection is retried like any other.
            Exchange::Grpc(_) => false,
        }
    }

    /// Step 2: sends the request, complete.
    pub async fn forward(
        &mut self,
        core: &DataCore,
        request: &mut Forwarded<'_>,
        attempt: &Attempt<'_>,
    ) -> Result<(), ProxyError> {
        match self {
            Exchange::Http1(exchange) => exchange.forward(core, request, attempt).await,
            Exchange::Grpc(exchange) => exchange.forward(core, request, attempt).await,
        }
    }

    /// Step 2 with the gateway's own `body` in place of the client's: a prefill/decode pair's
    /// request, rewritten for the engines' handshake (`upstream::pd`).
    pub async fn forward_body(
        &mut self,
        core: &DataCore,
        request: &Forwarded<'_>,
        body: &[u8],
        attempt: &Attempt<'_>,
    ) -> Result<(), ProxyError> {
        match self {
            Exchange::Http1(exchange) => exchange.forward_body(core, request, body, attempt).await,
            Exchange::Grpc(_) => Err(http_only()),
        }
    }

    /// Steps 3 and 4 for an answer read whole, never relayed (a prefill/decode pair's prefill
    /// side): its status and de-chunked body, at most `body_max` bytes.
    pub async fn read_whole(
        &mut self,
        method: Method,
        deadline: Instant,
        body_max: usize,
    ) -> Result<ClientResponse, ProxyError> {
        match self {
            Exchange::Http1(exchange) => exchange.read_whole(method, deadline, body_max).await,
            Exchange::Grpc(_) => Err(http_only()),
        }
    }

    /// Step 3: waits for the worker's answer (until `deadline`, the first byte's) and, when it
    /// is relayed, writes the client's response head into `client.write_buf`.
    pub async fn read_head(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        context: HeadContext<'_>,
        deadline: Instant,
    ) -> Result<HeadRead, ProxyError> {
        match self {
            Exchange::Http1(exchange) => exchange.read_head(core, client, context, deadline).await,
            Exchange::Grpc(exchange) => exchange.read_head(core, client, context, deadline).await,
        }
    }

    /// Step 4, one read of the body (until `deadline`): where its bytes for the client lie, or
    /// `None` at the end of a body that ends when the worker closes.
    pub async fn read_body(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        deadline: Instant,
    ) -> Result<Option<BodySource>, BodyStop> {
        match self {
            Exchange::Http1(exchange) => exchange.read_body(core, client, deadline).await,
            Exchange::Grpc(exchange) => exchange.read_body(core, client, deadline).await,
        }
    }

    /// Whether the whole body has been read.
    pub fn body_done(&self) -> bool {
        match self {
            Exchange::Http1(exchange) => exchange.body_done(),
            Exchange::Grpc(exchange) => exchange.body_done(),
        }
    }

    /// The bytes of a read whose source is [`BodySource::Exchange`].
    pub fn relay_buf(&mut self) -> &mut Vec<u8> {
        match self {
            Exchange::Http1(exchange) => exchange.relay_buf(),
            Exchange::Grpc(exchange) => exchange.relay_buf(),
        }
    }

    /// Whether what the client received so far ends between two chunks of a chunked body, so
    /// the gateway may end it with a chunk of its own (the SSE error event).
    pub fn client_at_chunk_boundary(&self) -> bool {
        match self {
            Exchange::Http1(exchange) => exchange.client_at_chunk_boundary(),
            Exchange::Grpc(exchange) => exchange.client_at_chunk_boundary(),
        }
    }

    /// Step 5, after a body relayed whole: the connection goes back to the core's pool when it
    /// can serve another request; otherwise it closes.
    pub fn give_back(self, core: &DataCore, worker: WorkerId) {
        match self {
            Exchange::Http1(exchange) => exchange.give_back(core, worker),
            Exchange::Grpc(exchange) => exchange.give_back(core, worker),
        }
    }
}

/// A prefill/decode pair's step asked of a gRPC worker: pairs speak HTTP/1.1 only, and the
/// configuration refuses `grpc://` prefill and decode workers, so this is never reached.
fn http_only() -> ProxyError {
    ProxyError::upstream(ErrorKind::UpstreamMalformed, "prefill/decode over gRPC")
}
