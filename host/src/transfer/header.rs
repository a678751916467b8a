//! The wire formats: every byte that crosses between sender and receiver outside the data
//! itself is encoded and decoded here, and nowhere else.
//!
//! All integers are little-endian. The messages, each starting with a 4-byte magic and a
//! `u16` protocol version ([`VERSION`]):
//!
//! | message | carried in | magic | bytes |
//! |---|---|---|---|
//! | [`Header`]: the transfer offer | the connect request's private data | `GRDM` | 32 |
//! | [`AcceptInfo`]: where to write | the accept's private data | `GRDA` | 28 |
//! | [`RejectReason`]: why not | the reject's private data | `GRDR` | 28 |
//! | [`Ack`]: the verification result | a SEND from receiver to sender after the data | `GRDK` | 56 |
//! | [`Resend`]: chunks whose CRC32C failed, to send again | instead of the ack | `GRDE` | 16 + 4/chunk |
//! | [`ChunkChecksums`]: CRC32C of chunks (verbs) | a SEND from sender to receiver | `GRDC` | 16 + 4/chunk |
//! | name (`--name`, [`encode_name`]) | after the offer (TCP, header flag 0x02) | `GRDF` | 8 + name |
//! | [`Challenge`]: a nonce to prove the key over (`--key-file`, TCP) | the answer to an offer | `GRDN` | 28 |
//! | [`Proof`]: HMAC-SHA256 over the offer and the nonce (TCP) | the sender's reply to a challenge | `GRDP` | 40 |
//!
//! Header layout (RC connect private data holds at most 56 bytes; this uses 32):
//!
//! ```text
//!  0  magic "GRDM"        4  version u16      6  op u8 (1 send, 2 write)   7  flags u8
//!  8  total bytes u64    16  chunk bytes u32  20  depth u32 (work requests in flight)
//! 24  transfers u32 (only with flag 0x01; else reserved)   28  hints u8
//! 29  payload u8 (0 pattern, 1 opaque)   30  verify u8 (0 off, 1 pattern, 2 checksum,
//!     3 both)   31  max resends u8
//! ```
//!
//! **Version 2** (this one) added the payload kind (the built-in pattern, whole `i32`s;
//! or the user's bytes, any length), the checks (`--verify`), the resend bound, the name
//! message, CRC32C per chunk, [`Resend`] and the ack's digest. Every message carries the
//! version; a receiver answers a version-1 offer with a reject in version 1, which that
//! sender decodes ("protocol version 1 is not supported"), and a version-2 sender names
//! a version-1 receiver's reject as [`RejectReason::OldPeer`]. `--raw` is unchanged.
//!
//! Header flags: `0x01` ([`HEADER_FLAG_REPEAT`]) = several transfers on this one
//! connection (`--reuse-connection`): the count is at byte 24 (at least 2); the sender
//! waits for each transfer's ack before it starts the next, and the receiver verifies
//! and acks each. Without the flag a connection carries one transfer, as before, and a
//! receiver that does not know the flag rejects the offer ("unknown flags 0x01").
//!
//! Hints (byte 28) are promises a receiver may use and may ignore; receivers that
//! predate them ignore the byte (it was reserved), and unknown hint bits are ignored.
//! `0x01` ([`HINT_SOLICITED`]): the sender sets the solicited-event flag on every
//! signaled data request (at least one in every quarter window) and on the last chunk,
//! so the receiver may sleep until a solicited completion instead of waking for each
//! (Soft-RoCE does the notification on the sender's CPU: 64 KiB SENDs went from 47 to
//! 73 MB/s, see tests/softroce/BENCH.md).
//!
//! The CM pads private data with zeros to its fixed size, so decoders accept (and
//! ignore) trailing bytes.
//!
//! Immediate-data convention (see `sender.rs`): the immediate of a `*_WITH_IMM` data
//! request is the number of chunks delivered up to and including it (chunk index + 1),
//! counted within its transfer.
//!
//! Ack layout: `0` magic, `4` version, `6` status u8, `7` flags u8 (0x01 verification
//! present, 0x02 first mismatch present, 0x04 crc32 present, 0x08 verify time present),
//! `8` received bytes u64, `16` elements u64, `24` mismatches u64, `32` first mismatch
//! u64, `40` crc32 u32, `44` the receiver's verification time in microseconds u32
//! (only with flag 0x08, which a receiver sets only for senders that set a header flag,
//! so senders that predate it never see it), `48` CRC32C digest of the whole transfer
//! u32 (flag 0x10), `52` chunks repaired u32. Statuses: 0 verified, 1 mismatch, 2 verify
//! failed, 3 too slow, 4 checksum failed (after the resends), 5 not stored.

use crate::memory::Verification;
use crate::server::key::NONCE_LEN;
use crate::transfer::units::{format_bytes, format_bytes_apart};

pub const VERSION: u16 = 2;
/// Versions a receiver answers with a reject its sender can decode (see
/// [`RejectReason::encode`]): the old layout of the reject is the same.
pub const OLDEST_VERSION: u16 = 1;
pub const HEADER_MAGIC: [u8; 4] = *b"GRDM";
pub const ACCEPT_MAGIC: [u8; 4] = *b"GRDA";
pub const REJECT_MAGIC: [u8; 4] = *b"GRDR";
pub const ACK_MAGIC: [u8; 4] = *b"GRDK";
pub const HEADER_LEN: usize = 32;
pub const ACCEPT_LEN: usize = 28;
pub const REJECT_LEN: usize = 28;
pub const ACK_LEN: usize = 56;
/// Most work requests a sender may keep in flight (and a receiver keeps posted).
pub const MAX_DEPTH: u32 = 4096;
/// The immediate data of a `--raw` transfer (the seed's).
pub const RAW_IMM: u32 = 0x1234;
/// The reply a `--raw` receiver sends (rdma-core's `rdma_client` waits for 16 bytes).
pub const RAW_REPLY: [u8; 16] = *b"GRDM raw: got it";
/// Header flag: several transfers on one connection; their count is at byte 24.
pub const HEADER_FLAG_REPEAT: u8 = 0x01;
/// Header flag (TCP): a [`NameMessage`] follows the offer (`--name`).
pub const HEADER_FLAG_NAMED: u8 = 0x02;
/// Header flag (TCP): the transfer is striped over several rails: any chunk may come on
/// any stream, each stream ends a pass with an end marker, a chunk may arrive twice (a
/// failover resend), and the receiver names missing chunks in a [`Resend`] with
/// [`Resend::missing`] (see `transport::tcp::frames`). A receiver that predates it
/// rejects the offer ("unknown flags").
pub const HEADER_FLAG_STRIPED: u8 = 0x04;
/// Most rails of one striped verbs transfer (the rail count is a byte; 8 covers the NICs
/// of a GPU server).
pub const MAX_VERBS_RAILS: u8 = 8;
pub const JOIN_MAGIC: [u8; 4] = *b"GRDJ";
pub const JOIN_LEN: usize = 16;
pub const STRIPED_ACCEPT_LEN: usize = ACCEPT_LEN + 8;
/// Header hint: the sender marks solicited events (see the module documentation).
pub const HINT_SOLICITED: u8 = 0x01;
/// Most transfers one connection may carry.
pub const MAX_TRANSFERS: u32 = 1 << 20;
/// Most rounds of resends a sender may ask for (`--max-resends`).
pub const MAX_RESENDS: u8 = 16;
/// The resends a sender allows when it is not told (`--max-resends`).
pub const DEFAULT_MAX_RESENDS: u8 = 3;

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

