//! What a replay sends, one request at a time: [`WorkItem`] and its [`Content`], the [`Workload`]
//! trait every source (Mooncake JSONL, Azure CSV, captured request logs, ShareGPT conversations,
//! token-id traces, the shared-prefix generator) implements, and [`Warnings`], how a source counts
//! the lines it had to skip, by [`SkipKind`]. Sources stream: none holds more than its current
//! row (the ShareGPT reader: its conversations in progress).

use std::collections::BTreeMap;

use super::captured::CapturedRequest;
use super::content::Prompt;
use super::conversation::ChatPrompt;
use super::limits::WARNINGS_KEPT_MAX;
use super::token_ids::TokenIds;

/// One request of a workload, before it is given a form (chat, /generate, ...) and a send time.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkItem {
    /// Unique within the run (and across `--loop` passes).
    pub id: u64,
    /// Arrival time in the trace, in milliseconds from the trace's first row (later passes of
    /// `--loop` continue after the previous pass); `None` for sources without timestamps.
    pub arrival_ms: Option<f64>,
    pub content: Content,
    /// Output length to ask for; a captured request keeps the one in its body (this is then its
    /// value there, or 0 when the body names none).
    pub output_tokens: u32,
    /// What picks the request's tenant (cache salt / LoRA) when tenants are enabled: requests with
    /// the same key always share a tenant, so prefix sharing within a key survives partitioning.
    pub tenant_key: u64,
}

/// What a request carries.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// Seeded segments (Mooncake, Azure, the generator), written as words or ids as `--form` says.
    Generated(Prompt),
    /// Real text as chat messages: a ShareGPT conversation up to one of its answers, or a token-id
    /// prompt decoded by `--tokenizer-path` (one user message).
    Chat(ChatPrompt),
    /// Real token ids (a token-id trace without `--tokenizer-path`).
    TokenIds(TokenIds),
    /// A captured request, sent to its own endpoint with its own body.
    Captured(CapturedRequest),
}

impl WorkItem {
    /// The seeded prompt of a generated item.
    pub fn generated(&self) -> Option<&Prompt> {
        match &self.content {
            Content::Generated(prompt) => Some(prompt),
            _ => None,
        }
    }

    /// The prompt length in tokens when the replay knows it (generated prompts and token ids); the
    /// report uses it when a response does not say.
    pub fn prompt_tokens_known(&self) -> Option<u64> {
        match &self.content {
            Content::Generated(prompt) => Some(prompt.len_tokens()),
            Content::TokenIds(ids) => Some(ids.len() as u64),
            Content::Chat(_) | Content::Captured(_) => None,
        }
    }
}

/// A stream of requests.
pub trait Workload: Send {
    /// The next request, or `None` when the workload is exhausted.
    fn next_item(&mut self) -> Option<WorkItem>;
    /// Lines skipped so far, and why.
    fn warnings(&self) -> &Warnings;
}

/// Why a line (or a ShareGPT record) was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipKind {
    /// Could not be read: an I/O error, or bytes that are not UTF-8.
    Unreadable,
    /// Longer than the format's byte maximum (`limits.rs`); skipped without being buffered whole.
    TooLong,
    /// Not the format's shape: not JSON, a missing or mistyped field, a broken CSV row.
    Malformed,
    /// The right shape with a value outside its bound: a length, a count, a time, a token id.
    OutOfBounds,
    /// Valid but nothing to send: an unknown endpoint or role, a conversation without an answer.
    Unsupported,
}

impl SkipKind {
    /// The key under which the report counts it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unreadable => "unreadable",
            Self::TooLong => "too_long",
            Self::Malformed => "malformed",
            Self::OutOfBounds => "out_of_bounds",
            Self::Unsupported => "unsupported",
        }
    }
}

/// Why one line cannot become a request: its kind, and what exactly was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    pub kind: SkipKind,
    pub detail: String,
}

impl Skip {
    pub fn new(kind: SkipKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(SkipKind::Malformed, detail)
    }

    pub fn out_of_bounds(detail: impl Into<String>) -> Self {
        Self::new(SkipKind::OutOfBounds, detail)
    }

    pub fn unsupported(detail: impl Into<String>) -> Self {
        Self::new(SkipKind::Unsupported, detail)
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.detail)
    }
}

/// Malformed input skipped by a source: every skip is counted (in all and by kind), the first
/// few are kept by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Warnings {
    pub skipped_lines: u64,
    /// Skips by [`SkipKind::label`].
    pub skipped_by_kind: BTreeMap<String, u64>,
    /// One message per kept warning, each naming the file and line number.
    pub messages: Vec<String>,
}

impl Warnings {
    /// Counts a skipped line, keeps its message if there is room, and prints it to stderr.
    pub fn skip_line(&mut self, source: &str, line_number: u64, skip: &Skip) {
        self.skipped_lines += 1;
        *self
            .skipped_by_kind
            .entry(skip.kind.label().to_string())
            .or_default() += 1;
        if self.messages.len() < WARNINGS_KEPT_MAX {
            let message = format!("{source}:{line_number}: skipped: {skip}");
            eprintln!("warning: {message}");
            self.messages.push(message);
        }
    }
}

/// A workload cut after `max` requests.
pub struct Limited<W> {
    inner: W,
    left: u64,
}

impl<W: Workload> Limited<W> {
    pub fn new(inner: W, max: u64) -> Self {
        Self { inner, left: max }
    }
}

impl<W: Workload> Workload for Limited<W> {
    fn next_item(&mut self) -> Option<WorkItem> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.inner.next_item()
    }

    fn warnings(&self) -> &Warnings {
        self.inner.warnings()
    }
}

impl Workload for Box<dyn Workload> {
    fn next_item(&mut self) -> Option<WorkItem> {
        (**self).next_item()
    }

    fn warnings(&self) -> &Warnings {
        (**self).warnings()
    }
}
