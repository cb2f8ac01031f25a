//! The pre-tokenizer of the GPT-4 family of split patterns (Llama 3's and Qwen2's), written out
//! as a scanner instead of run through a regex engine: [`SplitPattern`] names the two patterns
//! as `tokenizer.json` spells them, [`Pretokens`] yields the byte ranges the pattern matches.
//!
//! The pattern, for reference (Qwen2's has `\p{N}` where Llama 3's has `\p{N}{1,3}`):
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]*
//!   | \s*[\r\n]+ | \s+(?!\S) | \s+
//! ```
//!
//! Oniguruma (the `tokenizers` crate's engine, and the Python package's) tries the alternatives
//! in order at each position and backtracks inside each; [`Pretokens::match_at`] takes them in
//! the same order, each one reduced to what its backtracking can end on (the comments there say
//! how). Every character starts some alternative (a letter, a number, whitespace, or anything
//! else), so the matches tile the text and the pre-tokens are exactly the matches.
//!
//! The character classes are Oniguruma's own: [`classes`] asks it once per process which code
//! points `\p{L}`, `\p{N}` and `\s` match (one scan of a string of every code point per class),
//! so the scanner agrees with the reference on every Unicode version question by construction.
//! The case-insensitive contractions fold as Oniguruma folds (`ſ`, U+017F, is an `s`; a test
//! checks the fold sets against it).

use std::ops::Range;
use std::sync::OnceLock;

/// Llama 3's split pattern (up to three digits per pre-token).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split pattern (one digit per pre-token).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One of the split patterns the scanner implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitPattern {
    /// [`LLAMA3_PATTERN`].
    Llama3,
    /// [`QWEN2_PATTERN`].
    Qwen2,
}

impl SplitPattern {
    /// The pattern whose regex is exactly `regex`, if it is one of ours.
    pub fn of_regex(regex: &str) -> Option<SplitPattern> {
        [SplitPattern::Llama3, SplitPattern::Qwen2]
            .into_iter()
            .find(|p| p.regex() == regex)
    }

    /// The regex as `tokenizer.json` spells it.
    pub fn regex(self) -> &'static str {
        match self {
            SplitPattern::Llama3 => LLAMA3_PATTERN,
            SplitPattern::Qwen2 => QWEN2_PATTERN,
        }
    }

    /// The most numbers one pre-token holds.
    fn numbers_max(self) -> usize {
        match self {
            SplitPattern::Llama3 => 3,
            SplitPattern::Qwen2 => 1,
        }
    }
}

/// `\p{L}`.
const LETTER: u8 = 1;
/// `\p{N}`.
const NUMBER: u8 = 2;
/// `\s`.
const SPACE: u8 = 4;

/// Which of `\p{L}`, `\p{N}` and `\s` each code point is, as Oniguruma says.
#[derive(Debug)]
pub struct CharClasses {
    /// The Basic Multilingual Plane's classes, by code point (64 KiB: one load per character
    /// for nearly all text).
    bmp: Vec<u8>,
    /// Maximal runs of code points past the BMP with the same non-zero classes, in order:
    /// (first, last + 1, classes).
    ranges: Vec<(u32, u32, u8)>,
}

impl CharClasses {
    #[inline]
    fn of(&self, c: u32) -> u8 {
        if let Some(&classes) = self.bmp.get(c as usize) {
            return classes;
        }
        match self.ranges.binary_search_by(|&(first, end, _)| {
            if end <= c {
                std::cmp::Ordering::Less
            } else if first > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        }) {
            Ok(at) => self.ranges[at].2,
            Err(_) => 0,
        }
    }

    /// The classes from Oniguruma: each class regex run once over a string of every code point.
    fn from_oniguruma() -> Result<CharClasses, String> {
        let all: String = (0u32..=char::MAX as u32)
            .filter_map(char::from_u32)
            .collect();
        let mut of: Vec<u8> = vec![0; char::MAX as usize + 1];
        for (regex, class) in [(r"\p{L}+", LETTER), (r"\p{N}+", NUMBER), (r"\s+", SPACE)] {
            let regex = onig::Regex::new(regex).map_err(|e| format!("{regex}: {e}"))?;
            for (start, end) in regex.find_iter(&all) {
                for c in all[start..end].chars() {
                    of[c as usize] |= class;
                }
            }
        }
        let bmp = of[..0x10000].to_vec();
        let mut ranges: Vec<(u32, u32, u8)> = Vec::new();
        for (c, &classes) in of.iter().enumerate().skip(0x10000) {
            let c = c as u32;
            match ranges.last_mut() {
                Some((_, end, last)) if *end == c && *last == classes => *end = c + 1,
                _ if classes != 0 => ranges.push((c, c + 1, classes)),
                _ => {}
            }
        }
        Ok(CharClasses { bmp, ranges })
    }
}

