//! Every `unsafe` operation of the index, behind a small safe API: the quiescent-state
//! reclamation domain (`Domain`, `Guard`, `WriterToken`), the segmented node slab (`Slab`), the
//! tree node with its published child table and edge label (`Node`), the namespace table
//! (`NsTable`) and the list of retired memory (`RetireList`).
//!
//! The invariants everything here relies on:
//! 1. One writer. Only the holder of the domain's single `WriterToken` publishes, retires or
//!    reclaims; readers only load.
//! 2. Namespace tables and labels are immutable once published. A change publishes a new
//!    allocation with one `Release` store and retires the old one. A child table is rebuilt the
//!    same way, except for two in-place writes readers tolerate: an entry appended into its
//!    spare capacity (written before the new length is published with `Release`, so a reader
//!    sees either the old length or the complete entry), and a child id swapped for a node
//!    spelling the same edge (a split or merge above it: the old and the new child both read
//!    correctly until the old one is reclaimed).
//! 3. Retired memory is freed only after every online reader has announced a quiescent state
//!    (stored the bumped epoch into its slot) since the retirement. A `Guard` is proof that its
//!    reader has not announced one since it was created, so a reference borrowed from a guard
//!    stays valid for the guard's lifetime.
//! 4. A node's label is written only through a `FreshNode` (a slot no reader can reach: never
//!    published, or reclaimed after a grace period), and cleared only when reclaimed. A label is
//!    a window of a reference-counted buffer (`Arc<[E]>`), and every node holding a label holds
//!    one strong count of its buffer, released when the node is cleared: nodes split from one
//!    edge share its buffer, and a leaf may keep the dispatch record's own key buffer.
//! 5. Segments of the slab are freed only when the slab is dropped (no reader or writer left).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

/// The most reader handles (data cores, plus handles used by tests and benchmarks) one index
/// serves: one padded epoch slot each, scanned by the writer on every reclamation.
pub const READERS_MAX: usize = 256;

/// Nodes per slab segment: 2^14 nodes of 64 bytes = 1 MiB, small enough that an idle index
/// costs little, large enough that the segment table stays small.
const SEGMENT_NODES_LOG2: u32 = 14;
const SEGMENT_NODES: usize = 1 << SEGMENT_NODES_LOG2;
/// Segments per slab: 2^16 segments (a 512 KiB pointer table) address 2^30 nodes, far above
/// what any `--max-tree-size` can keep live (each node holds at least one unit of budget).
const SEGMENTS_MAX: usize = 1 << 16;
/// The most nodes one tree kind can hold at once.
pub const NODES_MAX: u32 = (SEGMENTS_MAX * SEGMENT_NODES) as u32;

/// A reader slot's value while its reader holds no reference into the index.
const OFFLINE: u64 = u64::MAX;

/// An element of an edge label: a byte of UTF-8 text, or a page hash of token ids.
pub trait Element: Copy + Eq + Default + Send + Sync + std::fmt::Debug + 'static {}
impl Element for u8 {}
impl Element for u64 {}
#[cfg(test)]
impl Element for u32 {}

/// The reclamation domain: a global epoch and one padded slot per reader.
#[derive(Debug)]
pub struct Domain {
    epoch: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<AtomicU64>]>,
    claimed: Box<[AtomicBool]>,
    writer_taken: AtomicBool,
}

impl Default for Domain {
    fn default() -> Self {
        Self {
            epoch: CachePadded::new(AtomicU64::new(1)),
            slots: (0..READERS_MAX)
                .map(|_| CachePadded::new(AtomicU64::new(OFFLINE)))
                .collect(),
            claimed: (0..READERS_MAX).map(|_| AtomicBool::new(false)).collect(),
            writer_taken: AtomicBool::new(false),
        }
    }
}

impl Domain {
    /// Claims a free reader slot, offline until its first guard.
    pub fn claim_reader(&self) -> Option<ReaderSlot> {
        let index = self.claimed.iter().position(|claimed| {
            claimed
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        self.slots[index].store(OFFLINE, Ordering::Release);
        Some(ReaderSlot {
            index,
            online: Cell::new(false),
        })
    }

    /// Gives a reader slot back; its reader holds no reference any more.
    pub fn release_reader(&self, slot: &ReaderSlot) {
        self.slots[slot.index].store(OFFLINE, Ordering::Release);
        self.claimed[slot.index].store(false, Ordering::Release);
    }

    /// The one writer token of this domain; `None` once taken.
    pub fn take_writer(&self) -> Option<WriterToken> {
        let taken = self.writer_taken.swap(true, Ordering::AcqRel);
        (!taken).then_some(WriterToken { _not_clone: () })
    }

    /// Enters a read-side critical section for `slot` (going online if it was offline).
    pub fn guard<'r>(&'r self, slot: &'r ReaderSlot) -> Guard<'r> {
        if !slot.online.get() {
            self.slots[slot.index].store(self.epoch.load(Ordering::SeqCst), Ordering::SeqCst);
            // Store-load order: the writer must see this slot online before we read a pointer
            // it might free (pairs with the fence in `synchronize`).
            fence(Ordering::SeqCst);
            slot.online.set(true);
        }
        Guard {
            _scope: PhantomData,
        }
    }

    /// Announces a quiescent state: the reader holds no reference into the index.
    pub fn quiesce(&self, slot: &mut ReaderSlot) {
        let epoch = self.epoch.load(Ordering::Acquire);
        let own = &self.slots[slot.index];
        if !slot.online.get() || own.load(Ordering::Relaxed) != epoch {
            // Release: every read before this point happens-before the writer's free.
            own.store(epoch, Ordering::Release);
        }
        slot.online.set(true);
    }

    /// Takes the reader offline (an idle data core): it no longer delays reclamation.
    pub fn go_offline(&self, slot: &mut ReaderSlot) {
        self.slots[slot.index].store(OFFLINE, Ordering::Release);
        slot.online.set(false);
    }

    /// Bumps the epoch and returns the oldest epoch an online reader may still be in: memory
    /// retired at an epoch below it is unreachable by every reader.
    fn synchronize(&self, _writer: &mut WriterToken) -> u64 {
        let now = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        fence(Ordering::SeqCst);
        let claimed = self.claimed.iter().zip(self.slots.iter());
        claimed
            .filter(|(claimed, _)| claimed.load(Ordering::Acquire))
            .map(|(_, slot)| slot.load(Ordering::Acquire))
            .fold(now, u64::min)
    }

    fn epoch_now(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }
}

/// A reader's epoch slot in a `Domain` (one per reader handle; not `Sync`).
#[derive(Debug)]
pub struct ReaderSlot {
    index: usize,
    online: Cell<bool>,
}

/// Proof that no memory reachable from the index is freed while it lives: a reader's slot has
/// not announced a quiescent state since the guard was made, or the holder is the writer.
#[derive(Debug)]
pub struct Guard<'a> {
    _scope: PhantomData<&'a ()>,
}

/// The single writer's capability. Publishing and retiring need `&WriterToken`; reclaiming needs
/// `&mut WriterToken`, so no writer guard can be alive across a reclamation.
#[derive(Debug)]
pub struct WriterToken {
    _not_clone: (),
}

impl WriterToken {
    /// The writer's own guard: nothing is freed before `reclaim`, which needs `&mut self`.
    pub fn guard(&self) -> Guard<'_> {
        Guard {
            _scope: PhantomData,
        }
    }
}

