//! `ibv_mr`: memory the NIC may read (local) or write (local write, remote write).

use super::{ProtectionDomain, RdmaError};
use crate::memory::Registration;
use rdma_sys::*;
use std::ptr::NonNull;
use std::rc::Rc;

/// What the NIC may do with a region besides reading it for sends. Local write is always
/// granted (receives land in memory through it; verbs also require it whenever remote
/// write is granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Peers may RDMA WRITE into the region (only the receiver's buffer in write mode).
    pub remote_write: bool,
}

impl Access {
    pub const LOCAL: Access = Access {
        remote_write: false,
    };
    pub const REMOTE_WRITE: Access = Access { remote_write: true };

    fn flags(self) -> libc::c_int {
        let mut flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if self.remote_write {
            flags |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        flags as libc::c_int
    }
}

/// A registered memory region. Keeps its PD alive; does not own the memory.
pub struct MemoryRegion {
    raw: NonNull<ibv_mr>,
    _pd: Rc<ProtectionDomain>,
    base: u64,
    len: usize,
}

impl MemoryRegion {
    /// Register `registration` with the NIC.
    ///
    /// # Safety
    /// The memory `registration` describes must stay allocated (and, for device memory,
    /// the dma-buf open) until the returned region is dropped: the NIC may access it at
    /// any time while it is registered.
    pub unsafe fn register(
        pd: &Rc<ProtectionDomain>,
        registration: Registration,
        access: Access,
    ) -> Result<MemoryRegion, RdmaError> {
        let len = registration.len();
        if len == 0 {
            return Err(RdmaError::InvalidArgument(
                "cannot register an empty memory region".into(),
            ));
        }
        let flags = access.flags();
        let (raw, verb, what) = match registration {
            Registration::Host { addr, len } => (
                // SAFETY: the PD is valid; the caller promises [addr, addr+len) stays
                // allocated while registered.
                unsafe { ibv_reg_mr(pd.as_ptr(), addr.cast(), len, flags) },
                "ibv_reg_mr",
                format!("{len} bytes of host memory"),
            ),
            Registration::DmaBuf {
                fd,
                offset,
                len,
                iova,
            } => (
                // SAFETY: the PD is valid; the caller promises the dma-buf stays open and
                // its memory allocated while registered.
                unsafe { ibv_reg_dmabuf_mr(pd.as_ptr(), offset, len, iova, fd, flags) },
                "ibv_reg_dmabuf_mr",
                format!("{len} bytes of GPU memory, dma-buf fd {fd}"),
            ),
            Registration::DeviceAddress { addr, len } => (
                // SAFETY: as for host memory; the driver pins the GPU pages (through
                // nvidia-peermem) or fails.
                unsafe { ibv_reg_mr(pd.as_ptr(), addr as *mut libc::c_void, len, flags) },
                "ibv_reg_mr",
                format!("{len} bytes of GPU memory at {addr:#x}"),
            ),
        };
        match NonNull::new(raw) {
            Some(raw) => Ok(MemoryRegion {
                raw,
                _pd: pd.clone(),
                base: registration.base_address(),
                len,
            }),
            None => Err(RdmaError::last(verb, what)),
        }
    }

    /// The key every local work request (SGE) on this region carries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is valid while self lives; lkey is a plain field.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// The key a peer uses to RDMA WRITE into the region.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// The address work requests use for byte 0 of the region.
    pub fn base_address(&self) -> u64 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.len as u64)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once. Work requests still naming it
        // complete in error; the NIC stops accessing the memory.
        unsafe { ibv_dereg_mr(self.raw.as_ptr()) };
    }
}

/// A small buffer of its own, registered for local access: control messages (the ack,
/// the raw reply) sent and received next to the data.
pub struct MessageBuffer {
    // Field order is drop order: deregister before freeing.
    mr: MemoryRegion,
    buf: Box<[u8]>,
}

impl MessageBuffer {
    pub fn new(pd: &Rc<ProtectionDomain>, len: usize) -> Result<MessageBuffer, RdmaError> {
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        let registration = Registration::Host {
            addr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        // SAFETY: the boxed slice lives in this struct, declared after the region, so it is
        // freed only after the region is deregistered; its heap address never moves.
        let mr = unsafe { MemoryRegion::register(pd, registration, Access::LOCAL)? };
        Ok(MessageBuffer { mr, buf })
    }

    /// Copy `data` to the start of the buffer, to be sent. Must not be called while a
    /// work request on the buffer is outstanding (the `&mut` makes the caller think so).
    pub fn write(&mut self, data: &[u8]) -> Result<(), RdmaError> {
        if data.len() > self.buf.len() {
            return Err(RdmaError::InvalidArgument(format!(
                "{} bytes do not fit a {}-byte message buffer",
                data.len(),
                self.buf.len()
            )));
        }
        self.buf[..data.len()].copy_from_slice(data);
        Ok(())
    }

    /// The first `len` bytes (a received message, after its completion was polled).
    pub fn read(&self, len: usize) -> &[u8] {
        &self.buf[..len.min(self.buf.len())]
    }

    /// The SGE for the first `len` bytes (clamped to the buffer).
    pub fn sge(&self, len: usize) -> super::Sge {
        super::Sge {
            addr: self.mr.base_address(),
            len: len.min(self.buf.len()) as u32,
            lkey: self.mr.lkey(),
        }
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}
