//! The sender's [`ChunkWire`] over TCP: one writer thread per stream writes each chunk
//! handed to it (a [`Frame`] header, then the bytes) straight from the source's memory;
//! chunk `i` goes to stream `i % N`, and chunks are reported done in order once every
//! chunk before them has been written too. "Done" means handed to the kernel, which
//! copied the bytes: the source may reuse them then, as after a NIC's send completion.
//!
//! With checksums (`--verify checksum|both`) each frame carries the chunk's CRC32C: the
//! one the GPU kernel computed where the data lives ([`TcpWire::next_transfer`]), or the
//! writer's own over the bytes it sends. The wire keeps every chunk's CRC32C for the
//! transfer's digest and for chunks sent again ([`TcpWire::resend`]). The test-only
//! fault injector flips a bit in a copy of the bytes after the checksum was taken.

use super::frames::{stream_of, Frame};
use super::socket;
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use crate::transfer::faults::FaultInjector;
use crate::transfer::plan::Chunk;
use crate::transfer::schedule::{ChunkWire, Posted, WireError};
use std::collections::BTreeSet;
use std::io::Write;
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// Where a job's bytes are.
enum Bytes {
    /// In the source's memory, from this offset (the schedule's chunks).
    Source { from: usize },
    /// A copy of its own (a chunk sent again).
    Owned(Vec<u8>),
}

/// One chunk for a writer thread.
struct Job {
    bytes: Bytes,
    len: usize,
    /// Where it goes in the transfer.
    offset: u64,
    index: u64,
    /// Its CRC32C when known already (the GPU's, or the first sending's); with
    /// checksums on and none given, the writer computes it.
    crc: Option<u32>,
    /// 0 for the first sending, round `r` of resends for `r`.
    attempt: u32,
}

/// What the wire checks: CRC32C per chunk, and the test-only fault injector.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireChecks {
    pub checksum: bool,
    pub faults: Option<FaultInjector>,
}

/// A writer's report: the chunk written and the CRC32C its frame carried.
type Written = Result<(u64, u32), String>;

/// The source's base address, for the writer threads.
#[derive(Clone, Copy)]
struct SourceBase(*const u8);

// SAFETY: only an address; ChunkWire::post's contract keeps the bytes it names valid and
// unmodified until the wire reports them done, and the writer threads are scoped: they
// end before `TcpWire::scope` returns, while the source is still borrowed.
unsafe impl Send for SourceBase {}

/// Writes chunks of a host-memory source to the streams of one connection, on writer
/// threads that live exactly as long as one [`TcpWire::scope`] call: like
/// `std::thread::scope`, and for the same reason as
/// [`MemcpyWire`](crate::transfer::memcpy_wire::MemcpyWire), no wire can be leaked with
/// its threads still reading the source. `'w` brands one scope's wire.
pub struct TcpWire<'w> {
    jobs: Vec<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Written>,
    checks: WireChecks,
    /// This transfer's chunk CRC32Cs: the GPU's, or filled in as the writers report.
    crcs: Vec<u32>,
    /// The GPU computed `crcs` before the transfer (the frames carry them as they are).
    precomputed: bool,
    /// Clones of the streams, to break blocked writes off when the transfer fails.
    shutters: Vec<TcpStream>,
    source_len: usize,
    /// Chunks written beyond `next_done`.
    written: BTreeSet<u64>,
    /// The lowest chunk index not yet known written.
    next_done: u64,
    failed: bool,
    _scope: PhantomData<fn(&'w ()) -> &'w ()>,
}

