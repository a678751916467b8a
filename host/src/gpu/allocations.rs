//! Owned GPU-side memory, tied to the context it was allocated in: device memory
//! ([`DeviceBuffer`]), page-locked host memory ([`PinnedHostBuffer`]) and page-locked
//! host memory mapped into the GPU ([`MappedHostBuffer`]). Each holds an `Rc<Gpu>`, so the
//! context cannot be destroyed before the memory, and frees its memory in `Drop`; a
//! failure to free is reported on stderr (Drop cannot return it) rather than ignored.
//!
//! Nothing here hands out an address that safe code could misuse: kernels reach the
//! memory through [`GpuMemory`], the NIC through [`Registrable`], and the CPU through
//! bounds-checked copies and slices.

use super::context::{Gpu, GpuMemory, GpuMemoryMut};
use super::driver::{self, DriverResult};
use crate::memory::{Registrable, RegistrationTarget};
use anyhow::{bail, Result};
use std::marker::PhantomData;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::rc::Rc;

/// GPU pages are 64 KiB; the NIC registers whole pages of GPU memory, so GPUDirect
/// buffers start on a page and are exported as whole pages.
pub const GPU_PAGE: usize = 64 * 1024;

fn report_free_error(result: DriverResult<()>) {
    if let Err(e) = result {
        eprintln!("warning: {e}");
    }
}

/// Where a page-aligned buffer of `len` bytes lies inside an allocation of `allocated`
/// bytes at `base`: its start (the first page boundary at or after `base`) and its span
/// (`len` rounded up to whole pages); `None` if that does not fit. `cuMemAlloc`
/// guarantees only 256-byte alignment, so the buffer cannot simply start at `base`: the
/// exported range would then begin before the allocation (perftest rounds the same way,
/// NCCL allocates page-aligned buffers).
pub(crate) fn page_aligned_within(base: u64, allocated: usize, len: usize) -> Option<(u64, usize)> {
    let page = GPU_PAGE as u64;
    let start = base.checked_next_multiple_of(page)?;
    let span = len.max(1).checked_next_multiple_of(GPU_PAGE)?;
    let end = start.checked_add(span as u64)?;
    (end <= base.checked_add(allocated as u64)?).then_some((start, span))
}

/// Bytes to allocate for a page-aligned buffer of `len` bytes whose allocation is taken
/// as starting `skew` bytes later (the tests' misaligned base): whole pages for `len`,
/// one page of room to align, and the skew. `None` where that overflows.
pub fn skewed_allocation_size(len: usize, skew: usize) -> Option<usize> {
    len.max(1)
        .checked_next_multiple_of(GPU_PAGE)?
        .checked_add(GPU_PAGE)?
        .checked_add(skew)
}

/// [`page_aligned_within`] for an allocation of `allocated` bytes at `allocation`, taken
/// as starting `skew` bytes later. Every step is checked: a skew past the allocation, or
/// one that wraps the address space, gives `None`, never a range outside the allocation.
pub(crate) fn skewed_page_aligned_within(
    allocation: u64,
    allocated: usize,
    len: usize,
    skew: usize,
) -> Option<(u64, usize)> {
    let base = allocation.checked_add(u64::try_from(skew).ok()?)?;
    let (start, span) = page_aligned_within(base, allocated.checked_sub(skew)?, len)?;
    // page_aligned_within keeps the range inside [base, base + allocated - skew), which
    // lies inside the allocation; said once more, so that no arithmetic above can hide a
    // range that starts before it.
    let end = start.checked_add(span as u64)?;
    (start >= allocation && end <= allocation.checked_add(allocated as u64)?)
        .then_some((start, span))
}

/// Device memory from `cuMemAlloc`.
pub struct DeviceBuffer {
    gpu: Rc<Gpu>,
    /// What cuMemAlloc returned (freed in Drop); for memory a caller lent
    /// ([`DeviceBuffer::borrowed`]), byte 0, never freed here.
    allocation: u64,
    /// Whether Drop frees `allocation` (false: the caller's memory, lent).
    owned: bool,
    /// Byte 0 of the buffer (the allocation itself, or its first page boundary).
    ptr: u64,
    /// The bytes asked for.
    len: usize,
    /// Whole GPU pages from `ptr` that belong to the allocation (page-aligned buffers).
    pages: Option<usize>,
}

