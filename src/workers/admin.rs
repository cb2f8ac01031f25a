//! The admin API's rules: `GET/POST /workers` and `DELETE /workers/{id}`, closed unless
//! `--admin-api-key` or `--admin-api-insecure` opens them, and the drain of a removed worker.
//!
//! Owns the pure logic behind the endpoints: [`route_admin`] (which admin endpoint a request
//! is), [`check_access`] (closed: 403; bearer token: 401 without it; or open, per
//! [`AdminAccess`]), [`parse_add_worker`] (`{"url":
//! "http://host:port"}`, validated before the health probe), [`WorkerRef`] (a worker named by
//! dense id or by URL), [`render_worker_list`] (the `GET /workers` JSON of [`WorkerReport`]s) and
//! [`DrainClock`] (how long a removed worker may drain before it is purged). The data plane's
//! handler (`http::admin`) authenticates and hands calls to the control core, which serves them
//! (`control::workers`). A refused caller gets the gateway's own error kinds (`AdminClosed`,
//! `Unauthorized`, answered as every `ErrorKind` is); a call that cannot be served is an
//! [`AdminError`] that knows its HTTP status and renders the same JSON error body.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::breaker::BreakerState;
use super::catalog::ListedModel;
use super::load::LoadReport;
use super::role::{parse_bootstrap_port, WorkerRole};
use super::spec::{KvEventsSource, WorkerProtocol, WorkerUrl};
use crate::error::{error_body, ErrorKind};
use crate::ids::WorkerId;
use crate::limits::ADMIN_BODY_BYTES_MAX;

/// An admin request that cannot be served, with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    /// HTTP status.
    pub status: u16,
    /// The `type` field of the error body.
    pub kind: &'static str,
    /// A message for the operator.
    pub message: String,
}

impl AdminError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        AdminError {
            status,
            kind,
            message: message.into(),
        }
    }

    /// `{"error":{"message","type","code"}}`, the gateway's JSON error shape
    /// ([`error_body`]).
    pub fn to_json(&self) -> String {
        error_body(self.status, self.kind, &self.message).to_string()
    }
}

/// Which admin endpoint a request targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminRoute {
    /// `GET /workers`.
    ListWorkers,
    /// `POST /workers`.
    AddWorker,
    /// `DELETE /workers/{id}`.
    RemoveWorker(WorkerRef),
}

/// A worker named in an admin path: its dense id (`/workers/3`) or its URL, percent-encoded
/// (`/workers/http%3A%2F%2F127.0.0.1%3A8000`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerRef {
    /// By dense id.
    Id(WorkerId),
    /// By URL as given at registration.
    Url(String),
}

/// Classify a request as an admin endpoint. `None`: not an admin path (route it elsewhere).
/// `Some(Err)`: an admin path with the wrong method (405) or a malformed id (400).
pub fn route_admin(method: &str, path: &str) -> Option<Result<AdminRoute, AdminError>> {
    let path = path.split('?').next().unwrap_or(path);
    if path == "/workers" || path == "/workers/" {
        return Some(match method {
            "GET" => Ok(AdminRoute::ListWorkers),
            "POST" => Ok(AdminRoute::AddWorker),
            _ => Err(method_not_allowed(method, path)),
        });
    }
    let name = path.strip_prefix("/workers/")?;
    Some(match method {
        "DELETE" => parse_worker_ref(name).map(AdminRoute::RemoveWorker),
        _ => Err(method_not_allowed(method, path)),
    })
}

fn method_not_allowed(method: &str, path: &str) -> AdminError {
    AdminError::new(
        405,
        "method_not_allowed",
        format!("{method} is not allowed on {path}"),
    )
}

fn parse_worker_ref(name: &str) -> Result<WorkerRef, AdminError> {
    let bad = || {
        AdminError::new(
            400,
            "invalid_request_error",
            format!("invalid worker id {name:?}"),
        )
    };
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return name
            .parse::<u16>()
            .map(|id| WorkerRef::Id(WorkerId(id)))
            .map_err(|_| bad());
    }
    let url = percent_decode(name).ok_or_else(bad)?;
    WorkerUrl::parse(&url).map_err(|_| bad())?;
    Ok(WorkerRef::Url(url))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Who may call the admin API: closed unless a flag opens it, since whoever can add a worker
