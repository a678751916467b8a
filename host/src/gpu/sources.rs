//! The GPU's implementations of the sender's [`SendSource`] and the receiver's
//! [`RecvSink`]: where the kernel writes, and how the NIC gets at it.

use super::allocations::{DeviceBuffer, MappedHostBuffer, PinnedHostBuffer};
use super::capabilities;
use super::context::Gpu;
use super::driver::{self, Event, Stream};
use crate::memory::host_buffer::{leading_values, verify_bytes};
use crate::memory::{
    DataPath, RecvSink, Registrable, RegistrationTarget, SendSource, Verification, POISON,
};
use crate::memory_path::DeviceRegistration;
use anyhow::{bail, Result};
use gpu_kernels::pattern::ELEMENT_BYTES;
use std::cell::RefCell;
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

fn whole_elements(len: usize) -> Result<u64> {
    if !len.is_multiple_of(ELEMENT_BYTES) {
        bail!("size {len} is not a multiple of {ELEMENT_BYTES} bytes (one i32)");
    }
    Ok((len / ELEMENT_BYTES) as u64)
}

fn chunk_range(offset: usize, len: usize, total: usize) -> Result<Range<usize>> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(offset..end),
        _ => bail!("chunk of {len} bytes at {offset} is outside the {total}-byte data"),
    }
}

/// The first `count` elements of device memory, read back.
pub fn read_device_values(memory: &DeviceBuffer, count: usize) -> Result<Vec<i32>> {
    let mut bytes = vec![0u8; count.saturating_mul(ELEMENT_BYTES).min(memory.len())];
    memory.read_into(&mut bytes)?;
    Ok(leading_values(&bytes, count))
}

// ---------------------------------------------------------------------------------------

/// The seed's method: the kernel writes page-locked host memory mapped into the GPU,
/// over PCIe; the NIC then reads host memory. Not GPUDirect RDMA.
pub struct MappedSource {
    memory: MappedHostBuffer,
}

impl MappedSource {
    pub fn generate(gpu: &Rc<Gpu>, len: usize) -> Result<Self> {
        whole_elements(len)?;
        let mut memory = MappedHostBuffer::new(gpu, len)?;
        gpu.generate(&mut memory)?;
        Ok(MappedSource { memory })
    }
}

// SAFETY: memory() is the mapped buffer, owned for the source's life; chunks are ranges
// inside it (checked), never written after generation (kernels need `&mut`).
unsafe impl SendSource for MappedSource {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn memory(&self) -> &dyn Registrable {
        &self.memory
    }
    fn prepare_chunk(&self, offset: usize, len: usize, _: Instant) -> Result<Range<usize>> {
        chunk_range(offset, len, self.memory.len())
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        let mut bytes = vec![0u8; count.saturating_mul(ELEMENT_BYTES).min(self.memory.len())];
        self.memory.read_at(0, &mut bytes)?;
        Ok(leading_values(&bytes, count))
    }
    fn path(&self) -> DataPath {
        DataPath::GpuMappedHostMemory
    }
    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()> {
        self.memory.read_at(offset, dest)
    }
}

// ---------------------------------------------------------------------------------------

/// GPU memory the NIC reads or writes directly: GPUDirect RDMA. The buffer starts on a
/// 64 KiB GPU page, so a dma-buf of whole pages starts exactly at its byte 0.
pub struct GpuDirectBuffer {
    // Drop order: the dma-buf fd closes before the memory is freed (registrations borrow
    // the buffer, so they are gone by then).
    dma_buf: Option<OwnedFd>,
    memory: DeviceBuffer,
}

impl GpuDirectBuffer {
    /// Page-aligned device memory for `len` bytes, prepared for `method`.
    fn allocate(gpu: &Rc<Gpu>, len: usize, method: DeviceRegistration) -> Result<Self> {
        let memory = DeviceBuffer::page_aligned(gpu, len)?;
        Self::prepare(memory, method)
    }

