//! How a key is stored and cut into units: characters of UTF-8 text (`TextKeys`), or whole
//! pages of `--block-size` tokens (`PageKeys`), each page stored as one 64-bit hash of its ids
//! (`TokenPages`). Edges split and matches end only at unit boundaries, and budgets count
//! units.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::raw::Element;
use super::TreeKind;

/// The unit rules of one tree kind.
pub trait Keying: Clone + std::fmt::Debug + Send + 'static {
    /// The label element.
    type E: Element;
    /// Which tree kind these rules cut keys for.
    const KIND: TreeKind;
    /// The edge key of the first unit of `rest`, `None` when `rest` holds no whole unit.
    fn edge_key(&self, rest: &[Self::E]) -> Option<u64>;
    /// The largest unit boundary of `key` at or below `pos`.
    fn floor(&self, key: &[Self::E], pos: usize) -> usize;
    /// Units in `segment` (a whole number of units).
    fn units(&self, segment: &[Self::E]) -> u64;
    /// Stored elements as reports show keys (`Evicted`): bytes of text, or page hashes.
    fn report(&self, elements: &[Self::E]) -> Vec<u64>;
}

/// UTF-8 text: a unit is one character.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextKeys;

fn is_continuation(byte: u8) -> bool {
    (byte as i8) < -0x40
}

/// Characters in valid UTF-8 `bytes`. Counts 64-byte blocks into 64 byte-wide lanes, summed
/// once per 255 blocks (a lane gains at most one a block, so it cannot overflow): the loop is
/// a vector compare and subtract per 16 bytes (15 instructions per block, where a sum per block
/// took 22; a lookup counts a 36 KB prompt whole).
pub fn count_chars(bytes: &[u8]) -> u64 {
    const BLOCK: usize = 64;
    const GROUP: usize = u8::MAX as usize * BLOCK;
    let mut count = 0u64;
    for group in bytes.chunks(GROUP) {
        let (blocks, tail) = group.as_chunks::<BLOCK>();
        if !blocks.is_empty() {
            let mut lanes = [0u8; BLOCK];
            for block in blocks {
                for (lane, &byte) in lanes.iter_mut().zip(block) {
                    *lane += u8::from(!is_continuation(byte));
                }
            }
            count += lane_sum(&lanes);
        }
        count += tail.iter().filter(|byte| !is_continuation(**byte)).count() as u64;
    }
    count
}

/// The sum of 64 byte-wide lanes, eight at a time: adjacent bytes added into 16-bit lanes (at
/// most 510 each), which one multiply sums into the word's top 16 bits (at most 2,040).
fn lane_sum(lanes: &[u8; 64]) -> u64 {
    const EVEN_BYTES: u64 = 0x00FF_00FF_00FF_00FF;
    let words = lanes.as_chunks::<8>().0;
    words
        .iter()
        .map(|word| {
            let word = u64::from_le_bytes(*word);
            let pairs = (word & EVEN_BYTES) + ((word >> 8) & EVEN_BYTES);
            pairs.wrapping_mul(0x0001_0001_0001_0001) >> 48
        })
        .sum()
}

impl Keying for TextKeys {
    type E = u8;
    const KIND: TreeKind = TreeKind::Text;

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

    fn report(&self, elements: &[u8]) -> Vec<u64> {
        elements.iter().map(|byte| u64::from(*byte)).collect()
    }
}

/// The page hash's lane seeds and multiplier (odd 64-bit constants with well-mixed bits).
const PAGE_HASH_SEEDS: [u64; 4] = [
    0x9e37_79b9_7f4a_7c15,
    0xbf58_476d_1ce4_e5b9,
    0x94d0_49bb_1331_11eb,
    0xd6e8_feb8_6659_fd93,
];
const PAGE_HASH_PRIME: u64 = 0xff51_afd7_ed55_8ccd;

/// One lane step of the page hash: a bijection of the lane for any word, so two pages that
/// differ in one word always hash apart.
fn mix(lane: u64, word: u64) -> u64 {
    (lane ^ word).wrapping_mul(PAGE_HASH_PRIME).rotate_left(29)
}

