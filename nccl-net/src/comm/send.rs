//! The send comm: NCCL's `isend` matched against the receiver's clear-to-send frames,
//! or, while no receive is known to be posted, sent at once as an eager message (up to
//! `EAGER_MAX` bytes, `EAGER_BUDGET` per comm not yet placed) that the receiver keeps
//! in a bounce buffer until a match frame from this side places it; each message cut
//! into pieces with a CRC32C in each piece's header; a request is done
//! when the receiver acked the message (checks on) or its last byte went out (checks
//! off). Pieces the receiver found corrupt are sent again, up to `MAX_RESENDS` times.
//!
//! A checked message of at most `KEEP_MAX` bytes is copied by the writers as its pieces
//! go out (into one of at most `KEEP_BUFFERS` buffers of the comm): its request is done
//! when its last byte went out, as with the checks off, and a piece found corrupt is
//! sent again from the copy, kept until the ack. Why: under NCCL a send buffer comes
//! back to the GPU only when `test` says done, and at NCCL's default 128 KiB steps the
//! wait for the receiver's ack (a round trip through both ends' threads) took a median
//! 145 µs of a step's 611 (`docs/measurements/h100/2026-12-06-nccl-plugin/k-step-trace`;
//! small sends gained up to 3 × from the copy, `l-kept-copy`).
//!
//! Threads: one writer per data socket takes the next queued piece (any writer, any
//! piece: the sockets share the load), takes its CRC and writes header and bytes
//! straight from NCCL's buffer; one control reader takes clear-to-send, ack and resend
//! frames as they arrive. NCCL's calls (`isend`, `test`) only look at and change the
//! shared state under its lock: they never do I/O and never wait.

mod kept;
mod matching;

use kept::{Copies, Kept, PieceSource};
use matching::{direct_match, on_ctrl};

use super::threads::{halt_comm, stop_comm, Workers};
use super::{free_slot, Handles, SEND_MAGIC};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::config::Config;
use crate::error::{io_err, NetError, Result};
use crate::integrity::{self, Counters, FaultInjector};
use crate::log::{info, NET};
use crate::sock::{self, Io, RawBuf};
use crate::trace::Trace;
use crate::wire::{
    Ctrl, Handle, Layout, PieceHeader, PostedSlot, EAGER_BUDGET, EAGER_MAX, EAGER_MESSAGES,
    EAGER_SLOT,
};
use socket2::Socket;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

struct Cts {
    id: u64,
    slots: Vec<PostedSlot>,
    matched: Vec<bool>,
}

struct SendReq {
    /// Trace number (NCCL_GRDMA_TRACE).
    tn: u64,
    data: RawBuf,
    size: u64,
    cts_id: u64,
    slot: u8,
    layout: Layout,
    /// Pieces queued or in a writer's hands: the request is not done while any is,
    /// so no thread reads NCCL's buffer after `test` handed it back.
    unsent: u32,
    /// Sends of each piece after the first.
    attempts: Vec<u16>,
    checked: bool,
    acked: bool,
    /// Pieces a writer took (an eager message none of whose pieces went yet can still
    /// become a direct one when its clear-to-send arrives: no bounce, no match frame).
    taken: u32,
    /// The message's number and tag (`PieceHeader::index`, `tag`).
    index: u64,
    tag: i32,
    /// The copy of a message of at most `KEEP_MAX` bytes (checks on): its pieces are
    /// copied here as they first go out and sent again from here, so `test` may hand
    /// NCCL's buffer back before the ack.
    kept: Option<Kept>,
    /// `test` reported the request done (a kept message waiting for its ack): NCCL
    /// no longer knows it, its slot is freed when the ack comes.
    reported: bool,
}

/// An eager message the sender has not yet matched to a receive (in isend order).
struct Unresolved {
    seq: u64,
    tag: i32,
    size: u64,
}

/// What a writer does next: a piece of a request, or a match frame.
#[derive(Clone, Copy)]
enum Work {
    Piece(usize, u32),
    Match { seq: u64, cts_id: u64, slot: u8 },
}

