//! The fleet baseline of a decision ([`Fleet`]: eligible workers, mean in-flight, KV usage spread),
//! the expected-wait scorer (also `--policy least_load`) and the spill gate ([`SpillGate`]).
//!
//! Expected wait, in seconds: queued prefill tokens divided by the fleet's throughput, plus a
//! penalty that grows as the KV cache fills. Queued: the worker's reported backlog, less the
//! requests of it whose first token came back since the report, plus the prompts every data core
//! sent it since the report with no first token back yet (the report is up to
//! `--load-monitor-interval` old). KV: the reported usage plus the prompts sent since that are
//! still running. A worker without a report is scored with the reporting workers' mean KV usage
//! and no queue; when no eligible worker reports load, the score is the in-flight request count.
//! Equal scores go to fewer requests in flight, then uniformly at random (reservoir sampling),
//! never by slot order. A cache miss may go a little later to a worker given less new prefix
//! ([`Fleet::lowest_wait_for_new_prefix`]), since the requests sharing its prefix will follow it.

use fastrand::Rng;

use super::{CacheAwareConfig, WorkerLoad, WorkerStatus};

/// Throughput assumed for a worker that reports 0 (idle) when no eligible worker reports a
/// positive one: one engine's decode rate, order of magnitude. Only ratios between workers
/// matter, so its value changes how much the KV penalty weighs against queued work, not the order
/// of two workers with the same usage.
pub const THROUGHPUT_FALLBACK_TOKENS_PER_S: f64 = 1_000.0;
/// The KV penalty at half usage, in seconds; it grows as `u^2 / (1 - u)`, steeply near full.
pub const KV_PENALTY_SCALE_S: f64 = 1.0;
/// How much later than the least-waiting worker a cache miss may start, as a share of its own
/// prefill work, to go to the worker given the least new prefix: at most an eighth of its
/// own prefill time added to its first token, for placement that evens out the traffic its
/// prefix will draw (half was measured too: Mooncake at six times its load lost TTFT and
/// balance). Below 1, so a dispatch (credited with its whole work) leaves the window.
pub const NEW_PREFIX_WAIT_SLACK: f64 = 0.125;
/// Usage above this is scored as this, so a full cache gives a large but finite penalty.
pub const KV_USAGE_CLAMP: f64 = 0.99;
/// Prompt tokens assumed per queued request of a worker whose report counts its queue in
/// requests only (vLLM through `/metrics`): SMG's `--least-load-mean-prefill-tokens` default.
pub const MEAN_PREFILL_TOKENS_DEFAULT: u64 = 1024;

/// The scorer's knobs. cache_aware and power_of_two run it [`ScorerConfig::BUILT_IN`]; the
/// `--least-load-*` flags configure it for `--policy least_load` only (the spec).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScorerConfig {
    /// The KV penalty at half usage, in seconds (`--least-load-kv-pressure-weight`).
    pub kv_penalty_half_usage_s: f64,
    /// Throughput assumed when no eligible worker reports a positive one
    /// (`--least-load-default-throughput`).
    pub throughput_fallback_tps: f64,
    /// Prompt tokens per queued request when a report has no token count
    /// (`--least-load-mean-prefill-tokens`; read where reports become `WorkerLoad`s).
    pub mean_prefill_tokens: u64,
    /// least_load skips workers with this many waiting requests while any has fewer
    /// (`--least-load-max-waiting-requests`; `None`: 0, off).
    pub max_waiting_requests: Option<u32>,
}

impl ScorerConfig {
    /// kvgate's own constants, with SMG's mean prefill for reports without token counts.
    pub const BUILT_IN: ScorerConfig = ScorerConfig {
        kv_penalty_half_usage_s: KV_PENALTY_SCALE_S,
        throughput_fallback_tps: THROUGHPUT_FALLBACK_TOKENS_PER_S,
        mean_prefill_tokens: MEAN_PREFILL_TOKENS_DEFAULT,
        max_waiting_requests: None,
    };
}

/// Step 1's fleet view plus what the scorer needs, from one pass over the worker slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fleet {
    /// Eligible workers.
    pub eligible: u32,
    /// Mean in-flight requests over eligible workers (the spill gate's baseline).
    pub in_flight_mean: f64,
    /// Highest and lowest KV usage among eligible workers that report load.
    pub kv_usage_range: Option<(f64, f64)>,
    /// The throughput every worker's queued work is divided by: the mean of the positive
    /// reports, or [`THROUGHPUT_FALLBACK_TOKENS_PER_S`] when none is positive.
    throughput: f64,
    /// What a worker without a report is scored with: the reporting workers' mean KV usage and
    /// capacity (no queue). Neither a penalty nor a bonus: a worker whose first poll failed must
    /// not look emptier than every engine that answered, and draw every miss until it answers.
    unreported: WorkerLoad,
    /// True when at least one eligible worker reports load: score in seconds, else in requests.
    scores_reports: bool,
    /// The KV penalty at half usage, in seconds.
    kv_penalty_half_usage_s: f64,
    /// KV-cache tokens one running request holds, over the fleet's reports (its own tokens plus
    /// its share of the prefixes it shares): what one more request in a worker's batch weighs in
    /// [`Fleet::completion_cost`]. `None` when no report shows a running request.
    kv_tokens_per_request: Option<f64>,
}

