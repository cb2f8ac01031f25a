//! The engines' KV-event wire format: one published message is the frames
//! `[topic, seq as 8-byte big-endian, msgpack payload]` ([`message_parts`]); the payload is one
//! `KVEventBatch` ([`EventBatch::decode`]).
//!
//! Both engines define the batch with msgspec structs, and both encodings are read:
//! - array-like (SGLang, older vLLM): `[ts, [event...], dp_rank?]`, each event a tagged array
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?,
//!   ...]`, `["BlockRemoved", block_hashes, medium?]`, `["AllBlocksCleared"]`;
//! - maps (current vLLM): `{"ts", "events", "data_parallel_rank"}`, each event a map with a
//!   `"type"` field naming it.
//!
//! Block hashes are signed or unsigned 64-bit integers (SGLang, vLLM's builtin hash) or bytes
//! (vLLM's sha256 hashes, folded to 64 bits with xxh3). Unknown fields and unknown event types
//! are skipped, so newer engines keep working. Events about another medium than the GPU (CPU
//! offload tiers) or another KV-cache group than the first (hybrid models) are not the prefix
//! cache a request can hit: they are skipped and counted ([`EventBatch::skipped`]).
//!
//! vLLM folds a block's LoRA (`lora_name`, or `lora_id` before it) and its `extra_keys`
//! (multimodal hashes, `cache_salt` on the first block, prompt embeddings) into its block hash,
//! so a request without them does not hit that block. A `Stored` event carries them as
//! [`KvEvent::Stored::salts`], one per block (0: none), which the index folds into its chain:
//! such blocks are never predicted for a plain request. A `BlockStored` whose token ids do not
//! fill its blocks (vLLM leaves null blocks' hashes out but not their tokens) cannot be placed:
//! that event alone is skipped and counted ([`EventBatch::misshapen`]), the rest of the batch
//! applies.
//!
//! gRPC workers send the same events as protobuf (`smg.grpc.common.KvEventBatch`, read by
//! `SubscribeKvEvents`): [`EventBatch::fill_from_grpc`] puts them in the same batch.
//!
//! A batch decodes whole or not at all: any error leaves it empty and the caller counts the
//! batch as malformed. Decoding allocates nothing once the batch's buffers have grown (they are
//! reused from batch to batch) and reads the msgpack markers with `rmp`'s marker table.

use std::ops::Range;

use rmp::Marker;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The replay socket's end-of-replay sequence number.
pub const REPLAY_END_SEQ: i64 = -1;

/// Nesting deeper than this in a skipped value is refused (a crafted payload cannot recurse far).
const SKIP_DEPTH_MAX: u32 = 32;

/// Why a batch could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The payload ended inside a value.
    #[error("payload truncated")]
    Truncated,
    /// A value of another type than the field's.
    #[error("{0}: unexpected msgpack type")]
    Unexpected(&'static str),
    /// A required field is missing.
    #[error("{0}: missing")]
    Missing(&'static str),
    /// A token ID that is not an unsigned 32-bit integer.
    #[error("token_ids: an ID outside 0..2^32")]
    TokenId,
    /// Values nested deeper than `SKIP_DEPTH_MAX`.
    #[error("values nested too deep")]
    TooDeep,
    /// The frames are not `[topic, seq (8 bytes), payload]`.
    #[error("{0}")]
    Frames(&'static str),
}

/// The sequence number and payload of a published message's frames
/// `[topic, seq as 8-byte big-endian, payload]`.
pub fn message_parts<'a>(frames: &[&'a [u8]]) -> Result<(u64, &'a [u8]), WireError> {
    let [_topic, seq, payload] = frames else {
        return Err(WireError::Frames("a message of other than 3 frames"));
    };
    let seq: [u8; 8] = (*seq)
        .try_into()
        .map_err(|_| WireError::Frames("a sequence number of other than 8 bytes"))?;
    Ok((u64::from_be_bytes(seq), payload))
}

