//! A whole replay against an in-process mock gateway (no other binaries needed): it streams SSE
//! like SGLang / OpenAI servers, names a worker per request, reports cached tokens from a real
//! prefix memory, and fails every fifth request. The report must match what the mock saw, the
//! client must reuse connections, and a dead gateway must give counted errors, not a hang.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bench_harness::replay::form::{CapturedModel, FormOptions, RequestForm, TenantOptions};
use bench_harness::replay::pacing::Pacing;
use bench_harness::replay::plot::write_plot;
use bench_harness::replay::progress::ProgressMode;
use bench_harness::replay::run::{run_replay, ReplayOptions, Source};
use bench_harness::replay::synthetic::{Popularity, SyntheticSpec};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};

const PAGE: usize = 16;

#[derive(Default)]
struct MockState {
    is_engine: bool,
    pages_seen: Mutex<HashSet<u64>>,
    requests: AtomicU64,
    connections: AtomicU64,
    prompt_tokens_ok: AtomicU64,
    cached_tokens_ok: AtomicU64,
}

/// The prompt's tokens as the sim-engine contract defines them (words, or input_ids).
fn prompt_tokens(body: &serde_json::Value) -> Vec<u64> {
    let hash = |w: &str| xxhash_rust::xxh3::xxh3_64(w.as_bytes());
    if let Some(ids) = body["input_ids"].as_array() {
        return ids.iter().filter_map(|v| v.as_u64()).collect();
    }
    let text = body["messages"][0]["content"]
        .as_str()
        .or(body["prompt"].as_str())
        .or(body["text"].as_str());
    text.unwrap_or("")
        .split_ascii_whitespace()
        .map(hash)
        .collect()
}

/// Cached tokens = leading whole pages whose chained hash was seen before; then remembers them.
fn cached_tokens(state: &MockState, tokens: &[u64]) -> usize {
    let mut seen = state.pages_seen.lock().unwrap();
    let (mut chain, mut cached, mut hit) = (0u64, 0, true);
    for page in tokens.chunks_exact(PAGE) {
        chain = xxhash_rust::xxh3::xxh3_64_with_seed(
            &page
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<_>>(),
            chain,
        );
        if hit && seen.contains(&chain) {
            cached += PAGE;
        } else {
            hit = false;
            seen.insert(chain);
        }
    }
    cached
}

async fn handle(
    state: Arc<MockState>,
    request: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<ChannelBody>, Infallible> {
    let path = request.uri().path().to_string();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let n = state.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let (tx, rx) = mpsc::channel(8);
    let response = hyper::Response::builder();
    // An engine (no gateway in front) names no worker.
    let response = if state.is_engine {
        response
    } else {
        response.header("x-smg-routed-worker-id", format!("http://w{}", n % 3))
    };
    if n.is_multiple_of(5) {
        drop(tx);
        return Ok(response.status(503).body(ChannelBody(rx)).unwrap());
    }
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let tokens = prompt_tokens(&json);
    let cached = cached_tokens(&state, &tokens);
    state
        .prompt_tokens_ok
        .fetch_add(tokens.len() as u64, Ordering::SeqCst);
    state
        .cached_tokens_ok
        .fetch_add(cached as u64, Ordering::SeqCst);
    let generate = path == "/generate";
    tokio::spawn(async move {
        let role =
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
                .to_string();
        let mut events = if generate { vec![] } else { vec![role] };
        for i in 0..3 {
            events.push(if generate {
                format!("data: {{\"text\":\"w{i}\",\"meta_info\":{{\"prompt_tokens\":{},\"cached_tokens\":{cached},\"completion_tokens\":{}}}}}\n\n", tokens.len(), i + 1)
            } else {
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n")
            });
        }
        if !generate {
            events.push(format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":3,\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}}}\n\n", tokens.len()));
        }
        events.push("data: [DONE]\n\n".into());
        for event in events {
            tokio::time::sleep(Duration::from_millis(3)).await;
            if tx.send(Ok(Frame::data(Bytes::from(event)))).await.is_err() {
                return;
            }
        }
    });
    let response = response.header("content-type", "text/event-stream");
    Ok(response.body(ChannelBody(rx)).unwrap())
}

/// A response body fed by a channel (the mock's SSE events, paced by a task).
struct ChannelBody(mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx)
    }
}

async fn start_mock() -> (SocketAddr, Arc<MockState>) {
    start_mock_as(false).await
}

async fn start_mock_as(is_engine: bool) -> (SocketAddr, Arc<MockState>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(MockState {
        is_engine,
        ..MockState::default()
    });
    let server_state = state.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            server_state.connections.fetch_add(1, Ordering::SeqCst);
            // Without it, Nagle holds each small SSE event until the previous one is acked.
            let _ = stream.set_nodelay(true);
            let state = server_state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |r| handle(state.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, state)
}

