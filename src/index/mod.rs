//! The prefix index: string tree (characters), token tree (whole pages of `--block-size`
//! tokens, each page stored as one 64-bit hash of its ids: [`TokenPages`]), keyed by model and
//! partition namespace, and the hash index of `--cache-index hash` ([`hash`]: request heads at
//! fixed token positions, with TTL'd holders). Data cores read them lock-free; only the control
//! core writes them.
//!
//! - [`IndexWriter`] (one, on the control core): `insert_text`, `insert_tokens`, `remove_worker`,
//!   `evict`, `reclaim`, `gauges`. It is the only owner of the trees' bookkeeping.
//! - [`IndexReader`] (one per data core, `Clone + Send`, each with its own epoch slot):
//!   `lookup_text`, `lookup_tokens` and `quiesce`, which a data core calls once per event-loop
//!   turn. A lookup takes no lock, allocates nothing and writes only its own epoch slot.
//! - Errors ([`IndexError`]) are capacity limits the writer reports; the control core counts
//!   them and drops the record (routing stays correct, only affinity is lost).
//!
//! Layout: `raw` holds every `unsafe` block (reclamation, slab, published tables, shared label
//! buffers), `tree` the walk and the copy-on-write writer (one file per job under `tree/`:
//! `walk`, `insert`, `split`, `merge`, `eviction`, `purge`, with `nodes`, `children` and
//! `namespaces` beneath them), `entries` the writer's recency lists, `keys` the unit rules
//! (characters, pages). [`IndexWriter`] and its readers share one `PublishedTrees`.

#![deny(unsafe_code)]

mod entries;
pub mod hash;
mod keys;
pub mod kv;
mod raw;
mod slots;
mod tree;

use std::sync::{Arc, Mutex};

use crate::ids::WorkerId;
use crate::limits::{MATCH_TENANTS_MAX, MODELS_MAX};
pub use keys::{
    common_prefix, count_chars, page_hash, text_page_hash, TokenPages, TEXT_PAGE_BYTES,
};
use keys::{PageKeys, TextKeys};
use raw::{Domain, Guard, ReaderSlot, RetireList, WriterToken};
pub use raw::{TextWriter, READERS_MAX};
pub use tree::{HintCounts, KindGauges, KindMemory, LookupHint, KEY_ELEMENTS_MAX, NAMESPACES_MAX};
use tree::{Key, SharedTree, TreeWriter, WriteCtx};

// A lookup returns the tenants a node keeps in most-recently-used order.
const _: () = assert!(MATCH_TENANTS_MAX == raw::MRU_LEN);
// Every data core reads the index through a reader of its own.
const _: () = assert!(crate::limits::DATA_CORES_MAX <= READERS_MAX);

/// Retired items after which an insert reclaims on its own (the control core also calls
/// `reclaim` every turn); a bound on memory held by retired tables when nobody calls it.
const RETIRED_RECLAIM_AFTER: usize = 4096;

/// Default `--max-tree-size`: units (characters or tokens) per model and tree kind, counted once
/// per holding worker.
pub const MAX_TREE_SIZE_DEFAULT: u64 = 67_108_864;

/// What a lookup found: how much of the request matched and who holds that prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TreeMatch {
    /// Matched length: characters for the string tree, whole-page tokens for the token tree.
    pub matched_len: u32,
    /// The request's length in the same unit (characters, or tokens).
    pub request_len: u32,
    /// Tenants of the deepest matched node, most recently used first; `tenants_len` are valid.
    pub tenants: [WorkerId; MATCH_TENANTS_MAX],
    /// How many entries of `tenants` are valid.
    pub tenants_len: u8,
}

impl TreeMatch {
    /// The valid tenants, most recently used first.
    pub fn tenants(&self) -> &[WorkerId] {
        &self.tenants[..usize::from(self.tenants_len)]
    }

    /// Matched length over request length, 0 for an empty request.
    pub fn ratio(&self) -> f64 {
        if self.request_len == 0 {
            0.0
        } else {
            f64::from(self.matched_len) / f64::from(self.request_len)
        }
    }
}

