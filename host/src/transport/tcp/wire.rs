//! The sender's [`ChunkWire`] over TCP: one writer thread per stream writes each chunk
//! handed to it (a [`Frame`] header, then the bytes) straight from the source's memory;
//! chunk `i` goes to stream `i % N`, and chunks are reported done in order once every
//! chunk before them has been written too. "Done" means handed to the kernel, which
//! copied the bytes: the source may reuse them then, as after a NIC's send completion.

use super::frames::{stream_of, Frame};
use super::socket;
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use crate::transfer::schedule::{ChunkWire, Posted, WireError};
use std::collections::BTreeSet;
use std::io::Write;
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// One chunk for a writer thread.
struct Job {
    /// Where its bytes start in the source's memory.
    from: usize,
    len: usize,
    /// Where it goes in the transfer.
    offset: u64,
    index: u64,
}

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
    done: mpsc::Receiver<Result<u64, String>>,
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
                            // SAFETY: post() checked that [from, from + len) lies inside
                            // the source; the poster keeps those bytes valid and
                            // unmodified until we report the chunk written, and this
                            // thread ends inside `scope`, while the source is borrowed.
                            let bytes = unsafe {
                                std::slice::from_raw_parts(base.0.add(job.from), job.len)
                            };
                            let frame = Frame {
                                offset: job.offset,
                                len: job.len as u32,
                                crc: 0,
                            };
                            let result = stream
                                .write_all(&frame.encode())
                                .and_then(|()| stream.write_all(bytes));
                            let report = result.map(|()| job.index).map_err(|e| {
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

    /// Start counting chunks from 0 again (the next transfer on this connection).
    pub fn next_transfer(&mut self) {
        self.written.clear();
        self.next_done = 0;
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
            let job = Job {
                from: p.bytes.start,
                len: p.bytes.len(),
                offset: p.chunk.offset,
                index: p.chunk.index,
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
                Ok(index) => {
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
