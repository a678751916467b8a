//! The receiver's answers to an offer: where to write ([`AcceptInfo`]; a striped verbs
//! transfer's rail 0 adds a token, [`StripedAccept`]), or why not ([`RejectReason`]); and
//! the [`Join`] with which a further rail of a striped verbs transfer names that token.

use super::auth::NONCE_LEN;
use super::constants::{
    ACCEPT_MAGIC, JOIN_MAGIC, MAX_VERBS_RAILS, OLDEST_VERSION, REJECT_MAGIC, VERSION,
};
use super::error::{open, open_versions, WireError};
use crate::units::{format_bytes, format_bytes_apart};

pub const ACCEPT_LEN: usize = 28;
pub const REJECT_LEN: usize = 28;
pub const JOIN_LEN: usize = 16;
pub const STRIPED_ACCEPT_LEN: usize = ACCEPT_LEN + 8;

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

/// The accept of a striped verbs transfer's rail 0 ([`HEADER_FLAG_STRIPED`](super::HEADER_FLAG_STRIPED) with a rail
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
/// instead of a [`Header`](super::Header). Layout: `0` magic "GRDJ", `4` version u16, `6` rail u8
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
    /// [`VerbsProof`](super::VerbsProof) over this nonce after its header.
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
    /// The receiver's caller saw the offer (the library's `accept`) and declined it, or
    /// did not take it within the receiver's `--timeout`.
    #[error("its caller declined this transfer (or did not take it within its timeout)")]
    Declined,
    /// The receiver takes one transfer per offer into its caller's buffer (the
    /// library's `receive_into`, Python's `recv_into`), and the offer asked for several
    /// on one connection (`--iters` with `--reuse-connection`). Before code 21 it was
    /// refused as an inconsistent header, which told a sender nothing it could act on.
    #[error(
        "it receives one transfer per offer into its caller's buffer, and this offer asked for {transfers}; drop --reuse-connection (each of --iters then offers its own)"
    )]
    OneTransferPerBuffer { transfers: u64 },
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
            RejectReason::Declined => (20, 0, 0, 0),
            RejectReason::OneTransferPerBuffer { transfers } => (21, 0, transfers, 0),
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
            20 => RejectReason::Declined,
            21 => RejectReason::OneTransferPerBuffer { transfers: a },
            _ => RejectReason::Unknown { code },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::offer::tests::seed_header;
    use crate::wire::{
        decode_name_prefix, encode_name, Header, Proof, HEADER_LEN, HEADER_MAGIC, NAME_PREFIX_LEN,
    };

    #[test]
    fn an_old_peer_gets_a_reject_it_can_read_and_an_old_receiver_is_named() {
        // A version-1 sender: the reject comes in version 1, which it decodes.
        let reason = RejectReason::BadHeader(WireError::UnsupportedVersion { got: 1 });
        let bytes = reason.encode();
        assert_eq!(&bytes[4..6], &1u16.to_le_bytes());
        // A version-1 receiver refusing this sender's version (its reject in version
        // 1, code 1 sub 3): this sender says the receiver is older, not "version 3 is
        // not supported by version 3".
        let mut old =
            RejectReason::BadHeader(WireError::UnsupportedVersion { got: VERSION }).encode();
        old[4..6].copy_from_slice(&1u16.to_le_bytes());
        let got = RejectReason::decode(&old).unwrap();
        assert_eq!(got, RejectReason::OldPeer { speaks: 1 });
        assert_eq!(RejectReason::decode(&got.encode()), Some(got));
        assert_eq!(
            got.to_string(),
            "it speaks protocol version 1 and this sender version 3: run the same release on both ends (or --raw)"
        );
        // A future version's reject is not taken for one of ours.
        let mut future = RejectReason::Internal.encode();
        future[4..6].copy_from_slice(&9u16.to_le_bytes());
        assert_eq!(RejectReason::decode(&future), None);
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
            RejectReason::Declined,
            RejectReason::OneTransferPerBuffer { transfers: 5 },
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
}
