//! `ibv_mr`: memory the NIC may read (local) or write (local write, remote write).
//!
//! A [`MemoryRegion`] borrows the memory it registers (`'m`), so the memory cannot be
//! freed while it is registered; an [`Sge`] borrows its region (`'r`), and a queue pair
//! takes only scatter/gather elements of regions that outlive it
//! ([`QueuePair`](super::QueuePair)`<'r>`), so the queue pair is destroyed before the
//! regions it used, and they before their memory: the teardown order holds by
//! construction.

use super::{ProtectionDomain, RdmaError};
use crate::memory::{HostBuffer, Registrable, RegistrationTarget};
use rdma_sys::*;
use std::marker::PhantomData;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::rc::Rc;

/// What the NIC may do with a region besides reading it for sends. Local write is always
/// granted (receives land in memory through it; verbs also require it whenever remote
/// write is granted). Chosen by which constructor registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Access {
    /// Peers may RDMA WRITE into the region (only the receiver's buffer in write mode).
    remote_write: bool,
}

impl Access {
    const LOCAL: Access = Access {
        remote_write: false,
    };
    const REMOTE_WRITE: Access = Access { remote_write: true };

    fn flags(self, target: &RegistrationTarget) -> libc::c_int {
        let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if self.remote_write {
            flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if target.is_gpu_memory() {
            // As NCCL does for GPU buffers: PCIe relaxed ordering lets the NIC's writes to
            // GPU memory pass each other, which GPUs handle and which is much faster
            // through some root complexes. It is an optional flag (IBV_ACCESS_OPTIONAL_*):
            // a device or kernel without it ignores it rather than failing.
            flags |= ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
        }
        flags as libc::c_int
    }
}

/// What a registration covers, in words, for its error message.
fn describe(target: &RegistrationTarget<'_>) -> String {
    match *target {
        RegistrationTarget::Host { len, .. } => format!("{len} bytes of host memory"),
        RegistrationTarget::DmaBuf { fd, len, .. } => {
            format!("{len} bytes of GPU memory, dma-buf fd {}", fd.as_raw_fd())
        }
        RegistrationTarget::DeviceAddress { addr, len } => {
            format!("{len} bytes of GPU memory at {addr:#x} (nvidia-peermem)")
        }
    }
}

/// One scatter/gather element: `len` bytes inside a registered region, with the region's
/// local key. Made only by [`MemoryRegion::sge`] and [`MessageBuffer::sge`], bounds
/// checked; it borrows the region, so the region outlives every queue pair it is posted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge<'r> {
    addr: u64,
    len: u32,
    lkey: u32,
    _region: PhantomData<&'r ()>,
}

impl Sge<'_> {
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn raw(&self) -> ibv_sge {
        ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

/// A registered memory region over memory borrowed for `'m`. Keeps its PD alive.
pub struct MemoryRegion<'m> {
    raw: NonNull<ibv_mr>,
    _pd: Rc<ProtectionDomain>,
    base: u64,
    len: usize,
    _memory: PhantomData<&'m ()>,
}

