//! [`Router`]: one per data core, the routing pipeline of the spec in three calls, in the order
//! a request meets them. Nothing here does I/O or awaits; the request driver (`http::proxy`)
//! calls them around its own phases (connect, forward, stream back).
//!
//! 1. [`Router::prepare`], once per request: extract the routing input (model, token IDs or
//!    text, partition namespace) from the body and headers ("How the Prefix Index Works"); for a
//!    chat, completions or messages request whose model has a tokenizer, tokenize its prompt
//!    through this core's cache (`tokenize`), the IDs becoming the key; hash token IDs into
//!    pages, and (cache_aware) look the key up in the index mode ([`IndexLookup`]), merging
//!    this core's recent dispatches on a miss; token IDs of a model whose workers publish KV
//!    events are looked up in the KV-event index instead ([`Blocks`]). The result is a
//!    [`Prepared`] value the caller keeps for the request's lifetime. The data core calls
//!    [`Router::prepare_or_defer`], which hands back cold tokenization too long for the core as
//!    a `ColdWork` to run on the tokenizer pool before [`Router::finish_prepare`].
//! 2. [`Router::select`], once per attempt: steps 1-6 of the decision flow. It reads each
//!    worker's published state into a [`WorkerStatus`] (eligibility, in-flight count, load
//!    report, dispatch credits; a worker this request already tried is not eligible) and runs
//!    the configured policy: `cache_aware::select` for cache_aware, `simple` for the others.
//!    cache_aware decisions are counted in [`PolicyMetrics`] and logged as `Cache-aware
//!    selection` under SMG's target, so `RUST_LOG=info,smg::policies::cache_aware=debug` works
//!    unchanged.
//! 3. [`Router::record`], once the worker has the request: step 7, the [`RecordKey`] the control
//!    core inserts, also remembered in this core's recent-dispatch map for bursts.

use std::sync::Arc;

use fastrand::Rng;

use super::cache_aware::RequestSize;
use super::lookup::{Blocks, IndexLookup};
use super::placements::Placements;
use super::prepared::IndexKey;
use super::prepared::{prompt_tokens, Lookup, Prepared};
use super::recent::RecentDispatches;
use super::record::{model_hash, KeyData, MeshShare, RecordKey};
use super::{
    cache_aware, simple, Affinity, Branch, CacheIndexKind, Decision, PolicyConfig, PolicyKind,
    PolicyMetrics, TokenizerFigures, WorkerLoad, WorkerRing, WorkerStatus,
};
use crate::ids::WorkerId;
use crate::index::hash::{request_heads, HeadMatch};
use crate::index::{count_chars, Namespace, TreeMatch};
use crate::limits::MODELS_MAX;
use crate::request::{extract, Endpoint, KeySource, RequestError, RoutingHeaders, RoutingKey};
use crate::tokenize::{
    self, Begun, CacheConfig, ColdDone, ColdWork, PromptSource, TokenCache, TokenizeError,
    TokenizerSet,
};
use crate::workers::catalog::ModelWorkers;
use crate::workers::retry::TriedWorkers;
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
    config: PolicyConfig,
    rng: Rng,
    round_robin_cursor: usize,
    metrics: Arc<PolicyMetrics>,
    /// The index mode this core reads (cache_aware; `None` for the other policies, or when the
    /// index could not start: cache_aware then routes every request as a miss).
    index: Option<Box<dyn IndexLookup>>,
    /// The KV-event index (cache_aware in tree mode), for models whose workers publish events.
    events: Option<Blocks>,
    recent: RecentDispatches,
    /// Decayed prompt tokens of the new prefixes this core placed per worker (cache misses).
    placements: Placements,
    /// Worker statuses of the current selection, indexed by `WorkerId` (reused).
    statuses: Vec<WorkerStatus>,
    ring: WorkerRing,
    ring_members: Vec<(WorkerId, String)>,
    /// Models whose name this core already sent the control core.
    announced_models: Vec<u64>,
    /// The models' tokenizers and this core's tokenization cache (`None`: no model has one).
    tokenizing: Option<Tokenizing>,
}

/// A data core's tokenization state: the models' tokenizers (shared, read-only) and this
/// core's cache, which no other thread touches.
#[derive(Debug)]
struct Tokenizing {
    set: Arc<TokenizerSet>,
    cache: TokenCache,
    inline_max_bytes: usize,
    failures: u64,
}

impl Tokenizing {
    /// A request that stays on its text: logged at debug, counted.
    fn failed(&mut self, error: &TokenizeError) {
        self.failures += 1;
        tracing::debug!("request not tokenized, routing on its text: {error}");
    }

