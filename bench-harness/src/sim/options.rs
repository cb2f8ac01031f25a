//! Command-line flags of `sim-engine` ([`SimArgs`], clap) and the checked [`Options`] the fleet
//! runs with. A bad value is an `Err` naming the flag; `main` prints it as `Error: ...`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::Parser;

use super::cost::{CostModel, DECODE_POOL_TOKENS_DEFAULT};
use super::disagg::{DisaggOptions, SimRole};
use super::engine::{EngineConfig, MAX_WAITING_REQUESTS_DEFAULT};
use super::faults::Faults;
use super::kv_events::KvEventsFormat;
use super::metrics::MetricsFlavor;
use super::output::OutputVocabulary;
use super::publisher::KvEndpoints;

/// Most engines one process serves: bounds ports, tasks and memory.
pub const ENGINES_MAX: u16 = 1024;

/// Most runtime threads: the fleet is cheap; more threads only add contention.
pub const THREADS_MAX: usize = 64;

/// Default of `--kv-events-replay-buffer`: vLLM's and SGLang's `buffer_steps`.
pub const KV_EVENTS_REPLAY_BUFFER_DEFAULT: usize = 10_000;

/// Most batches an engine keeps for replay: a batch of a long prompt is tens of KiB, so this
/// bounds one engine's buffer to a few GiB at worst.
pub const KV_EVENTS_REPLAY_BUFFER_MAX: usize = 100_000;