/// can send every request to a host of their choosing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAccess {
    /// Neither `--admin-api-key` nor `--admin-api-insecure`: every call is a 403.
    Closed,
    /// `--admin-api-key`: calls carrying `Authorization: Bearer <key>`.
    Bearer(String),
    /// `--admin-api-insecure`: anyone who reaches the main port.
    Open,
}

impl AdminAccess {
    /// The start-up log line that says which it is.
    pub fn describe(&self) -> &'static str {
        match self {
            AdminAccess::Closed => {
                "admin API closed: /workers answers 403 (set --admin-api-key, or \
                 --admin-api-insecure on a trusted network)"
            }
            AdminAccess::Bearer(_) => "admin API open to Authorization: Bearer <--admin-api-key>",
            AdminAccess::Open => {
                "admin API open to anyone reaching the main port, without a key \
                 (--admin-api-insecure)"
            }
        }
    }
}

/// Whether a call may use the admin API: `AdminClosed` (403) when it is closed, `Unauthorized`
/// (401) without the right bearer token. `authorization` is the raw `Authorization` header
/// value, if any. The refusal is an [`ErrorKind`], answered as every gateway error is, whether
/// the call is refused from its head alone (before a `100 Continue`) or with its body.
pub fn check_access(access: &AdminAccess, authorization: Option<&[u8]>) -> Result<(), ErrorKind> {
    match access {
        AdminAccess::Open => Ok(()),
        AdminAccess::Closed => Err(ErrorKind::AdminClosed),
        AdminAccess::Bearer(key) if bearer_matches(key, authorization) => Ok(()),
        AdminAccess::Bearer(_) => Err(ErrorKind::Unauthorized),
    }
}

/// Whether `authorization` is `Bearer <key>` (scheme case-insensitive, spaces around the
/// token ignored), compared in constant time: `--api-key` and `--admin-api-key` alike.
pub fn bearer_matches(key: &str, authorization: Option<&[u8]>) -> bool {
    let presented = authorization.map(trim_ascii).and_then(|v| {
        let scheme = v.get(..7)?;
        scheme
            .eq_ignore_ascii_case(b"bearer ")
            .then(|| trim_ascii(&v[7..]))
    });
    presented.is_some_and(|token| constant_time_eq(token, key.as_bytes()))
}

fn trim_ascii(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &v[start..end]
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[derive(Deserialize)]
struct AddWorkerBody {
    url: String,
    /// Where it publishes KV events (`--kv-events-endpoints` syntax); absent: ask the worker.
    kv_events_endpoint: Option<String>,
    /// SMG's worker type: `regular`, or `prefill`/`decode` under `--pd-disaggregation`.
    worker_type: Option<String>,
    /// A prefill worker's bootstrap port (SMG's field: a number, or `null` for none).
    bootstrap_port: Option<serde_json::Value>,
    /// SMG's connection mode: `http` or `grpc`, as the URL's scheme says.
    connection_mode: Option<String>,
}

/// The fields of SMG's worker spec (`POST /workers`) kvgate accepts without using them: a
/// request written for SMG is admitted, and the answer lists what was not applied. Any other
/// field is refused, so a misspelt one is not silently dropped.
const SMG_FIELDS_NOT_USED: [&str; 28] = [
    "model_id",
    "models",
    "runtime_type",
    "runtime",
    "provider",
    "labels",
    "priority",
    "cost",
    "api_key",
    "bootstrap_host",
    "dp_base_url",
    "dp_rank",
    "dp_size",
    "kv_connector",
    "kv_role",
    "kv_engine_id",
    "kv_block_size",
    "health",
    "http_pool",
    "resilience",
    "overload",
    "max_connection_attempts",
    "load_monitor_interval_secs",
    "multimodal_tensor_transport",
    "multimodal_shm_min_bytes",
    "zmq_handshake_address",
    "tokenizer_path",
    "chat_template",
];

/// A `POST /workers` body, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddWorker {
    /// The URL in its one spelling ([`WorkerUrl::canonical`]).
    pub url: String,
    /// Its KV-event endpoint as given (checked against the URL's host).
    pub kv_events: KvEventsSource,
    /// Regular, prefill (with its bootstrap port) or decode (`worker_type`); whether the
    /// gateway's mode takes it is the caller's check.
    pub role: WorkerRole,
    /// SMG worker-spec fields given that kvgate does not apply, in the body's order.
    pub not_applied: Vec<String>,
}

