//! `sim-engine --grpc sglang|vllm`: the same simulated engine behind SMG's gRPC protocols
//! (SGLang's `SglangScheduler`, vLLM's `VllmEngine`), served with `h2` on the fleet's tokio, so
//! a gateway's gRPC mode can be run against a fleet. `Generate` submits the prompt's token IDs
//! to the engine model and streams the output tokens it emits (the sim's deterministic words,
//! `sim::output`, as IDs of the model's tokenizer with `--tokenizer-path`, so a gateway decodes
//! real text), with their logprobs when asked (`sim::output::output_logprobs`); `HealthCheck`,
//! `GetLoads`, `GetModelInfo` and `Abort` answer from the same engine. With
//! `--kv-events-base-port`, `SubscribeKvEvents` streams the prefix cache's event
//! batches (the same numbers as the ZMQ publisher's): from `start_sequence_number` among those
//! kept (everything kept for 0, or for a number past the engine's, a subscriber from before a
//! restart), then live; a restart ends the stream (`UNAVAILABLE`), and so does
//! `--grpc-kv-stream-batches` after that many batches (a fault for resumption tests). The other engine's service (and any unknown method) is `UNIMPLEMENTED`, which is how
//! a gateway tells the two apart. Every connection announces `--grpc-max-concurrent-streams`.
//!
//! Each HTTP/2 connection opened and closed, a stream the gateway resets, an `Abort` it sends
//! and a `SubscribeKvEvents` call are written to stderr (`sim-engine: engine N connection`,
//! `... connection closed`, `... GOAWAY` (`--grpc-goaway-after-streams`; `--grpc-stall-after-
//! tokens` holds streams open silent instead),
//! `... stream reset RID`, `... Abort RID`, `... SubscribeKvEvents from SEQ`), which tests read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::RecvStream;
use prost::Message;
use tokio::net::TcpListener;

use super::cache::CacheEvent;
use super::engine::SimRequest;
use super::options::GrpcProtocol;
use super::output::{output_logprobs, prompt_seed};
use super::publisher::EventSink;
use super::server::EngineServer;

/// The generated messages of `proto/smg/`, nested as their packages.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    /// `smg.*`.
    pub mod smg {
        /// `smg.grpc`.
        pub mod grpc {
            /// `smg.grpc.common`.
            pub mod common {
                include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
            }
        }
    }
    /// `sglang.*`.
    pub mod sglang {
        /// `sglang.grpc`.
        pub mod grpc {
            /// `sglang.grpc.scheduler`.
            pub mod scheduler {
                include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
            }
        }
    }
    /// `vllm.*`.
    pub mod vllm {
        /// `vllm.grpc`.
        pub mod grpc {
            /// `vllm.grpc.engine`.
            pub mod engine {
                include!(concat!(env!("OUT_DIR"), "/vllm.grpc.engine.rs"));
            }
        }
    }
}

use pb::sglang::grpc::scheduler as sg;
use pb::smg::grpc::common;
use pb::vllm::grpc::engine as vl;

/// gRPC status codes this server answers with.
const UNIMPLEMENTED: u32 = 12;
const INVALID_ARGUMENT: u32 = 3;
const RESOURCE_EXHAUSTED: u32 = 8;
const UNAVAILABLE: u32 = 14;
const INTERNAL: u32 = 13;

/// The largest request message read.
const REQUEST_BYTES_MAX: usize = 64 << 20;

/// Accepts connections forever and serves each as HTTP/2 gRPC.
pub async fn serve_engine(
    listener: TcpListener,
    server: Arc<EngineServer>,
    protocol: GrpcProtocol,
    max_streams: u32,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("sim-engine: engine {} accept failed: {error}", server.index);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let mut builder = h2::server::Builder::new();
            builder.max_concurrent_streams(max_streams);
            let Ok(mut connection) = builder.handshake::<_, Bytes>(stream).await else {
                return;
            };
            eprintln!("sim-engine: engine {} connection", server.index);
            let goaway_after = server.options.grpc_goaway_after_streams;
            let mut accepted = 0;
            while let Some(Ok((request, respond))) = connection.accept().await {
                accepted += 1;
                if goaway_after == Some(accepted) {
                    // Graceful: the streams accepted so far run to their end.
                    connection.graceful_shutdown();
                    eprintln!("sim-engine: engine {} GOAWAY", server.index);
                }
                let server = Arc::clone(&server);
                tokio::spawn(async move {
                    let path = request.uri().path().to_string();
                    let body = request.into_body();
                    serve_call(&server, protocol, &path, body, respond).await;
                });
            }
            eprintln!("sim-engine: engine {} connection closed", server.index);
        });
    }
}

