//! The sender's [`ChunkWire`] over TCP: one writer thread per stream writes each chunk
//! handed to it (a [`Frame`] header, then the bytes) straight from the source's memory;
//! the streams are grouped into rails, and `dispatch` says which stream takes each chunk
//! (one rail: chunk `i` on stream `i % N`; striped: the rail with the fewest in flight)
//! and when a rail has failed, whose chunks in flight then go to the other rails.
//! Chunks are reported done in order once every chunk before them has been written too.
//! "Done" means handed to the kernel, which copied the bytes: the source may reuse them
//! then, as after a NIC's send completion. Striped, every pass ends with an end marker on
//! each live stream ([`TcpWire::end_pass`]).
//!
//! With checksums (`--verify checksum|both`) each frame carries the chunk's CRC32C: the
//! one the GPU kernel computed where the data lives ([`TcpWire::next_transfer`]), or the
//! writer's own over the bytes it sends. The wire keeps every chunk's CRC32C for the
//! transfer's digest and for chunks sent again ([`TcpWire::resend`]). The test-only
//! fault injector flips a bit in a copy of the bytes after the checksum was taken.

use super::dispatch::Dispatch;
use super::frames::Frame;
use super::socket;
use crate::memory::{Registrable, RegistrationTarget};
use crate::rdma::Deadline;
use crate::transfer::faults::FaultInjector;
use crate::transfer::plan::Chunk;
use crate::transfer::schedule::{ChunkWire, Done, Pass, Posted, WireError};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::marker::PhantomData;
use std::net::{Shutdown, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Where a job's bytes are.
#[derive(Clone)]
enum Bytes {
    /// In the source's memory, from this offset (the schedule's chunks).
    Source { from: usize },
    /// A copy of its own (a chunk sent again).
    Owned(Arc<[u8]>),
}

/// One chunk for a writer thread.
#[derive(Clone)]
struct Job {
    bytes: Bytes,
    len: usize,
    /// Where it goes in the transfer.
    offset: u64,
    /// The schedule's pass it was posted in (chunks sent again: the pass they repair).
    pass: Pass,
    index: u64,
    /// Its CRC32C when known already (the GPU's, or the first sending's); with
    /// checksums on and none given, the writer computes it.
    crc: Option<u32>,
    /// 0 for the first sending, round `r` of resends for `r`.
    attempt: u32,
    /// A second sending (failover, or a chunk the receiver missed or found corrupt).
    resend: bool,
    /// A piece of a chunk sent again (`index` counts pieces): its CRC32C is its own, not
    /// the chunk's kept for the digest.
    piece: bool,
}

/// What a writer thread is given.
enum Work {
    Chunk(Job),
    /// The end of a pass (striped): an end marker naming the failed rails; `silent`
    /// (tests only): write nothing, as a link that died silently.
    End {
        failed_rails: u32,
        silent: bool,
    },
}

/// What the wire checks: CRC32C per chunk, and the test-only fault injector and silent
/// rail.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireChecks {
    pub checksum: bool,
    pub faults: Option<FaultInjector>,
    /// Tests only: this rail's streams leave out their end markers (a link that died
    /// silently after the rail's last chunk).
    pub silent_rail: Option<usize>,
}

/// A writer's report.
enum Report {
    /// Chunk `index` of `pass` written, with the CRC32C its frame carried.
    Written {
        stream: usize,
        pass: Pass,
        index: u64,
        crc: u32,
    },
    Failed {
        stream: usize,
        why: String,
    },
    /// The writer thread is leaving: it reads nothing of the source any more.
    Exited {
        stream: usize,
    },
}

/// How the streams are grouped: `rails[r]` lists rail `r`'s streams; `rail_timeout` is
/// `Some` for a striped transfer (any chunk on any rail, failover).
#[derive(Debug, Clone)]
pub struct WireRails {
    pub rails: Vec<Vec<usize>>,
    pub rail_timeout: Option<Duration>,
}

impl WireRails {
    /// One rail of `streams` streams, chunks fixed round-robin (an unstriped transfer).
    pub fn single(streams: usize) -> WireRails {
        WireRails {
            rails: vec![(0..streams).collect()],
            rail_timeout: None,
        }
    }
}

