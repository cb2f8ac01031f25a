//! Load reports: `GET /v1/loads` (SGLang schema) or Prometheus `/metrics` (SGLang, vLLM names).
//!
//! Owns [`LoadReport`] (one worker's load, aggregated over its data-parallel ranks), the two
//! parsers that build it ([`parse_v1_loads`], [`parse_prometheus`]), the per-worker memory of
//! which endpoint answers ([`LoadEndpoint`]), and worker overload protection
//! ([`OverloadConfig`], `--worker-overload-*`: a report over a limit takes the worker out of
//! routing). Parsing never panics: malformed input is a
//! typed [`LoadParseError`], and the control core then keeps the worker *without* a signal — a
//! worker without a signal is never penalized for it (the policy treats it as unknown, not busy).

use serde::Deserialize;

use crate::limits::LOAD_BODY_BYTES_MAX;

/// The most data-parallel ranks one report may list. SGLang's largest DP deployments use 64
/// ranks per server; a bound keeps a malformed report from costing unbounded work.
pub const DP_RANKS_MAX: usize = 1024;

/// One worker's load, aggregated over its data-parallel ranks: counts, token totals and
/// throughput are summed; usage, hit rate and utilization are averaged over the ranks that
/// reported them. Fields an engine did not report are `None` and must not be read as zero load.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// Requests the engine is decoding now.
    pub running_requests: u64,
    /// Requests queued, waiting for prefill.
    pub waiting_requests: u64,
    /// Prompt tokens of the queued requests that are not in the engine's cache.
    pub waiting_uncached_tokens: Option<u64>,
    /// KV-cache tokens in use.
    pub used_tokens: Option<u64>,
    /// KV-cache capacity in tokens.
    pub max_total_tokens: Option<u64>,
    /// KV-cache usage in `[0, 1]`, averaged over ranks.
    pub token_usage: Option<f64>,
    /// Generated tokens per second, summed over ranks.
    pub gen_throughput_tps: Option<f64>,
    /// Prefix-cache hit rate in `[0, 1]`, averaged over ranks.
    pub cache_hit_rate: Option<f64>,
    /// Engine utilization in `[0, 1]`, averaged over ranks.
    pub utilization: Option<f64>,
    /// How many data-parallel ranks (or engine series) the report aggregates.
    pub dp_ranks: u32,
    /// Each rank's own figures, for the per-rank `smg_engine_*` gauges (SMG's `dp_rank`
    /// label): filled from `/v1/loads`; empty for a Prometheus report, which is one rank.
    pub ranks: Vec<RankGauges>,
}

/// One data-parallel rank's figures as the `smg_engine_*` gauges show them. Ratios above 1 are
/// clamped to 1, as in the aggregate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankGauges {
    /// The rank's `dp_rank` (its position in the list when the engine leaves it out).
    pub dp_rank: u32,
    /// Requests the rank is decoding.
    pub running_requests: u64,
    /// Requests queued on the rank.
    pub waiting_requests: u64,
    /// KV-cache usage in `[0, 1]`.
    pub token_usage: Option<f64>,
    /// Generated tokens per second.
    pub gen_throughput_tps: Option<f64>,
    /// Prefix-cache hit rate in `[0, 1]`.
    pub cache_hit_rate: Option<f64>,
}

/// Why a load response was not turned into a report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadParseError {
    /// The body is not the expected JSON shape.
    #[error("malformed /v1/loads body: {0}")]
    Json(String),
    /// The body is larger than `limits::LOAD_BODY_BYTES_MAX`.
    #[error("load body of {0} bytes is over the limit")]
    TooLarge(usize),
    /// More ranks than [`DP_RANKS_MAX`].
    #[error("load report lists {0} ranks, over the limit")]
    TooManyRanks(usize),
    /// A number is negative, NaN or infinite.
    #[error("load field {0} is not a finite non-negative number")]
    BadNumber(&'static str),
    /// The body parsed but carries none of the signals we read.
    #[error("load body carries no load signal")]
    NoSignal,
}

