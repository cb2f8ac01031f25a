//! The router's first call, once per request ([`Router::prepare`], and the data core's
//! [`Router::prepare_or_defer`] / [`Router::finish_prepare`]): the routing input extracted
//! (`request::extract`), the prompt tokenized when the model has a tokenizer ([`Tokenizing`]:
//! this core's cache; a body past `TOKENIZE_RENDER_INLINE_BYTES` parsed, rendered and cut on the
//! pool, cold work deferred past `--tokenizer-inline-max-bytes`, a prompt past the caps routed
//! on its text), token IDs
//! hashed into pages, and the key looked up in the index mode (trees, heads or the KV-event
//! blocks), merged with this core's recent dispatches on a miss. Everything lands in the
//! [`Prepared`] value the later calls read.

use std::sync::Arc;

use super::prepared::{Lookup, Prepared};
use super::record::model_hash;
use super::{CacheIndexKind, PolicyKind, PolicyMetrics, Router, TokenizerFigures};
use crate::index::hash::{request_heads, HeadMatch};
use crate::index::{count_chars, Namespace, TreeMatch};
use crate::limits::{TOKENIZE_PROMPT_BYTES_MAX, TOKENIZE_RENDER_INLINE_BYTES};
use crate::request::{extract, Endpoint, KeySource, RequestError, RoutingHeaders, RoutingKey};
use crate::tokenize::{
    self, Begun, CacheConfig, ColdWork, Deferred, DeferredDone, PromptSource, RenderWork,
    TokenCache, TokenizeError, TokenizerSet,
};

/// A data core's tokenization state: the models' tokenizers (shared, read-only) and this
/// core's cache, which no other thread touches.
#[derive(Debug)]
pub(super) struct Tokenizing {
    set: Arc<TokenizerSet>,
    cache: TokenCache,
    inline_max_bytes: usize,
    failures: u64,
    over_cap: u64,
}

impl Tokenizing {
    /// Tokenizing with `set`'s models through a new cache bounded by `cache`; cold work over
    /// `inline_max_bytes` is handed back to the caller.
    pub(super) fn new(set: Arc<TokenizerSet>, cache: CacheConfig, inline_max_bytes: usize) -> Self {
        Tokenizing {
            set,
            cache: TokenCache::new(cache),
            inline_max_bytes,
            failures: 0,
            over_cap: 0,
        }
    }

    /// A request that stays on its text: logged at debug, counted (apart when it was past the
    /// caps).
    fn failed(&mut self, error: &TokenizeError) {
        match error {
            TokenizeError::TooLarge(_) => self.over_cap += 1,
            _ => self.failures += 1,
        }
        tracing::debug!("request not tokenized, routing on its text: {error}");
    }

    /// Publishes this core's cache figures for `/metrics`.
    fn publish(&self, metrics: &PolicyMetrics) {
        let stats = self.cache.stats();
        metrics.set_tokenizer(TokenizerFigures {
            l0_hits: stats.l0_hits,
            l0_misses: stats.l0_misses,
            l1_hits: stats.l1_hits,
            l1_misses: stats.l1_misses,
            l0_entries: self.cache.l0_entries() as u64,
            l1_bytes: self.cache.l1_bytes() as u64,
            failures: self.failures,
            over_cap: self.over_cap,
        });
    }
}

