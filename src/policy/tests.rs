//! Table-driven tests of the cache_aware decision flow (one or more per spec step, each failing if
//! its step is skipped), the expected-wait scorer, the other policies, flag validation, metrics
//! and the decision log.

use std::sync::Arc;

use clap::Parser;
use fastrand::Rng;

use super::cache_aware::select;
use super::*;
use crate::ids::WorkerId;
use crate::index::TreeMatch;
use crate::limits::MATCH_TENANTS_MAX;
use crate::request::{Endpoint, PartitionNamespace, RoutingHeaders, RoutingKey};
use crate::workers::load::parse_v1_loads;

fn idle(n: usize) -> Vec<WorkerStatus> {
    vec![
        WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        n
    ]
}

fn with_in_flight(counts: &[u32]) -> Vec<WorkerStatus> {
    counts
        .iter()
        .map(|&in_flight| WorkerStatus {
            eligible: true,
            in_flight,
            ..WorkerStatus::default()
        })
        .collect()
}

fn reporting(usage: f64, waiting_uncached_tokens: u64) -> WorkerStatus {
    WorkerStatus {
        eligible: true,
        load: Some(WorkerLoad {
            token_usage: usage,
            waiting_uncached_tokens,
            gen_throughput: 1000.0,
            ..WorkerLoad::default()
        }),
        ..WorkerStatus::default()
    }
}

fn matched(matched_len: u32, request_len: u32, tenants: &[u16]) -> TreeMatch {
    let mut tm = TreeMatch {
        matched_len,
        request_len,
        ..TreeMatch::default()
    };
    for (i, &t) in tenants.iter().take(MATCH_TENANTS_MAX).enumerate() {
        tm.tenants[i] = WorkerId(t);
        tm.tenants_len = (i + 1) as u8;
    }
    tm
}

fn cfg() -> CacheAwareConfig {
    CacheAwareConfig::default()
}

fn decide(
    tree: Option<&TreeMatch>,
    workers: &[WorkerStatus],
    config: &CacheAwareConfig,
    seed: u64,
) -> Decision {
    let tokens = tree.map_or(0, |t| u64::from(t.request_len));
    select(tree, workers, config, tokens, &mut Rng::with_seed(seed)).expect("an eligible worker")
}

/// How often each worker is chosen over `runs` seeds.
fn histogram(runs: u64, workers: &[WorkerStatus], pick: impl Fn(u64) -> WorkerId) -> Vec<u32> {
    let mut counts = vec![0u32; workers.len()];
    for seed in 0..runs {
        counts[pick(seed).index()] += 1;
    }
    counts
}

// ---- Step 1: eligible workers and the fleet baseline ----

#[test]
fn step1_no_eligible_worker_is_no_decision() {
    let mut workers = idle(3);
    workers.iter_mut().for_each(|w| w.eligible = false);
    let tree = matched(10, 10, &[0]);
    assert_eq!(
        select(Some(&tree), &workers, &cfg(), 10, &mut Rng::with_seed(1)),
        None
    );
    assert_eq!(select(None, &[], &cfg(), 0, &mut Rng::with_seed(1)), None);
}

#[test]
fn step1_ineligible_workers_are_never_chosen() {
    let mut workers = idle(4);
    workers[0].eligible = false;
    workers[2].eligible = false;
    let cases = [
        None,
        Some(matched(10, 10, &[0, 2])),
        Some(matched(0, 10, &[])),
    ];
    for tree in cases {
        for seed in 0..50 {
            let d = decide(tree.as_ref(), &workers, &cfg(), seed);
            assert!(matches!(d.worker.0, 1 | 3), "{tree:?} chose {:?}", d.worker);
        }
    }
}

#[test]
fn step1_the_spill_baseline_is_the_mean_over_eligible_workers_only() {
    // Holder 0 has 100 in flight; eligible mean (0, 1) = 50, so with abs 10 it is hot (100 > 75,
    // 100 > 60). Counting the ineligible worker's 400 would make the mean 166 and the holder cool.
    let mut workers = with_in_flight(&[100, 0, 400]);
    workers[2].eligible = false;
    let config = CacheAwareConfig {
        balance_abs_threshold: 10.0,
        ..cfg()
    };
    let d = decide(Some(&matched(10, 10, &[0])), &workers, &config, 7);
    assert_eq!((d.branch, d.worker), (Branch::Spill, WorkerId(1)));
}

// ---- Step 2: KV pressure ----

#[test]
fn step2_kv_pressure_skips_affinity() {
    let overload = CacheAwareConfig {
        overload_token_usage_threshold: Some(0.9),
        ..cfg()
    };
    let balance = CacheAwareConfig {
        balance_token_usage_threshold: Some(0.5),
        ..cfg()
    };
    // (config, workers, expect pressure). Worker 0 holds the prefix; worker 1 waits least.
    let cases: Vec<(CacheAwareConfig, Vec<WorkerStatus>, bool)> = vec![
        (overload, vec![reporting(0.95, 0), reporting(0.1, 0)], true),
        (overload, vec![reporting(0.85, 0), reporting(0.1, 0)], false),
        (balance, vec![reporting(0.7, 0), reporting(0.1, 0)], true),
        (balance, vec![reporting(0.5, 0), reporting(0.1, 0)], false),
        // Only reporting workers are compared: one report, nothing to be imbalanced against.
        (balance, vec![reporting(0.7, 0), idle(1)[0]], false),
        // Off by default.
        (cfg(), vec![reporting(0.99, 0), reporting(0.0, 0)], false),
    ];
    let tree = matched(10, 10, &[0]);
    for (config, workers, pressure) in cases {
        let d = decide(Some(&tree), &workers, &config, 3);
        if pressure {
            assert_eq!(
                (d.branch, d.worker),
                (Branch::KvPressure, WorkerId(1)),
                "{workers:?}"
            );
        } else {
            assert_eq!(
                (d.branch, d.worker),
                (Branch::TreeMatch, WorkerId(0)),
                "{workers:?}"
            );
        }
    }
}

// ---- Step 3: affinity candidates and the threshold ----

#[test]
fn step3_match_ratio_must_exceed_the_threshold() {
    // The holder (worker 0) is busier than worker 1, so only affinity sends requests there.
    let workers = with_in_flight(&[5, 0]);
    let cases = [
        (matched(31, 100, &[0]), Branch::TreeMatch, 0),
        (matched(30, 100, &[0]), Branch::ExpectedWaitFallback, 1),
        (matched(0, 100, &[]), Branch::ExpectedWaitFallback, 1),
        (matched(100, 100, &[0]), Branch::TreeMatch, 0),
    ];
    for (tree, branch, worker) in cases {
        let d = decide(Some(&tree), &workers, &cfg(), 11);
        assert_eq!((d.branch, d.worker), (branch, WorkerId(worker)), "{tree:?}");
        assert!((d.match_ratio - tree.ratio()).abs() < 1e-12);
    }
}

#[test]
fn step3_candidates_are_the_eligible_tenants() {
    let mut workers = with_in_flight(&[0, 9, 9, 0]);
    workers[3].eligible = false;
    // Tenants 1, 2 and 3: 3 is ineligible, so 1 or 2 wins although 0 is idle.
    let tree = matched(50, 60, &[3, 1, 2]);
    let counts = histogram(200, &workers, |seed| {
        decide(Some(&tree), &workers, &cfg(), seed).worker
    });
    assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
    assert!(
        counts[1] > 50 && counts[2] > 50,
        "ties broken at random: {counts:?}"
    );
}

#[test]
fn step3_an_empty_key_is_the_first_healthy_fallback_but_never_slot_order() {
    let workers = idle(4);
    let counts = histogram(400, &workers, |seed| {
        let d = decide(None, &workers, &cfg(), seed);
        assert_eq!(d.branch, Branch::FirstHealthyFallback);
        d.worker
    });
    assert!(counts.iter().all(|&c| c > 50), "{counts:?}");
}

// ---- Step 4: ranking ----

#[test]
fn step4_overlap_decay_prefers_the_holder_with_less_prefill_backlog() {
    // Holder 0: 1,600 queued tokens, empty cache (expected wait 1.6 s). Holder 1: no backlog but
    // 90% KV usage (expected wait about 16 s). Expected wait alone picks 0; decay picks 1.
    let workers = vec![reporting(0.0, 1600), reporting(0.9, 0)];
    let tree = matched(160, 160, &[0, 1]);
    let off = decide(Some(&tree), &workers, &cfg(), 5);
    assert_eq!(off.worker, WorkerId(0));
    let decay = CacheAwareConfig {
        overlap_decay: 1.0,
        ..cfg()
    };
    for seed in 0..20 {
        let d = decide(Some(&tree), &workers, &decay, seed);
        assert_eq!((d.branch, d.worker), (Branch::TreeMatch, WorkerId(1)));
    }
}

#[test]
fn step4_temperature_samples_a_group_weighted_toward_higher_scores() {
    let workers = vec![reporting(0.0, 1600), reporting(0.9, 0)];
    let tree = matched(160, 160, &[0, 1]);
    let sampled = CacheAwareConfig {
        overlap_decay: 1.0,
        selection_temperature: 1.0,
        ..cfg()
    };
    let counts = histogram(400, &workers, |seed| {
        decide(Some(&tree), &workers, &sampled, seed).worker
    });
    assert!(
        counts[0] > 0,
        "the lower score is sometimes sampled: {counts:?}"
    );
    assert!(
        counts[1] > counts[0],
        "weighted toward the higher score: {counts:?}"
    );
    // Without decay every tenant scores the same: temperature changes nothing (spec).
    let temperature_only = CacheAwareConfig {
        selection_temperature: 1.0,
        ..cfg()
    };
    for seed in 0..20 {
        assert_eq!(
            decide(Some(&tree), &workers, &temperature_only, seed).worker,
            WorkerId(0)
        );
    }
}

