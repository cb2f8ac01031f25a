//! How a [`WorkItem`] goes on the wire: [`RequestForm`] (chat, completions, `/generate` with text
//! or `input_ids`, or chat with an `x-smg-routing-tokens` header), the optional per-tenant
//! `cache_salt` / LoRA adapter, and [`build_request`], which writes the streaming request body.
//!
//! Prompt text is written without a JSON serializer: it is only base-62 words and spaces, which
//! need no escaping. User-given strings (model, salts) go through `serde_json`.

use std::io::Write;

use bytes::Bytes;

use super::limits::{ROUTING_TOKENS_BYTES_MAX, ROUTING_TOKENS_IDS_MAX};
use super::workload::WorkItem;

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

/// Everything [`build_request`] needs besides the item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormOptions {
    pub form: RequestForm,
    pub model: String,
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

/// Writes `item` as a streaming request in the chosen form.
pub fn build_request(item: &WorkItem, options: &FormOptions) -> WireRequest {
    let output_tokens = options
        .output_cap
        .map_or(item.output_tokens, |cap| item.output_tokens.min(cap.max(1)));
    let prompt_bytes = item.prompt.len_tokens() as usize * 4;
    let mut body = Vec::with_capacity(prompt_bytes + 256);
    let path = match options.form {
        RequestForm::Chat | RequestForm::RoutingTokens => {
            let _ = write!(
                body,
                "{{\"model\":{},\"messages\":[{{\"role\":\"user\",\"content\":\"",
                json_string(&options.model)
            );
            item.prompt.write_text(&mut body);
            let _ = write!(body, "\"}}],\"max_tokens\":{},", output_tokens);
            body.extend_from_slice(b"\"stream\":true,\"stream_options\":{\"include_usage\":true}");
            "/v1/chat/completions"
        }
        RequestForm::Completions => {
            let _ = write!(
                body,
                "{{\"model\":{},\"prompt\":\"",
                json_string(&options.model)
            );
            item.prompt.write_text(&mut body);
            let _ = write!(body, "\",\"max_tokens\":{},", output_tokens);
            body.extend_from_slice(b"\"stream\":true,\"stream_options\":{\"include_usage\":true}");
            "/v1/completions"
        }
        RequestForm::GenerateText => {
            body.extend_from_slice(b"{\"text\":\"");
            item.prompt.write_text(&mut body);
            body.push(b'"');
            write_generate_tail(&mut body, output_tokens);
            "/generate"
        }
        RequestForm::GenerateIds => {
            body.extend_from_slice(b"{\"input_ids\":[");
            for (i, symbol) in item.prompt.symbols().enumerate() {
                let _ = write!(body, "{}{symbol}", if i > 0 { "," } else { "" });
            }
            body.push(b']');
            write_generate_tail(&mut body, output_tokens);
            "/generate"
        }
    };
    write_tenant(&mut body, item, options);
    body.push(b'}');
    let routing_tokens =
        (options.form == RequestForm::RoutingTokens).then(|| routing_tokens_header(item));
    WireRequest {
        path,
        body: Bytes::from(body),
        routing_tokens,
    }
}

fn write_generate_tail(body: &mut Vec<u8>, output_tokens: u32) {
    let _ = write!(
        body,
        ",\"sampling_params\":{{\"max_new_tokens\":{output_tokens}}},\"stream\":true"
    );
}

fn write_tenant(body: &mut Vec<u8>, item: &WorkItem, options: &FormOptions) {
    let tenants = options.tenant.tenants;
    if tenants == 0 {
        return;
    }
    let tenant = item.tenant_key % u64::from(tenants);
    if options.tenant.cache_salt {
        let _ = write!(body, ",\"cache_salt\":\"tenant-{tenant}\"");
    }
    if options.tenant.lora {
        let _ = write!(body, ",\"lora_path\":\"lora-{tenant}\"");
    }
}

/// The prompt's leading token IDs, comma-separated, within both of SMG's header limits.
pub fn routing_tokens_header(item: &WorkItem) -> String {
    let mut header = String::with_capacity(ROUTING_TOKENS_BYTES_MAX);
    for symbol in item.prompt.symbols().take(ROUTING_TOKENS_IDS_MAX) {
        let text = symbol.to_string();
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
    use crate::replay::content::{seed_of, Prompt};

    fn item(tokens: u32) -> WorkItem {
        let mut prompt = Prompt::default();
        prompt.push(seed_of("form", &[1]), tokens);
        WorkItem {
            id: 0,
            arrival_ms: None,
            prompt,
            output_tokens: 3,
            tenant_key: 5,
        }
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
            tenant,
            output_cap: None,
        }
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
            let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
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
        let header = routing_tokens_header(&item(2000));
        assert!(header.len() <= ROUTING_TOKENS_BYTES_MAX);
        assert_eq!(header.split(',').count(), ROUTING_TOKENS_IDS_MAX);
        let first: Vec<u32> = item(2000).prompt.symbols().take(3).collect();
        let parsed: Vec<u32> = header
            .split(',')
            .take(3)
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(first, parsed);
    }
}
