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
//! - [`PeerChains`]: per peer, the prefixes this gateway believes the peer knows (it sent them
//!   to the peer, or heard them from it). A delta to that peer starts after the deepest such
//!   prefix, found by binary search (a path's known prefixes are a run from its first page).
//!
//! Both are bounded (`MESH_CHAINS_MAX`, `MESH_PEER_CHAINS_MAX`) and cleared whole when full: a
//! peer that lacks a prefix it was thought to have cannot rebuild the path, and asks for a
//! repair as before. A peer's set goes when it leaves or restarts.

use std::collections::{HashMap, HashSet};
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

    /// The pages of the prefix named `chain`, `depth` pages long, after `root`; `None` when a
    /// link is missing or does not lead back to `root` in `depth` steps.
    pub fn pages_of(&self, root: u64, chain: u64, depth: u32) -> Option<Vec<u64>> {
        let mut pages = vec![0u64; depth as usize];
        let mut at = chain;
        for slot in (0..depth as usize).rev() {
            let link = self.links.get(&at)?;
            if link.depth as usize != slot + 1 {
                return None;
            }
            pages[slot] = link.page;
            at = link.before;
        }
        (at == root).then_some(pages)
    }
}

/// How many of `chains` (a path's prefixes, shortest first) satisfy `known`, given that the
/// known ones are a run from the first: a binary search.
fn deepest_in(chains: &[u64], known: impl Fn(u64) -> bool) -> usize {
    chains.partition_point(|&c| known(c))
}

/// Per peer, the prefixes this gateway believes it knows (bounded per peer; cleared whole
/// when full, and dropped when the peer leaves).
#[derive(Debug, Default)]
pub struct PeerChains {
    by_peer: HashMap<SocketAddr, HashSet<u64, ChainKeys>>,
}

impl PeerChains {
    /// How many leading prefixes of `chains` `peer` is believed to know.
    pub fn known_by(&self, peer: SocketAddr, chains: &[u64]) -> usize {
        match self.by_peer.get(&peer) {
            Some(known) => deepest_in(chains, |c| known.contains(&c)),
            None => 0,
        }
    }

    /// `peer` knows every prefix of `chains`; `from` of them it was already believed to know.
    pub fn note(&mut self, peer: SocketAddr, chains: &[u64], from: usize) {
        let known = self.by_peer.entry(peer).or_default();
        if known.len() + chains.len() > MESH_PEER_CHAINS_MAX {
            known.clear();
            known.extend(chains.iter().copied());
            return;
        }
        known.extend(chains[from.min(chains.len())..].iter().copied());
    }

    /// Forgets what `peer` was believed to know (it left, or restarted with nothing).
    pub fn forget(&mut self, peer: SocketAddr) {
        self.by_peer.remove(&peer);
    }

    /// Peers with a set.
    pub fn peers(&self) -> usize {
        self.by_peer.len()
    }
}
