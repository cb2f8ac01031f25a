//! Per-core counters and histograms, merged on scrape into the Prometheus text exposition.
//!
//! Each core (every data core, plus the control core in the last slot) owns one cache-padded
//! `CoreMetrics` and is its only writer, so counting is a relaxed load and store, never a
//! contended atomic, and never an allocation. `Metrics::render` sums the slots when `/metrics`
//! is scraped; requests are also rendered per data core (`kvgate_data_core_requests_total`).
//!
//! Two latency histograms per method and path ([`Latency`]): `smg_http_request_duration_seconds` (SMG's
//! name and meaning: from the request read to the response head written) and
//! `kvgate_http_request_e2e_seconds` (to the last response byte written), both with
//! [`LATENCY_BOUNDS_S`] buckets.
//!
//! Per worker (`worker` label, one series per registered worker, so the label set is bounded by
//! `WORKERS_MAX`): `smg_worker_errors_total`, `smg_worker_selection_total`,
//! `smg_worker_retries_total` and `smg_worker_cb_transitions_total` ([`WorkerEvent`]), with
//! SMG's labels plus `worker`. Per endpoint: `smg_worker_retries_exhausted_total` and
//! `smg_router_ttft_seconds` (a streamed answer's first body byte).
//!
//! To add a counter: add a `Counter` variant and its line in `COUNTER_DEFS` (name, help). Names
//! follow SMG (`smg_*`) where SMG has the metric, `kvgate_*` where it does not.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::limits::STATUS_CODES_COUNTED;
use crate::request::{Endpoint, Method};

mod discovery;
mod workers;

pub use discovery::DiscoveryFigures;

pub use workers::{
    endpoint_label, BreakerOutcomes, BreakerTransitions, WorkerCounters, WorkerLabels,
};

/// Upper bounds of the latency histogram buckets, in seconds, then `+Inf`: SMG's 29 (its
/// `*duration_seconds`, `*ttft_seconds` and `*tpot_seconds` buckets), 1 ms (a gateway answering
/// locally) to 2 hours (a long generation streamed end to end), so SMG's dashboards' quantiles
/// read the same.
pub const LATENCY_BOUNDS_S: [f64; 29] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 240.0, 300.0, 480.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
];
const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_S.len() + 1;

/// Which latency a histogram observation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Latency {
    /// From the whole request read to the response head written (SMG's
    /// `smg_http_request_duration_seconds`: a stream's body is not included).
    FirstByte,
    /// From the whole request read to the last response byte written.
    EndToEnd,
}

/// (name, help) of each [`Latency`] histogram, in variant order.
const LATENCY_DEFS: [(&str, &str); 2] = [
    (
        "smg_http_request_duration_seconds",
        "Time from the request read until the response head is written (time to first byte)",
    ),
    (
        "kvgate_http_request_e2e_seconds",
        "Time from the request read until the last response byte is written",
    ),
];

/// One histogram per method and path (SMG's labels): non-cumulative bucket counts (the last is
/// `+Inf`) and the sum in microseconds (an integer, so a single writer adds with a plain store).
#[derive(Debug)]
struct LatencyHistogram {
    buckets: [[[AtomicU64; LATENCY_BUCKETS]; Endpoint::COUNT]; METHODS.len()],
    sum_us: [[AtomicU64; Endpoint::COUNT]; METHODS.len()],
}

impl LatencyHistogram {
    fn new() -> Self {
        let zero = || AtomicU64::new(0);
        LatencyHistogram {
            buckets: std::array::from_fn(|_| {
                std::array::from_fn(|_| std::array::from_fn(|_| zero()))
            }),
            sum_us: std::array::from_fn(|_| std::array::from_fn(|_| zero())),
        }
    }
}

fn latency_bucket(seconds: f64) -> usize {
    LATENCY_BOUNDS_S
        .iter()
        .position(|&bound| seconds <= bound)
        .unwrap_or(LATENCY_BUCKETS - 1)
}

