//! The HTTP side of a replay: [`Client`] sends one streaming request over a pooled keep-alive
//! HTTP/1.1 connection (hyper's connection-level client, so the load generator stays cheap) and
//! returns its [`Outcome`]: time to first token, gaps between token events, end-to-end time (all
//! from the request's scheduled send time), cached and prompt tokens from the final `usage` or
//! `meta_info`, and the worker named by `x-smg-routed-worker-id`. Failures become an
//! [`ErrorKind`] in the outcome, never a panic.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::form::WireRequest;
use super::limits::{IDLE_CONNECTIONS_MAX, JSON_BODY_BYTES_MAX, SSE_EVENT_BYTES_MAX};
use super::sse::{parse_usage, SseScanner, Usage};

/// The response header naming the worker a gateway picked.
pub const ROUTED_WORKER_HEADER: &str = "x-smg-routed-worker-id";

/// The prompt tokens kvgate's index predicted the worker had cached (absent: no prediction).
pub const PREDICTED_CACHED_TOKENS_HEADER: &str = "x-kvgate-predicted-cached-tokens";

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No connection could be made.
    Connect,
    /// The gateway answered with a non-2xx status.
    Status(u16),
    /// The connection broke, or the response was malformed, after it was sent.
    Stream,
    /// No complete response within `--timeout`.
    Timeout,
}

impl ErrorKind {
    /// The key under which the report counts it: `connect`, `status_503`, `stream`, `timeout`.
    pub fn label(&self) -> String {
        match self {
            Self::Connect => "connect".into(),
            Self::Status(code) => format!("status_{code}"),
            Self::Stream => "stream".into(),
            Self::Timeout => "timeout".into(),
        }
    }
}

/// What happened to one request. Times are measured from its scheduled send time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    /// Gaps between consecutive token events, in microseconds.
    pub itl_us: Vec<u32>,
    pub usage: Usage,
    pub worker: Option<String>,
    /// The gateway's prediction of the cached prompt tokens on that worker, if it made one.
    pub predicted_cached_tokens: Option<u64>,
    pub error: Option<ErrorKind>,
}

/// Where requests go: a gateway's URL, address and the `Host` header to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub url: String,
    pub addr: SocketAddr,
    pub host: String,
}

impl Endpoint {
    /// Resolves `http://host:port[/...]` (only plain HTTP; the path is ignored).
    pub async fn resolve(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("--gateway {url:?}: only http:// URLs are supported"))?;
        let host = rest.split('/').next().unwrap_or(rest).to_string();
        let with_port = if host.contains(':') {
            host.clone()
        } else {
            format!("{host}:80")
        };
        let mut addrs = tokio::net::lookup_host(&with_port)
            .await
            .map_err(|e| format!("--gateway {url:?}: cannot resolve {with_port}: {e}"))?;
        let addr = addrs
            .next()
            .ok_or_else(|| format!("--gateway {url:?}: no address"))?;
        let url = url.trim_end_matches('/').to_string();
        Ok(Self { url, addr, host })
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// Sends requests to one endpoint, or round-robin over several (`--gateway a,b,...`: engines
/// addressed directly, the no-gateway baseline). With several, a response without a worker header
/// is credited to the endpoint it was sent to.
pub struct Client {
    pools: Vec<Pool>,
    next: AtomicUsize,
    timeout: Duration,
}

impl Client {
    pub fn new(endpoints: Vec<Endpoint>, timeout: Duration) -> Self {
        let pools = endpoints.into_iter().map(Pool::new).collect();
        Self {
            pools,
            next: AtomicUsize::new(0),
            timeout,
        }
    }

