//! Repair in pieces: a chunk whose CRC32C failed is sent again as smaller pieces, each
//! in a frame with its own CRC32C, and a piece that fails again as smaller pieces still,
//! down to [`FLOOR_SHIFT`] (4 KiB). On a link that flips a bit every few MiB a 1 MiB
//! chunk fails ~40% of its sendings, but a 4 KiB piece almost never: the rounds converge
//! where whole-chunk rounds would not. The sender says it answers piece requests with
//! [`HINT_PIECES`](super::HINT_PIECES) in its offer; a receiver asks for
//! pieces only then (an older sender is asked for whole chunks, as before).
//!
//! A piece of size `1 << shift` is addressed by its index in the transfer cut into pieces
//! of that size: piece `k` holds bytes `k << shift ..` (the last one shorter). Piece sizes
//! are powers of two dividing the chunk size, so the pieces of a chunk never cross into
//! the next one.
//!
//! ```text
//! PieceResend (16 + 4/piece): 0 magic "GRDI"  4 version u16  6 flags u8 (0)  7 shift u8
//!                             8 round u32 (from 1)  12 count u32  16 count piece indices
//!                             u32, increasing
//! ```
//!
//! It comes where a `Resend` would (over TCP on stream 0 instead of the ack), with the
//! same 16-byte prefix, told apart by its magic. Pieces just cut from what failed are
//! first queried (the same layout, magic "GRDQ"): the sender answers with its CRC32C of
//! each ("GRDV", [`encode_crcs`]) and the receiver asks only for those that differ where
//! they landed. Both ends bound a transfer's repair by the bytes sent again
//! ([`budget`]); see `transfer::repair`.

use super::{WireError, REPLY_PREFIX_LEN, VERSION};

pub const PIECES_MAGIC: [u8; 4] = *b"GRDI";
/// A [`PieceResend`]'s layout asking not for the pieces but for the sender's CRC32C of
/// each ([`PieceResend::encode_query`]): the receiver compares them with the pieces'
/// where they landed and asks only for those that differ.
pub const QUERY_MAGIC: [u8; 4] = *b"GRDQ";
/// The sender's answer to a query: the CRC32C of each piece asked about, in its order.
pub const CRCS_MAGIC: [u8; 4] = *b"GRDV";
/// The smallest piece: 4 KiB (a page; below it the 16-byte frame costs more than it
/// saves).
pub const FLOOR_SHIFT: u8 = 12;
/// The largest piece shift a request may name (pieces fit a frame's u32 length).
const MAX_SHIFT: u8 = 31;
/// Bytes sent again that every transfer may spend at least, however small it is: a 4 KiB
/// file over a lossy link gets more than one more try.
pub const MIN_BUDGET: u64 = 64 << 20;

/// The bytes one transfer of `total` bytes may send again in all its rounds: the
/// transfer's size again, at least [`MIN_BUDGET`].
pub fn budget(total: u64) -> u64 {
    total.max(MIN_BUDGET)
}

/// The shift of the pieces a failed `unit` (a chunk, or a piece) of `unit` bytes is sent
/// again as: a sixteenth of it or less (a 1 MiB chunk as 64 KiB pieces, those as 4 KiB),
/// a power of two dividing it, at least 4 KiB. `None` when it cannot be cut smaller.
pub fn smaller(unit: u64) -> Option<u8> {
    if unit < 2 << FLOOR_SHIFT {
        return None;
    }
    // The largest power of two dividing `unit`, and the largest at most a sixteenth.
    let divides = unit.trailing_zeros().min(63) as u8;
    let sixteenth = (unit / 16).max(1).ilog2() as u8;
    let shift = divides.min(sixteenth).max(FLOOR_SHIFT);
    (shift >= FLOOR_SHIFT && unit.is_multiple_of(1 << shift) && (1u64 << shift) < unit)
        .then_some(shift)
}

