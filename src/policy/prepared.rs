//! [`Prepared`]: one request prepared for routing, once. The router fills it from the request's
//! body and routing headers (`Router::prepare`) and every later step reads it: each attempt's
//! worker selection (a retry selects again from the same value: nothing is parsed twice), the
//! dispatch credit, and the record the index learns from (spec step 7, `record.rs`, which
//! reads it; it reads nothing of the record).
//!
//! It holds the routing input (model, token IDs or text, partition, hashing headers), the cache
//! namespace, the page hashes of token IDs (and, in hash mode, the heads they make), and the
//! index lookup. It lives in the client connection's storage and keeps its buffers' capacity
//! from one request to the next, so the steady state does not allocate;
//! [`Prepared::shed_large_buffers`] bounds what an idle connection keeps.

use std::cell::Cell;

use super::simple::PREFIX_HASH_CHARS_PER_TOKEN;
use crate::ids::WorkerId;
use crate::index::hash::{Head, HeadMatch};
use crate::index::kv::BlockMatch;
use crate::index::{LookupHint, Namespace, TokenPages, TreeMatch};
use crate::limits::READ_BUF_BYTES_RETAINED_MAX;
use crate::request::{RoutingInput, RoutingKey};

/// A request's key as the index compares it: its text, or its token IDs' page hashes.
#[derive(Clone, Copy, Debug)]
pub enum IndexKey<'a> {
    /// Text (string tree).
    Text(&'a str),
    /// Page hashes of token IDs (token tree).
    Tokens(&'a TokenPages),
    /// The heads of token IDs at each boundary they reach, shallowest first (hash index).
    Heads(&'a [Head]),
}

/// What the index knows of a prepared request's prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The string or token tree.
    Tree {
        /// How much of the key matched and which workers hold that much (merged with this
        /// core's recent dispatches on a miss).
        matched: TreeMatch,
        /// Where the lookup ended, for the control core's insert (never the recent map's).
        hint: LookupHint,
    },
    /// The hash index: every head's live holders, deepest first (merged with this core's recent
    /// dispatches when no head has one). No head at all: the request had no token IDs.
    Heads(HeadMatch),
    /// Hash mode, token IDs shorter than the smallest boundary: load-balanced, not recorded.
    Short,
    /// The KV-event index: the workers holding the request's first block and how many leading
    /// blocks each holds. Never recorded: only engine events change that index.
    Blocks(BlockMatch),
}

/// One request, prepared for routing. See the module documentation.
#[derive(Debug, Default)]
pub struct Prepared {
    pub(super) input: RoutingInput,
    pub(super) namespace: Namespace,
    /// The page hashes of the key's token IDs; for a text key, its text's pages when they were
    /// looked up among those peers shared (`peer_text.rs`; otherwise not read).
    pub(super) pages: TokenPages,
    /// Hash mode: the heads of the token IDs, shallowest first.
    pub(super) heads: Vec<Head>,
    /// KV-event routing: the index keys of the token IDs' blocks.
    pub(super) chain: Vec<u64>,
    /// The index lookup (cache_aware with a non-empty key only).
    pub(super) lookup: Option<Lookup>,
    /// The gateway tick at preparation: the clock of the recent-dispatch map and placements.
    pub(super) now_ms: u64,
    /// Whether a decision for this request was counted in the branch counter: a retry selects
    /// again, but the request counts once (its first decision), as in SMG.
    pub(super) decision_counted: Cell<bool>,
    /// The worker the last decision picked under KV pressure (step 2), if it did: that
    /// dispatch's insert stays local (the spec does not broadcast KV-pressure inserts).
    pub(super) kv_pressure_pick: Cell<Option<WorkerId>>,
    /// The worker a cache miss's decision remembered this request for in the core's
    /// recent-dispatch map ([`Router::remember_miss`](super::Router::remember_miss)), so that
    /// its record does not push it again.
    pub(super) remembered_for: Cell<Option<WorkerId>>,
}

impl Prepared {
    /// The request's `model` field (empty when absent).
    pub fn model(&self) -> &str {
        self.input.model()
    }

    /// The routing input: key, partition, hashing headers.
    pub fn input(&self) -> &RoutingInput {
        &self.input
    }

    /// The request's cache namespace (model and partition).
    pub fn namespace(&self) -> Namespace {
        self.namespace
    }

    /// The index lookup, if the request was looked up.
    pub fn lookup(&self) -> Option<&Lookup> {
        self.lookup.as_ref()
    }

    /// The prompt tokens a dispatch of this request credits to its worker: token IDs counted,
    /// text estimated at [`PREFIX_HASH_CHARS_PER_TOKEN`] bytes per token.
    pub fn request_tokens(&self) -> u64 {
        prompt_tokens(self.input.key())
    }

    /// The prompt tokens the index says `worker` has cached (0: no prediction): the matched
    /// whole pages when the token tree lists it as a tenant of the matched prefix, its leading
    /// blocks when the KV-event index lists it. Text and hash-mode requests predict nothing.
    pub fn predicted_cached_tokens(&self, worker: WorkerId) -> u32 {
        match &self.lookup {
            Some(Lookup::Tree { matched, .. })
                if matches!(self.input.key(), RoutingKey::Tokens(_))
                    && matched.tenants().contains(&worker) =>
            {
                matched.matched_len
            }
            Some(Lookup::Blocks(blocks)) => {
                let held = blocks.holders().iter().find(|(w, _)| *w == worker);
                held.map_or(0, |(_, n)| n.saturating_mul(blocks.block_size))
            }
            _ => 0,
        }
    }

    /// The key as the index mode compares it.
    pub fn index_key(&self) -> IndexKey<'_> {
        match self.input.key() {
            RoutingKey::Text(text) => IndexKey::Text(text),
            RoutingKey::Tokens(_) if !self.heads.is_empty() => IndexKey::Heads(&self.heads),
            RoutingKey::Tokens(_) => IndexKey::Tokens(&self.pages),
        }
    }

    /// Drops buffers that grew past what a connection keeps between requests (the bound of its
    /// read buffer: one large prompt should not pin memory for the life of the connection).
    pub fn shed_large_buffers(&mut self) {
        let heads = self.heads.capacity() * std::mem::size_of::<Head>();
        let chain = self.chain.capacity() * std::mem::size_of::<u64>();
        let retained = self.input.retained_bytes() + self.pages.retained_bytes() + heads + chain;
        if retained > READ_BUF_BYTES_RETAINED_MAX {
            *self = Prepared::default();
        }
        self.input.release_shared_text();
    }
}

/// The prompt tokens of a routing key: token IDs counted, text estimated at
/// [`PREFIX_HASH_CHARS_PER_TOKEN`] bytes per token.
pub(super) fn prompt_tokens(key: RoutingKey<'_>) -> u64 {
    match key {
        RoutingKey::Tokens(tokens) => tokens.len() as u64,
        RoutingKey::Text(text) => (text.len() / PREFIX_HASH_CHARS_PER_TOKEN) as u64,
    }
}
