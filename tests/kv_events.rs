//! The KV-event index end to end: real `kvgate` processes subscribed to engine-style ZMQ
//! publishers (a test publisher here, speaking SGLang's array-like msgpack layout, with a replay
//! socket) in front of mock origins. Routing follows what the events say the engines hold;
//! a lost batch is replayed; a publisher without replay loses the worker's entries on a gap; a
//! restarted publisher drops them; a malformed batch is counted and skipped; the endpoint is
//! learned from `/server_info`; removing a worker purges it.

mod utils;

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{free_port, Gateway};
use utils::wait_until;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const WAIT: Duration = Duration::from_secs(15);
const BLOCK: usize = 16;

/// A msgpack event or batch, SGLang's layout (array-like tagged structs).
mod sglang {
    use rmp::encode::{write_array_len, write_f64, write_nil, write_sint, write_str, write_uint};

    pub fn stored(hashes: &[i64], parent: Option<i64>, tokens: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_len(&mut out, 6).unwrap();
        write_str(&mut out, "BlockStored").unwrap();
        write_array_len(&mut out, hashes.len() as u32).unwrap();
        for h in hashes {
            write_sint(&mut out, *h).unwrap();
        }
        match parent {
            Some(p) => write_sint(&mut out, p).map(|_| ()).unwrap(),
            None => write_nil(&mut out).unwrap(),
        }
        write_array_len(&mut out, tokens.len() as u32).unwrap();
        for t in tokens {
            write_uint(&mut out, u64::from(*t)).unwrap();
        }
        write_uint(&mut out, super::BLOCK as u64).unwrap();
        write_nil(&mut out).unwrap();
        out
    }

    pub fn removed(hashes: &[i64]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_len(&mut out, 2).unwrap();
        write_str(&mut out, "BlockRemoved").unwrap();
        write_array_len(&mut out, hashes.len() as u32).unwrap();
        for h in hashes {
            write_sint(&mut out, *h).unwrap();
        }
        out
    }

    pub fn batch(events: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        write_array_len(&mut out, 2).unwrap();
        write_f64(&mut out, 1.0).unwrap();
        write_array_len(&mut out, events.len() as u32).unwrap();
        for e in events {
            out.extend_from_slice(e);
        }
        out
    }
}

enum Command {
    /// Publish a batch (`live: false` keeps it for replay only, as if the PUB dropped it).
    Publish { payload: Vec<u8>, live: bool },
    /// Publish a batch live under number `seq`, out of the publisher's numbering (a glitch).
    PublishNumbered { seq: u64, payload: Vec<u8> },
    /// Close both sockets, bind them again, and start numbering from 0 with an empty buffer.
    Restart,
}

/// An engine's KV-event publisher: PUB plus a ROUTER replay socket, as vLLM and SGLang run it.
struct Publisher {
    port: u16,
    replay_port: u16,
    commands: mpsc::Sender<Command>,
}

impl Publisher {
    fn start() -> Publisher {
        let (port, replay_port) = (free_port(), free_port());
        let (commands, received) = mpsc::channel::<Command>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(serve(port, replay_port, received));
        });
        Publisher {
            port,
            replay_port,
            commands,
        }
    }

    /// `tcp://127.0.0.1:P+tcp://127.0.0.1:R` (`with_replay: false`: the publisher alone).
    fn endpoint(&self, with_replay: bool) -> String {
        match with_replay {
            true => format!(
                "tcp://127.0.0.1:{}+tcp://127.0.0.1:{}",
                self.port, self.replay_port
            ),
            false => format!("tcp://127.0.0.1:{}", self.port),
        }
    }

    fn publish(&self, events: &[Vec<u8>]) {
        let payload = sglang::batch(events);
        self.commands
            .send(Command::Publish {
                payload,
                live: true,
            })
            .unwrap();
    }

    fn publish_lost(&self, events: &[Vec<u8>]) {
        let payload = sglang::batch(events);
        let live = false;
        self.commands
            .send(Command::Publish { payload, live })
            .unwrap();
    }

    fn publish_raw(&self, payload: Vec<u8>) {
        let live = true;
        self.commands
            .send(Command::Publish { payload, live })
            .unwrap();
    }

    fn publish_numbered(&self, seq: u64, events: &[Vec<u8>]) {
        let payload = sglang::batch(events);
        let command = Command::PublishNumbered { seq, payload };
        self.commands.send(command).unwrap();
    }

    fn restart(&self) {
        self.commands.send(Command::Restart).unwrap();
    }
}

