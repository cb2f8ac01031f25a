//! The router's three calls together: preparation, selection (over statuses of the test's
//! own, and over the published worker table), records, tokenization and the index modes.

use std::sync::Arc;

use crate::ids::WorkerId;
use crate::policy::{
    model_hash, Branch, CacheIndexKind, IndexLookup, KeyData, Lookup, MeshShare, PolicyArgs,
    PolicyKind, PolicyMetrics, Prepared, Router, WorkerStatus, WorkerView,
};
use crate::request::{Endpoint, KeySource, RoutingHeaders, RoutingKey};
use crate::tokenize::{CacheConfig, TokenizerSet};
use crate::workers::catalog::ModelWorkers;
use crate::workers::retry::TriedWorkers;
use crate::workers::table::WorkerTable;

/// `body` for `endpoint`, prepared by `router` at `now_ms` (no routing headers).
fn prepare(router: &mut Router, endpoint: Endpoint, body: &[u8], now_ms: u64) -> Prepared {
    let mut prepared = Prepared::default();
    let headers = RoutingHeaders::default();
    router
        .prepare(&mut prepared, endpoint, headers, body, now_ms)
        .expect("a JSON object");
    prepared
}

/// Prepares `body` at `now_ms` and routes it over idle workers named by `urls`.
fn prepare_and_route_idle(
    router: &mut Router,
    urls: &[&str],
    (endpoint, body): (Endpoint, &str),
    now_ms: u64,
) -> (WorkerId, Prepared) {
    let prepared = prepare(router, endpoint, body.as_bytes(), now_ms);
    let worker = choose_idle(router, urls, &prepared);
    (worker, prepared)
}

/// The worker `router` chooses for `prepared` among `urls` (slot = position), all eligible and
/// idle.
pub(in crate::policy) fn choose_idle(
    router: &mut Router,
    urls: &[&str],
    prepared: &Prepared,
) -> WorkerId {
    let workers = urls
        .iter()
        .enumerate()
        .map(|(slot, url)| (WorkerId(slot as u16), *url));
    let status_of = |_| WorkerStatus {
        eligible: true,
        ..WorkerStatus::default()
    };
    router.choose(prepared, workers, status_of).unwrap()
}

fn router() -> (Router, Arc<PolicyMetrics>) {
    let config = PolicyArgs::default().validate().unwrap();
    let metrics = Arc::new(PolicyMetrics::default());
    (Router::new(config, 5, None, metrics.clone()), metrics)
}

/// Prepares a completion of `prompt` and routes it over idle workers named by `urls`.
fn route_idle(router: &mut Router, urls: &[&str], prompt: &str) -> WorkerId {
    let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
    prepare_and_route_idle(router, urls, (Endpoint::Completions, &body), 10).0
}

/// `--bounded-load-margin`: the first roster's workers are read at their published counts (the
/// same on every core); a worker new in its slot starts at the others' mean, whatever the slot
/// counted before, and counts on from there.
#[test]
fn bounded_load_counts_a_worker_new_in_its_slot_from_the_others_mean() {
    let args = PolicyArgs {
        bounded_load_margin: Some(4),
        ..PolicyArgs::default()
    };
    let mut router = Router::new(
        args.validate().unwrap(),
        5,
        None,
        Arc::new(PolicyMetrics::default()),
    );
    let body = br#"{"model":"m","prompt":"a prompt long enough to be a key"}"#;
    let mut counts_after = |urls: &[&str], published: &[u64]| {
        let prepared = prepare(&mut router, Endpoint::Completions, body, 10);
        let workers = urls
            .iter()
            .enumerate()
            .map(|(slot, url)| (WorkerId(slot as u16), *url));
        let status_of = |id: WorkerId| WorkerStatus {
            eligible: true,
            dispatched: published[id.index()],
            ..WorkerStatus::default()
        };
        router.choose(&prepared, workers, status_of).unwrap();
        router
            .statuses
            .iter()
            .map(|s| s.dispatched)
            .collect::<Vec<_>>()
    };
    assert_eq!(counts_after(&["http://a", "http://b"], &[10, 4]), [10, 4]);
    // Slot 2 held another worker once (100 sent): its new worker starts at the mean, 9.
    let three = ["http://a", "http://b", "http://c"];
    assert_eq!(counts_after(&three, &[12, 6, 100]), [12, 6, 9]);
    assert_eq!(counts_after(&three, &[12, 6, 103]), [12, 6, 12]);
    // Slot 1 now serves another URL: a new worker, at the others' mean (12).
    let replaced = ["http://a", "http://d", "http://c"];
    assert_eq!(counts_after(&replaced, &[12, 6, 103]), [12, 12, 12]);
    assert_eq!(counts_after(&replaced, &[12, 7, 103]), [12, 13, 12]);
}

