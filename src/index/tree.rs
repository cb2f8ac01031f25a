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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use super::entries::{Chain, Entries, Entry, List, NIL};
use super::keys::{common_prefix, Keying};
use super::raw::{
    buffer_of, ChildEntry, Domain, Element, FreshNode, Guard, Node, NsTable, NsTablePtr,
    RetireList, Slab, WriterToken, MRU_LEN, NODES_MAX,
};
use super::{Evicted, IndexError, Namespace, TreeKind};
use crate::ids::WorkerId;
use crate::limits::{MODELS_MAX, WORKERS_MAX};

/// The most elements of a key the index keeps: 64 Mi, above any accepted request body, so a
/// longer key is only a corrupt caller; it is cut to this length.
pub const KEY_ELEMENTS_MAX: usize = 1 << 26;
/// The most live namespaces per tree kind: each holds at least one unit of budget, so a budget
/// of `--max-tree-size` per model keeps far fewer; the bound stops a table rebuild loop.
pub const NAMESPACES_MAX: usize = 1 << 22;
// Each model keeps a small recency-list header forever; its namespaces share the table.
const _: () = assert!(MODELS_MAX <= NAMESPACES_MAX);
/// Where two labels a merge joins lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelLayout {
    /// The lower label continues the upper one in the same buffer: the merge copies nothing.
    SideBySide,
    /// Anywhere else: the merge copies both.
    Apart,
}

/// Slots of the first namespace table; it doubles (rebuilt off to the side) at half load.
const NS_CAPACITY_MIN: usize = 64;
/// How many times longer than its own label a node's label buffer may be. Nodes split from one
/// edge share its buffer, and a new leaf keeps the dispatch record's key buffer, instead of
/// copying: the copies into cold memory were most of an insert. A label shorter than a quarter
/// of the buffer gets a buffer of its own, so a buffer lives only while a node uses at least a
/// quarter of it: label memory stays within 4x the labels' own size (16 bytes per token) in
/// the worst case, whatever the pattern of splits.
const LABEL_BUFFER_SHARE_MAX: usize = 4;

/// Whether a label of `label_len` elements may keep a buffer of `buffer_len` elements.
fn may_keep_buffer(label_len: usize, buffer_len: usize) -> bool {
    label_len.saturating_mul(LABEL_BUFFER_SHARE_MAX) >= buffer_len
}

/// Whether a new leaf of `leaf_len` elements keeps the record's key buffer of `key_len` rather
/// than a copy of its part: only when that part is at least half the key. A kept key is not
/// recycled for the next request's key, so the data core's next copy lands in cold memory;
/// for a leaf of a quarter of an 8k-token key that cost more than the leaf's copy saved, and
/// the kept buffers, four times the leaves, spread the tree over more memory (measured in
/// `perf/results-index.md`).
fn leaf_keeps_key(leaf_len: usize, key_len: usize) -> bool {
    leaf_len.saturating_mul(2) >= key_len
}

/// Units on both edges above which a one-child node and its child stay unmerged (unless their
/// labels adjoin in one buffer): a merge copies both labels, tens of KB for long text prompts,
/// to save one node of about 200 bytes (slot, metadata, entries, table), which is at most about
/// 3 bytes per unit at this length. Shorter chains merge, so splits at small offsets never
/// pile up nodes.
const MERGE_UNITS_MIN: u64 = 64;

/// A key to insert: its elements, and the buffer holding them from its first element when the
/// caller has one to share (a dispatch record's key), which a new leaf may then keep.
#[derive(Clone, Copy, Debug)]
pub struct Key<'k, E: Element> {
    elements: &'k [E],
    buffer: Option<&'k Arc<[E]>>,
}

impl<'k, E: Element> Key<'k, E> {
    /// A borrowed key: labels copy what they keep of it.
    pub fn borrowed(elements: &'k [E]) -> Self {
        Self {
            elements,
            buffer: None,
        }
    }

    /// A key in a shared buffer, which new leaves may keep instead of copying.
    pub fn shared(buffer: &'k Arc<[E]>) -> Self {
        Self {
            elements: buffer,
            buffer: Some(buffer),
        }
    }

    /// The first `len` elements of the key (still starting at the buffer's start).
    fn prefix(self, len: usize) -> Self {
        Self {
            elements: &self.elements[..len],
            ..self
        }
    }
}

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

/// The end of a walk: elements matched and the deepest node reached (borrowed from the guard).
#[derive(Debug)]
pub struct Walk<'g, E: Element> {
    /// Matched elements, at a unit boundary.
    pub matched: usize,
    /// The deepest matched node (partly matched when the match ends inside its edge).
    pub node: Option<&'g Node<E>>,
    /// The slab id of `node` (0 when there is none).
    pub node_id: u32,
}

impl<E: Element> Walk<'_, E> {
    /// The hint a record of the same key carries to the writer (`key_len`: the key walked).
    pub fn hint(&self, kind: TreeKind, key_len: usize) -> LookupHint {
        match self.node {
            Some(node) => LookupHint {
                kind: Some(kind),
                node: self.node_id,
                stamp: node.stamp(),
                matched: self.matched as u32,
                key_len: key_len as u32,
            },
            None => LookupHint::default(),
        }
    }
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

/// Where an insert starts: the namespace root, or the point a hint resumes from.
#[derive(Clone, Copy, Debug)]
struct Start {
    /// The node to search children of first.
    node: u32,
    /// The depth at the end of `node`'s edge.
    depth: usize,
    /// A child of `node` whose edge is known to match the key for this many elements (the hint
    /// ended inside that edge); its comparison resumes after them.
    partial: Option<(u32, usize)>,
}

