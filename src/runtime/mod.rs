//! Core pinning, the per-core monoio runtimes, SO_REUSEPORT listeners and shutdown.
//!
//! `run` binds one `SO_REUSEPORT` listener per data core (so the kernel spreads connections
//! and cores never share an accept queue), starts the control core (`kvgate-control`) and the
//! data cores (`kvgate-data-N`), each a pinned thread with its own monoio `FusionDriver`
//! runtime (io_uring when the kernel allows it, epoll otherwise; detected and logged at start),
//! then waits for SIGINT or SIGTERM. Shutdown: data cores stop accepting, let in-flight requests
//! finish for up to `SHUTDOWN_DRAIN_TIMEOUT`, and exit. `Shared` is everything the threads
//! share: config, worker table, published models, dispatch queues, metrics, shutdown flag.
//! Start-up failures come back as a `StartError` whose text names the flag to fix.

pub mod signals;

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;
use monoio::net::TcpListener;

use crate::config::{Config, PolicyKind};
use crate::control::{ControlCore, DispatchRecord};
use crate::http::io::Socket;
use crate::http::server::{serve_connection, DataCore};
use crate::index::{IndexConfig, IndexReader, IndexWriter, ModelGauges};
use crate::limits::{
    DISPATCH_QUEUE_CAPACITY, SHUTDOWN_DRAIN_TIMEOUT, SHUTDOWN_POLL_INTERVAL, URING_ENTRIES,
};
use crate::metrics::Metrics;
use crate::policy::PolicyMetrics;
use crate::workers::table::WorkerTable;
use crate::workers::WorkerId;

/// State shared by the control core (its only writer) and the data cores (readers).
#[derive(Debug)]
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Workers, health and in-flight credits.
    pub table: WorkerTable,
    /// The gateway's `/v1/models` answer, rebuilt by the control core.
    pub models_body: ArcSwap<Vec<u8>>,
    /// One dispatch-record queue per data core, drained by the control core.
    pub dispatch_queues: Box<[ArrayQueue<DispatchRecord>]>,
    /// Per-core counters.
    pub metrics: Metrics,
    /// Per-core cache_aware decision counters (`smg_cache_aware_*`).
    pub policy_metrics: Box<[Arc<PolicyMetrics>]>,
    /// The index writer, taken by the control core at start.
    index_writer: Mutex<Option<IndexWriter>>,
    /// One index reader per data core, each taken by its core at start.
    index_readers: Mutex<Vec<Option<IndexReader>>>,
    /// Tree gauges by model name, published by the control core after each eviction cycle.
    pub tree_gauges: ArcSwap<Vec<(String, ModelGauges)>>,
    /// Attempt outcomes, admin calls and the model catalog (`workers::admin::shared`).
    pub workers: crate::workers::admin::shared::WorkerShared,
    shutdown: AtomicBool,
    started: Instant,
}

