//! The model of one GPU server: [`Engine`] = prefix cache + continuous-batching scheduler + cost
//! model, driven by a simulated clock in microseconds. No sockets, no sleeping: the async driver
//! (`sim::driver`) and unit tests both call [`Engine::begin_step`] / [`Engine::finish_step`].
//!
//! Scheduling follows SGLang's default loop: each step first admits waiting requests in arrival
//! order (FCFS, head-of-line blocking) while fewer than `max_running_requests` run, the step's
//! uncached prompt tokens stay within its budget and KV pages can be reserved for the whole
//! prompt plus `max_new_tokens`. The budget is `chunked_prefill_size` (a prompt that does not
//! fit is split: its rest continues in the next steps, first) or, with chunking off,
//! `max_prefill_tokens` (the first request always fits whole). A step with prompt tokens to
//! compute is a prefill step over them and yields the first token of each prompt it completes;
//! otherwise every running request decodes one token. At least one prompt token is always computed (an
//! engine recomputes the last token), so a fully cached prompt still costs a small prefill.
//! On completion the prompt and generated tokens stay cached (unpinned) for later requests.
//! A request that could never fit in KV memory is refused by [`Engine::submit`].
//!
//! With `record_kv_events` set, every change to the cached pages is logged as a
//! [`CacheEvent`] for the driver to publish ([`Engine::take_cache_events`]): prompt pages when their
//! prefill completes, output pages when their request finishes, evictions when an admission
//! needs room, and flushes. [`Engine::restart`] models a crash: requests and cache are lost and
//! nothing is logged.

use std::collections::VecDeque;

use super::cache::{page_keys, CacheEvent, PageRun, PrefixCache};
use super::cost::CostModel;
use super::output::OutputVocabulary;

/// Throughput, hit rate and utilization are reported over the last [`STATS_BUCKETS`] buckets
/// of [`STATS_BUCKET_US`] simulated microseconds (10 s, like a short Prometheus rate).
const STATS_BUCKET_US: u64 = 1_000_000;
const STATS_BUCKETS: usize = 10;

/// Default bound of the waiting queue: far above any test or replay's concurrency, low enough
/// that a runaway client cannot grow one engine's memory without limit.
pub const MAX_WAITING_REQUESTS_DEFAULT: usize = 65_536;

/// Identifies a request inside one engine.
pub type RequestId = u64;

/// The static shape of one engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV page (SGLang `--page-size`, vLLM `--block-size`).
    pub page_size: usize,
    /// KV memory in tokens (rounded down to whole pages).
    pub kv_capacity_tokens: u64,
    /// Requests decoding at once.
    pub max_running_requests: usize,
    /// Uncached prompt tokens one prefill step admits (beyond its first request).
    pub max_prefill_tokens: u64,
    /// Prompt tokens one prefill step computes when prompts are split across steps (SGLang's
    /// `--chunked-prefill-size`); 0 prefills every prompt whole.
    pub chunked_prefill_size: u64,
    /// Requests queued at once; more are refused (SGLang's `--max-queued-requests`).
    pub max_waiting_requests: usize,
    /// Step durations.
    pub cost: CostModel,
    /// Log cache changes for KV events ([`Engine::take_cache_events`]).
    pub record_kv_events: bool,
    /// The IDs of the generated words, which the cache keeps with the prompt.
    pub output: OutputVocabulary,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            page_size: 16,
            kv_capacity_tokens: 1 << 20,
            max_running_requests: 256,
            max_prefill_tokens: 16_384,
            chunked_prefill_size: 8192,
            max_waiting_requests: MAX_WAITING_REQUESTS_DEFAULT,
            cost: CostModel::default(),
            record_kv_events: false,
            output: OutputVocabulary::default(),
        }
    }
}

