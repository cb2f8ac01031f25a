//! The mesh: several gateways that share what their string and token trees learn (the spec's
//! "Mesh State Synchronization"). This module is the mesh's logic without I/O; the thread that
//! runs it, its sockets and its runtime are `control::mesh_link`.
//!
//! - [`MeshArgs`] / [`MeshConfig`]: SMG's flags (`--enable-mesh`, `--mesh-host`, `--mesh-port`,
//!   `--mesh-advertise-host`, `--mesh-peer-urls`, `--mesh-server-name`), kvgate's
//!   `--mesh-secret-file`, and their validation: a gateway whose advertised address peers could
//!   not dial (unspecified) refuses to start.
//! - [`auth`]: the shared key's tags on every datagram and frame, checked before decoding.
//! - [`membership`]: who the peers are and whether they are alive, from foca (SWIM): joins,
//!   leaves, suspicion, failure, a restarted or paused gateway rejoining under a new incarnation.
//! - [`wire`]: the prost messages of `proto/mesh.proto` and their length-prefixed framing.
//! - [`paths`]: the paths this gateway knows by hash (its own dispatches, peers' deltas and
//!   what repairs taught it), the deltas of a gossip round, and the pages a repair serves.
//! - [`chains`]: token paths as chains of pages: a delta carries the pages after the deepest
//!   prefix its peer is believed to know, so a dispatch costs one delta per peer, not a repair.
//! - [`repair`]: one repair at a time per model: resumable, retried, abandoned.
//! - [`text`]: text paths shared as the hashes of their text's pages, in the token path's form,
//!   so a peer matches text it never saw and no client text leaves a gateway.
//! - [`MeshLink`]: what the control core and the mesh thread share: two bounded queues (local
//!   inserts out, peers' inserts in) and the counters; a full queue drops and counts, never
//!   waits.
//!
//! - [`models`]: the models a peer may name (those this gateway serves), bounded.
//!
//! Errors: a frame that does not decode is dropped and counted; what is refused (a tag that
//! does not check, a sender that is not a member, an unsolicited repair page, a model not
//! served, a cap reached) is counted by [`Refusal`]; a peer that cannot be reached is SWIM's
//! business (it is suspected, then declared down). Nothing here answers a client.

pub mod auth;
pub mod chains;
pub mod membership;
pub mod models;
pub mod paths;
pub mod repair;
pub mod text;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use clap::Args;
use crossbeam_queue::ArrayQueue;

use crate::error::FlagError;
use crate::index::{Namespace, TreeKind};
use crate::limits::{MESH_INBOUND_QUEUE_CAPACITY, MESH_OUTBOUND_QUEUE_CAPACITY, MESH_PEERS_MAX};
use crate::policy::KeyData;
use crate::workers::spec::resolve_flag;

/// SMG's default mesh port.
pub const MESH_PORT_DEFAULT: u16 = 39527;

/// The mesh flags, as clap parses them (SMG's names and defaults).
#[derive(Debug, Clone, Args)]
pub struct MeshArgs {
    /// Share tree inserts with other gateways (mesh HA). Off: this gateway learns alone.
    #[arg(long = "enable-mesh")]
    pub enable_mesh: bool,
    /// Address the mesh listens on (UDP for membership, TCP for deltas and repairs).
    #[arg(long = "mesh-host", default_value = "0.0.0.0")]
    pub mesh_host: String,
    /// Port the mesh listens on, UDP and TCP.
    #[arg(long = "mesh-port", default_value_t = MESH_PORT_DEFAULT)]
    pub mesh_port: u16,
    /// Address peers reach this gateway at; default: --mesh-host. Required when --mesh-host is
    /// an unspecified address (0.0.0.0, ::): peers cannot dial it.
    #[arg(long = "mesh-advertise-host")]
    pub mesh_advertise_host: Option<String>,
    /// Gateways to join at start, `HOST:PORT` (their mesh ports); the rest are learned from them.
    #[arg(long = "mesh-peer-urls", num_args = 0.., value_name = "HOST:PORT")]
    pub mesh_peer_urls: Vec<String>,
    /// This gateway's name in the mesh's logs; default: its advertised `host:port`.
    #[arg(long = "mesh-server-name")]
    pub mesh_server_name: Option<String>,
    /// File holding the key every gateway of the mesh shares (at least 16 bytes); every mesh
    /// datagram and frame is authenticated with it. Without it the mesh is unauthenticated.
    #[arg(long = "mesh-secret-file", value_name = "PATH")]
    pub mesh_secret_file: Option<PathBuf>,
}