// ---- Step 5: the spill gate ----

/// In-flight per worker, holders, expected branch, expected worker (`None`: not a holder).
type SpillCase = (&'static [u32], &'static [u16], Branch, Option<u16>);

#[test]
fn step5_spill_gate_needs_both_margins() {
    let cases: [SpillCase; 5] = [
        // Hot: 200 > 1.5 * 50 and 200 > 50 + 64.
        (&[200, 0, 0, 0], &[0], Branch::Spill, None),
        // Relative margin only: 10 > 3.75 but not > 66.5.
        (&[10, 0, 0, 0], &[0], Branch::TreeMatch, Some(0)),
        // Absolute margin only: 300 > 289 but not > 337.5.
        (&[300, 200, 200, 200], &[0], Branch::TreeMatch, Some(0)),
        // One hot holder, one cool: the cool holder, still a tree match.
        (&[200, 10, 0, 0], &[0, 1], Branch::TreeMatch, Some(1)),
        // Every holder hot: spill to a non-holder.
        (&[200, 200, 0, 0, 0, 0, 0, 0], &[0, 1], Branch::Spill, None),
    ];
    for (in_flight, holders, branch, worker) in cases {
        let workers = with_in_flight(in_flight);
        let tree = matched(10, 10, holders);
        let d = decide(Some(&tree), &workers, &cfg(), 13);
        assert_eq!(d.branch, branch, "{in_flight:?}");
        match worker {
            Some(w) => assert_eq!(d.worker, WorkerId(w), "{in_flight:?}"),
            None => assert!(
                !holders.contains(&d.worker.0),
                "{in_flight:?} -> {:?}",
                d.worker
            ),
        }
    }
}

#[test]
fn step5_spill_goes_to_the_least_waiting_cool_worker() {
    let workers = with_in_flight(&[300, 7, 3, 9]);
    let d = decide(Some(&matched(10, 10, &[0])), &workers, &cfg(), 2);
    assert_eq!((d.branch, d.worker), (Branch::Spill, WorkerId(2)));
}

#[test]
fn step5_holders_that_are_all_ineligible_spill() {
    let mut workers = with_in_flight(&[0, 4, 1]);
    workers[0].eligible = false;
    let d = decide(Some(&matched(10, 10, &[0])), &workers, &cfg(), 2);
    assert_eq!((d.branch, d.worker), (Branch::Spill, WorkerId(2)));
}

// ---- Step 6: cache miss ----

#[test]
fn step6_a_miss_goes_to_the_lowest_expected_wait_ties_at_random() {
    let workers = with_in_flight(&[3, 1, 1, 2]);
    let tree = matched(0, 100, &[]);
    let counts = histogram(400, &workers, |seed| {
        let d = decide(Some(&tree), &workers, &cfg(), seed);
        assert_eq!(d.branch, Branch::ExpectedWaitFallback);
        d.worker
    });
    assert_eq!((counts[0], counts[3]), (0, 0), "{counts:?}");
    assert!(
        counts[1] > 120 && counts[2] > 120,
        "uniform ties: {counts:?}"
    );
}

#[test]
fn step6_a_miss_goes_to_the_quickest_worker_given_the_least_new_prefix() {
    // Equal waits: the worker given the fewest new-prefix tokens lately takes this one.
    let mut workers: Vec<WorkerStatus> = (0..4).map(|_| reporting(0.1, 0)).collect();
    for (worker, recent) in workers.iter_mut().zip([50.0, 10.0, 30.0, 20.0]) {
        worker.placed_tokens = recent;
    }
    let tree = matched(0, 1000, &[]);
    for seed in 0..50 {
        let d = decide(Some(&tree), &workers, &cfg(), seed);
        assert_eq!(
            (d.branch, d.worker),
            (Branch::ExpectedWaitFallback, WorkerId(1))
        );
    }
    // Less than an eighth of this request's work (125 tokens) behind the quickest: still
    // preferred.
    workers[1].load = reporting(0.1, 124).load;
    assert_eq!(decide(Some(&tree), &workers, &cfg(), 1).worker, WorkerId(1));
    // That far or more behind: the quickest of the rest, by the same rule.
    workers[1].load = reporting(0.1, 125).load;
    assert_eq!(decide(Some(&tree), &workers, &cfg(), 1).worker, WorkerId(3));
    // The placed tokens never pick a worker that is not eligible.
    workers[3].eligible = false;
    assert_eq!(decide(Some(&tree), &workers, &cfg(), 1).worker, WorkerId(2));
    // Nor one with more requests in flight than both the least-waiting worker and the mean
    // (busier decoding); at or below the mean it still may.
    workers[2].in_flight = 1;
    assert_eq!(decide(Some(&tree), &workers, &cfg(), 1).worker, WorkerId(0));
    workers[1].in_flight = 3;
    assert_eq!(decide(Some(&tree), &workers, &cfg(), 1).worker, WorkerId(2));
}

#[test]
fn step6_a_burst_of_new_prefixes_spreads_despite_uneven_placed_tokens() {
    // Each dispatch credits its worker with the request's tokens (as the gateway does), which
    // moves it out of the window: 16 distinct misses land two on each of 8 workers.
    let mut workers: Vec<WorkerStatus> = (0..8).map(|_| reporting(0.1, 0)).collect();
    for (i, worker) in workers.iter_mut().enumerate() {
        worker.placed_tokens = (i * 7 % 8) as f64;
    }
    let tree = matched(0, 2048, &[]);
    let mut counts = [0u32; 8];
    for seed in 0..16 {
        let d = decide(Some(&tree), &workers, &cfg(), seed);
        counts[d.worker.index()] += 1;
        workers[d.worker.index()].credited_tokens += 2048;
    }
    assert_eq!(counts, [2; 8]);
}

// ---- Step 7 and the data path's loop: record, credit, replicate ----

/// A minimal stand-in for the index and the data path: one prompt family, tenants most recent
/// first, in-flight and token credits applied after every decision (as the gateway does).
struct Burst {
    workers: Vec<WorkerStatus>,
    tenants: Vec<u16>,
    records_land: bool,
}

impl Burst {
    fn dispatch(&mut self, rng: &mut Rng) -> Decision {
        let tree = matched(
            if self.tenants.is_empty() { 0 } else { 64 },
            64,
            &self.tenants,
        );
        let d = select(Some(&tree), &self.workers, &cfg(), 64, rng).expect("eligible");
        let worker = &mut self.workers[d.worker.index()];
        worker.in_flight += 1;
        worker.credited_tokens += 64;
        if self.records_land && !self.tenants.contains(&d.worker.0) {
            self.tenants.insert(0, d.worker.0);
        }
        d
    }
}

#[test]
fn hot_spot_burst_before_the_insert_lands_spreads_evenly() {
    for seed in 0..20 {
        let mut burst = Burst {
            workers: idle(8),
            tenants: vec![],
            records_land: false,
        };
        let mut rng = Rng::with_seed(seed);
        let mut counts = [0u32; 8];
        for _ in 0..100 {
            counts[burst.dispatch(&mut rng).worker.index()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (12..=13).contains(&c)),
            "seed {seed}: {counts:?}"
        );
    }
}

#[test]
fn hot_spot_burst_with_records_spills_and_replicates_the_prefix() {
    for seed in 0..20 {
        let mut burst = Burst {
            workers: idle(8),
            tenants: vec![],
            records_land: true,
        };
        let mut rng = Rng::with_seed(seed);
        let mut counts = [0u32; 8];
        let mut spills = 0;
        for _ in 0..100 {
            let d = burst.dispatch(&mut rng);
            counts[d.worker.index()] += 1;
            spills += u32::from(d.branch == Branch::Spill);
        }
        let max = counts.iter().copied().max().unwrap_or(0);
        assert!(max < 100, "seed {seed}: all on one worker {counts:?}");
        assert!(
            spills > 0 && burst.tenants.len() > 1,
            "seed {seed}: spill targets become holders"
        );
        // The spec's gate: a holder takes affinity traffic until it exceeds 1.5x mean and mean+64.
        assert!(max <= 75, "seed {seed}: {counts:?}");
    }
}

// ---- The expected-wait scorer ----

