//! Kubernetes service discovery as SMG's (`--service-discovery`, `--selector`,
//! `--service-discovery-port`, `--service-discovery-namespace`, and under `--pd-disaggregation`
//! `--prefill-selector`/`--decode-selector`), free of I/O: which pods are workers, in which
//! role, at which URLs, and what to add or remove so the registered workers follow them.
//!
//! Key types: [`DiscoveryArgs`] (the flags) and [`DiscoveryConfig`] (checked, its
//! [`Selectors`] per mode); [`pod_workers`] (a pod's workers, none unless it matches a selector,
//! runs, is `Ready` and is not being deleted: SMG's `PodInfo::is_healthy`; a prefill pod's
//! bootstrap port from its `sglang.ai/bootstrap-port` annotation); [`DiscoveredWorkers`], the
//! reconciliation: the workers the watched pods want against the ones discovery registered, as
//! [`Step`]s for the control core's admin lifecycle (`POST /workers` with `worker_type` and
//! `bootstrap_port`, `DELETE /workers/{url}`, which drains). A worker discovery did not add
//! (`--worker-urls`, `--prefill`/`--decode`, the admin API) is never removed by it. Errors: a
//! malformed flag is a `FlagError`; a pod that cannot be read is no worker.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;

use super::role::WorkerRole;
use crate::error::FlagError;

/// SMG's annotation listing a pod's worker ports (comma-separated), for pods that run several
/// servers; without it a pod has one worker on `--service-discovery-port`.
pub const WORKER_PORTS_ANNOTATION: &str = "smg.ai/worker-ports";

/// SMG's annotation giving a prefill pod's bootstrap port: one port for all its workers, or a
/// comma-separated list aligned with its worker ports. Absent or misaligned: `null`, the
/// engine's default (as `--prefill URL` without a port).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// How long a refused add (the worker not healthy yet, or still draining from an earlier pod
/// of the same address) waits before it is tried again.
pub const ADD_RETRY_WAIT: Duration = Duration::from_secs(2);

/// The discovery flags (SMG's "Service Discovery (Kubernetes)").
#[derive(Args, Debug, Clone, PartialEq, Default)]
pub struct DiscoveryArgs {
    /// Add and remove workers as Kubernetes pods matching --selector become ready or go away
    /// (the pods are watched through the API server; kvgate needs get, list and watch on pods).
    #[arg(
        help_heading = "Service Discovery (Kubernetes)",
        long = "service-discovery"
    )]
    pub service_discovery: bool,
    /// Labels a worker pod carries, as key=value (all must match).
    #[arg(help_heading = "Service Discovery (Kubernetes)", long, num_args = 0.., value_name = "KEY=VALUE")]
    pub selector: Vec<String>,
    /// Port of a discovered pod's worker, unless the pod lists its ports in its
    /// smg.ai/worker-ports annotation.
    #[arg(
        help_heading = "Service Discovery (Kubernetes)",
        long = "service-discovery-port",
        default_value_t = 80
    )]
    pub service_discovery_port: u16,
    /// Namespace whose pods are watched (default: every namespace the service account may see).
    #[arg(
        help_heading = "Service Discovery (Kubernetes)",
        long = "service-discovery-namespace"
    )]
    pub service_discovery_namespace: Option<String>,
    /// SMG's model-id override from pod metadata (namespace, label:KEY or annotation:KEY):
    /// accepted and not applied; kvgate reads each worker's models from its /v1/models.
    #[arg(
        help_heading = "Service Discovery (Kubernetes)",
        long = "model-id-from"
    )]
    pub model_id_from: Option<String>,
    /// Labels of prefill worker pods, as key=value (all must match), under --pd-disaggregation;
    /// a pod's bootstrap port is its sglang.ai/bootstrap-port annotation.
    #[arg(help_heading = "Service Discovery (Kubernetes)", long = "prefill-selector", num_args = 0.., value_name = "KEY=VALUE")]
    pub prefill_selector: Vec<String>,
    /// Labels of decode worker pods, as key=value (all must match), under --pd-disaggregation.
    #[arg(help_heading = "Service Discovery (Kubernetes)", long = "decode-selector", num_args = 0.., value_name = "KEY=VALUE")]
    pub decode_selector: Vec<String>,
}