/// The service name of `protocol`.
fn service(protocol: GrpcProtocol) -> &'static str {
    match protocol {
        GrpcProtocol::Sglang => "sglang.grpc.scheduler.SglangScheduler",
        GrpcProtocol::Vllm => "vllm.grpc.engine.VllmEngine",
    }
}

async fn serve_call(
    server: &EngineServer,
    protocol: GrpcProtocol,
    path: &str,
    body: RecvStream,
    respond: SendResponse<Bytes>,
) {
    let method = path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .filter(|(s, _)| *s == service(protocol))
        .map(|(_, method)| method.to_string());
    let Some(method) = method else {
        return status_only(respond, UNIMPLEMENTED, "unknown service");
    };
    let Some(message) = read_message(body).await else {
        return status_only(respond, INVALID_ARGUMENT, "malformed request message");
    };
    match (protocol, method.as_str()) {
        (_, "Generate") => generate(server, protocol, message, respond).await,
        (GrpcProtocol::Sglang, "HealthCheck") => unary(
            respond,
            &sg::HealthCheckResponse {
                healthy: !server.faults.borrow().unhealthy,
                message: String::new(),
            },
        ),
        (GrpcProtocol::Vllm, "HealthCheck") => unary(
            respond,
            &vl::HealthCheckResponse {
                healthy: !server.faults.borrow().unhealthy,
                message: String::new(),
            },
        ),
        (GrpcProtocol::Sglang, "Abort") => {
            let request = sg::AbortRequest::decode(message).unwrap_or_default();
            eprintln!(
                "sim-engine: engine {} Abort {}",
                server.index, request.request_id
            );
            unary(
                respond,
                &sg::AbortResponse {
                    success: true,
                    message: String::new(),
                },
            );
        }
        (GrpcProtocol::Vllm, "Abort") => {
            let request = vl::AbortRequest::decode(message).unwrap_or_default();
            for id in request.request_ids {
                eprintln!("sim-engine: engine {} Abort {id}", server.index);
            }
            unary(respond, &vl::AbortResponse {});
        }
        (_, "SubscribeKvEvents") => match &server.kv_events {
            Some((_, sink)) => subscribe_kv_events(server, sink, message, respond).await,
            None => status_only(
                respond,
                UNIMPLEMENTED,
                "no KV events (--kv-events-base-port)",
            ),
        },
        (GrpcProtocol::Sglang, "GetLoads") => unary(respond, &sglang_loads(server)),
        (GrpcProtocol::Vllm, "GetLoads") => unary(respond, &vllm_loads(server)),
        (GrpcProtocol::Sglang, "GetModelInfo") => unary(
            respond,
            &sg::GetModelInfoResponse {
                model_path: server.options.model_name.clone(),
                served_model_name: server.options.model_name.clone(),
                is_generation: true,
                max_context_length: clamp_i32(server.options.engine.kv_capacity_tokens),
                ..Default::default()
            },
        ),
        (GrpcProtocol::Vllm, "GetModelInfo") => unary(
            respond,
            &vl::GetModelInfoResponse {
                model_path: server.options.model_name.clone(),
                served_model_name: server.options.model_name.clone(),
                is_generation: true,
                max_context_length: u32::try_from(server.options.engine.kv_capacity_tokens)
                    .unwrap_or(u32::MAX),
                ..Default::default()
            },
        ),
        (_, "GetTokenizer") => match &server.options.grpc_tokenizer_dir {
            Some(dir) => get_tokenizer(dir, respond),
            None => status_only(respond, UNIMPLEMENTED, "no --grpc-tokenizer-dir"),
        },
        _ => status_only(respond, UNIMPLEMENTED, "unknown method"),
    }
}

