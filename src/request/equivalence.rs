//! The fast reader (`scan`, through [`extract`]) against the reference reader
//! ([`extract_reference`], the `serde_json` visitors): on every body of a corpus (the unit
//! tests' bodies, edge cases of escapes, numbers and shapes, the committed fuzz corpus, and
//! generated bodies, valid and mutated) both give the same result, error position included,
//! and the same routing input, on every endpoint, with and without a routing-tokens header,
//! with the text built in the reused buffer and in a shared one (as large bodies have it).
//! A second test checks the fast reader really reads the common bodies itself, so the first
//! cannot pass by handing everything over.

use proptest::prelude::*;

use super::*;

/// Everything an extraction exposes.
#[derive(Debug, PartialEq)]
struct Seen {
    result: Result<(), RequestError>,
    endpoint: Option<Endpoint>,
    model: String,
    key: String,
    source: Option<KeySource>,
    namespace: PartitionNamespace,
    text: String,
    max_output_tokens: Option<u32>,
}

fn seen(result: Result<(), RequestError>, input: &RoutingInput) -> Seen {
    Seen {
        result,
        endpoint: input.endpoint(),
        model: input.model().to_owned(),
        key: format!("{:?}", input.key()),
        source: input.key_source(),
        namespace: input.namespace(),
        text: input.text().to_owned(),
        max_output_tokens: input.max_output_tokens(),
    }
}

/// Asserts both readers agree on `body` for every endpoint and header case, with fresh inputs
/// and with inputs reused from a previous, different request.
fn assert_same(body: &[u8]) {
    let header_cases = [
        RoutingHeaders::default(),
        RoutingHeaders {
            routing_tokens: Some(b"5,6,7"),
            ..RoutingHeaders::default()
        },
    ];
    for endpoint in Endpoint::ALL {
        for headers in header_cases {
            let mut fast = RoutingInput::new();
            let mut shared = RoutingInput::new();
            let mut reference = RoutingInput::new();
            for input in [&mut fast, &mut shared, &mut reference] {
                let previous = br#"{"model":"old","prompt":"old","input_ids":[9],"max_tokens":3}"#;
                let _ = extract_reference(endpoint, previous, headers, input);
            }
            let fast_result = extract(endpoint, body, headers, &mut fast);
            let shared_result = extract_shared_text(endpoint, body, headers, &mut shared);
            let reference_result = extract_reference(endpoint, body, headers, &mut reference);
            let expected = seen(reference_result, &reference);
            let body = String::from_utf8_lossy(body);
            assert_eq!(seen(fast_result, &fast), expected, "{endpoint:?} {body:?}");
            assert_eq!(
                seen(shared_result, &shared),
                expected,
                "shared text: {endpoint:?} {body:?}"
            );
        }
    }
}

