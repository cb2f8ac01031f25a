use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use prost::Message;

use super::auth::{self, AuthError, Authenticator, MeshKey, StreamOpen, StreamSeal};
use super::chains::{chain_hashes, chain_root, PathChains, ANCHOR_PAGES};
use super::membership::{Change, Membership};
use super::models::ServedModels;
use super::paths::{
    delta_key, entry_key, path_hash, Batched, Change as PathChange, DeltaRound, KnownPaths,
    RoundPath,
};
use super::repair::{PageOutcome, Repairs, StallOutcome};
use super::wire::{self, frame::Body, DeltaBatch, Frame, FrameError};
use super::*;
use crate::index::{page_hash, token_key_of_pages};
use crate::limits::{
    MESH_DATAGRAM_AGE_MAX, MESH_FRAME_BYTES_MAX, MESH_KNOWN_BYTES_MAX, MESH_KNOWN_PATHS_MAX,
    MESH_MODELS_MAX, MESH_REPAIR_PAGE_ENTRIES, MESH_REPAIR_RETRIES, MESH_REPAIR_STALL,
};
use crate::workers::catalog::{ListedModel, ModelCatalog};

fn ns(model: u64, partition: u64) -> Namespace {
    Namespace { model, partition }
}

fn tokens(pages: &[u64]) -> KeyData {
    KeyData::Tokens(token_key_of_pages(pages, 16))
}

fn url(s: &str) -> Arc<str> {
    Arc::from(s)
}

#[derive(Debug, Parser)]
struct Flags {
    #[command(flatten)]
    mesh: MeshArgs,
}

fn mesh_config(args: &[&str]) -> Result<Option<MeshConfig>, FlagError> {
    let flags = Flags::try_parse_from([&["kvgate"], args].concat()).expect("flags parse");
    flags.mesh.config()
}

#[test]
fn flags_keep_smg_defaults_and_check_peers() {
    assert!(mesh_config(&[]).unwrap().is_none());
    // An unspecified bind address is not something a peer can dial: refused, as SMG does.
    let refused = mesh_config(&["--enable-mesh"]).unwrap_err();
    assert_eq!(refused.flag, "--mesh-advertise-host");
    let refused = mesh_config(&["--enable-mesh", "--mesh-advertise-host", "0.0.0.0"]);
    assert_eq!(refused.unwrap_err().flag, "--mesh-advertise-host");
    let config = mesh_config(&["--enable-mesh", "--mesh-advertise-host", "127.0.0.2"])
        .unwrap()
        .unwrap();
    assert_eq!(config.bind_addr, "0.0.0.0:39527".parse().unwrap());
    assert_eq!(MESH_PORT_DEFAULT, 39527);
    assert_eq!(config.advertise_addr, "127.0.0.2:39527".parse().unwrap());
    assert_eq!(config.server_name, "127.0.0.2:39527");
    assert!(config.secret.is_none());
    let config = mesh_config(&[
        "--enable-mesh",
        "--mesh-host",
        "127.0.0.1",
        "--mesh-port",
        "4000",
        "--mesh-server-name",
        "gw-a",
        "--mesh-peer-urls",
        "127.0.0.1:4001",
        "127.0.0.1:4000",
        "127.0.0.1:4001",
    ])
    .unwrap()
    .unwrap();
    // This gateway itself and a repeat are dropped from the peer list.
    assert_eq!(config.peers, vec!["127.0.0.1:4001".parse().unwrap()]);
    assert_eq!(config.server_name, "gw-a");
    for bad in ["127.0.0.1", "127.0.0.1:0"] {
        let args = [
            "--enable-mesh",
            "--mesh-host",
            "127.0.0.1",
            "--mesh-peer-urls",
            bad,
        ];
        assert_eq!(mesh_config(&args).unwrap_err().flag, "--mesh-peer-urls");
    }
}

#[test]
fn path_hashes_are_fixed_across_processes_and_separate_namespaces_and_kinds() {
    let pages = [page_hash(&[1, 2, 3, 4]), page_hash(&[5, 6, 7, 8])];
    let a = path_hash(ns(7, 0), &tokens(&pages)).unwrap();
    // The value every gateway computes: a changed seed or layout breaks meshes of mixed builds.
    assert_eq!(a, path_hash(ns(7, 0), &tokens(&pages)).unwrap());
    assert_eq!(a, GOLDEN_TOKEN_PATH_HASH, "{a:#x}");
    assert_ne!(a, path_hash(ns(7, 1), &tokens(&pages)).unwrap());
    assert_ne!(a, path_hash(ns(8, 0), &tokens(&pages)).unwrap());
    let text = KeyData::Text(Arc::from("hello"));
    assert_ne!(path_hash(ns(7, 0), &text), Some(a));
    assert_eq!(
        path_hash(ns(7, 0), &KeyData::Heads(Arc::from(&[1u64][..]))),
        None
    );
}

const GOLDEN_TOKEN_PATH_HASH: u64 = 0xba21_38b7_2fda_48f0;

#[test]
fn known_paths_stay_within_their_bounds_oldest_first() {
    let mut known = KnownPaths::new(3, 1 << 20);
    let w = url("http://w0");
    let hashes: Vec<u64> = (0..5u64)
        .map(|i| known.learn(ns(1, 0), tokens(&[i, i + 1]), &w).unwrap().0)
        .collect();
    assert_eq!(known.len(), 3);
    assert!(known.get(1, hashes[0]).is_none() && known.get(1, hashes[1]).is_none());
    assert!(known.get(1, hashes[4]).is_some());
    // Bytes bound: 10 bytes of text allowed.
    let mut known = KnownPaths::new(100, 10);
    known.learn(ns(1, 0), KeyData::Text(Arc::from("abcdef")), &w);
    known.learn(ns(1, 0), KeyData::Text(Arc::from("ghijkl")), &w);
    assert_eq!(known.len(), 1);
    assert!(known.units() <= 10);
}

#[test]
fn holders_are_most_recent_first_and_bounded() {
    let mut known = KnownPaths::new(10, 1 << 20);
    let (hash, change) = known
        .learn(ns(1, 0), tokens(&[9]), &url("http://a"))
        .unwrap();
    assert_eq!(change, PathChange::News);
    let again = known
        .learn(ns(1, 0), tokens(&[9]), &url("http://a"))
        .unwrap();
    assert_eq!(
        again,
        (hash, PathChange::Known),
        "a known holder is no news"
    );
    for name in ["http://b", "http://c", "http://d", "http://e", "http://b"] {
        known.name_holder(1, hash, &url(name)).unwrap();
    }
    let path = known.get(1, hash).unwrap();
    let tenants: Vec<&str> = path.tenants.iter().map(|t| &**t).collect();
    assert_eq!(tenants, ["http://b", "http://e", "http://d", "http://c"]);
    assert!(known.name_holder(1, hash ^ 1, &url("http://a")).is_none());
    assert!(known.name_holder(2, hash, &url("http://a")).is_none());
}

