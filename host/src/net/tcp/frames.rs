//! The bytes the TCP transport adds to the shared wire messages of [`crate::wire`],
//! encoded and decoded here and nowhere else.
//!
//! The first socket of a connection (the first stream of its first rail) carries the
//! opening, raw: the sender's 32-byte `Header`, a [`Hello`] (index 0, with the stream
//! count and the connection's token), its name message if it named the transfer, the
//! receiver's 28-byte `AcceptInfo`, `RejectReason` or key `Challenge` (told apart by
//! their magics), the proof if challenged. Every further stream starts with its own
//! [`Hello`] (and proof), so the receiver hands it to the connection whose token it
//! carries. Streams `r * N .. (r + 1) * N` are rail `r`'s.
//!
//! After the opening, everything on every stream, in both directions, is a [`Frame`]:
//! an item of a pass (a chunk, or a repair round's piece) placed by its offset, followed
//! by its bytes; a control message ([`Frame::control`], followed by the message, with
//! its own CRC32C); or the end of a pass on that stream ([`Frame::end`]). Items go
//! sender to receiver only; control messages both ways, on the first stream of whichever
//! rail the engine picks (any live rail carries the conversation).
//!
//! ```text
//! Hello (20 bytes):  0 magic "GRDS"  4 version u16  6 stream index u16  8 stream count u16
//!                   10 rail u16  12 token u64
//! Frame (16 bytes):  0 offset u64 (of the item in the transfer)  8 length u32
//!                   12 CRC32C u32 of the item's bytes (0 with --verify pattern|off)
//! Control:           0 offset u64::MAX - 1  8 length u32  12 CRC32C u32 of the message
//! End of a pass:     0 offset u64::MAX  8 length 0  12 failed rails u32 (bit r: rail r)
//! ```

use crate::wire::VERSION;

pub const HELLO_MAGIC: [u8; 4] = *b"GRDS";
pub const HELLO_LEN: usize = 20;
pub const FRAME_LEN: usize = 16;
/// Most streams per connection (`--streams`).
pub const MAX_STREAMS: u16 = 64;
/// Most rails one striped transfer uses (bits of an end marker's failed-rail mask).
pub const MAX_RAILS: usize = 32;
/// The offset that marks a control message's frame.
pub const CONTROL_OFFSET: u64 = u64::MAX - 1;

/// What a peer's control messages read off a socket and not yet taken by the link
/// hold, each counted with [`MESSAGE_COST`] besides its bytes: at most [`MAX_UNREAD`].
/// A peer sends messages in answer to this side's (a name, a round's CRCs, a next
/// offer, a round's verdict), one or two at a time; one that sends unasked (a message of
/// 64 MiB, or empty ones, again and again) would otherwise grow this side's memory at
/// line rate while the link is not polled, every message also counting as progress.
#[derive(Debug, Default)]
pub struct Unread(std::sync::atomic::AtomicUsize);

/// Most bytes of a peer's messages kept unread ([`Unread`]).
pub const MAX_UNREAD: usize = 2 * crate::net::MAX_MESSAGE;
/// What a message costs besides its bytes (so empty ones count too).
pub const MESSAGE_COST: usize = 64;

impl Unread {
    /// Count a message of `len` bytes about to be read from the `peer` ("sender" or
    /// "receiver"); the error to end its reader with where that is more than may wait.
    pub fn hold(&self, len: usize, peer: &str) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        let cost = len + MESSAGE_COST;
        let held = self.0.fetch_add(cost, Ordering::Relaxed) + cost;
        match held > MAX_UNREAD {
            true => Err(format!(
                "protocol error: the {peer}'s messages not yet taken would hold {held} bytes (at most {MAX_UNREAD}): it sends what was not asked for"
            )),
            false => Ok(()),
        }
    }

    /// A message of `len` bytes taken by the link.
    pub fn taken(&self, len: usize) {
        use std::sync::atomic::Ordering;
        self.0.fetch_sub(len + MESSAGE_COST, Ordering::Relaxed);
    }
}

/// Why a hello did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("stream hello too short: {got} bytes, need {HELLO_LEN}")]
    Short { got: usize },
    #[error("not a stream hello (magic {:02x} {:02x} {:02x} {:02x}, expected \"GRDS\")", got[0], got[1], got[2], got[3])]
    BadMagic { got: [u8; 4] },
    #[error("stream hello of protocol version {got} (this side speaks version {VERSION})")]
    UnsupportedVersion { got: u16 },
    #[error("stream {index} of {count} (at most {MAX_STREAMS} streams, index below the count)")]
    BadStream { index: u16, count: u16 },
}

