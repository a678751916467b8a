//! One options value per direction, built by the command line and the library alike:
//! what a sender is asked to do ([`SendOptions`]) and what a receiver serves
//! ([`RecvOptions`]). What only one transport reads sits in its own part of the value.

use super::cooldown::Cooldowns;
use crate::memory_factory::SinkFactory;
use crate::net::tcp::dial::Rail;
use crate::net::verbs::dial::RailTarget;
use crate::server::{AllowList, Key};
use crate::transfer::store::Output;
use crate::transfer::PayloadOptions;
use crate::wire::Op;
use std::net::SocketAddr;
use std::time::Duration;

/// `--rail-timeout`'s default.
pub const DEFAULT_RAIL_TIMEOUT: Duration = Duration::from_millis(500);

/// What a sender is asked to do.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The receiver (its first rail's address).
    pub peer: SocketAddr,
    /// Bytes per chunk (one frame or work request, one CRC32C).
    pub chunk: u64,
    /// Chunks in flight at most.
    pub depth: u32,
    /// Bound of every wait; while data flows it restarts on each completion.
    pub timeout: Duration,
    /// Draw a progress bar on stderr (when the transfer takes more than a moment).
    pub progress: bool,
    /// The protocol version written into the offer: `wire::VERSION` except in tests of
    /// the receiver's version check.
    pub protocol_version: u16,
    /// `--key-file`: proves to a receiver with the same key that this sender may send.
    pub key: Option<Key>,
    /// What is sent and how the receiver checks it.
    pub payload: PayloadOptions,
    /// Striped: a rail with items in flight that reports none for this long, while
    /// another rail is well, has failed (`--rail-timeout`).
    pub rail_timeout: Duration,
    /// Where rails that failed rest, shared by the transfers that should remember.
    pub cooldowns: Cooldowns,
    /// What only TCP reads.
    pub tcp: TcpSendOptions,
    /// What only verbs reads.
    pub verbs: VerbsSendOptions,
    /// The caller's token that stops the transfer ([`super::cancel`]).
    pub cancel: Option<super::Cancel>,
}

impl SendOptions {
    /// Sending to `peer` with the command line's defaults: chunks of 1 MiB, 16 in
    /// flight, one stream, 10 s per wait, the pattern checked element by element.
    pub fn to(peer: SocketAddr) -> SendOptions {
        SendOptions {
            peer,
            chunk: 1 << 20,
            depth: 16,
            timeout: Duration::from_secs(10),
            progress: false,
            protocol_version: crate::wire::VERSION,
            key: None,
            payload: PayloadOptions::default(),
            rail_timeout: DEFAULT_RAIL_TIMEOUT,
            cooldowns: Cooldowns::new(),
            tcp: TcpSendOptions {
                streams: 1,
                ..TcpSendOptions::default()
            },
            verbs: VerbsSendOptions::default(),
            cancel: None,
        }
    }
}

/// A verbs sender's own options.
#[derive(Debug, Clone)]
pub struct VerbsSendOptions {
    /// How each chunk travels: SENDs into the receiver's posted receives, or RDMA WRITEs
    /// into its buffer.
    pub op: Op,
    /// The local RDMA device the route to the receiver must leave through (`--nic`).
    pub nic: Option<String>,
    /// Striped over these rails (two or more; rail 0 to `peer`); empty: one rail.
    pub rails: Vec<RailTarget>,
    /// Spin on the completion queue instead of sleeping (`--busy-poll`).
    pub busy_poll: bool,
    /// TEST ONLY (`--test-peer-lies`): break the protocol in the first sending of items.
    pub test_peer_lies: Option<crate::transfer::faults::PeerLie>,
}

impl Default for VerbsSendOptions {
    fn default() -> Self {
        VerbsSendOptions {
            op: Op::Send,
            nic: None,
            rails: Vec::new(),
            busy_poll: false,
            test_peer_lies: None,
        }
    }
}

/// A TCP sender's own options.
#[derive(Debug, Clone, Default)]
pub struct TcpSendOptions {
    /// Sockets per rail (NCCL's NCCL_NSOCKS_PERTHREAD).
    pub streams: u16,
    /// The rails (`--bind-interfaces`, the receiver's addresses): more than one stripes
    /// the transfer over them; empty: one rail to the peer.
    pub rails: Vec<Rail>,
    /// TEST ONLY (`--test-silent-rail K`): rail K writes no end marker after its items.
    pub test_silent_rail: Option<usize>,
}

/// What a receiver serves.
#[derive(Debug, Clone)]
pub struct RecvOptions {
    pub bind: SocketAddr,
    pub once: bool,
    pub max_bytes: u64,
    pub timeout: Duration,
    /// Transfers served at once at most.
    pub max_connections: usize,
    /// Bytes of buffers held at once (host buffers, GPU memory and its page-locked
    /// rings, the books of checked chunks).
    pub max_memory: u64,
    /// Bytes per second a connection must average (beyond its first `timeout`); 0: no
    /// limit.
    pub min_rate: u64,
    /// Transfers served at once for one address.
    pub max_per_peer: usize,
    /// Addresses served (empty: all).
    pub allow: AllowList,
    /// With a key, only senders that prove they hold it are served.
    pub key: Option<Key>,
    /// `--output`: where each verified transfer is written.
    pub output: Option<Output>,
    /// The caller's token that stops the receive, waiting or under way
    /// ([`super::cancel`]; a library's).
    pub cancel: Option<super::Cancel>,
}

impl RecvOptions {
    /// Serving on `bind` with the command line's defaults, but for one transfer of at
    /// most `max_bytes` (`once`), buffers of at most twice that, no rate limit.
    pub fn once_on(bind: SocketAddr, max_bytes: u64) -> RecvOptions {
        RecvOptions {
            bind,
            once: true,
            max_bytes,
            timeout: Duration::from_secs(10),
            max_connections: 1,
            max_memory: max_bytes.saturating_mul(2),
            min_rate: 0,
            max_per_peer: 1,
            allow: AllowList::default(),
            key: None,
            output: None,
            cancel: None,
        }
    }
}

/// Makes the receive buffers of one transfer over verbs, on the thread that serves it
/// (GPU objects stay on the thread that made them).
pub type SinkFactoryMaker = dyn Fn() -> anyhow::Result<SinkFactory> + Send + Sync;

/// How a verbs receiver serves, beyond its options.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerbsServe {
    /// The seed's raw senders only (`--raw`).
    pub raw: bool,
    /// Spin on completion queues instead of sleeping (`--busy-poll`).
    pub busy_poll: bool,
}
