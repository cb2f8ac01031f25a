//! The policy flags with SMG's names and defaults ([`PolicyArgs`], flattened into the gateway's
//! command line) and their validation per the spec's "Tuning Knobs" into a [`PolicyConfig`].
//! A bad value is a [`FlagError`] naming the flag.

use std::time::Duration;

use super::ScorerConfig;
use crate::error::FlagError;
use crate::limits::{
    CACHE_BOUNDARIES_MAX, KV_BLOCKS_DEFAULT, KV_BLOCKS_MAX, KV_INFLIGHT_TTL_DEFAULT_SECS,
    PLACEMENT_HOLDERS_DEFAULT, PLACEMENT_HOLDERS_MAX,
};

/// `--policy`: which routing policy the gateway runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyKind {
    /// Prefix-cache affinity with load balancing (SMG's default).
    #[default]
    #[value(name = "cache_aware")]
    CacheAware,
    /// Uniformly random eligible worker.
    #[value(name = "random")]
    Random,
    /// Eligible workers in turn.
    #[value(name = "round_robin")]
    RoundRobin,
    /// The less loaded of two random eligible workers.
    #[value(name = "power_of_two")]
    PowerOfTwo,
    /// The lowest expected wait.
    #[value(name = "least_load")]
    LeastLoad,
    /// Hash of the prompt's head on a consistent-hash ring with bounded load.
    #[value(name = "prefix_hash")]
    PrefixHash,
    /// The x-smg-target-worker header, or x-smg-routing-key on a consistent-hash ring.
    #[value(name = "consistent_hashing")]
    ConsistentHashing,
}

impl PolicyKind {
    /// The flag value (SMG's policy name).
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::PrefixHash => "prefix_hash",
            PolicyKind::ConsistentHashing => "consistent_hashing",
        }
    }
}

/// `--cache-index`: the radix trees, or the TTL'd exact-match placement map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheIndexKind {
    /// String and token radix trees.
    #[default]
    #[value(name = "tree")]
    Tree,
    /// Hash of the request's head at each --cache-boundaries position.
    #[value(name = "hash")]
    Hash,
}

