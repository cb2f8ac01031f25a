//! The `cache_aware` decision flow of the spec ("Routing Algorithm", steps 1–7) as one pure
//! function over a snapshot: [`select`]. Inputs: what the index knows of the request's prefix
//! ([`Affinity`]: a tree match, the hash index's holders, or the KV-event index's), the worker
//! slots, the knobs and a seeded RNG. No I/O, no `.await`, no allocation: candidate groups live
//! in fixed arrays (`MATCH_TENANTS_MAX` entries for the trees and the hash index,
//! `KV_EVENT_WORKERS_MAX` for the KV-event index).

use fastrand::Rng;

use super::expected_wait::LowestPick;
use super::{Branch, CacheAwareConfig, Decision, Fleet, SpillGate, WorkerStatus};
use crate::ids::WorkerId;
use crate::index::hash::HeadMatch;
use crate::index::kv::BlockMatch;
use crate::index::TreeMatch;
use crate::limits::{KV_EVENT_WORKERS_MAX, MATCH_TENANTS_MAX};

/// What the index knows of a request's prefix: step 3's input.
#[derive(Clone, Copy, Debug)]
pub enum Affinity<'a> {
    /// Nothing was looked up (the request has no key): load-balanced.
    None,
    /// A string- or token-tree match.
    Tree(&'a TreeMatch),
    /// The hash index's live holders of each head, deepest first (no head: no token IDs).
    Heads(&'a HeadMatch),
    /// Hash mode, token IDs shorter than the smallest boundary: load-balanced.
    Short,
    /// The KV-event index's holders of the request's leading blocks.
    Blocks(&'a BlockMatch),
}

impl<'a> From<Option<&'a TreeMatch>> for Affinity<'a> {
    fn from(tree: Option<&'a TreeMatch>) -> Self {
        tree.map_or(Affinity::None, Affinity::Tree)
    }
}

/// The size of a request, as a decision weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSize {
    /// Prompt tokens (the dispatch credit; estimated for text).
    pub prompt_tokens: u64,
    /// The most tokens it may generate, when it says (`max_tokens` and its kin).
    pub output_tokens: Option<u32>,
}

impl From<u64> for RequestSize {
    /// A prompt of `prompt_tokens` with no output budget.
    fn from(prompt_tokens: u64) -> RequestSize {
        RequestSize {
            prompt_tokens,
            output_tokens: None,
        }
    }
}

