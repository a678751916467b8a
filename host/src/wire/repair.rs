//! The repair of chunks: the receiver's [`Resend`] of chunks that failed their checksum
//! (or never came), and the [`ChunkChecksums`] a verbs sender sends beside the data.

use super::constants::{CHECKSUMS_MAGIC, RESEND_MAGIC, VERSION};
use super::error::{open, WireError};

/// The receiver's request to send chunks again: their checksums failed where they
/// landed. Or, with `last`, the chunks that still failed when the sender's
/// `--max-resends` was used up (an ack with [`AckStatus::ChecksumFailed`](super::AckStatus::ChecksumFailed) follows).
///
/// With `missing` (striped TCP transfers, [`HEADER_FLAG_STRIPED`](super::HEADER_FLAG_STRIPED)): the chunks that did
/// not arrive at all by the end of a pass (written into a rail that failed), to send
/// again on the rails left; counted in rounds of their own, apart from the checksum
/// rounds.
///
/// Layout: `0` magic "GRDE", `4` version u16, `6` flags u8 (0x01 last, 0x02 missing),
/// `7` reserved, `8` round u32 (from 1), `12` count u32, `16` count chunk indices u32,
/// increasing. Over TCP it comes on stream 0 where the ack would; a sender reads
/// [`REPLY_PREFIX_LEN`] bytes and tells the two apart by their magic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resend {
    pub round: u32,
    pub last: bool,
    pub missing: bool,
    pub chunks: Vec<u32>,
}

/// The first bytes of a reply after the data: a [`Resend`]'s fixed part, or the start
/// of an [`Ack`](super::Ack).
pub const REPLY_PREFIX_LEN: usize = 16;
const RESEND_LAST: u8 = 1;
const RESEND_MISSING: u8 = 2;

impl Resend {
    pub fn encode(&self) -> Vec<u8> {
        Resend::encode_list(self.round, self.last, self.missing, &self.chunks)
    }

