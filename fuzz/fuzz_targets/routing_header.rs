//! The routing headers: `x-smg-routing-tokens` (`kvgate::request::parse_routing_tokens`) and the
//! path from a request head's headers to the routing input (`kvgate::request::extract`), where the
//! same value is also sent as `x-smg-routing-key` and `x-smg-target-worker`.
//!
//! Checked beyond "no panic": the hint parser agrees with an independent reading (split on
//! commas, trim ASCII spaces, `str::parse::<u32>` on digits only, within both bounds) and with
//! itself on the re-joined IDs; a refused hint leaves no IDs; and once in a request head, a valid
//! hint becomes the routing key (a refused one never does), the routing key hash is xxh3 of the
//! header value and the target worker is its trimmed text.
#![no_main]

use kvgate::net::codec::parse_request_head;
use kvgate::request::{
    extract, parse_routing_tokens, Endpoint, KeySource, RoutingHeaders, RoutingInput, RoutingKey,
    RoutingMode, ROUTING_KEY_HEADER, ROUTING_TOKENS_BYTES_MAX, ROUTING_TOKENS_HEADER,
    ROUTING_TOKENS_IDS_MAX, TARGET_WORKER_HEADER,
};
use libfuzzer_sys::fuzz_target;

const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

fn reference(value: &[u8]) -> Option<Vec<u32>> {
    if value.is_empty() || value.len() > ROUTING_TOKENS_BYTES_MAX {
        return None;
    }
    let mut ids = Vec::new();
    for item in value.split(|&b| b == b',') {
        let item = item.trim_ascii();
        if item.is_empty() || !item.iter().all(u8::is_ascii_digit) {
            return None;
        }
        ids.push(std::str::from_utf8(item).ok()?.parse::<u32>().ok()?);
    }
    (ids.len() <= ROUTING_TOKENS_IDS_MAX).then_some(ids)
}

fn parse(value: &[u8]) -> Option<Vec<u32>> {
    let mut out = vec![7];
    let ok = parse_routing_tokens(value, &mut out);
    if !ok {
        assert!(out.is_empty(), "a refused hint left IDs");
    }
    ok.then_some(out)
}

fuzz_target!(|data: &[u8]| {
    let ids = parse(data);
    assert_eq!(ids, reference(data), "differs from the reference reading");
    if let Some(ids) = &ids {
        let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        if joined.len() <= ROUTING_TOKENS_BYTES_MAX {
            assert_eq!(parse(joined.as_bytes()).as_ref(), Some(ids));
        }
    }
    check_in_head(data);
});

fn check_in_head(value: &[u8]) {
    // A line break would end the header (or the head) early: not one value any more.
    if value.iter().any(|&b| b == b'\r' || b == b'\n') {
        return;
    }
    let mut buf = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n".to_vec();
    for name in [
        ROUTING_TOKENS_HEADER,
        ROUTING_KEY_HEADER,
        TARGET_WORKER_HEADER,
    ] {
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b": ");
        buf.extend_from_slice(value);
        buf.extend_from_slice(b"\r\n");
    }
    buf.extend_from_slice(b"\r\n");
    // A value the head parser refuses (a control byte, a line break) never reaches extraction.
    let Ok(Some(head)) = parse_request_head(&buf) else {
        return;
    };
    let header = |name| head.headers.get(&buf, name);
    let sent = header(ROUTING_TOKENS_HEADER).expect("the hint header is there");
    let headers = RoutingHeaders {
        mode: RoutingMode::Regular,
        routing_tokens: Some(sent),
        routing_key: header(ROUTING_KEY_HEADER),
        target_worker: header(TARGET_WORKER_HEADER),
    };
    let mut input = RoutingInput::new();
    extract(Endpoint::ChatCompletions, BODY, headers, &mut input).expect("a valid body");
    match reference(sent) {
        Some(ids) => {
            assert_eq!(input.key_source(), Some(KeySource::TokensHeader));
            assert_eq!(input.key(), RoutingKey::Tokens(&ids));
        }
        None => {
            assert_eq!(input.key_source(), Some(KeySource::Text));
            assert_eq!(input.key(), RoutingKey::Text("hello"));
        }
    }
    let hash = (!sent.is_empty()).then(|| xxhash_rust::xxh3::xxh3_64(sent));
    assert_eq!(input.routing_key_hash(), hash);
    let worker = std::str::from_utf8(sent).map(str::trim).unwrap_or("");
    assert_eq!(
        input.target_worker(),
        (!worker.is_empty()).then_some(worker)
    );
    // PD mode never routes on the hint.
    let pd = RoutingHeaders {
        mode: RoutingMode::PrefillDecode,
        ..headers
    };
    extract(Endpoint::ChatCompletions, BODY, pd, &mut input).expect("a valid body");
    assert_eq!(input.key(), RoutingKey::Text("hello"));
}
