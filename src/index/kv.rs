//! The KV-event index: which engines hold which blocks, as the engines report it (their KV
//! events), instead of as the gateway predicts it (the trees).
//!
//! Blocks are keyed by a content hash chained by position ([`chain_hashes`]): a block's key
//! hashes its tokens ([`page_hash`]) with its parent's chain state, so equal prefixes share keys
//! and the request side computes the same keys from its token IDs (over its page hashes). The
//! engines' own block hashes are engine-specific (seeded, or over other inputs); each worker's
//! map from its block hashes to ours turns a removal into ours.
//!
//! - [`KvIndexReader`] (one per data core): [`KvIndexReader::publishing`] says whether a model's
//!   workers publish events (and the block size they reported), [`KvIndexReader::lookup`] walks
//!   a request's keys in order and returns every worker holding at least its first block with
//!   how many consecutive leading blocks it holds. It takes no lock, allocates nothing and
//!   writes nothing.
//! - [`KvIndexWriter`] (one, on the control core): `attach` a publishing worker (it gets one of
//!   `KV_EVENT_WORKERS_MAX` bits), `store`, `remove` and `clear` its blocks, `detach` it, and
//!   [`KvIndexWriter::publish_models`] which models are served by publishing workers.
//!
//! A slot of the shared [`SlotTable`] is the key and a bitmap of the workers holding the block.
//! The map holds at most `KV_BLOCKS_MAX` blocks; stores beyond are refused and counted. Each
//! publishing worker may add at most its share of them (`blocks_max` over the workers
//! attached, [`KvIndexWriter::share`]), counted as the blocks it alone holds: a publisher that
//! stores millions of blocks fills its own share, not the index, so the others' new prefixes
//! are still stored (its blocks past the share are refused and counted as `over_share`).
//! Blocks another worker holds too cost the index nothing more, so holding them is never
//! refused (workers sharing a system prompt all list it). A block whose parent is unknown (its
//! parent's event was missed) cannot be reached from a request's first block and is not stored
//! (counted as an orphan).
//!
//! Beside the engines' table, the in-flight overlay ([`overlay`], on with
//! [`KvIndexWriter::with_inflight_overlay`]): blocks of requests the gateway dispatched, held
//! provisionally by their worker until its events confirm them or the request ends. A lookup
//! counts them with the engines' blocks and says which holders it counted on the overlay alone
//! ([`BlockMatch::held_by`]); nothing of it is ever written into the engines' table.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::keys::page_hash;
use super::slots::{Probe, SlotTable};
use crate::ids::WorkerId;
use crate::limits::{KV_EVENT_WORKERS_MAX, KV_INFLIGHT_BLOCKS_MAX};
use engine_blocks::EngineBlocks;
pub use overlay::{FlightEnd, FlightId, FlightStats};
use overlay::{Flights, Provisional};

/// The parent key of a sequence's first block.
const CHAIN_ROOT: u64 = 0x243f_6a88_85a3_08d3;

/// How many keys ahead a lookup prefetches: enough misses in flight to hide memory latency
/// (8, 16 and 32 measured: 32 walks 128k tokens fastest, the three alike at 8k).
const PREFETCH_AHEAD: usize = 32;

/// Table slots per block allowed: at a load of at most 2/3 a probe run longer than
/// `PLACEMENT_PROBE_MAX` (a store refused though the index is not full) is vanishingly rare; at
/// 4/5, with the bound at 64, 1.5% of the benchmark's blocks were refused.
const SLOTS_PER_BLOCKS_NUM: usize = 3;
const SLOTS_PER_BLOCKS_DEN: usize = 2;

/// The chain state after a block whose tokens hash to `page`, `parent` the state after the
/// block before it ([`CHAIN_ROOT`] for a sequence's first block): a polynomial over the page
/// hashes, so that the serial part of a walk is one multiply and one add per block.
fn chain_state(parent: u64, page: u64) -> u64 {
    parent
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(page)
}

