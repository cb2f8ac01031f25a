//! Request bodies into [`GenerateParams`]: OpenAI chat completions and completions, Anthropic
//! Messages and SGLang's `/generate`, each read once with serde into its own raw shape, then
//! checked and mapped into the one neutral form a transport turns into an engine request.
//!
//! A field the client left out stays `None`: proto3 zeros are not the engines' defaults
//! (`temperature` 0 is greedy, `top_p` 0 is refused), so the transport either leaves the field
//! unset or asks [`Sampling::resolved`] for SGLang's/vLLM's semantic default. An invalid value is
//! a [`ParamError`]: a 400 with the project's JSON error body, naming the field.

use serde::Deserialize;
use serde_json::Value;

use super::parsers::{ParseSetup, ToolRequest};
use crate::error::error_body;
use crate::limits::{GENERATE_N_MAX, STOP_STRINGS_MAX, STOP_STRING_BYTES_MAX, TOP_LOGPROBS_MAX};

/// The API a request came in on: which body was parsed and which response shape is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /generate` (SGLang's native API).
    Generate,
}

/// A body the gateway refuses: 400, with the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParamError {
    /// What is wrong, for the client (names the field).
    pub message: String,
    /// The field at fault, when one is (`error.param` of OpenAI's body).
    pub param: Option<&'static str>,
    /// Not the body's fault: the gateway cannot serve it yet (503; a model whose tokenizer is
    /// still being fetched from its worker), else 400.
    pub unavailable: bool,
}

impl ParamError {
    pub(super) fn field(param: &'static str, message: impl Into<String>) -> ParamError {
        ParamError {
            message: message.into(),
            param: Some(param),
            unavailable: false,
        }
    }

    fn body(message: impl Into<String>) -> ParamError {
        ParamError {
            message: message.into(),
            param: None,
            unavailable: false,
        }
    }

    /// The HTTP status: 400, or 503 when `unavailable`.
    pub fn status(&self) -> u16 {
        if self.unavailable {
            503
        } else {
            400
        }
    }

    /// Appends the project's JSON error body (`error::error_body`) to `out`.
    pub fn write_body(&self, out: &mut Vec<u8>) {
        let error_type = if self.unavailable {
            "service_unavailable"
        } else {
            "invalid_request_error"
        };
        let mut body = error_body(self.status(), error_type, &self.message);
        if let (Some(param), Some(error)) = (self.param, body.get_mut("error")) {
            error["param"] = Value::from(param);
        }
        // Writing JSON into a Vec cannot fail.
        let _ = serde_json::to_writer(out, &body);
    }
}

/// What the engine is asked to continue: text (rendered and tokenized by the gateway) or IDs.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// A chat or messages body: the template renders it (`tokenize::ModelTokenizer::prompt`).
    Conversation,
    /// Text, tokenized as a completions prompt (with the post-processor's tokens).
    Text(String),
    /// Token IDs given by the client.
    Ids(Vec<u32>),
}

/// The sampling fields, each `None` where the client was silent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    /// `temperature` (≥ 0; 0 is greedy).
    pub temperature: Option<f32>,
    /// `top_p`, in (0, 1].
    pub top_p: Option<f32>,
    /// `top_k`: -1 (all) or ≥ 1.
    pub top_k: Option<i32>,
    /// `min_p`, in [0, 1].
    pub min_p: Option<f32>,
    /// `frequency_penalty`, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// `presence_penalty`, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// `repetition_penalty`, in (0, 2].
    pub repetition_penalty: Option<f32>,
    /// The most new tokens (`max_completion_tokens`, `max_tokens`, `max_new_tokens`); `None`:
    /// up to the context length (OpenAI APIs) or [`GENERATE_MAX_NEW_TOKENS_DEFAULT`]
    /// (`/generate`, filled in by the parser).
    pub max_tokens: Option<u32>,
    /// The fewest new tokens before EOS or a stop may end the output.
    pub min_tokens: Option<u32>,
    /// `seed`.
    pub seed: Option<u64>,
}

