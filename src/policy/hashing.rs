//! The consistent-hash ring over the worker set ([`WorkerRing`]) used by `prefix_hash` and
//! `consistent_hashing`, plus the worker URLs by slot (for `x-smg-target-worker` and logs).
//! Built by the control core when the worker set changes (it allocates); data cores only read it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::ids::WorkerId;

/// Ring points per worker: enough that 2–16 workers get shares within a few percent of equal,
/// few enough that a 1,024-worker ring stays under 2 MiB.
pub const RING_POINTS_PER_WORKER: usize = 128;

/// Workers placed on a hash ring, and their URLs by slot.
#[derive(Clone, Debug, Default)]
pub struct WorkerRing {
    /// `(point, worker)` sorted by point.
    points: Vec<(u64, WorkerId)>,
    /// URL by slot; empty for a slot without a worker.
    urls: Vec<String>,
}

impl WorkerRing {
    /// Places each worker by its URL, so a worker keeps its keys across restarts and other
    /// workers' arrivals move only the keys they take.
    pub fn new<'a>(workers: impl IntoIterator<Item = (WorkerId, &'a str)>) -> WorkerRing {
        let mut ring = WorkerRing::default();
        for (id, url) in workers {
            if ring.urls.len() <= id.index() {
                ring.urls.resize(id.index() + 1, String::new());
            }
            ring.urls[id.index()] = url.to_owned();
            for replica in 0..RING_POINTS_PER_WORKER as u64 {
                ring.points
                    .push((xxh3_64_with_seed(url.as_bytes(), replica), id));
            }
        }
        ring.points.sort_unstable();
        ring
    }

    /// The URL of a worker slot (empty when unknown).
    pub fn url(&self, id: WorkerId) -> &str {
        self.urls.get(id.index()).map_or("", String::as_str)
    }

    /// The slot whose URL is exactly `url`.
    pub fn find_url(&self, url: &str) -> Option<WorkerId> {
        let slot = self.urls.iter().position(|u| !u.is_empty() && u == url)?;
        u16::try_from(slot).ok().map(WorkerId)
    }

    /// Walks the ring clockwise from `hash` and returns the first worker `accept` takes. Each
    /// point is visited at most once.
    pub fn walk(&self, hash: u64, mut accept: impl FnMut(WorkerId) -> bool) -> Option<WorkerId> {
        let start = self.points.partition_point(|&(point, _)| point < hash);
        let (after, before) = (&self.points[start..], &self.points[..start]);
        after
            .iter()
            .chain(before)
            .map(|&(_, id)| id)
            .find(|&id| accept(id))
    }

    /// True when no worker is on the ring.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}
