//! How much new prefix each worker was given lately, as this data core saw it: the prompt
//! tokens of the cache misses it placed on each worker, each weighing half as much every
//! [`PLACEMENT_HALF_LIFE_MS`]. cache_aware's miss branch reads it: a new prefix brings the
//! requests that will share it to whichever worker takes it, so among workers that would start
//! the request about as soon, the one given the least should take the next.
//!
//! Placements, not dispatches: a prefix placed a moment ago has drawn one request but will draw
//! as many as an old one, so counting traffic lags and overshoots (the worker that drew the
//! fewest requests early takes every new prefix until its traffic catches up: max/mean 1.34 and
//! 1.52 on the shared-prefix benchmark, against 1.19 without it).
//!
//! Weighed by prompt tokens, not counted: a conversation's later turns resend and keep in cache
//! what its first prompt started, so a long new prompt brings more work than a short one
//! (counting prompts let the long ones gather: Mooncake at six times its load, max/mean 1.17
//! on average against 1.09 weighed).
//!
//! Per core and unshared: every core sees a sample of the same arrivals (the listener spreads
//! connections), so no counter crosses cores, and a core's own burst counts at once.

use crate::ids::WorkerId;

/// The age at which a placement weighs half: about how long a prefix stays useful in an engine's
/// cache under churn, so old placements (likely evicted since) stop weighing.
pub const PLACEMENT_HALF_LIFE_MS: u64 = 60_000;

#[derive(Clone, Copy, Debug, Default)]
struct Decayed {
    /// Decayed prompt tokens placed, as of `at_ms`.
    tokens: f64,
    at_ms: u64,
}

/// Decayed prompt tokens of new prefixes, one sum per worker slot.
#[derive(Debug, Default)]
pub struct Placements {
    sums: Vec<Decayed>,
}

fn decayed(sum: Decayed, now_ms: u64) -> f64 {
    let age = now_ms.saturating_sub(sum.at_ms) as f64;
    sum.tokens * (-age / PLACEMENT_HALF_LIFE_MS as f64).exp2()
}

impl Placements {
    /// Adds a new prefix of `tokens` prompt tokens placed on `worker` at `now_ms`.
    pub fn add(&mut self, worker: WorkerId, now_ms: u64, tokens: u64) {
        let slot = worker.index();
        if self.sums.len() <= slot {
            self.sums.resize(slot + 1, Decayed::default());
        }
        let entry = &mut self.sums[slot];
        *entry = Decayed {
            tokens: decayed(*entry, now_ms) + tokens as f64,
            at_ms: now_ms.max(entry.at_ms),
        };
    }

    /// The decayed tokens of `worker` at `now_ms` (0 for a worker never given a prefix).
    pub fn of(&self, worker: WorkerId, now_ms: u64) -> f64 {
        self.sums
            .get(worker.index())
            .map_or(0.0, |entry| decayed(*entry, now_ms))
    }

    /// Forgets `worker` (its slot was reused by a new worker).
    pub fn forget(&mut self, worker: WorkerId) {
        if let Some(entry) = self.sums.get_mut(worker.index()) {
            *entry = Decayed::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_decay_by_half_per_half_life() {
        let mut placements = Placements::default();
        let (a, b) = (WorkerId(0), WorkerId(3));
        for _ in 0..4 {
            placements.add(a, 1_000, 100);
        }
        placements.add(b, 1_000, 2_000);
        assert_eq!(placements.of(a, 1_000), 400.0);
        assert!((placements.of(a, 1_000 + PLACEMENT_HALF_LIFE_MS) - 200.0).abs() < 1e-9);
        assert!((placements.of(b, 1_000 + 2 * PLACEMENT_HALF_LIFE_MS) - 500.0).abs() < 1e-9);
        assert_eq!(
            placements.of(WorkerId(2), 5_000),
            0.0,
            "never given a prefix"
        );
        assert_eq!(placements.of(WorkerId(9), 5_000), 0.0, "beyond the slots");
        // A later placement decays the old sum first.
        placements.add(b, 1_000 + PLACEMENT_HALF_LIFE_MS, 10);
        assert!((placements.of(b, 1_000 + PLACEMENT_HALF_LIFE_MS) - 1_010.0).abs() < 1e-9);
        placements.forget(a);
        assert_eq!(placements.of(a, 1_000), 0.0);
    }
}
