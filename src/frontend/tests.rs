//! The front end from token IDs to bytes, on the committed SentencePiece test tokenizer
//! (`tests/fixtures/detokenize-sp-strip.json`): stops through the decoder, and each API's
//! framing, parsed back and checked field by field, with one chunk of each stream compared
//! byte for byte with the shape SMG's gRPC router writes.

use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::tokenize::{DecodeTable, MatchedStop};

fn table() -> Arc<DecodeTable> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/detokenize-sp-strip.json"
    );
    let tokenizer = tokenizers::Tokenizer::from_file(path).unwrap();
    Arc::new(DecodeTable::of(Arc::new(tokenizer)))
}

/// IDs of the test tokenizer's pieces.
fn id(piece: &str) -> u32 {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/detokenize-sp-strip.json"
    );
    let tokenizer = tokenizers::Tokenizer::from_file(path).unwrap();
    tokenizer.token_to_id(piece).unwrap()
}

fn params(api: Api, body: Value) -> GenerateParams {
    GenerateParams::parse(api, body.to_string().as_bytes()).unwrap()
}

fn meta() -> ResponseMeta {
    ResponseMeta {
        id: "chatcmpl-1".into(),
        model: "m".into(),
        created: 1700000000,
    }
}

/// Runs `ids` per choice through the decoder and a stream writer, one ID per step, then the
/// engine's finish (`Length`) for choices the gateway did not stop.
fn stream(api: Api, body: Value, ids: &[&[u32]], usage: Usage) -> String {
    let table = table();
    let params = params(api, body);
    let mut decoder = OutputDecoder::new(table.clone(), &params, &[2]);
    let mut writer = StreamWriter::new(&params, meta(), usage.prompt_tokens);
    let mut out = Vec::new();
    writer.start(&mut out);
    for (index, ids) in ids.iter().enumerate() {
        let index = index as u32;
        for chunk in ids.chunks(1) {
            let d = decoder.push(index, chunk);
            let step = Step {
                index,
                token_ids: &chunk[..d.ids_used],
                text: d.text,
                logprobs: &[],
                finish: d.finish,
            };
            writer.step(&step, &table, &mut out);
        }
        let d = decoder.finish(index, FinishReason::Length, None);
        let step = Step {
            index,
            token_ids: &[],
            text: d.text,
            logprobs: &[],
            finish: d.finish,
        };
        writer.step(&step, &table, &mut out);
    }
    writer.end(&usage, &mut out);
    String::from_utf8(out).unwrap()
}

/// The JSON of each `data:` line before `[DONE]`.
fn data_lines(sse: &str) -> Vec<Value> {
    assert!(sse.ends_with("data: [DONE]\n\n"), "{sse}");
    sse.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

fn usage() -> Usage {
    Usage {
        prompt_tokens: 12,
        completion_tokens: 5,
        cached_tokens: 8,
    }
}

#[test]
fn chat_stream_frames_as_smg_does() {
    let hello = id("▁Hello");
    let world = id("▁world");
    let body = json!({"messages": [], "stream": true, "stream_options": {"include_usage": true}});
    let sse = stream(Api::Chat, body, &[&[hello, world]], usage());
    let head = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":["#;
    let expected = [
        r#"{"index":0,"delta":{"role":"assistant","reasoning_content":null},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"index":0,"delta":{"role":"assistant","content":"Hello","reasoning_content":null},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"index":0,"delta":{"role":"assistant","content":" world","reasoning_content":null},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"index":0,"delta":{"reasoning_content":null},"logprobs":null,"finish_reason":"length"}]}"#,
    ]
    .map(|choice| format!("{head}{choice}\n\n"))
    .concat();
    let usage_chunk = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":8}}}"#;
    assert_eq!(sse, format!("{expected}{usage_chunk}\n\ndata: [DONE]\n\n"));
}

#[test]
fn stops_end_choices_and_are_reported() {
    let (hello, world, the) = (id("▁Hello"), id("▁world"), id("▁the"));
    // "Hello world the": the stop " wor" spans "▁world"; text before it is written.
    let body = json!({"messages": [], "stream": true, "stop": ["lo wor"], "n": 2});
    let sse = stream(
        Api::Chat,
        body,
        &[&[hello, world, the], &[hello, 2, the]],
        usage(),
    );
    let chunks = data_lines(&sse);
    let text = |index: u64| -> String {
        chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap().iter())
            .filter(|c| c["index"] == index)
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect()
    };
    let finish = |index: u64| -> Value {
        chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().unwrap().iter())
            .find(|c| c["index"] == index && !c["finish_reason"].is_null())
            .unwrap()
            .clone()
    };
    assert_eq!(text(0), "Hel");
    assert_eq!(finish(0)["finish_reason"], "stop");
    assert_eq!(finish(0)["matched_stop"], "lo wor");
    // Choice 1: EOS (ID 2) stops it; its ID is the matched stop; nothing after it is decoded.
    assert_eq!(text(1), "Hello");
    assert_eq!(finish(1)["finish_reason"], "stop");
    assert_eq!(finish(1)["matched_stop"], 2);
    // Without include_usage there is no usage chunk.
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
}

