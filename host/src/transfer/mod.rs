//! The transfer engine, the same whatever carries the bytes (the messages the peers
//! exchange are [`crate::wire`]'s): the chunk plan ([`plan`]), the sender's chunk
//! schedule ([`schedule`]) and what drives it for the benchmark ([`memcpy_wire`]), the
//! reports ([`report`]) and the errors a user can act on ([`TransferError`]).
//! The engine that runs transfers over the links is [`crate::engine`]; the links are
//! [`crate::net`]'s (verbs and TCP).

pub mod cancel;
pub mod faults;
pub mod input;
pub mod memcpy_wire;
pub mod plan;
pub mod repair;
pub mod report;
pub mod schedule;
pub mod store;
/// Byte counts for people, at their old path: they live at the ground floor
/// ([`crate::units`]), where the wire formats and the verbs wrappers use them too.
pub use crate::units;

pub use plan::{Chunk, ChunkPlan};
pub use report::{ReceiverVerdict, RecvOutcome, RecvReport, SendReport};

use crate::rdma::RdmaError;
use crate::units::{format_bytes, format_bytes_apart};
use crate::wire::{Payload, RejectReason, VerifyMode, DEFAULT_MAX_RESENDS};

/// What a sender sends and how the receiver is to check it: the same for both
/// transports, built by the CLI (or a library caller).
#[derive(Debug, Clone)]
pub struct PayloadOptions {
    /// The built-in pattern, or the caller's bytes.
    pub payload: Payload,
    /// `--verify`.
    pub verify: VerifyMode,
    /// `--max-resends`: rounds of resends of chunks whose checksum failed.
    pub max_resends: u8,
    /// `--name`: what a receiver writing into a directory calls the file.
    pub name: Option<String>,
    /// `--test-inject-faults` (tests only).
    pub faults: Option<faults::FaultInjector>,
}

impl Default for PayloadOptions {
    /// The pattern, checked against itself, as before version 2.
    fn default() -> Self {
        PayloadOptions {
            payload: Payload::Pattern,
            verify: VerifyMode::Pattern,
            max_resends: DEFAULT_MAX_RESENDS,
            name: None,
            faults: None,
        }
    }
}

/// The errors of a transfer that a user can act on; the rest are [`RdmaError`]s.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("receiver rejected the transfer: {0}")]
    Rejected(RejectReason),

    #[error("{peer} rejected the connection (IB CM reject reason {status})")]
    RejectedWithoutReason { peer: String, status: i32 },

    #[error("no receiver at {peer} ({why})")]
    NoReceiver { peer: String, why: String },

    #[error("cannot reach {peer} over RDMA: {why}")]
    Unreachable { peer: String, why: String },

    #[error(
        "{peer} accepted without a transfer offer ({why}): it is not `host recv`; for a plain peer such as rdma-core's rdma_server use --raw"
    )]
    NotFramed { peer: String, why: String },

    #[error("transfer to {peer} failed after {done} of {total} bytes: {why}")]
    Broken {
        peer: String,
        done: u64,
        total: u64,
        why: String,
    },

    #[error("incomplete transfer from {peer}: got {got} of {total} bytes ({why})")]
    Incomplete {
        peer: String,
        got: u64,
        total: u64,
        why: String,
    },

    #[error(
        "sender {peer} too slow: {} of {} in {seconds:.1} s, below this receiver's --min-rate {}/s",
        format_bytes_apart(*got, *total).0, format_bytes_apart(*got, *total).1, format_bytes(*min_rate)
    )]
    TooSlow {
        peer: String,
        got: u64,
        total: u64,
        seconds: f64,
        min_rate: u64,
    },

    #[error("{0}")]
    Protocol(String),

    /// A receiver that waits a bounded time for its sender (the library's) saw none
    /// whose transfer it took within it.
    #[error("no transfer arrived within {} (the receive's wait)", crate::rdma::format_duration(*waited))]
    NoSender { waited: std::time::Duration },

    #[error(
        "transfer to {peer} failed: {} chunk(s) still failed their CRC32C after {rounds} round(s) of resends ({bound}): chunk(s) {}",
        chunks.len(), list_chunks(chunks)
    )]
    ChecksumFailed {
        peer: String,
        chunks: Vec<u32>,
        rounds: u8,
        /// What ended the rounds, in words (`--max-resends`, or the bound on what is sent
        /// again).
        bound: String,
    },

    #[error(transparent)]
    Rdma(#[from] RdmaError),

    #[error("{0:#}")]
    Memory(anyhow::Error),
}

impl TransferError {
    /// No RDMA device at all: the one error with its own advice.
    pub fn is_no_device(&self) -> bool {
        matches!(self, TransferError::Rdma(RdmaError::NoDevice))
    }
}

/// The first few chunk indices of `chunks`, and how many more.
fn list_chunks(chunks: &[u32]) -> String {
    const SHOWN: usize = 8;
    let mut text: Vec<String> = chunks.iter().take(SHOWN).map(|c| c.to_string()).collect();
    if chunks.len() > SHOWN {
        text.push(format!("and {} more", chunks.len() - SHOWN));
    }
    text.join(", ")
}

/// GB/s (10^9 bytes per second), 0 for a zero duration.
pub fn gigabytes_per_second(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_facing_errors_are_one_line_and_say_what_happened() {
        let cases: Vec<(TransferError, &str)> = vec![
            (
                TransferError::Rejected(RejectReason::TooLarge {
                    requested: 2 << 30,
                    max: 1 << 30,
                }),
                "receiver rejected the transfer: size 2 GiB exceeds its --max-bytes 1 GiB",
            ),
            (
                TransferError::NoReceiver {
                    peer: "192.0.2.1:7471".into(),
                    why: "connection refused".into(),
                },
                "no receiver at 192.0.2.1:7471 (connection refused)",
            ),
            (
                TransferError::Incomplete {
                    peer: "192.0.2.1:40000".into(),
                    got: 4096,
                    total: 16384,
                    why: "peer disconnected".into(),
                },
                "incomplete transfer from 192.0.2.1:40000: got 4096 of 16384 bytes (peer disconnected)",
            ),
            (
                TransferError::Rdma(RdmaError::verb(
                    "rdma_resolve_addr",
                    "192.0.2.9:7471",
                    libc::EHOSTUNREACH,
                )),
                "rdma_resolve_addr(192.0.2.9:7471): No route to host (errno 113)",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
        assert!(TransferError::Rdma(RdmaError::NoDevice).is_no_device());
    }

    #[test]
    fn throughput() {
        assert_eq!(gigabytes_per_second(2_000_000_000, 2.0), 1.0);
        assert_eq!(gigabytes_per_second(1, 0.0), 0.0);
    }
}
