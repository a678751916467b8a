//! A verbs receiver's rail, rail 0 and every further one that joins alike: how items
//! land on it ([`Mode`]), its receive slots, its queue pair over the receive buffer
//! registered on its device, and its accept.

use super::conn::{Connection, Resources, SLOT};
use super::send::SEND_SLOTS;
use crate::memory::Registrable;
use crate::rdma::{self, ConnParams, ConnectRequest, MemoryRegion, QpCaps};
use crate::wire::{AcceptInfo, Header, Op, RejectReason, ACK_LEN, MAX_DEPTH};

/// How items land (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Write,
    SendInPlace,
    SendCopied,
}

/// One rail of a receiver's link.
pub struct RecvRail<'r> {
    /// First: the queue pair is destroyed before the region below.
    pub(crate) conn: Connection<'r>,
    /// A joined rail's own registration of the buffer (the rail's NIC writes through it).
    pub mr: Option<MemoryRegion<'r>>,
}

/// "Receiver not ready" retry delay asked of senders: IB encoding 12 = 0.64 ms (the CM
/// leaves 655 ms).
const MIN_RNR_TIMER: u8 = 12;
/// Receives kept posted at least (if the transfer has that many chunks).
const MIN_RECEIVES: u64 = 64;

/// Receives a receiver keeps posted per rail: more than the sender keeps in flight
/// (twice, and at least 64), since a receive is reposted only a moment after its
/// completion and a sender that finds none must back off; never more than the chunks
/// (and a few for messages), nor than twice the deepest offer.
pub fn recv_depth(header: &Header) -> usize {
    (header.depth as u64 * 2)
        .max(MIN_RECEIVES)
        .min(header.chunks().max(8))
        .min(2 * MAX_DEPTH as u64) as usize
}

/// How a rail of a transfer is set up, rail 0 and the joins alike.
#[derive(Debug, Clone, Copy)]
pub struct RailSetup {
    pub mode: Mode,
    pub recv_depth: usize,
    pub chunk: usize,
    pub total: u64,
    pub busy_poll: bool,
}

impl RailSetup {
    pub fn of(header: &Header, busy_poll: bool) -> RailSetup {
        let mode = match (header.op, header.rails > 1) {
            (Op::Write, _) => Mode::Write,
            (Op::Send, false) => Mode::SendInPlace,
            (Op::Send, true) => Mode::SendCopied,
        };
        RailSetup {
            mode,
            recv_depth: recv_depth(header),
            chunk: header.chunk_bytes as usize,
            total: header.total_bytes,
            busy_poll,
        }
    }

    pub(crate) fn caps(&self, inline: bool) -> QpCaps {
        let (slots, _) = slots_for(self.mode, self.recv_depth, self.chunk);
        QpCaps {
            max_send_wr: SEND_SLOTS as u32 + 8,
            max_recv_wr: self.recv_depth.max(slots) as u32 + 8,
            // The ack fragment goes inline, its buffer free at once.
            max_inline_data: if inline {
                (ACK_LEN + SLOT / 8) as u32
            } else {
                0
            },
        }
    }

    /// Bytes a rail holds beyond the buffer: its slots.
    pub fn rail_bytes(&self) -> u64 {
        let (slots, len) = slots_for(self.mode, self.recv_depth, self.chunk);
        (slots * len + SEND_SLOTS * SLOT) as u64
    }

    /// The connection of a rail over `res`, asking for inline sends (without them where
    /// the device refuses).
    pub(crate) fn connection<'r>(
        &self,
        res: &Resources,
    ) -> Result<Connection<'r>, rdma::RdmaError> {
        let slots = slots_for(self.mode, self.recv_depth, self.chunk);
        Connection::new(res, self.caps(true), slots, SEND_SLOTS)
            .or_else(|_| Connection::new(res, self.caps(false), slots, SEND_SLOTS))
    }
}

/// Register `memory` on `res`'s PD: for the peer's RDMA WRITEs too in write mode.
///
/// # Safety
/// In write mode, the region is dropped, not leaked, before `memory`'s borrow ends, and
/// `memory` is read only by copies while it lives
/// ([`MemoryRegion::register_remote_writable`]).
pub(crate) unsafe fn register<'m>(
    res: &Resources,
    memory: &'m dyn Registrable,
    mode: Mode,
) -> Result<MemoryRegion<'m>, rdma::RdmaError> {
    match mode {
        // SAFETY: the caller's promise.
        Mode::Write => unsafe { MemoryRegion::register_remote_writable(&res.pd, memory) },
        _ => MemoryRegion::register(&res.pd, memory),
    }
}

/// A further rail that joined: its queue pair over the buffer registered on its device,
/// and the accept that tells the sender where to write. Not accepted yet: its receives
/// go in first.
///
/// # Errors
/// What to reject it with.
pub fn prepare<'r>(
    request: &ConnectRequest,
    memory: &'r dyn Registrable,
    setup: &RailSetup,
) -> Result<(RecvRail<'r>, AcceptInfo), RejectReason> {
    let caps = setup.caps(true);
    let res = Resources::new(&request.id, Resources::cq_entries(caps), setup.busy_poll)
        .map_err(|_| RejectReason::Internal)?;
    let (mr, info) = match setup.mode {
        Mode::Write => {
            // SAFETY: the region goes into the rail, which the link owns; the link is a
            // local of `VerbsOffer::serve`, declared after the buffer and never leaked, so
            // the region is deregistered before the buffer goes; the buffer is a
            // RecvSink's, read only by copies.
            let mr = unsafe { register(&res, memory, setup.mode) }
                .map_err(|_| RejectReason::NotRegistrable { bytes: setup.total })?;
            let info = AcceptInfo {
                addr: mr.remote_base(),
                rkey: mr.rkey(),
                len: setup.total,
            };
            (Some(mr), info)
        }
        // SENDs land in this rail's own slots: nothing of the buffer is registered here.
        _ => (
            None,
            AcceptInfo {
                addr: 0,
                rkey: 0,
                len: setup.total,
            },
        ),
    };
    let conn = setup.connection(&res).map_err(|_| RejectReason::Internal)?;
    Ok((RecvRail { conn, mr }, info))
}

/// Accept `request` with `private_data`, once its receives are posted.
pub(crate) fn accept(
    request: &ConnectRequest,
    conn: &Connection,
    private_data: &[u8],
) -> Result<(), rdma::RdmaError> {
    request
        .id
        .accept(&ConnParams::with_private_data(private_data))?;
    // Should the receives run out, the sender retries after 0.64 ms, not 655 ms: only
    // an optimisation, not fatal.
    let _ = conn.qp.set_min_rnr_timer(MIN_RNR_TIMER);
    Ok(())
}

/// Receive slots a rail needs: write mode and send copied post every receive in a slot;
/// send in place only messages' ([`SLOT`] bytes each).
pub fn slots_for(mode: Mode, recv_depth: usize, chunk: usize) -> (usize, usize) {
    match mode {
        Mode::Write => (recv_depth, SLOT),
        Mode::SendInPlace => (8, SLOT),
        Mode::SendCopied => (recv_depth.min(32), chunk.max(SLOT)),
    }
}
