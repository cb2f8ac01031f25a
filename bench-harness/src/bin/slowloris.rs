//! `slowloris`: a hostile-client benchmark. A normal client measures request latency against a
//! gateway alone (quiet), then again while this process holds `--idle` connections that never
//! send a byte and `--slow` connections that trickle a request head one header line at a time
//! (reconnecting whenever the gateway closes one, as an attacker would), and `--slow-body`
//! connections that announce a `--slow-body-bytes` body and send one byte of it every
//! `--slow-body-interval-ms`. Prints p50 / p99 of both phases, their ratio and the share of the
//! measuring client's requests answered; with `--pid`, the gateway's RSS in each phase and after
//! the hostile connections close; `--out` writes them as JSON. `scripts/bench-hostile.sh` runs
//! it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use bench_harness::cli::{self, exit_on_error, Failure, Threads};

#[derive(Parser, Debug)]
#[command(name = "slowloris")]
struct Args {
    /// The gateway, host:port.
    #[arg(long)]
    target: SocketAddr,
    /// Connections opened and left silent.
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Connections that send a request head one header line every `--slow-interval-ms`.
    #[arg(long, default_value_t = 1_000)]
    slow: usize,
    #[arg(long, default_value_t = 1_000)]
    slow_interval_ms: u64,
    /// Connections that announce a `--slow-body-bytes` request body and send one byte of it
    /// every `--slow-body-interval-ms`.
    #[arg(long, default_value_t = 0)]
    slow_body: usize,
    #[arg(long, default_value_t = 1 << 20)]
    slow_body_bytes: u64,
    #[arg(long, default_value_t = 10_000)]
    slow_body_interval_ms: u64,
    /// The gateway's process id: its RSS is read after each phase and `--settle-s` after the
    /// hostile connections close.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value_t = 5)]
    settle_s: u64,
    /// Seconds each measured phase lasts.
    #[arg(long, default_value_t = 30)]
    measure_s: u64,
    /// Concurrent requests of the measuring client.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// The model the measuring client asks for.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Where to write the results as JSON.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Hostile {
    idle_open: AtomicU64,
    slow_open: AtomicU64,
    slow_body_open: AtomicU64,
    closed_by_server: AtomicU64,
    connect_errors: AtomicU64,
}

struct Phase {
    histogram: Histogram<u64>,
    errors: u64,
}

impl Phase {
    fn json(&self) -> serde_json::Value {
        let ms = |q: f64| self.histogram.value_at_quantile(q) as f64 / 1000.0;
        serde_json::json!({
            "requests": self.histogram.len(),
            "errors": self.errors,
            "answered_share": self.histogram.len() as f64
                / (self.histogram.len() + self.errors).max(1) as f64,
            "p50_ms": ms(0.5),
            "p99_ms": ms(0.99),
            "max_ms": self.histogram.max() as f64 / 1000.0,
        })
    }
}

fn main() {
    let args = Args::parse();
    let runtime = cli::runtime(Threads::Pool(None));
    exit_on_error(runtime.block_on(run(args)).map_err(Failure::run));
}

