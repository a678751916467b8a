//! The verbs path: a comm is one RC queue pair through librdmacm (the host crate's
//! verbs wire: `host::rdma`'s thin wrappers and `host::net::verbs::conn`'s connection
//! with its control slots), as NCCL's own InfiniBand transport does it, plus a CRC32C
//! of every message:
//!
//! 1. `irecv` registers nothing itself (NCCL registered its buffers with `regMr`) and
//!    sends the sender a clear-to-send: each buffer's address, remote key, size and
//!    tag ([`frames::Frame::Cts`]).
//! 2. `isend` matches the oldest clear-to-send with a buffer of its tag (a null request
//!    while none has come: NCCL calls again), RDMA-WRITEs the message straight into that
//!    buffer and SENDs a "written" frame with its size and CRC32C behind it (RC keeps
//!    the order: the frame arrives after the bytes).
//! 3. The receiver checks the CRC32C where the bytes landed and answers intact (the
//!    send is done) or write again (the same write, at most [`MAX_RESENDS`] times);
//!    the receive is done once each of its buffers got intact bytes. A buffer small
//!    enough for NCCL's LL and LL128 protocols is written into a staging buffer of the
//!    comm instead and copied into NCCL's once intact ([`staging`]): under those
//!    protocols the GPU reads NCCL's buffer as the bytes land.
//!
//! No threads: NCCL's calls (`isend`, `irecv`, `test`) poll the completion queue and
//! the CM events and act on what came, as the InfiniBand transport does. With the
//! checks off (`NCCL_GRDMA_CHECKS=0`) there is no CRC and no answer: a send is done
//! when its frame's completion says the peer has it.
//!
//! Memory: host memory only (`NCCL_PTR_HOST`), registered with `regMr` on the comm's
//! protection domain for local and remote write. GPU memory through dma-buf or
//! nvidia-peermem is not claimed: no machine here has a NIC and a GPU together to prove
//! it on (Soft-RoCE registers no dma-buf).

pub mod frames;
pub mod recv;
pub mod send;
pub mod setup;
pub mod staging;

use crate::comm::Handles;
use crate::error::NetError;
use crate::integrity::{self, Counters};
use crate::log::{info, NET};
use host::memory::{Registrable, RegistrationTarget};
use host::net::verbs::conn::{Connection, Resources};
use host::rdma::{Completion, MemoryRegion, QpCaps, RdmaError, Sge};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

/// Times one message may fail its CRC before the send fails.
pub use crate::comm::MAX_RESENDS;

/// Receive slots posted per comm for control frames: more than the frames that can be
/// in flight towards one side (32 requests of up to 8 buffers, each a frame and at
/// most one resend's in flight), so the peer never waits for a receive.
pub const RECV_SLOTS: usize = 320;
/// Send slots per comm for control frames.
pub const SEND_SLOTS: usize = 320;
/// Send work requests: frames and writes (a message of more than the port's largest
/// message goes as several writes).
const MAX_SEND_WR: u32 = 1024;

/// `wr_id`s: a receive slot's receive, a frame's send slot, a write (unsignaled).
pub const WR_RECV: u64 = 1 << 56;
pub const WR_FRAME: u64 = 2 << 56;
pub const WR_WRITE: u64 = 3 << 56;
pub const WR_INDEX: u64 = (1 << 56) - 1;

/// Everything of a comm that holds `Rc`s and `Cell`s of the host crate's wrappers.
///
/// NCCL may call `regMr` of a comm on its proxy's service thread while its progress
/// thread tests the comm's requests, so the comms keep this behind a `Mutex` and only
/// ever reach it through the lock.
pub struct Confined<T>(pub T);

// SAFETY: the `Rc`s and `Cell`s inside (the connection's CM id, event channel, PD, CQ
// and queue pair, the registrations' PD references) are all reachable only through this
// value: none is cloned out of it, and each comm keeps it inside a `Mutex`, so the
// non-atomic reference counts and cells are touched by one thread at a time, with the
// lock's ordering between threads. The C objects behind them (rdma_cm ids, verbs
// objects) may be used from any thread (libibverbs and librdmacm are thread-safe).
unsafe impl<T> Send for Confined<T> {}

