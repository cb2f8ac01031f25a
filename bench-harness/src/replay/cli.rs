//! The command line: clap types ([`Cli`]) and their checked conversion into [`ReplayOptions`] and
//! [`CompareOptions`]. Errors name the flag to change.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::compare::{validate_policies, CompareOptions, PdFleet};
use super::form::{CapturedModel, FormOptions, RequestForm, TenantOptions};
use super::limits::CONCURRENCY_MAX;
use super::pacing::Pacing;
use super::progress::ProgressMode;
use super::run::{ReplayOptions, Source};
use super::sharegpt::ShareGptOptions;
use super::synthetic::{Popularity, SyntheticSpec};
use super::trace::TraceFormat;
use crate::fleet::sibling_binary;

/// Replays LLM request traces or generated shared-prefix workloads through a gateway and reports
/// cache hit rate, TTFT / ITL / end-to-end latency, throughput and load imbalance.
#[derive(Debug, Parser)]
#[command(name = "replay", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a sim-engine fleet and one kvgate per policy, replay the same workload through each,
    /// and print the results side by side.
    Compare(CompareArgs),
}

/// `replay --gateway URL ...`
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The gateway (or engine) to send requests to, e.g. http://127.0.0.1:30000.
    #[arg(long)]
    pub gateway: Option<String>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Write the JSON report here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the SVG plot here (default: the --out path with .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `replay compare ...`
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Policies to compare, comma-separated: kvgate --policy names, `cache_aware:hash`
    /// (cache_aware with --cache-index hash; its --cache-boundaries go in --gateway-args),
    /// `cache_aware:kv` (the engines publish KV events and cache_aware routes token IDs on them;
    /// use a token-ID form such as --form generate-ids), `cache_aware:load` (cache_aware with
    /// --load-aware-affinity), and `direct` (no gateway). cache_aware's modifiers combine with
    /// `:` (`cache_aware:kv:load`, `cache_aware:hash:load`; `events-only`: the KV-event index
    /// without its in-flight overlay, --kv-inflight-ttl-secs 0; `holders-7`: the hash index keeps
    /// seven holders per head, --cache-holders-max 7; `bounded-8` or `bounded-4`: every worker
    /// within 8 or 4 requests of the mean count sent, --bounded-load-margin 8 or 4). The default
    /// compares round robin with README's recommended configuration for engines without KV
    /// events (cache_aware with its defaults).
    #[arg(long, value_delimiter = ',', default_value = "round_robin,cache_aware")]
    pub policies: Vec<String>,
    /// Simulated engines per fleet.
    #[arg(long, default_value_t = 4)]
    pub engines: u16,
    /// Run each policy on a prefill/decode fleet of P prefill and D decode engines (e.g. 2:2),
    /// kvgate --pd-disaggregation with the policy on the prefill side; the hit rate is the
    /// prefill engines'. Replaces --engines.
    #[arg(long, value_name = "P:D")]
    pub pd: Option<String>,
    /// Run the engines over SMG's gRPC protocol of this engine (`sim-engine --grpc`), each
    /// gateway in front of `grpc://` workers as their front end. The gateway then tokenizes and
    /// detokenizes: give both the model's tokenizer, e.g.
    /// `--sim-arg=--tokenizer-path=DIR --gateway-arg=--tokenizer-path=DIR` (scripts/demo.sh
    /// with DEMO_GRPC=sglang does). Not with --pd or the `direct` policy.
    #[arg(long, value_enum, conflicts_with = "pd")]
    pub grpc: Option<GrpcEngineArg>,
    /// The sim-engine binary (default: next to this executable).
    #[arg(long)]
    pub sim_engine: Option<PathBuf>,
    /// The kvgate binary (default: next to this executable).
    #[arg(long)]
    pub kvgate: Option<PathBuf>,
    /// An extra sim-engine flag, e.g. --sim-arg=--page-size=32 (repeatable; not one set above).
    #[arg(long = "sim-arg", allow_hyphen_values = true)]
    pub sim_args: Vec<String>,
    /// An extra kvgate flag (repeatable).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    pub gateway_args: Vec<String>,
    /// KV cache capacity of each simulated engine, in tokens (sim-engine --kv-capacity-tokens).
    /// Smaller than the workload's shared prefixes so that where requests go matters.
    #[arg(long, default_value_t = 32_768)]
    pub kv_capacity_tokens: u64,
    /// Simulated time runs this many times faster than real time (sim-engine --speedup).
    #[arg(long, default_value_t = 5.0)]
    pub sim_speedup: f64,
    /// Directory for the children's logs.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// Write the combined JSON report here.
    #[arg(long, default_value = "replay-compare.json")]
    pub out: PathBuf,
    /// Write the combined SVG plot here.
    #[arg(long, default_value = "replay-compare.svg")]
    pub plot: PathBuf,
}

