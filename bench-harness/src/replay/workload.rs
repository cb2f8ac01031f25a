//! What a replay sends, one request at a time: [`WorkItem`] and its [`Content`], the [`Workload`]
//! trait every source (Mooncake JSONL, Azure CSV, captured request logs, ShareGPT conversations,
//! token-id traces, the shared-prefix generator) implements; how a source counts the lines it had
//! to skip is [`super::skip`]. Sources stream: none holds more than its current row (the ShareGPT
//! reader: its conversations in progress).

use super::captured::CapturedRequest;
use super::content::Prompt;
use super::conversation::ChatPrompt;
use super::skip::Warnings;
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
