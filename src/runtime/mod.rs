//! The program: core pinning, the per-core monoio runtimes, SO_REUSEPORT listeners and shutdown.
//! Imported by `main.rs` alone.
//!
//! `run` binds one `SO_REUSEPORT` listener per data core (so the kernel spreads connections
//! and cores never share an accept queue), builds the shared state and the index (its writer
//! for the control core, one reader per data core), starts the control core (`kvgate-control`)
//! and the data cores (`kvgate-data-N`), each a pinned thread with its own monoio `FusionDriver`
//! runtime (io_uring when the kernel allows it, epoll otherwise; detected and logged at start),
//! then waits for SIGINT or SIGTERM. Shutdown: data cores close their listeners at once (new
//! connections are refused; a new request on an open connection gets 503 and `Connection:
//! close`), let in-flight requests finish for `--shutdown-grace-period-secs`, then cut what
//! remains (`DataCore::cutting_requests`: a stream ends with an SSE error event), log how many,
//! and exit. Start-up failures come back as a
//! `StartError` whose text names the flag to fix.

pub mod signals;
mod tokenizer_pool;

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoio::io::Canceller;
use monoio::net::TcpListener;

use crate::config::{Config, PolicyKind};
use crate::control::discovery;
use crate::control::index_upkeep::IndexWriters;
use crate::control::mesh_link::{self, MeshSockets};
use crate::control::ControlCore;
use crate::http::core::DataCore;
use crate::http::server::serve_connection;
use crate::index::hash::HashIndexWriter;
use crate::index::kv::KvIndexWriter;
use crate::index::{IndexConfig, IndexWriter};
use crate::limits::{
    PLACEMENT_HEADS_MAX, PORT_RELEASE_POLL, PORT_RELEASE_WAIT, SHUTDOWN_CUT_WAIT,
    SHUTDOWN_POLL_INTERVAL, URING_ENTRIES,
};
use crate::net::socket::Socket;
use crate::policy::{Blocks, CacheIndexKind, Heads, IndexLookup, Router, Trees};
use crate::shared::Shared;
use crate::workers::admin::AdminAccess;

