//! `ibv_cq` and its `ibv_comp_channel`: where work requests report their completion.

use super::{c_str, set_nonblocking, wait_readable, CmId, Deadline, RdmaError};
use rdma_sys::*;
use std::cell::Cell;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

/// Completions taken off the queue per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

/// A completion channel: a file descriptor that becomes readable when an armed CQ gets a
/// completion. Non-blocking; waited on with `poll(2)`.
pub struct CompletionChannel {
    raw: NonNull<ibv_comp_channel>,
    _id: Rc<CmId>,
}

impl CompletionChannel {
    pub fn new(id: &Rc<CmId>) -> Result<Rc<Self>, RdmaError> {
        let verbs = id.verbs()?;
        // SAFETY: a valid device context kept alive by `id`.
        let raw = unsafe { ibv_create_comp_channel(verbs.as_ptr()) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(RdmaError::last("ibv_create_comp_channel", || {
                id.device_name().unwrap_or_default()
            }));
        };
        let channel = Rc::new(CompletionChannel {
            raw,
            _id: id.clone(),
        });
        set_nonblocking(channel.fd(), "completion channel")?;
        Ok(channel)
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel; fd is a plain field.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ using the channel holds an Rc to it, so none is left.
        unsafe { ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// One work completion, copied out of `ibv_wc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    /// The immediate data (host byte order), for `*_WITH_IMM` operations.
    pub imm: Option<u32>,
    pub vendor_err: u32,
}

impl Completion {
    pub fn is_ok(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_SUCCESS
    }

    /// `Ok` for a successful completion, else an error naming `what` the request was and
    /// the status in words (`ibv_wc_status_str`).
    pub fn check(&self, what: impl FnOnce() -> String) -> Result<(), RdmaError> {
        if self.is_ok() {
            return Ok(());
        }
        Err(RdmaError::Completion {
            what: what(),
            status: self.status,
            status_str: status_str(self.status),
            opcode: opcode_name(self.opcode).to_string(),
            wr_id: self.wr_id,
            vendor_err: self.vendor_err,
        })
    }

    /// A receive consumed by an RDMA WRITE with immediate (no data landed in its buffer).
    pub fn is_write_with_imm(&self) -> bool {
        self.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    }

    /// The responder refused the request: for a SEND, typically a posted receive smaller
    /// than the message.
    pub fn is_remote_invalid_request(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
    }

    /// The responder failed the request (Soft-RoCE reports a too-small receive so).
    pub fn is_remote_operation_error(&self) -> bool {
        self.status == ibv_wc_status::IBV_WC_REM_OP_ERR
    }

    /// The status in words.
    pub fn status_str(&self) -> String {
        status_str(self.status)
    }

    /// Whether the status says the connection is gone (flushed after the QP went to the
    /// error state, or retries exhausted), rather than a local mistake.
    pub fn is_connection_loss(&self) -> bool {
        use ibv_wc_status::*;
        matches!(
            self.status,
            IBV_WC_WR_FLUSH_ERR | IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR
        )
    }
}

/// `ibv_wc_status_str`: "Work Request Flushed Error", "transport retry counter exceeded".
pub fn status_str(status: u32) -> String {
    // SAFETY: returns a static string for any value.
    c_str(unsafe { ibv_wc_status_str(status) }, "unknown status")
}

pub fn opcode_name(opcode: u32) -> &'static str {
    use ibv_wc_opcode::*;
    match opcode {
        IBV_WC_SEND => "SEND",
        IBV_WC_RDMA_WRITE => "RDMA_WRITE",
        IBV_WC_RDMA_READ => "RDMA_READ",
        IBV_WC_RECV => "RECV",
        IBV_WC_RECV_RDMA_WITH_IMM => "RECV_RDMA_WITH_IMM",
        _ => "other",
    }
}

/// Why [`CompletionQueue::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// This many completions were appended to the output.
    Completions(usize),
    /// One of the extra descriptors the caller asked to watch became readable.
    Watched,
}