/// Labels a pod must carry (all of them), in flag order.
pub type LabelSelector = Vec<(String, String)>;

/// Which pods are workers, and in which role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selectors {
    /// Regular mode: pods matching `--selector` are regular workers.
    Regular(LabelSelector),
    /// `--pd-disaggregation`: pods matching `--prefill-selector` are prefill workers, else those
    /// matching `--decode-selector` decode workers (SMG's order); either may be empty (no pod
    /// of that role is discovered).
    PrefillDecode {
        /// `--prefill-selector`.
        prefill: LabelSelector,
        /// `--decode-selector`.
        decode: LabelSelector,
    },
}

/// The checked discovery settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Which pods are workers, in which role.
    pub selectors: Selectors,
    /// A pod's worker port when it has no ports annotation.
    pub port: u16,
    /// The namespace watched (`None`: all).
    pub namespace: Option<String>,
}

/// A selector flag's `key=value` items, checked.
fn parse_selector(flag: &'static str, items: &[String]) -> Result<LabelSelector, FlagError> {
    let mut selector = Vec::with_capacity(items.len());
    for item in items {
        let pair = item.split_once('=').filter(|(k, _)| !k.trim().is_empty());
        let Some((key, value)) = pair else {
            let message = format!("{item:?} is not key=value");
            return Err(FlagError::new(flag, message));
        };
        selector.push((key.trim().to_string(), value.trim().to_string()));
    }
    Ok(selector)
}

impl DiscoveryArgs {
    /// The settings, `None` without `--service-discovery`; `pd_disaggregation` picks the
    /// selectors that apply (SMG's: `--selector` in regular mode, the role selectors under
    /// `--pd-disaggregation`, the others accepted and ignored). Notices for flags accepted and
    /// not applied go to `notices`.
    pub fn config(
        &self,
        pd_disaggregation: bool,
        notices: &mut Vec<String>,
    ) -> Result<Option<DiscoveryConfig>, FlagError> {
        if !self.service_discovery {
            return Ok(None);
        }
        let selector = parse_selector("--selector", &self.selector)?;
        let prefill = parse_selector("--prefill-selector", &self.prefill_selector)?;
        let decode = parse_selector("--decode-selector", &self.decode_selector)?;
        let selectors = match pd_disaggregation {
            false => {
                if selector.is_empty() {
                    // SMG refuses regular-mode discovery without one; so do we, saying why.
                    let message = "--service-discovery needs at least one key=value label";
                    return Err(FlagError::new("--selector", message));
                }
                if !prefill.is_empty() || !decode.is_empty() {
                    notices.push(
                        "--prefill-selector/--decode-selector are not applied without \
                         --pd-disaggregation: pods matching --selector are regular workers"
                            .to_string(),
                    );
                }
                Selectors::Regular(selector)
            }
            true => {
                if prefill.is_empty() && decode.is_empty() {
                    // SMG's rule: PD discovery needs at least one role selector.
                    let message = "--service-discovery with --pd-disaggregation needs \
                                   --prefill-selector or --decode-selector (key=value labels)";
                    return Err(FlagError::new("--prefill-selector", message));
                }
                if !selector.is_empty() {
                    notices.push(
                        "--selector is not applied under --pd-disaggregation: pods are found by \
                         --prefill-selector and --decode-selector"
                            .to_string(),
                    );
                }
                Selectors::PrefillDecode { prefill, decode }
            }
        };
        if self.service_discovery_port == 0 {
            return Err(FlagError::new(
                "--service-discovery-port",
                "must be 1..=65535",
            ));
        }
        if let Some(source) = &self.model_id_from {
            notices.push(format!(
                "--model-id-from {source} is not applied: kvgate reads each worker's models from \
                 its /v1/models"
            ));
        }
        Ok(Some(DiscoveryConfig {
            selectors,
            port: self.service_discovery_port,
            namespace: self.service_discovery_namespace.clone(),
        }))
    }
}

