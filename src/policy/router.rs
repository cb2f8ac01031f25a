//! [`Router`]: one per data core, the routing pipeline of the spec in three calls, in the order
//! a request meets them. Nothing here does I/O or awaits; the request driver (`http::proxy`)
//! calls them around its own phases (connect, forward, stream back). This file holds the
//! router's state; each call lives in a file of its own:
//!
//! 1. [`Router::prepare`] (`preparation.rs`), once per request: extract the routing input (model,
//!    token IDs or text, partition namespace) from the body and headers ("How the Prefix Index
//!    Works"); for a chat, completions or messages request whose model has a tokenizer,
//!    tokenize its prompt through this core's cache (`tokenize`), the IDs becoming the key; hash
//!    token IDs into pages, and (cache_aware) look the key up in the index mode
//!    ([`IndexLookup`]), merging this core's recent dispatches on a miss; token IDs of a model
//!    whose workers publish KV events are looked up in the KV-event index instead ([`Blocks`]).
//!    The result is a [`Prepared`](super::Prepared) value the caller keeps for the request's
//!    lifetime. The data core calls [`Router::prepare_or_defer`], which hands back
//!    tokenization the core should not do itself (a long body to render, cold work to encode)
//!    as a `tokenize::Deferred` to run on the tokenizer pool before [`Router::finish_prepare`].
//! 2. [`Router::select`] (`decision.rs`), once per attempt: steps 1-6 of the decision flow. It
//!    reads each worker's published state into a [`WorkerStatus`] (eligibility, in-flight count,
//!    load report, dispatch credits; a worker this request already tried is not eligible) and
//!    runs the configured policy: `cache_aware::select` for cache_aware, `simple` for the
//!    others. cache_aware decisions are counted in [`PolicyMetrics`] and logged as `Cache-aware
//!    selection` under SMG's target, so `RUST_LOG=info,smg::policies::cache_aware=debug` works
//!    unchanged.
//! 3. [`Router::record`] (`record.rs`), once the worker has the request: step 7, the
//!    [`RecordKey`](super::RecordKey) the control core inserts, also remembered in this core's
//!    recent-dispatch map for bursts.
//!
//! The router's fields are `pub(super)` for those three files: visible within `policy` (whose
//! other modules are pure functions that do not touch them), never outside it.

use std::sync::Arc;

use fastrand::Rng;

use super::lookup::{Blocks, IndexLookup};
use super::placements::Placements;
use super::preparation::Tokenizing;
use super::recent::RecentDispatches;
use super::{CacheIndexKind, PolicyConfig, PolicyKind, PolicyMetrics, WorkerRing, WorkerStatus};
use crate::ids::WorkerId;
use crate::tokenize::{CacheConfig, TokenizerSet};
use crate::workers::catalog::ModelWorkers;
use crate::workers::role::PdSide;
use crate::workers::table::{Roster, WorkerTable};

/// The tracing target of decision logs (SMG's module path).
pub const LOG_TARGET: &str = "smg::policies::cache_aware";

/// The published worker state one selection reads.
#[derive(Debug, Clone, Copy)]
pub struct WorkerView<'a> {
    /// The active workers.
    pub roster: &'a Roster,
    /// Their health, signals, in-flight counts and credits.
    pub table: &'a WorkerTable,
    /// The workers that serve the request's model.
    pub models: ModelWorkers<'a>,
}

