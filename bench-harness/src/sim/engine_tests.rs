//! Scheduler and engine-model tests, all on the simulated clock (no sockets, no sleeping).

use super::*;
use crate::sim::cache::CacheEvent;
use crate::sim::output::output_token;

fn config(kv_capacity_tokens: u64, max_running_requests: usize) -> EngineConfig {
    EngineConfig {
        kv_capacity_tokens,
        max_running_requests,
        ..EngineConfig::default()
    }
}

fn request(first_token: u32, prompt_len: u32, max_new_tokens: u32) -> SimRequest {
    SimRequest {
        namespace: 0,
        tokens: (first_token..first_token + prompt_len).collect(),
        max_new_tokens,
        output_seed: u64::from(first_token),
        prefilled: false,
    }
}

/// Simulated time of each request's first token, by request id.
fn first_token_times(emits: &[Emit]) -> HashMap<RequestId, u64> {
    let mut times = HashMap::new();
    for emit in emits.iter().filter(|emit| emit.completion_tokens == 1) {
        times.insert(emit.id, emit.at_us);
    }
    times
}

use std::collections::HashMap;

#[test]
fn a_lone_request_follows_the_cost_model() {
    let mut engine = Engine::new(config(1 << 16, 8));
    let cost = engine.config().cost;
    engine.submit(request(0, 1000, 3)).unwrap();
    let emits = engine.run_until_idle(100);
    assert_eq!(emits.len(), 3);
    let ttft = cost.prefill_us(1000);
    assert_eq!(emits[0].at_us, ttft);
    assert!(!emits[0].finished);
    assert!(emits[2].finished);
    // Decode steps are priced at the KV tokens held at the moment: 1001 then 1002 tokens in
    // use (their share of the published curve's pool, not of this engine's cache).
    let step1 = cost.decode_us_holding(992 + 9);
    let step2 = cost.decode_us_holding(992 + 10);
    assert_eq!(emits[1].at_us, ttft + step1);
    assert_eq!(emits[2].at_us, ttft + step1 + step2);
    assert!(engine.is_idle());
    assert_eq!(engine.totals().requests_finished, 1);
}

#[test]
fn queueing_raises_ttft_under_load() {
    let alone = {
        let mut engine = Engine::new(config(1 << 20, 4));
        engine.submit(request(0, 512, 32)).unwrap();
        first_token_times(&engine.run_until_idle(10_000))[&1]
    };
    let mut engine = Engine::new(config(1 << 20, 4));
    let ids: Vec<RequestId> = (0..16)
        .map(|n| engine.submit(request(n * 10_000, 512, 32)).unwrap())
        .collect();
    assert_eq!(engine.loads(0).num_waiting_reqs, 16);
    engine.begin_step(0);
    let load = engine.loads(0);
    assert_eq!(
        load.num_running_reqs, 4,
        "max_running_requests caps the batch"
    );
    assert_eq!(load.num_waiting_reqs, 12);
    assert_eq!(load.num_waiting_uncached_tokens, 12 * 512);
    engine.finish_step();
    let ttft = first_token_times(&engine.run_until_idle(100_000));
    let last = ttft[&ids[15]];
    assert!(
        last > 3 * alone,
        "queued request TTFT {last} us vs alone {alone} us"
    );
    let mut previous = 0;
    for id in &ids[4..] {
        assert!(ttft[id] >= previous, "FCFS order");
        previous = ttft[id];
    }
}

