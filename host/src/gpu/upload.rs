//! Receiving into GPU memory without a NIC that writes it: chunks land in a ring of
//! page-locked host slots and are copied into device memory asynchronously, so the copy
//! of chunk k overlaps the arrival of chunk k+1 (the TCP receiver's `--mem device`). The
//! mirror of the sender's staging ring ([`super::sources::StagedSource`]).

use super::allocations::{DeviceBuffer, PinnedHostBuffer};
use super::context::{Gpu, GpuMemory};
use super::driver::{self, Event, Stream};
use crate::memory::POISON;
use anyhow::{bail, Result};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Slots in the ring: a copy in flight per slot while the next chunks arrive.
const UPLOAD_SLOTS: usize = 4;

/// Device memory filled chunk by chunk through a pinned ring.
pub struct DeviceUpload {
    // Field order is drop order, and Drop waits for the copies first: the ring and the
    // device memory outlive every copy between them.
    events: Vec<Event>,
    /// Whether a copy out of the slot may still be running.
    pending: Vec<bool>,
    slot_bytes: usize,
    stream: Stream,
    ring: PinnedHostBuffer,
    memory: DeviceBuffer,
}

impl DeviceUpload {
    /// `len` bytes of page-aligned device memory, poisoned, filled in chunks of at most
    /// `chunk` bytes.
    pub fn new(gpu: &Rc<Gpu>, len: usize, chunk: usize) -> Result<Self> {
        let mut memory = DeviceBuffer::page_aligned(gpu, len)?;
        gpu.fill_d32(&mut memory, POISON)?;
        let slot_bytes = chunk.clamp(1, len.max(1));
        let Some(ring_bytes) = slot_bytes.checked_mul(UPLOAD_SLOTS) else {
            bail!("an upload ring of {UPLOAD_SLOTS} slots of {slot_bytes} bytes is too large");
        };
        let events = (0..UPLOAD_SLOTS)
            .map(|_| gpu.new_event(false))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceUpload {
            events,
            pending: vec![false; UPLOAD_SLOTS],
            slot_bytes,
            stream: gpu.new_stream()?,
            ring: PinnedHostBuffer::new(gpu, ring_bytes)?,
            memory,
        })
    }

    /// The device memory, once every copy into it has completed ([`finish`](Self::finish)):
    /// an error while any may still be in flight, so nobody verifies or reads memory a
    /// copy is still writing (a 1 GiB upload read right after its last `commit` had
    /// millions of elements still poisoned). Copies are queued only through `&mut self`,
    /// so none can start while the returned borrow lives.
    pub fn memory(&self) -> Result<&DeviceBuffer> {
        if let Some(slot) = self.pending.iter().position(|&p| p) {
            bail!("the copy out of upload slot {slot} may still be running: finish() the upload before reading its memory");
        }
        Ok(&self.memory)
    }

    /// Poison the device memory again (before a transfer), after every copy.
    pub fn poison(&mut self) -> Result<()> {
        self.finish()?;
        let gpu = self.memory.gpu().clone();
        gpu.fill_d32(&mut self.memory, POISON)
    }

    /// The slot for chunk `index`, of `len` bytes, to read the chunk into: free once the
    /// copy out of it (chunk `index - slots`) has completed, waited for until `deadline`.
    pub fn slot(&mut self, index: u64, len: usize, deadline: Instant) -> Result<&mut [u8]> {
        if len > self.slot_bytes {
            bail!(
                "a chunk of {len} bytes does not fit the upload ring's {}-byte slots",
                self.slot_bytes
            );
        }
        let slot = (index % UPLOAD_SLOTS as u64) as usize;
        self.await_slot(slot, deadline)?;
        let start = slot * self.slot_bytes;
        self.ring
            .range_mut(start..start + len)
            .ok_or_else(|| anyhow::anyhow!("slot {slot} is outside the upload ring"))
    }

    /// Queue the copy of chunk `index`'s `len` bytes, read into its slot, to `offset` of
    /// the device memory.
    pub fn commit(&mut self, index: u64, offset: usize, len: usize) -> Result<()> {
        let slot = (index % UPLOAD_SLOTS as u64) as usize;
        if len > self.slot_bytes
            || offset
                .checked_add(len)
                .is_none_or(|e| e > self.memory.len())
        {
            bail!(
                "chunk {index} ({len} bytes at {offset}) is outside the {}-byte buffer",
                self.memory.len()
            );
        }
        let start = slot * self.slot_bytes;
        let gpu = self.memory.gpu().clone();
        let bound = gpu.bind()?;
        // SAFETY: the device range lies inside our buffer (checked), of the bound context;
        // the slot [start, start + len) lies inside the pinned ring (slot < UPLOAD_SLOTS,
        // len <= slot_bytes) and nobody writes it until this copy's event has completed
        // (`slot` waits for it); Drop waits for every copy before the ring and the device
        // memory are freed.
        unsafe {
            driver::memcpy_htod_async(
                &bound,
                self.memory.address() + offset as u64,
                self.ring.as_mut_ptr().add(start),
                len,
                &self.stream,
            )?
        };
        drop(bound);
        self.events[slot].record(&self.stream)?;
        self.pending[slot] = true;
        Ok(())
    }

    /// Wait for every queued copy: the device memory then holds what arrived.
    pub fn finish(&mut self) -> Result<()> {
        self.stream.synchronize()?;
        self.pending.fill(false);
        Ok(())
    }

    fn await_slot(&mut self, slot: usize, deadline: Instant) -> Result<()> {
        if !self.pending[slot] {
            return Ok(());
        }
        while !self.events[slot].is_complete()? {
            if Instant::now() >= deadline {
                bail!("timed out waiting for a host-to-GPU copy");
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        self.pending[slot] = false;
        Ok(())
    }
}

impl Drop for DeviceUpload {
    fn drop(&mut self) {
        // Copies still queued read the ring and write the device memory: let them land.
        let _ = self.stream.synchronize();
    }
}
