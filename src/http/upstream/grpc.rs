//! The gRPC upstream: a request to a `grpc://` worker, turned into the engine's `Generate` call
//! on this core's multiplexed HTTP/2 connection to it (`grpc::Channels`), and its stream of
//! token IDs turned back into the HTTP answer the client asked for. Owns [`GrpcExchange`], the
//! five steps of the seam for a gRPC worker.
//!
//! 1. **open**: a connection with room on it (`grpc::connection_for`), and the worker's backend
//!    (`--backend`, else detected once per core and worker);
//! 2. **forward**: the prompt's token IDs (the router's: `input_ids`, or the gateway's
//!    tokenization; a `/generate` text is tokenized here) and the sampling fields with the
//!    engines' defaults, as SGLang's or vLLM's `GenerateRequest`; the call starts;
//! 3. **head**: the call's first message. A call that ends first with a retryable status
//!    (`UNAVAILABLE` 503, `RESOURCE_EXHAUSTED` 429, 5xx) is handed back for another worker
//!    while one may follow, as an HTTP worker's same answer would be; otherwise the client's
//!    head (an event stream, or the whole JSON answer of an unstreamed request) is written;
//! 4. **body**: one SSE event per message, in SGLang's native `/generate` shape (the text of the
//!    output so far, its IDs, `meta_info`), then `data: [DONE]`;
//! 5. **give back**: nothing to pool; the connection stays shared by the core's calls.
//!
//! A call that stops before its end (the client went, shutdown, a timeout) resets its stream
//! (`RST_STREAM` `CANCEL`, `grpc::Call`'s drop) and sends the engine `Abort` for its request id,
//! so the engine stops generating at once.
//!
//! Only `/generate` is served in this version; the OpenAI endpoints answer 404 for a gRPC
//! worker until the front end (detokenizer, stop strings, response writers) lands.
//!
//! Errors: `UpstreamConnect` (retryable), `UpstreamClosed` (retryable until a message came),
//! `UpstreamTimeout`, `UpstreamMalformed`; a request body that is not one the engine can take
//! is `InvalidJson` (400); the client gone meanwhile is `ClientClosed`, shutdown's cut
//! `ShuttingDown`.

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;

use super::{interruption, Attempt, BodyKind, BodySource, BodyStop, HeadContext, HeadRead};
use super::{Interrupted, ResponseStart};
use crate::error::{ErrorKind, ProxyError, Side};
use crate::grpc::backend::{self, Method, ServicePaths};
use crate::grpc::generate::{Complete, GenerateEvent, GenerateInput, MatchedStop, Sampling};
use crate::grpc::{connection_for, Backend, Call, CallError, Connection};
use crate::http::core::DataCore;
use crate::http::downstream::{ClientSide, Forwarded};
use crate::ids::WorkerId;
use crate::net::codec::{self, Connection as ClientConnection, DownstreamFraming};
use crate::net::socket::Cut;
use crate::request::{Endpoint, KeySource};
use crate::tokenize::ModelTokenizer;
use crate::workers::spec::WorkerProtocol;
use crate::workers::table::WorkerEntry;

/// The head of a streamed answer, parsed once into the worker-head form the codec rewrites for
/// the client (framing, `Date`, the gateway's headers).
const EVENT_STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";

/// One attempt on a gRPC worker, and where its answer stands.
#[derive(Debug)]
pub struct GrpcExchange {
    connection: Connection,
    backend: Backend,
    authority: String,
    /// The call, once forwarded.
    call: Option<Call>,
    /// The engine's id of the request (for `Abort`).
    request_id: String,
    /// The client asked for an event stream.
    stream: bool,
    /// Text is written without special tokens.
    skip_special_tokens: bool,
    /// The model's tokenizer, for the text of the output (`None`: IDs only).
    tokenizer: Option<Arc<ModelTokenizer>>,
    /// Output IDs so far.
    output_ids: Vec<u32>,
    /// The last counts the engine sent.
    usage: Usage,
    /// How the client's body is framed.
    framing: DownstreamFraming,
    /// The call ended (its `Complete` came, or an error): no `Abort` is owed.
    finished: bool,
    /// The whole answer is written.
    body_done: bool,
    /// Stays empty: every body read is written into the client's buffer.
    relay_unused: Vec<u8>,
}

