//! How much load one `sim-engine` core sustains: a tokio client loop drives a fleet over
//! keep-alive connections and reports requests per second together with the CPU seconds the
//! sim-engine process used (from `/proc/<pid>/stat`), hence requests per sim-engine core-second.
//!
//! The `#[ignore]` benchmark (figures in `perf/results-sim.md`):
//! `cargo test --release -p bench-harness --test sim_bench -- --ignored --nocapture`
//! with `SIM_BENCH_ENGINES` (comma list, default `4,16,64`), `SIM_BENCH_SECONDS` (5),
//! `SIM_BENCH_CONNECTIONS` (64), `SIM_BENCH_MAX_TOKENS` (32), `SIM_BENCH_PROMPT_WORDS` (512),
//! `SIM_BENCH_STREAM` (1), `SIM_BENCH_SPEEDUP` (100), `SIM_BENCH_INSTANT` (0; 1 adds `--instant`). A one-second variant runs in the normal
//! test pass so the benchmark cannot rot.

#[path = "../../tests/utils/mod.rs"]
mod utils;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_harness::tokenize::synthetic_word;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use utils::process::SimFleet;

/// Distinct prompts per connection (their unique tails make cache misses realistic).
const BODIES_PER_CONNECTION: usize = 16;

#[derive(Debug, Clone)]
struct BenchConfig {
    engines: u16,
    seconds: f64,
    connections: usize,
    max_tokens: u32,
    prompt_words: u64,
    stream: bool,
    speedup: f64,
    /// `--instant`: no simulated timing (the proxy-benchmark upstream).
    instant: bool,
}

#[derive(Debug, Default)]
struct Counters {
    ok: AtomicU64,
    failed: AtomicU64,
    body_bytes: AtomicU64,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// utime + stime of a process in seconds (clock ticks of 1/100 s, Linux's USER_HZ).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn request_body(config: &BenchConfig, connection: usize, sequence: usize) -> String {
    // A shared 3/4 prefix per connection group and a unique tail: realistic cache traffic.
    let shared = config.prompt_words * 3 / 4;
    let mut words: Vec<String> = (0..shared)
        .map(|n| synthetic_word(n + (connection % 8) as u64 * 1_000_000))
        .collect();
    let tail = 10_000_000 + (connection as u64) * 1_000_000 + sequence as u64 * 1_000;
    words.extend((0..config.prompt_words - shared).map(|n| synthetic_word(tail + n)));
    serde_json::json!({
        "messages": [{"role": "user", "content": words.join(" ")}],
        "max_tokens": config.max_tokens,
        "stream": config.stream,
    })
    .to_string()
}

async fn client_loop(port: u16, bodies: Vec<Bytes>, deadline: Instant, counters: Arc<Counters>) {
    let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, driver)) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    tokio::spawn(driver);
    let mut sequence = 0;
    while Instant::now() < deadline {
        sequence += 1;
        let body = bodies[sequence % bodies.len()].clone();
        let request = hyper::Request::post("/v1/chat/completions")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body))
            .expect("valid request");
        let outcome = match sender.send_request(request).await {
            Ok(response) if response.status() == 200 => response.into_body().collect().await.ok(),
            _ => None,
        };
        match outcome {
            Some(collected) => {
                counters.ok.fetch_add(1, Ordering::Relaxed);
                counters
                    .body_bytes
                    .fetch_add(collected.to_bytes().len() as u64, Ordering::Relaxed);
            }
            None => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

/// Runs one configuration; returns (requests/s, sim-engine CPU fraction, requests per CPU-s).
/// One configuration's figures.
#[derive(Debug)]
struct BenchResult {
    requests_per_s: f64,
    /// sim-engine CPU seconds per wall second.
    sim_cpu_fraction: f64,
    /// The load generator's CPU seconds per wall second (it shares the machine).
    client_cpu_fraction: f64,
    /// Requests per sim-engine CPU second: what one core sustains.
    requests_per_sim_cpu_s: f64,
    /// Checksum: response body bytes received.
    body_bytes: u64,
}

fn run(config: &BenchConfig) -> BenchResult {
    let speedup = config.speedup.to_string();
    let mut args = vec!["--speedup", &speedup];
    if config.instant {
        args.push("--instant");
    }
    let fleet = SimFleet::start(config.engines, &args);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let counters = Arc::new(Counters::default());
    let bodies: Vec<Vec<Bytes>> = (0..config.connections)
        .map(|connection| {
            (0..BODIES_PER_CONNECTION)
                .map(|sequence| Bytes::from(request_body(config, connection, sequence)))
                .collect()
        })
        .collect();
    let sim_cpu_before = cpu_seconds(fleet.process.pid());
    let client_cpu_before = cpu_seconds(std::process::id());
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(config.seconds);
    runtime.block_on(async {
        let tasks: Vec<_> = bodies
            .into_iter()
            .enumerate()
            .map(|(connection, bodies)| {
                let port = fleet.port((connection % usize::from(config.engines)) as u16);
                let counters = Arc::clone(&counters);
                tokio::spawn(client_loop(port, bodies, deadline, counters))
            })
            .collect();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let sim_cpu = cpu_seconds(fleet.process.pid()) - sim_cpu_before;
    let client_cpu = cpu_seconds(std::process::id()) - client_cpu_before;
    let ok = counters.ok.load(Ordering::Relaxed);
    let failed = counters.failed.load(Ordering::Relaxed);
    assert_eq!(failed, 0, "failed requests in {config:?}");
    BenchResult {
        requests_per_s: ok as f64 / elapsed,
        sim_cpu_fraction: sim_cpu / elapsed,
        client_cpu_fraction: client_cpu / elapsed,
        requests_per_sim_cpu_s: if sim_cpu > 0.0 {
            ok as f64 / sim_cpu
        } else {
            f64::INFINITY
        },
        body_bytes: counters.body_bytes.load(Ordering::Relaxed),
    }
}

#[test]
fn fleet_throughput_short() {
    let config = BenchConfig {
        engines: 2,
        seconds: 1.0,
        connections: 4,
        max_tokens: 8,
        prompt_words: 64,
        stream: true,
        speedup: 100.0,
        instant: false,
    };
    let result = run(&config);
    assert!(result.requests_per_s > 0.0 && result.body_bytes > 0);
    println!("sim_bench short: {result:?}");
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn fleet_throughput() {
    let engines: Vec<u16> = std::env::var("SIM_BENCH_ENGINES")
        .unwrap_or_else(|_| "4,16,64".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    println!("| engines | instant | connections | stream | max_tokens | prompt words | req/s | sim-engine CPU | client CPU | req per sim-engine CPU-s |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for engines in engines {
        let config = BenchConfig {
            engines,
            seconds: env_or("SIM_BENCH_SECONDS", 5.0),
            connections: env_or("SIM_BENCH_CONNECTIONS", 64),
            max_tokens: env_or("SIM_BENCH_MAX_TOKENS", 32),
            prompt_words: env_or("SIM_BENCH_PROMPT_WORDS", 512),
            stream: env_or("SIM_BENCH_STREAM", 1) == 1,
            speedup: env_or("SIM_BENCH_SPEEDUP", 100.0),
            instant: env_or("SIM_BENCH_INSTANT", 0) == 1,
        };
        let result = run(&config);
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0}% | {:.0}% | {:.0} |",
            config.engines,
            config.instant,
            config.connections,
            config.stream,
            config.max_tokens,
            config.prompt_words,
            result.requests_per_s,
            result.sim_cpu_fraction * 100.0,
            result.client_cpu_fraction * 100.0,
            result.requests_per_sim_cpu_s,
        );
    }
}
