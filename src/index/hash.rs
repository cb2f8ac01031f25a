//! The hash index (`--cache-index hash`): a TTL'd exact-match placement map of request heads.
//!
//! A request's *heads* are the hashes of its first N token IDs at each `--cache-boundaries`
//! position N its length reaches, under its cache namespace ([`request_heads`]: computed from the
//! token tree's page hashes where N is a multiple of `--block-size`, so a request is hashed once
//! whatever the mode). The map keeps, per head, up to three holders (the spec's cap;
//! `--cache-holders-max` raises it to [`PLACEMENT_HOLDERS_MAX`]): the workers the gateway sent
//! that head to, each with the tick it was last sent.
//!
//! - [`HashIndexReader`] (one per data core, cloned): [`HashIndexReader::lookup`] returns the live
//!   holders of every head, deepest first. It takes no lock, allocates nothing and writes nothing.
//! - [`HashIndexWriter`] (one, on the control core): `record` (every dispatch, at each head; a
//!   holder past the cap evicts the stalest), `sweep` (drops expired holders, and heads left
//!   without one; per-model entry counts for `smg_cache_placement_entries`), `remove_worker`.
//!
//! The table is a fixed array of slots with linear probing, sized at start for
//! `PLACEMENT_HEADS_MAX` live heads (zeroed pages, committed as they are first written). A slot
//! is a cache line of eight atomic words: the key, and one word per holder place (`worker + 1`
//! above a 48-bit tick; places past the cap stay 0). A reader re-reads the key after the
//! holders: a slot reused for another head in between reads as a miss. Deleting shifts later
//! entries of a probe run back (no tombstones); a lookup racing that shift may miss a head:
//! routing then falls back to the lowest expected wait, never to a wrong holder. Two different
//! heads with equal 64-bit hashes would share holders (about 2^-64 per pair): a routing guess,
//! never what an engine computes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::slots::{Probe, SlotTable};
use super::{Namespace, TokenPages};
use crate::ids::WorkerId;
use crate::limits::{
    CACHE_BOUNDARIES_MAX, PLACEMENT_HOLDERS_DEFAULT, PLACEMENT_HOLDERS_MAX, WORKERS_MAX,
};

/// Table slots per live head allowed: a load of 3/4 keeps probe runs short.
const SLOTS_PER_HEADS_NUM: usize = 4;
const SLOTS_PER_HEADS_DEN: usize = 3;

/// Bits of a holder word that carry its tick (ms since the gateway started: 8,900 years).
const TICK_BITS: u32 = 48;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

/// One head of a request: the boundary it ends at, and its hash under the request's namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// Tokens in the head (the `--cache-boundaries` position).
    pub tokens: u32,
    /// The head's key in the map (never 0).
    pub hash: u64,
}

/// The heads of a request of `tokens` (page-hashed into `pages`) at each of `boundaries`
/// (ascending) its length reaches, written into `out` (shallowest first; cleared first). The
/// page hashes stand for the ids of whole pages; ids past the last whole page of a head are
/// hashed themselves.
pub fn request_heads(
    namespace: Namespace,
    tokens: &[u32],
    pages: &TokenPages,
    boundaries: &[u32],
    out: &mut Vec<Head>,
) {
    out.clear();
    let block_size = pages.block_size().max(1);
    let mut namespace_bytes = [0u8; 16];
    namespace_bytes[..8].copy_from_slice(&namespace.model.to_le_bytes());
    namespace_bytes[8..].copy_from_slice(&namespace.partition.to_le_bytes());
    let seed = xxh3_64(&namespace_bytes);
    let mut state = Xxh3::with_seed(seed);
    let mut hashed_pages = 0usize;
    for &boundary in boundaries.iter().take(CACHE_BOUNDARIES_MAX) {
        let end = boundary as usize;
        if end == 0 || end > tokens.len() {
            break;
        }
        let whole_pages = (end / block_size).min(pages.pages().len());
        update_with_words(&mut state, &pages.pages()[hashed_pages..whole_pages]);
        hashed_pages = whole_pages;
        let tail = &tokens[whole_pages * block_size..end];
        let hash = if tail.is_empty() {
            state.digest()
        } else {
            let mut with_tail = state.clone();
            for id in tail {
                with_tail.update(&id.to_le_bytes());
            }
            with_tail.digest()
        };
        out.push(Head {
            tokens: boundary,
            hash: hash.max(1),
        });
    }
}

