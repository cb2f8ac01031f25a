//! The mesh thread (`kvgate-mesh`, `--enable-mesh`): a tokio current-thread runtime that runs
//! `mesh`'s logic over sockets. It never touches the index: the control core hands it its
//! inserts and applies the peers' through `Shared::mesh` (two bounded queues), so neither
//! thread waits for the other and no data core ever sees the mesh.
//!
//! - UDP on `--mesh-port`: foca's SWIM datagrams (`mesh::membership`), each sealed and opened
//!   by `mesh::auth` (a tag under the shared key and a time window).
//! - TCP on `--mesh-port`: frames (`mesh::wire`), sealed per stream (`mesh::auth`: the
//!   acceptor's challenge, the dialer's proof, then a tag per frame). Each live peer has one
//!   outbound stream, fed by a queue bounded in frames and bytes (`MESH_PEER_QUEUE_FRAMES`,
//!   `MESH_PEER_QUEUE_BYTES_MAX`) and written under `MESH_WRITE_TIMEOUT`: a stream that backs
//!   up (a slow or paused peer) drops whole frames, counted, and the round goes on; one idle
//!   for half of `MESH_STREAM_IDLE_TIMEOUT` is closed and dialed again for the next frame. The
//!   gateway dials only members (SWIM's, or `--mesh-peer-urls` through SWIM), never an address
//!   a frame names. Inbound connections are capped (`MESH_INBOUND_STREAMS_MAX`) and read by one
//!   task each under deadlines (`MESH_HANDSHAKE_TIMEOUT`, `MESH_FRAME_READ_TIMEOUT`,
//!   `MESH_STREAM_IDLE_TIMEOUT`); a frame whose tag does not check, that does not decode, or
//!   that names another sender than its stream's first closes the stream. The mesh loop takes
//!   a frame only from a current member, about a model this gateway serves
//!   (`mesh::models::ServedModels`), and a repair page only for a repair it asked of that
//!   peer. Each refusal is counted (`mesh::Refusal`).
//! - Every `MESH_ROUND` (a gossip round, on the wall clock's multiples of it, so the gateways'
//!   rounds and frames coincide): the control core's inserts since the last round are
//!   learned (`KnownPaths`) and sent once, batched per model (`DeltaRound`), to every live peer.
//!   Every tick: SWIM timers, repair stalls; every second: announce to the `--mesh-peer-urls`
//!   not alive (a restarted or partitioned peer comes back), the peer gauges.
//!
//! One log line per membership change (info), as the issue asks.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};

use crate::limits::{
    MESH_DATAGRAM_BYTES_MAX, MESH_FRAME_READ_TIMEOUT, MESH_HANDSHAKE_TIMEOUT,
    MESH_INBOUND_FRAMES_MAX, MESH_INBOUND_STREAMS_MAX, MESH_KNOWN_BYTES_MAX, MESH_KNOWN_PATHS_MAX,
    MESH_PEER_QUEUE_BYTES_MAX, MESH_PEER_QUEUE_FRAMES, MESH_ROUND, MESH_STREAM_IDLE_TIMEOUT,
    MESH_WRITE_TIMEOUT,
};
use crate::mesh::auth::{
    self, AuthError, Authenticator, StreamOpen, StreamSeal, CHALLENGE_BYTES, TAG_BYTES,
};
use crate::mesh::chains::{chain_hashes, chain_root, PathChains, RecipientsHashes};
use crate::mesh::membership::{Change, Membership};
use crate::mesh::models::ServedModels;
use crate::mesh::paths::{
    delta_key, entry_key, Batched, Change as PathChange, DeltaRound, KnownPaths, RoundPath,
};
use crate::mesh::repair::{Ask, PageOutcome, Repairs, StallOutcome};
use crate::mesh::text::{self, Shareable};
use crate::mesh::wire::{
    self, frame::Body, Delta, DeltaBatch, Frame, FrameError, RepairPage, RepairRequest,
};
use crate::mesh::{
    is_shareable_worker, tree_kind, MeshConfig, MeshCounter, MeshLink, PeerState, Refusal,
    RemoteInsert,
};
use crate::policy::KeyData;
use crate::shared::Shared;
use crate::workers::catalog::ModelCatalog;

/// How often the thread wakes for SWIM timers, stalls and shutdown.
const TICK: Duration = Duration::from_millis(20);
/// How often the `--mesh-peer-urls` that are not alive are announced to, and gauges published.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);
/// How long an outbound stream waits before it dials a peer again.
const REDIAL_AFTER: Duration = Duration::from_millis(200);
/// Bytes an inbound stream reads at a time (its buffer grows only with what arrives).
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// The mesh's sockets, bound at start so a taken port fails the start, not later.
#[derive(Debug)]
pub struct MeshSockets {
    udp: StdUdpSocket,
    tcp: StdTcpListener,
}

