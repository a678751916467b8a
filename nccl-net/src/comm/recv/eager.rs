//! The receive side of eager messages: sent before the sender saw their receive's
//! clear-to-send, they land in a bounce buffer of the comm (taken from its
//! [`BouncePool`]), are checked and acked there, and are copied into NCCL's buffer once
//! their receive is posted, where the sender's match frame says ([`on_match`]); with
//! `NCCL_GRDMA_EAGER_BY_NUMBER` (off by default), one for a receive of one buffer goes
//! to the buffer of its number instead (`PieceHeader::index`, [`place_by_index`]), and
//! lands there in place, no bounce buffer and no copy, when that receive was posted
//! before its first piece came ([`in_place_target`]). A peer may not hold more of them than
//! a sender ever keeps unmatched (`EAGER_HELD_MAX`, `EAGER_HELD_MESSAGES`). Called by
//! the readers of [`super`] and by `irecv` under the comm's lock, but for the copy
//! itself ([`copy_placed`]).

use super::{Msg, RxPiece, Shared, State};
use crate::error::{NetError, Result};
use crate::sock::RawBuf;
use crate::wire::{
    Ctrl, PieceHeader, EAGER_BUDGET, EAGER_HELD_MAX, EAGER_HELD_MESSAGES, EAGER_MAX, EAGER_SLOT,
};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// An eager message: its bytes in a bounce buffer until it is placed (by its number or
/// by a match frame).
#[derive(Default)]
pub(super) struct Eager {
    msg: Option<Msg>,
    /// The bounce buffer, at least the message's size (taken from the comm's pool at the
    /// first piece; never resized after, so the address the readers write to stays put).
    buf: Vec<u8>,
    /// Where it belongs (request, buffer), once known (its receive posted, and the match
    /// frame came where that receive is grouped).
    target: Option<(usize, usize)>,
    /// Arrived whole and good (and acked, checks on).
    good: bool,
    ack_at: u64,
    /// The message's number and tag (from its first piece).
    index: u64,
    tag: i32,
    /// Where it lands in place instead of `buf`: the NCCL buffer of its receive, posted
    /// before its first piece came (by number only; `in_place_target`).
    direct: Option<RawBuf>,
}

impl Eager {
    /// The message's size (0 before its first piece).
    pub(super) fn total(&self) -> usize {
        self.msg.as_ref().map_or(0, |m| m.layout.total as usize)
    }
}

/// Bounce buffers kept from one eager message to the next. A fresh buffer is zeroed and
/// faulted in page by page at its first write (and one of 128 KiB or more is a fresh
/// mapping from the kernel, unmapped again when freed), on the reader's time, for every
/// message; kept ones are warm. While eager messages come, at most `POOL_BYTES` and
/// `POOL_BUFFERS` buffers are kept (the eager budget: what a sender may have in flight
/// was allocated for it anyway); once none came for `POOL_IDLE`, the pool shrinks to
/// `POOL_IDLE_BYTES` and `POOL_IDLE_BUFFERS`: what stays allocated per receive comm after
/// the traffic stopped, for every comm of every peer and channel (NCCL's default 128
/// KiB chunks, 8 steps in flight, need 1 MiB). Buffers under `POOL_MIN` come from the
/// allocator's own free lists and are not kept.
pub(super) struct BouncePool {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
    /// When a buffer was last taken (an eager message's first piece).
    last_take: Instant,
}

impl Default for BouncePool {
    fn default() -> Self {
        BouncePool {
            bufs: Vec::new(),
            bytes: 0,
            last_take: Instant::now(),
        }
    }
}

const POOL_BYTES: usize = EAGER_BUDGET as usize;
const POOL_BUFFERS: usize = 128;
const POOL_IDLE_BYTES: usize = 4 << 20;
const POOL_IDLE_BUFFERS: usize = 32;
pub(super) const POOL_IDLE: Duration = Duration::from_secs(1);
const POOL_MIN: usize = 64 << 10;

