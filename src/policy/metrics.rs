//! Per-core decision counters: `smg_cache_aware_policy_branch_total{branch}` and the
//! `smg_cache_aware_match_ratio` histogram (buckets 0, 0.1 … 1.0), the tokenization cache's
//! figures under SMG's names (`smg_tokenizer_cache_{l0,l1}_{hits,misses}_total`,
//! `smg_tokenizer_cache_l0_entries`, `smg_tokenizer_cache_l1_memory_bytes`) and kvgate's own
//! (`kvgate_tokenize_offloaded_total`, `kvgate_tokenize_refused_total`,
//! `kvgate_tokenize_failures_total`, `kvgate_tokenize_over_cap_total`), the KV-event index's
//! predictions by what they rest on (`kvgate_kv_event_predictions_total{basis}`), and their
//! Prometheus text rendering
//! ([`render_prometheus`]), which sums the cores' counters on scrape.
//!
//! Each data core owns one [`PolicyMetrics`] and is its only writer, so an update is a relaxed
//! load and store (no locked read-modify-write); the scraper reads with relaxed loads and may see
//! a decision's branch count before its histogram count, which Prometheus tolerates.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

use super::simple::HashBranch;
use super::{Branch, Decision};

/// Upper bounds of the match-ratio histogram buckets (SMG's: 0, 0.1 … 1.0), then `+Inf`.
pub const MATCH_RATIO_BOUNDS: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const RATIO_BUCKETS: usize = MATCH_RATIO_BOUNDS.len() + 1;

/// One data core's decision counters.
#[derive(Debug, Default)]
pub struct PolicyMetrics {
    inner: CachePadded<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    branch: [AtomicU64; Branch::COUNTED.len()],
    /// Non-cumulative bucket counts; the last is `+Inf`.
    ratio_buckets: [AtomicU64; RATIO_BUCKETS],
    /// f64 bits of the sum of observed ratios.
    ratio_sum_bits: AtomicU64,
    /// [`TokenizerFigures`], in field order.
    tokenizer: [AtomicU64; TOKENIZER_FIGURES],
    /// Cold tokenizations handed to the pool.
    tokenize_offloaded: AtomicU64,
    /// Cold tokenizations the pool could not take (queue full): those requests routed on text.
    tokenize_refused: AtomicU64,
    /// prefix_hash and consistent_hashing decisions by [`HashBranch`] (every attempt's, as
    /// SMG counts each `select_worker`).
    hash_branch: [AtomicU64; HashBranch::ALL.len()],
    /// KV-event predictions by [`PredictionBasis`], in its order.
    kv_predictions: [AtomicU64; 2],
}

/// What a KV-event index prediction (the worker chosen holds a prefix of the request) rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictionBasis {
    /// Every block counted for the worker was reported by its engine.
    Confirmed,
    /// Some were only in flight to it (the overlay, or this core's recent dispatches).
    Provisional,
}

const TOKENIZER_FIGURES: usize = 8;

/// One core's tokenization figures, as its router last published them (absolute values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenizerFigures {
    /// Whole prompts found in L0.
    pub l0_hits: u64,
    /// Whole prompts not found in L0.
    pub l0_misses: u64,
    /// Segments found in L1.
    pub l1_hits: u64,
    /// Segments not found in L1.
    pub l1_misses: u64,
    /// Whole prompts held.
    pub l0_entries: u64,
    /// Bytes the segments count against their bound.
    pub l1_bytes: u64,
    /// Requests of a model with a tokenizer that routed on text (a template or body error).
    pub failures: u64,
    /// Requests that routed on text because their prompt was past the tokenization caps
    /// (`TOKENIZE_PROMPT_BYTES_MAX`, `TOKENIZE_MESSAGES_MAX`, a word past
    /// `TOKENIZER_PRETOKEN_BYTES_MAX`).
    pub over_cap: u64,
}

impl TokenizerFigures {
    fn as_array(self) -> [u64; TOKENIZER_FIGURES] {
        [
            self.l0_hits,
            self.l0_misses,
            self.l1_hits,
            self.l1_misses,
            self.l0_entries,
            self.l1_bytes,
            self.failures,
            self.over_cap,
        ]
    }
}

