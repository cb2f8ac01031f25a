//! How a key is stored and cut into units: characters of UTF-8 text (`TextKeys`), or whole
//! pages of `--block-size` tokens (`PageKeys`), each token id packed into three bytes
//! (`PackedTokens`). Edges split and matches end only at unit boundaries, and
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
    /// Stored elements as reports show keys (`Evicted`): bytes of text, or token ids.
    fn report(&self, elements: &[Self::E]) -> Vec<u32>;
    /// A length in stored elements, in the reports' elements.
    fn report_len(&self, elements: usize) -> usize;
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

    fn report(&self, elements: &[u8]) -> Vec<u32> {
        elements.iter().map(|byte| u32::from(*byte)).collect()
    }

    fn report_len(&self, elements: usize) -> usize {
        elements
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

/// Bytes of one token id in the token tree: three, little-endian. Every tokenizer vocabulary
/// is far below 2^24 ids (the largest in use hold about 256k), so a quarter of each stored and
/// compared token would be zeros: the lookup and the insert move 25% fewer bytes through a
/// cache that misses on nearly every label (measured in `perf/results-index.md`).
pub const TOKEN_BYTES: usize = 3;
/// The largest token id the token tree stores. A request's key ends before its first id above
/// it (`PackedTokens::pack`), which no real model produces.
pub const TOKEN_ID_MAX: u32 = (1 << 24) - 1;

/// A request's token ids as the token tree stores and compares them (`TOKEN_BYTES` each),
/// packed once per request into a buffer reused across requests.
#[derive(Clone, Debug, Default)]
pub struct PackedTokens {
    /// Packed ids in `bytes[..len]`; the rest is room left by longer keys (kept initialised, so
    /// packing never zero-fills it again).
    bytes: Vec<u8>,
    len: usize,
    tokens: usize,
}

impl PackedTokens {
    /// `tokens`, packed.
    pub fn of(tokens: &[u32]) -> Self {
        let mut packed = Self::default();
        packed.pack(tokens);
        packed
    }

    /// Replaces the contents with `tokens`, packed up to the first id above `TOKEN_ID_MAX`
    /// (the key ends there; the request keeps its full length). Eight ids at a time, as three
    /// 64-bit words, with one check of all eight.
    pub fn pack(&mut self, tokens: &[u32]) {
        self.tokens = tokens.len();
        let room = tokens.len() * TOKEN_BYTES;
        if self.bytes.len() < room {
            self.bytes.resize(room, 0);
        }
        let mut octets = tokens.chunks_exact(8);
        let mut len = 0;
        let packed = self.bytes.chunks_exact_mut(8 * TOKEN_BYTES);
        for (out, ids) in packed.zip(octets.by_ref()) {
            if ids.iter().fold(0, |all, id| all | id) > TOKEN_ID_MAX {
                break;
            }
            // Spelled out: `array::map` here kept the ids on the stack (3x slower).
            let id = |i: usize| u64::from(ids[i]);
            let low = id(0) | id(1) << 24 | id(2) << 48;
            let middle = id(2) >> 16 | id(3) << 8 | id(4) << 32 | id(5) << 56;
            let high = id(5) >> 8 | id(6) << 16 | id(7) << 40;
            out[..8].copy_from_slice(&low.to_le_bytes());
            out[8..16].copy_from_slice(&middle.to_le_bytes());
            out[16..].copy_from_slice(&high.to_le_bytes());
            len += 8 * TOKEN_BYTES;
        }
        self.len = len;
        let packed_ids = len / TOKEN_BYTES;
        self.push_each(&tokens[packed_ids..]);
    }

    /// Packs `tokens` (room reserved) one by one, stopping at the first id that does not fit.
    fn push_each(&mut self, tokens: &[u32]) {
        for token in tokens {
            if *token > TOKEN_ID_MAX {
                return;
            }
            let at = self.len;
            self.bytes[at..at + TOKEN_BYTES].copy_from_slice(&token.to_le_bytes()[..TOKEN_BYTES]);
            self.len += TOKEN_BYTES;
        }
    }

    /// The packed key.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Tokens in the request (those past an id that does not fit included).
    pub fn request_tokens(&self) -> usize {
        self.tokens
    }
}

/// The token ids of packed bytes (reports: evictions).
pub fn unpack_tokens(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(TOKEN_BYTES)
        .map(|id| u32::from(id[0]) | u32::from(id[1]) << 8 | u32::from(id[2]) << 16)
        .collect()
}

/// Token ids, packed (`PackedTokens`): a unit is a page of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub struct PageKeys {
    /// Tokens per page (`--block-size`), at least 1.
    pub block_size: usize,
}

impl PageKeys {
    fn page_bytes(&self) -> usize {
        self.block_size * TOKEN_BYTES
    }
}

impl Keying for PageKeys {
    type E = u8;
    const KIND: TreeKind = TreeKind::Tokens;