const AFTER_HELP: &str = "\
Endpoints of every engine: POST /generate, /v1/chat/completions, /v1/completions, /v1/messages;
GET /v1/models, /health, /v1/loads, /metrics, /server_info (SGLang's, with page_size and
kv_events_config); POST /flush_cache; admin GET|POST /sim/faults (partial JSON, e.g.
{\"hang\":true} or {\"reset\":true}), GET /sim/stats (accepted TCP connections, requests, token
and KV-event counters), GET /sim/cache ({\"page_size\", \"blocks\": every cached page's key,
sorted}) and POST /sim/restart (a crash: requests in flight are cut, the cache empties without
an event, the KV-event sockets close for 200 ms and seq restarts at 0). Prints `sim-engine:
ready` on stdout once all ports are bound. Text is one token per whitespace-separated word
(bench_harness::tokenize).

KV events (--kv-events-base-port P): engine i publishes on a ZMQ PUB socket at tcp://HOST:P+i
and answers replay requests on a ROUTER socket at tcp://HOST:P+ENGINES+i, as vLLM and SGLang
do: messages [topic \"\", seq (8 bytes, big-endian, from 0), msgpack batch]; a DEALER sending
[\"\", start seq] gets [\"\", seq, batch] for every kept batch from there, then [\"\", -1, \"\"].
Events: BlockStored when full pages are cached (a prompt's after its prefill, its output's when
it finishes), BlockRemoved on eviction (and on a flush that leaves pinned pages),
AllBlocksCleared on a flush that empties the cache. Not with --instant (no cache).";

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
    /// The model's owner in `/v1/models` (`owned_by`), which names the engine to a gateway
    /// that detects it (SMG, kvgate's PD mode: `sglang` or `vllm`).
    #[arg(long, default_value = "sim-engine")]
    pub owned_by: String,
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
    /// The decode curve's usage is the KV tokens in use over this many (the pool the published
    /// curve was measured on), not over --kv-capacity-tokens.
    #[arg(long, default_value_t = DECODE_POOL_TOKENS_DEFAULT)]
    pub decode_pool_tokens: u64,
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
    /// Publish every engine's KV events over ZMQ: engine i's PUB socket on this port + i, its
    /// replay ROUTER socket on this port + --engines + i (default: off).
    #[arg(long, conflicts_with = "instant")]
    pub kv_events_base_port: Option<u16>,
    /// Encoding of the KV events: current vLLM's (msgpack maps) or SGLang's (msgpack arrays).
    #[arg(long, value_enum, default_value_t = KvEventsFormat::Vllm, requires = "kv_events_base_port")]
    pub kv_events_format: KvEventsFormat,
    /// Event batches each engine keeps for replay (vLLM's buffer_steps); at most 64 MiB of them
    /// per engine whatever this says.
    #[arg(long, default_value_t = KV_EVENTS_REPLAY_BUFFER_DEFAULT, requires = "kv_events_base_port")]
    pub kv_events_replay_buffer: usize,
    /// The engines' part in prefill/decode disaggregation: regular (whole requests), prefill
    /// (the prompt, then a simulated KV-cache transfer) or decode (waits for the transfer named
    /// by bootstrap_room or kv_transfer_params, then generates). See sim::disagg.
    #[arg(long, value_enum, default_value_t = SimRole::Regular, conflicts_with = "instant")]
    pub role: SimRole,
    /// KV-cache transfer speed of a prefill engine, prompt tokens per simulated second.
    #[arg(long, default_value_t = 200_000.0)]
    pub transfer_tokens_per_s: f64,
    /// How long a decode engine waits for its KV cache before failing the request (real ms).
    #[arg(long, default_value_t = 30_000)]
    pub transfer_timeout_ms: u64,
    /// Serve SMG's gRPC protocol of this engine (`sglang`: `SglangScheduler`, `vllm`:
    /// `VllmEngine`) on the engine ports instead of HTTP (`sim::grpc`).
    #[arg(long, value_enum, conflicts_with = "instant")]
    pub grpc: Option<GrpcProtocol>,
    /// With `--grpc`: the HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` each connection announces.
    #[arg(long, default_value_t = 1024, requires = "grpc")]
    pub grpc_max_concurrent_streams: u32,
    /// With `--grpc`: a scripted completion, token IDs separated by commas (repeat the flag for
    /// more). The engines' n-th `Generate` answers with the n-th list (cycling), ending with
    /// finish reason `stop`, instead of generated words: a model's tool-call or reasoning
    /// markup for the gateway's parsers.
    #[arg(long = "grpc-completion-ids", value_name = "IDS", requires = "grpc")]
    pub grpc_completion_ids: Vec<String>,
    /// With `--grpc`: the model's `tokenizer.json` (or its directory). The engines then generate that model's
    /// token IDs (of the sim's words, each one token), so a gateway that detokenizes streams
    /// real text; without it they are the sim's own word hashes, which decode to nothing.
    #[arg(long, requires = "grpc")]
    pub tokenizer_path: Option<PathBuf>,
    /// With `--grpc` and KV events: a fault for tests of resumption; each `SubscribeKvEvents`
    /// stream ends (`UNAVAILABLE`) after this many batches, and the subscriber resumes with
    /// `start_sequence_number`.
    #[arg(long, requires = "grpc", requires = "kv_events_base_port")]
    pub grpc_kv_stream_batches: Option<u64>,
    /// With `--grpc`: a fault for tests of draining; each connection sends GOAWAY (graceful:
    /// its streams run to their end) once it has accepted this many streams.
    #[arg(long, requires = "grpc")]
    pub grpc_goaway_after_streams: Option<u64>,
    /// With `--grpc`: a fault for tests of idle timeouts; every streamed `Generate` stops
    /// sending after this many tokens and holds its stream open.
    #[arg(long, requires = "grpc")]
    pub grpc_stall_after_tokens: Option<u32>,
    /// With `--grpc`: `GetTokenizer` streams a zip of this directory's tokenizer.json,
    /// tokenizer_config.json and chat_template.jinja (those present), the last piece carrying
    /// its SHA-256, as smg-grpc-servicer does; without it the method is UNIMPLEMENTED.
    #[arg(long, requires = "grpc")]
    pub grpc_tokenizer_dir: Option<std::path::PathBuf>,
}

/// Which engine's gRPC service `--grpc` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GrpcProtocol {
    /// `sglang.grpc.scheduler.SglangScheduler`.
    Sglang,
    /// `vllm.grpc.engine.VllmEngine`.
    Vllm,
}

/// Where and how the engines publish their KV events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventsOptions {
    /// Port of engine 0's PUB socket.
    pub base_port: u16,
    pub format: KvEventsFormat,
    /// Batches each engine keeps for replay.
    pub replay_buffer_batches: usize,
}

