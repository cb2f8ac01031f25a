//! The policies other than `cache_aware`, with SMG's names: `random`, `round_robin`,
//! `power_of_two`, `least_load` (the expected-wait scorer), `prefix_hash` (the prompt's head on a
//! consistent-hash ring with bounded load) and `consistent_hashing` (`x-smg-target-worker`, else
//! `x-smg-routing-key` on the ring). Each returns `None` only when no worker is eligible.

use fastrand::Rng;
use xxhash_rust::xxh3::Xxh3;

use super::{Fleet, ScorerConfig, WorkerRing, WorkerStatus};
use crate::ids::WorkerId;
use crate::request::{PartitionNamespace, RoutingKey};

/// prefix_hash on text: characters hashed per configured token (a common chars-per-token figure
/// for English BPE vocabularies), so `--prefix-token-count` means about the same for text.
pub const PREFIX_HASH_CHARS_PER_TOKEN: usize = 4;

fn slot_id(slot: usize) -> WorkerId {
    WorkerId(u16::try_from(slot).unwrap_or(u16::MAX))
}

fn eligible(workers: &[WorkerStatus], id: WorkerId) -> bool {
    workers.get(id.index()).is_some_and(|w| w.eligible)
}

/// A uniformly random eligible worker.
pub fn random(workers: &[WorkerStatus], rng: &mut Rng) -> Option<WorkerId> {
    let mut pick = None;
    let eligible_slots = workers.iter().enumerate().filter(|(_, w)| w.eligible);
    for (seen, (slot, _)) in (1u32..).zip(eligible_slots) {
        // Reservoir sampling: the k-th eligible worker replaces the pick with probability 1/k.
        if rng.u32(..seen) == 0 {
            pick = Some(slot);
        }
    }
    pick.map(slot_id)
}

/// The next eligible worker at or after `cursor` (which advances past it).
pub fn round_robin(workers: &[WorkerStatus], cursor: &mut usize) -> Option<WorkerId> {
    let n = workers.len();
    for step in 0..n {
        let slot = (*cursor + step) % n;
        if workers[slot].eligible {
            *cursor = (slot + 1) % n;
            return Some(slot_id(slot));
        }
    }
    None
}

/// The lower expected wait of two distinct random eligible workers.
pub fn power_of_two(workers: &[WorkerStatus], rng: &mut Rng) -> Option<WorkerId> {
    // Reservoir sample of size two.
    let (mut first, mut second) = (None, None);
    let eligible_slots = workers.iter().enumerate().filter(|(_, w)| w.eligible);
    for (seen, (slot, _)) in (1u32..).zip(eligible_slots) {
        match seen {
            1 => first = Some(slot),
            2 => second = Some(slot),
            _ => match rng.u32(..seen) {
                0 => first = Some(slot),
                1 => second = Some(slot),
                _ => {}
            },
        }
    }
    let fleet = Fleet::scan(workers);
    fleet
        .lowest_wait(workers, first.into_iter().chain(second), rng)
        .map(slot_id)
}

/// The lowest expected wait among eligible workers under `scorer`, ties at random. With
/// `--least-load-max-waiting-requests`, workers whose waiting requests reach it are passed over
/// while another eligible worker is below it.
pub fn least_load(
    workers: &[WorkerStatus],
    scorer: &ScorerConfig,
    rng: &mut Rng,
) -> Option<WorkerId> {
    let fleet = Fleet::scan_with(workers, scorer);
    if let Some(cap) = scorer.max_waiting_requests {
        let below_cap = |slot: &usize| waiting_requests(&workers[*slot]) < cap;
        let pick = fleet.lowest_wait(workers, (0..workers.len()).filter(below_cap), rng);
        if pick.is_some() {
            return pick.map(slot_id);
        }
    }
    fleet
        .lowest_wait(workers, 0..workers.len(), rng)
        .map(slot_id)
}

/// A worker's waiting requests as least_load's cap counts them: the reported queue plus this
/// gateway's requests in flight beyond what the report shows running or queued (the
/// dispatches since the report); without a report, every request in flight.
fn waiting_requests(worker: &WorkerStatus) -> u32 {
    match worker.load {
        Some(load) => {
            let reported = load.running.saturating_add(load.waiting);
            load.waiting
                .saturating_add(worker.in_flight.saturating_sub(reported))
        }
        None => worker.in_flight,
    }
}