/// Token counts as the engine reports them.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    prompt_tokens: u32,
    completion_tokens: u32,
    cached_tokens: u32,
}

/// What the next message of the call was, or why none came.
enum Next {
    Event(GenerateEvent),
    /// The call ended with `OK` and no further message.
    End,
    Failed(CallError),
    Interrupted(Interrupted),
    TimedOut,
}

/// `/generate`'s body, the fields a gRPC engine takes.
#[derive(Debug, Default, Deserialize)]
struct GenerateBody {
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    sampling_params: SamplingBody,
    #[serde(default)]
    rid: Option<String>,
}

/// `/generate`'s `sampling_params`, SGLang's names; absent fields keep the engines' defaults.
#[derive(Debug, Default, Deserialize)]
struct SamplingBody {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    max_new_tokens: Option<u32>,
    min_new_tokens: Option<u32>,
    stop: Option<StopField>,
    stop_token_ids: Option<Vec<u32>>,
    skip_special_tokens: Option<bool>,
    spaces_between_special_tokens: Option<bool>,
    ignore_eos: Option<bool>,
    n: Option<u32>,
    seed: Option<i32>,
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

impl SamplingBody {
    fn into_sampling(self) -> Sampling {
        let d = Sampling::default();
        Sampling {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: self.min_new_tokens.unwrap_or(d.min_new_tokens),
            stop: match self.stop {
                None => Vec::new(),
                Some(StopField::One(one)) => vec![one],
                Some(StopField::Many(many)) => many,
            },
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(d.skip_special_tokens),
            spaces_between_special_tokens: self
                .spaces_between_special_tokens
                .unwrap_or(d.spaces_between_special_tokens),
            ignore_eos: self.ignore_eos.unwrap_or(d.ignore_eos),
            n: self.n.unwrap_or(d.n),
            seed: self.seed,
        }
    }
}

impl GrpcExchange {
    /// Step 1: a connection with room to `worker`, and its backend.
    pub(super) async fn open(core: &DataCore, worker: &WorkerEntry) -> Result<Self, ProxyError> {
        let connection = connection_for(&core.grpc, worker.id, worker.spec.addr)
            .await
            .map_err(|e| {
                ProxyError::upstream(ErrorKind::UpstreamConnect, "gRPC connect")
                    .because(std::io::Error::other(e))
                    .retryable()
            })?;
        let authority = worker.spec.authority.clone();
        let configured = match worker.spec.protocol {
            WorkerProtocol::Grpc(backend) => backend,
            WorkerProtocol::Http => None,
        };
        let known = configured.or_else(|| core.grpc.borrow().backend(worker.id));
        let backend = match known {
            Some(backend) => backend,
            None => {
                let detected = backend::detect(&connection, &authority)
                    .await
                    .map_err(|e| call_error(core, worker.id, e, "gRPC backend detection"))?;
                core.grpc.borrow_mut().set_backend(worker.id, detected);
                detected
            }
        };
        Ok(GrpcExchange {
            connection,
            backend,
            authority,
            call: None,
            request_id: String::new(),
            stream: false,
            skip_special_tokens: true,
            tokenizer: None,
            output_ids: Vec::new(),
            usage: Usage::default(),
            framing: DownstreamFraming::ChunkedPassthrough,
            finished: false,
            body_done: false,
            relay_unused: Vec::new(),
        })
    }

    /// Step 2: the `GenerateRequest`, built from the request and its prompt's token IDs.
    pub(super) async fn forward(
        &mut self,
        core: &DataCore,
        request: &mut Forwarded<'_>,
        attempt: &Attempt<'_>,
    ) -> Result<(), ProxyError> {
        let input = self.generate_input(core, request)?;
        let message = input.encode(self.backend);
        let path = self.backend.path(Method::Generate);
        let started = Call::start(&self.connection, &self.authority, path, message).await;
        let call = started.map_err(|e| call_error(core, attempt.worker.id, e, "gRPC Generate"))?;
        self.call = Some(call);
        Ok(())
    }