/// The 64-bit hash of one page of token ids, in which every bit of every id counts, in order.
/// Two ids make one word, four words run in four independent lanes (a page of 16 tokens is two
/// multiplies deep), and the lanes fold into one word with a last multiply.
pub fn page_hash(page: &[u32]) -> u64 {
    let word =
        |pair: &[u32]| u64::from(pair[0]) | u64::from(pair.get(1).copied().unwrap_or(0)) << 32;
    let mut lanes = PAGE_HASH_SEEDS;
    let mut octets = page.chunks_exact(8);
    for ids in octets.by_ref() {
        for (lane, pair) in lanes.iter_mut().zip(ids.chunks_exact(2)) {
            *lane = mix(*lane, word(pair));
        }
    }
    // A page's length is the tree's block size, the same for every page compared, so the
    // missing half of an odd tail needs no marker.
    for (lane, pair) in lanes.iter_mut().zip(octets.remainder().chunks(2)) {
        *lane = mix(*lane, word(pair));
    }
    let folded =
        lanes[0] ^ lanes[1].rotate_left(16) ^ lanes[2].rotate_left(32) ^ lanes[3].rotate_left(48);
    let hash = (folded ^ page.len() as u64).wrapping_mul(PAGE_HASH_PRIME);
    hash ^ hash >> 32
}

/// A request's token ids as the token tree keys them: one 64-bit hash per whole page of
/// `block_size` ids ([`page_hash`]), computed once per request into a buffer reused across
/// requests. A trailing partial page gets no hash (a match counts whole pages only).
///
/// The tree stores and compares these hashes, not the ids: an 8k-token prompt is 512 words
/// (4 KiB at a block size of 16) instead of 24 KiB of ids at three bytes each, and that is what
/// the lookup, the record's copy and the insert move through caches that miss on nearly every
/// label (measured in `perf/results-index.md`). Two different pages that hash alike would
/// match: about 2^-64 per comparison for real prompts; a page crafted to collide changes only
/// routing (which worker holds what), never what an engine computes.
#[derive(Clone, Debug, Default)]
pub struct TokenPages {
    pages: Vec<u64>,
    tokens: usize,
    block_size: usize,
}

impl TokenPages {
    /// The page hashes of `tokens`, `block_size` ids per page.
    pub fn of(tokens: &[u32], block_size: usize) -> Self {
        let mut pages = Self::default();
        pages.hash(tokens, block_size);
        pages
    }

    /// Replaces the contents with the page hashes of `tokens`, `block_size` ids per page (a
    /// block size of 0 hashes no page).
    pub fn hash(&mut self, tokens: &[u32], block_size: usize) {
        self.tokens = tokens.len();
        self.block_size = block_size;
        self.pages.clear();
        if block_size > 0 {
            self.pages
                .extend(tokens.chunks_exact(block_size).map(page_hash));
        }
    }

    /// One hash per whole page.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// Tokens in the request (a trailing partial page included).
    pub fn request_tokens(&self) -> usize {
        self.tokens
    }

    /// Token ids per page the hashes were computed with.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of buffer kept for the next `hash`.
    pub fn retained_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<u64>()
    }
}

/// Bytes of routing text per text page ([`TokenPages::hash_text`]): about the text of one
/// page of tokens at the default `--block-size` (16 tokens of 3-4 bytes), so a match on a peer's
/// text pages is about as fine as a token match, and a 2,048-token system prompt is about 130
/// pages (1 KiB of hashes on the wire).
pub const TEXT_PAGE_BYTES: usize = 64;

/// The seed of text page hashes: fixed, so every gateway hashes a text alike (the mesh's rule,
/// `mesh::paths`), and another function than the token pages' lanes, so text pages and token
/// pages stored in one tree do not meet except by a 64-bit collision.
const TEXT_PAGE_SEED: u64 = 0x7465_7874_7061_6765; // "textpage"

/// The hash of one page of routing text (`TEXT_PAGE_BYTES` bytes, cut on bytes: a page may end
/// inside a character, the same way on every gateway).
pub fn text_page_hash(page: &[u8]) -> u64 {
    xxh3_64_with_seed(page, TEXT_PAGE_SEED)
}

