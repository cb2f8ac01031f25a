//! The ZMQ side of one engine's KV events, as vLLM's and SGLang's `ZmqEventPublisher` run it:
//! [`EventSink`] numbers each batch, keeps the last `--kv-events-replay-buffer` of them and hands
//! them to a publisher task that sends them on a PUB socket; a replay task answers a ROUTER
//! socket's requests from the kept batches. [`bind_engine`] binds both sockets and starts both
//! tasks.
//!
//! On the wire (both formats): a published message is `[topic, seq, payload]`, topic empty, seq
//! 8 bytes big-endian from 0, payload one msgpack batch (`sim::kv_events`). A replay request is
//! `[identity, "", start_seq]` (a DEALER sending `["", start_seq]`); the answer is
//! `[identity, "", seq, payload]` for every kept batch from `start_seq` on, then
//! `[identity, "", -1 as 8 bytes, ""]`.
//!
//! The engine never waits on a subscriber: batches reach the publisher task over a bounded queue
//! ([`LIVE_QUEUE_BATCHES`]), and a batch that finds it full is still numbered and kept for replay
//! but not sent live (counted in `live_dropped_total`), so a subscriber sees a gap in seq and
//! replays. (A PUB socket of this crate waits on a subscriber whose TCP buffer is full, where
//! libzmq would drop at its high-water mark; [`SEND_TIMEOUT_MS`] and the queue bound that wait.)
//! The replay buffer keeps at most `--kv-events-replay-buffer` batches and
//! [`REPLAY_BUFFER_BYTES_MAX`] bytes.
//!
//! With `--grpc`, each batch is also kept as a framed `KvEventBatch` (`smg.grpc.common`), which
//! the gRPC service streams to `SubscribeKvEvents` callers ([`EventSink::grpc_from`],
//! [`EventSink::published`]; `sim::grpc`).
//!
//! [`EventSink::restart`] models a crashed engine: both sockets close (subscribers see their
//! connection drop), stay down [`RESTART_DOWN_MS`], and bind again; seq restarts at 0 and the
//! replay buffer starts empty. Socket errors are logged (`tracing`), never returned to the engine.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::cache::CacheEvent;
use super::kv_events::{encode_batch, BatchHeader, KvEventsFormat};

/// Batches queued for the PUB socket: two seconds of one batch per 2 ms step, enough for a
/// subscriber's hiccup; beyond it live sends are dropped (replay still has them).
pub const LIVE_QUEUE_BATCHES: usize = 1024;

/// Most bytes of batches an engine keeps for replay, whatever `--kv-events-replay-buffer` says:
/// a batch of an 8k-token prompt is about 40 KiB, so this still keeps over 1,500 of them, while a
/// fleet of 32 engines keeps at most 2 GiB.
pub const REPLAY_BUFFER_BYTES_MAX: usize = 64 << 20;

/// Longest wait to hand one message to the subscribers (or one replay reply to its requester):
/// a subscriber that stops reading would otherwise stall the socket's task (libzmq drops at its
/// high-water mark instead). Past it the message is dropped for whoever had not taken it yet,
/// and they see a gap in seq.
pub const SEND_TIMEOUT_MS: u64 = 1000;

/// How long a restarted engine's sockets stay closed: long enough for every subscriber to see
/// the connection drop, short enough for a test.
pub const RESTART_DOWN_MS: u64 = 200;

/// The seq of the replay's end marker.
pub const REPLAY_END_SEQ: i64 = -1;

/// Where one engine publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEndpoints {
    /// The PUB socket's address.
    pub publish: SocketAddr,
    /// The replay ROUTER socket's address.
    pub replay: SocketAddr,
}

impl KvEndpoints {
    /// SGLang's `kv_events_config` (a JSON object, which `/server_info` sends as a string), with
    /// the wildcard host `*`, as an engine configured to bind all interfaces reports it: a
    /// subscriber substitutes the host it reached the engine at.
    pub fn config_json(&self, buffer_steps: usize) -> Value {
        json!({
            "publisher": "zmq",
            "endpoint": format!("tcp://*:{}", self.publish.port()),
            "replay_endpoint": format!("tcp://*:{}", self.replay.port()),
            "buffer_steps": buffer_steps,
            "topic": "",
        })
    }
}

