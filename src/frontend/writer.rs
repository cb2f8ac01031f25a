//! The response writers: [`StreamWriter`] frames each [`Step`] as server-sent events as it
//! comes, [`FullWriter`] gathers the steps and writes one JSON body at the end; each in the
//! shape of the API the request came in on.

use super::anthropic;
use super::generate::{self, GenerateChoice};
use super::json::push_str;
use super::openai::{self, Frame, ModelField};
use super::output::{Finish, FinishReason, ResponseMeta, Step, TokenLogprob, Usage};
use super::params::{Api, GenerateParams};
use super::parsers::write::ParsedChoice;
use crate::tokenize::DecodeTable;

/// What a writer keeps of one choice.
#[derive(Debug, Default)]
struct ChoiceRecord {
    /// Whether its opening chunk was written (chat's role chunk).
    opened: bool,
    /// The text so far (non-stream and `/generate`; completions' logprob offsets).
    text: String,
    /// The IDs so far (`/generate`).
    ids: Vec<u32>,
    /// The logprobs so far (non-stream and `/generate`, when asked).
    logprobs: Vec<TokenLogprob>,
    finish: Option<Finish>,
    /// Its parser, when its tool calls or reasoning are parsed (chat and messages).
    parsed: Option<Box<ParsedChoice>>,
}

impl ChoiceRecord {
    fn new(params: &GenerateParams) -> ChoiceRecord {
        let parsed = match params.api {
            Api::Chat | Api::Messages => ParsedChoice::new(&params.parsing),
            Api::Completion | Api::Generate => None,
        };
        ChoiceRecord {
            parsed,
            ..ChoiceRecord::default()
        }
    }

    /// The finish a client sees: a stop after parsed tool calls is `tool_calls`.
    fn shown(&self, finish: &Finish) -> Finish {
        match &self.parsed {
            Some(parsed) if finish.reason == FinishReason::Stop && parsed.tool_calls() > 0 => {
                Finish {
                    reason: FinishReason::ToolCalls,
                    matched: finish.matched.clone(),
                }
            }
            _ => finish.clone(),
        }
    }
}

/// Markup the choices' parsers gave back as content, or calls cut short.
fn parse_failures(choices: &[ChoiceRecord]) -> u32 {
    choices
        .iter()
        .filter_map(|c| c.parsed.as_ref())
        .map(|p| p.failures())
        .sum()
}

/// Frames a request's steps as server-sent events.
#[derive(Debug)]
pub struct StreamWriter {
    api: Api,
    meta: ResponseMeta,
    /// OpenAI: the fields around every chunk's choices, rendered once (unused by the others).
    frame: Frame,
    stops: Vec<String>,
    include_usage: bool,
    logprobs: bool,
    prompt_tokens: u32,
    choices: Vec<ChoiceRecord>,
    /// Seconds since the request arrived (`/generate`'s `e2e_latency`), as last set.
    elapsed_s: f64,
}

impl StreamWriter {
    /// A writer for `params`' API and choices; `prompt_tokens` is the prompt's length, known
    /// before the engine answers (Anthropic's `message_start`, `/generate`'s `meta_info`).
    pub fn new(params: &GenerateParams, meta: ResponseMeta, prompt_tokens: u32) -> StreamWriter {
        let frame = match params.api {
            Api::Completion => Frame::new(&meta, "text_completion", ModelField::Last),
            _ => Frame::new(&meta, "chat.completion.chunk", ModelField::First),
        };
        StreamWriter {
            api: params.api,
            meta,
            frame,
            stops: params.stop.clone(),
            include_usage: params.include_usage,
            logprobs: params.logprobs.is_some(),
            prompt_tokens,
            choices: (0..params.n.max(1))
                .map(|_| ChoiceRecord::new(params))
                .collect(),
            elapsed_s: 0.0,
        }
    }

    /// Sets the seconds since the request arrived, reported by `/generate`'s next events
    /// (`meta_info.e2e_latency`; 0 until set). The other APIs do not report it.
    pub fn set_elapsed(&mut self, seconds: f64) {
        self.elapsed_s = seconds;
    }

    /// The events before any token: Anthropic's `message_start` and `content_block_start`;
    /// nothing for the other APIs.
    pub fn start(&mut self, out: &mut Vec<u8>) {
        if self.api == Api::Messages {
            match self.choices.first().is_some_and(|c| c.parsed.is_some()) {
                true => anthropic::message_start(out, &self.meta, self.prompt_tokens),
                false => anthropic::start(out, &self.meta, self.prompt_tokens),
            }
        }
    }