/// The classes, computed on first use (tens of milliseconds; once per process).
pub fn classes() -> Result<&'static CharClasses, String> {
    static CLASSES: OnceLock<Result<CharClasses, String>> = OnceLock::new();
    CLASSES
        .get_or_init(CharClasses::from_oniguruma)
        .as_ref()
        .map_err(Clone::clone)
}

/// The pre-tokens of a text: the byte ranges the split pattern matches, in order.
#[derive(Debug)]
pub struct Pretokens<'t> {
    text: &'t [u8],
    at: usize,
    pattern: SplitPattern,
    classes: &'static CharClasses,
}

impl<'t> Pretokens<'t> {
    /// The pre-tokens of `text` under `pattern`.
    pub fn new(text: &'t str, pattern: SplitPattern, classes: &'static CharClasses) -> Self {
        Pretokens {
            text: text.as_bytes(),
            at: 0,
            pattern,
            classes,
        }
    }

    /// The code point at `at` and its length in bytes (`(u32::MAX, 0)` at the end). `text` is
    /// valid UTF-8 and `at` is always a character boundary.
    #[inline]
    fn char_at(&self, at: usize) -> (u32, usize) {
        let bytes = self.text;
        let Some(&b0) = bytes.get(at) else {
            return (u32::MAX, 0);
        };
        let cont = |i: usize| u32::from(bytes.get(at + i).copied().unwrap_or(0) & 0x3f);
        match b0 {
            0..=0x7f => (u32::from(b0), 1),
            0xc0..=0xdf => ((u32::from(b0 & 0x1f) << 6) | cont(1), 2),
            0xe0..=0xef => ((u32::from(b0 & 0x0f) << 12) | (cont(1) << 6) | cont(2), 3),
            _ => (
                (u32::from(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
                4,
            ),
        }
    }

    /// The classes of the code point `c` (none past the end).
    #[inline]
    fn class(&self, c: u32) -> u8 {
        if c == u32::MAX {
            0
        } else {
            self.classes.of(c)
        }
    }

    /// `[^\s\p{L}\p{N}]`: anything but whitespace, letters and numbers (not past the end).
    #[inline]
    fn is_other(&self, c: u32) -> bool {
        c != u32::MAX && self.class(c) == 0
    }

    /// The end of the run from `at` of code points in `class`, up to `count_max` of them.
    #[inline]
    fn run_of(&self, mut at: usize, class: u8, count_max: usize) -> usize {
        let mut count = 0;
        while count < count_max {
            // ASCII letters, the common case, without the lookup's branches.
            if class == LETTER && at < self.text.len() && self.text[at].is_ascii_alphabetic() {
                at += 1;
                count += 1;
                continue;
            }
            let (c, len) = self.char_at(at);
            if len == 0 || self.class(c) & class == 0 {
                break;
            }
            at += len;
            count += 1;
        }
        at
    }

    /// The end of the run from `at` of `[^\s\p{L}\p{N}]`, then of `[\r\n]`.
    fn others_then_newlines(&self, mut at: usize) -> usize {
        loop {
            let (c, len) = self.char_at(at);
            if !self.is_other(c) {
                break;
            }
            at += len;
        }
        while matches!(self.text.get(at), Some(b'\r' | b'\n')) {
            at += 1;
        }
        at
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` after the apostrophe at `at - 1`: its end, if it matches.
    fn contraction(&self, at: usize) -> Option<usize> {
        let (c, len) = self.char_at(at);
        let lower = |c: u32| char::from_u32(c).map(|c| c.to_ascii_lowercase());
        match lower(c)? {
            // Oniguruma folds U+017F (long s) to `s`; no other letter has a non-ASCII fold.
            's' | 't' | 'm' | 'd' => Some(at + len),
            _ if c == 0x17f => Some(at + len),
            first @ ('r' | 'v' | 'l') => {
                let second = if first == 'l' { 'l' } else { 'e' };
                let (c2, len2) = self.char_at(at + len);
                (lower(c2)? == second).then_some(at + len + len2)
            }
            _ => None,
        }
    }

    /// The end of the match that starts at `at` (a character boundary before the end).
    fn match_at(&self, at: usize) -> usize {
        let (c, len) = self.char_at(at);
        let class = self.class(c);
        // 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == u32::from(b'\'') {
            if let Some(end) = self.contraction(at + 1) {
                return end;
            }
        }
        // 2. [^\r\n\p{L}\p{N}]?\p{L}+: a letter starts the run itself (the optional class
        // cannot take it); another character that is not CR, LF or a number starts it when a
        // letter follows (otherwise the optional backs off and \p{L}+ fails on it).
        if class & LETTER != 0 {
            return self.run_of(at + len, LETTER, usize::MAX);
        }
        if class & NUMBER == 0 && c != u32::from(b'\r') && c != u32::from(b'\n') {
            let (next, next_len) = self.char_at(at + len);
            if self.class(next) & LETTER != 0 {
                return self.run_of(at + len + next_len, LETTER, usize::MAX);
            }
        }
        // 3. \p{N}{1,3} (Llama 3) or \p{N} (Qwen2).
        if class & NUMBER != 0 {
            return self.run_of(at, NUMBER, self.pattern.numbers_max());
        }
        // 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`: a space takes the run that follows it if there is one
        // (otherwise the optional backs off and the space, being \s, fails the class).
        if c == u32::from(b' ') {
            let (next, _) = self.char_at(at + 1);
            if self.is_other(next) {
                return self.others_then_newlines(at + 1);
            }
        }
        if self.is_other(c) {
            return self.others_then_newlines(at);
        }
        // Here `c` is whitespace (neither a letter, a number nor another character).
        self.spaces(at)
    }

    /// Alternatives 5 to 7 at the whitespace at `at`.
    fn spaces(&self, at: usize) -> usize {
        // The whitespace run, the end of its last CR or LF, and the start of its last character.
        let (mut end, mut newline_end, mut last_start) = (at, None, at);
        loop {
            let (c, len) = self.char_at(end);
            if len == 0 || self.class(c) & SPACE == 0 {
                break;
            }
            if c == u32::from(b'\r') || c == u32::from(b'\n') {
                newline_end = Some(end + len);
            }
            last_start = end;
            end += len;
        }
        // 5. \s*[\r\n]+: \s* backs off to the run's last CR or LF, [\r\n]+ takes it and stops
        // (a CR or LF after it would have been the last).
        if let Some(newline_end) = newline_end {
            return newline_end;
        }
        // 6. \s+(?!\S): the whole run at the end of the text; else the run but its last
        // character, when that leaves one.
        if end == self.text.len() {
            return end;
        }
        if last_start > at {
            return last_start;
        }
        // 7. \s+: the single whitespace character.
        end
    }
}

impl Iterator for Pretokens<'_> {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.at >= self.text.len() {
            return None;
        }
        let start = self.at;
        self.at = self.match_at(start);
        Some(start..self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pre-tokens as Oniguruma cuts them (the `tokenizers` crate's Split, Isolated).
    fn by_regex(pattern: SplitPattern, text: &str) -> Vec<Range<usize>> {
        let regex = onig::Regex::new(pattern.regex()).expect("the pattern compiles");
        let mut out = Vec::new();
        let mut at = 0;
        for (start, end) in regex.find_iter(text) {
            if start > at {
                out.push(at..start);
            }
            out.push(start..end);
            at = end;
        }
        if at < text.len() {
            out.push(at..text.len());
        }
        out
    }

    fn by_scanner(pattern: SplitPattern, text: &str) -> Vec<Range<usize>> {
        let classes = classes().expect("Oniguruma's classes");
        Pretokens::new(text, pattern, classes).collect()
    }

    #[test]
    fn the_scanner_cuts_where_the_regex_does() {
        let texts = [
            "Hello world, it's a test! They'll've done 12345 things...\n\n  ok",
            "  leading\t\ttabs \n\r\n  trailing   ",
            "'s 'S 'ſ 'Re 'vE 'LL 'd 'x '' 'z",
            "日本語のテキスト、です。 한국어 😀👍🏽 👩‍👩‍👧 x\u{301} ﬁ ٣٤٥ ١٢",
            "a\u{3000}b\u{3000}\u{3000}c \u{a0}d\u{2028}e\u{85}f",
            "def f(x):\n    return x**2 # comment\n\n\n\tpass\r\n",
            "1234567 3.14159 -42 x1y22z333 ½ Ⅻ",
            "!!!\n\n??? ...\r\r\n , ; ' \" ` ~",
            " ",
            "\n",
            "x",
            "  \n",
            "a  b   c    ",
            "\u{1}\u{7f}\u{80}\u{feff}\u{10ffff}",
            "'",
            "a'",
            " 's",
            "🎉abc 🎉 abc",
        ];
        for pattern in [SplitPattern::Llama3, SplitPattern::Qwen2] {
            for text in texts {
                assert_eq!(
                    by_scanner(pattern, text),
                    by_regex(pattern, text),
                    "{pattern:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn random_strings_of_tricky_characters_cut_as_the_regex_does() {
        let alphabet: Vec<char> = "aZ1٣ '\t\n\r\u{a0}\u{3000}!.,日😀\u{301}\u{200d}ſ_-é"
            .chars()
            .collect();
        let mut rng = fastrand::Rng::with_seed(7);
        for round in 0..3_000 {
            let len = rng.usize(1..24);
            let text: String = (0..len)
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            for pattern in [SplitPattern::Llama3, SplitPattern::Qwen2] {
                assert_eq!(
                    by_scanner(pattern, &text),
                    by_regex(pattern, &text),
                    "round {round}: {pattern:?} {text:?}"
                );
            }
        }
    }

    #[test]
    fn contractions_fold_as_oniguruma_folds() {
        // Every code point after an apostrophe, against the contraction alternative alone.
        let regex = onig::Regex::new(r"(?i:'s|'t|'m|'d)").expect("compiles");
        let mut text = String::new();
        let mut starts = Vec::new();
        for c in (0u32..=char::MAX as u32).filter_map(char::from_u32) {
            starts.push((text.len(), c));
            text.push('\'');
            text.push(c);
        }
        let matched: Vec<usize> = regex.find_iter(&text).map(|(start, _)| start).collect();
        let expected: Vec<usize> = starts
            .iter()
            .filter(|(_, c)| "sStTmMdD\u{17f}".contains(*c))
            .map(|(start, _)| *start)
            .collect();
        assert_eq!(matched, expected);
        // Two-letter contractions, each letter in turn varied: `'` + before + c + after.
        let cases = [
            ("'re", "", "e", "rR"),
            ("'re", "r", "", "eE"),
            ("'ve", "", "e", "vV"),
            ("'ve", "v", "", "eE"),
            ("'ll", "", "l", "lL"),
            ("'ll", "l", "", "lL"),
        ];
        for (contraction, before, after, folds) in cases {
            let regex = onig::Regex::new(&format!("(?i:{contraction})")).expect("compiles");
            let mut text = String::new();
            let mut starts = Vec::new();
            for c in (0u32..=char::MAX as u32).filter_map(char::from_u32) {
                starts.push((text.len(), c));
                text.push('\'');
                text.push_str(before);
                text.push(c);
                text.push_str(after);
            }
            let matched: Vec<usize> = regex.find_iter(&text).map(|(start, _)| start).collect();
            let expected: Vec<usize> = starts
                .iter()
                .filter(|(_, c)| folds.contains(*c))
                .map(|(start, _)| *start)
                .collect();
            assert_eq!(matched, expected, "{contraction}: {before}?{after}");
        }
    }

    #[test]
    fn the_patterns_are_recognized_exactly() {
        assert_eq!(
            SplitPattern::of_regex(LLAMA3_PATTERN),
            Some(SplitPattern::Llama3)
        );
        assert_eq!(
            SplitPattern::of_regex(QWEN2_PATTERN),
            Some(SplitPattern::Qwen2)
        );
        assert_eq!(
            SplitPattern::of_regex(&LLAMA3_PATTERN.replace("{1,3}", "{1,2}")),
            None
        );
    }
}