/// `replay compare --grpc`: which engine's gRPC protocol the fleets speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GrpcEngineArg {
    Sglang,
    Vllm,
}

impl GrpcEngineArg {
    /// The name `sim-engine --grpc` takes.
    pub fn name(self) -> &'static str {
        match self {
            GrpcEngineArg::Sglang => "sglang",
            GrpcEngineArg::Vllm => "vllm",
        }
    }
}

/// Group popularity of the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PopularityArg {
    Uniform,
    Zipf,
}

/// Trace formats as flag values. Every format is read line by line (a ShareGPT JSON array element
/// by element), never whole; a line that is not valid is skipped, counted by kind in the report
/// and named with its line number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TraceFormatArg {
    /// Mooncake JSONL: {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]};
    /// content generated from the hash ids, 512 tokens each.
    Mooncake,
    /// Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens; lengths only.
    Azure,
    /// Captured requests, one JSON per line: {"timestamp_ms": number (ms, any origin),
    /// "endpoint": "/v1/chat/completions" | "/v1/completions" | "/generate" | "/v1/messages",
    /// "body": {the request body}}. Sent as captured, paced by the timestamps; the body keeps its
    /// model unless --model is given; --output-cap lowers (or sets, when absent) chat
    /// max_completion_tokens and max_tokens (max_tokens alone when neither is present),
    /// completions and messages max_tokens, /generate sampling_params.max_new_tokens. --form does
    /// not apply. The report's hit rate needs usage in the responses (for streamed OpenAI requests,
    /// stream_options.include_usage in the captured body).
    OpenaiLog,
    /// ShareGPT conversations, JSONL or one JSON array: {"conversations": [{"from": "human" |
    /// "gpt" | "system", "value": ".."}, ..]} or {"messages": [{"role": .., "content": ..}, ..]}.
    /// Every answer is one chat request: the turns before it (earlier answers from the data) as
    /// its messages, its word count as the output length. --active-conversations are in progress
    /// at once, interleaved by --seed; no timestamps (paced by --rate or a closed loop).
    Sharegpt,
    /// Token ids, one JSON per line, as the LLMServingSim workloads: input_tok_ids (or input_ids,
    /// prompt_token_ids): the prompt's token ids; output_toks (or output_len, output_length):
    /// tokens to generate; arrival_time_ns (ns) or timestamp_ms (ms), exactly one; input_toks
    /// (optional) must equal the number of ids; other fields are ignored. Sent as /generate
    /// input_ids (or --form completions: a prompt of ids), or with --tokenizer-path as the text
    /// the ids decode to, in any text --form.
    TokenIds,
}

