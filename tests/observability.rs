//! Observability against a live kvgate: after traffic, `/metrics` has the right families (names,
//! types, labels) and their values moved as the traffic says; the page passes
//! `promtool check metrics`; a retried request counts once in the branch counter while the retry
//! and the upstream error are counted; `--log-json` writes one JSON object per line, and a
//! worker's state changes are logged. Each test starts its own processes on loopback.

mod utils;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::{Command, Stdio};

use utils::mock_origin::{MockOrigin, Reply};
use utils::process::{Gateway, SimFleet};
use utils::{chat, wait_until, TIMEOUT};

/// One family of a scrape: its `# TYPE` and its samples (full sample name, labels, value).
#[derive(Debug, Default)]
struct Family {
    kind: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

/// Parses the text exposition into families by `# TYPE`; panics on a sample whose family has no
/// `# TYPE` line, on a `# TYPE` given twice and on a value that is not a number.
fn parse_exposition(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            let family = families.entry(name.to_string()).or_default();
            assert!(family.kind.is_empty(), "# TYPE {name} given twice");
            family.kind = kind.to_string();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, parse_labels(labels.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        let family_name = [name, name.trim_end_matches("_bucket")]
            .into_iter()
            .chain(["_sum", "_count"].map(|s| name.strip_suffix(s).unwrap_or(name)))
            .find(|n| families.contains_key(*n))
            .unwrap_or_else(|| panic!("sample {line:?} has no # TYPE"));
        let family = families.get_mut(family_name).expect("found");
        family.samples.push((name.to_string(), labels, value));
    }
    families
}

/// `a="x",b="y"` (values without commas or escaped quotes, as kvgate's are here).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    text.split("\",")
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once("=\"").expect("label pair");
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect()
}

impl Family {
    fn label_names(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .flat_map(|(_, labels, _)| labels.keys().cloned())
            .filter(|k| k != "le")
            .collect()
    }

    /// The sum of the samples named `name` whose labels include every pair of `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && with
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

fn family<'a>(families: &'a BTreeMap<String, Family>, name: &str) -> &'a Family {
    families
        .get(name)
        .unwrap_or_else(|| panic!("family {name} missing; have {:?}", families.keys()))
}

