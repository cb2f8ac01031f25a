//! The KV-event index against real engines' caches: `sim-engine` fleets publishing in vLLM's
//! and in SGLang's format, with small caches that evict, a restart, and a flush. The control
//! core's KV side (`control::kv_events::KvEvents`, its subscribers, decoding and index writes)
//! runs in this process, learning every endpoint from the engines' `/server_info`; at
//! quiescence the blocks it lists for each engine equal that engine's cache (`GET /sim/cache`)
//! exactly. A gateway in front of a fleet then routes a family to the engine caching it.

mod utils;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clap::Parser;
use kvgate::config::{Cli, Config};
use kvgate::control::kv_events::KvEvents;
use kvgate::ids::WorkerId;
use kvgate::index::kv::KvIndexWriter;
use kvgate::kv_events::bytes_hash;
use kvgate::shared::Shared;
use utils::process::{free_port_block, Gateway, SimFleet};
use utils::wait_until;

const BLOCK: usize = 16;
const QUIESCENCE: Duration = Duration::from_secs(20);

/// A fleet publishing KV events in `format` with caches of `capacity` tokens. Its KV-event ports
/// are a second block: a start that fails (a port taken meanwhile) is tried on fresh blocks.
fn fleet(engines: u16, format: &str, capacity: u32) -> SimFleet {
    const ATTEMPTS: usize = 5;
    let capacity = capacity.to_string();
    for _ in 0..ATTEMPTS {
        let kv_base = free_port_block(2 * engines).to_string();
        let args = [
            "--speedup",
            "50",
            "--kv-capacity-tokens",
            &capacity,
            "--kv-events-base-port",
            &kv_base,
            "--kv-events-format",
            format,
        ];
        if let Some(fleet) = SimFleet::try_start(engines, &args) {
            return fleet;
        }
    }
    panic!("a {format} fleet did not start on {ATTEMPTS} blocks of ports (KVGATE_TEST_LOGS=1)");
}

/// `blocks` whole blocks of family `family`, then 5 more tokens.
fn tokens(family: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK + 5) as u32)
        .map(|i| family * 10_000 + i)
        .collect()
}

