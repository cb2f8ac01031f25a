//! The HTTP side of the fleet: binds one listener per engine ([`bind_fleet`]), serves each with
//! hyper ([`serve_engine`]) and routes requests to [`EngineServer`]'s handlers.
//!
//! Endpoints: `POST /generate`, `/v1/chat/completions`, `/v1/completions`, `/v1/messages`
//! (see `sim::api`); `GET /v1/models`, `/get_model_info`, `/server_info`, `/health`,
//! `/health_generate`, `/v1/loads`, `/metrics`; `POST /flush_cache`; admin `GET|POST /sim/faults`,
//! `GET /sim/stats` (accepted TCP connections, requests, engine and KV-event counters),
//! `GET /sim/cache` (the cached pages' keys) and `POST /sim/restart` (a crash and restart). With
//! `--kv-events-base-port`, [`bind_fleet`] also binds each engine's KV-event sockets
//! (`sim::publisher`). Every error is a JSON
//! body `{"error":{"message","type","code"}}`: malformed JSON 400, body over
//! [`MAX_BODY_BYTES`] 413, prompt larger than KV memory 400, unknown path 404, wrong method 405,
//! injected faults their configured status.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use xxhash_rust::xxh3::xxh3_64;

use super::api::{
    error_body, full_body, parse_request, stream_chunk, Endpoint, ParsedRequest, ResponseContext,
};
use super::body::{DropAfterFlush, SimBody, TokenStream};
use super::disagg::{
    fetch_transfer, transfer_query, transfer_time, Handoff, SimRole, Transfer, Transfers,
};
use super::driver::{EngineHandle, SimClock};
use super::engine::{Engine, LoadSnapshot, SimRequest, SubmitError};
use super::faults::Faults;
use super::instant::{InstantAnswer, InstantCache};
use super::metrics::{loads_json, prometheus_text, MetricsInput};
use super::options::Options;
use super::publisher::{bind_engine, EventSink, KvEndpoints, SinkConfig};

/// Largest request body: a 128k-token prompt is under 1 MB of words; 64 MiB leaves room for
/// token-id batches while bounding memory per request.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// One engine's HTTP state.
#[derive(Debug)]
pub struct EngineServer {
    pub index: u16,
    pub port: u16,
    pub(super) options: Arc<Options>,
    /// `None` in `--instant` mode.
    pub(super) engine: Option<EngineHandle>,
    /// The engine's KV-event sockets and sink, with `--kv-events-base-port`.
    pub(super) kv_events: Option<(KvEndpoints, Arc<EventSink>)>,
    pub(super) faults: watch::Sender<Faults>,
    fault_rng: Mutex<fastrand::Rng>,
    connections_accepted: AtomicU64,
    connections_open: AtomicU64,
    requests_total: AtomicU64,
    instant: InstantCache,
    /// As a prefill engine: the rooms whose KV cache it has transferred.
    transfers: Arc<Transfers>,
}

type HttpResponse = Response<SimBody>;

/// Binds every engine's port and starts its engine model; must run inside a tokio runtime.
pub async fn bind_fleet(options: Options) -> Result<Vec<(TcpListener, Arc<EngineServer>)>, String> {
    let options = Arc::new(options);
    let clock = SimClock::new(options.speedup);
    let mut fleet = Vec::with_capacity(usize::from(options.engines));
    for index in 0..options.engines {
        let port = options.base_port + index;
        let address = SocketAddr::new(options.host, port);
        let listener = TcpListener::bind(address)
            .await
            .map_err(|error| format!("cannot bind {address}: {error}"))?;
        let kv_events = match options.kv_events {
            // `--instant` conflicts with the KV-event flags: an engine that publishes has a cache.
            Some(kv) if !options.instant => {
                let endpoints = kv.endpoints(options.host, options.engines, index);
                let config = SinkConfig {
                    format: kv.format,
                    block_size: options.engine.page_size,
                    kept_batches_max: kv.replay_buffer_batches,
                    grpc: options.grpc.is_some(),
                };
                let sink = bind_engine(endpoints, config)
                    .await
                    .map_err(|error| format!("--kv-events-base-port: {error}"))?;
                Some((endpoints, sink))
            }
            _ => None,
        };
        let engine = (!options.instant).then(|| {
            let sink = kv_events.as_ref().map(|(_, sink)| Arc::clone(sink));
            EngineHandle::spawn(Engine::new(options.engine.clone()), clock, sink)
        });
        let faults = options
            .faults
            .get(usize::from(index))
            .copied()
            .unwrap_or_default();
        let server = EngineServer {
            index,
            port,
            options: Arc::clone(&options),
            engine,
            kv_events,
            faults: watch::Sender::new(faults),
            fault_rng: Mutex::new(fastrand::Rng::with_seed(
                options.seed.wrapping_add(u64::from(index)),
            )),
            connections_accepted: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
            instant: InstantCache::default(),
            transfers: Arc::new(Transfers::default()),
        };
        fleet.push((listener, Arc::new(server)));
    }
    Ok(fleet)
}