impl MeshSockets {
    /// Binds UDP and TCP on `config.bind_addr`.
    pub fn bind(config: &MeshConfig) -> io::Result<MeshSockets> {
        let udp = StdUdpSocket::bind(config.bind_addr)?;
        udp.set_nonblocking(true)?;
        let tcp = StdTcpListener::bind(config.bind_addr)?;
        tcp.set_nonblocking(true)?;
        Ok(MeshSockets { udp, tcp })
    }
}

/// Runs the mesh until shutdown (the body of the `kvgate-mesh` thread).
pub fn run(sockets: MeshSockets, config: MeshConfig, shared: Arc<Shared>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("mesh not started: cannot build its runtime: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let udp = match UdpSocket::from_std(sockets.udp) {
            Ok(udp) => udp,
            Err(e) => return tracing::error!("mesh not started: UDP socket: {e}"),
        };
        let tcp = match TcpListener::from_std(sockets.tcp) {
            Ok(tcp) => tcp,
            Err(e) => return tracing::error!("mesh not started: TCP listener: {e}"),
        };
        let auth = Authenticator::new(config.secret.as_ref());
        if !auth.is_authenticated() {
            tracing::warn!(
                "mesh: unauthenticated (no --mesh-secret-file): any host that reaches \
                 --mesh-port can join the mesh and steer routing"
            );
        }
        let (frames_tx, frames_rx) = mpsc::channel(MESH_INBOUND_FRAMES_MAX);
        let accept = tokio::spawn(accept_streams(tcp, frames_tx, auth.clone(), shared.clone()));
        let mut node = Node::new(config, auth, shared);
        node.run(udp, frames_rx).await;
        accept.abort();
    });
}

/// What a frame carries, for the byte counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FrameKind {
    Deltas,
    Repair,
}

/// The mesh's state on its thread.
struct Node {
    shared: Arc<Shared>,
    config: MeshConfig,
    /// This gateway's advertised address, as frames name their sender.
    me: String,
    membership: Membership,
    known: KnownPaths,
    round: DeltaRound,
    repairs: Repairs,
    /// Token paths known here, and which peers are believed to know each.
    chains: PathChains,
    /// `chains.cleared()` as last counted in `/metrics`.
    chains_cleared_counted: u64,
    recipients: RecipientsHashes,
    /// One outbound stream per live peer, by address.
    streams: HashMap<SocketAddr, PeerStream>,
    auth: Authenticator,
    /// The models peers may name, rebuilt when the catalog changes.
    models: ServedModels,
    catalog: Option<Arc<ModelCatalog>>,
}

/// The mesh loop's end of a peer's outbound stream.
#[derive(Debug)]
struct PeerStream {
    frames: mpsc::Sender<Arc<[u8]>>,
    /// Bytes queued and not yet taken by the writer (`MESH_PEER_QUEUE_BYTES_MAX`).
    queued_bytes: Arc<AtomicUsize>,
}

/// The next time the wall clock is a multiple of `period` (whole milliseconds), when it reads
/// `now_ms` at `now`.
fn on_the_clock(now: Instant, now_ms: u64, period: Duration) -> Instant {
    let period_ms = (period.as_millis() as u64).max(1);
    now + Duration::from_millis(period_ms - now_ms % period_ms)
}

