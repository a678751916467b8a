//! What a library call that failed says: one line of words (the command line's) and a
//! kind a program can act on. Python's exceptions are these kinds.

use crate::transfer::{RecvReport, SendReport, TransferError};
use crate::wire::AckStatus;

/// What went wrong, as something a program can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The peer refused the transfer before any data (too large, wrong size for the
    /// buffer it receives into, busy, not allowed, a key that did not match).
    Rejected,
    /// Chunks still failed their CRC32C after every resend allowed.
    ChecksumFailed,
    /// A wait ran out: nothing moved for `timeout`, a sender below `min_rate`, or no
    /// transfer arrived within a receive's wait.
    TimedOut,
    /// The peer closed or reset the connection before the transfer ended (a process
    /// killed half-way, say).
    PeerGone,
    /// Nobody accepts connections at the address.
    Unreachable,
    /// An argument the call refused before anything was sent (an option out of range,
    /// an empty buffer, memory it cannot use).
    InvalidArgument,
    /// The caller cancelled it ([`Cancel`](super::Cancel): Ctrl-C in Python).
    Cancelled,
    /// Anything else (a protocol error, memory that could not be had).
    Other,
}

impl ErrorKind {
    /// The kind's name, as Python's exception classes are named.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Rejected => "Rejected",
            ErrorKind::ChecksumFailed => "ChecksumFailed",
            ErrorKind::TimedOut => "TimedOut",
            ErrorKind::PeerGone => "PeerGone",
            ErrorKind::Unreachable => "Unreachable",
            ErrorKind::InvalidArgument => "InvalidArgument",
            ErrorKind::Cancelled => "Cancelled",
            ErrorKind::Other => "Other",
        }
    }
}

/// A failed library call: its kind and its one-line message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` saying `message` (one line).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// What went wrong, for a program to act on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What went wrong, in words (the command line's line).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A receiver's failure, from the words of its outcome (a transfer thread reports
    /// strings: see [`kind_of_words`]).
    pub(crate) fn from_words(message: String) -> Error {
        Error {
            kind: kind_of_words(&message),
            message,
        }
    }

    /// A sender whose transfer ran but whose receiver did not say "verified".
    pub(crate) fn from_send_report(report: &SendReport) -> Option<Error> {
        let verdict = report.receiver?;
        let kind = match verdict.status {
            AckStatus::Verified => return None,
            AckStatus::ChecksumFailed | AckStatus::Mismatch => ErrorKind::ChecksumFailed,
            AckStatus::TooSlow => ErrorKind::TimedOut,
            AckStatus::VerifyFailed | AckStatus::NotStored => ErrorKind::Other,
        };
        Some(Error::new(
            kind,
            format!(
                "{} did not verify the transfer: {:?} after {} of {} bytes",
                report.peer, verdict.status, verdict.received_bytes, report.bytes
            ),
        ))
    }

    /// A receiver whose transfer arrived but did not pass its checks.
    pub(crate) fn from_recv_report(report: &RecvReport) -> Error {
        let integrity = &report.integrity;
        let (kind, what) = if !integrity.failed_chunks.is_empty() {
            (
                ErrorKind::ChecksumFailed,
                format!(
                    "{} chunk(s) still failed their CRC32C after the resends",
                    integrity.failed_chunks.len()
                ),
            )
        } else if report.transfers != report.offered {
            (
                ErrorKind::PeerGone,
                format!(
                    "{} of {} transfers arrived",
                    report.transfers, report.offered
                ),
            )
        } else if let Some(e) = &integrity.store_error {
            (ErrorKind::Other, format!("not stored: {e}"))
        } else {
            (ErrorKind::ChecksumFailed, "the data did not verify".into())
        };
        Error::new(
            kind,
            format!(
                "the transfer from {} did not pass its checks: {what}",
                report.peer
            ),
        )
    }
}

/// The kind of a failure told only in words (a receiver's transfer thread reports its
/// error as the line it prints): the phrases `net::tcp::socket::why` and the
/// receiver's errors use.
pub(crate) fn kind_of_words(message: &str) -> ErrorKind {
    if message.contains(crate::engine::cancel::CANCELLED) {
        ErrorKind::Cancelled
    } else if message.contains("(--timeout)") || message.contains("too slow") {
        ErrorKind::TimedOut
    } else if message.contains("closed the connection")
        || message.contains("reset the connection")
        || message.contains("incomplete transfer")
    {
        ErrorKind::PeerGone
    } else {
        ErrorKind::Other
    }
}

