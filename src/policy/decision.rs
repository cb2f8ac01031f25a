//! The router's second call, once per attempt ([`Router::select`], or [`Router::choose`] over
//! statuses of the caller's own): steps 1-6 of the decision flow. The published worker table
//! becomes one [`WorkerStatus`] per worker, the configured policy decides
//! (`cache_aware::select`, or one of `simple`'s), and a cache_aware decision is logged under
//! SMG's target ([`LOG_TARGET`]) and, in tree mode, counted once per request.

use super::cache_aware::RequestSize;
use super::metrics::PredictionBasis;
use super::prepared::{prompt_tokens, Lookup, Prepared};
use super::router::LOG_TARGET;
use super::simple::HashBranch;
use super::{
    cache_aware, simple, Affinity, Branch, CacheIndexKind, Decision, PolicyKind, Router,
    WorkerLoad, WorkerRing, WorkerStatus, WorkerView,
};
use crate::ids::WorkerId;
use crate::index::kv::{BlockMatch, Provenance};
use crate::workers::retry::TriedWorkers;
use crate::workers::role::PdSide;

impl Router {
    /// Steps 1-6: picks a worker for `prepared` from the published `workers`, never one in
    /// `tried`; `None` when no worker is eligible (the gateway answers 503). The caller credits
    /// the chosen worker with [`Prepared::request_tokens`].
    pub fn select(
        &mut self,
        prepared: &Prepared,
        workers: WorkerView<'_>,
        tried: &TriedWorkers,
    ) -> Option<WorkerId> {
        self.select_serving(prepared, workers, tried, None)
    }

