//! The command line (SMG's flag names and defaults) and the validated configuration built from it.
//!
//! `Cli` is the clap type and stays a plain mirror of the flags; `Config::from_cli` checks every
//! value and returns a `FlagError` naming the flag at fault, which `main` prints as one
//! `Error: ...` line before exiting non-zero. Nothing downstream of `Config` re-validates.
//! Host names (`--host`, `--prometheus-host`, `--worker-urls`) are resolved here, once, at start,
//! and the tokenizer files (`--model-path`, `--tokenizer-path`, `--chat-template`) read and built
//! here, once, at start: a file that does not load is one `Error: ...` line naming its flag.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

pub mod tls;

use crate::error::FlagError;
use crate::limits::{self, WORKERS_MAX};
use crate::mesh::{MeshArgs, MeshConfig};
use crate::pd::{Handshake, PdArgs, PdConfig, WorkerStartup};
use crate::policy::{PolicyArgs, PolicyConfig};
use crate::tokenize::{
    CacheConfig, ModelSpec, ModelTokenizer, TokenizerArgs, TokenizerFiles, TokenizerSet,
};
use crate::workers::discovery::{DiscoveryArgs, DiscoveryConfig};
use crate::workers::role::WorkerRole;
use crate::workers::settings::{
    AdminArgs, LoadArgs, PolicyLoads, ResilienceArgs, WorkerArgs, WorkerSettings,
};
use crate::workers::spec::{resolve_flag, GrpcBackend, KvEventsSource, WorkerProtocol, WorkerSpec};

/// The routing policy (`--policy`): SMG's names, `cache_aware` by default. Its flags and their
/// validation live in `policy::PolicyArgs`, flattened into `Cli`.
pub use crate::policy::PolicyKind;

/// Log verbosity (`--log-level`); `RUST_LOG` overrides it, as in SMG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lowercase")]
pub enum LogLevel {
    /// Everything, including per-request traces.
    Trace,
    /// Debugging detail.
    Debug,
    /// Start-up, shutdown and worker changes.
    Info,
    /// Recoverable problems.
    Warn,
    /// Failures only.
    Error,
}

/// How log lines are written (`--log-json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`), for log pipelines.
    Json,
}

impl LogLevel {
    /// The `tracing` filter directive for this level.
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// What `kvgate --version` prints after the name: the package version and the git commit it was
/// built from (`unknown` without git; `build.rs` sets it).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KVGATE_GIT_COMMIT"),
    ")"
);

