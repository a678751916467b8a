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