/// A rail the wire gave up on, for the report.
#[derive(Debug, Clone)]
pub struct RailFailed {
    pub rail: usize,
    pub why: String,
    pub at: Instant,
    /// Its chunks in flight, handed to the other rails.
    pub moved: u64,
    /// From `at` until the transfer's chunks were done in order again (the pass's stall
    /// beyond the detection); `None` if none was done after it in the pass.
    pub resumed: Option<Duration>,
}

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
    /// Each stream's job queue; `None` once its rail failed.
    jobs: Vec<Option<mpsc::Sender<Work>>>,
    done: mpsc::Receiver<Report>,
    checks: WireChecks,
    /// This transfer's chunk CRC32Cs: the GPU's, or filled in as the writers report.
    crcs: Vec<u32>,
    /// The GPU computed `crcs` before the transfer (the frames carry them as they are).
    precomputed: bool,
    /// Clones of the streams, to break blocked writes off (a failed rail, or a failed
    /// transfer).
    shutters: Vec<TcpStream>,
    source_len: usize,
    dispatch: Dispatch,
    /// The chunks handed out and not yet written, to hand to another rail if theirs fails.
    in_flight: BTreeMap<u64, Job>,
    /// Chunks written beyond `next_done`.
    written: BTreeSet<u64>,
    /// The lowest chunk index not yet known written.
    next_done: u64,
    /// Rails given up on during this transfer.
    failures: Vec<RailFailed>,
    failed: bool,
    /// The pass whose chunks are being posted and reported.
    pass: Option<Pass>,
    /// Each writer thread has left (it reads nothing of the source any more).
    exited: Vec<bool>,
    _scope: PhantomData<fn(&'w ()) -> &'w ()>,
}

