//! The engines' KV events as data: their wire format ([`wire`]: frames, both msgpack encodings
//! of `KVEventBatch`), a subscriber's place in a publisher's numbered batches ([`sequence`]),
//! what is counted about each worker's stream ([`stats`]), and the sizes a ZMTP peer announces
//! ([`zmtp`], checked before the ZeroMQ library allocates for them). No I/O: the control
//! plane's subscribers (`control::kv_events`) read the sockets and apply the decoded events to
//! the KV-event index (`index::kv`).

pub mod sequence;
pub mod stats;
pub mod wire;
pub mod zmtp;

pub use sequence::{Arrival, Sequence};
pub use stats::{Failure, IndexGauges, Reset, StreamStats};
pub use wire::{bytes_hash, message_parts, EventBatch, KvEvent, WireError, REPLAY_END_SEQ};
pub use zmtp::{FrameSizes, TooLarge};
