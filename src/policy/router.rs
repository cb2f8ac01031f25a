//! [`Router`]: one per data core. Runs the configured policy over a decision snapshot, counts
//! cache_aware decisions in the core's [`PolicyMetrics`] and logs each one as `Cache-aware
//! selection` under the target `smg::policies::cache_aware`, so SMG's filter
//! `RUST_LOG=info,smg::policies::cache_aware=debug` works unchanged. With that level off the log
//! costs one relaxed load of the callsite's interest.

use std::sync::Arc;

use fastrand::Rng;

use super::data_core::prompt_tokens;
use super::{
    cache_aware, simple, Decision, PolicyConfig, PolicyKind, PolicyMetrics, WorkerRing,
    WorkerStatus,
};
use crate::index::TreeMatch;
use crate::request::{RoutingInput, RoutingKey};
use crate::workers::WorkerId;

/// The tracing target of decision logs (SMG's module path).
pub const LOG_TARGET: &str = "smg::policies::cache_aware";

/// Which tree a cache_aware request was looked up in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexKind {
    /// The string tree (text requests).
    String,
    /// The token tree (requests with token IDs).
    Token,
}

impl IndexKind {
    /// The tree a routing key is looked up in.
    pub fn of(key: RoutingKey<'_>) -> IndexKind {
        match key {
            RoutingKey::Tokens(_) => IndexKind::Token,
            RoutingKey::Text(_) => IndexKind::String,
        }
    }

    fn label(self) -> &'static str {
        match self {
            IndexKind::String => "string",
            IndexKind::Token => "token",
        }
    }
}

/// Everything one decision reads.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// The request's routing input.
    pub input: &'a RoutingInput,
    /// The lookup in the request's tree (cache_aware only); `None` when the key is empty.
    pub tree: Option<&'a TreeMatch>,
    /// Worker slots, indexed by `WorkerId`.
    pub workers: &'a [WorkerStatus],
    /// The hash ring and worker URLs.
    pub ring: &'a WorkerRing,
}

/// The worker chosen for a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    /// Where to forward.
    pub worker: WorkerId,
    /// The cache_aware decision, when that policy chose: the caller then records the request's
    /// key for `worker` in the index (spec step 7).
    pub cache_aware: Option<Decision>,
}

/// A data core's policy state: configuration, RNG, round-robin cursor and counters.
#[derive(Debug)]
pub struct Router {
    config: PolicyConfig,
    rng: Rng,
    round_robin_cursor: usize,
    metrics: Arc<PolicyMetrics>,
}

impl Router {
    /// A router for one core. `seed` makes its random choices reproducible.
    pub fn new(config: PolicyConfig, seed: u64, metrics: Arc<PolicyMetrics>) -> Router {
        Router {
            config,
            rng: Rng::with_seed(seed),
            round_robin_cursor: 0,
            metrics,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// True when the policy reads the prefix index (the caller looks the request up first).
    pub fn uses_index(&self) -> bool {
        self.config.kind == PolicyKind::CacheAware
    }

    /// Picks a worker; `None` when no worker is eligible.
    pub fn route(&mut self, request: &RouteRequest<'_>) -> Option<Route> {
        let workers = request.workers;
        let plain = |worker| Route {
            worker,
            cache_aware: None,
        };
        let rng = &mut self.rng;
        match self.config.kind {
            PolicyKind::CacheAware => self.route_cache_aware(request),
            PolicyKind::Random => simple::random(workers, rng).map(plain),
            PolicyKind::RoundRobin => {
                simple::round_robin(workers, &mut self.round_robin_cursor).map(plain)
            }
            PolicyKind::PowerOfTwo => simple::power_of_two(workers, rng).map(plain),
            PolicyKind::LeastLoad => simple::least_load(workers, rng).map(plain),
            PolicyKind::PrefixHash => {
                let input = request.input;
                let key = simple::prefix_hash_key(
                    input.key(),
                    input.namespace(),
                    self.config.prefix_token_count,
                    &self.config.cache_boundaries,
                );
                let factor = self.config.prefix_hash_load_factor;
                simple::prefix_hash(key, request.ring, workers, factor, rng).map(plain)
            }
            PolicyKind::ConsistentHashing => {
                let input = request.input;
                let (target, key) = (input.target_worker(), input.routing_key_hash());
                simple::consistent_hashing(target, key, request.ring, workers, rng).map(plain)
            }
        }
    }

    fn route_cache_aware(&mut self, request: &RouteRequest<'_>) -> Option<Route> {
        let config = &self.config.cache_aware;
        let tokens = prompt_tokens(request.input.key());
        let decision =
            cache_aware::select(request.tree, request.workers, config, tokens, &mut self.rng)?;
        self.metrics.record(&decision);
        tracing::debug!(
            target: LOG_TARGET,
            index = IndexKind::of(request.input.key()).label(),
            branch = decision.branch.label(),
            worker = request.ring.url(decision.worker),
            model_id = request.input.model(),
            matched_ratio = decision.match_ratio,
            threshold = config.cache_threshold,
            "Cache-aware selection"
        );
        Some(Route {
            worker: decision.worker,
            cache_aware: Some(decision),
        })
    }
}