/// Routes one request. `affinity` is what its index knows (looked up by the caller under the
/// request's model and partition); `request` its size. Returns `None` only when no worker is eligible (the gateway answers
/// 503). Step 7 (record) is the caller's: it records the request for `Decision::worker` whatever
/// the branch, so a spill target or a KV-pressure pick becomes an additional holder.
pub fn select<'a>(
    affinity: impl Into<Affinity<'a>>,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    request: impl Into<RequestSize>,
    rng: &mut Rng,
) -> Option<Decision> {
    let request = request.into();
    let request_tokens = request.prompt_tokens;
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
        head_tokens: 0,
    };

    // 2. KV pressure: skip affinity, lowest expected wait.
    if fleet.kv_pressure(config) {
        let slot = fleet.lowest_wait(workers, all_slots, rng)?;
        return Some(decide(Branch::KvPressure, slot, 0.0));
    }

    // 3. Affinity candidates: the eligible tenants of the matched node, above the threshold;
    //    or the eligible live holders of the deepest head that has any.
    let (candidates, match_ratio, head_tokens) = match affinity.into() {
        Affinity::None => {
            let slot = fleet.lowest_wait(workers, all_slots, rng)?;
            return Some(decide(Branch::FirstHealthyFallback, slot, 0.0));
        }
        Affinity::Short => {
            let slot = fleet.lowest_wait(workers, all_slots, rng)?;
            return Some(decide(Branch::ShortRequest, slot, 0.0));
        }
        Affinity::Tree(tree) => {
            let match_ratio = tree.ratio();
            if match_ratio <= config.cache_threshold {
                // 6. Cache miss: lowest expected wait, or about as quick and given less new
                //    prefix lately (the requests that will share this one follow it).
                let slot = fleet.lowest_wait_for_new_prefix(workers, request_tokens, rng)?;
                return Some(decide(Branch::ExpectedWaitFallback, slot, match_ratio));
            }
            let candidates = Candidates::<MATCH_TENANTS_MAX>::of(tree.tenants(), workers);
            let mut candidates = match bounded_load(candidates, &fleet, workers, config, rng) {
                Ok(within) => within,
                Err(slot) => return Some(decide(Branch::BoundedLoad, slot, match_ratio)),
            };
            // 4. Rank: overlap decay, then the top (or temperature-sampled) score group.
            candidates.apply_overlap_decay(workers, config, tree.request_len);
            let group = candidates.score_group(config.selection_temperature, rng);
            (group, match_ratio, 0)
        }
        Affinity::Blocks(blocks) => {
            // Every eligible worker holding the first block, scored by its leading blocks; no
            // threshold.
            let mut candidates = Candidates::<KV_EVENT_WORKERS_MAX>::of_blocks(blocks, workers);
            if candidates.len == 0 {
                // 6. No eligible worker holds the first block: a miss.
                let slot = fleet.lowest_wait_for_new_prefix(workers, request_tokens, rng)?;
                return Some(decide(Branch::EventFallback, slot, 0.0));
            }
            // The match ratio of the decision log: the best holder's share of the request.
            let held = blocks.holders().first().map_or(0, |(_, held)| *held);
            let ratio = f64::from(held) / f64::from(blocks.request_blocks.max(1));
            candidates = match bounded_load(candidates, &fleet, workers, config, rng) {
                Ok(within) => within,
                Err(slot) => return Some(decide(Branch::BoundedLoad, slot, ratio)),
            };
            let request_len = blocks.request_blocks.saturating_mul(blocks.block_size);
            candidates.apply_overlap_decay(workers, config, request_len);
            let group = candidates.score_group(config.selection_temperature, rng);
            let block_size = u64::from(blocks.block_size);
            let cached = |slot: usize| {
                let held = blocks.holders().iter().find(|(w, _)| w.index() == slot);
                held.map_or(0, |(_, held)| u64::from(*held) * block_size)
            };
            let decide = |branch, slot| decide(branch, slot, ratio);
            let branches = (Branch::EventOverlap, Branch::Replicate, Branch::EventSpill);
            if let Some(decision) = load_aware_gate(
                &fleet,
                &group,
                workers,
                config,
                (request, cached),
                rng,
                decide,
                branches,
            ) {
                return Some(decision);
            }
            return Some(spill_gate(
                &fleet,
                group,
                workers,
                config,
                rng,
                decide,
                (Branch::EventOverlap, Branch::EventSpill),
            ));
        }
        Affinity::Heads(heads) => {
            let deepest = heads.hits().iter().find_map(|hit| {
                let candidates = Candidates::<MATCH_TENANTS_MAX>::of(hit.holders(), workers);
                (candidates.len > 0).then_some((candidates, hit.head.tokens))
            });
            let Some((candidates, head_tokens)) = deepest else {
                // 6. No head has a live eligible holder: a miss.
                let slot = fleet.lowest_wait_for_new_prefix(workers, request_tokens, rng)?;
                return Some(decide(Branch::ExpectedWaitFallback, slot, 0.0));
            };
            match bounded_load(candidates, &fleet, workers, config, rng) {
                Ok(within) => (within, 0.0, head_tokens),
                Err(slot) => {
                    let decision = decide(Branch::BoundedLoad, slot, 0.0);
                    return Some(Decision {
                        head_tokens,
                        ..decision
                    });
                }
            }
        }
    };
    let (hit, spill) = match head_tokens {
        0 => (Branch::TreeMatch, Branch::Spill),
        _ => (Branch::HashHit, Branch::HashSpill),
    };
    let decide = |branch, slot| Decision {
        head_tokens,
        ..decide(branch, slot, match_ratio)
    };
    // Every candidate holds the same prefix: the matched share of the request (the tree's match
    // is in characters for text; its ratio carries over to the token estimate), or the deepest
    // held head.
    let cached_tokens = match head_tokens {
        0 => (match_ratio * request_tokens as f64) as u64,
        tokens => u64::from(tokens).min(request_tokens),
    };
    if let Some(decision) = load_aware_gate(
        &fleet,
        &candidates,
        workers,
        config,
        (request, |_| cached_tokens),
        rng,
        decide,
        (hit, Branch::Replicate, spill),
    ) {
        return Some(decision);
    }
    Some(spill_gate(
        &fleet,
        candidates,
        workers,
        config,
        rng,
        decide,
        (hit, spill),
    ))
}