impl DiscoveryConfig {
    /// The selector as the API server takes it (`key=value,key=value`), so it filters: in
    /// regular mode `--selector`; under `--pd-disaggregation` the labels both role selectors
    /// share (SMG's), so one watch sees both roles; empty (no filter) when they share none.
    pub fn label_selector(&self) -> String {
        let pairs: Vec<String> = match &self.selectors {
            Selectors::Regular(selector) => {
                selector.iter().map(|(k, v)| format!("{k}={v}")).collect()
            }
            Selectors::PrefillDecode { prefill, decode } => {
                let (first, other) = match (prefill.is_empty(), decode.is_empty()) {
                    (true, _) => (decode, decode),
                    (_, true) => (prefill, prefill),
                    _ => (prefill, decode),
                };
                let shared = first.iter().filter(|pair| other.contains(pair));
                shared.map(|(k, v)| format!("{k}={v}")).collect()
            }
        };
        pairs.join(",")
    }

    /// The role a pod matching the selectors has, `None` when it matches none (a prefill pod's
    /// bootstrap port is read later, per worker port).
    fn role_of(&self, pod: &Pod) -> Option<WorkerRole> {
        let labels = pod.metadata.labels.as_ref();
        // An empty selector matches no pod (SMG's `matches_selector`).
        let matches = |selector: &LabelSelector| {
            !selector.is_empty()
                && selector
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        };
        match &self.selectors {
            Selectors::Regular(selector) => matches(selector).then_some(WorkerRole::Regular),
            Selectors::PrefillDecode { prefill, .. } if matches(prefill) => {
                Some(WorkerRole::Prefill {
                    bootstrap_port: None,
                })
            }
            Selectors::PrefillDecode { decode, .. } => {
                matches(decode).then_some(WorkerRole::Decode)
            }
        }
    }
}

/// One worker a pod serves: its URL and its role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodWorker {
    /// `http://<pod IP>:<port>`.
    pub url: String,
    /// Regular, prefill (with its bootstrap port) or decode.
    pub role: WorkerRole,
}

/// The workers `pod` serves now: `http://<pod IP>:<port>` for each of its ports, in the role
/// its labels give, or none when it matches no selector, is not `Running` and `Ready`, is
/// being deleted or has no IP yet.
pub fn pod_workers(pod: &Pod, config: &DiscoveryConfig) -> Vec<PodWorker> {
    let Some(role) = config.role_of(pod) else {
        return Vec::new();
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let running = status.phase.as_deref() == Some("Running");
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let Some(ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) else {
        return Vec::new();
    };
    if !running || !ready {
        return Vec::new();
    }
    // An IPv6 address takes brackets in a URL.
    let host = match ip.contains(':') {
        true => format!("[{ip}]"),
        false => ip.to_string(),
    };
    let ports = pod_ports(pod, config);
    let bootstrap_ports = match role {
        WorkerRole::Prefill { .. } => pod_bootstrap_ports(pod, ports.len()),
        _ => vec![None; ports.len()],
    };
    let roles = bootstrap_ports
        .into_iter()
        .map(|bootstrap_port| match role {
            WorkerRole::Prefill { .. } => WorkerRole::Prefill { bootstrap_port },
            other => other,
        });
    ports
        .into_iter()
        .zip(roles)
        .map(|(port, role)| PodWorker {
            url: format!("http://{host}:{port}"),
            role,
        })
        .collect()
}

/// A prefill pod's bootstrap port per worker port (SMG's rule): its annotation's one port for
/// all of them, or its list when as long as the worker ports; otherwise (absent, malformed,
/// misaligned) none, the engine's default.
fn pod_bootstrap_ports(pod: &Pod, worker_ports: usize) -> Vec<Option<u16>> {
    let annotations = pod.metadata.annotations.as_ref();
    let Some(raw) = annotations.and_then(|a| a.get(BOOTSTRAP_PORT_ANNOTATION)) else {
        return vec![None; worker_ports];
    };
    let parsed: Option<Vec<u16>> = raw
        .split(',')
        .map(|part| part.trim().parse::<u16>().ok().filter(|p| *p > 0))
        .collect();
    match parsed {
        Some(ports) if ports.len() == 1 => vec![Some(ports[0]); worker_ports],
        Some(ports) if ports.len() == worker_ports => ports.into_iter().map(Some).collect(),
        _ => {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                annotation = %raw,
                worker_ports,
                "invalid {BOOTSTRAP_PORT_ANNOTATION} annotation (a port, or one per worker \
                 port); using the engine's default"
            );
            vec![None; worker_ports]
        }
    }
}