/// What to send and how fast (shared by replay and compare).
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// A trace file: Mooncake JSONL (.jsonl) or Azure CSV (.csv), or any --trace-format.
    #[arg(long, conflicts_with = "synthetic")]
    pub trace: Option<PathBuf>,
    /// The trace's format, when its extension does not say (.jsonl and .json: mooncake, .csv:
    /// azure).
    #[arg(long, requires = "trace")]
    pub trace_format: Option<TraceFormatArg>,
    /// token-ids: decode the ids with this Hugging Face tokenizer.json (the file the gateway
    /// tokenizes with) and send the text instead of input_ids.
    #[arg(long, requires = "trace")]
    pub tokenizer_path: Option<PathBuf>,
    /// sharegpt: conversations in progress at once (1: one after another).
    #[arg(long, default_value_t = 16)]
    pub active_conversations: usize,
    /// Generate a shared-prefix workload instead of reading a trace.
    #[arg(long)]
    pub synthetic: bool,
    /// Generator: groups (distinct system prompts).
    #[arg(long, default_value_t = 32)]
    pub groups: u32,
    /// Generator: conversations per group.
    #[arg(long, default_value_t = 8)]
    pub prompts_per_group: u32,
    /// Generator: system prompt length in tokens.
    #[arg(long, default_value_t = 2048)]
    pub system_prompt_len: u32,
    /// Generator: question length in tokens (per turn).
    #[arg(long, default_value_t = 128)]
    pub question_len: u32,
    /// Generator: output length in tokens (also the answer kept in later turns).
    #[arg(long, default_value_t = 32)]
    pub output_len: u32,
    /// Generator: how requests spread over groups.
    #[arg(long, value_enum, default_value_t = PopularityArg::Uniform)]
    pub popularity: PopularityArg,
    /// Generator: Zipf exponent (with --popularity zipf).
    #[arg(long, default_value_t = 1.0)]
    pub zipf_exponent: f64,
    /// Generator: turns per conversation (1 = single-turn).
    #[arg(long, default_value_t = 1)]
    pub turns: u32,
    /// Seed of the generator, of Poisson arrivals and of the order of ShareGPT conversations.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Pace by the trace's timestamps divided by this factor (default for traces: 1).
    #[arg(long, conflicts_with_all = ["rate", "concurrency"])]
    pub speedup: Option<f64>,
    /// Poisson arrivals at this many requests per second.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Closed loop: keep this many requests in flight (default for --synthetic and sharegpt: 8).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Stop after this many requests.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Repeat the trace (fresh content and ids per pass) until --max-requests. Real prompts
    /// (openai-log, sharegpt, token-ids) start every later pass N with the word loop-N (token ids:
    /// with the id N), so no pass hits what an earlier one cached.
    #[arg(long = "loop", requires = "max_requests")]
    pub repeat: bool,
    /// Request shape (default: chat; token-ids without --tokenizer-path: generate-ids).
    #[arg(long, value_enum)]
    pub form: Option<RequestForm>,
    /// The model name sent in OpenAI-style bodies [default: sim-model] (sim-engine serves
    /// `sim-model`; `compare` starts its engines with this name). Captured openai-log bodies keep
    /// their own model unless this is given (in `compare`, always this one).
    #[arg(long)]
    pub model: Option<String>,
    /// Spread requests over this many tenants (0 = none); see --tenant-salt and --tenant-lora.
    #[arg(long, default_value_t = 0)]
    pub tenants: u32,
    /// Give each tenant its own cache_salt.
    #[arg(long)]
    pub tenant_salt: bool,
    /// Give each tenant its own LoRA adapter (lora_path).
    #[arg(long)]
    pub tenant_lora: bool,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout_s: f64,
    /// Cap every request's output length at this many tokens (fewer streamed tokens per request;
    /// openai-log: the fields --trace-format names).
    #[arg(long)]
    pub output_cap: Option<u32>,
    /// Sample this process's resident memory (e.g. the gateway's) at 10%, 50% and 100% of the run.
    #[arg(long)]
    pub watch_pid: Option<u32>,
    /// No progress output on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

/// The model of OpenAI-style bodies when `--model` is not given: the one sim-engine serves.
pub const MODEL_DEFAULT: &str = "sim-model";