impl DeviceBuffer {
    /// `len` bytes of device memory (at least 256-byte aligned).
    pub fn new(gpu: &Rc<Gpu>, len: usize) -> Result<Self> {
        let allocation = driver::mem_alloc(&gpu.bind()?, len.max(1))?;
        Ok(DeviceBuffer {
            gpu: gpu.clone(),
            allocation,
            ptr: allocation,
            len,
            pages: None,
            owned: true,
        })
    }

    /// `len` bytes at the GPU address `ptr` that a library caller allocated (a torch
    /// tensor's storage, say), used for one transfer and never freed here.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be device memory of `gpu`'s context (the device's primary
    /// context, which is what CUDA's runtime and PyTorch allocate in), stay allocated
    /// until the value is dropped, and be read or written by nothing else meanwhile (no
    /// kernel or copy of the caller's still queued on it: the caller waits for its
    /// streams first).
    pub(crate) unsafe fn borrowed(gpu: &Rc<Gpu>, ptr: u64, len: usize) -> DeviceBuffer {
        DeviceBuffer {
            gpu: gpu.clone(),
            allocation: ptr,
            ptr,
            len,
            pages: None,
            owned: false,
        }
    }

    /// `len` bytes starting on a 64 KiB GPU page, with the rest of its last page also
    /// allocated: what a NIC registers for GPUDirect RDMA. The allocation is one page
    /// larger, and the buffer starts at its first page boundary.
    pub fn page_aligned(gpu: &Rc<Gpu>, len: usize) -> Result<Self> {
        Self::page_aligned_with_skew(gpu, len, 0)
    }

    /// [`page_aligned`](Self::page_aligned) as if `cuMemAlloc` had returned an address
    /// `skew` bytes further on: the tests use it to show that a base that is not on a
    /// page boundary still gives a whole-page buffer inside the allocation.
    #[doc(hidden)]
    pub fn page_aligned_with_skew(gpu: &Rc<Gpu>, len: usize, skew: usize) -> Result<Self> {
        let Some(allocated) = skewed_allocation_size(len, skew) else {
            bail!("{len} bytes of GPU memory with a skew of {skew} cannot be allocated in whole pages");
        };
        let allocation = driver::mem_alloc(&gpu.bind()?, allocated)?;
        let mut buffer = DeviceBuffer {
            gpu: gpu.clone(),
            allocation,
            ptr: allocation,
            len,
            pages: None,
            owned: true,
        };
        let Some((start, pages)) = skewed_page_aligned_within(allocation, allocated, len, skew)
        else {
            bail!("no page-aligned {len}-byte range inside a {allocated}-byte allocation at {allocation:#x} skewed by {skew}");
        };
        buffer.ptr = start;
        buffer.pages = Some(pages);
        Ok(buffer)
    }

    /// The bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes from byte 0 to the end of the allocation's last page (page-aligned buffers).
    pub fn page_span(&self) -> Option<usize> {
        self.pages
    }

    /// How far byte 0 lies past the start of the allocation (0 unless page-aligned).
    pub fn offset_in_allocation(&self) -> u64 {
        self.ptr - self.allocation
    }

    /// Export the buffer's whole pages as a dma-buf (and ask for SYNC_MEMOPS on it, as
    /// NVIDIA's GPUDirect RDMA guide says for memory a third-party device accesses). The
    /// dma-buf's byte 0 is the buffer's byte 0, so a registration uses offset 0 and the
    /// buffer's GPU address as iova.
    pub fn export_dma_buf(&self) -> Result<OwnedFd> {
        let Some(span) = self.pages else {
            bail!("only page-aligned GPU buffers can be exported as dma-buf");
        };
        let bound = self.gpu.bind()?;
        driver::set_sync_memops(&bound, self.ptr)?;
        Ok(driver::export_dma_buf(&bound, self.ptr, span)?)
    }

    /// Mark the buffer for peer-to-peer access by a NIC through nvidia-peermem.
    pub fn set_sync_memops(&self) -> Result<()> {
        Ok(driver::set_sync_memops(&self.gpu.bind()?, self.ptr)?)
    }

