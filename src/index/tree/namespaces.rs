//! Namespaces: each (model, partition) has a root; models have budget slots. The namespace
//! table readers probe is rebuilt off to the side when half full and published whole.

use super::{
    ns_hash, IdMap, LabelSource, Meta, ModelState, TreeWriter, WriteCtx, NAMESPACES_MAX,
    NS_CAPACITY_MIN,
};
use crate::index::entries::List;
use crate::index::keys::Keying;
use crate::index::raw::NsTable;
use crate::index::{IndexError, Namespace};
use crate::limits::MODELS_MAX;

impl<K: Keying> TreeWriter<K> {
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

    pub(super) fn root_for(
        &mut self,
        ctx: &WriteCtx<'_, K::E>,
        ns: Namespace,
    ) -> Result<u32, IndexError> {
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

    pub(super) fn remove_namespace(&mut self, ctx: &WriteCtx<'_, K::E>, root: u32) {
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
}
