//! Token paths as chains of pages, so a delta can carry a path's pages and a peer insert it
//! without asking for a repair, while a dispatch costs only the pages the peer lacks.
//!
//! A token path's prefixes are named by chained hashes ([`chain_hashes`]): the first links
//! the namespace and block size, each next one links the one before and the next page hash.
//! Equal chain hashes mean equal prefixes, on every gateway (fixed seeds, like
//! `paths::path_hash`).
//!
//! [`PathChains`] keeps what a delta needs per path, not per page: every token path this
//! gateway knows (its own dispatches, peers' deltas, repair pages) by the chain hash of the
//! whole path, with a bit per peer believed to know it (it sent the path to the peer, heard it
//! from the peer, or heard it from a peer that sent it to the same members this gateway sees:
//! the batch names its recipients by [`recipients_hash`], so they heard it too), and an index
//! of the paths' prefixes at every `ANCHOR_PAGES`th page. A delta to a peer carries the pages
//! after the longest prefix of the path that is a prefix of a path the peer knows, named by
//! that path's chain hash and the prefix's length (`Delta.base_path`, `base_pages`): the peer
//! rebuilds the path with one lookup and a copy. The third rule of knowing is what makes a
//! prompt cross once per peer rather than once per pair of gateways: without it each gateway
//! that dispatched a system prompt sent it to every peer it had not heard it from.
//!
//! Bounded (`MESH_CHAIN_PATHS_MAX`, `MESH_CHAIN_PAGES_MAX`) and cleared whole when full: a peer
//! that lacks a path it was thought to have (a cleared map, a membership view that differed)
//! cannot rebuild a delta built on it, and asks for a repair as before. A peer's bit goes when
//! it leaves or restarts.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;

use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use super::paths::PATH_HASH_SEED;
use crate::index::{Namespace, TokenKey};
use crate::limits::{MESH_CHAIN_PAGES_MAX, MESH_CHAIN_PATHS_MAX};

/// The chain hash before a path's first page: its namespace and block size.
pub fn chain_root(namespace: Namespace, block_size: usize) -> u64 {
    let mut hasher = Xxh3::with_seed(PATH_HASH_SEED);
    hasher.update(b"chain");
    hasher.update(&namespace.model.to_le_bytes());
    hasher.update(&namespace.partition.to_le_bytes());
    hasher.update(&(block_size as u64).to_le_bytes());
    hasher.digest()
}

/// The chain hash after `page`, following `before`.
pub fn chain_next(before: u64, page: u64) -> u64 {
    xxh3_64_with_seed(&page.to_le_bytes(), before)
}

/// The chain hash of each prefix of `pages`: element `i` names the first `i + 1` pages.
pub fn chain_hashes(namespace: Namespace, block_size: usize, pages: &[u64]) -> Vec<u64> {
    let mut chain = chain_root(namespace, block_size);
    pages
        .iter()
        .map(|&page| {
            chain = chain_next(chain, page);
            chain
        })
        .collect()
}

/// A hash of a set of members' addresses (`DeltaBatch.recipients`): the same on every
/// gateway for the same set, whatever the order; never 0 (an older sender's "unknown").
pub fn recipients_hash(members: &[SocketAddr]) -> u64 {
    let mut sorted = members.to_vec();
    sorted.sort_unstable();
    let mut hasher = Xxh3::with_seed(PATH_HASH_SEED);
    hasher.update(b"recipients");
    for member in sorted {
        hasher.update(member.to_string().as_bytes());
        hasher.update(b"\n");
    }
    hasher.digest().max(1)
}

/// Member sets whose [`recipients_hash`] is kept: a few more than the sets one gateway meets
/// (its own, and one per sender), so the memo is not cleared at every round.
const RECIPIENT_SETS_KEPT: usize = 16;

/// [`recipients_hash`] of the member sets met lately: a set changes only with membership, and
/// formatting every address of it for each batch sent and received was a visible part of
/// the mesh thread's CPU per dispatch.
#[derive(Debug, Default)]
pub struct RecipientsHashes {
    known: Vec<(Vec<SocketAddr>, u64)>,
}

impl RecipientsHashes {
    /// `recipients_hash(members)`, from the memo when the set was met lately.
    pub fn of(&mut self, members: &[SocketAddr]) -> u64 {
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        if let Some(&(_, hash)) = self.known.iter().find(|(set, _)| *set == sorted) {
            return hash;
        }
        let hash = recipients_hash(&sorted);
        if self.known.len() >= RECIPIENT_SETS_KEPT {
            self.known.clear();
        }
        self.known.push((sorted, hash));
        hash
    }
}