impl BouncePool {
    /// A buffer of at least `len` bytes: the smallest kept one large enough, or a new one.
    fn take(&mut self, len: usize) -> Vec<u8> {
        self.last_take = Instant::now();
        let best = (self.bufs.iter().enumerate())
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let buf = self.bufs.swap_remove(i);
                self.bytes -= buf.len();
                buf
            }
            None => vec![0u8; len],
        }
    }

    /// Keep `buf` for a later message, if there is room.
    fn give(&mut self, buf: Vec<u8>) {
        let fits = self.bytes + buf.len() <= POOL_BYTES;
        if buf.len() >= POOL_MIN && fits && self.bufs.len() < POOL_BUFFERS {
            self.bytes += buf.len();
            self.bufs.push(buf);
        }
    }

    /// Once no buffer was taken for `POOL_IDLE` (at `now`), frees the largest buffers
    /// until at most `POOL_IDLE_BYTES` and `POOL_IDLE_BUFFERS` are kept.
    pub(super) fn trim_if_idle(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_take) < POOL_IDLE {
            return;
        }
        self.bufs.sort_by_key(Vec::len);
        while self.bytes > POOL_IDLE_BYTES || self.bufs.len() > POOL_IDLE_BUFFERS {
            let Some(b) = self.bufs.pop() else { break };
            self.bytes -= b.len();
        }
    }
}

/// A piece of eager message `h.cts_id`: into its bounce buffer.
pub(super) fn start_eager(st: &mut State, sh: &Shared, h: &PieceHeader) -> Result<RxPiece> {
    let bad = |m: String| NetError::remote(format!("from {}: {m}", sh.peer));
    let seq = h.cts_id;
    if h.total > EAGER_MAX {
        return Err(bad(format!(
            "an eager message of {} bytes (at most {EAGER_MAX})",
            h.total
        )));
    }
    let first_piece = st.eager.get(&seq).is_none_or(|e| e.msg.is_none());
    if first_piece {
        // The peer may not hold more than a sender ever keeps.
        if st.eager.len() >= EAGER_HELD_MESSAGES || st.eager_held + h.total > EAGER_HELD_MAX {
            return Err(bad(format!(
                "eager message {seq} ({} bytes) on top of {} eager messages ({} bytes) not yet placed: \
                 more than a sender keeps in flight ({} messages, {EAGER_HELD_MAX} bytes at most)",
                h.total,
                st.eager.len(),
                st.eager_held,
                EAGER_HELD_MESSAGES
            )));
        }
        st.eager_held += h.total;
    }
    let direct = match first_piece && sh.by_number {
        true => in_place_target(st, h, seq),
        false => None,
    };
    let e = st.eager.entry(seq).or_default();
    if let Some((ri, base)) = direct {
        e.direct = Some(base);
        e.target = Some((ri, 0));
        let what = format_args!("eager {seq} is message {}: lands in place", h.index);
        sh.trace.note("recv", seq, what);
    }
    if first_piece {
        (e.index, e.tag) = (h.index, h.tag);
    } else if (e.index, e.tag) != (h.index, h.tag) {
        return Err(bad(format!(
            "piece {} of eager message {seq} says it is message {} (tag {}), an earlier one said {} (tag {})",
            h.piece, h.index, h.tag, e.index, e.tag
        )));
    }
    Msg::arriving(
        &mut e.msg,
        h,
        sh.streams,
        format_args!("eager message {seq}"),
    )
    .map_err(bad)?;
    let dst = match e.direct {
        // SAFETY: offset + len <= total (decode checked the layout) <= the posted size of
        // the receive's buffer (`in_place_target` checked it): inside NCCL's buffer,
        // which stays ours while the slot's message is not good (its request cannot
        // complete before `place`, after the last piece is Good).
        Some(base) => RawBuf(unsafe { base.0.add(h.offset as usize) }),
        None => {
            if (e.buf.len() as u64) < h.total {
                e.buf = st.pool.take(h.total as usize);
            }
            // SAFETY: offset + len <= total <= the bounce buffer's length (decode
            // checked the layout, the buffer was taken at least that large); the buffer
            // is not resized or freed while a piece of it is Arriving (allocated before
            // the first piece, dropped only once all are Good).
            RawBuf(unsafe { e.buf.as_mut_ptr().add(h.offset as usize) })
        }
    };
    let piece = RxPiece {
        eager: Some(seq),
        tn: seq,
        req: 0,
        slot: 0,
        piece: h.piece,
        dst,
        len: h.len as usize,
        crc: h.crc,
        checked: h.checked,
        // A bounce buffer is ours: only a piece landing in NCCL's buffer is staged.
        staged: e.direct.is_some() && crate::integrity::must_stage(h.checked, h.total),
    };
    if first_piece && sh.by_number {
        // Its receive may be posted already: its buffer is known from now on (the
        // message is placed once whole; this piece is Arriving, so not before).
        place_by_index(st, sh, seq)?;
    }
    Ok(piece)
}