fn labels(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

const CHAT_PATH: &str = "/v1/chat/completions";

/// A gateway on two data cores in front of two simulated engines, with eviction (and so the
/// tree gauges) every second and load polls every second.
fn fleet_and_gateway() -> (SimFleet, Gateway) {
    let sim = SimFleet::start(2, &["--instant"]);
    let args = [
        "--data-cores",
        "2",
        "--eviction-interval",
        "1",
        "--load-monitor-interval",
        "1",
    ];
    let gateway = Gateway::start(&sim.urls(), &args);
    // The engines' models (an unknown model is then a 404) and load reports are in.
    assert!(wait_until(TIMEOUT, || {
        let models = gateway.client().get("/v1/models").text();
        models.contains("sim-model") && gateway.metrics().contains("smg_engine_running_requests{")
    }));
    (sim, gateway)
}

/// `n` distinct chat requests (half streamed) and one for an unknown model (404).
fn send_traffic(gateway: &Gateway, n: usize) {
    for i in 0..n {
        let body = chat(
            &format!("question {i}: what is the capital of France?"),
            4,
            i % 2 == 0,
        );
        let response = gateway.client().post_json(CHAT_PATH, &body);
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let unknown = r#"{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(gateway.client().post_json(CHAT_PATH, unknown).status, 404);
}

#[test]
fn metrics_have_their_names_types_and_labels_and_move_with_traffic() {
    let (sim, gateway) = fleet_and_gateway();
    let before = parse_exposition(&gateway.metrics());
    let n = 12;
    send_traffic(&gateway, n);
    // The tree gauges are set by the next eviction cycle (every second here).
    assert!(wait_until(TIMEOUT, || gateway.metrics().contains(
        "smg_cache_tree_tenants{model=\"sim-model\",tree=\"string\"} 2"
    )));
    let after = parse_exposition(&gateway.metrics());
    let moved = |name: &str, sample: &str, with: &[(&str, &str)]| {
        family(&after, name).sum(sample, with)
            - before.get(name).map_or(0.0, |f| f.sum(sample, with))
    };

    let expected: [(&str, &str, &[&str]); 27] = [
        ("smg_http_requests_total", "counter", &["method", "path"]),
        (
            "smg_http_responses_total",
            "counter",
            &["path", "status_code"],
        ),
        (
            "smg_http_request_duration_seconds",
            "histogram",
            &["method", "path"],
        ),
        (
            "kvgate_http_request_e2e_seconds",
            "histogram",
            &["method", "path"],
        ),
        ("kvgate_data_core_requests_total", "counter", &["core"]),
        ("kvgate_upstream_retries_total", "counter", &[]),
        ("kvgate_upstream_connect_errors_total", "counter", &[]),
        (
            "smg_cache_aware_policy_branch_total",
            "counter",
            &["branch"],
        ),
        ("smg_cache_aware_match_ratio", "histogram", &[]),
        ("smg_cache_tree_tenants", "gauge", &["model", "tree"]),
        ("smg_worker_requests_active", "gauge", &["worker"]),
        ("smg_worker_health", "gauge", &["worker"]),
        (
            "smg_engine_running_requests",
            "gauge",
            &["worker", "model", "dp_rank"],
        ),
        (
            "smg_worker_errors_total",
            "counter",
            &["worker_type", "connection_mode", "error_type", "worker"],
        ),
        (
            "smg_worker_selection_total",
            "counter",
            &[
                "worker_type",
                "connection_mode",
                "model",
                "policy",
                "worker",
            ],
        ),
        (
            "smg_worker_retries_total",
            "counter",
            &["worker_type", "endpoint", "worker"],
        ),
        (
            "smg_worker_retries_exhausted_total",
            "counter",
            &["worker_type", "endpoint"],
        ),
        (
            "smg_worker_cb_transitions_total",
            "counter",
            &["worker", "from", "to"],
        ),
        (
            "smg_router_ttft_seconds",
            "histogram",
            &["router_type", "backend_type", "model", "endpoint"],
        ),
        ("smg_http_connections_active", "gauge", &[]),
        (
            "smg_worker_pool_size",
            "gauge",
            &["worker_type", "connection_mode", "model"],
        ),
        (
            "smg_worker_health_checks_total",
            "counter",
            &["worker_type", "result"],
        ),
        (
            "smg_worker_cb_outcomes_total",
            "counter",
            &["worker", "outcome"],
        ),
        ("smg_worker_cb_consecutive_failures", "gauge", &["worker"]),
        ("smg_worker_cb_consecutive_successes", "gauge", &["worker"]),
        (
            "smg_prefix_hash_policy_branch_total",
            "counter",
            &["branch"],
        ),
        (
            "smg_consistent_hashing_policy_branch_total",
            "counter",
            &["branch"],
        ),
    ];
    for (name, kind, label_names) in expected {
        let f = family(&after, name);
        assert_eq!(f.kind, kind, "{name}");
        assert_eq!(f.label_names(), labels(label_names), "{name}");
    }
    // Both sim engines serve the one model.
    let pool = "smg_worker_pool_size";
    assert_eq!(
        family(&after, pool).sum(pool, &[("model", "sim-model")]),
        2.0
    );
    let chat_path = [("path", CHAT_PATH)];
    let n = n as f64;
    // Counters by route and status: the 12 answered and the one 404.
    let requests = [("method", "POST"), ("path", CHAT_PATH)];
    assert_eq!(
        moved(
            "smg_http_requests_total",
            "smg_http_requests_total",
            &requests
        ),
        n + 1.0
    );
    let ok = [("path", CHAT_PATH), ("status_code", "200")];
    assert_eq!(
        moved("smg_http_responses_total", "smg_http_responses_total", &ok),
        n
    );
    let not_found = [("path", CHAT_PATH), ("status_code", "404")];
    assert_eq!(
        moved(
            "smg_http_responses_total",
            "smg_http_responses_total",
            &not_found
        ),
        1.0
    );
    // Both histograms saw every chat request; a response ends after its head is written.
    for name in [
        "smg_http_request_duration_seconds",
        "kvgate_http_request_e2e_seconds",
    ] {
        let count = format!("{name}_count");
        assert_eq!(moved(name, &count, &chat_path), n + 1.0, "{name}");
        let inf = [("path", CHAT_PATH), ("le", "+Inf")];
        assert_eq!(
            family(&after, name).sum(&format!("{name}_bucket"), &inf),
            family(&after, name).sum(&count, &chat_path)
        );
        let buckets: Vec<f64> = family(&after, name)
            .samples
            .iter()
            .filter(|(s, l, _)| {
                s.ends_with("_bucket") && l.get("path").map(String::as_str) == Some(CHAT_PATH)
            })
            .map(|(_, _, v)| *v)
            .collect();
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{name} buckets not cumulative: {buckets:?}"
        );
    }
    let sum = |name: &str| family(&after, name).sum(&format!("{name}_sum"), &chat_path);
    assert!(sum("kvgate_http_request_e2e_seconds") >= sum("smg_http_request_duration_seconds"));
    // Every request went through some data core.
    let per_core = moved(
        "kvgate_data_core_requests_total",
        "kvgate_data_core_requests_total",
        &[],
    );
    assert_eq!(per_core, n + 1.0);
    // One decision per routed request (the 404 is not routed), every one a miss or a match.
    let branches = moved(
        "smg_cache_aware_policy_branch_total",
        "smg_cache_aware_policy_branch_total",
        &[],
    );
    assert_eq!(branches, n);
    let ratio_count = moved(
        "smg_cache_aware_match_ratio",
        "smg_cache_aware_match_ratio_count",
        &[],
    );
    assert_eq!(ratio_count, n);
    // Both engines took requests (distinct prompts are balanced), and report one rank each.
    let running = family(&after, "smg_engine_running_requests");
    for url in sim.urls() {
        let rank0 = [
            ("worker", url.as_str()),
            ("model", "sim-model"),
            ("dp_rank", "0"),
        ];
        assert_eq!(
            running
                .samples
                .iter()
                .filter(|(_, l, _)| rank0
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v)))
                .count(),
            1,
            "{url}"
        );
    }
    assert_eq!(
        moved(
            "kvgate_upstream_retries_total",
            "kvgate_upstream_retries_total",
            &[]
        ),
        0.0
    );
    // One selection per routed request, under the engines' URLs (the registered workers, no
    // other `worker` value), the policy and the engines' model; no worker errors, no retries.
    let selection = family(&after, "smg_worker_selection_total");
    let selected_workers: BTreeSet<&str> = selection
        .samples
        .iter()
        .filter_map(|(_, l, _)| l.get("worker").map(String::as_str))
        .collect();
    let urls = sim.urls();
    assert_eq!(
        selected_workers,
        urls.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );
    let cache_aware = [("policy", "cache_aware"), ("model", "sim-model")];
    assert_eq!(
        moved(
            "smg_worker_selection_total",
            "smg_worker_selection_total",
            &cache_aware
        ),
        n
    );
    for name in ["smg_worker_errors_total", "smg_worker_retries_total"] {
        assert_eq!(moved(name, name, &[]), 0.0, "{name}");
    }
    // Time to first token: the streamed half of the requests (the others are not streams).
    let chat = [("endpoint", "chat")];
    let ttft_count = moved(
        "smg_router_ttft_seconds",
        "smg_router_ttft_seconds_count",
        &chat,
    );
    assert_eq!(ttft_count, (n / 2.0).ceil());
    let last_bound = [("endpoint", "chat"), ("le", "7200")];
    assert_eq!(
        family(&after, "smg_router_ttft_seconds")
            .sum("smg_router_ttft_seconds_bucket", &last_bound),
        family(&after, "smg_router_ttft_seconds").sum("smg_router_ttft_seconds_count", &chat)
    );
    // SMG's 29 latency buckets, 1 ms to 7,200 s, then +Inf.
    let bounds: Vec<&str> = family(&after, "smg_http_request_duration_seconds")
        .samples
        .iter()
        .filter(|(s, l, _)| {
            s.ends_with("_bucket")
                && l.get("path").map(String::as_str) == Some(CHAT_PATH)
                && l.get("method").map(String::as_str) == Some("POST")
        })
        .filter_map(|(_, l, _)| l.get("le").map(String::as_str))
        .collect();
    assert_eq!(bounds.len(), 30, "{bounds:?}");
    assert_eq!(bounds.first(), Some(&"0.001"));
    assert_eq!(bounds[28], "7200");
}

