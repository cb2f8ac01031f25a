//! Every named maximum of the gateway (queues, buffers, pools, headers), each with the reason for
//! its value, and compile-time checks of how they relate.
//!
//! Flag-controlled bounds (`--max-payload-size`, `--request-timeout-secs`, `--data-cores`,
//! `--retry-max-retries`) have their defaults and hard ceilings here too, so validation checks
//! against one source. A limit used by one module only stays in that module; every limit that
//! crosses a module boundary is here.

use std::time::Duration;

/// The most workers one gateway routes to. Worker ids, index tenant sets and the per-core
/// counter rows of the worker table are sized by it.
pub const WORKERS_MAX: usize = 1024;

/// Header slots handed to `httparse` per message. Real clients and engines send fewer than 30;
/// 64 leaves room for tracing and auth headers without letting a client make us scan thousands.
pub const HEADERS_MAX: usize = 64;

/// Bytes a request or response head (start line plus headers) may take. Matches pingora's and
/// nginx's common large-header setting; larger heads are abuse, answered 431 and closed.
pub const HEADER_BYTES_MAX: usize = 16 * 1024;

/// Initial capacity of a connection's read buffer. A small chat request (head plus ~250 B body)
/// fits in one read; the buffer grows on demand up to the request's size.
pub const READ_BUF_BYTES_INITIAL: usize = 8 * 1024;

/// Bytes asked of the kernel per upstream read while streaming a response. 16 KiB keeps SSE
/// latency low (a read returns as soon as any bytes are there) and bulk copies efficient.
pub const UPSTREAM_READ_BYTES: usize = 16 * 1024;

/// Room an event stream's read has at least. A stream woken by its next token reads with a
/// spare buffer and relays before yielding (`http::upstream::http1`), so that buffer is
/// the core's, not the stream's; a stream holding part of an event waits for the rest in a
/// ring read of this size, its buffer in the kernel's hands (one token's event is a few
/// hundred bytes, and such waits are rare and short).
pub const STREAM_READ_BYTES: usize = 2 * 1024;

/// How long a kept-alive client connection waits for its next request with its read buffer in
/// the kernel's hands; idle longer, it waits holding no buffer (`http::server`).
pub const KEEPALIVE_BUFFERED_WAIT: Duration = Duration::from_secs(1);

/// Empty I/O buffers a data core keeps for waiting streams to borrow back (`http::buffers`):
/// 256 of `UPSTREAM_READ_BYTES` is 4 MiB a core, enough for the streams that move bytes at one
/// moment; more are freed.
pub const SPARE_BUFFERS_KEPT_MAX: usize = 256;

/// A read buffer that grew past this is dropped after its request instead of kept for the next:
/// one 36 KB prompt should not pin 512 MB for the life of a keep-alive connection.
pub const READ_BUF_BYTES_RETAINED_MAX: usize = 256 * 1024;

/// Bytes of a chunk-size line (hex size plus extensions). Sizes need at most 16 hex digits; the
/// rest is room for extensions, which we skip but must bound.
pub const CHUNK_LINE_BYTES_MAX: usize = 4 * 1024;

/// Default `--max-inflight-body-bytes-per-core`: request body bytes one data core holds at once
/// (bodies being read, and forwarded from where they were read). Twice SMG's 512 MiB
/// `--max-payload-size`, so one largest body always fits beside others, yet a burst of large
/// unauthenticated bodies cannot take the machine's memory: past it a request gets 503. Raised
/// to `--max-payload-size` when that is larger and this flag is not given.
pub const INFLIGHT_BODY_BYTES_PER_CORE_DEFAULT: usize = 1024 * 1024 * 1024;

/// A request body up to this size is copied behind its head and forwarded in one write (a copy
/// this small costs less than a second syscall and packet); a larger one is written from the
/// client's read buffer where it lies, so a body is held once.
pub const FORWARD_BODY_COPY_BYTES_MAX: usize = 16 * 1024;

/// An upstream connection's buffer that grew past this (a large response head, a long request
/// head) is dropped when the connection goes back to the pool: an idle pooled connection keeps
/// only what a typical request needs.
pub const UPSTREAM_BUF_BYTES_RETAINED_MAX: usize = 64 * 1024;

/// Bytes of chunked trailers we skip before giving up on a message.
pub const CHUNK_TRAILER_BYTES_MAX: usize = 16 * 1024;

/// Default `--max-payload-size`: SMG's 512 MiB, large enough for multi-modal requests.
pub const PAYLOAD_BYTES_DEFAULT: usize = 512 * 1024 * 1024;

/// Ceiling on `--max-payload-size`: bodies are buffered in memory (routing reads them), so a
/// single request must stay far below the machine's memory.
pub const PAYLOAD_BYTES_MAX: usize = 4 * 1024 * 1024 * 1024;

/// Default `--request-timeout-secs` (SMG's value): long generations stream for many minutes.
pub const REQUEST_TIMEOUT_SECS_DEFAULT: u64 = 1800;

/// Ceiling on `--request-timeout-secs`: one day; beyond that a request is surely stuck.
pub const REQUEST_TIMEOUT_SECS_MAX: u64 = 86_400;

/// Default `--upstream-first-byte-timeout-secs`: how long a worker may take from having the
/// request to its first response body byte (queueing plus prefill). A 128k-token prefill takes
/// seconds to a minute on current engines and a request may queue behind several: five minutes
/// is beyond any healthy wait yet ends a hung scheduler's hold on requests six times sooner
/// than `--request-timeout-secs`.
pub const UPSTREAM_FIRST_BYTE_TIMEOUT_SECS_DEFAULT: u64 = 300;

/// Default `--upstream-idle-timeout-secs`: the longest silence allowed between two response
/// body reads once the body began. A decode step takes milliseconds to a second even for a
/// huge batch, and a preempted request is resumed within seconds: a minute of silence is an
/// engine that stopped.
pub const UPSTREAM_IDLE_TIMEOUT_SECS_DEFAULT: u64 = 60;

