//! The send comm: NCCL's `isend` matched against the receiver's clear-to-send frames
//! (a send waits, as a null request, until the receive it answers is posted), each
//! message cut into pieces that go out on whichever data socket is free, with a
//! CRC32C in each piece's header; a request is done when the receiver acked the
//! message (checks on) or its last byte went out (checks off). Pieces the receiver
//! found corrupt are sent again, up to `MAX_RESENDS` times each.

use super::{free_slot, Handles, BUDGET_PER_SOCKET, MAX_RESENDS, SEND_MAGIC};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::config::Config;
use crate::error::{io_err, NetError, Result};
use crate::integrity::{self, Counters, FaultInjector};
use crate::log::{info, NET};
use crate::sock::{self, Io};
use crate::wire::{Ctrl, Handle, Layout, PieceHeader, PostedSlot, MAX_RECVS};
use socket2::Socket;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::io::IoSlice;
use std::net::SocketAddr;

struct Cts {
    id: u64,
    slots: Vec<PostedSlot>,
    matched: Vec<bool>,
}

struct SendReq {
    data: *const u8,
    size: u64,
    cts_id: u64,
    slot: u8,
    layout: Layout,
    /// Pieces queued or being written.
    unsent: u32,
    /// Sends of each piece after the first.
    attempts: Vec<u16>,
    checked: bool,
    acked: bool,
}

/// A piece on its way out: the header, then `len` bytes of NCCL's memory, one of them
/// possibly replaced by a corrupted copy (fault injection).
struct TxFrame {
    req: usize,
    header: [u8; PieceHeader::LEN],
    data: *const u8,
    len: usize,
    flip: Option<(usize, [u8; 1])>,
    sent: usize,
}

impl TxFrame {
    fn total(&self) -> usize {
        PieceHeader::LEN + self.len
    }

    /// The bytes not yet sent, as at most four slices (header, data before the
    /// corrupted byte, that byte, data after it).
    fn remaining(&self) -> Vec<IoSlice<'_>> {
        // SAFETY: `data..data+len` is an isend buffer of a request still in flight
        // (a frame only exists for one), which NCCL leaves alone until `test` says done.
        let data = unsafe { sock::raw_bytes(self.data, self.len) };
        let mut segs: Vec<&[u8]> = vec![&self.header];
        match &self.flip {
            Some((at, b)) => {
                segs.push(&data[..*at]);
                segs.push(b);
                segs.push(&data[at + 1..]);
            }
            None => segs.push(data),
        }
        let mut skip = self.sent;
        let mut out = Vec::with_capacity(4);
        for s in segs {
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            out.push(IoSlice::new(&s[skip..]));
            skip = 0;
        }
        out
    }
}

struct TxStream {
    sock: Socket,
    frame: Option<TxFrame>,
}

#[repr(C)]
pub struct SendComm {
    magic: u64,
    ctrl: Socket,
    ctrl_in: Vec<u8>,
    streams: Vec<TxStream>,
    cts: VecDeque<Cts>,
    reqs: Vec<Option<SendReq>>,
    handles: Option<Handles>,
    queue: VecDeque<(usize, u32)>,
    failed: Option<NetError>,
    peer_closed: bool,
    peer: SocketAddr,
    checks: bool,
    injector: Option<FaultInjector>,
    counters: Counters,
}

impl SendComm {
    pub fn new(ctrl: Socket, data: Vec<Socket>, handle: Handle, cfg: Config) -> Box<Self> {
        let streams = data
            .into_iter()
            .map(|sock| TxStream { sock, frame: None })
            .collect::<Vec<_>>();
        let injector = match (cfg.inject_one_in, cfg.checks) {
            (Some(n), true) => Some(FaultInjector::new(n, handle.token ^ super::random_u64())),
            _ => None,
        };
        let mut c = Box::new(Self {
            magic: SEND_MAGIC,
            ctrl,
            ctrl_in: Vec::new(),
            streams,
            cts: VecDeque::new(),
            reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
            handles: None,
            queue: VecDeque::new(),
            failed: None,
            peer_closed: false,
            peer: handle.addr,
            checks: cfg.checks,
            injector,
            counters: Counters::default(),
        });
        let me = &mut *c as *mut Self as *mut c_void;
        c.handles = Some(Handles::new(true, me));
        info!(NET; "send comm to {} over {} sockets, checks {}{}", handle.addr, c.streams.len(),
        if cfg.checks { "on" } else { "off" },
        match (cfg.inject_one_in, cfg.checks) {
            (Some(n), true) => format!(", corrupting 1 piece in {n} (NCCL_GRDMA_TEST_INJECT_FAULTS)"),
            (Some(_), false) => ", NCCL_GRDMA_TEST_INJECT_FAULTS ignored: checks are off".into(),
            _ => String::new(),
        });
        c
    }