struct State {
    cts: VecDeque<Cts>,
    reqs: Vec<Option<SendReq>>,
    /// Pieces and match frames to write, in order; resends go first.
    queue: VecDeque<Work>,
    /// Eager messages sent before their receive was known, oldest first: every later
    /// message goes eager too (or waits), so that messages match receives in order.
    unresolved: VecDeque<Unresolved>,
    /// Match frames queued and not yet written (the receiver places an eager message
    /// that was sent before its receive only once its match frame comes).
    matches_unwritten: usize,
    /// Bytes of `unresolved` (bounded by EAGER_BUDGET).
    eager_bytes: u64,
    /// The next eager message's sequence number.
    eager_seq: u64,
    /// The next message's number (`PieceHeader::index`: the receive buffer it takes).
    next_index: u64,
    /// The receiver places eager messages for receives of one buffer by their number
    /// (the handle said so): no match frame for those.
    by_number: bool,
    /// Requests made (trace numbers).
    made: u64,
    failed: Option<NetError>,
    peer_closed: bool,
    injector: Option<FaultInjector>,
    counters: Counters,
    /// Copy buffers not in use (`KEEP_MAX` bytes each).
    /// Copy buffers of small messages (`send/kept.rs`).
    copies: Copies,
}

struct Shared {
    state: Mutex<State>,
    /// Writers wait here for pieces.
    work: Condvar,
    stop: AtomicBool,
    peer: SocketAddr,
    trace: Trace,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the comm's first failure; every later call on it returns it.
    fn fail(&self, e: NetError) {
        let mut st = self.lock();
        if st.failed.is_none() && !self.stop.load(Ordering::Relaxed) {
            st.failed = Some(e);
        }
        drop(st);
        self.work.notify_all();
    }
}