impl TcpWire<'_> {
    /// Run `f` with a wire reading from `source` (host memory: a host buffer, a staging
    /// ring, mapped memory) and writing to `streams` (each cloned for its writer thread);
    /// every writer thread has ended when this returns.
    pub fn scope<R>(
        source: &dyn Registrable,
        streams: &[TcpStream],
        timeout: Duration,
        checks: WireChecks,
        f: impl for<'w> FnOnce(&mut TcpWire<'w>) -> R,
    ) -> anyhow::Result<R> {
        let RegistrationTarget::Host { ptr, len } = source.target() else {
            anyhow::bail!(
                "the TCP wire reads host memory only (GPU memory goes through the staged ring)"
            );
        };
        let base = SourceBase(ptr.as_ptr());
        std::thread::scope(|scope| {
            let (tx, done) = mpsc::channel();
            let mut wire = TcpWire {
                jobs: Vec::new(),
                done,
                checks,
                crcs: Vec::new(),
                precomputed: false,
                shutters: Vec::new(),
                source_len: len,
                written: BTreeSet::new(),
                next_done: 0,
                failed: false,
                _scope: PhantomData,
            };
            for (i, stream) in streams.iter().enumerate() {
                let mut stream = stream.try_clone()?;
                wire.shutters.push(stream.try_clone()?);
                let (jobs, rx) = mpsc::channel::<Job>();
                let tx = tx.clone();
                std::thread::Builder::new()
                    .name(format!("tcp-writer-{i}"))
                    .spawn_scoped(scope, move || {
                        let base = base;
                        for job in rx {
                            let bytes: &[u8] = match &job.bytes {
                                // SAFETY: post() checked that [from, from + len) lies
                                // inside the source; the poster keeps those bytes valid
                                // and unmodified until we report the chunk written, and
                                // this thread ends inside `scope`, while the source is
                                // borrowed.
                                Bytes::Source { from } => unsafe {
                                    std::slice::from_raw_parts(base.0.add(*from), job.len)
                                },
                                Bytes::Owned(v) => v,
                            };
                            let crc = match (job.crc, checks.checksum) {
                                (Some(crc), _) => crc,
                                (None, true) => crate::integrity::crc32c(bytes),
                                (None, false) => 0,
                            };
                            let corrupted = checks.faults.and_then(|f| {
                                let mut copy = bytes.to_vec();
                                f.corrupt(&mut copy, job.index, job.attempt).then_some(copy)
                            });
                            let bytes = corrupted.as_deref().unwrap_or(bytes);
                            let frame = Frame {
                                offset: job.offset,
                                len: job.len as u32,
                                crc,
                            };
                            let result = stream
                                .write_all(&frame.encode())
                                .and_then(|()| stream.write_all(bytes));
                            let report = result.map(|()| (job.index, crc)).map_err(|e| {
                                socket::why(&e, timeout, &format!("writing chunk {}", job.index))
                            });
                            let stop = report.is_err();
                            if tx.send(report).is_err() || stop {
                                break;
                            }
                        }
                    })?;
                wire.jobs.push(jobs);
            }
            // The wire's Drop (here, or while unwinding from a panic in `f`) closes the
            // job channels and breaks blocked writes off; the scope then joins the
            // writers before returning.
            Ok(f(&mut wire))
        })
    }

    /// Start counting chunks from 0 again (the next transfer on this connection, of
    /// `chunks` chunks), with the chunks' CRC32Cs if the GPU computed them already.
    pub fn next_transfer(&mut self, chunks: u64, precomputed: Option<Vec<u32>>) {
        self.written.clear();
        self.next_done = 0;
        self.precomputed = precomputed.is_some();
        self.crcs = precomputed.unwrap_or_else(|| {
            if self.checks.checksum {
                vec![0; chunks as usize]
            } else {
                Vec::new()
            }
        });
    }

    /// The CRC32C of every chunk of this transfer (as sent, before any fault
    /// injection), once the schedule's pass is done; empty without checksums.
    pub fn checksums(&self) -> &[u32] {
        &self.crcs
    }

    /// Send `chunks` again, each with its bytes (copied out of the source) on its own
    /// stream, in order, as round `round` of resends; wait until all are written, each
    /// within `timeout` of the last.
    pub fn resend(
        &mut self,
        chunks: Vec<(Chunk, Vec<u8>)>,
        round: u32,
        timeout: Duration,
    ) -> Result<(), WireError> {
        let count = chunks.len();
        for (chunk, bytes) in chunks {
            let crc = self.crcs.get(chunk.index as usize).copied();
            if bytes.len() as u64 != chunk.len || (self.checks.checksum && crc.is_none()) {
                return Err(self.broken(format!("chunk {} cannot be sent again", chunk.index)));
            }
            let stream = stream_of(chunk.index, self.jobs.len() as u16);
            let job = Job {
                len: bytes.len(),
                bytes: Bytes::Owned(bytes),
                offset: chunk.offset,
                index: chunk.index,
                crc,
                attempt: round,
            };
            if self.jobs[stream].send(job).is_err() {
                return Err(self.broken(format!("the writer of stream {stream} is gone")));
            }
        }
        for _ in 0..count {
            match self.done.recv_timeout(timeout) {
                Ok(Ok(_)) => {}
                Ok(Err(why)) => return Err(self.broken(why)),
                Err(_) => {
                    let e = format!(
                        "chunks sent again were not written within {}",
                        crate::rdma::format_duration(timeout)
                    );
                    return Err(self.broken(e));
                }
            }
        }
        Ok(())
    }

    fn broken(&mut self, why: String) -> WireError {
        self.failed = true;
        WireError::Broken(why)
    }
}

