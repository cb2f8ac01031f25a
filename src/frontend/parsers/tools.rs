//! The tool-call parsers: each format's markup around the calls, read as it streams.
//!
//! | SMG name | models | markup |
//! |---|---|---|
//! | `qwen` | Qwen 2.5/3, Hermes | `<tool_call>{"name":..,"arguments":{..}}</tool_call>`, repeated |
//! | `llama` | Llama 3.1/3.2 | `<\|python_tag\|>{"name":..,"parameters":{..}}`, or the object alone at the start; `;` between calls |
//! | `json` | OpenAI-style JSON | a call object, or an array of them, at the start |
//! | `mistral` | Mistral, Mixtral | `[TOOL_CALLS] [{"name":..,"arguments":{..}}, ...]` |
//! | `deepseek` | DeepSeek V3 | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` |
//!
//! The text around the markup is content. A call's name is written once its string closed;
//! its arguments' JSON text is written as it arrives (the bytes the model wrote). Markup that
//! breaks before a call's name is known comes back as content and counts as a failure; a call
//! cut off after its name (the output ended) keeps what came and counts too.

use super::json_call::{JsonCall, Scan};
use super::{partial_marker_len, Kind, Parsed};

/// A tool-call format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` JSON (Qwen, Hermes).
    Qwen,
    /// Llama 3's JSON, after `<|python_tag|>` or alone at the start.
    Llama,
    /// A JSON call object or an array of them at the start (also what `tool_choice:
    /// required` and a named function constrain the output to).
    Json,
    /// `[TOOL_CALLS]` and an array of calls.
    Mistral,
    /// DeepSeek V3's tokens.
    DeepSeek,
}

/// The names kvgate parses, with SMG's spelling.
const NAMES: [(&str, ToolFormat); 5] = [
    ("qwen", ToolFormat::Qwen),
    ("llama", ToolFormat::Llama),
    ("json", ToolFormat::Json),
    ("mistral", ToolFormat::Mistral),
    ("deepseek", ToolFormat::DeepSeek),
];

/// SMG's parsers that kvgate does not have: refused by name, passed through as a model
/// default.
const NOT_BUILT: [&str; 8] = [
    "qwen_coder",
    "pythonic",
    "glm45_moe",
    "glm47_moe",
    "step3",
    "kimik2",
    "minimax_m2",
    "cohere",
];

/// SMG's model patterns: a `*` pattern matches a model name it begins (case-sensitive); the
/// longest match wins; none is `passthrough`.
const MODEL_PATTERNS: [(&str, &str); 44] = [
    ("gpt-4*", "json"),
    ("gpt-3.5*", "json"),
    ("gpt-4o*", "json"),
    ("claude-*", "json"),
    ("mistral-*", "mistral"),
    ("mixtral-*", "mistral"),
    ("Qwen/Qwen3-Coder*", "qwen_coder"),
    ("Qwen3-Coder*", "qwen_coder"),
    ("qwen3-coder*", "qwen_coder"),
    ("Qwen/Qwen2.5-Coder*", "qwen_coder"),
    ("Qwen2.5-Coder*", "qwen_coder"),
    ("qwen2.5-coder*", "qwen_coder"),
    ("qwen*", "qwen"),
    ("Qwen*", "qwen"),
    ("llama-4*", "pythonic"),
    ("meta-llama-4*", "pythonic"),
    ("llama-3.2*", "llama"),
    ("meta-llama-3.2*", "llama"),
    ("llama-*", "json"),
    ("meta-llama-*", "json"),
    ("deepseek-v3*", "deepseek"),
    ("deepseek-ai/DeepSeek-V3*", "deepseek"),
    ("deepseek-*", "pythonic"),
    ("glm-4.5*", "glm45_moe"),
    ("glm-4.6*", "glm45_moe"),
    ("glm-4.7*", "glm47_moe"),
    ("glm-*", "json"),
    ("step3*", "step3"),
    ("Step-3*", "step3"),
    ("kimi-k2*", "kimik2"),
    ("Kimi-K2*", "kimik2"),
    ("moonshot*/Kimi-K2*", "kimik2"),
    ("minimax*", "minimax_m2"),
    ("MiniMax*", "minimax_m2"),
    ("command-r*", "cohere"),
    ("command-r-plus*", "cohere"),
    ("command-a*", "cohere"),
    ("c4ai-command*", "cohere"),
    ("cohere*", "cohere"),
    ("CohereForAI*", "cohere"),
    ("gemini-*", "json"),
    ("palm-*", "json"),
    ("gemma-*", "json"),
    ("gpt-oss*", "passthrough"),
];