/// The pod's worker ports: its annotation's list (in order, each once) when it parses, else
/// the configured port.
fn pod_ports(pod: &Pod, config: &DiscoveryConfig) -> Vec<u16> {
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WORKER_PORTS_ANNOTATION));
    let Some(raw) = annotation else {
        return vec![config.port];
    };
    let mut ports = Vec::new();
    for part in raw.split(',') {
        match part.trim().parse::<u16>() {
            Ok(port) if port > 0 => {
                if !ports.contains(&port) {
                    ports.push(port);
                }
            }
            _ => {
                tracing::warn!(
                    pod = pod.metadata.name.as_deref().unwrap_or(""),
                    annotation = %raw,
                    "invalid {WORKER_PORTS_ANNOTATION} annotation; using --service-discovery-port"
                );
                return vec![config.port];
            }
        }
    }
    ports
}

/// A pod's identity across its events: its UID (a pod recreated under the same name is
/// another pod).
fn pod_key(pod: &Pod) -> Option<String> {
    pod.metadata
        .uid
        .clone()
        .or_else(|| pod.metadata.name.clone())
}

/// Where one URL discovery wants stands with the control core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Registration {
    /// Its add was sent and not answered yet.
    Adding,
    /// Registered by discovery.
    Added,
    /// Its add was refused; try again after this instant.
    RetryAfter(Instant),
    /// Its removal was sent and not answered yet.
    Removing,
}

/// What discovery asks of the control core next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Register this worker in this role (`POST /workers` with `worker_type` and
    /// `bootstrap_port`).
    Add(String, WorkerRole),
    /// Remove this worker, draining it (`DELETE /workers/{url}`).
    Remove(String),
}

/// The pods watched and the workers discovery registered for them.
#[derive(Debug, Default)]
pub struct DiscoveredWorkers {
    /// Workers per pod, for the pods that serve now.
    pods: BTreeMap<String, Vec<PodWorker>>,
    /// A listing in progress (the watch restarted): pods seen so far.
    relisting: Option<BTreeMap<String, Vec<PodWorker>>>,
    registered: BTreeMap<String, Registration>,
}

impl DiscoveredWorkers {
    /// A pod was added or changed.
    pub fn apply(&mut self, pod: &Pod, config: &DiscoveryConfig) {
        let Some(key) = pod_key(pod) else {
            return;
        };
        let workers = pod_workers(pod, config);
        let pods = self.relisting.as_mut().unwrap_or(&mut self.pods);
        if workers.is_empty() {
            pods.remove(&key);
        } else {
            pods.insert(key, workers);
        }
    }

    /// A pod is gone.
    pub fn delete(&mut self, pod: &Pod) {
        if let Some(key) = pod_key(pod) {
            self.pods.remove(&key);
        }
    }

    /// The watch starts over with a full listing (at start, after a 410 Gone or a lost
    /// watch): the pods it lists replace the known ones when it ends.
    pub fn relist_started(&mut self) {
        self.relisting = Some(BTreeMap::new());
    }

    /// The listing ended: pods it did not list are gone.
    pub fn relist_done(&mut self) {
        if let Some(listed) = self.relisting.take() {
            self.pods = listed;
        }
    }