fn options(gateway: String, form: RequestForm, requests: u64) -> ReplayOptions {
    let spec = SyntheticSpec {
        groups: 2,
        prompts_per_group: 3,
        system_prompt_tokens: 64,
        question_tokens: 16,
        output_tokens: 3,
        popularity: Popularity::Uniform,
        turns: 1,
        seed: 11,
        requests: Some(requests),
    };
    let tenant = TenantOptions {
        tenants: 0,
        cache_salt: false,
        lora: false,
    };
    ReplayOptions {
        gateway,
        source: Source::Synthetic(spec),
        pacing: Pacing::Closed { concurrency: 2 },
        max_requests: Some(requests),
        form: FormOptions {
            form,
            model: "m".into(),
            captured_model: CapturedModel::Keep,
            tenant,
            output_cap: None,
        },
        request_timeout: Duration::from_secs(10),
        label: "mock".into(),
        known_workers: vec![
            "http://w0".into(),
            "http://w1".into(),
            "http://w2".into(),
            "http://w3".into(),
        ],
        progress: ProgressMode::Off,
        // The test process itself stands in for a gateway whose memory is sampled.
        watch_pid: Some(std::process::id()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reports_what_the_gateway_saw() {
    let (addr, state) = start_mock().await;
    let (_stop, stop) = watch::channel(false);
    let replay = options(format!("http://{addr}"), RequestForm::Chat, 20);
    let report = tokio::time::timeout(Duration::from_secs(20), run_replay(&replay, stop))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (report.requests, report.successes, report.errors),
        (20, 16, 4)
    );
    assert_eq!(report.errors_by_kind.get("status_503"), Some(&4));
    assert_eq!(
        report.prompt_tokens,
        state.prompt_tokens_ok.load(Ordering::SeqCst)
    );
    assert_eq!(
        report.cached_tokens,
        state.cached_tokens_ok.load(Ordering::SeqCst)
    );
    assert_eq!(report.prompt_tokens, 16 * 80);
    // 6 distinct prompts sharing 2 system prompts: most of the 64-token system prompt hits.
    assert!(
        report.cache_hit_rate > 0.5 && report.cache_hit_rate < 1.0,
        "{}",
        report.cache_hit_rate
    );
    assert_eq!(report.output_tokens, 16 * 3);
    let watched = report.watched_process.as_ref().unwrap();
    let at: Vec<u64> = watched.samples.iter().map(|s| s.requests).collect();
    assert_eq!(at, vec![2, 10, 20], "RSS sampled at 10%, 50%, 100%");
    assert!(watched.samples.iter().all(|s| s.rss_kb.is_some()));
    assert!(report.load_generator.cpu_s.is_some() && report.load_generator.max_rss_kb.is_some());
    // Worker attribution: 16 successes over w0..w2, and w3 (known, never used) counts as idle.
    let per_worker: u64 = report.per_worker.values().map(|w| w.requests).sum();
    assert_eq!(per_worker, 16);
    assert_eq!(report.per_worker["http://w3"].requests, 0);
    assert!(
        report.imbalance.unwrap() >= 4.0 / 3.0,
        "{:?}",
        report.imbalance
    );
    // Three text events 3 ms apart after a role-only event that must not count as the first token.
    assert!(report.ttft_ms.p50 >= 6.0, "{:?}", report.ttft_ms);
    assert_eq!(report.itl_ms.count, 16 * 2);
    assert!(report.itl_ms.p50 >= 2.0, "{:?}", report.itl_ms);
    assert!(report.e2e_ms.p50 >= report.ttft_ms.p50);
    assert!(
        state.connections.load(Ordering::SeqCst) <= 4,
        "keep-alive: {} connections for 20 requests",
        state.connections.load(Ordering::SeqCst)
    );
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("plot.svg");
    write_plot(&svg, &[report.clone(), report]).unwrap();
    let text = std::fs::read_to_string(svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("TTFT CDF") && text.contains("mock"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_with_input_ids_reads_sglang_meta_info() {
    let (addr, state) = start_mock().await;
    let (_stop, stop) = watch::channel(false);
    let replay = options(format!("http://{addr}"), RequestForm::GenerateIds, 8);
    let report = tokio::time::timeout(Duration::from_secs(20), run_replay(&replay, stop))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.requests, report.errors), (8, 1));
    assert_eq!(
        report.cached_tokens,
        state.cached_tokens_ok.load(Ordering::SeqCst)
    );
    assert!(report.cached_tokens > 0);
    assert_eq!(report.output_tokens, 7 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateway_gives_counted_connect_errors() {
    // Bind then drop: nothing listens on the port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_stop, stop) = watch::channel(false);
    let replay = options(format!("http://127.0.0.1:{port}"), RequestForm::Chat, 5);
    let report = tokio::time::timeout(Duration::from_secs(20), run_replay(&replay, stop))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((report.requests, report.errors), (5, 5));
    assert_eq!(report.errors_by_kind.get("connect"), Some(&5));
    assert_eq!(report.imbalance, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_replay_early_with_what_completed() {
    let (addr, _state) = start_mock().await;
    let (stop_tx, stop) = watch::channel(false);
    let mut replay = options(format!("http://{addr}"), RequestForm::Chat, 100_000);
    replay.pacing = Pacing::Poisson {
        rate_per_s: 50.0,
        seed: 1,
    };
    let run = tokio::spawn(async move { run_replay(&replay, stop).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        report.requests > 0 && report.requests < 100,
        "{}",
        report.requests
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_urls_are_sent_to_in_turn_and_credited_as_workers() {
    let (a, state_a) = start_mock_as(true).await;
    let (b, state_b) = start_mock_as(true).await;
    let (_stop, stop) = watch::channel(false);
    let mut replay = options(format!("http://{a},http://{b}/"), RequestForm::Chat, 10);
    replay.known_workers = vec![format!("http://{a}"), format!("http://{b}")];
    let report = tokio::time::timeout(Duration::from_secs(20), run_replay(&replay, stop))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(report.requests, 10);
    assert_eq!(state_a.requests.load(Ordering::SeqCst), 5);
    assert_eq!(state_b.requests.load(Ordering::SeqCst), 5);
    // Each mock fails its fifth request: 8 successes, 4 per URL, none unattributed.
    assert_eq!(report.per_worker[&format!("http://{a}")].requests, 4);
    assert_eq!(report.per_worker[&format!("http://{b}")].requests, 4);
    assert_eq!(report.unattributed_requests, 0);
}