/// One event of a batch; its hashes and tokens are ranges into the batch's buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// The engine cached the blocks `hashes`, in order, the first a child of `parent` (`None`:
    /// the start of a sequence), holding `tokens`, `block_size` per block.
    Stored {
        /// Into [`EventBatch::hashes`].
        hashes: Range<usize>,
        /// The engine's hash of the first block's parent.
        parent: Option<u64>,
        /// Into [`EventBatch::tokens`].
        tokens: Range<usize>,
        /// Tokens per block.
        block_size: u32,
        /// Into [`EventBatch::salts`]: per block, the hash of what the engine folded into its
        /// block hash besides the tokens (LoRA, extra keys; 0: nothing). Empty: none for any.
        salts: Range<usize>,
    },
    /// The engine evicted the blocks `hashes`.
    Removed {
        /// Into [`EventBatch::hashes`].
        hashes: Range<usize>,
    },
    /// The engine dropped its whole cache.
    Cleared,
}

/// A decoded batch, its buffers reused by the next [`EventBatch::decode`].
#[derive(Debug, Default)]
pub struct EventBatch {
    events: Vec<KvEvent>,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    salts: Vec<u64>,
    skipped: u32,
    misshapen: u32,
}

impl EventBatch {
    /// Decodes `payload` into this batch (its previous contents are dropped). On error the batch
    /// is left empty.
    pub fn decode(&mut self, payload: &[u8]) -> Result<(), WireError> {
        self.clear();
        let decoded = Reader::new(payload).batch(self);
        if decoded.is_err() {
            self.clear();
        }
        decoded
    }

    fn clear(&mut self) {
        self.events.clear();
        self.hashes.clear();
        self.tokens.clear();
        self.salts.clear();
        self.skipped = 0;
        self.misshapen = 0;
    }

    /// Empties the batch (applied) and gives back buffer capacity past `bytes_max` per buffer
    /// (what a huge batch left): a publisher's one 200 MB batch must not stay held between
    /// batches.
    pub fn shrink_to(&mut self, bytes_max: usize) {
        self.clear();
        fn shrink<T>(buffer: &mut Vec<T>, bytes_max: usize) {
            let keep = bytes_max / std::mem::size_of::<T>().max(1);
            if buffer.capacity() > keep {
                buffer.shrink_to(keep);
            }
        }
        shrink(&mut self.events, bytes_max);
        shrink(&mut self.hashes, bytes_max);
        shrink(&mut self.tokens, bytes_max);
        shrink(&mut self.salts, bytes_max);
    }

    /// Bytes of buffer capacity held.
    pub fn capacity_bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<KvEvent>()
            + self.hashes.capacity() * 8
            + self.tokens.capacity() * 4
            + self.salts.capacity() * 8
    }

    /// The events, in the engine's order.
    pub fn events(&self) -> &[KvEvent] {
        &self.events
    }

    /// Block hashes of an event.
    pub fn hashes(&self, range: &Range<usize>) -> &[u64] {
        &self.hashes[range.clone()]
    }

    /// Token IDs of a `Stored` event.
    pub fn tokens(&self, range: &Range<usize>) -> &[u32] {
        &self.tokens[range.clone()]
    }

    /// Events of another medium or KV-cache group, or of an unknown type, left out.
    pub fn skipped(&self) -> u32 {
        self.skipped
    }

    /// Per-block salts of a `Stored` event (empty: none).
    pub fn salts(&self, range: &Range<usize>) -> &[u64] {
        &self.salts[range.clone()]
    }

    /// `BlockStored` events whose token ids do not fill their blocks (or whose extra keys are
    /// not one per block), left out.
    pub fn misshapen(&self) -> u32 {
        self.misshapen
    }
}

impl EventBatch {
    /// Drops what an event left out had appended to the buffers.
    fn truncate(&mut self, (hashes, tokens, salts): (usize, usize, usize)) {
        self.hashes.truncate(hashes);
        self.tokens.truncate(tokens);
        self.salts.truncate(salts);
    }