/// One entry of a child table: the edge key of the child's first unit and the child's node id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildEntry {
    /// The edge key (first character, or a hash of the first page).
    pub key: u64,
    /// The child node.
    pub node: u32,
}

/// Child tables up to this many sorted entries are searched linearly; larger ones by bisection.
const CHILDREN_LINEAR_MAX: usize = 8;
/// Entries appended in place after a table's sorted part before the writer rebuilds it sorted:
/// readers scan this unsorted tail linearly, and a wide node is copied once per this many
/// inserts instead of once per insert.
pub const TABLE_TAIL_MAX: usize = 8;

/// One slot of a published child table. Slot 0 is the header: `key` holds the sorted length
/// (high half) and the capacity (low half), both fixed for the allocation; `node` holds the
/// published length. Atomics, because the writer appends slots and swaps child ids in place.
#[derive(Debug, Default)]
#[repr(C)]
struct TableSlot {
    key: AtomicU64,
    node: AtomicU32,
}

/// A published child table as one guard sees it: a sorted part and an unsorted appended tail.
#[derive(Clone, Copy, Debug)]
pub struct Children<'g> {
    sorted: &'g [TableSlot],
    tail: &'g [TableSlot],
}

impl<'g> Children<'g> {
    const EMPTY: Children<'static> = Children {
        sorted: &[],
        tail: &[],
    };

    /// Entries in the table.
    pub fn len(&self) -> usize {
        self.sorted.len() + self.tail.len()
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry: the sorted part, then the tail in append order.
    pub fn iter(&self) -> impl Iterator<Item = ChildEntry> + 'g {
        self.sorted.iter().chain(self.tail).map(|slot| ChildEntry {
            key: slot.key.load(Ordering::Relaxed),
            node: slot.node.load(Ordering::Acquire),
        })
    }

    /// The children whose edge key is `key` (several only for colliding page hashes).
    pub fn with_key(&self, key: u64) -> impl Iterator<Item = u32> + 'g {
        let key_of = |slot: &TableSlot| slot.key.load(Ordering::Relaxed);
        let from = if self.sorted.len() <= CHILDREN_LINEAR_MAX {
            let at = self.sorted.iter().position(|slot| key_of(slot) >= key);
            at.unwrap_or(self.sorted.len())
        } else {
            self.sorted.partition_point(|slot| key_of(slot) < key)
        };
        let sorted = self.sorted[from..]
            .iter()
            .take_while(move |slot| key_of(slot) == key);
        let tail = self.tail.iter().filter(move |slot| key_of(slot) == key);
        // Acquire: a child id swapped in place names a node initialized before the swap.
        sorted
            .chain(tail)
            .map(|slot| slot.node.load(Ordering::Acquire))
    }
}

/// A radix tree node, 64 bytes. Fields are atomics because readers load them while the writer
/// changes the child table and the tenant list.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Node<E: Element> {
    children: AtomicPtr<TableSlot>,
    /// The first element of the label's buffer (from `Arc::into_raw`), null for none.
    label_ptr: AtomicPtr<E>,
    /// Elements in the buffer (a `usize`: dropping the count rebuilds the `Arc` from it, so it
    /// must be exact for any buffer a caller hands in).
    label_len: AtomicUsize,
    /// Where this node's label ends inside its buffer (the label is the `depth_end - parent
    /// depth` elements before it: nodes sharing a buffer see different windows of it).
    label_end: AtomicU32,
    /// Depth in elements at the end of this node's edge; fixed for the node's lifetime.
    depth_end: AtomicU32,
    mru_version: AtomicU32,
    mru: [AtomicU64; 2],
    /// This slot's incarnation: a stamp unique to each initialization, 0 once the node is
    /// retired. A reader hands it on in a lookup hint, and the writer uses the hint only while
    /// the node still carries the same stamp (the same live node, not a reused slot).
    stamp: AtomicU64,
}

// Nodes are one cache line each (the slab's segment size assumes it).
const _: () = assert!(std::mem::size_of::<Node<u8>>() == 64);
const _: () = assert!(std::mem::size_of::<Node<u64>>() == 64);

impl<E: Element> Default for Node<E> {
    fn default() -> Self {
        Self {
            children: AtomicPtr::new(std::ptr::null_mut()),
            label_ptr: AtomicPtr::new(std::ptr::null_mut()),
            label_len: AtomicUsize::new(0),
            label_end: AtomicU32::new(0),
            depth_end: AtomicU32::new(0),
            mru_version: AtomicU32::new(0),
            mru: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            stamp: AtomicU64::new(0),
        }
    }
}

/// The most tenants a node publishes to readers, most recently used first.
pub const MRU_LEN: usize = 8;
/// An empty entry of the published tenant list.
const MRU_EMPTY: u16 = u16::MAX;
/// Reads of a tenant list that race a writer update before a reader gives up and reports no
/// tenants (a cache miss, still a correct route). The writer's update is a few stores.
const MRU_READ_RETRIES_MAX: usize = 64;