#[test]
fn a_kv_pressure_pick_is_recorded_but_not_broadcast_to_the_mesh() {
    let args = PolicyArgs {
        overload_token_usage_threshold: Some(0.9),
        ..PolicyArgs::default()
    };
    let config = args.validate().unwrap();
    let mut router = Router::new(config, 5, None, Arc::new(PolicyMetrics::default()));
    let urls = ["http://w0", "http://w1"];
    let body = br#"{"model":"m","prompt":"a prompt long enough to be a key"}"#;
    for (hottest, share) in [(0.95, MeshShare::Local), (0.5, MeshShare::Broadcast)] {
        let prepared = prepare(&mut router, Endpoint::Completions, body, 10);
        let workers = urls
            .iter()
            .enumerate()
            .map(|(slot, url)| (WorkerId(slot as u16), *url));
        let status_of = |id: WorkerId| WorkerStatus {
            eligible: true,
            load: Some(crate::policy::WorkerLoad {
                token_usage: if id.index() == 0 { hottest } else { 0.1 },
                gen_throughput: 1000.0,
                ..Default::default()
            }),
            ..WorkerStatus::default()
        };
        let worker = router.choose(&prepared, workers, status_of).unwrap();
        let record = router.record(&prepared, worker, 10).unwrap();
        assert_eq!(record.mesh, share, "hottest worker at {hottest}");
    }
}

#[test]
fn a_large_bodys_record_keeps_its_text_as_extracted_and_a_small_ones_copies_it() {
    let (mut router, _) = router();
    let urls = ["http://w0", "http://w1"];
    let line = "a line of a long document, with a newline escape\\n";
    let large = line.repeat(crate::request::SHARED_TEXT_BODY_BYTES_MIN / line.len() + 1);
    for (prompt, shared) in [(large.as_str(), true), ("a short prompt\\n", false)] {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
        let prepared = prepare(&mut router, Endpoint::ChatCompletions, body.as_bytes(), 10);
        let expected = prompt.replace("\\n", "\n");
        assert_eq!(prepared.input.text(), expected);
        assert_eq!(prepared.input.shared_text().is_some(), shared);
        let workers = urls
            .iter()
            .enumerate()
            .map(|(slot, url)| (WorkerId(slot as u16), *url));
        let idle = |_| WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        let worker = router.choose(&prepared, workers, idle).unwrap();
        let record = router.record(&prepared, worker, 10).unwrap();
        let KeyData::Text(key) = &record.key else {
            panic!("a text key, got {:?}", record.key);
        };
        assert_eq!(&**key, expected);
        // One copy of the text: the record holds the very buffer extraction built.
        let same_buffer = std::ptr::eq(key.as_ptr(), prepared.input.text().as_ptr());
        assert_eq!(same_buffer, shared, "{} bytes", body.len());
    }
}

/// Prepares and decides request `i` of one new prompt over four workers whose in-flight counts
/// are `in_flight` (the decision's worker gains one, as the gateway's credit does).
fn decide_burst_request(
    router: &mut Router,
    in_flight: &mut [u32; 4],
    i: u32,
) -> (Prepared, WorkerId) {
    let urls: Vec<String> = (0..4).map(|i| format!("http://w{i}")).collect();
    let body = format!(r#"{{"model":"m","prompt":"a long shared system prompt, then user {i}"}}"#);
    let prepared = prepare(router, Endpoint::Completions, body.as_bytes(), 10);
    let workers = urls
        .iter()
        .enumerate()
        .map(|(slot, url)| (WorkerId(slot as u16), url.as_str()));
    let status_of = |id: WorkerId| WorkerStatus {
        eligible: true,
        in_flight: in_flight[id.index()],
        ..WorkerStatus::default()
    };
    let worker = router.choose(&prepared, workers, status_of).unwrap();
    in_flight[worker.index()] += 1;
    (prepared, worker)
}

#[test]
fn a_burst_of_a_new_prefix_follows_the_first_dispatch_before_the_index_learns_it() {
    let (mut router, metrics) = router();
    let mut in_flight = [0u32; 4];
    let mut chosen = Vec::new();
    for i in 0..10 {
        let (prepared, worker) = decide_burst_request(&mut router, &mut in_flight, i);
        let record = router.record(&prepared, worker, 10).unwrap();
        assert_eq!(record.namespace.model, model_hash("m"));
        assert_eq!(
            record.model_name.is_some(),
            i == 0,
            "the model name is sent once"
        );
        chosen.push(worker);
    }
    assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
    assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 1);
    assert_eq!(metrics.branch_count(Branch::TreeMatch), 9);
}

#[test]
fn a_burst_of_a_new_prefix_follows_its_first_request_while_that_one_is_still_being_forwarded() {
    // The record comes once the worker has the request (after connecting and forwarding): the
    // second request of a new prompt is decided before the first one's record, with the first
    // worker already one request busier, which alone would send a miss elsewhere.
    let (mut router, metrics) = router();
    let mut in_flight = [0u32; 4];
    let decided: Vec<(Prepared, WorkerId)> = (0..3)
        .map(|i| decide_burst_request(&mut router, &mut in_flight, i))
        .collect();
    let workers: Vec<WorkerId> = decided.iter().map(|(_, w)| *w).collect();
    assert!(workers.iter().all(|&w| w == workers[0]), "{workers:?}");
    assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 1);
    assert_eq!(metrics.branch_count(Branch::TreeMatch), 2);
    // The records that follow do not remember the first request a second time.
    for (prepared, worker) in &decided {
        assert!(router.record(prepared, *worker, 11).is_some());
    }
    assert_eq!(router.recent.entries_held(), 3);
}

