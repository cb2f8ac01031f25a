//! Token paths as chains of pages, so a delta can carry a path's pages and a peer insert it
//! without asking for a repair, while a dispatch costs only the pages the peer lacks.
//!
//! A token path's prefixes are named by chained hashes ([`chain_hashes`]): the first links
//! the namespace and block size, each next one links the one before and the next page hash.
//! Equal chain hashes mean equal prefixes, on every gateway (fixed seeds, like
//! `paths::path_hash`).
//!
//! - [`PageChains`]: every prefix this gateway knows (its own dispatches, peers' deltas, repair
//!   pages), by chain hash → (the one before, the page, the depth), so a delta that says
//!   "after the prefix `c` of `n` pages, these pages" is rebuilt into the whole path.
//! - [`PeerChains`]: per prefix, the peers this gateway believes know it: it sent it to them,
//!   heard it from them, or heard it from a peer that sent it to the same members this gateway
//!   sees (the batch names its recipients by [`recipients_hash`]), so they heard it too. A delta to a peer starts after the deepest prefix that peer
//!   knows, found by binary search (a path's known prefixes are a run from its first page).
//!   The third rule is what makes a prompt cross once per peer rather than once per pair of
//!   gateways: without it each gateway that dispatched a system prompt sent it to every peer
//!   it had not heard it from.
//!
//! Both are bounded (`MESH_CHAINS_MAX`, `MESH_PEER_CHAINS_MAX`) and cleared whole when full: a
//! peer that lacks a prefix it was thought to have (a cleared map, a membership view that
//! differed) cannot rebuild the path, and asks for a repair as before. A peer's bit goes when
//! it leaves or restarts.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;

use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use super::paths::PATH_HASH_SEED;
use crate::index::Namespace;
use crate::limits::{MESH_CHAINS_MAX, MESH_PEER_CHAINS_MAX};

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

/// One known prefix: the prefix one page shorter, its last page, and its length in pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Link {
    before: u64,
    page: u64,
    depth: u32,
}

/// Every prefix this gateway knows, by chain hash (bounded; cleared whole when full).
#[derive(Debug, Default)]
pub struct PageChains {
    links: HashMap<u64, Link, ChainKeys>,
}

impl PageChains {
    /// Prefixes known.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Learns every prefix of `pages`, whose chain hashes are `chains` (from
    /// [`chain_hashes`]). The prefixes known are a run from the first page, so only those
    /// after the deepest known one are added.
    pub fn learn(&mut self, root: u64, pages: &[u64], chains: &[u64]) {
        if self.links.len() + pages.len() > MESH_CHAINS_MAX {
            self.links.clear();
        }
        let known = deepest_in(chains, |c| self.links.contains_key(&c));
        for at in known..pages.len() {
            let before = if at == 0 { root } else { chains[at - 1] };
            let link = Link {
                before,
                page: pages[at],
                depth: at as u32 + 1,
            };
            self.links.insert(chains[at], link);
        }
    }

    /// The pages of the prefix named `chain`, `depth` pages long, after `root`, and the chain
    /// hash of each of its prefixes (the walk meets them: no page is hashed again); `None`
    /// when a link is missing or does not lead back to `root` in `depth` steps.
    pub fn pages_of(&self, root: u64, chain: u64, depth: u32) -> Option<(Vec<u64>, Vec<u64>)> {
        let mut pages = vec![0u64; depth as usize];
        let mut chains = vec![0u64; depth as usize];
        let mut at = chain;
        for slot in (0..depth as usize).rev() {
            let link = self.links.get(&at)?;
            if link.depth as usize != slot + 1 {
                return None;
            }
            pages[slot] = link.page;
            chains[slot] = at;
            at = link.before;
        }
        (at == root).then_some((pages, chains))
    }
}

/// How many of `chains` (a path's prefixes, shortest first) satisfy `known`, given that the
/// known ones are a run from the first: a binary search.
fn deepest_in(chains: &[u64], known: impl Fn(u64) -> bool) -> usize {
    chains.partition_point(|&c| known(c))
}

/// Per prefix, the peers this gateway believes know it (it sent them the prefix, heard it
/// from them, or heard it from a peer that sent it to them all): one bit per peer, so a path's
/// pages cost one map entry each however many peers there are. Bounded in all
/// (`MESH_PEER_CHAINS_MAX`, cleared whole when full); a peer's bit is cleared when it leaves.
/// Peers past the 64th have no bit: they are believed to know nothing, and get whole paths.
#[derive(Debug, Default)]
pub struct PeerChains {
    known: HashMap<u64, u64, ChainKeys>,
    slots: HashMap<SocketAddr, u32>,
}

impl PeerChains {
    /// How many leading prefixes of `chains` `peer` is believed to know.
    pub fn known_by(&self, peer: SocketAddr, chains: &[u64]) -> usize {
        match self.slots.get(&peer) {
            Some(&slot) => self.known_by_mask(1 << slot, chains),
            None => 0,
        }
    }

    /// How many leading prefixes of `chains` every peer of `mask` is believed to know.
    fn known_by_mask(&self, mask: u64, chains: &[u64]) -> usize {
        deepest_in(chains, |c| {
            self.known
                .get(&c)
                .is_some_and(|&known| known & mask == mask)
        })
    }

    /// Each of `peers` knows every prefix of `chains`.
    pub fn note(&mut self, peers: &[SocketAddr], chains: &[u64]) {
        let mask = peers
            .iter()
            .filter_map(|&peer| self.slot(peer))
            .fold(0u64, |mask, slot| mask | 1 << slot);
        if mask == 0 {
            return;
        }
        if self.known.len() + chains.len() > MESH_PEER_CHAINS_MAX {
            self.known.clear();
        }
        let from = self.known_by_mask(mask, chains);
        for &chain in &chains[from..] {
            *self.known.entry(chain).or_default() |= mask;
        }
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
            self.known.retain(|_, known| {
                *known &= !bit;
                *known != 0
            });
        }
    }
}
