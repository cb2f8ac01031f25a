//! The incremental chunked decoder (`kvgate::net::codec::ChunkedDecoder`). The first byte seeds
//! how the rest is split into reads; the body is decoded whole, one byte at a time and in those
//! reads.
//!
//! Checked beyond "no panic": a feed consumes no more than it was given and stops short only at
//! the end of the body, the data it passes on are pieces of its input and no more than it
//! consumed, a finished body ends with its final line feed and takes no further bytes, and the
//! outcome (data, bytes consumed, done or the error) does not depend on how the input was split.
#![no_main]

use kvgate::net::codec::{ChunkError, ChunkedDecoder};
use libfuzzer_sys::fuzz_target;

/// What decoding one split of the input gave.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    data: Vec<u8>,
    consumed: usize,
    done: bool,
    error: Option<ChunkError>,
}

fn decode<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> Outcome {
    let mut decoder = ChunkedDecoder::new();
    let mut outcome = Outcome {
        data: Vec::new(),
        consumed: 0,
        done: false,
        error: None,
    };
    for piece in pieces {
        let before = outcome.data.len();
        let fed = decoder.feed(piece, |data| {
            let (start, end) = (
                piece.as_ptr() as usize,
                piece.as_ptr() as usize + piece.len(),
            );
            let at = data.as_ptr() as usize;
            assert!(
                at >= start && at + data.len() <= end,
                "data outside the input"
            );
            outcome.data.extend_from_slice(data);
        });
        match fed {
            Ok(n) => {
                assert!(n <= piece.len(), "consumed {n} of {}", piece.len());
                assert!(outcome.data.len() - before <= n, "more data than consumed");
                assert!(
                    n == piece.len() || decoder.is_done(),
                    "stopped short of the end"
                );
                outcome.consumed += n;
            }
            Err(e) => {
                // Where the error surfaced depends on the split; that it did, and the data
                // before it, must not.
                outcome.error = Some(e);
                outcome.consumed = 0;
                break;
            }
        }
        if decoder.is_done() {
            break;
        }
    }
    outcome.done = decoder.is_done();
    if outcome.done {
        assert_eq!(
            decoder.feed(b"0\r\n\r\n", |_| panic!("data after the end")),
            Ok(0)
        );
    }
    outcome
}

/// Read sizes from a tiny xorshift seeded by `seed`, 1 to 64 bytes each.
fn splits(body: &[u8], seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut rest = body;
    let mut pieces = Vec::new();
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let take = (1 + state as usize % 64).min(rest.len());
        let (piece, tail) = rest.split_at(take);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let whole = decode(std::iter::once(body));
    assert!(whole.error.is_some() || whole.data.len() <= whole.consumed);
    if whole.done {
        assert!(
            body[..whole.consumed].ends_with(b"\n"),
            "done before a line feed"
        );
    }
    let bytes = decode(body.chunks(1));
    let reads = decode(splits(body, seed).into_iter());
    // An error stops each run where it was found; what came before it must agree.
    assert_eq!(whole, bytes, "whole vs. byte at a time");
    assert_eq!(whole, reads, "whole vs. reads");
});
