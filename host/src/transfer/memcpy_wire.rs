//! A [`ChunkWire`] that does to each chunk what a NIC's read would: a host `memcpy` of
//! its bytes into a second buffer, on a thread of its own, in order. The GPU benchmark
//! measures the staged pipeline with it, and the GPU tests drive sources through the
//! real schedule with it, on the GPU machine, which has no NIC.

use super::schedule::{ChunkWire, Posted, WireError};
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use std::marker::PhantomData;
use std::sync::mpsc;

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
// names valid and unmodified until the thread reports them copied, and the scope that
// runs the thread ends before the borrow of the source does.
unsafe impl Send for SourceBase {}

/// Copies chunks of a host-memory source into a destination buffer, on a thread that
/// lives exactly as long as one [`MemcpyWire::scope`] call.
///
/// There is no constructor that returns a wire: a wire whose thread outlived its borrow
/// of the source could be leaked (`mem::forget`, after an early error) and keep reading
/// freed memory, because a destructor is not a guarantee. So, like `std::thread::scope`,
/// the wire exists only inside a closure, and the copying thread is joined before
/// `scope` returns, whatever the closure did with the wire. `'w` brands one scope's wire
/// (invariant), so two scopes' wires cannot be swapped.
pub struct MemcpyWire<'w> {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<u64>,
    source_len: usize,
    destination_len: usize,
    _scope: PhantomData<fn(&'w ()) -> &'w ()>,
}

impl MemcpyWire<'_> {
    /// Run `f` with a wire reading from `source` (host memory: a staging ring, a host
    /// buffer) into `destination` (chunk `c` lands at `c.offset`; a benchmark passes one
    /// buffer whose pages are already mapped, so page faults do not count as copying
    /// time). Returns what `f` returned and the destination, after the copying thread
    /// has ended.
    pub fn scope<R>(
        source: &dyn Registrable,
        mut destination: Vec<u8>,
        f: impl for<'w> FnOnce(&mut MemcpyWire<'w>) -> R,
    ) -> anyhow::Result<(R, Vec<u8>)> {
        let destination_len = destination.len();
        let RegistrationTarget::Host { ptr, len } = source.target() else {
            anyhow::bail!("the memcpy wire reads host memory only");
        };
        let base = SourceBase(ptr.as_ptr());
        std::thread::scope(|scope| {
            let (jobs, rx) = mpsc::channel::<Job>();
            let (tx, done) = mpsc::channel::<u64>();
            let thread = std::thread::Builder::new()
                .name("memcpy-wire".into())
                .spawn_scoped(scope, move || {
                    let base = base;
                    for job in rx {
                        // SAFETY: post() checked that [from, from + len) lies in the source
                        // and [to, to + len) in the destination; the poster keeps the
                        // source bytes valid and unmodified until we report the chunk
                        // done, and this thread ends inside `scope`, while the source is
                        // still borrowed.
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
            let mut wire = MemcpyWire {
                jobs: Some(jobs),
                done,
                source_len: len,
                destination_len,
                _scope: PhantomData,
            };
            let result = f(&mut wire);
            // Closing the job channel ends the thread (also when `f` panicked: the wire
            // drops while unwinding, and the scope joins the thread before going on).
            drop(wire);
            match thread.join() {
                Ok(destination) => Ok((result, destination)),
                Err(_) => anyhow::bail!("the memcpy wire's thread panicked"),
            }
        })
    }
}

// SAFETY: a chunk is reported (by index, in order) only after the thread copied it, and
// the thread reads nothing of a chunk after copying it.
unsafe impl ChunkWire for MemcpyWire<'_> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::host_buffer::verify_bytes;
    use crate::memory::{HostBuffer, SendSource};
    use crate::transfer::plan::ChunkPlan;
    use crate::transfer::schedule::Schedule;
    use std::time::Duration;

    /// 1 MiB, or 64 KiB under Miri (which runs these to check the wire's threads).
    const LEN: usize = if cfg!(miri) { 1 << 16 } else { 1 << 20 };

    #[test]
    fn the_schedule_copies_every_chunk_into_place() {
        let src = HostBuffer::with_pattern(LEN).unwrap();
        for (chunk, depth) in [(4096u64, 16u32), (10_000, 3), (LEN as u64, 1)] {
            let plan = ChunkPlan::new(src.len() as u64, chunk).unwrap();
            let schedule = Schedule::new(plan, depth, &src, Duration::from_secs(5));
            let (run, copy) = MemcpyWire::scope(&src, vec![0; src.len()], |wire| {
                schedule.run(&src, wire, "memcpy")
            })
            .unwrap();
            run.unwrap();
            let v = verify_bytes(&copy);
            assert!(v.ok(), "chunk {chunk}: {v:?}");
            assert_eq!(v.elements, LEN as u64 / 4);
        }
    }

    /// A source that fails to prepare chunk `fail_at`, after handing out the ones before.
    struct FailsAt {
        buffer: HostBuffer,
        fail_at: usize,
    }

    // SAFETY: delegates to HostBuffer, whose chunks are ranges of memory it never
    // rewrites; failing is always allowed.
    unsafe impl crate::memory::SendSource for FailsAt {
        fn len(&self) -> usize {
            self.buffer.len()
        }
        fn memory(&self) -> &dyn Registrable {
            &self.buffer
        }
        fn prepare_chunk(
            &self,
            offset: usize,
            len: usize,
            deadline: std::time::Instant,
        ) -> anyhow::Result<std::ops::Range<usize>> {
            anyhow::ensure!(offset / 4096 != self.fail_at, "planted failure");
            self.buffer.prepare_chunk(offset, len, deadline)
        }
        fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>> {
            crate::memory::SendSource::first_values(&self.buffer, count)
        }
        fn path(&self) -> crate::memory::DataPath {
            crate::memory::DataPath::HostMemory
        }
        fn copy_out(&self, offset: usize, dest: &mut [u8]) -> anyhow::Result<()> {
            crate::memory::SendSource::copy_out(&self.buffer, offset, dest)
        }
    }

    /// The audit's case: the schedule fails early with chunks still queued for the
    /// copying thread, and the source is freed right after. A wire that could be
    /// forgotten kept reading freed memory then (SIGSEGV, and Miri's use-after-free);
    /// the scoped wire's thread has ended before `scope` returns. Run under Miri in CI.
    #[test]
    fn a_wire_stops_reading_before_its_source_is_freed_even_after_an_early_error() {
        let source = FailsAt {
            buffer: HostBuffer::with_pattern(16 * 4096).unwrap(),
            fail_at: 9,
        };
        let plan = ChunkPlan::new(source.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 8, &source, Duration::from_secs(5));
        let (run, _) = MemcpyWire::scope(&source.buffer, vec![0; 16 * 4096], |wire| {
            schedule.run(&source, wire, "memcpy")
        })
        .unwrap();
        let e = run.unwrap_err().to_string();
        assert!(e.contains("planted failure"), "{e}");
        drop(source); // freed: nothing may read it any more
    }

    #[test]
    fn chunks_outside_the_buffers_are_refused() {
        let src = HostBuffer::with_pattern(4096).unwrap();
        let plan = ChunkPlan::new(8192, 4096).unwrap();
        let p = Posted {
            chunk: plan.get(1).unwrap(),
            bytes: 0..4096,
            signaled: true,
            last: true,
        };
        let (refused, _) = MemcpyWire::scope(&src, vec![0; 4096], |wire| {
            // SAFETY: refused before anything is copied.
            matches!(unsafe { wire.post(&[p]) }, Err(WireError::Broken(_)))
        })
        .unwrap();
        assert!(refused);
    }
}
