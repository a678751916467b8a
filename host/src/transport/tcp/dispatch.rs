//! Which stream of which rail carries each chunk, and when a rail has failed: the TCP
//! wire's bookkeeping, with no sockets or threads in it (so it is tested alone).
//!
//! - **Assignment.** One rail (not striped): chunk `i` on stream `i % N`, as the receiver
//!   of an unstriped transfer expects. Striped: the next chunk goes to the live rail with
//!   the fewest chunks outstanding (handed to its writers, not yet written), round-robin
//!   over that rail's streams. A rail that writes faster drains sooner and so takes more:
//!   the shares follow each rail's rate without measuring it.
//! - **Failure.** A rail fails when a write on it fails, or, striped, when it has chunks
//!   outstanding and has written none for the rail timeout (`--rail-timeout`). Its
//!   outstanding chunks are handed back to be sent on the other rails; they stay *held*
//!   (not reported done to the schedule, whose source may then reuse their bytes) until
//!   every writer thread of the failed rail has exited, since one of them may still be
//!   reading those bytes when the rail is declared failed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Why and when a rail was given up.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub why: String,
    pub at: Instant,
}

/// What a rail carried in the current transfer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    pub bytes: u64,
    pub chunks: u64,
    /// Of those, chunks sent again (a failed rail's, or ones the receiver missed).
    pub resends: u64,
}

#[derive(Debug)]
struct Book {
    streams: Vec<usize>,
    next: usize,
    outstanding: BTreeSet<u64>,
    /// Outstanding when the rail failed: not done until its writers have exited.
    held: BTreeSet<u64>,
    writers_left: usize,
    last_progress: Instant,
    failed: Option<Failure>,
    carried: Carried,
}

/// The rails of one connection (position `r` here is bit `r` of the failed-rail mask).
#[derive(Debug)]
pub struct Dispatch {
    rails: Vec<Book>,
    stream_rail: Vec<usize>,
    /// `None`: not striped (fixed assignment, no progress deadline per rail).
    rail_timeout: Option<Duration>,
}

impl Dispatch {
    /// `streams[r]`: the stream numbers of rail `r`; `rail_timeout` only when striped.
    pub fn new(streams: Vec<Vec<usize>>, rail_timeout: Option<Duration>, now: Instant) -> Self {
        let count = streams.iter().map(Vec::len).sum();
        let mut stream_rail = vec![0; count];
        for (r, list) in streams.iter().enumerate() {
            for &s in list {
                stream_rail[s] = r;
            }
        }
        let rails = streams
            .into_iter()
            .map(|streams| Book {
                writers_left: streams.len(),
                streams,
                next: 0,
                outstanding: BTreeSet::new(),
                held: BTreeSet::new(),
                last_progress: now,
                failed: None,
                carried: Carried::default(),
            })
            .collect();
        Dispatch {
            rails,
            stream_rail,
            rail_timeout,
        }
    }

    pub fn striped(&self) -> bool {
        self.rail_timeout.is_some()
    }

    /// How long a striped rail may go without writing a chunk it has.
    pub fn rail_timeout(&self) -> Option<Duration> {
        self.rail_timeout
    }

    /// The rail of stream `s`.
    pub fn rail_of(&self, s: usize) -> usize {
        self.stream_rail.get(s).copied().unwrap_or(0)
    }

    /// The stream for chunk `index`, recorded as outstanding on its rail; `None` when no
    /// rail is left.
    pub fn assign(&mut self, index: u64, now: Instant) -> Option<usize> {
        let r = if self.striped() {
            (0..self.rails.len())
                .filter(|&r| self.rails[r].failed.is_none())
                .min_by_key(|&r| self.rails[r].outstanding.len())?
        } else {
            (self.rails.first()?.failed.is_none()).then_some(0)?
        };
        let book = &mut self.rails[r];
        let stream = if self.rail_timeout.is_some() {
            let s = book.streams[book.next % book.streams.len()];
            book.next = (book.next + 1) % book.streams.len();
            s
        } else {
            book.streams[(index % book.streams.len() as u64) as usize]
        };
        if book.outstanding.is_empty() {
            book.last_progress = now;
        }
        book.outstanding.insert(index);
        Some(stream)
    }

    /// Stream `s` wrote chunk `index` (`bytes` long; `resend`: a second sending): whether
    /// that counts (its rail is alive and the chunk was outstanding there).
    pub fn written(
        &mut self,
        s: usize,
        index: u64,
        bytes: u64,
        resend: bool,
        now: Instant,
    ) -> bool {
        let book = &mut self.rails[self.stream_rail[s]];
        if book.failed.is_some() || !book.outstanding.remove(&index) {
            return false;
        }
        book.last_progress = now;
        book.carried.bytes += bytes;
        book.carried.chunks += 1;
        book.carried.resends += resend as u64;
        true
    }

    /// Rail `r` fails now, for `why`: its outstanding chunks, to send elsewhere (none if
    /// it had failed already).
    pub fn fail(&mut self, r: usize, why: String, now: Instant) -> Vec<u64> {
        let book = &mut self.rails[r];
        if book.failed.is_some() {
            return Vec::new();
        }
        book.failed = Some(Failure { why, at: now });
        let lost = std::mem::take(&mut book.outstanding);
        book.held.extend(lost.iter().copied());
        lost.into_iter().collect()
    }

