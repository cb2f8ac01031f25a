//! The data core's side of routing, called by the gateway's route seam (`http::route`):
//! [`CoreRouting::prepare`] classifies nothing itself but extracts the routing input from the
//! body (a body that is not a JSON object is a [`RequestError`], 400), looks the key up in the
//! index under its namespace (model + partition) and merges this core's recent dispatches;
//! [`CoreRouting::choose`] builds the worker statuses and runs the policy (once per attempt, so a
//! retry excludes the workers already tried); [`CoreRouting::dispatch_record`] produces the
//! [`RecordKey`] the control core inserts (spec step 7) and remembers it for bursts.
//!
//! All buffers (routing input, statuses) are owned here and reused across requests; the one
//! allocation per cache_aware request is the shared copy of the key sent to the control core.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::recent::{KeyData, RecentDispatches};
use super::simple::PREFIX_HASH_CHARS_PER_TOKEN;
use super::{PolicyConfig, PolicyMetrics, RouteRequest, Router, WorkerRing, WorkerStatus};
use crate::index::{IndexReader, Namespace, TreeMatch, MODELS_MAX};
use crate::request::{extract, Endpoint, RequestError, RoutingHeaders, RoutingInput, RoutingKey};
use crate::workers::WorkerId;

/// The key of one dispatch, for the index insert on the control core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordKey {
    /// Model and partition.
    pub namespace: Namespace,
    /// The routing key (text or tokens).
    pub key: KeyData,
    /// The model's name, sent the first time this core sees the model (for gauge labels).
    pub model_name: Option<Box<str>>,
}

/// The model half of a namespace: a hash of the model id.
pub fn model_hash(model: &str) -> u64 {
    xxh3_64(model.as_bytes())
}

/// One data core's routing state.
#[derive(Debug)]
pub struct CoreRouting {
    router: Router,
    reader: Option<IndexReader>,
    input: RoutingInput,
    namespace: Namespace,
    tree: Option<TreeMatch>,
    recent: RecentDispatches,
    statuses: Vec<WorkerStatus>,
    ring: WorkerRing,
    ring_members: Vec<(WorkerId, String)>,
    announced_models: Vec<u64>,
    /// Prompt tokens this core dispatched to each worker since its last load report.
    credits: Vec<Credit>,
}

/// This core's dispatches to one worker since the load report `generation`.
#[derive(Clone, Copy, Debug, Default)]
struct Credit {
    generation: usize,
    tokens: u64,
}

impl CoreRouting {
    /// Routing for one core; `reader` is this core's index handle (`None`: no index, as in
    /// policies that do not use it).
    pub fn new(
        config: PolicyConfig,
        seed: u64,
        reader: Option<IndexReader>,
        metrics: Arc<PolicyMetrics>,
    ) -> Self {
        CoreRouting {
            router: Router::new(config, seed, metrics),
            reader,
            input: RoutingInput::new(),
            namespace: Namespace::default(),
            tree: None,
            recent: RecentDispatches::default(),
            statuses: Vec::new(),
            ring: WorkerRing::default(),
            ring_members: Vec::new(),
            announced_models: Vec::new(),
            credits: Vec::new(),
        }
    }

    /// Extracts the routing input and, for cache_aware, looks it up. `now_ms` is the gateway
    /// tick (ms since start), the clock of the recent-dispatch map.
    pub fn prepare(
        &mut self,
        endpoint: Endpoint,
        headers: RoutingHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), RequestError> {
        extract(endpoint, body, headers, &mut self.input)?;
        self.namespace = Namespace {
            model: model_hash(self.input.model()),
            partition: self.input.namespace().0,
        };
        self.tree = None;
        let key = self.input.key();
        if !self.router.uses_index() || key.is_empty() {
            return Ok(());
        }
        let mut tree = match (&self.reader, key) {
            (Some(reader), RoutingKey::Text(text)) => reader.lookup_text(self.namespace, text),
            (Some(reader), RoutingKey::Tokens(tokens)) => {
                reader.lookup_tokens(self.namespace, tokens)
            }
            (None, _) => TreeMatch {
                request_len: request_len(key),
                ..TreeMatch::default()
            },
        };
        let block_size = self.router.config().cache_aware.block_size;
        self.recent
            .merge_into(&mut tree, self.namespace, key, now_ms, block_size);
        self.tree = Some(tree);
        if let Some(reader) = &mut self.reader {
            reader.quiesce();
        }
        Ok(())
    }