    /// `isend`: a request, or `None` while the matching receive is not posted yet.
    pub fn isend(&mut self, data: *const u8, size: u64, tag: i32) -> Result<Option<*mut c_void>> {
        self.progress()?;
        if self.peer_closed {
            return Err(self.closed_error());
        }
        let Some(ri) = free_slot(&self.reqs) else {
            return Ok(None);
        };
        let Some(head) = self.cts.front_mut() else {
            return Ok(None);
        };
        let Some(si) =
            (0..head.slots.len()).find(|&s| !head.matched[s] && head.slots[s].tag == tag)
        else {
            return Ok(None);
        };
        let posted = head.slots[si].size;
        if size > posted {
            return Err(NetError::usage(format!(
                "isend to {}: message of {size} bytes for a receive of {posted} bytes (tag {tag}): \
                 the ranks disagree on sizes (NCCL_PROTO, NCCL_ALGO or buffer settings differ?)",
                self.peer
            )));
        }
        head.matched[si] = true;
        let cts_id = head.id;
        if head.matched.iter().all(|&m| m) {
            self.cts.pop_front();
        }
        let layout = Layout::new(size, self.streams.len());
        for p in 0..layout.count {
            self.queue.push_back((ri, p));
        }
        self.reqs[ri] = Some(SendReq {
            data,
            size,
            cts_id,
            slot: si as u8,
            layout,
            unsent: layout.count,
            attempts: vec![0; layout.count as usize],
            checked: self.checks,
            acked: false,
        });
        // Start writing now; an error shows in this request's test.
        let _ = self.progress();
        Ok(Some(
            self.handles
                .as_ref()
                .map_or(std::ptr::null_mut(), |h| h.ptr(ri)),
        ))
    }

    /// `test` on request `ri`: `Some(size)` when done.
    pub fn test(&mut self, ri: usize) -> Result<Option<u64>> {
        let r = self.progress();
        let Some(req) = self.reqs[ri].as_ref() else {
            return Err(NetError::invalid(
                "test: the request is not in flight on its send comm",
            ));
        };
        let complete = if req.checked {
            req.acked
        } else {
            req.unsent == 0
        };
        if complete {
            let size = req.size;
            self.counters.messages += 1;
            self.counters.bytes += size;
            self.reqs[ri] = None;
            return Ok(Some(size));
        }
        r?;
        if self.peer_closed {
            return Err(self.closed_error());
        }
        Ok(None)
    }