/// 5 under `--bounded-load-margin` (before the spill gate or the load-aware gate): the
/// candidates whose dispatched count is at most the margin above the fleet's mean after taking
/// this request, narrowed to the least-sent of them (`Ok`; the gate that follows picks among
/// them). None within it: the least-sent eligible worker below the mean takes the request
/// (`Err(slot)`), recorded at step 7 as a holder, if it has no more requests in flight than the
/// least-busy candidate or the fleet mean; else the candidates as they were (`Ok`), so a worker
/// that fell behind (one back from a failure) catches up at the others' concurrency, never by
/// drawing every request at once.
///
/// The least-sent holder, not the least-waiting, is what keeps the replicas few: in the count
/// model of the demo (`scripts/demo-imbalance-bound.py`, margin 8) a uniform choice among
/// holders within the bound made 39 replicas where the least-sent made 13, for the same
/// balance. Off (`Ok` unchanged) without the flag.
fn bounded_load<const N: usize>(
    candidates: Candidates<N>,
    fleet: &Fleet,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    rng: &mut Rng,
) -> Result<Candidates<N>, usize> {
    let Some(margin) = config.bounded_load_margin else {
        return Ok(candidates);
    };
    if candidates.len == 0 {
        return Ok(candidates);
    }
    let eligible = || workers.iter().enumerate().filter(|(_, w)| w.eligible);
    let sum: f64 = eligible().map(|(_, w)| w.dispatched as f64).sum();
    let mean = sum / f64::from(fleet.eligible.max(1));
    let limit = mean + f64::from(margin);
    let count = |slot: usize| workers[slot].dispatched;
    let within = |slot: &usize| count(*slot) as f64 + 1.0 <= limit;
    if let Some(least) = candidates.slots().filter(within).map(count).min() {
        let mut narrowed = Candidates {
            len: 0,
            ..candidates
        };
        for i in 0..candidates.len {
            if count(candidates.slots[i]) == least {
                narrowed.slots[narrowed.len] = candidates.slots[i];
                narrowed.scores[narrowed.len] = candidates.scores[i];
                narrowed.len += 1;
            }
        }
        return Ok(narrowed);
    }
    let least_busy = candidates.slots().map(|s| workers[s].in_flight).min();
    let busy_limit = f64::from(least_busy.unwrap_or(0)).max(fleet.in_flight_mean);
    let mut target = LowestPick::default();
    for (slot, worker) in eligible() {
        let below = (worker.dispatched as f64) < mean;
        if below && f64::from(worker.in_flight) <= busy_limit {
            target.offer(slot, (worker.dispatched, fleet.expected_wait(worker)), rng);
        }
    }
    match target.slot() {
        Some(slot) => Err(slot),
        None => Ok(candidates),
    }
}

/// 5. Spill gate: the least-waiting candidate that is not hot (`hit`); else spill to the
///    least-waiting eligible worker that is not hot, else to the least-waiting eligible worker
///    (`spill`). `fleet` has an eligible worker, so there is always a decision.
fn spill_gate<const N: usize>(
    fleet: &Fleet,
    candidates: Candidates<N>,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    rng: &mut Rng,
    decide: impl Fn(Branch, usize) -> Decision,
    (hit, spill): (Branch, Branch),
) -> Decision {
    let gate = SpillGate::new(config, fleet.in_flight_mean);
    let cool = |slot: &usize| !gate.is_hot(&workers[*slot]);
    if let Some(slot) = fleet.lowest_wait(workers, candidates.slots().filter(cool), rng) {
        return decide(hit, slot);
    }
    let all_slots = 0..workers.len();
    let slot = fleet
        .lowest_wait(workers, all_slots.clone().filter(cool), rng)
        .or_else(|| fleet.lowest_wait(workers, all_slots, rng))
        .unwrap_or(0);
    decide(spill, slot)
}

