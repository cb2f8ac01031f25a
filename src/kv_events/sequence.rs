//! A subscriber's place in one publisher's numbered batches: [`Sequence`].
//!
//! Engines number their batches from 0 and never reuse a number while they run. A batch below
//! the next expected number was seen already (a duplicate, or a replayed batch the live stream
//! also delivered): skipped. A batch above it means batches were lost (the publisher's
//! high-water mark dropped them, or the subscriber connected late): a gap, filled from the
//! replay socket when there is one. After the publisher restarts its numbers start again at 0:
//! the subscriber tells [`Sequence::restart`] when it sees one.

use std::ops::Range;

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
}

/// The next sequence number expected from one publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sequence {
    next: Option<u64>,
}

impl Sequence {
    /// Where batch `seq` falls.
    pub fn arrival(&self, seq: u64) -> Arrival {
        match self.next {
            None => Arrival::Next,
            Some(next) if seq == next => Arrival::Next,
            Some(next) if seq < next => Arrival::Seen,
            Some(next) => Arrival::Gap { missing: next..seq },
        }
    }

    /// Batch `seq` was applied (or deliberately passed over).
    pub fn advance(&mut self, seq: u64) {
        self.next = Some(seq.saturating_add(1));
    }

    /// The next number expected (`None` before the first batch).
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// The publisher started over: its next batch is taken as the first.
    pub fn restart(&mut self) {
        self.next = None;
    }

    /// Batch `next` is expected next (a replay found nothing older: whatever comes later than
    /// `next` is a gap).
    pub fn expect(&mut self, next: u64) {
        self.next = Some(next);
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
}