/// Which endpoint a worker's load is read from. Starts at `/v1/loads`; a worker that answers it
/// with 404, 405 or 501 is remembered as not having it and is read through `/metrics` from then
/// on (the memory lives per worker, on the control core).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LoadEndpoint {
    /// SGLang's JSON `GET /v1/loads`.
    #[default]
    V1Loads,
    /// Prometheus text `GET /metrics`.
    Metrics,
}

impl LoadEndpoint {
    /// The request path for this endpoint.
    pub fn path(self) -> &'static str {
        match self {
            LoadEndpoint::V1Loads => "/v1/loads",
            LoadEndpoint::Metrics => "/metrics",
        }
    }

    /// The endpoint to use next, given the HTTP status the current one answered with.
    pub fn after_status(self, status: u16) -> LoadEndpoint {
        match (self, status) {
            (LoadEndpoint::V1Loads, 404 | 405 | 501) => LoadEndpoint::Metrics,
            (current, _) => current,
        }
    }
}

/// Parse a load response body read from `endpoint`.
pub fn parse_load_body(endpoint: LoadEndpoint, body: &[u8]) -> Result<LoadReport, LoadParseError> {
    if body.len() > LOAD_BODY_BYTES_MAX {
        return Err(LoadParseError::TooLarge(body.len()));
    }
    match endpoint {
        LoadEndpoint::V1Loads => parse_v1_loads(body),
        LoadEndpoint::Metrics => parse_prometheus(&String::from_utf8_lossy(body)),
    }
}

/// SGLang's `/v1/loads` body: `{"loads": [ {per-rank fields}, ... ], ...}`.
#[derive(Deserialize)]
struct V1LoadsBody {
    loads: Vec<V1RankLoad>,
}

/// One rank of `/v1/loads`. Every field is optional so that older and newer SGLang versions
/// both parse; unknown fields are ignored.
#[derive(Deserialize, Default)]
#[serde(default)]
struct V1RankLoad {
    dp_rank: Option<i64>,
    num_running_reqs: Option<f64>,
    num_waiting_reqs: Option<f64>,
    num_waiting_uncached_tokens: Option<f64>,
    num_used_tokens: Option<f64>,
    max_total_num_tokens: Option<f64>,
    token_usage: Option<f64>,
    gen_throughput: Option<f64>,
    cache_hit_rate: Option<f64>,
    utilization: Option<f64>,
}

/// Parse SGLang's `GET /v1/loads` JSON into one report aggregated over its ranks.
pub fn parse_v1_loads(body: &[u8]) -> Result<LoadReport, LoadParseError> {
    let parsed: V1LoadsBody =
        serde_json::from_slice(body).map_err(|e| LoadParseError::Json(e.to_string()))?;
    if parsed.loads.len() > DP_RANKS_MAX {
        return Err(LoadParseError::TooManyRanks(parsed.loads.len()));
    }
    let mut acc = RankAccumulator::default();
    let mut ranks = Vec::with_capacity(parsed.loads.len());
    for (position, rank) in parsed.loads.iter().enumerate() {
        // Numbers are checked by `add_rank` first: a rank's gauges hold finite, non-negative
        // values only.
        let dp_rank = rank
            .dp_rank
            .and_then(|r| u32::try_from(r).ok())
            .unwrap_or(u32::try_from(position).unwrap_or(u32::MAX));
        acc.add_rank(&RankSample {
            running: rank.num_running_reqs,
            waiting: rank.num_waiting_reqs,
            waiting_uncached_tokens: rank.num_waiting_uncached_tokens,
            used_tokens: rank.num_used_tokens,
            max_total_tokens: rank.max_total_num_tokens,
            token_usage: rank.token_usage,
            gen_throughput: rank.gen_throughput,
            cache_hit_rate: rank.cache_hit_rate,
            utilization: rank.utilization,
        })?;
        let count = |v: Option<f64>| v.map_or(0, |v| v.round() as u64);
        ranks.push(RankGauges {
            dp_rank,
            running_requests: count(rank.num_running_reqs),
            waiting_requests: count(rank.num_waiting_reqs),
            token_usage: rank.token_usage.map(|u| u.min(1.0)),
            gen_throughput_tps: rank.gen_throughput,
            cache_hit_rate: rank.cache_hit_rate.map(|r| r.min(1.0)),
        });
    }
    let mut report = acc.finish(parsed.loads.len())?;
    report.ranks = ranks;
    Ok(report)
}

