//! A data core's spare I/O buffers. A stream spends nearly all its life waiting for the worker's
//! next token; if it kept its buffers while waiting, 10,000 streams would pin 10,000 sets of
//! them. Instead a waiting stream lends its empty buffers here and borrows one back when bytes
//! are ready, so buffers are held by the streams moving data, not by the ones that wait. Only
//! buffers of the usual size are kept (a grown one goes back to the allocator), and at most
//! `SPARE_BUFFERS_KEPT_MAX` of them.

use crate::limits::{SPARE_BUFFERS_KEPT_MAX, UPSTREAM_BUF_BYTES_RETAINED_MAX, UPSTREAM_READ_BYTES};

/// Empty buffers of at least `UPSTREAM_READ_BYTES` each, ready to lend.
#[derive(Debug, Default)]
pub struct SpareBuffers {
    free: Vec<Vec<u8>>,
}

impl SpareBuffers {
    /// No buffers yet; they come from the streams that lend theirs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `buf`'s allocation (leaving it empty, without capacity) when it holds no bytes:
    /// kept for the next borrower if it is of the usual size and there is room, freed otherwise.
    /// A buffer that still holds bytes is left alone.
    pub fn lend(&mut self, buf: &mut Vec<u8>) {
        if !buf.is_empty() || buf.capacity() == 0 {
            return;
        }
        let buf = std::mem::take(buf);
        let usual =
            (UPSTREAM_READ_BYTES..=UPSTREAM_BUF_BYTES_RETAINED_MAX).contains(&buf.capacity());
        if usual && self.free.len() < SPARE_BUFFERS_KEPT_MAX {
            self.free.push(buf);
        }
    }

    /// Gives `buf` room for `UPSTREAM_READ_BYTES` when it has less and no bytes: a kept buffer
    /// if there is one, a new one otherwise.
    pub fn borrow_into(&mut self, buf: &mut Vec<u8>) {
        if buf.capacity() >= UPSTREAM_READ_BYTES || !buf.is_empty() {
            return;
        }
        *buf = self
            .free
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(UPSTREAM_READ_BYTES));
    }

    /// Buffers kept now.
    pub fn kept(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_buffer_is_lent_and_borrowed_back_without_a_new_allocation() {
        let mut spare = SpareBuffers::new();
        let mut a = Vec::with_capacity(UPSTREAM_READ_BYTES);
        let block = a.as_ptr();
        spare.lend(&mut a);
        assert_eq!((a.capacity(), spare.kept()), (0, 1));
        let mut b = Vec::new();
        spare.borrow_into(&mut b);
        assert_eq!((b.as_ptr(), spare.kept()), (block, 0));
        // Without a kept buffer, a new one of the usual size.
        let mut c = Vec::new();
        spare.borrow_into(&mut c);
        assert!(c.capacity() >= UPSTREAM_READ_BYTES);
    }

    #[test]
    fn bytes_are_never_lent_away_and_a_buffer_with_room_is_kept_by_its_owner() {
        let mut spare = SpareBuffers::new();
        let mut holding = Vec::with_capacity(UPSTREAM_READ_BYTES);
        holding.extend_from_slice(b"pipelined");
        spare.lend(&mut holding);
        assert_eq!((holding.as_slice(), spare.kept()), (&b"pipelined"[..], 0));
        spare.borrow_into(&mut holding);
        assert_eq!(holding.as_slice(), b"pipelined");
        let mut roomy = Vec::with_capacity(2 * UPSTREAM_READ_BYTES);
        let block = roomy.as_ptr();
        spare.borrow_into(&mut roomy);
        assert_eq!(roomy.as_ptr(), block);
    }

    #[test]
    fn grown_small_and_surplus_buffers_go_back_to_the_allocator() {
        let mut spare = SpareBuffers::new();
        let mut grown = Vec::with_capacity(UPSTREAM_BUF_BYTES_RETAINED_MAX + 1);
        let mut small = Vec::with_capacity(UPSTREAM_READ_BYTES / 2);
        spare.lend(&mut grown);
        spare.lend(&mut small);
        assert_eq!(
            (grown.capacity(), small.capacity(), spare.kept()),
            (0, 0, 0)
        );
        for _ in 0..SPARE_BUFFERS_KEPT_MAX + 3 {
            spare.lend(&mut Vec::with_capacity(UPSTREAM_READ_BYTES));
        }
        assert_eq!(spare.kept(), SPARE_BUFFERS_KEPT_MAX);
    }
}