/// Where eager message `seq` (whose first piece `h` is) can land in place: the buffer of
/// its number where that is a posted receive's only buffer, of its tag, large enough
/// and free; reserved for it (`RxSlot::in_place`). Anything else goes to a bounce
/// buffer, and `place_by_index` (now or at `irecv`) finds it a home or the fault.
fn in_place_target(st: &mut State, h: &PieceHeader, seq: u64) -> Option<(usize, RawBuf)> {
    let index = h.index;
    let ri = st.reqs.iter().position(|r| {
        r.as_ref()
            .is_some_and(|r| r.base == index && r.slots.len() == 1)
    })?;
    let slot = &mut st.reqs[ri].as_mut()?.slots[0];
    if slot.tag != h.tag || h.total > slot.posted || slot.taken() {
        return None;
    }
    slot.in_place = Some(seq);
    Some((ri, slot.data))
}

/// The eager message (its first piece in) that is message `index` of the comm, if
/// one is held.
pub(super) fn numbered(st: &State, index: u64) -> Option<u64> {
    (st.eager.iter())
        .find(|(_, e)| e.msg.is_some() && e.index == index)
        .map(|(&seq, _)| seq)
}

/// Eager message `seq` goes to the buffer of its number (`PieceHeader::index`) where
/// that buffer is a receive's only one and is posted: its target is set, and it is
/// placed if it is whole already. Nothing happens before the receive is posted
/// (`irecv` calls again), nor for a grouped receive (the sender's match frame says
/// which of its buffers). A number whose receive is done already, or a tag that is not
/// the receive's, fails the comm: the sender would have found the same.
pub(super) fn place_by_index(st: &mut State, sh: &Shared, seq: u64) -> Result<()> {
    let Some(e) = st.eager.get(&seq) else {
        return Err(NetError::internal("eager message vanished"));
    };
    if e.target.is_some() {
        return Ok(());
    }
    let (index, tag) = (e.index, e.tag);
    let holder = st.reqs.iter().enumerate().find_map(|(ri, r)| {
        r.as_ref()
            .filter(|r| r.base <= index && index - r.base < r.slots.len() as u64)
            .map(|r| (ri, r.id, r.tn, r.slots.len(), r.slots[0].tag))
    });
    let Some((ri, id, tn, n, posted_tag)) = holder else {
        if index < st.buffers {
            return Err(NetError::remote(format!(
                "from {}: eager message {seq} is message {index}, whose receive is done already",
                sh.peer
            )));
        }
        return Ok(());
    };
    if n > 1 {
        return Ok(());
    }
    if tag != posted_tag {
        return Err(NetError::usage(format!(
            "from {}: eager message {seq} (tag {tag}) is message {index}, for receive {id} posted \
             with tag {posted_tag}: the ranks disagree on the order of messages",
            sh.peer
        )));
    }
    let what = format_args!("eager {seq} is message {index}: buffer 0 of receive {id}");
    aim(st, sh, seq, (ri, 0), tn, what)
}

/// Eager message `seq` belongs in `target` (request, buffer), as `what` says in the
/// trace of request `tn`: placed at once if it arrived whole and good already, else
/// once it does.
fn aim(
    st: &mut State,
    sh: &Shared,
    seq: u64,
    target: (usize, usize),
    tn: u64,
    what: std::fmt::Arguments<'_>,
) -> Result<()> {
    let Some(e) = st.eager.get_mut(&seq) else {
        return Err(NetError::internal("eager message vanished"));
    };
    e.target = Some(target);
    let good = e.good;
    sh.trace.event("recv", tn, what);
    if good {
        place(st, sh, seq)?;
    }
    Ok(())
}

