//! The Prometheus exposition: the whole `/metrics` page, and the small server on
//! `--prometheus-host:--prometheus-port` that answers it from the control core.
//!
//! Owns [`render`] (every family, in one place, read from the published state: the per-core
//! counters, the cache_aware decision counters, the tree gauges, and the per-worker gauges) and
//! [`serve_metrics`]. Names follow SMG (`smg_*`) where SMG has the metric, `kvgate_*` where it
//! does not. Label values are escaped. A scrape never blocks a data core: it reads atomics and
//! published snapshots.

use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::net::TcpListener;

use crate::ids::WorkerId;
use crate::index::ModelGauges;
use crate::kv_events::{Failure, IndexGauges, Reset, StreamStats};
use crate::limits::{HEADER_READ_TIMEOUT, READ_BUF_BYTES_INITIAL};
use crate::mesh::{MeshCounter, MeshCounters, PeerState, Refusal};
use crate::metrics::WorkerLabels;
use crate::net::codec::{self, Connection};
use crate::net::socket::Socket;
use crate::request::Method;
use crate::shared::Shared;
use crate::workers::breaker::BreakerState;
use crate::workers::catalog::ModelCatalog;
use crate::workers::load::RankGauges;
use crate::workers::role::WorkerRole;
use crate::workers::table::WorkerTable;

/// The policy that selects workers of `role`: in PD mode each side's, else the gateway's.
fn side_policy(config: &crate::config::Config, role: WorkerRole) -> Option<&'static str> {
    let pd = config.pd.as_ref()?;
    match role {
        WorkerRole::Prefill { .. } => Some(pd.prefill.kind.name()),
        WorkerRole::Decode => Some(pd.decode.kind.name()),
        WorkerRole::Regular => None,
    }
}

/// The whole `/metrics` page.
pub fn render(shared: &Shared, out: &mut String) {
    shared.metrics.render(out);
    let catalog = shared.catalog.load();
    let workers: Vec<WorkerLabels> = shared
        .table
        .roster()
        .workers
        .iter()
        .map(|w| WorkerLabels {
            id: w.id,
            url: escape_label(&w.spec.url),
            model: escape_label(worker_model(&catalog, w.id)),
            worker_type: w.spec.role.name(),
            policy: side_policy(&shared.config, w.spec.role),
        })
        .collect();
    let policy = shared.config.policy.kind.name();
    shared.metrics.render_workers(&workers, policy, out);
    crate::policy::render_prometheus(shared.policy_metrics.iter().map(|m| &**m), out);
    render_tree_gauges(&shared.tree_gauges.load(), out);
    render_placement_gauges(&shared.placement_gauges.load(), out);
    render_kv_events(
        &shared.kv_streams.load(),
        &shared.kv_index_gauges.load(),
        out,
    );
    render_worker_gauges(&shared.table, &shared.catalog.load(), out);
    if let Some(link) = &shared.mesh {
        render_mesh(&link.counters, out);
    }
}

