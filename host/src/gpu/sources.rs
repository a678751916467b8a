//! The GPU's implementations of the sender's [`SendSource`] and the receiver's
//! [`RecvSink`]: where the kernel writes, and how the NIC gets at it.

use super::allocations::{DeviceMemory, PinnedHostMemory};
use super::capabilities;
use super::context::Gpu;
use super::driver;
use crate::memory::host_buffer::verify_bytes;
use crate::memory::select::DeviceRegistration;
use crate::memory::{DataPath, RecvSink, Registration, SendSource, Verification};
use anyhow::{bail, Context as _, Result};
use cust::event::{Event, EventFlags, EventStatus};
use cust::stream::{Stream, StreamFlags};
use gpu_kernels::pattern::ELEMENT_BYTES;
use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

fn elements(len: usize) -> Result<u64> {
    if !len.is_multiple_of(ELEMENT_BYTES) {
        bail!("size {len} is not a multiple of {ELEMENT_BYTES} bytes (one i32)");
    }
    Ok((len / ELEMENT_BYTES) as u64)
}

/// The first `count` whole elements of `bytes`.
pub(crate) fn leading_values(bytes: &[u8], count: usize) -> Vec<i32> {
    bytes
        .chunks_exact(ELEMENT_BYTES)
        .take(count)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_device_values(memory: &DeviceMemory, count: usize) -> Result<Vec<i32>> {
    let mut bytes = vec![0u8; (count * ELEMENT_BYTES).min(memory.len())];
    memory.read_into(&mut bytes)?;
    Ok(leading_values(&bytes, count))
}

// ---------------------------------------------------------------------------------------

/// The seed's method: the kernel writes page-locked host memory mapped into the GPU,
/// over PCIe; the NIC then reads host memory. Not GPUDirect RDMA.
pub struct MappedSource {
    memory: PinnedHostMemory,
    _gpu: Rc<Gpu>,
}

impl MappedSource {
    pub fn generate(gpu: Rc<Gpu>, len: usize) -> Result<Self> {
        let count = elements(len)?;
        let memory = PinnedHostMemory::mapped(len)?;
        let device = memory
            .device_ptr()
            .context("mapped memory has no device address")?;
        gpu.generate(device, count)?;
        Ok(MappedSource { memory, _gpu: gpu })
    }
}

impl SendSource for MappedSource {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn registration(&self) -> Registration {
        Registration::Host {
            addr: self.memory.host_ptr(),
            len: self.memory.len(),
        }
    }
    fn prepare_chunk(&mut self, offset: usize, _len: usize, _deadline: Instant) -> Result<u64> {
        Ok(self.memory.host_ptr() as u64 + offset as u64)
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        Ok(leading_values(self.memory.as_bytes(), count))
    }
    fn path(&self) -> DataPath {
        DataPath::GpuMappedHostMemory
    }
}

// ---------------------------------------------------------------------------------------

/// GPU memory the NIC reads or writes directly: GPUDirect RDMA.
pub struct GpuDirectBuffer {
    // Drop order: the dma-buf fd closes before the memory is freed (the RDMA layer has
    // deregistered its MR before the buffer is dropped).
    dma_buf: Option<(OwnedFd, u64)>,
    memory: DeviceMemory,
    gpu: Rc<Gpu>,
}

impl GpuDirectBuffer {
    /// Device memory for `len` bytes, prepared for `method`.
    pub fn new(gpu: Rc<Gpu>, len: usize, method: DeviceRegistration) -> Result<Self> {
        let memory = DeviceMemory::new(len)?;
        let dma_buf = match method {
            DeviceRegistration::DmaBuf => Some(memory.export_dma_buf()?),
            DeviceRegistration::PeerMem => {
                driver::set_sync_memops(memory.ptr())?;
                None
            }
        };
        Ok(GpuDirectBuffer {
            dma_buf,
            memory,
            gpu,
        })
    }

    /// A sender's buffer, filled by the kernel.
    pub fn generate(gpu: Rc<Gpu>, len: usize, method: DeviceRegistration) -> Result<Self> {
        let count = elements(len)?;
        let buffer = Self::new(gpu, len, method)?;
        buffer.gpu.generate(buffer.memory.ptr(), count)?;
        Ok(buffer)
    }

    fn registration(&self) -> Registration {
        match &self.dma_buf {
            Some((fd, offset)) => Registration::DmaBuf {
                fd: fd.as_raw_fd(),
                offset: *offset,
                len: self.memory.len(),
                iova: self.memory.ptr(),
            },
            None => Registration::DeviceAddress {
                addr: self.memory.ptr(),
                len: self.memory.len(),
            },
        }
    }

    /// The dma-buf's length and the fd's validity, for the H200 self-check.
    pub fn dma_buf_len(&self) -> Option<u64> {
        let (fd, _) = self.dma_buf.as_ref()?;
        // SAFETY: lseek on an fd we own; SEEK_END on a dma-buf returns its size.
        let end = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
        (end >= 0).then_some(end as u64)
    }
}

impl SendSource for GpuDirectBuffer {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn registration(&self) -> Registration {
        GpuDirectBuffer::registration(self)
    }
    fn prepare_chunk(&mut self, offset: usize, _len: usize, _deadline: Instant) -> Result<u64> {
        Ok(self.memory.ptr() + offset as u64)
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        read_device_values(&self.memory, count)
    }
    fn path(&self) -> DataPath {
        DataPath::GpuDirectRdma
    }
}

impl RecvSink for GpuDirectBuffer {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn registration(&self) -> Registration {
        GpuDirectBuffer::registration(self)
    }
    fn verify(&mut self, len: usize) -> Result<Verification> {
        // Make the NIC's writes visible to the verify kernel first (see needs_flush).
        let (unordered, can_flush) = capabilities::needs_flush(self.gpu.raw_device());
        if can_flush {
            driver::flush_gpudirect_rdma_writes()?;
        } else if unordered {
            eprintln!(
                "warning: this GPU neither orders nor can flush NIC writes; the check may see stale data"
            );
        }
        let count = elements(len)?;
        let check = self.gpu.verify(self.memory.ptr(), count)?;
        Ok(Verification {
            elements: count,
            mismatches: check.mismatches,
            first_mismatch: check.first_mismatch,
            crc32: None, // checked on the GPU: the bytes never come back to the CPU
        })
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        read_device_values(&self.memory, count)
    }
    fn path(&self) -> DataPath {
        DataPath::GpuDirectRdma
    }
}

// ---------------------------------------------------------------------------------------

/// Slots in the staging ring: enough that copies run ahead of the sends in flight.
const STAGING_SLOTS: usize = 8;
/// Chunks the NIC may hold at once; the other slots are being filled by copies.
const STAGING_IN_FLIGHT: usize = 6;

#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// A copy of this chunk index is queued on the copy stream.
    Copying(usize),
    /// The NIC is reading this chunk index.
    Sending(usize),
}