    /// Export (dma-buf) or mark (peermem) `memory` for the NIC.
    pub fn prepare(memory: DeviceBuffer, method: DeviceRegistration) -> Result<Self> {
        let dma_buf = match method {
            DeviceRegistration::DmaBuf => Some(memory.export_dma_buf()?),
            DeviceRegistration::PeerMem => {
                memory.set_sync_memops()?;
                None
            }
        };
        Ok(GpuDirectBuffer { dma_buf, memory })
    }

    /// A sender's buffer, filled by the kernel.
    pub fn generate(gpu: &Rc<Gpu>, len: usize, method: DeviceRegistration) -> Result<Self> {
        whole_elements(len)?;
        let mut buffer = Self::allocate(gpu, len, method)?;
        gpu.generate(&mut buffer.memory)?;
        Ok(buffer)
    }

    /// A receiver's buffer, poisoned on the GPU's stream before anyone registers it, so a
    /// new buffer cannot hold an earlier transfer's pattern.
    pub fn receive(gpu: &Rc<Gpu>, len: usize, method: DeviceRegistration) -> Result<Self> {
        let mut buffer = Self::allocate(gpu, len, method)?;
        gpu.fill_d32(&mut buffer.memory, POISON)?;
        Ok(buffer)
    }

    /// The device memory (tests read it back and plant values in it).
    pub fn device(&self) -> &DeviceBuffer {
        &self.memory
    }

    /// The dma-buf's length, for the tests: `lseek(fd, 0, SEEK_END)`.
    pub fn dma_buf_len(&self) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let fd = self.dma_buf.as_ref()?;
        // SAFETY: lseek on an fd we own; SEEK_END on a dma-buf returns its size.
        let end = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) };
        (end >= 0).then_some(end as u64)
    }
}

// SAFETY: the device memory lives until Drop and the dma-buf fd stays open with it;
// neither can go while `&self` is borrowed.
unsafe impl Registrable for GpuDirectBuffer {
    fn target(&self) -> RegistrationTarget<'_> {
        let len = self.memory.len();
        let addr = self.memory.address();
        match &self.dma_buf {
            // Offset 0: the dma-buf starts at the buffer's byte 0 (it is page-aligned);
            // iova = the GPU address, so work requests use GPU addresses.
            Some(fd) => RegistrationTarget::DmaBuf {
                fd: fd.as_fd(),
                offset: 0,
                len,
                iova: addr,
            },
            None => RegistrationTarget::DeviceAddress { addr, len },
        }
    }
}

// SAFETY: memory() is this buffer; chunks are ranges inside it (checked), never written
// after generation (kernels and poison run only before a transfer, through the receiver's
// or generator's own calls, never while a sender's chunk is out).
unsafe impl SendSource for GpuDirectBuffer {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn memory(&self) -> &dyn Registrable {
        self
    }
    fn prepare_chunk(&self, offset: usize, len: usize, _: Instant) -> Result<Range<usize>> {
        chunk_range(offset, len, self.memory.len())
    }
    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        read_device_values(&self.memory, count)
    }
    fn path(&self) -> DataPath {
        DataPath::GpuDirectRdma
    }
    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()> {
        self.memory.read_range_into(offset, dest)
    }
    fn chunk_checksums(&self, chunk: usize) -> Option<Result<Vec<u32>>> {
        Some(super::checksum::crc32c_chunks(&self.memory, chunk as u64))
    }
}