/// One rank's (or one Prometheus series set's) raw numbers before aggregation.
#[derive(Default, Clone, Copy)]
struct RankSample {
    running: Option<f64>,
    waiting: Option<f64>,
    waiting_uncached_tokens: Option<f64>,
    used_tokens: Option<f64>,
    max_total_tokens: Option<f64>,
    token_usage: Option<f64>,
    gen_throughput: Option<f64>,
    cache_hit_rate: Option<f64>,
    utilization: Option<f64>,
}

/// A sum and a count, for fields summed or averaged over ranks.
#[derive(Default, Clone, Copy)]
struct Total {
    sum: f64,
    count: u32,
}

impl Total {
    fn add(&mut self, name: &'static str, value: Option<f64>) -> Result<(), LoadParseError> {
        let Some(v) = value else { return Ok(()) };
        if !v.is_finite() || v < 0.0 {
            return Err(LoadParseError::BadNumber(name));
        }
        self.sum += v;
        self.count += 1;
        Ok(())
    }

    fn sum(self) -> Option<f64> {
        (self.count > 0).then_some(self.sum)
    }

    fn sum_u64(self) -> Option<u64> {
        // Float-to-int `as` saturates; the inputs are finite and non-negative.
        self.sum().map(|s| s.round() as u64)
    }

    fn mean(self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
}

/// Aggregates ranks: counts, tokens and throughput summed; ratios averaged.
#[derive(Default)]
struct RankAccumulator {
    running: Total,
    waiting: Total,
    waiting_uncached_tokens: Total,
    used_tokens: Total,
    max_total_tokens: Total,
    token_usage: Total,
    gen_throughput: Total,
    cache_hit_rate: Total,
    utilization: Total,
}

impl RankAccumulator {
    fn add_rank(&mut self, s: &RankSample) -> Result<(), LoadParseError> {
        self.running.add("num_running_reqs", s.running)?;
        self.waiting.add("num_waiting_reqs", s.waiting)?;
        self.waiting_uncached_tokens
            .add("num_waiting_uncached_tokens", s.waiting_uncached_tokens)?;
        self.used_tokens.add("num_used_tokens", s.used_tokens)?;
        self.max_total_tokens
            .add("max_total_num_tokens", s.max_total_tokens)?;
        self.token_usage.add("token_usage", s.token_usage)?;
        self.gen_throughput
            .add("gen_throughput", s.gen_throughput)?;
        self.cache_hit_rate
            .add("cache_hit_rate", s.cache_hit_rate)?;
        self.utilization.add("utilization", s.utilization)?;
        Ok(())
    }

    fn finish(self, ranks: usize) -> Result<LoadReport, LoadParseError> {
        let has_signal = self.running.count > 0
            || self.waiting.count > 0
            || self.token_usage.count > 0
            || self.waiting_uncached_tokens.count > 0;
        if !has_signal {
            return Err(LoadParseError::NoSignal);
        }
        Ok(LoadReport {
            running_requests: self.running.sum_u64().unwrap_or(0),
            waiting_requests: self.waiting.sum_u64().unwrap_or(0),
            waiting_uncached_tokens: self.waiting_uncached_tokens.sum_u64(),
            used_tokens: self.used_tokens.sum_u64(),
            max_total_tokens: self.max_total_tokens.sum_u64(),
            token_usage: self.token_usage.mean().map(|u| u.min(1.0)),
            gen_throughput_tps: self.gen_throughput.sum(),
            cache_hit_rate: self.cache_hit_rate.mean().map(|r| r.min(1.0)),
            utilization: self.utilization.mean().map(|u| u.min(1.0)),
            dp_ranks: u32::try_from(ranks).unwrap_or(u32::MAX),
            ranks: Vec::new(),
        })
    }
}

/// The load signal a Prometheus metric name carries, for SGLang (`sglang:` or `sglang_`) and
/// vLLM (`vllm:`) names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PromSignal {
    Running,
    Waiting,
    WaitingUncachedTokens,
    UsedTokens,
    MaxTotalTokens,
    TokenUsage,
    GenThroughput,
    CacheHitRate,
    Utilization,
    /// vLLM's older name for KV usage; read only when the newer one is absent.
    TokenUsageLegacy,
    /// vLLM prefix-cache counters; their ratio is the hit rate when no gauge reports it.
    PrefixCacheHits,
    PrefixCacheQueries,
}

