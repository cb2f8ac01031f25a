//! [`Vocab`]: a byte-level BPE model's tokens and merges, and the merging of one pre-token into
//! token IDs exactly as the `tokenizers` crate merges it.
//!
//! The crate's rule (`models::bpe::Word::merge_all`): start from one symbol per byte, then
//! repeatedly apply the merge of lowest rank among the adjacent pairs, the leftmost on a tie,
//! until no adjacent pair has a merge. It keeps a heap of candidate pairs and skips an entry
//! whose pair has changed since it was pushed (it compares the merged token's ID). A pair's
//! bytes only grow as its symbols merge, so a changed pair is a longer token, never the same ID
//! again: the skip is exact, and the rule is the plain "lowest rank, leftmost" one. Here short
//! pre-tokens (the common case) apply it by scanning an array on the stack
//! ([`Vocab::merge_short`]), long ones with a heap and a linked list ([`Vocab::merge_long`]),
//! O(n log n); tests check the two against each other and the whole against the crate.
//! Both start from one symbol per byte, except that a two- or three-byte character starts as
//! its own token where [`CharTokens`] shows that merging its bytes first changes nothing (see
//! there why; it is what makes CJK fast: a third of the symbols, a fifth of the merges).
//!
//! Two shortcuts before merging: with `ignore_merges` (Llama 3) a pre-token that is a token is
//! that token, as in the crate; without it (Qwen2), a pre-token that is a token whose own bytes
//! merge back into it (checked for every token at load) is that token too, since merging is a
//! function of the bytes.

use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use xxhash_rust::xxh3::xxh3_64;

use super::chars::{bmp_char, CharTokens, MergeRanks};
use super::words::{VocabId, WordCache};
use crate::tokenize::cache::KeyIsHash;

/// Pre-tokens up to this many bytes merge on the stack, in arrays of this size (most words).
const SHORT_BYTES_MAX: usize = 16;

/// Pre-tokens up to this many bytes merge on the stack too, in larger arrays (a CJK run
/// between punctuation, an identifier); longer ones take the heap. At most `u16::MAX`.
const MEDIUM_BYTES_MAX: usize = 128;

// The stack's neighbour links are u16; the short arrays are the smaller ones.
const _: () = assert!(MEDIUM_BYTES_MAX <= u16::MAX as usize && SHORT_BYTES_MAX < MEDIUM_BYTES_MAX);

/// No merge: the rank of a pair that has none.
const NO_MERGE: u32 = u32::MAX;

/// No merge, in [`Vocab::byte_pairs`].
const NONE: Merge = Merge {
    rank: NO_MERGE,
    merged: 0,
};

/// A removed symbol of [`Vocab::merge_long`].
const REMOVED: u32 = u32::MAX;

/// The map's keys are already hashes (token bytes through xxh3, pairs through [`pair_key`]).
type HashKeyed<V> = HashMap<u64, V, BuildHasherDefault<KeyIsHash>>;

/// A pair of token IDs as a well-mixed 64-bit key (the two IDs are recoverable: the mix is a
/// bijection, so distinct pairs never share a key).
#[inline]
fn pair_key(left: u32, right: u32) -> u64 {
    let key = (u64::from(left) << 32) | u64::from(right);
    // An odd multiplier is a bijection on u64; the xor-shift spreads the high bits down.
    let mixed = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    mixed ^ (mixed >> 29)
}

/// One merge: its rank (lower merges first) and the token it makes.
#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: u32,
}

