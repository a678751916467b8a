//! The other side's control messages, in order, not yet taken: at most
//! [`MAX_WAITING`] of them and [`MAX_WAITING_BYTES`] together. Each side sends messages
//! in answer to the other's (an offer's name, a round's request and its CRCs, an ack, a
//! next offer), one or two at a time; a peer that sends unasked (a 64 MiB message again
//! and again, or empty ones) would otherwise grow this side's memory at line rate, each
//! message counting as news against the idle timeout.

use crate::net::{Rail, MAX_MESSAGE};
use std::collections::VecDeque;

/// Messages waiting to be taken, at most.
pub const MAX_WAITING: usize = 64;
/// Their bytes together, at most: room for the largest message and then some.
pub const MAX_WAITING_BYTES: usize = 2 * MAX_MESSAGE;

/// Messages in order of arrival.
#[derive(Debug, Default)]
pub struct Inbox {
    messages: VecDeque<(Rail, Vec<u8>)>,
    bytes: usize,
}

impl Inbox {
    /// Keep a message that came on `rail`.
    ///
    /// # Errors
    /// Keeping it would pass [`MAX_WAITING`] or [`MAX_WAITING_BYTES`]: the peer sends
    /// what nobody asked for (the message is dropped; the rail should be given up).
    pub fn push(&mut self, rail: Rail, bytes: Vec<u8>) -> Result<(), String> {
        let total = self.bytes.saturating_add(bytes.len());
        if self.messages.len() >= MAX_WAITING || total > MAX_WAITING_BYTES {
            return Err(format!(
                "protocol error: the peer sent more messages than were asked for ({} waiting, {total} bytes; at most {MAX_WAITING} and {MAX_WAITING_BYTES})",
                self.messages.len() + 1
            ));
        }
        self.bytes = total;
        self.messages.push_back((rail, bytes));
        Ok(())
    }

    /// The oldest message, and the rail it came on.
    pub fn pop(&mut self) -> Option<(Rail, Vec<u8>)> {
        let m = self.messages.pop_front()?;
        self.bytes -= m.1.len();
        Some(m)
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_out_in_order_and_a_flood_is_an_error_at_the_cap() {
        let mut inbox = Inbox::default();
        inbox.push(1, b"one".to_vec()).unwrap();
        inbox.push(0, b"two".to_vec()).unwrap();
        assert_eq!(inbox.pop(), Some((1, b"one".to_vec())));
        assert_eq!(inbox.pop(), Some((0, b"two".to_vec())));
        assert!(inbox.pop().is_none() && inbox.is_empty());
        // Empty messages count too.
        for _ in 0..MAX_WAITING {
            inbox.push(0, Vec::new()).unwrap();
        }
        let e = inbox.push(0, Vec::new()).unwrap_err();
        assert!(e.contains("more messages than were asked for"), "{e}");
        // Taking one makes room for one.
        inbox.pop().unwrap();
        inbox.push(0, Vec::new()).unwrap();
        // Bytes: the largest message fits twice, not a third time.
        let mut inbox = Inbox::default();
        inbox.push(0, vec![0; MAX_MESSAGE]).unwrap();
        inbox.push(0, vec![0; MAX_MESSAGE]).unwrap();
        assert!(inbox.push(0, vec![0; 1]).is_err());
        inbox.pop().unwrap();
        inbox.push(0, vec![0; MAX_MESSAGE]).unwrap();
    }
}