    /// The engine-neutral request: the prompt's IDs and the body's sampling fields.
    fn generate_input(
        &mut self,
        core: &DataCore,
        request: &mut Forwarded<'_>,
    ) -> Result<GenerateInput, ProxyError> {
        let invalid = |context| ProxyError::downstream(ErrorKind::InvalidJson, context);
        let prepared = request.prepared.get();
        let input = prepared.input();
        if input.endpoint() != Some(Endpoint::Generate) {
            return Err(ProxyError::new(
                ErrorKind::NotFound,
                Side::Downstream,
                "gRPC workers serve /generate only",
            ));
        }
        let body: GenerateBody = serde_json::from_slice(&request.read_buf[request.body.clone()])
            .map_err(|_| invalid("a /generate body a gRPC engine can take"))?;
        self.tokenizer = core
            .shared
            .config
            .tokenizers
            .for_model(input.model())
            .cloned();
        let input_ids = match input.key_source() {
            Some(KeySource::InputIds | KeySource::Tokenized) => match input.key() {
                crate::request::RoutingKey::Tokens(ids) => ids.to_vec(),
                crate::request::RoutingKey::Text(_) => Vec::new(),
            },
            _ => {
                let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
                    invalid("a gRPC worker takes token IDs: send input_ids, or give the gateway the model's tokenizer (--model-path, --tokenizer-path)")
                })?;
                tokenizer
                    .encode(input.text(), true)
                    .map_err(|_| invalid("the prompt could not be tokenized"))?
            }
        };
        if input_ids.is_empty() {
            return Err(invalid("an empty prompt"));
        }
        let sampling = body.sampling_params.into_sampling();
        self.stream = body.stream;
        self.skip_special_tokens = sampling.skip_special_tokens;
        self.request_id = body
            .rid
            .unwrap_or_else(|| format!("kvgate-{:016x}", fastrand::u64(..)));
        Ok(GenerateInput {
            request_id: self.request_id.clone(),
            input_ids,
            sampling,
            stream: self.stream,
        })
    }

    /// Step 3: the call's first message (all of them, unstreamed), then the client's head.
    pub(super) async fn read_head(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        context: HeadContext<'_>,
        deadline: Instant,
    ) -> Result<HeadRead, ProxyError> {
        self.framing = match client.version_minor {
            0 => DownstreamFraming::UntilClose,
            _ => DownstreamFraming::ChunkedPassthrough,
        };
        let connection = client.connection.and(ClientConnection::keep_if(
            self.framing != DownstreamFraming::UntilClose && !core.shared.is_shutting_down(),
        ));
        loop {
            let event = match self.next(core, client, deadline).await {
                Next::Event(event) => event,
                Next::End => {
                    return Err(self.failed(
                        core,
                        context.worker,
                        CallError::Malformed("the call ended without a Complete".into()),
                    ))
                }
                Next::Failed(CallError::Status(status)) => {
                    self.finished = true;
                    let http = status.code.http_status();
                    if !context.admit_status(core, http) {
                        return Ok(HeadRead::RetryableStatus(http));
                    }
                    self.body_done = true;
                    write_status_answer(client, context, http, &status.message, connection)?;
                    return Ok(HeadRead::Relaying(ResponseStart {
                        status: http,
                        body_kind: BodyKind::Other,
                        connection,
                        body_begun: true,
                    }));
                }
                Next::Failed(e) => return Err(self.failed(core, context.worker, e)),
                Next::Interrupted(why) => return Err(head_interrupted(why)),
                Next::TimedOut => {
                    return Err(ProxyError::upstream(
                        ErrorKind::UpstreamTimeout,
                        "no token from the gRPC worker in time",
                    ))
                }
            };
            let complete = self.take(event);
            if self.stream {
                self.start_event_stream(client, context, connection)?;
                self.write_event(client.write_buf, complete.as_ref());
                return Ok(HeadRead::Relaying(ResponseStart {
                    status: 200,
                    body_kind: BodyKind::EventStream,
                    connection,
                    body_begun: true,
                }));
            }
            if let Some(complete) = complete {
                self.finish_call(core, deadline).await;
                self.body_done = true;
                let body = self.answer_json(Some(&complete)).to_string();
                client.write_buf.clear();
                let head = json_head(body.len());
                write_head(client, context, head.as_bytes(), connection)?;
                client.write_buf.extend_from_slice(body.as_bytes());
                return Ok(HeadRead::Relaying(ResponseStart {
                    status: 200,
                    body_kind: BodyKind::Other,
                    connection,
                    body_begun: true,
                }));
            }
        }
    }

    /// Step 4: the next message as one SSE event, framed for the client in its write buffer.
    pub(super) async fn read_body(
        &mut self,
        core: &DataCore,
        client: &mut ClientSide<'_>,
        deadline: Instant,
    ) -> Result<Option<BodySource>, BodyStop> {
        let event = match self.next(core, client, deadline).await {
            Next::Event(event) => event,
            Next::End | Next::Failed(CallError::Status(_)) => {
                self.finished = true;
                return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamClosed));
            }
            Next::Failed(CallError::Malformed(_)) => {
                self.finished = true;
                return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamMalformed));
            }
            Next::Failed(_) => {
                // The connection broke: the worker's other calls on it will find out too.
                self.finished = true;
                self.connection.retire();
                return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamClosed));
            }
            Next::Interrupted(Interrupted::ClientGone) => return Err(BodyStop::ClientGone),
            Next::Interrupted(Interrupted::ShutdownCut) => return Err(BodyStop::ShutdownCut),
            Next::TimedOut => return Err(BodyStop::WorkerFailed(ErrorKind::UpstreamTimeout)),
        };
        let complete = self.take(event);
        core.spare_buffers
            .borrow_mut()
            .borrow_into(client.write_buf);
        client.write_buf.clear();
        self.write_event(client.write_buf, complete.as_ref());
        if complete.is_some() {
            self.finish_call(core, deadline).await;
        }
        Ok(Some(BodySource::Client))
    }

    /// Folds one message into the output so far; the `Complete`, if it was one.
    fn take(&mut self, event: GenerateEvent) -> Option<Complete> {
        match event {
            GenerateEvent::Chunk(chunk) => {
                self.output_ids.extend_from_slice(&chunk.token_ids);
                self.usage = Usage {
                    prompt_tokens: chunk.prompt_tokens,
                    completion_tokens: chunk.completion_tokens,
                    cached_tokens: chunk.cached_tokens,
                };
                None
            }
            GenerateEvent::Complete(complete) => {
                // Streamed, the chunks carried the IDs; unstreamed, the `Complete` does.
                if !self.stream || self.output_ids.is_empty() {
                    self.output_ids.clone_from(&complete.output_ids);
                }
                self.usage = Usage {
                    prompt_tokens: complete.prompt_tokens,
                    completion_tokens: complete.completion_tokens,
                    cached_tokens: complete.cached_tokens,
                };
                self.finished = true;
                Some(complete)
            }
            GenerateEvent::Empty => None,
        }
    }

    /// The call's next message, raced against the client's going, shutdown and `deadline`.
    async fn next(&mut self, core: &DataCore, client: &ClientSide<'_>, deadline: Instant) -> Next {
        let Some(call) = self.call.as_mut() else {
            return Next::End;
        };
        let message = std::pin::pin!(call.message());
        let stop = std::pin::pin!(interruption(core, client.socket, deadline));
        match futures::future::select(message, stop).await {
            futures::future::Either::Left((Ok(Some(bytes)), _)) => {
                match GenerateEvent::decode(self.backend, bytes) {
                    Ok(event) => Next::Event(event),
                    Err(e) => Next::Failed(e),
                }
            }
            futures::future::Either::Left((Ok(None), _)) => Next::End,
            futures::future::Either::Left((Err(e), _)) => Next::Failed(e),
            futures::future::Either::Right((Cut::Deadline, _)) => Next::TimedOut,
            futures::future::Either::Right((Cut::Stop, _)) => {
                Next::Interrupted(Interrupted::of(client.socket))
            }
        }
    }

    /// After the `Complete`: reads the call's status (it follows at once), so the stream ends
    /// whole instead of being reset.
    async fn finish_call(&mut self, _core: &DataCore, deadline: Instant) {
        if let Some(call) = self.call.as_mut() {
            let end =
                monoio::time::timeout_at(monoio::time::Instant::from_std(deadline), call.message());
            let _ = end.await;
        }
        self.body_done = true;
    }

    /// A failure before the answer began: the worker's connections are suspect.
    fn failed(&mut self, core: &DataCore, worker: WorkerId, error: CallError) -> ProxyError {
        self.finished = true;
        call_error(core, worker, error, "gRPC Generate")
    }

    /// Writes the event-stream head for the client.
    fn start_event_stream(
        &self,
        client: &mut ClientSide<'_>,
        context: HeadContext<'_>,
        connection: ClientConnection,
    ) -> Result<(), ProxyError> {
        client.write_buf.clear();
        write_head(client, context, EVENT_STREAM_HEAD, connection)
    }

    /// One SSE event with the output so far (and `data: [DONE]` after the last), framed.
    fn write_event(&self, out: &mut Vec<u8>, complete: Option<&Complete>) {
        let mut event = Vec::with_capacity(256);
        event.extend_from_slice(b"data: ");
        // Serializing a JSON value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut event, &self.answer_json(complete));
        event.extend_from_slice(b"\n\n");
        if complete.is_some() {
            event.extend_from_slice(b"data: [DONE]\n\n");
        }
        match self.framing {
            DownstreamFraming::ChunkedPassthrough => {
                out.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
                out.extend_from_slice(&event);
                out.extend_from_slice(b"\r\n");
                if complete.is_some() {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            }
            _ => out.extend_from_slice(&event),
        }
    }

    /// SGLang's native `/generate` answer for the output so far: `text`, `output_ids` and
    /// `meta_info` (with `finish_reason` once `complete`).
    fn answer_json(&self, complete: Option<&Complete>) -> serde_json::Value {
        let text = self
            .tokenizer
            .as_ref()
            .and_then(|t| {
                t.inner()
                    .decode(&self.output_ids, self.skip_special_tokens)
                    .ok()
            })
            .unwrap_or_default();
        let finish_reason = complete.map_or(serde_json::Value::Null, finish_reason_json);
        serde_json::json!({
            "text": text,
            "output_ids": self.output_ids,
            "meta_info": {
                "id": self.request_id,
                "finish_reason": finish_reason,
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
                "cached_tokens": self.usage.cached_tokens,
            },
        })
    }

    pub(super) fn body_done(&self) -> bool {
        self.body_done
    }

    /// Every read's bytes are in the client's buffer (`BodySource::Client`); nothing is here.
    pub(super) fn relay_buf(&mut self) -> &mut Vec<u8> {
        &mut self.relay_unused
    }

    /// The client's body is whole chunks of the gateway's own framing.
    pub(super) fn client_at_chunk_boundary(&self) -> bool {
        self.framing == DownstreamFraming::ChunkedPassthrough
    }

    /// Step 5: nothing to pool; a finished call leaves its connection to the core's others.
    pub(super) fn give_back(self, _core: &DataCore, _worker: WorkerId) {}
}