impl TcpWire<'_> {
    /// Run `f` with a wire reading from `source` (host memory: a host buffer, a staging
    /// ring, mapped memory) and writing to `streams` (each cloned for its writer thread),
    /// grouped into rails as `rails` says; every writer thread has ended when this
    /// returns.
    pub fn scope<R>(
        source: &dyn Registrable,
        streams: &[TcpStream],
        rails: WireRails,
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
                dispatch: Dispatch::new(rails.rails, rails.rail_timeout, Instant::now()),
                in_flight: BTreeMap::new(),
                written: BTreeSet::new(),
                next_done: 0,
                failures: Vec::new(),
                failed: false,
                pass: None,
                exited: vec![false; streams.len()],
                _scope: PhantomData,
            };
            for (i, stream) in streams.iter().enumerate() {
                let stream = stream.try_clone()?;
                wire.shutters.push(stream.try_clone()?);
                let (jobs, rx) = mpsc::channel::<Work>();
                let tx = tx.clone();
                std::thread::Builder::new()
                    .name(format!("tcp-writer-{i}"))
                    .spawn_scoped(scope, move || {
                        // Sent however the writer leaves, a panic too: drain waits for it.
                        let _exit = ExitReport { tx: &tx, stream: i };
                        write_stream(i, stream, rx, &tx, base, checks, timeout);
                    })?;
                wire.jobs.push(Some(jobs));
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
        self.in_flight.clear();
        self.failures.clear();
        self.dispatch.next_transfer();
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

    /// The rails' bookkeeping (what each carried, which failed).
    pub fn dispatch(&self) -> &Dispatch {
        &self.dispatch
    }

    /// The rails given up on during this transfer.
    pub fn failures(&self) -> &[RailFailed] {
        &self.failures
    }

    /// Send `chunks` again, each with its bytes (copied out of the source), as round
    /// `round` of resends; wait until all are written, each within `timeout` of the
    /// last (a rail failing meanwhile hands its share to the others).
    pub fn resend(
        &mut self,
        chunks: Vec<(Chunk, Vec<u8>)>,
        round: u32,
        timeout: Duration,
    ) -> Result<(), WireError> {
        self.send_again(chunks, round, timeout, false)
    }

    /// Send `pieces` again (each a [`Chunk`] whose index counts pieces, with its bytes),
    /// as round `round`: each frame carries the piece's own CRC32C, computed by the
    /// writer over the bytes before any fault injection; wait as [`TcpWire::resend`].
    pub fn resend_pieces(
        &mut self,
        pieces: Vec<(Chunk, Vec<u8>)>,
        round: u32,
        timeout: Duration,
    ) -> Result<(), WireError> {
        self.send_again(pieces, round, timeout, true)
    }

    fn send_again(
        &mut self,
        chunks: Vec<(Chunk, Vec<u8>)>,
        round: u32,
        timeout: Duration,
        piece: bool,
    ) -> Result<(), WireError> {
        let mut waiting = BTreeSet::new();
        for (chunk, bytes) in chunks {
            let crc = match piece {
                true => None,
                false => self.crcs.get(chunk.index as usize).copied(),
            };
            let known = piece || !self.checks.checksum || crc.is_some();
            if bytes.len() as u64 != chunk.len || !known {
                return Err(self.broken(format!("chunk {} cannot be sent again", chunk.index)));
            }
            waiting.insert(chunk.index);
            let Some(pass) = self.pass else {
                return Err(self.broken("chunks sent again before any pass".into()));
            };
            let job = Job {
                len: bytes.len(),
                bytes: Bytes::Owned(bytes.into()),
                offset: chunk.offset,
                pass,
                index: chunk.index,
                crc,
                attempt: round,
                resend: true,
                piece,
            };
            self.hand_out(job)?;
        }
        let mut deadline = Deadline::after(timeout);
        while !waiting.is_empty() {
            let written = self.next_reports(&deadline, "chunks sent again to be written")?;
            if !written.is_empty() {
                deadline = Deadline::after(timeout);
            }
            for index in written {
                waiting.remove(&index);
            }
        }
        Ok(())
    }

    /// Striped: mark the end of a pass on every stream of the rails still alive (after
    /// the chunks queued there), naming the rails given up on. Nothing otherwise.
    pub fn end_pass(&mut self) -> Result<(), WireError> {
        if !self.dispatch.striped() {
            return Ok(());
        }
        let failed_rails = self.dispatch.failed_mask();
        for s in self.dispatch.live_streams() {
            let silent = self.checks.silent_rail == Some(self.dispatch.rail_of(s));
            if let Some(jobs) = &self.jobs[s] {
                // A writer that is gone failed, and says so in its report.
                let _ = jobs.send(Work::End {
                    failed_rails,
                    silent,
                });
            }
        }
        Ok(())
    }

    /// Hand `job` to a stream of a live rail; a stream whose writer is gone fails its
    /// rail, and the job goes to another.
    fn hand_out(&mut self, job: Job) -> Result<(), WireError> {
        loop {
            let now = Instant::now();
            let Some(stream) = self.dispatch.assign(job.index, now) else {
                return Err(self.broken(format!("no rail is left to carry chunk {}", job.index)));
            };
            self.in_flight.insert(job.index, job.clone());
            let sent = match &self.jobs[stream] {
                Some(jobs) => jobs.send(Work::Chunk(job.clone())).is_ok(),
                None => false,
            };
            if sent {
                return Ok(());
            }
            let rail = self.dispatch.rail_of(stream);
            self.fail_rail(rail, format!("the writer of stream {stream} is gone"), now)?;
        }
    }

    /// Give rail `rail` up: shut its sockets (a blocked write returns at once), stop its
    /// writers, and hand its chunks in flight to the other rails.
    fn fail_rail(&mut self, rail: usize, why: String, now: Instant) -> Result<(), WireError> {
        let lost = self.dispatch.fail(rail, why.clone(), now);
        for &s in self.dispatch.streams_of(rail) {
            let _ = self.shutters[s].shutdown(Shutdown::Both);
            self.jobs[s] = None;
        }
        if !self.dispatch.any_live() {
            return Err(self.broken(why));
        }
        self.failures.push(RailFailed {
            rail,
            why,
            at: now,
            moved: lost.len() as u64,
            resumed: None,
        });
        for index in lost {
            if let Some(mut job) = self.in_flight.remove(&index) {
                job.resend = true;
                self.hand_out(job)?;
            }
        }
        Ok(())
    }

    /// Wait until `deadline` for writer reports (at most a tenth of the rail timeout at a
    /// time, so a quiet rail is noticed), handle them and fail the rails that are overdue;
    /// the chunks newly written.
    fn next_reports(&mut self, deadline: &Deadline, what: &str) -> Result<Vec<u64>, WireError> {
        let tick = self
            .dispatch
            .rail_timeout()
            .map_or(Duration::MAX, |t| (t / 10).max(Duration::from_millis(1)));
        let first = match self.done.recv_timeout(deadline.remaining().min(tick)) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) if !deadline.remaining().is_zero() => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let e = deadline.timeout_error(what);
                return Err(self.broken(e.to_string()));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(self.broken("the writer threads are gone".into()))
            }
        };
        let reports: Vec<Report> = first.into_iter().chain(self.done.try_iter()).collect();
        let mut written = Vec::new();
        // Every report is read, also after one that breaks the wire: a writer's exit
        // taken from the channel and dropped with the rest of the batch would leave
        // `drain` waiting for it for ever.
        let mut broken = None;
        for r in reports {
            let now = Instant::now();
            if broken.is_some() {
                if let Report::Exited { stream } = r {
                    self.exited[stream] = true;
                    self.dispatch.writer_exited(stream);
                }
                continue;
            }
            match r {
                Report::Written {
                    stream,
                    pass,
                    index,
                    crc,
                } => {
                    // Another pass's chunk of the same index is not this one.
                    let Some(job) = self.in_flight.get(&index).filter(|j| j.pass == pass) else {
                        continue;
                    };
                    let (len, resend, piece) = (job.len as u64, job.resend, job.piece);
                    if !self.dispatch.written(stream, index, len, resend, now) {
                        continue;
                    }
                    self.in_flight.remove(&index);
                    if let Some(slot) = self.crcs.get_mut(index as usize).filter(|_| !piece) {
                        *slot = crc;
                    }
                    written.push(index);
                }
                Report::Failed { stream, why } => {
                    let rail = self.dispatch.rail_of(stream);
                    if let Err(e) = self.fail_rail(rail, why, now) {
                        broken = Some(e);
                    }
                }
                Report::Exited { stream } => {
                    self.exited[stream] = true;
                    self.dispatch.writer_exited(stream)
                }
            }
        }
        if let Some(e) = broken {
            return Err(e);
        }
        let now = Instant::now();
        for (rail, quiet) in self.dispatch.overdue(now) {
            let why = format!(
                "no chunk written for {} while it had chunks in flight (--rail-timeout)",
                crate::rdma::format_duration(quiet)
            );
            self.fail_rail(rail, why, now)?;
        }
        Ok(written)
    }

    fn broken(&mut self, why: String) -> WireError {
        self.failed = true;
        WireError::Broken(why)
    }
}