#[test]
fn new_prefixes_spread_by_how_much_each_worker_was_given() {
    // Idle workers, no load reports, no in-flight feedback: only this core's placed tokens
    // tell them apart, so 16 unrelated prompts of one length land two on each of 8 workers.
    let (mut router, metrics) = router();
    let urls: Vec<String> = (0..8).map(|i| format!("http://w{i}")).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut counts = [0u32; 8];
    for i in 0..16u8 {
        let prompt = char::from(b'a' + i).to_string().repeat(40);
        counts[route_idle(&mut router, &urls, &prompt).index()] += 1;
    }
    assert_eq!(counts, [2; 8]);
    assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 16);
}

#[test]
fn a_long_new_prompt_weighs_more_than_several_short_ones() {
    let (mut router, _) = router();
    let urls = ["http://a", "http://b"];
    // 100 tokens (4 characters each) on one worker, then three prompts of 10 tokens: all
    // three go to the other worker, still given fewer tokens after two of them.
    let long = route_idle(&mut router, &urls, &"a".repeat(400));
    let short: Vec<WorkerId> = ["b", "c", "d"]
        .iter()
        .map(|letter| route_idle(&mut router, &urls, &letter.repeat(40)))
        .collect();
    assert!(short.iter().all(|w| *w != long), "{long:?} {short:?}");
}

