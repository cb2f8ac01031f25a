//! How a key is cut into units: characters of UTF-8 text (`TextKeys`), or whole pages of
//! `--block-size` tokens (`PageKeys`). Edges split and matches end only at unit boundaries, and
//! budgets count units.

use super::raw::Element;
use super::TreeKind;

/// The unit rules of one tree kind.
pub trait Keying: Clone + std::fmt::Debug + Send + 'static {
    /// The label element.
    type E: Element;
    /// Which tree kind these rules cut keys for.
    const KIND: TreeKind;
    /// The key with any trailing partial unit removed.
    fn trim<'k>(&self, key: &'k [Self::E]) -> &'k [Self::E];
    /// The edge key of the first unit of `rest`, `None` when `rest` holds no whole unit.
    fn edge_key(&self, rest: &[Self::E]) -> Option<u64>;
    /// The largest unit boundary of `key` at or below `pos`.
    fn floor(&self, key: &[Self::E], pos: usize) -> usize;
    /// Units in `segment` (a whole number of units).
    fn units(&self, segment: &[Self::E]) -> u64;
}

/// UTF-8 text: a unit is one character.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextKeys;

fn is_continuation(byte: u8) -> bool {
    (byte as i8) < -0x40
}

/// Characters in valid UTF-8 `bytes`. Counts 64-byte blocks into a byte-wide sum (at most 64
/// per block, so it cannot overflow), which the compiler turns into wide vector adds.
pub fn count_chars(bytes: &[u8]) -> u64 {
    const BLOCK: usize = 64;
    let blocks = bytes.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    let mut count = 0u64;
    for block in blocks {
        let starts: u8 = block
            .iter()
            .map(|byte| u8::from(!is_continuation(*byte)))
            .sum();
        count += u64::from(starts);
    }
    count + tail.iter().filter(|byte| !is_continuation(**byte)).count() as u64
}

impl Keying for TextKeys {
    type E = u8;
    const KIND: TreeKind = TreeKind::Text;

    fn trim<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        key
    }

    fn edge_key(&self, rest: &[u8]) -> Option<u64> {
        let first = *rest.first()?;
        let width = match first {
            0..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            _ => 4,
        };
        let bytes = rest.get(..width).unwrap_or(rest);
        Some(
            bytes
                .iter()
                .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte)),
        )
    }

    fn floor(&self, key: &[u8], pos: usize) -> usize {
        let mut pos = pos.min(key.len());
        while pos > 0 && pos < key.len() && is_continuation(key[pos]) {
            pos -= 1;
        }
        pos
    }

    fn units(&self, segment: &[u8]) -> u64 {
        count_chars(segment)
    }
}

/// The page hash's lane seeds and multiplier (odd 64-bit constants with well-mixed bits).
const EDGE_KEY_SEEDS: [u64; 4] = [
    0x9e37_79b9_7f4a_7c15,
    0xbf58_476d_1ce4_e5b9,
    0x94d0_49bb_1331_11eb,
    0xd6e8_feb8_6659_fd93,
];
const EDGE_KEY_PRIME: u64 = 0xff51_afd7_ed55_8ccd;

/// Token ids: a unit is a page of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub struct PageKeys {
    /// Tokens per page (`--block-size`), at least 1.
    pub block_size: usize,
}

impl Keying for PageKeys {
    type E = u32;
    const KIND: TreeKind = TreeKind::Tokens;

    fn trim<'k>(&self, key: &'k [u32]) -> &'k [u32] {
        &key[..key.len() - key.len() % self.block_size]
    }

    fn edge_key(&self, rest: &[u32]) -> Option<u64> {
        let page = rest.get(..self.block_size)?;
        // Two tokens per word into four independent lanes: a page of 16 tokens is two
        // multiplies deep instead of sixteen (every walk step and insert hashes a page).
        let mut lanes = EDGE_KEY_SEEDS;
        let mut words = page.chunks_exact(2);
        for (i, pair) in words.by_ref().enumerate() {
            let word = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
            let lane = &mut lanes[i % 4];
            *lane = (*lane ^ word).wrapping_mul(EDGE_KEY_PRIME).rotate_left(29);
        }
        if let [last] = words.remainder() {
            lanes[0] = (lanes[0] ^ u64::from(*last) ^ (1 << 63)).wrapping_mul(EDGE_KEY_PRIME);
        }
        let folded = lanes.iter().fold(page.len() as u64, |acc, lane| {
            (acc ^ lane).wrapping_mul(EDGE_KEY_PRIME).rotate_left(31)
        });
        Some(folded)
    }

    fn floor(&self, key: &[u32], pos: usize) -> usize {
        let pos = pos.min(key.len());
        pos - pos % self.block_size
    }

    fn units(&self, segment: &[u32]) -> u64 {
        segment.len() as u64
    }
}