/// Binds the fleet, prints one `listening` line per engine and `sim-engine: ready` on stdout,
/// then serves until the process ends.
pub async fn run_fleet(options: Options) -> Result<(), String> {
    let grpc = options.grpc;
    let fleet = bind_fleet(options).await?;
    let mut tasks = Vec::with_capacity(fleet.len());
    for (listener, server) in fleet {
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        let scheme = if grpc.is_some() { "grpc" } else { "http" };
        println!(
            "sim-engine: engine {} listening on {scheme}://{address}",
            server.index
        );
        if let Some((endpoints, _)) = &server.kv_events {
            println!(
                "sim-engine: engine {} publishing KV events on tcp://{}, replay on tcp://{}",
                server.index, endpoints.publish, endpoints.replay
            );
        }
        match grpc {
            Some((protocol, max_streams)) => tasks.push(tokio::spawn(super::grpc::serve_engine(
                listener,
                server,
                protocol,
                max_streams,
            ))),
            None => tasks.push(tokio::spawn(serve_engine(listener, server))),
        }
    }
    println!("sim-engine: ready");
    for task in tasks {
        task.await.map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// Accepts connections forever, counting them, and serves each with HTTP/1.1 keep-alive.
pub async fn serve_engine(listener: TcpListener, server: Arc<EngineServer>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                eprintln!("sim-engine: engine {} accept failed: {error}", server.index);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        server.connections_accepted.fetch_add(1, Ordering::Relaxed);
        server.connections_open.fetch_add(1, Ordering::Relaxed);
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|request| {
                let server = Arc::clone(&server);
                async move { Ok::<_, Infallible>(server.handle(request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            server.connections_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

fn json_response(status: StatusCode, value: &Value) -> HttpResponse {
    let mut response = Response::new(SimBody::full(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> HttpResponse {
    json_response(status, &error_body(status.as_u16(), kind, message))
}

impl EngineServer {
    async fn handle(&self, request: Request<Incoming>) -> HttpResponse {
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        let path = request.uri().path().to_string();
        let method = request.method().clone();
        let mut response = if path.starts_with("/sim/") {
            self.handle_admin(&method, &path, request).await
        } else {
            self.wait_while_hung().await;
            let latency_ms = self.faults.borrow().latency_ms;
            if latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(latency_ms)).await;
            }
            self.route(&method, &path, request).await
        };
        let engine = HeaderValue::from(self.index);
        response.headers_mut().insert("x-sim-engine", engine);
        response
    }

    async fn route(&self, method: &Method, path: &str, request: Request<Incoming>) -> HttpResponse {
        let endpoint = match path {
            "/generate" => Some(Endpoint::Generate),
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/messages" => Some(Endpoint::Messages),
            _ => None,
        };
        if let Some(endpoint) = endpoint {
            if method != Method::POST {
                return error_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "invalid_request_error",
                    "use POST",
                );
            }
            return self.handle_inference(endpoint, request).await;
        }
        match (method.as_str(), path) {
            ("GET", "/health") | ("GET", "/health_generate") => self.health(),
            ("GET", "/v1/models") => json_response(StatusCode::OK, &self.models_json()),
            ("GET", "/get_model_info") => json_response(
                StatusCode::OK,
                &json!({"model_path": self.options.model_name, "tokenizer_path": null, "is_generation": true}),
            ),
            ("GET", "/server_info") => json_response(StatusCode::OK, &self.server_info()),
            ("GET", "/v1/loads") => {
                let mut loads = loads_json(&self.loads(), self.now_s());
                loads["disaggregation_mode"] = self.options.disagg.role.mode_json();
                json_response(StatusCode::OK, &loads)
            }
            ("GET", "/metrics") => self.metrics(),
            ("POST", "/flush_cache") | ("GET", "/flush_cache") => {
                if let Some(engine) = &self.engine {
                    engine.flush_cache();
                }
                Response::new(SimBody::full("Cache flushed.\n"))
            }
            _ => error_response(
                StatusCode::NOT_FOUND,
                "not_found_error",
                &format!("no route for {method} {path}"),
            ),
        }
    }

    fn health(&self) -> HttpResponse {
        if self.faults.borrow().unhealthy {
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "unhealthy",
                "engine is unhealthy (injected)",
            );
        }
        Response::new(SimBody::empty())
    }

    fn models_json(&self) -> Value {
        json!({"object": "list", "data": [{
            "id": self.options.model_name, "object": "model", "created": 0, "owned_by": self.options.owned_by,
            "root": self.options.model_name, "max_model_len": self.options.engine.kv_capacity_tokens,
        }]})
    }

    /// SGLang's `/server_info`: the server arguments a gateway reads (`page_size`, and
    /// `kv_events_config` as SGLang keeps it: a JSON string, or null without KV events).
    fn server_info(&self) -> Value {
        let options = &self.options;
        let kv_events_config = match (&self.kv_events, &options.kv_events) {
            (Some((endpoints, _)), Some(kv)) => {
                Value::String(endpoints.config_json(kv.replay_buffer_batches).to_string())
            }
            _ => Value::Null,
        };
        json!({
            "model_path": options.model_name,
            "served_model_name": options.model_name,
            "page_size": options.engine.page_size,
            "max_total_num_tokens": options.engine.kv_capacity_tokens,
            "max_running_requests": options.engine.max_running_requests,
            "chunked_prefill_size": options.engine.chunked_prefill_size,
            "disable_radix_cache": options.instant,
            "kv_events_config": kv_events_config,
            "disaggregation_mode": options.disagg.role.mode_json(),
            "version": concat!("sim-engine ", env!("CARGO_PKG_VERSION")),
        })
    }

    pub(super) fn loads(&self) -> LoadSnapshot {
        match &self.engine {
            Some(engine) => engine.loads(),
            None => LoadSnapshot {
                num_running_reqs: 0,
                num_waiting_reqs: 0,
                num_waiting_uncached_tokens: 0,
                num_used_tokens: 0,
                max_total_num_tokens: self.options.engine.kv_capacity_tokens,
                max_running_requests: self.options.engine.max_running_requests as u64,
                token_usage: 0.0,
                gen_throughput: 0.0,
                cache_hit_rate: 0.0,
                utilization: 0.0,
            },
        }
    }

    fn now_s(&self) -> f64 {
        self.engine.as_ref().map(EngineHandle::now_s).unwrap_or(0.0)
    }

    fn metrics(&self) -> HttpResponse {
        let load = self.loads();
        let totals = self
            .engine
            .as_ref()
            .map(EngineHandle::totals)
            .unwrap_or_default();
        let input = MetricsInput {
            model_name: &self.options.model_name,
            load: &load,
            totals: &totals,
            connections_accepted: self.connections_accepted.load(Ordering::Relaxed),
        };
        let mut response = Response::new(SimBody::full(prometheus_text(
            self.options.metrics_flavor,
            &input,
        )));
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        );
        response
    }

    /// Returns once the `hang` fault is off (immediately when it is).
    async fn wait_while_hung(&self) {
        let mut faults = self.faults.subscribe();
        loop {
            if !faults.borrow_and_update().hang {
                return;
            }
            if faults.changed().await.is_err() {
                // The sender lives as long as this server: unreachable, but never spin.
                std::future::pending::<()>().await;
            }
        }
    }

    async fn read_body(request: Request<Incoming>) -> Result<Bytes, HttpResponse> {
        match Limited::new(request.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(error)
                if error
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                Err(error_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "request body too large",
                ))
            }
            Err(error) => Err(error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("cannot read request body: {error}"),
            )),
        }
    }

    async fn handle_inference(
        &self,
        endpoint: Endpoint,
        request: Request<Incoming>,
    ) -> HttpResponse {
        let body = match Self::read_body(request).await {
            Ok(body) => body,
            Err(response) => return response,
        };
        let faults = *self.faults.borrow();
        let fail_after = faults.drop_mid_stream.then_some(1);
        let body_hash = xxh3_64(&body);
        if self.engine.is_none() {
            if let Some(answer) = self.instant.get(endpoint, body_hash) {
                return self
                    .injected_error(&faults)
                    .unwrap_or_else(|| instant_response(&answer, fail_after));
            }
        }
        let parsed = match parse_request(endpoint, &body) {
            Ok(parsed) => parsed,
            Err(error) => {
                return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &error.0)
            }
        };
        if let Some(response) = self.injected_error(&faults) {
            return response;
        }
        match &self.engine {
            Some(engine) if self.options.disagg.role != SimRole::Regular => {
                self.serve_disaggregated(engine, endpoint, &body, parsed, fail_after)
                    .await
            }
            Some(engine) => {
                let logprobs = parsed.return_logprob.then_some(parsed.tokens.len() as u32);
                let prefilled = Prefilled::No { logprobs };
                self.simulate(engine, endpoint, parsed, fail_after, prefilled)
                    .await
            }
            None => {
                let answer = self.answer_instantly(endpoint, &parsed, body_hash);
                self.instant.insert(endpoint, body_hash, &answer);
                instant_response(&answer, fail_after)
            }
        }
    }

    /// The `error_rate` fault: an error response for the drawn fraction of requests.
    fn injected_error(&self, faults: &Faults) -> Option<HttpResponse> {
        if faults.error_rate <= 0.0 {
            return None;
        }
        let draw = self
            .fault_rng
            .lock()
            .map(|mut rng| rng.f64())
            .unwrap_or(0.0);
        if draw >= faults.error_rate {
            return None;
        }
        let status =
            StatusCode::from_u16(faults.error_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Some(error_response(
            status,
            "injected_error",
            "injected failure (sim-engine fault)",
        ))
    }

    fn context(&self, parsed: &ParsedRequest, id: u64) -> ResponseContext {
        ResponseContext {
            id: format!("sim-{}-{id}", self.index),
            model: parsed
                .model
                .clone()
                .unwrap_or_else(|| self.options.model_name.clone()),
            prompt_tokens: parsed.tokens.len() as u32,
            cached_tokens: 0,
            completion_tokens: 0,
            hit_length_limit: parsed.max_new_tokens.is_some(),
            e2e_latency_s: 0.0,
            output_seed: parsed.output_seed(),
            input_logprobs: None,
        }
    }

    fn max_new_tokens(&self, parsed: &ParsedRequest) -> u32 {
        parsed
            .max_new_tokens
            .unwrap_or(self.options.default_max_tokens)
            .max(1)
    }

    async fn simulate(
        &self,
        engine: &EngineHandle,
        endpoint: Endpoint,
        parsed: ParsedRequest,
        fail_after: Option<usize>,
        prefilled: Prefilled,
    ) -> HttpResponse {
        let (logprobs, received, reported_cached) = match prefilled {
            Prefilled::No { logprobs } => (logprobs, false, None),
            Prefilled::Received { logprobs, cached } => (logprobs, true, Some(cached)),
        };
        let request = SimRequest {
            namespace: parsed.namespace,
            tokens: parsed.tokens.clone(),
            max_new_tokens: self.max_new_tokens(&parsed),
            output_seed: parsed.output_seed(),
            prefilled: received,
        };
        let (guard, mut receiver) = match engine.submit(request) {
            Ok(submitted) => submitted,
            Err(error) => return submit_error_response(&error),
        };
        let mut context = self.context(&parsed, guard.id());
        context.input_logprobs = logprobs;
        let arrival_us = guard.arrival_us();
        if parsed.stream {
            let stream = TokenStream {
                receiver,
                guard,
                endpoint,
                context,
                arrival_us,
                fail_after,
                reported_cached,
                chunks_sent: 0,
                done: false,
                drop: DropAfterFlush::default(),
            };
            return sse_response(SimBody::Tokens(Box::new(stream)));
        }
        loop {
            let Some(emit) = receiver.recv().await else {
                return error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "request cancelled",
                );
            };
            if emit.finished {
                context.completion_tokens = emit.completion_tokens;
                context.cached_tokens = reported_cached.unwrap_or(emit.cached_tokens);
                context.e2e_latency_s = emit.at_us.saturating_sub(arrival_us) as f64 / 1e6;
                break;
            }
        }
        drop(guard);
        let body = full_body(endpoint, &context).to_string();
        json_with_fault(Bytes::from(body), fail_after)
    }

    /// The whole answer at once; its id is the body hash, so equal bodies get equal answers.
    fn answer_instantly(
        &self,
        endpoint: Endpoint,
        parsed: &ParsedRequest,
        body_hash: u64,
    ) -> InstantAnswer {
        let mut context = self.context(parsed, body_hash);
        let count = self.max_new_tokens(parsed);
        if !parsed.stream {
            context.completion_tokens = count;
            return InstantAnswer::Json(Bytes::from(full_body(endpoint, &context).to_string()));
        }
        let chunks = (1..=count)
            .map(|completion_tokens| {
                context.completion_tokens = completion_tokens;
                Bytes::from(stream_chunk(endpoint, &context, completion_tokens == count))
            })
            .collect();
        InstantAnswer::Sse(chunks)
    }

    async fn handle_admin(
        &self,
        method: &Method,
        path: &str,
        request: Request<Incoming>,
    ) -> HttpResponse {
        match (method.as_str(), path) {
            ("GET", "/sim/transfer") => {
                let query = request.uri().query().and_then(transfer_query);
                let Some((room, wait)) = query else {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "expected ?room=R&wait_ms=T",
                    );
                };
                match self.transfers.wait(room, wait).await {
                    Some(done) => json_response(
                        StatusCode::OK,
                        &json!({"room": room, "tokens": done.tokens, "cached": done.cached}),
                    ),
                    None => json_response(
                        StatusCode::ACCEPTED,
                        &json!({"room": room, "pending": true}),
                    ),
                }
            }
            ("GET", "/sim/faults") => json_response(StatusCode::OK, &json!(*self.faults.borrow())),
            ("POST", "/sim/faults") => {
                let body = match Self::read_body(request).await {
                    Ok(body) => body,
                    Err(response) => return response,
                };
                let patch: Value = match serde_json::from_slice(&body) {
                    Ok(patch) => patch,
                    Err(error) => {
                        return error_response(
                            StatusCode::BAD_REQUEST,
                            "invalid_request_error",
                            &error.to_string(),
                        )
                    }
                };
                let current = *self.faults.borrow();
                match current.patched(&patch) {
                    Ok(faults) => {
                        self.faults.send_replace(faults);
                        json_response(StatusCode::OK, &json!(faults))
                    }
                    Err(message) => {
                        error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message)
                    }
                }
            }
            ("GET", "/sim/stats") => json_response(StatusCode::OK, &self.stats_json()),
            ("GET", "/sim/cache") => {
                let blocks = self
                    .engine
                    .as_ref()
                    .map(EngineHandle::cached_keys)
                    .unwrap_or_default();
                let page_size = self.options.engine.page_size;
                json_response(
                    StatusCode::OK,
                    &json!({"page_size": page_size, "blocks": blocks}),
                )
            }
            ("POST", "/sim/restart") => {
                // `--instant` has no engine and no sockets: nothing to restart.
                if let Some(engine) = &self.engine {
                    engine.restart();
                }
                json_response(
                    StatusCode::OK,
                    &json!({"engine": self.index, "restarted": self.engine.is_some()}),
                )
            }
            _ => error_response(
                StatusCode::NOT_FOUND,
                "not_found_error",
                &format!("no route for {method} {path}"),
            ),
        }
    }

    fn stats_json(&self) -> Value {
        let totals = self
            .engine
            .as_ref()
            .map(EngineHandle::totals)
            .unwrap_or_default();
        json!({
            "engine": self.index,
            "port": self.port,
            "connections_accepted": self.connections_accepted.load(Ordering::Relaxed),
            "connections_open": self.connections_open.load(Ordering::Relaxed),
            "requests_total": self.requests_total.load(Ordering::Relaxed),
            "requests_queued": totals.requests_queued,
            "requests_admitted": totals.requests_admitted,
            "requests_finished": totals.requests_finished,
            "requests_cancelled": totals.requests_cancelled,
            "prompt_tokens_total": totals.prompt_tokens,
            "cached_tokens_total": totals.cached_tokens,
            "generation_tokens_total": totals.generation_tokens,
            "evicted_pages_total": totals.evicted_pages,
            "kv_events": self.kv_events.as_ref().map(|(_, sink)| sink.stats_json()),
        })
    }
}

