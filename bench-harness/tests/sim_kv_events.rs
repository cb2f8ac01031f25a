//! `sim-engine`'s KV events, observed as a gateway sees them: a ZMQ SUB socket on an engine's
//! PUB port and a DEALER on its replay port, batches decoded with `rmpv` in both wire formats,
//! checked against the requests' tokens and the engine's true cache (`GET /sim/cache`).

#[path = "../../tests/utils/mod.rs"]
mod utils;

use std::collections::BTreeSet;
use std::time::Duration;

use bench_harness::sim::cache::page_keys;
use bytes::Bytes;
use rmpv::Value;
use serde_json::json;
use tokio::runtime::Runtime;
use utils::process::{free_port_block, SimFleet};
use utils::TIMEOUT;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const PAGE_SIZE: usize = 16;

/// One event, whichever format carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Stored {
        keys: Vec<u64>,
        parent_key: Option<u64>,
        tokens: Vec<u32>,
        block_size: u64,
    },
    Removed {
        keys: Vec<u64>,
    },
    Cleared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Vllm,
    Sglang,
}

/// A fleet publishing KV events, with the ports it publishes on.
struct EventFleet {
    fleet: SimFleet,
    kv_base_port: u16,
    format: Format,
    runtime: Runtime,
}

impl EventFleet {
    fn start(engines: u16, format: Format, args: &[&str]) -> Self {
        let kv_base_port = free_port_block(2 * engines);
        let kv_base = kv_base_port.to_string();
        let format_name = match format {
            Format::Vllm => "vllm",
            Format::Sglang => "sglang",
        };
        let mut all = vec![
            "--speedup",
            "50",
            "--kv-events-base-port",
            &kv_base,
            "--kv-events-format",
            format_name,
        ];
        all.extend_from_slice(args);
        let fleet = SimFleet::start(engines, &all);
        // The ZMQ sockets' tasks run on this runtime's worker while a test blocks on HTTP.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        EventFleet {
            fleet,
            kv_base_port,
            format,
            runtime,
        }
    }

    fn publish_port(&self, engine: u16) -> u16 {
        self.kv_base_port + engine
    }

    fn replay_port(&self, engine: u16) -> u16 {
        self.kv_base_port + self.fleet.engines + engine
    }

    /// A SUB socket on engine `engine`'s PUB port, subscribed to everything, and known to be
    /// receiving: flushes (each one batch) until one arrives. Returns the batches seen.
    fn subscribe(&self, engine: u16) -> (Subscriber<'_>, Vec<(u64, Value)>) {
        let endpoint = format!("tcp://127.0.0.1:{}", self.publish_port(engine));
        let socket = self.runtime.block_on(async {
            let mut socket = SubSocket::new();
            socket.connect(&endpoint).await.expect("connect SUB");
            socket.subscribe("").await.expect("subscribe");
            socket
        });
        let mut subscriber = Subscriber {
            fleet: self,
            socket,
        };
        // A subscription reaches the publisher a moment after the connection: until it does,
        // batches are not sent to this subscriber (ZMQ's slow joiner).
        for _ in 0..100 {
            self.flush(engine);
            if let Some(batch) = subscriber.next_within(Duration::from_millis(100)) {
                return (subscriber, vec![batch]);
            }
        }
        panic!("no KV event reached a subscriber of engine {engine}");
    }

    /// Every kept batch of engine `engine` from `start_seq` on, through its replay socket, and
    /// the end marker's seq and payload.
    fn replay(&self, engine: u16, start_seq: u64) -> (Vec<(u64, Value)>, (i64, Bytes)) {
        let endpoint = format!("tcp://127.0.0.1:{}", self.replay_port(engine));
        self.runtime.block_on(async {
            let mut dealer = DealerSocket::new();
            dealer.connect(&endpoint).await.expect("connect DEALER");
            let request = ZmqMessage::try_from(vec![
                Bytes::new(),
                Bytes::copy_from_slice(&start_seq.to_be_bytes()),
            ])
            .expect("two frames");
            dealer.send(request).await.expect("send a replay request");
            let mut batches = Vec::new();
            loop {
                let reply = tokio::time::timeout(TIMEOUT, dealer.recv())
                    .await
                    .expect("a replay reply in time")
                    .expect("a replay reply");
                let frames = reply.into_vec();
                assert_eq!(frames.len(), 3, "[\"\", seq, payload]");
                assert!(frames[0].is_empty(), "the empty delimiter");
                let seq = i64::from_be_bytes(frames[1].as_ref().try_into().expect("8-byte seq"));
                if seq == -1 {
                    return (batches, (seq, frames[2].clone()));
                }
                batches.push((seq as u64, decode(&frames[2])));
            }
        })
    }

    fn flush(&self, engine: u16) {
        let response = self.fleet.client(engine).post_json("/flush_cache", "");
        assert_eq!(response.status, 200, "{}", response.text());
    }

    /// `/generate` of `tokens` on `engine`, `max_new_tokens` 1 (no output page is cached).
    fn generate(&self, engine: u16, tokens: &[u32]) {
        let body = json!({"input_ids": tokens, "sampling_params": {"max_new_tokens": 1}});
        let response = self
            .fleet
            .client(engine)
            .post_json("/generate", &body.to_string());
        assert_eq!(response.status, 200, "{}", response.text());
    }

    /// `GET /sim/cache`: the engine's cached pages' keys.
    fn cache(&self, engine: u16) -> BTreeSet<u64> {
        let cache = self.fleet.client(engine).get("/sim/cache").json();
        assert_eq!(cache["page_size"], PAGE_SIZE);
        cache["blocks"]
            .as_array()
            .expect("blocks")
            .iter()
            .map(|key| key.as_u64().expect("u64 key"))
            .collect()
    }

    /// The events of a decoded batch in this fleet's format.
    fn events(&self, batch: &Value) -> Vec<Event> {
        match self.format {
            Format::Vllm => vllm_events(batch),
            Format::Sglang => sglang_events(batch),
        }
    }
}

