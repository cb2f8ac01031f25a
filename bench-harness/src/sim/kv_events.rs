//! The KV-event wire formats: one batch of [`CacheEvent`]s as the msgpack payload an engine
//! publishes ([`encode_batch`]), in the shape of [`KvEventsFormat::Vllm`] or
//! [`KvEventsFormat::Sglang`]. Pure functions, no I/O; the sockets are `sim::publisher`'s.
//!
//! Both engines encode with msgspec and a tagged union of event structs; they differ in how a
//! struct is laid out:
//! - `sglang` (SGLang, and vLLM before it dropped `array_like`): every struct is an array of its
//!   fields, the tag first. A batch is `[ts, [event, ...]]`; `["BlockStored", block_hashes,
//!   parent_block_hash, token_ids, block_size, lora_id]`, `["BlockRemoved", block_hashes]`,
//!   `["AllBlocksCleared"]`. Block hashes are signed 64-bit integers (the page key's bits).
//! - `vllm` (current vLLM): every struct is a map, the tag under `"type"` first, fields in
//!   declaration order, fields left at their default omitted. A batch is `{"ts", "events",
//!   "data_parallel_rank": 0}`; `BlockStored` has `block_hashes, parent_block_hash, token_ids,
//!   block_size, lora_id, medium, lora_name`, `BlockRemoved` has `block_hashes, medium`. Block
//!   hashes are bytes: the page key's 8 bytes, big-endian.
//!
//! `ts` is wall-clock seconds since the Unix epoch, as both engines stamp it. Encoding cannot
//! fail: it writes to a growable buffer.

use std::convert::Infallible;

use rmp::encode::{self, ByteBuf, ValueWriteError};

use super::cache::CacheEvent;

/// Which engine's encoding the events use (`--kv-events-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvEventsFormat {
    /// Current vLLM: msgpack maps with a `"type"` tag, block hashes as bytes.
    Vllm,
    /// SGLang (and older vLLM): msgpack arrays, tag first, block hashes as signed integers.
    Sglang,
}

/// What every event of a batch shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchHeader {
    /// Wall-clock seconds since the Unix epoch.
    pub ts_s: f64,
    /// Tokens per block (`--page-size`).
    pub block_size: usize,
}

/// The storage medium vLLM names in its events: the sim models GPU memory only.
const MEDIUM_GPU: &str = "GPU";

/// The data-parallel rank vLLM stamps on its batches: each sim engine is one rank 0 server.
const DATA_PARALLEL_RANK: u64 = 0;

/// Writes into a `ByteBuf` cannot fail; `Infallible` says so in the type.
type WriteResult = Result<(), ValueWriteError<Infallible>>;

/// The msgpack payload of one batch of `events` in `format`.
pub fn encode_batch(format: KvEventsFormat, header: BatchHeader, events: &[CacheEvent]) -> Vec<u8> {
    let mut out = ByteBuf::with_capacity(64 + events.len() * 64);
    let written = match format {
        KvEventsFormat::Vllm => write_vllm_batch(&mut out, header, events),
        KvEventsFormat::Sglang => write_sglang_batch(&mut out, header, events),
    };
    // The error type is uninhabited: a `ByteBuf` grows instead of failing.
    let Ok(()) = written;
    out.into_vec()
}

/// A msgpack array length. A batch holds one engine step's pages, far below 2^32 of anything.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

fn write_nil(out: &mut ByteBuf) -> WriteResult {
    encode::write_nil(out).map_err(ValueWriteError::InvalidMarkerWrite)
}