/// A plain counter, summed over cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Client connections accepted.
    DownstreamConnectionsAccepted,
    /// Upstream connections opened (pool misses).
    UpstreamConnectionsOpened,
    /// Requests sent on a pooled upstream connection.
    UpstreamConnectionsReused,
    /// Connecting to a worker failed.
    UpstreamConnectErrors,
    /// A worker closed or reset a connection before its response was complete.
    UpstreamClosedErrors,
    /// A worker answered with malformed HTTP.
    UpstreamMalformedErrors,
    /// A worker did not answer within `--request-timeout-secs` or
    /// `--upstream-first-byte-timeout-secs`, or fell silent past `--upstream-idle-timeout-secs`.
    UpstreamTimeouts,
    /// Upstream attempts retried after a refused or reset connection.
    UpstreamRetries,
    /// Pooled worker connections found closed before any response byte (an engine restarted,
    /// or closed an idle connection): retried on a fresh connection, not counted as errors.
    UpstreamStaleConnections,
    /// Clients that went away before their response was complete.
    DownstreamAborts,
    /// Dispatch records dropped because a data core's queue to the control core was full.
    DispatchRecordsDropped,
    /// Dispatch records (index inserts) the control core applied.
    DispatchRecordsApplied,
    /// Attempt outcomes dropped because a data core's queue to the control core was full (a
    /// circuit breaker then reacts a little later).
    AttemptRecordsDropped,
    /// Hash-index heads not recorded because the map held its most heads (until the sweep).
    PlacementHeadsRefused,
    /// Responses cut short because the worker failed after bytes reached the client (these
    /// cannot be retried; streaming clients get an SSE error event when the framing allows).
    UpstreamResponsesCut,
    /// Requests answered 503 because their body would take their data core past
    /// `--max-inflight-body-bytes-per-core`.
    BodyBudgetRejections,
    /// gRPC workers' output: tool-call markup that could not be parsed (given back to the
    /// client as content) or a call cut short by the end of the output.
    ToolParseFailures,
}

impl Counter {
    /// Number of counters.
    pub const COUNT: usize = COUNTER_DEFS.len();
}

/// Name and help of each `Counter`, in variant order.
const COUNTER_DEFS: [(&str, &str); 17] = [
    (
        "kvgate_downstream_connections_accepted_total",
        "Client connections accepted.",
    ),
    (
        "kvgate_upstream_connections_opened_total",
        "Upstream connections opened.",
    ),
    (
        "kvgate_upstream_connections_reused_total",
        "Requests sent on pooled upstream connections.",
    ),
    (
        "kvgate_upstream_connect_errors_total",
        "Failed connections to workers.",
    ),
    (
        "kvgate_upstream_closed_errors_total",
        "Worker connections closed or reset mid-response.",
    ),
    (
        "kvgate_upstream_malformed_errors_total",
        "Malformed worker responses.",
    ),
    (
        "kvgate_upstream_timeouts_total",
        "Worker requests past --request-timeout-secs, --upstream-first-byte-timeout-secs or --upstream-idle-timeout-secs.",
    ),
    (
        "kvgate_upstream_retries_total",
        "Upstream attempts retried.",
    ),
    (
        "kvgate_upstream_stale_connections_total",
        "Pooled worker connections found closed before the response began (retried on a fresh connection).",
    ),
    (
        "kvgate_downstream_aborts_total",
        "Clients gone before their response was complete.",
    ),
    (
        "kvgate_dispatch_records_dropped_total",
        "Dispatch records dropped on a full queue.",
    ),
    (
        "kvgate_dispatch_records_applied_total",
        "Dispatch records (index inserts) applied by the control core.",
    ),
    (
        "kvgate_attempt_records_dropped_total",
        "Attempt outcomes for the circuit breakers dropped on a full queue.",
    ),
    (
        "kvgate_cache_placement_heads_refused_total",
        "Hash-index heads not recorded because the map held its most heads.",
    ),
    (
        "kvgate_upstream_responses_cut_total",
        "Responses cut short by a worker failure after bytes reached the client.",
    ),
    (
        "kvgate_body_budget_rejections_total",
        "Requests answered 503 because their body would pass --max-inflight-body-bytes-per-core.",
    ),
    (
        "kvgate_tool_parse_failures_total",
        "Tool-call markup from gRPC workers that could not be parsed (returned as content) or was cut short.",
    ),
];

