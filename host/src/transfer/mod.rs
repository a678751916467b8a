//! The transfer protocol and its two state machines.
//!
//! A framed transfer, step by step:
//!
//! 1. The sender resolves the receiver's address and route, builds PD, CQ and an RC QP,
//!    registers its data ([`SendSource::registration`](crate::memory::SendSource)) and a
//!    small ack buffer, posts one receive for the ack, and connects with a [`Header`]
//!    (operation, size, chunk size, depth) as private data.
//! 2. The receiver, on the connect request, checks the header (rejecting with a
//!    [`RejectReason`] the sender prints), allocates and registers its buffer (remote
//!    write only in write mode, only this connection's buffer), posts its receives, and
//!    accepts with an [`AcceptInfo`] (buffer address and rkey for write mode).
//! 3. The sender posts the chunks ([`ChunkPlan`]) keeping at most `depth` in flight:
//!    SENDs into the receiver's posted receives, or RDMA WRITEs into its buffer.
//!    **Immediate data:** a `*_WITH_IMM` request carries the number of chunks delivered
//!    up to and including it (`index + 1`). In send mode only the last chunk is
//!    `SEND_WITH_IMM` (imm = chunk count); in write mode the last chunk and every
//!    signaled one are `RDMA_WRITE_WITH_IMM`, so the receiver, which sees no completion
//!    for plain writes, can tell progress (its timeout restarts on it) and knows all data
//!    landed when the immediate equals the chunk count (RC delivers in order).
//!    The receiver keeps at least `2 × depth` (and at least 64) receives posted and
//!    sets its QP's `min_rnr_timer` to 0.64 ms: the RDMA CM leaves it at 655 ms, so one
//!    "receiver not ready" would otherwise stall the sender for 0.65 s (measured under
//!    Soft-RoCE: 200 chunks at depth 1 took 27 s before, 0.02 s after).
//! 4. The receiver verifies the data ([`RecvSink::verify`](crate::memory::RecvSink)) and
//!    SENDs an [`Ack`] with the result; the sender disconnects.
//!
//! Each `--iters` iteration is a connection of its own (and is verified on its own);
//! throughput is measured from the first work request to the last data completion.
//!
//! **One connection, many transfers** (`--reuse-connection`, header flag 0x01 with the
//! count): steps 3 and 4 repeat on the same connection. The receiver verifies each
//! transfer, posts the receives of the next, and only then acks (its ack carries the
//! verification time); the sender starts the next transfer when the ack has arrived. Each
//! transfer's round trip (first work request to the ack) is timed apart from connection
//! setup: the figure to compare with a ping-pong latency test. Receivers that predate the
//! flag reject it ("unknown flags 0x01"); without it nothing on the wire changes.
//!
//! Posting: the sender hands its work requests to the provider in lists of up to 16 (one
//! doorbell each; Soft-RoCE does its protocol work in that system call), and the receiver
//! sends its ack inline where the device allows, so the ack buffer is free at once.
//!
//! `--raw` is the seed's wire behaviour instead: no header, one `SEND_WITH_IMM` of the
//! whole buffer with immediate `0x1234`, a 16-byte reply.

mod conn;
pub mod header;
pub mod memcpy_wire;
pub mod plan;
pub mod receiver;
pub mod schedule;
pub mod sender;
pub mod units;

pub use header::{AcceptInfo, Ack, AckStatus, Header, Op, RejectReason, WireError};
pub use plan::{Chunk, ChunkPlan};
pub use receiver::{serve, RecvConfig, RecvOutcome, RecvReport};
pub use sender::{send, send_raw, send_repeated, ReceiverVerdict, SendConfig, SendReport};

use crate::rdma::RdmaError;
use units::format_bytes;

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
        format_bytes(*got), format_bytes(*total), format_bytes(*min_rate)
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
