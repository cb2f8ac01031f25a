//! Command-line flags of `sim-engine` ([`SimArgs`], clap) and the checked [`Options`] the fleet
//! runs with. A bad value is an `Err` naming the flag; `main` prints it as `Error: ...`.

use std::net::IpAddr;

use clap::Parser;

use super::cost::CostModel;
use super::engine::{EngineConfig, MAX_WAITING_REQUESTS_DEFAULT};
use super::faults::Faults;
use super::metrics::MetricsFlavor;

/// Most engines one process serves: bounds ports, tasks and memory.
pub const ENGINES_MAX: u16 = 1024;

/// Most runtime threads: the fleet is cheap; more threads only add contention.
pub const THREADS_MAX: usize = 64;

const AFTER_HELP: &str = "\
Endpoints of every engine: POST /generate, /v1/chat/completions, /v1/completions, /v1/messages;
GET /v1/models, /health, /v1/loads, /metrics; POST /flush_cache; admin GET|POST /sim/faults
(partial JSON, e.g. {\"hang\":true} or {\"reset\":true}) and GET /sim/stats (accepted TCP
connections, requests, token counters). Prints `sim-engine: ready` on stdout once all ports are
bound. Text is one token per whitespace-separated word (bench_harness::tokenize).";

/// A simulated fleet of LLM engines (SGLang/vLLM HTTP surface) on consecutive ports.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sim-engine",
    version,
    about = "A simulated fleet of LLM engines (SGLang/vLLM HTTP surface) on consecutive ports",
    after_help = AFTER_HELP
)]
pub struct SimArgs {
    /// Number of engines; engine i listens on base-port + i.
    #[arg(long, default_value_t = 1)]
    pub engines: u16,
    /// Port of engine 0.
    #[arg(long, default_value_t = 31000)]
    pub base_port: u16,
    /// Address every engine binds.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Model id served (`/v1/models`, response `model` fields).
    #[arg(long, default_value = "sim-model")]
    pub model_name: String,
    /// KV cache capacity of each engine, in tokens.
    #[arg(long, default_value_t = 262_144)]
    pub kv_capacity_tokens: u64,
    /// Tokens per KV page (SGLang --page-size, vLLM --block-size).
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Requests that decode concurrently on one engine.
    #[arg(long, default_value_t = 256)]
    pub max_running_requests: usize,
    /// Uncached prompt tokens one prefill step may admit (the first request always fits).
    #[arg(long, default_value_t = 16_384)]
    pub max_prefill_tokens: u64,
    /// Prompt tokens one prefill step computes; longer prompts span several steps (SGLang's
    /// default); 0 prefills every prompt in one step.
    #[arg(long, default_value_t = 8192)]
    pub chunked_prefill_size: u64,
    /// Requests one engine queues; more are answered 503.
    #[arg(long, default_value_t = MAX_WAITING_REQUESTS_DEFAULT)]
    pub max_queued_requests: usize,
    /// Output length of a request that names no max_tokens / max_new_tokens.
    #[arg(long, default_value_t = 128)]
    pub default_max_tokens: u32,
    /// Divides every simulated duration (steps, not fault latency): 100 runs 100x real time.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// No simulated timing: answer at once (proxy benchmarks); cached_tokens stay 0.
    #[arg(long)]
    pub instant: bool,
    /// Metric names of GET /metrics.
    #[arg(long, value_enum, default_value_t = MetricsFlavor::Sglang)]
    pub metrics_flavor: MetricsFlavor,
    /// Tokio worker threads; 1 runs a current-thread runtime.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seed of the fault generator (which requests fail).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prefill ms per uncached token squared.
    #[arg(long, default_value_t = 4.21e-7)]
    pub prefill_quadratic_ms: f64,
    /// Prefill ms per uncached token.
    #[arg(long, default_value_t = 1.52e-2)]
    pub prefill_linear_ms: f64,
    /// Prefill ms per step.
    #[arg(long, default_value_t = 16.5)]
    pub prefill_constant_ms: f64,
    /// Decode ms per KV usage squared.
    #[arg(long, default_value_t = -25.74, allow_negative_numbers = true)]
    pub decode_quadratic_ms: f64,
    /// Decode ms per KV usage.
    #[arg(long, default_value_t = 54.01, allow_negative_numbers = true)]
    pub decode_linear_ms: f64,
    /// Decode ms per step at zero KV usage.
    #[arg(long, default_value_t = 5.74, allow_negative_numbers = true)]
    pub decode_constant_ms: f64,
    /// Floor of a decode step, ms.
    #[arg(long, default_value_t = 1.0)]
    pub decode_min_ms: f64,
    /// Engines the --fault-* flags apply to (comma-separated indices; default: all).
    #[arg(long, value_delimiter = ',')]
    pub fault_engines: Vec<u16>,
    /// Fraction of inference requests answered with --fault-error-status.
    #[arg(long, default_value_t = 0.0)]
    pub fault_error_rate: f64,
    /// Status of injected errors (500 or 429 are the useful ones).
    #[arg(long, default_value_t = 500)]
    pub fault_error_status: u16,
    /// Real milliseconds added before every answer (not scaled by --speedup).
    #[arg(long, default_value_t = 0)]
    pub fault_latency_ms: u64,
    /// Read requests and never answer them.
    #[arg(long)]
    pub fault_hang: bool,
    /// Drop the connection after the first chunk of every inference response.
    #[arg(long)]
    pub fault_drop_mid_stream: bool,
    /// Answer /health with 503.
    #[arg(long)]
    pub fault_unhealthy: bool,
}

