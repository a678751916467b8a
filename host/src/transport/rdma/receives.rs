//! The receive queue of a verbs receiver's connection: how many receives it keeps posted,
//! and what each takes (a chunk in its place, a control slot), for the receiver and its
//! checksum stage (`checks.rs`) alike.

use super::conn::{Connection, INDEX_MASK, TAG_DATA};
use super::repair::{self, Receive, CONTROL_SLOT};
use crate::rdma::{self, Completion, MemoryRegion, MessageBuffer, RdmaError};
use crate::transfer::plan::ChunkPlan;
use crate::wire::{Header, Op, MAX_DEPTH};

/// Receives kept posted at least (if the transfer has that many chunks).
const MIN_RECEIVES: u64 = 64;

/// Receives a receiver keeps posted for a transfer of `chunks` chunks: more than the
/// sender keeps in flight (twice, and at least 64), since a receive is reposted only a
/// moment after its completion and a sender that finds the queue empty must back off
/// ("receiver not ready"); never more than the chunks, nor than twice the deepest offer.
pub(super) fn recv_depth(header: &Header, chunks: u64) -> u32 {
    (header.depth as u64 * 2)
        .max(MIN_RECEIVES)
        .min(chunks)
        .min(2 * MAX_DEPTH as u64) as u32
}

/// The receives of one connection's data, and with checksums of the sender's chunk
/// checksums: one sequence, consumed in order (a receive queue is first in, first out).
///
/// Send mode: receive `p` of a transfer takes chunk `p` in its place in the buffer, for
/// `p < n`; with checksums, receives `n..n + c` take the `c` checksum messages, each
/// into a control slot. Write mode: the receives take only the immediates of RDMA WRITEs;
/// with checksums each names a control slot too, where a checksum message may land.
/// Control slot of receive `p`: `(p - n) % slots` (send) or `p % slots` (write); a slot
/// is posted again only after the receive that used it completed and was read, since
/// no more receives than slots are ever outstanding.
pub(super) struct Receives<'a, 'r> {
    pub(super) conn: &'a Connection<'r>,
    pub(super) mr: &'r MemoryRegion<'r>,
    pub(super) plan: &'a ChunkPlan,
    pub(super) op: Op,
    /// Control slots (with checksums).
    pub(super) ctrl: Option<&'r MessageBuffer>,
    pub(super) slots: u64,
    /// Send mode: receives posted for the current transfer (indices `0..posted`).
    /// Write mode: receives posted on the connection.
    pub(super) posted: u64,
    /// Most receives to post: send mode per transfer (the chunks, and the checksum
    /// messages), write mode per connection (one per chunk of every transfer, more than
    /// the signaled ones need; without bound with checksums: resends come too).
    pub(super) limit: u64,
}

impl<'r> Receives<'_, 'r> {
    pub(super) fn post(&mut self) -> Result<(), RdmaError> {
        let p = self.posted;
        let sge = match (self.receive(p), self.plan.get(p), self.ctrl) {
            (Receive::Chunk(_), Some(chunk), _) => {
                Some(self.mr.sge(chunk.offset as usize..chunk.end() as usize)?)
            }
            (Receive::Slot(slot), _, Some(ctrl)) => Some(slot_sge(ctrl, slot)?),
            _ => None,
        };
        // SAFETY: nobody reads the buffer before every data receive of the transfer has
        // completed (the receiver verifies only then, and poisons only before posting);
        // a control slot is read only after its receive completed, and posted again only
        // after that (see the struct's documentation).
        unsafe { self.conn.qp.post_recv(TAG_DATA | p, sge)? };
        self.posted += 1;
        Ok(())
    }

    /// Replace a consumed receive, as long as more can be needed.
    pub(super) fn replenish(&mut self) -> Result<(), RdmaError> {
        if self.posted < self.limit {
            self.post()?;
        }
        Ok(())
    }

    /// Send mode: the previous transfer's receives are all consumed and its data checked;
    /// post the first `depth` of the next one.
    pub(super) fn start_next_transfer(&mut self, depth: u64) -> Result<(), RdmaError> {
        if self.op == Op::Send {
            self.posted = 0;
            while self.posted < depth.min(self.limit) {
                self.post()?;
            }
        }
        Ok(())
    }

    /// What receive `p` takes.
    fn receive(&self, p: u64) -> Receive {
        let slots = self.ctrl.map(|_| self.slots);
        repair::receive_of(self.op, p, self.plan.count(), slots)
    }

    /// The control message that completed receive `wr_id`, if that receive had a slot.
    pub(super) fn control_message(&self, c: &Completion) -> Option<Vec<u8>> {
        let ctrl = self.ctrl?;
        let Receive::Slot(slot) = self.receive(c.wr_id & INDEX_MASK) else {
            return None;
        };
        let len = (c.byte_len as usize).min(CONTROL_SLOT);
        Some(ctrl.read_at(slot as usize * CONTROL_SLOT, len))
    }

    /// The mode's operation.
    pub(super) fn op(&self) -> Op {
        self.op
    }

    /// Send mode, a resend round: post the receive for chunk `index` (sent again, in
    /// its place); the caller keeps no more outstanding than the queue holds.
    pub(super) fn post_resend(&self, index: u64) -> Result<(), RdmaError> {
        let chunk = self.plan.get(index).ok_or_else(|| {
            RdmaError::InvalidArgument(format!("chunk {index} is not in the transfer"))
        })?;
        let sge = self.mr.sge(chunk.offset as usize..chunk.end() as usize)?;
        // SAFETY: the chunk's bytes are read (checked again) only after this receive
        // completed.
        unsafe {
            self.conn
                .qp
                .post_recv(super::conn::TAG_RESEND | index, Some(sge))
        }
    }
}

fn slot_sge(ctrl: &MessageBuffer, slot: u64) -> Result<rdma::Sge<'_>, RdmaError> {
    let at = slot as usize * CONTROL_SLOT;
    ctrl.sge_at(at..at + CONTROL_SLOT)
}