struct Subscriber<'a> {
    fleet: &'a EventFleet,
    socket: SubSocket,
}

impl Subscriber<'_> {
    /// The next published batch, `[topic, seq, payload]` checked and decoded, if one arrives
    /// within `timeout`.
    fn next_within(&mut self, timeout: Duration) -> Option<(u64, Value)> {
        let socket = &mut self.socket;
        let message = self
            .fleet
            .runtime
            .block_on(async { tokio::time::timeout(timeout, socket.recv()).await })
            .ok()?
            .expect("a published message");
        let frames = message.into_vec();
        assert_eq!(frames.len(), 3, "[topic, seq, payload]");
        assert!(frames[0].is_empty(), "the topic is empty");
        let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("8-byte seq"));
        Some((seq, decode(&frames[2])))
    }

    /// Whether nothing arrives within `timeout` (an error, such as a dropped connection, counts
    /// as nothing).
    fn silent_for(&mut self, timeout: Duration) -> bool {
        let socket = &mut self.socket;
        let received = self
            .fleet
            .runtime
            .block_on(async { tokio::time::timeout(timeout, socket.recv()).await });
        !matches!(received, Ok(Ok(_)))
    }

    /// Batches until `done` holds for the events seen so far (panics after [`TIMEOUT`]).
    fn until(&mut self, mut done: impl FnMut(&[Event]) -> bool) -> Vec<(u64, Value)> {
        let deadline = std::time::Instant::now() + TIMEOUT;
        let mut batches = Vec::new();
        let mut events = Vec::new();
        while !done(&events) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let batch = self
                .next_within(left)
                .unwrap_or_else(|| panic!("timed out; events so far: {events:?}"));
            events.extend(self.fleet.events(&batch.1));
            batches.push(batch);
        }
        batches
    }
}

fn decode(payload: &[u8]) -> Value {
    let mut reader = payload;
    let value = rmpv::decode::read_value(&mut reader).expect("a msgpack batch");
    assert!(reader.is_empty(), "one value per payload");
    value
}

fn array(value: &Value) -> &[Value] {
    value
        .as_array()
        .unwrap_or_else(|| panic!("an array: {value}"))
}

fn uint(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("an unsigned int: {value}"))
}

fn tokens(value: &Value) -> Vec<u32> {
    array(value)
        .iter()
        .map(|token| u32::try_from(uint(token)).expect("a u32 token"))
        .collect()
}

