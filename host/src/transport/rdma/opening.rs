//! Opening a verbs sender's connection, what the one-rail sender ([`sender`]) and the
//! striped one (`striped.rs`) share: the configuration, the route to the receiver and the
//! connect (its answer in the accept or the reject), the checks of the device and of the
//! message size, the offer, the source's memory (its choice and registration), and the
//! receives for the receiver's replies. Its own module so that the two senders need not
//! import each other.
//!
//! [`sender`]: super::sender

use super::conn::{next_event, Connection, Resources, INDEX_MASK, WR_ACK};
use super::repair::CONTROL_SLOT;
use crate::memory::select::{walk, AttemptLog};
use crate::memory::{SendMemory, SendSource};
use crate::rdma::{
    self, errno_message, CmEventKind, CmId, Completion, ConnParams, Deadline, MemoryRegion,
    MessageBuffer,
};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::units::format_bytes_apart;
use crate::transfer::{PayloadOptions, TransferError};
use crate::wire::{Ack, Header, Op, RejectReason, WireError, ACK_LEN};
use std::net::SocketAddr;
use std::time::Duration;

/// Everything the sender needs to know, built by the CLI.
#[derive(Debug, Clone)]
pub struct SendConfig {
    pub peer: SocketAddr,
    pub op: Op,
    /// Bytes per transfer (the data's size).
    pub bytes: u64,
    /// The RDMA device the route must use (`--nic`), if one was named.
    pub nic: Option<String>,
    /// Bytes per work request (clamped to the transfer size).
    pub chunk: u64,
    /// Work requests kept in flight.
    pub depth: u32,
    /// Bound of every wait; while data flows it restarts on each completion.
    pub timeout: Duration,
    /// Spin on the CQ instead of sleeping on a completion channel.
    pub busy_poll: bool,
    /// Draw a progress bar on stderr (when the transfer takes more than a moment).
    pub progress: bool,
    /// The protocol version written into the header: `header::VERSION` except in tests
    /// of the receiver's version check.
    pub protocol_version: u16,
    /// `--key-file`: proves to a receiver with the same key that this sender may send.
    pub key: Option<crate::server::Key>,
    /// What is sent and how the receiver checks it (version 2): the payload kind,
    /// `--verify` (with checksums the sender computes the CRC32C of every chunk and sends
    /// them after the data, see `repair.rs`), `--max-resends`, and the test-only
    /// `--test-inject-faults` (one bit flipped in a copy of a chunk, never in the
    /// source). `name` is not carried over verbs (no room in the connect request).
    pub payload: PayloadOptions,
    /// Striped over these rails (`<IP>` a comma list, `--nic a,b`): rail k from its
    /// device to its address; rail 0 is `peer` and carries the control messages. Fewer
    /// than two: not striped (see `striped.rs`).
    pub rails: Vec<RailTarget>,
    /// Striped: a rail with chunks in flight and no completion for this long, while
    /// another rail completes, has failed (`--rail-timeout`).
    pub rail_timeout: Duration,
    /// Where rails that failed rest (the caller's, shared by its transfers).
    pub cooldowns: crate::engine::Cooldowns,
}

/// One rail of a striped verbs transfer: the receiver's address on it, and the local
/// RDMA device the route must leave through (`--nic`'s k-th), if named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailTarget {
    pub peer: SocketAddr,
    pub nic: Option<String>,
}

/// Extra time given to the CM to report its own timeout.
const CM_GRACE: Duration = Duration::from_millis(500);

/// Resolve `peer`'s address and route on `id`, each step bounded by `timeout`.
pub(super) fn resolve(id: &CmId, peer: SocketAddr, timeout: Duration) -> Result<(), TransferError> {
    let label = peer.to_string();
    id.resolve_addr(peer, timeout)?;
    // A little longer than the CM's own timeout, so that its ADDR_ERROR (with the
    // reason) comes first.
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("address resolution of {label}"))?;
    match event.kind() {
        CmEventKind::AddrResolved => {}
        CmEventKind::AddrError => {
            let errno = -event.status();
            let why = if errno == libc::ENODEV {
                "no RDMA device on the way to it (the route leaves through a network interface without RDMA)".to_string()
            } else {
                format!("address resolution failed: {}", errno_message(errno))
            };
            return Err(TransferError::Unreachable { peer: label, why });
        }
        _ => {
            return Err(rdma::RdmaError::UnexpectedEvent {
                expected: "RDMA_CM_EVENT_ADDR_RESOLVED",
                got: event.name(),
                status: event.status(),
            }
            .into())
        }
    }
    drop(event);
    id.resolve_route(timeout)?;
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("route resolution to {label}"))?;
    match event.kind() {
        CmEventKind::RouteResolved => Ok(()),
        CmEventKind::RouteError => Err(TransferError::Unreachable {
            peer: label,
            why: format!(
                "route resolution failed: {}",
                errno_message(-event.status())
            ),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ROUTE_RESOLVED",
            got: event.name(),
            status: event.status(),
        }
        .into()),
    }
}