    /// The salts of a `Stored` event of `blocks` blocks: its extra keys' hashes (already
    /// appended, `extra_keys`) with the LoRA's folded in; empty when it has neither.
    fn salts_of(
        &mut self,
        extra_keys: Option<Range<usize>>,
        lora: u64,
        blocks: usize,
    ) -> Range<usize> {
        let range = match extra_keys {
            Some(range) => range,
            None if lora == 0 => return 0..0,
            None => {
                let start = self.salts.len();
                self.salts.resize(start + blocks, 0);
                start..self.salts.len()
            }
        };
        if lora != 0 {
            for salt in &mut self.salts[range.clone()] {
                *salt = xxh3_64_with_seed(&salt.to_le_bytes(), lora).max(1);
            }
        }
        range
    }
}

/// The engine hash of a block hash sent as bytes.
pub fn bytes_hash(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// The fields of one event, as they are read (in either encoding).
#[derive(Default)]
struct Fields<'a> {
    tag: Option<&'a [u8]>,
    hashes: Option<Range<usize>>,
    parent: Option<u64>,
    tokens: Option<Range<usize>>,
    block_size: Option<u64>,
    /// Whether `medium` named another medium than the GPU.
    other_medium: bool,
    /// Whether `group_idx` named another KV-cache group than the first.
    other_group: bool,
    /// The hash of `lora_name` (or `lora_id`), if any: 0 when the base model.
    lora: u64,
    /// Into `EventBatch::salts`: the hash of each `extra_keys` entry (0: `nil`).
    extra_keys: Option<Range<usize>>,
}