/// The flags, as clap parses them. Names and defaults follow SMG (`smg launch --help`).
#[derive(Debug, Parser)]
#[command(
    name = "kvgate",
    version = VERSION,
    about = "Cache-aware, io_uring gateway for LLM engines",
    // `--cache-threshold -1` should reach validation and its clear message, not read as a flag.
    allow_negative_numbers = true
)]
pub struct Cli {
    /// Address the gateway listens on.
    #[arg(help_heading = "Worker Configuration", long, default_value = "0.0.0.0")]
    pub host: String,
    /// Port the gateway listens on.
    #[arg(help_heading = "Worker Configuration", long, default_value_t = 30000)]
    pub port: u16,
    /// Engine workers to route to, e.g. `http://127.0.0.1:31001`.
    #[arg(help_heading = "Worker Configuration", long = "worker-urls", num_args = 0.., value_name = "URL")]
    pub worker_urls: Vec<String>,
    /// Where each `--worker-urls` entry publishes its KV events, in the same order:
    /// `tcp://host:port` (the engine's ZMQ PUB socket; `*` as host means the worker's), with
    /// `+tcp://host:port` for its replay socket; `none` to skip one; `auto` (the default for
    /// all) asks the worker's `/server_info` (SGLang's `kv_events_config`), or a `grpc://`
    /// worker's `SubscribeKvEvents` stream.
    #[arg(help_heading = "Worker Configuration", long = "kv-events-endpoints", num_args = 0.., value_name = "ENDPOINT")]
    pub kv_events_endpoints: Vec<String>,
    /// The engine protocol of the `grpc://` workers: `sglang` or `vllm` (SMG's flag). Without
    /// it each gRPC worker is asked, as SMG does: SGLang's `HealthCheck`, then vLLM's.
    #[arg(help_heading = "Worker Configuration", long = "backend", value_name = "BACKEND", value_parser = ["sglang", "vllm"])]
    pub backend: Option<String>,
    /// How the gRPC workers' output is read for tool calls when a request has `tools` (SMG's
    /// flag and names: qwen, llama, json, mistral, deepseek, or passthrough for none). Without
    /// it the model's name picks SMG's default (Qwen* qwen, llama-3.2* llama, mistral-* mistral,
    /// deepseek-v3* deepseek, ...; passthrough when none matches).
    #[arg(
        help_heading = "Worker Configuration",
        long = "tool-call-parser",
        value_name = "NAME"
    )]
    pub tool_call_parser: Option<String>,
    /// How the gRPC workers' output is split into reasoning_content and the answer (SMG's flag
    /// and names: qwen3, deepseek_r1, qwen3_thinking, glm45, step3, minimax, kimi, cohere_cmd,
    /// base, or passthrough for none). Without it the model's name picks SMG's default
    /// (deepseek-r1 deepseek_r1, qwen3 and qwen qwen3, ...; none when no pattern matches).
    #[arg(
        help_heading = "Worker Configuration",
        long = "reasoning-parser",
        value_name = "NAME"
    )]
    pub reasoning_parser: Option<String>,
    /// The routing-policy flags (`--policy`, `--cache-threshold`, ...).
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Prefill/decode disaggregation and worker startup (`--pd-disaggregation`, ...).
    #[command(flatten)]
    pub pd: PdArgs,
    /// Load monitoring and overload protection (`--load-monitor-interval`, ...).
    #[command(flatten)]
    pub load: LoadArgs,
    /// Kubernetes service discovery (`--service-discovery`, `--selector`, ...).
    #[command(flatten)]
    pub discovery: DiscoveryArgs,
    /// Log verbosity.
    #[arg(help_heading = "Logging", long = "log-level", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Write logs as one JSON object per line (SMG's flag).
    #[arg(help_heading = "Logging", long = "log-json")]
    pub log_json: bool,
    /// Address of the Prometheus metrics endpoint.
    #[arg(
        help_heading = "Prometheus Metrics",
        long = "prometheus-host",
        default_value = "0.0.0.0"
    )]
    pub prometheus_host: String,
    /// Port of the Prometheus metrics endpoint.
    #[arg(
        help_heading = "Prometheus Metrics",
        long = "prometheus-port",
        default_value_t = 29000
    )]
    pub prometheus_port: u16,
    /// Seconds an upstream request may take before the client gets 504.
    #[arg(help_heading = "Request Handling", long = "request-timeout-secs", default_value_t = limits::REQUEST_TIMEOUT_SECS_DEFAULT)]
    pub request_timeout_secs: u64,
    /// Seconds a worker may take, once it has a request, to send the first byte of its
    /// response body (its queueing and prefill time; a response without a body: its head).
    /// Past it the client gets 504 and the worker's circuit breaker a failure: a hung engine
    /// whose /health still answers stops taking traffic. The default (5 minutes) leaves room
    /// for long prefills behind a queue; bounded by --request-timeout-secs.
    #[arg(help_heading = "Request Handling", long = "upstream-first-byte-timeout-secs", default_value_t = limits::UPSTREAM_FIRST_BYTE_TIMEOUT_SECS_DEFAULT)]
    pub upstream_first_byte_timeout_secs: u64,
    /// Seconds a pooled worker connection may stay idle before it is closed instead of reused
    /// (SMG's flag and default). Keep it below the engines' keep-alive timeout (uvicorn's 5 s
    /// for SGLang and vLLM), or a request may be written into a socket the engine is closing
    /// (kvgate then retries it on a fresh connection). 0 keeps idle connections forever.
    #[arg(help_heading = "Request Handling", long = "upstream-pool-idle-timeout-secs", default_value_t = limits::UPSTREAM_IDLE_TIMEOUT.as_secs())]
    pub upstream_pool_idle_timeout_secs: u64,
    /// Seconds a worker may stay silent between two reads of a response body once it began
    /// (not the idle time of pooled connections). Past it an SSE stream ends with an error
    /// event (another body is cut and its connection closed) and the breaker hears a failure.
    /// The default (60 s) is far above a decode step, even of a preempted request resuming.
    #[arg(help_heading = "Request Handling", long = "upstream-idle-timeout-secs", default_value_t = limits::UPSTREAM_IDLE_TIMEOUT_SECS_DEFAULT)]
    pub upstream_idle_timeout_secs: u64,
    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[arg(help_heading = "Request Handling", long = "max-payload-size", default_value_t = limits::PAYLOAD_BYTES_DEFAULT as u64)]
    pub max_payload_size: u64,
    /// Request body bytes one data core may hold at once, over all the requests it is reading
    /// or forwarding (each body is held once, where it was read). A request whose body would
    /// pass it gets 503 (`kvgate_body_budget_rejections_total`): memory stays bounded whatever
    /// clients send. Default 1 GiB, or --max-payload-size when larger; at least
    /// --max-payload-size.
    #[arg(
        help_heading = "Request Handling",
        long = "max-inflight-body-bytes-per-core"
    )]
    pub max_inflight_body_bytes_per_core: Option<u64>,
    /// Seconds shutdown (SIGTERM, SIGINT) lets in-flight requests finish (SMG's flag and
    /// default). The listeners close at once and a new request on an open connection gets 503
    /// with `Connection: close`; what still runs after this long is cut (a stream ends with an
    /// SSE error event) and the log says how many. 0 cuts at once.
    #[arg(help_heading = "Request Handling", long = "shutdown-grace-period-secs", default_value_t = limits::SHUTDOWN_GRACE_PERIOD_SECS_DEFAULT)]
    pub shutdown_grace_period_secs: u64,
    /// Seconds a request body may take to arrive, from the end of its head to its last byte
    /// (SMG's flag: the time the gateway waits on the client for a body). A body still
    /// incomplete then gets 408 and its connection closes, however steadily it trickles. 0: no
    /// bound (each read still waits at most 30 s).
    #[arg(help_heading = "Request Handling", long = "stream-body-stall-timeout-secs", default_value_t = limits::STREAM_BODY_STALL_TIMEOUT_SECS_DEFAULT)]
    pub stream_body_stall_timeout_secs: u64,
    /// Headers a request's ID is taken from, the first one the client sent (SMG's flag and
    /// default: x-request-id, x-correlation-id, x-trace-id, request-id). Without one the
    /// gateway generates an OpenAI-style id (chatcmpl-..., cmpl-..., gnt-...); the client's
    /// response carries it as x-request-id, the worker gets it, and the request's logs name it.
    #[arg(help_heading = "Request Handling", long = "request-id-headers", num_args = 0.., value_name = "HEADER")]
    pub request_id_headers: Vec<String>,
    /// Milliseconds a client has to finish a request head (and between body reads).
    #[arg(help_heading = "Request Handling", long = "header-read-timeout-ms", hide = true, default_value_t = limits::HEADER_READ_TIMEOUT.as_millis() as u64)]
    pub header_read_timeout_ms: u64,
    /// Milliseconds an idle keep-alive client connection is kept.
    #[arg(help_heading = "Request Handling", long = "client-idle-timeout-ms", hide = true, default_value_t = limits::CLIENT_IDLE_TIMEOUT.as_millis() as u64)]
    pub client_idle_timeout_ms: u64,
    /// Retries, circuit breaker and health checks (`--retry-*`, `--cb-*`, `--health-*`).
    #[command(flatten)]
    pub resilience: ResilienceArgs,
    /// Tokenizers, chat templates and the tokenization cache.
    #[command(flatten)]
    pub tokenizer: TokenizerArgs,
    /// TLS on the data port and to `https://` workers (`--tls-*`, `--ca-cert-paths`, ...).
    #[command(flatten)]
    pub tls: tls::TlsArgs,
    /// The admin API's key (`--admin-api-key`, `--admin-api-insecure`).
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Bearer token clients must send (`Authorization: Bearer <key>`) on the inference routes
    /// (`/generate`, `/v1/chat/completions`, `/v1/completions`, `/v1/messages`); others get 401.
    /// `/health`, `/liveness`, `/readiness`, `/v1/models` and the metrics port stay open; the
    /// admin API has its own key (--admin-api-key). Unset: no client authentication.
    #[arg(
        help_heading = "Data Plane Authentication",
        long = "api-key",
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
    /// The mesh between gateways (`--enable-mesh`, `--mesh-*`).
    #[command(flatten, next_help_heading = "Mesh")]
    pub mesh: MeshArgs,
    /// Data cores (pinned threads serving requests); default: all cores but one, at least 1.
    #[arg(help_heading = "Runtime", long = "data-cores")]
    pub data_cores: Option<usize>,
}

impl Cli {
    /// The command line as `--help` shows it: clap's, with the doc comments' Markdown code
    /// marks (backticks) taken out of every flag's help, so the help is plain text (the mesh's
    /// flags included, whose doc comments live in `mesh::MeshArgs`).
    pub fn command_plain() -> clap::Command {
        Cli::command().mut_args(|arg| {
            let plain = |text: &clap::builder::StyledStr| text.to_string().replace('`', "");
            let help = arg.get_help().map(plain);
            let long_help = arg.get_long_help().map(plain);
            let arg = match help {
                Some(help) => arg.help(help),
                None => arg,
            };
            match long_help {
                Some(help) => arg.long_help(help),
                None => arg,
            }
        })
    }

