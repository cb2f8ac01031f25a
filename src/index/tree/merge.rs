//! Merge: a node left with one child and the same tenants is joined with it (after an entry's
//! removal), so churn never leaves chains of short one-child nodes behind.

use super::{LabelSource, TreeWriter, WriteCtx};
use crate::index::keys::Keying;

/// Where two labels a merge joins lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelLayout {
    /// The lower label continues the upper one in the same buffer: the merge copies nothing.
    SideBySide,
    /// Anywhere else: the merge copies both.
    Apart,
}

/// Units on both edges above which a one-child node and its child stay unmerged (unless their
/// labels adjoin in one buffer): a merge copies both labels, tens of KB for long text prompts,
/// to save one node of about 200 bytes (slot, metadata, entries, table), which is at most about
/// 3 bytes per unit at this length. Shorter chains merge, so splits at small offsets never
/// pile up nodes.
const MERGE_UNITS_MIN: u64 = 64;

impl<K: Keying> TreeWriter<K> {
    /// Merges `node` with its only child when both have the same tenants (nothing would tell
    /// them apart), so churn never leaves chains of short one-child nodes behind. Two long
    /// edges (`MERGE_UNITS_MIN`) stay apart unless their labels lie side by side in one buffer:
    /// their merge would copy both labels to save one node.
    pub(super) fn try_merge(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
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
}