fn write_sglang_batch(
    out: &mut ByteBuf,
    header: BatchHeader,
    events: &[CacheEvent],
) -> WriteResult {
    encode::write_array_len(out, 2)?;
    encode::write_f64(out, header.ts_s)?;
    encode::write_array_len(out, len_u32(events.len()))?;
    for event in events {
        match event {
            CacheEvent::Stored {
                keys,
                parent_key,
                tokens,
            } => {
                encode::write_array_len(out, 6)?;
                encode::write_str(out, "BlockStored")?;
                write_sglang_hashes(out, keys)?;
                match parent_key {
                    Some(parent_key) => {
                        encode::write_sint(out, *parent_key as i64)?;
                    }
                    None => write_nil(out)?,
                }
                write_tokens(out, tokens)?;
                encode::write_uint(out, header.block_size as u64)?;
                write_nil(out)?;
            }
            CacheEvent::Removed { keys } => {
                encode::write_array_len(out, 2)?;
                encode::write_str(out, "BlockRemoved")?;
                write_sglang_hashes(out, keys)?;
            }
            CacheEvent::Cleared => {
                encode::write_array_len(out, 1)?;
                encode::write_str(out, "AllBlocksCleared")?;
            }
        }
    }
    Ok(())
}

/// SGLang's block hashes: Python ints from the key's bits read as a signed 64-bit integer.
fn write_sglang_hashes(out: &mut ByteBuf, keys: &[u64]) -> WriteResult {
    encode::write_array_len(out, len_u32(keys.len()))?;
    for key in keys {
        encode::write_sint(out, *key as i64)?;
    }
    Ok(())
}

fn write_vllm_batch(out: &mut ByteBuf, header: BatchHeader, events: &[CacheEvent]) -> WriteResult {
    encode::write_map_len(out, 3)?;
    encode::write_str(out, "ts")?;
    encode::write_f64(out, header.ts_s)?;
    encode::write_str(out, "events")?;
    encode::write_array_len(out, len_u32(events.len()))?;
    for event in events {
        match event {
            CacheEvent::Stored {
                keys,
                parent_key,
                tokens,
            } => {
                encode::write_map_len(out, 8)?;
                write_vllm_tag(out, "BlockStored")?;
                encode::write_str(out, "block_hashes")?;
                write_vllm_hashes(out, keys)?;
                encode::write_str(out, "parent_block_hash")?;
                match parent_key {
                    Some(parent_key) => encode::write_bin(out, &parent_key.to_be_bytes())?,
                    None => write_nil(out)?,
                }
                encode::write_str(out, "token_ids")?;
                write_tokens(out, tokens)?;
                encode::write_str(out, "block_size")?;
                encode::write_uint(out, header.block_size as u64)?;
                encode::write_str(out, "lora_id")?;
                write_nil(out)?;
                encode::write_str(out, "medium")?;
                encode::write_str(out, MEDIUM_GPU)?;
                encode::write_str(out, "lora_name")?;
                write_nil(out)?;
            }
            CacheEvent::Removed { keys } => {
                encode::write_map_len(out, 3)?;
                write_vllm_tag(out, "BlockRemoved")?;
                encode::write_str(out, "block_hashes")?;
                write_vllm_hashes(out, keys)?;
                encode::write_str(out, "medium")?;
                encode::write_str(out, MEDIUM_GPU)?;
            }
            CacheEvent::Cleared => {
                encode::write_map_len(out, 1)?;
                write_vllm_tag(out, "AllBlocksCleared")?;
            }
        }
    }
    encode::write_str(out, "data_parallel_rank")?;
    encode::write_uint(out, DATA_PARALLEL_RANK)?;
    Ok(())
}

/// msgspec's tag of a tagged struct encoded as a map: `"type": <class name>`, first.
fn write_vllm_tag(out: &mut ByteBuf, name: &str) -> WriteResult {
    encode::write_str(out, "type")?;
    encode::write_str(out, name)
}

/// vLLM's block hashes: bytes; here the key's 8 bytes, big-endian.
fn write_vllm_hashes(out: &mut ByteBuf, keys: &[u64]) -> WriteResult {
    encode::write_array_len(out, len_u32(keys.len()))?;
    for key in keys {
        encode::write_bin(out, &key.to_be_bytes())?;
    }
    Ok(())
}

