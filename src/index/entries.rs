//! The writer's private tenant entries: one record per (node, worker) with its last-access tick,
//! threaded on two intrusive recency lists (per model, for eviction; per worker, for purges).
//!
//! The lists keep one invariant that makes eviction and purges walk-free: an insert touches its
//! path deepest node first, so for every worker an ancestor's entry is always more recent than
//! any descendant's. The oldest entry of a list is therefore always a leaf for its worker.

use crate::ids::WorkerId;

/// "No entry": the end of a list.
pub const NIL: u32 = u32::MAX;

/// Which of an entry's two lists an operation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chain {
    /// The recency list of the entry's model (eviction order).
    Model = 0,
    /// The recency list of the entry's worker (purge order).
    Worker = 1,
}

#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

/// One (node, worker) entry.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The node the worker holds.
    pub node: u32,
    /// The holding worker.
    pub worker: WorkerId,
    /// The model slot the node's tree belongs to.
    pub model: u32,
    /// Last access (the caller's tick, never decreasing).
    pub tick: u64,
    links: [Link; 2],
}

impl Entry {
    /// A new, unlinked entry.
    pub fn new(node: u32, worker: WorkerId, model: u32, tick: u64) -> Self {
        Self {
            node,
            worker,
            model,
            tick,
            links: [UNLINKED; 2],
        }
    }
}

/// The head and tail of one recency list: head is least recently used.
#[derive(Clone, Copy, Debug)]
pub struct List {
    /// Least recently used entry.
    pub head: u32,
    tail: u32,
}

impl Default for List {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
        }
    }
}

/// The entry slab with its free list.
#[derive(Debug, Default)]
pub struct Entries {
    slots: Vec<Entry>,
    free: Vec<u32>,
}

impl Entries {
    /// Stores a new entry and returns its id.
    pub fn alloc(&mut self, entry: Entry) -> u32 {
        if let Some(id) = self.free.pop() {
            self.slots[id as usize] = entry;
            id
        } else {
            self.slots.push(entry);
            (self.slots.len() - 1) as u32
        }
    }

    /// Frees an entry already unlinked from both lists.
    pub fn release(&mut self, id: u32) {
        self.free.push(id);
    }

    /// The entry with this id.
    pub fn get(&self, id: u32) -> &Entry {
        &self.slots[id as usize]
    }

    /// The entry with this id, mutably.
    pub fn get_mut(&mut self, id: u32) -> &mut Entry {
        &mut self.slots[id as usize]
    }

    /// Bytes held by the slab (capacity, not only live entries).
    pub fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Entry>() + self.free.capacity() * 4
    }

    fn link(&mut self, id: u32, chain: Chain) -> &mut Link {
        &mut self.slots[id as usize].links[chain as usize]
    }

    /// Appends `id` as the most recent entry of `list`.
    pub fn push_back(&mut self, list: &mut List, chain: Chain, id: u32) {
        *self.link(id, chain) = Link {
            prev: list.tail,
            next: NIL,
        };
        if list.tail == NIL {
            list.head = id;
        } else {
            self.link(list.tail, chain).next = id;
        }
        list.tail = id;
    }

    /// Inserts `id` right after `after` (one step more recent).
    pub fn insert_after(&mut self, list: &mut List, chain: Chain, after: u32, id: u32) {
        let next = self.link(after, chain).next;
        *self.link(id, chain) = Link { prev: after, next };
        self.link(after, chain).next = id;
        if next == NIL {
            list.tail = id;
        } else {
            self.link(next, chain).prev = id;
        }
    }

    /// Takes `id` out of `list`.
    pub fn unlink(&mut self, list: &mut List, chain: Chain, id: u32) {
        let Link { prev, next } = *self.link(id, chain);
        if prev == NIL {
            list.head = next;
        } else {
            self.link(prev, chain).next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.link(next, chain).prev = prev;
        }
        *self.link(id, chain) = UNLINKED;
    }

    /// Makes `id` the most recent entry of `list`.
    pub fn move_to_back(&mut self, list: &mut List, chain: Chain, id: u32) {
        if list.tail != id {
            self.unlink(list, chain, id);
            self.push_back(list, chain, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(entries: &Entries, list: &List, chain: Chain) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = list.head;
        while at != NIL {
            out.push(at);
            at = entries.slots[at as usize].links[chain as usize].next;
        }
        out
    }

    #[test]
    fn lists_keep_recency_order() {
        let mut entries = Entries::default();
        let mut list = List::default();
        let ids: Vec<u32> = (0..4)
            .map(|i| entries.alloc(Entry::new(i, WorkerId(0), 0, u64::from(i))))
            .collect();
        for id in &ids {
            entries.push_back(&mut list, Chain::Model, *id);
        }
        entries.move_to_back(&mut list, Chain::Model, ids[0]);
        assert_eq!(order(&entries, &list, Chain::Model), vec![1, 2, 3, 0]);
        entries.unlink(&mut list, Chain::Model, ids[2]);
        entries.insert_after(&mut list, Chain::Model, ids[1], ids[2]);
        entries.unlink(&mut list, Chain::Model, ids[0]);
        entries.insert_after(&mut list, Chain::Model, ids[3], ids[0]);
        assert_eq!(order(&entries, &list, Chain::Model), vec![1, 2, 3, 0]);
        entries.unlink(&mut list, Chain::Model, ids[1]);
        assert_eq!(list.head, ids[2]);
        assert!(order(&entries, &List::default(), Chain::Worker).is_empty());
    }
}
