//! The cost model: how long one simulated engine step takes, in simulated microseconds.
//!
//! Defaults are the published mocker figures for a mid-size model on one GPU: a prefill step over
//! `T` uncached tokens takes `4.21e-7·T² + 1.52e-2·T + 16.5` ms, a decode step at KV usage `p`
//! (0..=1) takes `max(1, -25.74·p² + 54.01·p + 5.74)` ms. Every coefficient is a flag of
//! `sim-engine`; [`CostModel`] is plain data so tests can build any curve.

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
}

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
}