    fn closed_error(&self) -> NetError {
        NetError::remote(format!(
            "the receiver at {} closed the connection (its process ended or closed the comm)",
            self.peer
        ))
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.read_ctrl().and_then(|_| self.write_streams());
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn read_ctrl(&mut self) -> Result<()> {
        let mut buf = [0u8; 4096];
        while !self.peer_closed {
            match sock::recv(&self.ctrl, &mut buf)
                .map_err(|e| io_err(format!("control socket from {}", self.peer), e))?
            {
                Io::Moved(n) => self.ctrl_in.extend_from_slice(&buf[..n]),
                Io::Blocked => break,
                Io::Closed => self.peer_closed = true,
            }
        }
        let mut at = 0;
        loop {
            let frame = Ctrl::decode(&self.ctrl_in[at..]).map_err(|e| {
                NetError::remote(format!("control frame from {}: {}", self.peer, e.0))
            })?;
            let Some((frame, len)) = frame else { break };
            at += len;
            self.on_ctrl(frame)?;
        }
        self.ctrl_in.drain(..at);
        Ok(())
    }

    fn on_ctrl(&mut self, frame: Ctrl) -> Result<()> {
        let peer = self.peer;
        let find = |reqs: &[Option<SendReq>], id: u64, slot: u8| {
            reqs.iter().position(|r| {
                r.as_ref()
                    .is_some_and(|r| r.cts_id == id && r.slot == slot && !r.acked)
            })
        };
        match frame {
            Ctrl::Cts { id, slots } => {
                if self.cts.len() >= NCCL_NET_MAX_REQUESTS || slots.len() > MAX_RECVS {
                    return Err(NetError::remote(format!(
                        "{peer} posted more receives than NCCL allows in flight"
                    )));
                }
                let matched = vec![false; slots.len()];
                self.cts.push_back(Cts { id, slots, matched });
            }
            Ctrl::Ack { id, slot } => {
                let ri = find(&self.reqs, id, slot).ok_or_else(|| {
                    NetError::remote(format!("{peer} acked message {id}/{slot}, which is not in flight"))
                })?;
                if let Some(r) = self.reqs[ri].as_mut() {
                    r.acked = true;
                }
            }
            Ctrl::Nack { id, slot, pieces } => {
                let ri = find(&self.reqs, id, slot).ok_or_else(|| {
                    NetError::remote(format!(
                        "{peer} asked again for message {id}/{slot}, which is not in flight"
                    ))
                })?;
                let Some(r) = self.reqs[ri].as_mut() else {
                    return Ok(());
                };
                for &p in pieces.iter().rev() {
                    if p >= r.layout.count {
                        return Err(NetError::remote(format!(
                            "{peer} asked again for piece {p} of a message of {} pieces",
                            r.layout.count
                        )));
                    }
                    r.attempts[p as usize] += 1;
                    if r.attempts[p as usize] > MAX_RESENDS {
                        return Err(NetError::remote(format!(
                            "piece {p} of a {}-byte message to {peer} failed its CRC32C at the receiver {} times; \
                             giving up (a link or host that corrupts data; NCCL_GRDMA_TEST_INJECT_FAULTS set?)",
                            r.size,
                            MAX_RESENDS + 1
                        )));
                    }
                    r.unsent += 1;
                    self.queue.push_front((ri, p));
                }
                self.counters.repaired += pieces.len() as u64;
            }
            Ctrl::Reject { reason } => {
                return Err(NetError::remote(format!(
                    "the listener at {peer} refused this connection ({}): the handle is not the one that listener made",
                    match reason {
                        crate::wire::REJECT_BAD_TOKEN => "wrong token",
                        _ => "bad hello",
                    }
                )))
            }
        }
        Ok(())
    }

    fn next_frame(&mut self) -> Option<TxFrame> {
        let (ri, p) = self.queue.pop_front()?;
        let r = self.reqs[ri].as_ref()?;
        let (off, len) = r.layout.range(p);
        // SAFETY: offset and length lie within the isend buffer (Layout covers exactly
        // `size` bytes), valid while the request is in flight.
        let data = unsafe { r.data.add(off as usize) };
        let bytes = unsafe { sock::raw_bytes(data, len as usize) };
        let mut crc = if r.checked {
            integrity::crc32c(bytes)
        } else {
            0
        };
        let mut flip = None;
        if let Some(inj) = self.injector.as_mut() {
            if inj.strike() {
                self.counters.injected += 1;
                if len > 0 {
                    let at = len as usize / 2;
                    flip = Some((at, [bytes[at] ^ 0x10]));
                } else {
                    crc ^= 1;
                }
            }
        }
        let h = PieceHeader {
            checked: r.checked,
            slot: r.slot,
            attempt: r.attempts[p as usize],
            cts_id: r.cts_id,
            piece: p,
            pieces: r.layout.count,
            total: r.size,
            offset: off,
            len,
            crc,
        };
        Some(TxFrame {
            req: ri,
            header: h.encode(),
            data,
            len: len as usize,
            flip,
            sent: 0,
        })
    }

    fn write_streams(&mut self) -> Result<()> {
        let n = self.streams.len();
        let mut budget = vec![BUDGET_PER_SOCKET; n];
        let mut blocked = vec![false; n];
        loop {
            let mut moved = false;
            for i in 0..n {
                if blocked[i] || budget[i] == 0 {
                    continue;
                }
                if self.streams[i].frame.is_none() {
                    self.streams[i].frame = self.next_frame();
                }
                let peer = self.peer;
                let s = &mut self.streams[i];
                let Some(f) = s.frame.as_mut() else { continue };
                let io = sock::send(&s.sock, &f.remaining())
                    .map_err(|e| io_err(format!("data socket {i} to {peer}"), e))?;
                match io {
                    Io::Moved(k) => {
                        f.sent += k;
                        budget[i] = budget[i].saturating_sub(k);
                        moved = true;
                        if f.sent == f.total() {
                            let ri = f.req;
                            s.frame = None;
                            if let Some(r) = self.reqs[ri].as_mut() {
                                r.unsent -= 1;
                            }
                        }
                    }
                    _ => blocked[i] = true,
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }

    /// `closeSend`: the sockets close with the comm; the counters go to NCCL's log.
    pub fn close(self: Box<Self>) {
        info!(NET; "send comm to {} closed: {}", self.peer, self.counters.line());
        integrity::SENT.add(&self.counters);
    }
}
