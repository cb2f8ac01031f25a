//! Spec step 7's message: [`RecordKey`], what the index learns from one dispatch ("the tree
//! learns from every dispatch"; the hash index records the worker at every head). A data core builds it from the prepared request and the worker
//! that took it; the control core inserts it (`control::index_upkeep`). Its key is one shared
//! copy ([`KeyData`]) that the recent-dispatch map keeps too, and that a new leaf of the index
//! may keep instead of copying again.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::prepared::IndexKey;
use crate::index::{self, LookupHint, Namespace, TokenKey};

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
