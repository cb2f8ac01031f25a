//! The index against a brute-force reference model, over random interleavings of insert, lookup,
//! remove-worker and evict (proptest). The model keeps, per (tree, namespace, worker), the keys
//! the worker holds with their last tick; a lookup scans every key. After every step the matched
//! length, request length and tenant set of lookups, and the per-model gauges, must be identical.
//! Inserts carry lookup hints (a data core's lookup of the same key) taken right before, or
//! earlier in the sequence (stale: the tree changed since), or from another namespace or tree
//! kind; a stale hint must never change the tree an insert builds. Half the inserts pass the key
//! in a shared buffer (as the control core does with a dispatch record's key), which new leaves
//! may keep; the test drops its reference right after the insert.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kvgate::ids::WorkerId;
use kvgate::index::{
    token_key, Evicted, IndexConfig, IndexReader, IndexWriter, LookupHint, Namespace, TokenPages,
    TreeKind, TreeMatch,
};
use proptest::prelude::*;

const BLOCK_SIZE: usize = 2;
/// At most this many workers, so every holder set fits in a lookup's eight tenants and sets
/// compare exactly.
const WORKERS: u16 = 6;
const NAMESPACES: [Namespace; 3] = [
    Namespace {
        model: 1,
        partition: 0,
    },
    Namespace {
        model: 1,
        partition: 7,
    },
    Namespace {
        model: 2,
        partition: 0,
    },
];

/// Which lookup hint an insert carries.
#[derive(Clone, Copy, Debug)]
enum HintFrom {
    /// No hint.
    Nothing,
    /// A lookup of the key right before the insert (the data core's case).
    Fresh,
    /// The oldest kept lookup of the same key and kind (any namespace): likely stale.
    Earlier,
    /// A lookup of the key in another namespace.
    OtherNamespace,
    /// A lookup of the key in the other tree kind.
    OtherKind,
}

#[derive(Clone, Debug)]
enum Op {
    Insert {
        kind: TreeKind,
        ns: usize,
        worker: u16,
        key: Vec<u32>,
        hint: HintFrom,
        /// Inserted from a shared buffer (a dispatch record's key, which new leaves may keep
        /// and which the caller drops right after), else from a borrowed slice.
        shared: bool,
    },
    Lookup {
        kind: TreeKind,
        ns: usize,
        query: Vec<u32>,
    },
    RemoveWorker {
        worker: u16,
    },
    Evict {
        budget: u64,
    },
}

/// Elements of a key: token ids, or indexes into `ALPHABET` for text.
const ALPHABET: [char; 3] = ['a', 'b', 'é'];

fn text_of(key: &[u32]) -> String {
    key.iter()
        .map(|i| ALPHABET[*i as usize % ALPHABET.len()])
        .collect()
}

/// The token id of a key element: the low bits the same for every element, so keys differ only
/// in the top two bits of their ids (every bit of an id must count).
fn token_id(element: u32) -> u32 {
    element << 30 | 0x0b0a
}

/// A key's page hashes, as a data core hashes a request's token ids.
fn pages(key: &[u32]) -> TokenPages {
    let ids: Vec<u32> = key.iter().map(|element| token_id(*element)).collect();
    TokenPages::of(&ids, BLOCK_SIZE)
}

/// A key as the tree stores it: UTF-8 bytes, or tokens cut to whole pages.
fn stored(kind: TreeKind, key: &[u32]) -> Vec<u32> {
    match kind {
        TreeKind::Text => text_of(key).bytes().map(u32::from).collect(),
        TreeKind::Tokens => key[..key.len() - key.len() % BLOCK_SIZE].to_vec(),
    }
}

fn floor(kind: TreeKind, elements: &[u32], pos: usize) -> usize {
    let pos = pos.min(elements.len());
    match kind {
        TreeKind::Tokens => pos - pos % BLOCK_SIZE,
        TreeKind::Text => (0..=pos)
            .rev()
            .find(|at| *at == elements.len() || elements[*at] & 0xc0 != 0x80)
            .unwrap_or(0),
    }
}

fn units(kind: TreeKind, elements: &[u32]) -> u64 {
    match kind {
        TreeKind::Tokens => elements.len() as u64,
        TreeKind::Text => elements.iter().filter(|b| *b & 0xc0 != 0x80).count() as u64,
    }
}

fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A prefix one worker holds in one namespace: (namespace index, worker, elements).
type HeldPrefix = (usize, u16, Vec<u32>);

/// (kind, namespace index, worker) → held keys (stored elements) → tick.
#[derive(Default, Debug)]
struct Model {
    held: HashMap<(TreeKind, usize, u16), BTreeMap<Vec<u32>, u64>>,
}

impl Model {
    fn insert(&mut self, kind: TreeKind, ns: usize, worker: u16, key: &[u32], tick: u64) {
        let key = stored(kind, key);
        if !key.is_empty() {
            self.held
                .entry((kind, ns, worker))
                .or_default()
                .insert(key, tick);
        }
    }

    fn lookup(&self, kind: TreeKind, ns: usize, query: &[u32]) -> (u64, u64, BTreeSet<u16>) {
        // The request length counts every token, the match only whole pages.
        let request = query.len() as u64;
        let query = stored(kind, query);
        let mut best = 0;
        let mut holders = BTreeSet::new();
        for ((k, n, worker), keys) in &self.held {
            if *k != kind || *n != ns {
                continue;
            }
            for key in keys.keys() {
                let matched = floor(kind, &query, common(key, &query));
                if matched > best {
                    best = matched;
                    holders.clear();
                }
                if matched == best && matched > 0 {
                    holders.insert(*worker);
                }
            }
        }
        let request = if kind == TreeKind::Tokens {
            request
        } else {
            units(kind, &query)
        };
        (units(kind, &query[..best]), request, holders)
    }

    /// Units per (kind, model), counted once per holding worker: distinct held unit prefixes.
    fn sizes(&self) -> BTreeMap<(TreeKind, u64), (u64, u64)> {
        let mut prefixes: HashMap<(TreeKind, u64), BTreeSet<HeldPrefix>> = HashMap::new();
        let mut workers: HashMap<(TreeKind, u64), BTreeSet<u16>> = HashMap::new();
        for ((kind, ns, worker), keys) in &self.held {
            let model = NAMESPACES[*ns].model;
            for key in keys.keys() {
                workers.entry((*kind, model)).or_default().insert(*worker);
                for end in 1..=key.len() {
                    if floor(*kind, key, end) == end {
                        prefixes.entry((*kind, model)).or_default().insert((
                            *ns,
                            *worker,
                            key[..end].to_vec(),
                        ));
                    }
                }
            }
        }
        prefixes
            .into_iter()
            .map(|(at, set)| {
                // Each distinct prefix adds one unit: a character, or a page of tokens.
                let unit = if at.0 == TreeKind::Tokens {
                    BLOCK_SIZE as u64
                } else {
                    1
                };
                (
                    at,
                    (
                        set.len() as u64 * unit,
                        workers.get(&at).map_or(0, |w| w.len() as u64),
                    ),
                )
            })
            .filter(|(_, (units, _))| *units > 0)
            .collect()
    }

    fn model_units(&self, kind: TreeKind, model: u64) -> u64 {
        self.sizes()
            .get(&(kind, model))
            .map_or(0, |(units, _)| *units)
    }