const METHODS: [(&str, Method); 4] = [
    ("GET", Method::Get),
    ("POST", Method::Post),
    ("HEAD", Method::Head),
    ("OTHER", Method::Other),
];

fn method_slot(method: Method) -> usize {
    METHODS
        .iter()
        .position(|(_, m)| *m == method)
        .unwrap_or(METHODS.len() - 1)
}

fn status_slot(status: u16) -> usize {
    usize::from(status)
        .checked_sub(100)
        .filter(|s| *s < STATUS_CODES_COUNTED)
        .unwrap_or(STATUS_CODES_COUNTED)
}

/// The counters of one core. Only that core writes them.
#[derive(Debug)]
pub struct CoreMetrics {
    counters: [AtomicU64; Counter::COUNT],
    requests: [[AtomicU64; Endpoint::COUNT]; METHODS.len()],
    responses: Box<[[AtomicU64; STATUS_CODES_COUNTED + 1]; Endpoint::COUNT]>,
    latency: [LatencyHistogram; 2],
    workers: WorkerCounters,
    /// Requests this core is serving now (a gauge, set by the core).
    requests_in_flight: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    // Single writer: a relaxed load and store is enough and avoids a locked instruction.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

impl CoreMetrics {
    fn new() -> Self {
        let responses = (0..Endpoint::COUNT)
            .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
            .collect::<Vec<_>>()
            .into_boxed_slice();
        CoreMetrics {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            requests: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            responses: responses
                .try_into()
                .unwrap_or_else(|_| unreachable!("sized by COUNT")),
            latency: [LatencyHistogram::new(), LatencyHistogram::new()],
            workers: WorkerCounters::new(),
            requests_in_flight: AtomicU64::new(0),
        }
    }

    /// This core's per-worker and per-endpoint routing counters.
    pub fn workers(&self) -> &WorkerCounters {
        &self.workers
    }

    /// Observes one request's latency of kind `which` for `method` and `endpoint`.
    pub fn observe_latency(
        &self,
        which: Latency,
        (method, endpoint): (Method, Endpoint),
        elapsed: Duration,
    ) {
        let histogram = &self.latency[which as usize];
        let (m, e) = (method_slot(method), endpoint as usize);
        let bucket = latency_bucket(elapsed.as_secs_f64());
        bump(&histogram.buckets[m][e][bucket], 1);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        bump(&histogram.sum_us[m][e], micros);
    }

    /// Requests this core counted (every method, path and status).
    fn requests_total(&self) -> u64 {
        self.requests
            .iter()
            .flatten()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Adds one to `counter`.
    pub fn incr(&self, counter: Counter) {
        bump(&self.counters[counter as usize], 1);
    }

    /// Adds `n` to `counter`.
    pub fn add(&self, counter: Counter, n: u64) {
        bump(&self.counters[counter as usize], n);
    }

    /// Sets the requests this core is serving now.
    pub fn set_requests_in_flight(&self, n: usize) {
        self.requests_in_flight.store(n as u64, Ordering::Relaxed);
    }

    /// Counts one request and its response status.
    pub fn record_request(&self, method: Method, endpoint: Endpoint, status: u16) {
        bump(&self.requests[method_slot(method)][endpoint as usize], 1);
        bump(&self.responses[endpoint as usize][status_slot(status)], 1);
    }
}

/// All cores' counters.
#[derive(Debug)]
pub struct Metrics {
    cores: Box<[CachePadded<CoreMetrics>]>,
    breaker_transitions: BreakerTransitions,
    breaker_outcomes: BreakerOutcomes,
    /// Health probes that passed and failed (the control core's to write).
    health_checks: [AtomicU64; 2],
    discovery: DiscoveryFigures,
}

impl Metrics {
    /// Slots for `data_cores` data cores plus the control core.
    pub fn new(data_cores: usize) -> Self {
        Metrics {
            cores: (0..=data_cores)
                .map(|_| CachePadded::new(CoreMetrics::new()))
                .collect(),
            breaker_transitions: BreakerTransitions::new(),
            breaker_outcomes: BreakerOutcomes::new(),
            health_checks: std::array::from_fn(|_| AtomicU64::new(0)),
            discovery: DiscoveryFigures::default(),
        }
    }