/// IB CM reject reason "invalid service ID": nobody listens on that port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;

/// Connect with `private_data` and wait for ESTABLISHED; returns the accept's private data.
pub(super) fn connect(
    id: &CmId,
    peer: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
    raw: bool,
) -> Result<Vec<u8>, TransferError> {
    let label = peer.to_string();
    id.connect(&ConnParams::with_private_data(private_data))?;
    let deadline = Deadline::after(timeout);
    let event = next_event(id, &deadline, &format!("{label} to accept the connection"))?;
    let status = event.status();
    match event.kind() {
        CmEventKind::Established => Ok(event.private_data().to_vec()),
        CmEventKind::Rejected => match RejectReason::decode(event.private_data()) {
            Some(RejectReason::BadHeader(WireError::BadMagic { .. })) if raw => {
                Err(TransferError::Protocol(format!(
                    "receiver rejected the transfer: {label} expects framed transfers (it is `host recv` without --raw); drop --raw here or start it with --raw"
                )))
            }
            Some(reason) => Err(TransferError::Rejected(reason)),
            None if status == IB_CM_REJ_INVALID_SERVICE_ID || status == -libc::ECONNREFUSED => {
                Err(TransferError::NoReceiver {
                    peer: label,
                    why: "connection refused".into(),
                })
            }
            None => Err(TransferError::RejectedWithoutReason { peer: label, status }),
        },
        CmEventKind::Unreachable => Err(TransferError::NoReceiver {
            peer: label,
            why: format!("no answer: {}", errno_message(-status)),
        }),
        CmEventKind::ConnectError => Err(TransferError::Unreachable {
            peer: label,
            why: format!("connecting failed: {}", errno_message(-status)),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ESTABLISHED",
            got: event.name(),
            status,
        }
        .into()),
    }
}

/// The device's largest message, checked against what one work request carries.
pub(super) fn check_message_size(id: &CmId, bytes: u64, what: &str) -> Result<(), TransferError> {
    let port = id.port_info()?;
    if bytes > port.max_msg_sz as u64 {
        // In exact bytes where the rounded sizes would read the same.
        let (bytes, max) = format_bytes_apart(bytes, port.max_msg_sz as u64);
        return Err(TransferError::Protocol(format!(
            "{what} of {bytes} exceeds the largest message of RDMA device {} ({max})",
            id.device_name().unwrap_or_else(|| "?".into()),
        )));
    }
    Ok(())
}

/// The header this sender offers for `transfers` transfers.
pub(super) fn offer(cfg: &SendConfig, transfers: u32) -> Result<Header, TransferError> {
    let plan = ChunkPlan::new(cfg.bytes, cfg.chunk).map_err(TransferError::Protocol)?;
    let cannot = |e: WireError| TransferError::Protocol(format!("cannot offer this transfer: {e}"));
    let chunk_bytes = u32::try_from(plan.chunk_bytes()).map_err(|_| {
        cannot(WireError::ChunkLargerThanTotal {
            chunk: plan.chunk_bytes(),
            total: cfg.bytes,
        })
    })?;
    // Checked by with_payload (user data may be any length, the pattern whole i32s).
    let header = Header {
        op: cfg.op,
        total_bytes: cfg.bytes,
        chunk_bytes,
        depth: cfg.depth,
        transfers: 1,
        solicited_events: false,
        payload: cfg.payload.payload,
        verify: cfg.payload.verify,
        max_resends: cfg.payload.max_resends,
        // The name follows the accept as a message of its own (`encode_name`).
        named: cfg.payload.name.is_some(),
        // Striped over verbs: `striped.rs` sets it with the rail count.
        striped: false,
        pieces: false,
        rails: 0,
    };
    header
        .with_payload(
            cfg.payload.payload,
            cfg.payload.verify,
            cfg.payload.max_resends,
        )
        .map(Header::with_solicited_events)
        .and_then(|h| h.with_transfers(transfers))
        .map_err(cannot)
}

