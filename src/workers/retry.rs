//! Retries: the `--retry-*` settings, which upstream answers are retried, the backoff between
//! attempts, and the list of workers a request already tried.
//!
//! Owns [`RetryConfig`], [`is_retryable_status`] and [`TriedWorkers`]. The one retry loop that
//! uses them is the data plane's request driver (`http::proxy`); everything here is pure.

use std::time::Duration;

use crate::ids::WorkerId;
use crate::limits::RETRIES_MAX;

/// Retry settings, SMG's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryConfig {
    /// Retries after the first attempt (`--retry-max-retries`).
    pub max_retries: u32,
    /// Backoff before the first retry (`--retry-initial-backoff-ms`).
    pub initial_backoff: Duration,
    /// Largest backoff (`--retry-max-backoff-ms`).
    pub max_backoff: Duration,
    /// Growth per retry (`--retry-backoff-multiplier`).
    pub backoff_multiplier: f64,
    /// Relative jitter in `[0, 1]` (`--retry-jitter-factor`).
    pub jitter_factor: f64,
    /// `--disable-retries`.
    pub disabled: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(30_000),
            backoff_multiplier: 1.5,
            jitter_factor: 0.2,
            disabled: false,
        }
    }
}

/// Statuses SMG retries on: 408, 429, 500, 502, 503, 504.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

impl RetryConfig {
    /// Attempts one request may make: the first plus `--retry-max-retries` (1 with
    /// `--disable-retries`).
    pub fn attempts_allowed(&self) -> usize {
        if self.disabled {
            1
        } else {
            1 + (self.max_retries as usize).min(RETRIES_MAX)
        }
    }

    /// The delay before retry number `retry_index` (0-based):
    /// `min(initial * multiplier^i, max) * (1 + jitter * (2u - 1))`.
    pub fn backoff(&self, retry_index: u32, unit_random: f64) -> Duration {
        let exponent = i32::try_from(retry_index.min(RETRIES_MAX as u32)).unwrap_or(0);
        let base_ms =
            self.initial_backoff.as_secs_f64() * 1000.0 * self.backoff_multiplier.powi(exponent);
        let capped_ms = base_ms.min(self.max_backoff.as_secs_f64() * 1000.0);
        let u = if unit_random.is_finite() {
            unit_random.clamp(0.0, 1.0)
        } else {
            0.5
        };
        let jittered_ms = capped_ms * (1.0 + self.jitter_factor * (2.0 * u - 1.0));
        if !jittered_ms.is_finite() || jittered_ms <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(jittered_ms / 1000.0)
    }
}

/// The workers a request has already tried, so a retry goes to a worker that has not failed it
/// while one is eligible. One slot per attempt the retry settings allow (`RETRIES_MAX` + 1):
/// every attempt is remembered, and nothing is allocated on the data path.
#[derive(Clone, Debug)]
pub struct TriedWorkers {
    ids: [WorkerId; RETRIES_MAX + 1],
    len: usize,
}

impl Default for TriedWorkers {
    fn default() -> Self {
        TriedWorkers {
            ids: [WorkerId(0); RETRIES_MAX + 1],
            len: 0,
        }
    }
}

impl TriedWorkers {
    /// Remembers `id` as tried. The list holds one entry per allowed attempt, so it never fills
    /// before the attempts run out.
    pub fn insert(&mut self, id: WorkerId) {
        if !self.contains(id) && self.len < self.ids.len() {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    /// Whether `id` was tried.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.ids[..self.len].contains(&id)
    }

    /// How many distinct workers were tried.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no worker was tried yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every worker: each eligible one was tried, and a retry in place beats giving up.
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_statuses_are_exactly_smgs() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable_status(s));
        }
        for s in [200, 400, 401, 404, 413, 501, 505] {
            assert!(!is_retryable_status(s));
        }
    }

    #[test]
    fn backoff_progression_matches_smg_table_without_jitter() {
        let p = RetryConfig::default();
        // u = 0.5 means zero jitter: 50, 75, 112.5, 168.75, 253.125 ms.
        let ms: Vec<u128> = (0..5)
            .map(|i| p.backoff(i, 0.5).as_micros() / 1000)
            .collect();
        assert_eq!(ms, vec![50, 75, 112, 168, 253]);
    }

    #[test]
    fn backoff_is_capped_and_jitter_bounded() {
        let p = RetryConfig {
            max_backoff: Duration::from_millis(100),
            ..RetryConfig::default()
        };
        assert_eq!(p.backoff(30, 0.5), Duration::from_millis(100));
        assert_eq!(p.backoff(30, 0.0), Duration::from_millis(80));
        assert_eq!(p.backoff(30, 1.0), Duration::from_millis(120));
        assert_eq!(p.backoff(30, f64::NAN), Duration::from_millis(100));
        let zero = RetryConfig {
            initial_backoff: Duration::ZERO,
            ..RetryConfig::default()
        };
        assert_eq!(zero.backoff(3, 0.9), Duration::ZERO);
    }

    #[test]
    fn attempts_are_the_first_plus_the_retries() {
        let config = RetryConfig::default();
        assert_eq!(config.attempts_allowed(), 6);
        let off = RetryConfig {
            disabled: true,
            ..RetryConfig::default()
        };
        assert_eq!(off.attempts_allowed(), 1);
    }

    #[test]
    fn every_allowed_attempt_is_remembered() {
        // The largest setting: each of its attempts on a distinct failing worker stays excluded.
        let attempts = RetryConfig {
            max_retries: RETRIES_MAX as u32,
            ..RetryConfig::default()
        }
        .attempts_allowed();
        let mut tried = TriedWorkers::default();
        for i in 0..attempts {
            tried.insert(WorkerId(i as u16));
            tried.insert(WorkerId(i as u16));
        }
        assert_eq!(tried.len(), attempts);
        assert!((0..attempts).all(|i| tried.contains(WorkerId(i as u16))));
        assert!(!tried.contains(WorkerId(attempts as u16)));
        tried.clear();
        assert!(tried.is_empty() && !tried.contains(WorkerId(0)));
    }
}