#[test]
fn a_cached_prefix_lowers_ttft() {
    let mut engine = Engine::new(config(1 << 20, 8));
    let cost = engine.config().cost;
    engine.submit(request(0, 4096, 1)).unwrap();
    let cold = engine.run_until_idle(10);
    assert_eq!(cold[0].cached_tokens, 0);
    let cold_ttft = cold[0].at_us;
    // Same 4096-token prefix plus 100 new tokens.
    let start = engine.now_us();
    let mut warm_request = request(0, 4096, 1);
    warm_request.tokens.extend(900_000..900_100);
    engine.submit(warm_request).unwrap();
    let warm = engine.run_until_idle(10);
    assert_eq!(warm[0].cached_tokens, 4096);
    let warm_ttft = warm[0].at_us - start;
    assert_eq!(warm_ttft, cost.prefill_us(100));
    assert!(
        warm_ttft * 3 < cold_ttft,
        "warm {warm_ttft} us vs cold {cold_ttft} us"
    );
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_page() {
    let mut engine = Engine::new(config(1 << 20, 8));
    engine.submit(request(0, 64, 1)).unwrap();
    engine.run_until_idle(10);
    engine.submit(request(0, 64, 1)).unwrap();
    let again = engine.run_until_idle(10);
    assert_eq!(again[0].cached_tokens, 48, "the last page is recomputed");
}

#[test]
fn namespaces_do_not_share_cache() {
    let mut engine = Engine::new(config(1 << 20, 8));
    engine.submit(request(0, 256, 1)).unwrap();
    engine.run_until_idle(10);
    let mut salted = request(0, 256, 1);
    salted.namespace = 99;
    engine.submit(salted.clone()).unwrap();
    assert_eq!(engine.run_until_idle(10)[0].cached_tokens, 0);
    engine.submit(salted).unwrap();
    assert_eq!(engine.run_until_idle(10)[0].cached_tokens, 240);
}

#[test]
fn admission_waits_for_free_kv_pages() {
    // 1024 tokens of KV: one request of 600 + 100 fits, a second one does not.
    let mut engine = Engine::new(config(1024, 8));
    let first = engine.submit(request(0, 600, 100)).unwrap();
    let second = engine.submit(request(10_000, 600, 100)).unwrap();
    engine.begin_step(0);
    let load = engine.loads(0);
    assert_eq!((load.num_running_reqs, load.num_waiting_reqs), (1, 1));
    engine.finish_step();
    let emits = engine.run_until_idle(10_000);
    let ttft = first_token_times(&emits);
    let first_done = emits
        .iter()
        .find(|e| e.id == first && e.finished)
        .unwrap()
        .at_us;
    assert!(
        ttft[&second] > first_done,
        "second admitted only after the first released its pages"
    );
    assert!(engine.loads(engine.now_us()).num_used_tokens == 0);
}

#[test]
fn running_requests_keep_their_pages_pinned() {
    let mut engine = Engine::new(config(2048, 8));
    engine.submit(request(0, 1000, 200)).unwrap();
    engine.begin_step(0);
    engine.finish_step();
    // A newcomer that needs more than the unpinned rest must wait, not evict the runner.
    engine.submit(request(50_000, 1000, 200)).unwrap();
    engine.begin_step(engine.now_us());
    let load = engine.loads(engine.now_us());
    assert_eq!((load.num_running_reqs, load.num_waiting_reqs), (1, 1));
    assert!(load.num_used_tokens >= 1000);
    assert!(load.token_usage > 0.45);
}

#[test]
fn requests_too_large_for_kv_memory_are_refused() {
    let mut engine = Engine::new(config(1024, 8));
    let refused = engine.submit(request(0, 1000, 100));
    assert_eq!(
        refused,
        Err(SubmitError::TooLong {
            needed_tokens: 1100,
            capacity_tokens: 1024
        })
    );
    assert!(engine.is_idle());
}

#[test]
fn cancelling_returns_every_page() {
    let mut engine = Engine::new(config(4096, 8));
    let id = engine.submit(request(0, 1000, 500)).unwrap();
    engine.begin_step(0);
    engine.finish_step();
    assert!(engine.loads(engine.now_us()).num_used_tokens > 0);
    assert!(engine.cancel(id));
    assert!(!engine.cancel(id));
    assert_eq!(engine.loads(engine.now_us()).num_used_tokens, 0);
    assert_eq!(engine.cache.reserved_pages(), 0);
    assert_eq!(engine.cache.pinned_pages(), 0);
    assert_eq!(engine.totals().requests_cancelled, 1);
    // Its prompt pages stay cached for later requests.
    assert_eq!(engine.cache.cached_pages(), 1000 / 16);
    assert!(engine.run_until_idle(10).is_empty());
}

#[test]
fn a_follow_up_turn_hits_the_generated_tokens() {
    let mut engine = Engine::new(config(1 << 20, 8));
    let first = request(0, 100, 60);
    engine.submit(first.clone()).unwrap();
    engine.run_until_idle(1000);
    let mut follow_up = first.clone();
    follow_up
        .tokens
        .extend((0..60).map(|k| output_token(first.output_seed, k)));
    follow_up.tokens.extend(777_000..777_050);
    follow_up.output_seed = 1;
    engine.submit(follow_up).unwrap();
    let emits = engine.run_until_idle(1000);
    // 160 tokens of history = 10 whole pages.
    assert_eq!(emits[0].cached_tokens, 160);
}

#[test]
fn prefill_batches_respect_max_prefill_tokens() {
    let mut engine = Engine::new(EngineConfig {
        max_prefill_tokens: 16_384,
        chunked_prefill_size: 0,
        ..config(1 << 20, 64)
    });
    let cost = engine.config().cost;
    for n in 0..3 {
        engine.submit(request(n * 100_000, 10_000, 1)).unwrap();
    }
    let ends: Vec<u64> = (0..3)
        .map(|_| {
            let end = engine.begin_step(engine.now_us()).unwrap();
            engine.finish_step();
            end
        })
        .collect();
    assert_eq!(ends[0], cost.prefill_us(10_000));
    assert_eq!(ends[2], 3 * cost.prefill_us(10_000));
    assert!(engine.is_idle());
}

#[test]
fn loads_report_throughput_and_hit_rate() {
    let mut engine = Engine::new(config(1 << 20, 64));
    for _ in 0..4 {
        engine.submit(request(0, 320, 50)).unwrap();
        engine.run_until_idle(1000);
    }
    let load = engine.loads(engine.now_us());
    assert!(load.gen_throughput > 0.0);
    // 4 × 320 prompt tokens, the last 3 with 304 cached each.
    let expected = 3.0 * 304.0 / (4.0 * 320.0);
    assert!(
        (load.cache_hit_rate - expected).abs() < 1e-9,
        "{}",
        load.cache_hit_rate
    );
    assert!(
        load.utilization > 0.99,
        "busy all along: {}",
        load.utilization
    );
    // Ten idle simulated seconds later the windows hold no work.
    let later = engine.loads(engine.now_us() + 10_000_000);
    assert_eq!(later.gen_throughput, 0.0);
    assert_eq!(later.utilization, 0.0);
}

#[test]
fn decode_slows_as_kv_usage_grows() {
    let mut engine = Engine::new(config(8192, 64));
    for n in 0..7 {
        engine.submit(request(n * 10_000, 1000, 40)).unwrap();
    }
    engine.begin_step(0);
    engine.finish_step();
    let start = engine.now_us();
    let end = engine.begin_step(start).unwrap();
    let loads = engine.loads(start);
    assert!(loads.token_usage > 0.8);
    let cost = engine.config().cost;
    assert_eq!(end - start, cost.decode_us_holding(loads.num_used_tokens));
    assert!(
        end - start > cost.decode_us_holding(1001),
        "one request's step is quicker"
    );
}

#[test]
fn requests_are_not_admitted_before_they_arrive() {
    let mut engine = Engine::new(config(1 << 20, 8));
    let cost = engine.config().cost;
    engine.submit_at(request(0, 100, 1), 2_000_000).unwrap();
    let emits = engine.run_until_idle(10);
    assert_eq!(emits[0].at_us, 2_000_000 + cost.prefill_us(100));
    // While busy, a later arrival waits for its own time, not the current step.
    engine
        .submit_at(request(1000, 100, 50), engine.now_us())
        .unwrap();
    let late = engine.now_us() + 100_000;
    let late_id = engine.submit_at(request(5000, 100, 1), late).unwrap();
    let emits = engine.run_until_idle(1000);
    let ttft = first_token_times(&emits);
    assert!(ttft[&late_id] >= late + cost.prefill_us(100));
}

#[test]
fn a_full_queue_refuses_requests() {
    let mut engine = Engine::new(EngineConfig {
        max_waiting_requests: 2,
        ..config(1 << 20, 8)
    });
    engine.submit(request(0, 10, 1)).unwrap();
    engine.submit(request(0, 10, 1)).unwrap();
    assert_eq!(
        engine.submit(request(0, 10, 1)),
        Err(SubmitError::QueueFull {
            max_waiting_requests: 2
        })
    );
    engine.begin_step(0);
    assert!(
        engine.submit(request(0, 10, 1)).is_ok(),
        "admission drained the queue"
    );
}

#[test]
fn chunked_prefill_splits_long_prompts_across_steps() {
    let chunked = EngineConfig {
        chunked_prefill_size: 8192,
        ..config(1 << 20, 8)
    };
    let mut engine = Engine::new(chunked);
    let cost = engine.config().cost;
    let long = engine.submit(request(0, 20_000, 1)).unwrap();
    let short = engine.submit(request(100_000, 100, 1)).unwrap();
    let mut ends = Vec::new();
    for running_expected in [1, 1, 2] {
        let end = engine.begin_step(engine.now_us()).unwrap();
        // The short request is admitted only once the long prompt's last chunk leaves room.
        assert_eq!(engine.loads(end).num_running_reqs, running_expected);
        engine.finish_step();
        ends.push(end);
    }
    assert_eq!(ends[0], cost.prefill_us(8192));
    assert_eq!(ends[1], 2 * cost.prefill_us(8192));
    // The last 3616 tokens and the short prompt share the third step.
    assert_eq!(
        ends[2],
        2 * cost.prefill_us(8192) + cost.prefill_us(3616 + 100)
    );
    assert!(engine.is_idle(), "both finished: {long} {short}");
    // Whole, the quadratic term makes the same prompt slower.
    let mut whole = Engine::new(EngineConfig {
        chunked_prefill_size: 0,
        ..config(1 << 20, 8)
    });
    whole.submit(request(0, 20_000, 1)).unwrap();
    assert_eq!(whole.run_until_idle(10)[0].at_us, cost.prefill_us(20_000));
    assert!(cost.prefill_us(20_000) > ends[1] + cost.prefill_us(3616));
}

fn recording(kv_capacity_tokens: u64) -> Engine {
    Engine::new(EngineConfig {
        record_kv_events: true,
        ..config(kv_capacity_tokens, 8)
    })
}

/// The keys of every stored event, in order, checked against the tokens they carry: a stored
/// run's keys are the chained keys of its tokens from its parent on.
fn stored_keys(events: &[CacheEvent], namespace: u64) -> Vec<u64> {
    let mut keys = Vec::new();
    for event in events {
        if let CacheEvent::Stored {
            keys: run,
            parent_key,
            tokens,
        } = event
        {
            let chained = page_keys(parent_key.unwrap_or(namespace), tokens, 16);
            assert_eq!(&chained, run, "keys chain from the parent over the tokens");
            keys.extend_from_slice(run);
        }
    }
    keys
}

#[test]
fn prompt_and_output_pages_are_stored_with_their_tokens() {
    let mut engine = recording(1 << 20);
    let prompt = request(0, 40, 30);
    engine.submit(prompt.clone()).unwrap();
    engine.begin_step(0);
    assert!(engine.take_cache_events().is_empty(), "nothing cached yet");
    engine.finish_step();
    let prompt_keys = page_keys(0, &prompt.tokens, 16);
    assert_eq!(
        engine.take_cache_events(),
        vec![CacheEvent::Stored {
            keys: prompt_keys.clone(),
            parent_key: None,
            tokens: prompt.tokens[..32].to_vec(),
        }]
    );
    engine.run_until_idle(100);
    // Finished: the prompt's tail (8 tokens) and 30 generated tokens make two more pages.
    let events = engine.take_cache_events();
    let [CacheEvent::Stored {
        keys,
        parent_key,
        tokens,
    }] = events.as_slice()
    else {
        panic!("one stored run of output pages, got {events:?}");
    };
    assert_eq!(keys.len(), 2);
    assert_eq!(*parent_key, prompt_keys.last().copied());
    assert_eq!(tokens[..8], prompt.tokens[32..40]);
    let generated: Vec<u32> = (0..24)
        .map(|k| output_token(prompt.output_seed, k))
        .collect();
    assert_eq!(tokens[8..], generated[..]);
    let mut all = stored_keys(&[events[0].clone()], 0);
    all.extend(prompt_keys);
    all.sort_unstable();
    assert_eq!(engine.cached_keys(), all);
}

#[test]
fn admissions_evict_and_report_it_and_restarts_report_nothing() {
    // Room for 6 pages: each request takes 2 prompt pages + 1 output page.
    let mut engine = recording(96);
    engine.submit(request(0, 32, 1)).unwrap();
    engine.run_until_idle(10);
    engine.submit(request(1000, 32, 1)).unwrap();
    engine.run_until_idle(10);
    let first = page_keys(0, &request(0, 32, 1).tokens, 16);
    let stored = stored_keys(&engine.take_cache_events(), 0);
    assert_eq!(stored.len(), 4, "two prompt pages each");
    engine.submit(request(2000, 64, 16)).unwrap();
    engine.begin_step(0);
    // 5 pages needed, 2 free: three go, the first request's (the oldest) first.
    let events = engine.take_cache_events();
    let [CacheEvent::Removed { keys }] = events.as_slice() else {
        panic!("one removal, got {events:?}");
    };
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[..2], [first[1], first[0]], "leaf first");
    engine.finish_step();
    engine.restart();
    assert!(engine.cached_keys().is_empty());
    assert!(
        engine.take_cache_events().is_empty(),
        "a crash says nothing"
    );
    assert!(engine.is_idle());
    assert_eq!(engine.totals().requests_cancelled, 1);
    assert_eq!(engine.totals().evicted_pages, 3, "counters survive");
}