    /// Parses the process's arguments against [`Cli::command_plain`]; `--help`, `--version`
    /// and a bad flag exit with clap's whole message.
    pub fn parse_plain() -> Cli {
        let matches = Cli::command_plain().get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// The worker flags, shown apart under SMG's headings, as the one group they validate as.
    pub fn worker_args(&self) -> WorkerArgs {
        WorkerArgs {
            load: self.load.clone(),
            resilience: self.resilience.clone(),
            admin: self.admin.clone(),
        }
    }
}

/// The validated configuration every other module reads.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where data cores accept clients.
    pub listen_addr: SocketAddr,
    /// Where the control core serves `/metrics`.
    pub prometheus_addr: SocketAddr,
    /// The initial workers, in flag order.
    pub workers: Vec<WorkerSpec>,
    /// The routing policy and its knobs.
    pub policy: PolicyConfig,
    /// Log verbosity.
    pub log_level: LogLevel,
    /// Log line format.
    pub log_format: LogFormat,
    /// Largest request body accepted.
    pub max_payload_bytes: usize,
    /// Upstream request deadline.
    pub request_timeout: Duration,
    /// Longest wait for a response's first body byte once the worker has the request.
    pub upstream_first_byte_timeout: Duration,
    /// Longest silence between two response body reads.
    pub upstream_idle_timeout: Duration,
    /// How long a pooled worker connection may stay idle (`None`: forever).
    pub upstream_pool_idle_timeout: Option<Duration>,
    /// Request body bytes one data core may hold at once.
    pub max_inflight_body_bytes_per_core: usize,
    /// How long shutdown lets in-flight requests finish.
    pub shutdown_grace_period: Duration,
    /// Number of data cores.
    pub data_cores: usize,
    /// Time to finish a request head, and the longest pause between request body reads.
    pub header_read_timeout: Duration,
    /// Time an idle keep-alive client connection is kept.
    pub client_idle_timeout: Duration,
    /// The longest a request body may take to arrive (`None`: no bound).
    pub body_read_timeout: Option<Duration>,
    /// Health, breaker, retry, overload, load-monitoring and admin settings.
    pub worker_settings: WorkerSettings,
    /// Things to say once in the log at start (flags given that the chosen mode ignores,
    /// tokenizers that cannot cache segments).
    pub startup_notices: Vec<String>,
    /// Each model's tokenizer (empty: every request routes as before, on token IDs it carries
    /// or on its text).
    pub tokenizers: Arc<TokenizerSet>,
    /// One data core's tokenization cache bounds (the flags' totals split over the cores).
    pub tokenizer_cache: CacheConfig,
    /// Uncached prompt bytes a data core tokenizes itself before it hands the work to the pool.
    pub tokenize_inline_max_bytes: usize,
    /// The bearer token the inference routes require (`--api-key`); `None`: open.
    pub api_key: Option<String>,
    /// `--backend`: the engine protocol of every `grpc://` worker, those added by `POST
    /// /workers` included (`None`: detected per worker).
    pub grpc_backend: Option<GrpcBackend>,
    /// This process's name in the `Via` header of forwarded requests (`kvgate-` and 8 random
    /// hex digits): a request that arrives carrying it has looped back (508), while a chain of
    /// distinct kvgates still works.
    pub via_pseudonym: String,
    /// The mesh between gateways (`--enable-mesh`); `None`: this gateway learns alone.
    pub mesh: Option<MeshConfig>,
    /// The headers a request's ID is read from, lower-case, in order (`--request-id-headers`).
    pub request_id_headers: Vec<String>,
    /// `--tool-call-parser` and `--reasoning-parser` (the gRPC workers' front end).
    pub parsers: crate::frontend::ParserFlags,
    /// Kubernetes service discovery (`--service-discovery`); `None`: off.
    pub discovery: Option<DiscoveryConfig>,
    /// TLS on the data port and to `https://` workers.
    pub tls: tls::TlsConfig,
    /// Prefill/decode disaggregation (`--pd-disaggregation`); `None`: regular mode.
    pub pd: Option<PdConfig>,
    /// How a worker's registration waits for it to start (`--worker-startup-*`).
    pub worker_startup: WorkerStartup,
}

