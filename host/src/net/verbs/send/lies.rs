//! TEST ONLY (`--test-peer-lies rewrite`): a sender that WRITEs the receiver's buffer
//! again after its CRC32Cs went — the last item's place, its first byte changed, from a
//! moment after them until its transfer ends — so the receiver's bytes change after it
//! checked them. The other lies are a changed field where `pump` builds a request; this
//! one has a clock of its own, kept here.

use super::{RailState, State, Target, VerbsSender, Waiting, BOUNCE_SLOTS, TAG_FRAGMENT};
use crate::net::LinkError;
use crate::rdma::{SendOp, SendWr};
use crate::transfer::faults::PeerLie;
use std::time::{Duration, Instant};

/// The first rewrite this long after the CRC32Cs went (the receiver has checked by then,
/// and is storing), then one every [`REWRITE_EVERY`], [`REWRITES`] in all.
const REWRITE_AFTER: Duration = Duration::from_millis(300);
const REWRITE_EVERY: Duration = Duration::from_millis(20);
const REWRITES: u32 = 150;

/// The rewrites of one connection, armed by its first CRC32Cs message.
pub(super) struct Rewrites {
    /// When the next one goes.
    next: Instant,
    left: u32,
    /// The bounce slot that holds the changed bytes (written once, kept).
    slot: Option<usize>,
}

impl VerbsSender<'_> {
    /// Arm the rewrites when `message`, which this side is sending, is its CRC32Cs.
    pub(super) fn arm_rewrites(&mut self, message: &[u8]) {
        if self.lies == Some(PeerLie::Rewrite)
            && self.rewrites.is_none()
            && message.starts_with(&crate::wire::CHECKSUMS_MAGIC)
        {
            self.rewrites = Some(Rewrites {
                next: Instant::now() + REWRITE_AFTER,
                left: REWRITES,
                slot: None,
            });
        }
    }

    /// When the next rewrite is due, while one can still go (a poll wakes for it; never a
    /// spin on a rail that is down).
    pub(super) fn rewrite_due(&self) -> Option<Instant> {
        self.rewrites
            .as_ref()
            .filter(|w| w.left > 0 && self.rails[0].state == State::Live)
            .map(|w| w.next)
    }

    /// Queue the next rewrite on rail 0 once it is due.
    pub(super) fn rewrite_when_due(&mut self) -> Result<(), LinkError> {
        let (Some((base, len)), Some(w)) = (self.host, self.rewrites.as_mut()) else {
            return Ok(());
        };
        let rail = &mut self.rails[0];
        if w.left == 0 || Instant::now() < w.next || rail.state != State::Live || len == 0 {
            return Ok(());
        }
        let offset = (len - 1) / self.item_len * self.item_len;
        let n = (len - offset).min(self.item_len);
        let slot = match w.slot {
            Some(slot) => slot,
            None => {
                let Some(slot) = rail.free_bounce.pop() else {
                    // Every bounce slot busy with copies: the lie is given up.
                    w.left = 0;
                    return Ok(());
                };
                // SAFETY: the range lies in the source's host memory (offset + n <= len),
                // valid while the source is borrowed; only read here.
                let bytes = unsafe { std::slice::from_raw_parts(base.as_ptr().add(offset), n) };
                let mut changed = bytes.to_vec();
                changed[0] ^= 0xff;
                // SAFETY: the slot was free, and it is kept for the lie from now on.
                unsafe {
                    rail.conn
                        .bounce_sge((BOUNCE_SLOTS, self.item_len), slot, &changed)
                }
                .map_err(|e| LinkError(e.to_string()))?;
                w.slot = Some(slot);
                slot
            }
        };
        w.left -= 1;
        w.next += REWRITE_EVERY;
        rail.waiting.push_back(Waiting::Lie {
            slot,
            offset: offset as u64,
            len: n,
        });
        self.pump(0).map_err(LinkError)
    }
}

/// The request of one rewrite: bounce slot `slot`'s `len` bytes WRITTEN at `offset` of the
/// receiver's buffer, as request `seq` of `rail` (signaled: its completion is taken as a
/// fragment's that used no slot).
pub(super) fn rewrite_wr<'r>(
    rail: &RailState<'r>,
    slot: usize,
    offset: u64,
    len: usize,
    seq: u64,
) -> Result<SendWr<'r>, String> {
    let Target::Write { addr, rkey } = rail.target else {
        return Err("a rewrite needs --op write".into());
    };
    // The slot is this lie's alone, written once before the first rewrite and never
    // again: every rewrite reads the same bytes.
    let sge = rail
        .conn
        .bounce_slot(slot, len)
        .map_err(|e| e.to_string())?;
    Ok(SendWr {
        wr_id: TAG_FRAGMENT | seq,
        sge,
        op: SendOp::Write {
            remote_addr: addr + offset,
            rkey,
        },
        signaled: true,
        inline: false,
        solicited: false,
    })
}
