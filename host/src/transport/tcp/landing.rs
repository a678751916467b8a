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

/// Read chunk `chunk`'s frame header from `stream` and check that it is that chunk (as
/// [`read_chunk`] does, for readers that take the bytes in pieces).
#[cfg(feature = "cuda")]
fn read_frame_of(mut stream: &TcpStream, chunk: &Chunk, timeout: Duration) -> Result<(), String> {
    let mut head = [0u8; FRAME_LEN];
    stream
        .read_exact(&mut head)
        .map_err(|e| socket::why(&e, timeout, &format!("reading chunk {}", chunk.index)))?;
    let frame = Frame::decode(&head);
    if frame.offset != chunk.offset || frame.len as u64 != chunk.len {
        return Err(format!(
            "protocol error: a frame of {} bytes at offset {} where chunk {} ({} bytes at {}) was due",
            frame.len, frame.offset, chunk.index, chunk.len, chunk.offset
        ));
    }
    Ok(())
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
        let n = streams.len().max(1);
        let shut = || {
            for s in streams {
                let _ = s.shutdown(Shutdown::Both);
            }
        };
        // Reader k takes chunks k, k + n, ... from stream k, each in slot-sized pieces.
        let read = |k: usize, writer: &mut crate::gpu::upload::SlotWriter| {
            let stream = &streams[k];
            let mut mine = (k as u64..plan.count()).step_by(n);
            let result = mine.try_for_each(|i| {
                let chunk = plan.get(i).ok_or("chunk outside the plan")?;
                read_frame_of(stream, &chunk, timeout)?;
                let mut done = 0u64;
                while done < chunk.len {
                    let len = (chunk.len - done).min(writer.slot_bytes() as u64) as usize;
                    writer.write_at((chunk.offset + done) as usize, len, |bytes| {
                        let mut s = stream;
                        s.read_exact(bytes).map_err(|e| {
                            socket::why(&e, timeout, &format!("reading chunk {}", chunk.index))
                        })
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
        self.upload
            .fill(n, timeout, read)
            .map_err(|e| format!("receiving into GPU memory: {e}"))
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