fn prom_signal(name: &str) -> Option<PromSignal> {
    use PromSignal::*;
    if let Some(rest) = name
        .strip_prefix("sglang:")
        .or_else(|| name.strip_prefix("sglang_"))
    {
        return match rest {
            "num_running_reqs" => Some(Running),
            "num_queue_reqs" | "num_waiting_reqs" => Some(Waiting),
            "num_waiting_uncached_tokens" => Some(WaitingUncachedTokens),
            "num_used_tokens" => Some(UsedTokens),
            "max_total_num_tokens" => Some(MaxTotalTokens),
            "token_usage" => Some(TokenUsage),
            "gen_throughput" => Some(GenThroughput),
            "cache_hit_rate" => Some(CacheHitRate),
            "utilization" => Some(Utilization),
            _ => None,
        };
    }
    match name.strip_prefix("vllm:")? {
        "num_requests_running" => Some(Running),
        "num_requests_waiting" => Some(Waiting),
        "kv_cache_usage_perc" => Some(TokenUsage),
        "gpu_cache_usage_perc" => Some(TokenUsageLegacy),
        "prefix_cache_hits_total" => Some(PrefixCacheHits),
        "prefix_cache_queries_total" => Some(PrefixCacheQueries),
        "avg_generation_throughput_toks_per_s" => Some(GenThroughput),
        "gpu_prefix_cache_hit_rate" => Some(CacheHitRate),
        _ => None,
    }
}

/// Split one exposition line into metric name and value, ignoring labels and timestamp.
/// Returns `None` for comments, blank lines and lines that do not parse.
fn prom_line(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_ascii_whitespace())?;
    let name = &line[..name_end];
    let after_labels = if line[name_end..].starts_with('{') {
        // Label values may contain spaces but not an unescaped `}` followed by a space; the
        // last `}` ends the label set.
        let close = line.rfind('}')?;
        &line[close + 1..]
    } else {
        &line[name_end..]
    };
    let value_text = after_labels.split_ascii_whitespace().next()?;
    let value = value_text.parse::<f64>().ok()?;
    Some((name, value))
}

/// Parse Prometheus text exposition with SGLang or vLLM metric names into one report. Each
/// series of a signal (one per DP rank or engine label set) counts as one rank.
pub fn parse_prometheus(text: &str) -> Result<LoadReport, LoadParseError> {
    let mut acc = RankAccumulator::default();
    let mut series_max = 0usize;
    let mut series_per_signal = [0usize; PROM_SIGNALS];
    let mut legacy_usage = Total::default();
    let (mut hits, mut queries) = (Total::default(), Total::default());
    for (name, value) in text.lines().filter_map(prom_line) {
        let Some(signal) = prom_signal(name) else {
            continue;
        };
        let slot = &mut series_per_signal[signal as usize];
        *slot += 1;
        if *slot > DP_RANKS_MAX {
            return Err(LoadParseError::TooManyRanks(*slot));
        }
        match signal {
            PromSignal::TokenUsageLegacy => legacy_usage.add("token_usage", Some(value))?,
            PromSignal::PrefixCacheHits => hits.add("prefix_cache_hits", Some(value))?,
            PromSignal::PrefixCacheQueries => queries.add("prefix_cache_queries", Some(value))?,
            _ => {
                series_max = series_max.max(*slot);
                acc.add_rank(&prom_sample(signal, value))?;
            }
        }
    }
    if acc.token_usage.count == 0 {
        acc.token_usage = legacy_usage;
    }
    if acc.cache_hit_rate.count == 0 {
        if let (Some(h), Some(q)) = (hits.sum(), queries.sum()) {
            if q > 0.0 {
                acc.cache_hit_rate.add("cache_hit_rate", Some(h / q))?;
            }
        }
    }
    acc.finish(series_max.max(legacy_usage.count as usize))
}

/// How many [`PromSignal`] variants exist (array size for per-signal series counts).
const PROM_SIGNALS: usize = PromSignal::PrefixCacheQueries as usize + 1;