/// Length of the common prefix of `a` and `b`. Long prefixes are the common case (a next turn
/// repeats thousands of tokens), so equal spans are skipped a large block at a time: one
/// `memcmp` call per 8 KiB of tokens (the call, not the comparison, dominated with small blocks:
/// 24 calls for an 8k-token match at 1 KiB), then the block that differs is narrowed down in
/// smaller blocks and finally element by element.
pub fn common_prefix<E: Element>(a: &[E], b: &[E]) -> usize {
    const SPANS: [usize; 3] = [2048, 256, 32];
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut matched = 0;
    for span in SPANS {
        while len - matched >= span && a[matched..matched + span] == b[matched..matched + span] {
            matched += span;
        }
    }
    matched
        + a[matched..]
            .iter()
            .zip(&b[matched..])
            .take_while(|(x, y)| x == y)
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_floors_to_char_boundaries() {
        let key = "aé€😀b".as_bytes();
        assert_eq!(TextKeys.floor(key, 2), 1, "inside é");
        assert_eq!(TextKeys.floor(key, 3), 3);
        assert_eq!(TextKeys.floor(key, 5), 3, "inside €");
        assert_eq!(TextKeys.floor(key, 99), key.len());
        assert_eq!(TextKeys.units(key), 5);
        assert_ne!(
            TextKeys.edge_key(&key[1..]),
            TextKeys.edge_key("ê".as_bytes())
        );
    }

    #[test]
    fn count_chars_matches_std() {
        let text = "aé€😀b".repeat(40);
        for end in (0..text.len()).filter(|end| text.is_char_boundary(*end)) {
            assert_eq!(
                count_chars(&text.as_bytes()[..end]),
                text[..end].chars().count() as u64
            );
        }
    }

    #[test]
    fn pages_are_whole() {
        let keys = PageKeys { block_size: 4 };
        assert_eq!(keys.trim(&[1, 2, 3, 4, 5, 6]), &[1, 2, 3, 4]);
        assert_eq!(keys.edge_key(&[1, 2, 3]), None);
        assert_ne!(keys.edge_key(&[1, 2, 3, 4]), keys.edge_key(&[1, 2, 3, 5]));
        assert_eq!(keys.floor(&[0; 9], 7), 4);
        assert_eq!(keys.floor(&[0; 6], 99), 4);
        // Every token of a page counts, in order, for any page size.
        for block_size in [1, 3, 16] {
            let keys = PageKeys { block_size };
            let page: Vec<u32> = (1..=block_size as u32).collect();
            for at in 0..block_size {
                let mut other = page.clone();
                other[at] += 1;
                assert_ne!(
                    keys.edge_key(&page),
                    keys.edge_key(&other),
                    "{block_size} {at}"
                );
            }
            let mut swapped = page.clone();
            swapped.reverse();
            if block_size > 1 {
                assert_ne!(keys.edge_key(&page), keys.edge_key(&swapped));
            }
        }
    }

    #[test]
    fn common_prefix_spans_chunks() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[70] = 0;
        assert_eq!(common_prefix(&a, &b), 70);
        assert_eq!(common_prefix(&a[..10], &b), 10);
        let long: Vec<u32> = (0..5000).collect();
        for at in [
            0, 31, 32, 255, 256, 257, 511, 1000, 2047, 2048, 2049, 2303, 4096, 4999,
        ] {
            let mut other = long.clone();
            other[at] = u32::MAX;
            assert_eq!(common_prefix(&long, &other), at);
            assert_eq!(common_prefix(&other[..at], &long), at);
        }
        assert_eq!(common_prefix(&long, &long), long.len());
    }
}
