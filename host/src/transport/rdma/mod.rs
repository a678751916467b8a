//! The verbs transport: the transfer protocol over RDMA (librdmacm and libibverbs,
//! through the RAII wrappers of [`crate::rdma`]) and its two state machines.
//!
//! A framed transfer, step by step:
//!
//! 1. The sender resolves the receiver's address and route, builds PD, CQ and an RC QP,
//!    registers its data ([`SendSource::registration`](crate::memory::SendSource)) and a
//!    small ack buffer, posts one receive for the ack, and connects with a [`Header`](crate::wire::Header)
//!    (operation, size, chunk size, depth) as private data.
//! 2. The receiver, on the connect request, checks the header (rejecting with a
//!    [`RejectReason`](crate::wire::RejectReason) the sender prints), allocates and registers its buffer (remote
//!    write only in write mode, only this connection's buffer), posts its receives, and
//!    accepts with an [`AcceptInfo`](crate::wire::AcceptInfo) (buffer address and rkey for write mode).
//! 3. The sender posts the chunks ([`ChunkPlan`](crate::transfer::ChunkPlan)) keeping at most `depth` in flight:
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
//!    SENDs an [`Ack`](crate::wire::Ack) with the result; the sender disconnects.
//!
//! **Version 2** (`--verify checksum|both`, `--input`, `--output`): after the data the
//! sender SENDs the CRC32C of every chunk (`ChunkChecksums`, 252 a message, into receives
//! with 1 KiB slots the receiver posted behind the data's); the receiver compares them
//! with the chunks where they landed and asks for the failed ones again (`Resend`), which
//! the sender sends into the same place, chunk by chunk with the chunk's index + 1 as
//! immediate, for up to `max_resends` rounds; the ack then carries the whole transfer's
//! CRC32C. The books are in `repair.rs`, the receiver's stage in `checks.rs`; the layout
//! of the receives and slots in `receives.rs`' `Receives`. A `--name` is the sender's
//! first SEND after the accept. The payload may be any number of bytes (`--input`); the
//! receiver writes a transfer that passed to `--output` before it acks.
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
//! **Striped over several rails** (`--op write`, `--nic a,b` with one receiver address
//! per rail): one connection per rail; rail 0 carries the offer, the others join it by a
//! token; every chunk is a WRITE_WITH_IMM on the rail with the fewest in flight, a failed
//! rail's chunks (rail 0's too) move to the others, and the ack comes on every rail still
//! up. See `striped.rs` (sender),
//! `striped_recv.rs` (receiver) and `rails.rs` (their bookkeeping).
//!
//! `--raw` is the seed's wire behaviour instead: no header, one `SEND_WITH_IMM` of the
//! whole buffer with immediate `0x1234`, a 16-byte reply.

mod checks;
mod conn;
mod opening;
pub mod rails;
pub mod receiver;
mod receives;
mod repair;
pub mod sender;
mod serving;
mod striped;
mod striped_recv;

pub use opening::{RailTarget, SendConfig};
pub use receiver::{serve, serve_with, SinkFactoryMaker};
pub use sender::{send_raw, send_repeated};
pub use serving::RecvConfig;
pub use striped::why_not_striped;

use crate::memory::SendMemory;
use crate::transfer::{SendReport, TransferError};

/// One framed transfer of `memory`'s data: striped when `cfg.rails` names two or more
/// (`striped.rs`, which itself falls back to one rail), else over one connection to
/// `cfg.peer`. Chosen here, above both senders, so that neither imports the other: the
/// striped sender's fallback is the one-rail sender's own `send`.
pub fn send(cfg: &SendConfig, memory: &mut SendMemory) -> Result<SendReport, TransferError> {
    if cfg.rails.len() > 1 {
        return striped::send(cfg, memory);
    }
    sender::send(cfg, memory)
}