    /// Publishes this core's cache figures for `/metrics`.
    fn publish(&self, metrics: &PolicyMetrics) {
        let stats = self.cache.stats();
        metrics.set_tokenizer(TokenizerFigures {
            l0_hits: stats.l0_hits,
            l0_misses: stats.l0_misses,
            l1_hits: stats.l1_hits,
            l1_misses: stats.l1_misses,
            l0_entries: self.cache.l0_entries() as u64,
            l1_bytes: self.cache.l1_bytes() as u64,
            failures: self.failures,
        });
    }
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
            metrics,
            index,
            events: None,
            recent: RecentDispatches::default(),
            placements: Placements::default(),
            statuses: Vec::new(),
            ring: WorkerRing::default(),
            ring_members: Vec::new(),
            announced_models: Vec::new(),
            tokenizing: None,
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
    /// through a cache bounded by `cache`; cold work over `inline_max_bytes` is handed back by
    /// [`Router::prepare_or_defer`].
    pub fn with_tokenizers(
        mut self,
        tokenizers: Arc<TokenizerSet>,
        cache: CacheConfig,
        inline_max_bytes: usize,
    ) -> Router {
        self.tokenizing = (!tokenizers.is_empty()).then(|| Tokenizing {
            set: tokenizers,
            cache: TokenCache::new(cache),
            inline_max_bytes,
            failures: 0,
        });
        self
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Whether the policy reads the prefix index (and the index learns from its dispatches).
    fn uses_index(&self) -> bool {
        self.config.kind == PolicyKind::CacheAware
    }

    /// Prepares a request (see the module documentation): `now_ms` is the gateway tick. A body
    /// that is not a JSON object is a [`RequestError`] (400). Cold tokenization, however long,
    /// runs here, on the caller's thread (tests, benchmarks); the data core uses
    /// [`Router::prepare_or_defer`] instead.
    pub fn prepare(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        headers: RoutingHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), RequestError> {
        let cold = self.prepare_or_defer(prepared, endpoint, headers, body, now_ms)?;
        if let Some(work) = cold {
            self.finish_prepare(prepared, Some(work.run()));
        }
        Ok(())
    }

    /// [`Router::prepare`], except that cold tokenization longer than the data core may spend
    /// (`--tokenizer-inline-max-bytes`) comes back as a [`ColdWork`]: the caller runs it off
    /// the core and then calls [`Router::finish_prepare`] (the request is not prepared until
    /// then). `None`: the request is prepared.
    pub fn prepare_or_defer(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        headers: RoutingHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<Option<ColdWork>, RequestError> {
        // Tree mode records text keys: the string tree keeps a large body's text as built.
        let records_text = self.uses_index() && self.config.cache_index == CacheIndexKind::Tree;
        prepared.input.build_text_for_index(records_text);
        extract(endpoint, body, headers, &mut prepared.input)?;
        prepared.now_ms = now_ms;
        prepared.decision_counted.set(false);
        prepared.kv_pressure_pick.set(None);
        prepared.namespace = Namespace {
            model: model_hash(prepared.input.model()),
            partition: prepared.input.namespace().0,
        };
        prepared.lookup = None;
        prepared.heads.clear();
        if let Some(work) = self.tokenize(prepared, endpoint, body) {
            if work.cold_bytes() > self.tokenizing.as_ref().map_or(0, |t| t.inline_max_bytes) {
                self.metrics.count_tokenize_offloaded();
                return Ok(Some(work));
            }
            self.finish_prepare(prepared, Some(work.run()));
            return Ok(None);
        }
        self.look_up(prepared);
        Ok(None)
    }

    /// Completes a request [`Router::prepare_or_defer`] deferred, with its cold work done
    /// (`None`: the work could not run, the request routes on its text).
    pub fn finish_prepare(&mut self, prepared: &mut Prepared, done: Option<ColdDone>) {
        if let (Some(tokenizing), Some(done)) = (&mut self.tokenizing, done) {
            let finished = tokenize::finish(
                done,
                &mut tokenizing.cache,
                prepared.input.tokenizer_output(),
            );
            match finished {
                Ok(()) => prepared.input.set_tokenized(),
                Err(e) => tokenizing.failed(&e),
            }
            tokenizing.publish(&self.metrics);
        } else {
            self.metrics.count_tokenize_refused();
        }
        self.look_up(prepared);
    }

    /// Tokenizes the prompt of a chat, completions or messages request whose model has a
    /// tokenizer, through this core's cache, when the policy reads token IDs (cache_aware,
    /// prefix_hash); its IDs become the routing key. Returns the cold work left, if any.
    /// Anything that fails leaves the request on its text.
    fn tokenize(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Option<ColdWork> {
        let tokenizing = self.tokenizing.as_mut()?;
        let reads_tokens = matches!(
            self.config.kind,
            PolicyKind::CacheAware | PolicyKind::PrefixHash
        );
        if !reads_tokens || prepared.input.key_source() != Some(KeySource::Text) {
            return None;
        }
        let source = match endpoint {
            Endpoint::ChatCompletions => PromptSource::Chat(body),
            Endpoint::Messages => PromptSource::Messages(body),
            Endpoint::Completions if !prepared.input.text().is_empty() => {
                PromptSource::Completion(prepared.input.text())
            }
            _ => return None,
        };
        let model = tokenizing.set.for_model(prepared.input.model())?.clone();
        let prompt = match model.prompt(source) {
            Ok(prompt) => prompt,
            Err(e) => {
                tokenizing.failed(&e);
                tokenizing.publish(&self.metrics);
                return None;
            }
        };
        let begun = tokenize::begin(
            &model,
            prompt,
            &mut tokenizing.cache,
            prepared.input.tokenizer_output(),
        );
        match begun {
            Begun::Done => {
                prepared.input.set_tokenized();
                tokenizing.publish(&self.metrics);
                None
            }
            Begun::Cold(work) => Some(work),
        }
    }

    /// Hashes token IDs into pages and (cache_aware) looks the key up in the index mode.
    fn look_up(&mut self, prepared: &mut Prepared) {
        let routing_key = prepared.input.key();
        if !self.uses_index() || routing_key.is_empty() {
            return;
        }
        if let RoutingKey::Tokens(tokens) = routing_key {
            let events = self.events.as_ref();
            if let Some(reported) = events.and_then(|e| e.publishing(prepared.namespace.model)) {
                // Blocks of the size the model's engines reported, `--block-size` until then.
                let configured = self.config.cache_aware.block_size as usize;
                let block_size = reported.unwrap_or(configured);
                prepared.pages.hash(tokens, block_size);
                let (pages, chain) = (prepared.pages.pages(), &mut prepared.chain);
                let mut lookup = events.map(|e| e.lookup(pages, block_size, chain));
                // Only a miss can be a burst of a prefix the engines have not reported yet.
                if let Some(Lookup::Blocks(blocks)) = &mut lookup {
                    if blocks.holders().is_empty() {
                        let (namespace, now_ms) = (prepared.namespace, prepared.now_ms);
                        self.recent
                            .merge_blocks_into(blocks, namespace, &prepared.pages, now_ms);
                    }
                }
                prepared.lookup = lookup;
                return;
            }
            // The index's block size: both come from `--block-size`.
            let block_size = self.config.cache_aware.block_size as usize;
            prepared.pages.hash(tokens, block_size);
        }
        let lookup = match self.config.cache_index {
            CacheIndexKind::Tree => self.look_up_tree(prepared),
            CacheIndexKind::Hash => self.look_up_heads(prepared),
        };
        prepared.lookup = Some(lookup);
        if let Some(index) = &mut self.index {
            index.quiesce();
        }
    }

    /// Tree mode: the string or token tree's match, and on a miss this core's recent dispatches.
    fn look_up_tree(&self, prepared: &Prepared) -> Lookup {
        let (namespace, key, now_ms) = (prepared.namespace, prepared.index_key(), prepared.now_ms);
        let mut lookup = match &self.index {
            Some(index) => index.lookup(namespace, key, now_ms),
            None => Lookup::Tree {
                matched: TreeMatch {
                    request_len: request_len(prepared.input.key()),
                    ..TreeMatch::default()
                },
                hint: Default::default(),
            },
        };
        // Only a miss can be a burst of a new prefix the index has not learned yet.
        if let Lookup::Tree { matched, .. } = &mut lookup {
            if matched.ratio() <= self.config.cache_aware.cache_threshold {
                self.recent.merge_into(matched, namespace, key, now_ms);
            }
        }
        lookup
    }

    /// Hash mode: the heads of the request's token IDs at each boundary they reach and their
    /// live holders (text requests and requests shorter than the smallest boundary have none),
    /// and when no head has a holder, this core's recent dispatches.
    fn look_up_heads(&self, prepared: &mut Prepared) -> Lookup {
        let RoutingKey::Tokens(tokens) = prepared.input.key() else {
            return Lookup::Heads(HeadMatch::default());
        };
        let boundaries = &self.config.cache_boundaries;
        request_heads(
            prepared.namespace,
            tokens,
            &prepared.pages,
            boundaries,
            &mut prepared.heads,
        );
        if prepared.heads.is_empty() {
            return Lookup::Short;
        }
        let (namespace, key, now_ms) = (prepared.namespace, prepared.index_key(), prepared.now_ms);
        let mut lookup = match &self.index {
            Some(index) => index.lookup(namespace, key, now_ms),
            None => Lookup::Heads(HeadMatch::of(&prepared.heads)),
        };
        // Only heads nobody holds can be a burst of a new prefix the index has not learned yet.
        if let Lookup::Heads(heads) = &mut lookup {
            if !heads.has_holder() {
                self.recent.merge_heads_into(heads, namespace, now_ms);
            }
        }
        lookup
    }

    /// Steps 1-6: picks a worker for `prepared` from the published `workers`, never one in
    /// `tried`; `None` when no worker is eligible (the gateway answers 503). The caller credits
    /// the chosen worker with [`Prepared::request_tokens`].
    pub fn select(
        &mut self,
        prepared: &Prepared,
        workers: WorkerView<'_>,
        tried: &TriedWorkers,
    ) -> Option<WorkerId> {
        let (roster, table, models) = (workers.roster, workers.table, workers.models);
        let mean_prefill_tokens = self.config.scorer().mean_prefill_tokens;
        let active = roster.workers.iter().map(|w| (w.id, w.spec.url.as_str()));
        let status_of = |id: WorkerId| {
            let signals = table.signals(id);
            // Generation before report: a report published in between is read with the older
            // generation's credits, an overestimate that lasts one request.
            let generation = signals.load_generation();
            WorkerStatus {
                eligible: table.is_eligible(id) && models.allows(id) && !tried.contains(id),
                in_flight: table.inflight(id),
                load: (signals.peek_load().as_deref())
                    .map(|report| WorkerLoad::from_report(report, mean_prefill_tokens)),
                credited_tokens: table.queued_tokens(id, generation),
                resident_tokens: table.resident_tokens(id, generation),
                drained_tokens: table.drained_tokens(id, generation),
                // This core's own count, filled in by `choose` for cache misses.
                placed_tokens: 0.0,
            }
        };
        self.choose(prepared, active, status_of)
    }

    /// Steps 1-6 over any worker set: `workers` gives `(id, url)` of every active worker and
    /// `status_of` each one's status, read once per decision. [`Router::select`] calls it with
    /// the published table; tests and benchmarks call it with statuses of their own.
    pub fn choose<'w>(
        &mut self,
        prepared: &Prepared,
        workers: impl Iterator<Item = (WorkerId, &'w str)> + Clone,
        mut status_of: impl FnMut(WorkerId) -> WorkerStatus,
    ) -> Option<WorkerId> {
        self.refresh_ring(workers.clone());
        // Only a cache miss reads the placed tokens (one `exp2` per worker to decay them).
        let miss = self.is_miss(prepared);
        self.statuses.clear();
        for (id, _) in workers {
            let mut status = status_of(id);
            if miss {
                status.placed_tokens = self.placements.of(id, prepared.now_ms);
            }
            let slot = id.index();
            if self.statuses.len() <= slot {
                self.statuses.resize(slot + 1, WorkerStatus::default());
            }
            self.statuses[slot] = status;
        }
        let decision = match self.config.kind {
            PolicyKind::CacheAware => self.decide_cache_aware(prepared)?,
            _ => return self.decide_simple(prepared),
        };
        if matches!(
            decision.branch,
            Branch::ExpectedWaitFallback | Branch::EventFallback
        ) {
            let tokens = prepared.request_tokens();
            self.placements
                .add(decision.worker, prepared.now_ms, tokens);
        }
        Some(decision.worker)
    }

    /// Whether the prepared request is a cache miss: a tree match at or below
    /// `--cache-threshold`, or heads nobody holds.
    fn is_miss(&self, prepared: &Prepared) -> bool {
        match &prepared.lookup {
            Some(Lookup::Tree { matched, .. }) => {
                matched.ratio() <= self.config.cache_aware.cache_threshold
            }
            Some(Lookup::Heads(heads)) => !heads.has_holder(),
            Some(Lookup::Blocks(blocks)) => blocks.holders().is_empty(),
            Some(Lookup::Short) | None => false,
        }
    }

    /// cache_aware: the decision flow, logged; tree-mode decisions are counted too (the branch
    /// counter and the match-ratio histogram cover the trees only, as SMG's do).
    fn decide_cache_aware(&mut self, prepared: &Prepared) -> Option<Decision> {
        let config = &self.config.cache_aware;
        let key = prepared.input.key();
        let affinity = match &prepared.lookup {
            None => Affinity::None,
            Some(Lookup::Tree { matched, .. }) => Affinity::Tree(matched),
            Some(Lookup::Heads(heads)) => Affinity::Heads(heads),
            Some(Lookup::Short) => Affinity::Short,
            Some(Lookup::Blocks(blocks)) => Affinity::Blocks(blocks),
        };
        let size = RequestSize {
            prompt_tokens: prompt_tokens(key),
            output_tokens: prepared.input.max_output_tokens(),
        };
        let decision = cache_aware::select(affinity, &self.statuses, config, size, &mut self.rng)?;
        let pressed = decision.branch == Branch::KvPressure;
        prepared
            .kv_pressure_pick
            .set(pressed.then_some(decision.worker));
        let (worker, model_id) = (self.ring.url(decision.worker), prepared.input.model());
        if let Some(Lookup::Blocks(blocks)) = &prepared.lookup {
            // KV-event decisions are logged, not counted (the branch counter covers the trees).
            let held = blocks.holders().iter().find(|(w, _)| *w == decision.worker);
            let blocks_held = held.map_or(0, |(_, n)| *n);
            let request_blocks = blocks.request_blocks;
            if decision.branch == Branch::EventFallback {
                tracing::debug!(
                    target: LOG_TARGET,
                    worker,
                    model_id,
                    request_blocks,
                    "Event-driven routing: no overlap, expected-wait fallback"
                );
            } else {
                tracing::debug!(
                    target: LOG_TARGET,
                    branch = decision.branch.label(),
                    worker,
                    model_id,
                    blocks_held,
                    request_blocks,
                    "Event-driven routing: overlap match"
                );
            }
            return Some(decision);
        }
        match self.config.cache_index {
            // SMG logs the KV-pressure fallback without an index.
            CacheIndexKind::Tree if decision.branch == Branch::KvPressure => tracing::debug!(
                target: LOG_TARGET,
                branch = decision.branch.label(),
                worker,
                model_id,
                "Cache-aware selection"
            ),
            CacheIndexKind::Tree => {
                // Once per request: a retry's decision is not counted again.
                if !prepared.decision_counted.replace(true) {
                    self.metrics.record(&decision);
                }
                tracing::debug!(
                    target: LOG_TARGET,
                    index = "tree",
                    branch = decision.branch.label(),
                    worker,
                    model_id,
                    matched_ratio = decision.match_ratio,
                    threshold = config.cache_threshold,
                    "Cache-aware selection"
                );
            }
            CacheIndexKind::Hash => tracing::debug!(
                target: LOG_TARGET,
                index = "hash",
                branch = decision.branch.label(),
                level = decision.head_tokens,
                worker,
                model_id,
                "Cache-aware selection"
            ),
        }
        Some(decision)
    }

    /// The policies other than cache_aware.
    fn decide_simple(&mut self, prepared: &Prepared) -> Option<WorkerId> {
        let (workers, rng, input) = (&self.statuses, &mut self.rng, &prepared.input);
        match self.config.kind {
            PolicyKind::Random => simple::random(workers, rng),
            PolicyKind::RoundRobin => simple::round_robin(workers, &mut self.round_robin_cursor),
            PolicyKind::PowerOfTwo => simple::power_of_two(workers, rng),
            // cache_aware decides in `decide_cache_aware`; its scorer is least_load's.
            PolicyKind::LeastLoad | PolicyKind::CacheAware => {
                simple::least_load(workers, &self.config.scorer(), rng)
            }
            PolicyKind::PrefixHash => {
                let key = simple::prefix_hash_key(
                    input.key(),
                    input.namespace(),
                    self.config.prefix_token_count,
                    &self.config.cache_boundaries,
                );
                let balance = simple::PrefixHashBalance {
                    load_factor: self.config.prefix_hash_load_factor,
                    abs_threshold: self.config.prefix_hash_balance_abs_threshold,
                };
                simple::prefix_hash(key, &self.ring, workers, balance, rng)
            }
            PolicyKind::ConsistentHashing => {
                let (target, key) = (input.target_worker(), input.routing_key_hash());
                simple::consistent_hashing(target, key, &self.ring, workers, rng)
            }
        }
    }

    /// Step 7: the record the control core inserts for `worker`, which now has the request
    /// (cache_aware with a non-empty key only: other policies do not build the index). It is
    /// remembered in this core's recent-dispatch map too, for bursts the index has not learned.
    pub fn record(
        &mut self,
        prepared: &Prepared,
        worker: WorkerId,
        tick_ms: u64,
    ) -> Option<RecordKey> {
        let hint = match prepared.lookup.as_ref()? {
            Lookup::Tree { hint, .. } => *hint,
            Lookup::Heads(heads) if heads.len > 0 => Default::default(),
            // No token IDs, or fewer than the smallest boundary: nothing to record.
            Lookup::Heads(_) | Lookup::Short => return None,
            // Step 7: only engine events change the KV-event index; this core remembers the
            // dispatch for the burst that may follow before the engine reports its blocks.
            Lookup::Blocks(_) => {
                let key = KeyData::of(IndexKey::Tokens(&prepared.pages));
                self.recent.push(prepared.namespace, key, worker, tick_ms);
                return None;
            }
        };
        let namespace = prepared.namespace;
        let model = namespace.model;
        let model_name = if self.announced_models.contains(&model)
            || self.announced_models.len() >= MODELS_MAX
        {
            None
        } else {
            self.announced_models.push(model);
            Some(Box::from(prepared.input.model()))
        };
        // Step 2's KV-pressure picks are inserted here but not broadcast to the mesh.
        let mesh = if prepared.kv_pressure_pick.get() == Some(worker) {
            MeshShare::Local
        } else {
            MeshShare::Broadcast
        };
        let record = RecordKey {
            namespace,
            key: prepared.record_key(),
            model_name,
            hint,
            mesh,
        };
        self.recent
            .push(namespace, record.key.clone(), worker, tick_ms);
        Some(record)
    }

    /// Marks this core quiescent for index reclamation (call when idle, e.g. once a second).
    pub fn quiesce(&mut self) {
        if let Some(index) = &mut self.index {
            index.quiesce();
        }
    }

    /// Rebuilds the hash ring when the worker set changed (compared by id and URL).
    fn refresh_ring<'w>(&mut self, workers: impl Iterator<Item = (WorkerId, &'w str)> + Clone) {
        let same = workers.clone().count() == self.ring_members.len()
            && workers
                .clone()
                .zip(&self.ring_members)
                .all(|((id, url), (old_id, old_url))| id == *old_id && url == old_url);
        if same {
            return;
        }
        // A slot whose URL changed (or that left) is another worker now, holding none of ours.
        for (id, url) in &self.ring_members {
            if !workers
                .clone()
                .any(|(now_id, now_url)| now_id == *id && now_url == url)
            {
                self.placements.forget(*id);
            }
        }
        self.ring_members = workers
            .clone()
            .map(|(id, url)| (id, url.to_owned()))
            .collect();
        self.ring = WorkerRing::new(workers);
    }
}

/// The tree a routing key is looked up in, as the decision log names it.
/// A key's length in its tree's units: characters, or tokens.
fn request_len(key: RoutingKey<'_>) -> u32 {
    let len = match key {
        RoutingKey::Text(text) => count_chars(text.as_bytes()),
        RoutingKey::Tokens(tokens) => tokens.len() as u64,
    };
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicyArgs;

    /// `body` for `endpoint`, prepared by `router` at `now_ms` (no routing headers).
    pub(super) fn prepare(
        router: &mut Router,
        endpoint: Endpoint,
        body: &[u8],
        now_ms: u64,
    ) -> Prepared {
        let mut prepared = Prepared::default();
        let headers = RoutingHeaders::default();
        router
            .prepare(&mut prepared, endpoint, headers, body, now_ms)
            .expect("a JSON object");
        prepared
    }

    /// Prepares `body` at `now_ms` and routes it over idle workers named by `urls`.
    pub(super) fn prepare_and_route_idle(
        router: &mut Router,
        urls: &[&str],
        (endpoint, body): (Endpoint, &str),
        now_ms: u64,
    ) -> (WorkerId, Prepared) {
        let prepared = prepare(router, endpoint, body.as_bytes(), now_ms);
        let workers = urls
            .iter()
            .enumerate()
            .map(|(slot, url)| (WorkerId(slot as u16), *url));
        let status_of = |_| WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        let worker = router.choose(&prepared, workers, status_of).unwrap();
        (worker, prepared)
    }

    fn router() -> (Router, Arc<PolicyMetrics>) {
        let config = PolicyArgs::default().validate().unwrap();
        let metrics = Arc::new(PolicyMetrics::default());
        (Router::new(config, 5, None, metrics.clone()), metrics)
    }

    /// Prepares a completion of `prompt` and routes it over idle workers named by `urls`.
    fn route_idle(router: &mut Router, urls: &[&str], prompt: &str) -> WorkerId {
        let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
        prepare_and_route_idle(router, urls, (Endpoint::Completions, &body), 10).0
    }

    #[test]
    fn a_kv_pressure_pick_is_recorded_but_not_broadcast_to_the_mesh() {
        let args = PolicyArgs {
            overload_token_usage_threshold: Some(0.9),
            ..PolicyArgs::default()
        };
        let config = args.validate().unwrap();
        let mut router = Router::new(config, 5, None, Arc::new(PolicyMetrics::default()));
        let urls = ["http://w0", "http://w1"];
        let body = br#"{"model":"m","prompt":"a prompt long enough to be a key"}"#;
        for (hottest, share) in [(0.95, MeshShare::Local), (0.5, MeshShare::Broadcast)] {
            let prepared = prepare(&mut router, Endpoint::Completions, body, 10);
            let workers = urls
                .iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), *url));
            let status_of = |id: WorkerId| WorkerStatus {
                eligible: true,
                load: Some(crate::policy::WorkerLoad {
                    token_usage: if id.index() == 0 { hottest } else { 0.1 },
                    gen_throughput: 1000.0,
                    ..Default::default()
                }),
                ..WorkerStatus::default()
            };
            let worker = router.choose(&prepared, workers, status_of).unwrap();
            let record = router.record(&prepared, worker, 10).unwrap();
            assert_eq!(record.mesh, share, "hottest worker at {hottest}");
        }
    }

    #[test]
    fn a_large_bodys_record_keeps_its_text_as_extracted_and_a_small_ones_copies_it() {
        let (mut router, _) = router();
        let urls = ["http://w0", "http://w1"];
        let line = "a line of a long document, with a newline escape\\n";
        let large = line.repeat(crate::request::SHARED_TEXT_BODY_BYTES_MIN / line.len() + 1);
        for (prompt, shared) in [(large.as_str(), true), ("a short prompt\\n", false)] {
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
            let prepared = prepare(&mut router, Endpoint::ChatCompletions, body.as_bytes(), 10);
            let expected = prompt.replace("\\n", "\n");
            assert_eq!(prepared.input.text(), expected);
            assert_eq!(prepared.input.shared_text().is_some(), shared);
            let workers = urls
                .iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), *url));
            let idle = |_| WorkerStatus {
                eligible: true,
                ..WorkerStatus::default()
            };
            let worker = router.choose(&prepared, workers, idle).unwrap();
            let record = router.record(&prepared, worker, 10).unwrap();
            let KeyData::Text(key) = &record.key else {
                panic!("a text key, got {:?}", record.key);
            };
            assert_eq!(&**key, expected);
            // One copy of the text: the record holds the very buffer extraction built.
            let same_buffer = std::ptr::eq(key.as_ptr(), prepared.input.text().as_ptr());
            assert_eq!(same_buffer, shared, "{} bytes", body.len());
        }
    }

    #[test]
    fn a_burst_of_a_new_prefix_follows_the_first_dispatch_before_the_index_learns_it() {
        let (mut router, metrics) = router();
        let urls: Vec<String> = (0..4).map(|i| format!("http://w{i}")).collect();
        let mut in_flight = [0u32; 4];
        let mut chosen = Vec::new();
        for i in 0..10 {
            let body =
                format!(r#"{{"model":"m","prompt":"a long shared system prompt, then user {i}"}}"#);
            let prepared = prepare(&mut router, Endpoint::Completions, body.as_bytes(), 10);
            let workers = urls
                .iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), url.as_str()));
            let status_of = |id: WorkerId| WorkerStatus {
                eligible: true,
                in_flight: in_flight[id.index()],
                ..WorkerStatus::default()
            };
            let worker = router.choose(&prepared, workers, status_of).unwrap();
            in_flight[worker.index()] += 1;
            let record = router.record(&prepared, worker, 10).unwrap();
            assert_eq!(record.namespace.model, model_hash("m"));
            assert_eq!(
                record.model_name.is_some(),
                i == 0,
                "the model name is sent once"
            );
            chosen.push(worker);
        }
        assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 1);
        assert_eq!(metrics.branch_count(Branch::TreeMatch), 9);
    }

    #[test]
    fn new_prefixes_spread_by_how_much_each_worker_was_given() {
        // Idle workers, no load reports, no in-flight feedback: only this core's placed tokens
        // tell them apart, so 16 unrelated prompts of one length land two on each of 8 workers.
        let (mut router, metrics) = router();
        let urls: Vec<String> = (0..8).map(|i| format!("http://w{i}")).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let mut counts = [0u32; 8];
        for i in 0..16u8 {
            let prompt = char::from(b'a' + i).to_string().repeat(40);
            counts[route_idle(&mut router, &urls, &prompt).index()] += 1;
        }
        assert_eq!(counts, [2; 8]);
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 16);
    }

    #[test]
    fn a_long_new_prompt_weighs_more_than_several_short_ones() {
        let (mut router, _) = router();
        let urls = ["http://a", "http://b"];
        // 100 tokens (4 characters each) on one worker, then three prompts of 10 tokens: all
        // three go to the other worker, still given fewer tokens after two of them.
        let long = route_idle(&mut router, &urls, &"a".repeat(400));
        let short: Vec<WorkerId> = ["b", "c", "d"]
            .iter()
            .map(|letter| route_idle(&mut router, &urls, &letter.repeat(40)))
            .collect();
        assert!(short.iter().all(|w| *w != long), "{long:?} {short:?}");
    }

    #[test]
    fn other_policies_send_no_index_records() {
        let args = PolicyArgs {
            policy: crate::policy::PolicyKind::RoundRobin,
            ..PolicyArgs::default()
        };
        let mut router = Router::new(args.validate().unwrap(), 1, None, Arc::default());
        let prepared = prepare(&mut router, Endpoint::Completions, br#"{"prompt":"p"}"#, 0);
        let status_of = |_| WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        let only = std::iter::once((WorkerId(0), "http://w0"));
        let worker = router.choose(&prepared, only, status_of);
        assert_eq!(worker, Some(WorkerId(0)));
        assert_eq!(router.record(&prepared, WorkerId(0), 0), None);
        // Nor do they build a large body's text for the index: it stays in the reused buffer.
        let prompt = "p".repeat(crate::request::SHARED_TEXT_BODY_BYTES_MIN);
        let body = format!(r#"{{"prompt":"{prompt}"}}"#);
        let prepared = prepare(&mut router, Endpoint::Completions, body.as_bytes(), 0);
        assert_eq!(prepared.input.text(), prompt);
        assert!(prepared.input.shared_text().is_none());
    }
}

#[cfg(test)]
mod tokenize_tests {
    //! The router's side of tokenization (the tokenizer is `tokenize::tests`' word-level one):
    //! which requests are tokenized, deferral of cold work, and what a refused one routes on.
    use super::tests::prepare;
    use super::*;
    use crate::policy::PolicyArgs;
    use crate::tokenize::tests::model;

    fn tokenizing_router(
        kind: PolicyKind,
        inline_max_bytes: usize,
    ) -> (Router, Arc<PolicyMetrics>) {
        let args = PolicyArgs {
            policy: kind,
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let set = Arc::new(TokenizerSet::new(vec![(Some("m".into()), model(false))]));
        let cache = CacheConfig {
            l0_entries_max: 0,
            l1_bytes_max: 1 << 20,
        };
        let router = Router::new(args.validate().unwrap(), 1, None, metrics.clone())
            .with_tokenizers(set, cache, inline_max_bytes);
        (router, metrics)
    }

    const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#;

    #[test]
    fn requests_of_a_model_with_a_tokenizer_route_on_its_ids_others_on_text() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::CacheAware, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key_source(), Some(KeySource::Tokenized));
        assert_eq!(
            chat.input.key(),
            RoutingKey::Tokens(&[100, 4, 1, 2, 101, 100, 5])
        );
        let completion = br#"{"model":"m","prompt":"hello"}"#;
        let completion = prepare(&mut router, Endpoint::Completions, completion, 0);
        // Completions get the post-processor's token (102) in front, as engines encode them.
        assert_eq!(completion.input.key(), RoutingKey::Tokens(&[102, 1]));
        let other = br#"{"model":"other","messages":[{"role":"user","content":"hello"}]}"#;
        let other = prepare(&mut router, Endpoint::ChatCompletions, other, 0);
        assert_eq!(other.input.key(), RoutingKey::Text("hello"));
        // A body the template cannot read routes on its text, counted.
        let bad = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"continue_final_message":true}"#;
        let bad = prepare(&mut router, Endpoint::ChatCompletions, bad, 0);
        assert_eq!(bad.input.key(), RoutingKey::Text("hi"));
        assert_eq!(metrics.tokenizer().failures, 1);
        assert!(metrics.tokenizer().l1_misses > 0);
    }

    #[test]
    fn cold_work_past_the_inline_bound_is_deferred_and_a_refused_one_routes_on_text() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::CacheAware, 4);
        let headers = RoutingHeaders::default();
        let mut prepared = Prepared::default();
        let cold = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                CHAT.as_bytes(),
                0,
            )
            .unwrap()
            .expect("cold work over 4 bytes is deferred");
        assert!(prepared.lookup.is_none(), "not prepared until finished");
        router.finish_prepare(&mut prepared, Some(cold.run()));
        assert_eq!(prepared.input.key_source(), Some(KeySource::Tokenized));
        assert!(prepared.lookup.is_some());
        // The same prompt again: all cached, nothing deferred.
        let again = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                CHAT.as_bytes(),
                0,
            )
            .unwrap();
        assert!(again.is_none());
        // A new prompt whose work the pool refused: the text, counted.
        let new = r#"{"model":"m","messages":[{"role":"user","content":"brief hi"}]}"#;
        let cold = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                new.as_bytes(),
                0,
            )
            .unwrap();
        assert!(cold.is_some());
        router.finish_prepare(&mut prepared, None);
        assert_eq!(prepared.input.key(), RoutingKey::Text("brief hi"));
        assert_eq!(metrics.tokenize_offloads(), (2, 1));
    }

    #[test]
    fn policies_that_read_no_token_ids_do_not_tokenize() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::RoundRobin, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key(), RoutingKey::Text("hello world"));
        assert_eq!(metrics.tokenizer().l1_misses, 0);
        let (mut router, _) = tokenizing_router(PolicyKind::PrefixHash, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key_source(), Some(KeySource::Tokenized));
    }
}