/// Why bytes from the peer could not be decoded (or a header not be built).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message too short: {got} bytes, need {need}")]
    Short { got: usize, need: usize },
    /// `expected` says which message was awaited: the words name it (a name message
    /// with another magic is no "transfer header", and `--raw` has nothing to do with it).
    #[error("{}", bad_magic_words(*got, *expected))]
    BadMagic { got: [u8; 4], expected: [u8; 4] },
    #[error("protocol version {got} is not supported (this side speaks version {VERSION})")]
    UnsupportedVersion { got: u16 },
    #[error("unknown operation code {code}")]
    UnknownOp { code: u8 },
    #[error("unknown flags {flags:#04x}")]
    UnknownFlags { flags: u8 },
    #[error("transfer size 0")]
    ZeroSize,
    #[error("transfer size {total} is not a multiple of 4 bytes (whole i32 elements)")]
    NotWholeElements { total: u64 },
    #[error("chunk size 0")]
    ZeroChunk,
    #[error("chunk size {chunk} is larger than the transfer ({total} bytes)")]
    ChunkLargerThanTotal { chunk: u64, total: u64 },
    #[error("{chunks} chunks is more than the protocol counts (2^32 - 1)")]
    TooManyChunks { chunks: u64 },
    #[error("queue depth {depth} is outside 1..={MAX_DEPTH}")]
    BadDepth { depth: u32 },
    #[error("unknown status code {code}")]
    UnknownStatus { code: u8 },
    #[error("inconsistent message: {what}")]
    Inconsistent { what: &'static str },
    #[error("transfer count {count} is outside 2..={MAX_TRANSFERS} (header flag 0x01)")]
    BadTransferCount { count: u32 },
    #[error("unknown payload kind {code}")]
    UnknownPayload { code: u8 },
    #[error("unknown verification mode {code}")]
    UnknownVerify { code: u8 },
    #[error(
        "the pattern check applies to the built-in pattern only, not to the sender's own data"
    )]
    PatternOfOpaque,
    #[error("{count} rounds of resends is more than {MAX_RESENDS}")]
    TooManyResends { count: u8 },
    #[error("not a file name ({len} bytes): a name is 1 to 255 bytes of UTF-8 without '/', '\\', control characters, and not '.' or '..'")]
    BadName { len: usize },
    /// A name with a character that is not seen but changes what is: a right-to-left
    /// override makes `report\u{202E}gnp.exe` show as "reportexe.png".
    #[error("not a file name: it holds U+{code:04X}, an invisible Unicode format character (a bidirectional control, a zero-width character or the like) that would make the name show as other than it is")]
    FormatCharInName { code: u32 },
    /// A striped verbs transfer offered to, or a rail joining at, a receiver with a key:
    /// a verbs join (a connect request of 16 bytes) carries no proof of the key, so the
    /// receiver takes none (TCP's streams prove it; see `server::key`).
    #[error("striped verbs transfers are not served with --key-file (a further rail's join cannot prove the key): send over one rail, or over TCP, whose streams prove it")]
    KeyedVerbsStriping,
}

/// The words of [`WireError::BadMagic`].
fn bad_magic_words(got: [u8; 4], expected: [u8; 4]) -> String {
    let [a, b, c, d] = got;
    let shown = String::from_utf8_lossy(&expected).into_owned();
    if expected == HEADER_MAGIC {
        return format!(
            "no transfer header (magic {a:02x} {b:02x} {c:02x} {d:02x}, expected \"{shown}\"): is the sender using --raw?"
        );
    }
    let what = match expected {
        ACCEPT_MAGIC => "accept",
        REJECT_MAGIC => "reject",
        ACK_MAGIC => "ack",
        JOIN_MAGIC => "rail join",
        CHALLENGE_MAGIC => "key challenge",
        PROOF_MAGIC => "proof of the key",
        NAME_MAGIC => "name message",
        RESEND_MAGIC => "resend request",
        CHECKSUMS_MAGIC => "checksums message",
        _ => "message",
    };
    format!("not a {what} (magic {a:02x} {b:02x} {c:02x} {d:02x}, expected \"{shown}\")")
}

impl WireError {
    /// (sub-code, a, b) for the reject message.
    fn to_parts(self) -> (u16, u64, u64) {
        match self {
            WireError::Short { got, need } => (1, got as u64, need as u64),
            WireError::BadMagic { got, expected } => (
                2,
                u32::from_le_bytes(got) as u64,
                u32::from_le_bytes(expected) as u64,
            ),
            WireError::UnsupportedVersion { got } => (3, got as u64, 0),
            WireError::UnknownOp { code } => (4, code as u64, 0),
            WireError::UnknownFlags { flags } => (5, flags as u64, 0),
            WireError::ZeroSize => (6, 0, 0),
            WireError::NotWholeElements { total } => (7, total, 0),
            WireError::ZeroChunk => (8, 0, 0),
            WireError::ChunkLargerThanTotal { chunk, total } => (9, chunk, total),
            WireError::TooManyChunks { chunks } => (10, chunks, 0),
            WireError::BadDepth { depth } => (11, depth as u64, 0),
            WireError::UnknownStatus { code } => (12, code as u64, 0),
            WireError::Inconsistent { .. } => (13, 0, 0),
            WireError::BadTransferCount { count } => (14, count as u64, 0),
            WireError::UnknownPayload { code } => (15, code as u64, 0),
            WireError::UnknownVerify { code } => (16, code as u64, 0),
            WireError::PatternOfOpaque => (17, 0, 0),
            WireError::TooManyResends { count } => (18, count as u64, 0),
            WireError::BadName { len } => (19, len as u64, 0),
            WireError::FormatCharInName { code } => (20, code as u64, 0),
            WireError::KeyedVerbsStriping => (21, 0, 0),
        }
    }

    fn from_parts(sub: u16, a: u64, b: u64) -> Option<WireError> {
        Some(match sub {
            1 => WireError::Short {
                got: a as usize,
                need: b as usize,
            },
            2 => WireError::BadMagic {
                got: (a as u32).to_le_bytes(),
                // An older peer sends 0 here: its one bad magic was a header's. The
                // word is taken as the 32 bits it was sent as first, so a value whose
                // upper bits alone are set reads as that 0 too, and encodes back to
                // the same (cargo fuzz found `expected: [0; 4]` decoding, then GRDM).
                expected: match b as u32 {
                    0 => HEADER_MAGIC,
                    m => m.to_le_bytes(),
                },
            },
            3 => WireError::UnsupportedVersion { got: a as u16 },
            4 => WireError::UnknownOp { code: a as u8 },
            5 => WireError::UnknownFlags { flags: a as u8 },
            6 => WireError::ZeroSize,
            7 => WireError::NotWholeElements { total: a },
            8 => WireError::ZeroChunk,
            9 => WireError::ChunkLargerThanTotal { chunk: a, total: b },
            10 => WireError::TooManyChunks { chunks: a },
            11 => WireError::BadDepth { depth: a as u32 },
            12 => WireError::UnknownStatus { code: a as u8 },
            13 => WireError::Inconsistent {
                what: "reported by the peer",
            },
            14 => WireError::BadTransferCount { count: a as u32 },
            15 => WireError::UnknownPayload { code: a as u8 },
            16 => WireError::UnknownVerify { code: a as u8 },
            17 => WireError::PatternOfOpaque,
            18 => WireError::TooManyResends { count: a as u8 },
            19 => WireError::BadName { len: a as usize },
            20 => WireError::FormatCharInName { code: a as u32 },
            21 => WireError::KeyedVerbsStriping,
            _ => return None,
        })
    }
}

/// Little-endian reader over a byte slice whose length was checked up front.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Check magic, version and length; return a reader positioned after the version.
fn open<'a>(buf: &'a [u8], magic: [u8; 4], len: usize) -> Result<Reader<'a>, WireError> {
    open_versions(buf, magic, len, VERSION..=VERSION).map(|(r, _)| r)
}