/// Host memory NCCL lent with `regMr`, as the RDMA layer registers it.
struct NcclMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: made only in `Link::register`, whose caller promises that NCCL keeps the
// memory allocated until `deregMr` (or the comm's close), which is when the registration
// that borrows this value is dropped.
unsafe impl Registrable for NcclMemory {
    fn target(&self) -> RegistrationTarget<'_> {
        RegistrationTarget::Host {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

/// What NCCL holds for a verbs send or receive comm ([`send::VerbsSend`],
/// [`recv::VerbsRecv`]): the magic that tells its kind, its request handles (at fixed
/// addresses), and its state behind the lock.
#[repr(C)]
pub struct Comm<S> {
    magic: u64,
    pub handles: Handles,
    inner: Mutex<Confined<S>>,
}

/// A comm's state has its link.
pub trait HasLink {
    fn link(&mut self) -> &mut Link;
}

impl<S: HasLink> Comm<S> {
    /// The comm NCCL will hold, with `magic` and `state`; `send`: its requests are sends.
    pub fn boxed(magic: u64, send: bool, state: S) -> Box<Self> {
        let mut b = Box::new(Self {
            magic,
            handles: Handles::new(send, std::ptr::null_mut()),
            inner: Mutex::new(Confined(state)),
        });
        let me = &mut *b as *mut Self as *mut c_void;
        b.handles = Handles::new(send, me);
        b
    }

    pub fn state(&self) -> MutexGuard<'_, Confined<S>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// # Safety
    /// As [`Link::register`].
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<usize, NetError> {
        // SAFETY: the caller's contract.
        unsafe { self.state().0.link().register(ptr, len) }
    }

    pub fn deregister(&self, index: usize) -> Result<(), NetError> {
        self.state().0.link().deregister(index)
    }
}

/// A registration of NCCL's memory on a comm's protection domain.
pub struct Registration {
    /// Declared first: deregistered before `memory` is freed. None for 0 bytes, which
    /// verbs cannot register and no request ever reads or writes.
    region: Option<MemoryRegion<'static>>,
    /// What the region borrows (boxed: it stays put while the region lives).
    _memory: Box<NcclMemory>,
}

impl Registration {
    /// The region's remote key and the address a peer writes byte 0 at.
    pub fn remote(&self) -> (u32, u64) {
        self.region
            .as_ref()
            .map_or((0, 0), |r| (r.rkey(), r.remote_base()))
    }

    /// An SGE of `len` bytes at `addr` inside the region, for this comm's queue pair.
    pub fn sge(&self, addr: u64, len: u64) -> Result<Sge<'static>, NetError> {
        let Some(region) = self.region.as_ref() else {
            return Err(NetError::invalid(format!(
                "a buffer {addr:#x}+{len} lies outside its registration of 0 bytes"
            )));
        };
        let base = region.remote_base();
        let at = addr.checked_sub(base).map(|a| a as usize);
        let range = at.map(|a| a..a.saturating_add(len as usize));
        let sge = range
            .filter(|r| r.end <= region.len())
            .ok_or_else(|| {
                NetError::invalid(format!(
                    "a buffer {addr:#x}+{len} lies outside its registration {base:#x}+{}",
                    region.len()
                ))
            })
            .and_then(|r| region.sge(r).map_err(rdma_err))?;
        // SAFETY: the SGE names memory of this registration, which the link drops only
        // after its queue pair is destroyed (Link's field order) or, in `deregister`,
        // while NCCL has no request on it (NCCL's contract: a buffer is deregistered only
        // when no request uses it); so it is valid for as long as the queue pair may
        // use it, which is all `'static` promises the queue pair.
        Ok(unsafe { std::mem::transmute::<Sge<'_>, Sge<'static>>(sge) })
    }
}

/// One queue pair and what rides on it: NCCL's registrations, the free send slots.
pub struct Link {
    /// Declared first: the queue pair is destroyed before the regions it may name.
    pub conn: Connection<'static>,
    regs: Vec<Option<Registration>>,
    free_send: Vec<usize>,
    /// What the CQ gave, taken in `poll`.
    comps: Vec<Completion>,
    pub peer: String,
    pub counters: Counters,
    /// Bytes one write may carry (the port's largest message).
    pub max_write: u64,
}

impl Link {
    /// The queue pair on `id` (resolved, before connect or accept), its receive slots
    /// posted.
    pub fn new(id: &std::rc::Rc<host::rdma::CmId>, peer: String) -> Result<Link, NetError> {
        let caps = QpCaps {
            max_send_wr: MAX_SEND_WR,
            max_recv_wr: RECV_SLOTS as u32 + 8,
            max_inline_data: 0,
        };
        let res = Resources::new(id, Resources::cq_entries(caps), true).map_err(rdma_err)?;
        let conn = Connection::new(&res, caps, (RECV_SLOTS, 0), SEND_SLOTS).map_err(rdma_err)?;
        for slot in 0..RECV_SLOTS {
            // SAFETY: a fresh slot of this connection, read only after its completion.
            unsafe { conn.post_slot_recv(WR_RECV | slot as u64, slot) }.map_err(rdma_err)?;
        }
        let max_write = id
            .port_info()
            .map(|p| u64::from(p.max_msg_sz))
            .unwrap_or(1 << 30)
            .clamp(1 << 16, 1 << 30);
        Ok(Link {
            conn,
            regs: Vec::new(),
            free_send: (0..SEND_SLOTS).rev().collect(),
            comps: Vec::new(),
            peer,
            counters: Counters::default(),
            max_write,
        })
    }

