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

use super::placements::Placements;
use super::recent::{IndexKey, KeyData, RecentDispatches};
use super::simple::PREFIX_HASH_CHARS_PER_TOKEN;
use super::{Branch, PolicyConfig, PolicyMetrics, RouteRequest, Router, WorkerRing, WorkerStatus};
use crate::index::{IndexReader, LookupHint, Namespace, TokenPages, TreeMatch, MODELS_MAX};
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
    /// Where this core's lookup of the key ended: the control core's insert starts there
    /// while the hint is still valid (it checks), instead of comparing the prefix again.
    pub hint: LookupHint,
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
    /// The prepared request's page hashes for the index (when its key is tokens).
    pages: TokenPages,
    namespace: Namespace,
    tree: Option<TreeMatch>,
    /// The index lookup's hint for the prepared request's record (never the recent map's).
    hint: LookupHint,
    recent: RecentDispatches,
    /// This core's decayed prompt tokens of new prefixes per worker (cache_aware's misses).
    placements: Placements,
    /// The gateway tick of the prepared request.
    now_ms: u64,
    statuses: Vec<WorkerStatus>,
    ring: WorkerRing,
    ring_members: Vec<(WorkerId, String)>,
    announced_models: Vec<u64>,
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
            pages: TokenPages::default(),
            namespace: Namespace::default(),
            tree: None,
            hint: LookupHint::default(),
            recent: RecentDispatches::default(),
            placements: Placements::default(),
            now_ms: 0,
            statuses: Vec::new(),
            ring: WorkerRing::default(),
            ring_members: Vec::new(),
            announced_models: Vec::new(),
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
        self.now_ms = now_ms;
        self.namespace = Namespace {
            model: model_hash(self.input.model()),
            partition: self.input.namespace().0,
        };
        self.tree = None;
        self.hint = LookupHint::default();
        let routing_key = self.input.key();
        if !self.router.uses_index() || routing_key.is_empty() {
            return Ok(());
        }
        if let RoutingKey::Tokens(tokens) = routing_key {
            // The index's block size: both come from `--block-size`.
            let block_size = self.router.config().cache_aware.block_size as usize;
            self.pages.hash(tokens, block_size);
        }
        let key = self.index_key();
        let (mut tree, hint) = match (&self.reader, key) {
            (Some(reader), IndexKey::Text(text)) => reader.lookup_text_hinted(self.namespace, text),
            (Some(reader), IndexKey::Tokens(tokens)) => {
                reader.lookup_tokens_hinted(self.namespace, tokens)
            }
            (None, _) => {
                let miss = TreeMatch {
                    request_len: request_len(routing_key),
                    ..TreeMatch::default()
                };
                (miss, LookupHint::default())
            }
        };
        let config = &self.router.config().cache_aware;
        // Only a miss can be a burst of a new prefix the index has not learned yet.
        if tree.ratio() <= config.cache_threshold {
            self.recent
                .merge_into(&mut tree, self.namespace, key, now_ms);
        }
        self.hint = hint;
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

    /// Runs the policy over `workers`, `(id, url)` of every active worker, with `status_of`
    /// giving each one's status once per decision: a worker already tried comes with
    /// `eligible: false`, and `credited_tokens` holds the prompt tokens every core sent it since
    /// its last load report that have no first token back yet. The caller credits the chosen
    /// worker with [`CoreRouting::request_tokens`].
    pub fn choose<'w>(
        &mut self,
        workers: impl Iterator<Item = (WorkerId, &'w str)> + Clone,
        mut status_of: impl FnMut(WorkerId) -> WorkerStatus,
    ) -> Option<WorkerId> {
        // The ring check walks the list twice more: statuses (atomics summed over cores, the
        // load report) are read only in the loop below.
        self.refresh_ring(workers.clone());
        self.statuses.clear();
        // Only a cache miss reads the placed tokens (one `exp2` per worker to decay them).
        let config = &self.router.config().cache_aware;
        let miss = self
            .tree
            .is_some_and(|tree| tree.ratio() <= config.cache_threshold);
        for (id, _) in workers {
            let mut status = status_of(id);
            if miss {
                status.placed_tokens = self.placements.of(id, self.now_ms);
            }
            let slot = id.index();
            if self.statuses.len() <= slot {
                self.statuses.resize(slot + 1, WorkerStatus::default());
            }
            self.statuses[slot] = status;
        }
        let request = RouteRequest {
            input: &self.input,
            tree: self.tree.as_ref(),
            workers: &self.statuses,
            ring: &self.ring,
        };
        let route = self.router.route(&request)?;
        if route
            .cache_aware
            .is_some_and(|d| d.branch == Branch::ExpectedWaitFallback)
        {
            let tokens = prompt_tokens(self.input.key());
            self.placements.add(route.worker, self.now_ms, tokens);
        }
        Some(route.worker)
    }

    /// The prompt tokens a dispatch of the prepared request credits to its worker: token IDs
    /// counted, text estimated at [`PREFIX_HASH_CHARS_PER_TOKEN`] characters per token.
    pub fn request_tokens(&self) -> u64 {
        prompt_tokens(self.input.key())
    }

    /// The index key of the prepared request (cache_aware only: other policies do not build the
    /// index). Take it right after `prepare`, before any `.await`: another request on this core
    /// may prepare in between, and the key must be this request's.
    pub fn record_key(&mut self) -> Option<RecordKey> {
        if !self.router.uses_index() || self.input.key().is_empty() {
            return None;
        }
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
            key: KeyData::of(self.index_key()),
            model_name,
            hint: self.hint,
        })
    }

    /// The prepared request's key as the index compares it (its ids as `prepare` hashed them).
    fn index_key(&self) -> IndexKey<'_> {
        match self.input.key() {
            RoutingKey::Text(text) => IndexKey::Text(text),
            RoutingKey::Tokens(_) => IndexKey::Tokens(&self.pages),
        }
    }

    /// Remembers that `key` went to `worker`, for bursts before the index learns it.
    pub fn remember(&mut self, key: &RecordKey, worker: WorkerId, tick_ms: u64) {
        self.recent
            .push(key.namespace, key.key.clone(), worker, tick_ms);
    }

    /// `record_key` and `remember` in one step, for callers that do not await in between.
    pub fn dispatch_record(&mut self, worker: WorkerId, tick_ms: u64) -> Option<RecordKey> {
        let key = self.record_key()?;
        self.remember(&key, worker, tick_ms);
        Some(key)
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
        // A slot whose URL changed (or that left) is another worker now, holding none of ours.
        for (id, url) in &self.ring_members {
            if !workers
                .clone()
                .any(|(now_id, now_url)| now_id == *id && now_url == url)
            {
                self.placements.forget(*id);
            }
        }
        self.ring_members = workers
            .clone()
            .map(|(id, url)| (id, url.to_owned()))
            .collect();
        self.ring = WorkerRing::new(workers);
    }
}

