//! Stop conditions of one output sequence: stop strings matched across chunk boundaries, stop
//! token IDs and EOS, and the text trimmed as SGLang and vLLM trim it.
//!
//! Key types: [`StopSet`] (a request's stops, shared by its `n` sequences) and [`StopMatcher`]
//! (one sequence's state). Text goes in as the detokenizer writes it; out comes the text the
//! client may see now. Text is held back only while its end could still begin a stop string;
//! a stop is found as soon as its last character arrives, and the output ends just before it
//! (or just after it when [`StopSet::keep_stop`], SGLang's `no_stop_trim`, vLLM's
//! `include_stop_str_in_output`).
//!
//! The match found is the same however the text is cut into chunks: the stop whose end comes
//! first in the text, and of those the longest (the one that starts first).

/// Which stop ended a sequence (`matched_stop` of SGLang's answers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchedStop {
    /// The stop string of this index in the request's list.
    Text(usize),
    /// A stop token ID, or EOS.
    Token(u32),
}

/// A request's stop strings and stop tokens.
#[derive(Clone, Debug, Default)]
pub struct StopSet {
    strings: Vec<String>,
    token_ids: Vec<u32>,
    keep_stop: bool,
}

impl StopSet {
    /// Stops from a request: `strings` (none empty), `token_ids` (the client's `stop_token_ids`
    /// and, unless `ignore_eos`, the model's EOS IDs), and whether a matched string stays in
    /// the text.
    pub fn new(strings: Vec<String>, token_ids: Vec<u32>, keep_stop: bool) -> StopSet {
        let strings: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        StopSet {
            strings,
            token_ids,
            keep_stop,
        }
    }

    /// The stop strings.
    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// Whether a matched stop string stays in the text.
    pub fn keep_stop(&self) -> bool {
        self.keep_stop
    }

    /// The stop token `id` ends the sequence on, if it is one (its text is not written: the
    /// engines' stop tokens are special tokens).
    pub fn token(&self, id: u32) -> Option<MatchedStop> {
        self.token_ids
            .contains(&id)
            .then_some(MatchedStop::Token(id))
    }

    /// The first stop in `text` (earliest end, then longest), as (start, end, index).
    fn find(&self, text: &str, new_from: usize) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (index, stop) in self.strings.iter().enumerate() {
            // Only matches ending past `new_from` are new.
            let search_from = new_from.saturating_sub(stop.len() - 1);
            let search_from = floor_char_boundary(text, search_from);
            if let Some(pos) = text[search_from..].find(stop.as_str()) {
                let start = search_from + pos;
                let end = start + stop.len();
                let better = match best {
                    None => true,
                    Some((b_start, b_end, _)) => end < b_end || (end == b_end && start < b_start),
                };
                if better {
                    best = Some((start, end, index));
                }
            }
        }
        best
    }

    /// The length of the longest suffix of `text` that is a proper prefix of a stop string.
    fn partial_suffix(&self, text: &str) -> usize {
        let mut held = 0;
        for stop in &self.strings {
            let most = (stop.len() - 1).min(text.len());
            for len in (held + 1..=most).rev() {
                let at = text.len() - len;
                if text.is_char_boundary(at) && stop.as_bytes().starts_with(&text.as_bytes()[at..])
                {
                    held = len;
                    break;
                }
            }
        }
        held
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// What [`StopMatcher::push`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopState {
    /// No stop yet.
    Running,
    /// A stop string matched: the sequence ends; nothing after it is written.
    Stopped(MatchedStop),
}

/// One sequence's stop-string state: the text held back because it could begin a stop.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    held: String,
    matched: Option<MatchedStop>,
}

impl StopMatcher {
    /// A matcher with nothing held.
    pub fn new() -> StopMatcher {
        StopMatcher::default()
    }

    /// Adds decoded `text`; appends to `out` what the client may see now. After a stop has
    /// matched, more text is ignored.
    pub fn push(&mut self, stops: &StopSet, text: &str, out: &mut String) -> StopState {
        if let Some(matched) = &self.matched {
            return StopState::Stopped(matched.clone());
        }
        if stops.strings.is_empty() {
            out.push_str(text);
            return StopState::Running;
        }
        let old_len = self.held.len();
        self.held.push_str(text);
        // A stop ending in the new text may begin in the held text.
        if let Some((start, end, index)) = stops.find(&self.held, old_len) {
            let cut = if stops.keep_stop { end } else { start };
            out.push_str(&self.held[..cut]);
            self.held.clear();
            self.matched = Some(MatchedStop::Text(index));
            return StopState::Stopped(MatchedStop::Text(index));
        }
        let keep = stops.partial_suffix(&self.held);
        let release = self.held.len() - keep;
        out.push_str(&self.held[..release]);
        self.held.drain(..release);
        StopState::Running
    }

    /// The sequence ended without a stop string: appends the held text to `out`.
    pub fn finish(&mut self, out: &mut String) {
        if self.matched.is_none() {
            out.push_str(&self.held);
        }
        self.held.clear();
    }

    /// The stop string that matched, if one has.
    pub fn matched(&self) -> Option<&MatchedStop> {
        self.matched.as_ref()
    }
}

#[cfg(test)]
mod tests;
