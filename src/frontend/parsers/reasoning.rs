//! The reasoning parsers: a model's thinking between a start and an end marker (`<think>` and
//! `</think>` for Qwen3 and DeepSeek-R1), written as `reasoning_content` apart from the answer.
//! Some models begin thinking without the start marker (DeepSeek-R1, whose template puts
//! `<think>` in the prompt; Qwen3's thinking-only models): their parser starts inside.

use super::{partial_marker_len, Kind, Parsed};

/// A reasoning format: its markers and whether the output begins inside the thinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReasoningFormat {
    /// SMG's name.
    pub name: &'static str,
    start: &'static str,
    end: &'static str,
    starts_inside: bool,
}

const fn format(
    name: &'static str,
    start: &'static str,
    end: &'static str,
    starts_inside: bool,
) -> ReasoningFormat {
    ReasoningFormat {
        name,
        start,
        end,
        starts_inside,
    }
}

/// SMG's reasoning parsers by name (`--reasoning-parser`).
const FORMATS: [ReasoningFormat; 9] = [
    format("base", "<think>", "</think>", false),
    format("deepseek_r1", "<think>", "</think>", true),
    format("qwen3", "<think>", "</think>", false),
    format("qwen3_thinking", "<think>", "</think>", true),
    format("glm45", "<think>", "</think>", false),
    format("step3", "<think>", "</think>", true),
    format("minimax", "<think>", "</think>", true),
    format(
        "kimi",
        "\u{25c1}think\u{25b7}",
        "\u{25c1}/think\u{25b7}",
        false,
    ),
    format(
        "cohere_cmd",
        "<|START_THINKING|>",
        "<|END_THINKING|>",
        false,
    ),
];

/// SMG's model patterns, checked in order: the first one the lower-cased model name contains
/// picks the parser.
const MODEL_PATTERNS: [(&str, &str); 18] = [
    ("deepseek-r1", "deepseek_r1"),
    ("qwen3-thinking", "qwen3_thinking"),
    ("qwen-thinking", "qwen3_thinking"),
    ("qwen3", "qwen3"),
    ("qwen", "qwen3"),
    ("glm45", "glm45"),
    ("glm47", "glm45"),
    ("kimi", "kimi"),
    ("step3", "step3"),
    ("minimax", "minimax"),
    ("minimax-m2", "minimax"),
    ("mm-m2", "minimax"),
    ("command-r", "cohere_cmd"),
    ("command-a", "cohere_cmd"),
    ("c4ai-command", "cohere_cmd"),
    ("cohere", "cohere_cmd"),
    ("nemotron-nano", "qwen3"),
    ("nano-v3", "qwen3"),
];

impl ReasoningFormat {
    /// The parser SMG names `name`; `passthrough` is none.
    pub fn by_name(name: &str) -> Result<Option<ReasoningFormat>, String> {
        if name == "passthrough" {
            return Ok(None);
        }
        FORMATS
            .iter()
            .find(|f| f.name == name)
            .map(|f| Some(*f))
            .ok_or_else(|| {
                let names: Vec<&str> = FORMATS.iter().map(|f| f.name).collect();
                format!(
                    "unknown reasoning parser {name:?}: one of passthrough, {}",
                    names.join(", ")
                )
            })
    }

    /// SMG's default for `model` (none when no pattern matches).
    pub fn for_model(model: &str) -> Option<ReasoningFormat> {
        let lower = model.to_lowercase();
        let (_, name) = MODEL_PATTERNS.iter().find(|(p, _)| lower.contains(p))?;
        Self::by_name(name).ok().flatten()
    }
}

/// Where a reasoning parser is in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Before the thinking (a start marker may come).
    Before,
    /// Inside; `fresh` while nothing of the thinking came yet (a start marker is dropped).
    Inside { fresh: bool },
    /// After the end marker: everything is answer.
    After,
}

/// One choice's reasoning parser.
#[derive(Debug)]
pub(super) struct ReasoningParser {
    format: ReasoningFormat,
    place: Place,
    /// Text held back: a marker's possible beginning.
    held: String,
    /// Whitespace right after a marker is dropped (the templates put a newline there).
    skip_space: bool,
    work: String,
}

impl ReasoningParser {
    pub(super) fn new(format: ReasoningFormat) -> ReasoningParser {
        ReasoningParser {
            format,
            place: match format.starts_inside {
                true => Place::Inside { fresh: true },
                false => Place::Before,
            },
            held: String::new(),
            skip_space: format.starts_inside,
            work: String::new(),
        }
    }

    /// Splits `text` into thinking (events in `out`) and the rest (appended to `normal`);
    /// `end`: the output ended, nothing more is held.
    pub(super) fn push(&mut self, text: &str, end: bool, out: &mut Parsed, normal: &mut String) {
        if self.held.is_empty() && !self.skip_space {
            // The common cases, without copying the text: the answer after the thinking, or
            // text with no marker's first byte in it.
            let marker = match self.place {
                Place::After => {
                    normal.push_str(text);
                    return;
                }
                Place::Before => self.format.start,
                Place::Inside { fresh: false } => self.format.end,
                Place::Inside { fresh: true } => "",
            };
            if !marker.is_empty() && !text.as_bytes().contains(&marker.as_bytes()[0]) {
                match self.place {
                    Place::Before => normal.push_str(text),
                    _ => out.push(Kind::Reasoning, text),
                }
                return;
            }
        }
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.push_str(&self.held);
        work.push_str(text);
        self.held.clear();
        let mut rest: &str = &work;
        loop {
            if self.skip_space {
                rest = rest.trim_start();
                if rest.is_empty() {
                    break;
                }
                self.skip_space = false;
            }
            match self.place {
                Place::After => {
                    normal.push_str(rest);
                    break;
                }
                Place::Before => match rest.find(self.format.start) {
                    Some(at) => {
                        normal.push_str(&rest[..at]);
                        rest = &rest[at + self.format.start.len()..];
                        self.place = Place::Inside { fresh: false };
                        self.skip_space = true;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            partial_marker_len(rest, self.format.start)
                        };
                        normal.push_str(&rest[..rest.len() - keep]);
                        self.held.push_str(&rest[rest.len() - keep..]);
                        break;
                    }
                },
                Place::Inside { fresh: true } => {
                    // A model that starts inside may still write the start marker first.
                    if let Some(after) = rest.strip_prefix(self.format.start) {
                        rest = after;
                        self.skip_space = true;
                    } else if !end && self.format.start.starts_with(rest) {
                        self.held.push_str(rest);
                        break;
                    }
                    self.place = Place::Inside { fresh: false };
                }
                Place::Inside { fresh: false } => match rest.find(self.format.end) {
                    Some(at) => {
                        out.push(Kind::Reasoning, &rest[..at]);
                        rest = &rest[at + self.format.end.len()..];
                        self.place = Place::After;
                        self.skip_space = true;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            partial_marker_len(rest, self.format.end)
                        };
                        out.push(Kind::Reasoning, &rest[..rest.len() - keep]);
                        self.held.push_str(&rest[rest.len() - keep..]);
                        break;
                    }
                },
            }
        }
        self.work = work;
    }
}