    /// Register `len` bytes of NCCL's host memory at `ptr` for local and remote write;
    /// the registration's index.
    ///
    /// # Safety
    /// `ptr..ptr + len` is memory NCCL keeps allocated until it calls `deregMr` for
    /// this registration (or closes the comm), and reads or writes it meanwhile only as
    /// NCCL's contract with a net plugin allows (not while a request on it is in flight).
    pub unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> Result<usize, NetError> {
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(NetError::invalid("regMr: null buffer"));
        };
        let memory = Box::new(NcclMemory { ptr, len });
        // SAFETY: the reference is to the boxed value, which does not move and is dropped
        // only after the region (the field order of `Registration`).
        let as_static: &'static NcclMemory = unsafe { &*(&*memory as *const NcclMemory) };
        // (0 bytes: verbs registers nothing, and no request reads or writes there.)
        let region = if len == 0 {
            None
        } else {
            // SAFETY: the remote-write contract: the region is dropped (in `deregister`
            // or with the link, never leaked) before NCCL frees the memory (the caller's
            // promise), and nothing here reads the memory through a reference while a
            // peer may write it: a receive's bytes are read only after the peer's
            // "written" frame, which RC delivers after its write, and before any answer
            // lets it write again.
            let r = unsafe { MemoryRegion::register_remote_writable(&self.conn.pd, as_static) };
            Some(r.map_err(rdma_err)?)
        };
        let reg = Registration {
            region,
            _memory: memory,
        };
        let index = match self.regs.iter().position(Option::is_none) {
            Some(i) => {
                self.regs[i] = Some(reg);
                i
            }
            None => {
                self.regs.push(Some(reg));
                self.regs.len() - 1
            }
        };
        Ok(index)
    }

    pub fn deregister(&mut self, index: usize) -> Result<(), NetError> {
        match self.regs.get_mut(index).and_then(Option::take) {
            Some(_) => Ok(()),
            None => Err(NetError::invalid(format!(
                "deregMr: registration {index} is not one of this comm's"
            ))),
        }
    }