impl Shared {
    /// A data socket's write failed. Where the receiver closed it (`EPIPE`,
    /// `ECONNRESET`) its reason may be on its way on the control socket (a refused
    /// handle), so the control reader gets `PEER_REASON_WAIT` to record that first; else
    /// the comm fails with this socket's error.
    fn fail_write(&self, i: usize, e: std::io::Error) {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        if !matches!(e.kind(), BrokenPipe | ConnectionReset) {
            return self.fail(io_err(format!("data socket {i} to {}", self.peer), e));
        }
        let t0 = std::time::Instant::now();
        let mut st = self.lock();
        while st.failed.is_none() && !st.peer_closed && t0.elapsed() < PEER_REASON_WAIT {
            st = self
                .work
                .wait_timeout(st, PEER_REASON_WAIT / 10)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(st);
        self.fail(NetError::remote(format!(
            "the receiver at {} closed data socket {i} ({e})",
            self.peer
        )));
    }
}

/// How long a writer whose socket the receiver closed waits for the receiver's reason on
/// the control socket (see `Shared::fail_write`).
const PEER_REASON_WAIT: Duration = Duration::from_millis(200);

/// A piece a writer took from the queue, with what it needs outside the lock.
struct Job {
    /// The request the piece belongs to (None: a match frame).
    ri: Option<usize>,
    tn: u64,
    header: PieceHeader,
    data: RawBuf,
    len: usize,
    /// A kept message's first send of this piece: copy these `len` bytes (in NCCL's
    /// buffer) to `data` (in the copy) first.
    copy_from: Option<RawBuf>,
    /// Fault injection: corrupt this piece (after its CRC was taken).
    corrupt: bool,
}

#[repr(C)]
pub struct SendComm {
    magic: u64,
    shared: Arc<Shared>,
    socks: Vec<Arc<Socket>>,
    workers: Option<Workers>,
    handles: Option<Handles>,
    streams: usize,
    checks: bool,
    /// `NCCL_GRDMA_EAGER_MAX`.
    eager_max: u64,
}

impl SendComm {
    pub fn new(ctrl: Socket, data: Vec<Socket>, handle: Handle, cfg: Config) -> Result<Box<Self>> {
        let injector = match (cfg.inject_one_in, cfg.checks) {
            (Some(n), true) => Some(FaultInjector::new(n, handle.token ^ super::random_u64())),
            _ => None,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cts: VecDeque::new(),
                reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
                queue: VecDeque::new(),
                unresolved: VecDeque::new(),
                matches_unwritten: 0,
                eager_bytes: 0,
                eager_seq: 0,
                next_index: 0,
                by_number: handle.by_number,
                made: 0,
                failed: None,
                peer_closed: false,
                injector,
                counters: Counters::default(),
                copies: Copies::new(),
            }),
            work: Condvar::new(),
            stop: AtomicBool::new(false),
            peer: handle.addr,
            trace: Trace::from_env(),
        });
        let streams = data.len();
        // Every socket of a send comm is its threads' alone (NCCL's calls do no I/O).
        for s in data.iter().chain([&ctrl]) {
            sock::set_thread_io(s).map_err(|e| io_err("setting up a socket", e))?;
        }
        let ctrl = Arc::new(ctrl);
        let data: Vec<Arc<Socket>> = data.into_iter().map(Arc::new).collect();
        let mut workers = Workers::default();
        // Tests only: a writer that panics on its first piece (the comm must fail, not hang).
        let panic_writer = std::env::var_os("NCCL_GRDMA_TEST_PANIC").is_some_and(|v| v == "writer");
        let mut socks = vec![ctrl.clone()];
        socks.extend(data.iter().cloned());
        let mut c = Box::new(Self {
            magic: SEND_MAGIC,
            shared: shared.clone(),
            socks,
            workers: None,
            handles: None,
            streams,
            checks: cfg.checks,
            eager_max: cfg.eager_max,
        });
        let spawned = (|| {
            for (i, s) in data.into_iter().enumerate() {
                let (sh, sp) = (shared.clone(), shared.clone());
                workers.spawn(
                    format!("grdma-tx{i}"),
                    move || writer(&sh, &s, i, panic_writer),
                    move |m| sp.fail(NetError::internal(format!("writer {i} panicked: {m}"))),
                )?;
            }
            let (sh, sp) = (shared.clone(), shared.clone());
            workers.spawn(
                "grdma-txctl".into(),
                move || ctrl_reader(&sh, &ctrl),
                move |m| sp.fail(NetError::internal(format!("control reader panicked: {m}"))),
            )
        })();
        c.workers = Some(workers);
        if let Err(e) = spawned {
            c.stop();
            return Err(io_err("starting the send comm's threads", e));
        }
        let me = &mut *c as *mut Self as *mut c_void;
        c.handles = Some(Handles::new(true, me));
        info!(NET; "send comm to {} over {} sockets (a writer thread each, on {} CPUs), checks {}{}", handle.addr, streams,
        super::threads::cpus_allowed(),
        if cfg.checks { "on" } else { "off" },
        match (cfg.inject_one_in, cfg.checks) {
            (Some(n), true) => format!(", corrupting 1 piece in {n} (NCCL_GRDMA_TEST_INJECT_FAULTS)"),
            (Some(_), false) => ", NCCL_GRDMA_TEST_INJECT_FAULTS ignored: checks are off".into(),
            _ => String::new(),
        });
        Ok(c)
    }

    /// `isend`: a request, or `None` while the matching receive is not posted yet.
    pub fn isend(&self, data: *const u8, size: u64, tag: i32) -> Result<Option<*mut c_void>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.peer_closed {
            return Err(closed_error(shared.peer));
        }
        let Some(ri) = free_slot(&st.reqs) else {
            return Ok(None);
        };
        let (cts_id, slot) = match direct_match(&mut st, shared.peer, size, tag)? {
            Some(m) => m,
            None => {
                // No receive known for this message: eager if it fits, else wait for
                // the clear-to-send (a null request, NCCL calls again).
                if size > self.eager_max.min(EAGER_MAX)
                    || st.eager_bytes + size > EAGER_BUDGET
                    || st.unresolved.len() >= EAGER_MESSAGES
                {
                    return Ok(None);
                }
                let seq = st.eager_seq;
                st.eager_seq += 1;
                st.eager_bytes += size;
                st.unresolved.push_back(Unresolved { seq, tag, size });
                (seq, EAGER_SLOT)
            }
        };
        let layout = Layout::new(size, self.streams);
        for p in 0..layout.count {
            st.queue.push_back(Work::Piece(ri, p));
        }
        let tn = st.made;
        st.made += 1;
        let kept = (st.copies.take(size, self.checks)).map(|b| Kept::new(b, layout.count));
        shared.trace.event(
            "send",
            tn,
            format_args!(
                "isend {size} B tag {tag} {} {cts_id}/{slot}",
                if slot == EAGER_SLOT { "eager" } else { "to" }
            ),
        );
        st.reqs[ri] = Some(SendReq {
            tn,
            data: RawBuf(data as *mut u8),
            size,
            cts_id,
            slot,
            layout,
            unsent: layout.count,
            attempts: vec![0; layout.count as usize],
            checked: self.checks,
            acked: false,
            taken: 0,
            index: st.next_index,
            tag,
            kept,
            reported: false,
        });
        st.next_index += 1;
        drop(st);
        wake(&shared.work, layout.count as usize, self.streams);
        Ok(Some(
            self.handles
                .as_ref()
                .map_or(std::ptr::null_mut(), |h| h.ptr(ri)),
        ))
    }

    /// `test` on request `ri`: `Some(size)` when done.
    pub fn test(&self, ri: usize) -> Result<Option<u64>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        let Some(req) = st.reqs[ri].as_ref() else {
            return Err(NetError::invalid(
                "test: the request is not in flight on its send comm",
            ));
        };
        if req.reported {
            return Err(NetError::invalid(
                "test: the request was already reported done",
            ));
        }
        if req.done() {
            let size = req.size;
            shared.trace.event(
                "send",
                req.tn,
                format_args!(
                    "test done{}",
                    if req.acked || !req.checked {
                        ""
                    } else {
                        " (before the ack: a copy is kept)"
                    }
                ),
            );
            st.counters.messages += 1;
            st.counters.bytes += size;
            if let Some(r) = st.reqs[ri].as_mut() {
                r.reported = true;
            }
            st.retire_if_finished(ri);
            return Ok(Some(size));
        }
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.peer_closed {
            return Err(closed_error(shared.peer));
        }
        Ok(None)
    }

    /// The shared state, weakly (the tests see whether the threads let it go).
    #[cfg(test)]
    pub fn shared_weak(&self) -> std::sync::Weak<impl Sized> {
        Arc::downgrade(&self.shared)
    }

    /// `deregMr` of `start..start + len`. Where a send NCCL has not seen done reads that
    /// memory (after `ncclCommAbort` NCCL deregisters and frees its buffers before it
    /// closes the comm, and has no call that cancels a request), the comm fails and its
    /// threads stop before this returns, so that none reads memory NCCL frees next.
    ///
    /// # Errors
    /// A thread still running after `JOIN_TIMEOUT`: NCCL must then not free the
    /// memory (it stops its teardown on an error from `deregMr`).
    pub fn release(&self, start: usize, len: usize) -> Result<()> {
        let sh = &*self.shared;
        let in_flight = sh
            .lock()
            .reqs
            .iter()
            .flatten()
            .any(|r| !r.reported && super::overlaps(r.data.0 as usize, r.size, start, len));
        if !in_flight {
            return Ok(());
        }
        let why = format!(
            "send comm to {}: deregMr of a buffer a send in flight reads; the comm is stopped (NCCL aborting?)",
            sh.peer
        );
        crate::log::warn!("{why}");
        sh.fail(NetError::invalid(why));
        let comm = format_args!("send comm to {}", sh.peer);
        halt_comm(&sh.stop, &sh.work, &self.socks, self.workers.as_ref(), comm)
    }

    /// Stops the threads (`threads::stop_comm`).
    fn stop(&mut self) {
        let sh = &self.shared;
        let comm = format_args!("send comm to {}", sh.peer);
        stop_comm(&sh.stop, &sh.work, &self.socks, &mut self.workers, comm);
    }

    /// `closeSend`: once the kept messages are acked (at most `CLOSE_LINGER`), the
    /// threads stop and are joined, the sockets close with the comm; the counters go to
    /// NCCL's log.
    pub fn close(&mut self) {
        self.linger();
        self.stop();
        let st = self.shared.lock();
        if let Some(e) = &st.failed {
            // A send done before its ack may have failed after NCCL last called: said here
            // so that the sender's log names it too (the receive never completes).
            crate::log::warn!(
                "send comm to {} closed after a failure: {e}",
                self.shared.peer
            );
        }
        info!(NET; "send comm to {} closed: {}", self.shared.peer, st.counters.line());
        integrity::SENT.add(&st.counters);
    }
}

