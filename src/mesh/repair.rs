//! Repairs: a gateway that hears of a path it cannot rebuild (a text path, a token path on a
//! prefix it does not know), or hears a model from a peer for the first time since one of them
//! joined or came back, asks one live peer for that model's paths, page by page (the spec's
//! repair), resuming after the last path it received from that
//! peer (`KnownPaths`'s sequence numbers): a later repair sends only what changed since. The first ask goes to the peer whose delta named the
//! path when it is live (the spec says a random live peer; with three gateways that random peer
//! has often heard the same delta and knows no more), retries to random others. One repair per model at a time. A repair resumes
//! where its last page ended; one that makes no progress for `MESH_REPAIR_STALL` is retried,
//! preferably with another peer, up to `MESH_REPAIR_RETRIES` times, then abandoned until the
//! next unknown path. Pure state: the caller sends the requests and counts.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Instant;

use crate::limits::{MESH_REPAIR_MARKS_MAX, MESH_REPAIR_RETRIES, MESH_REPAIR_STALL};

/// A request to send: ask `peer` for `model`'s page after `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The peer asked.
    pub peer: SocketAddr,
    /// The model.
    pub model: u64,
    /// The repair's id (pages of older tries are ignored).
    pub repair_id: u64,
    /// The last sequence number received from this peer for this model.
    pub after: u64,
    /// The peer's epoch `after` counts in.
    pub epoch: u64,
}

/// What a page meant for its repair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageOutcome {
    /// Not the page of a running repair (late, or of an abandoned try): ignored.
    Stale,
    /// More pages follow: ask for the next.
    Next(Ask),
    /// The model's last page. `again`: a delta named an unknown path while it ran, and the
    /// peer may have served its pages before it learned that path: the caller repairs again.
    Completed {
        /// Repair once more.
        again: bool,
    },
}

/// What a stall check decided for one repair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallOutcome {
    /// Asked again (another peer when there is one).
    Retried(Ask),
    /// Out of retries, or no live peer: given up.
    Abandoned(u64),
}

#[derive(Clone, Copy, Debug)]
struct Repair {
    id: u64,
    peer: SocketAddr,
    after: u64,
    epoch: u64,
    progress_at: Instant,
    retries: u32,
    /// A delta named an unknown path while this repair ran.
    again: bool,
}

/// The running repairs, by model.
#[derive(Debug, Default)]
pub struct Repairs {
    running: HashMap<u64, Repair>,
    next_id: u64,
    /// Per peer and model: the epoch and last sequence number received, where the next repair
    /// from that peer resumes.
    marks: HashMap<(SocketAddr, u64), (u64, u64)>,
    /// Peer and model pairs heard from since the peer came up: the first delta of each starts
    /// a catch-up repair (this gateway, or the peer, joined or came back).
    heard: HashSet<(SocketAddr, u64)>,
}

impl Repairs {
    /// Repairs running.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Starts `model`'s repair, unless one runs or no peer is live: with `named_by`, the live
    /// peer whose delta named the unknown path (it knows that path; a random peer may have
    /// heard the same delta and know no more than this gateway), else a random live peer.
    pub fn start(
        &mut self,
        model: u64,
        named_by: Option<SocketAddr>,
        live: &[SocketAddr],
        now: Instant,
    ) -> Option<Ask> {
        if let Some(running) = self.running.get_mut(&model) {
            running.again = true;
            return None;
        }
        if live.is_empty() {
            return None;
        }
        let peer = match named_by {
            Some(peer) if live.contains(&peer) => peer,
            _ => live[fastrand::usize(..live.len())],
        };
        self.next_id += 1;
        let (epoch, after) = self.mark(peer, model);
        let repair = Repair {
            id: self.next_id,
            peer,
            after,
            epoch,
            progress_at: now,
            retries: 0,
            again: false,
        };
        self.running.insert(model, repair);
        Some(ask(model, &repair))
    }

    /// Whether a page of `model`'s repair `repair_id` from `peer` is one this gateway asked
    /// for: its repair runs, under that id, asked of that peer. Anything else is refused
    /// before a byte of it is applied.
    pub fn expects(&self, model: u64, repair_id: u64, peer: SocketAddr) -> bool {
        self.running
            .get(&model)
            .is_some_and(|r| r.id == repair_id && r.peer == peer)
    }