/// A page hash with what the engine folded into its block hash besides the tokens (`salt`,
/// not 0): a value no plain page hash is but by chance.
fn salted_page(page: u64, salt: u64) -> u64 {
    (page ^ salt.rotate_left(23))
        .wrapping_mul(0xc4ce_b9fe_1a85_ec53)
        .rotate_left(31)
        ^ salt
}

/// The key of the block whose chain state is `state` (never 0): Murmur3's finalizer, so every
/// bit of every page counts; independent for each block of a walk, so they overlap.
fn block_key(state: u64) -> u64 {
    let mut x = state;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x.max(1)
}

/// The keys of a request's whole blocks, from their page hashes (`TokenPages::pages`, hashed
/// with the index's block size), into `out` (cleared first).
pub fn chain_hashes(pages: &[u64], out: &mut Vec<u64>) {
    out.clear();
    let mut state = CHAIN_ROOT;
    out.extend(pages.iter().map(|&page| {
        state = chain_state(state, page);
        block_key(state)
    }));
}

/// The workers holding a request's first block, each with how many consecutive leading blocks
/// it holds, most first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMatch {
    /// `(worker, blocks)`; `len` are valid.
    pub holders: [(WorkerId, u32); KV_EVENT_WORKERS_MAX],
    /// How many of `holders` are valid.
    pub len: u8,
    /// Whole blocks in the request.
    pub request_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Bit `i` set: `holders[i]`'s count includes blocks only in flight to it (the overlay, or
    /// this core's recent dispatches), not all confirmed by its engine.
    pub provisional: u64,
}

impl Default for BlockMatch {
    fn default() -> Self {
        BlockMatch {
            holders: [(WorkerId(0), 0); KV_EVENT_WORKERS_MAX],
            len: 0,
            request_blocks: 0,
            block_size: 0,
            provisional: 0,
        }
    }
}

impl BlockMatch {
    /// The holders, most blocks first.
    pub fn holders(&self) -> &[(WorkerId, u32)] {
        &self.holders[..usize::from(self.len)]
    }

    /// The leading blocks `worker` holds, and whether some of them are only in flight to it
    /// (`(0, false)`: not a holder).
    pub fn held_by(&self, worker: WorkerId) -> (u32, Provenance) {
        let len = usize::from(self.len);
        match self.holders[..len].iter().position(|(w, _)| *w == worker) {
            Some(i) if self.provisional & (1 << i) != 0 => {
                (self.holders[i].1, Provenance::InFlight)
            }
            Some(i) => (self.holders[i].1, Provenance::Engine),
            None => (0, Provenance::Engine),
        }
    }

    /// Counts `worker` as holding `blocks` leading blocks unless it holds more already (a
    /// dispatch whose blocks its engine has not reported yet); the order is kept.
    pub fn add_holder(&mut self, worker: WorkerId, blocks: u32) {
        let len = usize::from(self.len);
        let mut i = match self.holders[..len].iter().position(|(w, _)| *w == worker) {
            Some(i) if self.holders[i].1 >= blocks => return,
            Some(i) => {
                self.holders[i].1 = blocks;
                i
            }
            None if len < KV_EVENT_WORKERS_MAX => {
                self.holders[len] = (worker, blocks);
                self.len += 1;
                len
            }
            None => return,
        };
        self.provisional |= 1 << i;
        // Most blocks first: the changed holder moves up past those holding fewer (its
        // provisional bit with it).
        while i > 0 && self.holders[i - 1].1 < self.holders[i].1 {
            self.holders.swap(i - 1, i);
            let (below, here) = (
                (self.provisional >> (i - 1)) & 1,
                (self.provisional >> i) & 1,
            );
            self.provisional &= !(0b11 << (i - 1));
            self.provisional |= (below << i) | (here << (i - 1));
            i -= 1;
        }
    }
}

/// What a holder's count of blocks rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// Every block counted was reported by the worker's engine.
    Engine,
    /// Some were only in flight to it.
    InFlight,
}