/// Hashes chain hashes for the maps below. A chain hash is already an xxh3 digest, so SipHash
/// (std's default, a few times the cost of the insert it serves, once per page) would hash a
/// hash; but the digests' seeds are public and pages come from clients, who could choose
/// prompts whose digests share their low bits. So the digest is mixed with a key drawn per
/// process: one xor, one wide multiply, one fold.
#[derive(Clone, Copy, Debug)]
pub struct ChainKeys {
    key: u64,
}

impl Default for ChainKeys {
    fn default() -> Self {
        ChainKeys {
            key: fastrand::u64(..),
        }
    }
}

impl BuildHasher for ChainKeys {
    type Hasher = ChainHasher;

    fn build_hasher(&self) -> ChainHasher {
        ChainHasher {
            key: self.key,
            state: 0,
        }
    }
}

/// The hasher of [`ChainKeys`].
#[derive(Clone, Copy, Debug)]
pub struct ChainHasher {
    key: u64,
    state: u64,
}

impl Hasher for ChainHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed; other bytes are folded in so the hasher stays total.
        for &byte in bytes {
            self.write_u64(self.state.rotate_left(8) ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        // A full 64x64 -> 128-bit multiply: its high half depends on every bit of the keyed
        // value, and folding it onto the low half brings that to the low bits hashbrown picks
        // buckets with (a 64-bit multiply would leave them depending on low bits only).
        let product = u128::from(value ^ self.key) * 0x9e37_79b9_7f4a_7c15_u128;
        self.state = (product as u64) ^ ((product >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.state
    }
}

/// Pages between two anchors: a known path's prefixes are indexed at every `ANCHOR_PAGES`th
/// page, not at every page, so learning a path costs one map entry per 16 new pages (and one
/// for the path), where a map entry per page and a bit per peer on each was most of the mesh
/// thread's CPU on long new prompts.
pub const ANCHOR_PAGES: usize = 16;

/// A path's chain hashes as [`PathChains`] keeps them: at each anchor (depth `ANCHOR_PAGES`,
/// `2 * ANCHOR_PAGES`, ...) and at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chained {
    /// The chain hash of the prefix at each anchor, shortest first.
    pub anchors: Vec<u64>,
    /// The chain hash of the whole path (the root's when it has no page).
    pub end: u64,
}

impl Chained {
    /// The anchors and end of a path whose every prefix's chain hash is `chains`
    /// ([`chain_hashes`]; `root` when it has no page).
    pub fn of_chains(root: u64, chains: &[u64]) -> Chained {
        Chained {
            anchors: chains
                .iter()
                .skip(ANCHOR_PAGES - 1)
                .step_by(ANCHOR_PAGES)
                .copied()
                .collect(),
            end: chains.last().copied().unwrap_or(root),
        }
    }

    /// The anchors and end of `pages`, of which the first `from` pages' anchors are
    /// `anchors` (and the chain hash at depth `from`, `chain`): only the pages after `from`
    /// are hashed.
    pub fn extend(mut anchors: Vec<u64>, mut chain: u64, from: usize, pages: &[u64]) -> Chained {
        for (at, &page) in pages.iter().enumerate().skip(from) {
            chain = chain_next(chain, page);
            if (at + 1).is_multiple_of(ANCHOR_PAGES) {
                anchors.push(chain);
            }
        }
        Chained {
            anchors,
            end: chain,
        }
    }
}

/// One known token path: its pages (shared with the known path or dispatch record that brought
/// it), its chain hash at each anchor, and a bit per peer believed to know it.
#[derive(Debug)]
struct KnownChain {
    key: TokenKey,
    anchors: Box<[u64]>,
    peers: u64,
}

/// What a delta to a peer builds on: the first `pages` pages of the known path whose chain
/// hash is `path` (`Delta.base_path`); `pages` 0: nothing, the whole path crosses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Base {
    /// The chain hash of the (whole) known path the base is a prefix of.
    pub path: u64,
    /// Pages of that path the base is.
    pub pages: usize,
}

/// A delta's base as found here: its pages, and the chain hashes at its anchors (and at its
/// last anchor's depth, so the rest of the path is hashed from there).
#[derive(Debug)]
pub struct BaseFound<'a> {
    /// The base's pages.
    pub pages: &'a [u64],
    /// The chain hash at each anchor within the base.
    pub anchors: &'a [u64],
}

