//! Progress on stderr while a replay runs: a live one-line bar (done/total, rate, errors, ETA) when
//! stderr is a terminal, a plain line every few seconds otherwise (logs, CI). Results never go here.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Counters the recorder updates and the printer reads.
#[derive(Default)]
pub struct ProgressCounters {
    pub done: AtomicU64,
    pub errors: AtomicU64,
    pub finished: AtomicBool,
    /// Wakes the printer at the end, so the final line does not wait for the next tick.
    pub finished_wake: Notify,
}

impl ProgressCounters {
    /// Marks the run finished and wakes the printer.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        self.finished_wake.notify_one();
    }
}

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Bar on a terminal, periodic lines otherwise.
    Auto,
    Off,
}

/// Prints progress until `counters.finished` is set. `total` is the request count when known.
pub async fn show_progress(
    label: String,
    counters: Arc<ProgressCounters>,
    total: Option<u64>,
    mode: ProgressMode,
) {
    if mode == ProgressMode::Off {
        return;
    }
    let terminal = std::io::stderr().is_terminal();
    let period = if terminal {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(5)
    };
    let start = Instant::now();
    let mut ticker = tokio::time::interval(period);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = counters.finished_wake.notified() => {}
        }
        let finished = counters.finished.load(Ordering::Acquire);
        let line = progress_line(&label, &counters, total, start.elapsed(), terminal);
        let mut err = std::io::stderr().lock();
        let _ = if terminal {
            write!(err, "\r\x1b[2K{line}")
        } else {
            writeln!(err, "{line}")
        };
        if finished {
            if terminal {
                let _ = writeln!(err);
            }
            return;
        }
    }
}

fn progress_line(
    label: &str,
    counters: &ProgressCounters,
    total: Option<u64>,
    elapsed: Duration,
    bar: bool,
) -> String {
    let done = counters.done.load(Ordering::Relaxed);
    let errors = counters.errors.load(Ordering::Relaxed);
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / seconds;
    let Some(total) = total.filter(|&t| t > 0) else {
        return format!("[{label}] {done} done, {rate:.0} req/s, {errors} errors, {seconds:.0}s");
    };
    let fraction = (done as f64 / total as f64).min(1.0);
    let eta = if rate > 0.0 {
        format!("{:.0}s", total.saturating_sub(done) as f64 / rate)
    } else {
        "?".into()
    };
    let drawn = if bar {
        let filled = (fraction * 30.0) as usize;
        format!("[{}{}] ", "#".repeat(filled), "-".repeat(30 - filled))
    } else {
        String::new()
    };
    format!(
        "[{label}] {drawn}{done}/{total} ({:.0}%), {rate:.0} req/s, {errors} errors, ETA {eta}",
        fraction * 100.0
    )
}