/// Bodies of the unit tests and edge cases of every field the readers read.
const CORPUS: &[&str] = &[
    r#"{"model":"m","prompt":"hello world"}"#,
    r#"{"prompt":["first one","second"]}"#,
    r#"{"text":"abc def","sampling_params":{"x":1}}"#,
    r#"{"text":["b1","b2"]}"#,
    r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"part a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"part b"}]}]}"#,
    r#"{"messages":[{"role":"user","content":"question"}],"system":"be brief"}"#,
    r#"{"system":[{"type":"text","text":"s1"}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}"#,
    r#"{"prompt":"nope","messages":[]}"#,
    r#"{"messages":[{"content":"nope"}]}"#,
    r#"{"prompt":"a\nb \u00e9"}"#,
    r#"{"model":"llama-3"}"#,
    r#"{"model":"a\/b"}"#,
    r#"{"text":"some text","input_ids":[1,2,3]}"#,
    r#"{"input_ids":[[7,8],[9,10,11]],"text":"t"}"#,
    r#"{"text":"t","input_ids":[]}"#,
    r#"{"text":"t","input_ids":[1,"x"]}"#,
    r#"{"text":"t","input_ids":[1,[2]]}"#,
    r#"{"text":"t","input_ids":[[1,-2]]}"#,
    r#"{"text":"t","input_ids":[4294967296]}"#,
    r#"{"text":"t","input_ids":[4294967295, 0, 01]}"#,
    r#"{"text":"t","input_ids":"1,2"}"#,
    r#"{"input_ids":[1,2],"input_ids":"x"}"#,
    r#"{"input_ids":[1,2],"input_ids":[]}"#,
    r#"{"input_ids":[[],[1]]}"#,
    r#"{"input_ids":[[1],2]}"#,
    r#"{"input_ids":[ 1 , 2 ,3,	4
    ,5 ]}"#,
    r#"{"input_ids":[1.0]}"#,
    r#"{"input_ids":[1e2]}"#,
    r#"{"input_ids":[-0]}"#,
    r#"{"input_ids":[12345678,123456789,1234567890,12345678901]}"#,
    r#"{"input_ids":[1,2,]}"#,
    r#"{"input_ids":[1 2]}"#,
    r#"{"prompt":"p","input_ids":[1,2]}"#,
    "",
    "{",
    r#"{"prompt":"x"} trailing"#,
    r#"{"prompt":"x"}   "#,
    "  \n{}\t",
    "[1,2]",
    r#""str""#,
    r#"{"prompt":"x",}"#,
    r#"{"prompt":"x" "y":1}"#,
    r#"{"prompt" "x"}"#,
    r#"{prompt:"x"}"#,
    r#"{"model":null,"messages":{"a":1},"cache_salt":null,"extra_key":true,"stream":true}"#,
    r#"{"model":5,"messages":[]}"#,
    r#"{"model":-1,"messages":[]}"#,
    r#"{"model":true,"messages":[]}"#,
    r#"{"model":["m"],"messages":[]}"#,
    r#"{"model":{"m":1},"messages":[]}"#,
    r#"{"model":"a","model":null}"#,
    r#"{"model":nul}"#,
    r#"{"cache_salt":"","extra_key":"","lora_path":""}"#,
    r#"{"cache_salt":"s1"}"#,
    r#"{"cache_salt":"s1","cache_salt":null}"#,
    r#"{"cache_salt":["a","b"],"extra_key":[[["deep"]]],"lora_path":[]}"#,
    r#"{"cache_salt":12,"extra_key":-12,"lora_path":-0,"lora_id":1.5}"#,
    r#"{"cache_salt":{"a":1},"extra_key":[{"a":1}]}"#,
    r#"{"cache_salt":"s\u0031","extra_key":"k\"q"}"#,
    r#"{"lora_id":"a"}"#,
    r#"{"lora_id":3}"#,
    r#"{"cache_salt":"ab","extra_key":"c"}"#,
    r#"{"max_completion_tokens":9,"max_tokens":64}"#,
    r#"{"max_tokens":64,"max_completion_tokens":9}"#,
    r#"{"input_ids":[1],"sampling_params":{"temperature":0,"max_new_tokens":7,"stop":["x"]}}"#,
    r#"{"sampling_params":{"max_new_tokens":7,"max_new_tokens":"x"}}"#,
    r#"{"sampling_params":null}"#,
    r#"{"sampling_params":[1]}"#,
    r#"{"max_tokens":"64","prompt":"p"}"#,
    r#"{"max_tokens":-1}"#,
    r#"{"max_tokens":1e3}"#,
    r#"{"max_tokens":1e999}"#,
    r#"{"max_tokens":4294967296}"#,
    r#"{"max_tokens":18446744073709551616}"#,
    r#"{"max_tokens":-9223372036854775808}"#,
    r#"{"max_tokens":-9223372036854775809}"#,
    r#"{"max_tokens":[1],"max_tokens":{"a":[]}}"#,
    r#"{"temperature":1e999,"x":-0.5e-3,"y":[true,false,null,{"z":{}}]}"#,
    r#"{"temperature":1.}"#,
    r#"{"temperature":.5}"#,
    r#"{"temperature":-}"#,
    r#"{"temperature":1e}"#,
    r#"{"flag":tru}"#,
    r#"{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
    r#"{"a":[}"#,
    r#"{"a":{]}"#,
    r#"{"a":{"b"}}"#,
    r#"{"a":{"b":1,}}"#,
    r#"{"messages":[{"content":"a"},"bare",7,null,[1],{"content":null}]}"#,
    r#"{"messages":[{"content":"a","content":"b"}]}"#,
    r#"{"messages":[{"content":[{"text":"a"},{"text":["n1",{"text":"n2"}]},"bare part",{"text":{"x":1}}]}]}"#,
    r#"{"messages":[{"cont\u0065nt":"escaped key"}]}"#,
    r#"{"m\u0065ssages":[{"content":"escaped top key"}]}"#,
    r#"{"messages":[{"content":""},{"content":"after empty"}]}"#,
    r#"{"messages":"a string"}"#,
    r#"{"messages":[{"content":"x"}],"messages":7}"#,
    r#"{"system":"s","system":[{"text":"t"}],"messages":[]}"#,
    r#"{"system":"only system"}"#,
    r#"{"prompt":"\ud83d\ude00 pair"}"#,
    r#"{"prompt":"\ud83d lone high"}"#,
    r#"{"prompt":"\ude00 lone low"}"#,
    r#"{"other":"\ud83d lone high, skipped"}"#,
    r#"{"prompt":"\ud83d\u0041"}"#,
    r#"{"prompt":"\u00zz"}"#,
    r#"{"prompt":"\q"}"#,
    r#"{"prompt":"tab	inside"}"#,
    r#"{"prompt":"日本語のテキスト é ü 😀"}"#,
    r#"{"prompt":"\u65e5\u672c \"quoted\" \\ \/ \b\f\n\r\t"}"#,
    r#"{"prompt":[["nested", "batch"]],"text":[["x"]]}"#,
    r#"{"prompt":[1,"second"],"text":[{"a":1},"y"]}"#,
    r#"{"prompt":{"a":"b"}}"#,
    r#"{"prompt":7}"#,
    r#"{"prompt":1.5e400}"#,
    r#"{"prompt":"a","prompt":"b"}"#,
    r#"{"prompt":"a","prompt":null}"#,
];