/// A byte-level BPE model: token bytes, merges, and the shortcuts (see the module
/// documentation).
pub struct Vocab {
    /// Token bytes by ID: `bytes[starts[id]..starts[id + 1]]` (empty for IDs with none).
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// Token IDs by the xxh3 hash of their bytes (unique: a collision refuses the model).
    by_hash: HashKeyed<u32>,
    /// The token of each single byte.
    byte_ids: [u32; 256],
    /// Merges by [`pair_key`].
    merges: HashKeyed<Merge>,
    /// The merges of two single bytes, by `left << 8 | right` ([`NONE`] for none): the first
    /// step of every pre-token reads this dense table instead of hashing (CJK characters are
    /// runs of two to four bytes, so these are a third to a half of their lookups).
    byte_pairs: Box<[Merge]>,
    /// Merges pushed so far: the next one's rank.
    merges_pushed: u32,
    /// Whether a pre-token that is a token is that token, whatever its merges
    /// (`tokenizer.json`'s `ignore_merges`).
    ignore_merges: bool,
    /// By ID: the token is its own pre-token's IDs (`ignore_merges`, or its bytes merge back
    /// into it).
    whole: Vec<bool>,
    /// This model's identity in the [`WordCache`].
    id: VocabId,
    /// The pairs of the merges pushed, by rank (until [`Vocab::finish`] builds `chars`).
    pairs: Vec<(u32, u32)>,
    /// The token each character may start as instead of its bytes ([`CharTokens`]; empty until
    /// [`Vocab::finish`], and for models whose ranks are not monotone).
    chars: CharTokens,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocab")
            .field("tokens", &self.by_hash.len())
            .field("merges", &self.merges.len())
            .field("chars", &self.chars)
            .finish_non_exhaustive()
    }
}