#[test]
fn other_policies_send_no_index_records() {
    let args = PolicyArgs {
        policy: crate::policy::PolicyKind::RoundRobin,
        ..PolicyArgs::default()
    };
    let mut router = Router::new(args.validate().unwrap(), 1, None, Arc::default());
    let prepared = prepare(&mut router, Endpoint::Completions, br#"{"prompt":"p"}"#, 0);
    let status_of = |_| WorkerStatus {
        eligible: true,
        ..WorkerStatus::default()
    };
    let only = std::iter::once((WorkerId(0), "http://w0"));
    let worker = router.choose(&prepared, only, status_of);
    assert_eq!(worker, Some(WorkerId(0)));
    assert_eq!(router.record(&prepared, WorkerId(0), 0), None);
    // Nor do they build a large body's text for the index: it stays in the reused buffer.
    let prompt = "p".repeat(crate::request::SHARED_TEXT_BODY_BYTES_MIN);
    let body = format!(r#"{{"prompt":"{prompt}"}}"#);
    let prepared = prepare(&mut router, Endpoint::Completions, body.as_bytes(), 0);
    assert_eq!(prepared.input.text(), prompt);
    assert!(prepared.input.shared_text().is_none());
}

mod tokenize_tests {
    //! The router's side of tokenization (the tokenizer is `tokenize::tests`' word-level one):
    //! which requests are tokenized, deferral of cold work, and what a refused one routes on.
    use super::prepare;
    use super::*;
    use crate::tokenize::tests::model;

    fn tokenizing_router(
        kind: PolicyKind,
        inline_max_bytes: usize,
    ) -> (Router, Arc<PolicyMetrics>) {
        let args = PolicyArgs {
            policy: kind,
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let set = Arc::new(TokenizerSet::new(vec![(Some("m".into()), model(false))]));
        let cache = CacheConfig {
            l0_entries_max: 0,
            l1_bytes_max: 1 << 20,
        };
        let router = Router::new(args.validate().unwrap(), 1, None, metrics.clone())
            .with_tokenizers(set, cache, inline_max_bytes);
        (router, metrics)
    }

    const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#;

    #[test]
    fn requests_of_a_model_with_a_tokenizer_route_on_its_ids_others_on_text() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::CacheAware, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key_source(), Some(KeySource::Tokenized));
        assert_eq!(
            chat.input.key(),
            RoutingKey::Tokens(&[100, 4, 1, 2, 101, 100, 5])
        );
        let completion = br#"{"model":"m","prompt":"hello"}"#;
        let completion = prepare(&mut router, Endpoint::Completions, completion, 0);
        // Completions get the post-processor's token (102) in front, as engines encode them.
        assert_eq!(completion.input.key(), RoutingKey::Tokens(&[102, 1]));
        let other = br#"{"model":"other","messages":[{"role":"user","content":"hello"}]}"#;
        let other = prepare(&mut router, Endpoint::ChatCompletions, other, 0);
        assert_eq!(other.input.key(), RoutingKey::Text("hello"));
        // A body the template cannot read routes on its text, counted.
        let bad = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"continue_final_message":true}"#;
        let bad = prepare(&mut router, Endpoint::ChatCompletions, bad, 0);
        assert_eq!(bad.input.key(), RoutingKey::Text("hi"));
        assert_eq!(metrics.tokenizer().failures, 1);
        assert!(metrics.tokenizer().l1_misses > 0);
    }

    #[test]
    fn cold_work_past_the_inline_bound_is_deferred_and_a_refused_one_routes_on_text() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::CacheAware, 4);
        let headers = RoutingHeaders::default();
        let mut prepared = Prepared::default();
        let cold = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                CHAT.as_bytes(),
                0,
            )
            .unwrap()
            .expect("cold work over 4 bytes is deferred");
        assert!(prepared.lookup.is_none(), "not prepared until finished");
        router.finish_prepare(&mut prepared, Some(cold.run()));
        assert_eq!(prepared.input.key_source(), Some(KeySource::Tokenized));
        assert!(prepared.lookup.is_some());
        // The same prompt again: all cached, nothing deferred.
        let again = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                CHAT.as_bytes(),
                0,
            )
            .unwrap();
        assert!(again.is_none());
        // A new prompt whose work the pool refused: the text, counted.
        let new = r#"{"model":"m","messages":[{"role":"user","content":"brief hi"}]}"#;
        let cold = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                new.as_bytes(),
                0,
            )
            .unwrap();
        assert!(cold.is_some());
        router.finish_prepare(&mut prepared, None);
        assert_eq!(prepared.input.key(), RoutingKey::Text("brief hi"));
        assert_eq!(metrics.tokenize_offloads(), (2, 1));
    }

    /// A chat body of one "hello world" message and `filler` messages the template prints as
    /// `<|s|> <|e|>` (no role, no content).
    fn long_chat(filler: usize) -> String {
        let mut messages = vec![r#"{"role":"user","content":"hello world"}"#; 1];
        messages.extend(std::iter::repeat_n("{}", filler));
        format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","))
    }

    #[test]
    fn a_long_body_is_rendered_off_the_core_and_one_past_the_caps_routes_on_text() {
        use crate::limits::TOKENIZE_RENDER_INLINE_BYTES;
        use crate::limits::{TOKENIZE_MESSAGES_MAX, TOKENIZE_PROMPT_BYTES_MAX};
        use crate::tokenize::{Deferred, PromptSource};
        let (mut router, metrics) = tokenizing_router(PolicyKind::CacheAware, 1 << 20);
        let headers = RoutingHeaders::default();
        let mut prepared = Prepared::default();
        // Past the render bound: nothing is parsed, rendered or looked up on the core.
        let long = long_chat(TOKENIZE_RENDER_INLINE_BYTES / 2);
        let deferred = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                long.as_bytes(),
                0,
            )
            .unwrap()
            .expect("a long body is deferred");
        assert!(matches!(deferred, Deferred::Render(_)), "{deferred:?}");
        assert_eq!(metrics.tokenizer().l0_misses, 0, "not rendered on the core");
        // Rendered and cut on the pool; the core finds no cold work past its bound.
        let more = router.finish_prepare(&mut prepared, Some(deferred.run()));
        assert!(more.is_none());
        assert_eq!(prepared.input.key_source(), Some(KeySource::Tokenized));
        let whole = model(false);
        let prompt = whole.prompt(PromptSource::Chat(long.as_bytes())).unwrap();
        let ids = whole.encode(&prompt.text, false).unwrap();
        assert_eq!(
            prepared.input.key(),
            RoutingKey::Tokens(&ids),
            "as encoded whole"
        );
        // More messages than the cap: the pool stops reading them, the request keeps its text.
        let many = long_chat(TOKENIZE_MESSAGES_MAX);
        let many = prepare(&mut router, Endpoint::ChatCompletions, many.as_bytes(), 0);
        assert_eq!(many.input.key(), RoutingKey::Text("hello world"));
        assert_eq!(metrics.tokenizer().over_cap, 1);
        // More bytes than the cap: refused on the core at once, nothing deferred or copied.
        let words = "hello ".repeat(TOKENIZE_PROMPT_BYTES_MAX / 6 + 1);
        let huge = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{words}"}}]}}"#);
        let refused = router
            .prepare_or_defer(
                &mut prepared,
                Endpoint::ChatCompletions,
                headers,
                huge.as_bytes(),
                0,
            )
            .unwrap();
        assert!(refused.is_none());
        assert_eq!(prepared.input.key_source(), Some(KeySource::Text));
        assert_eq!(metrics.tokenizer().over_cap, 2);
        assert_eq!(metrics.tokenizer().failures, 0);
    }

    #[test]
    fn policies_that_read_no_token_ids_do_not_tokenize() {
        let (mut router, metrics) = tokenizing_router(PolicyKind::RoundRobin, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key(), RoutingKey::Text("hello world"));
        assert_eq!(metrics.tokenizer().l1_misses, 0);
        let (mut router, _) = tokenizing_router(PolicyKind::PrefixHash, 1 << 20);
        let chat = prepare(&mut router, Endpoint::ChatCompletions, CHAT.as_bytes(), 0);
        assert_eq!(chat.input.key_source(), Some(KeySource::Tokenized));
    }
}

mod index_tests {
    use super::*;
    use super::{prepare, prepare_and_route_idle};
    use crate::index::{IndexConfig, IndexWriter};
    use crate::policy::Trees;