/// One request as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Cache partition (hash of cache_salt / extra_key / LoRA); 0 when unset.
    pub namespace: u64,
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Tokens to generate (at least 1 is generated).
    pub max_new_tokens: u32,
    /// Seed of the deterministic output tokens (`sim::output`).
    pub output_seed: u64,
    /// The prompt's KV cache came from a prefill engine (a decode engine's request): its pages
    /// are reserved at admission but nothing of it is computed.
    pub prefilled: bool,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// Prompt plus output exceed the whole KV memory.
    TooLong {
        needed_tokens: u64,
        capacity_tokens: u64,
    },
    /// The waiting queue is full.
    QueueFull { max_waiting_requests: usize },
}

/// One token produced for one request at the end of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emit {
    pub id: RequestId,
    /// Tokens generated so far, this one included (1 for the first token).
    pub completion_tokens: u32,
    pub prompt_tokens: u32,
    /// Whole cached pages found at admission, in tokens.
    pub cached_tokens: u32,
    pub finished: bool,
    /// Simulated time of the emission.
    pub at_us: u64,
}

/// SGLang's per-engine load report (`GET /v1/loads`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSnapshot {
    pub num_running_reqs: u64,
    pub num_waiting_reqs: u64,
    pub num_waiting_uncached_tokens: u64,
    pub num_used_tokens: u64,
    pub max_total_num_tokens: u64,
    pub max_running_requests: u64,
    pub token_usage: f64,
    /// Generated tokens per simulated second over the last window.
    pub gen_throughput: f64,
    /// Cached over prompt tokens of requests admitted in the last window.
    pub cache_hit_rate: f64,
    /// Fraction of the last window spent computing.
    pub utilization: f64,
}

/// Counters since the start (Prometheus).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineTotals {
    /// Requests accepted into the waiting queue: the sum of the finished, the cancelled (from
    /// the queue or from the batch) and the ones still waiting or running.
    pub requests_queued: u64,
    pub requests_admitted: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub generation_tokens: u64,
    pub evicted_pages: u64,
}

#[derive(Debug)]
struct Waiting {
    id: RequestId,
    /// Simulated arrival: never admitted before it.
    arrival_us: u64,
    request: SimRequest,
    keys: Vec<u64>,
    uncached_estimate: u64,
}

#[derive(Debug)]
struct Running {
    id: RequestId,
    request: SimRequest,
    /// Keys of the full prompt pages.
    keys: Vec<u64>,
    matched_pages: usize,
    /// Pages reserved privately at admission and not yet committed to the cache.
    private_pages: u64,
    /// Keys this request holds a reference on.
    pinned_pages: usize,
    /// Uncached prompt tokens not computed yet (chunked prefill).
    prefill_remaining: u64,
    generated: u32,
}

#[derive(Debug)]
enum StepKind {
    /// Requests and the prompt tokens each computes in this step.
    Prefill(Vec<(RequestId, u64)>),
    Decode,
}

#[derive(Debug)]
struct Step {
    kind: StepKind,
    ends_at_us: u64,
}

/// Work done during one stats bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    index: u64,
    generated_tokens: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    busy_us: u64,
}

/// The last [`STATS_BUCKETS`] buckets, indexed by `bucket index % STATS_BUCKETS`.
#[derive(Debug, Default)]
struct StatsRing {
    buckets: [Bucket; STATS_BUCKETS],
}

impl StatsRing {
    fn at(&mut self, now_us: u64) -> &mut Bucket {
        let index = now_us / STATS_BUCKET_US;
        let slot = &mut self.buckets[(index % STATS_BUCKETS as u64) as usize];
        if slot.index != index {
            *slot = Bucket {
                index,
                ..Bucket::default()
            };
        }
        slot
    }

    /// The sum of the buckets of the last window ending at `now_us`, and the window's span.
    fn recent(&self, now_us: u64) -> (Bucket, u64) {
        let current = now_us / STATS_BUCKET_US;
        let oldest = current.saturating_sub(STATS_BUCKETS as u64 - 1);
        let mut sum = Bucket::default();
        for bucket in self
            .buckets
            .iter()
            .filter(|b| (oldest..=current).contains(&b.index))
        {
            sum.generated_tokens += bucket.generated_tokens;
            sum.prompt_tokens += bucket.prompt_tokens;
            sum.cached_tokens += bucket.cached_tokens;
            sum.busy_us += bucket.busy_us;
        }
        (sum, now_us - oldest * STATS_BUCKET_US)
    }
}

