//! The admin API: `GET/POST /workers`, `DELETE /workers/{id}`, guarded by `--admin-api-key`,
//! plus model discovery (`/v1/models` of each worker) and the worker flags ([`args`]).
//!
//! Owns the pure logic the control core serves on the main port: [`route_admin`] (which admin
//! endpoint a request is), [`check_auth`] (bearer token, 401 otherwise), [`parse_add_worker`]
//! (`{"url": "http://host:port"}`, validated before the health probe), [`WorkerRef`] (a worker
//! named by dense id or by URL), [`render_worker_list`] (the `GET /workers` JSON),
//! [`DrainClock`] (how long a removed worker may drain before it is purged), [`parse_models`] and
//! [`ModelCatalog`] (which workers serve which model; an unknown model is a 404). Every failure
//! is an [`AdminError`] that knows its HTTP status and renders SMG's JSON error body.

pub mod args;
pub mod driver;
pub mod serve;
pub mod shared;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::breaker::{render_cb_state, BreakerState};
use super::health::probe::HttpUrl;
use super::load::{render_engine_gauges, LoadReport};
use super::WorkerId;

pub use args::{ArgError, WorkerArgs, WorkerConfig};

/// The largest admin request body read: `{"url": ...}` is tiny; anything bigger is abuse.
pub const ADMIN_BODY_BYTES_MAX: usize = 16 << 10;

/// The most models one worker may list in `/v1/models`: engines serve one model plus a few
/// LoRA adapters; a bound keeps a malformed answer from growing the catalog without limit.
pub const MODELS_PER_WORKER_MAX: usize = 256;

/// The longest model id kept (HF ids are well under this).
pub const MODEL_ID_BYTES_MAX: usize = 512;

/// How long a removed worker may drain its in-flight requests before it is purged anyway. A
/// long generation can outlive any drain; SMG's default request timeout is 1800 s, and an
/// operator removing a worker wants it gone well before that.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

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
    pub(crate) fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        AdminError {
            status,
            kind,
            message: message.into(),
        }
    }

    /// `{"error":{"message","type","code"}}`, the gateway's JSON error shape.
    pub fn to_json(&self) -> String {
        serde_json::json!({
            "error": {"message": self.message, "type": self.kind, "code": self.status}
        })
        .to_string()
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
    HttpUrl::parse(&url).map_err(|_| bad())?;
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

/// Check the bearer token when `--admin-api-key` is set. `authorization` is the raw
/// `Authorization` header value, if any. Constant-time in the key length.
pub fn check_auth(api_key: Option<&str>, authorization: Option<&[u8]>) -> Result<(), AdminError> {
    let Some(key) = api_key else { return Ok(()) };
    let presented = authorization
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::trim)
        .and_then(|v| {
            v.get(..7)
                .filter(|p| p.eq_ignore_ascii_case("bearer "))
                .map(|_| v[7..].trim())
        });
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), key.as_bytes()) => Ok(()),
        _ => Err(AdminError::new(
            401,
            "authentication_error",
            "admin API requires Authorization: Bearer <--admin-api-key>",
        )),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, &x) in b.iter().enumerate() {
        diff |= x ^ a.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddWorkerBody {
    url: String,
}

/// Parse and validate a `POST /workers` body. The caller then probes the worker's health and
/// only registers it when the probe succeeds.
pub fn parse_add_worker(body: &[u8]) -> Result<String, AdminError> {
    if body.len() > ADMIN_BODY_BYTES_MAX {
        return Err(AdminError::new(
            413,
            "invalid_request_error",
            "admin request body too large",
        ));
    }
    let parsed: AddWorkerBody = serde_json::from_slice(body).map_err(|e| {
        AdminError::new(
            400,
            "invalid_request_error",
            format!("expected {{\"url\": \"http://host:port\"}}: {e}"),
        )
    })?;
    HttpUrl::parse(&parsed.url)
        .map_err(|e| AdminError::new(400, "invalid_request_error", e.to_string()))?;
    Ok(parsed.url.trim_end_matches('/').to_string())
}

/// One worker as the admin API and the metrics endpoint see it.
#[derive(Debug, Clone)]
pub struct WorkerView<'a> {
    /// Dense id.
    pub id: WorkerId,
    /// URL as registered.
    pub url: &'a str,
    /// Health-check verdict.
    pub healthy: bool,
    /// Circuit state.
    pub breaker: BreakerState,
    /// Draining after a `DELETE`: no new requests.
    pub draining: bool,
    /// Requests in flight, summed over data cores.
    pub in_flight: u64,
    /// Models from `/v1/models`; `None` when discovery has not succeeded.
    pub models: Option<&'a [String]>,
    /// The last load report, if any.
    pub load: Option<&'a LoadReport>,
}

