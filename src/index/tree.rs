//! One tree kind (string or token): the published part readers walk (`SharedTree`) and the single
//! writer's private bookkeeping (`TreeWriter`): node metadata, tenant entries with their recency
//! lists, per-model budgets, the namespace map and the retired-memory list.
//!
//! Every write builds the new state off to the side and publishes it with one `Release` store,
//! so a reader always sees either the old or the new path, never a torn one: a new child is
//! appended into its parent's table and the table's length published (or the table rebuilt and
//! its pointer published, copy-on-write, when it has no room), a split or merge swaps one child
//! id for a node spelling the same edge. A split keeps the lower node (its label buffer still
//! holds the split-off part, so a reader arriving through the old child still compares the right
//! elements).
//!
//! Labels are windows of shared buffers (`LabelSource`): a split's halves keep the edge's
//! buffer, a merge of halves that still adjoin keeps it too, and a new leaf may keep the
//! dispatch record's key buffer; a label shorter than a quarter of its buffer gets a copy
//! (`LABEL_BUFFER_SHARE_MAX`), which bounds the memory a buffer can pin.
//!
//! An insert may start from a reader's `LookupHint` instead of the root; see `LookupHint` for
//! when the writer trusts it.
//!
//! This file holds the types both sides share and the writer's state; each job of the writer
//! is a file of its own, named for it:
//! - `walk.rs`: the read side, a data core's walk down a namespace (`SharedTree::walk`);
//! - `insert.rs`: `TreeWriter::insert` (from the root or a still-valid hint), new leaves, and
//!   the recency touch of every node on the path;
//! - `split.rs` and `merge.rs`: cutting an edge where a key leaves it, and joining a node with
//!   its only child when nothing tells them apart;
//! - `eviction.rs`: `TreeWriter::evict`, the models' budgets kept by removing least-recently-used
//!   entries (`remove_entry`, which the purge uses too);
//! - `purge.rs`: `TreeWriter::remove_worker`, every entry of a worker that left;
//! - `nodes.rs`: a node's slot, label buffer, stamp, metadata and tenant list, and its
//!   retirement; `children.rs`: child tables, published in place, copy-on-write or in batches;
//! - `namespaces.rs`: model budget slots and namespace roots, and the table readers probe.

mod children;
mod eviction;
mod insert;
mod merge;
mod namespaces;
mod nodes;
mod purge;
mod split;
mod walk;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::entries::{Entries, List};
use super::keys::Keying;
use super::raw::{
    buffer_of, ChildEntry, Domain, Element, Node, NsTablePtr, RetireList, Slab, WriterToken,
    MRU_LEN,
};
use super::{Namespace, TreeKind};
use crate::ids::WorkerId;
use crate::limits::{MODELS_MAX, WORKERS_MAX};
pub use insert::Key;
pub use walk::Walk;

/// The most elements of a key the index keeps: 64 Mi, above any accepted request body, so a
/// longer key is only a corrupt caller; it is cut to this length.
pub const KEY_ELEMENTS_MAX: usize = 1 << 26;
/// The most live namespaces per tree kind: each holds at least one unit of budget, so a budget
/// of `--max-tree-size` per model keeps far fewer; the bound stops a table rebuild loop.
pub const NAMESPACES_MAX: usize = 1 << 22;
// Each model keeps a small recency-list header forever; its namespaces share the table.
const _: () = assert!(MODELS_MAX <= NAMESPACES_MAX);

/// Slots of the first namespace table; it doubles (rebuilt off to the side) at half load.
const NS_CAPACITY_MIN: usize = 64;

/// Where a new node's label comes from.
enum LabelSource<'a, E: Element> {
    /// A buffer of its own (or a record's key buffer); the label ends at that element of it.
    Buffer(Arc<[E]>, usize),
    /// A window of a live node's buffer, ending at that element of it.
    Share(&'a Node<E>, usize),
}

impl<E: Element> LabelSource<'_, E> {
    /// A new buffer holding a copy of `label`.
    fn copy(label: &[E]) -> Self {
        LabelSource::Buffer(buffer_of(label), label.len())
    }
}

/// Hashes the writer's small integer keys (worker ids, node ids) with one multiply. These maps
/// are keyed by ids the gateway assigns, never by client input, so SipHash's resistance to
/// chosen collisions buys nothing there; namespaces (hashes of client fields) keep SipHash.
#[derive(Clone, Copy, Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(u64::from(*byte));
        }
    }

    fn write_u16(&mut self, value: u16) {
        self.write_u64(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(26) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // The multiply leaves its best bits high; hashbrown takes bucket bits from the low end.
        self.0 ^ (self.0 >> 29)
    }
}