/// The validated mesh configuration (present only with `--enable-mesh`).
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// Where the mesh binds (UDP and TCP).
    pub bind_addr: SocketAddr,
    /// Where peers reach this gateway.
    pub advertise_addr: SocketAddr,
    /// Gateways to announce to at start and while they are not alive.
    pub peers: Vec<SocketAddr>,
    /// This gateway's name in logs.
    pub server_name: String,
    /// The shared key (`--mesh-secret-file`); `None`: the mesh runs unauthenticated.
    pub secret: Option<auth::MeshKey>,
}

impl MeshArgs {
    /// The mesh configuration, `None` without `--enable-mesh`.
    pub fn config(&self) -> Result<Option<MeshConfig>, FlagError> {
        if !self.enable_mesh {
            return Ok(None);
        }
        if self.mesh_port == 0 {
            return Err(FlagError::new("--mesh-port", "must be 1..=65535"));
        }
        let bind_addr = resolve_flag("--mesh-host", &self.mesh_host, self.mesh_port)?;
        let advertise_addr = match &self.mesh_advertise_host {
            Some(host) => resolve_flag("--mesh-advertise-host", host, self.mesh_port)?,
            None => bind_addr,
        };
        if advertise_addr.ip().is_unspecified() {
            // SMG refuses too: peers would dial an address that reaches no one.
            let message = format!(
                "peers cannot dial {}: give the address they reach this gateway at \
                 (--mesh-host {} is unspecified)",
                advertise_addr.ip(),
                self.mesh_host
            );
            return Err(FlagError::new("--mesh-advertise-host", message));
        }
        if self.mesh_peer_urls.len() > MESH_PEERS_MAX {
            let message = format!("at most {MESH_PEERS_MAX} peers");
            return Err(FlagError::new("--mesh-peer-urls", message));
        }
        let mut peers = Vec::with_capacity(self.mesh_peer_urls.len());
        for url in &self.mesh_peer_urls {
            let peer = resolve_peer(url)?;
            if peer != advertise_addr && !peers.contains(&peer) {
                peers.push(peer);
            }
        }
        let server_name = match &self.mesh_server_name {
            Some(name) if name.trim().is_empty() => {
                return Err(FlagError::new("--mesh-server-name", "must not be empty"));
            }
            Some(name) => name.clone(),
            None => advertise_addr.to_string(),
        };
        let secret = match &self.mesh_secret_file {
            Some(path) => Some(
                auth::MeshKey::from_file(path)
                    .map_err(|e| FlagError::new("--mesh-secret-file", e))?,
            ),
            None => None,
        };
        Ok(Some(MeshConfig {
            bind_addr,
            advertise_addr,
            peers,
            server_name,
            secret,
        }))
    }
}

