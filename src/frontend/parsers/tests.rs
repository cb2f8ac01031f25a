//! Golden model outputs, written from each model family's documented format, parsed whole and
//! streamed split at every character boundary (and every pair of them): the streamed events
//! must add up to the whole parse, which must be the expected message.

use super::*;
use crate::frontend::params::Constraint;

fn qwen() -> ParseSetup {
    ParseSetup {
        tools: Some(ToolFormat::Qwen),
        reasoning: None,
    }
}

fn tools(format: ToolFormat) -> ParseSetup {
    ParseSetup {
        tools: Some(format),
        reasoning: None,
    }
}

fn reasoning(name: &str) -> Option<ReasoningFormat> {
    ReasoningFormat::by_name(name)
        .expect("known")
        .map(Some)
        .expect("some")
}

/// Parses `chunks` in order: the message and the failures.
fn parse_chunks(setup: &ParseSetup, chunks: &[&str]) -> (Message, u32) {
    let mut parser = OutputParser::new(setup).expect("active");
    let mut message = Message::default();
    for chunk in chunks {
        message.apply(parser.push(chunk));
    }
    message.apply(parser.finish());
    (message, parser.failures())
}

fn parse_whole(setup: &ParseSetup, text: &str) -> (Message, u32) {
    parse_chunks(setup, &[text])
}