impl TokenPages {
    /// Replaces the contents with the hashes of `text`'s first `pages_max` whole pages of
    /// [`TEXT_PAGE_BYTES`] ([`text_page_hash`]; a trailing partial page gets none), each
    /// counted as `block_size` tokens: the token tree's unit, so text pages are stored and
    /// looked up as token pages are. This is how the mesh shares a text path without its text
    /// (`mesh::text`) and how a text request is looked up in what peers shared.
    pub fn hash_text(&mut self, text: &[u8], block_size: usize, pages_max: usize) {
        self.pages.clear();
        self.pages.extend(
            text.chunks_exact(TEXT_PAGE_BYTES)
                .take(pages_max)
                .map(text_page_hash),
        );
        self.block_size = block_size;
        self.tokens = self.pages.len() * block_size;
    }
}

/// Page hashes of token ids ([`TokenPages`]): a unit is one hash, a page of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub struct PageKeys {
    /// Tokens per page (`--block-size`), at least 1.
    pub block_size: usize,
}

impl Keying for PageKeys {
    type E = u64;
    const KIND: TreeKind = TreeKind::Tokens;

    fn edge_key(&self, rest: &[u64]) -> Option<u64> {
        rest.first().copied()
    }

    fn floor(&self, key: &[u64], pos: usize) -> usize {
        pos.min(key.len())
    }

    fn units(&self, segment: &[u64]) -> u64 {
        (segment.len() * self.block_size) as u64
    }

    fn report(&self, elements: &[u64]) -> Vec<u64> {
        elements.to_vec()
    }
}