/// The prompt tokens of a routing key: token IDs counted, text estimated at
/// [`PREFIX_HASH_CHARS_PER_TOKEN`] bytes per token.
pub(super) fn prompt_tokens(key: RoutingKey<'_>) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Branch, PolicyArgs};

    /// Prepares `body` at `now_ms` and routes it over idle workers named by `urls`.
    pub(super) fn prepare_and_route_idle(
        routing: &mut CoreRouting,
        urls: &[&str],
        endpoint: Endpoint,
        body: &str,
        now_ms: u64,
    ) -> WorkerId {
        let headers = RoutingHeaders::default();
        routing
            .prepare(endpoint, headers, body.as_bytes(), now_ms)
            .unwrap();
        let workers = urls
            .iter()
            .enumerate()
            .map(|(slot, url)| (WorkerId(slot as u16), *url));
        let status_of = |_| WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        routing.choose(workers, status_of).unwrap()
    }

    fn routing() -> (CoreRouting, Arc<PolicyMetrics>) {
        let config = PolicyArgs::default().validate().unwrap();
        let metrics = Arc::new(PolicyMetrics::default());
        (CoreRouting::new(config, 5, None, metrics.clone()), metrics)
    }

    /// Prepares a completion of `prompt` and routes it over idle workers named by `urls`.
    fn route_idle(routing: &mut CoreRouting, urls: &[&str], prompt: &str) -> WorkerId {
        let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
        prepare_and_route_idle(routing, urls, Endpoint::Completions, &body, 10)
    }

    #[test]
    fn a_burst_of_a_new_prefix_follows_the_first_dispatch_before_the_index_learns_it() {
        let (mut routing, metrics) = routing();
        let urls: Vec<String> = (0..4).map(|i| format!("http://w{i}")).collect();
        let mut in_flight = [0u32; 4];
        let mut chosen = Vec::new();
        for i in 0..10 {
            let body =
                format!(r#"{{"model":"m","prompt":"a long shared system prompt, then user {i}"}}"#);
            routing
                .prepare(
                    Endpoint::Completions,
                    RoutingHeaders::default(),
                    body.as_bytes(),
                    10,
                )
                .unwrap();
            let workers = urls
                .iter()
                .enumerate()
                .map(|(slot, url)| (WorkerId(slot as u16), url.as_str()));
            let status_of = |id: WorkerId| WorkerStatus {
                eligible: true,
                in_flight: in_flight[id.index()],
                ..WorkerStatus::default()
            };
            let worker = routing.choose(workers, status_of).unwrap();
            in_flight[worker.index()] += 1;
            let record = routing.dispatch_record(worker, 10).unwrap();
            assert_eq!(record.namespace.model, model_hash("m"));
            assert_eq!(
                record.model_name.is_some(),
                i == 0,
                "the model name is sent once"
            );
            chosen.push(worker);
        }
        assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 1);
        assert_eq!(metrics.branch_count(Branch::TreeMatch), 9);
    }

    #[test]
    fn new_prefixes_spread_by_how_much_each_worker_was_given() {
        // Idle workers, no load reports, no in-flight feedback: only this core's placed tokens
        // tell them apart, so 16 unrelated prompts of one length land two on each of 8 workers.
        let (mut routing, metrics) = routing();
        let urls: Vec<String> = (0..8).map(|i| format!("http://w{i}")).collect();
        let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
        let mut counts = [0u32; 8];
        for i in 0..16u8 {
            let prompt = char::from(b'a' + i).to_string().repeat(40);
            counts[route_idle(&mut routing, &urls, &prompt).index()] += 1;
        }
        assert_eq!(counts, [2; 8]);
        assert_eq!(metrics.branch_count(Branch::ExpectedWaitFallback), 16);
    }

    #[test]
    fn a_long_new_prompt_weighs_more_than_several_short_ones() {
        let (mut routing, _) = routing();
        let urls = ["http://a", "http://b"];
        // 100 tokens (4 characters each) on one worker, then three prompts of 10 tokens: all
        // three go to the other worker, still given fewer tokens after two of them.
        let long = route_idle(&mut routing, &urls, &"a".repeat(400));
        let short: Vec<WorkerId> = ["b", "c", "d"]
            .iter()
            .map(|letter| route_idle(&mut routing, &urls, &letter.repeat(40)))
            .collect();
        assert!(short.iter().all(|w| *w != long), "{long:?} {short:?}");
    }

    #[test]
    fn other_policies_send_no_index_records() {
        let args = PolicyArgs {
            policy: crate::policy::PolicyKind::RoundRobin,
            ..PolicyArgs::default()
        };
        let mut routing = CoreRouting::new(args.validate().unwrap(), 1, None, Arc::default());
        routing
            .prepare(
                Endpoint::Completions,
                RoutingHeaders::default(),
                br#"{"prompt":"p"}"#,
                0,
            )
            .unwrap();
        let status_of = |_| WorkerStatus {
            eligible: true,
            ..WorkerStatus::default()
        };
        let worker = routing.choose(std::iter::once((WorkerId(0), "http://w0")), status_of);
        assert_eq!(worker, Some(WorkerId(0)));
        assert_eq!(routing.dispatch_record(WorkerId(0), 0), None);
    }
}