/// A writer map keyed by gateway-assigned ids.
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// The published part of one tree kind.
#[derive(Debug)]
pub struct SharedTree<E: Element> {
    /// Node storage.
    pub slab: Slab<E>,
    /// Namespace → root node.
    pub namespaces: NsTablePtr,
}

impl<E: Element> Default for SharedTree<E> {
    fn default() -> Self {
        Self {
            slab: Slab::default(),
            namespaces: NsTablePtr::new(NS_CAPACITY_MIN),
        }
    }
}

/// A well-mixed hash of a namespace (the slot of its namespace-table probe).
pub fn ns_hash(ns: Namespace) -> u64 {
    let mut x = ns.model ^ ns.partition.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where a reader's lookup of a key ended, carried by the dispatch record to the writer, whose
/// insert of the same key then starts there instead of comparing the matched prefix again.
///
/// It names the deepest matched node by id and incarnation stamp. The writer follows it only
/// while that node is still the same live node: a node keeps the string its root path spells
/// for as long as it lives (splits above it keep the string, merges and evictions retire it and
/// clear its stamp), so the reader's comparison still holds. A stale hint (node retired, slot
/// reused, another namespace, another key) falls back to the full walk. The default is no hint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupHint {
    kind: Option<TreeKind>,
    node: u32,
    stamp: u64,
    /// Elements of the key matched, at a unit boundary.
    matched: u32,
    /// Elements of the key walked (after capping and trimming to whole units).
    key_len: u32,
}

/// How the writer's inserts used their lookup hints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HintCounts {
    /// Inserts that started where the lookup ended.
    pub followed: u64,
    /// Inserts whose hint was stale (or for another tree or key) and walked from the root.
    pub stale: u64,
}

/// What one writer operation needs from the shared state.
#[derive(Debug)]
pub struct WriteCtx<'a, E: Element> {
    /// The published tree.
    pub tree: &'a SharedTree<E>,
    /// The reclamation domain.
    pub domain: &'a Domain,
    /// The writer's capability.
    pub token: &'a WriterToken,
}

/// The writer's private view of one node.
#[derive(Debug, Default)]
struct Meta {
    /// Parent node (0 for a root or a free slot).
    parent: u32,
    /// Units on this node's edge (what each tenant entry costs the budget).
    units: u64,
    /// Model slot of the node's tree.
    model: u32,
    /// Tenants sorted by worker, with their entry ids.
    tenants: Vec<(WorkerId, u32)>,
    /// The published tenant list, most recent first.
    mru: [u16; MRU_LEN],
    mru_len: u8,
}

impl Meta {
    fn mru(&self) -> &[u16] {
        &self.mru[..usize::from(self.mru_len)]
    }
}

/// One model's budget state in one tree kind.
#[derive(Debug)]
struct ModelState {
    id: u64,
    lru: List,
    units: u64,
    entries: u64,
    worker_entries: IdMap<WorkerId, u64>,
}

/// Gauges of one model in one tree kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindGauges {
    /// Units held, counted once per holding worker (characters or tokens).
    pub units: u64,
    /// (node, worker) entries.
    pub entries: u64,
    /// Distinct workers holding anything.
    pub tenants: u64,
}

/// Memory of one tree kind, counted in its own arenas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindMemory {
    /// Live nodes.
    pub nodes: u64,
    /// Bytes of allocated slab segments (high-water mark).
    pub slab_bytes: u64,
    /// Bytes of live label allocations.
    pub label_bytes: u64,
    /// Bytes of live child tables.
    pub table_bytes: u64,
    /// Bytes of the writer's node metadata, tenant lists and entries.
    pub writer_bytes: u64,
    /// Items waiting for a grace period.
    pub pending_reclaim: u64,
}

impl KindMemory {
    /// All bytes counted.
    pub fn total_bytes(&self) -> u64 {
        self.slab_bytes + self.label_bytes + self.table_bytes + self.writer_bytes
    }
}