/// [`open`] for a message whose layout is the same in `versions`; also the version.
fn open_versions<'a>(
    buf: &'a [u8],
    magic: [u8; 4],
    len: usize,
    versions: std::ops::RangeInclusive<u16>,
) -> Result<(Reader<'a>, u16), WireError> {
    if buf.len() < 4 {
        return Err(WireError::Short {
            got: buf.len(),
            need: len,
        });
    }
    let got: [u8; 4] = [buf[0], buf[1], buf[2], buf[3]];
    if got != magic {
        return Err(WireError::BadMagic {
            got,
            expected: magic,
        });
    }
    if buf.len() < 6 {
        return Err(WireError::Short {
            got: buf.len(),
            need: len,
        });
    }
    // The version is checked before the length: another version may be another size.
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    if !versions.contains(&version) {
        return Err(WireError::UnsupportedVersion { got: version });
    }
    if buf.len() < len {
        return Err(WireError::Short {
            got: buf.len(),
            need: len,
        });
    }
    Ok((Reader { buf, pos: 6 }, version))
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
    /// A [`NameMessage`] follows the offer (TCP).
    pub named: bool,
    /// TCP: striped over several rails ([`HEADER_FLAG_STRIPED`]).
    pub striped: bool,
    /// Verbs, striped: the rails the sender will open (rail 0 is this connection; the
    /// others [`Join`] it). Carried at byte 24 with flag 0x04 and without flag 0x01;
    /// 0 where not said (TCP says it in its hello).
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

    /// The same offer, announcing a [`NameMessage`] after it.
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

    /// The same offer, striped over `rails` verbs rails (one transfer on the connection).
    pub fn with_rails(self, rails: u8) -> Result<Header, WireError> {
        let header = Header {
            striped: true,
            rails,
            ..self
        };
        header.validate()?;
        Ok(header)
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
        if self.rails > 0 && (!self.striped || self.repeats() || self.rails > MAX_VERBS_RAILS) {
            return Err(WireError::Inconsistent {
                what: "a rail count needs the striped flag, one transfer, and at most 8 rails",
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
        if self.repeats() {
            out[24..28].copy_from_slice(&self.transfers.to_le_bytes());
        } else if self.rails > 0 {
            out[24..28].copy_from_slice(&(self.rails as u32).to_le_bytes());
        }
        if self.solicited_events {
            out[28] = HINT_SOLICITED;
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
        // Without the flag, bytes 24..28 are reserved and ignored (as before).
        let transfers = r.u32();
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
        let (transfers, rails) = if flags & HEADER_FLAG_REPEAT != 0 {
            if transfers < 2 {
                return Err(WireError::BadTransferCount { count: transfers });
            }
            (transfers, 0)
        } else if striped {
            // Verbs: the rail count (validate bounds it; 0 from a TCP sender).
            let rails = u8::try_from(transfers).map_err(|_| WireError::Inconsistent {
                what: "a rail count needs the striped flag, one transfer, and at most 8 rails",
            })?;
            (1, rails)
        } else {
            (1, 0)
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
            rails,
        };
        header.validate()?;
        Ok(header)
    }

    pub fn chunks(&self) -> u64 {
        self.total_bytes.div_ceil(self.chunk_bytes as u64)
    }
}

/// What the receiver answers in its accept: where a write-mode sender writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptInfo {
    /// The address of byte 0 of the receiver's buffer (0 in send mode).
    pub addr: u64,
    /// The remote key for RDMA WRITE (0 in send mode).
    pub rkey: u32,
    /// The buffer's length in bytes.
    pub len: u64,
}

impl AcceptInfo {
    pub fn encode(&self) -> [u8; ACCEPT_LEN] {
        let mut out = [0u8; ACCEPT_LEN];
        out[0..4].copy_from_slice(&ACCEPT_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        // 6..8 reserved
        out[8..12].copy_from_slice(&self.rkey.to_le_bytes());
        out[12..20].copy_from_slice(&self.addr.to_le_bytes());
        out[20..28].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<AcceptInfo, WireError> {
        let mut r = open(buf, ACCEPT_MAGIC, ACCEPT_LEN)?;
        let _reserved = r.u16();
        let rkey = r.u32();
        let addr = r.u64();
        let len = r.u64();
        if addr.checked_add(len).is_none() {
            return Err(WireError::Inconsistent {
                what: "buffer address + length overflows",
            });
        }
        Ok(AcceptInfo { addr, rkey, len })
    }
}

/// The accept of a striped verbs transfer's rail 0 ([`HEADER_FLAG_STRIPED`] with a rail
/// count): where to write, as [`AcceptInfo`] (rail 0's rkey), then at byte 28 the token
/// (u64, never 0) that the other rails' [`Join`]s name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripedAccept {
    pub info: AcceptInfo,
    pub token: u64,
}

impl StripedAccept {
    pub fn encode(&self) -> [u8; STRIPED_ACCEPT_LEN] {
        let mut out = [0u8; STRIPED_ACCEPT_LEN];
        out[..ACCEPT_LEN].copy_from_slice(&self.info.encode());
        out[ACCEPT_LEN..].copy_from_slice(&self.token.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<StripedAccept, WireError> {
        let info = AcceptInfo::decode(buf)?;
        let token = buf
            .get(ACCEPT_LEN..STRIPED_ACCEPT_LEN)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
            .ok_or(WireError::Short {
                got: buf.len(),
                need: STRIPED_ACCEPT_LEN,
            })?;
        if token == 0 {
            return Err(WireError::Inconsistent {
                what: "a striped accept without a token",
            });
        }
        Ok(StripedAccept { info, token })
    }
}

/// A further rail of a striped verbs transfer: the connect request's private data,
/// instead of a [`Header`]. Layout: `0` magic "GRDJ", `4` version u16, `6` rail u8
/// (1..rails), `7` rails u8, `8` token u64 (from rail 0's [`StripedAccept`]).
/// The receiver routes it to the transfer whose token it names, which accepts it with
/// this rail's [`AcceptInfo`] (the same buffer registered on this rail's device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub token: u64,
    pub rail: u8,
    pub rails: u8,
}

impl Join {
    pub fn encode(&self) -> [u8; JOIN_LEN] {
        let mut out = [0u8; JOIN_LEN];
        out[0..4].copy_from_slice(&JOIN_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = self.rail;
        out[7] = self.rails;
        out[8..16].copy_from_slice(&self.token.to_le_bytes());
        out
    }

    /// Checked for what the join alone can tell: rail 0 never joins, the rail is below
    /// the count, the count is a striped one, the token is not 0. Whether a transfer
    /// with that token and count exists is the receiver's to check.
    pub fn decode(buf: &[u8]) -> Result<Join, WireError> {
        let mut r = open(buf, JOIN_MAGIC, JOIN_LEN)?;
        let rail = r.u8();
        let rails = r.u8();
        let token = r.u64();
        if !(2..=MAX_VERBS_RAILS).contains(&rails) || rail == 0 || rail >= rails {
            return Err(WireError::Inconsistent {
                what: "a join's rail must be 1..rails, with 2..8 rails",
            });
        }
        if token == 0 {
            return Err(WireError::Inconsistent {
                what: "a join without a token",
            });
        }
        Ok(Join { token, rail, rails })
    }
}

/// Why a receiver refused a transfer; travels in the reject's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// The header did not decode or failed its checks.
    #[error("{0}")]
    BadHeader(WireError),
    #[error("size {} exceeds its --max-bytes {}", format_bytes_apart(*requested, *max).0, format_bytes_apart(*requested, *max).1)]
    TooLarge { requested: u64, max: u64 },
    #[error(
        "chunk size {} exceeds the largest message of its RDMA device ({}); use a smaller --chunk",
        format_bytes_apart(*chunk, *max).0, format_bytes_apart(*chunk, *max).1
    )]
    ChunkTooLarge { chunk: u64, max: u64 },
    #[error("it could not allocate or register {} for the data (see its log)", format_bytes(*bytes))]
    NoMemory { bytes: u64 },
    /// The receiver serves as many connections as its `--max-connections` allows.
    #[error("receiver busy: it serves {active} connections, its --max-connections {max}; try again later")]
    BusyConnections { active: u64, max: u64 },
    /// Taking this transfer would put the receiver's buffers over its `--max-memory`.
    #[error(
        "receiver busy: {} more would put its buffers over its --max-memory {}; try again later",
        format_bytes(*wanted), format_bytes(*max)
    )]
    BusyMemory { wanted: u64, max: u64 },
    /// Memory was there, but its NIC refused to register it on every path the receiver
    /// may use (`--mem device` with a NIC that takes no GPU memory, say).
    #[error("its NIC refused to register {} on every memory path it may use (see its log)", format_bytes(*bytes))]
    NotRegistrable { bytes: u64 },
    #[error("it failed to set up the connection (see its log)")]
    Internal,
    #[error(
        "it is `host recv --raw` and takes only raw transfers; add --raw here or drop it there"
    )]
    RawOnly,
    /// Too many sockets are in their handshake at once, all peers together.
    #[error("receiver busy: {active} connections are in their handshake, its limit {max}; try again later")]
    BusyHandshakes { active: u64, max: u64 },
    /// This peer's address holds its share of transfers already (`--max-per-peer`).
    #[error("receiver busy: this address holds {active} of its {max} at once (--max-per-peer); try again later")]
    BusyPeer { active: u64, max: u64 },
    /// This peer's address has its share of sockets in their handshake already: a fixed
    /// limit ([`crate::server::admission::MAX_HANDSHAKES_PER_PEER`]), not
    /// `--max-per-peer`. On the wire: code 11 of [`RejectReason::BusyPeer`] with sub-code
    /// 1 (an older sender reads it as that).
    #[error("receiver busy: this address has {active} sockets in their handshake, its limit per address {max} (fixed, not --max-per-peer); try again later")]
    BusyPeerHandshakes { active: u64, max: u64 },
    /// Taking this transfer would put the receiver's open descriptors over its limit.
    #[error("receiver busy: {wanted} more sockets would put it over its {max} descriptors; try again later (or use fewer --streams)")]
    BusyDescriptors { wanted: u64, max: u64 },
    /// The peer's address is not in the receiver's `--allow` list.
    #[error("this address is not in its --allow list")]
    NotAllowed,
    /// The receiver has a `--key-file` and the sender's proof did not match it (or
    /// the sender had none).
    #[error("it needs a sender with the same --key-file, and this one's proof did not match")]
    BadProof,
    /// Verbs: the receiver has a `--key-file`; the sender is to connect again with a
    /// [`VerbsProof`] over this nonce after its header.
    #[error("it serves only senders with its key: give this sender the same --key-file")]
    KeyChallenge { nonce: [u8; NONCE_LEN] },
    /// A [`Join`] named a token no transfer of this receiver holds (it ended, or never
    /// was).
    #[error("no transfer here has this rail's join token (it ended, or was never accepted)")]
    UnknownJoin,
    /// A [`Join`] for a rail its transfer does not have, or one that joined already.
    #[error("rail {rail} does not fit this transfer of {rails} rails (or joined already)")]
    BadJoin { rail: u64, rails: u64 },
    /// The receiver predates this protocol version (its reject says which it speaks).
    #[error("it speaks protocol version {speaks} and this sender version {VERSION}: run the same release on both ends (or --raw)")]
    OldPeer { speaks: u16 },
    /// The offer's data fits the receiver's `--max-memory`, but not with the books it
    /// keeps per chunk (checksums, resend lists): it never will; larger chunks would.
    #[error(
        "its --max-memory {} cannot hold the data with the books of its {chunks} chunks ({per_chunk} bytes each: checksums, resend lists); use a larger --chunk",
        format_bytes(*max)
    )]
    ChunkBooks {
        chunks: u64,
        per_chunk: u64,
        max: u64,
    },
    /// The receiver takes the transfer into memory its caller gave it (the library's
    /// `receive_into`), which holds exactly `expected` bytes: an offer of any other size
    /// is refused before a byte lands.
    #[error(
        "it receives into a buffer of exactly {} bytes, and this offer is {} bytes",
        *expected, *offered
    )]
    SizeMismatch { offered: u64, expected: u64 },
    #[error("reason code {code} (unknown to this version)")]
    Unknown { code: u16 },
}