/// Every split of `text` into two and three pieces, and into single characters, parses as the
/// whole does.
fn assert_split_invariant(setup: &ParseSetup, text: &str) {
    let whole = parse_whole(setup, text);
    let cuts: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &cuts {
        let got = parse_chunks(setup, &[&text[..i], &text[i..]]);
        assert_eq!(got, whole, "split at {i} of {text:?}");
    }
    if cuts.len() <= 400 {
        for (a, &i) in cuts.iter().enumerate() {
            for &j in &cuts[a..] {
                let got = parse_chunks(setup, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(got, whole, "split at {i} and {j} of {text:?}");
            }
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        parse_chunks(setup, &pieces),
        whole,
        "char by char: {text:?}"
    );
}

fn call(name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn message(reasoning: &str, content: &str, tool_calls: Vec<ToolCall>) -> Message {
    Message {
        reasoning: reasoning.into(),
        content: content.into(),
        tool_calls,
    }
}

/// A golden output: the setup, the model's text, the message it is, its failures.
struct Golden {
    setup: ParseSetup,
    text: &'static str,
    want: Message,
    failures: u32,
}

fn goldens() -> Vec<Golden> {
    let g = |setup, text, want, failures| Golden {
        setup,
        text,
        want,
        failures,
    };
    let r1 = ParseSetup {
        tools: None,
        reasoning: reasoning("deepseek_r1"),
    };
    let qwen3 = ParseSetup {
        tools: Some(ToolFormat::Qwen),
        reasoning: reasoning("qwen3"),
    };
    vec![
        // Qwen 2.5 / Qwen3 / Hermes: `<tool_call>` JSON with "arguments".
        g(
            qwen(),
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n</tool_call>",
            message("", "Let me check.\n", vec![call("get_weather", r#"{"location": "Paris, France", "unit": "celsius"}"#)]),
            0,
        ),
        g(
            qwen(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Asia/Tokyo\", \"nested\": {\"a\": [1, \"}\"]}}}\n</tool_call>",
            message("", "", vec![
                call("get_weather", r#"{"city": "東京"}"#),
                call("get_time", r#"{"tz": "Asia/Tokyo", "nested": {"a": [1, "}"]}}"#),
            ]),
            0,
        ),
        g(
            qwen(),
            "No tools: 1 < 2 and <b>bold</b> <tool and </tool_call> stay text 🙂",
            message("", "No tools: 1 < 2 and <b>bold</b> <tool and </tool_call> stay text 🙂", vec![]),
            0,
        ),
        // Qwen3 thinking, then a call.
        g(
            qwen3,
            "<think>\nThe user wants the weather; call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>",
            message("The user wants the weather; call the tool.\n", "", vec![call("get_weather", r#"{"location": "Paris"}"#)]),
            0,
        ),
        g(
            qwen3,
            "<think>\nShort.\n</think>\n\nThe answer is 4.",
            message("Short.\n", "The answer is 4.", vec![]),
            0,
        ),
        // A name after the arguments: written when the object ends.
        g(
            qwen(),
            "<tool_call>{\"arguments\": {\"q\": \"x\"}, \"name\": \"search\"}</tool_call>",
            message("", "", vec![call("search", r#"{"q": "x"}"#)]),
            0,
        ),
        // Llama 3.2: the object alone, or after <|python_tag|>; "parameters"; `;` between calls.
        g(
            tools(ToolFormat::Llama),
            "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
            message("", "", vec![call("get_weather", r#"{"location": "Paris"}"#)]),
            0,
        ),
        g(
            tools(ToolFormat::Llama),
            "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"rust io_uring\"}}",
            message("", "", vec![call("search", r#"{"query": "rust io_uring"}"#)]),
            0,
        ),
        g(
            tools(ToolFormat::Llama),
            "  {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1, \"y\": true}}",
            message("", "", vec![call("a", "{}"), call("b", r#"{"x": 1, "y": true}"#)]),
            0,
        ),
        g(
            tools(ToolFormat::Llama),
            "The set is {1, 2} in math.",
            message("", "The set is {1, 2} in math.", vec![]),
            0,
        ),
        // Mistral: [TOOL_CALLS] and an array.
        g(
            tools(ToolFormat::Mistral),
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
            message("", "", vec![call("get_weather", r#"{"city": "Paris"}"#), call("get_time", r#"{"tz": "CET"}"#)]),
            0,
        ),
        g(
            tools(ToolFormat::Mistral),
            "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": 12.5}}]",
            message("", "Sure.", vec![call("f", r#"{"n": 12.5}"#)]),
            0,
        ),
        // DeepSeek V3.
        g(
            tools(ToolFormat::DeepSeek),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"JST\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            message("", "", vec![call("get_weather", r#"{"location": "Tokyo"}"#), call("get_time", r#"{"tz": "JST"}"#)]),
            0,
        ),
        // DeepSeek-R1: thinking from the start, with or without the start marker.
        g(
            r1,
            "Okay, 2 + 2.\n</think>\n\nIt is 4.",
            message("Okay, 2 + 2.\n", "It is 4.", vec![]),
            0,
        ),
        g(
            r1,
            "<think>\nOkay, 2 + 2.\n</think>\n\nIt is 4.",
            message("Okay, 2 + 2.\n", "It is 4.", vec![]),
            0,
        ),
        // What `tool_choice: required` constrains the output to.
        g(
            tools(ToolFormat::Json),
            "[{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}, {\"name\": \"get_time\", \"parameters\": {}}]",
            message("", "", vec![call("get_weather", r#"{"location": "Paris"}"#), call("get_time", "{}")]),
            0,
        ),
        // Malformed: given back as content, counted.
        g(
            qwen(),
            "<tool_call>\nnot json\n</tool_call> after",
            message("", "<tool_call>\nnot json\n</tool_call> after", vec![]),
            1,
        ),
        g(
            qwen(),
            "a<tool_call>{\"arguments\": {}, \"x\": 1}</tool_call>b",
            message("", "a<tool_call>{\"arguments\": {}, \"x\": 1}</tool_call>b", vec![]),
            1,
        ),
        g(
            tools(ToolFormat::Llama),
            "{\"answer\": 42}",
            message("", "{\"answer\": 42}", vec![]),
            1,
        ),
        g(
            tools(ToolFormat::Mistral),
            "[TOOL_CALLS] oops",
            message("", "[TOOL_CALLS] oops", vec![]),
            1,
        ),
        g(
            tools(ToolFormat::DeepSeek),
            "<｜tool▁calls▁begin｜>junk",
            message("", "<｜tool▁calls▁begin｜>junk", vec![]),
            1,
        ),
        // Truncated: before the name, all of it is content; after it, the call keeps what came.
        g(
            qwen(),
            "Sure <tool_call>{\"na",
            message("", "Sure <tool_call>{\"na", vec![]),
            1,
        ),
        g(
            qwen(),
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"b",
            message("", "", vec![call("f", r#"{"a": "b"#)]),
            1,
        ),
        g(
            tools(ToolFormat::DeepSeek),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"loc",
            message("", "", vec![call("get_weather", r#"{"loc"#)]),
            1,
        ),
        // A marker's beginning at the end is text.
        g(qwen(), "Hello <tool_", message("", "Hello <tool_", vec![]), 0),
        g(
            ParseSetup {
                tools: None,
                reasoning: reasoning("qwen3"),
            },
            "Plain <thi",
            message("", "Plain <thi", vec![]),
            0,
        ),
    ]
}

#[test]
fn golden_outputs_parse_to_their_messages() {
    for golden in goldens() {
        let (got, failures) = parse_whole(&golden.setup, golden.text);
        assert_eq!(got, golden.want, "{:?}", golden.text);
        assert_eq!(failures, golden.failures, "failures of {:?}", golden.text);
    }
}

#[test]
fn every_split_streams_to_the_whole_parse() {
    for golden in goldens() {
        assert_split_invariant(&golden.setup, golden.text);
    }
}

#[test]
fn arguments_stream_before_the_call_ends_and_no_marker_leaks() {
    let mut parser = OutputParser::new(&qwen()).expect("active");
    let mut message = Message::default();
    for chunk in [
        "Hi <tool",
        "_call>\n{\"name\": \"f",
        "\", \"arguments\": {\"city\": \"Par",
    ] {
        let parsed = parser.push(chunk);
        for event in parsed.events() {
            if let Event::Content(text) = event {
                assert!(!text.contains('<'), "a marker's beginning leaked: {text:?}");
            }
        }
        message.apply(parsed);
    }
    assert_eq!(message.content, "Hi ");
    assert_eq!(message.tool_calls, vec![call("f", r#"{"city": "Par"#)]);
    message.apply(parser.push("is\"}}\n</tool_call>"));
    assert_eq!(message.tool_calls, vec![call("f", r#"{"city": "Paris"}"#)]);
    assert_eq!(parser.tool_calls(), 1);
    // Events come in order: the name before any argument.
    let mut parser = OutputParser::new(&qwen()).expect("active");
    let parsed = parser.push("<tool_call>{\"name\": \"g\", \"arguments\": {\"x\": 1}}");
    let events: Vec<Event<'_>> = parsed.events().collect();
    assert_eq!(
        events,
        vec![
            Event::ToolName {
                index: 0,
                name: "g"
            },
            Event::ToolArgs {
                index: 0,
                delta: r#"{"x": 1}"#
            },
        ]
    );
}

#[test]
fn flags_take_smg_names_and_models_pick_smg_defaults() {
    let flags = ParserFlags::parse(None, None).expect("defaults");
    assert_eq!(flags.tool_for("Qwen/Qwen3-8B"), Some(ToolFormat::Qwen));
    assert_eq!(
        flags.tool_for("qwen2.5-7b-instruct"),
        Some(ToolFormat::Qwen)
    );
    assert_eq!(
        flags.tool_for("mistral-7b-instruct"),
        Some(ToolFormat::Mistral)
    );
    assert_eq!(flags.tool_for("llama-3.2-1b"), Some(ToolFormat::Llama));
    assert_eq!(flags.tool_for("llama-3.1-8b"), Some(ToolFormat::Json));
    assert_eq!(
        flags.tool_for("deepseek-v3-0324"),
        Some(ToolFormat::DeepSeek)
    );
    // SMG's defaults that kvgate does not build pass the text through.
    assert_eq!(flags.tool_for("Qwen/Qwen3-Coder-30B"), None);
    assert_eq!(flags.tool_for("unknown-model"), None);
    assert_eq!(
        flags
            .reasoning_for("deepseek-ai/DeepSeek-R1")
            .map(|f| f.name),
        Some("deepseek_r1")
    );
    assert_eq!(
        flags.reasoning_for("Qwen/Qwen3-8B").map(|f| f.name),
        Some("qwen3")
    );
    assert_eq!(
        flags.reasoning_for("Qwen3-Thinking-2507").map(|f| f.name),
        Some("qwen3_thinking")
    );
    assert_eq!(flags.reasoning_for("meta-llama/Llama-3.1-8B"), None);

    let named = ParserFlags::parse(Some("mistral"), Some("passthrough")).expect("known");
    assert_eq!(named.tool_for("Qwen/Qwen3-8B"), Some(ToolFormat::Mistral));
    assert_eq!(named.reasoning_for("deepseek-r1"), None);
    let (flag, why) = ParserFlags::parse(Some("hermes2"), None).expect_err("unknown");
    assert_eq!(flag, "--tool-call-parser");
    assert!(why.contains("qwen") && why.contains("passthrough"), "{why}");
    let (flag, why) = ParserFlags::parse(Some("pythonic"), None).expect_err("not built");
    assert_eq!(flag, "--tool-call-parser");
    assert!(why.contains("not built"), "{why}");
    let (flag, _) = ParserFlags::parse(None, Some("o1")).expect_err("unknown");
    assert_eq!(flag, "--reasoning-parser");
}

#[test]
fn tool_choice_picks_the_parse_and_the_constraint() {
    let tools = serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time"}},
    ]);
    let flags = ParserFlags::parse(None, Some("passthrough")).expect("flags");
    let auto = ToolRequest::from_openai(Some(&tools), None)
        .expect("ok")
        .expect("tools");
    assert_eq!(auto.choice, ToolChoice::Auto);
    assert_eq!(auto.constraint(), None);
    assert_eq!(
        flags.setup("Qwen/Qwen3-8B", Some(&auto)).tools,
        Some(ToolFormat::Qwen)
    );

    let none = serde_json::json!("none");
    let off = ToolRequest::from_openai(Some(&tools), Some(&none))
        .expect("ok")
        .expect("tools");
    assert_eq!(flags.setup("Qwen/Qwen3-8B", Some(&off)).tools, None);
    assert!(!flags.setup("Qwen/Qwen3-8B", Some(&off)).is_active());

    let required = serde_json::json!("required");
    let forced = ToolRequest::from_openai(Some(&tools), Some(&required))
        .expect("ok")
        .expect("tools");
    assert_eq!(
        flags.setup("unknown", Some(&forced)).tools,
        Some(ToolFormat::Json)
    );
    let Some(Constraint::JsonSchema(schema)) = forced.constraint() else {
        panic!("a schema");
    };
    let schema: serde_json::Value = serde_json::from_str(&schema).expect("json");
    assert_eq!(schema["type"], "array");
    assert_eq!(schema["items"]["anyOf"].as_array().map(Vec::len), Some(2));

    let named = serde_json::json!({"type": "function", "function": {"name": "get_time"}});
    let one = ToolRequest::from_openai(Some(&tools), Some(&named))
        .expect("ok")
        .expect("tools");
    let Some(Constraint::JsonSchema(schema)) = one.constraint() else {
        panic!("a schema");
    };
    let schema: serde_json::Value = serde_json::from_str(&schema).expect("json");
    assert_eq!(schema["maxItems"], 1);
    assert_eq!(
        schema["items"]["anyOf"][0]["properties"]["name"]["enum"][0],
        "get_time"
    );

    let missing = serde_json::json!({"type": "function", "function": {"name": "nope"}});
    let err = ToolRequest::from_openai(Some(&tools), Some(&missing)).expect_err("unknown tool");
    assert_eq!(err.param, Some("tool_choice"));
    assert!(ToolRequest::from_openai(None, Some(&required)).is_err());
    assert_eq!(ToolRequest::from_openai(None, None).expect("ok"), None);

    // Anthropic's shapes: `any` is required, `tool` names one.
    let anthropic_tools =
        serde_json::json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let any = serde_json::json!({"type": "any"});
    let forced = ToolRequest::from_anthropic(Some(&anthropic_tools), Some(&any))
        .expect("ok")
        .expect("tools");
    assert_eq!(forced.choice, ToolChoice::Required);
    let tool = serde_json::json!({"type": "tool", "name": "get_weather"});
    let named = ToolRequest::from_anthropic(Some(&anthropic_tools), Some(&tool))
        .expect("ok")
        .expect("tools");
    assert_eq!(named.choice, ToolChoice::Function("get_weather".into()));
}

/// The writers with a parser: steps of text through a stream writer and a body writer.
mod writers {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use crate::frontend::{
        Api, Finish, FinishReason, FullWriter, GenerateParams, ResponseMeta, Step, StreamWriter,
        Usage,
    };
    use crate::tokenize::DecodeTable;

    const QWEN_OUTPUT: &str = "<think>\nCall it.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

    fn table() -> DecodeTable {
        let model = tokenizers::models::wordlevel::WordLevel::default();
        DecodeTable::of(Arc::new(tokenizers::Tokenizer::new(model)))
    }

    fn params(api: Api, stream: bool) -> GenerateParams {
        let body = match api {
            Api::Messages => json!({"max_tokens": 64, "messages": [], "stream": stream,
                "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}),
            _ => json!({"messages": [], "stream": stream,
                "tools": [{"type": "function", "function": {"name": "get_weather"}}]}),
        };
        let mut params = GenerateParams::parse(api, body.to_string().as_bytes()).expect("body");
        let flags = super::ParserFlags::parse(Some("qwen"), Some("qwen3")).expect("flags");
        params.parsing = flags.setup("Qwen/Qwen3-8B", params.tools.as_ref());
        params
    }

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            model: "m".into(),
            created: 1,
        }
    }

    /// The output in 7-byte steps (at char boundaries), the last with the engine's stop.
    fn steps(text: &str) -> Vec<&str> {
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + 7).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(&text[at..end]);
            at = end;
        }
        pieces
    }

    fn stream(api: Api) -> String {
        let params = params(api, true);
        let table = table();
        let mut writer = StreamWriter::new(&params, meta(), 3);
        let mut out = Vec::new();
        writer.start(&mut out);
        let stop = Finish {
            reason: FinishReason::Stop,
            matched: None,
        };
        for piece in steps(QWEN_OUTPUT) {
            let step = Step {
                index: 0,
                token_ids: &[1],
                text: piece,
                logprobs: &[],
                finish: None,
            };
            writer.step(&step, &table, &mut out);
        }
        let last = Step {
            index: 0,
            token_ids: &[],
            text: "",
            logprobs: &[],
            finish: Some(&stop),
        };
        writer.step(&last, &table, &mut out);
        writer.end(&Usage::default(), &mut out);
        assert_eq!(writer.parse_failures(), 0);
        String::from_utf8(out).expect("utf-8")
    }

    fn body(api: Api) -> Value {
        let params = params(api, false);
        let mut writer = FullWriter::new(&params, meta());
        let stop = Finish {
            reason: FinishReason::Stop,
            matched: None,
        };
        for piece in steps(QWEN_OUTPUT) {
            writer.step(&Step {
                index: 0,
                token_ids: &[1],
                text: piece,
                logprobs: &[],
                finish: None,
            });
        }
        writer.step(&Step {
            index: 0,
            token_ids: &[],
            text: "",
            logprobs: &[],
            finish: Some(&stop),
        });
        let mut out = Vec::new();
        writer.write(&Usage::default(), &table(), &mut out);
        serde_json::from_slice(&out).expect("json body")
    }

    fn data_lines(sse: &str) -> Vec<Value> {
        sse.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).expect("json event"))
            .collect()
    }

    #[test]
    fn chat_stream_has_reasoning_content_tool_call_deltas_and_tool_calls_finish() {
        let chunks = data_lines(&stream(Api::Chat));
        let mut reasoning = String::new();
        let mut content = String::new();
        let mut name = String::new();
        let mut arguments = String::new();
        let mut ids = Vec::new();
        let mut args_chunks = 0;
        for chunk in &chunks {
            let delta = &chunk["choices"][0]["delta"];
            reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(delta["content"].as_str().unwrap_or(""));
            if let Some(call) = delta["tool_calls"].get(0) {
                assert_eq!(call["index"], 0);
                if let Some(id) = call["id"].as_str() {
                    assert!(id.starts_with("call_"), "{id}");
                    assert_eq!(call["type"], "function");
                    ids.push(id.to_owned());
                    name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                } else {
                    args_chunks += 1;
                }
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(reasoning, "Call it.\n");
        assert_eq!(content, "Checking.\n");
        assert_eq!((ids.len(), name.as_str()), (1, "get_weather"));
        assert_eq!(arguments, r#"{"city": "Paris"}"#);
        assert!(args_chunks > 1, "arguments stream in pieces: {args_chunks}");
        let last = chunks.last().expect("chunks");
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn chat_body_has_tool_calls_and_reasoning() {
        let body = body(Api::Chat);
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        let message = &choice["message"];
        assert_eq!(message["content"], "Checking.\n");
        assert_eq!(message["reasoning_content"], "Call it.\n");
        let call = &message["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], r#"{"city": "Paris"}"#);
    }

    #[test]
    fn messages_stream_opens_thinking_text_and_tool_use_blocks() {
        let sse = stream(Api::Messages);
        let events: Vec<Value> = data_lines(&sse);
        let starts: Vec<(u64, String)> = events
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| {
                let index = e["index"].as_u64().expect("index");
                (
                    index,
                    e["content_block"]["type"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        assert_eq!(
            starts,
            vec![
                (0, "thinking".into()),
                (1, "text".into()),
                (2, "tool_use".into())
            ]
        );
        let stops = events
            .iter()
            .filter(|e| e["type"] == "content_block_stop")
            .count();
        assert_eq!(stops, 3);
        let json: String = events
            .iter()
            .filter(|e| e["delta"]["type"] == "input_json_delta")
            .map(|e| {
                assert_eq!(e["index"], 2);
                e["delta"]["partial_json"].as_str().unwrap_or("")
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&json).expect("input"),
            json!({"city": "Paris"})
        );
        let delta = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .expect("delta");
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn messages_body_has_thinking_text_and_tool_use() {
        let body = body(Api::Messages);
        assert_eq!(body["stop_reason"], "tool_use");
        let content = body["content"].as_array().expect("content");
        assert_eq!(content[0]["type"], "thinking");
        assert_eq!(content[0]["thinking"], "Call it.\n");
        assert_eq!(content[1], json!({"type": "text", "text": "Checking.\n"}));
        assert_eq!(content[2]["type"], "tool_use");
        assert_eq!(content[2]["name"], "get_weather");
        assert_eq!(content[2]["input"], json!({"city": "Paris"}));
        assert!(content[2]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("toolu_")));
    }
}
