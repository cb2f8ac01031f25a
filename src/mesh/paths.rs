//! The paths this gateway knows, by hash: what a delta can name and a repair can serve.
//!
//! A delta carries a hash of the request's path, never the path ([`path_hash`]). A gateway can
//! act on it only for a path it knows: one of its own dispatches, or one a repair page taught
//! it. [`KnownPaths`] keeps those (each key shared with the dispatch record that brought it, not
//! copied), with the workers peers and this gateway named for each, bounded in paths and in
//! units: the oldest path goes first. Evictions of the trees are not mirrored (the spec shares
//! inserts, not evictions); this map has its own bound.
//!
//! Each path carries a sequence number, renewed when it is learned or gains a holder: a
//! repair pages through a model's paths in that order and the asker keeps, per peer and model,
//! the last number it received, so the next repair from that peer sends only what is newer.
//!
//! Hashes agree across gateways because every seed is fixed: [`path_hash`] is xxh3 with
//! [`PATH_HASH_SEED`], the token tree's pages are `index::page_hash` (fixed lane seeds), models
//! and partitions are unseeded xxh3 of their ids. A per-process random seed would make crafted
//! collisions harder, but no two gateways would then name a path alike; a collision can only
//! change which worker holds what, never what an engine computes.
//!
//! Token paths cross the wire as their page hashes (not client values: the token ids cannot be
//! read back). Text paths reach this map already in a token path's form, the hashes of their
//! text's pages (`mesh::text`); a text key here would cross only as its path hash (a repair
//! names its holders, and a gateway applies them only to a text path it saw itself).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::chains::{self, Chained, PathChains};
use super::wire::{self, Delta, DeltaBatch, RepairEntry, RepairPage};
use crate::index::{self, Namespace, TreeKind};
use crate::limits::{
    MESH_PATH_PAGES_MAX, MESH_PATH_TENANTS_MAX, MESH_REPAIR_PAGE_ENTRIES, MESH_ROUND_DELTAS_MAX,
};
use crate::policy::KeyData;

/// The seed of every path hash, the same on every gateway (see the module's header).
pub const PATH_HASH_SEED: u64 = 0x6b76_6761_7465_6d73; // "kvgatems"

/// The hash of a tree path: its kind, model, partition, and units (text bytes, or the block
/// size and page hashes). `None` for the hash index's heads, which are never shared.
pub fn path_hash(namespace: Namespace, key: &KeyData) -> Option<u64> {
    let mut hasher = Xxh3::with_seed(PATH_HASH_SEED);
    hasher.update(&namespace.model.to_le_bytes());
    hasher.update(&namespace.partition.to_le_bytes());
    match key {
        KeyData::Text(text) => {
            hasher.update(&[0]);
            hasher.update(text.as_bytes());
        }
        KeyData::Tokens(tokens) => {
            hasher.update(&[1]);
            hasher.update(&(tokens.block_size() as u64).to_le_bytes());
            for page in tokens.pages() {
                hasher.update(&page.to_le_bytes());
            }
        }
        KeyData::Heads(_) => return None,
    }
    Some(hasher.digest())
}

/// A path and who holds it, as far as this gateway knows.
#[derive(Clone, Debug)]
pub struct KnownPath {
    /// Model and partition.
    pub namespace: Namespace,
    /// The path (shared with the record or the repair page that brought it).
    pub key: KeyData,
    /// Workers by URL, most recently named first, at most `MESH_PATH_TENANTS_MAX`.
    pub tenants: Vec<Arc<str>>,
}

impl KnownPath {
    fn units(&self) -> usize {
        match &self.key {
            KeyData::Text(text) => text.len(),
            KeyData::Tokens(tokens) => tokens.pages().len() * 8,
            KeyData::Heads(heads) => heads.len() * 8,
        }
    }

    /// Names `worker_url` the most recent holder; whether it was not a holder before.
    fn name(&mut self, worker_url: &Arc<str>) -> bool {
        let before = self.tenants.len();
        self.tenants.retain(|t| t != worker_url);
        let added = self.tenants.len() == before;
        self.tenants.insert(0, worker_url.clone());
        self.tenants.truncate(MESH_PATH_TENANTS_MAX);
        added
    }
}

