//! A thread's HTTP/2 connections to its gRPC workers: each data core (and the control core)
//! keeps its own, so no lock is shared and every call stays on the runtime that opened it.
//! Owns [`Channels`] and [`connection_for`].
//!
//! A call goes to a usable connection of its worker with room under the worker's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`; when none has room, a new connection opens, up to
//! `GRPC_CONNECTIONS_PER_WORKER_MAX`; past that the least busy one takes the call and h2 queues
//! it until a stream frees. Connections that closed or were sent GOAWAY are dropped from the
//! set on the next call (a GOAWAY's calls already running keep their own handles and finish).
//! Each worker's detected [`Backend`] is remembered with its connections. The connections of a
//! worker removed from the roster are dropped by the thread's sweep ([`Channels::retain_active`]),
//! not left open until they fail.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::backend::Backend;
use super::connection::{Connection, OpenError};
use crate::ids::WorkerId;
use crate::limits::GRPC_CONNECTIONS_PER_WORKER_MAX;

/// One worker's connections on this thread.
#[derive(Debug, Default)]
struct WorkerChannels {
    connections: Vec<Connection>,
    backend: Option<Backend>,
    /// The address the connections go to (an id reused for another worker has another).
    addr: Option<SocketAddr>,
}

/// This thread's connections, by worker.
#[derive(Debug, Default)]
pub struct Channels {
    workers: HashMap<WorkerId, WorkerChannels>,
    /// The workers' API key (`--api-key`) every call sends.
    bearer: Option<Arc<str>>,
}

impl Channels {
    /// No connections yet.
    pub fn new() -> Channels {
        Channels::default()
    }

    /// No connections yet; every call sends `bearer` (the workers' API key) as
    /// `authorization: Bearer` metadata.
    pub fn with_bearer(bearer: Option<Arc<str>>) -> Channels {
        Channels {
            bearer,
            ..Channels::default()
        }
    }

    /// A usable connection to `worker` with room for a call; when there is none and the
    /// worker has `GRPC_CONNECTIONS_PER_WORKER_MAX` already, the least busy usable one.
    /// `None`: a new connection should open.
    fn pick(&mut self, worker: WorkerId) -> Option<Connection> {
        let channels = self.workers.get_mut(&worker)?;
        channels.connections.retain(Connection::is_usable);
        let roomy = channels.connections.iter().find(|c| c.has_room());
        if let Some(connection) = roomy {
            return Some(connection.clone());
        }
        if channels.connections.len() < GRPC_CONNECTIONS_PER_WORKER_MAX {
            return None;
        }
        channels
            .connections
            .iter()
            .min_by_key(|c| c.calls())
            .cloned()
    }

    /// Keeps `connection` to `addr` for later calls to `worker` (unless the worker has its
    /// most).
    fn add(&mut self, worker: WorkerId, addr: SocketAddr, connection: &Connection) {
        let channels = self.workers.entry(worker).or_default();
        if channels.addr != Some(addr) {
            channels.connections.clear();
            channels.addr = Some(addr);
        }
        if channels.connections.len() < GRPC_CONNECTIONS_PER_WORKER_MAX {
            channels.connections.push(connection.clone());
        }
    }

    /// The key calls send.
    pub fn bearer(&self) -> Option<&Arc<str>> {
        self.bearer.as_ref()
    }

    /// Sends `bearer` on the calls of connections opened from now on (the control core's
    /// probes carry the key they were given).
    pub fn set_bearer(&mut self, bearer: Option<Arc<str>>) {
        self.bearer = bearer;
    }

    /// Connections kept to `worker`.
    pub fn connections(&self, worker: WorkerId) -> usize {
        self.workers.get(&worker).map_or(0, |c| c.connections.len())
    }

    /// The backend detected for `worker`, if known.
    pub fn backend(&self, worker: WorkerId) -> Option<Backend> {
        self.workers.get(&worker).and_then(|c| c.backend)
    }

    /// Remembers `worker`'s backend.
    pub fn set_backend(&mut self, worker: WorkerId, backend: Backend) {
        self.workers.entry(worker).or_default().backend = Some(backend);
    }

    /// Drops the connections of workers `active` no longer names at their address (removed,
    /// or their id given to another worker): the handles go, and each connection closes once
    /// the calls still on it end, instead of lingering until it fails.
    pub fn retain_active(&mut self, active: impl Fn(WorkerId, SocketAddr) -> bool) {
        self.workers
            .retain(|id, channels| channels.addr.is_none_or(|addr| active(*id, addr)));
    }

    /// Forgets `worker`'s connections (after one failed: an engine restart breaks them all)
    /// and its backend (a restarted worker may be another engine).
    pub fn forget(&mut self, worker: WorkerId) {
        self.workers.remove(&worker);
    }
}

/// A connection for one call to `worker` at `addr`: a kept one with room, else a new one.
pub async fn connection_for(
    channels: &RefCell<Channels>,
    worker: WorkerId,
    addr: SocketAddr,
) -> Result<Connection, OpenError> {
    if let Some(connection) = channels.borrow_mut().pick(worker) {
        return Ok(connection);
    }
    let bearer = channels.borrow().bearer.clone();
    let connection = Connection::open(addr, bearer).await?;
    channels.borrow_mut().add(worker, addr, &connection);
    Ok(connection)
}