    /// Applies one eviction report, checking it removed a leaf the worker really held.
    fn evicted(&mut self, report: &Evicted) -> Result<(), TestCaseError> {
        let ns = NAMESPACES
            .iter()
            .position(|n| *n == report.namespace)
            .expect("known namespace");
        let at = (report.kind, ns, report.worker.0);
        let keys = self
            .held
            .get_mut(&at)
            .ok_or_else(|| TestCaseError::fail("evicted from a worker holding nothing"))?;
        // A token report names pages by their hashes: the held key they are a prefix of gives
        // its elements.
        let (key, kept_len) = match report.kind {
            TreeKind::Text => {
                let bytes = report.key.iter().map(|byte| *byte as u32).collect();
                (bytes, report.kept_len)
            }
            TreeKind::Tokens => {
                let held = keys
                    .keys()
                    .find(|held| pages(held).pages().starts_with(&report.key))
                    .ok_or_else(|| {
                        TestCaseError::fail(format!("evicted pages no held key has: {report:?}"))
                    })?;
                let elements = held[..report.key.len() * BLOCK_SIZE].to_vec();
                (elements, report.kept_len * BLOCK_SIZE)
            }
        };
        let key: &Vec<u32> = &key;
        prop_assert!(kept_len < key.len());
        let whole = keys.keys().any(|held| held.starts_with(key));
        prop_assert!(whole, "the worker held the whole evicted node: {report:?}");
        let touching: Vec<Vec<u32>> = keys
            .keys()
            .filter(|held| floor(report.kind, held, common(held, key)) > kept_len)
            .cloned()
            .collect();
        for held in &touching {
            prop_assert!(
                key.starts_with(held),
                "evicted a node that was not a leaf for its worker: {report:?}"
            );
            let tick = keys.remove(held).unwrap_or_default();
            if kept_len > 0 {
                let kept = keys.entry(key[..kept_len].to_vec()).or_default();
                *kept = (*kept).max(tick);
            }
        }
        Ok(())
    }
}

fn kind_strategy() -> impl Strategy<Value = TreeKind> {
    prop_oneof![Just(TreeKind::Text), Just(TreeKind::Tokens)]
}

fn key_strategy() -> BoxedStrategy<Vec<u32>> {
    prop::collection::vec(0u32..3, 0..10).boxed()
}

/// Elements of the long keys' shared bases.
const LONG_BASE_LEN: usize = 160;

/// One of three fixed sequences the long keys start with.
fn long_base(base: usize) -> Vec<u32> {
    (0..LONG_BASE_LEN)
        .map(|i| ((i * 7 + base * 13) ^ (i >> 3)) as u32 % 3)
        .collect()
}

/// Keys sharing long prefixes: a base cut anywhere plus a short tail of their own. Splits then
/// leave long edges on both sides, and one-child chains of long edges stay unmerged (the index
/// merges them only when short, or when their labels adjoin in one buffer).
fn long_key_strategy() -> BoxedStrategy<Vec<u32>> {
    (
        0..3usize,
        0..=LONG_BASE_LEN,
        prop::collection::vec(0u32..3, 0..4),
    )
        .prop_map(|(base, len, tail)| {
            let mut key = long_base(base);
            key.truncate(len);
            key.extend(tail);
            key
        })
        .boxed()
}

fn hint_strategy() -> impl Strategy<Value = HintFrom> {
    prop_oneof![
        2 => Just(HintFrom::Nothing),
        3 => Just(HintFrom::Fresh),
        3 => Just(HintFrom::Earlier),
        1 => Just(HintFrom::OtherNamespace),
        1 => Just(HintFrom::OtherKind),
    ]
}

/// Operations over keys from `keys`, with eviction budgets below `budget_max` units.
fn op_strategy(
    keys: fn() -> BoxedStrategy<Vec<u32>>,
    budget_max: u64,
) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (kind_strategy(), 0..NAMESPACES.len(), 0..WORKERS, keys(), hint_strategy(),
            any::<bool>())
            .prop_map(|(kind, ns, worker, key, hint, shared)| {
                Op::Insert { kind, ns, worker, key, hint, shared }
            }),
        3 => (kind_strategy(), 0..NAMESPACES.len(), keys())
            .prop_map(|(kind, ns, query)| Op::Lookup { kind, ns, query }),
        1 => (0..WORKERS).prop_map(|worker| Op::RemoveWorker { worker }),
        1 => (0..budget_max).prop_map(|budget| Op::Evict { budget }),
    ]
}

/// Hints of earlier lookups, per (kind, key), oldest first.
type HintBank = HashMap<(TreeKind, Vec<u32>), Vec<LookupHint>>;

/// A reader's lookup of `key` (as a data core does), keeping its hint in `bank`.
fn lookup_hint(
    reader: &mut IndexReader,
    bank: &mut HintBank,
    kind: TreeKind,
    ns: usize,
    key: &[u32],
) -> LookupHint {
    let (_, hint) = match kind {
        TreeKind::Text => reader.lookup_text_hinted(NAMESPACES[ns], &text_of(key)),
        TreeKind::Tokens => reader.lookup_tokens_hinted(NAMESPACES[ns], &pages(key)),
    };
    reader.quiesce();
    bank.entry((kind, key.to_vec())).or_default().push(hint);
    hint
}

