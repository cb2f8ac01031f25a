//! The worker table: dense worker ids, per-worker health, circuit breaker, load reports and
//! in-flight credits, published by the control core and read lock-free by the data cores.

/// A dense worker id: the index of the worker's slot in the worker table. Ids are reused only
/// after every index has been purged of the worker that held them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WorkerId(pub u16);

impl WorkerId {
    /// The slot index of this worker.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// The most workers one gateway routes to. Index tenant sets and per-core counters are sized by it.
pub const WORKERS_MAX: usize = 1024;

pub mod admin;
pub mod breaker;
pub mod health;
pub mod load;
pub mod table;
