//! Parsed output in the clients' shapes: OpenAI's `reasoning_content` and `tool_calls` (chunk
//! deltas as they come, or the message), Anthropic's `thinking`, `text` and `tool_use` content
//! blocks (streamed block by block, or the message's `content`). The writers call these for a
//! choice whose output is parsed; the rest of each response is theirs.

use super::{Event, Message, OutputParser, ParseSetup, Parsed};
use crate::frontend::anthropic::event;
use crate::frontend::json::{push_escaped, push_str, push_u64};
use crate::frontend::openai::{self, Frame};
use crate::frontend::output::TokenLogprob;
use crate::tokenize::DecodeTable;

/// An Anthropic content block being streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// A choice whose output is parsed: its parser, and what its writer keeps of it.
#[derive(Debug)]
pub(in crate::frontend) struct ParsedChoice {
    parser: OutputParser,
    /// The whole message (non-streamed answers).
    pub(in crate::frontend) message: Message,
    /// The calls' ids, in order.
    ids: Vec<String>,
    /// Anthropic: the streamed message's blocks.
    blocks: Blocks,
}

impl ParsedChoice {
    pub(in crate::frontend) fn new(setup: &ParseSetup) -> Option<Box<ParsedChoice>> {
        OutputParser::new(setup).map(|parser| {
            Box::new(ParsedChoice {
                parser,
                message: Message::default(),
                ids: Vec::new(),
                blocks: Blocks::default(),
            })
        })
    }

    /// Tool calls begun so far.
    pub(in crate::frontend) fn tool_calls(&self) -> u32 {
        self.parser.tool_calls()
    }

    /// Markup given back as content, or calls cut short.
    pub(in crate::frontend) fn failures(&self) -> u32 {
        self.parser.failures()
    }

    /// Parses a step's text (and flushes the parser when `end`) into the whole message.
    pub(in crate::frontend) fn collect(&mut self, text: &str, end: bool) {
        let parsed = self.parser.push(text);
        self.message.apply(parsed);
        if end {
            let parsed = self.parser.finish();
            self.message.apply(parsed);
        }
        while self.ids.len() < self.message.tool_calls.len() {
            self.ids.push(call_id("call_"));
        }
    }

    /// Writes a step's parsed text as chat chunks; `logprobs` go on a content chunk of their
    /// own.
    pub(in crate::frontend) fn chat_step(
        &mut self,
        out: &mut Vec<u8>,
        frame: &Frame,
        index: u32,
        text: &str,
        end: bool,
        logprobs: Option<(&[TokenLogprob], &DecodeTable)>,
    ) {
        if logprobs.is_some() {
            openai::chat_content_chunk(out, frame, index, "", logprobs);
        }
        let parsed = self.parser.push(text);
        chat_events(out, frame, index, parsed, &mut self.ids);
        if end {
            let parsed = self.parser.finish();
            chat_events(out, frame, index, parsed, &mut self.ids);
        }
    }

    /// Writes a step's parsed text as Anthropic blocks and deltas.
    pub(in crate::frontend) fn messages_step(&mut self, out: &mut Vec<u8>, text: &str, end: bool) {
        let parsed = self.parser.push(text);
        self.blocks.write(out, parsed);
        if end {
            let parsed = self.parser.finish();
            self.blocks.write(out, parsed);
        }
    }

    /// Closes the last block (a message with none gets an empty text block, as the API always
    /// has content).
    pub(in crate::frontend) fn messages_close(&mut self, out: &mut Vec<u8>) {
        if self.blocks.count == 0 {
            self.blocks.open(out, Block::Text, None);
        }
        self.blocks.close(out);
    }

    /// The non-streamed chat `message`.
    pub(in crate::frontend) fn chat_message(&self, out: &mut Vec<u8>) {
        let m = &self.message;
        out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
        push_or_null(out, &m.content, !m.tool_calls.is_empty());
        out.extend_from_slice(b",\"reasoning_content\":");
        push_or_null(out, &m.reasoning, true);
        if !m.tool_calls.is_empty() {
            out.extend_from_slice(b",\"tool_calls\":[");
            for (i, call) in m.tool_calls.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"id\":");
                push_str(out, self.ids.get(i).map_or("", String::as_str));
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                push_str(out, &call.name);
                out.extend_from_slice(b",\"arguments\":");
                push_str(out, &call.arguments);
                out.extend_from_slice(b"}}");
            }
            out.push(b']');
        }
        out.push(b'}');
    }

    /// The non-streamed Anthropic `content`: thinking, text, then the tool calls.
    pub(in crate::frontend) fn messages_content(&self, out: &mut Vec<u8>) {
        let m = &self.message;
        out.push(b'[');
        let mut first = true;
        let mut sep = |out: &mut Vec<u8>| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
        };
        if !m.reasoning.is_empty() {
            sep(out);
            out.extend_from_slice(b"{\"type\":\"thinking\",\"thinking\":");
            push_str(out, &m.reasoning);
            out.extend_from_slice(b",\"signature\":\"\"}");
        }
        if !m.content.is_empty() || m.tool_calls.is_empty() {
            sep(out);
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
            push_str(out, &m.content);
            out.push(b'}');
        }
        for call in &m.tool_calls {
            sep(out);
            out.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
            push_str(out, &call_id("toolu_"));
            out.extend_from_slice(b",\"name\":");
            push_str(out, &call.name);
            out.extend_from_slice(b",\"input\":");
            // `input` is an object: arguments that do not parse as one are given as a string
            // under `_raw`, so nothing the model wrote is lost.
            match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
                &call.arguments,
            ) {
                Ok(_) => out.extend_from_slice(call.arguments.as_bytes()),
                Err(_) => {
                    out.extend_from_slice(b"{\"_raw\":");
                    push_str(out, &call.arguments);
                    out.push(b'}');
                }
            }
            out.push(b'}');
        }
        out.push(b']');
    }
}