fn sse_response(body: SimBody) -> HttpResponse {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

/// A JSON body, or with `fail_after` its first half followed by a dropped connection.
fn instant_response(answer: &InstantAnswer, fail_after: Option<usize>) -> HttpResponse {
    match answer {
        InstantAnswer::Json(body) => json_with_fault(body.clone(), fail_after),
        InstantAnswer::Sse(chunks) => sse_response(SimBody::chunks(
            chunks.iter().cloned().collect(),
            fail_after,
        )),
    }
}

fn json_with_fault(body: Bytes, fail_after: Option<usize>) -> HttpResponse {
    let Some(_) = fail_after else {
        let mut response = Response::new(SimBody::full(body));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    };
    let full_length = body.len();
    let half = body.slice(..full_length / 2);
    let mut response = Response::new(SimBody::chunks([half].into(), Some(1)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        hyper::header::CONTENT_LENGTH,
        HeaderValue::from(full_length),
    );
    response
}

fn submit_error_response(error: &SubmitError) -> HttpResponse {
    match error {
        SubmitError::TooLong {
            needed_tokens,
            capacity_tokens,
        } => {
            let message = format!(
                "prompt plus max tokens ({needed_tokens}) exceed the KV capacity ({capacity_tokens} tokens)"
            );
            error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message)
        }
        SubmitError::QueueFull {
            max_waiting_requests,
        } => {
            let message = format!("the request queue is full ({max_waiting_requests} waiting)");
            error_response(StatusCode::SERVICE_UNAVAILABLE, "queue_full", &message)
        }
    }
}

/// Whether a request's prompt is computed here or arrived as a transferred KV cache, and how
/// many input logprobs its answer lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefilled {
    /// Computed here (a regular or a prefill engine).
    No { logprobs: Option<u32> },
    /// Received from a prefill engine (a decode engine), which found `cached` of its tokens
    /// in its prefix cache: the answer reports those.
    Received { logprobs: Option<u32>, cached: u32 },
}

