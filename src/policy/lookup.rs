//! The seam between the routing pipeline and the index modes: [`IndexLookup`], the read side of
//! one mode as a data core sees it, and its implementations, one per mode.
//!
//! Two modes by flag: `--cache-index tree` ([`Trees`]: text keys go to the string tree, token keys
//! (page hashes) to the token tree, both read through this core's [`IndexReader`]) and
//! `--cache-index hash` ([`Heads`]: the request's heads in the TTL'd placement map of
//! `index::hash`). The router calls them through the trait, and the proxy never knows which
//! mode answered.
//!
//! The KV-event index ([`Blocks`]) is not chosen by flag but per request, beside the trees: a
//! request with token IDs whose model's workers publish KV events is looked up there instead of
//! in the token tree. It answers in blocks of the size the model's engines reported.

use super::prepared::{IndexKey, Lookup};
use crate::index::hash::{HashIndexReader, HeadMatch};
use crate::index::kv::{chain_hashes, KvIndexReader};
use crate::index::{IndexReader, Namespace, TreeMatch};

/// The read side of one index mode on a data core. Lookups take no lock, never block and do not
/// allocate: they run on the request path.
pub trait IndexLookup: std::fmt::Debug + Send {
    /// Where `key`'s prefix is held under `namespace` at `now_ms` (the gateway tick): how much
    /// matched and by whom (a key of another mode's form finds nothing).
    fn lookup(&self, namespace: Namespace, key: IndexKey<'_>, now_ms: u64) -> Lookup;

    /// Marks this core quiescent: it holds no reference into the index (reclamation may free
    /// what it retired). The router calls it after every lookup and when the core is idle.
    fn quiesce(&mut self);
}

/// `--cache-index tree`: the string tree for text, the token tree for token IDs.
#[derive(Debug)]
pub struct Trees {
    reader: IndexReader,
}

impl Trees {
    /// The trees as read through this core's reader.
    pub fn new(reader: IndexReader) -> Self {
        Trees { reader }
    }
}

impl IndexLookup for Trees {
    fn lookup(&self, namespace: Namespace, key: IndexKey<'_>, _now_ms: u64) -> Lookup {
        let (matched, hint) = match key {
            IndexKey::Text(text) => self.reader.lookup_text_hinted(namespace, text),
            IndexKey::Tokens(pages) => self.reader.lookup_tokens_hinted(namespace, pages),
            IndexKey::Heads(_) => (TreeMatch::default(), Default::default()),
        };
        Lookup::Tree { matched, hint }
    }

    fn quiesce(&mut self) {
        self.reader.quiesce();
    }
}

/// `--cache-index hash`: the request's heads in the placement map (the namespace is in each
/// head's hash already).
#[derive(Debug)]
pub struct Heads {
    reader: HashIndexReader,
}

impl Heads {
    /// The placement map as read through this core's reader.
    pub fn new(reader: HashIndexReader) -> Self {
        Heads { reader }
    }
}

impl IndexLookup for Heads {
    fn lookup(&self, _namespace: Namespace, key: IndexKey<'_>, now_ms: u64) -> Lookup {
        match key {
            IndexKey::Heads(heads) => Lookup::Heads(self.reader.lookup(heads, now_ms)),
            IndexKey::Text(_) | IndexKey::Tokens(_) => Lookup::Heads(HeadMatch::default()),
        }
    }

    /// The map frees nothing a reader may hold: no quiescent state to announce.
    fn quiesce(&mut self) {}
}

/// The KV-event index as a data core reads it.
#[derive(Debug)]
pub struct Blocks {
    reader: KvIndexReader,
}

impl Blocks {
    /// The KV-event index as read through this core's reader.
    pub fn new(reader: KvIndexReader) -> Self {
        Blocks { reader }
    }

    /// Whether `model`'s workers publish events: `Some(block size they reported)`, `None` inside
    /// until one stored a block.
    pub fn publishing(&self, model: u64) -> Option<Option<usize>> {
        self.reader.publishing(model)
    }

    /// The holders of a request's blocks: `pages` are its page hashes with `block_size` tokens
    /// per page, chained into the index's keys in `chain` (a reused buffer).
    pub fn lookup(&self, pages: &[u64], block_size: usize, chain: &mut Vec<u64>) -> Lookup {
        chain_hashes(pages, chain);
        Lookup::Blocks(self.reader.lookup(chain, block_size))
    }
}