    /// The `model` field of the prepared request (empty when absent).
    pub fn model(&self) -> &str {
        self.input.model()
    }

    /// Runs the policy over `workers`: `(id, url, status, load generation)` of every active
    /// worker, where a worker already tried comes with `eligible: false` and the generation
    /// identifies its current load report (0: none). This core's dispatch credits count toward a
    /// worker's expected wait until its next report.
    pub fn choose<'w>(
        &mut self,
        workers: impl Iterator<Item = (WorkerId, &'w str, WorkerStatus, usize)> + Clone,
    ) -> Option<WorkerId> {
        self.refresh_ring(workers.clone().map(|(id, url, _, _)| (id, url)));
        self.statuses.clear();
        for (id, _, mut status, generation) in workers {
            let slot = id.index();
            if self.statuses.len() <= slot {
                self.statuses.resize(slot + 1, WorkerStatus::default());
            }
            if self.credits.len() <= slot {
                self.credits.resize(slot + 1, Credit::default());
            }
            if self.credits[slot].generation != generation {
                self.credits[slot] = Credit {
                    generation,
                    tokens: 0,
                };
            }
            status.credited_tokens += self.credits[slot].tokens;
            self.statuses[slot] = status;
        }
        let request = RouteRequest {
            input: &self.input,
            tree: self.tree.as_ref(),
            workers: &self.statuses,
            ring: &self.ring,
        };
        let worker = self.router.route(&request)?.worker;
        if let Some(credit) = self.credits.get_mut(worker.index()) {
            credit.tokens = credit
                .tokens
                .saturating_add(request_tokens(self.input.key()));
        }
        Some(worker)
    }

    /// The record for a request dispatched to `worker` (cache_aware only: other policies do not
    /// build the index), also remembered in the recent-dispatch map.
    pub fn dispatch_record(&mut self, worker: WorkerId, tick_ms: u64) -> Option<RecordKey> {
        if !self.router.uses_index() || self.input.key().is_empty() {
            return None;
        }
        let key = KeyData::of(self.input.key());
        self.recent
            .push(self.namespace, key.clone(), worker, tick_ms);
        let model = self.namespace.model;
        let model_name = if self.announced_models.contains(&model)
            || self.announced_models.len() >= MODELS_MAX
        {
            None
        } else {
            self.announced_models.push(model);
            Some(Box::from(self.input.model()))
        };
        Some(RecordKey {
            namespace: self.namespace,
            key,
            model_name,
        })
    }

    /// Marks this core quiescent for index reclamation (call when idle, e.g. once a second).
    pub fn quiesce(&mut self) {
        if let Some(reader) = &mut self.reader {
            reader.quiesce();
        }
    }

    /// Rebuilds the hash ring when the worker set changed (compared by id and URL).
    fn refresh_ring<'w>(&mut self, workers: impl Iterator<Item = (WorkerId, &'w str)> + Clone) {
        let same = workers.clone().count() == self.ring_members.len()
            && workers
                .clone()
                .zip(&self.ring_members)
                .all(|((id, url), (old_id, old_url))| id == *old_id && url == old_url);
        if same {
            return;
        }
        self.ring_members = workers
            .clone()
            .map(|(id, url)| (id, url.to_owned()))
            .collect();
        self.ring = WorkerRing::new(workers);
    }
}

/// The prompt tokens a dispatch credits: token IDs counted, text estimated at
/// [`PREFIX_HASH_CHARS_PER_TOKEN`] characters per token.
fn request_tokens(key: RoutingKey<'_>) -> u64 {
    match key {
        RoutingKey::Tokens(tokens) => tokens.len() as u64,
        RoutingKey::Text(text) => (text.len() / PREFIX_HASH_CHARS_PER_TOKEN) as u64,
    }
}

fn request_len(key: RoutingKey<'_>) -> u32 {
    let len = match key {
        RoutingKey::Text(text) => crate::index::count_chars(text.as_bytes()),
        RoutingKey::Tokens(tokens) => tokens.len() as u64,
    };
    u32::try_from(len).unwrap_or(u32::MAX)
}