/// Whether learning a holder told this gateway something new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new path, or a new holder of a known one.
    News,
    /// The worker already held the path here.
    Known,
}

/// The known paths by (model, path hash), bounded, each with a sequence number: a path's number
/// is renewed when it is learned or gains a holder, so a repair can resume from the last
/// number a peer already has (`page`) and an incremental repair sends only what changed since.
/// Numbers are this run's (`epoch`, random per start): a peer that restarted serves from 0.
#[derive(Debug)]
pub struct KnownPaths {
    paths: HashMap<(u64, u64), (KnownPath, u64)>,
    /// (model, sequence number) → path hash: the repair order.
    by_model: BTreeMap<(u64, u64), u64>,
    /// Sequence number → (model, path hash): the eviction order, least recently named first.
    by_seq: BTreeMap<u64, (u64, u64)>,
    next_seq: u64,
    epoch: u64,
    units: usize,
    paths_max: usize,
    units_max: usize,
}

impl KnownPaths {
    /// An empty map holding at most `paths_max` paths and `units_max` bytes of keys.
    pub fn new(paths_max: usize, units_max: usize) -> Self {
        KnownPaths {
            paths: HashMap::new(),
            by_model: BTreeMap::new(),
            by_seq: BTreeMap::new(),
            next_seq: 1,
            epoch: fastrand::u64(1..),
            units: 0,
            paths_max,
            units_max,
        }
    }

    /// This run's numbering of paths.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Paths held.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether no path is held.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Bytes of keys held (text bytes, 8 per page hash).
    pub fn units(&self) -> usize {
        self.units
    }

    /// Learns that `worker_url` holds `key`; returns its path hash and whether that was news (a
    /// new path or a new holder). `None`: heads, never shared.
    pub fn learn(
        &mut self,
        namespace: Namespace,
        key: KeyData,
        worker_url: &Arc<str>,
    ) -> Option<(u64, Change)> {
        let hash = path_hash(namespace, &key)?;
        Some(self.learn_hashed(namespace, key, hash, worker_url))
    }