/// `GetTokenizer`: a zip of `dir`'s tokenizer files in 1 MiB pieces, the last with its SHA-256.
fn get_tokenizer(dir: &std::path::Path, mut respond: SendResponse<Bytes>) {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        let Ok(contents) = std::fs::read(dir.join(name)) else {
            continue;
        };
        let options = zip::write::SimpleFileOptions::default();
        if zip.start_file(name, options).is_err() || zip.write_all(&contents).is_err() {
            return status_only(respond, INTERNAL, "zip failed");
        }
    }
    let Ok(archive) = zip.finish().map(|c| c.into_inner()) else {
        return status_only(respond, INTERNAL, "zip failed");
    };
    use sha2::Digest;
    let sha256 = format!("{:x}", sha2::Sha256::digest(&archive));
    let Ok(mut send) = respond.send_response(grpc_head(), false) else {
        return;
    };
    let pieces: Vec<&[u8]> = archive.chunks(1 << 20).collect();
    for (i, data) in pieces.iter().enumerate() {
        let chunk = common::GetTokenizerChunk {
            data: data.to_vec(),
            sha256: if i + 1 == pieces.len() {
                sha256.clone()
            } else {
                String::new()
            },
        };
        if send.send_data(frame(&chunk), false).is_err() {
            return;
        }
    }
    let _ = send.send_trailers(grpc_trailers(0, ""));
}

fn clamp_i32(value: u64) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn sglang_loads(server: &EngineServer) -> sg::GetLoadsResponse {
    let l = server.loads();
    sg::GetLoadsResponse {
        dp_rank_count: 1,
        loads: vec![sg::SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: clamp_i32(l.num_running_reqs),
            num_waiting_reqs: clamp_i32(l.num_waiting_reqs),
            num_total_reqs: clamp_i32(l.num_running_reqs + l.num_waiting_reqs),
            num_used_tokens: clamp_i32(l.num_used_tokens),
            max_total_num_tokens: clamp_i32(l.max_total_num_tokens),
            token_usage: l.token_usage,
            gen_throughput: l.gen_throughput,
            cache_hit_rate: l.cache_hit_rate,
            utilization: l.utilization,
            max_running_requests: clamp_i32(l.max_running_requests),
            num_waiting_uncached_tokens: clamp_i32(l.num_waiting_uncached_tokens),
        }],
        ..Default::default()
    }
}

fn vllm_loads(server: &EngineServer) -> vl::GetLoadsResponse {
    let l = server.loads();
    vl::GetLoadsResponse {
        dp_rank_count: 1,
        loads: vec![vl::SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: clamp_i32(l.num_running_reqs),
            num_waiting_reqs: clamp_i32(l.num_waiting_reqs),
            num_total_reqs: clamp_i32(l.num_running_reqs + l.num_waiting_reqs),
            num_used_tokens: clamp_i32(l.num_used_tokens),
            max_total_num_tokens: clamp_i32(l.max_total_num_tokens),
            token_usage: l.token_usage,
            gen_throughput: l.gen_throughput,
            cache_hit_rate: l.cache_hit_rate,
            utilization: l.utilization,
            max_running_requests: clamp_i32(l.max_running_requests),
            num_waiting_uncached_tokens: clamp_i32(l.num_waiting_uncached_tokens),
        }],
        ..Default::default()
    }
}

/// What `Generate` needs of either engine's request.
struct GenerateCall {
    request_id: String,
    input_ids: Vec<u32>,
    max_new_tokens: Option<u32>,
    stream: bool,
    /// Output logprobs with this many alternatives, when asked.
    logprobs: Option<u32>,
}

fn parse_generate(protocol: GrpcProtocol, message: Bytes) -> Option<GenerateCall> {
    match protocol {
        GrpcProtocol::Sglang => {
            let request = sg::GenerateRequest::decode(message).ok()?;
            Some(GenerateCall {
                request_id: request.request_id,
                input_ids: request.tokenized?.input_ids,
                max_new_tokens: request.sampling_params.and_then(|p| p.max_new_tokens),
                stream: request.stream,
                logprobs: request
                    .return_logprob
                    .then(|| u32::try_from(request.top_logprobs_num).unwrap_or(0)),
            })
        }
        GrpcProtocol::Vllm => {
            let request = vl::GenerateRequest::decode(message).ok()?;
            let input_ids = match request.input? {
                vl::generate_request::Input::Tokenized(tokens) => tokens.input_ids,
                vl::generate_request::Input::Text(_) => return None,
            };
            let params = request.sampling_params.unwrap_or_default();
            Some(GenerateCall {
                request_id: request.request_id,
                input_ids,
                max_new_tokens: params.max_tokens,
                stream: request.stream,
                logprobs: params.logprobs.map(|top| u32::try_from(top).unwrap_or(0)),
            })
        }
    }
}

