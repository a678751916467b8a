//! `--key-file PATH`: a receiver with a key serves only senders holding the same key.
//!
//! The receiver answers an offer with a fresh random nonce ([`Challenge`]); the sender
//! proves it holds the key with HMAC-SHA256 over the offer's bytes and that nonce
//! ([`Proof`]). The nonce is new for every offer, so a proof recorded on the network and
//! replayed later does not match; the offer's bytes are in the MAC, so a proof cannot be
//! moved onto another offer (a larger one, say). The check happens before the receiver
//! allocates anything for the transfer. The key itself never crosses the network.
//!
//! Every further stream of a TCP transfer (its socket 1..N, and a striped transfer's
//! sockets on other rails, which may come from other addresses) proves the key in the
//! same way on its own socket: the receiver answers its stream hello with a fresh nonce
//! and the stream sends HMAC-SHA256 over the hello's bytes (which carry the
//! connection's token) and that nonce, under a label of its own
//! ([`Key::prove_stream`]), before the stream joins. The token alone, which travels in
//! the clear, joins nothing at a receiver with a key.
//!
//! This authenticates the offer and the streams, not the data: the data is neither encrypted nor
//! authenticated (every byte of it is verified against the pattern anyway).
//!
//! [`Challenge`]: crate::wire::Challenge
//! [`Proof`]: crate::wire::Proof

use anyhow::{bail, Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;

/// Bytes of a nonce (as the wire's challenge carries it).
pub use crate::wire::NONCE_LEN;
/// Bytes of a proof: an HMAC-SHA256 tag (as the wire's proof carries it).
pub const PROOF_LEN: usize = crate::wire::TAG_LEN;
/// The shortest key accepted: 128 bits.
pub const MIN_KEY_LEN: usize = 16;
/// What an offer's proof is for (the first bytes under the MAC).
const OFFER_LABEL: &[u8] = b"gpu-rdma offer proof v1";
/// What a joining stream's proof is for.
const STREAM_LABEL: &[u8] = b"gpu-rdma stream proof v1";

/// A shared secret, read from a file.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)") // never the secret itself in a log
    }
}

impl Key {
    /// The file's bytes, without surrounding whitespace (so `echo`ed keys work), at
    /// least [`MIN_KEY_LEN`] bytes.
    pub fn from_file(path: &Path) -> Result<Key> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("--key-file {}: cannot read it", path.display()))?;
        Key::from_bytes(&bytes).with_context(|| format!("--key-file {}", path.display()))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Key> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < MIN_KEY_LEN {
            bail!(
                "the key has {} bytes; at least {MIN_KEY_LEN} are needed (e.g. `head -c 32 /dev/urandom | base64 > key`)",
                trimmed.len()
            );
        }
        Ok(Key(trimmed.to_vec()))
    }

    fn mac(&self, offer: &[u8], nonce: &[u8; NONCE_LEN]) -> Hmac<Sha256> {
        self.labelled(OFFER_LABEL, offer, nonce)
    }

    /// The MAC of `message` under `nonce`, for the use `label` names: a proof made for
    /// one use (a stream's hello) cannot pass for another (an offer).
    fn labelled(&self, label: &[u8], message: &[u8], nonce: &[u8; NONCE_LEN]) -> Hmac<Sha256> {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
        mac.update(label);
        mac.update(nonce);
        mac.update(message);
        mac
    }

    /// A joining stream's proof for its `hello` (the bytes it sent: they hold the
    /// connection's token and the stream's index) under the receiver's `nonce` for it.
    pub fn prove_stream(&self, hello: &[u8], nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
        self.labelled(STREAM_LABEL, hello, nonce)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is this key's [`Key::prove_stream`] for `hello` under `nonce`
    /// (compared in constant time).
    pub fn verify_stream(
        &self,
        hello: &[u8],
        nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        self.labelled(STREAM_LABEL, hello, nonce)
            .verify_slice(proof)
            .is_ok()
    }

    /// The sender's proof for `offer` (its bytes as sent) under `nonce`.
    pub fn prove(&self, offer: &[u8], nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
        self.mac(offer, nonce).finalize().into_bytes().into()
    }

    /// The first `N` bytes of the proof (verbs carries 16 in its connect request).
    pub fn prove_truncated<const N: usize>(
        &self,
        offer: &[u8],
        nonce: &[u8; NONCE_LEN],
    ) -> [u8; N] {
        let full = self.prove(offer, nonce);
        let mut out = [0u8; N];
        out.copy_from_slice(&full[..N]);
        out
    }

    /// Whether `tag` is the first bytes of this key's proof for `offer` under `nonce`
    /// (compared in constant time; at least 16 bytes).
    pub fn verify_truncated(&self, offer: &[u8], nonce: &[u8; NONCE_LEN], tag: &[u8]) -> bool {
        tag.len() >= 16 && self.mac(offer, nonce).verify_truncated_left(tag).is_ok()
    }

    /// Whether `proof` is this key's for `offer` under `nonce` (compared in constant
    /// time).
    pub fn verify(&self, offer: &[u8], nonce: &[u8; NONCE_LEN], proof: &[u8; PROOF_LEN]) -> bool {
        self.mac(offer, nonce).verify_slice(proof).is_ok()
    }
}

/// The nonces a verbs receiver has handed out and not yet seen used: each is good once,
/// from the address it was given to, within `ttl`. Bounded: a peer asking for nonces
/// without ever using them cannot grow it past `capacity`.
#[derive(Debug)]
pub struct Nonces {
    issued: std::collections::HashMap<u64, Issued>,
    ttl: std::time::Duration,
    capacity: usize,
}

#[derive(Debug)]
struct Issued {
    nonce: [u8; NONCE_LEN],
    peer: std::net::IpAddr,
    at: std::time::Instant,
}