/// The index of the configured mode (cache_aware only): its writer for the control core and
/// one reader per data core. Without it (another policy, or the index refused to start) routing
/// runs without affinity.
fn build_index(config: &Config) -> (Option<IndexWriters>, Vec<Option<Box<dyn IndexLookup>>>) {
    let cores = config.data_cores;
    let none = || (0..cores).map(|_| None).collect();
    if config.policy.kind != PolicyKind::CacheAware {
        return (None, none());
    }
    if config.policy.cache_index == CacheIndexKind::Hash {
        let ttl_ms = config.policy.cache_ttl.as_millis() as u64;
        let writer = HashIndexWriter::new(PLACEMENT_HEADS_MAX, ttl_ms)
            .with_holders_max(config.policy.cache_holders_max);
        let readers = (0..cores)
            .map(|_| Some(Box::new(Heads::new(writer.reader())) as Box<dyn IndexLookup>))
            .collect();
        return (Some(IndexWriters::Heads(writer)), readers);
    }
    let index_config = IndexConfig {
        block_size: config.policy.cache_aware.block_size,
    };
    let built = IndexWriter::new(index_config).and_then(|writer| {
        let readers = (0..cores)
            .map(|_| {
                let reader = writer.reader()?;
                Ok(Some(Box::new(Trees::new(reader)) as Box<dyn IndexLookup>))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((writer, readers))
    });
    match built {
        Ok((writer, readers)) => (Some(IndexWriters::Trees(Box::new(writer))), readers),
        Err(e) => {
            tracing::error!("prefix index unavailable, routing without affinity: {e}");
            (None, none())
        }
    }
}

/// The KV-event index (cache_aware in tree mode): its writer for the control core and one
/// reader per data core. Its table's memory is committed only as workers' events fill it.
fn build_kv_index(config: &Config) -> (Option<KvIndexWriter>, Vec<Option<Blocks>>) {
    let cores = config.data_cores;
    let policy = &config.policy;
    if policy.kind != PolicyKind::CacheAware || policy.cache_index != CacheIndexKind::Tree {
        return (None, (0..cores).map(|_| None).collect());
    }
    let mut writer = KvIndexWriter::new(policy.kv_indexer_max_entries);
    if let Some(ttl) = policy.kv_inflight_ttl {
        writer = writer.with_inflight_overlay(ttl);
    }
    let readers = (0..cores)
        .map(|_| Some(Blocks::new(writer.reader())))
        .collect();
    (Some(writer), readers)
}

/// A start-up failure, printed by `main` as `Error: ...`.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

type CoreRuntime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

/// A runtime; a data core's has the tokenizer pool attached (`monoio::spawn_blocking` queues
/// there), the control core's runs nothing off its thread. Its ring posts completions
/// cooperatively where the kernel can (Linux 5.19+), and as the kernel's default elsewhere.
fn build_runtime(pool: Option<&tokenizer_pool::PoolHandle>) -> std::io::Result<CoreRuntime> {
    build_runtime_with(pool, RingSetup::CooperativeTaskRun)
        .or_else(|_| build_runtime_with(pool, RingSetup::KernelDefault))
}

/// How the io_uring ring is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RingSetup {
    /// `IORING_SETUP_COOP_TASKRUN`: the kernel does not interrupt the core (an inter-processor
    /// interrupt) to post each completion, it posts them when the core next enters the kernel,
    /// which a monoio core does for every batch of submissions and whenever it waits. Under
    /// load, the default's interrupts took about a fifth of the data core's time.
    CooperativeTaskRun,
    /// The kernel's default (kernels before 5.19 refuse the flag).
    KernelDefault,
}

fn build_runtime_with(
    pool: Option<&tokenizer_pool::PoolHandle>,
    setup: RingSetup,
) -> std::io::Result<CoreRuntime> {
    let mut ring = io_uring::IoUring::builder();
    if setup == RingSetup::CooperativeTaskRun {
        ring.setup_coop_taskrun();
    }
    let builder = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(URING_ENTRIES)
        .uring_builder(ring)
        .enable_timer();
    let builder = match pool {
        Some(pool) => builder.attach_thread_pool(Box::new(pool.clone())),
        None => builder.with_blocking_strategy(monoio::blocking::BlockingStrategy::ExecuteLocal),
    };
    builder.build()
}

/// Whether a listener shares its port with the other data cores' listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortSharing {
    /// `SO_REUSEPORT`: one listener per data core, the kernel spreads connections.
    PerDataCore,
    /// The port is this listener's alone.
    Exclusive,
}

/// Binds one `SO_REUSEPORT` listener per data core on `addr` (port 0 picks one port for all),
/// once the port is known to be free: `SO_REUSEPORT` would let this process join another's
/// listener on the same port (a second kvgate started by mistake, or one not yet gone), and the
/// kernel would then split the clients between the two. An exclusive bind first makes such a
/// holder an error (`bind_exclusive`); the listeners then take the port it found free. Two kvgates
/// started within the same few microseconds could both pass that check; one started by mistake
/// later cannot.
fn bind_data_listeners(addr: SocketAddr, count: usize) -> std::io::Result<Vec<StdTcpListener>> {
    let mut bound = bind_exclusive(addr)?.local_addr()?;
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count {
        let listener = bind_listener(bound, PortSharing::PerDataCore)?;
        bound = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// An exclusive listener on `addr`, retried while the port is in use for up to
/// `PORT_RELEASE_WAIT`: an old process's listener can outlive its exit by some milliseconds.
fn bind_exclusive(addr: SocketAddr) -> std::io::Result<StdTcpListener> {
    let deadline = Instant::now() + PORT_RELEASE_WAIT;
    loop {
        match bind_listener(addr, PortSharing::Exclusive) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(PORT_RELEASE_POLL);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(std::io::Error::new(
                    e.kind(),
                    "the port is in use by another process (another kvgate?)",
                ))
            }
            result => return result,
        }
    }
}

