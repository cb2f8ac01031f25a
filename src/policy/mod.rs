//! Routing policies: the per-core routing pipeline, the `cache_aware` decision flow, the
//! expected-wait scorer, and the simpler policies (`random`, `round_robin`, `power_of_two`,
//! `least_load`, `prefix_hash`, `consistent_hashing`).
//!
//! Key types: [`Router`] (one per data core, its state in `router.rs`: prepare a request in
//! `preparation.rs`, select a worker per attempt in `decision.rs`, record the dispatch in
//! `record.rs`; the spec's steps read top to bottom across the three), [`Prepared`] (one request
//! prepared once: routing input, namespace, page hashes, index lookup), [`IndexLookup`] (the
//! seam to the index modes), [`cache_aware::select`] (the decision flow as one pure function),
//! [`WorkerStatus`] (what a decision knows about one worker), [`RecordKey`] (what the index
//! learns from a dispatch), [`PolicyArgs`] (SMG's flags, validated into a [`PolicyConfig`]).
//! Nothing here does I/O or awaits; a decision on the common path does not allocate. Errors:
//! flag validation fails with a `FlagError`; a body that is not a JSON object is a
//! `RequestError` (400); a decision with no eligible worker is `None` (503).

mod args;
pub mod cache_aware;
mod decision;
mod expected_wait;
mod hashing;
mod lookup;
mod metrics;
mod peer_text;
mod placements;
mod preparation;
mod prepared;
mod recent;
mod record;
mod router;
mod simple;

pub use args::{CacheAwareConfig, CacheIndexKind, PolicyArgs, PolicyConfig, PolicyKind};
pub use cache_aware::{Affinity, RequestSize};
pub use expected_wait::{
    Fleet, ScorerConfig, SpillGate, MEAN_PREFILL_TOKENS_DEFAULT, NEW_PREFIX_WAIT_SLACK,
};
pub use hashing::{WorkerRing, RING_POINTS_PER_WORKER};
pub use lookup::{Blocks, Heads, IndexLookup, Trees};
pub use metrics::{
    render_prometheus, PolicyMetrics, PredictionBasis, TokenizerFigures, MATCH_RATIO_BOUNDS,
};
pub use placements::PLACEMENT_HALF_LIFE_MS;
pub use prepared::{IndexKey, Lookup, Prepared};
pub use recent::{RecentDispatches, RECENT_DISPATCHES_MAX, RECENT_DISPATCH_WINDOW_MS};
pub use record::{model_hash, KeyData, MeshShare, RecordKey};
pub use router::{Router, WorkerView, LOG_TARGET};
pub use simple::{
    consistent_hashing, least_load, power_of_two, prefix_hash, prefix_hash_key, random,
    round_robin, PrefixHashBalance,
};

use crate::ids::WorkerId;
use crate::workers::load::LoadReport;

/// The last load report of a worker (SGLang `/v1/loads` or engine metrics), as the policy reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerLoad {
    /// Requests the engine is decoding.
    pub running: u32,
    /// Requests queued in the engine.
    pub waiting: u32,
    /// Prompt tokens of queued requests that are not in the engine's cache (prefill backlog).
    pub waiting_uncached_tokens: u64,
    /// KV-cache usage, 0.0 (empty) to 1.0 (full).
    pub token_usage: f64,
    /// Generation throughput in tokens per second (0 when idle).
    pub gen_throughput: f64,
    /// KV-cache capacity in tokens (0: not reported).
    pub kv_capacity_tokens: u64,
}

impl From<&LoadReport> for WorkerLoad {
    /// The report as the built-in scorer reads it ([`WorkerLoad::from_report`]).
    fn from(report: &LoadReport) -> WorkerLoad {
        WorkerLoad::from_report(report, expected_wait::MEAN_PREFILL_TOKENS_DEFAULT)
    }
}

impl WorkerLoad {
    /// The report as the policy reads it. Fields the engine did not report read as zero (never
    /// as pressure): no signal is never a penalty. A queue reported in requests without its
    /// tokens (vLLM through `/metrics`) counts `mean_prefill_tokens` per request, as SMG's
    /// scorer does, instead of nothing.
    pub fn from_report(report: &LoadReport, mean_prefill_tokens: u64) -> WorkerLoad {
        let queue_estimate = report.waiting_requests.saturating_mul(mean_prefill_tokens);
        WorkerLoad {
            running: u32::try_from(report.running_requests).unwrap_or(u32::MAX),
            waiting: u32::try_from(report.waiting_requests).unwrap_or(u32::MAX),
            waiting_uncached_tokens: report.waiting_uncached_tokens.unwrap_or(queue_estimate),
            token_usage: report.token_usage.unwrap_or(0.0),
            gen_throughput: report.gen_throughput_tps.unwrap_or(0.0),
            kv_capacity_tokens: report.max_total_tokens.unwrap_or(0),
        }
    }
}

