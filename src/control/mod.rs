//! The control core: the single writer of shared state. It drains the data cores' dispatch
//! records into the index, runs eviction, polls load, checks health and serves admin mutations.
//!
//! Now: `ControlCore::run` drains every data core's `DispatchRecord` queue each `CONTROL_TURN`
//! (`apply_record` is where the index insert goes), refreshes the merged `/v1/models` answer
//! from every worker each `MODELS_REFRESH_INTERVAL`, and serves Prometheus `/metrics` on
//! `--prometheus-host:--prometheus-port`. It runs on its own thread (`kvgate-control`) with its
//! own monoio runtime; nothing here is on a data core's request path.

use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::http::client;
use crate::http::codec::{self, Method};
use crate::http::io::Socket;
use crate::limits::{
    CONTROL_TURN, HEADER_READ_TIMEOUT, MODELS_BODY_BYTES_MAX, MODELS_REFRESH_INTERVAL,
    READ_BUF_BYTES_INITIAL,
};
use crate::metrics::Counter;
use crate::runtime::Shared;
use crate::workers::admin::driver::WorkerDriver;
use crate::workers::WorkerId;

/// What a data core tells the control core about one dispatched request. The `policy` work
/// extends it with the routing key (namespace, tokens or text hash) for the index insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    /// The worker the request went to.
    pub worker: WorkerId,
    /// Milliseconds since gateway start when it was dispatched (`Shared::tick_now`).
    pub tick: u64,
}

/// The control core's state, owned by its thread.
#[derive(Debug)]
pub struct ControlCore {
    shared: Arc<Shared>,
}

impl ControlCore {
    /// A control core over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        ControlCore { shared }
    }

    /// Runs until shutdown: the record-draining loop, with the models refresher and the
    /// metrics server as tasks beside it.
    pub async fn run(self, metrics_listener: StdTcpListener) {
        let shared = self.shared.clone();
        match TcpListener::from_std(metrics_listener) {
            Ok(listener) => {
                monoio::spawn(serve_metrics(Rc::new(listener), shared.clone()));
            }
            Err(e) => tracing::error!("metrics listener unusable: {e}"),
        }
        monoio::spawn(refresh_models_forever(shared.clone()));
        let mut workers = WorkerDriver::new(&shared);
        while !shared.is_shutting_down() {
            self.drain_records();
            for id in workers.turn(&shared) {
                purge_worker_from_indexes(id);
            }
            monoio::time::sleep(CONTROL_TURN).await;
        }
        self.drain_records();
    }

    /// Applies every queued dispatch record.
    fn drain_records(&self) {
        let mut applied = 0u64;
        for queue in self.shared.dispatch_queues.iter() {
            while let Some(record) = queue.pop() {
                apply_record(record);
                applied += 1;
            }
        }
        if applied > 0 {
            self.shared
                .metrics
                .control()
                .add(Counter::DispatchRecordsApplied, applied);
        }
    }
}

/// Removes a purged worker from every index, before its slot id can be reused. The hook for the
/// index writer's `remove_worker` once the control core owns the `IndexWriter`.
fn purge_worker_from_indexes(id: WorkerId) {
    tracing::debug!(worker = id.0, "purge from indexes (no index wired yet)");
}

/// Where a dispatch record updates shared state (the index insert, once the index exists).
fn apply_record(record: DispatchRecord) {
    let _ = record;
}

async fn refresh_models_forever(shared: Arc<Shared>) {
    while !shared.is_shutting_down() {
        refresh_models(&shared).await;
        let next = Instant::now() + MODELS_REFRESH_INTERVAL;
        while Instant::now() < next && !shared.is_shutting_down() {
            monoio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Fetches every worker's `/v1/models` and publishes the union (by model id, first worker wins)
/// as the gateway's own `/v1/models` answer.
async fn refresh_models(shared: &Shared) {
    let roster = shared.table.roster();
    let mut models: Vec<serde_json::Value> = Vec::new();
    for worker in &roster.workers {
        let timeout = Duration::from_secs(5);
        let answer = client::get(
            worker.spec.addr,
            &worker.spec.authority,
            "/v1/models",
            timeout,
            MODELS_BODY_BYTES_MAX,
        )
        .await;
        let response = match answer {
            Ok(r) if r.status == 200 => r,
            Ok(r) => {
                tracing::debug!(worker = %worker.spec.url, status = r.status, "models fetch refused");
                continue;
            }
            Err(e) => {
                tracing::debug!(worker = %worker.spec.url, "models fetch failed: {e}");
                continue;
            }
        };
        merge_models(&mut models, &response.body);
    }
    let body = serde_json::json!({ "object": "list", "data": models });
    if let Ok(bytes) = serde_json::to_vec(&body) {
        shared.models_body.store(Arc::new(bytes));
    }
}

/// Adds the models of one `/v1/models` answer whose ids are not yet in `models`.
pub fn merge_models(models: &mut Vec<serde_json::Value>, body: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let Some(data) = value.get("data").and_then(|d| d.as_array()) else {
        return;
    };
    for model in data {
        let id = model.get("id");
        if id.is_some() && !models.iter().any(|m| m.get("id") == id) {
            models.push(model.clone());
        }
    }
}

async fn serve_metrics(listener: Rc<TcpListener>, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                monoio::spawn(answer_scrape(Socket::new(stream), shared.clone()));
            }
            Err(e) => {
                tracing::warn!("metrics accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers one request on the metrics port (`GET /metrics`, anything else 404), then closes.
async fn answer_scrape(mut socket: Socket, shared: Arc<Shared>) {
    let deadline = Instant::now() + HEADER_READ_TIMEOUT;
    let mut buf = Vec::with_capacity(READ_BUF_BYTES_INITIAL);
    let head = loop {
        match codec::parse_request_head(&buf) {
            Ok(Some(head)) => break head,
            Ok(None) => {}
            Err(_) => return,
        }
        let (result, b) = socket
            .read_more(buf, READ_BUF_BYTES_INITIAL, deadline)
            .await;
        buf = b;
        if !matches!(result, Ok(n) if n > 0) {
            return;
        }
    };
    let mut out = Vec::new();
    if head.method == Method::Get && head.path(&buf) == b"/metrics" {
        let mut text = String::with_capacity(16 * 1024);
        shared.render_metrics(&mut text);
        codec::write_local_response(
            &mut out,
            200,
            "text/plain; version=0.0.4",
            text.as_bytes(),
            false,
        );
    } else {
        codec::write_local_response(&mut out, 404, "text/plain", b"not found\n", false);
    }
    let _ = socket.write_all(out, deadline).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_merge_by_id() {
        let mut models = Vec::new();
        merge_models(
            &mut models,
            br#"{"object":"list","data":[{"id":"a"},{"id":"b"}]}"#,
        );
        merge_models(
            &mut models,
            br#"{"object":"list","data":[{"id":"b"},{"id":"c"}]}"#,
        );
        merge_models(&mut models, b"not json");
        let ids: Vec<_> = models
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