impl Drop for SendComm {
    /// A comm dropped without `close` (an error path) still stops and joins its threads.
    fn drop(&mut self) {
        self.stop();
    }
}

fn closed_error(peer: SocketAddr) -> NetError {
    NetError::remote(format!(
        "the receiver at {peer} closed the connection (its process ended or closed the comm)"
    ))
}

/// Wakes writers for `pieces` new pieces (all of them when there is one per writer).
fn wake(c: &Condvar, pieces: usize, writers: usize) {
    if pieces >= writers {
        c.notify_all();
    } else {
        for _ in 0..pieces {
            c.notify_one();
        }
    }
}

/// The next piece to write, taken off the queue with its header (CRC still 0).
fn next_job(st: &mut State) -> Option<Job> {
    while let Some(w) = st.queue.pop_front() {
        let (ri, p) = match w {
            Work::Piece(ri, p) => (ri, p),
            Work::Match { seq, cts_id, slot } => {
                return Some(Job {
                    ri: None,
                    tn: u64::MAX,
                    header: PieceHeader {
                        matched: true,
                        checked: false,
                        slot,
                        attempt: 0,
                        cts_id,
                        piece: 0,
                        pieces: 0,
                        total: 0,
                        offset: seq,
                        len: 0,
                        crc: 0,
                        index: 0,
                        tag: 0,
                    },
                    data: RawBuf(std::ptr::null_mut()),
                    len: 0,
                    copy_from: None,
                    corrupt: false,
                })
            }
        };
        let Some(r) = st.reqs[ri].as_mut() else {
            continue;
        };
        r.taken += 1;
        let (off, len) = r.layout.range(p);
        let header = PieceHeader {
            matched: false,
            checked: r.checked,
            slot: r.slot,
            attempt: r.attempts[p as usize],
            cts_id: r.cts_id,
            piece: p,
            pieces: r.layout.count,
            total: r.size,
            offset: off,
            len,
            crc: 0,
            index: r.index,
            tag: r.tag,
        };
        // SAFETY: offset + len <= size (Layout covers exactly `size` bytes): inside
        // the isend buffer.
        let nccl = RawBuf(unsafe { r.data.0.add(off as usize) });
        // The first job for a kept message's piece copies it; later ones send the copy
        // once it is made (from NCCL's buffer until then).
        let (data, copy_from) = match r.kept.as_mut() {
            Some(k) => {
                // SAFETY: offset + len <= size <= KEEP_MAX, the copy's length.
                let at = RawBuf(unsafe { k.buf.0 .0.add(off as usize) });
                match k.take(p) {
                    PieceSource::CopyIn => (at, Some(nccl)),
                    PieceSource::Nccl => (nccl, None),
                    PieceSource::Copy => (at, None),
                }
            }
            None => (nccl, None),
        };
        let last = header.attempt >= super::MAX_RESENDS;
        let corrupt = (st.injector.as_mut()).is_some_and(|f| f.strike_attempt(last));
        if corrupt {
            st.counters.injected += 1;
        }
        return Some(Job {
            ri: Some(ri),
            tn: r.tn,
            header,
            data,
            len: len as usize,
            copy_from,
            corrupt,
        });
    }
    None
}