    /// [`KnownPaths::learn`] of a path whose hash is `hash` (checked by the caller: a delta's
    /// path is hashed once, when it is rebuilt).
    pub fn learn_hashed(
        &mut self,
        namespace: Namespace,
        key: KeyData,
        hash: u64,
        worker_url: &Arc<str>,
    ) -> (u64, Change) {
        let slot = (namespace.model, hash);
        if let Some((_, change)) = self.name_holder(slot.0, slot.1, worker_url) {
            return (hash, change);
        }
        let mut known = KnownPath {
            namespace,
            key,
            tenants: Vec::new(),
        };
        known.name(worker_url);
        self.units += known.units();
        let seq = self.take_seq();
        self.paths.insert(slot, (known, seq));
        self.by_model.insert((slot.0, seq), slot.1);
        self.by_seq.insert(seq, slot);
        self.evict();
        (hash, Change::News)
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Names `worker_url` a holder of a known path; `None` when the path is unknown. A new
    /// holder renews the path's number (the next repair sends it); a known one does not, or
    /// paths would circle between gateways, each repair renewing what the last one sent.
    pub fn name_holder(
        &mut self,
        model: u64,
        hash: u64,
        worker_url: &Arc<str>,
    ) -> Option<(&KnownPath, Change)> {
        let seq = self.next_seq;
        let (known, old) = self.paths.get_mut(&(model, hash))?;
        let old = if known.name(worker_url) {
            std::mem::replace(old, seq)
        } else {
            let known = self.paths.get(&(model, hash)).map(|(known, _)| known)?;
            return Some((known, Change::Known));
        };
        self.next_seq += 1;
        self.by_model.remove(&(model, old));
        self.by_seq.remove(&old);
        self.by_model.insert((model, seq), hash);
        self.by_seq.insert(seq, (model, hash));
        let known = self.paths.get(&(model, hash)).map(|(known, _)| known)?;
        Some((known, Change::News))
    }

    /// The path, if known.
    pub fn get(&self, model: u64, hash: u64) -> Option<&KnownPath> {
        self.paths.get(&(model, hash)).map(|(known, _)| known)
    }

    fn evict(&mut self) {
        while self.paths.len() > self.paths_max || self.units > self.units_max {
            let Some((seq, slot)) = self.by_seq.pop_first() else {
                return;
            };
            self.by_model.remove(&(slot.0, seq));
            if let Some((gone, _)) = self.paths.remove(&slot) {
                self.units -= gone.units();
            }
        }
    }

    /// The last sequence number given: a delta batch's `known_before`.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// One repair page of `model`'s paths numbered above `after` in `epoch` (from the first
    /// when `epoch` is not this run's: the asker's mark is of an earlier run), and up to
    /// `until` in `until_epoch` (no bound when `until` is 0 or of another run).
    pub fn page(
        &self,
        model: u64,
        repair_id: u64,
        (epoch, after): (u64, u64),
        (until_epoch, until): (u64, u64),
    ) -> RepairPage {
        let after = if epoch == self.epoch { after } else { 0 };
        let until = match until {
            0 => u64::MAX,
            until if until_epoch == self.epoch => until.max(after),
            _ => u64::MAX,
        };
        let start = Bound::Excluded((model, after));
        let mut urls = UrlList::default();
        let mut entries = Vec::new();
        let mut next_after = after;
        let mut range = self
            .by_model
            .range((start, Bound::Included((model, until))));
        for (&(_, seq), &hash) in range.by_ref().take(MESH_REPAIR_PAGE_ENTRIES) {
            next_after = seq;
            entries.extend(self.entry(model, hash, &mut urls));
        }
        RepairPage {
            model,
            repair_id,
            worker_urls: urls.urls,
            entries,
            next_after,
            done: range.next().is_none(),
            epoch: self.epoch,
        }
    }

    /// The repair page of `paths` of `model` alone, those of them known here (at most
    /// `MESH_REPAIR_PAGE_ENTRIES`): what a peer asks for when it could not rebuild a delta.
    /// The asker's mark (`epoch`, `after`) is handed back as it was, or from the first when
    /// `epoch` is not this run's, so its next catch-up resumes where it did.
    pub fn page_of_paths(
        &self,
        model: u64,
        repair_id: u64,
        (epoch, after): (u64, u64),
        paths: &[u64],
    ) -> RepairPage {
        let mut urls = UrlList::default();
        let entries = paths
            .iter()
            .take(MESH_REPAIR_PAGE_ENTRIES)
            .filter_map(|&hash| self.entry(model, hash, &mut urls))
            .collect();
        RepairPage {
            model,
            repair_id,
            worker_urls: urls.urls,
            entries,
            next_after: if epoch == self.epoch { after } else { 0 },
            done: true,
            epoch: self.epoch,
        }
    }

    /// The repair entry of a known path; `None` when unknown (or heads).
    fn entry(&self, model: u64, hash: u64, urls: &mut UrlList) -> Option<RepairEntry> {
        let (known, _) = self.paths.get(&(model, hash))?;
        let (kind, pages, block_size) = match &known.key {
            KeyData::Text(_) => (wire::TreeKind::Text, Vec::new(), 0),
            KeyData::Tokens(tokens) => (
                wire::TreeKind::Token,
                tokens.pages().to_vec(),
                tokens.block_size() as u32,
            ),
            KeyData::Heads(_) => return None,
        };
        let workers = known.tenants.iter().map(|t| urls.index(t)).collect();
        Some(RepairEntry {
            kind: kind as i32,
            partition: known.namespace.partition,
            path_hash: hash,
            pages,
            block_size,
            workers,
        })
    }
}

/// Worker URLs of one message, each once; entries name them by index.
#[derive(Debug, Default)]
struct UrlList {
    urls: Vec<String>,
}

impl UrlList {
    fn index(&mut self, url: &str) -> u32 {
        match self.urls.iter().position(|u| u == url) {
            Some(at) => at as u32,
            None => {
                self.urls.push(url.to_string());
                (self.urls.len() - 1) as u32
            }
        }
    }
}

/// A token path of a round's delta: its pages, and the chain hash of each prefix
/// (`chains::chain_hashes`), computed once for every peer.
#[derive(Debug)]
pub struct RoundPath {
    /// The path's partition.
    pub partition: u64,
    /// Tokens per page.
    pub block_size: usize,
    /// The path (shared with the record: no copy).
    pub key: KeyData,
    /// The chain hash before its first page (`chains::chain_root`).
    pub root: u64,
    /// The chain hash of each prefix, shortest first.
    pub chains: Vec<u64>,
}

impl RoundPath {
    /// The token path of `key` in `namespace`; `None` for text and heads (no pages cross).
    pub fn of(namespace: Namespace, key: &KeyData) -> Option<RoundPath> {
        let KeyData::Tokens(tokens) = key else {
            return None;
        };
        let root = chains::chain_root(namespace, tokens.block_size());
        let chains = chains::chain_hashes(namespace, tokens.block_size(), tokens.pages());
        Some(RoundPath {
            partition: namespace.partition,
            block_size: tokens.block_size(),
            key: key.clone(),
            root,
            chains,
        })
    }

