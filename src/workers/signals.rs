//! The per-worker signals the control core publishes in a worker-table slot and data cores read
//! lock-free: circuit state, overload exclusion, draining, and the last load report.
//!
//! Owns [`WorkerSignals`]. Written by the control core only; a data core reads them once per
//! routing decision without writing any shared cache line.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::breaker::BreakerState;
use super::load::{LoadReport, OverloadConfig};

/// The per-worker signals the control core publishes in a worker-table slot and data cores read
/// lock-free: circuit state, overload exclusion, draining (removed, waiting for its in-flight
/// requests), and the last load report. Written by the control core only.
#[derive(Debug, Default)]
pub struct WorkerSignals {
    breaker: AtomicU8,
    overloaded: AtomicBool,
    draining: AtomicBool,
    load: ArcSwapOption<LoadReport>,
    /// Bumped after every report published by `set_load`, and by `reset`: dispatch credits
    /// taken under an older generation are already in (or older than) the published report. A
    /// failed poll (`set_load(None)`) does not bump it: no report counted those dispatches, so
    /// their credits still stand for the work the worker has.
    load_generation: AtomicU32,
}

impl WorkerSignals {
    /// Whether these signals let routing pick the worker (health is checked separately).
    pub fn allows_traffic(&self) -> bool {
        self.breaker_state().allows_traffic()
            && !self.overloaded.load(Ordering::Acquire)
            && !self.draining.load(Ordering::Acquire)
    }

    /// The published circuit state.
    pub fn breaker_state(&self) -> BreakerState {
        BreakerState::from_u8(self.breaker.load(Ordering::Acquire))
    }

    /// Whether the worker is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Whether overload protection excludes the worker.
    pub fn is_overloaded(&self) -> bool {
        self.overloaded.load(Ordering::Acquire)
    }

    /// The last load report (`None`: no signal).
    pub fn load(&self) -> Option<Arc<LoadReport>> {
        self.load.load_full()
    }

    /// The last load report for one routing decision: unlike `load`, it writes no shared
    /// reference count (arc-swap's per-thread debt slots), so data cores reading every worker's
    /// report per request do not bounce its cache line between them.
    pub fn peek_load(&self) -> arc_swap::Guard<Option<Arc<LoadReport>>> {
        self.load.load()
    }

    /// Which load report is published: changes with every report `set_load` publishes and with
    /// `reset`, not when a failed poll withdraws the report.
    pub fn load_generation(&self) -> u32 {
        self.load_generation.load(Ordering::Acquire)
    }

    /// Publish the circuit state. Control core only.
    pub fn set_breaker(&self, state: BreakerState) {
        self.breaker.store(state as u8, Ordering::Release);
    }

    /// Publishes that the worker is draining (removed: no new requests). Control core only;
    /// `reset` ends it when the worker is purged.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Publish a load report and the overload verdict it implies. Control core only.
    pub fn set_load(&self, report: Option<LoadReport>, overload: &OverloadConfig) {
        self.overloaded
            .store(overload.is_overloaded(report.as_ref()), Ordering::Release);
        let reported = report.is_some();
        self.load.store(report.map(Arc::new));
        if reported {
            self.load_generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Back to a fresh slot (closed, not overloaded, not draining, no load). Control core only,
    /// after the worker was purged.
    pub fn reset(&self) {
        self.set_breaker(BreakerState::Closed);
        self.overloaded.store(false, Ordering::Release);
        self.draining.store(false, Ordering::Release);
        self.load.store(None);
        self.load_generation.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_gate_traffic() {
        let s = WorkerSignals::default();
        assert!(s.allows_traffic());
        s.set_breaker(BreakerState::Open);
        assert!(!s.allows_traffic());
        s.set_breaker(BreakerState::HalfOpen);
        assert!(s.allows_traffic());
        let limits = OverloadConfig {
            token_usage: None,
            waiting_requests: Some(1),
        };
        let busy = LoadReport {
            waiting_requests: 5,
            ..LoadReport::default()
        };
        s.set_load(Some(busy), &limits);
        assert!(s.is_overloaded() && !s.allows_traffic());
        assert_eq!(s.load().map(|r| r.waiting_requests), Some(5));
        s.set_load(None, &limits);
        assert!(s.allows_traffic());
        s.start_draining();
        assert!(!s.allows_traffic());
        s.reset();
        assert!(s.allows_traffic() && s.load().is_none() && !s.is_draining());
    }
}
