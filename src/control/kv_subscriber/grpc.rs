//! Following a gRPC worker's KV events: its `SubscribeKvEvents` stream (`smg.grpc.common`'s
//! `KvEventBatch`es), one task per worker on the control core's monoio runtime (the gRPC
//! transport's; no data core is involved). Owns [`follow`] and [`GrpcSubscription`].
//!
//! The task hands the control core the same [`Feed`] items as a ZeroMQ subscriber, in order,
//! through its own bounded queue, and keeps the worker's place with the same [`Sequence`]:
//! - First connection: `start_sequence_number` 0 (the engine's current state onwards).
//! - The stream breaks (the worker ends it, its connection fails, a PING goes unanswered): a
//!   new stream after a backoff (`KV_EVENTS_BACKOFF_*`) asks to resume at the next number
//!   expected, which the engine replays from its buffer. A first batch past it is a gap the
//!   engine no longer buffers ([`FeedItem::Gap`]: the worker's entries are rebuilt); one before
//!   it means the engine started over and numbers from 0 again ([`FeedItem::Restarted`]).
//! - Duplicates and implausible jumps as for ZeroMQ; a message that is not a `KvEventBatch`
//!   is skipped ([`FeedItem::Malformed`]). A `load_only` batch (a load record repeating the
//!   last number, no events) is passed over; a relay's snapshot chunk (its first clears the
//!   worker, the chunks numbered up to the live stream) sets the place in the stream.
//! - A worker that does not serve the method (`UNIMPLEMENTED`) publishes nothing: reported
//!   once ([`FeedItem::Unsupported`]) and not asked again.
//!
//! One stream numbers every data-parallel rank's batches (one `start_sequence_number` resumes
//! them all); `dp_rank` says which rank cached the blocks, and a worker's ranks share its
//! entries in the index, since the gateway routes to the worker. Dropping the
//! [`GrpcSubscription`] ends the task and its connection.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use futures::channel::oneshot;
use prost::Message;

use super::{BatchPayload, Feed, FeedItem, Out};
use crate::engine_proto::common_pb::{KvEventBatch, SubscribeKvEventsRequest};
use crate::grpc::backend::{self, Method, ServicePaths};
use crate::grpc::status::Code;
use crate::grpc::{framing, Backend, Call, CallError, Connection};
use crate::ids::WorkerId;
use crate::kv_events::{Arrival, Failure, Sequence};
use crate::limits::{KV_EVENTS_BACKOFF_MAX, KV_EVENTS_BACKOFF_MIN, KV_EVENTS_CONNECT_TIMEOUT};

/// Where a gRPC worker is and how to call it.
#[derive(Clone, Debug)]
pub struct GrpcTarget {
    /// Its address.
    pub addr: SocketAddr,
    /// `host:port` of its URL (the `:authority`).
    pub authority: String,
    /// `--backend`'s protocol, or `None` to detect it.
    pub backend: Option<Backend>,
    /// The workers' API key (`--api-key`), sent as a bearer token.
    pub bearer: Option<Arc<str>>,
}

/// A followed gRPC worker: dropping it stops its task.
#[derive(Debug)]
pub struct GrpcSubscription {
    _stop: oneshot::Sender<()>,
}

/// Follows `target`'s events as `worker`'s subscription `subscription`, handing them to
/// `feed`, on this thread's monoio runtime.
pub fn follow(
    target: GrpcTarget,
    worker: WorkerId,
    subscription: u64,
    feed: Arc<ArrayQueue<Feed>>,
) -> GrpcSubscription {
    let (stop, stopped) = oneshot::channel();
    let out = Out {
        worker,
        subscription,
        feed,
    };
    monoio::spawn(async move {
        let following = std::pin::pin!(follow_worker(target, out));
        let _ = futures::future::select(stopped, following).await;
    });
    GrpcSubscription { _stop: stop }
}

/// How one stream ended.
enum Ended {
    /// It failed (or was never opened): try again after a backoff.
    Failed {
        failure: Failure,
        /// Whether it delivered a batch (a healthy stream: the next waits the shortest).
        received: bool,
    },
    /// The worker does not serve `SubscribeKvEvents`.
    Unsupported,
}

/// Follows one worker until stopped: a stream at a time, a backoff between them.
async fn follow_worker(target: GrpcTarget, out: Out) {
    let mut stream = Stream {
        out,
        sequence: Sequence::default(),
    };
    let mut backoff = KV_EVENTS_BACKOFF_MIN;
    loop {
        match stream.session(&target).await {
            Ended::Unsupported => {
                stream.out.send_on_monoio(FeedItem::Unsupported).await;
                return;
            }
            Ended::Failed { failure, received } => {
                stream.out.send_on_monoio(FeedItem::Failed(failure)).await;
                if received {
                    backoff = KV_EVENTS_BACKOFF_MIN;
                }
            }
        }
        monoio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(KV_EVENTS_BACKOFF_MAX);
    }
}

