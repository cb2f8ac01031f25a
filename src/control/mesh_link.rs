//! The mesh thread (`kvgate-mesh`, `--enable-mesh`): a tokio current-thread runtime that runs
//! `mesh`'s logic over sockets. It never touches the index: the control core hands it its
//! inserts and applies the peers' through `Shared::mesh` (two bounded queues), so neither
//! thread waits for the other and no data core ever sees the mesh.
//!
//! - UDP on `--mesh-port`: foca's SWIM datagrams (`mesh::membership`).
//! - TCP on `--mesh-port`: frames (`mesh::wire`). Each live peer has one outbound stream, fed
//!   by a bounded queue of encoded frames (`MESH_PEER_QUEUE_FRAMES`): a stream that backs up
//!   (a slow or paused peer) drops whole batches, counted, and the round goes on. Inbound
//!   connections are read by one task each; a frame that does not decode closes its stream.
//! - Every `MESH_ROUND` (a gossip round): the control core's inserts since the last round are
//!   learned (`KnownPaths`) and sent once, batched per model (`DeltaRound`), to every live peer.
//!   Every tick: SWIM timers, repair stalls; every second: announce to the `--mesh-peer-urls`
//!   not alive (a restarted or partitioned peer comes back), the peer gauges.
//!
//! One log line per membership change (info), as the issue asks.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket as StdUdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;

use crate::limits::{
    MESH_KNOWN_BYTES_MAX, MESH_KNOWN_PATHS_MAX, MESH_PEER_QUEUE_FRAMES, MESH_ROUND,
};
use crate::mesh::membership::{Change, Membership};
use crate::mesh::paths::{entry_key, Batched, Change as PathChange, DeltaRound, KnownPaths};
use crate::mesh::repair::{Ask, PageOutcome, Repairs, StallOutcome};
use crate::mesh::wire::{self, frame::Body, DeltaBatch, Frame, RepairPage, RepairRequest};
use crate::mesh::{
    is_shareable_worker, tree_kind, MeshConfig, MeshCounter, MeshLink, PeerState, RemoteInsert,
};
use crate::shared::Shared;

/// How often the thread wakes for SWIM timers, stalls and shutdown.
const TICK: Duration = Duration::from_millis(20);
/// How often the `--mesh-peer-urls` that are not alive are announced to, and gauges published.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);
/// Frames from all inbound streams waiting for the mesh loop; a full queue pauses the readers
/// (TCP pushes back, and the sending peer's own queue drops).
const INBOUND_FRAMES: usize = 256;
/// How long an outbound stream waits before it dials a peer again.
const REDIAL_AFTER: Duration = Duration::from_millis(200);
/// Largest SWIM datagram read.
const DATAGRAM_BYTES_MAX: usize = 65_536;

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
        let (frames_tx, frames_rx) = mpsc::channel(INBOUND_FRAMES);
        let accept = tokio::spawn(accept_streams(tcp, frames_tx, shared.clone()));
        let mut node = Node::new(config, shared);
        node.run(udp, frames_rx).await;
        accept.abort();
    });
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
    /// One outbound stream per live peer, by address.
    streams: HashMap<SocketAddr, mpsc::Sender<Arc<[u8]>>>,
}

