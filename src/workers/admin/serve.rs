//! The data-core side of the admin API on the main port: authenticate, hand the call to the
//! control core (the only writer of worker state), wait for its answer without blocking the
//! core, and write it back.
//!
//! Owns [`serve_admin`]. Errors are JSON bodies with their status (401 without the bearer token,
//! 503 when the admin queue is full, 504 when the control core does not answer in time).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{AdminReply, AdminRequest};
use super::{check_auth, AdminError, AdminRoute};
use crate::http::codec;
use crate::http::server::{write_to_client, DataCore, Downstream, Request};

/// How long a data core waits for the control core's answer. `POST /workers` probes the new
/// worker (health and models, each bounded by `--health-check-timeout-secs`, at most 5 s by
/// default); this leaves room for both plus a slow turn.
pub const ADMIN_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the data core looks for the answer: admin calls are rare and human-paced.
const ADMIN_REPLY_POLL: Duration = Duration::from_millis(2);

/// Serve one admin request; returns the status and whether the connection stays open.
pub async fn serve_admin(
    core: &DataCore,
    down: &mut Downstream,
    request: &Request,
    route: Result<AdminRoute, AdminError>,
) -> (u16, bool) {
    let keep_alive = request.head.keep_alive;
    let authorization = request.head.headers.get(&down.read_buf, "authorization");
    let api_key = core.shared.config.worker_policy.admin_api_key.as_deref();
    let answer = match check_auth(api_key, authorization).and(route) {
        Err(e) => (e.status, e.to_json()),
        Ok(route) => {
            let body = request.body(&down.read_buf, &down.body_buf).to_vec();
            ask_control_core(core, route, body).await
        }
    };
    let (status, body) = answer;
    down.write_buf.clear();
    codec::write_local_response(
        &mut down.write_buf,
        status,
        "application/json",
        body.as_bytes(),
        keep_alive,
    );
    let written = write_to_client(down).await;
    (status, keep_alive && written)
}

async fn ask_control_core(core: &DataCore, route: AdminRoute, body: Vec<u8>) -> (u16, String) {
    let reply = Arc::new(AdminReply::default());
    let request = AdminRequest {
        route,
        body,
        reply: reply.clone(),
    };
    if core.shared.workers.admin.push(request).is_err() {
        let e = AdminError::new(503, "service_unavailable", "too many admin calls in flight");
        return (e.status, e.to_json());
    }
    let deadline = Instant::now() + ADMIN_REPLY_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(answer) = reply.try_take() {
            return answer;
        }
        monoio::time::sleep(ADMIN_REPLY_POLL).await;
    }
    let e = AdminError::new(
        504,
        "timeout",
        "the control core did not answer the admin call",
    );
    (e.status, e.to_json())
}
