//! Identifiers every layer shares.

/// A dense worker id: the index of the worker's slot in the worker table and of its entry in
/// every per-worker array. Ids are reused only after every index has been purged of the worker
/// that held them; `limits::WORKERS_MAX` bounds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct WorkerId(pub u16);

impl WorkerId {
    /// The slot index of this worker.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}