/// SGLang's `max_new_tokens` default of `/generate`.
pub const GENERATE_MAX_NEW_TOKENS_DEFAULT: u32 = 128;

/// [`Sampling`] with the engines' semantic defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedSampling {
    /// Default 1.0.
    pub temperature: f32,
    /// Default 1.0.
    pub top_p: f32,
    /// Default -1 (every token).
    pub top_k: i32,
    /// Default 0.0.
    pub min_p: f32,
    /// Default 0.0.
    pub frequency_penalty: f32,
    /// Default 0.0.
    pub presence_penalty: f32,
    /// Default 1.0 (none).
    pub repetition_penalty: f32,
    /// Default `None` (the context length).
    pub max_tokens: Option<u32>,
    /// Default 0.
    pub min_tokens: u32,
    /// Default `None` (the engine's random state).
    pub seed: Option<u64>,
}

impl Sampling {
    /// The values with SGLang's and vLLM's defaults where the client was silent.
    pub fn resolved(&self) -> ResolvedSampling {
        ResolvedSampling {
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(-1),
            min_p: self.min_p.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            max_tokens: self.max_tokens,
            min_tokens: self.min_tokens.unwrap_or(0),
            seed: self.seed,
        }
    }
}

/// A constraint on the output's shape (`response_format`, SGLang's `json_schema`/`regex`/`ebnf`).
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// A JSON schema, serialized (`response_format: json_schema`, `/generate`'s `json_schema`).
    JsonSchema(String),
    /// Any JSON object (`response_format: json_object`): the engines' schema `{"type":"object"}`.
    JsonObject,
    /// A regular expression.
    Regex(String),
    /// An EBNF grammar.
    Ebnf(String),
}

/// Which logprobs the client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogprobRequest {
    /// How many alternatives per position besides the sampled token (0 ..= `TOP_LOGPROBS_MAX`).
    pub top: u32,
}

/// A request's generation parameters, neutral of the API it came in on.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    /// The API (and so the response shape).
    pub api: Api,
    /// `model`, when given.
    pub model: Option<String>,
    /// What the engine continues.
    pub input: PromptInput,
    /// The sampling fields.
    pub sampling: Sampling,
    /// Stop strings (none empty, at most `STOP_STRINGS_MAX`).
    pub stop: Vec<String>,
    /// Token IDs that end the output like EOS.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Leave special tokens out of the text (default true).
    pub skip_special_tokens: bool,
    /// Keep a matched stop string in the text (SGLang's `no_stop_trim`, vLLM's
    /// `include_stop_str_in_output`; default false).
    pub keep_stop: bool,
    /// Choices per request (`n`, default 1, at most `GENERATE_N_MAX`).
    pub n: u32,
    /// Logprobs of the output tokens, when asked.
    pub logprobs: Option<LogprobRequest>,
    /// The output's shape constraint, when asked.
    pub constraint: Option<Constraint>,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a final chunk with `usage`.
    pub include_usage: bool,
    /// The client's request id (`/generate`'s `rid`), when given.
    pub request_id: Option<String>,
    /// `tools` and `tool_choice` (chat and messages), when tools were given.
    pub tools: Option<ToolRequest>,
    /// What the output is parsed for (tool calls, reasoning): none until the transport sets it
    /// from `--tool-call-parser`/`--reasoning-parser` and the model (`ParserFlags::setup`).
    pub parsing: ParseSetup,
}

impl GenerateParams {
    fn new(api: Api, input: PromptInput) -> GenerateParams {
        GenerateParams {
            api,
            model: None,
            input,
            sampling: Sampling::default(),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            keep_stop: false,
            n: 1,
            logprobs: None,
            constraint: None,
            stream: false,
            include_usage: false,
            request_id: None,
            tools: None,
            parsing: ParseSetup::default(),
        }
    }