/// Parse and validate a `POST /workers` body (`{"url": ..., "kv_events_endpoint": ...}`, or
/// SMG's worker spec: its fields kvgate does not use are accepted and reported back in
/// [`AddWorker::not_applied`]; a prefill/decode worker or a gRPC one is refused). The caller
/// then probes the worker's health and only registers it when the probe succeeds.
pub fn parse_add_worker(body: &[u8]) -> Result<AddWorker, AdminError> {
    if body.len() > ADMIN_BODY_BYTES_MAX {
        return Err(AdminError::new(
            413,
            "invalid_request_error",
            "admin request body too large",
        ));
    }
    let bad = |e: String| AdminError::new(400, "invalid_request_error", e);
    let expected =
        |e: &dyn std::fmt::Display| bad(format!("expected {{\"url\": \"http://host:port\"}}: {e}"));
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| expected(&e))?;
    let mut not_applied = Vec::new();
    for name in fields.keys() {
        match name.as_str() {
            "url" | "kv_events_endpoint" | "worker_type" | "connection_mode" | "bootstrap_port" => {
            }
            known if SMG_FIELDS_NOT_USED.contains(&known) => not_applied.push(known.to_string()),
            unknown => return Err(expected(&format!("unknown field `{unknown}`"))),
        }
    }
    for name in &not_applied {
        fields.remove(name);
    }
    let parsed: AddWorkerBody =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| expected(&e))?;
    let role = add_worker_role(&parsed).map_err(bad)?;
    let url = WorkerUrl::parse(&parsed.url).map_err(|e| bad(e.to_string()))?;
    match (parsed.connection_mode.as_deref(), url.protocol) {
        (None, _) | (Some("http"), WorkerProtocol::Http) | (Some("grpc"), WorkerProtocol::Grpc(_)) => {}
        (Some(other), _) => {
            return Err(bad(format!(
                "connection_mode {other}: the URL's scheme says otherwise (HTTP workers are http://, gRPC workers grpc://)"
            )))
        }
    }
    let kv_events = match &parsed.kv_events_endpoint {
        None => KvEventsSource::Discover,
        Some(text) => KvEventsSource::parse(text, &url.host)
            .map_err(|e| bad(format!("kv_events_endpoint: {e}")))?,
    };
    Ok(AddWorker {
        url: url.canonical(),
        kv_events,
        role,
        not_applied,
    })
}

/// The role `worker_type` and `bootstrap_port` give (SMG's fields): a bootstrap port only for a
/// prefill worker, a number 1-65535, `null` or `"none"`.
fn add_worker_role(parsed: &AddWorkerBody) -> Result<WorkerRole, String> {
    let bootstrap_port = match &parsed.bootstrap_port {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => {
            parse_bootstrap_port(&n.to_string()).map_err(|e| format!("bootstrap_port: {e}"))?
        }
        Some(serde_json::Value::String(text)) => {
            parse_bootstrap_port(text).map_err(|e| format!("bootstrap_port: {e}"))?
        }
        Some(other) => return Err(format!("bootstrap_port {other}: expected a port or null")),
    };
    let role = match parsed.worker_type.as_deref() {
        None | Some("regular") => WorkerRole::Regular,
        Some("prefill") => WorkerRole::Prefill { bootstrap_port },
        Some("decode") => WorkerRole::Decode,
        Some("encode") => {
            return Err("worker_type encode: not supported (kvgate has no encode stage)".into())
        }
        Some(other) => {
            return Err(format!(
                "worker_type {other}: expected \"regular\", \"prefill\" or \"decode\""
            ))
        }
    };
    if bootstrap_port.is_some() && !matches!(role, WorkerRole::Prefill { .. }) {
        return Err(format!(
            "bootstrap_port: only a prefill worker has one (worker_type {})",
            role.name()
        ));
    }
    Ok(role)
}

