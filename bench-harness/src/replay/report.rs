//! Results: [`Recorder`] folds request outcomes into histograms and counters as they complete
//! (memory independent of the request count), and [`ReplayReport`] is the one serializable result
//! of a run — the JSON of `--out`, the text table and the plot are all printers over it.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::client::Outcome;
use super::limits::{CDF_POINTS_MAX, HIT_RATE_BUCKETS_MAX, LATENCY_US_MAX};
use crate::fleet::procstat::{SelfUsage, WatchedProcess};

/// Latency percentiles in milliseconds (successful requests only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u64,
}

/// What one worker received.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
}

/// One point of the TTFT CDF: `fraction` of successful requests had TTFT ≤ `ms`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CdfPoint {
    pub ms: f64,
    pub fraction: f64,
}

/// The token cache hit rate of the requests that completed in one time bucket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HitRatePoint {
    /// End of the bucket, seconds from the start of the run.
    pub t_s: f64,
    pub hit_rate: f64,
    pub requests: u64,
}

/// Latency a gateway added over sending to the engines directly (`compare` with `direct`), in
/// milliseconds: the difference of the two runs' percentiles, measured one after the other.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AddedLatency {
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub e2e_p50: f64,
}

/// The result of one replay.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// What was measured (the policy, in `compare`).
    pub label: String,
    /// Requests completed (successes and failures).
    pub requests: u64,
    pub successes: u64,
    pub errors: u64,
    /// Failures by kind: `connect`, `status_<code>`, `stream`, `timeout`.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Cached prompt tokens / prompt tokens over successful requests, 0–1.
    pub cache_hit_rate: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
    pub duration_s: f64,
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Max / mean requests per worker (over every known worker, idle ones included); `null` when
    /// no response named its worker.
    pub imbalance: Option<f64>,
    pub per_worker: BTreeMap<String, WorkerStats>,
    /// Responses without an `x-smg-routed-worker-id` header.
    pub unattributed_requests: u64,
    /// Successful requests for which the gateway predicted the worker's cached prompt tokens
    /// (kvgate's `x-kvgate-predicted-cached-tokens`), and of those the ones whose engine then
    /// reported fewer cached tokens than predicted: how far the index's predictions drift from
    /// the engines' truth.
    #[serde(default)]
    pub predicted_requests: u64,
    #[serde(default)]
    pub prediction_misses: u64,
    /// Prompt tokens predicted cached, and of those the ones the engines reported cached.
    #[serde(default)]
    pub predicted_tokens: u64,
    #[serde(default)]
    pub predicted_tokens_cached: u64,
    /// Latest any request left after its scheduled time, in ms: large values mean the load
    /// generator (or the in-flight cap) could not keep up with the pacing.
    pub send_lag_ms_max: f64,
    /// The replay process's own CPU time and peak memory (it must not be the bottleneck).
    pub load_generator: SelfUsage,
    /// Resident memory of `--watch-pid` (the gateway) at 10%, 50% and 100% of the run.
    pub watched_process: Option<WatchedProcess>,
    /// Set by `compare` when a `direct` run is among the policies.
    pub added_latency_ms: Option<AddedLatency>,
    /// The trace's `--trace-format` (`null` for the generator).
    pub trace_format: Option<String>,
    /// Trace lines (ShareGPT: conversations) skipped, in all and by kind (`malformed`,
    /// `too_long`, `out_of_bounds`, `unsupported`, `unreadable`); `warnings` names the first ones.
    pub skipped_lines: u64,
    pub skipped_by_kind: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
    pub ttft_cdf: Vec<CdfPoint>,
    pub hit_rate_over_time: Vec<HitRatePoint>,
    /// The slowest first tokens of the run (at most [`TTFT_SLOWEST_MAX`], slowest first), each
    /// with when it was sent and what its engine had cached: what a TTFT tail is made of (cold
    /// prompts at the start, or misses spread over the run).
    #[serde(default)]
    pub ttft_slowest: Vec<SlowFirstToken>,
}

/// How many of the slowest first tokens a report names: a run's p99 and every first token above
/// it, up to 12,800 requests (`replay compare`'s default is 6,000: its p99 is the 60th).
pub const TTFT_SLOWEST_MAX: usize = 128;