    /// The URLs the pods want now, each with its role (the first pod's, should two claim one
    /// address).
    pub fn wanted(&self) -> BTreeMap<&str, WorkerRole> {
        let mut wanted = BTreeMap::new();
        for worker in self.pods.values().flatten() {
            wanted.entry(worker.url.as_str()).or_insert(worker.role);
        }
        wanted
    }

    /// Workers discovery registered (and has not removed).
    pub fn registered(&self) -> Vec<&str> {
        let added = self.registered.iter();
        added
            .filter(|(_, r)| **r == Registration::Added)
            .map(|(url, _)| url.as_str())
            .collect()
    }

    /// What to ask now: an add for each wanted URL not registered (or whose refused add may be
    /// tried again), a removal for each registered URL no pod wants. Each step is marked as
    /// sent; its answer comes back through [`DiscoveredWorkers::answered`].
    pub fn next_steps(&mut self, now: Instant) -> Vec<Step> {
        let wanted: BTreeMap<String, WorkerRole> = (self.wanted().into_iter())
            .map(|(url, role)| (url.to_string(), role))
            .collect();
        let mut steps = Vec::new();
        for (url, role) in &wanted {
            let due = match self.registered.get(url) {
                None => true,
                Some(Registration::RetryAfter(at)) => now >= *at,
                Some(_) => false,
            };
            if due {
                self.registered.insert(url.clone(), Registration::Adding);
                steps.push(Step::Add(url.clone(), *role));
            }
        }
        let mut forgotten = Vec::new();
        for (url, registration) in self.registered.iter_mut() {
            if wanted.contains_key(url) {
                continue;
            }
            match registration {
                Registration::Added => {
                    *registration = Registration::Removing;
                    steps.push(Step::Remove(url.clone()));
                }
                // Never registered: nothing to undo.
                Registration::RetryAfter(_) => forgotten.push(url.clone()),
                Registration::Adding | Registration::Removing => {}
            }
        }
        for url in forgotten {
            self.registered.remove(&url);
        }
        steps
    }

    /// The control core's answer to `step` (its HTTP status): an add registered (201) or
    /// refused (tried again after [`ADD_RETRY_WAIT`] while a pod still wants it); a removal
    /// done (202) or of a worker already gone (404).
    pub fn answered(&mut self, step: &Step, status: u16, now: Instant) {
        match step {
            Step::Add(url, _) => {
                let registration = match status {
                    201 => Registration::Added,
                    _ => Registration::RetryAfter(now + ADD_RETRY_WAIT),
                };
                self.registered.insert(url.clone(), registration);
            }
            Step::Remove(url) => match status {
                202 | 404 => {
                    self.registered.remove(url);
                }
                // Not accepted (the admin queue was full): still registered, asked again.
                _ => {
                    self.registered.insert(url.clone(), Registration::Added);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DiscoveryConfig {
        DiscoveryConfig {
            selectors: Selectors::Regular(vec![("app".into(), "engine".into())]),
            port: 8000,
            namespace: Some("default".into()),
        }
    }

    fn pod(uid: &str, ip: &str, ready: bool, labels: &[(&str, &str)]) -> Pod {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        let ready = if ready { "True" } else { "False" };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid, "labels": labels},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": ready}]},
        }))
        .unwrap_or_default()
    }

    /// The URLs of a pod's workers.
    fn pod_urls(pod: &Pod, config: &DiscoveryConfig) -> Vec<String> {
        pod_workers(pod, config)
            .into_iter()
            .map(|w| w.url)
            .collect()
    }