impl Router {
    /// Prepares a request (see the module documentation): `now_ms` is the gateway tick. A body
    /// that is not a JSON object is a [`RequestError`] (400). Deferred tokenization, however
    /// long, runs here, on the caller's thread (tests, benchmarks); the data core uses
    /// [`Router::prepare_or_defer`] instead.
    pub fn prepare(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        headers: RoutingHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<(), RequestError> {
        let mut deferred = self.prepare_or_defer(prepared, endpoint, headers, body, now_ms)?;
        while let Some(work) = deferred {
            deferred = self.finish_prepare(prepared, Some(work.run()));
        }
        Ok(())
    }

    /// [`Router::prepare`], except that tokenization the data core should not do itself comes
    /// back as a [`Deferred`]: a body past `TOKENIZE_RENDER_INLINE_BYTES` to render, or cold
    /// work past `--tokenizer-inline-max-bytes` to encode. The caller runs it off the core and
    /// then calls [`Router::finish_prepare`] (the request is not prepared until that returns
    /// `None`). `None`: the request is prepared.
    pub fn prepare_or_defer(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        headers: RoutingHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<Option<Deferred>, RequestError> {
        // Tree mode records text keys: the string tree keeps a large body's text as built.
        let records_text = self.uses_index() && self.config.cache_index == CacheIndexKind::Tree;
        prepared.input.build_text_for_index(records_text);
        extract(endpoint, body, headers, &mut prepared.input)?;
        prepared.now_ms = now_ms;
        prepared.decision_counted.set(false);
        prepared.kv_pressure_pick.set(None);
        prepared.remembered_for.set(None);
        prepared.namespace = Namespace {
            model: model_hash(prepared.input.model()),
            partition: prepared.input.namespace().0,
        };
        prepared.lookup = None;
        prepared.heads.clear();
        match self.tokenize(prepared, endpoint, body) {
            Some(Deferred::Encode(work)) => Ok(self.encode_or_defer(prepared, work)),
            Some(render) => {
                self.metrics.count_tokenize_offloaded();
                Ok(Some(render))
            }
            None => {
                self.look_up(prepared);
                Ok(None)
            }
        }
    }

    /// Cold work within `--tokenizer-inline-max-bytes` is encoded here and the request
    /// prepared; longer work is handed back for the pool.
    fn encode_or_defer(&mut self, prepared: &mut Prepared, work: ColdWork) -> Option<Deferred> {
        if work.cold_bytes() > self.tokenizing.as_ref().map_or(0, |t| t.inline_max_bytes) {
            self.metrics.count_tokenize_offloaded();
            return Some(Deferred::Encode(work));
        }
        self.finish_prepare(prepared, Some(DeferredDone::Encoded(work.run())))
    }

    /// Continues a request [`Router::prepare_or_defer`] deferred, with its work done (`None`:
    /// the work could not run, the request routes on its text). A rendered prompt is looked
    /// up in this core's cache, and its cold work may be deferred again: the request is
    /// prepared once this returns `None`.
    pub fn finish_prepare(
        &mut self,
        prepared: &mut Prepared,
        done: Option<DeferredDone>,
    ) -> Option<Deferred> {
        let Some(tokenizing) = &mut self.tokenizing else {
            self.look_up(prepared);
            return None;
        };
        let output = prepared.input.tokenizer_output();
        let finished = match done {
            None => {
                self.metrics.count_tokenize_refused();
                Ok(())
            }
            Some(DeferredDone::Encoded(done)) => {
                tokenize::finish(done, &mut tokenizing.cache, output).map(|()| {
                    prepared.input.set_tokenized();
                })
            }
            Some(DeferredDone::Rendered(cut)) => match cut {
                Ok(cut) => match tokenize::begin_cut(cut, &mut tokenizing.cache, output) {
                    Begun::Done => {
                        prepared.input.set_tokenized();
                        Ok(())
                    }
                    Begun::Cold(work) => {
                        tokenizing.publish(&self.metrics);
                        return self.encode_or_defer(prepared, work);
                    }
                },
                Err(e) => Err(e),
            },
        };
        if let Err(e) = finished {
            tokenizing.failed(&e);
        }
        tokenizing.publish(&self.metrics);
        self.look_up(prepared);
        None
    }

    /// Tokenizes the prompt of a chat, completions or messages request whose model has a
    /// tokenizer, through this core's cache, when the policy reads token IDs (cache_aware,
    /// prefix_hash); its IDs become the routing key. Returns the work left, if any: a body
    /// past `TOKENIZE_RENDER_INLINE_BYTES` to render off the core, or cold segments. A prompt
    /// past `TOKENIZE_PROMPT_BYTES_MAX` is not copied, and, like anything that fails, leaves
    /// the request on its text.
    fn tokenize(
        &mut self,
        prepared: &mut Prepared,
        endpoint: Endpoint,
        body: &[u8],
    ) -> Option<Deferred> {
        let tokenizing = self.tokenizing.as_mut()?;
        let reads_tokens = matches!(
            self.config.kind,
            PolicyKind::CacheAware | PolicyKind::PrefixHash
        );
        if !reads_tokens || prepared.input.key_source() != Some(KeySource::Text) {
            return None;
        }
        let source = match endpoint {
            Endpoint::ChatCompletions => PromptSource::Chat(body),
            Endpoint::Messages => PromptSource::Messages(body),
            Endpoint::Completions if !prepared.input.text().is_empty() => {
                PromptSource::Completion(prepared.input.text())
            }
            _ => return None,
        };
        let model = tokenizing.set.for_model(prepared.input.model())?;
        if source.len() > TOKENIZE_PROMPT_BYTES_MAX {
            tokenizing.failed(&TokenizeError::TooLarge("bytes"));
            tokenizing.publish(&self.metrics);
            return None;
        }
        if source.len() > TOKENIZE_RENDER_INLINE_BYTES {
            return Some(Deferred::Render(RenderWork::new(&model, source)));
        }
        let prompt = match model.prompt(source) {
            Ok(prompt) => prompt,
            Err(e) => {
                tokenizing.failed(&e);
                tokenizing.publish(&self.metrics);
                return None;
            }
        };
        let begun = tokenize::begin(
            &model,
            prompt,
            &mut tokenizing.cache,
            prepared.input.tokenizer_output(),
        );
        match begun {
            Begun::Done => {
                prepared.input.set_tokenized();
                tokenizing.publish(&self.metrics);
                None
            }
            Begun::Cold(work) => Some(Deferred::Encode(work)),
        }
    }

    /// Hashes token IDs into pages and (cache_aware) looks the key up in the index mode.
    fn look_up(&mut self, prepared: &mut Prepared) {
        let routing_key = prepared.input.key();
        if !self.uses_index() || routing_key.is_empty() {
            return;
        }
        if let RoutingKey::Tokens(tokens) = routing_key {
            let events = self.events.as_ref();
            if let Some(reported) = events.and_then(|e| e.publishing(prepared.namespace.model)) {
                // Blocks of the size the model's engines reported, `--block-size` until then.
                let configured = self.config.cache_aware.block_size as usize;
                let block_size = reported.unwrap_or(configured);
                prepared.pages.hash(tokens, block_size);
                let (pages, chain) = (prepared.pages.pages(), &mut prepared.chain);
                let mut lookup = events.map(|e| e.lookup(pages, block_size, chain));
                // Only a miss can be a burst of a prefix the engines have not reported yet.
                if let Some(Lookup::Blocks(blocks)) = &mut lookup {
                    if blocks.holders().is_empty() {
                        let (namespace, now_ms) = (prepared.namespace, prepared.now_ms);
                        self.recent
                            .merge_blocks_into(blocks, namespace, &prepared.pages, now_ms);
                    }
                }
                prepared.lookup = lookup;
                return;
            }
            // The index's block size: both come from `--block-size`.
            let block_size = self.config.cache_aware.block_size as usize;
            prepared.pages.hash(tokens, block_size);
        }
        let lookup = match self.config.cache_index {
            CacheIndexKind::Tree => self.look_up_tree(prepared),
            CacheIndexKind::Hash => self.look_up_heads(prepared),
        };
        prepared.lookup = Some(lookup);
        if let Some(index) = &mut self.index {
            index.quiesce();
        }
    }

    /// Tree mode: the string or token tree's match (a text's deepened by the text pages peers
    /// shared, `peer_text.rs`), and on a miss this core's recent dispatches.
    fn look_up_tree(&self, prepared: &mut Prepared) -> Lookup {
        let (namespace, now_ms) = (prepared.namespace, prepared.now_ms);
        let mut lookup = match &self.index {
            Some(index) => index.lookup(namespace, prepared.index_key(), now_ms),
            None => Lookup::Tree {
                matched: TreeMatch {
                    request_len: request_len(prepared.input.key()),
                    ..TreeMatch::default()
                },
                hint: Default::default(),
            },
        };
        // Only a miss can be a burst of a new prefix the index has not learned yet.
        if let Lookup::Tree { matched, .. } = &mut lookup {
            self.match_peer_text_pages(prepared, matched);
            if matched.ratio() <= self.config.cache_aware.cache_threshold {
                let key = prepared.index_key();
                self.recent.merge_into(matched, namespace, key, now_ms);
            }
        }
        lookup
    }

    /// Hash mode: the heads of the request's token IDs at each boundary they reach and their
    /// live holders (text requests and requests shorter than the smallest boundary have none),
    /// and when no head has a holder, this core's recent dispatches.
    fn look_up_heads(&self, prepared: &mut Prepared) -> Lookup {
        let RoutingKey::Tokens(tokens) = prepared.input.key() else {
            return Lookup::Heads(HeadMatch::default());
        };
        let boundaries = &self.config.cache_boundaries;
        request_heads(
            prepared.namespace,
            tokens,
            &prepared.pages,
            boundaries,
            &mut prepared.heads,
        );
        if prepared.heads.is_empty() {
            return Lookup::Short;
        }
        let (namespace, key, now_ms) = (prepared.namespace, prepared.index_key(), prepared.now_ms);
        let mut lookup = match &self.index {
            Some(index) => index.lookup(namespace, key, now_ms),
            None => Lookup::Heads(HeadMatch::of(&prepared.heads)),
        };
        // Only heads nobody holds can be a burst of a new prefix the index has not learned yet.
        if let Lookup::Heads(heads) = &mut lookup {
            if !heads.has_holder() {
                self.recent.merge_heads_into(heads, namespace, now_ms);
            }
        }
        lookup
    }
}

/// A key's length in its tree's units: characters, or tokens.
fn request_len(key: RoutingKey<'_>) -> u32 {
    let len = match key {
        RoutingKey::Text(text) => count_chars(text.as_bytes()),
        RoutingKey::Tokens(tokens) => tokens.len() as u64,
    };
    u32::try_from(len).unwrap_or(u32::MAX)
}