/// The models whose workers publish KV events, each with the block size its workers' events
/// reported (the control core builds it from the catalog; the data cores read it per request).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishingModels {
    /// `(model hash, tokens per block)`; 0: no block stored yet.
    pub models: Vec<(u64, u32)>,
    /// Publishing workers whose models are unknown serve every model: their block size (0: no
    /// block stored yet), `None` when there are none.
    pub any_model: Option<u32>,
}

impl PublishingModels {
    /// Whether `model`'s workers publish: `Some(block size)` (`None` inside: not learned yet).
    pub fn of(&self, model: u64) -> Option<Option<usize>> {
        let size = self
            .models
            .iter()
            .find(|(m, _)| *m == model)
            .map(|(_, size)| *size)
            .or(self.any_model)?;
        Some((size > 0).then_some(size as usize))
    }
}

/// The index as readers see it, published by the writer: the table of blocks and their holders'
/// bits, which worker each bit stands for, and which models are served by publishing workers.
#[derive(Debug)]
struct BlockHolders {
    table: SlotTable<2>,
    /// `worker id + 1` of each bit (0: free).
    workers: [AtomicU32; KV_EVENT_WORKERS_MAX],
    /// Workers attached and not detached.
    attached: AtomicU64,
    models: ArcSwap<PublishingModels>,
    /// The in-flight overlay's table (empty while it is off).
    provisional: Provisional,
}

/// A data core's handle on the index.
#[derive(Clone, Debug)]
pub struct KvIndexReader {
    shared: Arc<BlockHolders>,
}

impl KvIndexReader {
    /// Whether `model`'s workers publish events: `Some(block size they reported)`, `None`
    /// inside until a block was stored. A model without publishing workers: `None`.
    pub fn publishing(&self, model: u64) -> Option<Option<usize>> {
        self.shared.models.load().of(model)
    }

    /// Whether any worker publishes its events (the index then answers token requests).
    pub fn is_live(&self) -> bool {
        self.shared.attached.load(Ordering::Acquire) != 0
    }

    /// The holders of the request whose block keys are `chain` ([`chain_hashes`] of its pages
    /// of `block_size` tokens): the engines' blocks and, with the overlay on, the blocks of
    /// requests in flight to them ([`BlockMatch::held_by`] says whose count rests on those).
    pub fn lookup(&self, chain: &[u64], block_size: usize) -> BlockMatch {
        let mut found = BlockMatch {
            request_blocks: u32::try_from(chain.len()).unwrap_or(u32::MAX),
            block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
            ..BlockMatch::default()
        };
        // The holders in the order they drop out of the walk, so by how many blocks they hold,
        // fewest first (no sort needed), and how many each holds (and the engine confirmed).
        let mut order = [0u8; KV_EVENT_WORKERS_MAX];
        let mut dropped_out = 0;
        let mut depth = [0u32; KV_EVENT_WORKERS_MAX];
        let mut confirmed_depth = [0u32; KV_EVENT_WORKERS_MAX];
        let mut record = |bits: u64, blocks: u32| {
            let mut bits = bits;
            while bits != 0 {
                let bit = bits.trailing_zeros() as usize;
                depth[bit] = blocks;
                order[dropped_out] = bit as u8;
                dropped_out += 1;
                bits &= bits - 1;
            }
        };
        let mut record_confirmed = |bits: u64, blocks: u32| {
            let mut bits = bits;
            while bits != 0 {
                confirmed_depth[bits.trailing_zeros() as usize] = blocks;
                bits &= bits - 1;
            }
        };
        // `alive_confirmed` is always within `alive`: a walk ends when `alive` is empty.
        let (mut alive, mut alive_confirmed) = (u64::MAX, u64::MAX);
        let mut blocks = 0u32;
        let (table, provisional) = (&self.shared.table, &self.shared.provisional);
        for &key in chain.iter().take(PREFETCH_AHEAD) {
            table.prefetch(key);
        }
        for (i, &key) in chain.iter().enumerate() {
            // The walk's probes are independent: a few keys ahead are already on their way.
            if let Some(&ahead) = chain.get(i + PREFETCH_AHEAD) {
                table.prefetch(ahead);
            }
            let confirmed = table.read(key).map_or(0, |words| words[1]);
            let next = alive & (confirmed | provisional.holders(key));
            let next_confirmed = alive_confirmed & confirmed;
            if blocks > 0 {
                record(alive & !next, blocks);
                record_confirmed(alive_confirmed & !next_confirmed, blocks);
            }
            alive = next;
            alive_confirmed = next_confirmed;
            if alive == 0 {
                break;
            }
            blocks += 1;
        }
        if blocks > 0 {
            record(alive, blocks);
            record_confirmed(alive_confirmed, blocks);
        }
        for &bit in order[..dropped_out].iter().rev() {
            let id = self.shared.workers[usize::from(bit)].load(Ordering::Acquire);
            if id > 0 {
                let worker = WorkerId((id - 1) as u16);
                let (at, bit) = (usize::from(found.len), usize::from(bit));
                found.holders[at] = (worker, depth[bit]);
                if confirmed_depth[bit] < depth[bit] {
                    found.provisional |= 1 << at;
                }
                found.len += 1;
            }
        }
        found
    }
}