#[test]
fn ignore_eos_and_min_tokens_keep_a_choice_going() {
    let table = table();
    let hello = id("▁Hello");
    let p = params(Api::Chat, json!({"messages": [], "ignore_eos": true}));
    let mut decoder = OutputDecoder::new(table.clone(), &p, &[2]);
    let d = decoder.push(0, &[hello, 2, hello]);
    assert_eq!((d.text, d.ids_used, d.finish), ("Hello Hello", 3, None));
    let p = params(
        Api::Chat,
        json!({"messages": [], "min_tokens": 3, "stop": ["Hello"]}),
    );
    let mut decoder = OutputDecoder::new(table.clone(), &p, &[2]);
    let d = decoder.push(0, &[hello, 2]);
    assert_eq!((d.text, d.finish), ("Hello", None));
    let d = decoder.push(0, &[hello]);
    assert_eq!(d.text, " ");
    assert_eq!(d.finish.unwrap().matched, Some(MatchedStop::Text(0)));
    assert_eq!(decoder.completion_tokens(), 3);
    assert!(decoder.all_finished());
    // An index past n and IDs after the end are ignored.
    assert_eq!(decoder.push(5, &[hello]).text, "");
    assert_eq!(decoder.push(0, &[hello]).ids_used, 0);
}

#[test]
fn completion_stream_and_body() {
    let hello = id("▁Hello");
    let body = json!({"prompt": "x", "stream": true});
    let sse = stream(Api::Completion, body, &[&[hello]], usage());
    // SMG's completions chunk: `choices` before `model`, no `logprobs` unless asked.
    let chunk = |choice: &str| {
        format!(
            r#"data: {{"id":"chatcmpl-1","object":"text_completion","created":1700000000,"choices":[{choice}],"model":"m"}}"#
        ) + "\n\n"
    };
    let expected = [
        chunk(r#"{"text":"Hello","index":0,"finish_reason":null}"#),
        chunk(r#"{"text":"","index":0,"finish_reason":"length"}"#),
        "data: [DONE]\n\n".to_owned(),
    ];
    assert_eq!(sse, expected.concat());

    let table = table();
    let p = params(Api::Completion, json!({"prompt": "x", "logprobs": 1}));
    let mut writer = FullWriter::new(&p, meta());
    let logprobs = [TokenLogprob {
        token_id: hello,
        logprob: -0.5,
        top: vec![TopLogprob {
            token_id: hello,
            logprob: -0.5,
        }],
    }];
    let finish = Finish {
        reason: FinishReason::Length,
        matched: None,
    };
    writer.step(&Step {
        index: 0,
        token_ids: &[hello],
        text: "Hello",
        logprobs: &logprobs,
        finish: Some(&finish),
    });
    let mut out = Vec::new();
    writer.write(&usage(), &table, &mut out);
    let body: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], "Hello");
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(
        body["choices"][0]["logprobs"],
        json!({"tokens": [" Hello"], "token_logprobs": [-0.5], "top_logprobs": [{" Hello": -0.5}], "text_offset": [0]})
    );
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
    assert_eq!(body["usage"]["total_tokens"], 17);
}