/// (name, type, help) of each tokenizer figure, in [`TokenizerFigures`] order.
const TOKENIZER_FAMILIES: [(&str, &str, &str); TOKENIZER_FIGURES] = [
    (
        "smg_tokenizer_cache_l0_hits_total",
        "counter",
        "Whole prompts found in the L0 tokenizer cache",
    ),
    (
        "smg_tokenizer_cache_l0_misses_total",
        "counter",
        "Whole prompts not found in the L0 tokenizer cache",
    ),
    (
        "smg_tokenizer_cache_l1_hits_total",
        "counter",
        "Prompt segments found in the L1 tokenizer cache",
    ),
    (
        "smg_tokenizer_cache_l1_misses_total",
        "counter",
        "Prompt segments not found in the L1 tokenizer cache",
    ),
    (
        "smg_tokenizer_cache_l0_entries",
        "gauge",
        "Whole prompts held by the L0 tokenizer cache",
    ),
    (
        "smg_tokenizer_cache_l1_memory_bytes",
        "gauge",
        "Bytes held by the L1 tokenizer cache",
    ),
    (
        "kvgate_tokenize_failures_total",
        "counter",
        "Requests of a model with a tokenizer that routed on their text",
    ),
    (
        "kvgate_tokenize_over_cap_total",
        "counter",
        "Requests whose prompt was past the tokenization caps (routed on their text)",
    ),
];

/// Adds to a counter this core alone writes.
fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

impl PolicyMetrics {
    /// Counts one cache_aware decision. KV-pressure decisions are not counted (spec: the branch
    /// counter and histogram cover tree decisions only).
    pub fn record(&self, decision: &Decision) {
        let Some(branch_index) = Branch::COUNTED.iter().position(|&b| b == decision.branch) else {
            return;
        };
        let counters = &*self.inner;
        bump(&counters.branch[branch_index], 1);
        let ratio = decision.match_ratio;
        let bucket = MATCH_RATIO_BOUNDS
            .iter()
            .position(|&bound| ratio <= bound)
            .unwrap_or(RATIO_BUCKETS - 1);
        bump(&counters.ratio_buckets[bucket], 1);
        let sum = f64::from_bits(counters.ratio_sum_bits.load(Relaxed)) + ratio;
        counters.ratio_sum_bits.store(sum.to_bits(), Relaxed);
    }

    /// Publishes this core's tokenization figures (its router is their only writer).
    pub fn set_tokenizer(&self, figures: TokenizerFigures) {
        for (slot, value) in self.inner.tokenizer.iter().zip(figures.as_array()) {
            slot.store(value, Relaxed);
        }
    }

    /// Counts one prefix_hash or consistent_hashing decision.
    pub fn record_hash_branch(&self, branch: HashBranch) {
        bump(&self.inner.hash_branch[branch as usize], 1);
    }

    /// Counts a request routed to a worker the KV-event index predicted holds a prefix of it.
    pub fn count_kv_prediction(&self, basis: PredictionBasis) {
        bump(&self.inner.kv_predictions[basis as usize], 1);
    }

    /// This core's KV-event predictions: confirmed, provisional.
    pub fn kv_predictions(&self) -> (u64, u64) {
        let [confirmed, provisional] = &self.inner.kv_predictions;
        (confirmed.load(Relaxed), provisional.load(Relaxed))
    }

    /// Counts a cold tokenization handed to the pool.
    pub fn count_tokenize_offloaded(&self) {
        bump(&self.inner.tokenize_offloaded, 1);
    }

    /// Counts a cold tokenization the pool could not take.
    pub fn count_tokenize_refused(&self) {
        bump(&self.inner.tokenize_refused, 1);
    }

    /// This core's tokenization figures.
    pub fn tokenizer(&self) -> TokenizerFigures {
        let v: Vec<u64> = self
            .inner
            .tokenizer
            .iter()
            .map(|a| a.load(Relaxed))
            .collect();
        TokenizerFigures {
            l0_hits: v[0],
            l0_misses: v[1],
            l1_hits: v[2],
            l1_misses: v[3],
            l0_entries: v[4],
            l1_bytes: v[5],
            failures: v[6],
            over_cap: v[7],
        }
    }

    /// Cold tokenizations this core handed to the pool, and those the pool refused.
    pub fn tokenize_offloads(&self) -> (u64, u64) {
        (
            self.inner.tokenize_offloaded.load(Relaxed),
            self.inner.tokenize_refused.load(Relaxed),
        )
    }

    /// This core's count for one branch.
    pub fn branch_count(&self, branch: Branch) -> u64 {
        Branch::COUNTED
            .iter()
            .position(|&b| b == branch)
            .map_or(0, |i| self.inner.branch[i].load(Relaxed))
    }
}