/// The first message of every stream after the header (stream 0) or instead of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub index: u16,
    pub count: u16,
    /// The rail this stream goes over (striped transfers; 0 otherwise).
    pub rail: u16,
    /// Chosen by the sender per connection; joins the streams of one connection.
    pub token: u64,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut out = [0u8; HELLO_LEN];
        out[0..4].copy_from_slice(&HELLO_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&self.index.to_le_bytes());
        out[8..10].copy_from_slice(&self.count.to_le_bytes());
        out[10..12].copy_from_slice(&self.rail.to_le_bytes());
        out[12..20].copy_from_slice(&self.token.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Hello, HelloError> {
        if buf.len() >= 4 && buf[0..4] != HELLO_MAGIC {
            return Err(HelloError::BadMagic {
                got: [buf[0], buf[1], buf[2], buf[3]],
            });
        }
        if buf.len() < HELLO_LEN {
            return Err(HelloError::Short { got: buf.len() });
        }
        let u16_at = |i: usize| u16::from_le_bytes([buf[i], buf[i + 1]]);
        let version = u16_at(4);
        if version != VERSION {
            return Err(HelloError::UnsupportedVersion { got: version });
        }
        let (index, count) = (u16_at(6), u16_at(8));
        if count == 0 || count > MAX_STREAMS || index >= count {
            return Err(HelloError::BadStream { index, count });
        }
        let mut token = [0u8; 8];
        token.copy_from_slice(&buf[12..20]);
        Ok(Hello {
            index,
            count,
            rail: u16_at(10),
            token: u64::from_le_bytes(token),
        })
    }
}

/// The header of one chunk on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub offset: u64,
    pub len: u32,
    /// CRC32C of the chunk's bytes as the sender read them (0 when unchecked).
    pub crc: u32,
}

impl Frame {
    /// The end of a pass on one stream of a striped transfer; `failed_rails`: bit `r` set
    /// for each rail the sender gave up on.
    pub fn end(failed_rails: u32) -> Frame {
        Frame {
            offset: u64::MAX,
            len: 0,
            crc: failed_rails,
        }
    }

    /// The frame of a control message of `bytes`.
    pub fn control(bytes: &[u8]) -> Frame {
        Frame {
            offset: CONTROL_OFFSET,
            len: bytes.len() as u32,
            crc: crate::integrity::crc32c(bytes),
        }
    }

    /// What this frame is.
    pub fn kind(&self) -> FrameKind {
        match self.offset {
            u64::MAX if self.len == 0 => FrameKind::End { failed: self.crc },
            CONTROL_OFFSET => FrameKind::Control {
                len: self.len,
                crc: self.crc,
            },
            offset => FrameKind::Item {
                offset,
                len: self.len,
                crc: self.crc,
            },
        }
    }

    pub fn encode(&self) -> [u8; FRAME_LEN] {
        let mut out = [0u8; FRAME_LEN];
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.crc.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8; FRAME_LEN]) -> Frame {
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&buf[0..8]);
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        Frame {
            offset: u64::from_le_bytes(offset),
            len: u32_at(8),
            crc: u32_at(12),
        }
    }
}

/// What a [`Frame`] announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// An item's `len` bytes, to land at `offset`.
    Item { offset: u64, len: u32, crc: u32 },
    /// A control message of `len` bytes.
    Control { len: u32, crc: u32 },
    /// The end of a pass on this stream, naming the rails given up (bit `r`).
    End { failed: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_checks_its_fields() {
        let h = Hello {
            index: 3,
            count: 4,
            rail: 1,
            token: 0x0123_4567_89ab_cdef,
        };
        let bytes = h.encode();
        assert_eq!(&bytes[0..4], b"GRDS");
        assert_eq!(Hello::decode(&bytes), Ok(h));
        assert_eq!(
            Hello::decode(&bytes[..10]),
            Err(HelloError::Short { got: 10 })
        );
        assert!(matches!(
            Hello::decode(b"GRDM...................."),
            Err(HelloError::BadMagic { .. })
        ));
        let mut other = bytes;
        other[4] = 9;
        assert_eq!(
            Hello::decode(&other),
            Err(HelloError::UnsupportedVersion { got: 9 })
        );
        for (index, count) in [(4u16, 4u16), (0, 0), (0, MAX_STREAMS + 1)] {
            let bad = Hello {
                index,
                count,
                rail: 0,
                token: 1,
            }
            .encode();
            assert_eq!(
                Hello::decode(&bad),
                Err(HelloError::BadStream { index, count })
            );
        }
    }

    #[test]
    fn frames_round_trip_and_say_what_they_are() {
        let f = Frame {
            offset: (5 << 30) + 12,
            len: 1 << 20,
            crc: 0xe306_9283,
        };
        assert_eq!(Frame::decode(&f.encode()), f);
        assert_eq!(
            f.kind(),
            FrameKind::Item {
                offset: (5 << 30) + 12,
                len: 1 << 20,
                crc: 0xe306_9283
            }
        );
        let end = Frame::decode(&Frame::end(0b10).encode());
        assert_eq!(end.kind(), FrameKind::End { failed: 0b10 });
        let message = b"a control message";
        let control = Frame::decode(&Frame::control(message).encode());
        assert_eq!(
            control.kind(),
            FrameKind::Control {
                len: message.len() as u32,
                crc: crate::integrity::crc32c(message)
            }
        );
        // An item can never be taken for either: no transfer reaches those offsets.
        let last = Frame {
            offset: CONTROL_OFFSET - 1,
            len: 1,
            crc: 0,
        };
        assert!(matches!(last.kind(), FrameKind::Item { .. }));
    }
}
