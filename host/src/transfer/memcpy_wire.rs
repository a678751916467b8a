//! A [`ChunkWire`] that does to each chunk what a NIC's read would: a host `memcpy` of
//! its bytes into a second buffer, on a thread of its own, in order. The GPU benchmark
//! measures the staged pipeline with it, and the GPU tests drive sources through the
//! real schedule with it, on the GPU machine, which has no NIC.

use super::schedule::{ChunkWire, Done, Pass, Posted, WireError};
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

/// What the copying thread is given.
enum Job {
    /// One chunk: source and destination byte offsets, length, pass and index.
    Copy {
        from: usize,
        to: usize,
        len: usize,
        pass: Pass,
        index: u64,
        signaled: bool,
    },
    /// Answer once every job before this one is over ([`ChunkWire::drain`]).
    Fence,
}

/// What the copying thread reports.
enum Report {
    Copied(Done),
    Fenced,
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
    done: mpsc::Receiver<Report>,
    /// Set while draining: the thread skips the copies still queued (they belong to a
    /// pass that is over) until it reaches the fence.
    skip: Arc<AtomicBool>,
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
        let skip = Arc::new(AtomicBool::new(false));
        let skipping = skip.clone();
        std::thread::scope(|scope| {
            let (jobs, rx) = mpsc::channel::<Job>();
            let (tx, done) = mpsc::channel::<Report>();
            let thread = std::thread::Builder::new()
                .name("memcpy-wire".into())
                .spawn_scoped(scope, move || {
                    let base = base;
                    for job in rx {
                        let report = match job {
                            Job::Fence => {
                                skipping.store(false, Ordering::Release);
                                Report::Fenced
                            }
                            Job::Copy { .. } if skipping.load(Ordering::Acquire) => continue,
                            Job::Copy {
                                from,
                                to,
                                len,
                                pass,
                                index,
                                signaled,
                            } => {
                                // SAFETY: post() checked that [from, from + len) lies in the
                                // source and [to, to + len) in the destination; the poster
                                // keeps the source bytes valid and unmodified until we
                                // report the chunk done or the fence of a drain behind it,
                                // and this thread ends inside `scope`, while the source is
                                // still borrowed.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        base.0.add(from),
                                        destination.as_mut_ptr().add(to),
                                        len,
                                    )
                                };
                                if !signaled {
                                    continue;
                                }
                                Report::Copied(Done {
                                    pass,
                                    through: index,
                                })
                            }
                        };
                        if tx.send(report).is_err() {
                            break;
                        }
                    }
                    destination
                })?;
            let mut wire = MemcpyWire {
                jobs: Some(jobs),
                done,
                skip,
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

// SAFETY: a chunk is reported (by pass and index, in order) only after the thread copied
// it, and the thread reads nothing of a chunk after copying it; drain returns only once
// the thread answered a fence queued behind every chunk posted, so it has copied or
// skipped them all.
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
            let job = Job::Copy {
                from: p.bytes.start,
                to,
                len: p.bytes.len(),
                pass: p.pass,
                index: p.chunk.index,
                signaled: p.signaled,
            };
            jobs.send(job)
                .map_err(|_| WireError::Broken("the copying thread is gone".into()))?;
        }
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<Done>, WireError> {
        let mut latest: Option<Done> = None;
        let mut take = |report: Report| {
            if let Report::Copied(d) = report {
                // In order: a later report covers the ones of its pass before it.
                latest = Some(d);
            }
        };
        match self.done.recv_timeout(deadline.remaining()) {
            Ok(report) => take(report),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                return Err(WireError::Broken(
                    deadline.timeout_error("chunks to be copied").to_string(),
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(WireError::Broken("the copying thread is gone".into()))
            }
        };
        for report in self.done.try_iter() {
            take(report);
        }
        Ok(latest)
    }

    /// The copying thread skips what is still queued and answers a fence; copies never
    /// block, so waiting for the fence without a deadline ends (a thread that is gone has
    /// stopped reading too).
    fn drain(&mut self, _deadline: &Deadline) {
        let Some(jobs) = &self.jobs else { return };
        self.skip.store(true, Ordering::Release);
        if jobs.send(Job::Fence).is_err() {
            return;
        }
        while let Ok(report) = self.done.recv() {
            if matches!(report, Report::Fenced) {
                return;
            }
        }
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

    /// A source that fails to prepare chunk `fail_at`, after handing out the ones before
    /// (of 4 KiB each); its length is the buffer's, or `len` if given (a prefix of it).
    struct FailsAt<'a> {
        buffer: &'a HostBuffer,
        fail_at: usize,
        len: Option<usize>,
    }

    // SAFETY: delegates to HostBuffer, whose chunks are ranges of memory it never
    // rewrites; failing is always allowed.
    unsafe impl crate::memory::SendSource for FailsAt<'_> {
        fn len(&self) -> usize {
            self.len.unwrap_or(self.buffer.len())
        }
        fn memory(&self) -> &dyn Registrable {
            self.buffer
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
            crate::memory::SendSource::first_values(self.buffer, count)
        }
        fn path(&self) -> crate::memory::DataPath {
            crate::memory::DataPath::HostMemory
        }
        fn copy_out(&self, offset: usize, dest: &mut [u8]) -> anyhow::Result<()> {
            crate::memory::SendSource::copy_out(self.buffer, offset, dest)
        }
    }

