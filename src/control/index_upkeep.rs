//! The index on the control core, its only writer: it applies the data cores' dispatch records
//! (spec step 7), keeps the index within its bounds, purges removed workers, and publishes the
//! gauges. One writer per index mode ([`IndexWriters`]): the radix trees (`--cache-index tree`:
//! reclaim every turn, evict over-budget trees every `--eviction-interval`) or the hash index
//! (`--cache-index hash`: sweep expired holders every `--eviction-interval`).
//!
//! Owns [`IndexUpkeep`]. A record the index refuses (a capacity limit) is dropped: the trees log
//! it at debug, the hash index counts it (`kvgate_cache_placement_heads_refused_total`). Routing
//! stays correct, only that affinity is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::ids::WorkerId;
use crate::index::hash::HashIndexWriter;
use crate::index::{IndexWriter, LookupHint, Namespace};
use crate::limits::TREE_OVER_BUDGET_FACTOR;
use crate::metrics::Counter;
use crate::policy::{KeyData, PolicyConfig};
use crate::shared::{DispatchRecord, Shared};

/// The writer of the configured index mode.
#[derive(Debug)]
pub enum IndexWriters {
    /// The string and token trees (boxed: the writer's bookkeeping is large, the map's handle
    /// small).
    Trees(Box<IndexWriter>),
    /// The hash index's placement map.
    Heads(HashIndexWriter),
}

/// The index writer and what the control core keeps beside it.
#[derive(Debug)]
pub struct IndexUpkeep {
    writer: IndexWriters,
    /// Model names by hash, learned from the records, for gauge labels.
    model_names: HashMap<u64, String>,
    next_eviction: Instant,
}

impl IndexUpkeep {
    /// Upkeep of the index `writer` writes, under the `policy` flags.
    pub fn new(writer: IndexWriters, policy: &PolicyConfig) -> Self {
        IndexUpkeep {
            writer,
            model_names: HashMap::new(),
            next_eviction: Instant::now() + policy.eviction_interval,
        }
    }

    /// The index insert: the index learns the worker this request went to.
    pub fn apply_record(&mut self, record: DispatchRecord, shared: &Shared) {
        let key = record.key;
        if let Some(name) = key.model_name {
            self.model_names.insert(key.namespace.model, name.into());
        }
        let (ns, worker, tick) = (key.namespace, record.worker, record.tick);
        // The data core's lookup hint lets the insert skip the prefix it already matched; a new
        // leaf keeps a reference to the record's key buffer rather than a copy of it.
        let hint = &key.hint;
        let inserted = match (&mut self.writer, &key.key) {
            (IndexWriters::Trees(trees), KeyData::Text(text)) => {
                trees.insert_text_shared(ns, text, worker, tick, hint)
            }
            (IndexWriters::Trees(trees), KeyData::Tokens(tokens)) => {
                trees.insert_tokens_shared(ns, tokens, worker, tick, hint)
            }
            (IndexWriters::Heads(map), KeyData::Heads(heads)) => {
                if map.record(ns.model, heads, worker, tick).is_err() {
                    let counters = shared.metrics.control();
                    counters.incr(Counter::PlacementHeadsRefused);
                }
                Ok(())
            }
            // A key of another mode's form: the data cores build keys for this mode only.
            (IndexWriters::Trees(_), KeyData::Heads(_))
            | (IndexWriters::Heads(_), KeyData::Text(_) | KeyData::Tokens(_)) => Ok(()),
        };
        if let Err(e) = inserted {
            tracing::debug!("dispatch record dropped by the index: {e}");
        }
    }

    /// A peer's insert (the mesh): the trees learn that `worker` holds `key`. Never broadcast
    /// again, and never into the hash index (which the mesh does not share).
    pub fn apply_remote(
        &mut self,
        namespace: Namespace,
        key: &KeyData,
        worker: WorkerId,
        tick: u64,
    ) -> bool {
        let IndexWriters::Trees(trees) = &mut self.writer else {
            return false;
        };
        let hint = LookupHint::default();
        let inserted = match key {
            KeyData::Text(text) => trees.insert_text_shared(namespace, text, worker, tick, &hint),
            KeyData::Tokens(tokens) => {
                trees.insert_tokens_shared(namespace, tokens, worker, tick, &hint)
            }
            KeyData::Heads(_) => return false,
        };
        match inserted {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("peer insert dropped by the index: {e}");
                false
            }
        }
    }

    /// Every turn, the trees free retired memory; every `--eviction-interval`, or at once when a
    /// model's tree passes `TREE_OVER_BUDGET_FACTOR` times its budget, the trees evict what is
    /// over budget and the hash index sweeps expired holders, and the gauges are published.
    pub fn upkeep(&mut self, shared: &Shared) {
        let policy = &shared.config.policy;
        let over_hard_cap = match &mut self.writer {
            IndexWriters::Trees(trees) => {
                trees.reclaim();
                let hard_cap = policy.max_tree_size.saturating_mul(TREE_OVER_BUDGET_FACTOR);
                trees
                    .gauges()
                    .iter()
                    .any(|g| g.string.units > hard_cap || g.token.units > hard_cap)
            }
            IndexWriters::Heads(_) => false,
        };
        if Instant::now() < self.next_eviction && !over_hard_cap {
            return;
        }
        self.next_eviction = Instant::now() + policy.eviction_interval;
        match &mut self.writer {
            IndexWriters::Trees(trees) => {
                let evicted = trees.evict(policy.max_tree_size);
                if evicted.entries > 0 {
                    tracing::debug!(
                        entries = evicted.entries,
                        units = evicted.units,
                        "index eviction"
                    );
                }
            }
            IndexWriters::Heads(map) => {
                let swept = map.sweep(shared.tick_now());
                if swept.holders_dropped > 0 {
                    tracing::debug!(
                        holders = swept.holders_dropped,
                        heads = swept.heads_removed,
                        "hash index sweep"
                    );
                }
            }
        }
        self.publish_gauges(shared);
    }

    /// Removes a purged worker from the index, before its slot id can be reused.
    pub fn purge_worker(&mut self, id: WorkerId, shared: &Shared) {
        let removed = match &mut self.writer {
            IndexWriters::Trees(trees) => trees.remove_worker(id),
            IndexWriters::Heads(map) => map.remove_worker(id),
        };
        tracing::debug!(
            worker = id.0,
            entries = removed,
            "worker purged from the index"
        );
        self.publish_gauges(shared);
    }

    /// Publishes the mode's gauges, labelled by model name where a record told it.
    pub fn publish_gauges(&self, shared: &Shared) {
        let name = |model: u64| {
            let known = self.model_names.get(&model).cloned();
            known.unwrap_or_else(|| format!("{model:016x}"))
        };
        match &self.writer {
            IndexWriters::Trees(trees) => {
                let gauges = trees.gauges().into_iter().map(|g| (name(g.model), g));
                shared.tree_gauges.store(Arc::new(gauges.collect()));
            }
            IndexWriters::Heads(map) => {
                let gauges = map.gauges().into_iter().map(|(m, heads)| (name(m), heads));
                shared.placement_gauges.store(Arc::new(gauges.collect()));
            }
        }
    }
}