impl RejectReason {
    pub fn encode(&self) -> [u8; REJECT_LEN] {
        let (code, sub, a, b) = match *self {
            RejectReason::BadHeader(e) => {
                let (sub, a, b) = e.to_parts();
                (1, sub, a, b)
            }
            RejectReason::TooLarge { requested, max } => (2, 0, requested, max),
            RejectReason::ChunkTooLarge { chunk, max } => (3, 0, chunk, max),
            RejectReason::NoMemory { bytes } => (4, 0, bytes, 0),
            RejectReason::Internal => (5, 0, 0, 0),
            RejectReason::RawOnly => (6, 0, 0, 0),
            RejectReason::NotRegistrable { bytes } => (7, 0, bytes, 0),
            RejectReason::BusyConnections { active, max } => (8, 0, active, max),
            RejectReason::BusyMemory { wanted, max } => (9, 0, wanted, max),
            RejectReason::BusyHandshakes { active, max } => (10, 0, active, max),
            RejectReason::BusyPeer { active, max } => (11, 0, active, max),
            RejectReason::BusyPeerHandshakes { active, max } => (11, 1, active, max),
            RejectReason::BusyDescriptors { wanted, max } => (12, 0, wanted, max),
            RejectReason::NotAllowed => (13, 0, 0, 0),
            RejectReason::BadProof => (14, 0, 0, 0),
            RejectReason::KeyChallenge { nonce } => {
                let (a, b) = nonce.split_at(8);
                let half = |h: &[u8]| u64::from_le_bytes(h.try_into().unwrap_or([0; 8]));
                (15, 0, half(a), half(b))
            }
            RejectReason::UnknownJoin => (16, 0, 0, 0),
            RejectReason::BadJoin { rail, rails } => (17, 0, rail, rails),
            // Bytes per chunk are a few dozen: they fit the sub-code.
            RejectReason::ChunkBooks {
                chunks,
                per_chunk,
                max,
            } => (18, per_chunk.min(u16::MAX as u64) as u16, chunks, max),
            RejectReason::SizeMismatch { offered, expected } => (19, 0, offered, expected),
            // What that older receiver sent: "version VERSION is not supported", in its
            // own version.
            RejectReason::OldPeer { .. } => (1, 3, VERSION as u64, 0),
            RejectReason::Unknown { code } => (code, 0, 0, 0),
        };
        // A peer of an older version gets its version's reject, which it can decode
        // (the layout has not changed): "protocol version N is not supported".
        let version = match *self {
            RejectReason::BadHeader(WireError::UnsupportedVersion { got })
                if (OLDEST_VERSION..VERSION).contains(&got) =>
            {
                got
            }
            RejectReason::OldPeer { speaks } if (OLDEST_VERSION..VERSION).contains(&speaks) => {
                speaks
            }
            _ => VERSION,
        };
        let mut out = [0u8; REJECT_LEN];
        out[0..4].copy_from_slice(&REJECT_MAGIC);
        out[4..6].copy_from_slice(&version.to_le_bytes());
        out[6..8].copy_from_slice(&code.to_le_bytes());
        out[8..10].copy_from_slice(&sub.to_le_bytes());
        // 10..12 reserved
        out[12..20].copy_from_slice(&a.to_le_bytes());
        out[20..28].copy_from_slice(&b.to_le_bytes());
        out
    }

    /// `None` when the reject carries no reason of ours (a peer that is not `host recv`,
    /// or no receiver at all).
    pub fn decode(buf: &[u8]) -> Option<RejectReason> {
        let (mut r, version) =
            open_versions(buf, REJECT_MAGIC, REJECT_LEN, OLDEST_VERSION..=VERSION).ok()?;
        let code = r.u16();
        let sub = r.u16();
        let _reserved = r.u16();
        let a = r.u64();
        let b = r.u64();
        if version < VERSION && (code, sub, a) == (1, 3, VERSION as u64) {
            // An older receiver refusing this version: name its own.
            return Some(RejectReason::OldPeer { speaks: version });
        }
        Some(match code {
            1 => match WireError::from_parts(sub, a, b) {
                Some(e) => RejectReason::BadHeader(e),
                None => RejectReason::Unknown { code },
            },
            2 => RejectReason::TooLarge {
                requested: a,
                max: b,
            },
            3 => RejectReason::ChunkTooLarge { chunk: a, max: b },
            4 => RejectReason::NoMemory { bytes: a },
            5 => RejectReason::Internal,
            6 => RejectReason::RawOnly,
            7 => RejectReason::NotRegistrable { bytes: a },
            8 => RejectReason::BusyConnections { active: a, max: b },
            9 => RejectReason::BusyMemory { wanted: a, max: b },
            10 => RejectReason::BusyHandshakes { active: a, max: b },
            11 if sub == 1 => RejectReason::BusyPeerHandshakes { active: a, max: b },
            11 => RejectReason::BusyPeer { active: a, max: b },
            12 => RejectReason::BusyDescriptors { wanted: a, max: b },
            13 => RejectReason::NotAllowed,
            14 => RejectReason::BadProof,
            15 => {
                let mut nonce = [0u8; NONCE_LEN];
                nonce[..8].copy_from_slice(&a.to_le_bytes());
                nonce[8..].copy_from_slice(&b.to_le_bytes());
                RejectReason::KeyChallenge { nonce }
            }
            16 => RejectReason::UnknownJoin,
            17 => RejectReason::BadJoin { rail: a, rails: b },
            18 => RejectReason::ChunkBooks {
                chunks: a,
                per_chunk: sub as u64,
                max: b,
            },
            19 => RejectReason::SizeMismatch {
                offered: a,
                expected: b,
            },
            _ => RejectReason::Unknown { code },
        })
    }
}

/// The receiver's verdict on the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckStatus {
    /// Every element matches the pattern.
    Verified,
    /// Some elements differ.
    Mismatch,
    /// The receiver could not check (its verification itself failed).
    VerifyFailed,
    /// The receiver ended the transfer before all data came: the sender stayed below its
    /// `--min-rate` (`received_bytes` says how far it got). Sent instead of a verdict.
    TooSlow,
    /// Chunks still failed their checksums after the allowed resends (the final
    /// [`Resend`] before this ack named them).
    ChecksumFailed,
    /// The data verified but the receiver could not store it (`--output`: a full disk,
    /// say); its log says why.
    NotStored,
}

/// The final message, receiver to sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub status: AckStatus,
    pub received_bytes: u64,
    /// Present unless `status` is `VerifyFailed`.
    pub verification: Option<Verification>,
    /// How long the receiver's verification took, in microseconds (saturating): sent
    /// only to senders that set a header flag (see the module documentation).
    pub verify_micros: Option<u32>,
    /// CRC32C of the whole transfer as it landed (with `--verify checksum|both`).
    pub digest: Option<u32>,
    /// Chunks that failed their checksum and were sent again until they passed.
    pub repaired: u32,
}

const ACK_HAS_VERIFICATION: u8 = 1;
const ACK_HAS_FIRST_MISMATCH: u8 = 2;
const ACK_HAS_CRC: u8 = 4;
const ACK_HAS_VERIFY_TIME: u8 = 8;
const ACK_HAS_DIGEST: u8 = 16;

impl Ack {
    /// The ack for a verification result (or for a failed verification).
    pub fn new(received_bytes: u64, verification: Option<Verification>) -> Ack {
        let status = match &verification {
            Some(v) if v.ok() => AckStatus::Verified,
            Some(_) => AckStatus::Mismatch,
            None => AckStatus::VerifyFailed,
        };
        Ack {
            status,
            received_bytes,
            verification,
            verify_micros: None,
            digest: None,
            repaired: 0,
        }
    }

    /// The ack of a transfer checked by its chunks' checksums (`digest` of the whole),
    /// and by the pattern too when `pattern` is given (`Some(None)`: that check itself
    /// failed).
    pub fn checked(
        received_bytes: u64,
        pattern: Option<Option<Verification>>,
        digest: Option<u32>,
        repaired: u32,
    ) -> Ack {
        let mut ack = match pattern {
            Some(verification) => Ack::new(received_bytes, verification),
            None => Ack::new(received_bytes, None).with_status(AckStatus::Verified),
        };
        ack.digest = digest;
        ack.repaired = repaired;
        ack
    }

