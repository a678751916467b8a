//! Control messages over verbs, of any length up to [`MAX_MESSAGE`]: cut into fragments
//! of at most one control slot each (a SEND into a receive posted on a slot), and put
//! back together on the other side, in order (RC delivers a queue pair's SENDs in
//! order, and a message goes on one rail). Pure: encoding and checking here, posting in
//! the links.
//!
//! ```text
//! Fragment (12 + n bytes, at most one slot):  0 magic "GRDG"  4 message length u32
//!                                              8 offset of these bytes in it u32
//!                                             12 n bytes of the message
//! ```
//!
//! A receiver takes a fragment only where it continues the message in progress (offset
//! 0 starts one, of a length up to [`MAX_MESSAGE`]); anything else is a protocol error,
//! so a peer that lies about lengths holds at most one message's bytes.

use super::conn::SLOT;
use crate::net::MAX_MESSAGE;

pub const FRAGMENT_MAGIC: [u8; 4] = *b"GRDG";
/// A fragment's header.
pub const FRAGMENT_HEAD: usize = 12;
/// A message's bytes per fragment at most.
pub const FRAGMENT_BYTES: usize = SLOT - FRAGMENT_HEAD;

/// The fragments of `message`, each at most a slot.
pub fn fragments(message: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    let total = message.len() as u32;
    // An empty message is one fragment of no bytes.
    let count = message.len().div_ceil(FRAGMENT_BYTES).max(1);
    (0..count).map(move |k| {
        let from = k * FRAGMENT_BYTES;
        let part = &message[from..(from + FRAGMENT_BYTES).min(message.len())];
        let mut out = Vec::with_capacity(FRAGMENT_HEAD + part.len());
        out.extend_from_slice(&FRAGMENT_MAGIC);
        out.extend_from_slice(&total.to_le_bytes());
        out.extend_from_slice(&(from as u32).to_le_bytes());
        out.extend_from_slice(part);
        out
    })
}

/// How many fragments a message of `len` bytes takes.
pub fn fragment_count(len: usize) -> usize {
    len.div_ceil(FRAGMENT_BYTES).max(1)
}

/// The message being put back together on one rail.
#[derive(Debug, Default)]
pub struct Reassembly {
    bytes: Vec<u8>,
    total: usize,
    /// A message is in progress.
    open: bool,
}

impl Reassembly {
    /// Take one fragment: the whole message once its last fragment came, or why the
    /// fragment does not fit.
    pub fn take(&mut self, fragment: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if fragment.len() < FRAGMENT_HEAD || fragment[..4] != FRAGMENT_MAGIC {
            return Err(format!(
                "protocol error: a control message of {} bytes that is no fragment",
                fragment.len()
            ));
        }
        let u32_at = |i: usize| {
            u32::from_le_bytes([
                fragment[i],
                fragment[i + 1],
                fragment[i + 2],
                fragment[i + 3],
            ]) as usize
        };
        let (total, offset) = (u32_at(4), u32_at(8));
        let part = &fragment[FRAGMENT_HEAD..];
        if total > MAX_MESSAGE {
            return Err(format!(
                "protocol error: a control message of {total} bytes (at most {MAX_MESSAGE})"
            ));
        }
        if offset == 0 {
            if self.open {
                return Err("protocol error: a control message began inside another".into());
            }
            self.bytes = Vec::with_capacity(total.min(1 << 20));
            self.total = total;
            self.open = true;
        }
        let fits = self.open
            && total == self.total
            && offset == self.bytes.len()
            && offset + part.len() <= total
            && (part.len() == FRAGMENT_BYTES || offset + part.len() == total);
        if !fits {
            return Err(format!(
                "protocol error: a fragment of {} bytes at {offset} of a {total}-byte control message does not continue it",
                part.len()
            ));
        }
        self.bytes.extend_from_slice(part);
        if self.bytes.len() < self.total {
            return Ok(None);
        }
        self.open = false;
        Ok(Some(std::mem::take(&mut self.bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_every_length_come_back_whole() {
        for len in [
            0,
            1,
            FRAGMENT_BYTES - 1,
            FRAGMENT_BYTES,
            FRAGMENT_BYTES + 1,
            70_000,
        ] {
            let message: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let parts: Vec<Vec<u8>> = fragments(&message).collect();
            assert_eq!(parts.len(), fragment_count(len), "{len}");
            assert!(parts.iter().all(|p| p.len() <= SLOT));
            let mut r = Reassembly::default();
            let mut out = None;
            for (k, p) in parts.iter().enumerate() {
                let got = r.take(p).unwrap();
                assert_eq!(got.is_some(), k + 1 == parts.len());
                out = got.or(out);
            }
            assert_eq!(out.unwrap(), message, "{len}");
        }
    }

    #[test]
    fn fragments_out_of_order_or_lying_are_refused() {
        let message = vec![5u8; 3 * FRAGMENT_BYTES];
        let parts: Vec<Vec<u8>> = fragments(&message).collect();
        let mut r = Reassembly::default();
        assert!(r.take(&parts[1]).is_err(), "a middle fragment first");
        let mut r = Reassembly::default();
        r.take(&parts[0]).unwrap();
        assert!(r.take(&parts[2]).is_err(), "a fragment skipped");
        let mut r = Reassembly::default();
        r.take(&parts[0]).unwrap();
        assert!(r.take(&parts[0]).is_err(), "a message begun twice");
        let mut huge = parts[0].clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            Reassembly::default().take(&huge).is_err(),
            "beyond MAX_MESSAGE"
        );
        assert!(
            Reassembly::default().take(b"GRDK....").is_err(),
            "not a fragment"
        );
        // A short fragment before the last is a lie about the length.
        let mut short = parts[0].clone();
        short.truncate(FRAGMENT_HEAD + 10);
        assert!(Reassembly::default().take(&short).is_err());
    }
}
