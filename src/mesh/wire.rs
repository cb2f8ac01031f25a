//! The mesh's wire messages: the prost types `build.rs` generates from `proto/mesh.proto`, and
//! their framing on a peer's TCP stream (a 4-byte big-endian length, then one encoded
//! [`Frame`]). The compatibility rule is the `.proto` file's: versions only add fields and
//! bodies, a reader ignores what it does not know.

#![allow(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/kvgate.mesh.rs"));

use prost::Message;

use crate::limits::MESH_FRAME_BYTES_MAX;

/// The newest wire version this gateway speaks, sent in every frame.
pub const WIRE_VERSION: u32 = 1;

/// Bytes of the length prefix.
pub const LENGTH_BYTES: usize = 4;

/// A frame from `sender` with `body`, at this gateway's version.
pub fn frame(sender: &str, body: frame::Body) -> Frame {
    Frame {
        version: WIRE_VERSION,
        sender: sender.to_string(),
        body: Some(body),
    }
}

/// The frame's bytes with their length prefix.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let len = frame.encoded_len();
    let mut out = Vec::with_capacity(LENGTH_BYTES + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    // A Vec grows as needed: encoding into it cannot run out of room.
    let _ = frame.encode(&mut out);
    out
}

/// Why a stream's bytes are not a frame; the stream is closed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is over `MESH_FRAME_BYTES_MAX`.
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
    /// The bytes do not decode as a `Frame`.
    #[error("frame does not decode: {0}")]
    Malformed(String),
}

/// Takes one whole frame off the front of `buffer`: `Ok(None)` while more bytes are needed.
pub fn take_frame(buffer: &mut Vec<u8>) -> Result<Option<Frame>, FrameError> {
    let Some(prefix) = buffer.get(..LENGTH_BYTES) else {
        return Ok(None);
    };
    let mut len_bytes = [0u8; LENGTH_BYTES];
    len_bytes.copy_from_slice(prefix);
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > MESH_FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(len));
    }
    let Some(body) = buffer.get(LENGTH_BYTES..LENGTH_BYTES + len) else {
        return Ok(None);
    };
    let decoded = Frame::decode(body).map_err(|e| FrameError::Malformed(e.to_string()));
    buffer.drain(..LENGTH_BYTES + len);
    decoded.map(Some)
}
