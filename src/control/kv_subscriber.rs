//! The KV-event subscribers: one thread (`kvgate-kv-events`, started by the control core the
//! first time a worker publishes) running a tokio current-thread runtime, because the ZeroMQ
//! implementation (`zeromq`, pure Rust) needs tokio; one task per followed worker.
//!
//! A task owns its worker's `SUB` socket, keeps the worker's place in its numbered batches
//! ([`Sequence`]) and hands the control core only batches in order, on a bounded queue
//! ([`Subscribers::pop`]); the control core decodes and applies them. A task never touches the
//! index, and the data cores never see any of this.
//!
//! - First connection: with a replay socket, every batch the engine still buffers is replayed
//!   first (the blocks it cached before the gateway subscribed).
//! - A gap: filled from the replay socket; what it cannot fill is reported ([`FeedItem::Gap`]),
//!   and the control core drops the worker's entries and rebuilds them from the next events.
//! - A duplicate or stale number: reported and skipped.
//! - A publisher that restarted: after every reconnection the replay socket must still buffer
//!   the batch last handed on, under its number and with the same payload (a restarted engine
//!   numbers from 0 again and buffers other batches); without a replay socket, numbers going
//!   back are the sign, and a reconnection that cannot be checked starts the worker over
//!   ([`FeedItem::Unverified`]). Reported ([`FeedItem::Restarted`]: the engine's cache is gone)
//!   and followed from its first batch.
//! - Failures: the socket reconnects by itself after a disconnection; a failed connect or
//!   receive opens a new socket after a backoff (`KV_EVENTS_BACKOFF_*`). Each is reported.
//!
//! A full queue makes the task wait (the engine's publisher buffers, then drops, and the gap is
//! replayed), so nothing is lost silently and memory stays bounded.

pub mod grpc;
mod guard;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use futures::StreamExt;
use tokio::sync::mpsc;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::ids::WorkerId;
use crate::kv_events::{message_parts, Arrival, Failure, Sequence, REPLAY_END_SEQ};
use crate::limits::{
    KV_EVENTS_BACKOFF_MAX, KV_EVENTS_BACKOFF_MIN, KV_EVENTS_CONNECT_TIMEOUT,
    KV_EVENTS_FEED_CAPACITY, KV_EVENTS_MESSAGE_BYTES_MAX, KV_EVENTS_REPLAY_TIMEOUT,
};
use crate::workers::spec::KvEventsEndpoint;
use xxhash_rust::xxh3::xxh3_64;

use guard::Guard;

/// What a subscriber tells the control core.
#[derive(Debug)]
pub struct Feed {
    /// The worker followed.
    pub worker: WorkerId,
    /// The subscription (a worker removed and added again gets a new one; stale items are
    /// ignored).
    pub subscription: u64,
    /// What happened.
    pub item: FeedItem,
}

/// One thing a subscriber reports.
#[derive(Debug)]
pub enum FeedItem {
    /// The next batch in order: apply it.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// Its events as the publisher sent them.
        payload: BatchPayload,
        /// Whether it came from the replay socket.
        replayed: bool,
    },
    /// The subscription is connected (again).
    Connected,
    /// The subscription failed.
    Failed(Failure),
    /// The publisher started over: the engine lost its cache.
    Restarted,
    /// Batches `missing` are lost for good: the worker's entries must be rebuilt.
    Gap {
        /// The numbers never received.
        missing: Range<u64>,
    },
    /// Reconnected without a replay socket: whether the publisher restarted cannot be told,
    /// the worker's entries must be rebuilt.
    Unverified,
    /// A batch numbered implausibly far ahead (`KV_EVENTS_SEQUENCE_JUMP_MAX`): not applied,
    /// the batches after it still expected; the worker's entries must be rebuilt.
    Implausible {
        /// Its number.
        seq: u64,
    },
    /// A batch seen already: skipped.
    Duplicate,
    /// A message that is not `[topic, seq, payload]` (or, from a gRPC worker, not a
    /// `KvEventBatch`): skipped.
    Malformed,
    /// The gRPC worker does not serve `SubscribeKvEvents`: there is nothing to follow.
    Unsupported,
}

/// A batch's events as its publisher sent them.
#[derive(Debug)]
pub enum BatchPayload {
    /// A ZeroMQ publisher's msgpack payload (`kv_events::wire`).
    Msgpack(Bytes),
    /// A gRPC worker's `KvEventBatch`, decoded by its follower (`grpc`).
    Grpc(Box<crate::engine_proto::common_pb::KvEventBatch>),
}

