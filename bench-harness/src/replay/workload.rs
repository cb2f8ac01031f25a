//! What a replay sends, one request at a time: [`WorkItem`], the [`Workload`] trait every source
//! (Mooncake JSONL, Azure CSV, the shared-prefix generator) implements, and [`Warnings`], how a
//! source counts the lines it had to skip. Sources stream: none holds more than its current row.

use super::content::Prompt;
use super::limits::WARNINGS_KEPT_MAX;

/// One request of a workload, before it is given a form (chat, /generate, ...) and a send time.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkItem {
    /// Unique within the run (and across `--loop` passes).
    pub id: u64,
    /// Arrival time in the trace, in milliseconds from the trace's first row (later passes of
    /// `--loop` continue after the previous pass); `None` for sources without timestamps.
    pub arrival_ms: Option<f64>,
    pub prompt: Prompt,
    pub output_tokens: u32,
    /// What picks the request's tenant (cache salt / LoRA) when tenants are enabled: requests with
    /// the same key always share a tenant, so prefix sharing within a key survives partitioning.
    pub tenant_key: u64,
}

/// A stream of requests.
pub trait Workload: Send {
    /// The next request, or `None` when the workload is exhausted.
    fn next_item(&mut self) -> Option<WorkItem>;
    /// Lines skipped so far, and why.
    fn warnings(&self) -> &Warnings;
}

/// Malformed input skipped by a source: every skip is counted, the first few are kept by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Warnings {
    pub skipped_lines: u64,
    /// One message per kept warning, each naming the file and line number.
    pub messages: Vec<String>,
}

impl Warnings {
    /// Counts a skipped line, keeps its message if there is room, and prints it to stderr.
    pub fn skip_line(&mut self, source: &str, line_number: u64, why: &str) {
        self.skipped_lines += 1;
        if self.messages.len() < WARNINGS_KEPT_MAX {
            let message = format!("{source}:{line_number}: skipped malformed line: {why}");
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