    /// [`Router::select`] among the workers of one side of a prefill/decode pair (`side`;
    /// `None`: every worker): a decode worker is never a candidate for prefill, nor the
    /// reverse, and the other side's workers take no part in the fleet's means.
    pub fn select_serving(
        &mut self,
        prepared: &Prepared,
        workers: WorkerView<'_>,
        tried: &TriedWorkers,
        side: Option<PdSide>,
    ) -> Option<WorkerId> {
        let (roster, table, models) = (workers.roster, workers.table, workers.models);
        let mean_prefill_tokens = self.config.scorer().mean_prefill_tokens;
        let bounded = self.config.cache_aware.bounded_load_margin.is_some();
        let active = (roster.workers.iter())
            .filter(move |w| side.is_none_or(|side| w.spec.role.serves(side)))
            .map(|w| (w.id, w.spec.url.as_str()));
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
                // Offset by `choose`.
                dispatched: if bounded { table.dispatched(id) } else { 0 },
            }
        };
        self.side = side;
        let picked = self.choose(prepared, active, status_of);
        self.side = None;
        picked
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
        if self.config.cache_aware.bounded_load_margin.is_some() {
            self.offset_dispatched_counts();
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
            // A decode worker is never recorded (the prefill worker holds the prefix).
            if self.side != Some(PdSide::Decode) {
                self.remember_miss(prepared, decision.worker);
            }
        }
        Some(decision.worker)
    }

    /// `--bounded-load-margin`: turns the published dispatched counts in `statuses` into counts
    /// since this core first saw each worker in its slot. A worker new in its slot (joined, or
    /// replaced another) is offset to start at the mean of the others it serves beside, so it
    /// neither inherits its slot's history nor draws every request until it has caught up.
    fn offset_dispatched_counts(&mut self) {
        let members = self.ring_members.iter().map(|(id, _)| id.index());
        let since = |raw: u64, offset: i64| u64::try_from(raw as i64 - offset).unwrap_or(0);
        let (mut sum, mut known) = (0u64, 0u64);
        for slot in members.clone() {
            let (offset, status) = (self.dispatched_offsets[slot], &mut self.statuses[slot]);
            if let Some(offset) = offset {
                status.dispatched = since(status.dispatched, offset);
                if status.eligible {
                    sum = sum.saturating_add(status.dispatched);
                    known += 1;
                }
            }
        }
        let mean = sum.checked_div(known).unwrap_or(0);
        for slot in members {
            if self.dispatched_offsets[slot].is_none() {
                let status = &mut self.statuses[slot];
                self.dispatched_offsets[slot] = Some(status.dispatched as i64 - mean as i64);
                status.dispatched = mean;
            }
        }
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
        match &prepared.lookup {
            // KV-event decisions are logged, not counted (the branch counter covers the trees).
            Some(Lookup::Blocks(blocks)) => {
                // Once per request: a retry's decision is not counted again.
                if !prepared.decision_counted.replace(true) {
                    self.count_kv_prediction(blocks, &decision);
                }
                self.decide_cache_aware_log_blocks(prepared.input.model(), blocks, &decision)
            }
            _ => self.decide_cache_aware_count_and_log(prepared, &decision),
        }
        Some(decision)
    }

    /// `decide_cache_aware`'s count of a KV-event decision that rests on a predicted prefix:
    /// confirmed by the engine, or provisional (in flight to it).
    fn count_kv_prediction(&self, blocks: &BlockMatch, decision: &Decision) {
        let basis = match blocks.held_by(decision.worker) {
            (0, _) => return,
            (_, Provenance::Engine) => PredictionBasis::Confirmed,
            (_, Provenance::InFlight) => PredictionBasis::Provisional,
        };
        self.metrics.count_kv_prediction(basis);
    }

    /// `decide_cache_aware`'s log of a KV-event decision.
    fn decide_cache_aware_log_blocks(
        &self,
        model_id: &str,
        blocks: &BlockMatch,
        decision: &Decision,
    ) {
        let worker = self.ring.url(decision.worker);
        let held = blocks.holders().iter().find(|(w, _)| *w == decision.worker);
        let blocks_held = held.map_or(0, |(_, n)| *n);
        let request_blocks = blocks.request_blocks;
        if decision.branch == Branch::EventFallback {
            tracing::debug!(
                target: LOG_TARGET,
                worker_type = self.side.map(PdSide::name),
                worker,
                model_id,
                request_blocks,
                "Event-driven routing: no overlap, expected-wait fallback"
            );
        } else {
            tracing::debug!(
                target: LOG_TARGET,
                worker_type = self.side.map(PdSide::name),
                branch = decision.branch.label(),
                worker,
                model_id,
                blocks_held,
                request_blocks,
                "Event-driven routing: overlap match"
            );
        }
    }

    /// `decide_cache_aware`'s count (tree mode, once per request) and log of a tree or hash
    /// decision.
    fn decide_cache_aware_count_and_log(&self, prepared: &Prepared, decision: &Decision) {
        let (worker, model_id) = (self.ring.url(decision.worker), prepared.input.model());
        match self.config.cache_index {
            // SMG logs the KV-pressure fallback without an index.
            CacheIndexKind::Tree if decision.branch == Branch::KvPressure => tracing::debug!(
                target: LOG_TARGET,
                worker_type = self.side.map(PdSide::name),
                branch = decision.branch.label(),
                worker,
                model_id,
                "Cache-aware selection"
            ),
            CacheIndexKind::Tree => {
                // Once per request: a retry's decision is not counted again.
                if !prepared.decision_counted.replace(true) {
                    self.metrics.record(decision);
                }
                tracing::debug!(
                    target: LOG_TARGET,
                    worker_type = self.side.map(PdSide::name),
                    index = "tree",
                    branch = decision.branch.label(),
                    worker,
                    model_id,
                    matched_ratio = decision.match_ratio,
                    threshold = self.config.cache_aware.cache_threshold,
                    "Cache-aware selection"
                );
            }
            CacheIndexKind::Hash => tracing::debug!(
                target: LOG_TARGET,
                worker_type = self.side.map(PdSide::name),
                index = "hash",
                branch = decision.branch.label(),
                level = decision.head_tokens,
                worker,
                model_id,
                "Cache-aware selection"
            ),
        }
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
                let (picked, branch) =
                    simple::prefix_hash_branch(key, &self.ring, workers, balance, rng);
                // SMG's `no_tokens`: nothing to hash (kvgate still routes it, on the ring).
                let branch = match (branch, input.key().is_empty()) {
                    (HashBranch::RingHit | HashBranch::LoadBalanceWalk, true) => {
                        HashBranch::NoTokens
                    }
                    (branch, _) => branch,
                };
                self.metrics.record_hash_branch(branch);
                picked
            }
            PolicyKind::ConsistentHashing => {
                let (target, key) = (input.target_worker(), input.routing_key_hash());
                let (picked, branch) =
                    simple::consistent_hashing_branch(target, key, &self.ring, workers, rng);
                self.metrics.record_hash_branch(branch);
                picked
            }
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
        // `--bounded-load-margin`: the first roster's workers count from the gateway's start;
        // a worker new in its slot after that from its first decision here.
        let first_roster = self.ring_members.is_empty();
        for (id, url) in workers.clone() {
            let slot = id.index();
            if self.dispatched_offsets.len() <= slot {
                self.dispatched_offsets.resize(slot + 1, Some(0));
            }
            let known =
                (self.ring_members.iter()).any(|(old, old_url)| *old == id && old_url == url);
            if !first_roster && !known {
                self.dispatched_offsets[slot] = None;
            }
        }
        self.ring_members = workers
            .clone()
            .map(|(id, url)| (id, url.to_owned()))
            .collect();
        self.ring = WorkerRing::new(workers);
    }
}