    /// Parses the body of `api`'s endpoint.
    pub fn parse(api: Api, body: &[u8]) -> Result<GenerateParams, ParamError> {
        match api {
            Api::Chat => parse_chat(body),
            Api::Completion => parse_completion(body),
            Api::Messages => parse_messages(body),
            Api::Generate => parse_generate(body),
        }
    }
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A completions `prompt`, or `/generate`'s `text`/`input_ids`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawPrompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    Batches(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct RawStreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct RawResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<RawJsonSchema>,
    /// Some servers (SGLang) accept the schema at the top level too.
    schema: Option<Value>,
    /// vLLM/SGLang extensions.
    regex: Option<String>,
    ebnf: Option<String>,
}

#[derive(Deserialize)]
struct RawJsonSchema {
    schema: Option<Value>,
}

/// The fields the OpenAI bodies share (chat and completions), with the engines' extensions.
#[derive(Deserialize, Default)]
struct RawOpenAi {
    model: Option<String>,
    prompt: Option<RawPrompt>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    min_tokens: Option<u32>,
    stop: Option<OneOrMany>,
    stop_token_ids: Option<Vec<u32>>,
    n: Option<u32>,
    seed: Option<u64>,
    /// SGLang's name for `seed`.
    sampling_seed: Option<u64>,
    /// Chat: a boolean; completions: a count of alternatives.
    logprobs: Option<Value>,
    top_logprobs: Option<u32>,
    ignore_eos: Option<bool>,
    skip_special_tokens: Option<bool>,
    no_stop_trim: Option<bool>,
    include_stop_str_in_output: Option<bool>,
    response_format: Option<RawResponseFormat>,
    regex: Option<String>,
    ebnf: Option<String>,
    stream: Option<bool>,
    stream_options: Option<RawStreamOptions>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
}

fn from_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ParamError> {
    serde_json::from_slice(body).map_err(|e| ParamError::body(format!("invalid body: {e}")))
}

/// Parses an OpenAI `/v1/chat/completions` body (`messages` itself is the template's to read).
pub fn parse_chat(body: &[u8]) -> Result<GenerateParams, ParamError> {
    let raw: RawOpenAi = from_json(body)?;
    let mut params = GenerateParams::new(Api::Chat, PromptInput::Conversation);
    let logprobs = match &raw.logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ParamError::field("logprobs", "logprobs must be a boolean")),
    };
    params.logprobs = match (logprobs, raw.top_logprobs) {
        (true, top) => Some(LogprobRequest {
            top: check_top_logprobs("top_logprobs", top.unwrap_or(0))?,
        }),
        (false, Some(_)) => {
            return Err(ParamError::field(
                "top_logprobs",
                "top_logprobs is only allowed when logprobs is true",
            ))
        }
        (false, _) => None,
    };
    params.tools = ToolRequest::from_openai(raw.tools.as_ref(), raw.tool_choice.as_ref())?;
    fill_openai(&mut params, raw)?;
    if let Some(constraint) = params.tools.as_ref().and_then(ToolRequest::constraint) {
        set_constraint(&mut params, constraint)?;
    }
    Ok(params)
}

/// Parses an OpenAI `/v1/completions` body: one prompt, text or IDs.
pub fn parse_completion(body: &[u8]) -> Result<GenerateParams, ParamError> {
    let mut raw: RawOpenAi = from_json(body)?;
    let input = match raw.prompt.take() {
        Some(prompt) => one_prompt("prompt", prompt)?,
        None => return Err(ParamError::field("prompt", "prompt is required")),
    };
    let mut params = GenerateParams::new(Api::Completion, input);
    params.logprobs = match &raw.logprobs {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64().and_then(|v| u32::try_from(v).ok()) {
            Some(top) => Some(LogprobRequest {
                top: check_top_logprobs("logprobs", top)?,
            }),
            None => {
                return Err(ParamError::field(
                    "logprobs",
                    "logprobs must be a non-negative integer",
                ))
            }
        },
    };
    fill_openai(&mut params, raw)?;
    Ok(params)
}

