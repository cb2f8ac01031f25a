//! Child tables: a child appended in place when its parent's table has room, else the table
//! rebuilt and republished (copy-on-write); a child swapped for a node spelling the same edge;
//! and batches, which collect an eviction or purge pass's table changes per node and publish
//! each once when the pass ends.

use super::{TreeWriter, WriteCtx};
use crate::index::keys::Keying;
use crate::index::raw::ChildEntry;

impl<K: Keying> TreeWriter<K> {
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
    pub(super) fn first_child(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> Option<ChildEntry> {
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
    pub(super) fn children_len(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> usize {
        if let Some(pending) = self.batch.as_ref().and_then(|batch| batch.get(&node)) {
            return pending.len();
        }
        let guard = ctx.token.guard();
        let shared = ctx.tree.slab.get(node, &guard);
        shared.map_or(0, |shared| shared.children(&guard).len())
    }

    /// Whether `node` currently has no children (pending or published).
    pub(super) fn is_leaf(&self, ctx: &WriteCtx<'_, K::E>, node: u32) -> bool {
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
    pub(super) fn begin_batch(&mut self) {
        if self.batch.is_none() {
            self.batch = Some(std::mem::take(&mut self.spare_batch));
        }
    }

    pub(super) fn end_batch(&mut self, ctx: &WriteCtx<'_, K::E>) {
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        for (node, entries) in batch.drain() {
            self.publish_children_now(ctx, node, &entries);
        }
        self.spare_batch = batch;
    }

    /// Publishes `node`'s pending table now (before a merge hands its table over).
    pub(super) fn flush_pending(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        if let Some(entries) = self.batch.as_mut().and_then(|batch| batch.remove(&node)) {
            self.publish_children_now(ctx, node, &entries);
        }
    }

    /// Adds a child: appended in place into the published table's spare capacity when it has
    /// room, else the table is rebuilt (sorted, with new spare capacity) and republished.
    pub(super) fn add_child(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        parent: u32,
        key: u64,
        child: u32,
    ) {
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
    pub(super) fn replace_child(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        parent: u32,
        old: u32,
        new: u32,
    ) {
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

    pub(super) fn remove_child(&mut self, ctx: &WriteCtx<'_, K::E>, parent: u32, child: u32) {
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
}
