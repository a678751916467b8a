//! The bookkeeping of a striped verbs transfer, with no verbs in it (so it is tested
//! alone): which rail carries each chunk and which failed ([`RailBook`], the sender's),
//! which chunks landed on which rail ([`Landed`], the receiver's), and where a further
//! rail's join goes ([`Joins`], the receiver's listener).
//!
//! - **Assignment.** A chunk goes to the live rail with the fewest chunks in flight
//!   (posted, not completed): a rail that completes sooner takes more, so the shares
//!   follow each rail's rate without measuring it (TCP's `dispatch.rs` does the same).
//! - **Failure.** A rail fails on a failed completion, a port-down event of its device,
//!   or no completion for the rail timeout while it has chunks in flight and another
//!   rail completed one since. Its chunks in flight are handed back to be posted on the
//!   other rails: the same bytes into the same place, so a late copy from the failed rail
//!   is harmless (the source must keep its bytes for the whole pass: striping takes only
//!   sources without a staging ring).
//! - **Stall beyond detection**: from the failure's detection until the last of the
//!   chunks it moved completed on another rail.
//! - **Credit.** A chunk counts for the rail whose completion made it done, not for every
//!   rail it was posted on: the per-rail chunks and bytes add up to the transfer, and a
//!   failed rail is not credited with the chunks it handed back.

use crate::wire::{Join, RejectReason};
use std::collections::{BTreeMap, HashMap};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Why and when a rail was given up.
#[derive(Debug, Clone, PartialEq)]
pub struct RailFailure {
    pub why: String,
    pub at: Instant,
}

/// One rail as the sender sees it in one transfer.
#[derive(Debug)]
struct Book {
    /// Chunks posted here and not completed, by index.
    in_flight: BTreeMap<u64, Flight>,
    last_progress: Instant,
    failed: Option<RailFailure>,
    /// Chunks this rail completed first, and their bytes.
    bytes: u64,
    chunks: u64,
    /// Of `chunks`, ones another rail had been given before (moved here).
    resends: u64,
    moved: u64,
    /// The failure's moved chunks (with their lengths) not yet completed anywhere, and the
    /// stall once they all did.
    moved_left: BTreeMap<u64, Flight>,
    stall: Option<Duration>,
}

/// One chunk posted on a rail.
#[derive(Debug, Clone, Copy)]
struct Flight {
    bytes: u64,
    /// Posted on another rail before.
    again: bool,
}

/// The sender's rails of one transfer.
#[derive(Debug)]
pub struct RailBook {
    rails: Vec<Book>,
    done: Vec<bool>,
    /// Chunks `0..through` are all done.
    through: u64,
}

/// What one rail carried, for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Carried {
    /// Chunks (and their bytes) this rail's completion made done: over all rails they add
    /// up to the transfer.
    pub bytes: u64,
    pub chunks: u64,
    /// Of `chunks`, ones another rail failed with before.
    pub resends: u64,
    pub moved: u64,
    pub failed: Option<RailFailure>,
    pub stall: Option<Duration>,
}

impl RailBook {
    pub fn new(rails: usize, chunks: u64, now: Instant) -> RailBook {
        let book = || Book {
            in_flight: BTreeMap::new(),
            last_progress: now,
            failed: None,
            bytes: 0,
            chunks: 0,
            resends: 0,
            moved: 0,
            moved_left: BTreeMap::new(),
            stall: None,
        };
        RailBook {
            rails: (0..rails).map(|_| book()).collect(),
            done: vec![false; chunks as usize],
            through: 0,
        }
    }