fn resolve_peer(url: &str) -> Result<SocketAddr, FlagError> {
    let flag = "--mesh-peer-urls";
    let Some((host, port)) = url.rsplit_once(':') else {
        return Err(FlagError::new(flag, format!("{url}: expected HOST:PORT")));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match port.parse::<u16>() {
        Ok(port) if port > 0 => resolve_flag(flag, host, port),
        _ => Err(FlagError::new(flag, format!("{url}: bad port"))),
    }
}

/// Whether a worker may be named to peers: host-local workers (`ipc://`) never are.
pub fn is_shareable_worker(url: &str) -> bool {
    !url.starts_with("ipc://")
}

/// A tree insert this gateway made, for the mesh to broadcast (control core → mesh thread).
#[derive(Clone, Debug)]
pub struct LocalInsert {
    /// Model and partition.
    pub namespace: Namespace,
    /// The inserted key (text or page hashes), shared with the record: no copy.
    pub key: KeyData,
    /// The worker, by URL.
    pub worker_url: Arc<str>,
}

/// A tree insert a peer taught this gateway (mesh thread → control core).
#[derive(Clone, Debug)]
pub struct RemoteInsert {
    /// Model and partition.
    pub namespace: Namespace,
    /// The path to insert.
    pub key: KeyData,
    /// The worker, by URL; the control core inserts it only if it routes to that URL too.
    pub worker_url: Arc<str>,
}

/// The mesh's counters, one set per gateway (written by the mesh thread and the control core).
#[derive(Debug, Default)]
pub struct MeshCounters {
    counts: [AtomicU64; MeshCounter::COUNT],
    refusals: [AtomicU64; Refusal::ALL.len()],
    /// 1 when the mesh runs with a secret key (`--mesh-secret-file`).
    authenticated: AtomicU64,
    /// Peers by SWIM state, published each round.
    peers: [AtomicU64; 3],
}

/// The mesh's counters (`kvgate_mesh_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeshCounter {
    /// Deltas sent, counted once per delta and peer.
    DeltasSent,
    /// Deltas received from peers.
    DeltasReceived,
    /// Deltas not delivered: a batch dropped because a peer's stream was backed up, or an
    /// insert the control core's queue had no room for.
    DeltasDropped,
    /// Repairs begun (a delta named a path this gateway does not know, or a catch-up).
    RepairsStarted,
    /// Repairs asked for because a delta named a path this gateway could not rebuild (each
    /// ask, whether it started a repair or was added to the running one).
    RepairCauseUnknownPath,
    /// Repairs asked for as a catch-up: the first delta of a model from a peer since either
    /// joined or came back.
    RepairCauseCatchUp,
    /// Peers declared down (or left); each later comes back through a catch-up repair.
    PeersDown,
    /// Stalled repairs asked again (another peer when there is one).
    RepairsRetried,
    /// Repairs that received their model's last page.
    RepairsCompleted,
    /// Repairs given up after their retries.
    RepairsAbandoned,
    /// Peers' inserts the control core applied to its trees.
    InsertsApplied,
    /// Frames that did not decode.
    FramesMalformed,
    /// Bytes of frames sent (sealed: with their length and tag).
    BytesSent,
    /// Of those, bytes of repair requests and pages (the rest are deltas).
    BytesSentRepair,
    /// Page hashes deltas carried, counted once per delta and peer.
    PagesSent,
    /// Time the control core spent applying peers' inserts to its trees, microseconds.
    ApplyMicros,
    /// Gossip rounds run.
    SyncRounds,
    /// Total duration of the gossip rounds, microseconds.
    SyncRoundMicros,
}

impl MeshCounter {
    const COUNT: usize = 18;
}

/// What the mesh refused, and which cap was reached (`kvgate_mesh_refused_total{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A datagram or frame whose tag does not check, or a stream without a valid proof: no
    /// key, a wrong key, altered or replayed bytes.
    Unauthenticated,
    /// A datagram sent outside `MESH_DATAGRAM_AGE_MAX` of this gateway's clock.
    Stale,
    /// A frame whose sender is not a current member.
    NotMember,
    /// A frame naming another sender than the earlier frames of its stream.
    ForeignSender,
    /// A repair page for no repair this gateway asked of that peer.
    UnsolicitedRepair,
    /// A frame naming a model this gateway does not serve, or past `MESH_MODELS_MAX`.
    UnknownModel,
    /// A frame longer than `MESH_FRAME_BYTES_MAX` (its stream is closed).
    TooLarge,
    /// A stream that did not finish its proof or a frame in time (`MESH_HANDSHAKE_TIMEOUT`,
    /// `MESH_FRAME_READ_TIMEOUT`).
    Timeout,
    /// A stream closed after `MESH_STREAM_IDLE_TIMEOUT` without a frame.
    Idle,
    /// A connection over `MESH_INBOUND_STREAMS_MAX`, closed at accept.
    StreamsFull,
    /// A frame not queued: its peer's stream held `MESH_PEER_QUEUE_BYTES_MAX` or
    /// `MESH_PEER_QUEUE_FRAMES` already, or did not take a write in `MESH_WRITE_TIMEOUT`.
    PeerBackedUp,
    /// A text path of more than `MESH_TEXT_PAGES_MAX` pages, shared cut there (`text`).
    TextPagesCapped,
    /// The known token paths reached `MESH_CHAIN_PATHS_MAX` or `MESH_CHAIN_PAGES_MAX` and were
    /// cleared whole (`chains::PathChains`): peers' deltas on forgotten paths then repair.
    ChainsCleared,
}