    #[test]
    fn only_a_ready_running_matching_pod_is_a_worker() {
        let engine = [("app", "engine")];
        assert_eq!(
            pod_urls(&pod("a", "10.0.0.1", true, &engine), &config()),
            ["http://10.0.0.1:8000"]
        );
        assert!(pod_urls(&pod("a", "10.0.0.1", false, &engine), &config()).is_empty());
        assert!(pod_urls(&pod("a", "10.0.0.1", true, &[("app", "x")]), &config()).is_empty());
        assert!(pod_urls(&pod("a", "", true, &engine), &config()).is_empty());
        let mut pending = pod("a", "10.0.0.1", true, &engine);
        if let Some(status) = pending.status.as_mut() {
            status.phase = Some("Pending".into());
        }
        assert!(pod_urls(&pending, &config()).is_empty());
        let mut deleting = pod("a", "10.0.0.1", true, &engine);
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(serde_json::json!("2026-01-01T00:00:00Z")).ok();
        assert!(pod_urls(&deleting, &config()).is_empty());
        // The ports annotation: one worker per port, IPv6 in brackets.
        let mut multi = pod("b", "fd00::7", true, &engine);
        let ports = [(
            WORKER_PORTS_ANNOTATION.to_string(),
            "8001, 8002,8001".into(),
        )];
        multi.metadata.annotations = Some(ports.into_iter().collect());
        assert_eq!(
            pod_urls(&multi, &config()),
            ["http://[fd00::7]:8001", "http://[fd00::7]:8002"]
        );
    }

    #[test]
    fn reconciliation_adds_ready_pods_and_removes_only_what_it_added() {
        let (engine, now) = ([("app", "engine")], Instant::now());
        let mut found = DiscoveredWorkers::default();
        found.relist_started();
        found.apply(&pod("a", "10.0.0.1", true, &engine), &config());
        found.apply(&pod("b", "10.0.0.2", false, &engine), &config());
        found.relist_done();
        let add_a = Step::Add("http://10.0.0.1:8000".into(), WorkerRole::Regular);
        assert_eq!(found.next_steps(now), std::slice::from_ref(&add_a));
        // Asked once while the answer is pending.
        assert!(found.next_steps(now).is_empty());
        found.answered(&add_a, 201, now);
        assert_eq!(found.registered(), ["http://10.0.0.1:8000"]);
        // b turns ready and its add is refused: tried again after the wait.
        found.apply(&pod("b", "10.0.0.2", true, &engine), &config());
        let add_b = Step::Add("http://10.0.0.2:8000".into(), WorkerRole::Regular);
        assert_eq!(found.next_steps(now), std::slice::from_ref(&add_b));
        found.answered(&add_b, 503, now);
        assert!(found.next_steps(now).is_empty());
        assert_eq!(
            found.next_steps(now + ADD_RETRY_WAIT),
            std::slice::from_ref(&add_b)
        );
        found.answered(&add_b, 201, now);
        // a turns unready: removed (drained); b is deleted: removed.
        found.apply(&pod("a", "10.0.0.1", false, &engine), &config());
        found.delete(&pod("b", "10.0.0.2", true, &engine));
        let steps = found.next_steps(now);
        let remove_a = Step::Remove("http://10.0.0.1:8000".into());
        let remove_b = Step::Remove("http://10.0.0.2:8000".into());
        assert_eq!(steps, [remove_a.clone(), remove_b.clone()]);
        found.answered(&remove_a, 202, now);
        found.answered(&remove_b, 404, now);
        assert!(found.registered().is_empty());
        assert!(found.next_steps(now).is_empty());
        // A relisting that no longer lists a pod removes its worker.
        found.apply(&pod("c", "10.0.0.3", true, &engine), &config());
        let add_c = Step::Add("http://10.0.0.3:8000".into(), WorkerRole::Regular);
        assert_eq!(found.next_steps(now), std::slice::from_ref(&add_c));
        found.answered(&add_c, 201, now);
        found.relist_started();
        found.relist_done();
        let remove_c = Step::Remove("http://10.0.0.3:8000".into());
        assert_eq!(found.next_steps(now), [remove_c]);
    }