/// The sender's match frame: eager message `seq` belongs in buffer `slot` of receive
/// `cts_id`.
pub(super) fn on_match(
    st: &mut State,
    sh: &Shared,
    seq: u64,
    cts_id: u64,
    slot: usize,
) -> Result<()> {
    let bad = |m: String| NetError::remote(format!("from {}: {m}", sh.peer));
    let ri = st
        .reqs
        .iter()
        .position(|r| r.as_ref().is_some_and(|r| r.id == cts_id))
        .ok_or_else(|| {
            bad(format!(
                "eager message {seq} matched to receive {cts_id}, which is not posted"
            ))
        })?;
    let (tn, n) = st.reqs[ri]
        .as_ref()
        .map_or((0, 0), |r| (r.tn, r.slots.len()));
    if slot >= n {
        return Err(bad(format!(
            "eager message {seq} matched to buffer {slot} of a receive of {n}"
        )));
    }
    if n == 1 && sh.by_number {
        return Err(bad(format!(
            "a match frame for eager message {seq} to receive {cts_id}, of one buffer: this side \
             places those by the message's number (a sender of another plugin version?)"
        )));
    }
    if !st.eager.contains_key(&seq) && st.eager.len() >= EAGER_HELD_MESSAGES {
        return Err(bad(format!(
            "a match frame for eager message {seq}, not yet sent, on top of {} eager messages not yet placed",
            st.eager.len()
        )));
    }
    if st.eager.entry(seq).or_default().target.is_some() {
        return Err(bad(format!("eager message {seq} matched twice")));
    }
    let what = format_args!("eager {seq} matched to buffer {slot}");
    aim(st, sh, seq, (ri, slot), tn, what)
}

/// Eager message `seq` (whole, good, matched) is to be copied into its NCCL buffer:
/// queued for the reader that holds the lock to copy once it let go of it (a copy of
/// megabytes under the lock would hold every other reader of the comm).
pub(super) fn place(st: &mut State, sh: &Shared, seq: u64) -> Result<()> {
    let Some(e) = st.eager.remove(&seq) else {
        return Err(NetError::internal("eager message vanished"));
    };
    st.eager_held = st.eager_held.saturating_sub(e.total() as u64);
    let (Some((ri, si)), Some(total)) = (e.target, e.msg.as_ref().map(|m| m.layout.total)) else {
        return Err(NetError::internal("eager message placed unmatched"));
    };
    let Some(req) = st.reqs[ri].as_mut() else {
        return Err(NetError::internal("request vanished"));
    };
    let id = req.id;
    let tn = req.tn;
    let slot = &mut req.slots[si];
    if e.direct.is_some() {
        // It landed in place: done, nothing to copy.
        if slot.in_place != Some(seq) || slot.taken_but_in_place() {
            return Err(NetError::internal("a message in place lost its buffer"));
        }
        let Eager {
            msg, buf, ack_at, ..
        } = e;
        slot.in_place = None;
        slot.msg = msg;
        slot.ack_at = ack_at;
        slot.good = true;
        st.pool.give(buf);
        sh.trace.event(
            "recv",
            tn,
            format_args!("eager {seq} landed in place in buffer {si}"),
        );
        return Ok(());
    }
    if slot.taken() {
        return Err(NetError::remote(format!(
            "from {}: eager message {seq} for buffer {si} of receive {id}, which has a message already",
            sh.peer
        )));
    }
    if total > slot.posted {
        return Err(NetError::usage(format!(
            "from {}: a message of {} bytes for a receive of {} bytes (tag {})",
            sh.peer, total, slot.posted, slot.tag
        )));
    }
    slot.placing = true;
    st.to_place.push((seq, ri, si, e));
    Ok(())
}