/// Whether `shift` may cut chunks of `chunk_bytes`: at least the floor, a power of two
/// below the chunk that divides it.
pub fn valid_shift(shift: u8, chunk_bytes: u64) -> bool {
    (FLOOR_SHIFT..=MAX_SHIFT).contains(&shift)
        && (1u64 << shift) < chunk_bytes
        && chunk_bytes.is_multiple_of(1 << shift)
}

/// The pieces of `1 << shift` bytes a transfer of `total` bytes has.
pub fn count(total: u64, shift: u8) -> u64 {
    total.div_ceil(1 << shift)
}

/// The bytes piece `k` of `1 << shift` holds: `(offset, len)`.
pub fn span(k: u32, shift: u8, total: u64) -> (u64, u64) {
    let offset = (k as u64) << shift;
    (offset, (1u64 << shift).min(total.saturating_sub(offset)))
}

/// What asking for `pieces` of `1 << shift` again costs against the [`budget`]: their
/// bytes. (A receiver that asks for the 1-byte last piece over and over is bounded by
/// the rounds, at most `MAX_RESENDS`.)
pub fn cost(pieces: &[u32], shift: u8, total: u64) -> u64 {
    pieces.iter().map(|&k| span(k, shift, total).1).sum()
}

/// The chunk (of `chunk_bytes`) piece `k` of `1 << shift` lies in.
pub fn chunk_of(k: u32, shift: u8, chunk_bytes: u64) -> u32 {
    (((k as u64) << shift) / chunk_bytes) as u32
}

/// The pieces of `1 << to` that piece (or, with `from` the chunk's, chunk) `k` of
/// `1 << from` bytes is cut into, within a transfer of `total` bytes.
pub fn cut(k: u32, from: u64, to: u8, total: u64) -> std::ops::Range<u32> {
    let start = k as u64 * from;
    let end = (start + from).min(total);
    let first = start >> to;
    let last = end.div_ceil(1 << to);
    first as u32..last as u32
}

/// The receiver's request for pieces of one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceResend {
    pub round: u32,
    /// The pieces are `1 << shift` bytes.
    pub shift: u8,
    /// Increasing piece indices.
    pub pieces: Vec<u32>,
}

impl PieceResend {
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(PIECES_MAGIC)
    }

    /// The same pieces as a query for the sender's CRC32C of each ([`QUERY_MAGIC`]).
    pub fn encode_query(&self) -> Vec<u8> {
        self.encode_as(QUERY_MAGIC)
    }

    fn encode_as(&self, magic: [u8; 4]) -> Vec<u8> {
        encode_list(magic, self.round, self.shift, &self.pieces)
    }

    /// The fixed part, `(round, shift, count)`, checked against a transfer of `total`
    /// bytes in chunks of `chunk_bytes`: a shift that cuts its chunks, a count of at most
    /// its pieces (so a lying peer cannot make the reader allocate more).
    pub fn decode_head(
        buf: &[u8],
        total: u64,
        chunk_bytes: u64,
    ) -> Result<(u32, u8, u32), WireError> {
        PieceResend::decode_head_as(buf, PIECES_MAGIC, total, chunk_bytes)
    }

    /// As [`PieceResend::decode_head`], of a message with `magic` (a query's).
    pub fn decode_head_as(
        buf: &[u8],
        expected: [u8; 4],
        total: u64,
        chunk_bytes: u64,
    ) -> Result<(u32, u8, u32), WireError> {
        if buf.len() < REPLY_PREFIX_LEN {
            return Err(WireError::Short {
                got: buf.len(),
                need: REPLY_PREFIX_LEN,
            });
        }
        let magic = [buf[0], buf[1], buf[2], buf[3]];
        if magic != expected {
            return Err(WireError::BadMagic {
                got: magic,
                expected,
            });
        }
        let version = u16::from_le_bytes([buf[4], buf[5]]);
        if version != VERSION {
            return Err(WireError::UnsupportedVersion { got: version });
        }
        if buf[6] != 0 {
            return Err(WireError::UnknownFlags { flags: buf[6] });
        }
        let shift = buf[7];
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let (round, n) = (u32_at(8), u32_at(12));
        if !valid_shift(shift, chunk_bytes) {
            return Err(WireError::Inconsistent {
                what: "a piece request whose pieces are not a power of two of at least 4 KiB below the chunk size that divides it",
            });
        }
        if n == 0 || n as u64 > count(total, shift) || round == 0 {
            return Err(WireError::Inconsistent {
                what: "a piece request of no pieces, of more pieces than the transfer has, or of round 0",
            });
        }
        Ok((round, shift, n))
    }

    /// The `n` piece indices after the prefix: each below the transfer's pieces at
    /// `shift`, increasing.
    pub fn decode_pieces(
        round: u32,
        shift: u8,
        n: u32,
        body: &[u8],
        total: u64,
    ) -> Result<PieceResend, WireError> {
        if n == 0 || body.len() != n as usize * 4 {
            return Err(WireError::Inconsistent {
                what: "a piece list of another length than its count",
            });
        }
        let pieces: Vec<u32> = body
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let increasing = pieces.windows(2).all(|w| w[0] < w[1]);
        if !increasing
            || pieces
                .last()
                .is_some_and(|&k| k as u64 >= count(total, shift))
        {
            return Err(WireError::Inconsistent {
                what: "a piece list out of order or beyond the transfer",
            });
        }
        Ok(PieceResend {
            round,
            shift,
            pieces,
        })
    }
}