enum Command {
    Follow {
        worker: WorkerId,
        subscription: u64,
        endpoint: KvEventsEndpoint,
    },
    Stop {
        subscription: u64,
    },
}

/// The subscriber thread's handle, owned by the control core.
#[derive(Debug)]
pub struct Subscribers {
    commands: mpsc::UnboundedSender<Command>,
    feed: Arc<ArrayQueue<Feed>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Follow { subscription, .. } => write!(f, "Follow({subscription})"),
            Command::Stop { subscription } => write!(f, "Stop({subscription})"),
        }
    }
}

impl Subscribers {
    /// Starts the subscriber thread.
    pub fn start() -> std::io::Result<Subscribers> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (commands, mut received) = mpsc::unbounded_channel::<Command>();
        let feed = Arc::new(ArrayQueue::new(KV_EVENTS_FEED_CAPACITY));
        let tasks_feed = feed.clone();
        let thread = std::thread::Builder::new()
            .name("kvgate-kv-events".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut tasks = HashMap::new();
                    // Ends when the control core drops its handle.
                    while let Some(command) = received.recv().await {
                        match command {
                            Command::Follow {
                                worker,
                                subscription,
                                endpoint,
                            } => {
                                let out = Out {
                                    worker,
                                    subscription,
                                    feed: tasks_feed.clone(),
                                };
                                let task = tokio::spawn(follow_supervised(endpoint, out));
                                tasks.insert(subscription, task);
                            }
                            Command::Stop { subscription } => {
                                if let Some(task) = tasks.remove(&subscription) {
                                    task.abort();
                                }
                            }
                        }
                    }
                    for task in tasks.into_values() {
                        task.abort();
                    }
                });
            })?;
        Ok(Subscribers {
            commands,
            feed,
            thread: Some(thread),
        })
    }

    /// Follows `worker`'s events at `endpoint` as subscription `subscription`.
    pub fn follow(&self, worker: WorkerId, subscription: u64, endpoint: KvEventsEndpoint) {
        // The thread ends only when this handle is dropped: the send cannot fail before.
        let _ = self.commands.send(Command::Follow {
            worker,
            subscription,
            endpoint,
        });
    }

    /// Stops subscription `subscription` (its queued items are ignored by the caller).
    pub fn stop(&self, subscription: u64) {
        let _ = self.commands.send(Command::Stop { subscription });
    }

    /// The next item reported, if any (never waits).
    pub fn pop(&self) -> Option<Feed> {
        self.feed.pop()
    }
}

impl Drop for Subscribers {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop, which aborts every task.
        let (closed, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, closed));
        // A task waiting on a full queue sees its abort at its next sleep: the queue empties.
        while self.feed.pop().is_some() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A subscriber task's way to the control core: the ZMQ subscribers' tokio tasks and the gRPC
/// subscribers' monoio tasks (`grpc`) alike.
#[derive(Clone)]
struct Out {
    worker: WorkerId,
    subscription: u64,
    feed: Arc<ArrayQueue<Feed>>,
}

impl Out {
    /// Queues `item` from a tokio task, waiting while the queue is full (the control core drains
    /// it every turn).
    async fn send(&self, item: FeedItem) {
        self.send_waiting(item, || tokio::time::sleep(Duration::from_millis(1)))
            .await;
    }

    /// Queues `item` from a monoio task (on the control core's own thread), waiting while the
    /// queue is full.
    async fn send_on_monoio(&self, item: FeedItem) {
        self.send_waiting(item, || monoio::time::sleep(Duration::from_millis(1)))
            .await;
    }

    /// Queues `item`, waiting with `sleep` (the calling task's runtime's) while the queue is full.
    async fn send_waiting<S: Future<Output = ()>>(&self, item: FeedItem, sleep: impl Fn() -> S) {
        let mut feed = Feed {
            worker: self.worker,
            subscription: self.subscription,
            item,
        };
        loop {
            match self.feed.push(feed) {
                Ok(()) => return,
                Err(back) => {
                    feed = back;
                    sleep().await;
                }
            }
        }
    }
}

/// Follows one worker until aborted, through [`supervise`].
async fn follow_supervised(endpoint: KvEventsEndpoint, out: Out) {
    supervise(out, move |out| follow(endpoint.clone(), out)).await
}