/// Milliseconds since the epoch, the time datagrams are stamped with.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Node {
    fn new(config: MeshConfig, auth: Authenticator, shared: Arc<Shared>) -> Node {
        let membership = Membership::new(config.advertise_addr);
        tracing::info!(
            name = config.server_name,
            addr = %config.advertise_addr,
            peers = config.peers.len(),
            authenticated = auth.is_authenticated(),
            "mesh: started"
        );
        if let Some(link) = shared.mesh.as_ref() {
            link.counters.set_authenticated(auth.is_authenticated());
        }
        Node {
            auth,
            models: ServedModels::default(),
            catalog: None,
            chains: PathChains::default(),
            chains_cleared_counted: 0,
            recipients: RecipientsHashes::default(),
            me: config.advertise_addr.to_string(),
            membership,
            known: KnownPaths::new(MESH_KNOWN_PATHS_MAX, MESH_KNOWN_BYTES_MAX),
            round: DeltaRound::default(),
            repairs: Repairs::default(),
            streams: HashMap::new(),
            shared,
            config,
        }
    }

    fn link(&self) -> &MeshLink {
        // The thread starts only when `Shared` has the link (`--enable-mesh`).
        self.shared
            .mesh
            .as_ref()
            .expect("the mesh thread runs with Shared::mesh")
    }

    async fn run(&mut self, udp: UdpSocket, mut frames: mpsc::Receiver<Frame>) {
        let mut datagram = vec![0u8; MESH_DATAGRAM_BYTES_MAX];
        // Ticks and rounds fall on the wall clock's multiples of their period, the same on
        // every gateway (to the hosts' clock skew): peers send their rounds' frames at about
        // the same time, when each is awake for its own round, so the frames of a round cost
        // one wake of each receiver, not one per peer and frame.
        // (One reading of both clocks: a round's time is one of the ticks'.)
        let (now, now_ms) = (Instant::now(), now_ms());
        let mut tick = tokio::time::interval_at(on_the_clock(now, now_ms, TICK).into(), TICK);
        let mut next_round = on_the_clock(now, now_ms, MESH_ROUND);
        let mut next_announce = Instant::now();
        while !self.shared.is_shutting_down() {
            tokio::select! {
                received = udp.recv_from(&mut datagram) => {
                    if let Ok((len, _)) = received {
                        self.handle_datagram(&datagram[..len]);
                    }
                }
                Some(frame) = frames.recv() => {
                    self.handle_frame(frame);
                    self.count_chain_clears();
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    self.membership.tick(now);
                    if now >= next_announce {
                        next_announce = now + ANNOUNCE_EVERY;
                        self.announce_to_absent_peers(now);
                        self.publish_peer_gauges();
                    }
                    if now >= next_round {
                        // On the ticks' schedule, so a tick that wakes late skips no round.
                        next_round = (next_round + MESH_ROUND).max(now);
                        self.gossip_round();
                        self.count_chain_clears();
                    }
                    self.check_repair_stalls(now);
                }
            }
            self.flush_membership(&udp).await;
        }
        if let Err(e) = self.membership.leave() {
            tracing::debug!("mesh: leave: {e}");
        }
        self.flush_membership(&udp).await;
    }

    /// A datagram reaches SWIM only when its tag checks and its time is recent.
    fn handle_datagram(&mut self, datagram: &[u8]) {
        match self.auth.open_datagram(datagram, now_ms()) {
            Ok(payload) => self.membership.handle_datagram(payload, Instant::now()),
            Err(AuthError::Stale) => self.link().counters.refuse(Refusal::Stale),
            Err(AuthError::BadTag | AuthError::Malformed) => {
                self.link().counters.refuse(Refusal::Unauthenticated)
            }
        }
    }

    /// Sends SWIM's datagrams and acts on membership changes (one log line each).
    async fn flush_membership(&mut self, udp: &UdpSocket) {
        for (to, data) in self.membership.take_sends() {
            let sealed = self.auth.seal_datagram(&data, now_ms());
            // UDP is best effort; SWIM counts on losses.
            let _ = udp.send_to(&sealed, to).await;
        }
        for change in self.membership.take_changes() {
            match change {
                Change::Up(peer) => {
                    tracing::info!(peer = %peer.addr, incarnation = peer.incarnation, "mesh: peer up");
                    // A peer (back) up may know nothing this gateway sent it before, and
                    // either may have missed the other's deltas: its first delta repairs.
                    self.chains.forget(peer.addr);
                    self.repairs.forget_peer(peer.addr);
                    self.reopen_stream(peer.addr);
                }
                Change::Down(peer) => {
                    tracing::info!(peer = %peer.addr, incarnation = peer.incarnation, "mesh: peer down");
                    self.link().counters.add(MeshCounter::PeersDown, 1);
                    // Per-peer state goes with the peer: its stream (the writer ends), what it
                    // was believed to know; its first delta when back catches up by a repair.
                    self.streams.remove(&peer.addr);
                    self.repairs.forget_peer(peer.addr);
                    self.chains.forget(peer.addr);
                }
                Change::Renamed(old, new) => {
                    tracing::info!(
                        peer = %new.addr,
                        from = old.incarnation,
                        to = new.incarnation,
                        "mesh: peer rejoined under a new incarnation"
                    );
                    self.chains.forget(new.addr);
                    self.repairs.forget_peer(new.addr);
                    self.reopen_stream(new.addr);
                }
                Change::Rejoined(me) => {
                    tracing::info!(
                        incarnation = me.incarnation,
                        "mesh: this gateway was declared down and rejoined"
                    );
                    // The peers sent it nothing while it was down: catch up with each.
                    self.repairs.forget_heard();
                }
                Change::Active => tracing::info!("mesh: joined, at least one peer reached"),
                Change::Idle => tracing::info!("mesh: alone, every known peer is down or gone"),
            }
        }
        self.publish_peer_gauges();
    }

    fn announce_to_absent_peers(&mut self, now: Instant) {
        for peer in self.config.peers.clone() {
            if !self.membership.is_live(peer) {
                self.membership.announce(peer, now);
            }
        }
    }

    fn publish_peer_gauges(&self) {
        let counts = self.membership.counts();
        let of = |state: PeerState| counts.iter().find(|(s, _)| *s == state).map_or(0, |c| c.1);
        let link = self.link();
        let (alive, suspect, down) = (
            of(PeerState::Alive),
            of(PeerState::Suspect),
            of(PeerState::Down),
        );
        link.counters.set_peers(alive, suspect, down);
    }

    /// A new stream to a peer (back) up: the one before may be connected to the process that
    /// was killed, and a write into it would succeed locally and be lost (the reset comes
    /// back only after it), as would the next: a restarted peer's first deltas, which start its
    /// catch-up.
    fn reopen_stream(&mut self, addr: SocketAddr) {
        self.streams.remove(&addr);
        self.open_stream(addr);
    }

    fn open_stream(&mut self, addr: SocketAddr) -> &PeerStream {
        let (auth, shared) = (&self.auth, &self.shared);
        self.streams.entry(addr).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(MESH_PEER_QUEUE_FRAMES);
            let queued_bytes = Arc::new(AtomicUsize::new(0));
            let writer = Writer {
                peer: addr,
                auth: auth.clone(),
                queued_bytes: queued_bytes.clone(),
                shared: shared.clone(),
            };
            tokio::spawn(writer.run(rx));
            PeerStream {
                frames: tx,
                queued_bytes,
            }
        })
    }

    /// Queues `bytes` (an encoded frame) for `peer`'s stream; `false` when `peer` is not a live
    /// member (never dialed) or its stream is backed up (counted; the caller counts deltas).
    fn send(&mut self, peer: SocketAddr, bytes: Arc<[u8]>, kind: FrameKind) -> bool {
        if !self.streams.contains_key(&peer) && !self.membership.is_live(peer) {
            return false;
        }
        let len = bytes.len();
        let shared = self.shared.clone();
        let stream = self.open_stream(peer);
        // Counted before it is queued, so the writer never takes more than was added.
        let queued = stream.queued_bytes.fetch_add(len, Ordering::Relaxed);
        let sent =
            queued + len <= MESH_PEER_QUEUE_BYTES_MAX && stream.frames.try_send(bytes).is_ok();
        if sent {
            if let Some(link) = shared.mesh.as_ref() {
                // What the stream carries: the frame sealed (length and tag) for this peer.
                let sealed = (len + auth::FRAME_HEADER_BYTES) as u64;
                link.counters.add(MeshCounter::BytesSent, sealed);
                if kind == FrameKind::Repair {
                    link.counters.add(MeshCounter::BytesSentRepair, sealed);
                }
            }
        } else {
            stream.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            refuse(&shared, Refusal::PeerBackedUp);
        }
        sent
    }

    /// The served models, rebuilt from the catalog when it changed.
    fn served_models(&mut self) -> &mut ServedModels {
        let catalog = self.shared.catalog.load_full();
        if !self
            .catalog
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &catalog))
        {
            let mut fresh = ServedModels::of_catalog(&catalog);
            fresh.carry_admitted(std::mem::take(&mut self.models));
            self.models = fresh;
            self.catalog = Some(catalog);
        }
        &mut self.models
    }

    /// One gossip round: this gateway's inserts since the last, learned and sent once. A token
    /// path goes to each peer with the pages after the deepest prefix that peer is believed to
    /// know, so the peer inserts it without a repair.
    fn gossip_round(&mut self) {
        let started = Instant::now();
        let shared = self.shared.clone();
        let Some(link) = shared.mesh.as_ref() else {
            return;
        };
        let mut dropped = 0u64;
        let block_size = shared.config.policy.cache_aware.block_size as usize;
        // Where this gateway's numbering stood before the round: a catch-up a batch starts
        // stops there (what follows, the peer hears as deltas).
        let known_before = (self.known.epoch(), self.known.last_seq());
        while let Some(insert) = link.outbound.pop() {
            // A text path goes as its text's pages, in a token path's form (`mesh::text`).
            let key = match text::shareable(insert.key, block_size) {
                Shareable::Key { key, capped } => {
                    if capped {
                        link.counters.refuse(Refusal::TextPagesCapped);
                    }
                    key
                }
                Shareable::None => continue,
            };
            let Some(kind) = tree_kind(&key) else {
                continue;
            };
            let model = insert.namespace.model;
            self.served_models().note_local(model);
            // Its chain is learned when the batch is made for the peers (`for_peers`).
            let path = RoundPath::of(insert.namespace, &key).map(Arc::new);
            let learned = self.known.learn(insert.namespace, key, &insert.worker_url);
            if let Some((hash, _)) = learned {
                let added = self
                    .round
                    .add(model, (kind, hash), &insert.worker_url, path);
                if added == Batched::Full {
                    dropped += 1;
                }
            }
        }
        let batches = self.round.take();
        let peers: Vec<SocketAddr> = self.membership.live_peers();
        let recipients = self.recipients.of(&peers);
        for mut batch in batches {
            batch.batch.recipients = recipients;
            (batch.batch.epoch, batch.batch.known_before) = known_before;
            let deltas = batch.batch.deltas.len() as u64;
            let for_peers = batch.for_peers(&peers, &mut self.chains);
            for (&peer, for_peer) in peers.iter().zip(for_peers) {
                let pages: usize = for_peer.deltas.iter().map(|d| d.pages.len()).sum();
                let frame = wire::frame(&self.me, Body::Deltas(for_peer));
                let bytes: Arc<[u8]> = wire::encode(&frame).into();
                if self.send(peer, bytes, FrameKind::Deltas) {
                    link.counters.add(MeshCounter::DeltasSent, deltas);
                    link.counters.add(MeshCounter::PagesSent, pages as u64);
                } else {
                    // The peer will not have these paths: it was noted as knowing them.
                    self.chains.forget(peer);
                    dropped += deltas;
                }
            }
        }
        link.counters.add(MeshCounter::DeltasDropped, dropped);
        link.counters.add(MeshCounter::SyncRounds, 1);
        let micros = started.elapsed().as_micros() as u64;
        link.counters.add(MeshCounter::SyncRoundMicros, micros);
    }

    /// Counts the known paths' clears for their bounds since the last call
    /// (`kvgate_mesh_refused_total{reason="chains_cleared"}`).
    fn count_chain_clears(&mut self) {
        let cleared = self.chains.cleared();
        for _ in self.chains_cleared_counted..cleared {
            refuse(&self.shared, Refusal::ChainsCleared);
        }
        self.chains_cleared_counted = cleared;
    }

    /// A frame whose tag checked: taken only from a current member, about a served model, and
    /// (a repair page) only for the repair this gateway asked of that member.
    fn handle_frame(&mut self, frame: Frame) {
        let sender = match frame.sender.parse::<SocketAddr>() {
            Ok(sender) if self.membership.is_live(sender) => sender,
            _ => return refuse(&self.shared, Refusal::NotMember),
        };
        let model = match &frame.body {
            Some(Body::Deltas(batch)) => batch.model,
            Some(Body::RepairRequest(request)) => request.model,
            Some(Body::RepairPage(page)) => {
                if !self.repairs.expects(page.model, page.repair_id, sender) {
                    return refuse(&self.shared, Refusal::UnsolicitedRepair);
                }
                page.model
            }
            // A body of a newer version: skipped (the compatibility rule of mesh.proto).
            None => return,
        };
        if !self.served_models().admits(model) {
            return refuse(&self.shared, Refusal::UnknownModel);
        }
        match frame.body {
            Some(Body::Deltas(batch)) => self.apply_deltas(sender, batch),
            Some(Body::RepairRequest(request)) => self.serve_repair(sender, request),
            Some(Body::RepairPage(page)) => self.apply_repair_page(page),
            None => {}
        }
    }

    fn apply_deltas(&mut self, sender: SocketAddr, batch: DeltaBatch) {
        let shared = self.shared.clone();
        let Some(link) = shared.mesh.as_ref() else {
            return;
        };
        link.counters
            .add(MeshCounter::DeltasReceived, batch.deltas.len() as u64);
        let urls: Vec<Arc<str>> = batch
            .worker_urls
            .iter()
            .map(|u| Arc::from(u.as_str()))
            .collect();
        let knowers = self.knowers(sender, batch.recipients);
        let mut unknown = Vec::new();
        for delta in &batch.deltas {
            let Some(url) = urls.get(delta.worker as usize) else {
                continue;
            };
            if !is_shareable_worker(url) {
                continue;
            }
            // A known holder is inserted again all the same: the peer just dispatched there, and
            // the insert refreshes the tree's recency (or restores what it evicted).
            let insert = match self.known.name_holder(batch.model, delta.path_hash, url) {
                Some((path, _)) => RemoteInsert {
                    namespace: path.namespace,
                    key: path.key.clone(),
                    worker_url: url.clone(),
                },
                None => match self.learn_delta_path(&knowers, batch.model, delta, url) {
                    Some(insert) => insert,
                    None => {
                        unknown.push(delta.path_hash);
                        continue;
                    }
                },
            };
            if link.inbound.push(insert).is_err() {
                link.counters.add(MeshCounter::DeltasDropped, 1);
            }
        }
        // A catch-up from the sender brings every path it knows, the unknown ones included;
        // without one, only the unknown paths are asked for.
        let live = self.membership.live_peers();
        let now = Instant::now();
        let ask = if self.repairs.first_heard(sender, batch.model) {
            link.counters.add(MeshCounter::RepairCauseCatchUp, 1);
            let until = (batch.epoch, batch.known_before);
            self.repairs
                .start(batch.model, Some(sender), until, &live, now)
        } else if !unknown.is_empty() {
            link.counters.add(MeshCounter::RepairCauseUnknownPath, 1);
            let model = batch.model;
            self.repairs
                .start_paths(model, Some(sender), &unknown, &live, now)
        } else {
            None
        };
        if let Some(ask) = ask {
            link.counters.add(MeshCounter::RepairsStarted, 1);
            tracing::debug!(model = batch.model, peer = %ask.peer, paths = ask.paths.len(), "mesh: repair started");
            self.ask(ask);
        }
    }

    /// Who knows what `sender`'s batch carried: the sender, and the members it sent the batch
    /// to when they are the members this gateway sees (itself included, the sender not); when
    /// the views differ, or the sender did not say (an older version), the sender alone.
    fn knowers(&mut self, sender: SocketAddr, recipients: u64) -> Vec<SocketAddr> {
        let mut knowers = self.membership.live_peers();
        knowers.retain(|&peer| peer != sender);
        knowers.push(self.config.advertise_addr);
        if self.recipients.of(&knowers) != recipients {
            return vec![sender];
        }
        knowers.pop();
        knowers.push(sender);
        knowers
    }

    /// A token path this gateway did not know, rebuilt from the delta's pages (after a prefix
    /// it knows): learned, its prefixes noted as known here and by `knowers` (the sender and
    /// the members it sent the delta to). `None`: the delta cannot be rebuilt here (a text
    /// path, an older sender, a forgotten prefix).
    fn learn_delta_path(
        &mut self,
        knowers: &[SocketAddr],
        model: u64,
        delta: &Delta,
        url: &Arc<str>,
    ) -> Option<RemoteInsert> {
        let (namespace, key, chained) = delta_key(&self.chains, model, delta)?;
        // The sender knows the whole path, and sent it to the members it names: they are noted
        // as knowing it too, so this gateway's own deltas of it carry only what follows. One
        // the sender's send did not reach cannot rebuild such a delta, and repairs.
        if let KeyData::Tokens(tokens) = &key {
            self.chains.learn(tokens, chained, knowers);
        }
        self.known
            .learn_hashed(namespace, key.clone(), delta.path_hash, url);
        Some(RemoteInsert {
            namespace,
            key,
            worker_url: url.clone(),
        })
    }

    fn ask(&mut self, ask: Ask) {
        let request = RepairRequest {
            model: ask.model,
            repair_id: ask.repair_id,
            after: ask.after,
            epoch: ask.epoch,
            paths: ask.paths,
            until: ask.until.1,
            until_epoch: ask.until.0,
        };
        let bytes = wire::encode(&wire::frame(&self.me, Body::RepairRequest(request))).into();
        // A request lost to a backed-up stream stalls, and the stall retries it.
        let _ = self.send(ask.peer, bytes, FrameKind::Repair);
    }

    fn serve_repair(&mut self, peer: SocketAddr, request: RepairRequest) {
        let (model, id) = (request.model, request.repair_id);
        let page = if request.paths.is_empty() {
            let (mark, until) = (
                (request.epoch, request.after),
                (request.until_epoch, request.until),
            );
            self.known.page(model, id, mark, until)
        } else {
            let mark = (request.epoch, request.after);
            self.known.page_of_paths(model, id, mark, &request.paths)
        };
        let bytes = wire::encode(&wire::frame(&self.me, Body::RepairPage(page))).into();
        let _ = self.send(peer, bytes, FrameKind::Repair);
    }

    fn apply_repair_page(&mut self, page: RepairPage) {
        let shared = self.shared.clone();
        let Some(link) = shared.mesh.as_ref() else {
            return;
        };
        let urls: Vec<Arc<str>> = page
            .worker_urls
            .iter()
            .map(|u| Arc::from(u.as_str()))
            .collect();
        for entry in &page.entries {
            let Some((namespace, key)) = entry_key(&self.known, page.model, entry) else {
                continue;
            };
            if let KeyData::Tokens(tokens) = &key {
                let (block_size, pages) = (tokens.block_size(), tokens.pages());
                let chains = chain_hashes(namespace, block_size, pages);
                let root = chain_root(namespace, block_size);
                self.chains.learn_chains(tokens, root, &chains, &[]);
            }
            // Oldest first, so the most recent holder ends up first, as the sender had it.
            for &at in entry.workers.iter().rev() {
                let Some(url) = urls.get(at as usize) else {
                    continue;
                };
                if !is_shareable_worker(url) {
                    continue;
                }
                let learned = self.known.learn(namespace, key.clone(), url);
                // What this gateway knew already is in its trees (or was evicted from them on
                // purpose): only news is inserted.
                if !matches!(learned, Some((_, PathChange::News))) {
                    continue;
                }
                let insert = RemoteInsert {
                    namespace,
                    key: key.clone(),
                    worker_url: url.clone(),
                };
                if link.inbound.push(insert).is_err() {
                    link.counters.add(MeshCounter::DeltasDropped, 1);
                }
            }
        }
        let now = Instant::now();
        let mark = (page.epoch, page.next_after);
        match self
            .repairs
            .on_page(page.model, page.repair_id, mark, page.done, now)
        {
            PageOutcome::Stale => {}
            PageOutcome::Next(ask) => self.ask(ask),
            PageOutcome::Completed { again } => {
                link.counters.add(MeshCounter::RepairsCompleted, 1);
                tracing::debug!(model = page.model, again, "mesh: repair completed");
                let live = self.membership.live_peers();
                if let Some(ask) = self.repairs.resume_waiting(page.model, &live, now) {
                    link.counters.add(MeshCounter::RepairsStarted, 1);
                    self.ask(ask);
                }
            }
        }
    }

    fn check_repair_stalls(&mut self, now: Instant) {
        if self.repairs.is_empty() {
            return;
        }
        let live = self.membership.live_peers();
        for outcome in self.repairs.check_stalls(&live, now) {
            match outcome {
                StallOutcome::Retried(ask) => {
                    self.link().counters.add(MeshCounter::RepairsRetried, 1);
                    tracing::debug!(model = ask.model, peer = %ask.peer, "mesh: repair retried");
                    self.ask(ask);
                }
                StallOutcome::Abandoned(model) => {
                    self.link().counters.add(MeshCounter::RepairsAbandoned, 1);
                    tracing::info!(model, "mesh: repair abandoned until the next unknown path");
                }
            }
        }
    }
}

