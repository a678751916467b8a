//! The TCP transport: the shared engine's messages and chunk schedule over sockets, for
//! machines without an RDMA device (and to run the GPU pipeline end to end where there
//! is a GPU but no NIC). Like NCCL's socket transport, a connection can spread its
//! chunks over several sockets (`--streams`, NCCL's `NCCL_NSOCKS_PERTHREAD`).
//!
//! - [`frames`]: the bytes this transport adds (stream hello, chunk frame header);
//! - [`socket`]: connecting and timeouts, socket errors in words;
//! - [`wire`]: the sender's `ChunkWire`, one writer thread per stream; `dispatch` beside
//!   it (which rail and stream carries each chunk, when a rail has failed);
//! - [`rails`]: the sender's rails (`--bind-interfaces`): connecting from a local
//!   address, the cooldown of rails that failed;
//! - [`sender`]: the schedule over the wire, the acks and resends; `opening` beside it
//!   (the offer, the receiver's answer, the streams of each rail);
//! - [`landing`]: the receiver's buffers (host memory, or GPU memory through a host
//!   chunk buffer);
//! - [`receiver`]: accept and admission, a thread per transfer, verification, acks;
//!   `handshake` (a socket's first message, within one deadline), `routes` (extra
//!   streams joining their transfer) and `striped` (a striped transfer's rounds: any
//!   chunk on any stream, until every stream ended its pass) beside it.

pub mod config;
mod dispatch;
pub mod frames;
mod handshake;
pub mod landing;
mod opening;
pub mod rails;
pub mod receiver;
mod routes;
pub mod sender;
mod serving;
pub mod socket;
pub mod streams;
mod striped;
pub mod wire;

pub use config::{TcpSendConfig, DEFAULT_RAIL_TIMEOUT};
pub use receiver::{serve, serve_on, serve_with, RecvMemory, TcpRecvConfig};
pub use sender::{choose_source, send_repeated, tcp_plan};

/// What the sender's output says the data went by ("Data sent successfully via ...").
pub fn describe(path: crate::memory::DataPath, user_data: bool) -> &'static str {
    use crate::memory::DataPath;
    match path {
        DataPath::HostMemory if user_data => "TCP from host memory",
        DataPath::HostMemory => "TCP from host memory (pattern written by the CPU)",
        DataPath::GpuMappedHostMemory => "TCP from GPU-mapped host memory",
        DataPath::StagedThroughHostMemory => "TCP from host memory staged from GPU memory",
        DataPath::GpuDirectRdma => "TCP from GPU memory",
    }
}
