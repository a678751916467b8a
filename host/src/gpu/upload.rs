//! Receiving into GPU memory without a NIC that writes it: bytes land in slots of a ring
//! of page-locked host memory and are copied into device memory asynchronously, so the
//! copy of one slot overlaps the arrival of the next (the TCP receiver's `--mem device`).
//! The mirror of the sender's staging ring ([`super::sources::StagedSource`]).
//!
//! Several writers fill the ring at once ([`DeviceUpload::fill`]): one thread per TCP
//! stream, each with slots of its own, while the calling thread, which owns the GPU,
//! queues the copies and hands each slot back to its writer once its copy has landed.
//! Slots have a fixed size whatever chunk size the peer chose, so the ring costs
//! `writers × SLOTS_PER_WRITER × slot` bytes, not a multiple of the peer's chunk.

use super::allocations::{DeviceBuffer, PinnedHostBuffer};
use super::context::{Gpu, GpuMemory};
use super::driver::{self, Event, Stream};
use crate::memory::POISON;
use anyhow::{bail, Result};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Slots each writer owns: one being filled, the others' copies in flight.
pub const SLOTS_PER_WRITER: usize = 4;
/// The largest slot: bigger chunks are written in slot-sized pieces.
pub const MAX_SLOT_BYTES: usize = 1 << 20;
/// How often the owning thread looks at the copies in flight while it waits for a slot.
const COPY_POLL: Duration = Duration::from_micros(50);

/// The page-locked bytes `upload` holds for `writers` writers of at most `chunk`-byte
/// pieces: what the receiver counts against `--max-memory` besides the device buffer.
pub fn ring_bytes(writers: usize, chunk: usize) -> Option<usize> {
    writers
        .max(1)
        .checked_mul(SLOTS_PER_WRITER)?
        .checked_mul(chunk.clamp(1, MAX_SLOT_BYTES))
}

/// Device memory filled through a pinned ring.
pub struct DeviceUpload {
    // Field order is drop order, and Drop waits for the copies first: the ring and the
    // device memory outlive every copy between them.
    events: Vec<Event>,
    /// Whether a copy out of the slot may still be running.
    pending: Vec<bool>,
    slot_bytes: usize,
    writers: usize,
    stream: Stream,
    ring: PinnedHostBuffer,
    memory: DeviceBuffer,
}

/// A slot's bytes, lent to one writer thread. Only [`DeviceUpload::fill`] makes these and
/// passes them through its channels, one owner at a time.
struct Lent {
    slot: usize,
    base: *mut u8,
    len: usize,
}

// SAFETY: a lent slot is a range of the pinned ring that exactly one thread holds at a
// time (fill's protocol: the owner thread gives it out, the writer gives it back), and
// the ring outlives fill's scope, in which every writer thread ends.
unsafe impl Send for Lent {}

/// A writer's end of [`DeviceUpload::fill`]: put bytes into device memory.
///
/// `'f` brands one call of `fill` (invariant, and chosen by `fill` for each call): a
/// writer cannot be swapped into another fill's closure (two nested fills' writers are
/// of different types) nor kept past its fill, so its slots are always of a ring that is
/// still alive and whose owner is still copying.
pub struct SlotWriter<'f> {
    free: mpsc::Receiver<Lent>,
    filled: mpsc::Sender<(Lent, usize)>,
    slot_bytes: usize,
    timeout: Duration,
    _fill: PhantomData<fn(&'f ()) -> &'f ()>,
}