#[test]
fn chat_body_with_logprobs_and_n() {
    let table = table();
    let (hello, world) = (id("▁Hello"), id("▁world"));
    let p = params(
        Api::Chat,
        json!({"messages": [], "n": 2, "logprobs": true, "top_logprobs": 1, "stop": ["x"]}),
    );
    let mut writer = FullWriter::new(&p, meta());
    let lp = |token_id| TokenLogprob {
        token_id,
        logprob: -1.0,
        top: vec![TopLogprob {
            token_id: world,
            logprob: -2.0,
        }],
    };
    let stop = Finish {
        reason: FinishReason::Stop,
        matched: Some(MatchedStop::Text(0)),
    };
    writer.step(&Step {
        index: 1,
        token_ids: &[world],
        text: " world",
        logprobs: &[lp(world)],
        finish: Some(&stop),
    });
    writer.step(&Step {
        index: 0,
        token_ids: &[hello],
        text: "Hello",
        logprobs: &[lp(hello)],
        finish: None,
    });
    let mut out = Vec::new();
    writer.write(&usage(), &table, &mut out);
    let body: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["id"], "chatcmpl-1");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(
        choices[0]["message"],
        json!({"role": "assistant", "content": "Hello", "reasoning_content": null})
    );
    // A choice the engine never ended is reported as aborted.
    assert_eq!(choices[0]["finish_reason"], "abort");
    assert_eq!(choices[1]["finish_reason"], "stop");
    assert_eq!(choices[1]["matched_stop"], "x");
    assert_eq!(
        choices[1]["logprobs"],
        json!({"content": [{"token": " world", "logprob": -1.0, "bytes": [32, 119, 111, 114, 108, 100],
            "top_logprobs": [{"token": " world", "logprob": -2.0, "bytes": [32, 119, 111, 114, 108, 100]}]}]})
    );
}