    /// Dispatch records applied to a real index make the next request of the family match.
    #[test]
    fn records_inserted_into_the_index_make_the_family_match() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let reader = writer.reader().unwrap();
        let config = PolicyArgs::default().validate().unwrap();
        let metrics = Arc::new(PolicyMetrics::default());
        let trees: Box<dyn IndexLookup> = Box::new(Trees::new(reader));
        let mut router = Router::new(config, 3, Some(trees), metrics.clone());
        let system: Vec<String> = (0..2048).map(|i| format!("w{i}x")).collect();
        let system = system.join(" ");
        let urls = ["http://a", "http://b", "http://c"];
        let mut chosen = Vec::new();
        for (i, now_ms) in [(0, 0u64), (1, 1_000), (2, 2_000), (3, 3_000)] {
            let body = serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question number {i}")}
                ]
            })
            .to_string();
            let request = (Endpoint::ChatCompletions, body.as_str());
            let (worker, prepared) = prepare_and_route_idle(&mut router, &urls, request, now_ms);
            let record = router.record(&prepared, worker, now_ms).unwrap();
            let ns = record.namespace;
            match &record.key {
                KeyData::Text(text) => writer
                    .insert_text_hinted(ns, text, worker, now_ms, &record.hint)
                    .unwrap(),
                KeyData::Tokens(tokens) => writer
                    .insert_tokens_shared(ns, tokens, worker, now_ms, &record.hint)
                    .unwrap(),
                KeyData::Heads(_) => panic!("tree mode records no heads"),
            }
            chosen.push(worker);
        }
        // Seconds apart: the recent-dispatch map has expired, only the index can match.
        assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
        assert_eq!(metrics.branch_count(Branch::TreeMatch), 3);
    }

    /// `--load-aware-affinity`: a request its holder is too busy for goes to another worker,
    /// and once that dispatch is recorded the prefix has two holders.
    #[test]
    fn a_replicated_prefix_has_two_holders() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let reader = writer.reader().unwrap();
        let args = PolicyArgs {
            load_aware_affinity: true,
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let trees: Box<dyn IndexLookup> = Box::new(Trees::new(reader));
        let mut router = Router::new(args.validate().unwrap(), 3, Some(trees), metrics.clone());
        let prompt = |i: u32| {
            let words: Vec<String> = (0..2048).map(|w| format!("w{w}x")).collect();
            let body =
                serde_json::json!({"model": "m", "prompt": format!("{} q{i}", words.join(" "))});
            body.to_string()
        };
        let urls = ["http://a", "http://b", "http://c"];
        let workers = || {
            urls.iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), *url))
        };
        // Seconds apart, so only the index (not the recent-dispatch map) matches.
        let mut route = |i: u32, in_flight: [u32; 3]| {
            let now_ms = u64::from(i) * 10_000;
            let prepared = prepare(
                &mut router,
                Endpoint::Completions,
                prompt(i).as_bytes(),
                now_ms,
            );
            let status_of = |id: WorkerId| WorkerStatus {
                eligible: true,
                in_flight: in_flight[id.index()],
                ..WorkerStatus::default()
            };
            let worker = router.choose(&prepared, workers(), status_of).unwrap();
            let record = router.record(&prepared, worker, now_ms).unwrap();
            let KeyData::Text(text) = &record.key else {
                panic!("a text prompt records text")
            };
            writer
                .insert_text_hinted(record.namespace, text, worker, now_ms, &record.hint)
                .unwrap();
            (worker, prepared)
        };
        let (first, _) = route(0, [0; 3]);
        let (same, _) = route(1, [0; 3]);
        assert_eq!(same, first, "an idle holder keeps its prefix");
        let mut busy = [0; 3];
        busy[first.index()] = 40;
        let (replica, _) = route(2, busy);
        assert_ne!(replica, first);
        assert_eq!(metrics.branch_count(Branch::Replicate), 1);
        let (_, prepared) = route(3, [0; 3]);
        let Some(Lookup::Tree { matched, .. }) = &prepared.lookup else {
            panic!("tree mode looks the prompt up")
        };
        let mut holders = matched.tenants().to_vec();
        holders.sort();
        let mut expected = vec![first, replica];
        expected.sort();
        assert_eq!(holders, expected);
    }
}

mod table_tests {
    //! Selection over the published worker table (`Router::select`): what a data core reads.
    use super::*;
    use crate::workers::load::LoadReport;
    use crate::workers::spec::WorkerSpec;
    use crate::workers::table::Health;

    fn router(kind: PolicyKind, seed: u64) -> Router {
        let args = PolicyArgs {
            policy: kind,
            ..PolicyArgs::default()
        };
        let config = args.validate().unwrap();
        Router::new(config, seed, None, Arc::new(PolicyMetrics::default()))
    }

    fn table(cores: usize, n: usize, base_port: usize) -> WorkerTable {
        let specs: Vec<_> = (0..n)
            .map(|i| WorkerSpec::resolve(&format!("http://127.0.0.1:{}", base_port + i)).unwrap())
            .collect();
        WorkerTable::new(cores, &specs)
    }

    /// Prepares a `/generate` request with `body` and selects a worker not in `tried`.
    fn pick(
        router: &mut Router,
        table: &WorkerTable,
        tried: &TriedWorkers,
        body: &[u8],
    ) -> (Option<WorkerId>, Prepared) {
        let prepared = super::prepare(router, Endpoint::Generate, body, 0);
        let roster = table.roster();
        let view = WorkerView {
            roster: &roster,
            table,
            models: ModelWorkers::Any,
        };
        (router.select(&prepared, view, tried), prepared)
    }

