//! One verbs connection: its RC queue pair over the CM id's PD and CQ, the registered
//! slots its control messages pass through (receives and sends), and waiting on its
//! completions and CM and device events together.

use crate::rdma::{
    CmEvent, CmEventKind, CmId, Completion, CompletionChannel, CompletionQueue, Deadline,
    DeviceEvents, MessageBuffer, ProtectionDomain, QpCaps, QueuePair, RdmaError, SendOp, SendWr,
    Sge, Wake,
};
use std::cell::{Cell, OnceCell};
use std::rc::Rc;
use std::time::Duration;

/// `wr_id` layout: a tag in the top byte, a sequence number or slot below.
pub(crate) const TAG_SHIFT: u32 = 56;
pub(crate) const INDEX_MASK: u64 = (1 << TAG_SHIFT) - 1;
/// An item (a chunk or piece) of a pass: its sequence number on the rail (sender), or its
/// receive's (receiver, send mode).
pub(crate) const TAG_ITEM: u64 = 1 << TAG_SHIFT;
/// A receive of a control slot (index: the slot).
pub(crate) const TAG_SLOT: u64 = 2 << TAG_SHIFT;
/// A SEND of a control message's fragment (index: the send slot).
pub(crate) const TAG_FRAGMENT: u64 = 3 << TAG_SHIFT;
/// The raw mode's message and reply.
pub(crate) const TAG_RAW: u64 = 4 << TAG_SHIFT;

/// The tag of a `wr_id`.
pub(crate) fn tag(wr_id: u64) -> u64 {
    wr_id & !INDEX_MASK
}

/// Bytes of one control slot: a fragment of a control message ([`super::messages`]).
pub const SLOT: usize = 1024;

/// How long a side waits for the other's DISCONNECTED at the end, at most.
pub(crate) const DISCONNECT_GRACE: Duration = Duration::from_secs(2);

/// What a connection's memory is registered on before its queue pair exists: the PD,
/// and the CQ (with a completion channel unless busy-polling) the queue pair will use.
pub struct Resources {
    pub pd: Rc<ProtectionDomain>,
    pub cq: Rc<CompletionQueue>,
    pub id: Rc<CmId>,
}

impl Resources {
    /// PD and a CQ of at least `cq_entries` entries on `id`'s device.
    pub fn new(id: &Rc<CmId>, cq_entries: u32, busy_poll: bool) -> Result<Resources, RdmaError> {
        let pd = ProtectionDomain::new(id)?;
        let channel = if busy_poll {
            None
        } else {
            Some(CompletionChannel::new(id)?)
        };
        let cq = CompletionQueue::new(id, cq_entries, channel.as_ref())?;
        Ok(Resources {
            pd,
            cq,
            id: id.clone(),
        })
    }

    /// CQ entries for a queue pair of these sizes (every request may complete at once).
    pub fn cq_entries(caps: QpCaps) -> u32 {
        caps.max_send_wr
            .saturating_add(caps.max_recv_wr)
            .saturating_add(2)
    }
}

/// The longest [`Connection::quiesce`] waits for the flushed completion of a queue pair's
/// last request.
const QUIESCE_WAIT: Duration = Duration::from_secs(2);

/// The RC queue pair of a connection over [`Resources`], for data regions that live
/// `'r`, and its slots: receive slots (of [`SLOT`] bytes for control messages, or of a
/// chunk's size where chunks land in them to be copied into place), and send slots its
/// control messages go from. The slots are this value's own, and the queue pair
/// (declared first) is destroyed before them.
pub struct Connection<'r> {
    pub qp: QueuePair<'r>,
    recv_slots: MessageBuffer,
    recv_slot_len: usize,
    send_slots: MessageBuffer,
    /// Slots the sender copies items into before they go (a repair round's copies, a
    /// chunk with a fault injected): made on first use, `(buffer, slot length)`.
    bounce: OnceCell<(MessageBuffer, usize)>,
    pub cq: Rc<CompletionQueue>,
    pub id: Rc<CmId>,
    pub pd: Rc<ProtectionDomain>,
    disconnected: Cell<bool>,
    /// The device's port and device events, where a context could be opened for them.
    events: Option<DeviceEvents>,
}

