//! Where a TCP receiver puts the data: host memory, read straight from the sockets by one
//! thread per stream, or GPU memory through a host chunk buffer.

use super::frames::{Frame, FRAME_LEN};
use super::socket::{self, ReadStop};
use crate::memory::{DataPath, HostBuffer, RecvSink, Verification};
use crate::transfer::plan::{Chunk, ChunkPlan};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The bounds of a transfer's reads: no wait longer than `timeout`, and with `--min-rate`
/// nothing past `deadline` (the whole transfer's, see the receiver).
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    pub timeout: Duration,
    pub deadline: Option<Instant>,
}

/// Why a receive stopped short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The whole-transfer deadline passed: the sender is below `--min-rate`.
    TooSlow,
    /// Anything else, in words.
    Broken(String),
}

/// Chunks handed to the reader threads at once at most: the per-chunk bookkeeping of a
/// receive is this many entries whatever chunk size the peer chose (4-byte chunks of
/// 1 GiB would otherwise be 2^28 entries, ~10 GiB, built before any data).
const BATCH_CHUNKS: u64 = 1 << 15;

/// A receive buffer of one connection.
pub trait Landing {
    /// Fill with the poison (nothing verifies before data arrives); before each transfer.
    fn poison(&mut self) -> anyhow::Result<()>;
    /// Read every chunk of `plan` into place: chunk `i` from stream `i % N`. `got` counts
    /// the bytes that arrived (for the error of an incomplete transfer).
    fn receive(
        &mut self,
        streams: &[TcpStream],
        plan: &ChunkPlan,
        limits: ReadLimits,
        got: &AtomicU64,
    ) -> Result<(), Stop>;
    fn verify(&self, len: usize) -> anyhow::Result<Verification>;
    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>>;
    fn path(&self) -> DataPath;
}

/// Read chunk `chunk`'s frame from `stream` into `dest` (its bytes), checking that the
/// frame is that chunk: both ends know which chunk comes next on each stream, so any
/// other offset or length is a protocol error, and nothing is ever written outside
/// `dest`.
fn read_chunk(
    stream: &TcpStream,
    chunk: &Chunk,
    dest: &mut [u8],
    limits: ReadLimits,
) -> Result<(), Stop> {
    if dest.len() as u64 != chunk.len {
        return Err(Stop::Broken(format!(
            "chunk {} ({} bytes) does not fit its {}-byte place",
            chunk.index,
            chunk.len,
            dest.len()
        )));
    }
    read_frame_of(stream, chunk, limits)?;
    socket::read_exact_within(stream, dest, limits.timeout, limits.deadline)
        .map_err(|e| stop_of(e, limits, chunk))
}

/// Read chunk `chunk`'s frame header from `stream` and check that it is that chunk (for
/// readers that take the bytes in pieces, as into GPU memory, too).
fn read_frame_of(stream: &TcpStream, chunk: &Chunk, limits: ReadLimits) -> Result<(), Stop> {
    let mut head = [0u8; FRAME_LEN];
    socket::read_exact_within(stream, &mut head, limits.timeout, limits.deadline)
        .map_err(|e| stop_of(e, limits, chunk))?;
    let frame = Frame::decode(&head);
    if frame.offset != chunk.offset || frame.len as u64 != chunk.len {
        return Err(Stop::Broken(format!(
            "protocol error: a frame of {} bytes at offset {} where chunk {} ({} bytes at {}) was due",
            frame.len, frame.offset, chunk.index, chunk.len, chunk.offset
        )));
    }
    Ok(())
}

/// Why a read of `chunk` stopped, as a [`Stop`].
fn stop_of(stop: ReadStop, limits: ReadLimits, chunk: &Chunk) -> Stop {
    match stop {
        ReadStop::Deadline => Stop::TooSlow,
        ReadStop::Io(e) => Stop::Broken(socket::why(
            &e,
            limits.timeout,
            &format!("reading chunk {}", chunk.index),
        )),
    }
}

/// Host memory, poisoned; each stream's reader thread writes its own chunks' slices.
pub struct HostLanding(HostBuffer);

impl HostLanding {
    pub fn new(len: usize) -> anyhow::Result<Self> {
        Ok(HostLanding(HostBuffer::poisoned(len)?))
    }
}

impl Landing for HostLanding {
    fn poison(&mut self) -> anyhow::Result<()> {
        RecvSink::poison(&self.0)
    }

    fn receive(
        &mut self,
        streams: &[TcpStream],
        plan: &ChunkPlan,
        limits: ReadLimits,
        got: &AtomicU64,
    ) -> Result<(), Stop> {
        let broken = |e: String| Stop::Broken(e);
        let total = usize::try_from(plan.total()).map_err(|e| broken(e.to_string()))?;
        let chunk_bytes = usize::try_from(plan.chunk_bytes()).map_err(|e| broken(e.to_string()))?;
        let bytes = self
            .0
            .as_bytes_mut()
            .get_mut(..total)
            .ok_or_else(|| broken("the buffer is smaller than the transfer".into()))?;
        let mut first = 0u64;
        for batch in bytes.chunks_mut(chunk_bytes.max(1) * BATCH_CHUNKS as usize) {
            let count = batch.len().div_ceil(chunk_bytes.max(1)) as u64;
            receive_batch(streams, plan, first, batch, chunk_bytes, limits, got)?;
            first += count;
        }
        Ok(())
    }

    fn verify(&self, len: usize) -> anyhow::Result<Verification> {
        RecvSink::verify(&self.0, len)
    }

    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>> {
        RecvSink::first_values(&self.0, count)
    }

    fn path(&self) -> DataPath {
        DataPath::HostMemory
    }
}

