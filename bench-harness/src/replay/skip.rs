//! Why a source skipped a line: [`SkipKind`] and [`Skip`] (one line's reason), and [`Warnings`]
//! (a source's count of them, by kind, with the first few kept by name). A leaf of `replay`: the
//! readers ([`super::captured`], [`super::token_ids`], [`super::trace`], [`super::sharegpt`])
//! and [`super::workload`] all use it, so none of them has to import another for it.

use std::collections::BTreeMap;

use super::limits::WARNINGS_KEPT_MAX;

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