/// Runs the task `start` makes until aborted: a task that ends (one that follows a worker
/// never returns, so it panicked) is reported and started again after a backoff. Its place in
/// the stream went with it, so the worker's entries are rebuilt from the next events.
async fn supervise<F, T>(out: Out, mut start: F)
where
    F: FnMut(Out) -> T,
    T: Future<Output = ()> + Send + 'static,
{
    let mut backoff = KV_EVENTS_BACKOFF_MIN;
    loop {
        let began = Instant::now();
        let task = AbortOnDrop(tokio::spawn(start(out.clone())));
        let ended = task.finished().await;
        let failure = match ended {
            Err(e) if e.is_panic() => Failure::Panicked,
            // Cancelled only from outside, or returned: the same to the control core.
            _ => Failure::Receive,
        };
        tracing::error!(
            worker = out.worker.0,
            reason = failure.label(),
            "KV events: the subscription's task ended; starting it again"
        );
        out.send(FeedItem::Failed(failure)).await;
        out.send(FeedItem::Unverified).await;
        // A task that ran a while was healthy: the next one starts from the shortest wait.
        if began.elapsed() > KV_EVENTS_BACKOFF_MAX {
            backoff = KV_EVENTS_BACKOFF_MIN;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(KV_EVENTS_BACKOFF_MAX);
    }
}

/// A spawned task aborted when its handle is dropped (a supervisor aborted aborts its task).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl AbortOnDrop {
    async fn finished(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Follows one worker: a session per connection, a backoff between them.
async fn follow(endpoint: KvEventsEndpoint, out: Out) {
    let mut follower = Follower {
        endpoint,
        out,
        sequence: Sequence::default(),
        last: None,
    };
    let mut backoff = KV_EVENTS_BACKOFF_MIN;
    loop {
        let session = follower.session().await;
        if let Some(failure) = session.failure {
            follower.out.send(FeedItem::Failed(failure)).await;
        }
        // A session that read a message was healthy: the next one starts from the shortest
        // wait. One cut at its first message (too large) or never connected backs off.
        if session.received {
            backoff = KV_EVENTS_BACKOFF_MIN;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(KV_EVENTS_BACKOFF_MAX);
    }
}

/// How one connection to a publisher ended.
#[derive(Debug, Default)]
struct Session {
    /// Why, when it failed.
    failure: Option<Failure>,
    /// Whether it read a message.
    received: bool,
}

/// What a replay found.
#[derive(Debug, PartialEq, Eq)]
enum Replayed {
    /// Every batch buffered from the start asked for was handed on.
    Done,
    /// The batch the stream applied last is not the one the publisher buffers under its number:
    /// another publisher (a restarted engine) answers.
    Diverged,
    /// No answer (or not in time).
    Failed,
}

/// One worker's stream as its task follows it: the endpoint, the way to the control core and
/// the place in the worker's numbered batches.
struct Follower {
    endpoint: KvEventsEndpoint,
    out: Out,
    sequence: Sequence,
    /// The number and payload digest of the last batch handed on.
    last: Option<(u64, u64)>,
}

impl Follower {
    /// One connection to the publisher, through a [`Guard`], until it fails or the socket goes.
    async fn session(&mut self) -> Session {
        let mut ended = Session::default();
        let guarded = Guard::start(&self.endpoint.publisher, KV_EVENTS_MESSAGE_BYTES_MAX).await;
        let Ok(mut guard) = guarded else {
            ended.failure = Some(Failure::Connect);
            return ended;
        };
        let mut options = SocketOptions::default();
        options.connect_timeout(KV_EVENTS_CONNECT_TIMEOUT);
        let mut socket = SubSocket::with_options(options);
        let mut monitor = socket.monitor();
        let subscribed = async {
            socket.connect(&guard.endpoint).await?;
            socket.subscribe("").await
        };
        if subscribed.await.is_err() {
            ended.failure = Some(Failure::Connect);
            return ended;
        }
        self.out.send(FeedItem::Connected).await;
        // A new socket: the publisher may have restarted since the last one.
        self.resync().await;
        // Without a replay socket to resync with, the next live batch is the first since a
        // (re)connection and shows a restart by its number; and a reconnection not resynced yet.
        let resyncs = self.endpoint.replay.is_some();
        let (mut reconnected, mut disconnected) = (!resyncs, false);
        loop {
            tokio::select! {
                received = socket.recv() => {
                    let Ok(message) = received else {
                        ended.failure = Some(Failure::Receive);
                        return ended;
                    };
                    ended.received = true;
                    self.receive(&message, reconnected).await;
                    reconnected = false;
                }
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) => {
                        self.out.send(FeedItem::Failed(Failure::Disconnected)).await;
                        (reconnected, disconnected) = (!resyncs, true);
                    }
                    // The socket reconnected by itself.
                    Some(SocketEvent::Connected(..)) if disconnected => {
                        disconnected = false;
                        self.out.send(FeedItem::Connected).await;
                        self.resync().await;
                    }
                    Some(_) => {}
                    // The socket is gone: open a new one.
                    None => return ended,
                },
                too_large = guard.tripped() => {
                    tracing::warn!(
                        worker = self.out.worker.0,
                        publisher = self.endpoint.publisher,
                        announced = too_large.announced,
                        "KV events: a message announced past KV_EVENTS_MESSAGE_BYTES_MAX; \
                         connection cut"
                    );
                    ended.failure = Some(Failure::TooLarge);
                    return ended;
                }
            }
        }
    }

    /// A live message: `[topic, seq, payload]`, handed on in order. `reconnected`: the first
    /// since a (re)connection that no replay socket checked.
    async fn receive(&mut self, message: &ZmqMessage, reconnected: bool) {
        let frames: Vec<&[u8]> = message.iter().map(|f| &f[..]).collect();
        let Ok((seq, _)) = message_parts(&frames) else {
            self.out.send(FeedItem::Malformed).await;
            return;
        };
        let payload = message.get(2).cloned().unwrap_or_default();
        // A live stream never goes back: numbers going back after a reconnection (or to 0, or
        // further than any duplicate) mean a restarted publisher. Without a replay socket a
        // reconnection cannot be checked otherwise: the next number expected may be a
        // restarted publisher's too, so the worker starts over.
        let next = self.sequence.next();
        let behind = next.is_some_and(|next| seq < next);
        if behind && (reconnected || seq == 0 || self.sequence.far_behind(seq)) {
            self.restarted().await;
        } else if reconnected && next == Some(seq) {
            self.out.send(FeedItem::Unverified).await;
            self.sequence.restart();
        }
        self.deliver(seq, payload).await;
    }

    /// Hands on batch `seq`, the next in order.
    async fn hand_on(&mut self, seq: u64, payload: Bytes, replayed: bool) {
        self.last = Some((seq, xxh3_64(&payload)));
        self.out
            .send(FeedItem::Batch {
                seq,
                payload: BatchPayload::Msgpack(payload),
                replayed,
            })
            .await;
        self.sequence.advance(seq);
    }

    /// The publisher started over: the worker's entries go, the stream starts from its first
    /// batch.
    async fn restarted(&mut self) {
        self.out.send(FeedItem::Restarted).await;
        self.sequence.restart();
        self.last = None;
        self.catch_up().await;
    }

    /// After a (re)connection, with a replay socket: checks that the publisher still buffers
    /// the batch last handed on under its number (a restarted one does not) and hands on what
    /// was missed; or, before any batch, everything it buffers.
    async fn resync(&mut self) {
        let Some(replay) = self.endpoint.replay.clone() else {
            return;
        };
        let Some(last) = self.last else {
            self.catch_up().await;
            return;
        };
        if self.replay_from(&replay, last.0, Some(last)).await == Replayed::Diverged {
            self.restarted().await;
        }
    }

    /// With a replay socket, hands on every batch the publisher still buffers from its first,
    /// and expects batch 0 next when it buffers none (so a later first batch is a gap to fill).
    async fn catch_up(&mut self) {
        let Some(replay) = self.endpoint.replay.clone() else {
            return;
        };
        self.replay_from(&replay, 0, None).await;
        if self.sequence.next().is_none() {
            self.sequence.expect(0);
        }
    }

    /// Hands on live batch `seq` in order: a gap is filled from the replay socket first.
    async fn deliver(&mut self, seq: u64, payload: Bytes) {
        if let Arrival::Gap { missing } = self.sequence.arrival(seq) {
            if let Some(replay) = self.endpoint.replay.clone() {
                self.replay_from(&replay, missing.start, None).await;
            }
        }
        match self.sequence.arrival(seq) {
            Arrival::Next => {}
            Arrival::Seen => {
                self.out.send(FeedItem::Duplicate).await;
                return;
            }
            Arrival::Gap { missing } => self.out.send(FeedItem::Gap { missing }).await,
            // Not applied, and not a baseline: the batches after it still follow.
            Arrival::Implausible => {
                self.sequence.pass_over(seq);
                self.out.send(FeedItem::Implausible { seq }).await;
                return;
            }
        }
        self.hand_on(seq, payload, false).await;
    }

    /// Asks the replay socket for every batch from `start` and hands on those in order. With
    /// `expect`, the first batch must be that one (number and payload digest).
    async fn replay_from(
        &mut self,
        endpoint: &str,
        start: u64,
        mut expect: Option<(u64, u64)>,
    ) -> Replayed {
        let replayed = tokio::time::timeout(KV_EVENTS_REPLAY_TIMEOUT, async {
            let guarded = Guard::start(endpoint, KV_EVENTS_MESSAGE_BYTES_MAX).await;
            let mut guard = guarded.map_err(|_| Failure::Replay)?;
            let mut options = SocketOptions::default();
            options.connect_timeout(KV_EVENTS_CONNECT_TIMEOUT);
            let mut dealer = DealerSocket::with_options(options);
            let replay_failed = |_: zeromq::ZmqError| Failure::Replay;
            dealer
                .connect(&guard.endpoint)
                .await
                .map_err(replay_failed)?;
            // The ROUTER sees [identity, "", start]: the DEALER sends the delimiter itself.
            let mut request = ZmqMessage::from(Bytes::new());
            request.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
            dealer.send(request).await.map_err(replay_failed)?;
            loop {
                let reply = tokio::select! {
                    reply = dealer.recv() => reply.map_err(replay_failed)?,
                    _ = guard.tripped() => return Err(Failure::TooLarge),
                };
                // [delimiter, seq, payload]; seq -1 ends the replay.
                let frames: Vec<&[u8]> = reply.iter().map(|f| &f[..]).collect();
                let Ok((seq, _)) = message_parts(&frames) else {
                    self.out.send(FeedItem::Malformed).await;
                    continue;
                };
                let end = seq as i64 == REPLAY_END_SEQ;
                let payload = reply.get(2).cloned().unwrap_or_default();
                if let Some(expected) = expect.take() {
                    if end || (seq, xxh3_64(&payload)) != expected {
                        return Ok(Replayed::Diverged);
                    }
                    continue;
                }
                if end {
                    return Ok(Replayed::Done);
                }
                match self.sequence.arrival(seq) {
                    Arrival::Seen | Arrival::Implausible => continue,
                    Arrival::Next => {}
                    Arrival::Gap { missing } => self.out.send(FeedItem::Gap { missing }).await,
                }
                self.hand_on(seq, payload, true).await;
            }
        })
        .await;
        let failure = match replayed {
            Ok(Ok(outcome)) => return outcome,
            Ok(Err(failure)) => failure,
            Err(_) => Failure::Replay,
        };
        self.out.send(FeedItem::Failed(failure)).await;
        Replayed::Failed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_task_that_panics_is_reported_and_started_again() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let feed = Arc::new(ArrayQueue::new(16));
        let out = Out {
            worker: WorkerId(3),
            subscription: 7,
            feed: feed.clone(),
        };
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let items = runtime.block_on(async move {
            let supervisor = AbortOnDrop(tokio::spawn(supervise(out, move |out| {
                let first = counted.fetch_add(1, Ordering::Relaxed) == 0;
                async move {
                    assert!(!first, "the first run fails");
                    out.send(FeedItem::Connected).await;
                    std::future::pending::<()>().await;
                }
            })));
            let mut items = Vec::new();
            for _ in 0..1000 {
                while let Some(feed) = feed.pop() {
                    assert_eq!((feed.worker, feed.subscription), (WorkerId(3), 7));
                    items.push(feed.item);
                }
                if items.len() >= 3 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(supervisor);
            items
        });
        assert!(
            matches!(
                items[..],
                [
                    FeedItem::Failed(Failure::Panicked),
                    FeedItem::Unverified,
                    FeedItem::Connected
                ]
            ),
            "{items:?}"
        );
        assert_eq!(starts.load(Ordering::Relaxed), 2);
    }
}