async fn run(args: Args) -> Result<(), String> {
    let quiet = measure(&args).await?;
    eprintln!("quiet: {}", quiet.json());
    let rss_quiet = rss_kib(args.pid);
    let hostile = Arc::new(Hostile::default());
    let interval = Duration::from_millis(args.slow_interval_ms);
    let mut tasks = Vec::new();
    let total = args.idle + args.slow + args.slow_body;
    for i in 0..total {
        let hostile = hostile.clone();
        let target = args.target;
        let kind = if i < args.idle {
            Kind::Idle
        } else if i < args.idle + args.slow {
            Kind::SlowHead(interval)
        } else {
            Kind::SlowBody {
                bytes: args.slow_body_bytes,
                interval: Duration::from_millis(args.slow_body_interval_ms),
            }
        };
        tasks.push(tokio::spawn(
            async move { hold(target, kind, &hostile).await },
        ));
        // Paced so the listener's backlog is not what is measured.
        if i % 200 == 199 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while hostile.idle_open.load(Ordering::Relaxed)
        + hostile.slow_open.load(Ordering::Relaxed)
        + hostile.slow_body_open.load(Ordering::Relaxed)
        < total as u64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let opened = (
        hostile.idle_open.load(Ordering::Relaxed),
        hostile.slow_open.load(Ordering::Relaxed),
        hostile.slow_body_open.load(Ordering::Relaxed),
    );
    eprintln!(
        "hostile connections open: {} idle, {} slow, {} slow bodies",
        opened.0, opened.1, opened.2
    );
    let under_attack = measure(&args).await?;
    let rss_hostile = rss_kib(args.pid);
    let still_open = (
        hostile.idle_open.load(Ordering::Relaxed),
        hostile.slow_open.load(Ordering::Relaxed),
        hostile.slow_body_open.load(Ordering::Relaxed),
    );
    for task in &tasks {
        task.abort();
    }
    // The aborted tasks drop their sockets; the gateway sees them close.
    tokio::time::sleep(Duration::from_secs(args.settle_s)).await;
    let rss_after = rss_kib(args.pid);
    let ratio = |q: f64| {
        under_attack.histogram.value_at_quantile(q) as f64
            / quiet.histogram.value_at_quantile(q).max(1) as f64
    };
    let result = serde_json::json!({
        "target": args.target.to_string(),
        "idle": args.idle,
        "slow": args.slow,
        "slow_interval_ms": args.slow_interval_ms,
        "slow_body": args.slow_body,
        "slow_body_bytes": args.slow_body_bytes,
        "slow_body_interval_ms": args.slow_body_interval_ms,
        "rss_kib": {"quiet": rss_quiet, "hostile": rss_hostile, "after": rss_after},
        "concurrency": args.concurrency,
        "measure_s": args.measure_s,
        "quiet": quiet.json(),
        "hostile": under_attack.json(),
        "p50_ratio": ratio(0.5),
        "p99_ratio": ratio(0.99),
        "hostile_open_before": {"idle": opened.0, "slow": opened.1, "slow_body": opened.2},
        "hostile_open_after": {"idle": still_open.0, "slow": still_open.1, "slow_body": still_open.2},
        "closed_by_server": hostile.closed_by_server.load(Ordering::Relaxed),
        "connect_errors": hostile.connect_errors.load(Ordering::Relaxed),
    });
    let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(out) = &args.out {
        std::fs::write(out, text + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(())
}

/// What a hostile connection does.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Sends nothing.
    Idle,
    /// Sends a request head one header line per interval.
    SlowHead(Duration),
    /// Announces a body of `bytes` and sends one byte of it per `interval`.
    SlowBody { bytes: u64, interval: Duration },
}

/// The gateway's resident set in KiB (`None` without a pid, or once it is gone).
fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Holds one hostile connection open for as long as the task lives, reconnecting when the
/// gateway closes it.
async fn hold(target: SocketAddr, kind: Kind, hostile: &Hostile) {
    let open = match kind {
        Kind::Idle => &hostile.idle_open,
        Kind::SlowHead(_) => &hostile.slow_open,
        Kind::SlowBody { .. } => &hostile.slow_body_open,
    };
    loop {
        let Ok(mut stream) = TcpStream::connect(target).await else {
            hostile.connect_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        open.fetch_add(1, Ordering::Relaxed);
        if let Kind::SlowBody { bytes, interval } = kind {
            let head = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: {bytes}\r\n\r\n"
            );
            let mut ok = stream.write_all(head.as_bytes()).await.is_ok();
            while ok {
                ok = stream.write_all(b" ").await.is_ok();
                tokio::time::sleep(interval).await;
                let mut probe = [0u8; 1];
                if let Ok(Ok(_)) =
                    tokio::time::timeout(Duration::from_millis(1), stream.read(&mut probe)).await
                {
                    ok = false;
                }
            }
        } else if let Kind::SlowHead(interval) = kind {
            // Raw bytes on purpose: the attack is a request head that never ends, one header
            // line at a time, which no HTTP client library writes.
            let mut line = 0u64;
            let mut ok = stream
                .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\n")
                .await
                .is_ok();
            while ok {
                tokio::time::sleep(interval).await;
                line += 1;
                ok = stream
                    .write_all(format!("X-Slow-{line}: x\r\n").as_bytes())
                    .await
                    .is_ok();
                // A closed connection shows as EOF (or an answer) once the write went through.
                let mut probe = [0u8; 1];
                if let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(1), stream.read(&mut probe)).await
                {
                    let _ = n;
                    ok = false;
                }
            }
        } else {
            let mut sink = [0u8; 512];
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        }
        open.fetch_sub(1, Ordering::Relaxed);
        hostile.closed_by_server.fetch_add(1, Ordering::Relaxed);
    }
}

/// `--concurrency` clients on keep-alive connections, each sending small completions back to
/// back for `--measure-s`; the latency of each (send to last byte).
async fn measure(args: &Args) -> Result<Phase, String> {
    let end = Instant::now() + Duration::from_secs(args.measure_s);
    let body = Bytes::from(
        serde_json::json!({"model": args.model, "prompt": "a short prompt for the latency probe",
            "max_tokens": 4, "stream": false})
        .to_string(),
    );
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let body = body.clone();
        let target = args.target;
        workers.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
            let mut errors = 0;
            let mut sender = None;
            while Instant::now() < end {
                if sender.is_none() {
                    sender = connect(target).await;
                }
                let Some(send) = sender.as_mut() else {
                    errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let started = Instant::now();
                match request(send, target, body.clone()).await {
                    Ok(()) => {
                        let _ = histogram.record(started.elapsed().as_micros() as u64);
                    }
                    Err(()) => {
                        errors += 1;
                        sender = None;
                    }
                }
            }
            Ok::<_, String>((histogram, errors))
        }));
    }
    let mut total = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let mut errors = 0;
    for worker in workers {
        let (histogram, e) = worker.await.map_err(|e| e.to_string())??;
        total.add(histogram).map_err(|e| e.to_string())?;
        errors += e;
    }
    Ok(Phase {
        histogram: total,
        errors,
    })
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: SocketAddr) -> Option<Sender> {
    let stream = TcpStream::connect(target).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Some(sender)
}

async fn request(sender: &mut Sender, target: SocketAddr, body: Bytes) -> Result<(), ()> {
    sender.ready().await.map_err(|_| ())?;
    let request = hyper::Request::post("/v1/completions")
        .header(hyper::header::HOST, target.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|_| ())?;
    let response = sender.send_request(request).await.map_err(|_| ())?;
    let ok = response.status().is_success();
    response.into_body().collect().await.map_err(|_| ())?;
    if ok {
        Ok(())
    } else {
        Err(())
    }
}
