//! Where a TCP receiver puts the data: host memory, read straight from the sockets by one
//! thread per stream, or GPU memory through a host chunk buffer.
//!
//! With checksums each frame's CRC32C is kept ([`ChunkChecks`]) and each chunk checked
//! where it landed: in host memory by the reader thread right after the bytes arrive
//! (the CPU's CRC32C instruction), in GPU memory by the checksum kernel over the whole
//! buffer once every chunk is in. Chunks that failed are read again, into the same
//! place, when the sender resends them ([`Which::Only`]).

use super::frames::{Frame, FRAME_LEN};
use super::socket::{self, ReadStop};
use crate::memory::{DataPath, HostBuffer, RecvSink, Verification};
use crate::transfer::plan::{Chunk, ChunkPlan};
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which chunks a receive reads: all of the plan's, or only those sent again.
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    All,
    /// Increasing chunk indices.
    Only(&'a [u32]),
}

/// The CRC32C each chunk's frame carried, and the chunks whose bytes did not match it.
pub struct ChunkChecks {
    enabled: bool,
    expected: Vec<AtomicU32>,
    bad: Mutex<Vec<u32>>,
}

impl ChunkChecks {
    /// For a transfer of `chunks` chunks; `enabled`: the sender computes checksums.
    pub fn new(enabled: bool, chunks: u64) -> ChunkChecks {
        let n = if enabled { chunks as usize } else { 0 };
        ChunkChecks {
            enabled,
            expected: (0..n).map(|_| AtomicU32::new(0)).collect(),
            bad: Mutex::new(Vec::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub(super) fn expect(&self, index: u64, crc: u32) {
        if let Some(slot) = self.expected.get(index as usize) {
            slot.store(crc, Ordering::Relaxed);
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn expected(&self, index: u64) -> u32 {
        self.expected
            .get(index as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub(super) fn failed(&self, index: u64) {
        self.bad
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(index as u32);
    }

    /// The chunks that failed since the last call, in increasing order.
    pub fn take_failed(&self) -> Vec<u32> {
        let mut bad = std::mem::take(&mut *self.bad.lock().unwrap_or_else(|p| p.into_inner()));
        bad.sort_unstable();
        bad.dedup();
        bad
    }

    /// Every chunk's CRC32C as the sender computed it.
    pub fn all(&self) -> Vec<u32> {
        self.expected
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }
}

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

/// What every read of one transfer's chunks is given, whoever reads them (a landing's
/// fixed streams, or a striped round): the plan, each read's bounds, the count of the
/// bytes that arrived (for the error of an incomplete transfer) and the frames' CRC32Cs
/// (and, in host memory, the chunks whose bytes do not match them).
#[derive(Clone, Copy)]
pub struct Reads<'a> {
    pub plan: &'a ChunkPlan,
    pub limits: ReadLimits,
    pub got: &'a AtomicU64,
    pub checks: &'a ChunkChecks,
}

/// A receive buffer of one connection.
pub trait Landing {
    /// Fill with the poison (nothing verifies before data arrives); before each transfer.
    fn poison(&mut self) -> anyhow::Result<()>;
    /// Read the chunks `which` of `reads.plan` into place: chunk `i` from stream `i % N`,
    /// in increasing order on each stream.
    fn receive(
        &mut self,
        streams: &[TcpStream],
        reads: Reads<'_>,
        which: Which<'_>,
    ) -> Result<(), Stop>;
    /// After a receive: the chunks among `which` whose bytes, where they landed, do not
    /// match their frame's CRC32C.
    fn failed_chunks(
        &mut self,
        plan: &ChunkPlan,
        which: Which<'_>,
        checks: &ChunkChecks,
    ) -> anyhow::Result<Vec<u32>>;
    /// The CRC32C of each of `chunks` (increasing) of `plan` where it landed.
    fn landed_crcs(&mut self, plan: &ChunkPlan, chunks: &[u32]) -> anyhow::Result<Vec<u32>>;
    /// Write the first `len` bytes to `out` (`--output`).
    fn write_out(&mut self, len: usize, out: &mut dyn Write) -> anyhow::Result<()>;
    fn verify(&self, len: usize) -> anyhow::Result<Verification>;
    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>>;
    fn path(&self) -> DataPath;
    /// The first `len` bytes as host memory, for a striped transfer's readers to place
    /// chunks into by their offsets ([`super::striped`]); `None` where the data does not
    /// land in host memory.
    fn host_bytes(&mut self, len: usize) -> Option<&mut [u8]> {
        let _ = len;
        None
    }
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
    checks: &ChunkChecks,
) -> Result<(), Stop> {
    if dest.len() as u64 != chunk.len {
        return Err(Stop::Broken(format!(
            "chunk {} ({} bytes) does not fit its {}-byte place",
            chunk.index,
            chunk.len,
            dest.len()
        )));
    }
    let crc = read_frame_of(stream, chunk, limits)?;
    socket::read_exact_within(stream, dest, limits.timeout, limits.deadline)
        .map_err(|e| stop_of(e, limits, chunk))?;
    if checks.enabled() {
        checks.expect(chunk.index, crc);
        if crate::integrity::crc32c(dest) != crc {
            checks.failed(chunk.index);
        }
    }
    Ok(())
}

/// Read chunk `chunk`'s frame header from `stream` and check that it is that chunk (for
/// readers that take the bytes in pieces, as into GPU memory, too); its CRC32C.
fn read_frame_of(stream: &TcpStream, chunk: &Chunk, limits: ReadLimits) -> Result<u32, Stop> {
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
    Ok(frame.crc)
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

    /// Into `buffer`, which is there already (a caller's own memory, lent).
    pub fn over(buffer: HostBuffer) -> anyhow::Result<Self> {
        RecvSink::poison(&buffer)?;
        Ok(HostLanding(buffer))
    }
}

/// A landing in memory a caller lent, holding the lender's token until it is dropped:
/// the lender ([`crate::memory::lent::Returned::wait`]) takes its memory back only when
/// the landing, and every thread it reads with, is gone.
pub struct LentLanding {
    // Field order is drop order: the landing before the token.
    inner: Box<dyn Landing>,
    _in_use: std::sync::mpsc::Sender<()>,
}

impl LentLanding {
    pub fn new(inner: Box<dyn Landing>, in_use: std::sync::mpsc::Sender<()>) -> Self {
        LentLanding {
            inner,
            _in_use: in_use,
        }
    }
}

impl Landing for LentLanding {
    fn poison(&mut self) -> anyhow::Result<()> {
        self.inner.poison()
    }
    fn receive(
        &mut self,
        streams: &[TcpStream],
        reads: Reads<'_>,
        which: Which<'_>,
    ) -> Result<(), Stop> {
        self.inner.receive(streams, reads, which)
    }
    fn failed_chunks(
        &mut self,
        plan: &ChunkPlan,
        which: Which<'_>,
        checks: &ChunkChecks,
    ) -> anyhow::Result<Vec<u32>> {
        self.inner.failed_chunks(plan, which, checks)
    }
    fn landed_crcs(&mut self, plan: &ChunkPlan, chunks: &[u32]) -> anyhow::Result<Vec<u32>> {
        self.inner.landed_crcs(plan, chunks)
    }
    fn write_out(&mut self, len: usize, out: &mut dyn Write) -> anyhow::Result<()> {
        self.inner.write_out(len, out)
    }
    fn verify(&self, len: usize) -> anyhow::Result<Verification> {
        self.inner.verify(len)
    }
    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>> {
        self.inner.first_values(count)
    }
    fn path(&self) -> DataPath {
        self.inner.path()
    }
    fn host_bytes(&mut self, len: usize) -> Option<&mut [u8]> {
        self.inner.host_bytes(len)
    }
}

impl Landing for HostLanding {
    fn poison(&mut self) -> anyhow::Result<()> {
        RecvSink::poison(&self.0)
    }

    fn receive(
        &mut self,
        streams: &[TcpStream],
        reads: Reads<'_>,
        which: Which<'_>,
    ) -> Result<(), Stop> {
        let Reads {
            plan,
            limits,
            got,
            checks,
        } = reads;
        let broken = |e: String| Stop::Broken(e);
        let total = usize::try_from(plan.total()).map_err(|e| broken(e.to_string()))?;
        let chunk_bytes = usize::try_from(plan.chunk_bytes()).map_err(|e| broken(e.to_string()))?;
        let bytes = self
            .0
            .as_bytes_mut()
            .get_mut(..total)
            .ok_or_else(|| broken("the buffer is smaller than the transfer".into()))?;
        let ctx = Reading {
            streams,
            plan,
            limits,
            got,
            checks,
        };
        match which {
            Which::All => {
                let mut first = 0u64;
                for batch in bytes.chunks_mut(chunk_bytes.max(1) * BATCH_CHUNKS as usize) {
                    let count = batch.len().div_ceil(chunk_bytes.max(1)) as u64;
                    let pieces = batch
                        .chunks_mut(chunk_bytes.max(1))
                        .enumerate()
                        .map(|(k, piece)| (first + k as u64, piece));
                    receive_pieces(&ctx, pieces)?;
                    first += count;
                }
            }
            Which::Only(list) => {
                // The listed chunks' places, split off the buffer in one pass, handed to
                // the readers a batch at a time as above: a round may ask for every
                // chunk again, and the readers' lists hold 40 bytes per chunk.
                let mut wanted = list.iter().peekable();
                let mut pieces =
                    bytes
                        .chunks_mut(chunk_bytes.max(1))
                        .enumerate()
                        .filter_map(|(i, piece)| {
                            let hit = wanted.peek().is_some_and(|&&w| w as usize == i);
                            hit.then(|| {
                                wanted.next();
                                (i as u64, piece)
                            })
                        });
                loop {
                    let batch: Vec<_> = pieces.by_ref().take(BATCH_CHUNKS as usize).collect();
                    if batch.is_empty() {
                        break;
                    }
                    receive_pieces(&ctx, batch.into_iter())?;
                }
            }
        }
        Ok(())
    }

    fn failed_chunks(
        &mut self,
        _: &ChunkPlan,
        _: Which<'_>,
        checks: &ChunkChecks,
    ) -> anyhow::Result<Vec<u32>> {
        // Checked by the readers as the bytes arrived.
        Ok(checks.take_failed())
    }

    fn landed_crcs(&mut self, plan: &ChunkPlan, chunks: &[u32]) -> anyhow::Result<Vec<u32>> {
        let bytes = self.0.as_bytes();
        chunks
            .iter()
            .map(|&c| {
                let chunk = plan
                    .get(c as u64)
                    .ok_or_else(|| anyhow::anyhow!("chunk {c} is outside the transfer"))?;
                let place = bytes
                    .get(chunk.offset as usize..chunk.end() as usize)
                    .ok_or_else(|| anyhow::anyhow!("the buffer is smaller than the transfer"))?;
                Ok(crate::integrity::crc32c(place))
            })
            .collect()
    }

    fn write_out(&mut self, len: usize, out: &mut dyn Write) -> anyhow::Result<()> {
        let bytes = self.0.as_bytes();
        let bytes = bytes
            .get(..len)
            .ok_or_else(|| anyhow::anyhow!("the buffer is smaller than the transfer"))?;
        out.write_all(bytes)?;
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

    fn host_bytes(&mut self, len: usize) -> Option<&mut [u8]> {
        self.0.as_bytes_mut().get_mut(..len)
    }
}

/// What every reader of one receive shares.
struct Reading<'a> {
    streams: &'a [TcpStream],
    plan: &'a ChunkPlan,
    limits: ReadLimits,
    got: &'a AtomicU64,
    checks: &'a ChunkChecks,
}

/// Read the chunks `pieces` names (index, its place in the buffer), one thread per
/// stream: chunk i's slice goes to stream i % n's reader, so the buffer is split by the
/// borrow checker, not by care. The first error breaks every stream off at once.
fn receive_pieces<'b>(
    ctx: &Reading<'_>,
    pieces: impl Iterator<Item = (u64, &'b mut [u8])>,
) -> Result<(), Stop> {
    let Reading {
        streams,
        plan,
        limits,
        got,
        checks,
    } = *ctx;
    let n = streams.len().max(1);
    let mut shares: Vec<Vec<(Chunk, &mut [u8])>> = (0..n).map(|_| Vec::new()).collect();
    for (i, piece) in pieces {
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
                    if let Err(stop) = read_chunk(stream, &chunk, dest, limits, checks) {
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

    /// Into `memory` of `gpu`, which is there already (a caller's own, lent).
    pub fn over(
        gpu: &std::rc::Rc<crate::gpu::Gpu>,
        memory: crate::gpu::allocations::DeviceBuffer,
        chunk: usize,
        streams: usize,
    ) -> anyhow::Result<Self> {
        let len = memory.len();
        Ok(DeviceLanding {
            gpu: gpu.clone(),
            upload: crate::gpu::upload::DeviceUpload::over(gpu, memory, len, chunk, streams)?,
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
        reads: Reads<'_>,
        which: Which<'_>,
    ) -> Result<(), Stop> {
        let Reads {
            plan,
            limits,
            got,
            checks,
        } = reads;
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
        let read = |k: usize, writer: &mut crate::gpu::upload::SlotWriter<'_>| {
            let stream = &streams[k];
            let mine: Box<dyn Iterator<Item = u64>> = match which {
                Which::All => Box::new((k as u64..plan.count()).step_by(n)),
                Which::Only(list) => Box::new(
                    list.iter()
                        .map(|&c| c as u64)
                        .filter(move |&c| super::frames::stream_of(c, n as u16) == k),
                ),
            };
            let result = mine.into_iter().try_for_each(|i| {
                let chunk = plan.get(i).ok_or("chunk outside the plan")?;
                let crc = read_frame_of(stream, &chunk, limits).map_err(words)?;
                checks.expect(i, crc);
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

    fn failed_chunks(
        &mut self,
        plan: &ChunkPlan,
        which: Which<'_>,
        checks: &ChunkChecks,
    ) -> anyhow::Result<Vec<u32>> {
        if !checks.enabled() {
            return Ok(Vec::new());
        }
        // The checksum kernel over the whole transfer where it landed (at 2 TB/s on an
        // H200, a resend round's recheck of everything costs less than reading a list).
        let memory = self.upload.memory()?;
        let slice = memory.slice(0..plan.total() as usize)?;
        let landed = crate::gpu::checksum::crc32c_chunks(&slice, plan.chunk_bytes())?;
        let mismatch = |i: u64| landed.get(i as usize) != Some(&checks.expected(i));
        Ok(match which {
            Which::All => (0..plan.count())
                .filter(|&i| mismatch(i))
                .map(|i| i as u32)
                .collect(),
            Which::Only(list) => list
                .iter()
                .copied()
                .filter(|&i| mismatch(i as u64))
                .collect(),
        })
    }

    fn landed_crcs(&mut self, plan: &ChunkPlan, chunks: &[u32]) -> anyhow::Result<Vec<u32>> {
        // The checksum kernel over the whole transfer, as for `failed_chunks`.
        let memory = self.upload.memory()?;
        let slice = memory.slice(0..plan.total() as usize)?;
        let landed = crate::gpu::checksum::crc32c_chunks(&slice, plan.chunk_bytes())?;
        chunks
            .iter()
            .map(|&c| {
                landed
                    .get(c as usize)
                    .copied()
                    .ok_or_else(|| anyhow::anyhow!("chunk {c} is outside the transfer"))
            })
            .collect()
    }

    fn write_out(&mut self, len: usize, out: &mut dyn Write) -> anyhow::Result<()> {
        // Out of GPU memory in blocks, after the data verified there.
        const BLOCK: usize = 64 << 20;
        let memory = self.upload.memory()?;
        let mut block = vec![0u8; len.min(BLOCK)];
        let mut offset = 0;
        while offset < len {
            let n = (len - offset).min(BLOCK);
            memory.read_range_into(offset, &mut block[..n])?;
            out.write_all(&block[..n])?;
            offset += n;
        }
        Ok(())
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