impl ToolFormat {
    /// The parser SMG names `name`; `passthrough` is none.
    pub fn by_name(name: &str) -> Result<Option<ToolFormat>, String> {
        if name == "passthrough" {
            return Ok(None);
        }
        if let Some((_, format)) = NAMES.iter().find(|(n, _)| *n == name) {
            return Ok(Some(*format));
        }
        let known: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        if NOT_BUILT.contains(&name) {
            return Err(format!(
                "tool-call parser {name:?} is SMG's but not built in kvgate; one of passthrough, {}",
                known.join(", ")
            ));
        }
        Err(format!(
            "unknown tool-call parser {name:?}: one of passthrough, {}",
            known.join(", ")
        ))
    }

    /// SMG's default for `model`; a parser kvgate does not have passes the text through.
    pub fn for_model(model: &str) -> Option<ToolFormat> {
        let (_, name) = MODEL_PATTERNS
            .iter()
            .filter(|(pattern, _)| {
                let prefix = pattern.strip_suffix('*').unwrap_or(pattern);
                model.starts_with(prefix)
            })
            .max_by_key(|(pattern, _)| pattern.len())?;
        Self::by_name(name).ok().flatten()
    }

    /// SMG's name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("passthrough", |(n, _)| n)
    }

    /// The marker that opens the calls anywhere in the text.
    fn marker(self) -> Option<&'static str> {
        match self {
            ToolFormat::Qwen => Some("<tool_call>"),
            ToolFormat::Llama => Some("<|python_tag|>"),
            ToolFormat::Mistral => Some("[TOOL_CALLS]"),
            ToolFormat::DeepSeek => Some(DS_CALLS_BEGIN),
            ToolFormat::Json => None,
        }
    }

    /// The bytes that open a call at the very start of the output (after whitespace).
    fn bare_start(self) -> &'static [u8] {
        match self {
            ToolFormat::Llama => b"{",
            ToolFormat::Json => b"{[",
            _ => b"",
        }
    }
}

const QWEN_CLOSE: &str = "</tool_call>";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_FENCE_OPEN: &str = "```json\n";
const DS_FENCE_CLOSE: &str = "\n```";
/// How much text may stand between DeepSeek's call marker and its separator (the call's type,
/// `function`) before the markup is judged broken.
const DS_HEAD_BYTES_MAX: usize = 64;

/// Where the parser is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Answer text.
    Text,
    /// A call object is due (whitespace first).
    WantObject,
    /// Reading a call object.
    Object,
    /// Qwen: `</tool_call>` is due.
    WantClose,
    /// Llama: `;` and another call, or the end of the calls.
    LlamaSep,
    /// In an array of calls: `,` or `]`.
    ArraySep,
    /// Mistral: after `[TOOL_CALLS]`, an array or one object.
    MistralOpen,
    /// DeepSeek: a call, or the end of the calls.
    DsWantCall,
    /// DeepSeek: the call's type, up to the separator.
    DsHead,
    /// DeepSeek: the name, up to a newline.
    DsName(usize),
    /// DeepSeek: the arguments' fence.
    DsFence,
    /// DeepSeek: the arguments, up to the closing fence.
    DsArgs,
    /// DeepSeek: the call's end marker.
    DsWantCallEnd,
}

/// Whether a literal comes next (after whitespace).
enum Lit {
    /// Yes; the offset after it.
    Yes(usize),
    /// Not yet known: what came is its beginning.
    More,
    No,
}

fn expect_lit(buf: &str, pos: usize, lit: &str) -> Lit {
    let rest = buf[pos..].trim_start();
    let at = buf.len() - rest.len();
    if rest.starts_with(lit) {
        Lit::Yes(at + lit.len())
    } else if lit.starts_with(rest) {
        Lit::More
    } else {
        Lit::No
    }
}

/// The first byte after whitespace from `pos`, and its offset.
fn next_solid(buf: &str, pos: usize) -> Option<(usize, u8)> {
    buf.as_bytes()[pos..]
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map(|i| (pos + i, buf.as_bytes()[pos + i]))
}

