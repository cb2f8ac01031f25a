//! Kubernetes service discovery as SMG's (`--service-discovery`, `--selector`,
//! `--service-discovery-port`, `--service-discovery-namespace`), free of I/O: which pods are
//! workers, at which URLs, and what to add or remove so the registered workers follow them.
//!
//! Key types: [`DiscoveryArgs`] (the flags) and [`DiscoveryConfig`] (checked); [`pod_urls`] (a
//! pod's worker URLs, none unless it matches the selector, runs, is `Ready` and is not being
//! deleted: SMG's `PodInfo::is_healthy`); [`DiscoveredWorkers`], the reconciliation: the URLs
//! the watched pods want against the ones discovery registered, as [`Step`]s for the control
//! core's admin lifecycle (`POST /workers`, `DELETE /workers/{url}`, which drains). A worker
//! discovery did not add (`--worker-urls`, the admin API) is never removed by it. Errors: a
//! malformed flag is a `FlagError`; a pod that cannot be read is no worker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::core::v1::Pod;

use crate::error::FlagError;

/// SMG's annotation listing a pod's worker ports (comma-separated), for pods that run several
/// servers; without it a pod has one worker on `--service-discovery-port`.
pub const WORKER_PORTS_ANNOTATION: &str = "smg.ai/worker-ports";

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
}

/// The checked discovery settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Labels a worker pod must carry, in flag order.
    pub selector: Vec<(String, String)>,
    /// A pod's worker port when it has no ports annotation.
    pub port: u16,
    /// The namespace watched (`None`: all).
    pub namespace: Option<String>,
}

impl DiscoveryArgs {
    /// The settings, `None` without `--service-discovery`; notices for flags accepted and not
    /// applied go to `notices`.
    pub fn config(&self, notices: &mut Vec<String>) -> Result<Option<DiscoveryConfig>, FlagError> {
        if !self.service_discovery {
            return Ok(None);
        }
        let mut selector = Vec::with_capacity(self.selector.len());
        for item in &self.selector {
            let pair = item.split_once('=').filter(|(k, _)| !k.trim().is_empty());
            let Some((key, value)) = pair else {
                let message = format!("{item:?} is not key=value");
                return Err(FlagError::new("--selector", message));
            };
            selector.push((key.trim().to_string(), value.trim().to_string()));
        }
        if selector.is_empty() {
            // SMG discovers nothing without one; refusing says why at start.
            let message = "--service-discovery needs at least one key=value label";
            return Err(FlagError::new("--selector", message));
        }
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
            selector,
            port: self.service_discovery_port,
            namespace: self.service_discovery_namespace.clone(),
        }))
    }
}

impl DiscoveryConfig {
    /// The selector as the API server takes it (`key=value,key=value`), so it filters.
    pub fn label_selector(&self) -> String {
        let pairs: Vec<String> = self
            .selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        pairs.join(",")
    }

    fn matches(&self, pod: &Pod) -> bool {
        let labels = pod.metadata.labels.as_ref();
        self.selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }
}

/// The worker URLs `pod` serves now: `http://<pod IP>:<port>` for each of its ports, or none
/// when it does not match the selector, is not `Running` and `Ready`, is being deleted or has
/// no IP yet.
pub fn pod_urls(pod: &Pod, config: &DiscoveryConfig) -> Vec<String> {
    if !config.matches(pod) || pod.metadata.deletion_timestamp.is_some() {
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
    pod_ports(pod, config)
        .into_iter()
        .map(|port| format!("http://{host}:{port}"))
        .collect()
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
    /// Register this worker (`POST /workers`).
    Add(String),
    /// Remove this worker, draining it (`DELETE /workers/{url}`).
    Remove(String),
}

/// The pods watched and the workers discovery registered for them.
#[derive(Debug, Default)]
pub struct DiscoveredWorkers {
    /// Worker URLs per pod, for the pods that serve now.
    pods: BTreeMap<String, Vec<String>>,
    /// A listing in progress (the watch restarted): pods seen so far.
    relisting: Option<BTreeMap<String, Vec<String>>>,
    registered: BTreeMap<String, Registration>,
}

impl DiscoveredWorkers {
    /// A pod was added or changed.
    pub fn apply(&mut self, pod: &Pod, config: &DiscoveryConfig) {
        let Some(key) = pod_key(pod) else {
            return;
        };
        let urls = pod_urls(pod, config);
        let pods = self.relisting.as_mut().unwrap_or(&mut self.pods);
        if urls.is_empty() {
            pods.remove(&key);
        } else {
            pods.insert(key, urls);
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

    /// The URLs the pods want now.
    pub fn wanted(&self) -> BTreeSet<&str> {
        self.pods.values().flatten().map(String::as_str).collect()
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
        let wanted: BTreeSet<String> = self.wanted().into_iter().map(String::from).collect();
        let mut steps = Vec::new();
        for url in &wanted {
            let due = match self.registered.get(url) {
                None => true,
                Some(Registration::RetryAfter(at)) => now >= *at,
                Some(_) => false,
            };
            if due {
                self.registered.insert(url.clone(), Registration::Adding);
                steps.push(Step::Add(url.clone()));
            }
        }
        let mut forgotten = Vec::new();
        for (url, registration) in self.registered.iter_mut() {
            if wanted.contains(url) {
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
            Step::Add(url) => {
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
            selector: vec![("app".into(), "engine".into())],
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
        let add_a = Step::Add("http://10.0.0.1:8000".into());
        assert_eq!(found.next_steps(now), std::slice::from_ref(&add_a));
        // Asked once while the answer is pending.
        assert!(found.next_steps(now).is_empty());
        found.answered(&add_a, 201, now);
        assert_eq!(found.registered(), ["http://10.0.0.1:8000"]);
        // b turns ready and its add is refused: tried again after the wait.
        found.apply(&pod("b", "10.0.0.2", true, &engine), &config());
        let add_b = Step::Add("http://10.0.0.2:8000".into());
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
        let add_c = Step::Add("http://10.0.0.3:8000".into());
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
        assert_eq!(off.config(&mut notices).ok(), Some(None));
        let on = DiscoveryArgs {
            service_discovery: true,
            selector: vec!["app=engine".into(), "tier = gpu".into()],
            service_discovery_port: 8000,
            service_discovery_namespace: None,
            model_id_from: Some("namespace".into()),
        };
        let config = on.config(&mut notices).ok().flatten();
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
            assert!(args.config(&mut notices).is_err());
        }
    }
}