/// The token paths this gateway knows, by the chain hash of the whole path (its own
/// dispatches, peers' deltas, repair pages), with a bit per peer believed to know each path
/// (it sent the path to the peer, heard it from the peer, or heard it from a peer that sent it
/// to the members this gateway sees: the batch names its recipients by [`recipients_hash`]),
/// and, per anchor (the chain hash of a prefix `ANCHOR_PAGES`, `2 * ANCHOR_PAGES`, ... pages
/// long), a known path through it.
///
/// A delta to a peer builds on the longest prefix of a path the peer knows: a binary search
/// over the new path's anchors finds the deepest one whose path the peer knows, and a compare
/// of that path's pages with the new one's extends the base past the anchor. The peer
/// rebuilds the path from the named known path (one lookup) and the pages that follow. State
/// is per path and per 16 pages, not per page: what made a long new prompt cost thousands of
/// map inserts per dispatch.
///
/// Bounded in paths and pages (`MESH_CHAIN_PATHS_MAX`, `MESH_CHAIN_PAGES_MAX`), cleared whole
/// when full: a peer that lacks a path it was thought to have (a cleared map, a membership
/// view that differed) cannot rebuild a delta on it, and asks for a repair as before. A
/// peer's bit goes when it leaves or restarts. Peers past the 64th have no bit: they are
/// believed to know nothing, and get whole paths.
#[derive(Debug, Default)]
pub struct PathChains {
    paths: HashMap<u64, KnownChain, ChainKeys>,
    /// Anchor chain hash → the chain hash of a known path through it.
    anchors: HashMap<u64, u64, ChainKeys>,
    /// Pages of the paths held (the bound; most are shared with the known paths' keys).
    pages: usize,
    slots: HashMap<SocketAddr, u32>,
    /// Times the maps were cleared for their bounds.
    cleared: u64,
}

impl PathChains {
    /// Paths known.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Anchors known.
    pub fn anchors(&self) -> usize {
        self.anchors.len()
    }

    /// Times the maps were cleared because a bound was reached.
    pub fn cleared(&self) -> u64 {
        self.cleared
    }

    /// Learns the path `key` (its chain hashes `chained`), and notes `peers` as knowing it.
    pub fn learn(&mut self, key: &TokenKey, chained: Chained, peers: &[SocketAddr]) {
        let mask = self.mask(peers);
        let (known_anchors, mask) = match self.paths.get_mut(&chained.end) {
            Some(known) => {
                known.peers |= mask;
                (known.anchors.len(), known.peers)
            }
            None => {
                let len = key.pages().len();
                if self.paths.len() >= MESH_CHAIN_PATHS_MAX
                    || self.pages + len > MESH_CHAIN_PAGES_MAX
                {
                    self.paths.clear();
                    self.anchors.clear();
                    self.pages = 0;
                    self.cleared += 1;
                }
                // The anchors known are a run from the first (every path adds all of its own,
                // and the maps are cleared together): those past the deepest known one are
                // added.
                let known = chained
                    .anchors
                    .partition_point(|anchor| self.anchors.contains_key(anchor));
                for &anchor in &chained.anchors[known..] {
                    self.anchors.insert(anchor, chained.end);
                }
                self.pages += len;
                self.paths.insert(
                    chained.end,
                    KnownChain {
                        key: key.clone(),
                        anchors: chained.anchors.into_boxed_slice(),
                        peers: mask,
                    },
                );
                (known, mask)
            }
        };
        self.lead_anchors_to(chained.end, known_anchors, mask);
    }

    /// An anchor leads to one path: from the deepest of `path`'s first `count` anchors down,
    /// one whose path fewer peers know than `path` (known by `mask`) is led to `path` instead,
    /// until one whose path they all know (at once when every peer knows everything, as in a
    /// settled mesh).
    fn lead_anchors_to(&mut self, path: u64, count: usize, mask: u64) {
        if mask == 0 {
            return;
        }
        let Some(known) = self.paths.get(&path) else {
            return;
        };
        for &anchor in known.anchors[..count.min(known.anchors.len())].iter().rev() {
            let Some(led) = self.anchors.get_mut(&anchor) else {
                break;
            };
            if *led == path {
                // Led here already (this path was the first through it), and so, most
                // likely, are those before it.
                break;
            }
            let old = self.paths.get(led).map_or(0, |known| known.peers);
            if old & mask == mask {
                break;
            }
            if old & !mask == 0 {
                *led = path;
            }
        }
    }

    /// Learns a path of which every prefix's chain hash is `chains`; see [`PathChains::learn`].
    pub fn learn_chains(
        &mut self,
        key: &TokenKey,
        root: u64,
        chains: &[u64],
        peers: &[SocketAddr],
    ) {
        self.learn(key, Chained::of_chains(root, chains), peers);
    }

