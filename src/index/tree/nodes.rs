//! Node lifecycle in the writer: a slab slot taken (`alloc_node`) and initialized with its
//! label, stamp and metadata (`init_node`), its label buffer counted once however many nodes
//! share it, its published tenant list kept in step (`publish_mru`, `refresh_mru`), and the
//! node retired for reclamation (`retire_node`).

use super::{LabelSource, Meta, TreeWriter, WriteCtx};
use crate::ids::WorkerId;
use crate::index::keys::Keying;
use crate::index::raw::{FreshNode, MRU_LEN, NODES_MAX};
use crate::index::IndexError;

impl<K: Keying> TreeWriter<K> {
    pub(super) fn alloc_node<'a>(
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

    pub(super) fn init_node(
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

    /// Returns a node id taken by `alloc_node` but never initialized or published.
    pub(super) fn free_unused(&mut self, id: u32) {
        self.free_ids.push(id);
        self.nodes_live -= 1;
    }

    pub(super) fn retire_node(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32) {
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

    pub(super) fn publish_mru(&self, ctx: &WriteCtx<'_, K::E>, node: u32) {
        let guard = ctx.token.guard();
        if let Some(shared) = ctx.tree.slab.get(node, &guard) {
            shared.set_tenants(self.meta[node as usize].mru(), ctx.token);
        }
    }

    /// Recomputes `node`'s published tenants after `worker` left it.
    pub(super) fn refresh_mru(&mut self, ctx: &WriteCtx<'_, K::E>, node: u32, worker: WorkerId) {
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
}