/// A completion queue, either event-driven (with a [`CompletionChannel`]) or busy-polled.
pub struct CompletionQueue {
    raw: NonNull<ibv_cq>,
    channel: Option<Rc<CompletionChannel>>,
    _id: Rc<CmId>,
    armed: Cell<bool>,
    /// Arm for solicited completions only (and failed ones), see
    /// [`set_solicited_only`](Self::set_solicited_only).
    solicited_only: Cell<bool>,
}

impl CompletionQueue {
    /// A CQ of at least `entries` entries. With `channel`, [`wait`](Self::wait) sleeps in
    /// `poll(2)`; without, it spins on `ibv_poll_cq` (busy-poll mode).
    pub fn new(
        id: &Rc<CmId>,
        entries: u32,
        channel: Option<&Rc<CompletionChannel>>,
    ) -> Result<Rc<Self>, RdmaError> {
        let verbs = id.verbs()?;
        let channel_ptr = channel.map_or(std::ptr::null_mut(), |c| c.raw.as_ptr());
        let cqe = entries.clamp(1, i32::MAX as u32) as i32;
        // SAFETY: valid context (kept alive by id) and channel (kept alive by the Rc we
        // store); no CQ context pointer; completion vector 0.
        let raw =
            unsafe { ibv_create_cq(verbs.as_ptr(), cqe, std::ptr::null_mut(), channel_ptr, 0) };
        match NonNull::new(raw) {
            Some(raw) => Ok(Rc::new(CompletionQueue {
                raw,
                channel: channel.cloned(),
                _id: id.clone(),
                armed: Cell::new(false),
                solicited_only: Cell::new(false),
            })),
            None => Err(RdmaError::last("ibv_create_cq", || {
                format!("{cqe} entries")
            })),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.raw.as_ptr()
    }

    /// Take the completions that are there now (up to a batch) and append them to `out`.
    pub fn poll(&self, out: &mut Vec<Completion>) -> Result<usize, RdmaError> {
        // SAFETY: ibv_wc is plain data; all-zero is a valid value to be overwritten.
        let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: the CQ and its context are valid while self lives; `ops` is a plain
        // function table filled by the provider.
        let poll_cq = unsafe { (*(*self.raw.as_ptr()).context).ops.poll_cq }.ok_or(
            RdmaError::Unsupported {
                what: "ibv_poll_cq",
            },
        )?;
        // SAFETY: valid CQ; `wcs` has room for POLL_BATCH entries.
        let n = unsafe { poll_cq(self.raw.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(RdmaError::verb("ibv_poll_cq", "", -n));
        }
        let n = n as usize;
        for wc in &wcs[..n] {
            let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            out.push(Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                // SAFETY: with IBV_WC_WITH_IMM set, the union holds the immediate data
                // (network byte order); both members are plain u32s anyway.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
                vendor_err: wc.vendor_err,
            });
        }
        Ok(n)
    }

    /// Wait until at least one completion is there (appended to `out`), one of `watch`
    /// becomes readable, or `deadline` passes (a timeout error naming `waiting_for`).
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        deadline: &Deadline,
        watch: &[RawFd],
        waiting_for: &str,
    ) -> Result<Wake, RdmaError> {
        match &self.channel {
            Some(channel) => self.wait_events(channel, out, deadline, watch, waiting_for),
            None => self.wait_busy(out, deadline, watch, waiting_for),
        }
    }

    /// From now on, let only solicited completions (requests the peer sent with the
    /// solicited-event flag) and failed ones wake [`wait`](Self::wait) up; `false`: every
    /// completion (the default). Completions that are there are still taken by every poll;
    /// this only spares wake-ups (and, on Soft-RoCE, the sender's CPU the notification).
    pub fn set_solicited_only(&self, on: bool) {
        if self.solicited_only.replace(on) != on {
            // Armed the other way: arm again before the next sleep.
            self.armed.set(false);
        }
    }

