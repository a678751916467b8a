//! The sender's chunk schedule, apart from what carries the chunks.
//!
//! One pass of the data: ask the source for chunk after chunk (a staging ring copies it
//! into a slot first), hand them to a [`ChunkWire`] in batches, keep at most `window` of
//! them in flight, and give each back to the source once the wire reports it done. The
//! engine's sender ([`crate::engine::sending::Sending`]) hands them to a link (a TCP
//! stream set or verbs queue pairs); the GPU benchmark's and tests'
//! [`MemcpyWire`](super::memcpy_wire::MemcpyWire) copies each chunk into a second
//! buffer on its own thread, as a NIC would read it. Both run this
//! same code, so what the benchmark measures and the tests check is what the sender does.

use super::plan::{Chunk, ChunkPlan};
use super::TransferError;
use crate::memory::SendSource;
use crate::rdma::Deadline;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Which pass of the schedule a chunk belongs to: the tag every item and every report of
/// a link names too.
pub use super::plan::Pass;

/// What [`ChunkWire::wait`] reports: every chunk of `pass` up to index `through` is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub pass: Pass,
    pub through: u64,
}

/// One chunk handed to the wire: where it goes in the transfer, and where its bytes lie
/// in the source's registered memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    /// The pass it belongs to: the wire's reports of it name this pass.
    pub pass: Pass,
    pub chunk: Chunk,
    pub bytes: Range<usize>,
    /// The wire must report this one's completion (the last chunk, and one in every
    /// `signal_every`); a report covers every chunk before it too.
    pub signaled: bool,
    pub last: bool,
}

/// How a wire failed.
#[derive(Debug)]
pub enum WireError {
    /// The transfer broke off (a failed completion, the peer gone, a timeout): why.
    Broken(String),
    /// Anything else, already a transfer error.
    Other(TransferError),
}

impl From<crate::rdma::RdmaError> for WireError {
    fn from(e: crate::rdma::RdmaError) -> Self {
        WireError::Other(e.into())
    }
}

/// What carries the chunks.
///
/// # Safety
/// The schedule gives a chunk back to its source once [`wait`](ChunkWire::wait) reports it
/// done, and a staging ring then overwrites its slot. So an implementation:
/// - reports a chunk index of a pass only when nothing (its threads, the NIC) reads any
///   chunk of that pass up to it any more, names the pass the chunks were posted with,
///   and reads a posted chunk's bytes only until it reported it;
/// - returns from [`drain`](ChunkWire::drain) only once nothing reads any chunk posted
///   so far, of any pass: after it, the source's owner may write any of them.
pub unsafe trait ChunkWire {
    /// Chunks per [`post`](ChunkWire::post) call (one doorbell for all).
    fn batch(&self) -> usize {
        1
    }

    /// Hand `chunks` to the wire, in order.
    ///
    /// # Safety
    /// The bytes each chunk names in the source's memory must stay valid and unmodified
    /// until [`wait`](ChunkWire::wait) has reported that chunk done.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError>;

    /// Wait, until `deadline`, for more chunks to be done; return the pass and the highest
    /// chunk index of it known done (all chunks of the pass up to it are), or `None` if
    /// woken for something else.
    fn wait(&mut self, deadline: &Deadline) -> Result<Option<Done>, WireError>;

    /// Stop reading every chunk posted so far: wait for them, or break the wire off (a
    /// pass that ended early is over; the wire may refuse the next one). Returns only
    /// once nothing reads any of them; `deadline` bounds the waiting before the wire is
    /// broken off. [`Schedule::run`] calls it on every way out of a pass that leaves
    /// chunks posted and not reported done: an error, or a panic.
    fn drain(&mut self, deadline: &Deadline);
}

/// The shape of one pass.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub plan: ChunkPlan,
    /// Chunks in flight at most.
    pub window: u64,
    /// Every how many chunks one is signaled.
    pub signal_every: u64,
    /// The longest the wire may go without completing a chunk.
    pub timeout: Duration,
    /// Draw a progress bar on stderr when the pass takes more than a moment.
    pub progress: bool,
}