#[test]
fn expected_wait_uses_token_work_and_kv_usage() {
    let load = |tokens: u64, usage: f64, throughput: f64| WorkerStatus {
        eligible: true,
        load: Some(WorkerLoad {
            waiting_uncached_tokens: tokens,
            token_usage: usage,
            gen_throughput: throughput,
            ..WorkerLoad::default()
        }),
        ..WorkerStatus::default()
    };
    let cases: [(Vec<WorkerStatus>, u16); 8] = [
        // More queued tokens waits longer.
        (vec![load(5000, 0.1, 1000.0), load(1000, 0.1, 1000.0)], 1),
        // A busier engine reports a higher throughput; that does not make its queue shorter.
        (vec![load(5000, 0.1, 4000.0), load(4000, 0.1, 1000.0)], 1),
        // A fuller KV cache is penalized.
        (vec![load(0, 0.8, 1000.0), load(0, 0.2, 1000.0)], 1),
        // Credits since the last report count as queued work.
        (
            vec![
                WorkerStatus {
                    credited_tokens: 9000,
                    ..load(0, 0.1, 1000.0)
                },
                load(2000, 0.1, 1000.0),
            ],
            1,
        ),
        // No reports anywhere: in-flight request counts decide.
        (with_in_flight(&[4, 2]), 1),
        // Prompts sent since the report and still running fill the cache the report shows.
        {
            let sized = |resident_tokens: u64| {
                let mut worker = load(0, 0.3, 1000.0);
                if let Some(l) = worker.load.as_mut() {
                    l.kv_capacity_tokens = 100_000;
                }
                WorkerStatus {
                    resident_tokens,
                    ..worker
                }
            };
            (vec![sized(50_000), sized(0)], 1)
        },
        // A stale report's queue, known to have drained since (first tokens came back).
        (
            vec![
                WorkerStatus {
                    drained_tokens: 10_000,
                    ..load(10_000, 0.1, 1000.0)
                },
                load(3_000, 0.1, 1000.0),
            ],
            0,
        ),
        // Equal waits (nothing queued): fewer requests in flight, decoding ones included.
        (
            vec![
                WorkerStatus {
                    in_flight: 5,
                    ..load(0, 0.1, 1000.0)
                },
                WorkerStatus {
                    in_flight: 2,
                    ..load(0, 0.1, 1000.0)
                },
            ],
            1,
        ),
    ];
    for (workers, expected) in cases {
        for seed in 0..10 {
            assert_eq!(
                least_load(&workers, &ScorerConfig::BUILT_IN, &mut Rng::with_seed(seed)),
                Some(WorkerId(expected)),
                "{workers:?}"
            );
        }
    }
}

#[test]
fn a_worker_without_a_report_is_scored_as_the_fleet_mean_not_as_empty() {
    // Its first poll failed while it took traffic: it must not draw every miss until it answers.
    let mut workers = vec![reporting(0.4, 0); 3];
    workers.push(WorkerStatus {
        eligible: true,
        in_flight: 12,
        ..WorkerStatus::default()
    });
    for seed in 0..20 {
        let picked = least_load(&workers, &ScorerConfig::BUILT_IN, &mut Rng::with_seed(seed));
        assert_ne!(picked, Some(WorkerId(3)), "seed {seed}");
    }
}

#[test]
fn a_worker_without_a_report_is_not_penalized() {
    let workers = vec![reporting(0.5, 4000), idle(1)[0]];
    assert_eq!(
        least_load(&workers, &ScorerConfig::BUILT_IN, &mut Rng::with_seed(1)),
        Some(WorkerId(1))
    );
}

// ---- Other policies ----

#[test]
fn random_and_round_robin_cover_eligible_workers_only() {
    let mut workers = idle(4);
    workers[1].eligible = false;
    let counts = histogram(300, &workers, |seed| {
        random(&workers, &mut Rng::with_seed(seed)).unwrap_or_default()
    });
    assert!(
        counts[1] == 0 && counts[0] > 50 && counts[2] > 50 && counts[3] > 50,
        "{counts:?}"
    );
    let mut cursor = 0;
    let order: Vec<u16> = (0..6)
        .filter_map(|_| round_robin(&workers, &mut cursor))
        .map(|w| w.0)
        .collect();
    assert_eq!(order, [0, 2, 3, 0, 2, 3]);
}

#[test]
fn power_of_two_takes_the_less_loaded_of_two() {
    let workers = with_in_flight(&[9, 1]);
    for seed in 0..20 {
        assert_eq!(
            power_of_two(&workers, &mut Rng::with_seed(seed)),
            Some(WorkerId(1))
        );
    }
    // With many workers the busiest is never chosen (it loses every pair).
    let workers = with_in_flight(&[1, 1, 1, 50]);
    let counts = histogram(300, &workers, |seed| {
        power_of_two(&workers, &mut Rng::with_seed(seed)).unwrap_or_default()
    });
    assert_eq!(counts[3], 0, "{counts:?}");
}

fn ring(n: u16) -> WorkerRing {
    let urls: Vec<String> = (0..n)
        .map(|i| format!("http://127.0.0.1:{}", 31000 + i))
        .collect();
    WorkerRing::new(
        urls.iter()
            .enumerate()
            .map(|(i, u)| (WorkerId(i as u16), u.as_str())),
    )
}

/// prefix_hash's bounded-load cap alone (`--prefix-hash-balance-abs-threshold 0`).
const CAP_ONLY: PrefixHashBalance = PrefixHashBalance {
    load_factor: 1.25,
    abs_threshold: 0.0,
};

#[test]
fn prefix_hash_is_stable_spreads_and_bounds_load() {
    let ring = ring(4);
    let workers = idle(4);
    let ns = PartitionNamespace::UNPARTITIONED;
    let tokens: Vec<u32> = (0..1000).collect();
    let mut follow_up = tokens.clone();
    follow_up.extend(5000..6000);
    let head = |t: &[u32]| prefix_hash_key(RoutingKey::Tokens(t), ns, 256, &[]);
    assert_eq!(
        head(&tokens),
        head(&follow_up),
        "the same first 256 tokens, the same key"
    );
    assert_ne!(head(&tokens), head(&tokens[1..]));
    let mut rng = Rng::with_seed(1);
    let owner = prefix_hash(head(&tokens), &ring, &workers, CAP_ONLY, &mut rng);
    assert_eq!(
        owner,
        prefix_hash(head(&follow_up), &ring, &workers, CAP_ONLY, &mut rng)
    );
    // Keys spread over all workers.
    let mut counts = [0u32; 4];
    for i in 0..400u32 {
        let key = prefix_hash_key(RoutingKey::Tokens(&[i, i + 1]), ns, 256, &[]);
        counts[prefix_hash(key, &ring, &workers, CAP_ONLY, &mut rng)
            .unwrap_or_default()
            .index()] += 1;
    }
    assert!(counts.iter().all(|&c| c > 40), "{counts:?}");
    // The owner at its bounded-load cap loses the key to the next worker on the ring.
    let owner = owner.unwrap_or_default();
    let mut busy = idle(4);
    busy[owner.index()].in_flight = 10;
    let moved = prefix_hash(head(&tokens), &ring, &busy, CAP_ONLY, &mut rng);
    assert!(moved.is_some() && moved != Some(owner));
}

#[test]
fn prefix_hash_boundaries_hash_the_deepest_reached_head() {
    let ns = PartitionNamespace::UNPARTITIONED;
    let long: Vec<u32> = (0..3000).collect();
    let mid: Vec<u32> = (0..2500).collect();
    let key = |t: &[u32]| prefix_hash_key(RoutingKey::Tokens(t), ns, 256, &[1024, 2048]);
    assert_eq!(key(&long), key(&mid));
    assert_ne!(key(&long), key(&long[..2000]));
    // Partitions hash apart.
    let salted = prefix_hash_key(
        RoutingKey::Tokens(&long),
        PartitionNamespace(7),
        256,
        &[1024, 2048],
    );
    assert_ne!(salted, key(&long));
}

#[test]
fn consistent_hashing_honours_target_worker_and_routing_key() {
    let ring = ring(4);
    let mut workers = idle(4);
    let mut rng = Rng::with_seed(3);
    let target = consistent_hashing(
        Some("http://127.0.0.1:31002"),
        None,
        &ring,
        &workers,
        &mut rng,
    );
    assert_eq!(target, Some(WorkerId(2)));
    let key = xxhash_rust::xxh3::xxh3_64(b"user-42");
    let owner = consistent_hashing(None, Some(key), &ring, &workers, &mut rng).unwrap_or_default();
    for _ in 0..10 {
        assert_eq!(
            consistent_hashing(None, Some(key), &ring, &workers, &mut rng),
            Some(owner)
        );
    }
    // An ineligible target or owner falls through to the next choice.
    workers[owner.index()].eligible = false;
    let next = consistent_hashing(None, Some(key), &ring, &workers, &mut rng);
    assert!(next.is_some() && next != Some(owner));
    workers[2].eligible = false;
    let fallback = consistent_hashing(
        Some("http://127.0.0.1:31002"),
        None,
        &ring,
        &workers,
        &mut rng,
    );
    assert!(fallback.is_some() && fallback != Some(WorkerId(2)));
}

// ---- Flags ----

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    policy: PolicyArgs,
}

fn parse(args: &[&str]) -> Result<PolicyConfig, crate::error::FlagError> {
    let argv = std::iter::once("kvgate").chain(args.iter().copied());
    Cli::try_parse_from(argv)
        .expect("clap parses")
        .policy
        .validate()
}

#[test]
fn cli_definition_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn defaults_match_smg() {
    let config = parse(&[]).expect("defaults are valid");
    assert_eq!(config.kind, PolicyKind::CacheAware);
    let ca = config.cache_aware;
    assert_eq!(
        (
            ca.cache_threshold,
            ca.balance_abs_threshold,
            ca.balance_rel_threshold
        ),
        (0.3, 64.0, 1.5)
    );
    assert_eq!(
        (
            ca.overload_token_usage_threshold,
            ca.balance_token_usage_threshold
        ),
        (None, None)
    );
    assert_eq!(
        (ca.overlap_decay, ca.selection_temperature, ca.block_size),
        (0.0, 0.0, 16)
    );
    assert!(
        !ca.load_aware_affinity,
        "opt-in: the default is SMG's spill gate"
    );
    let load_aware = parse(&["--load-aware-affinity"]).expect("valid");
    assert!(load_aware.cache_aware.load_aware_affinity);
    assert_eq!(config.max_tree_size, 67_108_864);
    assert_eq!(config.eviction_interval.as_secs(), 120);
    let names = [
        "cache_aware",
        "random",
        "round_robin",
        "power_of_two",
        "least_load",
        "prefix_hash",
        "consistent_hashing",
    ];
    for name in names {
        assert_eq!(parse(&["--policy", name]).expect(name).kind.name(), name);
    }
}

