//! Where a TCP receiver puts the data: host memory, read straight from the sockets by one
//! thread per stream, or GPU memory through a host chunk buffer.

use super::frames::{Frame, FRAME_LEN};
use super::socket;
use crate::memory::{DataPath, HostBuffer, RecvSink, Verification};
use crate::transfer::plan::{Chunk, ChunkPlan};
use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

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
        timeout: Duration,
        got: &AtomicU64,
    ) -> Result<(), String>;
    fn verify(&self, len: usize) -> anyhow::Result<Verification>;
    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>>;
    fn path(&self) -> DataPath;
}

/// Read chunk `chunk`'s frame from `stream` into `dest` (its bytes), checking that the
/// frame is that chunk: both ends know which chunk comes next on each stream, so any
/// other offset or length is a protocol error, and nothing is ever written outside
/// `dest`.
fn read_chunk(
    mut stream: &TcpStream,
    chunk: &Chunk,
    dest: &mut [u8],
    timeout: Duration,
) -> Result<(), String> {
    let what = || format!("reading chunk {}", chunk.index);
    let mut head = [0u8; FRAME_LEN];
    stream
        .read_exact(&mut head)
        .map_err(|e| socket::why(&e, timeout, &what()))?;
    let frame = Frame::decode(&head);
    if frame.offset != chunk.offset
        || frame.len as u64 != chunk.len
        || dest.len() as u64 != chunk.len
    {
        return Err(format!(
            "protocol error: a frame of {} bytes at offset {} where chunk {} ({} bytes at {}) was due",
            frame.len, frame.offset, chunk.index, chunk.len, chunk.offset
        ));
    }
    stream
        .read_exact(dest)
        .map_err(|e| socket::why(&e, timeout, &what()))
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
        timeout: Duration,
        got: &AtomicU64,
    ) -> Result<(), String> {
        let total = usize::try_from(plan.total()).map_err(|e| e.to_string())?;
        let n = streams.len().max(1);
        let bytes = self
            .0
            .as_bytes_mut()
            .get_mut(..total)
            .ok_or("the buffer is smaller than the transfer")?;
        // Chunk i's slice goes to stream i % n's reader: the buffer is split by the
        // borrow checker, not by care.
        let mut shares: Vec<Vec<(Chunk, &mut [u8])>> = (0..n).map(|_| Vec::new()).collect();
        let chunk_bytes = usize::try_from(plan.chunk_bytes()).map_err(|e| e.to_string())?;
        for (i, piece) in bytes.chunks_mut(chunk_bytes.max(1)).enumerate() {
            let chunk = plan
                .get(i as u64)
                .ok_or("the plan has fewer chunks than the buffer")?;
            shares[i % n].push((chunk, piece));
        }
        let first_error: Mutex<Option<String>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for (stream, share) in streams.iter().zip(shares) {
                let first_error = &first_error;
                scope.spawn(move || {
                    for (chunk, dest) in share {
                        if let Err(why) = read_chunk(stream, &chunk, dest, timeout) {
                            let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                            if first.is_none() {
                                *first = Some(why);
                                // Break the other readers off now instead of after their
                                // own timeouts.
                                for s in streams {
                                    let _ = s.shutdown(Shutdown::Both);
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
            Some(why) => Err(why),
            None => Ok(()),
        }
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

/// GPU memory: each chunk is read from its socket into a slot of a pinned host ring and
/// copied into device memory asynchronously ([`DeviceUpload`](crate::gpu::upload::DeviceUpload)),
/// so the copy of one chunk overlaps the arrival of the next; the verify kernel then checks
/// the whole buffer on the GPU. One thread reads the streams in chunk order: the GPU's
/// objects are tied to the thread that owns them.
#[cfg(feature = "cuda")]
pub struct DeviceLanding {
    gpu: std::rc::Rc<crate::gpu::Gpu>,
    upload: crate::gpu::upload::DeviceUpload,
}

#[cfg(feature = "cuda")]
impl DeviceLanding {
    pub fn new(
        gpu: &std::rc::Rc<crate::gpu::Gpu>,
        len: usize,
        chunk: usize,
    ) -> anyhow::Result<Self> {
        Ok(DeviceLanding {
            gpu: gpu.clone(),
            upload: crate::gpu::upload::DeviceUpload::new(gpu, len, chunk)?,
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
        timeout: Duration,
        got: &AtomicU64,
    ) -> Result<(), String> {
        let n = streams.len().max(1) as u16;
        let shut = || {
            for s in streams {
                let _ = s.shutdown(Shutdown::Both);
            }
        };
        for i in 0..plan.count() {
            let chunk = plan.get(i).ok_or("chunk outside the plan")?;
            let len = chunk.len as usize;
            let stream = &streams[super::frames::stream_of(i, n)];
            let deadline = std::time::Instant::now() + timeout;
            let dest = self
                .upload
                .slot(i, len, deadline)
                .map_err(|e| format!("chunk {i}: {e:#}"))?;
            if let Err(why) = read_chunk(stream, &chunk, dest, timeout) {
                shut();
                return Err(why);
            }
            self.upload
                .commit(i, chunk.offset as usize, len)
                .map_err(|e| format!("copying chunk {i} into GPU memory: {e:#}"))?;
            got.fetch_add(chunk.len, Ordering::Relaxed);
        }
        self.upload
            .finish()
            .map_err(|e| format!("copying into GPU memory: {e:#}"))
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