/// The mesh's families (`--enable-mesh`): peers by SWIM state, deltas, repairs, inserts from
/// peers, bytes sent, and the gossip rounds' count and total duration (a summary's two series).
pub fn render_mesh(counters: &MeshCounters, out: &mut String) {
    let header = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let name = "kvgate_mesh_peers";
    header(
        out,
        name,
        "gauge",
        "Mesh peers by SWIM state (down: those still remembered)",
    );
    for state in [PeerState::Alive, PeerState::Suspect, PeerState::Down] {
        let n = counters.peers(state);
        let _ = writeln!(out, "{name}{{state=\"{}\"}} {n}", state.label());
    }
    let name = "kvgate_mesh_deltas_total";
    header(
        out,
        name,
        "counter",
        "Tree deltas: sent (per peer), received, dropped (a backed-up peer stream or a full queue)",
    );
    for (label, counter) in [
        ("sent", MeshCounter::DeltasSent),
        ("received", MeshCounter::DeltasReceived),
        ("dropped", MeshCounter::DeltasDropped),
    ] {
        let _ = writeln!(
            out,
            "{name}{{outcome=\"{label}\"}} {}",
            counters.get(counter)
        );
    }
    let name = "kvgate_mesh_repairs_total";
    header(
        out,
        name,
        "counter",
        "Tree repairs by outcome: started, retried (stalled 5 s), completed, abandoned",
    );
    for (label, counter) in [
        ("started", MeshCounter::RepairsStarted),
        ("retried", MeshCounter::RepairsRetried),
        ("completed", MeshCounter::RepairsCompleted),
        ("abandoned", MeshCounter::RepairsAbandoned),
    ] {
        let _ = writeln!(
            out,
            "{name}{{outcome=\"{label}\"}} {}",
            counters.get(counter)
        );
    }
    let name = "kvgate_mesh_repair_causes_total";
    header(
        out,
        name,
        "counter",
        "Repairs asked for, by cause: a delta this gateway could not rebuild (unknown_path), or \
         the first delta of a model from a peer since either joined or came back (catch_up)",
    );
    for (label, counter) in [
        ("unknown_path", MeshCounter::RepairCauseUnknownPath),
        ("catch_up", MeshCounter::RepairCauseCatchUp),
    ] {
        let _ = writeln!(out, "{name}{{cause=\"{label}\"}} {}", counters.get(counter));
    }
    for (name, kind, help, value) in [
        (
            "kvgate_mesh_peers_down_total",
            "counter",
            "Peers declared down or gone (each comes back through a catch-up repair)",
            counters.get(MeshCounter::PeersDown),
        ),
        (
            "kvgate_mesh_inserts_applied_total",
            "counter",
            "Peers' tree inserts applied to this gateway's trees",
            counters.get(MeshCounter::InsertsApplied),
        ),
        (
            "kvgate_mesh_frames_malformed_total",
            "counter",
            "Mesh frames that did not decode (their stream was closed)",
            counters.get(MeshCounter::FramesMalformed),
        ),
        (
            "kvgate_mesh_sent_bytes_total",
            "counter",
            "Bytes of mesh frames queued to peers' streams (sealed)",
            counters.get(MeshCounter::BytesSent),
        ),
        (
            "kvgate_mesh_sent_repair_bytes_total",
            "counter",
            "Of kvgate_mesh_sent_bytes_total, repair requests and pages (the rest are deltas)",
            counters.get(MeshCounter::BytesSentRepair),
        ),
        (
            "kvgate_mesh_sent_pages_total",
            "counter",
            "Token page hashes deltas carried to peers (8 bytes each), per peer",
            counters.get(MeshCounter::PagesSent),
        ),
    ] {
        header(out, name, kind, help);
        let _ = writeln!(out, "{name} {value}");
    }
    let name = "kvgate_mesh_authenticated";
    header(
        out,
        name,
        "gauge",
        "1: mesh traffic is authenticated (--mesh-secret-file)",
    );
    let _ = writeln!(out, "{name} {}", counters.authenticated());
    let name = "kvgate_mesh_refused_total";
    header(
        out,
        name,
        "counter",
        "Mesh traffic refused, and mesh caps reached, by reason",
    );
    for reason in Refusal::ALL {
        let n = counters.refused(reason);
        let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.label());
    }
    let name = "kvgate_mesh_apply_seconds_total";
    header(
        out,
        name,
        "counter",
        "Time the control core spent inserting peers' paths into its trees",
    );
    let micros = counters.get(MeshCounter::ApplyMicros);
    let _ = writeln!(out, "{name} {}", micros as f64 / 1e6);
    let name = "kvgate_mesh_sync_round_duration_seconds";
    header(out, name, "summary", "Duration of the mesh's gossip rounds");
    let micros = counters.get(MeshCounter::SyncRoundMicros);
    let _ = writeln!(out, "{name}_sum {}", micros as f64 / 1e6);
    let _ = writeln!(
        out,
        "{name}_count {}",
        counters.get(MeshCounter::SyncRounds)
    );
}

/// `smg_cache_placement_entries` per model: the hash index's live heads after its last sweep.
pub fn render_placement_gauges(gauges: &[(String, u64)], out: &mut String) {
    let name = "smg_cache_placement_entries";
    let _ = writeln!(
        out,
        "# HELP {name} Live heads in the hash index (--cache-index hash), after the last sweep\n# TYPE {name} gauge"
    );
    for (model, heads) in gauges {
        let _ = writeln!(out, "{name}{{model=\"{}\"}} {heads}", escape_label(model));
    }
}

