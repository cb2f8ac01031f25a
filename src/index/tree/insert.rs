//! Insert: `TreeWriter::insert` walks the key down from its namespace's root (or from where a
//! reader's lookup ended, when its `LookupHint` is still valid: `resume_at`), splits the edge
//! where the key leaves it (`split.rs`), adds a leaf for the rest and marks the worker the most
//! recent holder of every node on the path (`touch`).

use std::sync::Arc;

use super::{LabelSource, LookupHint, Meta, TreeWriter, WriteCtx, KEY_ELEMENTS_MAX};
use crate::ids::WorkerId;
use crate::index::entries::{Chain, Entry};
use crate::index::keys::{common_prefix, Keying};
use crate::index::raw::{Element, Guard, MRU_LEN};
use crate::index::{IndexError, Namespace};
use crate::limits::WORKERS_MAX;

/// Whether a new leaf of `leaf_len` elements keeps the record's key buffer of `key_len` rather
/// than a copy of its part: only when that part is at least half the key. A kept key is not
/// recycled for the next request's key, so the data core's next copy lands in cold memory;
/// for a leaf of a quarter of an 8k-token key that cost more than the leaf's copy saved, and
/// the kept buffers, four times the leaves, spread the tree over more memory (measured in
/// `perf/results-index.md`).
fn leaf_keeps_key(leaf_len: usize, key_len: usize) -> bool {
    leaf_len.saturating_mul(2) >= key_len
}

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

impl<K: Keying> TreeWriter<K> {
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
        self.resume_at_path(root, start.node, matched, path)?;
        debug_assert!(
            self.spells(ctx, at, &key[..matched]),
            "a valid hint's node spells the matched prefix"
        );
        Some(start)
    }

    /// `resume_at`'s path from below the root down to `start` (at most `matched` nodes, one
    /// element or more each), pushed onto `path`; `None` when it does not end at this
    /// namespace's `root` (a node of another namespace's tree is a stale hint).
    fn resume_at_path(
        &self,
        root: u32,
        start: u32,
        matched: usize,
        path: &mut Vec<u32>,
    ) -> Option<()> {
        let first = path.len();
        let mut up = start;
        while up != root {
            if up == 0 || path.len() - first > matched {
                return None;
            }
            path.push(up);
            up = self.meta.get(up as usize)?.parent;
        }
        path[first..].reverse();
        Some(())
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
}
