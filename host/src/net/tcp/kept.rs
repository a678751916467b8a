//! A receiver's connection kept after a transfer, for the sender's next offer on it
//! ([`HINT_SESSION`](crate::wire::HINT_SESSION)): the readers stay, no landing is lent,
//! and the next message must be a [`NextOffer`]. That offer goes to the serving loop as
//! a [`TcpOffer`] like any other (admitted, shown to a library caller, given memory);
//! its accept or reject goes back as one message on the connection.
//!
//! The streams were admitted and, with a key, proved when the connection opened; a next
//! offer is not challenged again. A kept connection holds its sockets and reader
//! threads while it waits, at most its idle time, and outside the receiver's admission
//! (which counts transfers): the sender that offered the session decides when it ends by
//! closing.

use super::frames::Hello;
use super::listen::{Accepted, TcpOffer};
use super::recv::TcpReceiver;
use crate::transfer::RecvOutcome;
use crate::wire::{AcceptInfo, Header, NextOffer, RejectReason, WireError};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// An accepted connection between its transfers.
pub struct KeptConn {
    pub(super) receiver: TcpReceiver,
    pub(super) peer: SocketAddr,
    /// The connection's first hello (its streams).
    pub(super) hello: Hello,
    /// The sender's address on each rail, as the first accept found them.
    rails_from: Vec<Option<String>>,
    /// What the connection's offers must say of its rails (as the first did).
    rails: u8,
    striped: bool,
    pub(super) timeout: Duration,
}

impl KeptConn {
    /// Keep `receiver`, accepted for `first` from `peer` with `hello` (its streams),
    /// for the next offer; `timeout` bounds its writes.
    pub fn new(
        receiver: TcpReceiver,
        peer: SocketAddr,
        hello: Hello,
        first: &Header,
        rails_from: Vec<Option<String>>,
        timeout: Duration,
    ) -> KeptConn {
        KeptConn {
            receiver,
            peer,
            hello,
            rails_from,
            rails: first.rails,
            striped: first.striped,
            timeout,
        }
    }

    /// Wait up to `idle` for the sender's next offer. `None`: the sender closed (its
    /// session over), sent nothing in time, or sent something else (a bad offer is
    /// refused with its reason first); the connection is closed then.
    pub fn next_offer(mut self, idle: Duration) -> Option<TcpOffer> {
        let bytes = self.receiver.next_message(Instant::now() + idle)?;
        if !NextOffer::is_one(&bytes) {
            return None;
        }
        match NextOffer::decode(&bytes) {
            Ok(next) => Some(TcpOffer::kept(self, next.header, next.name)),
            Err(e) => {
                let _ = self.refuse(RejectReason::BadHeader(e), None);
                None
            }
        }
    }

    /// Accept `header`, an offer on this connection: the accept goes as a message.
    pub(super) fn accept(mut self, header: &Header) -> Result<Accepted, RecvOutcome> {
        if header.rails != self.rails || header.striped != self.striped {
            let reason = RejectReason::BadHeader(WireError::Inconsistent {
                what: "a next offer that names other rails than its connection has",
            });
            return Err(self.refuse(reason, None));
        }
        let accept = AcceptInfo {
            addr: 0,
            rkey: 0,
            len: header.total_bytes,
        };
        if !self.receiver.send_message(&accept.encode()) {
            return Err(RecvOutcome::Failed {
                peer: self.peer.to_string(),
                error: format!(
                    "{}: the connection closed before the accept of its next offer",
                    self.peer
                ),
            });
        }
        Ok(Accepted {
            receiver: self.receiver,
            rails_from: self.rails_from,
            missing_rails: Vec::new(),
            accepted_at: Instant::now(),
        })
    }

    /// Refuse the offer on this connection, saying why, and close it; what to report.
    pub(super) fn refuse(mut self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        let sent = self.receiver.send_message(&reason.encode());
        let mut text = reason.to_string();
        if let Some(detail) = detail {
            text = format!("{text}: {detail}");
        }
        if !sent {
            text = format!("{text} (and the reject could not be sent: the connection closed)");
        }
        RecvOutcome::Rejected {
            peer: self.peer.to_string(),
            reason: text,
        }
    }
}
