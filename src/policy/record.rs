//! Spec step 7, the router's third call ([`Router::record`], once the worker has the request)
//! and its message: [`RecordKey`], what the index learns from one dispatch ("the tree learns
//! from every dispatch"; the hash index records the worker at every head). A data core builds
//! it from the prepared request and the worker that took it; the control core inserts it
//! (`control::index_upkeep`). Its key is one shared copy ([`KeyData`]) that the
//! recent-dispatch map keeps too, and that a new leaf of the index may keep instead of copying
//! again.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::prepared::{IndexKey, Lookup, Prepared};
use super::Router;
use crate::ids::WorkerId;
use crate::index::kv::Provenance;
use crate::index::{self, LookupHint, Namespace, TokenKey};
use crate::limits::MODELS_MAX;

/// A dispatched routing key, shared by the dispatch record and the recent map (one copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyData {
    /// A text key (string tree).
    Text(Arc<str>),
    /// A token key (token tree): page hashes.
    Tokens(TokenKey),
    /// Heads (hash index): their hashes, shallowest first.
    Heads(Arc<[u64]>),
}

impl KeyData {
    /// Copies a request's key (into a buffer the index may keep: `index::token_key`).
    pub fn of(key: IndexKey<'_>) -> KeyData {
        match key {
            IndexKey::Text(text) => KeyData::Text(index::text_key(text)),
            IndexKey::Tokens(tokens) => KeyData::Tokens(index::token_key(tokens)),
            IndexKey::Heads(heads) => KeyData::Heads(heads.iter().map(|h| h.hash).collect()),
        }
    }
}

/// The key of one dispatch, for the index insert on the control core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordKey {
    /// Model and partition.
    pub namespace: Namespace,
    /// The routing key (text or page hashes).
    pub key: KeyData,
    /// The model's name, sent the first time a data core records the model (gauge labels).
    pub model_name: Option<Box<str>>,
    /// Where the data core's lookup of the key ended: the control core's insert starts there
    /// while the hint is still valid (it checks), instead of comparing the prefix again.
    pub hint: LookupHint,
    /// Whether the mesh may tell peers of this insert (`--enable-mesh`).
    pub mesh: MeshShare,
}

/// Whether a tree insert is broadcast to the mesh's peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MeshShare {
    /// Broadcast (a decision of the string or token tree).
    #[default]
    Broadcast,
    /// Kept local: the KV-pressure fallback's pick (the spec does not broadcast it).
    Local,
}

/// The model half of a namespace: a hash of the model id.
pub fn model_hash(model: &str) -> u64 {
    xxh3_64(model.as_bytes())
}

/// The dispatch record's key: the request's shared text itself when extraction built one (a
/// large body's text is not copied again), a copy of [`Prepared::index_key`] otherwise.
fn record_key(prepared: &Prepared) -> KeyData {
    match (prepared.index_key(), prepared.input.shared_text()) {
        (IndexKey::Text(_), Some(text)) => KeyData::Text(Arc::clone(text)),
        (key, _) => KeyData::of(key),
    }
}

/// The recent-dispatch map's key for a request routed on the KV-event index: its token pages
/// (that index is never recorded, so there is no record key).
fn blocks_key(prepared: &Prepared) -> KeyData {
    KeyData::of(IndexKey::Tokens(&prepared.pages))
}

impl Router {
    /// A cache miss's worker, remembered in this core's recent-dispatch map as soon as it is
    /// chosen. The record (step 7) comes only once the worker has the request, after its
    /// connection and its body's forwarding: a burst of the same new prefix that arrives in
    /// between would otherwise miss again and be placed on another worker (two requests of one
    /// new prompt 33 µs apart were, in `make demo`'s opening burst). On a hit the index already
    /// knows the prefix, so only misses are remembered early.
    pub(super) fn remember_miss(&mut self, prepared: &Prepared, worker: WorkerId) {
        let key = match prepared.lookup.as_ref() {
            Some(Lookup::Blocks(_)) => blocks_key(prepared),
            Some(Lookup::Tree { .. }) => record_key(prepared),
            Some(Lookup::Heads(heads)) if heads.len > 0 => record_key(prepared),
            Some(Lookup::Heads(_) | Lookup::Short) | None => return,
        };
        self.recent
            .push(prepared.namespace, key, worker, prepared.now_ms);
        prepared.remembered_for.set(Some(worker));
    }

    /// Step 7: the record the control core inserts for `worker`, which now has the request
    /// (cache_aware with a non-empty key only: other policies do not build the index). It is
    /// remembered in this core's recent-dispatch map too, for bursts the index has not learned,
    /// unless its decision already did ([`Router::remember_miss`]).
    pub fn record(
        &mut self,
        prepared: &Prepared,
        worker: WorkerId,
        tick_ms: u64,
    ) -> Option<RecordKey> {
        let hint = match prepared.lookup.as_ref()? {
            Lookup::Tree { hint, .. } => *hint,
            Lookup::Heads(heads) if heads.len > 0 => Default::default(),
            // No token IDs, or fewer than the smallest boundary: nothing to record.
            Lookup::Heads(_) | Lookup::Short => return None,
            // Step 7: only engine events change the KV-event index; this core remembers the
            // dispatch for the burst that may follow before the engine reports its blocks.
            Lookup::Blocks(_) => {
                self.remember_unless_decided(prepared, worker, tick_ms, || blocks_key(prepared));
                return None;
            }
        };
        let namespace = prepared.namespace;
        let model = namespace.model;
        let model_name = if self.announced_models.contains(&model)
            || self.announced_models.len() >= MODELS_MAX
        {
            None
        } else {
            self.announced_models.push(model);
            Some(Box::from(prepared.input.model()))
        };
        // Step 2's KV-pressure picks are inserted here but not broadcast to the mesh.
        let mesh = if prepared.kv_pressure_pick.get() == Some(worker) {
            MeshShare::Local
        } else {
            MeshShare::Broadcast
        };
        let record = RecordKey {
            namespace,
            key: record_key(prepared),
            model_name,
            hint,
            mesh,
        };
        self.remember_unless_decided(prepared, worker, tick_ms, || record.key.clone());
        Some(record)
    }

    /// The record's push into this core's recent-dispatch map, skipped when the decision already
    /// pushed this dispatch ([`Router::remember_miss`]).
    fn remember_unless_decided(
        &mut self,
        prepared: &Prepared,
        worker: WorkerId,
        tick_ms: u64,
        key: impl FnOnce() -> KeyData,
    ) {
        if prepared.remembered_for.get() != Some(worker) {
            self.recent.push(prepared.namespace, key(), worker, tick_ms);
        }
    }

    /// The block keys the KV-event index's in-flight overlay should count as `worker`'s while
    /// it has the request: those after the leading blocks its engine confirmed at the lookup,
    /// or all of them when some of those were only in flight (the control core passes over
    /// the ones its engine holds). `None`: the overlay is off, the request was not looked up
    /// in the KV-event index, or its engine holds it all.
    pub fn flight_keys(&self, prepared: &Prepared, worker: WorkerId) -> Option<Box<[u64]>> {
        self.config.kv_inflight_ttl?;
        let Some(Lookup::Blocks(blocks)) = prepared.lookup.as_ref() else {
            return None;
        };
        let confirmed = match blocks.held_by(worker) {
            (held, Provenance::Engine) => held as usize,
            (_, Provenance::InFlight) => 0,
        };
        let keys = prepared.chain.get(confirmed..)?;
        (!keys.is_empty()).then(|| Box::from(keys))
    }
}
