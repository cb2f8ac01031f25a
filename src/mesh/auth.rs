//! Authentication of the mesh's traffic: every SWIM datagram and every TCP frame carries an
//! HMAC-SHA256 tag under the key of `--mesh-secret-file`, checked in constant time before a
//! byte of what it covers is decoded. Sans I/O: `control::mesh_link` moves the bytes.
//!
//! - A datagram ([`Authenticator::seal_datagram`], [`Authenticator::open_datagram`]) is
//!   `version (1) | sent_at_ms (8) | tag (32) | foca's payload`; the tag covers a label naming
//!   the datagram kind, the version, the time and the payload. One sent more than
//!   `MESH_DATAGRAM_AGE_MAX` before or after this gateway's clock is refused: a datagram can be
//!   replayed only within that window, where SWIM's own rule (news of an older incarnation is
//!   ignored) leaves a replay nothing to change but a probe answered twice.
//! - A stream starts with a challenge from the side that accepted it ([`challenge`]: magic,
//!   version, a random nonce) and the dialer's proof that it holds the key
//!   ([`Authenticator::proof`], a tag over the nonce): until the proof checks, the acceptor reads
//!   32 bytes and nothing more. Then each frame is `length (4) | tag (32) | body`
//!   ([`StreamSeal`], [`StreamOpen`]), the tag over a label, the stream's nonce, the frame's
//!   sequence number on the stream, the length and the body: a frame replayed on another stream,
//!   or out of order on its own, fails its tag. The length is checked against
//!   `MESH_FRAME_BYTES_MAX` before a byte of the body is held.
//!
//! Without a key the format is the same under a public empty key: it catches corruption, it
//! authenticates nothing (the mesh logs a WARN at start and `kvgate_mesh_authenticated` is 0).
//! The version byte is this framing's: the messages inside keep their own version
//! (`wire::WIRE_VERSION`, proto3's add-only rule), which the tag covers like every other byte.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use prost::Message;
use sha2::Sha256;

use super::wire::{Frame, FrameError};
use crate::limits::{MESH_DATAGRAM_AGE_MAX, MESH_FRAME_BYTES_MAX, MESH_SECRET_BYTES_MIN};

/// The framing's version, first byte of a datagram and of a challenge.
pub const AUTH_VERSION: u8 = 1;
/// Bytes of a tag (HMAC-SHA256, untruncated).
pub const TAG_BYTES: usize = 32;
/// Bytes of a stream's nonce.
pub const NONCE_BYTES: usize = 16;
/// The challenge's first bytes, so a stray client fails at once.
const CHALLENGE_MAGIC: [u8; 4] = *b"kvgm";
/// Bytes of a challenge: magic, version, nonce.
pub const CHALLENGE_BYTES: usize = CHALLENGE_MAGIC.len() + 1 + NONCE_BYTES;
/// Bytes before a datagram's payload: version, time, tag.
pub const DATAGRAM_HEADER_BYTES: usize = 1 + 8 + TAG_BYTES;
/// Bytes before a frame's body: length, tag.
pub const FRAME_HEADER_BYTES: usize = 4 + TAG_BYTES;

/// Labels that keep a tag of one kind from passing for another.
const LABEL_DATAGRAM: &[u8] = b"kvgate-mesh datagram";
const LABEL_PROOF: &[u8] = b"kvgate-mesh proof";
const LABEL_FRAME: &[u8] = b"kvgate-mesh frame";

type HmacSha256 = Hmac<Sha256>;

/// The mesh's shared secret (`--mesh-secret-file`); never printed.
#[derive(Clone)]
pub struct MeshKey(Arc<[u8]>);

impl fmt::Debug for MeshKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MeshKey({} bytes)", self.0.len())
    }
}

