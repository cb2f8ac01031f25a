//! A worker's map from its engine's block hashes to our chain states: what turns a removal
//! event into our keys, and a stored block's parent into its chain state.
//!
//! Open addressing with linear probing over 16-byte buckets (no control bytes), at most 3/4
//! full and growing by half (so at least half full once grown: 16 to 32 bytes per entry, where
//! doubling would give 16 to 43), deletes shifting the rest of a probe run back. Ingestion is
//! bound by the cache misses of this map and of the shared table, so the map lets the writer
//! [`EngineBlocks::prefetch`] a batch's buckets before it touches them, which a `HashMap` does
//! not. Engine hash 0 (the empty bucket's key) is kept beside the buckets.
//!
//! Why not `index::slots::SlotTable`, the other open-addressing table here: that one is read by
//! the data cores while the writer changes it, so its slots are atomics re-read after a fence,
//! its size is fixed at start (readers cannot follow a move) and its probe runs are capped. This
//! map has one owner, the writer, and grows with its worker (64 tables sized for the whole
//! index up front would be 64 times its memory); sharing one type would give it the atomics,
//! fences and cap it has no use for, or give the shared table a resize its readers cannot
//! survive. They share the probing scheme, not the code.

use crate::index::raw::prefetch;

/// The fewest buckets a map holds once it holds anything.
const BUCKETS_MIN: usize = 16;

/// A worker's engine block hashes, each with our chain state.
#[derive(Debug, Default)]
pub struct EngineBlocks {
    /// `(engine hash, state)`; key 0: empty.
    buckets: Vec<(u64, u64)>,
    len: usize,
    /// The state of engine hash 0, if held.
    zero: Option<u64>,
}

impl EngineBlocks {
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Bytes of the buckets.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<(u64, u64)>()
    }

    fn home(&self, engine: u64) -> usize {
        // The mixed hash scaled to the bucket count: every bit of the engine's hash counts.
        let mixed = engine.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((u128::from(mixed) * self.buckets.len() as u128) >> 64) as usize
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.buckets.len() {
            0
        } else {
            at + 1
        }
    }

    /// Buckets from `from` forward to `to`, cyclically.
    fn distance(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.buckets.len() - from
        }
    }

    /// Starts bringing `engine`'s home bucket into cache, for a call soon.
    pub fn prefetch(&self, engine: u64) {
        if engine != 0 && !self.buckets.is_empty() {
            prefetch(&self.buckets[self.home(engine)]);
        }
    }

    /// The bucket holding `engine` (not 0), if any.
    fn find(&self, engine: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mut at = self.home(engine);
        loop {
            match self.buckets[at].0 {
                0 => return None,
                key if key == engine => return Some(at),
                _ => at = self.next(at),
            }
        }
    }

    pub fn get(&self, engine: u64) -> Option<u64> {
        if engine == 0 {
            return self.zero;
        }
        self.find(engine).map(|at| self.buckets[at].1)
    }

    /// Maps `engine` to `state`, replacing what it mapped to.
    pub fn insert(&mut self, engine: u64, state: u64) {
        if engine == 0 {
            self.zero = Some(state);
            return;
        }
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.grow();
        }
        let mut at = self.home(engine);
        loop {
            match self.buckets[at].0 {
                0 => {
                    self.buckets[at] = (engine, state);
                    self.len += 1;
                    return;
                }
                key if key == engine => {
                    self.buckets[at].1 = state;
                    return;
                }
                _ => at = self.next(at),
            }
        }
    }

    /// Takes `engine` out; its state, if it was held.
    pub fn remove(&mut self, engine: u64) -> Option<u64> {
        if engine == 0 {
            return self.zero.take();
        }
        let mut hole = self.find(engine)?;
        let state = self.buckets[hole].1;
        self.len -= 1;
        // Back-shift: a later entry of the run moves into the hole if the hole lies between its
        // home and where it sits (cyclically), so every entry stays reachable from its home.
        let mut next = self.next(hole);
        loop {
            let key = self.buckets[next].0;
            if key == 0 {
                break;
            }
            let home = self.home(key);
            if self.distance(home, next) >= self.distance(hole, next) {
                self.buckets[hole] = self.buckets[next];
                hole = next;
            }
            next = self.next(next);
        }
        self.buckets[hole] = (0, 0);
        Some(state)
    }

    fn grow(&mut self) {
        let buckets = (self.buckets.len() + self.buckets.len() / 2).max(BUCKETS_MIN);
        let old = std::mem::replace(&mut self.buckets, vec![(0, 0); buckets]);
        self.len = 0;
        for (engine, state) in old {
            if engine != 0 {
                self.insert(engine, state);
            }
        }
    }

    /// Every `(engine hash, state)`, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let zero = self.zero.map(|state| (0, state));
        let held = self.buckets.iter().copied().filter(|&(key, _)| key != 0);
        zero.into_iter().chain(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
    }

    /// Keys from a small set (0 among them) whose homes collide, so runs wrap and deletes shift.
    fn op() -> impl Strategy<Value = Op> {
        let key = prop_oneof![
            Just(0u64),
            1u64..40,
            Just(u64::MAX),
            (0u64..8).prop_map(|k| k << 60)
        ];
        prop_oneof![
            (key.clone(), any::<u64>()).prop_map(|(k, v)| Op::Insert(k, v)),
            key.prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// The map answers as a `HashMap` does after any sequence of inserts and removes.
        #[test]
        fn it_behaves_as_a_hash_map(ops in prop::collection::vec(op(), 0..400)) {
            let mut ours = EngineBlocks::default();
            let mut model = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        ours.insert(k, v);
                        model.insert(k, v);
                    }
                    Op::Remove(k) => prop_assert_eq!(ours.remove(k), model.remove(&k)),
                }
                prop_assert_eq!(ours.len(), model.len());
            }
            for k in (0..40).chain([u64::MAX]).chain((0..8).map(|k| k << 60)) {
                prop_assert_eq!(ours.get(k), model.get(&k).copied());
            }
            let mut listed: Vec<_> = ours.iter().collect();
            let mut expected: Vec<_> = model.into_iter().collect();
            listed.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(listed, expected);
        }
    }

    #[test]
    fn it_grows_and_stays_between_half_and_three_quarters_full() {
        let mut map = EngineBlocks::default();
        for k in 1..=10_000u64 {
            map.insert(k.wrapping_mul(0x2545_f491_4f6c_dd1d), k);
        }
        assert_eq!(map.len(), 10_000);
        let buckets = map.buckets.len();
        assert!(
            buckets * 3 >= 10_000 * 4 && buckets <= 10_000 * 2,
            "{buckets}"
        );
        assert_eq!(map.memory_bytes(), map.buckets.len() * 16);
        for k in 1..=10_000u64 {
            assert_eq!(map.get(k.wrapping_mul(0x2545_f491_4f6c_dd1d)), Some(k));
        }
    }
}