    /// The live rail with the fewest chunks in flight (the lowest of equals).
    pub fn pick(&self) -> Option<usize> {
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| b.failed.is_none())
            .min_by_key(|(r, b)| (b.in_flight.len(), *r))
            .map(|(r, _)| r)
    }

    /// Chunk `index` (`bytes` long) was posted on `rail` at `now`; `again`: it had been
    /// posted on another rail before.
    pub fn posted(&mut self, rail: usize, index: u64, bytes: u64, again: bool, now: Instant) {
        let b = &mut self.rails[rail];
        if b.in_flight.is_empty() {
            // A rail that was idle has not been stalling.
            b.last_progress = now.max(b.last_progress);
        }
        b.in_flight.insert(index, Flight { bytes, again });
    }

    /// Chunk `index` completed on `rail` at `now`; true if it was not done before (then
    /// `rail` is credited with it).
    pub fn completed(&mut self, rail: usize, index: u64, now: Instant) -> bool {
        let b = &mut self.rails[rail];
        // A failed rail's late completion: the chunk is among those it handed back.
        let flight = b
            .in_flight
            .remove(&index)
            .or_else(|| b.moved_left.get(&index).copied());
        b.last_progress = now;
        let Some(slot) = self.done.get_mut(index as usize) else {
            return false;
        };
        if std::mem::replace(slot, true) {
            return false;
        }
        let b = &mut self.rails[rail];
        b.chunks += 1;
        // A completion of a chunk never posted here would be the caller's bug: the chunk
        // is done all the same, with no bytes to credit.
        if let Some(f) = flight {
            b.bytes += f.bytes;
            b.resends += f.again as u64;
        }
        while self.done.get(self.through as usize) == Some(&true) {
            self.through += 1;
        }
        for b in &mut self.rails {
            if b.moved_left.remove(&index).is_some() && b.moved_left.is_empty() {
                if let Some(f) = &b.failed {
                    b.stall = Some(now.saturating_duration_since(f.at));
                }
            }
        }
        true
    }

    /// `rail` failed at `now` for `why`: its chunks in flight that are not done, to be
    /// posted on the other rails. A rail fails once; later calls return nothing.
    pub fn fail(&mut self, rail: usize, why: String, now: Instant) -> Vec<u64> {
        let b = &mut self.rails[rail];
        if b.failed.is_some() {
            return Vec::new();
        }
        b.failed = Some(RailFailure { why, at: now });
        b.moved_left = std::mem::take(&mut b.in_flight)
            .into_iter()
            .filter(|&(i, _)| !self.done.get(i as usize).copied().unwrap_or(true))
            .collect();
        b.moved = b.moved_left.len() as u64;
        if b.moved_left.is_empty() {
            b.stall = Some(Duration::ZERO);
        }
        b.moved_left.keys().copied().collect()
    }

    /// A live rail that has had chunks in flight and no completion for `timeout` while
    /// another live rail completed one since: stalled.
    pub fn overdue(&self, now: Instant, timeout: Duration) -> Option<usize> {
        let live = || self.rails.iter().filter(|b| b.failed.is_none());
        let latest = live().map(|b| b.last_progress).max()?;
        self.rails.iter().position(|b| {
            b.failed.is_none()
                && !b.in_flight.is_empty()
                && now.saturating_duration_since(b.last_progress) >= timeout
                && latest > b.last_progress
        })
    }

    /// The highest chunk index through which every chunk is done.
    pub fn done_through(&self) -> Option<u64> {
        self.through.checked_sub(1)
    }

    pub fn is_failed(&self, rail: usize) -> bool {
        self.rails[rail].failed.is_some()
    }

    pub fn in_flight(&self, rail: usize) -> usize {
        self.rails[rail].in_flight.len()
    }

    pub fn carried(&self, rail: usize) -> Carried {
        let b = &self.rails[rail];
        Carried {
            bytes: b.bytes,
            chunks: b.chunks,
            resends: b.resends,
            moved: b.moved,
            failed: b.failed.clone(),
            stall: b.stall,
        }
    }
}

/// The receiver's record of a striped transfer: which chunks landed, and on which rail.
#[derive(Debug)]
pub struct Landed {
    landed: Vec<bool>,
    count: u64,
    /// Per rail: chunks that landed first there, and copies of chunks landed before.
    pub chunks: Vec<u64>,
    pub copies: Vec<u64>,
}

impl Landed {
    pub fn new(chunks: u64, rails: usize) -> Landed {
        Landed {
            landed: vec![false; chunks as usize],
            count: 0,
            chunks: vec![0; rails],
            copies: vec![0; rails],
        }
    }

    /// A WRITE_WITH_IMM with immediate `imm` (chunk index + 1) completed on `rail`: true
    /// if that chunk had not landed before.
    pub fn land(&mut self, imm: u32, rail: usize) -> Result<bool, String> {
        let n = self.landed.len();
        let Some(slot) = (imm as usize)
            .checked_sub(1)
            .and_then(|i| self.landed.get_mut(i))
        else {
            return Err(format!(
                "immediate {imm} on rail {rail} names no chunk of {n}"
            ));
        };
        if std::mem::replace(slot, true) {
            self.copies[rail] += 1;
            return Ok(false);
        }
        self.count += 1;
        self.chunks[rail] += 1;
        Ok(true)
    }