impl<E: Element> SharedTree<E> {
    /// Walks `query` down namespace `ns`: no lock, no allocation, no shared write.
    pub fn walk<'g, K: Keying<E = E>>(
        &'g self,
        keys: &K,
        guard: &'g Guard<'_>,
        ns: Namespace,
        query: &[E],
    ) -> Walk<'g, E> {
        let mut walk = Walk {
            matched: 0,
            node: None,
            node_id: 0,
        };
        let table = self.namespaces.load(guard);
        let Some(root) = table.find(ns.model, ns.partition, ns_hash(ns)) else {
            return walk;
        };
        let Some(mut node) = self.slab.get(root, guard) else {
            return walk;
        };
        'down: while let Some(edge_key) = keys.edge_key(&query[walk.matched..]) {
            let rest = &query[walk.matched..];
            for child_id in node.children(guard).with_key(edge_key) {
                let Some(child) = self.slab.get(child_id, guard) else {
                    continue;
                };
                let Some(label) = child.label_from(walk.matched as u32, guard) else {
                    continue;
                };
                let common = keys.floor(rest, common_prefix(label, rest));
                if common == 0 {
                    continue;
                }
                walk.node = Some(child);
                walk.node_id = child_id;
                walk.matched += common;
                if common < label.len() {
                    break 'down;
                }
                node = child;
                continue 'down;
            }
            break;
        }
        walk
    }
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

/// Where a split cuts a child's edge.
#[derive(Clone, Copy, Debug)]
struct LabelSplit {
    /// The child being split.
    child: u32,
    /// Elements of the edge that go to the upper node.
    common: usize,
    /// Units of those elements.
    units: u64,
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

