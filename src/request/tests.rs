//! Unit tests of endpoint classification, routing-key precedence, header rules and partitions.

use super::*;

fn run(endpoint: Endpoint, body: &str, headers: RoutingHeaders<'_>) -> RoutingInput {
    let mut input = RoutingInput::new();
    extract(endpoint, body.as_bytes(), headers, &mut input).expect("valid body");
    input
}

fn plain(endpoint: Endpoint, body: &str) -> RoutingInput {
    run(endpoint, body, RoutingHeaders::default())
}

fn with_tokens_header(value: &str, mode: RoutingMode) -> RoutingHeaders<'_> {
    RoutingHeaders {
        mode,
        routing_tokens: Some(value.as_bytes()),
        ..RoutingHeaders::default()
    }
}

#[test]
fn classifies_the_four_routed_endpoints_and_nothing_else() {
    let cases = [
        ("/generate", Some(Endpoint::Generate)),
        ("/v1/chat/completions", Some(Endpoint::ChatCompletions)),
        ("/v1/completions", Some(Endpoint::Completions)),
        ("/v1/messages", Some(Endpoint::Messages)),
        ("/v1/models", None),
        ("/generate/", None),
        ("/health", None),
    ];
    for (path, expected) in cases {
        let endpoint = Endpoint::of_path(path.as_bytes());
        let routed = endpoint.is_routed().then_some(endpoint);
        assert_eq!(routed, expected, "{path}");
    }
}