impl Shared {
    /// Shared state for `config`, with its workers in the table.
    pub fn new(config: Config) -> Self {
        let cores = config.data_cores;
        let (index_writer, index_readers) = build_index(&config);
        Shared {
            policy_metrics: (0..cores).map(|_| Arc::default()).collect(),
            index_writer: Mutex::new(index_writer),
            index_readers: Mutex::new(index_readers),
            tree_gauges: ArcSwap::from_pointee(Vec::new()),
            table: WorkerTable::new(cores, &config.workers),
            models_body: ArcSwap::from_pointee(br#"{"object":"list","data":[]}"#.to_vec()),
            dispatch_queues: (0..cores)
                .map(|_| ArrayQueue::new(DISPATCH_QUEUE_CAPACITY))
                .collect(),
            metrics: Metrics::new(cores),
            workers: crate::workers::admin::shared::WorkerShared::new(cores),
            shutdown: AtomicBool::new(false),
            started: Instant::now(),
            config,
        }
    }

    /// The index writer (the control core takes it once, at start).
    pub fn take_index_writer(&self) -> Option<IndexWriter> {
        self.index_writer.lock().ok()?.take()
    }

    /// Data core `core`'s index reader (taken once, at start).
    pub fn take_index_reader(&self, core: usize) -> Option<IndexReader> {
        self.index_readers.lock().ok()?.get_mut(core)?.take()
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Starts shutdown.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }

    /// Milliseconds since the gateway started: the tick of dispatch records.
    pub fn tick_now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether any active worker is healthy.
    pub fn has_healthy_worker(&self) -> bool {
        self.table
            .roster()
            .workers
            .iter()
            .any(|w| self.table.is_eligible(w.id))
    }

    /// Counters plus per-worker gauges, in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        self.metrics.render(out);
        crate::policy::render_prometheus(self.policy_metrics.iter().map(|m| &**m), out);
        crate::control::render_tree_gauges(&self.tree_gauges.load(), out);
        out.push_str("# HELP smg_worker_requests_active Requests in flight per worker\n");
        out.push_str("# TYPE smg_worker_requests_active gauge\n");
        for worker in &self.table.roster().workers {
            let active = self.table.inflight(worker.id);
            let url = &worker.spec.url;
            let _ = writeln!(
                out,
                "smg_worker_requests_active{{worker=\"{url}\"}} {active}"
            );
        }
        let credits = [
            (
                "kvgate_worker_queued_prompt_tokens",
                "Prompt tokens sent to the worker since its last load report with no first token \
                 back yet (the expected-wait scorer's queued work)",
                WorkerTable::queued_tokens as fn(&WorkerTable, WorkerId, u32) -> u64,
            ),
            (
                "kvgate_worker_resident_prompt_tokens",
                "Prompt tokens sent to the worker since its last load report whose requests have \
                 not ended (added to its reported KV usage)",
                WorkerTable::resident_tokens,
            ),
        ];
        for (name, help, tokens_of) in credits {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for worker in &self.table.roster().workers {
                let generation = self.table.signals(worker.id).load_generation();
                let tokens = tokens_of(&self.table, worker.id, generation);
                let url = &worker.spec.url;
                let _ = writeln!(out, "{name}{{worker=\"{url}\"}} {tokens}");
            }
        }
        crate::workers::admin::driver::render_worker_gauges(self, out);
    }
}

