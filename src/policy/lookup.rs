//! The seam between the routing pipeline and the index modes: [`IndexLookup`], the read side of
//! one mode as a data core sees it, and its implementations, one per mode.
//!
//! Two modes today: `--cache-index tree` ([`Trees`]: text keys go to the string tree, token keys
//! (page hashes) to the token tree, both read through this core's [`IndexReader`]) and
//! `--cache-index hash` ([`Heads`]: the request's heads in the TTL'd placement map of
//! `index::hash`). A new mode (the KV-event index) is one more implementation here and its
//! module under `index/`; the router calls it through the trait, and the proxy never knows which
//! mode answered.

use super::prepared::{IndexKey, Lookup};
use crate::index::hash::{HashIndexReader, HeadMatch};
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
