//! Every bound of the replay tool, with the reason for its value, in one place.

/// Tokens per Mooncake hash id: the trace's block size (its README: one id per 512-token block).
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// Longest prompt a workload may produce, in tokens. Mooncake's longest row is 126,195 tokens;
/// anything far above that is a corrupt line, not a prompt, and would make a multi-megabyte body.
pub const PROMPT_TOKENS_MAX: u32 = 1 << 20;

/// Longest output a workload may ask for, in tokens (a corrupt length must not stall a replay).
pub const OUTPUT_TOKENS_MAX: u32 = 1 << 16;

/// Longest trace line read, in bytes: a Mooncake row of `PROMPT_TOKENS_MAX` tokens has 2,048 ids
/// of at most 20 digits; a longer line is malformed and is skipped without being buffered whole.
pub const TRACE_LINE_BYTES_MAX: usize = 64 * 1024;

/// Longest line of a captured request log (`--trace-format openai-log`), in bytes: a chat body of
/// `PROMPT_TOKENS_MAX` tokens is about 4 MiB of text, and a captured line holds one body.
pub const CAPTURED_LINE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Longest line of a token-id trace (`--trace-format token-ids`), in bytes: `PROMPT_TOKENS_MAX`
/// ids of a vocabulary below 10^6 are at most 7 bytes each with their comma.
pub const TOKEN_IDS_LINE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Largest ShareGPT conversation (one JSONL line, or one element of a JSON array), in bytes: the
/// longest ShareGPT conversations are a few hundred kilobytes; a record over this is skipped
/// without being buffered whole.
pub const CONVERSATION_BYTES_MAX: usize = 1024 * 1024;

/// Turns of one ShareGPT conversation: each answered turn is a request that re-sends the whole
/// history, so the bytes sent for one conversation grow with the square of its turns.
pub const CONVERSATION_TURNS_MAX: usize = 1024;

/// ShareGPT conversations in progress at once (`--active-conversations`): each is held whole
/// until its last request is sent, so together they hold at most this many
/// `CONVERSATION_BYTES_MAX` records.
pub const CONVERSATIONS_ACTIVE_MAX: usize = 256;

/// Bytes of a tokenizer file read (`--tokenizer-path`): the largest tokenizer.json files of
/// current models (256k-entry vocabularies with their merges) are about 30 MB.
pub const TOKENIZER_FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// Warnings kept in the report (each malformed line is counted; only the first ones are named,
/// so a corrupt million-line file does not make a million-line report).
pub const WARNINGS_KEPT_MAX: usize = 32;

/// Requests in flight at once in open-loop pacing. Latency is measured from the scheduled send
/// time, so waiting for a slot still counts against the gateway (no coordinated omission); the
/// cap only keeps a stalled gateway from making the load generator run out of memory or ports.
pub const IN_FLIGHT_OPEN_LOOP_MAX: usize = 4096;

/// Closed-loop concurrency accepted from `--concurrency`, for the same reason.
pub const CONCURRENCY_MAX: usize = IN_FLIGHT_OPEN_LOOP_MAX;

/// Idle keep-alive connections kept per gateway: one per request in flight is the most reuse can use.
pub const IDLE_CONNECTIONS_MAX: usize = IN_FLIGHT_OPEN_LOOP_MAX;

/// Bytes of one server-sent event buffered while waiting for its end (`\n\n`): a final usage
/// chunk is a few hundred bytes, a streamed `/generate` chunk repeats the text so far.
pub const SSE_EVENT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes of a non-streamed (JSON) response body read.
pub const JSON_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Token IDs put in an `x-smg-routing-tokens` header and its byte budget (SMG ignores a header
/// above either, so the replay keeps within both).
pub const ROUTING_TOKENS_IDS_MAX: usize = 512;
pub const ROUTING_TOKENS_BYTES_MAX: usize = 4096;

/// Messages in the completion channel between request tasks and the recorder: enough to absorb
/// a burst; a full channel makes request tasks wait, never drops an outcome.
pub const OUTCOME_CHANNEL_CAPACITY: usize = 65_536;

/// Points of each plotted TTFT CDF (one SVG path; more would only make the file bigger).
pub const CDF_POINTS_MAX: usize = 200;

/// Buckets of the hit-rate-over-time series; the bucket width grows with the run so that a
/// one-hour replay does not keep a point per second.
pub const HIT_RATE_BUCKETS_MAX: usize = 240;

/// Highest latency recorded in the histograms, in microseconds (one hour); above it a value is
/// clamped, so a stuck request cannot make the histogram reject samples.
pub const LATENCY_US_MAX: u64 = 3_600_000_000;

/// Engines one `compare` fleet may have (each is a port and a simulated GPU).
pub const FLEET_ENGINES_MAX: u16 = 256;

/// Policies one `compare` run may replay through (each is a fresh fleet and gateway).
pub const COMPARE_POLICIES_MAX: usize = 16;

const _: () = assert!(ROUTING_TOKENS_IDS_MAX * 7 <= ROUTING_TOKENS_BYTES_MAX);
const _: () = assert!(CONCURRENCY_MAX <= IN_FLIGHT_OPEN_LOOP_MAX);
const _: () = assert!(TRACE_LINE_BYTES_MAX <= CAPTURED_LINE_BYTES_MAX);
const _: () = assert!(PROMPT_TOKENS_MAX as usize * 7 <= TOKEN_IDS_LINE_BYTES_MAX);
// The ShareGPT reader holds at most 256 MiB of conversations, whatever the file's size.
const _: () = assert!(CONVERSATIONS_ACTIVE_MAX * CONVERSATION_BYTES_MAX <= 256 * 1024 * 1024);