/// A cache namespace: the model and the hash of the request's partition fields (0 = none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace {
    /// Hash of the model id.
    pub model: u64,
    /// Hash of cache_salt / extra_key / LoRA adapter; 0 when the request has none.
    pub partition: u64,
}

/// The two tree kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TreeKind {
    /// The string tree (characters).
    Text,
    /// The token tree (whole pages of tokens).
    Tokens,
}

/// A capacity limit the writer hit; the record is dropped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// Every reader slot is taken.
    #[error("all {READERS_MAX} index reader slots are taken")]
    ReadersExhausted,
    /// The node slab is full.
    #[error("the index node slab is full")]
    NodesExhausted,
    /// Too many live namespaces.
    #[error("more than {NAMESPACES_MAX} live cache namespaces")]
    NamespacesExhausted,
    /// Too many models.
    #[error("more than {MODELS_MAX} models in the index")]
    ModelsExhausted,
    /// A worker id above `WORKERS_MAX`.
    #[error("worker id {0:?} is outside the worker table")]
    WorkerOutOfRange(WorkerId),
    /// `--block-size` 0.
    #[error("the token tree needs a block size of at least 1")]
    BlockSizeZero,
    /// Token pages hashed with another block size than the index's.
    #[error("token pages of {0} ids each, not the index's block size")]
    BlockSizeMismatch(usize),
    /// The writer of this index was already taken.
    #[error("the index already has its writer")]
    WriterTaken,
}

/// One entry removed by eviction, for checkers: the worker no longer holds `key[kept_len..]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// Which tree.
    pub kind: TreeKind,
    /// The namespace of the tree.
    pub namespace: Namespace,
    /// The worker whose entry went.
    pub worker: WorkerId,
    /// The full key of the evicted node (bytes of text, or page hashes), from the root.
    pub key: Vec<u64>,
    /// Elements of `key` the worker still holds (the node's parent depth).
    pub kept_len: usize,
}

/// Index settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexConfig {
    /// Tokens per page of the token tree (`--block-size`).
    pub block_size: u32,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self { block_size: 16 }
    }
}

/// Per-model gauges: `smg_cache_tree_chars`, `smg_cache_tree_tokens`, `smg_cache_tree_tenants`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelGauges {
    /// Model id hash.
    pub model: u64,
    /// The string tree.
    pub string: KindGauges,
    /// The token tree.
    pub token: KindGauges,
}

/// Totals of an eviction pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictStats {
    /// Entries removed.
    pub entries: u64,
    /// Units removed (characters plus tokens).
    pub units: u64,
}

/// Memory of both trees, counted in their arenas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexMemory {
    /// The string tree.
    pub string: KindMemory,
    /// The token tree.
    pub token: KindMemory,
}

/// What the writer publishes and every reader walks: both trees, their reclamation domain
/// (readers' epochs, the writer's token), the token tree's block size, and the retired lists
/// of writers that went before their readers (freed when the last handle drops).
#[derive(Debug)]
struct PublishedTrees {
    domain: Domain,
    text: SharedTree<u8>,
    tokens: SharedTree<u64>,
    block_size: usize,
    orphans: Mutex<Vec<(RetireList, RetireList)>>,
}

impl Drop for PublishedTrees {
    fn drop(&mut self) {
        let orphans = self
            .orphans
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for (mut text, mut tokens) in orphans {
            text.drain_all(&mut self.text.slab);
            tokens.drain_all(&mut self.tokens.slab);
        }
    }
}

/// The control core's handle: the only writer of the index.
#[derive(Debug)]
pub struct IndexWriter {
    trees: Arc<PublishedTrees>,
    token: WriterToken,
    text: TreeWriter<TextKeys>,
    tokens: TreeWriter<PageKeys>,
}

impl IndexWriter {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Result<Self, IndexError> {
        if config.block_size == 0 {
            return Err(IndexError::BlockSizeZero);
        }
        let block_size = config.block_size as usize;
        let trees = Arc::new(PublishedTrees {
            domain: Domain::default(),
            text: SharedTree::default(),
            tokens: SharedTree::default(),
            block_size,
            orphans: Mutex::new(Vec::new()),
        });
        let token = trees.domain.take_writer().ok_or(IndexError::WriterTaken)?;
        let text = TreeWriter::new(TextKeys);
        let tokens = TreeWriter::new(PageKeys { block_size });
        Ok(Self {
            trees,
            token,
            text,
            tokens,
        })
    }

