//! The route phase: the seam where a policy picks a worker. `Router::prepare` extracts the
//! routing input once per request (and looks it up in the index); `Router::route` gets the
//! published `WorkerView` and returns a `WorkerId` or `None` when no eligible worker is left;
//! `Router::record` gives the index key the control core inserts. All synchronous, no I/O: the
//! policies themselves live in `crate::policy` and are testable without sockets.

use std::sync::Arc;

use super::codec::RequestHead;
use super::endpoint::Endpoint;
use crate::index::IndexReader;
use crate::limits::UPSTREAM_ATTEMPTS_MAX;
use crate::policy::{CoreRouting, PolicyConfig, PolicyMetrics, RecordKey, WorkerStatus};
use crate::request::{
    Endpoint as RequestEndpoint, RequestError, RoutingHeaders, RoutingMode, ROUTING_KEY_HEADER,
    ROUTING_TOKENS_HEADER, TARGET_WORKER_HEADER,
};
use crate::workers::admin::ModelWorkers;
use crate::workers::load::LoadReport;
use crate::workers::table::{Roster, WorkerTable};
use crate::workers::WorkerId;

/// The request as the route phase sees it.
#[derive(Debug)]
pub struct RouteInput<'a> {
    /// The classified endpoint.
    pub endpoint: Endpoint,
    /// The parsed head; its spans index `head_buf`.
    pub head: &'a RequestHead,
    /// The buffer the head was parsed from.
    pub head_buf: &'a [u8],
    /// The complete request body (de-chunked).
    pub body: &'a [u8],
    /// The workers serving the requested model (`workers::admin::ModelCatalog`).
    pub models: ModelWorkers<'a>,
    /// This request's index key (cache_aware), taken right after `Router::prepare`.
    pub record: Option<RecordKey>,
}

/// The published worker state a policy reads: the roster and the table's atomics.
#[derive(Debug, Clone, Copy)]
pub struct WorkerView<'a> {
    /// Active workers.
    pub roster: &'a Roster,
    /// Health and in-flight counts.
    pub table: &'a WorkerTable,
}

/// Workers already tried for this request; the retry loop excludes them.
#[derive(Debug, Default)]
pub struct TriedWorkers {
    ids: [WorkerId; UPSTREAM_ATTEMPTS_MAX],
    len: usize,
}

impl TriedWorkers {
    /// Remembers `id` (attempts are capped, so the list never overflows).
    pub fn insert(&mut self, id: WorkerId) {
        if self.len < self.ids.len() && !self.contains(id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    /// Whether `id` was tried.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.ids[..self.len].contains(&id)
    }
}

/// A data core's routing state (the policy, its scratch buffers, its index reader), one per
/// core: no sharing. The work lives in `policy::CoreRouting`; this adapts the gateway's request
/// and worker view to it.
#[derive(Debug)]
pub struct Router {
    routing: CoreRouting,
}

impl Router {
    /// A router for `policy`; `seed` makes random choices reproducible; `reader` is this core's
    /// index handle (cache_aware), `metrics` this core's decision counters.
    pub fn new(
        policy: PolicyConfig,
        seed: u64,
        reader: Option<IndexReader>,
        metrics: Arc<PolicyMetrics>,
    ) -> Self {
        Router {
            routing: CoreRouting::new(policy, seed, reader, metrics),
        }
    }

    /// The extract phase, once per request: reads the routing input from the body and headers
    /// and looks it up in the index. A body that is not a JSON object is an error (400).
    pub fn prepare(
        &mut self,
        endpoint: Endpoint,
        head: &RequestHead,
        head_buf: &[u8],
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), RequestError> {
        let endpoint = match endpoint {
            Endpoint::Generate => RequestEndpoint::Generate,
            Endpoint::ChatCompletions => RequestEndpoint::ChatCompletions,
            Endpoint::Completions => RequestEndpoint::Completions,
            // Only the four routed endpoints reach the proxy; anything else routes as text.
            _ => RequestEndpoint::Messages,
        };
        let header = |name| head.headers.get(head_buf, name);
        let headers = RoutingHeaders {
            mode: RoutingMode::Regular,
            routing_tokens: header(ROUTING_TOKENS_HEADER),
            routing_key: header(ROUTING_KEY_HEADER),
            target_worker: header(TARGET_WORKER_HEADER),
        };
        self.routing.prepare(endpoint, headers, body, now_ms)
    }

    /// The `model` field of the prepared request (empty when absent).
    pub fn model(&self) -> &str {
        self.routing.model()
    }

    /// Picks a healthy worker not in `tried`, or `None` if there is none (after `prepare`).
    pub fn route(
        &mut self,
        input: &RouteInput<'_>,
        view: WorkerView<'_>,
        tried: &TriedWorkers,
    ) -> Option<WorkerId> {
        let workers = view
            .roster
            .workers
            .iter()
            .map(|w| (w.id, w.spec.url.as_str()));
        let status_of = |id: WorkerId| {
            let signals = view.table.signals(id);
            // Generation before report: a report published in between is read with the older
            // generation's credits, an overestimate that lasts one request.
            let generation = signals.load_generation();
            WorkerStatus {
                eligible: view.table.is_eligible(id)
                    && input.models.allows(id)
                    && !tried.contains(id),
                in_flight: view.table.inflight(id),
                load: signals
                    .peek_load()
                    .as_deref()
                    .map(LoadReport::to_policy_load),
                credited_tokens: view.table.queued_tokens(id, generation),
                resident_tokens: view.table.resident_tokens(id, generation),
                drained_tokens: view.table.drained_tokens(id, generation),
                // This core's own count: `CoreRouting::choose` fills it in.
                placed_tokens: 0.0,
            }
        };
        self.routing.choose(workers, status_of)
    }