/// One choice's tool-call parser.
#[derive(Debug)]
pub(super) struct ToolParser {
    format: ToolFormat,
    state: State,
    /// Text not yet written: a marker's possible beginning, or the markup since its marker.
    buf: String,
    /// How far `buf` is read.
    pos: usize,
    /// The calls are in a JSON array.
    in_array: bool,
    /// Answer text that is not whitespace came: a bare call can no longer begin.
    started: bool,
    /// Whitespace after the calls is held (dropped unless answer text follows).
    after_calls: bool,
    held_space: String,
    call: Option<JsonCall>,
    /// Where the object being read began in `buf`.
    object_start: usize,
    name_sent: bool,
    /// How far the current call's arguments are written (an offset in `buf`).
    args_sent: usize,
    calls: u32,
    /// Calls begun since the markup's marker (0: a failure gives all of it back as content).
    section_calls: u32,
    failures: u32,
}

impl ToolParser {
    pub(super) fn new(format: ToolFormat) -> ToolParser {
        ToolParser {
            format,
            state: State::Text,
            buf: String::new(),
            pos: 0,
            in_array: false,
            started: format.bare_start().is_empty(),
            after_calls: false,
            held_space: String::new(),
            call: None,
            object_start: 0,
            name_sent: false,
            args_sent: 0,
            calls: 0,
            section_calls: 0,
            failures: 0,
        }
    }

    pub(super) fn calls(&self) -> u32 {
        self.calls
    }

    pub(super) fn failures(&self) -> u32 {
        self.failures
    }

    /// Parses `text`; `end`: the output ended.
    pub(super) fn push(&mut self, text: &str, end: bool, out: &mut Parsed) {
        if self.state == State::Text && self.buf.is_empty() && self.started {
            let plain = match self.format.marker() {
                Some(marker) => !text.as_bytes().contains(&marker.as_bytes()[0]),
                None => true,
            };
            if plain {
                self.content(text, out);
                if end {
                    self.held_space.clear();
                }
                return;
            }
        }
        self.buf.push_str(text);
        self.run(end, out);
        if end {
            self.end(out);
        }
    }

    /// Answer text, with whitespace after the calls held.
    fn content(&mut self, text: &str, out: &mut Parsed) {
        if text.is_empty() {
            return;
        }
        if self.after_calls {
            if text.trim_start().is_empty() {
                self.held_space.push_str(text);
                return;
            }
            self.after_calls = false;
            out.push(Kind::Content, &self.held_space);
            self.held_space.clear();
        }
        out.push(Kind::Content, text);
    }

    /// Writes `buf[from..to]` as content.
    fn content_range(&mut self, from: usize, to: usize, out: &mut Parsed) {
        let text = std::mem::take(&mut self.buf);
        self.content(&text[from..to], out);
        self.buf = text;
    }

    /// Forgets `buf` up to `pos` (written or consumed).
    fn drain(&mut self) {
        self.buf.drain(..self.pos);
        self.pos = 0;
    }

    /// The markup broke at `at`: what was not a call is given back as content (from the marker
    /// when no call of it was read, else from `from`), and reading goes on as answer text.
    fn fail(&mut self, from: usize, at: usize, out: &mut Parsed) {
        self.failures += 1;
        let from = if self.section_calls == 0 { 0 } else { from };
        self.content_range(from, at, out);
        self.pos = at;
        self.end_section();
        // Whatever broke the markup is answer text now, and no bare call begins after it.
        self.started = true;
    }

    fn end_section(&mut self) {
        self.drain();
        self.state = State::Text;
        self.in_array = false;
        self.section_calls = 0;
        self.call = None;
    }

