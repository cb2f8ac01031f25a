//! The KV-event index's in-flight overlay: blocks of requests the gateway dispatched, held
//! provisionally by their worker until its engine's events confirm them or the request ends.
//!
//! The engines publish a prompt's blocks only once their prefill has stored them; a follow-up
//! turn that arrives before then (an overloaded fleet) would find nothing in the engines'
//! truth. The trees record the gateway's own dispatches; the KV-event index must not (the spec:
//! only engine events change it), so the dispatches go here instead, beside it: a second
//! [`SlotTable`] of the same shape (block key, holder bits by the same publisher bits) that
//! [`KvIndexReader::lookup`](super::KvIndexReader::lookup) reads with the engines' table, one
//! `or` per block, and marks which holders it counted on the overlay alone (provisional
//! predictions, `kvgate_kv_event_predictions_total{basis}`).
//!
//! [`Flights`] is the writer's bookkeeping, on the control core only: each dispatched request
//! ([`FlightId`]) with its worker's bit and the keys it claimed, and per `(key, bit)` how many
//! flights claim it (shared prefixes: a bit goes only when the last of them lets go). A claim
//! ends when
//! - the engine stores the block for that worker (confirmed: the engines' table holds it now),
//! - its request fails, is aborted or times out ([`FlightEnd::Failed`]),
//! - its request ended well but the engine has not confirmed within `KV_INFLIGHT_CONFIRM_GRACE`
//!   (the engine evicted it at once, or its events are lost: a wrong prediction must not last),
//! - it is older than the overlay's TTL (`--kv-inflight-ttl-secs`: the end was never heard),
//! - or its worker is detached (removed, or stopped publishing).
//!
//! Known imprecision: a claim confirmed and then evicted by the engine may be claimed again by
//! a later flight on the same worker; when the earlier flight ends it releases that claim
//! early. An early release costs a prediction, never a wrong one.

use std::collections::HashMap;

use super::super::slots::{Probe, SlotTable};
use super::{SLOTS_PER_BLOCKS_DEN, SLOTS_PER_BLOCKS_NUM};
use crate::limits::{KV_INFLIGHT_BLOCKS_MAX, KV_INFLIGHT_CONFIRM_GRACE, KV_INFLIGHT_FLIGHTS_MAX};
use std::sync::atomic::{AtomicU64, Ordering};

/// A dispatched request as the overlay knows it: its data core and that core's sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlightId(pub u64);

/// How a dispatched request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightEnd {
    /// The worker answered whole: its engine holds the prompt, and says so in its events soon.
    Answered,
    /// A failure, abort or timeout: the engine may never have stored the prompt.
    Failed,
}

/// What a dispatch added to the overlay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlightStats {
    /// Blocks the worker now holds provisionally that it did not.
    pub claimed: u64,
    /// Blocks its engine already holds (nothing to claim).
    pub confirmed: u64,
    /// Blocks not claimed: the overlay holds its most blocks or flights.
    pub refused: u64,
}

/// One dispatched request's claims.
#[derive(Debug)]
struct Flight {
    bit: u8,
    keys: Box<[u64]>,
    /// Gateway milliseconds after which its claims go.
    expires_ms: u64,
}

/// The overlay's table as the readers see it (owned by `BlockHolders`).
#[derive(Debug)]
pub(super) struct Provisional {
    pub(super) table: SlotTable<2>,
    /// Keys in the table: readers skip it while 0.
    pub(super) live: AtomicU64,
}

impl Provisional {
    pub(super) fn new(blocks_max: usize) -> Self {
        Provisional {
            // Sized as the engines' table, for the same load and probe runs.
            table: SlotTable::new(blocks_max * SLOTS_PER_BLOCKS_NUM / SLOTS_PER_BLOCKS_DEN + 1),
            live: AtomicU64::new(0),
        }
    }

    /// The provisional holder bits of `key` (0 when the overlay is empty).
    pub(super) fn holders(&self, key: u64) -> u64 {
        if self.live.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.table.read(key).map_or(0, |words| words[1])
    }
}

/// The writer's side of the overlay (on the control core).
#[derive(Debug)]
pub(super) struct Flights {
    flights: HashMap<FlightId, Flight>,
    /// `(key, bit)`: flights claiming the block for that worker.
    claims: HashMap<(u64, u8), u32>,
    ttl_ms: u64,
    blocks_max: usize,
}

impl Flights {
    pub(super) fn new(ttl_ms: u64, blocks_max: usize) -> Self {
        Flights {
            flights: HashMap::new(),
            claims: HashMap::new(),
            ttl_ms,
            blocks_max: blocks_max.min(KV_INFLIGHT_BLOCKS_MAX),
        }
    }

    /// Requests in flight.
    pub(super) fn len(&self) -> usize {
        self.flights.len()
    }

    /// Distinct `(block, worker)` claims.
    pub(super) fn claims(&self) -> usize {
        self.claims.len()
    }

