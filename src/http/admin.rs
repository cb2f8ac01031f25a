//! The data plane's handler of the admin API on the main port: authenticate, hand the call to
//! the control core (the only writer of worker state), wait for its answer without blocking the
//! core, and write it back. The rules (routes, authentication, bodies) are `workers::admin`'s;
//! the control core serves the calls in `control::workers`.
//!
//! Owns [`answer_admin_call`]. Errors are JSON bodies with their status: a refused caller gets
//! the gateway's error answer (`answer_error`: 403 `AdminClosed` while the admin API is closed,
//! 401 `Unauthorized` without the bearer token, as when the call is refused before its body);
//! a call that cannot be served its `AdminError` (503 when the admin queue is full, 504 when
//! the control core does not answer in time, the control core's own refusals).

use std::sync::Arc;
use std::time::Instant;

use super::core::DataCore;
use super::downstream::{answer_error, write_to_client, Answered, Downstream, Request};
use crate::limits::{ADMIN_REPLY_POLL, ADMIN_REPLY_TIMEOUT};
use crate::net::codec::{self, Connection};
use crate::shared::{AdminReply, AdminRequest};
use crate::workers::admin::{check_access, AdminError, AdminRoute};

/// Answers one admin call: authenticated here, served by the control core (the only writer of
/// worker state), its answer written back.
pub async fn answer_admin_call(
    core: &DataCore,
    down: &mut Downstream,
    request: &Request,
    route: Result<AdminRoute, AdminError>,
) -> Answered {
    let connection = request.head.connection;
    let authorization = request.head.headers.get(&down.read_buf, "authorization");
    let access = &core.shared.config.worker_settings.admin_access;
    if let Err(refused) = check_access(access, authorization) {
        return answer_error(down, refused, connection).await;
    }
    let (status, body) = match route {
        Err(e) => (e.status, e.to_json()),
        Ok(route) => {
            let body = request.body(&down.read_buf).to_vec();
            ask_control_core(core, route, body).await
        }
    };
    down.write_buf.clear();
    codec::write_local_response_with_id(
        &mut down.write_buf,
        status,
        "application/json",
        body.as_bytes(),
        connection,
        down.request_id.header_line(),
    );
    let written = write_to_client(&mut down.socket, &mut down.write_buf, 0).await;
    Answered {
        status,
        connection: connection.and(Connection::keep_if(written)),
    }
}

async fn ask_control_core(core: &DataCore, route: AdminRoute, body: Vec<u8>) -> (u16, String) {
    let reply = Arc::new(AdminReply::default());
    let request = AdminRequest {
        route,
        body,
        reply: reply.clone(),
    };
    if core.shared.admin_queue.push(request).is_err() {
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