/// The routing-policy flags (SMG names and defaults). Flatten into the gateway's clap struct.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Routing Policy")]
pub struct PolicyArgs {
    /// Routing policy.
    #[arg(long, value_enum, default_value = "cache_aware")]
    pub policy: PolicyKind,
    /// Minimum match ratio (matched / request length) for holders of a prefix to be preferred.
    #[arg(long, visible_alias = "cache-match-threshold", default_value_t = 0.3)]
    pub cache_threshold: f64,
    /// Spill gate: a holder is hot only above the fleet mean in-flight plus this many requests.
    #[arg(long, visible_alias = "spill-abs-threshold", default_value_t = 64)]
    pub balance_abs_threshold: u32,
    /// Spill gate: a holder is hot only above this multiple of the fleet mean in-flight.
    #[arg(long, visible_alias = "spill-rel-threshold", default_value_t = 1.5)]
    pub balance_rel_threshold: f64,
    /// Suspend affinity while any worker's KV usage is above this (0 < x; >= 1.0 disables).
    #[arg(long, default_value = "1.0")]
    pub overload_token_usage_threshold: Option<f64>,
    /// Suspend affinity while hottest minus coldest KV usage is above this (0 < x; >= 1.0 disables).
    #[arg(long, default_value = "1.0")]
    pub balance_token_usage_threshold: Option<f64>,
    /// Shrink a holder's score with its waiting-prefill backlog (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub overlap_decay: f64,
    /// Sample the holder group by score instead of taking the top group (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub selection_temperature: f64,
    /// Token-tree page size: matches count whole pages only.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// cache_aware: keep a prefix's holders only while one would complete the request at no more
    /// cost (queued prefill, its uncached prefill, the batch it joins) than the cheapest
    /// non-holder prefilling it whole; otherwise that worker takes it and becomes a holder, so a
    /// hot prefix replicates before it queues. Replaces the spill gate; off: SMG's behaviour.
    #[arg(long)]
    pub load_aware_affinity: bool,
    /// cache_aware: bounded load on requests dispatched. A holder of the request's prefix whose
    /// count of requests this gateway sent it is more than N above the fleet's mean count takes
    /// no more of them; the least-sent eligible worker below the mean, if it has no more requests
    /// in flight than the holder or the fleet mean, takes the request (and holds its prefix from
    /// then on), so every worker serves within N requests of the mean. Each replica costs a cold
    /// prefill and a prompt's room in that worker's cache: where the caches only just hold the
    /// prompts in use, a small N makes them evict (on make demo's workload N=16 costs 1-2 points
    /// of hit rate, N=4 or 8 4-14). Off (unset): SMG's behaviour.
    #[arg(long, value_name = "N")]
    pub bounded_load_margin: Option<u32>,
    /// Per-model tree budget: characters (string tree) or tokens (token tree).
    #[arg(long, default_value_t = 67_108_864)]
    pub max_tree_size: u64,
    /// Seconds between eviction cycles.
    #[arg(long, alias = "eviction-interval-secs", default_value_t = 120)]
    pub eviction_interval: u64,
    /// Index kind for cache_aware: the radix trees, or the TTL'd placement map of request heads
    /// at `--cache-boundaries` (which it requires).
    #[arg(long, value_enum, default_value = "tree")]
    pub cache_index: CacheIndexKind,
    /// Token positions (positive, strictly ascending) for hash mode and prefix_hash.
    #[arg(long, value_delimiter = ',')]
    pub cache_boundaries: Vec<u32>,
    /// Hash mode: how long a placement stays live.
    #[arg(long, default_value_t = 180)]
    pub cache_ttl_secs: u64,
    /// Hash mode: the most holders a head keeps; one more evicts the stalest. 3 is the spec's
    /// cap. A prefix hotter than three workers can serve needs more to spread under
    /// --load-aware-affinity (each head then takes 64 bytes instead of 32).
    #[arg(long, default_value_t = PLACEMENT_HOLDERS_DEFAULT)]
    pub cache_holders_max: usize,
    /// KV-event index: a worker whose events have been silent this many seconds has its entries
    /// aged out (0: never; an idle engine keeps its cache, and so does the index).
    #[arg(long, default_value_t = 0)]
    pub kv_indexer_ttl_secs: u64,
    /// KV-event index: the most distinct blocks it holds (its table is sized for them at start,
    /// about 24 bytes each, memory committed as used); stores beyond are refused and counted.
    #[arg(long, default_value_t = KV_BLOCKS_DEFAULT)]
    pub kv_indexer_max_entries: usize,
    /// KV-event index: blocks of requests dispatched to a worker count as its (provisionally)
    /// until its engine's events confirm them or the request ends; this is the longest such a
    /// claim lives when its end is never heard (0: no in-flight overlay, the engines' events
    /// alone).
    #[arg(long, default_value_t = KV_INFLIGHT_TTL_DEFAULT_SECS)]
    pub kv_inflight_ttl_secs: u64,
    /// prefix_hash: how many leading tokens are hashed (without --cache-boundaries).
    #[arg(long, default_value_t = 256)]
    pub prefix_token_count: u32,
    /// prefix_hash: a worker takes a key only while its in-flight count is below this multiple of
    /// the fleet mean (bounded-load consistent hashing).
    #[arg(long, default_value_t = 1.25)]
    pub prefix_hash_load_factor: f64,
    /// prefix_hash: a worker at its bounded-load cap is passed over only when it is also this
    /// many requests above the fleet mean (0: the cap alone).
    #[arg(long, default_value_t = 10)]
    pub prefix_hash_balance_abs_threshold: u32,
    /// least_load: the KV penalty at half KV usage, in seconds (cache_aware: built in).
    #[arg(long, default_value_t = 0.15)]
    pub least_load_kv_pressure_weight: f64,
    /// least_load: generation throughput (tokens/s) assumed while no worker reports one.
    #[arg(long, default_value_t = 2000.0)]
    pub least_load_default_throughput: f64,
    /// least_load: prompt tokens assumed per queued request when a worker reports its queue
    /// without token counts (vLLM's /metrics). cache_aware assumes the default.
    #[arg(long, default_value_t = 1024)]
    pub least_load_mean_prefill_tokens: u32,
    /// least_load: pass over workers with this many waiting requests (reported, plus this
    /// gateway's requests the report does not show) while another has fewer (0: off).
    #[arg(long, default_value_t = 0)]
    pub least_load_max_waiting_requests: u32,
}