impl MeshKey {
    /// The key `bytes` (surrounding whitespace, such as a file's last newline, trimmed); at
    /// least `MESH_SECRET_BYTES_MIN` bytes.
    pub fn new(bytes: &[u8]) -> Result<MeshKey, String> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < MESH_SECRET_BYTES_MIN {
            return Err(format!(
                "the secret has {} bytes, at least {MESH_SECRET_BYTES_MIN} are needed \
                 (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
                bytes.len()
            ));
        }
        Ok(MeshKey(Arc::from(bytes)))
    }

    /// The key in the file at `path`.
    pub fn from_file(path: &Path) -> Result<MeshKey, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        MeshKey::new(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Why bytes from the network were not let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// Too short for its header, or of another framing version.
    Malformed,
    /// The tag does not check: no key, a wrong key, or altered bytes.
    BadTag,
    /// A datagram sent outside `MESH_DATAGRAM_AGE_MAX` of this gateway's clock.
    Stale,
}

/// Tags and checks the mesh's bytes under one key (or the public empty key).
#[derive(Clone)]
pub struct Authenticator {
    /// The keyed MAC, cloned for each tag (the key schedule is computed once).
    mac: HmacSha256,
    keyed: bool,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("keyed", &self.keyed)
            .finish()
    }
}

impl Authenticator {
    /// Under `key`, or the public empty key without one.
    pub fn new(key: Option<&MeshKey>) -> Authenticator {
        let bytes: &[u8] = key.map_or(&[], |k| &k.0);
        // HMAC takes a key of any length.
        let mac = <HmacSha256 as Mac>::new_from_slice(bytes).unwrap_or_else(|_| unreachable!());
        Authenticator {
            mac,
            keyed: key.is_some(),
        }
    }

    /// Whether a secret key is in use (without one, anyone can forge a tag).
    pub fn is_authenticated(&self) -> bool {
        self.keyed
    }

    fn mac_of(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        for part in parts {
            mac.update(part);
        }
        mac
    }

    fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_BYTES] {
        self.mac_of(parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts`, compared in constant time.
    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac_of(parts).verify_slice(tag).is_ok()
    }

    /// A SWIM datagram ready to send, stamped with `now_ms` (ms since the epoch).
    pub fn seal_datagram(&self, payload: &[u8], now_ms: u64) -> Vec<u8> {
        let sent_at = now_ms.to_be_bytes();
        let tag = self.tag(&[LABEL_DATAGRAM, &[AUTH_VERSION], &sent_at, payload]);
        let mut out = Vec::with_capacity(DATAGRAM_HEADER_BYTES + payload.len());
        out.push(AUTH_VERSION);
        out.extend_from_slice(&sent_at);
        out.extend_from_slice(&tag);
        out.extend_from_slice(payload);
        out
    }

    /// The payload of a datagram whose tag checks and whose time is within
    /// `MESH_DATAGRAM_AGE_MAX` of `now_ms`.
    pub fn open_datagram<'a>(
        &self,
        datagram: &'a [u8],
        now_ms: u64,
    ) -> Result<&'a [u8], AuthError> {
        let Some((header, payload)) = datagram.split_at_checked(DATAGRAM_HEADER_BYTES) else {
            return Err(AuthError::Malformed);
        };
        if header[0] != AUTH_VERSION {
            return Err(AuthError::Malformed);
        }
        let (sent_at, tag) = header[1..].split_at(8);
        if !self.verify(&[LABEL_DATAGRAM, &[AUTH_VERSION], sent_at, payload], tag) {
            return Err(AuthError::BadTag);
        }
        let mut at = [0u8; 8];
        at.copy_from_slice(sent_at);
        let age_ms = now_ms.abs_diff(u64::from_be_bytes(at));
        if age_ms > MESH_DATAGRAM_AGE_MAX.as_millis() as u64 {
            return Err(AuthError::Stale);
        }
        Ok(payload)
    }

    /// The dialer's answer to a challenge: a tag over its nonce.
    pub fn proof(&self, nonce: &[u8; NONCE_BYTES]) -> [u8; TAG_BYTES] {
        self.tag(&[LABEL_PROOF, nonce])
    }

    /// Whether `proof` answers the challenge of `nonce` (constant time).
    pub fn check_proof(&self, nonce: &[u8; NONCE_BYTES], proof: &[u8]) -> bool {
        self.verify(&[LABEL_PROOF, nonce], proof)
    }
}

/// A fresh random nonce for a stream this gateway accepted.
pub fn fresh_nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::fill(&mut nonce);
    nonce
}

/// The challenge an acceptor sends first: magic, version, `nonce`.
pub fn challenge(nonce: &[u8; NONCE_BYTES]) -> [u8; CHALLENGE_BYTES] {
    let mut out = [0u8; CHALLENGE_BYTES];
    out[..4].copy_from_slice(&CHALLENGE_MAGIC);
    out[4] = AUTH_VERSION;
    out[5..].copy_from_slice(nonce);
    out
}

/// The nonce of a challenge; `None` when the bytes are not one (not a kvgate mesh port, or
/// another framing version).
pub fn parse_challenge(bytes: &[u8; CHALLENGE_BYTES]) -> Option<[u8; NONCE_BYTES]> {
    if bytes[..4] != CHALLENGE_MAGIC || bytes[4] != AUTH_VERSION {
        return None;
    }
    let mut nonce = [0u8; NONCE_BYTES];
    nonce.copy_from_slice(&bytes[5..]);
    Some(nonce)
}

fn frame_tag_parts<'a>(
    nonce: &'a [u8; NONCE_BYTES],
    seq: &'a [u8; 8],
    len: &'a [u8; 4],
    body: &'a [u8],
) -> [&'a [u8]; 5] {
    [LABEL_FRAME, nonce, seq, len, body]
}

/// The dialer's side of a stream: seals each frame with the next sequence number.
#[derive(Debug)]
pub struct StreamSeal {
    auth: Authenticator,
    nonce: [u8; NONCE_BYTES],
    seq: u64,
}

impl StreamSeal {
    /// The stream whose challenge carried `nonce`.
    pub fn new(auth: Authenticator, nonce: [u8; NONCE_BYTES]) -> StreamSeal {
        StreamSeal {
            auth,
            nonce,
            seq: 0,
        }
    }

    /// `body` (an encoded [`Frame`]) with its length and tag, ready to write.
    pub fn seal(&mut self, body: &[u8]) -> Vec<u8> {
        let len = (body.len() as u32).to_be_bytes();
        let seq = self.seq.to_be_bytes();
        self.seq += 1;
        let tag = self
            .auth
            .tag(&frame_tag_parts(&self.nonce, &seq, &len, body));
        let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
        out.extend_from_slice(&len);
        out.extend_from_slice(&tag);
        out.extend_from_slice(body);
        out
    }
}

/// The acceptor's side of a stream after the proof checked: takes whole frames off the front
/// of the bytes read so far, each checked before it is decoded.
#[derive(Debug)]
pub struct StreamOpen {
    auth: Authenticator,
    nonce: [u8; NONCE_BYTES],
    seq: u64,
}

impl StreamOpen {
    /// The stream this gateway challenged with `nonce`.
    pub fn new(auth: Authenticator, nonce: [u8; NONCE_BYTES]) -> StreamOpen {
        StreamOpen {
            auth,
            nonce,
            seq: 0,
        }
    }

    /// Takes one whole frame off the front of `buffer`: `Ok(None)` while more bytes are
    /// needed. A length over `MESH_FRAME_BYTES_MAX` is refused as soon as the length is read;
    /// a tag that does not check is refused before the body is decoded. Any error ends the
    /// stream (its sequence is lost).
    pub fn take_frame(&mut self, buffer: &mut Vec<u8>) -> Result<Option<Frame>, FrameError> {
        let Some(len_bytes) = buffer.get(..4) else {
            return Ok(None);
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(len_bytes);
        let body_len = u32::from_be_bytes(len) as usize;
        if body_len > MESH_FRAME_BYTES_MAX {
            return Err(FrameError::TooLarge(body_len));
        }
        let Some(whole) = buffer.get(..FRAME_HEADER_BYTES + body_len) else {
            return Ok(None);
        };
        let (tag, body) = whole[4..].split_at(TAG_BYTES);
        let seq = self.seq.to_be_bytes();
        if !self
            .auth
            .verify(&frame_tag_parts(&self.nonce, &seq, &len, body), tag)
        {
            return Err(FrameError::Unauthenticated);
        }
        self.seq += 1;
        let decoded = Frame::decode(body).map_err(|e| FrameError::Malformed(e.to_string()));
        buffer.drain(..FRAME_HEADER_BYTES + body_len);
        decoded.map(Some)
    }
}