impl<E: Element> Node<E> {
    /// The published child table (empty when the node has no children).
    pub fn children<'g>(&'g self, _guard: &'g Guard<'_>) -> Children<'g> {
        let table = self.children.load(Ordering::Acquire);
        if table.is_null() {
            return Children::EMPTY;
        }
        // SAFETY: a non-null child pointer is a live table allocation of `capacity + 1` slots
        // (invariant 2, 3), its header written before its Release publication (paired with the
        // Acquire above) and freed only after a grace period that the guard's lifetime
        // excludes. Slots `1..=len` were written before `len` was published with Release
        // (paired with the Acquire load of `len`); `len <= capacity` (kept by the writer,
        // clamped here), so the slices are in bounds. Slots are atomics: in-place writes by the
        // writer are not data races.
        unsafe {
            let (sorted, capacity) = table_shape(table);
            let len = ((*table).node.load(Ordering::Acquire) as usize).min(capacity);
            let sorted = sorted.min(len);
            Children {
                sorted: std::slice::from_raw_parts(table.add(1), sorted),
                tail: std::slice::from_raw_parts(table.add(1 + sorted), len - sorted),
            }
        }
    }

    /// Slots of the child table's allocation (header included), 0 without a table: the
    /// accounting of table memory (writer).
    pub fn children_slots(&self, _writer: &WriterToken) -> usize {
        let table = self.children.load(Ordering::Relaxed);
        if table.is_null() {
            return 0;
        }
        // SAFETY: the writer's own view of a live table (only the writer replaces or frees it).
        unsafe { table_shape(table).1 + 1 }
    }

    /// Appends `entry` to the published child table in place (writer only); false (nothing
    /// changed) when there is no table, no spare capacity, or the unsorted tail is full: the
    /// writer then publishes a rebuilt table.
    pub fn append_child(&self, entry: ChildEntry, _writer: &WriterToken) -> bool {
        let table = self.children.load(Ordering::Relaxed);
        if table.is_null() {
            return false;
        }
        // SAFETY: the writer's own view of the node's live table (only the writer replaces or
        // frees it, and it holds the token). `len < capacity`, so slot `len + 1` is inside the
        // allocation; no reader reads it before the Release store of the new length below.
        unsafe {
            let (sorted, capacity) = table_shape(table);
            let len = (*table).node.load(Ordering::Relaxed) as usize;
            if len >= capacity || len - sorted.min(len) >= TABLE_TAIL_MAX {
                return false;
            }
            let slot = &*table.add(len + 1);
            slot.key.store(entry.key, Ordering::Relaxed);
            slot.node.store(entry.node, Ordering::Relaxed);
            (*table).node.store(len as u32 + 1, Ordering::Release);
        }
        true
    }

    /// Swaps child `old` for `new` (a node spelling the same edge) in place (writer only);
    /// false when `old` is not in the table.
    pub fn replace_child(&self, old: u32, new: u32, writer: &WriterToken) -> bool {
        let guard = writer.guard();
        let children = self.children(&guard);
        let slot = children
            .sorted
            .iter()
            .chain(children.tail)
            .find(|slot| slot.node.load(Ordering::Relaxed) == old);
        match slot {
            // Release: `new` was initialized before readers can find it here.
            Some(slot) => slot.node.store(new, Ordering::Release),
            None => return false,
        }
        true
    }

    /// The label of this node's edge as seen from a parent at `depth_from` elements deep, or
    /// `None` when the node does not span that depth (only possible for a corrupted tree).
    pub fn label_from<'g>(&'g self, depth_from: u32, _guard: &'g Guard<'_>) -> Option<&'g [E]> {
        let ptr = self.label_ptr.load(Ordering::Acquire);
        let len = self.label_len.load(Ordering::Relaxed);
        let end = self.label_end.load(Ordering::Relaxed) as usize;
        let wanted = self
            .depth_end
            .load(Ordering::Relaxed)
            .checked_sub(depth_from)? as usize;
        if ptr.is_null() || wanted > end || end > len {
            return None;
        }
        // SAFETY: `ptr`, `len` and `end` were written together through a `FreshNode`, before
        // the node was published (invariant 4), and describe a live buffer of `len` elements in
        // which this node holds a strong count, released only when the node is cleared after a
        // grace period the guard excludes (invariant 3). `end - wanted .. end` is in bounds
        // (checked above).
        unsafe { Some(std::slice::from_raw_parts(ptr.add(end - wanted), wanted)) }
    }

    /// The label's buffer as (address, elements): nodes with the same address share one
    /// buffer (the writer's accounting of label memory, and its test for contiguous labels).
    pub fn label_buffer(&self) -> (usize, usize) {
        let ptr = self.label_ptr.load(Ordering::Relaxed);
        (ptr as usize, self.label_len.load(Ordering::Relaxed))
    }

    /// Where the label ends inside its buffer.
    pub fn label_end(&self) -> u32 {
        self.label_end.load(Ordering::Relaxed)
    }

    /// Depth in elements at the end of this node's edge.
    pub fn depth_end(&self) -> u32 {
        self.depth_end.load(Ordering::Relaxed)
    }

    /// The incarnation stamp (0: retired). Stable while a guard that reached the node lives,
    /// except that retirement may clear it.
    pub fn stamp(&self) -> u64 {
        self.stamp.load(Ordering::Relaxed)
    }

    /// Sets the incarnation stamp (writer only): a fresh one when the slot is initialized, 0
    /// when the node is retired.
    pub fn set_stamp(&self, stamp: u64, _writer: &WriterToken) {
        self.stamp.store(stamp, Ordering::Relaxed);
    }

    /// The published tenants, most recently used first; `None` entries at the end.
    pub fn tenants(&self) -> ([u16; MRU_LEN], usize) {
        for _ in 0..MRU_READ_RETRIES_MAX {
            let before = self.mru_version.load(Ordering::Acquire);
            let words = [
                self.mru[0].load(Ordering::Relaxed),
                self.mru[1].load(Ordering::Relaxed),
            ];
            fence(Ordering::Acquire);
            let after = self.mru_version.load(Ordering::Relaxed);
            if before == after && before.is_multiple_of(2) {
                return unpack_mru(words);
            }
            std::hint::spin_loop();
        }
        ([MRU_EMPTY; MRU_LEN], 0)
    }

    /// Publishes a new tenant list (writer only): a sequence lock over two words.
    pub fn set_tenants(&self, tenants: &[u16], _writer: &WriterToken) {
        let words = pack_mru(tenants);
        let version = self.mru_version.load(Ordering::Relaxed);
        self.mru_version
            .store(version.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.mru[0].store(words[0], Ordering::Relaxed);
        self.mru[1].store(words[1], Ordering::Relaxed);
        self.mru_version
            .store(version.wrapping_add(2), Ordering::Release);
    }

    /// Publishes a new child table of `entries` sorted by key, with spare capacity for appends
    /// (writer only), and returns the old one for retirement.
    pub fn publish_children(&self, entries: &[ChildEntry], _writer: &WriterToken) -> RetiredTable {
        let new = if entries.is_empty() {
            std::ptr::null_mut()
        } else {
            table_alloc(entries)
        };
        RetiredTable(self.children.swap(new, Ordering::AcqRel))
    }

    /// Retires this node's child table without unpublishing it (the node itself is being
    /// retired, so stale readers keep a complete view until the grace period ends).
    pub fn retire_children_in_place(&self, _writer: &WriterToken) -> RetiredTable {
        RetiredTable(self.children.load(Ordering::Relaxed))
    }

    /// Hands this node's child table over to `heir` (a fresh node taking this node's place in a
    /// merge); the retired node keeps pointing at it but no longer owns it.
    pub fn lend_children_to(&self, heir: &FreshNode<'_, E>, _writer: &WriterToken) {
        let table = self.children.load(Ordering::Relaxed);
        heir.node.children.store(table, Ordering::Relaxed);
    }
}