impl Fleet {
    /// Scans the worker slots once, for the built-in scorer.
    pub fn scan(workers: &[WorkerStatus]) -> Fleet {
        Fleet::scan_with(workers, &ScorerConfig::BUILT_IN)
    }

    /// Scans the worker slots once, for a scorer configured by `scorer`.
    pub fn scan_with(workers: &[WorkerStatus], scorer: &ScorerConfig) -> Fleet {
        let (mut eligible, mut in_flight_sum) = (0u32, 0u64);
        let (mut throughput_sum, mut throughput_count) = (0.0f64, 0u32);
        let mut kv_usage_range: Option<(f64, f64)> = None;
        let (mut reports, mut usage_sum, mut capacity_sum) = (0u32, 0.0f64, 0u64);
        let (mut used_tokens_sum, mut running_sum) = (0.0f64, 0u64);
        for worker in workers.iter().filter(|w| w.eligible) {
            eligible += 1;
            in_flight_sum += u64::from(worker.in_flight);
            let Some(load) = worker.load else { continue };
            let usage = load.token_usage;
            reports += 1;
            usage_sum += usage;
            capacity_sum = capacity_sum.saturating_add(load.kv_capacity_tokens);
            kv_usage_range = Some(match kv_usage_range {
                None => (usage, usage),
                Some((hi, lo)) => (hi.max(usage), lo.min(usage)),
            });
            if load.gen_throughput > 0.0 {
                throughput_sum += load.gen_throughput;
                throughput_count += 1;
            }
            if load.running > 0 && load.kv_capacity_tokens > 0 {
                used_tokens_sum += usage * load.kv_capacity_tokens as f64;
                running_sum += u64::from(load.running);
            }
        }
        let throughput = if throughput_count == 0 {
            scorer.throughput_fallback_tps
        } else {
            throughput_sum / f64::from(throughput_count)
        };
        let unreported = WorkerLoad {
            token_usage: usage_sum / f64::from(reports.max(1)),
            kv_capacity_tokens: capacity_sum / u64::from(reports.max(1)),
            ..WorkerLoad::default()
        };
        Fleet {
            eligible,
            in_flight_mean: if eligible == 0 {
                0.0
            } else {
                in_flight_sum as f64 / f64::from(eligible)
            },
            kv_usage_range,
            throughput,
            unreported,
            scores_reports: kv_usage_range.is_some(),
            kv_penalty_half_usage_s: scorer.kv_penalty_half_usage_s,
            kv_tokens_per_request: (running_sum > 0 && used_tokens_sum > 0.0)
                .then(|| used_tokens_sum / running_sum as f64),
        }
    }

    /// Step 2: the hottest reporting worker is above `--overload-token-usage-threshold`, or the
    /// hottest minus the coldest is above `--balance-token-usage-threshold`. Workers without a
    /// report are not compared.
    pub fn kv_pressure(&self, config: &CacheAwareConfig) -> bool {
        let Some((hottest, coldest)) = self.kv_usage_range else {
            return false;
        };
        config
            .overload_token_usage_threshold
            .is_some_and(|t| hottest > t)
            || config
                .balance_token_usage_threshold
                .is_some_and(|t| hottest - coldest > t)
    }

    /// The expected wait of one worker: lower is better. Comparable only within one fleet scan.
    ///
    /// The divisor is the fleet's mean reported throughput, not the worker's own: an engine's
    /// `gen_throughput` rises with its batch, so dividing by its own figure makes a busy engine
    /// look faster and draws still more work to it (on the Mooncake trace that loop left one
    /// engine with 4.6 times the requests of another). A slower engine still shows: its queue
    /// drains more slowly, and the queue is in its reports.
    pub fn expected_wait(&self, worker: &WorkerStatus) -> f64 {
        if !self.scores_reports {
            return f64::from(worker.in_flight);
        }
        let load = worker.load.unwrap_or(self.unreported);
        let work_tokens = queued_prefill_tokens(worker, &load);
        // The report's KV usage plus what was sent since: a stale report must not keep
        // drawing every request to the engine that was emptiest when it was taken.
        let usage_since_report = if load.kv_capacity_tokens > 0 {
            worker.resident_tokens as f64 / load.kv_capacity_tokens as f64
        } else {
            0.0
        };
        let usage = load.token_usage + usage_since_report;
        work_tokens / self.throughput + self.kv_penalty_half_usage_s * kv_penalty_shape(usage)
    }