/// With `--nic`, the route to the peer must leave through that device.
pub(super) fn check_nic(id: &CmId, cfg: &SendConfig) -> Result<(), TransferError> {
    check_device(id, cfg.nic.as_deref(), cfg.peer)
}

/// The route to `peer` must leave through `wanted`, if one is named.
pub(super) fn check_device(
    id: &CmId,
    wanted: Option<&str>,
    peer: SocketAddr,
) -> Result<(), TransferError> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    match id.device_name() {
        Some(bound) if bound != wanted => Err(TransferError::Protocol(format!(
            "the route to {peer} leaves through RDMA device {bound}, not --nic {wanted}: give the receiver an address reached through {wanted}, or drop --nic"
        ))),
        _ => Ok(()),
    }
}

/// Walk the memory plan on this connection's protection domain: the first method whose
/// memory the NIC registers is the one the transfer uses (a trial registration, dropped
/// at once; the transfer registers the memory again for itself). A refusal (no dma-buf in
/// the NIC's driver, no peermem, a BAR1 too small) moves on to the next method.
/// Also returns the time spent making sources in the walk (since `making_before`).
pub(super) fn choose_source<'m>(
    res: &Resources,
    memory: &'m mut SendMemory,
    making_before: Duration,
) -> Result<(&'m dyn SendSource, AttemptLog, Duration), TransferError> {
    let plan = memory.plan().clone();
    let walked = walk(&plan, |method| {
        let source = memory.source(method).map_err(|e| format!("{e:#}"))?;
        MemoryRegion::register(&res.pd, source.memory())
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .map_err(|e| TransferError::Memory(e.into()))?;
    memory.settle(walked.method);
    let making = memory.making_time().saturating_sub(making_before);
    let source = memory
        .source(walked.method)
        .map_err(TransferError::Memory)?;
    Ok((source, walked.log, making))
}

/// Register the source's memory for the NIC to read. When the NIC refuses GPU memory
/// (no dma-buf support in its driver, no peermem), say what to use instead.
pub(super) fn register_source<'s>(
    res: &Resources,
    source: &'s dyn SendSource,
) -> Result<MemoryRegion<'s>, TransferError> {
    let memory = source.memory();
    MemoryRegion::register(&res.pd, memory).map_err(|e| {
        if memory.target().is_gpu_memory() {
            TransferError::Protocol(format!(
                "the NIC could not register GPU memory for GPUDirect RDMA ({e}); use --mem staged or --mem mapped"
            ))
        } else {
            e.into()
        }
    })
}

/// The receives a sender keeps posted for the receiver's replies after the data (the
/// ack; with checksums also its resend requests), each in a slot of its own, reposted
/// as soon as it has been read.
pub(super) struct Replies {
    buf: MessageBuffer,
    slot_len: usize,
}

impl Replies {
    pub(super) fn new(
        res: &Resources,
        slots: u32,
        checksums: bool,
    ) -> Result<Replies, TransferError> {
        let slot_len = if checksums { CONTROL_SLOT } else { 64 };
        Ok(Replies {
            buf: MessageBuffer::new(&res.pd, slots as usize * slot_len)?,
            slot_len,
        })
    }

    pub(super) fn post<'r>(
        &'r self,
        conn: &Connection<'r>,
        slot: u32,
    ) -> Result<(), TransferError> {
        let at = slot as usize * self.slot_len;
        let sge = self.buf.sge_at(at..at + self.slot_len)?;
        // SAFETY: the slot is read only after this receive's completion was polled, and
        // posted again only after that read.
        unsafe { conn.qp.post_recv(WR_ACK | slot as u64, Some(sge))? };
        Ok(())
    }

    /// Post the slot of a reply that has been read again.
    pub(super) fn repost<'r>(
        &'r self,
        conn: &Connection<'r>,
        c: &Completion,
    ) -> Result<(), TransferError> {
        self.post(conn, (c.wr_id & INDEX_MASK) as u32)
    }

    /// The ack in `c`'s slot.
    pub(super) fn ack(&self, c: &Completion) -> Result<Ack, TransferError> {
        Ack::decode(&self.read(c)[..(c.byte_len as usize).min(ACK_LEN)])
            .map_err(|e| TransferError::Protocol(format!("the receiver's ack is invalid: {e}")))
    }

    /// The reply in `c`'s slot.
    pub(super) fn read(&self, c: &Completion) -> Vec<u8> {
        let slot = (c.wr_id & INDEX_MASK) as usize;
        self.buf.read_at(
            slot * self.slot_len,
            (c.byte_len as usize).min(self.slot_len),
        )
    }
}