async fn serve(port: u16, replay_port: u16, commands: mpsc::Receiver<Command>) {
    loop {
        let mut publisher = PubSocket::new();
        publisher
            .bind(&format!("tcp://127.0.0.1:{port}"))
            .await
            .unwrap();
        let mut replay = RouterSocket::new();
        replay
            .bind(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .unwrap();
        let mut buffer: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
        let mut seq = 0u64;
        let restart = loop {
            // Replay requests: [identity, "", start].
            if let Ok(Ok(request)) =
                tokio::time::timeout(Duration::from_millis(5), replay.recv()).await
            {
                let frames = request.into_vec();
                if frames.len() == 3 {
                    let start = u64::from_be_bytes(frames[2][..].try_into().unwrap());
                    for (s, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
                        let reply = vec![
                            frames[0].clone(),
                            Bytes::new(),
                            Bytes::copy_from_slice(&s.to_be_bytes()),
                            Bytes::copy_from_slice(payload),
                        ];
                        // A requester that gave up is gone: like an engine, log nothing and go on.
                        if replay
                            .send(ZmqMessage::try_from(reply).unwrap())
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    let end = vec![
                        frames[0].clone(),
                        Bytes::new(),
                        Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
                        Bytes::new(),
                    ];
                    let _ = replay.send(ZmqMessage::try_from(end).unwrap()).await;
                }
            }
            match commands.try_recv() {
                Ok(Command::Publish { payload, live }) => {
                    if live {
                        let message = vec![
                            Bytes::new(),
                            Bytes::copy_from_slice(&seq.to_be_bytes()),
                            Bytes::copy_from_slice(&payload),
                        ];
                        // A subscriber that went away mid-send loses the batch, as on a PUB
                        // socket; the sequence numbers let the gateway notice.
                        let _ = publisher.send(ZmqMessage::try_from(message).unwrap()).await;
                    }
                    buffer.push_back((seq, payload));
                    seq += 1;
                }
                Ok(Command::PublishNumbered { seq, payload }) => {
                    let message = vec![
                        Bytes::new(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        Bytes::from(payload),
                    ];
                    let _ = publisher.send(ZmqMessage::try_from(message).unwrap()).await;
                }
                Ok(Command::Restart) => break true,
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => break false,
            }
        };
        drop(publisher);
        drop(replay);
        if !restart {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A worker answering everything with a small JSON body.
fn origin() -> MockOrigin {
    MockOrigin::start(|_| Reply::json(r#"{"text":"ok"}"#))
}

/// Token IDs of family `family`, `blocks` whole blocks long plus a partial one.
fn tokens(family: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK + 3) as u32)
        .map(|i| family * 100_000 + i)
        .collect()
}

fn generate(tokens: &[u32]) -> String {
    serde_json::json!({ "input_ids": tokens, "sampling_params": {"max_new_tokens": 1} }).to_string()
}

fn routed(gateway: &Gateway, tokens: &[u32]) -> String {
    let response = gateway.client().post_json("/generate", &generate(tokens));
    assert_eq!(response.status, 200, "{}", response.text());
    response.routed_worker().expect("routed worker").to_string()
}

fn series(name: &str, worker: &str, extra: &str) -> String {
    format!("{name}{{worker=\"{worker}\"{extra}}}")
}

fn held(gateway: &Gateway, worker: &str) -> f64 {
    gateway.metric(&series("kvgate_kv_index_worker_blocks", worker, ""))
}

fn wait_up(gateway: &Gateway, worker: &str) {
    let up = series("kvgate_kv_events_stream_up", worker, "");
    assert!(
        wait_until(WAIT, || gateway.metric(&up) == 1.0),
        "stream of {worker} never up:\n{}",
        gateway.metrics()
    );
}

fn wait_held(gateway: &Gateway, worker: &str, blocks: f64) {
    assert!(
        wait_until(WAIT, || held(gateway, worker) == blocks),
        "{worker} never held {blocks} blocks:\n{}",
        gateway.metrics()
    );
}

/// `hashes` for the first `n` blocks of `family`: the engine's own numbering (any will do).
fn hashes(family: u32, n: usize) -> Vec<i64> {
    (0..n as i64)
        .map(|i| -(i64::from(family) * 1000 + i + 1))
        .collect()
}

/// The event storing the first `n` blocks of `family`.
fn store_family(family: u32, n: usize) -> Vec<u8> {
    let tokens = tokens(family, n);
    sglang::stored(&hashes(family, n), None, &tokens[..n * BLOCK])
}

#[test]
fn routing_follows_what_the_engines_report_holding() {
    let (a, b) = (origin(), origin());
    let (pub_a, pub_b) = (Publisher::start(), Publisher::start());
    let endpoints = [pub_a.endpoint(true), pub_b.endpoint(true)];
    // The engines' events alone: these origins never report what they were sent, so the
    // in-flight overlay (its own test below) would count the dispatches' blocks too.
    let mut args = vec!["--kv-inflight-ttl-secs", "0", "--kv-events-endpoints"];
    args.extend(endpoints.iter().map(String::as_str));
    let gateway = Gateway::start(&[a.url(), b.url()], &args);
    let (url_a, url_b) = (a.url(), b.url());
    wait_up(&gateway, &url_a);
    wait_up(&gateway, &url_b);
    // Worker b reports the first 4 blocks of family 1; a holds family 2's.
    pub_b.publish(&[store_family(1, 4)]);
    pub_a.publish(&[store_family(2, 4)]);
    wait_held(&gateway, &url_b, 4.0);
    wait_held(&gateway, &url_a, 4.0);
    for _ in 0..5 {
        assert_eq!(routed(&gateway, &tokens(1, 6)), url_b);
        assert_eq!(routed(&gateway, &tokens(2, 6)), url_a);
    }
    // The response says what the index predicted the worker holds: 4 blocks of 16.
    let response = gateway
        .client()
        .post_json("/generate", &generate(&tokens(1, 6)));
    let predicted = response.header("x-kvgate-predicted-cached-tokens");
    assert_eq!(predicted, Some("64"), "{:?}", response.headers);
    // The gateway recorded none of these ten decisions anywhere: still 4 blocks each, and the
    // tree branch counter saw none of them.
    assert_eq!(held(&gateway, &url_b), 4.0);
    assert_eq!(
        gateway.metric_sum("smg_cache_aware_policy_branch_total"),
        0.0
    );
    // b evicts family 1; a caches it: family 1 follows.
    pub_b.publish(&[sglang::removed(&hashes(1, 4))]);
    pub_a.publish(&[store_family(1, 2)]);
    wait_held(&gateway, &url_b, 0.0);
    wait_held(&gateway, &url_a, 6.0);
    assert_eq!(routed(&gateway, &tokens(1, 6)), url_a);
    let applied = |w: &str| gateway.metric(&series("kvgate_kv_events_applied_total", w, ""));
    assert_eq!((applied(&url_a), applied(&url_b)), (2.0, 2.0));
    let entries = gateway.metric_sum("kvgate_kv_index_blocks");
    assert_eq!(entries, 6.0, "distinct blocks");
}

#[test]
fn dispatched_blocks_count_as_in_flight_until_confirmed_and_lapse_when_never_reported() {
    // b answers a request longer than 6 blocks after a while: it stays in flight meanwhile.
    let slow = |req: &utils::mock_origin::RecordedRequest| {
        let ids = String::from_utf8_lossy(&req.body).matches(',').count();
        let ok = Reply::json(r#"{"text":"ok"}"#);
        if ids >= 6 * BLOCK + 3 {
            Reply::Delay(Duration::from_secs(3), Box::new(ok))
        } else {
            ok
        }
    };
    let (a, b) = (origin(), MockOrigin::start(slow));
    let (pub_a, pub_b) = (Publisher::start(), Publisher::start());
    let endpoints = [pub_a.endpoint(true), pub_b.endpoint(true)];
    let mut args = vec!["--kv-events-endpoints"];
    args.extend(endpoints.iter().map(String::as_str));
    let gateway = Gateway::start(&[a.url(), b.url()], &args);
    let (url_a, url_b) = (a.url(), b.url());
    wait_up(&gateway, &url_a);
    wait_up(&gateway, &url_b);
    // b reports 4 blocks of family 1 (and a something else, so the model's block size is
    // known on both).
    pub_b.publish(&[store_family(1, 4)]);
    pub_a.publish(&[store_family(2, 4)]);
    wait_held(&gateway, &url_b, 4.0);
    // An 8-block request goes to b and waits there: its last 4 blocks count as b's while it
    // is in flight, never in the engines' table.
    let mut client = gateway.client();
    let long = std::thread::spawn(move || {
        let response = client.post_json("/generate", &generate(&tokens(1, 8)));
        response
            .header("x-smg-routed-worker-id")
            .map(str::to_string)
    });
    let claims = || gateway.metric("kvgate_kv_inflight_blocks");
    assert!(
        wait_until(WAIT, || claims() == 4.0),
        "{}",
        gateway.metrics()
    );
    let predicted = || {
        let response = gateway
            .client()
            .post_json("/generate", &generate(&tokens(1, 6)));
        let header = response.header("x-kvgate-predicted-cached-tokens");
        header.map(str::to_string)
    };
    assert_eq!(
        predicted().as_deref(),
        Some("96"),
        "4 blocks confirmed, 2 in flight"
    );
    assert_eq!(
        held(&gateway, &url_b),
        4.0,
        "nothing written into the engines' table"
    );
    let provisional = "kvgate_kv_event_predictions_total{basis=\"provisional\"}";
    assert_eq!(gateway.metric(provisional), 1.0, "{}", gateway.metrics());
    assert_eq!(long.join().unwrap().as_deref(), Some(url_b.as_str()));
    // b's origin never reports those blocks: once the answers' grace is past (each look
    // dispatches again, so each waits out a grace first), the prediction is what the engine
    // reported again.
    let grace = Duration::from_millis(1500);
    assert!(
        wait_until(WAIT, || {
            std::thread::sleep(grace);
            predicted().as_deref() == Some("64")
        }),
        "the unconfirmed claims never lapsed:\n{}",
        gateway.metrics()
    );
    // b's engine reports two more blocks now: confirmed.
    let all = hashes(1, 6);
    let family = tokens(1, 6);
    let stored = &family[4 * BLOCK..6 * BLOCK];
    pub_b.publish(&[sglang::stored(&all[4..], Some(all[3]), stored)]);
    wait_held(&gateway, &url_b, 6.0);
    assert_eq!(predicted().as_deref(), Some("96"));
    let confirmed = "kvgate_kv_event_predictions_total{basis=\"confirmed\"}";
    assert!(gateway.metric(confirmed) >= 1.0, "{}", gateway.metrics());
}

#[test]
fn a_lost_batch_is_replayed_and_without_replay_the_entries_are_rebuilt() {
    let (a, b) = (origin(), origin());
    let (pub_a, pub_b) = (Publisher::start(), Publisher::start());
    // a has a replay socket, b does not.
    let endpoints = [pub_a.endpoint(true), pub_b.endpoint(false)];
    let mut args = vec!["--kv-events-endpoints"];
    args.extend(endpoints.iter().map(String::as_str));
    let gateway = Gateway::start(&[a.url(), b.url()], &args);
    let (url_a, url_b) = (a.url(), b.url());
    wait_up(&gateway, &url_a);
    wait_up(&gateway, &url_b);
    let family = tokens(3, 3);
    let blocks: Vec<&[u32]> = family.chunks(BLOCK).take(3).collect();
    let h = hashes(3, 3);
    for publisher in [&pub_a, &pub_b] {
        publisher.publish(&[sglang::stored(&h[..1], None, blocks[0])]);
        // The second block's batch never reaches the subscriber live.
        publisher.publish_lost(&[sglang::stored(&h[1..2], Some(h[0]), blocks[1])]);
        publisher.publish(&[sglang::stored(&h[2..3], Some(h[1]), blocks[2])]);
    }
    // a: the gap was filled from the replay socket, all three blocks are listed.
    wait_held(&gateway, &url_a, 3.0);
    let batches = |w: &str, outcome: &str| {
        let extra = format!(",outcome=\"{outcome}\"");
        gateway.metric(&series("kvgate_kv_event_batches_total", w, &extra))
    };
    assert!(batches(&url_a, "replayed") >= 1.0, "{}", gateway.metrics());
    let resets = |w: &str, reason: &str| {
        let extra = format!(",reason=\"{reason}\"");
        gateway.metric(&series("kvgate_kv_event_resets_total", w, &extra))
    };
    assert_eq!(resets(&url_a, "gap"), 0.0);
    // b: the gap cleared its entries; the third block's parent is unknown, so it is not listed.
    assert!(wait_until(WAIT, || resets(&url_b, "gap") == 1.0));
    wait_held(&gateway, &url_b, 0.0);
    let orphaned = series(
        "kvgate_kv_event_blocks_total",
        &url_b,
        ",change=\"orphaned\"",
    );
    assert_eq!(gateway.metric(&orphaned), 1.0);
    // Rebuilt from the next events.
    pub_b.publish(&[store_family(4, 2)]);
    wait_held(&gateway, &url_b, 2.0);
    assert_eq!(routed(&gateway, &tokens(4, 3)), url_b);
    assert_eq!(routed(&gateway, &tokens(3, 3)), url_a);
}

#[test]
fn a_restarted_publisher_drops_the_entries_and_a_malformed_batch_is_skipped() {
    let (a, b, c) = (origin(), origin(), origin());
    let publisher = Publisher::start();
    // Worker c's publisher has no replay socket: its restart shows by its numbers alone.
    let bare = Publisher::start();
    let endpoints = [
        publisher.endpoint(true),
        "none".to_string(),
        bare.endpoint(false),
    ];
    let mut args = vec!["--kv-events-endpoints"];
    args.extend(endpoints.iter().map(String::as_str));
    let gateway = Gateway::start(&[a.url(), b.url(), c.url()], &args);
    let (url_a, url_c) = (a.url(), c.url());
    wait_up(&gateway, &url_a);
    wait_up(&gateway, &url_c);
    publisher.publish(&[store_family(5, 3)]);
    for _ in 0..3 {
        bare.publish(&[store_family(9, 4)]);
    }
    wait_held(&gateway, &url_c, 4.0);
    wait_held(&gateway, &url_a, 3.0);
    // Not msgpack: counted, skipped, and the stream goes on.
    publisher.publish_raw(b"\xc1 not a batch".to_vec());
    publisher.publish(&[store_family(6, 1)]);
    wait_held(&gateway, &url_a, 4.0);
    let malformed = series(
        "kvgate_kv_event_batches_total",
        &url_a,
        ",outcome=\"malformed\"",
    );
    assert_eq!(gateway.metric(&malformed), 1.0);
    // The engine restarts: its cache is gone, its numbering starts over.
    publisher.restart();
    let restarts = series(
        "kvgate_kv_event_resets_total",
        &url_a,
        ",reason=\"restart\"",
    );
    // Published until the new subscription has it (the first may go out before it connects).
    assert!(
        wait_until(WAIT, || {
            publisher.publish(&[store_family(7, 2)]);
            std::thread::sleep(Duration::from_millis(100));
            gateway.metric(&restarts) == 1.0 && held(&gateway, &url_a) == 2.0
        }),
        "{}",
        gateway.metrics()
    );
    assert_eq!(routed(&gateway, &tokens(7, 2)), url_a);
    bare.restart();
    // Numbers going back (restart), past ours (gap) or the next one (unverified): whichever the
    // first batch after the reconnection shows, worker c starts over once.
    let resets = |reason: &str| {
        let extra = format!(",reason=\"{reason}\"");
        gateway.metric(&series("kvgate_kv_event_resets_total", &url_c, &extra))
    };
    assert!(
        wait_until(WAIT, || {
            bare.publish(&[store_family(10, 1)]);
            std::thread::sleep(Duration::from_millis(100));
            let started_over = resets("restart") + resets("gap") + resets("unverified");
            started_over == 1.0 && held(&gateway, &url_c) == 1.0
        }),
        "{}",
        gateway.metrics()
    );
    // Worker b publishes nothing the gateway reads: no stream is listed for it.
    assert!(!gateway
        .metrics()
        .contains(&series("kvgate_kv_events_stream_up", &b.url(), "")));
}

#[test]
fn the_endpoint_is_learned_from_server_info_and_a_removed_worker_is_purged() {
    let publisher = Publisher::start();
    let config = format!(
        r#"{{"publisher":"zmq","endpoint":"tcp://*:{}","replay_endpoint":"tcp://*:{}"}}"#,
        publisher.port, publisher.replay_port
    );
    let info = serde_json::json!({ "page_size": 16, "kv_events_config": config }).to_string();
    let a = MockOrigin::start(move |request| match request.path.as_str() {
        "/server_info" => Reply::json(&info),
        _ => Reply::json(r#"{"text":"ok"}"#),
    });
    let b = origin();
    let gateway = Gateway::start(&[a.url(), b.url()], &[]);
    let url_a = a.url();
    wait_up(&gateway, &url_a);
    publisher.publish(&[store_family(8, 2)]);
    wait_held(&gateway, &url_a, 2.0);
    assert_eq!(routed(&gateway, &tokens(8, 4)), url_a);
    let removed = gateway.request("DELETE", "/workers/0", "", None);
    assert_eq!(removed.status, 202, "{}", removed.text());
    assert!(
        wait_until(WAIT, || !gateway.metrics().contains(&url_a)),
        "{}",
        gateway.metrics()
    );
    assert_eq!(gateway.metric_sum("kvgate_kv_index_blocks"), 0.0);
}

#[test]
fn one_batch_numbered_far_ahead_hides_none_of_the_batches_after_it() {
    let a = origin();
    let publisher = Publisher::start();
    let endpoint = publisher.endpoint(false);
    let gateway = Gateway::start(&[a.url()], &["--kv-events-endpoints", &endpoint]);
    let url = a.url();
    wait_up(&gateway, &url);
    for family in 20..25 {
        publisher.publish(&[store_family(family, 1)]);
    }
    wait_held(&gateway, &url, 5.0);
    // Batch 10^12, a glitch: skipped, and the worker rebuilt from the batches after it.
    publisher.publish_numbered(1_000_000_000_000, &[store_family(30, 1)]);
    let gaps = series("kvgate_kv_event_resets_total", &url, ",reason=\"gap\"");
    assert!(wait_until(WAIT, || gateway.metric(&gaps) == 1.0));
    // Batches 5, 6 and 7 are not duplicates of it.
    for family in 25..28 {
        publisher.publish(&[store_family(family, 2)]);
    }
    wait_held(&gateway, &url, 6.0);
    assert_eq!(routed(&gateway, &tokens(27, 2)), url);
    let skipped = series(
        "kvgate_kv_event_batches_total",
        &url,
        ",outcome=\"skipped\"",
    );
    assert_eq!(gateway.metric(&skipped), 1.0, "{}", gateway.metrics());
}

/// A ZMTP 3 publisher written by hand: each connection gets a greeting and a `READY`, then,
/// while `headers` last, one frame header announcing the next size (and nothing after it);
/// later connections get `batches`, numbered from 0.
fn raw_publisher(headers: Vec<u64>, batches: Vec<Vec<u8>>) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut headers = headers.into_iter();
        for connection in listener.incoming().take(64) {
            let Ok(mut socket) = connection else { continue };
            let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
            greeting.extend_from_slice(b"NULL");
            greeting.resize(64, 0);
            let mut ready = b"\x05READY\x0bSocket-Type".to_vec();
            ready.extend_from_slice(&3u32.to_be_bytes());
            ready.extend_from_slice(b"PUB");
            greeting.extend_from_slice(&[0x04, ready.len() as u8]);
            greeting.extend_from_slice(&ready);
            if socket.write_all(&greeting).is_err() {
                continue;
            }
            // The subscriber's handshake done, then the frames.
            std::thread::sleep(Duration::from_millis(300));
            let mut frames = Vec::new();
            match headers.next() {
                Some(announced) => {
                    frames.push(0x02);
                    frames.extend_from_slice(&announced.to_be_bytes());
                }
                None => {
                    for (seq, payload) in batches.iter().enumerate() {
                        frames.extend_from_slice(&[0x01, 0, 0x01, 8]);
                        frames.extend_from_slice(&(seq as u64).to_be_bytes());
                        frames.push(0x02);
                        frames.extend_from_slice(&(payload.len() as u64).to_be_bytes());
                        frames.extend_from_slice(payload);
                    }
                }
            }
            let _ = socket.write_all(&frames);
            // Held open until the subscriber closes it (or 30 s).
            let _ = socket.set_read_timeout(Some(Duration::from_secs(30)));
            let mut sink = [0u8; 1024];
            while socket.read(&mut sink).is_ok_and(|n| n > 0) {}
        }
    });
    port
}

#[test]
fn a_frame_header_announcing_exabytes_is_refused_and_the_stream_subscribed_again() {
    let a = origin();
    // 2^47, 2^62 and 2^64-1 bytes aborted or stopped the subscriber before; 1 TiB left it stuck;
    // 200 MB is past KV_EVENTS_MESSAGE_BYTES_MAX.
    let headers = vec![1 << 47, 1 << 62, u64::MAX, 1 << 40, 200_000_000];
    let batches = vec![sglang::batch(&[store_family(40, 3)])];
    let port = raw_publisher(headers.clone(), batches);
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let gateway = Gateway::start(&[a.url()], &["--kv-events-endpoints", &endpoint]);
    let url = a.url();
    let too_large = series(
        "smg_kv_event_subscription_failures_total",
        &url,
        ",reason=\"too_large\"",
    );
    assert!(
        wait_until(Duration::from_secs(60), || gateway.metric(&too_large)
            == headers.len() as f64),
        "{}",
        gateway.metrics()
    );
    // Subscribed again each time: the honest connection's batch is applied.
    wait_held(&gateway, &url, 3.0);
    wait_up(&gateway, &url);
    assert_eq!(routed(&gateway, &tokens(40, 3)), url);
    let rss_kib = rss_kib(gateway.process.pid());
    assert!(rss_kib < 256 << 10, "RSS {rss_kib} KiB");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:"));
    let kib = line.and_then(|l| l.split_whitespace().nth(1));
    kib.and_then(|k| k.parse().ok()).expect("VmRSS in KiB")
}