    /// The GPU address of byte 0: what a registration through nvidia-peermem or a dma-buf
    /// (its iova) uses. Reading it is harmless; using it needs `unsafe`.
    pub(crate) fn address(&self) -> u64 {
        self.ptr
    }

    /// Copy the first `out.len()` bytes to the host, after everything queued on the GPU's
    /// stream.
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        self.read_range_into(0, out)
    }

    /// Copy `out.len()` bytes from `offset` to the host, after the stream's work.
    pub fn read_range_into(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len, "read")?;
        self.gpu.synchronize()?;
        let bound = self.gpu.bind()?;
        // SAFETY: the range lies inside this buffer (checked), of the bound context; the
        // stream is idle and safe code cannot queue work on the buffer while we hold
        // `&self`'s borrow without going through an `unsafe` launch whose contract
        // excludes this read.
        unsafe { driver::memcpy_dtoh(&bound, out, self.ptr + offset as u64)? };
        Ok(())
    }

    /// Copy `data` into the buffer at `offset`, ordered after the stream's earlier work,
    /// and wait for it.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len, "write")?;
        let bound = self.gpu.bind()?;
        // SAFETY: the range lies inside this buffer (checked), of the bound context;
        // `&mut self` keeps everyone else off it, and `data` stays borrowed until we have
        // waited for the copy.
        unsafe {
            driver::memcpy_htod_async(
                &bound,
                self.ptr + offset as u64,
                data.as_ptr(),
                data.len(),
                self.gpu.stream(),
            )?
        };
        drop(bound);
        self.gpu.synchronize()
    }

    /// Bytes `range` of the buffer, to read with a kernel (verify part of a buffer).
    pub fn slice(&self, range: Range<usize>) -> Result<DeviceSlice<'_>> {
        let (ptr, len) = self.range_ptr(range)?;
        Ok(DeviceSlice {
            gpu: &self.gpu,
            ptr,
            len,
            _buffer: PhantomData,
        })
    }

    /// Bytes `range` of the buffer, to write with a kernel (e.g. with guard words left
    /// around it).
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<DeviceSliceMut<'_>> {
        let (ptr, len) = self.range_ptr(range)?;
        Ok(DeviceSliceMut {
            gpu: &self.gpu,
            ptr,
            len,
            _buffer: PhantomData,
        })
    }

    fn range_ptr(&self, range: Range<usize>) -> Result<(u64, usize)> {
        if range.end < range.start {
            bail!("bytes {range:?} end before they start");
        }
        check_range(range.start, range.len(), self.len, "a slice")?;
        Ok((self.ptr + range.start as u64, range.len()))
    }
}

fn check_range(offset: usize, len: usize, size: usize, what: &str) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        bail!("{what} of {len} bytes at offset {offset} is outside a {size}-byte buffer");
    }
    Ok(())
}

// SAFETY: [ptr, ptr + len) lies in an allocation of this buffer's context that lives
// until Drop; safe code reaches it only through this value.
unsafe impl GpuMemory for DeviceBuffer {
    fn gpu(&self) -> &Rc<Gpu> {
        &self.gpu
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len
    }
}

// SAFETY: `&mut DeviceBuffer` is the only way to its bytes while it is held (slices and
// registrations borrow the buffer).
unsafe impl GpuMemoryMut for DeviceBuffer {}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Queued work (an unsafe launch's caller must have waited, but be defensive)
        // finishes before the memory goes back.
        let _ = self.gpu.synchronize();
        if !self.owned {
            // The caller's memory goes back to it as it is.
            return;
        }
        let Ok(bound) = self.gpu.bind() else {
            eprintln!("warning: GPU memory not freed: its CUDA context could not be bound");
            return;
        };
        // SAFETY: allocated by mem_alloc in this context (bound), freed only here; every
        // registration borrows the buffer, so none is left; the context is alive (we
        // hold an Rc to it).
        report_free_error(unsafe { driver::mem_free(&bound, self.allocation) });
    }
}

/// Part of a [`DeviceBuffer`], borrowed from it: for kernels that read.
pub struct DeviceSlice<'a> {
    gpu: &'a Rc<Gpu>,
    ptr: u64,
    len: usize,
    _buffer: PhantomData<&'a DeviceBuffer>,
}