/// Accepts peers' streams, at most `MESH_INBOUND_STREAMS_MAX` at once; each is read by a
/// task of its own.
async fn accept_streams(
    listener: TcpListener,
    frames: mpsc::Sender<Frame>,
    auth: Authenticator,
    shared: Arc<Shared>,
) {
    let slots = Arc::new(Semaphore::new(MESH_INBOUND_STREAMS_MAX));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(REDIAL_AFTER).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(&shared, Refusal::StreamsFull);
            continue;
        };
        let (frames, auth, shared) = (frames.clone(), auth.clone(), shared.clone());
        tokio::spawn(async move {
            read_stream(stream, frames, auth, shared).await;
            drop(slot);
        });
    }
}

fn refuse(shared: &Shared, reason: Refusal) {
    if let Some(link) = shared.mesh.as_ref() {
        link.counters.refuse(reason);
    }
}

/// The acceptor's half of the handshake: the challenge out, the dialer's proof in, within
/// `MESH_HANDSHAKE_TIMEOUT`. `Err(None)`: the peer went away before answering (not counted).
async fn accept_handshake(
    stream: &mut TcpStream,
    auth: &Authenticator,
) -> Result<StreamOpen, Option<Refusal>> {
    let nonce = auth::fresh_nonce();
    let handshake = async {
        stream
            .write_all(&auth::challenge(&nonce))
            .await
            .map_err(|_| None)?;
        let mut proof = [0u8; TAG_BYTES];
        stream.read_exact(&mut proof).await.map_err(|_| None)?;
        if !auth.check_proof(&nonce, &proof) {
            return Err(Some(Refusal::Unauthenticated));
        }
        Ok(StreamOpen::new(auth.clone(), nonce))
    };
    match tokio::time::timeout(MESH_HANDSHAKE_TIMEOUT, handshake).await {
        Ok(result) => result,
        Err(_) => Err(Some(Refusal::Timeout)),
    }
}