    #[test]
    fn the_flags_need_a_selector_of_key_value_pairs() {
        let mut notices = Vec::new();
        let off = DiscoveryArgs::default();
        assert_eq!(off.config(false, &mut notices).ok(), Some(None));
        let on = DiscoveryArgs {
            service_discovery: true,
            selector: vec!["app=engine".into(), "tier = gpu".into()],
            service_discovery_port: 8000,
            service_discovery_namespace: None,
            model_id_from: Some("namespace".into()),
            prefill_selector: vec![],
            decode_selector: vec![],
        };
        let config = on.config(false, &mut notices).ok().flatten();
        let config = config.unwrap_or_else(|| panic!("refused"));
        assert_eq!(config.label_selector(), "app=engine,tier=gpu");
        assert_eq!(
            notices.len(),
            1,
            "--model-id-from is accepted and named as not applied"
        );
        for selector in [vec![], vec!["app".to_string()], vec!["=x".to_string()]] {
            let args = DiscoveryArgs {
                selector,
                ..on.clone()
            };
            assert!(args.config(false, &mut notices).is_err());
        }
    }

    fn pd_config(prefill: &[(&str, &str)], decode: &[(&str, &str)]) -> DiscoveryConfig {
        let selector = |pairs: &[(&str, &str)]| -> LabelSelector {
            let owned = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            owned.collect()
        };
        DiscoveryConfig {
            selectors: Selectors::PrefillDecode {
                prefill: selector(prefill),
                decode: selector(decode),
            },
            ..config()
        }
    }

    fn annotated(mut pod: Pod, pairs: &[(&str, &str)]) -> Pod {
        let annotations = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        pod.metadata.annotations = Some(annotations.collect());
        pod
    }

    #[test]
    fn under_pd_a_pod_is_a_prefill_or_decode_worker_by_its_labels() {
        let config = pd_config(
            &[("app", "engine"), ("role", "prefill")],
            &[("app", "engine"), ("role", "decode")],
        );
        // One watch covers both roles: the labels the selectors share.
        assert_eq!(config.label_selector(), "app=engine");
        let prefill_labels = [("app", "engine"), ("role", "prefill")];
        let prefill = annotated(
            pod("p", "10.0.0.1", true, &prefill_labels),
            &[(BOOTSTRAP_PORT_ANNOTATION, "8998")],
        );
        let role = |bootstrap_port| WorkerRole::Prefill { bootstrap_port };
        let worker = |url: &str, role| PodWorker {
            url: url.into(),
            role,
        };
        assert_eq!(
            pod_workers(&prefill, &config),
            [worker("http://10.0.0.1:8000", role(Some(8998)))]
        );
        let decode = pod(
            "d",
            "10.0.0.2",
            true,
            &[("app", "engine"), ("role", "decode")],
        );
        assert_eq!(
            pod_workers(&decode, &config),
            [worker("http://10.0.0.2:8000", WorkerRole::Decode)]
        );
        // A pod of neither role, or an unready one, is no worker.
        assert!(pod_workers(&pod("r", "10.0.0.3", true, &[("app", "engine")]), &config).is_empty());
        assert!(pod_workers(&pod("p", "10.0.0.1", false, &prefill_labels), &config).is_empty());
        // A decode pod's bootstrap annotation is not read.
        let decode = annotated(decode, &[(BOOTSTRAP_PORT_ANNOTATION, "8998")]);
        assert_eq!(pod_workers(&decode, &config)[0].role, WorkerRole::Decode);
        // Several worker ports: one bootstrap port for all, or one each; else the default.
        let cases = [
            ("9000", [Some(9000), Some(9000)]),
            ("9000,9001", [Some(9000), Some(9001)]),
            ("9000,9001,9002", [None, None]),
            ("x", [None, None]),
            ("0", [None, None]),
        ];
        for (annotation, expected) in cases {
            let multi = annotated(
                pod("p", "10.0.0.1", true, &prefill_labels),
                &[
                    (WORKER_PORTS_ANNOTATION, "8001,8002"),
                    (BOOTSTRAP_PORT_ANNOTATION, annotation),
                ],
            );
            let roles: Vec<WorkerRole> = pod_workers(&multi, &config)
                .into_iter()
                .map(|w| w.role)
                .collect();
            assert_eq!(roles, expected.map(role), "{annotation}");
        }
        // Without the annotation: the engine's default.
        let bare = pod("p", "10.0.0.1", true, &prefill_labels);
        assert_eq!(pod_workers(&bare, &config)[0].role, role(None));
        // Only a decode selector: its labels filter, and no pod is a prefill worker.
        let decode_only = pd_config(&[], &[("role", "decode")]);
        assert_eq!(decode_only.label_selector(), "role=decode");
        assert!(pod_workers(&bare, &decode_only).is_empty());
        // Selectors sharing no label: no filter.
        assert_eq!(pd_config(&[("a", "1")], &[("b", "2")]).label_selector(), "");
    }

