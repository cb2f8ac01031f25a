//! Reading a streamed completion: [`SseScanner`] splits server-sent events as bytes arrive, times
//! every event that carries generated text (first token, gaps between tokens), and keeps the last
//! event that carries usage; [`parse_usage`] reads prompt, cached and completion token counts from
//! OpenAI `usage` (`prompt_tokens_details.cached_tokens`) or SGLang `meta_info`.
//!
//! Only the final usage event is parsed as JSON; text events are recognised by a byte scan, so a
//! long stream costs the load generator little.

use serde_json::Value;
use tokio::time::Instant;

/// Token counts a response reported (each `None` when the server did not say).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// Reads `usage` or `meta_info` from one JSON document.
pub fn parse_usage(json: &[u8]) -> Option<Usage> {
    let value: Value = serde_json::from_slice(json).ok()?;
    let counts = |object: &Value, cached: &Value| Usage {
        prompt_tokens: object.get("prompt_tokens").and_then(Value::as_u64),
        cached_tokens: cached.as_u64(),
        completion_tokens: object.get("completion_tokens").and_then(Value::as_u64),
    };
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        let cached = &usage["prompt_tokens_details"]["cached_tokens"];
        let cached = if cached.is_null() {
            &usage["cached_tokens"]
        } else {
            cached
        };
        return Some(counts(usage, cached));
    }
    let meta = value.get("meta_info").filter(|m| m.is_object())?;
    Some(counts(meta, &meta["cached_tokens"]))
}

/// One server-sent event grew past the buffer maximum without ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventTooLarge;

/// Splits a byte stream into SSE events and times the ones that carry text.
pub struct SseScanner {
    pending: Vec<u8>,
    event_bytes_max: usize,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    gaps_us: Vec<u32>,
    token_events: u64,
    last_usage: Option<Vec<u8>>,
    /// An event carried a top-level `error` object: the gateway (or engine) ended the stream
    /// with an error, so the request failed even though the HTTP status was 200.
    saw_error_event: bool,
}

impl SseScanner {
    pub fn new(event_bytes_max: usize) -> Self {
        Self {
            pending: Vec::new(),
            event_bytes_max,
            first_token_at: None,
            last_token_at: None,
            gaps_us: Vec::new(),
            token_events: 0,
            last_usage: None,
            saw_error_event: false,
        }
    }

    /// Feeds bytes received at `now`. Fails when one event grows past the maximum.
    pub fn feed(&mut self, bytes: &[u8], now: Instant) -> Result<(), EventTooLarge> {
        self.pending
            .extend(bytes.iter().copied().filter(|&b| b != b'\r'));
        let mut start = 0;
        while let Some(end) = find(&self.pending[start..], b"\n\n") {
            let event = start..start + end;
            self.on_event(event, now);
            start += end + 2;
        }
        self.pending.drain(..start);
        if self.pending.len() > self.event_bytes_max {
            return Err(EventTooLarge);
        }
        Ok(())
    }

    /// Ends the stream: an unterminated last event still counts.
    pub fn finish(&mut self, now: Instant) {
        if !self.pending.iter().all(u8::is_ascii_whitespace) {
            let all = 0..self.pending.len();
            self.on_event(all, now);
        }
        self.pending.clear();
    }

    fn on_event(&mut self, range: std::ops::Range<usize>, now: Instant) {
        let event = &self.pending[range];
        let mut carries_text = false;
        let mut usage = None;
        for line in event.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                continue;
            }
            self.saw_error_event |= data.starts_with(b"{\"error\":");
            carries_text |= has_text(data);
            if find(data, b"\"usage\"").is_some() || find(data, b"\"meta_info\"").is_some() {
                usage = Some(data.to_vec());
            }
        }
        if let Some(usage) = usage {
            self.last_usage = Some(usage);
        }
        if carries_text {
            self.token_events += 1;
            if let Some(last) = self.last_token_at {
                let gap = now.saturating_duration_since(last).as_micros();
                self.gaps_us.push(gap.min(u128::from(u32::MAX)) as u32);
            }
            self.first_token_at.get_or_insert(now);
            self.last_token_at = Some(now);
        }
    }

    /// Whether an event reported an error (e.g. kvgate's event when a worker dies mid-stream).
    pub fn saw_error_event(&self) -> bool {
        self.saw_error_event
    }

    pub fn first_token_at(&self) -> Option<Instant> {
        self.first_token_at
    }

    pub fn take_gaps_us(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.gaps_us)
    }

    /// The last usage the stream reported; completion tokens default to the text events seen.
    pub fn usage(&self) -> Usage {
        let mut usage = self
            .last_usage
            .as_deref()
            .and_then(parse_usage)
            .unwrap_or_default();
        usage.completion_tokens = usage.completion_tokens.or(Some(self.token_events));
        usage
    }
}

/// True when a JSON event carries generated text: a non-empty `"content"` (chat delta) or
/// `"text"` (completions, /generate) string.
fn has_text(data: &[u8]) -> bool {
    [
        &b"\"content\":\""[..],
        b"\"content\": \"",
        b"\"text\":\"",
        b"\"text\": \"",
    ]
    .iter()
    .any(|key| {
        let mut rest = data;
        while let Some(at) = find(rest, key) {
            rest = &rest[at + key.len()..];
            if rest.first().is_some_and(|&b| b != b'"') {
                return true;
            }
        }
        false
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_text_events_and_reads_the_final_usage() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut scanner = SseScanner::new(1 << 20);
        scanner
            .feed(
                b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
                ms(1),
            )
            .unwrap();
        scanner
            .feed(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: {\"choi",
                ms(5),
            )
            .unwrap();
        scanner
            .feed(b"ces\":[{\"delta\":{\"content\":\"b\"}}]}\n\n", ms(12))
            .unwrap();
        let usage = br#"data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}"#;
        scanner.feed(usage, ms(13)).unwrap();
        scanner.feed(b"\n\ndata: [DONE]\n\n", ms(14)).unwrap();
        scanner.finish(ms(15));
        assert_eq!(scanner.first_token_at(), Some(ms(5)));
        assert_eq!(scanner.take_gaps_us(), vec![7000]);
        let usage = scanner.usage();
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.completion_tokens
            ),
            (Some(40), Some(32), Some(2))
        );
    }

    #[test]
    fn reads_sglang_meta_info() {
        let body = br#"{"text":"x y","meta_info":{"prompt_tokens":64,"cached_tokens":48,"completion_tokens":2}}"#;
        let usage = parse_usage(body).unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.cached_tokens),
            (Some(64), Some(48))
        );
        assert_eq!(parse_usage(b"{\"usage\":null}"), None);
    }

    #[test]
    fn an_error_event_marks_the_stream_failed() {
        let now = Instant::now();
        let mut scanner = SseScanner::new(1 << 20);
        scanner
            .feed(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                now,
            )
            .unwrap();
        assert!(!scanner.saw_error_event());
        let cut = b"data: {\"error\":{\"message\":\"the worker closed the stream before it finished\",\"type\":\"upstream_error\",\"code\":502}}\n\n";
        scanner.feed(cut, now).unwrap();
        scanner.finish(now);
        assert!(scanner.saw_error_event());
    }

    #[test]
    fn an_oversized_event_is_an_error() {
        let mut scanner = SseScanner::new(8);
        assert!(scanner.feed(b"data: 0123456789", Instant::now()).is_err());
    }
}