/// The KV-event streams per worker and the KV-event index's size (`kvgate_kv_*`: SMG reads
/// events only from gRPC workers and has no such families, but for its
/// `smg_kv_event_subscription_failures_total{worker,reason}`, here with kvgate's reasons). Nothing is written until a worker
/// publishes.
pub fn render_kv_events(streams: &[StreamStats], index: &IndexGauges, out: &mut String) {
    if streams.is_empty() && index.blocks == 0 {
        return;
    }
    let header = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let labelled: Vec<(String, &StreamStats)> = streams
        .iter()
        .map(|s| (escape_label(&s.worker), s))
        .collect();
    let name = "kvgate_kv_events_stream_up";
    header(
        out,
        name,
        "gauge",
        "1 while the worker's KV-event subscription is connected",
    );
    for (worker, s) in &labelled {
        let _ = writeln!(out, "{name}{{worker=\"{worker}\"}} {}", u8::from(s.up));
    }
    let name = "kvgate_kv_events_applied_total";
    header(
        out,
        name,
        "counter",
        "KV events applied to the KV-event index",
    );
    for (worker, s) in &labelled {
        let _ = writeln!(out, "{name}{{worker=\"{worker}\"}} {}", s.events);
    }
    let name = "kvgate_kv_event_blocks_total";
    header(
        out,
        name,
        "counter",
        "Blocks by what the events did: stored (now listed), removed, orphaned (parent unknown, \
         not listed), refused (index full), over_share (the worker holds its share of the index)",
    );
    for (worker, s) in &labelled {
        for (change, n) in [
            ("stored", s.blocks_stored),
            ("removed", s.blocks_removed),
            ("orphaned", s.blocks_orphaned),
            ("refused", s.blocks_refused),
            ("over_share", s.blocks_over_share),
        ] {
            let _ = writeln!(out, "{name}{{worker=\"{worker}\",change=\"{change}\"}} {n}");
        }
    }
    let name = "kvgate_kv_event_batches_total";
    header(
        out,
        name,
        "counter",
        "Event batches by outcome: applied, replayed (applied from the replay socket), \
         malformed and skipped (duplicates) are not applied",
    );
    for (worker, s) in &labelled {
        for (outcome, n) in [
            ("applied", s.batches_applied),
            ("replayed", s.batches_replayed),
            ("malformed", s.batches_malformed),
            ("skipped", s.batches_skipped),
        ] {
            let _ = writeln!(
                out,
                "{name}{{worker=\"{worker}\",outcome=\"{outcome}\"}} {n}"
            );
        }
    }
    let name = "smg_kv_event_subscription_failures_total";
    header(
        out,
        name,
        "counter",
        "KV-event subscription failures by reason",
    );
    for (worker, s) in &labelled {
        for (failure, n) in Failure::ALL.iter().zip(s.failures) {
            let reason = failure.label();
            let _ = writeln!(out, "{name}{{worker=\"{worker}\",reason=\"{reason}\"}} {n}");
        }
    }
    let name = "kvgate_kv_event_resets_total";
    header(
        out,
        name,
        "counter",
        "Times all of a worker's entries were dropped: gap (batches lost, not replayed), restart \
         (its publisher started over), expired (silent for --kv-indexer-ttl-secs), unverified \
         (reconnected without a replay socket)",
    );
    for (worker, s) in &labelled {
        for (reset, n) in Reset::ALL.iter().zip(s.resets) {
            let reason = reset.label();
            let _ = writeln!(out, "{name}{{worker=\"{worker}\",reason=\"{reason}\"}} {n}");
        }
    }
    let name = "kvgate_kv_index_worker_blocks";
    header(
        out,
        name,
        "gauge",
        "Blocks the KV-event index lists for the worker",
    );
    for (worker, s) in &labelled {
        let _ = writeln!(out, "{name}{{worker=\"{worker}\"}} {}", s.blocks_held);
    }
    let name = "kvgate_kv_index_entries";
    header(
        out,
        name,
        "gauge",
        "KV-event index entries (a block listed for a worker) per model",
    );
    for (model, entries) in &index.models {
        let _ = writeln!(out, "{name}{{model=\"{}\"}} {entries}", escape_label(model));
    }
    let name = "kvgate_kv_index_blocks";
    header(out, name, "gauge", "Distinct blocks in the KV-event index");
    let _ = writeln!(out, "{name} {}", index.blocks);
    let name = "kvgate_kv_index_memory_bytes";
    header(
        out,
        name,
        "gauge",
        "Bytes of the KV-event index (table and per-worker maps)",
    );
    let _ = writeln!(out, "{name} {}", index.memory_bytes);
    let name = "kvgate_kv_inflight_requests";
    header(
        out,
        name,
        "gauge",
        "Requests the KV-event index's in-flight overlay follows (dispatched, not yet confirmed \
         by their engine's events or ended)",
    );
    let _ = writeln!(out, "{name} {}", index.inflight_requests);
    let name = "kvgate_kv_inflight_blocks";
    header(
        out,
        name,
        "gauge",
        "Blocks the in-flight overlay holds provisionally, one per worker holding it",
    );
    let _ = writeln!(out, "{name} {}", index.inflight_claims);
}