/// One of a run's slowest first tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowFirstToken {
    /// When the request was sent, in seconds from the start of the run.
    pub sent_s: f64,
    pub ttft_ms: f64,
    pub prompt_tokens: u64,
    /// Prompt tokens the engine reported cached (0: a cold prompt).
    pub cached_tokens: u64,
    pub worker: Option<String>,
}

/// Prompt and cached tokens per completion-time bucket; the bucket width doubles whenever the run
/// outgrows the bucket count, so the series stays bounded however long the replay.
struct Timeline {
    width: Duration,
    buckets: Vec<(u64, u64, u64)>,
}

impl Timeline {
    fn add(&mut self, at: Duration, prompt: u64, cached: u64) {
        let mut index = (at.as_nanos() / self.width.as_nanos().max(1)) as usize;
        while index >= HIT_RATE_BUCKETS_MAX {
            let merged = self.buckets.chunks(2).map(|pair| {
                pair.iter()
                    .fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
            });
            self.buckets = merged.collect();
            self.width *= 2;
            index = (at.as_nanos() / self.width.as_nanos()) as usize;
        }
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, (0, 0, 0));
        }
        let bucket = &mut self.buckets[index];
        *bucket = (bucket.0 + prompt, bucket.1 + cached, bucket.2 + 1);
    }

    fn points(&self) -> Vec<HitRatePoint> {
        let width_s = self.width.as_secs_f64();
        let with_requests = self.buckets.iter().enumerate().filter(|(_, b)| b.2 > 0);
        with_requests
            .map(|(i, b)| HitRatePoint {
                t_s: (i + 1) as f64 * width_s,
                hit_rate: ratio(b.1, b.0),
                requests: b.2,
            })
            .collect()
    }
}

/// One completed request, as the recorder receives it.
pub struct Completion {
    /// When it completed, from the start of the run.
    pub done_at: Duration,
    /// The prompt length the replay sent, when it knows it (used when the server does not
    /// report it; 0 when neither knows).
    pub prompt_tokens_sent: Option<u64>,
    pub send_lag: Duration,
    pub outcome: Outcome,
}