    /// The audit's case: the schedule fails early with chunks still queued for the
    /// copying thread, and the source is freed right after. A wire that could be
    /// forgotten kept reading freed memory then (SIGSEGV, and Miri's use-after-free);
    /// the scoped wire's thread has ended before `scope` returns. Run under Miri in CI.
    #[test]
    fn a_wire_stops_reading_before_its_source_is_freed_even_after_an_early_error() {
        let buffer = HostBuffer::with_pattern(16 * 4096).unwrap();
        let source = FailsAt {
            buffer: &buffer,
            fail_at: 9,
            len: None,
        };
        let plan = ChunkPlan::new(source.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 8, &source, Duration::from_secs(5));
        let (run, _) = MemcpyWire::scope(&buffer, vec![0; 16 * 4096], |wire| {
            schedule.run(&source, wire, "memcpy")
        })
        .unwrap();
        let e = run.unwrap_err().to_string();
        assert!(e.contains("planted failure"), "{e}");
        drop(buffer); // freed: nothing may read it any more
    }

    /// Issue 24, item 8: a pass that ends early (a destination too short for chunk 8) with
    /// chunks still queued on the copying thread; the source is then poisoned through
    /// `&self` (`RecvSink::poison`). Before, the thread went on copying while the poison
    /// was written: Miri reported the data race, and poison reached the destination.
    /// Now the pass returns only once the wire has stopped reading.
    #[test]
    fn a_pass_that_ends_early_leaves_no_copy_running_when_it_returns() {
        use crate::memory::RecvSink;
        const CHUNK: usize = 4096;
        let src = HostBuffer::with_pattern(16 * CHUNK).unwrap();
        let plan = ChunkPlan::new(src.len() as u64, CHUNK as u64).unwrap();
        let schedule = Schedule::new(plan, 16, &src, Duration::from_secs(5));
        let (run, copy) = MemcpyWire::scope(&src, vec![0; 8 * CHUNK], |wire| {
            let run = schedule.run(&src, wire, "memcpy");
            src.poison().unwrap(); // the source's owner may write it now
            run
        })
        .unwrap();
        let e = run.unwrap_err().to_string();
        assert!(e.contains("outside the source or destination"), "{e}");
        let poison = crate::memory::POISON.to_ne_bytes();
        assert!(
            !copy.chunks(4).any(|w| w == poison),
            "a chunk was copied after the pass had returned"
        );
    }

    /// Issue 24, item 9: after a pass fails early, a second pass on the same wire must not
    /// take the first one's reports for its own. Before, a shorter second pass (the next
    /// transfer, 4 chunks) returned Ok from the first pass's report of chunk 7 while its
    /// own chunks were still queued, and the source written after (poison here) reached
    /// the destination.
    #[test]
    fn a_second_pass_on_the_same_wire_waits_for_its_own_chunks() {
        use crate::memory::RecvSink;
        const CHUNK: usize = 4096;
        let buffer = HostBuffer::with_pattern(16 * CHUNK).unwrap();
        let first = FailsAt {
            buffer: &buffer,
            fail_at: 12,
            len: None,
        };
        let second = FailsAt {
            buffer: &buffer,
            fail_at: usize::MAX,
            len: Some(4 * CHUNK),
        };
        let schedule = |s: &FailsAt| {
            let plan = ChunkPlan::new(s.len() as u64, CHUNK as u64).unwrap();
            Schedule::new(plan, 8, s, Duration::from_secs(5))
        };
        let (long, short) = (schedule(&first), schedule(&second));
        let (ran, copy) = MemcpyWire::scope(&buffer, vec![0; 16 * CHUNK], |wire| {
            assert!(long.run(&first, wire, "memcpy").is_err(), "planted failure");
            let ran = short.run(&second, wire, "memcpy");
            buffer.poison().unwrap(); // the source's owner may write it now
            ran
        })
        .unwrap();
        ran.unwrap();
        let v = verify_bytes(&copy[..4 * CHUNK]);
        assert!(
            v.ok(),
            "the second pass copied its chunks before returning: {v:?}"
        );
    }

    #[test]
    fn chunks_outside_the_buffers_are_refused() {
        let src = HostBuffer::with_pattern(4096).unwrap();
        let plan = ChunkPlan::new(8192, 4096).unwrap();
        let p = Posted {
            pass: Pass::fresh(),
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