/// Why [`Connection::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Completions were appended.
    Completions,
    /// The peer disconnected (or the connection broke).
    Disconnected,
}

impl<'r> Connection<'r> {
    /// An RC queue pair on `res`'s id, PD and CQ, with `recv_slots` receive slots of
    /// `recv_slot_len` bytes (at least [`SLOT`]) and `send_slots` send slots of [`SLOT`]
    /// bytes, registered on its PD.
    pub fn new(
        res: &Resources,
        caps: QpCaps,
        (recv_slots, recv_slot_len): (usize, usize),
        send_slots: usize,
    ) -> Result<Connection<'r>, RdmaError> {
        let recv_slot_len = recv_slot_len.max(SLOT);
        let recv = MessageBuffer::new(&res.pd, recv_slots.max(1) * recv_slot_len)?;
        let send = MessageBuffer::new(&res.pd, send_slots.max(1) * SLOT)?;
        let qp = QueuePair::new(&res.id, &res.pd, &res.cq, &res.cq, caps)?;
        let events = match (res.id.device_name(), res.id.port_info()) {
            (Some(device), Ok(port)) => DeviceEvents::open(&device, port.port_num).ok(),
            _ => None,
        };
        Ok(Connection {
            qp,
            recv_slots: recv,
            recv_slot_len,
            send_slots: send,
            bounce: OnceCell::new(),
            cq: res.cq.clone(),
            id: res.id.clone(),
            pd: res.pd.clone(),
            disconnected: Cell::new(false),
            events,
        })
    }

    /// Receive slots and their length; send slots.
    pub fn slots(&self) -> (usize, usize, usize) {
        (
            self.recv_slots.len() / self.recv_slot_len,
            self.recv_slot_len,
            self.send_slots.len() / SLOT,
        )
    }

    /// An SGE of this connection's own slot buffer `buf` (slots of `slot_len` bytes).
    fn slot_sge(
        buf: &MessageBuffer,
        slot_len: usize,
        slot: usize,
        len: usize,
    ) -> Result<Sge<'r>, RdmaError> {
        let at = slot * slot_len;
        let sge = buf.sge_at(at..at + len.min(slot_len))?;
        // SAFETY: the SGE names memory of `buf`, a slot buffer this connection owns: it is
        // declared after the queue pair, so it is deregistered and freed only after the
        // queue pair is destroyed, and its heap memory does not move with the value. So
        // the SGE stays valid for as long as the queue pair may use it, which is all that
        // `'r` promises the queue pair (QueuePair's invariant).
        Ok(unsafe { std::mem::transmute::<Sge<'_>, Sge<'r>>(sge) })
    }

    /// Post a receive into receive slot `slot`, tagged `wr_id`.
    ///
    /// # Safety
    /// The slot is not read ([`read_slot`](Self::read_slot)) until this receive's
    /// completion has been polled: the NIC writes it at a time of its choosing.
    pub unsafe fn post_slot_recv(&self, wr_id: u64, slot: usize) -> Result<(), RdmaError> {
        let len = self.recv_slot_len;
        let sge = Self::slot_sge(&self.recv_slots, len, slot, len)?;
        // SAFETY: the caller's contract for the slot; the SGE is the connection's own.
        unsafe { self.qp.post_recv(wr_id, Some(sge)) }
    }

    /// The first `len` bytes of receive slot `slot` (after its receive completed).
    pub fn read_slot(&self, slot: usize, len: usize) -> Vec<u8> {
        let slot_len = self.recv_slot_len;
        self.recv_slots.read_at(slot * slot_len, len.min(slot_len))
    }

    /// SEND `bytes` (at most a slot) from send slot `slot`, signaled, tagged `wr_id`.
    ///
    /// # Safety
    /// Send slot `slot` is not rewritten until this request's completion has been
    /// polled: the NIC reads it at a time of its choosing.
    pub unsafe fn send_slot(&self, wr_id: u64, slot: usize, bytes: &[u8]) -> Result<(), RdmaError> {
        if bytes.len() > SLOT {
            return Err(RdmaError::InvalidArgument(format!(
                "{} bytes do not fit a {SLOT}-byte control slot",
                bytes.len()
            )));
        }
        self.send_slots.write_at(slot * SLOT, bytes)?;
        let sge = Self::slot_sge(&self.send_slots, SLOT, slot, bytes.len())?;
        // SAFETY: the bytes were copied into the connection's own slot, which the caller
        // leaves alone until the completion.
        unsafe {
            self.qp.post_send(&SendWr {
                wr_id,
                sge,
                op: SendOp::Send,
                signaled: true,
                inline: false,
                solicited: true,
            })
        }
    }

    /// Copy `bytes` into bounce slot `slot` (of `slots` slots of `slot_len` bytes, made
    /// on first use) and return its SGE, to be posted on this queue pair.
    ///
    /// # Safety
    /// No request posted on bounce slot `slot` is outstanding (its completion, or a later
    /// one that covers it, has been polled): the NIC may still be reading it.
    pub unsafe fn bounce_sge(
        &self,
        (slots, slot_len): (usize, usize),
        slot: usize,
        bytes: &[u8],
    ) -> Result<Sge<'r>, RdmaError> {
        let (buf, len) = match self.bounce.get() {
            Some(b) => b,
            None => {
                let buf = MessageBuffer::new(&self.pd, slots.max(1) * slot_len.max(1))?;
                self.bounce.get_or_init(|| (buf, slot_len.max(1)))
            }
        };
        if bytes.len() > *len || slot >= buf.len() / *len {
            return Err(RdmaError::InvalidArgument(format!(
                "{} bytes into bounce slot {slot} of {} bytes",
                bytes.len(),
                len
            )));
        }
        buf.write_at(slot * len, bytes)?;
        Self::slot_sge(buf, *len, slot, bytes.len())
    }

    /// The SGE of the first `len` bytes of bounce slot `slot` as they stand (written by
    /// an earlier [`bounce_sge`](Self::bounce_sge) and left alone since): the test-only
    /// lies post the same bytes many times.
    pub fn bounce_slot(&self, slot: usize, len: usize) -> Result<Sge<'r>, RdmaError> {
        match self.bounce.get() {
            Some((buf, slot_len)) if len <= *slot_len && slot < buf.len() / *slot_len => {
                Self::slot_sge(buf, *slot_len, slot, len)
            }
            _ => Err(RdmaError::InvalidArgument(format!(
                "{len} bytes of bounce slot {slot}: there is no such slot"
            ))),
        }
    }

    /// Make the NIC stop reading the memory this queue pair's requests name (a pass that
    /// ended early): the queue pair goes to the error state (`rdma_disconnect`), where no
    /// queued request runs any more and each completes as flushed, in order; then the
    /// completion queue is polled until the completion of request `last` (the last one
    /// posted), for at most `QUIESCE_WAIT`. A request that had already run unsignaled
    /// completes no more, so the wait for it can last that long; the queue pair reads
    /// nothing either way. Completions taken meanwhile are appended to `seen`.
    pub fn quiesce(&self, last: u64, seen: &mut Vec<Completion>) {
        let deadline = Deadline::after(QUIESCE_WAIT);
        let _ = self.id.disconnect();
        loop {
            let from = seen.len();
            if self.cq.poll(seen).is_err() || seen[from..].iter().any(|c| c.wr_id == last) {
                return;
            }
            if deadline.expired() {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Wait for completions (appended to `out`) or the peer's disconnect, until
    /// `deadline`. Other CM events of the connection are taken and ignored.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        deadline: &Deadline,
        waiting_for: &str,
    ) -> Result<Waited, RdmaError> {
        let channel = self.id.channel().clone();
        loop {
            let mut watch = Vec::with_capacity(2);
            if !self.disconnected.get() {
                watch.push(channel.fd());
            }
            watch.extend(self.events.as_ref().map(DeviceEvents::fd));
            match self.cq.wait(out, deadline, &watch, waiting_for)? {
                Wake::Completions(_) => return Ok(Waited::Completions),
                Wake::Watched => {
                    if let Some(fault) = self.device_fault()? {
                        return Err(RdmaError::DeviceFault(fault));
                    }
                    while let Some(event) = channel.try_get_event()? {
                        if self.note_event(&event)? {
                            return Ok(Waited::Disconnected);
                        }
                    }
                    if deadline.expired() {
                        return Err(deadline.timeout_error(waiting_for));
                    }
                }
            }
        }
    }

    /// Without waiting: a port or device failure the device reported (as
    /// `RdmaError::DeviceFault`), or whether the peer disconnected. For links of several
    /// rails, which poll their connections in turn instead of sleeping on one.
    pub fn poll_events(&self) -> Result<bool, RdmaError> {
        if let Some(fault) = self.device_fault()? {
            return Err(RdmaError::DeviceFault(fault));
        }
        if self.disconnected.get() {
            return Ok(true);
        }
        while let Some(event) = self.id.channel().try_get_event()? {
            if self.note_event(&event)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A port or device failure the device reports within `grace` (a failed work
    /// request can overtake the event that explains it): the better reason to give.
    pub fn device_fault_within(&self, grace: Duration) -> Option<String> {
        let events = self.events.as_ref()?;
        let deadline = Deadline::after(grace);
        loop {
            if let Ok(Some(fault)) = events.take_fault() {
                return Some(fault);
            }
            if deadline.expired() {
                return None;
            }
            crate::rdma::wait_readable(&[events.fd()], &deadline, None).ok()?;
        }
    }

    /// A port or device failure the device reported, if one came.
    fn device_fault(&self) -> Result<Option<String>, RdmaError> {
        match &self.events {
            Some(events) => events.take_fault(),
            None => Ok(None),
        }
    }

    /// Record a CM event seen while waiting; true if it ends the connection.
    fn note_event(&self, event: &CmEvent) -> Result<bool, RdmaError> {
        match event.kind() {
            CmEventKind::Disconnected => {
                self.disconnected.set(true);
                Ok(true)
            }
            CmEventKind::DeviceRemoval => Err(RdmaError::UnexpectedEvent {
                expected: "the transfer to go on",
                got: event.name(),
                status: event.status(),
            }),
            _ => Ok(false),
        }
    }

    /// Wait for the peer's DISCONNECTED (up to `grace`), disconnecting ourselves first
    /// if `initiate`. Errors are ignored: the connection is being torn down anyway.
    pub fn close(&self, initiate: bool, grace: Duration) {
        if self.disconnected.get() {
            return;
        }
        if initiate {
            let _ = self.id.disconnect();
        }
        let deadline = Deadline::after(grace);
        while let Ok(event) = self
            .id
            .channel()
            .get_event(&deadline, "RDMA_CM_EVENT_DISCONNECTED")
        {
            if event.kind() == CmEventKind::Disconnected {
                self.disconnected.set(true);
                return;
            }
        }
        if !initiate {
            let _ = self.id.disconnect();
        }
    }
}

/// Wait on `id`'s channel for the next CM event; the caller matches its kind.
pub(crate) fn next_event<'a>(
    id: &'a CmId,
    deadline: &Deadline,
    waiting_for: &str,
) -> Result<CmEvent<'a>, RdmaError> {
    id.channel().get_event(deadline, waiting_for)
}
