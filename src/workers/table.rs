//! The worker table: fixed-capacity slots indexed by `WorkerId`, read lock-free by data cores.
//!
//! - `WorkerTable` holds one `WorkerSlot` of atomics per id (health), the per-data-core in-flight
//!   counters, and the published `Roster` (the list of active workers with their URLs).
//! - Only the control core writes: it publishes a new `Roster` with one `ArcSwap` store and flips
//!   health atomics. Data cores load the roster per request and never wait.
//! - In-flight credits: each data core increments only its own padded row of counters, so cores
//!   never share a written cache line; readers sum the rows. An `InflightCredit` guard releases
//!   its credit on drop, so completion, error, timeout and client disconnect all release it.
//! - Token credits (what the expected-wait scorer adds to a worker's last load report): the
//!   prompt tokens sent since that report that are still queued (no first token back yet) and
//!   those still resident (request not ended), in the same kind of per-core rows, each entry
//!   tagged with the load-report generation it was taken under, so a new report voids older
//!   credits without any core resetting another's row. The same guard releases them, and when a
//!   request sent before the report gets its first token, counts its tokens as drained from the
//!   report's queue (the report is up to `--load-monitor-interval` old).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use super::signals::WorkerSignals;
use super::spec::WorkerSpec;
use crate::ids::WorkerId;
use crate::limits::WORKERS_MAX;

/// Whether a worker may receive traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Routable.
    Healthy = 0,
    /// Skipped by routing until a health check passes again.
    Unhealthy = 1,
}

/// The atomics of one worker id.
#[derive(Debug)]
pub struct WorkerSlot {
    health: AtomicU8,
    /// Circuit state, overload, draining and the last load report (`workers::signals`).
    signals: WorkerSignals,
}

impl WorkerSlot {
    fn new() -> Self {
        WorkerSlot {
            health: AtomicU8::new(Health::Healthy as u8),
            signals: WorkerSignals::default(),
        }
    }
}

/// One active worker as data cores see it.
#[derive(Debug)]
pub struct WorkerEntry {
    /// Its slot.
    pub id: WorkerId,
    /// Address, URL (exact spelling) and `Host` value.
    pub spec: WorkerSpec,
    /// `x-smg-routed-worker-id: <url>\r\n`, built once so responses only copy it.
    pub routed_header_line: Box<[u8]>,
}

impl WorkerEntry {
    /// Builds the entry for `spec` in slot `id`.
    pub fn new(id: WorkerId, spec: WorkerSpec) -> Self {
        let line = format!("x-smg-routed-worker-id: {}\r\n", spec.url);
        WorkerEntry {
            id,
            spec,
            routed_header_line: line.into_bytes().into_boxed_slice(),
        }
    }
}

/// The published set of active workers, in configuration order.
#[derive(Debug, Default)]
pub struct Roster {
    /// Active workers; ids are unique and below `WORKERS_MAX`.
    pub workers: Vec<WorkerEntry>,
}

impl Roster {
    /// The entry of worker `id`, if it is active.
    pub fn get(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.workers.iter().find(|w| w.id == id)
    }
}

type InflightRow = CachePadded<[AtomicU32; WORKERS_MAX]>;
type TokenCreditRow = CachePadded<[AtomicU64; WORKERS_MAX]>;
type DispatchedRow = CachePadded<[AtomicU64; WORKERS_MAX]>;

/// A token-credit entry: the load generation's low 16 bits above 48 bits of tokens.
const CREDIT_TOKEN_BITS: u32 = 48;
const CREDIT_TOKENS_MAX: u64 = (1 << CREDIT_TOKEN_BITS) - 1;

fn credit_tag(generation: u32) -> u64 {
    u64::from(generation & 0xffff)
}

/// Per-core token counters for every worker, tagged with the load-report generation they were
/// taken under.
#[derive(Debug)]
struct TokenCredits {
    by_core: Box<[TokenCreditRow]>,
}

