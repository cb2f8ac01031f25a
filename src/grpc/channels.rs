//! A thread's HTTP/2 connections to its gRPC workers: each data core (and the control core)
//! keeps its own, so no lock is shared and every call stays on the runtime that opened it.
//! Owns [`Channels`] and [`connection_for`].
//!
//! A call goes to a usable connection of its worker with room under the worker's
//! `SETTINGS_MAX_CONCURRENT_STREAMS`; when none has room, a new connection opens, up to
//! `GRPC_CONNECTIONS_PER_WORKER_MAX`; past that the least busy one takes the call and h2 queues
//! it until a stream frees. Connections that closed or were sent GOAWAY are dropped from the
//! set on the next call (a GOAWAY's calls already running keep their own handles and finish).
//! Each worker's detected [`Backend`] is remembered with its connections.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;

use super::backend::Backend;
use super::connection::{Connection, OpenError};
use crate::ids::WorkerId;
use crate::limits::GRPC_CONNECTIONS_PER_WORKER_MAX;

/// One worker's connections on this thread.
#[derive(Debug, Default)]
struct WorkerChannels {
    connections: Vec<Connection>,
    backend: Option<Backend>,
}

/// This thread's connections, by worker.
#[derive(Debug, Default)]
pub struct Channels {
    workers: HashMap<WorkerId, WorkerChannels>,
}

impl Channels {
    /// No connections yet.
    pub fn new() -> Channels {
        Channels::default()
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

    /// Keeps `connection` for later calls to `worker` (unless the worker has its most).
    fn add(&mut self, worker: WorkerId, connection: &Connection) {
        let channels = self.workers.entry(worker).or_default();
        if channels.connections.len() < GRPC_CONNECTIONS_PER_WORKER_MAX {
            channels.connections.push(connection.clone());
        }
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
    let connection = Connection::open(addr).await?;
    channels.borrow_mut().add(worker, &connection);
    Ok(connection)
}
