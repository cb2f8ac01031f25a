//! A subscriber's place in one publisher's numbered batches: [`Sequence`].
//!
//! Engines number their batches from 0 and never reuse a number while they run. A batch below
//! the next expected number was seen already (a duplicate, or a replayed batch the live stream
//! also delivered): skipped. A batch above it means batches were lost (the publisher's
//! high-water mark dropped them, or the subscriber connected late): a gap, filled from the
//! replay socket when there is one. After the publisher restarts its numbers start again at 0:
//! the subscriber tells [`Sequence::restart`] when it sees one.
//!
//! A jump forward past `KV_EVENTS_SEQUENCE_JUMP_MAX` is implausible (a glitched number, not
//! lost batches): taken as the new baseline it would make every later batch look seen. It is
//! passed over, without moving the expected number, and the subscriber rebuilds the worker
//! from the next batches; a second batch right after it shows the publisher really moved
//! there, and is followed (a gap).

use std::ops::Range;

use crate::limits::KV_EVENTS_SEQUENCE_JUMP_MAX;

/// Where a batch falls in the sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The next batch (or the first one seen): apply it.
    Next,
    /// Seen already: skip it.
    Seen,
    /// Batches `missing` were never seen: fill them (replay) or start over.
    Gap {
        /// The numbers missed, the arriving batch's excluded.
        missing: Range<u64>,
    },
    /// Further ahead than any loss explains: pass it over ([`Sequence::pass_over`]) and keep
    /// expecting the same number.
    Implausible,
}

/// The next sequence number expected from one publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sequence {
    next: Option<u64>,
    /// The last batch passed over as implausible.
    passed_over: Option<u64>,
}

impl Sequence {
    /// Where batch `seq` falls.
    pub fn arrival(&self, seq: u64) -> Arrival {
        match self.next {
            None => Arrival::Next,
            Some(next) if seq == next => Arrival::Next,
            Some(next) if seq < next => Arrival::Seen,
            Some(next)
                if seq - next > KV_EVENTS_SEQUENCE_JUMP_MAX
                    && self.passed_over != Some(seq.wrapping_sub(1)) =>
            {
                Arrival::Implausible
            }
            Some(next) => Arrival::Gap { missing: next..seq },
        }
    }

    /// Batch `seq` was applied (or deliberately passed over).
    pub fn advance(&mut self, seq: u64) {
        self.next = Some(seq.saturating_add(1));
        self.passed_over = None;
    }

    /// Batch `seq`, [`Arrival::Implausible`], was not applied; the number expected stays.
    pub fn pass_over(&mut self, seq: u64) {
        self.passed_over = Some(seq);
    }

    /// Whether batch `seq`, behind the number expected, is too far behind to be a duplicate: the
    /// number expected came from a glitch (or a publisher that renumbered), not from this one.
    pub fn far_behind(&self, seq: u64) -> bool {
        self.next
            .is_some_and(|next| next.saturating_sub(seq) > KV_EVENTS_SEQUENCE_JUMP_MAX)
    }

    /// The next number expected (`None` before the first batch).
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// The publisher started over: its next batch is taken as the first.
    pub fn restart(&mut self) {
        *self = Sequence::default();
    }

    /// Batch `next` is expected next (a replay found nothing older: whatever comes later than
    /// `next` is a gap).
    pub fn expect(&mut self, next: u64) {
        self.next = Some(next);
        self.passed_over = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_in_order_apply_and_older_ones_are_seen() {
        let mut sequence = Sequence::default();
        assert_eq!(sequence.arrival(7), Arrival::Next);
        sequence.advance(7);
        assert_eq!(sequence.arrival(8), Arrival::Next);
        sequence.advance(8);
        assert_eq!(sequence.arrival(8), Arrival::Seen);
        assert_eq!(sequence.arrival(0), Arrival::Seen);
        assert_eq!(sequence.next(), Some(9));
    }

    #[test]
    fn a_jump_is_a_gap_naming_what_is_missing() {
        let mut sequence = Sequence::default();
        sequence.advance(3);
        assert_eq!(sequence.arrival(7), Arrival::Gap { missing: 4..7 });
        sequence.restart();
        assert_eq!(sequence.arrival(0), Arrival::Next);
        assert_eq!(sequence.next(), None);
        sequence.expect(0);
        assert_eq!(sequence.arrival(2), Arrival::Gap { missing: 0..2 });
    }

    #[test]
    fn an_implausible_jump_is_passed_over_and_hides_nothing_after_it() {
        let mut sequence = Sequence::default();
        for seq in 0..5 {
            sequence.advance(seq);
        }
        // One glitched number: not applied, and 5, 6, 7 still follow.
        let glitch = 1_000_000_000_000;
        assert_eq!(sequence.arrival(glitch), Arrival::Implausible);
        sequence.pass_over(glitch);
        assert_eq!(sequence.next(), Some(5));
        assert_eq!(sequence.arrival(5), Arrival::Next);
        sequence.advance(5);
        assert_eq!(sequence.arrival(6), Arrival::Next);
        // A jump just within the bound is an ordinary gap.
        let far = 6 + KV_EVENTS_SEQUENCE_JUMP_MAX;
        assert_eq!(sequence.arrival(far), Arrival::Gap { missing: 6..far });
        assert_eq!(sequence.arrival(far + 1), Arrival::Implausible);
        assert_eq!(sequence.arrival(u64::MAX), Arrival::Implausible);
    }

    #[test]
    fn a_publisher_that_really_moved_is_followed_from_its_second_batch() {
        let mut sequence = Sequence::default();
        sequence.advance(4);
        let moved = 1 << 40;
        assert_eq!(sequence.arrival(moved), Arrival::Implausible);
        sequence.pass_over(moved);
        assert_eq!(
            sequence.arrival(moved + 1),
            Arrival::Gap {
                missing: 5..moved + 1
            }
        );
        sequence.advance(moved + 1);
        assert_eq!(sequence.arrival(moved + 2), Arrival::Next);
        // Far behind the number expected: not a duplicate.
        assert!(sequence.far_behind(5));
        assert!(!sequence.far_behind(moved));
    }
}
