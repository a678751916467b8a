//! The receive comm: each `irecv` (1 to `MAX_RECVS` buffers, each with a tag) is
//! announced to the sender with a clear-to-send frame; pieces land in NCCL's buffers
//! from whichever data socket carries them; each piece's CRC32C is checked; once every
//! piece of a message arrived, the corrupt ones are asked for again (a NACK) or, all
//! good, the message is acked. A request is done when every buffer's message arrived
//! whole and good and the acks went out. Pieces of large messages are read straight into
//! NCCL's buffer and checked there (NCCL's GPU reads them only after `test`); those of
//! messages NCCL may send under its LL and LL128 protocols, whose GPU reads the buffer
//! as the bytes come, are read into the reader's scratch buffer and copied in only once
//! their CRC32C passed (`integrity::must_stage`).
//!
//! Eager messages (sent before the sender saw this receive's clear-to-send) land in
//! a bounce buffer of this comm, are checked and acked there (so the sender's request
//! completes without waiting for this side's `irecv`: NCCL posts the next receive only
//! after the GPU consumed the last one, and a sender that waited for it would tie each
//! step to the receiving GPU), and are copied into NCCL's buffer once the sender's
//! match frame says which receive and buffer they belong to ([`eager`]); with
//! `NCCL_GRDMA_EAGER_BY_NUMBER` (off by default), a receive of one buffer takes the
//! message of its number instead (messages take the buffers in order, see
//! `PieceHeader::index`), so `irecv` places it at once.
//!
//! Threads: one reader per data socket reads a header, finds the buffer, reads the
//! bytes into it, checks the CRC, and sends the ack or NACK the moment a message's last
//! piece is in (from that thread, without waiting for NCCL's next call); one control
//! writer sends what the control socket could not take at once, and (placing by number)
//! copies the larger eager messages `irecv` placed. NCCL's calls (`irecv`, `test`) only
//! change the shared state under its lock, try one non-blocking send of the
//! clear-to-send and (placing by number) copy a small eager message `irecv` placed:
//! they never wait.

mod eager;

use super::threads::{halt_comm, stop_comm, Workers};
use super::{free_slot, Handles, RECV_MAGIC};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::error::{io_err, NetError, Result};
use crate::integrity::{self, Counters};
use crate::log::{info, NET};
use crate::sock::{self, Fill, Io, RawBuf};
use crate::trace::Trace;
use crate::wire::{Ctrl, Layout, PieceHeader, PostedSlot, EAGER_SLOT};
use eager::{
    copy_placed, finish_eager, numbered, on_match, place_by_index, start_eager, BouncePool, Eager,
};
use socket2::Socket;
use std::collections::HashMap;
use std::ffi::c_void;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Piece {
    Expected,
    /// A reader is writing it into NCCL's buffer: the request cannot complete.
    Arriving,
    Good,
}

struct Msg {
    layout: Layout,
    checked: bool,
    pieces: Vec<Piece>,
    /// Pieces not yet arrived (in this round).
    outstanding: u32,
    /// Pieces of this round that failed their CRC.
    bad: Vec<u32>,
}

impl Msg {
    /// Piece `h.piece` of the message in `msg` (made at its first piece) starts to
    /// arrive: its header must say what the earlier pieces said, and it must not have
    /// come before. `what` names the message in the error.
    fn arriving(
        msg: &mut Option<Msg>,
        h: &PieceHeader,
        streams: usize,
        what: std::fmt::Arguments<'_>,
    ) -> std::result::Result<(), String> {
        let layout = Layout::new(h.total, streams);
        let msg = msg.get_or_insert_with(|| Msg {
            layout,
            checked: h.checked,
            pieces: vec![Piece::Expected; layout.count as usize],
            outstanding: layout.count,
            bad: Vec::new(),
        });
        if msg.layout != layout || msg.checked != h.checked {
            return Err(format!(
                "piece {} of {what} says it has {} bytes, an earlier one said {}",
                h.piece, h.total, msg.layout.total
            ));
        }
        if msg.pieces[h.piece as usize] != Piece::Expected {
            return Err(format!("piece {} of {what} arrived twice", h.piece));
        }
        msg.pieces[h.piece as usize] = Piece::Arriving;
        Ok(())
    }