fn prom_sample(signal: PromSignal, value: f64) -> RankSample {
    let v = Some(value);
    let mut s = RankSample::default();
    match signal {
        PromSignal::Running => s.running = v,
        PromSignal::Waiting => s.waiting = v,
        PromSignal::WaitingUncachedTokens => s.waiting_uncached_tokens = v,
        PromSignal::UsedTokens => s.used_tokens = v,
        PromSignal::MaxTotalTokens => s.max_total_tokens = v,
        PromSignal::TokenUsage => s.token_usage = v,
        PromSignal::GenThroughput => s.gen_throughput = v,
        PromSignal::CacheHitRate => s.cache_hit_rate = v,
        PromSignal::Utilization => s.utilization = v,
        // Handled by the caller; never reach here.
        PromSignal::TokenUsageLegacy
        | PromSignal::PrefixCacheHits
        | PromSignal::PrefixCacheQueries => {}
    }
    s
}

/// Worker overload protection (`--worker-overload-token-usage`,
/// `--worker-overload-waiting-requests`); unset limits are off (SMG's default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OverloadConfig {
    /// Exclude a worker whose reported KV usage is at or above this fraction.
    pub token_usage: Option<f64>,
    /// Exclude a worker whose reported queue is at least this long.
    pub waiting_requests: Option<u64>,
}

