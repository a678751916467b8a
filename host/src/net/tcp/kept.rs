//! A receiver's connection kept after a transfer, for the sender's next offer on it
//! ([`HINT_SESSION`](crate::wire::HINT_SESSION)): the readers stay, no landing is lent,
//! and the next message must be a [`NextOffer`]. That offer goes to the serving loop as
//! a [`TcpOffer`](super::listen::TcpOffer) like any other (admitted, shown to a library
//! caller, given memory); its accept or reject goes back as one message on the
//! connection.
//!
//! The streams were admitted and, with a key, proved when the connection opened; a next
//! offer is not challenged again. A kept connection holds its sockets and reader
//! threads while it waits, at most its idle time, counted apart from the transfers by
//! its [`KeptSlot`] (admission keeps only so many, in all and per address, so a peer
//! cannot pile them up); the sender that offered the session decides when it ends by
//! closing.

use super::frames::Hello;
use super::recv::TcpReceiver;
use crate::server::admission::KeptSlot;
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
    /// Its count among the receiver's kept connections, given back with it.
    _slot: KeptSlot,
}

impl KeptConn {
    /// Keep `receiver`, accepted for `first` from `peer` with `hello` (its streams),
    /// for the next offer, counted by `slot`; `timeout` bounds its writes.
    pub fn new(
        receiver: TcpReceiver,
        peer: SocketAddr,
        hello: Hello,
        first: &Header,
        rails_from: Vec<Option<String>>,
        timeout: Duration,
        slot: KeptSlot,
    ) -> KeptConn {
        KeptConn {
            receiver,
            peer,
            hello,
            rails_from,
            rails: first.rails,
            striped: first.striped,
            timeout,
            _slot: slot,
        }
    }

    /// Wait up to `idle` for the sender's next offer. `None`: the sender closed (its
    /// session over), sent nothing in time, or sent something else (a bad offer is
    /// refused with its reason first); the connection is closed then.
    pub fn next_offer(mut self, idle: Duration) -> Option<(KeptConn, NextOffer)> {
        let bytes = self.receiver.next_message(Instant::now() + idle)?;
        if !NextOffer::is_one(&bytes) {
            return None;
        }
        match NextOffer::decode(&bytes) {
            Ok(next) => Some((self, next)),
            Err(e) => {
                let _ = self.refuse(RejectReason::BadHeader(e), None);
                None
            }
        }
    }

    /// Accept `header`, an offer on this connection: the accept goes as a message. The
    /// connection, and the sender's address on each rail.
    pub(super) fn accept(
        mut self,
        header: &Header,
    ) -> Result<(TcpReceiver, Vec<Option<String>>), RecvOutcome> {
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
        Ok((self.receiver, self.rails_from))
    }

    /// Refuse the offer on this connection, saying why, and close it; what to report.
    pub(super) fn refuse(mut self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        let sent = self.receiver.send_message(&reason.encode());
        let unsent = (!sent).then(|| "the connection closed".to_string());
        crate::net::rejected(self.peer, &reason, detail, unsent)
    }
}