    /// Piece `piece` is in, `good` if its check passed (a bad one is expected again);
    /// true once no piece of the message is outstanding.
    fn landed(&mut self, piece: u32, good: bool) -> bool {
        self.outstanding -= 1;
        if good {
            self.pieces[piece as usize] = Piece::Good;
        } else {
            self.pieces[piece as usize] = Piece::Expected;
            self.bad.push(piece);
        }
        self.outstanding == 0
    }

    /// The pieces that failed their check, now outstanding again: the nack that
    /// asks for them is the caller's to send.
    fn take_bad(&mut self) -> Vec<u32> {
        let pieces = std::mem::take(&mut self.bad);
        self.outstanding = pieces.len() as u32;
        pieces
    }
}

struct RxSlot {
    data: RawBuf,
    posted: u64,
    tag: i32,
    msg: Option<Msg>,
    /// Every piece arrived and passed.
    good: bool,
    /// The control stream's byte count once this message's ack is out (0: no ack).
    ack_at: u64,
    /// An eager message is being copied in (by a reader, outside the lock).
    placing: bool,
    /// Eager message `seq` is landing here in place (its receive was posted before its
    /// first piece came: no bounce buffer, no copy).
    in_place: Option<u64>,
}

impl RxSlot {
    /// A buffer `irecv` posted: `posted` bytes at `data` for a message of `tag`.
    fn posted(data: *mut u8, posted: u64, tag: i32) -> RxSlot {
        RxSlot {
            data: RawBuf(data),
            posted,
            tag,
            msg: None,
            good: false,
            ack_at: 0,
            placing: false,
            in_place: None,
        }
    }

    /// Holds a message already, or one is arriving or being copied into it.
    fn taken(&self) -> bool {
        self.taken_but_in_place() || self.in_place.is_some()
    }

    /// As `taken`, but for an eager message landing in place.
    fn taken_but_in_place(&self) -> bool {
        self.msg.is_some() || self.good || self.placing
    }
}

struct RecvReq {
    /// Trace number (NCCL_GRDMA_TRACE).
    tn: u64,
    id: u64,
    /// The comm's number of its first buffer (`PieceHeader::index`).
    base: u64,
    slots: Vec<RxSlot>,
}

/// Eager bytes `irecv` copies itself when it places them (more go to the control writer
/// thread): a few microseconds of NCCL's thread.
const PLACE_INLINE: usize = 64 << 10;

/// The control frames on their way out. Whoever adds one tries a non-blocking send at
/// once; what the socket did not take waits for the control writer thread. `busy`
/// while that thread holds bytes outside the lock, so that nobody sends past them.
#[derive(Default)]
struct CtrlOut {
    pending: Vec<u8>,
    busy: bool,
    queued: u64,
    flushed: u64,
}

struct State {
    reqs: Vec<Option<RecvReq>>,
    eager: HashMap<u64, Eager>,
    /// Bytes of the eager messages in `eager` (bounded by `EAGER_HELD_MAX`).
    eager_held: u64,
    /// Buffers posted so far, over every `irecv` (the next one's number).
    buffers: u64,
    /// Bounce buffers of eager messages already placed, for the next ones.
    pool: BouncePool,
    /// Eager messages to copy into their buffers: (seq, request, buffer, message).
    to_place: Vec<(u64, usize, usize, Eager)>,
    /// Requests made (trace numbers).
    made: u64,
    next_id: u64,
    failed: Option<NetError>,
    /// Data sockets the sender closed (at a piece boundary).
    closed_sockets: usize,
    /// Every data socket closed: nothing more can arrive.
    peer_closed: bool,
    ctrl: CtrlOut,
    counters: Counters,
}

