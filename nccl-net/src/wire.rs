//! Every byte this plugin puts on the wire that is not data, encoded and decoded here
//! only: the handle NCCL carries from `listen` to `connect`, the hello that opens each
//! socket, the header in front of each piece of a message, and the control frames the
//! receiver sends back. Integers are little-endian; each item starts with a magic.
//! A decoder never panics on any input and refuses what it cannot have come from a
//! well-behaved peer.

use crate::abi::NCCL_NET_HANDLE_MAXSIZE;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The most data sockets a comm may have (the handle carries the count in a byte).
pub const MAX_STREAMS: usize = 16;

pub const HANDLE_MAGIC: [u8; 4] = *b"GRDN";
pub const HELLO_MAGIC: [u8; 4] = *b"GRDH";
pub const PIECE_MAGIC: [u8; 4] = *b"GRDP";
/// 2: eager sends (a message may go before its receive is posted, into the
/// receiver's bounce buffer, and be placed by a later match frame). 3: pieces carry
/// their message's number and tag, so that a receiver whose handle says `by_number`
/// places an eager message for a receive of one buffer itself (no match frame).
pub const VERSION: u16 = 3;

/// The receives one `irecv` may group (`maxRecvs`), each with its tag.
pub const MAX_RECVS: usize = 8;
/// A message is cut into pieces of its size over the streams, within these bounds:
/// small enough that a repair resends little and the CRC runs on cache-warm data,
/// large enough that headers and system calls cost little. NCCL's messages are often
/// 128 KiB (`NCCL_P2P_NET_CHUNKSIZE`): those go whole, and NCCL's 8 steps in flight
/// spread them over the sockets; larger ones are striped.
pub const MIN_PIECE: u64 = 128 << 10;
pub const MAX_PIECE: u64 = 1 << 20;
/// Where `connect` keeps its progress in the handle between calls (NCCL hands the
/// same handle back to each call; `listen` writes zeros there).
pub const HANDLE_PROGRESS_AT: usize = NCCL_NET_HANDLE_MAXSIZE - 8;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(msg.into()))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// What `listen` writes into NCCL's handle: where to connect, how many data sockets,
/// and a random token that the listener checks in every hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    pub streams: u8,
    pub token: u64,
    /// The listener is an RDMA CM listener (`crate::verbs`), not a TCP socket.
    pub verbs: bool,
    /// The receiver places eager messages for receives of one buffer by their number
    /// (`NCCL_GRDMA_EAGER_BY_NUMBER` where it listened): the sender sends no match frame
    /// for those.
    pub by_number: bool,
}

impl Handle {
    /// The handle's first 120 bytes (the rest is `connect`'s progress slot, zero here).
    pub fn encode(&self) -> [u8; NCCL_NET_HANDLE_MAXSIZE] {
        let mut b = [0u8; NCCL_NET_HANDLE_MAXSIZE];
        b[0..4].copy_from_slice(&HANDLE_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[7] = self.streams;
        b[8..10].copy_from_slice(&self.addr.port().to_le_bytes());
        b[10] = u8::from(self.verbs);
        b[11] = u8::from(self.by_number);
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[6] = 4;
                b[16..20].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[6] = 6;
                b[16..32].copy_from_slice(&a.octets());
            }
        }
        b[32..40].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < HANDLE_PROGRESS_AT {
            return err("the handle is short");
        }
        if b[0..4] != HANDLE_MAGIC {
            return err(format!(
                "the handle does not come from this plugin's listen (magic {:02x?}, expected \"GRDN\")",
                &b[0..4]
            ));
        }
        let v = u16_at(b, 4);
        if v != VERSION {
            return err(format!(
                "the handle has version {v}, this plugin speaks {VERSION}"
            ));
        }
        let streams = b[7];
        if streams == 0 || streams as usize > MAX_STREAMS {
            return err(format!(
                "the handle asks for {streams} streams (1 to {MAX_STREAMS})"
            ));
        }
        let port = u16_at(b, 8);
        let ip = match b[6] {
            4 => IpAddr::V4(Ipv4Addr::new(b[16], b[17], b[18], b[19])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[16..32]).unwrap_or([0; 16]),
            )),
            f => {
                return err(format!(
                    "the handle's address family {f} is neither 4 nor 6"
                ))
            }
        };
        if port == 0 {
            return err("the handle's port is 0");
        }
        let verbs = match b[10] {
            0 => false,
            1 => true,
            t => {
                return err(format!(
                    "the handle's transport {t} is neither 0 (TCP) nor 1 (verbs)"
                ))
            }
        };
        let by_number = match b[11] {
            0 => false,
            1 => true,
            t => {
                return err(format!(
                    "the handle's eager placing {t} is neither 0 (match frames) nor 1 (by number)"
                ))
            }
        };
        Ok(Self {
            addr: SocketAddr::new(ip, port),
            streams,
            token: u64_at(b, 32),
            verbs,
            by_number,
        })
    }
}