/// How long a client has to send a complete request head once its first byte arrived, and the
/// longest pause between two reads of a request body (slowloris guard). Default of the hidden
/// `--header-read-timeout-ms` (tests shorten it).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `--stream-body-stall-timeout-secs` (SMG's flag and default): the longest a request
/// body may take to arrive, from its head to its last byte, however steadily it trickles. The
/// per-read `HEADER_READ_TIMEOUT` restarts with every byte, so without this a client sending a
/// byte every few seconds would hold its connection (and a core's attention) for days.
pub const STREAM_BODY_STALL_TIMEOUT_SECS_DEFAULT: u64 = 300;

/// How long after a data core frees a grown request buffer it gives the freed pages back to
/// the system (`net::memory::return_freed_pages`): one return for a burst of large bodies, not
/// one each. The allocator would otherwise keep them until the thread allocates again, and an
/// idle core kept 1.1 GB after 1,024 clients that sent 1 MiB bodies had gone.
pub const MEMORY_RETURN_DELAY: Duration = Duration::from_millis(100);

/// How long a keep-alive client connection may sit idle between requests (nginx's 75 s).
/// Default of the hidden `--client-idle-timeout-ms`.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// How often a request waiting on its worker (for the response head, or between two body
/// reads) checks whether its client has gone: a client gone is then noticed within this long,
/// its upstream request closed and its in-flight credit released (instead of the engine
/// generating for nobody until `--request-timeout-secs`). One non-blocking `poll` per waiting
/// request per tick: 1,000 waiting requests cost 4,000 syscalls a second on their core.
pub const CLIENT_GONE_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How long one write to a client may stall: a client that reads nothing for a minute is gone,
/// and its upstream request should be closed rather than hold an engine slot.
pub const DOWNSTREAM_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long connecting to an upstream worker may take before it counts as refused.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle upstream connections kept per worker per data core. One per concurrent request is all a
/// core can use; 256 matches nginx's `keepalive 256` in the reference benchmark.
pub const UPSTREAM_IDLE_PER_WORKER_MAX: usize = 256;

/// How long a pooled upstream connection may sit idle before we stop trusting it, by default
/// (`--upstream-pool-idle-timeout-secs`, SMG's default 3 s). SGLang and vLLM serve HTTP with
/// uvicorn, whose keep-alive timeout defaults to 5 s: closing ours earlier means we almost never
/// write a request into a socket the engine is closing.
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(3);

/// The most retries `--retry-max-retries` accepts (SMG's default is 5): beyond this a request
/// would outlive any sensible client timeout at the default backoff. The list of workers a
/// request tried holds `RETRIES_MAX + 1` entries, one per attempt.
pub const RETRIES_MAX: usize = 32;

/// Extra attempts a request may make because a pooled upstream connection turned out to be
/// closed before any response byte (the worker is fine; the socket was stale). Counted apart
/// from `--retry-max-retries`: after an engine restart every pooled connection to it fails once.
pub const STALE_CONNECTION_RETRIES_MAX: usize = 3;

/// Data cores one gateway runs. Per-core counter arrays are sized by it.
pub const DATA_CORES_MAX: usize = 256;

/// How long start-up waits for a port in use to be let go before it refuses to start: a stopped
/// kvgate's listener can outlive its exit by tens of milliseconds (measured 10-42 ms), so a
/// restart right after a stop would otherwise fail; a live holder keeps it longer and is refused.
pub const PORT_RELEASE_WAIT: Duration = Duration::from_secs(1);

/// How often start-up tries a port in use again while waiting for it (`PORT_RELEASE_WAIT`).
pub const PORT_RELEASE_POLL: Duration = Duration::from_millis(20);

/// Dispatch records queued from one data core to the control core. At 100k req/s per core and a
/// 10 ms control turn one turn produces 1,000 records; 16k absorbs a stalled turn of ~160 ms.
pub const DISPATCH_QUEUE_CAPACITY: usize = 16 * 1024;

/// How often the control core drains the dispatch queues.
pub const CONTROL_TURN: Duration = Duration::from_millis(10);

/// A model's tree may grow to this multiple of `--max-tree-size` between eviction cycles before
/// the control core evicts at once. SMG evicts only every `--eviction-interval` (120 s); at
/// 2,000 req/s of 70 KB Mooncake prompts that lets a string tree take ~15 GB between two cycles.
/// Twice the budget keeps memory bounded while leaving the timer in charge at ordinary rates.
pub const TREE_OVER_BUDGET_FACTOR: u64 = 2;

/// How often the control core asks each worker for its `/v1/models` list (the model catalog and
/// the gateway's own `/v1/models` answer follow it).
pub const MODELS_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// Bytes of a worker's `/v1/models` answer or health answer we read: both are small JSON
/// documents; a larger one is not an engine's.
pub const PROBE_BODY_BYTES_MAX: usize = 1024 * 1024;

/// Bytes of a worker's load report we read (`/v1/loads` JSON, or a Prometheus `/metrics` page:
/// a busy vLLM server's, histograms included, is a few hundred KiB; anything beyond this is not
/// a load report).
pub const LOAD_BODY_BYTES_MAX: usize = 4 << 20;

/// How long one load poll may take (`/v1/loads` or `/metrics`): SMG's 5 s, not a flag there.
pub const LOAD_POLL_TIMEOUT: Duration = Duration::from_secs(5);

/// The most models one worker may list in `/v1/models`: engines serve one model plus a few LoRA
/// adapters; a bound keeps a malformed answer from growing the model catalog without limit.
pub const MODELS_PER_WORKER_MAX: usize = 256;

/// Most EOS token IDs kept of a model (a gRPC worker's `GetModelInfo`): models have one to a
/// handful.
pub const EOS_TOKEN_IDS_MAX: usize = 64;

/// The longest model id kept (Hugging Face ids are well under this).
pub const MODEL_ID_BYTES_MAX: usize = 512;

