//! The discovery thread (`kvgate-discovery`, only with `--service-discovery`): a tokio
//! current-thread runtime (the `kube` client needs tokio) that lists and watches the pods
//! matching `--selector` (under `--pd-disaggregation`, `--prefill-selector` and
//! `--decode-selector`) through the API server and hands the control core the same admin calls
//! an operator would make: `POST /workers` (with `worker_type` and `bootstrap_port`) for a pod
//! that turned ready, `DELETE /workers/{url}`
//! (which drains) for one that turned unready, is being deleted or is gone. The rules (which
//! pod is a worker, what to ask next) are `workers::discovery`; this thread only talks to the
//! API server and the admin queue. It never touches the worker table, and no data core sees it.
//!
//! The API server is found as `kubectl` finds it (`kube::Config::infer`: `KUBECONFIG` or
//! `~/.kube/config`, else the pod's service account). The watch (`kube::runtime::watcher`)
//! lists, then watches from the list's resource version, resumes from the last one it saw when
//! the connection drops, and lists again after a `410 Gone` (the version expired), each retry
//! after a backoff: a listing replaces what was known, so a pod deleted while the watch was
//! down is removed. Errors are logged; the thread keeps trying until shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::shared::{AdminReply, AdminRequest, Shared};
use crate::workers::admin::{AdminRoute, WorkerRef};
use crate::workers::discovery::{DiscoveredWorkers, DiscoveryConfig, Step};

/// How often the thread looks for answers to its admin calls and for shutdown while no pod
/// event arrives (the control core answers within a turn or two).
const ANSWER_POLL: Duration = Duration::from_millis(100);

/// An admin call sent and not answered yet.
struct Sent {
    step: Step,
    reply: Arc<AdminReply>,
}

/// Runs discovery until shutdown (the thread's body).
pub fn run(config: DiscoveryConfig, shared: Arc<Shared>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("service discovery not started: cannot build its runtime: {e}");
            return;
        }
    };
    runtime.block_on(watch_pods(config, shared));
}

/// Watches the pods and keeps the registered workers following them.
async fn watch_pods(config: DiscoveryConfig, shared: Arc<Shared>) {
    // kube's TLS (an in-cluster API server speaks https) takes the process's rustls provider:
    // aws-lc-rs, the one the data port's TLS uses (`config::tls`). Installing fails only when a
    // provider is already installed, which then serves as well.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = match Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(
                "service discovery not started: no Kubernetes API server found (in-cluster \
                 service account or kubeconfig): {e}"
            );
            return;
        }
    };
    let pods: Api<Pod> = match &config.namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let selector = config.label_selector();
    tracing::info!(
        selector = %selector,
        namespace = config.namespace.as_deref().unwrap_or("(all)"),
        "service discovery: watching pods"
    );
    // Under --pd-disaggregation the role selectors may share no label: then every pod is
    // listed and the roles' selectors pick the workers.
    let watch = match selector.is_empty() {
        true => watcher::Config::default(),
        false => watcher::Config::default().labels(&selector),
    };
    let mut events = watcher::watcher(pods, watch).default_backoff().boxed();
    let mut found = DiscoveredWorkers::default();
    let mut sent: Vec<Sent> = Vec::new();
    let mut poll = tokio::time::interval(ANSWER_POLL);
    while !shared.is_shutting_down() {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(event)) => apply_event(&mut found, event, &config),
                Some(Err(e)) => {
                    tracing::warn!("service discovery: watching pods failed, retrying: {e}");
                }
                None => {
                    tracing::error!("service discovery: the pod watch ended; no more changes");
                    return;
                }
            },
            _ = poll.tick() => {}
        }
        let now = Instant::now();
        collect_answers(&shared, &mut found, &mut sent, now);
        for step in found.next_steps(now) {
            send_step(&shared, &mut found, &mut sent, step, now);
        }
        let discovered = found.wanted().len();
        shared.metrics.discovery().set_discovered(discovered);
    }
}

/// Applies one watch event to what is known of the pods.
fn apply_event(found: &mut DiscoveredWorkers, event: Event<Pod>, config: &DiscoveryConfig) {
    match event {
        Event::Init => found.relist_started(),
        Event::InitApply(pod) | Event::Apply(pod) => found.apply(&pod, config),
        Event::InitDone => found.relist_done(),
        Event::Delete(pod) => found.delete(&pod),
    }
}

/// Queues the admin call for `step`; a full queue is a refusal, asked again later.
fn send_step(
    shared: &Shared,
    found: &mut DiscoveredWorkers,
    sent: &mut Vec<Sent>,
    step: Step,
    now: Instant,
) {
    let (route, body) = match &step {
        Step::Add(url, role) => {
            tracing::info!(worker = %url, worker_type = role.name(), "service discovery: pod ready, adding its worker");
            let body = serde_json::json!({
                "url": url,
                "worker_type": role.name(),
                "bootstrap_port": role.bootstrap_port(),
            });
            let body = body.to_string().into_bytes();
            (AdminRoute::AddWorker, body)
        }
        Step::Remove(url) => {
            tracing::info!(worker = %url, "service discovery: pod gone or not ready, removing its worker");
            (
                AdminRoute::RemoveWorker(WorkerRef::Url(url.clone())),
                Vec::new(),
            )
        }
    };
    let reply = Arc::new(AdminReply::default());
    let request = AdminRequest {
        route,
        body,
        reply: reply.clone(),
    };
    match shared.admin_queue.push(request) {
        Ok(()) => sent.push(Sent { step, reply }),
        Err(_) => found.answered(&step, 503, now),
    }
}

/// Takes the control core's answers to the calls sent.
fn collect_answers(
    shared: &Shared,
    found: &mut DiscoveredWorkers,
    sent: &mut Vec<Sent>,
    now: Instant,
) {
    let figures = shared.metrics.discovery();
    sent.retain(|call| {
        let Some((status, body)) = call.reply.try_take() else {
            return true;
        };
        match &call.step {
            Step::Add(..) => figures.count_registration(status == 201),
            Step::Remove(_) if status == 202 => figures.count_deregistration(),
            Step::Remove(_) => {}
        }
        match (&call.step, status) {
            (Step::Add(..), 201) | (Step::Remove(_), 202 | 404) => {}
            (Step::Add(url, _), _) => {
                tracing::warn!(worker = %url, status, answer = %body, "service discovery: worker not added yet; trying again")
            }
            (Step::Remove(url), _) => {
                tracing::warn!(worker = %url, status, answer = %body, "service discovery: worker not removed yet; trying again")
            }
        }
        found.answered(&call.step, status, now);
        false
    });
}