/// Checked settings of the whole fleet.
#[derive(Debug, Clone)]
pub struct Options {
    pub engines: u16,
    pub base_port: u16,
    pub host: IpAddr,
    pub model_name: String,
    pub engine: EngineConfig,
    pub default_max_tokens: u32,
    pub speedup: f64,
    pub instant: bool,
    pub metrics_flavor: MetricsFlavor,
    pub threads: usize,
    pub seed: u64,
    /// Faults of each engine at start (index = engine).
    pub faults: Vec<Faults>,
}

impl SimArgs {
    /// Checks every flag; the error names the flag.
    pub fn validate(&self) -> Result<Options, String> {
        if self.engines == 0 || self.engines > ENGINES_MAX {
            return Err(format!(
                "--engines must be within 1..={ENGINES_MAX}, got {}",
                self.engines
            ));
        }
        if u32::from(self.base_port) + u32::from(self.engines) - 1 > u32::from(u16::MAX) {
            return Err(format!(
                "--base-port {} + --engines {} exceeds port 65535",
                self.base_port, self.engines
            ));
        }
        if self.page_size == 0 || self.page_size > 4096 {
            return Err(format!(
                "--page-size must be within 1..=4096, got {}",
                self.page_size
            ));
        }
        if self.kv_capacity_tokens < self.page_size as u64 {
            return Err(format!(
                "--kv-capacity-tokens must hold at least one page, got {}",
                self.kv_capacity_tokens
            ));
        }
        if self.max_running_requests == 0 {
            return Err("--max-running-requests must be at least 1".into());
        }
        if self.max_queued_requests == 0 {
            return Err("--max-queued-requests must be at least 1".into());
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return Err(format!(
                "--speedup must be a positive number, got {}",
                self.speedup
            ));
        }
        if self.threads == 0 || self.threads > THREADS_MAX {
            return Err(format!(
                "--threads must be within 1..={THREADS_MAX}, got {}",
                self.threads
            ));
        }
        self.validate_costs()?;
        Ok(Options {
            engines: self.engines,
            base_port: self.base_port,
            host: self.host,
            model_name: self.model_name.clone(),
            engine: EngineConfig {
                page_size: self.page_size,
                kv_capacity_tokens: self.kv_capacity_tokens,
                max_running_requests: self.max_running_requests,
                max_prefill_tokens: self.max_prefill_tokens,
                chunked_prefill_size: self.chunked_prefill_size,
                max_waiting_requests: self.max_queued_requests,
                cost: self.cost_model(),
                record_kv_events: false,
            },
            default_max_tokens: self.default_max_tokens.max(1),
            speedup: self.speedup,
            instant: self.instant,
            metrics_flavor: self.metrics_flavor,
            threads: self.threads,
            seed: self.seed,
            faults: self.initial_faults()?,
        })
    }