impl Schedule {
    /// `window` chunks in flight (at most the source's limit), a quarter of them
    /// signaled: one completion then stands for all chunks before it, and a window
    /// always holds a signaled chunk, so it drains.
    pub fn new(plan: ChunkPlan, depth: u32, source: &dyn SendSource, timeout: Duration) -> Self {
        let window = (depth as u64)
            .min(
                source
                    .max_chunks_in_flight()
                    .map_or(u64::MAX, |m| m.max(1) as u64),
            )
            .min(plan.count())
            .max(1);
        Schedule {
            plan,
            window,
            signal_every: (window / 4).max(1),
            timeout,
            progress: false,
        }
    }

    /// One pass of `source` over `wire`; returns the time from the first chunk handed to
    /// the wire to the last one done. `peer` names the other end in errors.
    pub fn run(
        &self,
        source: &dyn SendSource,
        wire: &mut dyn ChunkWire,
        peer: &str,
    ) -> Result<Duration, TransferError> {
        let plan = &self.plan;
        let (n, total) = (plan.count(), plan.total());
        if source.len() as u64 != total {
            return Err(TransferError::Protocol(format!(
                "the source holds {} bytes for a {total}-byte transfer",
                source.len()
            )));
        }
        source.begin_pass().map_err(TransferError::Memory)?;
        let pass = Pass::fresh();
        // Whatever way this pass ends before every chunk is done (an error, a panic),
        // the wire stops reading the chunks it was given before the source is given back.
        let mut outstanding = Outstanding {
            wire,
            posted: false,
            timeout: self.timeout,
        };
        let wire = &mut *outstanding.wire;
        let broken = |done: u64, why: String| TransferError::Broken {
            peer: peer.to_string(),
            done: plan.bytes_through(done),
            total,
            why,
        };
        let batch_max = wire.batch().max(1);
        let mut batch: Vec<Posted> = Vec::with_capacity(batch_max);
        let mut progress = Progress::new(self.progress, total);
        let mut next = 0u64; // next chunk to hand over
        let mut done = 0u64; // chunks known done
        let start = Instant::now();
        let mut deadline = Deadline::after(self.timeout);
        while done < n {
            while next < n && next - done < self.window {
                let Some(chunk) = plan.get(next) else { break };
                let bytes = source
                    .prepare_chunk(chunk.offset as usize, chunk.len as usize, deadline.at())
                    .map_err(TransferError::Memory)?;
                if bytes.len() as u64 != chunk.len {
                    return Err(TransferError::Protocol(format!(
                        "the source gave {} bytes for chunk {next} of {} bytes",
                        bytes.len(),
                        chunk.len
                    )));
                }
                let last = next + 1 == n;
                batch.push(Posted {
                    pass,
                    chunk,
                    bytes,
                    signaled: last || (next + 1).is_multiple_of(self.signal_every),
                    last,
                });
                next += 1;
                if batch.len() >= batch_max {
                    outstanding.posted = true;
                    // SAFETY: the source leaves a prepared chunk's bytes alone until
                    // release_chunk, which comes only after the wire reports it done.
                    unsafe { post(wire, &mut batch, done, &broken)? };
                }
            }
            if !batch.is_empty() {
                outstanding.posted = true;
                // SAFETY: as above.
                unsafe { post(wire, &mut batch, done, &broken)? };
            }
            match wire.wait(&deadline) {
                // Another pass's report (one that ended early on this wire): not ours.
                Ok(Some(report)) if report.pass != pass => {}
                Ok(Some(Done { through: index, .. })) => {
                    let through = (index + 1).min(next);
                    while done < through {
                        if let Some(chunk) = plan.get(done) {
                            // SAFETY: the wire reported every chunk up to `index` done,
                            // and ChunkWire's contract says it no longer reads them.
                            unsafe { source.release_chunk(chunk.offset as usize) };
                        }
                        done += 1;
                    }
                    deadline = Deadline::after(self.timeout);
                }
                Ok(None) => {}
                Err(WireError::Broken(why)) => return Err(broken(done, why)),
                Err(WireError::Other(e)) => return Err(e),
            }
            progress.update(plan.bytes_through(done));
        }
        // Every chunk is done: the wire reads none of them.
        outstanding.posted = false;
        Ok(start.elapsed())
    }
}

