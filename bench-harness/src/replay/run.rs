//! One replay from start to report: [`ReplayOptions`] says what to send where and how fast,
//! [`run_replay`] opens the workload, paces it onto request tasks over one pooled client, folds
//! the outcomes in a recorder task and returns the [`ReplayReport`]. A `stop` signal (Ctrl-C)
//! stops sending, cancels the requests in flight and still returns what completed.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};

use super::client::{Client, Endpoint};
use super::form::{build_request, FormOptions};
use super::limits::{IN_FLIGHT_OPEN_LOOP_MAX, OUTCOME_CHANNEL_CAPACITY};
use super::pacing::{dispatch, Clock, Dispatch, Pacing, Schedule, TokioClock};
use super::progress::{show_progress, ProgressCounters, ProgressMode};
use super::report::{Completion, Recorder, ReplayReport};
use super::sharegpt::{ShareGptOptions, ShareGptWorkload};
use super::synthetic::{SyntheticSpec, SyntheticWorkload};
use super::token_ids::TokenDecoder;
use super::trace::{TraceFormat, TraceWorkload};
use super::workload::{Limited, Workload};
use crate::fleet::procstat::{self_usage, WatchedProcess};
use crate::fleet::stop_requested;

/// Where requests come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A timestamped trace file; token-id traces are decoded to text with `tokenizer`, if given.
    Trace {
        path: PathBuf,
        format: TraceFormat,
        repeat: bool,
        tokenizer: Option<PathBuf>,
    },
    /// A ShareGPT file of conversations.
    ShareGpt {
        path: PathBuf,
        options: ShareGptOptions,
    },
    Synthetic(SyntheticSpec),
}

impl Source {
    /// The `--trace-format` name of a trace source (`None` for the generator).
    pub fn trace_format(&self) -> Option<&'static str> {
        match self {
            Source::Trace { format, .. } => Some(format.name()),
            Source::ShareGpt { .. } => Some("sharegpt"),
            Source::Synthetic(_) => None,
        }
    }
}

/// Everything one replay needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayOptions {
    /// The gateway URL, or several comma-separated URLs sent to in turn (engines, directly).
    pub gateway: String,
    pub source: Source,
    pub pacing: Pacing,
    pub max_requests: Option<u64>,
    pub form: FormOptions,
    pub request_timeout: Duration,
    /// Names the run in the report and the progress line.
    pub label: String,
    /// The fleet's worker URLs, when known, so idle workers count in the imbalance.
    pub known_workers: Vec<String>,
    pub progress: ProgressMode,
    /// A process (the gateway) whose resident memory is sampled at 10%, 50% and 100% of the run.
    pub watch_pid: Option<u32>,
}

/// Opens the workload a replay reads.
pub fn open_workload(
    source: &Source,
    max_requests: Option<u64>,
) -> Result<Box<dyn Workload>, String> {
    let workload: Box<dyn Workload> = match source {
        Source::Trace {
            path,
            format,
            repeat,
            tokenizer,
        } => {
            let trace = TraceWorkload::open(path, *format, *repeat)
                .map_err(|e| format!("--trace {}: {e}", path.display()))?;
            match tokenizer {
                Some(tokenizer) => {
                    let decoder = TokenDecoder::from_file(tokenizer)
                        .map_err(|e| format!("--tokenizer-path {e}"))?;
                    Box::new(trace.decoding_with(decoder))
                }
                None => Box::new(trace),
            }
        }
        Source::ShareGpt { path, options } => {
            Box::new(ShareGptWorkload::open(path, options.clone())?)
        }
        Source::Synthetic(spec) => Box::new(SyntheticWorkload::new(spec.clone())?),
    };
    Ok(match max_requests {
        Some(max) => Box::new(Limited::new(workload, max)),
        None => workload,
    })
}

/// The number of requests a replay will send, when it is known in advance.
fn expected_requests(options: &ReplayOptions) -> Option<u64> {
    let natural = match &options.source {
        Source::Synthetic(spec) => Some(spec.request_count()),
        Source::Trace { .. } | Source::ShareGpt { .. } => None,
    };
    match (options.max_requests, natural) {
        (Some(max), Some(n)) => Some(max.min(n)),
        (max, n) => max.or(n),
    }
}