/// What a prefill engine does once its token is out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterPrefill {
    /// SGLang: transfer to the rooms, then answer.
    TransferThenAnswer(Vec<u64>),
    /// vLLM: answer with `kv_transfer_params` naming this engine; the transfer follows.
    AnswerThenTransfer,
}

impl EngineServer {
    /// A request to a prefill or decode engine (see `sim::disagg`).
    async fn serve_disaggregated(
        &self,
        engine: &EngineHandle,
        endpoint: Endpoint,
        body: &[u8],
        parsed: ParsedRequest,
        fail_after: Option<usize>,
    ) -> HttpResponse {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let handoff = match Handoff::of(&value) {
            Ok(handoff) => handoff,
            Err(why) => {
                return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &why)
            }
        };
        let role = self.options.disagg.role;
        match (role, handoff) {
            (SimRole::Prefill, Handoff::Bootstrap { rooms, .. }) => {
                let after = AfterPrefill::TransferThenAnswer(rooms);
                self.prefill(engine, endpoint, parsed, after).await
            }
            (SimRole::Prefill, Handoff::RemoteDecode) => {
                let after = AfterPrefill::AnswerThenTransfer;
                self.prefill(engine, endpoint, parsed, after).await
            }
            (SimRole::Decode, Handoff::Bootstrap { host, port, rooms }) => {
                let received = self.receive(&host, port, &rooms).await;
                self.decode(engine, endpoint, parsed, fail_after, received)
                    .await
            }
            (
                SimRole::Decode,
                Handoff::RemotePrefill {
                    host,
                    port,
                    request_id,
                },
            ) => {
                let received = self.receive(&host, port, &[request_id]).await;
                self.decode(engine, endpoint, parsed, fail_after, received)
                    .await
            }
            (role, _) => {
                let message = format!(
                    "a {} engine needs bootstrap_host/bootstrap_port/bootstrap_room (SGLang) or \
                     kv_transfer_params (vLLM) for its side of the transfer",
                    role.mode_json().as_str().unwrap_or("regular")
                );
                error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message)
            }
        }
    }

    /// Waits for every room's transfer from the prefill engine at `host:port`; the first
    /// room's, or SGLang's error once one never comes.
    async fn receive(&self, host: &str, port: u16, rooms: &[u64]) -> Result<Transfer, String> {
        let timeout = self.options.disagg.transfer_timeout;
        let mut first = None;
        for room in rooms {
            let done = fetch_transfer(host, port, *room, timeout).await?;
            first = first.or(Some(done));
        }
        Ok(first.unwrap_or_default())
    }

    /// A decode engine's request once its transfer is in (`received`): decoded with the
    /// prompt's KV cache received, not computed.
    async fn decode(
        &self,
        engine: &EngineHandle,
        endpoint: Endpoint,
        parsed: ParsedRequest,
        fail_after: Option<usize>,
        received: Result<Transfer, String>,
    ) -> HttpResponse {
        let done = match received {
            Ok(done) => done,
            Err(why) => {
                return error_response(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", &why)
            }
        };
        let prefilled = Prefilled::Received {
            logprobs: parsed.return_logprob.then_some(0),
            cached: done.cached,
        };
        self.simulate(engine, endpoint, parsed, fail_after, prefilled)
            .await
    }

    /// A prefill engine's request: the prompt against its prefix cache, one output token, the
    /// transfer, and a whole (non-streaming) answer.
    async fn prefill(
        &self,
        engine: &EngineHandle,
        endpoint: Endpoint,
        parsed: ParsedRequest,
        after: AfterPrefill,
    ) -> HttpResponse {
        let prompt_tokens = parsed.tokens.len() as u32;
        let request = SimRequest {
            namespace: parsed.namespace,
            tokens: parsed.tokens.clone(),
            max_new_tokens: 1,
            output_seed: parsed.output_seed(),
            prefilled: false,
        };
        let (guard, mut receiver) = match engine.submit(request) {
            Ok(submitted) => submitted,
            Err(error) => return submit_error_response(&error),
        };
        let mut context = self.context(&parsed, guard.id());
        context.input_logprobs = parsed.return_logprob.then_some(prompt_tokens);
        let arrival_us = guard.arrival_us();
        loop {
            let Some(emit) = receiver.recv().await else {
                return error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "request cancelled",
                );
            };
            if emit.finished {
                context.completion_tokens = emit.completion_tokens;
                context.cached_tokens = emit.cached_tokens;
                context.e2e_latency_s = emit.at_us.saturating_sub(arrival_us) as f64 / 1e6;
                break;
            }
        }
        drop(guard);
        let transfer = transfer_time(prompt_tokens, &self.options.disagg, self.options.speedup);
        let mut body = full_body(endpoint, &context);
        match after {
            AfterPrefill::TransferThenAnswer(rooms) => {
                tokio::time::sleep(transfer).await;
                let done = Transfer {
                    tokens: prompt_tokens,
                    cached: context.cached_tokens,
                };
                for room in rooms {
                    self.transfers.complete(room, done);
                }
            }
            AfterPrefill::AnswerThenTransfer => {
                let request_id = xxh3_64(context.id.as_bytes()) & (i64::MAX as u64);
                body["kv_transfer_params"] = json!({
                    "do_remote_prefill": true,
                    "do_remote_decode": false,
                    "remote_engine_id": format!("sim-{}", self.index),
                    "remote_block_ids": (0..prompt_tokens.div_ceil(self.options.engine.page_size as u32)).collect::<Vec<u32>>(),
                    "remote_host": self.options.host.to_string(),
                    "remote_port": self.port,
                    "remote_request_id": request_id,
                });
                let transfers = Arc::clone(&self.transfers);
                let done = Transfer {
                    tokens: prompt_tokens,
                    cached: context.cached_tokens,
                };
                tokio::spawn(async move {
                    tokio::time::sleep(transfer).await;
                    transfers.complete(request_id, done);
                });
            }
        }
        json_response(StatusCode::OK, &body)
    }
}
