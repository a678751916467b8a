//! What goes wrong decoding a peer's bytes ([`WireError`]; it travels in a reject too),
//! and the check of magic, version and length that every decoder starts with.

use super::constants::{
    ACCEPT_MAGIC, ACK_MAGIC, CHALLENGE_MAGIC, CHECKSUMS_MAGIC, HEADER_MAGIC, JOIN_MAGIC, MAX_DEPTH,
    MAX_RESENDS, MAX_TRANSFERS, NAME_MAGIC, PROOF_MAGIC, REJECT_MAGIC, RESEND_MAGIC, VERSION,
};

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
    pub(super) fn to_parts(self) -> (u16, u64, u64) {
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

    pub(super) fn from_parts(sub: u16, a: u64, b: u64) -> Option<WireError> {
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
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    pub(super) fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        out
    }
    pub(super) fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub(super) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub(super) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Check magic, version and length; return a reader positioned after the version.
pub(super) fn open<'a>(buf: &'a [u8], magic: [u8; 4], len: usize) -> Result<Reader<'a>, WireError> {
    open_versions(buf, magic, len, VERSION..=VERSION).map(|(r, _)| r)
}

/// [`open`] for a message whose layout is the same in `versions`; also the version.
pub(super) fn open_versions<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
