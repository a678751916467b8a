//! The numbers every message of the format shares: the protocol version, each message's
//! magic, and the bounds the decoders hold a peer to. They sit apart, below the messages:
//! [`WireError`](super::WireError) names the magics (which message was awaited) and the
//! bounds in its words, and every message file takes them and the error, so neither
//! imports the other back.

pub const VERSION: u16 = 3;
/// Versions a receiver answers with a reject its sender can decode (see
/// [`RejectReason::encode`](super::RejectReason::encode)): the old layout of the reject is the same.
pub const OLDEST_VERSION: u16 = 1;
pub const HEADER_MAGIC: [u8; 4] = *b"GRDM";
pub const ACCEPT_MAGIC: [u8; 4] = *b"GRDA";
pub const REJECT_MAGIC: [u8; 4] = *b"GRDR";
pub const ACK_MAGIC: [u8; 4] = *b"GRDK";
pub const JOIN_MAGIC: [u8; 4] = *b"GRDJ";
pub const CHALLENGE_MAGIC: [u8; 4] = *b"GRDN";
pub const PROOF_MAGIC: [u8; 4] = *b"GRDP";
pub const NAME_MAGIC: [u8; 4] = *b"GRDF";
pub const RESEND_MAGIC: [u8; 4] = *b"GRDE";
pub const CHECKSUMS_MAGIC: [u8; 4] = *b"GRDC";
/// Most work requests a sender may keep in flight (and a receiver keeps posted).
pub const MAX_DEPTH: u32 = 4096;
/// Most transfers one connection may carry.
pub const MAX_TRANSFERS: u32 = 1 << 20;
/// Most rounds of resends a sender may ask for (`--max-resends`).
pub const MAX_RESENDS: u8 = 16;
/// Most rails of one striped verbs transfer (8 covers the NICs of a GPU server).
pub const MAX_VERBS_RAILS: u8 = 8;
/// Most rails of one striped transfer of any transport (bits of a failed-rail mask).
pub const MAX_RAILS: u8 = 32;
/// The next offer on a kept connection ([`super::session`]).
pub const NEXT_OFFER_MAGIC: [u8; 4] = *b"GRDO";