/// The hint an insert of `key` carries.
fn hint_for(
    reader: &mut IndexReader,
    bank: &mut HintBank,
    from: HintFrom,
    kind: TreeKind,
    ns: usize,
    key: &[u32],
) -> LookupHint {
    let other_kind = match kind {
        TreeKind::Text => TreeKind::Tokens,
        TreeKind::Tokens => TreeKind::Text,
    };
    match from {
        HintFrom::Nothing => LookupHint::default(),
        HintFrom::Fresh => lookup_hint(reader, bank, kind, ns, key),
        HintFrom::Earlier => bank
            .get(&(kind, key.to_vec()))
            .and_then(|hints| hints.first().copied())
            .unwrap_or_default(),
        HintFrom::OtherNamespace => {
            lookup_hint(reader, bank, kind, (ns + 1) % NAMESPACES.len(), key)
        }
        HintFrom::OtherKind => lookup_hint(reader, bank, other_kind, ns, key),
    }
}

fn lookup(index: &IndexWriter, kind: TreeKind, ns: usize, key: &[u32]) -> TreeMatch {
    match kind {
        TreeKind::Text => index.lookup_text(NAMESPACES[ns], &text_of(key)),
        TreeKind::Tokens => index.lookup_tokens(NAMESPACES[ns], &pages(key)),
    }
}

fn check_lookup(
    index: &IndexWriter,
    model: &Model,
    kind: TreeKind,
    ns: usize,
    key: &[u32],
) -> Result<(), TestCaseError> {
    let found = lookup(index, kind, ns, key);
    let (matched, request, holders) = model.lookup(kind, ns, key);
    let tenants: BTreeSet<u16> = found.tenants().iter().map(|w| w.0).collect();
    prop_assert_eq!(
        u64::from(found.matched_len),
        matched,
        "matched {:?} {} {:?}",
        kind,
        ns,
        key
    );
    prop_assert_eq!(u64::from(found.request_len), request);
    prop_assert_eq!(tenants.len(), found.tenants().len(), "tenants are distinct");
    prop_assert_eq!(tenants, holders, "tenants {:?} {} {:?}", kind, ns, key);
    Ok(())
}