    /// The counters of data core `core_id`.
    pub fn core(&self, core_id: usize) -> &CoreMetrics {
        &self.cores[core_id]
    }

    /// The control core's counters.
    pub fn control(&self) -> &CoreMetrics {
        &self.cores[self.cores.len() - 1]
    }

    /// The circuit breakers' transitions (the control core's to write).
    pub fn breaker_transitions(&self) -> &BreakerTransitions {
        &self.breaker_transitions
    }

    /// The outcomes the circuit breakers heard (the control core's to write).
    pub fn breaker_outcomes(&self) -> &BreakerOutcomes {
        &self.breaker_outcomes
    }

    /// Kubernetes service discovery's figures (the discovery thread's to write).
    pub fn discovery(&self) -> &DiscoveryFigures {
        &self.discovery
    }

    /// Counts one health probe of a worker (the control core's to call).
    pub fn count_health_check(&self, passed: bool) {
        bump(&self.health_checks[usize::from(!passed)], 1);
    }

    /// Renders the per-worker and per-endpoint routing families for the registered `workers`
    /// (`policy`: the routing policy's SMG name, the `policy` label).
    pub fn render_workers(&self, workers: &[WorkerLabels], policy: &str, out: &mut String) {
        let cores: Vec<&WorkerCounters> = self.cores.iter().map(|c| &c.workers).collect();
        let breakers = (&self.breaker_transitions, &self.breaker_outcomes);
        workers::render(&cores, breakers, workers, policy, out);
    }

    /// The sum of `counter` over all cores.
    pub fn total(&self, counter: Counter) -> u64 {
        self.cores
            .iter()
            .map(|c| c.counters[counter as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// Renders every counter in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        for (i, (name, help)) in COUNTER_DEFS.iter().enumerate() {
            let total: u64 = self
                .cores
                .iter()
                .map(|c| c.counters[i].load(Ordering::Relaxed))
                .sum();
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {total}"
            );
        }
        self.render_requests(out);
        self.render_in_flight_and_health_checks(out);
        self.discovery.render(out);
        self.render_responses(out);
        self.render_data_cores(out);
        for (which, (name, help)) in LATENCY_DEFS.iter().enumerate() {
            self.render_latency(which, name, help, out);
        }
    }

    /// Requests per data core (the control core's slot serves none).
    fn render_data_cores(&self, out: &mut String) {
        let name = "kvgate_data_core_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests served per data core\n# TYPE {name} counter"
        );
        let data_cores = &self.cores[..self.cores.len() - 1];
        for (core, metrics) in data_cores.iter().enumerate() {
            let n = metrics.requests_total();
            let _ = writeln!(out, "{name}{{core=\"{core}\"}} {n}");
        }
    }

    /// One latency histogram, per method and path with at least one observation.
    fn render_latency(&self, which: usize, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (m, (method, _)) in METHODS.iter().enumerate() {
            for endpoint in Endpoint::ALL {
                let e = endpoint as usize;
                let count_in = |bucket: usize| -> u64 {
                    self.cores
                        .iter()
                        .map(|c| c.latency[which].buckets[m][e][bucket].load(Ordering::Relaxed))
                        .sum()
                };
                if (0..LATENCY_BUCKETS).map(count_in).sum::<u64>() == 0 {
                    continue;
                }
                let labels = format!("method=\"{method}\",path=\"{}\"", endpoint.label());
                let sum_us: u64 = self
                    .cores
                    .iter()
                    .map(|c| c.latency[which].sum_us[m][e].load(Ordering::Relaxed))
                    .sum();
                write_histogram(out, name, &labels, &count_in, sum_us as f64 / 1e6);
            }
        }
    }