/// Feeds 64-bit words to `state` in little-endian bytes, a stack buffer at a time.
fn update_with_words(state: &mut Xxh3, words: &[u64]) {
    let mut buf = [0u8; 256];
    for chunk in words.chunks(buf.len() / 8) {
        for (bytes, word) in buf.chunks_exact_mut(8).zip(chunk) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        state.update(&buf[..chunk.len() * 8]);
    }
}

/// The live holders of one head, most recently sent first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadHit {
    /// The head looked up.
    pub head: Head,
    /// Its live holders; `holders_len` are valid.
    pub holders: [WorkerId; PLACEMENT_HOLDERS_MAX],
    /// How many of `holders` are valid.
    pub holders_len: u8,
}

impl HeadHit {
    /// The valid holders, most recently sent first.
    pub fn holders(&self) -> &[WorkerId] {
        &self.holders[..usize::from(self.holders_len)]
    }
}

/// What a lookup found for a request's heads: every head, deepest first, with its live holders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadMatch {
    /// One hit per head, deepest first; `len` are valid.
    pub hits: [HeadHit; CACHE_BOUNDARIES_MAX],
    /// How many of `hits` are valid.
    pub len: u8,
}

impl HeadMatch {
    /// `heads` (shallowest first, as [`request_heads`] wrote them) deepest first, no holder yet.
    pub fn of(heads: &[Head]) -> HeadMatch {
        let mut found = HeadMatch::default();
        for head in heads.iter().rev().take(CACHE_BOUNDARIES_MAX) {
            found.hits[usize::from(found.len)].head = *head;
            found.len += 1;
        }
        found
    }

    /// Adds `worker` as a holder of the hit at `index`, unless it is one or the hit is full.
    pub fn add_holder(&mut self, index: usize, worker: WorkerId) {
        let hit = &mut self.hits[index];
        let len = usize::from(hit.holders_len);
        if len < PLACEMENT_HOLDERS_MAX && !hit.holders().contains(&worker) {
            hit.holders[len] = worker;
            hit.holders_len += 1;
        }
    }

    /// The hits, deepest head first.
    pub fn hits(&self) -> &[HeadHit] {
        &self.hits[..usize::from(self.len)]
    }

    /// Whether any head has a live holder.
    pub fn has_holder(&self) -> bool {
        self.hits().iter().any(|hit| hit.holders_len > 0)
    }
}

/// A holder word: `worker + 1` above the tick.
fn holder_word(worker: WorkerId, tick_ms: u64) -> u64 {
    (u64::from(worker.0) + 1) << TICK_BITS | (tick_ms & TICK_MASK)
}

fn holder_of(word: u64) -> Option<(WorkerId, u64)> {
    let id = word >> TICK_BITS;
    let worker = u16::try_from(id.checked_sub(1)?).ok()?;
    Some((WorkerId(worker), word & TICK_MASK))
}

/// Whether a holder sent at `tick_ms` is still live at `now_ms`.
fn is_live(tick_ms: u64, now_ms: u64, ttl_ms: u64) -> bool {
    now_ms.saturating_sub(tick_ms) <= ttl_ms
}

/// Words of a slot: the head's key, then its holders.
const SLOT_WORDS: usize = 1 + PLACEMENT_HOLDERS_MAX;

/// The slots, shared by the writer and every reader.
type Table = SlotTable<SLOT_WORDS>;

/// A data core's handle on the map.
#[derive(Clone, Debug)]
pub struct HashIndexReader {
    table: Arc<Table>,
    ttl_ms: u64,
}

impl HashIndexReader {
    /// The live holders of each of `heads` (shallowest first, as [`request_heads`] wrote them),
    /// returned deepest first; a holder sent more than the TTL before `now_ms` is not live.
    pub fn lookup(&self, heads: &[Head], now_ms: u64) -> HeadMatch {
        let mut found = HeadMatch::of(heads);
        for hit in &mut found.hits[..usize::from(found.len)] {
            if let Some(words) = self.read(hit.head.hash) {
                let mut live: [(WorkerId, u64); PLACEMENT_HOLDERS_MAX] = Default::default();
                let mut len = 0;
                for (worker, tick) in words.iter().filter_map(|w| holder_of(*w)) {
                    if is_live(tick, now_ms, self.ttl_ms) {
                        live[len] = (worker, tick);
                        len += 1;
                    }
                }
                live[..len].sort_unstable_by_key(|(_, tick)| std::cmp::Reverse(*tick));
                for (i, (worker, _)) in live[..len].iter().enumerate() {
                    hit.holders[i] = *worker;
                }
                hit.holders_len = len as u8;
            }
        }
        found
    }