/// A pass's wire while chunks may be posted and not done: dropped on any way out of
/// [`Schedule::run`], it drains the wire unless the pass finished.
struct Outstanding<'a> {
    wire: &'a mut dyn ChunkWire,
    posted: bool,
    timeout: Duration,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if self.posted {
            self.wire.drain(&Deadline::after(self.timeout));
        }
    }
}

/// Hand `batch` to the wire and empty it.
///
/// # Safety
/// As for [`ChunkWire::post`].
unsafe fn post(
    wire: &mut dyn ChunkWire,
    batch: &mut Vec<Posted>,
    done: u64,
    broken: &dyn Fn(u64, String) -> TransferError,
) -> Result<(), TransferError> {
    // SAFETY: the caller's contract.
    let result = unsafe { wire.post(batch) };
    batch.clear();
    match result {
        Ok(()) => Ok(()),
        Err(WireError::Broken(why)) => Err(broken(done, why)),
        Err(WireError::Other(e)) => Err(e),
    }
}

/// A progress bar that appears only after the transfer has run for a moment.
struct Progress {
    enabled: bool,
    start: Instant,
    total: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    const DELAY: Duration = Duration::from_millis(500);

    fn new(enabled: bool, total: u64) -> Self {
        Progress {
            enabled,
            start: Instant::now(),
            total,
            bar: None,
        }
    }

    fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() && self.start.elapsed() >= Self::DELAY {
            // A few redraws a second: drawing happens on the transfer's thread.
            let bar = ProgressBar::with_draw_target(
                Some(self.total),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HostBuffer;

    /// A wire that completes every signaled chunk at the next wait and records what it
    /// was given: the schedule's bookkeeping, without a transport.
    #[derive(Default)]
    struct Recorder {
        posted: Vec<Posted>,
        /// Chunks reported done so far.
        completed: u64,
        /// The most chunks ever outstanding.
        in_flight_max: u64,
        pending: Vec<(Pass, u64)>,
        fail_at: Option<u64>,
        /// Reports of an earlier pass, handed out before any of the current one's.
        stale: Vec<Done>,
        drained: u32,
    }

    // SAFETY: a recorder reads no bytes at all.
    unsafe impl ChunkWire for Recorder {
        fn batch(&self) -> usize {
            3
        }
        /// # Safety
        /// As [`ChunkWire::post`] says.
        unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
            for p in chunks {
                if self.fail_at == Some(p.chunk.index) {
                    return Err(WireError::Broken("planted failure".into()));
                }
                self.posted.push(p.clone());
                self.in_flight_max = self
                    .in_flight_max
                    .max(self.posted.len() as u64 - self.completed);
                if p.signaled {
                    self.pending.push((p.pass, p.chunk.index));
                }
            }
            Ok(())
        }
        fn wait(&mut self, _: &Deadline) -> Result<Option<Done>, WireError> {
            if let Some(stale) = self.stale.pop() {
                return Ok(Some(stale));
            }
            let last_done = self.pending.drain(..).max_by_key(|&(_, i)| i);
            if let Some((_, i)) = last_done {
                self.completed = i + 1;
            }
            Ok(last_done.map(|(pass, through)| Done { pass, through }))
        }
        fn drain(&mut self, _: &Deadline) {
            self.drained += 1;
            self.pending.clear();
        }
    }

    fn source(len: usize) -> HostBuffer {
        HostBuffer::with_pattern(len).unwrap()
    }

    #[test]
    fn every_chunk_is_handed_over_once_in_order_with_its_bytes() {
        let src = source(10 * 4096 + 12);
        let plan = ChunkPlan::new(src.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 4, &src, Duration::from_secs(1));
        assert_eq!((schedule.window, schedule.signal_every), (4, 1));
        let mut wire = Recorder::default();
        schedule.run(&src, &mut wire, "test").unwrap();
        assert_eq!(wire.posted.len(), 11);
        for (i, p) in wire.posted.iter().enumerate() {
            assert_eq!(p.chunk.index, i as u64);
            assert_eq!(p.bytes.start as u64, p.chunk.offset);
            assert_eq!(p.bytes.len() as u64, p.chunk.len);
            assert_eq!(p.last, i == 10);
        }
        assert!(wire.posted.last().unwrap().signaled);
        assert_eq!(wire.in_flight_max, 4, "the window is kept, and filled");
    }

    #[test]
    fn a_source_can_be_sent_again_and_again() {
        let src = source(64 * 1024);
        let plan = ChunkPlan::new(src.len() as u64, 8192).unwrap();
        let schedule = Schedule::new(plan, 16, &src, Duration::from_secs(1));
        for _ in 0..3 {
            let mut wire = Recorder::default();
            schedule.run(&src, &mut wire, "test").unwrap();
            assert_eq!(wire.posted.len(), 8);
        }
    }

    #[test]
    fn a_broken_wire_says_how_far_the_transfer_got() {
        let src = source(8 * 4096);
        let plan = ChunkPlan::new(src.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 2, &src, Duration::from_secs(1));
        let mut wire = Recorder {
            fail_at: Some(5),
            ..Recorder::default()
        };
        let e = schedule.run(&src, &mut wire, "192.0.2.1:7471").unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("transfer to 192.0.2.1:7471 failed after"),
            "{text}"
        );
        assert!(text.contains("planted failure"), "{text}");
        assert_eq!(
            wire.drained, 1,
            "a pass that failed with chunks posted drains"
        );
    }