fn pack_mru(tenants: &[u16]) -> [u64; 2] {
    let mut ids = [MRU_EMPTY; MRU_LEN];
    for (slot, id) in ids.iter_mut().zip(tenants) {
        *slot = *id;
    }
    let word = |part: &[u16]| {
        part.iter()
            .rev()
            .fold(0u64, |acc, id| (acc << 16) | u64::from(*id))
    };
    [word(&ids[..4]), word(&ids[4..])]
}

fn unpack_mru(words: [u64; 2]) -> ([u16; MRU_LEN], usize) {
    let mut ids = [MRU_EMPTY; MRU_LEN];
    for (i, id) in ids.iter_mut().enumerate() {
        *id = (words[i / 4] >> (16 * (i % 4))) as u16;
    }
    let len = ids
        .iter()
        .position(|id| *id == MRU_EMPTY)
        .unwrap_or(MRU_LEN);
    (ids, len)
}

/// Spare slots a table of `len` entries is built with: about a quarter more, at least 2 (a split
/// node gets its second child right away), at most the tail a reader scans.
fn table_spare(len: usize) -> usize {
    (len / 4).clamp(2, TABLE_TAIL_MAX)
}

/// The sorted length and the capacity of a table, from its header.
///
/// # Safety
/// `table` is a live table allocation made by `table_alloc`.
unsafe fn table_shape(table: *const TableSlot) -> (usize, usize) {
    // SAFETY: per the caller, slot 0 (the header) is live; its key is fixed at allocation.
    let shape = unsafe { (*table).key.load(Ordering::Relaxed) };
    ((shape >> 32) as usize, shape as u32 as usize)
}

fn table_alloc(entries: &[ChildEntry]) -> *mut TableSlot {
    let capacity = entries.len() + table_spare(entries.len());
    let mut table: Vec<TableSlot> = Vec::with_capacity(capacity + 1);
    table.push(TableSlot {
        key: AtomicU64::new(((entries.len() as u64) << 32) | capacity as u64),
        node: AtomicU32::new(entries.len() as u32),
    });
    table.extend(entries.iter().map(|entry| TableSlot {
        key: AtomicU64::new(entry.key),
        node: AtomicU32::new(entry.node),
    }));
    // Readers search the entries part by key.
    table[1..].sort_unstable_by_key(|slot| slot.key.load(Ordering::Relaxed));
    table.resize_with(capacity + 1, TableSlot::default);
    Box::into_raw(table.into_boxed_slice()).cast::<TableSlot>()
}

/// A child table taken out of a node, to be freed after a grace period.
#[derive(Debug)]
pub struct RetiredTable(*mut TableSlot);

impl RetiredTable {
    /// Frees the table.
    ///
    /// # Safety
    /// No reader may still hold a reference into it (a grace period has passed since it was
    /// unpublished), and it is freed once.
    unsafe fn free(self) {
        if self.0.is_null() {
            return;
        }
        // SAFETY: per the caller, unreachable; built by `table_alloc` as a boxed slice of
        // `capacity + 1` slots whose header stores `capacity`.
        unsafe {
            let slots = table_shape(self.0).1 + 1;
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.0, slots,
            )));
        }
    }
}

/// A new label buffer holding a copy of `elements`, copied in pieces (`crate::copy`: one
/// `memcpy` of a whole long key can take twenty times longer).
pub fn buffer_of<E: Element>(elements: &[E]) -> Arc<[E]> {
    let mut buffer = Arc::<[E]>::new_uninit_slice(elements.len());
    let Some(slots) = Arc::get_mut(&mut buffer) else {
        return Arc::from(elements);
    };
    let piece = crate::copy::piece_len::<E>();
    for (slots, part) in slots.chunks_mut(piece).zip(elements.chunks(piece)) {
        for (slot, element) in slots.iter_mut().zip(part) {
            slot.write(*element);
        }
    }
    // SAFETY: the buffer has `elements.len()` slots, and the pieces of `slots` and `elements`
    // (the same lengths, cut at the same points) wrote every one of them.
    unsafe { buffer.assume_init() }
}

/// A new shared string holding a copy of `text`, copied in pieces (`buffer_of`).
pub fn text_buffer(text: &str) -> Arc<str> {
    let bytes = buffer_of(text.as_bytes());
    // SAFETY: the bytes are a copy of a `str`, so valid UTF-8, and `str` has the layout of
    // `[u8]`: the pointer `Arc::into_raw` gives for the one is the other's (as std's own
    // `From<&str> for Arc<str>` converts).
    unsafe { Arc::from_raw(Arc::into_raw(bytes) as *const str) }
}

/// A new shared string of exactly `len` bytes that `fill` writes in order through a
/// [`TextWriter`]: text assembled from pieces (a prompt's strings, decoded) is built once, in
/// the buffer the dispatch record and the index keep, instead of being assembled elsewhere and
/// copied. `None` when `fill` gives up, writes fewer than `len` bytes, or writes bytes that are
/// not UTF-8.
pub fn text_buffer_written(
    len: usize,
    fill: impl FnOnce(&mut TextWriter<'_>) -> Option<()>,
) -> Option<Arc<str>> {
    let mut buffer = Arc::<[u8]>::new_uninit_slice(len);
    let slots = Arc::get_mut(&mut buffer)?;
    let mut writer = TextWriter {
        slots,
        written: 0,
        high_bits: 0,
    };
    fill(&mut writer)?;
    if writer.written != len {
        return None;
    }
    let ascii = writer.high_bits & 0x80 == 0;
    // SAFETY: the writer wrote every one of the `len` slots: it writes only at `written`,
    // advances `written` by what it wrote and never past `len`, and `written == len` here.
    let bytes = unsafe { buffer.assume_init() };
    // ASCII is UTF-8: the common prompt's check is the copy's (`TextWriter::push`).
    if !ascii {
        std::str::from_utf8(&bytes).ok()?;
    }
    // SAFETY: the bytes were checked to be UTF-8 just above (all below 0x80, or `from_utf8`);
    // the cast is `text_buffer`'s.
    Some(unsafe { Arc::from_raw(Arc::into_raw(bytes) as *const str) })
}

/// Writes a [`text_buffer_written`] buffer front to back.
pub struct TextWriter<'a> {
    slots: &'a mut [std::mem::MaybeUninit<u8>],
    written: usize,
    /// Every byte written, ORed: its high bit is clear while the text is ASCII.
    high_bits: u8,
}