    /// The holder words of `key`, if its slot is found and stayed its own while read.
    fn read(&self, key: u64) -> Option<[u64; PLACEMENT_HOLDERS_MAX]> {
        let words = self.table.read(key)?;
        Some(std::array::from_fn(|i| words[1 + i]))
    }
}

/// Why a record did not land.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HashIndexError {
    /// The most heads are live: new heads wait for the sweep.
    #[error("the hash index holds its most heads")]
    Full,
    /// No free slot within `PLACEMENT_PROBE_MAX` of the head's home.
    #[error("no free slot near the head's home")]
    ProbeRunFull,
    /// A worker id outside the worker table.
    #[error("worker id {0:?} is outside the worker table")]
    WorkerOutOfRange(WorkerId),
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Expired holders dropped.
    pub holders_dropped: u64,
    /// Heads removed (no live holder left).
    pub heads_removed: u64,
}

/// The control core's handle: the only writer.
#[derive(Debug)]
pub struct HashIndexWriter {
    table: Arc<Table>,
    ttl_ms: u64,
    /// The most live heads (the table has a third more slots).
    heads_max: usize,
    /// The most holders a head keeps (`--cache-holders-max`).
    holders_max: usize,
    /// The model of each occupied slot (an index into `models`), moved with its entry.
    slot_model: Box<[u32]>,
    /// Model hashes by index, with their live heads.
    models: Vec<(u64, u64)>,
    /// Index in `models` by model hash.
    model_indexes: HashMap<u64, u32>,
    live_heads: usize,
}

impl HashIndexWriter {
    /// An empty map for `heads_max` live heads (`limits::PLACEMENT_HEADS_MAX` in the gateway)
    /// whose holders live `ttl_ms` after they were last sent.
    pub fn new(heads_max: usize, ttl_ms: u64) -> Self {
        let table = Table::new(heads_max * SLOTS_PER_HEADS_NUM / SLOTS_PER_HEADS_DEN + 1);
        let slots = table.len();
        HashIndexWriter {
            table: Arc::new(table),
            ttl_ms,
            heads_max,
            holders_max: PLACEMENT_HOLDERS_DEFAULT,
            slot_model: vec![0; slots].into_boxed_slice(),
            models: Vec::new(),
            model_indexes: HashMap::new(),
            live_heads: 0,
        }
    }

    /// The same map keeping at most `holders_max` holders per head (`--cache-holders-max`,
    /// clamped to 1..=[`PLACEMENT_HOLDERS_MAX`]) instead of the spec's three.
    pub fn with_holders_max(mut self, holders_max: usize) -> Self {
        self.holders_max = holders_max.clamp(1, PLACEMENT_HOLDERS_MAX);
        self
    }

    /// A reader for a data core.
    pub fn reader(&self) -> HashIndexReader {
        HashIndexReader {
            table: self.table.clone(),
            ttl_ms: self.ttl_ms,
        }
    }

    /// Heads with at least one holder.
    pub fn live_heads(&self) -> usize {
        self.live_heads
    }