/// Reads frames off one peer's stream until it closes, idles past `MESH_STREAM_IDLE_TIMEOUT`,
/// takes longer than `MESH_FRAME_READ_TIMEOUT` over a frame, or sends a frame that is too
/// large, does not check, does not decode, or names another sender than its first.
async fn read_stream(
    mut stream: TcpStream,
    frames: mpsc::Sender<Frame>,
    auth: Authenticator,
    shared: Arc<Shared>,
) {
    let mut open = match accept_handshake(&mut stream, &auth).await {
        Ok(open) => open,
        Err(reason) => return reason.into_iter().for_each(|r| refuse(&shared, r)),
    };
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut sender: Option<String> = None;
    loop {
        loop {
            match open.take_frame(&mut buffer) {
                Ok(Some(frame)) => {
                    match &sender {
                        Some(first) if *first != frame.sender => {
                            return refuse(&shared, Refusal::ForeignSender);
                        }
                        Some(_) => {}
                        None => sender = Some(frame.sender.clone()),
                    }
                    if frames.send(frame).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => return refuse_frame(&shared, e),
            }
        }
        if buffer.is_empty() && buffer.capacity() > READ_CHUNK_BYTES {
            // A large frame's room is not kept for the small ones that follow.
            buffer = Vec::new();
        }
        // Waiting for a frame to begin is idling; a frame begun must end in time.
        let (limit, reason) = if buffer.is_empty() {
            (MESH_STREAM_IDLE_TIMEOUT, Refusal::Idle)
        } else {
            (MESH_FRAME_READ_TIMEOUT, Refusal::Timeout)
        };
        let deadline = tokio::time::Instant::now() + limit;
        match tokio::time::timeout_at(deadline, read_more(&mut stream, &mut chunk, &mut buffer))
            .await
        {
            Err(_) => return refuse(&shared, reason),
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
        }
    }
}

/// Reads until at least one more byte is in `buffer`; the bytes read, 0 at the stream's end.
async fn read_more(
    stream: &mut TcpStream,
    chunk: &mut [u8],
    buffer: &mut Vec<u8>,
) -> io::Result<usize> {
    let n = stream.read(chunk).await?;
    buffer.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn refuse_frame(shared: &Shared, error: FrameError) {
    tracing::debug!("mesh: stream closed: {error}");
    match error {
        FrameError::TooLarge(_) => refuse(shared, Refusal::TooLarge),
        FrameError::Unauthenticated => refuse(shared, Refusal::Unauthenticated),
        FrameError::Malformed(_) => {
            if let Some(link) = shared.mesh.as_ref() {
                link.counters.add(MeshCounter::FramesMalformed, 1);
            }
        }
    }
}

/// The writer of one peer's outbound stream.
struct Writer {
    peer: SocketAddr,
    auth: Authenticator,
    /// Shared with the mesh loop's `PeerStream`: bytes queued and not yet taken.
    queued_bytes: Arc<AtomicUsize>,
    shared: Arc<Shared>,
}

impl Writer {
    /// Writes the peer's queued frames, dialing it (again) as needed, closing the stream when it
    /// idles; ends when the mesh loop drops the queue (the peer is down).
    async fn run(self, mut frames: mpsc::Receiver<Arc<[u8]>>) {
        let mut open: Option<(TcpStream, StreamSeal)> = None;
        loop {
            let next = if open.is_some() {
                tokio::time::timeout(MESH_STREAM_IDLE_TIMEOUT / 2, frames.recv()).await
            } else {
                Ok(frames.recv().await)
            };
            let bytes = match next {
                // Idle: closed before the peer's reader closes it.
                Err(_) => {
                    open = None;
                    continue;
                }
                Ok(None) => return,
                Ok(Some(bytes)) => bytes,
            };
            self.queued_bytes.fetch_sub(bytes.len(), Ordering::Relaxed);
            if open.is_none() {
                open = self.dial().await;
            }
            let Some((stream, seal)) = open.as_mut() else {
                // This frame is lost; the next one dials again after a pause.
                tokio::time::sleep(REDIAL_AFTER).await;
                continue;
            };
            let sealed = seal.seal(&bytes);
            match tokio::time::timeout(MESH_WRITE_TIMEOUT, stream.write_all(&sealed)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => open = None,
                Err(_) => {
                    refuse(&self.shared, Refusal::PeerBackedUp);
                    open = None;
                }
            }
        }
    }

    /// Connects to the peer and answers its challenge, within `MESH_HANDSHAKE_TIMEOUT`.
    async fn dial(&self) -> Option<(TcpStream, StreamSeal)> {
        let handshake = async {
            let mut stream = TcpStream::connect(self.peer).await.ok()?;
            let _ = stream.set_nodelay(true);
            let mut challenge = [0u8; CHALLENGE_BYTES];
            stream.read_exact(&mut challenge).await.ok()?;
            let nonce = auth::parse_challenge(&challenge)?;
            stream.write_all(&self.auth.proof(&nonce)).await.ok()?;
            Some((stream, StreamSeal::new(self.auth.clone(), nonce)))
        };
        tokio::time::timeout(MESH_HANDSHAKE_TIMEOUT, handshake)
            .await
            .ok()
            .flatten()
    }
}
