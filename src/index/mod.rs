//! The prefix index: string tree (characters), token tree (whole pages of `--block-size` tokens),
//! keyed by model and partition namespace. Data cores read it lock-free; only the control core
//! writes it.

use crate::workers::WorkerId;

/// The most tenants a lookup returns (the spec's "up to eight tenants of the deepest matched node").
pub const MATCH_TENANTS_MAX: usize = 8;

/// What a lookup found: how much of the request matched and who holds that prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeMatch {
    /// Matched length: characters for the string tree, whole-page tokens for the token tree.
    pub matched_len: u32,
    /// The request's length in the same unit (characters, or tokens).
    pub request_len: u32,
    /// Tenants of the deepest matched node, most recently used first; `tenants_len` are valid.
    pub tenants: [WorkerId; MATCH_TENANTS_MAX],
    /// How many entries of `tenants` are valid.
    pub tenants_len: u8,
}

impl TreeMatch {
    /// The valid tenants, most recently used first.
    pub fn tenants(&self) -> &[WorkerId] {
        &self.tenants[..usize::from(self.tenants_len)]
    }

    /// Matched length over request length, 0 for an empty request.
    pub fn ratio(&self) -> f64 {
        if self.request_len == 0 {
            0.0
        } else {
            f64::from(self.matched_len) / f64::from(self.request_len)
        }
    }
}
