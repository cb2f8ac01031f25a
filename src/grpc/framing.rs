//! gRPC's message framing (the "Length-Prefixed-Message" of gRPC over HTTP/2): each message is a
//! 1-byte compressed flag, a 4-byte big-endian length, then the encoded protobuf. Owns
//! [`encode`] and [`MessageReader`], which cuts HTTP/2 DATA frames (split anywhere) back into
//! messages. A message announced past [`GRPC_MESSAGE_BYTES_MAX`] or a compressed one (kvgate
//! asks for none: it sends no `grpc-accept-encoding`) is a [`FramingError`], refused before
//! its bytes are buffered.

use bytes::{Buf, Bytes, BytesMut};

use crate::limits::GRPC_MESSAGE_BYTES_MAX;

/// Bytes before each message: the compressed flag and the length.
pub const PREFIX_BYTES: usize = 5;

/// Why a stream of DATA frames is not a sequence of gRPC messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The length prefix announces more than `GRPC_MESSAGE_BYTES_MAX`.
    #[error("a gRPC message of {0} bytes is over the limit")]
    TooLarge(u32),
    /// The message is compressed; kvgate announced no encoding it accepts.
    #[error("a compressed gRPC message (no encoding was negotiated)")]
    Compressed,
    /// The stream ended inside a message.
    #[error("the stream ended inside a gRPC message")]
    Truncated,
}

/// `message` encoded with its prefix, ready to send as DATA.
pub fn encode<M: prost::Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(PREFIX_BYTES + len);
    out.extend_from_slice(&[0]);
    // `len` fits: the messages kvgate builds are far below 4 GiB (a prompt's IDs at most).
    out.extend_from_slice(&(len as u32).to_be_bytes());
    // Encoding into a buffer reserved to its length cannot fail.
    let _ = message.encode(&mut out);
    out.freeze()
}

/// Cuts the DATA of one gRPC response back into messages, however the frames split them.
#[derive(Debug, Default)]
pub struct MessageReader {
    /// Bytes received and not yet handed out as a message.
    pending: BytesMut,
}

impl MessageReader {
    /// An empty reader.
    pub fn new() -> MessageReader {
        MessageReader::default()
    }

    /// Adds one DATA frame's bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.pending.extend_from_slice(data);
    }

    /// The next whole message's bytes, `None` until one is complete.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, FramingError> {
        if self.pending.len() < PREFIX_BYTES {
            return Ok(None);
        }
        let compressed = self.pending[0];
        let len = u32::from_be_bytes([
            self.pending[1],
            self.pending[2],
            self.pending[3],
            self.pending[4],
        ]);
        if compressed != 0 {
            return Err(FramingError::Compressed);
        }
        if len as usize > GRPC_MESSAGE_BYTES_MAX {
            return Err(FramingError::TooLarge(len));
        }
        if self.pending.len() < PREFIX_BYTES + len as usize {
            return Ok(None);
        }
        self.pending.advance(PREFIX_BYTES);
        Ok(Some(self.pending.split_to(len as usize).freeze()))
    }

    /// At the end of the stream: an error when bytes of a message are left over.
    pub fn finish(&self) -> Result<(), FramingError> {
        match self.pending.is_empty() {
            true => Ok(()),
            false => Err(FramingError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_proto::sglang_pb::{AbortRequest, HealthCheckResponse};
    use prost::Message;

    #[test]
    fn a_message_is_its_prefix_then_its_protobuf() {
        let message = AbortRequest {
            request_id: "r1".into(),
            reason: String::new(),
        };
        let framed = encode(&message);
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 4]);
        assert_eq!(&framed[5..], &[0x0a, 2, b'r', b'1']);
    }

    #[test]
    fn messages_split_anywhere_come_back_whole_and_in_order() {
        let one = encode(&HealthCheckResponse {
            healthy: true,
            message: "ok".into(),
        });
        let two = encode(&HealthCheckResponse {
            healthy: false,
            message: "a longer message than the first".into(),
        });
        let empty = encode(&HealthCheckResponse::default());
        let stream: Vec<u8> = [&one[..], &two[..], &empty[..]].concat();
        for cut in 0..stream.len() {
            for second in cut..stream.len() {
                let mut reader = MessageReader::new();
                let mut got = Vec::new();
                for piece in [&stream[..cut], &stream[cut..second], &stream[second..]] {
                    reader.push(piece);
                    while let Some(message) = reader.next_message().unwrap() {
                        got.push(HealthCheckResponse::decode(message).unwrap());
                    }
                }
                reader.finish().unwrap();
                let messages: Vec<&str> = got.iter().map(|m| m.message.as_str()).collect();
                assert_eq!(
                    messages,
                    ["ok", "a longer message than the first", ""],
                    "cut at {cut} and {second}"
                );
            }
        }
    }

    #[test]
    fn an_oversized_or_compressed_or_truncated_message_is_refused() {
        let mut reader = MessageReader::new();
        let too_long = (GRPC_MESSAGE_BYTES_MAX as u32 + 1).to_be_bytes();
        reader.push(&[0, too_long[0], too_long[1], too_long[2], too_long[3]]);
        let refused = reader.next_message();
        assert_eq!(
            refused,
            Err(FramingError::TooLarge(GRPC_MESSAGE_BYTES_MAX as u32 + 1))
        );

        let mut reader = MessageReader::new();
        reader.push(&[1, 0, 0, 0, 1, 0]);
        assert_eq!(reader.next_message(), Err(FramingError::Compressed));

        let mut reader = MessageReader::new();
        reader.push(&[0, 0, 0, 0, 9, 1, 2]);
        assert_eq!(reader.next_message(), Ok(None));
        assert_eq!(reader.finish(), Err(FramingError::Truncated));
    }
}