    pub fn all(&self) -> bool {
        self.count == self.landed.len() as u64
    }

    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Where the listener sends the further rails of striped transfers: each transfer's
/// thread opens a slot under a fresh token and takes its joins from the receiver end.
pub struct Joins<T> {
    slots: Mutex<HashMap<u64, Slot<T>>>,
}

struct Slot<T> {
    rails: u8,
    /// Rails that joined (bit r), rail 0 being the transfer itself.
    joined: u16,
    tx: mpsc::Sender<T>,
}

impl<T> Default for Joins<T> {
    fn default() -> Self {
        Joins {
            slots: Mutex::new(HashMap::new()),
        }
    }
}

/// A transfer's slot: closed when dropped (later joins naming it are refused).
pub struct JoinSlot<T> {
    joins: Arc<Joins<T>>,
    pub token: u64,
    pub rx: mpsc::Receiver<T>,
}

impl<T> Drop for JoinSlot<T> {
    fn drop(&mut self) {
        self.joins.lock().remove(&self.token);
    }
}

impl<T> Joins<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot<T>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a transfer of `rails` rails, under a random token (never 0).
    pub fn open(self: &Arc<Self>, rails: u8) -> std::io::Result<JoinSlot<T>> {
        let (tx, rx) = mpsc::channel();
        let mut slots = self.lock();
        let token = loop {
            let nonce = crate::server::key::fresh_nonce()?;
            let mut word = [0u8; 8];
            word.copy_from_slice(&nonce[..8]);
            let token = u64::from_le_bytes(word);
            if token != 0 && !slots.contains_key(&token) {
                break token;
            }
        };
        slots.insert(
            token,
            Slot {
                rails,
                joined: 1,
                tx,
            },
        );
        Ok(JoinSlot {
            joins: self.clone(),
            token,
            rx,
        })
    }