/// The single writer's state of one tree kind.
#[derive(Debug)]
pub struct TreeWriter<K: Keying> {
    keys: K,
    meta: Vec<Meta>,
    free_ids: Vec<u32>,
    next_id: u32,
    retired: RetireList,
    namespaces: HashMap<Namespace, u32>,
    /// The namespace of the last insert and its root: most records in a row share one, and
    /// the map's SipHash (namespaces come from client fields) costs more than the compare.
    last_root: Option<(Namespace, u32)>,
    root_ns: IdMap<u32, Namespace>,
    ns_slots_used: usize,
    ns_capacity: usize,
    models: Vec<ModelState>,
    model_slots: HashMap<u64, u32>,
    entries: Entries,
    workers: Vec<List>,
    last_tick: u64,
    path: Vec<u32>,
    /// The last incarnation stamp handed out (stamps start at 1; 0 marks a retired node).
    last_stamp: u64,
    hints: HintCounts,
    nodes_live: u64,
    label_elements: u64,
    /// Live nodes per label buffer (by address), so a shared buffer counts once.
    buffer_users: IdMap<usize, u32>,
    /// Slots (header included) of every live child table allocation.
    table_slots: u64,
    /// Child tables changed during an eviction or purge pass, published when it ends.
    batch: Option<IdMap<u32, Vec<ChildEntry>>>,
    /// The last batch's map, emptied, kept for the next (its table is not rebuilt each pass).
    spare_batch: IdMap<u32, Vec<ChildEntry>>,
    /// Where a changed child table is built before it is published (reused, not allocated).
    scratch: Vec<ChildEntry>,
}

impl<K: Keying> TreeWriter<K> {
    /// An empty writer with these unit rules.
    pub fn new(keys: K) -> Self {
        Self {
            keys,
            meta: Vec::new(),
            free_ids: Vec::new(),
            next_id: 1,
            retired: RetireList::default(),
            namespaces: HashMap::new(),
            last_root: None,
            root_ns: IdMap::default(),
            ns_slots_used: 0,
            ns_capacity: NS_CAPACITY_MIN,
            models: Vec::new(),
            model_slots: HashMap::new(),
            entries: Entries::default(),
            workers: vec![List::default(); WORKERS_MAX],
            last_tick: 0,
            path: Vec::new(),
            last_stamp: 0,
            hints: HintCounts::default(),
            nodes_live: 0,
            label_elements: 0,
            buffer_users: IdMap::default(),
            table_slots: 0,
            batch: None,
            spare_batch: IdMap::default(),
            scratch: Vec::new(),
        }
    }

    /// Frees what every reader has passed; returns the items freed.
    pub fn reclaim(
        &mut self,
        tree: &SharedTree<K::E>,
        domain: &Domain,
        token: &mut WriterToken,
    ) -> usize {
        self.retired
            .reclaim(domain, &tree.slab, token, &mut self.free_ids)
    }

    /// How inserts used their hints so far.
    pub fn hint_counts(&self) -> HintCounts {
        self.hints
    }

    /// Items waiting for a grace period.
    pub fn pending_reclaim(&self) -> usize {
        self.retired.len()
    }

    /// Hands the retired list over (when the writer goes away before the readers).
    pub fn take_retired(&mut self) -> RetireList {
        std::mem::take(&mut self.retired)
    }

    /// Gauges of every model: (model id, gauges).
    pub fn gauges(&self) -> impl Iterator<Item = (u64, KindGauges)> + '_ {
        self.models.iter().map(|state| {
            let tenants = state.worker_entries.len() as u64;
            (
                state.id,
                KindGauges {
                    units: state.units,
                    entries: state.entries,
                    tenants,
                },
            )
        })
    }

    /// Memory counted in this kind's arenas.
    pub fn memory(&self) -> KindMemory {
        let element = std::mem::size_of::<K::E>() as u64;
        let segment_nodes = 1u64 << 14;
        let segments = u64::from(self.next_id).div_ceil(segment_nodes);
        let tenant_vecs: usize = self
            .meta
            .iter()
            .map(|meta| meta.tenants.capacity() * 8)
            .sum();
        let writer = self.meta.capacity() * std::mem::size_of::<Meta>()
            + tenant_vecs
            + self.entries.bytes()
            + self.free_ids.capacity() * 4;
        KindMemory {
            nodes: self.nodes_live,
            slab_bytes: segments * segment_nodes * std::mem::size_of::<Node<K::E>>() as u64,
            label_bytes: self.label_elements * element,
            table_bytes: self.table_slots * 16,
            writer_bytes: writer as u64,
            pending_reclaim: self.retired.len() as u64,
        }
    }
}
