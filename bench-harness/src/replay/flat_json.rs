//! A fast reader for the flat JSON objects of line-oriented traces whose bulk is arrays of
//! integers (token ids): `{"key": scalar | "plain string" | [0, 1, ...], ...}`.
//!
//! serde_json reads such a line at 20-30 ns per id (every digit through its number parser, every
//! element through `ignore_value`); here an id array is checked and counted in passes the
//! compiler vectorizes. [`scan`] accepts only what serde_json would accept with the same
//! meaning, and answers `None` for anything else (nested objects, strings with escapes, arrays
//! of other values, malformed JSON): the caller then reads the line with serde_json, which gives
//! the error a user sees.

use serde::de::IgnoredAny;

/// A value of a flat object, as its JSON text, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlatValue<'a> {
    /// A number, `true`, `false` or `null`.
    Scalar(&'a str),
    /// A string without escapes or control characters, between its quotes.
    Str(&'a str),
    /// An array of non-negative integers: its text, brackets included, and how many it holds.
    Integers { json: &'a str, count: usize },
}

/// Calls `field` with each key and value of the flat object `line`, in order. `None` when the
/// line is not such an object (serde_json must read it) or when `field` answers `None`.
pub fn scan<'a>(
    line: &'a str,
    mut field: impl FnMut(&'a str, FlatValue<'a>) -> Option<()>,
) -> Option<()> {
    let bytes = line.as_bytes();
    let mut at = skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return (skip_whitespace(bytes, at + 1) == bytes.len()).then_some(());
    }
    loop {
        let (key, next) = plain_string(line, at)?;
        at = skip_whitespace(bytes, next);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_whitespace(bytes, at + 1);
        let (value, next) = value(line, at)?;
        field(key, value)?;
        at = skip_whitespace(bytes, next);
        match bytes.get(at)? {
            b',' => at = skip_whitespace(bytes, at + 1),
            b'}' => return (skip_whitespace(bytes, at + 1) == bytes.len()).then_some(()),
            _ => return None,
        }
    }
}

/// JSON's whitespace.
fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).copied().is_some_and(is_whitespace) {
        at += 1;
    }
    at
}

/// The string whose opening quote is at `at`, and the position after its closing quote.
fn plain_string(line: &str, at: usize) -> Option<(&str, usize)> {
    let bytes = line.as_bytes();
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let start = at + 1;
    let end = start + memchr::memchr2(b'"', b'\\', &bytes[start..])?;
    if bytes[end] == b'\\' || bytes[start..end].iter().any(|&b| b < 0x20) {
        return None;
    }
    Some((&line[start..end], end + 1))
}

/// The value starting at `at`, and the position after it.
fn value(line: &str, at: usize) -> Option<(FlatValue<'_>, usize)> {
    let bytes = line.as_bytes();
    match bytes.get(at)? {
        b'"' => plain_string(line, at).map(|(text, next)| (FlatValue::Str(text), next)),
        b'[' => {
            let end = at + memchr::memchr(b']', &bytes[at..])?;
            let count = integers(&bytes[at + 1..end])?;
            let json = &line[at..=end];
            Some((FlatValue::Integers { json, count }, end + 1))
        }
        b'{' => None,
        _ => {
            let len = bytes[at..]
                .iter()
                .position(|&b| is_whitespace(b) || b == b',' || b == b'}')
                .unwrap_or(bytes.len() - at);
            let text = &line[at..at + len];
            serde_json::from_str::<IgnoredAny>(text).ok()?;
            Some((FlatValue::Scalar(text), at + len))
        }
    }
}

/// How many integers the inside of a JSON array (between its brackets) holds, if it holds
/// non-negative integers only, well formed (no empty element, no leading zero).
pub fn integers(inner: &[u8]) -> Option<usize> {
    let (plain, commas) = inner.iter().fold((true, 0usize), |(plain, commas), &b| {
        (
            plain & (b.is_ascii_digit() | (b == b',')),
            commas + usize::from(b == b','),
        )
    });
    if !plain {
        return spaced_integers(inner);
    }
    let (Some(&first), Some(&last)) = (inner.first(), inner.last()) else {
        return Some(0);
    };
    // Digits and commas only: malformed where a number is empty or starts with a zero.
    let rest = &inner[1..];
    let empty = inner
        .iter()
        .zip(rest)
        .fold(false, |bad, (&a, &b)| bad | ((a == b',') & (b == b',')));
    let leading_zero = inner
        .iter()
        .zip(rest)
        .zip(rest.get(1..).unwrap_or_default())
        .fold(false, |bad, ((&a, &b), &c)| {
            bad | ((a == b',') & (b == b'0') & c.is_ascii_digit())
        });
    let first_zero = first == b'0' && rest.first().is_some_and(u8::is_ascii_digit);
    let malformed = empty | leading_zero | first_zero | (first == b',') | (last == b',');
    (!malformed).then_some(commas + 1)
}

