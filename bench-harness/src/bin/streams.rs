//! `streams`: many concurrent SSE streams, held open at once. Every stream asks for a streamed
//! completion of `--max-tokens` tokens (the engines emit one chunk per decode step); once all of
//! them are streaming, the gaps between consecutive chunks of each stream are measured for
//! `--measure-s`, with the gateway's RSS sampled at the start and end of that window. Run against
//! the engines directly and then through the gateway, the difference of the two gap
//! distributions is the delay the gateway adds, and the RSS over the idle gateway's is its
//! memory per stream. `scripts/bench-streams.sh` runs both.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bench_harness::cli::{self, exit_on_error, Failure, Threads};
use bench_harness::fleet::procstat;
use clap::Parser;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[derive(Parser, Debug)]
#[command(name = "streams")]
struct Args {
    /// Where streams go: one address, or several (engines) taken round robin.
    #[arg(long, num_args = 1.., required = true)]
    target: Vec<SocketAddr>,
    /// Concurrent streams.
    #[arg(long, default_value_t = 1_000)]
    streams: usize,
    /// Tokens each stream asks for; it must outlast the ramp-up and the measured window.
    #[arg(long, default_value_t = 60)]
    max_tokens: u32,
    /// Seconds gaps are measured, starting once every stream has had its first chunk.
    #[arg(long, default_value_t = 10)]
    measure_s: u64,
    /// The model asked for.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// A process whose RSS and CPU time are read at the measured window's start and end (the
    /// gateway).
    #[arg(long)]
    rss_pid: Option<u32>,
    /// Where to write the results as JSON (also printed).
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// What every stream reports to.
struct Shared {
    /// Streams that have received their first chunk.
    streaming: AtomicU64,
    /// Streams that failed (connect error, non-200, closed before the end).
    failed: AtomicU64,
    /// Chunks received in the measured window.
    chunks: AtomicU64,
    /// Set once the measured window is open; gaps are recorded while it is.
    window: Mutex<Option<(Instant, Instant)>>,
    gaps_us: Mutex<Histogram<u64>>,
}

fn main() {
    let args = Args::parse();
    let runtime = cli::runtime(Threads::Pool(None));
    exit_on_error(runtime.block_on(run(args)).map_err(Failure::run));
}

async fn run(args: Args) -> Result<(), String> {
    let histogram = Histogram::new_with_bounds(1, 600_000_000, 3).map_err(|e| e.to_string())?;
    let shared = Arc::new(Shared {
        streaming: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        chunks: AtomicU64::new(0),
        window: Mutex::new(None),
        gaps_us: Mutex::new(histogram),
    });
    let rss_before_kb = args.rss_pid.and_then(procstat::rss_kb);
    let opening = Instant::now();
    let mut tasks = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        let target = args.target[i % args.target.len()];
        let request = request(&args.model, i, args.max_tokens);
        let shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            if stream(target, &request, &shared).await.is_err() {
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
        // Paced so the listen backlog is not what is measured.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all = args.streams as u64;
    let ramp_deadline = Instant::now() + Duration::from_secs(120);
    while shared.streaming.load(Ordering::Relaxed) + shared.failed.load(Ordering::Relaxed) < all {
        if Instant::now() > ramp_deadline {
            return Err(format!(
                "only {} of {all} streams began within 120 s ({} failed)",
                shared.streaming.load(Ordering::Relaxed),
                shared.failed.load(Ordering::Relaxed)
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ramp_s = opening.elapsed().as_secs_f64();
    eprintln!(
        "streams: {} streaming, {} failed, after {ramp_s:.1} s",
        shared.streaming.load(Ordering::Relaxed),
        shared.failed.load(Ordering::Relaxed)
    );
    // One more decode step or two, so every stream has a previous chunk to measure from.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start = Instant::now();
    let end = start + Duration::from_secs(args.measure_s);
    *lock(&shared.window) = Some((start, end));
    let rss_start_kb = args.rss_pid.and_then(procstat::rss_kb);
    let cpu_start_s = args.rss_pid.and_then(procstat::cpu_s);
    // RSS every 250 ms through the window: one reading can fall in a decode step's burst.
    let mut rss_samples_kb = Vec::new();
    while Instant::now() < end {
        tokio::time::sleep(
            Duration::from_millis(250).min(end.saturating_duration_since(Instant::now())),
        )
        .await;
        rss_samples_kb.extend(args.rss_pid.and_then(procstat::rss_kb));
    }
    rss_samples_kb.sort_unstable();
    let rss_median_kb = rss_samples_kb.get(rss_samples_kb.len() / 2).copied();
    let rss_end_kb = args.rss_pid.and_then(procstat::rss_kb);
    let cpu_end_s = args.rss_pid.and_then(procstat::cpu_s);
    let gaps = lock(&shared.gaps_us).clone();
    let failed = shared.failed.load(Ordering::Relaxed);
    for task in &tasks {
        task.abort();
    }
    let ms = |q: f64| gaps.value_at_quantile(q) as f64 / 1000.0;
    let per_stream_kb = |rss: Option<u64>| match (rss, rss_before_kb) {
        (Some(rss), Some(before)) => {
            serde_json::json!((rss.saturating_sub(before)) as f64 / args.streams as f64)
        }
        _ => serde_json::Value::Null,
    };
    let chunks = shared.chunks.load(Ordering::Relaxed);
    // The watched process's CPU per chunk the streams received in the window (every chunk it
    // relayed, when it is the gateway).
    let cpu_per_chunk_us = match (cpu_start_s, cpu_end_s) {
        (Some(start), Some(end)) if chunks > 0 => {
            serde_json::json!((end - start) * 1e6 / chunks as f64)
        }
        _ => serde_json::Value::Null,
    };
    let result = serde_json::json!({
        "targets": args.target.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "streams": args.streams,
        "failed": failed,
        "ramp_s": ramp_s,
        "measure_s": args.measure_s,
        "chunks_measured": chunks,
        "gap_p50_ms": ms(0.5),
        "gap_p90_ms": ms(0.9),
        "gap_p99_ms": ms(0.99),
        "gap_max_ms": gaps.max() as f64 / 1000.0,
        "rss_before_kb": rss_before_kb,
        "rss_window_start_kb": rss_start_kb,
        "rss_window_end_kb": rss_end_kb,
        "rss_per_stream_kb": per_stream_kb(rss_end_kb),
        "rss_window_median_kb": rss_median_kb,
        "rss_window_min_kb": rss_samples_kb.first(),
        "rss_window_max_kb": rss_samples_kb.last(),
        "rss_per_stream_median_kb": per_stream_kb(rss_median_kb),
        "cpu_per_chunk_us": cpu_per_chunk_us,
    });
    let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(out) = &args.out {
        std::fs::write(out, text + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A streamed completion with a prompt of its own (no two streams share a cached prefix).
fn request(model: &str, i: usize, max_tokens: u32) -> Vec<u8> {
    let body = serde_json::json!({
        "model": model,
        "prompt": format!("stream {i} asks for a long answer"),
        "max_tokens": max_tokens,
        "stream": true,
    })
    .to_string();
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: streams\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// One stream: sends the request and times each read that brings SSE events. Chunk reads are
/// a step apart, so one read is one decode step's chunk(s). Raw bytes on purpose, not hyper:
/// the figure is the gap between socket reads, and a client that decodes the chunked framing
/// would split one read into several body frames (gaps of zero) and hold more memory per stream
/// at 9,000 streams.
async fn stream(target: SocketAddr, request: &[u8], shared: &Shared) -> Result<(), ()> {
    let mut socket = TcpStream::connect(target).await.map_err(drop)?;
    socket.set_nodelay(true).map_err(drop)?;
    socket.write_all(request).await.map_err(drop)?;
    let mut buf = vec![0u8; 4096];
    let mut head_seen = false;
    let mut last_chunk: Option<Instant> = None;
    loop {
        let n = socket.read(&mut buf).await.map_err(drop)?;
        if n == 0 {
            return Err(());
        }
        let now = Instant::now();
        let data = &buf[..n];
        if !head_seen {
            if !data.starts_with(b"HTTP/1.1 200") {
                return Err(());
            }
            head_seen = true;
        }
        if memchr::memmem::find(data, b"[DONE]").is_some() {
            return Ok(());
        }
        if memchr::memmem::find(data, b"data: ").is_none() {
            continue;
        }
        if last_chunk.is_none() {
            shared.streaming.fetch_add(1, Ordering::Relaxed);
        }
        let window = *lock(&shared.window);
        if let (Some(previous), Some((start, end))) = (last_chunk, window) {
            if previous >= start && now <= end {
                let gap_us = now.duration_since(previous).as_micros() as u64;
                let _ = lock(&shared.gaps_us).record(gap_us.max(1));
                shared.chunks.fetch_add(1, Ordering::Relaxed);
            }
        }
        last_chunk = Some(now);
    }
}
