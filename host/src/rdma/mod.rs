//! Thin RAII wrappers over `rdma-sys` (libibverbs + librdmacm of rdma-core).
//!
//! One file per concept, each wrapping one C object:
//!
//! | type                  | C object                      | created by                      | keeps alive            |
//! |-----------------------|-------------------------------|---------------------------------|------------------------|
//! | [`EventChannel`]      | `rdma_event_channel`          | `rdma_create_event_channel`     | –                      |
//! | [`CmId`]              | `rdma_cm_id`                  | `rdma_create_id` / a request    | its event channel      |
//! | [`ProtectionDomain`]  | `ibv_pd`                      | `ibv_alloc_pd` on the id's verbs| the id                 |
//! | [`MemoryRegion`]      | `ibv_mr`                      | `ibv_reg_mr`/`ibv_reg_dmabuf_mr`| the PD                 |
//! | [`CompletionChannel`] | `ibv_comp_channel`            | `ibv_create_comp_channel`       | the id                 |
//! | [`CompletionQueue`]   | `ibv_cq`                      | `ibv_create_cq`                 | the id, its channel    |
//! | [`QueuePair`]         | the `ibv_qp` of an id (RC)    | `rdma_create_qp`                | id, PD, CQs            |
//!
//! # Safety model
//!
//! All `unsafe` code of the RDMA side lives in this module; every block carries a
//! `// SAFETY:` note. The rules it relies on:
//!
//! * **Ownership is a reference-counted tree.** Every wrapper owns exactly one C object
//!   and holds an `Rc` to each object it was created from (the "keeps alive" column).
//!   A parent can therefore never be destroyed while a child exists, and `Drop` runs in
//!   reverse order of creation: QP before CQ and PD, MR before PD, CQ before its
//!   completion channel, everything before the `rdma_cm_id` (whose verbs context the
//!   others live in), the id before its event channel. `Drop` cannot report errors; a
//!   failing destroy call is ignored, as it can only fail when the tree above is broken.
//! * **One thread per connection.** The wrappers hold raw pointers and are neither `Send`
//!   nor `Sync`; a connection and everything of it lives on one thread. The one crossing
//!   is a connect request handed from the listener to the thread that serves it, as a
//!   [`SendableRequest`], which exists only while nothing else references its id.
//! * **Events are acknowledged by a guard.** [`CmEvent`] acks its `rdma_cm_event` when
//!   dropped and borrows the channel it came from. `rdma_destroy_id` waits for every
//!   event of the id to be acked, so a connect request is turned into an owned
//!   [`ConnectRequest`] (private data copied, event acked) *before* its id gets a
//!   wrapper that may be destroyed.
//! * **Memory outlives its registration.** A [`MemoryRegion`] borrows the memory it
//!   registers, so the memory cannot be freed while the region is alive. A leaked region
//!   (`mem::forget`, an `Rc` cycle) ends that borrow without deregistering, so only
//!   local registrations are safe ([`MemoryRegion::register`]: nothing reaches them but
//!   our own `unsafe` work requests); one the peer may write
//!   ([`MemoryRegion::register_remote_writable`]) is `unsafe`, its caller promising to
//!   drop it before the memory and to read the memory only by copies meanwhile.
//! * **Posted memory is untouched until completion.** [`QueuePair::post_send`] and
//!   [`QueuePair::post_recv`] are `unsafe`: the memory a work request names must lie in
//!   a live memory region (whose `lkey` the request carries) and must not be written
//!   (send) or read/written (receive) by anyone else until the request's completion has
//!   been polled (or the QP is destroyed).
//! * **No wait blocks forever.** Both event channels' file descriptors are non-blocking
//!   and every wait goes through `poll(2)` with a [`Deadline`].
//!
//! Listener design: a listening [`CmId`] receives `CONNECT_REQUEST` events on its own
//! channel. [`CmEvent::into_connect_request`] acks the event and *migrates* the new
//! child id onto a fresh [`EventChannel`] of its own (`rdma_migrate_id`), so the
//! listener's channel only ever carries connect requests (which queue there while a
//! connection is served) and each connection's `ESTABLISHED`/`DISCONNECTED` events
//! arrive on a channel that is dropped with the connection.