/// `smg_cache_tree_chars` and `smg_cache_tree_tokens` per model, and `smg_cache_tree_tenants`
/// per model and tree (`tree="string"` or `"token"`, one series each, as SMG reports them).
pub fn render_tree_gauges(gauges: &[(String, ModelGauges)], out: &mut String) {
    type Family = (&'static str, &'static str, fn(&ModelGauges) -> u64);
    let families: [Family; 2] = [
        (
            "smg_cache_tree_chars",
            "Characters in the string tree",
            |g| g.string.units,
        ),
        ("smg_cache_tree_tokens", "Tokens in the token tree", |g| {
            g.token.units
        }),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (model, g) in gauges {
            let model = escape_label(model);
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(g));
        }
    }
    let name = "smg_cache_tree_tenants";
    let _ = writeln!(
        out,
        "# HELP {name} Workers holding entries in the model's string or token tree\n# TYPE {name} gauge"
    );
    for (model, g) in gauges {
        let model = escape_label(model);
        for (tree, tenants) in [("string", g.string.tenants), ("token", g.token.tenants)] {
            let _ = writeln!(out, "{name}{{model=\"{model}\",tree=\"{tree}\"}} {tenants}");
        }
    }
}

/// Every per-worker gauge, one series per active worker (label `worker`, the URL as given); the
/// `smg_engine_*` gauges add `model` and `dp_rank` (one series per rank), as SMG's do.
pub fn render_worker_gauges(table: &WorkerTable, catalog: &ModelCatalog, out: &mut String) {
    let roster = table.roster();
    let workers: Vec<(WorkerId, String)> = roster
        .workers
        .iter()
        .map(|w| (w.id, escape_label(&w.spec.url)))
        .collect();
    type Family = (
        &'static str,
        &'static str,
        fn(&WorkerTable, WorkerId) -> u64,
    );
    let families: [Family; 4] = [
        (
            "smg_worker_requests_active",
            "Requests in flight per worker",
            |table, id| u64::from(table.inflight(id)),
        ),
        (
            "kvgate_worker_queued_prompt_tokens",
            "Prompt tokens sent to the worker since its last load report with no first token \
             back yet (the expected-wait scorer's queued work)",
            |table, id| table.queued_tokens(id, table.signals(id).load_generation()),
        ),
        (
            "kvgate_worker_resident_prompt_tokens",
            "Prompt tokens sent to the worker since its last load report whose requests have \
             not ended (added to its reported KV usage)",
            |table, id| table.resident_tokens(id, table.signals(id).load_generation()),
        ),
        (
            "smg_worker_health",
            "Worker health-check verdict (1 healthy)",
            |table, id| u64::from(table.is_healthy(id)),
        ),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (id, url) in &workers {
            let _ = writeln!(out, "{name}{{worker=\"{url}\"}} {}", value(table, *id));
        }
    }
    let name = "smg_worker_cb_state";
    let _ = writeln!(
        out,
        "# HELP {name} Circuit breaker state (0 closed, 1 open, 2 half-open)\n# TYPE {name} gauge"
    );
    for (id, url) in &workers {
        let state: BreakerState = table.signals(*id).breaker_state();
        let _ = writeln!(out, "{name}{{worker=\"{url}\"}} {}", state as u8);
    }
    let engines: Vec<EngineSeries> = workers
        .iter()
        .filter_map(|(id, url)| {
            let report = table.signals(*id).load()?;
            let model = escape_label(worker_model(catalog, *id));
            let labels =
                |rank: u32| format!("worker=\"{url}\",model=\"{model}\",dp_rank=\"{rank}\"");
            let ranks = if report.ranks.is_empty() {
                // One rank (a Prometheus report): the report itself.
                vec![(
                    labels(0),
                    RankGauges {
                        dp_rank: 0,
                        running_requests: report.running_requests,
                        waiting_requests: report.waiting_requests,
                        token_usage: report.token_usage,
                        gen_throughput_tps: report.gen_throughput_tps,
                        cache_hit_rate: report.cache_hit_rate,
                    },
                )]
            } else {
                report
                    .ranks
                    .iter()
                    .map(|r| (labels(r.dp_rank), r.clone()))
                    .collect()
            };
            Some(ranks)
        })
        .flatten()
        .collect();
    render_engine_gauges(out, &engines);
}

