use proptest::prelude::*;

use super::*;

/// Payloads msgspec 0.23 encoded from the engines' struct layouts (`KVEventBatch` and its
/// events), printed as hex: vLLM's array-like layout, vLLM's current map layout with sha256-sized
/// byte hashes and newer fields, and SGLang's layout.
const VLLM_ARRAY: &str = "93cb3ff80000000000009497ab426c6f636b53746f72656492fbcf8000000000000007c098010203040506070804c0a347505597ab426c6f636b53746f726564910bcf800000000000000794ce0001117005cd012cceffffffff04c0a343505593ac426c6f636b52656d6f76656491fba347505591b0416c6c426c6f636b73436c656172656400";
const VLLM_MAP: &str = "83a27473cb4002000000000000a66576656e74739489a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c4200101010101010101010101010101010101010101010101010101010101010101c4200202020202020202020202020202020202020202020202020202020202020202b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473980102030405060708aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c092a26d6d0389a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c4200303030303030303030303030303030303030303030303030303030303030303b1706172656e745f626c6f636b5f68617368c4200202020202020202020202020202020202020202020202020202020202020202a9746f6b656e5f69647394090a0b0caa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f6964780183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c4200101010101010101010101010101010101010101010101010101010101010101a66d656469756dc081a474797065b0416c6c426c6f636b73436c6561726564b2646174615f706172616c6c656c5f72616e6b03";
const SGLANG: &str = "92cb40080000000000009296ab426c6f636b53746f72656491cf0000001cbe991a14d0d692010202c092ac426c6f636b52656d6f76656492cf0000001cbe991a14d0d6";

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("test hex"))
        .collect()
}

fn decoded(payload: &[u8]) -> EventBatch {
    let mut batch = EventBatch::default();
    batch.decode(payload).expect("a valid batch");
    batch
}

