//! The seam between the routing pipeline and the index modes: [`IndexLookup`], the read side of
//! one mode as a data core sees it, and its implementations, one per mode.
//!
//! Today there is one mode, `--cache-index tree` ([`Trees`]): text keys go to the string tree,
//! token keys (page hashes) to the token tree, both read through this core's [`IndexReader`].
//! A new mode (the hash index, the KV-event index) is one more implementation here and its
//! module under `index/`; the router calls it through the trait, and the proxy never knows which
//! mode answered.

use super::prepared::{IndexKey, Lookup};
use crate::index::{IndexReader, Namespace};

/// The read side of one index mode on a data core. Lookups take no lock, never block and do not
/// allocate: they run on the request path.
pub trait IndexLookup: std::fmt::Debug {
    /// Where `key`'s prefix is held under `namespace`: how much matched, by whom, and the hint
    /// the control core's insert starts from.
    fn lookup(&self, namespace: Namespace, key: IndexKey<'_>) -> Lookup;

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
    fn lookup(&self, namespace: Namespace, key: IndexKey<'_>) -> Lookup {
        let (matched, hint) = match key {
            IndexKey::Text(text) => self.reader.lookup_text_hinted(namespace, text),
            IndexKey::Tokens(pages) => self.reader.lookup_tokens_hinted(namespace, pages),
        };
        Lookup { matched, hint }
    }

    fn quiesce(&mut self) {
        self.reader.quiesce();
    }
}