/// Counts of one response message.
#[derive(Clone, Copy)]
struct Counts {
    prompt: u32,
    completion: u32,
    cached: u32,
}

/// The logprobs of a message's tokens, in the fields both protocols' `OutputLogProbs` share:
/// each token's, and its alternatives' IDs and values.
#[derive(Default)]
struct Logprobs {
    ids: Vec<u32>,
    values: Vec<f32>,
    top: Vec<(Vec<u32>, Vec<f32>)>,
}

impl Logprobs {
    fn push(&mut self, id: u32, (value, top): (f32, Vec<(u32, f32)>)) {
        self.ids.push(id);
        self.values.push(value);
        self.top.push(top.into_iter().unzip());
    }

    fn sglang(self) -> Option<sg::OutputLogProbs> {
        (!self.ids.is_empty()).then(|| sg::OutputLogProbs {
            token_logprobs: self.values,
            token_ids: self.ids,
            top_logprobs: self
                .top
                .into_iter()
                .map(|(token_ids, values)| sg::TopLogProbs { values, token_ids })
                .collect(),
        })
    }

    fn vllm(self) -> Option<vl::OutputLogProbs> {
        (!self.ids.is_empty()).then(|| vl::OutputLogProbs {
            token_logprobs: self.values,
            token_ids: self.ids,
            top_logprobs: self
                .top
                .into_iter()
                .map(|(token_ids, values)| vl::TopLogProbs { values, token_ids })
                .collect(),
        })
    }
}

fn chunk_message(
    protocol: GrpcProtocol,
    rid: &str,
    ids: Vec<u32>,
    c: Counts,
    logprobs: Logprobs,
) -> Bytes {
    match protocol {
        GrpcProtocol::Sglang => frame(&sg::GenerateResponse {
            request_id: rid.to_string(),
            response: Some(sg::generate_response::Response::Chunk(
                sg::GenerateStreamChunk {
                    token_ids: ids,
                    prompt_tokens: c.prompt,
                    completion_tokens: c.completion,
                    cached_tokens: c.cached,
                    output_logprobs: logprobs.sglang(),
                    ..Default::default()
                },
            )),
        }),
        GrpcProtocol::Vllm => frame(&vl::GenerateResponse {
            response: Some(vl::generate_response::Response::Chunk(
                vl::GenerateStreamChunk {
                    token_ids: ids,
                    prompt_tokens: c.prompt,
                    completion_tokens: c.completion,
                    cached_tokens: c.cached,
                    output_logprobs: logprobs.vllm(),
                    ..Default::default()
                },
            )),
        }),
    }
}

/// The next of `--grpc-completion-ids`' completions (in turn over every engine), if any.
fn scripted_completion(completions: &[Vec<u32>]) -> Option<&[u32]> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    if completions.is_empty() {
        return None;
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Some(&completions[n % completions.len()])
}

fn complete_message(
    protocol: GrpcProtocol,
    rid: &str,
    ids: Vec<u32>,
    c: Counts,
    finish: &str,
    logprobs: Logprobs,
) -> Bytes {
    match protocol {
        GrpcProtocol::Sglang => frame(&sg::GenerateResponse {
            request_id: rid.to_string(),
            response: Some(sg::generate_response::Response::Complete(
                sg::GenerateComplete {
                    output_ids: ids,
                    finish_reason: finish.into(),
                    prompt_tokens: c.prompt,
                    completion_tokens: c.completion,
                    cached_tokens: c.cached,
                    output_logprobs: logprobs.sglang(),
                    ..Default::default()
                },
            )),
        }),
        GrpcProtocol::Vllm => frame(&vl::GenerateResponse {
            response: Some(vl::generate_response::Response::Complete(
                vl::GenerateComplete {
                    output_ids: ids,
                    finish_reason: finish.into(),
                    prompt_tokens: c.prompt,
                    completion_tokens: c.completion,
                    cached_tokens: c.cached,
                    output_logprobs: logprobs.vllm(),
                    ..Default::default()
                },
            )),
        }),
    }
}

