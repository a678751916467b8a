//! Kept copies: a checked message of at most `KEEP_MAX` bytes is copied by the writers
//! as its pieces first go out, so its request can be done for NCCL once written; a
//! piece the receiver finds corrupt goes again from the copy, which is kept until the
//! ack; `close` waits (bounded) for the acks of such messages.

use super::{SendComm, SendReq, State};
use crate::sock::RawBuf;
use std::time::{Duration, Instant};

impl SendReq {
    /// Done for NCCL: every piece went out, and the receiver acked the message, or it
    /// is not checked, or a copy of it is kept for resends.
    pub(super) fn done(&self) -> bool {
        self.unsent == 0 && (self.acked || !self.checked || self.kept.is_some())
    }

    /// Finished with: reported to NCCL and nothing left to send or to hear.
    pub(super) fn finished(&self) -> bool {
        self.reported && self.unsent == 0 && (self.acked || !self.checked)
    }
}

/// A buffer of `KEEP_MAX` bytes for a message's copy, reached only through its raw
/// address: writers copy into and send from disjoint pieces of it at once, outside the
/// lock, so no reference to the whole buffer may exist while it is in use.
pub(super) struct KeptCopy(pub(super) RawBuf);

impl KeptCopy {
    fn new() -> Self {
        let b: Box<[u8]> = vec![0u8; KEEP_MAX as usize].into_boxed_slice();
        KeptCopy(RawBuf(Box::into_raw(b) as *mut u8))
    }
}

impl Drop for KeptCopy {
    fn drop(&mut self) {
        let whole = std::ptr::slice_from_raw_parts_mut(self.0 .0, KEEP_MAX as usize);
        // SAFETY: made by Box::into_raw in `new` with this length, freed only here; a
        // copy is dropped only with its request finished (no piece in a writer's
        // hands) or with the comm's state, after its threads were joined.
        drop(unsafe { Box::from_raw(whole) });
    }
}

/// A message's copy and where each of its pieces stands in it.
pub(super) struct Kept {
    pub(super) buf: KeptCopy,
    pieces: Vec<PieceCopy>,
}

/// Where a piece of a kept message stands: the copy of a piece is read only once the
/// writer that made it is done, so no peer (a receiver asking again for a piece it
/// cannot have seen yet) can make one thread read what another is still writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PieceCopy {
    Fresh,
    Copying,
    Copied,
}

/// What a writer's job for a piece of a kept message does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PieceSource {
    /// Copy the piece from NCCL's buffer into the copy, then send the copy.
    CopyIn,
    /// Send from NCCL's buffer (the piece's copy is being made by another job; NCCL's
    /// buffer is still ours: this job counts in `unsent`, so `test` cannot be done).
    Nccl,
    /// Send the copy.
    Copy,
}

impl Kept {
    pub(super) fn new(buf: KeptCopy, pieces: u32) -> Self {
        Kept {
            buf,
            pieces: vec![PieceCopy::Fresh; pieces as usize],
        }
    }

    /// A job for piece `p` was taken: where it sends from.
    pub(super) fn take(&mut self, p: u32) -> PieceSource {
        let state = &mut self.pieces[p as usize];
        match *state {
            PieceCopy::Fresh => {
                *state = PieceCopy::Copying;
                PieceSource::CopyIn
            }
            PieceCopy::Copying => PieceSource::Nccl,
            PieceCopy::Copied => PieceSource::Copy,
        }
    }

    /// The job that copied piece `p` in is done with it.
    pub(super) fn copied(&mut self, p: u32) {
        self.pieces[p as usize] = PieceCopy::Copied;
    }
}

/// The largest message whose copy is kept so that its request is done before the ack
/// (NCCL's default step is 128 KiB; larger steps are deep enough to hide the ack).
pub const KEEP_MAX: u64 = 256 << 10;
/// Kept copies per send comm (`KEEP_MAX` each, 4 MiB in all; allocated when first
/// needed, reused while sends come, freed once none came for `KEEP_IDLE`): beyond them
/// a message waits for its ack as a larger one does.
pub const KEEP_BUFFERS: usize = 16;
/// How long unused copy buffers stay allocated after the last small send.
pub(super) const KEEP_IDLE: Duration = Duration::from_secs(1);

/// A send comm's copy buffers: those held by requests (counted) and the spares.
pub(super) struct Copies {
    spare: Vec<KeptCopy>,
    in_use: usize,
    last_take: Instant,
}

impl Copies {
    pub(super) fn new() -> Self {
        Copies {
            spare: Vec::new(),
            in_use: 0,
            last_take: Instant::now(),
        }
    }