    /// KV-cache tokens one running request holds, over the fleet's load reports; `None` when
    /// no report shows a running request.
    pub fn kv_tokens_per_request(&self) -> Option<f64> {
        self.kv_tokens_per_request
    }

    /// `--load-aware-affinity`'s cost of running a request on `worker` when `uncached_tokens`
    /// of its prompt are not in that worker's cache: what the request adds to the fleet's work,
    /// in prompt tokens of prefill. The sum of:
    /// - the prefill queued ahead of it and its own (`uncached_tokens`);
    /// - its own decode, slowed by the batch it joins: the batch's KV tokens, each request in
    ///   flight on the worker holding `kv_tokens_per_request`
    ///   ([`Fleet::kv_tokens_per_request`]);
    /// - its own new KV (`uncached_tokens`), read by its own decode steps and by half the
    ///   remaining steps of every request already in flight there.
    ///
    /// A decode step's time grows with the KV tokens its batch holds; the decode terms count KV
    /// tokens read over `decode_weight` times a few hundred steps (`cache_aware`'s
    /// `DECODE_STEPS_PER_PREFILL_TOKEN`), over which one KV token costs about one prefill token.
    /// So a holder, which adds little KV, keeps a prefix until its batch is far larger than a
    /// non-holder's, which would pin the whole prompt under every request it runs; the non-holder
    /// that takes a replica is the one with the smallest batch; and a short answer, which reads
    /// the batch for few steps, seldom pays a prefill to avoid it. Batches count the gateway's
    /// own in-flight requests, current where a load report is up to `--load-monitor-interval`
    /// old.
    pub fn completion_cost(
        &self,
        worker: &WorkerStatus,
        uncached_tokens: u64,
        kv_tokens_per_request: f64,
        decode_weight: f64,
    ) -> f64 {
        let queued = worker.load.map_or(worker.credited_tokens as f64, |load| {
            queued_prefill_tokens(worker, &load)
        });
        let batch = f64::from(worker.in_flight);
        let uncached = uncached_tokens as f64;
        let decode = batch * kv_tokens_per_request + uncached * (1.0 + batch / 2.0);
        queued + uncached + decode_weight * decode
    }

    /// [`Fleet::completion_cost`] for a worker that holds none of the request's prompt, plus the
    /// prompt again under the batch it joins: a replica also takes cache room from the prefixes
    /// the worker holds (a second copy of a prompt the fleet already caches), and its request
    /// waits a whole prefill for its first token. On the hot-spot workload
    /// (`scripts/bench-load-aware.sh`) leaving it out made twice the replicas for the same
    /// end-to-end p99.
    pub fn replica_cost(
        &self,
        worker: &WorkerStatus,
        request_tokens: u64,
        kv_tokens_per_request: f64,
        decode_weight: f64,
    ) -> f64 {
        let cost =
            self.completion_cost(worker, request_tokens, kv_tokens_per_request, decode_weight);
        cost + request_tokens as f64 * (1.0 + f64::from(worker.in_flight) / 2.0)
    }

    /// The eligible worker slot among `slots` with the lowest expected wait; equal waits go to
    /// the worker with fewer requests in flight (decoding ones included, which the wait leaves
    /// out), remaining ties uniformly at random. `None` when `slots` yields no eligible worker.
    pub fn lowest_wait(
        &self,
        workers: &[WorkerStatus],
        slots: impl Iterator<Item = usize>,
        rng: &mut Rng,
    ) -> Option<usize> {
        let mut pick = LowestPick::default();
        for slot in slots {
            let Some(worker) = workers.get(slot).filter(|w| w.eligible) else {
                continue;
            };
            pick.offer(slot, (self.expected_wait(worker), worker.in_flight), rng);
        }
        pick.slot()
    }

