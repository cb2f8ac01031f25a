//! The cost model: how long one simulated engine step takes, in simulated microseconds.
//!
//! Defaults are the published mocker figures for a mid-size model on one GPU: a prefill step over
//! `T` uncached tokens takes `4.21e-7·T² + 1.52e-2·T + 16.5` ms, a decode step at KV usage `p`
//! (0..=1) takes `max(1, -25.74·p² + 54.01·p + 5.74)` ms. Every coefficient is a flag of
//! `sim-engine`; [`CostModel`] is plain data so tests can build any curve.
//!
//! The decode curve's usage is the KV tokens the running requests hold over the pool the curve
//! was published for (`decode_pool_tokens`: the mocker's default pool, 16,384 blocks of 64
//! tokens, 1,048,576 tokens), not over the simulated engine's own cache. A decode step reads the
//! model's weights and the batch's KV: its time grows with the KV tokens read, whatever the
//! pool they sit in. Priced over the engine's own cache, a demo engine of 32,768 tokens charged
//! a batch of six 2k-token requests (13k tokens) as 40% of a full GPU's KV (23.5 ms a step
//! instead of 6.4), so any momentary pile-up of requests on one engine (a cache-aware router's
//! groups, never round robin's strict turns) slowed every token of it 2-4x: an artefact of
//! shrinking the caches to make routing matter, not an engine's behaviour.

/// Prefill and decode step costs (coefficients in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Quadratic coefficient of the prefill cost, ms per token².
    pub prefill_quadratic_ms: f64,
    /// Linear coefficient of the prefill cost, ms per token.
    pub prefill_linear_ms: f64,
    /// Constant part of a prefill step, ms.
    pub prefill_constant_ms: f64,
    /// Quadratic coefficient of the decode cost in KV usage, ms.
    pub decode_quadratic_ms: f64,
    /// Linear coefficient of the decode cost in KV usage, ms.
    pub decode_linear_ms: f64,
    /// Decode step cost at zero KV usage, ms.
    pub decode_constant_ms: f64,
    /// Floor of a decode step, ms (the fitted parabola turns down near full usage).
    pub decode_min_ms: f64,
    /// KV tokens of the pool whose usage the decode curve takes (usage = KV tokens in use over
    /// this; at least 1).
    pub decode_pool_tokens: u64,
}

/// The pool the published decode curve's usage is a fraction of: the mocker's default KV cache,
/// 16,384 blocks of 64 tokens.
pub const DECODE_POOL_TOKENS_DEFAULT: u64 = 16_384 * 64;

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            prefill_quadratic_ms: 4.21e-7,
            prefill_linear_ms: 1.52e-2,
            prefill_constant_ms: 16.5,
            decode_quadratic_ms: -25.74,
            decode_linear_ms: 54.01,
            decode_constant_ms: 5.74,
            decode_min_ms: 1.0,
            decode_pool_tokens: DECODE_POOL_TOKENS_DEFAULT,
        }
    }
}

impl CostModel {
    /// Milliseconds of a prefill step computing `uncached_tokens` tokens.
    pub fn prefill_ms(&self, uncached_tokens: u64) -> f64 {
        let t = uncached_tokens as f64;
        (self.prefill_quadratic_ms * t * t + self.prefill_linear_ms * t + self.prefill_constant_ms)
            .max(0.0)
    }

    /// Milliseconds of a decode step at KV usage `usage` (clamped to 0..=1).
    pub fn decode_ms(&self, usage: f64) -> f64 {
        let p = usage.clamp(0.0, 1.0);
        let ms =
            self.decode_quadratic_ms * p * p + self.decode_linear_ms * p + self.decode_constant_ms;
        ms.max(self.decode_min_ms).max(0.0)
    }

    /// Milliseconds of a decode step whose running requests hold `kv_tokens` KV tokens: the curve
    /// at their share of `decode_pool_tokens`.
    pub fn decode_ms_holding(&self, kv_tokens: u64) -> f64 {
        self.decode_ms(self.usage_of(kv_tokens))
    }

