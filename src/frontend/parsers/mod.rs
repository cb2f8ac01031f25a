//! Tool calls and reasoning in generated text: with gRPC workers the gateway writes the OpenAI
//! and Anthropic responses, so it, not the engine, finds a model's tool-call markup and its
//! thinking in the text the detokenizer produces.
//!
//! - [`ToolFormat`] and [`ReasoningFormat`]: the parsers by SMG's names (`--tool-call-parser`,
//!   `--reasoning-parser`) and SMG's per-model defaults when a flag is absent
//!   ([`ParserFlags`]).
//! - [`OutputParser`]: one choice's streaming parser. Each step's text goes in; out come
//!   [`Event`]s in order: reasoning, content, a tool call's name, its argument deltas. Text
//!   that may be the start of a marker is held until it is known (never leaked as content);
//!   markup that cannot be parsed comes back as content and is counted
//!   ([`OutputParser::failures`]). Feeding the whole text at once is the non-streaming parse,
//!   so the streamed and the non-streamed answers are the same by construction (and tested at
//!   every split).
//! - [`ToolRequest`]: a body's `tools` and `tool_choice` (OpenAI's and Anthropic's), and the
//!   JSON-schema constraint `required` and a named function ask of the engine.

mod json_call;
mod reasoning;
mod request;
mod tools;
pub(super) mod write;

use std::ops::Range;

pub use reasoning::ReasoningFormat;
pub use request::{ToolChoice, ToolRequest};
pub use tools::ToolFormat;

use reasoning::ReasoningParser;
use tools::ToolParser;

/// Which parser a flag names: none given (SMG's per-model default), or one by name
/// (`passthrough`: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Chosen<T> {
    /// The flag is absent: the model's name picks, as in SMG.
    #[default]
    ByModel,
    /// The flag names this parser (`None`: `passthrough`).
    Named(Option<T>),
}

/// `--tool-call-parser` and `--reasoning-parser`, validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParserFlags {
    /// `--tool-call-parser`.
    pub tool: Chosen<ToolFormat>,
    /// `--reasoning-parser`.
    pub reasoning: Chosen<ReasoningFormat>,
}

impl ParserFlags {
    /// The flags' values; an unknown name is refused (with the flag and the known names).
    pub fn parse(
        tool: Option<&str>,
        reasoning: Option<&str>,
    ) -> Result<ParserFlags, (&'static str, String)> {
        Ok(ParserFlags {
            tool: match tool {
                None => Chosen::ByModel,
                Some(name) => {
                    Chosen::Named(ToolFormat::by_name(name).map_err(|e| ("--tool-call-parser", e))?)
                }
            },
            reasoning: match reasoning {
                None => Chosen::ByModel,
                Some(name) => Chosen::Named(
                    ReasoningFormat::by_name(name).map_err(|e| ("--reasoning-parser", e))?,
                ),
            },
        })
    }

    /// The tool-call format of `model`'s output.
    pub fn tool_for(&self, model: &str) -> Option<ToolFormat> {
        match self.tool {
            Chosen::ByModel => ToolFormat::for_model(model),
            Chosen::Named(format) => format,
        }
    }

    /// The reasoning format of `model`'s output.
    pub fn reasoning_for(&self, model: &str) -> Option<ReasoningFormat> {
        match self.reasoning {
            Chosen::ByModel => ReasoningFormat::for_model(model),
            Chosen::Named(format) => format,
        }
    }
}

/// What a request's output is parsed for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParseSetup {
    /// Tool calls, in this format (`None`: the request has no tools, or `tool_choice: none`).
    pub tools: Option<ToolFormat>,
    /// Reasoning, in this format.
    pub reasoning: Option<ReasoningFormat>,
}

impl ParseSetup {
    /// Whether anything is parsed.
    pub fn is_active(&self) -> bool {
        self.tools.is_some() || self.reasoning.is_some()
    }

    /// Whether the markup is a special token the detokenizer must keep (Mistral's
    /// `[TOOL_CALLS]`; SGLang keeps special tokens for it too).
    pub fn needs_special_tokens(&self) -> bool {
        self.tools == Some(ToolFormat::Mistral)
    }
}

/// What one piece of parsed output is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    /// The name of call `n` (its first event).
    ToolName(u32),
    /// A piece of call `n`'s arguments (JSON text).
    ToolArgs(u32),
}