// SAFETY: memory() is this buffer's device memory, of len bytes, for its life; the CPU
// never reads it through a reference (memset, the verify kernel and device-to-host
// copies only).
unsafe impl RecvSink for GpuDirectBuffer {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn memory(&self) -> &dyn Registrable {
        self
    }
    fn poison(&self) -> Result<()> {
        let words = self.memory.len() / ELEMENT_BYTES;
        let gpu = self.memory_gpu();
        let bound = gpu.bind()?;
        // SAFETY: whole words of our own buffer, of the bound context; the trait's
        // contract is that no receive is outstanding (so the NIC does not write it), and
        // we wait for the memset.
        unsafe {
            driver::memset_d32_async(&bound, self.memory.address(), POISON, words, gpu.stream())?
        };
        drop(bound);
        gpu.synchronize()
    }
    fn verify(&self, len: usize) -> Result<Verification> {
        self.see_nic_writes()?;
        let gpu = self.memory_gpu();
        let count = whole_elements(len)?;
        let check = gpu.verify(&self.memory.slice(0..len)?)?;
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
    // GPUDirect RDMA receive with checksums: written for real hardware, not run here
    // (no machine of this project has a GPU and an RDMA NIC together).
    fn crc32c_chunks(&self, range: Range<usize>, chunk: usize) -> Result<Vec<u32>> {
        self.see_nic_writes()?;
        super::checksum::crc32c_chunks(&self.memory.slice(range)?, chunk as u64)
    }
    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> Result<()> {
        self.see_nic_writes()?;
        let mut block = vec![0u8; len.min(WRITE_BLOCK)];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(WRITE_BLOCK);
            self.memory.read_range_into(at, &mut block[..n])?;
            out.write_all(&block[..n])?;
            at += n;
        }
        Ok(())
    }
}

/// Bytes copied from GPU memory to the host at a time to write them out.
const WRITE_BLOCK: usize = 8 << 20;

impl GpuDirectBuffer {
    fn memory_gpu(&self) -> &Rc<Gpu> {
        use super::context::GpuMemory;
        self.memory.gpu()
    }