/// The first bytes on every socket of a comm, connector to listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// 0: the control socket; 1..=streams: data socket `index - 1`.
    pub index: u8,
    pub streams: u8,
    /// The listener's token, from the handle.
    pub token: u64,
    /// The connecting comm's random id: the listener groups sockets by it.
    pub conn_id: u64,
}

impl Hello {
    pub const LEN: usize = 24;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6] = self.index;
        b[7] = self.streams;
        b[8..16].copy_from_slice(&self.token.to_le_bytes());
        b[16..24].copy_from_slice(&self.conn_id.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; Self::LEN]) -> Result<Self, WireError> {
        if b[0..4] != HELLO_MAGIC {
            return err("not a grdma connection (bad hello magic)");
        }
        let v = u16_at(b, 4);
        if v != VERSION {
            return err(format!("hello version {v}, this plugin speaks {VERSION}"));
        }
        let (index, streams) = (b[6], b[7]);
        if streams == 0 || streams as usize > MAX_STREAMS || index > streams {
            return err(format!("hello for socket {index} of {streams} streams"));
        }
        Ok(Self {
            index,
            streams,
            token: u64_at(b, 8),
            conn_id: u64_at(b, 16),
        })
    }
}

/// How a message of `total` bytes is cut into pieces when sent over `streams` sockets;
/// both ends compute it, the receiver checks each header against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub total: u64,
    pub piece: u64,
    pub count: u32,
}

impl Layout {
    pub fn new(total: u64, streams: usize) -> Self {
        if total == 0 {
            // One empty piece, so that an empty message still arrives (and is acked).
            return Self {
                total,
                piece: MIN_PIECE,
                count: 1,
            };
        }
        let piece = total
            .div_ceil(streams.max(1) as u64)
            .clamp(MIN_PIECE, MAX_PIECE);
        Self {
            total,
            piece,
            count: total.div_ceil(piece) as u32,
        }
    }

    /// Piece `i`'s offset and length.
    pub fn range(&self, i: u32) -> (u64, u32) {
        let off = i as u64 * self.piece;
        (off, (self.total - off).min(self.piece) as u32)
    }
}

pub const FLAG_CHECKED: u8 = 1;
/// A header-only frame on a data socket: eager message `offset` (its sequence number)
/// belongs in buffer `slot` of receive `cts_id`. No bytes follow.
pub const FLAG_MATCH: u8 = 2;
/// The `slot` of a piece of an eager message: sent before the sender saw the
/// receive it belongs to; `cts_id` is then the message's eager sequence number.
pub const EAGER_SLOT: u8 = 0xff;
/// The largest message the sender sends eagerly (NCCL's chunks: 128 KiB by default,
/// `NCCL_P2P_NET_CHUNKSIZE` up to a few MiB), and the most bytes of eager messages
/// per comm not yet placed (the receiver's bounce memory, per comm, stays near this).
pub const EAGER_MAX: u64 = 4 << 20;
pub const EAGER_BUDGET: u64 = 16 << 20;
/// The most eager messages per comm not yet matched (the sender waits beyond it, as
/// beyond `EAGER_BUDGET`).
pub const EAGER_MESSAGES: usize = 1024;
/// A receiver refuses a peer whose eager messages not yet placed exceed these: an
/// honest sender keeps within `EAGER_BUDGET` and `EAGER_MESSAGES` unmatched, plus the
/// matched ones whose match frame is still on its way (the control socket is not
/// ordered with the data sockets), so four times as much is a peer flooding, not one
/// running ahead.
pub const EAGER_HELD_MAX: u64 = 4 * EAGER_BUDGET;
pub const EAGER_HELD_MESSAGES: usize = 4 * EAGER_MESSAGES;

