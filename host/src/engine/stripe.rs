//! Which rail carries each item, and what happens when one fails: the sender's book of
//! one connection's rails, with no I/O in it (so it is tested alone), the same over any
//! link.
//!
//! - **Assignment.** An item goes to the live rail with the fewest items in flight
//!   (posted, not yet reported sent; the lowest of equals): a rail that drains sooner
//!   takes more, so the shares follow each rail's rate without measuring it.
//! - **Credit.** An item counts for the rail whose report made it done, once: the
//!   rails' chunks and bytes add up to the transfer, and a failed rail is not credited
//!   with what it handed back.
//! - **Failure.** A rail fails when its link says it is down, or (striped) when it has
//!   items in flight and has reported none for the rail timeout while another live rail
//!   is well. Its items in flight move to the other rails; they stay *held* (not done,
//!   their bytes not given back) until the failed rail is quiet, since it may still be
//!   reading them.
//! - **Stall beyond detection**: from a failure's detection until the last item it moved
//!   was done on another rail.

use crate::net::{Pass, Rail};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// An item of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub pass: u64,
    pub index: u64,
}

impl Key {
    pub fn new(pass: Pass, index: u64) -> Key {
        Key {
            pass: pass.0,
            index,
        }
    }
}

/// Why and when a rail was given up.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub why: String,
    pub at: Instant,
}

/// What one rail carried in the current transfer, for the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Carried {
    /// Items (and their bytes) this rail's reports made done: over all rails they add up
    /// to what was sent.
    pub bytes: u64,
    pub items: u64,
    /// Of `items`, ones sent a second time (moved from a failed rail, or asked again).
    pub resends: u64,
    /// Items this rail had in flight when it failed, moved to the others.
    pub moved: u64,
    pub failed: Option<Failure>,
    /// From the failure until the last item it moved was done elsewhere.
    pub stall: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
struct Flight {
    bytes: u64,
    again: bool,
}

#[derive(Debug)]
struct Book {
    in_flight: BTreeMap<Key, Flight>,
    last_progress: Instant,
    failed: Option<Failure>,
    /// Failed earlier on this connection (a transfer before this one).
    failed_before: bool,
    /// In flight when it failed: held until the rail is quiet.
    held: BTreeSet<Key>,
    quiet: bool,
    /// The items it moved, not yet done elsewhere.
    moved_left: BTreeSet<Key>,
    carried: Carried,
}

impl Book {
    fn new(now: Instant) -> Book {
        Book {
            in_flight: BTreeMap::new(),
            last_progress: now,
            failed: None,
            failed_before: false,
            held: BTreeSet::new(),
            quiet: true,
            moved_left: BTreeSet::new(),
            carried: Carried::default(),
        }
    }

    fn live(&self) -> bool {
        self.failed.is_none() && !self.failed_before
    }
}

/// The sender's rails of one connection.
#[derive(Debug)]
pub struct Stripes {
    rails: Vec<Book>,
    /// `Some` when striped over several rails: how long a rail may go without a report
    /// while it has items in flight (`--rail-timeout`).
    rail_timeout: Option<Duration>,
    /// Items done (reported by some rail), so a second report credits nobody.
    done: BTreeSet<Key>,
}

impl Stripes {
    /// `rails` rails; `rail_timeout` only when striped.
    pub fn new(rails: usize, rail_timeout: Option<Duration>, now: Instant) -> Stripes {
        Stripes {
            rails: (0..rails).map(|_| Book::new(now)).collect(),
            rail_timeout,
            done: BTreeSet::new(),
        }
    }

    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    pub fn striped(&self) -> bool {
        self.rail_timeout.is_some()
    }

    pub fn rail_timeout(&self) -> Option<Duration> {
        self.rail_timeout
    }

    /// The next transfer on this connection: counts start again; rails that failed stay
    /// out.
    pub fn next_transfer(&mut self, now: Instant) {
        for b in &mut self.rails {
            b.failed_before |= b.failed.is_some();
            b.failed = None;
            b.carried = Carried::default();
            b.moved_left.clear();
            b.last_progress = now;
        }
        self.done.clear();
    }