impl Node {
    fn new(config: MeshConfig, shared: Arc<Shared>) -> Node {
        let membership = Membership::new(config.advertise_addr);
        tracing::info!(
            name = config.server_name,
            addr = %config.advertise_addr,
            peers = config.peers.len(),
            "mesh: started"
        );
        Node {
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
        let mut datagram = vec![0u8; DATAGRAM_BYTES_MAX];
        let mut tick = tokio::time::interval(TICK);
        let (mut next_round, mut next_announce) = (Instant::now(), Instant::now());
        while !self.shared.is_shutting_down() {
            tokio::select! {
                received = udp.recv_from(&mut datagram) => {
                    if let Ok((len, _)) = received {
                        self.membership.handle_datagram(&datagram[..len], Instant::now());
                    }
                }
                Some(frame) = frames.recv() => self.handle_frame(frame),
                _ = tick.tick() => {
                    let now = Instant::now();
                    self.membership.tick(now);
                    if now >= next_announce {
                        next_announce = now + ANNOUNCE_EVERY;
                        self.announce_to_absent_peers(now);
                        self.publish_peer_gauges();
                    }
                    if now >= next_round {
                        next_round = now + MESH_ROUND;
                        self.gossip_round();
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

    /// Sends SWIM's datagrams and acts on membership changes (one log line each).
    async fn flush_membership(&mut self, udp: &UdpSocket) {
        for (to, data) in self.membership.take_sends() {
            // UDP is best effort; SWIM counts on losses.
            let _ = udp.send_to(&data, to).await;
        }
        for change in self.membership.take_changes() {
            match change {
                Change::Up(peer) => {
                    tracing::info!(peer = %peer.addr, incarnation = peer.incarnation, "mesh: peer up");
                    self.open_stream(peer.addr);
                }
                Change::Down(peer) => {
                    tracing::info!(peer = %peer.addr, incarnation = peer.incarnation, "mesh: peer down");
                    self.streams.remove(&peer.addr);
                }
                Change::Renamed(old, new) => {
                    tracing::info!(
                        peer = %new.addr,
                        from = old.incarnation,
                        to = new.incarnation,
                        "mesh: peer rejoined under a new incarnation"
                    );
                    self.open_stream(new.addr);
                }
                Change::Rejoined(me) => tracing::info!(
                    incarnation = me.incarnation,
                    "mesh: this gateway was declared down and rejoined"
                ),
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

    fn open_stream(&mut self, addr: SocketAddr) -> &mpsc::Sender<Arc<[u8]>> {
        self.streams.entry(addr).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(MESH_PEER_QUEUE_FRAMES);
            tokio::spawn(write_stream(addr, rx));
            tx
        })
    }

    /// Queues `bytes` for `peer`'s stream; `false` when it is backed up (the caller counts).
    fn send(&mut self, peer: SocketAddr, bytes: Arc<[u8]>) -> bool {
        let len = bytes.len() as u64;
        let sent = self.open_stream(peer).try_send(bytes).is_ok();
        if sent {
            self.link().counters.add(MeshCounter::BytesSent, len);
        }
        sent
    }

    /// One gossip round: this gateway's inserts since the last, learned and sent once.
    fn gossip_round(&mut self) {
        let started = Instant::now();
        let shared = self.shared.clone();
        let Some(link) = shared.mesh.as_ref() else {
            return;
        };
        let mut dropped = 0u64;
        while let Some(insert) = link.outbound.pop() {
            let Some(kind) = tree_kind(&insert.key) else {
                continue;
            };
            let model = insert.namespace.model;
            let learned = self
                .known
                .learn(insert.namespace, insert.key, &insert.worker_url);
            if let Some((hash, _)) = learned {
                if self.round.add(model, kind, hash, &insert.worker_url) == Batched::Full {
                    dropped += 1;
                }
            }
        }
        let batches = self.round.take();
        let peers: Vec<SocketAddr> = self.membership.live_peers();
        for batch in batches {
            let deltas = batch.deltas.len() as u64;
            let bytes: Arc<[u8]> = wire::encode(&wire::frame(&self.me, Body::Deltas(batch))).into();
            for &peer in &peers {
                if self.send(peer, bytes.clone()) {
                    link.counters.add(MeshCounter::DeltasSent, deltas);
                } else {
                    dropped += deltas;
                }
            }
        }
        link.counters.add(MeshCounter::DeltasDropped, dropped);
        link.counters.add(MeshCounter::SyncRounds, 1);
        let micros = started.elapsed().as_micros() as u64;
        link.counters.add(MeshCounter::SyncRoundMicros, micros);
    }

    fn handle_frame(&mut self, frame: Frame) {
        let sender = frame.sender.parse::<SocketAddr>().ok();
        match frame.body {
            Some(Body::Deltas(batch)) => self.apply_deltas(sender, batch),
            Some(Body::RepairRequest(request)) => {
                if let Some(sender) = sender {
                    self.serve_repair(sender, request);
                }
            }
            Some(Body::RepairPage(page)) => self.apply_repair_page(sender, page),
            // A body of a newer version: skipped (the compatibility rule of mesh.proto).
            None => {}
        }
    }

    fn apply_deltas(&mut self, sender: Option<SocketAddr>, batch: DeltaBatch) {
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
        let mut unknown = false;
        for delta in &batch.deltas {
            let Some(url) = urls.get(delta.worker as usize) else {
                continue;
            };
            if !is_shareable_worker(url) {
                continue;
            }
            // A known holder is inserted again all the same: the peer just dispatched there, and
            // the insert refreshes the tree's recency (or restores what it evicted).
            match self.known.name_holder(batch.model, delta.path_hash, url) {
                Some((path, _)) => {
                    let insert = RemoteInsert {
                        namespace: path.namespace,
                        key: path.key.clone(),
                        worker_url: url.clone(),
                    };
                    if link.inbound.push(insert).is_err() {
                        link.counters.add(MeshCounter::DeltasDropped, 1);
                    }
                }
                None => unknown = true,
            }
        }
        if unknown {
            let live = self.membership.live_peers();
            if let Some(ask) = self
                .repairs
                .start(batch.model, sender, &live, Instant::now())
            {
                link.counters.add(MeshCounter::RepairsStarted, 1);
                tracing::debug!(model = batch.model, peer = %ask.peer, "mesh: repair started");
                self.ask(ask);
            }
        }
    }

    fn ask(&mut self, ask: Ask) {
        let request = RepairRequest {
            model: ask.model,
            repair_id: ask.repair_id,
            after: ask.after,
            epoch: ask.epoch,
        };
        let bytes = wire::encode(&wire::frame(&self.me, Body::RepairRequest(request))).into();
        // A request lost to a backed-up stream stalls, and the stall retries it.
        let _ = self.send(ask.peer, bytes);
    }

    fn serve_repair(&mut self, peer: SocketAddr, request: RepairRequest) {
        let (model, id) = (request.model, request.repair_id);
        let page = self.known.page(model, id, request.epoch, request.after);
        let bytes = wire::encode(&wire::frame(&self.me, Body::RepairPage(page))).into();
        let _ = self.send(peer, bytes);
    }

    fn apply_repair_page(&mut self, sender: Option<SocketAddr>, page: RepairPage) {
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
                if let Some(ask) = again
                    .then(|| self.repairs.start(page.model, sender, &live, now))
                    .flatten()
                {
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

/// Accepts peers' streams; each is read by a task of its own.
async fn accept_streams(listener: TcpListener, frames: mpsc::Sender<Frame>, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(REDIAL_AFTER).await;
            continue;
        };
        tokio::spawn(read_stream(stream, frames.clone(), shared.clone()));
    }
}

/// Reads frames off one peer's stream until it closes or sends one that does not decode.
async fn read_stream(mut stream: TcpStream, frames: mpsc::Sender<Frame>, shared: Arc<Shared>) {
    let mut buffer = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        loop {
            match wire::take_frame(&mut buffer) {
                Ok(Some(frame)) => {
                    if frames.send(frame).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if let Some(link) = shared.mesh.as_ref() {
                        link.counters.add(MeshCounter::FramesMalformed, 1);
                    }
                    tracing::debug!("mesh: stream closed: {e}");
                    return;
                }
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Writes one peer's queued frames, dialing it (again) as needed; ends when the peer is down.
async fn write_stream(peer: SocketAddr, mut frames: mpsc::Receiver<Arc<[u8]>>) {
    let mut stream: Option<TcpStream> = None;
    while let Some(bytes) = frames.recv().await {
        if stream.is_none() {
            match tokio::time::timeout(REDIAL_AFTER * 5, TcpStream::connect(peer)).await {
                Ok(Ok(connected)) => {
                    let _ = connected.set_nodelay(true);
                    stream = Some(connected);
                }
                // This frame is lost; the next one dials again after a pause.
                _ => {
                    tokio::time::sleep(REDIAL_AFTER).await;
                    continue;
                }
            }
        }
        if let Some(open) = stream.as_mut() {
            if open.write_all(&bytes).await.is_err() {
                stream = None;
            }
        }
    }
}