impl Drop for GrpcExchange {
    /// A call stopped before its end: its stream is reset as the call drops; the engine is also
    /// sent `Abort` for the request, on the same connection, from a task of its own.
    fn drop(&mut self) {
        if self.call.is_none() || self.finished {
            return;
        }
        self.call = None;
        let abort = backend::abort(
            self.connection.clone(),
            std::mem::take(&mut self.authority),
            self.backend,
            std::mem::take(&mut self.request_id),
        );
        monoio::spawn(abort);
    }
}

/// A call that failed before the answer began, as the retry loop reads it: a worker that did
/// not take the call or broke the connection may be retried on another; the worker's
/// connections on this core are dropped (an engine restart breaks them all).
fn call_error(
    core: &DataCore,
    worker: WorkerId,
    error: CallError,
    context: &'static str,
) -> ProxyError {
    let cause = std::io::Error::other(error.to_string());
    match error {
        CallError::Refused(_) | CallError::Broken(_) => {
            core.grpc.borrow_mut().forget(worker);
            ProxyError::upstream(ErrorKind::UpstreamClosed, context)
                .because(cause)
                .retryable()
        }
        CallError::Malformed(_) => {
            ProxyError::upstream(ErrorKind::UpstreamMalformed, context).because(cause)
        }
        CallError::Status(_) => ProxyError::upstream(ErrorKind::UpstreamClosed, context)
            .because(cause)
            .retryable(),
    }
}