    /// The same ack with another status (the receiver's last word: chunks that could not
    /// be repaired, data that could not be stored).
    pub fn with_status(self, status: AckStatus) -> Ack {
        Ack { status, ..self }
    }

    /// The receiver's word that the sender was too slow, after `received_bytes`.
    pub fn too_slow(received_bytes: u64) -> Ack {
        Ack {
            status: AckStatus::TooSlow,
            received_bytes,
            verification: None,
            verify_micros: None,
            digest: None,
            repaired: 0,
        }
    }

    /// The same ack, telling how long the verification took.
    pub fn with_verify_time(self, took: std::time::Duration) -> Ack {
        Ack {
            verify_micros: Some(took.as_micros().min(u32::MAX as u128) as u32),
            ..self
        }
    }

    pub fn encode(&self) -> [u8; ACK_LEN] {
        let mut out = [0u8; ACK_LEN];
        out[0..4].copy_from_slice(&ACK_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = match self.status {
            AckStatus::Verified => 0,
            AckStatus::Mismatch => 1,
            AckStatus::VerifyFailed => 2,
            AckStatus::TooSlow => 3,
            AckStatus::ChecksumFailed => 4,
            AckStatus::NotStored => 5,
        };
        let mut flags = 0u8;
        let v = self.verification;
        if let Some(v) = v {
            flags |= ACK_HAS_VERIFICATION;
            if v.first_mismatch.is_some() {
                flags |= ACK_HAS_FIRST_MISMATCH;
            }
            if v.crc32.is_some() {
                flags |= ACK_HAS_CRC;
            }
        }
        if self.verify_micros.is_some() {
            flags |= ACK_HAS_VERIFY_TIME;
        }
        if self.digest.is_some() {
            flags |= ACK_HAS_DIGEST;
        }
        out[7] = flags;
        out[8..16].copy_from_slice(&self.received_bytes.to_le_bytes());
        if let Some(v) = v {
            out[16..24].copy_from_slice(&v.elements.to_le_bytes());
            out[24..32].copy_from_slice(&v.mismatches.to_le_bytes());
            out[32..40].copy_from_slice(&v.first_mismatch.unwrap_or(0).to_le_bytes());
            out[40..44].copy_from_slice(&v.crc32.unwrap_or(0).to_le_bytes());
        }
        if let Some(us) = self.verify_micros {
            out[44..48].copy_from_slice(&us.to_le_bytes());
        }
        out[48..52].copy_from_slice(&self.digest.unwrap_or(0).to_le_bytes());
        out[52..56].copy_from_slice(&self.repaired.to_le_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Ack, WireError> {
        let mut r = open(buf, ACK_MAGIC, ACK_LEN)?;
        let code = r.u8();
        let status = match code {
            0 => AckStatus::Verified,
            1 => AckStatus::Mismatch,
            2 => AckStatus::VerifyFailed,
            3 => AckStatus::TooSlow,
            4 => AckStatus::ChecksumFailed,
            5 => AckStatus::NotStored,
            _ => return Err(WireError::UnknownStatus { code }),
        };
        let flags = r.u8();
        let known = ACK_HAS_VERIFICATION
            | ACK_HAS_FIRST_MISMATCH
            | ACK_HAS_CRC
            | ACK_HAS_VERIFY_TIME
            | ACK_HAS_DIGEST;
        if flags & !known != 0 {
            return Err(WireError::UnknownFlags { flags });
        }
        let received_bytes = r.u64();
        let elements = r.u64();
        let mismatches = r.u64();
        let first = r.u64();
        let crc = r.u32();
        let verify_micros = r.u32();
        let digest = r.u32();
        let repaired = r.u32();
        let verification = (flags & ACK_HAS_VERIFICATION != 0).then_some(Verification {
            elements,
            mismatches,
            first_mismatch: (flags & ACK_HAS_FIRST_MISMATCH != 0).then_some(first),
            crc32: (flags & ACK_HAS_CRC != 0).then_some(crc),
        });
        let consistent = match (status, &verification) {
            (AckStatus::Verified, Some(v)) => v.mismatches == 0 && v.first_mismatch.is_none(),
            // Checked by checksums alone (or not at all, `--verify off`).
            (AckStatus::Verified, None) => true,
            (AckStatus::Mismatch, Some(v)) => v.mismatches > 0,
            (AckStatus::VerifyFailed | AckStatus::TooSlow, None) => true,
            (AckStatus::ChecksumFailed | AckStatus::NotStored, _) => true,
            _ => false,
        };
        if !consistent {
            return Err(WireError::Inconsistent {
                what: "the ack's status disagrees with its counts",
            });
        }
        Ok(Ack {
            status,
            received_bytes,
            verification,
            verify_micros: (flags & ACK_HAS_VERIFY_TIME != 0).then_some(verify_micros),
            digest: (flags & ACK_HAS_DIGEST != 0).then_some(digest),
            repaired,
        })
    }
}

/// The receiver's answer to an offer when it has a `--key-file`: prove you hold the
/// key over this nonce (see [`crate::server::key`]). The same length as an accept, so a
/// sender reads one answer of [`ACCEPT_LEN`] bytes and tells the three apart by magic.
///
/// Layout: `0` magic "GRDN", `4` version u16, `6` reserved u16, `8` nonce (16 bytes),
/// `24` reserved u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; NONCE_LEN],
}

pub const CHALLENGE_MAGIC: [u8; 4] = *b"GRDN";
pub const CHALLENGE_LEN: usize = 28;
pub const PROOF_MAGIC: [u8; 4] = *b"GRDP";
/// Layout: `0` magic "GRDP", `4` version u16, `6` reserved u16, `8` HMAC-SHA256 tag.
pub const PROOF_LEN: usize = 8 + crate::server::key::PROOF_LEN;
impl Challenge {
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut out = [0u8; CHALLENGE_LEN];
        out[0..4].copy_from_slice(&CHALLENGE_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[8..8 + NONCE_LEN].copy_from_slice(&self.nonce);
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Challenge, WireError> {
        let mut r = open(buf, CHALLENGE_MAGIC, CHALLENGE_LEN)?;
        let _reserved = r.u16();
        Ok(Challenge { nonce: r.take() })
    }
}

/// The sender's proof that it holds the receiver's key: HMAC-SHA256 over the offer's
/// bytes and the [`Challenge`]'s nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    pub tag: [u8; crate::server::key::PROOF_LEN],
}

impl Proof {
    pub fn encode(&self) -> [u8; PROOF_LEN] {
        let mut out = [0u8; PROOF_LEN];
        out[0..4].copy_from_slice(&PROOF_MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[8..].copy_from_slice(&self.tag);
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Proof, WireError> {
        let mut r = open(buf, PROOF_MAGIC, PROOF_LEN)?;
        let _reserved = r.u16();
        Ok(Proof { tag: r.take() })
    }
}

/// Verbs: the sender's proof of the key, in the connect request's private data right
/// after the 32-byte header (RC private data holds 56 bytes: exactly these 24 more).
/// Receivers that predate it ignore trailing bytes, as the CM pads with zeros anyway.
///
/// Layout (offsets in the private data): `32` nonce id u64 (the nonce's first 8 bytes),
/// `40` the first 16 bytes of HMAC-SHA256 over the header and the nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerbsProof {
    pub nonce_id: u64,
    pub tag: [u8; VERBS_TAG_LEN],
}

/// Where a [`VerbsProof`] starts in the connect request's private data.
pub const VERBS_PROOF_AT: usize = HEADER_LEN;
pub const VERBS_PROOF_LEN: usize = 8 + VERBS_TAG_LEN;
/// Bytes of the HMAC tag a verbs proof carries (128 bits).
pub const VERBS_TAG_LEN: usize = 16;

impl VerbsProof {
    /// The id under which a receiver keeps `nonce`.
    pub fn nonce_id(nonce: &[u8; NONCE_LEN]) -> u64 {
        let mut id = [0u8; 8];
        id.copy_from_slice(&nonce[..8]);
        u64::from_le_bytes(id)
    }

    /// The private data of a connect request: the header's bytes, then this proof.
    pub fn private_data(&self, header: &[u8; HEADER_LEN]) -> [u8; HEADER_LEN + VERBS_PROOF_LEN] {
        let mut out = [0u8; HEADER_LEN + VERBS_PROOF_LEN];
        out[..HEADER_LEN].copy_from_slice(header);
        out[VERBS_PROOF_AT..VERBS_PROOF_AT + 8].copy_from_slice(&self.nonce_id.to_le_bytes());
        out[VERBS_PROOF_AT + 8..].copy_from_slice(&self.tag);
        out
    }

    /// The proof in a connect request's private data, if it carries one (absent: too
    /// short, or all zeros, the CM's padding).
    pub fn decode(private_data: &[u8]) -> Option<VerbsProof> {
        let bytes = private_data.get(VERBS_PROOF_AT..VERBS_PROOF_AT + VERBS_PROOF_LEN)?;
        if bytes.iter().all(|&b| b == 0) {
            return None;
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[..8]);
        let mut tag = [0u8; VERBS_TAG_LEN];
        tag.copy_from_slice(&bytes[8..]);
        Some(VerbsProof {
            nonce_id: u64::from_le_bytes(id),
            tag,
        })
    }
}

impl Ack {
    /// Whether this ack speaks of the transfer that was sent (`total` bytes, whole `i32`
    /// elements): a receiver that claims another byte or element count is not believed.
    pub fn check_counts(&self, total: u64) -> Result<(), String> {
        if self.status == AckStatus::TooSlow {
            return Ok(()); // it says how far it got, by definition less than all
        }
        if self.received_bytes != total {
            return Err(format!(
                "the receiver's ack speaks of {} bytes, but {total} were sent",
                self.received_bytes
            ));
        }
        if let Some(v) = self.verification {
            if v.elements != total / 4 {
                return Err(format!(
                    "the receiver's ack counts {} elements, but {} were sent",
                    v.elements,
                    total / 4
                ));
            }
        }
        Ok(())
    }
}

/// The name a sender gives its transfer (`--name`), after the offer when the header
/// says [`HEADER_FLAG_NAMED`] (TCP). A receiver writing into a directory names the file
/// after it, once [`checked_name`] accepts it.
///
/// Layout: `0` magic "GRDF", `4` version u16, `6` length u16 (1..=255), `8` the UTF-8
/// bytes.
pub const NAME_MAGIC: [u8; 4] = *b"GRDF";
pub const NAME_PREFIX_LEN: usize = 8;
pub const MAX_NAME_LEN: usize = 255;

/// The name message for `name`, if it is a name a receiver accepts.
pub fn encode_name(name: &str) -> Result<Vec<u8>, WireError> {
    let name = checked_name(name.as_bytes())?;
    let mut out = Vec::with_capacity(NAME_PREFIX_LEN + name.len());
    out.extend_from_slice(&NAME_MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
    Ok(out)
}

/// The length of the name that follows this prefix.
pub fn decode_name_prefix(buf: &[u8]) -> Result<usize, WireError> {
    let mut r = open(buf, NAME_MAGIC, NAME_PREFIX_LEN)?;
    let len = r.u16() as usize;
    if len == 0 || len > MAX_NAME_LEN {
        return Err(WireError::BadName { len });
    }
    Ok(len)
}

/// `bytes` as a file name that stays in the directory it is written to and shows as
/// what it is: UTF-8, 1 to 255 bytes, no path separator (`/` or `\`), no NUL or other
/// control character, no Unicode format character ([`is_format_char`]), not `.` or `..`.
pub fn checked_name(bytes: &[u8]) -> Result<&str, WireError> {
    let bad = WireError::BadName { len: bytes.len() };
    let name = std::str::from_utf8(bytes).map_err(|_| bad)?;
    let fine = (1..=MAX_NAME_LEN).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    if !fine {
        return Err(bad);
    }
    match name.chars().find(|&c| is_format_char(c)) {
        Some(c) => Err(WireError::FormatCharInName { code: c as u32 }),
        None => Ok(name),
    }
}

/// Whether `c` is of Unicode's general category Cf (format, Unicode 15.1): not drawn,
/// but it changes how the text around it is drawn (bidirectional overrides and
/// isolates, zero-width characters, the byte order mark, the soft hyphen, ...). The
/// standard library has no such test and a table of its own is short.
pub fn is_format_char(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    )
}

/// `text` as it is safe to print to a terminal: control and format characters written
/// as `\u{202e}`, so that a name (or a path holding one) shows as what it is, never
/// reordered or hidden by the characters in it. A backslash stays as it is.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unseen = |c: char| c.is_control() || is_format_char(c);
    if !text.chars().any(unseen) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unseen(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The receiver's request to send chunks again: their checksums failed where they
/// landed. Or, with `last`, the chunks that still failed when the sender's
/// `--max-resends` was used up (an ack with [`AckStatus::ChecksumFailed`] follows).
///
/// With `missing` (striped TCP transfers, [`HEADER_FLAG_STRIPED`]): the chunks that did
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

pub const RESEND_MAGIC: [u8; 4] = *b"GRDE";
/// The first bytes of a reply after the data: a [`Resend`]'s fixed part, or the start
/// of an [`Ack`].
pub const REPLY_PREFIX_LEN: usize = 16;
const RESEND_LAST: u8 = 1;
const RESEND_MISSING: u8 = 2;

impl Resend {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(REPLY_PREFIX_LEN + 4 * self.chunks.len());
        out.extend_from_slice(&RESEND_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(
            if self.last { RESEND_LAST } else { 0 } | if self.missing { RESEND_MISSING } else { 0 },
        );
        out.push(0);
        out.extend_from_slice(&self.round.to_le_bytes());
        out.extend_from_slice(&(self.chunks.len() as u32).to_le_bytes());
        for c in &self.chunks {
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

pub const CHECKSUMS_MAGIC: [u8; 4] = *b"GRDC";
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

    fn seed_header() -> Header {
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
        for version in [1, 3] {
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
    fn an_old_peer_gets_a_reject_it_can_read_and_an_old_receiver_is_named() {
        // A version-1 sender: the reject comes in version 1, which it decodes.
        let reason = RejectReason::BadHeader(WireError::UnsupportedVersion { got: 1 });
        let bytes = reason.encode();
        assert_eq!(&bytes[4..6], &1u16.to_le_bytes());
        // A version-1 receiver refusing this sender's version 2 (its reject in version
        // 1, code 1 sub 3): this sender says the receiver is older, not "version 2 is
        // not supported by version 2".
        let mut old = RejectReason::BadHeader(WireError::UnsupportedVersion { got: 2 }).encode();
        old[4..6].copy_from_slice(&1u16.to_le_bytes());
        let got = RejectReason::decode(&old).unwrap();
        assert_eq!(got, RejectReason::OldPeer { speaks: 1 });
        assert_eq!(RejectReason::decode(&got.encode()), Some(got));
        assert_eq!(
            got.to_string(),
            "it speaks protocol version 1 and this sender version 2: run the same release on both ends (or --raw)"
        );
        // A future version's reject is not taken for one of ours.
        let mut future = RejectReason::Internal.encode();
        future[4..6].copy_from_slice(&9u16.to_le_bytes());
        assert_eq!(RejectReason::decode(&future), None);
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
    fn names_stay_inside_their_directory() {
        for good in ["weights.bin", "a", "kv cache (3).pt", &"x".repeat(255)] {
            let msg = encode_name(good).unwrap();
            assert_eq!(decode_name_prefix(&msg[..NAME_PREFIX_LEN]), Ok(good.len()));
            assert_eq!(checked_name(&msg[NAME_PREFIX_LEN..]), Ok(good));
        }
        for bad in [
            "",
            ".",
            "..",
            "../etc/passwd",
            "a/b",
            "a\\b",
            "nul\0",
            "tab\t",
            &"x".repeat(256),
        ] {
            assert!(encode_name(bad).is_err(), "{bad:?}");
            assert!(checked_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(checked_name(&[0xff, 0xfe]).is_err(), "not UTF-8");
        // Characters that are not drawn but change what is: refused, saying which.
        for (bad, code) in [
            ("report\u{202E}gnp.exe", 0x202E),
            ("a\u{2066}b", 0x2066),
            ("a\u{200F}", 0x200F),
            ("zero\u{200B}width", 0x200B),
            ("\u{FEFF}bom", 0xFEFF),
            ("join\u{2060}er", 0x2060),
            ("soft\u{AD}hyphen", 0xAD),
            ("tag\u{E0041}", 0xE0041),
        ] {
            let e = checked_name(bad.as_bytes()).unwrap_err();
            assert_eq!(e, WireError::FormatCharInName { code }, "{bad:?}");
            assert!(encode_name(bad).is_err(), "{bad:?}");
            let words = e.to_string();
            assert!(
                words.contains(&format!("U+{code:04X}")) && words.contains("format character"),
                "{words}"
            );
        }
        // Letters of other scripts are names like any other.
        for good in ["données.bin", "файл", "模型.safetensors", "עברית.txt"] {
            assert_eq!(checked_name(good.as_bytes()), Ok(good));
        }
        // The reason travels in a reject.
        let reason = RejectReason::BadHeader(WireError::FormatCharInName { code: 0x202E });
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
        let reason = RejectReason::BadHeader(WireError::KeyedVerbsStriping);
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
        let mut long = encode_name("abc").unwrap();
        long[6..8].copy_from_slice(&300u16.to_le_bytes());
        assert_eq!(
            decode_name_prefix(&long[..NAME_PREFIX_LEN]),
            Err(WireError::BadName { len: 300 })
        );
    }

    #[test]
    fn names_print_with_their_unseen_characters_escaped() {
        assert_eq!(printable("weights.bin"), "weights.bin");
        assert_eq!(
            printable("/out/report\u{202E}gnp.exe"),
            "/out/report\\u{202e}gnp.exe"
        );
        assert_eq!(printable("a\tb\u{200B}c"), "a\\u{9}b\\u{200b}c");
        assert_eq!(printable("données"), "données");
    }

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
    fn a_striped_offer_round_trips_and_says_so_in_its_flags() {
        let h = seed_header().with_striped();
        let bytes = h.encode();
        assert_eq!(bytes[7], HEADER_FLAG_STRIPED);
        assert_eq!(Header::decode(&bytes), Ok(h));
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

    #[test]
    fn an_ack_carries_the_digest_and_the_repairs() {
        let ack = Ack::checked(4097, None, Some(0xdead_beef), 3);
        assert_eq!(ack.status, AckStatus::Verified);
        assert_eq!(Ack::decode(&ack.encode()), Ok(ack));
        let failed = ack.with_status(AckStatus::ChecksumFailed);
        assert_eq!(Ack::decode(&failed.encode()), Ok(failed));
        let unstored = ack.with_status(AckStatus::NotStored);
        assert_eq!(Ack::decode(&unstored.encode()), Ok(unstored));
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
        assert_eq!(Header::decode(&future), Ok(h));
        // Together with the repeat flag.
        let both = h.with_transfers(10).unwrap();
        assert_eq!(Header::decode(&both.encode()), Ok(both));
    }

    #[test]
    fn a_single_transfer_keeps_the_original_encoding() {
        // Byte for byte what a sender before the repeat flag sent (flags 0, 24..28
        // zero), but for the version and version 2's payload bytes (29..32).
        let bytes = seed_header().encode();
        let mut expected = [0u8; HEADER_LEN];
        expected[0..4].copy_from_slice(b"GRDM");
        expected[4..6].copy_from_slice(&2u16.to_le_bytes());
        expected[29..32].copy_from_slice(&[0, 1, DEFAULT_MAX_RESENDS]);
        expected[6] = 1;
        expected[8..16].copy_from_slice(&16384u64.to_le_bytes());
        expected[16..20].copy_from_slice(&16384u32.to_le_bytes());
        expected[20..24].copy_from_slice(&16u32.to_le_bytes());
        assert_eq!(bytes, expected);
        // Without the flag, whatever lies in the reserved bytes is ignored, as before
        // (byte 28 now carries hints, which change nothing a receiver must do).
        let mut junk = bytes;
        junk[24..28].copy_from_slice(&[7; 4]);
        assert_eq!(Header::decode(&junk), Ok(seed_header()));
        assert_eq!(Header::decode(&junk).unwrap().transfers, 1);
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
    fn accept_round_trip() {
        let a = AcceptInfo {
            addr: 0x7f00_dead_b000,
            rkey: 0x1234_5678,
            len: 1 << 30,
        };
        let bytes = a.encode();
        assert_eq!(AcceptInfo::decode(&bytes), Ok(a));
        let mut padded = [0u8; 196];
        padded[..ACCEPT_LEN].copy_from_slice(&bytes);
        assert_eq!(AcceptInfo::decode(&padded), Ok(a));
        assert!(matches!(
            AcceptInfo::decode(&[0u8; 196]),
            Err(WireError::BadMagic { .. })
        ));
        assert!(matches!(
            AcceptInfo::decode(&bytes[..10]),
            Err(WireError::Short { .. })
        ));
        let overflow = AcceptInfo {
            addr: u64::MAX,
            rkey: 1,
            len: 2,
        };
        assert!(AcceptInfo::decode(&overflow.encode()).is_err());
    }

    #[test]
    fn reject_round_trip_and_words() {
        let too_large = RejectReason::TooLarge {
            requested: 2 << 30,
            max: 1 << 30,
        };
        assert_eq!(
            format!("receiver rejected the transfer: {too_large}"),
            "receiver rejected the transfer: size 2 GiB exceeds its --max-bytes 1 GiB"
        );
        let all = [
            too_large,
            RejectReason::BadHeader(WireError::BadMagic {
                got: *b"abcd",
                expected: HEADER_MAGIC,
            }),
            RejectReason::BadHeader(WireError::UnsupportedVersion { got: 7 }),
            RejectReason::BadHeader(WireError::ChunkLargerThanTotal { chunk: 8, total: 4 }),
            RejectReason::BadHeader(WireError::Short { got: 3, need: 32 }),
            RejectReason::BadHeader(WireError::BadDepth { depth: 0 }),
            RejectReason::ChunkTooLarge {
                chunk: 16 << 20,
                max: 8 << 20,
            },
            RejectReason::NoMemory { bytes: 1 << 30 },
            RejectReason::NotRegistrable { bytes: 1 << 20 },
            RejectReason::BusyConnections {
                active: 16,
                max: 16,
            },
            RejectReason::BusyMemory {
                wanted: 1 << 30,
                max: 2 << 30,
            },
            RejectReason::Internal,
            RejectReason::RawOnly,
            RejectReason::BusyHandshakes {
                active: 64,
                max: 64,
            },
            RejectReason::BusyPeer { active: 8, max: 8 },
            RejectReason::BusyDescriptors {
                wanted: 65,
                max: 990,
            },
            RejectReason::NotAllowed,
            RejectReason::BadProof,
            RejectReason::KeyChallenge {
                nonce: *b"0123456789abcdef",
            },
            RejectReason::ChunkBooks {
                chunks: 1 << 24,
                per_chunk: 48,
                max: 16 << 20,
            },
            RejectReason::SizeMismatch {
                offered: 4097,
                expected: 4096,
            },
        ];
        for r in all {
            let bytes = r.encode();
            assert!(bytes.len() <= 148);
            assert_eq!(RejectReason::decode(&bytes), Some(r));
            let mut padded = [0u8; 148];
            padded[..REJECT_LEN].copy_from_slice(&bytes);
            assert_eq!(RejectReason::decode(&padded), Some(r));
        }
        // Not ours: no reason.
        assert_eq!(RejectReason::decode(&[]), None);
        assert_eq!(RejectReason::decode(&[0u8; 148]), None);
        // A code from the future.
        let mut future = RejectReason::Internal.encode();
        future[6] = 77;
        assert_eq!(
            RejectReason::decode(&future),
            Some(RejectReason::Unknown { code: 77 })
        );
    }

    #[test]
    fn words_name_the_real_limit_and_the_message_awaited() {
        // The per-address handshake cap is not --max-per-peer.
        let cap = RejectReason::BusyPeerHandshakes {
            active: 80,
            max: 80,
        };
        let words = cap.to_string();
        assert!(
            words.contains("80 sockets in their handshake") && words.contains("not --max-per-peer"),
            "{words}"
        );
        assert_eq!(RejectReason::decode(&cap.encode()), Some(cap));
        // An older sender reads it as the per-peer share it knows.
        let mut old = cap.encode();
        old[8..10].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(
            RejectReason::decode(&old),
            Some(RejectReason::BusyPeer {
                active: 80,
                max: 80
            })
        );
        // A name or proof message with a bad magic is not "no transfer header".
        let mut name = encode_name("a.bin").unwrap();
        name[0] = b'X';
        let e = decode_name_prefix(&name[..NAME_PREFIX_LEN]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "not a name message (magic 58 52 44 46, expected \"GRDF\")"
        );
        let reason = RejectReason::BadHeader(e);
        assert_eq!(RejectReason::decode(&reason.encode()), Some(reason));
        let mut proof = Proof { tag: [1; 32] }.encode();
        proof[..4].copy_from_slice(b"GRDM");
        let e = Proof::decode(&proof).unwrap_err().to_string();
        assert_eq!(
            e,
            "not a proof of the key (magic 47 52 44 4d, expected \"GRDP\")"
        );
        assert!(!e.contains("--raw"));
        // A header's still says --raw; so does an older peer's reject, which had no
        // expected magic.
        let e = Header::decode(&[0u8; HEADER_LEN]).unwrap_err();
        assert!(e.to_string().contains("no transfer header") && e.to_string().contains("--raw"));
        let mut older = RejectReason::BadHeader(e).encode();
        older[20..28].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            RejectReason::decode(&older),
            Some(RejectReason::BadHeader(e))
        );
        // Sizes that round to the same words are shown in bytes.
        let too_large = RejectReason::TooLarge {
            requested: (64 << 20) + 4,
            max: 64 << 20,
        };
        assert_eq!(
            too_large.to_string(),
            "size 67108868 bytes exceeds its --max-bytes 67108864 bytes"
        );
        let chunk = RejectReason::ChunkTooLarge {
            chunk: (1 << 30) + 4,
            max: 1 << 30,
        };
        assert!(
            chunk.to_string().contains("1073741828 bytes exceeds")
                && chunk.to_string().contains("(1073741824 bytes)"),
            "{chunk}"
        );
    }

    #[test]
    fn challenge_and_proof_round_trip_and_are_told_from_an_accept() {
        let c = Challenge { nonce: [7; 16] };
        let bytes = c.encode();
        assert_eq!(bytes.len(), ACCEPT_LEN, "read as one answer to an offer");
        assert_eq!(Challenge::decode(&bytes), Ok(c));
        assert!(matches!(
            AcceptInfo::decode(&bytes),
            Err(WireError::BadMagic { .. })
        ));
        assert_eq!(RejectReason::decode(&bytes), None);
        let p = Proof { tag: [9; 32] };
        assert_eq!(Proof::decode(&p.encode()), Ok(p));
        assert_eq!(
            Proof::decode(&p.encode()[..20]),
            Err(WireError::Short { got: 20, need: 40 })
        );
        assert!(matches!(
            Proof::decode(&bytes),
            Err(WireError::BadMagic { .. })
        ));
    }

    #[test]
    fn a_verbs_proof_follows_the_header_in_56_bytes_of_private_data() {
        let header = seed_header().encode();
        let nonce = *b"0123456789abcdef";
        let p = VerbsProof {
            nonce_id: VerbsProof::nonce_id(&nonce),
            tag: [5; VERBS_TAG_LEN],
        };
        let data = p.private_data(&header);
        assert_eq!(data.len(), 56, "RC connect private data holds 56 bytes");
        assert_eq!(
            Header::decode(&data),
            Ok(seed_header()),
            "old receivers still read it"
        );
        assert_eq!(VerbsProof::decode(&data), Some(p));
        assert_eq!(p.nonce_id, u64::from_le_bytes(*b"01234567"));
        let mut padded = [0u8; 56];
        padded[..32].copy_from_slice(&header);
        assert_eq!(VerbsProof::decode(&padded), None, "CM padding is no proof");
        assert_eq!(VerbsProof::decode(&header), None);
    }

    #[test]
    fn an_ack_must_speak_of_what_was_sent() {
        let v = |elements| Verification {
            elements,
            mismatches: 0,
            first_mismatch: None,
            crc32: None,
        };
        assert_eq!(Ack::new(4096, Some(v(1024))).check_counts(4096), Ok(()));
        assert!(Ack::new(8192, Some(v(2048)))
            .check_counts(4096)
            .unwrap_err()
            .contains("8192 bytes, but 4096 were sent"));
        assert!(Ack::new(4096, Some(v(1)))
            .check_counts(4096)
            .unwrap_err()
            .contains("counts 1 elements, but 1024"));
        assert_eq!(Ack::new(4096, None).check_counts(4096), Ok(()));
        assert_eq!(Ack::too_slow(12).check_counts(4096), Ok(()));
    }

    #[test]
    fn ack_round_trip() {
        let verified = Ack::new(
            16384,
            Some(Verification {
                elements: 4096,
                mismatches: 0,
                first_mismatch: None,
                crc32: Some(0xdead_beef),
            }),
        );
        assert_eq!(verified.status, AckStatus::Verified);
        let mismatch = Ack::new(
            16,
            Some(Verification {
                elements: 4,
                mismatches: 3,
                first_mismatch: Some(1),
                crc32: None,
            }),
        );
        assert_eq!(mismatch.status, AckStatus::Mismatch);
        let failed = Ack::new(1 << 20, None);
        assert_eq!(failed.status, AckStatus::VerifyFailed);
        let slow = Ack::decode(&Ack::too_slow(1 << 20).encode()).unwrap();
        assert_eq!(
            (slow.status, slow.received_bytes, slow.verification),
            (AckStatus::TooSlow, 1 << 20, None)
        );
        let timed = verified.with_verify_time(std::time::Duration::from_micros(1234));
        assert_eq!(timed.verify_micros, Some(1234));
        let saturated = failed.with_verify_time(std::time::Duration::from_secs(1 << 40));
        assert_eq!(saturated.verify_micros, Some(u32::MAX));
        // Without a verify time the reserved bytes stay zero (what older senders expect).
        assert_eq!(&verified.encode()[44..48], &[0; 4]);
        assert_eq!(verified.encode()[7] & ACK_HAS_VERIFY_TIME, 0);
        for ack in [verified, mismatch, failed, timed, saturated] {
            let bytes = ack.encode();
            assert_eq!(Ack::decode(&bytes), Ok(ack));
        }
    }

    #[test]
    fn ack_rejects_garbage() {
        let good = Ack::new(
            16,
            Some(Verification {
                elements: 4,
                mismatches: 0,
                first_mismatch: None,
                crc32: None,
            }),
        )
        .encode();
        assert!(matches!(
            Ack::decode(&good[..40]),
            Err(WireError::Short { .. })
        ));
        let mut bad = good;
        bad[6] = 9;
        assert_eq!(Ack::decode(&bad), Err(WireError::UnknownStatus { code: 9 }));
        let mut bad = good;
        bad[7] |= 0x40;
        assert!(matches!(
            Ack::decode(&bad),
            Err(WireError::UnknownFlags { .. })
        ));
        // "verified" with mismatches is a lie.
        let mut bad = good;
        bad[24] = 1;
        assert!(matches!(
            Ack::decode(&bad),
            Err(WireError::Inconsistent { .. })
        ));
        assert!(matches!(
            Ack::decode(&RAW_REPLY),
            Err(WireError::BadMagic { .. })
        ));
    }

    #[test]
    fn a_striped_verbs_header_carries_its_rail_count() {
        let h = seed_header().with_rails(3).unwrap();
        let bytes = h.encode();
        assert_eq!(bytes[7] & HEADER_FLAG_STRIPED, HEADER_FLAG_STRIPED);
        assert_eq!(bytes[24], 3);
        assert_eq!(Header::decode(&bytes), Ok(h));
        // A TCP striped header says no count (0), as before.
        let tcp = seed_header().with_striped();
        assert_eq!(Header::decode(&tcp.encode()).unwrap().rails, 0);
        // Lies: too many rails, a count with several transfers, a count above a byte.
        assert!(seed_header().with_rails(MAX_VERBS_RAILS + 1).is_err());
        let mut bytes = h.encode();
        bytes[24..28].copy_from_slice(&300u32.to_le_bytes());
        assert!(Header::decode(&bytes).is_err());
        bytes[24..28].copy_from_slice(&9u32.to_le_bytes());
        assert!(Header::decode(&bytes).is_err());
        assert!(seed_header()
            .with_transfers(2)
            .unwrap()
            .with_rails(2)
            .is_err());
    }

    #[test]
    fn joins_round_trip_and_lying_joins_are_refused() {
        let j = Join {
            token: 0xfeed_beef,
            rail: 2,
            rails: 3,
        };
        assert_eq!(Join::decode(&j.encode()), Ok(j));
        // Padded by the CM: trailing zeros are fine.
        let mut padded = j.encode().to_vec();
        padded.extend([0u8; 40]);
        assert_eq!(Join::decode(&padded), Ok(j));
        for lie in [
            Join { rail: 0, ..j },
            Join { rail: 3, ..j },
            Join {
                rails: 1,
                rail: 1,
                ..j
            },
            Join { rails: 9, ..j },
            Join { token: 0, ..j },
        ] {
            assert!(Join::decode(&lie.encode()).is_err(), "{lie:?}");
        }
        assert!(Join::decode(&j.encode()[..10]).is_err());
        // A header is not a join, and a join not a header.
        assert!(Join::decode(&seed_header().encode()).is_err());
        assert!(Header::decode(&j.encode()).is_err());
    }

    #[test]
    fn a_striped_accept_carries_a_token() {
        let a = StripedAccept {
            info: AcceptInfo {
                addr: 0x1000,
                rkey: 7,
                len: 4096,
            },
            token: 42,
        };
        assert_eq!(StripedAccept::decode(&a.encode()), Ok(a));
        assert!(StripedAccept::decode(&a.info.encode()).is_err(), "no token");
        let mut zero = a.encode();
        zero[ACCEPT_LEN..].fill(0);
        assert!(StripedAccept::decode(&zero).is_err());
        for r in [
            RejectReason::UnknownJoin,
            RejectReason::BadJoin { rail: 4, rails: 2 },
        ] {
            assert_eq!(RejectReason::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn a_bad_magic_decodes_to_what_it_encodes_back_to() {
        // From the fuzzer: an "expected" word with only its upper 32 bits set.
        for b in [
            0u64,
            1 << 32,
            0xffff_ffff_0000_0000,
            u32::from_le_bytes(*b"GRDF") as u64,
        ] {
            let e = WireError::from_parts(2, 0x49b2_49b2, b).unwrap();
            let (sub, a, b2) = e.to_parts();
            assert_eq!(
                WireError::from_parts(sub, a, b2),
                Some(e),
                "expected word {b:#x}"
            );
        }
        assert_eq!(
            WireError::from_parts(2, 0, 1 << 32),
            Some(WireError::BadMagic {
                got: [0; 4],
                expected: HEADER_MAGIC
            })
        );
    }
}