/// The sender's answer to a query of round `round`: `0` magic "GRDV", `4` version u16,
/// `6` reserved u16, `8` round u32, `12` count u32, `16` count CRC32C values u32.
pub fn encode_crcs(round: u32, crcs: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLY_PREFIX_LEN + 4 * crcs.len());
    out.extend_from_slice(&CRCS_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(&(crcs.len() as u32).to_le_bytes());
    for c in crcs {
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

/// The fixed part of an answer to the query of round `round` about `count` pieces: it
/// must be that round's and of that count (so nothing else is read).
pub fn decode_crcs_head(buf: &[u8], round: u32, count: u32) -> Result<(), WireError> {
    if buf.len() < REPLY_PREFIX_LEN {
        return Err(WireError::Short {
            got: buf.len(),
            need: REPLY_PREFIX_LEN,
        });
    }
    let magic = [buf[0], buf[1], buf[2], buf[3]];
    if magic != CRCS_MAGIC {
        return Err(WireError::BadMagic {
            got: magic,
            expected: CRCS_MAGIC,
        });
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    if version != VERSION {
        return Err(WireError::UnsupportedVersion { got: version });
    }
    let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
    if u32_at(8) != round || u32_at(12) != count {
        return Err(WireError::Inconsistent {
            what: "an answer to a query of pieces of another round or count",
        });
    }
    Ok(())
}

/// The CRC32C values of an answer's body.
pub fn decode_crcs(body: &[u8]) -> Vec<u32> {
    body.chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A piece request ([`PIECES_MAGIC`]) or query ([`QUERY_MAGIC`]) of `pieces`, encoded
/// from where the list lies (a round may name millions).
pub fn encode_list(magic: [u8; 4], round: u32, shift: u8, pieces: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLY_PREFIX_LEN + 4 * pieces.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(0);
    out.push(shift);
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for k in pieces {
        out.extend_from_slice(&k.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_cut_by_sixteen_down_to_the_floor() {
        assert_eq!(smaller(1 << 20), Some(16)); // 1 MiB as 64 KiB
        assert_eq!(smaller(1 << 16), Some(12)); // 64 KiB as 4 KiB
        assert_eq!(smaller(1 << 12), None); // the floor
        assert_eq!(smaller(32 << 10), Some(12)); // 32 KiB: a sixteenth is below the floor
        assert_eq!(smaller(3 << 19), Some(16)); // 1.5 MiB: 64 KiB pieces divide it
        assert_eq!(smaller(1_000_000), None); // 2^6 divides it: nothing of 4 KiB does
        assert_eq!(smaller(12_288), Some(12)); // 12 KiB as 4 KiB
        for unit in [1u64 << 20, 1 << 16, 32 << 10, 3 << 19, 12_288, 64 << 20] {
            let s = smaller(unit).unwrap();
            assert!(valid_shift(s, unit), "{unit}");
        }
        assert!(!valid_shift(11, 1 << 20));
        assert!(!valid_shift(20, 1 << 20));
        assert!(valid_shift(15, 3 << 18));
        assert!(!valid_shift(12, 1_000_000));
    }

    #[test]
    fn pieces_lie_inside_their_chunk_and_the_last_is_shorter() {
        let total = (3 << 20) + 5000;
        assert_eq!(count(total, 16), 49);
        assert_eq!(span(48, 16, total), (48 << 16, 5000));
        assert_eq!(chunk_of(47, 16, 1 << 20), 2);
        assert_eq!(chunk_of(48, 16, 1 << 20), 3);
        // Chunk 3 is the 5000-byte tail: one 64 KiB piece, two 4 KiB ones.
        assert_eq!(cut(3, 1 << 20, 16, total), 48..49);
        assert_eq!(cut(48, 1 << 16, 12, total), 768..770);
        assert_eq!(cut(1, 1 << 20, 16, total), 16..32);
        assert_eq!(cost(&[769], 12, total), 5000 - 4096);
        assert_eq!(cost(&[0, 1], 16, total), 2 << 16);
        assert_eq!(budget(1000), MIN_BUDGET);
        assert_eq!(budget(1 << 30), 1 << 30);
    }

    #[test]
    fn piece_requests_round_trip_and_refuse_what_does_not_fit_the_transfer() {
        let total = 64 << 20;
        let chunk = 1 << 20;
        let p = PieceResend {
            round: 2,
            shift: 12,
            pieces: vec![3, 70, 16383],
        };
        let bytes = p.encode();
        assert_eq!(&bytes[..4], b"GRDI");
        let (round, shift, n) = PieceResend::decode_head(&bytes, total, chunk).unwrap();
        let back =
            PieceResend::decode_pieces(round, shift, n, &bytes[REPLY_PREFIX_LEN..], total).unwrap();
        assert_eq!(back, p);
        // Beyond the transfer, out of order, a shift that does not cut the chunk.
        let beyond = PieceResend {
            pieces: vec![16384],
            ..p.clone()
        }
        .encode();
        assert!(PieceResend::decode_pieces(2, 12, 1, &beyond[16..], total).is_err());
        assert!(PieceResend::decode_pieces(2, 12, 2, &[1, 0, 0, 0, 0, 0, 0, 0], total).is_err());
        for shift in [11u8, 20, 40] {
            let bad = PieceResend { shift, ..p.clone() }.encode();
            assert!(
                PieceResend::decode_head(&bad, total, chunk).is_err(),
                "{shift}"
            );
        }
        // More pieces than the transfer has: refused before the list is read.
        let mut many = bytes.clone();
        many[12..16].copy_from_slice(&16385u32.to_le_bytes());
        assert!(PieceResend::decode_head(&many, total, chunk).is_err());
        let mut flags = bytes;
        flags[6] = 1;
        assert!(PieceResend::decode_head(&flags, total, chunk).is_err());
        // The query: the same layout under its own magic, not taken for a request.
        let q = p.encode_query();
        assert_eq!(&q[..4], b"GRDQ");
        assert!(PieceResend::decode_head(&q, total, chunk).is_err());
        assert_eq!(
            PieceResend::decode_head_as(&q, QUERY_MAGIC, total, chunk),
            Ok((2, 12, 3))
        );
        // Its answer: of that round and count only.
        let a = encode_crcs(2, &[7, 8, 9]);
        assert_eq!(decode_crcs_head(&a, 2, 3), Ok(()));
        assert!(decode_crcs_head(&a, 3, 3).is_err());
        assert!(decode_crcs_head(&a, 2, 4).is_err());
        assert_eq!(decode_crcs(&a[REPLY_PREFIX_LEN..]), [7, 8, 9]);
    }
}
