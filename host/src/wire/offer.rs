//! The offer: the [`Header`] a sender opens every transfer with (in the connect
//! request's private data over verbs, first on stream 0 over TCP), what it says of the
//! payload and its checks, its flags and hints; and `--raw`'s constants, the mode with no
//! offer at all.

use super::constants::{HEADER_MAGIC, MAX_DEPTH, MAX_RAILS, MAX_RESENDS, MAX_TRANSFERS, VERSION};
use super::error::{open, WireError};

pub const HEADER_LEN: usize = 32;
/// The immediate data of a `--raw` transfer (the seed's).
pub const RAW_IMM: u32 = 0x1234;
/// The reply a `--raw` receiver sends (rdma-core's `rdma_client` waits for 16 bytes).
pub const RAW_REPLY: [u8; 16] = *b"GRDM raw: got it";
/// Header flag: several transfers on one connection; their count is at byte 24.
pub const HEADER_FLAG_REPEAT: u8 = 0x01;
/// Header flag (TCP): a name message ([`encode_name`](super::encode_name)) follows the offer (`--name`).
pub const HEADER_FLAG_NAMED: u8 = 0x02;
/// Header flag (TCP): the transfer is striped over several rails: any chunk may come on
/// any stream, each stream ends a pass with an end marker, a chunk may arrive twice (a
/// failover resend), and the receiver names missing chunks in a [`Resend`](super::Resend) with
/// [`Resend::missing`](super::Resend::missing) (see `net::tcp::frames`). A receiver that predates it
/// rejects the offer ("unknown flags").
pub const HEADER_FLAG_STRIPED: u8 = 0x04;
/// Header hint: the sender marks solicited events (see the module documentation).
pub const HINT_SOLICITED: u8 = 0x01;
/// Header hint: the sender answers piece requests ([`super::pieces`]); a receiver that
/// predates it ignores it and asks for whole chunks.
pub const HINT_PIECES: u8 = 0x02;
/// Header hint (TCP): the sender keeps the connection after the ack and may offer its
/// next transfer on it (`wire::session`); a receiver that predates it closes, and the
/// sender opens a new connection for the next.
pub const HINT_SESSION: u8 = 0x04;
/// The resends a sender allows when it is not told (`--max-resends`): the most, so that
/// the rounds end by what they achieve (see `transfer::repair::Converge`), not by count.
pub const DEFAULT_MAX_RESENDS: u8 = super::MAX_RESENDS;

/// What the bytes of a transfer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Payload {
    /// The built-in pattern, `data[i] = 2*i` as `i32`: whole elements only.
    Pattern,
    /// The user's bytes (a file, standard input, a caller's buffer): any length.
    Opaque,
}

/// Which checks the receiver applies (`--verify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyMode {
    /// Every element against the built-in pattern (only for the pattern).
    Pattern,
    /// CRC32C of every chunk, computed by the sender, checked where the chunk landed;
    /// a failed chunk is sent again (`--max-resends`).
    Checksum,
    /// Both.
    Both,
    /// Neither: the receiver only counts bytes.
    Off,
}

impl VerifyMode {
    pub fn pattern(self) -> bool {
        matches!(self, VerifyMode::Pattern | VerifyMode::Both)
    }
    pub fn checksum(self) -> bool {
        matches!(self, VerifyMode::Checksum | VerifyMode::Both)
    }
    /// The default for a payload: the pattern is checked against itself, user data by
    /// its checksums.
    pub fn default_for(payload: Payload) -> VerifyMode {
        match payload {
            Payload::Pattern => VerifyMode::Pattern,
            Payload::Opaque => VerifyMode::Checksum,
        }
    }
    fn code(self) -> u8 {
        match self {
            VerifyMode::Off => 0,
            VerifyMode::Pattern => 1,
            VerifyMode::Checksum => 2,
            VerifyMode::Both => 3,
        }
    }
    fn from_code(code: u8) -> Option<VerifyMode> {
        Some(match code {
            0 => VerifyMode::Off,
            1 => VerifyMode::Pattern,
            2 => VerifyMode::Checksum,
            3 => VerifyMode::Both,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::Pattern => "pattern",
            VerifyMode::Checksum => "checksum",
            VerifyMode::Both => "both",
            VerifyMode::Off => "off",
        }
    }
}

/// What the sender does with the chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Two-sided: each chunk is a SEND into a receive the receiver posted.
    Send,
    /// One-sided: each chunk is an RDMA WRITE into the receiver's buffer.
    Write,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Send => 1,
            Op::Write => 2,
        }
    }

    fn from_code(code: u8) -> Option<Op> {
        match code {
            1 => Some(Op::Send),
            2 => Some(Op::Write),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
        }
    }
}