/// In front of each piece on a data socket. The piece's `len` bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PieceHeader {
    /// A match frame (`FLAG_MATCH`), not a piece: see there.
    pub matched: bool,
    /// The piece carries a CRC32C the receiver must check (and ack the message).
    pub checked: bool,
    /// Which of the receive's grouped buffers (tags) the message is for.
    pub slot: u8,
    /// The send attempt, 0 for the first (for the log).
    pub attempt: u16,
    /// The receive (its clear-to-send id) the message answers.
    pub cts_id: u64,
    pub piece: u32,
    pub pieces: u32,
    pub total: u64,
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
    /// The message's number among its comm's `isend`s (0, 1, ...). Messages take the
    /// receive buffers in order (the oldest receive first, each of its buffers once),
    /// so message `index` lands in the comm's buffer number `index`, counting every
    /// `irecv`'s buffers in order: that is how the receiver places an eager message
    /// for a receive of one buffer without a match frame.
    pub index: u64,
    /// The message's tag (checked against its receive's where it is placed).
    pub tag: i32,
}

impl PieceHeader {
    pub const LEN: usize = 64;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&PIECE_MAGIC);
        b[4] =
            if self.checked { FLAG_CHECKED } else { 0 } | if self.matched { FLAG_MATCH } else { 0 };
        b[5] = self.slot;
        b[6..8].copy_from_slice(&self.attempt.to_le_bytes());
        b[8..16].copy_from_slice(&self.cts_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.piece.to_le_bytes());
        b[20..24].copy_from_slice(&self.pieces.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.len.to_le_bytes());
        b[44..48].copy_from_slice(&self.crc.to_le_bytes());
        b[48..56].copy_from_slice(&self.index.to_le_bytes());
        b[56..60].copy_from_slice(&self.tag.to_le_bytes());
        b
    }

    /// Decodes and checks the header against the layout of the message it claims to
    /// belong to (`streams` of this comm); the caller checks it against the receive.
    pub fn decode(b: &[u8; Self::LEN], streams: usize) -> Result<Self, WireError> {
        if b[0..4] != PIECE_MAGIC {
            return err(format!("bad piece magic {:02x?}", &b[0..4]));
        }
        if b[4] & !(FLAG_CHECKED | FLAG_MATCH) != 0 {
            return err(format!("unknown piece flags {:#x}", b[4]));
        }
        let h = Self {
            matched: b[4] & FLAG_MATCH != 0,
            checked: b[4] & FLAG_CHECKED != 0,
            slot: b[5],
            attempt: u16_at(b, 6),
            cts_id: u64_at(b, 8),
            piece: u32_at(b, 16),
            pieces: u32_at(b, 20),
            total: u64_at(b, 24),
            offset: u64_at(b, 32),
            len: u32_at(b, 40),
            crc: u32_at(b, 44),
            index: u64_at(b, 48),
            tag: u32_at(b, 56) as i32,
        };
        if b[60..64] != [0; 4] {
            return err(format!(
                "piece header bytes 60..64 not zero: {:02x?}",
                &b[60..64]
            ));
        }
        if h.matched {
            if h.len != 0 || h.slot as usize >= MAX_RECVS {
                return err(format!(
                    "a match frame for buffer {} with {} bytes",
                    h.slot, h.len
                ));
            }
            return Ok(h);
        }
        let l = Layout::new(h.total, streams);
        if h.pieces != l.count || h.piece >= l.count || l.range(h.piece) != (h.offset, h.len) {
            return err(format!(
                "piece {} of {} at {}+{} does not fit a message of {} bytes over {} streams",
                h.piece, h.pieces, h.offset, h.len, h.total, streams
            ));
        }
        Ok(h)
    }
}

/// A receive as the sender sees it: one buffer (`slot`) of a posted `irecv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostedSlot {
    pub tag: i32,
    pub size: u64,
}

/// Receiver to sender, on the control socket; `Reject` is the listener's, on a socket
/// whose hello it refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ctrl {
    /// Clear to send: receive `id` was posted with these buffers.
    Cts { id: u64, slots: Vec<PostedSlot> },
    /// Message (`id`, `slot`) arrived whole and every piece passed its CRC.
    Ack { id: u64, slot: u8 },
    /// These pieces of message (`id`, `slot`) failed their CRC: send them again.
    Nack { id: u64, slot: u8, pieces: Vec<u32> },
    /// The listener refused this connection.
    Reject { reason: u32 },
}

pub const REJECT_BAD_TOKEN: u32 = 1;
pub const REJECT_BAD_HELLO: u32 = 2;
/// A NACK lists at most this many pieces (a message of 2 GiB in 32 KiB pieces).
pub const MAX_NACK_PIECES: u32 = 1 << 16;