#[cfg(test)]
mod index_tests {
    use super::tests::{prepare, prepare_and_route_idle};
    use super::*;
    use crate::index::{IndexConfig, IndexWriter};
    use crate::policy::{PolicyArgs, Trees};

    /// Dispatch records applied to a real index make the next request of the family match.
    #[test]
    fn records_inserted_into_the_index_make_the_family_match() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let reader = writer.reader().unwrap();
        let config = PolicyArgs::default().validate().unwrap();
        let metrics = Arc::new(PolicyMetrics::default());
        let trees: Box<dyn IndexLookup> = Box::new(Trees::new(reader));
        let mut router = Router::new(config, 3, Some(trees), metrics.clone());
        let system: Vec<String> = (0..2048).map(|i| format!("w{i}x")).collect();
        let system = system.join(" ");
        let urls = ["http://a", "http://b", "http://c"];
        let mut chosen = Vec::new();
        for (i, now_ms) in [(0, 0u64), (1, 1_000), (2, 2_000), (3, 3_000)] {
            let body = serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question number {i}")}
                ]
            })
            .to_string();
            let request = (Endpoint::ChatCompletions, body.as_str());
            let (worker, prepared) = prepare_and_route_idle(&mut router, &urls, request, now_ms);
            let record = router.record(&prepared, worker, now_ms).unwrap();
            let ns = record.namespace;
            match &record.key {
                KeyData::Text(text) => writer
                    .insert_text_hinted(ns, text, worker, now_ms, &record.hint)
                    .unwrap(),
                KeyData::Tokens(tokens) => writer
                    .insert_tokens_shared(ns, tokens, worker, now_ms, &record.hint)
                    .unwrap(),
                KeyData::Heads(_) => panic!("tree mode records no heads"),
            }
            chosen.push(worker);
        }
        // Seconds apart: the recent-dispatch map has expired, only the index can match.
        assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
        assert_eq!(metrics.branch_count(Branch::TreeMatch), 3);
    }

    /// `--load-aware-affinity`: a request its holder is too busy for goes to another worker,
    /// and once that dispatch is recorded the prefix has two holders.
    #[test]
    fn a_replicated_prefix_has_two_holders() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let reader = writer.reader().unwrap();
        let args = PolicyArgs {
            load_aware_affinity: true,
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let trees: Box<dyn IndexLookup> = Box::new(Trees::new(reader));
        let mut router = Router::new(args.validate().unwrap(), 3, Some(trees), metrics.clone());
        let prompt = |i: u32| {
            let words: Vec<String> = (0..2048).map(|w| format!("w{w}x")).collect();
            let body =
                serde_json::json!({"model": "m", "prompt": format!("{} q{i}", words.join(" "))});
            body.to_string()
        };
        let urls = ["http://a", "http://b", "http://c"];
        let workers = || {
            urls.iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), *url))
        };
        // Seconds apart, so only the index (not the recent-dispatch map) matches.
        let mut route = |i: u32, in_flight: [u32; 3]| {
            let now_ms = u64::from(i) * 10_000;
            let prepared = prepare(
                &mut router,
                Endpoint::Completions,
                prompt(i).as_bytes(),
                now_ms,
            );
            let status_of = |id: WorkerId| WorkerStatus {
                eligible: true,
                in_flight: in_flight[id.index()],
                ..WorkerStatus::default()
            };
            let worker = router.choose(&prepared, workers(), status_of).unwrap();
            let record = router.record(&prepared, worker, now_ms).unwrap();
            let KeyData::Text(text) = &record.key else {
                panic!("a text prompt records text")
            };
            writer
                .insert_text_hinted(record.namespace, text, worker, now_ms, &record.hint)
                .unwrap();
            (worker, prepared)
        };
        let (first, _) = route(0, [0; 3]);
        let (same, _) = route(1, [0; 3]);
        assert_eq!(same, first, "an idle holder keeps its prefix");
        let mut busy = [0; 3];
        busy[first.index()] = 40;
        let (replica, _) = route(2, busy);
        assert_ne!(replica, first);
        assert_eq!(metrics.branch_count(Branch::Replicate), 1);
        let (_, prepared) = route(3, [0; 3]);
        let Some(Lookup::Tree { matched, .. }) = &prepared.lookup else {
            panic!("tree mode looks the prompt up")
        };
        let mut holders = matched.tenants().to_vec();
        holders.sort();
        let mut expected = vec![first, replica];
        expected.sort();
        assert_eq!(holders, expected);
    }
}