/// One `smg_engine_*` series set: its labels and the rank's figures.
type EngineSeries = (String, RankGauges);

/// The `model` label of a worker's engine gauges: the first (by name) of the models it lists,
/// `unknown` while its models are not known. A worker serving several models is one engine, so
/// it gets one series, not one per model.
fn worker_model(catalog: &ModelCatalog, id: WorkerId) -> &str {
    catalog
        .serving()
        .filter(|(_, workers)| workers.contains(&id))
        .map(|(model, _)| model)
        .min()
        .unwrap_or("unknown")
}

/// The `smg_engine_*` gauges from the workers' last load reports, one series per rank. Workers
/// without a report are left out: no signal is not zero load.
fn render_engine_gauges(out: &mut String, engines: &[EngineSeries]) {
    type Getter = fn(&RankGauges) -> Option<f64>;
    const GAUGES: [(&str, &str, Getter); 5] = [
        (
            "smg_engine_running_requests",
            "Requests the engine reports running",
            |r| Some(r.running_requests as f64),
        ),
        (
            "smg_engine_waiting_requests",
            "Requests the engine reports queued",
            |r| Some(r.waiting_requests as f64),
        ),
        (
            "smg_engine_token_usage",
            "KV-cache token usage the engine reports (0-1)",
            |r| r.token_usage,
        ),
        (
            "smg_engine_gen_throughput",
            "Generation throughput the engine reports (tokens/s)",
            |r| r.gen_throughput_tps,
        ),
        (
            "smg_engine_cache_hit_rate",
            "Prefix-cache hit rate the engine reports (0-1)",
            |r| r.cache_hit_rate,
        ),
    ];
    for (name, help, get) in GAUGES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, rank) in engines {
            if let Some(value) = get(rank) {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    }
}