/// A publishing worker's state in the writer.
#[derive(Debug)]
struct Publisher {
    worker: WorkerId,
    /// The worker's block hashes, mapped to our chain states (a block's key is its state's
    /// [`block_key`]; its children's states follow from it).
    blocks: EngineBlocks,
    /// Tokens per block of its last stored block (0: none yet).
    block_size: u32,
}

/// Why events were not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvIndexError {
    /// Every bit is taken by another publishing worker.
    #[error("at most {KV_EVENT_WORKERS_MAX} workers can publish KV events to one gateway")]
    TooManyWorkers,
    /// The worker was never attached (or was detached).
    #[error("worker {0:?} does not publish KV events here")]
    NotAttached(WorkerId),
}

/// What a store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Blocks the worker now holds that it did not.
    pub stored: u64,
    /// Blocks whose parent was unknown: not reachable, not stored.
    pub orphans: u64,
    /// Blocks refused because the index holds its most blocks.
    pub refused: u64,
    /// Blocks refused because the worker holds its share of the index.
    pub over_share: u64,
}

/// The control core's handle: the only writer.
#[derive(Debug)]
pub struct KvIndexWriter {
    shared: Arc<BlockHolders>,
    blocks_max: usize,
    live_blocks: usize,
    /// Per bit: the blocks that worker alone holds (what its share bounds).
    sole: [usize; KV_EVENT_WORKERS_MAX],
    publishers: [Option<Publisher>; KV_EVENT_WORKERS_MAX],
    /// The `(state, key)` of a stored run's blocks, or the keys of removed ones: a batch's keys
    /// are computed and their slots prefetched before any is touched.
    scratch: Vec<(u64, u64)>,
    /// The in-flight overlay's claims (`None`: off).
    flights: Option<Flights>,
}

impl KvIndexWriter {
    /// An empty index for `blocks_max` distinct blocks (`limits::KV_BLOCKS_MAX` in the gateway).
    pub fn new(blocks_max: usize) -> Self {
        let slots = blocks_max * SLOTS_PER_BLOCKS_NUM / SLOTS_PER_BLOCKS_DEN + 1;
        KvIndexWriter {
            shared: Arc::new(BlockHolders {
                table: SlotTable::new(slots),
                workers: std::array::from_fn(|_| AtomicU32::new(0)),
                attached: AtomicU64::new(0),
                models: ArcSwap::from_pointee(PublishingModels::default()),
                provisional: Provisional::new(0),
            }),
            blocks_max,
            live_blocks: 0,
            sole: [0; KV_EVENT_WORKERS_MAX],
            publishers: std::array::from_fn(|_| None),
            scratch: Vec::new(),
            flights: None,
        }
    }