/// Attempt outcomes one data core may queue for the circuit breakers between two control-core
/// turns. A turn is 10 ms; at 100k attempts/s per core that is 1,000 records, so 16k leaves a
/// wide margin (a full queue drops the outcome and counts it: a breaker reacts a little later).
pub const ATTEMPT_QUEUE_CAPACITY: usize = 16 << 10;

/// Admin calls queued for the control core at once: admin calls are rare and human-paced; more
/// in flight is abuse, answered 503.
pub const ADMIN_QUEUE_CAPACITY: usize = 64;

/// The largest admin request body read: `{"url": ...}` is tiny; anything bigger is abuse (413).
pub const ADMIN_BODY_BYTES_MAX: usize = 16 << 10;

/// How long a data core waits for the control core's answer to an admin call. `POST /workers`
/// probes the new worker (health and models, each bounded by `--health-check-timeout-secs`, at
/// most 5 s by default); this leaves room for both plus a slow turn.
pub const ADMIN_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// What a `POST /workers` keeps of `ADMIN_REPLY_TIMEOUT` after its last startup probe
/// (`--worker-startup-*`) to register the worker and answer before the caller stops waiting.
pub const ADMIN_REPLY_MARGIN: Duration = Duration::from_secs(1);

/// How often a data core looks for the control core's answer to an admin call.
pub const ADMIN_REPLY_POLL: Duration = Duration::from_millis(2);

/// How long a removed worker may drain its in-flight requests before it is purged anyway. A
/// long generation can outlive any drain (SMG's default request timeout is 1800 s), and an
/// operator removing a worker wants it gone well before that.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The most tenants an index lookup returns: the spec's "up to eight tenants of the deepest
/// matched node". Candidate groups of the decision flow are fixed arrays of this size.
pub const MATCH_TENANTS_MAX: usize = 8;

/// The most `--cache-boundaries` positions: a request has one head per boundary, looked up and
/// recorded per request; engines that reuse at fixed positions use a handful (SMG's example: 3).
pub const CACHE_BOUNDARIES_MAX: usize = 16;

/// Holders one head of the hash index keeps by default (the spec's "at most three holders"; a
/// fourth evicts the stalest): `--cache-holders-max`'s default.
pub const PLACEMENT_HOLDERS_DEFAULT: usize = 3;

/// The most holders `--cache-holders-max` lets a head keep: a slot is then one cache line (its
/// key and seven holder words).
pub const PLACEMENT_HOLDERS_MAX: usize = 7;

/// Live heads the hash index holds (it is sized for them at start, 91 bytes per head, its pages
/// committed as they are used). With the default TTL of 180 s and three boundaries that is about
/// 1,900 new prefixes per second; beyond it new heads wait for the sweep and are counted.
pub const PLACEMENT_HEADS_MAX: usize = 1 << 20;

/// Slots a probe of the hash or KV-event index's table looks at before it gives up (a miss for a
/// reader, a refused entry for the writer). Linear probing's longest run grows with the log of
/// the entries and steeply with the load: at 2/3 full a table of 150,000 entries had runs past
/// 64 (the KV-event benchmark lost 72 stores of 1M), so the bound sits well above what a
/// well-mixed table reaches and only a degenerate one pays it (a miss then reads 8 KiB).
pub const PLACEMENT_PROBE_MAX: usize = 512;

/// Workers that may publish KV events to one gateway: the KV-event index keeps a block's holders
/// as one 64-bit word, so a lookup intersects holder sets with one `and` per block.
pub const KV_EVENT_WORKERS_MAX: usize = 64;

/// The most `--kv-indexer-max-entries`: distinct blocks the KV-event index may hold (its table
/// is sized at start, 24 bytes per block, pages committed as first written). 16M blocks of 16
/// tokens are 256M tokens of engine cache, a fleet of 64 engines with 4M tokens each.
pub const KV_BLOCKS_MAX: usize = 1 << 24;

/// `--kv-indexer-max-entries` by default: 2M blocks (a 50 MB table), 32M tokens of engine cache
/// at 16 per block. Stores beyond are refused and counted.
pub const KV_BLOCKS_DEFAULT: usize = 1 << 21;

/// Distinct blocks the KV-event index's in-flight overlay holds for requests not yet confirmed
/// by their engines (its table is sized at start, 16 bytes per slot, pages committed as first
/// written): 256k blocks of 16 tokens are 4M prompt tokens in flight, the prefills of a large
/// fleet's whole batch. Claims beyond are refused (that request is predicted a miss until its
/// engine reports it).
pub const KV_INFLIGHT_BLOCKS_MAX: usize = 1 << 18;

/// Requests the in-flight overlay follows at once; beyond, a dispatch claims nothing. Far above
/// what a gateway keeps in flight (its data cores' connections), so only a flood of ends lost
/// (full queues) reaches it, and the TTL empties it.
pub const KV_INFLIGHT_FLIGHTS_MAX: usize = 1 << 16;

/// How long an answered request's claims wait for its engine's events: the engines publish a
/// prefill's blocks as it stores them, well before the answer ends, so a claim still
/// unconfirmed a second after is a prompt the engine did not keep (evicted, or its events
/// lost), and predicting it would send the next turn to a cold cache.
pub const KV_INFLIGHT_CONFIRM_GRACE: Duration = Duration::from_secs(1);

/// `--kv-inflight-ttl-secs` by default: the longest an overlay claim lives when its request's
/// end is never heard (a dropped record); a request that long has long been prefilled.
pub const KV_INFLIGHT_TTL_DEFAULT_SECS: u64 = 30;

/// Flight records (a dispatch on the KV-event index, then its end) queued from one data core to
/// the control core: two per request, so twice `DISPATCH_QUEUE_CAPACITY`'s stalled turn. A
/// record beyond is dropped and counted with the dispatch records (a dropped start claims
/// nothing, a dropped end waits for the TTL).
pub const KV_FLIGHT_QUEUE_CAPACITY: usize = 32 * 1024;

