//! Load reports of one simulated engine: SGLang's `GET /v1/loads` JSON ([`loads_json`]) and
//! Prometheus text ([`prometheus_text`]) with SGLang (`sglang:*`) or vLLM (`vllm:*`) names.

use std::fmt::Write;

use serde_json::{json, Value};

use super::engine::{EngineTotals, LoadSnapshot};

/// Which engine's metric names `/metrics` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsFlavor {
    Sglang,
    Vllm,
}

/// SGLang's `/v1/loads` body for a single data-parallel rank.
pub fn loads_json(load: &LoadSnapshot, now_s: f64) -> Value {
    json!({
        "timestamp": now_s,
        "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": load.num_running_reqs,
            "num_waiting_reqs": load.num_waiting_reqs,
            "num_waiting_uncached_tokens": load.num_waiting_uncached_tokens,
            "num_used_tokens": load.num_used_tokens,
            "max_total_num_tokens": load.max_total_num_tokens,
            "max_running_requests": load.max_running_requests,
            "token_usage": load.token_usage,
            "gen_throughput": load.gen_throughput,
            "cache_hit_rate": load.cache_hit_rate,
            "utilization": load.utilization,
        }],
    })
}

/// Everything `/metrics` reports.
#[derive(Debug, Clone, Copy)]
pub struct MetricsInput<'a> {
    pub model_name: &'a str,
    pub load: &'a LoadSnapshot,
    pub totals: &'a EngineTotals,
    pub connections_accepted: u64,
}

/// One exposed metric: name, type, help text, value.
type MetricLine = (&'static str, &'static str, &'static str, f64);

/// The Prometheus text exposition for `flavor`.
pub fn prometheus_text(flavor: MetricsFlavor, input: &MetricsInput<'_>) -> String {
    let labels = format!(
        "{{model_name=\"{}\"}}",
        input.model_name.replace(['"', '\\'], "'")
    );
    let mut lines = match flavor {
        MetricsFlavor::Sglang => sglang_metrics(input.load, input.totals),
        MetricsFlavor::Vllm => vllm_metrics(input.load, input.totals),
    };
    let connections = input.connections_accepted as f64;
    lines.push((
        "sim_connections_accepted_total",
        "counter",
        "TCP connections accepted.",
        connections,
    ));
    let mut out = String::with_capacity(lines.len() * 120);
    for (name, kind, help, value) in lines {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value}\n"
        );
    }
    out
}

fn sglang_metrics(load: &LoadSnapshot, totals: &EngineTotals) -> Vec<MetricLine> {
    vec![
        (
            "sglang:num_running_reqs",
            "gauge",
            "Running requests.",
            load.num_running_reqs as f64,
        ),
        (
            "sglang:num_queue_reqs",
            "gauge",
            "Waiting requests.",
            load.num_waiting_reqs as f64,
        ),
        (
            "sglang:max_total_num_tokens",
            "gauge",
            "KV capacity in tokens.",
            load.max_total_num_tokens as f64,
        ),
        (
            "sglang:num_used_tokens",
            "gauge",
            "KV tokens in use.",
            load.num_used_tokens as f64,
        ),
        (
            "sglang:token_usage",
            "gauge",
            "KV usage fraction.",
            load.token_usage,
        ),
        (
            "sglang:gen_throughput",
            "gauge",
            "Generated tokens per second.",
            load.gen_throughput,
        ),
        (
            "sglang:cache_hit_rate",
            "gauge",
            "Prefix cache hit rate.",
            load.cache_hit_rate,
        ),
        (
            "sglang:utilization",
            "gauge",
            "Busy fraction.",
            load.utilization,
        ),
        (
            "sglang:prompt_tokens_total",
            "counter",
            "Prompt tokens.",
            totals.prompt_tokens as f64,
        ),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Generated tokens.",
            totals.generation_tokens as f64,
        ),
        (
            "sglang:cached_tokens_total",
            "counter",
            "Cached prompt tokens.",
            totals.cached_tokens as f64,
        ),
        (
            "sglang:num_requests_total",
            "counter",
            "Finished requests.",
            totals.requests_finished as f64,
        ),
    ]
}

fn vllm_metrics(load: &LoadSnapshot, totals: &EngineTotals) -> Vec<MetricLine> {
    vec![
        (
            "vllm:num_requests_running",
            "gauge",
            "Running requests.",
            load.num_running_reqs as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Waiting requests.",
            load.num_waiting_reqs as f64,
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "KV usage fraction.",
            load.token_usage,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV usage fraction.",
            load.token_usage,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens queried.",
            totals.prompt_tokens as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens hit.",
            totals.cached_tokens as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens.",
            totals.prompt_tokens as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Generated tokens.",
            totals.generation_tokens as f64,
        ),
        (
            "vllm:avg_generation_throughput_toks_per_s",
            "gauge",
            "Generated tokens per second.",
            load.gen_throughput,
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Finished requests.",
            totals.requests_finished as f64,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> LoadSnapshot {
        LoadSnapshot {
            num_running_reqs: 3,
            num_waiting_reqs: 2,
            num_waiting_uncached_tokens: 100,
            num_used_tokens: 64,
            max_total_num_tokens: 1024,
            max_running_requests: 8,
            token_usage: 0.0625,
            gen_throughput: 10.5,
            cache_hit_rate: 0.25,
            utilization: 0.5,
        }
    }

    #[test]
    fn flavors_use_their_engine_names() {
        let load = snapshot();
        let totals = EngineTotals::default();
        let input = MetricsInput {
            model_name: "m",
            load: &load,
            totals: &totals,
            connections_accepted: 7,
        };
        let sglang = prometheus_text(MetricsFlavor::Sglang, &input);
        assert!(sglang.contains("sglang:num_running_reqs{model_name=\"m\"} 3\n"));
        assert!(sglang.contains("sglang:num_queue_reqs{model_name=\"m\"} 2\n"));
        assert!(sglang.contains("sglang:cache_hit_rate{model_name=\"m\"} 0.25\n"));
        assert!(sglang.contains("sim_connections_accepted_total{model_name=\"m\"} 7\n"));
        let vllm = prometheus_text(MetricsFlavor::Vllm, &input);
        assert!(vllm.contains("vllm:num_requests_waiting{model_name=\"m\"} 2\n"));
        assert!(!vllm.contains("sglang:"));
        let loads = loads_json(&load, 1.0);
        assert_eq!(loads["loads"][0]["num_waiting_uncached_tokens"], 100);
        assert_eq!(loads["loads"][0]["dp_rank"], 0);
    }
}