impl State {
    fn new() -> State {
        State {
            reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
            eager: HashMap::new(),
            eager_held: 0,
            buffers: 0,
            pool: BouncePool::default(),
            to_place: Vec::new(),
            made: 0,
            next_id: 1,
            failed: None,
            closed_sockets: 0,
            peer_closed: false,
            ctrl: CtrlOut::default(),
            counters: Counters::default(),
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// The control writer waits here for bytes the socket did not take.
    ctrl_wake: Condvar,
    stop: AtomicBool,
    ctrl: Arc<Socket>,
    streams: usize,
    peer: String,
    trace: Trace,
    /// `NCCL_GRDMA_EAGER_BY_NUMBER` where this comm's listener listened: an eager message
    /// for a receive of one buffer is placed by its number (`irecv` or its first piece,
    /// whichever comes second), not by a match frame.
    by_number: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, e: NetError) {
        let mut st = self.lock();
        if st.failed.is_none() && !self.stop.load(Ordering::Relaxed) {
            st.failed = Some(e);
        }
        drop(st);
        self.ctrl_wake.notify_all();
    }

    /// Queues `frame` and sends what the socket takes now; the stream position at
    /// which it is out.
    fn push_ctrl(&self, st: &mut State, frame: &Ctrl) -> Result<u64> {
        let before = st.ctrl.pending.len();
        frame.encode(&mut st.ctrl.pending);
        // Counted, not derived from `pending`: the writer may hold earlier bytes.
        st.ctrl.queued += (st.ctrl.pending.len() - before) as u64;
        let end = st.ctrl.queued;
        if !st.ctrl.busy {
            while !st.ctrl.pending.is_empty() {
                match sock::send(&self.ctrl, &[IoSlice::new(&st.ctrl.pending)])
                    .map_err(|e| io_err(format!("control socket to {}", self.peer), e))?
                {
                    Io::Moved(n) => {
                        st.ctrl.pending.drain(..n);
                        st.ctrl.flushed += n as u64;
                    }
                    _ => break,
                }
            }
        }
        if !st.ctrl.pending.is_empty() {
            self.ctrl_wake.notify_one();
        }
        Ok(end)
    }
}

#[repr(C)]
pub struct RecvComm {
    magic: u64,
    shared: Arc<Shared>,
    socks: Vec<Arc<Socket>>,
    workers: Option<Workers>,
    handles: Option<Handles>,
}

impl RecvComm {
    pub fn new(ctrl: Socket, data: Vec<Socket>, by_number: bool) -> Result<Box<Self>> {
        let peer = ctrl
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or_else(|| "?".to_string(), |a: SocketAddr| a.to_string());
        let streams = data.len();
        let ctrl = Arc::new(ctrl);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            ctrl_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            ctrl: ctrl.clone(),
            streams,
            peer,
            trace: Trace::from_env(),
            by_number,
        });
        for s in &data {
            sock::set_thread_io(s).map_err(|e| io_err("setting up a data socket", e))?;
        }
        let data: Vec<Arc<Socket>> = data.into_iter().map(Arc::new).collect();
        let mut socks = vec![ctrl];
        socks.extend(data.iter().cloned());
        let mut c = Box::new(Self {
            magic: RECV_MAGIC,
            shared: shared.clone(),
            socks,
            workers: None,
            handles: None,
        });
        let mut workers = Workers::default();
        let spawned = (|| {
            for (i, s) in data.into_iter().enumerate() {
                let (sh, sp) = (shared.clone(), shared.clone());
                workers.spawn(
                    format!("grdma-rx{i}"),
                    move || reader(&sh, &s, i),
                    move |m| sp.fail(NetError::internal(format!("reader {i} panicked: {m}"))),
                )?;
            }
            let (sh, sp) = (shared.clone(), shared.clone());
            workers.spawn(
                "grdma-rxctl".into(),
                move || ctrl_writer(&sh),
                move |m| sp.fail(NetError::internal(format!("control writer panicked: {m}"))),
            )
        })();
        c.workers = Some(workers);
        if let Err(e) = spawned {
            c.stop();
            return Err(io_err("starting the receive comm's threads", e));
        }
        let me = &mut *c as *mut Self as *mut c_void;
        c.handles = Some(Handles::new(false, me));
        info!(NET; "receive comm from {} over {} sockets (a reader thread each, on {} CPUs)", shared.peer, streams,
            super::threads::cpus_allowed());
        Ok(c)
    }

    /// `irecv` into `bufs` (address, size, tag): a request, or `None` when all 32 are
    /// in flight.
    pub fn irecv(&self, bufs: &[(*mut u8, u64, i32)]) -> Result<Option<*mut c_void>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.peer_closed {
            return Err(closed_error(&shared.peer));
        }
        let Some(ri) = free_slot(&st.reqs) else {
            return Ok(None);
        };
        let id = st.next_id;
        st.next_id += 1;
        let tn = st.made;
        st.made += 1;
        shared.trace.event(
            "recv",
            tn,
            format_args!(
                "irecv {} buffers ({} B first) as {id}",
                bufs.len(),
                bufs[0].1
            ),
        );
        // Registered before the clear-to-send goes out: the first piece may follow at once.
        let base = st.buffers;
        st.buffers += bufs.len() as u64;
        st.reqs[ri] = Some(RecvReq {
            tn,
            id,
            base,
            slots: (bufs.iter())
                .map(|&(data, posted, tag)| RxSlot::posted(data, posted, tag))
                .collect(),
        });
        let cts = Ctrl::Cts {
            id,
            slots: bufs
                .iter()
                .map(|&(_, size, tag)| PostedSlot { tag, size })
                .collect(),
        };
        match shared.push_ctrl(&mut st, &cts) {
            Ok(at) => shared.trace.event(
                "recv",
                tn,
                format_args!(
                    "clear-to-send {id} {}",
                    if st.ctrl.flushed >= at {
                        "sent"
                    } else {
                        "queued"
                    }
                ),
            ),
            Err(e) => {
                st.failed = Some(e.clone());
                return Err(e);
            }
        }
        // A receive of one buffer whose eager message came before it: placed now, no
        // round trip to the sender. If it arrived whole, a small one is copied here, on
        // NCCL's thread; a larger one by the control writer thread, so that NCCL's
        // thread goes on (at NCCL's defaults, 128 KiB messages back to back).
        if shared.by_number && bufs.len() == 1 {
            if let Some(seq) = numbered(&st, base) {
                if let Err(e) = place_by_index(&mut st, shared, seq) {
                    st.failed = Some(e.clone());
                    return Err(e);
                }
            }
        }
        let request = self
            .handles
            .as_ref()
            .map_or(std::ptr::null_mut(), |h| h.ptr(ri));
        if shared.by_number {
            let placing: usize = st.to_place.iter().map(|(_, _, _, e)| e.total()).sum();
            if placing <= PLACE_INLINE {
                copy_placed(shared, st);
            } else {
                shared.ctrl_wake.notify_all();
            }
        }
        Ok(Some(request))
    }

    /// `test` on request `ri`: the received sizes, one per buffer, when done.
    pub fn test(&self, ri: usize) -> Result<Option<Vec<u64>>> {
        let shared = &*self.shared;
        let mut st = shared.lock();
        let flushed = st.ctrl.flushed;
        let Some(req) = st.reqs[ri].as_ref() else {
            return Err(NetError::invalid(
                "test: the request is not in flight on its receive comm",
            ));
        };
        if req.slots.iter().all(|s| s.good && flushed >= s.ack_at) {
            let sizes: Vec<u64> = req
                .slots
                .iter()
                .map(|s| s.msg.as_ref().map_or(0, |m| m.layout.total))
                .collect();
            shared
                .trace
                .event("recv", req.tn, format_args!("test done"));
            st.counters.messages += sizes.len() as u64;
            st.counters.bytes += sizes.iter().sum::<u64>();
            st.reqs[ri] = None;
            return Ok(Some(sizes));
        }
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        // Closed, and no copy of a message that arrived whole is still under way.
        let copying = !st.to_place.is_empty()
            || st.reqs[ri]
                .as_ref()
                .is_some_and(|r| r.slots.iter().any(|s| s.placing));
        if st.peer_closed && !copying {
            return Err(closed_error(&shared.peer));
        }
        Ok(None)
    }

    /// The shared state, weakly (the tests see whether the threads let it go).
    #[cfg(test)]
    pub fn shared_weak(&self) -> std::sync::Weak<impl Sized> {
        Arc::downgrade(&self.shared)
    }

    /// `deregMr` of `start..start + len`. Where a receive NCCL has not seen done lands
    /// in that memory (after `ncclCommAbort` NCCL deregisters and frees its buffers
    /// before it closes the comm, and has no call that cancels a request), the comm
    /// fails and its threads stop before this returns, so that none writes memory NCCL
    /// frees next.
    ///
    /// # Errors
    /// A thread still running after `JOIN_TIMEOUT`: NCCL must then not free the
    /// memory (it stops its teardown on an error from `deregMr`).
    pub fn release(&self, start: usize, len: usize) -> Result<()> {
        let sh = &*self.shared;
        let in_flight = sh.lock().reqs.iter().flatten().any(|r| {
            r.slots
                .iter()
                .any(|s| super::overlaps(s.data.0 as usize, s.posted, start, len))
        });
        if !in_flight {
            return Ok(());
        }
        let why = format!(
            "receive comm from {}: deregMr of a buffer a receive in flight lands in; the comm is stopped (NCCL aborting?)",
            sh.peer
        );
        crate::log::warn!("{why}");
        sh.fail(NetError::invalid(why));
        let comm = format_args!("receive comm from {}", sh.peer);
        halt_comm(
            &sh.stop,
            &sh.ctrl_wake,
            &self.socks,
            self.workers.as_ref(),
            comm,
        )
    }

    /// Stops the threads (`threads::stop_comm`).
    fn stop(&mut self) {
        let sh = &self.shared;
        let comm = format_args!("receive comm from {}", sh.peer);
        stop_comm(
            &sh.stop,
            &sh.ctrl_wake,
            &self.socks,
            &mut self.workers,
            comm,
        );
    }

    /// `closeRecv`: the threads stop and are joined, the sockets close with the comm;
    /// the counters go to NCCL's log.
    pub fn close(&mut self) {
        self.stop();
        let st = self.shared.lock();
        info!(NET; "receive comm from {} closed: {}", self.shared.peer, st.counters.line());
        integrity::RECEIVED.add(&st.counters);
    }
}

