//! The gRPC upstream: a request to a `grpc://` worker, turned into the engine's `Generate` call
//! on this core's multiplexed HTTP/2 connection to it (`grpc::Channels`), and its stream of
//! token IDs turned back into the answer of the API the client called (`frontend`: OpenAI chat
//! and completions, Anthropic messages, SGLang's `/generate`). Owns [`GrpcExchange`], the five
//! steps of the seam for a gRPC worker.
//!
//! 1. **open**: a connection with room on it (`grpc::connection_for`), and the worker's backend
//!    (`--backend`, else detected once per core and worker);
//! 2. **forward**: the body parsed into `frontend::GenerateParams` (a body the gateway refuses
//!    is answered 400 at the head step, never sent); the prompt's token IDs (the router's
//!    tokenization, the client's `input_ids`, or a text tokenized here) and the sampling fields
//!    with the engines' defaults, as SGLang's or vLLM's `GenerateRequest`; the call starts;
//! 3. **head**: the call's first message. A call that ends first with a retryable status
//!    (`UNAVAILABLE` 503, `RESOURCE_EXHAUSTED` 429, 5xx) is handed back for another worker
//!    while one may follow, as an HTTP worker's same answer would be; otherwise the client's
//!    head (an event stream, or the whole JSON answer of an unstreamed request) is written;
//! 4. **body**: each message's tokens through the request's `frontend::OutputDecoder`
//!    (incremental detokenization, stop strings) into its `StreamWriter`'s events, one HTTP
//!    chunk per message;
//! 5. **give back**: nothing to pool; the connection stays shared by the core's calls.
//!
//! A call that stops before its end (the client went, shutdown, a timeout, a stop string the
//! gateway matched) resets its stream (`RST_STREAM` `CANCEL`, `grpc::Call`'s drop) and sends
//! the engine `Abort` for its request id, so the engine stops generating at once.
//!
//! Each model's `tokenize::DecodeTable` is built when its tokenizer is loaded, at start (on a
//! thread of its own), and shared read-only by the cores (`ModelTokenizer::decode_table`); a model without a tokenizer
//! gets a table that knows no token, so `/generate` with `input_ids` still answers its IDs
//! (with empty text).
//!
//! Errors: `UpstreamConnect` (retryable), `UpstreamClosed` (retryable until a message came),
//! `UpstreamTimeout`, `UpstreamMalformed`; a body the front end refuses is a 400 with its
//! reason; the client gone meanwhile is `ClientClosed`, shutdown's cut `ShuttingDown`.

use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{interruption, Attempt, BodyKind, BodySource, BodyStop, HeadContext, HeadRead};
use super::{Interrupted, ResponseStart};
use crate::error::{ErrorKind, ProxyError, Side};
use crate::frontend::{
    Api, Finish, FinishReason, FullWriter, GenerateParams, OutputDecoder, ParamError, PromptInput,
    ResponseMeta, Step, StreamWriter, Usage,
};
use crate::grpc::backend::{self, Method, ServicePaths};
use crate::grpc::generate::{Complete, GenerateEvent, GenerateInput, MatchedStop, Sampling};
use crate::grpc::{connection_for, Backend, Call, CallError, Connection};
use crate::http::core::DataCore;
use crate::http::downstream::{ClientSide, Forwarded};
use crate::ids::WorkerId;
use crate::metrics::Counter;
use crate::net::codec::{self, Connection as ClientConnection, DownstreamFraming};
use crate::net::socket::Cut;
use crate::request::{Endpoint, KeySource, RoutingKey};
use crate::tokenize::{DecodeTable, ModelTokenizer, PromptSource};
use crate::workers::spec::WorkerProtocol;
use crate::workers::table::WorkerEntry;

/// The head of a streamed answer, parsed once into the worker-head form the codec rewrites for
/// the client (framing, `Date`, the gateway's headers).
const EVENT_STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n";

/// The decode table of `tokenizer` (built when it was loaded), or the table that knows no
/// token, without one.
fn decode_table(tokenizer: Option<&Arc<ModelTokenizer>>) -> Arc<DecodeTable> {
    match tokenizer {
        Some(tokenizer) => tokenizer.decode_table().clone(),
        None => {
            static EMPTY: OnceLock<Arc<DecodeTable>> = OnceLock::new();
            let empty = || {
                let model = tokenizers::models::wordlevel::WordLevel::default();
                Arc::new(DecodeTable::of(Arc::new(tokenizers::Tokenizer::new(model))))
            };
            EMPTY.get_or_init(empty).clone()
        }
    }
}

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
    /// A body the front end refused: answered 400 at the head step.
    refused: Option<ParamError>,
    /// The request's output on its way to the client, once forwarded.
    output: Option<Output>,
    /// How the client's body is framed.
    framing: DownstreamFraming,
    /// The call ended (every choice finished, or an error): no `Abort` is owed.
    finished: bool,
    /// The whole answer is written.
    body_done: bool,
    /// Stays empty: every body read is written into the client's buffer.
    relay_unused: Vec<u8>,
}