/// A vLLM hash: bytes, here 8 big-endian.
fn vllm_hash(value: &Value) -> u64 {
    let bytes = value.as_slice().unwrap_or_else(|| panic!("bytes: {value}"));
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

/// An SGLang hash: a signed 64-bit int, the key's bits.
fn sglang_hash(value: &Value) -> u64 {
    value.as_i64().unwrap_or_else(|| panic!("an i64: {value}")) as u64
}

/// The fields of a msgpack map, in order, with their values.
fn fields(value: &Value) -> Vec<(&str, &Value)> {
    value
        .as_map()
        .unwrap_or_else(|| panic!("a map: {value}"))
        .iter()
        .map(|(key, value)| (key.as_str().expect("a string key"), value))
        .collect()
}

fn vllm_events(batch: &Value) -> Vec<Event> {
    let batch = fields(batch);
    let names: Vec<&str> = batch.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["ts", "events", "data_parallel_rank"]);
    assert!(batch[0].1.is_f64(), "ts is a float64");
    assert_eq!(uint(batch[2].1), 0);
    array(batch[1].1)
        .iter()
        .map(|event| {
            let event = fields(event);
            let field = |name: &str| {
                event
                    .iter()
                    .find(|(field, _)| *field == name)
                    .map(|(_, value)| *value)
                    .unwrap_or_else(|| panic!("no {name} in {event:?}"))
            };
            let hashes = |name: &str| array(field(name)).iter().map(vllm_hash).collect();
            assert_eq!(event[0].0, "type", "the tag comes first");
            match event[0].1.as_str() {
                Some("BlockStored") => {
                    assert_eq!(field("medium").as_str(), Some("GPU"));
                    assert!(field("lora_id").is_nil() && field("lora_name").is_nil());
                    let parent = field("parent_block_hash");
                    Event::Stored {
                        keys: hashes("block_hashes"),
                        parent_key: (!parent.is_nil()).then(|| vllm_hash(parent)),
                        tokens: tokens(field("token_ids")),
                        block_size: uint(field("block_size")),
                    }
                }
                Some("BlockRemoved") => Event::Removed {
                    keys: hashes("block_hashes"),
                },
                Some("AllBlocksCleared") => Event::Cleared,
                other => panic!("unknown event type {other:?}"),
            }
        })
        .collect()
}

fn sglang_events(batch: &Value) -> Vec<Event> {
    let batch = array(batch);
    assert_eq!(batch.len(), 2, "[ts, events]");
    assert!(batch[0].is_f64(), "ts is a float64");
    array(&batch[1])
        .iter()
        .map(|event| {
            let event = array(event);
            let hashes = |value: &Value| array(value).iter().map(sglang_hash).collect();
            match event[0].as_str() {
                Some("BlockStored") => {
                    assert_eq!(event.len(), 6, "{event:?}");
                    assert!(event[5].is_nil(), "lora_id");
                    Event::Stored {
                        keys: hashes(&event[1]),
                        parent_key: (!event[2].is_nil()).then(|| sglang_hash(&event[2])),
                        tokens: tokens(&event[3]),
                        block_size: uint(&event[4]),
                    }
                }
                Some("BlockRemoved") => {
                    assert_eq!(event.len(), 2, "{event:?}");
                    Event::Removed {
                        keys: hashes(&event[1]),
                    }
                }
                Some("AllBlocksCleared") => {
                    assert_eq!(event.len(), 1, "{event:?}");
                    Event::Cleared
                }
                other => panic!("unknown event type {other:?}"),
            }
        })
        .collect()
}

/// The cache a subscriber rebuilds from events.
fn apply(model: &mut BTreeSet<u64>, events: &[Event]) {
    for event in events {
        match event {
            Event::Stored { keys, .. } => model.extend(keys),
            Event::Removed { keys } => {
                for key in keys {
                    assert!(model.remove(key), "removed {key:x}, never stored");
                }
            }
            Event::Cleared => model.clear(),
        }
    }
}

fn has_stored(events: &[Event]) -> bool {
    events.iter().any(|e| matches!(e, Event::Stored { .. }))
}

fn prompt(first: u32, len: u32) -> Vec<u32> {
    (first..first + len).collect()
}