/// The hash of the request's head: the first `prefix_tokens` tokens, or with `boundaries` the
/// head up to the deepest boundary the request reaches (the whole request when it reaches none).
/// Text hashes its first `prefix_tokens * 4` characters. Keyed by partition namespace.
pub fn prefix_hash_key(
    key: RoutingKey<'_>,
    namespace: PartitionNamespace,
    prefix_tokens: u32,
    boundaries: &[u32],
) -> u64 {
    let mut hasher = Xxh3::with_seed(namespace.0);
    let head_len = |len: usize| match boundaries.iter().rev().find(|&&b| b as usize <= len) {
        Some(&b) => b as usize,
        None if boundaries.is_empty() => len.min(prefix_tokens as usize),
        None => len,
    };
    match key {
        RoutingKey::Tokens(tokens) => {
            hasher.update(b"t");
            for token in &tokens[..head_len(tokens.len())] {
                hasher.update(&token.to_le_bytes());
            }
        }
        RoutingKey::Text(text) => {
            hasher.update(b"s");
            let chars = head_len(text.len().div_ceil(PREFIX_HASH_CHARS_PER_TOKEN));
            let end = text
                .char_indices()
                .nth(chars.saturating_mul(PREFIX_HASH_CHARS_PER_TOKEN))
                .map_or(text.len(), |(i, _)| i);
            hasher.update(&text.as_bytes()[..end]);
        }
    }
    hasher.digest()
}

/// How prefix_hash decides a worker is overloaded (`--prefix-hash-load-factor`,
/// `--prefix-hash-balance-abs-threshold`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixHashBalance {
    /// The bounded-load factor.
    pub load_factor: f64,
    /// Requests above the fleet mean a worker must also be.
    pub abs_threshold: f64,
}

/// Which way a hashing policy decided, as SMG counts it (`smg_prefix_hash_policy_branch_total`
/// and `smg_consistent_hashing_policy_branch_total`, label `branch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum HashBranch {
    /// No eligible worker (both policies).
    NoHealthyWorkers,
    /// prefix_hash: the request had no prompt to hash (SMG's; kvgate hashes text too, so only
    /// an empty prompt counts here, and it still routes).
    NoTokens,
    /// prefix_hash: the key's owner on the ring took it.
    RingHit,
    /// prefix_hash: the owner was overloaded; the next acceptable worker on the ring took it.
    LoadBalanceWalk,
    /// prefix_hash: every worker was overloaded; the least loaded took it.
    FallbackLeastLoad,
    /// consistent_hashing: the `x-smg-target-worker` worker took it.
    TargetWorkerHit,
    /// consistent_hashing: `x-smg-target-worker` named no eligible worker (kvgate then goes on
    /// to the routing key or a random worker, where SMG refuses).
    TargetWorkerMiss,
    /// consistent_hashing: the routing key's owner on the ring took it.
    RoutingKeyHit,
    /// consistent_hashing: no key: a random eligible worker.
    RandomFallback,
}

impl HashBranch {
    /// Every branch, in discriminant order.
    pub const ALL: [HashBranch; 9] = [
        HashBranch::NoHealthyWorkers,
        HashBranch::NoTokens,
        HashBranch::RingHit,
        HashBranch::LoadBalanceWalk,
        HashBranch::FallbackLeastLoad,
        HashBranch::TargetWorkerHit,
        HashBranch::TargetWorkerMiss,
        HashBranch::RoutingKeyHit,
        HashBranch::RandomFallback,
    ];
    /// prefix_hash's branches (SMG's label set).
    pub const PREFIX_HASH: [HashBranch; 5] = [
        HashBranch::NoHealthyWorkers,
        HashBranch::NoTokens,
        HashBranch::RingHit,
        HashBranch::LoadBalanceWalk,
        HashBranch::FallbackLeastLoad,
    ];
    /// consistent_hashing's branches (SMG's label set).
    pub const CONSISTENT_HASHING: [HashBranch; 5] = [
        HashBranch::NoHealthyWorkers,
        HashBranch::TargetWorkerHit,
        HashBranch::TargetWorkerMiss,
        HashBranch::RoutingKeyHit,
        HashBranch::RandomFallback,
    ];

