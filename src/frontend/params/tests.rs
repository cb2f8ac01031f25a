use proptest::prelude::*;

use super::*;

fn error_of(api: Api, body: &str) -> ParamError {
    match GenerateParams::parse(api, body.as_bytes()) {
        Err(e) => e,
        Ok(params) => panic!("{body} was accepted: {params:?}"),
    }
}

#[test]
fn chat_maps_every_sampling_field() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],
        "temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"frequency_penalty":0.1,
        "presence_penalty":-0.2,"repetition_penalty":1.1,"max_tokens":10,
        "max_completion_tokens":20,"min_tokens":2,"stop":["\n\n","END"],
        "stop_token_ids":[7,8],"n":3,"seed":42,"logprobs":true,"top_logprobs":5,
        "ignore_eos":true,"skip_special_tokens":false,"no_stop_trim":true,
        "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},
        "stream":true,"stream_options":{"include_usage":true}}"#;
    let p = parse_chat(body.as_bytes()).unwrap();
    assert_eq!(p.api, Api::Chat);
    assert_eq!(p.model.as_deref(), Some("m"));
    assert_eq!(p.input, PromptInput::Conversation);
    assert_eq!(
        p.sampling,
        Sampling {
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(40),
            min_p: Some(0.05),
            frequency_penalty: Some(0.1),
            presence_penalty: Some(-0.2),
            repetition_penalty: Some(1.1),
            // max_completion_tokens wins over the deprecated max_tokens.
            max_tokens: Some(20),
            min_tokens: Some(2),
            seed: Some(42),
        }
    );
    assert_eq!(p.stop, vec!["\n\n", "END"]);
    assert_eq!(p.stop_token_ids, vec![7, 8]);
    assert_eq!(p.n, 3);
    assert_eq!(p.logprobs, Some(LogprobRequest { top: 5 }));
    assert!(p.ignore_eos && !p.skip_special_tokens && p.keep_stop);
    assert_eq!(
        p.constraint,
        Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))
    );
    assert!(p.stream && p.include_usage);
}