impl Vocab {
    /// A model from its tokens (as bytes, by ID), before its merges ([`Vocab::push_merge`],
    /// then [`Vocab::finish`]); `ignore_merges` as in `tokenizer.json`. `Err` says why the
    /// model cannot be served here.
    pub fn with_tokens(tokens: Vec<(u32, Vec<u8>)>, ignore_merges: bool) -> Result<Vocab, String> {
        let ids_end = tokens
            .iter()
            .map(|(id, _)| *id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut by_id: Vec<Option<Vec<u8>>> = vec![None; ids_end];
        for (id, bytes) in tokens {
            if by_id[id as usize].replace(bytes).is_some() {
                return Err(format!("two tokens have ID {id}"));
            }
        }
        let mut vocab = Vocab {
            bytes: Vec::new(),
            starts: Vec::with_capacity(ids_end + 1),
            by_hash: HashKeyed::default(),
            byte_ids: [0; 256],
            merges: HashKeyed::default(),
            byte_pairs: vec![NONE; 1 << 16].into_boxed_slice(),
            merges_pushed: 0,
            whole: vec![ignore_merges; ids_end],
            ignore_merges,
            id: VocabId::fresh(),
            pairs: Vec::new(),
            chars: CharTokens::empty(),
        };
        let mut bytes_seen = [false; 256];
        for (id, bytes) in by_id.iter().enumerate() {
            vocab.starts.push(vocab.bytes.len() as u32);
            let Some(bytes) = bytes else { continue };
            if bytes.is_empty() {
                continue;
            }
            if vocab.by_hash.insert(xxh3_64(bytes), id as u32).is_some() {
                return Err(format!("two tokens share a hash (token {id})"));
            }
            if let [byte] = bytes[..] {
                vocab.byte_ids[usize::from(byte)] = id as u32;
                bytes_seen[usize::from(byte)] = true;
            }
            vocab.bytes.extend_from_slice(bytes);
        }
        vocab.starts.push(vocab.bytes.len() as u32);
        if let Some(byte) = bytes_seen.iter().position(|seen| !seen) {
            return Err(format!("byte {byte:#04x} has no token"));
        }
        Ok(vocab)
    }

    /// Adds the next merge in rank order: the tokens spelled `left` and `right` (`None`: a
    /// merge of tokens no bytes make, which never applies but takes its rank). A later
    /// duplicate of a pair replaces the earlier one, as in the crate.
    pub fn push_merge(&mut self, pair: Option<(&[u8], &[u8])>) -> Result<(), String> {
        let rank = self.merges_pushed;
        self.merges_pushed = rank.checked_add(1).ok_or("too many merges")?;
        let Some((left, right)) = pair else {
            return Ok(());
        };
        let id = |bytes: &[u8]| {
            self.lookup(bytes).ok_or_else(|| {
                format!(
                    "merge {rank}: {:?} is not a token",
                    String::from_utf8_lossy(bytes)
                )
            })
        };
        let (left_id, right_id) = (id(left)?, id(right)?);
        let mut joined = Vec::with_capacity(left.len() + right.len());
        joined.extend_from_slice(left);
        joined.extend_from_slice(right);
        let merge = Merge {
            rank,
            merged: id(&joined)?,
        };
        self.merges.insert(pair_key(left_id, right_id), merge);
        self.pairs.push((left_id, right_id));
        if let ([l], [r]) = (left, right) {
            self.byte_pairs[usize::from(*l) << 8 | usize::from(*r)] = merge;
        }
        Ok(())
    }

    /// The model once every merge is in: finds the tokens that are their own pre-token's IDs,
    /// and the characters that may start as their token ([`CharTokens`]).
    pub fn finish(mut self) -> Vocab {
        if !self.ignore_merges {
            self.whole = self.tokens_that_merge_into_themselves();
        }
        let pairs = std::mem::take(&mut self.pairs);
        self.chars = CharTokens::build(&self, &pairs);
        self
    }

    /// For each ID: whether its bytes merge into exactly it (`chars` is still empty: from bytes).
    fn tokens_that_merge_into_themselves(&self) -> Vec<bool> {
        let mut out = Vec::new();
        (0..self.starts.len() - 1)
            .map(|id| {
                let bytes = self.token(id as u32);
                if bytes.is_empty() {
                    return false;
                }
                out.clear();
                self.merge(bytes, &mut out);
                out[..] == [id as u32]
            })
            .collect()
    }

    /// How many characters may start merging as their token ([`CharTokens`]).
    pub fn char_tokens(&self) -> usize {
        self.chars.len()
    }

    /// The bytes of token `id` (empty for an ID with none).
    fn token(&self, id: u32) -> &[u8] {
        let id = id as usize;
        match (self.starts.get(id), self.starts.get(id + 1)) {
            (Some(&start), Some(&end)) => &self.bytes[start as usize..end as usize],
            _ => &[],
        }
    }

    /// The token whose bytes are `bytes`.
    #[inline]
    fn lookup(&self, bytes: &[u8]) -> Option<u32> {
        let id = *self.by_hash.get(&xxh3_64(bytes))?;
        (self.token(id) == bytes).then_some(id)
    }

    #[inline]
    fn merge_of(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// The merge of two single bytes (their tokens' [`Vocab::merge_of`]).
    #[cfg(test)]
    fn merge_of_bytes(&self, left: u8, right: u8) -> Option<Merge> {
        let merge = self.byte_pairs[usize::from(left) << 8 | usize::from(right)];
        (merge.rank != NO_MERGE).then_some(merge)
    }

    /// Appends the IDs of one pre-token (non-empty) to `out`.
    #[inline]
    pub fn encode_pretoken(&self, pretoken: &[u8], out: &mut Vec<u32>) {
        if !self.encode_shortcut(pretoken, out) {
            self.merge(pretoken, out);
        }
    }

    /// [`Vocab::encode_pretoken`] through a cache of words merged before.
    #[inline]
    pub fn encode_pretoken_cached(
        &self,
        pretoken: &[u8],
        out: &mut Vec<u32>,
        words: &mut WordCache,
    ) {
        if self.encode_shortcut(pretoken, out) || words.get(self.id, pretoken, out) {
            return;
        }
        let start = out.len();
        self.merge(pretoken, out);
        words.put(self.id, pretoken, &out[start..]);
    }

    /// Appends the ID of a pre-token that is one byte or a token of its own, if it is one.
    #[inline]
    fn encode_shortcut(&self, pretoken: &[u8], out: &mut Vec<u32>) -> bool {
        if let [byte] = pretoken {
            out.push(self.byte_ids[usize::from(*byte)]);
            return true;
        }
        match self.lookup(pretoken) {
            Some(id) if self.whole[id as usize] => {
                out.push(id);
                true
            }
            _ => false,
        }
    }

    /// Merges `bytes` (non-empty), appending the IDs to `out`.
    fn merge(&self, bytes: &[u8], out: &mut Vec<u32>) {
        if bytes.len() <= SHORT_BYTES_MAX {
            self.merge_short::<SHORT_BYTES_MAX>(bytes, out)
        } else if bytes.len() <= MEDIUM_BYTES_MAX {
            self.merge_short::<MEDIUM_BYTES_MAX>(bytes, out)
        } else {
            self.merge_long(bytes, out)
        }
    }

    /// The rule on arrays on the stack (at most `N` bytes): each pair's rank kept at its left
    /// symbol's first byte (no merge for a removed symbol or the last), the symbols linked in
    /// order; each step takes the lowest rank, the leftmost on a tie (two linear passes over a
    /// dense array, which vectorize), merges and re-ranks the two pairs around it. O(n^2) for n
    /// bytes with a small constant: the fastest for short and medium pre-tokens.
    fn merge_short<const N: usize>(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let mut ids = [0u32; N];
        let mut ranks = [NO_MERGE; N];
        let mut merged = [0u32; N];
        let mut len = 0;
        self.initial_symbols(bytes, |id, merge| {
            if len > 0 {
                let merge =
                    merge.unwrap_or_else(|| self.merge_of(ids[len - 1], id).unwrap_or(NONE));
                ranks[len - 1] = merge.rank;
                merged[len - 1] = merge.merged;
            }
            ids[len] = id;
            len += 1;
        });
        // Neighbours by position: `len` is none after, `N` none before (N > any position).
        let mut next = [0u16; N];
        let mut prev = [0u16; N];
        for at in 0..len {
            next[at] = (at + 1) as u16;
            prev[at] = if at == 0 { N as u16 } else { (at - 1) as u16 };
        }
        let rank_pair = |ids: &[u32; N],
                         ranks: &mut [u32; N],
                         merged: &mut [u32; N],
                         at: usize,
                         right: usize| {
            let merge = self.merge_of(ids[at], ids[right]);
            ranks[at] = merge.map_or(NO_MERGE, |m| m.rank);
            merged[at] = merge.map_or(0, |m| m.merged);
        };
        loop {
            let live = &ranks[..len];
            let lowest = live.iter().copied().min().unwrap_or(NO_MERGE);
            if lowest == NO_MERGE {
                break;
            }
            let Some(at) = live.iter().position(|&rank| rank == lowest) else {
                break;
            };
            let right = usize::from(next[at]);
            ids[at] = merged[at];
            ids[right] = REMOVED;
            ranks[right] = NO_MERGE;
            let after = usize::from(next[right]);
            next[at] = after as u16;
            if after < len {
                prev[after] = at as u16;
                rank_pair(&ids, &mut ranks, &mut merged, at, after);
            } else {
                ranks[at] = NO_MERGE;
            }
            let before = usize::from(prev[at]);
            if before < len {
                rank_pair(&ids, &mut ranks, &mut merged, before, at);
            }
        }
        out.extend(ids[..len].iter().copied().filter(|&id| id != REMOVED));
    }

    /// The rule with a min-heap of (rank, position) over a linked list of symbols: an entry
    /// whose pair has changed is skipped (its rank no longer matches: see the module
    /// documentation). O(n log n) for n bytes, 12 bytes per byte plus the heap's 8 per entry.
    fn merge_long(&self, bytes: &[u8], out: &mut Vec<u32>) {
        let entry = |rank: u32, at: usize| std::cmp::Reverse((u64::from(rank) << 32) | at as u64);
        let mut ids: Vec<u32> = Vec::with_capacity(bytes.len());
        let mut heap: BinaryHeap<std::cmp::Reverse<u64>> = BinaryHeap::new();
        self.initial_symbols(bytes, |id, merge| {
            if let Some(&left) = ids.last() {
                let merge = merge.or_else(|| self.merge_of(left, id));
                if let Some(m) = merge.filter(|m| m.rank != NO_MERGE) {
                    heap.push(entry(m.rank, ids.len() - 1));
                }
            }
            ids.push(id);
        });
        let len = ids.len();
        // Neighbours by position; `len` (next) and `usize::MAX`-like `u32::MAX` (prev) are none.
        let mut next: Vec<u32> = (1..=len as u32).collect();
        let mut prev: Vec<u32> = (0..len as u32).map(|p| p.wrapping_sub(1)).collect();
        while let Some(std::cmp::Reverse(top)) = heap.pop() {
            let (rank, at) = ((top >> 32) as u32, (top & 0xffff_ffff) as usize);
            let right = next[at] as usize;
            if ids[at] == REMOVED || right >= len {
                continue;
            }
            let Some(merge) = self.merge_of(ids[at], ids[right]) else {
                continue;
            };
            if merge.rank != rank {
                continue;
            }
            ids[at] = merge.merged;
            ids[right] = REMOVED;
            let after = next[right] as usize;
            next[at] = after as u32;
            if after < len {
                prev[after] = at as u32;
                if let Some(m) = self.merge_of(ids[at], ids[after]) {
                    heap.push(entry(m.rank, at));
                }
            }
            let before = prev[at] as usize;
            if before < len {
                if let Some(m) = self.merge_of(ids[before], ids[at]) {
                    heap.push(entry(m.rank, before));
                }
            }
        }
        out.extend(ids.into_iter().filter(|&id| id != REMOVED));
    }

    /// Calls `symbol` with each symbol merging starts from, in order: a character's token where
    /// [`CharTokens`] allows it (see there why that is exact), else each byte's token. With a
    /// symbol that follows a byte and is a byte, its merge with the one before (from the dense
    /// table: `Some(NONE)` for none); `None` where the caller must look the pair up.
    #[inline]
    fn initial_symbols(&self, bytes: &[u8], mut symbol: impl FnMut(u32, Option<Merge>)) {
        let mut byte_before: Option<u8> = None;
        let mut at = 0;
        while at < bytes.len() {
            let byte = bytes[at];
            if byte >= 0xc2 && !self.chars.is_empty() {
                if let Some((code, width)) = bmp_char(&bytes[at..]) {
                    let before = at.checked_sub(1).map(|p| bytes[p]);
                    let after = bytes.get(at + width).copied();
                    if let Some(token) = self.chars.token(code, before, after) {
                        symbol(token, None);
                        byte_before = None;
                        at += width;
                        continue;
                    }
                }
            }
            let merge =
                byte_before.map(|left| self.byte_pairs[usize::from(left) << 8 | usize::from(byte)]);
            symbol(self.byte_ids[usize::from(byte)], merge);
            byte_before = Some(byte);
            at += 1;
        }
    }
}

impl MergeRanks for Vocab {
    fn merge_ranks(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.merge_of(left, right).map(|m| (m.rank, m.merged))
    }

    fn byte_token(&self, byte: u8) -> u32 {
        self.byte_ids[usize::from(byte)]
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        self.token(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model from tokens and merges given as ID pairs.
    fn vocab_of(tokens: Vec<(u32, Vec<u8>)>, merges: &[(u32, u32)], ignore_merges: bool) -> Vocab {
        let spelled: HashMap<u32, Vec<u8>> = tokens.iter().cloned().collect();
        let mut vocab = Vocab::with_tokens(tokens, ignore_merges).expect("valid tokens");
        for (left, right) in merges {
            vocab
                .push_merge(Some((&spelled[left], &spelled[right])))
                .expect("a valid merge");
        }
        vocab.finish()
    }

    /// A toy model: the 256 bytes, then merges over a small alphabet built up from random pairs.
    fn toy(seed: u64, ignore_merges: bool) -> Vocab {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let mut merges = Vec::new();
        let mut seen: std::collections::HashSet<Vec<u8>> = tokens.iter().cloned().collect();
        let small: Vec<u32> = b"abc ".iter().map(|&b| u32::from(b)).collect();
        let mut pool = small.clone();
        while merges.len() < 60 {
            let left = pool[rng.usize(..pool.len())];
            let right = pool[rng.usize(..pool.len())];
            let mut joined = tokens[left as usize].clone();
            joined.extend_from_slice(&tokens[right as usize]);
            if joined.len() > 6 {
                continue;
            }
            if seen.insert(joined.clone()) {
                tokens.push(joined);
                pool.push(tokens.len() as u32 - 1);
            }
            // Duplicate pairs and second routes to a token are kept: the crate accepts them.
            merges.push((left, right));
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(id, bytes)| (id as u32, bytes))
            .collect();
        vocab_of(tokens, &merges, ignore_merges)
    }

    #[test]
    fn short_and_long_merging_agree_on_random_words() {
        for seed in 0..20 {
            let vocab = toy(seed, false);
            // The dense table of byte pairs is the map's merges of byte tokens.
            for (l, r) in (0..=255u8).flat_map(|l| (0..=255u8).map(move |r| (l, r))) {
                let map = vocab.merge_of(
                    vocab.byte_ids[usize::from(l)],
                    vocab.byte_ids[usize::from(r)],
                );
                let dense = vocab.merge_of_bytes(l, r);
                assert_eq!(
                    map.map(|m| (m.rank, m.merged)),
                    dense.map(|m| (m.rank, m.merged))
                );
            }
            let mut rng = fastrand::Rng::with_seed(seed + 100);
            for _ in 0..200 {
                let len = rng.usize(1..=MEDIUM_BYTES_MAX);
                let word: Vec<u8> = (0..len).map(|_| b"abc "[rng.usize(..4)]).collect();
                let (mut short, mut long) = (Vec::new(), Vec::new());
                vocab.merge_short::<MEDIUM_BYTES_MAX>(&word, &mut short);
                vocab.merge_long(&word, &mut long);
                assert_eq!(
                    short,
                    long,
                    "seed {seed}: {:?}",
                    String::from_utf8_lossy(&word)
                );
                // The IDs spell the word.
                let spelled: Vec<u8> = short
                    .iter()
                    .flat_map(|&id| vocab.token(id).to_vec())
                    .collect();
                assert_eq!(spelled, word);
            }
        }
    }

    /// The characters of the multibyte toys: two and three bytes, sharing lead bytes.
    const TOY_CHARS: [&str; 7] = ["é", "ü", "中", "文", "丢", "a", " "];

    /// A toy model over [`TOY_CHARS`]' bytes: random merges of tokens made so far (so ranks are
    /// monotone unless a second route to a token comes later), among them each character's own
    /// merges in a random order at random ranks; `chars` built or emptied.
    fn toy_multibyte(seed: u64, with_chars: bool) -> Vocab {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let mut by_bytes: HashMap<Vec<u8>, u32> =
            (0..=255u8).map(|b| (vec![b], u32::from(b))).collect();
        let mut pool: Vec<u32> = TOY_CHARS
            .iter()
            .flat_map(|c| c.bytes())
            .map(u32::from)
            .collect();
        pool.sort_unstable();
        pool.dedup();
        // Each multibyte character's merges: its first two bytes then the third, or the last
        // two then the first.
        let mut inside: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for c in TOY_CHARS.iter().map(|c| c.as_bytes()) {
            match *c {
                [a, b] => inside.push((vec![a], vec![b])),
                [a, b, c] if rng.bool() => {
                    inside.extend([(vec![a], vec![b]), (vec![a, b], vec![c])]);
                }
                [a, b, c] => inside.extend([(vec![b], vec![c]), (vec![a], vec![b, c])]),
                _ => {}
            }
        }
        inside.reverse();
        let mut merges = Vec::new();
        while merges.len() < 150 {
            let (left, right) = match inside.last() {
                Some((l, r)) if rng.usize(..8) == 0 => {
                    let pair = (by_bytes[l], by_bytes[r]);
                    inside.pop();
                    pair
                }
                _ => (pool[rng.usize(..pool.len())], pool[rng.usize(..pool.len())]),
            };
            let mut joined = tokens[left as usize].clone();
            joined.extend_from_slice(&tokens[right as usize]);
            if joined.len() > 9 {
                continue;
            }
            if !by_bytes.contains_key(&joined) {
                by_bytes.insert(joined.clone(), tokens.len() as u32);
                tokens.push(joined);
                pool.push(tokens.len() as u32 - 1);
            }
            // Duplicate pairs and second routes to a token are kept: the crate accepts them.
            merges.push((left, right));
        }
        let tokens = tokens
            .into_iter()
            .enumerate()
            .map(|(id, bytes)| (id as u32, bytes))
            .collect();
        let mut vocab = vocab_of(tokens, &merges, false);
        if !with_chars {
            vocab.chars = CharTokens::empty();
        }
        vocab
    }

    #[test]
    fn starting_characters_as_their_tokens_merges_as_from_bytes() {
        let (mut tables, mut characters) = (0, 0);
        for seed in 0..200 {
            let (chars, bytes) = (toy_multibyte(seed, true), toy_multibyte(seed, false));
            if chars.chars.is_empty() {
                continue;
            }
            tables += 1;
            characters += chars.char_tokens();
            let mut rng = fastrand::Rng::with_seed(seed + 1000);
            for _ in 0..300 {
                let word: String = (0..rng.usize(1..40))
                    .map(|_| TOY_CHARS[rng.usize(..TOY_CHARS.len())])
                    .collect();
                let word = word.as_bytes();
                let (mut from_bytes, mut short, mut long) = (Vec::new(), Vec::new(), Vec::new());
                bytes.merge(word, &mut from_bytes);
                if word.len() <= MEDIUM_BYTES_MAX {
                    chars.merge_short::<MEDIUM_BYTES_MAX>(word, &mut short);
                    assert_eq!(
                        short,
                        from_bytes,
                        "seed {seed}: {:?}",
                        String::from_utf8_lossy(word)
                    );
                }
                chars.merge_long(word, &mut long);
                assert_eq!(
                    long,
                    from_bytes,
                    "seed {seed}: {:?}",
                    String::from_utf8_lossy(word)
                );
            }
        }
        // Many seeds' merges are monotone (a table; second routes to a token often are not),
        // and their tables hold characters.
        assert!(
            tables >= 20 && characters >= 20,
            "{tables} tables, {characters} characters"
        );
    }

    #[test]
    fn ranks_that_are_not_monotone_leave_the_characters_as_bytes() {
        let (e_acute, ab, abc) = (b"\xc3\xa9".to_vec(), b"ab".to_vec(), b"abc".to_vec());
        let tokens = |extra: [Vec<u8>; 3]| {
            (0..=255u8)
                .map(|b| (u32::from(b), vec![b]))
                .chain((256..).zip(extra))
                .collect::<Vec<_>>()
        };
        // é, then ab, then abc: each merge ranks above the merges that make its tokens.
        let monotone = vocab_of(
            tokens([e_acute.clone(), ab.clone(), abc.clone()]),
            &[(0xc3, 0xa9), (97, 98), (257, 99)],
            false,
        );
        assert_eq!(monotone.chars.token(0xe9, None, None), Some(256));
        // ab c ranks below a b, which makes ab: merging applies it as soon as ab is born, out
        // of rank order, so a table built on rank order could not be trusted: there is none.
        let not_monotone = vocab_of(
            tokens([e_acute, ab, abc]),
            &[(0xc3, 0xa9), (257, 99), (97, 98)],
            false,
        );
        assert!(not_monotone.chars.is_empty());
        let mut out = Vec::new();
        not_monotone.encode_pretoken("abcé".as_bytes(), &mut out);
        assert_eq!(out, [258, 256]);
    }

    #[test]
    fn merging_applies_the_lowest_rank_leftmost_first() {
        // a a -> aa (rank 0), then aa a -> aaa (rank 1): "aaa" is [aa, a] then [aaa].
        let tokens = (0..=255u8)
            .map(|b| (u32::from(b), vec![b]))
            .chain([
                (256, b"aa".to_vec()),
                (257, b"aaa".to_vec()),
                (258, b"ab".to_vec()),
            ])
            .collect();
        let merges = [(97, 97), (256, 97), (97, 98)];
        let vocab = vocab_of(tokens, &merges, false);
        let mut out = Vec::new();
        vocab.encode_pretoken(b"aaaa", &mut out);
        // aa aa (leftmost first), then no (aa, aa) merge.
        assert_eq!(out, [256, 256]);
        out.clear();
        vocab.encode_pretoken(b"aab", &mut out);
        // (a, a) rank 0 beats (a, b) rank 2.
        assert_eq!(out, [256, 98]);
        out.clear();
        vocab.encode_pretoken(b"aaa", &mut out);
        assert_eq!(out, [257]);
        assert!(vocab.whole[257] && vocab.whole[256]);
        // A long word takes the heap and gives the same answer as the array.
        let word = b"aab".repeat(40);
        let (mut short, mut long) = (Vec::new(), Vec::new());
        vocab.merge_long(&word, &mut long);
        for chunk in word.chunks(3) {
            vocab.merge_short::<SHORT_BYTES_MAX>(chunk, &mut short);
        }
        assert_eq!(long, short);
    }

    #[test]
    fn a_token_that_its_bytes_do_not_merge_into_is_not_a_shortcut() {
        // "ab" exists but no merge makes it: without ignore_merges "ab" is [a, b].
        let tokens = (0..=255u8)
            .map(|b| (u32::from(b), vec![b]))
            .chain([(256, b"ab".to_vec())])
            .collect();
        let vocab = vocab_of(tokens, &[], false);
        let mut out = Vec::new();
        vocab.encode_pretoken(b"ab", &mut out);
        assert_eq!(out, [97, 98]);
        let tokens = (0..=255u8)
            .map(|b| (u32::from(b), vec![b]))
            .chain([(256, b"ab".to_vec())])
            .collect();
        let vocab = vocab_of(tokens, &[], true);
        out.clear();
        vocab.encode_pretoken(b"ab", &mut out);
        assert_eq!(out, [256]);
    }
}
