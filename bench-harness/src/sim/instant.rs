//! `--instant` mode: answers without simulated timing, for proxy benchmarks where the engine
//! must cost next to nothing. [`InstantCache`] keeps rendered answers by endpoint and body hash
//! (answers are a pure function of the body), so a load generator cycling through a few bodies
//! costs one hash lookup per request after the first of each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::api::Endpoint;

/// Most cached answers per engine: load generators cycle through a handful of bodies; when
/// full, the cache is cleared (bounded memory, no LRU bookkeeping on the hot path).
pub const INSTANT_CACHE_ENTRIES_MAX: usize = 1024;

/// Larger answers are not cached: bounds the cache to 1024 × 64 KiB = 64 MiB per engine.
pub const INSTANT_CACHE_ANSWER_BYTES_MAX: usize = 64 << 10;

/// A rendered answer: a JSON body or the SSE chunks of a stream.
#[derive(Debug, Clone)]
pub enum InstantAnswer {
    Json(Bytes),
    Sse(Arc<[Bytes]>),
}

impl InstantAnswer {
    fn len_bytes(&self) -> usize {
        match self {
            InstantAnswer::Json(body) => body.len(),
            InstantAnswer::Sse(chunks) => chunks.iter().map(Bytes::len).sum(),
        }
    }
}

/// Rendered answers by (endpoint, xxh3 of the request body).
#[derive(Debug, Default)]
pub struct InstantCache {
    answers: Mutex<HashMap<(Endpoint, u64), InstantAnswer>>,
}

impl InstantCache {
    /// The cached answer for this body, if any.
    pub fn get(&self, endpoint: Endpoint, body_hash: u64) -> Option<InstantAnswer> {
        let answers = self.answers.lock().ok()?;
        answers.get(&(endpoint, body_hash)).cloned()
    }

    /// Remembers an answer (unless it is too large).
    pub fn insert(&self, endpoint: Endpoint, body_hash: u64, answer: &InstantAnswer) {
        if answer.len_bytes() > INSTANT_CACHE_ANSWER_BYTES_MAX {
            return;
        }
        if let Ok(mut answers) = self.answers.lock() {
            if answers.len() >= INSTANT_CACHE_ENTRIES_MAX {
                answers.clear();
            }
            answers.insert((endpoint, body_hash), answer.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_kept_by_endpoint_and_body_and_bounded() {
        let cache = InstantCache::default();
        let answer = InstantAnswer::Json(Bytes::from_static(b"{}"));
        cache.insert(Endpoint::Generate, 1, &answer);
        assert!(cache.get(Endpoint::Generate, 1).is_some());
        assert!(cache.get(Endpoint::Completions, 1).is_none());
        assert!(cache.get(Endpoint::Generate, 2).is_none());
        let huge = InstantAnswer::Json(Bytes::from(vec![b' '; INSTANT_CACHE_ANSWER_BYTES_MAX + 1]));
        cache.insert(Endpoint::Generate, 3, &huge);
        assert!(cache.get(Endpoint::Generate, 3).is_none());
        for hash in 0..INSTANT_CACHE_ENTRIES_MAX as u64 + 10 {
            cache.insert(Endpoint::Messages, hash, &answer);
        }
        assert!(cache.answers.lock().unwrap().len() <= INSTANT_CACHE_ENTRIES_MAX);
    }
}