impl From<TransferError> for Error {
    fn from(e: TransferError) -> Error {
        let kind = match &e {
            TransferError::Rejected(_) | TransferError::RejectedWithoutReason { .. } => {
                ErrorKind::Rejected
            }
            TransferError::NoReceiver { .. } | TransferError::Unreachable { .. } => {
                ErrorKind::Unreachable
            }
            TransferError::ChecksumFailed { .. } => ErrorKind::ChecksumFailed,
            TransferError::TooSlow { .. } | TransferError::NoSender { .. } => ErrorKind::TimedOut,
            TransferError::Broken { why, .. } | TransferError::Incomplete { why, .. } => {
                match kind_of_words(why) {
                    ErrorKind::Other => ErrorKind::PeerGone,
                    kind => kind,
                }
            }
            TransferError::Protocol(words) => match kind_of_words(words) {
                ErrorKind::Other if is_refused_argument(words) => ErrorKind::InvalidArgument,
                kind => kind,
            },
            TransferError::NotFramed { .. } | TransferError::Rdma(_) | TransferError::Memory(_) => {
                ErrorKind::Other
            }
        };
        Error::new(kind, e.to_string())
    }
}

/// The sender's refusals of its own options, before any connection (`send_repeated`'s
/// checks: "--streams 0 is outside 1..=64", "nothing to transfer (size 0)", a name it
/// cannot offer).
fn is_refused_argument(words: &str) -> bool {
    words.starts_with("--")
        || words.starts_with("nothing to transfer")
        || words.starts_with("cannot offer this transfer")
        || words.contains("is outside")
        || words.contains("must be")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RejectReason;

    #[test]
    fn every_transfer_error_has_the_kind_a_program_acts_on() {
        let cases = [
            (
                TransferError::Rejected(RejectReason::SizeMismatch {
                    offered: 3,
                    expected: 4,
                }),
                ErrorKind::Rejected,
            ),
            (
                TransferError::NoReceiver {
                    peer: "127.0.0.1:1".into(),
                    why: "connection refused".into(),
                },
                ErrorKind::Unreachable,
            ),
            (
                TransferError::Broken {
                    peer: "p".into(),
                    done: 1,
                    total: 2,
                    why: "the peer reset the connection while writing chunk 3".into(),
                },
                ErrorKind::PeerGone,
            ),
            (
                TransferError::Broken {
                    peer: "p".into(),
                    done: 1,
                    total: 2,
                    why: "nothing moved for 1 s while reading the ack (--timeout)".into(),
                },
                ErrorKind::TimedOut,
            ),
            (
                TransferError::NoSender {
                    waited: std::time::Duration::from_secs(2),
                },
                ErrorKind::TimedOut,
            ),
            (
                TransferError::ChecksumFailed {
                    peer: "p".into(),
                    chunks: vec![1],
                    rounds: 3,
                    bound: "--max-resends".into(),
                },
                ErrorKind::ChecksumFailed,
            ),
            (
                TransferError::Protocol("--streams 0 is outside 1..=64".into()),
                ErrorKind::InvalidArgument,
            ),
            (
                TransferError::Protocol("nothing to transfer (size 0)".into()),
                ErrorKind::InvalidArgument,
            ),
            (
                TransferError::Protocol("protocol error: a frame of 3 bytes".into()),
                ErrorKind::Other,
            ),
        ];
        for (e, kind) in cases {
            let words = e.to_string();
            let got = Error::from(e);
            assert_eq!(got.kind(), kind, "{words}");
            assert_eq!(got.message(), words);
            assert!(!got.message().contains('\n'));
        }
    }

    #[test]
    fn a_receivers_words_say_timeouts_and_a_peer_that_went() {
        assert_eq!(
            kind_of_words("incomplete transfer from 127.0.0.1:5: got 1 of 2 bytes (the peer closed the connection while reading chunk 0)"),
            ErrorKind::PeerGone
        );
        assert_eq!(
            kind_of_words("sender 1.2.3.4:5 too slow: 1 MiB of 2 MiB in 3.0 s"),
            ErrorKind::TimedOut
        );
        assert_eq!(kind_of_words("protocol error"), ErrorKind::Other);
    }
}