/// Items a KV-event subscriber may queue for the control core before it waits (a batch holds
/// its payload, as large as the engine made it).
pub const KV_EVENTS_FEED_CAPACITY: usize = 1024;

/// The most data-parallel ranks one worker's KV events are followed on (`?dp_size=N`): each
/// rank is a subscription of its own (a task, a socket, a guard's relay), and a vLLM engine of
/// more than 64 ranks on one host has no GPUs to run on.
pub const KV_EVENTS_DP_RANKS_MAX: u16 = 64;

/// Feed items the control core applies per turn: a burst of events never delays the worker
/// lifecycle by more than a few milliseconds.
pub const KV_EVENTS_APPLY_PER_TURN_MAX: usize = 512;

/// The most bytes a KV-event publisher (or replay socket) may announce for one message, all its
/// frames together. The ZeroMQ library reserves what a frame header announces before the bytes
/// arrive; the subscriber's guard (`kv_events::zmtp`) cuts a connection announcing more, so no
/// peer makes the gateway allocate past this. 64 MiB is about 80 times the largest batch a
/// 128k-token prefill publishes (8,000 blocks of 16 token ids, under 1 MB).
pub const KV_EVENTS_MESSAGE_BYTES_MAX: u64 = 64 << 20;

/// The bytes the KV-event guard reads from a publisher at a time (and holds per connection).
pub const KV_EVENTS_RELAY_READ_BYTES: usize = 64 << 10;

/// The furthest ahead of the number expected a KV-event batch may be and still count as batches
/// lost (a gap). Engines number batches one by one from 0; a publisher's high-water mark drops
/// at most its queue (ZeroMQ's default is 1,000 messages) and a replay buffers about 10,000, so
/// 16M batches (days of events) is no loss, but a glitched number that would hide every later
/// batch if taken as the baseline.
pub const KV_EVENTS_SEQUENCE_JUMP_MAX: u64 = 1 << 24;

/// Bytes of decode buffers the control core keeps between KV-event batches: a typical batch
/// (a few thousand blocks) fits, and what one huge batch grew is given back after it.
pub const KV_EVENTS_DECODE_BYTES_RETAINED_MAX: usize = 1 << 20;

/// How long a KV-event subscriber waits to connect to a publisher or a replay socket.
pub const KV_EVENTS_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a whole replay may take before it counts as failed.
pub const KV_EVENTS_REPLAY_TIMEOUT: Duration = Duration::from_secs(5);

/// The first and the longest wait before a failed subscription tries again (doubling between).
pub const KV_EVENTS_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// See [`KV_EVENTS_BACKOFF_MIN`].
pub const KV_EVENTS_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The most models the index keeps trees for (and data cores announce by name for gauge labels).
pub const MODELS_MAX: usize = 1 << 16;

/// Default `--tokenizer-cache-l0-max-entries` (SMG's): whole prompts kept, split evenly over the
/// data cores (each core's cache is its own).
pub const TOKENIZER_CACHE_L0_ENTRIES_DEFAULT: usize = 10_000;

/// Ceiling on `--tokenizer-cache-l0-max-entries`: at the largest entry
/// (`TOKENIZER_L0_ENTRY_TOKENS_MAX` IDs, 16 KiB) a million entries are 16 GiB.
pub const TOKENIZER_CACHE_L0_ENTRIES_MAX: usize = 1 << 20;

/// The most token IDs one L0 entry keeps (16 KiB). L0 is bounded by entries (SMG's flag), so
/// its memory is entries times this at worst: 160 MiB at the default. Longer prompts are
/// cached by segments (L1), which a byte bound governs.
pub const TOKENIZER_L0_ENTRY_TOKENS_MAX: usize = 4096;

/// Default `--tokenizer-cache-l1-max-memory` (SMG's 50 MiB), split evenly over the data cores.
pub const TOKENIZER_CACHE_L1_BYTES_DEFAULT: usize = 50 << 20;

/// Ceiling on `--tokenizer-cache-l1-max-memory`: 64 GiB, far above any machine's share for it.
pub const TOKENIZER_CACHE_L1_BYTES_MAX: usize = 64 << 30;

/// Default of the hidden `--tokenizer-inline-max-bytes`: uncached prompt bytes a data core
/// tokenizes itself. The `tokenizers` crate takes 0.4-0.55 us per byte of byte-level BPE text
/// here (`perf/results-tokenize.md`), so 1 KiB is at most about 0.6 ms of the core's time, under
/// the 1 ms a cold prompt may stall the core's other connections; longer cold work goes to the
/// pool (a typical next turn of a chat, a few hundred bytes, stays on the core).
pub const TOKENIZE_INLINE_BYTES_DEFAULT: usize = 1024;

/// Body bytes of a chat or messages request whose template a data core parses and renders
/// itself (a completions prompt: whose added-token cut and cache keys it computes itself);
/// longer ones are rendered and cut on the tokenizer pool before the core looks the pieces up
/// in its cache. Parsing and rendering cost about 4 us per message (a 400k-message chat stalled
/// its core 1.6 s), so 4 KiB, at most about 130 minimal messages, stays near the 1 ms a core
/// may spend, while a typical short chat renders without leaving the core.
pub const TOKENIZE_RENDER_INLINE_BYTES: usize = 4 << 10;

/// The longest prompt kvgate tokenizes: a chat or messages body, a completions prompt, or the
/// text a template renders. About a million tokens at four bytes a token, the longest context
/// engines serve; encoding it keeps a pool thread about a second (0.23 us per byte). A longer
/// one routes on its text (`kvgate_tokenize_over_cap_total`): no engine would read it whole.
pub const TOKENIZE_PROMPT_BYTES_MAX: usize = 4 << 20;

/// The largest tokenizer archive a gRPC worker's `GetTokenizer` may send, and the largest entry
/// read out of it. Real tokenizers are far smaller (Llama 3's tokenizer.json is 9 MB, Qwen3's
/// 11 MB; the zip is a third of that); the cap keeps a broken or hostile engine (or a zip bomb)
/// from filling the control side's memory. An archive past it is refused and logged.
pub const TOKENIZER_ARCHIVE_BYTES_MAX: usize = 64 << 20;