    fn cost_model(&self) -> CostModel {
        CostModel {
            prefill_quadratic_ms: self.prefill_quadratic_ms,
            prefill_linear_ms: self.prefill_linear_ms,
            prefill_constant_ms: self.prefill_constant_ms,
            decode_quadratic_ms: self.decode_quadratic_ms,
            decode_linear_ms: self.decode_linear_ms,
            decode_constant_ms: self.decode_constant_ms,
            decode_min_ms: self.decode_min_ms,
        }
    }

    fn validate_costs(&self) -> Result<(), String> {
        let costs = [
            ("--prefill-quadratic-ms", self.prefill_quadratic_ms),
            ("--prefill-linear-ms", self.prefill_linear_ms),
            ("--prefill-constant-ms", self.prefill_constant_ms),
            ("--decode-quadratic-ms", self.decode_quadratic_ms),
            ("--decode-linear-ms", self.decode_linear_ms),
            ("--decode-constant-ms", self.decode_constant_ms),
            ("--decode-min-ms", self.decode_min_ms),
        ];
        for (flag, value) in costs {
            if !value.is_finite() {
                return Err(format!("{flag} must be a finite number, got {value}"));
            }
        }
        if self.decode_min_ms < 0.0 {
            return Err(format!(
                "--decode-min-ms must be 0 or more, got {}",
                self.decode_min_ms
            ));
        }
        Ok(())
    }

    fn initial_faults(&self) -> Result<Vec<Faults>, String> {
        let faults = Faults {
            error_rate: self.fault_error_rate,
            error_status: self.fault_error_status,
            latency_ms: self.fault_latency_ms,
            hang: self.fault_hang,
            drop_mid_stream: self.fault_drop_mid_stream,
            unhealthy: self.fault_unhealthy,
        };
        faults
            .validate()
            .map_err(|message| format!("--fault-{}", message.replace('_', "-")))?;
        if let Some(bad) = self
            .fault_engines
            .iter()
            .find(|index| **index >= self.engines)
        {
            return Err(format!(
                "--fault-engines names engine {bad}, but --engines is {}",
                self.engines
            ));
        }
        Ok((0..self.engines)
            .map(|index| {
                if self.fault_engines.is_empty() || self.fault_engines.contains(&index) {
                    faults
                } else {
                    Faults::default()
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        SimArgs::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Options, String> {
        let mut all = vec!["sim-engine"];
        all.extend_from_slice(args);
        SimArgs::try_parse_from(all)
            .map_err(|error| error.to_string())?
            .validate()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let options = parse(&[]).unwrap();
        assert_eq!(options.engines, 1);
        assert_eq!(options.engine.page_size, 16);
        assert_eq!(options.engine.cost, CostModel::default());
        assert_eq!(options.threads, 1);
        assert_eq!(options.faults, vec![Faults::default()]);
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (args, flag) in [
            (&["--engines", "0"][..], "--engines"),
            (&["--speedup", "0"], "--speedup"),
            (&["--page-size", "0"], "--page-size"),
            (&["--base-port", "65535", "--engines", "2"], "--base-port"),
            (&["--fault-error-rate", "1.5"], "--fault-error-rate"),
            (&["--fault-engines", "3"], "--fault-engines"),
            (&["--threads", "0"], "--threads"),
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains(flag), "{args:?}: {error}");
        }
    }

    #[test]
    fn fault_flags_apply_to_the_named_engines() {
        let options = parse(&["--engines", "3", "--fault-engines", "0,2", "--fault-hang"]).unwrap();
        let hangs: Vec<bool> = options.faults.iter().map(|faults| faults.hang).collect();
        assert_eq!(hangs, vec![true, false, true]);
    }
}
