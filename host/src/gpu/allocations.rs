//! RAII owners of GPU-side allocations. Each frees its memory in `Drop`; a failure to
//! free is reported on stderr (Drop cannot return it) rather than ignored.

use super::driver::{self, DriverResult};
use std::os::fd::OwnedFd;

/// GPU pages are 64 KiB; the NIC registers whole pages, so device buffers are sized and
/// aligned to them.
pub const GPU_PAGE: usize = 64 * 1024;

fn report_free_error(result: DriverResult<()>) {
    if let Err(e) = result {
        eprintln!("warning: {e}");
    }
}

/// Device memory from `cuMemAlloc`, rounded up to whole 64 KiB GPU pages.
pub struct DeviceMemory {
    ptr: u64,
    len: usize,
    allocated: usize,
}

impl DeviceMemory {
    pub fn new(len: usize) -> DriverResult<Self> {
        let allocated = len.max(1).next_multiple_of(GPU_PAGE);
        let ptr = driver::mem_alloc(allocated)?;
        Ok(DeviceMemory {
            ptr,
            len,
            allocated,
        })
    }

    /// The device address of byte 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The bytes asked for (the allocation may be larger).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole-page range that covers the buffer, for dma-buf export: `(start, len,
    /// offset of the buffer in it)`. cuMemAlloc returns at least 256-byte alignment, so
    /// the buffer may start inside a page.
    pub fn page_range(&self) -> (u64, usize, u64) {
        let start = self.ptr & !(GPU_PAGE as u64 - 1);
        let offset = self.ptr - start;
        let len = (offset as usize + self.allocated).next_multiple_of(GPU_PAGE);
        (start, len, offset)
    }

    /// Export the buffer's pages as a dma-buf and remember SYNC_MEMOPS on it.
    pub fn export_dma_buf(&self) -> DriverResult<(OwnedFd, u64)> {
        driver::set_sync_memops(self.ptr)?;
        let (start, len, offset) = self.page_range();
        Ok((driver::export_dma_buf(start, len)?, offset))
    }

    /// Copy the first `out.len()` bytes back to the host.
    pub fn read_into(&self, out: &mut [u8]) -> DriverResult<()> {
        driver::memcpy_dtoh(out, self.ptr)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by mem_alloc in new(), freed only here; every user (kernel
        // launch, copy, NIC registration) is synchronised or dropped before the buffer.
        report_free_error(unsafe { driver::mem_free(self.ptr) });
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, optionally mapped into the GPU.
pub struct PinnedHostMemory {
    host: *mut u8,
    device: Option<u64>,
    len: usize,
}

impl PinnedHostMemory {
    /// Pinned host memory the GPU's kernels can write directly (`CU_MEMHOSTALLOC_DEVICEMAP`).
    pub fn mapped(len: usize) -> DriverResult<Self> {
        let host = driver::mem_host_alloc(len.max(1), true)?;
        let mut memory = PinnedHostMemory {
            host,
            device: None,
            len,
        };
        memory.device = Some(driver::host_device_pointer(host)?);
        Ok(memory)
    }

    /// Pinned host memory for copies (a staging ring).
    pub fn unmapped(len: usize) -> DriverResult<Self> {
        let host = driver::mem_host_alloc(len.max(1), false)?;
        Ok(PinnedHostMemory {
            host,
            device: None,
            len,
        })
    }

    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The GPU's address for mapped memory.
    pub fn device_ptr(&self) -> Option<u64> {
        self.device
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: host is valid for len bytes while self lives; callers read only after
        // the GPU work that writes it has been synchronised.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }
}

impl Drop for PinnedHostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated by mem_host_alloc, freed only here, after its users.
        report_free_error(unsafe { driver::mem_free_host(self.host) });
    }
}