#[test]
fn repair_pages_resume_after_their_last_hash_and_cover_the_model_once() {
    let mut known = KnownPaths::new(10_000, 1 << 24);
    let w = url("http://w");
    let n = MESH_REPAIR_PAGE_ENTRIES * 2 + 7;
    let mut expected: Vec<u64> = (0..n as u64)
        .map(|i| known.learn(ns(1, 0), tokens(&[i]), &w).unwrap().0)
        .collect();
    known.learn(ns(2, 0), tokens(&[1]), &w);
    known.learn(ns(1, 0), KeyData::Text(Arc::from("secret prompt")), &w);
    let mut seen = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    let epoch = known.epoch();
    loop {
        let page = known.page(1, 9, (epoch, after), NO_BOUND);
        assert_eq!(page.epoch, epoch);
        pages += 1;
        assert_eq!(page.repair_id, 9);
        for entry in &page.entries {
            if entry.kind == wire::TreeKind::Token as i32 {
                seen.push(entry.path_hash);
                // The receiver rebuilds the path from the page hashes alone.
                let (namespace, key) = entry_key(&KnownPaths::new(1, 1), 1, entry).unwrap();
                assert_eq!(namespace, ns(1, 0));
                assert_eq!(path_hash(namespace, &key), Some(entry.path_hash));
            } else {
                // Text never crosses the wire: only its hash.
                assert!(entry.pages.is_empty());
                assert!(entry_key(&KnownPaths::new(1, 1), 1, entry).is_none());
            }
            assert_eq!(page.worker_urls[entry.workers[0] as usize], "http://w");
        }
        after = page.next_after;
        if page.done {
            break;
        }
    }
    assert_eq!(pages, 3);
    expected.sort_unstable();
    seen.sort_unstable();
    assert_eq!(seen, expected);
    // The next repair from this mark gets only what changed: two new paths, one newly named
    // holder of an old one.
    let new_a = known.learn(ns(1, 0), tokens(&[1 << 40]), &w).unwrap().0;
    let new_b = known.learn(ns(1, 0), tokens(&[1 << 41]), &w).unwrap().0;
    known.name_holder(1, expected[0], &url("http://other"));
    // A holder named again is no change: paths do not circle between gateways.
    known.name_holder(1, expected[1], &w);
    known.learn(ns(1, 0), tokens(&[5]), &w);
    let page = known.page(1, 10, (epoch, after), NO_BOUND);
    let mut changed: Vec<u64> = page.entries.iter().map(|e| e.path_hash).collect();
    changed.sort_unstable();
    let mut want = vec![new_a, new_b, expected[0]];
    want.sort_unstable();
    assert_eq!((changed, page.done), (want, true));
    // A mark of another epoch (this gateway restarted) starts from the first path.
    assert_eq!(
        known
            .page(1, 11, (epoch ^ 1, after), NO_BOUND)
            .entries
            .len(),
        MESH_REPAIR_PAGE_ENTRIES
    );
    let encoded = known.page(1, 9, (0, 0), NO_BOUND).encode_to_vec();
    assert!(!encoded.windows(6).any(|w| w == b"secret"));
}

#[test]
fn a_repair_entry_whose_pages_do_not_hash_to_its_path_is_refused() {
    let mut known = KnownPaths::new(10, 1 << 20);
    known.learn(ns(1, 0), tokens(&[1, 2]), &url("http://w"));
    let mut page = known.page(1, 1, (0, 0), NO_BOUND);
    let entry = &mut page.entries[0];
    entry.pages[1] ^= 1;
    assert!(entry_key(&KnownPaths::new(1, 1), 1, entry).is_none());
}

#[test]
fn a_round_batches_per_model_and_names_each_path_and_worker_once() {
    let mut round = DeltaRound::default();
    assert_eq!(
        round.add(1, (TreeKind::Tokens, 10), "http://a", None),
        Batched::Added
    );
    assert_eq!(
        round.add(1, (TreeKind::Tokens, 10), "http://a", None),
        Batched::Duplicate
    );
    assert_eq!(
        round.add(1, (TreeKind::Tokens, 10), "http://b", None),
        Batched::Added
    );
    assert_eq!(
        round.add(2, (TreeKind::Text, 11), "http://a", None),
        Batched::Added
    );
    assert_eq!(round.len(), 3);
    let mut batches = round.take();
    batches.sort_by_key(|b| b.batch.model);
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].batch.deltas.len(), 2);
    assert_eq!(batches[0].batch.worker_urls, ["http://a", "http://b"]);
    assert_eq!(batches[1].batch.deltas[0].kind, wire::TreeKind::Text as i32);
    assert!(round.is_empty() && round.take().is_empty());
    // The round's cap: the rest of a burst is dropped.
    for i in 0..crate::limits::MESH_ROUND_DELTAS_MAX as u64 {
        assert_eq!(
            round.add(1, (TreeKind::Tokens, i), "http://a", None),
            Batched::Added
        );
    }
    assert_eq!(
        round.add(1, (TreeKind::Tokens, u64::MAX), "http://a", None),
        Batched::Full
    );
}

fn delta_frame() -> Frame {
    let batch = DeltaBatch {
        model: 3,
        recipients: 0,
        epoch: 0,
        known_before: 0,
        worker_urls: vec!["http://a".into()],
        deltas: vec![wire::Delta {
            kind: wire::TreeKind::Token as i32,
            path_hash: 77,
            worker: 0,
            ..wire::Delta::default()
        }],
    };
    wire::frame("127.0.0.1:1", Body::Deltas(batch))
}

fn key(text: &str) -> MeshKey {
    MeshKey::new(text.as_bytes()).unwrap()
}

/// A dialer and an acceptor of one stream, under `dialer` and `acceptor`'s keys.
fn stream_pair(dialer: &Authenticator, acceptor: &Authenticator) -> (StreamSeal, StreamOpen) {
    let nonce = auth::fresh_nonce();
    let challenge = auth::challenge(&nonce);
    let heard = auth::parse_challenge(&challenge).unwrap();
    (
        StreamSeal::new(dialer.clone(), heard),
        StreamOpen::new(acceptor.clone(), nonce),
    )
}

#[test]
fn frames_are_taken_whole_from_a_stream() {
    let keyed = Authenticator::new(Some(&key("0123456789abcdef-secret")));
    let (mut seal, mut open) = stream_pair(&keyed, &keyed);
    let frame = delta_frame();
    let bytes = [
        seal.seal(&wire::encode(&frame)),
        seal.seal(&wire::encode(&frame)),
    ]
    .concat();
    let mut buffer = bytes[..5].to_vec();
    assert_eq!(open.take_frame(&mut buffer), Ok(None));
    buffer.extend_from_slice(&bytes[5..40]);
    assert_eq!(open.take_frame(&mut buffer), Ok(None));
    buffer.extend_from_slice(&bytes[40..]);
    assert_eq!(open.take_frame(&mut buffer), Ok(Some(frame.clone())));
    assert_eq!(open.take_frame(&mut buffer), Ok(Some(frame)));
    assert!(buffer.is_empty());
    // A length over the cap is refused from its four bytes, before any body is held.
    let mut huge = ((MESH_FRAME_BYTES_MAX + 1) as u32).to_be_bytes().to_vec();
    assert!(matches!(
        open.take_frame(&mut huge),
        Err(FrameError::TooLarge(_))
    ));
    // Bytes with a valid tag that do not decode.
    let mut garbage = seal.seal(&[0xff, 0xff, 0xff]);
    assert!(matches!(
        open.take_frame(&mut garbage),
        Err(FrameError::Malformed(_))
    ));
}