impl WorkloadArgs {
    /// `--model`, or [`MODEL_DEFAULT`].
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or(MODEL_DEFAULT)
    }

    fn source(&self) -> Result<Source, String> {
        if let Some(path) = &self.trace {
            return self.trace_source(path);
        }
        if !self.synthetic {
            return Err("give a workload: --trace PATH or --synthetic".into());
        }
        if self.repeat {
            return Err("--loop repeats a trace; --synthetic takes --max-requests instead".into());
        }
        let popularity = match self.popularity {
            PopularityArg::Uniform => Popularity::Uniform,
            PopularityArg::Zipf => Popularity::Zipf {
                exponent: self.zipf_exponent,
            },
        };
        let spec = SyntheticSpec {
            groups: self.groups,
            prompts_per_group: self.prompts_per_group,
            system_prompt_tokens: self.system_prompt_len,
            question_tokens: self.question_len,
            output_tokens: self.output_len,
            popularity,
            turns: self.turns,
            seed: self.seed,
            requests: self.max_requests,
        };
        spec.validate()?;
        Ok(Source::Synthetic(spec))
    }

    fn trace_source(&self, path: &std::path::Path) -> Result<Source, String> {
        let format = match self.trace_format {
            Some(format) => format,
            None => match TraceFormat::from_path(path) {
                Some(TraceFormat::Azure) => TraceFormatArg::Azure,
                Some(_) => TraceFormatArg::Mooncake,
                None => {
                    return Err(format!(
                    "--trace {}: cannot tell the format from the extension; pass --trace-format",
                    path.display()
                ))
                }
            },
        };
        if self.tokenizer_path.is_some() && format != TraceFormatArg::TokenIds {
            return Err("--tokenizer-path decodes --trace-format token-ids".into());
        }
        let format = match format {
            TraceFormatArg::Sharegpt => {
                let options = ShareGptOptions {
                    active_conversations: self.active_conversations,
                    seed: self.seed,
                    repeat: self.repeat,
                };
                options.validate()?;
                return Ok(Source::ShareGpt {
                    path: path.to_path_buf(),
                    options,
                });
            }
            TraceFormatArg::Mooncake => TraceFormat::Mooncake,
            TraceFormatArg::Azure => TraceFormat::Azure,
            TraceFormatArg::OpenaiLog => TraceFormat::OpenaiLog,
            TraceFormatArg::TokenIds => TraceFormat::TokenIds,
        };
        Ok(Source::Trace {
            path: path.to_path_buf(),
            format,
            repeat: self.repeat,
            tokenizer: self.tokenizer_path.clone(),
        })
    }

    /// `--form`, or the source's default; refused where the source has nothing of that shape.
    fn form(&self, source: &Source) -> Result<RequestForm, String> {
        let name = |form: RequestForm| {
            form.to_possible_value()
                .map_or_else(String::new, |v| v.get_name().to_string())
        };
        let has_text = match source {
            Source::Trace {
                format: TraceFormat::OpenaiLog,
                ..
            } => {
                return match self.form {
                    Some(_) => Err("--form does not apply to --trace-format openai-log: a captured request keeps its endpoint and body".into()),
                    None => Ok(RequestForm::Chat),
                };
            }
            Source::Trace {
                format: TraceFormat::TokenIds,
                tokenizer: None,
                ..
            } => {
                return match self.form {
                    None | Some(RequestForm::GenerateIds) => Ok(RequestForm::GenerateIds),
                    Some(RequestForm::Completions) => Ok(RequestForm::Completions),
                    Some(form) => Err(format!("--form {} sends text: give --tokenizer-path to decode the token ids, or use generate-ids or completions", name(form))),
                };
            }
            Source::Trace {
                format: TraceFormat::TokenIds,
                ..
            } => "token ids decoded by --tokenizer-path (drop it to send the ids)",
            Source::ShareGpt { .. } => "ShareGPT conversations",
            Source::Trace { .. } | Source::Synthetic(_) => "",
        };
        match self.form {
            Some(RequestForm::GenerateIds) if !has_text.is_empty() => Err(format!(
                "--form generate-ids sends token ids, and {has_text} are text: use chat, completions, generate-text or routing-tokens"
            )),
            form => Ok(form.unwrap_or(RequestForm::Chat)),
        }
    }

    fn pacing(&self, source: &Source) -> Result<Pacing, String> {
        let is_trace = matches!(source, Source::Trace { .. });
        let untimed = match source {
            Source::ShareGpt { .. } => "a ShareGPT file",
            _ => "--synthetic",
        };
        match (self.speedup, self.rate, self.concurrency) {
            (Some(speedup), _, _) if !(speedup.is_finite() && speedup > 0.0) => {
                Err("--speedup must be above 0".into())
            }
            (Some(_), _, _) if !is_trace => Err(format!(
                "--speedup paces by trace timestamps, and {untimed} has none: use --rate or --concurrency"
            )),
            (Some(speedup), _, _) => Ok(Pacing::Trace { speedup }),
            (_, Some(rate), _) if !(rate.is_finite() && rate > 0.0) => {
                Err("--rate must be above 0".into())
            }
            (_, Some(rate_per_s), _) => Ok(Pacing::Poisson {
                rate_per_s,
                seed: self.seed,
            }),
            (_, _, Some(c)) if c == 0 || c > CONCURRENCY_MAX => Err(format!(
                "--concurrency must be between 1 and {CONCURRENCY_MAX}"
            )),
            (_, _, Some(concurrency)) => Ok(Pacing::Closed { concurrency }),
            _ if is_trace => Ok(Pacing::Trace { speedup: 1.0 }),
            _ => Ok(Pacing::Closed {
                concurrency: CLOSED_LOOP_CONCURRENCY_DEFAULT,
            }),
        }
    }

    /// The replay these flags describe, against `gateway`.
    pub fn replay_options(&self, gateway: String) -> Result<ReplayOptions, String> {
        let source = self.source()?;
        let pacing = self.pacing(&source)?;
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return Err("--timeout-s must be above 0".into());
        }
        let tenant = TenantOptions {
            tenants: self.tenants,
            cache_salt: self.tenant_salt,
            lora: self.tenant_lora,
        };
        if tenant.tenants > 0 && !tenant.cache_salt && !tenant.lora {
            return Err("--tenants needs --tenant-salt and/or --tenant-lora".into());
        }
        let captured_model = match self.model {
            Some(_) => CapturedModel::Replace,
            None => CapturedModel::Keep,
        };
        Ok(ReplayOptions {
            gateway,
            form: FormOptions {
                form: self.form(&source)?,
                model: self.model_name().to_string(),
                captured_model,
                tenant,
                output_cap: self.output_cap,
            },
            source,
            pacing,
            max_requests: self.max_requests,
            request_timeout: Duration::from_secs_f64(self.timeout_s),
            label: "replay".into(),
            known_workers: Vec::new(),
            progress: if self.no_progress {
                ProgressMode::Off
            } else {
                ProgressMode::Auto
            },
            watch_pid: self.watch_pid,
        })
    }
}

