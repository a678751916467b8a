//! `rdma_event_channel`: where the connection manager reports address resolution,
//! connect requests, establishment, rejection and disconnection.

use super::{c_str, set_nonblocking, wait_readable, CmId, Deadline, RdmaError};
use rdma_sys::*;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

/// An RDMA CM event channel. Its descriptor is non-blocking; [`EventChannel::get_event`]
/// waits with `poll(2)` and a deadline.
pub struct EventChannel {
    raw: NonNull<rdma_event_channel>,
}

impl EventChannel {
    pub fn new() -> Result<Rc<Self>, RdmaError> {
        // SAFETY: no arguments; returns an owned channel or null with errno set.
        let raw = unsafe { rdma_create_event_channel() };
        let Some(raw) = NonNull::new(raw) else {
            let errno = super::last_errno();
            // librdmacm reports ENODEV when it finds no RDMA device at all, ENOENT/ENXIO
            // when the kernel has no rdma_cm (/dev/infiniband/rdma_cm missing).
            if matches!(errno, libc::ENODEV | libc::ENOENT | libc::ENXIO) {
                return Err(RdmaError::NoDevice);
            }
            return Err(RdmaError::verb("rdma_create_event_channel", "", errno));
        };
        let channel = Rc::new(EventChannel { raw });
        set_nonblocking(channel.fd(), "RDMA CM event channel")?;
        Ok(channel)
    }

    pub(crate) fn as_ptr(&self) -> *mut rdma_event_channel {
        self.raw.as_ptr()
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is valid while self lives; `fd` is a plain field.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// The next event, if one is queued; never blocks.
    pub fn try_get_event(&self) -> Result<Option<CmEvent<'_>>, RdmaError> {
        let mut event: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is valid; `event` is a valid out-pointer. The descriptor is
        // non-blocking, so the call returns EAGAIN instead of waiting.
        let ret = unsafe { rdma_get_cm_event(self.raw.as_ptr(), &mut event) };
        if ret != 0 {
            let errno = super::last_errno();
            if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK || errno == libc::EINTR {
                return Ok(None);
            }
            return Err(RdmaError::verb("rdma_get_cm_event", "", errno));
        }
        match NonNull::new(event) {
            Some(raw) => Ok(Some(CmEvent {
                raw,
                _channel: PhantomData,
            })),
            None => Err(RdmaError::verb("rdma_get_cm_event", "returned no event", 0)),
        }
    }

    /// Wait for the next event until `deadline`; `waiting_for` names it in the timeout error.
    pub fn get_event(
        &self,
        deadline: &Deadline,
        waiting_for: &str,
    ) -> Result<CmEvent<'_>, RdmaError> {
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(event);
            }
            if deadline.expired() {
                return Err(deadline.timeout_error(waiting_for));
            }
            wait_readable(&[self.fd()], deadline, None)?;
        }
    }

    /// Wait up to `slice` for an event (`Ok(None)` if none came): for loops that wait
    /// without an end, such as a listener, but still wake up regularly.
    pub fn get_event_within(&self, slice: Duration) -> Result<Option<CmEvent<'_>>, RdmaError> {
        let deadline = Deadline::after(slice);
        loop {
            if let Some(event) = self.try_get_event()? {
                return Ok(Some(event));
            }
            if deadline.expired() {
                return Ok(None);
            }
            wait_readable(&[self.fd()], &deadline, None)?;
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Rc to it, so none is left; all events
        // were acked by their guards (which borrow the channel).
        unsafe { rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// The event types this program tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    fn from_raw(raw: rdma_cm_event_type::Type) -> Self {
        use rdma_cm_event_type::*;
        match raw {
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }

    /// Whether the event carries connection private data (`param.conn`).
    fn has_conn_param(self) -> bool {
        matches!(
            self,
            CmEventKind::ConnectRequest
                | CmEventKind::ConnectResponse
                | CmEventKind::Established
                | CmEventKind::Rejected
        )
    }
}

/// One event, acknowledged (`rdma_ack_cm_event`) when dropped. It borrows its channel,
/// so the channel cannot go away while an event of it is unacknowledged.
pub struct CmEvent<'a> {
    raw: NonNull<rdma_cm_event>,
    _channel: PhantomData<&'a EventChannel>,
}

