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
//! first in the text, and of those the longest (the one that starts first), then the first
//! listed. Matching is Knuth-Morris-Pratt per stop string, so a step costs its new bytes times
//! the number of stops, never the stops' lengths squared.

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
    /// Each string's failure function (Knuth-Morris-Pratt): for each prefix length `q`, the
    /// length of the longest proper prefix of it that is also its suffix.
    fallbacks: Vec<Vec<u32>>,
    token_ids: Vec<u32>,
    keep_stop: bool,
}

/// The KMP failure function of `stop`.
fn fallback_of(stop: &[u8]) -> Vec<u32> {
    let mut fail = vec![0u32; stop.len()];
    let mut q = 0usize;
    for i in 1..stop.len() {
        while q > 0 && stop[i] != stop[q] {
            q = fail[q - 1] as usize;
        }
        if stop[i] == stop[q] {
            q += 1;
        }
        fail[i] = q as u32;
    }
    fail
}

impl StopSet {
    /// Stops from a request: `strings` (an empty one never matches), `token_ids` (the client's
    /// `stop_token_ids` and, unless `ignore_eos`, the model's EOS IDs), and whether a matched
    /// string stays in the text.
    pub fn new(strings: Vec<String>, token_ids: Vec<u32>, keep_stop: bool) -> StopSet {
        let fallbacks = strings.iter().map(|s| fallback_of(s.as_bytes())).collect();
        StopSet {
            strings,
            fallbacks,
            token_ids,
            keep_stop,
        }
    }

    /// The stop strings, in the request's order ([`MatchedStop::Text`] indexes them).
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

    /// Advances stop `index`'s matched length `q` by `byte`; returns the new length.
    fn advance(&self, index: usize, mut q: usize, byte: u8) -> usize {
        let stop = self.strings[index].as_bytes();
        let fail = &self.fallbacks[index];
        if q == stop.len() {
            q = fail[q - 1] as usize;
        }
        while q > 0 && stop[q] != byte {
            q = fail[q - 1] as usize;
        }
        if stop.get(q) == Some(&byte) {
            q += 1;
        }
        q
    }
}

/// What [`StopMatcher::push`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopState {
    /// No stop yet.
    Running,
    /// A stop string matched: the sequence ends; nothing after it is written.
    Stopped(MatchedStop),
}

/// One sequence's stop-string state: the text held back because it could begin a stop, and
/// how much of each stop string the text so far ends with, so each byte is looked at once per
/// stop (the work per step is its new bytes times the stops, whatever the stops' lengths).
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    held: String,
    /// Per stop string: the length of the longest suffix of the text that begins it.
    matched_len: Vec<usize>,
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
        self.matched_len.resize(stops.strings.len(), 0);
        let base = self.held.len();
        self.held.push_str(text);
        for (at, &byte) in text.as_bytes().iter().enumerate() {
            // Every stop that ends at this byte; the longest (then the first listed) wins.
            let mut found: Option<(usize, usize)> = None;
            for (index, stop) in stops.strings.iter().enumerate() {
                if stop.is_empty() {
                    continue;
                }
                let q = stops.advance(index, self.matched_len[index], byte);
                self.matched_len[index] = q;
                if q == stop.len() && found.is_none_or(|(_, len)| q > len) {
                    found = Some((index, q));
                }
            }
            if let Some((index, len)) = found {
                let end = base + at + 1;
                let cut = if stops.keep_stop { end } else { end - len };
                out.push_str(&self.held[..cut]);
                self.held.clear();
                self.matched = Some(MatchedStop::Text(index));
                return StopState::Stopped(MatchedStop::Text(index));
            }
        }
        // The longest partial match starts at a character boundary: a stop's first byte is
        // never a continuation byte.
        let keep = self.matched_len.iter().copied().max().unwrap_or(0);
        let release = self.held.len() - keep.min(self.held.len());
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
