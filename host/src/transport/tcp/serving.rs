//! What the TCP receiver's accept loop, its handshake threads and its transfer threads
//! share: the offer a handshake hands on, the events they send the loop, the state they
//! all read, and the refusal every one of them may send (its own module so that the
//! handshake and the receiver need not import each other).

use super::frames::Hello;
use super::routes::Routes;
use super::socket;
use super::TcpRecvConfig;
use crate::server::Admission;
use crate::transfer::RecvOutcome;
use crate::wire::RejectReason;
use crate::wire::{Header, WireError};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// A transfer offer that passed its checks, for the serving loop.
pub(super) struct Offer {
    pub control: TcpStream,
    pub peer: SocketAddr,
    pub header: Header,
    pub hello: Hello,
    /// The sender's `--name` (checked: it stays inside a directory).
    pub name: Option<String>,
}

pub(super) enum Event {
    Offer(Offer),
    /// A refusal or failure before any transfer was accepted: it is reported and
    /// changes nothing else (`--once` goes on serving).
    Outcome(RecvOutcome),
    /// A transfer thread ended; `accepted`: its accept was sent (this uses `--once` up).
    Served {
        outcome: RecvOutcome,
        accepted: bool,
    },
}

/// What the accept loop, the handshakes and the transfer threads share.
pub(super) struct Shared {
    pub cfg: TcpRecvConfig,
    pub admission: Arc<Admission>,
    pub routes: Routes,
    /// Whether the accept loop takes connections now (see [`AcceptGate`]).
    pub gate: AcceptGate,
    /// The caller serves one transfer per call on a listener that lives on (the
    /// library's `serve_on`): a transfer whose streams are in closes the gate.
    pub one_per_call: bool,
}

/// Lets a transfer stop the accept loop from taking more connections, for a receiver
/// that serves one transfer per call on a listener that lives on (the library's): once
/// the transfer's streams are all in, the next sender's connection must stay in the
/// listen queue for the next call. Taken by this call's accept loop, it would be closed
/// when the call returns, and a sender that connects right after its last ack (the
/// library's endpoint) would see its offer dropped.
#[derive(Default)]
pub(super) struct AcceptGate {
    /// Set: a transfer has all its streams, and the caller serves only it.
    closing: std::sync::atomic::AtomicBool,
    /// Set by the accept loop when it has seen `closing` and will accept no more.
    closed: std::sync::atomic::AtomicBool,
}

impl AcceptGate {
    /// Ask the accept loop to take no more connections, and wait (up to `within`) until
    /// it says it will not: from then on, new connections wait in the listen queue.
    pub fn close_and_wait(&self, within: std::time::Duration) {
        use std::sync::atomic::Ordering;
        self.closing.store(true, Ordering::SeqCst);
        let until = std::time::Instant::now() + within;
        while !self.closed.load(Ordering::SeqCst) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// The accept loop, before each accept: whether to take connections; if not, it
    /// says so (once) to [`close_and_wait`](Self::close_and_wait).
    pub fn open(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.closing.load(Ordering::SeqCst) {
            self.closed.store(true, Ordering::SeqCst);
            return false;
        }
        true
    }
}

/// Tell the peer why not (the sender prints it) without waiting on it, and close.
pub(super) fn refuse(
    stream: TcpStream,
    peer: SocketAddr,
    reason: RejectReason,
    detail: Option<String>,
) -> RecvOutcome {
    let sent = socket::write_and_close(stream, &reason.encode());
    let mut text = reason.to_string();
    if let Some(detail) = detail {
        text = format!("{text}: {detail}");
    }
    if let Err(e) = sent {
        text = format!("{text} (and the reject could not be sent: {e})");
    }
    RecvOutcome::Rejected {
        peer: peer.to_string(),
        reason: text,
    }
}

pub(super) fn refuse_hello(stream: TcpStream, peer: SocketAddr, what: &'static str) -> RecvOutcome {
    let reason = RejectReason::BadHeader(WireError::Inconsistent { what });
    refuse(stream, peer, reason, None)
}
