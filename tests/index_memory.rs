//! Memory stays bounded under churn: after inserting ten times the budget (evicting on a
//! schedule, purging a worker now and then, a reader quiescing like a data core), both trees are
//! within budget and the bytes the allocator holds for the index stay below a stated bound, and
//! do not grow from the second half of the churn to the end (no leak of nodes, labels, tables or
//! entries). Live bytes are counted by a counting global allocator in this test binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use kvgate::ids::WorkerId;
use kvgate::index::{token_key, IndexConfig, IndexWriter, LookupHint, Namespace, TokenPages};

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// Allocations made by this thread (const-initialized: reading it never allocates).
    static THREAD_ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        THREAD_ALLOCS.with(|count| count.set(count.get() + 1));
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        THREAD_ALLOCS.with(|count| count.set(count.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Budget per model and tree kind (tokens, characters).
const BUDGET: u64 = 200_000;
/// Fixed cost of an index regardless of content: two slab segment tables (512 KiB each), the
/// first 1 MiB segment of each slab, reader slots, worker list heads (3 MiB + small change).
const FIXED_BYTES_MAX: i64 = (7 << 20) / 2;
/// Bytes per budget unit allowed on top, for both trees together (the 16 bytes per
/// indexed token): nodes, labels (4 bytes per token, 1 per ASCII character), tables, entries,
/// per-node metadata, and label buffers longer than their labels (shared by split halves, or a
/// record's key buffer kept by a new leaf: at most 4x the label).
const BYTES_PER_UNIT_MAX: i64 = 16;

fn live() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

#[test]
fn churn_of_ten_budgets_stays_within_budget_and_memory_bound() {
    let before = live();
    let mut index = IndexWriter::new(IndexConfig { block_size: 16 }).expect("index");
    let mut reader = index.reader().expect("reader");
    let mut rng = fastrand::Rng::with_seed(11);
    let systems: Vec<Vec<u32>> = (0..8)
        .map(|_| (0..512).map(|_| rng.u32(..1000)).collect())
        .collect();
    let ns = [
        Namespace {
            model: 1,
            partition: 0,
        },
        Namespace {
            model: 1,
            partition: 5,
        },
    ];
    let (mut inserted, mut steps, mut halfway) = (0u64, 0u64, None);
    while inserted < 10 * BUDGET {
        let mut prompt = systems[rng.usize(..systems.len())].clone();
        prompt.extend((0..rng.usize(0..1536)).map(|_| rng.u32(..1000)));
        let text: String = prompt
            .iter()
            .map(|t| char::from(b'a' + (t % 26) as u8))
            .collect();
        let worker = WorkerId(rng.u16(..16));
        steps += 1;
        let at = ns[rng.usize(..ns.len())];
        if steps % 2 == 0 {
            // The control core's inserts: the record's key buffers, which new leaves may keep
            // (the record is dropped right after).
            let (tokens, text): (_, Arc<str>) =
                (token_key(&TokenPages::of(&prompt, 16)), Arc::from(text));
            let none = LookupHint::default();
            index
                .insert_tokens_shared(at, &tokens, worker, steps, &none)
                .expect("insert tokens");
            index
                .insert_text_shared(at, &text, worker, steps, &none)
                .expect("insert text");
        } else {
            index
                .insert_tokens(at, &prompt, worker, steps)
                .expect("insert tokens");
            index
                .insert_text(at, &text, worker, steps)
                .expect("insert text");
        }
        inserted += prompt.len() as u64;
        if steps % 20 == 0 {
            index.evict(BUDGET);
            reader.quiesce();
            index.reclaim();
            assert!(
                reader
                    .lookup_tokens(at, &TokenPages::of(&prompt, 16))
                    .matched_len
                    > 0,
                "the last prompt matches"
            );
        }
        if steps % 500 == 0 {
            index.remove_worker(WorkerId(rng.u16(..16)));
        }
        if halfway.is_none() && inserted >= 5 * BUDGET {
            halfway = Some(live() - before);
        }
    }
    index.evict(BUDGET);
    reader.quiesce();
    index.reclaim();
    for gauges in index.gauges() {
        assert!(gauges.token.units <= BUDGET, "{gauges:?}");
        assert!(gauges.string.units <= BUDGET, "{gauges:?}");
        assert!(
            gauges.token.units > BUDGET / 2,
            "eviction stops near the budget: {gauges:?}"
        );
    }
    assert_eq!(index.pending_reclaim(), 0);
    let used = live() - before;
    let bound = FIXED_BYTES_MAX + BYTES_PER_UNIT_MAX * BUDGET as i64;
    eprintln!(
        "live {used} bytes after churn (halfway {halfway:?}), bound {bound}, arenas {:?}",
        index.memory()
    );
    assert!(used <= bound, "live bytes {used} over the bound {bound}");
    let halfway = halfway.unwrap_or(used);
    assert!(
        used <= halfway + halfway / 4,
        "memory grows with churn: {halfway} → {used}"
    );
    drop(reader);
    drop(index);
    assert!(
        live() - before < 64 << 10,
        "dropping the index frees it: {} left",
        live() - before
    );
}

#[test]
fn lookups_and_quiesce_do_not_allocate() {
    let mut index = IndexWriter::new(IndexConfig { block_size: 4 }).expect("index");
    let ns = Namespace {
        model: 3,
        partition: 1,
    };
    let tokens: Vec<u32> = (0..4096).collect();
    let text: String = "pré-fixe partagé ".repeat(200);
    for worker in 0..12u16 {
        let cut = 1024 + usize::from(worker) * 64;
        index
            .insert_tokens(ns, &tokens[..cut], WorkerId(worker), u64::from(worker))
            .expect("tokens");
        let end = (0..=cut)
            .rev()
            .find(|at| text.is_char_boundary(*at))
            .unwrap_or(0);
        index
            .insert_text(ns, &text[..end], WorkerId(worker), 1)
            .expect("text");
    }
    let mut reader = index.reader().expect("reader");
    // A data core hashes each request's pages into one buffer it reuses.
    let mut pages = TokenPages::of(&tokens, 4);
    let before = THREAD_ALLOCS.with(Cell::get);
    let mut matched = 0u64;
    for round in 0..100 {
        pages.hash(&tokens[..tokens.len() - round], 4);
        matched += u64::from(reader.lookup_tokens(ns, &pages).matched_len);
        matched += u64::from(reader.lookup_text(ns, &text).matched_len);
        matched += u64::from(reader.lookup_text(Namespace::default(), &text).matched_len);
        reader.quiesce();
    }
    let allocs = THREAD_ALLOCS.with(Cell::get) - before;
    assert!(matched > 0, "lookups matched");
    assert_eq!(allocs, 0, "a lookup allocates nothing");
}