/// Requests per policy of `replay compare` when neither a trace nor --max-requests is given
/// (`make demo`): with the generator's defaults and 4 engines, about a minute per policy on 2
/// shared cores. Enough that a p99 is not one or two moments of the machine: on a loaded box the
/// slowest first tokens come eight at a time (every request in flight stalled at once), so at
/// 1,500 requests the p99 was the run's second-worst stall, for either policy
/// (perf/results-routing-2.md, "make demo's TTFT p99 on a loaded box").
pub const COMPARE_REQUESTS_DEFAULT: u64 = 6000;

/// Closed-loop concurrency of a workload without timestamps (the generator, ShareGPT) and without
/// a pacing flag: few enough in flight that bursts of one new prefix are rare, so a comparison
/// shows placement, not burst handling.
pub const CLOSED_LOOP_CONCURRENCY_DEFAULT: usize = 8;

impl CompareArgs {
    /// The workload flags, with compare's defaults: the generator when no trace is given,
    /// [`COMPARE_REQUESTS_DEFAULT`] requests, and the fleet's model in every body (captured ones
    /// too: the fleet serves no other).
    fn demo_workload(&self) -> WorkloadArgs {
        let mut workload = self.workload.clone();
        workload.model = Some(self.workload.model_name().to_string());
        if workload.trace.is_none() {
            workload.synthetic = true;
            workload.max_requests = workload.max_requests.or(Some(COMPARE_REQUESTS_DEFAULT));
        }
        workload
    }