impl TextWriter<'_> {
    /// Appends `bytes`; false, writing nothing, when they do not fit in what is left. The copy
    /// also ORs the bytes together, so that ASCII text needs no second pass to be known UTF-8:
    /// 64 bytes a step, four vector loads, ORs and stores (15 instructions with the loop's,
    /// where `memcpy` and then `is_ascii` took about 25). No `memcpy`, so no `rep movsb`
    /// either (see `crate::copy`).
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        const BLOCK: usize = 64;
        let end = self.written.saturating_add(bytes.len());
        let Some(slots) = self.slots.get_mut(self.written..end) else {
            return false;
        };
        let mut high_bits = [0u8; BLOCK];
        let (slot_blocks, slot_tail) = slots.as_chunks_mut::<BLOCK>();
        let (byte_blocks, byte_tail) = bytes.as_chunks::<BLOCK>();
        for (slots, &block) in slot_blocks.iter_mut().zip(byte_blocks) {
            // Read whole first: written one by one, each byte was loaded twice.
            for (high, byte) in high_bits.iter_mut().zip(block) {
                *high |= byte;
            }
            for (slot, byte) in slots.iter_mut().zip(block) {
                slot.write(byte);
            }
        }
        for (slot, &byte) in slot_tail.iter_mut().zip(byte_tail) {
            slot.write(byte);
            high_bits[0] |= byte;
        }
        self.high_bits |= high_bits.iter().fold(0, |all, &high| all | high);
        self.written = end;
        true
    }
}

/// One cache line of eight atomic words: the hash index's table is made of them.
#[derive(Debug)]
#[repr(C, align(64))]
pub struct AtomicLine(pub [AtomicU64; 8]);

/// Asks the CPU to bring the cache line holding `value` into its caches ahead of a read: a walk
/// over many keys issues the next few keys' misses while it reads the current one. A hint only:
/// it changes no value.
#[inline]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and writes nothing; the pointer comes from a reference
    // to a live value in any case.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// `len` cache lines of zero words, from the allocator's zeroing path: a large table comes as
/// fresh zero pages the kernel commits only as they are first written (an idle table costs
/// address space, not memory).
pub fn zeroed_lines(len: usize) -> Box<[AtomicLine]> {
    if len == 0 {
        return Box::new([]);
    }
    let Ok(layout) = std::alloc::Layout::array::<AtomicLine>(len) else {
        panic!("a table of {len} cache lines overflows the address space");
    };
    // SAFETY: the layout has a non-zero size (len > 0, and a line is 64 bytes).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `ptr` is a fresh allocation of `layout`, which is the layout of `[AtomicLine; len]`
    // (so the box deallocates it with the same layout), and all-zero bytes are a valid
    // `AtomicLine` (atomic integers have the bit validity of their integers).
    unsafe {
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            ptr.cast::<AtomicLine>(),
            len,
        ))
    }
}

/// A node slot no reader can reach: freshly allocated or reclaimed after a grace period.
#[derive(Debug)]
pub struct FreshNode<'s, E: Element> {
    id: u32,
    node: &'s Node<E>,
}

impl<E: Element> FreshNode<'_, E> {
    /// The slot's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Writes the node's label (the `label_end` elements of `buffer` up to there, seen
    /// from its parent's depth), its depth and its tenants; the node keeps `buffer`'s count.
    /// Nothing is published until a parent table names the node.
    pub fn init(
        &self,
        buffer: Arc<[E]>,
        label_end: u32,
        depth_end: u32,
        tenants: &[u16],
        writer: &WriterToken,
    ) {
        let len = buffer.len();
        let ptr = Arc::into_raw(buffer).cast::<E>().cast_mut();
        self.install((ptr, len, label_end), depth_end, tenants, writer);
    }

    /// Writes a label that is a window of `donor`'s buffer, ending at `label_end`, taking one
    /// more count of that buffer. `donor` is a live node (the writer's view).
    pub fn init_sharing(
        &self,
        donor: &Node<E>,
        label_end: u32,
        depth_end: u32,
        tenants: &[u16],
        writer: &WriterToken,
    ) {
        let ptr = donor.label_ptr.load(Ordering::Relaxed);
        let len = donor.label_len.load(Ordering::Relaxed);
        debug_assert!(!ptr.is_null(), "the donor holds a label buffer");
        // SAFETY: a live node's non-null `ptr`/`len` come from `Arc::into_raw` of an
        // `Arc<[E]>` of `len` elements (`init`), in which the donor holds a count that only
        // `Slab::clear` releases, and the writer (holding the token) has not cleared it: the
        // buffer is alive, so taking one more count is sound. This node releases it in `clear`.
        unsafe { Arc::increment_strong_count(std::ptr::slice_from_raw_parts(ptr, len)) };
        self.install((ptr, len, label_end), depth_end, tenants, writer);
    }

    /// Writes a label buffer `(ptr, len, label_end)` whose count this node holds, the depth,
    /// no children and the tenants of a fresh node. A `label_end` past the buffer is cut to its
    /// length (`label_from` then finds the label too short: a corrupt tree, never unsound).
    fn install(
        &self,
        (ptr, len, label_end): (*mut E, usize, u32),
        depth_end: u32,
        tenants: &[u16],
        writer: &WriterToken,
    ) {
        debug_assert!(
            self.node.label_ptr.load(Ordering::Relaxed).is_null(),
            "a fresh node has no label"
        );
        self.node.label_ptr.store(ptr, Ordering::Relaxed);
        self.node.label_len.store(len, Ordering::Relaxed);
        let label_end = u32::try_from(len).map_or(label_end, |len| label_end.min(len));
        self.node.label_end.store(label_end, Ordering::Relaxed);
        self.node.depth_end.store(depth_end, Ordering::Relaxed);
        self.node
            .children
            .store(std::ptr::null_mut(), Ordering::Relaxed);
        self.node.set_tenants(tenants, writer);
    }

    /// Publishes the fresh node's first child table (it has no old one).
    pub fn init_children(&self, entries: &[ChildEntry], writer: &WriterToken) {
        let old = self.node.publish_children(entries, writer);
        debug_assert!(old.0.is_null(), "a fresh node has no child table");
    }
}