/// [`integers`] for an array with whitespace between its elements, byte by byte.
fn spaced_integers(inner: &[u8]) -> Option<usize> {
    #[derive(PartialEq)]
    enum State {
        /// Before an element (whitespace allowed).
        Element,
        /// In a number; whether it started with a zero.
        Digits { zero: bool },
        /// After a number, before its comma.
        Separator,
    }
    let mut state = State::Element;
    let mut count = 0;
    for &b in inner {
        state = match (state, b) {
            (State::Element, b'0'..=b'9') => {
                count += 1;
                State::Digits { zero: b == b'0' }
            }
            (State::Digits { zero: false }, b'0'..=b'9') => State::Digits { zero: false },
            (State::Digits { .. } | State::Separator, b',') => State::Element,
            (State::Digits { .. } | State::Separator, b) if is_whitespace(b) => State::Separator,
            (State::Element, b) if is_whitespace(b) => State::Element,
            _ => return None,
        };
    }
    // An element was promised by a comma and never came.
    (state != State::Element || count == 0).then_some(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fields(line: &str) -> Option<Vec<(&str, FlatValue<'_>)>> {
        let mut out = Vec::new();
        scan(line, |key, value| {
            out.push((key, value));
            Some(())
        })?;
        Some(out)
    }

    #[test]
    fn a_flat_line_reads_as_its_fields() {
        let line = r#" { "a" : [1,20,0] , "b":"x y","c":-1.5e3,"d":null,"e":[ 0 , 7 ],"f":[]}"#;
        assert_eq!(
            fields(line).unwrap(),
            vec![
                (
                    "a",
                    FlatValue::Integers {
                        json: "[1,20,0]",
                        count: 3
                    }
                ),
                ("b", FlatValue::Str("x y")),
                ("c", FlatValue::Scalar("-1.5e3")),
                ("d", FlatValue::Scalar("null")),
                (
                    "e",
                    FlatValue::Integers {
                        json: "[ 0 , 7 ]",
                        count: 2
                    }
                ),
                (
                    "f",
                    FlatValue::Integers {
                        json: "[]",
                        count: 0
                    }
                ),
            ]
        );
        assert_eq!(fields("{}").unwrap(), vec![]);
    }

    #[test]
    fn integer_arrays_are_checked_as_serde_json_checks_them() {
        let arrays = [
            "[]",
            "[ ]",
            "[0]",
            "[0,0]",
            "[10,0]",
            "[01]",
            "[1,01]",
            "[1,,2]",
            "[,1]",
            "[1,]",
            "[ 1 , 2 ]",
            "[1 2]",
            "[1, 02]",
            "[\t1,\n2\r]",
            "[ , ]",
            "[-1]",
            "[1.5]",
            "[1e3]",
            "[4294967296]",
            "[0 ,0]",
            "[00]",
            "[ 0]",
            "[0 ]",
        ];
        for array in arrays {
            let ours = integers(&array.as_bytes()[1..array.len() - 1]);
            let theirs = serde_json::from_str::<Vec<u64>>(array)
                .ok()
                .map(|ids| ids.len());
            assert_eq!(ours, theirs, "{array}");
        }
    }

    #[test]
    fn anything_else_is_left_to_serde() {
        for line in [
            r#"{"a":{"b":1}}"#,
            r#"{"a":"x\"y"}"#,
            r#"{"a\u0062":1}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":[1,"2"]}"#,
            r#"{"a":[[1]]}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"{"a" 1}"#,
            r#"{"a":tru}"#,
            r#"{"a":1"#,
            r#"[1]"#,
        ] {
            assert_eq!(fields(line), None, "{line}");
        }
    }

    /// A piece of a line: valid and invalid JSON values, keys and separators alike.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("{".to_string()),
            Just("}".to_string()),
            Just(",".to_string()),
            Just(":".to_string()),
            Just(" ".to_string()),
            Just("\"k\"".to_string()),
            Just("\"a\\\"b\"".to_string()),
            Just("null".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just("\"j\"".to_string()),
            "-?[0-9]{1,3}(\\.[0-9])?",
            "\\[[0-9, ]{0,12}\\]",
        ]
    }

    proptest! {
        /// What the scanner accepts, serde_json reads as the same keys and values.
        #[test]
        fn what_it_accepts_serde_json_reads_alike(pieces in prop::collection::vec(piece(), 0..16)) {
            let line = pieces.concat();
            if let Some(ours) = fields(&line) {
                let theirs: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(&line).expect("serde_json reads what the scanner read");
                let keys: std::collections::BTreeSet<&str> = ours.iter().map(|(k, _)| *k).collect();
                prop_assert_eq!(keys.len(), theirs.len());
                for (key, value) in ours {
                    let text = match value {
                        FlatValue::Scalar(text) => text.to_string(),
                        FlatValue::Str(text) => format!("\"{text}\""),
                        FlatValue::Integers { json, count } => {
                            prop_assert_eq!(theirs[key].as_array().map(Vec::len), Some(count));
                            json.to_string()
                        }
                    };
                    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
                    // A repeated key: serde_json's map keeps the last value.
                    if ours_last(&line, key) == text {
                        prop_assert_eq!(&parsed, &theirs[key]);
                    }
                }
            }
        }

        /// Well-formed flat lines with spacing anywhere are accepted.
        #[test]
        fn flat_lines_are_accepted(ids in prop::collection::vec(0u32..100_000, 0..20),
                                   space in "[ \t]{0,2}", n in 0u64..1000) {
            let array = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(&format!("{space},{space}"));
            let line = format!("{{{space}\"ids\"{space}:{space}[{space}{array}{space}]{space},\"n\":{n}}}");
            let read = fields(&line);
            prop_assert!(read.is_some(), "{}", line);
            let read = read.unwrap();
            prop_assert_eq!(read.len(), 2);
            let FlatValue::Integers { count, .. } = read[0].1 else { panic!("{line}") };
            prop_assert_eq!(count, ids.len());
        }
    }

    /// The text of the last value of `key` the scanner saw in `line`.
    fn ours_last(line: &str, key: &str) -> String {
        let mut last = String::new();
        scan(line, |k, value| {
            if k == key {
                last = match value {
                    FlatValue::Scalar(text) => text.to_string(),
                    FlatValue::Str(text) => format!("\"{text}\""),
                    FlatValue::Integers { json, .. } => json.to_string(),
                };
            }
            Some(())
        });
        last
    }
}