/// A writer thread: write each chunk handed to stream `i` (a frame header, then the
/// bytes), report it, stop at the first error.
fn write_stream(
    i: usize,
    mut stream: TcpStream,
    rx: mpsc::Receiver<Work>,
    tx: &mpsc::Sender<Report>,
    base: SourceBase,
    checks: WireChecks,
    timeout: Duration,
) {
    for work in rx {
        let job = match work {
            Work::Chunk(job) => job,
            Work::End { silent: true, .. } => continue,
            Work::End { failed_rails, .. } => {
                if let Err(e) = stream.write_all(&Frame::end(failed_rails).encode()) {
                    let why = socket::why(&e, timeout, "ending a pass");
                    let _ = tx.send(Report::Failed { stream: i, why });
                    return;
                }
                continue;
            }
        };
        let bytes: &[u8] = match &job.bytes {
            // SAFETY: post() checked that [from, from + len) lies inside the source; the
            // poster keeps those bytes valid and unmodified until the wire reports the
            // chunk done, which it does only after this thread reported it written, or,
            // when this stream's rail failed, after this thread has exited; and this
            // thread ends inside `scope`, while the source is borrowed.
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
        let report = match result {
            Ok(()) => Report::Written {
                stream: i,
                pass: job.pass,
                index: job.index,
                crc,
            },
            Err(e) => Report::Failed {
                stream: i,
                why: socket::why(&e, timeout, &format!("writing chunk {}", job.index)),
            },
        };
        let stop = matches!(report, Report::Failed { .. });
        if tx.send(report).is_err() || stop {
            return;
        }
    }
}

// SAFETY: a chunk is reported done only once every chunk of its pass up to it was
// written to a socket of a live rail (the kernel copied the bytes) and no writer of a
// failed rail that had it may still read it (held until those writers exited); a writer
// reads nothing of a chunk after reporting it; drain returns only once every writer has
// exited.
unsafe impl ChunkWire for TcpWire<'_> {
    fn batch(&self) -> usize {
        1
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
        for p in chunks {
            if self.pass != Some(p.pass) {
                // A new pass counts its chunks from nothing written.
                self.pass = Some(p.pass);
                self.written.clear();
                self.next_done = 0;
            }
            let fits = p.bytes.end <= self.source_len && p.bytes.start <= p.bytes.end;
            if !fits || p.bytes.len() as u64 != p.chunk.len || p.chunk.len > u32::MAX as u64 {
                return Err(self.broken(format!(
                    "chunk {} ({:?}) is outside the source or too long for a frame",
                    p.chunk.index, p.bytes
                )));
            }
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
                pass: p.pass,
                index: p.chunk.index,
                crc,
                attempt: 0,
                resend: false,
                piece: false,
            };
            self.hand_out(job)?;
        }
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<Done>, WireError> {
        let written = self.next_reports(deadline, "chunks to be written to the receiver")?;
        self.written.extend(written);
        let before = self.next_done;
        while !self.dispatch.held(self.next_done) && self.written.remove(&self.next_done) {
            self.next_done += 1;
        }
        if self.next_done > before {
            let now = Instant::now();
            for f in self.failures.iter_mut().filter(|f| f.resumed.is_none()) {
                f.resumed = Some(now.saturating_duration_since(f.at));
            }
        }
        Ok(match self.pass {
            Some(pass) if self.next_done > before => Some(Done {
                pass,
                through: self.next_done - 1,
            }),
            _ => None,
        })
    }

    /// A pass that ended early is over, and so is the connection's data: every socket's
    /// writing side is shut (a blocked write returns at once; the control socket can
    /// still read the receiver's last word), the job queues close, and this returns once
    /// every writer thread has left. Writers leave promptly then, so the wait needs no
    /// deadline of its own, and it must not return early: a writer still in
    /// `write_all` reads the source.
    fn drain(&mut self, _deadline: &Deadline) {
        self.failed = true;
        for s in &self.shutters {
            let _ = s.shutdown(Shutdown::Write);
        }
        for jobs in &mut self.jobs {
            *jobs = None;
        }
        while self.exited.iter().any(|e| !e) {
            match self.done.recv() {
                Ok(Report::Exited { stream }) => {
                    self.exited[stream] = true;
                    self.dispatch.writer_exited(stream);
                }
                Ok(_) => {}
                // Every writer is gone with its sender.
                Err(_) => break,
            }
        }
        self.in_flight.clear();
        self.written.clear();
    }
}