/// The segmented node slab of one tree kind: ids are `u32`, id 0 is never handed out.
#[derive(Debug)]
pub struct Slab<E: Element> {
    segments: Box<[AtomicPtr<Node<E>>]>,
}

impl<E: Element> Default for Slab<E> {
    fn default() -> Self {
        let segments = (0..SEGMENTS_MAX)
            .map(|_| AtomicPtr::new(std::ptr::null_mut()))
            .collect();
        Self { segments }
    }
}

impl<E: Element> Slab<E> {
    /// The node with this id, or `None` for an id outside every allocated segment.
    pub fn get<'g>(&'g self, id: u32, _guard: &'g Guard<'_>) -> Option<&'g Node<E>> {
        self.node(id)
    }

    fn node(&self, id: u32) -> Option<&Node<E>> {
        let segment = self.segments.get((id >> SEGMENT_NODES_LOG2) as usize)?;
        let base = segment.load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: a non-null segment pointer is a live boxed slice of SEGMENT_NODES nodes,
        // freed only in `Drop` (invariant 5); the masked index is in bounds. Nodes are all
        // atomics, so a shared reference is sound while the writer updates them.
        unsafe { Some(&*base.add(id as usize & (SEGMENT_NODES - 1))) }
    }

    /// Takes slot `id` (never handed out, or reclaimed) for a new node; allocates its segment.
    pub fn fresh(&self, id: u32, _writer: &WriterToken) -> Option<FreshNode<'_, E>> {
        let segment = self.segments.get((id >> SEGMENT_NODES_LOG2) as usize)?;
        if id == 0 {
            return None;
        }
        if segment.load(Ordering::Relaxed).is_null() {
            let nodes: Box<[Node<E>]> = (0..SEGMENT_NODES).map(|_| Node::default()).collect();
            segment.store(Box::into_raw(nodes).cast::<Node<E>>(), Ordering::Release);
        }
        let node = self.node(id)?;
        Some(FreshNode { id, node })
    }

    /// Clears a reclaimed node: releases its label buffer, forgets its child table (owned
    /// elsewhere or retired separately) and its tenants.
    ///
    /// # Safety
    /// A grace period has passed since the node was unpublished, and it is cleared once.
    unsafe fn clear(&self, id: u32) {
        let Some(node) = self.node(id) else { return };
        node.children.store(std::ptr::null_mut(), Ordering::Relaxed);
        node.label_end.store(0, Ordering::Relaxed);
        // SAFETY: forwarded from the caller: no reader can reach the node, and its count is
        // released once (the pointer is swapped out).
        unsafe { node.release_label() };
    }
}

impl<E: Element> Node<E> {
    /// Releases the node's count of its label buffer (freeing the buffer with its last count).
    ///
    /// # Safety
    /// No reader can reach this node's label any more.
    unsafe fn release_label(&self) {
        let ptr = self.label_ptr.swap(std::ptr::null_mut(), Ordering::Relaxed);
        let len = self.label_len.swap(0, Ordering::Relaxed);
        if !ptr.is_null() {
            // SAFETY: a non-null `ptr`/`len` came from `Arc::into_raw` of an `Arc<[E]>` of
            // `len` elements in which this node holds one count (`init`, `init_sharing`),
            // swapped out above so it is released once; per the caller nothing reads it.
            unsafe { drop(Arc::from_raw(std::ptr::slice_from_raw_parts(ptr, len))) };
        }
    }
}

impl<E: Element> Drop for Slab<E> {
    fn drop(&mut self) {
        for segment in self.segments.iter() {
            let base = segment.load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            // SAFETY: `&mut self`: no reader or writer is left. Every node still holding a
            // table owns it, and every node still holding a label holds one count of its
            // buffer (retired nodes were cleared by `RetireList::drain_all` before the slab is
            // dropped), so each table is freed and each count released once; then the segment.
            unsafe {
                let nodes = std::slice::from_raw_parts(base, SEGMENT_NODES);
                for node in nodes {
                    let table = node.children.swap(std::ptr::null_mut(), Ordering::Relaxed);
                    RetiredTable(table).free();
                    node.release_label();
                }
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    base,
                    SEGMENT_NODES,
                )));
            }
        }
    }
}

/// One namespace slot: the namespace's two halves and its root node (0 empty, `TOMBSTONE` gone).
#[derive(Debug, Default)]
pub struct NsSlot {
    model: AtomicU64,
    partition: AtomicU64,
    root: AtomicU32,
}

/// A namespace slot's root while the namespace was removed (probing continues past it).
pub const NS_TOMBSTONE: u32 = u32::MAX;

/// An open-addressing namespace table (linear probing, power-of-two capacity), written in place
/// by the writer (slots go empty → live → tombstone, never back) and replaced when it fills.
#[derive(Debug)]
pub struct NsTable {
    slots: Box<[NsSlot]>,
}

impl NsTable {
    /// An empty table of `capacity` slots (a power of two).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            slots: (0..capacity).map(|_| NsSlot::default()).collect(),
        }
    }

    /// The root of namespace `(model, partition)`, probing from `hash`.
    pub fn find(&self, model: u64, partition: u64, hash: u64) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        for _ in 0..self.slots.len() {
            let slot = &self.slots[at];
            let root = slot.root.load(Ordering::Acquire);
            if root == 0 {
                return None;
            }
            let same = slot.model.load(Ordering::Relaxed) == model
                && slot.partition.load(Ordering::Relaxed) == partition;
            if root != NS_TOMBSTONE && same {
                return Some(root);
            }
            at = (at + 1) & mask;
        }
        None
    }

    /// Writes a new namespace into the first empty slot from `hash` (writer only); false when
    /// the table has no empty slot left.
    pub fn insert(
        &self,
        model: u64,
        partition: u64,
        hash: u64,
        root: u32,
        _w: &WriterToken,
    ) -> bool {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        for _ in 0..self.slots.len() {
            let slot = &self.slots[at];
            if slot.root.load(Ordering::Relaxed) == 0 {
                slot.model.store(model, Ordering::Relaxed);
                slot.partition.store(partition, Ordering::Relaxed);
                slot.root.store(root, Ordering::Release);
                return true;
            }
            at = (at + 1) & mask;
        }
        false
    }

    /// Marks namespace `(model, partition)` removed (writer only).
    pub fn remove(&self, model: u64, partition: u64, hash: u64, _w: &WriterToken) {
        let mask = self.slots.len() - 1;
        let mut at = hash as usize & mask;
        for _ in 0..self.slots.len() {
            let slot = &self.slots[at];
            let root = slot.root.load(Ordering::Relaxed);
            if root == 0 {
                return;
            }
            let same = slot.model.load(Ordering::Relaxed) == model
                && slot.partition.load(Ordering::Relaxed) == partition;
            if root != NS_TOMBSTONE && same {
                slot.root.store(NS_TOMBSTONE, Ordering::Release);
                return;
            }
            at = (at + 1) & mask;
        }
    }
}