/// One data socket's thread: takes pieces, checksums them, writes them.
fn writer(sh: &Shared, sock: &Socket, i: usize, test_panic: bool) {
    loop {
        let job = {
            let mut st = sh.lock();
            loop {
                if sh.stop.load(Ordering::Relaxed) {
                    return;
                }
                if st.failed.is_some() {
                    // The comm failed, maybe after NCCL last called it (a small send is
                    // done before its ack): the receiver learns it from its sockets
                    // ending, not from a close that may not come.
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                    return;
                }
                if let Some(j) = next_job(&mut st) {
                    break j;
                }
                st = sh
                    .work
                    .wait_timeout(st, Duration::from_millis(sock::POLL_MS as u64))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                // Between pieces, at least every POLL_MS: an idle comm frees its spare
                // copy buffers.
                st.copies.trim_if_idle(std::time::Instant::now());
            }
        };
        if test_panic {
            panic!("NCCL_GRDMA_TEST_PANIC=writer");
        }
        let h0 = job.header;
        if !h0.matched && h0.piece == 0 {
            sh.trace.event(
                "send",
                job.tn,
                format_args!("first byte written (socket {i}, attempt {})", h0.attempt),
            );
        }
        if let Some(src) = job.copy_from {
            // SAFETY: `src` is the piece in NCCL's isend buffer and `data` the same range
            // of the request's copy, which only this job writes and no job reads until
            // this one marks it copied below (`Kept::take`: one CopyIn per piece, other
            // jobs for it send from NCCL's buffer meanwhile). Both stay valid while
            // `unsent` counts this piece (see below).
            unsafe { std::ptr::copy_nonoverlapping(src.0, job.data.0, job.len) };
        }
        // SAFETY: the piece lies in the isend buffer of request `job.ri` or in its
        // copy (owned by the request), which stays in flight (its `unsent` counts this
        // piece) until this thread is done with it below: NCCL's promise
        // (sock::RawBuf) holds for the whole write, and a request keeps its copy until
        // it is finished with, which needs `unsent == 0`.
        let bytes = unsafe { sock::raw_bytes(job.data.0, job.len) };
        let mut h = job.header;
        if h.checked {
            h.crc = integrity::crc32c(bytes);
        }
        let mut flip = [0u8; 1];
        let mut at = job.len;
        if job.corrupt {
            if job.len > 0 {
                at = job.len / 2;
                flip[0] = bytes[at] ^ 0x10;
            } else {
                h.crc ^= 1;
            }
        }
        let hb = h.encode();
        let segs: [&[u8]; 4] = if at < job.len {
            [&hb, &bytes[..at], &flip, &bytes[at + 1..]]
        } else {
            [&hb, bytes, &[], &[]]
        };
        match sock::write_all(sock, &segs, &sh.stop) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return sh.fail_write(i, e),
        }
        if h0.matched {
            sh.trace.note(
                "send",
                h0.offset,
                format_args!(
                    "eager {} placed: match frame to {}/{} written",
                    h0.offset, h0.cts_id, h0.slot
                ),
            );
        } else if h0.piece + 1 == h0.pieces {
            sh.trace.event(
                "send",
                job.tn,
                format_args!("last byte written (socket {i})"),
            );
        }
        let Some(ri) = job.ri else {
            if h0.matched {
                sh.lock().matches_unwritten -= 1;
            }
            continue;
        };
        let mut st = sh.lock();
        if let Some(r) = st.reqs[ri].as_mut() {
            r.unsent -= 1;
            if let (Some(k), Some(_)) = (r.kept.as_mut(), job.copy_from) {
                k.copied(h0.piece);
            }
        }
        st.retire_if_finished(ri);
    }
}