    /// Flight `id` went to the worker of `bit` with the block keys `keys`; `confirmed(key)`
    /// says whether its engine already holds one.
    pub(super) fn start(
        &mut self,
        table: &Provisional,
        id: FlightId,
        bit: u8,
        keys: &[u64],
        now_ms: u64,
        confirmed: impl Fn(u64) -> bool,
    ) -> FlightStats {
        let mut stats = FlightStats::default();
        if self.flights.len() >= KV_INFLIGHT_FLIGHTS_MAX || self.flights.contains_key(&id) {
            stats.refused = keys.len() as u64;
            return stats;
        }
        let mut claimed = Vec::with_capacity(keys.len());
        for (i, &key) in keys.iter().enumerate() {
            if confirmed(key) {
                stats.confirmed += 1;
                continue;
            }
            if !self.claim(table, key, bit) {
                // The rest of the prompt hangs off a block the overlay could not hold.
                stats.refused += (keys.len() - i) as u64;
                break;
            }
            claimed.push(key);
            stats.claimed += 1;
        }
        let flight = Flight {
            bit,
            keys: claimed.into_boxed_slice(),
            expires_ms: now_ms.saturating_add(self.ttl_ms),
        };
        self.flights.insert(id, flight);
        stats
    }

    /// Flight `id` ended: failed ones let go now, answered ones within the confirm grace.
    pub(super) fn end(&mut self, table: &Provisional, id: FlightId, end: FlightEnd, now_ms: u64) {
        match end {
            FlightEnd::Failed => {
                if let Some(flight) = self.flights.remove(&id) {
                    self.release(table, &flight);
                }
            }
            FlightEnd::Answered => {
                if let Some(flight) = self.flights.get_mut(&id) {
                    let grace = KV_INFLIGHT_CONFIRM_GRACE.as_millis() as u64;
                    flight.expires_ms = flight.expires_ms.min(now_ms.saturating_add(grace));
                }
            }
        }
    }

    /// Lets go of every flight past its time; returns how many.
    pub(super) fn expire(&mut self, table: &Provisional, now_ms: u64) -> usize {
        let expired: Vec<FlightId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.expires_ms <= now_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(flight) = self.flights.remove(id) {
                self.release(table, &flight);
            }
        }
        expired.len()
    }

    /// The engine of `bit` stored `key`: its claim is the engines' truth now.
    pub(super) fn confirm(&mut self, table: &Provisional, key: u64, bit: u8) {
        if self.claims.remove(&(key, bit)).is_some() {
            clear_bit(table, key, bit);
        }
    }

    /// The worker of `bit` is gone: every flight of it lets go.
    pub(super) fn drop_worker(&mut self, table: &Provisional, bit: u8) {
        let gone: Vec<FlightId> = self
            .flights
            .iter()
            .filter(|(_, f)| f.bit == bit)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(flight) = self.flights.remove(&id) {
                self.release(table, &flight);
            }
        }
    }

    /// Counts one more flight on `(key, bit)`, setting the bit if it is the first; `false`:
    /// the overlay holds its most blocks.
    fn claim(&mut self, table: &Provisional, key: u64, bit: u8) -> bool {
        if let Some(count) = self.claims.get_mut(&(key, bit)) {
            *count += 1;
            return true;
        }
        let mask = 1u64 << bit;
        match table.table.probe(key) {
            Probe::Found(slot) => {
                let holders = &table.table.words(slot)[1];
                holders.store(holders.load(Ordering::Relaxed) | mask, Ordering::Release);
            }
            Probe::Vacant(slot)
                if (table.live.load(Ordering::Relaxed) as usize) < self.blocks_max =>
            {
                table.table.insert(slot, key, &[mask]);
                table.live.fetch_add(1, Ordering::Release);
            }
            Probe::Vacant(_) | Probe::RunFull => return false,
        }
        self.claims.insert((key, bit), 1);
        true
    }

    fn release(&mut self, table: &Provisional, flight: &Flight) {
        for &key in flight.keys.iter() {
            let entry = (key, flight.bit);
            match self.claims.get_mut(&entry) {
                Some(count) if *count > 1 => *count -= 1,
                Some(_) => {
                    self.claims.remove(&entry);
                    clear_bit(table, key, flight.bit);
                }
                // Confirmed meanwhile.
                None => {}
            }
        }
    }
}

/// Takes `bit` out of `key`'s provisional holders; a key nobody holds leaves the table.
fn clear_bit(table: &Provisional, key: u64, bit: u8) {
    let Probe::Found(slot) = table.table.probe(key) else {
        return;
    };
    let holders = &table.table.words(slot)[1];
    let left = holders.load(Ordering::Relaxed) & !(1u64 << bit);
    if left == 0 {
        table.table.remove(slot, |_, _| {});
        table.live.fetch_sub(1, Ordering::Release);
    } else {
        holders.store(left, Ordering::Release);
    }
}
