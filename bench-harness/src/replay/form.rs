//! How a [`WorkItem`] goes on the wire: [`RequestForm`] (chat, completions, `/generate` with text
//! or `input_ids`, or chat with an `x-smg-routing-tokens` header), the optional per-tenant
//! `cache_salt` / LoRA adapter, and [`build_request`], which writes the streaming request body.
//! A captured request keeps its own endpoint and body; only the model ([`CapturedModel`]), the
//! output cap and the tenant fields change.
//!
//! Generated prompt text is written without a JSON serializer: it is only base-62 words and
//! spaces, which need no escaping. Real text and user-given strings (model, salts) go through
//! `serde_json`. The `x-smg-routing-tokens` of real text are sim-engine token ids
//! (`crate::tokenize`), the ids sim-engine computes for that text.

use std::io::Write;

use bytes::Bytes;
use serde_json::Value;

use super::captured::{CapturedEndpoint, CapturedRequest};
use super::content::Prompt;
use super::conversation::ChatPrompt;
use super::limits::{ROUTING_TOKENS_BYTES_MAX, ROUTING_TOKENS_IDS_MAX};
use super::token_ids::{write_ids, TokenIds};
use super::workload::{Content, WorkItem};
use crate::tokenize::token_id;

/// The shape of each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestForm {
    /// `POST /v1/chat/completions`, the prompt as one user message.
    Chat,
    /// `POST /v1/completions` with `prompt`.
    Completions,
    /// `POST /generate` with `text` (SGLang).
    GenerateText,
    /// `POST /generate` with `input_ids` (SGLang): the gateway routes on token IDs.
    GenerateIds,
    /// Chat, plus the prompt's leading token IDs in `x-smg-routing-tokens`.
    RoutingTokens,
}

/// How requests are partitioned into tenants: `tenants` of them (0 = none), each with its own
/// `cache_salt` and/or LoRA adapter, so engines cache them apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantOptions {
    pub tenants: u32,
    pub cache_salt: bool,
    pub lora: bool,
}

/// Whether captured requests (`--trace-format openai-log`) keep the model they name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturedModel {
    /// Send the captured `model` as it is.
    Keep,
    /// Send [`FormOptions::model`] instead (`--model` given, or `compare`'s fleet).
    Replace,
}

/// Everything [`build_request`] needs besides the item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormOptions {
    pub form: RequestForm,
    pub model: String,
    pub captured_model: CapturedModel,
    pub tenant: TenantOptions,
    /// Caps every request's output length (`--output-cap`), to replay long traces with fewer
    /// streamed tokens; `None` keeps the workload's lengths.
    pub output_cap: Option<u32>,
}

/// A request ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireRequest {
    pub path: &'static str,
    pub body: Bytes,
    /// The value of `x-smg-routing-tokens`, for [`RequestForm::RoutingTokens`].
    pub routing_tokens: Option<String>,
}

/// Writes `item` as a request: generated prompts, chat text and token ids in the chosen form (and
/// streaming), a captured request to its own endpoint with its own body.
pub fn build_request(item: &WorkItem, options: &FormOptions) -> WireRequest {
    let output_tokens = options
        .output_cap
        .map_or(item.output_tokens, |cap| item.output_tokens.min(cap.max(1)));
    let (path, body) = match &item.content {
        Content::Generated(prompt) => build_generated(prompt, output_tokens, options),
        Content::Chat(chat) => build_chat(chat, output_tokens, options),
        Content::TokenIds(ids) => build_token_ids(ids, output_tokens, options),
        Content::Captured(request) => return build_captured(request, item, options),
    };
    let mut body = body;
    write_tenant(&mut body, item, options);
    body.push(b'}');
    let routing_tokens =
        (options.form == RequestForm::RoutingTokens).then(|| match &item.content {
            Content::Generated(prompt) => routing_tokens_header(prompt.symbols()),
            Content::Chat(chat) => {
                let texts: Vec<String> = chat.turns().iter().map(|t| t.text()).collect();
                let words = texts.iter().flat_map(|t| t.split_ascii_whitespace());
                routing_tokens_header(words.map(token_id))
            }
            Content::TokenIds(ids) => routing_tokens_header(ids.ids()),
            Content::Captured(_) => String::new(),
        });
    WireRequest {
        path,
        body: Bytes::from(body),
        routing_tokens,
    }
}