    /// A `Resend` of `chunks` (borrowed: a round's list may name a million chunks, and
    /// is encoded from where it lies, not copied into a value first).
    pub fn encode_list(round: u32, last: bool, missing: bool, chunks: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(REPLY_PREFIX_LEN + 4 * chunks.len());
        out.extend_from_slice(&RESEND_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(if last { RESEND_LAST } else { 0 } | if missing { RESEND_MISSING } else { 0 });
        out.push(0);
        out.extend_from_slice(&round.to_le_bytes());
        out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
        for c in chunks {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    /// The fixed part: `(round, last, count)`, the count checked against the transfer's
    /// `chunks` (so a lying peer cannot make the reader allocate more).
    pub fn decode_prefix(buf: &[u8], chunks: u64) -> Result<(u32, bool, u32), WireError> {
        Resend::decode_head(buf, chunks).map(|(round, flags, count)| (round, flags.0, count))
    }

    /// As [`Resend::decode_prefix`], with both flags: `(round, (last, missing), count)`.
    pub fn decode_head(buf: &[u8], chunks: u64) -> Result<(u32, (bool, bool), u32), WireError> {
        let mut r = open(buf, RESEND_MAGIC, REPLY_PREFIX_LEN)?;
        let flags = r.u8();
        if flags & !(RESEND_LAST | RESEND_MISSING) != 0 {
            return Err(WireError::UnknownFlags { flags });
        }
        let _reserved = r.u8();
        let round = r.u32();
        let count = r.u32();
        if count == 0 || count as u64 > chunks || round == 0 {
            return Err(WireError::Inconsistent {
                what: "a resend request of no chunks, of more chunks than the transfer has, or of round 0",
            });
        }
        let last = flags & RESEND_LAST != 0;
        Ok((round, (last, flags & RESEND_MISSING != 0), count))
    }

    /// The `count` chunk indices after the prefix: each below `chunks`, increasing.
    pub fn decode_chunks(
        round: u32,
        last: bool,
        count: u32,
        body: &[u8],
        chunks: u64,
    ) -> Result<Resend, WireError> {
        if count == 0 || body.len() != count as usize * 4 {
            return Err(WireError::Inconsistent {
                what: "a resend list of another length than its count",
            });
        }
        let list: Vec<u32> = body
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let increasing = list.windows(2).all(|w| w[0] < w[1]);
        if !increasing || list.last().is_some_and(|&c| c as u64 >= chunks) {
            return Err(WireError::Inconsistent {
                what: "a resend list out of order or beyond the transfer",
            });
        }
        Ok(Resend {
            round,
            last,
            missing: false,
            chunks: list,
        })
    }
}

/// CRC32C of chunks `first..first + crcs.len()` of a transfer, for a transport that
/// cannot put a chunk's checksum beside it (verbs: a SEND after the data).
///
/// Layout: `0` magic "GRDC", `4` version u16, `6` reserved u16, `8` first chunk u32,
/// `12` count u32, `16` count CRC32C values u32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkChecksums {
    pub first: u32,
    pub crcs: Vec<u32>,
}

pub const CHECKSUMS_PREFIX_LEN: usize = 16;

impl ChunkChecksums {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CHECKSUMS_PREFIX_LEN + 4 * self.crcs.len());
        out.extend_from_slice(&CHECKSUMS_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&(self.crcs.len() as u32).to_le_bytes());
        for c in &self.crcs {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out
    }

    /// Checked against the transfer's `chunks`: the range must lie inside it, and the
    /// message hold exactly its values.
    pub fn decode(buf: &[u8], chunks: u64) -> Result<ChunkChecksums, WireError> {
        let mut r = open(buf, CHECKSUMS_MAGIC, CHECKSUMS_PREFIX_LEN)?;
        let _reserved = r.u16();
        let first = r.u32();
        let count = r.u32();
        let body = &buf[CHECKSUMS_PREFIX_LEN..];
        let fits = (first as u64)
            .checked_add(count as u64)
            .is_some_and(|end| end <= chunks);
        if !fits || body.len() != 4 * count as usize {
            return Err(WireError::Inconsistent {
                what: "chunk checksums outside the transfer or of the wrong length",
            });
        }
        Ok(ChunkChecksums {
            first,
            crcs: body
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resend_requests_round_trip_and_a_lying_count_is_refused() {
        let r = Resend {
            round: 2,
            last: false,
            missing: false,
            chunks: vec![0, 7, 4095],
        };
        let bytes = r.encode();
        assert_eq!(bytes.len(), REPLY_PREFIX_LEN + 12);
        let (round, last, count) = Resend::decode_prefix(&bytes, 4096).unwrap();
        assert_eq!((round, last, count), (2, false, 3));
        let back =
            Resend::decode_chunks(round, last, count, &bytes[REPLY_PREFIX_LEN..], 4096).unwrap();
        assert_eq!(back, r);
        // More chunks than the transfer has, or none, or round 0: refused before reading on.
        assert!(Resend::decode_prefix(&bytes, 2).is_err());
        let none = Resend {
            chunks: vec![],
            ..r.clone()
        }
        .encode();
        assert!(Resend::decode_prefix(&none, 4096).is_err());
        // Indices beyond the transfer, repeated or out of order.
        for list in [vec![4096u32], vec![3, 3], vec![5, 1]] {
            let body: Vec<u8> = list.iter().flat_map(|c| c.to_le_bytes()).collect();
            assert!(
                Resend::decode_chunks(1, false, list.len() as u32, &body, 4096).is_err(),
                "{list:?}"
            );
        }
        let last = Resend {
            last: true,
            ..r.clone()
        };
        assert!(Resend::decode_prefix(&last.encode(), 4096).unwrap().1);
        let missing = Resend { missing: true, ..r };
        let (_, flags, _) = Resend::decode_head(&missing.encode(), 4096).unwrap();
        assert_eq!(flags, (false, true));
        let mut unknown = missing.encode();
        unknown[6] = 0x04;
        assert!(Resend::decode_head(&unknown, 4096).is_err());
    }

    #[test]
    fn chunk_checksums_round_trip_inside_the_transfer_only() {
        let c = ChunkChecksums {
            first: 10,
            crcs: vec![0xe306_9283, 1, 2],
        };
        let bytes = c.encode();
        assert_eq!(ChunkChecksums::decode(&bytes, 13), Ok(c));
        assert!(ChunkChecksums::decode(&bytes, 12).is_err());
        assert!(ChunkChecksums::decode(&bytes[..bytes.len() - 1], 13).is_err());
    }
}