/// The error of a head read the client's close or shutdown interrupted.
fn head_interrupted(interrupted: Interrupted) -> ProxyError {
    match interrupted {
        Interrupted::ClientGone => ProxyError::downstream(
            ErrorKind::ClientClosed,
            "client gone while waiting for the gRPC worker",
        ),
        Interrupted::ShutdownCut => ProxyError::new(
            ErrorKind::ShuttingDown,
            Side::Internal,
            "shutdown grace period over while waiting for the gRPC worker",
        ),
    }
}

/// Writes the client's head from `worker_head` (a head the gateway wrote in the worker's
/// place) through the same rewrite as an HTTP worker's: framing, `Date`, the gateway's headers.
fn write_head(
    client: &mut ClientSide<'_>,
    context: HeadContext<'_>,
    worker_head: &[u8],
    connection: ClientConnection,
) -> Result<(), ProxyError> {
    let head = codec::parse_response_head(worker_head, context.method)?.ok_or_else(|| {
        ProxyError::new(
            ErrorKind::Internal,
            Side::Internal,
            "gRPC answer head incomplete",
        )
    })?;
    let framing = DownstreamFraming::choose(head.framing, client.version_minor);
    codec::write_downstream_response_head(
        client.write_buf,
        &head,
        worker_head,
        context.gateway_headers,
        framing,
        connection,
    );
    Ok(())
}