/// The transfer offer a sender puts into its connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub total_bytes: u64,
    pub chunk_bytes: u32,
    /// Work requests the sender keeps in flight; the receiver keeps as many receives
    /// posted.
    pub depth: u32,
    /// Transfers of `total_bytes` each on this connection (1: the classic single transfer;
    /// more only with [`HEADER_FLAG_REPEAT`]).
    pub transfers: u32,
    /// The sender sets the solicited-event flag as [`HINT_SOLICITED`] describes.
    pub solicited_events: bool,
    /// What the bytes are.
    pub payload: Payload,
    /// Which checks the receiver applies.
    pub verify: VerifyMode,
    /// Rounds of resends of failed chunks the sender allows (with checksums).
    pub max_resends: u8,
    /// A name message ([`encode_name`](super::encode_name)) follows the offer (TCP).
    pub named: bool,
    /// TCP: striped over several rails ([`HEADER_FLAG_STRIPED`]).
    pub striped: bool,
    /// The sender answers piece requests ([`HINT_PIECES`]).
    pub pieces: bool,
    /// The sender may offer another transfer on this connection ([`HINT_SESSION`]).
    pub session: bool,
    /// Striped: the rails of the connection (over verbs, the rails the sender will open:
    /// rail 0 is this connection, the others [`Join`](super::Join) it; over TCP, the
    /// rails whose sockets connected). Carried in byte 27; 0 where not striped.
    pub rails: u8,
}

impl Header {
    /// A checked header for the pattern.
    pub fn new(
        op: Op,
        total_bytes: u64,
        chunk_bytes: u64,
        depth: u32,
    ) -> Result<Header, WireError> {
        Header::of(op, total_bytes, chunk_bytes, depth, Payload::Pattern)
    }

    /// A checked header for `payload` (checked as its default [`VerifyMode`]; see
    /// [`with_payload`](Header::with_payload)).
    pub fn of(
        op: Op,
        total_bytes: u64,
        chunk_bytes: u64,
        depth: u32,
        payload: Payload,
    ) -> Result<Header, WireError> {
        if chunk_bytes > u32::MAX as u64 {
            return Err(WireError::ChunkLargerThanTotal {
                chunk: chunk_bytes,
                total: total_bytes,
            });
        }
        let header = Header {
            op,
            total_bytes,
            chunk_bytes: chunk_bytes as u32,
            depth,
            transfers: 1,
            solicited_events: false,
            payload,
            verify: VerifyMode::default_for(payload),
            max_resends: DEFAULT_MAX_RESENDS,
            named: false,
            striped: false,
            pieces: false,
            session: false,
            rails: 0,
        };
        header.validate()?;
        Ok(header)
    }

    /// The same offer for another payload, checked by `verify`, with up to `max_resends`
    /// rounds of resends.
    pub fn with_payload(
        self,
        payload: Payload,
        verify: VerifyMode,
        max_resends: u8,
    ) -> Result<Header, WireError> {
        let header = Header {
            payload,
            verify,
            max_resends,
            ..self
        };
        header.validate()?;
        Ok(header)
    }

    /// The same offer, announcing a name message ([`encode_name`](super::encode_name)) after it.
    pub fn with_name(self) -> Header {
        Header {
            named: true,
            ..self
        }
    }

    /// The same offer, striped over several rails ([`HEADER_FLAG_STRIPED`]).
    pub fn with_striped(self) -> Header {
        Header {
            striped: true,
            ..self
        }
    }

    /// The same offer, striped over `rails` rails.
    pub fn with_rails(self, rails: u8) -> Result<Header, WireError> {
        let header = Header {
            striped: true,
            rails,
            ..self
        };
        header.validate()?;
        Ok(header)
    }

    /// The same offer, answering piece requests ([`HINT_PIECES`]).
    pub fn with_pieces(self) -> Header {
        Header {
            pieces: true,
            ..self
        }
    }

