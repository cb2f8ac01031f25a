//! The index on the control core, its only writer: it applies the data cores' dispatch records
//! (spec step 7), frees retired memory, evicts over-budget trees, purges removed workers, and
//! publishes the tree gauges.
//!
//! Owns [`IndexUpkeep`]. A record the index refuses (a capacity limit) is dropped and logged at
//! debug: routing stays correct, only that affinity is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::ids::WorkerId;
use crate::index::IndexWriter;
use crate::limits::TREE_OVER_BUDGET_FACTOR;
use crate::policy::{KeyData, PolicyConfig};
use crate::shared::{DispatchRecord, Shared};

/// The index writer and what the control core keeps beside it.
#[derive(Debug)]
pub struct IndexUpkeep {
    writer: IndexWriter,
    /// Model names by hash, learned from the records, for gauge labels.
    model_names: HashMap<u64, String>,
    next_eviction: Instant,
}

impl IndexUpkeep {
    /// Upkeep of the index `writer` writes, under the `policy` flags.
    pub fn new(writer: IndexWriter, policy: &PolicyConfig) -> Self {
        IndexUpkeep {
            writer,
            model_names: HashMap::new(),
            next_eviction: Instant::now() + policy.eviction_interval,
        }
    }

    /// The index insert: the tree learns the worker this request went to.
    pub fn apply_record(&mut self, record: DispatchRecord) {
        let key = record.key;
        if let Some(name) = key.model_name {
            self.model_names.insert(key.namespace.model, name.into());
        }
        let (ns, worker, tick) = (key.namespace, record.worker, record.tick);
        // The data core's lookup hint lets the insert skip the prefix it already matched; a new
        // leaf keeps a reference to the record's key buffer rather than a copy of it.
        let hint = &key.hint;
        let inserted = match &key.key {
            KeyData::Text(text) => self.writer.insert_text_shared(ns, text, worker, tick, hint),
            KeyData::Tokens(tokens) => self
                .writer
                .insert_tokens_shared(ns, tokens, worker, tick, hint),
        };
        if let Err(e) = inserted {
            tracing::debug!("dispatch record dropped by the index: {e}");
        }
    }

    /// Frees retired index memory (every turn); every `--eviction-interval`, or at once when a
    /// model's tree passes `TREE_OVER_BUDGET_FACTOR` times its budget, evicts over-budget trees
    /// and publishes the tree gauges.
    pub fn upkeep(&mut self, shared: &Shared) {
        self.writer.reclaim();
        let policy = &shared.config.policy;
        let hard_cap = policy.max_tree_size.saturating_mul(TREE_OVER_BUDGET_FACTOR);
        let over_hard_cap = self
            .writer
            .gauges()
            .iter()
            .any(|g| g.string.units > hard_cap || g.token.units > hard_cap);
        if Instant::now() < self.next_eviction && !over_hard_cap {
            return;
        }
        self.next_eviction = Instant::now() + policy.eviction_interval;
        let evicted = self.writer.evict(policy.max_tree_size);
        if evicted.entries > 0 {
            tracing::debug!(
                entries = evicted.entries,
                units = evicted.units,
                "index eviction"
            );
        }
        self.publish_gauges(shared);
    }

    /// Removes a purged worker from every tree, before its slot id can be reused.
    pub fn purge_worker(&mut self, id: WorkerId, shared: &Shared) {
        let removed = self.writer.remove_worker(id);
        tracing::debug!(
            worker = id.0,
            entries = removed,
            "worker purged from the index"
        );
        self.publish_gauges(shared);
    }

    /// Publishes the tree gauges, labelled by model name where a record told it.
    pub fn publish_gauges(&self, shared: &Shared) {
        let gauges = self.writer.gauges().into_iter().map(|g| {
            let name = self.model_names.get(&g.model).cloned();
            (name.unwrap_or_else(|| format!("{:016x}", g.model)), g)
        });
        shared.tree_gauges.store(Arc::new(gauges.collect()));
    }
}