/// The `GET /workers` body: `{"workers":[{id,url,healthy,circuit_breaker,...}],"total":n}`.
pub fn render_worker_list(workers: &[WorkerView<'_>]) -> String {
    let list: Vec<serde_json::Value> = workers
        .iter()
        .map(|w| {
            serde_json::json!({
                "id": w.id.0,
                "url": w.url,
                "healthy": w.healthy,
                "circuit_breaker": w.breaker.as_str(),
                "draining": w.draining,
                "in_flight": w.in_flight,
                "models": w.models,
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

/// Append every per-worker gauge this module family owns (`smg_engine_*`, `smg_worker_cb_state`)
/// to a Prometheus text page.
pub fn render_worker_metrics(out: &mut String, workers: &[WorkerView<'_>]) {
    render_engine_gauges(out, workers.iter().map(|w| (w.url, w.load)));
    render_cb_state(out, workers.iter().map(|w| (w.url, w.breaker)));
    out.push_str("# HELP smg_worker_health Worker health-check verdict (1 healthy)\n");
    out.push_str("# TYPE smg_worker_health gauge\n");
    for w in workers {
        let _ = writeln!(
            out,
            "smg_worker_health{{worker=\"{}\"}} {}",
            super::load::escape_label(w.url),
            u8::from(w.healthy)
        );
    }
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

#[derive(Deserialize)]
struct ModelsBody {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

/// Parse an OpenAI-style `/v1/models` body (`{"data":[{"id":...}]}`) into model ids.
pub fn parse_models(body: &[u8]) -> Result<Vec<String>, AdminError> {
    let malformed =
        |m: String| AdminError::new(502, "upstream_error", format!("malformed /v1/models: {m}"));
    let parsed: ModelsBody = serde_json::from_slice(body).map_err(|e| malformed(e.to_string()))?;
    if parsed.data.len() > MODELS_PER_WORKER_MAX {
        return Err(malformed(format!("{} models listed", parsed.data.len())));
    }
    let mut ids: Vec<String> = Vec::with_capacity(parsed.data.len());
    for entry in parsed.data {
        if entry.id.is_empty() || entry.id.len() > MODEL_ID_BYTES_MAX {
            return Err(malformed("empty or oversized model id".to_string()));
        }
        if !ids.contains(&entry.id) {
            ids.push(entry.id);
        }
    }
    Ok(ids)
}

/// Which workers serve which model, built by the control core from discovery results and
/// published as an immutable snapshot. Workers whose models are unknown (discovery failed or
/// not yet run) serve every model: no signal is never a penalty.
#[derive(Debug, Clone, Default)]
pub struct ModelCatalog {
    by_model: HashMap<String, Vec<WorkerId>>,
    wildcard: Vec<WorkerId>,
}

/// The workers a request for a model may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelWorkers<'a> {
    /// No restriction: every eligible worker.
    Any,
    /// Only the workers serving the model, plus those whose models are unknown.
    Only {
        /// Workers that list the model.
        serving: &'a [WorkerId],
        /// Workers whose model list is unknown (they serve anything).
        wildcard: &'a [WorkerId],
    },
}

impl ModelWorkers<'_> {
    /// Whether worker `id` may serve the request.
    pub fn allows(&self, id: WorkerId) -> bool {
        match self {
            ModelWorkers::Any => true,
            ModelWorkers::Only { serving, wildcard } => {
                serving.contains(&id) || wildcard.contains(&id)
            }
        }
    }
}

/// The `model` field of a routed request body, validating the whole body as JSON on the way
/// (a single pass, no document built). `Ok(None)`: no `model` field, or not an object.
pub fn request_model(body: &[u8]) -> Result<Option<String>, serde_json::Error> {
    serde_json::from_slice::<ModelField>(body).map(|m| m.0)
}

/// Deserializes any JSON value, keeping only a top-level string `model` field.
struct ModelField(Option<String>);

impl<'de> Deserialize<'de> for ModelField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ModelFieldVisitor)
    }
}

struct ModelFieldVisitor;

impl<'de> serde::de::Visitor<'de> for ModelFieldVisitor {
    type Value = ModelField;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ModelField, A::Error> {
        let mut model = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "model" && model.is_none() {
                model = map.next_value::<Option<String>>()?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(ModelField(model))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ModelField, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(ModelField(None))
    }

    fn visit_bool<E>(self, _: bool) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
    fn visit_unit<E>(self) -> Result<ModelField, E> {
        Ok(ModelField(None))
    }
}

impl ModelCatalog {
    /// Build from each worker's discovery result.
    pub fn build<'a>(workers: impl Iterator<Item = (WorkerId, Option<&'a [String]>)>) -> Self {
        let mut catalog = ModelCatalog::default();
        for (id, models) in workers {
            match models {
                None => catalog.wildcard.push(id),
                Some(models) => {
                    for m in models {
                        catalog.by_model.entry(m.clone()).or_default().push(id);
                    }
                }
            }
        }
        catalog
    }

    /// Workers that serve every model.
    pub fn wildcard(&self) -> &[WorkerId] {
        &self.wildcard
    }

    /// Resolve a request's model. A request without a model, or a catalog where no worker
    /// listed models, is unrestricted. An unknown model with no wildcard worker is a 404.
    pub fn workers_for(&self, model: Option<&str>) -> Result<ModelWorkers<'_>, AdminError> {
        let Some(model) = model.filter(|m| !m.is_empty()) else {
            return Ok(ModelWorkers::Any);
        };
        if self.by_model.is_empty() {
            return Ok(ModelWorkers::Any);
        }
        let wildcard = &self.wildcard[..];
        match self.by_model.get(model) {
            Some(serving) => Ok(ModelWorkers::Only { serving, wildcard }),
            None if !wildcard.is_empty() => Ok(ModelWorkers::Only {
                serving: &[],
                wildcard,
            }),
            None => Err(AdminError::new(
                404,
                "model_not_found",
                format!("model {model:?} is not served by any worker (see GET /v1/models)"),
            )),
        }
    }

    /// Every model id served, sorted (for the gateway's own `/v1/models`).
    pub fn models(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self.by_model.keys().map(String::as_str).collect();
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(check_auth(None, None).is_ok());
        assert!(check_auth(Some("s3cret"), Some(b"Bearer s3cret")).is_ok());
        assert!(check_auth(Some("s3cret"), Some(b"bearer  s3cret ")).is_ok());
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"s3cret",
            b"Basic s3cret",
            b"Bearer",
            b"\xff\xfe",
        ] {
            assert_eq!(
                check_auth(Some("s3cret"), Some(bad)).unwrap_err().status,
                401
            );
        }
        assert_eq!(check_auth(Some("s3cret"), None).unwrap_err().status, 401);
    }

    #[test]
    fn add_worker_body_validation() {
        assert_eq!(
            parse_add_worker(br#"{"url":"http://127.0.0.1:8000/"}"#).unwrap(),
            "http://127.0.0.1:8000"
        );
        for bad in [
            &br#"{"url":"ftp://x:1"}"#[..],
            br#"{"url":"http://x"}"#,
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
    fn worker_list_and_metrics_render() {
        let models = vec!["m".to_string()];
        let load = LoadReport {
            running_requests: 2,
            waiting_requests: 1,
            ..LoadReport::default()
        };
        let views = [WorkerView {
            id: WorkerId(4),
            url: "http://127.0.0.1:9",
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
        assert_eq!(v["workers"][0]["in_flight"], 3);
        assert_eq!(v["workers"][0]["models"][0], "m");
        assert_eq!(v["workers"][0]["load"]["waiting_requests"], 1);
        let mut page = String::new();
        render_worker_metrics(&mut page, &views);
        assert!(page.contains("smg_worker_cb_state{worker=\"http://127.0.0.1:9\"} 1\n"));
        assert!(page.contains("smg_engine_running_requests{worker=\"http://127.0.0.1:9\"} 2\n"));
        assert!(page.contains("smg_worker_health{worker=\"http://127.0.0.1:9\"} 0\n"));
    }

    #[test]
    fn drain_waits_for_in_flight_or_timeout() {
        let t0 = Instant::now();
        let d = DrainClock::new(t0, Duration::from_secs(30));
        assert_eq!(d.step(2, t0 + Duration::from_secs(1)), DrainStep::Wait);
        assert_eq!(d.step(0, t0 + Duration::from_secs(1)), DrainStep::Purge);
        assert_eq!(d.step(2, t0 + Duration::from_secs(30)), DrainStep::Purge);
    }

    #[test]
    fn models_parse_and_reject_malformed() {
        let ids = parse_models(
            br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"},{"id":"a"}]}"#,
        )
        .unwrap();
        assert_eq!(ids, vec!["a", "b"]);
        for bad in [
            &b"{}"[..],
            br#"{"data":[{"id":""}]}"#,
            br#"{"data":[{"name":"x"}]}"#,
            b"[]",
        ] {
            assert_eq!(parse_models(bad).unwrap_err().status, 502);
        }
        let many: Vec<String> = (0..=MODELS_PER_WORKER_MAX)
            .map(|i| format!(r#"{{"id":"m{i}"}}"#))
            .collect();
        assert!(parse_models(format!(r#"{{"data":[{}]}}"#, many.join(",")).as_bytes()).is_err());
    }

    #[test]
    fn request_model_reads_only_the_top_level_field_and_validates_json() {
        assert_eq!(
            request_model(br#"{"model":"m","messages":[{"model":"x"}]}"#).unwrap(),
            Some("m".into())
        );
        assert_eq!(
            request_model(br#"{"messages":[],"model":null}"#).unwrap(),
            None
        );
        assert_eq!(request_model(br#"{"prompt":"hi"}"#).unwrap(), None);
        assert_eq!(request_model(br#"[1,{"model":"x"}]"#).unwrap(), None);
        assert_eq!(request_model(b"3").unwrap(), None);
        assert!(request_model(br#"{"model":"m""#).is_err());
        assert!(request_model(br#"{"model":3}"#).is_err());
        assert!(request_model(b"not json").is_err());
        assert!(request_model(br#"{"a":1} trailing"#).is_err());
    }

    #[test]
    fn catalog_routes_by_model() {
        let a = ["llama".to_string()];
        let b = ["llama".to_string(), "qwen".to_string()];
        let catalog = ModelCatalog::build(
            [(WorkerId(0), Some(&a[..])), (WorkerId(1), Some(&b[..]))].into_iter(),
        );
        assert_eq!(catalog.workers_for(None), Ok(ModelWorkers::Any));
        assert_eq!(catalog.workers_for(Some("")), Ok(ModelWorkers::Any));
        let llama = catalog.workers_for(Some("llama")).unwrap();
        assert!(llama.allows(WorkerId(0)) && llama.allows(WorkerId(1)));
        assert!(!llama.allows(WorkerId(2)));
        let qwen = catalog.workers_for(Some("qwen")).unwrap();
        assert!(!qwen.allows(WorkerId(0)) && qwen.allows(WorkerId(1)));
        let e = catalog.workers_for(Some("gpt")).unwrap_err();
        assert_eq!(e.status, 404);
        assert!(e.message.contains("gpt"));
        assert_eq!(catalog.models(), vec!["llama", "qwen"]);
        // A worker with unknown models keeps every model routable.
        let with_wild =
            ModelCatalog::build([(WorkerId(0), Some(&a[..])), (WorkerId(2), None)].into_iter());
        let gpt = with_wild.workers_for(Some("gpt")).unwrap();
        assert!(gpt.allows(WorkerId(2)) && !gpt.allows(WorkerId(0)));
        assert_eq!(with_wild.wildcard(), &[WorkerId(2)]);
        // Nobody listed models: no restriction.
        let empty = ModelCatalog::build([(WorkerId(0), None)].into_iter());
        assert_eq!(empty.workers_for(Some("gpt")), Ok(ModelWorkers::Any));
    }
}
