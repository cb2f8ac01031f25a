//! The KV-event index on the control core, its only writer ([`KvEvents`]): which workers
//! publish events and where (`--kv-events-endpoints`, `POST /workers`, or asked from the
//! worker's `/server_info`), their subscriptions (`kv_subscriber`), and the batches they hand
//! on, decoded (`kv_events::wire`) and applied to `index::kv` every turn.
//!
//! A worker's entries change only through its events, its removal (purged at once), a reset
//! (batches lost for good, or the publisher restarted: dropped and rebuilt from the next
//! events) and, with `--kv-indexer-ttl-secs`, a silence that long (aged out). The data cores
//! learn which models are served by publishing workers, and their block size, from
//! `KvIndexWriter::publish_models`; `/metrics` shows every stream (`Shared::kv_streams`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::ids::WorkerId;
use crate::index::kv::{KvIndexWriter, PublishingModels};
use crate::kv_events::{EventBatch, Failure, IndexGauges, KvEvent, Reset, StreamStats};
use crate::limits::{
    KV_EVENTS_APPLY_PER_TURN_MAX, KV_EVENTS_DECODE_BYTES_RETAINED_MAX, LOAD_POLL_TIMEOUT,
    MODELS_REFRESH_INTERVAL, PROBE_BODY_BYTES_MAX,
};
use crate::net::client;
use crate::policy::model_hash;
use crate::shared::{FlightRecord, Shared};
use crate::workers::catalog::ModelCatalog;
use crate::workers::spec::{KvEventsEndpoint, KvEventsSource, Scheme};
use crate::workers::table::Roster;

use super::kv_subscriber::grpc::{self as grpc_events, GrpcSubscription, GrpcTarget};
use super::kv_subscriber::{BatchPayload, Feed, FeedItem, Subscribers};
use crate::limits::KV_EVENTS_FEED_CAPACITY;
use crate::workers::spec::WorkerProtocol;
use crossbeam_queue::ArrayQueue;

/// Where one worker's events stand.
#[derive(Debug)]
enum StreamState {
    /// Its `/server_info` is (to be) asked for an endpoint.
    Discovering {
        /// A probe is in flight.
        asked: bool,
        /// When to ask (again).
        at: Instant,
    },
    /// It publishes nothing the gateway reads.
    Silent,
    /// Subscribed as `first..first + ranks`: one subscription per data-parallel rank, each
    /// with its own numbered batches (one for most engines).
    Following { first: u64, ranks: u64 },
}

/// One worker as the KV-event side knows it.
#[derive(Debug)]
struct Worker {
    url: String,
    addr: SocketAddr,
    scheme: Scheme,
    authority: String,
    host: String,
    stream: StreamState,
    stats: StreamStats,
    /// The last batch applied (or when following began).
    last_batch: Instant,
    /// Which ranks' subscriptions are connected: the stream is up when all are.
    ranks_up: Vec<bool>,
}

/// How a worker's events are read.
enum Source {
    /// ZeroMQ: one endpoint per data-parallel rank (the subscriber thread's sockets).
    Zmq(Vec<KvEventsEndpoint>),
    /// A gRPC worker's `SubscribeKvEvents` stream (on this core's runtime).
    Grpc(GrpcTarget),
}

/// A `/server_info` answer for worker `id` at `url`.
type Discovered = (WorkerId, String, Result<(u16, Vec<u8>), String>);

/// The KV-event index's writer and its subscriptions.
#[derive(Debug)]
pub struct KvEvents {
    writer: KvIndexWriter,
    subscribers: Option<Subscribers>,
    /// The gRPC workers' streams, by subscription, and what they hand on.
    grpc_streams: HashMap<u64, GrpcSubscription>,
    grpc_feed: Arc<ArrayQueue<Feed>>,
    workers: HashMap<WorkerId, Worker>,
    next_subscription: u64,
    batch: EventBatch,
    discovered: (mpsc::Sender<Discovered>, mpsc::Receiver<Discovered>),
    /// `--kv-indexer-ttl-secs` (`None`: entries never age out).
    ttl: Option<Duration>,
    /// The workers' API key `/server_info` is asked with (`--api-key`, as the probes send it).
    api_key: Option<Arc<str>>,
    /// The roster and catalog last seen (compared by pointer).
    roster: Option<Arc<Roster>>,
    catalog: Option<Arc<ModelCatalog>>,
    /// The models published to the data cores need building again.
    models_dirty: bool,
    /// The streams published to `/metrics` changed.
    stats_dirty: bool,
    /// Whether the index's fullness was logged.
    warned_full: bool,
    /// The in-flight overlay's requests and claims as last published.
    inflight_published: (usize, usize),
}