impl TokenCredits {
    fn new(data_cores: usize) -> Self {
        let row = || CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0)));
        TokenCredits {
            by_core: (0..data_cores).map(|_| row()).collect(),
        }
    }

    /// Every core's tokens for `id` under `generation`.
    fn sum(&self, id: WorkerId, generation: u32) -> u64 {
        let tag = credit_tag(generation);
        self.by_core
            .iter()
            .map(|row| row[id.index()].load(Ordering::Relaxed))
            .filter(|entry| entry >> CREDIT_TOKEN_BITS == tag)
            .map(|entry| entry & CREDIT_TOKENS_MAX)
            .fold(0u64, u64::saturating_add)
    }

    /// Adds `tokens` to data core `core_id`'s entry for `id`. Only that core writes its row, so a plain
    /// load and store suffice; an entry of an older generation restarts from zero.
    fn add(&self, core_id: usize, id: WorkerId, generation: u32, tokens: u64) {
        let tag = credit_tag(generation);
        let entry = &self.by_core[core_id][id.index()];
        let old = entry.load(Ordering::Relaxed);
        let held = if old >> CREDIT_TOKEN_BITS == tag {
            old & CREDIT_TOKENS_MAX
        } else {
            0
        };
        let tokens = held.saturating_add(tokens).min(CREDIT_TOKENS_MAX);
        entry.store(tag << CREDIT_TOKEN_BITS | tokens, Ordering::Relaxed);
    }

    /// Takes back `tokens` added under `generation`, if that generation is still the entry's
    /// (a newer report voided them already otherwise).
    fn release(&self, core_id: usize, id: WorkerId, generation: u32, tokens: u64) {
        let tag = credit_tag(generation);
        let entry = &self.by_core[core_id][id.index()];
        let old = entry.load(Ordering::Relaxed);
        if old >> CREDIT_TOKEN_BITS == tag {
            let left = (old & CREDIT_TOKENS_MAX).saturating_sub(tokens);
            entry.store(tag << CREDIT_TOKEN_BITS | left, Ordering::Relaxed);
        }
    }
}

/// Slots, per-core in-flight and token-credit counters and the published roster.
#[derive(Debug)]
pub struct WorkerTable {
    slots: Box<[WorkerSlot]>,
    inflight_by_core: Box<[InflightRow]>,
    /// Requests each data core ever sent each worker slot (`--bounded-load-margin`'s counts).
    /// Only the core writes its row.
    dispatched_by_core: Box<[DispatchedRow]>,
    queued_tokens: TokenCredits,
    resident_tokens: TokenCredits,
    drained_tokens: TokenCredits,
    roster: ArcSwap<Roster>,
}

impl WorkerTable {
    /// A table for `data_cores` cores holding `specs` in slots 0, 1, ...
    pub fn new(data_cores: usize, specs: &[WorkerSpec]) -> Self {
        assert!(
            specs.len() <= WORKERS_MAX,
            "{} workers exceed {WORKERS_MAX}",
            specs.len()
        );
        let slots = (0..WORKERS_MAX).map(|_| WorkerSlot::new()).collect();
        let inflight_by_core =
            (0..data_cores).map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU32::new(0))));
        let workers = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| WorkerEntry::new(WorkerId(i as u16), spec.clone()))
            .collect();
        let dispatched_by_core =
            (0..data_cores).map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))));
        WorkerTable {
            slots,
            inflight_by_core: inflight_by_core.collect(),
            dispatched_by_core: dispatched_by_core.collect(),
            queued_tokens: TokenCredits::new(data_cores),
            resident_tokens: TokenCredits::new(data_cores),
            drained_tokens: TokenCredits::new(data_cores),
            roster: ArcSwap::from_pointee(Roster { workers }),
        }
    }

    /// The current roster (lock-free; hold it for one request, not across many).
    pub fn roster(&self) -> arc_swap::Guard<Arc<Roster>> {
        self.roster.load()
    }

    /// Publishes a new roster. Control core only.
    pub fn publish(&self, roster: Roster) {
        debug_assert!(roster.workers.iter().all(|w| w.id.index() < WORKERS_MAX));
        self.roster.store(Arc::new(roster));
    }

    /// Sets a worker's health. Control core only.
    pub fn set_health(&self, id: WorkerId, health: Health) {
        self.slots[id.index()]
            .health
            .store(health as u8, Ordering::Release);
    }

    /// Whether routing may pick `id`.
    pub fn is_healthy(&self, id: WorkerId) -> bool {
        self.slots[id.index()].health.load(Ordering::Acquire) == Health::Healthy as u8
    }

    /// Whether routing may pick `id`: healthy, circuit not open, not overloaded, not draining.
    pub fn is_eligible(&self, id: WorkerId) -> bool {
        self.is_healthy(id) && self.slots[id.index()].signals.allows_traffic()
    }

    /// Whether any active worker is eligible (the gateway's readiness).
    pub fn has_eligible_worker(&self) -> bool {
        self.roster().workers.iter().any(|w| self.is_eligible(w.id))
    }

    /// The breaker, overload, drain and load signals of `id` (written by the control core only).
    pub fn signals(&self, id: WorkerId) -> &WorkerSignals {
        &self.slots[id.index()].signals
    }

    /// Requests in flight to `id`, summed over all data cores.
    pub fn inflight(&self, id: WorkerId) -> u32 {
        let sum = self
            .inflight_by_core
            .iter()
            .map(|row| row[id.index()].load(Ordering::Relaxed));
        sum.fold(0u32, u32::wrapping_add)
    }

    /// Requests every data core has sent slot `id` since the gateway started (whichever worker
    /// held the slot; routing counts from when it first saw the worker there).
    pub fn dispatched(&self, id: WorkerId) -> u64 {
        let sum = self
            .dispatched_by_core
            .iter()
            .map(|row| row[id.index()].load(Ordering::Relaxed));
        sum.fold(0u64, u64::wrapping_add)
    }

    /// Credits one in-flight request of `tokens` prompt tokens to `id` from data core `core_id`.
    /// The tokens count as queued prefill work until `InflightCredit::prefill_done` (the
    /// response's first body byte) and as resident KV-cache tokens until the guard drops (the
    /// request ended, however it ended); a newer load report voids both, since it counts them.
    pub fn credit(&self, core_id: usize, id: WorkerId, tokens: u64) -> InflightCredit<'_> {
        self.inflight_by_core[core_id][id.index()].fetch_add(1, Ordering::Relaxed);
        // Only this core writes its row: a load and a store, no locked add.
        let dispatched = &self.dispatched_by_core[core_id][id.index()];
        dispatched.store(
            dispatched.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        let generation = self.signals(id).load_generation();
        self.queued_tokens.add(core_id, id, generation, tokens);
        self.resident_tokens.add(core_id, id, generation, tokens);
        InflightCredit {
            table: self,
            core_id,
            id,
            generation,
            queued: tokens,
            resident: tokens,
        }
    }

    /// Prompt tokens every data core sent `id` while the load report of `generation`
    /// (`WorkerSignals::load_generation`) was published that have no first token back yet.
    pub fn queued_tokens(&self, id: WorkerId, generation: u32) -> u64 {
        self.queued_tokens.sum(id, generation)
    }

    /// Prompt tokens every data core sent `id` while the load report of `generation` was
    /// published whose requests have not ended (their KV cache is still held).
    pub fn resident_tokens(&self, id: WorkerId, generation: u32) -> u64 {
        self.resident_tokens.sum(id, generation)
    }

    /// Prompt tokens of requests sent to `id` before the load report of `generation` whose first
    /// token came back after it: work the report still shows queued that has left the queue.
    pub fn drained_tokens(&self, id: WorkerId, generation: u32) -> u64 {
        self.drained_tokens.sum(id, generation)
    }
}