/// The most messages of a chat kvgate renders for tokenization (counted while the body is
/// parsed, on the pool, which stops there): conversations of thousands of turns fit, and
/// rendering this many takes a pool thread about 65 ms; a chat of more routes on its text
/// (`kvgate_tokenize_over_cap_total`).
pub const TOKENIZE_MESSAGES_MAX: usize = 16_384;

/// Bytes of a chunk of a long prompt segment (`tokenize::split`): a segment that shares its head
/// with an earlier one reuses the head's chunks and encodes at most about this much of the
/// shared part again. Smaller chunks reuse more and cost an entry (64 bytes) each; 1 KiB is
/// about 250 tokens, the page size of the engines' caches many times over.
pub const TOKENIZER_CHUNK_BYTES: usize = 1024;

/// The longest pre-token (a run of letters, of punctuation, of whitespace) kvgate's byte-level
/// BPE merges (`tokenize::bpe`): merging takes O(n log n) time and about 36 bytes per byte, so a
/// 16 MB "word" would take half a gigabyte. Longer ones are refused and the request routes on
/// its text. 256 KiB is far past any real word (an unpunctuated CJK passage of 85k characters)
/// and merges in tens of milliseconds into about 9 MiB.
pub const TOKENIZER_PRETOKEN_BYTES_MAX: usize = 256 << 10;

/// Threads of the tokenizer pool that takes cold tokenization off the data cores: shared by
/// all cores, sized to keep a burst of cold 32k-token prompts from queueing long while leaving
/// the data cores their CPUs.
pub const TOKENIZER_POOL_THREADS: usize = 2;

/// Cold tokenizations queued for the pool at once (all data cores). A cold 32k-token prompt
/// takes about 30 ms: 64 queued is about a second of the pool's work; a request arriving to a
/// full queue routes on its text instead of waiting (counted).
pub const TOKENIZER_QUEUE_CAPACITY: usize = 64;