/// Copies the eager messages `place` queued, outside the lock, then marks their
/// buffers done. The request cannot complete meanwhile (its buffer is not good yet),
/// so NCCL's buffer stays ours for the copy; `close` joins this thread first.
pub(super) fn copy_placed<'a>(sh: &'a Shared, mut st: MutexGuard<'a, State>) {
    while !st.to_place.is_empty() {
        let work = std::mem::take(&mut st.to_place);
        let dsts: Vec<RawBuf> = work
            .iter()
            .map(|&(_, ri, si, _)| {
                st.reqs[ri]
                    .as_ref()
                    .map_or(RawBuf(std::ptr::null_mut()), |r| r.slots[si].data)
            })
            .collect();
        drop(st);
        for ((_, _, _, e), dst) in work.iter().zip(&dsts) {
            if !dst.0.is_null() {
                // SAFETY: place() checked len <= the posted size: inside the irecv
                // buffer, ours until its request completes (not before `good`, below);
                // the source is the message's own bounce buffer, at least `total` long.
                unsafe { std::ptr::copy_nonoverlapping(e.buf.as_ptr(), dst.0, e.total()) };
            }
        }
        st = sh.lock();
        for (seq, ri, si, e) in work {
            let Eager {
                msg, buf, ack_at, ..
            } = e;
            st.pool.give(buf);
            let Some(req) = st.reqs[ri].as_mut() else {
                continue;
            };
            let tn = req.tn;
            let slot = &mut req.slots[si];
            slot.msg = msg;
            slot.ack_at = ack_at;
            slot.placing = false;
            slot.good = true;
            sh.trace.event(
                "recv",
                tn,
                format_args!("eager {seq} copied into buffer {si}"),
            );
        }
    }
}