    /// A new reader handle with its own epoch slot (one per data core).
    pub fn reader(&self) -> Result<IndexReader, IndexError> {
        IndexReader::register(&self.trees)
    }

    /// Tokens per page of the token tree (`--block-size`): the block size of its `TokenPages`.
    pub fn block_size(&self) -> usize {
        self.trees.block_size
    }

    /// Records that `worker` was sent `text` in namespace `ns` at `tick`.
    pub fn insert_text(
        &mut self,
        ns: Namespace,
        text: &str,
        worker: WorkerId,
        tick: u64,
    ) -> Result<(), IndexError> {
        self.insert_text_hinted(ns, text, worker, tick, &LookupHint::default())
    }

    /// `insert_text` of a key a reader looked up (`lookup_text_hinted`): the insert starts
    /// where the lookup ended while its hint is still valid, else walks from the root.
    pub fn insert_text_hinted(
        &mut self,
        ns: Namespace,
        text: &str,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        let key = Key::borrowed(text.as_bytes());
        self.insert_text_key(ns, key, worker, tick, hint)
    }

    /// `insert_text_hinted` of a text held in a shared buffer (the dispatch record's key): a
    /// new leaf that is at least half of the text keeps a reference to it instead of a copy of
    /// its part.
    pub fn insert_text_shared(
        &mut self,
        ns: Namespace,
        text: &Arc<str>,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        let bytes: Arc<[u8]> = Arc::from(Arc::clone(text));
        self.insert_text_key(ns, Key::shared(&bytes), worker, tick, hint)
    }