/// One piece of parsed output, in the order it came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// Thinking text.
    Reasoning(&'a str),
    /// Answer text.
    Content(&'a str),
    /// A tool call begins: its index among the choice's calls, and the function's name.
    ToolName {
        /// 0, 1, ... per choice.
        index: u32,
        /// The function.
        name: &'a str,
    },
    /// More of a tool call's arguments (pieces of one JSON text).
    ToolArgs {
        /// The call.
        index: u32,
        /// The next piece.
        delta: &'a str,
    },
}

/// The events of one step, in one buffer reused from step to step.
#[derive(Debug, Default)]
pub struct Parsed {
    text: String,
    events: Vec<(Kind, Range<usize>)>,
}

impl Parsed {
    fn clear(&mut self) {
        self.text.clear();
        self.events.clear();
    }

    /// Appends `text` as `kind`, joined to the last event when it is the same.
    fn push(&mut self, kind: Kind, text: &str) {
        let mergeable = !matches!(kind, Kind::ToolName(_));
        if text.is_empty() && mergeable {
            return;
        }
        let start = self.text.len();
        self.text.push_str(text);
        let end = self.text.len();
        match self.events.last_mut() {
            Some((last, range)) if mergeable && *last == kind => range.end = end,
            _ => self.events.push((kind, start..end)),
        }
    }

    /// Whether the step produced nothing.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events, in order.
    pub fn events(&self) -> impl Iterator<Item = Event<'_>> {
        self.events.iter().map(|(kind, range)| {
            let text = &self.text[range.clone()];
            match *kind {
                Kind::Reasoning => Event::Reasoning(text),
                Kind::Content => Event::Content(text),
                Kind::ToolName(index) => Event::ToolName { index, name: text },
                Kind::ToolArgs(index) => Event::ToolArgs { index, delta: text },
            }
        })
    }
}

/// One tool call of a finished message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments, JSON text as the model wrote it.
    pub arguments: String,
}

/// A choice's whole parsed output: what a non-streamed answer holds, and what the events of a
/// stream add up to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// The thinking.
    pub reasoning: String,
    /// The answer text.
    pub content: String,
    /// The calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    /// Adds a step's events.
    pub fn apply(&mut self, parsed: &Parsed) {
        for event in parsed.events() {
            match event {
                Event::Reasoning(text) => self.reasoning.push_str(text),
                Event::Content(text) => self.content.push_str(text),
                Event::ToolName { name, .. } => self.tool_calls.push(ToolCall {
                    name: name.to_owned(),
                    arguments: String::new(),
                }),
                Event::ToolArgs { index, delta } => {
                    if let Some(call) = self.tool_calls.get_mut(index as usize) {
                        call.arguments.push_str(delta);
                    }
                }
            }
        }
    }
}

/// One choice's parser: reasoning first, then tool calls in the text outside the reasoning.
#[derive(Debug)]
pub struct OutputParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolParser>,
    /// Scratch: this step's text outside the reasoning.
    normal: String,
    parsed: Parsed,
}

impl OutputParser {
    /// A parser for `setup`, or `None` when nothing is parsed.
    pub fn new(setup: &ParseSetup) -> Option<OutputParser> {
        setup.is_active().then(|| OutputParser {
            reasoning: setup.reasoning.map(ReasoningParser::new),
            tools: setup.tools.map(ToolParser::new),
            normal: String::new(),
            parsed: Parsed::default(),
        })
    }

    /// Parses the next piece of text.
    pub fn push(&mut self, text: &str) -> &Parsed {
        self.parsed.clear();
        self.run(text, false);
        &self.parsed
    }

    /// The output ended: what was held (a possible marker's start, an unfinished call) is
    /// written, as content when it was not a complete call.
    pub fn finish(&mut self) -> &Parsed {
        self.parsed.clear();
        self.run("", true);
        &self.parsed
    }

    fn run(&mut self, text: &str, end: bool) {
        let normal: &str = match &mut self.reasoning {
            Some(reasoning) => {
                self.normal.clear();
                reasoning.push(text, end, &mut self.parsed, &mut self.normal);
                &self.normal
            }
            None => text,
        };
        match &mut self.tools {
            Some(tools) => tools.push(normal, end, &mut self.parsed),
            None => self.parsed.push(Kind::Content, normal),
        }
    }

    /// Tool calls begun so far.
    pub fn tool_calls(&self) -> u32 {
        self.tools.as_ref().map_or(0, ToolParser::calls)
    }

    /// Markup that could not be parsed (returned as content) or a call cut short, so far.
    pub fn failures(&self) -> u32 {
        self.tools.as_ref().map_or(0, ToolParser::failures)
    }
}

/// The longest end of `text` that is a proper beginning of `marker` (text to hold back: the
/// marker may be arriving).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    let first = marker.as_bytes()[0];
    let bytes = text.as_bytes();
    let from = bytes.len().saturating_sub(marker.len() - 1);
    for at in from..bytes.len() {
        if bytes[at] == first && marker.as_bytes().starts_with(&bytes[at..]) {
            return bytes.len() - at;
        }
    }
    0
}

#[cfg(test)]
mod tests;
