//! What sender and receiver share: the objects of one connection, and waiting on its
//! completions and CM events together.

use crate::rdma::{
    CmEvent, CmEventKind, CmId, Completion, CompletionChannel, CompletionQueue, Deadline,
    DeviceEvents, ProtectionDomain, QpCaps, QueuePair, RdmaError, Wake,
};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// `wr_id` layout: a tag in the top byte, the chunk index below.
pub(crate) const TAG_SHIFT: u32 = 56;
pub(crate) const INDEX_MASK: u64 = (1 << TAG_SHIFT) - 1;
pub(crate) const TAG_DATA: u64 = 1 << TAG_SHIFT;
pub(crate) const WR_ACK: u64 = 2 << TAG_SHIFT;
pub(crate) const WR_REPLY: u64 = 3 << TAG_SHIFT;
/// Control messages after the data: the sender's chunk checksums, the receiver's resend
/// requests (index: the message's number).
pub(crate) const WR_CTRL: u64 = 4 << TAG_SHIFT;
/// The receiver's receives for chunks sent again in send mode (index: the chunk).
pub(crate) const TAG_RESEND: u64 = 5 << TAG_SHIFT;
/// The receiver's receive for the sender's name message (`--name`), before the data.
pub(crate) const TAG_NAME: u64 = 6 << TAG_SHIFT;

/// The tag of a `wr_id`.
pub(crate) fn tag(wr_id: u64) -> u64 {
    wr_id & !INDEX_MASK
}

pub(crate) fn is_data(wr_id: u64) -> bool {
    wr_id & !INDEX_MASK == TAG_DATA
}

/// How long a side waits for the other's DISCONNECTED at the end, at most.
pub(crate) const DISCONNECT_GRACE: Duration = Duration::from_secs(2);

/// What a connection's memory is registered on before its queue pair exists: the PD,
/// and the CQ (with a completion channel unless busy-polling) the queue pair will use.
pub(crate) struct Resources {
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

/// The RC queue pair of a connection, over [`Resources`], for regions that live `'r`.
/// Declare it after the regions it uses: it must be dropped (destroyed) first, and the
/// borrow checker insists on it.
/// The longest [`Connection::quiesce`] waits for the flushed completion of a queue pair's
/// last request.
const QUIESCE_WAIT: Duration = Duration::from_secs(2);

pub(crate) struct Connection<'r> {
    pub qp: QueuePair<'r>,
    pub cq: Rc<CompletionQueue>,
    pub id: Rc<CmId>,
    disconnected: Cell<bool>,
    /// The device's port and device events, where a context could be opened for them.
    events: Option<DeviceEvents>,
}

/// Why [`Connection::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// Completions were appended.
    Completions,
    /// The peer disconnected (or the connection broke).
    Disconnected,
}

impl<'r> Connection<'r> {
    /// An RC queue pair on `res`'s id, PD and CQ.
    pub fn new(res: &Resources, caps: QpCaps) -> Result<Connection<'r>, RdmaError> {
        let qp = QueuePair::new(&res.id, &res.pd, &res.cq, &res.cq, caps)?;
        // Without its own context the connection still learns of a dead port, later,
        // from its work requests' errors: not worth failing the transfer over.
        let events = match (res.id.device_name(), res.id.port_info()) {
            (Some(device), Ok(port)) => DeviceEvents::open(&device, port.port_num).ok(),
            _ => None,
        };
        Ok(Connection {
            qp,
            cq: res.cq.clone(),
            id: res.id.clone(),
            disconnected: Cell::new(false),
            events,
        })
    }

    pub fn is_disconnected(&self) -> bool {
        self.disconnected.get()
    }

    /// Make the NIC stop reading the memory this queue pair's requests name (a pass that
    /// ended early, [`ChunkWire::drain`](crate::transfer::schedule::ChunkWire::drain)):
    /// the queue pair goes to the error state (`rdma_disconnect`), where no queued
    /// request runs any more and each completes as flushed, in order; then the completion
    /// queue is polled until the completion of request `last` (the last one posted), for
    /// at most [`QUIESCE_WAIT`]. A request that had already run unsignaled completes no
    /// more, so the wait for it can last that long; the queue pair reads nothing either way.
    pub fn quiesce(&self, last: u64) {
        let deadline = Deadline::after(QUIESCE_WAIT);
        let _ = self.id.disconnect();
        let mut comps = Vec::new();
        loop {
            comps.clear();
            if self.cq.poll(&mut comps).is_err() || comps.iter().any(|c| c.wr_id == last) {
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
                    // Never spin past the deadline on a descriptor that keeps waking us.
                    if deadline.expired() {
                        return Err(deadline.timeout_error(waiting_for));
                    }
                }
            }
        }
    }

    /// Without waiting: a port or device failure the device reported (as
    /// `RdmaError::DeviceFault`), or whether the peer disconnected. For striped
    /// transfers, which poll several connections in turn instead of sleeping on one.
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
            // The peer did not disconnect in time: do it from here.
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