impl KvEvents {
    /// The KV-event side of the control core around the index `writer`.
    pub fn new(writer: KvIndexWriter, ttl: Option<Duration>) -> Self {
        KvEvents {
            writer,
            subscribers: None,
            grpc_streams: HashMap::new(),
            grpc_feed: Arc::new(ArrayQueue::new(KV_EVENTS_FEED_CAPACITY)),
            workers: HashMap::new(),
            next_subscription: 0,
            batch: EventBatch::default(),
            discovered: mpsc::channel(),
            ttl,
            api_key: None,
            roster: None,
            catalog: None,
            models_dirty: true,
            stats_dirty: true,
            warned_full: false,
            inflight_published: (0, 0),
        }
    }

    /// These subscriptions with `/server_info` asked with `key` as a bearer token.
    pub fn with_api_key(mut self, key: Option<&str>) -> Self {
        self.api_key = key.map(Arc::from);
        self
    }

    /// One control-core turn: follow roster changes, ask and hear `/server_info`, apply what
    /// the subscribers handed on, age out silent workers, publish.
    pub fn turn(&mut self, shared: &Shared) {
        let now = Instant::now();
        self.follow_roster(shared, now);
        self.discover(now);
        self.apply_feed(now);
        self.expire(now);
        self.writer.expire_flights(shared.tick_now());
        self.publish(shared);
    }

    /// Applies a data core's flight record to the in-flight overlay (`now_ms`: the gateway
    /// tick).
    pub fn apply_flight(&mut self, record: FlightRecord, now_ms: u64) {
        match record {
            FlightRecord::Dispatched { id, worker, keys } => {
                self.writer.dispatched(id, worker, &keys, now_ms);
            }
            FlightRecord::Ended { id, end } => self.writer.flight_ended(id, end, now_ms),
        }
    }

    /// The index as written so far.
    pub fn writer(&self) -> &KvIndexWriter {
        &self.writer
    }

    /// Drops a removed worker's entries and subscription (before its id can be reused).
    pub fn purge_worker(&mut self, id: WorkerId) {
        if let Some(worker) = self.workers.remove(&id) {
            self.unfollow(id, &worker);
        }
    }

    fn unfollow(&mut self, id: WorkerId, worker: &Worker) {
        if let StreamState::Following { first, ranks } = worker.stream {
            for subscription in first..first + ranks {
                // Dropped: a gRPC stream's task ends.
                if self.grpc_streams.remove(&subscription).is_none() {
                    if let Some(subscribers) = &self.subscribers {
                        subscribers.stop(subscription);
                    }
                }
            }
            let blocks = self.writer.blocks_of(id);
            self.writer.detach(id);
            tracing::info!(
                worker = worker.url,
                blocks,
                "KV events: worker removed, its entries purged"
            );
        }
        self.models_dirty = true;
        self.stats_dirty = true;
    }