    pub fn registration(&self, index: usize) -> Result<&Registration, NetError> {
        self.regs
            .get(index)
            .and_then(Option::as_ref)
            .ok_or_else(|| NetError::invalid(format!("registration {index} was deregistered")))
    }

    /// Send a control frame from a free send slot: the slot (its completion comes back
    /// from [`poll`](Self::poll)), or none when none is free now (the caller keeps the
    /// frame for later).
    pub fn send_frame(&mut self, bytes: &[u8]) -> Result<Option<usize>, NetError> {
        let Some(slot) = self.free_send.pop() else {
            return Ok(None);
        };
        // SAFETY: the slot was free (its last send's completion was polled); it goes back
        // to the free list only at this send's completion.
        unsafe { self.conn.send_slot(WR_FRAME | slot as u64, slot, bytes) }.map_err(rdma_err)?;
        Ok(Some(slot))
    }

    /// Take what the CQ has: the frames received (their slots reposted) and the send
    /// slots whose frames completed (the peer has them; the slots are free again); an
    /// error for a failed work request, the peer's disconnect or a device fault. What
    /// came before the failure is in `frames` and `sent` even then, and the caller acts
    /// on it first: a peer that sends its last frames and disconnects at once (its sends
    /// done, checks off) has both seen by one call, and the receives those frames
    /// complete must not fail with the connection.
    pub fn poll(
        &mut self,
        frames: &mut Vec<Vec<u8>>,
        sent: &mut Vec<usize>,
    ) -> Result<(), NetError> {
        self.comps.clear();
        self.conn.cq.poll(&mut self.comps).map_err(rdma_err)?;
        for i in 0..self.comps.len() {
            let c = self.comps[i];
            if !c.is_ok() {
                return Err(NetError::remote(format!(
                    "the connection with {} failed: {} (work request {:#x})",
                    self.peer,
                    c.status_str(),
                    c.wr_id
                )));
            }
            let index = (c.wr_id & WR_INDEX) as usize;
            match c.wr_id & !WR_INDEX {
                WR_RECV => {
                    frames.push(self.conn.read_slot(index, c.byte_len as usize));
                    // SAFETY: the slot's bytes were just copied out; it is read again
                    // only after this receive's completion.
                    unsafe { self.conn.post_slot_recv(c.wr_id, index) }.map_err(rdma_err)?;
                }
                WR_FRAME => {
                    self.free_send.push(index);
                    sent.push(index);
                }
                _ => {}
            }
        }
        if self.conn.poll_events().map_err(rdma_err)? {
            return Err(NetError::remote(format!(
                "{} closed the connection",
                self.peer
            )));
        }
        Ok(())
    }

    /// Disconnect and wait a moment for the peer's word (so the kernel lets the CM id go
    /// cleanly; everything is freed by the drop), then the comm's counters into NCCL's
    /// log (`what`: "send comm to" or "receive comm from") and the process's `totals`.
    pub fn close(&self, what: &str, totals: &integrity::Totals) {
        self.conn.close(true, std::time::Duration::from_millis(200));
        info!(NET; "{what} {} over verbs closed: {}", self.peer, self.counters.line());
        totals.add(&self.counters);
    }

    /// `progress` unless the comm failed before: its first error, again (every later
    /// call of a failed comm fails, as NCCL expects).
    pub fn latched<S>(
        state: &mut S,
        failed: fn(&mut S) -> &mut Option<NetError>,
        progress: fn(&mut S) -> Result<(), NetError>,
    ) -> Result<(), NetError> {
        if let Some(e) = failed(state) {
            return Err(e.clone());
        }
        let r = progress(state);
        if let Err(e) = &r {
            *failed(state) = Some(e.clone());
        }
        r
    }

    /// Count messages reported done.
    pub fn count(&mut self, sizes: &[u64]) {
        self.counters.messages += sizes.len() as u64;
        self.counters.bytes += sizes.iter().sum::<u64>();
    }
}

pub fn rdma_err(e: RdmaError) -> NetError {
    NetError::system(format!("verbs: {e}"))
}
