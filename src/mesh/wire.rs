//! The mesh's wire messages: the prost types `build.rs` generates from `proto/mesh.proto`. On a
//! peer's TCP stream each encoded [`Frame`] travels sealed (`mesh::auth`: length, tag, body).
//! The compatibility rule is the `.proto` file's: versions only add fields and bodies, a reader
//! ignores what it does not know.

#![allow(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/kvgate.mesh.rs"));

use prost::Message;

/// The newest wire version this gateway speaks, sent in every frame.
pub const WIRE_VERSION: u32 = 1;

/// A frame from `sender` with `body`, at this gateway's version.
pub fn frame(sender: &str, body: frame::Body) -> Frame {
    Frame {
        version: WIRE_VERSION,
        sender: sender.to_string(),
        body: Some(body),
    }
}

/// The frame's bytes, to be sealed for each stream (`auth::StreamSeal`).
pub fn encode(frame: &Frame) -> Vec<u8> {
    frame.encode_to_vec()
}

/// Why a stream's bytes are not a frame; the stream is closed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is over `MESH_FRAME_BYTES_MAX`.
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
    /// The tag does not check (no key, a wrong key, replayed or altered bytes).
    #[error("frame tag does not check")]
    Unauthenticated,
    /// The bytes do not decode as a `Frame`.
    #[error("frame does not decode: {0}")]
    Malformed(String),
}