/// The index (cache_aware only): the writer and one reader per data core. Without it (another
/// policy, or the index refused to start) routing runs without affinity.
fn build_index(config: &Config) -> (Option<IndexWriter>, Vec<Option<IndexReader>>) {
    let cores = config.data_cores;
    if config.policy.kind != PolicyKind::CacheAware {
        return (None, (0..cores).map(|_| None).collect());
    }
    let index_config = IndexConfig {
        block_size: config.policy.cache_aware.block_size,
    };
    let built = IndexWriter::new(index_config).and_then(|writer| {
        let readers = (0..cores)
            .map(|_| writer.reader().map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((writer, readers))
    });
    match built {
        Ok((writer, readers)) => (Some(writer), readers),
        Err(e) => {
            tracing::error!("prefix index unavailable, routing without affinity: {e}");
            (None, (0..cores).map(|_| None).collect())
        }
    }
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

fn build_runtime() -> std::io::Result<CoreRuntime> {
    monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .with_entries(URING_ENTRIES)
        .enable_timer()
        .build()
}

/// Binds one `SO_REUSEPORT` listener per data core on `addr` (port 0 picks one port for all).
fn bind_data_listeners(addr: SocketAddr, count: usize) -> std::io::Result<Vec<StdTcpListener>> {
    let mut listeners = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count {
        let listener = bind_listener(bound, true)?;
        bound = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

fn bind_listener(addr: SocketAddr, reuse_port: bool) -> std::io::Result<StdTcpListener> {
    use socket2::{Domain, Protocol, Socket as RawSocket, Type};
    let socket = RawSocket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(reuse_port)?;
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
    let metrics_listener = bind_listener(config.prometheus_addr, false).map_err(|e| {
        let addr = config.prometheus_addr;
        StartError(format!(
            "cannot listen on {addr} (--prometheus-host/--prometheus-port): {e}"
        ))
    })?;
    let listen_addr = listeners[0].local_addr().unwrap_or(config.listen_addr);
    let driver = if monoio::utils::detect_uring() {
        "io_uring"
    } else {
        "epoll (io_uring refused)"
    };
    let shared = Arc::new(Shared::new(config));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let threads = spawn_cores(&shared, listeners, metrics_listener, &ready_tx, &done_tx)?;
    for _ in 0..threads {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StartError(e)),
            Err(_) => return Err(StartError("a core thread died during start-up".into())),
        }
    }
    tracing::info!(
        "kvgate listening on {listen_addr}: {} data cores, {driver} driver, policy {}, {} workers",
        shared.config.data_cores,
        shared.config.policy.kind.name(),
        shared.config.workers.len(),
    );
    let signal = signals.wait();
    tracing::info!("signal {signal} received, shutting down");
    shared.begin_shutdown();
    let deadline = Instant::now() + SHUTDOWN_DRAIN_TIMEOUT + Duration::from_secs(1);
    for _ in 0..threads {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            tracing::warn!("shutdown drain timed out; exiting with requests in flight");
            break;
        }
    }
    Ok(())
}

/// Starts the control core and the data cores; returns how many threads were started.
fn spawn_cores(
    shared: &Arc<Shared>,
    listeners: Vec<StdTcpListener>,
    metrics_listener: StdTcpListener,
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
    spawn_named("kvgate-control".into(), move || {
        pin_c(0);
        run_control_core(shared_c, metrics_listener, ready_c);
        let _ = done_c.send(());
    })?;
    for (index, listener) in listeners.into_iter().enumerate() {
        let (shared_d, ready_d, done_d) = (shared.clone(), ready.clone(), done.clone());
        let pin_d = pin.clone();
        spawn_named(format!("kvgate-data-{index}"), move || {
            pin_d(index + 1);
            run_data_core(index, shared_d, listener, ready_d);
            let _ = done_d.send(());
        })?;
    }
    Ok(shared.config.data_cores + 1)
}

fn spawn_named(name: String, body: impl FnOnce() + Send + 'static) -> Result<(), StartError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map(|_| ())
        .map_err(|e| StartError(format!("cannot start thread {name}: {e}")))
}

fn run_control_core(
    shared: Arc<Shared>,
    metrics_listener: StdTcpListener,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let mut runtime = match build_runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(format!("control core runtime: {e}")));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    runtime.block_on(ControlCore::new(shared).run(metrics_listener));
}

fn run_data_core(
    index: usize,
    shared: Arc<Shared>,
    listener: StdTcpListener,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let mut runtime = match build_runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(format!("data core {index} runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = ready.send(Err(format!("data core {index} listener: {e}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let core = Rc::new(DataCore::new(index, shared));
        monoio::spawn(sweep_pool_forever(core.clone()));
        accept_until_shutdown(&listener, &core).await;
        drain_requests(&core).await;
    });
}

async fn accept_until_shutdown(listener: &TcpListener, core: &Rc<DataCore>) {
    loop {
        monoio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    monoio::spawn(serve_connection(core.clone(), Socket::new(stream)));
                }
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    monoio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = wait_for_shutdown(&core.shared) => return,
        }
    }
}

async fn wait_for_shutdown(shared: &Shared) {
    while !shared.is_shutting_down() {
        monoio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
}

/// Lets in-flight requests finish, up to `SHUTDOWN_DRAIN_TIMEOUT`.
async fn drain_requests(core: &DataCore) {
    let deadline = Instant::now() + SHUTDOWN_DRAIN_TIMEOUT;
    while core.requests_in_flight.get() > 0 && Instant::now() < deadline {
        monoio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
}

async fn sweep_pool_forever(core: Rc<DataCore>) {
    while !core.shared.is_shutting_down() {
        monoio::time::sleep(Duration::from_secs(1)).await;
        core.pool.borrow_mut().sweep(Instant::now());
        core.router.borrow_mut().quiesce();
    }
}