    /// Frames one step: its text (if any), then its finish (if set). A step for an index past
    /// `n` is ignored.
    pub fn step(&mut self, step: &Step<'_>, table: &DecodeTable, out: &mut Vec<u8>) {
        let Some(choice) = self.choices.get_mut(step.index as usize) else {
            return;
        };
        let logprobs =
            (self.logprobs && !step.logprobs.is_empty()).then_some((step.logprobs, table));
        let has_content = !step.text.is_empty() || logprobs.is_some();
        match self.api {
            Api::Chat => {
                if !choice.opened && (has_content || step.finish.is_some()) {
                    openai::chat_role_chunk(out, &self.frame, step.index);
                    choice.opened = true;
                }
                let end = step.finish.is_some();
                match &mut choice.parsed {
                    Some(p) => p.chat_step(out, &self.frame, step.index, step.text, end, logprobs),
                    None if has_content => openai::chat_content_chunk(
                        out,
                        &self.frame,
                        step.index,
                        step.text,
                        logprobs,
                    ),
                    None => {}
                }
                if let Some(finish) = step.finish {
                    let finish = choice.shown(finish);
                    openai::chat_finish_chunk(out, &self.frame, step.index, &finish, &self.stops);
                }
            }
            Api::Completion => {
                if has_content || step.finish.is_some() {
                    let finish = step.finish;
                    let offset = choice.text.len();
                    let chunk = openai::Chunk {
                        index: step.index,
                        text: step.text,
                        logprobs,
                        text_offset: offset,
                    };
                    openai::completion_chunk(out, &self.frame, &chunk, finish);
                }
                if self.logprobs {
                    // Completions' text offsets count from the choice's start.
                    choice.text.push_str(step.text);
                }
            }
            Api::Messages => match &mut choice.parsed {
                Some(p) => p.messages_step(out, step.text, step.finish.is_some()),
                None if !step.text.is_empty() => anthropic::delta(out, step.text),
                None => {}
            },
            Api::Generate => {
                choice.text.push_str(step.text);
                choice.ids.extend_from_slice(step.token_ids);
                if self.logprobs {
                    choice.logprobs.extend_from_slice(step.logprobs);
                }
                if !step.token_ids.is_empty() || step.finish.is_some() {
                    let usage = Usage {
                        prompt_tokens: self.prompt_tokens,
                        ..Usage::default()
                    };
                    let view = GenerateChoice {
                        text: &choice.text,
                        output_ids: &choice.ids,
                        finish: step.finish,
                        logprobs: self.logprobs.then_some(&choice.logprobs[..]),
                        elapsed_s: self.elapsed_s,
                    };
                    generate::event(out, self.meta.id.as_str(), &view, &self.stops, &usage);
                }
            }
        }
        if let Some(finish) = step.finish {
            choice.finish = Some(finish.clone());
        }
    }

    /// Markup the parsers gave back as content, or tool calls cut short (`/metrics`).
    pub fn parse_failures(&self) -> u32 {
        parse_failures(&self.choices)
    }

    /// The events after every choice ended: the usage chunk (`include_usage`) and `[DONE]`;
    /// Anthropic's `content_block_stop`, `message_delta` and `message_stop`.
    pub fn end(&mut self, usage: &Usage, out: &mut Vec<u8>) {
        match self.api {
            Api::Chat | Api::Completion => {
                if self.include_usage {
                    openai::usage_chunk(out, &self.frame, usage);
                }
                out.extend_from_slice(openai::DONE);
            }
            Api::Messages => {
                let finish = self.choices.first().map_or_else(aborted, finish_of);
                match self.choices.first_mut().and_then(|c| c.parsed.as_mut()) {
                    Some(parsed) => {
                        parsed.messages_close(out);
                        anthropic::end_message(out, &finish, &self.stops, usage);
                    }
                    None => anthropic::end(out, &finish, &self.stops, usage),
                }
            }
            Api::Generate => out.extend_from_slice(openai::DONE),
        }
    }

    /// An error event ending the stream early (the worker failed mid-stream): OpenAI's
    /// `data: {"error":...}` then `[DONE]`, or Anthropic's `error` event.
    pub fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        match self.api {
            Api::Messages => anthropic::error(out, message),
            Api::Chat | Api::Completion | Api::Generate => {
                out.extend_from_slice(b"data: {\"error\":{\"message\":");
                push_str(out, message);
                out.extend_from_slice(b",\"type\":\"internal_error\",\"code\":500}}\n\n");
                out.extend_from_slice(openai::DONE);
            }
        }
    }
}

fn aborted() -> Finish {
    Finish {
        reason: FinishReason::Abort,
        matched: None,
    }
}

/// A choice's finish as the client sees it; one that never finished is reported as aborted.
fn finish_of(choice: &ChoiceRecord) -> Finish {
    choice
        .finish
        .as_ref()
        .map_or_else(aborted, |finish| choice.shown(finish))
}

/// Gathers a request's steps and writes one JSON body (`stream: false`).
#[derive(Debug)]
pub struct FullWriter {
    api: Api,
    meta: ResponseMeta,
    stops: Vec<String>,
    logprobs: bool,
    choices: Vec<ChoiceRecord>,
    /// Seconds since the request arrived (`/generate`'s `e2e_latency`), as last set.
    elapsed_s: f64,
}

