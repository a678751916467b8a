//! The reliable-connected queue pair of a CM id (`rdma_create_qp`), and posting work
//! requests on it.

use super::{CmId, CompletionQueue, ProtectionDomain, RdmaError, Sge};
use rdma_sys::*;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::rc::Rc;

/// Most requests [`QueuePair::post_send_list`] hands to the provider in one call.
pub const POST_LIST_MAX: usize = 32;

/// Queue sizes asked for; the provider may round them up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    /// Bytes a send request may carry inline (copied into the work queue at post time,
    /// so the NIC need not read registered memory): 0 for none.
    pub max_inline_data: u32,
}

/// The operation of a send-queue work request. Immediate data is given in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
}

impl SendOp {
    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm(_) => "SEND_WITH_IMM",
            SendOp::Write { .. } => "RDMA_WRITE",
            SendOp::WriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
        }
    }
}

/// A send-queue work request with one SGE of a region that lives for `'r`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'r> {
    pub wr_id: u64,
    pub sge: Sge<'r>,
    pub op: SendOp,
    /// Ask for a completion. Unsignaled requests complete silently (unless they fail);
    /// a later signaled completion implies every earlier request of the queue completed.
    pub signaled: bool,
    /// Send the SGE's bytes inline (`IBV_SEND_INLINE`): they are copied at post time, so
    /// the buffer may be reused at once and needs no registration. At most the QP's
    /// `max_inline_data` bytes.
    pub inline: bool,
    /// Set the solicited-event flag: a receiver whose CQ is armed for solicited
    /// completions only wakes up for this one.
    pub solicited: bool,
}

/// An RC queue pair, created on a CM id (which moves it through its states as the
/// connection is made). Keeps the id, the PD and both CQs alive.
///
/// `'r` is the life of the memory regions its work requests name: it takes only
/// [`Sge`]`<'r>`s, and because it has a destructor, `'r` must outlast it, so every region
/// it used is deregistered after the queue pair is destroyed (rdma-core's examples tear
/// down in the same order).
pub struct QueuePair<'r> {
    raw: NonNull<ibv_qp>,
    caps: QpCaps,
    id: Rc<CmId>,
    _pd: Rc<ProtectionDomain>,
    _send_cq: Rc<CompletionQueue>,
    _recv_cq: Rc<CompletionQueue>,
    /// Invariant in `'r` (a `fn` taking and returning it): were it covariant, a queue pair
    /// could be seen as a `QueuePair<'shorter>` and take the SGEs of a region that dies
    /// before it, and "destroyed before its regions" would no longer follow.
    _regions: PhantomData<fn(&'r ()) -> &'r ()>,
}