impl SlotWriter<'_> {
    /// The most bytes one [`write_at`](Self::write_at) takes.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Have `fill` write `len` (at most a slot) bytes, to land at `offset` of the device
    /// memory: it gets a free slot of this writer (waiting up to the timeout for a copy to
    /// give one back), `fill` writes it, and the copy into device memory is queued.
    pub fn write_at(
        &mut self,
        offset: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        if len > self.slot_bytes {
            return Err(format!(
                "{len} bytes do not fit the upload ring's {}-byte slots",
                self.slot_bytes
            ));
        }
        let lent = match self.free.recv_timeout(self.timeout) {
            Ok(lent) => lent,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err("timed out waiting for a host-to-GPU copy to free a slot".into())
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("the copies into GPU memory stopped".into())
            }
        };
        // SAFETY: this thread alone holds the slot (it came through our channel, and goes
        // back only through `filled` below); [base, base + len) lies inside it (len <=
        // slot_bytes, checked) and inside the ring, which outlives fill's scope.
        let bytes = unsafe { std::slice::from_raw_parts_mut(lent.base, len) };
        fill(bytes)?;
        self.filled
            .send((Lent { len, ..lent }, offset))
            .map_err(|_| "the copies into GPU memory stopped".to_string())
    }
}

impl DeviceUpload {
    /// `len` bytes of page-aligned device memory, poisoned, filled by up to `writers`
    /// writers at once in pieces of at most `chunk` bytes (and of at most
    /// [`MAX_SLOT_BYTES`]).
    pub fn new(gpu: &Rc<Gpu>, len: usize, chunk: usize, writers: usize) -> Result<Self> {
        // Whole 32-bit words, so the poison (cuMemsetD32) covers a byte length that is
        // not (the user's data): the bytes past `len` are never read.
        let words = len
            .checked_next_multiple_of(4)
            .ok_or_else(|| anyhow::anyhow!("{len} bytes of GPU memory cannot be allocated"))?;
        let memory = DeviceBuffer::page_aligned(gpu, words)?;
        Self::over(gpu, memory, len, chunk, writers)
    }

    /// As [`new`](Self::new), into `memory` (of `gpu`) that is there already: a caller's
    /// own (`DeviceBuffer::borrowed`), of any alignment. The first `len` bytes are filled.
    pub fn over(
        gpu: &Rc<Gpu>,
        mut memory: DeviceBuffer,
        len: usize,
        chunk: usize,
        writers: usize,
    ) -> Result<Self> {
        if memory.len() < len {
            bail!(
                "{len} bytes do not fit a GPU buffer of {} bytes",
                memory.len()
            );
        }
        gpu.fill_any(&mut memory, POISON)?;
        let writers = writers.max(1);
        let slot_bytes = chunk.clamp(1, MAX_SLOT_BYTES).min(len.max(1));
        let Some(ring_bytes) = ring_bytes(writers, slot_bytes) else {
            bail!("an upload ring for {writers} writers of {slot_bytes}-byte slots is too large");
        };
        let slots = writers * SLOTS_PER_WRITER;
        let events = (0..slots)
            .map(|_| gpu.new_event(false))
            .collect::<Result<Vec<_>>>()?;
        Ok(DeviceUpload {
            events,
            pending: vec![false; slots],
            slot_bytes,
            writers,
            stream: gpu.new_stream()?,
            ring: PinnedHostBuffer::new(gpu, ring_bytes)?,
            memory,
        })
    }

