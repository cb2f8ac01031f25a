//! Repairs. A gateway that hears a model from a peer for the first time since one of them
//! joined or came back catches up: it asks that peer for the model's paths, page by page (the
//! spec's repair), resuming after the last path it received from that peer (`KnownPaths`'s
//! sequence numbers), so a later catch-up sends only what changed since. A gateway that hears
//! of paths it cannot rebuild (a text path, a token path on a prefix it does not know) asks
//! for those paths alone, by hash: a wrong belief about what it knew costs about the delta it
//! could not apply, not every path the peer learned since the last repair (a peer of an
//! earlier version ignores the hashes and serves the model's pages, as before).
//!
//! The first ask goes to the peer whose delta named the path when it is live (the spec says a
//! random live peer; with three gateways that random peer has often heard the same delta and
//! knows no more), retries to random others. One repair per model at a time: what is asked
//! while one runs waits (catch-ups with other peers, unknown paths) and the caller starts it
//! when the running one completes ([`Repairs::resume_waiting`]). A repair resumes where its
//! last page ended; one that makes no progress for `MESH_REPAIR_STALL` is retried, preferably
//! with another peer, up to `MESH_REPAIR_RETRIES` times, then abandoned (with what waited)
//! until the next unknown path. Pure state: the caller sends the requests and counts.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Instant;

use crate::limits::{
    MESH_REPAIR_MARKS_MAX, MESH_REPAIR_PAGE_ENTRIES, MESH_REPAIR_RETRIES, MESH_REPAIR_STALL,
};

/// A request to send: ask `peer` for `model`'s page after `after`, or for `paths` alone.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The path hashes asked for; empty: the model's paths after `after` (a catch-up).
    pub paths: Vec<u64>,
    /// A catch-up's bound: the peer's epoch and last number when it sent the delta batch that
    /// started it (what came after reaches this gateway as deltas); (0, 0): none.
    pub until: (u64, u64),
}

/// What a page meant for its repair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageOutcome {
    /// Not the page of a running repair (late, or of an abandoned try): ignored.
    Stale,
    /// More pages follow: ask for the next.
    Next(Ask),
    /// The model's last page. `again`: a catch-up or unknown paths were asked for while it
    /// ran; the caller starts them ([`Repairs::resume_waiting`]).
    Completed {
        /// Something waits.
        again: bool,
    },
}

/// What a stall check decided for one repair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StallOutcome {
    /// Asked again (another peer when there is one).
    Retried(Ask),
    /// Out of retries, or no live peer: given up.
    Abandoned(u64),
}

#[derive(Clone, Debug)]
struct Repair {
    id: u64,
    peer: SocketAddr,
    after: u64,
    epoch: u64,
    progress_at: Instant,
    retries: u32,
    /// The paths asked for; empty: a catch-up.
    paths: Vec<u64>,
    /// A catch-up's bound in `peer`'s numbering; (0, 0): none.
    until: (u64, u64),
    /// What was asked for while it ran.
    waiting: Waiting,
}

/// What was asked for while a model's repair ran, to start when it completes: catch-ups with
/// the peers listed (each peer once), and unknown paths (at most `MESH_REPAIR_PAGE_ENTRIES`,
/// asked of the peer that last named one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Waiting {
    catch_ups: Vec<(SocketAddr, (u64, u64))>,
    paths: Vec<u64>,
    named_by: Option<SocketAddr>,
}

impl Waiting {
    fn is_empty(&self) -> bool {
        self.catch_ups.is_empty() && self.paths.is_empty()
    }

    fn add_paths(&mut self, named_by: Option<SocketAddr>, paths: &[u64]) {
        for &path in paths {
            if self.paths.len() >= MESH_REPAIR_PAGE_ENTRIES {
                break;
            }
            if !self.paths.contains(&path) {
                self.paths.push(path);
            }
        }
        self.named_by = named_by.or(self.named_by);
    }
}

/// The running repairs, by model.
#[derive(Debug, Default)]
pub struct Repairs {
    running: HashMap<u64, Repair>,
    /// What waited for a repair that completed, until the caller resumes it.
    completed_waiting: HashMap<u64, Waiting>,
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