/// A generated prompt in the chosen form; the body is left open for the tenant fields.
fn build_generated(
    prompt: &Prompt,
    output_tokens: u32,
    options: &FormOptions,
) -> (&'static str, Vec<u8>) {
    let prompt_bytes = prompt.len_tokens() as usize * 4;
    let mut body = Vec::with_capacity(prompt_bytes + 256);
    let path = match options.form {
        RequestForm::Chat | RequestForm::RoutingTokens => {
            let _ = write!(
                body,
                "{{\"model\":{},\"messages\":[{{\"role\":\"user\",\"content\":\"",
                json_string(&options.model)
            );
            prompt.write_text(&mut body);
            body.extend_from_slice(b"\"}]");
            write_openai_tail(&mut body, output_tokens);
            "/v1/chat/completions"
        }
        RequestForm::Completions => {
            let _ = write!(
                body,
                "{{\"model\":{},\"prompt\":\"",
                json_string(&options.model)
            );
            prompt.write_text(&mut body);
            body.push(b'"');
            write_openai_tail(&mut body, output_tokens);
            "/v1/completions"
        }
        RequestForm::GenerateText => {
            body.extend_from_slice(b"{\"text\":\"");
            prompt.write_text(&mut body);
            body.push(b'"');
            write_generate_tail(&mut body, output_tokens);
            "/generate"
        }
        RequestForm::GenerateIds => {
            body.extend_from_slice(b"{\"input_ids\":");
            write_ids(prompt.symbols(), &mut body);
            write_generate_tail(&mut body, output_tokens);
            "/generate"
        }
    };
    (path, body)
}

/// Real chat text: messages for chat, the turns joined into one prompt for completions and
/// `/generate` (the CLI refuses `generate-ids`, which has no ids to send; text goes instead).
fn build_chat(
    chat: &ChatPrompt,
    output_tokens: u32,
    options: &FormOptions,
) -> (&'static str, Vec<u8>) {
    let mut body = Vec::with_capacity(chat.text_bytes() + 64 * chat.turns().len() + 256);
    let path = match options.form {
        RequestForm::Chat | RequestForm::RoutingTokens => {
            let _ = write!(
                body,
                "{{\"model\":{},\"messages\":",
                json_string(&options.model)
            );
            chat.write_messages(&mut body);
            write_openai_tail(&mut body, output_tokens);
            "/v1/chat/completions"
        }
        RequestForm::Completions => {
            let _ = write!(
                body,
                "{{\"model\":{},\"prompt\":",
                json_string(&options.model)
            );
            chat.write_flat_text(&mut body);
            write_openai_tail(&mut body, output_tokens);
            "/v1/completions"
        }
        RequestForm::GenerateText | RequestForm::GenerateIds => {
            body.extend_from_slice(b"{\"text\":");
            chat.write_flat_text(&mut body);
            write_generate_tail(&mut body, output_tokens);
            "/generate"
        }
    };
    (path, body)
}

/// Real token ids, copied as the trace wrote them: completions with a `prompt` of ids, else
/// `/generate` with `input_ids` (the CLI refuses the text forms without `--tokenizer-path`).
fn build_token_ids(
    ids: &TokenIds,
    output_tokens: u32,
    options: &FormOptions,
) -> (&'static str, Vec<u8>) {
    let mut body = Vec::with_capacity(ids.json().len() + 256);
    let path = if options.form == RequestForm::Completions {
        let _ = write!(
            body,
            "{{\"model\":{},\"prompt\":",
            json_string(&options.model)
        );
        body.extend_from_slice(ids.json().as_bytes());
        write_openai_tail(&mut body, output_tokens);
        "/v1/completions"
    } else {
        body.extend_from_slice(b"{\"input_ids\":");
        body.extend_from_slice(ids.json().as_bytes());
        write_generate_tail(&mut body, output_tokens);
        "/generate"
    };
    (path, body)
}

