//! The receive comm: each `irecv` (1 to `MAX_RECVS` buffers, each with a tag) is
//! announced to the sender with a clear-to-send frame; pieces land straight in NCCL's
//! buffers from whichever data socket carries them; each piece's CRC32C is checked
//! where it landed; once every piece of a message arrived, the corrupt ones are asked
//! for again (a NACK) or, all good, the message is acked. A request is done when every
//! buffer's message arrived whole and good and the acks went out.

use super::{free_slot, Handles, BUDGET_PER_SOCKET, RECV_MAGIC};
use crate::abi::NCCL_NET_MAX_REQUESTS;
use crate::error::{io_err, NetError, Result};
use crate::integrity::{self, Counters};
use crate::log::{info, NET};
use crate::sock::{self, Io};
use crate::wire::{Ctrl, Layout, PieceHeader, PostedSlot};
use socket2::Socket;
use std::ffi::c_void;
use std::io::IoSlice;
use std::net::SocketAddr;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Piece {
    Expected,
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

struct RxSlot {
    data: *mut u8,
    posted: u64,
    tag: i32,
    msg: Option<Msg>,
    complete: bool,
}

struct RecvReq {
    id: u64,
    slots: Vec<RxSlot>,
}

struct RxPiece {
    req: usize,
    slot: usize,
    piece: u32,
    dst: *mut u8,
    len: usize,
    got: usize,
    crc: u32,
    checked: bool,
}

struct RxStream {
    sock: Socket,
    hdr: [u8; PieceHeader::LEN],
    hdr_got: usize,
    cur: Option<RxPiece>,
}

#[repr(C)]
pub struct RecvComm {
    magic: u64,
    ctrl: Socket,
    ctrl_out: Vec<u8>,
    ctrl_sent: usize,
    streams: Vec<RxStream>,
    reqs: Vec<Option<RecvReq>>,
    handles: Option<Handles>,
    next_id: u64,
    failed: Option<NetError>,
    peer_closed: bool,
    peer: String,
    counters: Counters,
}

impl RecvComm {
    pub fn new(ctrl: Socket, data: Vec<Socket>) -> Box<Self> {
        let peer = ctrl
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or_else(|| "?".to_string(), |a: SocketAddr| a.to_string());
        let streams = data
            .into_iter()
            .map(|sock| RxStream {
                sock,
                hdr: [0; PieceHeader::LEN],
                hdr_got: 0,
                cur: None,
            })
            .collect::<Vec<_>>();
        let mut c = Box::new(Self {
            magic: RECV_MAGIC,
            ctrl,
            ctrl_out: Vec::new(),
            ctrl_sent: 0,
            streams,
            reqs: (0..NCCL_NET_MAX_REQUESTS).map(|_| None).collect(),
            handles: None,
            next_id: 1,
            failed: None,
            peer_closed: false,
            peer,
            counters: Counters::default(),
        });
        let me = &mut *c as *mut Self as *mut c_void;
        c.handles = Some(Handles::new(false, me));
        info!(NET; "receive comm from {} over {} sockets", c.peer, c.streams.len());
        c
    }

    /// `irecv` into `bufs` (address, size, tag): a request, or `None` when all 32 are
    /// in flight.
    pub fn irecv(&mut self, bufs: &[(*mut u8, u64, i32)]) -> Result<Option<*mut c_void>> {
        self.progress()?;
        if self.peer_closed {
            return Err(self.closed_error());
        }
        let Some(ri) = free_slot(&self.reqs) else {
            return Ok(None);
        };
        let id = self.next_id;
        self.next_id += 1;
        Ctrl::Cts {
            id,
            slots: bufs
                .iter()
                .map(|&(_, size, tag)| PostedSlot { tag, size })
                .collect(),
        }
        .encode(&mut self.ctrl_out);
        self.reqs[ri] = Some(RecvReq {
            id,
            slots: bufs
                .iter()
                .map(|&(data, posted, tag)| RxSlot {
                    data,
                    posted,
                    tag,
                    msg: None,
                    complete: false,
                })
                .collect(),
        });
        let _ = self.progress();
        Ok(Some(
            self.handles
                .as_ref()
                .map_or(std::ptr::null_mut(), |h| h.ptr(ri)),
        ))
    }

    /// `test` on request `ri`: the received sizes, one per buffer, when done.
    pub fn test(&mut self, ri: usize) -> Result<Option<Vec<u64>>> {
        let r = self.progress();
        let Some(req) = self.reqs[ri].as_ref() else {
            return Err(NetError::invalid(
                "test: the request is not in flight on its receive comm",
            ));
        };
        let acks_out = self.ctrl_sent == self.ctrl_out.len();
        if acks_out && req.slots.iter().all(|s| s.complete) {
            let sizes: Vec<u64> = req
                .slots
                .iter()
                .map(|s| s.msg.as_ref().map_or(0, |m| m.layout.total))
                .collect();
            self.counters.messages += sizes.len() as u64;
            self.counters.bytes += sizes.iter().sum::<u64>();
            self.reqs[ri] = None;
            return Ok(Some(sizes));
        }
        r?;
        if self.peer_closed {
            return Err(self.closed_error());
        }
        Ok(None)
    }

    fn closed_error(&self) -> NetError {
        NetError::remote(format!(
            "the sender at {} closed the connection (its process ended or closed the comm)",
            self.peer
        ))
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self
            .flush_ctrl()
            .and_then(|_| self.read_streams())
            .and_then(|_| self.flush_ctrl());
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn flush_ctrl(&mut self) -> Result<()> {
        while self.ctrl_sent < self.ctrl_out.len() {
            match sock::send(
                &self.ctrl,
                &[IoSlice::new(&self.ctrl_out[self.ctrl_sent..])],
            )
            .map_err(|e| io_err(format!("control socket to {}", self.peer), e))?
            {
                Io::Moved(n) => self.ctrl_sent += n,
                _ => return Ok(()),
            }
        }
        self.ctrl_out.clear();
        self.ctrl_sent = 0;
        Ok(())
    }

    fn read_streams(&mut self) -> Result<()> {
        for i in 0..self.streams.len() {
            let mut budget = BUDGET_PER_SOCKET;
            while budget > 0 {
                let peer = &self.peer;
                let s = &mut self.streams[i];
                let io = match s.cur.as_mut() {
                    None => sock::recv(&s.sock, &mut s.hdr[s.hdr_got..]),
                    // SAFETY: `dst..dst+len` lies in an irecv buffer of a request in
                    // flight (checked against its posted size in `start_piece`).
                    Some(p) => unsafe { sock::recv_raw(&s.sock, p.dst.add(p.got), p.len - p.got) },
                }
                .map_err(|e| io_err(format!("data socket {i} from {peer}"), e))?;
                match io {
                    Io::Blocked => break,
                    Io::Closed => {
                        if s.cur.is_some() || s.hdr_got > 0 {
                            return Err(NetError::remote(format!(
                                "the sender at {peer} closed data socket {i} in the middle of a piece"
                            )));
                        }
                        self.peer_closed = true;
                        break;
                    }
                    Io::Moved(n) => {
                        budget = budget.saturating_sub(n);
                        match s.cur.as_mut() {
                            None => {
                                s.hdr_got += n;
                                if s.hdr_got == PieceHeader::LEN {
                                    s.hdr_got = 0;
                                    let hdr = s.hdr;
                                    self.start_piece(i, &hdr)?;
                                }
                            }
                            Some(p) => {
                                p.got += n;
                                if p.got == p.len {
                                    self.finish_piece(i)?;
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn start_piece(&mut self, stream: usize, hdr: &[u8; PieceHeader::LEN]) -> Result<()> {
        let peer = self.peer.clone();
        let bad = |m: String| NetError::remote(format!("from {peer}: {m}"));
        let h = PieceHeader::decode(hdr, self.streams.len()).map_err(|e| bad(e.0))?;
        let ri = self
            .reqs
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.id == h.cts_id))
            .ok_or_else(|| {
                bad(format!(
                    "a piece for receive {}, which is not posted",
                    h.cts_id
                ))
            })?;
        let Some(req) = self.reqs[ri].as_mut() else {
            return Err(NetError::internal("request vanished"));
        };
        let slot = req.slots.get_mut(h.slot as usize).ok_or_else(|| {
            bad(format!(
                "a piece for buffer {} of a receive of {}",
                h.slot, 0
            ))
        })?;
        if h.total > slot.posted {
            return Err(NetError::usage(format!(
                "from {peer}: a message of {} bytes for a receive of {} bytes (tag {})",
                h.total, slot.posted, slot.tag
            )));
        }
        let layout = Layout::new(h.total, self.streams.len());
        let msg = slot.msg.get_or_insert_with(|| Msg {
            layout,
            checked: h.checked,
            pieces: vec![Piece::Expected; layout.count as usize],
            outstanding: layout.count,
            bad: Vec::new(),
        });
        if msg.layout != layout || msg.checked != h.checked {
            return Err(bad(format!(
                "piece {} says the message has {} bytes, an earlier one said {}",
                h.piece, h.total, msg.layout.total
            )));
        }
        if msg.pieces[h.piece as usize] != Piece::Expected {
            return Err(bad(format!(
                "piece {} of message {}/{} arrived twice",
                h.piece, h.cts_id, h.slot
            )));
        }
        msg.pieces[h.piece as usize] = Piece::Arriving;
        let piece = RxPiece {
            req: ri,
            slot: h.slot as usize,
            piece: h.piece,
            // SAFETY: offset + len <= total <= posted size: inside the irecv buffer.
            dst: unsafe { slot.data.add(h.offset as usize) },
            len: h.len as usize,
            got: 0,
            crc: h.crc,
            checked: h.checked,
        };
        let empty = piece.len == 0;
        self.streams[stream].cur = Some(piece);
        if empty {
            self.finish_piece(stream)?;
        }
        Ok(())
    }

    fn finish_piece(&mut self, stream: usize) -> Result<()> {
        let Some(p) = self.streams[stream].cur.take() else {
            return Ok(());
        };
        // SAFETY: these `len` bytes of the irecv buffer were just written by recv.
        let good =
            !p.checked || integrity::crc32c(unsafe { sock::raw_bytes(p.dst, p.len) }) == p.crc;
        let Some(req) = self.reqs[p.req].as_mut() else {
            return Err(NetError::internal("request vanished"));
        };
        let id = req.id;
        let slot = &mut req.slots[p.slot];
        let Some(msg) = slot.msg.as_mut() else {
            return Err(NetError::internal("message vanished"));
        };
        msg.outstanding -= 1;
        if good {
            msg.pieces[p.piece as usize] = Piece::Good;
        } else {
            msg.pieces[p.piece as usize] = Piece::Expected;
            msg.bad.push(p.piece);
        }
        if msg.outstanding == 0 {
            if msg.bad.is_empty() {
                slot.complete = true;
                if msg.checked {
                    Ctrl::Ack {
                        id,
                        slot: p.slot as u8,
                    }
                    .encode(&mut self.ctrl_out);
                }
            } else {
                let pieces = std::mem::take(&mut msg.bad);
                msg.outstanding = pieces.len() as u32;
                self.counters.repaired += pieces.len() as u64;
                Ctrl::Nack {
                    id,
                    slot: p.slot as u8,
                    pieces,
                }
                .encode(&mut self.ctrl_out);
            }
        }
        Ok(())
    }

    /// `closeRecv`: the sockets close with the comm; the counters go to NCCL's log.
    pub fn close(self: Box<Self>) {
        info!(NET; "receive comm from {} closed: {}", self.peer, self.counters.line());
        integrity::RECEIVED.add(&self.counters);
    }
}