#[test]
fn a_retry_counts_the_error_and_the_retry_and_one_decision() {
    let resetting = MockOrigin::start(|_| Reply::Reset);
    let ok = MockOrigin::start(|_| Reply::json(r#"{"ok":true}"#));
    let gateway = Gateway::start(
        &[resetting.url(), ok.url()],
        &["--retry-initial-backoff-ms", "1"],
    );
    // Distinct prompts: cache misses, spread over both origins.
    for i in 0..10 {
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hello {i}"}}]}}"#);
        let response = gateway.client().post_json(CHAT_PATH, &body);
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let families = parse_exposition(&gateway.metrics());
    let total = |name: &str| family(&families, name).sum(name, &[]);
    let resets = resetting.requests().len() as f64;
    assert!(resets >= 1.0, "no request went to the resetting origin");
    assert_eq!(total("kvgate_upstream_retries_total"), resets);
    assert_eq!(total("kvgate_upstream_closed_errors_total"), resets);
    // Ten requests, ten decisions, however many attempts.
    assert_eq!(total("smg_cache_aware_policy_branch_total"), 10.0);
    // Per worker: the resetting origin's closed connections and retries, none on the other;
    // every attempt a selection; no request ran out of attempts.
    let errors = family(&families, "smg_worker_errors_total");
    let retries = family(&families, "smg_worker_retries_total");
    let selections = family(&families, "smg_worker_selection_total");
    let (bad, good) = (resetting.url(), ok.url());
    let closed = |url: &str| {
        errors.sum(
            "smg_worker_errors_total",
            &[("worker", url), ("error_type", "connection_closed")],
        )
    };
    assert_eq!(closed(&bad), resets);
    assert_eq!(closed(&good), 0.0);
    assert_eq!(
        errors.sum("smg_worker_errors_total", &[("worker", &good)]),
        0.0
    );
    let chat_retries = |url: &str| {
        retries.sum(
            "smg_worker_retries_total",
            &[("worker", url), ("endpoint", "chat")],
        )
    };
    assert_eq!(chat_retries(&bad), resets);
    assert_eq!(chat_retries(&good), 0.0);
    let picked = |url: &str| selections.sum("smg_worker_selection_total", &[("worker", url)]);
    assert_eq!(picked(&bad), resets);
    assert_eq!(picked(&good), 10.0);
    assert_eq!(total("smg_worker_retries_exhausted_total"), 0.0);
    // The breakers heard each attempt: the good worker's ten successes in a row, the resetting
    // one's failures (the control core applies them a turn later).
    let outcome = |families: &BTreeMap<String, Family>, url: &str, outcome: &str| {
        let name = "smg_worker_cb_outcomes_total";
        family(families, name).sum(name, &[("worker", url), ("outcome", outcome)])
    };
    let heard = wait_until(TIMEOUT, || {
        let now = parse_exposition(&gateway.metrics());
        outcome(&now, &good, "success") == 10.0 && outcome(&now, &bad, "failure") == resets
    });
    let now = parse_exposition(&gateway.metrics());
    assert!(heard, "{}", gateway.metrics());
    assert_eq!(outcome(&now, &good, "failure"), 0.0);
    let streak = |name: &str, url: &str| family(&now, name).sum(name, &[("worker", url)]);
    assert_eq!(streak("smg_worker_cb_consecutive_successes", &good), 10.0);
    assert_eq!(streak("smg_worker_cb_consecutive_failures", &good), 0.0);
    // Each worker had its first health check: the good one's passed (the resetting origin
    // resets its probes too).
    let checks = "smg_worker_health_checks_total";
    let passed = family(&now, checks).sum(checks, &[("result", "success")]);
    let all = family(&now, checks).sum(checks, &[]);
    assert!(passed >= 1.0 && all >= 2.0, "{passed} of {all}");
}

/// The hashing policies count SMG's branches, and `smg_http_connections_active` (SMG's
/// in-flight requests) counts a request while it waits on its worker.
#[test]
fn hashing_branches_and_requests_in_flight_are_counted() {
    let slow = MockOrigin::start(|_| {
        Reply::Delay(
            std::time::Duration::from_millis(600),
            Box::new(Reply::json(r#"{"ok":true}"#)),
        )
    });
    let gateway = Gateway::start(&[slow.url()], &["--policy", "prefix_hash"]);
    let active = |gateway: &Gateway| gateway.metric("smg_http_connections_active");
    assert_eq!(active(&gateway), 0.0);
    let addr = gateway.addr();
    let waiting = std::thread::spawn(move || {
        let mut client = utils::client::HttpClient::connect(addr);
        client.post_json(
            CHAT_PATH,
            r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#,
        )
    });
    assert!(wait_until(TIMEOUT, || active(&gateway) == 1.0));
    let response = waiting.join().expect("the client thread");
    assert_eq!(response.status, 200);
    assert!(wait_until(TIMEOUT, || active(&gateway) == 0.0));
    let body = r#"{"model":"m","messages":[{"role":"user","content":"b"}]}"#;
    assert_eq!(gateway.client().post_json(CHAT_PATH, body).status, 200);
    let branch = "smg_prefix_hash_policy_branch_total{branch=\"ring_hit\"}";
    assert_eq!(gateway.metric(branch), 2.0);
    let other = "smg_consistent_hashing_policy_branch_total{branch=\"routing_key_hit\"}";
    assert_eq!(gateway.metric(other), 0.0);
}

/// `HEAD /metrics` answers the GET's head (status, type, length) and no body; answers carry a
/// `Date`.
#[test]
fn head_metrics_answers_the_gets_head_without_a_body_and_answers_are_dated() {
    let ok = MockOrigin::start(|_| Reply::json(r#"{"ok":true}"#));
    let gateway = Gateway::start(&[ok.url()], &[]);
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", gateway.metrics_port)).expect("metrics port");
    stream
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout");
    stream
        .write_all(b"HEAD /metrics HTTP/1.1\r\nhost: test\r\n\r\n")
        .expect("write");
    let mut answer = Vec::new();
    // The server closes after one answer: read to the end.
    stream.read_to_end(&mut answer).expect("read");
    let answer = String::from_utf8(answer).expect("text");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a whole head");
    assert!(head.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    assert!(length > 1000, "the GET's length: {length}");
    assert_eq!(body, "", "no body after HEAD's head");
    // Every answer carries a Date: the gateway's own (this one) and a worker's that has none.
    let date = head
        .lines()
        .find_map(|l| l.strip_prefix("date: "))
        .expect("a date header");
    assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    let proxied = gateway.client().post_json(
        "/v1/chat/completions",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(proxied.status, 200, "{}", proxied.text());
    assert!(proxied.header("date").is_some_and(|d| d.ends_with(" GMT")));
}

/// `promtool check metrics` on a live scrape after traffic. Fails without promtool when
/// `KVGATE_REQUIRE_PROMTOOL=1` (scripts/test.sh installs it: scripts/fetch-promtool.sh).
#[test]
fn the_exposition_passes_promtool() {
    let promtool_found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !promtool_found {
        assert!(
            std::env::var("KVGATE_REQUIRE_PROMTOOL").as_deref() != Ok("1"),
            "promtool is missing and KVGATE_REQUIRE_PROMTOOL=1: run scripts/fetch-promtool.sh"
        );
        eprintln!("skipped: promtool not found (scripts/fetch-promtool.sh installs it)");
        return;
    }
    let (_sim, gateway) = fleet_and_gateway();
    send_traffic(&gateway, 6);
    assert!(wait_until(TIMEOUT, || gateway
        .metrics()
        .contains("smg_cache_tree_tenants{")));
    let scrape = gateway.metrics();
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(scrape.as_bytes())
        .expect("scrape written");
    let output = child.wait_with_output().expect("promtool ends");
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}\n--- scrape ---\n{scrape}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The JSON log lines of `log` whose message is `message`, for `worker`.
fn logged(log: &std::path::Path, message: &str, worker: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line:?}"))
        })
        .filter(|v| v["message"] == message && v["worker"] == worker)
        .collect()
}

#[test]
fn log_json_lines_record_each_worker_state_change() {
    let sim = SimFleet::start(2, &["--instant"]);
    let log = std::env::temp_dir().join(format!("kvgate-observability-{}.log", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    let args = [
        "--log-json",
        "--log-level",
        "info",
        "--policy",
        "round_robin",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--health-success-threshold",
        "1",
        "--health-check-timeout-secs",
        "1",
        "--cb-failure-threshold",
        "2",
        "--cb-success-threshold",
        "1",
        "--cb-timeout-duration-secs",
        "1",
        "--disable-retries",
    ];
    let gw = Gateway::start_logging(&sim.urls(), &args, Some(file));
    let (url0, url1) = (sim.url(0), sim.url(1));
    // Added at start.
    assert!(wait_until(TIMEOUT, || logged(&log, "worker added", &url0)
        .len()
        == 1));
    // Unhealthy, then healthy again.
    sim.set_faults(0, serde_json::json!({"unhealthy": true}));
    assert!(wait_until(TIMEOUT, || !gw.worker_healthy(&url0)));
    sim.set_faults(0, serde_json::json!({"reset": true}));
    assert!(wait_until(TIMEOUT, || gw.worker_healthy(&url0)));
    // The circuit opens on errors, then closes after a good trial.
    sim.set_faults(1, serde_json::json!({"error_rate": 1.0}));
    assert!(wait_until(TIMEOUT, || {
        gw.client().post_json("/generate", r#"{"text":"x"}"#);
        gw.breaker_state(&url1) == "open"
    }));
    sim.set_faults(1, serde_json::json!({"reset": true}));
    assert!(wait_until(TIMEOUT, || {
        gw.client().post_json("/generate", r#"{"text":"y"}"#);
        gw.breaker_state(&url1) == "closed"
    }));
    // Removed, then added through the admin API.
    assert_eq!(gw.request("DELETE", "/workers/0", "", None).status, 202);
    assert!(wait_until(TIMEOUT, || !gw.workers_json().contains(&url0)));
    let body = format!(r#"{{"url":"{url0}"}}"#);
    assert_eq!(gw.request("POST", "/workers", &body, None).status, 201);

    assert!(wait_until(TIMEOUT, || {
        !logged(&log, "admin: worker added", &url0).is_empty()
    }));
    let health = logged(&log, "worker health changed", &url0);
    let verdicts: Vec<_> = health.iter().map(|v| v["healthy"].clone()).collect();
    assert_eq!(verdicts, [false, true], "{health:?}");
    let breaker = logged(&log, "circuit breaker state changed", &url1);
    let states: Vec<_> = breaker
        .iter()
        .map(|v| v["state"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(states.first(), Some(&"open"), "{breaker:?}");
    assert_eq!(states.last(), Some(&"closed"), "{breaker:?}");
    assert_eq!(logged(&log, "worker drained and removed", &url0).len(), 1);
    for line in health.iter().chain(&breaker) {
        assert_eq!(line["level"], "INFO", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
        // SMG's layout: the event's fields beside the message, and where it was logged.
        assert!(line.get("fields").is_none(), "{line}");
        assert!(
            line["target"]
                .as_str()
                .is_some_and(|t| t.starts_with("kvgate")),
            "{line}"
        );
        assert!(
            line["filename"].is_string() && line["line_number"].is_u64(),
            "{line}"
        );
    }
    let _ = std::fs::remove_file(&log);
}

/// What an operator reading the log at start must learn at once: a worker that does not answer
/// its first health check, and a gateway started with no worker at all. A log that goes to a
/// file carries no colour codes.
#[test]
fn start_up_warns_of_an_unreachable_worker_and_of_an_empty_fleet() {
    let dir = std::env::temp_dir();
    let log = dir.join(format!("kvgate-start-warnings-{}.log", std::process::id()));
    let read = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();
    let unreachable = format!("http://127.0.0.1:{}", utils::process::free_port());
    let file = std::fs::File::create(&log).expect("log file");
    let _gw = Gateway::start_logging(
        std::slice::from_ref(&unreachable),
        &["--log-level", "info"],
        Some(file),
    );
    assert!(
        wait_until(TIMEOUT, || read(&log).lines().any(|l| l.contains("WARN")
            && l.contains("worker failed its first health check")
            && l.contains(&unreachable))),
        "{}",
        read(&log)
    );
    assert!(
        !read(&log).contains('\x1b'),
        "colour codes in a file: {}",
        read(&log)
    );

    let empty = dir.join(format!("kvgate-no-workers-{}.log", std::process::id()));
    let file = std::fs::File::create(&empty).expect("log file");
    let _gw = Gateway::start_logging(&[], &["--log-level", "info"], Some(file));
    assert!(
        wait_until(TIMEOUT, || read(&empty)
            .lines()
            .any(|l| l.contains("WARN") && l.contains("no workers"))),
        "{}",
        read(&empty)
    );
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&empty);
}

#[test]
fn disable_load_monitoring_stops_polls_only_for_policies_that_ignore_loads() {
    let sim = SimFleet::start(1, &["--instant"]);
    let flags = |policy| {
        [
            "--policy",
            policy,
            "--disable-load-monitoring",
            "--load-monitor-interval",
            "1",
        ]
    };
    let load_aware = Gateway::start(&sim.urls(), &flags("cache_aware"));
    let load_blind = Gateway::start(&sim.urls(), &flags("round_robin"));
    let polled = |gw: &Gateway| gw.metrics().contains("smg_engine_running_requests{");
    // cache_aware reads loads: still polled.
    assert!(wait_until(TIMEOUT, || polled(&load_aware)));
    // round_robin does not: no poll in three intervals.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(!polled(&load_blind), "{}", load_blind.metrics());
    // Without the flag, round_robin's workers are polled too.
    let default = Gateway::start(
        &sim.urls(),
        &["--policy", "round_robin", "--load-monitor-interval", "1"],
    );
    assert!(wait_until(TIMEOUT, || polled(&default)));
}

/// The spec's "Useful PromQL Queries", each of which the dashboard carries as a panel's query.
const SPEC_QUERIES: [&str; 6] = [
    r#"sum(rate(smg_cache_aware_policy_branch_total{branch="tree_match"}[5m])) / sum(rate(smg_cache_aware_policy_branch_total[5m]))"#,
    r#"sum(rate(smg_cache_aware_policy_branch_total{branch="spill"}[5m])) / sum(rate(smg_cache_aware_policy_branch_total[5m]))"#,
    "histogram_quantile(0.5, sum by (le) (rate(smg_cache_aware_match_ratio_bucket[5m])))",
    "avg by (worker) (smg_engine_cache_hit_rate)",
    "stddev(smg_worker_requests_active) / avg(smg_worker_requests_active)",
    "max by (model) (smg_cache_tree_tokens)",
];

/// The metric names a PromQL expression reads: its identifiers in kvgate's namespaces.
fn metric_names(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("smg_") || word.starts_with("kvgate_"))
        .collect()
}

#[test]
fn the_grafana_dashboard_loads_and_queries_only_exported_metrics() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/kvgate.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/kvgate.json");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(dashboard["uid"], "kvgate");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().expect("numeric id")),
            "{panel}"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for target in targets {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    let squash = |s: &str| s.split_whitespace().collect::<String>();
    for query in SPEC_QUERIES {
        assert!(
            exprs.iter().any(|e| squash(e) == squash(query)),
            "the spec's query is not on the dashboard: {query}"
        );
    }
    // Every metric a query reads is in a live scrape after traffic.
    let (_sim, gateway) = fleet_and_gateway();
    send_traffic(&gateway, 6);
    assert!(wait_until(TIMEOUT, || gateway
        .metrics()
        .contains("smg_cache_tree_tokens{")));
    let scrape = gateway.metrics();
    let exported = |name: &str| {
        scrape
            .lines()
            .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
    };
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no kvgate metric in {expr}");
        for name in names {
            assert!(
                exported(name),
                "{name} (in {expr}) is not in the scrape:\n{scrape}"
            );
        }
    }
}