/// `Generate`: the prompt into the engine model, its tokens back as they are emitted. A reset
/// from the client cancels the request in the engine (its guard drops).
async fn generate(
    server: &EngineServer,
    protocol: GrpcProtocol,
    message: Bytes,
    mut respond: SendResponse<Bytes>,
) {
    let Some(call) = parse_generate(protocol, message) else {
        return status_only(respond, INVALID_ARGUMENT, "malformed GenerateRequest");
    };
    let Some(engine) = server.engine.as_ref() else {
        return status_only(respond, UNIMPLEMENTED, "no engine (--instant)");
    };
    let output_seed = prompt_seed(&call.input_ids);
    let max_new_tokens = call
        .max_new_tokens
        .unwrap_or(server.options.default_max_tokens)
        .max(1);
    let scripted = scripted_completion(&server.options.grpc_completions);
    let request = SimRequest {
        namespace: 0,
        tokens: call.input_ids,
        max_new_tokens: match scripted {
            Some(ids) => max_new_tokens.min(ids.len().max(1) as u32),
            None => max_new_tokens,
        },
        output_seed,
        prefilled: false,
    };
    let (guard, mut receiver) = match engine.submit(request) {
        Ok(submitted) => submitted,
        Err(error) => return status_only(respond, RESOURCE_EXHAUSTED, &format!("{error:?}")),
    };
    let Ok(mut send) = respond.send_response(grpc_head(), false) else {
        return;
    };
    let rid = call.request_id;
    let mut ids = Vec::new();
    let mut all_logprobs = Logprobs::default();
    loop {
        let emit = tokio::select! {
            emit = receiver.recv() => emit,
            reset = std::future::poll_fn(|cx| send.poll_reset(cx)) => {
                if reset.is_ok() {
                    eprintln!("sim-engine: engine {} stream reset {rid}", server.index);
                }
                return;
            }
        };
        let Some(emit) = emit else {
            return;
        };
        let index = emit.completion_tokens.saturating_sub(1);
        if server.options.grpc_stall_after_tokens == Some(index) {
            // The stall fault: nothing more, the stream held open until the caller resets it.
            if std::future::poll_fn(|cx| send.poll_reset(cx)).await.is_ok() {
                eprintln!("sim-engine: engine {} stream reset {rid}", server.index);
            }
            return;
        }
        let vocabulary = &server.options.engine.output;
        let token = match scripted {
            Some(ids) => ids.get(index as usize).copied().unwrap_or(0),
            None => vocabulary.token(output_seed, index),
        };
        ids.push(token);
        let mut token_logprobs = Logprobs::default();
        if let Some(top) = call.logprobs {
            let logprobs = output_logprobs(vocabulary, output_seed, index, top);
            match call.stream {
                true => token_logprobs.push(token, logprobs),
                false => all_logprobs.push(token, logprobs),
            }
        }
        let counts = Counts {
            prompt: emit.prompt_tokens,
            completion: emit.completion_tokens,
            cached: emit.cached_tokens,
        };
        if call.stream
            && send
                .send_data(
                    chunk_message(protocol, &rid, vec![token], counts, token_logprobs),
                    false,
                )
                .is_err()
        {
            return;
        }
        if emit.finished {
            let output = if call.stream {
                Vec::new()
            } else {
                std::mem::take(&mut ids)
            };
            // A scripted completion that ran to its end stopped; any other hit the limit.
            let finish = match scripted {
                Some(script) if emit.completion_tokens as usize >= script.len() => "stop",
                _ => "length",
            };
            if send
                .send_data(
                    complete_message(
                        protocol,
                        &rid,
                        output,
                        counts,
                        finish,
                        std::mem::take(&mut all_logprobs),
                    ),
                    false,
                )
                .is_err()
            {
                return;
            }
            break;
        }
    }
    drop(guard);
    let _ = send.send_trailers(grpc_trailers(0, ""));
}