/// One request's single stored event, exactly as documented, in one format; on engine 1 of 2,
/// so the port layout is exercised too.
fn a_request_is_stored_as_documented(format: Format) {
    let fleet = EventFleet::start(2, format, &[]);
    let (mut subscriber, _) = fleet.subscribe(1);
    let tokens = prompt(100, 40);
    fleet.generate(1, &tokens);
    let batches = subscriber.until(has_stored);
    let (_, batch) = batches.last().expect("a batch");
    let keys = page_keys(0, &tokens, PAGE_SIZE);
    assert_eq!(keys.len(), 2);
    assert_eq!(
        fleet.events(batch),
        vec![Event::Stored {
            keys: keys.clone(),
            parent_key: None,
            tokens: tokens[..32].to_vec(),
            block_size: PAGE_SIZE as u64,
        }],
        "two whole pages of 40 tokens; the 8-token tail and the output fill none"
    );
    assert_eq!(fleet.cache(1), keys.iter().copied().collect());
    assert!(fleet.cache(0).is_empty(), "engine 0 saw nothing");
    // The same prompt extended by a page: only the new page, its parent the prompt's last.
    let longer = prompt(100, 48);
    fleet.generate(1, &longer);
    let batches = subscriber.until(has_stored);
    let longer_keys = page_keys(0, &longer, PAGE_SIZE);
    assert_eq!(
        fleet.events(&batches.last().expect("a batch").1),
        vec![Event::Stored {
            keys: longer_keys[2..].to_vec(),
            parent_key: Some(keys[1]),
            tokens: longer[32..48].to_vec(),
            block_size: PAGE_SIZE as u64,
        }]
    );
}

#[test]
fn vllm_batches_decode_to_the_documented_maps() {
    a_request_is_stored_as_documented(Format::Vllm);
}

#[test]
fn sglang_batches_decode_to_the_documented_arrays() {
    a_request_is_stored_as_documented(Format::Sglang);
}

#[test]
fn events_track_the_cache_through_eviction_and_flush() {
    // Four pages: a second two-page prompt evicts one page of the first.
    let fleet = EventFleet::start(1, Format::Vllm, &["--kv-capacity-tokens", "64"]);
    let (mut subscriber, seen) = fleet.subscribe(0);
    let mut model = BTreeSet::new();
    for (_, batch) in &seen {
        apply(&mut model, &fleet.events(batch));
    }
    let first = prompt(0, 32);
    fleet.generate(0, &first);
    for (_, batch) in subscriber.until(has_stored) {
        apply(&mut model, &fleet.events(&batch));
    }
    assert_eq!(model, fleet.cache(0));
    fleet.generate(0, &prompt(1000, 32));
    let batches = subscriber.until(has_stored);
    let events: Vec<Event> = batches
        .iter()
        .flat_map(|(_, batch)| fleet.events(batch))
        .collect();
    let first_keys = page_keys(0, &first, PAGE_SIZE);
    assert_eq!(
        events[0],
        Event::Removed {
            keys: vec![first_keys[1]]
        },
        "the first prompt's leaf page makes room"
    );
    apply(&mut model, &events);
    assert_eq!(model, fleet.cache(0));
    assert_eq!(model.len(), 3);
    fleet.flush(0);
    let batches = subscriber.until(|events| events.contains(&Event::Cleared));
    assert_eq!(fleet.events(&batches[0].1), vec![Event::Cleared]);
    assert!(fleet.cache(0).is_empty());
    let stats = fleet.fleet.stats(0);
    assert_eq!(stats["kv_events"]["live_dropped_total"], 0);
}

#[test]
fn seqs_are_consecutive_and_replay_returns_every_kept_batch() {
    let fleet = EventFleet::start(1, Format::Sglang, &[]);
    let (mut subscriber, mut live) = fleet.subscribe(0);
    for n in 0..5 {
        fleet.generate(0, &prompt(n * 1000, 40));
        live.extend(subscriber.until(has_stored));
    }
    let seqs: Vec<u64> = live.iter().map(|(seq, _)| *seq).collect();
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..first + seqs.len() as u64).collect::<Vec<_>>(),
        "live seqs have no gap"
    );
    let (replayed, (end_seq, end_payload)) = fleet.replay(0, 0);
    assert_eq!((end_seq, end_payload.len()), (-1, 0), "the end marker");
    let replayed_seqs: Vec<u64> = replayed.iter().map(|(seq, _)| *seq).collect();
    let last = *seqs.last().expect("seqs");
    assert_eq!(
        replayed_seqs,
        (0..=last).collect::<Vec<_>>(),
        "every batch from seq 0"
    );
    for (seq, batch) in &live {
        assert_eq!(&replayed[*seq as usize].1, batch, "replay = what was sent");
    }
    let (tail, _) = fleet.replay(0, last);
    assert_eq!(tail.len(), 1, "a replay starts at the asked seq");
    let (none, (end_seq, _)) = fleet.replay(0, last + 1);
    assert!(none.is_empty());
    assert_eq!(end_seq, -1);
    let stats = fleet.fleet.stats(0)["kv_events"].clone();
    assert_eq!(stats["batches_total"], last + 1);
    assert_eq!(stats["next_seq"], last + 1);
}

