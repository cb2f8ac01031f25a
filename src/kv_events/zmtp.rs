//! The sizes a ZMTP 3 peer announces, read before anything is allocated for them
//! ([`FrameSizes`]).
//!
//! A publisher's byte stream is a 64-byte greeting, then frames: a flags byte (`MORE` 0x01,
//! `LONG` 0x02, `COMMAND` 0x04), a length (one byte, or eight big-endian ones when `LONG`) and
//! that many bytes. The ZeroMQ library's decoder reserves a frame's announced length before its
//! bytes arrive, so a header claiming 2^62 bytes aborts the process. The subscribers relay a
//! publisher's bytes through [`FrameSizes::scan`] first (`control::kv_subscriber`'s guard),
//! which refuses a frame, or a message of several frames, announced past the limit; the
//! connection is then cut before the decoder sees the header. Nothing here reads a payload.

/// A frame (or the message it belongs to) announced past the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// The bytes announced: the frame's length, plus the earlier frames of its message.
    pub announced: u64,
}

/// Where the reader stands in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Inside the greeting: `left` bytes of it to go.
    Greeting { left: u8 },
    /// At a frame's flags byte.
    Flags,
    /// Inside a frame's length: `left` bytes of it to go, `so_far` read.
    Length { flags: u8, left: u8, so_far: u64 },
    /// Inside a frame's body: `left` bytes to go.
    Body { left: u64 },
}

const GREETING_BYTES: u8 = 64;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// The framing of one connection's incoming bytes, as far as sizes go.
#[derive(Clone, Debug)]
pub struct FrameSizes {
    place: Place,
    /// The most bytes one message (all its frames) or command may announce.
    limit_bytes: u64,
    /// The bytes of the current message's earlier frames.
    message_bytes: u64,
    /// Whether the frame being read has `MORE` (and is no command).
    more: bool,
}

impl FrameSizes {
    /// A reader at the start of a connection, refusing messages past `limit_bytes`.
    pub fn new(limit_bytes: u64) -> FrameSizes {
        FrameSizes {
            place: Place::Greeting {
                left: GREETING_BYTES,
            },
            limit_bytes,
            message_bytes: 0,
            more: false,
        }
    }

    /// Reads `bytes`, the next ones of the stream. An error names the first frame announced
    /// past the limit; the connection must not be read on.
    pub fn scan(&mut self, mut bytes: &[u8]) -> Result<(), TooLarge> {
        while let Some((&byte, rest)) = bytes.split_first() {
            match self.place {
                Place::Greeting { left } => {
                    let taken = bytes.len().min(usize::from(left));
                    bytes = &bytes[taken..];
                    let left = left - taken as u8;
                    self.place = match left {
                        0 => Place::Flags,
                        left => Place::Greeting { left },
                    };
                    continue;
                }
                Place::Flags => {
                    let left = if byte & FLAG_LONG != 0 { 8 } else { 1 };
                    self.place = Place::Length {
                        flags: byte,
                        left,
                        so_far: 0,
                    };
                }
                Place::Length {
                    flags,
                    left,
                    so_far,
                } => {
                    let so_far = (so_far << 8) | u64::from(byte);
                    self.place = match left {
                        1 => self.frame_begins(flags, so_far)?,
                        left => Place::Length {
                            flags,
                            left: left - 1,
                            so_far,
                        },
                    };
                }
                Place::Body { left } => {
                    let taken = (bytes.len() as u64).min(left);
                    bytes = &bytes[taken as usize..];
                    self.place = match left - taken {
                        0 => Place::Flags,
                        left => Place::Body { left },
                    };
                    continue;
                }
            }
            bytes = rest;
        }
        Ok(())
    }

    /// A frame of `length` bytes begins: checked against the limit with its message's earlier
    /// frames.
    fn frame_begins(&mut self, flags: u8, length: u64) -> Result<Place, TooLarge> {
        let command = flags & FLAG_COMMAND != 0;
        let earlier = if command { 0 } else { self.message_bytes };
        let announced = earlier.saturating_add(length);
        if announced > self.limit_bytes {
            return Err(TooLarge { announced });
        }
        if !command {
            self.more = flags & FLAG_MORE != 0;
            self.message_bytes = if self.more { announced } else { 0 };
        }
        Ok(match length {
            0 => Place::Flags,
            left => Place::Body { left },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut out = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
        out.extend_from_slice(b"NULL");
        out.resize(64, 0);
        out
    }

    fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match body.len() {
            n if n <= 255 => out.extend_from_slice(&[flags, n as u8]),
            n => {
                out.push(flags | FLAG_LONG);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(body);
        out
    }

    fn long_header(flags: u8, announced: u64) -> Vec<u8> {
        let mut out = vec![flags | FLAG_LONG];
        out.extend_from_slice(&announced.to_be_bytes());
        out
    }

    /// A stream fed whole and one byte at a time gives the same outcome.
    fn scanned(limit: u64, stream: &[u8]) -> Result<(), TooLarge> {
        let whole = FrameSizes::new(limit).scan(stream);
        let mut sizes = FrameSizes::new(limit);
        let bytewise = stream.iter().try_for_each(|b| sizes.scan(&[*b]));
        assert_eq!(whole, bytewise);
        whole
    }

    #[test]
    fn frames_within_the_limit_pass_in_any_split() {
        let mut stream = greeting();
        stream.extend(frame(
            FLAG_COMMAND,
            b"\x05READY\x0bSocket-Type\0\0\0\x03PUB",
        ));
        stream.extend(frame(FLAG_MORE, b""));
        stream.extend(frame(FLAG_MORE, &7u64.to_be_bytes()));
        stream.extend(frame(0, &[9; 300]));
        stream.extend(frame(0, &[1; 1000]));
        assert_eq!(scanned(1000, &stream), Ok(()));
    }

    #[test]
    fn a_huge_announced_frame_is_refused_at_its_header() {
        for announced in [1 << 47, 1 << 62, u64::MAX, 1 << 40, 1001] {
            let mut stream = greeting();
            stream.extend(frame(0, b"ok"));
            stream.extend(long_header(0, announced));
            assert_eq!(scanned(1000, &stream), Err(TooLarge { announced }));
            // A command too.
            let mut stream = greeting();
            stream.extend(long_header(FLAG_COMMAND, announced));
            assert_eq!(scanned(1000, &stream), Err(TooLarge { announced }));
        }
    }

    #[test]
    fn a_message_counts_all_its_frames() {
        let mut stream = greeting();
        for _ in 0..3 {
            stream.extend(frame(FLAG_MORE, &[0; 200]));
        }
        let ok = stream.clone();
        assert_eq!(scanned(800, &ok), Ok(()));
        stream.extend(frame(0, &[0; 201]));
        assert_eq!(scanned(800, &stream), Err(TooLarge { announced: 801 }));
        // A message ended: the next starts from nothing.
        let mut stream = ok;
        stream.extend(frame(0, &[0; 200]));
        stream.extend(frame(0, &[0; 800]));
        assert_eq!(scanned(800, &stream), Ok(()));
    }
}