/// One batch on its way to the PUB socket.
#[derive(Debug)]
struct LiveBatch {
    /// Restarts before it: a batch from before the latest restart is never sent.
    epoch: u64,
    seq: u64,
    payload: Bytes,
}

#[derive(Debug)]
struct SinkState {
    /// Restarts so far.
    epoch: u64,
    next_seq: u64,
    /// The last batches, oldest first: `(seq, payload, the framed KvEventBatch with --grpc)`.
    kept: VecDeque<(u64, Bytes, Option<Bytes>)>,
    /// Payload bytes in `kept`.
    kept_bytes: usize,
}

/// Numbers, keeps and forwards one engine's event batches.
#[derive(Debug)]
pub struct EventSink {
    format: KvEventsFormat,
    block_size: usize,
    kept_batches_max: usize,
    state: Mutex<SinkState>,
    live: mpsc::Sender<LiveBatch>,
    /// The epoch, watched by the socket tasks (a change: close, wait, bind again).
    epochs: watch::Sender<u64>,
    /// Whether batches are kept as gRPC messages too.
    grpc: bool,
    /// `(epoch, next seq)`, changed by every batch and restart (the gRPC streams watch it).
    published: watch::Sender<(u64, u64)>,
    batches_total: AtomicU64,
    live_dropped_total: AtomicU64,
}

/// The next place in an engine's sequence of batches, held while the batch is encoded.
///
/// Take it ([`EventSink::reserve`]) before releasing the engine's lock: batches are then
/// numbered in the order the engine produced them, while encoding runs outside that lock.
#[derive(Debug)]
pub struct SinkSlot<'a> {
    sink: &'a EventSink,
    state: MutexGuard<'a, SinkState>,
}