impl KvEventsOptions {
    /// Engine `index`'s sockets: PUB on `base_port + index`, replay on `base_port + engines +
    /// index` (the options checked that both fit).
    pub fn endpoints(&self, host: IpAddr, engines: u16, index: u16) -> KvEndpoints {
        let port = |offset: u16| self.base_port.saturating_add(offset);
        KvEndpoints {
            publish: SocketAddr::new(host, port(index)),
            replay: SocketAddr::new(host, port(engines.saturating_add(index))),
        }
    }
}

/// Checked settings of the whole fleet.
#[derive(Debug, Clone)]
pub struct Options {
    pub engines: u16,
    pub base_port: u16,
    pub host: IpAddr,
    pub model_name: String,
    /// `owned_by` of the model in `/v1/models`.
    pub owned_by: String,
    pub engine: EngineConfig,
    pub default_max_tokens: u32,
    pub speedup: f64,
    pub instant: bool,
    pub metrics_flavor: MetricsFlavor,
    pub threads: usize,
    pub seed: u64,
    /// Faults of each engine at start (index = engine).
    pub faults: Vec<Faults>,
    /// `None`: no KV events.
    pub kv_events: Option<KvEventsOptions>,
    /// `Some`: the engines speak this gRPC protocol instead of HTTP, announcing this many
    /// concurrent streams per connection.
    pub grpc: Option<(GrpcProtocol, u32)>,
    /// `--grpc-completion-ids`: the scripted completions, in turn.
    pub grpc_completions: Vec<Vec<u32>>,
    /// `--grpc-kv-stream-batches`.
    pub grpc_kv_stream_batches: Option<u64>,
    /// `--grpc-goaway-after-streams`.
    pub grpc_goaway_after_streams: Option<u64>,
    /// `--grpc-stall-after-tokens`.
    pub grpc_stall_after_tokens: Option<u32>,
    /// `--grpc-tokenizer-dir`.
    pub grpc_tokenizer_dir: Option<std::path::PathBuf>,
    /// Role and KV-cache transfer settings.
    pub disagg: DisaggOptions,
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
        let kv_events = self.validate_kv_events()?;
        if !(self.transfer_tokens_per_s.is_finite() && self.transfer_tokens_per_s > 0.0) {
            return Err(format!(
                "--transfer-tokens-per-s must be a positive number, got {}",
                self.transfer_tokens_per_s
            ));
        }
        if self.transfer_timeout_ms == 0 || self.transfer_timeout_ms > 3_600_000 {
            return Err(format!(
                "--transfer-timeout-ms must be within 1..=3600000, got {}",
                self.transfer_timeout_ms
            ));
        }
        Ok(Options {
            engines: self.engines,
            base_port: self.base_port,
            host: self.host,
            model_name: self.model_name.clone(),
            owned_by: self.owned_by.clone(),
            engine: EngineConfig {
                page_size: self.page_size,
                kv_capacity_tokens: self.kv_capacity_tokens,
                max_running_requests: self.max_running_requests,
                max_prefill_tokens: self.max_prefill_tokens,
                chunked_prefill_size: self.chunked_prefill_size,
                max_waiting_requests: self.max_queued_requests,
                cost: self.cost_model(),
                record_kv_events: kv_events.is_some(),
                output: match &self.tokenizer_path {
                    Some(path) => OutputVocabulary::from_tokenizer_file(path)?,
                    None => OutputVocabulary::default(),
                },
            },
            default_max_tokens: self.default_max_tokens.max(1),
            speedup: self.speedup,
            instant: self.instant,
            metrics_flavor: self.metrics_flavor,
            threads: self.threads,
            seed: self.seed,
            faults: self.initial_faults()?,
            kv_events,
            grpc: self
                .grpc
                .map(|protocol| (protocol, self.grpc_max_concurrent_streams.max(1))),
            grpc_completions: self
                .grpc_completion_ids
                .iter()
                .map(|list| {
                    list.split(',')
                        .map(|id| id.trim().parse::<u32>())
                        .collect::<Result<Vec<u32>, _>>()
                        .map_err(|e| format!("--grpc-completion-ids {list:?}: {e}"))
                })
                .collect::<Result<_, _>>()?,
            grpc_kv_stream_batches: self.grpc_kv_stream_batches.filter(|n| *n > 0),
            grpc_goaway_after_streams: self.grpc_goaway_after_streams.filter(|n| *n > 0),
            grpc_stall_after_tokens: self.grpc_stall_after_tokens,
            grpc_tokenizer_dir: self.grpc_tokenizer_dir.clone(),
            disagg: DisaggOptions {
                role: self.role,
                transfer_tokens_per_s: self.transfer_tokens_per_s,
                transfer_timeout: std::time::Duration::from_millis(self.transfer_timeout_ms),
            },
        })
    }

    /// The KV-event ports must fit below 65536 and stay clear of the HTTP ports.
    fn validate_kv_events(&self) -> Result<Option<KvEventsOptions>, String> {
        let Some(base_port) = self.kv_events_base_port else {
            return Ok(None);
        };
        if self.kv_events_replay_buffer > KV_EVENTS_REPLAY_BUFFER_MAX {
            return Err(format!(
                "--kv-events-replay-buffer must be at most {KV_EVENTS_REPLAY_BUFFER_MAX}, got {}",
                self.kv_events_replay_buffer
            ));
        }
        let engines = u32::from(self.engines);
        let kv_first = u32::from(base_port);
        // PUB ports then replay ports: 2 × engines in all.
        let kv_last = kv_first + 2 * engines - 1;
        if kv_last > u32::from(u16::MAX) {
            return Err(format!(
                "--kv-events-base-port {base_port} + 2 × --engines {} exceeds port 65535",
                self.engines
            ));
        }
        let http_first = u32::from(self.base_port);
        let http_last = http_first + engines - 1;
        if kv_first <= http_last && http_first <= kv_last {
            return Err(format!(
                "--kv-events-base-port {base_port} takes ports {kv_first}..={kv_last}, which \
                 overlap the HTTP ports {http_first}..={http_last} of --base-port"
            ));
        }
        Ok(Some(KvEventsOptions {
            base_port,
            format: self.kv_events_format,
            replay_buffer_batches: self.kv_events_replay_buffer,
        }))
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
            decode_pool_tokens: self.decode_pool_tokens.max(1),
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
            (&["--kv-events-base-port", "65535"], "--kv-events-base-port"),
            (
                &[
                    "--base-port",
                    "31000",
                    "--engines",
                    "4",
                    "--kv-events-base-port",
                    "30995",
                ],
                "--kv-events-base-port",
            ),
            (
                &[
                    "--kv-events-base-port",
                    "5557",
                    "--kv-events-replay-buffer",
                    "100001",
                ],
                "--kv-events-replay-buffer",
            ),
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

    #[test]
    fn kv_event_ports_follow_the_http_ports_layout() {
        assert_eq!(parse(&[]).unwrap().kv_events, None);
        let options = parse(&[
            "--engines",
            "3",
            "--base-port",
            "31000",
            "--kv-events-base-port",
            "5557",
            "--kv-events-format",
            "sglang",
        ])
        .unwrap();
        let kv = options.kv_events.unwrap();
        assert_eq!(kv.format, KvEventsFormat::Sglang);
        assert_eq!(kv.replay_buffer_batches, KV_EVENTS_REPLAY_BUFFER_DEFAULT);
        assert!(options.engine.record_kv_events);
        let endpoints = kv.endpoints(options.host, options.engines, 2);
        assert_eq!(endpoints.publish.port(), 5559);
        assert_eq!(endpoints.replay.port(), 5562);
        // Right below the HTTP ports is fine; the last replay port is 30999.
        let below = [
            "--engines",
            "2",
            "--base-port",
            "31000",
            "--kv-events-base-port",
            "30996",
        ];
        assert!(parse(&below).is_ok());
    }

    #[test]
    fn kv_event_flags_need_the_base_port_and_a_cache() {
        assert!(parse(&["--kv-events-format", "sglang"]).is_err());
        assert!(parse(&["--kv-events-replay-buffer", "5"]).is_err());
        assert!(parse(&["--instant", "--kv-events-base-port", "5557"]).is_err());
    }
}