/// Accumulates completions.
pub struct Recorder {
    ttft_us: Histogram<u64>,
    itl_us: Histogram<u64>,
    e2e_us: Histogram<u64>,
    report: ReplayReport,
    timeline: Timeline,
    send_lag_max: Duration,
    /// The slowest first tokens so far, unordered, at most [`TTFT_SLOWEST_MAX`].
    slowest: Vec<SlowFirstToken>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        // 3 significant digits from 1 µs to an hour: about 200 KB per histogram.
        // The bounds are constants that hdrhistogram accepts (low ≥ 1, high ≥ 2 × low, sigfig ≤ 5).
        let histogram =
            || Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid constant bounds");
        Self {
            ttft_us: histogram(),
            itl_us: histogram(),
            e2e_us: histogram(),
            report: ReplayReport::default(),
            timeline: Timeline {
                width: Duration::from_millis(100),
                buckets: Vec::new(),
            },
            send_lag_max: Duration::ZERO,
            slowest: Vec::with_capacity(TTFT_SLOWEST_MAX),
        }
    }

    /// Requests recorded so far, and how many failed.
    pub fn counts(&self) -> (u64, u64) {
        (self.report.requests, self.report.errors)
    }

    pub fn record(&mut self, completion: Completion) {
        let Completion {
            done_at,
            prompt_tokens_sent,
            send_lag,
            outcome,
        } = completion;
        let report = &mut self.report;
        report.requests += 1;
        self.send_lag_max = self.send_lag_max.max(send_lag);
        if let Some(kind) = &outcome.error {
            report.errors += 1;
            *report.errors_by_kind.entry(kind.label()).or_default() += 1;
            return;
        }
        report.successes += 1;
        let prompt = outcome
            .usage
            .prompt_tokens
            .or(prompt_tokens_sent)
            .unwrap_or(0);
        let cached = outcome.usage.cached_tokens.unwrap_or(0).min(prompt);
        let output = outcome.usage.completion_tokens.unwrap_or(0);
        report.prompt_tokens += prompt;
        report.cached_tokens += cached;
        report.output_tokens += output;
        match &outcome.worker {
            Some(worker) => {
                let stats = report.per_worker.entry(worker.clone()).or_default();
                stats.requests += 1;
                stats.prompt_tokens += prompt;
                stats.cached_tokens += cached;
                stats.output_tokens += output;
            }
            None => report.unattributed_requests += 1,
        }
        if let Some(predicted) = outcome.predicted_cached_tokens.filter(|p| *p > 0) {
            report.predicted_requests += 1;
            report.predicted_tokens += predicted;
            report.predicted_tokens_cached += cached.min(predicted);
            if cached < predicted {
                report.prediction_misses += 1;
            }
        }
        self.timeline.add(done_at, prompt, cached);
        if let Some(ttft) = outcome.ttft {
            record_us(&mut self.ttft_us, ttft.as_micros() as u64);
            self.keep_if_slowest(SlowFirstToken {
                sent_s: done_at.saturating_sub(outcome.e2e).as_secs_f64(),
                ttft_ms: ttft.as_secs_f64() * 1000.0,
                prompt_tokens: prompt,
                cached_tokens: cached,
                worker: outcome.worker.clone(),
            });
        }
        for &gap in &outcome.itl_us {
            record_us(&mut self.itl_us, u64::from(gap));
        }
        record_us(&mut self.e2e_us, outcome.e2e.as_micros() as u64);
    }

    /// Keeps `first` if it is among the [`TTFT_SLOWEST_MAX`] slowest so far.
    fn keep_if_slowest(&mut self, first: SlowFirstToken) {
        if self.slowest.len() < TTFT_SLOWEST_MAX {
            self.slowest.push(first);
            return;
        }
        let fastest = self
            .slowest
            .iter_mut()
            .min_by(|a, b| a.ttft_ms.total_cmp(&b.ttft_ms));
        if let Some(kept) = fastest.filter(|kept| kept.ttft_ms < first.ttft_ms) {
            *kept = first;
        }
    }

    /// The report, with `known_workers` (the fleet) counted even if they received nothing.
    pub fn finish(
        mut self,
        label: &str,
        duration: Duration,
        known_workers: &[String],
    ) -> ReplayReport {
        for worker in known_workers {
            self.report.per_worker.entry(worker.clone()).or_default();
        }
        let mut report = self.report;
        report.label = label.to_string();
        report.cache_hit_rate = ratio(report.cached_tokens, report.prompt_tokens);
        report.ttft_ms = percentiles(&self.ttft_us);
        report.itl_ms = percentiles(&self.itl_us);
        report.e2e_ms = percentiles(&self.e2e_us);
        report.duration_s = duration.as_secs_f64();
        let seconds = report.duration_s.max(1e-9);
        report.throughput_rps = report.successes as f64 / seconds;
        report.output_tokens_per_s = report.output_tokens as f64 / seconds;
        report.imbalance = imbalance(&report.per_worker);
        report.send_lag_ms_max = self.send_lag_max.as_secs_f64() * 1000.0;
        report.ttft_cdf = cdf(&self.ttft_us);
        report.hit_rate_over_time = self.timeline.points();
        self.slowest
            .sort_unstable_by(|a, b| b.ttft_ms.total_cmp(&a.ttft_ms));
        report.ttft_slowest = self.slowest;
        report
    }
}