fn generate(fleet: &SimFleet, engine: u16, tokens: &[u32]) {
    let body = serde_json::json!({
        "input_ids": tokens,
        "sampling_params": {"max_new_tokens": 2},
    });
    let response = fleet
        .client(engine)
        .post_json("/generate", &body.to_string());
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Engine `engine`'s cached blocks, as engine hashes the way its format sends them.
fn engine_blocks(fleet: &SimFleet, engine: u16, format: &str) -> BTreeSet<u64> {
    let cache = fleet.client(engine).get("/sim/cache").json();
    let keys = cache["blocks"].as_array().expect("blocks").iter();
    keys.map(|k| k.as_u64().expect("u64 keys"))
        .map(|key| match format {
            // vLLM sends hashes as bytes: the key's 8 bytes, folded as the gateway folds bytes.
            "vllm" => bytes_hash(&key.to_be_bytes()),
            _ => key,
        })
        .collect()
}

fn index_blocks(writer: &KvIndexWriter, engine: u16) -> BTreeSet<u64> {
    writer
        .engine_hashes_of(WorkerId(engine))
        .into_iter()
        .collect()
}

/// Runs the control core's KV side over `fleet` in this thread while `work` drives the engines
/// (on another thread), then until every engine's listed blocks equal its cache.
fn follow_and_compare(
    fleet: &SimFleet,
    format: &str,
    work: impl FnOnce() + Send,
) -> Vec<BTreeSet<u64>> {
    let mut args = vec!["kvgate".to_string(), "--worker-urls".to_string()];
    args.extend(fleet.urls());
    let config = Config::from_cli(&Cli::parse_from(args)).expect("valid flags");
    let shared = Shared::new(config);
    let mut events = KvEvents::new(KvIndexWriter::new(1 << 16), None);
    let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("a monoio runtime");
    let engines = fleet.engines;
    std::thread::scope(|scope| {
        let worker = scope.spawn(work);
        runtime.block_on(async {
            // Subscribed (endpoints from /server_info) before the work starts mattering: the
            // replay catches up on whatever came first anyway.
            while !worker.is_finished() {
                events.turn(&shared);
                monoio::time::sleep(Duration::from_millis(5)).await;
            }
            let deadline = Instant::now() + QUIESCENCE;
            loop {
                events.turn(&shared);
                let equal = (0..engines).all(|e| {
                    index_blocks(events.writer(), e) == engine_blocks(fleet, e, format)
                });
                if equal {
                    break;
                }
                if Instant::now() > deadline {
                    for e in 0..engines {
                        let (ours, theirs) =
                            (index_blocks(events.writer(), e), engine_blocks(fleet, e, format));
                        eprintln!(
                            "engine {e}: index {} blocks, cache {}, only in index {}, only in cache {}",
                            ours.len(),
                            theirs.len(),
                            ours.difference(&theirs).count(),
                            theirs.difference(&ours).count()
                        );
                    }
                    panic!("the index never equalled the engines' caches");
                }
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        worker.join().expect("the workload ran");
    });
    (0..engines)
        .map(|e| index_blocks(events.writer(), e))
        .collect()
}

/// Families sent to engines in turn, more than the caches hold: every engine evicts.
fn evicting_workload(fleet: &SimFleet) {
    for round in 0..3u32 {
        for family in 0..12u32 {
            let engine = ((family + round) % u32::from(fleet.engines)) as u16;
            generate(fleet, engine, &tokens(family, 24));
        }
    }
}

#[test]
fn at_quiescence_the_index_equals_every_engines_cache_vllm_format() {
    let fleet = fleet(3, "vllm", 2048);
    let listed = follow_and_compare(&fleet, "vllm", || evicting_workload(&fleet));
    // The caches evicted (2048 tokens hold 128 blocks; each engine saw 12 x 24) and still hold
    // something: the comparison was not of empty sets.
    for (engine, blocks) in listed.iter().enumerate() {
        assert!(
            !blocks.is_empty() && blocks.len() <= 128,
            "engine {engine}: {}",
            blocks.len()
        );
        let published = fleet.stats(engine as u16)["kv_events"]["batches_total"].as_u64();
        assert!(published.unwrap_or(0) > 0);
    }
}

#[test]
fn at_quiescence_the_index_equals_every_engines_cache_sglang_format_after_restart_and_flush() {
    let fleet = fleet(2, "sglang", 4096);
    let listed = follow_and_compare(&fleet, "sglang", || {
        evicting_workload(&fleet);
        // Engine 0 restarts (its cache is gone, no event says so); engine 1 flushes.
        let restarted = fleet.client(0).post_json("/sim/restart", "{}");
        assert_eq!(restarted.status, 200, "{}", restarted.text());
        let flushed = fleet.client(1).post_json("/flush_cache", "{}");
        assert_eq!(flushed.status, 200, "{}", flushed.text());
        std::thread::sleep(Duration::from_millis(400));
        generate(&fleet, 0, &tokens(40, 8));
        generate(&fleet, 1, &tokens(41, 8));
    });
    // Only what came after the restart and the flush: 8 prompt blocks and an output block.
    assert!((8..=9).contains(&listed[0].len()), "{}", listed[0].len());
    assert!((8..=9).contains(&listed[1].len()), "{}", listed[1].len());
}

#[test]
fn a_gateway_routes_a_family_to_the_engine_that_caches_it() {
    let fleet = fleet(3, "vllm", 65_536);
    // Each family cached on one engine, straight from the engines (not through the gateway).
    for family in 0..3u32 {
        generate(&fleet, family as u16, &tokens(family, 16));
    }
    let gateway = Gateway::start(&fleet.urls(), &[]);
    for e in 0..3 {
        let held = format!(
            "kvgate_kv_index_worker_blocks{{worker=\"{}\"}}",
            fleet.url(e)
        );
        // Learned from the replay socket: the blocks were cached before the gateway started.
        assert!(
            wait_until(QUIESCENCE, || gateway.metric(&held) >= 16.0),
            "{}",
            gateway.metrics()
        );
    }
    for _ in 0..3 {
        for family in 0..3u32 {
            let body = serde_json::json!({
                "model": "sim-model",
                "input_ids": tokens(family, 20),
                "sampling_params": {"max_new_tokens": 1},
            });
            let response = gateway.client().post_json("/generate", &body.to_string());
            assert_eq!(response.status, 200, "{}", response.text());
            assert_eq!(
                response.routed_worker(),
                Some(fleet.url(family as u16).as_str())
            );
        }
    }
}