#[test]
fn silence_is_none_and_resolves_to_the_engines_defaults() {
    let p = parse_chat(br#"{"model":"m","messages":[]}"#).unwrap();
    assert_eq!(p.sampling, Sampling::default());
    assert_eq!(
        p.sampling.resolved(),
        ResolvedSampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            max_tokens: None,
            min_tokens: 0,
            seed: None,
        }
    );
    assert!(p.skip_special_tokens && !p.ignore_eos && !p.keep_stop && !p.stream);
    assert_eq!((p.n, p.logprobs, &p.constraint), (1, None, &None));
    // Explicit zeros stay zeros (greedy), not defaults.
    let p = parse_chat(br#"{"messages":[],"temperature":0,"stop":"x"}"#).unwrap();
    assert_eq!(p.sampling.temperature, Some(0.0));
    assert_eq!(p.stop, vec!["x"]);
}

#[test]
fn completions_take_one_prompt_and_count_logprobs() {
    let p = parse_completion(br#"{"prompt":"Once upon","logprobs":3,"echo":false}"#).unwrap();
    assert_eq!(p.input, PromptInput::Text("Once upon".into()));
    assert_eq!(p.logprobs, Some(LogprobRequest { top: 3 }));
    let p = parse_completion(br#"{"prompt":[1,2,3]}"#).unwrap();
    assert_eq!(p.input, PromptInput::Ids(vec![1, 2, 3]));
    let p = parse_completion(br#"{"prompt":[[4,5]], "response_format":{"type":"json_object"}}"#)
        .unwrap();
    assert_eq!(p.input, PromptInput::Ids(vec![4, 5]));
    assert_eq!(p.constraint, Some(Constraint::JsonObject));
    assert_eq!(
        error_of(Api::Completion, r#"{"prompt":["a","b"]}"#).param,
        Some("prompt")
    );
    assert_eq!(
        error_of(Api::Completion, r#"{"model":"m"}"#).param,
        Some("prompt")
    );
    assert_eq!(
        error_of(Api::Completion, r#"{"prompt":"a","logprobs":true}"#).param,
        Some("logprobs")
    );
}

#[test]
fn messages_need_max_tokens_and_map_stop_sequences() {
    let body = r#"{"model":"claude","max_tokens":64,"temperature":0.7,"top_k":5,
        "stop_sequences":["Human:"],"stream":true,"system":"be brief",
        "messages":[{"role":"user","content":"hi"}]}"#;
    let p = parse_messages(body.as_bytes()).unwrap();
    assert_eq!(p.api, Api::Messages);
    assert_eq!(p.sampling.max_tokens, Some(64));
    assert_eq!(p.sampling.temperature, Some(0.7));
    assert_eq!(p.sampling.top_k, Some(5));
    assert_eq!(p.stop, vec!["Human:"]);
    assert!(p.stream);
    assert_eq!(
        error_of(Api::Messages, r#"{"messages":[]}"#).param,
        Some("max_tokens")
    );
    let e = error_of(Api::Messages, r#"{"max_tokens":5,"temperature":1.5}"#);
    assert_eq!(e.param, Some("temperature"));
}

#[test]
fn generate_reads_sglang_sampling_params() {
    let body = r#"{"text":"The capital","rid":"r-1","stream":true,"return_logprob":true,
        "top_logprobs_num":2,"sampling_params":{"max_new_tokens":16,"min_new_tokens":1,
        "temperature":0,"stop":"\n","stop_token_ids":[2],"ignore_eos":false,
        "skip_special_tokens":false,"no_stop_trim":true,"n":2,"regex":"[a-z]+","sampling_seed":9}}"#;
    let p = parse_generate(body.as_bytes()).unwrap();
    assert_eq!(p.input, PromptInput::Text("The capital".into()));
    assert_eq!(p.request_id.as_deref(), Some("r-1"));
    assert_eq!(p.sampling.max_tokens, Some(16));
    assert_eq!(p.sampling.min_tokens, Some(1));
    assert_eq!(p.sampling.temperature, Some(0.0));
    assert_eq!(p.sampling.seed, Some(9));
    assert_eq!(p.stop, vec!["\n"]);
    assert_eq!(p.stop_token_ids, vec![2]);
    assert!(!p.skip_special_tokens && p.keep_stop && p.stream);
    assert_eq!(p.n, 2);
    assert_eq!(p.logprobs, Some(LogprobRequest { top: 2 }));
    assert_eq!(p.constraint, Some(Constraint::Regex("[a-z]+".into())));
    // SGLang's default max_new_tokens where silent; IDs as input.
    let p = parse_generate(br#"{"input_ids":[1,2,3]}"#).unwrap();
    assert_eq!(p.sampling.max_tokens, Some(GENERATE_MAX_NEW_TOKENS_DEFAULT));
    assert_eq!(p.input, PromptInput::Ids(vec![1, 2, 3]));
    assert_eq!(error_of(Api::Generate, "{}").param, None);
    error_of(Api::Generate, r#"{"text":"a","input_ids":[1]}"#);
    error_of(Api::Generate, r#"{"input_ids":"text"}"#);
    let e = error_of(
        Api::Generate,
        r#"{"text":"a","sampling_params":{"regex":"a","ebnf":"b"}}"#,
    );
    assert!(e.message.contains("only one"), "{}", e.message);
}

#[test]
fn invalid_values_are_400s_naming_the_field() {
    let cases = [
        (r#"{"temperature":-0.1}"#, "temperature"),
        (r#"{"top_p":0}"#, "top_p"),
        (r#"{"top_p":1.5}"#, "top_p"),
        (r#"{"top_k":0}"#, "top_k"),
        (r#"{"top_k":-5}"#, "top_k"),
        (r#"{"min_p":2}"#, "min_p"),
        (r#"{"frequency_penalty":3}"#, "frequency_penalty"),
        (r#"{"presence_penalty":-2.5}"#, "presence_penalty"),
        (r#"{"repetition_penalty":0}"#, "repetition_penalty"),
        (r#"{"max_tokens":0}"#, "max_tokens"),
        (r#"{"max_tokens":5,"min_tokens":6}"#, "min_tokens"),
        (r#"{"n":0}"#, "n"),
        (r#"{"n":100000}"#, "n"),
        (r#"{"stop":[""]}"#, "stop"),
        (r#"{"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
        (r#"{"top_logprobs":2}"#, "top_logprobs"),
        (r#"{"top_logprobs":0}"#, "top_logprobs"),
        (r#"{"logprobs":3}"#, "logprobs"),
        (
            r#"{"stream_options":{"include_usage":true}}"#,
            "stream_options",
        ),
        (r#"{"response_format":{"type":"yaml"}}"#, "response_format"),
        (
            r#"{"response_format":{"type":"json_schema"}}"#,
            "response_format",
        ),
    ];
    for (body, param) in cases {
        let e = error_of(Api::Chat, body);
        assert_eq!(e.param, Some(param), "{body}: {}", e.message);
        assert_eq!(e.status(), 400);
        let mut out = Vec::new();
        e.write_body(&mut out);
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error");
        assert_eq!(json["error"]["code"], 400);
        assert_eq!(json["error"]["param"], param);
        assert_eq!(json["error"]["message"], e.message.as_str());
    }
    let many: Vec<String> = (0..STOP_STRINGS_MAX + 1).map(|i| format!("s{i}")).collect();
    let body = serde_json::json!({ "stop": many }).to_string();
    assert_eq!(error_of(Api::Chat, &body).param, Some("stop"));
}

#[test]
fn malformed_bodies_are_400s_not_panics() {
    for body in [
        "",
        "not json",
        "[1,2]",
        r#"{"temperature":"hot"}"#,
        r#"{"max_tokens":-1}"#,
        r#"{"stop":5}"#,
        r#"{"n":1.5}"#,
        r#"{"seed":-1}"#,
        r#"{"temperature":1e999}"#,
    ] {
        for api in [Api::Chat, Api::Completion, Api::Messages, Api::Generate] {
            let e = error_of(api, body);
            assert_eq!(e.status(), 400);
            assert!(!e.message.is_empty());
        }
    }
}

const FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "n",
    "seed",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "stream",
    "stream_options",
    "response_format",
    "prompt",
    "text",
    "input_ids",
    "sampling_params",
    "max_new_tokens",
    "stop_sequences",
    "regex",
    "ebnf",
    "json_schema",
    "return_logprob",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::from)),
        "[a-z ]{0,6}".prop_map(Value::from),
        (0u32..4).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..4).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #[test]
    fn any_body_parses_or_is_a_400(
        pairs in prop::collection::vec((prop::sample::select(FIELDS), json_value()), 0..8),
        raw in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let body: serde_json::Map<String, Value> =
            pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let body = Value::Object(body).to_string();
        for api in [Api::Chat, Api::Completion, Api::Messages, Api::Generate] {
            for bytes in [body.as_bytes(), &raw[..]] {
                match GenerateParams::parse(api, bytes) {
                    Ok(p) => {
                        prop_assert!(p.n >= 1 && p.n <= GENERATE_N_MAX);
                        prop_assert!(p.stop.iter().all(|s| !s.is_empty()));
                    }
                    Err(e) => prop_assert_eq!(e.status(), 400),
                }
            }
        }
    }
}