impl Drop for RecvComm {
    /// A comm dropped without `close` (an error path) still stops and joins its threads.
    fn drop(&mut self) {
        self.stop();
    }
}

fn closed_error(peer: &str) -> NetError {
    NetError::remote(format!(
        "the sender at {peer} closed the connection (its process ended or closed the comm)"
    ))
}

/// A piece a reader is receiving, placed by its header.
struct RxPiece {
    /// An eager message's sequence number (its bytes go to the bounce buffer).
    eager: Option<u64>,
    tn: u64,
    req: usize,
    slot: usize,
    piece: u32,
    dst: RawBuf,
    len: usize,
    crc: u32,
    checked: bool,
    /// Read into the reader's scratch buffer and copied into `dst` only once its CRC32C
    /// passed ([`integrity::must_stage`]); otherwise read straight into `dst` and checked
    /// there.
    staged: bool,
}

/// One data socket's thread: header, bytes into NCCL's buffer (through its scratch
/// buffer for a piece that `integrity::must_stage`), CRC, ack.
fn reader(sh: &Shared, sock: &Socket, i: usize) {
    let mid = || {
        NetError::remote(format!(
            "the sender at {} closed data socket {i} in the middle of a piece",
            sh.peer
        ))
    };
    // Pieces of small checked messages are read here first (at most `MAX_PIECE` bytes).
    let mut scratch: Vec<u8> = Vec::new();
    loop {
        let mut hdr = [0u8; PieceHeader::LEN];
        // SAFETY: our own array, PieceHeader::LEN bytes.
        match unsafe { sock::read_full(sock, hdr.as_mut_ptr(), hdr.len(), &sh.stop) } {
            Ok(Fill::Done) => {}
            Ok(Fill::Stopped) => return,
            Ok(Fill::Eof(0)) => {
                // The sender closed this socket between pieces. What its other sockets
                // still hold (a match frame, the pieces of a message sent just before
                // it closed) is read first: the comm counts as closed only once every
                // data socket is.
                let mut st = sh.lock();
                st.closed_sockets += 1;
                st.peer_closed = st.closed_sockets >= sh.streams;
                return;
            }
            Ok(Fill::Eof(_)) => return sh.fail(mid()),
            Err(e) => return sh.fail(io_err(format!("data socket {i} from {}", sh.peer), e)),
        }
        let mut st = sh.lock();
        let p = match start_piece(&mut st, sh, &hdr) {
            Ok(Some(p)) => {
                drop(st);
                p
            }
            // A match frame: handled (the copy it may have queued is done here); no bytes follow.
            Ok(None) => {
                copy_placed(sh, st);
                continue;
            }
            Err(e) => {
                drop(st);
                return sh.fail(e);
            }
        };
        if p.piece == 0 {
            match p.eager {
                Some(seq) => sh.trace.note(
                    "recv",
                    seq,
                    format_args!("eager {seq}: first byte read (socket {i})"),
                ),
                None => sh
                    .trace
                    .event("recv", p.tn, format_args!("first byte read (socket {i})")),
            }
        }
        // Where the bytes are read to: NCCL's buffer, or the scratch buffer first.
        let into = match p.staged {
            true => {
                scratch.resize(p.len, 0);
                scratch.as_mut_ptr()
            }
            false => p.dst.0,
        };
        // SAFETY: `into..into+len` is our scratch buffer (resized to `len` above) or lies
        // in the irecv buffer of request `p.req` (checked against its posted size in
        // `start_piece`), which cannot complete while the piece is `Arriving`: NCCL's
        // promise (sock::RawBuf) holds.
        match unsafe { sock::read_full(sock, into, p.len, &sh.stop) } {
            Ok(Fill::Done) => {}
            Ok(Fill::Stopped) => return,
            Ok(Fill::Eof(_)) => return sh.fail(mid()),
            Err(e) => return sh.fail(io_err(format!("data socket {i} from {}", sh.peer), e)),
        }
        // SAFETY: the bytes this thread just received, as above.
        let good =
            !p.checked || integrity::crc32c(unsafe { sock::raw_bytes(into, p.len) }) == p.crc;
        if p.staged && good {
            // SAFETY: `dst..dst+len` in the irecv buffer, as above; the scratch buffer
            // is this thread's and `len` long.
            unsafe { std::ptr::copy_nonoverlapping(scratch.as_ptr(), p.dst.0, p.len) };
        }
        let mut st = sh.lock();
        if let Err(e) = finish_piece(&mut st, sh, &p, good) {
            drop(st);
            return sh.fail(e);
        }
        copy_placed(sh, st);
    }
}

