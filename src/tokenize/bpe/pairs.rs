//! [`PairTable`]: a model's merges by pair of token IDs, the lookup merging does for every pair
//! that changes (two per merge). One flat open-addressed table of 8-byte entries, each the pair
//! and its merge's rank packed together, probed linearly from a multiplicative hash: a lookup,
//! hit or miss, nearly always reads one cache line (eight entries), where a `HashMap` reads its
//! control bytes and then its bucket. Merging CJK text is mostly these lookups (most pairs of
//! two characters are misses), and the table (2 MiB for Qwen3's 151k merges, 4 MiB for Llama
//! 3's 280k) is half the map's size, so more of it stays in cache.
//!
//! Packing bounds what it holds: token IDs below [`ID_LIMIT`] and ranks below [`RANK_LIMIT`]
//! ([`PairTable::insert`] refuses others, and the model then keeps the `tokenizers` crate).

/// Token IDs are below this (20 bits, the all-ones pair being the empty entry).
pub const ID_LIMIT: u32 = (1 << 20) - 1;

/// Ranks are below this (24 bits).
pub const RANK_LIMIT: u32 = 1 << 24;

/// An empty entry: the pair (`ID_LIMIT`, `ID_LIMIT`), which no insert makes.
const EMPTY: u64 = u64::MAX;

/// The most entries per slot, as a fraction: grown past 4/5 full (probes stay short).
const LOAD_NUMERATOR: usize = 4;
const LOAD_DENOMINATOR: usize = 5;

/// Merges by pair of token IDs (see the module documentation).
pub struct PairTable {
    /// Entries: `left << 44 | right << 24 | rank`, or [`EMPTY`].
    slots: Box<[u64]>,
    /// 64 minus log2 of the slots: the hash's top bits pick the first slot.
    shift: u32,
    len: usize,
}

#[inline]
fn pair(left: u32, right: u32) -> u64 {
    (u64::from(left) << 20) | u64::from(right)
}

impl PairTable {
    /// A table sized for `merges` entries without growing.
    pub fn with_capacity(merges: usize) -> PairTable {
        let slots = (merges * LOAD_DENOMINATOR / LOAD_NUMERATOR + 1)
            .next_power_of_two()
            .max(8);
        PairTable {
            slots: vec![EMPTY; slots].into_boxed_slice(),
            shift: 64 - slots.trailing_zeros(),
            len: 0,
        }
    }

    /// Pairs held.
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn first_slot(&self, pair: u64) -> usize {
        (pair.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// Sets the rank of the merge of `(left, right)`, replacing an earlier one of that pair.
    pub fn insert(&mut self, left: u32, right: u32, rank: u32) -> Result<(), String> {
        if left >= ID_LIMIT || right >= ID_LIMIT {
            return Err(format!("a token ID past {}", ID_LIMIT - 1));
        }
        if rank >= RANK_LIMIT {
            return Err(format!("more than {RANK_LIMIT} merges"));
        }
        if (self.len + 1) * LOAD_DENOMINATOR > self.slots.len() * LOAD_NUMERATOR {
            self.grow();
        }
        let key = pair(left, right);
        let entry = (key << 24) | u64::from(rank);
        let mask = self.slots.len() - 1;
        let mut at = self.first_slot(key);
        loop {
            let slot = self.slots[at];
            if slot == EMPTY {
                self.slots[at] = entry;
                self.len += 1;
                return Ok(());
            }
            if slot >> 24 == key {
                self.slots[at] = entry;
                return Ok(());
            }
            at = (at + 1) & mask;
        }
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, PairTable::with_capacity(self.slots.len()));
        for &entry in old.slots.iter().filter(|&&e| e != EMPTY) {
            let key = entry >> 24;
            let mask = self.slots.len() - 1;
            let mut at = self.first_slot(key);
            while self.slots[at] != EMPTY {
                at = (at + 1) & mask;
            }
            self.slots[at] = entry;
            self.len += 1;
        }
    }

    /// The rank of the merge of `(left, right)`, if the model has one.
    #[inline]
    pub fn get(&self, left: u32, right: u32) -> Option<u32> {
        if left >= ID_LIMIT || right >= ID_LIMIT {
            return None;
        }
        let key = pair(left, right);
        let mask = self.slots.len() - 1;
        let mut at = self.first_slot(key);
        loop {
            let slot = self.slots[at];
            if slot >> 24 == key {
                return Some((slot & u64::from(RANK_LIMIT - 1)) as u32);
            }
            if slot == EMPTY {
                return None;
            }
            at = (at + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn the_table_answers_as_a_map_through_duplicates_misses_and_growth() {
        let mut rng = fastrand::Rng::with_seed(7);
        // Planned for 100, filled with 5,000: it grows several times.
        let mut table = PairTable::with_capacity(100);
        let mut map = HashMap::new();
        for rank in 0..5_000u32 {
            // Small IDs, so pairs repeat (a later merge of a pair replaces the earlier one).
            let (left, right) = (rng.u32(..120), rng.u32(..120));
            table.insert(left, right, rank).expect("in bounds");
            map.insert((left, right), rank);
        }
        // The largest IDs and rank fit.
        table
            .insert(ID_LIMIT - 1, ID_LIMIT - 1, RANK_LIMIT - 1)
            .expect("in bounds");
        map.insert((ID_LIMIT - 1, ID_LIMIT - 1), RANK_LIMIT - 1);
        assert_eq!(table.len(), map.len());
        for left in (0..130).chain([ID_LIMIT - 1, ID_LIMIT, u32::MAX]) {
            for right in (0..130).chain([ID_LIMIT - 1, ID_LIMIT, u32::MAX]) {
                assert_eq!(
                    table.get(left, right),
                    map.get(&(left, right)).copied(),
                    "({left}, {right})"
                );
            }
        }
        // What does not pack is refused.
        assert!(table.insert(ID_LIMIT, 0, 0).is_err());
        assert!(table.insert(0, ID_LIMIT, 0).is_err());
        assert!(table.insert(0, 0, RANK_LIMIT).is_err());
    }
}