impl Config {
    /// Checks every flag and builds the configuration.
    pub fn from_cli(cli: &Cli) -> Result<Config, FlagError> {
        let listen_addr = resolve_flag("--host", &cli.host, cli.port)?;
        let prometheus_addr = resolve_flag(
            "--prometheus-host",
            &cli.prometheus_host,
            cli.prometheus_port,
        )?;
        let given = worker_flags(cli)?;
        if given.len() > WORKERS_MAX {
            let message = format!("{} workers given, at most {WORKERS_MAX}", given.len());
            return Err(FlagError::new(given[0].0, message));
        }
        let mut workers: Vec<WorkerSpec> = Vec::with_capacity(given.len());
        let backend = cli.backend.as_deref().and_then(GrpcBackend::parse);
        for (flag, url, role) in given {
            let mut spec =
                WorkerSpec::resolve(&url).map_err(|e| FlagError::new(flag, e.to_string()))?;
            if let WorkerProtocol::Grpc(detected) = &mut spec.protocol {
                *detected = backend;
            }
            if is_own_listener(spec.addr, listen_addr) {
                return Err(FlagError::new(
                    flag,
                    format!("{url} is this gateway's own --host/--port: requests would loop"),
                ));
            }
            if workers.iter().any(|w| w.same_endpoint(&spec)) {
                return Err(FlagError::new(
                    flag,
                    format!("{url} is given twice (spellings of one address count once)"),
                ));
            }
            pd_speaks_http(role, spec.protocol).map_err(|why| FlagError::new(flag, why))?;
            spec.role = role;
            // The KV-event index follows the prefill engines: a decode engine's cache serves no
            // prefix a request is routed on, so it is not asked (an endpoint given still is).
            if role == WorkerRole::Decode {
                spec.kv_events = KvEventsSource::Off;
            }
            workers.push(spec);
        }
        if !cli.kv_events_endpoints.is_empty() {
            if cli.kv_events_endpoints.len() != workers.len() {
                let message = format!(
                    "{} endpoints for {} --worker-urls: give one per worker, in the same order \
                     (none to skip one)",
                    cli.kv_events_endpoints.len(),
                    workers.len()
                );
                return Err(FlagError::new("--kv-events-endpoints", message));
            }
            for (spec, text) in workers.iter_mut().zip(&cli.kv_events_endpoints) {
                spec.kv_events = KvEventsSource::parse(text, spec.host())
                    .map_err(|e| FlagError::new("--kv-events-endpoints", e))?;
            }
        }
        if cli.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(FlagError::new("--api-key", "must not be empty"));
        }
        // The probes write it into a header line (`net::client::get`).
        if cli
            .api_key
            .as_deref()
            .is_some_and(|k| k.contains(char::is_control))
        {
            return Err(FlagError::new(
                "--api-key",
                "must not hold control characters",
            ));
        }
        let max_payload_bytes = usize::try_from(cli.max_payload_size).unwrap_or(usize::MAX);
        if max_payload_bytes == 0 || max_payload_bytes > limits::PAYLOAD_BYTES_MAX {
            let message = format!("must be 1..={} bytes", limits::PAYLOAD_BYTES_MAX);
            return Err(FlagError::new("--max-payload-size", message));
        }
        if cli.request_timeout_secs == 0
            || cli.request_timeout_secs > limits::REQUEST_TIMEOUT_SECS_MAX
        {
            let message = format!("must be 1..={} seconds", limits::REQUEST_TIMEOUT_SECS_MAX);
            return Err(FlagError::new("--request-timeout-secs", message));
        }
        for (flag, secs) in [
            (
                "--upstream-first-byte-timeout-secs",
                cli.upstream_first_byte_timeout_secs,
            ),
            (
                "--upstream-idle-timeout-secs",
                cli.upstream_idle_timeout_secs,
            ),
        ] {
            if secs == 0 || secs > limits::REQUEST_TIMEOUT_SECS_MAX {
                let message = format!("must be 1..={} seconds", limits::REQUEST_TIMEOUT_SECS_MAX);
                return Err(FlagError::new(flag, message));
            }
        }
        let upstream_pool_idle_timeout = match cli.upstream_pool_idle_timeout_secs {
            0 => None,
            secs if secs > limits::REQUEST_TIMEOUT_SECS_MAX => {
                let message = format!("must be 0..={} seconds", limits::REQUEST_TIMEOUT_SECS_MAX);
                return Err(FlagError::new("--upstream-pool-idle-timeout-secs", message));
            }
            secs => Some(Duration::from_secs(secs)),
        };
        let max_inflight_body_bytes_per_core = match cli.max_inflight_body_bytes_per_core {
            None => max_payload_bytes.max(limits::INFLIGHT_BODY_BYTES_PER_CORE_DEFAULT),
            Some(n) => match usize::try_from(n) {
                Ok(n) if n >= max_payload_bytes => n,
                _ => {
                    let message =
                        format!("must be at least --max-payload-size ({max_payload_bytes} bytes)");
                    return Err(FlagError::new(
                        "--max-inflight-body-bytes-per-core",
                        message,
                    ));
                }
            },
        };
        if cli.stream_body_stall_timeout_secs > limits::REQUEST_TIMEOUT_SECS_MAX {
            let message = format!("must be 0..={} seconds", limits::REQUEST_TIMEOUT_SECS_MAX);
            return Err(FlagError::new("--stream-body-stall-timeout-secs", message));
        }
        if cli.shutdown_grace_period_secs > limits::REQUEST_TIMEOUT_SECS_MAX {
            let message = format!("must be 0..={} seconds", limits::REQUEST_TIMEOUT_SECS_MAX);
            return Err(FlagError::new("--shutdown-grace-period-secs", message));
        }
        let data_cores = match cli.data_cores {
            None => data_cores_default(),
            Some(n) if (1..=limits::DATA_CORES_MAX).contains(&n) => n,
            Some(_) => {
                let message = format!("must be 1..={}", limits::DATA_CORES_MAX);
                return Err(FlagError::new("--data-cores", message));
            }
        };
        let header_read_timeout =
            timeout_ms("--header-read-timeout-ms", cli.header_read_timeout_ms)?;
        let client_idle_timeout =
            timeout_ms("--client-idle-timeout-ms", cli.client_idle_timeout_ms)?;
        let worker_settings = cli.worker_args().validate_for(fleet_policy_loads(cli))?;
        let unused = cli.policy.unused_in_hash_mode();
        let mut startup_notices = if unused.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "--cache-index hash does not use {} (given, and ignored)",
                unused.join(", ")
            )]
        };
        let tokenizers =
            load_tokenizers(&cli.tokenizer)?.with_autoload(!cli.tokenizer.disable_autoload);
        for (_, model) in tokenizers.iter() {
            startup_notices.extend(model.notes().iter().cloned());
        }
        let tokenizer_cache = tokenizer_cache(&cli.tokenizer, data_cores)?;
        let mesh = cli.mesh.config()?;
        let policy = cli.policy.validate()?;
        // `--backend` names the engines' protocol (the gRPC workers', merged from main) and, in
        // PD mode, the handshake; without it each pair speaks its prefill engine's (detected).
        let handshake = Handshake::from_backend(cli.backend.as_deref());
        let pd = cli.pd.config(&policy, handshake)?;
        let worker_startup = cli.pd.worker_startup()?;
        let unused = cli.pd.unused_in_regular_mode();
        if !unused.is_empty() {
            startup_notices.push(format!(
                "{} given without --pd-disaggregation (ignored)",
                unused.join(", ")
            ));
        }
        if pd.is_some() && !cli.worker_urls.is_empty() {
            startup_notices.push(
                "--worker-urls given with --pd-disaggregation (ignored: PD routes to --prefill \
                 and --decode workers)"
                    .to_string(),
            );
        }
        let trees = cli.policy.policy == PolicyKind::CacheAware
            && cli.policy.cache_index == crate::policy::CacheIndexKind::Tree;
        if mesh.is_some() && !trees {
            startup_notices.push(
                "--enable-mesh shares only the string and token trees (cache_aware, --cache-index \
                 tree): this gateway's membership runs, its routing state stays local"
                    .to_string(),
            );
        }
        let request_id_headers = crate::request::id::request_id_headers(&cli.request_id_headers)
            .map_err(|e| FlagError::new("--request-id-headers", e))?;
        let discovery = cli
            .discovery
            .config(cli.pd.pd_disaggregation, &mut startup_notices)?;
        let parsers = crate::frontend::ParserFlags::parse(
            cli.tool_call_parser.as_deref(),
            cli.reasoning_parser.as_deref(),
        )
        .map_err(|(flag, e)| FlagError::new(flag, e))?;
        Ok(Config {
            mesh,
            request_id_headers,
            parsers,
            discovery,
            tls: cli.tls.config()?,
            pd: pd.clone(),
            worker_startup,
            tokenizers: Arc::new(tokenizers),
            tokenizer_cache,
            tokenize_inline_max_bytes: cli.tokenizer.inline_max_bytes,
            via_pseudonym: format!("kvgate-{:08x}", fastrand::u32(..)),
            api_key: cli.api_key.clone(),
            grpc_backend: backend,
            header_read_timeout,
            client_idle_timeout,
            body_read_timeout: (cli.stream_body_stall_timeout_secs > 0)
                .then(|| Duration::from_secs(cli.stream_body_stall_timeout_secs)),
            worker_settings,
            startup_notices,
            listen_addr,
            prometheus_addr,
            workers,
            // In PD mode the gateway's policy is the prefill side's: it owns the index (the
            // prefix cache lives on the prefill engines); the decode side's is `pd.decode`.
            policy: match &pd {
                Some(pd) => pd.prefill.clone(),
                None => policy,
            },
            log_level: cli.log_level,
            log_format: if cli.log_json {
                LogFormat::Json
            } else {
                LogFormat::Text
            },
            max_payload_bytes,
            request_timeout: Duration::from_secs(cli.request_timeout_secs),
            upstream_first_byte_timeout: Duration::from_secs(cli.upstream_first_byte_timeout_secs),
            upstream_idle_timeout: Duration::from_secs(cli.upstream_idle_timeout_secs),
            upstream_pool_idle_timeout,
            shutdown_grace_period: Duration::from_secs(cli.shutdown_grace_period_secs),
            max_inflight_body_bytes_per_core,
            data_cores,
        })
    }
}

/// The workers the flags give, with the flag each came from and its role: `--worker-urls`
/// (regular), or under `--pd-disaggregation` `--prefill` and `--decode` (SMG then ignores
/// `--worker-urls`).
fn worker_flags(cli: &Cli) -> Result<Vec<(&'static str, String, WorkerRole)>, FlagError> {
    if !cli.pd.pd_disaggregation {
        let regular = cli.worker_urls.iter();
        return Ok(regular
            .map(|url| ("--worker-urls", url.clone(), WorkerRole::Regular))
            .collect());
    }
    let pd = cli.pd.workers()?;
    Ok(pd.into_iter().map(|w| (w.flag, w.url, w.role)).collect())
}