/// 5 under `--load-aware-affinity`: the candidate that would complete the request at the
/// lowest cost ([`Fleet::completion_cost`], with its cached tokens from `cached`) keeps it
/// (`hit`) unless an eligible non-holder would complete it at a lower cost even prefilling the
/// whole prompt and caching a second copy of it ([`Fleet::replica_cost`]): then that one takes it (`replicate`) and, recorded at step 7, becomes a holder,
/// so a hot prefix spreads before its holders' queues and batches grow. Both costs grow with
/// the batch they join, so the second holder draws requests until the two cost the same, and
/// a third is added only when both are a replica's cost dearer than it. No eligible candidate:
/// the cheapest non-holder (`spill`). Ties: fewer requests in flight, then uniformly at random.
///
/// The batch term weighs each request in flight by the KV tokens a running request holds in the
/// engines' reports; until a report shows one (the first `--load-monitor-interval` after start,
/// or an idle fleet), by this request's tokens: no prefix sharing is known yet, which spreads a
/// burst of one prefix early rather than letting its first holder's batch grow for a whole
/// report interval. `None` (the caller runs the spill gate) when the mode is off.
#[allow(clippy::too_many_arguments)]
fn load_aware_gate<const N: usize>(
    fleet: &Fleet,
    candidates: &Candidates<N>,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    (request, cached): (RequestSize, impl Fn(usize) -> u64),
    rng: &mut Rng,
    decide: impl Fn(Branch, usize) -> Decision,
    (hit, replicate, spill): (Branch, Branch, Branch),
) -> Option<Decision> {
    if !config.load_aware_affinity {
        return None;
    }
    let request_tokens = request.prompt_tokens;
    let per_request = fleet
        .kv_tokens_per_request()
        .unwrap_or(request_tokens as f64);
    let weight = decode_weight(request.output_tokens);
    let mut holder = LowestPick::default();
    for slot in candidates.slots() {
        let uncached = request_tokens.saturating_sub(cached(slot));
        let worker = &workers[slot];
        let cost = fleet.completion_cost(worker, uncached, per_request, weight);
        holder.offer(slot, (cost, worker.in_flight), rng);
    }
    let mut other = LowestPick::default();
    for (slot, worker) in workers.iter().enumerate() {
        if worker.eligible && !candidates.slots().any(|c| c == slot) {
            let cost = fleet.replica_cost(worker, request_tokens, per_request, weight);
            other.offer(slot, (cost, worker.in_flight), rng);
        }
    }
    Some(match (holder.best(), other.best()) {
        (Some((_, held)), Some((other_slot, other))) if other.0 < held.0 => {
            decide(replicate, other_slot)
        }
        (Some((slot, _)), _) => decide(hit, slot),
        (None, Some((slot, _))) => decide(spill, slot),
        // `fleet` has an eligible worker, so one of the two picks has a slot.
        (None, None) => decide(spill, 0),
    })
}

/// Decode steps over which one KV token costs about what one prefill token costs: the simulated
/// engines' published curve at 1,048,576 KV tokens (a prefill token 15.2 us, a decode step 54 ms
/// more at a full cache: 52 ns per KV token) gives 295; an 8B model on an H100 (about 20 us per
/// prefill token, 128 KB per KV token read at 3.35 TB/s: 39 ns) about 500.
pub const DECODE_STEPS_PER_PREFILL_TOKEN: f64 = 300.0;

/// The most a request's output budget multiplies the decode terms of its cost: a budget far
/// above that many steps is a cap the request will rarely reach, not an expectation.
pub const DECODE_WEIGHT_MAX: f64 = 4.0;

/// How much the decode terms of [`Fleet::completion_cost`] weigh for a request that may generate
/// `output_tokens`, in units of [`DECODE_STEPS_PER_PREFILL_TOKEN`] steps: its own decode and the
/// KV it adds are read that many steps. A request with no budget weighs 1.
fn decode_weight(output_tokens: Option<u32>) -> f64 {
    output_tokens.map_or(1.0, |tokens| {
        (f64::from(tokens) / DECODE_STEPS_PER_PREFILL_TOKEN).min(DECODE_WEIGHT_MAX)
    })
}

fn worker_id(slot: usize) -> WorkerId {
    // Slots come from iterating a slice indexed by `WorkerId`, so they fit in a u16.
    WorkerId(u16::try_from(slot).unwrap_or(u16::MAX))
}

/// Affinity candidates with their scores, at most `N`.
#[derive(Clone, Copy, Debug)]
struct Candidates<const N: usize> {
    slots: [usize; N],
    scores: [f64; N],
    len: usize,
}

impl<const N: usize> Candidates<N> {
    fn empty() -> Self {
        Candidates {
            slots: [0; N],
            scores: [1.0; N],
            len: 0,
        }
    }

    /// The eligible ones of `holders` (every one holds the matched prefix: all start with
    /// score 1).
    fn of(holders: &[WorkerId], workers: &[WorkerStatus]) -> Self {
        let mut candidates = Self::empty();
        for tenant in holders {
            candidates.push(tenant.index(), 1.0, workers);
        }
        candidates
    }

    /// The eligible holders of a request's first block, each scored by its leading blocks.
    fn of_blocks(blocks: &BlockMatch, workers: &[WorkerStatus]) -> Self {
        let mut candidates = Self::empty();
        for &(worker, held) in blocks.holders() {
            candidates.push(worker.index(), f64::from(held), workers);
        }
        candidates
    }

    fn push(&mut self, slot: usize, score: f64, workers: &[WorkerStatus]) {
        let eligible = workers.get(slot).is_some_and(|w| w.eligible);
        let duplicate = self.slots[..self.len].contains(&slot);
        if eligible && !duplicate && self.len < N {
            self.slots[self.len] = slot;
            self.scores[self.len] = score;
            self.len += 1;
        }
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
    fn score_group(&self, temperature: f64, rng: &mut Rng) -> Self {
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