/// One worker as `GET /workers` reports it.
#[derive(Debug, Clone)]
pub struct WorkerReport<'a> {
    /// Dense id.
    pub id: WorkerId,
    /// URL as registered.
    pub url: &'a str,
    /// Regular, prefill or decode (SMG's `worker_type`, with `bootstrap_port`).
    pub role: WorkerRole,
    /// Health-check verdict.
    pub healthy: bool,
    /// Circuit state.
    pub breaker: BreakerState,
    /// Draining after a `DELETE`: no new requests.
    pub draining: bool,
    /// Requests in flight, summed over data cores.
    pub in_flight: u64,
    /// Models from `/v1/models`; `None` when discovery has not succeeded.
    pub models: Option<&'a [ListedModel]>,
    /// The last load report, if any.
    pub load: Option<&'a LoadReport>,
}

/// The `GET /workers` body: `{"workers":[{id,url,healthy,circuit_breaker,...}],"total":n}`.
pub fn render_worker_list(workers: &[WorkerReport<'_>]) -> String {
    let list: Vec<serde_json::Value> = workers
        .iter()
        .map(|w| {
            serde_json::json!({
                "id": w.id.0,
                "url": w.url,
                "worker_type": w.role.name(),
                "bootstrap_port": w.role.bootstrap_port(),
                "healthy": w.healthy,
                "circuit_breaker": w.breaker.as_str(),
                "draining": w.draining,
                "in_flight": w.in_flight,
                "models": w.models.map(|m| m.iter().map(|m| m.id.as_str()).collect::<Vec<_>>()),
                "load": w.load.map(|r| serde_json::json!({
                    "running_requests": r.running_requests,
                    "waiting_requests": r.waiting_requests,
                    "token_usage": r.token_usage,
                    "gen_throughput": r.gen_throughput_tps,
                    "cache_hit_rate": r.cache_hit_rate,
                })),
            })
        })
        .collect();
    serde_json::json!({"workers": list, "total": workers.len()}).to_string()
}

/// Where a draining worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStep {
    /// Requests still in flight and time left: keep waiting.
    Wait,
    /// Drained (or out of time): purge it from every index and free its slot.
    Purge,
}

/// The drain of one removed worker, started when its `DELETE` was accepted.
#[derive(Debug, Clone, Copy)]
pub struct DrainClock {
    started: Instant,
    timeout: Duration,
}

impl DrainClock {
    /// A drain that started at `started` and may last `timeout`.
    pub fn new(started: Instant, timeout: Duration) -> Self {
        DrainClock { started, timeout }
    }

