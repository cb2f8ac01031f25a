//! Purge: `TreeWriter::remove_worker` removes every entry of a worker that left (by its
//! recency list), each as eviction removes one (`remove_entry`), in one batch.

use super::{TreeWriter, WriteCtx};
use crate::ids::WorkerId;
use crate::index::entries::NIL;
use crate::index::keys::Keying;

impl<K: Keying> TreeWriter<K> {
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
}
