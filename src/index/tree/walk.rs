//! The read side: `SharedTree::walk`, a data core's longest-prefix walk down a namespace (no
//! lock, no allocation, no shared write), and the `Walk` it ends with, whose `hint` the
//! dispatch record carries to the writer.

use super::{ns_hash, LookupHint, SharedTree};
use crate::index::keys::{common_prefix, Keying};
use crate::index::raw::{Element, Guard, Node};
use crate::index::{Namespace, TreeKind};

/// The end of a walk: elements matched and the deepest node reached (borrowed from the guard).
#[derive(Debug)]
pub struct Walk<'g, E: Element> {
    /// Matched elements, at a unit boundary.
    pub matched: usize,
    /// The deepest matched node (partly matched when the match ends inside its edge).
    pub node: Option<&'g Node<E>>,
    /// The slab id of `node` (0 when there is none).
    pub node_id: u32,
}

impl<E: Element> Walk<'_, E> {
    /// The hint a record of the same key carries to the writer (`key_len`: the key walked).
    pub fn hint(&self, kind: TreeKind, key_len: usize) -> LookupHint {
        match self.node {
            Some(node) => LookupHint {
                kind: Some(kind),
                node: self.node_id,
                stamp: node.stamp(),
                matched: self.matched as u32,
                key_len: key_len as u32,
            },
            None => LookupHint::default(),
        }
    }
}

impl<E: Element> SharedTree<E> {
    /// Walks `query` down namespace `ns`: no lock, no allocation, no shared write.
    pub fn walk<'g, K: Keying<E = E>>(
        &'g self,
        keys: &K,
        guard: &'g Guard<'_>,
        ns: Namespace,
        query: &[E],
    ) -> Walk<'g, E> {
        let mut walk = Walk {
            matched: 0,
            node: None,
            node_id: 0,
        };
        let table = self.namespaces.load(guard);
        let Some(root) = table.find(ns.model, ns.partition, ns_hash(ns)) else {
            return walk;
        };
        let Some(mut node) = self.slab.get(root, guard) else {
            return walk;
        };
        'down: while let Some(edge_key) = keys.edge_key(&query[walk.matched..]) {
            let rest = &query[walk.matched..];
            for child_id in node.children(guard).with_key(edge_key) {
                let Some(child) = self.slab.get(child_id, guard) else {
                    continue;
                };
                let Some(label) = child.label_from(walk.matched as u32, guard) else {
                    continue;
                };
                let common = keys.floor(rest, common_prefix(label, rest));
                if common == 0 {
                    continue;
                }
                walk.node = Some(child);
                walk.node_id = child_id;
                walk.matched += common;
                if common < label.len() {
                    break 'down;
                }
                node = child;
                continue 'down;
            }
            break;
        }
        walk
    }
}