    /// Starts on workers new to the roster; forgets those that left it.
    fn follow_roster(&mut self, shared: &Shared, now: Instant) {
        let roster = shared.table.roster();
        if self
            .roster
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, &roster))
        {
            return;
        }
        let left: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(id, w)| roster.get(**id).is_none_or(|e| e.spec.url != w.url))
            .map(|(id, _)| *id)
            .collect();
        for id in left {
            self.purge_worker(id);
        }
        for entry in &roster.workers {
            if self.workers.contains_key(&entry.id) {
                continue;
            }
            let spec = &entry.spec;
            let mut worker = Worker {
                url: spec.url.clone(),
                addr: spec.addr,
                scheme: spec.scheme,
                authority: spec.authority.clone(),
                host: spec.host().to_string(),
                stream: StreamState::Silent,
                stats: StreamStats {
                    worker: spec.url.clone(),
                    ..StreamStats::default()
                },
                last_batch: now,
                ranks_up: Vec::new(),
            };
            match &spec.kv_events {
                KvEventsSource::Off => {}
                // A gRPC worker is asked for its stream: `SubscribeKvEvents`.
                KvEventsSource::Discover if matches!(spec.protocol, WorkerProtocol::Grpc(_)) => {
                    let WorkerProtocol::Grpc(backend) = spec.protocol else {
                        continue;
                    };
                    let target = GrpcTarget {
                        addr: spec.addr,
                        authority: spec.authority.clone(),
                        backend,
                        bearer: self.api_key.clone(),
                    };
                    self.start_following(entry.id, &mut worker, Source::Grpc(target));
                }
                KvEventsSource::Discover => {
                    worker.stream = StreamState::Discovering {
                        asked: false,
                        at: now,
                    };
                }
                KvEventsSource::At(endpoint) => {
                    let endpoints = vec![endpoint.clone()];
                    self.start_following(entry.id, &mut worker, Source::Zmq(endpoints));
                }
                KvEventsSource::Ranks { endpoint, dp_size } => {
                    // Every rank's ports were checked when the flag or the call was read.
                    let ranks = (0..*dp_size).filter_map(|rank| endpoint.rank(rank).ok());
                    self.start_following(entry.id, &mut worker, Source::Zmq(ranks.collect()));
                }
            }
            self.workers.insert(entry.id, worker);
        }
        self.roster = Some(roster.clone());
        self.stats_dirty = true;
    }

    /// Follows `worker`'s events from `source`: one subscription per data-parallel rank of a
    /// ZeroMQ publisher (rank order), one for a gRPC worker's stream.
    fn start_following(&mut self, id: WorkerId, worker: &mut Worker, source: Source) {
        if let Err(e) = self.writer.attach(id) {
            tracing::error!(worker = worker.url, "KV events not read: {e}");
            worker.stats.fail(Failure::TooManyWorkers);
            worker.stream = StreamState::Silent;
            return;
        }
        let first = self.next_subscription + 1;
        let ranks = match source {
            Source::Zmq(endpoints) => {
                let Some(subscribers) = self.subscribers() else {
                    self.writer.detach(id);
                    worker.stream = StreamState::Silent;
                    return;
                };
                let ranks = endpoints.len() as u64;
                for (rank, endpoint) in (first..).zip(endpoints) {
                    tracing::info!(
                        worker = worker.url,
                        publisher = endpoint.publisher,
                        replay = endpoint.replay.as_deref().unwrap_or("none"),
                        rank = rank - first,
                        "KV events: subscribing"
                    );
                    subscribers.follow(id, rank, endpoint);
                }
                ranks
            }
            Source::Grpc(target) => {
                tracing::info!(
                    worker = worker.url,
                    "KV events: subscribing (SubscribeKvEvents)"
                );
                let feed = self.grpc_feed.clone();
                let stream = grpc_events::follow(target, id, first, feed);
                self.grpc_streams.insert(first, stream);
                1
            }
        };
        self.next_subscription += ranks;
        worker.stream = StreamState::Following { first, ranks };
        worker.ranks_up = vec![false; ranks as usize];
        worker.last_batch = Instant::now();
        self.models_dirty = true;
    }

    /// The subscriber thread, started the first time a worker publishes over ZeroMQ.
    fn subscribers(&mut self) -> Option<&Subscribers> {
        if self.subscribers.is_none() {
            match Subscribers::start() {
                Ok(subscribers) => self.subscribers = Some(subscribers),
                Err(e) => {
                    tracing::error!("KV events not read: cannot start the subscriber thread: {e}");
                }
            }
        }
        self.subscribers.as_ref()
    }

    /// Asks `/server_info` of workers due, and follows what the answers announce.
    fn discover(&mut self, now: Instant) {
        for (id, worker) in &mut self.workers {
            let StreamState::Discovering { asked, at } = &mut worker.stream else {
                continue;
            };
            if *asked || now < *at {
                continue;
            }
            *asked = true;
            let (id, url, addr, scheme) = (*id, worker.url.clone(), worker.addr, worker.scheme);
            let (authority, answers) = (worker.authority.clone(), self.discovered.0.clone());
            let bearer = self.api_key.clone();
            monoio::spawn(async move {
                let timeout = LOAD_POLL_TIMEOUT;
                let got = client::get(
                    addr,
                    scheme,
                    &authority,
                    "/server_info",
                    bearer.as_deref(),
                    timeout,
                    PROBE_BODY_BYTES_MAX,
                )
                .await
                .map(|r| (r.status, r.body))
                .map_err(|e| e.to_string());
                let _ = answers.send((id, url, got));
            });
        }
        while let Ok((id, url, answer)) = self.discovered.1.try_recv() {
            let Some(mut worker) = self.workers.remove(&id) else {
                continue;
            };
            if worker.url != url || !matches!(worker.stream, StreamState::Discovering { .. }) {
                self.workers.insert(id, worker);
                continue;
            }
            match answer {
                // Not reachable yet: ask again later.
                Err(e) => {
                    tracing::debug!(worker = url, "KV events: /server_info not read: {e}");
                    worker.stream = StreamState::Discovering {
                        asked: false,
                        at: now + MODELS_REFRESH_INTERVAL,
                    };
                }
                Ok((200, body)) => match KvEventsEndpoint::from_server_info(&body, &worker.host) {
                    Ok(Some(endpoint)) => {
                        self.start_following(id, &mut worker, Source::Zmq(vec![endpoint]));
                    }
                    Ok(None) => {
                        tracing::debug!(worker = url, "KV events: the worker announces none");
                        worker.stream = StreamState::Silent;
                    }
                    Err(e) => {
                        tracing::warn!(worker = url, "KV events not read: {e}");
                        worker.stats.fail(Failure::Discovery);
                        worker.stream = StreamState::Silent;
                    }
                },
                // vLLM has no /server_info: give --kv-events-endpoints for it.
                Ok((status, _)) => {
                    tracing::debug!(worker = url, status, "KV events: no /server_info");
                    worker.stream = StreamState::Silent;
                }
            }
            self.workers.insert(id, worker);
            self.stats_dirty = true;
        }
    }

    /// Applies what the subscribers handed on since the last turn (a bounded amount).
    fn apply_feed(&mut self, now: Instant) {
        for _ in 0..KV_EVENTS_APPLY_PER_TURN_MAX {
            let zmq = self.subscribers.as_ref().and_then(Subscribers::pop);
            let Some(feed) = zmq.or_else(|| self.grpc_feed.pop()) else {
                break;
            };
            let Some(worker) = self.workers.get_mut(&feed.worker) else {
                continue;
            };
            let rank = match worker.stream {
                StreamState::Following { first, ranks }
                    if (first..first + ranks).contains(&feed.subscription) =>
                {
                    (feed.subscription - first) as usize
                }
                // A subscription stopped since: its items are stale.
                _ => continue,
            };
            let id = feed.worker;
            let stats = &mut worker.stats;
            self.stats_dirty = true;
            match feed.item {
                FeedItem::Batch {
                    payload, replayed, ..
                } => {
                    let decoded = match &payload {
                        BatchPayload::Msgpack(bytes) => self.batch.decode(bytes),
                        BatchPayload::Grpc(batch) => {
                            self.batch.fill_from_grpc(batch);
                            Ok(())
                        }
                    };
                    if let Err(e) = decoded {
                        stats.batches_malformed += 1;
                        // The first few, then every hundredth: a broken publisher is loud once.
                        if stats.batches_malformed <= 3 || stats.batches_malformed % 100 == 0 {
                            tracing::warn!(
                                worker = worker.url,
                                malformed = stats.batches_malformed,
                                "KV events: a malformed batch skipped: {e}"
                            );
                        }
                        continue;
                    }
                    match replayed {
                        true => stats.batches_replayed += 1,
                        false => stats.batches_applied += 1,
                    }
                    let misshapen = self.batch.misshapen();
                    if misshapen > 0 {
                        tracing::debug!(
                            worker = worker.url,
                            misshapen,
                            "KV events: BlockStored events whose tokens do not fill their blocks \
                             left out; the rest of the batch applied"
                        );
                    }
                    worker.last_batch = now;
                    let learned = apply_batch(&mut self.writer, id, &self.batch, stats);
                    self.batch.shrink_to(KV_EVENTS_DECODE_BYTES_RETAINED_MAX);
                    self.models_dirty |= learned;
                    if stats.blocks_refused + stats.blocks_over_share > 0 && !self.warned_full {
                        self.warned_full = true;
                        tracing::warn!(
                            blocks = self.writer.live_blocks(),
                            share = self.writer.share(),
                            "KV-event index full (or a worker at its share of it): blocks \
                             refused; raise --kv-indexer-max-entries"
                        );
                    }
                }
                FeedItem::Connected => {
                    if let Some(up) = worker.ranks_up.get_mut(rank) {
                        *up = true;
                    }
                    let all_up = worker.ranks_up.iter().all(|up| *up);
                    if !stats.up && all_up {
                        tracing::info!(worker = worker.url, "KV events: connected");
                    }
                    stats.up = all_up;
                }
                FeedItem::Failed(failure) => {
                    stats.fail(failure);
                    let was_up = stats.up;
                    if failure.stops_stream() {
                        stats.up = false;
                        if let Some(up) = worker.ranks_up.get_mut(rank) {
                            *up = false;
                        }
                    }
                    // Logged when the stream goes down, not on every retry of a dead one.
                    if was_up || failure == Failure::Replay {
                        tracing::warn!(
                            worker = worker.url,
                            reason = failure.label(),
                            "KV events: subscription failed; its entries stay until events say \
                             otherwise (or --kv-indexer-ttl-secs)"
                        );
                    }
                }
                FeedItem::Restarted => {
                    let dropped = self.writer.clear(id);
                    stats.reset(Reset::Restart);
                    tracing::info!(
                        worker = worker.url,
                        dropped,
                        "KV events: the publisher restarted; the worker's entries dropped"
                    );
                }
                FeedItem::Unverified => {
                    let dropped = self.writer.clear(id);
                    stats.reset(Reset::Unverified);
                    tracing::info!(
                        worker = worker.url,
                        dropped,
                        "KV events: reconnected without a replay socket; entries rebuilt from new \
                         events"
                    );
                }
                FeedItem::Gap { missing } => {
                    let dropped = self.writer.clear(id);
                    stats.reset(Reset::Gap);
                    tracing::warn!(
                        worker = worker.url,
                        dropped,
                        first = missing.start,
                        last = missing.end.saturating_sub(1),
                        "KV events: batches lost and not replayed; entries rebuilt from new events"
                    );
                }
                FeedItem::Implausible { seq } => {
                    let dropped = self.writer.clear(id);
                    stats.reset(Reset::Gap);
                    stats.batches_skipped += 1;
                    tracing::warn!(
                        worker = worker.url,
                        dropped,
                        seq,
                        "KV events: a batch numbered implausibly far ahead skipped; entries \
                         rebuilt from the batches after it"
                    );
                }
                FeedItem::Unsupported => {
                    tracing::info!(
                        worker = worker.url,
                        "KV events: the gRPC worker does not serve SubscribeKvEvents; its events \
                         are not read"
                    );
                    self.writer.detach(id);
                    worker.stream = StreamState::Silent;
                    self.grpc_streams.remove(&feed.subscription);
                    self.models_dirty = true;
                }
                FeedItem::Duplicate => stats.batches_skipped += 1,
                FeedItem::Malformed => stats.batches_malformed += 1,
            }
        }
    }

    /// With `--kv-indexer-ttl-secs`, drops the entries of workers silent that long.
    fn expire(&mut self, now: Instant) {
        let Some(ttl) = self.ttl else {
            return;
        };
        for (id, worker) in &mut self.workers {
            let following = matches!(worker.stream, StreamState::Following { .. });
            if !following || now.duration_since(worker.last_batch) < ttl {
                continue;
            }
            worker.last_batch = now;
            let dropped = self.writer.clear(*id);
            if dropped > 0 {
                worker.stats.reset(Reset::Expired);
                self.stats_dirty = true;
                tracing::info!(
                    worker = worker.url,
                    dropped,
                    "KV events: none for --kv-indexer-ttl-secs; the worker's entries aged out"
                );
            }
        }
    }

    /// Tells the data cores which models publish, and `/metrics` how the streams stand.
    fn publish(&mut self, shared: &Shared) {
        let catalog = shared.catalog.load_full();
        if !self
            .catalog
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &catalog))
        {
            self.catalog = Some(catalog.clone());
            self.models_dirty = true;
        }
        if self.models_dirty {
            self.models_dirty = false;
            self.writer.publish_models(self.publishing_models(&catalog));
            self.stats_dirty = true;
        }
        let inflight = self.writer.inflight();
        if inflight != self.inflight_published {
            self.inflight_published = inflight;
            self.stats_dirty = true;
        }
        if !self.stats_dirty {
            return;
        }
        self.stats_dirty = false;
        let mut streams: Vec<StreamStats> = Vec::new();
        for (id, worker) in &mut self.workers {
            worker.stats.blocks_held = self.writer.blocks_of(*id) as u64;
            // Workers that publish nothing are listed only if reading them failed.
            let failed = worker.stats.failures.iter().any(|n| *n > 0);
            if !matches!(worker.stream, StreamState::Silent) || failed {
                streams.push(worker.stats.clone());
            }
        }
        streams.sort_by(|a, b| a.worker.cmp(&b.worker));
        let models = catalog
            .serving()
            .map(|(model, ids)| {
                let entries = ids.iter().map(|id| self.writer.blocks_of(*id) as u64);
                (model.to_string(), entries.sum())
            })
            .filter(|(_, entries)| *entries > 0)
            .collect();
        shared.kv_streams.store(Arc::new(streams));
        shared.kv_index_gauges.store(Arc::new(IndexGauges {
            models,
            blocks: self.writer.live_blocks() as u64,
            memory_bytes: self.writer.memory_bytes() as u64,
            inflight_requests: inflight.0 as u64,
            inflight_claims: inflight.1 as u64,
        }));
    }

    /// The models served by publishing workers, each with the block size their events report.
    fn publishing_models(&self, catalog: &ModelCatalog) -> PublishingModels {
        let publishing = |id: &WorkerId| {
            let worker = self.workers.get(id)?;
            matches!(worker.stream, StreamState::Following { .. }).then_some(*id)
        };
        // The block size the first publisher with one reported (0: none yet).
        let block_size = |ids: &mut dyn Iterator<Item = WorkerId>| -> Option<u32> {
            let (mut any, mut reported) = (false, None);
            for id in ids {
                any = true;
                reported = reported.or_else(|| self.writer.block_size_of(id));
            }
            any.then(|| reported.unwrap_or(0))
        };
        let mut models = Vec::new();
        for (model, ids) in catalog.serving() {
            if let Some(size) = block_size(&mut ids.iter().filter_map(publishing)) {
                models.push((model_hash(model), size));
            }
        }
        // A request without a model may go to any worker.
        if let Some(size) = block_size(&mut self.workers.keys().filter_map(publishing)) {
            models.push((model_hash(""), size));
        }
        let any_model = match catalog.serving().next() {
            // No worker lists models: every worker serves every model.
            None => block_size(&mut self.workers.keys().filter_map(publishing)),
            Some(_) => block_size(&mut catalog.wildcard().iter().filter_map(publishing)),
        };
        PublishingModels { models, any_model }
    }
}