impl Config {
    /// Whether a worker of `role` may join this gateway's fleet (`POST /workers`): regular
    /// workers in regular mode, prefill and decode workers under `--pd-disaggregation`; `Err`
    /// says why not.
    pub fn admits_role(&self, role: WorkerRole) -> Result<(), String> {
        match (self.pd.is_some(), role) {
            (false, WorkerRole::Regular)
            | (true, WorkerRole::Prefill { .. } | WorkerRole::Decode) => Ok(()),
            (false, role) => Err(format!(
                "worker_type {}: this gateway runs without --pd-disaggregation; only regular \
                 workers",
                role.name()
            )),
            (true, role) => Err(format!(
                "worker_type {}: this gateway runs --pd-disaggregation; give worker_type \
                 prefill or decode",
                role.name()
            )),
        }
    }
}

/// Refuses a `grpc://` worker on either side of a prefill/decode pair: pairs speak HTTP/1.1
/// only (the gRPC form of disaggregation is not built).
pub fn pd_speaks_http(role: WorkerRole, protocol: WorkerProtocol) -> Result<(), String> {
    match (role, protocol) {
        (WorkerRole::Prefill { .. } | WorkerRole::Decode, WorkerProtocol::Grpc(_)) => Err(format!(
            "worker_type {}: prefill/decode workers must be http:// or https:// (disaggregation \
             over gRPC is not supported yet)",
            role.name()
        )),
        _ => Ok(()),
    }
}

/// Whether any policy routing this fleet reads load reports: `--policy`, and under
/// `--pd-disaggregation` each side's.
fn fleet_policy_loads(cli: &Cli) -> PolicyLoads {
    let mut kinds = vec![cli.policy.policy];
    if cli.pd.pd_disaggregation {
        kinds.extend(cli.pd.prefill_policy);
        kinds.extend(cli.pd.decode_policy);
    }
    match kinds
        .into_iter()
        .any(|k| policy_loads(k) == PolicyLoads::Read)
    {
        true => PolicyLoads::Read,
        false => PolicyLoads::Ignored,
    }
}

/// Whether `policy` reads the workers' load reports (SMG's load-aware policies), which keeps
/// them polled under `--disable-load-monitoring`.
fn policy_loads(policy: PolicyKind) -> PolicyLoads {
    match policy {
        PolicyKind::CacheAware | PolicyKind::LeastLoad | PolicyKind::PowerOfTwo => {
            PolicyLoads::Read
        }
        PolicyKind::Random
        | PolicyKind::RoundRobin
        | PolicyKind::PrefixHash
        | PolicyKind::ConsistentHashing => PolicyLoads::Ignored,
    }
}

/// One data core's share of the tokenization cache flags.
fn tokenizer_cache(args: &TokenizerArgs, data_cores: usize) -> Result<CacheConfig, FlagError> {
    if args.cache_l0_max_entries > limits::TOKENIZER_CACHE_L0_ENTRIES_MAX {
        let message = format!("must be at most {}", limits::TOKENIZER_CACHE_L0_ENTRIES_MAX);
        return Err(FlagError::new("--tokenizer-cache-l0-max-entries", message));
    }
    if args.cache_l1_max_memory > limits::TOKENIZER_CACHE_L1_BYTES_MAX {
        let message = format!(
            "must be at most {} bytes",
            limits::TOKENIZER_CACHE_L1_BYTES_MAX
        );
        return Err(FlagError::new("--tokenizer-cache-l1-max-memory", message));
    }
    let share = |total: usize| total.div_ceil(data_cores);
    Ok(CacheConfig {
        l0_entries_max: if args.cache_enable_l0 {
            share(args.cache_l0_max_entries)
        } else {
            0
        },
        l1_bytes_max: if args.cache_enable_l1 {
            share(args.cache_l1_max_memory)
        } else {
            0
        },
    })
}

/// The values of one path flag, by model (`None`: every model).
fn model_specs(values: &[String]) -> Vec<ModelSpec> {
    values
        .iter()
        .map(|v| ModelSpec::parse(v, |p| Path::new(p).exists()))
        .collect()
}

/// The value for `model` among `specs`: its own, else the one for every model.
fn spec_for<'a>(specs: &'a [ModelSpec], model: &Option<String>) -> Option<&'a ModelSpec> {
    let own = specs.iter().rev().find(|s| &s.model == model);
    own.or_else(|| specs.iter().rev().find(|s| s.model.is_none()))
}

/// Reads and builds every model's tokenizer (see `TokenizerArgs` for the flags' forms).
fn load_tokenizers(args: &TokenizerArgs) -> Result<TokenizerSet, FlagError> {
    let (model_paths, tokenizer_paths, templates) = (
        model_specs(&args.model_path),
        model_specs(&args.tokenizer_path),
        model_specs(&args.chat_template),
    );
    let mut models: Vec<Option<String>> = Vec::new();
    for spec in model_paths.iter().chain(&tokenizer_paths).chain(&templates) {
        if !models.contains(&spec.model) {
            models.push(spec.model.clone());
        }
    }
    let mut loaded: Vec<(Option<String>, Arc<ModelTokenizer>)> = Vec::new();
    for model in models {
        let source = match spec_for(&tokenizer_paths, &model) {
            Some(spec) => ("--tokenizer-path", spec),
            None => match spec_for(&model_paths, &model) {
                Some(spec) => ("--model-path", spec),
                None => {
                    let name = model.as_deref().unwrap_or("every model");
                    let message = format!("a chat template for {name} but no tokenizer: give --model-path or --tokenizer-path");
                    return Err(FlagError::new("--chat-template", message));
                }
            },
        };
        let template = spec_for(&templates, &model);
        let label = model.clone().unwrap_or_else(|| source.1.path.clone());
        let tokenizer = Arc::new(load_model_tokenizer(&label, source, template)?);
        // The detokenizer's table (a pass over the vocabulary, seconds for a large one in a
        // debug build) is built now, beside the start, on a thread of its own; the data cores
        // share it read-only, and one that needs it first waits for this build.
        let building = tokenizer.clone();
        let built = std::thread::Builder::new()
            .name("kvgate-decode-table".into())
            .spawn(move || {
                building.decode_table();
            });
        if let Err(e) = built {
            tracing::warn!("{label}: the decode table is built on first use: {e}");
        }
        loaded.push((model, tokenizer));
    }
    Ok(TokenizerSet::new(loaded))
}

/// One model's files: `tokenizer.json` (the path, or inside the directory), the
/// `tokenizer_config.json` beside it, and the template: `--chat-template`, else
/// `chat_template.jinja` or `chat_template.json` beside the tokenizer, else the config's.
fn load_model_tokenizer(
    label: &str,
    (flag, source): (&'static str, &ModelSpec),
    template: Option<&ModelSpec>,
) -> Result<ModelTokenizer, FlagError> {
    let path = PathBuf::from(&source.path);
    let (tokenizer_file, dir) = if path.is_dir() {
        (path.join("tokenizer.json"), path.clone())
    } else {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        (path.clone(), dir)
    };
    let read = |flag: &'static str, file: &Path| {
        std::fs::read(file)
            .map_err(|e| FlagError::new(flag, format!("cannot read {}: {e}", file.display())))
    };
    let optional = |file: PathBuf| file.is_file().then(|| read(flag, &file)).transpose();
    let tokenizer_json = read(flag, &tokenizer_file)?;
    let tokenizer_config_json = optional(dir.join("tokenizer_config.json"))?;
    let chat_template = match template {
        Some(spec) => Some(read_template("--chat-template", Path::new(&spec.path))?),
        None => {
            let beside = ["chat_template.jinja", "chat_template.json"].map(|f| dir.join(f));
            match beside.iter().find(|f| f.is_file()) {
                Some(file) => Some(read_template(flag, file)?),
                None => None,
            }
        }
    };
    let files = TokenizerFiles {
        tokenizer_json,
        tokenizer_config_json,
        chat_template,
    };
    ModelTokenizer::new(label, files).map_err(|e| FlagError::new(flag, e.to_string()))
}