#[test]
fn usage_thresholds_at_or_above_one_disable_the_check() {
    let config = parse(&[
        "--overload-token-usage-threshold",
        "1.0",
        "--balance-token-usage-threshold",
        "0.5",
    ])
    .expect("valid");
    assert_eq!(config.cache_aware.overload_token_usage_threshold, None);
    assert_eq!(config.cache_aware.balance_token_usage_threshold, Some(0.5));
}

#[test]
fn bad_values_name_their_flag() {
    let cases: [(&[&str], &str); 12] = [
        (&["--cache-threshold", "1.5"], "--cache-threshold"),
        (&["--cache-threshold=-0.1"], "--cache-threshold"),
        (
            &["--overload-token-usage-threshold", "0"],
            "--overload-token-usage-threshold",
        ),
        (
            &["--balance-token-usage-threshold=-1"],
            "--balance-token-usage-threshold",
        ),
        (&["--overlap-decay=-0.5"], "--overlap-decay"),
        (
            &["--selection-temperature", "NaN"],
            "--selection-temperature",
        ),
        (&["--balance-rel-threshold", "0"], "--balance-rel-threshold"),
        (&["--block-size", "0"], "--block-size"),
        (&["--eviction-interval", "0"], "--eviction-interval"),
        (&["--cache-boundaries", "2048,1024"], "--cache-boundaries"),
        (&["--cache-boundaries", "0,16"], "--cache-boundaries"),
        (&["--cache-index", "hash"], "--cache-boundaries"),
    ];
    for (args, flag) in cases {
        let err = parse(args).expect_err(flag);
        assert_eq!(err.flag, flag, "{args:?}");
        assert!(
            err.to_string()
                .starts_with(&format!("invalid value for {flag}: ")),
            "{err}"
        );
    }
    assert!(parse(&["--policy", "prefix_hash", "--cache-boundaries", "2048,8192"]).is_ok());
}

#[test]
fn hash_mode_flags_are_validated_with_one_line_each() {
    let hash = parse(&[
        "--cache-index",
        "hash",
        "--cache-boundaries",
        "2048,8192,32768",
    ])
    .expect("a valid hash mode");
    assert_eq!(hash.cache_index, CacheIndexKind::Hash);
    assert_eq!(hash.cache_boundaries, [2048, 8192, 32768]);
    assert_eq!(
        hash.cache_ttl,
        std::time::Duration::from_secs(180),
        "SMG's default"
    );
    let many: Vec<String> = (1..=crate::limits::CACHE_BOUNDARIES_MAX as u32 + 1)
        .map(|i| (i * 64).to_string())
        .collect();
    let many = many.join(",");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--cache-index", "hash"],
            "invalid value for --cache-boundaries: required with --cache-index hash (e.g. --cache-boundaries 2048,8192,32768)",
        ),
        (
            &["--cache-index", "hash", "--cache-boundaries", "0,16"],
            "invalid value for --cache-boundaries: token positions must be positive (got 0)",
        ),
        (
            &["--cache-index", "hash", "--cache-boundaries", "2048,1024"],
            "invalid value for --cache-boundaries: token positions must be strictly ascending (2048 then 1024)",
        ),
        (
            &["--cache-index", "hash", "--cache-boundaries", "16,16"],
            "invalid value for --cache-boundaries: token positions must be strictly ascending (16 then 16)",
        ),
        (
            &["--cache-index", "hash", "--cache-boundaries", &many],
            "invalid value for --cache-boundaries: 17 positions given, at most 16",
        ),
        (
            &["--cache-index", "hash", "--cache-boundaries", "64", "--cache-ttl-secs", "0"],
            "invalid value for --cache-ttl-secs: 0 must be above 0",
        ),
    ];
    for (args, message) in cases {
        let error = parse(args).expect_err(message);
        assert_eq!(error.to_string(), message, "{args:?}");
    }
    let argv = ["kvgate", "--cache-index", "hash", "--cache-boundaries", "x"];
    assert!(
        Cli::try_parse_from(argv).is_err(),
        "clap refuses a non-number"
    );
}

#[test]
fn flags_hash_mode_ignores_are_named_when_given() {
    let args = |extra: &[&str]| {
        let argv = std::iter::once("kvgate").chain(extra.iter().copied());
        Cli::try_parse_from(argv).expect("clap parses").policy
    };
    let ignored = args(&[
        "--cache-index",
        "hash",
        "--cache-boundaries",
        "64",
        "--cache-threshold",
        "0.5",
        "--selection-temperature",
        "0.1",
    ]);
    assert_eq!(
        ignored.unused_in_hash_mode(),
        ["--cache-threshold", "--selection-temperature"]
    );
    let tree = args(&["--cache-threshold", "0.5"]);
    assert!(tree.unused_in_hash_mode().is_empty(), "tree mode uses them");
}

// ---- Metrics and logs ----

#[test]
fn metrics_count_tree_decisions_and_render_prometheus_text() {
    let (core_a, core_b) = (PolicyMetrics::default(), PolicyMetrics::default());
    let d = |branch, match_ratio| Decision {
        worker: WorkerId(0),
        branch,
        match_ratio,
        head_tokens: 0,
    };
    core_a.record(&d(Branch::TreeMatch, 1.0));
    core_a.record(&d(Branch::TreeMatch, 0.1));
    core_b.record(&d(Branch::Spill, 0.55));
    core_b.record(&d(Branch::ExpectedWaitFallback, 0.0));
    core_b.record(&d(Branch::KvPressure, 0.0));
    assert_eq!(core_a.branch_count(Branch::TreeMatch), 2);
    assert_eq!(core_b.branch_count(Branch::KvPressure), 0);
    let mut text = String::new();
    render_prometheus([&core_a, &core_b], &mut text);
    for line in [
        "# TYPE smg_cache_aware_policy_branch_total counter",
        "smg_cache_aware_policy_branch_total{branch=\"tree_match\"} 2",
        "smg_cache_aware_policy_branch_total{branch=\"spill\"} 1",
        "smg_cache_aware_policy_branch_total{branch=\"expected_wait_fallback\"} 1",
        "smg_cache_aware_policy_branch_total{branch=\"first_healthy_fallback\"} 0",
        "# TYPE smg_cache_aware_match_ratio histogram",
        "smg_cache_aware_match_ratio_bucket{le=\"0\"} 1",
        "smg_cache_aware_match_ratio_bucket{le=\"0.1\"} 2",
        "smg_cache_aware_match_ratio_bucket{le=\"0.5\"} 2",
        "smg_cache_aware_match_ratio_bucket{le=\"0.6\"} 3",
        "smg_cache_aware_match_ratio_bucket{le=\"1\"} 4",
        "smg_cache_aware_match_ratio_bucket{le=\"+Inf\"} 4",
        "smg_cache_aware_match_ratio_count 4",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    let sum: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("smg_cache_aware_match_ratio_sum "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    assert!((sum - 1.65).abs() < 1e-9, "{text}");
}

/// An index mode that answers every lookup with one fixed match.
#[derive(Debug)]
struct FixedLookup(TreeMatch);

impl IndexLookup for FixedLookup {
    fn lookup(&self, _: crate::index::Namespace, _: IndexKey<'_>, _: u64) -> Lookup {
        Lookup::Tree {
            matched: self.0,
            hint: Default::default(),
        }
    }

    fn quiesce(&mut self) {}
}

/// A `Write` that appends into a shared buffer, for capturing log output.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn route_logged(filter: &str) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let metrics = Arc::new(PolicyMetrics::default());
    let config = parse(&[]).expect("defaults");
    let index: Box<dyn IndexLookup> = Box::new(FixedLookup(matched(5, 5, &[1])));
    let mut router = Router::new(config, 9, Some(index), metrics.clone());
    let mut prepared = Prepared::default();
    router
        .prepare(
            &mut prepared,
            Endpoint::Completions,
            RoutingHeaders::default(),
            br#"{"model":"m1","prompt":"hello"}"#,
            0,
        )
        .expect("valid");
    let urls = ["http://127.0.0.1:31000", "http://127.0.0.1:31001"];
    let workers = (0..2).map(|i| (WorkerId(i as u16), urls[i]));
    let idle = |_| WorkerStatus {
        eligible: true,
        ..WorkerStatus::default()
    };
    tracing::subscriber::with_default(subscriber, || {
        let worker = router.choose(&prepared, workers, idle).expect("routed");
        assert_eq!(worker, WorkerId(1));
    });
    assert_eq!(metrics.branch_count(Branch::TreeMatch), 1);
    let bytes = captured.0.lock().map(|b| b.clone()).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn each_decision_logs_a_cache_aware_selection_line_under_smg_filter() {
    let log = route_logged("info,smg::policies::cache_aware=debug");
    assert!(log.contains("Cache-aware selection"), "{log}");
    for field in [
        "index=\"tree\"",
        "branch=\"tree_match\"",
        "worker=\"http://127.0.0.1:31001\"",
        "model_id=\"m1\"",
        "matched_ratio=1.0",
        "threshold=0.3",
    ] {
        assert!(log.contains(field), "missing {field} in {log}");
    }
    assert_eq!(route_logged("info"), "", "off at info");
}

#[test]
fn hash_decisions_log_their_index_branch_and_level() {
    use crate::index::hash::HashIndexWriter;
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "info,smg::policies::cache_aware=debug",
        ))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let config = parse(&["--cache-index", "hash", "--cache-boundaries", "16,32"]).expect("valid");
    let mut map = HashIndexWriter::new(64, 180_000);
    let index: Box<dyn IndexLookup> = Box::new(Heads::new(map.reader()));
    let mut router = Router::new(config, 9, Some(index), Arc::default());
    let body =
        br#"{"model":"m1","input_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]}"#;
    let mut prepared = Prepared::default();
    let headers = RoutingHeaders::default();
    router
        .prepare(&mut prepared, Endpoint::Generate, headers, body, 0)
        .expect("valid");
    let record = router.record(&prepared, WorkerId(1), 0).expect("one head");
    if let KeyData::Heads(heads) = &record.key {
        map.record(record.namespace.model, heads, WorkerId(1), 0)
            .expect("recorded");
    }
    router
        .prepare(&mut prepared, Endpoint::Generate, headers, body, 1_000)
        .expect("valid");
    let urls = ["http://127.0.0.1:31000", "http://127.0.0.1:31001"];
    let workers = (0..2).map(|i| (WorkerId(i as u16), urls[i]));
    let idle = |_| WorkerStatus {
        eligible: true,
        ..WorkerStatus::default()
    };
    tracing::subscriber::with_default(subscriber, || {
        assert_eq!(router.choose(&prepared, workers, idle), Some(WorkerId(1)));
    });
    let bytes = captured.0.lock().map(|b| b.clone()).unwrap_or_default();
    let log = String::from_utf8_lossy(&bytes).into_owned();
    for field in [
        "Cache-aware selection",
        "index=\"hash\"",
        "branch=\"hash_hit\"",
        "level=16",
        "worker=\"http://127.0.0.1:31001\"",
        "model_id=\"m1\"",
    ] {
        assert!(log.contains(field), "missing {field} in {log}");
    }
    assert!(!log.contains("matched_ratio"), "{log}");
}