    /// SMG's label value.
    pub fn label(self) -> &'static str {
        match self {
            HashBranch::NoHealthyWorkers => "no_healthy_workers",
            HashBranch::NoTokens => "no_tokens",
            HashBranch::RingHit => "ring_hit",
            HashBranch::LoadBalanceWalk => "load_balance_walk",
            HashBranch::FallbackLeastLoad => "fallback_least_load",
            HashBranch::TargetWorkerHit => "target_worker_hit",
            HashBranch::TargetWorkerMiss => "target_worker_miss",
            HashBranch::RoutingKeyHit => "routing_key_hit",
            HashBranch::RandomFallback => "random_fallback",
        }
    }
}

/// `prefix_hash`: the key's owner on the ring, skipping overloaded workers: at or above the
/// bounded-load cap `ceil(load_factor * (in-flight total + 1) / eligible)` and at least
/// `abs_threshold` requests above the fleet mean (both, as SMG's gate).
pub fn prefix_hash(
    key_hash: u64,
    ring: &WorkerRing,
    workers: &[WorkerStatus],
    balance: PrefixHashBalance,
    rng: &mut Rng,
) -> Option<WorkerId> {
    prefix_hash_branch(key_hash, ring, workers, balance, rng).0
}

/// [`prefix_hash`] and the branch it took.
pub fn prefix_hash_branch(
    key_hash: u64,
    ring: &WorkerRing,
    workers: &[WorkerStatus],
    balance: PrefixHashBalance,
    rng: &mut Rng,
) -> (Option<WorkerId>, HashBranch) {
    let fleet = Fleet::scan(workers);
    if fleet.eligible == 0 {
        return (None, HashBranch::NoHealthyWorkers);
    }
    let total = fleet.in_flight_mean * f64::from(fleet.eligible);
    let cap = (balance.load_factor * (total + 1.0) / f64::from(fleet.eligible)).ceil();
    let abs_limit = fleet.in_flight_mean + balance.abs_threshold;
    // The first eligible worker met is the key's owner; the walk passes it when overloaded.
    let mut owner_passed = false;
    let not_overloaded = |id: WorkerId| {
        eligible(workers, id) && {
            let in_flight = f64::from(workers[id.index()].in_flight);
            let takes = in_flight < cap || in_flight < abs_limit;
            owner_passed |= !takes;
            takes
        }
    };
    match ring.walk(key_hash, not_overloaded) {
        Some(id) if owner_passed => (Some(id), HashBranch::LoadBalanceWalk),
        Some(id) => (Some(id), HashBranch::RingHit),
        None => {
            let least = least_load(workers, &ScorerConfig::BUILT_IN, rng);
            (least, HashBranch::FallbackLeastLoad)
        }
    }
}

/// `consistent_hashing`: the `x-smg-target-worker` worker when it is eligible; else the
/// `x-smg-routing-key` owner on the ring (the next eligible point); else a random worker.
pub fn consistent_hashing(
    target_worker: Option<&str>,
    routing_key_hash: Option<u64>,
    ring: &WorkerRing,
    workers: &[WorkerStatus],
    rng: &mut Rng,
) -> Option<WorkerId> {
    consistent_hashing_branch(target_worker, routing_key_hash, ring, workers, rng).0
}

/// [`consistent_hashing`] and the branch it took (a target that missed counts as the miss,
/// whatever then took the request).
pub fn consistent_hashing_branch(
    target_worker: Option<&str>,
    routing_key_hash: Option<u64>,
    ring: &WorkerRing,
    workers: &[WorkerStatus],
    rng: &mut Rng,
) -> (Option<WorkerId>, HashBranch) {
    let target = target_worker.map(|url| ring.find_url(url).filter(|&id| eligible(workers, id)));
    if let Some(Some(id)) = target {
        return (Some(id), HashBranch::TargetWorkerHit);
    }
    let keyed = routing_key_hash.and_then(|hash| ring.walk(hash, |id| eligible(workers, id)));
    let (picked, branch) = match keyed {
        Some(id) => (Some(id), HashBranch::RoutingKeyHit),
        None => (random(workers, rng), HashBranch::RandomFallback),
    };
    match (picked, target) {
        (None, _) => (None, HashBranch::NoHealthyWorkers),
        (Some(id), Some(None)) => (Some(id), HashBranch::TargetWorkerMiss),
        (Some(id), _) => (Some(id), branch),
    }
}