impl CmEvent<'_> {
    fn raw_type(&self) -> rdma_cm_event_type::Type {
        // SAFETY: the event is valid until acked in drop.
        unsafe { (*self.raw.as_ptr()).event }
    }

    pub fn kind(&self) -> CmEventKind {
        CmEventKind::from_raw(self.raw_type())
    }

    /// "RDMA_CM_EVENT_ESTABLISHED".
    pub fn name(&self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        c_str(
            unsafe { rdma_event_str(self.raw_type()) },
            "unknown RDMA CM event",
        )
    }

    /// Negative errno for failures, the IB CM reject reason for `Rejected`.
    pub fn status(&self) -> i32 {
        // SAFETY: the event is valid until acked in drop.
        unsafe { (*self.raw.as_ptr()).status }
    }

    /// The peer's private data (connect request, accept, reject); empty for other events.
    /// The CM may pad it with zeros to the transport's fixed size.
    pub fn private_data(&self) -> &[u8] {
        if !self.kind().has_conn_param() {
            return &[];
        }
        // SAFETY: for these RC-connection events `param.conn` is the valid union member
        // (we only use RDMA_PS_TCP ids); the private data it points to lives until the
        // event is acked, which cannot happen while the returned slice borrows self.
        unsafe {
            let conn = &(*self.raw.as_ptr()).param.conn;
            if conn.private_data.is_null() || conn.private_data_len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
            }
        }
    }

    /// Turn a `CONNECT_REQUEST` into an owned request: copy its private data, ack the
    /// event, and move the new id onto an event channel of its own. `listener` is the
    /// channel this event came from (the id stays there if the migration fails).
    pub fn into_connect_request(
        self,
        listener: &Rc<EventChannel>,
    ) -> Result<ConnectRequest, RdmaError> {
        if self.kind() != CmEventKind::ConnectRequest {
            return Err(RdmaError::UnexpectedEvent {
                expected: "RDMA_CM_EVENT_CONNECT_REQUEST",
                got: self.name(),
                status: self.status(),
            });
        }
        let private_data = self.private_data().to_vec();
        // SAFETY: the event is valid; for CONNECT_REQUEST `id` is the new connection's id,
        // which the application owns from now on and must destroy.
        let raw_id = unsafe { (*self.raw.as_ptr()).id };
        // Ack first: rdma_migrate_id and rdma_destroy_id wait for the id's events.
        drop(self);
        let Some(raw_id) = NonNull::new(raw_id) else {
            return Err(RdmaError::verb(
                "rdma_get_cm_event",
                "connect request without an id",
                0,
            ));
        };
        let own = match EventChannel::new() {
            Ok(own) => own,
            Err(e) => {
                // SAFETY: raw_id is an owned id on the listener's channel.
                drop(unsafe { CmId::from_raw(raw_id, listener.clone()) });
                return Err(e);
            }
        };
        // SAFETY: raw_id is a valid id whose events are all acked; `own` is a valid channel.
        if unsafe { rdma_migrate_id(raw_id.as_ptr(), own.as_ptr()) } != 0 {
            let err = RdmaError::last("rdma_migrate_id", || "new connection");
            // SAFETY: the migration failed, so the id is still on the listener's channel.
            drop(unsafe { CmId::from_raw(raw_id, listener.clone()) });
            return Err(err);
        }
        // SAFETY: raw_id is owned by us and now reports on `own`.
        let id = unsafe { CmId::from_raw(raw_id, own) };
        let peer = id.peer_addr();
        Ok(ConnectRequest {
            id,
            private_data,
            peer,
        })
    }
}

impl Drop for CmEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: the event came from rdma_get_cm_event and is acked exactly once.
        unsafe { rdma_ack_cm_event(self.raw.as_ptr()) };
    }
}

/// A connection request taken off a listener: the new id (on its own event channel), the
/// private data the peer sent, and its address.
pub struct ConnectRequest {
    pub id: Rc<CmId>,
    pub private_data: Vec<u8>,
    pub peer: Option<SocketAddr>,
}

impl ConnectRequest {
    /// The request as a value that may move to the thread that will serve it, if nothing
    /// else holds its id or the id's event channel (else the request back).
    pub fn into_sendable(self) -> Result<SendableRequest, ConnectRequest> {
        let unique = |strong: usize, weak: usize| strong == 1 && weak == 0;
        if unique(Rc::strong_count(&self.id), Rc::weak_count(&self.id))
            && unique(
                Rc::strong_count(self.id.channel()),
                Rc::weak_count(self.id.channel()),
            )
        {
            Ok(SendableRequest(self))
        } else {
            Err(self)
        }
    }
}

/// A [`ConnectRequest`] whose id and event channel nothing else references: it moves to
/// another thread as a whole, and becomes a `ConnectRequest` again there.
pub struct SendableRequest(ConnectRequest);

// SAFETY: the `Rc`s inside (the id, and the event channel the id holds) have a strong
// count of 1 and no weak references (checked in `into_sendable`), so moving the value moves
// every reference to them: no other thread can touch the counts or the C objects. The C
// objects themselves (an rdma_cm_id and its event channel) may be used from any thread:
// librdmacm is thread-safe, and from here on only the receiving thread uses them.
unsafe impl Send for SendableRequest {}

impl SendableRequest {
    pub fn into_inner(self) -> ConnectRequest {
        self.0
    }
}