#[cfg(test)]
mod table_tests {
    //! Selection over the published worker table (`Router::select`): what a data core reads.
    use super::*;
    use crate::policy::PolicyArgs;
    use crate::workers::load::LoadReport;
    use crate::workers::spec::WorkerSpec;
    use crate::workers::table::Health;

    fn router(kind: PolicyKind, seed: u64) -> Router {
        let args = PolicyArgs {
            policy: kind,
            ..PolicyArgs::default()
        };
        let config = args.validate().unwrap();
        Router::new(config, seed, None, Arc::new(PolicyMetrics::default()))
    }

    fn table(cores: usize, n: usize, base_port: usize) -> WorkerTable {
        let specs: Vec<_> = (0..n)
            .map(|i| WorkerSpec::resolve(&format!("http://127.0.0.1:{}", base_port + i)).unwrap())
            .collect();
        WorkerTable::new(cores, &specs)
    }

    /// Prepares a `/generate` request with `body` and selects a worker not in `tried`.
    fn pick(
        router: &mut Router,
        table: &WorkerTable,
        tried: &TriedWorkers,
        body: &[u8],
    ) -> (Option<WorkerId>, Prepared) {
        let prepared = super::tests::prepare(router, Endpoint::Generate, body, 0);
        let roster = table.roster();
        let view = WorkerView {
            roster: &roster,
            table,
            models: ModelWorkers::Any,
        };
        (router.select(&prepared, view, tried), prepared)
    }