    #[test]
    fn round_robin_cycles_and_skips_unhealthy() {
        let table = table(1, 3, 41000);
        let mut router = router(PolicyKind::RoundRobin, 0);
        let none = TriedWorkers::default();
        let mut picks = || pick(&mut router, &table, &none, b"{}").0.unwrap().0;
        let first: Vec<u16> = (0..6).map(|_| picks()).collect();
        assert_eq!(first, [0, 1, 2, 0, 1, 2]);
        table.set_health(WorkerId(1), Health::Unhealthy);
        let picks: Vec<u16> = (0..4)
            .map(|_| pick(&mut router, &table, &none, b"{}").0.unwrap().0)
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn tried_workers_are_excluded_until_none_is_left() {
        let table = table(1, 2, 41100);
        let mut router = router(PolicyKind::Random, 7);
        let mut tried = TriedWorkers::default();
        let first = pick(&mut router, &table, &tried, b"{}").0.unwrap();
        tried.insert(first);
        let second = pick(&mut router, &table, &tried, b"{}").0.unwrap();
        assert_ne!(first, second);
        tried.insert(second);
        assert_eq!(pick(&mut router, &table, &tried, b"{}").0, None);
        let empty = WorkerTable::new(1, &[]);
        let none = TriedWorkers::default();
        assert_eq!(pick(&mut router, &empty, &none, b"{}").0, None);
    }

    #[test]
    fn the_requested_model_restricts_the_workers() {
        let table = table(1, 3, 41200);
        let mut router = router(PolicyKind::Random, 3);
        let prepared = super::prepare(&mut router, Endpoint::Generate, b"{}", 0);
        let roster = table.roster();
        let serving = [WorkerId(2)];
        let view = WorkerView {
            roster: &roster,
            table: &table,
            models: ModelWorkers::Only {
                serving: &serving,
                wildcard: &[],
            },
        };
        for _ in 0..20 {
            let tried = TriedWorkers::default();
            assert_eq!(router.select(&prepared, view, &tried), Some(WorkerId(2)));
        }
    }

    #[test]
    fn a_dispatch_on_one_core_is_credited_to_the_decisions_of_the_others() {
        let table = table(2, 2, 42000);
        for id in [WorkerId(0), WorkerId(1)] {
            let report = LoadReport {
                gen_throughput_tps: Some(1000.0),
                ..LoadReport::default()
            };
            table
                .signals(id)
                .set_load(Some(report), &Default::default());
        }
        let ids: Vec<String> = (0..4096).map(|i| i.to_string()).collect();
        let body = format!(r#"{{"input_ids":[{}]}}"#, ids.join(","));
        let none = TriedWorkers::default();
        for seed in 0..16 {
            let (mut core0, mut core1) = (
                router(PolicyKind::LeastLoad, seed),
                router(PolicyKind::LeastLoad, seed + 100),
            );
            let (first, prepared) = pick(&mut core0, &table, &none, body.as_bytes());
            let first = first.unwrap();
            assert_eq!(prepared.request_tokens(), 4096);
            let in_flight = table.credit(0, first, prepared.request_tokens());
            // Core 1 never sent anything, yet sees core 0's 4,096 tokens in flight.
            let second = pick(&mut core1, &table, &none, body.as_bytes()).0.unwrap();
            assert_ne!(first, second, "seed {seed}");
            drop(in_flight);
        }
    }
}

mod hash_tests {
    //! `--cache-index hash` through the router: heads looked up deepest first, holders through
    //! the spill gate, records applied by the placement map's writer.
    use super::*;
    use crate::index::hash::HashIndexWriter;
    use crate::policy::Heads;

    const URLS: [&str; 4] = ["http://a", "http://b", "http://c", "http://d"];

    fn hash_router(writer: &HashIndexWriter) -> (Router, Arc<PolicyMetrics>) {
        let args = PolicyArgs {
            cache_index: CacheIndexKind::Hash,
            cache_boundaries: vec![64, 128, 256],
            ..PolicyArgs::default()
        };
        let metrics = Arc::new(PolicyMetrics::default());
        let index: Box<dyn IndexLookup> = Box::new(Heads::new(writer.reader()));
        let config = args.validate().expect("a valid hash mode");
        (
            Router::new(config, 11, Some(index), metrics.clone()),
            metrics,
        )
    }

    fn ids_body(tokens: usize, salt: &str) -> String {
        let ids: Vec<u32> = (0..tokens as u32).map(|i| i * 3 + 1).collect();
        serde_json::json!({"input_ids": ids, "extra_key": salt}).to_string()
    }

    /// Prepares `body` at `now_ms` and chooses among workers with the given in-flight counts
    /// (`u32::MAX`: not eligible).
    fn route(
        router: &mut Router,
        body: &str,
        in_flight: [u32; 4],
        now_ms: u64,
    ) -> (WorkerId, Prepared) {
        let prepared = super::prepare(router, Endpoint::Generate, body.as_bytes(), now_ms);
        let workers = URLS
            .iter()
            .enumerate()
            .map(|(i, url)| (WorkerId(i as u16), *url));
        let status_of = |id: WorkerId| WorkerStatus {
            eligible: in_flight[id.index()] != u32::MAX,
            in_flight: in_flight[id.index()].min(1_000),
            ..WorkerStatus::default()
        };
        let worker = router
            .choose(&prepared, workers, status_of)
            .expect("a worker");
        (worker, prepared)
    }

    /// Applies the record of a dispatch of `prepared` to `worker`, as the control core does.
    fn record(
        router: &mut Router,
        writer: &mut HashIndexWriter,
        prepared: &Prepared,
        worker: WorkerId,
        tick: u64,
    ) {
        let record = router.record(prepared, worker, tick).expect("a record");
        let KeyData::Heads(heads) = &record.key else {
            panic!("hash mode records heads, got {:?}", record.key);
        };
        writer
            .record(record.namespace.model, heads, worker, tick)
            .expect("recorded");
    }

    #[test]
    fn a_short_first_turn_and_its_longer_follow_up_land_on_the_same_worker() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, metrics) = hash_router(&writer);
        let idle = [0; 4];
        let (first, prepared) = route(&mut router, &ids_body(100, ""), idle, 0);
        record(&mut router, &mut writer, &prepared, first, 0);
        // A second later (the recent map has expired): only the index can match. The follow-up
        // shares the first turn's 64-token head, and reaches two deeper boundaries.
        let (second, prepared) = route(&mut router, &ids_body(300, ""), idle, 1_000);
        assert_eq!(second, first);
        record(&mut router, &mut writer, &prepared, second, 1_000);
        let found = writer.reader().lookup(&prepared.heads, 1_000);
        assert!(
            found.hits().iter().all(|hit| hit.holders() == [first]),
            "every head recorded"
        );
        assert_eq!(
            metrics.branch_count(Branch::TreeMatch),
            0,
            "hash decisions are not counted"
        );
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 0);
    }

    #[test]
    fn the_deepest_head_with_an_eligible_holder_wins_and_its_holders_pass_the_spill_gate() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (_, shallow) = route(&mut router, &ids_body(100, ""), [0; 4], 0);
        record(&mut router, &mut writer, &shallow, WorkerId(1), 0);
        let (_, deep) = route(&mut router, &ids_body(300, ""), [0; 4], 0);
        record(&mut router, &mut writer, &deep, WorkerId(2), 0);
        let later = 1_000;
        // The 256-token head is held by worker 2 only; the 64-token head by 1 and 2.
        assert_eq!(
            route(&mut router, &ids_body(300, ""), [0; 4], later).0,
            WorkerId(2)
        );
        // Worker 2 not eligible: no deeper head has an eligible holder, the 64-token one has 1.
        let not_two = [0, 0, u32::MAX, 0];
        assert_eq!(
            route(&mut router, &ids_body(300, ""), not_two, later).0,
            WorkerId(1)
        );
        // Worker 2 hot (over both margins of the fleet mean): a spill to the least loaded.
        let hot = [10, 10, 400, 0];
        assert_eq!(
            route(&mut router, &ids_body(300, ""), hot, later).0,
            WorkerId(3)
        );
    }

    #[test]
    fn short_and_untokenized_requests_are_neither_matched_nor_recorded() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (worker, short) = route(&mut router, &ids_body(63, ""), [0; 4], 0);
        assert_eq!(short.lookup, Some(Lookup::Short));
        assert_eq!(router.record(&short, worker, 0), None);
        let text = serde_json::json!({"text": "a long prompt ".repeat(50)}).to_string();
        let (worker, untokenized) = route(&mut router, &text, [0; 4], 0);
        assert!(matches!(untokenized.lookup, Some(Lookup::Heads(h)) if h.len == 0));
        assert_eq!(router.record(&untokenized, worker, 0), None);
        assert_eq!(writer.live_heads(), 0);
        // A recorded head does not make a short request match.
        let (first, long) = route(&mut router, &ids_body(64, ""), [0; 4], 0);
        record(&mut router, &mut writer, &long, first, 0);
        assert_eq!(
            route(&mut router, &ids_body(63, ""), [0; 4], 0).1.lookup,
            Some(Lookup::Short)
        );
    }

    #[test]
    fn partitions_never_match_across_namespaces() {
        let mut writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let (first, prepared) = route(&mut router, &ids_body(128, "tenant-a"), [0; 4], 0);
        record(&mut router, &mut writer, &prepared, first, 0);
        let (_, same) = route(&mut router, &ids_body(128, "tenant-a"), [0; 4], 1_000);
        let (_, other) = route(&mut router, &ids_body(128, "tenant-b"), [0; 4], 1_000);
        let has_holder =
            |p: &Prepared| matches!(p.lookup, Some(Lookup::Heads(h)) if h.has_holder());
        assert!(has_holder(&same));
        assert!(
            !has_holder(&other),
            "another extra_key is another namespace"
        );
    }

    #[test]
    fn a_burst_of_a_new_head_follows_the_first_dispatch_before_the_index_learns_it() {
        let writer = HashIndexWriter::new(1024, 180_000);
        let (mut router, _) = hash_router(&writer);
        let mut in_flight = [0u32; 4];
        let mut chosen = Vec::new();
        for _ in 0..6 {
            let (worker, prepared) = route(&mut router, &ids_body(200, ""), in_flight, 10);
            router.record(&prepared, worker, 10).expect("a record");
            in_flight[worker.index()] += 1;
            chosen.push(worker);
        }
        assert!(chosen.iter().all(|w| *w == chosen[0]), "{chosen:?}");
    }
}