/// One prompt of a completions or `/generate` body; batches are refused (one stream per request).
fn one_prompt(field: &'static str, prompt: RawPrompt) -> Result<PromptInput, ParamError> {
    match prompt {
        RawPrompt::Text(text) => Ok(PromptInput::Text(text)),
        RawPrompt::Ids(ids) if !ids.is_empty() => Ok(PromptInput::Ids(ids)),
        RawPrompt::Texts(mut texts) if texts.len() == 1 => {
            Ok(PromptInput::Text(texts.pop().unwrap_or_default()))
        }
        RawPrompt::Batches(mut batches) if batches.len() == 1 && !batches[0].is_empty() => {
            Ok(PromptInput::Ids(batches.pop().unwrap_or_default()))
        }
        RawPrompt::Ids(_) => Err(ParamError::field(field, format!("{field} is empty"))),
        RawPrompt::Texts(_) | RawPrompt::Batches(_) => Err(ParamError::field(
            field,
            format!("{field}: batches of prompts are not supported; send one prompt per request"),
        )),
    }
}

fn fill_openai(params: &mut GenerateParams, raw: RawOpenAi) -> Result<(), ParamError> {
    params.model = raw.model;
    params.sampling = Sampling {
        temperature: raw.temperature,
        top_p: raw.top_p,
        top_k: raw.top_k,
        min_p: raw.min_p,
        frequency_penalty: raw.frequency_penalty,
        presence_penalty: raw.presence_penalty,
        repetition_penalty: raw.repetition_penalty,
        // OpenAI's newer name wins over the deprecated one, as in vLLM and SGLang.
        max_tokens: raw.max_completion_tokens.or(raw.max_tokens),
        min_tokens: raw.min_tokens,
        seed: raw.seed.or(raw.sampling_seed),
    };
    params.stop = stop_list(raw.stop)?;
    params.stop_token_ids = raw.stop_token_ids.unwrap_or_default();
    params.ignore_eos = raw.ignore_eos.unwrap_or(false);
    params.skip_special_tokens = raw.skip_special_tokens.unwrap_or(true);
    params.keep_stop = raw.no_stop_trim.or(raw.include_stop_str_in_output) == Some(true);
    params.n = raw.n.unwrap_or(1);
    params.stream = raw.stream.unwrap_or(false);
    params.include_usage = match raw.stream_options {
        Some(_) if !params.stream => {
            return Err(ParamError::field(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        Some(options) => options.include_usage.unwrap_or(false),
        None => false,
    };
    params.constraint = match raw.response_format {
        Some(format) => response_constraint(format)?,
        None => None,
    };
    if let Some(regex) = raw.regex {
        set_constraint(params, Constraint::Regex(regex))?;
    }
    if let Some(ebnf) = raw.ebnf {
        set_constraint(params, Constraint::Ebnf(ebnf))?;
    }
    check(params)
}

fn set_constraint(params: &mut GenerateParams, constraint: Constraint) -> Result<(), ParamError> {
    if params.constraint.is_some() {
        return Err(ParamError::body(
            "only one of response_format, json_schema, regex and ebnf may be given",
        ));
    }
    params.constraint = Some(constraint);
    Ok(())
}

fn response_constraint(format: RawResponseFormat) -> Result<Option<Constraint>, ParamError> {
    let field = "response_format";
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(Constraint::JsonObject)),
        "json_schema" => {
            let schema = format
                .json_schema
                .and_then(|s| s.schema)
                .or(format.schema)
                .ok_or_else(|| ParamError::field(field, "response_format.json_schema.schema is required"))?;
            Ok(Some(Constraint::JsonSchema(schema.to_string())))
        }
        "regex" => format
            .regex
            .map(|r| Some(Constraint::Regex(r)))
            .ok_or_else(|| ParamError::field(field, "response_format.regex is required")),
        "ebnf" | "grammar" => format
            .ebnf
            .map(|g| Some(Constraint::Ebnf(g)))
            .ok_or_else(|| ParamError::field(field, "response_format.ebnf is required")),
        other => Err(ParamError::field(
            field,
            format!("response_format.type {other:?} is not one of text, json_object, json_schema, regex, ebnf"),
        )),
    }
}

fn stop_list(stop: Option<OneOrMany>) -> Result<Vec<String>, ParamError> {
    let stops = match stop {
        None => Vec::new(),
        Some(OneOrMany::One(stop)) => vec![stop],
        Some(OneOrMany::Many(stops)) => stops,
    };
    if stops.len() > STOP_STRINGS_MAX {
        return Err(ParamError::field(
            "stop",
            format!("at most {STOP_STRINGS_MAX} stop strings"),
        ));
    }
    for stop in &stops {
        if stop.is_empty() {
            return Err(ParamError::field("stop", "a stop string is empty"));
        }
        if stop.len() > STOP_STRING_BYTES_MAX {
            return Err(ParamError::field(
                "stop",
                format!("a stop string exceeds {STOP_STRING_BYTES_MAX} bytes"),
            ));
        }
    }
    Ok(stops)
}

fn check_top_logprobs(field: &'static str, top: u32) -> Result<u32, ParamError> {
    if top > TOP_LOGPROBS_MAX {
        return Err(ParamError::field(
            field,
            format!("{field} must be at most {TOP_LOGPROBS_MAX}"),
        ));
    }
    Ok(top)
}

fn check_range(
    field: &'static str,
    value: Option<f32>,
    ok: impl Fn(f32) -> bool,
    rule: &str,
) -> Result<(), ParamError> {
    match value {
        Some(v) if !v.is_finite() || !ok(v) => Err(ParamError::field(
            field,
            format!("{field} must be {rule}, got {v}"),
        )),
        _ => Ok(()),
    }
}

/// The value checks every API shares (SGLang's `SamplingParams.verify` and vLLM's rules).
fn check(params: &GenerateParams) -> Result<(), ParamError> {
    let s = &params.sampling;
    check_range("temperature", s.temperature, |v| v >= 0.0, "at least 0")?;
    check_range("top_p", s.top_p, |v| v > 0.0 && v <= 1.0, "in (0, 1]")?;
    check_range("min_p", s.min_p, |v| (0.0..=1.0).contains(&v), "in [0, 1]")?;
    let penalty = |v: f32| (-2.0..=2.0).contains(&v);
    check_range(
        "frequency_penalty",
        s.frequency_penalty,
        penalty,
        "in [-2, 2]",
    )?;
    check_range(
        "presence_penalty",
        s.presence_penalty,
        penalty,
        "in [-2, 2]",
    )?;
    let repetition = |v: f32| v > 0.0 && v <= 2.0;
    check_range(
        "repetition_penalty",
        s.repetition_penalty,
        repetition,
        "in (0, 2]",
    )?;
    if let Some(k) = s.top_k {
        if k == 0 || k < -1 {
            return Err(ParamError::field(
                "top_k",
                format!("top_k must be -1 (every token) or at least 1, got {k}"),
            ));
        }
    }
    if let (Some(min), Some(max)) = (s.min_tokens, s.max_tokens) {
        if min > max {
            return Err(ParamError::field(
                "min_tokens",
                format!("min_tokens ({min}) must not exceed max_tokens ({max})"),
            ));
        }
    }
    if params.api != Api::Generate && s.max_tokens == Some(0) {
        return Err(ParamError::field(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    if params.n == 0 || params.n > GENERATE_N_MAX {
        return Err(ParamError::field(
            "n",
            format!("n must be in 1 ..= {GENERATE_N_MAX}, got {}", params.n),
        ));
    }
    Ok(())
}

/// An Anthropic `/v1/messages` body's generation fields.
#[derive(Deserialize)]
struct RawMessages {
    model: Option<String>,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    stop_sequences: Option<Vec<String>>,
    stream: Option<bool>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
}

/// Parses an Anthropic `/v1/messages` body (`messages` and `system` are the template's).
pub fn parse_messages(body: &[u8]) -> Result<GenerateParams, ParamError> {
    let raw: RawMessages = from_json(body)?;
    let mut params = GenerateParams::new(Api::Messages, PromptInput::Conversation);
    params.model = raw.model;
    let max_tokens = raw
        .max_tokens
        .ok_or_else(|| ParamError::field("max_tokens", "max_tokens is required"))?;
    // Anthropic's temperature range is [0, 1].
    check_range("temperature", raw.temperature, |v| v <= 1.0, "in [0, 1]")?;
    params.sampling = Sampling {
        temperature: raw.temperature,
        top_p: raw.top_p,
        top_k: raw.top_k,
        max_tokens: Some(max_tokens),
        ..Sampling::default()
    };
    params.stop = stop_list(raw.stop_sequences.map(OneOrMany::Many))?;
    params.stream = raw.stream.unwrap_or(false);
    params.tools = ToolRequest::from_anthropic(raw.tools.as_ref(), raw.tool_choice.as_ref())?;
    params.constraint = params.tools.as_ref().and_then(ToolRequest::constraint);
    check(&params)?;
    Ok(params)
}

/// SGLang's `sampling_params` of `/generate`.
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawSamplingParams {
    max_new_tokens: Option<u32>,
    min_new_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop: Option<OneOrMany>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    skip_special_tokens: Option<bool>,
    no_stop_trim: Option<bool>,
    n: Option<u32>,
    json_schema: Option<String>,
    regex: Option<String>,
    ebnf: Option<String>,
    sampling_seed: Option<u64>,
}

/// A `/generate` body.
#[derive(Deserialize)]
struct RawGenerate {
    text: Option<RawPrompt>,
    input_ids: Option<RawPrompt>,
    model: Option<String>,
    sampling_params: Option<RawSamplingParams>,
    stream: Option<bool>,
    return_logprob: Option<bool>,
    top_logprobs_num: Option<u32>,
    rid: Option<String>,
}

/// Parses SGLang's `/generate` body: `text` or `input_ids`, `sampling_params`, `stream`,
/// `return_logprob`/`top_logprobs_num`, `rid`.
pub fn parse_generate(body: &[u8]) -> Result<GenerateParams, ParamError> {
    let raw: RawGenerate = from_json(body)?;
    let input = match (raw.text, raw.input_ids) {
        (Some(text), None) => one_prompt("text", text)?,
        (None, Some(ids)) => match one_prompt("input_ids", ids)? {
            PromptInput::Text(_) => {
                return Err(ParamError::field(
                    "input_ids",
                    "input_ids must be token IDs",
                ))
            }
            ids => ids,
        },
        (Some(_), Some(_)) => {
            return Err(ParamError::body("give either text or input_ids, not both"))
        }
        (None, None) => return Err(ParamError::body("text or input_ids is required")),
    };
    let mut params = GenerateParams::new(Api::Generate, input);
    params.model = raw.model;
    let sp = raw.sampling_params.unwrap_or_default();
    params.sampling = Sampling {
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        min_p: sp.min_p,
        frequency_penalty: sp.frequency_penalty,
        presence_penalty: sp.presence_penalty,
        repetition_penalty: sp.repetition_penalty,
        max_tokens: Some(sp.max_new_tokens.unwrap_or(GENERATE_MAX_NEW_TOKENS_DEFAULT)),
        min_tokens: sp.min_new_tokens,
        seed: sp.sampling_seed,
    };
    params.stop = stop_list(sp.stop)?;
    params.stop_token_ids = sp.stop_token_ids.unwrap_or_default();
    params.ignore_eos = sp.ignore_eos.unwrap_or(false);
    params.skip_special_tokens = sp.skip_special_tokens.unwrap_or(true);
    params.keep_stop = sp.no_stop_trim.unwrap_or(false);
    params.n = sp.n.unwrap_or(1);
    params.stream = raw.stream.unwrap_or(false);
    params.request_id = raw.rid;
    if raw.return_logprob == Some(true) {
        params.logprobs = Some(LogprobRequest {
            top: check_top_logprobs("top_logprobs_num", raw.top_logprobs_num.unwrap_or(0))?,
        });
    }
    for constraint in [
        sp.json_schema.map(Constraint::JsonSchema),
        sp.regex.map(Constraint::Regex),
        sp.ebnf.map(Constraint::Ebnf),
    ]
    .into_iter()
    .flatten()
    {
        set_constraint(&mut params, constraint)?;
    }
    check(&params)?;
    Ok(params)
}

#[cfg(test)]
mod tests;