    fn insert_text_key(
        &mut self,
        ns: Namespace,
        key: Key<'_, u8>,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        let ctx = WriteCtx {
            tree: &self.trees.text,
            domain: &self.trees.domain,
            token: &self.token,
        };
        let inserted = self.text.insert(&ctx, ns, key, worker, tick, hint);
        self.reclaim_when_many_retired();
        inserted
    }

    /// Records that `worker` was sent `tokens` (whole pages only) in namespace `ns` at `tick`
    /// (hashes their pages first; a dispatch record's key is hashed on the data core).
    pub fn insert_tokens(
        &mut self,
        ns: Namespace,
        tokens: &[u32],
        worker: WorkerId,
        tick: u64,
    ) -> Result<(), IndexError> {
        let pages = TokenPages::of(tokens, self.trees.block_size);
        self.insert_tokens_hinted(ns, &pages, worker, tick, &LookupHint::default())
    }

    /// `insert_tokens` of a key a reader looked up (`lookup_tokens_hinted`); see
    /// `insert_text_hinted`.
    pub fn insert_tokens_hinted(
        &mut self,
        ns: Namespace,
        tokens: &TokenPages,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        let key = Key::borrowed(tokens.pages());
        self.insert_tokens_key(ns, key, tokens.block_size(), worker, tick, hint)
    }

    /// `insert_tokens_hinted` of tokens held in a shared buffer (the dispatch record's key);
    /// see `insert_text_shared`.
    pub fn insert_tokens_shared(
        &mut self,
        ns: Namespace,
        tokens: &TokenKey,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        let key = Key::shared(&tokens.pages);
        self.insert_tokens_key(ns, key, tokens.block_size, worker, tick, hint)
    }

    /// Inserts page hashes computed with `block_size` ids per page (refused unless the index's).
    fn insert_tokens_key(
        &mut self,
        ns: Namespace,
        key: Key<'_, u64>,
        block_size: usize,
        worker: WorkerId,
        tick: u64,
        hint: &LookupHint,
    ) -> Result<(), IndexError> {
        if block_size != self.trees.block_size {
            return Err(IndexError::BlockSizeMismatch(block_size));
        }
        let ctx = WriteCtx {
            tree: &self.trees.tokens,
            domain: &self.trees.domain,
            token: &self.token,
        };
        let inserted = self.tokens.insert(&ctx, ns, key, worker, tick, hint);
        self.reclaim_when_many_retired();
        inserted
    }

    fn reclaim_when_many_retired(&mut self) {
        if self.pending_reclaim() >= RETIRED_RECLAIM_AFTER {
            self.reclaim();
        }
    }

    /// Purges `worker` from every tree now; returns the entries removed.
    pub fn remove_worker(&mut self, worker: WorkerId) -> u64 {
        let trees = &self.trees;
        let text = WriteCtx {
            tree: &trees.text,
            domain: &trees.domain,
            token: &self.token,
        };
        let mut removed = self.text.remove_worker(&text, worker);
        let tokens = WriteCtx {
            tree: &trees.tokens,
            domain: &trees.domain,
            token: &self.token,
        };
        removed += self.tokens.remove_worker(&tokens, worker);
        self.reclaim();
        removed
    }

    /// Evicts least-recently-used leaf entries of every model tree over `budget` units
    /// (`--max-tree-size`) until each is within budget; no walk of the trees.
    pub fn evict(&mut self, budget: u64) -> EvictStats {
        self.evict_observed(budget, &mut None)
    }

    /// `evict`, reporting each removed entry to `report` (for checkers).
    pub fn evict_observed(
        &mut self,
        budget: u64,
        report: &mut Option<&mut dyn FnMut(Evicted)>,
    ) -> EvictStats {
        let trees = &self.trees;
        let text = WriteCtx {
            tree: &trees.text,
            domain: &trees.domain,
            token: &self.token,
        };
        let (entries, units) = self.text.evict(&text, budget, report);
        let tokens = WriteCtx {
            tree: &trees.tokens,
            domain: &trees.domain,
            token: &self.token,
        };
        let (more_entries, more_units) = self.tokens.evict(&tokens, budget, report);
        self.reclaim();
        EvictStats {
            entries: entries + more_entries,
            units: units + more_units,
        }
    }

    /// Frees retired memory every reader has passed; returns the items freed.
    pub fn reclaim(&mut self) -> usize {
        let trees = &self.trees;
        let text = self
            .text
            .reclaim(&trees.text, &trees.domain, &mut self.token);
        text + self
            .tokens
            .reclaim(&trees.tokens, &trees.domain, &mut self.token)
    }

    /// How inserts of both trees used their lookup hints (tests, debugging).
    pub fn hint_counts(&self) -> HintCounts {
        let (text, tokens) = (self.text.hint_counts(), self.tokens.hint_counts());
        HintCounts {
            followed: text.followed + tokens.followed,
            stale: text.stale + tokens.stale,
        }
    }

    /// Retired items still waiting for a reader to pass a quiescent state.
    pub fn pending_reclaim(&self) -> usize {
        self.text.pending_reclaim() + self.tokens.pending_reclaim()
    }

    /// Per-model gauges of both trees.
    pub fn gauges(&self) -> Vec<ModelGauges> {
        let mut out: Vec<ModelGauges> = Vec::new();
        for (model, string) in self.text.gauges() {
            out.push(ModelGauges {
                model,
                string,
                ..ModelGauges::default()
            });
        }
        for (model, token) in self.tokens.gauges() {
            match out.iter_mut().find(|gauges| gauges.model == model) {
                Some(gauges) => gauges.token = token,
                None => out.push(ModelGauges {
                    model,
                    token,
                    ..ModelGauges::default()
                }),
            }
        }
        out
    }

    /// Memory held by both trees, counted in their arenas.
    pub fn memory(&self) -> IndexMemory {
        IndexMemory {
            string: self.text.memory(),
            token: self.tokens.memory(),
        }
    }

    /// A lookup on the writer's own view (the control core, tests).
    pub fn lookup_text(&self, ns: Namespace, text: &str) -> TreeMatch {
        lookup_text(&self.trees, &self.token.guard(), ns, text).0
    }

    /// A token lookup on the writer's own view.
    pub fn lookup_tokens(&self, ns: Namespace, tokens: &TokenPages) -> TreeMatch {
        lookup_tokens(&self.trees, &self.token.guard(), ns, tokens).0
    }

    /// `lookup_tokens` with the hint for an insert of the same key (tests).
    pub fn lookup_tokens_hinted(
        &self,
        ns: Namespace,
        tokens: &TokenPages,
    ) -> (TreeMatch, LookupHint) {
        lookup_tokens(&self.trees, &self.token.guard(), ns, tokens)
    }
}