    /// Striped: the live rails with chunks outstanding and none written for the rail
    /// timeout at `now`, each with how long it has been quiet; but only while another
    /// live rail is well (nothing outstanding, or a chunk written within the timeout).
    /// When every rail is quiet the receiver (or this host) has stalled, not a rail:
    /// failing them all would end a transfer that `--timeout` lets wait.
    pub fn overdue(&self, now: Instant) -> Vec<(usize, Duration)> {
        let Some(limit) = self.rail_timeout else {
            return Vec::new();
        };
        let quiet = |b: &Book| now.saturating_duration_since(b.last_progress);
        let stalled = |b: &Book| !b.outstanding.is_empty() && quiet(b) >= limit;
        let live = || self.rails.iter().filter(|b| b.failed.is_none());
        if !live().any(|b| !stalled(b)) {
            return Vec::new();
        }
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| b.failed.is_none() && stalled(b))
            .map(|(r, b)| (r, quiet(b)))
            .collect()
    }

    /// Stream `s`'s writer thread has exited.
    pub fn writer_exited(&mut self, s: usize) {
        let book = &mut self.rails[self.stream_rail[s]];
        book.writers_left = book.writers_left.saturating_sub(1);
        if book.writers_left == 0 {
            book.held.clear();
        }
    }

    /// Whether chunk `index` may still be read by a failed rail's writer.
    pub fn held(&self, index: u64) -> bool {
        self.rails.iter().any(|b| b.held.contains(&index))
    }

    pub fn any_live(&self) -> bool {
        self.rails.iter().any(|b| b.failed.is_none())
    }

    /// Bit `r` set for each rail that failed.
    pub fn failed_mask(&self) -> u32 {
        self.rails
            .iter()
            .enumerate()
            .filter(|(_, b)| b.failed.is_some())
            .fold(0, |m, (r, _)| m | 1 << r)
    }

    /// The streams of rail `r`.
    pub fn streams_of(&self, r: usize) -> &[usize] {
        &self.rails[r].streams
    }

    /// The streams of the rails still alive.
    pub fn live_streams(&self) -> Vec<usize> {
        self.rails
            .iter()
            .filter(|b| b.failed.is_none())
            .flat_map(|b| b.streams.iter().copied())
            .collect()
    }

    pub fn failure(&self, r: usize) -> Option<&Failure> {
        self.rails[r].failed.as_ref()
    }

    pub fn carried(&self, r: usize) -> Carried {
        self.rails[r].carried
    }

    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    /// The next transfer on this connection counts from zero (failed rails stay failed).
    pub fn next_transfer(&mut self) {
        for b in &mut self.rails {
            b.carried = Carried::default();
            b.outstanding.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rail_keeps_the_fixed_assignment() {
        let t = Instant::now();
        let mut d = Dispatch::new(vec![vec![0, 1, 2]], None, t);
        let on: Vec<usize> = (0..6).map(|i| d.assign(i, t).unwrap()).collect();
        assert_eq!(on, [0, 1, 2, 0, 1, 2]);
        assert_eq!(
            d.assign(7, t),
            Some(1),
            "a resend goes where its index says"
        );
        assert!(d.overdue(t + Duration::from_secs(100)).is_empty());
    }

    #[test]
    fn striped_chunks_go_to_the_rail_with_fewest_outstanding() {
        let t = Instant::now();
        let mut d = Dispatch::new(
            vec![vec![0, 1], vec![2, 3]],
            Some(Duration::from_millis(500)),
            t,
        );
        let on: Vec<usize> = (0..4).map(|i| d.assign(i, t).unwrap()).collect();
        assert_eq!(on, [0, 2, 1, 3]);
        // Rail 1 writes both of its chunks: the next two go there.
        assert!(d.written(2, 1, 10, false, t));
        assert!(d.written(3, 3, 10, false, t));
        assert!(!d.written(3, 3, 10, false, t), "counted once");
        for i in [4, 5] {
            let s = d.assign(i, t).unwrap();
            assert_eq!(d.rail_of(s), 1);
        }
        assert_eq!(
            d.carried(1),
            Carried {
                bytes: 20,
                chunks: 2,
                resends: 0
            }
        );
    }

    #[test]
    fn a_quiet_rail_fails_and_its_chunks_are_held_until_its_writers_exit() {
        let t = Instant::now();
        let timeout = Duration::from_millis(500);
        let mut d = Dispatch::new(vec![vec![0], vec![1]], Some(timeout), t);
        for i in 0..4 {
            d.assign(i, t);
        }
        let late = t + timeout + Duration::from_millis(1);
        assert!(
            d.overdue(late).is_empty(),
            "both quiet: a stall, not a rail"
        );
        assert!(d.written(0, 0, 1, false, t + timeout));
        assert_eq!(d.overdue(late), vec![(1, late - t)]);
        let lost = d.fail(1, "no chunk written within 500 ms".into(), late);
        assert_eq!(lost, [1, 3]);
        assert!(d.fail(1, "again".into(), late).is_empty());
        assert_eq!(d.failed_mask(), 0b10);
        assert_eq!(d.live_streams(), [0]);
        assert!(d.held(3));
        assert!(
            !d.written(1, 3, 1, false, late),
            "a failed rail's write does not count"
        );
        // Sent again on rail 0: written there, but held until rail 1's writer exits.
        assert_eq!(d.assign(3, late), Some(0));
        assert!(d.written(0, 3, 1, true, late));
        assert!(d.held(3));
        d.writer_exited(1);
        assert!(!d.held(3));
        assert_eq!(d.carried(0).resends, 1);
        d.fail(0, "write failed".into(), late);
        assert!(!d.any_live());
        assert_eq!(d.assign(9, late), None);
    }
}