    /// Whether this is the first delta of `model` from `peer` since it came up: then this
    /// gateway repairs `model` from it once, to catch up on what it missed while one of the two
    /// was away (deltas carry pages, so nothing else asks for a repair).
    pub fn first_heard(&mut self, peer: SocketAddr, model: u64) -> bool {
        if self.heard.len() >= MESH_REPAIR_MARKS_MAX {
            self.heard.clear();
        }
        self.heard.insert((peer, model))
    }

    /// Forgets what was heard from `peer` (it left, was declared down, or came back), so its
    /// next delta of each model catches up by a repair. Its marks stay (bounded by
    /// `MESH_REPAIR_MARKS_MAX`, and kept only for members, whose pages alone are taken): a peer
    /// back from a pause or a partition is repaired from where it left off, and one that
    /// restarted numbers its paths in a new epoch, which starts the repair from its first.
    pub fn forget_peer(&mut self, peer: SocketAddr) {
        self.heard.retain(|(p, _)| *p != peer);
    }

    /// Forgets what was heard from every peer: this gateway was declared down (a pause, a
    /// partition) and rejoined, and may have missed any peer's deltas meanwhile, while the
    /// peers, who saw it leave, sent it none. Each peer's next delta of each model catches up
    /// from its marks.
    pub fn forget_heard(&mut self) {
        self.heard.clear();
    }

    /// Marks kept.
    pub fn marks_len(&self) -> usize {
        self.marks.len()
    }

    fn mark(&self, peer: SocketAddr, model: u64) -> (u64, u64) {
        self.marks.get(&(peer, model)).copied().unwrap_or((0, 0))
    }

    /// A page arrived for `model`: progress, the next request, or the end. `epoch` and
    /// `next_after` are where the sender's numbering stands after it.
    pub fn on_page(
        &mut self,
        model: u64,
        repair_id: u64,
        (epoch, next_after): (u64, u64),
        done: bool,
        now: Instant,
    ) -> PageOutcome {
        let Some(repair) = self.running.get_mut(&model) else {
            return PageOutcome::Stale;
        };
        if repair.id != repair_id {
            return PageOutcome::Stale;
        }
        if self.marks.len() >= MESH_REPAIR_MARKS_MAX {
            self.marks.clear();
        }
        self.marks.insert((repair.peer, model), (epoch, next_after));
        repair.epoch = epoch;
        if done {
            let again = repair.again;
            self.running.remove(&model);
            return PageOutcome::Completed { again };
        }
        repair.after = next_after;
        repair.progress_at = now;
        PageOutcome::Next(ask(model, repair))
    }

    /// Retries or abandons every repair without progress for `MESH_REPAIR_STALL`.
    pub fn check_stalls(&mut self, live: &[SocketAddr], now: Instant) -> Vec<StallOutcome> {
        let mut outcomes = Vec::new();
        let mut abandoned = Vec::new();
        for (&model, repair) in self.running.iter_mut() {
            if now.duration_since(repair.progress_at) < MESH_REPAIR_STALL {
                continue;
            }
            repair.retries += 1;
            if repair.retries > MESH_REPAIR_RETRIES || live.is_empty() {
                abandoned.push(model);
                continue;
            }
            let others: Vec<SocketAddr> =
                live.iter().copied().filter(|p| *p != repair.peer).collect();
            let choices = if others.is_empty() { live } else { &others };
            let peer = choices[fastrand::usize(..choices.len())];
            if peer != repair.peer {
                // Another peer numbers its paths its own way: resume from its mark.
                let (epoch, after) = self.marks.get(&(peer, model)).copied().unwrap_or((0, 0));
                (repair.epoch, repair.after) = (epoch, after);
                repair.peer = peer;
            }
            self.next_id += 1;
            repair.id = self.next_id;
            repair.progress_at = now;
            outcomes.push(StallOutcome::Retried(ask(model, repair)));
        }
        for model in abandoned {
            self.running.remove(&model);
            outcomes.push(StallOutcome::Abandoned(model));
        }
        outcomes
    }
}

fn ask(model: u64, repair: &Repair) -> Ask {
    Ask {
        peer: repair.peer,
        model,
        repair_id: repair.id,
        after: repair.after,
        epoch: repair.epoch,
    }
}