    /// Turns the in-flight overlay on, its claims living at most `ttl` (`--kv-inflight-ttl-secs`).
    /// Called before any reader is made (the overlay's table is sized here).
    pub fn with_inflight_overlay(mut self, ttl: std::time::Duration) -> Self {
        let blocks_max = self.blocks_max.min(KV_INFLIGHT_BLOCKS_MAX);
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.provisional = Provisional::new(blocks_max),
            None => unreachable!("the overlay is turned on before readers are made"),
        }
        self.flights = Some(Flights::new(ttl.as_millis() as u64, blocks_max));
        self
    }

    /// The request `id` went to `worker`, its prompt's block keys `keys` ([`chain_hashes`]):
    /// they count as the worker's (provisionally) until its engine stores them or the request
    /// ends. Nothing with the overlay off or for a worker that does not publish.
    pub fn dispatched(
        &mut self,
        id: FlightId,
        worker: WorkerId,
        keys: &[u64],
        now_ms: u64,
    ) -> FlightStats {
        let Some((bit, _)) = self.publisher(worker) else {
            return FlightStats::default();
        };
        let Some(flights) = self.flights.as_mut() else {
            return FlightStats::default();
        };
        let (table, provisional) = (&self.shared.table, &self.shared.provisional);
        let mask = 1u64 << bit;
        let confirmed = |key| table.read(key).is_some_and(|words| words[1] & mask != 0);
        flights.start(provisional, id, bit as u8, keys, now_ms, confirmed)
    }

    /// The request `id` ended (`end`): a failed one's claims go now, an answered one's once
    /// confirmed or after `KV_INFLIGHT_CONFIRM_GRACE`.
    pub fn flight_ended(&mut self, id: FlightId, end: FlightEnd, now_ms: u64) {
        if let Some(flights) = self.flights.as_mut() {
            flights.end(&self.shared.provisional, id, end, now_ms);
        }
    }

    /// Lets go of flights past their time (the TTL, or the grace after their answer); returns
    /// how many.
    pub fn expire_flights(&mut self, now_ms: u64) -> usize {
        match self.flights.as_mut() {
            Some(flights) => flights.expire(&self.shared.provisional, now_ms),
            None => 0,
        }
    }

    /// Requests in flight, and the `(block, worker)` pairs they hold provisionally.
    pub fn inflight(&self) -> (usize, usize) {
        self.flights
            .as_ref()
            .map_or((0, 0), |f| (f.len(), f.claims()))
    }

    /// A reader for a data core.
    pub fn reader(&self) -> KvIndexReader {
        KvIndexReader {
            shared: self.shared.clone(),
        }
    }

    /// Distinct blocks held by any worker.
    pub fn live_blocks(&self) -> usize {
        self.live_blocks
    }

    /// The most blocks one worker may hold alone: `blocks_max` over the workers attached. A
    /// worker over it after another attached adds no new block until its evictions bring it
    /// under.
    pub fn share(&self) -> usize {
        let attached = self.shared.attached.load(Ordering::Relaxed) as usize;
        self.blocks_max / attached.max(1)
    }

    /// Blocks `worker` holds.
    pub fn blocks_of(&self, worker: WorkerId) -> usize {
        self.publisher(worker).map_or(0, |(_, p)| p.blocks.len())
    }

    /// Tokens per block of `worker`'s last stored block (`None`: none yet, or not attached).
    pub fn block_size_of(&self, worker: WorkerId) -> Option<u32> {
        self.publisher(worker)
            .map(|(_, p)| p.block_size)
            .filter(|size| *size > 0)
    }

    /// The engine hashes of every block `worker` holds (tests compare them with the engine's).
    pub fn engine_hashes_of(&self, worker: WorkerId) -> Vec<u64> {
        self.publisher(worker)
            .map(|(_, p)| p.blocks.iter().map(|(engine, _)| engine).collect())
            .unwrap_or_default()
    }

    /// Tells the data cores which models' workers publish (a request for one of them with
    /// token IDs is routed on this index).
    pub fn publish_models(&self, models: PublishingModels) {
        if **self.shared.models.load() != models {
            self.shared.models.store(Arc::new(models));
        }
    }

    /// Bytes held: the table and every worker's block map.
    pub fn memory_bytes(&self) -> usize {
        let maps: usize = self
            .publishers
            .iter()
            .flatten()
            .map(|p| p.blocks.memory_bytes())
            .sum();
        self.shared.table.memory_bytes() + self.shared.provisional.table.memory_bytes() + maps
    }

    /// Lets `worker` publish: it gets a bit of its own (idempotent).
    pub fn attach(&mut self, worker: WorkerId) -> Result<(), KvIndexError> {
        if self.publisher(worker).is_some() {
            return Ok(());
        }
        let bit = self
            .publishers
            .iter()
            .position(Option::is_none)
            .ok_or(KvIndexError::TooManyWorkers)?;
        self.publishers[bit] = Some(Publisher {
            worker,
            blocks: EngineBlocks::default(),
            block_size: 0,
        });
        self.shared.workers[bit].store(u32::from(worker.0) + 1, Ordering::Release);
        self.shared.attached.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Drops every block of `worker` and frees its bit (it was removed, or stopped publishing).
    pub fn detach(&mut self, worker: WorkerId) {
        let Some(bit) = self.publisher(worker).map(|(bit, _)| bit) else {
            return;
        };
        self.clear(worker);
        if let Some(flights) = self.flights.as_mut() {
            flights.drop_worker(&self.shared.provisional, bit as u8);
        }
        self.shared.workers[bit].store(0, Ordering::Release);
        self.publishers[bit] = None;
        self.shared.attached.fetch_sub(1, Ordering::Release);
    }

    fn publisher(&self, worker: WorkerId) -> Option<(usize, &Publisher)> {
        self.publishers
            .iter()
            .enumerate()
            .find_map(|(bit, p)| p.as_ref().filter(|p| p.worker == worker).map(|p| (bit, p)))
    }

    /// `worker` stored the blocks `engine_hashes` (in order), the first a child of
    /// `parent` (`None`: a sequence's first block), whose tokens are `token_ids`, `block_size`
    /// per block.
    pub fn store(
        &mut self,
        worker: WorkerId,
        engine_hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        block_size: usize,
    ) -> Result<StoreStats, KvIndexError> {
        self.store_salted(worker, engine_hashes, parent, token_ids, block_size, &[])
    }

    /// [`KvIndexWriter::store`] of blocks whose engine hashes fold more than their tokens
    /// (`salts`, one per block, 0: nothing; empty: nothing for any): a LoRA, a `cache_salt`,
    /// multimodal inputs. Such a block and its descendants get keys no plain request's chain
    /// reaches, as the engine's hashes do: a request without them is not predicted a hit.
    pub fn store_salted(
        &mut self,
        worker: WorkerId,
        engine_hashes: &[u64],
        parent: Option<u64>,
        token_ids: &[u32],
        block_size: usize,
        salts: &[u64],
    ) -> Result<StoreStats, KvIndexError> {
        let (bit, _) = self
            .publisher(worker)
            .ok_or(KvIndexError::NotAttached(worker))?;
        let mut stats = StoreStats::default();
        if block_size == 0 {
            stats.orphans = engine_hashes.len() as u64;
            return Ok(stats);
        }
        let share = self.share();
        let blocks = &mut self.publishers[bit];
        let Some(publisher) = blocks.as_mut() else {
            return Err(KvIndexError::NotAttached(worker));
        };
        // The blocks stored teach the request side how to cut this model's prompts.
        publisher.block_size = u32::try_from(block_size).unwrap_or(u32::MAX);
        let mut state = match parent {
            None => CHAIN_ROOT,
            Some(engine) => match publisher.blocks.get(engine) {
                Some(ours) => ours,
                None => {
                    stats.orphans = engine_hashes.len() as u64;
                    return Ok(stats);
                }
            },
        };
        // The run's keys first, their table slots and map buckets on their way meanwhile: the
        // misses overlap instead of following one another.
        let table = &self.shared.table;
        self.scratch.clear();
        let pages = engine_hashes.iter().zip(token_ids.chunks_exact(block_size));
        for (i, (engine, tokens)) in pages.enumerate() {
            let page = match salts.get(i) {
                Some(&salt) if salt != 0 => salted_page(page_hash(tokens), salt),
                _ => page_hash(tokens),
            };
            state = chain_state(state, page);
            let key = block_key(state);
            table.prefetch(key);
            publisher.blocks.prefetch(*engine);
            self.scratch.push((state, key));
        }
        let mask = 1u64 << bit;
        for (i, (engine, &(state, key))) in engine_hashes.iter().zip(&self.scratch).enumerate() {
            // Alone, a worker's share is the whole index: a full index says so (`refused`).
            match table.probe(key) {
                Probe::Found(slot) => {
                    let holders = &table.words(slot)[1];
                    let held = holders.load(Ordering::Relaxed);
                    if held & mask == 0 {
                        holders.store(held | mask, Ordering::Release);
                        stats.stored += 1;
                        if held.count_ones() == 1 {
                            self.sole[held.trailing_zeros() as usize] -= 1;
                        }
                    }
                }
                // Alone, a worker's share is the whole index: a full index says so (`refused`).
                Probe::Vacant(_) if share < self.blocks_max && self.sole[bit] >= share => {
                    // The rest of the sequence hangs off a block the worker may not add.
                    stats.over_share += (self.scratch.len() - i) as u64;
                    break;
                }
                Probe::Vacant(slot) if self.live_blocks < self.blocks_max => {
                    table.insert(slot, key, &[mask]);
                    self.live_blocks += 1;
                    self.sole[bit] += 1;
                    stats.stored += 1;
                }
                Probe::Vacant(_) | Probe::RunFull => {
                    stats.refused += 1;
                    // The rest of the sequence hangs off a block the index does not hold.
                    break;
                }
            }
            publisher.blocks.insert(*engine, state);
            if let Some(flights) = self.flights.as_mut() {
                flights.confirm(&self.shared.provisional, key, bit as u8);
            }
        }
        Ok(stats)
    }

    /// `worker` evicted the blocks `engine_hashes`; returns how many it held.
    pub fn remove(&mut self, worker: WorkerId, engine_hashes: &[u64]) -> u64 {
        let Some((bit, _)) = self.publisher(worker) else {
            return 0;
        };
        let Some(publisher) = self.publishers[bit].as_mut() else {
            return 0;
        };
        // As in `store`: the buckets, then the table slots, fetched before they are used.
        for &engine in engine_hashes {
            publisher.blocks.prefetch(engine);
        }
        self.scratch.clear();
        for &engine in engine_hashes {
            if let Some(state) = publisher.blocks.remove(engine) {
                let key = block_key(state);
                self.shared.table.prefetch(key);
                self.scratch.push((state, key));
            }
        }
        for i in 0..self.scratch.len() {
            let (_, key) = self.scratch[i];
            self.drop_holder(key, bit);
        }
        self.scratch.len() as u64
    }

    /// `worker` cleared its whole cache (or restarted).
    pub fn clear(&mut self, worker: WorkerId) -> u64 {
        let Some((bit, _)) = self.publisher(worker) else {
            return 0;
        };
        let blocks = self.publishers[bit]
            .as_mut()
            .map(|p| std::mem::take(&mut p.blocks))
            .unwrap_or_default();
        for (_, state) in blocks.iter() {
            self.drop_holder(block_key(state), bit);
        }
        blocks.len() as u64
    }

    /// Takes `bit` out of `key`'s holders; a block nobody holds leaves the table.
    fn drop_holder(&mut self, key: u64, bit: usize) {
        let table = &self.shared.table;
        let Probe::Found(slot) = table.probe(key) else {
            return;
        };
        let holders = &table.words(slot)[1];
        let held = holders.load(Ordering::Relaxed);
        if held & (1u64 << bit) == 0 {
            return;
        }
        let left = held & !(1u64 << bit);
        if left == 0 {
            table.remove(slot, |_, _| {});
            self.live_blocks -= 1;
            self.sole[bit] -= 1;
        } else {
            holders.store(left, Ordering::Release);
            if left.count_ones() == 1 {
                self.sole[left.trailing_zeros() as usize] += 1;
            }
        }
    }
}

mod engine_blocks;
pub mod overlay;
#[cfg(test)]
mod tests;