    /// A copy buffer for a message of `size` bytes, if it is checked, small enough, and
    /// fewer than `KEEP_BUFFERS` are in use.
    pub(super) fn take(&mut self, size: u64, checked: bool) -> Option<KeptCopy> {
        if !checked || size > KEEP_MAX || self.in_use >= KEEP_BUFFERS {
            return None;
        }
        self.in_use += 1;
        self.last_take = Instant::now();
        Some(self.spare.pop().unwrap_or_else(KeptCopy::new))
    }

    /// A buffer back from a finished request.
    pub(super) fn give(&mut self, b: KeptCopy) {
        self.in_use -= 1;
        self.spare.push(b);
    }

    /// Frees the spares once no buffer was taken for `KEEP_IDLE` (at `now`).
    pub(super) fn trim_if_idle(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_take) >= KEEP_IDLE {
            self.spare.clear();
        }
    }
}
/// How long `close` waits for the acks of kept messages, so that a corrupt piece among
/// them can still be sent again.
pub(super) const CLOSE_LINGER: Duration = Duration::from_secs(10);

impl State {
    /// Frees request `ri`'s slot if it is finished with, its copy buffer back to the spares.
    pub(super) fn retire_if_finished(&mut self, ri: usize) {
        if self.reqs[ri].as_ref().is_some_and(SendReq::finished) {
            if let Some(k) = self.reqs[ri].take().and_then(|r| r.kept) {
                self.copies.give(k.buf);
            }
        }
    }

    /// Kept messages reported done but not yet acked.
    pub(super) fn unacked_kept(&self) -> usize {
        self.reqs
            .iter()
            .flatten()
            .filter(|r| r.reported && !r.acked)
            .count()
    }

    /// Eager messages whose receive the receiver cannot know yet: not matched to one of
    /// its clear-to-send frames, or their match frame not yet written.
    pub(super) fn unplaced_eager(&self) -> usize {
        self.unresolved.len() + self.matches_unwritten
    }
}

impl SendComm {
    /// Waits (bounded) until no kept message waits for its ack, so that a piece the
    /// receiver finds corrupt can still be sent again after NCCL closed the comm, and
    /// until every eager message's match frame is written, so that the receiver can
    /// place it (a send is done once written, checks off or its copy kept: NCCL may
    /// close the comm before the receiver posted, or the sender read, its receive).
    pub(super) fn linger(&self) {
        let t0 = std::time::Instant::now();
        loop {
            let st = self.shared.lock();
            let (unacked, unplaced) = (st.unacked_kept(), st.unplaced_eager());
            if unacked + unplaced == 0 || st.failed.is_some() || st.peer_closed {
                return;
            }
            drop(st);
            if t0.elapsed() >= CLOSE_LINGER {
                crate::log::warn!("send comm to {}: closing after {} s with {unacked} messages the receiver has not acked (a corrupt piece among them can no longer be sent again) and {unplaced} eager messages it has not posted receives for (it will fail them)",
                    self.shared.peer, CLOSE_LINGER.as_secs());
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_sent_from_its_copy_only_once_the_copy_is_made() {
        let mut k = Kept::new(KeptCopy::new(), 2);
        assert_eq!(k.take(0), PieceSource::CopyIn, "the first job copies");
        // A resend asked for before the copying job is done (a lying peer): it must
        // not read the copy another thread is writing.
        assert_eq!(k.take(0), PieceSource::Nccl);
        assert_eq!(k.take(1), PieceSource::CopyIn, "each piece on its own");
        k.copied(0);
        assert_eq!(k.take(0), PieceSource::Copy, "later sends read the copy");
        assert_eq!(k.take(1), PieceSource::Nccl);
    }

    #[test]
    fn copies_are_bounded_reused_and_freed_when_idle() {
        let mut c = Copies::new();
        assert!(c.take(100, false).is_none(), "unchecked: no copy");
        assert!(c.take(KEEP_MAX + 1, true).is_none(), "too large: no copy");
        let held: Vec<KeptCopy> = (0..KEEP_BUFFERS)
            .map(|_| c.take(KEEP_MAX, true).unwrap())
            .collect();
        assert!(c.take(1, true).is_none(), "at most KEEP_BUFFERS in use");
        let made: Vec<*mut u8> = held.iter().map(|b| b.0 .0).collect();
        for b in held {
            c.give(b);
        }
        assert_eq!((c.in_use, c.spare.len()), (0, KEEP_BUFFERS));
        let again = c.take(1, true).unwrap();
        assert!(made.contains(&again.0 .0), "a spare is reused");
        c.give(again);
        let t = c.last_take;
        c.trim_if_idle(t + KEEP_IDLE / 2);
        assert_eq!(c.spare.len(), KEEP_BUFFERS, "kept while sends come");
        c.trim_if_idle(t + KEEP_IDLE);
        assert!(c.spare.is_empty(), "freed once idle");
        assert!(c.take(1, true).is_some(), "and made again when needed");
    }
}