/// The head of an unstreamed JSON answer of `len` bytes.
fn json_head(len: usize) -> String {
    format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n")
}

/// The answer for a call that ended with a non-OK status: its HTTP status and a JSON error
/// with the worker's `grpc-message`.
fn write_status_answer(
    client: &mut ClientSide<'_>,
    context: HeadContext<'_>,
    status: u16,
    message: &str,
    connection: ClientConnection,
) -> Result<(), ProxyError> {
    let kind = if status >= 500 {
        "upstream_error"
    } else {
        "invalid_request_error"
    };
    let body = crate::error::error_body(status, kind, message).to_string();
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        codec::reason_phrase(status),
        body.len()
    );
    client.write_buf.clear();
    write_head(client, context, head.as_bytes(), connection)?;
    client.write_buf.extend_from_slice(body.as_bytes());
    Ok(())
}

/// SGLang's `finish_reason` object: `{"type": "length", "length": n}`, `{"type": "stop",
/// "matched": id or text}`, `{"type": "abort"}`.
fn finish_reason_json(complete: &Complete) -> serde_json::Value {
    match (complete.finish_reason.as_str(), &complete.matched_stop) {
        ("length", _) => {
            serde_json::json!({ "type": "length", "length": complete.completion_tokens })
        }
        (kind, Some(MatchedStop::TokenId(id))) => {
            serde_json::json!({ "type": kind, "matched": id })
        }
        (kind, Some(MatchedStop::Text(text))) => {
            serde_json::json!({ "type": kind, "matched": text })
        }
        (kind, None) => serde_json::json!({ "type": kind }),
    }
}