#[test]
fn a_frame_without_the_key_or_replayed_fails_its_tag_before_it_is_decoded() {
    let keyed = Authenticator::new(Some(&key("0123456789abcdef-secret")));
    let wrong = Authenticator::new(Some(&key("0123456789abcdef-other")));
    let public = Authenticator::new(None);
    assert!(keyed.is_authenticated() && !public.is_authenticated());
    let body = wire::encode(&delta_frame());
    for dialer in [&wrong, &public] {
        let (mut seal, mut open) = stream_pair(dialer, &keyed);
        let mut bytes = seal.seal(&body);
        assert_eq!(
            open.take_frame(&mut bytes),
            Err(FrameError::Unauthenticated)
        );
    }
    // Unsealed bytes (a peer of the earlier framing): the "tag" does not check.
    let (_, mut open) = stream_pair(&keyed, &keyed);
    let mut plain = [
        (body.len() as u32).to_be_bytes().to_vec(),
        vec![0; 32],
        body.clone(),
    ]
    .concat();
    assert_eq!(
        open.take_frame(&mut plain),
        Err(FrameError::Unauthenticated)
    );
    // A frame recorded on one stream and replayed on another (another nonce), or replayed on
    // its own stream (another sequence number), fails.
    let (mut seal, mut open) = stream_pair(&keyed, &keyed);
    let recorded = seal.seal(&body);
    let (_, mut other) = stream_pair(&keyed, &keyed);
    assert_eq!(
        other.take_frame(&mut recorded.clone()),
        Err(FrameError::Unauthenticated)
    );
    assert!(open.take_frame(&mut recorded.clone()).unwrap().is_some());
    assert_eq!(
        open.take_frame(&mut recorded.clone()),
        Err(FrameError::Unauthenticated)
    );
    // One altered byte.
    let (mut seal, mut open) = stream_pair(&keyed, &keyed);
    let mut altered = seal.seal(&body);
    let last = altered.len() - 1;
    altered[last] ^= 1;
    assert_eq!(
        open.take_frame(&mut altered),
        Err(FrameError::Unauthenticated)
    );
    // The dialer's proof.
    let nonce = auth::fresh_nonce();
    assert!(keyed.check_proof(&nonce, &keyed.proof(&nonce)));
    assert!(!keyed.check_proof(&nonce, &wrong.proof(&nonce)));
    assert!(!keyed.check_proof(&nonce, &keyed.proof(&auth::fresh_nonce())));
    assert!(!keyed.check_proof(&nonce, &[]));
    let mut challenge = auth::challenge(&nonce);
    challenge[0] ^= 1;
    assert_eq!(auth::parse_challenge(&challenge), None);
}

#[test]
fn a_datagram_opens_only_under_the_key_and_within_its_time_window() {
    let keyed = Authenticator::new(Some(&key("0123456789abcdef-secret")));
    let wrong = Authenticator::new(Some(&key("0123456789abcdef-other")));
    let public = Authenticator::new(None);
    let now = 1_800_000_000_000u64;
    let sealed = keyed.seal_datagram(b"swim", now);
    assert_eq!(keyed.open_datagram(&sealed, now), Ok(&b"swim"[..]));
    assert_eq!(wrong.open_datagram(&sealed, now), Err(AuthError::BadTag));
    assert_eq!(
        keyed.open_datagram(&public.seal_datagram(b"swim", now), now),
        Err(AuthError::BadTag)
    );
    // Without a key the format is the same, and opens under no key only.
    let open = public.seal_datagram(b"swim", now);
    assert_eq!(public.open_datagram(&open, now), Ok(&b"swim"[..]));
    // A raw foca datagram (no header) or a truncated one.
    assert_eq!(keyed.open_datagram(b"swim", now), Err(AuthError::Malformed));
    assert_eq!(
        keyed.open_datagram(&sealed[..auth::DATAGRAM_HEADER_BYTES - 1], now),
        Err(AuthError::Malformed)
    );
    let mut altered = sealed.clone();
    altered[auth::DATAGRAM_HEADER_BYTES] ^= 1;
    assert_eq!(keyed.open_datagram(&altered, now), Err(AuthError::BadTag));
    // The time is covered by the tag: changing it to look fresh fails.
    let mut restamped = sealed.clone();
    restamped[8] ^= 1;
    assert_eq!(keyed.open_datagram(&restamped, now), Err(AuthError::BadTag));
    let window = MESH_DATAGRAM_AGE_MAX.as_millis() as u64;
    assert!(keyed.open_datagram(&sealed, now + window).is_ok());
    assert_eq!(
        keyed.open_datagram(&sealed, now + window + 1),
        Err(AuthError::Stale)
    );
    assert_eq!(
        keyed.open_datagram(&sealed, now - window - 1),
        Err(AuthError::Stale)
    );
}