impl Drop for IndexWriter {
    fn drop(&mut self) {
        self.reclaim();
        let lists = (self.text.take_retired(), self.tokens.take_retired());
        if let Ok(mut orphans) = self.trees.orphans.lock() {
            orphans.push(lists);
        }
    }
}

/// A data core's read handle. Cloning registers a new epoch slot (panics past `READERS_MAX`
/// handles: a configuration error caught at startup; use `try_clone` to handle it).
#[derive(Debug)]
pub struct IndexReader {
    trees: Arc<PublishedTrees>,
    slot: ReaderSlot,
}

// The handle moves to its data core; it is not `Sync` (the slot's online flag is a `Cell`).
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<IndexReader>();
};

impl IndexReader {
    fn register(trees: &Arc<PublishedTrees>) -> Result<Self, IndexError> {
        let slot = trees
            .domain
            .claim_reader()
            .ok_or(IndexError::ReadersExhausted)?;
        Ok(Self {
            trees: Arc::clone(trees),
            slot,
        })
    }

    /// A new handle with its own slot, or an error when every slot is taken.
    pub fn try_clone(&self) -> Result<Self, IndexError> {
        Self::register(&self.trees)
    }

    /// Enters a read-side section: references borrowed from the guard stay valid until it is
    /// dropped, and `quiesce` cannot be called meanwhile.
    pub fn guard(&self) -> ReadGuard<'_> {
        ReadGuard {
            trees: &self.trees,
            guard: self.trees.domain.guard(&self.slot),
        }
    }

    /// Longest-prefix match of `text` in namespace `ns` (string tree).
    pub fn lookup_text(&self, ns: Namespace, text: &str) -> TreeMatch {
        self.guard().lookup_text(ns, text)
    }

    /// Longest whole-page match of `tokens` in namespace `ns` (token tree).
    pub fn lookup_tokens(&self, ns: Namespace, tokens: &TokenPages) -> TreeMatch {
        self.guard().lookup_tokens(ns, tokens)
    }

    /// `lookup_text`, with the hint a dispatch record of the same key carries to the writer
    /// (`IndexWriter::insert_text_hinted`).
    pub fn lookup_text_hinted(&self, ns: Namespace, text: &str) -> (TreeMatch, LookupHint) {
        let guard = self.guard();
        lookup_text(guard.trees, &guard.guard, ns, text)
    }

    /// `lookup_tokens`, with the hint for `IndexWriter::insert_tokens_hinted`.
    pub fn lookup_tokens_hinted(
        &self,
        ns: Namespace,
        tokens: &TokenPages,
    ) -> (TreeMatch, LookupHint) {
        let guard = self.guard();
        lookup_tokens(guard.trees, &guard.guard, ns, tokens)
    }

    /// Tokens per page of the token tree: the block size to hash a request's `TokenPages` with.
    pub fn block_size(&self) -> usize {
        self.trees.block_size
    }

    /// Announces that this core holds no index reference (once per event-loop turn): one load
    /// and, when the epoch moved, one store to this core's own cache line.
    pub fn quiesce(&mut self) {
        self.trees.domain.quiesce(&mut self.slot);
    }

    /// Takes this core out of reclamation while it idles; the next lookup brings it back.
    pub fn go_offline(&mut self) {
        self.trees.domain.go_offline(&mut self.slot);
    }
}

impl Clone for IndexReader {
    fn clone(&self) -> Self {
        match self.try_clone() {
            Ok(reader) => reader,
            Err(error) => panic!("cloning an index reader: {error}"),
        }
    }
}

impl Drop for IndexReader {
    fn drop(&mut self) {
        self.trees.domain.release_reader(&self.slot);
    }
}

/// A read-side section of one reader; see [`IndexReader::guard`].
#[derive(Debug)]
pub struct ReadGuard<'r> {
    trees: &'r PublishedTrees,
    guard: Guard<'r>,
}

