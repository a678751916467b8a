//! The receiver's checks by checksum over verbs, after a transfer's data: take the
//! sender's chunk checksums, compare each with the CRC32C of the chunk where it landed
//! (the CPU for host memory, the `crc32c_chunks` kernel for GPU memory), and ask for
//! the chunks that failed again, round after round, within the sender's bound.
//! `repair.rs` keeps the books; this file posts and waits.
//!
//! Resent chunks land where they landed the first time: RDMA WRITEs to the same offset
//! (write mode), or SENDs into receives posted at the chunks' places, in the order of
//! the request (send mode: RC delivers in order, so the `k`-th SEND of the round fills
//! the `k`-th receive). Either way each names its chunk in its immediate (index + 1),
//! which is checked.

use super::conn::{tag, Connection, Waited, INDEX_MASK, TAG_DATA, TAG_RESEND, WR_ACK, WR_CTRL};
use super::receives::Receives;
use super::repair::{self, Expected};
use crate::memory::RecvSink;
use crate::rdma::{Completion, Deadline, MessageBuffer, RdmaError, SendOp, SendWr};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::repair::{failed, Next, Repair};
use crate::transfer::TransferError;
use crate::wire::Op;
use std::collections::VecDeque;
use std::time::Duration;

/// What the checks found for one transfer.
#[derive(Debug)]
pub(super) struct Checked {
    /// CRC32C of the whole transfer as it landed, when every chunk passed.
    pub digest: Option<u32>,
    /// Chunks that failed and then passed: (chunk, times sent in all).
    pub repaired: Vec<(u32, u32)>,
    /// Chunks asked for again, all rounds together.
    pub resent: u64,
    /// Chunks that still failed when the resends were used up.
    pub failed: Vec<u32>,
}

/// One transfer's checks, on a connection.
pub(super) struct Round<'a, 'b, 'r> {
    pub conn: &'a Connection<'r>,
    pub recvs: &'a mut Receives<'b, 'r>,
    /// Where the resend requests are written to be sent (one at a time).
    pub resend_buf: &'r MessageBuffer,
    pub sink: &'a dyn RecvSink,
    pub plan: &'a ChunkPlan,
    pub peer: &'a str,
    pub timeout: Duration,
    pub max_resends: u8,
    /// " in transfer k of n", or nothing.
    pub context: String,
    /// Completions taken but not yet handled, in order.
    pub queue: VecDeque<Completion>,
}

