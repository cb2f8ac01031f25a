//! Text requests matched against what peer gateways shared (`--enable-mesh`). A peer never sends
//! a request's text: the mesh shares a text path as the hashes of its routing text's 64-byte
//! pages (`index::TokenPages::hash_text`, `mesh::text`), which the control core inserts into
//! the token tree of the request's namespace, where the seeds keep them apart from token
//! pages. A text request is looked up in its string tree (this gateway's own dispatches) as
//! always, and, when the mesh is on and that match is not the whole text, its text's pages in
//! the token tree: the deeper of the two matches routes it. This gateway's own dispatch of it
//! then enters its string tree as usual, and the mesh shares it on.
//!
//! The data core's cost, mesh on: one xxh3 per 64 bytes of text (at most
//! `MESH_TEXT_PAGES_MAX`), into the prepared request's page buffer (unused by text requests
//! otherwise, reused across requests: no allocation in the steady state), and one token-tree
//! lookup, lock-free like every lookup. Mesh off: nothing, and routing is as before.

use super::prepared::{IndexKey, Lookup, Prepared};
use super::Router;
use crate::index::{count_chars, TreeMatch, TEXT_PAGE_BYTES};
use crate::limits::MESH_TEXT_PAGES_MAX;
use crate::request::RoutingKey;

impl Router {
    /// Looks text requests up in the text pages peers shared too (the mesh is on).
    pub fn with_peer_text_pages(mut self) -> Router {
        self.peer_text_pages = true;
        self
    }