#[test]
fn the_secret_file_is_read_trimmed_and_a_short_one_refused() {
    let dir = std::env::temp_dir().join(format!("kvgate-mesh-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    std::fs::write(&good, "0123456789abcdef\n").unwrap();
    let short = dir.join("short");
    std::fs::write(&short, "0123456789abcde\n").unwrap();
    let config = |path: &std::path::Path| {
        mesh_config(&[
            "--enable-mesh",
            "--mesh-host",
            "127.0.0.1",
            "--mesh-secret-file",
            path.to_str().unwrap(),
        ])
    };
    let secret = config(&good).unwrap().unwrap().secret.unwrap();
    assert_eq!(format!("{secret:?}"), "MeshKey(16 bytes)", "never printed");
    let same = Authenticator::new(Some(&key("0123456789abcdef")));
    let from_file = Authenticator::new(Some(&secret));
    let sealed = same.seal_datagram(b"x", 1);
    assert!(
        from_file.open_datagram(&sealed, 1).is_ok(),
        "the newline is not key"
    );
    assert_eq!(config(&short).unwrap_err().flag, "--mesh-secret-file");
    assert_eq!(
        config(&dir.join("absent")).unwrap_err().flag,
        "--mesh-secret-file"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn listed(ids: &[&str]) -> Vec<ListedModel> {
    ids.iter()
        .map(|id| ListedModel {
            id: id.to_string(),
            entry: serde_json::json!({ "id": id }),
            eos_token_ids: Vec::new(),
        })
        .collect()
}

#[test]
fn peers_name_only_served_models_and_a_bounded_number_when_any_is_served() {
    let models = listed(&["m"]);
    let catalog = ModelCatalog::build([(crate::ids::WorkerId(0), Some(&models[..]))].into_iter());
    let mut served = ServedModels::of_catalog(&catalog);
    assert!(served.admits(crate::policy::model_hash("m")));
    assert!(
        served.admits(crate::policy::model_hash("")),
        "requests without a model"
    );
    assert!(!served.admits(crate::policy::model_hash("other")));
    for fake in 0..10_000u64 {
        assert!(!served.admits(fake));
    }
    // This gateway's own dispatches are served by definition.
    served.note_local(42);
    assert!(served.admits(42));
    // A worker of unknown models serves any: admitted up to the cap, then refused.
    let catalog = ModelCatalog::build([(crate::ids::WorkerId(0), None)].into_iter());
    let mut served = ServedModels::of_catalog(&catalog);
    let admitted = (0..10_000u64).filter(|m| served.admits(*m)).count();
    assert_eq!(admitted, MESH_MODELS_MAX);
    assert!(served.admits(0), "an admitted model stays admitted");
}

#[test]
fn a_repair_page_is_expected_only_from_the_peer_asked_under_the_repairs_id() {
    let mut repairs = Repairs::default();
    let live = peers(&[1, 2]);
    let t0 = Instant::now();
    let ask = repairs
        .start(5, Some(live[0]), NO_BOUND, &live, t0)
        .unwrap();
    assert!(repairs.expects(5, ask.repair_id, live[0]));
    assert!(!repairs.expects(5, ask.repair_id, live[1]), "another peer");
    assert!(
        !repairs.expects(5, ask.repair_id + 1, live[0]),
        "another id"
    );
    assert!(!repairs.expects(6, ask.repair_id, live[0]), "another model");
    let PageOutcome::Next(_) = repairs.on_page(5, ask.repair_id, (7, 3), false, t0) else {
        panic!("a page of a running repair");
    };
    assert_eq!(repairs.marks_len(), 1);
    // The first delta of a model from a peer since it came up asks for a catch-up repair.
    assert!(repairs.first_heard(live[0], 5));
    assert!(!repairs.first_heard(live[0], 5));
    assert!(repairs.first_heard(live[0], 6));
    assert!(repairs.first_heard(live[1], 5));
    // A peer that leaves is caught up with again when it returns, from its mark.
    repairs.forget_peer(live[0]);
    assert!(repairs.first_heard(live[0], 5));
    assert!(!repairs.first_heard(live[1], 5), "another peer's stays");
    assert_eq!(repairs.marks_len(), 1, "marks resume the catch-up");
    // This gateway was declared down and rejoined (a pause, a partition): every peer's next
    // delta catches up again, from the marks.
    repairs.forget_heard();
    assert!(repairs.first_heard(live[0], 5));
    assert!(repairs.first_heard(live[1], 5));
    assert_eq!(repairs.marks_len(), 1);
}

/// A version-2 frame as a newer gateway might send it: the version-1 fields, a new field in the
/// frame and in a delta, and a body this version does not know.
mod v2 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Frame {
        #[prost(uint32, tag = "1")]
        pub version: u32,
        #[prost(string, tag = "2")]
        pub sender: String,
        #[prost(message, optional, tag = "3")]
        pub deltas: Option<DeltaBatch>,
        #[prost(message, optional, tag = "9")]
        pub future_body: Option<DeltaBatch>,
        #[prost(string, tag = "15")]
        pub zone: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeltaBatch {
        #[prost(fixed64, tag = "1")]
        pub model: u64,
        #[prost(string, repeated, tag = "2")]
        pub worker_urls: Vec<String>,
        #[prost(message, repeated, tag = "3")]
        pub deltas: Vec<Delta>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Delta {
        #[prost(int32, tag = "1")]
        pub kind: i32,
        #[prost(fixed64, tag = "2")]
        pub path_hash: u64,
        #[prost(uint32, tag = "3")]
        pub worker: u32,
        #[prost(uint64, tag = "4")]
        pub tick: u64,
    }
}

#[test]
fn a_newer_versions_frames_are_read_for_the_fields_this_version_knows() {
    let newer = v2::Frame {
        version: 2,
        sender: "127.0.0.1:9".into(),
        deltas: Some(v2::DeltaBatch {
            model: 3,
            worker_urls: vec!["http://a".into()],
            deltas: vec![v2::Delta {
                kind: 1,
                path_hash: 77,
                worker: 0,
                tick: 123,
            }],
        }),
        future_body: None,
        zone: "eu-1".into(),
    };
    let read = Frame::decode(newer.encode_to_vec().as_slice()).unwrap();
    assert_eq!(read.version, 2);
    let Some(Body::Deltas(batch)) = read.body else {
        panic!("the deltas body is read: {read:?}");
    };
    assert_eq!((batch.model, batch.deltas[0].path_hash), (3, 77));
    // A body only the newer version knows reads as no body (the mesh skips the frame).
    let unknown = v2::Frame {
        version: 2,
        future_body: newer.deltas.clone(),
        deltas: None,
        ..newer.clone()
    };
    let read = Frame::decode(unknown.encode_to_vec().as_slice()).unwrap();
    assert_eq!(read.body, None);
    // And the other way: a version-1 frame reads as a version-2 one, new fields empty.
    let older = v2::Frame::decode(delta_frame().encode_to_vec().as_slice()).unwrap();
    assert_eq!(older.version, 1);
    assert_eq!(older.deltas.unwrap().deltas[0].tick, 0);
}

/// A catch-up without a bound (an older sender's batch).
const NO_BOUND: (u64, u64) = (0, 0);

fn peers(ports: &[u16]) -> Vec<SocketAddr> {
    ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect()
}

#[test]
fn a_stalled_repair_moves_to_another_peer_then_is_abandoned() {
    let mut repairs = Repairs::default();
    let live = peers(&[1, 2]);
    let t0 = Instant::now();
    assert_eq!(
        repairs.start(5, None, NO_BOUND, &[], t0),
        None,
        "no live peer, no repair"
    );
    let named = repairs
        .start(5, Some(live[1]), NO_BOUND, &live, t0)
        .unwrap();
    assert_eq!(
        named.peer, live[1],
        "the peer that named the path is asked first"
    );
    let mut repairs = Repairs::default();
    let first = repairs
        .start(5, Some(peers(&[9])[0]), NO_BOUND, &live, t0)
        .unwrap();
    assert!(
        live.contains(&first.peer),
        "a named peer that is not live is not asked"
    );
    assert_eq!(
        repairs.start(5, None, NO_BOUND, &live, t0),
        None,
        "one repair per model"
    );
    // A page resumes the repair after its last sequence number.
    let next = match repairs.on_page(5, first.repair_id, (7, 42), false, t0) {
        PageOutcome::Next(ask) => ask,
        other => panic!("{other:?}"),
    };
    assert_eq!((next.peer, next.epoch, next.after), (first.peer, 7, 42));
    assert!(repairs
        .check_stalls(&live, t0 + MESH_REPAIR_STALL / 2)
        .is_empty());
    let mut at = t0;
    let mut peer = first.peer;
    for retry in 1..=MESH_REPAIR_RETRIES {
        at += MESH_REPAIR_STALL;
        let outcomes = repairs.check_stalls(&live, at);
        let [StallOutcome::Retried(ask)] = &outcomes[..] else {
            panic!("retry {retry}: {outcomes:?}");
        };
        assert_ne!(ask.peer, peer, "another peer when there is one");
        // Each peer numbers its own paths: the first resumes at 42, the other from its start.
        let mark = if ask.peer == first.peer { 42 } else { 0 };
        assert_eq!(ask.after, mark, "resumed at that peer's mark");
        peer = ask.peer;
        // A page of an older try is ignored.
        assert_eq!(
            repairs.on_page(5, first.repair_id, (7, 99), true, at),
            PageOutcome::Stale
        );
    }
    at += MESH_REPAIR_STALL;
    assert_eq!(
        repairs.check_stalls(&live, at),
        [StallOutcome::Abandoned(5)]
    );
    assert!(repairs.is_empty());
    // The next unknown path starts it again, at the asked peer's mark.
    let again = repairs
        .start(5, Some(first.peer), NO_BOUND, &live, at)
        .unwrap();
    assert_eq!((again.epoch, again.after), (7, 42));
    assert_eq!(
        repairs.on_page(5, again.repair_id, (7, 50), true, at),
        PageOutcome::Completed { again: false }
    );
    // A catch-up asked while a repair runs asks for one more repair when it completes.
    let ask = repairs.start(5, None, NO_BOUND, &live, at).unwrap();
    assert_eq!(repairs.start(5, None, NO_BOUND, &live, at), None);
    assert_eq!(
        repairs.on_page(5, ask.repair_id, (7, 50), true, at),
        PageOutcome::Completed { again: true }
    );
}

/// A responder's known paths: `n` Mooncake-like paths of 890 pages each, all held by one worker.
fn long_paths(n: u64) -> (KnownPaths, Vec<u64>) {
    let mut known = KnownPaths::new(MESH_KNOWN_PATHS_MAX, MESH_KNOWN_BYTES_MAX);
    let hashes = (0..n)
        .map(|i| {
            let pages: Vec<u64> = (0..890).map(|p| page_hash(&[i as u32, p])).collect();
            known
                .learn(ns(5, 0), tokens(&pages), &url("http://w"))
                .unwrap()
                .0
        })
        .collect();
    (known, hashes)
}

#[test]
fn a_delta_that_cannot_be_rebuilt_repairs_its_paths_alone_not_the_model_since_the_mark() {
    let live = peers(&[1, 2]);
    let t0 = Instant::now();
    let (responder, hashes) = long_paths(40);
    let mut repairs = Repairs::default();
    // The catch-up when the peer was first heard: the model's paths after the mark (none yet).
    let catch_up = repairs
        .start(5, Some(live[0]), NO_BOUND, &live, t0)
        .unwrap();
    assert!(catch_up.paths.is_empty());
    let epoch = responder.epoch();
    assert_eq!(
        repairs.on_page(5, catch_up.repair_id, (epoch, 0), true, t0),
        PageOutcome::Completed { again: false }
    );
    // The peer learned 40 long paths since (its deltas brought them here), then sends a delta
    // on a prefix this gateway lacks: the repair asks for that one path, of that peer.
    let unknown = hashes[17];
    let ask = repairs
        .start_paths(5, Some(live[0]), &[unknown], &live, t0)
        .unwrap();
    assert_eq!((ask.peer, ask.paths.clone()), (live[0], vec![unknown]));
    let page = responder.page_of_paths(5, ask.repair_id, (ask.epoch, ask.after), &ask.paths);
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].path_hash, unknown);
    assert_eq!(page.entries[0].pages.len(), 890);
    assert!(page.done);
    // It costs about the one path's pages, where the model's page after the mark (what the
    // repair asked for before) held every path the peer learned since: 40 times as much.
    let whole = responder.page(5, ask.repair_id, (ask.epoch, ask.after), NO_BOUND);
    assert_eq!(whole.entries.len(), 40);
    let (one, all) = (page.encoded_len(), whole.encoded_len());
    assert!(one < 7_300 && all > 35 * one, "{one} vs {all} bytes");
    // The mark comes back as it was: the next catch-up from this peer resumes there.
    assert_eq!((page.epoch, page.next_after), (epoch, ask.after));
    assert_eq!(
        repairs.on_page(5, ask.repair_id, (page.epoch, page.next_after), true, t0),
        PageOutcome::Completed { again: false }
    );
    let next = repairs
        .start(5, Some(live[0]), NO_BOUND, &live, t0)
        .unwrap();
    assert_eq!((next.epoch, next.after), (epoch, 0));
    // Unknown paths and a restarted responder: hashes it does not know are left out, and a
    // mark of another epoch comes back from the first.
    let page = responder.page_of_paths(5, 9, (epoch ^ 1, 33), &[unknown, 12345]);
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.next_after, 0);
}

#[test]
fn what_is_asked_while_a_repair_runs_waits_for_it_catch_ups_with_each_peer_first() {
    let live = peers(&[1, 2, 3]);
    let t0 = Instant::now();
    let mut repairs = Repairs::default();
    // This gateway (re)joined: the first delta of each peer asks for a catch-up with it.
    let first = repairs
        .start(5, Some(live[0]), NO_BOUND, &live, t0)
        .unwrap();
    assert_eq!(first.peer, live[0]);
    assert_eq!(repairs.start(5, Some(live[1]), NO_BOUND, &live, t0), None);
    assert_eq!(repairs.start(5, Some(live[2]), NO_BOUND, &live, t0), None);
    assert_eq!(
        repairs.start(5, Some(live[1]), NO_BOUND, &live, t0),
        None,
        "once per peer"
    );
    assert_eq!(
        repairs.start_paths(5, Some(live[2]), &[11, 12], &live, t0),
        None
    );
    assert_eq!(
        repairs.start_paths(5, Some(live[2]), &[12, 13], &live, t0),
        None
    );
    // Each completes in turn: the catch-ups with the other peers (a peer that left is
    // skipped), then the unknown paths, each once, of the peer that named them.
    assert_eq!(
        repairs.on_page(5, first.repair_id, (7, 1), true, t0),
        PageOutcome::Completed { again: true }
    );
    let second = repairs.resume_waiting(5, &live, t0).unwrap();
    assert_eq!((second.peer, second.paths.len()), (live[1], 0));
    assert_eq!(
        repairs.on_page(5, second.repair_id, (8, 1), true, t0),
        PageOutcome::Completed { again: true }
    );
    let without_third = [live[0], live[1]];
    let paths = repairs.resume_waiting(5, &without_third, t0).unwrap();
    assert_eq!(paths.paths, vec![11, 12, 13]);
    assert!(without_third.contains(&paths.peer));
    assert_eq!(
        repairs.on_page(5, paths.repair_id, (7, 1), true, t0),
        PageOutcome::Completed { again: false }
    );
    assert_eq!(repairs.resume_waiting(5, &live, t0), None);
    assert!(repairs.is_empty());
}

/// Delivers every datagram between in-memory memberships until none is left.
fn exchange(nodes: &mut [Membership], now: Instant) -> Vec<Vec<Change>> {
    let mut changes = vec![Vec::new(); nodes.len()];
    for _ in 0..50 {
        let mut mail = Vec::new();
        for node in nodes.iter_mut() {
            mail.extend(node.take_sends());
        }
        if mail.is_empty() {
            break;
        }
        for (to, data) in mail {
            if let Some(node) = nodes.iter_mut().find(|n| n.me().addr == to) {
                node.handle_datagram(&data, now);
            }
        }
    }
    for (node, changes) in nodes.iter_mut().zip(&mut changes) {
        changes.extend(node.take_changes());
    }
    changes
}

#[test]
fn gateways_join_through_one_peer_and_a_silent_one_is_declared_down() {
    let addrs = peers(&[10, 11, 12]);
    let mut nodes: Vec<Membership> = addrs.iter().map(|a| Membership::new(*a)).collect();
    let now = Instant::now();
    // B and C know only A.
    nodes[1].announce(addrs[0], now);
    nodes[2].announce(addrs[0], now);
    let mut at = now;
    for _ in 0..20 {
        at += Duration::from_millis(250);
        for node in nodes.iter_mut() {
            node.tick(at);
        }
        exchange(&mut nodes, at);
    }
    for node in &nodes {
        assert_eq!(node.live_peers().len(), 2, "{node:?}");
    }
    // C goes silent: A and B suspect it, then declare it down.
    let mut silent = nodes.pop().unwrap();
    let mut downs = Vec::new();
    for _ in 0..200 {
        at += Duration::from_millis(250);
        for node in nodes.iter_mut() {
            node.tick(at);
        }
        for changes in exchange(&mut nodes, at) {
            downs.extend(changes.into_iter().filter(|c| matches!(c, Change::Down(_))));
        }
        silent.take_sends();
    }
    assert_eq!(
        downs.len(),
        2,
        "A and B each declare C down once: {downs:?}"
    );
    assert_eq!(nodes[0].live_peers(), vec![addrs[1]]);
    let counts = nodes[0].counts();
    assert_eq!(counts[0], (PeerState::Alive, 1));
    assert_eq!(counts[2], (PeerState::Down, 1));
}

/// One gateway's side of the path chains, for in-memory deltas.
#[derive(Default)]
struct ChainSide {
    chains: PathChains,
}

impl ChainSide {
    /// The delta batch this side sends `peer` for `key` held by `http://w` (noting what the peer
    /// then knows, as the gossip round does once the batch is queued).
    fn send(&mut self, peer: SocketAddr, namespace: Namespace, key: &KeyData) -> DeltaBatch {
        let path = Arc::new(RoundPath::of(namespace, key).unwrap());
        let hash = path_hash(namespace, key).unwrap();
        let mut round = DeltaRound::default();
        round.add(
            namespace.model,
            (TreeKind::Tokens, hash),
            "http://w",
            Some(path),
        );
        let batch = round.take().pop().unwrap();
        batch.for_peer(peer, &mut self.chains)
    }

    /// Rebuilds and learns a received delta's path, as `apply_deltas` does (with the sender
    /// alone as a member that knows it).
    fn receive(&mut self, sender: SocketAddr, batch: &DeltaBatch) -> Option<KeyData> {
        self.receive_from_mesh(&[sender], batch)
    }

    /// Rebuilds and learns a received delta's path, noting that `knowers` (the sender and the
    /// members it sends to) know it.
    fn receive_from_mesh(&mut self, knowers: &[SocketAddr], batch: &DeltaBatch) -> Option<KeyData> {
        let (_, key, chained) = delta_key(&self.chains, batch.model, &batch.deltas[0])?;
        let KeyData::Tokens(tokens) = &key else {
            panic!("a token path");
        };
        self.chains.learn(tokens, chained, knowers);
        Some(key)
    }
}

fn conversation(system: u64, question: u64) -> KeyData {
    let pages: Vec<u64> = (0..128)
        .map(|i| page_hash(&[system as u32, i]))
        .chain((0..4).map(|i| page_hash(&[question as u32, 1000 + i])))
        .collect();
    tokens(&pages)
}

fn pages_of(key: &KeyData) -> Vec<u64> {
    match key {
        KeyData::Tokens(tokens) => tokens.pages().to_vec(),
        _ => panic!("a token path"),
    }
}

#[test]
fn a_delta_carries_only_the_pages_its_peer_lacks_and_the_peer_inserts_without_a_repair() {
    let [a, b, c] = peers(&[1, 2, 3])[..] else {
        panic!("three peers");
    };
    let (mut gw_a, mut gw_b) = (ChainSide::default(), ChainSide::default());
    let namespace = ns(7, 0);
    // A new path: the whole chain, and B rebuilds it exactly.
    let first = conversation(1, 1);
    let batch = gw_a.send(b, namespace, &first);
    assert_eq!(
        (batch.deltas[0].base_pages, batch.deltas[0].pages.len()),
        (0, 132)
    );
    let rebuilt = gw_b.receive(a, &batch).expect("rebuilt without a repair");
    assert_eq!(pages_of(&rebuilt), pages_of(&first));
    let whole = batch.encoded_len();
    // The same system prompt with another question: only the question's pages cross.
    let second = conversation(1, 2);
    let batch = gw_a.send(b, namespace, &second);
    assert_eq!(
        (batch.deltas[0].base_pages, batch.deltas[0].pages.len()),
        (128, 4)
    );
    let small = batch.encoded_len();
    assert!(
        small < 100 && small * 10 < whole,
        "{small} vs {whole} bytes"
    );
    let rebuilt = gw_b
        .receive(a, &batch)
        .expect("rebuilt from the known prefix");
    assert_eq!(pages_of(&rebuilt), pages_of(&second));
    assert_eq!(
        path_hash(namespace, &rebuilt),
        path_hash(namespace, &second)
    );
    // B heard the prefix from A: B's own delta of it to A starts after it.
    let third = conversation(1, 3);
    let batch = gw_b.send(a, namespace, &third);
    assert_eq!(batch.deltas[0].base_pages, 128);
    assert!(gw_a.receive(b, &batch).is_some());
    // A peer A never sent anything to gets the whole path.
    assert_eq!(gw_a.send(c, namespace, &second).deltas[0].base_pages, 0);
    // Another partition or model shares no prefix.
    assert_eq!(gw_a.send(b, ns(7, 1), &second).deltas[0].base_pages, 0);
    assert_eq!(gw_a.send(b, ns(8, 0), &second).deltas[0].base_pages, 0);
    // A peer that forgot (restarted): A forgets what it believed, and sends whole paths again.
    gw_a.chains.forget(b);
    assert_eq!(gw_a.send(b, namespace, &third).deltas[0].base_pages, 0);
}

#[test]
fn a_prompt_heard_from_one_peer_is_not_sent_to_the_others_that_heard_it_too() {
    let [a, b, c, d] = peers(&[1, 2, 3, 4])[..] else {
        panic!("four peers");
    };
    let namespace = ns(7, 0);
    let (mut gw_a, mut gw_b) = (ChainSide::default(), ChainSide::default());
    // A dispatches a new prompt and sends it whole to its members B, C and D.
    let first = conversation(1, 1);
    let to_b = gw_a.send(b, namespace, &first);
    assert_eq!(to_b.deltas[0].pages.len(), 132);
    // B hears it from A, which sends to every live member: B notes that C and D know it.
    assert!(gw_b.receive_from_mesh(&[a, c, d], &to_b).is_some());
    // B dispatches the same system prompt with another question: only the question's pages go
    // to C and D, as to A.
    for peer in [a, c, d] {
        let batch = gw_b.send(peer, namespace, &conversation(1, 2));
        assert_eq!(
            (batch.deltas[0].base_pages, batch.deltas[0].pages.len()),
            (128, 4),
            "to {peer}"
        );
    }
    // A member B did not count among A's (it joined later) gets the whole path.
    let e = peers(&[5])[0];
    assert_eq!(gw_b.send(e, namespace, &first).deltas[0].base_pages, 0);
    // D leaves: B forgets what D knew, and only that.
    gw_b.chains.forget(d);
    assert_eq!(gw_b.send(d, namespace, &first).deltas[0].base_pages, 0);
    assert_eq!(gw_b.send(c, namespace, &first).deltas[0].base_pages, 132);
}

#[test]
fn a_batch_names_its_recipients_by_a_hash_of_the_set() {
    use super::chains::recipients_hash;
    let [a, b, c] = peers(&[1, 2, 3])[..] else {
        panic!("three peers");
    };
    // What A sent to (B and C) and what B sees besides A (C and itself) hash the same.
    assert_eq!(recipients_hash(&[b, c]), recipients_hash(&[c, b]));
    assert_ne!(recipients_hash(&[b, c]), recipients_hash(&[b]));
    assert_ne!(recipients_hash(&[b, c]), recipients_hash(&[a, c]));
    assert_ne!(recipients_hash(&[]), 0, "0 is an older sender's");
}

#[test]
fn the_recipients_memo_gives_the_hash_of_the_set_past_its_capacity() {
    use super::chains::{recipients_hash, RecipientsHashes};
    let members = peers(&(1..=40).collect::<Vec<u16>>());
    let mut memo = RecipientsHashes::default();
    // Sets of every size, each met twice and in another order: always the set's hash.
    for round in 0..2 {
        for len in 0..members.len() {
            let mut set = members[..len].to_vec();
            if round == 1 {
                set.reverse();
            }
            assert_eq!(
                memo.of(&set),
                recipients_hash(&members[..len]),
                "{len} members"
            );
        }
    }
}

#[test]
fn a_batch_for_several_peers_is_each_peers_batch_alone() {
    let namespace = ns(7, 0);
    let [a, b, c] = peers(&[1, 2, 3])[..] else {
        panic!("three peers");
    };
    // B already knows the first conversation's path (A sent it), C knows nothing.
    let mut together = ChainSide::default();
    let mut alone = ChainSide::default();
    for side in [&mut together, &mut alone] {
        side.send(b, namespace, &conversation(1, 1));
    }
    let mut round = DeltaRound::default();
    for question in [2, 3] {
        let key = conversation(1, question);
        let path = Arc::new(RoundPath::of(namespace, &key).unwrap());
        let hash = path_hash(namespace, &key).unwrap();
        round.add(7, (TreeKind::Tokens, hash), "http://w", Some(path));
    }
    let batch = round.take().pop().unwrap();
    let both = batch.for_peers(&[b, c], &mut together.chains);
    let each = [
        batch.for_peer(b, &mut alone.chains),
        batch.for_peer(c, &mut alone.chains),
    ];
    // The same pages on the same bases (a base may be named by another path that has it).
    let unnamed = |batches: &[DeltaBatch]| -> Vec<DeltaBatch> {
        let mut batches = batches.to_vec();
        for delta in batches.iter_mut().flat_map(|b| b.deltas.iter_mut()) {
            delta.base_path = 0;
        }
        batches
    };
    assert_eq!(unnamed(&both), unnamed(&each));
    // The second delta shares the first's new prefix: after the first, it carries only its own.
    let carried: Vec<Vec<(u32, usize)>> = both
        .iter()
        .map(|batch| {
            let pages = |d: &wire::Delta| (d.base_pages, d.pages.len());
            batch.deltas.iter().map(pages).collect()
        })
        .collect();
    assert_eq!(
        carried,
        vec![vec![(128, 4), (128, 4)], vec![(0, 132), (128, 4)]]
    );
    // Both peers are now noted as knowing both paths, as after two batches sent alone.
    let path = batch.paths[1].as_ref().unwrap();
    for peer in [a, b, c] {
        let known = together.chains.known_by(peer, &path.chains, path.pages());
        let alone = alone.chains.known_by(peer, &path.chains, path.pages());
        assert_eq!(known, alone, "{peer}");
    }
    assert_eq!(together.chains.known_by(c, &path.chains, path.pages()), 132);
}

#[test]
fn deltas_of_one_batch_that_share_a_new_prefix_carry_it_once() {
    let b = peers(&[2])[0];
    let namespace = ns(7, 0);
    let mut side = ChainSide::default();
    let mut round = DeltaRound::default();
    for question in [1, 2] {
        let key = conversation(1, question);
        let path = Arc::new(RoundPath::of(namespace, &key).unwrap());
        let hash = path_hash(namespace, &key).unwrap();
        round.add(7, (TreeKind::Tokens, hash), "http://w", Some(path));
    }
    let batch = round.take().pop().unwrap();
    let for_b = batch.for_peer(b, &mut side.chains);
    let carried: Vec<(u32, usize)> = for_b
        .deltas
        .iter()
        .map(|d| (d.base_pages, d.pages.len()))
        .collect();
    assert_eq!(carried, vec![(0, 132), (128, 4)]);
    // B rebuilds both, in order, from the one batch.
    let mut gw_b = ChainSide::default();
    for delta in &for_b.deltas {
        let one = DeltaBatch {
            deltas: vec![delta.clone()],
            ..for_b.clone()
        };
        assert!(gw_b.receive(peers(&[1])[0], &one).is_some());
    }
}

#[test]
fn a_delta_on_a_prefix_not_known_here_or_that_does_not_hash_to_its_path_is_not_inserted() {
    let [a, b] = peers(&[1, 2])[..] else {
        panic!("two peers");
    };
    let mut gw_a = ChainSide::default();
    let namespace = ns(7, 0);
    gw_a.send(b, namespace, &conversation(1, 1));
    let short = gw_a.send(b, namespace, &conversation(1, 2));
    assert_eq!(short.deltas[0].base_pages, 128);
    // B lost its chains (or never got the first delta): no rebuild; the caller repairs.
    assert!(ChainSide::default().receive(a, &short).is_none());
    // A page altered in flight by a key holder: the path hash does not match.
    let mut whole = ChainSide::default().send(b, namespace, &conversation(1, 1));
    let mut gw_b = ChainSide::default();
    whole.deltas[0].pages[3] ^= 1;
    assert!(gw_b.receive(a, &whole).is_none());
    // A prefix claimed longer than any path: refused before anything is allocated for it.
    let mut huge = short.clone();
    huge.deltas[0].base_pages = u32::MAX;
    assert!(gw_b.receive(a, &huge).is_none());
    // An older sender's delta (no pages) or a text delta: no rebuild.
    let mut older = short.clone();
    older.deltas[0].block_size = 0;
    assert!(gw_b.receive(a, &older).is_none());
    // A base is found by the known path it names, or (an earlier sender, which names none)
    // by its chain hash when that is a known path's or an anchor's.
    let pages = pages_of(&conversation(1, 1));
    let chains = chain_hashes(namespace, 16, &pages);
    let TokenKeyOf(key) = TokenKeyOf::of(&conversation(1, 1));
    let mut known = PathChains::default();
    known.learn_chains(&key, chain_root(namespace, 16), &chains, &[]);
    assert_eq!((known.len(), known.anchors()), (1, 132 / ANCHOR_PAGES));
    let end = chains[131];
    let found = known.base_of(end, 0, 10).expect("a prefix of a known path");
    assert_eq!(found.pages, &pages[..10]);
    assert!(found.anchors.is_empty());
    let found = known.base_of(end, 0, 40).expect("a prefix of a known path");
    assert_eq!(found.anchors, &[chains[15], chains[31]]);
    assert!(known.base_of(end, 0, 133).is_none(), "longer than the path");
    assert!(
        known.base_of(chains[9], 0, 10).is_none(),
        "no path ends there"
    );
    assert!(known.base_of(0, chains[31], 32).is_some(), "an anchor");
    assert!(
        known.base_of(0, chains[31], 48).is_none(),
        "not that anchor's depth"
    );
    assert!(known.base_of(0, chains[9], 10).is_none(), "not an anchor");
    assert!(known.base_of(0, end, 132).is_some(), "a known path's end");
}

/// The token key of a token path.
struct TokenKeyOf(crate::index::TokenKey);

impl TokenKeyOf {
    fn of(key: &KeyData) -> TokenKeyOf {
        match key {
            KeyData::Tokens(tokens) => TokenKeyOf(tokens.clone()),
            _ => panic!("a token path"),
        }
    }
}

#[test]
fn chain_hashes_that_share_their_low_bits_still_spread_over_buckets() {
    use std::collections::HashSet;
    use std::hash::BuildHasher;
    let keys = super::chains::ChainKeys::default();
    // Digests a client could craft to agree in their low 40 bits.
    let buckets: HashSet<u64> = (0..1000u64)
        .map(|i| keys.hash_one(i << 40) & 0xffff)
        .collect();
    assert!(buckets.len() > 950, "{} of 1000 buckets", buckets.len());
}

#[test]
fn a_catch_up_stops_where_the_batch_that_started_it_began() {
    let live = peers(&[1, 2]);
    let t0 = Instant::now();
    // The peer knew 10 paths before the round whose batch reaches this gateway first; the
    // round's 5 come in that batch as deltas.
    let (mut responder, _) = long_paths(10);
    let until = (responder.epoch(), responder.last_seq());
    for i in 100..105u64 {
        let pages: Vec<u64> = (0..4).map(|p| page_hash(&[i as u32, p])).collect();
        responder.learn(ns(5, 0), tokens(&pages), &url("http://w"));
    }
    let mut repairs = Repairs::default();
    let ask = repairs.start(5, Some(live[0]), until, &live, t0).unwrap();
    assert_eq!(ask.until, until);
    let page = responder.page(5, ask.repair_id, (ask.epoch, ask.after), ask.until);
    assert_eq!(page.entries.len(), 10, "not the round's paths again");
    assert!(page.done);
    // A bound of another run of the peer, or none (an older sender): every path.
    let other_run = (until.0 ^ 1, until.1);
    assert_eq!(responder.page(5, 1, (0, 0), other_run).entries.len(), 15);
    assert_eq!(responder.page(5, 1, (0, 0), NO_BOUND).entries.len(), 15);
    // A mark past the bound: nothing, and the mark stays.
    let page = responder.page(5, 1, (until.0, 12), until);
    assert_eq!(
        (page.entries.len(), page.next_after, page.done),
        (0, 12, true)
    );
    // Retried with another peer, the bound (this peer's numbering) is dropped.
    let outcomes = repairs.check_stalls(&live, t0 + MESH_REPAIR_STALL);
    let [StallOutcome::Retried(retry)] = &outcomes[..] else {
        panic!("{outcomes:?}");
    };
    assert_eq!((retry.peer, retry.until), (live[1], NO_BOUND));
}

#[test]
fn a_delta_builds_on_the_longest_prefix_of_a_path_its_peer_knows_at_any_depth() {
    let [a, b] = peers(&[1, 2])[..] else {
        panic!("two peers");
    };
    let namespace = ns(7, 0);
    let (mut gw_a, mut gw_b) = (ChainSide::default(), ChainSide::default());
    // A conversation's turns: each extends the last (as Mooncake's do), by 50 pages, and a
    // branch leaves the first turn after 40 pages (not a multiple of the anchors' 16).
    let turn = |n: u32| -> KeyData {
        let pages: Vec<u64> = (0..50 * n).map(|i| page_hash(&[9, i])).collect();
        tokens(&pages)
    };
    let branch: Vec<u64> = (0..40)
        .map(|i| page_hash(&[9, i]))
        .chain((0..7).map(|i| page_hash(&[10, i])))
        .collect();
    let first = gw_a.send(b, namespace, &turn(1));
    assert_eq!(first.deltas[0].pages.len(), 50);
    assert!(gw_b.receive(a, &first).is_some());
    for n in 2..=4 {
        let next = gw_a.send(b, namespace, &turn(n));
        let delta = &next.deltas[0];
        assert_eq!((delta.base_pages, delta.pages.len()), (50 * (n - 1), 50));
        assert_ne!(delta.base_path, 0, "the base is named by a known path");
        let rebuilt = gw_b.receive(a, &next).expect("rebuilt from the last turn");
        assert_eq!(pages_of(&rebuilt), pages_of(&turn(n)));
    }
    let to_b = gw_a.send(b, namespace, &tokens(&branch));
    assert_eq!(
        (to_b.deltas[0].base_pages, to_b.deltas[0].pages.len()),
        (40, 7)
    );
    assert_eq!(pages_of(&gw_b.receive(a, &to_b).unwrap()), branch);
    // What was learned is one entry per path and one per 16 pages, not one per page.
    assert_eq!(gw_b.chains.len(), 5);
    assert_eq!(
        gw_b.chains.anchors(),
        200 / ANCHOR_PAGES + 47 / ANCHOR_PAGES - 2
    );
    // B rebuilt the turns exactly: its own delta of the next one to A carries only the new pages.
    let fifth = gw_b.send(a, namespace, &turn(5));
    assert_eq!(fifth.deltas[0].base_pages, 200);
    assert_eq!(
        pages_of(&gw_a.receive(b, &fifth).unwrap()),
        pages_of(&turn(5))
    );
    // A delta that names its base only by the prefix's chain hash (an earlier sender) is
    // rebuilt when that prefix ends a known path here.
    let mut older = gw_a.send(b, namespace, &turn(6));
    older.deltas[0].base_path = 0;
    assert_eq!(older.deltas[0].base_pages, 250);
    assert_eq!(
        pages_of(&gw_b.receive(a, &older).unwrap()),
        pages_of(&turn(6))
    );
}

#[test]
fn path_chains_are_cleared_whole_at_their_bounds_and_forget_a_peer_that_leaves() {
    use super::chains::Chained;
    use crate::limits::{MESH_CHAIN_PAGES_MAX, MESH_CHAIN_PATHS_MAX};
    let [b, c] = peers(&[2, 3])[..] else {
        panic!("two peers");
    };
    // One long key shared by every path (only its length counts): the pages' bound is reached
    // after MESH_CHAIN_PAGES_MAX / len paths, and the next path clears the maps first.
    let len = 1 << 16;
    let TokenKeyOf(key) = TokenKeyOf::of(&tokens(&vec![7; len]));
    let mut chains = PathChains::default();
    let fits = MESH_CHAIN_PAGES_MAX / len;
    assert!(fits < MESH_CHAIN_PATHS_MAX);
    for end in 1..=fits as u64 {
        let chained = Chained {
            anchors: vec![end << 32],
            end,
        };
        chains.learn(&key, chained, &[b]);
    }
    assert_eq!(
        (chains.len(), chains.anchors(), chains.cleared()),
        (fits, fits, 0)
    );
    let one_more = Chained {
        anchors: vec![u64::MAX],
        end: u64::MAX,
    };
    chains.learn(&key, one_more, &[b, c]);
    assert_eq!(
        (chains.len(), chains.anchors(), chains.cleared()),
        (1, 1, 1)
    );
    // C leaves: what it was believed to know goes; B's stays.
    let pages = vec![7u64; len];
    let mut path_chains = vec![0u64; len];
    path_chains[len - 1] = u64::MAX;
    assert_eq!(chains.known_by(c, &path_chains, &pages), len);
    chains.forget(c);
    assert_eq!(chains.known_by(c, &path_chains, &pages), 0);
    assert_eq!(chains.known_by(b, &path_chains, &pages), len);
}
