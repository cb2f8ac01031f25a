//! Compatibility with the engines' own publishing stack: a Python publisher built on pyzmq and
//! msgspec with vLLM's array-like struct layout (`tests/fixtures/kv_events_publisher.py`) feeds
//! kvgate, and routing follows it: blocks it published before the gateway subscribed arrive
//! through its ROUTER replay socket, later ones live, removals take the worker out. A
//! `BlockStored` whose tokens do not fill its blocks (vLLM's null blocks) loses only itself, and
//! blocks whose vLLM hashes fold a LoRA or extra keys (`cache_salt`) are not predicted for a
//! request without them. An engine of two data-parallel ranks (vLLM: each rank's sockets at the
//! base ports plus its rank, each numbering its batches from 0) is followed on both.
//!
//! Needs the venv of `scripts/fetch-kv-events-python.sh` (the test script runs it). Without it
//! the test says so and passes, unless `KVGATE_REQUIRE_PYTHON_COMPAT` is set (CI sets it).

mod utils;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{free_port, free_port_block, Gateway};
use utils::wait_until;

const BLOCK: usize = 16;

fn python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var("KVGATE_KV_EVENTS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/kv-events-python"));
    let python = dir.join("venv/bin/python");
    python.exists().then_some(python)
}

struct PythonPublisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    port: u16,
    replay_port: u16,
}

impl PythonPublisher {
    fn start(python: &PathBuf) -> PythonPublisher {
        PythonPublisher::start_rank(python, (free_port(), free_port()), 0)
    }

    /// A publisher of data-parallel rank `rank` on `ports` (its `PUB` and `ROUTER` ports).
    fn start_rank(python: &PathBuf, ports: (u16, u16), rank: u16) -> PythonPublisher {
        let (port, replay_port) = ports;
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kv_events_publisher.py");
        let mut child = Command::new(python)
            .arg(script)
            .args([port.to_string(), replay_port.to_string(), rank.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Python publisher starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut publisher = PythonPublisher {
            child,
            stdin,
            stdout,
            port,
            replay_port,
        };
        assert_eq!(publisher.line(), "ready");
        publisher
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("publisher output");
        line.trim().to_string()
    }

    /// Publishes one batch of `command`; returns its sequence number.
    fn publish(&mut self, command: serde_json::Value) -> u64 {
        writeln!(self.stdin, "{command}").expect("publisher input");
        let line = self.line();
        let seq = line.strip_prefix("published ").expect("published SEQ");
        seq.parse().expect("a sequence number")
    }
}

impl Drop for PythonPublisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tokens(family: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK + 5) as u32)
        .map(|i| family * 1_000_000 + i)
        .collect()
}

fn routed(gateway: &Gateway, tokens: &[u32]) -> String {
    let body = serde_json::json!({ "input_ids": tokens }).to_string();
    let response = gateway.client().post_json("/generate", &body);
    assert_eq!(response.status, 200, "{}", response.text());
    response.routed_worker().expect("routed worker").to_string()
}