    /// Deepens `matched` (the string tree's match of `prepared`'s text) to the match of the
    /// text's pages among those peers shared, when that one is deeper and has holders. Matched
    /// pages are counted in the string tree's unit, characters of the text they cover.
    pub(super) fn match_peer_text_pages(&self, prepared: &mut Prepared, matched: &mut TreeMatch) {
        if !self.peer_text_pages || matched.matched_len >= matched.request_len {
            return;
        }
        let (Some(index), RoutingKey::Text(text)) = (&self.index, prepared.input.key()) else {
            return;
        };
        let block_size = self.config.cache_aware.block_size as usize;
        let pages = &mut prepared.pages;
        pages.hash_text(text.as_bytes(), block_size, MESH_TEXT_PAGES_MAX);
        if pages.pages().is_empty() {
            return;
        }
        let key = IndexKey::Tokens(&prepared.pages);
        let Lookup::Tree { matched: peers, .. } =
            index.lookup(prepared.namespace, key, prepared.now_ms)
        else {
            return;
        };
        if peers.tenants_len == 0 {
            return;
        }
        let matched_pages = peers.matched_len as usize / block_size.max(1);
        let covered = (matched_pages * TEXT_PAGE_BYTES).min(text.len());
        let chars = u32::try_from(count_chars(&text.as_bytes()[..covered])).unwrap_or(u32::MAX);
        if chars > matched.matched_len {
            matched.matched_len = chars;
            matched.tenants = peers.tenants;
            matched.tenants_len = peers.tenants_len;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::ids::WorkerId;
    use crate::index::{IndexConfig, IndexWriter, LookupHint, TokenPages};
    use crate::limits::MESH_TEXT_PAGES_MAX;
    use crate::policy::router::tests::choose_idle;
    use crate::policy::{IndexLookup, Lookup, PolicyArgs, PolicyMetrics, Prepared, Router, Trees};
    use crate::request::{Endpoint, RoutingHeaders, RoutingKey};

    const SHARED: WorkerId = WorkerId(2);

    fn chat(question: &str) -> String {
        let system: Vec<String> = (0..600).map(|i| format!("rule {i} of the house")).collect();
        serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": system.join("; ")},
                {"role": "user", "content": question}
            ]
        })
        .to_string()
    }

    fn router(writer: &IndexWriter, peer_text_pages: bool) -> Router {
        let config = PolicyArgs::default().validate().unwrap();
        let trees: Box<dyn IndexLookup> = Box::new(Trees::new(writer.reader().unwrap()));
        let router = Router::new(config, 3, Some(trees), Arc::new(PolicyMetrics::default()));
        if peer_text_pages {
            router.with_peer_text_pages()
        } else {
            router
        }
    }

    fn prepare(router: &mut Router, body: &str, now_ms: u64) -> Prepared {
        let mut prepared = Prepared::default();
        let headers = RoutingHeaders::default();
        let endpoint = Endpoint::ChatCompletions;
        router
            .prepare(&mut prepared, endpoint, headers, body.as_bytes(), now_ms)
            .unwrap();
        prepared
    }

    fn text_of(prepared: &Prepared) -> String {
        match prepared.input().key() {
            RoutingKey::Text(text) => text.to_string(),
            RoutingKey::Tokens(_) => panic!("a text request"),
        }
    }

    fn route_idle(router: &mut Router, prepared: &Prepared) -> WorkerId {
        let urls = ["http://a", "http://b", "http://c", "http://d"];
        choose_idle(router, &urls, prepared)
    }

    fn tree_match(prepared: &Prepared) -> crate::index::TreeMatch {
        match prepared.lookup() {
            Some(Lookup::Tree { matched, .. }) => *matched,
            other => panic!("a tree lookup, got {other:?}"),
        }
    }

    /// A peer taught this gateway (through its control core's token tree) that `SHARED` holds
    /// a chat's text pages: the next chat with the same system prompt, which this gateway
    /// never saw, routes there; with the mesh off it is a miss as before; and this gateway's
    /// own deeper match of the text wins over the peer's pages.
    #[test]
    fn a_text_never_seen_here_matches_the_pages_a_peer_shared() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let mut taught = router(&writer, true);
        let first = prepare(&mut taught, &chat("what is rule 3?"), 0);
        assert_eq!(tree_match(&first).tenants(), &[], "nothing known yet");
        // The peer's insert, as the control core applies it: the text's pages, token tree.
        let text = text_of(&first);
        let mut pages = TokenPages::default();
        pages.hash_text(text.as_bytes(), 16, MESH_TEXT_PAGES_MAX);
        let namespace = first.namespace();
        let hint = LookupHint::default();
        writer
            .insert_tokens_hinted(namespace, &pages, SHARED, 1, &hint)
            .unwrap();

        let follow_up = chat("and rule 4?");
        let mut on = router(&writer, true);
        let prepared = prepare(&mut on, &follow_up, 60_000);
        let matched = tree_match(&prepared);
        assert_eq!(matched.tenants(), &[SHARED]);
        // The system prompt's whole pages matched, in characters of the request's text.
        let common = text
            .bytes()
            .zip(text_of(&prepared).bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let whole_pages = common / crate::index::TEXT_PAGE_BYTES * crate::index::TEXT_PAGE_BYTES;
        assert_eq!(
            matched.matched_len as usize, whole_pages,
            "ASCII: bytes are characters"
        );
        assert!(matched.ratio() > 0.9, "{}", matched.ratio());
        assert_eq!(route_idle(&mut on, &prepared), SHARED);

        // Mesh off: the token tree is not consulted for text, the request is a miss.
        let mut off = router(&writer, false);
        let prepared = prepare(&mut off, &follow_up, 60_000);
        assert_eq!(tree_match(&prepared).tenants(), &[]);
        assert_eq!(tree_match(&prepared).matched_len, 0);

        // This gateway's own dispatch of the whole follow-up (string tree) matches deeper.
        let own = WorkerId(1);
        let follow_text = text_of(&prepared);
        writer
            .insert_text_hinted(namespace, &follow_text, own, 2, &hint)
            .unwrap();
        let prepared = prepare(&mut on, &follow_up, 120_000);
        assert_eq!(tree_match(&prepared).tenants(), &[own]);
        assert_eq!(route_idle(&mut on, &prepared), own);
    }

    /// Another model's namespace, or a text shorter than a page, finds none of the pages.
    #[test]
    fn peers_pages_match_only_their_namespace_and_whole_pages() {
        let mut writer = IndexWriter::new(IndexConfig { block_size: 16 }).unwrap();
        let mut on = router(&writer, true);
        let first = prepare(&mut on, &chat("q"), 0);
        let text = text_of(&first);
        let mut pages = TokenPages::default();
        pages.hash_text(text.as_bytes(), 16, MESH_TEXT_PAGES_MAX);
        let hint = LookupHint::default();
        writer
            .insert_tokens_hinted(first.namespace(), &pages, SHARED, 1, &hint)
            .unwrap();
        let other_model = chat("q").replace("\"model\":\"m\"", "\"model\":\"n\"");
        let prepared = prepare(&mut on, &other_model, 60_000);
        assert_eq!(tree_match(&prepared).tenants(), &[]);
        let short =
            serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let prepared = prepare(&mut on, &short.to_string(), 60_000);
        assert_eq!(tree_match(&prepared).tenants(), &[]);
    }
}