/// Part of a [`DeviceBuffer`], borrowed mutably from it: for kernels that write.
pub struct DeviceSliceMut<'a> {
    gpu: &'a Rc<Gpu>,
    ptr: u64,
    len: usize,
    _buffer: PhantomData<&'a mut DeviceBuffer>,
}

// SAFETY (both): a bounds-checked range of a DeviceBuffer, which the slice borrows for
// its whole life.
unsafe impl GpuMemory for DeviceSlice<'_> {
    fn gpu(&self) -> &Rc<Gpu> {
        self.gpu
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len
    }
}

// SAFETY: as above.
unsafe impl GpuMemory for DeviceSliceMut<'_> {
    fn gpu(&self) -> &Rc<Gpu> {
        self.gpu
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.len
    }
}

// SAFETY: the slice borrows its buffer mutably, so nothing else reaches these bytes.
unsafe impl GpuMemoryMut for DeviceSliceMut<'_> {}

/// Page-locked host memory from `cuMemHostAlloc`: the staging ring's slots. The NIC
/// reads it like any host memory; the GPU's copy engine writes it at full PCIe speed.
pub struct PinnedHostBuffer {
    gpu: Rc<Gpu>,
    host: NonNull<u8>,
    len: usize,
    /// Mapped into the GPU (`MappedHostBuffer`): never kept for reuse.
    mapped: bool,
}

impl PinnedHostBuffer {
    /// `len` bytes of page-locked memory: one kept from an earlier buffer of the same
    /// size and device (`idle_pinned`), or a new allocation.
    pub fn new(gpu: &Rc<Gpu>, len: usize) -> Result<Self> {
        if let Some(host) = idle_pinned::take(gpu.ordinal(), len.max(1)) {
            return Ok(PinnedHostBuffer {
                gpu: gpu.clone(),
                host,
                len,
                mapped: false,
            });
        }
        Self::alloc(gpu, len, false)
    }

    fn alloc(gpu: &Rc<Gpu>, len: usize, device_map: bool) -> Result<Self> {
        let host = driver::mem_host_alloc(&gpu.bind()?, len.max(1), device_map)?;
        let Some(host) = NonNull::new(host) else {
            bail!("cuMemHostAlloc returned no memory for {len} bytes");
        };
        // CUDA does not say that cuMemHostAlloc's memory is zeroed: write every byte once,
        // so no view of it (`as_bytes`) ever reads uninitialized memory.
        // SAFETY: the driver just allocated `len.max(1)` bytes at `host`, which nothing
        // else knows of yet.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, len.max(1)) };
        Ok(PinnedHostBuffer {
            gpu: gpu.clone(),
            host,
            len,
            mapped: device_map,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, for the CPU. `&mut self`: no registration borrows the buffer meanwhile,
    /// so no peer can write it while the slice lives; GPU work on it is started only
    /// through `unsafe` calls whose contracts exclude this read.
    pub fn as_bytes(&mut self) -> &[u8] {
        // SAFETY: host is valid for len bytes while self lives, all initialised (zeroed in
        // `alloc` when first allocated, and only ever written with bytes since, also while
        // kept for reuse); the exclusive borrow keeps
        // every other Rust access and every registration away.
        unsafe { std::slice::from_raw_parts(self.host.as_ptr(), self.len) }
    }

    /// Copy bytes `[offset, offset + out.len())` out, through the raw pointer: never a
    /// shared slice, because a peer may write the buffer while a remote-write region
    /// borrows it (`&self`).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len, "read")?;
        // SAFETY: inside the allocation (checked); `out` is another allocation (it is
        // borrowed mutably, which no view of this buffer can be while `&self` is shared).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.host.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// The base address, for the staging ring's copies (`unsafe` to use).
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.host.as_ptr()
    }
}

// SAFETY: the allocation lives, unmoved, until Drop, which cannot run while `&self` is
// borrowed by a registration.
unsafe impl Registrable for PinnedHostBuffer {
    fn target(&self) -> RegistrationTarget<'_> {
        RegistrationTarget::Host {
            ptr: self.host,
            len: self.len,
        }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        let _ = self.gpu.synchronize();
        if !self.mapped && idle_pinned::give_back(self.gpu.ordinal(), self.host, self.len.max(1)) {
            return;
        }
        let Ok(bound) = self.gpu.bind() else {
            eprintln!("warning: page-locked memory not freed: its CUDA context could not be bound");
            return;
        };
        // SAFETY: allocated by mem_host_alloc, freed only here, after its users (copies
        // are waited for above; registrations borrow the buffer, so none is left).
        report_free_error(unsafe { driver::mem_free_host(&bound, self.host.as_ptr()) });
    }
}

/// Page-locked buffers of transfers that ended, kept for the next that asks for the same
/// size on the same device.
///
/// Why: a staging ring (18 MiB for a sender of GPU memory, 4 MiB a stream for a receiver
/// into it) was allocated and freed for every transfer, and `cuMemHostAlloc` and
/// `cuMemFreeHost` page-lock and unlock every page: milliseconds a transfer, for a
/// library that sends many (the Python module's sends of CUDA tensors). Only memory of a
/// device whose primary context stays retained until the process ends ([`Resident`]) is
/// kept, so none outlives its context; at most [`IDLE_MAX`] bytes, the oldest freed first.
///
/// [`Resident`]: super::context::Resident
mod idle_pinned {
    use super::super::context::Resident;
    use super::{driver, report_free_error};
    use std::collections::VecDeque;
    use std::ptr::NonNull;
    use std::sync::Mutex;