impl ReadGuard<'_> {
    /// Longest-prefix match of `text` in namespace `ns` (string tree).
    pub fn lookup_text(&self, ns: Namespace, text: &str) -> TreeMatch {
        lookup_text(self.trees, &self.guard, ns, text).0
    }

    /// Longest whole-page match of `tokens` in namespace `ns` (token tree).
    pub fn lookup_tokens(&self, ns: Namespace, tokens: &TokenPages) -> TreeMatch {
        lookup_tokens(self.trees, &self.guard, ns, tokens).0
    }
}

/// A dispatch record's token key: a shared copy of the request's page hashes, which the index
/// may keep as label storage (`IndexWriter::insert_tokens_shared`) instead of copying again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenKey {
    pages: Arc<[u64]>,
    block_size: usize,
}

impl TokenKey {
    /// The page hashes.
    pub fn pages(&self) -> &[u64] {
        &self.pages
    }

    /// Tokens per page the hashes were computed with.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

/// A token key from page hashes a peer sent (the mesh's repair pages), computed with
/// `block_size` tokens per page.
pub fn token_key_of_pages(pages: &[u64], block_size: usize) -> TokenKey {
    TokenKey {
        pages: raw::buffer_of(pages),
        block_size,
    }
}

/// The dispatch record's key of `tokens`.
pub fn token_key(tokens: &TokenPages) -> TokenKey {
    TokenKey {
        pages: raw::buffer_of(tokens.pages()),
        block_size: tokens.block_size(),
    }
}

/// A dispatch record's text key; see `token_key`.
pub fn text_key(text: &str) -> Arc<str> {
    raw::text_buffer(text)
}

/// A dispatch record's text key of `len` bytes, written in order by `fill` (text assembled from
/// pieces, built once where the record keeps it); `None` when `fill` gives up or writes other
/// than `len` bytes of UTF-8.
pub fn text_key_written(
    len: usize,
    fill: impl FnOnce(&mut TextWriter<'_>) -> Option<()>,
) -> Option<Arc<str>> {
    raw::text_buffer_written(len, fill)
}

fn saturating_u32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn tree_match<E: raw::Element>(
    walk: &tree::Walk<'_, E>,
    matched_len: u64,
    request_len: u64,
) -> TreeMatch {
    let mut found = TreeMatch {
        matched_len: saturating_u32(matched_len),
        request_len: saturating_u32(request_len),
        ..TreeMatch::default()
    };
    if let Some(node) = walk.node {
        let (ids, len) = node.tenants();
        for (out, id) in found.tenants.iter_mut().zip(&ids[..len]) {
            *out = WorkerId(*id);
        }
        found.tenants_len = len as u8;
    }
    found
}

fn lookup_text(
    trees: &PublishedTrees,
    guard: &Guard<'_>,
    ns: Namespace,
    text: &str,
) -> (TreeMatch, LookupHint) {
    let bytes = text.as_bytes();
    let bytes = &bytes[..keys::Keying::floor(&TextKeys, bytes, KEY_ELEMENTS_MAX)];
    let walk = trees.text.walk(&TextKeys, guard, ns, bytes);
    let matched = count_chars(&bytes[..walk.matched]);
    let request = matched + count_chars(&text.as_bytes()[walk.matched..]);
    let hint = walk.hint(TreeKind::Text, bytes.len());
    (tree_match(&walk, matched, request), hint)
}

fn lookup_tokens(
    trees: &PublishedTrees,
    guard: &Guard<'_>,
    ns: Namespace,
    tokens: &TokenPages,
) -> (TreeMatch, LookupHint) {
    let keys = PageKeys {
        block_size: trees.block_size,
    };
    // Pages hashed with another block size match nothing (a caller's mistake: the data core
    // hashes with `--block-size`, as the index was built).
    let pages = if tokens.block_size() == trees.block_size {
        tokens.pages()
    } else {
        &[]
    };
    let key = &pages[..keys::Keying::floor(&keys, pages, KEY_ELEMENTS_MAX)];
    let walk = trees.tokens.walk(&keys, guard, ns, key);
    let hint = walk.hint(TreeKind::Tokens, key.len());
    let matched = keys::Keying::units(&keys, &key[..walk.matched]);
    (
        tree_match(&walk, matched, tokens.request_tokens() as u64),
        hint,
    )
}

#[cfg(test)]
mod tests;