    /// The pages.
    pub fn pages(&self) -> &[u64] {
        match &self.key {
            KeyData::Tokens(tokens) => tokens.pages(),
            _ => &[],
        }
    }
}

/// One model's deltas of a round: the batch as every peer gets it, and the token path of each
/// delta, whose pages are added per peer ([`RoundBatch::for_peer`]).
#[derive(Debug)]
pub struct RoundBatch {
    /// The deltas without pages.
    pub batch: DeltaBatch,
    /// Per delta, its token path.
    pub paths: Vec<Option<Arc<RoundPath>>>,
}

impl RoundBatch {
    /// The batch for `peer`: each token delta carries the pages after the longest prefix `peer`
    /// is believed to know, and `known` learns the path as known by the peer (so a later delta
    /// of the same batch sharing the prefix carries only what follows it). The caller forgets
    /// the peer's paths if the batch is not queued.
    pub fn for_peer(&self, peer: SocketAddr, known: &mut PathChains) -> DeltaBatch {
        let mut batches = self.for_peers(&[peer], known);
        batches.pop().unwrap_or_else(|| self.batch.clone())
    }

    /// [`RoundBatch::for_peer`] for each of `peers`, in their order: each path is learned once,
    /// as known by all of them.
    pub fn for_peers(&self, peers: &[SocketAddr], known: &mut PathChains) -> Vec<DeltaBatch> {
        let mut batches = vec![self.batch.clone(); peers.len()];
        for (at, path) in self.paths.iter().enumerate() {
            let Some(path) = path else {
                continue;
            };
            let KeyData::Tokens(tokens) = &path.key else {
                continue;
            };
            for (batch, &peer) in batches.iter_mut().zip(peers) {
                let Some(delta) = batch.deltas.get_mut(at) else {
                    continue;
                };
                let base = known.base_for(peer, &path.chains, tokens.pages());
                delta.partition = path.partition;
                delta.block_size = path.block_size as u32;
                delta.base_pages = base.pages as u32;
                delta.base_chain = match base.pages {
                    0 => 0,
                    pages => path.chains[pages - 1],
                };
                delta.base_path = base.path;
                delta.pages = tokens.pages()[base.pages..].to_vec();
            }
            known.learn_chains(tokens, path.root, &path.chains, peers);
        }
        batches
    }
}

/// One gossip round's deltas, batched per model, each (path, worker) once.
#[derive(Debug, Default)]
pub struct DeltaRound {
    batches: HashMap<u64, ModelRound>,
    seen: HashSet<(u64, u64, u32)>,
    deltas: usize,
}

#[derive(Debug, Default)]
struct ModelRound {
    urls: UrlList,
    deltas: Vec<Delta>,
    paths: Vec<Option<Arc<RoundPath>>>,
}

/// Whether a delta was kept for the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batched {
    /// Added to its model's batch.
    Added,
    /// Already in the round.
    Duplicate,
    /// The round is full (`MESH_ROUND_DELTAS_MAX`).
    Full,
}