    fn trim<'k>(&self, key: &'k [u8]) -> &'k [u8] {
        &key[..key.len() - key.len() % self.page_bytes()]
    }

    fn edge_key(&self, rest: &[u8]) -> Option<u64> {
        let page = rest.get(..self.page_bytes())?;
        // Eight bytes per word into four independent lanes: a page of 16 tokens (48 bytes)
        // is two multiplies deep instead of six (every walk step and insert hashes a page).
        let mut lanes = EDGE_KEY_SEEDS;
        let mut words = page.chunks_exact(8);
        for (i, word) in words.by_ref().enumerate() {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word);
            let lane = &mut lanes[i % 4];
            *lane = (*lane ^ u64::from_le_bytes(bytes))
                .wrapping_mul(EDGE_KEY_PRIME)
                .rotate_left(29);
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let mut bytes = [0u8; 8];
            bytes[..tail.len()].copy_from_slice(tail);
            lanes[0] =
                (lanes[0] ^ u64::from_le_bytes(bytes) ^ (1 << 63)).wrapping_mul(EDGE_KEY_PRIME);
        }
        let folded = lanes.iter().fold(page.len() as u64, |acc, lane| {
            (acc ^ lane).wrapping_mul(EDGE_KEY_PRIME).rotate_left(31)
        });
        Some(folded)
    }

    fn floor(&self, key: &[u8], pos: usize) -> usize {
        let pos = pos.min(key.len());
        pos - pos % self.page_bytes()
    }

    fn units(&self, segment: &[u8]) -> u64 {
        (segment.len() / TOKEN_BYTES) as u64
    }

    fn report(&self, elements: &[u8]) -> Vec<u32> {
        unpack_tokens(elements)
    }

    fn report_len(&self, elements: usize) -> usize {
        elements / TOKEN_BYTES
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

    fn packed(tokens: &[u32]) -> Vec<u8> {
        PackedTokens::of(tokens).bytes().to_vec()
    }

    #[test]
    fn pages_are_whole() {
        let keys = PageKeys { block_size: 4 };
        let six = packed(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(keys.trim(&six), &packed(&[1, 2, 3, 4])[..]);
        assert_eq!(keys.edge_key(&packed(&[1, 2, 3])), None);
        assert_ne!(
            keys.edge_key(&packed(&[1, 2, 3, 4])),
            keys.edge_key(&packed(&[1, 2, 3, 5]))
        );
        assert_eq!(
            keys.floor(&packed(&[0; 9]), 7 * TOKEN_BYTES + 1),
            4 * TOKEN_BYTES
        );
        assert_eq!(keys.floor(&packed(&[0; 6]), 99), 4 * TOKEN_BYTES);
        assert_eq!(keys.units(&six), 6);
        // Every byte of every token of a page counts, in order, for any page size.
        for block_size in [1, 3, 16] {
            let keys = PageKeys { block_size };
            let page: Vec<u32> = (1..=block_size as u32).map(|t| t * 0x01_0101).collect();
            for at in 0..block_size {
                for shift in [0, 8, 16] {
                    let mut other = page.clone();
                    other[at] ^= 1 << shift;
                    assert_ne!(
                        keys.edge_key(&packed(&page)),
                        keys.edge_key(&packed(&other)),
                        "{block_size} {at} {shift}"
                    );
                }
            }
            let mut swapped = page.clone();
            swapped.reverse();
            if block_size > 1 {
                assert_ne!(
                    keys.edge_key(&packed(&page)),
                    keys.edge_key(&packed(&swapped))
                );
            }
        }
    }

    #[test]
    fn packing_keeps_every_id_that_fits_and_ends_before_one_that_does_not() {
        for len in [0, 1, 3, 4, 5, 8, 13, 1000] {
            let tokens: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9) & TOKEN_ID_MAX)
                .collect();
            let key = PackedTokens::of(&tokens);
            assert_eq!(key.bytes().len(), len * TOKEN_BYTES);
            assert_eq!(unpack_tokens(key.bytes()), tokens, "{len}");
            assert_eq!(key.request_tokens(), len);
            // An id above TOKEN_ID_MAX anywhere (in a group of four or in the tail) ends the
            // key just before it.
            for at in (0..len).step_by(3) {
                let mut odd = tokens.clone();
                odd[at] = TOKEN_ID_MAX + 1 + at as u32;
                let key = PackedTokens::of(&odd);
                assert_eq!(unpack_tokens(key.bytes()), &tokens[..at], "{len} {at}");
                assert_eq!(key.request_tokens(), len);
            }
        }
        // The buffer is reused: a shorter key leaves nothing of a longer one.
        let mut key = PackedTokens::of(&[7; 100]);
        key.pack(&[1, 2]);
        assert_eq!(unpack_tokens(key.bytes()), [1, 2]);
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