impl FullWriter {
    /// A writer for `params`' API and choices.
    pub fn new(params: &GenerateParams, meta: ResponseMeta) -> FullWriter {
        FullWriter {
            api: params.api,
            meta,
            stops: params.stop.clone(),
            logprobs: params.logprobs.is_some(),
            choices: (0..params.n.max(1))
                .map(|_| ChoiceRecord::new(params))
                .collect(),
            elapsed_s: 0.0,
        }
    }

    /// Sets the seconds since the request arrived (`/generate`'s `meta_info.e2e_latency`; 0
    /// until set). The other APIs do not report it.
    pub fn set_elapsed(&mut self, seconds: f64) {
        self.elapsed_s = seconds;
    }

    /// Keeps one step.
    pub fn step(&mut self, step: &Step<'_>) {
        let Some(choice) = self.choices.get_mut(step.index as usize) else {
            return;
        };
        if let Some(parsed) = &mut choice.parsed {
            parsed.collect(step.text, step.finish.is_some());
        }
        choice.text.push_str(step.text);
        choice.ids.extend_from_slice(step.token_ids);
        if self.logprobs {
            choice.logprobs.extend_from_slice(step.logprobs);
        }
        if let Some(finish) = step.finish {
            choice.finish = Some(finish.clone());
        }
    }

    /// Markup the parsers gave back as content, or tool calls cut short (`/metrics`).
    pub fn parse_failures(&self) -> u32 {
        parse_failures(&self.choices)
    }

    /// Writes the body. A choice that never finished is reported as aborted.
    pub fn write(&self, usage: &Usage, table: &DecodeTable, out: &mut Vec<u8>) {
        match self.api {
            Api::Chat | Api::Completion => self.write_openai(usage, table, out),
            Api::Messages => {
                let first = self.choices.first();
                let finish = first.map_or_else(aborted, finish_of);
                match first.and_then(|c| c.parsed.as_ref()) {
                    Some(parsed) => {
                        let content = |out: &mut Vec<u8>| parsed.messages_content(out);
                        anthropic::message_with(
                            out,
                            &self.meta,
                            &content,
                            &finish,
                            &self.stops,
                            usage,
                        );
                    }
                    None => {
                        let text = first.map_or("", |c| c.text.as_str());
                        anthropic::message(out, &self.meta, text, &finish, &self.stops, usage);
                    }
                }
            }
            Api::Generate => {
                let many = self.choices.len() > 1;
                if many {
                    out.push(b'[');
                }
                for (i, c) in self.choices.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    let finish = finish_of(c);
                    let view = GenerateChoice {
                        text: &c.text,
                        output_ids: &c.ids,
                        finish: Some(&finish),
                        logprobs: self.logprobs.then_some(&c.logprobs[..]),
                        elapsed_s: self.elapsed_s,
                    };
                    generate::choice(out, &self.meta.id, &view, &self.stops, usage);
                }
                if many {
                    out.push(b']');
                }
            }
        }
    }

    fn write_openai(&self, usage: &Usage, table: &DecodeTable, out: &mut Vec<u8>) {
        let object = if self.api == Api::Chat {
            "chat.completion"
        } else {
            "text_completion"
        };
        let frame = Frame::new(&self.meta, object, ModelField::First);
        frame.open(out, false);
        for (i, c) in self.choices.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // SMG's order: chat `index`, `message`; completions `text`, `index`; then
            // `logprobs` only when asked.
            if self.api == Api::Chat {
                out.extend_from_slice(b"{\"index\":");
                super::json::push_u64(out, i as u64);
                out.extend_from_slice(b",\"message\":");
                match &c.parsed {
                    Some(parsed) => parsed.chat_message(out),
                    None => {
                        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
                        push_str(out, &c.text);
                        out.extend_from_slice(b",\"reasoning_content\":null}");
                    }
                }
            } else {
                out.extend_from_slice(b"{\"text\":");
                push_str(out, &c.text);
                out.extend_from_slice(b",\"index\":");
                super::json::push_u64(out, i as u64);
            }
            if self.logprobs {
                out.extend_from_slice(b",\"logprobs\":");
                match self.api {
                    Api::Chat => openai::chat_logprobs(out, &c.logprobs, table),
                    _ => openai::completion_logprobs(out, &c.logprobs, table, 0),
                }
            }
            let finish = finish_of(c);
            out.extend_from_slice(b",\"finish_reason\":");
            push_str(out, finish.reason.as_str());
            openai::push_matched_stop(out, finish.matched.as_ref(), &self.stops);
            out.push(b'}');
        }
        frame.close_choices(out);
        out.extend_from_slice(b",\"usage\":");
        openai::push_usage(out, usage);
        out.push(b'}');
    }
}