fn bind_listener(addr: SocketAddr, sharing: PortSharing) -> std::io::Result<StdTcpListener> {
    use socket2::{Domain, Protocol, Socket as RawSocket, Type};
    let socket = RawSocket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(sharing == PortSharing::PerDataCore)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Runs the gateway until SIGINT or SIGTERM.
pub fn run(config: Config) -> Result<(), StartError> {
    let signals = signals::ShutdownSignals::block()
        .map_err(|e| StartError(format!("cannot block shutdown signals: {e}")))?;
    let listeners = bind_data_listeners(config.listen_addr, config.data_cores).map_err(|e| {
        StartError(format!(
            "cannot listen on {} (--host/--port): {e}",
            config.listen_addr
        ))
    })?;
    let metrics_listener = bind_exclusive(config.prometheus_addr).map_err(|e| {
        let addr = config.prometheus_addr;
        StartError(format!(
            "cannot listen on {addr} (--prometheus-host/--prometheus-port): {e}"
        ))
    })?;
    let mesh_sockets = match &config.mesh {
        Some(mesh) => Some(MeshSockets::bind(mesh).map_err(|e| {
            let addr = mesh.bind_addr;
            StartError(format!(
                "cannot listen on {addr}, UDP and TCP (--mesh-host/--mesh-port): {e}"
            ))
        })?),
        None => None,
    };
    let listen_addr = listeners[0].local_addr().unwrap_or(config.listen_addr);
    let driver = if monoio::utils::detect_uring() {
        "io_uring"
    } else {
        "epoll (io_uring refused)"
    };
    let (index_writer, index_readers) = build_index(&config);
    let (kv_writer, kv_readers) = build_kv_index(&config);
    let pool = if config.tokenizers.is_empty() {
        None
    } else {
        Some(tokenizer_pool::start()?)
    };
    // Before any core starts: every connection to an `https://` worker uses this one.
    crate::net::tls::set_upstream_config(config.tls.upstream.clone());
    let shared = Arc::new(Shared::new(config));
    if let (Some(sockets), Some(mesh)) = (mesh_sockets, shared.config.mesh.clone()) {
        let shared_m = shared.clone();
        spawn_named("kvgate-mesh".into(), move || {
            mesh_link::run(sockets, mesh, shared_m)
        })?;
    }
    if let Some(watched) = shared.config.discovery.clone() {
        let shared_d = shared.clone();
        spawn_named("kvgate-discovery".into(), move || {
            discovery::run(watched, shared_d)
        })?;
    }
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let cores = CoreParts {
        listeners,
        metrics_listener,
        index_writer,
        index_readers,
        kv_writer,
        kv_readers,
        pool,
    };
    let threads = spawn_cores(&shared, cores, &ready_tx, &done_tx)?;
    for _ in 0..threads {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StartError(e)),
            Err(_) => return Err(StartError("a core thread died during start-up".into())),
        }
    }
    let scheme = match shared.config.tls.server {
        Some(_) => "https",
        None => "http",
    };
    tracing::info!(
        "kvgate listening on {listen_addr} ({scheme}): {} data cores, {driver} driver, policy {}, \
         {} workers",
        shared.config.data_cores,
        shared.config.policy.kind.name(),
        shared.config.workers.len(),
    );
    for worker in &shared.config.workers {
        tracing::info!(worker = %worker.url, "worker added");
    }
    if shared.config.workers.is_empty() && shared.config.discovery.is_none() {
        tracing::warn!(
            "no workers: every routed request is answered 503 until one is added \
             (--worker-urls at start, or POST /workers)"
        );
    }
    for notice in &shared.config.startup_notices {
        tracing::warn!("{notice}");
    }
    // The encoder each model uses; kvgate's BPE builds on its own thread and says when it is
    // done, if that comes later than this line (tokenize::bpe::BpeSlot).
    for (model, tokenizer) in shared.config.tokenizers.iter() {
        let model = model.unwrap_or("every other model");
        tracing::info!(model, encoder = %tokenizer.encoder(), "tokenizer");
    }
    let admin_access = &shared.config.worker_settings.admin_access;
    if *admin_access == AdminAccess::Open {
        tracing::warn!("{}", admin_access.describe());
    } else {
        tracing::info!("{}", admin_access.describe());
    }
    let signal = signals.wait();
    tracing::info!("signal {signal} received, shutting down");
    shared.begin_shutdown();
    let grace = shared.config.shutdown_grace_period;
    let deadline = Instant::now() + grace + SHUTDOWN_CUT_WAIT + Duration::from_secs(1);
    for _ in 0..threads {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            tracing::warn!("shutdown drain timed out; exiting with requests in flight");
            break;
        }
    }
    Ok(())
}

