//! Split: an insert that leaves an edge part way cuts it in two. Both halves keep the edge's
//! label buffer while each is long enough to (`LABEL_BUFFER_SHARE_MAX`), and the upper half
//! gets one entry per tenant of the lower, placed so the ancestor stays the more recent.

use super::{LabelSource, Meta, TreeWriter, WriteCtx};
use crate::index::entries::{Chain, Entry};
use crate::index::keys::Keying;
use crate::index::raw::{ChildEntry, FreshNode, Node};
use crate::index::IndexError;

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

impl<K: Keying> TreeWriter<K> {
    /// Splits `child` (under `parent`, whose edge starts at `depth`) after `common` elements
    /// and returns the new upper node. Both halves keep the child's label buffer (no copy)
    /// while each is long enough to (`may_keep_buffer`); a half too short gets a copy. The
    /// lower half is the child itself (its label shrinks from the front as its parent's depth
    /// grows), unless it must copy: then a new lower node replaces the child.
    pub(super) fn split(
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
        let split = LabelSplit {
            child,
            common,
            units: upper_units,
        };
        let lower = self.split_lower(ctx, shared, label, upper.id(), split)?;
        let (buffer_len, lower_len) = (shared.label_buffer().1, label.len() - common);
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

    /// `split`'s lower half: the child itself while its suffix may keep the label buffer, else
    /// a new node taking a copy (`split_moving_label`). When no node is left for it, `upper`
    /// (taken, not yet initialized) is given back.
    fn split_lower(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        child: &Node<K::E>,
        label: &[K::E],
        upper: u32,
        split: LabelSplit,
    ) -> Result<u32, IndexError> {
        let lower_len = label.len() - split.common;
        if may_keep_buffer(lower_len, child.label_buffer().1) {
            return Ok(split.child);
        }
        let Ok(fresh_lower) = self.alloc_node(ctx) else {
            self.free_unused(upper);
            return Err(IndexError::NodesExhausted);
        };
        self.split_moving_label(ctx, child, label, &fresh_lower, split);
        Ok(fresh_lower.id())
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
}
