//! The wire formats: every byte that crosses between sender and receiver outside the data
//! itself is encoded and decoded here, and nowhere else (the TCP transport's own framing,
//! its stream hellos and frames, is `net::tcp::frames`).
//!
//! One file per message family, each with its encoders, decoders and tests; the fuzz
//! target (`host/fuzz/fuzz_targets/wire.rs`) decodes arbitrary bytes with every decoder:
//!
//! | file | holds |
//! |---|---|
//! | `constants.rs` | the protocol version, every message's magic, the bounds a decoder holds a peer to |
//! | `error.rs` | [`WireError`], and the check of magic, version and length every decoder starts with |
//! | `offer.rs` | [`Header`] (the offer) with [`Payload`], [`VerifyMode`], [`Op`], its flags and hints; `--raw`'s constants |
//! | `answers.rs` | the receiver's answers to an offer: [`AcceptInfo`], [`StripedAccept`], [`RejectReason`]; a further rail's [`Join`] |
//! | `acks.rs` | [`Ack`] and [`AckStatus`]: the verdict after the data |
//! | `repair.rs` | [`Resend`] and [`ChunkChecksums`]: the repair of chunks that failed or never came |
//! | `pieces.rs` | [`pieces::PieceResend`], its query and the sender's answer: the repair in pieces (TCP), their sizes and the bound on what is sent again |
//! | `auth.rs` | [`Challenge`], [`Proof`], [`VerbsProof`]: proof of the key (`--key-file`) |
//! | `names.rs` | the name message (`--name`) and what a name may hold ([`checked_name`], [`printable`]) |
//! | `session.rs` | [`NextOffer`]: the next transfer offered on a kept connection ([`HINT_SESSION`]) |
//!
//! The constants and the error sit below the families, which import them and nothing of
//! each other but the offer's length (auth: a verbs proof follows the header) and the offer
//! with its name (session: a next offer carries both), so no file
//! of the format imports one that imports it back.
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
//! | [`pieces::PieceResend`]: pieces of failed chunks to send again (TCP, hint 0x02) | instead of the ack | `GRDI` | 16 + 4/piece |
//! | its query: the sender's CRC32C of those pieces, please | instead of the ack | `GRDQ` | 16 + 4/piece |
//! | the answer: the CRC32C of each piece queried | from the sender on stream 0 | `GRDV` | 16 + 4/piece |
//! | name (`--name`, [`encode_name`]) | after the offer (TCP, header flag 0x02) | `GRDF` | 8 + name |
//! | [`Challenge`]: a nonce to prove the key over (`--key-file`, TCP) | the answer to an offer | `GRDN` | 28 |
//! | [`Proof`]: HMAC-SHA256 over the offer and the nonce (TCP) | the sender's reply to a challenge | `GRDP` | 40 |
//! | [`NextOffer`]: the next transfer on a kept connection (TCP, hint 0x04) | a message after the ack | `GRDO` | 40 + name |
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
//! 73 MB/s, see tests/softroce/BENCH.md). `0x02` ([`HINT_PIECES`]): the sender answers
//! piece requests ([`pieces`]); a receiver that ignores it asks for whole chunks. `0x04`
//! ([`HINT_SESSION`]): the sender keeps the connection after the ack for a [`NextOffer`].
//!
//! The CM pads private data with zeros to its fixed size, so decoders accept (and
//! ignore) trailing bytes.
//!
//! Immediate-data convention (see `net::verbs::send`): the immediate of a `*_WITH_IMM`
//! data request is its item's index + 1; over one rail it also says that every
//! item of the pass before it landed (one queue pair keeps the order).
//!
//! Ack layout: `0` magic, `4` version, `6` status u8, `7` flags u8 (0x01 verification
//! present, 0x02 first mismatch present, 0x04 crc32 present, 0x08 verify time present),
//! `8` received bytes u64, `16` elements u64, `24` mismatches u64, `32` first mismatch
//! u64, `40` crc32 u32, `44` the receiver's verification time in microseconds u32
//! (only with flag 0x08, which a receiver sets only for senders that set a header flag,
//! so senders that predate it never see it), `48` CRC32C digest of the whole transfer
//! u32 (flag 0x10), `52` chunks repaired u32. Statuses: 0 verified, 1 mismatch, 2 verify
//! failed, 3 too slow, 4 checksum failed (after the resends), 5 not stored.

mod acks;
mod answers;
mod auth;
mod constants;
mod error;
mod names;
mod offer;
pub mod pieces;
mod repair;
mod session;

pub use acks::{Ack, AckStatus, ACK_LEN};
pub use answers::{
    AcceptInfo, Join, RejectReason, StripedAccept, ACCEPT_LEN, JOIN_LEN, REJECT_LEN,
    STRIPED_ACCEPT_LEN,
};
pub use auth::{
    Challenge, Proof, VerbsProof, CHALLENGE_LEN, NONCE_LEN, PROOF_LEN, TAG_LEN, VERBS_PROOF_AT,
    VERBS_PROOF_LEN, VERBS_TAG_LEN,
};
pub use constants::{
    ACCEPT_MAGIC, ACK_MAGIC, CHALLENGE_MAGIC, CHECKSUMS_MAGIC, HEADER_MAGIC, JOIN_MAGIC, MAX_DEPTH,
    MAX_RAILS, MAX_RESENDS, MAX_TRANSFERS, MAX_VERBS_RAILS, NAME_MAGIC, OLDEST_VERSION,
    PROOF_MAGIC, REJECT_MAGIC, RESEND_MAGIC, VERSION,
};
pub use error::WireError;
pub use names::{
    checked_name, decode_name_prefix, encode_name, is_format_char, printable, MAX_NAME_LEN,
    NAME_PREFIX_LEN,
};
pub use offer::{
    Header, Op, Payload, VerifyMode, DEFAULT_MAX_RESENDS, HEADER_FLAG_NAMED, HEADER_FLAG_REPEAT,
    HEADER_FLAG_STRIPED, HEADER_LEN, HINT_PIECES, HINT_SESSION, HINT_SOLICITED, RAW_IMM, RAW_REPLY,
};
pub use repair::{ChunkChecksums, Resend, CHECKSUMS_PREFIX_LEN, REPLY_PREFIX_LEN};
pub use session::NextOffer;
