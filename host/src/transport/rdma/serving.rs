//! What the verbs receiver's two ways of receiving share, one rail ([`receiver`]'s) and
//! striped (`striped_recv.rs`): the configuration, how serving a connection fails, and the
//! setup of an accepted connection (its queue pair, its sink, the wait for ESTABLISHED).
//! Its own module so that the serving loop and the striped receiver, which it calls,
//! need not import each other.
//!
//! [`receiver`]: super::receiver

use super::conn::{next_event, Connection, Resources};
use crate::memory::select::{walk, AttemptLog};
use crate::memory::{RecvSink, SinkFactory};
use crate::rdma::{self, CmEventKind, CmId, Deadline, MemoryRegion, QpCaps, RdmaError};
use crate::server::{AllowList, Key};
use crate::transfer::store::Output;
use crate::transfer::TransferError;
use crate::wire::{RejectReason, ACK_LEN};
use std::net::SocketAddr;
use std::time::Duration;

/// "Receiver not ready" retry delay asked of senders: IB encoding 12 = 0.64 ms.
pub(super) const MIN_RNR_TIMER: u8 = 12;

/// Everything the receiver needs to know, built by the CLI.
#[derive(Debug, Clone)]
pub struct RecvConfig {
    pub bind: SocketAddr,
    /// Serve one connection request, then return.
    pub once: bool,
    /// The seed's wire behaviour (no header; one message; a 16-byte reply).
    pub raw: bool,
    /// Largest transfer accepted (raw: the size of the one posted receive, also limited by
    /// the device's largest message).
    pub max_bytes: u64,
    /// Bound of every wait; while data flows it restarts on progress.
    pub timeout: Duration,
    pub busy_poll: bool,
    /// Connections served at once; more are rejected as busy.
    pub max_connections: usize,
    /// Bytes of receive buffers held at once; an offer that would go over is rejected.
    pub max_memory: u64,
    /// Bytes per second a connection must average (beyond its first `timeout`); 0: no
    /// limit.
    pub min_rate: u64,
    /// Connections served at once for one address.
    pub max_per_peer: usize,
    /// Addresses served (empty: all).
    pub allow: AllowList,
    /// With a key, only senders that prove they hold it are served (a first connect
    /// request is rejected with a nonce, the second carries the proof over it).
    pub key: Option<Key>,
    /// Where each verified transfer is written (`--output`) before it is acked: a
    /// failed write is acked `NotStored`, and the receiver goes on serving.
    pub output: Option<Output>,
}

pub(super) fn peer_label(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "an unknown peer".into(), |p| p.to_string())
}

/// How serving a connection ended badly: refused before the accept (the peer is told
/// why), or broken after it.
pub(super) enum Failure {
    Refuse(RejectReason, Option<String>),
    Broken(TransferError),
    /// The sender stayed below `--min-rate` (a [`TransferError::TooSlow`]): it is told
    /// with a "too slow" ack before the receiver disconnects.
    TooSlow(TransferError),
}

impl From<TransferError> for Failure {
    fn from(e: TransferError) -> Self {
        Failure::Broken(e)
    }
}