#[test]
fn text_keys_per_endpoint() {
    let cases = [
        (
            Endpoint::Completions,
            r#"{"model":"m","prompt":"hello world"}"#,
            "hello world",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt":["first one","second"]}"#,
            "first one",
        ),
        (
            Endpoint::Generate,
            r#"{"text":"abc def","sampling_params":{"x":1}}"#,
            "abc def",
        ),
        (Endpoint::Generate, r#"{"text":["b1","b2"]}"#, "b1"),
        (
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"part a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"part b"}]}]}"#,
            "sys part a part b",
        ),
        (
            Endpoint::Messages,
            r#"{"messages":[{"role":"user","content":"question"}],"system":"be brief"}"#,
            "be brief question",
        ),
        (
            Endpoint::Messages,
            r#"{"system":[{"type":"text","text":"s1"}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}"#,
            "s1 q",
        ),
        // Fields of the wrong endpoint are not routing text.
        (
            Endpoint::ChatCompletions,
            r#"{"prompt":"nope","messages":[]}"#,
            "",
        ),
        (
            Endpoint::Completions,
            r#"{"messages":[{"content":"nope"}]}"#,
            "",
        ),
        // Escapes are decoded.
        (
            Endpoint::Completions,
            r#"{"prompt":"a\nb \u00e9"}"#,
            "a\nb é",
        ),
    ];
    for (endpoint, body, expected) in cases {
        let input = plain(endpoint, body);
        assert_eq!(input.key(), RoutingKey::Text(expected), "{body}");
        assert_eq!(input.key_source(), Some(KeySource::Text));
    }
}

#[test]
fn model_is_read_and_escapes_decoded() {
    assert_eq!(
        plain(Endpoint::Completions, r#"{"model":"llama-3"}"#).model(),
        "llama-3"
    );
    assert_eq!(
        plain(Endpoint::Completions, r#"{"model":"a\/b"}"#).model(),
        "a/b"
    );
    assert_eq!(plain(Endpoint::Generate, r#"{"text":"x"}"#).model(), "");
}

#[test]
fn input_ids_win_over_text_and_batches_route_on_the_first_sequence() {
    let input = plain(
        Endpoint::Generate,
        r#"{"text":"some text","input_ids":[1,2,3]}"#,
    );
    assert_eq!(input.key(), RoutingKey::Tokens(&[1, 2, 3]));
    assert_eq!(input.key_source(), Some(KeySource::InputIds));
    let input = plain(
        Endpoint::Generate,
        r#"{"input_ids":[[7,8],[9,10,11]],"text":"t"}"#,
    );
    assert_eq!(input.key(), RoutingKey::Tokens(&[7, 8]));
}

#[test]
fn unusable_input_ids_fall_back_to_text() {
    let bodies = [
        r#"{"text":"t","input_ids":[]}"#,
        r#"{"text":"t","input_ids":[1,"x"]}"#,
        r#"{"text":"t","input_ids":[1,[2]]}"#,
        r#"{"text":"t","input_ids":[[1,-2]]}"#,
        r#"{"text":"t","input_ids":[4294967296]}"#,
        r#"{"text":"t","input_ids":"1,2"}"#,
    ];
    for body in bodies {
        assert_eq!(
            plain(Endpoint::Generate, body).key(),
            RoutingKey::Text("t"),
            "{body}"
        );
    }
    // input_ids mean nothing outside /generate.
    let input = plain(Endpoint::Completions, r#"{"prompt":"p","input_ids":[1,2]}"#);
    assert_eq!(input.key(), RoutingKey::Text("p"));
}

#[test]
fn routing_tokens_header_replaces_body_tokens_and_text() {
    let headers = with_tokens_header("5, 6,7", RoutingMode::Regular);
    let input = run(
        Endpoint::Generate,
        r#"{"input_ids":[1,2],"text":"x"}"#,
        headers,
    );
    assert_eq!(input.key(), RoutingKey::Tokens(&[5, 6, 7]));
    assert_eq!(input.key_source(), Some(KeySource::TokensHeader));
    let input = run(
        Endpoint::ChatCompletions,
        r#"{"model":"m","messages":[{"content":"hi"}]}"#,
        headers,
    );
    assert_eq!(input.key(), RoutingKey::Tokens(&[5, 6, 7]));
    assert_eq!(input.model(), "m");
}

#[test]
fn routing_tokens_header_is_ignored_in_pd_mode() {
    let headers = with_tokens_header("5,6,7", RoutingMode::PrefillDecode);
    let input = run(Endpoint::Completions, r#"{"prompt":"p"}"#, headers);
    assert_eq!(input.key(), RoutingKey::Text("p"));
}

#[test]
fn routing_tokens_header_bounds_and_malformed_values() {
    let ids = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let max_ids = ids(ROUTING_TOKENS_IDS_MAX);
    let over_ids = ids(ROUTING_TOKENS_IDS_MAX + 1);
    // 512 IDs of 7 digits and separators: 4,095 bytes (valid); one more byte of padding: 4,097.
    let long_ids: String = (0..ROUTING_TOKENS_IDS_MAX)
        .map(|_| "1000000")
        .collect::<Vec<_>>()
        .join(",");
    assert_eq!(long_ids.len(), 4095);
    let over_bytes = format!("{long_ids}  ");
    let mut out = Vec::new();
    let cases: [(&str, Option<usize>); 12] = [
        (max_ids.as_str(), Some(ROUTING_TOKENS_IDS_MAX)),
        (over_ids.as_str(), None),
        (long_ids.as_str(), Some(ROUTING_TOKENS_IDS_MAX)),
        (over_bytes.as_str(), None),
        ("", None),
        ("1,,2", None),
        ("1,2,", None),
        ("-1", None),
        ("1;2", None),
        ("0x10", None),
        ("4294967296", None),
        ("4294967295", Some(1)),
    ];
    for (value, expected) in cases {
        let valid = parse_routing_tokens(value.as_bytes(), &mut out);
        assert_eq!(valid.then_some(out.len()), expected, "{:.40}", value);
        if !valid {
            assert!(out.is_empty());
        }
        // Through extraction an invalid header is simply ignored: text wins, no error.
        let input = run(
            Endpoint::Completions,
            r#"{"prompt":"p"}"#,
            with_tokens_header(value, RoutingMode::Regular),
        );
        let expect_tokens = expected.is_some();
        assert_eq!(
            matches!(input.key(), RoutingKey::Tokens(_)),
            expect_tokens,
            "{:.40}",
            value
        );
    }
}

#[test]
fn malformed_json_is_a_typed_400() {
    let bodies = [
        "",
        "{",
        r#"{"prompt":"x"} trailing"#,
        "[1,2]",
        r#""str""#,
        r#"{"prompt":"x",}"#,
    ];
    let mut input = RoutingInput::new();
    for body in bodies {
        let err = extract(
            Endpoint::Completions,
            body.as_bytes(),
            RoutingHeaders::default(),
            &mut input,
        )
        .expect_err(body);
        assert!(matches!(err, RequestError::MalformedJson { .. }), "{body}");
        assert_eq!(err.status(), 400);
    }
}

#[test]
fn wrong_typed_fields_are_ignored_not_errors() {
    let input = plain(
        Endpoint::ChatCompletions,
        r#"{"model":null,"messages":{"a":1},"cache_salt":null,"extra_key":true,"stream":true}"#,
    );
    assert_eq!(input.key(), RoutingKey::Text(""));
    assert_eq!(input.model(), "");
    assert!(input.namespace().is_unpartitioned());
}

#[test]
fn a_model_that_is_not_a_string_is_a_400() {
    // A number read as its digits named a model nobody serves: a 404 for a client error.
    for model in ["5", "-1", "1.5", "true", "[\"m\"]", "{\"m\":1}"] {
        let body = format!(r#"{{"model":{model},"messages":[]}}"#);
        let mut input = RoutingInput::new();
        let err = extract(
            Endpoint::ChatCompletions,
            body.as_bytes(),
            RoutingHeaders::default(),
            &mut input,
        )
        .expect_err(&body);
        assert_eq!(err.status(), 400, "{body}");
    }
}

#[test]
fn partitions_isolate_and_empty_strings_are_unset() {
    let ns = |endpoint, body: &str| plain(endpoint, body).namespace();
    let base = ns(Endpoint::ChatCompletions, r#"{"messages":[]}"#);
    assert!(base.is_unpartitioned());
    assert_eq!(
        ns(
            Endpoint::ChatCompletions,
            r#"{"cache_salt":"","extra_key":"","lora_path":""}"#
        ),
        base
    );
    let salted = ns(Endpoint::ChatCompletions, r#"{"cache_salt":"s1"}"#);
    assert_ne!(salted, base);
    assert_ne!(
        salted,
        ns(Endpoint::ChatCompletions, r#"{"cache_salt":"s2"}"#)
    );
    // The same salt gives the same namespace on every endpoint.
    for endpoint in [
        Endpoint::Completions,
        Endpoint::Messages,
        Endpoint::Generate,
    ] {
        assert_eq!(ns(endpoint, r#"{"cache_salt":"s1"}"#), salted);
    }
    // A salt equal to an extra key or a LoRA name is another namespace.
    let keyed = ns(Endpoint::Completions, r#"{"extra_key":"s1"}"#);
    let lora = ns(Endpoint::Completions, r#"{"lora_path":"s1"}"#);
    assert!(salted != keyed && keyed != lora && salted != lora);
    // lora_id counts on /generate only.
    assert!(!ns(Endpoint::Generate, r#"{"lora_id":"a"}"#).is_unpartitioned());
    assert!(!ns(Endpoint::Generate, r#"{"lora_id":3}"#).is_unpartitioned());
    assert!(ns(Endpoint::ChatCompletions, r#"{"lora_id":"a"}"#).is_unpartitioned());
}

#[test]
fn partition_values_cannot_be_forged_by_concatenation() {
    let ns = |body: &str| plain(Endpoint::Completions, body).namespace();
    let split_a = ns(r#"{"cache_salt":"ab","extra_key":"c"}"#);
    let split_b = ns(r#"{"cache_salt":"a","extra_key":"bc"}"#);
    let joined = ns(r#"{"cache_salt":"abc"}"#);
    assert!(split_a != split_b && split_a != joined && split_b != joined);
    // Field order in the body does not matter.
    assert_eq!(split_a, ns(r#"{"extra_key":"c","cache_salt":"ab"}"#));
}

#[test]
fn consistent_hashing_headers_are_kept() {
    let headers = RoutingHeaders {
        routing_key: Some(b"user-1"),
        target_worker: Some(b" http://127.0.0.1:9 "),
        ..RoutingHeaders::default()
    };
    let input = run(Endpoint::Completions, r#"{"prompt":"p"}"#, headers);
    assert_eq!(
        input.routing_key_hash(),
        Some(xxhash_rust::xxh3::xxh3_64(b"user-1"))
    );
    assert_eq!(input.target_worker(), Some("http://127.0.0.1:9"));
    let input = plain(Endpoint::Completions, r#"{"prompt":"p"}"#);
    assert_eq!(
        (input.routing_key_hash(), input.target_worker()),
        (None, None)
    );
}

#[test]
fn reuse_clears_the_previous_request() {
    let mut input = RoutingInput::new();
    let headers = RoutingHeaders::default();
    extract(
        Endpoint::Generate,
        br#"{"input_ids":[1],"lora_id":"x","model":"m"}"#,
        headers,
        &mut input,
    )
    .unwrap();
    extract(
        Endpoint::Completions,
        br#"{"prompt":"q"}"#,
        headers,
        &mut input,
    )
    .unwrap();
    assert_eq!(input.key(), RoutingKey::Text("q"));
    assert_eq!(input.model(), "");
    assert!(input.namespace().is_unpartitioned());
}

#[test]
fn the_output_budget_is_read_per_endpoint() {
    use Endpoint::{ChatCompletions, Completions, Generate, Messages};
    let cases: [(Endpoint, &str, Option<u32>); 12] = [
        (Completions, r#"{"prompt":"p","max_tokens":64}"#, Some(64)),
        (Messages, r#"{"max_tokens":300,"messages":[]}"#, Some(300)),
        (ChatCompletions, r#"{"max_tokens":64}"#, Some(64)),
        // The newer field wins on either side of the older one.
        (
            ChatCompletions,
            r#"{"max_completion_tokens":9,"max_tokens":64}"#,
            Some(9),
        ),
        (
            ChatCompletions,
            r#"{"max_tokens":64,"max_completion_tokens":9}"#,
            Some(9),
        ),
        (
            Generate,
            r#"{"input_ids":[1],"sampling_params":{"temperature":0,"max_new_tokens":7,"stop":["x"]}}"#,
            Some(7),
        ),
        // /generate reads only its sampling parameters; the others only their own field.
        (Generate, r#"{"max_tokens":64}"#, None),
        (
            Completions,
            r#"{"sampling_params":{"max_new_tokens":7}}"#,
            None,
        ),
        // Not a count: no budget, and the body is still routed.
        (Completions, r#"{"max_tokens":"64","prompt":"p"}"#, None),
        (Completions, r#"{"max_tokens":-1}"#, None),
        (Completions, r#"{"max_tokens":1e3}"#, None),
        (Generate, r#"{"sampling_params":null}"#, None),
    ];
    for (endpoint, body, expected) in cases {
        assert_eq!(
            plain(endpoint, body).max_output_tokens(),
            expected,
            "{body}"
        );
    }
    assert_eq!(
        plain(Completions, r#"{"max_tokens":4294967296}"#).max_output_tokens(),
        None
    );
    // An input reused for the next request forgets the last budget.
    let mut input = plain(Completions, r#"{"max_tokens":64}"#);
    extract(
        Completions,
        br#"{"prompt":"p"}"#,
        RoutingHeaders::default(),
        &mut input,
    )
    .expect("valid body");
    assert_eq!(input.max_output_tokens(), None);
}