/// What each core thread takes with it: its listener and its end of the index.
struct CoreParts {
    listeners: Vec<StdTcpListener>,
    metrics_listener: StdTcpListener,
    index_writer: Option<IndexWriters>,
    index_readers: Vec<Option<Box<dyn IndexLookup>>>,
    kv_writer: Option<KvIndexWriter>,
    kv_readers: Vec<Option<Blocks>>,
    /// The tokenizer pool (when some model has a tokenizer).
    pool: Option<tokenizer_pool::PoolHandle>,
}

/// Starts the control core and the data cores; returns how many threads were started.
fn spawn_cores(
    shared: &Arc<Shared>,
    parts: CoreParts,
    ready: &mpsc::Sender<Result<(), String>>,
    done: &mpsc::Sender<()>,
) -> Result<usize, StartError> {
    let core_ids = core_affinity::get_core_ids().unwrap_or_default();
    let pin = move |slot: usize| {
        if !core_ids.is_empty() {
            core_affinity::set_for_current(core_ids[slot % core_ids.len()]);
        }
    };
    let (shared_c, ready_c, done_c) = (shared.clone(), ready.clone(), done.clone());
    let pin_c = pin.clone();
    let (metrics_listener, writer) = (parts.metrics_listener, parts.index_writer);
    let kv_writer = parts.kv_writer;
    spawn_named("kvgate-control".into(), move || {
        pin_c(0);
        run_control_core(
            ControlCore::new(shared_c, writer, kv_writer),
            metrics_listener,
            ready_c,
        );
        let _ = done_c.send(());
    })?;
    let readers = parts.index_readers.into_iter().zip(parts.kv_readers);
    let data_cores = parts.listeners.into_iter().zip(readers);
    for (core_id, (listener, (reader, events))) in data_cores.enumerate() {
        let (shared_d, ready_d, done_d) = (shared.clone(), ready.clone(), done.clone());
        let pin_d = pin.clone();
        let pool = parts.pool.clone();
        spawn_named(format!("kvgate-data-{core_id}"), move || {
            pin_d(core_id + 1);
            let core = data_core(core_id, shared_d, reader, events);
            run_data_core(core, listener, pool, ready_d);
            let _ = done_d.send(());
        })?;
    }
    Ok(shared.config.data_cores + 1)
}

/// Data core `core_id`'s state: its router reads the index through `index` and the KV-event
/// index through `events`.
fn data_core(
    core_id: usize,
    shared: Arc<Shared>,
    index: Option<Box<dyn IndexLookup>>,
    events: Option<Blocks>,
) -> DataCore {
    let metrics = shared.policy_metrics[core_id].clone();
    let config = &shared.config;
    let mut router = Router::new(config.policy.clone(), core_id as u64, index, metrics)
        .with_tokenizers(
            config.tokenizers.clone(),
            config.tokenizer_cache,
            config.tokenize_inline_max_bytes,
        );
    if let Some(events) = events {
        router = router.with_events(events);
    }
    if config.mesh.is_some() {
        router = router.with_peer_text_pages();
    }
    let decode = config.pd.as_ref().map(|pd| {
        // Its own counters, not exported: the branch metric counts prefill decisions.
        let seed = (core_id as u64) ^ 0x5eed_dec0;
        Router::new(pd.decode.clone(), seed, None, Arc::default())
    });
    let core = DataCore::new(core_id, shared, router);
    match decode {
        Some(decode) => core.with_decode_router(decode),
        None => core,
    }
}

fn spawn_named(name: String, body: impl FnOnce() + Send + 'static) -> Result<(), StartError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map(|_| ())
        .map_err(|e| StartError(format!("cannot start thread {name}: {e}")))
}