    fn arm(&self) -> Result<(), RdmaError> {
        if self.armed.get() {
            return Ok(());
        }
        // SAFETY: as in poll.
        let req_notify = unsafe { (*(*self.raw.as_ptr()).context).ops.req_notify_cq }.ok_or(
            RdmaError::Unsupported {
                what: "ibv_req_notify_cq",
            },
        )?;
        // SAFETY: valid CQ with a completion channel; 0 = notify on any completion, 1 = on
        // a solicited (or failed) one.
        let ret = unsafe {
            req_notify(
                self.raw.as_ptr(),
                libc::c_int::from(self.solicited_only.get()),
            )
        };
        if ret != 0 {
            return Err(RdmaError::verb("ibv_req_notify_cq", "", ret));
        }
        self.armed.set(true);
        Ok(())
    }

    fn wait_events(
        &self,
        channel: &CompletionChannel,
        out: &mut Vec<Completion>,
        deadline: &Deadline,
        watch: &[RawFd],
        waiting_for: &str,
    ) -> Result<Wake, RdmaError> {
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(Wake::Completions(n));
            }
            if !self.armed.get() {
                self.arm()?;
                // A completion may have arrived between the poll and the arming.
                let n = self.poll(out)?;
                if n > 0 {
                    return Ok(Wake::Completions(n));
                }
            }
            if deadline.expired() {
                return Err(deadline.timeout_error(waiting_for));
            }
            let mut fds = vec![channel.fd()];
            fds.extend_from_slice(watch);
            let ready = wait_readable(&fds, deadline, None)?;
            if ready & 1 != 0 {
                self.take_event(channel)?;
            }
            if ready & !1 != 0 {
                return Ok(Wake::Watched);
            }
        }
    }

    /// Read one notification off the channel (if there) and acknowledge it.
    fn take_event(&self, channel: &CompletionChannel) -> Result<(), RdmaError> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointers; the descriptor is non-blocking.
        let ret = unsafe { ibv_get_cq_event(channel.raw.as_ptr(), &mut cq, &mut ctx) };
        if ret != 0 {
            let errno = super::last_errno();
            if errno == libc::EAGAIN || errno == libc::EINTR {
                return Ok(());
            }
            return Err(RdmaError::verb("ibv_get_cq_event", "", errno));
        }
        // The channel serves only this CQ, so `cq` is self. Ack right away: the count of
        // unacked events would otherwise make ibv_destroy_cq wait forever.
        // SAFETY: one event of this CQ was taken.
        unsafe { ibv_ack_cq_events(cq, 1) };
        self.armed.set(false);
        Ok(())
    }

    fn wait_busy(
        &self,
        out: &mut Vec<Completion>,
        deadline: &Deadline,
        watch: &[RawFd],
        waiting_for: &str,
    ) -> Result<Wake, RdmaError> {
        let mut spins = 0u32;
        loop {
            let n = self.poll(out)?;
            if n > 0 {
                return Ok(Wake::Completions(n));
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                if deadline.expired() {
                    return Err(deadline.timeout_error(waiting_for));
                }
                if !watch.is_empty() {
                    let now = Deadline::after(Duration::ZERO);
                    if wait_readable(watch, &now, None)? != 0 {
                        return Ok(Wake::Watched);
                    }
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Rc to it, so none is left; every event
        // taken from the channel was acked in take_event.
        unsafe { ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_completions_name_the_request_and_the_status_in_words() {
        let c = Completion {
            wr_id: 7,
            status: ibv_wc_status::IBV_WC_REM_INV_REQ_ERR,
            opcode: ibv_wc_opcode::IBV_WC_SEND,
            byte_len: 0,
            imm: None,
            vendor_err: 0,
        };
        let e = c.check(|| "SEND of the whole buffer".into()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("SEND of the whole buffer failed: remote invalid request error"),
            "{text}"
        );
        assert!(!c.is_connection_loss());
        let ok = Completion {
            status: ibv_wc_status::IBV_WC_SUCCESS,
            ..c
        };
        assert!(ok.check(|| unreachable!()).is_ok());
    }
}
