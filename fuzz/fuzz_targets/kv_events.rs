//! The KV-event decoder (`kvgate::kv_events::wire`): a published message's frames
//! (`message_parts`) and its msgpack `KVEventBatch` payload, in SGLang's and vLLM's layouts
//! (`EventBatch::decode`).
//!
//! Checked beyond "no panic": every event's ranges lie inside the batch's buffers, in order and
//! without overlap; a stored event holds `block_size` (non-zero) tokens per block; the decoder
//! never yields more hashes, tokens or events than the payload has bytes (each is at least one);
//! a refused payload leaves an empty batch; and a batch reused from the previous input decodes
//! exactly what a fresh one does.
#![no_main]

use std::cell::RefCell;
use std::ops::Range;

use kvgate::kv_events::{message_parts, EventBatch, KvEvent, WireError};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static REUSED: RefCell<EventBatch> = RefCell::new(EventBatch::default());
}

/// A batch as plain values, for comparing two decodes.
#[derive(Debug, PartialEq)]
struct Decoded {
    result: Result<(), WireError>,
    events: Vec<(KvEvent, Vec<u64>, Vec<u32>)>,
    skipped: u32,
}

fn follows(previous: &mut usize, range: &Range<usize>) {
    assert!(range.start <= range.end, "reversed range {range:?}");
    assert!(
        range.start >= *previous,
        "range {range:?} overlaps the previous event's"
    );
    *previous = range.end;
}

fn decode(batch: &mut EventBatch, payload: &[u8]) -> Decoded {
    let result = batch.decode(payload);
    if result.is_err() {
        assert!(
            batch.events().is_empty() && batch.skipped() == 0,
            "a refused batch kept events"
        );
    }
    let (mut hashes_end, mut tokens_end) = (0, 0);
    let (mut hashes_total, mut tokens_total) = (0, 0);
    let mut events = Vec::new();
    for event in batch.events() {
        let (hashes, tokens) = match event {
            KvEvent::Stored {
                hashes,
                tokens,
                block_size,
                salts,
                ..
            } => {
                follows(&mut hashes_end, hashes);
                follows(&mut tokens_end, tokens);
                let (h, t) = (batch.hashes(hashes), batch.tokens(tokens));
                assert!(*block_size > 0 && t.len() == h.len() * *block_size as usize);
                // Salts are one per block, or none.
                let salts = batch.salts(salts);
                assert!(salts.is_empty() || salts.len() == h.len(), "salts of other shape");
                (h.to_vec(), t.to_vec())
            }
            KvEvent::Removed { hashes } => {
                follows(&mut hashes_end, hashes);
                (batch.hashes(hashes).to_vec(), Vec::new())
            }
            KvEvent::Cleared => (Vec::new(), Vec::new()),
        };
        hashes_total += hashes.len();
        tokens_total += tokens.len();
        events.push((event.clone(), hashes, tokens));
    }
    assert!(
        hashes_total + tokens_total <= payload.len(),
        "more values than bytes"
    );
    assert!(
        events.len() + batch.skipped() as usize <= payload.len(),
        "more events than bytes"
    );
    Decoded {
        result,
        events,
        skipped: batch.skipped(),
    }
}

fuzz_target!(|data: &[u8]| {
    let fresh = decode(&mut EventBatch::default(), data);
    let reused = REUSED.with(|batch| decode(&mut batch.borrow_mut(), data));
    assert_eq!(fresh, reused, "a reused batch differs from a fresh one");
    // The frames: the first 8 bytes (or fewer) as the sequence number, the rest as the payload.
    let (seq, payload) = data.split_at(data.len().min(8));
    match message_parts(&[b"kv-events", seq, payload]) {
        Ok((n, p)) => {
            assert_eq!(seq.len(), 8);
            assert_eq!(n.to_be_bytes(), seq);
            assert_eq!(p, payload);
        }
        Err(_) => assert!(seq.len() < 8),
    }
    assert!(message_parts(&[seq, payload]).is_err());
});