fn run_control_core(
    control: ControlCore,
    metrics_listener: StdTcpListener,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let mut runtime = match build_runtime(None) {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(format!("control core runtime: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    runtime.block_on(control.run(metrics_listener));
}

fn run_data_core(
    core: DataCore,
    listener: StdTcpListener,
    pool: Option<tokenizer_pool::PoolHandle>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let core_id = core.core_id;
    let mut runtime = match build_runtime(pool.as_ref()) {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(format!("data core {core_id} runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = ready.send(Err(format!("data core {core_id} listener: {e}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let core = Rc::new(core);
        monoio::spawn(sweep_pool_forever(core.clone()));
        accept_until_shutdown(listener, &core).await;
        drain_requests(&core).await;
    });
}

/// Accepts connections until shutdown begins, then closes the listener: its pending accept is
/// cancelled and awaited first (an io_uring accept in flight would keep the socket listening).
async fn accept_until_shutdown(listener: TcpListener, core: &Rc<DataCore>) {
    let mut canceller = Canceller::new();
    loop {
        let mut accept = std::pin::pin!(listener.cancelable_accept(canceller.handle()));
        let accepted = monoio::select! {
            accepted = &mut accept => accepted,
            _ = wait_for_shutdown(&core.shared) => {
                let _ = std::mem::take(&mut canceller).cancel();
                // Accepted before the cancel landed: served (its request gets the 503).
                if let Ok((stream, _)) = accept.await {
                    monoio::spawn(serve_connection(core.clone(), Socket::new(stream)));
                }
                return;
            }
        };
        match accepted {
            Ok((stream, _)) => {
                monoio::spawn(serve_connection(core.clone(), Socket::new(stream)));
            }
            Err(e) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn wait_for_shutdown(shared: &Shared) {
    while !shared.is_shutting_down() {
        monoio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
}

/// Lets in-flight requests finish for `--shutdown-grace-period-secs`, then cuts those left
/// (they notice within `CLIENT_GONE_POLL_INTERVAL` and write their error) and gives them
/// `SHUTDOWN_CUT_WAIT` to do so.
async fn drain_requests(core: &DataCore) {
    let grace = core.shared.config.shutdown_grace_period;
    let deadline = Instant::now() + grace;
    while core.requests_in_flight.get() > 0 && Instant::now() < deadline {
        monoio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
    let left = core.requests_in_flight.get();
    if left == 0 {
        return;
    }
    tracing::warn!(
        core = core.core_id,
        cut = left,
        "shutdown grace period ({}s) over: cutting {left} requests still in flight",
        grace.as_secs()
    );
    core.cutting_requests.set(true);
    let deadline = Instant::now() + SHUTDOWN_CUT_WAIT;
    while core.requests_in_flight.get() > 0 && Instant::now() < deadline {
        monoio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
}

async fn sweep_pool_forever(core: Rc<DataCore>) {
    while !core.shared.is_shutting_down() {
        monoio::time::sleep(Duration::from_secs(1)).await;
        core.pool.borrow_mut().sweep(Instant::now());
        let roster = core.shared.table.roster();
        let active = |id, addr| roster.get(id).is_some_and(|w| w.spec.addr == addr);
        core.grpc.borrow_mut().retain_active(active);
        core.router.borrow_mut().quiesce();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each ring setup gives a runtime whose socket reads and writes complete (the cooperative
    /// one posts completions only when the core enters the kernel: a runtime that parked
    /// without entering it would hang here).
    #[test]
    fn both_ring_setups_run_socket_round_trips() {
        for setup in [RingSetup::CooperativeTaskRun, RingSetup::KernelDefault] {
            let mut runtime = build_runtime_with(None, setup).expect("a runtime");
            let echoed = runtime.block_on(async {
                use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
                let listener = monoio::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                let addr = listener.local_addr().expect("address");
                let server = monoio::spawn(async move {
                    let (mut conn, _) = listener.accept().await.expect("accept");
                    for _ in 0..100 {
                        let (read, buf) = conn.read_exact(vec![0u8; 5]).await;
                        read.expect("server read");
                        let (written, _) = conn.write_all(buf).await;
                        written.expect("server write");
                    }
                });
                let mut client = monoio::net::TcpStream::connect(addr)
                    .await
                    .expect("connect");
                let mut echoed = 0;
                for i in 0..100u8 {
                    let sent = vec![i; 5];
                    let (written, _) = client.write_all(sent.clone()).await;
                    written.expect("client write");
                    let (read, back) = client.read_exact(vec![0u8; 5]).await;
                    read.expect("client read");
                    echoed += usize::from(back == sent);
                }
                server.await;
                echoed
            });
            assert_eq!(echoed, 100, "{setup:?}");
        }
    }
}
