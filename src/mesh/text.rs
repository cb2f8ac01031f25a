//! Text paths across the mesh without their text (issue 37). A text path (the string tree's
//! key: a request's routing text, chat without a tokenizer) is shared as the hashes of its
//! text's whole 64-byte pages (`index::TokenPages::hash_text`, fixed seed), in the token
//! path's form: the same deltas with their chains of pages (`mesh::chains`), the same repair
//! entries, the same page bounds. A peer inserts those pages into its token tree, in the
//! path's namespace, and its data cores look a text request's pages up there when its string
//! tree knows less (`policy::peer_text`): a peer matches text it never saw, while the frames
//! carry only hashes (a page of text cannot be read back from its 64-bit hash; a guessable
//! page can be confirmed, as a token page can).
//!
//! The text's tail (under one page) is not shared, nor is anything past
//! `MESH_TEXT_PAGES_MAX` pages (counted: `Refusal::TextPagesCapped`): routing needs the prefix.
//! A text shorter than one page is not shared at all.
//!
//! Pages are counted as `--block-size` tokens each, the token tree's unit, so gateways of one
//! mesh need the same `--block-size` for text as they do for token paths.

use crate::index::{self, TokenPages, TEXT_PAGE_BYTES};
use crate::limits::MESH_TEXT_PAGES_MAX;
use crate::policy::KeyData;

/// A local insert's key as the mesh shares it.
#[derive(Debug)]
pub enum Shareable {
    /// The key to share: a token path as it is, a text path as its text's pages; `capped`
    /// when a text had more than `MESH_TEXT_PAGES_MAX` pages.
    Key {
        /// The key.
        key: KeyData,
        /// Whether the text's pages were cut at the cap.
        capped: bool,
    },
    /// Nothing to share: a text under one page, or the hash index's heads.
    None,
}

