//! The route phase: the seam where a policy picks a worker. `Router::route` gets the request
//! (endpoint, head, body bytes) and the published `WorkerView`, and returns a `WorkerId` or
//! `None` when no eligible worker is left. It is synchronous and does no I/O, so policies are
//! testable without sockets. The `policy` module plugs `cache_aware` in as one more
//! `PolicyKind` arm here; the codec and the driver do not change.

use super::codec::RequestHead;
use super::endpoint::Endpoint;
use crate::config::PolicyKind;
use crate::limits::UPSTREAM_ATTEMPTS_MAX;
use crate::workers::admin::ModelWorkers;
use crate::workers::table::{Roster, WorkerTable};
use crate::workers::WorkerId;

/// The request as the route phase sees it.
#[derive(Debug)]
pub struct RouteInput<'a> {
    /// The classified endpoint.
    pub endpoint: Endpoint,
    /// The parsed head; its spans index `head_buf`.
    pub head: &'a RequestHead,
    /// The buffer the head was parsed from.
    pub head_buf: &'a [u8],
    /// The complete request body (de-chunked).
    pub body: &'a [u8],
    /// The workers serving the requested model (`workers::admin::ModelCatalog`).
    pub models: ModelWorkers<'a>,
}

/// The published worker state a policy reads: the roster and the table's atomics.
#[derive(Debug, Clone, Copy)]
pub struct WorkerView<'a> {
    /// Active workers.
    pub roster: &'a Roster,
    /// Health and in-flight counts.
    pub table: &'a WorkerTable,
}

/// Workers already tried for this request; the retry loop excludes them.
#[derive(Debug, Default)]
pub struct TriedWorkers {
    ids: [WorkerId; UPSTREAM_ATTEMPTS_MAX],
    len: usize,
}

impl TriedWorkers {
    /// Remembers `id` (attempts are capped, so the list never overflows).
    pub fn insert(&mut self, id: WorkerId) {
        if self.len < self.ids.len() && !self.contains(id) {
            self.ids[self.len] = id;
            self.len += 1;
        }
    }

    /// Whether `id` was tried.
    pub fn contains(&self, id: WorkerId) -> bool {
        self.ids[..self.len].contains(&id)
    }
}

/// A data core's routing state (cursor, random source), one per core: no sharing.
#[derive(Debug)]
pub struct Router {
    policy: PolicyKind,
    cursor: usize,
    rng: fastrand::Rng,
}

impl Router {
    /// A router for `policy`; `seed` makes random choices reproducible.
    pub fn new(policy: PolicyKind, seed: u64) -> Self {
        Router {
            policy,
            cursor: seed as usize,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Picks a healthy worker not in `tried`, or `None` if there is none.
    pub fn route(
        &mut self,
        input: &RouteInput<'_>,
        view: WorkerView<'_>,
        tried: &TriedWorkers,
    ) -> Option<WorkerId> {
        let eligible = |id: WorkerId| {
            view.table.is_eligible(id) && input.models.allows(id) && !tried.contains(id)
        };
        let workers = &view.roster.workers;
        if workers.is_empty() {
            return None;
        }
        let start = match self.policy {
            PolicyKind::RoundRobin => {
                self.cursor = self.cursor.wrapping_add(1);
                self.cursor
            }
            PolicyKind::Random => self.rng.usize(..workers.len()),
        };
        (0..workers.len())
            .map(|i| workers[(start.wrapping_add(i)) % workers.len()].id)
            .find(|&id| eligible(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_worker_url;
    use crate::http::codec::parse_request_head;
    use crate::workers::table::Health;

    const REQ: &[u8] = b"POST /generate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";

    fn table(n: usize) -> WorkerTable {
        let specs: Vec<_> = (0..n)
            .map(|i| parse_worker_url(&format!("http://127.0.0.1:{}", 41000 + i)).unwrap())
            .collect();
        WorkerTable::new(1, &specs)
    }

    fn pick(router: &mut Router, table: &WorkerTable, tried: &TriedWorkers) -> Option<WorkerId> {
        let head = parse_request_head(REQ).unwrap().unwrap();
        let input = RouteInput {
            endpoint: Endpoint::Generate,
            head: &head,
            head_buf: REQ,
            body: b"{}",
            models: ModelWorkers::Any,
        };
        let roster = table.roster();
        router.route(
            &input,
            WorkerView {
                roster: &roster,
                table,
            },
            tried,
        )
    }

    #[test]
    fn round_robin_cycles_and_skips_unhealthy() {
        let table = table(3);
        let mut router = Router::new(PolicyKind::RoundRobin, 0);
        let none = TriedWorkers::default();
        let picks: Vec<u16> = (0..6)
            .map(|_| pick(&mut router, &table, &none).unwrap().0)
            .collect();
        assert_eq!(picks, [1, 2, 0, 1, 2, 0]);
        table.set_health(WorkerId(1), Health::Unhealthy);
        let picks: Vec<u16> = (0..4)
            .map(|_| pick(&mut router, &table, &none).unwrap().0)
            .collect();
        assert!(!picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn tried_workers_are_excluded_until_none_is_left() {
        let table = table(2);
        let mut router = Router::new(PolicyKind::Random, 7);
        let mut tried = TriedWorkers::default();
        let first = pick(&mut router, &table, &tried).unwrap();
        tried.insert(first);
        let second = pick(&mut router, &table, &tried).unwrap();
        assert_ne!(first, second);
        tried.insert(second);
        assert_eq!(pick(&mut router, &table, &tried), None);
        assert_eq!(
            pick(&mut router, &table_empty(), &TriedWorkers::default()),
            None
        );
    }

    fn table_empty() -> WorkerTable {
        WorkerTable::new(1, &[])
    }
}