/// How often an idle data core checks the shutdown flag.
pub const SHUTDOWN_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Default `--shutdown-grace-period-secs` (SMG's): how long shutdown lets in-flight requests
/// finish before it cuts them.
pub const SHUTDOWN_GRACE_PERIOD_SECS_DEFAULT: u64 = 180;

/// How long a data core waits, once the grace period is over, for the requests it cut to write
/// their error (an SSE event, a 503) before it exits anyway: a client reading normally takes
/// a millisecond, one that stopped reading is not waited for.
pub const SHUTDOWN_CUT_WAIT: Duration = Duration::from_secs(2);

/// io_uring submission queue entries per runtime (DESIGN.md: 1024-4096).
pub const URING_ENTRIES: u32 = 1024;

/// HTTP status codes 100..=599 are counted exactly; anything else lands in one overflow slot.
pub const STATUS_CODES_COUNTED: usize = 500;

// ---- Mesh (gateway-to-gateway sync, `mesh` and `control::mesh_link`) ----

/// Peers named on the command line: a mesh is a handful of gateways behind one balancer.
pub const MESH_PEERS_MAX: usize = 64;
/// One gossip round: deltas recorded in it go out at its end, batched per model. Short enough
/// that a peer learns a prefix before the requests that share it arrive there. (20 ms, one
/// mesh tick, was tried for shared-prefix's hit rate at 4 gateways: no better, 10% more bytes;
/// perf/results-mesh.md.)
pub const MESH_ROUND: Duration = Duration::from_millis(100);
/// Local inserts waiting for the next round (control core → mesh thread); full: dropped and
/// counted, the control core never waits. A round at 50k dispatches/s needs 5,000.
pub const MESH_OUTBOUND_QUEUE_CAPACITY: usize = 16_384;
/// Peers' inserts waiting for the control core; full: dropped and counted.
pub const MESH_INBOUND_QUEUE_CAPACITY: usize = 16_384;
/// Deltas in one round over all models; the rest of a burst is dropped (counted).
pub const MESH_ROUND_DELTAS_MAX: usize = 16_384;
/// Encoded frames queued for one peer's stream; a stream that backs up past it drops batches
/// (counted) instead of holding memory or blocking the round.
pub const MESH_PEER_QUEUE_FRAMES: usize = 64;
/// Largest frame a peer may send: a full round's batch (16k deltas of ~14 bytes) or a repair
/// page of long token paths fits; a bigger length prefix closes the stream.
pub const MESH_FRAME_BYTES_MAX: usize = 4 << 20;
/// Paths the mesh knows by hash (its own dispatches and repaired ones); the oldest go first.
pub const MESH_KNOWN_PATHS_MAX: usize = 262_144;
/// Bytes of keys those paths hold (text bytes, 8 per page hash): bounds the map's memory.
pub const MESH_KNOWN_BYTES_MAX: usize = 256 << 20;
/// Workers named per known path, most recent first (a tree node's tenants, `MATCH_TENANTS_MAX`).
pub const MESH_PATH_TENANTS_MAX: usize = 4;
/// Paths in one repair page.
pub const MESH_REPAIR_PAGE_ENTRIES: usize = 256;
/// A repair without a page for this long is retried (the spec's 5 seconds).
pub const MESH_REPAIR_STALL: Duration = Duration::from_secs(5);
/// Retries of a stalled repair before it is abandoned (the spec's three).
pub const MESH_REPAIR_RETRIES: u32 = 3;
/// Peer inserts the control core applies per turn; the rest wait in the queue.
pub const MESH_INSERTS_PER_TURN_MAX: usize = 4_096;
/// Shortest `--mesh-secret-file` key: 128 bits, beyond guessing.
pub const MESH_SECRET_BYTES_MIN: usize = 16;
/// A SWIM datagram stamped further than this from this gateway's clock is refused: the window
/// a captured datagram can be replayed in. Gateways keep their clocks within it (NTP).
pub const MESH_DATAGRAM_AGE_MAX: Duration = Duration::from_secs(10);
/// Largest SWIM datagram read (foca's LAN packets are 1,400 bytes; a UDP datagram's most).
pub const MESH_DATAGRAM_BYTES_MAX: usize = 65_536;
/// Mesh connections accepted at once: a live peer keeps one, and one more while it redials;
/// past it a connection is closed at accept (counted), so idle sockets cannot pile up.
pub const MESH_INBOUND_STREAMS_MAX: usize = 2 * MESH_PEERS_MAX;
/// A connection that has not proven the key this long after it was accepted is closed: until
/// then it holds a slot and 32 bytes, nothing more.
pub const MESH_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// A frame begun (its first byte read) must be whole within this: the largest frame at
/// 400 KB/s. A peer that trickles a partial frame is cut off, not waited on.
pub const MESH_FRAME_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection without a frame for this long is closed; writers close their own streams after
/// half of it idle (and dial again for the next frame), so a live peer never hits it.
pub const MESH_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A write to a peer's stream that does not finish in this time closes the stream: a peer
/// that stops reading holds its queue, not this gateway's memory.
pub const MESH_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of frames queued for one peer's stream (with `MESH_PEER_QUEUE_FRAMES`): past it
/// frames are dropped and counted.
pub const MESH_PEER_QUEUE_BYTES_MAX: usize = 16 << 20;
/// Distinct models peers may name when some worker serves every model (its list unknown):
/// beyond it, frames of new models are refused (counted) and nothing is kept for them.
pub const MESH_MODELS_MAX: usize = 256;
/// Repair marks kept (peer and model pairs); past it they are all forgotten and the next
/// repairs start from the first path: a bound, not a case that arises with a handful of
/// gateways and served models. A peer's marks go when it leaves.
pub const MESH_REPAIR_MARKS_MAX: usize = 4_096;
/// Token paths the mesh keeps for rebuilding peers' deltas and choosing what a delta carries
/// (`mesh::chains::PathChains`): about 100 bytes each besides their pages. Full: cleared
/// (counted: `kvgate_mesh_refused_total{reason="chains_cleared"}`), and peers' deltas that
/// build on a forgotten path fall back to a repair.
pub const MESH_CHAIN_PATHS_MAX: usize = 1 << 18;
/// Pages of those paths (8 bytes each, mostly shared with the known paths' keys; 32 MiB when
/// none is), with one anchor entry per 16 pages: full, cleared as above.
pub const MESH_CHAIN_PAGES_MAX: usize = 1 << 22;
/// Pages of one token path in a delta (its known prefix and the pages that follow): 1M tokens
/// at 16 per page, checked before anything is allocated for it.
pub const MESH_PATH_PAGES_MAX: usize = 1 << 16;
/// Pages of a text path the mesh shares (`mesh::text`, 64 bytes each: the first 1 MiB of its
/// routing text) and that a text request is looked up with in what peers shared: routing
/// needs the prefix, and past it a text's pages would cost the mesh's bytes and the data
/// core's hashing for requests no peer could match deeper. A longer text is shared cut here
/// (counted: `kvgate_mesh_refused_total{reason="text_pages_capped"}`).
pub const MESH_TEXT_PAGES_MAX: usize = 16_384;
/// Frames from all inbound streams waiting for the mesh loop; a full queue pauses the readers
/// (TCP pushes back, and the sending peer's own queue drops).
pub const MESH_INBOUND_FRAMES_MAX: usize = 256;

// ---- gRPC workers (`grpc`, `http::upstream::grpc`) ----

/// The largest gRPC message kvgate reads or sends: gRPC's own default receive limit. A
/// `GenerateResponse` chunk is a few token IDs; a message announced past this is the worker's
/// framing error, refused before its bytes are buffered.
pub const GRPC_MESSAGE_BYTES_MAX: usize = 4 << 20;

/// HTTP/2 connections one data core keeps to one gRPC worker. A connection carries up to the
/// worker's `SETTINGS_MAX_CONCURRENT_STREAMS` calls (grpcio's default is unbounded, SGLang's
/// servicer leaves it so); a second one opens only when the first is full, so this bounds what a
/// worker announcing a small limit costs in sockets.
pub const GRPC_CONNECTIONS_PER_WORKER_MAX: usize = 8;

/// How long a connection with calls in flight may go without a frame from the worker before
/// kvgate PINGs it. 30 s keeps well inside grpc-core's ping policing (two pings without data
/// under its 5-minute minimum are tolerated; a prefill never lasts that long between tokens).
pub const GRPC_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a PING may wait for its answer before the connection is taken for dead and closed
/// (its calls end as the worker's failure).
pub const GRPC_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 flow-control window kvgate grants per stream: a whole `GenerateResponse` of a long
/// output (output IDs, logprobs) arrives without a window update round trip.
pub const GRPC_STREAM_WINDOW_BYTES: u32 = 1 << 20;

/// The connection-level window: the per-stream window times the streams a busy connection
/// carries at once, so one slow reader does not stall its siblings.
pub const GRPC_CONNECTION_WINDOW_BYTES: u32 = 16 << 20;

/// How long a control-side call (HealthCheck, GetLoads, GetModelInfo, Abort) may take.
pub const GRPC_CONTROL_CALL_TIMEOUT: Duration = Duration::from_secs(5);

// ---- Request IDs (`request::id`) ----

/// Bytes of a request ID a client sends (`request::id`): a UUID is 36, a W3C `traceparent`
/// 55, an OpenAI-style id about 40, so 128 keeps every common one whole while each connection
/// holds the id in a fixed buffer (no allocation per request). A longer value is passed over
/// for the next `--request-id-headers` name, or a generated id.
pub const REQUEST_ID_BYTES_MAX: usize = 128;
/// Header names `--request-id-headers` may list: each is looked up in every request's head.
pub const REQUEST_ID_HEADERS_MAX: usize = 16;

// TLS (`net::tls`).

/// Default of the hidden `--tls-handshake-timeout-ms`: how long a client has to finish its TLS
/// handshake on the data port (tests shorten it). A handshake is two round trips; 10 s covers a
/// slow mobile link many times over, while a client that opens connections and never speaks
/// holds each one's task (5 KiB) and rustls state (about 1 KiB) no longer than that. nginx's
/// `ssl_handshake_timeout` is 60 s; ours is shorter because, unlike a request head, nothing of
/// value is lost by cutting a handshake that makes no progress.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS records taken from the kernel per non-waiting read before it yields (`net::tls`): a peer
/// that streams records with no data in them (alerts, key updates, empty records) cannot keep a
/// data core in one task; the next read takes up where this one stopped.
pub const TLS_READS_PER_CALL_MAX: usize = 64;

/// Plaintext bytes one TLS connection may have encrypted and waiting for the kernel (rustls'
/// buffer limit): a write encrypts this much at most before it waits for the socket to drain,
/// so a slow client holds at most this much ciphertext beside the response buffer.
pub const TLS_PENDING_BYTES_MAX: usize = 64 * 1024;

// ---- Prefill/decode disaggregation (`http::upstream::pd`) ----

/// Largest answer of a prefill worker the gateway reads whole (a prefill/decode pair's prefill
/// side, and the decode side when logprobs are merged, or one line of its merged stream): the
/// answer carries one input logprob per prompt token, tens of bytes each, so a 256k-token
/// prompt's fits with room to spare.
pub const PD_ANSWER_BYTES_MAX: usize = 64 << 20;

const _: () = assert!(HEADER_BYTES_MAX <= READ_BUF_BYTES_RETAINED_MAX);
const _: () = assert!(READ_BUF_BYTES_INITIAL <= HEADER_BYTES_MAX);
const _: () = assert!(CHUNK_LINE_BYTES_MAX < HEADER_BYTES_MAX);
const _: () = assert!(PAYLOAD_BYTES_DEFAULT <= PAYLOAD_BYTES_MAX);
const _: () = assert!(PAYLOAD_BYTES_DEFAULT <= INFLIGHT_BODY_BYTES_PER_CORE_DEFAULT);
// The upstream write buffer holds a head and a copied small body; it keeps that much.
const _: () =
    assert!(HEADER_BYTES_MAX + FORWARD_BODY_COPY_BYTES_MAX <= UPSTREAM_BUF_BYTES_RETAINED_MAX);
const _: () = assert!(UPSTREAM_READ_BYTES <= UPSTREAM_BUF_BYTES_RETAINED_MAX);
const _: () = assert!(REQUEST_TIMEOUT_SECS_DEFAULT <= REQUEST_TIMEOUT_SECS_MAX);
const _: () = assert!(SHUTDOWN_GRACE_PERIOD_SECS_DEFAULT <= REQUEST_TIMEOUT_SECS_MAX);
// A cut request notices within a poll and still has time to write its error.
const _: () = assert!(CLIENT_GONE_POLL_INTERVAL.as_millis() * 4 <= SHUTDOWN_CUT_WAIT.as_millis());
const _: () = assert!(UPSTREAM_FIRST_BYTE_TIMEOUT_SECS_DEFAULT < REQUEST_TIMEOUT_SECS_DEFAULT);
const _: () =
    assert!(UPSTREAM_IDLE_TIMEOUT_SECS_DEFAULT < UPSTREAM_FIRST_BYTE_TIMEOUT_SECS_DEFAULT);
// The retry loop remembers every worker a request tried in an inline list of RETRIES_MAX + 1.
const _: () = assert!(RETRIES_MAX >= 5 && RETRIES_MAX <= 64);
const _: () = assert!(STALE_CONNECTION_RETRIES_MAX >= 1);
// Every dispatch record comes with at least one attempt outcome, queued in the same turn.
const _: () = assert!(ATTEMPT_QUEUE_CAPACITY >= DISPATCH_QUEUE_CAPACITY);
const _: () = assert!(ADMIN_BODY_BYTES_MAX <= READ_BUF_BYTES_RETAINED_MAX);
const _: () = assert!(ADMIN_REPLY_POLL.as_millis() * 100 <= ADMIN_REPLY_TIMEOUT.as_millis());
const _: () = assert!(PROBE_BODY_BYTES_MAX <= LOAD_BODY_BYTES_MAX);
const _: () = assert!(MODEL_ID_BYTES_MAX * MODELS_PER_WORKER_MAX <= PROBE_BODY_BYTES_MAX);
// A removed worker is purged well before a default request would time out.
const _: () = assert!(DRAIN_TIMEOUT.as_secs() < REQUEST_TIMEOUT_SECS_DEFAULT);
// Model lists are fetched far less often than the control core turns.
const _: () = assert!(MODELS_REFRESH_INTERVAL.as_millis() >= CONTROL_TURN.as_millis() * 100);
// A head's holder count and a request's head count are u8s; holders fit a worker id.
const _: () = assert!(PLACEMENT_HOLDERS_MAX <= u8::MAX as usize && CACHE_BOUNDARIES_MAX <= 255);
const _: () = assert!(PLACEMENT_PROBE_MAX < PLACEMENT_HEADS_MAX);
// A head's holders are candidates of the decision flow, like a tree node's tenants.
const _: () = assert!(PLACEMENT_HOLDERS_MAX <= MATCH_TENANTS_MAX);
const _: () = assert!(PLACEMENT_HOLDERS_DEFAULT <= PLACEMENT_HOLDERS_MAX);
// KV-event holders are one bit each in a u64 word.
const _: () = assert!(KV_EVENT_WORKERS_MAX == u64::BITS as usize);
const _: () = assert!(KV_EVENT_WORKERS_MAX <= WORKERS_MAX);
const _: () = assert!(KV_BLOCKS_DEFAULT <= KV_BLOCKS_MAX);
const _: () = assert!(KV_INFLIGHT_BLOCKS_MAX <= KV_BLOCKS_MAX);
const _: () = assert!(KV_INFLIGHT_CONFIRM_GRACE.as_secs() < KV_INFLIGHT_TTL_DEFAULT_SECS);
const _: () = assert!(KV_EVENTS_APPLY_PER_TURN_MAX <= KV_EVENTS_FEED_CAPACITY);
const _: () = assert!(KV_EVENTS_BACKOFF_MIN.as_millis() < KV_EVENTS_BACKOFF_MAX.as_millis());
// A lookup's tenant count is a u8.
const _: () = assert!(MATCH_TENANTS_MAX <= u8::MAX as usize);
const _: () = assert!(UPSTREAM_IDLE_TIMEOUT.as_secs() < 5);
const _: () = assert!(CONTROL_TURN.as_millis() < SHUTDOWN_POLL_INTERVAL.as_millis() * 10);
const _: () = assert!(DISPATCH_QUEUE_CAPACITY.is_power_of_two());
const _: () = assert!(WORKERS_MAX <= u16::MAX as usize);
const _: () = assert!(URING_ENTRIES >= 1024 && URING_ENTRIES <= 4096);
const _: () = assert!(TOKENIZER_CACHE_L0_ENTRIES_DEFAULT <= TOKENIZER_CACHE_L0_ENTRIES_MAX);
const _: () = assert!(TOKENIZER_CACHE_L1_BYTES_DEFAULT <= TOKENIZER_CACHE_L1_BYTES_MAX);
const _: () =
    assert!(TOKENIZER_POOL_THREADS >= 1 && TOKENIZER_QUEUE_CAPACITY >= TOKENIZER_POOL_THREADS);
// The BPE's heap packs a position of a pre-token into 32 bits; a pre-token past a chunk merges.
const _: () = assert!(
    TOKENIZER_PRETOKEN_BYTES_MAX < u32::MAX as usize
        && TOKENIZER_PRETOKEN_BYTES_MAX > TOKENIZER_CHUNK_BYTES
);
// A body the core renders itself is far under the prompt cap; a word the BPE refuses fits in it.
const _: () = assert!(
    TOKENIZE_RENDER_INLINE_BYTES < TOKENIZE_PROMPT_BYTES_MAX
        && TOKENIZER_PRETOKEN_BYTES_MAX < TOKENIZE_PROMPT_BYTES_MAX
);
// One cold chunk is tokenized on the data core.
const _: () = assert!(TOKENIZER_CHUNK_BYTES <= TOKENIZE_INLINE_BYTES_DEFAULT);
// Inline cold work fits in the read buffer a small request arrives in.
const _: () = assert!(TOKENIZE_INLINE_BYTES_DEFAULT <= READ_BUF_BYTES_INITIAL);
// L0 at its default bound stays within a few hundred MiB.
const _: () =
    assert!(TOKENIZER_CACHE_L0_ENTRIES_DEFAULT * TOKENIZER_L0_ENTRY_TOKENS_MAX * 4 <= 256 << 20);
// A repair page of the longest token paths fits a frame: 256 paths of 2,048 pages.
const _: () = assert!(MESH_REPAIR_PAGE_ENTRIES * 2048 * 8 <= MESH_FRAME_BYTES_MAX);
const _: () = assert!(MESH_PATH_TENANTS_MAX <= MATCH_TENANTS_MAX);
const _: () = assert!(MESH_INSERTS_PER_TURN_MAX <= MESH_INBOUND_QUEUE_CAPACITY);
const _: () = assert!(MESH_PEER_QUEUE_BYTES_MAX >= 2 * MESH_FRAME_BYTES_MAX);
const _: () = assert!(MESH_INBOUND_STREAMS_MAX >= MESH_PEERS_MAX);
const _: () = assert!(MESH_HANDSHAKE_TIMEOUT.as_millis() < MESH_STREAM_IDLE_TIMEOUT.as_millis());
const _: () = assert!(MESH_TEXT_PAGES_MAX <= MESH_PATH_PAGES_MAX);
const _: () = assert!(MESH_FRAME_READ_TIMEOUT.as_millis() < MESH_STREAM_IDLE_TIMEOUT.as_millis());
const _: () = assert!(GRPC_MESSAGE_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(GRPC_CONNECTION_WINDOW_BYTES >= GRPC_STREAM_WINDOW_BYTES);
const _: () = assert!(GRPC_KEEPALIVE_TIMEOUT.as_secs() < GRPC_KEEPALIVE_INTERVAL.as_secs());

// --- The gRPC front end (`frontend`, `tokenize::decode`, `tokenize::stop`) ---

/// Most choices per request (`n`): each is one engine sequence and one decoder state; SGLang
/// and vLLM accept more, but a gateway request asking for more than this is a mistake or abuse.
pub const GENERATE_N_MAX: u32 = 128;

/// Most stop strings per request: each is searched on every step of every choice.
pub const STOP_STRINGS_MAX: usize = 64;

/// Longest stop string, in bytes: text is held back up to this much while it may begin one.
pub const STOP_STRING_BYTES_MAX: usize = 1024;

/// Most alternatives per position in logprobs (OpenAI's `top_logprobs` maximum).
pub const TOP_LOGPROBS_MAX: u32 = 20;

/// The window detokenizer (decoders kvgate does not model) drops IDs before its prefix once
/// this many accumulate, so each step decodes a bounded window, not the whole sequence.
pub const DECODE_WINDOW_TOKENS_MAX: usize = 64;
const _: () = assert!(TLS_HANDSHAKE_TIMEOUT.as_millis() <= HEADER_READ_TIMEOUT.as_millis());
const _: () = assert!(TLS_PENDING_BYTES_MAX >= UPSTREAM_READ_BYTES);
// A merged answer holds at most the body cap of both sides' answers.
const _: () = assert!(PD_ANSWER_BYTES_MAX <= PAYLOAD_BYTES_MAX);