fn start_piece(
    st: &mut State,
    sh: &Shared,
    hdr: &[u8; PieceHeader::LEN],
) -> Result<Option<RxPiece>> {
    let bad = |m: String| NetError::remote(format!("from {}: {m}", sh.peer));
    let h = PieceHeader::decode(hdr, sh.streams).map_err(|e| bad(e.0))?;
    if h.matched {
        on_match(st, sh, h.offset, h.cts_id, h.slot as usize)?;
        return Ok(None);
    }
    if h.slot == EAGER_SLOT {
        return start_eager(st, sh, &h).map(Some);
    }
    let ri = st
        .reqs
        .iter()
        .position(|r| r.as_ref().is_some_and(|r| r.id == h.cts_id))
        .ok_or_else(|| {
            bad(format!(
                "a piece for receive {}, which is not posted",
                h.cts_id
            ))
        })?;
    let Some(req) = st.reqs[ri].as_mut() else {
        return Err(NetError::internal("request vanished"));
    };
    let n = req.slots.len();
    let slot = req
        .slots
        .get_mut(h.slot as usize)
        .ok_or_else(|| bad(format!("a piece for buffer {} of a receive of {n}", h.slot)))?;
    if slot.good || slot.placing || slot.in_place.is_some() {
        return Err(bad(format!(
            "a piece for buffer {} of receive {}, which has its message already",
            h.slot, h.cts_id
        )));
    }
    if h.total > slot.posted {
        return Err(NetError::usage(format!(
            "from {}: a message of {} bytes for a receive of {} bytes (tag {})",
            sh.peer, h.total, slot.posted, slot.tag
        )));
    }
    let what = format_args!("message {}/{}", h.cts_id, h.slot);
    Msg::arriving(&mut slot.msg, &h, sh.streams, what).map_err(bad)?;
    Ok(Some(RxPiece {
        eager: None,
        tn: req.tn,
        req: ri,
        slot: h.slot as usize,
        piece: h.piece,
        // SAFETY: offset + len <= total <= posted size: inside the irecv buffer.
        dst: RawBuf(unsafe { slot.data.0.add(h.offset as usize) }),
        len: h.len as usize,
        crc: h.crc,
        checked: h.checked,
        staged: integrity::must_stage(h.checked, h.total),
    }))
}