#[cfg(test)]
mod index_tests {
    use super::tests::prepare_and_route_idle;
    use super::*;
    use crate::index::{IndexConfig, IndexWriter};
    use crate::policy::{Branch, PolicyArgs};

    /// Dispatch records applied to a real index make the next request of the family match.
    #[test]
    fn records_inserted_into_the_index_make_the_family_match() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let reader = writer.reader().unwrap();
        let config = PolicyArgs::default().validate().unwrap();
        let metrics = Arc::new(PolicyMetrics::default());
        let mut routing = CoreRouting::new(config, 3, Some(reader), metrics.clone());
        let system: Vec<String> = (0..2048).map(|i| format!("w{i}x")).collect();
        let system = system.join(" ");
        let urls = ["http://a", "http://b", "http://c"];
        let mut chosen = Vec::new();
        for (i, now_ms) in [(0, 0u64), (1, 1_000), (2, 2_000), (3, 3_000)] {
            let body = serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": format!("question number {i}")}
                ]
            })
            .to_string();
            let endpoint = Endpoint::ChatCompletions;
            let worker = prepare_and_route_idle(&mut routing, &urls, endpoint, &body, now_ms);
            let record = routing.dispatch_record(worker, now_ms).unwrap();
            let ns = record.namespace;
            match &record.key {
                KeyData::Text(text) => writer
                    .insert_text_hinted(ns, text, worker, now_ms, &record.hint)
                    .unwrap(),
                KeyData::Tokens(tokens) => writer
                    .insert_tokens_shared(ns, tokens, worker, now_ms, &record.hint)
                    .unwrap(),
            }
            chosen.push(worker);
        }
        // Seconds apart: the recent-dispatch map has expired, only the index can match.
        assert!(chosen.iter().all(|&w| w == chosen[0]), "{chosen:?}");
        assert_eq!(metrics.branch_count(Branch::TreeMatch), 3);
    }
}
