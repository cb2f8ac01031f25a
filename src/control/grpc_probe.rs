//! Probing a `grpc://` worker from the control core: the same probe jobs as an HTTP worker's,
//! answered by the engine's gRPC calls on the control core's own connections (`grpc::Channels`)
//! and handed back in the shape the HTTP probes produce, so the monitor, the health tracker and
//! the load parser see no difference: `HealthCheck` is a 200 (healthy) or 503, `GetLoads` is a
//! `/v1/loads` body, `GetModelInfo` a `/v1/models` body. Owns [`run_grpc_probe`].
//!
//! The worker's backend is `--backend`'s, or detected on first contact (SMG's order: SGLang,
//! then vLLM) and remembered with its connections. A failed call forgets the worker's
//! connections (a restarted engine breaks them all); failures are `ProxyError`s like an HTTP
//! probe's, never panics.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use crate::ids::WorkerId;
use crate::workers::catalog::{parse_models, ListedModel};
use crate::workers::spec::WorkerSpec;

use super::monitor::{ProbeJob, ProbeKind};
use crate::error::{ErrorKind, ProxyError};
use crate::grpc::{backend, connection_for, Backend, CallError, Channels};
use crate::net::client::ClientResponse;
use crate::workers::load::LoadEndpoint;

/// Runs `job` against a gRPC worker whose backend is `configured` (or to be detected); the
/// answer as an HTTP probe would have it, and the kind that answered.
pub async fn run_grpc_probe(
    job: &ProbeJob,
    configured: Option<Backend>,
    channels: &RefCell<Channels>,
) -> (ProbeKind, Result<ClientResponse, ProxyError>) {
    // A gRPC worker's load always comes as `/v1/loads` JSON.
    let kind = match job.kind {
        ProbeKind::Load(_) => ProbeKind::Load(LoadEndpoint::V1Loads),
        ref other => other.clone(),
    };
    let answer = probe_answer(job, configured, channels);
    let response = match monoio::time::timeout(job.timeout, answer).await {
        Ok(response) => response,
        Err(_) => Err(ProxyError::upstream(
            ErrorKind::UpstreamTimeout,
            "gRPC probe timed out",
        )),
    };
    if response.is_err() {
        channels.borrow_mut().forget(job.id);
    }
    (kind, response)
}

async fn probe_answer(
    job: &ProbeJob,
    configured: Option<Backend>,
    channels: &RefCell<Channels>,
) -> Result<ClientResponse, ProxyError> {
    if channels.borrow().bearer() != job.bearer.as_ref() {
        channels.borrow_mut().set_bearer(job.bearer.clone());
    }
    let connection = connection_for(channels, job.id, job.addr)
        .await
        .map_err(|e| {
            ProxyError::upstream(ErrorKind::UpstreamConnect, "gRPC probe connect")
                .because(std::io::Error::other(e))
        })?;
    let authority = job.authority.as_str();
    let known = configured.or_else(|| channels.borrow().backend(job.id));
    let backend = match known {
        Some(backend) => backend,
        None => {
            let detected = backend::detect(&connection, authority)
                .await
                .map_err(call_failed)?;
            channels.borrow_mut().set_backend(job.id, detected);
            detected
        }
    };
    let answered = match job.kind {
        ProbeKind::Health => {
            backend::health(&connection, authority, backend)
                .await
                .map(|healthy| ClientResponse {
                    status: if healthy { 200 } else { 503 },
                    body: Vec::new(),
                })
        }
        ProbeKind::Load(_) => backend::loads_as_v1_json(&connection, authority, backend)
            .await
            .map(|body| ClientResponse { status: 200, body }),
        ProbeKind::Models => backend::models_as_v1_json(&connection, authority, backend)
            .await
            .map(|body| ClientResponse { status: 200, body }),
    };
    match answered {
        // A worker that answers with a status answers: its HTTP equivalent is a status too.
        Err(CallError::Status(status)) => Ok(ClientResponse {
            status: status.code.http_status(),
            body: status.message.into_bytes(),
        }),
        other => other.map_err(call_failed),
    }
}

/// A call that failed without a status: the worker is unreachable or broken.
fn call_failed(error: CallError) -> ProxyError {
    let kind = match error {
        CallError::Malformed(_) => ErrorKind::UpstreamMalformed,
        _ => ErrorKind::UpstreamClosed,
    };
    ProxyError::upstream(kind, "gRPC probe").because(std::io::Error::other(error))
}

/// The admission check of `POST /workers` for a gRPC worker: its `HealthCheck` must say
/// healthy (the backend detected on the way when not configured); then its model is read
/// (`None` when that fails: the worker then serves any model). `Err` says why it is refused.
pub async fn admit_grpc_worker(
    spec: &WorkerSpec,
    configured: Option<Backend>,
    timeout: Duration,
    bearer: Option<Arc<str>>,
) -> Result<Option<Vec<ListedModel>>, String> {
    let channels = RefCell::new(Channels::new());
    let job = |kind| ProbeJob {
        id: WorkerId(0),
        addr: spec.addr,
        authority: spec.authority.clone(),
        kind,
        path: String::new(),
        timeout,
        scheme: spec.scheme,
        protocol: spec.protocol,
        bearer: bearer.clone(),
    };
    let (_, health) = run_grpc_probe(&job(ProbeKind::Health), configured, &channels).await;
    match health {
        Ok(r) if r.status == 200 => {}
        Ok(r) => return Err(format!("gRPC HealthCheck answered {}", r.status)),
        Err(e) => return Err(format!("gRPC HealthCheck failed: {e}")),
    }
    let (_, models) = run_grpc_probe(&job(ProbeKind::Models), configured, &channels).await;
    Ok(models.ok().and_then(|r| parse_models(&r.body).ok()))
}