#[test]
fn a_pyzmq_msgspec_publisher_in_vllm_layout_steers_routing() {
    let Some(python) = python() else {
        let required = std::env::var_os("KVGATE_REQUIRE_PYTHON_COMPAT").is_some();
        assert!(!required, "no venv: run scripts/fetch-kv-events-python.sh");
        eprintln!("skipped: no venv (scripts/fetch-kv-events-python.sh)");
        return;
    };
    let mut publisher = PythonPublisher::start(&python);
    let family = tokens(1, 3);
    // Before the gateway subscribes: only the replay socket can tell it about these blocks.
    // Hashes as vLLM's builtin hash gives them: signed, and past i64 (unsigned 64-bit).
    let hashes = [-7i128, (1i128 << 63) + 5, 42];
    let seq = publisher.publish(serde_json::json!({
        "op": "stored",
        "hashes": [hashes[0], hashes[1] as u64, hashes[2]],
        "parent": null,
        "tokens": &family[..3 * BLOCK],
        "block_size": BLOCK,
    }));
    assert_eq!(seq, 0);
    let (a, b) = (
        MockOrigin::start(|_| Reply::json(r#"{"text":"a"}"#)),
        MockOrigin::start(|_| Reply::json(r#"{"text":"b"}"#)),
    );
    let endpoint = format!(
        "tcp://127.0.0.1:{}+tcp://127.0.0.1:{}",
        publisher.port, publisher.replay_port
    );
    let gateway = Gateway::start(
        &[a.url(), b.url()],
        &["--kv-events-endpoints", "none", &endpoint],
    );
    let url_b = b.url();
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url_b}\"}}");
    let wait = Duration::from_secs(15);
    assert!(
        wait_until(wait, || gateway.metric(&held) == 3.0),
        "{}",
        gateway.metrics()
    );
    for _ in 0..4 {
        assert_eq!(routed(&gateway, &family), url_b);
    }
    let replayed =
        format!("kvgate_kv_event_batches_total{{worker=\"{url_b}\",outcome=\"replayed\"}}");
    assert_eq!(gateway.metric(&replayed), 1.0);
    // Live: a child block under the unsigned hash, then the removal of the whole chain.
    let longer = tokens(1, 4);
    publisher.publish(serde_json::json!({
        "op": "stored",
        "hashes": [43],
        "parent": 42,
        "tokens": &longer[3 * BLOCK..4 * BLOCK],
        "block_size": BLOCK,
    }));
    assert!(wait_until(wait, || gateway.metric(&held) == 4.0));
    publisher.publish(serde_json::json!({
        "op": "removed",
        "hashes": [hashes[0], hashes[1] as u64, hashes[2], 43],
    }));
    assert!(wait_until(wait, || gateway.metric(&held) == 0.0));
    publisher.publish(serde_json::json!({ "op": "cleared" }));
    let applied = format!("kvgate_kv_events_applied_total{{worker=\"{url_b}\"}}");
    assert!(wait_until(wait, || gateway.metric(&applied) == 4.0));
    let malformed =
        format!("kvgate_kv_event_batches_total{{worker=\"{url_b}\",outcome=\"malformed\"}}");
    assert_eq!(gateway.metric(&malformed), 0.0);
}

#[test]
fn vllm_null_blocks_lose_one_event_and_salted_blocks_are_never_predicted_for_plain_requests() {
    let Some(python) = python() else {
        let required = std::env::var_os("KVGATE_REQUIRE_PYTHON_COMPAT").is_some();
        assert!(!required, "no venv: run scripts/fetch-kv-events-python.sh");
        eprintln!("skipped: no venv (scripts/fetch-kv-events-python.sh)");
        return;
    };
    let mut publisher = PythonPublisher::start(&python);
    let a = MockOrigin::start(|_| Reply::json(r#"{"text":"a"}"#));
    let endpoint = format!(
        "tcp://127.0.0.1:{}+tcp://127.0.0.1:{}",
        publisher.port, publisher.replay_port
    );
    let gateway = Gateway::start(&[a.url()], &["--kv-events-endpoints", &endpoint]);
    let url = a.url();
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url}\"}}");
    let up = format!("kvgate_kv_events_stream_up{{worker=\"{url}\"}}");
    let wait = Duration::from_secs(15);
    assert!(wait_until(wait, || gateway.metric(&up) == 1.0));
    let stored = |hashes: &[i64], tokens: &[u32]| {
        serde_json::json!({
            "op": "stored", "hashes": hashes, "parent": null, "tokens": tokens,
            "block_size": BLOCK,
        })
    };
    let family = tokens(2, 3);
    publisher.publish(stored(&[100, 101, 102], &family[..3 * BLOCK]));
    assert!(wait_until(wait, || gateway.metric(&held) == 3.0));
    // One batch: a BlockStored with two blocks' tokens and one hash (a null block left out),
    // and the removal of family 2. The removal applies.
    let other = tokens(3, 2);
    publisher.publish(serde_json::json!({ "op": "batch", "events": [
        stored(&[200], &other[..2 * BLOCK]),
        { "op": "removed", "hashes": [100, 101, 102] },
    ]}));
    assert!(
        wait_until(wait, || gateway.metric(&held) == 0.0),
        "{}",
        gateway.metrics()
    );
    let malformed =
        format!("kvgate_kv_event_batches_total{{worker=\"{url}\",outcome=\"malformed\"}}");
    assert_eq!(gateway.metric(&malformed), 0.0);
    // Blocks cached under a LoRA, and under a cache_salt: held, never predicted for a request
    // without them.
    let lora = tokens(4, 2);
    let mut under_lora = stored(&[300, 301], &lora[..2 * BLOCK]);
    under_lora["lora_name"] = "sql-adapter".into();
    publisher.publish(under_lora);
    let salted = tokens(5, 2);
    let mut under_salt = stored(&[400, 401], &salted[..2 * BLOCK]);
    under_salt["extra_keys"] = serde_json::json!([["tenant-salt"], null]);
    publisher.publish(under_salt);
    let plain = tokens(6, 2);
    publisher.publish(stored(&[500, 501], &plain[..2 * BLOCK]));
    assert!(wait_until(wait, || gateway.metric(&held) == 6.0));
    let predicted = |tokens: &[u32]| {
        let body = serde_json::json!({ "input_ids": tokens }).to_string();
        let response = gateway.client().post_json("/generate", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        let header = response.header("x-kvgate-predicted-cached-tokens");
        header.map(str::to_string)
    };
    assert_eq!(
        predicted(&plain).as_deref(),
        Some("32"),
        "plain blocks predicted"
    );
    let none = |p: Option<String>| p.is_none_or(|p| p == "0");
    assert!(none(predicted(&lora)), "a LoRA's blocks predicted");
    assert!(none(predicted(&salted)), "salted blocks predicted");
}

#[test]
fn both_data_parallel_ranks_of_a_vllm_engine_are_followed_each_with_its_own_numbers() {
    let Some(python) = python() else {
        let required = std::env::var_os("KVGATE_REQUIRE_PYTHON_COMPAT").is_some();
        assert!(!required, "no venv: run scripts/fetch-kv-events-python.sh");
        eprintln!("skipped: no venv (scripts/fetch-kv-events-python.sh)");
        return;
    };
    let (base, replay_base) = (free_port_block(2), free_port_block(2));
    let mut rank0 = PythonPublisher::start_rank(&python, (base, replay_base), 0);
    let mut rank1 = PythonPublisher::start_rank(&python, (base + 1, replay_base + 1), 1);
    let stored = |hashes: &[i64], tokens: &[u32]| {
        serde_json::json!({
            "op": "stored", "hashes": hashes, "parent": null, "tokens": tokens,
            "block_size": BLOCK,
        })
    };
    // Rank 1 cached a prefix before the gateway subscribed: only its replay socket has it.
    let early = tokens(7, 2);
    assert_eq!(rank1.publish(stored(&[700, 701], &early[..2 * BLOCK])), 0);
    let (a, b) = (
        MockOrigin::start(|_| Reply::json(r#"{"text":"a"}"#)),
        MockOrigin::start(|_| Reply::json(r#"{"text":"b"}"#)),
    );
    let endpoint = format!("tcp://127.0.0.1:{base}+tcp://127.0.0.1:{replay_base}?dp_size=2");
    let gateway = Gateway::start(
        &[a.url(), b.url()],
        &["--kv-events-endpoints", "none", &endpoint],
    );
    let url_b = b.url();
    let held = format!("kvgate_kv_index_worker_blocks{{worker=\"{url_b}\"}}");
    let up = format!("kvgate_kv_events_stream_up{{worker=\"{url_b}\"}}");
    let wait = Duration::from_secs(15);
    assert!(
        wait_until(wait, || gateway.metric(&held) == 2.0
            && gateway.metric(&up) == 1.0),
        "{}",
        gateway.metrics()
    );
    // Rank 0 numbers its batches from 0 too: not a duplicate of rank 1's.
    let family = tokens(8, 3);
    assert_eq!(
        rank0.publish(stored(&[800, 801, 802], &family[..3 * BLOCK])),
        0
    );
    assert!(wait_until(wait, || gateway.metric(&held) == 5.0));
    assert_eq!(routed(&gateway, &family), url_b);
    assert_eq!(routed(&gateway, &early), url_b);
    // Each rank's next batch, live; then rank 1's removal takes only its blocks.
    let more = tokens(9, 1);
    assert_eq!(rank1.publish(stored(&[900], &more[..BLOCK])), 1);
    assert!(wait_until(wait, || gateway.metric(&held) == 6.0));
    assert_eq!(
        rank1.publish(serde_json::json!({ "op": "removed", "hashes": [700, 701, 900] })),
        2
    );
    assert!(wait_until(wait, || gateway.metric(&held) == 3.0));
    let skipped =
        format!("kvgate_kv_event_batches_total{{worker=\"{url_b}\",outcome=\"skipped\"}}");
    assert_eq!(gateway.metric(&skipped), 0.0, "{}", gateway.metrics());
    for reason in ["gap", "restart"] {
        let resets =
            format!("kvgate_kv_event_resets_total{{worker=\"{url_b}\",reason=\"{reason}\"}}");
        assert_eq!(gateway.metric(&resets), 0.0, "{reason}");
    }
}