    fn run(&mut self, end: bool, out: &mut Parsed) {
        loop {
            let before = (self.state, self.pos, self.buf.len());
            match self.state {
                State::Text => self.text(end, out),
                State::WantObject => match next_solid(&self.buf, self.pos) {
                    Some((at, b'{')) => {
                        self.begin_object(at);
                    }
                    Some((at, _)) => self.fail(self.pos, at, out),
                    None => return,
                },
                State::Object => self.object(out),
                State::WantClose => match expect_lit(&self.buf, self.pos, QWEN_CLOSE) {
                    Lit::Yes(after) => {
                        self.pos = after;
                        self.finish_calls();
                    }
                    Lit::More => return,
                    Lit::No => self.finish_calls(),
                },
                State::LlamaSep => match next_solid(&self.buf, self.pos) {
                    Some((at, b';')) => {
                        self.pos = at + 1;
                        self.state = State::WantObject;
                    }
                    // More text after the calls: answer text (the model's own words).
                    Some(_) => self.finish_calls(),
                    None => return,
                },
                State::ArraySep => match next_solid(&self.buf, self.pos) {
                    Some((at, b',')) => {
                        self.pos = at + 1;
                        self.state = State::WantObject;
                    }
                    Some((at, b']')) => {
                        self.pos = at + 1;
                        self.finish_calls();
                    }
                    Some((at, _)) => self.fail(self.pos, at, out),
                    None => return,
                },
                State::MistralOpen => match next_solid(&self.buf, self.pos) {
                    Some((at, b'[')) => {
                        self.pos = at + 1;
                        self.in_array = true;
                        self.state = State::WantObject;
                    }
                    Some((at, b'{')) => self.begin_object(at),
                    Some((at, _)) => self.fail(self.pos, at, out),
                    None => return,
                },
                State::DsWantCall => match expect_lit(&self.buf, self.pos, DS_CALL_BEGIN) {
                    Lit::Yes(after) => {
                        self.object_start = after - DS_CALL_BEGIN.len();
                        self.name_sent = false;
                        self.pos = after;
                        self.state = State::DsHead;
                    }
                    Lit::More => return,
                    Lit::No => match expect_lit(&self.buf, self.pos, DS_CALLS_END) {
                        Lit::Yes(after) => {
                            self.pos = after;
                            self.finish_calls();
                        }
                        Lit::More => return,
                        Lit::No => {
                            let at = next_solid(&self.buf, self.pos).map_or(self.pos, |s| s.0);
                            self.fail(self.pos, at, out);
                        }
                    },
                },
                State::DsHead => match self.buf[self.pos..].find(DS_SEP) {
                    Some(i) => {
                        self.pos += i + DS_SEP.len();
                        self.state = State::DsName(self.pos);
                    }
                    None if self.buf.len() - self.pos > DS_HEAD_BYTES_MAX => {
                        self.fail(self.pos, self.buf.len(), out);
                    }
                    None => return,
                },
                State::DsName(start) => match self.buf[start..].find('\n') {
                    Some(i) => {
                        let name = self.buf[start..start + i].trim().to_owned();
                        if name.is_empty() {
                            self.fail(start, start + i, out);
                        } else {
                            self.pos = start + i + 1;
                            self.send_name(&name, out);
                            self.state = State::DsFence;
                        }
                    }
                    None => return,
                },
                State::DsFence => match expect_lit(&self.buf, self.pos, DS_FENCE_OPEN) {
                    Lit::Yes(after) => {
                        self.pos = after;
                        self.args_sent = after;
                        self.state = State::DsArgs;
                    }
                    Lit::More => return,
                    Lit::No => {
                        // No fence: the call keeps no arguments; the rest is answer text.
                        out.push(Kind::ToolArgs(self.calls - 1), "{}");
                        self.failures += 1;
                        self.finish_calls();
                    }
                },
                State::DsArgs => self.ds_args(end, out),
                State::DsWantCallEnd => match expect_lit(&self.buf, self.pos, DS_CALL_END) {
                    Lit::Yes(after) => {
                        self.pos = after;
                        self.state = State::DsWantCall;
                    }
                    Lit::More => return,
                    Lit::No => self.state = State::DsWantCall,
                },
            }
            if before == (self.state, self.pos, self.buf.len()) {
                return;
            }
        }
    }

    /// Answer text: find the marker (or a bare call at the start); hold a possible beginning.
    fn text(&mut self, end: bool, out: &mut Parsed) {
        if !self.started {
            let rest = &self.buf[self.pos..];
            let solid = rest.trim_start();
            if solid.is_empty() {
                if end {
                    self.content_range(self.pos, self.buf.len(), out);
                    self.pos = self.buf.len();
                    self.drain();
                }
                return;
            }
            let at = self.buf.len() - solid.len();
            let first = solid.as_bytes()[0];
            if self.format.bare_start().contains(&first) {
                // The leading whitespace is not part of an answer.
                self.pos = at;
                self.drain();
                self.section_calls = 0;
                if first == b'[' {
                    self.pos = 1;
                    self.in_array = true;
                    self.state = State::WantObject;
                } else {
                    self.begin_object(0);
                }
                return;
            }
            self.started = true;
        }
        let Some(marker) = self.format.marker() else {
            self.content_range(self.pos, self.buf.len(), out);
            self.pos = self.buf.len();
            self.drain();
            return;
        };
        match self.buf[self.pos..].find(marker) {
            Some(i) => {
                let at = self.pos + i;
                self.content_range(self.pos, at, out);
                self.pos = at;
                self.drain();
                self.pos = marker.len();
                self.section_calls = 0;
                self.state = match self.format {
                    ToolFormat::Mistral => State::MistralOpen,
                    ToolFormat::DeepSeek => State::DsWantCall,
                    _ => State::WantObject,
                };
            }
            None => {
                let keep = if end {
                    0
                } else {
                    partial_marker_len(&self.buf[self.pos..], marker)
                };
                let to = self.buf.len() - keep;
                self.content_range(self.pos, to, out);
                self.pos = to;
                self.drain();
            }
        }
    }