    /// The NIC's writes must be visible to the GPU's kernels and copies, in order: see
    /// capabilities::writes_visibility.
    fn see_nic_writes(&self) -> Result<()> {
        let gpu = self.memory_gpu();
        match capabilities::writes_visibility(gpu.raw_device()) {
            capabilities::WritesVisibility::Ordered => Ok(()),
            capabilities::WritesVisibility::Flush => {
                Ok(driver::flush_gpudirect_rdma_writes(&gpu.bind()?)?)
            }
            capabilities::WritesVisibility::Unordered => bail!(
                "this GPU may see the NIC's writes out of order and offers no flush (cuFlushGPUDirectRDMAWrites): receiving into its memory cannot be verified; use --mem host"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------

/// Slots in the staging ring: enough that copies run ahead of the sends in flight.
pub const STAGING_SLOTS: usize = 18;
/// Chunks the wire may hold at once; the other slots are being filled by copies. As many
/// as the default `--depth`: a window of 6 leaves some of eight TCP streams with nothing
/// to write.
const STAGING_IN_FLIGHT: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// A copy of this chunk index is queued on the copy stream.
    Copying(usize),
    /// The wire is reading this chunk index.
    Sending(usize),
}

/// Where the ring stands in the current pass.
struct RingState {
    slots: Vec<SlotState>,
    /// The next chunk to copy in this pass.
    next_copy: usize,
}

/// GPU memory staged through a ring of page-locked host slots, registered once: the copy
/// of chunk k+1 overlaps the send of chunk k, so the pipeline runs at the slower of PCIe
/// and the wire rather than their sum. Each pass (transfer) starts again at chunk 0.
pub struct StagedSource {
    state: RefCell<RingState>,
    events: Vec<Event>,
    slot_bytes: usize,
    copy_stream: Stream,
    ring: PinnedHostBuffer,
    /// `None` only inside [`StagedSource::into_device`].
    device: Option<DeviceBuffer>,
}

impl StagedSource {
    /// The pattern in device memory, staged in slots of `chunk` bytes (the transfer's
    /// chunk size: `prepare_chunk` hands out exactly these chunks).
    pub fn generate(gpu: &Rc<Gpu>, len: usize, chunk: usize) -> Result<Self> {
        whole_elements(len)?;
        let mut device = DeviceBuffer::new(gpu, len)?;
        gpu.generate(&mut device)?;
        Self::over(device, chunk)
    }

    /// The device memory back, once the transfers are done (a library caller's buffer).
    pub fn into_device(mut self) -> DeviceBuffer {
        // Copies still queued read the device memory: let them land first.
        let _ = self.copy_stream.synchronize();
        self.device
            .take()
            .expect("a staged source holds its device memory")
    }

    fn device(&self) -> &DeviceBuffer {
        self.device
            .as_ref()
            .expect("a staged source holds its device memory until into_device")
    }

    /// Stage `device` (already filled) in slots of `chunk` bytes.
    pub fn over(device: DeviceBuffer, chunk: usize) -> Result<Self> {
        if chunk == 0 {
            bail!("chunk size must be positive");
        }
        let gpu = {
            use super::context::GpuMemory;
            device.gpu().clone()
        };
        let slot_bytes = chunk.min(device.len().max(1));
        let slots = STAGING_SLOTS.min(device.len().div_ceil(slot_bytes)).max(1);
        let Some(ring_bytes) = slots.checked_mul(slot_bytes) else {
            bail!("a staging ring of {slots} slots of {slot_bytes} bytes is too large");
        };
        let ring = PinnedHostBuffer::new(&gpu, ring_bytes)?;
        let events = (0..slots)
            .map(|_| gpu.new_event(false))
            .collect::<Result<Vec<_>>>()?;
        Ok(StagedSource {
            state: RefCell::new(RingState {
                slots: vec![SlotState::Free; slots],
                next_copy: 0,
            }),
            events,
            slot_bytes,
            copy_stream: gpu.new_stream()?,
            ring,
            device: Some(device),
        })
    }

    /// The ring's size in slots, and the bytes of one slot.
    pub fn ring_shape(&self) -> (usize, usize) {
        (self.events.len(), self.slot_bytes)
    }

    fn chunks(&self) -> usize {
        self.device().len().div_ceil(self.slot_bytes)
    }

    fn chunk_len(&self, index: usize) -> usize {
        self.slot_bytes
            .min(self.device().len() - index * self.slot_bytes)
    }

    /// Queue copies into every free slot, in chunk order.
    fn issue_copies(&self, state: &mut RingState) -> Result<()> {
        let slots = state.slots.len();
        let gpu = {
            use super::context::GpuMemory;
            self.device().gpu()
        };
        let bound = gpu.bind()?;
        while state.next_copy < self.chunks() {
            let index = state.next_copy;
            let slot = index % slots;
            if state.slots[slot] != SlotState::Free {
                break;
            }
            let offset = index * self.slot_bytes;
            // SAFETY: the slot lies in the pinned ring (slot < slots, the ring holds
            // slots * slot_bytes bytes) and is free: no copy pending, not handed to the
            // wire; nobody reads it until its event reports the copy done. The device
            // range lies inside our buffer (offset + chunk_len <= len), which nothing
            // writes after generation; both are of the bound context.
            unsafe {
                driver::memcpy_dtoh_async(
                    &bound,
                    self.ring.as_mut_ptr().add(slot * self.slot_bytes),
                    self.device().address() + offset as u64,
                    self.chunk_len(index),
                    &self.copy_stream,
                )?;
            }
            self.events[slot].record(&self.copy_stream)?;
            state.slots[slot] = SlotState::Copying(index);
            state.next_copy += 1;
        }
        Ok(())
    }

    /// Wait for slot `slot`'s copy, until `deadline`. Spins briefly first: a 1 MiB copy
    /// takes about 20 us, less than a sleep's granularity.
    fn await_copy(&self, slot: usize, index: usize, deadline: Instant) -> Result<()> {
        let spin_until = Instant::now() + Duration::from_micros(100);
        while !self.events[slot].is_complete()? {
            let now = Instant::now();
            if now >= deadline {
                bail!("timed out waiting for the GPU-to-host copy of chunk {index}");
            }
            if now < spin_until {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(10));
            }
        }
        Ok(())
    }
}

// SAFETY: memory() is the pinned ring, owned for the source's life; prepare_chunk hands
// out a slot only once its copy completed, and the slot is copied into again only after
// release_chunk freed it (SlotState), or after begin_pass found no slot with the wire.
unsafe impl SendSource for StagedSource {
    fn len(&self) -> usize {
        self.device().len()
    }

    fn memory(&self) -> &dyn Registrable {
        &self.ring
    }

    fn max_chunks_in_flight(&self) -> Option<usize> {
        Some(STAGING_IN_FLIGHT.min(self.events.len()))
    }

    fn begin_pass(&self) -> Result<()> {
        let mut state = self.state.borrow_mut();
        if let Some(SlotState::Sending(index)) = state
            .slots
            .iter()
            .find(|s| matches!(s, SlotState::Sending(_)))
        {
            bail!("chunk {index} of the previous transfer is still with the wire");
        }
        // Copies queued ahead by the last pass (none, after a complete one) are waited
        // for and discarded: this pass starts at chunk 0.
        self.copy_stream.synchronize()?;
        state.slots.fill(SlotState::Free);
        state.next_copy = 0;
        self.issue_copies(&mut state)
    }

    fn prepare_chunk(&self, offset: usize, len: usize, deadline: Instant) -> Result<Range<usize>> {
        let (slots, slot_bytes) = self.ring_shape();
        if !offset.is_multiple_of(slot_bytes) || offset >= self.device().len() {
            bail!("staged chunks start at multiples of the {slot_bytes}-byte slot, inside the data; {offset} does not");
        }
        let index = offset / slot_bytes;
        if len != self.chunk_len(index) {
            bail!(
                "chunk {index} is {len} bytes, but the staging ring holds {slots} slots of {slot_bytes} bytes (the largest chunk it can stage): use chunks of {slot_bytes} bytes"
            );
        }
        let mut state = self.state.borrow_mut();
        self.issue_copies(&mut state)?;
        let slot = index % slots;
        if state.slots[slot] != SlotState::Copying(index) {
            bail!(
                "chunk {index} was asked for out of order (staging ring slot {slot} holds {:?})",
                state.slots[slot]
            );
        }
        self.await_copy(slot, index, deadline)?;
        state.slots[slot] = SlotState::Sending(index);
        let start = slot * slot_bytes;
        Ok(start..start + len)
    }

    /// # Safety
    /// As [`SendSource::release_chunk`] says: the wire no longer reads the chunk.
    unsafe fn release_chunk(&self, offset: usize) {
        let index = offset / self.slot_bytes;
        let mut state = self.state.borrow_mut();
        let slot = index % state.slots.len();
        if state.slots[slot] == SlotState::Sending(index) {
            state.slots[slot] = SlotState::Free;
        }
        // A failure here resurfaces from the next prepare_chunk's issue_copies.
        let _ = self.issue_copies(&mut state);
    }

    fn first_values(&self, count: usize) -> Result<Vec<i32>> {
        read_device_values(self.device(), count)
    }

    fn path(&self) -> DataPath {
        DataPath::StagedThroughHostMemory
    }

    fn copy_out(&self, offset: usize, dest: &mut [u8]) -> Result<()> {
        self.device().read_range_into(offset, dest)
    }

    fn chunk_checksums(&self, chunk: usize) -> Option<Result<Vec<u32>>> {
        Some(super::checksum::crc32c_chunks(self.device(), chunk as u64))
    }
}

impl Drop for StagedSource {
    fn drop(&mut self) {
        // Copies still queued write the ring: let them land before it is freed.
        let _ = self.copy_stream.synchronize();
    }
}

/// Copy a device buffer back and check it on the CPU (the tests' second opinion on the
/// verify kernel).
pub fn verify_on_cpu(memory: &DeviceBuffer) -> Result<Verification> {
    let mut bytes = vec![0u8; memory.len()];
    memory.read_into(&mut bytes)?;
    Ok(verify_bytes(&bytes))
}