/// The control socket's thread: reads the receiver's frames and acts on each.
fn ctrl_reader(sh: &Shared, sock: &Socket) {
    let mut input = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        match sock::recv(sock, &mut buf) {
            Ok(Io::Moved(n)) => input.extend_from_slice(&buf[..n]),
            // A blocking socket's 100 ms timeout passed with nothing: look at the flag.
            Ok(Io::Blocked) => continue,
            Ok(Io::Closed) => {
                sh.lock().peer_closed = true;
                sh.work.notify_all();
                return;
            }
            Err(e) => {
                sh.fail(io_err(format!("control socket from {}", sh.peer), e));
                return;
            }
        }
        let mut at = 0;
        let mut st = sh.lock();
        let mut requeued = 0;
        let r = loop {
            match Ctrl::decode(&input[at..]) {
                Ok(Some((frame, len))) => {
                    at += len;
                    match on_ctrl(&mut st, sh.peer, &sh.trace, frame) {
                        Ok(n) => requeued += n,
                        Err(e) => break Err(e),
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => {
                    break Err(NetError::remote(format!(
                        "control frame from {}: {}",
                        sh.peer, e.0
                    )))
                }
            }
        };
        drop(st);
        input.drain(..at);
        if let Err(e) = r {
            // A small send is done before its ack (its copy kept): its failure here may
            // come after NCCL last called this comm, so it is logged now. The receiver
            // learns it from its data sockets ending: `fail` wakes the writers, which
            // shut them as they stop (the receiver only writes to this control socket).
            crate::log::warn!("send comm to {}: {e}", sh.peer);
            sh.fail(e);
            return;
        }
        if requeued > 0 {
            sh.work.notify_all();
        }
    }
}