/// A captured request as captured, but for the model (with [`CapturedModel::Replace`]), the output
/// cap and the tenant fields.
fn build_captured(
    request: &CapturedRequest,
    item: &WorkItem,
    options: &FormOptions,
) -> WireRequest {
    let mut overrides: Vec<(&'static str, Value)> = Vec::new();
    let names_a_model = request.endpoint != CapturedEndpoint::Generate;
    if options.captured_model == CapturedModel::Replace && names_a_model {
        overrides.push(("model", Value::from(options.model.as_str())));
    }
    if let Some(cap) = options.output_cap {
        overrides.extend(request.output_cap_fields(cap.max(1)));
    }
    if let Some(tenant) = tenant_of(item, options) {
        if options.tenant.cache_salt {
            overrides.push(("cache_salt", Value::from(format!("tenant-{tenant}"))));
        }
        if options.tenant.lora {
            overrides.push(("lora_path", Value::from(format!("lora-{tenant}"))));
        }
    }
    let mut body = Vec::new();
    request.write_body(&overrides, &mut body);
    WireRequest {
        path: request.endpoint.path(),
        body: Bytes::from(body),
        routing_tokens: None,
    }
}

/// `,"max_tokens":N,"stream":true,"stream_options":{"include_usage":true}`
fn write_openai_tail(body: &mut Vec<u8>, output_tokens: u32) {
    let _ = write!(body, ",\"max_tokens\":{output_tokens},");
    body.extend_from_slice(b"\"stream\":true,\"stream_options\":{\"include_usage\":true}");
}

fn write_generate_tail(body: &mut Vec<u8>, output_tokens: u32) {
    let _ = write!(
        body,
        ",\"sampling_params\":{{\"max_new_tokens\":{output_tokens}}},\"stream\":true"
    );
}

/// The tenant of `item`, when requests are spread over tenants.
fn tenant_of(item: &WorkItem, options: &FormOptions) -> Option<u64> {
    let tenants = options.tenant.tenants;
    (tenants > 0).then(|| item.tenant_key % u64::from(tenants))
}

fn write_tenant(body: &mut Vec<u8>, item: &WorkItem, options: &FormOptions) {
    let Some(tenant) = tenant_of(item, options) else {
        return;
    };
    if options.tenant.cache_salt {
        let _ = write!(body, ",\"cache_salt\":\"tenant-{tenant}\"");
    }
    if options.tenant.lora {
        let _ = write!(body, ",\"lora_path\":\"lora-{tenant}\"");
    }
}

/// The leading token IDs, comma-separated, within both of SMG's header limits.
pub fn routing_tokens_header(ids: impl Iterator<Item = u32>) -> String {
    let mut header = String::with_capacity(ROUTING_TOKENS_BYTES_MAX);
    for id in ids.take(ROUTING_TOKENS_IDS_MAX) {
        let text = id.to_string();
        let separator = usize::from(!header.is_empty());
        if header.len() + separator + text.len() > ROUTING_TOKENS_BYTES_MAX {
            break;
        }
        if separator == 1 {
            header.push(',');
        }
        header.push_str(&text);
    }
    header
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::captured::parse_captured_line;
    use crate::replay::content::seed_of;
    use crate::replay::conversation::{Role, Turn};
    use serde_json::json;
    use std::sync::Arc;

    fn item_with(content: Content) -> WorkItem {
        WorkItem {
            id: 0,
            arrival_ms: None,
            content,
            output_tokens: 3,
            tenant_key: 5,
        }
    }

    fn item(tokens: u32) -> WorkItem {
        let mut prompt = Prompt::default();
        prompt.push(seed_of("form", &[1]), tokens);
        item_with(Content::Generated(prompt))
    }

    fn options(form: RequestForm) -> FormOptions {
        let tenant = TenantOptions {
            tenants: 2,
            cache_salt: true,
            lora: true,
        };
        FormOptions {
            form,
            model: "m\"x".into(),
            captured_model: CapturedModel::Keep,
            tenant,
            output_cap: None,
        }
    }

    fn json_of(request: &WireRequest) -> Value {
        serde_json::from_slice(&request.body).unwrap()
    }

    #[test]
    fn every_form_is_valid_json_with_the_prompt_length_and_tenant() {
        for form in [
            RequestForm::Chat,
            RequestForm::Completions,
            RequestForm::GenerateText,
            RequestForm::GenerateIds,
            RequestForm::RoutingTokens,
        ] {
            let request = build_request(&item(20), &options(form));
            let body = json_of(&request);
            let words = match form {
                RequestForm::Chat | RequestForm::RoutingTokens => body["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .split(' ')
                    .count(),
                RequestForm::Completions => body["prompt"].as_str().unwrap().split(' ').count(),
                RequestForm::GenerateText => body["text"].as_str().unwrap().split(' ').count(),
                RequestForm::GenerateIds => body["input_ids"].as_array().unwrap().len(),
            };
            assert_eq!(words, 20, "{form:?}");
            assert_eq!(body["stream"], true);
            assert_eq!(body["cache_salt"], "tenant-1");
            assert_eq!(body["lora_path"], "lora-1");
            assert_eq!(
                request.routing_tokens.is_some(),
                form == RequestForm::RoutingTokens
            );
        }
    }

    #[test]
    fn the_routing_tokens_header_keeps_within_smg_limits() {
        let prompt = item(2000).generated().unwrap().clone();
        let header = routing_tokens_header(prompt.symbols());
        assert!(header.len() <= ROUTING_TOKENS_BYTES_MAX);
        assert_eq!(header.split(',').count(), ROUTING_TOKENS_IDS_MAX);
        let first: Vec<u32> = prompt.symbols().take(3).collect();
        let parsed: Vec<u32> = header
            .split(',')
            .take(3)
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(first, parsed);
    }

    #[test]
    fn chat_text_goes_as_messages_or_as_one_escaped_prompt() {
        let turns: Arc<[Turn]> = Arc::from(vec![
            Turn::from_text(Role::User, "say \"hi\""),
            Turn::from_text(Role::Assistant, "hi"),
            Turn::from_text(Role::User, "again"),
        ]);
        let chat = item_with(Content::Chat(ChatPrompt::new(turns, 3)));
        let mut capped = options(RequestForm::Chat);
        capped.output_cap = Some(2);
        let request = build_request(&chat, &capped);
        let body = json_of(&request);
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(body["messages"][0]["content"], "say \"hi\"");
        assert_eq!(body["messages"][1]["role"], "assistant");
        assert_eq!(body["max_tokens"], 2);
        assert_eq!(body["model"], "m\"x");
        let text = json_of(&build_request(&chat, &options(RequestForm::GenerateText)));
        assert_eq!(text["text"], "say \"hi\"\nhi\nagain");
        let routed = build_request(&chat, &options(RequestForm::RoutingTokens));
        let first = token_id("say").to_string();
        assert!(routed.routing_tokens.unwrap().starts_with(&first));
    }

    #[test]
    fn token_ids_go_as_input_ids_or_a_completions_prompt() {
        let ids = item_with(Content::TokenIds(TokenIds::from_ids(&[7, 8, 9])));
        let generate = build_request(&ids, &options(RequestForm::GenerateIds));
        assert_eq!(generate.path, "/generate");
        assert_eq!(json_of(&generate)["input_ids"], json!([7, 8, 9]));
        assert_eq!(json_of(&generate)["sampling_params"]["max_new_tokens"], 3);
        let completions = build_request(&ids, &options(RequestForm::Completions));
        assert_eq!(completions.path, "/v1/completions");
        assert_eq!(json_of(&completions)["prompt"], json!([7, 8, 9]));
    }

    #[test]
    fn a_captured_request_is_sent_as_captured_but_for_the_overrides() {
        let line = json!({"timestamp_ms": 0, "endpoint": "/v1/completions", "body": {
            "model": "llama", "prompt": "x", "max_tokens": 50, "stream": false, "user": "u1"}});
        let captured = parse_captured_line(&line.to_string()).unwrap().request;
        let item = item_with(Content::Captured(captured));
        let mut keep = options(RequestForm::Chat);
        keep.tenant.tenants = 0;
        let request = build_request(&item, &keep);
        assert_eq!(request.path, "/v1/completions");
        assert_eq!(json_of(&request), line["body"]);
        let mut replace = options(RequestForm::Chat);
        replace.captured_model = CapturedModel::Replace;
        replace.output_cap = Some(16);
        let body = json_of(&build_request(&item, &replace));
        assert_eq!(
            (&body["model"], &body["max_tokens"], &body["stream"]),
            (&json!("m\"x"), &json!(16), &json!(false))
        );
        assert_eq!(
            (&body["cache_salt"], &body["user"]),
            (&json!("tenant-1"), &json!("u1"))
        );
    }
}