/// GPU memory staged through a ring of registered, page-locked host slots: the copy of
/// chunk k+1 overlaps the send of chunk k, so the pipeline runs at the slower of PCIe and
/// the network rather than their sum.
pub struct StagedSource {
    ring: PinnedHostMemory,
    slots: Vec<(SlotState, Event)>,
    chunk: usize,
    next_copy: usize,
    copy_stream: Stream,
    device: DeviceMemory,
    _gpu: Rc<Gpu>,
}

impl StagedSource {
    pub fn generate(gpu: Rc<Gpu>, len: usize, chunk: usize) -> Result<Self> {
        if chunk == 0 {
            bail!("chunk size must be positive");
        }
        let count = elements(len)?;
        let device = DeviceMemory::new(len)?;
        gpu.generate(device.ptr(), count)?;
        let slots = STAGING_SLOTS.min(len.div_ceil(chunk)).max(1);
        let ring = PinnedHostMemory::unmapped(slots * chunk)?;
        let events = (0..slots)
            .map(|_| Ok((SlotState::Free, Event::new(EventFlags::DISABLE_TIMING)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(StagedSource {
            ring,
            slots: events,
            chunk,
            next_copy: 0,
            copy_stream: Stream::new(StreamFlags::NON_BLOCKING, None)?,
            device,
            _gpu: gpu,
        })
    }

    fn chunks(&self) -> usize {
        self.device.len().div_ceil(self.chunk)
    }

    fn slot_addr(&self, slot: usize) -> *mut u8 {
        // SAFETY: slot < slots, and the ring holds slots * chunk bytes.
        unsafe { self.ring.host_ptr().add(slot * self.chunk) }
    }

    /// Queue copies into every free slot, in chunk order.
    fn issue_copies(&mut self) -> Result<()> {
        while self.next_copy < self.chunks() {
            let slot = self.next_copy % self.slots.len();
            if self.slots[slot].0 != SlotState::Free {
                break;
            }
            let offset = self.next_copy * self.chunk;
            let len = self.chunk.min(self.device.len() - offset);
            // SAFETY: the slot is free (no copy pending, not posted to the NIC), lies in
            // the pinned ring, and stays untouched until its event reports the copy done.
            unsafe {
                driver::memcpy_dtoh_async(
                    self.slot_addr(slot),
                    self.device.ptr() + offset as u64,
                    len,
                    self.copy_stream.as_inner(),
                )?;
            }
            self.slots[slot].1.record(&self.copy_stream)?;
            self.slots[slot].0 = SlotState::Copying(self.next_copy);
            self.next_copy += 1;
        }
        Ok(())
    }
}

impl SendSource for StagedSource {
    fn len(&self) -> usize {
        self.device.len()
    }

    fn registration(&self) -> Registration {
        Registration::Host {
            addr: self.ring.host_ptr(),
            len: self.ring.len(),
        }
    }

    fn max_chunks_in_flight(&self) -> Option<usize> {
        Some(STAGING_IN_FLIGHT.min(self.slots.len()))
    }

    fn prepare_chunk(&mut self, offset: usize, _len: usize, deadline: Instant) -> Result<u64> {
        if !offset.is_multiple_of(self.chunk) {
            bail!(
                "staged chunks must start at multiples of {} bytes",
                self.chunk
            );
        }
        let index = offset / self.chunk;
        self.issue_copies()?;
        let slot = index % self.slots.len();
        if self.slots[slot].0 != SlotState::Copying(index) {
            bail!("chunk {index} was asked for out of order (staging ring slot {slot} is busy)");
        }
        // Every wait has a deadline: poll the copy's event rather than block on it.
        while self.slots[slot].1.query()? != EventStatus::Ready {
            if Instant::now() >= deadline {
                bail!("timed out waiting for the GPU-to-host copy of chunk {index}");
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        self.slots[slot].0 = SlotState::Sending(index);
        Ok(self.slot_addr(slot) as u64)
    }

    fn release_chunk(&mut self, offset: usize) {
        let index = offset / self.chunk;
        let slot = index % self.slots.len();
        if self.slots[slot].0 == SlotState::Sending(index) {
            self.slots[slot].0 = SlotState::Free;
        }
        // A failure here resurfaces from the next prepare_chunk's issue_copies.
        let _ = self.issue_copies();
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        read_device_values(&self.device, count)
    }

    fn path(&self) -> DataPath {
        DataPath::StagedThroughHostMemory
    }
}

/// Copy a device buffer back and check it on the CPU (the tests' second opinion on the
/// verify kernel).
pub fn verify_on_cpu(memory: &DeviceMemory) -> Result<Verification> {
    let mut bytes = vec![0u8; memory.len()];
    memory.read_into(&mut bytes)?;
    Ok(verify_bytes(&bytes))
}
