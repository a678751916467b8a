//! What sender and receiver share: the objects of one connection, and waiting on its
//! completions and CM events together.

use crate::rdma::{
    CmEvent, CmEventKind, CmId, Completion, CompletionChannel, CompletionQueue, Deadline,
    ProtectionDomain, QpCaps, QueuePair, RdmaError, Wake,
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

pub(crate) fn is_data(wr_id: u64) -> bool {
    wr_id & !INDEX_MASK == TAG_DATA
}

/// How long a side waits for the other's DISCONNECTED at the end, at most.
pub(crate) const DISCONNECT_GRACE: Duration = Duration::from_secs(2);

/// The verbs objects of one connection. The QP is declared first so it is destroyed
/// first; the Rcs inside each object keep the rest in the right order anyway.
pub(crate) struct Connection {
    pub qp: QueuePair,
    pub cq: Rc<CompletionQueue>,
    pub pd: Rc<ProtectionDomain>,
    pub id: Rc<CmId>,
    disconnected: Cell<bool>,
}

/// Why [`Connection::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// Completions were appended.
    Completions,
    /// The peer disconnected (or the connection broke).
    Disconnected,
}

impl Connection {
    /// PD, CQ (with a completion channel unless `busy_poll`) and RC QP on `id`.
    pub fn new(id: &Rc<CmId>, caps: QpCaps, busy_poll: bool) -> Result<Connection, RdmaError> {
        let pd = ProtectionDomain::new(id)?;
        let channel = if busy_poll {
            None
        } else {
            Some(CompletionChannel::new(id)?)
        };
        let entries = caps.max_send_wr + caps.max_recv_wr + 2;
        let cq = CompletionQueue::new(id, entries, channel.as_ref())?;
        let qp = QueuePair::new(id, &pd, &cq, &cq, caps)?;
        Ok(Connection {
            qp,
            cq,
            pd,
            id: id.clone(),
            disconnected: Cell::new(false),
        })
    }

    pub fn is_disconnected(&self) -> bool {
        self.disconnected.get()
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
            let watch = (!self.disconnected.get()).then(|| channel.fd());
            match self.cq.wait(out, deadline, watch, waiting_for)? {
                Wake::Completions(_) => return Ok(Waited::Completions),
                Wake::Watched => {
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