/// A piece of eager message `seq` is in (good or not): as `finish_piece`, for the
/// bounce buffer; once whole and good it is acked, and placed if already matched.
pub(super) fn finish_eager(
    st: &mut State,
    sh: &Shared,
    p: &RxPiece,
    seq: u64,
    good: bool,
) -> Result<()> {
    let Some(msg) = st.eager.get_mut(&seq).and_then(|e| e.msg.as_mut()) else {
        return Err(NetError::internal("eager message vanished"));
    };
    if !msg.landed(p.piece, good) {
        return Ok(());
    }
    let checked = msg.checked;
    if !msg.bad.is_empty() {
        let pieces = msg.take_bad();
        st.counters.repaired += pieces.len() as u64;
        let nack = Ctrl::Nack {
            id: seq,
            slot: EAGER_SLOT,
            pieces,
        };
        sh.push_ctrl(st, &nack)?;
        return Ok(());
    }
    let at = if checked {
        let ack = Ctrl::Ack {
            id: seq,
            slot: EAGER_SLOT,
        };
        sh.push_ctrl(st, &ack)?
    } else {
        0
    };
    sh.trace.note(
        "recv",
        seq,
        format_args!(
            "eager {seq}: last byte read into the bounce buffer{}",
            if checked { ", ack sent" } else { "" }
        ),
    );
    let Some(e) = st.eager.get_mut(&seq) else {
        return Err(NetError::internal("eager message vanished"));
    };
    e.good = true;
    e.ack_at = at;
    if e.target.is_some() {
        place(st, sh, seq)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{RecvReq, RxSlot};
    use super::*;
    use crate::trace::Trace;
    use crate::wire::Layout;
    use socket2::{Domain, Socket, Type};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Condvar, Mutex};

    fn shared(streams: usize) -> Shared {
        Shared {
            state: Mutex::new(State::new()),
            ctrl_wake: Condvar::new(),
            stop: AtomicBool::new(false),
            ctrl: Arc::new(Socket::new(Domain::IPV4, Type::STREAM, None).unwrap()),
            streams,
            peer: "the peer".into(),
            trace: Trace::from_env(),
            by_number: true,
        }
    }

    /// Piece `piece` of eager message `seq` of `total` bytes, as a sender's header says
    /// (the comm's message number `seq`, tag 0).
    fn eager_piece(sh: &Shared, seq: u64, total: u64, piece: u32) -> PieceHeader {
        let layout = Layout::new(total, sh.streams);
        let (offset, len) = layout.range(piece);
        PieceHeader {
            matched: false,
            checked: true,
            slot: EAGER_SLOT,
            attempt: 0,
            cts_id: seq,
            piece,
            pieces: layout.count,
            total,
            offset,
            len,
            crc: 0,
            index: seq,
            tag: 0,
        }
    }

    /// A receive posted at `ri` with `tags.len()` buffers of 1 KiB, numbered from `base`.
    fn post(st: &mut State, ri: usize, id: u64, base: u64, tags: &[i32]) {
        st.reqs[ri] = Some(RecvReq {
            tn: 0,
            id,
            base,
            slots: (tags.iter())
                .map(|&tag| RxSlot::posted(std::ptr::null_mut(), 1024, tag))
                .collect(),
        });
        st.buffers = st.buffers.max(base + tags.len() as u64);
    }

    #[test]
    fn without_placing_by_number_a_match_frame_places_every_eager_message() {
        let mut sh = shared(1);
        sh.by_number = false;
        let mut st = sh.lock();
        post(&mut st, 3, 12, 0, &[0]);
        start_eager(&mut st, &sh, &eager_piece(&sh, 0, 100, 0)).unwrap();
        assert_eq!(st.eager[&0].target, None, "not placed by its number");
        on_match(&mut st, &sh, 0, 12, 0).unwrap();
        assert_eq!(
            st.eager[&0].target,
            Some((3, 0)),
            "placed by the match frame"
        );
    }

    #[test]
    fn an_eager_message_goes_to_the_buffer_of_its_number_without_a_match_frame() {
        let sh = shared(1);
        let mut st = sh.lock();
        // Messages 0 and 1 were received; message 2 is posted alone, 3 and 4 as a group.
        st.buffers = 2;
        post(&mut st, 3, 12, 2, &[0]);
        post(&mut st, 4, 13, 3, &[0, 0]);
        start_eager(&mut st, &sh, &eager_piece(&sh, 2, 100, 0)).unwrap();
        assert_eq!(
            st.eager[&2].target,
            Some((3, 0)),
            "its receive's only buffer"
        );
        start_eager(&mut st, &sh, &eager_piece(&sh, 3, 100, 0)).unwrap();
        assert_eq!(
            st.eager[&3].target, None,
            "a group waits for the match frame"
        );
        on_match(&mut st, &sh, 3, 13, 1).unwrap();
        assert_eq!(st.eager[&3].target, Some((4, 1)));
        // Its receive not posted yet: nothing until `irecv` (which calls place_by_index).
        start_eager(&mut st, &sh, &eager_piece(&sh, 5, 100, 0)).unwrap();
        assert_eq!(st.eager[&5].target, None);
        post(&mut st, 5, 14, 5, &[0]);
        place_by_index(&mut st, &sh, 5).unwrap();
        assert_eq!(st.eager[&5].target, Some((5, 0)));
        // A match frame for a receive of one buffer is not this protocol.
        let e = on_match(&mut st, &sh, 5, 14, 0).err().unwrap();
        assert!(e.to_string().contains("of one buffer"), "{e}");
    }

    /// A receive of `len` bytes into `buf`, posted at `ri` as message number `base`.
    fn post_buf(st: &mut State, ri: usize, id: u64, base: u64, buf: &mut [u8], tag: i32) {
        st.reqs[ri] = Some(RecvReq {
            tn: 0,
            id,
            base,
            slots: vec![RxSlot::posted(buf.as_mut_ptr(), buf.len() as u64, tag)],
        });
        st.buffers = st.buffers.max(base + 1);
    }

    #[test]
    fn an_eager_message_whose_receive_is_posted_lands_in_place_without_a_copy() {
        let sh = shared(2);
        let mut st = sh.lock();
        st.ctrl.busy = true; // acks queue; no socket here
        let mut nccl = vec![0u8; 512 << 10];
        let base = nccl.as_mut_ptr() as usize;
        post_buf(&mut st, 1, 20, 0, &mut nccl, 0);
        // Message 0, 300 KiB in two pieces: both land in NCCL's buffer.
        let total = 300 << 10;
        let mut pieces = Vec::new();
        for piece in 0..2 {
            let h = eager_piece(&sh, 0, total, piece);
            let p = start_eager(&mut st, &sh, &h).unwrap();
            assert_eq!(
                p.dst.0 as usize,
                base + h.offset as usize,
                "piece {piece} in place"
            );
            pieces.push(p);
        }
        assert!(
            st.pool.bufs.is_empty() && st.eager[&0].buf.is_empty(),
            "no bounce buffer"
        );
        assert_eq!(st.reqs[1].as_ref().unwrap().slots[0].in_place, Some(0));
        for p in &pieces {
            finish_eager(&mut st, &sh, p, 0, true).unwrap();
        }
        assert!(st.to_place.is_empty(), "nothing to copy");
        assert!(st.eager.is_empty() && st.eager_held == 0);
        let slot = &st.reqs[1].as_ref().unwrap().slots[0];
        assert!(slot.good && slot.in_place.is_none());
        assert_eq!(slot.msg.as_ref().unwrap().layout.total, total);

        // Message 1 comes before its receive: into a bounce buffer, copied once posted.
        start_eager(&mut st, &sh, &eager_piece(&sh, 1, 100, 0)).unwrap();
        assert!(st.eager[&1].direct.is_none() && st.eager[&1].buf.len() >= 100);
        // Message 2's receive has another tag, message 3's is too small: not in place
        // (and the fault is found as before: the tag at once, the size when placed).
        let mut small = vec![0u8; 10];
        post_buf(&mut st, 2, 21, 2, &mut nccl[..64], 7);
        post_buf(&mut st, 3, 22, 3, &mut small, 0);
        let e = start_eager(&mut st, &sh, &eager_piece(&sh, 2, 10, 0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("disagree on the order"), "{e}");
        assert_eq!(st.reqs[2].as_ref().unwrap().slots[0].in_place, None);
        let p = start_eager(&mut st, &sh, &eager_piece(&sh, 3, 100, 0)).unwrap();
        assert!(st.eager[&3].direct.is_none());
        let e = finish_eager(&mut st, &sh, &p, 3, true).err().unwrap();
        assert!(e.to_string().contains("for a receive of 10 bytes"), "{e}");
    }

    #[test]
    fn a_second_message_for_a_buffer_taken_in_place_is_refused() {
        let sh = shared(1);
        let mut st = sh.lock();
        st.ctrl.busy = true;
        let mut nccl = vec![0u8; 1024];
        post_buf(&mut st, 0, 30, 0, &mut nccl, 0);
        let first = start_eager(&mut st, &sh, &eager_piece(&sh, 0, 100, 0)).unwrap();
        assert!(st.eager[&0].direct.is_some());
        // A lying sender numbers another eager message 0 too: it cannot land in place,
        // and placing it fails the comm instead of overwriting the first.
        let mut dup = eager_piece(&sh, 1, 100, 0);
        dup.index = 0;
        let p = start_eager(&mut st, &sh, &dup).unwrap();
        assert!(st.eager[&1].direct.is_none(), "the buffer is taken");
        let e = finish_eager(&mut st, &sh, &p, 1, true).err().unwrap();
        assert!(e.to_string().contains("has a message already"), "{e}");
        finish_eager(&mut st, &sh, &first, 0, true).unwrap();
        assert!(st.reqs[0].as_ref().unwrap().slots[0].good);
    }

    #[test]
    fn an_eager_message_for_a_done_buffer_or_of_another_tag_is_refused() {
        let sh = shared(1);
        let mut st = sh.lock();
        st.buffers = 2;
        let e = start_eager(&mut st, &sh, &eager_piece(&sh, 1, 100, 0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("done already"), "{e}");
        post(&mut st, 0, 12, 2, &[7]);
        let e = start_eager(&mut st, &sh, &eager_piece(&sh, 2, 100, 0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("disagree on the order"), "{e}");
        // Pieces of one message that disagree on its number.
        let sh = shared(4);
        let mut st = sh.lock();
        start_eager(&mut st, &sh, &eager_piece(&sh, 9, 4 << 20, 0)).unwrap();
        let mut other = eager_piece(&sh, 9, 4 << 20, 1);
        other.index = 10;
        let e = start_eager(&mut st, &sh, &other).err().unwrap();
        assert!(e.to_string().contains("an earlier one said"), "{e}");
    }

    #[test]
    fn a_peer_flooding_eager_bytes_is_refused_past_four_budgets() {
        let sh = shared(4);
        let mut st = sh.lock();
        let n = EAGER_HELD_MAX / EAGER_MAX;
        for seq in 0..n {
            start_eager(&mut st, &sh, &eager_piece(&sh, seq, EAGER_MAX, 0)).unwrap();
            // Its other pieces are the same message: not counted again.
            start_eager(&mut st, &sh, &eager_piece(&sh, seq, EAGER_MAX, 1)).unwrap();
        }
        assert_eq!(st.eager_held, EAGER_HELD_MAX);
        let e = start_eager(&mut st, &sh, &eager_piece(&sh, n, 1, 0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not yet placed"), "{e}");
    }

    #[test]
    fn a_peer_flooding_eager_messages_or_match_frames_is_refused() {
        let sh = shared(1);
        let mut st = sh.lock();
        for seq in 0..EAGER_HELD_MESSAGES as u64 {
            start_eager(&mut st, &sh, &eager_piece(&sh, seq, 1, 0)).unwrap();
        }
        let e = start_eager(&mut st, &sh, &eager_piece(&sh, u64::MAX, 0, 0))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not yet placed"), "{e}");

        // Match frames naming eager messages never sent, each a new entry.
        let sh = shared(1);
        let mut st = sh.lock();
        post(&mut st, 0, 7, 0, &[0, 0]);
        for seq in 0..EAGER_HELD_MESSAGES as u64 {
            on_match(&mut st, &sh, seq, 7, 0).unwrap();
        }
        let e = on_match(&mut st, &sh, u64::MAX, 7, 0).err().unwrap();
        assert!(e.to_string().contains("not yet placed"), "{e}");
    }

    #[test]
    fn the_bounce_pool_hands_back_the_smallest_kept_buffer_large_enough() {
        let mut pool = BouncePool::default();
        let (small, large) = (vec![1u8; POOL_MIN], vec![2u8; 4 * POOL_MIN]);
        let (small_at, large_at) = (small.as_ptr(), large.as_ptr());
        pool.give(large);
        pool.give(small);
        assert_eq!(pool.bytes, 5 * POOL_MIN);
        let b = pool.take(POOL_MIN - 1);
        assert_eq!(b.as_ptr(), small_at, "the smallest that fits");
        let b = pool.take(2 * POOL_MIN);
        assert_eq!(b.as_ptr(), large_at);
        assert_eq!(pool.bytes, 0);
        let fresh = pool.take(3 * POOL_MIN);
        assert!(fresh.len() == 3 * POOL_MIN && fresh.iter().all(|&x| x == 0));
    }

    #[test]
    fn the_bounce_pool_keeps_at_most_its_budget_and_no_small_buffers() {
        let mut pool = BouncePool::default();
        pool.give(vec![0u8; POOL_MIN - 1]);
        assert!(pool.bufs.is_empty(), "small buffers are the allocator's");
        for _ in 0..1000 {
            pool.give(vec![0u8; POOL_MIN]);
        }
        assert_eq!(
            pool.bufs.len(),
            POOL_BUFFERS,
            "at most POOL_BUFFERS buffers"
        );
        let mut pool = BouncePool::default();
        for _ in 0..1000 {
            pool.give(vec![0u8; EAGER_MAX as usize / 3]);
        }
        assert!(pool.bytes <= POOL_BYTES && pool.bytes + EAGER_MAX as usize / 3 > POOL_BYTES);
        assert_eq!(pool.bytes, pool.bufs.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn an_idle_bounce_pool_shrinks_to_its_idle_budget() {
        let mut pool = BouncePool::default();
        let _ = pool.take(POOL_MIN);
        for _ in 0..100 {
            pool.give(vec![0u8; 160 << 10]);
        }
        assert_eq!(
            pool.bytes,
            100 * (160 << 10),
            "kept while eager messages come"
        );
        let taken = pool.last_take;
        pool.trim_if_idle(taken + POOL_IDLE / 2);
        assert_eq!(pool.bufs.len(), 100, "not idle yet: all kept");
        pool.trim_if_idle(taken + POOL_IDLE);
        assert!(pool.bytes <= POOL_IDLE_BYTES && pool.bufs.len() <= POOL_IDLE_BUFFERS);
        assert_eq!(pool.bytes, pool.bufs.iter().map(Vec::len).sum::<usize>());
        assert_eq!(
            pool.bufs.len(),
            POOL_IDLE_BYTES / (160 << 10),
            "the rest kept"
        );
        let mut many = BouncePool::default();
        for _ in 0..100 {
            many.give(vec![0u8; POOL_MIN]);
        }
        let t = many.last_take;
        many.trim_if_idle(t + POOL_IDLE);
        assert_eq!(many.bufs.len(), POOL_IDLE_BUFFERS);
    }
}