    /// Flags for every sim-engine: capacity and speed, then any --sim-arg.
    fn sim_flags(&self) -> Vec<String> {
        let mut flags = vec![
            format!("--model-name={}", self.workload.model_name()),
            format!("--kv-capacity-tokens={}", self.kv_capacity_tokens),
            format!("--speedup={}", self.sim_speedup),
        ];
        flags.extend(self.sim_args.iter().cloned());
        flags
    }

    /// The comparison these flags describe.
    pub fn compare_options(&self) -> Result<CompareOptions, String> {
        validate_policies(&self.policies)?;
        if self.grpc.is_some() && self.policies.iter().any(|p| p == super::compare::DIRECT) {
            return Err("--grpc runs every policy through a gateway: drop `direct` from --policies (a replay client speaks HTTP, not gRPC)".into());
        }
        let binary = |given: &Option<PathBuf>, name: &str| {
            given.clone().or_else(|| sibling_binary(name)).ok_or_else(|| {
                format!("{name} not found next to this executable: build it (cargo build --release --workspace --bins) or pass --{name}")
            })
        };
        let log_dir = self.log_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("replay-compare-{}", std::process::id()))
        });
        Ok(CompareOptions {
            policies: self.policies.clone(),
            engines: self.engines,
            pd: self.pd.as_deref().map(PdFleet::parse).transpose()?,
            grpc: self.grpc.map(GrpcEngineArg::name),
            sim_engine: binary(&self.sim_engine, "sim-engine")?,
            kvgate: binary(&self.kvgate, "kvgate")?,
            sim_args: self.sim_flags(),
            gateway_args: self.gateway_args.clone(),
            log_dir,
            replay: self.demo_workload().replay_options(String::new())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `replay compare` with `flags`, on stand-in binaries.
    fn compare_options_of(flags: &[&str]) -> CompareOptions {
        let stand_ins = ["--kvgate", "/bin/true", "--sim-engine", "/bin/true"];
        let cli =
            Cli::try_parse_from([&["replay", "compare"], flags, &stand_ins].concat()).unwrap();
        let Some(Command::Compare(compare)) = cli.command else {
            panic!("not compare")
        };
        compare.compare_options().unwrap()
    }

    #[test]
    fn the_default_comparison_is_round_robin_against_the_recommended_configuration() {
        let options = compare_options_of(&[]);
        assert_eq!(options.policies, ["round_robin", "cache_aware"]);
        // Keep in step with README.md, "Recommended configuration", and scripts/demo.sh.
        assert_eq!(
            super::super::compare::gateway_flags(&options, "cache_aware"),
            "kvgate --policy cache_aware"
        );
    }

    #[test]
    fn the_legend_names_each_columns_gateway_flags() {
        let options = compare_options_of(&[
            "--policies",
            "round_robin,cache_aware:load,cache_aware:bounded-8,direct",
            "--gateway-arg=--block-size=32",
        ]);
        let legend = |policy| super::super::compare::gateway_flags(&options, policy);
        assert_eq!(
            legend("round_robin"),
            "kvgate --policy round_robin --block-size=32"
        );
        assert_eq!(
            legend("cache_aware:load"),
            "kvgate --policy cache_aware --load-aware-affinity --block-size=32"
        );
        assert_eq!(
            legend("cache_aware:bounded-8"),
            "kvgate --policy cache_aware --bounded-load-margin 8 --block-size=32"
        );
        assert!(legend("direct").starts_with("(no gateway"));
    }

    #[test]
    fn conflicting_and_missing_flags_are_refused() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["replay"], args].concat());
        assert!(parse(&[
            "--gateway",
            "http://x:1",
            "--synthetic",
            "--rate",
            "5",
            "--concurrency",
            "2"
        ])
        .is_err());
        assert!(parse(&["--gateway", "http://x:1", "--trace", "t.jsonl", "--loop"]).is_err());
        let cli = parse(&["--gateway", "http://x:1", "--synthetic", "--speedup", "2"]).unwrap();
        let err = cli
            .replay
            .workload
            .replay_options("http://x:1".into())
            .unwrap_err();
        assert!(err.contains("--rate or --concurrency"), "{err}");
        let cli = parse(&[
            "--gateway",
            "http://x:1",
            "--trace",
            "t.jsonl",
            "--speedup",
            "10",
        ])
        .unwrap();
        let options = cli
            .replay
            .workload
            .replay_options("http://x:1".into())
            .unwrap();
        assert_eq!(options.pacing, Pacing::Trace { speedup: 10.0 });
        let cli = parse(&[
            "compare",
            "--synthetic",
            "--policies",
            "round_robin,nonsense",
        ])
        .unwrap();
        let Some(Command::Compare(compare)) = cli.command else {
            panic!("not compare")
        };
        let err = compare.compare_options().unwrap_err();
        assert!(err.contains("unknown policy \"nonsense\""), "{err}");
    }

    #[test]
    fn real_prompt_formats_pick_their_form_and_refuse_what_they_cannot_send() {
        let options = |args: &[&str]| {
            let all = [
                &["replay", "--gateway", "http://x:1", "--trace", "t.jsonl"],
                args,
            ]
            .concat();
            Cli::try_parse_from(all)
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.replay.workload.replay_options("http://x:1".into()))
        };
        let ids = ["--trace-format", "token-ids"];
        assert_eq!(options(&ids).unwrap().form.form, RequestForm::GenerateIds);
        let chat_ids = options(&[&ids[..], &["--form", "chat"]].concat()).unwrap_err();
        assert!(chat_ids.contains("--tokenizer-path"), "{chat_ids}");
        let decoded = [&ids[..], &["--tokenizer-path", "tok.json"]].concat();
        assert_eq!(options(&decoded).unwrap().form.form, RequestForm::Chat);
        assert!(options(&[&decoded[..], &["--form", "generate-ids"]].concat()).is_err());
        let err = options(&["--tokenizer-path", "tok.json"]).unwrap_err();
        assert!(err.contains("token-ids"), "{err}");

        let sharegpt = ["--trace-format", "sharegpt"];
        let replay = options(&sharegpt).unwrap();
        assert_eq!(replay.pacing, Pacing::Closed { concurrency: 8 });
        assert!(matches!(replay.source, Source::ShareGpt { .. }));
        let err = options(&[&sharegpt[..], &["--speedup", "2"]].concat()).unwrap_err();
        assert!(err.contains("--rate or --concurrency"), "{err}");
        assert!(options(&[&sharegpt[..], &["--form", "generate-ids"]].concat()).is_err());
        assert!(options(&[&sharegpt[..], &["--active-conversations", "0"]].concat()).is_err());

        let log = ["--trace-format", "openai-log"];
        let keep = options(&log).unwrap();
        assert_eq!(keep.form.captured_model, CapturedModel::Keep);
        assert_eq!(keep.form.model, MODEL_DEFAULT);
        let replace = options(&[&log[..], &["--model", "m"]].concat()).unwrap();
        assert_eq!(replace.form.captured_model, CapturedModel::Replace);
        let err = options(&[&log[..], &["--form", "chat"]].concat()).unwrap_err();
        assert!(err.contains("keeps its endpoint"), "{err}");
    }
}