impl Refusal {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Refusal; 13] = [
        Refusal::Unauthenticated,
        Refusal::Stale,
        Refusal::NotMember,
        Refusal::ForeignSender,
        Refusal::UnsolicitedRepair,
        Refusal::UnknownModel,
        Refusal::TooLarge,
        Refusal::Timeout,
        Refusal::Idle,
        Refusal::StreamsFull,
        Refusal::PeerBackedUp,
        Refusal::TextPagesCapped,
        Refusal::ChainsCleared,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::Stale => "stale",
            Refusal::NotMember => "not_member",
            Refusal::ForeignSender => "foreign_sender",
            Refusal::UnsolicitedRepair => "unsolicited_repair",
            Refusal::UnknownModel => "unknown_model",
            Refusal::TooLarge => "too_large",
            Refusal::Timeout => "timeout",
            Refusal::Idle => "idle",
            Refusal::StreamsFull => "streams_full",
            Refusal::PeerBackedUp => "peer_backed_up",
            Refusal::TextPagesCapped => "text_pages_capped",
            Refusal::ChainsCleared => "chains_cleared",
        }
    }
}

/// SWIM states of a peer, for the peers gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Answering probes.
    Alive,
    /// Missed a probe; not yet declared down.
    Suspect,
    /// Declared down (or left).
    Down,
}

impl PeerState {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            PeerState::Alive => "alive",
            PeerState::Suspect => "suspect",
            PeerState::Down => "down",
        }
    }
}

impl MeshCounters {
    /// Adds `n` to `counter`.
    pub fn add(&self, counter: MeshCounter, n: u64) {
        self.counts[counter as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The value of `counter`.
    pub fn get(&self, counter: MeshCounter) -> u64 {
        self.counts[counter as usize].load(Ordering::Relaxed)
    }

    /// Counts one refusal.
    pub fn refuse(&self, reason: Refusal) {
        self.refusals[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals for `reason`.
    pub fn refused(&self, reason: Refusal) -> u64 {
        self.refusals[reason as usize].load(Ordering::Relaxed)
    }

    /// Publishes whether the mesh runs with a secret key.
    pub fn set_authenticated(&self, authenticated: bool) {
        self.authenticated
            .store(u64::from(authenticated), Ordering::Relaxed);
    }

    /// 1 when the mesh runs with a secret key, else 0.
    pub fn authenticated(&self) -> u64 {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// Publishes how many peers are in each state.
    pub fn set_peers(&self, alive: u64, suspect: u64, down: u64) {
        for (slot, n) in self.peers.iter().zip([alive, suspect, down]) {
            slot.store(n, Ordering::Relaxed);
        }
    }

    /// Peers in `state`.
    pub fn peers(&self, state: PeerState) -> u64 {
        self.peers[state as usize].load(Ordering::Relaxed)
    }
}

/// What the control core and the mesh thread share.
#[derive(Debug)]
pub struct MeshLink {
    /// This gateway's inserts, for the next gossip round.
    pub outbound: ArrayQueue<LocalInsert>,
    /// Peers' inserts, for the control core to apply.
    pub inbound: ArrayQueue<RemoteInsert>,
    /// The counters.
    pub counters: MeshCounters,
}

impl Default for MeshLink {
    fn default() -> Self {
        MeshLink {
            outbound: ArrayQueue::new(MESH_OUTBOUND_QUEUE_CAPACITY),
            inbound: ArrayQueue::new(MESH_INBOUND_QUEUE_CAPACITY),
            counters: MeshCounters::default(),
        }
    }
}

/// The tree kind of a key, `None` for the hash index's heads (never shared).
pub fn tree_kind(key: &KeyData) -> Option<TreeKind> {
    match key {
        KeyData::Text(_) => Some(TreeKind::Text),
        KeyData::Tokens(_) => Some(TreeKind::Tokens),
        KeyData::Heads(_) => None,
    }
}

#[cfg(test)]
mod tests;