    /// Step 6's pick for a cache miss of `request_tokens` prompt tokens. The worker that takes a
    /// new prefix also takes the requests that will share it, so the pick may trade a little
    /// wait for balance: it starts from the worker [`Fleet::lowest_wait`] would pick, and any
    /// eligible worker with no more requests in flight than that one or than the fleet mean,
    /// that would start this request less than [`NEW_PREFIX_WAIT_SLACK`] of its own work later,
    /// may take it instead. Among those: the one given the fewest new-prefix tokens lately
    /// (`WorkerStatus::placed_tokens`), then the lower wait, then uniformly at random.
    ///
    /// Without it a group of requests stays wherever its first request happened to find an idle
    /// engine, and engines that drew more first requests stay busier for as long as those
    /// prefixes are cached (the spill gate opens only far above the mean). The in-flight bound
    /// keeps it off engines busier decoding than both the plain pick and the average (on the
    /// Mooncake trace at six times its load, the window alone raised end-to-end p99 from 4.9 s
    /// to 6.1–7.3 s).
    ///
    /// A burst of misses does not pile onto one worker: each dispatch credits its worker with
    /// the request's tokens and one request in flight at once, which moves it out of the
    /// window for the next miss. `None` when no worker is eligible.
    pub fn lowest_wait_for_new_prefix(
        &self,
        workers: &[WorkerStatus],
        request_tokens: u64,
        rng: &mut Rng,
    ) -> Option<usize> {
        let eligible = || workers.iter().enumerate().filter(|(_, w)| w.eligible);
        let (least_wait, least_in_flight) = eligible()
            .map(|(_, worker)| (self.expected_wait(worker), worker.in_flight))
            .min_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))?;
        // A share of this request's own work in the scorer's unit: seconds, or one request in
        // flight (then only workers as idle as the plain pick qualify).
        let slack = if self.scores_reports {
            NEW_PREFIX_WAIT_SLACK * request_tokens as f64 / self.throughput
        } else {
            NEW_PREFIX_WAIT_SLACK
        };
        let mut pick = LowestPick::default();
        for (slot, worker) in eligible() {
            let wait = self.expected_wait(worker);
            let later = wait > least_wait && wait >= least_wait + slack;
            let busier = worker.in_flight > least_in_flight
                && f64::from(worker.in_flight) > self.in_flight_mean;
            if !later && !busier {
                pick.offer(slot, (worker.placed_tokens, wait), rng);
            }
        }
        pick.slot()
    }
}

/// Prefill tokens queued on a worker: the report's queue, less the requests of it whose first
/// token came back since, plus what was sent since with no first token back yet.
fn queued_prefill_tokens(worker: &WorkerStatus, load: &WorkerLoad) -> f64 {
    let reported_queue = load
        .waiting_uncached_tokens
        .saturating_sub(worker.drained_tokens);
    reported_queue as f64 + worker.credited_tokens as f64
}

/// The slot with the lowest score offered, equal scores uniformly at random.
#[derive(Debug)]
pub(super) struct LowestPick<S> {
    best: Option<(usize, S)>,
    ties: u32,
}

impl<S> Default for LowestPick<S> {
    fn default() -> Self {
        LowestPick {
            best: None,
            ties: 0,
        }
    }
}

impl<S: PartialOrd + Copy> LowestPick<S> {
    pub(super) fn offer(&mut self, slot: usize, score: S, rng: &mut Rng) {
        match self.best {
            Some((_, best)) if score > best => {}
            Some((_, best)) if score == best => {
                // Reservoir sampling: the k-th tie replaces the pick with probability 1/k.
                self.ties += 1;
                if rng.u32(..self.ties) == 0 {
                    self.best = Some((slot, score));
                }
            }
            _ => {
                self.best = Some((slot, score));
                self.ties = 1;
            }
        }
    }

    pub(super) fn slot(&self) -> Option<usize> {
        self.best.map(|(slot, _)| slot)
    }

    /// The pick and its score.
    pub(super) fn best(&self) -> Option<(usize, S)> {
        self.best
    }
}

/// The KV penalty for a usage between 0 and 1, in units of the penalty at half usage.
fn kv_penalty_shape(usage: f64) -> f64 {
    let usage = if usage.is_finite() {
        usage.clamp(0.0, KV_USAGE_CLAMP)
    } else {
        0.0
    };
    usage * usage / (1.0 - usage) * 2.0
}

/// Step 5's hot test: above both `--balance-rel-threshold` times the fleet mean and the fleet
/// mean plus `--balance-abs-threshold`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpillGate {
    rel_limit: f64,
    abs_limit: f64,
}

impl SpillGate {
    /// The gate for a fleet mean in-flight count.
    pub fn new(config: &CacheAwareConfig, in_flight_mean: f64) -> SpillGate {
        SpillGate {
            rel_limit: config.balance_rel_threshold * in_flight_mean,
            abs_limit: in_flight_mean + config.balance_abs_threshold,
        }
    }

    /// True when the worker is too busy to take affinity traffic.
    pub fn is_hot(&self, worker: &WorkerStatus) -> bool {
        let in_flight = f64::from(worker.in_flight);
        in_flight > self.rel_limit && in_flight > self.abs_limit
    }
}
