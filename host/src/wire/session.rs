//! A kept connection's next offer ([`HINT_SESSION`](super::HINT_SESSION), TCP): after
//! the ack of a transfer whose header had the hint, the receiver waits for this message
//! on the connection instead of closing it, and answers it as it answers an offer on a
//! new connection, with an [`AcceptInfo`](super::AcceptInfo) or a
//! [`RejectReason`](super::RejectReason) (each as one message). The connection's streams
//! were admitted and, with a key, proved when it opened: the next offer is not
//! challenged again.
//!
//! Layout: `0` magic "GRDO", `4` version u16, `6` reserved u16, `8` the offer's
//! [`Header`] (32 bytes), `40` the name message ([`encode_name`](super::encode_name))
//! exactly when the header says [`HEADER_FLAG_NAMED`](super::HEADER_FLAG_NAMED).

use super::constants::{NEXT_OFFER_MAGIC, VERSION};
use super::error::{open, WireError};
use super::names::{checked_name, decode_name_prefix, encode_name, NAME_PREFIX_LEN};
use super::offer::{Header, HEADER_LEN};

/// The bytes before the header.
const PREFIX_LEN: usize = 8;

/// The next transfer offered on a kept connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextOffer {
    pub header: Header,
    /// The sender's name for it (the header says [`Header::named`] exactly when there is
    /// one).
    pub name: Option<String>,
}

impl NextOffer {
    /// The message.
    ///
    /// # Errors
    /// A name a receiver would refuse, or a header that says it is named without a name
    /// (or the reverse).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.header.named != self.name.is_some() {
            return Err(WireError::Inconsistent {
                what: "a next offer's name and its header's named flag disagree",
            });
        }
        let mut out = Vec::with_capacity(PREFIX_LEN + HEADER_LEN);
        out.extend_from_slice(&NEXT_OFFER_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.header.encode());
        if let Some(name) = &self.name {
            out.extend_from_slice(&encode_name(name)?);
        }
        Ok(out)
    }

    /// Whether `buf` is meant as a next offer (its magic), to tell it from a stray message.
    pub fn is_one(buf: &[u8]) -> bool {
        buf.starts_with(&NEXT_OFFER_MAGIC)
    }

    /// # Errors
    /// A wrong magic or version, a header that does not decode, a name missing, bad or
    /// not announced, or bytes after it.
    pub fn decode(buf: &[u8]) -> Result<NextOffer, WireError> {
        let _ = open(buf, NEXT_OFFER_MAGIC, PREFIX_LEN + HEADER_LEN)?;
        let header = Header::decode(&buf[PREFIX_LEN..PREFIX_LEN + HEADER_LEN])?;
        let rest = &buf[PREFIX_LEN + HEADER_LEN..];
        let name = match header.named {
            false if rest.is_empty() => None,
            false => {
                return Err(WireError::Inconsistent {
                    what: "bytes after a next offer without a name",
                })
            }
            true => {
                let len = decode_name_prefix(rest)?;
                if rest.len() != NAME_PREFIX_LEN + len {
                    return Err(WireError::Inconsistent {
                        what: "a next offer's name is not the length it says",
                    });
                }
                Some(checked_name(&rest[NAME_PREFIX_LEN..])?.to_string())
            }
        };
        Ok(NextOffer { header, name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Op, Payload, VerifyMode};

    fn header() -> Header {
        Header::of(Op::Send, 12_345, 4096, 8, Payload::Opaque)
            .and_then(|h| h.with_payload(Payload::Opaque, VerifyMode::Checksum, 3))
            .unwrap()
            .with_session()
    }

    #[test]
    fn next_offers_round_trip_with_and_without_a_name() {
        let plain = NextOffer {
            header: header(),
            name: None,
        };
        assert_eq!(NextOffer::decode(&plain.encode().unwrap()), Ok(plain));
        let named = NextOffer {
            header: header().with_name(),
            name: Some("weights.bin".into()),
        };
        let bytes = named.encode().unwrap();
        assert!(NextOffer::is_one(&bytes));
        assert_eq!(NextOffer::decode(&bytes), Ok(named));
    }

    #[test]
    fn a_next_offer_whose_name_lies_is_refused() {
        let named = NextOffer {
            header: header().with_name(),
            name: Some("a".into()),
        };
        let bytes = named.encode().unwrap();
        // Cut short, longer than it says, and a name without the flag.
        assert!(NextOffer::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(b'b');
        assert!(NextOffer::decode(&longer).is_err());
        let mut unannounced = NextOffer {
            header: header(),
            name: None,
        }
        .encode()
        .unwrap();
        unannounced.extend_from_slice(&encode_name("x").unwrap());
        assert!(NextOffer::decode(&unannounced).is_err());
        // A name the receiver would not write, or a flag without one.
        let mut bad = bytes[..PREFIX_LEN + HEADER_LEN].to_vec();
        bad.extend_from_slice(&crate::wire::NAME_MAGIC);
        bad.extend_from_slice(&VERSION.to_le_bytes());
        bad.extend_from_slice(&2u16.to_le_bytes());
        bad.extend_from_slice(b"..");
        assert!(NextOffer::decode(&bad).is_err());
        let flag_only = NextOffer {
            header: header().with_name(),
            name: None,
        };
        assert!(flag_only.encode().is_err());
        // Not a next offer at all.
        assert!(NextOffer::decode(&header().encode()).is_err());
        assert!(!NextOffer::is_one(&header().encode()));
    }
}