#[cfg(test)]
mod tests {
    //! A peer on a kept connection that sends something other than a good next offer:
    //! each is refused or closed, within the idle time, never taken for a transfer.
    use super::*;
    use crate::net::tcp::frames::{Frame, FRAME_LEN};
    use crate::wire::{Op, Payload, REJECT_MAGIC};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A kept connection of one stream, and the sender's end of it.
    fn kept(first: &Header) -> (KeptConn, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mine, from) = listener.accept().unwrap();
        let receiver = TcpReceiver::start(vec![vec![mine]], Duration::from_secs(2)).unwrap();
        let hello = Hello {
            index: 0,
            count: 1,
            rail: 0,
            token: 7,
        };
        let limits = crate::server::admission::Limits::receiver(false, 1, 1 << 20, 1);
        let slot = crate::server::admission::Admission::new(limits)
            .keep(from.ip(), 1)
            .expect("room for one kept connection");
        let conn = KeptConn::new(
            receiver,
            from,
            hello,
            first,
            vec![None],
            Duration::from_secs(2),
            slot,
        );
        (conn, peer)
    }

    fn send_message(stream: &mut TcpStream, bytes: &[u8]) {
        stream.write_all(&Frame::control(bytes).encode()).unwrap();
        stream.write_all(bytes).unwrap();
    }

    /// The next message the receiver sent, `None` once it closed.
    fn read_message(stream: &mut TcpStream) -> Option<Vec<u8>> {
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut head = [0u8; FRAME_LEN];
        stream.read_exact(&mut head).ok()?;
        let frame = Frame::decode(&head);
        let mut bytes = vec![0u8; frame.len as usize];
        stream.read_exact(&mut bytes).ok()?;
        Some(bytes)
    }

    fn header() -> Header {
        Header::of(Op::Send, 4096, 4096, 4, Payload::Opaque)
            .unwrap()
            .with_session()
    }

    #[test]
    fn a_good_next_offer_comes_out_as_an_offer_and_its_accept_goes_back() {
        let (conn, mut peer) = kept(&header());
        let next = NextOffer {
            header: Header::of(Op::Send, 12_345, 4096, 4, Payload::Opaque)
                .unwrap()
                .with_name(),
            name: Some("second".into()),
        };
        send_message(&mut peer, &next.encode().unwrap());
        let (conn, got) = conn.next_offer(Duration::from_secs(2)).expect("an offer");
        assert_eq!(got, next);
        let (receiver, _) = conn.accept(&got.header).map_err(|_| "refused").unwrap();
        assert!(receiver.usable());
        let answer = read_message(&mut peer).expect("the accept");
        assert_eq!(AcceptInfo::decode(&answer).unwrap().len, 12_345);
    }

    #[test]
    fn junk_silence_and_a_close_end_the_connection_without_an_offer() {
        // A message that is not a next offer: closed.
        let (conn, mut peer) = kept(&header());
        send_message(&mut peer, b"GRDKnot an offer at all");
        assert!(conn.next_offer(Duration::from_secs(2)).is_none());
        assert_eq!(read_message(&mut peer), None, "the connection closed");
        // Data where an offer is due: closed.
        let (conn, mut peer) = kept(&header());
        peer.write_all(
            &Frame {
                offset: 0,
                len: 4,
                crc: 0,
            }
            .encode(),
        )
        .unwrap();
        peer.write_all(b"data").unwrap();
        assert!(conn.next_offer(Duration::from_secs(3)).is_none());
        // Nothing within the idle time: given up at it.
        let (conn, _peer) = kept(&header());
        let t0 = Instant::now();
        assert!(conn.next_offer(Duration::from_millis(300)).is_none());
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The sender closed: over at once, not at the idle time.
        let (conn, peer) = kept(&header());
        drop(peer);
        let t0 = Instant::now();
        assert!(conn.next_offer(Duration::from_secs(30)).is_none());
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_next_offer_that_lies_is_refused_with_its_reason() {
        // A header that does not decode.
        let (conn, mut peer) = kept(&header());
        let mut bad = NextOffer {
            header: header(),
            name: None,
        }
        .encode()
        .unwrap();
        bad[8 + 6] = 99; // the header's op
        send_message(&mut peer, &bad);
        assert!(conn.next_offer(Duration::from_secs(2)).is_none());
        let answer = read_message(&mut peer).expect("a reject");
        assert_eq!(answer[..4], REJECT_MAGIC);
        // Striped over rails this connection does not have: refused at its accept.
        let (conn, mut peer) = kept(&header());
        let striped = NextOffer {
            header: header().with_rails(2).unwrap(),
            name: None,
        };
        send_message(&mut peer, &striped.encode().unwrap());
        let (conn, got) = conn.next_offer(Duration::from_secs(2)).expect("an offer");
        assert!(matches!(
            conn.accept(&got.header),
            Err(RecvOutcome::Rejected { .. })
        ));
        let answer = read_message(&mut peer).expect("a reject");
        assert_eq!(answer[..4], REJECT_MAGIC);
        assert_eq!(read_message(&mut peer), None, "then closed");
    }
}