    /// Sends `request`, scheduled at `scheduled`, and waits for its whole response (or the timeout).
    pub async fn send(&self, request: &WireRequest, scheduled: Instant) -> Outcome {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.pools.len().max(1);
        let Some(pool) = self.pools.get(index) else {
            return Outcome {
                error: Some(ErrorKind::Connect),
                ..Outcome::default()
            };
        };
        let result = tokio::time::timeout(self.timeout, pool.send(request, scheduled)).await;
        let mut outcome = result.unwrap_or_else(|_| Outcome {
            error: Some(ErrorKind::Timeout),
            ..Outcome::default()
        });
        outcome.e2e = scheduled.elapsed();
        if outcome.worker.is_none() && self.pools.len() > 1 {
            outcome.worker = Some(pool.endpoint.url.clone());
        }
        outcome
    }
}

/// A keep-alive connection pool to one endpoint, and the request loop over it.
struct Pool {
    endpoint: Endpoint,
    idle: Mutex<Vec<Sender>>,
}

impl Pool {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            idle: Mutex::new(Vec::new()),
        }
    }

    async fn send(&self, request: &WireRequest, scheduled: Instant) -> Outcome {
        // A pooled connection may have been closed by the server while idle: such a failure
        // happens before any response byte, so it is retried once on a fresh connection.
        let (mut sender, reused) = match self.checkout().await {
            Ok(pair) => pair,
            Err(kind) => {
                return Outcome {
                    error: Some(kind),
                    ..Outcome::default()
                }
            }
        };
        let mut response = sender.send_request(self.http_request(request)).await;
        if response.is_err() && reused {
            sender = match self.connect().await {
                Ok(fresh) => fresh,
                Err(kind) => {
                    return Outcome {
                        error: Some(kind),
                        ..Outcome::default()
                    }
                }
            };
            response = sender.send_request(self.http_request(request)).await;
        }
        let Ok(response) = response else {
            return Outcome {
                error: Some(ErrorKind::Stream),
                ..Outcome::default()
            };
        };
        let outcome = read_response(response, scheduled).await;
        if outcome.error.is_none() || matches!(outcome.error, Some(ErrorKind::Status(_))) {
            self.checkin(sender);
        }
        outcome
    }

    fn http_request(&self, request: &WireRequest) -> hyper::Request<Full<Bytes>> {
        let mut builder = hyper::Request::post(request.path)
            .header(hyper::header::HOST, &self.endpoint.host)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "text/event-stream");
        if let Some(tokens) = &request.routing_tokens {
            builder = builder.header("x-smg-routing-tokens", tokens);
        }
        // Every part above is a valid static path, header name or ASCII value.
        builder
            .body(Full::new(request.body.clone()))
            .unwrap_or_default()
    }

    async fn checkout(&self) -> Result<(Sender, bool), ErrorKind> {
        loop {
            let pooled = self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
            let Some(mut sender) = pooled else { break };
            if !sender.is_closed() && sender.ready().await.is_ok() {
                return Ok((sender, true));
            }
        }
        Ok((self.connect().await?, false))
    }

    fn checkin(&self, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < IDLE_CONNECTIONS_MAX {
                idle.push(sender);
            }
        }
    }

    async fn connect(&self) -> Result<Sender, ErrorKind> {
        let stream = TcpStream::connect(self.endpoint.addr)
            .await
            .map_err(|_| ErrorKind::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|_| ErrorKind::Connect)?;
        tokio::spawn(async move {
            // The connection's own errors surface on the request that was using it.
            let _ = connection.await;
        });
        Ok(sender)
    }
}

/// Reads a response to its end: SSE events as they arrive, or a JSON body.
async fn read_response(
    response: hyper::Response<hyper::body::Incoming>,
    scheduled: Instant,
) -> Outcome {
    let status = response.status();
    let worker = response
        .headers()
        .get(ROUTED_WORKER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let predicted_cached_tokens = response
        .headers()
        .get(PREDICTED_CACHED_TOKENS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let is_sse = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = response.into_body();
    let mut outcome = Outcome {
        worker,
        predicted_cached_tokens,
        ..Outcome::default()
    };
    if !status.is_success() {
        // Drained so the connection can be reused; the content does not matter.
        while let Some(Ok(_)) = body.frame().await {}
        outcome.error = Some(ErrorKind::Status(status.as_u16()));
        return outcome;
    }
    let read = if is_sse {
        read_sse(&mut body, scheduled, &mut outcome).await
    } else {
        read_json(&mut body, scheduled, &mut outcome).await
    };
    if read.is_err() {
        outcome.error = Some(ErrorKind::Stream);
    }
    outcome
}

async fn read_sse(
    body: &mut hyper::body::Incoming,
    scheduled: Instant,
    outcome: &mut Outcome,
) -> Result<(), ()> {
    let mut scanner = SseScanner::new(SSE_EVENT_BYTES_MAX);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| ())?;
        if let Ok(data) = frame.into_data() {
            scanner.feed(&data, Instant::now()).map_err(|_| ())?;
        }
    }
    scanner.finish(Instant::now());
    if scanner.saw_error_event() {
        return Err(());
    }
    outcome.ttft = scanner
        .first_token_at()
        .map(|at| at.saturating_duration_since(scheduled));
    outcome.itl_us = scanner.take_gaps_us();
    outcome.usage = scanner.usage();
    Ok(())
}

async fn read_json(
    body: &mut hyper::body::Incoming,
    scheduled: Instant,
    outcome: &mut Outcome,
) -> Result<(), ()> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(|_| ())?.into_data() {
            if bytes.len() + data.len() > JSON_BODY_BYTES_MAX {
                return Err(());
            }
            bytes.extend_from_slice(&data);
        }
    }
    outcome.ttft = Some(scheduled.elapsed());
    outcome.usage = parse_usage(&bytes).unwrap_or_default();
    Ok(())
}
