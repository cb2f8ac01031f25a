//! When each request is sent: [`Pacing`] (trace timestamps ÷ `--speedup`, Poisson arrivals at
//! `--rate`, or a closed loop of `--concurrency` requests), [`Schedule`] (the scheduled send time
//! of each item, a pure function of the pacing and the items), and [`dispatch`], the loop that
//! waits on a [`Clock`] and hands each item to the sender. Tests drive `dispatch` with a fake clock
//! and count send times; the binary uses [`TokioClock`].
//!
//! Latency is measured from the scheduled time, not from when a request actually left: a gateway
//! that stalls the load generator is charged for the wait (no coordinated omission).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::workload::{WorkItem, Workload};

/// How send times are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pacing {
    /// The trace's own timestamps, divided by `speedup` (> 0).
    Trace { speedup: f64 },
    /// Exponential inter-arrival gaps with mean `1 / rate_per_s`, from a seeded generator.
    Poisson { rate_per_s: f64, seed: u64 },
    /// `concurrency` requests in flight: each completion sends the next.
    Closed { concurrency: usize },
}

/// Scheduled send times, as offsets from the start of the run.
pub struct Schedule {
    pacing: Pacing,
    rng: fastrand::Rng,
    poisson_next_s: f64,
}

impl Schedule {
    pub fn new(pacing: Pacing) -> Self {
        let seed = match pacing {
            Pacing::Poisson { seed, .. } => seed,
            _ => 0,
        };
        Self {
            pacing,
            rng: fastrand::Rng::with_seed(seed),
            poisson_next_s: 0.0,
        }
    }

    /// When `item` is due; `None` in a closed loop (it is sent as soon as a slot frees) and for
    /// an item without a timestamp under trace pacing (sent at once).
    pub fn send_at(&mut self, item: &WorkItem) -> Option<Duration> {
        match self.pacing {
            Pacing::Trace { speedup } => {
                let ms = item.arrival_ms? / speedup;
                Some(Duration::from_secs_f64((ms / 1000.0).max(0.0)))
            }
            Pacing::Poisson { rate_per_s, .. } => {
                let at = self.poisson_next_s;
                // 1 - U is in (0, 1], so the logarithm is finite.
                self.poisson_next_s += -(1.0 - self.rng.f64()).ln() / rate_per_s;
                Some(Duration::from_secs_f64(at))
            }
            Pacing::Closed { .. } => None,
        }
    }
}

/// Time as the dispatcher sees it: elapsed time since the run started, and a way to wait.
pub trait Clock {
    fn elapsed(&self) -> Duration;
    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> + Send;
}

/// The real clock.
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_now() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }

    pub fn start(&self) -> tokio::time::Instant {
        self.start
    }
}

impl Clock for TokioClock {
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep_until(self.start + at)
    }
}

/// One request handed to the sender: the item, its scheduled time, and the in-flight slot it
/// holds until it completes.
pub struct Dispatch {
    pub item: WorkItem,
    pub scheduled: Duration,
    pub slot: OwnedSemaphorePermit,
}

/// Sends every item of `workload` at its scheduled time, each holding one of `slots` while in
/// flight (the closed loop's concurrency, or the open loop's in-flight cap). Returns how many
/// items were dispatched.
pub async fn dispatch<W, C, F>(
    workload: &mut W,
    schedule: &mut Schedule,
    clock: &C,
    slots: Arc<Semaphore>,
    mut send: F,
) -> u64
where
    W: Workload + ?Sized,
    C: Clock,
    F: FnMut(Dispatch),
{
    let mut sent = 0;
    while let Some(item) = workload.next_item() {
        let due = schedule.send_at(&item);
        if let Some(at) = due {
            clock.sleep_until(at).await;
        }
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break; // the semaphore was closed: the run is being stopped
        };
        let scheduled = due.unwrap_or_else(|| clock.elapsed());
        send(Dispatch {
            item,
            scheduled,
            slot,
        });
        sent += 1;
    }
    sent
}