/// The published namespace table of one tree kind.
#[derive(Debug)]
pub struct NsTablePtr(AtomicPtr<NsTable>);

impl NsTablePtr {
    /// A table with `capacity` slots (a power of two).
    pub fn new(capacity: usize) -> Self {
        Self(AtomicPtr::new(Box::into_raw(Box::new(
            NsTable::with_capacity(capacity),
        ))))
    }

    /// The current table.
    pub fn load<'g>(&'g self, _guard: &'g Guard<'_>) -> &'g NsTable {
        // SAFETY: always non-null (set in `new`, replaced only by `replace` with a new box);
        // a replaced table is freed only after a grace period the guard excludes (invariant 3).
        unsafe { &*self.0.load(Ordering::Acquire) }
    }

    /// Publishes `table`, built completely beforehand, and returns the old one for retirement.
    pub fn publish(&self, table: NsTable, _writer: &WriterToken) -> RetiredNsTable {
        let new = Box::into_raw(Box::new(table));
        RetiredNsTable(self.0.swap(new, Ordering::AcqRel))
    }
}

impl Drop for NsTablePtr {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no reader is left; the pointer is the live box from `new` or
        // `replace`, freed once here.
        unsafe { drop(Box::from_raw(*self.0.get_mut())) };
    }
}

/// A namespace table taken out of use, to be freed after a grace period.
#[derive(Debug)]
pub struct RetiredNsTable(*mut NsTable);

/// Memory waiting for a grace period.
#[derive(Debug)]
enum Retired {
    Table(RetiredTable),
    Node(u32),
    NsTable(RetiredNsTable),
}

/// The writer's list of retired memory of one tree kind, each item tagged with its epoch.
#[derive(Debug, Default)]
pub struct RetireList {
    items: std::collections::VecDeque<(u64, Retired)>,
}

// SAFETY: the raw pointers in the list are owned allocations of `Send` data (child tables,
// namespace tables); moving the list to another thread moves that ownership.
unsafe impl Send for RetireList {}

impl RetireList {
    /// Retires a child table taken out of a node.
    pub fn table(&mut self, domain: &Domain, table: RetiredTable) {
        if !table.0.is_null() {
            self.items
                .push_back((domain.epoch_now(), Retired::Table(table)));
        }
    }

    /// Retires a node that no published table names any more.
    pub fn node(&mut self, domain: &Domain, id: u32) {
        self.items
            .push_back((domain.epoch_now(), Retired::Node(id)));
    }

    /// Retires a replaced namespace table.
    pub fn ns_table(&mut self, domain: &Domain, table: RetiredNsTable) {
        self.items
            .push_back((domain.epoch_now(), Retired::NsTable(table)));
    }

    /// Items waiting for a grace period.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Frees everything retired before every online reader's last quiescent state; reclaimed
    /// node ids go to `free_ids`. Returns how many items were freed.
    pub fn reclaim<E: Element>(
        &mut self,
        domain: &Domain,
        slab: &Slab<E>,
        writer: &mut WriterToken,
        free_ids: &mut Vec<u32>,
    ) -> usize {
        if self.items.is_empty() {
            return 0;
        }
        let safe_below = domain.synchronize(writer);
        let mut freed = 0;
        while self
            .items
            .front()
            .is_some_and(|(epoch, _)| *epoch < safe_below)
        {
            let Some((_, item)) = self.items.pop_front() else {
                break;
            };
            // SAFETY: retired at an epoch below every online reader's announced epoch, so each
            // reader passed a quiescent state after the item was unpublished (invariant 3);
            // popped from the list, so it is freed once.
            unsafe { free_retired(item, slab, free_ids) };
            freed += 1;
        }
        freed
    }

    /// Frees every item regardless of readers: only for `Drop` of the whole index, when no
    /// reader handle is left (`&mut` access to the shared state proves it).
    pub fn drain_all<E: Element>(&mut self, slab: &mut Slab<E>) {
        let mut ids = Vec::new();
        while let Some((_, item)) = self.items.pop_front() {
            // SAFETY: `&mut Slab` means the shared index has no other owner: no reader exists.
            unsafe { free_retired(item, slab, &mut ids) };
        }
    }
}