    /// The prompt tokens the prepared request credits to its worker (`WorkerTable::credit`).
    pub fn request_tokens(&self) -> u64 {
        self.routing.request_tokens()
    }

    /// The index key of the prepared request (cache_aware), for the control core. Take it right
    /// after `prepare`, before any `.await`: the router's input is the last prepared request's.
    pub fn record_key(&mut self) -> Option<RecordKey> {
        self.routing.record_key()
    }

    /// Remembers that `key` went to `worker` (this core's recent-dispatch map).
    pub fn remember(&mut self, key: &RecordKey, worker: WorkerId, tick_ms: u64) {
        self.routing.remember(key, worker, tick_ms);
    }

    /// Marks this core quiescent for index reclamation (the idle sweeper calls it).
    pub fn quiesce(&mut self) {
        self.routing.quiesce();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_worker_url;
    use crate::http::codec::parse_request_head;
    use crate::policy::{PolicyArgs, PolicyKind};
    use crate::workers::table::Health;

    fn router(kind: PolicyKind, seed: u64) -> Router {
        let args = PolicyArgs {
            policy: kind,
            ..PolicyArgs::default()
        };
        let config = args.validate().unwrap();
        Router::new(config, seed, None, Arc::new(PolicyMetrics::default()))
    }

    const REQ: &[u8] = b"POST /generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";

    fn table(n: usize) -> WorkerTable {
        let specs: Vec<_> = (0..n)
            .map(|i| parse_worker_url(&format!("http://127.0.0.1:{}", 41000 + i)).unwrap())
            .collect();
        WorkerTable::new(1, &specs)
    }

    fn pick(router: &mut Router, table: &WorkerTable, tried: &TriedWorkers) -> Option<WorkerId> {
        pick_body(router, table, tried, b"{}")
    }

    /// Routes `body` (a `/generate` body).
    fn pick_body(
        router: &mut Router,
        table: &WorkerTable,
        tried: &TriedWorkers,
        body: &[u8],
    ) -> Option<WorkerId> {
        let head = parse_request_head(REQ).unwrap().unwrap();
        let input = RouteInput {
            endpoint: Endpoint::Generate,
            head: &head,
            head_buf: REQ,
            body,
            models: ModelWorkers::Any,
            record: None,
        };
        let roster = table.roster();
        router
            .prepare(input.endpoint, input.head, input.head_buf, input.body, 0)
            .unwrap();
        router.route(
            &input,
            WorkerView {
                roster: &roster,
                table,
            },
            tried,
        )
    }

    #[test]
    fn round_robin_cycles_and_skips_unhealthy() {
        let table = table(3);
        let mut router = router(PolicyKind::RoundRobin, 0);
        let none = TriedWorkers::default();
        let picks: Vec<u16> = (0..6)
            .map(|_| pick(&mut router, &table, &none).unwrap().0)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        table.set_health(WorkerId(1), Health::Unhealthy);
        let picks: Vec<u16> = (0..4)
            .map(|_| pick(&mut router, &table, &none).unwrap().0)
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn tried_workers_are_excluded_until_none_is_left() {
        let table = table(2);
        let mut router = router(PolicyKind::Random, 7);
        let mut tried = TriedWorkers::default();
        let first = pick(&mut router, &table, &tried).unwrap();
        tried.insert(first);
        let second = pick(&mut router, &table, &tried).unwrap();
        assert_ne!(first, second);
        tried.insert(second);
        assert_eq!(pick(&mut router, &table, &tried), None);
        assert_eq!(
            pick(&mut router, &table_empty(), &TriedWorkers::default()),
            None
        );
    }

    #[test]
    fn a_dispatch_on_one_core_is_credited_to_the_decisions_of_the_others() {
        let specs: Vec<_> = (0..2)
            .map(|i| parse_worker_url(&format!("http://127.0.0.1:{}", 42000 + i)).unwrap())
            .collect();
        let table = WorkerTable::new(2, &specs);
        for id in [WorkerId(0), WorkerId(1)] {
            let report = LoadReport {
                gen_throughput_tps: Some(1000.0),
                ..LoadReport::default()
            };
            table
                .signals(id)
                .set_load(Some(report), &Default::default());
        }
        let ids: Vec<String> = (0..4096).map(|i| i.to_string()).collect();
        let body = format!(r#"{{"input_ids":[{}]}}"#, ids.join(","));
        let none = TriedWorkers::default();
        for seed in 0..16 {
            let (mut core0, mut core1) = (
                router(PolicyKind::LeastLoad, seed),
                router(PolicyKind::LeastLoad, seed + 100),
            );
            let first = pick_body(&mut core0, &table, &none, body.as_bytes()).unwrap();
            assert_eq!(core0.request_tokens(), 4096);
            let in_flight = table.credit(0, first, core0.request_tokens());
            // Core 1 never sent anything, yet sees core 0's 4,096 tokens in flight.
            let second = pick_body(&mut core1, &table, &none, body.as_bytes()).unwrap();
            assert_ne!(first, second, "seed {seed}");
            drop(in_flight);
        }
    }

    fn table_empty() -> WorkerTable {
        WorkerTable::new(1, &[])
    }
}
