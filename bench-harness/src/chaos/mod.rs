//! `chaos`: the seeded chaos test of kvgate (`scripts/chaos.sh SEED`), in the spirit of
//! TigerBeetle's simulator: one seed draws a [`plan`] (requests, client aborts, engine kills and
//! restarts, hangs, slow and failing engines, workers removed and added through the admin API),
//! [`run`] plays it against real `sim-engine` and `kvgate` processes, and checks the invariants
//! at the end: every request answered properly ([`http`]'s verdicts), zero in-flight credits
//! after the drain, gauges that agree with the worker list and an index that empties with it
//! ([`metrics`]), RSS within 1.2x of its post-warm-up level, no panic in the gateway's log.

pub mod http;
pub mod metrics;
pub mod plan;
pub mod run;