fn finish_piece(st: &mut State, sh: &Shared, p: &RxPiece, good: bool) -> Result<()> {
    if let Some(seq) = p.eager {
        return finish_eager(st, sh, p, seq, good);
    }
    let Some(req) = st.reqs[p.req].as_mut() else {
        return Err(NetError::internal("request vanished"));
    };
    let id = req.id;
    let slot = &mut req.slots[p.slot];
    let Some(msg) = slot.msg.as_mut() else {
        return Err(NetError::internal("message vanished"));
    };
    if !msg.landed(p.piece, good) {
        return Ok(());
    }
    let frame = if msg.bad.is_empty() {
        if !msg.checked {
            slot.good = true;
            return Ok(());
        }
        Ctrl::Ack {
            id,
            slot: p.slot as u8,
        }
    } else {
        let pieces = msg.take_bad();
        st.counters.repaired += pieces.len() as u64;
        Ctrl::Nack {
            id,
            slot: p.slot as u8,
            pieces,
        }
    };
    let ack = matches!(frame, Ctrl::Ack { .. });
    let at = sh.push_ctrl(st, &frame)?;
    sh.trace.event(
        "recv",
        p.tn,
        format_args!(
            "last byte read, {} sent",
            if ack { "ack" } else { "resend request" }
        ),
    );
    if ack {
        if let Some(slot) = st.reqs[p.req].as_mut().map(|r| &mut r.slots[p.slot]) {
            slot.ack_at = at;
            slot.good = true;
        }
    }
    Ok(())
}

