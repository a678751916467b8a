//! What a TCP transfer is asked to do, as one value: built by the command line, the
//! library and the benchmarks, read by the sender and the opening of its connection
//! (its own module so neither of those imports the other for it).

use super::rails::Rail;
use crate::transfer::PayloadOptions;
use std::net::SocketAddr;
use std::time::Duration;

/// Everything the TCP sender needs, built by the CLI.
#[derive(Debug, Clone)]
pub struct TcpSendConfig {
    pub peer: SocketAddr,
    pub bytes: u64,
    pub chunk: u64,
    /// Chunks handed to the writer threads and not yet written.
    pub depth: u32,
    /// Sockets per connection (NCCL's NCCL_NSOCKS_PERTHREAD).
    pub streams: u16,
    /// Bound of every socket operation; restarts on progress.
    pub timeout: Duration,
    pub progress: bool,
    pub protocol_version: u16,
    /// `--key-file`: proves to a receiver with the same key that this sender may send.
    pub key: Option<crate::server::Key>,
    /// What is sent and how it is checked (protocol version 2).
    pub payload: PayloadOptions,
    /// The rails (`--bind-interfaces`, the receiver's addresses): more than one stripes
    /// the transfer over them, `--streams` sockets each; empty: one rail to `peer`.
    pub rails: Vec<Rail>,
    /// A striped rail with chunks in flight that writes none for this long has failed.
    pub rail_timeout: Duration,
    /// TEST ONLY (`--test-silent-rail K`): rail K (0-based, among the rails that
    /// connected) writes no end marker after its chunks, as a rail whose link died
    /// silently right after its last chunk.
    pub test_silent_rail: Option<usize>,
}

/// `--rail-timeout`'s default.
pub const DEFAULT_RAIL_TIMEOUT: Duration = Duration::from_millis(500);