/// Runs one replay to its end (or until `stop` turns true).
pub async fn run_replay(
    options: &ReplayOptions,
    stop: watch::Receiver<bool>,
) -> Result<ReplayReport, String> {
    let usage_at_start = self_usage();
    let mut endpoints = Vec::new();
    for url in options.gateway.split(',').filter(|u| !u.is_empty()) {
        endpoints.push(Endpoint::resolve(url.trim()).await?);
    }
    if endpoints.is_empty() {
        return Err("--gateway needs a URL".into());
    }
    let client = Arc::new(Client::new(endpoints, options.request_timeout));
    let mut workload = open_workload(&options.source, options.max_requests)?;
    let in_flight_max = match options.pacing {
        Pacing::Closed { concurrency } => concurrency,
        _ => IN_FLIGHT_OPEN_LOOP_MAX,
    };
    let slots = Arc::new(Semaphore::new(in_flight_max));
    let counters = Arc::new(ProgressCounters::default());
    let (completions, received) = mpsc::channel(OUTCOME_CHANNEL_CAPACITY);
    let total = expected_requests(options);
    let watched = options.watch_pid.map(WatchedProcess::new);
    let recording = record_completions(received, counters.clone(), watched, total);
    let recorder = tokio::spawn(recording);
    let progress = tokio::spawn(show_progress(
        options.label.clone(),
        counters.clone(),
        total,
        options.progress,
    ));

    let clock = TokioClock::starting_now();
    let sender = RequestSender {
        client,
        form: Arc::new(options.form.clone()),
        completions,
        stop: stop.clone(),
        start: clock.start(),
    };
    let mut schedule = Schedule::new(options.pacing);
    let mut stopped = stop;
    let dispatched = dispatch(&mut *workload, &mut schedule, &clock, slots.clone(), |d| {
        sender.spawn(d, &clock)
    });
    tokio::select! {
        _ = dispatched => {}
        _ = stop_requested(&mut stopped) => slots.close(),
    }
    drop(sender);
    // Every request task holds a sender clone: the recorder ends when the last one finishes.
    let (recorder, watched) = recorder
        .await
        .map_err(|e| format!("the recorder failed: {e}"))?;
    let duration = clock.elapsed();
    counters.finish();
    let _ = progress.await;
    let mut report = recorder.finish(&options.label, duration, &options.known_workers);
    let warnings = workload.warnings();
    report.trace_format = options.source.trace_format().map(str::to_string);
    report.skipped_lines = warnings.skipped_lines;
    report.skipped_by_kind = warnings.skipped_by_kind.clone();
    report.warnings = warnings.messages.clone();
    report.watched_process = watched;
    report.load_generator = self_usage().since(&usage_at_start);
    Ok(report)
}

/// What each request task needs, shared by the dispatcher.
struct RequestSender {
    client: Arc<Client>,
    form: Arc<FormOptions>,
    completions: mpsc::Sender<Completion>,
    stop: watch::Receiver<bool>,
    start: tokio::time::Instant,
}

impl RequestSender {
    /// Starts one request as its own task.
    fn spawn(&self, dispatch: Dispatch, clock: &TokioClock) {
        let Dispatch {
            item,
            scheduled,
            slot,
        } = dispatch;
        let send_lag = clock.elapsed().saturating_sub(scheduled);
        let (client, form, completions) = (
            self.client.clone(),
            self.form.clone(),
            self.completions.clone(),
        );
        let mut stop = self.stop.clone();
        let scheduled_at = self.start + scheduled;
        let start = self.start;
        tokio::spawn(async move {
            let wire = build_request(&item, &form);
            let outcome = tokio::select! {
                outcome = client.send(&wire, scheduled_at) => outcome,
                _ = stop_requested(&mut stop) => return, // cancelled: not a measurement
            };
            let done_at = start.elapsed();
            let prompt_tokens_sent = item.prompt_tokens_known();
            let completion = Completion {
                done_at,
                prompt_tokens_sent,
                send_lag,
                outcome,
            };
            let _ = completions.send(completion).await;
            drop(slot);
        });
    }
}

async fn record_completions(
    mut received: mpsc::Receiver<Completion>,
    counters: Arc<ProgressCounters>,
    mut watched: Option<WatchedProcess>,
    total: Option<u64>,
) -> (Recorder, Option<WatchedProcess>) {
    let mut recorder = Recorder::new();
    while let Some(completion) = received.recv().await {
        recorder.record(completion);
        let (done, errors) = recorder.counts();
        counters.done.store(done, Ordering::Relaxed);
        counters.errors.store(errors, Ordering::Relaxed);
        if let (Some(watched), Some(total)) = (watched.as_mut(), total) {
            watched.on_progress(done, total);
        }
    }
    if let Some(watched) = watched.as_mut() {
        watched.on_end(recorder.counts().0, total);
    }
    (recorder, watched)
}