impl Round<'_, '_, '_> {
    /// The checks of a transfer whose data is in; `on_ack` sees the send completions of
    /// earlier acks.
    pub fn check(&mut self, on_ack: &mut dyn FnMut(&Completion)) -> Result<Checked, TransferError> {
        let expected = self.expected(on_ack)?;
        let (total, chunk) = (self.plan.total(), self.plan.chunk_bytes());
        let mut landed = self
            .sink
            .crc32c_chunks(0..total as usize, chunk as usize)
            .map_err(TransferError::Memory)?;
        if landed.len() != expected.len() {
            return Err(self.protocol(format!(
                "{} checksums computed for {} chunks",
                landed.len(),
                expected.len()
            )));
        }
        let mut repair = Repair::new(self.max_resends, failed(&expected, &landed));
        loop {
            match repair.next() {
                Next::Done => {
                    return Ok(Checked {
                        digest: Some(crate::integrity::digest(&landed, chunk, total)),
                        repaired: repair.repaired().to_vec(),
                        resent: repair.resent(),
                        failed: Vec::new(),
                    })
                }
                Next::GiveUp { round, chunks } => {
                    self.exchange(round, true, &chunks, on_ack)?;
                    return Ok(Checked {
                        digest: None,
                        repaired: repair.repaired().to_vec(),
                        resent: repair.resent(),
                        failed: chunks,
                    });
                }
                Next::Resend { round, chunks } => {
                    self.exchange(round, false, &chunks, on_ack)?;
                    let mut passed = Vec::with_capacity(chunks.len());
                    for &index in &chunks {
                        let c = self
                            .plan
                            .get(index as u64)
                            .ok_or_else(|| self.protocol(format!("no chunk {index}")))?;
                        let crc = self
                            .sink
                            .crc32c_chunks(c.offset as usize..c.end() as usize, c.len as usize)
                            .map_err(TransferError::Memory)?;
                        let crc = crc.first().copied().unwrap_or_default();
                        landed[index as usize] = crc;
                        passed.push(crc == expected[index as usize]);
                    }
                    repair.checked(&passed);
                }
            }
        }
    }

    /// The sender's checksums of every chunk, from its messages.
    fn expected(&mut self, on_ack: &mut dyn FnMut(&Completion)) -> Result<Vec<u32>, TransferError> {
        let mut expected = Expected::new(self.plan.count());
        let mut deadline = Deadline::after(self.timeout);
        while !expected.complete() {
            let c = self.next(&mut deadline, "the chunk checksums")?;
            match tag(c.wr_id) {
                WR_ACK => on_ack(&c),
                TAG_DATA => {
                    c.check(|| "the receive of chunk checksums".into())?;
                    let message = match self.recvs.control_message(&c) {
                        Some(m) if !c.is_write_with_imm() => m,
                        _ => {
                            return Err(self.protocol(
                                "data arrived where the chunk checksums were due".into(),
                            ))
                        }
                    };
                    expected.take(&message).map_err(|e| self.protocol(e))?;
                    self.recvs.replenish()?;
                    deadline = Deadline::after(self.timeout);
                }
                _ => {}
            }
        }
        Ok(expected.crcs().to_vec())
    }

    /// Send the resend request of a round (in as many messages as it takes) and, unless
    /// it is the `last` (naming chunks given up on), take the chunks sent again.
    fn exchange(
        &mut self,
        round: u32,
        last: bool,
        chunks: &[u32],
        on_ack: &mut dyn FnMut(&Completion),
    ) -> Result<(), TransferError> {
        let parts = repair::resend_batches(round, last, chunks);
        let due = if last { 0 } else { chunks.len() };
        let send_mode = self.recvs.op() == Op::Send;
        // Send mode: the receive queue is empty now (every data and checksum receive was
        // consumed); the chunks' receives go in first, in the order they will come.
        let room = self.conn.qp.caps().max_recv_wr.max(1) as usize;
        let mut posted = 0;
        if send_mode {
            while posted < due.min(room) {
                self.recvs.post_resend(chunks[posted] as u64)?;
                posted += 1;
            }
        }
        let (mut next_part, mut part_out, mut got) = (0, false, 0);
        let mut deadline = Deadline::after(self.timeout);
        loop {
            if !part_out && next_part < parts.len() {
                self.send_part(next_part, &parts[next_part].encode())?;
                part_out = true;
                next_part += 1;
            }
            if !part_out && next_part == parts.len() && got == due {
                return Ok(());
            }
            let c = self.next(&mut deadline, "the chunks sent again")?;
            match tag(c.wr_id) {
                WR_ACK => on_ack(&c),
                WR_CTRL => {
                    c.check(|| "the SEND of a resend request".into())?;
                    part_out = false;
                }
                TAG_RESEND | TAG_DATA => {
                    let what = || format!("the receive of a chunk sent again{}", self.context);
                    c.check(what)?;
                    let Some(&want) = chunks.get(got).filter(|_| got < due) else {
                        return Err(self.protocol("a chunk arrived that was not asked for".into()));
                    };
                    let fits = match tag(c.wr_id) {
                        TAG_RESEND => {
                            let len = self.plan.get(want as u64).map_or(0, |ch| ch.len);
                            c.wr_id & INDEX_MASK == want as u64 && c.byte_len as u64 == len
                        }
                        _ => !send_mode && c.is_write_with_imm(),
                    };
                    if !fits || c.imm != Some(want + 1) {
                        return Err(self.protocol(format!(
                            "chunk {want} was due again, and a message of {} bytes with immediate {:?} came",
                            c.byte_len, c.imm
                        )));
                    }
                    got += 1;
                    if send_mode {
                        if posted < due {
                            self.recvs.post_resend(chunks[posted] as u64)?;
                            posted += 1;
                        }
                    } else {
                        self.recvs.replenish()?;
                    }
                    deadline = Deadline::after(self.timeout);
                }
                _ => {}
            }
        }
    }

    /// SEND part `number` of a resend request from the resend buffer (free: the last
    /// part's completion has been taken).
    fn send_part(&self, number: usize, bytes: &[u8]) -> Result<(), RdmaError> {
        self.resend_buf.write(bytes)?;
        // SAFETY: the buffer is registered, outlives the connection's use of it, and is
        // rewritten only after this request's completion (the caller's `part_out`).
        unsafe {
            self.conn.qp.post_send(&SendWr {
                wr_id: WR_CTRL | (number as u64 & INDEX_MASK),
                sge: self.resend_buf.sge(bytes.len()),
                op: SendOp::Send,
                signaled: true,
                inline: false,
                solicited: true,
            })
        }
    }

    /// The next completion: one taken earlier, or the next to come before `deadline`.
    fn next(&mut self, deadline: &mut Deadline, what: &str) -> Result<Completion, TransferError> {
        let mut comps = Vec::new();
        loop {
            if let Some(c) = self.queue.pop_front() {
                return Ok(c);
            }
            comps.clear();
            let waiting_for = format!("{what} from {}{}", self.peer, self.context);
            match self.conn.wait(&mut comps, deadline, &waiting_for)? {
                Waited::Completions => {}
                Waited::Disconnected => {
                    self.conn.cq.poll(&mut comps)?;
                    if comps.is_empty() {
                        return Err(
                            self.protocol(format!("the sender disconnected while {what} were due"))
                        );
                    }
                }
            }
            self.queue.extend(comps.iter().copied());
        }
    }

    fn protocol(&self, why: String) -> TransferError {
        TransferError::Protocol(format!("{}: {why}{}", self.peer, self.context))
    }
}
