//! A sender's TCP connection kept between transfers ([`HINT_SESSION`]): the next
//! transfer is offered on it as a [`NextOffer`] message, answered with an accept or a
//! reject message, and then runs as any transfer does ([`super::send::transfers`]), so
//! many transfers of any sizes share one connection's streams and skip the opening
//! (connect, offer, hellos, proofs).
//!
//! A receiver closes a kept connection when it waited its idle time (its `--timeout`)
//! for the next offer, or when it predates sessions. A kept connection found closed
//! before the next offer was answered is [`Tried::Closed`]: nothing was accepted, and
//! the caller opens a new one.

use super::cancel::{cancelled, CANCELLED};
use super::offer::offer;
use super::options::SendOptions;
use super::send::{self, Facts, RailName, Shape};
use super::sending::Sending;
use crate::memory::SendSource;
use crate::memory_path::AttemptLog;
use crate::net::tcp::send::TcpSender;
use crate::rdma::Deadline;
use crate::transfer::{SendReport, TransferError};
use crate::wire::{Header, NextOffer, Op, HINT_SESSION};
use std::net::SocketAddr;
use std::time::Instant;

/// What a kept connection is, to tell whether a send can take it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fit {
    peer: SocketAddr,
    streams: u16,
    rails: Vec<String>,
    /// The writers compute a CRC32C per frame exactly when checksums are on.
    checksum: bool,
    faults: bool,
}

impl Fit {
    fn of(opts: &SendOptions) -> Fit {
        Fit {
            peer: opts.peer,
            streams: opts.tcp.streams,
            rails: opts.tcp.rails.iter().map(|r| r.label()).collect(),
            checksum: opts.payload.verify.checksum(),
            faults: opts.payload.faults.is_some(),
        }
    }
}

/// A sender's connection kept after a verified transfer, for the next.
pub struct KeptSender {
    sender: TcpSender,
    fit: Fit,
    /// The first offer as it went: the next ones say the same of their rails.
    first: Header,
    names: Vec<RailName>,
    connected: Vec<usize>,
}

/// What trying a kept connection came to (returned once per send and taken apart at
/// once: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Tried {
    /// The transfer ran (or was refused, or failed) on it; the connection if it is still
    /// good for another.
    Sent(Result<SendReport, TransferError>, Option<KeptSender>),
    /// It was closed before the offer was answered (the receiver's idle time passed, or
    /// it keeps no connections): nothing of the transfer was accepted.
    Closed,
}

impl KeptSender {
    pub(super) fn new(
        sender: TcpSender,
        opts: &SendOptions,
        first: Header,
        names: Vec<RailName>,
        connected: Vec<usize>,
    ) -> KeptSender {
        KeptSender {
            sender,
            fit: Fit::of(opts),
            first,
            names,
            connected,
        }
    }

    /// Whether a send under `opts` can go on this connection.
    pub fn fits(&self, opts: &SendOptions) -> bool {
        self.fit == Fit::of(opts) && self.sender.usable()
    }

    /// Offer `source` under `opts` on this connection and, once accepted, send it.
    pub fn send(mut self, opts: &SendOptions, source: &dyn SendSource) -> Tried {
        let t0 = Instant::now();
        let label = opts.peer.to_string();
        let (header, plan, _) = match offer(opts, source.len() as u64, 1, Op::Send) {
            Ok(o) => o,
            Err(e) => return Tried::Sent(Err(e), Some(self)),
        };
        let mut header = header.with_session();
        if self.first.striped {
            header = match header.with_rails(self.first.rails) {
                Ok(h) => h,
                Err(e) => return Tried::Sent(Err(TransferError::Protocol(e.to_string())), None),
            };
        }
        let next = NextOffer {
            header,
            name: opts.payload.name.clone(),
        };
        let next = match next.encode() {
            Ok(bytes) => bytes,
            Err(e) => {
                let e = TransferError::Protocol(format!("cannot offer this transfer: {e}"));
                return Tried::Sent(Err(e), Some(self));
            }
        };
        let memory_log = AttemptLog::default();
        let shape = Shape::of(opts, &header, plan, 1);
        let (names, connected) = (self.names.clone(), self.connected.clone());
        let ran = self.sender.with_source(source.memory(), |link| {
            let mut sending = Sending::new(link, opts.rail_timeout);
            sending.cancel_on(opts.cancel.clone());
            let cancel = || Some(Err(TransferError::Protocol(format!("{label}: {CANCELLED}"))));
            if sending.send_message(&next).is_err() {
                return None;
            }
            let answer = match sending.next_message(&Deadline::after(opts.timeout)) {
                Ok(Some((_, answer))) => answer,
                // Cancelled while waiting: not to be taken for a closed connection (which
                // a new one would replace).
                Err(_) if cancelled(&opts.cancel) => return cancel(),
                // Every rail closed before an answer: the receiver did not keep it.
                Err(_) => return None,
                Ok(None) => {
                    // Worded as a new connection's unanswered offer is.
                    return Some(Err(TransferError::Protocol(format!(
                        "{label}: nothing moved for {} while waiting for the receiver to accept the next offer (--timeout)",
                        crate::rdma::format_duration(opts.timeout)
                    ))));
                }
            };
            if let Err(e) = accepted(&answer, &label) {
                return Some(Err(e));
            }
            let facts = Facts {
                peer: &label,
                device: None,
                op: "tcp",
                connect_seconds: t0.elapsed().as_secs_f64(),
                memory: &memory_log,
                rails: &names,
                connected: &connected,
                left_out: &[],
                cooldowns: &opts.cooldowns,
            };
            Some(send::transfers(&mut sending, source, &shape, &facts))
        });
        let result = match ran {
            Ok(Some(result)) => result,
            Ok(None) => return Tried::Closed,
            Err(e) => Err(TransferError::Protocol(format!("{label}: {e}"))),
        };
        let report = result.and_then(|mut reports| {
            let mut report = reports
                .pop()
                .ok_or_else(|| TransferError::Protocol(format!("{label}: no report")))?;
            report.kept_connection = true;
            Ok(report)
        });
        let verified = report.as_ref().is_ok_and(SendReport::verified);
        let keep = (verified && self.sender.usable()).then_some(self);
        Tried::Sent(report, keep)
    }
}

/// The receiver's answer to a next offer: go on, or why not.
fn accepted(answer: &[u8], label: &str) -> Result<(), TransferError> {
    crate::net::tcp::dial::verdict(answer, label).unwrap_or_else(|| {
        Err(TransferError::NotFramed {
            peer: label.to_string(),
            why: format!(
                "its answer to a next offer (hint {HINT_SESSION:#04x}) is neither accept nor reject"
            ),
        })
    })
}