    /// The same offer, from a sender that keeps the connection for its next offer
    /// ([`HINT_SESSION`]).
    pub fn with_session(self) -> Header {
        Header {
            session: true,
            ..self
        }
    }

    /// The same offer, promising solicited events ([`HINT_SOLICITED`]).
    pub fn with_solicited_events(self) -> Header {
        Header {
            solicited_events: true,
            ..self
        }
    }

    /// The same offer, `transfers` times on one connection (1: a single transfer).
    pub fn with_transfers(self, transfers: u32) -> Result<Header, WireError> {
        let header = Header { transfers, ..self };
        header.validate()?;
        Ok(header)
    }

    /// Whether the header asks for several transfers on one connection.
    pub fn repeats(&self) -> bool {
        self.transfers > 1
    }

    fn validate(&self) -> Result<(), WireError> {
        let total = self.total_bytes;
        let chunk = self.chunk_bytes as u64;
        if total == 0 {
            return Err(WireError::ZeroSize);
        }
        if self.payload == Payload::Pattern && !total.is_multiple_of(4) {
            return Err(WireError::NotWholeElements { total });
        }
        if self.payload == Payload::Opaque && self.verify.pattern() {
            return Err(WireError::PatternOfOpaque);
        }
        if self.max_resends > MAX_RESENDS {
            return Err(WireError::TooManyResends {
                count: self.max_resends,
            });
        }
        if chunk == 0 {
            return Err(WireError::ZeroChunk);
        }
        if chunk > total {
            return Err(WireError::ChunkLargerThanTotal { chunk, total });
        }
        let chunks = total.div_ceil(chunk);
        if chunks > u32::MAX as u64 {
            return Err(WireError::TooManyChunks { chunks });
        }
        if self.depth == 0 || self.depth > MAX_DEPTH {
            return Err(WireError::BadDepth { depth: self.depth });
        }
        if self.transfers == 0 || self.transfers > MAX_TRANSFERS {
            return Err(WireError::BadTransferCount {
                count: self.transfers,
            });
        }
        if self.rails > 0 && (!self.striped || self.rails > MAX_RAILS) {
            return Err(WireError::Inconsistent {
                what: "a rail count needs the striped flag, and at most 32 rails",
            });
        }
        Ok(())
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        self.encode_with_version(VERSION)
    }