    /// Hand `value` (the join's connect request) to the transfer `join` names, or say why
    /// not (the request back, to be rejected with the reason).
    pub fn route(&self, join: &Join, value: T) -> Result<(), (RejectReason, T)> {
        let mut slots = self.lock();
        let Some(slot) = slots.get_mut(&join.token) else {
            return Err((RejectReason::UnknownJoin, value));
        };
        let bit = 1u16 << join.rail.min(15);
        if join.rails != slot.rails || join.rail >= slot.rails || slot.joined & bit != 0 {
            let reason = RejectReason::BadJoin {
                rail: join.rail as u64,
                rails: slot.rails as u64,
            };
            return Err((reason, value));
        }
        match slot.tx.send(value) {
            Ok(()) => {
                slot.joined |= bit;
                Ok(())
            }
            // The transfer's thread is gone.
            Err(mpsc::SendError(value)) => Err((RejectReason::UnknownJoin, value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64, t0: Instant) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn chunks_go_to_the_rail_with_the_fewest_in_flight() {
        let t0 = Instant::now();
        let mut book = RailBook::new(2, 8, t0);
        assert_eq!(book.pick(), Some(0));
        book.posted(0, 0, 10, false, t0);
        assert_eq!(book.pick(), Some(1));
        book.posted(1, 1, 10, false, t0);
        book.posted(0, 2, 10, false, t0);
        // Rail 1 completes faster: it takes the next ones.
        assert!(book.completed(1, 1, at(1, t0)));
        assert_eq!(book.pick(), Some(1));
        assert_eq!(book.done_through(), None, "chunk 0 is not done yet");
        assert!(book.completed(0, 0, at(2, t0)));
        assert_eq!(book.done_through(), Some(1));
        assert!(!book.completed(0, 0, at(3, t0)), "a copy is not news");
        assert_eq!(book.carried(0).chunks, 1, "chunk 2 is still in flight");
        assert_eq!(book.carried(1).bytes, 10);
    }

    #[test]
    fn a_failed_rails_chunks_are_handed_back_and_its_stall_measured() {
        let t0 = Instant::now();
        let mut book = RailBook::new(2, 6, t0);
        for i in 0..6 {
            let r = book.pick().unwrap();
            book.posted(r, i, 1, false, t0);
        }
        assert!(book.completed(1, 1, at(1, t0)));
        // Rail 1 had 1, 3, 5; 1 is done.
        let moved = book.fail(1, "port down".into(), at(10, t0));
        assert_eq!(moved, vec![3, 5]);
        assert_eq!(book.pick(), Some(0), "a failed rail takes nothing");
        assert!(book.fail(1, "again".into(), at(11, t0)).is_empty());
        for &i in &moved {
            book.posted(0, i, 1, true, t0);
        }
        book.completed(0, 3, at(20, t0));
        assert_eq!(book.carried(1).stall, None, "chunk 5 is still out");
        // A late completion on the failed rail counts as done too.
        book.completed(1, 5, at(25, t0));
        assert_eq!(book.carried(1).stall, Some(Duration::from_millis(15)));
        let c = book.carried(1);
        assert_eq!((c.moved, c.failed.unwrap().why.as_str()), (2, "port down"));
        for i in [0, 2, 4] {
            book.completed(0, i, at(30, t0));
        }
        assert!(
            !book.completed(0, 5, at(31, t0)),
            "the moved copy lands second"
        );
        assert_eq!(book.done_through(), Some(5));
        // Credit goes to the completion that made a chunk done: rail 1 finished 1 and 5,
        // rail 0 the rest, and the moved chunk 3; the counts add up to the transfer.
        let (c0, c1) = (book.carried(0), book.carried(1));
        assert_eq!((c0.chunks, c1.chunks), (4, 2));
        assert_eq!(c0.bytes + c1.bytes, 6);
        assert_eq!(
            c0.resends, 1,
            "of the two moved here, only chunk 3 landed first here"
        );
        let mut lone = RailBook::new(1, 1, t0);
        lone.fail(0, "x".into(), t0);
        assert_eq!(lone.pick(), None, "no rail left");
    }

    #[test]
    fn a_rail_is_overdue_only_while_another_progresses() {
        let t0 = Instant::now();
        let mut book = RailBook::new(2, 4, t0);
        book.posted(0, 0, 1, false, t0);
        book.posted(1, 1, 1, false, t0);
        let timeout = Duration::from_millis(100);
        assert_eq!(book.overdue(at(500, t0), timeout), None, "both silent");
        book.completed(0, 0, at(400, t0));
        book.posted(0, 2, 1, false, t0);
        assert_eq!(book.overdue(at(500, t0), timeout), Some(1));
        assert_eq!(book.overdue(at(50, t0), timeout), None, "too early");
    }

    #[test]
    fn landed_chunks_are_counted_once_and_lying_immediates_refused() {
        let mut l = Landed::new(3, 2);
        assert!(l.land(1, 0).unwrap());
        assert!(l.land(3, 1).unwrap());
        assert!(!l.land(3, 0).unwrap(), "a copy");
        assert!(!l.all());
        assert!(l.land(0, 0).is_err());
        assert!(l.land(4, 1).is_err());
        assert!(l.land(u32::MAX, 1).is_err());
        assert!(l.land(2, 1).unwrap());
        assert!(l.all());
        assert_eq!(
            (l.chunks.clone(), l.copies.clone()),
            (vec![1, 2], vec![1, 0])
        );
    }

    #[test]
    fn joins_reach_their_transfer_and_lying_joins_are_refused_by_name() {
        let joins = Arc::new(Joins::<u32>::default());
        let slot = joins.open(3).unwrap();
        let join = |token, rail, rails| Join { token, rail, rails };
        joins.route(&join(slot.token, 1, 3), 11).unwrap();
        assert_eq!(slot.rx.try_recv(), Ok(11));
        let (why, back) = joins.route(&join(slot.token, 1, 3), 12).unwrap_err();
        assert_eq!(back, 12);
        assert!(
            matches!(why, RejectReason::BadJoin { rail: 1, rails: 3 }),
            "twice"
        );
        let (why, _) = joins.route(&join(slot.token, 2, 4), 13).unwrap_err();
        assert!(matches!(why, RejectReason::BadJoin { .. }), "another count");
        let (why, _) = joins.route(&join(slot.token ^ 1, 2, 3), 14).unwrap_err();
        assert_eq!(why, RejectReason::UnknownJoin);
        let token = slot.token;
        drop(slot);
        let (why, _) = joins.route(&join(token, 2, 3), 15).unwrap_err();
        assert_eq!(why, RejectReason::UnknownJoin, "the transfer ended");
    }
}