    /// Records that `worker` was sent `key` in namespace `ns` at `tick`; `hint` (from a lookup
    /// of the same key, or the default) lets the walk start where that lookup ended.
    pub fn insert(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        ns: Namespace,
        key: Key<'_, K::E>,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        if worker.index() >= WORKERS_MAX {
            return Err(IndexError::WorkerOutOfRange(worker));
        }
        // Every key is whole units (characters, or page hashes): capping is the only cut.
        let key = key.prefix(self.keys.floor(key.elements, KEY_ELEMENTS_MAX));
        if key.elements.is_empty() {
            return Ok(());
        }
        self.last_tick = self.last_tick.max(tick);
        let tick = self.last_tick;
        let root = self.root_for(ctx, ns)?;
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let start = match self.resume_at(ctx, root, key.elements, hint, &mut path) {
            Some(start) => {
                self.hints.followed += 1;
                start
            }
            None => {
                self.hints.stale += u64::from(hint.kind.is_some());
                path.clear();
                Start {
                    node: root,
                    depth: 0,
                    partial: None,
                }
            }
        };
        let built = self.insert_path(ctx, start, key, worker, &mut path);
        // Deepest first: an ancestor's entry stays more recent than its descendants'.
        for id in path.iter().rev() {
            self.touch(ctx, *id, worker, tick);
        }
        self.path = path;
        built
    }

    fn insert_path(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        start: Start,
        key: Key<'_, K::E>,
        worker: WorkerId,
        path: &mut Vec<u32>,
    ) -> Result<(), IndexError> {
        let guard = ctx.token.guard();
        let (mut node, mut depth, mut partial) = (start.node, start.depth, start.partial);
        while let Some(edge_key) = self.keys.edge_key(&key.elements[depth..]) {
            let rest = &key.elements[depth..];
            let found = match partial.take() {
                Some((child, known)) => {
                    let found = self.continue_child(ctx, &guard, child, rest, depth, known);
                    Some(found.ok_or(IndexError::NodesExhausted)?)
                }
                None => self.find_child(ctx, &guard, node, edge_key, rest, depth),
            };
            match found {
                None => {
                    let leaf = self.new_leaf(ctx, node, key, depth, worker)?;
                    self.add_child(ctx, node, edge_key, leaf);
                    path.push(leaf);
                    return Ok(());
                }
                Some((child, common, label_len)) => {
                    let next = if common == label_len {
                        child
                    } else {
                        self.split(ctx, node, child, depth, common)?
                    };
                    path.push(next);
                    node = next;
                    depth += common;
                }
            }
        }
        Ok(())
    }

    /// The child of `node` whose edge shares at least one unit with `rest`, with the shared
    /// length and its label length.
    fn find_child(
        &self,
        ctx: &WriteCtx<'_, K::E>,
        guard: &Guard<'_>,
        node: u32,
        edge_key: u64,
        rest: &[K::E],
        depth: usize,
    ) -> Option<(u32, usize, usize)> {
        let children = ctx.tree.slab.get(node, guard)?.children(guard);
        for child_id in children.with_key(edge_key) {
            let child = ctx.tree.slab.get(child_id, guard)?;
            let label = child.label_from(depth as u32, guard)?;
            let common = self.keys.floor(rest, common_prefix(label, rest));
            if common > 0 {
                return Some((child_id, common, label.len()));
            }
        }
        None
    }

    /// `find_child` for the child a hint named, whose first `known` elements already matched.
    fn continue_child(
        &self,
        ctx: &WriteCtx<'_, K::E>,
        guard: &Guard<'_>,
        child: u32,
        rest: &[K::E],
        depth: usize,
        known: usize,
    ) -> Option<(u32, usize, usize)> {
        let label = ctx
            .tree
            .slab
            .get(child, guard)?
            .label_from(depth as u32, guard)?;
        let (label_rest, key_rest) = (label.get(known..)?, rest.get(known..)?);
        let common = self
            .keys
            .floor(rest, known + common_prefix(label_rest, key_rest));
        Some((child, common, label.len()))
    }

    /// The point a hint lets this insert start from, with the path above it pushed onto
    /// `path`; `None` (walk from the root) when there is no hint or it is stale: for another
    /// tree kind or key length, its node retired or its slot reused since the lookup (stamp),
    /// or under another namespace's root.
    fn resume_at(
        &self,
        ctx: &WriteCtx<'_, K::E>,
        root: u32,
        key: &[K::E],
        hint: &LookupHint,
        path: &mut Vec<u32>,
    ) -> Option<Start> {
        let matched = hint.matched as usize;
        if hint.kind != Some(K::KIND)
            || hint.key_len as usize != key.len()
            || matched == 0
            || matched > key.len()
            || self.keys.floor(key, matched) != matched
        {
            return None;
        }
        let guard = ctx.token.guard();
        let slab = &ctx.tree.slab;
        if hint.stamp == 0 || slab.get(hint.node, &guard)?.stamp() != hint.stamp {
            return None;
        }
        // The node whose edge holds the match's end: the hinted node, or an ancestor when a
        // split since the lookup cut its edge at or below that depth. Each step up is at least
        // one element shallower, so `matched` steps bound the climb.
        let (mut at, mut parent) = (hint.node, self.meta.get(hint.node as usize)?.parent);
        let mut edge_start = slab.get(parent, &guard)?.depth_end() as usize;
        for _ in 0..matched {
            if edge_start < matched || parent == 0 {
                break;
            }
            at = parent;
            parent = self.meta.get(at as usize)?.parent;
            edge_start = slab.get(parent, &guard)?.depth_end() as usize;
        }
        let at_node = slab.get(at, &guard)?;
        let edge_end = at_node.depth_end() as usize;
        if parent == 0 || edge_start >= matched || edge_end < matched {
            return None;
        }
        // The last matched element against the label: a hint paired with another key of the
        // same length is caught here (the writer cannot afford to compare the whole prefix).
        let label = at_node.label_from(edge_start as u32, &guard)?;
        if label.get(matched - 1 - edge_start) != key.get(matched - 1) {
            return None;
        }
        let start = if matched == edge_end {
            Start {
                node: at,
                depth: edge_end,
                partial: None,
            }
        } else {
            Start {
                node: parent,
                depth: edge_start,
                partial: Some((at, matched - edge_start)),
            }
        };
        // The path from below the root down to the start node; it must end at this
        // namespace's root (a node of another namespace's tree is a stale hint).
        let first = path.len();
        let mut up = start.node;
        while up != root {
            if up == 0 || path.len() - first > matched {
                return None;
            }
            path.push(up);
            up = self.meta.get(up as usize)?.parent;
        }
        path[first..].reverse();
        debug_assert!(
            self.spells(ctx, at, &key[..matched]),
            "a valid hint's node spells the matched prefix"
        );
        Some(start)
    }

    /// Whether the path from the root to `node` spells `prefix` (its end may fall inside
    /// `node`'s edge): the full check a hint saves, for debug assertions.
    fn spells(&self, ctx: &WriteCtx<'_, K::E>, node: u32, prefix: &[K::E]) -> bool {
        let guard = ctx.token.guard();
        let slab = &ctx.tree.slab;
        let mut at = node;
        while !self.root_ns.contains_key(&at) {
            let parent = self.meta[at as usize].parent;
            let (Some(shared), Some(up)) = (slab.get(at, &guard), slab.get(parent, &guard)) else {
                return false;
            };
            let (start, end) = (up.depth_end() as usize, shared.depth_end() as usize);
            let Some(label) = shared.label_from(start as u32, &guard) else {
                return false;
            };
            let end = end.min(prefix.len());
            if start > end || label.get(..end - start) != prefix.get(start..end) {
                return false;
            }
            at = parent;
        }
        true
    }

    fn alloc_node<'a>(
        &mut self,
        ctx: &WriteCtx<'a, K::E>,
    ) -> Result<FreshNode<'a, K::E>, IndexError> {
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None if self.next_id < NODES_MAX => {
                self.next_id += 1;
                self.next_id - 1
            }
            None => return Err(IndexError::NodesExhausted),
        };
        let fresh = ctx
            .tree
            .slab
            .fresh(id, ctx.token)
            .ok_or(IndexError::NodesExhausted)?;
        if self.meta.len() <= id as usize {
            self.meta.resize_with(id as usize + 1, Meta::default);
        }
        self.nodes_live += 1;
        Ok(fresh)
    }

    fn init_node(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        fresh: &FreshNode<'_, K::E>,
        label: LabelSource<'_, K::E>,
        depth_end: usize,
        meta: Meta,
    ) {
        let (depth_end, tenants) = (depth_end as u32, meta.mru());
        match label {
            LabelSource::Buffer(buffer, end) => {
                fresh.init(buffer, end as u32, depth_end, tenants, ctx.token);
            }
            LabelSource::Share(donor, end) => {
                fresh.init_sharing(donor, end as u32, depth_end, tenants, ctx.token);
            }
        }
        self.stamp(ctx, fresh.id());
        self.set_meta(fresh.id(), meta);
        let guard = ctx.token.guard();
        if let Some(node) = ctx.tree.slab.get(fresh.id(), &guard) {
            self.hold_buffer(node.label_buffer());
        }
    }

    /// Counts one more live node on a label buffer (its elements count once, however many
    /// nodes share it).
    fn hold_buffer(&mut self, (address, len): (usize, usize)) {
        let users = self.buffer_users.entry(address).or_insert(0);
        *users += 1;
        if *users == 1 {
            self.label_elements += len as u64;
        }
    }

    /// Counts one live node fewer on a label buffer.
    fn release_buffer(&mut self, (address, len): (usize, usize)) {
        let Some(users) = self.buffer_users.get_mut(&address) else {
            return;
        };
        *users -= 1;
        if *users == 0 {
            self.buffer_users.remove(&address);
            self.label_elements -= len as u64;
        }
    }

    /// Stores a new node's metadata. A new node usually starts without tenants: it then takes
    /// over the slot's previous tenant list allocation (emptied when that node was retired), so
    /// the churn of nodes does not allocate one list per node.
    fn set_meta(&mut self, node: u32, mut meta: Meta) {
        let slot = &mut self.meta[node as usize];
        if meta.tenants.capacity() == 0 {
            meta.tenants = std::mem::take(&mut slot.tenants);
            meta.tenants.clear();
        }
        *slot = meta;
    }

    /// Gives a node just initialized its incarnation stamp (before any table publishes it).
    fn stamp(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        self.last_stamp += 1;
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(node, &guard) {
            shared.set_stamp(self.last_stamp, ctx.token);
        }
    }

    /// A new leaf for `worker`, published with it as its one tenant (its entry is made when
    /// the insert touches its path), so the touch need not publish the tenant list again.
    fn new_leaf(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        parent: u32,
        key: Key<'_, K::E>,
        depth: usize,
        worker: WorkerId,
    ) -> Result<u32, IndexError> {
        let rest = &key.elements[depth..];
        let label = match key.buffer {
            Some(buffer) if leaf_keeps_key(rest.len(), buffer.len()) => {
                LabelSource::Buffer(Arc::clone(buffer), key.elements.len())
            }
            _ => LabelSource::copy(rest),
        };
        let fresh = self.alloc_node(ctx)?;
        let model = self.meta[parent as usize].model;
        let mut mru = [0; MRU_LEN];
        mru[0] = worker.0;
        let meta = Meta {
            parent,
            units: self.keys.units(rest),
            model,
            mru,
            mru_len: 1,
            ..Meta::default()
        };
        self.init_node(ctx, &fresh, label, depth + rest.len(), meta);
        Ok(fresh.id())
    }

    /// Publishes `entries` as `node`'s child table and retires the old one.
    fn publish_children(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32, entries: &[ChildEntry]) {
        if let Some(batch) = self.batch.as_mut() {
            batch.insert(node, entries.to_vec());
            return;
        }
        self.publish_children_now(ctx, node, entries);
    }

    fn publish_children_now(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        node: u32,
        entries: &[ChildEntry],
    ) {
        let guard = ctx.token.guard();
        let Some(shared) = ctx.tree.slab.get(node, &guard) else {
            return;
        };
        self.table_slots -= shared.children_slots(ctx.token) as u64;
        let old = shared.publish_children(entries, ctx.token);
        self.table_slots += shared.children_slots(ctx.token) as u64;
        self.retired.table(ctx.domain, old);
    }

    fn child_table(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> Vec<ChildEntry> {
        let mut table = Vec::new();
        self.children_into(ctx, node, &mut table);
        table
    }

    /// Appends `node`'s current children to `out`: the batch's pending table, else the
    /// published one.
    fn children_into(&self, ctx: &WriteCtx<'_, K::E>, node: u32, out: &mut Vec<ChildEntry>) {
        if let Some(pending) = self.batch.as_ref().and_then(|batch| batch.get(&node)) {
            out.extend_from_slice(pending);
            return;
        }
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(node, &guard) {
            out.extend(shared.children(&guard).iter());
        }
    }

    /// `node`'s first current child (pending or published).
    fn first_child(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> Option<ChildEntry> {
        if let Some(pending) = self.batch.as_ref().and_then(|batch| batch.get(&node)) {
            return pending.first().copied();
        }
        let guard = ctx.token.guard();
        let first = ctx
            .tree
            .slab
            .get(node, &guard)?
            .children(&guard)
            .iter()
            .next();
        first
    }

    /// `node`'s current number of children (pending or published).
    fn children_len(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> usize {
        if let Some(pending) = self.batch.as_ref().and_then(|batch| batch.get(&node)) {
            return pending.len();
        }
        let guard = ctx.token.guard();
        let shared = ctx.tree.slab.get(node, &guard);
        shared.map_or(0, |shared| shared.children(&guard).len())
    }

    /// Whether `node` currently has no children (pending or published).
    fn is_leaf(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> bool {
        if let Some(pending) = self.batch.as_ref().and_then(|batch| batch.get(&node)) {
            return pending.is_empty();
        }
        let guard = ctx.token.guard();
        let shared = ctx.tree.slab.get(node, &guard);
        shared.is_none_or(|shared| shared.children(&guard).is_empty())
    }

    /// `node`'s current table in the reused scratch buffer, to be edited and published with
    /// `publish_scratch`.
    fn scratch_table(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) -> Vec<ChildEntry> {
        let mut table = std::mem::take(&mut self.scratch);
        table.clear();
        self.children_into(ctx, node, &mut table);
        table
    }

    fn publish_scratch(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32, table: Vec<ChildEntry>) {
        self.publish_children(ctx, node, &table);
        self.scratch = table;
    }

    /// Opens a batch: child-table changes collect per node and are published once, at
    /// `end_batch`. Removing many children of one wide node then costs one copy, not one each.
    /// Readers meanwhile keep the old tables, whose nodes stay readable (nothing is reclaimed
    /// before the batch ends).
    fn begin_batch(&mut self) {
        if self.batch.is_none() {
            self.batch = Some(std::mem::take(&mut self.spare_batch));
        }
    }

    fn end_batch(&mut self, ctx: &WriteCtx<'_, K::E>) {
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        for (node, entries) in batch.drain() {
            self.publish_children_now(ctx, node, &entries);
        }
        self.spare_batch = batch;
    }

    /// Publishes `node`'s pending table now (before a merge hands its table over).
    fn flush_pending(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        if let Some(entries) = self.batch.as_mut().and_then(|batch| batch.remove(&node)) {
            self.publish_children_now(ctx, node, &entries);
        }
    }

    /// Adds a child: appended in place into the published table's spare capacity when it has
    /// room, else the table is rebuilt (sorted, with new spare capacity) and republished.
    fn add_child(&mut self, ctx: &WriteCtx<'_, K::E>, parent: u32, key: u64, child: u32) {
        let entry = ChildEntry { key, node: child };
        if let Some(pending) = self.batch.as_mut().and_then(|batch| batch.get_mut(&parent)) {
            pending.push(entry);
            return;
        }
        let guard = ctx.token.guard();
        let appended = ctx.tree.slab.get(parent, &guard);
        if appended.is_some_and(|shared| shared.append_child(entry, ctx.token)) {
            return;
        }
        let mut table = self.scratch_table(ctx, parent);
        table.push(entry);
        self.publish_scratch(ctx, parent, table);
    }

    /// Swaps child `old` for `new`, which spells the same edge (a split or merge below
    /// `parent`): in place in the published table (readers may follow either), or in the
    /// batch's pending table.
    fn replace_child(&mut self, ctx: &WriteCtx<'_, K::E>, parent: u32, old: u32, new: u32) {
        if let Some(pending) = self.batch.as_mut().and_then(|batch| batch.get_mut(&parent)) {
            for entry in pending.iter_mut().filter(|entry| entry.node == old) {
                entry.node = new;
            }
            return;
        }
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(parent, &guard) {
            let replaced = shared.replace_child(old, new, ctx.token);
            debug_assert!(replaced, "node {old} is a child of {parent}");
        }
    }

    fn remove_child(&mut self, ctx: &WriteCtx<'_, K::E>, parent: u32, child: u32) {
        if self.batch.is_some() {
            let published = self.child_table_if_unbatched(ctx, parent);
            if let Some(batch) = self.batch.as_mut() {
                let table = batch
                    .entry(parent)
                    .or_insert_with(|| published.unwrap_or_default());
                table.retain(|entry| entry.node != child);
                return;
            }
        }
        let mut table = self.scratch_table(ctx, parent);
        table.retain(|entry| entry.node != child);
        self.publish_scratch(ctx, parent, table);
    }

    /// The published table of `node` when the batch holds none for it yet.
    fn child_table_if_unbatched(
        &self,
        ctx: &WriteCtx<'_, K::E>,
        node: u32,
    ) -> Option<Vec<ChildEntry>> {
        let pending = self
            .batch
            .as_ref()
            .is_some_and(|batch| batch.contains_key(&node));
        (!pending).then(|| self.child_table(ctx, node))
    }

    /// Splits `child` (under `parent`, whose edge starts at `depth`) after `common` elements
    /// and returns the new upper node. Both halves keep the child's label buffer (no copy)
    /// while each is long enough to (`may_keep_buffer`); a half too short gets a copy. The
    /// lower half is the child itself (its label shrinks from the front as its parent's depth
    /// grows), unless it must copy: then a new lower node replaces the child.
    fn split(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        parent: u32,
        child: u32,
        depth: usize,
        common: usize,
    ) -> Result<u32, IndexError> {
        let guard = ctx.token.guard();
        let shared = ctx.tree.slab.get(child, &guard);
        let label = shared.and_then(|node| node.label_from(depth as u32, &guard));
        let (Some(shared), Some(label)) = (shared, label) else {
            return Err(IndexError::NodesExhausted);
        };
        let lower_key = self.keys.edge_key(&label[common..]);
        let lower_key = lower_key.ok_or(IndexError::NodesExhausted)?;
        let upper = self.alloc_node(ctx)?;
        let upper_units = self.keys.units(&label[..common]);
        let lower_meta = &self.meta[child as usize];
        let (model, mru, mru_len) = (lower_meta.model, lower_meta.mru, lower_meta.mru_len);
        let meta = Meta {
            parent,
            units: upper_units,
            model,
            tenants: Vec::new(),
            mru,
            mru_len,
        };
        let buffer_len = shared.label_buffer().1;
        let lower_len = label.len() - common;
        let lower = if may_keep_buffer(lower_len, buffer_len) {
            child
        } else {
            let Ok(fresh_lower) = self.alloc_node(ctx) else {
                self.free_unused(upper.id());
                return Err(IndexError::NodesExhausted);
            };
            let split = LabelSplit {
                child,
                common,
                units: upper_units,
            };
            self.split_moving_label(ctx, shared, label, &fresh_lower, split);
            fresh_lower.id()
        };
        let upper_label = if may_keep_buffer(common, buffer_len) {
            LabelSource::Share(shared, shared.label_end() as usize - lower_len)
        } else {
            LabelSource::copy(&label[..common])
        };
        self.init_node(ctx, &upper, upper_label, depth + common, meta);
        let entry = ChildEntry {
            key: lower_key,
            node: lower,
        };
        upper.init_children(&[entry], ctx.token);
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(upper.id(), &guard) {
            self.table_slots += shared.children_slots(ctx.token) as u64;
        }
        self.clone_entries_above(lower, upper.id());
        let lower_meta = &mut self.meta[lower as usize];
        lower_meta.parent = upper.id();
        if lower == child {
            lower_meta.units -= upper_units;
        }
        self.replace_child(ctx, parent, child, upper.id());
        if lower != child {
            self.retire_node(ctx, child);
        }
        Ok(upper.id())
    }

    /// The lower half of a split whose suffix is too short to keep the child's buffer: `lower`
    /// takes a copy of it and replaces `child` (its tenants, entries and subtree move over).
    fn split_moving_label(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        child: &Node<K::E>,
        label: &[K::E],
        lower: &FreshNode<'_, K::E>,
        split: LabelSplit,
    ) {
        let guard = ctx.token.guard();
        let child_id = split.child;
        let mut moved = std::mem::take(&mut self.meta[child_id as usize]);
        moved.units -= split.units;
        let suffix = LabelSource::copy(&label[split.common..]);
        self.init_node(ctx, lower, suffix, child.depth_end() as usize, moved);
        child.lend_children_to(lower, ctx.token);
        for (_, id) in &self.meta[lower.id() as usize].tenants {
            self.entries.get_mut(*id).node = lower.id();
        }
        for below in child.children(&guard).iter() {
            self.meta[below.node as usize].parent = lower.id();
        }
    }

    /// Gives `upper` (new, above `lower`) one entry per tenant of `lower`, each placed right
    /// after the lower entry in both recency lists (so the ancestor stays the more recent).
    fn clone_entries_above(&mut self, lower: u32, upper: u32) {
        let model = self.meta[lower as usize].model;
        // The upper node's list allocation (kept from its slot's last node by `set_meta`).
        let mut tenants = std::mem::take(&mut self.meta[upper as usize].tenants);
        tenants.clear();
        for i in 0..self.meta[lower as usize].tenants.len() {
            let (worker, below) = self.meta[lower as usize].tenants[i];
            let tick = self.entries.get(below).tick;
            let id = self.entries.alloc(Entry::new(upper, worker, model, tick));
            let state = &mut self.models[model as usize];
            self.entries
                .insert_after(&mut state.lru, Chain::Model, below, id);
            let list = &mut self.workers[worker.index()];
            self.entries.insert_after(list, Chain::Worker, below, id);
            state.entries += 1;
            *state.worker_entries.entry(worker).or_default() += 1;
            tenants.push((worker, id));
        }
        self.meta[upper as usize].tenants = tenants;
    }

    /// Returns a node id taken by `alloc_node` but never initialized or published.
    fn free_unused(&mut self, id: u32) {
        self.free_ids.push(id);
        self.nodes_live -= 1;
    }

    /// Marks `worker` as the most recent holder of `node`.
    fn touch(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32, worker: WorkerId, tick: u64) {
        let meta = &mut self.meta[node as usize];
        let model = meta.model as usize;
        match meta
            .tenants
            .binary_search_by_key(&worker, |tenant| tenant.0)
        {
            Ok(at) => {
                let id = meta.tenants[at].1;
                self.entries.get_mut(id).tick = tick;
                self.entries
                    .move_to_back(&mut self.models[model].lru, Chain::Model, id);
                let list = &mut self.workers[worker.index()];
                self.entries.move_to_back(list, Chain::Worker, id);
            }
            Err(at) => {
                let id = self
                    .entries
                    .alloc(Entry::new(node, worker, model as u32, tick));
                meta.tenants.insert(at, (worker, id));
                let state = &mut self.models[model];
                state.units += meta.units;
                state.entries += 1;
                *state.worker_entries.entry(worker).or_default() += 1;
                self.entries.push_back(&mut state.lru, Chain::Model, id);
                self.entries
                    .push_back(&mut self.workers[worker.index()], Chain::Worker, id);
            }
        }
        if meta.mru().first() != Some(&worker.0) {
            let len = usize::from(meta.mru_len);
            let end = meta
                .mru()
                .iter()
                .position(|id| *id == worker.0)
                .unwrap_or(len.min(MRU_LEN - 1));
            meta.mru.copy_within(0..end, 1);
            meta.mru[0] = worker.0;
            meta.mru_len = meta.mru_len.max((end + 1) as u8);
            self.publish_mru(ctx, node);
        }
    }

    fn publish_mru(&self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(node, &guard) {
            shared.set_tenants(self.meta[node as usize].mru(), ctx.token);
        }
    }

    /// Recomputes `node`'s published tenants after `worker` left it.
    fn refresh_mru(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32, worker: WorkerId) {
        let meta = &mut self.meta[node as usize];
        let Some(at) = meta.mru().iter().position(|id| *id == worker.0) else {
            return;
        };
        if meta.tenants.len() < MRU_LEN {
            meta.mru.copy_within(at + 1.., at);
            meta.mru_len -= 1;
        } else {
            let mut ranked: Vec<(u64, u16)> = meta
                .tenants
                .iter()
                .map(|(worker, id)| (self.entries.get(*id).tick, worker.0))
                .collect();
            ranked.sort_unstable_by(|a, b| b.cmp(a));
            for (slot, (_, id)) in meta.mru.iter_mut().zip(&ranked) {
                *slot = *id;
            }
            meta.mru_len = ranked.len().min(MRU_LEN) as u8;
        }
        self.publish_mru(ctx, node);
    }

    /// Removes entry `id` (a leaf for its worker), then removes or merges what it leaves.
    fn remove_entry(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        id: u32,
        report: &mut Option<&mut dyn FnMut(Evicted)>,
    ) -> u64 {
        let Entry {
            node,
            worker,
            model,
            ..
        } = *self.entries.get(id);
        if let Some(report) = report.as_mut() {
            report(self.evicted(ctx, node, worker));
        }
        self.drop_entry(id);
        let units = self.meta[node as usize].units;
        self.models[model as usize].units -= units;
        let meta = &mut self.meta[node as usize];
        if let Ok(at) = meta
            .tenants
            .binary_search_by_key(&worker, |tenant| tenant.0)
        {
            meta.tenants.remove(at);
        }
        self.refresh_mru(ctx, node, worker);
        if self.meta[node as usize].tenants.is_empty() {
            self.remove_node(ctx, node);
        } else {
            self.try_merge(ctx, node);
        }
        units
    }

    /// Unlinks and frees an entry, keeping the model's counts (not its units) in step.
    fn drop_entry(&mut self, id: u32) {
        let Entry { worker, model, .. } = *self.entries.get(id);
        let state = &mut self.models[model as usize];
        self.entries.unlink(&mut state.lru, Chain::Model, id);
        self.entries
            .unlink(&mut self.workers[worker.index()], Chain::Worker, id);
        self.entries.release(id);
        state.entries -= 1;
        if let Some(count) = state.worker_entries.get_mut(&worker) {
            *count -= 1;
            if *count == 0 {
                state.worker_entries.remove(&worker);
            }
        }
    }

    fn retire_node(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(node, &guard) {
            self.release_buffer(shared.label_buffer());
            // Hints naming this node are stale from now on.
            shared.set_stamp(0, ctx.token);
        }
        self.retired.node(ctx.domain, node);
        // Keeps the tenant list's allocation for the slot's next node (see `set_meta`).
        let mut tenants = std::mem::take(&mut self.meta[node as usize].tenants);
        tenants.clear();
        self.meta[node as usize] = Meta {
            tenants,
            ..Meta::default()
        };
        self.nodes_live -= 1;
    }

    /// Removes a node left without tenants (hence without children) and tidies its parent.
    fn remove_node(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        debug_assert!(self.is_leaf(ctx, node), "a node without tenants is a leaf");
        let parent = self.meta[node as usize].parent;
        self.remove_child(ctx, parent, node);
        self.retire_node(ctx, node);
        if self.root_ns.contains_key(&parent) {
            if self.is_leaf(ctx, parent) {
                self.remove_namespace(ctx, parent);
            }
        } else {
            self.try_merge(ctx, parent);
        }
    }

    /// Merges `node` with its only child when both have the same tenants (nothing would tell
    /// them apart), so churn never leaves chains of short one-child nodes behind. Two long
    /// edges (`MERGE_UNITS_MIN`) stay apart unless their labels lie side by side in one buffer:
    /// their merge would copy both labels to save one node.
    fn try_merge(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        if self.root_ns.contains_key(&node) {
            return;
        }
        if self.children_len(ctx, node) != 1 {
            return;
        }
        let Some(only) = self.first_child(ctx, node) else {
            return;
        };
        let (upper, lower) = (&self.meta[node as usize], &self.meta[only.node as usize]);
        if lower.tenants.len() != upper.tenants.len() {
            return;
        }
        let long = upper.units.min(lower.units) >= MERGE_UNITS_MIN;
        let layout = if self.labels_adjoin(ctx, node, only.node) {
            LabelLayout::SideBySide
        } else {
            LabelLayout::Apart
        };
        if layout == LabelLayout::SideBySide || !long {
            self.merge(ctx, node, only.node, layout);
        }
    }

    /// Whether `lower`'s label continues `upper`'s in the same buffer (a merge then copies
    /// nothing).
    fn labels_adjoin(&self, ctx: &WriteCtx<'_, K::E>, upper: u32, lower: u32) -> bool {
        let guard = ctx.token.guard();
        let (Some(up), Some(low)) = (
            ctx.tree.slab.get(upper, &guard),
            ctx.tree.slab.get(lower, &guard),
        ) else {
            return false;
        };
        let Some(low_label) = low.label_from(up.depth_end(), &guard) else {
            return false;
        };
        up.label_buffer().0 == low.label_buffer().0
            && up.label_end() as usize + low_label.len() == low.label_end() as usize
    }

    /// Replaces `upper` and its only child `lower` by one node (the heir); when their labels
    /// lie side by side in one buffer, the heir keeps that buffer instead of a copy.
    fn merge(&mut self, ctx: &WriteCtx<'_, K::E>, upper: u32, lower: u32, layout: LabelLayout) {
        // The heir takes the lower node's published table, and the upper one is retired in
        // place: both must be current.
        self.flush_pending(ctx, upper);
        self.flush_pending(ctx, lower);
        let guard = ctx.token.guard();
        let parent = self.meta[upper as usize].parent;
        let slab = &ctx.tree.slab;
        let (Some(parent_node), Some(up), Some(low)) = (
            slab.get(parent, &guard),
            slab.get(upper, &guard),
            slab.get(lower, &guard),
        ) else {
            return;
        };
        let (Some(up_label), Some(low_label)) = (
            up.label_from(parent_node.depth_end(), &guard),
            low.label_from(up.depth_end(), &guard),
        ) else {
            return;
        };
        let Ok(fresh) = self.alloc_node(ctx) else {
            return;
        };
        let heir = fresh.id();
        let label = if layout == LabelLayout::SideBySide {
            LabelSource::Share(low, low.label_end() as usize)
        } else {
            LabelSource::copy(&[up_label, low_label].concat())
        };
        let mut meta = std::mem::take(&mut self.meta[upper as usize]);
        meta.units += self.meta[lower as usize].units;
        let children = low.children(&guard);
        self.init_node(ctx, &fresh, label, low.depth_end() as usize, meta);
        low.lend_children_to(&fresh, ctx.token);
        for (_, id) in &self.meta[heir as usize].tenants {
            self.entries.get_mut(*id).node = heir;
        }
        for (_, id) in std::mem::take(&mut self.meta[lower as usize].tenants) {
            self.drop_entry(id);
        }
        for child in children.iter() {
            self.meta[child.node as usize].parent = heir;
        }
        self.replace_child(ctx, parent, upper, heir);
        self.table_slots -= up.children_slots(ctx.token) as u64;
        self.retired
            .table(ctx.domain, up.retire_children_in_place(ctx.token));
        self.retire_node(ctx, upper);
        self.retire_node(ctx, lower);
    }

    fn model_slot(&mut self, model: u64) -> Result<u32, IndexError> {
        if let Some(slot) = self.model_slots.get(&model) {
            return Ok(*slot);
        }
        if self.models.len() >= MODELS_MAX {
            return Err(IndexError::ModelsExhausted);
        }
        let slot = self.models.len() as u32;
        self.models.push(ModelState {
            id: model,
            lru: List::default(),
            units: 0,
            entries: 0,
            worker_entries: IdMap::default(),
        });
        self.model_slots.insert(model, slot);
        Ok(slot)
    }

    fn root_for(&mut self, ctx: &WriteCtx<'_, K::E>, ns: Namespace) -> Result<u32, IndexError> {
        if let Some((last, root)) = self.last_root {
            if last == ns {
                return Ok(root);
            }
        }
        if let Some(&root) = self.namespaces.get(&ns) {
            self.last_root = Some((ns, root));
            return Ok(root);
        }
        if self.namespaces.len() >= NAMESPACES_MAX {
            return Err(IndexError::NamespacesExhausted);
        }
        let model = self.model_slot(ns.model)?;
        if (self.ns_slots_used + 1) * 2 > self.ns_capacity {
            self.rebuild_namespaces(ctx);
        }
        let fresh = self.alloc_node(ctx)?;
        let root = fresh.id();
        self.init_node(
            ctx,
            &fresh,
            LabelSource::copy(&[]),
            0,
            Meta {
                model,
                ..Meta::default()
            },
        );
        let guard = ctx.token.guard();
        let table = ctx.tree.namespaces.load(&guard);
        if !table.insert(ns.model, ns.partition, ns_hash(ns), root, ctx.token) {
            return Err(IndexError::NamespacesExhausted);
        }
        self.ns_slots_used += 1;
        self.namespaces.insert(ns, root);
        self.root_ns.insert(root, ns);
        Ok(root)
    }

    /// Builds a table without tombstones, sized for growth, and publishes it.
    fn rebuild_namespaces(&mut self, ctx: &WriteCtx<'_, K::E>) {
        let capacity = ((self.namespaces.len() + 1) * 4)
            .next_power_of_two()
            .max(NS_CAPACITY_MIN);
        let table = NsTable::with_capacity(capacity);
        for (ns, root) in &self.namespaces {
            table.insert(ns.model, ns.partition, ns_hash(*ns), *root, ctx.token);
        }
        let old = ctx.tree.namespaces.publish(table, ctx.token);
        self.retired.ns_table(ctx.domain, old);
        self.ns_slots_used = self.namespaces.len();
        self.ns_capacity = capacity;
    }

    fn remove_namespace(&mut self, ctx: &WriteCtx<'_, K::E>, root: u32) {
        let Some(ns) = self.root_ns.remove(&root) else {
            return;
        };
        self.last_root = None;
        self.namespaces.remove(&ns);
        let guard = ctx.token.guard();
        let table = ctx.tree.namespaces.load(&guard);
        table.remove(ns.model, ns.partition, ns_hash(ns), ctx.token);
        self.retire_node(ctx, root);
    }

    /// Evicts least-recently-used leaf entries of every model over `budget` units until it is
    /// back within budget. Returns (entries, units) evicted.
    pub fn evict(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        budget: u64,
        report: &mut Option<&mut dyn FnMut(Evicted)>,
    ) -> (u64, u64) {
        let (mut entries, mut units) = (0, 0);
        self.begin_batch();
        for slot in 0..self.models.len() {
            while self.models[slot].units > budget && self.models[slot].lru.head != NIL {
                units += self.remove_entry(ctx, self.models[slot].lru.head, report);
                entries += 1;
            }
        }
        self.end_batch(ctx);
        (entries, units)
    }

    /// Removes `worker` from every tree of this kind; returns the entries removed.
    pub fn remove_worker(&mut self, ctx: &WriteCtx<'_, K::E>, worker: WorkerId) -> u64 {
        let mut removed = 0;
        self.begin_batch();
        while let Some(head) = self.workers.get(worker.index()).map(|list| list.head) {
            if head == NIL {
                break;
            }
            self.remove_entry(ctx, head, &mut None);
            removed += 1;
        }
        self.end_batch(ctx);
        removed
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

    /// The report of an entry about to be evicted: its full key and where its node starts.
    fn evicted(&self, ctx: &WriteCtx<'_, K::E>, node: u32, worker: WorkerId) -> Evicted {
        let guard = ctx.token.guard();
        let mut labels = Vec::new();
        let mut at = node;
        while at != 0 && !self.root_ns.contains_key(&at) {
            let parent = self.meta[at as usize].parent;
            let (Some(shared), Some(up)) = (
                ctx.tree.slab.get(at, &guard),
                ctx.tree.slab.get(parent, &guard),
            ) else {
                break;
            };
            labels.push(shared.label_from(up.depth_end(), &guard).unwrap_or(&[]));
            at = parent;
        }
        let namespace = self.root_ns.get(&at).copied().unwrap_or_default();
        let kept_len = labels.iter().skip(1).map(|label| label.len()).sum();
        let elements: Vec<K::E> = labels
            .iter()
            .rev()
            .flat_map(|label| label.iter().copied())
            .collect();
        Evicted {
            kind: K::KIND,
            namespace,
            worker,
            key: self.keys.report(&elements),
            kept_len,
        }
    }
}