#[test]
fn vllm_array_layout_decodes_with_signed_and_unsigned_hashes() {
    let batch = decoded(&unhex(VLLM_ARRAY));
    let events = batch.events();
    // The second BlockStored is on the CPU tier: skipped, counted.
    assert_eq!(batch.skipped(), 1);
    assert_eq!(events.len(), 3);
    let KvEvent::Stored {
        hashes,
        parent,
        tokens,
        block_size,
        salts,
    } = &events[0]
    else {
        panic!("first event is BlockStored: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[(-5i64) as u64, (1u64 << 63) + 7]);
    assert_eq!(*parent, None);
    assert_eq!(batch.tokens(tokens), &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(*block_size, 4);
    assert!(batch.salts(salts).is_empty(), "no LoRA, no extra keys");
    let KvEvent::Removed { hashes } = &events[1] else {
        panic!("second kept event is BlockRemoved: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[(-5i64) as u64]);
    assert_eq!(events[2], KvEvent::Cleared);
}

#[test]
fn vllm_map_layout_decodes_with_byte_hashes_and_skips_other_groups() {
    let batch = decoded(&unhex(VLLM_MAP));
    let events = batch.events();
    // The group_idx=1 BlockStored belongs to another KV-cache group.
    assert_eq!(batch.skipped(), 1);
    assert_eq!(events.len(), 3);
    let (one, two) = (bytes_hash(&[1; 32]), bytes_hash(&[2; 32]));
    let KvEvent::Stored {
        hashes,
        parent,
        tokens,
        block_size,
        salts,
    } = &events[0]
    else {
        panic!("first event is BlockStored: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[one, two]);
    assert_eq!((*parent, *block_size), (None, 4));
    assert_eq!(batch.tokens(tokens), &[1, 2, 3, 4, 5, 6, 7, 8]);
    // extra_keys [nil, ["mm", 3]]: the second block's hash folds a multimodal input.
    let salts = batch.salts(salts);
    assert_eq!(salts.len(), 2);
    assert!(salts[0] == 0 && salts[1] != 0, "{salts:?}");
    let KvEvent::Removed { hashes } = &events[1] else {
        panic!("second kept event is BlockRemoved: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[one]);
    assert_eq!(events[2], KvEvent::Cleared);
}

#[test]
fn sglang_layout_decodes_with_a_signed_parent() {
    let batch = decoded(&unhex(SGLANG));
    let events = batch.events();
    assert_eq!(batch.skipped(), 0);
    let KvEvent::Stored {
        hashes,
        parent,
        tokens,
        block_size,
        salts,
    } = &events[0]
    else {
        panic!("first event is BlockStored: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[123_456_789_012]);
    assert_eq!(*parent, Some((-42i64) as u64));
    assert_eq!((batch.tokens(tokens), *block_size), (&[1, 2][..], 2));
    assert!(batch.salts(salts).is_empty());
    let KvEvent::Removed { hashes } = &events[1] else {
        panic!("second event is BlockRemoved: {events:?}");
    };
    assert_eq!(batch.hashes(hashes), &[123_456_789_012, (-42i64) as u64]);
}

#[test]
fn a_token_id_past_u32_is_a_malformed_batch() {
    let mut payload = unhex(SGLANG);
    // token_ids [1, 2] -> [1, 2^32] (uint64), then fix nothing else: the shape stays 2 tokens.
    let at = payload
        .windows(3)
        .position(|w| w == [0x92, 0x01, 0x02])
        .expect("the token array");
    payload.splice(at + 2..at + 3, [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
    let mut batch = EventBatch::default();
    assert_eq!(batch.decode(&payload), Err(WireError::TokenId));
    assert!(batch.events().is_empty());
}

#[test]
fn an_event_whose_tokens_do_not_fill_its_blocks_is_left_out_and_the_rest_applies() {
    let mut payload = unhex(SGLANG);
    // block_size 2 -> 3: two tokens cannot be one block of three (as vLLM's null blocks leave
    // tokens without hashes).
    let at = payload
        .windows(4)
        .position(|w| w == [0x92, 0x01, 0x02, 0x02])
        .expect("token array then block size");
    payload[at + 3] = 3;
    let batch = decoded(&payload);
    assert_eq!((batch.misshapen(), batch.skipped()), (1, 0));
    // The BlockRemoved beside it is kept.
    let [KvEvent::Removed { hashes }] = batch.events() else {
        panic!("only the removal: {:?}", batch.events());
    };
    assert_eq!(batch.hashes(hashes).len(), 2);
}

/// `[ts, [event]]`, the event a vLLM `BlockStored` map of two blocks with `lora_name` and
/// `extra_keys` as given (msgpack bytes of each value).
fn vllm_stored(lora_name: &[u8], extra_keys: &[u8]) -> Vec<u8> {
    let mut out = vec![0x92, 0x00, 0x91, 0x86];
    let mut field = |key: &str, value: &[u8]| {
        out.push(0xa0 | key.len() as u8);
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(value);
    };
    field("type", b"\xabBlockStored");
    field("block_hashes", &[0x92, 0x01, 0x02]);
    field("token_ids", &[0x94, 0x01, 0x02, 0x03, 0x04]);
    field("block_size", &[0x02]);
    field("lora_name", lora_name);
    field("extra_keys", extra_keys);
    out
}

#[test]
fn a_lora_or_extra_keys_salt_the_blocks_they_cover() {
    let salts_of = |payload: &[u8]| {
        let batch = decoded(payload);
        let [KvEvent::Stored { salts, .. }] = batch.events() else {
            panic!("one BlockStored: {:?}", batch.events());
        };
        batch.salts(salts).to_vec()
    };
    // Neither: no salts.
    assert!(salts_of(&vllm_stored(&[0xc0], &[0xc0])).is_empty());
    // A LoRA: every block.
    let lora = salts_of(&vllm_stored(b"\xa5sql-a", &[0xc0]));
    assert!(lora.len() == 2 && lora.iter().all(|s| *s != 0), "{lora:?}");
    assert_ne!(lora, salts_of(&vllm_stored(b"\xa5sql-b", &[0xc0])));
    // A cache_salt on the first block only.
    let salted = salts_of(&vllm_stored(&[0xc0], b"\x92\x91\xa4salt\xc0"));
    assert!(salted[0] != 0 && salted[1] == 0, "{salted:?}");
    // Extra keys not one per block: the event cannot be placed.
    let mut batch = EventBatch::default();
    batch.decode(&vllm_stored(&[0xc0], b"\x91\xc0")).unwrap();
    assert_eq!((batch.events().len(), batch.misshapen()), (0, 1));
}

#[test]
fn every_truncation_of_a_valid_batch_is_an_error_and_leaves_it_empty() {
    for golden in [VLLM_ARRAY, VLLM_MAP, SGLANG] {
        let payload = unhex(golden);
        let mut batch = EventBatch::default();
        for len in 0..payload.len() {
            assert!(
                batch.decode(&payload[..len]).is_err(),
                "{len} bytes decoded"
            );
            assert!(batch.events().is_empty() && batch.skipped() == 0);
        }
        assert!(batch.decode(&payload).is_ok());
    }
}

#[test]
fn a_batch_without_events_or_of_another_type_is_refused() {
    let mut batch = EventBatch::default();
    // {"ts": 1}
    assert_eq!(
        batch.decode(&[0x81, 0xa2, b't', b's', 0x01]),
        Err(WireError::Missing("events"))
    );
    // A bare integer.
    assert_eq!(batch.decode(&[0x07]), Err(WireError::Unexpected("batch")));
    // [ts, [["BlockStored"]]]: no fields.
    let mut stored = vec![0x92, 0x00, 0x91, 0x91, 0xab];
    stored.extend_from_slice(b"BlockStored");
    assert_eq!(
        batch.decode(&stored),
        Err(WireError::Missing("block_hashes"))
    );
}

#[test]
fn unknown_event_types_are_skipped_and_deep_nesting_refused() {
    let mut batch = EventBatch::default();
    // [ts, [["Future", {..}]]]
    let mut payload = vec![0x92, 0x00, 0x91, 0x92, 0xa6];
    payload.extend_from_slice(b"Future");
    payload.extend_from_slice(&[0x81, 0xa1, b'k', 0x91, 0x01]);
    batch
        .decode(&payload)
        .expect("unknown types are not errors");
    assert_eq!((batch.events().len(), batch.skipped()), (0, 1));
    // The same event whose unknown field nests 40 arrays deep.
    let mut deep = vec![0x92, 0x00, 0x91, 0x92, 0xa6];
    deep.extend_from_slice(b"Future");
    deep.extend(std::iter::repeat_n(0x91, 40));
    deep.push(0x01);
    assert_eq!(batch.decode(&deep), Err(WireError::TooDeep));
}

#[test]
fn buffers_grown_by_a_huge_batch_are_given_back() {
    // [ts, [["BlockStored", [1..=n], nil, tokens, 16]]]: 200k blocks of 16 token ids.
    let blocks = 200_000u32;
    let mut payload = vec![0x92, 0x00, 0x91, 0x95, 0xab];
    payload.extend_from_slice(b"BlockStored");
    payload.push(0xdd);
    payload.extend_from_slice(&blocks.to_be_bytes());
    for h in 1..=blocks {
        payload.push(0xce);
        payload.extend_from_slice(&h.to_be_bytes());
    }
    payload.push(0xc0);
    payload.push(0xdd);
    payload.extend_from_slice(&(blocks * 16).to_be_bytes());
    payload.extend(std::iter::repeat_n(0x07, (blocks * 16) as usize));
    payload.push(0x10);
    let mut batch = decoded(&payload);
    assert_eq!(batch.events().len(), 1);
    assert!(batch.capacity_bytes() > 8 << 20);
    batch.shrink_to(1 << 20);
    assert!(
        batch.capacity_bytes() <= 4 << 20,
        "{}",
        batch.capacity_bytes()
    );
    // Still a working batch.
    batch.decode(&unhex(SGLANG)).unwrap();
    assert_eq!(batch.events().len(), 2);
}

#[test]
fn frames_give_the_sequence_number_and_payload() {
    let seq = 258u64.to_be_bytes();
    let frames: [&[u8]; 3] = [b"", &seq, b"\x90"];
    assert_eq!(message_parts(&frames), Ok((258, &b"\x90"[..])));
    assert!(message_parts(&frames[..2]).is_err());
    let short: [&[u8]; 3] = [b"", &seq[..7], b"\x90"];
    assert!(message_parts(&short).is_err());
}

proptest! {
    /// Arbitrary bytes never panic, and an error leaves the batch empty.
    #[test]
    fn arbitrary_payloads_decode_or_fail_cleanly(payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut batch = EventBatch::default();
        if batch.decode(&payload).is_err() {
            prop_assert!(batch.events().is_empty());
        }
    }

    /// Flipping one byte of a real batch never panics either.
    #[test]
    fn corrupted_batches_decode_or_fail_cleanly(at in 0usize..300, byte in any::<u8>()) {
        let mut payload = unhex(VLLM_MAP);
        let at = at % payload.len();
        payload[at] = byte;
        let mut batch = EventBatch::default();
        let _ = batch.decode(&payload);
        for event in batch.events() {
            if let KvEvent::Stored { hashes, tokens, block_size, .. } = event {
                prop_assert_eq!(tokens.len(), hashes.len() * *block_size as usize);
            }
        }
    }
}