impl Default for PolicyArgs {
    fn default() -> Self {
        <Self as clap::FromArgMatches>::from_arg_matches(
            &<Self as clap::Args>::augment_args(clap::Command::new("kvgate"))
                .get_matches_from(["kvgate"]),
        )
        .unwrap_or_else(|err| unreachable!("defaults parse: {err}"))
    }
}

fn refuse(flag: &'static str, reason: impl Into<String>) -> FlagError {
    FlagError::new(flag, reason)
}

/// The cache_aware knobs one decision reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwareConfig {
    /// `--cache-threshold`.
    pub cache_threshold: f64,
    /// `--balance-abs-threshold`.
    pub balance_abs_threshold: f64,
    /// `--balance-rel-threshold`.
    pub balance_rel_threshold: f64,
    /// `--overload-token-usage-threshold`; `None` when unset or >= 1.0.
    pub overload_token_usage_threshold: Option<f64>,
    /// `--balance-token-usage-threshold`; `None` when unset or >= 1.0.
    pub balance_token_usage_threshold: Option<f64>,
    /// `--overlap-decay`.
    pub overlap_decay: f64,
    /// `--selection-temperature`.
    pub selection_temperature: f64,
    /// `--block-size`.
    pub block_size: u32,
    /// `--load-aware-affinity`.
    pub load_aware_affinity: bool,
    /// `--bounded-load-margin`: requests a holder may be above the fleet's mean dispatched count
    /// and still take a cache hit (`None`: off).
    pub bounded_load_margin: Option<u32>,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        PolicyArgs::default()
            .validate()
            .map(|c| c.cache_aware)
            .unwrap_or_else(|err| unreachable!("defaults are valid: {err}"))
    }
}

/// Validated policy configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// `--policy`.
    pub kind: PolicyKind,
    /// The cache_aware knobs.
    pub cache_aware: CacheAwareConfig,
    /// `--max-tree-size`.
    pub max_tree_size: u64,
    /// `--eviction-interval`.
    pub eviction_interval: Duration,
    /// `--cache-index`.
    pub cache_index: CacheIndexKind,
    /// `--cache-boundaries`, strictly ascending.
    pub cache_boundaries: Vec<u32>,
    /// `--cache-ttl-secs`.
    pub cache_ttl: Duration,
    /// `--cache-holders-max`.
    pub cache_holders_max: usize,
    /// `--kv-indexer-ttl-secs` (`None`: 0, entries never age out).
    pub kv_indexer_ttl: Option<Duration>,
    /// `--kv-indexer-max-entries`.
    pub kv_indexer_max_entries: usize,
    /// `--kv-inflight-ttl-secs` (`None`: 0, no in-flight overlay).
    pub kv_inflight_ttl: Option<Duration>,
    /// `--prefix-token-count`.
    pub prefix_token_count: u32,
    /// `--prefix-hash-load-factor`.
    pub prefix_hash_load_factor: f64,
    /// `--prefix-hash-balance-abs-threshold`.
    pub prefix_hash_balance_abs_threshold: f64,
    /// The `--least-load-*` flags (read by `--policy least_load` only: see [`Self::scorer`]).
    pub least_load: ScorerConfig,
}

impl PolicyConfig {
    /// The expected-wait scorer's knobs for this policy: the `--least-load-*` flags for
    /// least_load, the built-in ones otherwise (the spec: cache_aware runs the scorer with its
    /// built-in defaults).
    pub fn scorer(&self) -> ScorerConfig {
        match self.kind {
            PolicyKind::LeastLoad => self.least_load,
            _ => ScorerConfig::BUILT_IN,
        }
    }
}