/// What a decision knows about one worker slot. A slice of these is indexed by `WorkerId`:
/// `workers[id.index()]` describes worker `id`; removed or empty slots are not eligible.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerStatus {
    /// Healthy, circuit breaker allows traffic, not excluded by overload protection.
    pub eligible: bool,
    /// Requests this gateway has in flight to the worker (all data cores summed).
    pub in_flight: u32,
    /// The worker's last load report, if it reports load.
    pub load: Option<WorkerLoad>,
    /// Prompt tokens of requests dispatched to the worker since its last load report (so not in
    /// the report) that have no first token back yet, summed over data cores.
    pub credited_tokens: u64,
    /// Prompt tokens of requests dispatched to the worker since its last load report whose
    /// requests have not ended (KV cache the report cannot show yet), summed over data cores.
    pub resident_tokens: u64,
    /// Prompt tokens of requests dispatched before the last load report whose first token came
    /// back after it: the part of the report's queue known to have drained.
    pub drained_tokens: u64,
    /// Prompt tokens of the new prefixes (cache misses) this data core placed on the worker
    /// lately, each weighing less as it ages ([`PLACEMENT_HALF_LIFE_MS`]): the work those
    /// prefixes will draw. A cache miss prefers the worker given the least among those that would
    /// start it about as soon. Filled for cache misses only (0 otherwise).
    pub placed_tokens: f64,
    /// Requests this gateway has sent the worker, all data cores summed, counted from when this
    /// core first saw it in its slot (one that joins later starts at the others' mean): what
    /// `--bounded-load-margin` bounds. Filled only when that flag is on (0 otherwise).
    pub dispatched: u64,
}

/// Which step of the decision flow chose the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Branch {
    /// A holder of the matched prefix (step 5, candidate not hot).
    TreeMatch,
    /// Every holder was hot (or none was eligible): the least-waiting non-hot worker (step 5).
    Spill,
    /// Cache miss: the least-waiting eligible worker (step 6).
    ExpectedWaitFallback,
    /// The request had no routing key to look up (empty text, no tokens): the least-waiting
    /// eligible worker. SMG's name for decisions made without the tree; unlike SMG, never index 0.
    FirstHealthyFallback,
    /// `--load-aware-affinity`: every holder would finish the request later than the cheapest
    /// non-holder, its full prefill included; that worker takes it and becomes a holder.
    Replicate,
    /// `--bounded-load-margin`: every holder was more than the margin above the fleet's mean
    /// dispatched count; the least-sent eligible worker below the mean takes it and becomes a
    /// holder.
    BoundedLoad,
    /// KV pressure suspended affinity (step 2). Not counted in the branch counter (spec).
    KvPressure,
    /// Hash mode: a live holder of the deepest head that has one (step 5, not hot).
    HashHit,
    /// Hash mode: every holder was hot; the least-waiting non-hot worker (step 5).
    HashSpill,
    /// Hash mode: token IDs shorter than the smallest boundary; the least-waiting worker.
    ShortRequest,
    /// KV-event index: a worker holding the most leading blocks (step 5, not hot).
    EventOverlap,
    /// KV-event index: every holder was hot; the least-waiting non-hot worker (step 5).
    EventSpill,
    /// KV-event index: no eligible worker holds the first block; the least-waiting worker.
    EventFallback,
}

impl Branch {
    /// The branches counted by `smg_cache_aware_policy_branch_total`, in exposition order.
    pub const COUNTED: [Branch; 6] = [
        Branch::TreeMatch,
        Branch::Spill,
        Branch::Replicate,
        Branch::BoundedLoad,
        Branch::ExpectedWaitFallback,
        Branch::FirstHealthyFallback,
    ];

    /// The metric label / log value.
    pub fn label(self) -> &'static str {
        match self {
            Branch::TreeMatch => "tree_match",
            Branch::Spill => "spill",
            Branch::Replicate => "load_aware_replicate",
            Branch::BoundedLoad => "bounded_load_replicate",
            Branch::ExpectedWaitFallback => "expected_wait_fallback",
            Branch::FirstHealthyFallback => "first_healthy_fallback",
            Branch::KvPressure => "kv_pressure_expected_wait",
            Branch::HashHit => "hash_hit",
            Branch::HashSpill => "hash_spill",
            Branch::ShortRequest => "short_request",
            Branch::EventOverlap => "event_overlap",
            Branch::EventSpill => "event_spill",
            Branch::EventFallback => "event_fallback",
        }
    }
}

/// The outcome of one routing decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// The worker to forward to (and, in tree mode, to record as a holder of the prefix: step 7).
    pub worker: WorkerId,
    /// Which step chose it.
    pub branch: Branch,
    /// Matched length over request length (tree mode; 0 when nothing was looked up).
    pub match_ratio: f64,
    /// Hash mode: the boundary of the head whose holder was chosen (0 otherwise).
    pub head_tokens: u32,
}

#[cfg(test)]
mod tests;