/// Frees one retired item.
///
/// # Safety
/// No reader can reach the item, and it is freed once.
unsafe fn free_retired<E: Element>(item: Retired, slab: &Slab<E>, free_ids: &mut Vec<u32>) {
    match item {
        // SAFETY: forwarded from the caller.
        Retired::Table(table) => unsafe { table.free() },
        Retired::Node(id) => {
            // SAFETY: forwarded from the caller.
            unsafe { slab.clear(id) };
            free_ids.push(id);
        }
        // SAFETY: forwarded from the caller; the pointer came from `Box::into_raw`.
        Retired::NsTable(table) => unsafe { drop(Box::from_raw(table.0)) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_text_buffers_hold_exactly_what_was_written() {
        let text = "préfixe partagé, ".repeat(500);
        let (head, tail) = text.as_bytes().split_at(7);
        let written = text_buffer_written(text.len(), |w| {
            (w.push(head) && w.push(b"") && w.push(tail)).then_some(())
        });
        assert_eq!(written.as_deref(), Some(text.as_str()));
        assert_eq!(text_buffer_written(0, |_| Some(())).as_deref(), Some(""));
        // Short, refused by the writer, given up, or not UTF-8: no buffer.
        assert_eq!(
            text_buffer_written(4, |w| w.push(b"abc").then_some(())),
            None
        );
        assert_eq!(
            text_buffer_written(4, |w| {
                assert!(w.push(b"abc"));
                assert!(!w.push(b"de"), "a push past the end is refused");
                w.push(b"d").then_some(())
            })
            .as_deref(),
            Some("abcd")
        );
        assert_eq!(
            text_buffer_written(3, |w| {
                w.push(b"abc");
                None
            }),
            None
        );
        assert_eq!(
            text_buffer_written(2, |w| w.push(&[0xC3, 0x28]).then_some(())),
            None
        );
    }

    #[test]
    fn a_non_ascii_byte_anywhere_in_a_push_is_seen_by_the_utf8_check() {
        // Lengths and positions across the copy's 64-byte blocks and its remainder, written in
        // one push or split in two: a lone continuation byte is refused wherever it lies, and a
        // two-byte character is kept.
        for len in [1, 63, 64, 65, 130] {
            for at in 0..len {
                for split in [0, at / 2, len] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = 0x80;
                    let (head, tail) = bytes.split_at(split);
                    let written = |bytes: &[u8], head: &[u8], tail: &[u8]| {
                        text_buffer_written(bytes.len(), |w| {
                            (w.push(head) && w.push(tail)).then_some(())
                        })
                    };
                    assert_eq!(written(&bytes, head, tail), None, "{len} {at} {split}");
                    let mut text = "a".repeat(len);
                    text.replace_range(at..=at, "é");
                    let (head, tail) = text.as_bytes().split_at(split.min(at));
                    assert_eq!(
                        written(text.as_bytes(), head, tail).as_deref(),
                        Some(text.as_str())
                    );
                }
            }
        }
    }

    #[test]
    fn buffers_hold_copies_of_long_keys() {
        let tokens: Vec<u32> = (0..10_000).collect();
        assert_eq!(&buffer_of(&tokens)[..], &tokens[..]);
        assert!(buffer_of::<u32>(&[]).is_empty());
        let text = "préfixe partagé, ".repeat(500);
        assert_eq!(&*text_buffer(&text), text.as_str());
    }

    #[test]
    fn mru_round_trips() {
        let ids = [3u16, 1, 1023, 7, 0, 9];
        let (out, len) = unpack_mru(pack_mru(&ids));
        assert_eq!(&out[..len], &ids);
        let (_, empty) = unpack_mru(pack_mru(&[]));
        assert_eq!(empty, 0);
    }

    #[test]
    fn child_tables_append_in_place_until_full_then_rebuild() {
        let domain = Domain::default();
        let mut writer = domain.take_writer().expect("writer");
        let slab: Slab<u32> = Slab::default();
        let node = slab.fresh(1, &writer).expect("fresh");
        node.init(Arc::from([7]), 1, 1, &[], &writer);
        let parent = slab.node(1).expect("node");
        let entry = |key: u64, node: u32| ChildEntry { key, node };
        assert!(!parent.append_child(entry(1, 2), &writer), "no table yet");
        node.init_children(&[entry(30, 3), entry(10, 4)], &writer);
        let mut list = RetireList::default();
        let mut appended = 0;
        // Keys below, between and equal to the sorted ones land in the unsorted tail.
        while parent.append_child(entry(20 - appended, 10 + appended as u32), &writer) {
            appended += 1;
        }
        assert_eq!(appended, table_spare(2) as u64);
        let guard = writer.guard();
        let children = parent.children(&guard);
        assert_eq!(children.len(), 2 + appended as usize);
        assert_eq!(children.with_key(10).collect::<Vec<_>>(), vec![4]);
        assert_eq!(children.with_key(19).collect::<Vec<_>>(), vec![11]);
        assert!(parent.replace_child(11, 40, &writer), "in the tail");
        assert!(parent.replace_child(3, 41, &writer), "in the sorted part");
        assert!(!parent.replace_child(99, 42, &writer));
        let ids: Vec<u32> = parent.children(&guard).iter().map(|e| e.node).collect();
        assert_eq!(ids, vec![4, 41, 10, 40]);
        // A rebuild sorts everything, with fresh spare capacity; the old table is retired.
        let mut entries: Vec<ChildEntry> = parent.children(&guard).iter().collect();
        entries.push(entry(5, 50));
        list.table(&domain, parent.publish_children(&entries, &writer));
        let keys: Vec<u64> = parent.children(&guard).iter().map(|e| e.key).collect();
        assert_eq!(keys, vec![5, 10, 19, 20, 30]);
        assert_eq!(parent.children_slots(&writer), 1 + 5 + table_spare(5));
        assert!(parent.append_child(entry(1, 51), &writer));
        let wide: Vec<ChildEntry> = (0..40).map(|i| entry(i * 2, 100 + i as u32)).collect();
        list.table(&domain, parent.publish_children(&wide, &writer));
        // A wide table stops at the tail bound, before its capacity would.
        let mut tail = 0;
        while parent.append_child(entry(1 + 2 * tail, 200), &writer) {
            tail += 1;
        }
        assert_eq!(tail as usize, TABLE_TAIL_MAX);
        assert_eq!(parent.children(&guard).with_key(5).count(), 1);
        assert_eq!(parent.children(&guard).with_key(6).count(), 1);
        let mut ids = Vec::new();
        assert_eq!(list.reclaim(&domain, &slab, &mut writer, &mut ids), 2);
    }

    #[test]
    fn retired_memory_waits_for_an_online_reader() {
        let domain = Domain::default();
        let mut writer = domain.take_writer().expect("first writer");
        assert!(domain.take_writer().is_none(), "one writer per domain");
        let slab: Slab<u8> = Slab::default();
        let mut slot = domain.claim_reader().expect("slot");
        let _online = domain.guard(&slot);
        let mut list = RetireList::default();
        let node = slab.fresh(5, &writer).expect("fresh");
        node.init(Arc::from([1, 2, 3]), 3, 3, &[], &writer);
        list.node(&domain, 5);
        let mut ids = Vec::new();
        assert_eq!(
            list.reclaim(&domain, &slab, &mut writer, &mut ids),
            0,
            "reader online"
        );
        domain.quiesce(&mut slot);
        assert_eq!(list.reclaim(&domain, &slab, &mut writer, &mut ids), 1);
        assert_eq!(ids, vec![5]);
        domain.go_offline(&mut slot);
        domain.release_reader(&slot);
    }

    #[test]
    fn zeroed_lines_are_aligned_zero_and_writable() {
        let lines = zeroed_lines(1000);
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines.as_ptr() as usize % 64, 0, "one line per cache line");
        assert!(lines
            .iter()
            .all(|line| line.0.iter().all(|w| w.load(Ordering::Relaxed) == 0)));
        lines[999].0[7].store(7, Ordering::Relaxed);
        assert_eq!(lines[999].0[7].load(Ordering::Relaxed), 7);
        assert!(zeroed_lines(0).is_empty());
    }
}