    #[test]
    fn a_pass_that_finishes_does_not_drain_and_one_that_posts_nothing_does_not_either() {
        let src = source(8 * 4096);
        let plan = ChunkPlan::new(src.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 2, &src, Duration::from_secs(1));
        let mut wire = Recorder::default();
        schedule.run(&src, &mut wire, "x").unwrap();
        assert_eq!(wire.drained, 0);
        let mut first = Recorder {
            fail_at: Some(0),
            ..Recorder::default()
        };
        schedule.run(&src, &mut first, "x").unwrap_err();
        assert_eq!(first.drained, 1, "posting was attempted");
    }

    /// The audit's case over a recording wire: reports of an earlier pass that ended
    /// early come back first; the schedule must not count them for its own chunks.
    #[test]
    fn another_passes_reports_are_not_taken_for_this_ones() {
        let src = source(8 * 4096);
        let plan = ChunkPlan::new(src.len() as u64, 4096).unwrap();
        let schedule = Schedule::new(plan, 8, &src, Duration::from_secs(1));
        let earlier = Pass::fresh();
        let mut wire = Recorder {
            stale: vec![Done {
                pass: earlier,
                through: 7,
            }],
            ..Recorder::default()
        };
        schedule.run(&src, &mut wire, "x").unwrap();
        // Had the stale report counted, the pass would have ended with the whole window
        // posted and only that report seen: every chunk was done by its own report.
        assert_eq!(wire.completed, 8);
        assert!(wire.posted.iter().all(|p| p.pass != earlier));
    }

    #[test]
    fn a_source_of_another_size_is_refused() {
        let src = source(4096);
        let plan = ChunkPlan::new(8192, 4096).unwrap();
        let schedule = Schedule::new(plan, 2, &src, Duration::from_secs(1));
        let mut wire = Recorder::default();
        assert!(schedule.run(&src, &mut wire, "x").is_err());
        assert!(wire.posted.is_empty());
    }
}