/// Raw bytes the string corpus cannot hold: invalid UTF-8 where it is read and where it is
/// skipped, and a control byte.
const BYTE_CORPUS: &[&[u8]] = &[
    b"{\"prompt\":\"bad \xff utf8\"}",
    b"{\"other\":\"bad \xff utf8, skipped\"}",
    b"{\"model\":\"\xc3\"}",
    b"{\"\xff\":1}",
    b"{\"a\":{\"\xff\":1}}",
    b"{\"messages\":[{\"\xff\":1}]}",
    b"{\"prompt\":\"nul \x00 byte\"}",
    b"{\"prompt\":\"split \xe6\x97\xa5\\n\xe6\x9c\xac\"}",
    // Invalid UTF-8 in prompt text the shared-text mode checks only once: in a piece after
    // another, in the system prompt, at a string's end, and in a field read again.
    b"{\"messages\":[{\"content\":\"ok\"},{\"content\":\"bad \xff\"}]}",
    b"{\"system\":\"cut \xe6\x97\",\"messages\":[{\"content\":\"q\"}]}",
    b"{\"prompt\":\"bad \xff utf8\",\"prompt\":\"good\"}",
    b"{\"messages\":[{\"content\":\"bad \xc3\"}],\"messages\":[{\"content\":\"q\"}]}",
    b"{\"messages\":[{\"content\":\"a\\nb \xff\"}],\"messages\":[]}",
    b"\xef\xbb\xbf{}",
];

#[test]
fn the_fast_reader_matches_the_reference_on_the_corpus() {
    for body in CORPUS {
        assert_same(body.as_bytes());
    }
    for body in BYTE_CORPUS {
        assert_same(body);
    }
}

#[test]
fn the_fast_reader_matches_the_reference_on_the_fuzz_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/body");
    let entries = std::fs::read_dir(&dir).expect("the committed fuzz corpus");
    let mut count = 0;
    for entry in entries {
        let data = std::fs::read(entry.expect("a corpus entry").path()).expect("readable");
        // The fuzz target's first byte selects the endpoint; every endpoint is compared here.
        if let Some((_, body)) = data.split_first() {
            assert_same(body);
            assert_same(&data);
            count += 1;
        }
    }
    assert!(count > 0, "no fuzz corpus under {}", dir.display());
}

#[test]
fn the_fast_reader_reads_common_bodies_itself() {
    let bodies: [(Endpoint, &[u8]); 5] = [
        (
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\nb"}]}],"max_tokens":5,"temperature":0.7,"stream":true}"#,
        ),
        (
            Endpoint::Generate,
            br#"{"input_ids":[1, 2, 3],"sampling_params":{"temperature":0.0,"max_new_tokens":128},"lora_id":3}"#,
        ),
        (
            Endpoint::Generate,
            br#"{"input_ids":[[1,2],[3]],"cache_salt":"\u00e9"}"#,
        ),
        (Endpoint::Completions, br#"{"prompt":["\ud83d\ude00",{"a":1}]}"#),
        (
            Endpoint::Messages,
            br#"{"system":"s","messages":[{"content":"q"}],"metadata":{"a":[1e3,-0,null]}}"#,
        ),
    ];
    for (endpoint, body) in bodies {
        for text_mode in [scan::TextMode::Reused, scan::TextMode::Shared] {
            let mut input = RoutingInput::new();
            input.clear();
            let read = scan::read(endpoint, body, body::KeyFields::Read, text_mode, &mut input);
            assert!(
                read.is_ok(),
                "{text_mode:?} {}",
                String::from_utf8_lossy(body)
            );
        }
    }
    // A list long enough to be read in two halves.
    let ids: Vec<u32> = (0..3000).map(|i| i * 37 % 128_000).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "input_ids": ids })).expect("json");
    let mut input = RoutingInput::new();
    let reused = scan::TextMode::Reused;
    let read = scan::read(
        Endpoint::Generate,
        &body,
        body::KeyFields::Read,
        reused,
        &mut input,
    );
    assert!(read.is_ok());
    assert_eq!(input.tokens, ids);
}