/// The control socket's thread: sends what `push_ctrl` could not, in order, and copies
/// the eager messages `irecv` placed and left to it.
fn ctrl_writer(sh: &Shared) {
    loop {
        let bytes = {
            let mut st = sh.lock();
            loop {
                if sh.stop.load(Ordering::Relaxed) || st.failed.is_some() {
                    return;
                }
                let placed = sh.by_number && !st.to_place.is_empty();
                if placed || (!st.ctrl.pending.is_empty() && !st.ctrl.busy) {
                    break;
                }
                st = sh
                    .ctrl_wake
                    .wait_timeout(st, Duration::from_millis(sock::POLL_MS as u64))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                // Between frames, at least every POLL_MS: an idle comm's bounce pool
                // gives back what it kept while eager messages came.
                st.pool.trim_if_idle(std::time::Instant::now());
            }
            if sh.by_number && !st.to_place.is_empty() {
                // Eager messages `irecv` placed: copied here, off NCCL's thread.
                copy_placed(sh, st);
                continue;
            }
            st.ctrl.busy = true;
            std::mem::take(&mut st.ctrl.pending)
        };
        let r = sock::write_all(&sh.ctrl, &[&bytes], &sh.stop);
        let mut st = sh.lock();
        st.ctrl.busy = false;
        match r {
            Ok(true) => st.ctrl.flushed += bytes.len() as u64,
            Ok(false) => return,
            Err(e) => {
                drop(st);
                return sh.fail(io_err(format!("control socket to {}", sh.peer), e));
            }
        }
    }
}
