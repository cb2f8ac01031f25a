//! Kubernetes service discovery against a fake API server: a small HTTP server in the test that
//! answers the `kube` client's pod list (`PodList` with a resource version) and watch (chunked
//! JSON lines, `ADDED`/`MODIFIED`/`DELETED`, and an `ERROR` event with a 410 Gone), found by
//! kvgate through a kubeconfig (`KUBECONFIG`), as `kubectl` would find it. No cluster needed.
//!
//! Each pod points at a mock origin on loopback (its IP 127.0.0.1, its port in SMG's
//! `smg.ai/worker-ports` annotation), so the admin add's health probe passes and requests
//! route to it.

mod utils;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use utils::mock_origin::MockOrigin;
use utils::process::Gateway;
use utils::{ok_origin, wait_until, CHAT, TIMEOUT};

const NAMESPACE: &str = "llm";

/// What the fake API server holds and whom it streams to.
#[derive(Default)]
struct ApiState {
    pods: BTreeMap<String, Value>,
    resource_version: u64,
    watchers: Vec<TcpStream>,
    /// The query strings of every list and watch call, in order.
    calls: Vec<String>,
    /// The server is down: every connection is closed unanswered.
    down: bool,
}

/// A fake Kubernetes API server on loopback: pods of one namespace, list and watch.
struct FakeApiServer {
    port: u16,
    state: Arc<Mutex<ApiState>>,
}