/// A data core's routing state: the policy, its RNG and counters, the index mode it reads, and
/// what it remembers of its own dispatches. One per core, never shared.
#[derive(Debug)]
pub struct Router {
    pub(super) config: PolicyConfig,
    pub(super) rng: Rng,
    pub(super) round_robin_cursor: usize,
    /// The side of a prefill/decode pair the current selection is for (`None`: regular mode),
    /// which its decision log names as `worker_type`.
    pub(super) side: Option<PdSide>,
    pub(super) metrics: Arc<PolicyMetrics>,
    /// The index mode this core reads (cache_aware; `None` for the other policies, or when the
    /// index could not start: cache_aware then routes every request as a miss).
    pub(super) index: Option<Box<dyn IndexLookup>>,
    /// The KV-event index (cache_aware in tree mode), for models whose workers publish events.
    pub(super) events: Option<Blocks>,
    /// This core's recent dispatches: written by `record`, read by `prepare` on a miss.
    pub(super) recent: RecentDispatches,
    /// Decayed prompt tokens of the new prefixes this core placed per worker (cache misses).
    pub(super) placements: Placements,
    /// Worker statuses of the current selection, indexed by `WorkerId` (reused).
    pub(super) statuses: Vec<WorkerStatus>,
    pub(super) ring: WorkerRing,
    pub(super) ring_members: Vec<(WorkerId, String)>,
    /// `--bounded-load-margin`: what this core subtracts from each slot's published dispatched
    /// count, indexed by `WorkerId` (`None`: a worker new in its slot, offset at its first
    /// decision so that it starts at the others' mean). Zero for the workers of the first
    /// roster, so every core reads the same counts for them.
    pub(super) dispatched_offsets: Vec<Option<i64>>,
    /// Models whose name this core already sent the control core.
    pub(super) announced_models: Vec<u64>,
    /// The models' tokenizers and this core's tokenization cache (`None`: no model has one).
    pub(super) tokenizing: Option<Tokenizing>,
    /// Text requests are also matched against the text pages peers shared (`--enable-mesh`,
    /// `peer_text.rs`).
    pub(super) peer_text_pages: bool,
}

impl Router {
    /// A router for one core. `seed` makes its random choices reproducible; `index` is the mode
    /// it looks requests up in; `metrics` are this core's decision counters.
    pub fn new(
        config: PolicyConfig,
        seed: u64,
        index: Option<Box<dyn IndexLookup>>,
        metrics: Arc<PolicyMetrics>,
    ) -> Router {
        Router {
            config,
            rng: Rng::with_seed(seed),
            round_robin_cursor: 0,
            side: None,
            metrics,
            index,
            events: None,
            recent: RecentDispatches::default(),
            placements: Placements::default(),
            statuses: Vec::new(),
            ring: WorkerRing::default(),
            ring_members: Vec::new(),
            dispatched_offsets: Vec::new(),
            announced_models: Vec::new(),
            tokenizing: None,
            peer_text_pages: false,
        }
    }

    /// Routes token IDs of models whose workers publish KV events on the KV-event index
    /// (cache_aware in tree mode; the spec's hash mode does not use it).
    pub fn with_events(mut self, events: Blocks) -> Router {
        let tree_mode = self.config.cache_index == CacheIndexKind::Tree;
        if self.uses_index() && tree_mode {
            self.events = Some(events);
        }
        self
    }

    /// Tokenizes chat, completions and messages requests of the models in `tokenizers`
    /// through a cache bounded by `cache`; cold work over `inline_max_bytes`, and a body past
    /// `TOKENIZE_RENDER_INLINE_BYTES` to render, are handed back by
    /// [`Router::prepare_or_defer`].
    pub fn with_tokenizers(
        mut self,
        tokenizers: Arc<TokenizerSet>,
        cache: CacheConfig,
        inline_max_bytes: usize,
    ) -> Router {
        self.tokenizing =
            (!tokenizers.is_empty()).then(|| Tokenizing::new(tokenizers, cache, inline_max_bytes));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Whether the policy reads the prefix index (and the index learns from its dispatches).
    pub(super) fn uses_index(&self) -> bool {
        self.config.kind == PolicyKind::CacheAware
    }

    /// Marks this core quiescent for index reclamation (call when idle, e.g. once a second).
    pub fn quiesce(&mut self) {
        if let Some(index) = &mut self.index {
            index.quiesce();
        }
    }
}

#[cfg(test)]
pub(super) mod tests;