/// A cursor over a msgpack payload.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, WireError> {
        let b = *self.buf.get(self.pos).ok_or(WireError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.take(N)?;
        // `take` returned exactly N bytes.
        bytes.try_into().map_err(|_| WireError::Truncated)
    }

    fn marker(&mut self) -> Result<Marker, WireError> {
        Ok(Marker::from_u8(self.byte()?))
    }

    fn peek_nil(&mut self) -> bool {
        if self.buf.get(self.pos) == Some(&0xc0) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// The length of an array marker.
    fn array_len(&mut self, field: &'static str) -> Result<usize, WireError> {
        match self.marker()? {
            Marker::FixArray(n) => Ok(usize::from(n)),
            Marker::Array16 => Ok(usize::from(u16::from_be_bytes(self.be()?))),
            Marker::Array32 => Ok(u32::from_be_bytes(self.be()?) as usize),
            _ => Err(WireError::Unexpected(field)),
        }
    }

    /// A string's bytes.
    fn str_bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = match self.marker()? {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => usize::from(self.byte()?),
            Marker::Str16 => usize::from(u16::from_be_bytes(self.be()?)),
            Marker::Str32 => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(WireError::Unexpected(field)),
        };
        self.take(len)
    }

    /// An integer as its value (`i128` holds every msgpack integer).
    fn int_of(&mut self, marker: Marker, field: &'static str) -> Result<i128, WireError> {
        Ok(match marker {
            Marker::FixPos(n) => i128::from(n),
            Marker::FixNeg(n) => i128::from(n),
            Marker::U8 => i128::from(self.byte()?),
            Marker::U16 => i128::from(u16::from_be_bytes(self.be()?)),
            Marker::U32 => i128::from(u32::from_be_bytes(self.be()?)),
            Marker::U64 => i128::from(u64::from_be_bytes(self.be()?)),
            Marker::I8 => i128::from(i8::from_be_bytes(self.be()?)),
            Marker::I16 => i128::from(i16::from_be_bytes(self.be()?)),
            Marker::I32 => i128::from(i32::from_be_bytes(self.be()?)),
            Marker::I64 => i128::from(i64::from_be_bytes(self.be()?)),
            _ => return Err(WireError::Unexpected(field)),
        })
    }

    fn uint(&mut self, field: &'static str) -> Result<u64, WireError> {
        let marker = self.marker()?;
        let value = self.int_of(marker, field)?;
        u64::try_from(value).map_err(|_| WireError::Unexpected(field))
    }

    /// An optional integer (`nil`: `None`).
    fn opt_int(&mut self, field: &'static str) -> Result<Option<i128>, WireError> {
        if self.peek_nil() {
            return Ok(None);
        }
        let marker = self.marker()?;
        self.int_of(marker, field).map(Some)
    }

    /// A block hash: a 64-bit integer (its two's-complement bits) or bytes.
    fn hash(&mut self) -> Result<u64, WireError> {
        let len = match self.marker()? {
            Marker::Bin8 => usize::from(self.byte()?),
            Marker::Bin16 => usize::from(u16::from_be_bytes(self.be()?)),
            Marker::Bin32 => u32::from_be_bytes(self.be()?) as usize,
            marker => {
                let value = self.int_of(marker, "block hash")?;
                // Signed hashes keep their bits: i64 and u64 values map one to one.
                return match (u64::try_from(value), i64::try_from(value)) {
                    (Ok(unsigned), _) => Ok(unsigned),
                    (_, Ok(signed)) => Ok(signed as u64),
                    _ => Err(WireError::Unexpected("block hash")),
                };
            }
        };
        Ok(bytes_hash(self.take(len)?))
    }

    fn opt_hash(&mut self) -> Result<Option<u64>, WireError> {
        if self.peek_nil() {
            return Ok(None);
        }
        self.hash().map(Some)
    }

    /// An array of block hashes, appended to `out`.
    fn hashes(&mut self, out: &mut Vec<u64>) -> Result<Range<usize>, WireError> {
        let len = self.array_len("block_hashes")?;
        let start = out.len();
        out.reserve(len.min(self.remaining()));
        for _ in 0..len {
            out.push(self.hash()?);
        }
        Ok(start..out.len())
    }

    /// An array of token IDs, appended to `out`.
    fn tokens(&mut self, out: &mut Vec<u32>) -> Result<Range<usize>, WireError> {
        let len = self.array_len("token_ids")?;
        let start = out.len();
        out.reserve(len.min(self.remaining()));
        for _ in 0..len {
            // Token IDs are small non-negative integers: the one- and three-byte forms first.
            let id = match self.byte()? {
                b @ 0x00..=0x7f => u32::from(b),
                0xcd => u32::from(u16::from_be_bytes(self.be()?)),
                0xcc => u32::from(self.byte()?),
                0xce => u32::from_be_bytes(self.be()?),
                other => {
                    let value = self.int_of(Marker::from_u8(other), "token_ids")?;
                    u32::try_from(value).map_err(|_| WireError::TokenId)?
                }
            };
            out.push(id);
        }
        Ok(start..out.len())
    }

    /// Whether an optional medium names another medium than the GPU.
    fn other_medium(&mut self) -> Result<bool, WireError> {
        if self.peek_nil() {
            return Ok(false);
        }
        Ok(!self.str_bytes("medium")?.eq_ignore_ascii_case(b"GPU"))
    }

    /// An optional LoRA name or id: the hash of its bytes, 0 when `nil`.
    fn lora(&mut self) -> Result<u64, WireError> {
        if self.peek_nil() {
            return Ok(0);
        }
        Ok(self.value_hash()?.max(1))
    }

    /// The hash of the next value's msgpack bytes, whatever its type.
    fn value_hash(&mut self) -> Result<u64, WireError> {
        let start = self.pos;
        self.skip(1)?;
        Ok(xxh3_64(&self.buf[start..self.pos]))
    }

    /// `extra_keys`: `nil`, or an array with one entry per block (`nil`, or what the engine
    /// folded into that block's hash), each entry's hash appended to `out` (0 for `nil`).
    fn extra_keys(&mut self, out: &mut Vec<u64>) -> Result<Option<Range<usize>>, WireError> {
        if self.peek_nil() {
            return Ok(None);
        }
        let len = self.array_len("extra_keys")?;
        let start = out.len();
        out.reserve(len.min(self.remaining()));
        for _ in 0..len {
            let salt = match self.peek_nil() {
                true => 0,
                false => self.value_hash()?.max(1),
            };
            out.push(salt);
        }
        Ok(Some(start..out.len()))
    }

    /// Skips one value of any type.
    fn skip(&mut self, depth: u32) -> Result<(), WireError> {
        if depth > SKIP_DEPTH_MAX {
            return Err(WireError::TooDeep);
        }
        let (items, bytes) = match self.marker()? {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null => (0, 0),
            Marker::True | Marker::False => (0, 0),
            Marker::Reserved => return Err(WireError::Unexpected("value")),
            Marker::U8 | Marker::I8 => (0, 1),
            Marker::U16 | Marker::I16 => (0, 2),
            Marker::U32 | Marker::I32 | Marker::F32 => (0, 4),
            Marker::U64 | Marker::I64 | Marker::F64 => (0, 8),
            Marker::FixStr(n) => (0, usize::from(n)),
            Marker::Str8 | Marker::Bin8 => (0, usize::from(self.byte()?)),
            Marker::Str16 | Marker::Bin16 => (0, usize::from(u16::from_be_bytes(self.be()?))),
            Marker::Str32 | Marker::Bin32 => (0, u32::from_be_bytes(self.be()?) as usize),
            Marker::FixExt1 => (0, 2),
            Marker::FixExt2 => (0, 3),
            Marker::FixExt4 => (0, 5),
            Marker::FixExt8 => (0, 9),
            Marker::FixExt16 => (0, 17),
            Marker::Ext8 => (0, usize::from(self.byte()?) + 1),
            Marker::Ext16 => (0, usize::from(u16::from_be_bytes(self.be()?)) + 1),
            Marker::Ext32 => (0, u32::from_be_bytes(self.be()?) as usize + 1),
            Marker::FixArray(n) => (usize::from(n), 0),
            Marker::Array16 => (usize::from(u16::from_be_bytes(self.be()?)), 0),
            Marker::Array32 => (u32::from_be_bytes(self.be()?) as usize, 0),
            Marker::FixMap(n) => (2 * usize::from(n), 0),
            Marker::Map16 => (2 * usize::from(u16::from_be_bytes(self.be()?)), 0),
            Marker::Map32 => (2 * u32::from_be_bytes(self.be()?) as usize, 0),
        };
        self.take(bytes)?;
        for _ in 0..items {
            self.skip(depth + 1)?;
        }
        Ok(())
    }

    /// A batch: `[ts, events, dp_rank?]` or `{"ts", "events", "data_parallel_rank"}`.
    fn batch(&mut self, out: &mut EventBatch) -> Result<(), WireError> {
        let mut events = false;
        match self.marker()? {
            marker @ (Marker::FixArray(_) | Marker::Array16 | Marker::Array32) => {
                let len = self.container_len(marker)?;
                for position in 0..len {
                    if position == 1 {
                        self.events(out)?;
                        events = true;
                    } else {
                        self.skip(1)?;
                    }
                }
            }
            marker @ (Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {
                let len = self.container_len(marker)?;
                for _ in 0..len {
                    if self.str_bytes("batch key")? == b"events" {
                        self.events(out)?;
                        events = true;
                    } else {
                        self.skip(1)?;
                    }
                }
            }
            _ => return Err(WireError::Unexpected("batch")),
        }
        if !events {
            return Err(WireError::Missing("events"));
        }
        Ok(())
    }

    fn container_len(&mut self, marker: Marker) -> Result<usize, WireError> {
        Ok(match marker {
            Marker::FixArray(n) | Marker::FixMap(n) => usize::from(n),
            Marker::Array16 | Marker::Map16 => usize::from(u16::from_be_bytes(self.be()?)),
            Marker::Array32 | Marker::Map32 => u32::from_be_bytes(self.be()?) as usize,
            _ => return Err(WireError::Unexpected("container")),
        })
    }

    fn events(&mut self, out: &mut EventBatch) -> Result<(), WireError> {
        let len = self.array_len("events")?;
        for _ in 0..len {
            self.event(out)?;
        }
        Ok(())
    }

    /// One event, tagged array or map, appended to `out` unless it is skipped.
    fn event(&mut self, out: &mut EventBatch) -> Result<(), WireError> {
        let before = (out.hashes.len(), out.tokens.len(), out.salts.len());
        let mut fields = Fields::default();
        match self.marker()? {
            marker @ (Marker::FixArray(_) | Marker::Array16 | Marker::Array32) => {
                let len = self.container_len(marker)?;
                if len == 0 {
                    return Err(WireError::Missing("event tag"));
                }
                let tag = self.str_bytes("event tag")?;
                fields.tag = Some(tag);
                for position in 1..len {
                    match (tag, position) {
                        (b"BlockStored" | b"BlockRemoved", 1) => {
                            fields.hashes = Some(self.hashes(&mut out.hashes)?);
                        }
                        (b"BlockStored", 2) => fields.parent = self.opt_hash()?,
                        (b"BlockStored", 3) => fields.tokens = Some(self.tokens(&mut out.tokens)?),
                        (b"BlockStored", 4) => fields.block_size = Some(self.uint("block_size")?),
                        (b"BlockStored", 6) | (b"BlockRemoved", 2) => {
                            fields.other_medium = self.other_medium()?;
                        }
                        (b"BlockStored", 5) => fields.lora |= self.lora()?,
                        (b"BlockStored", 7) => fields.lora = self.lora()?,
                        (b"BlockStored", 8) => {
                            fields.extra_keys = self.extra_keys(&mut out.salts)?;
                        }
                        _ => self.skip(1)?,
                    }
                }
            }
            marker @ (Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {
                let len = self.container_len(marker)?;
                for _ in 0..len {
                    match self.str_bytes("event key")? {
                        b"type" => fields.tag = Some(self.str_bytes("type")?),
                        b"block_hashes" => fields.hashes = Some(self.hashes(&mut out.hashes)?),
                        b"parent_block_hash" => fields.parent = self.opt_hash()?,
                        b"token_ids" => fields.tokens = Some(self.tokens(&mut out.tokens)?),
                        b"block_size" => fields.block_size = Some(self.uint("block_size")?),
                        b"medium" => fields.other_medium = self.other_medium()?,
                        // `lora_name` replaces `lora_id` where both are sent.
                        b"lora_id" => fields.lora |= self.lora()?,
                        b"lora_name" => fields.lora = self.lora()?,
                        b"extra_keys" => {
                            fields.extra_keys = self.extra_keys(&mut out.salts)?;
                        }
                        b"group_idx" => {
                            fields.other_group = self.opt_int("group_idx")?.unwrap_or(0) != 0;
                        }
                        _ => self.skip(1)?,
                    }
                }
            }
            _ => return Err(WireError::Unexpected("event")),
        }
        let event = match fields.tag.ok_or(WireError::Missing("event type"))? {
            b"BlockStored" => {
                let hashes = fields.hashes.ok_or(WireError::Missing("block_hashes"))?;
                let tokens = fields.tokens.ok_or(WireError::Missing("token_ids"))?;
                let size = fields.block_size.ok_or(WireError::Missing("block_size"))?;
                let blocks = hashes.len();
                let filled = u32::try_from(size)
                    .ok()
                    .filter(|size| *size > 0 && tokens.len() == blocks * *size as usize);
                let extras_fit = fields.extra_keys.as_ref().is_none_or(|e| e.len() == blocks);
                match filled {
                    Some(block_size) if extras_fit => Some(KvEvent::Stored {
                        hashes,
                        parent: fields.parent,
                        tokens,
                        block_size,
                        salts: out.salts_of(fields.extra_keys, fields.lora, blocks),
                    }),
                    // Tokens or extra keys that cannot be placed on the blocks: this event
                    // cannot be chained, the others can.
                    _ => {
                        out.misshapen += 1;
                        out.truncate(before);
                        return Ok(());
                    }
                }
            }
            b"BlockRemoved" => Some(KvEvent::Removed {
                hashes: fields.hashes.ok_or(WireError::Missing("block_hashes"))?,
            }),
            b"AllBlocksCleared" => Some(KvEvent::Cleared),
            // A type this gateway does not know yet.
            _ => None,
        };
        match event {
            Some(event) if !fields.other_medium && !fields.other_group => out.events.push(event),
            _ => {
                out.truncate(before);
                out.skipped += 1;
            }
        }
        Ok(())
    }
}

mod grpc;

#[cfg(test)]
mod tests;