impl FakeApiServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake API server");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(ApiState {
            resource_version: 100,
            ..ApiState::default()
        }));
        let served = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if served.lock().expect("state").down {
                    drop(stream);
                    continue;
                }
                let state = served.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        FakeApiServer { port, state }
    }

    /// A kubeconfig naming this server, written to `dir`.
    fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: \
             http://127.0.0.1:{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    \
             user: fake\n    namespace: {NAMESPACE}\ncurrent-context: fake\nusers:\n- name: fake\n  \
             user: {{}}\n",
            self.port
        );
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    /// Adds or changes a pod, telling the open watches.
    fn put(&self, pod: Value) {
        let mut state = self.state.lock().expect("state");
        state.resource_version += 1;
        let mut pod = pod;
        pod["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
        let kind = if state.pods.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.pods.insert(name, pod.clone());
        broadcast(&mut state, &json!({"type": kind, "object": pod}));
    }

    /// Deletes a pod, telling the open watches.
    fn delete(&self, name: &str) {
        let mut state = self.state.lock().expect("state");
        state.resource_version += 1;
        let Some(mut pod) = state.pods.remove(name) else {
            return;
        };
        pod["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        broadcast(&mut state, &json!({"type": "DELETED", "object": pod}));
    }

    /// Deletes a pod without telling anyone (as while the watch was down), then ends every
    /// watch with a 410 Gone: the client must list again to learn of it.
    fn delete_unseen_then_gone(&self, name: &str) {
        let mut state = self.state.lock().expect("state");
        state.resource_version += 1;
        state.pods.remove(name);
        let gone = json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version", "reason": "Expired", "code": 410}});
        broadcast(&mut state, &gone);
        for stream in state.watchers.drain(..) {
            let _ = end_chunked(&stream);
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Cuts every open watch (the API server restarting): the client resumes.
    fn cut_watches(&self) {
        let mut state = self.state.lock().expect("state");
        for stream in state.watchers.drain(..) {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The API server goes away (its watches cut, every new connection closed unanswered) or
    /// comes back.
    fn set_down(&self, down: bool) {
        self.state.lock().expect("state").down = down;
        if down {
            self.cut_watches();
        }
    }

    fn calls(&self) -> Vec<String> {
        self.state.lock().expect("state").calls.clone()
    }

    fn open_watches(&self) -> usize {
        self.state.lock().expect("state").watchers.len()
    }
}

/// Writes one watch event (a JSON line, one chunk) to every open watch, dropping the gone.
fn broadcast(state: &mut ApiState, event: &Value) {
    let line = format!("{event}\n");
    state
        .watchers
        .retain(|mut stream| write_chunk(&mut stream, line.as_bytes()).is_ok());
}

fn write_chunk(stream: &mut &TcpStream, data: &[u8]) -> std::io::Result<()> {
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(data)?;
    stream.write_all(b"\r\n")?;
    stream.flush()
}

fn end_chunked(mut stream: &TcpStream) -> std::io::Result<()> {
    stream.write_all(b"0\r\n\r\n")
}

/// Serves one connection: requests until it closes; a watch keeps the connection.
fn serve(stream: TcpStream, state: &Mutex<ApiState>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        // The head's other lines: nothing to read in them, and GETs carry no body.
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        let target = request_line.split(' ').nth(1).unwrap_or("").to_string();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let pods_path = format!("/api/v1/namespaces/{NAMESPACE}/pods");
        let mut out = &stream;
        if path != pods_path {
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":404}"#;
            let _ = write!(
                out,
                "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        let mut state = state.lock().expect("state");
        state.calls.push(query.to_string());
        if query.split('&').any(|p| p == "watch=true") {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                        transfer-encoding: chunked\r\n\r\n";
            if out.write_all(head.as_bytes()).is_ok() {
                state.watchers.push(stream.try_clone().expect("clone"));
            }
            // The watch holds the connection until the test ends or cuts it.
            drop(state);
            let mut rest = Vec::new();
            let _ = std::io::Read::read_to_end(&mut reader, &mut rest);
            return;
        }
        let list = json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": state.resource_version.to_string()},
            "items": state.pods.values().cloned().collect::<Vec<_>>(),
        })
        .to_string();
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{list}",
            list.len()
        );
    }
}

/// A pod of the fake cluster: `app=engine`, on loopback at `port`, ready or not.
fn pod(name: &str, port: u16, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}"),
            "labels": {"app": "engine"},
            "annotations": {"smg.ai/worker-ports": port.to_string()},
        },
        "status": {
            "phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

/// A pod of a disaggregated fleet: `app=engine` and `role=<role>`, ready, with SMG's
/// bootstrap-port annotation when `bootstrap_port` is given.
fn role_pod(name: &str, port: u16, role: &str, bootstrap_port: Option<u16>) -> Value {
    let mut pod = pod(name, port, true);
    pod["metadata"]["labels"]["role"] = json!(role);
    if let Some(bootstrap) = bootstrap_port {
        pod["metadata"]["annotations"]["sglang.ai/bootstrap-port"] = json!(bootstrap.to_string());
    }
    pod
}

fn origin_port(origin: &MockOrigin) -> u16 {
    origin
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The URLs `GET /workers` lists.
fn worker_urls(gateway: &Gateway) -> Vec<String> {
    let listed: Value = serde_json::from_str(&gateway.workers_json()).unwrap_or(Value::Null);
    let workers = listed["workers"].as_array().cloned().unwrap_or_default();
    let mut urls: Vec<String> = workers
        .iter()
        .filter(|w| w["draining"] != json!(true))
        .filter_map(|w| w["url"].as_str().map(String::from))
        .collect();
    urls.sort();
    urls
}

/// Held while a test sets `KUBECONFIG` and starts its gateway, so that a test running beside
/// it cannot hand its own kubeconfig to this gateway.
static KUBECONFIG_LOCK: Mutex<()> = Mutex::new(());

fn start_gateway(api: &FakeApiServer, dir: &std::path::Path) -> Gateway {
    start_gateway_with(api, dir, &["--selector", "app=engine"])
}

/// A gateway discovering through `api`'s namespace with `selectors` (and any other flags).
fn start_gateway_with(api: &FakeApiServer, dir: &std::path::Path, selectors: &[&str]) -> Gateway {
    let _alone = KUBECONFIG_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // The child inherits the environment: the kubeconfig is found as kubectl finds it.
    std::env::set_var("KUBECONFIG", api.kubeconfig(dir));
    let discovery = [
        "--service-discovery",
        "--service-discovery-namespace",
        NAMESPACE,
    ];
    Gateway::start(&[], &[&discovery[..], selectors].concat())
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn ready_pods_become_workers_and_leave_when_unready_or_deleted() {
    let (a, b) = (ok_origin(), ok_origin());
    let (url_a, url_b) = (a.url(), b.url());
    let api = FakeApiServer::start();
    // Listed at start: a ready, b not yet.
    api.put(pod("engine-a", origin_port(&a), true));
    api.put(pod("engine-b", origin_port(&b), false));
    let dir = temp_dir("discovery-watch");
    let gateway = start_gateway(&api, &dir);
    assert!(
        wait_until(TIMEOUT, || worker_urls(&gateway) == [url_a.clone()]),
        "{:?}",
        worker_urls(&gateway)
    );
    let response = gateway.client().post_json("/v1/chat/completions", CHAT);
    assert_eq!(response.status, 200, "{}", response.text());
    // The watch follows the list from its resource version.
    assert!(wait_until(TIMEOUT, || api.open_watches() == 1));
    let calls = api.calls();
    assert!(calls[0].contains("labelSelector=app%3Dengine"), "{calls:?}");
    assert!(
        calls[1].contains("watch=true") && calls[1].contains("resourceVersion=102"),
        "{calls:?}"
    );
    // MODIFIED: b turns ready and is added.
    api.put(pod("engine-b", origin_port(&b), true));
    let mut both = vec![url_a.clone(), url_b.clone()];
    both.sort();
    assert!(
        wait_until(TIMEOUT, || worker_urls(&gateway) == both),
        "{:?}",
        worker_urls(&gateway)
    );
    // MODIFIED: a turns unready and is removed (drained: no request in flight, so gone soon).
    api.put(pod("engine-a", origin_port(&a), false));
    assert!(
        wait_until(TIMEOUT, || worker_urls(&gateway) == [url_b.clone()]),
        "{:?}",
        worker_urls(&gateway)
    );
    // DELETED: b goes, and the fleet is empty.
    api.delete("engine-b");
    assert!(
        wait_until(TIMEOUT, || worker_urls(&gateway).is_empty()),
        "{:?}",
        worker_urls(&gateway)
    );
    // The discovery thread counts each answer when it collects it (within a poll).
    let counted = wait_until(TIMEOUT, || {
        let figures = gateway.metrics();
        figures.contains(
            "smg_discovery_registrations_total{source=\"kubernetes\",result=\"success\"} 2",
        ) && figures.contains(
            "smg_discovery_deregistrations_total{source=\"kubernetes\",reason=\"reconciled\"} 2",
        ) && figures.contains("smg_discovery_workers_discovered{source=\"kubernetes\"} 0")
    });
    assert!(counted, "{}", gateway.metrics());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_watch_and_an_outage_resume_from_the_last_version_and_a_410_relists() {
    let (a, b) = (ok_origin(), ok_origin());
    let (url_a, url_b) = (a.url(), b.url());
    let api = FakeApiServer::start();
    api.put(pod("engine-a", origin_port(&a), true));
    api.put(pod("engine-b", origin_port(&b), true));
    let dir = temp_dir("discovery-gone");
    let gateway = start_gateway(&api, &dir);
    let mut both = vec![url_a.clone(), url_b.clone()];
    both.sort();
    assert!(wait_until(TIMEOUT, || worker_urls(&gateway) == both));
    assert!(wait_until(TIMEOUT, || api.open_watches() == 1));
    // The API server goes away mid-watch and comes back: the watch resumes from the last
    // version it saw, without listing again.
    api.put(pod("engine-b", origin_port(&b), true));
    std::thread::sleep(Duration::from_millis(300));
    api.cut_watches();
    assert!(wait_until(TIMEOUT, || api.open_watches() == 1));
    let calls = api.calls();
    let last = calls.last().cloned().unwrap_or_default();
    assert!(
        last.contains("watch=true") && last.contains("resourceVersion=103"),
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| !c.contains("watch=true")).count(),
        1
    );
    // The API server is down for a while: the workers stay, the watch retries with a backoff
    // and resumes once the server is back, still without listing again.
    api.set_down(true);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(worker_urls(&gateway), both);
    api.set_down(false);
    assert!(wait_until(TIMEOUT, || api.open_watches() == 1));
    let calls = api.calls();
    let last = calls.last().cloned().unwrap_or_default();
    assert!(last.contains("resourceVersion=103"), "{calls:?}");
    let lists = calls.iter().filter(|c| !c.contains("watch=true")).count();
    assert_eq!(lists, 1, "{calls:?}");
    // a is deleted while no watch sees it, and the version expires (410): a new listing
    // finds a gone, and its worker is removed.
    api.delete_unseen_then_gone("engine-a");
    assert!(
        wait_until(TIMEOUT, || worker_urls(&gateway) == [url_b.clone()]),
        "{:?} after {:?}",
        worker_urls(&gateway),
        api.calls()
    );
    let lists = api
        .calls()
        .iter()
        .filter(|c| !c.contains("watch=true"))
        .count();
    assert_eq!(lists, 2, "{:?}", api.calls());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `(url, worker_type, bootstrap_port)` of each worker `GET /workers` lists, not draining (the
/// port as JSON text: `null` when the engine's default).
fn worker_roles(gateway: &Gateway) -> Vec<(String, String, String)> {
    let listed: Value = serde_json::from_str(&gateway.workers_json()).unwrap_or(Value::Null);
    let workers = listed["workers"].as_array().cloned().unwrap_or_default();
    let mut roles: Vec<(String, String, String)> = workers
        .iter()
        .filter(|w| w["draining"] != json!(true))
        .map(|w| {
            let url = w["url"].as_str().unwrap_or("").to_string();
            let worker_type = w["worker_type"].as_str().unwrap_or("").to_string();
            (url, worker_type, w["bootstrap_port"].to_string())
        })
        .collect();
    roles.sort();
    roles
}

#[test]
fn under_pd_prefill_and_decode_pods_become_workers_in_their_roles() {
    let (prefill, decode, other) = (ok_origin(), ok_origin(), ok_origin());
    let api = FakeApiServer::start();
    api.put(role_pod(
        "engine-p",
        origin_port(&prefill),
        "prefill",
        Some(8998),
    ));
    api.put(role_pod("engine-d", origin_port(&decode), "decode", None));
    // Matches neither role selector: no worker.
    api.put(role_pod("engine-x", origin_port(&other), "router", None));
    let dir = temp_dir("discovery-pd");
    let selectors = [
        "--pd-disaggregation",
        "--prefill-selector",
        "app=engine",
        "role=prefill",
        "--decode-selector",
        "app=engine",
        "role=decode",
    ];
    let gateway = start_gateway_with(&api, &dir, &selectors);
    let mut both = vec![
        (prefill.url(), "prefill".to_string(), "8998".to_string()),
        (decode.url(), "decode".to_string(), "null".to_string()),
    ];
    both.sort();
    assert!(
        wait_until(TIMEOUT, || worker_roles(&gateway) == both),
        "{:?}",
        worker_roles(&gateway)
    );
    // One watch for both roles, filtered by the labels their selectors share.
    let calls = api.calls();
    assert!(
        calls[0].contains("labelSelector=app%3Dengine&")
            || calls[0].ends_with("labelSelector=app%3Dengine"),
        "{calls:?}"
    );
    // Deleted: the prefill pod's worker leaves, then the decode pod's.
    api.delete("engine-p");
    let decode_only = vec![(decode.url(), "decode".to_string(), "null".to_string())];
    assert!(
        wait_until(TIMEOUT, || worker_roles(&gateway) == decode_only),
        "{:?}",
        worker_roles(&gateway)
    );
    api.delete("engine-d");
    assert!(
        wait_until(TIMEOUT, || worker_roles(&gateway).is_empty()),
        "{:?}",
        worker_roles(&gateway)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SMG's rules for the role selectors: under `--pd-disaggregation` discovery needs one of them
/// (`--selector` alone is refused); without it they are accepted and not applied.
#[test]
fn the_pd_selectors_follow_smgs_rules() {
    let output = std::process::Command::new(utils::process::workspace_bin("kvgate"))
        .args([
            "--pd-disaggregation",
            "--service-discovery",
            "--selector",
            "app=engine",
        ])
        .args(["--port", "1"])
        .output()
        .expect("run kvgate");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--prefill-selector"), "{stderr}");
    use clap::Parser;
    let argv = [
        "kvgate",
        "--service-discovery",
        "--selector",
        "app=engine",
        "--prefill-selector",
        "role=prefill",
    ];
    let cli = kvgate::config::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let config = kvgate::config::Config::from_cli(&cli).unwrap_or_else(|e| panic!("{e}"));
    let discovery = config.discovery.expect("discovery on");
    assert_eq!(discovery.label_selector(), "app=engine");
    let named = config
        .startup_notices
        .iter()
        .any(|n| n.contains("--prefill-selector"));
    assert!(named, "{:?}", config.startup_notices);
}

#[test]
fn discovery_without_a_selector_is_refused_at_start() {
    let output = std::process::Command::new(utils::process::workspace_bin("kvgate"))
        .args(["--service-discovery", "--port", "1"])
        .output()
        .expect("run kvgate");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--selector"), "{stderr}");
}

/// `deploy/k8s/kvgate.yaml`: the container's command line is one kvgate accepts, with
/// discovery on, and the role grants discovery exactly what it uses (get, list, watch pods).
#[test]
fn the_kubernetes_manifest_runs_a_discovering_gateway_with_the_rbac_it_needs() {
    use clap::Parser;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/k8s/kvgate.yaml");
    let manifest = std::fs::read_to_string(path).expect("deploy/k8s/kvgate.yaml");
    let documents: Vec<&str> = manifest.split("\n---\n").collect();
    let kinds: Vec<&str> = documents
        .iter()
        .filter_map(|d| d.lines().find_map(|l| l.strip_prefix("kind: ")))
        .collect();
    let expected = [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
    ];
    assert_eq!(kinds, expected);
    // The container's args: the list items under `args:` (quotes are YAML's).
    let args: Vec<String> = manifest
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .map(|a| a.trim_matches('"').to_string())
        .collect();
    assert!(args.len() > 10, "{args:?}");
    let argv = std::iter::once("kvgate".to_string()).chain(args.iter().cloned());
    let cli = kvgate::config::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let config = kvgate::config::Config::from_cli(&cli).unwrap_or_else(|e| panic!("{e}"));
    let discovery = config.discovery.expect("discovery on");
    assert_eq!(discovery.label_selector(), "app=llm-engine");
    let role = documents
        .iter()
        .find(|d| d.contains("kind: Role\n"))
        .expect("a Role");
    assert!(role.contains(r#"resources: ["pods"]"#), "{role}");
    assert!(
        role.contains(r#"verbs: ["get", "list", "watch"]"#),
        "{role}"
    );
    let deployment = documents
        .iter()
        .find(|d| d.contains("kind: Deployment"))
        .expect("a Deployment");
    assert!(deployment.contains("serviceAccountName: kvgate"));
}
