//! Membership and failure detection: foca's SWIM, without I/O. The caller feeds it datagrams
//! and the clock, and sends what it says to send ([`Membership::take_sends`]).
//!
//! A gateway's identity ([`PeerId`]) is its advertised address and an incarnation (its start
//! time in milliseconds); a gateway declared down while alive (a pause, a partition) renews the
//! incarnation and rejoins at once, and a restarted one joins under a newer incarnation: the
//! newer wins an address conflict.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use foca::{
    AccumulatingRuntime, Config, Foca, Identity, OwnedNotification, PostcardCodec, State, Timer,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::PeerState;

/// A gateway in the mesh: where it is, and which run of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerId {
    /// Its advertised mesh address (UDP for SWIM, TCP for frames).
    pub addr: SocketAddr,
    /// Its start time (ms since the epoch), bumped on each rejoin.
    pub incarnation: u64,
}

impl Identity for PeerId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(PeerId {
            addr: self.addr,
            incarnation: self.incarnation.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.incarnation > adversary.incarnation
    }
}

/// A membership change, one log line each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A peer joined (or came back).
    Up(PeerId),
    /// A peer was declared down, or left.
    Down(PeerId),
    /// A peer restarted or rejoined under a new incarnation.
    Renamed(PeerId, PeerId),
    /// This gateway was declared down and rejoined under a new incarnation.
    Rejoined(PeerId),
    /// This gateway reaches at least one peer.
    Active,
    /// Every known peer is down or gone.
    Idle,
}

type Swim = Foca<PeerId, PostcardCodec, StdRng, foca::NoCustomBroadcast>;

/// SWIM with its timers and its outbox.
pub struct Membership {
    swim: Swim,
    runtime: AccumulatingRuntime<PeerId>,
    timers: Vec<(Instant, Timer<PeerId>)>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("me", self.swim.identity())
            .field("members", &self.swim.num_members())
            .finish()
    }
}

impl Membership {
    /// This gateway at `addr`, alone until it announces itself.
    pub fn new(addr: SocketAddr) -> Self {
        let incarnation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let me = PeerId { addr, incarnation };
        let size = NonZeroU32::new(8).unwrap_or(NonZeroU32::MIN);
        let mut config = Config::new_lan(size);
        // Deltas ride frames, not SWIM: gossip only membership, a little more often than LAN
        // defaults so a new gateway is known within a round or two.
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(5),
            num_members: std::num::NonZeroUsize::MIN,
        });
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: Duration::from_secs(5),
            num_members: std::num::NonZeroUsize::MIN.saturating_add(1),
        });
        let swim = Foca::new(me, config, StdRng::from_os_rng(), PostcardCodec);
        Membership {
            swim,
            runtime: AccumulatingRuntime::new(),
            timers: Vec::new(),
        }
    }

    /// This gateway's current identity.
    pub fn me(&self) -> &PeerId {
        self.swim.identity()
    }

    /// Asks the gateway at `addr` to let this one in.
    pub fn announce(&mut self, addr: SocketAddr, now: Instant) {
        let dst = PeerId {
            addr,
            incarnation: 0,
        };
        if let Err(e) = self.swim.announce(dst, &mut self.runtime) {
            tracing::debug!("mesh: announce to {addr}: {e}");
        }
        self.collect_timers(now);
    }

    /// A SWIM datagram arrived.
    pub fn handle_datagram(&mut self, data: &[u8], now: Instant) {
        if let Err(e) = self.swim.handle_data(data, &mut self.runtime) {
            tracing::debug!("mesh: SWIM datagram refused: {e}");
        }
        self.collect_timers(now);
    }

    /// Fires the timers that are due.
    pub fn tick(&mut self, now: Instant) {
        let mut due = Vec::new();
        self.timers.retain(|(at, timer)| {
            if *at <= now {
                due.push(timer.clone());
                false
            } else {
                true
            }
        });
        for timer in due {
            if let Err(e) = self.swim.handle_timer(timer, &mut self.runtime) {
                tracing::debug!("mesh: SWIM timer: {e}");
            }
        }
        self.collect_timers(now);
    }

    fn collect_timers(&mut self, now: Instant) {
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.timers.push((now + after, timer));
        }
    }

    /// Tells the peers this gateway leaves (shutdown); the datagrams follow in `take_sends`.
    pub fn leave(&mut self) -> Result<(), foca::Error> {
        self.swim.leave_cluster(&mut self.runtime)
    }

    /// Datagrams to send: (address, bytes).
    pub fn take_sends(&mut self) -> Vec<(SocketAddr, Bytes)> {
        let mut sends = Vec::new();
        while let Some((to, data)) = self.runtime.to_send() {
            sends.push((to.addr, data));
        }
        sends
    }

    /// Membership changes since the last call.
    pub fn take_changes(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        while let Some(notification) = self.runtime.to_notify() {
            let change = match notification {
                OwnedNotification::MemberUp(id) => Change::Up(id),
                OwnedNotification::MemberDown(id) => Change::Down(id),
                OwnedNotification::Rename(old, new) => Change::Renamed(old, new),
                OwnedNotification::Rejoin(id) => Change::Rejoined(id),
                OwnedNotification::Active => Change::Active,
                OwnedNotification::Idle => Change::Idle,
                // Identities renew themselves: foca rejoins instead of going defunct.
                OwnedNotification::Defunct => continue,
            };
            changes.push(change);
        }
        changes
    }

    /// The addresses of the peers taken as alive (alive or suspect).
    pub fn live_peers(&self) -> Vec<SocketAddr> {
        self.swim.iter_members().map(|m| m.id().addr).collect()
    }

    /// Whether a peer at `addr` is alive or suspect.
    pub fn is_live(&self, addr: SocketAddr) -> bool {
        self.swim.iter_members().any(|m| m.id().addr == addr)
    }

    /// Peers by state: alive, suspect, down (down ones foca still remembers).
    pub fn counts(&self) -> [(PeerState, u64); 3] {
        let mut counts = [0u64; 3];
        for member in self.swim.iter_membership_state() {
            let at = match member.state() {
                State::Alive => 0,
                State::Suspect => 1,
                State::Down => 2,
            };
            counts[at] += 1;
        }
        [
            (PeerState::Alive, counts[0]),
            (PeerState::Suspect, counts[1]),
            (PeerState::Down, counts[2]),
        ]
    }
}
