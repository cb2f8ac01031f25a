//! [`CharTokens`]: the token each two- or three-byte character merges into by itself, and the
//! neighbours next to which merging may start from that token instead of from its bytes. A CJK
//! pre-token then merges from one symbol per character instead of three: a third of the
//! symbols, about a fifth of the merges (most of a CJK word's merges are inside characters).
//!
//! Why it is exact. Merging (`super::merge`) repeatedly applies the adjacent pair of lowest
//! merge rank, the leftmost on a tie. Two facts make a character's own merges separable:
//!
//! 1. **Monotone ranks** (checked at load, else this table stays empty): every merge has a
//!    higher rank than every merge that makes one of its two tokens. Then a merge never creates
//!    a pair of lower rank than its own, the ranks applied never decrease, and merging is the
//!    same as: for each rank in increasing order, apply that merge left to right over the
//!    current symbols.
//! 2. **No merge across the character's edge while it is incomplete** (checked per character and
//!    neighbour, below). Merged alone, a character's bytes pass through intermediate symbols
//!    before its token. Only two chains of them ever touch a neighbour: the successive first
//!    symbols (each consumed, as a left side, by an inside merge of some rank D) and the
//!    successive last symbols (each consumed as a right side at rank D). A first symbol `x`
//!    could instead merge with whatever ends the previous character, `(w, x)`, only through a
//!    merge of rank at most D (at D itself the pair is the same merge and the leftmost, the
//!    outside one, goes first); a last symbol `x` with what starts the next character, `(x, y)`,
//!    only below D (at D the inside pair is the leftmost). `w` ends with the previous
//!    character's last byte and `y` starts with the next character's first byte, whatever
//!    happened around them, so the check is per neighbouring byte: [`ContextMask`].
//!
//! With both, no outside merge ever takes an intermediate symbol, so each such character's
//! inside merges run exactly as when it is alone, independently of everything else; by (1) any
//! merge of its token ranks above the merge that makes it, so applying the rank passes to the state
//! where the character already is its token does the same merges in the same order. Characters
//! without an entry, or with a neighbour their mask refuses, stay bytes (also exact).
//!
//! Qwen2/3's vocabularies are monotone (their merged token is always rank + 256); Llama 3's
//! merges, converted from tiktoken with every split of every token, are not, so it merges from
//! bytes. Only characters of the Basic Multilingual Plane (two or three bytes) have entries.

use std::collections::HashMap;

/// No token for this code point (no entry).
const NO_TOKEN: u32 = u32::MAX;

/// Masks that one table may hold (an entry's index is a `u16`).
const MASKS_MAX: usize = u16::MAX as usize;

/// The neighbouring bytes next to which a character may start as its token: bit `b` of
/// `before` says the previous character may end with byte `b`, of `after` that the next one may
/// start with `b`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ContextMask {
    before: [u64; 4],
    after: [u64; 4],
}

impl ContextMask {
    const ALL: ContextMask = ContextMask {
        before: [u64::MAX; 4],
        after: [u64::MAX; 4],
    };

    fn clear(bits: &mut [u64; 4], byte: u8) {
        bits[usize::from(byte >> 6)] &= !(1u64 << (byte & 63));
    }

    #[inline]
    fn has(bits: &[u64; 4], byte: u8) -> bool {
        bits[usize::from(byte >> 6)] & (1u64 << (byte & 63)) != 0
    }
}

#[derive(Clone, Copy)]
struct Entry {
    token: u32,
    mask: u16,
}

/// See the module documentation.
pub struct CharTokens {
    /// By code point below U+10000 (empty: no character starts as a token).
    entries: Box<[Entry]>,
    masks: Vec<ContextMask>,
}

/// What [`CharTokens::build`] reads of a model.
pub trait MergeRanks {
    /// The merge of two tokens: its rank and the token it makes.
    fn merge_ranks(&self, left: u32, right: u32) -> Option<(u32, u32)>;
    /// The token of a byte.
    fn byte_token(&self, byte: u8) -> u32;
    /// The bytes of a token.
    fn token_bytes(&self, id: u32) -> &[u8];
}

/// One merge of a character merged alone: where (the left symbol's index), its rank, and how
/// many symbols there were before it.
struct Step {
    at: usize,
    rank: u32,
    symbols: usize,
    left: u32,
    right: u32,
}

impl CharTokens {
    /// No entries: every character merges from its bytes.
    pub fn empty() -> CharTokens {
        CharTokens {
            entries: Box::new([]),
            masks: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Characters with an entry.
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| e.token != NO_TOKEN).count()
    }