/// Tells the wire that a writer thread left, from its `Drop`: also when it panicked.
struct ExitReport<'a> {
    tx: &'a mpsc::Sender<Report>,
    stream: usize,
}

impl Drop for ExitReport<'_> {
    fn drop(&mut self) {
        let _ = self.tx.send(Report::Exited {
            stream: self.stream,
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{HostBuffer, RecvSink, POISON};
    use crate::transfer::plan::ChunkPlan;
    use crate::transfer::schedule::Schedule;
    use crate::transport::tcp::frames::{Frame, FRAME_LEN};
    use std::io::Read;
    use std::net::TcpListener;

    /// Every frame's payload the peer received, in arrival order, until the sender's side
    /// closed or broke (read after the sender was done).
    fn payloads(mut peer: TcpStream) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut head = [0u8; FRAME_LEN];
        while peer.read_exact(&mut head).is_ok() {
            let frame = Frame::decode(&head);
            let mut bytes = vec![0u8; frame.len as usize];
            if peer.read_exact(&mut bytes).is_err() {
                break; // cut off mid-frame: the wire broke off
            }
            out.push(bytes);
        }
        out
    }

    /// Issue 24, items 8 and 9, over TCP: a pass that fails at once (`Schedule::timeout`
    /// zero) while 64 MiB of chunks sit queued on the writers, and a peer that reads
    /// nothing until later. The source's owner then writes it (poison) and runs the
    /// next pass on the same wire. Before, the writers went on sending the source's
    /// bytes as they were rewritten (29.6 MB of poison reached the peer) and the second
    /// pass returned Ok from the first one's reports; now the first pass returns only
    /// once no writer reads the source, and the second is refused (the wire was broken
    /// off), so no rewritten byte reaches the peer.
    #[test]
    fn a_failed_pass_leaves_no_writer_sending_the_source_and_the_next_pass_is_refused() {
        const CHUNK: usize = 1 << 20;
        let src = HostBuffer::with_pattern(64 * CHUNK).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (peer, _) = listener.accept().unwrap();
        let plan = ChunkPlan::new(src.len() as u64, CHUNK as u64).unwrap();
        let schedule = Schedule::new(plan, 64, &src, Duration::ZERO);
        let timeout = Duration::from_secs(10);
        let (first, second) = TcpWire::scope(
            &src,
            &[sender],
            WireRails::single(1),
            timeout,
            WireChecks::default(),
            |wire| {
                wire.next_transfer(plan.count(), None);
                let first = schedule.run(&src, wire, "peer");
                src.poison().unwrap();
                wire.next_transfer(plan.count(), None);
                let again = Schedule::new(plan, 64, &src, timeout);
                (first, again.run(&src, wire, "peer"))
            },
        )
        .unwrap();
        assert!(first.is_err(), "a zero timeout fails the pass");
        assert!(second.is_err(), "the wire was broken off: {second:?}");
        let poison = POISON.to_ne_bytes();
        let received = payloads(peer);
        let rewritten = received
            .iter()
            .filter(|p| p.chunks(4).any(|w| w == poison))
            .count();
        assert_eq!(
            rewritten,
            0,
            "{rewritten} of {} chunks received carried bytes written after the pass",
            received.len()
        );
    }
}
