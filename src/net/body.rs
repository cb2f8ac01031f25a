//! [`BodyFramer`]: a response body on its way in, the one framer of every response the gateway
//! reads. It knows where the body ends (a length, the chunked terminator, or the worker's close)
//! and which of the bytes fed to it are data. The proxy relays a worker's body through it (it
//! says how much of a read belongs to the body, whether the connection can be pooled, and hands
//! the de-chunked data over when an HTTP/1.0 client needs it); the one-shot client (`client::get`)
//! collects a body with it. Sans I/O: bytes in, data and a count out.
//!
//! Errors: a malformed chunked body is an `UpstreamMalformed` [`ProxyError`] on the upstream side.

use super::codec::{ChunkedDecoder, Framing};
use crate::error::{ErrorKind, ProxyError};

/// Where a response body stands: how much of it is left, and how its end is known.
#[derive(Clone, Debug)]
pub struct BodyFramer {
    left: Left,
}

#[derive(Clone, Debug)]
enum Left {
    /// This many bytes (none for an empty body).
    Length(u64),
    /// Up to the terminating chunk and its trailers.
    Chunked(ChunkedDecoder),
    /// Up to the worker's close.
    UntilClose,
}

impl BodyFramer {
    /// The body that follows a head of this `framing`.
    pub fn new(framing: Framing) -> Self {
        let left = match framing {
            Framing::Empty => Left::Length(0),
            Framing::Length(n) => Left::Length(n),
            Framing::Chunked => Left::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => Left::UntilClose,
        };
        BodyFramer { left }
    }

    /// Whether the whole body has been fed (never, for a body that ends at the close).
    pub fn is_done(&self) -> bool {
        match &self.left {
            Left::Length(left) => *left == 0,
            Left::Chunked(decoder) => decoder.is_done(),
            Left::UntilClose => false,
        }
    }

    /// Whether the body ends when the worker closes: a read of 0 bytes is its end, not a cut.
    pub fn ends_at_close(&self) -> bool {
        matches!(self.left, Left::UntilClose)
    }

    /// Whether a chunked body stands between two chunks, so a whole chunk of the gateway's own
    /// may follow what was passed through without breaking the framing (never for the others).
    pub fn at_chunk_boundary(&self) -> bool {
        matches!(&self.left, Left::Chunked(decoder) if decoder.at_chunk_boundary())
    }

    /// Feeds the next bytes read: passes the body's data among them to `on_data` (de-chunked)
    /// and returns how many of them belong to the body (fewer than `input` only once it is
    /// done: what follows is not this response's).
    pub fn advance(
        &mut self,
        input: &[u8],
        mut on_data: impl FnMut(&[u8]),
    ) -> Result<usize, ProxyError> {
        match &mut self.left {
            Left::Length(left) => {
                let take = (*left).min(input.len() as u64);
                *left -= take;
                // `take` is at most `input.len()`.
                let take = take as usize;
                on_data(&input[..take]);
                Ok(take)
            }
            Left::Chunked(decoder) => decoder
                .feed(input, on_data)
                .map_err(|_| ProxyError::upstream(ErrorKind::UpstreamMalformed, "chunked body")),
            Left::UntilClose => {
                on_data(input);
                Ok(input.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `wire` in pieces of `step` bytes; returns the data, the bytes that belonged to the
    /// body, and whether it was done.
    fn feed_in_steps(framing: Framing, wire: &[u8], step: usize) -> (Vec<u8>, usize, bool) {
        let mut framer = BodyFramer::new(framing);
        let (mut data, mut consumed) = (Vec::new(), 0);
        for piece in wire.chunks(step) {
            let n = framer
                .advance(piece, |d| data.extend_from_slice(d))
                .unwrap();
            consumed += n;
            if n < piece.len() {
                break;
            }
        }
        (data, consumed, framer.is_done())
    }

    #[test]
    fn each_framing_ends_where_it_says_in_any_split() {
        let chunked = b"5\r\nhello\r\n6;x=1\r\n world\r\n0\r\n\r\nHTTP/1.1 200 OK";
        let sized = b"hello worldHTTP/1.1 200 OK";
        for step in [1, 2, 7, 64] {
            let (data, consumed, done) = feed_in_steps(Framing::Chunked, chunked, step);
            assert_eq!(
                (data.as_slice(), done),
                (&b"hello world"[..], true),
                "{step}"
            );
            assert_eq!(consumed, chunked.len() - b"HTTP/1.1 200 OK".len());
            let (data, consumed, done) = feed_in_steps(Framing::Length(11), sized, step);
            assert_eq!(
                (data.as_slice(), consumed, done),
                (&b"hello world"[..], 11, true)
            );
            let (data, consumed, done) = feed_in_steps(Framing::UntilClose, sized, step);
            assert_eq!(
                (data.as_slice(), consumed, done),
                (&sized[..], sized.len(), false)
            );
        }
        let (data, consumed, done) = feed_in_steps(Framing::Empty, b"next", 4);
        assert_eq!((data.len(), consumed, done), (0, 0, true));
    }

    #[test]
    fn the_chunk_boundary_and_the_close_are_told_apart() {
        let mut framer = BodyFramer::new(Framing::Chunked);
        assert!(framer.at_chunk_boundary() && !framer.ends_at_close());
        framer.advance(b"5\r\nhel", |_| {}).unwrap();
        assert!(!framer.at_chunk_boundary(), "inside a chunk");
        framer.advance(b"lo\r\n", |_| {}).unwrap();
        assert!(framer.at_chunk_boundary(), "between two chunks");
        assert!(!BodyFramer::new(Framing::Length(3)).at_chunk_boundary());
        assert!(BodyFramer::new(Framing::UntilClose).ends_at_close());
    }

    #[test]
    fn malformed_chunked_framing_is_an_upstream_error() {
        let mut framer = BodyFramer::new(Framing::Chunked);
        let error = framer.advance(b"zz\r\n", |_| {}).unwrap_err();
        assert_eq!(error.kind, ErrorKind::UpstreamMalformed);
        assert_eq!(error.side, crate::error::Side::Upstream);
    }
}