impl PolicyArgs {
    /// Checks every value against "Tuning Knobs" and builds the config.
    pub fn validate(&self) -> Result<PolicyConfig, FlagError> {
        let cache_threshold = unit_interval("--cache-threshold", self.cache_threshold)?;
        if !(self.balance_rel_threshold.is_finite() && self.balance_rel_threshold > 0.0) {
            return Err(refuse(
                "--balance-rel-threshold",
                "must be a number above 0",
            ));
        }
        let cache_aware = CacheAwareConfig {
            cache_threshold,
            balance_abs_threshold: f64::from(self.balance_abs_threshold),
            balance_rel_threshold: self.balance_rel_threshold,
            overload_token_usage_threshold: usage_threshold(
                "--overload-token-usage-threshold",
                self.overload_token_usage_threshold,
            )?,
            balance_token_usage_threshold: usage_threshold(
                "--balance-token-usage-threshold",
                self.balance_token_usage_threshold,
            )?,
            overlap_decay: non_negative("--overlap-decay", self.overlap_decay)?,
            selection_temperature: non_negative(
                "--selection-temperature",
                self.selection_temperature,
            )?,
            block_size: positive("--block-size", self.block_size)?,
            load_aware_affinity: self.load_aware_affinity,
            bounded_load_margin: self.bounded_load_margin,
        };
        self.validate_boundaries()?;
        if !(self.prefix_hash_load_factor.is_finite() && self.prefix_hash_load_factor >= 1.0) {
            return Err(refuse(
                "--prefix-hash-load-factor",
                "must be a number of at least 1.0",
            ));
        }
        Ok(PolicyConfig {
            kind: self.policy,
            cache_aware,
            max_tree_size: positive("--max-tree-size", self.max_tree_size)?,
            eviction_interval: Duration::from_secs(positive(
                "--eviction-interval",
                self.eviction_interval,
            )?),
            cache_index: self.cache_index,
            cache_boundaries: self.cache_boundaries.clone(),
            cache_ttl: Duration::from_secs(positive("--cache-ttl-secs", self.cache_ttl_secs)?),
            cache_holders_max: self.validate_cache_holders_max()?,
            kv_indexer_ttl: (self.kv_indexer_ttl_secs > 0)
                .then(|| Duration::from_secs(self.kv_indexer_ttl_secs)),
            kv_indexer_max_entries: self.validate_kv_indexer_max_entries()?,
            kv_inflight_ttl: (self.kv_inflight_ttl_secs > 0)
                .then(|| Duration::from_secs(self.kv_inflight_ttl_secs)),
            prefix_token_count: positive("--prefix-token-count", self.prefix_token_count)?,
            prefix_hash_load_factor: self.prefix_hash_load_factor,
            prefix_hash_balance_abs_threshold: f64::from(self.prefix_hash_balance_abs_threshold),
            least_load: self.validate_least_load()?,
        })
    }

    fn validate_least_load(&self) -> Result<ScorerConfig, FlagError> {
        let throughput = self.least_load_default_throughput;
        if !(throughput.is_finite() && throughput > 0.0) {
            return Err(refuse(
                "--least-load-default-throughput",
                format!("{throughput} must be a number above 0"),
            ));
        }
        Ok(ScorerConfig {
            kv_penalty_half_usage_s: non_negative(
                "--least-load-kv-pressure-weight",
                self.least_load_kv_pressure_weight,
            )?,
            throughput_fallback_tps: throughput,
            mean_prefill_tokens: u64::from(positive(
                "--least-load-mean-prefill-tokens",
                self.least_load_mean_prefill_tokens,
            )?),
            max_waiting_requests: (self.least_load_max_waiting_requests > 0)
                .then_some(self.least_load_max_waiting_requests),
        })
    }

    fn validate_cache_holders_max(&self) -> Result<usize, FlagError> {
        match self.cache_holders_max {
            n @ 1..=PLACEMENT_HOLDERS_MAX => Ok(n),
            _ => Err(refuse(
                "--cache-holders-max",
                format!("must be 1..={PLACEMENT_HOLDERS_MAX} holders per head"),
            )),
        }
    }