    /// The longest prefix of the path `pages` (every prefix's chain hash: `chains`) that
    /// `peer` is believed to know, as a prefix of one path it knows.
    pub fn base_for(&self, peer: SocketAddr, chains: &[u64], pages: &[u64]) -> Base {
        match self.slots.get(&peer) {
            Some(&slot) => self.base_for_mask(1 << slot, chains, pages),
            None => Base::default(),
        }
    }

    /// How many leading pages of the path `pages` (chain hashes `chains`) `peer` is believed
    /// to know.
    pub fn known_by(&self, peer: SocketAddr, chains: &[u64], pages: &[u64]) -> usize {
        self.base_for(peer, chains, pages).pages
    }

    fn base_for_mask(&self, mask: u64, chains: &[u64], pages: &[u64]) -> Base {
        let Some(&end) = chains.last() else {
            return Base::default();
        };
        let knows = |path: &u64| {
            self.paths
                .get(path)
                .is_some_and(|known| known.peers & mask == mask)
        };
        if knows(&end) {
            return Base {
                path: end,
                pages: pages.len(),
            };
        }
        // The path behind anchor `at` (0-based) when the peers know it.
        let known_at = |at: usize| {
            self.anchors
                .get(&chains[(at + 1) * ANCHOR_PAGES - 1])
                .filter(|path| knows(path))
                .copied()
        };
        let (mut low, mut high) = (0, chains.len().min(pages.len()) / ANCHOR_PAGES);
        while low < high {
            let mid = low + (high - low) / 2;
            if known_at(mid).is_some() {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        // An anchor leads to one path through it, which the peers may not know while they know
        // another: the search may stop above an anchor whose path they do not know, so the
        // deepest anchor found is taken from there down.
        let Some((at, path)) = (0..low).rev().find_map(|at| Some((at, known_at(at)?))) else {
            return Base::default();
        };
        let Some(known) = self.paths.get(&path) else {
            return Base::default();
        };
        let from = (at + 1) * ANCHOR_PAGES;
        let same = known
            .key
            .pages()
            .get(from..)
            .unwrap_or_default()
            .iter()
            .zip(&pages[from..])
            .take_while(|(a, b)| a == b)
            .count();
        Base {
            path,
            pages: from + same,
        }
    }

    /// The base a delta names: the first `depth` pages of the known path `path`; from a sender
    /// that names no path (an earlier version of this issue), the prefix whose chain hash is
    /// `chain`, when it is a known path or anchor. `None`: not known here.
    pub fn base_of(&self, path: u64, chain: u64, depth: usize) -> Option<BaseFound<'_>> {
        let known = if path != 0 {
            self.paths.get(&path)?
        } else if let Some(known) = self.paths.get(&chain) {
            known
        } else {
            let known = self.paths.get(self.anchors.get(&chain)?)?;
            let anchor = depth
                .is_multiple_of(ANCHOR_PAGES)
                .then_some(depth / ANCHOR_PAGES)
                .and_then(|at| known.anchors.get(at.checked_sub(1)?))?;
            (*anchor == chain).then_some(known)?
        };
        Some(BaseFound {
            pages: known.key.pages().get(..depth)?,
            anchors: known.anchors.get(..depth / ANCHOR_PAGES)?,
        })
    }

    /// Each of `peers`' bit, given one if it has none and one is free.
    fn mask(&mut self, peers: &[SocketAddr]) -> u64 {
        peers
            .iter()
            .filter_map(|&peer| self.slot(peer))
            .fold(0u64, |mask, slot| mask | 1 << slot)
    }

    /// `peer`'s bit, given one if it has none and one is free.
    fn slot(&mut self, peer: SocketAddr) -> Option<u32> {
        if let Some(&slot) = self.slots.get(&peer) {
            return Some(slot);
        }
        let used = self
            .slots
            .values()
            .fold(0u64, |used, &slot| used | 1 << slot);
        let free = (!used).trailing_zeros();
        (free < u64::BITS).then(|| {
            self.slots.insert(peer, free);
            free
        })
    }

    /// Forgets what `peer` was believed to know (it left, restarted with nothing, or a batch
    /// to it was dropped).
    pub fn forget(&mut self, peer: SocketAddr) {
        if let Some(slot) = self.slots.remove(&peer) {
            let bit = 1u64 << slot;
            for known in self.paths.values_mut() {
                known.peers &= !bit;
            }
        }
    }
}