    /// Decide, given the worker's current in-flight count.
    pub fn step(&self, in_flight: u64, now: Instant) -> DrainStep {
        if in_flight == 0 || now.saturating_duration_since(self.started) >= self.timeout {
            DrainStep::Purge
        } else {
            DrainStep::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::spec::KvEventsEndpoint;

    #[test]
    fn routes() {
        assert_eq!(
            route_admin("GET", "/workers"),
            Some(Ok(AdminRoute::ListWorkers))
        );
        assert_eq!(
            route_admin("GET", "/workers?x=1"),
            Some(Ok(AdminRoute::ListWorkers))
        );
        assert_eq!(
            route_admin("POST", "/workers/"),
            Some(Ok(AdminRoute::AddWorker))
        );
        assert_eq!(
            route_admin("DELETE", "/workers/7"),
            Some(Ok(AdminRoute::RemoveWorker(WorkerRef::Id(WorkerId(7)))))
        );
        assert_eq!(
            route_admin("DELETE", "/workers/http%3A%2F%2F127.0.0.1%3A8000"),
            Some(Ok(AdminRoute::RemoveWorker(WorkerRef::Url(
                "http://127.0.0.1:8000".into()
            ))))
        );
        assert_eq!(
            route_admin("PUT", "/workers").unwrap().unwrap_err().status,
            405
        );
        assert_eq!(
            route_admin("GET", "/workers/3")
                .unwrap()
                .unwrap_err()
                .status,
            405
        );
        assert_eq!(
            route_admin("DELETE", "/workers/99999")
                .unwrap()
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            route_admin("DELETE", "/workers/%zz")
                .unwrap()
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            route_admin("DELETE", "/workers/")
                .unwrap()
                .unwrap_err()
                .status,
            405
        );
        assert_eq!(route_admin("GET", "/v1/models"), None);
        assert_eq!(route_admin("GET", "/workersx"), None);
    }

    #[test]
    fn auth() {
        assert!(check_access(&AdminAccess::Open, None).is_ok());
        for authorization in [None, Some(&b"Bearer x"[..])] {
            let closed = check_access(&AdminAccess::Closed, authorization).unwrap_err();
            assert_eq!((closed, closed.status()), (ErrorKind::AdminClosed, 403));
            assert!(
                closed.message().contains("--admin-api-insecure"),
                "{}",
                closed.message()
            );
        }
        let key = AdminAccess::Bearer("s3cret".into());
        assert!(check_access(&key, Some(b"Bearer s3cret")).is_ok());
        assert!(check_access(&key, Some(b"bearer  s3cret ")).is_ok());
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"s3cret",
            b"Basic s3cret",
            b"Bearer",
            b"\xff\xfe",
        ] {
            assert_eq!(check_access(&key, Some(bad)), Err(ErrorKind::Unauthorized));
        }
        let refused = check_access(&key, None).unwrap_err();
        assert_eq!(refused.status(), 401);
        assert!(refused.message().contains("--admin-api-key"));
    }

    #[test]
    fn add_worker_body_validation() {
        let added = parse_add_worker(br#"{"url":"http://127.0.0.1:8000/"}"#).unwrap();
        assert_eq!(added.url, "http://127.0.0.1:8000");
        assert_eq!(added.kv_events, KvEventsSource::Discover);
        let body =
            br#"{"url":"http://10.1.2.3:8000","kv_events_endpoint":"tcp://*:5557+tcp://*:5558"}"#;
        let added = parse_add_worker(body).unwrap();
        let endpoint = KvEventsEndpoint {
            publisher: "tcp://10.1.2.3:5557".into(),
            replay: Some("tcp://10.1.2.3:5558".into()),
        };
        assert_eq!(added.kv_events, KvEventsSource::At(endpoint));
        let none = br#"{"url":"http://x:1","kv_events_endpoint":"none"}"#;
        assert_eq!(
            parse_add_worker(none).unwrap().kv_events,
            KvEventsSource::Off
        );
        let error = parse_add_worker(br#"{"url":"http://x:1","kv_events_endpoint":"udp://x:1"}"#)
            .unwrap_err();
        assert_eq!(error.status, 400);
        assert!(
            error.message.contains("kv_events_endpoint"),
            "{}",
            error.message
        );
        for bad in [
            &br#"{"url":"ftp://x:1"}"#[..],
            br#"{"url":"http://x:"}"#,
            br#"{"url":"http://x:1/path"}"#,
            br#"{"url":3}"#,
            br#"{}"#,
            br#"{"url":"http://x:1","extra":true}"#,
            b"not json",
        ] {
            let e = parse_add_worker(bad).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(bad));
            assert!(e.to_json().contains("\"code\":400"));
        }
        assert_eq!(
            parse_add_worker(&vec![b' '; ADMIN_BODY_BYTES_MAX + 1])
                .unwrap_err()
                .status,
            413
        );
    }

    #[test]
    fn smgs_worker_spec_is_accepted_and_its_unused_fields_listed() {
        let body = br#"{"url":"http://10.0.0.1:8000","model_id":"llama","worker_type":"regular",
            "connection_mode":"http","priority":50,"cost":1.0,"labels":{"zone":"a"},
            "api_key":"k","kv_events_endpoint":"none"}"#;
        let added = parse_add_worker(body).unwrap();
        assert_eq!(added.url, "http://10.0.0.1:8000");
        assert_eq!(added.kv_events, KvEventsSource::Off);
        let mut listed = added.not_applied.clone();
        listed.sort();
        assert_eq!(
            listed,
            ["api_key", "cost", "labels", "model_id", "priority"]
        );
        let plain = parse_add_worker(br#"{"url":"http://x:1"}"#).unwrap();
        assert!(plain.not_applied.is_empty());
        let grpc = parse_add_worker(br#"{"url":"GRPC://X:50051","connection_mode":"grpc"}"#);
        assert_eq!(grpc.unwrap().url, "grpc://x:50051");
        for (body, says) in [
            (
                &br#"{"url":"http://x:1","worker_type":"encode"}"#[..],
                "encode",
            ),
            (
                br#"{"url":"http://x:1","worker_type":"decode","bootstrap_port":9}"#,
                "only a prefill worker",
            ),
            (
                br#"{"url":"http://x:1","worker_type":"prefill","bootstrap_port":0}"#,
                "1-65535",
            ),
            (br#"{"url":"http://x:1","worker_type":"odd"}"#, "regular"),
            (br#"{"url":"http://x:1","connection_mode":"grpc"}"#, "HTTP"),
            (
                br#"{"url":"grpc://x:1","connection_mode":"http"}"#,
                "grpc://",
            ),
            (
                br#"{"url":"http://x:1","model_idd":"m"}"#,
                "unknown field `model_idd`",
            ),
            (
                br#"{"url":"http://x:1","priority":"high","worker_type":3}"#,
                "expected",
            ),
        ] {
            let e = parse_add_worker(body).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    #[test]
    fn smgs_worker_type_and_bootstrap_port_give_the_role() {
        let role = |body: &[u8]| parse_add_worker(body).unwrap().role;
        assert_eq!(role(br#"{"url":"http://x:1"}"#), WorkerRole::Regular);
        assert_eq!(
            role(br#"{"url":"http://x:1","worker_type":"prefill","bootstrap_port":8998}"#),
            WorkerRole::Prefill {
                bootstrap_port: Some(8998)
            }
        );
        assert_eq!(
            role(br#"{"url":"http://x:1","worker_type":"prefill","bootstrap_port":null}"#),
            WorkerRole::Prefill {
                bootstrap_port: None
            }
        );
        assert_eq!(
            role(br#"{"url":"http://x:1","worker_type":"decode"}"#),
            WorkerRole::Decode
        );
        let added = parse_add_worker(br#"{"url":"http://x:1","bootstrap_port":null}"#).unwrap();
        assert!(added.not_applied.is_empty());
    }

    #[test]
    fn worker_list_renders() {
        let models = crate::workers::catalog::parse_models(br#"{"data":[{"id":"m"}]}"#).unwrap();
        let load = LoadReport {
            running_requests: 2,
            waiting_requests: 1,
            ..LoadReport::default()
        };
        let views = [WorkerReport {
            id: WorkerId(4),
            url: "http://127.0.0.1:9",
            role: WorkerRole::Prefill {
                bootstrap_port: Some(8998),
            },
            healthy: false,
            breaker: BreakerState::Open,
            draining: true,
            in_flight: 3,
            models: Some(&models),
            load: Some(&load),
        }];
        let v: serde_json::Value = serde_json::from_str(&render_worker_list(&views)).unwrap();
        assert_eq!(v["total"], 1);
        assert_eq!(v["workers"][0]["id"], 4);
        assert_eq!(v["workers"][0]["circuit_breaker"], "open");
        assert_eq!(v["workers"][0]["worker_type"], "prefill");
        assert_eq!(v["workers"][0]["bootstrap_port"], 8998);
        assert_eq!(v["workers"][0]["in_flight"], 3);
        assert_eq!(v["workers"][0]["models"][0], "m");
        assert_eq!(v["workers"][0]["load"]["waiting_requests"], 1);
    }

    #[test]
    fn drain_waits_for_in_flight_or_timeout() {
        let t0 = Instant::now();
        let d = DrainClock::new(t0, Duration::from_secs(30));
        assert_eq!(d.step(2, t0 + Duration::from_secs(1)), DrainStep::Wait);
        assert_eq!(d.step(0, t0 + Duration::from_secs(1)), DrainStep::Purge);
        assert_eq!(d.step(2, t0 + Duration::from_secs(30)), DrainStep::Purge);
    }
}