fn check_all(index: &IndexWriter, model: &Model) -> Result<(), TestCaseError> {
    for ((kind, ns, _), keys) in &model.held {
        for key in keys.keys() {
            let query: Vec<u32> = match kind {
                TreeKind::Tokens => key.clone(),
                TreeKind::Text => {
                    let text =
                        String::from_utf8(key.iter().map(|b| *b as u8).collect()).expect("utf8");
                    text.chars()
                        .map(|c| ALPHABET.iter().position(|a| *a == c).unwrap_or(0) as u32)
                        .collect()
                }
            };
            check_lookup(index, model, *kind, *ns, &query)?;
        }
    }
    let sizes = model.sizes();
    for gauges in index.gauges() {
        for (kind, tree) in [
            (TreeKind::Text, gauges.string),
            (TreeKind::Tokens, gauges.token),
        ] {
            let (units, tenants) = sizes.get(&(kind, gauges.model)).copied().unwrap_or((0, 0));
            prop_assert_eq!(
                (tree.units, tree.tenants),
                (units, tenants),
                "gauges of {:?} {}",
                kind,
                gauges.model
            );
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut index = IndexWriter::new(IndexConfig {
        block_size: BLOCK_SIZE as u32,
    })
    .expect("index");
    let mut model = Model::default();
    let mut reader = index.reader().expect("reader");
    let mut bank = HintBank::new();
    for (tick, op) in ops.into_iter().enumerate() {
        let tick = tick as u64 + 1;
        match op {
            Op::Insert {
                kind,
                ns,
                worker,
                key,
                hint,
                shared,
            } => {
                let hint = hint_for(&mut reader, &mut bank, hint, kind, ns, &key);
                let (namespace, worker_id) = (NAMESPACES[ns], WorkerId(worker));
                let result = match (kind, shared) {
                    (TreeKind::Text, false) => {
                        let text = text_of(&key);
                        index.insert_text_hinted(namespace, &text, worker_id, tick, &hint)
                    }
                    (TreeKind::Text, true) => {
                        let text: Arc<str> = Arc::from(text_of(&key));
                        index.insert_text_shared(namespace, &text, worker_id, tick, &hint)
                    }
                    (TreeKind::Tokens, false) => {
                        index.insert_tokens_hinted(namespace, &pages(&key), worker_id, tick, &hint)
                    }
                    (TreeKind::Tokens, true) => {
                        let tokens = token_key(&pages(&key));
                        index.insert_tokens_shared(namespace, &tokens, worker_id, tick, &hint)
                    }
                };
                prop_assert!(result.is_ok());
                model.insert(kind, ns, worker, &key, tick);
            }
            Op::Lookup { kind, ns, query } => {
                lookup_hint(&mut reader, &mut bank, kind, ns, &query);
                check_lookup(&index, &model, kind, ns, &query)?
            }
            Op::RemoveWorker { worker } => {
                index.remove_worker(WorkerId(worker));
                model.held.retain(|(_, _, w), _| *w != worker);
            }
            Op::Evict { budget } => evict(&mut index, &mut model, budget)?,
        }
        check_all(&index, &model)?;
    }
    Ok(())
}

fn evict(index: &mut IndexWriter, model: &mut Model, budget: u64) -> Result<(), TestCaseError> {
    let mut failure = None;
    let mut report = |evicted: Evicted| {
        if failure.is_some() {
            return;
        }
        let before = model.model_units(evicted.kind, evicted.namespace.model);
        if before <= budget {
            failure = Some(TestCaseError::fail(format!(
                "evicted within budget: {evicted:?}"
            )));
        } else if let Err(error) = model.evicted(&evicted) {
            failure = Some(error);
        }
    };
    let mut observer: Option<&mut dyn FnMut(Evicted)> = Some(&mut report);
    index.evict_observed(budget, &mut observer);
    if let Some(error) = failure {
        return Err(error);
    }
    for ((_, model_id), (units, _)) in model.sizes() {
        prop_assert!(units <= budget, "model {} still over budget", model_id);
    }
    Ok(())
}

proptest! {
    // 48 cases keep the normal pass fast; PROPTEST_CASES=5000 for a long run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn index_matches_the_reference_model(
        ops in prop::collection::vec(op_strategy(key_strategy, 40), 1..60)
    ) {
        run(ops)?;
    }
}

proptest! {
    // Longer keys cost more per case: half as many.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]

    #[test]
    fn index_matches_the_reference_model_with_long_shared_prefixes(
        ops in prop::collection::vec(op_strategy(long_key_strategy, 800), 1..60)
    ) {
        run(ops)?;
    }
}

#[test]
fn splits_merges_and_eviction_on_a_fixed_sequence() {
    let a = vec![0, 0, 1, 1, 2, 2];
    let ops = vec![
        Op::Insert {
            kind: TreeKind::Text,
            ns: 0,
            worker: 1,
            key: a.clone(),
            hint: HintFrom::Nothing,
            shared: false,
        },
        Op::Insert {
            kind: TreeKind::Text,
            ns: 0,
            worker: 2,
            key: a[..3].to_vec(),
            hint: HintFrom::Fresh,
            shared: true,
        },
        Op::Insert {
            kind: TreeKind::Text,
            ns: 0,
            worker: 3,
            key: vec![0, 0, 2],
            hint: HintFrom::Fresh,
            shared: false,
        },
        Op::Insert {
            kind: TreeKind::Tokens,
            ns: 1,
            worker: 1,
            key: a.clone(),
            hint: HintFrom::Nothing,
            shared: true,
        },
        Op::Insert {
            kind: TreeKind::Tokens,
            ns: 2,
            worker: 4,
            key: a.clone(),
            hint: HintFrom::OtherNamespace,
            shared: false,
        },
        Op::Evict { budget: 5 },
        Op::RemoveWorker { worker: 2 },
        Op::Lookup {
            kind: TreeKind::Text,
            ns: 0,
            query: a.clone(),
        },
        Op::Evict { budget: 0 },
    ];
    run(ops).expect("fixed sequence");
}