// SAFETY: a chunk is reported done only once every chunk up to it was written to its
// socket (the kernel copied the bytes), and a writer reads nothing of a chunk after that.
unsafe impl ChunkWire for TcpWire<'_> {
    fn batch(&self) -> usize {
        1
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
        for p in chunks {
            let fits = p.bytes.end <= self.source_len && p.bytes.start <= p.bytes.end;
            if !fits || p.bytes.len() as u64 != p.chunk.len || p.chunk.len > u32::MAX as u64 {
                return Err(self.broken(format!(
                    "chunk {} ({:?}) is outside the source or too long for a frame",
                    p.chunk.index, p.bytes
                )));
            }
            let stream = stream_of(p.chunk.index, self.jobs.len() as u16);
            let crc = match self.precomputed {
                true => self.crcs.get(p.chunk.index as usize).copied(),
                false => None,
            };
            let job = Job {
                bytes: Bytes::Source {
                    from: p.bytes.start,
                },
                len: p.bytes.len(),
                offset: p.chunk.offset,
                index: p.chunk.index,
                crc,
                attempt: 0,
            };
            if self.jobs[stream].send(job).is_err() {
                return Err(self.broken(format!("the writer of stream {stream} is gone")));
            }
        }
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<u64>, WireError> {
        let first = match self.done.recv_timeout(deadline.remaining()) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let e = deadline.timeout_error("chunks to be written to the receiver");
                return Err(self.broken(e.to_string()));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(self.broken("the writer threads are gone".into()))
            }
        };
        let reports: Vec<_> = std::iter::once(first).chain(self.done.try_iter()).collect();
        for r in reports {
            match r {
                Ok((index, crc)) => {
                    if let Some(slot) = self.crcs.get_mut(index as usize) {
                        *slot = crc;
                    }
                    self.written.insert(index);
                }
                Err(why) => return Err(self.broken(why)),
            }
        }
        let before = self.next_done;
        while self.written.remove(&self.next_done) {
            self.next_done += 1;
        }
        Ok((self.next_done > before).then(|| self.next_done - 1))
    }
}

impl Drop for TcpWire<'_> {
    fn drop(&mut self) {
        // The scope joins the writers next. After a failure, a writer may be blocked on a
        // stalled peer: shutting the sockets down breaks the write off at once instead of
        // after --timeout. (Not what makes the wire sound: the scope is.)
        if self.failed {
            for s in &self.shutters {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        self.jobs.clear();
    }
}