impl Nonces {
    pub fn new(ttl: std::time::Duration, capacity: usize) -> Nonces {
        Nonces {
            issued: Default::default(),
            ttl,
            capacity,
        }
    }

    /// A fresh nonce for `peer`, kept under its first 8 bytes; `None` when the table is
    /// full of unexpired nonces (or no randomness could be had).
    pub fn issue(&mut self, peer: std::net::IpAddr) -> Option<[u8; NONCE_LEN]> {
        let now = std::time::Instant::now();
        if self.issued.len() >= self.capacity {
            let ttl = self.ttl;
            self.issued.retain(|_, i| now.duration_since(i.at) < ttl);
        }
        if self.issued.len() >= self.capacity {
            return None;
        }
        let nonce = fresh_nonce().ok()?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&nonce[..8]);
        self.issued.insert(
            u64::from_le_bytes(id),
            Issued {
                nonce,
                peer: super::allow::peer_key(peer),
                at: now,
            },
        );
        Some(nonce)
    }

    /// The nonce issued under `id` to `peer`, taken (it is good once); `None` if there is
    /// none, it went to another address, or it expired.
    pub fn take(&mut self, id: u64, peer: std::net::IpAddr) -> Option<[u8; NONCE_LEN]> {
        let issued = self.issued.remove(&id)?;
        let fresh = issued.at.elapsed() < self.ttl;
        (fresh && issued.peer == super::allow::peer_key(peer)).then_some(issued.nonce)
    }

    pub fn len(&self) -> usize {
        self.issued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.issued.is_empty()
    }
}

/// A fresh random nonce from the kernel's generator (`getrandom(2)`: no file
/// to open, so it works where `/dev` is absent, and under Miri).
pub fn fresh_nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    let mut filled = 0;
    while filled < NONCE_LEN {
        let rest = &mut nonce[filled..];
        // SAFETY: `rest` is a live, writable slice of `rest.len()` bytes for
        // the whole call; getrandom writes at most that many.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += got as usize;
    }
    Ok(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_only_for_its_key_offer_and_nonce() {
        let key = Key::from_bytes(b"  0123456789abcdef0123\n").unwrap();
        let other = Key::from_bytes(b"0123456789abcdef0124").unwrap();
        let (n1, n2) = (fresh_nonce().unwrap(), fresh_nonce().unwrap());
        assert_ne!(n1, n2, "nonces are fresh");
        let offer = b"an offer of 1 GiB";
        let proof = key.prove(offer, &n1);
        assert!(key.verify(offer, &n1, &proof));
        assert!(
            !key.verify(offer, &n2, &proof),
            "a replay under a new nonce"
        );
        assert!(
            !key.verify(b"an offer of 2 GiB", &n1, &proof),
            "another offer"
        );
        assert!(!other.verify(offer, &n1, &proof), "another key");
    }

    #[test]
    fn a_streams_proof_holds_only_for_its_hello_nonce_and_use() {
        let key = Key::from_bytes(&[5; 32]).unwrap();
        let other = Key::from_bytes(&[6; 32]).unwrap();
        let (n1, n2) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let hello = b"GRDS hello of stream 1, token 42";
        let proof = key.prove_stream(hello, &n1);
        assert!(key.verify_stream(hello, &n1, &proof));
        assert!(!key.verify_stream(hello, &n2, &proof), "another nonce");
        assert!(
            !key.verify_stream(b"GRDS hello of stream 2, token 42", &n1, &proof),
            "another stream's hello"
        );
        assert!(!other.verify_stream(hello, &n1, &proof), "another key");
        // An offer's proof is not a stream's, nor the other way round.
        assert!(!key.verify_stream(hello, &n1, &key.prove(hello, &n1)));
        assert!(!key.verify(hello, &n1, &proof));
    }

    #[test]
    fn a_truncated_proof_checks_the_same_way() {
        let key = Key::from_bytes(&[1; 32]).unwrap();
        let nonce = [3; NONCE_LEN];
        let tag: [u8; 16] = key.prove_truncated(b"offer", &nonce);
        assert!(key.verify_truncated(b"offer", &nonce, &tag));
        assert!(!key.verify_truncated(b"offer", &[4; NONCE_LEN], &tag));
        assert!(
            !key.verify_truncated(b"offer", &nonce, &tag[..8]),
            "too short"
        );
    }

    #[test]
    fn nonces_are_good_once_from_their_address_in_time_and_bounded() {
        use std::net::IpAddr;
        use std::time::Duration;
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let mut n = Nonces::new(Duration::from_secs(60), 2);
        let id = |nonce: [u8; NONCE_LEN]| u64::from_le_bytes(nonce[..8].try_into().unwrap());
        let first = n.issue(a).unwrap();
        assert_eq!(n.take(id(first), a), Some(first));
        assert_eq!(n.take(id(first), a), None, "a replay finds nothing");
        let second = n.issue(a).unwrap();
        assert_eq!(n.take(id(second), b), None, "another address");
        assert_eq!(n.take(id(second), a), None, "and it is gone");
        n.issue(a).unwrap();
        n.issue(b).unwrap();
        assert_eq!(n.issue(a), None, "full of unexpired nonces");
        let mut short = Nonces::new(Duration::ZERO, 1);
        let old = short.issue(a).unwrap();
        assert!(short.issue(a).is_some(), "expired ones make room");
        assert_eq!(short.take(id(old), a), None);
    }

    #[test]
    fn short_keys_are_refused() {
        let e = Key::from_bytes(b"short\n").unwrap_err().to_string();
        assert!(e.contains("the key has 5 bytes; at least 16"), "{e}");
        assert_eq!(
            format!("{:?}", Key::from_bytes(&[7; 32]).unwrap()),
            "Key(..)"
        );
    }
}