/// A JSON-ish value rendered as bytes: mostly valid, with the keys the readers look for, the
/// shapes they accept and refuse, escapes, and numbers of every kind.
fn value(depth: u32) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        string_literal(),
        prop::sample::select(vec![
            "0",
            "7",
            "-1",
            "-0",
            "1.5",
            "1e3",
            "4294967295",
            "4294967296",
            "128000",
            "18446744073709551616",
            "-9223372036854775808",
            "01",
            "1e999",
            "true",
            "false",
            "null",
            "nul",
        ])
        .prop_map(String::from),
        (
            prop::collection::vec(
                prop_oneof![0u32..200_000, Just(0), Just(u32::MAX), 10_000_000u32..],
                0..12
            ),
            prop::sample::select(vec![",", ", ", " , ", ",\n  "]),
        )
            .prop_map(|(ids, separator)| {
                let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                format!("[{}]", ids.join(separator))
            }),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        3 => leaf,
        1 => prop::collection::vec(value(depth - 1), 0..4)
            .prop_map(|items| format!("[{}]", items.join(","))),
        2 => prop::collection::vec((key(), value(depth - 1), whitespace()), 0..5).prop_map(
            |entries| {
                let entries: Vec<String> = entries
                    .into_iter()
                    .map(|(k, v, ws)| format!("{ws}{k}{ws}:{ws}{v}"))
                    .collect();
                format!("{{{}}}", entries.join(","))
            }
        ),
    ]
    .boxed()
}

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "model",
        "prompt",
        "text",
        "input_ids",
        "messages",
        "system",
        "content",
        "role",
        "type",
        "cache_salt",
        "extra_key",
        "lora_path",
        "lora_id",
        "max_tokens",
        "max_completion_tokens",
        "sampling_params",
        "max_new_tokens",
        "stream",
        "cont\\u0065nt",
        "t\\u0065xt",
        "x",
    ])
    .prop_map(|k| format!("\"{k}\""))
}

fn string_literal() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "word",
            " ",
            "é",
            "日本",
            "😀",
            "\\n",
            "\\\"",
            "\\\\",
            "\\/",
            "\\u00e9",
            "\\u65e5",
            "\\ud83d\\ude00",
            "\\ud83d",
            "\\ude00",
            "\\x",
            "\t",
        ]),
        0..6,
    )
    .prop_map(|pieces| format!("\"{}\"", pieces.concat()))
}

fn whitespace() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", "\n  "])
}

/// A top-level object of routing fields, or (rarely) any value.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let object = prop::collection::vec((key(), value(3)), 0..7).prop_map(|entries| {
        let entries: Vec<String> = entries
            .into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        format!("{{{}}}", entries.join(","))
    });
    prop_oneof![9 => object, 1 => value(2)].prop_map(String::into_bytes)
}

/// An edit that breaks or bends a body: a byte removed, replaced or inserted.
fn mutated(body: Vec<u8>, at: usize, byte: u8, kind: u8) -> Vec<u8> {
    let mut body = body;
    if body.is_empty() {
        return body;
    }
    let at = at % body.len();
    match kind % 3 {
        0 => {
            body.remove(at);
        }
        1 => body[at] = byte,
        _ => body.insert(at, byte),
    }
    body
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_fast_reader_matches_the_reference_on_generated_bodies(body in body()) {
        assert_same(&body);
    }

    #[test]
    fn the_fast_reader_matches_the_reference_on_mutated_bodies(
        body in body(),
        at in any::<usize>(),
        byte in prop::sample::select(b"\"\\{}[],:0-.e \x01\xff".to_vec()),
        kind in any::<u8>(),
    ) {
        assert_same(&mutated(body, at, byte, kind));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Lists long enough to be read in two halves, with every separator, and now and then one
    /// byte replaced by something that breaks or ends the list early.
    #[test]
    fn long_id_lists_match_the_reference(
        ids in prop::collection::vec(prop_oneof![0u32..200_000, 10_000_000u32..], 150..700),
        separator in prop::sample::select(vec![",", ", ", " , ", ",\n  "]),
        edit in prop::option::of((any::<usize>(), prop::sample::select(b"x.]-e[ \n,0".to_vec()))),
        batch in any::<bool>(),
    ) {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        let list = format!("[{}]", ids.join(separator));
        let list = if batch { format!("[{list},[1,2]]") } else { list };
        let mut body = format!(r#"{{"input_ids":{list},"text":"t"}}"#).into_bytes();
        if let Some((at, byte)) = edit {
            let at = 14 + at % (body.len() - 30);
            body[at] = byte;
        }
        assert_same(&body);
    }
}