    #[test]
    fn pd_discovery_adds_each_worker_in_its_role() {
        let config = pd_config(&[("role", "prefill")], &[("role", "decode")]);
        let now = Instant::now();
        let mut found = DiscoveredWorkers::default();
        let prefill = annotated(
            pod("p", "10.0.0.1", true, &[("role", "prefill")]),
            &[(BOOTSTRAP_PORT_ANNOTATION, "8998")],
        );
        found.apply(&prefill, &config);
        found.apply(&pod("d", "10.0.0.2", true, &[("role", "decode")]), &config);
        let add_p = Step::Add(
            "http://10.0.0.1:8000".into(),
            WorkerRole::Prefill {
                bootstrap_port: Some(8998),
            },
        );
        let add_d = Step::Add("http://10.0.0.2:8000".into(), WorkerRole::Decode);
        assert_eq!(found.next_steps(now), [add_p.clone(), add_d.clone()]);
        found.answered(&add_p, 201, now);
        found.answered(&add_d, 201, now);
        found.delete(&prefill);
        assert_eq!(
            found.next_steps(now),
            [Step::Remove("http://10.0.0.1:8000".into())]
        );
    }

    #[test]
    fn the_pd_selectors_apply_under_pd_disaggregation_as_smgs_do() {
        let mut notices = Vec::new();
        let args = DiscoveryArgs {
            service_discovery: true,
            selector: vec!["app=engine".into()],
            service_discovery_port: 8000,
            prefill_selector: vec!["role=prefill".into()],
            decode_selector: vec!["role=decode".into()],
            ..DiscoveryArgs::default()
        };
        // Regular mode: --selector applies, the role selectors are named as not applied.
        let regular = args.config(false, &mut notices).ok().flatten();
        let regular = regular.unwrap_or_else(|| panic!("refused"));
        let engine = vec![("app".to_string(), "engine".to_string())];
        assert_eq!(regular.selectors, Selectors::Regular(engine));
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].contains("--prefill-selector"), "{notices:?}");
        // PD: the role selectors apply, --selector is named as not applied.
        notices.clear();
        let pd = args.config(true, &mut notices).ok().flatten();
        let pd = pd.unwrap_or_else(|| panic!("refused"));
        let pair = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let expected = Selectors::PrefillDecode {
            prefill: pair("role", "prefill"),
            decode: pair("role", "decode"),
        };
        assert_eq!(pd.selectors, expected);
        assert!(
            notices.len() == 1 && notices[0].contains("--selector"),
            "{notices:?}"
        );
        // PD without --selector and with one role selector is enough (SMG's rule).
        let decode_only = DiscoveryArgs {
            selector: vec![],
            prefill_selector: vec![],
            ..args.clone()
        };
        assert!(matches!(
            decode_only.config(true, &mut notices),
            Ok(Some(_))
        ));
        // PD with neither role selector is refused, even with --selector.
        let neither = DiscoveryArgs {
            prefill_selector: vec![],
            decode_selector: vec![],
            ..args.clone()
        };
        let refused = neither.config(true, &mut notices).err();
        assert_eq!(refused.map(|e| e.flag), Some("--prefill-selector"));
        // A malformed role selector is refused under its own flag.
        let bad = DiscoveryArgs {
            decode_selector: vec!["decode".into()],
            ..args
        };
        let refused = bad.config(true, &mut notices).err();
        assert_eq!(refused.map(|e| e.flag), Some("--decode-selector"));
    }
}