fn record_us(histogram: &mut Histogram<u64>, us: u64) {
    histogram.saturating_record(us.clamp(1, LATENCY_US_MAX));
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Max over mean requests per worker.
pub fn imbalance(per_worker: &BTreeMap<String, WorkerStats>) -> Option<f64> {
    let total: u64 = per_worker.values().map(|w| w.requests).sum();
    let max = per_worker.values().map(|w| w.requests).max()?;
    if total == 0 {
        return None;
    }
    Some(max as f64 / (total as f64 / per_worker.len() as f64))
}

fn percentiles(histogram: &Histogram<u64>) -> Percentiles {
    if histogram.is_empty() {
        return Percentiles::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Percentiles {
        p50: ms(histogram.value_at_quantile(0.50)),
        p90: ms(histogram.value_at_quantile(0.90)),
        p99: ms(histogram.value_at_quantile(0.99)),
        max: ms(histogram.max()),
        mean: histogram.mean() / 1000.0,
        count: histogram.len(),
    }
}

fn cdf(histogram: &Histogram<u64>) -> Vec<CdfPoint> {
    if histogram.is_empty() {
        return Vec::new();
    }
    let steps = CDF_POINTS_MAX - 1;
    (0..=steps)
        .map(|i| {
            let fraction = i as f64 / steps as f64;
            CdfPoint {
                ms: histogram.value_at_quantile(fraction) as f64 / 1000.0,
                fraction,
            }
        })
        .collect()
}

/// The text table of one or more reports, side by side (one column per report).
pub fn table(reports: &[ReplayReport]) -> String {
    let mut rows: Vec<(&str, Vec<String>)> =
        vec![("", reports.iter().map(|r| r.label.clone()).collect())];
    let mut row = |name, cell: &dyn Fn(&ReplayReport) -> String| {
        rows.push((name, reports.iter().map(cell).collect()))
    };
    row("requests", &|r| r.requests.to_string());
    row("errors", &|r| r.errors.to_string());
    row("cache hit rate", &|r| {
        format!("{:.1}%", r.cache_hit_rate * 100.0)
    });
    row("TTFT p50 (ms)", &|r| format!("{:.1}", r.ttft_ms.p50));
    row("TTFT p99 (ms)", &|r| format!("{:.1}", r.ttft_ms.p99));
    row("ITL p50 (ms)", &|r| format!("{:.2}", r.itl_ms.p50));
    row("E2E p50 (ms)", &|r| format!("{:.1}", r.e2e_ms.p50));
    row("E2E p99 (ms)", &|r| format!("{:.1}", r.e2e_ms.p99));
    row("throughput (req/s)", &|r| {
        format!("{:.1}", r.throughput_rps)
    });
    row("imbalance (max/mean)", &|r| {
        r.imbalance.map_or("-".into(), |i| format!("{i:.2}"))
    });
    row("workers used", &|r| {
        format!(
            "{}/{}",
            r.per_worker.values().filter(|w| w.requests > 0).count(),
            r.per_worker.len()
        )
    });
    if reports.iter().any(|r| r.predicted_requests > 0) {
        row("predicted hits", &|r| r.predicted_requests.to_string());
        row("predictions missed", &|r| {
            let missed = ratio(r.prediction_misses, r.predicted_requests);
            format!("{:.1}%", missed * 100.0)
        });
    }
    if reports.iter().any(|r| r.skipped_lines > 0) {
        row("skipped trace lines", &|r| r.skipped_lines.to_string());
    }
    if reports.iter().any(|r| r.added_latency_ms.is_some()) {
        let added = |r: &ReplayReport, pick: fn(&AddedLatency) -> f64| {
            r.added_latency_ms
                .as_ref()
                .map_or("-".into(), |a| format!("{:+.2}", pick(a)))
        };
        row("TTFT p50 over direct (ms)", &|r| added(r, |a| a.ttft_p50));
        row("TTFT p99 over direct (ms)", &|r| added(r, |a| a.ttft_p99));
        row("E2E p50 over direct (ms)", &|r| added(r, |a| a.e2e_p50));
    }
    let name_width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let cell_width = rows
        .iter()
        .flat_map(|(_, c)| c.iter().map(String::len))
        .max()
        .unwrap_or(0)
        .max(8);
    let mut out = String::new();
    for (name, cells) in rows {
        out.push_str(&format!("{name:<name_width$}"));
        for cell in cells {
            out.push_str(&format!("  {cell:>cell_width$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::client::ErrorKind;
    use crate::replay::sse::Usage;

    fn ok(worker: &str, prompt: u64, cached: u64, ttft_ms: u64) -> Completion {
        let usage = Usage {
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            completion_tokens: Some(4),
        };
        let outcome = Outcome {
            ttft: Some(Duration::from_millis(ttft_ms)),
            e2e: Duration::from_millis(ttft_ms + 10),
            itl_us: vec![1000, 3000],
            usage,
            worker: Some(worker.into()),
            predicted_cached_tokens: None,
            error: None,
        };
        Completion {
            done_at: Duration::from_millis(ttft_ms),
            prompt_tokens_sent: Some(prompt),
            send_lag: Duration::ZERO,
            outcome,
        }
    }

    #[test]
    fn predictions_are_compared_with_what_the_engine_cached() {
        let predicted = |mut completion: Completion, tokens: u64| {
            completion.outcome.predicted_cached_tokens = Some(tokens);
            completion
        };
        let mut recorder = Recorder::new();
        // Held as predicted; more than predicted; less (the engine had evicted); no prediction.
        recorder.record(predicted(ok("a", 100, 64, 1), 64));
        recorder.record(predicted(ok("a", 100, 96, 1), 64));
        recorder.record(predicted(ok("b", 100, 16, 1), 64));
        recorder.record(ok("b", 100, 0, 1));
        let report = recorder.finish("tree", Duration::from_secs(1), &[]);
        assert_eq!(
            (report.predicted_requests, report.prediction_misses),
            (3, 1)
        );
        assert_eq!(
            (report.predicted_tokens, report.predicted_tokens_cached),
            (192, 144)
        );
        let text = table(&[report]);
        assert!(
            text.contains("predictions missed") && text.contains("33.3%"),
            "{text}"
        );
    }

    #[test]
    fn the_slowest_first_tokens_are_named_slowest_first_with_their_cache() {
        let mut recorder = Recorder::new();
        // TTFTs 1..=200 ms in a scrambled order; the slow ones cold, the rest warm.
        for i in 0..200u64 {
            let ttft = (i * 37) % 200 + 1;
            let cached = if ttft > 190 { 0 } else { 64 };
            recorder.record(ok("a", 100, cached, ttft));
        }
        let report = recorder.finish("x", Duration::from_secs(1), &[]);
        let ttfts: Vec<f64> = report.ttft_slowest.iter().map(|s| s.ttft_ms).collect();
        let expected: Vec<f64> = (0..TTFT_SLOWEST_MAX as u64)
            .map(|i| (200 - i) as f64)
            .collect();
        assert_eq!(ttfts, expected);
        let cold = report.ttft_slowest.iter().filter(|s| s.cached_tokens == 0);
        assert_eq!(cold.count(), 10);
        // Sent at its completion less its end-to-end time (`ok`: done at the TTFT, e2e 10 ms more).
        assert!(report.ttft_slowest.iter().all(|s| s.sent_s == 0.0));
    }

    #[test]
    fn hit_rate_imbalance_and_errors_are_counted() {
        let mut recorder = Recorder::new();
        recorder.record(ok("a", 100, 50, 10));
        recorder.record(ok("a", 100, 100, 20));
        recorder.record(ok("b", 200, 0, 30));
        let failed = Outcome {
            error: Some(ErrorKind::Status(503)),
            ..Outcome::default()
        };
        recorder.record(Completion {
            done_at: Duration::ZERO,
            prompt_tokens_sent: Some(9),
            send_lag: Duration::ZERO,
            outcome: failed,
        });
        let report = recorder.finish(
            "x",
            Duration::from_secs(2),
            &["a".into(), "b".into(), "c".into()],
        );
        assert_eq!(
            (report.requests, report.successes, report.errors),
            (4, 3, 1)
        );
        assert_eq!(report.errors_by_kind.get("status_503"), Some(&1));
        assert!((report.cache_hit_rate - 150.0 / 400.0).abs() < 1e-9);
        // 3 requests over 3 workers: mean 1, max 2.
        assert_eq!(report.imbalance, Some(2.0));
        assert!(
            (report.ttft_ms.p50 - 20.0).abs() < 0.1,
            "{:?}",
            report.ttft_ms
        );
        assert!((report.itl_ms.max - 3.0).abs() < 0.01);
        assert_eq!(report.throughput_rps, 1.5);
        assert_eq!(report.ttft_cdf.last().map(|p| p.fraction), Some(1.0));
        let json = serde_json::to_value(&report).unwrap();
        for key in [
            "requests",
            "errors",
            "cache_hit_rate",
            "ttft_ms",
            "itl_ms",
            "e2e_ms",
            "throughput_rps",
            "imbalance",
            "per_worker",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn the_timeline_stays_bounded_on_long_runs() {
        let mut timeline = Timeline {
            width: Duration::from_millis(100),
            buckets: Vec::new(),
        };
        for s in 0..10_000 {
            timeline.add(Duration::from_secs(s), 10, 5);
        }
        let points = timeline.points();
        assert!(points.len() <= HIT_RATE_BUCKETS_MAX);
        assert_eq!(points.iter().map(|p| p.requests).sum::<u64>(), 10_000);
        assert!(points.iter().all(|p| (p.hit_rate - 0.5).abs() < 1e-9));
    }
}