/// Requests queued = finished + cancelled + still waiting or running, whether a request is
/// cancelled from the queue (never admitted), from the batch, or dropped by a restart: the chaos
/// test's drain check reads an engine's in-flight count this way.
#[test]
fn queued_requests_are_finished_cancelled_or_in_flight() {
    let mut engine = Engine::new(config(4096, 8));
    let in_flight = |engine: &Engine| {
        let totals = engine.totals();
        totals.requests_queued - totals.requests_finished - totals.requests_cancelled
    };
    let running = engine.submit(request(0, 1000, 500)).unwrap();
    engine.begin_step(0);
    engine.finish_step();
    let waiting = engine.submit(request(1, 1000, 500)).unwrap();
    assert_eq!(in_flight(&engine), 2);
    assert!(engine.cancel(waiting));
    assert_eq!(engine.totals().requests_admitted, 1);
    assert_eq!(in_flight(&engine), 1);
    assert!(engine.cancel(running));
    assert_eq!(in_flight(&engine), 0);
    engine.submit(request(2, 1000, 5)).unwrap();
    engine.submit(request(3, 1000, 5)).unwrap();
    engine.restart();
    assert_eq!(in_flight(&engine), 0);
    engine.submit(request(4, 100, 5)).unwrap();
    engine.run_until_idle(1000);
    assert!(engine.is_idle());
    assert_eq!(engine.totals().requests_finished, 1);
    assert_eq!(in_flight(&engine), 0);
}