    /// `smg_http_connections_active` (SMG's meaning: the requests in flight, its in-flight
    /// request tracker's size) and `smg_worker_health_checks_total`.
    fn render_in_flight_and_health_checks(&self, out: &mut String) {
        let name = "smg_http_connections_active";
        let in_flight: u64 = self
            .cores
            .iter()
            .map(|c| c.requests_in_flight.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "# HELP {name} Requests being served now\n# TYPE {name} gauge\n{name} {in_flight}"
        );
        let name = "smg_worker_health_checks_total";
        let _ = writeln!(
            out,
            "# HELP {name} Worker health probes by result\n# TYPE {name} counter"
        );
        for (i, result) in ["success", "failure"].iter().enumerate() {
            let n = self.health_checks[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}{{worker_type=\"regular\",result=\"{result}\"}} {n}"
            );
        }
    }

    fn render_requests(&self, out: &mut String) {
        out.push_str("# HELP smg_http_requests_total Total HTTP requests\n");
        out.push_str("# TYPE smg_http_requests_total counter\n");
        for (m, (method, _)) in METHODS.iter().enumerate() {
            for endpoint in Endpoint::ALL {
                let e = endpoint as usize;
                let n: u64 = self
                    .cores
                    .iter()
                    .map(|c| c.requests[m][e].load(Ordering::Relaxed))
                    .sum();
                if n > 0 {
                    let path = endpoint.label();
                    let _ = writeln!(
                        out,
                        "smg_http_requests_total{{method=\"{method}\",path=\"{path}\"}} {n}"
                    );
                }
            }
        }
    }

    fn render_responses(&self, out: &mut String) {
        out.push_str("# HELP smg_http_responses_total HTTP responses by path and status\n");
        out.push_str("# TYPE smg_http_responses_total counter\n");
        for endpoint in Endpoint::ALL {
            let e = endpoint as usize;
            for slot in 0..=STATUS_CODES_COUNTED {
                let n: u64 = self
                    .cores
                    .iter()
                    .map(|c| c.responses[e][slot].load(Ordering::Relaxed))
                    .sum();
                if n == 0 {
                    continue;
                }
                let path = endpoint.label();
                let code = if slot == STATUS_CODES_COUNTED {
                    0
                } else {
                    slot + 100
                };
                let _ = writeln!(
                    out,
                    "smg_http_responses_total{{path=\"{path}\",status_code=\"{code}\"}} {n}"
                );
            }
        }
    }
}

/// One latency histogram series: its cumulative `_bucket` lines over `LATENCY_BOUNDS_S` (each
/// bucket's count from `count_in`), `_sum` (seconds) and `_count`.
fn write_histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    count_in: &dyn Fn(usize) -> u64,
    sum_s: f64,
) {
    let mut cumulative = 0u64;
    for bucket in 0..LATENCY_BUCKETS {
        cumulative += count_in(bucket);
        let le = LATENCY_BOUNDS_S
            .get(bucket)
            .map_or_else(|| "+Inf".to_string(), f64::to_string);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum_s}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_merge_across_cores() {
        let metrics = Metrics::new(2);
        metrics.core(0).incr(Counter::UpstreamRetries);
        metrics.core(1).add(Counter::UpstreamRetries, 2);
        metrics.control().incr(Counter::DispatchRecordsApplied);
        metrics
            .core(0)
            .record_request(Method::Post, Endpoint::ChatCompletions, 200);
        metrics
            .core(1)
            .record_request(Method::Post, Endpoint::ChatCompletions, 200);
        metrics
            .core(1)
            .record_request(Method::Get, Endpoint::Unknown, 404);
        assert_eq!(metrics.total(Counter::UpstreamRetries), 3);
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(text.contains("kvgate_upstream_retries_total 3\n"), "{text}");
        assert!(text.contains("kvgate_dispatch_records_applied_total 1\n"));
        assert!(text.contains(
            "smg_http_requests_total{method=\"POST\",path=\"/v1/chat/completions\"} 2\n"
        ));
        assert!(text.contains(
            "smg_http_responses_total{path=\"/v1/chat/completions\",status_code=\"200\"} 2\n"
        ));
        assert!(text.contains("smg_http_responses_total{path=\"other\",status_code=\"404\"} 1\n"));
    }

    #[test]
    fn latency_histograms_and_data_core_requests_render_per_path_and_core() {
        let metrics = Metrics::new(2);
        let chat = Endpoint::ChatCompletions;
        metrics.core(0).record_request(Method::Post, chat, 200);
        metrics.core(1).record_request(Method::Post, chat, 200);
        metrics.core(1).record_request(Method::Post, chat, 502);
        let ms = Duration::from_millis;
        metrics
            .core(0)
            .observe_latency(Latency::FirstByte, (Method::Post, chat), ms(3));
        metrics
            .core(1)
            .observe_latency(Latency::FirstByte, (Method::Post, chat), ms(40));
        metrics
            .core(1)
            .observe_latency(Latency::EndToEnd, (Method::Post, chat), ms(400));
        let mut text = String::new();
        metrics.render(&mut text);
        for line in [
            "# TYPE smg_http_request_duration_seconds histogram",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.001\"} 0",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.005\"} 1",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.05\"} 2",
            "smg_http_request_duration_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"+Inf\"} 2",
            "smg_http_request_duration_seconds_sum{method=\"POST\",path=\"/v1/chat/completions\"} 0.043",
            "smg_http_request_duration_seconds_count{method=\"POST\",path=\"/v1/chat/completions\"} 2",
            "kvgate_http_request_e2e_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.25\"} 0",
            "kvgate_http_request_e2e_seconds_bucket{method=\"POST\",path=\"/v1/chat/completions\",le=\"0.5\"} 1",
            "kvgate_http_request_e2e_seconds_count{method=\"POST\",path=\"/v1/chat/completions\"} 1",
            "kvgate_data_core_requests_total{core=\"0\"} 1",
            "kvgate_data_core_requests_total{core=\"1\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // The control core serves no requests: no series for its slot.
        assert!(!text.contains("kvgate_data_core_requests_total{core=\"2\"}"));
        assert!(
            !text.contains("path=\"/generate\",le="),
            "empty paths are left out"
        );
    }

    #[test]
    fn latency_buckets_are_smgs_29_up_to_two_hours() {
        assert_eq!(LATENCY_BOUNDS_S.len(), 29);
        assert_eq!(LATENCY_BOUNDS_S.last(), Some(&7200.0));
        assert!(LATENCY_BOUNDS_S.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(latency_bucket(3600.5), 27);
        assert_eq!(latency_bucket(9000.0), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn per_worker_families_sum_cores_and_render_only_registered_workers() {
        use crate::error::ErrorKind;
        use crate::ids::WorkerId;
        use crate::workers::breaker::BreakerState;
        let metrics = Metrics::new(2);
        let (w0, w1, gone) = (WorkerId(0), WorkerId(1), WorkerId(7));
        let chat = Endpoint::ChatCompletions;
        metrics
            .core(0)
            .workers()
            .error(w0, ErrorKind::UpstreamConnect);
        metrics
            .core(1)
            .workers()
            .error(w0, ErrorKind::UpstreamConnect);
        metrics
            .core(1)
            .workers()
            .error(w1, ErrorKind::UpstreamTimeout);
        // Not a worker's error: not counted under it.
        metrics.core(1).workers().error(w1, ErrorKind::ClientClosed);
        metrics
            .core(0)
            .workers()
            .error(gone, ErrorKind::UpstreamConnect);
        for _ in 0..3 {
            metrics.core(0).workers().selected(w1);
        }
        metrics.core(1).workers().selected(w0);
        metrics.core(0).workers().retried(w0, chat);
        metrics
            .core(1)
            .workers()
            .retries_exhausted(Endpoint::Generate);
        metrics
            .core(0)
            .workers()
            .observe_ttft(chat, Duration::from_millis(30));
        metrics
            .core(1)
            .workers()
            .observe_ttft(chat, Duration::from_secs(2));
        let breakers = metrics.breaker_transitions();
        breakers.record(w1, BreakerState::Closed, BreakerState::Open);
        breakers.record(w1, BreakerState::Open, BreakerState::HalfOpen);
        breakers.record(w1, BreakerState::HalfOpen, BreakerState::Open);
        breakers.record(w1, BreakerState::Open, BreakerState::HalfOpen);
        breakers.record(w1, BreakerState::Open, BreakerState::Open);
        let labels = |id: WorkerId, url: &str| WorkerLabels {
            id,
            url: url.to_string(),
            model: "m".to_string(),
            worker_type: "regular",
            policy: None,
        };
        let workers = [labels(w0, "http://a"), labels(w1, "http://b")];
        let mut text = String::new();
        metrics.render_workers(&workers, "cache_aware", &mut text);
        let regular = "worker_type=\"regular\",connection_mode=\"http\"";
        for line in [
            "# TYPE smg_worker_errors_total counter".to_string(),
            format!("smg_worker_errors_total{{{regular},error_type=\"connect_error\",worker=\"http://a\"}} 2"),
            format!("smg_worker_errors_total{{{regular},error_type=\"timeout\",worker=\"http://b\"}} 1"),
            format!("smg_worker_errors_total{{{regular},error_type=\"connect_error\",worker=\"http://b\"}} 0"),
            format!("smg_worker_selection_total{{{regular},model=\"m\",policy=\"cache_aware\",worker=\"http://b\"}} 3"),
            format!("smg_worker_selection_total{{{regular},model=\"m\",policy=\"cache_aware\",worker=\"http://a\"}} 1"),
            "smg_worker_retries_total{worker_type=\"regular\",endpoint=\"chat\",worker=\"http://a\"} 1".to_string(),
            "smg_worker_retries_total{worker_type=\"regular\",endpoint=\"generate\",worker=\"http://a\"} 0".to_string(),
            "smg_worker_retries_exhausted_total{worker_type=\"regular\",endpoint=\"generate\"} 1".to_string(),
            "smg_worker_cb_transitions_total{worker=\"http://b\",from=\"closed\",to=\"open\"} 1".to_string(),
            "smg_worker_cb_transitions_total{worker=\"http://b\",from=\"open\",to=\"half_open\"} 2".to_string(),
            "smg_worker_cb_transitions_total{worker=\"http://b\",from=\"half_open\",to=\"open\"} 1".to_string(),
            "smg_worker_cb_transitions_total{worker=\"http://a\",from=\"closed\",to=\"open\"} 0".to_string(),
            "# TYPE smg_router_ttft_seconds histogram".to_string(),
            "smg_router_ttft_seconds_bucket{router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"chat\",le=\"0.025\"} 0".to_string(),
            "smg_router_ttft_seconds_bucket{router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"chat\",le=\"0.05\"} 1".to_string(),
            "smg_router_ttft_seconds_bucket{router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"chat\",le=\"2.5\"} 2".to_string(),
            "smg_router_ttft_seconds_count{router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"chat\"} 2".to_string(),
            "smg_router_ttft_seconds_sum{router_type=\"http\",backend_type=\"regular\",model=\"any\",endpoint=\"chat\"} 2.03".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // The label set is the registered workers: a slot no roster worker holds is not shown,
        // and a breaker never "transitions" to its own state.
        assert!(!text.contains("worker=\"http://c\""));
        assert_eq!(
            text.matches("error_type=\"connect_error\"").count(),
            2,
            "{text}"
        );
        assert!(!text.contains("from=\"open\",to=\"open\""));
        assert!(
            !text.contains("endpoint=\"generate\",le="),
            "no TTFT series without one"
        );
    }

    #[test]
    fn odd_statuses_land_in_the_overflow_slot() {
        assert_eq!(status_slot(100), 0);
        assert_eq!(status_slot(599), 499);
        assert_eq!(status_slot(42), STATUS_CODES_COUNTED);
        assert_eq!(status_slot(999), STATUS_CODES_COUNTED);
    }
}