mod async_events;
mod cm_id;
mod context;
mod cq;
mod device;
mod error;
mod event_channel;
pub mod memlock;
mod mr;
mod pd;
pub mod presence;
mod probe;
mod qp;

pub use async_events::DeviceEvents;
pub use cm_id::{canonical, CmId, ConnParams, PortInfo};
pub use cq::{Completion, CompletionChannel, CompletionQueue, Wake};
pub use device::{
    devices, ensure_device, phys_state_name, port_advice, DeviceInfo, GidInfo, LinkRate,
    PortSummary,
};
pub use error::{errno_message, format_duration, RdmaError};
pub use event_channel::{CmEvent, CmEventKind, ConnectRequest, EventChannel, SendableRequest};
pub use mr::{MemoryRegion, MessageBuffer, Sge};
pub use pd::ProtectionDomain;
pub use probe::{
    describe_peermem, errno_in_words, errno_name, loaded_peermem_module, peermem_module,
    probe_nics, DmaBufProbe, NicLocation, NicProbe, PeerMemModule,
};
pub use qp::{QpCaps, QueuePair, SendOp, SendWr, POST_LIST_MAX};

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The ends of every wait: a point in time, and the timeout it came from (for messages).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now (at most about a century: `Instant` cannot hold more).
    pub fn after(timeout: Duration) -> Self {
        let timeout = timeout.min(Duration::from_secs(3_000_000_000));
        Deadline {
            at: Instant::now() + timeout,
            timeout,
        }
    }

    /// Whichever of the two ends first.
    pub fn earliest(self, other: Option<Deadline>) -> Deadline {
        match other {
            Some(o) if o.at < self.at => o,
            _ => self,
        }
    }

    pub fn at(&self) -> Instant {
        self.at
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.at
    }

    /// The timeout error for this deadline.
    pub fn timeout_error(&self, waiting_for: impl Into<String>) -> RdmaError {
        RdmaError::Timeout {
            waiting_for: waiting_for.into(),
            after: self.timeout,
        }
    }
}

/// Wait until one of `fds` is readable or `deadline` passes. Returns a bit per fd (bit `i`
/// set: `fds[i]` readable or in error), 0 on timeout. `max_wait` caps a single call (so
/// callers can interleave other checks).
pub(crate) fn wait_readable(
    fds: &[RawFd],
    deadline: &Deadline,
    max_wait: Option<Duration>,
) -> Result<u32, RdmaError> {
    debug_assert!(fds.len() <= 32);
    let mut pollfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let mut wait = deadline.remaining();
        if let Some(cap) = max_wait {
            wait = wait.min(cap);
        }
        // Round up so that a sub-millisecond remainder still waits instead of spinning.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `pollfds` is a valid, exclusively borrowed array of `len` pollfd structs
        // for the duration of the call.
        let n = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let errno = last_errno();
            if errno == libc::EINTR {
                continue;
            }
            return Err(RdmaError::verb("poll", "", errno));
        }
        let mut mask = 0u32;
        for (i, p) in pollfds.iter().enumerate() {
            if p.revents != 0 {
                mask |= 1 << i;
            }
        }
        return Ok(mask);
    }
}

/// Make a file descriptor non-blocking, so a read after a spurious wake-up cannot hang.
pub(crate) fn set_nonblocking(fd: RawFd, what: &'static str) -> Result<(), RdmaError> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(RdmaError::verb("fcntl(F_GETFL)", what, last_errno()));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::verb("fcntl(F_SETFL)", what, last_errno()));
    }
    Ok(())
}

/// The calling thread's `errno`.
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A C string from the verbs libraries (static strings such as `ibv_wc_status_str`'s), or
/// a fallback when the pointer is null.
pub(crate) fn c_str(ptr: *const libc::c_char, fallback: &str) -> String {
    if ptr.is_null() {
        return fallback.to_string();
    }
    // SAFETY: the verbs libraries return NUL-terminated static strings; null was excluded.
    unsafe { std::ffi::CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}