    /// The live rail with the fewest items in flight (the lowest of equals); `None` when
    /// every rail failed.
    pub fn pick(&self) -> Option<Rail> {
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live())
            .min_by_key(|(r, b)| (b.in_flight.len(), *r))
            .map(|(r, _)| r)
    }

    pub fn is_live(&self, rail: Rail) -> bool {
        self.rails.get(rail).is_some_and(Book::live)
    }

    /// The live rails, lowest first.
    pub fn live(&self) -> impl Iterator<Item = Rail> + '_ {
        (0..self.rails.len()).filter(|&r| self.rails[r].live())
    }

    /// Bit `r` set for each rail that failed, in this transfer or before.
    pub fn failed_mask(&self) -> u32 {
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.live())
            .fold(0, |m, (r, _)| m | 1u32.checked_shl(r as u32).unwrap_or(0))
    }

    /// `key` (`bytes` long) was posted on `rail` at `now`; `again`: a second sending.
    pub fn posted(&mut self, rail: Rail, key: Key, bytes: u64, again: bool, now: Instant) {
        let b = &mut self.rails[rail];
        if b.in_flight.is_empty() {
            // A rail that was idle has not been stalling.
            b.last_progress = now.max(b.last_progress);
        }
        b.quiet = false;
        b.in_flight.insert(key, Flight { bytes, again });
    }

    /// `rail` reported `key` sent at `now`: whether that made it done (then the rail is
    /// credited with it). A report from a rail that failed counts too (the item is not
    /// moved twice), but only where it was in flight there.
    pub fn sent(&mut self, rail: Rail, key: Key, now: Instant) -> bool {
        let Some(b) = self.rails.get_mut(rail) else {
            return false;
        };
        let flight = b.in_flight.remove(&key);
        b.last_progress = now;
        let Some(flight) = flight else {
            return false;
        };
        if !self.done.insert(key) {
            return false;
        }
        let b = &mut self.rails[rail];
        b.carried.items += 1;
        b.carried.bytes += flight.bytes;
        b.carried.resends += flight.again as u64;
        for b in &mut self.rails {
            if b.moved_left.remove(&key) && b.moved_left.is_empty() {
                if let Some(f) = &b.failed {
                    b.carried.stall = Some(now.saturating_duration_since(f.at));
                }
            }
        }
        true
    }

    /// Whether `key` was reported done.
    pub fn is_done(&self, key: Key) -> bool {
        self.done.contains(&key)
    }

    /// `rail` fails at `now` for `why`: its items in flight and not done, to post on the
    /// other rails (held until the rail is [`quiet`](Stripes::quiet)). A rail fails once;
    /// later calls return nothing.
    pub fn fail(&mut self, rail: Rail, why: String, now: Instant) -> Vec<Key> {
        let Some(b) = self.rails.get_mut(rail) else {
            return Vec::new();
        };
        if !b.live() {
            return Vec::new();
        }
        b.failed = Some(Failure { why, at: now });
        let lost: Vec<Key> = std::mem::take(&mut b.in_flight)
            .into_keys()
            .filter(|k| !self.done.contains(k))
            .collect();
        let b = &mut self.rails[rail];
        if !b.quiet {
            b.held.extend(lost.iter().copied());
        }
        b.moved_left = lost.iter().copied().collect();
        b.carried.moved = lost.len() as u64;
        if lost.is_empty() {
            b.carried.stall = Some(Duration::ZERO);
        }
        lost
    }

    /// Nothing of `rail` reads posted bytes any more: its held items may be done.
    pub fn quiet(&mut self, rail: Rail) {
        if let Some(b) = self.rails.get_mut(rail) {
            b.quiet = true;
            b.held.clear();
        }
    }

    /// Whether a failed rail may still read `key`'s bytes.
    pub fn held(&self, key: Key) -> bool {
        self.rails.iter().any(|b| b.held.contains(&key))
    }

    /// Striped: the live rails with items in flight and no report for the rail timeout
    /// at `now`, each with how long it has been quiet; but only while another live rail
    /// is well (nothing in flight, or a report within the timeout). When every rail is
    /// quiet the receiver (or this host) has stalled, not a rail: failing them all would
    /// end a transfer that `--timeout` lets wait.
    pub fn overdue(&self, now: Instant) -> Vec<(Rail, Duration)> {
        let Some(limit) = self.rail_timeout else {
            return Vec::new();
        };
        let quiet_for = |b: &Book| now.saturating_duration_since(b.last_progress);
        let stalled = |b: &Book| !b.in_flight.is_empty() && quiet_for(b) >= limit;
        if !self.rails.iter().any(|b| b.live() && !stalled(b)) {
            return Vec::new();
        }
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live() && stalled(b))
            .map(|(r, b)| (r, quiet_for(b)))
            .collect()
    }

    /// What `rail` carried in this transfer.
    pub fn carried(&self, rail: Rail) -> Carried {
        self.rails
            .get(rail)
            .map(|b| b.carried.clone())
            .unwrap_or_default()
    }

    /// Whether `rail` failed in an earlier transfer of this connection.
    pub fn failed_before(&self, rail: Rail) -> bool {
        self.rails.get(rail).is_some_and(|b| b.failed_before)
    }

    /// Items in flight on `rail`.
    pub fn in_flight(&self, rail: Rail) -> usize {
        self.rails.get(rail).map_or(0, |b| b.in_flight.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Key {
        Key { pass: 1, index: i }
    }

    #[test]
    fn items_go_to_the_rail_with_fewest_in_flight_and_credit_adds_up() {
        let t0 = Instant::now();
        let mut s = Stripes::new(2, Some(Duration::from_secs(1)), t0);
        // Rail 1 drains fast, rail 0 not at all: rail 1 takes the rest.
        for i in 0..10 {
            let r = s.pick().unwrap();
            s.posted(r, key(i), 100, false, t0);
            if r == 1 {
                assert!(s.sent(1, key(i), t0));
            }
        }
        assert_eq!(s.in_flight(0), 1, "rail 0 took one and kept it");
        assert_eq!(s.carried(1).items, 9);
        assert!(s.sent(0, key(0), t0));
        assert!(!s.sent(0, key(0), t0), "a second report credits nobody");
        let total: u64 = (0..2).map(|r| s.carried(r).bytes).sum();
        assert_eq!(total, 1000);
    }

    #[test]
    fn a_failed_rail_hands_its_items_back_held_until_quiet_and_the_stall_is_measured() {
        let t0 = Instant::now();
        let mut s = Stripes::new(2, Some(Duration::from_secs(1)), t0);
        s.posted(0, key(0), 10, false, t0);
        s.posted(0, key(1), 10, false, t0);
        s.posted(1, key(2), 10, false, t0);
        assert!(s.sent(0, key(0), t0));
        let moved = s.fail(0, "down".into(), t0);
        assert_eq!(moved, vec![key(1)]);
        assert!(
            s.fail(0, "again".into(), t0).is_empty(),
            "a rail fails once"
        );
        assert!(s.held(key(1)), "rail 0 may still read it");
        assert_eq!(s.pick(), Some(1));
        s.posted(1, key(1), 10, true, t0);
        let t1 = t0 + Duration::from_millis(30);
        assert!(s.sent(1, key(1), t1));
        assert!(s.held(key(1)), "done, but rail 0 is not quiet yet");
        s.quiet(0);
        assert!(!s.held(key(1)));
        let c0 = s.carried(0);
        assert_eq!((c0.items, c0.moved), (1, 1));
        assert_eq!(c0.stall, Some(Duration::from_millis(30)));
        assert_eq!(s.carried(1).resends, 1);
        assert_eq!(s.failed_mask(), 0b01);
        // The next transfer: rail 0 stays out.
        s.next_transfer(t1);
        assert!(!s.is_live(0) && s.failed_before(0));
        assert_eq!(s.pick(), Some(1));
        assert_eq!(s.failed_mask(), 0b01);
    }

    #[test]
    fn a_quiet_rail_is_overdue_only_while_another_is_well() {
        let t0 = Instant::now();
        let limit = Duration::from_millis(100);
        let mut s = Stripes::new(2, Some(limit), t0);
        s.posted(0, key(0), 1, false, t0);
        s.posted(1, key(1), 1, false, t0);
        let later = t0 + Duration::from_millis(150);
        assert!(s.overdue(later).is_empty(), "both quiet: the peer stalled");
        assert!(s.sent(1, key(1), later));
        assert_eq!(s.overdue(later), vec![(0, Duration::from_millis(150))]);
        // Unstriped: never overdue.
        let mut one = Stripes::new(1, None, t0);
        one.posted(0, key(0), 1, false, t0);
        assert!(one.overdue(t0 + Duration::from_secs(100)).is_empty());
    }

    #[test]
    fn every_rail_failed_leaves_none_to_pick() {
        let t0 = Instant::now();
        let mut s = Stripes::new(2, Some(Duration::from_secs(1)), t0);
        s.fail(0, "a".into(), t0);
        s.fail(1, "b".into(), t0);
        assert_eq!(s.pick(), None);
        assert_eq!(s.failed_mask(), 0b11);
        assert_eq!(s.carried(0).stall, Some(Duration::ZERO));
    }
}
