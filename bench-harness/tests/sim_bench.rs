//! How much load one `sim-engine` core sustains: a tokio client loop drives a fleet over
//! keep-alive connections and reports requests per second together with the CPU seconds the
//! sim-engine process used (from `/proc/<pid>/stat`), hence requests per sim-engine core-second.
//!
//! The `#[ignore]` benchmark (figures in `perf/results-sim.md`):
//! `cargo test --release -p bench-harness --test sim_bench -- --ignored --nocapture`
//! with `SIM_BENCH_ENGINES` (comma list, default `4,16,64`), `SIM_BENCH_SECONDS` (5),
//! `SIM_BENCH_CONNECTIONS` (64), `SIM_BENCH_MAX_TOKENS` (32), `SIM_BENCH_PROMPT_WORDS` (512),
//! `SIM_BENCH_STREAM` (1), `SIM_BENCH_SPEEDUP` (100). A one-second variant runs in the normal
//! test pass so the benchmark cannot rot.

mod sim_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_harness::tokenize::synthetic_word;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use sim_support::SimFleet;

#[derive(Debug, Clone)]
struct BenchConfig {
    engines: u16,
    seconds: f64,
    connections: usize,
    max_tokens: u32,
    prompt_words: u64,
    stream: bool,
    speedup: f64,
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

fn request_body(config: &BenchConfig, connection: usize, sequence: u64) -> String {
    // A shared 3/4 prefix per connection group and a unique tail: realistic cache traffic.
    let shared = config.prompt_words * 3 / 4;
    let mut words: Vec<String> = (0..shared)
        .map(|n| synthetic_word(n + (connection % 8) as u64 * 1_000_000))
        .collect();
    let tail = 10_000_000 + (connection as u64) * 1_000_000 + sequence * 1_000;
    words.extend((0..config.prompt_words - shared).map(|n| synthetic_word(tail + n)));
    serde_json::json!({
        "messages": [{"role": "user", "content": words.join(" ")}],
        "max_tokens": config.max_tokens,
        "stream": config.stream,
    })
    .to_string()
}

async fn client_loop(
    port: u16,
    connection: usize,
    config: BenchConfig,
    deadline: Instant,
    counters: Arc<Counters>,
) {
    let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
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
        let body = request_body(&config, connection, sequence);
        let request = hyper::Request::post("/v1/chat/completions")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
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
fn run(config: &BenchConfig) -> (f64, f64, f64, u64) {
    let speedup = config.speedup.to_string();
    let fleet = SimFleet::start(config.engines, &["--speedup", &speedup]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let counters = Arc::new(Counters::default());
    let cpu_before = cpu_seconds(fleet.pid());
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(config.seconds);
    runtime.block_on(async {
        let tasks: Vec<_> = (0..config.connections)
            .map(|connection| {
                let port = fleet.port((connection % usize::from(config.engines)) as u16);
                tokio::spawn(client_loop(
                    port,
                    connection,
                    config.clone(),
                    deadline,
                    Arc::clone(&counters),
                ))
            })
            .collect();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(fleet.pid()) - cpu_before;
    let ok = counters.ok.load(Ordering::Relaxed);
    assert_eq!(
        counters.failed.load(Ordering::Relaxed),
        0,
        "failed requests in {config:?}"
    );
    let per_cpu_second = if cpu > 0.0 {
        ok as f64 / cpu
    } else {
        f64::INFINITY
    };
    (
        ok as f64 / elapsed,
        cpu / elapsed,
        per_cpu_second,
        counters.body_bytes.load(Ordering::Relaxed),
    )
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
    };
    let (requests_per_s, _, _, body_bytes) = run(&config);
    assert!(requests_per_s > 0.0);
    println!("sim_bench short: {requests_per_s:.0} req/s, checksum {body_bytes} body bytes");
}

#[test]
#[ignore = "benchmark: run with --release --ignored --nocapture"]
fn fleet_throughput() {
    let engines: Vec<u16> = std::env::var("SIM_BENCH_ENGINES")
        .unwrap_or_else(|_| "4,16,64".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    println!("| engines | connections | stream | max_tokens | prompt words | req/s | sim-engine CPU | req per sim CPU-s |");
    println!("|---|---|---|---|---|---|---|---|");
    for engines in engines {
        let config = BenchConfig {
            engines,
            seconds: env_or("SIM_BENCH_SECONDS", 5.0),
            connections: env_or("SIM_BENCH_CONNECTIONS", 64),
            max_tokens: env_or("SIM_BENCH_MAX_TOKENS", 32),
            prompt_words: env_or("SIM_BENCH_PROMPT_WORDS", 512),
            stream: env_or("SIM_BENCH_STREAM", 1) == 1,
            speedup: env_or("SIM_BENCH_SPEEDUP", 100.0),
        };
        let (requests_per_s, cpu_fraction, per_cpu_second, _) = run(&config);
        println!(
            "| {} | {} | {} | {} | {} | {requests_per_s:.0} | {:.0}% | {per_cpu_second:.0} |",
            config.engines,
            config.connections,
            config.stream,
            config.max_tokens,
            config.prompt_words,
            cpu_fraction * 100.0
        );
    }
}