/// The Anthropic blocks of a streamed message: the one open now, and how many were opened.
#[derive(Debug, Default)]
struct Blocks {
    open: Option<Block>,
    count: u32,
}

impl Blocks {
    fn write(&mut self, out: &mut Vec<u8>, parsed: &Parsed) {
        for event in parsed.events() {
            match event {
                Event::Reasoning(text) => {
                    self.open(out, Block::Thinking, None);
                    block_delta(out, self.count - 1, "thinking_delta", "thinking", text);
                }
                Event::Content(text) => {
                    self.open(out, Block::Text, None);
                    block_delta(out, self.count - 1, "text_delta", "text", text);
                }
                Event::ToolName { name, .. } => {
                    let id = call_id("toolu_");
                    self.open(out, Block::ToolUse, Some((&id, name)));
                }
                Event::ToolArgs { delta, .. } => {
                    block_delta(
                        out,
                        self.count - 1,
                        "input_json_delta",
                        "partial_json",
                        delta,
                    );
                }
            }
        }
    }

    /// Opens a block of `kind` unless one is open (a tool's block is always new).
    fn open(&mut self, out: &mut Vec<u8>, kind: Block, tool: Option<(&str, &str)>) {
        if self.open == Some(kind) && kind != Block::ToolUse {
            return;
        }
        self.close(out);
        event(out, "content_block_start");
        out.extend_from_slice(b"{\"type\":\"content_block_start\",\"index\":");
        push_u64(out, u64::from(self.count));
        out.extend_from_slice(b",\"content_block\":");
        match (kind, tool) {
            (Block::Thinking, _) => out
                .extend_from_slice(b"{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}"),
            (Block::ToolUse, Some((id, name))) => {
                out.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
                push_str(out, id);
                out.extend_from_slice(b",\"name\":");
                push_str(out, name);
                out.extend_from_slice(b",\"input\":{}}");
            }
            _ => out.extend_from_slice(b"{\"type\":\"text\",\"text\":\"\"}"),
        }
        out.extend_from_slice(b"}\n\n");
        self.open = Some(kind);
        self.count += 1;
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.open.take().is_some() {
            event(out, "content_block_stop");
            out.extend_from_slice(b"{\"type\":\"content_block_stop\",\"index\":");
            push_u64(out, u64::from(self.count - 1));
            out.extend_from_slice(b"}\n\n");
        }
    }
}

fn push_or_null(out: &mut Vec<u8>, text: &str, null_when_empty: bool) {
    if text.is_empty() && null_when_empty {
        out.extend_from_slice(b"null");
    } else {
        push_str(out, text);
    }
}

/// A tool call's id: `prefix` and 24 hex digits.
fn call_id(prefix: &str) -> String {
    format!("{prefix}{:024x}", fastrand::u128(..) & ((1u128 << 96) - 1))
}

/// Opens a chat chunk of choice `index` up to its delta's fields.
fn chunk_open(out: &mut Vec<u8>, frame: &Frame, index: u32) {
    frame.open(out, true);
    out.extend_from_slice(b"{\"index\":");
    push_u64(out, u64::from(index));
    out.extend_from_slice(b",\"delta\":{\"role\":\"assistant\",\"content\":null,");
}

fn chunk_close(out: &mut Vec<u8>, frame: &Frame) {
    out.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":null}");
    frame.close_event(out);
}

fn chat_events(
    out: &mut Vec<u8>,
    frame: &Frame,
    index: u32,
    parsed: &Parsed,
    ids: &mut Vec<String>,
) {
    for event in parsed.events() {
        match event {
            Event::Content(text) => openai::chat_content_chunk(out, frame, index, text, None),
            Event::Reasoning(text) => {
                chunk_open(out, frame, index);
                out.extend_from_slice(b"\"reasoning_content\":\"");
                push_escaped(out, text.as_bytes());
                out.push(b'"');
                chunk_close(out, frame);
            }
            Event::ToolName { index: call, name } => {
                let id = call_id("call_");
                chunk_open(out, frame, index);
                out.extend_from_slice(b"\"reasoning_content\":null,\"tool_calls\":[{\"index\":");
                push_u64(out, u64::from(call));
                out.extend_from_slice(b",\"id\":");
                push_str(out, &id);
                out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                push_str(out, name);
                out.extend_from_slice(b",\"arguments\":\"\"}}]");
                chunk_close(out, frame);
                ids.push(id);
            }
            Event::ToolArgs { index: call, delta } => {
                chunk_open(out, frame, index);
                out.extend_from_slice(b"\"reasoning_content\":null,\"tool_calls\":[{\"index\":");
                push_u64(out, u64::from(call));
                out.extend_from_slice(b",\"function\":{\"arguments\":");
                push_str(out, delta);
                out.extend_from_slice(b"}}]");
                chunk_close(out, frame);
            }
        }
    }
}

/// An Anthropic `content_block_delta` of block `index`: `{"type": kind, field: text}`.
fn block_delta(out: &mut Vec<u8>, index: u32, kind: &str, field: &str, text: &str) {
    event(out, "content_block_delta");
    out.extend_from_slice(b"{\"type\":\"content_block_delta\",\"index\":");
    push_u64(out, u64::from(index));
    out.extend_from_slice(b",\"delta\":{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"");
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":\"");
    push_escaped(out, text.as_bytes());
    out.extend_from_slice(b"\"}}\n\n");
}
