//! A [`ChunkWire`] that does to each chunk what a NIC's read would: a host `memcpy` of
//! its bytes into a second buffer, on a thread of its own, in order. The GPU benchmark
//! measures the staged pipeline with it, and the GPU tests drive sources through the
//! real schedule with it, on the GPU machine, which has no NIC.

use super::schedule::{ChunkWire, Posted, WireError};
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use std::marker::PhantomData;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// One chunk for the copying thread: source and destination byte offsets, length, index.
struct Job {
    from: usize,
    to: usize,
    len: usize,
    index: u64,
    signaled: bool,
}

/// The source's base address, for the copying thread.
#[derive(Clone, Copy)]
struct SourceBase(*const u8);

// SAFETY: only an address; the wire's contract (ChunkWire::post) keeps the bytes it
// names valid and unmodified until the thread reports them copied.
unsafe impl Send for SourceBase {}

/// Copies chunks of host memory (borrowed for `'m`) into an owned destination buffer.
pub struct MemcpyWire<'m> {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<u64>,
    thread: Option<JoinHandle<Vec<u8>>>,
    source_len: usize,
    destination_len: usize,
    _source: PhantomData<&'m ()>,
}

impl<'m> MemcpyWire<'m> {
    /// A wire reading from `source` (host memory: a staging ring, a host buffer) into a
    /// new zeroed buffer of `destination_len` bytes; chunk `c` lands at `c.offset`.
    pub fn new(source: &'m dyn Registrable, destination_len: usize) -> anyhow::Result<Self> {
        Self::with_destination(source, vec![0u8; destination_len])
    }

    /// The same, into `destination` (a benchmark reuses one buffer whose pages are already
    /// mapped, so page faults do not count as copying time).
    pub fn with_destination(
        source: &'m dyn Registrable,
        mut destination: Vec<u8>,
    ) -> anyhow::Result<Self> {
        let destination_len = destination.len();
        let RegistrationTarget::Host { ptr, len } = source.target() else {
            anyhow::bail!("the memcpy wire reads host memory only");
        };
        let base = SourceBase(ptr.as_ptr());
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = mpsc::channel::<u64>();
        let thread = std::thread::Builder::new()
            .name("memcpy-wire".into())
            .spawn(move || {
                let base = base;
                for job in rx {
                    // SAFETY: post() checked that [from, from + len) lies in the source
                    // and [to, to + len) in the destination; the poster keeps the source
                    // bytes valid and unmodified until we report the chunk done.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            base.0.add(job.from),
                            destination.as_mut_ptr().add(job.to),
                            job.len,
                        )
                    };
                    if job.signaled && tx.send(job.index).is_err() {
                        break;
                    }
                }
                destination
            })?;
        Ok(MemcpyWire {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            source_len: len,
            destination_len,
            _source: PhantomData,
        })
    }

    /// Stop the thread and take the destination buffer.
    pub fn finish(mut self) -> anyhow::Result<Vec<u8>> {
        self.jobs.take();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(destination)) => Ok(destination),
            _ => anyhow::bail!("the memcpy wire's thread panicked"),
        }
    }
}

impl ChunkWire for MemcpyWire<'_> {
    fn batch(&self) -> usize {
        1
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| WireError::Broken("the wire is finished".into()))?;
        for p in chunks {
            let to = p.chunk.offset as usize;
            let fits = |start: usize, len: usize, size: usize| {
                start.checked_add(len).is_some_and(|end| end <= size)
            };
            if !fits(p.bytes.start, p.bytes.len(), self.source_len)
                || !fits(to, p.bytes.len(), self.destination_len)
            {
                return Err(WireError::Broken(format!(
                    "chunk {} ({:?} to {to}) is outside the source or destination",
                    p.chunk.index, p.bytes
                )));
            }
            let job = Job {
                from: p.bytes.start,
                to,
                len: p.bytes.len(),
                index: p.chunk.index,
                signaled: p.signaled,
            };
            jobs.send(job)
                .map_err(|_| WireError::Broken("the copying thread is gone".into()))?;
        }
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<u64>, WireError> {
        let first = match self.done.recv_timeout(deadline.remaining()) {
            Ok(index) => index,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(WireError::Broken(
                    deadline.timeout_error("chunks to be copied").to_string(),
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(WireError::Broken("the copying thread is gone".into()))
            }
        };
        // Chunks are copied in order: the last report covers all before it.
        Ok(Some(self.done.try_iter().fold(first, u64::max)))
    }
}

impl Drop for MemcpyWire<'_> {
    fn drop(&mut self) {
        // The thread reads the borrowed source: it must be done before the borrow ends.
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::host_buffer::verify_bytes;
    use crate::memory::HostBuffer;
    use crate::transfer::plan::ChunkPlan;
    use crate::transfer::schedule::Schedule;
    use std::time::Duration;

    #[test]
    fn the_schedule_copies_every_chunk_into_place() {
        let src = HostBuffer::with_pattern(1 << 20).unwrap();
        for (chunk, depth) in [(4096u64, 16u32), (100_000, 3), (1 << 20, 1)] {
            let plan = ChunkPlan::new(src.len() as u64, chunk).unwrap();
            let schedule = Schedule::new(plan, depth, &src, Duration::from_secs(5));
            let mut wire = MemcpyWire::new(&src, src.len()).unwrap();
            schedule.run(&src, &mut wire, "memcpy").unwrap();
            let copy = wire.finish().unwrap();
            let v = verify_bytes(&copy);
            assert!(v.ok(), "chunk {chunk}: {v:?}");
            assert_eq!(v.elements, 1 << 18);
        }
    }

    #[test]
    fn chunks_outside_the_buffers_are_refused() {
        let src = HostBuffer::with_pattern(4096).unwrap();
        let mut wire = MemcpyWire::new(&src, 4096).unwrap();
        let plan = ChunkPlan::new(8192, 4096).unwrap();
        let p = Posted {
            chunk: plan.get(1).unwrap(),
            bytes: 0..4096,
            signaled: true,
            last: true,
        };
        // SAFETY: refused before anything is copied.
        assert!(matches!(
            unsafe { wire.post(&[p]) },
            Err(WireError::Broken(_))
        ));
    }
}