    fn validate_kv_indexer_max_entries(&self) -> Result<usize, FlagError> {
        match self.kv_indexer_max_entries {
            n @ 1..=KV_BLOCKS_MAX => Ok(n),
            _ => Err(refuse(
                "--kv-indexer-max-entries",
                format!("must be 1..={KV_BLOCKS_MAX} blocks"),
            )),
        }
    }

    fn validate_boundaries(&self) -> Result<(), FlagError> {
        let bounds = &self.cache_boundaries;
        if bounds.first() == Some(&0) {
            return Err(refuse(
                "--cache-boundaries",
                "token positions must be positive (got 0)",
            ));
        }
        if let Some(pair) = bounds.windows(2).find(|w| w[0] >= w[1]) {
            let (a, b) = (pair[0], pair[1]);
            return Err(refuse(
                "--cache-boundaries",
                format!("token positions must be strictly ascending ({a} then {b})"),
            ));
        }
        if bounds.len() > CACHE_BOUNDARIES_MAX {
            let n = bounds.len();
            return Err(refuse(
                "--cache-boundaries",
                format!("{n} positions given, at most {CACHE_BOUNDARIES_MAX}"),
            ));
        }
        if self.cache_index == CacheIndexKind::Hash && bounds.is_empty() {
            return Err(refuse(
                "--cache-boundaries",
                "required with --cache-index hash (e.g. --cache-boundaries 2048,8192,32768)",
            ));
        }
        Ok(())
    }

    /// The flags given a value other than their default that `--cache-index hash` does not use
    /// (the spec: "in hash mode ... --cache-threshold, --overlap-decay and
    /// --selection-temperature are not used"); empty in tree mode.
    pub fn unused_in_hash_mode(&self) -> Vec<&'static str> {
        if self.cache_index != CacheIndexKind::Hash {
            return Vec::new();
        }
        let defaults = PolicyArgs::default();
        let mut unused = Vec::new();
        if self.cache_threshold != defaults.cache_threshold {
            unused.push("--cache-threshold");
        }
        if self.overlap_decay != defaults.overlap_decay {
            unused.push("--overlap-decay");
        }
        if self.selection_temperature != defaults.selection_temperature {
            unused.push("--selection-temperature");
        }
        // The KV-event index is not used in hash mode either (spec).
        if self.kv_indexer_ttl_secs != defaults.kv_indexer_ttl_secs {
            unused.push("--kv-indexer-ttl-secs");
        }
        if self.kv_indexer_max_entries != defaults.kv_indexer_max_entries {
            unused.push("--kv-indexer-max-entries");
        }
        if self.kv_inflight_ttl_secs != defaults.kv_inflight_ttl_secs {
            unused.push("--kv-inflight-ttl-secs");
        }
        unused
    }
}

fn unit_interval(flag: &'static str, value: f64) -> Result<f64, FlagError> {
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(refuse(flag, format!("{value} is not between 0 and 1")))
    }
}

fn non_negative(flag: &'static str, value: f64) -> Result<f64, FlagError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(refuse(flag, format!("{value} must be 0 or more")))
    }
}

/// A token-usage threshold: above 0; 1.0 or more disables the check (`None`).
fn usage_threshold(flag: &'static str, value: Option<f64>) -> Result<Option<f64>, FlagError> {
    match value {
        None => Ok(None),
        Some(v) if v.is_nan() || v <= 0.0 => Err(refuse(flag, format!("{v} must be above 0"))),
        Some(v) if v >= 1.0 => Ok(None),
        Some(v) => Ok(Some(v)),
    }
}

fn positive<T: PartialOrd + Default + std::fmt::Display + Copy>(
    flag: &'static str,
    value: T,
) -> Result<T, FlagError> {
    if value > T::default() {
        Ok(value)
    } else {
        Err(refuse(flag, format!("{value} must be above 0")))
    }
}