    /// For tests of the receiver's version check only.
    pub fn encode_with_version(&self, version: u16) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&HEADER_MAGIC);
        out[4..6].copy_from_slice(&version.to_le_bytes());
        out[6] = self.op.code();
        // A single transfer keeps the original encoding (flags 0, bytes 24.. zero), so
        // receivers that predate the flag take it as before.
        out[7] = if self.repeats() {
            HEADER_FLAG_REPEAT
        } else {
            0
        } | if self.named { HEADER_FLAG_NAMED } else { 0 }
            | if self.striped { HEADER_FLAG_STRIPED } else { 0 };
        out[8..16].copy_from_slice(&self.total_bytes.to_le_bytes());
        out[16..20].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        out[20..24].copy_from_slice(&self.depth.to_le_bytes());
        // Transfers in bytes 24..27 (with the repeat flag; 0 for one), rails in 27.
        let transfers = if self.repeats() { self.transfers } else { 0 };
        let word = (transfers & 0x00ff_ffff) | (self.rails as u32) << 24;
        out[24..28].copy_from_slice(&word.to_le_bytes());
        if self.solicited_events {
            out[28] = HINT_SOLICITED;
        }
        if self.pieces {
            out[28] |= HINT_PIECES;
        }
        if self.session {
            out[28] |= HINT_SESSION;
        }
        out[29] = match self.payload {
            Payload::Pattern => 0,
            Payload::Opaque => 1,
        };
        out[30] = self.verify.code();
        out[31] = self.max_resends;
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Header, WireError> {
        let mut r = open(buf, HEADER_MAGIC, HEADER_LEN)?;
        let code = r.u8();
        let op = Op::from_code(code).ok_or(WireError::UnknownOp { code })?;
        let flags = r.u8();
        if flags & !(HEADER_FLAG_REPEAT | HEADER_FLAG_NAMED | HEADER_FLAG_STRIPED) != 0 {
            return Err(WireError::UnknownFlags { flags });
        }
        let total_bytes = r.u64();
        let chunk_bytes = r.u32();
        let depth = r.u32();
        let word = r.u32();
        let hints = r.u8();
        let payload = match r.u8() {
            0 => Payload::Pattern,
            1 => Payload::Opaque,
            code => return Err(WireError::UnknownPayload { code }),
        };
        let code = r.u8();
        let verify = VerifyMode::from_code(code).ok_or(WireError::UnknownVerify { code })?;
        let max_resends = r.u8();
        let striped = flags & HEADER_FLAG_STRIPED != 0;
        let (transfers, rails) = (word & 0x00ff_ffff, (word >> 24) as u8);
        let transfers = if flags & HEADER_FLAG_REPEAT != 0 {
            if transfers < 2 {
                return Err(WireError::BadTransferCount { count: transfers });
            }
            transfers
        } else if transfers != 0 {
            return Err(WireError::Inconsistent {
                what: "a transfer count without the repeat flag",
            });
        } else {
            1
        };
        let header = Header {
            op,
            total_bytes,
            chunk_bytes,
            depth,
            transfers,
            solicited_events: hints & HINT_SOLICITED != 0,
            payload,
            verify,
            max_resends,
            named: flags & HEADER_FLAG_NAMED != 0,
            striped,
            pieces: hints & HINT_PIECES != 0,
            session: hints & HINT_SESSION != 0,
            rails,
        };
        header.validate()?;
        Ok(header)
    }

    pub fn chunks(&self) -> u64 {
        self.total_bytes.div_ceil(self.chunk_bytes as u64)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::wire::RejectReason;

    /// The seed's offer, which the other families' tests carry too.
    pub(crate) fn seed_header() -> Header {
        Header::new(Op::Send, 16384, 16384, 16).unwrap()
    }

    #[test]
    fn header_round_trips_and_fits_in_rc_private_data() {
        for h in [
            seed_header(),
            Header::new(Op::Write, 1 << 30, 1 << 20, 4096).unwrap(),
            Header::new(Op::Send, 4, 4, 1).unwrap(),
            Header::new(Op::Write, 256 << 20, 3, 1).unwrap(),
        ] {
            let bytes = h.encode();
            assert_eq!(Header::decode(&bytes), Ok(h));
        }
        const { assert!(HEADER_LEN <= 48) };
    }

    #[test]
    fn header_accepts_cm_padding() {
        let mut padded = [0u8; 196];
        padded[..HEADER_LEN].copy_from_slice(&seed_header().encode());
        assert_eq!(Header::decode(&padded), Ok(seed_header()));
    }

    #[test]
    fn header_bad_magic_is_named() {
        let e = Header::decode(&[0u8; 56]).unwrap_err();
        assert_eq!(
            e,
            WireError::BadMagic {
                got: [0; 4],
                expected: HEADER_MAGIC
            }
        );
        assert!(e.to_string().contains("--raw"), "{e}");
    }

    #[test]
    fn header_bad_version() {
        for version in [1, 2, 4] {
            let bytes = seed_header().encode_with_version(version);
            assert_eq!(
                Header::decode(&bytes),
                Err(WireError::UnsupportedVersion { got: version })
            );
            // The version is reported even when the rest is short.
            assert_eq!(
                Header::decode(&bytes[..6]),
                Err(WireError::UnsupportedVersion { got: version })
            );
        }
    }

    #[test]
    fn payload_and_checks_travel_in_the_last_three_bytes() {
        let h = Header::new(Op::Send, 4097, 4096, 8).unwrap_err();
        assert_eq!(h, WireError::NotWholeElements { total: 4097 });
        let opaque = Header::new(Op::Send, 4096, 4096, 8)
            .unwrap()
            .with_payload(Payload::Opaque, VerifyMode::Checksum, 5)
            .unwrap();
        let odd = Header {
            total_bytes: 4097,
            ..opaque
        };
        let bytes = odd.encode();
        assert_eq!(&bytes[29..32], &[1, 2, 5]);
        assert_eq!(Header::decode(&bytes), Ok(odd), "any length for user data");
        let named = odd.with_name();
        assert_eq!(Header::decode(&named.encode()), Ok(named));
        // The pattern check of user data, too many resends, unknown codes: refused.
        assert_eq!(
            opaque.with_payload(Payload::Opaque, VerifyMode::Both, 1),
            Err(WireError::PatternOfOpaque)
        );
        assert_eq!(
            opaque.with_payload(Payload::Opaque, VerifyMode::Off, MAX_RESENDS + 1),
            Err(WireError::TooManyResends {
                count: MAX_RESENDS + 1
            })
        );
        for (at, value, error) in [
            (29, 2, WireError::UnknownPayload { code: 2 }),
            (30, 4, WireError::UnknownVerify { code: 4 }),
        ] {
            let mut bad = bytes;
            bad[at] = value;
            assert_eq!(Header::decode(&bad), Err(error));
        }
    }

    #[test]
    fn a_striped_offer_round_trips_and_says_so_in_its_flags() {
        let h = seed_header().with_striped();
        let bytes = h.encode();
        assert_eq!(bytes[7], HEADER_FLAG_STRIPED);
        assert_eq!(Header::decode(&bytes), Ok(h));
    }

    #[test]
    fn header_short_buffers() {
        let bytes = seed_header().encode();
        for len in [0, 3, 5, 6, 31] {
            assert!(
                matches!(Header::decode(&bytes[..len]), Err(WireError::Short { got, need: HEADER_LEN }) if got == len),
                "len {len}"
            );
        }
    }

    #[test]
    fn header_unknown_op_and_flags() {
        let mut bytes = seed_header().encode();
        bytes[6] = 9;
        assert_eq!(
            Header::decode(&bytes),
            Err(WireError::UnknownOp { code: 9 })
        );
        let mut bytes = seed_header().encode();
        bytes[7] = 0x80;
        assert_eq!(
            Header::decode(&bytes),
            Err(WireError::UnknownFlags { flags: 0x80 })
        );
    }

    fn with(total: u64, chunk: u32, depth: u32) -> [u8; HEADER_LEN] {
        Header {
            op: Op::Send,
            total_bytes: total,
            chunk_bytes: chunk,
            depth,
            transfers: 1,
            solicited_events: false,
            payload: Payload::Pattern,
            verify: VerifyMode::Pattern,
            max_resends: DEFAULT_MAX_RESENDS,
            named: false,
            striped: false,
            pieces: false,
            session: false,
            rails: 0,
        }
        .encode()
    }

    #[test]
    fn the_solicited_hint_lives_in_a_byte_old_receivers_ignore() {
        let h = seed_header().with_solicited_events();
        let bytes = h.encode();
        assert_eq!(
            bytes[7], 0,
            "no flag: receivers that predate the hint take it"
        );
        assert_eq!(bytes[28], HINT_SOLICITED);
        assert_eq!(Header::decode(&bytes), Ok(h));
        // What a receiver before the hint decodes: everything but the hint, unchanged.
        let mut without = bytes;
        without[28] = 0;
        assert_eq!(Header::decode(&without), Ok(seed_header()));
        // Unknown hint bits are ignored.
        let mut future = bytes;
        future[28] = 0xff;
        assert_eq!(Header::decode(&future), Ok(h.with_pieces().with_session()));
        // The piece and session hints beside it, in the same byte.
        let pieces = seed_header().with_pieces();
        assert_eq!(pieces.encode()[28], HINT_PIECES);
        assert_eq!(Header::decode(&pieces.encode()), Ok(pieces));
        let session = seed_header().with_session();
        assert_eq!(session.encode()[28], HINT_SESSION);
        assert_eq!(Header::decode(&session.encode()), Ok(session));
        // Together with the repeat flag.
        let both = h.with_transfers(10).unwrap();
        assert_eq!(Header::decode(&both.encode()), Ok(both));
    }

    #[test]
    fn a_single_transfer_says_no_count_and_a_count_without_its_flag_is_refused() {
        // A single unstriped transfer: flags 0, bytes 24..28 zero.
        let bytes = seed_header().encode();
        let mut expected = [0u8; HEADER_LEN];
        expected[0..4].copy_from_slice(b"GRDM");
        expected[4..6].copy_from_slice(&VERSION.to_le_bytes());
        expected[29..32].copy_from_slice(&[0, 1, DEFAULT_MAX_RESENDS]);
        expected[6] = 1;
        expected[8..16].copy_from_slice(&16384u64.to_le_bytes());
        expected[16..20].copy_from_slice(&16384u32.to_le_bytes());
        expected[20..24].copy_from_slice(&16u32.to_le_bytes());
        assert_eq!(bytes, expected);
        assert_eq!(Header::decode(&bytes).unwrap().transfers, 1);
        // A transfer count without the repeat flag, or a rail count without the striped
        // one, is a lie, not something to ignore.
        let mut count = bytes;
        count[24] = 7;
        assert!(Header::decode(&count).is_err());
        let mut rails = bytes;
        rails[27] = 2;
        assert!(Header::decode(&rails).is_err());
    }

    #[test]
    fn repeated_transfers_round_trip_with_the_flag() {
        let h = seed_header().with_transfers(1000).unwrap();
        assert!(h.repeats());
        let bytes = h.encode();
        assert_eq!(bytes[7], HEADER_FLAG_REPEAT);
        assert_eq!(&bytes[24..28], &1000u32.to_le_bytes());
        assert_eq!(Header::decode(&bytes), Ok(h));
        let w = Header::new(Op::Write, 1 << 20, 1 << 20, 1)
            .unwrap()
            .with_transfers(MAX_TRANSFERS)
            .unwrap();
        assert_eq!(Header::decode(&w.encode()), Ok(w));
        // with_transfers(1) is the plain header.
        assert_eq!(seed_header().with_transfers(1), Ok(seed_header()));
    }

    #[test]
    fn repeat_flag_with_a_bad_count_is_refused() {
        for count in [0u32, 1, MAX_TRANSFERS + 1] {
            let mut bytes = seed_header().encode();
            bytes[7] = HEADER_FLAG_REPEAT;
            bytes[24..28].copy_from_slice(&count.to_le_bytes());
            assert_eq!(
                Header::decode(&bytes),
                Err(WireError::BadTransferCount { count }),
                "{count}"
            );
        }
        assert!(seed_header().with_transfers(0).is_err());
        // The reason survives the trip through a reject.
        let r = RejectReason::BadHeader(WireError::BadTransferCount { count: 0 });
        assert_eq!(RejectReason::decode(&r.encode()), Some(r));
        // A receiver that predates the flag answers "unknown flags 0x01": what an old
        // decoder (flags must be 0) does with the new header.
        let bytes = seed_header().with_transfers(2).unwrap().encode();
        assert_ne!(bytes[7], 0);
    }

    #[test]
    fn header_size_checks() {
        assert_eq!(Header::decode(&with(0, 4, 1)), Err(WireError::ZeroSize));
        assert_eq!(
            Header::decode(&with(6, 4, 1)),
            Err(WireError::NotWholeElements { total: 6 })
        );
        assert_eq!(Header::decode(&with(16, 0, 1)), Err(WireError::ZeroChunk));
        assert_eq!(
            Header::decode(&with(16, 32, 1)),
            Err(WireError::ChunkLargerThanTotal {
                chunk: 32,
                total: 16
            })
        );
        assert_eq!(
            Header::decode(&with(16, 4, 0)),
            Err(WireError::BadDepth { depth: 0 })
        );
        assert_eq!(
            Header::decode(&with(16, 4, MAX_DEPTH + 1)),
            Err(WireError::BadDepth {
                depth: MAX_DEPTH + 1
            })
        );
        let many = (u32::MAX as u64 + 1) * 4;
        assert_eq!(
            Header::decode(&with(many, 1, 1)),
            Err(WireError::TooManyChunks { chunks: many })
        );
        assert!(Header::new(Op::Send, 8 << 30, 5 << 30, 1).is_err());
    }

    #[test]
    fn a_striped_header_carries_its_rail_count_beside_its_transfers() {
        let h = seed_header().with_rails(3).unwrap();
        let bytes = h.encode();
        assert_eq!(bytes[7] & HEADER_FLAG_STRIPED, HEADER_FLAG_STRIPED);
        assert_eq!(bytes[27], 3);
        assert_eq!(Header::decode(&bytes), Ok(h));
        // Striped and repeated (--reuse-connection over rails): both counts travel.
        let both = h.with_transfers(1000).unwrap();
        let b = both.encode();
        assert_eq!(
            (b[27], u32::from_le_bytes([b[24], b[25], b[26], 0])),
            (3, 1000)
        );
        assert_eq!(Header::decode(&b), Ok(both));
        // Lies: too many rails.
        assert!(seed_header().with_rails(MAX_RAILS + 1).is_err());
        let mut bytes = h.encode();
        bytes[27] = MAX_RAILS + 1;
        assert!(Header::decode(&bytes).is_err());
    }
}
