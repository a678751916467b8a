//! Proof of the key (`--key-file`, see [`crate::server::key`]): the receiver's
//! [`Challenge`], the sender's [`Proof`] over TCP, and the [`VerbsProof`] that rides in a
//! verbs connect request after the header.

use super::constants::{CHALLENGE_MAGIC, PROOF_MAGIC, VERSION};
use super::error::{open, WireError};
use super::offer::HEADER_LEN;

/// Bytes of the receiver's nonce, as a challenge carries it.
pub const NONCE_LEN: usize = 16;
/// Bytes of an HMAC-SHA256 tag, as a proof carries it ([`crate::server::key`] makes it).
pub const TAG_LEN: usize = 32;

/// The receiver's answer to an offer when it has a `--key-file`: prove you hold the
/// key over this nonce (see [`crate::server::key`]). The same length as an accept, so a
/// sender reads one answer of [`ACCEPT_LEN`](super::ACCEPT_LEN) bytes and tells the three apart by magic.
///
/// Layout: `0` magic "GRDN", `4` version u16, `6` reserved u16, `8` nonce (16 bytes),
/// `24` reserved u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; NONCE_LEN],
}

pub const CHALLENGE_LEN: usize = 28;
/// Layout: `0` magic "GRDP", `4` version u16, `6` reserved u16, `8` HMAC-SHA256 tag.
pub const PROOF_LEN: usize = 8 + TAG_LEN;
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
    pub tag: [u8; TAG_LEN],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::offer::tests::seed_header;
    use crate::wire::{AcceptInfo, Header, RejectReason, ACCEPT_LEN};

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
}