#[test]
fn a_load_report_reads_unknown_fields_as_zero() {
    let report =
        parse_v1_loads(br#"{"loads":[{"num_running_reqs":3,"num_waiting_reqs":5}]}"#).unwrap();
    let load = WorkerLoad::from(&report);
    // A queue without its token count is the mean prefill per request, not zero (SMG).
    assert_eq!(
        (load.running, load.waiting, load.waiting_uncached_tokens),
        (3, 5, 5 * MEAN_PREFILL_TOKENS_DEFAULT)
    );
    assert_eq!((load.token_usage, load.gen_throughput), (0.0, 0.0));
    let full = parse_v1_loads(
        br#"{"loads":[{"num_running_reqs":1,"num_waiting_reqs":2,"num_waiting_uncached_tokens":150,"gen_throughput":40.0,"token_usage":0.25,"max_total_num_tokens":1000}]}"#,
    )
    .unwrap();
    let load = WorkerLoad::from(&full);
    assert_eq!(load.waiting_uncached_tokens, 150);
    assert!((load.gen_throughput - 40.0).abs() < 1e-9);
    assert_eq!(load.kv_capacity_tokens, 1000);
}

#[test]
fn a_retried_request_counts_once_in_the_branch_counter() {
    let metrics = Arc::new(PolicyMetrics::default());
    let config = parse(&[]).expect("defaults");
    let index: Box<dyn IndexLookup> = Box::new(FixedLookup(matched(5, 5, &[1])));
    let mut router = Router::new(config, 9, Some(index), metrics.clone());
    let mut prepared = Prepared::default();
    let body = br#"{"model":"m1","prompt":"hello"}"#;
    let headers = RoutingHeaders::default;
    router
        .prepare(&mut prepared, Endpoint::Completions, headers(), body, 0)
        .expect("valid");
    let urls = ["http://127.0.0.1:31000", "http://127.0.0.1:31001"];
    let workers = || (0..2).map(|i| (WorkerId(i as u16), urls[i]));
    let idle = |_| WorkerStatus {
        eligible: true,
        ..WorkerStatus::default()
    };
    // The first attempt and two retries of one request: one decision counted.
    for _ in 0..3 {
        router.choose(&prepared, workers(), idle).expect("routed");
    }
    assert_eq!(metrics.branch_count(Branch::TreeMatch), 1);
    // The next request on the connection is counted again.
    router
        .prepare(&mut prepared, Endpoint::Completions, headers(), body, 1)
        .expect("valid");
    router.choose(&prepared, workers(), idle).expect("routed");
    assert_eq!(metrics.branch_count(Branch::TreeMatch), 2);
}

// ---- SMG's least_load and prefix_hash flags ----

/// least_load's pick over `workers` with `flags` (the policy's scorer, as the router reads it).
fn least_load_with(flags: &[&str], workers: &[WorkerStatus]) -> Option<WorkerId> {
    let mut args = vec!["--policy", "least_load"];
    args.extend_from_slice(flags);
    let config = parse(&args).expect("valid flags");
    least_load(workers, &config.scorer(), &mut Rng::with_seed(3))
}

#[test]
fn least_load_flags_have_smgs_defaults_and_reach_only_least_load() {
    let config = parse(&["--policy", "least_load"]).expect("defaults");
    let expected = ScorerConfig {
        kv_penalty_half_usage_s: 0.15,
        throughput_fallback_tps: 2000.0,
        mean_prefill_tokens: 1024,
        max_waiting_requests: None,
    };
    assert_eq!(config.scorer(), expected);
    assert_eq!(config.prefix_hash_balance_abs_threshold, 10.0);
    // cache_aware runs the scorer with its built-in knobs whatever the flags say.
    let cache_aware = parse(&["--least-load-kv-pressure-weight", "5"]).expect("valid");
    assert_eq!(cache_aware.scorer(), ScorerConfig::BUILT_IN);
    let cases: [(&[&str], &str); 5] = [
        (
            &["--least-load-kv-pressure-weight=-1"],
            "--least-load-kv-pressure-weight",
        ),
        (
            &["--least-load-default-throughput", "0"],
            "--least-load-default-throughput",
        ),
        (
            &["--least-load-default-throughput", "inf"],
            "--least-load-default-throughput",
        ),
        (
            &["--least-load-mean-prefill-tokens", "0"],
            "--least-load-mean-prefill-tokens",
        ),
        (
            &["--prefix-hash-load-factor", "0.5"],
            "--prefix-hash-load-factor",
        ),
    ];
    for (args, flag) in cases {
        assert_eq!(parse(args).expect_err(flag).flag, flag, "{args:?}");
    }
    assert!(Cli::try_parse_from(["kvgate", "--least-load-max-waiting-requests", "-1"]).is_err());
    assert!(Cli::try_parse_from(["kvgate", "--prefix-hash-balance-abs-threshold", "x"]).is_err());
}

#[test]
fn least_load_kv_pressure_weight_trades_kv_usage_against_queued_work() {
    // Worker 0: half-full cache, no queue; worker 1: empty cache, 0.5 s of queued prefill.
    let workers = [reporting(0.5, 0), reporting(0.0, 500)];
    // SMG's default weight (0.15 s at half usage) prefers the fuller cache...
    assert_eq!(least_load_with(&[], &workers), Some(WorkerId(0)));
    // ...a weight of 1 s makes it the worse wait.
    let heavy = ["--least-load-kv-pressure-weight", "1"];
    assert_eq!(least_load_with(&heavy, &workers), Some(WorkerId(1)));
}

#[test]
fn least_load_default_throughput_converts_queues_when_no_worker_reports_one() {
    let silent = |usage, tokens| {
        let mut w = reporting(usage, tokens);
        w.load = w.load.map(|l| WorkerLoad {
            gen_throughput: 0.0,
            ..l
        });
        w
    };
    // 1,000 queued tokens at the default 2,000 tokens/s: 0.5 s, more than 0.15 s of KV penalty.
    let workers = [silent(0.0, 1000), silent(0.5, 0)];
    assert_eq!(least_load_with(&[], &workers), Some(WorkerId(1)));
    let fast = ["--least-load-default-throughput", "20000"];
    assert_eq!(least_load_with(&fast, &workers), Some(WorkerId(0)));
}

#[test]
fn a_queue_without_token_counts_is_scored_at_the_mean_prefill_not_as_empty() {
    // vLLM through /metrics: 4 waiting requests, no token count.
    let vllm = crate::workers::load::parse_prometheus(
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage_perc 0.1\n",
    )
    .expect("a vLLM report");
    assert_eq!(vllm.waiting_uncached_tokens, None);
    let queued = |load: WorkerLoad| WorkerStatus {
        eligible: true,
        load: Some(WorkerLoad {
            gen_throughput: 1000.0,
            ..load
        }),
        ..WorkerStatus::default()
    };
    // The built-in scorer (cache_aware's): 4 x 1,024 tokens queued.
    let built_in = WorkerLoad::from(&vllm);
    assert_eq!(
        built_in.waiting_uncached_tokens,
        4 * MEAN_PREFILL_TOKENS_DEFAULT
    );
    // The other worker has 2,000 known tokens queued: less than 4,096, so it waits less.
    let workers = [queued(built_in), reporting(0.1, 2000)];
    let miss = decide(None, &workers, &cfg(), 1);
    assert_eq!(miss.worker, WorkerId(1), "{miss:?}");
    // least_load with a smaller mean prefill: 400 tokens queued, the shorter wait.
    let config = parse(&[
        "--policy",
        "least_load",
        "--least-load-mean-prefill-tokens",
        "100",
    ])
    .expect("valid");
    let small = WorkerLoad::from_report(&vllm, config.scorer().mean_prefill_tokens);
    assert_eq!(small.waiting_uncached_tokens, 400);
    let workers = [queued(small), reporting(0.1, 2000)];
    assert_eq!(
        least_load(&workers, &config.scorer(), &mut Rng::with_seed(1)),
        Some(WorkerId(0))
    );
    // A report with a token count keeps it, even zero (every queued prompt cached).
    let sglang =
        parse_v1_loads(br#"{"loads":[{"num_waiting_reqs":3,"num_waiting_uncached_tokens":0}]}"#)
            .expect("an SGLang report");
    assert_eq!(WorkerLoad::from(&sglang).waiting_uncached_tokens, 0);
}

#[test]
fn least_load_max_waiting_requests_passes_over_long_queues_while_another_is_shorter() {
    let waiting = |waiting, tokens| WorkerStatus {
        eligible: true,
        load: Some(WorkerLoad {
            waiting,
            waiting_uncached_tokens: tokens,
            gen_throughput: 1000.0,
            ..WorkerLoad::default()
        }),
        ..WorkerStatus::default()
    };
    // Worker 0: 8 short queued requests (little work); worker 1: 2 long ones.
    let workers = [waiting(8, 800), waiting(2, 4000)];
    assert_eq!(least_load_with(&[], &workers), Some(WorkerId(0)));
    let capped = ["--least-load-max-waiting-requests", "8"];
    assert_eq!(least_load_with(&capped, &workers), Some(WorkerId(1)));
    // Requests this gateway sent since the report count as waiting too.
    let mut since = [waiting(2, 800), waiting(2, 4000)];
    since[0].in_flight = 8;
    assert_eq!(least_load_with(&capped, &since), Some(WorkerId(1)));
    // Every worker at the cap: the plain pick, not a refusal.
    let full = [waiting(9, 800), waiting(9, 4000)];
    assert_eq!(least_load_with(&capped, &full), Some(WorkerId(0)));
}

#[test]
fn prefix_hash_balance_abs_threshold_keeps_a_key_on_a_mildly_busier_owner() {
    let ring = ring(4);
    let key = prefix_hash_key(
        RoutingKey::Tokens(&[1, 2, 3]),
        PartitionNamespace::UNPARTITIONED,
        256,
        &[],
    );
    let owner =
        prefix_hash(key, &ring, &idle(4), CAP_ONLY, &mut Rng::with_seed(1)).expect("an owner");
    let mut busy = idle(4);
    busy[owner.index()].in_flight = 5;
    // Over the bounded-load cap (ceil(1.25 x 6 / 4) = 2) but within 10 of the mean (1.25).
    let smg_default = PrefixHashBalance {
        load_factor: 1.25,
        abs_threshold: 10.0,
    };
    let mut rng = Rng::with_seed(1);
    assert_eq!(
        prefix_hash(key, &ring, &busy, smg_default, &mut rng),
        Some(owner)
    );
    assert_ne!(
        prefix_hash(key, &ring, &busy, CAP_ONLY, &mut rng),
        Some(owner)
    );
    // Far above the mean: passed over either way.
    busy[owner.index()].in_flight = 40;
    assert_ne!(
        prefix_hash(key, &ring, &busy, smg_default, &mut rng),
        Some(owner)
    );
    let config = parse(&["--prefix-hash-balance-abs-threshold", "3"]).expect("valid");
    assert_eq!(config.prefix_hash_balance_abs_threshold, 3.0);
}

// ---- --load-aware-affinity ----

fn load_aware() -> CacheAwareConfig {
    CacheAwareConfig {
        load_aware_affinity: true,
        ..cfg()
    }
}

/// A worker with `in_flight` requests from this gateway that reports `running` of them decoding
/// over `used_tokens` of a 1,000,000-token cache, and `queued_tokens` of prefill waiting.
fn busy(in_flight: u32, running: u32, used_tokens: u64, queued_tokens: u64) -> WorkerStatus {
    WorkerStatus {
        eligible: true,
        in_flight,
        load: Some(WorkerLoad {
            running,
            waiting_uncached_tokens: queued_tokens,
            token_usage: used_tokens as f64 / 1_000_000.0,
            kv_capacity_tokens: 1_000_000,
            gen_throughput: 1000.0,
            ..WorkerLoad::default()
        }),
        ..WorkerStatus::default()
    }
}

/// A request of 8,192 tokens whose first 8,000 worker 0 holds.
fn held_by_worker_0() -> TreeMatch {
    matched(8000, 8192, &[0])
}

#[test]
fn load_aware_a_queued_holder_loses_to_an_idle_non_holder_when_prefilling_is_quicker() {
    // Equal batches (2 each, 5,000 KV tokens per running request): only the holder's prefill
    // queue differs. A non-holder adds its whole prefill and a second copy of the prompt,
    // 8,192 + 2 x 8,192 x (1 + 2/2) = 40,960 tokens, where the holder adds 192 + 192 x 2: the
    // holder keeps the request while its queue is under the 40,384 between them.
    let others = [busy(2, 2, 10_000, 0), busy(2, 2, 10_000, 0)];
    for (queued, expected) in [(60_000, Branch::Replicate), (20_000, Branch::TreeMatch)] {
        let mut workers = vec![busy(2, 2, 10_000, queued)];
        workers.extend(others);
        for seed in 0..20 {
            let d = decide(Some(&held_by_worker_0()), &workers, &load_aware(), seed);
            assert_eq!(d.branch, expected, "queue {queued}");
            assert_eq!(
                d.worker.0 == 0,
                expected == Branch::TreeMatch,
                "queue {queued}"
            );
        }
    }
    // The spec's gate alone keeps the queued holder: it counts requests, not work.
    let mut workers = vec![busy(2, 2, 10_000, 60_000)];
    workers.extend(others);
    assert_eq!(
        decide(Some(&held_by_worker_0()), &workers, &cfg(), 1).branch,
        Branch::TreeMatch
    );
}

#[test]
fn load_aware_a_holder_keeps_the_prefix_until_its_batch_outweighs_a_replica() {
    // The fleet holds 2,000 KV tokens per running request. A holder adds 192 new tokens; a
    // replica adds 8,192 under every request of the batch it joins, so the holder keeps the
    // prefix until its batch is far larger than the best non-holder's, which then takes it.
    let fleet = |holder_batch: u32| {
        let mut workers = vec![busy(
            holder_batch,
            holder_batch,
            2_000 * u64::from(holder_batch),
            0,
        )];
        workers.extend([busy(4, 4, 8_000, 0), busy(1, 1, 2_000, 0)]);
        workers
    };
    let keeps = decide(Some(&held_by_worker_0()), &fleet(12), &load_aware(), 3);
    assert_eq!(
        (keeps.worker, keeps.branch),
        (WorkerId(0), Branch::TreeMatch)
    );
    for seed in 0..20 {
        let moves = decide(Some(&held_by_worker_0()), &fleet(40), &load_aware(), seed);
        // The replica goes to the smaller batch.
        assert_eq!(
            (moves.worker, moves.branch),
            (WorkerId(2), Branch::Replicate)
        );
    }
    // 40 in flight against a mean of 15 is not hot for the spec's gate (mean + 64).
    let spec = decide(Some(&held_by_worker_0()), &fleet(40), &cfg(), 1);
    assert_eq!((spec.worker, spec.branch), (WorkerId(0), Branch::TreeMatch));
}

#[test]
fn load_aware_a_short_answer_stays_with_a_busy_holder_a_long_one_does_not() {
    // The fleet of the test above with the holder at 40 in flight: its batch costs a request
    // that decodes many steps more than a replica's prefill, one that decodes a few steps less.
    let mut workers = vec![busy(40, 40, 80_000, 0)];
    workers.extend([busy(4, 4, 8_000, 0), busy(1, 1, 2_000, 0)]);
    let sized = |output_tokens| RequestSize {
        prompt_tokens: 8192,
        output_tokens: Some(output_tokens),
    };
    let tree = held_by_worker_0();
    for (output_tokens, expected) in [(16, Branch::TreeMatch), (384, Branch::Replicate)] {
        let d = select(
            Some(&tree),
            &workers,
            &load_aware(),
            sized(output_tokens),
            &mut Rng::with_seed(1),
        );
        assert_eq!(
            d.map(|d| d.branch),
            Some(expected),
            "{output_tokens} output tokens"
        );
    }
}

#[test]
fn load_aware_before_any_report_a_request_in_flight_weighs_a_whole_prompt() {
    // No load report: a request in flight counts as 8,192 KV tokens, so one more in flight on
    // the holder outweighs a replica only once its batch is well above the others'.
    let keeps = decide(
        Some(&held_by_worker_0()),
        &with_in_flight(&[2, 0, 0]),
        &load_aware(),
        1,
    );
    assert_eq!(keeps.branch, Branch::TreeMatch);
    let moves = decide(
        Some(&held_by_worker_0()),
        &with_in_flight(&[8, 0, 0]),
        &load_aware(),
        1,
    );
    assert_eq!(moves.branch, Branch::Replicate);
}

#[test]
fn load_aware_holders_are_ranked_by_cost_and_ineligible_ones_spill() {
    let tree = matched(8000, 8192, &[0, 1]);
    let workers = [
        busy(30, 30, 60_000, 0),
        busy(3, 3, 6_000, 0),
        busy(3, 3, 6_000, 0),
    ];
    let d = decide(Some(&tree), &workers, &load_aware(), 1);
    assert_eq!((d.worker, d.branch), (WorkerId(1), Branch::TreeMatch));
    let mut workers = workers;
    workers[0].eligible = false;
    workers[1].eligible = false;
    let d = decide(Some(&tree), &workers, &load_aware(), 1);
    assert_eq!((d.worker, d.branch), (WorkerId(2), Branch::Spill));
}

/// Which index a [`QueueModel`] routes on: what its affinity looks like to the decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelIndex {
    /// A token-tree match of 8,192 of the request's 8,256 tokens, every holder a tenant.
    Tree,
    /// The hash index: the 8,192-token head, its holders most recently sent first, at most
    /// `PLACEMENT_HOLDERS_DEFAULT` (a new one evicts the stalest), as `HashIndexWriter::record`.
    Heads,
    /// The KV-event index: 512 of the request's 516 blocks of 16 held by each holder; a
    /// holder from its dispatch on, as the in-flight overlay makes it until its engine reports.
    Blocks,
}

/// Routes one request of 8,256 tokens whose 8,192-token prefix `holders` hold (most recent
/// first), as `index` would show it to the decision.
fn select_on(
    index: ModelIndex,
    holders: &[u16],
    statuses: &[WorkerStatus],
    config: &CacheAwareConfig,
    rng: &mut Rng,
) -> Option<Decision> {
    match index {
        ModelIndex::Tree => {
            let tree = matched(8192, 8256, holders);
            select(Some(&tree), statuses, config, 8256, rng)
        }
        ModelIndex::Heads => {
            let head = crate::index::hash::Head {
                tokens: 8192,
                hash: 1,
            };
            let mut heads = crate::index::hash::HeadMatch::of(&[head]);
            for &h in holders {
                heads.add_holder(0, WorkerId(h));
            }
            select(
                cache_aware::Affinity::Heads(&heads),
                statuses,
                config,
                8256,
                rng,
            )
        }
        ModelIndex::Blocks => {
            let mut blocks = crate::index::kv::BlockMatch {
                request_blocks: 516,
                block_size: 16,
                ..Default::default()
            };
            for &h in holders {
                blocks.add_holder(WorkerId(h), 512);
            }
            select(
                cache_aware::Affinity::Blocks(&blocks),
                statuses,
                config,
                8256,
                rng,
            )
        }
    }
}

/// A queue model for the decision: one prefix family, a request arriving every step with
/// probability `rate`, each in flight until it has made 100 units of progress, a worker giving
/// each of its `n` requests `1 / (1 + n / 16)` units a step (a bigger batch decodes slower).
/// Reports are current: a worker's KV is the prefix (while it runs any request of it) plus 600
/// tokens per request. `holders` grows as decisions land on new workers (step 7), most recent
/// first.
struct QueueModel {
    in_flight: Vec<Vec<f64>>,
    holders: Vec<u16>,
    index: ModelIndex,
}

impl QueueModel {
    fn new(workers: usize, index: ModelIndex) -> Self {
        QueueModel {
            in_flight: vec![Vec::new(); workers],
            holders: vec![0],
            index,
        }
    }

    fn statuses(&self) -> Vec<WorkerStatus> {
        self.in_flight
            .iter()
            .enumerate()
            .map(|(slot, requests)| {
                let n = requests.len() as u32;
                let prefix = if self.holders.contains(&(slot as u16)) && n > 0 {
                    8192
                } else {
                    0
                };
                busy(n, n, prefix + 600 * u64::from(n), 0)
            })
            .collect()
    }

    /// Routes one request of 8,256 tokens on this model's index.
    fn decide(&self, rng: &mut Rng) -> Option<Decision> {
        let statuses = self.statuses();
        select_on(self.index, &self.holders, &statuses, &load_aware(), rng)
    }

    fn step(&mut self, rng: &mut Rng, rate: f64) -> Option<Decision> {
        for requests in &mut self.in_flight {
            let speed = 1.0 / (1.0 + requests.len() as f64 / 16.0);
            requests.iter_mut().for_each(|progress| *progress += speed);
            requests.retain(|progress| *progress < 100.0);
        }
        if rng.f64() >= rate {
            return None;
        }
        let d = self.decide(rng)?;
        // Step 7: the worker becomes (or stays) a holder, the most recent.
        self.holders.retain(|h| *h != d.worker.0);
        self.holders.insert(0, d.worker.0);
        if self.index == ModelIndex::Heads {
            self.holders
                .truncate(crate::limits::PLACEMENT_HOLDERS_DEFAULT);
        }
        self.in_flight[d.worker.index()].push(0.0);
        Some(d)
    }
}

#[test]
fn load_aware_under_steady_load_replicates_early_then_holders_share_without_oscillating() {
    for index in [ModelIndex::Tree, ModelIndex::Heads, ModelIndex::Blocks] {
        steady_load_replicates_early_then_holders_share_without_oscillating(index);
    }
}

/// The seeded no-oscillation simulation on one index mode's affinity.
fn steady_load_replicates_early_then_holders_share_without_oscillating(index: ModelIndex) {
    for seed in 0..10 {
        let mut rng = Rng::with_seed(seed);
        let mut model = QueueModel::new(4, index);
        // Warm-up: the batch grows to its steady size and the prefix spreads.
        for _ in 0..5_000 {
            model.step(&mut rng, 0.2);
        }
        let mut holders = model.holders.clone();
        holders.sort_unstable();
        // One holder cannot carry the load (its batch would grow without bound), two or three
        // can: the prefix spreads as far as the load needs, not to every worker.
        assert!(
            (2..=3).contains(&holders.len()),
            "{index:?} seed {seed}: holders {holders:?}"
        );
        let (mut picks, mut run, mut longest_run, mut last) = (vec![0u32; 4], 0, 0, None);
        let mut widest_gap = 0.0f64;
        for _ in 0..20_000 {
            let Some(d) = model.step(&mut rng, 0.2) else {
                continue;
            };
            assert_ne!(
                d.branch,
                Branch::Replicate,
                "{index:?} seed {seed}: a late replica"
            );
            picks[d.worker.index()] += 1;
            run = if last == Some(d.worker) { run + 1 } else { 1 };
            longest_run = longest_run.max(run);
            last = Some(d.worker);
            let batches: Vec<f64> = holders
                .iter()
                .map(|h| model.in_flight[usize::from(*h)].len() as f64)
                .collect();
            let (hi, lo) = batches
                .iter()
                .fold((f64::MIN, f64::MAX), |(hi, lo), &b| (hi.max(b), lo.min(b)));
            widest_gap = widest_gap.max(hi - lo);
        }
        // Holders share the traffic evenly, decision by decision: no holder takes a long run
        // of requests while another drains, and their batches never drift apart.
        let total: u32 = picks.iter().sum();
        for &h in &holders {
            let share = f64::from(picks[usize::from(h)]) / f64::from(total);
            let even = 1.0 / holders.len() as f64;
            assert!(
                (share - even).abs() < 0.05,
                "{index:?} seed {seed}: holder {h} took {share:.2} of {picks:?}"
            );
        }
        assert!(
            longest_run <= 10,
            "{index:?} seed {seed}: a run of {longest_run}"
        );
        assert!(
            widest_gap <= 6.0,
            "{index:?} seed {seed}: batches {widest_gap} apart"
        );
    }
}

// ---- --bounded-load-margin ----

fn bounded(margin: u32) -> CacheAwareConfig {
    CacheAwareConfig {
        bounded_load_margin: Some(margin),
        ..cfg()
    }
}

/// Idle eligible workers that were sent `dispatched` requests each.
fn sent(dispatched: &[u64]) -> Vec<WorkerStatus> {
    dispatched
        .iter()
        .map(|&dispatched| WorkerStatus {
            eligible: true,
            dispatched,
            ..WorkerStatus::default()
        })
        .collect()
}

const EVERY_INDEX: [ModelIndex; 3] = [ModelIndex::Tree, ModelIndex::Heads, ModelIndex::Blocks];

#[test]
fn bounded_load_is_off_by_default_and_set_by_its_flag() {
    assert_eq!(cfg().bounded_load_margin, None);
    let config = parse(&["--bounded-load-margin", "4"]).expect("valid");
    assert_eq!(config.cache_aware.bounded_load_margin, Some(4));
    // Off, a holder far above the others' counts keeps its prefix (SMG's behaviour).
    let workers = sent(&[1_000, 0, 0, 0]);
    for index in EVERY_INDEX {
        let d = select_on(index, &[0], &workers, &cfg(), &mut Rng::with_seed(1));
        assert_eq!(d.map(|d| d.worker), Some(WorkerId(0)), "{index:?}");
    }
}

#[test]
fn bounded_load_the_least_sent_holder_within_the_margin_keeps_the_prefix() {
    // Mean 13.5, margin 2: worker 0 (21 after this request) is over, worker 1 (15) within.
    let workers = sent(&[20, 14, 10, 10]);
    for index in EVERY_INDEX {
        for seed in 0..20 {
            let mut rng = Rng::with_seed(seed);
            let d = select_on(index, &[0, 1], &workers, &bounded(2), &mut rng).unwrap();
            assert_eq!(d.worker, WorkerId(1), "{index:?} seed {seed}");
            assert_ne!(d.branch, Branch::BoundedLoad, "{index:?}");
        }
    }
    // Both within: the less-sent one, not a coin toss between them.
    let workers = sent(&[14, 12, 13, 13]);
    for seed in 0..20 {
        let mut rng = Rng::with_seed(seed);
        let d = select_on(ModelIndex::Tree, &[0, 1], &workers, &bounded(4), &mut rng);
        assert_eq!(d.map(|d| d.worker), Some(WorkerId(1)));
    }
}

#[test]
fn bounded_load_holders_over_the_margin_give_the_request_to_the_least_sent_worker() {
    // Mean 15, margin 2 (limit 17): both holders are over; workers 2 and 3 are below the mean.
    let workers = sent(&[20, 20, 8, 12]);
    for index in EVERY_INDEX {
        for seed in 0..20 {
            let mut rng = Rng::with_seed(seed);
            let d = select_on(index, &[0, 1], &workers, &bounded(2), &mut rng).unwrap();
            assert_eq!(
                (d.worker, d.branch),
                (WorkerId(2), Branch::BoundedLoad),
                "{index:?}"
            );
        }
    }
    // The least-sent worker is busier than the holders and the fleet mean: the next one below
    // the mean takes it; when both are, the holder keeps it (no flood onto a laggard).
    let mut workers = sent(&[20, 20, 8, 12]);
    workers[2].in_flight = 5;
    let d = select_on(
        ModelIndex::Tree,
        &[0, 1],
        &workers,
        &bounded(2),
        &mut Rng::new(),
    );
    assert_eq!(d.map(|d| d.worker), Some(WorkerId(3)));
    workers[3].in_flight = 5;
    let d = select_on(
        ModelIndex::Tree,
        &[0, 1],
        &workers,
        &bounded(2),
        &mut Rng::new(),
    );
    let d = d.unwrap();
    assert!(d.worker.0 <= 1 && d.branch == Branch::TreeMatch, "{d:?}");
    // Ineligible workers are neither targets nor part of the mean.
    let mut workers = sent(&[20, 20, 8, 12]);
    workers[2].eligible = false;
    let d = select_on(
        ModelIndex::Tree,
        &[0, 1],
        &workers,
        &bounded(2),
        &mut Rng::new(),
    );
    assert_eq!(
        d.map(|d| (d.worker, d.branch)),
        Some((WorkerId(3), Branch::BoundedLoad))
    );
}

#[test]
fn bounded_load_decisions_are_counted_under_their_own_branch() {
    let metrics = PolicyMetrics::default();
    let workers = sent(&[20, 20, 8, 12]);
    let d = select_on(
        ModelIndex::Tree,
        &[0, 1],
        &workers,
        &bounded(2),
        &mut Rng::new(),
    );
    metrics.record(&d.unwrap());
    let mut text = String::new();
    render_prometheus([&metrics], &mut text);
    assert!(
        text.contains("smg_cache_aware_policy_branch_total{branch=\"bounded_load_replicate\"} 1\n"),
        "{text}"
    );
}

/// The demo's workload as a count model: 32 prefix groups drawn uniformly, 4 workers, a
/// group's first request a cache miss (placed on the worker with the fewest groups), every
/// later one routed on `index`'s view of the group's holders; step 7 makes the chosen worker a
/// holder. Busy workers (a few in flight each, as the demo's 8 in flight) change at random.
fn bounded_groups_run(
    index: ModelIndex,
    margin: u32,
    seed: u64,
    requests: u32,
) -> (Vec<u64>, u32, u32) {
    let (workers, groups) = (4usize, 32usize);
    let mut rng = Rng::with_seed(seed);
    let mut statuses = sent(&[0; 4]);
    let mut holders: Vec<Vec<u16>> = vec![Vec::new(); groups];
    let mut groups_on = [0u32; 4];
    let (mut replicas, mut late_replicas) = (0u32, 0u32);
    for i in 0..requests {
        for status in &mut statuses {
            status.in_flight = rng.u32(0..3);
        }
        let group = rng.usize(0..groups);
        let worker = if holders[group].is_empty() {
            let slot = (0..workers).min_by_key(|&w| groups_on[w]).unwrap_or(0);
            groups_on[slot] += 1;
            slot as u16
        } else {
            let d = select_on(
                index,
                &holders[group],
                &statuses,
                &bounded(margin),
                &mut rng,
            )
            .expect("an eligible worker");
            if !holders[group].contains(&d.worker.0) {
                assert_eq!(d.branch, Branch::BoundedLoad, "{index:?} seed {seed}");
                replicas += 1;
                late_replicas += u32::from(i >= requests / 2);
            }
            d.worker.0
        };
        holders[group].retain(|h| *h != worker);
        holders[group].insert(0, worker);
        if index == ModelIndex::Heads {
            holders[group].truncate(crate::limits::PLACEMENT_HOLDERS_DEFAULT);
        }
        statuses[usize::from(worker)].dispatched += 1;
        // The bound holds after every request, not only at the end.
        let counts: Vec<u64> = statuses.iter().map(|s| s.dispatched).collect();
        let mean = counts.iter().sum::<u64>() as f64 / workers as f64;
        let max = counts.iter().copied().max().unwrap_or(0) as f64;
        assert!(
            max <= mean + f64::from(margin) + 3.0 || i < 64,
            "{index:?} seed {seed} request {i}: counts {counts:?}"
        );
    }
    let counts = statuses.iter().map(|s| s.dispatched).collect();
    (counts, replicas, late_replicas)
}

#[test]
fn bounded_load_on_the_demos_groups_balances_counts_with_few_replicas_and_no_oscillation() {
    for index in EVERY_INDEX {
        for seed in 0..3 {
            let (counts, replicas, late) = bounded_groups_run(index, 4, seed, 6_000);
            let max = counts.iter().copied().max().unwrap_or(0);
            // The demo's table prints max/mean to two decimals: 1.00 needs max <= 1,507.
            assert!(max <= 1_507, "{index:?} seed {seed}: counts {counts:?}");
            // A replica moves a group's share for good; the groups settle instead of moving
            // back and forth: replicas stay a few dozen in 6,000 requests, few of them late.
            assert!(replicas <= 80, "{index:?} seed {seed}: {replicas} replicas");
            assert!(
                late <= replicas / 2 + 4,
                "{index:?} seed {seed}: {late} of {replicas} late"
            );
        }
    }
}

#[test]
fn the_hashing_policies_name_smgs_branches() {
    use super::simple::{consistent_hashing_branch, prefix_hash_branch, HashBranch};
    let ring = ring(4);
    let workers = idle(4);
    let mut rng = Rng::with_seed(5);
    let ns = PartitionNamespace::UNPARTITIONED;
    let key = prefix_hash_key(RoutingKey::Tokens(&[1, 2, 3]), ns, 256, &[]);
    let (owner, branch) = prefix_hash_branch(key, &ring, &workers, CAP_ONLY, &mut rng);
    assert_eq!(branch, HashBranch::RingHit);
    let owner = owner.unwrap_or_default();
    let mut busy = idle(4);
    busy[owner.index()].in_flight = 10;
    let (moved, branch) = prefix_hash_branch(key, &ring, &busy, CAP_ONLY, &mut rng);
    assert_eq!(branch, HashBranch::LoadBalanceWalk);
    assert_ne!(moved, Some(owner));
    // Everyone at the mean and past the cap: none takes it on the ring.
    let mut all_busy = idle(4);
    all_busy.iter_mut().for_each(|w| w.in_flight = 10);
    let strict = PrefixHashBalance {
        load_factor: 0.1,
        abs_threshold: 0.0,
    };
    let (least, branch) = prefix_hash_branch(key, &ring, &all_busy, strict, &mut rng);
    assert!(least.is_some());
    assert_eq!(branch, HashBranch::FallbackLeastLoad);
    let mut none = idle(4);
    none.iter_mut().for_each(|w| w.eligible = false);
    let (picked, branch) = prefix_hash_branch(key, &ring, &none, CAP_ONLY, &mut rng);
    assert_eq!((picked, branch), (None, HashBranch::NoHealthyWorkers));
    // consistent_hashing: target hit and miss, routing key, random.
    let target = Some("http://127.0.0.1:31002");
    let hit = consistent_hashing_branch(target, None, &ring, &workers, &mut rng);
    assert_eq!(hit, (Some(WorkerId(2)), HashBranch::TargetWorkerHit));
    let gone = Some("http://127.0.0.1:39999");
    let (_, branch) = consistent_hashing_branch(gone, None, &ring, &workers, &mut rng);
    assert_eq!(branch, HashBranch::TargetWorkerMiss);
    let keyed = Some(xxhash_rust::xxh3::xxh3_64(b"user-42"));
    let (_, branch) = consistent_hashing_branch(None, keyed, &ring, &workers, &mut rng);
    assert_eq!(branch, HashBranch::RoutingKeyHit);
    let (_, branch) = consistent_hashing_branch(None, None, &ring, &workers, &mut rng);
    assert_eq!(branch, HashBranch::RandomFallback);
    let (picked, branch) = consistent_hashing_branch(target, keyed, &ring, &none, &mut rng);
    assert_eq!((picked, branch), (None, HashBranch::NoHealthyWorkers));
    // Rendered with SMG's five labels each.
    let metrics = PolicyMetrics::default();
    metrics.record_hash_branch(HashBranch::RingHit);
    metrics.record_hash_branch(HashBranch::RingHit);
    metrics.record_hash_branch(HashBranch::TargetWorkerMiss);
    let mut text = String::new();
    render_prometheus([&metrics], &mut text);
    assert!(text.contains("smg_prefix_hash_policy_branch_total{branch=\"ring_hit\"} 2\n"));
    assert!(text.contains("smg_prefix_hash_policy_branch_total{branch=\"no_tokens\"} 0\n"));
    assert!(text
        .contains("smg_consistent_hashing_policy_branch_total{branch=\"target_worker_miss\"} 1\n"));
    assert_eq!(
        text.matches("smg_consistent_hashing_policy_branch_total{")
            .count(),
        5
    );
}