/// A template file: Jinja text, or JSON with a `chat_template` string.
fn read_template(flag: &'static str, file: &Path) -> Result<String, FlagError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| FlagError::new(flag, format!("cannot read {}: {e}", file.display())))?;
    if file.extension().is_some_and(|e| e == "json") {
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| FlagError::new(flag, format!("{}: {e}", file.display())))?;
        return json
            .get("chat_template")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                let message = format!("{} has no \"chat_template\" string", file.display());
                FlagError::new(flag, message)
            });
    }
    Ok(text)
}

fn timeout_ms(flag: &'static str, ms: u64) -> Result<Duration, FlagError> {
    let max_ms = limits::REQUEST_TIMEOUT_SECS_MAX * 1000;
    if ms == 0 || ms > max_ms {
        return Err(FlagError::new(flag, format!("must be 1..={max_ms} ms")));
    }
    Ok(Duration::from_millis(ms))
}

/// All cores but one (the control core), at least one.
fn data_cores_default() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.saturating_sub(1).clamp(1, limits::DATA_CORES_MAX)
}

/// Whether a worker at `worker` is this gateway itself, listening on `listen`: a request
/// routed there would come back, be routed again, and loop until file descriptors run out.
/// Loopback addresses and the unspecified address reach a loopback or wildcard listener; a
/// wildcard listener is also reached through every address of this host's interfaces.
pub fn is_own_listener(worker: SocketAddr, listen: SocketAddr) -> bool {
    if worker.port() != listen.port() {
        return false;
    }
    let (worker_ip, listen_ip) = (canonical_ip(worker.ip()), canonical_ip(listen.ip()));
    let local = worker_ip.is_unspecified() || worker_ip.is_loopback();
    if listen_ip.is_unspecified() {
        local || is_local_address(worker_ip)
    } else {
        worker_ip == listen_ip || (local && listen_ip.is_loopback()) || worker_ip.is_unspecified()
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is an address of this host: only a local address can be bound (a UDP socket,
/// so no connection is made and nothing is sent).
fn is_local_address(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, FlagError> {
        let cli = Cli::try_parse_from(std::iter::once("kvgate").chain(args.iter().copied()))
            .map_err(|e| FlagError::new("clap", e.to_string()))?;
        Config::from_cli(&cli)
    }

    #[test]
    fn a_tokenizers_decode_table_is_built_when_it_is_loaded() {
        use tokenizers::models::wordlevel::WordLevel;
        let dir = std::env::temp_dir().join(format!("kvgate-decode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vocab = [
            ("a".to_string(), 0),
            ("b".to_string(), 1),
            ("[UNK]".to_string(), 2),
        ];
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let path = dir.join("tokenizer.json");
        tokenizers::Tokenizer::new(model)
            .save(&path, false)
            .unwrap();
        let config = parse(&["--tokenizer-path", dir.to_str().unwrap()]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (_, tokenizer) = config.tokenizers.iter().next().expect("one tokenizer");
        // Before any request: no data core builds it on its first one.
        let since = std::time::Instant::now();
        while !tokenizer.has_decode_table() && since.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tokenizer.has_decode_table());
    }

    #[test]
    fn help_has_smgs_headings_in_its_order_as_plain_text_with_every_default() {
        let help = Cli::command_plain().render_long_help().to_string();
        let headings: Vec<&str> = help
            .lines()
            .filter(|l| l.ends_with(':') && !l.starts_with(' ') && !l.starts_with("Usage"))
            .collect();
        assert_eq!(
            headings,
            [
                "Options:",
                "Worker Configuration:",
                "Routing Policy:",
                "PD Disaggregation:",
                "Load Monitoring:",
                "Service Discovery (Kubernetes):",
                "Logging:",
                "Prometheus Metrics:",
                "Request Handling:",
                "Retry Configuration:",
                "Circuit Breaker:",
                "Health Checks:",
                "Tokenizer:",
                "TLS/mTLS Security:",
                "Control Plane Authentication:",
                "Data Plane Authentication:",
                "Mesh:",
                "Runtime:",
            ]
        );
        // -h and -V alone under "Options", ahead of the groups, not between two of them.
        let options: Vec<&str> = help
            .split("Options:\n")
            .nth(1)
            .and_then(|rest| rest.split("\n\nWorker Configuration:").next())
            .map(|block| {
                block
                    .lines()
                    .filter(|l| l.trim_start().starts_with('-'))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(options.len(), 2, "{options:?}");
        assert!(options[0].contains("--help") && options[1].contains("--version"));
        assert!(!help.contains('`'), "Markdown in the help:\n{help}");
        let section = |flag: &str| {
            let start = help
                .find(flag)
                .unwrap_or_else(|| panic!("{flag} not in help"));
            let end = help[start + 1..]
                .find("\n      --")
                .map_or(help.len(), |e| start + 1 + e);
            help[start..end].to_string()
        };
        for flag in [
            "--overload-token-usage-threshold",
            "--balance-token-usage-threshold",
        ] {
            assert!(
                section(flag).contains("[default: 1.0]"),
                "{}",
                section(flag)
            );
        }
        let mesh = help.split("Mesh:\n").nth(1).unwrap_or_default();
        assert!(mesh.trim_start().starts_with("--enable-mesh"), "{mesh}");
    }

    #[test]
    fn upstream_pool_idle_timeout_is_smgs_with_zero_for_never() {
        let default = parse(&[]).unwrap().upstream_pool_idle_timeout;
        assert_eq!(default, Some(Duration::from_secs(3)));
        let flag = "--upstream-pool-idle-timeout-secs";
        let never = parse(&[flag, "0"]).unwrap().upstream_pool_idle_timeout;
        assert_eq!(never, None);
        let two = parse(&[flag, "2"]).unwrap().upstream_pool_idle_timeout;
        assert_eq!(two, Some(Duration::from_secs(2)));
        let err = parse(&[flag, "99999999"]).unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
    }

    #[test]
    fn smgs_flag_aliases_parse_as_their_flags() {
        let by_alias = parse(&[
            "--cache-match-threshold",
            "0.6",
            "--spill-abs-threshold",
            "8",
            "--spill-rel-threshold",
            "1.2",
            "--model",
            "/nonexistent-model-dir",
        ]);
        // --model is --model-path's alias: the path is read (and missing) like --model-path's.
        let err = by_alias.unwrap_err().to_string();
        assert!(err.contains("--model-path"), "{err}");
        let by_alias = parse(&[
            "--cache-match-threshold",
            "0.6",
            "--spill-abs-threshold",
            "8",
            "--spill-rel-threshold",
            "1.2",
        ])
        .unwrap();
        let canonical = parse(&[
            "--cache-threshold",
            "0.6",
            "--balance-abs-threshold",
            "8",
            "--balance-rel-threshold",
            "1.2",
        ])
        .unwrap();
        let (a, c) = (&by_alias.policy.cache_aware, &canonical.policy.cache_aware);
        assert_eq!(a.cache_threshold, c.cache_threshold);
        assert_eq!(a.balance_abs_threshold, 8.0);
        assert_eq!(a.balance_rel_threshold, c.balance_rel_threshold);
        assert_eq!(c.balance_rel_threshold, 1.2);
        let help = Cli::command_plain().render_long_help().to_string();
        for alias in [
            "cache-match-threshold",
            "spill-abs-threshold",
            "spill-rel-threshold",
        ] {
            assert!(help.contains(alias), "{alias} not shown in --help");
        }
    }

    #[test]
    fn unset_token_usage_thresholds_still_disable_their_checks() {
        let config = parse(&[]).unwrap();
        assert_eq!(
            config.policy.cache_aware.overload_token_usage_threshold,
            None
        );
        assert_eq!(
            config.policy.cache_aware.balance_token_usage_threshold,
            None
        );
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_match_smg() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.listen_addr, "0.0.0.0:30000".parse().unwrap());
        assert_eq!(config.prometheus_addr.port(), 29000);
        assert_eq!(config.policy.kind, PolicyKind::CacheAware);
        assert_eq!(config.max_payload_bytes, 512 * 1024 * 1024);
        assert_eq!(config.request_timeout, Duration::from_secs(1800));
        assert_eq!(config.upstream_first_byte_timeout, Duration::from_secs(300));
        assert_eq!(config.upstream_idle_timeout, Duration::from_secs(60));
        assert_eq!(config.shutdown_grace_period, Duration::from_secs(180));
        assert_eq!(config.max_inflight_body_bytes_per_core, 1 << 30);
        let big = parse(&["--max-payload-size", "2147483648"]).unwrap();
        assert_eq!(big.max_inflight_body_bytes_per_core, 2 << 30);
        assert!(config.data_cores >= 1);
        assert!(config.workers.is_empty());
    }

    #[test]
    fn worker_urls_keep_their_exact_spelling() {
        let config = parse(&[
            "--worker-urls",
            "http://127.0.0.1:31001",
            "http://127.0.0.1:31002/",
        ])
        .unwrap();
        assert_eq!(config.workers[0].url, "http://127.0.0.1:31001");
        assert_eq!(config.workers[1].url, "http://127.0.0.1:31002/");
        assert_eq!(config.workers[1].addr, "127.0.0.1:31002".parse().unwrap());
        assert_eq!(config.workers[1].authority, "127.0.0.1:31002");
    }

    #[test]
    fn grpc_workers_take_the_backend_flag_and_http_workers_ignore_it() {
        let urls = [
            "--worker-urls",
            "grpc://127.0.0.1:50051",
            "http://127.0.0.1:8000",
        ];
        let detected = parse(&urls).unwrap();
        assert_eq!(detected.workers[0].protocol, WorkerProtocol::Grpc(None));
        assert_eq!(detected.workers[1].protocol, WorkerProtocol::Http);
        let given = parse(&[&urls[..], &["--backend", "vllm"]].concat()).unwrap();
        let vllm = WorkerProtocol::Grpc(Some(GrpcBackend::Vllm));
        assert_eq!(given.workers[0].protocol, vllm);
        assert_eq!(given.workers[1].protocol, WorkerProtocol::Http);
        assert!(Cli::try_parse_from(["kvgate", "--backend", "trtllm"]).is_err());
    }

    #[test]
    fn api_key_is_optional_and_never_empty() {
        assert_eq!(parse(&[]).unwrap().api_key, None);
        let keyed = parse(&["--api-key", "sk-1"]).unwrap();
        assert_eq!(keyed.api_key.as_deref(), Some("sk-1"));
        assert_eq!(parse(&["--api-key", " "]).unwrap_err().flag, "--api-key");
        let split = parse(&["--api-key", "sk\r\nx-injected: 1"]).unwrap_err();
        assert_eq!(split.flag, "--api-key");
    }

    #[test]
    fn spellings_of_one_worker_are_given_twice() {
        let twice = parse(&[
            "--worker-urls",
            "http://localhost:31005",
            "HTTP://127.0.0.1:31005/",
        ]);
        let error = twice.unwrap_err();
        assert_eq!(error.flag, "--worker-urls");
        assert!(error.reason.contains("twice"), "{error}");
    }

    #[test]
    fn a_worker_at_the_gateways_own_listener_is_refused() {
        let addr = |text: &str| text.parse::<SocketAddr>().unwrap();
        let wildcard = addr("0.0.0.0:30000");
        let loopback = addr("127.0.0.1:30000");
        for own in [
            "127.0.0.1:30000",
            "127.0.0.2:30000",
            "[::1]:30000",
            "0.0.0.0:30000",
            "[::ffff:127.0.0.1]:30000",
        ] {
            assert!(is_own_listener(addr(own), wildcard), "{own}");
            assert!(is_own_listener(addr(own), loopback), "{own}");
        }
        for other in ["127.0.0.1:30001", "192.0.2.1:30000", "[::1]:29999"] {
            assert!(!is_own_listener(addr(other), wildcard), "{other}");
            assert!(!is_own_listener(addr(other), loopback), "{other}");
        }
        let looping = parse(&[
            "--port",
            "30123",
            "--worker-urls",
            "http://localhost:30123/",
        ]);
        assert_eq!(looping.unwrap_err().flag, "--worker-urls");
        assert!(parse(&["--port", "30123", "--worker-urls", "http://localhost:30124"]).is_ok());
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--worker-urls", "https://x:1"], "--worker-urls"),
            (&["--worker-urls", "http://127.0.0.1:1/v1"], "--worker-urls"),
            (
                &["--worker-urls", "http://127.0.0.1:99999"],
                "--worker-urls",
            ),
            (
                &["--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:1"],
                "--worker-urls",
            ),
            (&["--max-payload-size", "0"], "--max-payload-size"),
            (&["--request-timeout-secs", "0"], "--request-timeout-secs"),
            (
                &["--upstream-first-byte-timeout-secs", "0"],
                "--upstream-first-byte-timeout-secs",
            ),
            (
                &["--upstream-idle-timeout-secs", "0"],
                "--upstream-idle-timeout-secs",
            ),
            (
                &["--max-inflight-body-bytes-per-core", "1000"],
                "--max-inflight-body-bytes-per-core",
            ),
            (
                &["--shutdown-grace-period-secs", "86401"],
                "--shutdown-grace-period-secs",
            ),
            (&["--data-cores", "0"], "--data-cores"),
            (&["--data-cores", "100000"], "--data-cores"),
            (
                &["--header-read-timeout-ms", "0"],
                "--header-read-timeout-ms",
            ),
            (&["--host", "no such host.invalid"], "--host"),
            (&["--cache-threshold", "2"], "--cache-threshold"),
            (&["--overlap-decay=-1"], "--overlap-decay"),
            // A negative number after a space is a value, not an unknown flag.
            (&["--overlap-decay", "-1"], "--overlap-decay"),
            (&["--cache-threshold", "-0.5"], "--cache-threshold"),
            (
                &["--tokenizer-path", "/no/such/tokenizer"],
                "--tokenizer-path",
            ),
            (&["--model-path", "m=/no/such/model"], "--model-path"),
            // A template with no tokenizer to go with it.
            (
                &["--chat-template", "/no/such/template.jinja"],
                "--chat-template",
            ),
            (
                &["--tokenizer-cache-l1-max-memory", "100000000000000"],
                "--tokenizer-cache-l1-max-memory",
            ),
        ];
        for (args, flag) in cases {
            let error = parse(args).unwrap_err();
            assert_eq!(error.flag, *flag, "{args:?}");
            assert!(error.to_string().contains(flag), "{error}");
        }
    }

    #[test]
    fn tokenizer_caches_are_off_by_default_and_split_over_the_data_cores() {
        let config = parse(&["--data-cores", "4"]).unwrap();
        // No tokenizer flag: none yet, though a gRPC worker's may come (autoload).
        assert!(config.tokenizers.iter().next().is_none());
        assert!(!config.tokenizers.is_empty());
        assert!(config.tokenizers.wants_fetch("m"));
        let off = parse(&["--data-cores", "4", "--disable-tokenizer-autoload"]).unwrap();
        assert!(off.tokenizers.is_empty());
        assert!(!off.tokenizers.wants_fetch("m"));
        assert_eq!(config.tokenizer_cache, CacheConfig::default());
        let config = parse(&[
            "--data-cores",
            "4",
            "--tokenizer-cache-enable-l0",
            "--tokenizer-cache-enable-l1",
        ])
        .unwrap();
        assert_eq!(config.tokenizer_cache.l0_entries_max, 2_500);
        assert_eq!(config.tokenizer_cache.l1_bytes_max, (50 << 20) / 4);
    }

    #[test]
    fn pd_flags_are_smgs_with_smgs_defaults() {
        let config = parse(&[
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:31001",
            "9001",
            "--prefill",
            "http://127.0.0.1:31002",
            "--prefill",
            "http://127.0.0.1:31003",
            "none",
            "--decode",
            "http://127.0.0.1:31004",
            "--decode",
            "http://127.0.0.1:31005",
            "--decode-policy",
            "round_robin",
        ])
        .unwrap();
        let roles: Vec<(&str, WorkerRole)> = config
            .workers
            .iter()
            .map(|w| (w.url.as_str(), w.role))
            .collect();
        let prefill = |port| WorkerRole::Prefill {
            bootstrap_port: port,
        };
        assert_eq!(
            roles,
            [
                ("http://127.0.0.1:31001", prefill(Some(9001))),
                ("http://127.0.0.1:31002", prefill(None)),
                ("http://127.0.0.1:31003", prefill(None)),
                ("http://127.0.0.1:31004", WorkerRole::Decode),
                ("http://127.0.0.1:31005", WorkerRole::Decode),
            ]
        );
        let pd = config.pd.as_ref().unwrap();
        // --prefill-policy falls back to --policy; --decode-policy was given.
        assert_eq!(pd.prefill.kind, PolicyKind::CacheAware);
        assert_eq!(pd.decode.kind, PolicyKind::RoundRobin);
        assert_eq!(pd.handshake, None);
        assert_eq!(
            config.worker_startup,
            WorkerStartup {
                timeout: Duration::from_secs(1800),
                delay: Duration::ZERO,
                check_interval: Duration::from_secs(30),
            }
        );
        assert!(config.admits_role(WorkerRole::Decode).is_ok());
        // The KV-event index follows the prefill engines: decode workers are not asked.
        let sources: Vec<&KvEventsSource> = config.workers.iter().map(|w| &w.kv_events).collect();
        let discover = &KvEventsSource::Discover;
        let off = &KvEventsSource::Off;
        assert_eq!(sources, [discover, discover, discover, off, off]);
        assert!(config.admits_role(WorkerRole::Regular).is_err());
        let fallback = parse(&["--pd-disaggregation", "--policy", "random"]).unwrap();
        let fallback = fallback.pd.unwrap();
        assert_eq!(
            (fallback.prefill.kind, fallback.decode.kind),
            (PolicyKind::Random, PolicyKind::Random)
        );
        let vllm = parse(&["--pd-disaggregation", "--backend", "vllm"]).unwrap();
        assert_eq!(vllm.pd.unwrap().handshake, Some(Handshake::Vllm));
        // Without --pd-disaggregation the PD flags are ignored, as SMG ignores them: said once.
        let regular = parse(&["--decode", "http://127.0.0.1:31004"]).unwrap();
        assert!(regular.pd.is_none() && regular.workers.is_empty());
        assert!(regular
            .startup_notices
            .iter()
            .any(|n| n.contains("--decode")));
        assert!(regular.admits_role(WorkerRole::Regular).is_ok());
        assert!(regular.admits_role(WorkerRole::Decode).is_err());
    }

    #[test]
    fn pd_flag_errors_name_their_flag_in_one_line() {
        let cases: &[(&[&str], &str, &str)] = &[
            (
                &[
                    "--pd-disaggregation",
                    "--prefill",
                    "http://127.0.0.1:1",
                    "0",
                ],
                "--prefill",
                "1-65535",
            ),
            (
                &["--pd-disaggregation", "--prefill", "9001"],
                "--prefill",
                "no URL",
            ),
            (
                &[
                    "--pd-disaggregation",
                    "--prefill",
                    "http://127.0.0.1:1",
                    "port",
                ],
                "--prefill",
                "neither",
            ),
            (
                &["--pd-disaggregation", "--prefill", "grpc://127.0.0.1:1"],
                "--prefill",
                "must be http:// or https://",
            ),
            (
                &[
                    "--pd-disaggregation",
                    "--decode",
                    "http://127.0.0.1:1",
                    "--prefill",
                    "http://localhost:1",
                ],
                "--decode",
                "twice",
            ),
            (
                &[
                    "--pd-disaggregation",
                    "--prefill",
                    "http://127.0.0.1:1",
                    "--prefill-policy",
                    "power_of_two",
                ],
                "--prefill-policy",
                "at least 2",
            ),
            (
                &["--pd-disaggregation", "--decode-policy", "power_of_two"],
                "--decode-policy",
                "at least 2",
            ),
            (
                &["--worker-startup-timeout-secs", "0"],
                "--worker-startup-timeout-secs",
                "1..=",
            ),
            (
                &["--worker-startup-check-interval", "0"],
                "--worker-startup-check-interval",
                "1..=",
            ),
        ];
        for (args, flag, says) in cases {
            let error = parse(args).unwrap_err();
            assert_eq!(error.flag, *flag, "{args:?}: {error}");
            let line = error.to_string();
            assert!(line.contains(says) && !line.contains('\n'), "{line}");
        }
        // clap's own refusals: an unknown backend, a third value after --prefill.
        assert!(parse(&["--backend", "trtllm"]).is_err());
        assert!(parse(&["--prefill", "http://127.0.0.1:1", "1", "2"]).is_err());
    }

    #[test]
    fn policy_names_are_snake_case() {
        assert_eq!(
            parse(&["--policy", "random"]).unwrap().policy.kind,
            PolicyKind::Random
        );
        assert_eq!(
            parse(&["--policy", "round_robin"]).unwrap().policy.kind,
            PolicyKind::RoundRobin
        );
        assert!(parse(&["--policy", "nope"]).is_err());
    }
}