impl DeltaRound {
    /// Adds `worker_url` holding the path `hash` of `kind` under `model`, with its pages when
    /// it is a token path.
    pub fn add(
        &mut self,
        model: u64,
        (kind, hash): (TreeKind, u64),
        worker_url: &str,
        path: Option<Arc<RoundPath>>,
    ) -> Batched {
        let round = self.batches.entry(model).or_default();
        let worker = round.urls.index(worker_url);
        if !self.seen.insert((model, hash, worker)) {
            return Batched::Duplicate;
        }
        if self.deltas >= MESH_ROUND_DELTAS_MAX {
            return Batched::Full;
        }
        let kind = match kind {
            TreeKind::Text => wire::TreeKind::Text,
            TreeKind::Tokens => wire::TreeKind::Token,
        };
        round.deltas.push(Delta {
            kind: kind as i32,
            path_hash: hash,
            worker,
            ..Delta::default()
        });
        round.paths.push(path);
        self.deltas += 1;
        Batched::Added
    }

    /// Deltas in the round.
    pub fn len(&self) -> usize {
        self.deltas
    }

    /// Whether the round has no delta.
    pub fn is_empty(&self) -> bool {
        self.deltas == 0
    }

    /// The round's batches, one per model, and an empty round for the next.
    pub fn take(&mut self) -> Vec<RoundBatch> {
        self.seen.clear();
        self.deltas = 0;
        let batches = self.batches.drain().filter(|(_, r)| !r.deltas.is_empty());
        batches
            .map(|(model, round)| RoundBatch {
                batch: DeltaBatch {
                    model,
                    worker_urls: round.urls.urls,
                    deltas: round.deltas,
                    // Set by the gossip round, which knows whom it sends to and its numbering.
                    recipients: 0,
                    epoch: 0,
                    known_before: 0,
                },
                paths: round.paths,
            })
            .collect()
    }
}

/// A delta's token path, rebuilt from the known path it builds on (`chains`) and the pages it
/// carries, with its path hash and chain hashes (anchors and end: only the pages past the
/// base's last anchor are hashed); `None` when it carries none, names a path not known here,
/// is longer than `MESH_PATH_PAGES_MAX`, or does not hash to its path (peers agree on hashes).
pub fn delta_key(
    chains: &PathChains,
    model: u64,
    delta: &Delta,
) -> Option<(Namespace, KeyData, Chained)> {
    if delta.kind != wire::TreeKind::Token as i32 || delta.block_size == 0 {
        return None;
    }
    let depth = delta.base_pages as usize;
    if depth.saturating_add(delta.pages.len()) > MESH_PATH_PAGES_MAX
        || depth + delta.pages.len() == 0
    {
        return None;
    }
    let namespace = Namespace {
        model,
        partition: delta.partition,
    };
    let block_size = delta.block_size as usize;
    let root = chains::chain_root(namespace, block_size);
    let mut pages = Vec::with_capacity(depth + delta.pages.len());
    let mut anchors = Vec::with_capacity((depth + delta.pages.len()) / chains::ANCHOR_PAGES);
    if depth > 0 {
        let base = chains.base_of(delta.base_path, delta.base_chain, depth)?;
        pages.extend_from_slice(base.pages);
        anchors.extend_from_slice(base.anchors);
    }
    pages.extend_from_slice(&delta.pages);
    let key = KeyData::Tokens(index::token_key_of_pages(&pages, block_size));
    let hash = path_hash(namespace, &key)?;
    if hash != delta.path_hash {
        return None;
    }
    // The base's anchors came with it: the chain is hashed from its last anchor on.
    let from = anchors.len() * chains::ANCHOR_PAGES;
    let chain = anchors.last().copied().unwrap_or(root);
    let chained = Chained::extend(anchors, chain, from, &pages);
    Some((namespace, key, chained))
}

/// A repair entry's path, rebuilt: token paths from their pages; text paths only when known.
pub fn entry_key(
    known: &KnownPaths,
    model: u64,
    entry: &RepairEntry,
) -> Option<(Namespace, KeyData)> {
    if let Some(path) = known.get(model, entry.path_hash) {
        return Some((path.namespace, path.key.clone()));
    }
    if entry.kind != wire::TreeKind::Token as i32 || entry.pages.is_empty() || entry.block_size == 0
    {
        return None;
    }
    let namespace = Namespace {
        model,
        partition: entry.partition,
    };
    let key = KeyData::Tokens(index::token_key_of_pages(
        &entry.pages,
        entry.block_size as usize,
    ));
    // A page list that does not hash to the entry's path is refused: peers agree on hashes.
    (path_hash(namespace, &key) == Some(entry.path_hash)).then_some((namespace, key))
}