impl<'r> QueuePair<'r> {
    pub fn new(
        id: &Rc<CmId>,
        pd: &Rc<ProtectionDomain>,
        send_cq: &Rc<CompletionQueue>,
        recv_cq: &Rc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self, RdmaError> {
        if !id.claim_qp() {
            return Err(RdmaError::InvalidArgument(
                "this RDMA CM id already has a queue pair".into(),
            ));
        }
        // SAFETY: ibv_qp_init_attr is plain data; all-zero is valid before filling.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_send_wr.max(1);
        attr.cap.max_recv_wr = caps.max_recv_wr.max(1);
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: valid id, PD and CQs (all on the id's device, kept alive by the Rcs we
        // store); attr is fully initialised and read (and updated) during the call.
        if unsafe { rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) } != 0 {
            let failed = RdmaError::last("rdma_create_qp", || {
                format!(
                    "{} send / {} receive work requests",
                    caps.max_send_wr, caps.max_recv_wr
                )
            });
            id.release_qp();
            return Err(failed);
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is the new QP.
        let raw = unsafe { (*id.as_ptr()).qp };
        let Some(raw) = NonNull::new(raw) else {
            id.release_qp();
            return Err(RdmaError::verb("rdma_create_qp", "no QP on the id", 0));
        };
        Ok(QueuePair {
            raw,
            caps: QpCaps {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_inline_data: attr.cap.max_inline_data,
            },
            id: id.clone(),
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _regions: PhantomData,
        })
    }

    /// The queue sizes the provider granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Set how long a sender must wait before retrying when this (receiving) side had no
    /// receive posted (IB encoding: 1 = 0.01 ms ... 12 = 0.64 ms ... 0 = 655 ms).
    ///
    /// The RDMA CM leaves it at 0, the longest delay: one "receiver not ready" then costs
    /// 0.65 s. Call on a connected (RTS) QP; it is an RTS-to-RTS modification.
    pub fn set_min_rnr_timer(&self, value: u8) -> Result<(), RdmaError> {
        // SAFETY: ibv_qp_attr is plain data; all-zero is valid, only the masked field is read.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.min_rnr_timer = value;
        let mask = ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as libc::c_int;
        // SAFETY: valid QP; attr is initialised and read during the call.
        let ret = unsafe { ibv_modify_qp(self.raw.as_ptr(), &mut attr, mask) };
        if ret != 0 {
            return Err(RdmaError::verb("ibv_modify_qp", "min_rnr_timer", ret));
        }
        Ok(())
    }

    /// Post one send-queue work request.
    ///
    /// # Safety
    /// The memory `wr.sge` names (inside a live region, which the SGE's lifetime
    /// guarantees) must not be written by anyone until the request's completion (or a
    /// later signaled completion) has been polled, or the QP is destroyed: the NIC reads
    /// it at a time of its choosing. `remote_addr`/`rkey` of an RDMA WRITE can only
    /// reach memory the peer registered for remote write, so they carry no contract here.
    pub unsafe fn post_send(&self, wr: &SendWr<'r>) -> Result<(), RdmaError> {
        // SAFETY: the caller's contract is post_send_list's.
        unsafe { self.post_send_list(std::slice::from_ref(wr)) }
    }

    /// Post several send-queue work requests as one chained list: the provider queues them
    /// all and rings the doorbell once (for Soft-RoCE, one system call instead of one per
    /// request; the kernel then processes them in one go). In order; lists longer than
    /// [`POST_LIST_MAX`] go in several calls.
    ///
    /// # Safety
    /// As for [`post_send`](Self::post_send), for every request.
    pub unsafe fn post_send_list(&self, wrs: &[SendWr<'r>]) -> Result<(), RdmaError> {
        // SAFETY: the QP's context is valid while self lives; `ops` is the provider's table.
        let post = unsafe { (*(*self.raw.as_ptr()).context).ops.post_send }.ok_or(
            RdmaError::Unsupported {
                what: "ibv_post_send",
            },
        )?;
        for batch in wrs.chunks(POST_LIST_MAX) {
            // SAFETY: ibv_sge and ibv_send_wr are plain data (pointers and integers);
            // all-zero is a valid value of both.
            let mut sges: [ibv_sge; POST_LIST_MAX] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut raws: [ibv_send_wr; POST_LIST_MAX] = unsafe { std::mem::zeroed() };
            for (i, wr) in batch.iter().enumerate() {
                sges[i] = wr.sge.raw();
                self.fill_send_wr(wr, &mut raws[i])?;
            }
            // Link the list only now that neither array moves any more.
            let sge_base = sges.as_mut_ptr();
            let raw_base = raws.as_mut_ptr();
            for i in 0..batch.len() {
                // SAFETY: i and i + 1 are within the arrays (i + 1 only when < len).
                unsafe {
                    (*raw_base.add(i)).sg_list = sge_base.add(i);
                    (*raw_base.add(i)).num_sge = 1;
                    (*raw_base.add(i)).next = if i + 1 < batch.len() {
                        raw_base.add(i + 1)
                    } else {
                        std::ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            // SAFETY: valid QP; the chained requests and their SGEs live across the call
            // (the provider copies them into the queue); the memory contract is the
            // caller's (see above).
            let ret = unsafe { post(self.raw.as_ptr(), raw_base, &mut bad) };
            if ret != 0 {
                // Which request failed: `bad` points into `raws` (or is null).
                let index = if bad.is_null() {
                    0
                } else {
                    // SAFETY: the provider sets `bad` to one of the requests we passed.
                    (unsafe { bad.offset_from(raw_base) }).clamp(0, batch.len() as isize - 1)
                        as usize
                };
                return Err(RdmaError::verb(
                    "ibv_post_send",
                    batch[index].op.name(),
                    ret,
                ));
            }
        }
        Ok(())
    }

    /// Post a signaled SEND of `data` inline (`IBV_SEND_INLINE`): the provider copies the
    /// bytes into the send queue before it returns, so the NIC never reads `data` later,
    /// no region is named, and nothing outlives this call: safe, unlike
    /// [`post_send`](Self::post_send). At most the QP's `max_inline_data` bytes.
    pub fn post_send_inline(&self, wr_id: u64, data: &[u8]) -> Result<(), RdmaError> {
        if data.len() > self.caps.max_inline_data as usize {
            return Err(RdmaError::InvalidArgument(format!(
                "{} bytes inline exceed the queue pair's {}",
                data.len(),
                self.caps.max_inline_data
            )));
        }
        // SAFETY: the QP's context is valid while self lives; `ops` is the provider's table.
        let post = unsafe { (*(*self.raw.as_ptr()).context).ops.post_send }.ok_or(
            RdmaError::Unsupported {
                what: "ibv_post_send",
            },
        )?;
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        // SAFETY: ibv_send_wr is plain data (pointers and integers); all-zero is valid.
        let mut raw: ibv_send_wr = unsafe { std::mem::zeroed() };
        raw.wr_id = wr_id;
        raw.opcode = ibv_wr_opcode::IBV_WR_SEND;
        raw.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0 | ibv_send_flags::IBV_SEND_INLINE.0;
        raw.sg_list = &mut sge;
        raw.num_sge = 1;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `raw` and `sge` live across the call; with IBV_SEND_INLINE the
        // provider copies `data` (no longer than max_inline_data, checked) during the call
        // and ignores the lkey, so nothing is read after it returns.
        let ret = unsafe { post(self.raw.as_ptr(), &mut raw, &mut bad) };
        if ret != 0 {
            return Err(RdmaError::verb("ibv_post_send", "SEND (inline)", ret));
        }
        Ok(())
    }

    /// Everything of one request but its links (SGE list and next).
    fn fill_send_wr(&self, wr: &SendWr, raw: &mut ibv_send_wr) -> Result<(), RdmaError> {
        raw.wr_id = wr.wr_id;
        raw.send_flags = 0;
        if wr.signaled {
            raw.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if wr.inline {
            if wr.sge.len() > self.caps.max_inline_data {
                return Err(RdmaError::InvalidArgument(format!(
                    "{} bytes inline exceed the queue pair's {}",
                    wr.sge.len(),
                    self.caps.max_inline_data
                )));
            }
            raw.send_flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if wr.solicited {
            raw.send_flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        match wr.op {
            SendOp::Send => raw.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::SendWithImm(imm) => {
                raw.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::Write { remote_addr, rkey } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                raw.wr.rdma = rdma_t { remote_addr, rkey };
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                raw.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                raw.wr.rdma = rdma_t { remote_addr, rkey };
                raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
        }
        Ok(())
    }

    /// Post one receive: the next incoming SEND lands in `sge` (none: a receive that only
    /// takes the immediate data of an RDMA WRITE with immediate, or a zero-byte SEND).
    ///
    /// # Safety
    /// Nobody may read or write the memory `sge` names until the receive's completion
    /// has been polled or the QP is destroyed: the NIC writes it at a time of its
    /// choosing. (Every region is registered with local write.)
    pub unsafe fn post_recv(&self, wr_id: u64, sge: Option<Sge<'r>>) -> Result<(), RdmaError> {
        let mut raw_sge = sge.map(|s| s.raw());
        let mut raw = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: raw_sge
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s as *mut ibv_sge),
            num_sge: i32::from(raw_sge.is_some()),
        };
        // SAFETY: as in post_send.
        let post = unsafe { (*(*self.raw.as_ptr()).context).ops.post_recv }.ok_or(
            RdmaError::Unsupported {
                what: "ibv_post_recv",
            },
        )?;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `raw` and its SGE live across the call; memory contract is
        // the caller's.
        let ret = unsafe { post(self.raw.as_ptr(), &mut raw, &mut bad) };
        if ret != 0 {
            return Err(RdmaError::verb("ibv_post_recv", "", ret));
        }
        Ok(())
    }
}

impl Drop for QueuePair<'_> {
    fn drop(&mut self) {
        // SAFETY: the QP was created on this id and is destroyed once, before the id
        // (which we keep alive), the PD and the CQs (kept alive by our Rcs).
        unsafe { rdma_destroy_qp(self.id.as_ptr()) };
        self.id.release_qp();
    }
}