/// Length of the common prefix of `a` and `b`. Long prefixes are the common case (a next turn
/// repeats thousands of characters or pages), so equal spans are skipped a large block at a
/// time: one `memcmp` call per 2,048 elements (the call, not the comparison, dominated with small
/// blocks: 24 calls for a 24 KiB match at 1 KiB), then the block that differs is narrowed down
/// in smaller blocks and finally element by element.
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
    use std::collections::HashSet;

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
        // Past one group of 255 blocks, with lanes full: ASCII (a start every byte) and text
        // of two-, three- and four-byte characters.
        for text in ["x".repeat(40_000), "aé€😀b".repeat(4_000)] {
            for end in [16_319, 16_320, 16_321, 32_705, text.len()] {
                let end = (end..=text.len())
                    .find(|end| text.is_char_boundary(*end))
                    .unwrap_or(text.len());
                assert_eq!(
                    count_chars(&text.as_bytes()[..end]),
                    text[..end].chars().count() as u64
                );
            }
        }
    }

    #[test]
    fn pages_are_whole() {
        let six = TokenPages::of(&[1, 2, 3, 4, 5, 6], 4);
        assert_eq!(six.pages(), TokenPages::of(&[1, 2, 3, 4], 4).pages());
        assert_eq!(six.pages(), &[page_hash(&[1, 2, 3, 4])]);
        assert_eq!(six.request_tokens(), 6);
        assert!(TokenPages::of(&[1, 2, 3], 4).pages().is_empty());
        assert!(TokenPages::of(&[1, 2, 3], 0).pages().is_empty());
        let keys = PageKeys { block_size: 4 };
        let three = TokenPages::of(&[7; 12], 4);
        assert_eq!(keys.floor(three.pages(), 2), 2);
        assert_eq!(keys.floor(three.pages(), 99), 3);
        assert_eq!(keys.units(three.pages()), 12);
        assert_eq!(keys.edge_key(three.pages()), Some(page_hash(&[7; 4])));
        assert_eq!(keys.edge_key(&[]), None);
        // The buffer is reused: a shorter request leaves nothing of a longer one.
        let mut pages = TokenPages::of(&[7; 100], 4);
        pages.hash(&[1, 2, 3, 4], 2);
        assert_eq!(pages.pages(), &[page_hash(&[1, 2]), page_hash(&[3, 4])]);
        assert_eq!((pages.request_tokens(), pages.block_size()), (4, 2));
    }

    #[test]
    fn every_bit_of_every_id_counts_in_order() {
        for block_size in [1, 2, 3, 7, 8, 16, 17, 64] {
            let page: Vec<u32> = (1..=block_size as u32)
                .map(|t| t.wrapping_mul(0x9e37_79b9))
                .collect();
            let hash = page_hash(&page);
            for at in 0..block_size {
                for bit in 0..32 {
                    let mut other = page.clone();
                    other[at] ^= 1 << bit;
                    assert_ne!(hash, page_hash(&other), "{block_size} {at} {bit}");
                }
            }
            if block_size > 1 {
                let mut swapped = page.clone();
                swapped.swap(0, block_size - 1);
                assert_ne!(hash, page_hash(&swapped), "{block_size}");
            }
        }
    }

    #[test]
    fn page_hashes_of_real_sized_vocabularies_do_not_collide() {
        // 200k pages of 16 ids from a 2^18 vocabulary, most differing from one base page in one
        // or two ids (as neighbouring turns of one conversation do): as many distinct hashes as
        // distinct pages, and low bits spread enough for the child tables keyed by them.
        let (mut pages, mut hashes) = (HashSet::new(), HashSet::new());
        let mut low = HashSet::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as u32 & ((1 << 18) - 1)
        };
        let base: Vec<u32> = (0..16).map(|_| next()).collect();
        for i in 0..200_000u32 {
            let mut page = base.clone();
            page[(i % 16) as usize] = next();
            if i % 3 == 0 {
                page[((i / 16) % 16) as usize] = next();
            }
            if i % 7 == 0 {
                page = (0..16).map(|_| next()).collect();
            }
            let hash = page_hash(&page);
            hashes.insert(hash);
            low.insert(hash & 0xffff);
            pages.insert(page);
        }
        assert!(pages.len() > 190_000, "{} distinct pages", pages.len());
        assert_eq!(hashes.len(), pages.len());
        // Random hashes fill 1 - e^-3 (95%, 62.3k) of 2^16 buckets with 198k draws.
        assert!(low.len() > 61_500, "{} distinct low 16 bits", low.len());
    }

    #[test]
    fn text_pages_are_whole_capped_and_apart_from_token_pages() {
        let page = "a system prompt that many conversations share, page after page. ";
        assert_eq!(page.len(), 64);
        let pages_of_text = (0..5).map(|i| format!("{i:03}{}", &page[3..]));
        let text = pages_of_text.collect::<String>() + "and a tail";
        let mut pages = TokenPages::default();
        pages.hash_text(text.as_bytes(), 16, usize::MAX);
        assert_eq!(pages.pages().len(), 5, "a partial page gets no hash");
        assert_eq!(pages.block_size(), 16);
        assert_eq!(
            pages.request_tokens(),
            5 * 16,
            "each page counts as a page of tokens"
        );
        for (page, bytes) in pages.pages().iter().zip(text.as_bytes().chunks_exact(64)) {
            assert_eq!(*page, text_page_hash(bytes));
        }
        // A text that shares the first 128 bytes shares the first two pages, then parts.
        let mut other = text.clone().into_bytes();
        other[130] ^= 1;
        let mut others = TokenPages::default();
        others.hash_text(&other, 16, usize::MAX);
        assert_eq!(pages.pages()[..2], others.pages()[..2]);
        assert_ne!(pages.pages()[2], others.pages()[2]);
        assert_eq!(pages.pages()[3..], others.pages()[3..], "pages hash alone");
        // Capped: a long text hashes only its first pages.
        pages.hash_text(text.as_bytes(), 16, 2);
        assert_eq!(pages.pages(), &others.pages()[..2]);
        // The same 64 bytes as a text page and as sixteen token ids hash apart.
        let ids: Vec<u32> = text.as_bytes()[..64]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_ne!(page_hash(&ids), text_page_hash(&text.as_bytes()[..64]));
        // Shorter than a page: no page at all.
        pages.hash_text(b"short", 16, usize::MAX);
        assert!(pages.pages().is_empty());
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
