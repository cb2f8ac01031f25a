//! Kubernetes service discovery's figures under SMG's names and labels (`source="kubernetes"`):
//! `smg_discovery_registrations_total{source,result}` (`success`, `failed`: an add the control
//! core refused, tried again later), `smg_discovery_deregistrations_total{source,reason}`
//! (`reconciled`: a pod gone or not ready) and `smg_discovery_workers_discovered{source}` (the
//! worker URLs the watched pods want now). Written by the discovery thread only.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::bump;

/// The discovery thread's counters.
#[derive(Debug, Default)]
pub struct DiscoveryFigures {
    registered: AtomicU64,
    registrations_failed: AtomicU64,
    deregistered: AtomicU64,
    discovered: AtomicU64,
}

impl DiscoveryFigures {
    /// Counts the answer to an add: registered or refused.
    pub fn count_registration(&self, registered: bool) {
        match registered {
            true => bump(&self.registered, 1),
            false => bump(&self.registrations_failed, 1),
        }
    }

    /// Counts a worker removed because its pod went.
    pub fn count_deregistration(&self) {
        bump(&self.deregistered, 1);
    }

    /// Sets the worker URLs the watched pods want.
    pub fn set_discovered(&self, n: usize) {
        self.discovered.store(n as u64, Ordering::Relaxed);
    }

    pub(super) fn render(&self, out: &mut String) {
        let read = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let source = "source=\"kubernetes\"";
        let name = "smg_discovery_registrations_total";
        let _ = writeln!(
            out,
            "# HELP {name} Workers discovery asked to register, by result\n# TYPE {name} counter\n\
             {name}{{{source},result=\"success\"}} {}\n{name}{{{source},result=\"failed\"}} {}",
            read(&self.registered),
            read(&self.registrations_failed)
        );
        let name = "smg_discovery_deregistrations_total";
        let _ = writeln!(
            out,
            "# HELP {name} Workers discovery removed, by reason\n# TYPE {name} counter\n\
             {name}{{{source},reason=\"reconciled\"}} {}",
            read(&self.deregistered)
        );
        let name = "smg_discovery_workers_discovered";
        let _ = writeln!(
            out,
            "# HELP {name} Worker URLs the discovered pods serve now\n# TYPE {name} gauge\n\
             {name}{{{source}}} {}",
            read(&self.discovered)
        );
    }
}