    #[test]
    fn round_robin_cycles_and_skips_unhealthy() {
        let table = table(1, 3, 41000);
        let mut router = router(PolicyKind::RoundRobin, 0);
        let none = TriedWorkers::default();
        let mut picks = || pick(&mut router, &table, &none, b"{}").0.unwrap().0;
        let first: Vec<u16> = (0..6).map(|_| picks()).collect();
        assert_eq!(first, [0, 1, 2, 0, 1, 2]);
        table.set_health(WorkerId(1), Health::Unhealthy);
        let picks: Vec<u16> = (0..4)
            .map(|_| pick(&mut router, &table, &none, b"{}").0.unwrap().0)
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn tried_workers_are_excluded_until_none_is_left() {
        let table = table(1, 2, 41100);
        let mut router = router(PolicyKind::Random, 7);
        let mut tried = TriedWorkers::default();
        let first = pick(&mut router, &table, &tried, b"{}").0.unwrap();
        tried.insert(first);
        let second = pick(&mut router, &table, &tried, b"{}").0.unwrap();
        assert_ne!(first, second);
        tried.insert(second);
        assert_eq!(pick(&mut router, &table, &tried, b"{}").0, None);
        let empty = WorkerTable::new(1, &[]);
        let none = TriedWorkers::default();
        assert_eq!(pick(&mut router, &empty, &none, b"{}").0, None);
    }

    #[test]
    fn the_requested_model_restricts_the_workers() {
        let table = table(1, 3, 41200);
        let mut router = router(PolicyKind::Random, 3);
        let prepared = super::tests::prepare(&mut router, Endpoint::Generate, b"{}", 0);
        let roster = table.roster();
        let serving = [WorkerId(2)];
        let view = WorkerView {
            roster: &roster,
            table: &table,
            models: ModelWorkers::Only {
                serving: &serving,
                wildcard: &[],
            },
        };
        for _ in 0..20 {
            let tried = TriedWorkers::default();
            assert_eq!(router.select(&prepared, view, &tried), Some(WorkerId(2)));
        }
    }

    #[test]
    fn a_dispatch_on_one_core_is_credited_to_the_decisions_of_the_others() {
        let table = table(2, 2, 42000);
        for id in [WorkerId(0), WorkerId(1)] {
            let report = LoadReport {
                gen_throughput_tps: Some(1000.0),
                ..LoadReport::default()
            };
            table
                .signals(id)
                .set_load(Some(report), &Default::default());
        }
        let ids: Vec<String> = (0..4096).map(|i| i.to_string()).collect();
        let body = format!(r#"{{"input_ids":[{}]}}"#, ids.join(","));
        let none = TriedWorkers::default();
        for seed in 0..16 {
            let (mut core0, mut core1) = (
                router(PolicyKind::LeastLoad, seed),
                router(PolicyKind::LeastLoad, seed + 100),
            );
            let (first, prepared) = pick(&mut core0, &table, &none, body.as_bytes());
            let first = first.unwrap();
            assert_eq!(prepared.request_tokens(), 4096);
            let in_flight = table.credit(0, first, prepared.request_tokens());
            // Core 1 never sent anything, yet sees core 0's 4,096 tokens in flight.
            let second = pick(&mut core1, &table, &none, body.as_bytes()).0.unwrap();
            assert_ne!(first, second, "seed {seed}");
            drop(in_flight);
        }
    }
}

#[cfg(test)]
mod hash_tests {
    //! `--cache-index hash` through the router: heads looked up deepest first, holders through
    //! the spill gate, records applied by the placement map's writer.
    use super::*;
    use crate::index::hash::HashIndexWriter;
    use crate::policy::{Heads, PolicyArgs};

    const URLS: [&str; 4] = ["http://a", "http://b", "http://c", "http://d"];

    fn hash_router(writer: &HashIndexWriter) -> (Router, Arc<PolicyMetrics>) {
        let args = PolicyArgs {
            cache_index: CacheIndexKind::Hash,
            cache_boundaries: vec![64, 128, 256],
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let index: Box<dyn IndexLookup> = Box::new(Heads::new(writer.reader()));
        let config = args.validate().expect("a valid hash mode");
        (
            Router::new(config, 11, Some(index), metrics.clone()),
            metrics,
        )
    }

    fn ids_body(tokens: usize, salt: &str) -> String {
        let ids: Vec<u32> = (0..tokens as u32).map(|i| i * 3 + 1).collect();
        serde_json::json!({"input_ids": ids, "extra_key": salt}).to_string()
    }

    /// Prepares `body` at `now_ms` and chooses among workers with the given in-flight counts
    /// (`u32::MAX`: not eligible).
    fn route(
        router: &mut Router,
        body: &str,
        in_flight: [u32; 4],
        now_ms: u64,
    ) -> (WorkerId, Prepared) {
        let prepared = super::tests::prepare(router, Endpoint::Generate, body.as_bytes(), now_ms);
        let workers = URLS
            .iter()
            .enumerate()
            .map(|(i, url)| (WorkerId(i as u16), *url));
        let status_of = |id: WorkerId| WorkerStatus {
            eligible: in_flight[id.index()] != u32::MAX,
            in_flight: in_flight[id.index()].min(1_000),
            ..WorkerStatus::default()
        };
        let worker = router
            .choose(&prepared, workers, status_of)
            .expect("a worker");
        (worker, prepared)
    }

    /// Applies the record of a dispatch of `prepared` to `worker`, as the control core does.
    fn record(
        router: &mut Router,
        writer: &mut HashIndexWriter,
        prepared: &Prepared,
        worker: WorkerId,
        tick: u64,
    ) {
        let record = router.record(prepared, worker, tick).expect("a record");
        let KeyData::Heads(heads) = &record.key else {
            panic!("hash mode records heads, got {:?}", record.key);
        };
        writer
            .record(record.namespace.model, heads, worker, tick)
            .expect("recorded");
    }

    #[test]
    fn a_short_first_turn_and_its_longer_follow_up_land_on_the_same_worker() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, metrics) = hash_router(&writer);
        let idle = [0; 4];
        let (first, prepared) = route(&mut router, &ids_body(100, ""), idle, 0);
        record(&mut router, &mut writer, &prepared, first, 0);
        // A second later (the recent map has expired): only the index can match. The follow-up
        // shares the first turn's 64-token head, and reaches two deeper boundaries.
        let (second, prepared) = route(&mut router, &ids_body(300, ""), idle, 1_000);
        assert_eq!(second, first);
        record(&mut router, &mut writer, &prepared, second, 1_000);
        let found = writer.reader().lookup(&prepared.heads, 1_000);
        assert!(
            found.hits().iter().all(|hit| hit.holders() == [first]),
            "every head recorded"
        );
        assert_eq!(
            metrics.branch_count(Branch::TreeMatch),
            0,
            "hash decisions are not counted"
        );
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 0);
    }