/// A router in front of a KV-event index with the in-flight overlay on, whose workers 0 and 1
/// publish (model "m", block size 4), and the index's writer.
fn router_with_overlay() -> (Router, Arc<PolicyMetrics>, crate::index::kv::KvIndexWriter) {
    use crate::index::kv::{KvIndexWriter, PublishingModels};
    let config = PolicyArgs::default().validate().unwrap();
    let ttl = config.kv_inflight_ttl.expect("on by default");
    let mut writer = KvIndexWriter::new(1024).with_inflight_overlay(ttl);
    let metrics = Arc::new(PolicyMetrics::default());
    let blocks = crate::policy::Blocks::new(writer.reader());
    let router = Router::new(config, 5, None, metrics.clone()).with_events(blocks);
    for w in [0, 1] {
        writer.attach(WorkerId(w)).unwrap();
    }
    writer.publish_models(PublishingModels {
        models: vec![(model_hash("m"), 4)],
        any_model: None,
    });
    (router, metrics, writer)
}

#[test]
fn a_follow_up_before_its_engine_reports_routes_on_the_overlay_and_counts_as_provisional() {
    use crate::index::kv::{FlightEnd, FlightId, Provenance};
    let (mut router, metrics, mut writer) = router_with_overlay();
    let urls = ["http://w0", "http://w1"];
    let turn = |ids: std::ops::Range<u32>| {
        let ids: Vec<u32> = ids.collect();
        serde_json::json!({"model": "m", "input_ids": ids}).to_string()
    };
    // The first turn: nobody holds it; the worker chosen gets its 4 blocks in flight (no
    // record is made here, so this core's recent dispatches know nothing of it).
    let (first, prepared) =
        prepare_and_route_idle(&mut router, &urls, (Endpoint::Generate, &turn(0..16)), 10);
    assert_eq!(metrics.kv_predictions(), (0, 0), "a miss predicts nothing");
    let keys = router.flight_keys(&prepared, first).expect("its keys");
    assert_eq!(keys.len(), 4);
    writer.dispatched(FlightId(1), first, &keys, 10);
    // Follow-ups (the first turn and more) before the engine reported a block find the first
    // turn's worker every time, provisionally.
    for n in 1..=8 {
        let (worker, prepared) =
            prepare_and_route_idle(&mut router, &urls, (Endpoint::Generate, &turn(0..24)), 20);
        assert_eq!(
            worker, first,
            "the follow-up goes where its prefix is in flight"
        );
        let Some(Lookup::Blocks(blocks)) = &prepared.lookup else {
            panic!("a KV-event lookup");
        };
        assert_eq!(blocks.held_by(first), (4, Provenance::InFlight));
        // Its leading blocks were only in flight: all 6 keys go, the control core passes over
        // those the engine holds.
        let keys = router.flight_keys(&prepared, first);
        assert_eq!(keys.map(|k| k.len()), Some(6));
        assert_eq!(metrics.kv_predictions(), (0, n));
    }
    // The engine reports the first turn's blocks: the claims are gone, the prediction is
    // confirmed, and only the follow-up's 2 new blocks would be claimed.
    let hashes: Vec<u64> = (100..104).collect();
    writer
        .store(first, &hashes, None, &(0..16).collect::<Vec<u32>>(), 4)
        .unwrap();
    assert_eq!(writer.inflight(), (1, 0));
    let (worker, prepared) =
        prepare_and_route_idle(&mut router, &urls, (Endpoint::Generate, &turn(0..24)), 30);
    assert_eq!(worker, first);
    assert_eq!(
        router.flight_keys(&prepared, first).map(|k| k.len()),
        Some(2)
    );
    assert_eq!(metrics.kv_predictions(), (1, 8));
    writer.flight_ended(FlightId(1), FlightEnd::Answered, 30);
}

#[test]
fn without_the_overlay_no_flight_is_sent() {
    let args = PolicyArgs {
        kv_inflight_ttl_secs: 0,
        ..PolicyArgs::default()
    };
    let config = args.validate().unwrap();
    assert_eq!(config.kv_inflight_ttl, None);
    let writer = crate::index::kv::KvIndexWriter::new(64);
    let blocks = crate::policy::Blocks::new(writer.reader());
    let mut router =
        Router::new(config, 5, None, Arc::new(PolicyMetrics::default())).with_events(blocks);
    let body = r#"{"model":"m","input_ids":[1,2,3,4,5,6,7,8]}"#;
    let (worker, prepared) =
        prepare_and_route_idle(&mut router, &["http://w0"], (Endpoint::Generate, body), 10);
    assert_eq!(router.flight_keys(&prepared, worker), None);
}