    /// The device memory, once every copy into it has completed (fill and
    /// [`finish`](Self::finish) end with them all done): an error while any may still be
    /// in flight, so nobody verifies or reads memory a copy is still writing (a 1 GiB
    /// upload read right after its last copy was queued had millions of elements still
    /// poisoned). Copies are queued only through `&mut self`, so none can start while the
    /// returned borrow lives.
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
        gpu.fill_any(&mut self.memory, POISON)
    }

    /// Wait for every queued copy: the device memory then holds what arrived.
    pub fn finish(&mut self) -> Result<()> {
        self.stream.synchronize()?;
        self.pending.fill(false);
        Ok(())
    }

    /// Run `write` on `writers` threads at once (at most the ring's), the `k`-th with a
    /// [`SlotWriter`] of its own (slots `k * SLOTS_PER_WRITER ..`), while this thread
    /// queues each filled slot's copy into device memory and gives the slot back to its
    /// writer once the copy has landed. Returns when every writer has returned and every
    /// copy has landed: the first error of a writer or of a copy, if any. `timeout` bounds
    /// every wait (a writer's for a free slot; this thread's for the next filled one).
    pub fn fill(
        &mut self,
        writers: usize,
        timeout: Duration,
        write: impl for<'f> Fn(usize, &mut SlotWriter<'f>) -> Result<(), String> + Sync,
    ) -> Result<(), String> {
        if writers == 0 || writers > self.writers {
            return Err(format!(
                "{writers} writers for an upload ring made for {}",
                self.writers
            ));
        }
        self.finish().map_err(|e| format!("{e:#}"))?;
        let (filled_tx, filled) = mpsc::channel::<(Lent, usize)>();
        let mut frees = Vec::with_capacity(writers);
        let mut ends = Vec::with_capacity(writers);
        for k in 0..writers {
            let (free_tx, free) = mpsc::channel::<Lent>();
            for slot in k * SLOTS_PER_WRITER..(k + 1) * SLOTS_PER_WRITER {
                let lent = self.lend(slot);
                free_tx.send(lent).expect("the receiver is in this scope");
            }
            frees.push(free_tx);
            ends.push(SlotWriter {
                free,
                filled: filled_tx.clone(),
                slot_bytes: self.slot_bytes,
                timeout,
                _fill: PhantomData,
            });
        }
        drop(filled_tx);
        let write = &write;
        std::thread::scope(|scope| {
            let threads: Vec<_> = ends
                .into_iter()
                .enumerate()
                .map(|(k, mut end)| scope.spawn(move || write(k, &mut end)))
                .collect();
            let copied = self.copy_until_done(&filled, &frees, timeout);
            // Writers still waiting for a slot stop now (their channel closes).
            drop(frees);
            let mut first = copied.err();
            for t in threads {
                let result = t.join().unwrap_or_else(|_| Err("a writer panicked".into()));
                if let (None, Err(e)) = (&first, result) {
                    first = Some(e);
                }
            }
            first.map_or(Ok(()), Err)
        })?;
        self.finish().map_err(|e| format!("{e:#}"))
    }

    /// The ring's slots as (base address, length), for a receiver whose reader threads
    /// live longer than one [`fill`](Self::fill) and hand slots around themselves (the
    /// TCP link, `net::tcp::recv`). What [`queue_copy`](Self::queue_copy) needs of them
    /// is in its safety contract.
    pub(crate) fn slot_addresses(&self) -> Vec<(usize, usize)> {
        (0..self.events.len())
            .map(|slot| {
                let lent = self.lend(slot);
                (lent.base as usize, lent.len)
            })
            .collect()
    }

    /// Queue the copy of slot `slot`'s first `len` bytes to `offset` of the device
    /// memory (bounds checked).
    ///
    /// # Safety
    /// Nobody writes the slot from now until [`copy_landed`](Self::copy_landed) says its
    /// copy landed (the caller gives the slot out again only then).
    pub(crate) unsafe fn queue_copy(
        &mut self,
        slot: usize,
        offset: usize,
        len: usize,
    ) -> Result<(), String> {
        let lent = Lent {
            len,
            ..self.lend(slot.min(self.events.len().saturating_sub(1)))
        };
        if slot >= self.events.len() {
            return Err(format!("upload slot {slot} of {}", self.events.len()));
        }
        self.copy(&lent, offset)
    }

    /// Whether the copy out of slot `slot` has landed (or none was queued).
    pub(crate) fn copy_landed(&mut self, slot: usize) -> Result<bool, String> {
        if !self.pending.get(slot).copied().unwrap_or(false) {
            return Ok(true);
        }
        let done = self.events[slot]
            .is_complete()
            .map_err(|e| format!("a host-to-GPU copy failed: {e}"))?;
        if done {
            self.pending[slot] = false;
        }
        Ok(done)
    }

    /// Slot `slot` as a [`Lent`]: its base address in the ring and its size.
    fn lend(&self, slot: usize) -> Lent {
        Lent {
            slot,
            // In bounds: slot < events.len() = writers * SLOTS_PER_WRITER, and the ring
            // holds that many slots of slot_bytes.
            base: self.ring.as_mut_ptr().wrapping_add(slot * self.slot_bytes),
            len: self.slot_bytes,
        }
    }

    /// The owner's side of [`fill`](Self::fill): queue each filled slot's copy, return
    /// each slot whose copy landed to its writer, until every writer has hung up.
    fn copy_until_done(
        &mut self,
        filled: &mpsc::Receiver<(Lent, usize)>,
        frees: &[mpsc::Sender<Lent>],
        timeout: Duration,
    ) -> Result<(), String> {
        let mut in_flight: VecDeque<usize> = VecDeque::new();
        let mut waited_since = Instant::now();
        loop {
            // Give back every slot whose copy has landed (copies land in queue order).
            while let Some(&slot) = in_flight.front() {
                if !self.events[slot]
                    .is_complete()
                    .map_err(|e| format!("a host-to-GPU copy failed: {e}"))?
                {
                    break;
                }
                in_flight.pop_front();
                self.pending[slot] = false;
                // A writer that has finished no longer listens: nothing to give back.
                let _ = frees[slot / SLOTS_PER_WRITER].send(self.lend(slot));
            }
            let wait = if in_flight.is_empty() {
                timeout
            } else {
                COPY_POLL
            };
            match filled.recv_timeout(wait) {
                Ok((lent, offset)) => {
                    self.copy(&lent, offset)?;
                    in_flight.push_back(lent.slot);
                    waited_since = Instant::now();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if in_flight.is_empty() && waited_since.elapsed() >= timeout {
                        return Err(format!(
                            "no data for GPU memory within {}",
                            crate::rdma::format_duration(timeout)
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
    }

    /// Queue the copy of `lent`'s bytes to `offset` of the device memory.
    fn copy(&mut self, lent: &Lent, offset: usize) -> Result<(), String> {
        let slot = lent.slot;
        if slot >= self.events.len()
            || lent.len > self.slot_bytes
            || offset
                .checked_add(lent.len)
                .is_none_or(|e| e > self.memory.len())
        {
            return Err(format!(
                "{} bytes at {offset} are outside the {}-byte GPU buffer",
                lent.len,
                self.memory.len()
            ));
        }
        let gpu = self.memory.gpu().clone();
        let queued = (|| -> Result<()> {
            let bound = gpu.bind()?;
            // SAFETY: the device range lies inside our buffer (checked), of the bound
            // context; the slot's [base, base + len) lies inside the pinned ring (slot and
            // len checked) and its writer handed it back: nobody writes it until this
            // copy's event has completed (copy_until_done lends it out only then), and
            // Drop waits for every copy before the ring and the device memory are freed.
            unsafe {
                driver::memcpy_htod_async(
                    &bound,
                    self.memory.address() + offset as u64,
                    self.ring.as_mut_ptr().add(slot * self.slot_bytes),
                    lent.len,
                    &self.stream,
                )?
            };
            drop(bound);
            self.events[slot].record(&self.stream)?;
            Ok(())
        })();
        queued.map_err(|e| format!("queueing a copy into GPU memory: {e:#}"))?;
        self.pending[slot] = true;
        Ok(())
    }
}

impl Drop for DeviceUpload {
    fn drop(&mut self) {
        // Copies still queued read the ring and write the device memory: let them land.
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_bounded_by_the_slot_not_by_the_peers_chunk() {
        // A single 1 GiB chunk used to make 4 GiB of page-locked slots.
        assert_eq!(
            ring_bytes(1, 1 << 30),
            Some(SLOTS_PER_WRITER * MAX_SLOT_BYTES)
        );
        assert_eq!(ring_bytes(8, 4096), Some(8 * SLOTS_PER_WRITER * 4096));
        assert_eq!(ring_bytes(0, 0), Some(SLOTS_PER_WRITER));
        assert_eq!(ring_bytes(usize::MAX, 1 << 20), None);
    }
}