/// Escapes a Prometheus label value (backslash, double quote, newline).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Serves the metrics port until the process exits: `GET /metrics` (and `HEAD`), anything else
/// 404.
pub async fn serve_metrics(listener: Rc<TcpListener>, shared: Arc<Shared>) {
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

/// Answers one request on the metrics port, then closes.
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
    let get_or_head = matches!(head.method, Method::Get | Method::Head);
    if get_or_head && head.path(&buf) == b"/metrics" {
        let mut text = String::with_capacity(16 * 1024);
        render(&shared, &mut text);
        let content_type = "text/plain; version=0.0.4";
        codec::write_local_response(
            &mut out,
            200,
            content_type,
            text.as_bytes(),
            Connection::Close,
        );
        if head.method == Method::Head {
            // The GET's head, its content-length included (RFC 9110 9.3.2), without the body.
            out.truncate(out.len() - text.len());
        }
    } else {
        let body = b"not found\n";
        codec::write_local_response(&mut out, 404, "text/plain", body, Connection::Close);
    }
    let _ = socket.write_all(out, deadline).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::catalog::parse_models;
    use crate::workers::load::parse_v1_loads;
    use crate::workers::spec::WorkerSpec;
    use crate::workers::table::Health;

    #[test]
    fn worker_gauges_render_per_worker_and_skip_loads_without_signal() {
        let specs: Vec<_> = (1..=2)
            .map(|i| WorkerSpec::resolve(&format!("http://127.0.0.1:{i}")).unwrap())
            .collect();
        let models = parse_models(br#"{"data":[{"id":"b"},{"id":"a"}]}"#).unwrap();
        let table = WorkerTable::new(1, &specs);
        let report = parse_v1_loads(
            br#"{"loads":[{"num_running_reqs":4,"num_waiting_reqs":2,"gen_throughput":40,"cache_hit_rate":0.5,"token_usage":0.3}]}"#,
        )
        .unwrap();
        table
            .signals(WorkerId(0))
            .set_load(Some(report), &Default::default());
        table.signals(WorkerId(0)).set_breaker(BreakerState::Open);
        table.set_health(WorkerId(1), Health::Unhealthy);
        let credit = table.credit(0, WorkerId(1), 7);
        let catalog = ModelCatalog::build(
            [(WorkerId(0), Some(&models[..])), (WorkerId(1), None)].into_iter(),
        );
        let mut out = String::new();
        render_worker_gauges(&table, &catalog, &mut out);
        for line in [
            "# TYPE smg_engine_running_requests gauge",
            "smg_engine_running_requests{worker=\"http://127.0.0.1:1\",model=\"a\",dp_rank=\"0\"} 4",
            "smg_engine_waiting_requests{worker=\"http://127.0.0.1:1\",model=\"a\",dp_rank=\"0\"} 2",
            "smg_engine_gen_throughput{worker=\"http://127.0.0.1:1\",model=\"a\",dp_rank=\"0\"} 40",
            "smg_engine_cache_hit_rate{worker=\"http://127.0.0.1:1\",model=\"a\",dp_rank=\"0\"} 0.5",
            "smg_engine_token_usage{worker=\"http://127.0.0.1:1\",model=\"a\",dp_rank=\"0\"} 0.3",
            "smg_worker_cb_state{worker=\"http://127.0.0.1:1\"} 1",
            "smg_worker_cb_state{worker=\"http://127.0.0.1:2\"} 0",
            "smg_worker_health{worker=\"http://127.0.0.1:1\"} 1",
            "smg_worker_health{worker=\"http://127.0.0.1:2\"} 0",
            "smg_worker_requests_active{worker=\"http://127.0.0.1:2\"} 1",
            "kvgate_worker_queued_prompt_tokens{worker=\"http://127.0.0.1:2\"} 7",
            "kvgate_worker_resident_prompt_tokens{worker=\"http://127.0.0.1:2\"} 7",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        assert!(!out.contains("smg_engine_running_requests{worker=\"http://127.0.0.1:2\""));
        drop(credit);
    }

    #[test]
    fn engine_gauges_have_one_series_per_rank() {
        let specs = [WorkerSpec::resolve("http://127.0.0.1:1").unwrap()];
        let table = WorkerTable::new(1, &specs);
        let report = parse_v1_loads(
            br#"{"loads":[{"dp_rank":0,"num_running_reqs":4,"num_waiting_reqs":0},
                          {"dp_rank":1,"num_running_reqs":1,"num_waiting_reqs":3}]}"#,
        )
        .unwrap();
        table
            .signals(WorkerId(0))
            .set_load(Some(report), &Default::default());
        let mut out = String::new();
        render_worker_gauges(&table, &ModelCatalog::default(), &mut out);
        for line in [
            "smg_engine_running_requests{worker=\"http://127.0.0.1:1\",model=\"unknown\",dp_rank=\"0\"} 4",
            "smg_engine_running_requests{worker=\"http://127.0.0.1:1\",model=\"unknown\",dp_rank=\"1\"} 1",
            "smg_engine_waiting_requests{worker=\"http://127.0.0.1:1\",model=\"unknown\",dp_rank=\"1\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let gauges = vec![("m\"1".to_string(), ModelGauges::default())];
        let mut out = String::new();
        render_tree_gauges(&gauges, &mut out);
        assert!(
            out.contains("smg_cache_tree_chars{model=\"m\\\"1\"} 0\n"),
            "{out}"
        );
    }

    #[test]
    fn tree_tenants_are_one_series_per_tree() {
        let mut g = ModelGauges::default();
        g.string.tenants = 3;
        g.token.tenants = 1;
        let mut out = String::new();
        render_tree_gauges(&[("m".to_string(), g)], &mut out);
        assert!(out.contains("smg_cache_tree_tenants{model=\"m\",tree=\"string\"} 3\n"));
        assert!(out.contains("smg_cache_tree_tenants{model=\"m\",tree=\"token\"} 1\n"));
        assert!(
            !out.contains("smg_cache_tree_tenants{model=\"m\"}"),
            "{out}"
        );
    }
}