impl Ctrl {
    pub const HEADER: usize = 16;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let (kind, n, count, id) = match self {
            Ctrl::Cts { id, slots } => (1u8, slots.len() as u8, 0u32, *id),
            Ctrl::Ack { id, slot } => (2, *slot, 0, *id),
            Ctrl::Nack { id, slot, pieces } => (3, *slot, pieces.len() as u32, *id),
            Ctrl::Reject { reason } => (4, 0, *reason, 0),
        };
        out.extend_from_slice(&[kind, n, 0, 0]);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
        match self {
            Ctrl::Cts { slots, .. } => {
                for s in slots {
                    out.extend_from_slice(&s.tag.to_le_bytes());
                    out.extend_from_slice(&[0; 4]);
                    out.extend_from_slice(&s.size.to_le_bytes());
                }
            }
            Ctrl::Nack { pieces, .. } => {
                for p in pieces {
                    out.extend_from_slice(&p.to_le_bytes());
                }
            }
            _ => {}
        }
    }

    /// The first frame in `b` and the bytes it took, or `None` if `b` holds only part.
    pub fn decode(b: &[u8]) -> Result<Option<(Self, usize)>, WireError> {
        if b.len() < Self::HEADER {
            return Ok(None);
        }
        let (kind, n, count, id) = (b[0], b[1], u32_at(b, 4), u64_at(b, 8));
        let body = match kind {
            1 => {
                if n == 0 || n as usize > MAX_RECVS {
                    return err(format!(
                        "a clear-to-send for {n} buffers (1 to {MAX_RECVS})"
                    ));
                }
                n as usize * 16
            }
            2 | 4 => 0,
            3 => {
                if count == 0 || count > MAX_NACK_PIECES {
                    return err(format!("a resend request for {count} pieces"));
                }
                count as usize * 4
            }
            k => return err(format!("unknown control frame type {k}")),
        };
        if b.len() < Self::HEADER + body {
            return Ok(None);
        }
        let body_b = &b[Self::HEADER..Self::HEADER + body];
        let frame = match kind {
            1 => Ctrl::Cts {
                id,
                slots: body_b
                    .chunks_exact(16)
                    .map(|c| PostedSlot {
                        tag: u32_at(c, 0) as i32,
                        size: u64_at(c, 8),
                    })
                    .collect(),
            },
            2 => Ctrl::Ack { id, slot: n },
            3 => Ctrl::Nack {
                id,
                slot: n,
                pieces: body_b.chunks_exact(4).map(|c| u32_at(c, 0)).collect(),
            },
            _ => Ctrl::Reject { reason: count },
        };
        Ok(Some((frame, Self::HEADER + body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trip_and_refusals() {
        for addr in ["127.0.0.1:4242", "[2001:db8::7]:9"] {
            let h = Handle {
                addr: addr.parse().unwrap(),
                streams: 4,
                token: 0x1122_3344_5566_7788,
                verbs: addr.starts_with('1'),
                by_number: addr.starts_with('['),
            };
            let b = h.encode();
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert!(b[HANDLE_PROGRESS_AT..].iter().all(|&x| x == 0));
        }
        let good = Handle {
            addr: "127.0.0.1:4242".parse().unwrap(),
            streams: 4,
            token: 7,
            verbs: false,
            by_number: false,
        }
        .encode();
        let mut bad = good;
        bad[0] = b'X';
        assert!(Handle::decode(&bad).unwrap_err().0.contains("magic"));
        let mut bad = good;
        bad[4] = 9;
        assert!(Handle::decode(&bad).unwrap_err().0.contains("version 9"));
        let mut bad = good;
        bad[7] = 0;
        assert!(Handle::decode(&bad).unwrap_err().0.contains("0 streams"));
        let mut bad = good;
        bad[6] = 5;
        assert!(Handle::decode(&bad).unwrap_err().0.contains("family 5"));
        let mut bad = good;
        bad[10] = 2;
        assert!(Handle::decode(&bad).unwrap_err().0.contains("transport 2"));
        let mut bad = good;
        bad[11] = 3;
        assert!(Handle::decode(&bad)
            .unwrap_err()
            .0
            .contains("eager placing 3"));
        assert!(Handle::decode(&[0u8; 128]).is_err());
    }

    #[test]
    fn hello_round_trip_and_refusals() {
        let h = Hello {
            index: 3,
            streams: 4,
            token: 99,
            conn_id: 12345,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[6] = 5;
        assert!(Hello::decode(&b).is_err(), "index beyond the streams");
        let mut b = h.encode();
        b[1] = 0;
        assert!(Hello::decode(&b).is_err());
    }

    #[test]
    fn layout_covers_every_byte_once() {
        for (total, streams) in [
            (0u64, 4usize),
            (1, 4),
            (MIN_PIECE, 4),
            (MIN_PIECE + 1, 1),
            (4 << 20, 4),
            ((1 << 30) + 3, 16),
            (5_000_000, 3),
        ] {
            let l = Layout::new(total, streams);
            let mut next = 0u64;
            for i in 0..l.count {
                let (off, len) = l.range(i);
                assert_eq!(off, next);
                assert!(len as u64 <= MAX_PIECE && (len > 0 || total == 0));
                next += len as u64;
            }
            assert_eq!(next, total, "{total} over {streams}");
        }
        assert_eq!(Layout::new(4 << 20, 4).count, 4, "one piece per stream");
        assert_eq!(
            Layout::new(256 << 10, 4).count,
            2,
            "no piece below MIN_PIECE"
        );
    }

    #[test]
    fn piece_header_round_trip_and_layout_check() {
        let l = Layout::new(1_500_000, 3);
        let (offset, len) = l.range(2);
        let h = PieceHeader {
            matched: false,
            checked: true,
            slot: 1,
            attempt: 2,
            cts_id: 77,
            piece: 2,
            pieces: l.count,
            total: l.total,
            offset,
            len,
            crc: 0xdead_beef,
            index: 1 << 40,
            tag: -7,
        };
        assert_eq!(PieceHeader::decode(&h.encode(), 3).unwrap(), h);
        let mut b = h.encode();
        b[63] = 1; // the reserved bytes
        assert!(PieceHeader::decode(&b, 3).is_err());
        assert!(
            PieceHeader::decode(&h.encode(), 4).is_err(),
            "another comm's layout"
        );
        let mut b = h.encode();
        b[40] ^= 1; // len
        assert!(PieceHeader::decode(&b, 3).is_err());
        let mut b = h.encode();
        b[4] = 0x80;
        assert!(PieceHeader::decode(&b, 3).is_err());
    }

    #[test]
    fn ctrl_round_trip_partial_and_refusals() {
        let frames = [
            Ctrl::Cts {
                id: 5,
                slots: vec![
                    PostedSlot {
                        tag: -3,
                        size: 1 << 33,
                    },
                    PostedSlot { tag: 7, size: 0 },
                ],
            },
            Ctrl::Ack { id: 6, slot: 7 },
            Ctrl::Nack {
                id: 8,
                slot: 0,
                pieces: vec![0, 9, 400],
            },
            Ctrl::Reject {
                reason: REJECT_BAD_TOKEN,
            },
        ];
        let mut b = Vec::new();
        for f in &frames {
            f.encode(&mut b);
        }
        let mut at = 0;
        for f in &frames {
            // Every proper prefix is "not yet", the whole frame decodes.
            let (_, len) = Ctrl::decode(&b[at..]).unwrap().unwrap();
            for cut in 0..len {
                assert_eq!(Ctrl::decode(&b[at..at + cut]).unwrap(), None);
            }
            let (got, _) = Ctrl::decode(&b[at..at + len]).unwrap().unwrap();
            assert_eq!(&got, f);
            at += len;
        }
        assert_eq!(at, b.len());
        let mut bad = Vec::new();
        Ctrl::Cts {
            id: 1,
            slots: vec![],
        }
        .encode(&mut bad);
        assert!(Ctrl::decode(&bad).is_err(), "a clear-to-send for no buffer");
        let mut bad = vec![9u8; 16];
        bad[0] = 9;
        assert!(Ctrl::decode(&bad).is_err());
    }

    #[test]
    fn decoders_never_panic_on_noise() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut b = [0u8; 128];
            for c in b.iter_mut() {
                *c = next() as u8;
            }
            // Keep the magics half the time so the checks behind them run too.
            if next() & 1 == 0 {
                b[0..4].copy_from_slice(&PIECE_MAGIC);
                b[4] &= 1;
            }
            let _ = Handle::decode(&b);
            let _ = Hello::decode(b[..24].try_into().unwrap());
            let _ = PieceHeader::decode(b[..64].try_into().unwrap(), 1 + (b[100] % 16) as usize);
            b[0] = 1 + b[0] % 4;
            let _ = Ctrl::decode(&b[..(b[101] as usize % 128)]);
        }
    }
}