    /// The table of `model`, whose merges are the pairs `merges` (left, right; of a pair pushed
    /// twice `model` applies the later). Empty if the ranks are not monotone.
    pub fn build(model: &impl MergeRanks, merges: &[(u32, u32)]) -> CharTokens {
        // (1) Monotone: every merge ranks above every merge that makes one of its two tokens
        // (checked over all merges, even those no bytes can reach).
        let mut made_max: HashMap<u32, u32> = HashMap::new();
        for &(left, right) in merges {
            if let Some((rank, merged)) = model.merge_ranks(left, right) {
                let max = made_max.entry(merged).or_insert(rank);
                *max = (*max).max(rank);
            }
        }
        let mut before_of: HashMap<u32, Vec<(u8, u32)>> = HashMap::new();
        let mut after_of: HashMap<u32, Vec<(u8, u32)>> = HashMap::new();
        for &(left, right) in merges {
            let Some((rank, _)) = model.merge_ranks(left, right) else {
                continue;
            };
            let made_later = |id| made_max.get(&id).is_some_and(|&made| made >= rank);
            if made_later(left) || made_later(right) {
                return CharTokens::empty();
            }
            let (l, r) = (model.token_bytes(left), model.token_bytes(right));
            if let (Some(&last), Some(&first)) = (l.last(), r.first()) {
                before_of.entry(right).or_default().push((last, rank));
                after_of.entry(left).or_default().push((first, rank));
            }
        }
        // (2) Per character: its merges alone, then the neighbours its chains allow.
        let mut entries = vec![
            Entry {
                token: NO_TOKEN,
                mask: 0
            };
            0x10000
        ];
        let mut masks: Vec<ContextMask> = Vec::new();
        let mut mask_index: HashMap<ContextMask, u16> = HashMap::new();
        let mut steps = Vec::new();
        let mut symbols = Vec::new();
        let mut utf8 = [0u8; 4];
        for c in (0x80..0x10000).filter_map(char::from_u32) {
            let bytes = c.encode_utf8(&mut utf8).as_bytes();
            merge_alone(model, bytes, &mut symbols, &mut steps);
            let [token] = symbols[..] else { continue };
            let mut mask = ContextMask::ALL;
            for step in &steps {
                if step.at == 0 {
                    // The first symbol is consumed at this rank: no outside (w, first) at or
                    // below it.
                    for &(byte, rank) in before_of.get(&step.left).into_iter().flatten() {
                        if rank <= step.rank {
                            ContextMask::clear(&mut mask.before, byte);
                        }
                    }
                }
                if step.at + 2 == step.symbols {
                    // The last symbol is consumed at this rank: no outside (last, y) below it.
                    for &(byte, rank) in after_of.get(&step.right).into_iter().flatten() {
                        if rank < step.rank {
                            ContextMask::clear(&mut mask.after, byte);
                        }
                    }
                }
            }
            let index = match mask_index.get(&mask) {
                Some(&index) => index,
                None if masks.len() < MASKS_MAX => {
                    let index = masks.len() as u16;
                    masks.push(mask);
                    mask_index.insert(mask, index);
                    index
                }
                None => continue,
            };
            entries[c as usize] = Entry { token, mask: index };
        }
        CharTokens {
            entries: entries.into_boxed_slice(),
            masks,
        }
    }

    /// The token the character `code_point` starts as, between a previous character ending
    /// with byte `before` and a next one starting with `after` (`None`: the pre-token's edge).
    #[inline]
    pub fn token(&self, code_point: u32, before: Option<u8>, after: Option<u8>) -> Option<u32> {
        let entry = self.entries.get(code_point as usize)?;
        if entry.token == NO_TOKEN {
            return None;
        }
        let mask = &self.masks[usize::from(entry.mask)];
        let fits = before.is_none_or(|b| ContextMask::has(&mask.before, b))
            && after.is_none_or(|b| ContextMask::has(&mask.after, b));
        fits.then_some(entry.token)
    }
}

impl std::fmt::Debug for CharTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CharTokens")
            .field("characters", &self.len())
            .field("masks", &self.masks.len())
            .finish()
    }
}

/// Merges `bytes` alone by the plain rule (lowest rank, leftmost), leaving the final symbols in
/// `symbols` and each merge in `steps`. Quadratic: for a character's few bytes at load.
fn merge_alone(
    model: &impl MergeRanks,
    bytes: &[u8],
    symbols: &mut Vec<u32>,
    steps: &mut Vec<Step>,
) {
    symbols.clear();
    steps.clear();
    symbols.extend(bytes.iter().map(|&b| model.byte_token(b)));
    loop {
        let best = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(at, pair)| {
                model
                    .merge_ranks(pair[0], pair[1])
                    .map(|(rank, merged)| (rank, at, merged))
            })
            .min_by_key(|&(rank, at, _)| (rank, at));
        let Some((rank, at, merged)) = best else {
            return;
        };
        steps.push(Step {
            at,
            rank,
            symbols: symbols.len(),
            left: symbols[at],
            right: symbols[at + 1],
        });
        symbols[at] = merged;
        symbols.remove(at + 1);
    }
}

/// The code point of the two- or three-byte UTF-8 character at the start of `bytes` and its
/// length, if it is one (well-formed: no overlong form, no surrogate).
#[inline]
pub fn bmp_char(bytes: &[u8]) -> Option<(u32, usize)> {
    let cont = |b: u8| (b & 0xc0 == 0x80).then_some(u32::from(b & 0x3f));
    match *bytes {
        [lead @ 0xc2..=0xdf, b1, ..] => Some(((u32::from(lead & 0x1f) << 6) | cont(b1)?, 2)),
        [lead @ 0xe0..=0xef, b1, b2, ..] => {
            let code = (u32::from(lead & 0x0f) << 12) | (cont(b1)? << 6) | cont(b2)?;
            (code >= 0x800 && !(0xd800..0xe000).contains(&code)).then_some((code, 3))
        }
        _ => None,
    }
}