#[test]
fn the_replay_buffer_keeps_the_last_batches() {
    let fleet = EventFleet::start(1, Format::Vllm, &["--kv-events-replay-buffer", "3"]);
    for n in 0..6 {
        fleet.generate(0, &prompt(n * 1000, 32));
    }
    let stored = |fleet: &EventFleet| fleet.fleet.stats(0)["kv_events"]["batches_total"].clone();
    assert!(utils::wait_until(TIMEOUT, || stored(&fleet) == 6));
    let (replayed, _) = fleet.replay(0, 0);
    let seqs: Vec<u64> = replayed.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, [3, 4, 5]);
}

#[test]
fn a_restarted_engine_publishes_from_seq_zero_on_new_sockets() {
    let fleet = EventFleet::start(1, Format::Vllm, &[]);
    let (mut subscriber, _) = fleet.subscribe(0);
    for n in 0..6 {
        fleet.generate(0, &prompt(n * 1000, 40));
        subscriber.until(has_stored);
    }
    let before = fleet.fleet.stats(0)["kv_events"]["next_seq"]
        .as_u64()
        .expect("next_seq");
    assert!(before >= 7);
    let response = fleet.fleet.client(0).post_json("/sim/restart", "");
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(fleet.cache(0).is_empty(), "the cache is gone");
    assert!(
        subscriber.silent_for(Duration::from_millis(300)),
        "a crash announces nothing"
    );
    drop(subscriber);
    // The sockets come back after 200 ms; a new subscriber connects (retrying until then).
    let (mut subscriber, _) = fleet.subscribe(0);
    let tokens = prompt(0, 40);
    fleet.generate(0, &tokens);
    let batches = subscriber.until(has_stored);
    let (seq, batch) = batches.last().expect("a batch");
    assert_eq!(
        fleet.events(batch),
        vec![Event::Stored {
            keys: page_keys(0, &tokens, PAGE_SIZE),
            parent_key: None,
            tokens: tokens[..32].to_vec(),
            block_size: PAGE_SIZE as u64,
        }],
        "the prompt cached before the restart is computed and stored again"
    );
    let (replayed, _) = fleet.replay(0, 0);
    let replayed_seqs: Vec<u64> = replayed.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        replayed_seqs,
        (0..=*seq).collect::<Vec<_>>(),
        "seq restarted at 0"
    );
    let replayed_events: Vec<Event> = replayed
        .iter()
        .flat_map(|(_, batch)| fleet.events(batch))
        .collect();
    assert!(
        replayed_events[..replayed_events.len() - 1]
            .iter()
            .all(|event| *event == Event::Cleared),
        "only the new subscriber's probes before the new prompt: the buffer was emptied"
    );
    assert!(*seq < before, "seq {seq} restarted below {before}");
    assert_eq!(fleet.fleet.stats(0)["kv_events"]["restarts_total"], 1);
}

#[test]
fn server_info_names_the_endpoints_with_a_wildcard_host() {
    let fleet = EventFleet::start(2, Format::Sglang, &["--kv-events-replay-buffer", "77"]);
    let info = fleet.fleet.client(1).get("/server_info").json();
    assert_eq!(info["page_size"], PAGE_SIZE);
    assert_eq!(info["model_path"], "sim-model");
    let config = info["kv_events_config"]
        .as_str()
        .expect("kv_events_config is a JSON string, as SGLang keeps it");
    let config: serde_json::Value = serde_json::from_str(config).expect("JSON inside");
    assert_eq!(config["publisher"], "zmq");
    assert_eq!(
        config["endpoint"],
        format!("tcp://*:{}", fleet.publish_port(1))
    );
    assert_eq!(
        config["replay_endpoint"],
        format!("tcp://*:{}", fleet.replay_port(1))
    );
    assert_eq!(config["buffer_steps"], 77);
    assert_eq!(config["topic"], "");

    let quiet = SimFleet::start(1, &["--instant"]);
    let info = quiet.client(0).get("/server_info").json();
    assert!(info["kv_events_config"].is_null());
    assert_eq!(
        quiet.client(0).get("/sim/cache").json()["blocks"],
        json!([])
    );
}

#[test]
fn kv_event_ports_that_overlap_http_ports_are_refused() {
    let port = free_port_block(1);
    let output = std::process::Command::new(utils::process::workspace_bin("sim-engine"))
        .args(["--base-port", &port.to_string()])
        .args(["--kv-events-base-port", &port.to_string()])
        .output()
        .expect("run sim-engine");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("Error: --kv-events-base-port"),
        "{stderr}"
    );
}