    /// The most idle page-locked bytes kept, all devices together.
    pub const IDLE_MAX: usize = 256 << 20;

    struct Idle {
        ordinal: u32,
        /// The allocation's address (an integer: the list is shared between threads, and
        /// only the thread that takes it out dereferences it).
        host: usize,
        len: usize,
    }

    static IDLE: Mutex<VecDeque<Idle>> = Mutex::new(VecDeque::new());

    /// A kept allocation of exactly `len` bytes of device `ordinal`'s context, taken out
    /// of the list (nobody else holds it then).
    pub fn take(ordinal: u32, len: usize) -> Option<NonNull<u8>> {
        let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        let at = idle
            .iter()
            .position(|i| i.ordinal == ordinal && i.len == len)?;
        let kept = idle.remove(at)?;
        NonNull::new(kept.host as *mut u8)
    }

    /// Keep `len` bytes at `host`, allocated by `cuMemHostAlloc` without flags in device
    /// `ordinal`'s primary context and no longer used by anyone: true if kept, false if
    /// the caller must free them (that context is not kept for the process).
    pub fn give_back(ordinal: u32, host: NonNull<u8>, len: usize) -> bool {
        if Resident::loaded(ordinal).is_none() {
            return false;
        }
        let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
        idle.push_back(Idle {
            ordinal,
            host: host.as_ptr() as usize,
            len,
        });
        let mut total: usize = idle.iter().map(|i| i.len).sum();
        while total > IDLE_MAX {
            let Some(oldest) = idle.pop_front() else {
                break;
            };
            total -= oldest.len;
            // Every kept allocation's device has its Resident (checked as it was kept).
            let Some(kept_by) = Resident::loaded(oldest.ordinal) else {
                continue;
            };
            let Ok(bound) = kept_by.context.bind() else {
                eprintln!(
                    "warning: page-locked memory not freed: its CUDA context could not be bound"
                );
                continue;
            };
            // SAFETY: allocated by mem_host_alloc in that device's primary context (kept
            // retained by its Resident), taken out of the list, which held it alone.
            report_free_error(unsafe { driver::mem_free_host(&bound, oldest.host as *mut u8) });
        }
        true
    }
}

/// Page-locked host memory mapped into the GPU (`CU_MEMHOSTALLOC_DEVICEMAP`): kernels
/// write it directly over PCIe, the NIC reads it as host memory (the seed's method).
pub struct MappedHostBuffer {
    pinned: PinnedHostBuffer,
    device: u64,
}

impl MappedHostBuffer {
    pub fn new(gpu: &Rc<Gpu>, len: usize) -> Result<Self> {
        let pinned = PinnedHostBuffer::alloc(gpu, len, true)?;
        let device = driver::host_device_pointer(&gpu.bind()?, pinned.as_mut_ptr())?;
        Ok(MappedHostBuffer { pinned, device })
    }