impl SinkSlot<'_> {
    /// Numbers `events` as the next batch, keeps it for replay and queues it for the PUB
    /// socket. Nothing is published for no events.
    pub fn publish(mut self, events: &[CacheEvent]) {
        if events.is_empty() {
            return;
        }
        let sink = self.sink;
        let header = BatchHeader {
            ts_s: unix_now_s(),
            block_size: sink.block_size,
        };
        let payload = Bytes::from(encode_batch(sink.format, header, events));
        let state = &mut *self.state;
        let seq = state.next_seq;
        state.next_seq += 1;
        if sink.kept_batches_max > 0 {
            let grpc = sink
                .grpc
                .then(|| super::grpc::kv_event_batch(seq, header.ts_s, sink.block_size, events));
            let size = |payload: &Bytes, grpc: &Option<Bytes>| {
                payload.len() + grpc.as_ref().map_or(0, Bytes::len)
            };
            state.kept_bytes += size(&payload, &grpc);
            state.kept.push_back((seq, payload.clone(), grpc));
            while state.kept.len() > sink.kept_batches_max
                || (state.kept_bytes > REPLAY_BUFFER_BYTES_MAX && state.kept.len() > 1)
            {
                if let Some((_, oldest, grpc)) = state.kept.pop_front() {
                    state.kept_bytes -= size(&oldest, &grpc);
                }
            }
        }
        sink.published.send_replace((state.epoch, state.next_seq));
        sink.batches_total.fetch_add(1, Ordering::Relaxed);
        let batch = LiveBatch {
            epoch: state.epoch,
            seq,
            payload,
        };
        if sink.live.try_send(batch).is_err() {
            sink.live_dropped_total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl EventSink {
    /// The next place in the sequence (see [`SinkSlot`]).
    pub fn reserve(&self) -> SinkSlot<'_> {
        SinkSlot {
            sink: self,
            state: self.lock(),
        }
    }

    /// A crash and restart of the publisher: seq starts again at 0, the replay buffer empties,
    /// queued batches are discarded and both sockets close and bind again after
    /// [`RESTART_DOWN_MS`].
    pub fn restart(&self) {
        let mut state = self.lock();
        state.epoch += 1;
        state.next_seq = 0;
        state.kept.clear();
        state.kept_bytes = 0;
        // Sent under the lock: no batch of the new epoch is queued before the tasks can see it.
        self.epochs.send_replace(state.epoch);
        self.published.send_replace((state.epoch, 0));
    }

    /// Counters for `/sim/stats`.
    pub fn stats_json(&self) -> Value {
        let state = self.lock();
        json!({
            "batches_total": self.batches_total.load(Ordering::Relaxed),
            "live_dropped_total": self.live_dropped_total.load(Ordering::Relaxed),
            "next_seq": state.next_seq,
            "replay_buffered": state.kept.len(),
            "replay_buffered_bytes": state.kept_bytes,
            "restarts_total": state.epoch,
        })
    }

    /// The kept batches from `start_seq` on, oldest first.
    fn kept_from(&self, start_seq: u64) -> Vec<(u64, Bytes)> {
        let state = self.lock();
        state
            .kept
            .iter()
            .filter(|(seq, ..)| *seq >= start_seq)
            .map(|(seq, payload, _)| (*seq, payload.clone()))
            .collect()
    }

    /// The kept batches from `start_seq` on as framed `KvEventBatch`es, oldest first (none
    /// without `--grpc`).
    pub fn grpc_from(&self, start_seq: u64) -> Vec<(u64, Bytes)> {
        let state = self.lock();
        let kept = state.kept.iter().filter(|(seq, ..)| *seq >= start_seq);
        kept.filter_map(|(seq, _, grpc)| Some((*seq, grpc.clone()?)))
            .collect()
    }

    /// Watches `(epoch, next seq)`: it changes with every batch and every restart.
    pub fn published(&self) -> watch::Receiver<(u64, u64)> {
        self.published.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, SinkState> {
        // The state stays consistent between statements: keep publishing after a panic
        // elsewhere rather than poisoning the engine.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What [`bind_engine`] needs to know.
#[derive(Debug, Clone, Copy)]
pub struct SinkConfig {
    pub format: KvEventsFormat,
    /// Tokens per block (`--page-size`).
    pub block_size: usize,
    /// Batches kept for replay (`--kv-events-replay-buffer`).
    pub kept_batches_max: usize,
    /// Keep them as gRPC messages too (`--grpc`).
    pub grpc: bool,
}

/// Binds one engine's PUB and ROUTER sockets and starts their tasks (inside a tokio runtime).
pub async fn bind_engine(
    endpoints: KvEndpoints,
    config: SinkConfig,
) -> Result<Arc<EventSink>, String> {
    let publish = bind_socket::<PubSocket>(endpoints.publish).await?;
    let replay = bind_socket::<RouterSocket>(endpoints.replay).await?;
    let (sink, queued) = EventSink::new(config);
    tokio::spawn(run_publisher(
        sink.epochs.subscribe(),
        publish,
        endpoints.publish,
        queued,
    ));
    tokio::spawn(run_replay(
        Arc::clone(&sink),
        sink.epochs.subscribe(),
        replay,
        endpoints.replay,
    ));
    Ok(sink)
}

impl EventSink {
    /// A sink and the receiving end of its live queue (the publisher task's).
    fn new(config: SinkConfig) -> (Arc<EventSink>, mpsc::Receiver<LiveBatch>) {
        let (live, queued) = mpsc::channel(LIVE_QUEUE_BATCHES);
        let sink = Arc::new(EventSink {
            format: config.format,
            block_size: config.block_size,
            kept_batches_max: config.kept_batches_max,
            state: Mutex::new(SinkState {
                epoch: 0,
                next_seq: 0,
                kept: VecDeque::with_capacity(config.kept_batches_max.min(LIVE_QUEUE_BATCHES)),
                kept_bytes: 0,
            }),
            live,
            epochs: watch::Sender::new(0),
            grpc: config.grpc,
            published: watch::Sender::new((0, 0)),
            batches_total: AtomicU64::new(0),
            live_dropped_total: AtomicU64::new(0),
        });
        (sink, queued)
    }
}

/// `tcp://host:port`, brackets around an IPv6 host.
fn tcp_endpoint(address: SocketAddr) -> String {
    format!("tcp://{address}")
}

async fn bind_socket<S: Socket>(address: SocketAddr) -> Result<S, String> {
    let mut socket = S::new();
    socket
        .bind(&tcp_endpoint(address))
        .await
        .map_err(|error| format!("cannot bind {}: {error}", tcp_endpoint(address)))?;
    Ok(socket)
}

/// Closes `socket` (its peers see the connection drop), waits [`RESTART_DOWN_MS`] and binds
/// `address` again, retrying until it can.
async fn rebind<S: Socket>(socket: S, address: SocketAddr) -> S {
    for error in socket.close().await {
        tracing::debug!("closing {}: {error}", tcp_endpoint(address));
    }
    loop {
        tokio::time::sleep(Duration::from_millis(RESTART_DOWN_MS)).await;
        match bind_socket::<S>(address).await {
            Ok(socket) => return socket,
            Err(error) => tracing::warn!("restarting the KV-event publisher: {error}"),
        }
    }
}

/// Sends queued batches on the PUB socket, in order, until the sink is gone.
async fn run_publisher(
    mut epochs: watch::Receiver<u64>,
    mut socket: PubSocket,
    address: SocketAddr,
    mut queued: mpsc::Receiver<LiveBatch>,
) {
    let mut epoch = *epochs.borrow_and_update();
    loop {
        tokio::select! {
            // A restart first: batches of the new epoch wait for the new socket.
            biased;
            changed = epochs.changed() => {
                if changed.is_err() {
                    return;
                }
                socket = rebind(socket, address).await;
                epoch = *epochs.borrow_and_update();
            }
            batch = queued.recv() => {
                let Some(batch) = batch else {
                    return;
                };
                if batch.epoch != epoch {
                    continue;
                }
                let message = multipart(vec![
                    Bytes::new(),
                    Bytes::copy_from_slice(&batch.seq.to_be_bytes()),
                    batch.payload,
                ]);
                if let Err(error) = send_within(&mut socket, message).await {
                    tracing::warn!("publishing KV events on {}: {error}", tcp_endpoint(address));
                }
            }
        }
    }
}

/// Answers replay requests on the ROUTER socket until the sink is gone.
async fn run_replay(
    sink: Arc<EventSink>,
    mut epochs: watch::Receiver<u64>,
    mut socket: RouterSocket,
    address: SocketAddr,
) {
    loop {
        tokio::select! {
            biased;
            changed = epochs.changed() => {
                if changed.is_err() {
                    return;
                }
                socket = rebind(socket, address).await;
                epochs.borrow_and_update();
            }
            request = socket.recv() => match request {
                Ok(request) => answer_replay(&sink, &mut socket, request).await,
                Err(error) => {
                    tracing::debug!("replay socket {}: {error}", tcp_endpoint(address));
                    // Never spin on a socket that keeps failing.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// Sends every kept batch from the requested seq on, then the end marker. A malformed request
/// is ignored (and logged at debug), as the engines do.
async fn answer_replay(sink: &EventSink, socket: &mut RouterSocket, request: ZmqMessage) {
    let Some(start_seq) = replay_start_seq(&request) else {
        tracing::debug!(
            "ignoring a malformed replay request of {} frames",
            request.len()
        );
        return;
    };
    let Some(identity) = request.get(0).cloned() else {
        return;
    };
    let replies = sink.kept_from(start_seq).into_iter().map(|(seq, payload)| {
        let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
        (seq, payload)
    });
    let end = (
        Bytes::copy_from_slice(&REPLAY_END_SEQ.to_be_bytes()),
        Bytes::new(),
    );
    for (seq, payload) in replies.chain(std::iter::once(end)) {
        let reply = multipart(vec![identity.clone(), Bytes::new(), seq, payload]);
        if let Err(error) = send_within(socket, reply).await {
            // The requester left or stopped reading; it asks again when it wants the rest.
            tracing::debug!("answering a replay request: {error}");
            return;
        }
    }
}

/// The start seq of `[identity, "", start_seq (8 bytes, big-endian)]`.
fn replay_start_seq(request: &ZmqMessage) -> Option<u64> {
    if request.len() != 3 || !request.get(1)?.is_empty() {
        return None;
    }
    let start: [u8; 8] = request.get(2)?.as_ref().try_into().ok()?;
    Some(u64::from_be_bytes(start))
}

/// `socket.send(message)`, given up after [`SEND_TIMEOUT_MS`].
async fn send_within<S: SocketSend>(socket: &mut S, message: ZmqMessage) -> Result<(), String> {
    let timeout = Duration::from_millis(SEND_TIMEOUT_MS);
    match tokio::time::timeout(timeout, socket.send(message)).await {
        Ok(sent) => sent.map_err(|error| error.to_string()),
        Err(_) => Err(format!(
            "a peer took over {SEND_TIMEOUT_MS} ms to take a message"
        )),
    }
}

fn multipart(frames: Vec<Bytes>) -> ZmqMessage {
    // Never empty: every caller passes three or four frames.
    ZmqMessage::try_from(frames).unwrap_or_else(|_| ZmqMessage::from(Bytes::new()))
}

fn unix_now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(kept_batches_max: usize) -> (Arc<EventSink>, mpsc::Receiver<LiveBatch>) {
        EventSink::new(SinkConfig {
            format: KvEventsFormat::Sglang,
            block_size: 16,
            kept_batches_max,
            grpc: true,
        })
    }

    fn removed(key: u64) -> Vec<CacheEvent> {
        vec![CacheEvent::Removed { keys: vec![key] }]
    }

    fn kept_seqs(sink: &EventSink) -> Vec<u64> {
        sink.kept_from(0).iter().map(|(seq, _)| *seq).collect()
    }

    #[test]
    fn batches_are_numbered_kept_and_queued_in_order() {
        let (sink, mut queued) = sink(3);
        sink.reserve().publish(&[]);
        for key in 0..5 {
            sink.reserve().publish(&removed(key));
        }
        assert_eq!(kept_seqs(&sink), [2, 3, 4], "the last three");
        assert_eq!(sink.kept_from(4).len(), 1);
        let grpc: Vec<u64> = sink.grpc_from(3).iter().map(|(seq, _)| *seq).collect();
        assert_eq!(grpc, [3, 4], "kept as gRPC messages too");
        for seq in 0..5 {
            let batch = queued.try_recv().expect("a queued batch");
            assert_eq!((batch.epoch, batch.seq), (0, seq));
        }
        assert!(queued.try_recv().is_err(), "no batch for no events");
        let stats = sink.stats_json();
        assert_eq!(stats["batches_total"], 5);
        assert_eq!(stats["next_seq"], 5);
    }

    #[test]
    fn a_full_queue_drops_the_live_send_but_keeps_the_batch() {
        let (sink, mut queued) = sink(LIVE_QUEUE_BATCHES + 10);
        for key in 0..LIVE_QUEUE_BATCHES as u64 + 2 {
            sink.reserve().publish(&removed(key));
        }
        let stats = sink.stats_json();
        assert_eq!(stats["live_dropped_total"], 2);
        assert_eq!(stats["replay_buffered"], LIVE_QUEUE_BATCHES + 2);
        let mut last = None;
        while let Ok(batch) = queued.try_recv() {
            last = Some(batch.seq);
        }
        assert_eq!(last, Some(LIVE_QUEUE_BATCHES as u64 - 1));
    }

    #[test]
    fn a_restart_starts_over_in_a_new_epoch() {
        let (sink, mut queued) = sink(10);
        sink.reserve().publish(&removed(1));
        let epochs = sink.epochs.subscribe();
        sink.restart();
        assert!(epochs.has_changed().unwrap_or(false));
        assert!(kept_seqs(&sink).is_empty());
        sink.reserve().publish(&removed(2));
        let old = queued.try_recv().expect("the batch from before");
        let new = queued.try_recv().expect("the batch from after");
        assert_eq!((old.epoch, old.seq), (0, 0));
        assert_eq!((new.epoch, new.seq), (1, 0));
        assert_eq!(sink.stats_json()["restarts_total"], 1);
    }

    #[test]
    fn replay_requests_need_a_delimiter_and_eight_bytes() {
        let request = |frames: Vec<&[u8]>| {
            let frames = frames.into_iter().map(Bytes::copy_from_slice).collect();
            multipart(frames)
        };
        let seven = 7u64.to_be_bytes();
        assert_eq!(
            replay_start_seq(&request(vec![b"id", b"", &seven])),
            Some(7)
        );
        assert_eq!(replay_start_seq(&request(vec![b"id", b"x", &seven])), None);
        assert_eq!(replay_start_seq(&request(vec![b"id", b"", b"1234"])), None);
        assert_eq!(replay_start_seq(&request(vec![b"id", &seven])), None);
    }
}
