//! Per-core decision counters: `smg_cache_aware_policy_branch_total{branch}` and the
//! `smg_cache_aware_match_ratio` histogram (buckets 0, 0.1 … 1.0), and their Prometheus text
//! rendering ([`render_prometheus`]), which sums the cores' counters on scrape.
//!
//! Each data core owns one [`PolicyMetrics`] and is its only writer, so an update is a relaxed
//! load and store (no locked read-modify-write); the scraper reads with relaxed loads and may see
//! a decision's branch count before its histogram count, which Prometheus tolerates.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

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
}

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
        .into_iter()
        .map(|c| f64::from_bits(c.inner.ratio_sum_bits.load(Relaxed)))
        .sum();
    let _ = writeln!(out, "smg_cache_aware_match_ratio_sum {sum}");
    let _ = writeln!(out, "smg_cache_aware_match_ratio_count {cumulative}");
}