/// A worker's place in its stream of batches.
struct Stream {
    out: Out,
    sequence: Sequence,
}

impl Stream {
    /// One `SubscribeKvEvents` stream, from the next batch expected, until it ends.
    async fn session(&mut self, target: &GrpcTarget) -> Ended {
        let failed = |failure| Ended::Failed {
            failure,
            received: false,
        };
        let opened = within(KV_EVENTS_CONNECT_TIMEOUT, async {
            let connection = Connection::open(target.addr, target.bearer.clone())
                .await
                .map_err(|e| CallError::Refused(e.to_string()))?;
            let backend = match target.backend {
                Some(backend) => backend,
                None => backend::detect(&connection, &target.authority).await?,
            };
            let request = SubscribeKvEventsRequest {
                start_sequence_number: self.sequence.next().unwrap_or(0),
                load_records_before_first_batch: false,
            };
            let path = backend.path(Method::SubscribeKvEvents);
            let message = framing::encode(&request);
            Call::start(&connection, &target.authority, path, message).await
        });
        let mut call = match opened.await {
            Ok(call) => call,
            Err(CallError::Status(status)) if status.code == Code::Unimplemented => {
                return Ended::Unsupported
            }
            Err(_) => return failed(Failure::Connect),
        };
        // The headers come with the first batch from some servers: connected once they do.
        match call.headers().await {
            Ok(()) => {}
            Err(CallError::Status(status)) if status.code == Code::Unimplemented => {
                return Ended::Unsupported
            }
            Err(e) => {
                tracing::debug!(worker = target.authority, "SubscribeKvEvents: {e}");
                return failed(Failure::Connect);
            }
        }
        self.out.send_on_monoio(FeedItem::Connected).await;
        let mut resumed = self.sequence.next().is_some();
        let mut received = false;
        loop {
            let failure = match call.message().await {
                Ok(Some(message)) => {
                    match KvEventBatch::decode(message) {
                        Ok(batch) => self.receive(batch, resumed).await,
                        Err(_) => self.out.send_on_monoio(FeedItem::Malformed).await,
                    }
                    (resumed, received) = (false, true);
                    continue;
                }
                // The worker ended the stream (OK, or a status such as UNAVAILABLE).
                Ok(None) | Err(CallError::Status(_)) => Failure::Disconnected,
                Err(CallError::Malformed(why)) => {
                    tracing::warn!(worker = target.authority, "SubscribeKvEvents: {why}");
                    Failure::Receive
                }
                Err(_) => Failure::Receive,
            };
            return Ended::Failed { failure, received };
        }
    }

    /// Batch `batch`, handed on in order. `resumed`: the first of a stream that asked to resume
    /// at the next number expected.
    async fn receive(&mut self, batch: KvEventBatch, resumed: bool) {
        let seq = batch.sequence_number;
        // A load record alone repeats the last number and carries no events.
        if batch.load.as_ref().is_some_and(|load| load.load_only) {
            return;
        }
        // A relay's snapshot (its chunks numbered up to the state's batch, the first clearing
        // the worker) sets the place in the stream: applied in order, it is the resync.
        if batch.snapshot.is_some() {
            self.sequence.expect(seq);
        }
        // The engine resumes at the number asked for or later: a number going back (or to 0,
        // or further back than any duplicate) is an engine that started over.
        let behind = self.sequence.next().is_some_and(|next| seq < next);
        if behind && (resumed || seq == 0 || self.sequence.far_behind(seq)) {
            self.out.send_on_monoio(FeedItem::Restarted).await;
            self.sequence.restart();
        }
        match self.sequence.arrival(seq) {
            Arrival::Next => {}
            Arrival::Seen => {
                self.out.send_on_monoio(FeedItem::Duplicate).await;
                return;
            }
            Arrival::Gap { missing } => self.out.send_on_monoio(FeedItem::Gap { missing }).await,
            Arrival::Implausible => {
                self.sequence.pass_over(seq);
                self.out.send_on_monoio(FeedItem::Implausible { seq }).await;
                return;
            }
        }
        self.out
            .send_on_monoio(FeedItem::Batch {
                seq,
                payload: BatchPayload::Grpc(Box::new(batch)),
                replayed: false,
            })
            .await;
        self.sequence.advance(seq);
    }
}

/// `work`, given up after `timeout` (a refused call).
async fn within<T>(
    timeout: Duration,
    work: impl Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    monoio::time::timeout(timeout, work)
        .await
        .unwrap_or_else(|_| Err(CallError::Refused("timed out".into())))
}