/// Read chunks `first..` (as many as `batch` holds) into `batch`, one thread per stream:
/// chunk i's slice goes to stream i % n's reader, so the buffer is split by the borrow
/// checker, not by care. The first error breaks every stream off at once.
fn receive_batch(
    streams: &[TcpStream],
    plan: &ChunkPlan,
    first: u64,
    batch: &mut [u8],
    chunk_bytes: usize,
    limits: ReadLimits,
    got: &AtomicU64,
) -> Result<(), Stop> {
    let n = streams.len().max(1);
    let mut shares: Vec<Vec<(Chunk, &mut [u8])>> = (0..n).map(|_| Vec::new()).collect();
    for (k, piece) in batch.chunks_mut(chunk_bytes.max(1)).enumerate() {
        let i = first + k as u64;
        let chunk = plan
            .get(i)
            .ok_or_else(|| Stop::Broken("the plan has fewer chunks than the buffer".into()))?;
        shares[super::frames::stream_of(i, n as u16)].push((chunk, piece));
    }
    let first_error: Mutex<Option<Stop>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for (stream, share) in streams.iter().zip(shares) {
            if share.is_empty() {
                continue;
            }
            let first_error = &first_error;
            scope.spawn(move || {
                for (chunk, dest) in share {
                    if let Err(stop) = read_chunk(stream, &chunk, dest, limits) {
                        let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                        if first.is_none() {
                            *first = Some(stop);
                            // Break the other readers off now instead of after their
                            // own timeouts.
                            for s in streams {
                                let _ = s.shutdown(Shutdown::Read);
                            }
                        }
                        return;
                    }
                    got.fetch_add(chunk.len, Ordering::Relaxed);
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(stop) => Err(stop),
        None => Ok(()),
    }
}

/// GPU memory: each stream's reader thread reads its chunks' bytes into slots of a pinned
/// host ring (slots of its own) and the calling thread, which owns the GPU, copies each
/// slot into device memory asynchronously ([`DeviceUpload`](crate::gpu::upload::DeviceUpload)),
/// so the streams are read in parallel, as for host memory, and the copies overlap the
/// arrivals; the verify kernel then checks the whole buffer on the GPU.
#[cfg(feature = "cuda")]
pub struct DeviceLanding {
    gpu: std::rc::Rc<crate::gpu::Gpu>,
    upload: crate::gpu::upload::DeviceUpload,
}

#[cfg(feature = "cuda")]
impl DeviceLanding {
    /// `len` bytes of GPU memory, filled from up to `streams` sockets in chunks of `chunk`.
    pub fn new(
        gpu: &std::rc::Rc<crate::gpu::Gpu>,
        len: usize,
        chunk: usize,
        streams: usize,
    ) -> anyhow::Result<Self> {
        Ok(DeviceLanding {
            gpu: gpu.clone(),
            upload: crate::gpu::upload::DeviceUpload::new(gpu, len, chunk, streams)?,
        })
    }
}

#[cfg(feature = "cuda")]
impl Landing for DeviceLanding {
    fn poison(&mut self) -> anyhow::Result<()> {
        self.upload.poison()
    }

    fn receive(
        &mut self,
        streams: &[TcpStream],
        plan: &ChunkPlan,
        limits: ReadLimits,
        got: &AtomicU64,
    ) -> Result<(), Stop> {
        let n = streams.len().max(1);
        let shut = || {
            for s in streams {
                let _ = s.shutdown(Shutdown::Read);
            }
        };
        // A reader's error, as words for `fill`; whether it was the whole deadline.
        let too_slow = std::sync::atomic::AtomicBool::new(false);
        let words = |stop: Stop| match stop {
            Stop::TooSlow => {
                too_slow.store(true, Ordering::Relaxed);
                "the transfer's --min-rate deadline passed".to_string()
            }
            Stop::Broken(why) => why,
        };
        // Reader k takes chunks k, k + n, ... from stream k, each in slot-sized pieces.
        let read = |k: usize, writer: &mut crate::gpu::upload::SlotWriter| {
            let stream = &streams[k];
            let mut mine = (k as u64..plan.count()).step_by(n);
            let result = mine.try_for_each(|i| {
                let chunk = plan.get(i).ok_or("chunk outside the plan")?;
                read_frame_of(stream, &chunk, limits).map_err(words)?;
                let mut done = 0u64;
                while done < chunk.len {
                    let len = (chunk.len - done).min(writer.slot_bytes() as u64) as usize;
                    writer.write_at((chunk.offset + done) as usize, len, |bytes| {
                        socket::read_exact_within(stream, bytes, limits.timeout, limits.deadline)
                            .map_err(|e| words(stop_of(e, limits, &chunk)))
                    })?;
                    got.fetch_add(len as u64, Ordering::Relaxed);
                    done += len as u64;
                }
                Ok::<(), String>(())
            });
            if result.is_err() {
                // Break the other readers off now instead of after their own timeouts.
                shut();
            }
            result
        };
        self.upload.fill(n, limits.timeout, read).map_err(|e| {
            match too_slow.load(Ordering::Relaxed) {
                true => Stop::TooSlow,
                false => Stop::Broken(format!("receiving into GPU memory: {e}")),
            }
        })
    }

    fn verify(&self, len: usize) -> anyhow::Result<Verification> {
        let check = self.gpu.verify(&self.upload.memory()?.slice(0..len)?)?;
        Ok(Verification {
            elements: (len / 4) as u64,
            mismatches: check.mismatches,
            first_mismatch: check.first_mismatch,
            crc32: None, // checked on the GPU: the bytes never come back to the CPU
        })
    }

    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>> {
        crate::gpu::sources::read_device_values(self.upload.memory()?, count)
    }

    fn path(&self) -> DataPath {
        DataPath::StagedThroughHostMemory
    }
}