impl<'m> MemoryRegion<'m> {
    /// Register `memory` for local access: the NIC reads it for sends and writes it for
    /// receives, both only through work requests this program posts (`unsafe`, with
    /// their own contract). The region borrows the memory: it stays allocated (the
    /// [`Registrable`] contract) until the region is dropped.
    ///
    /// A region leaked here (`mem::forget`, an `Rc` cycle) lets the memory be freed while
    /// registered, but nothing can reach it: no peer holds a key to it, and a work request
    /// names it only through an [`Sge`] that borrows the region.
    pub fn register(
        pd: &Rc<ProtectionDomain>,
        memory: &'m (impl Registrable + ?Sized),
    ) -> Result<MemoryRegion<'m>, RdmaError> {
        // SAFETY: Registrable promises the target stays valid while `memory` is borrowed,
        // and the returned region holds that borrow ('m); without remote access only our
        // own (unsafe) work requests reach the memory.
        unsafe { Self::register_target(pd, memory.target(), Access::LOCAL) }
    }

    /// Register `memory` for local access and for the peer's RDMA WRITEs: whoever holds
    /// the [`rkey`](Self::rkey) may write it at any moment while it is registered, without
    /// any work request of ours.
    ///
    /// # Safety
    /// - The region must be dropped, not leaked, before the borrow of `memory` ends: a
    ///   region that skips its destructor (`mem::forget`, an `Rc` cycle, a leaked box)
    ///   stays registered, and the NIC would write memory that has been freed and reused.
    ///   (rust-ibverbs avoids the promise by having the region own its memory.)
    /// - While it lives, nothing may read or write the memory through a Rust reference
    ///   (`&[u8]`): a peer writing then would be a data race. Read it by copies through
    ///   raw pointers (as [`HostBuffer`]'s shared methods and every
    ///   [`RecvSink`](crate::memory::RecvSink) do).
    pub unsafe fn register_remote_writable(
        pd: &Rc<ProtectionDomain>,
        memory: &'m (impl Registrable + ?Sized),
    ) -> Result<MemoryRegion<'m>, RdmaError> {
        // SAFETY: as for `register`, plus the caller's promise that the region is dropped
        // before the memory's borrow ends and that no reference reads the memory.
        unsafe { Self::register_target(pd, memory.target(), Access::REMOTE_WRITE) }
    }

    /// # Safety
    /// The memory `target` describes must stay allocated (a dma-buf open) until the
    /// returned region is dropped: the NIC may access it at any time meanwhile.
    unsafe fn register_target(
        pd: &Rc<ProtectionDomain>,
        target: RegistrationTarget<'_>,
        access: Access,
    ) -> Result<MemoryRegion<'m>, RdmaError> {
        let len = target.len();
        if len == 0 {
            return Err(RdmaError::InvalidArgument(
                "cannot register an empty memory region".into(),
            ));
        }
        let flags = access.flags(&target);
        let (raw, verb) = match target {
            RegistrationTarget::Host { ptr, len } => (
                // SAFETY: the PD is valid; the caller promises [ptr, ptr+len) stays
                // allocated while registered.
                unsafe { ibv_reg_mr(pd.as_ptr(), ptr.as_ptr().cast(), len, flags) },
                "ibv_reg_mr",
            ),
            RegistrationTarget::DmaBuf {
                fd,
                offset,
                len,
                iova,
            } => (
                // SAFETY: the PD is valid; the caller promises the dma-buf stays open and
                // its memory allocated while registered.
                unsafe { ibv_reg_dmabuf_mr(pd.as_ptr(), offset, len, iova, fd.as_raw_fd(), flags) },
                "ibv_reg_dmabuf_mr",
            ),
            RegistrationTarget::DeviceAddress { addr, len } => (
                // SAFETY: as for host memory; the driver pins the GPU pages (through
                // nvidia-peermem) or fails.
                unsafe { ibv_reg_mr(pd.as_ptr(), addr as *mut libc::c_void, len, flags) },
                "ibv_reg_mr",
            ),
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(MemoryRegion {
                raw,
                _pd: pd.clone(),
                base: target.base_address(),
                len,
                _memory: PhantomData,
            }),
            None => Err(RdmaError::last(verb, || describe(&target))),
        }
    }

    /// The key every local work request (SGE) on this region carries.
    fn lkey(&self) -> u32 {
        // SAFETY: the MR is valid while self lives; lkey is a plain field.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// The key a peer uses to RDMA WRITE into the region.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The address a peer's RDMA WRITE names for byte 0 of the region (what the receiver
    /// advertises with the rkey).
    pub fn remote_base(&self) -> u64 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The SGE for bytes `range` of the region (at most 4 GiB - 1 per element).
    pub fn sge(&self, range: Range<usize>) -> Result<Sge<'_>, RdmaError> {
        if range.start > range.end || range.end > self.len {
            return Err(RdmaError::InvalidArgument(format!(
                "bytes {range:?} are outside a {}-byte memory region",
                self.len
            )));
        }
        let len = u32::try_from(range.len()).map_err(|_| {
            RdmaError::InvalidArgument(format!(
                "{} bytes do not fit one scatter/gather element",
                range.len()
            ))
        })?;
        Ok(Sge {
            addr: self.base + range.start as u64,
            len,
            lkey: self.lkey(),
            _region: PhantomData,
        })
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once. Deregistering is allowed whatever
        // still names the region: a queue pair that outlived it (one forgotten with
        // `mem::forget`, whose requests the Sge lifetimes no longer bound) gets
        // protection errors for its requests, and the NIC reaches the memory no more.
        unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
    }
}

/// A small buffer of its own, registered for local access: control messages (the ack,
/// the raw reply) sent and received next to the data.
pub struct MessageBuffer {
    // Field order is drop order: deregister before freeing.
    mr: MemoryRegion<'static>,
    buf: HostBuffer,
}

impl MessageBuffer {
    pub fn new(pd: &Rc<ProtectionDomain>, len: usize) -> Result<MessageBuffer, RdmaError> {
        let buf = HostBuffer::zeroed(len.max(1))
            .map_err(|e| RdmaError::InvalidArgument(format!("{e:#}")))?;
        // SAFETY: the buffer lives in this struct, declared after the region, so it is
        // freed only after the region is deregistered; its heap address never moves.
        let mr = unsafe { MemoryRegion::register_target(pd, buf.target(), Access::LOCAL)? };
        Ok(MessageBuffer { mr, buf })
    }

    /// Copy `data` to the start of the buffer, to be sent. The caller must not do this
    /// while a work request on the buffer is outstanding (the contract of posting it).
    pub fn write(&self, data: &[u8]) -> Result<(), RdmaError> {
        // SAFETY: the buffer is this value's own; the only readers of its bytes besides
        // this value's copies are requests posted on its SGEs, and posting is `unsafe`
        // with the promise not to rewrite the bytes before the request's completion.
        unsafe { self.buf.write_shared(0, data) }
            .map_err(|e| RdmaError::InvalidArgument(format!("{e:#}")))
    }

    /// A copy of the first `len` bytes (a received message, after its completion was
    /// polled).
    pub fn read(&self, len: usize) -> Vec<u8> {
        self.buf.read_prefix(len)
    }

    /// The SGE for the first `len` bytes (clamped to the buffer).
    pub fn sge(&self, len: usize) -> Sge<'_> {
        self.mr
            .sge(0..len.min(self.buf.len()))
            .expect("a prefix of the buffer lies inside its own region")
    }

    /// Copy `data` into the buffer at `offset` (one slot of a buffer cut into slots). The
    /// caller must not do this while a work request on those bytes is outstanding.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), RdmaError> {
        // SAFETY: as for `write`.
        unsafe { self.buf.write_shared(offset, data) }
            .map_err(|e| RdmaError::InvalidArgument(format!("{e:#}")))
    }

    /// A copy of bytes `[offset, offset + len)`, clamped to the buffer (a received
    /// message in one slot, after its completion was polled).
    pub fn read_at(&self, offset: usize, len: usize) -> Vec<u8> {
        self.buf.read_range(offset, len)
    }

    /// The SGE for bytes `range` of the buffer (one slot).
    pub fn sge_at(&self, range: std::ops::Range<usize>) -> Result<Sge<'_>, RdmaError> {
        self.mr.sge(range)
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}
