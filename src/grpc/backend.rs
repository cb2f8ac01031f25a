//! Which engine protocol a gRPC worker speaks, and the control-side calls on it. Owns
//! [`Backend`] (SGLang's `SglangScheduler` or vLLM's `VllmEngine`: their method paths),
//! [`detect`] (SMG's way: SGLang's `HealthCheck` first, vLLM's when SGLang's service is not
//! served) and the calls the control core makes: [`health`], [`loads_as_v1_json`] (GetLoads in
//! the `/v1/loads` shape the load parser reads, so the scorer sees no difference),
//! [`served_model`] (GetModelInfo). Errors are [`CallError`]s.

use super::call::{unary, CallError};
use super::connection::Connection;
use super::status::Code;
use crate::engine_proto::{sglang_pb, vllm_pb};

/// The engine protocol of a gRPC worker: `workers::spec`'s, so flags and worker specs name it.
pub use crate::workers::spec::GrpcBackend as Backend;

/// The method paths of a backend's service.
pub trait ServicePaths {
    /// The path of `method` on this backend's service.
    fn path(self, method: Method) -> &'static str;
}

impl ServicePaths for Backend {
    fn path(self, method: Method) -> &'static str {
        match (self, method) {
            (Backend::Sglang, Method::Generate) => {
                "/sglang.grpc.scheduler.SglangScheduler/Generate"
            }
            (Backend::Sglang, Method::HealthCheck) => {
                "/sglang.grpc.scheduler.SglangScheduler/HealthCheck"
            }
            (Backend::Sglang, Method::Abort) => "/sglang.grpc.scheduler.SglangScheduler/Abort",
            (Backend::Sglang, Method::GetLoads) => {
                "/sglang.grpc.scheduler.SglangScheduler/GetLoads"
            }
            (Backend::Sglang, Method::GetModelInfo) => {
                "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo"
            }
            (Backend::Sglang, Method::SubscribeKvEvents) => {
                "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents"
            }
            (Backend::Sglang, Method::GetTokenizer) => {
                "/sglang.grpc.scheduler.SglangScheduler/GetTokenizer"
            }
            (Backend::Vllm, Method::Generate) => "/vllm.grpc.engine.VllmEngine/Generate",
            (Backend::Vllm, Method::HealthCheck) => "/vllm.grpc.engine.VllmEngine/HealthCheck",
            (Backend::Vllm, Method::Abort) => "/vllm.grpc.engine.VllmEngine/Abort",
            (Backend::Vllm, Method::GetLoads) => "/vllm.grpc.engine.VllmEngine/GetLoads",
            (Backend::Vllm, Method::GetModelInfo) => "/vllm.grpc.engine.VllmEngine/GetModelInfo",
            (Backend::Vllm, Method::SubscribeKvEvents) => {
                "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"
            }
            (Backend::Vllm, Method::GetTokenizer) => "/vllm.grpc.engine.VllmEngine/GetTokenizer",
        }
    }
}

/// The methods kvgate calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// The token stream of one request.
    Generate,
    /// Liveness.
    HealthCheck,
    /// Stops a request.
    Abort,
    /// Queue and KV-cache load.
    GetLoads,
    /// The served model.
    GetModelInfo,
    /// The engine's KV-cache events, streamed (`smg.grpc.common`'s messages).
    SubscribeKvEvents,
    /// The engine's tokenizer files, streamed as a zip (`smg.grpc.common`'s messages).
    GetTokenizer,
}

/// A worker's health as its `HealthCheck` answers, for `backend`.
pub async fn health(
    connection: &Connection,
    authority: &str,
    backend: Backend,
) -> Result<bool, CallError> {
    let path = backend.path(Method::HealthCheck);
    match backend {
        Backend::Sglang => {
            let request = sglang_pb::HealthCheckRequest {};
            let answer: sglang_pb::HealthCheckResponse =
                unary(connection, authority, path, &request).await?;
            Ok(answer.healthy)
        }
        Backend::Vllm => {
            let request = vllm_pb::HealthCheckRequest {};
            let answer: vllm_pb::HealthCheckResponse =
                unary(connection, authority, path, &request).await?;
            Ok(answer.healthy)
        }
    }
}

/// Which protocol the worker serves, as SMG tells: SGLang's `HealthCheck` first; a worker that
/// does not serve SGLang's service (`UNIMPLEMENTED`) is asked vLLM's. The answer's health does
/// not matter here, only that the service exists.
pub async fn detect(connection: &Connection, authority: &str) -> Result<Backend, CallError> {
    for backend in [Backend::Sglang, Backend::Vllm] {
        match health(connection, authority, backend).await {
            Ok(_) => return Ok(backend),
            Err(CallError::Status(status)) if status.code == Code::Unimplemented => continue,
            Err(e) => return Err(e),
        }
    }
    Err(CallError::Malformed(
        "the worker serves neither SGLang's nor vLLM's gRPC service".into(),
    ))
}

