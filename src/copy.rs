//! Large copies made in pieces, to stay off a slow path of glibc's `memcpy`.
//!
//! glibc (2.36 measured here) copies anything above about 2 KiB with `rep movsb`. On AMD Zen
//! (EPYC Milan measured here) that instruction slows down twenty-fold when the destination lies
//! just after the source modulo 4 KiB (`(dst - src) % 4096` in 1..=31): a 32 KiB copy took
//! 14.8 µs instead of 0.72 µs. Allocators make that distance systematic rather than rare: a
//! buffer's data 16 bytes into its block (an `Arc`'s counts, a slab header) copied from another
//! block's start lands on it every time. Pieces of at most `PIECE_BYTES` go through glibc's
//! vector loop instead, as fast as `rep movsb` at its best (0.78 µs for the same copy) whatever
//! the addresses. Measured in `perf/results-index.md`.

/// The largest piece one `memcpy` call is given: below glibc's `rep movsb` threshold.
pub const PIECE_BYTES: usize = 2048;

/// Elements of `T` in one piece (at least one).
pub const fn piece_len<T>() -> usize {
    let size = std::mem::size_of::<T>();
    if size == 0 || size >= PIECE_BYTES {
        1
    } else {
        PIECE_BYTES / size
    }
}

/// `out.extend_from_slice(src)`, copied in pieces.
pub fn extend_from_slice<T: Copy>(out: &mut Vec<T>, src: &[T]) {
    out.reserve(src.len());
    for piece in src.chunks(piece_len::<T>()) {
        out.extend_from_slice(piece);
    }
}

/// `buf.copy_within(src, dest)` for a move toward the buffer's start (`dest <= src.start`),
/// copied in pieces: each piece's source lies at or after its destination, so copying them in
/// order never overwrites bytes still to be moved.
pub fn move_down(buf: &mut [u8], src: std::ops::Range<usize>, dest: usize) {
    assert!(dest <= src.start, "move_down moves toward the start");
    let mut from = src.start;
    let mut to = dest;
    while from < src.end {
        let end = (from + PIECE_BYTES).min(src.end);
        buf.copy_within(from..end, to);
        to += end - from;
        from = end;
    }
}

/// `out.push_str(text)`, copied in pieces (cut at character boundaries).
pub fn push_str(out: &mut String, text: &str) {
    out.reserve(text.len());
    let mut rest = text;
    while rest.len() > PIECE_BYTES {
        // A boundary at most 3 bytes before the piece's end (UTF-8 characters are 1-4 bytes).
        let mut cut = PIECE_BYTES;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, after) = rest.split_at(cut);
        out.push_str(piece);
        rest = after;
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_copy_everything_in_order() {
        let src: Vec<u32> = (0..5000).collect();
        let mut out = vec![7u32];
        extend_from_slice(&mut out, &src);
        assert_eq!(out.len(), 5001);
        assert_eq!(&out[1..], &src[..]);
        assert_eq!(piece_len::<u8>(), PIECE_BYTES);
        assert_eq!(piece_len::<u32>(), PIECE_BYTES / 4);
        assert_eq!(piece_len::<[u8; 4096]>(), 1);
    }

    #[test]
    fn move_down_in_pieces_matches_copy_within() {
        let original: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for (start, end, dest) in [(5000, 9000, 10), (3, 9999, 0), (100, 100, 50), (7, 4100, 7)] {
            let mut expected = original.clone();
            expected.copy_within(start..end, dest);
            let mut moved = original.clone();
            move_down(&mut moved, start..end, dest);
            assert_eq!(moved, expected, "{start}..{end} to {dest}");
        }
    }

    #[test]
    fn text_pieces_cut_at_character_boundaries() {
        let text = "aé€😀".repeat(1000);
        let mut out = String::from(">");
        push_str(&mut out, &text);
        assert_eq!(&out[1..], text);
        let mut short = String::new();
        push_str(&mut short, "é");
        assert_eq!(short, "é");
    }
}
