use proptest::prelude::*;

use super::*;

/// The reference on the whole text: the first end position where a stop ends, the longest
/// (earliest start) of those, then the lowest index; the text before it (or through it).
fn whole(stops: &[String], text: &str, keep: bool) -> (String, Option<usize>) {
    for end in (1..=text.len()).filter(|e| text.is_char_boundary(*e)) {
        let found = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty() && text[..end].ends_with(s.as_str()))
            .max_by_key(|(i, s)| (s.len(), std::cmp::Reverse(*i)));
        if let Some((index, stop)) = found {
            let cut = if keep { end } else { end - stop.len() };
            return (text[..cut].to_owned(), Some(index));
        }
    }
    (text.to_owned(), None)
}

/// The longest suffix of `text` that is a proper prefix of a stop.
fn longest_partial(stops: &[String], text: &str) -> usize {
    (0..text.len())
        .filter(|at| text.is_char_boundary(*at))
        .map(|at| &text[at..])
        .filter(|suffix| {
            stops
                .iter()
                .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
        })
        .map(str::len)
        .max()
        .unwrap_or(0)
}

fn chunked(stops: &StopSet, chunks: &[String]) -> (String, Option<usize>) {
    let mut matcher = StopMatcher::new();
    let mut out = String::new();
    let mut seen = String::new();
    for chunk in chunks {
        seen.push_str(chunk);
        match matcher.push(stops, chunk, &mut out) {
            StopState::Stopped(MatchedStop::Text(index)) => return (out, Some(index)),
            StopState::Stopped(MatchedStop::Token(_)) => unreachable!(),
            StopState::Running => {
                // Held back: exactly the longest suffix that may begin a stop.
                assert_eq!(format!("{out}{}", matcher.held), seen);
                assert_eq!(matcher.held.len(), longest_partial(stops.strings(), &seen));
            }
        }
    }
    matcher.finish(&mut out);
    (out, None)
}

fn text_of(alphabet: &[&str], picks: &[usize]) -> String {
    picks
        .iter()
        .map(|&i| alphabet[i % alphabet.len()])
        .collect()
}

const ALPHABET: &[&str] = &["a", "b", "ab", "日", "é", " ", "\n"];

proptest! {
    #[test]
    fn chunked_matching_equals_matching_the_whole_text(
        stop_picks in prop::collection::vec(prop::collection::vec(0usize..7, 1..5), 0..4),
        chunk_picks in prop::collection::vec(prop::collection::vec(0usize..7, 0..5), 0..12),
        keep in any::<bool>(),
    ) {
        let stops: Vec<String> = stop_picks.iter().map(|p| text_of(ALPHABET, p)).collect();
        let chunks: Vec<String> = chunk_picks.iter().map(|p| text_of(ALPHABET, p)).collect();
        let set = StopSet::new(stops.clone(), Vec::new(), keep);
        let text: String = chunks.concat();
        prop_assert_eq!(chunked(&set, &chunks), whole(&stops, &text, keep));
    }
}

#[test]
fn a_stop_split_across_chunks_is_trimmed() {
    let set = StopSet::new(vec!["</end>".into(), "STOP".into()], vec![], false);
    let mut matcher = StopMatcher::new();
    let mut out = String::new();
    assert_eq!(matcher.push(&set, "Hello </", &mut out), StopState::Running);
    assert_eq!(out, "Hello ");
    assert_eq!(matcher.push(&set, "en", &mut out), StopState::Running);
    assert_eq!(out, "Hello ");
    assert_eq!(
        matcher.push(&set, "d> more", &mut out),
        StopState::Stopped(MatchedStop::Text(0))
    );
    assert_eq!(out, "Hello ");
    assert_eq!(matcher.matched(), Some(&MatchedStop::Text(0)));
    // Text after the stop is ignored.
    assert_eq!(
        matcher.push(&set, "STOP", &mut out),
        StopState::Stopped(MatchedStop::Text(0))
    );
    assert_eq!(out, "Hello ");
}

#[test]
fn a_false_start_is_released_and_kept_stops_stay() {
    let set = StopSet::new(vec!["</end>".into()], vec![], true);
    let mut matcher = StopMatcher::new();
    let mut out = String::new();
    matcher.push(&set, "a </e", &mut out);
    assert_eq!(out, "a ");
    matcher.push(&set, "x", &mut out);
    assert_eq!(out, "a </ex");
    matcher.push(&set, " </end>!", &mut out);
    assert_eq!(out, "a </ex </end>");
    // Held text is written when the sequence ends without a stop.
    let mut matcher = StopMatcher::new();
    let mut out = String::new();
    matcher.push(&set, "tail </en", &mut out);
    matcher.finish(&mut out);
    assert_eq!(out, "tail </en");
}

#[test]
fn stop_tokens_are_reported_by_id() {
    let set = StopSet::new(vec![], vec![7, 151645], false);
    assert_eq!(set.token(151645), Some(MatchedStop::Token(151645)));
    assert_eq!(set.token(8), None);
    // Without stop strings nothing is held.
    let mut matcher = StopMatcher::new();
    let mut out = String::new();
    matcher.push(&set, "<", &mut out);
    assert_eq!(out, "<");
}