/// One in-flight request on one worker and its token credits, released on drop (completion,
/// error, timeout and client disconnect alike). Used and dropped on the data core that took it.
#[derive(Debug)]
pub struct InflightCredit<'a> {
    table: &'a WorkerTable,
    core_id: usize,
    id: WorkerId,
    generation: u32,
    /// Prompt tokens still credited as queued work (0 once the prefill is done).
    queued: u64,
    /// Prompt tokens credited as resident until the request ends.
    resident: u64,
}

impl InflightCredit<'_> {
    /// The worker has answered with its first body byte: the prompt is no longer queued work.
    /// If a load report landed since the dispatch, that report counted it queued: it is counted
    /// as drained from the report's queue instead.
    pub fn prefill_done(&mut self) {
        if self.queued > 0 {
            let tokens = std::mem::take(&mut self.queued);
            let (core_id, id, generation) = (self.core_id, self.id, self.generation);
            let now = self.table.signals(id).load_generation();
            if now == generation {
                self.table
                    .queued_tokens
                    .release(core_id, id, generation, tokens);
            } else {
                self.table.drained_tokens.add(core_id, id, now, tokens);
            }
        }
    }
}

impl Drop for InflightCredit<'_> {
    fn drop(&mut self) {
        self.prefill_done();
        let (core_id, id, generation) = (self.core_id, self.id, self.generation);
        self.table
            .resident_tokens
            .release(core_id, id, generation, self.resident);
        self.table.inflight_by_core[core_id][id.index()].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(cores: usize, n: usize) -> WorkerTable {
        let specs: Vec<_> = (0..n)
            .map(|i| WorkerSpec::resolve(&format!("http://127.0.0.1:{}", 40000 + i)).unwrap())
            .collect();
        WorkerTable::new(cores, &specs)
    }

    #[test]
    fn credits_sum_over_cores_and_release_on_drop() {
        let table = table(3, 2);
        let a = table.credit(0, WorkerId(1), 0);
        let b = table.credit(2, WorkerId(1), 0);
        let c = table.credit(1, WorkerId(0), 0);
        assert_eq!(table.inflight(WorkerId(1)), 2);
        assert_eq!(table.inflight(WorkerId(0)), 1);
        drop(a);
        assert_eq!(table.inflight(WorkerId(1)), 1);
        drop((b, c));
        assert_eq!(table.inflight(WorkerId(1)), 0);
        assert_eq!(table.inflight(WorkerId(0)), 0);
    }

    #[test]
    fn dispatched_counts_sum_over_cores_and_outlive_the_requests() {
        let table = table(3, 2);
        drop(table.credit(0, WorkerId(1), 0));
        drop(table.credit(2, WorkerId(1), 5));
        let open = table.credit(1, WorkerId(1), 0);
        drop(table.credit(1, WorkerId(0), 0));
        assert_eq!(table.dispatched(WorkerId(1)), 3);
        assert_eq!(table.dispatched(WorkerId(0)), 1);
        drop(open);
        // Unlike the in-flight count, ending a request does not take it back.
        assert_eq!(table.dispatched(WorkerId(1)), 3);
        assert_eq!(table.inflight(WorkerId(1)), 0);
    }

    #[test]
    fn token_credits_sum_over_cores_until_the_prefill_or_the_request_ends_or_a_report_lands() {
        let table = table(2, 2);
        let generation = |id: u16| table.signals(WorkerId(id)).load_generation();
        let queued = |id: u16| table.queued_tokens(WorkerId(id), generation(id));
        let resident = |id: u16| table.resident_tokens(WorkerId(id), generation(id));
        let report = |id: u16| {
            let report = crate::workers::load::LoadReport::default();
            table
                .signals(WorkerId(id))
                .set_load(Some(report), &Default::default());
        };
        let mut a = table.credit(0, WorkerId(1), 100);
        let b = table.credit(1, WorkerId(1), 50);
        let c = table.credit(0, WorkerId(1), 25);
        let d = table.credit(1, WorkerId(0), 9);
        assert_eq!((queued(1), resident(1)), (175, 175));
        assert_eq!((queued(0), resident(0)), (9, 9));
        a.prefill_done();
        assert_eq!(
            (queued(1), resident(1)),
            (75, 175),
            "decoding: resident, not queued"
        );
        assert_eq!(table.inflight(WorkerId(1)), 3);
        drop(a);
        assert_eq!((queued(1), resident(1)), (75, 75));
        // A report lands: it counts what is queued and resident, so older credits void.
        report(1);
        assert_eq!((queued(1), resident(1)), (0, 0));
        let e = table.credit(0, WorkerId(1), 10);
        assert_eq!((queued(1), resident(1)), (10, 10));
        // Requests credited under the old report end: nothing is taken from the new credits,
        // and both were still queued when the report landed, so they drained from its queue.
        drop((b, c));
        assert_eq!((queued(1), resident(1)), (10, 10));
        assert_eq!(table.drained_tokens(WorkerId(1), generation(1)), 75);
        drop(e);
        assert_eq!((queued(1), resident(1)), (0, 0));
        assert_eq!((queued(0), resident(0)), (9, 9));
        drop(d);
        assert_eq!((queued(0), resident(0)), (0, 0));
        assert_eq!(table.inflight(WorkerId(0)) + table.inflight(WorkerId(1)), 0);
    }

    #[test]
    fn a_failed_poll_keeps_the_credits_no_report_counted() {
        let table = table(1, 1);
        let signals = table.signals(WorkerId(0));
        let generation = || signals.load_generation();
        let queued = || table.queued_tokens(WorkerId(0), generation());
        let report = crate::workers::load::LoadReport::default();
        signals.set_load(Some(report.clone()), &Default::default());
        let credit = table.credit(0, WorkerId(0), 300);
        // The poll fails: the report is withdrawn, but nothing counted the 300 tokens since.
        signals.set_load(None, &Default::default());
        assert!(signals.load().is_none());
        assert_eq!(queued(), 300);
        // The next report counts them: the credit voids.
        signals.set_load(Some(report), &Default::default());
        assert_eq!(queued(), 0);
        drop(credit);
        assert_eq!(table.inflight(WorkerId(0)), 0);
    }

    #[test]
    fn roster_holds_exact_urls_and_header_lines() {
        let table = table(1, 2);
        let roster = table.roster();
        assert_eq!(roster.workers.len(), 2);
        let entry = roster.get(WorkerId(1)).unwrap();
        assert_eq!(entry.spec.url, "http://127.0.0.1:40001");
        assert_eq!(
            &*entry.routed_header_line,
            b"x-smg-routed-worker-id: http://127.0.0.1:40001\r\n"
        );
    }

    #[test]
    fn health_flips_per_slot() {
        let table = table(1, 2);
        assert!(table.is_healthy(WorkerId(0)));
        table.set_health(WorkerId(0), Health::Unhealthy);
        assert!(!table.is_healthy(WorkerId(0)));
        assert!(table.is_healthy(WorkerId(1)));
    }
}