/// `key` as the mesh shares it: token paths unchanged, a text path as the pages of its text
/// (`block_size`: the token tree's, each page counting as that many tokens).
pub fn shareable(key: KeyData, block_size: usize) -> Shareable {
    match key {
        KeyData::Tokens(_) => Shareable::Key { key, capped: false },
        KeyData::Text(text) => {
            let mut pages = TokenPages::default();
            pages.hash_text(text.as_bytes(), block_size, MESH_TEXT_PAGES_MAX);
            if pages.pages().is_empty() {
                return Shareable::None;
            }
            Shareable::Key {
                key: KeyData::Tokens(index::token_key(&pages)),
                capped: text.len() / TEXT_PAGE_BYTES > MESH_TEXT_PAGES_MAX,
            }
        }
        KeyData::Heads(_) => Shareable::None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use super::*;
    use crate::index::Namespace;
    use crate::limits::{MESH_KNOWN_BYTES_MAX, MESH_KNOWN_PATHS_MAX};
    use crate::mesh::chains::PathChains;
    use crate::mesh::paths::{delta_key, entry_key, DeltaRound, KnownPaths, RoundPath};
    use crate::mesh::wire::{self, frame::Body};

    const MARKER: &str = "ZEBRA-7f3a-confidential-client-text";

    fn prompt() -> String {
        let sentences: Vec<String> = (0..40)
            .map(|i| format!("Sentence {i} of the system prompt, with {MARKER} inside. "))
            .collect();
        sentences.concat() + "and a tail"
    }

    fn text_pages(text: &str) -> Vec<u64> {
        let mut pages = TokenPages::default();
        pages.hash_text(text.as_bytes(), 16, usize::MAX);
        pages.pages().to_vec()
    }

    /// Whether `frame` holds the marker or any 16 bytes of `text` in a row.
    fn leaks(frame: &[u8], text: &str) -> bool {
        let windows = |needle: &[u8]| frame.windows(needle.len()).any(|w| w == needle);
        windows(MARKER.as_bytes()) || text.as_bytes().chunks(16).any(windows)
    }

    #[test]
    fn a_text_is_shared_as_its_whole_pages_and_a_short_one_not_at_all() {
        let text = prompt();
        let Shareable::Key { key, capped } = shareable(KeyData::Text(text.as_str().into()), 16)
        else {
            panic!("a long text is shared");
        };
        assert!(!capped);
        let KeyData::Tokens(tokens) = &key else {
            panic!("as token pages");
        };
        assert_eq!(tokens.pages(), text_pages(&text));
        assert_eq!(tokens.pages().len(), text.len() / TEXT_PAGE_BYTES);
        assert_eq!(tokens.block_size(), 16);
        let short = shareable(KeyData::Text("under a page".into()), 16);
        assert!(matches!(short, Shareable::None));
        // A token path is shared as it is.
        let tokens = KeyData::Tokens(index::token_key_of_pages(&[1, 2, 3], 16));
        let Shareable::Key { key, capped } = shareable(tokens.clone(), 16) else {
            panic!("a token path is shared");
        };
        assert!(
            !capped
                && matches!((&key, &tokens), (KeyData::Tokens(a), KeyData::Tokens(b)) if a == b)
        );
    }

    #[test]
    fn a_text_past_the_cap_is_shared_cut_and_counted_as_capped() {
        let text = "x".repeat((MESH_TEXT_PAGES_MAX + 3) * TEXT_PAGE_BYTES);
        let Shareable::Key { key, capped } = shareable(KeyData::Text(text.as_str().into()), 16)
        else {
            panic!("shared");
        };
        assert!(capped);
        let KeyData::Tokens(tokens) = key else {
            panic!("as token pages");
        };
        assert_eq!(tokens.pages().len(), MESH_TEXT_PAGES_MAX);
    }

    /// The frames a text path crosses in, a delta and a repair page, carry no byte of its text,
    /// and a peer rebuilds from the delta the pages its own data cores compute for that text.
    #[test]
    fn no_text_crosses_in_deltas_or_repair_pages_and_a_peer_rebuilds_the_pages() {
        let text = prompt();
        let namespace = Namespace {
            model: 7,
            partition: 0,
        };
        let worker: Arc<str> = Arc::from("http://10.0.0.5:8000");
        let Shareable::Key { key, .. } = shareable(KeyData::Text(text.as_str().into()), 16) else {
            panic!("shared");
        };
        // The sender: learned and batched as the gossip round does.
        let mut known = KnownPaths::new(MESH_KNOWN_PATHS_MAX, MESH_KNOWN_BYTES_MAX);
        let path = RoundPath::of(namespace, &key).map(Arc::new);
        assert!(path.is_some(), "a text path goes with its pages");
        let (hash, _) = known.learn(namespace, key, &worker).unwrap();
        let mut round = DeltaRound::default();
        let kind = crate::index::TreeKind::Tokens;
        round.add(namespace.model, (kind, hash), &worker, path);
        let batches = round.take();
        let peer: SocketAddr = "10.0.0.2:39527".parse().unwrap();
        let batch = batches[0].for_peer(peer, &mut PathChains::default());
        let frame = wire::encode(&wire::frame("10.0.0.1:39527", Body::Deltas(batch.clone())));
        assert!(
            !leaks(&frame, &text),
            "a delta frame holds the prompt's text"
        );
        let repair = known.page(namespace.model, 1, (known.epoch(), 0), (0, 0));
        assert_eq!(repair.entries.len(), 1);
        let repair_frame = wire::encode(&wire::frame(
            "10.0.0.1:39527",
            Body::RepairPage(repair.clone()),
        ));
        assert!(
            !leaks(&repair_frame, &text),
            "a repair frame holds the prompt's text"
        );
        // The check can fail: the same scan finds the text in a frame that carries it.
        let carrying = wire::frame(&text, Body::Deltas(batch.clone()));
        assert!(leaks(&wire::encode(&carrying), &text));

        // The peer, which never saw the text, rebuilds the pages its data cores hash.
        let chains = PathChains::default();
        let (got_ns, got, _) = delta_key(&chains, namespace.model, &batch.deltas[0]).unwrap();
        assert_eq!(got_ns, namespace);
        let KeyData::Tokens(tokens) = &got else {
            panic!("token pages");
        };
        assert_eq!(tokens.pages(), text_pages(&text));
        let empty = KnownPaths::new(MESH_KNOWN_PATHS_MAX, MESH_KNOWN_BYTES_MAX);
        let (_, from_repair) = entry_key(&empty, namespace.model, &repair.entries[0]).unwrap();
        let KeyData::Tokens(repaired) = &from_repair else {
            panic!("token pages");
        };
        assert_eq!(repaired.pages(), text_pages(&text));
    }
}