fn write_tokens(out: &mut ByteBuf, tokens: &[u32]) -> WriteResult {
    encode::write_array_len(out, len_u32(tokens.len()))?;
    for token in tokens {
        encode::write_uint(out, u64::from(*token))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    const HEADER: BatchHeader = BatchHeader {
        ts_s: 1.5,
        block_size: 4,
    };

    /// A stored run of two pages (the second key has its top bit set), a removal and a clear.
    fn events() -> Vec<CacheEvent> {
        vec![
            CacheEvent::Stored {
                keys: vec![7, u64::MAX - 1],
                parent_key: Some(3),
                tokens: (1..=8).collect(),
            },
            CacheEvent::Stored {
                keys: vec![9],
                parent_key: None,
                tokens: vec![0; 4],
            },
            CacheEvent::Removed { keys: vec![7] },
            CacheEvent::Cleared,
        ]
    }

    fn decode(payload: &[u8]) -> Value {
        let mut reader = payload;
        let value = rmpv::decode::read_value(&mut reader).expect("one msgpack value");
        assert!(reader.is_empty(), "nothing after the batch");
        value
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    fn ints(values: impl IntoIterator<Item = i64>) -> Value {
        Value::Array(values.into_iter().map(Value::from).collect())
    }

    fn bin(key: u64) -> Value {
        Value::Binary(key.to_be_bytes().to_vec())
    }

    #[test]
    fn sglang_batches_are_tagged_arrays_with_signed_hashes() {
        let payload = encode_batch(KvEventsFormat::Sglang, HEADER, &events());
        let tokens = ints(1..=8);
        let expected = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    s("BlockStored"),
                    ints([7, -2]),
                    Value::from(3),
                    tokens,
                    Value::from(4),
                    Value::Nil,
                ]),
                Value::Array(vec![
                    s("BlockStored"),
                    ints([9]),
                    Value::Nil,
                    ints([0; 4]),
                    Value::from(4),
                    Value::Nil,
                ]),
                Value::Array(vec![s("BlockRemoved"), ints([7])]),
                Value::Array(vec![s("AllBlocksCleared")]),
            ]),
        ]);
        assert_eq!(decode(&payload), expected);
    }

    #[test]
    fn vllm_batches_are_tagged_maps_with_byte_hashes_in_field_order() {
        let payload = encode_batch(KvEventsFormat::Vllm, HEADER, &events());
        let stored = |keys: &[u64], parent: Value, tokens: Value| {
            Value::Map(vec![
                (s("type"), s("BlockStored")),
                (
                    s("block_hashes"),
                    Value::Array(keys.iter().map(|key| bin(*key)).collect()),
                ),
                (s("parent_block_hash"), parent),
                (s("token_ids"), tokens),
                (s("block_size"), Value::from(4)),
                (s("lora_id"), Value::Nil),
                (s("medium"), s("GPU")),
                (s("lora_name"), Value::Nil),
            ])
        };
        let expected = Value::Map(vec![
            (s("ts"), Value::F64(1.5)),
            (
                s("events"),
                Value::Array(vec![
                    stored(&[7, u64::MAX - 1], bin(3), ints(1..=8)),
                    stored(&[9], Value::Nil, ints([0; 4])),
                    Value::Map(vec![
                        (s("type"), s("BlockRemoved")),
                        (s("block_hashes"), Value::Array(vec![bin(7)])),
                        (s("medium"), s("GPU")),
                    ]),
                    Value::Map(vec![(s("type"), s("AllBlocksCleared"))]),
                ]),
            ),
            (s("data_parallel_rank"), Value::from(0)),
        ]);
        assert_eq!(decode(&payload), expected);
    }

    #[test]
    fn the_bytes_are_msgspecs() {
        // msgspec writes every float as float64 and every int in its shortest form.
        let header = BatchHeader {
            ts_s: 0.0,
            block_size: 16,
        };
        let clear = encode_batch(KvEventsFormat::Sglang, header, &[CacheEvent::Cleared]);
        let mut expected = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xb0];
        expected.extend_from_slice(b"AllBlocksCleared");
        assert_eq!(clear, expected);
        let removed = CacheEvent::Removed {
            keys: vec![1 << 63],
        };
        let payload = encode_batch(KvEventsFormat::Sglang, header, &[removed]);
        // int64 marker and the key's bits.
        assert!(payload.ends_with(&[0x91, 0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]));
    }
}
