//! Prompt content: a prompt is a short list of seeded segments, expanded into tokens only when the
//! request is sent, so a workload holds a few words of state per request however long its prompt.
//!
//! A segment `{seed, len}` always expands to the same `len` tokens, so two prompts made of the same
//! segments are equal token for token, and a prompt that starts with another's segments starts with
//! its tokens. A token is a symbol below [`SYMBOLS`]; as text it is one short word (the sim-engine
//! tokenizer makes every whitespace-separated word exactly one token), as `input_ids` it is the
//! symbol itself.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Distinct symbols: 62³ words of three base-62 characters. Small enough that a symbol printed in
/// decimal has at most 6 digits (the routing-tokens header budget relies on it), large enough that
/// two different 16-token pages collide with probability ~2⁻²⁸⁵.
pub const SYMBOLS: u32 = 62 * 62 * 62;

const _: () = assert!(SYMBOLS < 1_000_000);

const BASE62: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// A run of `len` deterministic tokens, all derived from `seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub seed: u64,
    pub len: u32,
}

/// A prompt as the segments it is made of, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prompt {
    pub segments: Vec<Segment>,
}

/// Mixes any number of words into one seed (xxh3 over their bytes, with a domain tag so that a
/// Mooncake block and a synthetic segment with the same numbers differ).
pub fn seed_of(domain: &str, parts: &[u64]) -> u64 {
    let mut bytes = Vec::with_capacity(domain.len() + parts.len() * 8);
    bytes.extend_from_slice(domain.as_bytes());
    for part in parts {
        bytes.extend_from_slice(&part.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, 0x6b76_6761_7465)
}

/// The `index`-th token of a segment seeded by `seed` (splitmix64 of the pair: cheap and stateless).
pub fn symbol_at(seed: u64, index: u32) -> u32 {
    let mut z = seed.wrapping_add(
        u64::from(index)
            .wrapping_add(1)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % u64::from(SYMBOLS)) as u32
}

impl Prompt {
    /// Total length in tokens.
    pub fn len_tokens(&self) -> u64 {
        self.segments.iter().map(|s| u64::from(s.len)).sum()
    }

    /// Appends a segment (empty ones are dropped: they would change nothing but the list).
    pub fn push(&mut self, seed: u64, len: u32) {
        if len > 0 {
            self.segments.push(Segment { seed, len });
        }
    }

    /// Every token in order.
    pub fn symbols(&self) -> impl Iterator<Item = u32> + '_ {
        self.segments
            .iter()
            .flat_map(|segment| (0..segment.len).map(move |i| symbol_at(segment.seed, i)))
    }

    /// The prompt as text: one word per token, separated by single spaces.
    pub fn write_text(&self, out: &mut Vec<u8>) {
        out.reserve(self.len_tokens() as usize * 4);
        for (i, symbol) in self.symbols().enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            write_word(symbol, out);
        }
    }

    /// The prompt as text in a `String`.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        self.write_text(&mut out);
        // Only BASE62 bytes and spaces are ever written.
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Writes one symbol as its three-character word.
pub fn write_word(symbol: u32, out: &mut Vec<u8>) {
    let s = symbol % SYMBOLS;
    out.push(BASE62[(s / (62 * 62)) as usize]);
    out.push(BASE62[(s / 62 % 62) as usize]);
    out.push(BASE62[(s % 62) as usize]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_segments_give_equal_tokens_and_words() {
        let mut a = Prompt::default();
        a.push(seed_of("t", &[1]), 40);
        a.push(seed_of("t", &[2]), 7);
        let mut b = Prompt::default();
        b.push(seed_of("t", &[1]), 40);
        b.push(seed_of("t", &[3]), 7);
        let (ta, tb): (Vec<u32>, Vec<u32>) = (a.symbols().collect(), b.symbols().collect());
        assert_eq!(ta.len(), 47);
        assert_eq!(ta[..40], tb[..40]);
        assert_ne!(ta[40..], tb[40..]);
        let (wa, wb) = (a.text(), b.text());
        assert_eq!(wa.split(' ').count(), 47);
        let prefix: Vec<&str> = wa.split(' ').take(40).collect();
        assert_eq!(prefix, wb.split(' ').take(40).collect::<Vec<_>>());
    }

    #[test]
    fn words_are_three_alphanumerics_and_distinct_per_symbol() {
        let mut seen = std::collections::HashSet::new();
        for symbol in [0, 1, 61, 62, SYMBOLS - 1] {
            let mut w = Vec::new();
            write_word(symbol, &mut w);
            assert_eq!(w.len(), 3);
            assert!(w.iter().all(u8::is_ascii_alphanumeric));
            assert!(seen.insert(w));
        }
    }
}