/// The front end of one request: its decoder, its writer, and the engine's counts.
#[derive(Debug)]
struct Output {
    params: GenerateParams,
    /// The model's decode table (the decoder's, kept here for the writers).
    table: Arc<DecodeTable>,
    decoder: OutputDecoder,
    writer: Writer,
    usage: Usage,
    /// Choices whose IDs came in chunks (their `Complete` repeats none of them).
    streamed: Vec<bool>,
    /// The events or body of one step, before they are framed for the client.
    scratch: Vec<u8>,
}

/// The writer of the client's API: events as they come, or one body at the end.
#[derive(Debug)]
enum Writer {
    Stream(StreamWriter),
    Full(FullWriter),
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
            refused: None,
            output: None,
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
        let input = match self.generate_input(core, request, attempt.worker.id) {
            Ok(input) => input,
            Err(refusal) => {
                // Answered at the head step, with its reason; nothing goes to the engine.
                self.refused = Some(refusal);
                self.finished = true;
                return Ok(());
            }
        };
        let message = input.encode(self.backend);
        let path = self.backend.path(Method::Generate);
        let mut started =
            Call::start(&self.connection, &self.authority, path, message.clone()).await;
        if matches!(started, Err(CallError::Refused(_))) && !self.connection.is_usable() {
            // The worker said GOAWAY on this connection before it took the call: nothing ran,
            // and a drain is no failure; the call goes to a new connection to the same worker.
            let worker = attempt.worker;
            if let Ok(fresh) = connection_for(&core.grpc, worker.id, worker.spec.addr).await {
                self.connection = fresh;
                started = Call::start(&self.connection, &self.authority, path, message).await;
            }
        }
        let call = started.map_err(|e| call_error(core, attempt.worker.id, e, "gRPC Generate"))?;
        self.call = Some(call);
        Ok(())
    }

    /// The front end's reading of the body, the prompt's IDs and the engine-neutral request.
    fn generate_input(
        &mut self,
        core: &DataCore,
        request: &mut Forwarded<'_>,
        worker: WorkerId,
    ) -> Result<GenerateInput, ParamError> {
        let prepared = request.prepared.get();
        let routing = prepared.input();
        let api = match routing.endpoint() {
            Some(Endpoint::Generate) => Api::Generate,
            Some(Endpoint::ChatCompletions) => Api::Chat,
            Some(Endpoint::Completions) => Api::Completion,
            Some(Endpoint::Messages) => Api::Messages,
            _ => return Err(refusal("this endpoint is not served by gRPC workers")),
        };
        let body = &request.read_buf[request.body.clone()];
        let mut params = GenerateParams::parse(api, body)?;
        let model = params
            .model
            .clone()
            .unwrap_or_else(|| routing.model().to_string());
        // Tool calls and reasoning are read from the text (`--tool-call-parser`, ...).
        params.parsing = (core.shared.config.parsers).setup(&model, params.tools.as_ref());
        if params.parsing.needs_special_tokens() {
            params.skip_special_tokens = false;
        }
        let tokenizer = core.shared.config.tokenizers.for_model(&model);
        let routed_ids = match (routing.key_source(), routing.key()) {
            (Some(KeySource::InputIds | KeySource::Tokenized), RoutingKey::Tokens(ids)) => {
                Some(ids)
            }
            _ => None,
        };
        let input_ids = match (&params.input, routed_ids, tokenizer.as_ref()) {
            (PromptInput::Ids(ids), _, _) => ids.clone(),
            (_, Some(ids), _) => ids.to_vec(),
            (PromptInput::Text(text), None, Some(tokenizer)) => tokenizer
                .encode(text, true)
                .map_err(|_| refusal("the prompt could not be tokenized"))?,
            // The router did not tokenize it (a policy that routes on text, a tokenizer pool
            // that was full): rendered and tokenized here.
            (PromptInput::Conversation, None, Some(tokenizer)) => {
                let source = match api {
                    Api::Messages => PromptSource::Messages(body),
                    _ => PromptSource::Chat(body),
                };
                let prompt = tokenizer
                    .prompt(source)
                    .map_err(|_| refusal("the conversation could not be rendered"))?;
                tokenizer
                    .encode(&prompt.text, prompt.add_special_tokens)
                    .map_err(|_| refusal("the prompt could not be tokenized"))?
            }
            // A model that gets its tokenizer from its worker (one listing it, or this one
            // before its models are known): not there yet, or refused, as the log says.
            _ if core.shared.config.tokenizers.wants_fetch(&model) && {
                let catalog = core.shared.catalog.load();
                catalog.owner_of(worker).is_none() || catalog.serving().any(|(m, _)| m == model)
            } =>
            {
                return Err(ParamError {
                    message: format!("the tokenizer of model {model} is not loaded yet: kvgate fetches it from the model's gRPC worker (GetTokenizer; the log says if that failed); retry, or send input_ids"),
                    param: None,
                    unavailable: true,
                })
            }
            _ => return Err(refusal(
                "a gRPC worker takes token IDs: send input_ids, or give the gateway the model's tokenizer (--model-path, --tokenizer-path)",
            )),
        };
        if input_ids.is_empty() {
            return Err(refusal("the prompt is empty"));
        }
        let meta = self.response_meta(&params, &model);
        self.request_id = meta.id.clone();
        let sampling = Sampling::for_request(&params);
        let stream = params.stream;
        let logprobs = params.logprobs.as_ref().map(|asked| asked.top);
        let table = decode_table(tokenizer.as_ref());
        // The model's EOS IDs (the worker's `GetModelInfo`) end a choice like the request's
        // own stop IDs, unless `ignore_eos`.
        let catalog = core.shared.catalog.load();
        let eos = catalog.eos_token_ids(worker);
        let decoder = OutputDecoder::new(table.clone(), &params, eos);
        let writer = match stream {
            true => Writer::Stream(StreamWriter::new(&params, meta, input_ids.len() as u32)),
            false => Writer::Full(FullWriter::new(&params, meta)),
        };
        self.output = Some(Output {
            streamed: vec![false; params.n.max(1) as usize],
            params,
            table,
            decoder,
            writer,
            usage: Usage::default(),
            scratch: Vec::new(),
        });
        Ok(GenerateInput {
            request_id: self.request_id.clone(),
            input_ids,
            sampling,
            stream,
            logprobs,
        })
    }

    /// The response's id (the client's `/generate` `rid` when it gave one), model and time.
    fn response_meta(&self, params: &GenerateParams, model: &str) -> ResponseMeta {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut meta = ResponseMeta::for_api(params.api, model, fastrand::u128(..), created);
        if let Some(rid) = &params.request_id {
            meta.id.clone_from(rid);
        }
        meta
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
        if let Some(refused) = self.refused.take() {
            self.body_done = true;
            let mut body = Vec::new();
            refused.write_body(&mut body);
            let status = refused.status();
            // A model whose tokenizer is still coming is no fault of the worker: its breaker
            // and retries never hear of that 503.
            if !refused.unavailable {
                context.admit_status(core, status);
            }
            write_answer(client, context, status, &body, connection)?;
            return Ok(relaying(status, BodyKind::Other, connection));
        }
        let stream = self.output.as_ref().is_some_and(|o| o.params.stream);
        loop {
            let event = match self.next(core, client, deadline).await {
                Next::Event(event) => event,
                Next::End => {
                    let error = CallError::Malformed("the call ended before its answer".into());
                    return Err(self.failed(core, context.worker, error));
                }
                Next::Failed(CallError::Status(status)) => {
                    self.finished = true;
                    let http = status.code.http_status();
                    if !context.admit_status(core, http) {
                        return Ok(HeadRead::RetryableStatus(http));
                    }
                    self.body_done = true;
                    let kind = if http >= 500 {
                        "upstream_error"
                    } else {
                        "invalid_request_error"
                    };
                    let body = crate::error::error_body(http, kind, &status.message).to_string();
                    write_answer(client, context, http, body.as_bytes(), connection)?;
                    return Ok(relaying(http, BodyKind::Other, connection));
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
            if stream {
                client.write_buf.clear();
                write_head(client, context, EVENT_STREAM_HEAD, connection)?;
                if let Some(Output {
                    writer: Writer::Stream(writer),
                    scratch,
                    ..
                }) = &mut self.output
                {
                    writer.start(scratch);
                }
                self.take(core, event);
                self.frame_scratch(client.write_buf);
                self.end_call_when_done(deadline).await;
                return Ok(relaying(200, BodyKind::EventStream, connection));
            }
            self.take(core, event);
            if self.finished {
                self.end_call_when_done(deadline).await;
                let body = self.output.as_mut().map(|o| std::mem::take(&mut o.scratch));
                client.write_buf.clear();
                write_answer(client, context, 200, &body.unwrap_or_default(), connection)?;
                return Ok(relaying(200, BodyKind::Other, connection));
            }
        }
    }

    /// Step 4: the next message's events, framed for the client in its write buffer.
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
        self.take(core, event);
        core.spare_buffers
            .borrow_mut()
            .borrow_into(client.write_buf);
        client.write_buf.clear();
        self.frame_scratch(client.write_buf);
        self.end_call_when_done(deadline).await;
        Ok(Some(BodySource::Client))
    }

    /// Folds one message into the output: its tokens through the decoder into the writer's
    /// bytes (in `scratch`); once every choice ended, the writer's end (usage, `[DONE]`, or
    /// the whole body) and `finished`.
    fn take(&mut self, core: &DataCore, event: GenerateEvent) {
        let Some(output) = self.output.as_mut() else {
            return;
        };
        match event {
            GenerateEvent::Chunk(chunk) => {
                if let Some(seen) = output.streamed.get_mut(chunk.index as usize) {
                    *seen |= !chunk.token_ids.is_empty();
                }
                output.usage.prompt_tokens = chunk.prompt_tokens;
                output.usage.cached_tokens = chunk.cached_tokens;
                let decoded = output.decoder.push(chunk.index, &chunk.token_ids);
                let used = decoded.ids_used.min(chunk.token_ids.len());
                let step = Step {
                    index: chunk.index,
                    token_ids: &chunk.token_ids[..used],
                    text: decoded.text,
                    logprobs: &chunk.logprobs[..used.min(chunk.logprobs.len())],
                    finish: decoded.finish,
                };
                output
                    .writer
                    .step(&step, &output.table, &mut output.scratch);
            }
            GenerateEvent::Complete(complete) => output.complete(&complete),
            GenerateEvent::Empty => {}
        }
        if output.decoder.all_finished() {
            output.end();
            let failures = match &output.writer {
                Writer::Stream(writer) => writer.parse_failures(),
                Writer::Full(writer) => writer.parse_failures(),
            };
            if failures > 0 {
                core.metrics()
                    .add(Counter::ToolParseFailures, u64::from(failures));
            }
            self.finished = true;
        }
    }

    /// Moves the writer's bytes into `out`, framed as one chunk (and the last chunk at the end).
    fn frame_scratch(&mut self, out: &mut Vec<u8>) {
        let Some(output) = self.output.as_mut() else {
            return;
        };
        let chunked = self.framing == DownstreamFraming::ChunkedPassthrough;
        if !output.scratch.is_empty() {
            if chunked {
                write_chunk_size(out, output.scratch.len());
            }
            out.extend_from_slice(&output.scratch);
            if chunked {
                out.extend_from_slice(b"\r\n");
            }
            output.scratch.clear();
        }
        if self.finished && chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
    }

    /// Once every choice ended: the body is done; the call's status is read (it follows the
    /// last message at once) so the stream ends whole, unless the gateway ended it first (a
    /// stop string), when dropping the call resets it.
    async fn end_call_when_done(&mut self, deadline: Instant) {
        if !self.finished {
            return;
        }
        self.body_done = true;
        let Some(call) = self.call.as_mut() else {
            return;
        };
        if !call.is_done() {
            let end =
                monoio::time::timeout_at(monoio::time::Instant::from_std(deadline), call.message());
            // A message after the end (the engine still streaming a choice the gateway
            // stopped) leaves the call unfinished: it is reset and aborted when dropped.
            if !matches!(end.await, Ok(Ok(None))) {
                self.finished = false;
                return;
            }
        }
        self.call = None;
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

    /// A failure before the answer began.
    fn failed(&mut self, core: &DataCore, worker: WorkerId, error: CallError) -> ProxyError {
        self.finished = true;
        call_error(core, worker, error, "gRPC Generate")
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

impl Output {
    /// The engine ended one choice: its remaining IDs (an unstreamed answer carries them all
    /// here), then its finish, through the decoder to the writer.
    fn complete(&mut self, complete: &Complete) {
        let index = complete.index;
        let streamed = self.streamed.get(index as usize).copied().unwrap_or(false);
        if !streamed && !complete.output_ids.is_empty() {
            let decoded = self.decoder.push(index, &complete.output_ids);
            let used = decoded.ids_used.min(complete.output_ids.len());
            let step = Step {
                index,
                token_ids: &complete.output_ids[..used],
                text: decoded.text,
                logprobs: &complete.logprobs[..used.min(complete.logprobs.len())],
                finish: decoded.finish,
            };
            self.writer.step(&step, &self.table, &mut self.scratch);
        }
        self.usage.prompt_tokens = complete.prompt_tokens;
        self.usage.cached_tokens = complete.cached_tokens;
        self.usage.completion_tokens += complete.completion_tokens;
        let reason = match complete.finish_reason.as_str() {
            "length" => FinishReason::Length,
            "abort" => FinishReason::Abort,
            _ => FinishReason::Stop,
        };
        let matched = match &complete.matched_stop {
            Some(MatchedStop::TokenId(id)) => Some(crate::tokenize::MatchedStop::Token(*id)),
            Some(MatchedStop::Text(text)) => self
                .params
                .stop
                .iter()
                .position(|stop| stop == text)
                .map(crate::tokenize::MatchedStop::Text),
            None => None,
        };
        let decoded = self.decoder.finish(index, reason, matched);
        let finish: Option<Finish> = decoded.finish.cloned();
        let text = decoded.text.to_string();
        let step = Step {
            index,
            token_ids: &[],
            text: &text,
            logprobs: &[],
            finish: finish.as_ref(),
        };
        self.writer.step(&step, &self.table, &mut self.scratch);
    }

    /// Every choice ended: the writer's closing bytes.
    fn end(&mut self) {
        if self.usage.completion_tokens == 0 {
            self.usage.completion_tokens = self.decoder.completion_tokens();
        }
        match &mut self.writer {
            Writer::Stream(writer) => writer.end(&self.usage, &mut self.scratch),
            Writer::Full(writer) => writer.write(&self.usage, &self.table, &mut self.scratch),
        }
    }
}

impl Writer {
    fn step(&mut self, step: &Step<'_>, table: &DecodeTable, out: &mut Vec<u8>) {
        match self {
            Writer::Stream(writer) => writer.step(step, table, out),
            Writer::Full(writer) => writer.step(step),
        }
    }
}

/// A chunk's size line (`{hex}\r\n`), without formatting machinery: once per streamed message.
fn write_chunk_size(out: &mut Vec<u8>, size: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = size;
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
}

/// A refusal of the gateway's own (not a field's).
fn refusal(message: &str) -> ParamError {
    ParamError {
        message: message.to_string(),
        param: None,
        unavailable: false,
    }
}

/// The head step's result for an answer whose head is written.
fn relaying(status: u16, body_kind: BodyKind, connection: ClientConnection) -> HeadRead {
    HeadRead::Relaying(ResponseStart {
        status,
        body_kind,
        connection,
        body_begun: true,
    })
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

/// A whole JSON answer of `status` with `body`.
fn write_answer(
    client: &mut ClientSide<'_>,
    context: HeadContext<'_>,
    status: u16,
    body: &[u8],
    connection: ClientConnection,
) -> Result<(), ProxyError> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        codec::reason_phrase(status),
        body.len()
    );
    client.write_buf.clear();
    write_head(client, context, head.as_bytes(), connection)?;
    client.write_buf.extend_from_slice(body);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_lowercase_hex_lines() {
        for size in [0usize, 1, 9, 10, 15, 16, 255, 4096, 0x1234_abcd] {
            let mut out = Vec::new();
            write_chunk_size(&mut out, size);
            assert_eq!(out, format!("{size:x}\r\n").into_bytes());
        }
    }

    #[test]
    fn silent_sampling_fields_get_the_engines_defaults() {
        let params = crate::frontend::parse_generate(br#"{"input_ids":[1,2]}"#).unwrap();
        let sampling = Sampling::for_request(&params);
        assert_eq!(
            (sampling.temperature, sampling.top_p, sampling.top_k),
            (1.0, 1.0, -1)
        );
        assert_eq!(sampling.repetition_penalty, 1.0);
        assert_eq!(sampling.n, 1);
        let body = br#"{"input_ids":[1],"sampling_params":{"temperature":0,"top_k":5,"stop":["x"],"max_new_tokens":3}}"#;
        let params = crate::frontend::parse_generate(body).unwrap();
        let sampling = Sampling::for_request(&params);
        assert_eq!((sampling.temperature, sampling.top_k), (0.0, 5));
        assert_eq!(sampling.stop, ["x"]);
        assert_eq!(sampling.max_new_tokens, Some(3));
    }
}