impl OverloadConfig {
    /// Whether the worker is at or above a limit (SMG's comparison is inclusive). A worker
    /// without a report, or without the field a limit reads, is never excluded: no signal is
    /// never a penalty.
    pub fn is_overloaded(&self, report: Option<&LoadReport>) -> bool {
        let Some(r) = report else { return false };
        let usage_over =
            matches!((self.token_usage, r.token_usage), (Some(limit), Some(u)) if u >= limit);
        let queue_over =
            matches!(self.waiting_requests, Some(limit) if r.waiting_requests >= limit);
        usage_over || queue_over
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_RANKS: &str = r#"{"timestamp":"x","dp_rank_count":2,"loads":[
        {"dp_rank":0,"num_running_reqs":3,"num_waiting_reqs":2,"num_waiting_uncached_tokens":100,
         "num_used_tokens":500,"max_total_num_tokens":1000,"token_usage":0.5,"gen_throughput":10.0,
         "cache_hit_rate":0.25,"utilization":0.4,"extra":"ignored"},
        {"dp_rank":1,"num_running_reqs":1,"num_waiting_reqs":0,"num_waiting_uncached_tokens":50,
         "num_used_tokens":100,"max_total_num_tokens":1000,"token_usage":0.1,"gen_throughput":30.0,
         "cache_hit_rate":0.75,"utilization":0.6}]}"#;

    #[test]
    fn v1_loads_aggregates_ranks_sums_counts_and_averages_ratios() {
        let r = parse_v1_loads(TWO_RANKS.as_bytes()).unwrap();
        assert_eq!(r.running_requests, 4);
        assert_eq!(r.waiting_requests, 2);
        assert_eq!(r.waiting_uncached_tokens, Some(150));
        assert_eq!(r.used_tokens, Some(600));
        assert_eq!(r.max_total_tokens, Some(2000));
        assert!((r.token_usage.unwrap() - 0.3).abs() < 1e-9);
        assert!((r.gen_throughput_tps.unwrap() - 40.0).abs() < 1e-9);
        assert!((r.cache_hit_rate.unwrap() - 0.5).abs() < 1e-9);
        assert!((r.utilization.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!(r.dp_ranks, 2);
    }

    #[test]
    fn v1_loads_keeps_each_ranks_gauges() {
        let r = parse_v1_loads(TWO_RANKS.as_bytes()).unwrap();
        assert_eq!(r.ranks.len(), 2);
        assert_eq!(r.ranks[1].dp_rank, 1);
        assert_eq!(r.ranks[1].running_requests, 1);
        assert_eq!(r.ranks[0].waiting_requests, 2);
        assert_eq!(r.ranks[1].gen_throughput_tps, Some(30.0));
        assert_eq!(r.ranks[0].cache_hit_rate, Some(0.25));
        assert!(parse_prometheus("sglang:num_running_reqs 3\n")
            .unwrap()
            .ranks
            .is_empty());
    }

    #[test]
    fn v1_loads_single_rank_with_missing_fields_keeps_them_unknown() {
        let r =
            parse_v1_loads(br#"{"loads":[{"num_running_reqs":7,"num_waiting_reqs":1}]}"#).unwrap();
        assert_eq!(r.running_requests, 7);
        assert_eq!(r.waiting_requests, 1);
        assert_eq!(r.token_usage, None);
        assert_eq!(r.gen_throughput_tps, None);
        assert_eq!(r.cache_hit_rate, None);
    }

    #[test]
    fn v1_loads_malformed_inputs_are_typed_errors() {
        let cases: [&[u8]; 6] = [
            b"",
            b"not json",
            br#"{"loads": 3}"#,
            br#"{"no_loads": []}"#,
            br#"{"loads":[{"num_running_reqs":"many"}]}"#,
            br#"{"loads":[{"num_running_reqs":1"#,
        ];
        for body in cases {
            assert!(
                matches!(parse_v1_loads(body), Err(LoadParseError::Json(_))),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn v1_loads_rejects_negative_numbers_and_empty_reports() {
        assert_eq!(
            parse_v1_loads(br#"{"loads":[{"num_running_reqs":-1}]}"#),
            Err(LoadParseError::BadNumber("num_running_reqs"))
        );
        assert_eq!(
            parse_v1_loads(br#"{"loads":[]}"#),
            Err(LoadParseError::NoSignal)
        );
        assert_eq!(
            parse_v1_loads(br#"{"loads":[{"dp_rank":0}]}"#),
            Err(LoadParseError::NoSignal)
        );
    }

    #[test]
    fn v1_loads_clamps_ratios_to_one() {
        let r = parse_v1_loads(br#"{"loads":[{"num_running_reqs":0,"token_usage":1.7}]}"#).unwrap();
        assert_eq!(r.token_usage, Some(1.0));
    }

    #[test]
    fn v1_loads_bounds_rank_count() {
        let ranks = vec![r#"{"num_running_reqs":1}"#; DP_RANKS_MAX + 1].join(",");
        let body = format!(r#"{{"loads":[{ranks}]}}"#);
        assert_eq!(
            parse_v1_loads(body.as_bytes()),
            Err(LoadParseError::TooManyRanks(DP_RANKS_MAX + 1))
        );
    }

    #[test]
    fn prometheus_sglang_names_with_colon_and_underscore_prefix() {
        let text = "# HELP sglang:num_running_reqs running\n\
            # TYPE sglang:num_running_reqs gauge\n\
            sglang:num_running_reqs{model_name=\"m\",dp_rank=\"0\"} 3\n\
            sglang:num_running_reqs{model_name=\"m\",dp_rank=\"1\"} 5\n\
            sglang_num_queue_reqs{model_name=\"m\"} 4\n\
            sglang:token_usage{dp_rank=\"0\"} 0.2\n\
            sglang:token_usage{dp_rank=\"1\"} 0.4\n\
            sglang:gen_throughput 12.5 1700000000000\n\
            sglang:cache_hit_rate{x=\"a b\"} 0.5\n\
            unrelated_metric 99\n";
        let r = parse_prometheus(text).unwrap();
        assert_eq!(r.running_requests, 8);
        assert_eq!(r.waiting_requests, 4);
        assert!((r.token_usage.unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(r.gen_throughput_tps, Some(12.5));
        assert_eq!(r.cache_hit_rate, Some(0.5));
        assert_eq!(r.dp_ranks, 2);
    }

    #[test]
    fn prometheus_vllm_names() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n\
            vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 6\n\
            vllm:kv_cache_usage_perc{engine=\"0\"} 0.75\n\
            vllm:gpu_prefix_cache_hit_rate 0.1\n";
        let r = parse_prometheus(text).unwrap();
        assert_eq!(r.running_requests, 2);
        assert_eq!(r.waiting_requests, 6);
        assert_eq!(r.token_usage, Some(0.75));
        assert_eq!(r.cache_hit_rate, Some(0.1));
    }

    #[test]
    fn prometheus_vllm_legacy_usage_and_hit_rate_from_counters() {
        // Both usage names for one engine count once; counters give the hit rate.
        let text = "vllm:num_requests_running 1\n\
            vllm:gpu_cache_usage_perc 0.5\n\
            vllm:kv_cache_usage_perc 0.5\n\
            vllm:prefix_cache_queries_total 200\n\
            vllm:prefix_cache_hits_total 50\n";
        let r = parse_prometheus(text).unwrap();
        assert_eq!(r.token_usage, Some(0.5));
        assert_eq!(r.dp_ranks, 1);
        assert_eq!(r.cache_hit_rate, Some(0.25));
        let legacy_only =
            parse_prometheus("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.7\n")
                .unwrap();
        assert_eq!(legacy_only.token_usage, Some(0.7));
        let no_queries =
            parse_prometheus("vllm:num_requests_running 1\nvllm:prefix_cache_queries_total 0\n")
                .unwrap();
        assert_eq!(no_queries.cache_hit_rate, None);
    }

    #[test]
    fn prometheus_without_known_names_or_garbage_is_no_signal() {
        assert_eq!(
            parse_prometheus("process_cpu_seconds_total 3\n"),
            Err(LoadParseError::NoSignal)
        );
        assert_eq!(
            parse_prometheus("sglang:num_running_reqs{ nonsense\n}}} x y\n\u{0}\n"),
            Err(LoadParseError::NoSignal)
        );
        assert_eq!(parse_prometheus(""), Err(LoadParseError::NoSignal));
    }

    #[test]
    fn prometheus_rejects_nan_and_negative_values() {
        assert_eq!(
            parse_prometheus("sglang:num_running_reqs NaN\n"),
            Err(LoadParseError::BadNumber("num_running_reqs"))
        );
        assert_eq!(
            parse_prometheus("vllm:num_requests_waiting -3\n"),
            Err(LoadParseError::BadNumber("num_waiting_reqs"))
        );
    }

    #[test]
    fn endpoint_falls_back_to_metrics_only_on_absent_statuses() {
        let e = LoadEndpoint::default();
        assert_eq!(e, LoadEndpoint::V1Loads);
        for status in [200, 500, 503, 400] {
            assert_eq!(e.after_status(status), LoadEndpoint::V1Loads);
        }
        for status in [404, 405, 501] {
            assert_eq!(e.after_status(status), LoadEndpoint::Metrics);
        }
        // Once on /metrics, a worker stays there.
        assert_eq!(
            LoadEndpoint::Metrics.after_status(200),
            LoadEndpoint::Metrics
        );
        assert_eq!(LoadEndpoint::Metrics.path(), "/metrics");
    }

    #[test]
    fn parse_load_body_dispatches_and_bounds_size() {
        let big = vec![b' '; LOAD_BODY_BYTES_MAX + 1];
        assert_eq!(
            parse_load_body(LoadEndpoint::V1Loads, &big),
            Err(LoadParseError::TooLarge(LOAD_BODY_BYTES_MAX + 1))
        );
        let r = parse_load_body(LoadEndpoint::Metrics, b"sglang:num_running_reqs 1\n").unwrap();
        assert_eq!(r.running_requests, 1);
    }

    #[test]
    fn overload_predicate() {
        let c = OverloadConfig {
            token_usage: Some(0.9),
            waiting_requests: Some(10),
        };
        let mut r = LoadReport {
            token_usage: Some(0.5),
            waiting_requests: 3,
            ..LoadReport::default()
        };
        assert!(!c.is_overloaded(Some(&r)));
        r.token_usage = Some(0.95);
        assert!(c.is_overloaded(Some(&r)));
        r.token_usage = None;
        assert!(!c.is_overloaded(Some(&r)));
        r.waiting_requests = 10;
        assert!(c.is_overloaded(Some(&r)), "at the limit is over it");
        r.waiting_requests = 9;
        assert!(!c.is_overloaded(Some(&r)));
        r.token_usage = Some(0.9);
        assert!(c.is_overloaded(Some(&r)), "at the limit is over it");
        assert!(!c.is_overloaded(None));
        assert!(!OverloadConfig::default().is_overloaded(Some(&r)));
    }
}