    /// Bytes the map holds at most: its slots and the writer's per-slot model index (the pages
    /// not written yet are not committed, so the resident part can be less).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + self.slot_model.len() * std::mem::size_of::<u32>()
            + self.models.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// Records that `worker` was sent `heads` of a request of `model` at `tick_ms`: it becomes
    /// (or stays, refreshed) a holder of each; a head holding its most others drops the stalest.
    /// Expired holders met on the way are dropped. Heads that find no slot are skipped and the
    /// first error says why.
    pub fn record(
        &mut self,
        model: u64,
        heads: &[u64],
        worker: WorkerId,
        tick_ms: u64,
    ) -> Result<(), HashIndexError> {
        if worker.index() >= WORKERS_MAX {
            return Err(HashIndexError::WorkerOutOfRange(worker));
        }
        let mut first_error = None;
        for &key in heads.iter().take(CACHE_BOUNDARIES_MAX) {
            let key = key.max(1);
            if let Err(e) = self.record_head(model, key, worker, tick_ms) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn record_head(
        &mut self,
        model: u64,
        key: u64,
        worker: WorkerId,
        tick_ms: u64,
    ) -> Result<(), HashIndexError> {
        match self.table.probe(key) {
            Probe::Found(slot) => {
                self.add_holder(slot, worker, tick_ms);
                Ok(())
            }
            Probe::Vacant(_) if self.live_heads >= self.heads_max => Err(HashIndexError::Full),
            Probe::Vacant(slot) => {
                let mut holders = [0; PLACEMENT_HOLDERS_MAX];
                holders[0] = holder_word(worker, tick_ms);
                self.table.insert(slot, key, &holders);
                self.slot_model[slot] = self.model_index(model);
                self.models[self.slot_model[slot] as usize].1 += 1;
                self.live_heads += 1;
                Ok(())
            }
            Probe::RunFull => Err(HashIndexError::ProbeRunFull),
        }
    }

    /// Makes `worker` a holder of the head in `slot` at `tick_ms`: refreshed if it is one, else
    /// in a free or expired place among the first `holders_max`, else in the stalest holder's.
    fn add_holder(&mut self, slot: usize, worker: WorkerId, tick_ms: u64) {
        let table = self.table.clone();
        let holders = &table.words(slot)[1..=self.holders_max];
        let mut words_buf = [0u64; PLACEMENT_HOLDERS_MAX];
        for (word, holder) in words_buf.iter_mut().zip(holders) {
            *word = holder.load(Ordering::Relaxed);
        }
        let words = &words_buf[..self.holders_max];
        let place = words
            .iter()
            .position(|w| holder_of(*w).is_some_and(|(id, _)| id == worker))
            .or_else(|| {
                words.iter().position(|w| match holder_of(*w) {
                    None => true,
                    Some((_, tick)) => !is_live(tick, tick_ms, self.ttl_ms),
                })
            })
            .unwrap_or_else(|| {
                let tick = |i: usize| holder_of(words[i]).map_or(0, |(_, t)| t);
                (0..words.len()).min_by_key(|&i| tick(i)).unwrap_or(0)
            });
        // Records from different data cores may arrive out of order: a refresh keeps the newer.
        let tick = match holder_of(words[place]) {
            Some((id, old)) if id == worker => tick_ms.max(old),
            _ => tick_ms,
        };
        holders[place].store(holder_word(worker, tick), Ordering::Release);
    }

    fn model_index(&mut self, model: u64) -> u32 {
        let next = self.models.len() as u32;
        let index = *self.model_indexes.entry(model).or_insert(next);
        if index == next {
            self.models.push((model, 0));
        }
        index
    }

    /// Drops holders expired at `now_ms`, and heads left without one.
    pub fn sweep(&mut self, now_ms: u64) -> SweepStats {
        let ttl_ms = self.ttl_ms;
        self.retain_holders(|_, tick| is_live(tick, now_ms, ttl_ms))
    }

    /// Drops every holding of `worker` (it was removed from the gateway); returns the heads it
    /// held.
    pub fn remove_worker(&mut self, worker: WorkerId) -> u64 {
        self.retain_holders(|id, _| id != worker).holders_dropped
    }

    /// Keeps the holders `keep` accepts; removes heads left without one.
    fn retain_holders(&mut self, keep: impl Fn(WorkerId, u64) -> bool) -> SweepStats {
        let mut stats = SweepStats::default();
        let table = self.table.clone();
        let mut slot = 0;
        while slot < table.len() {
            let words = table.words(slot);
            if words[0].load(Ordering::Relaxed) == 0 {
                slot += 1;
                continue;
            }
            let mut any_live = false;
            for holder in &words[1..] {
                let word = holder.load(Ordering::Relaxed);
                match holder_of(word) {
                    Some((id, tick)) if !keep(id, tick) => {
                        holder.store(0, Ordering::Release);
                        stats.holders_dropped += 1;
                    }
                    Some(_) => any_live = true,
                    None => {}
                }
            }
            if any_live {
                slot += 1;
            } else {
                // The slot is refilled by the shift when a later entry moves back into it:
                // look at it again.
                self.remove_slot(slot);
                stats.heads_removed += 1;
                if table.words(slot)[0].load(Ordering::Relaxed) == 0 {
                    slot += 1;
                }
            }
        }
        stats
    }

    /// Empties `slot` (and shifts the rest of its probe run back, the models with them).
    fn remove_slot(&mut self, slot: usize) {
        let model = self.slot_model[slot] as usize;
        self.models[model].1 -= 1;
        self.live_heads -= 1;
        let slot_model = &mut self.slot_model;
        self.table
            .remove(slot, |from, to| slot_model[to] = slot_model[from]);
    }

    /// Live heads per model hash (`smg_cache_placement_entries`), for every model recorded
    /// since start (0 once its heads expired, as SMG reports it).
    pub fn gauges(&self) -> Vec<(u64, u64)> {
        self.models.clone()
    }
}

#[cfg(test)]
mod tests;