    /// Starts `model`'s catch-up with `named_by` when it is live (else a random live peer):
    /// its paths after this gateway's mark, up to `until` (`named_by`'s epoch and number when
    /// it sent the batch that asks for it; (0, 0): no bound). While a repair of `model` runs,
    /// it waits.
    pub fn start(
        &mut self,
        model: u64,
        named_by: Option<SocketAddr>,
        until: (u64, u64),
        live: &[SocketAddr],
        now: Instant,
    ) -> Option<Ask> {
        if let Some(running) = self.running.get_mut(&model) {
            let peer = named_by.unwrap_or(running.peer);
            let waiting = &mut running.waiting;
            let known = waiting.catch_ups.iter().any(|(p, _)| *p == peer);
            if !known && waiting.catch_ups.len() < live.len() {
                waiting.catch_ups.push((peer, until));
            }
            return None;
        }
        self.begin(model, named_by, (Vec::new(), until), live, now)
    }

    /// Asks for `paths` of `model` alone (a delta named them and this gateway could not
    /// rebuild them), of `named_by` when it is live (it knows them), else a random live peer.
    /// While a repair of `model` runs, they wait.
    pub fn start_paths(
        &mut self,
        model: u64,
        named_by: Option<SocketAddr>,
        paths: &[u64],
        live: &[SocketAddr],
        now: Instant,
    ) -> Option<Ask> {
        if let Some(running) = self.running.get_mut(&model) {
            running.waiting.add_paths(named_by, paths);
            return None;
        }
        let mut asked = Waiting::default();
        asked.add_paths(named_by, paths);
        if asked.paths.is_empty() {
            return None;
        }
        self.begin(model, named_by, (asked.paths, (0, 0)), live, now)
    }

    /// Starts what waited for `model`'s repair, which completed: the next catch-up with a live
    /// peer, else the unknown paths; what remains waits for that one.
    pub fn resume_waiting(&mut self, model: u64, live: &[SocketAddr], now: Instant) -> Option<Ask> {
        let mut waiting = self.completed_waiting.remove(&model)?;
        waiting.catch_ups.retain(|(peer, _)| live.contains(peer));
        let ask = match waiting.catch_ups.first().copied() {
            Some((peer, until)) => {
                waiting.catch_ups.remove(0);
                self.begin(model, Some(peer), (Vec::new(), until), live, now)?
            }
            None => {
                let paths = std::mem::take(&mut waiting.paths);
                if paths.is_empty() {
                    return None;
                }
                self.begin(model, waiting.named_by, (paths, (0, 0)), live, now)?
            }
        };
        if let Some(running) = self.running.get_mut(&model) {
            running.waiting = waiting;
        }
        Some(ask)
    }

    /// A repair of `model` for `paths` (none: a catch-up up to `until`), asked of `named_by`
    /// when it is live, else of a random live peer (then without the bound, which is
    /// `named_by`'s numbering); `None` when no peer is live.
    fn begin(
        &mut self,
        model: u64,
        named_by: Option<SocketAddr>,
        (paths, until): (Vec<u64>, (u64, u64)),
        live: &[SocketAddr],
        now: Instant,
    ) -> Option<Ask> {
        if live.is_empty() {
            return None;
        }
        let (peer, until) = match named_by {
            Some(peer) if live.contains(&peer) => (peer, until),
            _ => (live[fastrand::usize(..live.len())], (0, 0)),
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
            paths,
            until,
            waiting: Waiting::default(),
        };
        let asked = ask(model, &repair);
        self.running.insert(model, repair);
        Some(asked)
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
            let waiting = std::mem::take(&mut repair.waiting);
            self.running.remove(&model);
            let again = !waiting.is_empty();
            if again {
                if self.completed_waiting.len() >= MESH_REPAIR_MARKS_MAX {
                    self.completed_waiting.clear();
                }
                self.completed_waiting.insert(model, waiting);
            }
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
                // The bound was the other peer's numbering.
                repair.until = (0, 0);
            }
            self.next_id += 1;
            repair.id = self.next_id;
            repair.progress_at = now;
            outcomes.push(StallOutcome::Retried(ask(model, repair)));
        }
        for model in abandoned {
            // What waited goes with it: the next unknown path or catch-up asks again.
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
        paths: repair.paths.clone(),
        until: repair.until,
    }
}