    #[test]
    fn the_deepest_head_with_an_eligible_holder_wins_and_its_holders_pass_the_spill_gate() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (_, shallow) = route(&mut router, &ids_body(100, ""), [0; 4], 0);
        record(&mut router, &mut writer, &shallow, WorkerId(1), 0);
        let (_, deep) = route(&mut router, &ids_body(300, ""), [0; 4], 0);
        record(&mut router, &mut writer, &deep, WorkerId(2), 0);
        let later = 1_000;
        // The 256-token head is held by worker 2 only; the 64-token head by 1 and 2.
        assert_eq!(
            route(&mut router, &ids_body(300, ""), [0; 4], later).0,
            WorkerId(2)
        );
        // Worker 2 not eligible: no deeper head has an eligible holder, the 64-token one has 1.
        let not_two = [0, 0, u32::MAX, 0];
        assert_eq!(
            route(&mut router, &ids_body(300, ""), not_two, later).0,
            WorkerId(1)
        );
        // Worker 2 hot (over both margins of the fleet mean): a spill to the least loaded.
        let hot = [10, 10, 400, 0];
        assert_eq!(
            route(&mut router, &ids_body(300, ""), hot, later).0,
            WorkerId(3)
        );
    }

    #[test]
    fn short_and_untokenized_requests_are_neither_matched_nor_recorded() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (worker, short) = route(&mut router, &ids_body(63, ""), [0; 4], 0);
        assert_eq!(short.lookup, Some(Lookup::Short));
        assert_eq!(router.record(&short, worker, 0), None);
        let text = serde_json::json!({"text": "a long prompt ".repeat(50)}).to_string();
        let (worker, untokenized) = route(&mut router, &text, [0; 4], 0);
        assert!(matches!(untokenized.lookup, Some(Lookup::Heads(h)) if h.len == 0));
        assert_eq!(router.record(&untokenized, worker, 0), None);
        assert_eq!(writer.live_heads(), 0);
        // A recorded head does not make a short request match.
        let (first, long) = route(&mut router, &ids_body(64, ""), [0; 4], 0);
        record(&mut router, &mut writer, &long, first, 0);
        assert_eq!(
            route(&mut router, &ids_body(63, ""), [0; 4], 0).1.lookup,
            Some(Lookup::Short)
        );
    }

    #[test]
    fn partitions_never_match_across_namespaces() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (first, prepared) = route(&mut router, &ids_body(128, "tenant-a"), [0; 4], 0);
        record(&mut router, &mut writer, &prepared, first, 0);
        let (_, same) = route(&mut router, &ids_body(128, "tenant-a"), [0; 4], 1_000);
        let (_, other) = route(&mut router, &ids_body(128, "tenant-b"), [0; 4], 1_000);
        let has_holder =
            |p: &Prepared| matches!(p.lookup, Some(Lookup::Heads(h)) if h.has_holder());
        assert!(has_holder(&same));
        assert!(
            !has_holder(&other),
            "another extra_key is another namespace"
        );
    }

    #[test]
    fn a_burst_of_a_new_head_follows_the_first_dispatch_before_the_index_learns_it() {
        let writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let mut in_flight = [0u32; 4];
        let mut chosen = Vec::new();
        for _ in 0..6 {
            let (worker, prepared) = route(&mut router, &ids_body(200, ""), in_flight, 10);
            router.record(&prepared, worker, 10).expect("a record");
            in_flight[worker.index()] += 1;
            chosen.push(worker);
        }
        assert!(chosen.iter().all(|w| *w == chosen[0]), "{chosen:?}");
    }
}