    /// The decode curve's usage for `kv_tokens` in use.
    pub fn usage_of(&self, kv_tokens: u64) -> f64 {
        kv_tokens as f64 / self.decode_pool_tokens.max(1) as f64
    }

    /// [`Self::decode_ms_holding`] in whole simulated microseconds (at least 1).
    pub fn decode_us_holding(&self, kv_tokens: u64) -> u64 {
        ms_to_us(self.decode_ms_holding(kv_tokens))
    }

    /// [`Self::prefill_ms`] in whole simulated microseconds (at least 1, so time always advances).
    pub fn prefill_us(&self, uncached_tokens: u64) -> u64 {
        ms_to_us(self.prefill_ms(uncached_tokens))
    }

    /// [`Self::decode_ms`] in whole simulated microseconds (at least 1).
    pub fn decode_us(&self, usage: f64) -> u64 {
        ms_to_us(self.decode_ms(usage))
    }
}

fn ms_to_us(ms: f64) -> u64 {
    // Saturating float-to-int cast; costs are finite and non-negative by construction.
    ((ms * 1000.0).round() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn prefill_follows_the_published_polynomial() {
        let cost = CostModel::default();
        assert!(close(cost.prefill_ms(0), 16.5));
        assert!(close(cost.prefill_ms(1000), 4.21e-1 + 15.2 + 16.5));
        let t = 8192.0_f64;
        assert!(close(
            cost.prefill_ms(8192),
            4.21e-7 * t * t + 1.52e-2 * t + 16.5
        ));
        assert_eq!(cost.prefill_us(1000), 32_121);
    }

    #[test]
    fn prefill_grows_with_uncached_tokens() {
        let cost = CostModel::default();
        let mut previous = 0.0;
        for tokens in [0, 16, 512, 4096, 32768, 131072] {
            let ms = cost.prefill_ms(tokens);
            assert!(ms > previous, "{tokens} tokens: {ms} ms");
            previous = ms;
        }
    }

    #[test]
    fn decode_follows_the_parabola_with_a_floor() {
        let cost = CostModel::default();
        assert!(close(cost.decode_ms(0.0), 5.74));
        assert!(close(
            cost.decode_ms(0.5),
            -25.74 * 0.25 + 54.01 * 0.5 + 5.74
        ));
        assert!(close(cost.decode_ms(2.0), cost.decode_ms(1.0)));
        assert!(close(cost.decode_ms(-1.0), 5.74));
        let steep = CostModel {
            decode_constant_ms: -100.0,
            ..CostModel::default()
        };
        assert!(close(steep.decode_ms(0.0), 1.0));
        assert!(cost.decode_ms(0.9) > cost.decode_ms(0.1));
    }

    #[test]
    fn decode_is_priced_by_the_kv_tokens_held_over_the_published_pool_not_the_engines_cache() {
        let cost = CostModel::default();
        assert_eq!(cost.decode_pool_tokens, 1_048_576);
        // Six 2,176-token requests: 1.2% of the published pool, whatever cache holds them.
        let held = 6 * 2176;
        let p = held as f64 / 1_048_576.0;
        assert!(close(
            cost.decode_ms_holding(held),
            -25.74 * p * p + 54.01 * p + 5.74
        ));
        assert!(cost.decode_ms_holding(held) < 6.5);
        assert!(cost.decode_ms_holding(held) > cost.decode_ms_holding(2176));
        // A full pool costs what full usage costs; more than it, no more.
        assert!(close(
            cost.decode_ms_holding(1_048_576),
            cost.decode_ms(1.0)
        ));
        assert!(close(
            cost.decode_ms_holding(4_000_000),
            cost.decode_ms(1.0)
        ));
        let small = CostModel {
            decode_pool_tokens: 32_768,
            ..CostModel::default()
        };
        assert!(close(
            small.decode_ms_holding(held),
            small.decode_ms(held as f64 / 32_768.0)
        ));
    }
}