/// Appends the two metric families, summed over `cores`, in Prometheus text format.
pub fn render_prometheus<'a>(
    cores: impl IntoIterator<Item = &'a PolicyMetrics> + Clone,
    out: &mut String,
) {
    let _ = writeln!(
        out,
        "# HELP smg_cache_aware_policy_branch_total Cache-aware routing decisions by branch"
    );
    let _ = writeln!(out, "# TYPE smg_cache_aware_policy_branch_total counter");
    for (i, branch) in Branch::COUNTED.iter().enumerate() {
        let total: u64 = cores
            .clone()
            .into_iter()
            .map(|c| c.inner.branch[i].load(Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "smg_cache_aware_policy_branch_total{{branch=\"{}\"}} {total}",
            branch.label()
        );
    }
    let _ = writeln!(
        out,
        "# HELP smg_cache_aware_match_ratio Matched prefix length over request length"
    );
    let _ = writeln!(out, "# TYPE smg_cache_aware_match_ratio histogram");
    let mut cumulative = 0u64;
    for bucket in 0..RATIO_BUCKETS {
        cumulative += cores
            .clone()
            .into_iter()
            .map(|c| c.inner.ratio_buckets[bucket].load(Relaxed))
            .sum::<u64>();
        match MATCH_RATIO_BOUNDS.get(bucket) {
            Some(bound) => {
                let _ = writeln!(
                    out,
                    "smg_cache_aware_match_ratio_bucket{{le=\"{bound}\"}} {cumulative}"
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "smg_cache_aware_match_ratio_bucket{{le=\"+Inf\"}} {cumulative}"
                );
            }
        }
    }
    let sum: f64 = cores
        .clone()
        .into_iter()
        .map(|c| f64::from_bits(c.inner.ratio_sum_bits.load(Relaxed)))
        .sum();
    let _ = writeln!(out, "smg_cache_aware_match_ratio_sum {sum}");
    let _ = writeln!(out, "smg_cache_aware_match_ratio_count {cumulative}");
    render_hash_branches(cores.clone(), out);
    render_kv_predictions(cores.clone(), out);
    render_tokenizer(cores, out);
}

/// `smg_prefix_hash_policy_branch_total` and `smg_consistent_hashing_policy_branch_total`, each
/// with SMG's five branches (zero under the other policies).
fn render_hash_branches<'a>(
    cores: impl IntoIterator<Item = &'a PolicyMetrics> + Clone,
    out: &mut String,
) {
    let families = [
        (
            "smg_prefix_hash_policy_branch_total",
            "Prefix-hash routing decisions by branch",
            HashBranch::PREFIX_HASH,
        ),
        (
            "smg_consistent_hashing_policy_branch_total",
            "Consistent-hashing routing decisions by branch",
            HashBranch::CONSISTENT_HASHING,
        ),
    ];
    for (name, help, branches) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for branch in branches {
            let total: u64 = cores
                .clone()
                .into_iter()
                .map(|c| c.inner.hash_branch[branch as usize].load(Relaxed))
                .sum();
            let _ = writeln!(out, "{name}{{branch=\"{}\"}} {total}", branch.label());
        }
    }
}

/// `kvgate_kv_event_predictions_total{basis}`, summed over `cores`.
fn render_kv_predictions<'a>(cores: impl IntoIterator<Item = &'a PolicyMetrics>, out: &mut String) {
    let (confirmed, provisional) = cores.into_iter().fold((0, 0), |(c, p), core| {
        let (cc, cp) = core.kv_predictions();
        (c + cc, p + cp)
    });
    let name = "kvgate_kv_event_predictions_total";
    let _ = writeln!(
        out,
        "# HELP {name} Requests routed to a worker the KV-event index predicted holds a prefix of \
         them, by basis: confirmed (its engine reported every block counted) or provisional \
         (some were only in flight to it)"
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name}{{basis=\"confirmed\"}} {confirmed}");
    let _ = writeln!(out, "{name}{{basis=\"provisional\"}} {provisional}");
}

/// The tokenization families, summed over `cores`.
fn render_tokenizer<'a>(
    cores: impl IntoIterator<Item = &'a PolicyMetrics> + Clone,
    out: &mut String,
) {
    let mut families: Vec<(&str, &str, &str, u64)> = TOKENIZER_FAMILIES
        .iter()
        .enumerate()
        .map(|(i, &(name, kind, help))| {
            let total = cores
                .clone()
                .into_iter()
                .map(|c| c.inner.tokenizer[i].load(Relaxed))
                .sum();
            (name, kind, help, total)
        })
        .collect();
    let (offloaded, refused) = cores.into_iter().fold((0, 0), |(o, r), c| {
        let (co, cr) = c.tokenize_offloads();
        (o + co, r + cr)
    });
    families.push((
        "kvgate_tokenize_offloaded_total",
        "counter",
        "Cold tokenizations run on the tokenizer pool",
        offloaded,
    ));
    families.push((
        "kvgate_tokenize_refused_total",
        "counter",
        "Cold tokenizations the full pool refused (routed on text)",
        refused,
    ));
    for (name, kind, help, total) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {total}");
    }
}
