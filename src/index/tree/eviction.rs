//! Eviction: least-recently-used entries of every model over its budget are removed
//! (`TreeWriter::evict`), each through `remove_entry`, which also removes or merges the node it
//! leaves and reports what went for checkers (`Evicted`). The worker purge (`purge.rs`)
//! removes entries the same way.

use super::{TreeWriter, WriteCtx};
use crate::ids::WorkerId;
use crate::index::entries::{Chain, Entry, NIL};
use crate::index::keys::Keying;
use crate::index::Evicted;

impl<K: Keying> TreeWriter<K> {
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

    /// Removes entry `id` (a leaf for its worker), then removes or merges what it leaves.
    pub(super) fn remove_entry(
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
    pub(super) fn drop_entry(&mut self, id: u32) {
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