    pub fn len(&self) -> usize {
        self.pinned.len
    }

    pub fn is_empty(&self) -> bool {
        self.pinned.len == 0
    }

    /// The bytes, for the CPU (`&mut self`, as [`PinnedHostBuffer::as_bytes`]).
    pub fn as_bytes(&mut self) -> &[u8] {
        self.pinned.as_bytes()
    }

    /// Copy bytes out from `offset` (as [`PinnedHostBuffer::read_at`]).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.pinned.read_at(offset, out)
    }
}

// SAFETY: the GPU address of the pinned allocation, valid in its context while the
// allocation lives (until Drop).
unsafe impl GpuMemory for MappedHostBuffer {
    fn gpu(&self) -> &Rc<Gpu> {
        &self.pinned.gpu
    }
    fn device_ptr(&self) -> u64 {
        self.device
    }
    fn byte_len(&self) -> usize {
        self.pinned.len
    }
}

// SAFETY: `&mut MappedHostBuffer` is the only way to its bytes while held (as_bytes and
// registrations borrow it).
unsafe impl GpuMemoryMut for MappedHostBuffer {}

// SAFETY: as for PinnedHostBuffer.
unsafe impl Registrable for MappedHostBuffer {
    fn target(&self) -> RegistrationTarget<'_> {
        self.pinned.target()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = GPU_PAGE as u64;

    #[test]
    fn an_aligned_base_is_used_as_it_is() {
        assert_eq!(
            page_aligned_within(16 * PAGE, 2 * GPU_PAGE, 4),
            Some((16 * PAGE, GPU_PAGE))
        );
    }

    #[test]
    fn a_misaligned_base_moves_the_buffer_to_the_next_page_inside_the_allocation() {
        for skew in [256u64, 4096, PAGE - 256] {
            let base = 16 * PAGE + skew;
            let (start, span) = page_aligned_within(base, 3 * GPU_PAGE, GPU_PAGE + 4).unwrap();
            assert_eq!(start, 17 * PAGE, "skew {skew}");
            assert_eq!(span, 2 * GPU_PAGE);
            assert!(start >= base && start + span as u64 <= base + 3 * PAGE);
        }
    }

    #[test]
    fn a_skew_that_would_wrap_or_leave_the_allocation_is_refused() {
        // The audit's case: a huge skew used to wrap `allocation + skew` in a release
        // build and give a buffer 4096 bytes before its allocation.
        let allocation = 16 * PAGE;
        assert_eq!(skewed_allocation_size(4, usize::MAX - 4095), None);
        assert_eq!(skewed_allocation_size(usize::MAX, 0), None);
        for skew in [
            usize::MAX,
            usize::MAX - 4095,
            (u64::MAX - allocation) as usize + 1,
        ] {
            assert_eq!(
                skewed_page_aligned_within(allocation, 3 * GPU_PAGE, 4, skew),
                None,
                "skew {skew}"
            );
        }
        // A skew past the allocation's end.
        assert_eq!(
            skewed_page_aligned_within(allocation, 2 * GPU_PAGE, 4, 2 * GPU_PAGE + 1),
            None
        );
        // And the ordinary case still works: inside the allocation, on a page.
        let allocated = skewed_allocation_size(GPU_PAGE + 4, 256).unwrap();
        let (start, span) =
            skewed_page_aligned_within(allocation, allocated, GPU_PAGE + 4, 256).unwrap();
        assert_eq!((start, span), (allocation + PAGE, 2 * GPU_PAGE));
        assert!(start + span as u64 <= allocation + allocated as u64);
    }

    #[test]
    fn a_buffer_that_does_not_fit_after_aligning_is_refused() {
        // Exactly one page allocated at a misaligned base: one page does not fit after it.
        assert_eq!(page_aligned_within(PAGE + 256, GPU_PAGE, 4), None);
        assert_eq!(page_aligned_within(u64::MAX - 10, GPU_PAGE, 4), None);
        assert_eq!(page_aligned_within(0, usize::MAX, usize::MAX), None);
    }
}