/// One engine step's cache events as a framed `KvEventBatch` numbered `seq`, each block of
/// `block_size` tokens.
pub fn kv_event_batch(seq: u64, ts_s: f64, block_size: usize, events: &[CacheEvent]) -> Bytes {
    use common::kv_cache_event::Data;
    let size = i32::try_from(block_size).unwrap_or(i32::MAX);
    let event = |data| common::KvCacheEvent {
        event_id: 0,
        data: Some(data),
    };
    let events = events.iter().map(|e| match e {
        CacheEvent::Stored {
            keys,
            parent_key,
            tokens,
        } => event(Data::Stored(common::KvBlocksStored {
            blocks: keys
                .iter()
                .zip(tokens.chunks(block_size.max(1)))
                .map(|(key, tokens)| common::KvBlock {
                    block_hash: *key as i64,
                    token_ids: tokens.to_vec(),
                    block_size: size,
                    ..Default::default()
                })
                .collect(),
            parent_block_hash: parent_key.map(|key| key as i64),
            ..Default::default()
        })),
        CacheEvent::Removed { keys } => event(Data::Removed(common::KvBlocksRemoved {
            block_hashes: keys.iter().map(|key| *key as i64).collect(),
            ..Default::default()
        })),
        CacheEvent::Cleared => event(Data::Cleared(common::KvCacheCleared::default())),
    });
    frame(&common::KvEventBatch {
        sequence_number: seq,
        timestamp: ts_s,
        events: events.collect(),
        dp_rank: Some(0),
        ..Default::default()
    })
}

/// `SubscribeKvEvents`: the kept batches from the start asked for, then each new one, until the
/// engine restarts, the subscriber goes, or `--grpc-kv-stream-batches` were sent.
async fn subscribe_kv_events(
    server: &EngineServer,
    sink: &EventSink,
    message: Bytes,
    mut respond: SendResponse<Bytes>,
) {
    let Ok(request) = common::SubscribeKvEventsRequest::decode(message) else {
        return status_only(
            respond,
            INVALID_ARGUMENT,
            "malformed SubscribeKvEventsRequest",
        );
    };
    let start = request.start_sequence_number;
    eprintln!(
        "sim-engine: engine {} SubscribeKvEvents from {start}",
        server.index
    );
    let mut published = sink.published();
    let (epoch, next_seq) = *published.borrow_and_update();
    // A number past the engine's is a subscriber from before a restart: all it keeps.
    let mut next = if start > next_seq { 0 } else { start };
    let Ok(mut send) = respond.send_response(grpc_head(), false) else {
        return;
    };
    let limit = server.options.grpc_kv_stream_batches.unwrap_or(u64::MAX);
    let mut sent = 0;
    loop {
        for (seq, batch) in sink.grpc_from(next) {
            if send.send_data(batch, false).is_err() {
                return;
            }
            next = seq + 1;
            sent += 1;
            if sent >= limit {
                let _ = send.send_trailers(grpc_trailers(UNAVAILABLE, "stream batch limit"));
                return;
            }
        }
        tokio::select! {
            changed = published.changed() => {
                if changed.is_err() || published.borrow_and_update().0 != epoch {
                    let _ = send.send_trailers(grpc_trailers(UNAVAILABLE, "engine restarted"));
                    return;
                }
            }
            _ = std::future::poll_fn(|cx| send.poll_reset(cx)) => return,
        }
    }
}

/// Reads the one request message of a call.
async fn read_message(mut body: RecvStream) -> Option<Bytes> {
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
        if data.len() > REQUEST_BYTES_MAX + 5 {
            return None;
        }
    }
    if data.len() < 5 || data[0] != 0 {
        return None;
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    (data.len() == 5 + len).then(|| data.freeze().slice(5..))
}

fn frame(message: &impl Message) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.encoded_len());
    out.extend_from_slice(&[0]);
    out.extend_from_slice(&(message.encoded_len() as u32).to_be_bytes());
    let _ = message.encode(&mut out);
    out.freeze()
}

fn grpc_head() -> http::Response<()> {
    let mut response = http::Response::new(());
    response.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

fn grpc_trailers(code: u32, message: &str) -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from(code));
    if let Ok(value) = http::HeaderValue::from_str(message) {
        if !message.is_empty() {
            trailers.insert("grpc-message", value);
        }
    }
    trailers
}

/// A trailers-only answer: the status in the response headers, no message.
fn status_only(mut respond: SendResponse<Bytes>, code: u32, message: &str) {
    let mut response = grpc_head();
    response.headers_mut().extend(grpc_trailers(code, message));
    let _ = respond.send_response(response, true);
}

fn unary(mut respond: SendResponse<Bytes>, message: &impl Message) {
    let Ok(mut send) = respond.send_response(grpc_head(), false) else {
        return;
    };
    if send.send_data(frame(message), false).is_ok() {
        let _ = send.send_trailers(grpc_trailers(0, ""));
    }
}