/// The worker's `GetLoads`, written as SGLang's `GET /v1/loads` JSON (`{"loads": [...]}`, the
/// same field names), so `workers::load::parse_v1_loads` reads gRPC and HTTP workers alike.
pub async fn loads_as_v1_json(
    connection: &Connection,
    authority: &str,
    backend: Backend,
) -> Result<Vec<u8>, CallError> {
    let path = backend.path(Method::GetLoads);
    let ranks: Vec<serde_json::Value> = match backend {
        Backend::Sglang => {
            let request = sglang_pb::GetLoadsRequest::default();
            let answer: sglang_pb::GetLoadsResponse =
                unary(connection, authority, path, &request).await?;
            let rank = |l: &sglang_pb::SchedulerLoad| {
                load_json(
                    l.dp_rank,
                    [l.num_running_reqs, l.num_waiting_reqs, l.num_used_tokens],
                    l.max_total_num_tokens,
                    [
                        l.token_usage,
                        l.gen_throughput,
                        l.cache_hit_rate,
                        l.utilization,
                    ],
                    l.num_waiting_uncached_tokens,
                )
            };
            answer.loads.iter().map(rank).collect()
        }
        Backend::Vllm => {
            let request = vllm_pb::GetLoadsRequest::default();
            let answer: vllm_pb::GetLoadsResponse =
                unary(connection, authority, path, &request).await?;
            let rank = |l: &vllm_pb::SchedulerLoad| {
                load_json(
                    l.dp_rank,
                    [l.num_running_reqs, l.num_waiting_reqs, l.num_used_tokens],
                    l.max_total_num_tokens,
                    [
                        l.token_usage,
                        l.gen_throughput,
                        l.cache_hit_rate,
                        l.utilization,
                    ],
                    l.num_waiting_uncached_tokens,
                )
            };
            answer.loads.iter().map(rank).collect()
        }
    };
    let body = serde_json::json!({ "loads": ranks });
    Ok(body.to_string().into_bytes())
}

/// One rank in `/v1/loads`' field names.
fn load_json(
    dp_rank: i32,
    [running, waiting, used]: [i32; 3],
    max_total: i32,
    [usage, throughput, hit_rate, utilization]: [f64; 4],
    waiting_uncached: i32,
) -> serde_json::Value {
    serde_json::json!({
        "dp_rank": dp_rank,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_used_tokens": used,
        "max_total_num_tokens": max_total,
        "token_usage": usage,
        "gen_throughput": throughput,
        "cache_hit_rate": hit_rate,
        "utilization": utilization,
        "num_waiting_uncached_tokens": waiting_uncached,
    })
}

/// The model the worker serves (`GetModelInfo`'s served name, else its path), written as
/// `GET /v1/models` JSON for the model catalog, with its EOS token IDs.
pub async fn models_as_v1_json(
    connection: &Connection,
    authority: &str,
    backend: Backend,
) -> Result<Vec<u8>, CallError> {
    let path = backend.path(Method::GetModelInfo);
    let (served, model_path, eos) = match backend {
        Backend::Sglang => {
            let request = sglang_pb::GetModelInfoRequest {};
            let info: sglang_pb::GetModelInfoResponse =
                unary(connection, authority, path, &request).await?;
            (info.served_model_name, info.model_path, info.eos_token_ids)
        }
        Backend::Vllm => {
            let request = vllm_pb::GetModelInfoRequest {};
            let info: vllm_pb::GetModelInfoResponse =
                unary(connection, authority, path, &request).await?;
            (info.served_model_name, info.model_path, info.eos_token_ids)
        }
    };
    let id = if served.is_empty() {
        model_path
    } else {
        served
    };
    // The EOS IDs ride on the entry to the catalog, which takes them out (the front end's stop
    // handling reads them there).
    let model = serde_json::json!({ "id": id, "object": "model", "eos_token_ids": eos });
    let body = serde_json::json!({ "object": "list", "data": [model] });
    Ok(body.to_string().into_bytes())
}

/// Sends `Abort` for `request_id` on `connection` (the request's own): its stream was reset
/// already, which a servicer may only notice at its next token; `Abort` stops the engine's
/// work on it at once. Best effort: its failure is only logged.
pub async fn abort(
    connection: Connection,
    authority: String,
    backend: Backend,
    request_id: String,
) {
    let result = async {
        let path = backend.path(Method::Abort);
        match backend {
            Backend::Sglang => {
                let request = sglang_pb::AbortRequest {
                    request_id,
                    reason: "client disconnected".into(),
                };
                unary::<sglang_pb::AbortResponse>(&connection, &authority, path, &request)
                    .await
                    .map(drop)
            }
            Backend::Vllm => {
                let request = vllm_pb::AbortRequest {
                    request_ids: vec![request_id],
                };
                unary::<vllm_pb::AbortResponse>(&connection, &authority, path, &request)
                    .await
                    .map(drop)
            }
        }
    };
    if let Err(e) = result.await {
        tracing::debug!(worker = %authority, error = %e, "gRPC Abort failed");
    }
}