#[test]
fn anthropic_stream_event_sequence() {
    let (hello, world) = (id("▁Hello"), id("▁world"));
    let body = json!({"max_tokens": 8, "messages": [], "stream": true, "stop_sequences": ["orl"]});
    let sse = stream(Api::Messages, body, &[&[hello, world]], usage());
    let events: Vec<(&str, Value)> = sse
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once("\ndata: ").unwrap();
            (
                name.strip_prefix("event: ").unwrap(),
                serde_json::from_str(data).unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &events {
        assert_eq!(data["type"], *name);
    }
    let start = &events[0].1["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["usage"]["input_tokens"], 12);
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello w");
    let delta = &events[5].1;
    assert_eq!(
        delta["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "orl"})
    );
    assert_eq!(
        delta["usage"],
        json!({"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 5})
    );
    // Byte for byte, the events whose fields SMG's types fix.
    let start_event = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",",
        "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",",
        "\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":0}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,",
        "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,",
        "\"delta\":{\"type\":\"text_delta\",\"text\":\"Hell\"}}\n\n",
    );
    assert!(sse.starts_with(start_event), "{sse}");
    let end_events = concat!(
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\",",
        "\"stop_sequence\":\"orl\"},\"usage\":{\"output_tokens\":5,\"input_tokens\":4,\"cache_read_input_tokens\":8}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    assert!(sse.ends_with(end_events), "{sse}");
}

#[test]
fn anthropic_message_body() {
    let table = table();
    let p = params(Api::Messages, json!({"max_tokens": 8, "messages": []}));
    let mut writer = FullWriter::new(&p, meta());
    let end = Finish {
        reason: FinishReason::Stop,
        matched: Some(MatchedStop::Token(2)),
    };
    writer.step(&Step {
        index: 0,
        token_ids: &[1],
        text: "Hi \"there\"",
        logprobs: &[],
        finish: Some(&end),
    });
    let mut out = Vec::new();
    writer.write(&usage(), &table, &mut out);
    let body: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        body,
        json!({"id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "Hi \"there\""}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 4, "cache_read_input_tokens": 8, "output_tokens": 5}})
    );
    let text = String::from_utf8(out).unwrap();
    let order =
        r#"{"id":"chatcmpl-1","type":"message","role":"assistant","content":[{"type":"text""#;
    assert!(text.starts_with(order), "{text}");
}

#[test]
fn generate_stream_and_body_in_sglang_shape() {
    let (hello, world) = (id("▁Hello"), id("▁world"));
    let body = json!({"text": "x", "stream": true});
    let sse = stream(Api::Generate, body, &[&[hello, world]], usage());
    let events = data_lines(&sse);
    // Cumulative text and IDs, as SGLang streams them by default.
    assert_eq!(events[0]["text"], "Hello");
    assert_eq!(events[1]["text"], "Hello world");
    assert_eq!(events[1]["output_ids"], json!([hello, world]));
    assert!(events[1]["meta_info"]["finish_reason"].is_null());
    let last = events.last().unwrap();
    assert_eq!(
        last["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 2})
    );
    assert_eq!(last["meta_info"]["prompt_tokens"], 12);

    let table = table();
    let p = params(
        Api::Generate,
        json!({"input_ids": [1], "sampling_params": {"n": 2, "stop": "!"}, "return_logprob": true}),
    );
    let mut writer = FullWriter::new(&p, meta());
    let stop = Finish {
        reason: FinishReason::Stop,
        matched: Some(MatchedStop::Text(0)),
    };
    for index in 0..2 {
        writer.step(&Step {
            index,
            token_ids: &[hello],
            text: "Hello",
            logprobs: &[TokenLogprob {
                token_id: hello,
                logprob: -0.25,
                top: Vec::new(),
            }],
            finish: Some(&stop),
        });
    }
    writer.set_elapsed(0.5);
    let mut out = Vec::new();
    writer.write(&usage(), &table, &mut out);
    let text = String::from_utf8(out).unwrap();
    // SMG's meta_info fields, in its order.
    let one = format!(
        concat!(
            r#"{{"text":"Hello","output_ids":[{hello}],"meta_info":{{"id":"chatcmpl-1","#,
            r#""finish_reason":{{"type":"stop"}},"prompt_tokens":12,"weight_version":"default","#,
            r#""output_token_logprobs":[[-0.25,{hello},null]],"output_top_logprobs":[[]],"#,
            r#""completion_tokens":1,"cached_tokens":8,"e2e_latency":0.5,"matched_stop":"!"}}}}"#
        ),
        hello = hello
    );
    assert_eq!(text, format!("[{one},{one}]"));
}

#[test]
fn a_failed_stream_ends_with_an_error_event() {
    let p = params(Api::Chat, json!({"messages": [], "stream": true}));
    let mut writer = StreamWriter::new(&p, meta(), 3);
    let mut out = Vec::new();
    writer.error("worker went away", &mut out);
    let sse = String::from_utf8(out).unwrap();
    let events = data_lines(&sse);
    assert_eq!(events[0]["error"]["message"], "worker went away");
    let p = params(
        Api::Messages,
        json!({"max_tokens": 1, "messages": [], "stream": true}),
    );
    let mut writer = StreamWriter::new(&p, meta(), 3);
    let mut out = Vec::new();
    writer.error("worker went away", &mut out);
    assert!(String::from_utf8(out)
        .unwrap()
        .starts_with("event: error\ndata: {\"type\":\"error\""));
}

/// The reference on the whole decoded text: the first stop to end, the longest there, then
/// the first listed; the text before it (or through it when kept).
fn trimmed_whole(stops: &[String], text: &str, keep: bool) -> (String, Option<usize>) {
    for end in (1..=text.len()).filter(|e| text.is_char_boundary(*e)) {
        let found = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| text[..end].ends_with(s.as_str()))
            .max_by_key(|(i, s)| (s.len(), std::cmp::Reverse(*i)));
        if let Some((index, stop)) = found {
            let cut = if keep { end } else { end - stop.len() };
            return (text[..cut].to_owned(), Some(index));
        }
    }
    (text.to_owned(), None)
}

proptest::proptest! {
    #[test]
    fn streamed_choices_equal_the_whole_sequence_decoded_then_trimmed(
        picks in proptest::collection::vec(0usize..1000, 1..40),
        cuts in proptest::collection::vec(1usize..4, 1..40),
        stop_spans in proptest::collection::vec((0usize..40, 1usize..4), 0..3),
        skip in proptest::bool::ANY,
        keep in proptest::bool::ANY,
    ) {
        let table = table();
        let size = 300;
        let ids: Vec<u32> = picks.iter().map(|p| (p % size) as u32).collect();
        let whole = table.decode_whole(&ids, skip);
        // Stops cut from the whole text, so they do occur (or from its tail, partly).
        let stops: Vec<String> = stop_spans
            .iter()
            .filter_map(|&(at, len)| {
                let chars: Vec<char> = whole.chars().collect();
                let at = at % chars.len().max(1);
                let s: String = chars.iter().skip(at).take(len).collect();
                (!s.is_empty()).then_some(s)
            })
            .collect();
        let body = json!({"messages": [], "stop": stops, "skip_special_tokens": skip,
            "no_stop_trim": keep, "ignore_eos": true});
        let p = params(Api::Chat, body);
        let mut decoder = OutputDecoder::new(table.clone(), &p, &[]);
        let mut text = String::new();
        let mut finish = None;
        let mut at = 0;
        for cut in cuts.iter().cycle() {
            if at >= ids.len() || finish.is_some() {
                break;
            }
            let end = (at + cut).min(ids.len());
            let d = decoder.push(0, &ids[at..end]);
            text.push_str(d.text);
            finish = d.finish.cloned();
            at = end;
        }
        if finish.is_none() {
            let d = decoder.finish(0, FinishReason::Length, None);
            text.push_str(d.text);
            finish = d.finish.cloned();
        }
        let (expected, matched) = trimmed_whole(&stops, &whole, keep);
        proptest::prop_assert_eq!(&text, &expected, "ids {:?} stops {:?}", ids, stops);
        let finish = finish.unwrap();
        match matched {
            Some(index) => {
                proptest::prop_assert_eq!(finish.reason, FinishReason::Stop);
                proptest::prop_assert_eq!(finish.matched, Some(MatchedStop::Text(index)));
            }
            None => proptest::prop_assert_eq!(finish.reason, FinishReason::Length),
        }
    }
}

#[test]
fn chat_body_in_smg_shape() {
    let table = table();
    let p = params(Api::Chat, json!({"messages": []}));
    let mut writer = FullWriter::new(&p, meta());
    let end = Finish {
        reason: FinishReason::Stop,
        matched: Some(MatchedStop::Token(2)),
    };
    writer.step(&Step {
        index: 0,
        token_ids: &[5],
        text: "Hi",
        logprobs: &[],
        finish: Some(&end),
    });
    let mut out = Vec::new();
    writer.write(&usage(), &table, &mut out);
    let expected = concat!(
        r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","#,
        r#""choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning_content":null},"#,
        r#""finish_reason":"stop","matched_stop":2}],"usage":{"prompt_tokens":12,"#,
        r#""completion_tokens":5,"total_tokens":17,"prompt_tokens_details":{"cached_tokens":8}}}"#
    );
    assert_eq!(String::from_utf8(out).unwrap(), expected);
}
