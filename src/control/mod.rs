//! The control core: the single writer of shared state. It drains the data cores' dispatch
//! records into the index, runs eviction, polls load, checks health and serves admin mutations.
//!
//! Now: `ControlCore::run` drains every data core's `DispatchRecord` queue each `CONTROL_TURN`
//! into the index (`IndexUpkeep::apply_record`), reclaims retired index memory every turn and
//! evicts over-budget trees every `--eviction-interval` (then publishes the tree gauges), refreshes the merged `/v1/models` answer
//! from every worker each `MODELS_REFRESH_INTERVAL`, and serves Prometheus `/metrics` on
//! `--prometheus-host:--prometheus-port`. It runs on its own thread (`kvgate-control`) with its
//! own monoio runtime; nothing here is on a data core's request path.

use std::collections::HashMap;
use std::net::TcpListener as StdTcpListener;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::http::client;
use crate::http::codec::{self, Method};
use crate::http::io::Socket;
use crate::index::{IndexWriter, ModelGauges};
use crate::limits::{
    CONTROL_TURN, HEADER_READ_TIMEOUT, MODELS_BODY_BYTES_MAX, MODELS_REFRESH_INTERVAL,
    READ_BUF_BYTES_INITIAL, TREE_OVER_BUDGET_FACTOR,
};
use crate::metrics::Counter;
use crate::policy::{KeyData, RecordKey};
use crate::runtime::Shared;
use crate::workers::admin::driver::WorkerDriver;
use crate::workers::WorkerId;

/// What a data core tells the control core about one dispatched request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    /// The worker the request went to.
    pub worker: WorkerId,
    /// Milliseconds since gateway start when it was dispatched (`Shared::tick_now`).
    pub tick: u64,
    /// The request's index key (cache_aware): the tree learns from every dispatch.
    pub key: Option<RecordKey>,
}

/// The control core's state, owned by its thread.
#[derive(Debug)]
pub struct ControlCore {
    shared: Arc<Shared>,
    index: Option<IndexUpkeep>,
}

impl ControlCore {
    /// A control core over `shared`; it takes the index writer.
    pub fn new(shared: Arc<Shared>) -> Self {
        let index = shared.take_index_writer().map(|writer| IndexUpkeep {
            writer,
            model_names: HashMap::new(),
            next_eviction: Instant::now() + shared.config.policy.eviction_interval,
        });
        ControlCore { shared, index }
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
        let mut core = self;
        core.publish_tree_gauges();
        let mut workers = WorkerDriver::new(&shared);
        while !shared.is_shutting_down() {
            core.drain_records();
            for id in workers.turn(&shared) {
                core.purge_worker_from_indexes(id);
            }
            core.upkeep_index();
            monoio::time::sleep(CONTROL_TURN).await;
        }
        core.drain_records();
    }

    /// Applies every queued dispatch record.
    fn drain_records(&mut self) {
        let mut applied = 0u64;
        for queue in self.shared.dispatch_queues.iter() {
            while let Some(record) = queue.pop() {
                if let Some(index) = &mut self.index {
                    index.apply_record(record);
                }
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

    /// Frees retired index memory every turn; every `--eviction-interval`, or at once when a
    /// model's tree passes `TREE_OVER_BUDGET_FACTOR` times its budget, evicts over-budget trees
    /// and publishes the tree gauges.
    fn upkeep_index(&mut self) {
        let Some(index) = &mut self.index else {
            return;
        };
        index.writer.reclaim();
        let policy = &self.shared.config.policy;
        let hard_cap = policy.max_tree_size.saturating_mul(TREE_OVER_BUDGET_FACTOR);
        let over_hard_cap = index
            .writer
            .gauges()
            .iter()
            .any(|g| g.string.units > hard_cap || g.token.units > hard_cap);
        if Instant::now() < index.next_eviction && !over_hard_cap {
            return;
        }
        index.next_eviction = Instant::now() + policy.eviction_interval;
        let evicted = index.writer.evict(policy.max_tree_size);
        if evicted.entries > 0 {
            tracing::debug!(
                entries = evicted.entries,
                units = evicted.units,
                "index eviction"
            );
        }
        self.publish_tree_gauges();
    }

    /// Removes a purged worker from every index, before its slot id can be reused.
    fn purge_worker_from_indexes(&mut self, id: WorkerId) {
        if let Some(index) = &mut self.index {
            let removed = index.writer.remove_worker(id);
            tracing::debug!(
                worker = id.0,
                entries = removed,
                "worker purged from the index"
            );
            self.publish_tree_gauges();
        }
    }

    fn publish_tree_gauges(&self) {
        let Some(index) = &self.index else {
            return;
        };
        let gauges = index.writer.gauges().into_iter().map(|g| {
            let name = index.model_names.get(&g.model).cloned();
            (name.unwrap_or_else(|| format!("{:016x}", g.model)), g)
        });
        self.shared.tree_gauges.store(Arc::new(gauges.collect()));
    }
}

/// The index writer and what the control core keeps beside it.
#[derive(Debug)]
struct IndexUpkeep {
    writer: IndexWriter,
    /// Model names by hash, learned from the records, for gauge labels.
    model_names: HashMap<u64, String>,
    next_eviction: Instant,
}

impl IndexUpkeep {
    /// The index insert: the tree learns the worker this request went to.
    fn apply_record(&mut self, record: DispatchRecord) {
        let Some(key) = record.key else {
            return;
        };
        if let Some(name) = key.model_name {
            self.model_names.insert(key.namespace.model, name.into());
        }
        let (ns, worker, tick) = (key.namespace, record.worker, record.tick);
        // The data core's lookup hint lets the insert skip the prefix it already matched.
        let hint = &key.hint;
        // A new leaf keeps a reference to the record's key buffer rather than a copy of it.
        let inserted = match &key.key {
            KeyData::Text(text) => self.writer.insert_text_shared(ns, text, worker, tick, hint),
            KeyData::Tokens(tokens) => self
                .writer
                .insert_tokens_shared(ns, tokens, worker, tick, hint),
        };
        if let Err(e) = inserted {
            tracing::debug!("dispatch record dropped by the index: {e}");
        }
    }
}

/// A gauge family: name, help text, and its value for one model.
type GaugeFamily = (&'static str, &'static str, fn(&ModelGauges) -> u64);

/// `smg_cache_tree_chars`, `smg_cache_tree_tokens` and `smg_cache_tree_tenants` per model.
pub fn render_tree_gauges(gauges: &[(String, ModelGauges)], out: &mut String) {
    use std::fmt::Write as _;
    let families: [GaugeFamily; 3] = [
        (
            "smg_cache_tree_chars",
            "Characters in the string tree",
            |g| g.string.units,
        ),
        ("smg_cache_tree_tokens", "Tokens in the token tree", |g| {
            g.token.units
        }),
        (
            "smg_cache_tree_tenants",
            "Workers holding entries in the trees",
            |g| g.string.tenants.max(g.token.tenants),
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (model, g) in gauges {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(g));
        }
    }
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