/// Applies a decoded batch of worker `id`'s, counting what it did in `stats`; returns whether
/// the worker reported a block size it had not before (`perf/kv_index.rs` measures this).
pub fn apply_batch(
    writer: &mut KvIndexWriter,
    id: WorkerId,
    batch: &EventBatch,
    stats: &mut StreamStats,
) -> bool {
    let size_before = writer.block_size_of(id);
    for event in batch.events() {
        stats.events += 1;
        match event {
            KvEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                salts,
            } => {
                let (hashes, tokens) = (batch.hashes(hashes), batch.tokens(tokens));
                let (size, salts) = (*block_size as usize, batch.salts(salts));
                // Attached while followed: the store cannot miss the worker.
                if let Ok(stored) = writer.store_salted(id, hashes, *parent, tokens, size, salts) {
                    stats.blocks_stored += stored.stored;
                    stats.blocks_orphaned += stored.orphans;
                    stats.blocks_refused += stored.refused;
                    stats.blocks_over_share += stored.over_share;
                }
            }
            KvEvent::Removed { hashes } => {
                stats.blocks_removed += writer.remove(id, batch.hashes(hashes));
            }
            KvEvent::Cleared => stats.blocks_removed += writer.clear(id),
        }
    }
    writer.block_size_of(id) != size_before
}