/// One simulated engine.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    cache: PrefixCache,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    step: Option<Step>,
    /// The request whose prompt is being prefilled across steps, if any.
    chunked: Option<RequestId>,
    now_us: u64,
    next_id: RequestId,
    totals: EngineTotals,
    stats: StatsRing,
}

impl Engine {
    /// An idle engine with an empty cache at simulated time 0.
    pub fn new(config: EngineConfig) -> Self {
        let page_size = config.page_size.max(1);
        let config = EngineConfig {
            page_size,
            ..config
        };
        Engine {
            cache: Self::empty_cache(&config),
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: None,
            chunked: None,
            now_us: 0,
            next_id: 1,
            totals: EngineTotals::default(),
            stats: StatsRing::default(),
        }
    }

    /// The engine's shape.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Current simulated time.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Whether nothing is waiting, running or in a step.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.step.is_none()
    }

    /// Queues a request; it is admitted at the start of a later step.
    pub fn submit(&mut self, request: SimRequest) -> Result<RequestId, SubmitError> {
        self.submit_at(request, self.now_us)
    }

    /// Queues a request that arrives at simulated `arrival_us` (the driver's real-time clock,
    /// which may run ahead of the engine's clock while it catches up on steps).
    pub fn submit_at(
        &mut self,
        request: SimRequest,
        arrival_us: u64,
    ) -> Result<RequestId, SubmitError> {
        if self.waiting.len() >= self.config.max_waiting_requests {
            return Err(SubmitError::QueueFull {
                max_waiting_requests: self.config.max_waiting_requests,
            });
        }
        let page_size = self.config.page_size as u64;
        let needed_tokens = request.tokens.len() as u64 + u64::from(request.max_new_tokens.max(1));
        let capacity_tokens = self.cache.capacity_pages() * page_size;
        if needed_tokens.div_ceil(page_size) > self.cache.capacity_pages() {
            return Err(SubmitError::TooLong {
                needed_tokens,
                capacity_tokens,
            });
        }
        let keys = page_keys(request.namespace, &request.tokens, self.config.page_size);
        let cached = self.cacheable_pages(&keys, request.tokens.len()) as u64 * page_size;
        let uncached_estimate =
            request.tokens.len() as u64 - cached.min(request.tokens.len() as u64);
        let id = self.next_id;
        self.next_id += 1;
        self.totals.requests_queued += 1;
        self.waiting.push_back(Waiting {
            arrival_us,
            id,
            request,
            keys,
            uncached_estimate,
        });
        Ok(id)
    }

    /// Drops a request wherever it is (client gone); `false` if unknown or finished.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        if let Some(position) = self.waiting.iter().position(|waiting| waiting.id == id) {
            self.waiting.remove(position);
            self.totals.requests_cancelled += 1;
            return true;
        }
        if let Some(position) = self.running.iter().position(|running| running.id == id) {
            let running = self.running.swap_remove(position);
            self.release(running, Completion::Cancelled);
            self.totals.requests_cancelled += 1;
            return true;
        }
        false
    }

    /// Starts the next step at `now_us` (or later, if the engine's clock is ahead) and returns
    /// when it ends; returns the current step's end if one is in progress, `None` when idle.
    pub fn begin_step(&mut self, now_us: u64) -> Option<u64> {
        if let Some(step) = &self.step {
            return Some(step.ends_at_us);
        }
        self.now_us = self.now_us.max(now_us);
        if self.running.is_empty() {
            // Idle until the next arrival, if it lies ahead of the clock.
            if let Some(front) = self.waiting.front() {
                self.now_us = self.now_us.max(front.arrival_us);
            }
        }
        let batch = self.plan_prefill();
        let (kind, duration_us) = if !batch.is_empty() {
            let tokens = batch.iter().map(|(_, tokens)| tokens).sum();
            (
                StepKind::Prefill(batch),
                self.config.cost.prefill_us(tokens),
            )
        } else if !self.running.is_empty() {
            (
                StepKind::Decode,
                self.config.cost.decode_us_holding(self.used_tokens()),
            )
        } else {
            return None;
        };
        let ends_at_us = self.now_us + duration_us;
        self.stats.at(self.now_us).busy_us += duration_us;
        self.step = Some(Step { kind, ends_at_us });
        Some(ends_at_us)
    }

    /// Completes the current step: advances the clock to its end and returns its tokens.
    pub fn finish_step(&mut self) -> Vec<Emit> {
        let Some(step) = self.step.take() else {
            return Vec::new();
        };
        self.now_us = self.now_us.max(step.ends_at_us);
        let mut emits = Vec::new();
        match step.kind {
            StepKind::Prefill(batch) => {
                for (id, tokens) in batch {
                    let Some(position) = self.running.iter().position(|r| r.id == id) else {
                        continue;
                    };
                    let running = &mut self.running[position];
                    running.prefill_remaining = running.prefill_remaining.saturating_sub(tokens);
                    if running.prefill_remaining == 0 {
                        if self.chunked == Some(id) {
                            self.chunked = None;
                        }
                        self.commit_prompt(position);
                        emits.push(self.generate(position));
                    }
                }
            }
            StepKind::Decode => {
                for position in 0..self.running.len() {
                    if self.running[position].prefill_remaining == 0 {
                        emits.push(self.generate(position));
                    }
                }
            }
        }
        self.stats.at(self.now_us).generated_tokens += emits.len() as u64;
        self.totals.generation_tokens += emits.len() as u64;
        self.retire_finished();
        emits
    }

    /// Test and replay helper: runs steps until idle or `max_steps`, returning every emission.
    pub fn run_until_idle(&mut self, max_steps: usize) -> Vec<Emit> {
        let mut emits = Vec::new();
        for _ in 0..max_steps {
            if self.begin_step(self.now_us).is_none() {
                break;
            }
            emits.extend(self.finish_step());
        }
        emits
    }

    /// The SGLang load report at the engine's current time.
    pub fn loads(&self, now_us: u64) -> LoadSnapshot {
        let (window, span_us) = self.stats.recent(self.now_us.max(now_us));
        let span_s = span_us as f64 / 1e6;
        let used = self.used_tokens();
        let max_total = self.cache.capacity_pages() * self.config.page_size as u64;
        LoadSnapshot {
            num_running_reqs: self.running.len() as u64,
            num_waiting_reqs: self.waiting.len() as u64,
            num_waiting_uncached_tokens: self.waiting.iter().map(|w| w.uncached_estimate).sum(),
            num_used_tokens: used,
            max_total_num_tokens: max_total,
            max_running_requests: self.config.max_running_requests as u64,
            token_usage: ratio(used as f64, max_total as f64),
            gen_throughput: ratio(window.generated_tokens as f64, span_s),
            cache_hit_rate: ratio(window.cached_tokens as f64, window.prompt_tokens as f64),
            utilization: ratio(window.busy_us as f64, span_us as f64).min(1.0),
        }
    }

    /// Counters since the start.
    pub fn totals(&self) -> EngineTotals {
        EngineTotals {
            evicted_pages: self.totals.evicted_pages + self.cache.evicted_pages_total(),
            ..self.totals
        }
    }

    /// Drops every unreferenced cached page.
    pub fn flush_cache(&mut self) {
        self.cache.flush();
    }

    /// A crash and restart: every waiting and running request is dropped (counted as cancelled)
    /// and the cache starts empty. Nothing is logged (a crashed engine reports nothing); the
    /// clock and the counters go on.
    pub fn restart(&mut self) {
        self.totals.requests_cancelled += (self.waiting.len() + self.running.len()) as u64;
        self.totals.evicted_pages += self.cache.evicted_pages_total();
        self.waiting.clear();
        self.running.clear();
        self.step = None;
        self.chunked = None;
        self.cache = Self::empty_cache(&self.config);
    }

    /// The cache changes logged since the last call, oldest first (empty unless
    /// `record_kv_events`).
    pub fn take_cache_events(&mut self) -> Vec<CacheEvent> {
        self.cache.take_events()
    }

    /// Every cached page's key, ascending.
    pub fn cached_keys(&self) -> Vec<u64> {
        self.cache.cached_keys()
    }

    fn empty_cache(config: &EngineConfig) -> PrefixCache {
        let mut cache = PrefixCache::new(config.kv_capacity_tokens / config.page_size as u64);
        if config.record_kv_events {
            cache.record_events();
        }
        cache
    }

    /// Whole pages of `keys` a new request would find cached, keeping at least one token to
    /// compute.
    fn cacheable_pages(&self, keys: &[u64], prompt_len: usize) -> usize {
        let max_pages = prompt_len.saturating_sub(1) / self.config.page_size;
        self.cache.matched_pages(keys).min(max_pages)
    }

    /// The next prefill step: the rest (or next chunk) of a chunked prompt, then newly admitted
    /// requests while the step's token budget lasts. Empty when there is nothing to prefill.
    fn plan_prefill(&mut self) -> Vec<(RequestId, u64)> {
        let chunk_tokens = self.config.chunked_prefill_size;
        let mut budget = if chunk_tokens > 0 {
            chunk_tokens.min(self.config.max_prefill_tokens.max(1))
        } else {
            self.config.max_prefill_tokens
        };
        let mut batch = Vec::new();
        if let Some(id) = self.chunked {
            match self.running.iter().find(|running| running.id == id) {
                Some(running) => {
                    let tokens = running.prefill_remaining.min(budget);
                    budget -= tokens;
                    batch.push((id, tokens));
                    if tokens < running.prefill_remaining {
                        return batch;
                    }
                }
                None => self.chunked = None,
            }
        }
        self.admit(&mut batch, budget);
        batch
    }

    /// Moves waiting requests to running (see the module header), adding each with the prompt
    /// tokens it computes in this step to `batch`.
    fn admit(&mut self, batch: &mut Vec<(RequestId, u64)>, mut budget: u64) {
        let page_size = self.config.page_size;
        let chunking = self.config.chunked_prefill_size > 0;
        while self.running.len() < self.config.max_running_requests {
            let Some(front) = self.waiting.front() else {
                break;
            };
            if front.arrival_us > self.now_us {
                break;
            }
            let prompt_len = front.request.tokens.len();
            let matched_pages = self.cacheable_pages(&front.keys, prompt_len);
            let uncached = match front.request.prefilled {
                true => 0,
                false => (prompt_len - matched_pages * page_size) as u64,
            };
            let fits = uncached <= budget;
            if !batch.is_empty() && (budget == 0 || (!chunking && !fits)) {
                break;
            }
            let total_tokens = prompt_len as u64 + u64::from(front.request.max_new_tokens.max(1));
            let private_pages = total_tokens.div_ceil(page_size as u64) - matched_pages as u64;
            self.cache.pin(&front.keys, matched_pages);
            if !self.cache.reserve(private_pages) {
                self.cache.unpin(&front.keys[..matched_pages]);
                break;
            }
            let Some(waiting) = self.waiting.pop_front() else {
                break;
            };
            let cached_tokens = (matched_pages * page_size) as u64;
            self.totals.requests_admitted += 1;
            self.totals.prompt_tokens += prompt_len as u64;
            self.totals.cached_tokens += cached_tokens;
            let bucket = self.stats.at(self.now_us);
            bucket.prompt_tokens += prompt_len as u64;
            bucket.cached_tokens += cached_tokens;
            let tokens = if chunking {
                uncached.min(budget)
            } else {
                uncached
            };
            budget = budget.saturating_sub(tokens);
            batch.push((waiting.id, tokens));
            let split = tokens < uncached;
            if split {
                self.chunked = Some(waiting.id);
            }
            self.running.push(Running {
                id: waiting.id,
                request: waiting.request,
                keys: waiting.keys,
                matched_pages,
                private_pages,
                pinned_pages: matched_pages,
                prefill_remaining: uncached,
                generated: 0,
            });
            if split {
                break;
            }
        }
    }

    /// After prefill: the prompt's newly computed full pages join the cache, pinned.
    fn commit_prompt(&mut self, position: usize) {
        let page_size = self.config.page_size;
        let running = &mut self.running[position];
        let matched = running.matched_pages;
        let new_keys = &running.keys[matched..];
        self.cache.commit(PageRun {
            keys: new_keys,
            first_depth: matched as u32,
            parent_key: matched.checked_sub(1).map(|parent| running.keys[parent]),
            tokens: &running.request.tokens[matched * page_size..running.keys.len() * page_size],
        });
        running.private_pages -= new_keys.len() as u64;
        running.pinned_pages = running.keys.len();
    }

    fn generate(&mut self, position: usize) -> Emit {
        let page_size = self.config.page_size as u64;
        let running = &mut self.running[position];
        running.generated += 1;
        let cached_tokens = running.matched_pages as u64 * page_size;
        Emit {
            id: running.id,
            completion_tokens: running.generated,
            prompt_tokens: running.request.tokens.len() as u32,
            cached_tokens: cached_tokens as u32,
            finished: running.generated >= running.request.max_new_tokens.max(1),
            at_us: self.now_us,
        }
    }

    fn retire_finished(&mut self) {
        let mut position = 0;
        while position < self.running.len() {
            let running = &self.running[position];
            if running.generated >= running.request.max_new_tokens.max(1) {
                let running = self.running.swap_remove(position);
                self.totals.requests_finished += 1;
                self.release(running, Completion::Finished);
            } else {
                position += 1;
            }
        }
    }

    /// Returns a request's pages: on completion its generated full pages are cached first.
    fn release(&mut self, running: Running, completion: Completion) {
        let mut pinned: Vec<u64> = running.keys[..running.pinned_pages].to_vec();
        let mut private_pages = running.private_pages;
        if completion == Completion::Finished && running.pinned_pages == running.keys.len() {
            let (output_keys, tail) = self.output_pages(&running);
            let committed = (output_keys.len() as u64).min(private_pages) as usize;
            self.cache.commit(PageRun {
                keys: &output_keys[..committed],
                first_depth: running.keys.len() as u32,
                parent_key: running.keys.last().copied(),
                tokens: &tail[..committed * self.config.page_size],
            });
            private_pages -= committed as u64;
            pinned.extend_from_slice(&output_keys[..committed]);
        }
        self.cache.unpin(&pinned);
        self.cache.unreserve(private_pages);
    }

    /// Keys of the full pages of prompt + generated tokens beyond the prompt's full pages, and
    /// those tokens (the prompt's tail, then the generated ones).
    fn output_pages(&self, running: &Running) -> (Vec<u64>, Vec<u32>) {
        let page_size = self.config.page_size;
        let prompt = &running.request.tokens;
        let tail_start = running.keys.len() * page_size;
        let mut tail: Vec<u32> = prompt[tail_start..].to_vec();
        let output = &self.config.output;
        tail.extend((0..running.generated).map(|k| output.token(running.request.output_seed, k)));
        let chain_seed = running
            .keys
            .last()
            .copied()
            .unwrap_or(running.request.namespace);
        (page_keys(chain_seed, &tail, page_size), tail)
    }

    fn used_tokens(&self) -> u64 {
        let page_size = self.config.page_size as u64;
        let private: u64 = self
            .running
            .iter()
            .map(|r| {
                let total = r.request.tokens.len() as u64 + u64::from(r.generated);
                total.saturating_sub(r.pinned_pages as u64 * page_size)
            })
            .sum();
        self.cache.pinned_pages() * page_size + private
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Completion {
    Finished,
    Cancelled,
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