    fn begin_object(&mut self, at: usize) {
        self.call = Some(JsonCall::new(at));
        self.object_start = at;
        self.name_sent = false;
        self.state = State::Object;
    }

    /// A new call's name.
    fn send_name(&mut self, name: &str, out: &mut Parsed) {
        out.push(Kind::ToolName(self.calls), name);
        self.calls += 1;
        self.section_calls += 1;
        self.name_sent = true;
    }

    fn object(&mut self, out: &mut Parsed) {
        let Some(mut call) = self.call.take() else {
            self.state = State::Text;
            return;
        };
        let scan = call.scan(&self.buf);
        if !self.name_sent {
            if let Some(name) = call.name.take() {
                self.send_name(&name, out);
                self.args_sent = 0;
            }
        }
        if self.name_sent {
            if let Some(known) = call.args_known() {
                let from = self.args_sent.max(known.start);
                if known.end > from {
                    out.push(Kind::ToolArgs(self.calls - 1), &self.buf[from..known.end]);
                    self.args_sent = known.end;
                }
            }
        }
        match scan {
            Scan::More => self.call = Some(call),
            Scan::Invalid(at) => {
                if self.name_sent {
                    // The call's name was written: what follows is answer text.
                    self.failures += 1;
                    self.pos = at;
                    self.finish_calls();
                    self.started = true;
                } else {
                    self.fail(self.object_start, at, out);
                }
            }
            Scan::Done(after) => {
                if !self.name_sent {
                    self.fail(self.object_start, after, out);
                    return;
                }
                if !call.has_args() {
                    out.push(Kind::ToolArgs(self.calls - 1), "{}");
                }
                self.pos = after;
                self.state = match (self.in_array, self.format) {
                    (true, _) => State::ArraySep,
                    (false, ToolFormat::Qwen) => State::WantClose,
                    (false, ToolFormat::Llama) => State::LlamaSep,
                    (false, _) => {
                        self.finish_calls();
                        return;
                    }
                };
            }
        }
    }

    fn ds_args(&mut self, end: bool, out: &mut Parsed) {
        let from = self.args_sent;
        match self.buf[from..].find(DS_FENCE_CLOSE) {
            Some(i) => {
                out.push(Kind::ToolArgs(self.calls - 1), &self.buf[from..from + i]);
                self.pos = from + i + DS_FENCE_CLOSE.len();
                self.state = State::DsWantCallEnd;
            }
            None => {
                let keep = if end {
                    0
                } else {
                    partial_marker_len(&self.buf[from..], DS_FENCE_CLOSE)
                };
                let to = self.buf.len() - keep;
                out.push(Kind::ToolArgs(self.calls - 1), &self.buf[from..to]);
                self.args_sent = to;
                self.pos = to;
            }
        }
    }

    /// The calls' markup ended well: back to answer text, whitespace after it held.
    fn finish_calls(&mut self) {
        self.end_section();
        self.after_calls = true;
    }

    /// The output ended: what is held is written, and markup left open is counted (a call
    /// whose name was written keeps what came; one whose name was not is given back).
    fn end(&mut self, out: &mut Parsed) {
        let open_call = matches!(self.state, State::Object | State::DsHead | State::DsName(_));
        let bare_marker = matches!(
            self.state,
            State::WantObject | State::MistralOpen | State::DsWantCall
        ) && self.section_calls == 0;
        match self.state {
            State::Object | State::DsArgs if self.name_sent => self.failures += 1,
            _ if open_call || bare_marker => {
                self.failures += 1;
                let from = if self.section_calls == 0 {
                    0
                } else {
                    self.object_start
                };
                self.content_range(from, self.buf.len(), out);
            }
            // After complete calls, an unfinished closing marker or separator: nothing lost.
            _ => {}
        }
        self.buf.clear();
        self.pos = 0;
        self.state = State::Text;
        self.held_space.clear();
    }
}