impl From<RdmaError> for Failure {
    fn from(e: RdmaError) -> Self {
        Failure::Broken(e.into())
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> Failure {
    Failure::Refuse(RejectReason::Internal, Some(e.to_string()))
}

/// Setting up the connection's QP failed: `EINVAL` here means the request's id is no
/// longer connectable (the sender gave up or died before we accepted); anything else is
/// our problem, and the sender is told.
pub(super) fn setup_failed(peer: &str, e: RdmaError) -> Failure {
    if e.errno() == Some(libc::EINVAL) {
        return Failure::Broken(TransferError::Protocol(format!(
            "the connection request from {peer} was withdrawn before it could be accepted ({e})"
        )));
    }
    internal(e)
}

/// Walk the receiver's memory plan on this connection's protection domain: make a
/// buffer for the first method and trial-register it; a refusal (the NIC takes no GPU
/// memory, say) moves on to the next. Nothing that works is a refusal of its own.
pub(super) fn choose_sink(
    res: &Resources,
    sinks: &SinkFactory,
    len: u64,
    remote_write: bool,
) -> Result<(Box<dyn RecvSink>, AttemptLog), Failure> {
    let no_memory = |e: &dyn std::fmt::Display| {
        Failure::Refuse(RejectReason::NoMemory { bytes: len }, Some(e.to_string()))
    };
    let bytes = usize::try_from(len).map_err(|e| no_memory(&e))?;
    let plan = sinks.plan();
    let walked = walk(&plan, |method| {
        let sink = sinks.make(method, bytes).map_err(|e| format!("{e:#}"))?;
        // SAFETY: the trial region is dropped at once (`map(drop)`), before the sink it
        // borrows; nothing reads the sink meanwhile.
        unsafe { register_sink(res, sink.as_ref(), remote_write) }
            .map(drop)
            .map_err(|e| e.to_string())?;
        Ok(sink)
    })
    .map_err(|e| {
        Failure::Refuse(
            RejectReason::NotRegistrable { bytes: len },
            Some(e.to_string()),
        )
    })?;
    sinks.settle(walked.method);
    // The peer will write up to `len` bytes into what this returns: a shorter sink
    // would be a bug of the factory, never the peer's to find.
    if (walked.value.len() as u64) < len {
        return Err(internal(format!(
            "the sink has {} bytes for a {len}-byte transfer",
            walked.value.len()
        )));
    }
    Ok((walked.value, walked.log))
}

/// Register a sink's memory on the connection's protection domain: for the peer's RDMA
/// WRITEs too in write mode, local access only otherwise.
///
/// # Safety
/// With `remote_write`, the caller drops the region before `sink` and never leaks it, as
/// [`MemoryRegion::register_remote_writable`] requires (a [`RecvSink`] reads its memory
/// only by copies, the other half of that contract).
pub(super) unsafe fn register_sink<'m>(
    res: &Resources,
    sink: &'m dyn RecvSink,
    remote_write: bool,
) -> Result<MemoryRegion<'m>, rdma::RdmaError> {
    if remote_write {
        // SAFETY: the caller's promise.
        unsafe { MemoryRegion::register_remote_writable(&res.pd, sink.memory()) }
    } else {
        MemoryRegion::register(&res.pd, sink.memory())
    }
}

/// The connection's queue pair, asking for inline sends big enough for the ack (the ack
/// buffer may then be rewritten right after posting); without them where the device
/// refuses.
pub(super) fn receiver_connection<'r>(
    res: &Resources,
    recv_depth: u32,
) -> Result<Connection<'r>, RdmaError> {
    let caps = receiver_caps(recv_depth);
    match Connection::new(res, caps) {
        Ok(conn) => Ok(conn),
        Err(_) => Connection::new(
            res,
            QpCaps {
                max_inline_data: 0,
                ..caps
            },
        ),
    }
}

pub(super) fn receiver_caps(recv_depth: u32) -> QpCaps {
    QpCaps {
        max_send_wr: 4,
        max_recv_wr: recv_depth,
        max_inline_data: ACK_LEN as u32,
    }
}

/// Wait for ESTABLISHED on a connection we accepted.
pub(super) fn wait_established(id: &CmId, peer: &str, timeout: Duration) -> Result<(), Failure> {
    let deadline = Deadline::after(timeout);
    let event = next_event(
        id,
        &deadline,
        &format!("the connection from {peer} to be established"),
    )?;
    if event.kind() != CmEventKind::Established {
        return Err(TransferError::Protocol(format!(
            "the connection from {peer} was not established: {}{}",
            event.name(),
            match event.status() {
                0 => String::new(),
                s if s < 0 => format!(" ({})", rdma::errno_message(-s)),
                s => format!(" (status {s})"),
            }
        ))
        .into());
    }
    Ok(())
}
