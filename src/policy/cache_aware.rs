//! The `cache_aware` decision flow of the spec ("Routing Algorithm", steps 1–7) as one pure
//! function over a snapshot: [`select`]. Inputs: the index lookup (already done by the caller),
//! the worker slots, the knobs and a seeded RNG. No I/O, no `.await`, no allocation: candidate
//! groups live in fixed arrays of [`MATCH_TENANTS_MAX`] entries.

use fastrand::Rng;

use super::{Branch, CacheAwareConfig, Decision, Fleet, SpillGate, WorkerStatus};
use crate::ids::WorkerId;
use crate::index::TreeMatch;
use crate::limits::MATCH_TENANTS_MAX;

/// Routes one request. `tree` is the lookup result in the request's index (string or token tree
/// under its model and partition), `None` when the request has no key to look up;
/// `request_tokens` its prompt tokens (the dispatch credit; estimated for text). Returns `None`
/// only when no worker is eligible (the gateway answers 503). Step 7 (record) is the caller's:
/// it inserts the request's key for `Decision::worker` whatever the branch, so a spill target or a
/// KV-pressure pick becomes an additional holder.
pub fn select(
    tree: Option<&TreeMatch>,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    request_tokens: u64,
    rng: &mut Rng,
) -> Option<Decision> {
    // 1. Eligible workers; their mean in-flight count is the spill gate's baseline.
    let fleet = Fleet::scan(workers);
    if fleet.eligible == 0 {
        return None;
    }
    let all_slots = 0..workers.len();
    let decide = |branch, slot: usize, match_ratio| Decision {
        worker: worker_id(slot),
        branch,
        match_ratio,
    };

    // 2. KV pressure: skip affinity, lowest expected wait.
    if fleet.kv_pressure(config) {
        let slot = fleet.lowest_wait(workers, all_slots, rng)?;
        return Some(decide(Branch::KvPressure, slot, 0.0));
    }

    // 3. Affinity candidates: the eligible tenants of the matched node, above the threshold.
    let Some(tree) = tree else {
        let slot = fleet.lowest_wait(workers, all_slots, rng)?;
        return Some(decide(Branch::FirstHealthyFallback, slot, 0.0));
    };
    let match_ratio = tree.ratio();
    if match_ratio <= config.cache_threshold {
        // 6. Cache miss: lowest expected wait, or about as quick and given less new prefix
        //    lately (the requests that will share this one follow it).
        let slot = fleet.lowest_wait_for_new_prefix(workers, request_tokens, rng)?;
        return Some(decide(Branch::ExpectedWaitFallback, slot, match_ratio));
    }
    let mut candidates = Candidates::eligible_tenants(tree, workers);

    // 4. Rank: overlap decay, then the top (or temperature-sampled) score group.
    candidates.apply_overlap_decay(workers, config, tree.request_len);
    let group = candidates.score_group(config.selection_temperature, rng);

    // 5. Spill gate: the least-waiting candidate that is not hot; else spill to the least-waiting
    //    eligible worker that is not hot; else to the least-waiting eligible worker.
    let gate = SpillGate::new(config, fleet.in_flight_mean);
    let cool = |slot: &usize| !gate.is_hot(&workers[*slot]);
    if let Some(slot) = fleet.lowest_wait(workers, group.slots().filter(cool), rng) {
        return Some(decide(Branch::TreeMatch, slot, match_ratio));
    }
    let slot = fleet
        .lowest_wait(workers, all_slots.clone().filter(cool), rng)
        .or_else(|| fleet.lowest_wait(workers, all_slots, rng))?;
    Some(decide(Branch::Spill, slot, match_ratio))
}

fn worker_id(slot: usize) -> WorkerId {
    // Slots come from iterating a slice indexed by `WorkerId`, so they fit in a u16.
    WorkerId(u16::try_from(slot).unwrap_or(u16::MAX))
}

/// Affinity candidates with their scores, at most [`MATCH_TENANTS_MAX`].
#[derive(Clone, Copy, Debug)]
struct Candidates {
    slots: [usize; MATCH_TENANTS_MAX],
    scores: [f64; MATCH_TENANTS_MAX],
    len: usize,
}

impl Candidates {
    /// Every tenant of the matched node holds the matched prefix: all start with score 1.
    fn eligible_tenants(tree: &TreeMatch, workers: &[WorkerStatus]) -> Candidates {
        let mut candidates = Candidates {
            slots: [0; MATCH_TENANTS_MAX],
            scores: [1.0; MATCH_TENANTS_MAX],
            len: 0,
        };
        for tenant in tree.tenants() {
            let slot = tenant.index();
            let eligible = workers.get(slot).is_some_and(|w| w.eligible);
            let duplicate = candidates.slots[..candidates.len].contains(&slot);
            if eligible && !duplicate && candidates.len < MATCH_TENANTS_MAX {
                candidates.slots[candidates.len] = slot;
                candidates.len += 1;
            }
        }
        candidates
    }

    fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.slots[..self.len].iter().copied()
    }

    /// `--overlap-decay`: divide a candidate's score by `1 + decay * x`, where `x` is its waiting
    /// prefill backlog above the least-backlogged reporting candidate, in pages, per page of this
    /// request ("how many of this request's prefills is it behind by"). Candidates without a load
    /// report are never decayed.
    fn apply_overlap_decay(
        &mut self,
        workers: &[WorkerStatus],
        config: &CacheAwareConfig,
        request_len: u32,
    ) {
        if config.overlap_decay <= 0.0 {
            return;
        }
        let backlog = |slot: usize| workers[slot].load.map(|l| l.waiting_uncached_tokens);
        let Some(floor) = self.slots().filter_map(backlog).min() else {
            return;
        };
        let block_size = f64::from(config.block_size.max(1));
        let request_pages = (f64::from(request_len) / block_size).floor().max(1.0);
        for i in 0..self.len {
            if let Some(tokens) = backlog(self.slots[i]) {
                let excess_pages = (tokens - floor) as f64 / block_size;
                self.scores[i] /= 1.0 + config.overlap_decay * excess_pages / request_pages;
            }
        }
    }

    /// The top-scoring group; with a temperature above 0, the group of a softmax-sampled candidate
    /// (over min-max normalized scores, so the temperature is scale-free).
    fn score_group(&self, temperature: f64, rng: &mut Rng) -> Candidates {
        let scores = &self.scores[..self.len];
        let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let chosen = if temperature > 0.0 && self.len > 1 {
            let low = scores.iter().copied().fold(f64::INFINITY, f64::min);
            sample_softmax(scores, low, top, temperature, rng)
        } else {
            top
        };
        let mut group = Candidates { len: 0, ..*self };
        for i in 0..self.len {
            if self.scores[i] == chosen {
                group.slots[group.len] = self.slots[i];
                group.scores[group.len] = self.scores[i];
                group.len += 1;
            }
        }
        group
    }
}

/// Draws one score with weight `exp((normalized - 1) / temperature)`; uniform when all are equal.
fn sample_softmax(scores: &[f64], low: f64, top: f64, temperature: f64, rng: &mut Rng) -> f64 {
    let range = top - low;
    if range <= 0.0 {
        return top;
    }
    let weight = |s: f64| (((s - low) / range - 1.0) / temperature).exp();
    let total: f64 = scores.iter().map(|&s| weight(s)).sum();
    let mut draw = rng.f64() * total;
    for &score in scores {
        draw -= weight(score);
        if draw <= 0.0 {
            return score;
        }
    }
    top
}
