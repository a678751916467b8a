//! The bookkeeping of checks by checksum, the same over both transports: which chunks
//! failed, the receiver's rounds of resends within the sender's bound ([`Repair`], over
//! verbs; [`Converge`], over TCP: in pieces, bounded by what they send again), and
//! the sender's view of the receiver's requests and its final ack ([`Requests`]), which
//! believes only what fits what came before. Pure state machines, tested here; the
//! engine carries the messages over either link (`engine::send`, `engine::recv`).

use crate::wire::pieces::{self, PieceResend};
use crate::wire::{Ack, AckStatus, Resend};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The chunks (indices) whose checksum where they landed differs from the sender's.
pub fn failed(expected: &[u32], landed: &[u32]) -> Vec<u32> {
    expected
        .iter()
        .zip(landed)
        .enumerate()
        .filter(|(_, (e, l))| e != l)
        .map(|(i, _)| i as u32)
        .collect()
}

/// What the receiver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Every chunk passed: ack.
    Done,
    /// Ask for these chunks again, in round `round` (from 1).
    Resend { round: u32, chunks: Vec<u32> },
    /// The resends are used up: name these in `Resend{last}` and ack `ChecksumFailed`.
    GiveUp { round: u32, chunks: Vec<u32> },
}

/// The receiver's rounds of one transfer.
#[derive(Debug)]
pub struct Repair {
    max_resends: u8,
    rounds: u32,
    failing: Vec<u32>,
    /// Chunks that failed and then passed, with the times each was sent in all.
    repaired: Vec<(u32, u32)>,
    /// Chunks asked for again, all rounds together.
    resent: u64,
}

impl Repair {
    /// After the first check: `failing` chunks, at most `max_resends` rounds.
    pub fn new(max_resends: u8, failing: Vec<u32>) -> Repair {
        Repair {
            max_resends,
            rounds: 0,
            failing,
            repaired: Vec::new(),
            resent: 0,
        }
    }

    pub fn next(&self) -> Next {
        if self.failing.is_empty() {
            Next::Done
        } else if self.rounds < self.max_resends as u32 {
            Next::Resend {
                round: self.rounds + 1,
                chunks: self.failing.clone(),
            }
        } else {
            Next::GiveUp {
                round: self.rounds + 1,
                chunks: self.failing.clone(),
            }
        }
    }

    /// The chunks asked for in the last round, each checked again: `passed[i]` for
    /// the `i`-th of them.
    pub fn checked(&mut self, passed: &[bool]) {
        debug_assert_eq!(passed.len(), self.failing.len());
        self.resent += self.failing.len() as u64;
        // Sent once at first, then once in each round up to this one.
        let attempts = self.rounds + 2;
        let mut i = 0;
        let repaired = &mut self.repaired;
        self.failing.retain(|&chunk| {
            let ok = passed.get(i).copied().unwrap_or(false);
            i += 1;
            if ok {
                repaired.push((chunk, attempts));
            }
            !ok
        });
        self.rounds += 1;
    }

    /// Chunks that failed and then passed: (chunk, times sent).
    pub fn repaired(&self) -> &[(u32, u32)] {
        &self.repaired
    }

    /// Chunks asked for again, all rounds together.
    pub fn resent(&self) -> u64 {
        self.resent
    }
}

/// What one round asks for again: whole chunks, or pieces of `1 << shift` bytes
/// ([`pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Chunks,
    Pieces(u8),
}

/// Why the receiver's rounds ended with chunks still failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The sender's `--max-resends` rounds were used up.
    Rounds,
    /// The next round would send more again than the transfer's [`pieces::budget`].
    Budget,
    /// No round repaired anything within `--timeout`.
    NoProgress,
}

impl Stopped {
    /// Why, in words, for the receiver's log.
    pub fn words(self) -> &'static str {
        match self {
            Stopped::Rounds => "the sender's --max-resends rounds were used up",
            Stopped::Budget => "the next round would send more again than the transfer's size",
            Stopped::NoProgress => "no round repaired anything within --timeout",
        }
    }
}

/// What the receiver does next ([`Converge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Every chunk passed: ack.
    Done,
    /// Ask for `items` (of `unit`, increasing) again, in round `round` (from 1).
    /// `fresh`: they are new pieces of what failed, none sent on its own yet, so some
    /// may be good where they landed: the sender's CRC32C of each tells (a query), and
    /// only those that differ need sending.
    Ask {
        round: u32,
        unit: Unit,
        items: Vec<u32>,
        fresh: bool,
    },
    /// Give up: name these chunks in `Resend{last}` and ack `ChecksumFailed`.
    GiveUp {
        round: u32,
        chunks: Vec<u32>,
        why: Stopped,
    },
}

/// The receiver's rounds of one transfer that converge: a failed chunk is asked for
/// again in smaller pieces (when the sender answers piece requests), a piece that fails
/// again in smaller ones still ([`pieces::smaller`]), round after round while the rounds
/// repair something; the whole bounded by the bytes sent again ([`pieces::budget`], the
/// same bound the sender keeps), by `timeout` without a repair, and by the sender's
/// `--max-resends` rounds. Pure: the caller says what passed and when. Its books are
/// the lists of what still fails and of what was repaired, nothing per chunk beyond
/// them (a transfer of a million tiny chunks that all fail costs what it did before).
#[derive(Debug)]
pub struct Converge {
    total: u64,
    chunk_bytes: u64,
    pieces: bool,
    max_rounds: u8,
    budget: u64,
    spent: u64,
    timeout: Duration,
    last_progress: Instant,
    rounds: u32,
    /// What `failing` counts in.
    unit: Unit,
    /// Increasing, in `unit`; handed out with each [`Step::Ask`] and rebuilt by
    /// [`Converge::checked`].
    failing: Vec<u32>,
    /// The unit of the last round's request, until it is checked.
    asked: Option<Unit>,
    /// Chunks that failed and then passed, with the times each was sent in all.
    repaired: Vec<(u32, u32)>,
    /// Chunks asked for again, all rounds together (a chunk counts once a round).
    resent: u64,
}

impl Converge {
    /// After the first check of a transfer of `total` bytes in chunks of `chunk_bytes`:
    /// the `failing` chunks (increasing); `pieces`: the sender answers piece requests;
    /// at most `max_rounds` rounds, and none after `timeout` without a repair from `now`.
    pub fn new(
        total: u64,
        chunk_bytes: u64,
        pieces: bool,
        max_rounds: u8,
        timeout: Duration,
        failing: Vec<u32>,
        now: Instant,
    ) -> Converge {
        Converge {
            total,
            chunk_bytes,
            pieces,
            max_rounds,
            budget: pieces::budget(total),
            spent: 0,
            timeout,
            last_progress: now,
            rounds: 0,
            unit: Unit::Chunks,
            failing,
            asked: None,
            repaired: Vec::new(),
            resent: 0,
        }
    }

    fn bytes_of(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Chunks => self.chunk_bytes,
            Unit::Pieces(shift) => 1 << shift,
        }
    }

    /// The chunk item `k` of `unit` lies in.
    fn chunk_of(&self, unit: Unit, k: u32) -> u32 {
        match unit {
            Unit::Chunks => k,
            Unit::Pieces(shift) => pieces::chunk_of(k, shift, self.chunk_bytes),
        }
    }

    /// What asking for `items` of `unit` costs against the budget: their bytes (the
    /// same cut smaller: pieces split their unit exactly).
    fn cost(&self, unit: Unit, items: &[u32]) -> u64 {
        match unit {
            Unit::Chunks => chunk_cost(items, self.chunk_bytes, self.total),
            Unit::Pieces(shift) => pieces::cost(items, shift, self.total),
        }
    }

    /// The next step at `now`. After an [`Step::Ask`], [`Converge::checked`] says what
    /// of its items passed.
    pub fn next(&mut self, now: Instant) -> Step {
        if self.failing.is_empty() {
            return Step::Done;
        }
        let round = self.rounds + 1;
        let why = if self.rounds >= self.max_rounds as u32 {
            Some(Stopped::Rounds)
        } else if self.spent + self.cost(self.unit, &self.failing) > self.budget {
            Some(Stopped::Budget)
        } else if now.saturating_duration_since(self.last_progress) > self.timeout {
            Some(Stopped::NoProgress)
        } else {
            None
        };
        if let Some(why) = why {
            let mut chunks: Vec<u32> = self
                .failing
                .iter()
                .map(|&k| self.chunk_of(self.unit, k))
                .collect();
            chunks.dedup();
            return Step::GiveUp { round, chunks, why };
        }
        // What still fails, cut smaller where it can be.
        let from = self.bytes_of(self.unit);
        let to = pieces::smaller(from)
            .filter(|&s| self.pieces && pieces::count(self.total, s) <= u32::MAX as u64);
        let failing = std::mem::take(&mut self.failing);
        let (unit, items, fresh) = match to {
            None => (self.unit, failing, false),
            Some(to) => {
                let items = failing
                    .iter()
                    .flat_map(|&k| pieces::cut(k, from, to, self.total))
                    .collect();
                (Unit::Pieces(to), items, true)
            }
        };
        self.asked = Some(unit);
        Step::Ask {
            round,
            unit,
            items,
            fresh,
        }
    }

    /// The `items` the last [`Step::Ask`] named, each checked again at `now`: `passed[i]`
    /// for the `i`-th; `sent`: those of them the sender sent (all, or of fresh pieces
    /// those whose CRC32C differed), which count against the budget. The chunks this
    /// round completed (every piece of them now passed), increasing.
    pub fn checked(
        &mut self,
        items: &[u32],
        passed: &[bool],
        sent: &[u32],
        now: Instant,
    ) -> Vec<u32> {
        let Some(unit) = self.asked.take() else {
            return Vec::new();
        };
        debug_assert_eq!(passed.len(), items.len());
        self.spent += self.cost(unit, sent);
        self.rounds += 1;
        self.unit = unit;
        let ok = |i: usize| passed.get(i).copied().unwrap_or(false);
        if (0..items.len()).any(ok) {
            self.last_progress = now;
        }
        // Items are increasing and so are their chunks: one chunk's items are adjacent.
        // Sent in this round and once in each before (all of it failed then), and once
        // at first.
        let attempts = self.rounds + 1;
        let mut completed = Vec::new();
        let mut i = 0;
        while i < items.len() {
            let chunk = self.chunk_of(unit, items[i]);
            let mut all_passed = true;
            while i < items.len() && self.chunk_of(unit, items[i]) == chunk {
                if !ok(i) {
                    all_passed = false;
                    self.failing.push(items[i]);
                }
                i += 1;
            }
            self.resent += 1;
            if all_passed {
                completed.push(chunk);
                self.repaired.push((chunk, attempts));
            }
        }
        completed
    }

    /// Chunks that failed and then passed: (chunk, times sent), by chunk.
    pub fn repaired(&self) -> Vec<(u32, u32)> {
        let mut repaired = self.repaired.clone();
        repaired.sort_unstable();
        repaired
    }

    /// Chunks asked for again, all rounds together (once a round each).
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// Bytes sent again so far, as counted against the budget.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    /// Rounds asked for so far.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }
}

/// What asking for whole `chunks` of `chunk_bytes` again costs against the budget: their
/// bytes.
fn chunk_cost(chunks: &[u32], chunk_bytes: u64, total: u64) -> u64 {
    chunks
        .iter()
        .map(|&c| chunk_bytes.min(total.saturating_sub(c as u64 * chunk_bytes)))
        .sum()
}

/// The sender's view of the receiver's resend requests: each checked against the
/// bound it offered; the times each chunk was sent, and the chunks given up on, kept for
/// the report and the error.
#[derive(Debug)]
pub struct Requests {
    max_resends: u8,
    chunks: u64,
    /// Chunk -> times sent, for every chunk sent more than once.
    attempts: BTreeMap<u64, u32>,
    given_up: Vec<u32>,
    rounds: u8,
    /// The last chunk asked for in the current round: a round's list may come in several
    /// messages, each continuing above the previous one, so a round asks for each chunk
    /// at most once (else a receiver could repeat a round's first part for ever).
    round_reached: Option<u32>,
    /// Set by [`Requests::converging`]: this sender answers piece requests and bounds the
    /// bytes it sends again by the transfer's [`pieces::budget`].
    converging: Option<Budget>,
    /// The last query of pieces (its round, shift and pieces): a piece request of the
    /// same round may follow, of some of those pieces.
    queried: Option<PieceResend>,
}

/// The sender's bound on what it sends again, with piece requests.
#[derive(Debug, Clone, Copy)]
struct Budget {
    total: u64,
    chunk_bytes: u64,
    budget: u64,
    spent: u64,
    /// Bytes whose CRC32C queries asked for, bounded by the budget too.
    queried: u64,
}

impl Requests {
    /// For a transfer of `chunks` chunks, with up to `max_resends` rounds.
    pub fn new(max_resends: u8, chunks: u64) -> Requests {
        Requests {
            max_resends,
            chunks,
            attempts: BTreeMap::new(),
            given_up: Vec::new(),
            rounds: 0,
            round_reached: None,
            converging: None,
            queried: None,
        }
    }

    /// The same, answering piece requests ([`PieceResend`]) for a transfer of `total`
    /// bytes in chunks of `chunk_bytes`, and sending again at most its
    /// [`pieces::budget`] in all, whole chunks or pieces.
    pub fn converging(self, total: u64, chunk_bytes: u64) -> Requests {
        Requests {
            converging: Some(Budget {
                total,
                chunk_bytes,
                budget: pieces::budget(total),
                spent: 0,
                queried: 0,
            }),
            ..self
        }
    }

    /// Spend `cost` of the budget, if there is one; why not, if it is used up.
    fn spend(&mut self, cost: impl FnOnce(&Budget) -> u64) -> Result<(), String> {
        let Some(b) = self.converging.as_mut() else {
            return Ok(());
        };
        let cost = cost(b);
        if b.spent + cost > b.budget {
            return Err(format!(
                "the receiver asked for {} again after {}, beyond the {} this sender sends again for a transfer of {} (its size again, at least {})",
                crate::units::format_bytes(cost),
                crate::units::format_bytes(b.spent),
                crate::units::format_bytes(b.budget),
                crate::units::format_bytes(b.total),
                crate::units::format_bytes(pieces::MIN_BUDGET),
            ));
        }
        b.spent += cost;
        Ok(())
    }

    /// The round `round` may be, after the rounds so far, or why not.
    fn check_round(&self, round: u32) -> Result<(), String> {
        if round == 0 || round > self.max_resends as u32 {
            return Err(format!(
                "the receiver asked for resend round {round} after {}, beyond this sender's --max-resends {}",
                self.rounds, self.max_resends
            ));
        }
        Ok(())
    }

    /// A query from the receiver ([`PieceResend::encode_query`]): the pieces whose CRC32C
    /// to send, or why it is not believed. A query opens a round, after the one before;
    /// the bytes it asks about are bounded by the budget too.
    pub fn take_query(&mut self, q: &PieceResend) -> Result<Vec<u32>, String> {
        self.check_pieces(q)?;
        if q.round != self.rounds as u32 + 1 {
            return Err(format!(
                "the receiver queried pieces in round {} after round {}",
                q.round, self.rounds
            ));
        }
        let Some(b) = self.converging.as_mut() else {
            return Err(
                "the receiver queried pieces, though this sender did not offer pieces".into(),
            );
        };
        let bytes = pieces::cost(&q.pieces, q.shift, b.total);
        if b.queried + bytes > b.budget {
            return Err(format!(
                "the receiver queried the CRC32C of {} after {}, beyond the {} this sender checks again for a transfer of {}",
                crate::units::format_bytes(bytes),
                crate::units::format_bytes(b.queried),
                crate::units::format_bytes(b.budget),
                crate::units::format_bytes(b.total),
            ));
        }
        b.queried += bytes;
        let chunk_bytes = b.chunk_bytes;
        self.rounds = q.round as u8;
        self.round_reached = None;
        // The chunks asked about count as sent again in this round (as the receiver
        // counts them), whether or not their pieces are then sent.
        let mut chunks: Vec<u32> = q
            .pieces
            .iter()
            .map(|&k| pieces::chunk_of(k, q.shift, chunk_bytes))
            .collect();
        chunks.dedup();
        for c in chunks {
            *self.attempts.entry(c as u64).or_insert(1) += 1;
        }
        self.queried = Some(q.clone());
        Ok(q.pieces.clone())
    }

    /// Whether `r` is a piece request or query this sender can take at all.
    fn check_pieces(&self, r: &PieceResend) -> Result<(), String> {
        let Some(b) = self.converging else {
            return Err("the receiver asked for pieces of chunks, though this sender did not offer to send pieces".into());
        };
        if !self.given_up.is_empty() {
            return Err(
                "the receiver asked for pieces again after its final resend list (after that list only the ack may come)".into(),
            );
        }
        self.check_round(r.round)?;
        let increasing = r.pieces.windows(2).all(|w| w[0] < w[1]);
        let inside = r
            .pieces
            .last()
            .is_some_and(|&k| (k as u64) < pieces::count(b.total, r.shift));
        if !pieces::valid_shift(r.shift, b.chunk_bytes) || !increasing || !inside {
            return Err("the receiver asked for pieces that are not pieces of this transfer's chunks, or out of order".into());
        }
        Ok(())
    }

    /// A [`PieceResend`] from the receiver: the pieces to send again, or why the request
    /// is not believed. A piece round comes in one message, after the rounds before it,
    /// or after the query that opened it, of some of the pieces queried.
    pub fn take_pieces(&mut self, r: &PieceResend) -> Result<Vec<u32>, String> {
        self.check_pieces(r)?;
        let Some(b) = self.converging else {
            return Err("the receiver asked for pieces of chunks, though this sender did not offer to send pieces".into());
        };
        if let Some(q) = self.queried.take().filter(|q| q.round == r.round) {
            // Both increasing: every piece asked for was queried.
            let mut queried = q.pieces.iter().peekable();
            let subset = r.pieces.iter().all(|k| {
                while queried.next_if(|&&p| p < *k).is_some() {}
                queried.next_if(|&&p| p == *k).is_some()
            });
            if q.shift != r.shift || !subset {
                return Err(format!(
                    "the receiver asked in round {} for pieces it had not queried",
                    r.round
                ));
            }
            self.spend(|b| pieces::cost(&r.pieces, r.shift, b.total))?;
            return Ok(r.pieces.clone());
        }
        if r.round != self.rounds as u32 + 1 {
            return Err(format!(
                "the receiver asked for pieces in round {} after round {} (a round of pieces comes in one request, after the one before)",
                r.round, self.rounds
            ));
        }
        self.spend(|b| pieces::cost(&r.pieces, r.shift, b.total))?;
        self.rounds = r.round as u8;
        // A chunk list of this round after it would not continue one.
        self.round_reached = None;
        let mut chunks: Vec<u32> = r
            .pieces
            .iter()
            .map(|&k| pieces::chunk_of(k, r.shift, b.chunk_bytes))
            .collect();
        chunks.dedup();
        for c in chunks {
            *self.attempts.entry(c as u64).or_insert(1) += 1;
        }
        Ok(r.pieces.clone())
    }

    /// What bounded the rounds, in words, for the error when chunks still fail.
    pub fn bound(&self) -> String {
        match self.converging {
            Some(b) if self.rounds < self.max_resends => format!(
                "they stopped repairing: {} sent again of at most {}, the transfer's size again, or --timeout passed without a repair",
                crate::units::format_bytes(b.spent),
                crate::units::format_bytes(b.budget)
            ),
            _ => "--max-resends".into(),
        }
    }

    /// A `Resend` from the receiver: the chunks to send again (empty for a `last` one,
    /// which only names chunks), or why the request is not believed.
    pub fn take(&mut self, r: &Resend) -> Result<Vec<u32>, String> {
        let Some(&first) = r.chunks.first() else {
            return Err("the receiver sent an empty resend list".into());
        };
        if r.last {
            // A final list may come in parts (verbs), each continuing above the one
            // before: no chunk named twice, none beyond the transfer, so a receiver that
            // kept sending final lists cannot hold this sender in its loop for ever.
            let above = self.given_up.last().is_none_or(|&g| first > g);
            if !above || (self.given_up.len() + r.chunks.len()) as u64 > self.chunks {
                return Err(
                    "the receiver sent a second final resend list, naming chunks again or more than the transfer has (after the final list only the ack may come)".into(),
                );
            }
            self.given_up.extend(&r.chunks);
            return Ok(Vec::new());
        }
        if !self.given_up.is_empty() {
            return Err(
                "the receiver asked for chunks again after its final resend list (after that list only the ack may come)".into(),
            );
        }
        let round = r.round;
        self.check_round(round)?;
        // A round's list may come in several messages: the same round, or the next.
        if round != self.rounds as u32 && round != self.rounds as u32 + 1 {
            return Err(format!(
                "the receiver asked for round {round} of resends after round {}",
                self.rounds
            ));
        }
        let continues = round == self.rounds as u32
            && self.round_reached.is_some_and(|reached| first > reached);
        if round == self.rounds as u32 && !continues {
            return Err(format!(
                "the receiver asked again for chunks of round {round} it had asked for"
            ));
        }
        self.spend(|b| chunk_cost(&r.chunks, b.chunk_bytes, b.total))?;
        self.queried = None;
        self.rounds = round as u8;
        self.round_reached = r.chunks.last().copied();
        for &c in &r.chunks {
            *self.attempts.entry(c as u64).or_insert(1) += 1;
        }
        Ok(r.chunks.clone())
    }

    /// Rounds of resends the receiver asked for.
    pub fn rounds(&self) -> u8 {
        self.rounds
    }

    /// Chunks still failing when the receiver gave up.
    pub fn given_up(&self) -> &[u32] {
        &self.given_up
    }

    /// Chunks sent more than once that passed in the end: (chunk, times sent).
    pub fn repaired(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        // `given_up` is increasing (each part of the final list continues above the
        // last): a binary search, not a scan per chunk.
        self.attempts
            .iter()
            .filter(|(c, _)| {
                u32::try_from(**c).is_ok_and(|c| self.given_up.binary_search(&c).is_err())
            })
            .map(|(&c, &a)| (c, a))
    }

    /// The receiver's ack after its requests: believed only if it fits them. After a
    /// final resend list (chunks that still fail) only a checksum-failed ack does, and a
    /// checksum-failed ack only after one; a verified ack counts as repaired exactly the
    /// chunks sent again, and carries `digest` (this sender's, over the CRC32Cs it sent;
    /// `None`: it sent no checksums, so there is none to compare).
    pub fn check_ack(&self, ack: &Ack, digest: Option<u32>) -> Result<(), String> {
        let failed = ack.status == AckStatus::ChecksumFailed;
        if let (Some(&first), false) = (self.given_up.first(), failed) {
            return Err(format!(
                "the receiver acked {} after its final resend list named {} chunk(s) that still fail (first: chunk {first}); after that list only a checksum-failed ack fits, so it is not believed",
                words(ack.status),
                self.given_up.len()
            ));
        }
        if failed && self.given_up.is_empty() {
            return Err(
                "the receiver acked failed checksums without naming the chunks that failed (no final resend list came)".into(),
            );
        }
        if ack.status != AckStatus::Verified {
            return Ok(());
        }
        let repaired = self.repaired().count() as u64;
        if ack.repaired as u64 != repaired {
            return Err(format!(
                "the receiver acked {} chunk(s) repaired, but this sender sent {repaired} chunk(s) again",
                ack.repaired
            ));
        }
        match (digest, ack.digest) {
            (Some(ours), Some(theirs)) if theirs != ours => Err(format!(
                "the receiver acked a transfer with CRC32C {theirs:#010x}, but this sender sent {ours:#010x}: the data it holds is not what was sent"
            )),
            (Some(_), None) => Err(
                "the receiver acked without the transfer's CRC32C digest asked for (--verify checksum)".into(),
            ),
            _ => Ok(()),
        }
    }
}

/// An ack's status in words, for errors.
fn words(status: AckStatus) -> &'static str {
    match status {
        AckStatus::Verified => "verified",
        AckStatus::Mismatch => "a mismatch",
        AckStatus::VerifyFailed => "a failed verification",
        AckStatus::TooSlow => "too slow",
        AckStatus::ChecksumFailed => "failed checksums",
        AckStatus::NotStored => "verified but not stored",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_chunks_are_those_that_differ() {
        assert_eq!(failed(&[1, 2, 3, 4], &[1, 0, 3, 5]), [1, 3]);
        assert!(failed(&[1, 2], &[1, 2]).is_empty());
    }

    #[test]
    fn rounds_repair_until_done_within_the_bound() {
        let mut r = Repair::new(3, vec![2, 5, 9]);
        assert_eq!(
            r.next(),
            Next::Resend {
                round: 1,
                chunks: vec![2, 5, 9]
            }
        );
        r.checked(&[true, false, true]);
        assert_eq!(r.repaired(), [(2, 2), (9, 2)]);
        assert_eq!(
            r.next(),
            Next::Resend {
                round: 2,
                chunks: vec![5]
            }
        );
        r.checked(&[true]);
        assert_eq!(r.next(), Next::Done);
        assert_eq!(r.repaired(), [(2, 2), (9, 2), (5, 3)]);
        assert_eq!((r.rounds, r.resent()), (2, 4));
        assert_eq!(Repair::new(3, vec![]).next(), Next::Done);
    }

    #[test]
    fn the_bound_ends_in_giving_up_with_the_chunks_that_still_fail() {
        let mut r = Repair::new(2, vec![0, 1, 2]);
        r.checked(&[false, true, false]);
        r.checked(&[false, false]);
        assert_eq!(
            r.next(),
            Next::GiveUp {
                round: 3,
                chunks: vec![0, 2]
            }
        );
        assert_eq!(r.repaired(), [(1, 2)]);
        // No resends allowed: give up at once.
        assert_eq!(
            Repair::new(0, vec![4]).next(),
            Next::GiveUp {
                round: 1,
                chunks: vec![4]
            }
        );
    }

    #[test]
    fn the_sender_believes_only_rounds_within_its_bound_and_keeps_the_books() {
        let mut s = Requests::new(2, 100);
        let ask = |round, chunks: Vec<u32>| Resend {
            round,
            last: false,
            missing: false,
            chunks,
        };
        assert_eq!(s.take(&ask(1, vec![1, 4])).unwrap(), [1, 4]);
        assert_eq!(s.take(&ask(1, vec![9])).unwrap(), [9], "a round in parts");
        // A part that does not continue above the last one repeats the round.
        assert!(s
            .take(&ask(1, vec![9]))
            .unwrap_err()
            .contains("asked again for chunks of round 1"));
        assert!(s.take(&ask(1, vec![2])).is_err());
        assert_eq!(s.take(&ask(2, vec![4])).unwrap(), [4]);
        assert!(s
            .take(&ask(3, vec![4]))
            .unwrap_err()
            .contains("round 3 after 2, beyond this sender's --max-resends 2"));
        assert!(s
            .take(&ask(1, vec![4]))
            .unwrap_err()
            .contains("after round 2"));
        assert_eq!(s.rounds(), 2);
        assert_eq!(s.repaired().collect::<Vec<_>>(), [(1, 2), (4, 3), (9, 2)]);
        let last = |chunks: Vec<u32>| Resend {
            round: 3,
            last: true,
            missing: false,
            chunks,
        };
        assert!(s.take(&last(vec![4])).unwrap().is_empty());
        assert!(s.take(&last(vec![20, 21])).unwrap().is_empty());
        assert_eq!(s.given_up(), [4, 20, 21]);
        // The final list repeated: not believed.
        assert!(s.take(&last(vec![4])).is_err());
        assert!(s.take(&last(vec![21])).is_err());
        assert_eq!(s.repaired().collect::<Vec<_>>(), [(1, 2), (9, 2)]);
        // More given up than the transfer has: not believed.
        let mut small = Requests::new(0, 2);
        assert!(small.take(&last(vec![0, 1, 2])).is_err());
        // Skipping a round is not believed either.
        let mut skip = Requests::new(3, 10);
        assert!(skip.take(&ask(2, vec![1])).is_err());
    }

    fn ack(status: AckStatus, repaired: u32, digest: Option<u32>) -> Ack {
        Ack::checked(100, None, digest, repaired).with_status(status)
    }

    #[test]
    fn after_a_final_list_only_a_checksum_failed_ack_is_believed() {
        let ask = Resend {
            round: 1,
            last: false,
            missing: false,
            chunks: vec![3, 7],
        };
        let last = Resend {
            round: 2,
            last: true,
            missing: false,
            chunks: vec![7],
        };
        let mut s = Requests::new(1, 10);
        s.take(&ask).unwrap();
        s.take(&last).unwrap();
        for status in [
            AckStatus::Verified,
            AckStatus::Mismatch,
            AckStatus::NotStored,
            AckStatus::TooSlow,
        ] {
            let e = s.check_ack(&ack(status, 1, Some(9)), Some(9)).unwrap_err();
            assert!(
                e.contains("after its final resend list named 1 chunk(s)"),
                "{e}"
            );
        }
        s.check_ack(&ack(AckStatus::ChecksumFailed, 1, None), Some(9))
            .unwrap();
        // Nothing but the ack after the final list.
        let again = Resend { round: 2, ..ask };
        assert!(s
            .take(&again)
            .unwrap_err()
            .contains("after its final resend list"));
        // A checksum-failed ack with no final list before it does not fit either.
        let fresh = Requests::new(1, 10);
        assert!(fresh
            .check_ack(&ack(AckStatus::ChecksumFailed, 0, None), Some(9))
            .unwrap_err()
            .contains("without naming the chunks"));
    }

    #[test]
    fn a_verified_ack_counts_the_chunks_sent_again_and_carries_the_senders_digest() {
        let mut s = Requests::new(3, 10);
        let ask = |round, chunks: Vec<u32>| Resend {
            round,
            last: false,
            missing: false,
            chunks,
        };
        s.take(&ask(1, vec![2, 4])).unwrap();
        s.take(&ask(2, vec![4])).unwrap();
        s.check_ack(&ack(AckStatus::Verified, 2, Some(5)), Some(5))
            .unwrap();
        let e = s
            .check_ack(&ack(AckStatus::Verified, 3, Some(5)), Some(5))
            .unwrap_err();
        assert!(
            e.contains("acked 3 chunk(s) repaired, but this sender sent 2"),
            "{e}"
        );
        let e = s
            .check_ack(&ack(AckStatus::Verified, 2, Some(6)), Some(5))
            .unwrap_err();
        assert!(e.contains("not what was sent"), "{e}");
        assert!(s
            .check_ack(&ack(AckStatus::Verified, 2, None), Some(5))
            .is_err());
        // No checksums sent: no digest to compare.
        Requests::new(3, 10)
            .check_ack(&ack(AckStatus::Verified, 0, None), None)
            .unwrap();
    }

    const MIB: u64 = 1 << 20;

    fn converge(pieces: bool, max_rounds: u8, failing: Vec<u32>, t0: Instant) -> Converge {
        Converge::new(
            64 * MIB,
            MIB,
            pieces,
            max_rounds,
            Duration::from_secs(10),
            failing,
            t0,
        )
    }

    #[test]
    fn a_failed_chunk_is_asked_for_in_pieces_and_failed_pieces_in_smaller_ones() {
        let t0 = Instant::now();
        let mut c = converge(true, 16, vec![2, 5], t0);
        let Step::Ask {
            round,
            unit,
            items,
            fresh,
        } = c.next(t0)
        else {
            panic!("a round");
        };
        // Chunks 2 and 5 as 64 KiB pieces: 32..48 and 80..96.
        assert_eq!((round, unit, fresh), (1, Unit::Pieces(16), true));
        assert_eq!(items, (32..48).chain(80..96).collect::<Vec<u32>>());
        // All of chunk 5's pieces pass, one of chunk 2's (piece 40) fails.
        let passed: Vec<bool> = items.iter().map(|&k| k != 40).collect();
        assert_eq!(c.checked(&items, &passed, &items, t0), [5]);
        assert_eq!(c.repaired(), [(5, 2)]);
        // Piece 40 as sixteen 4 KiB pieces: 640..656.
        let Step::Ask {
            round,
            unit,
            items,
            fresh,
        } = c.next(t0)
        else {
            panic!("a second round");
        };
        assert_eq!((round, unit, fresh), (2, Unit::Pieces(12), true));
        assert_eq!(items, (640..656).collect::<Vec<u32>>());
        // The sender's CRC32Cs said only piece 650 differs where it landed: only it is
        // sent, and it fails again.
        let passed: Vec<bool> = items.iter().map(|&k| k != 650).collect();
        assert!(c.checked(&items, &passed, &[650], t0).is_empty());
        // At the floor: the one 4 KiB piece again, as it is (known bad: no query).
        let Step::Ask {
            unit, items, fresh, ..
        } = c.next(t0)
        else {
            panic!("a third round");
        };
        assert_eq!(
            (unit, items.as_slice(), fresh),
            (Unit::Pieces(12), &[650][..], false)
        );
        assert_eq!(c.checked(&items, &[true], &items, t0), [2]);
        assert_eq!(c.next(t0), Step::Done);
        assert_eq!(c.repaired(), [(2, 4), (5, 2)]);
        assert_eq!(c.resent(), 4, "chunk 2 in three rounds, chunk 5 in one");
        assert_eq!(c.spent(), 32 * 64 * 1024 + 4096 + 4096);
    }

    #[test]
    fn rounds_go_on_while_they_repair_and_end_at_the_budget_not_at_a_round_count() {
        // A link where a quarter of the chunks and then of each round's pieces fail:
        // more than three rounds, every one repairing something, within the budget.
        let t0 = Instant::now();
        let mut c = converge(true, 16, (0..64).step_by(4).collect(), t0);
        let mut rounds = 0;
        // A fixed pseudo-random quarter of the items fails.
        let mut x = 12345u64;
        let mut fails = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33).is_multiple_of(4)
        };
        while let Step::Ask { items, .. } = c.next(t0) {
            let passed: Vec<bool> = items.iter().map(|_| !fails()).collect();
            c.checked(&items, &passed, &items, t0);
            rounds += 1;
            assert!(rounds < 16);
        }
        assert!(rounds > 3, "{rounds}");
        assert_eq!(c.next(t0), Step::Done);
        assert!(c.spent() <= 64 * MIB);
        // A link where everything fails: the budget (the transfer's size again) ends it,
        // naming every chunk, long before the rounds are used up.
        let mut c = converge(true, 16, (0..64).collect(), t0);
        let why = loop {
            match c.next(t0) {
                Step::Ask { items, .. } => {
                    c.checked(&items, &vec![false; items.len()], &items, t0);
                }
                Step::GiveUp { chunks, why, .. } => {
                    assert_eq!(chunks, (0..64).collect::<Vec<u32>>());
                    break why;
                }
                Step::Done => panic!("nothing passed"),
            }
        };
        assert_eq!(why, Stopped::Budget);
        assert!(c.spent() <= 64 * MIB && c.rounds() < 16, "{}", c.rounds());
        assert!(c.repaired().is_empty());
    }

    #[test]
    fn the_users_cap_and_time_without_a_repair_end_the_rounds_too() {
        let t0 = Instant::now();
        let mut c = converge(true, 1, vec![3], t0);
        let Step::Ask { items, .. } = c.next(t0) else {
            panic!("a round");
        };
        c.checked(&items, &vec![false; items.len()], &items, t0);
        assert!(matches!(
            c.next(t0),
            Step::GiveUp {
                round: 2,
                why: Stopped::Rounds,
                ..
            }
        ));
        let mut c = converge(true, 16, vec![3], t0);
        let Step::Ask { items, .. } = c.next(t0) else {
            panic!("a round");
        };
        c.checked(&items, &vec![false; items.len()], &items, t0);
        let late = t0 + Duration::from_secs(11);
        assert_eq!(
            c.next(late),
            Step::GiveUp {
                round: 2,
                chunks: vec![3],
                why: Stopped::NoProgress
            }
        );
        // A sender that does not answer piece requests is asked for whole chunks.
        let mut c = converge(false, 16, vec![3, 9], t0);
        assert_eq!(
            c.next(t0),
            Step::Ask {
                round: 1,
                unit: Unit::Chunks,
                items: vec![3, 9],
                fresh: false
            }
        );
        assert_eq!(c.checked(&[3, 9], &[true, false], &[3, 9], t0), [3]);
    }

    #[test]
    fn the_sender_sends_pieces_only_when_offered_and_within_the_budget() {
        let piece = |round, shift, pieces: Vec<u32>| PieceResend {
            round,
            shift,
            pieces,
        };
        // Not offered: refused.
        let mut plain = Requests::new(16, 64);
        assert!(plain
            .take_pieces(&piece(1, 16, vec![0]))
            .unwrap_err()
            .contains("did not offer"));
        let mut s = Requests::new(16, 64).converging(64 * MIB, MIB);
        assert_eq!(
            s.take_pieces(&piece(1, 16, vec![32, 33, 80])).unwrap(),
            [32, 33, 80]
        );
        // A piece round comes whole, after the one before.
        assert!(s.take_pieces(&piece(1, 16, vec![90])).is_err());
        assert!(s.take_pieces(&piece(3, 12, vec![1])).is_err());
        // Pieces that do not cut the chunks, or beyond the transfer.
        assert!(s.take_pieces(&piece(2, 11, vec![1])).is_err());
        assert!(s.take_pieces(&piece(2, 16, vec![1024])).is_err());
        assert_eq!(s.take_pieces(&piece(2, 12, vec![640])).unwrap(), [640]);
        // Chunks 2 and 5 were sent again (2 twice).
        assert_eq!(s.repaired().collect::<Vec<_>>(), [(2, 3), (5, 2)]);
        // The budget: the transfer's size again. Asking for every chunk whole once more
        // fits what is left; once again does not.
        let all: Vec<u32> = (0..64).collect();
        let ask = |round, chunks: Vec<u32>| Resend {
            round,
            last: false,
            missing: false,
            chunks,
        };
        let mut b = Requests::new(16, 64).converging(64 * MIB, MIB);
        b.take(&ask(1, all.clone())).unwrap();
        let e = b.take(&ask(2, vec![0])).unwrap_err();
        assert!(
            e.contains("beyond the 64 MiB this sender sends again"),
            "{e}"
        );
        assert!(
            b.bound().contains("64 MiB sent again of at most 64 MiB"),
            "{}",
            b.bound()
        );
        // A 1-byte tail asked for over and over costs its byte each time, and the rounds
        // stay capped.
        let mut t = Requests::new(16, 2).converging(8193, 8192);
        for round in 1..=16 {
            if t.take_pieces(&piece(round, 12, vec![2])).is_err() {
                panic!("round {round}");
            }
        }
        assert_eq!(t.converging.unwrap().spent, 16);
        assert!(t
            .take_pieces(&piece(17, 12, vec![2]))
            .unwrap_err()
            .contains("--max-resends 16"));
        assert_eq!(Requests::new(3, 4).bound(), "--max-resends");
    }

    #[test]
    fn a_query_opens_a_round_and_only_pieces_it_named_may_follow() {
        let piece = |round, shift, pieces: Vec<u32>| PieceResend {
            round,
            shift,
            pieces,
        };
        let mut s = Requests::new(16, 64).converging(64 * MIB, MIB);
        // Not offered: refused.
        assert!(Requests::new(16, 64)
            .take_query(&piece(1, 16, vec![0]))
            .is_err());
        assert_eq!(
            s.take_query(&piece(1, 16, (32..48).collect())).unwrap(),
            (32..48).collect::<Vec<u32>>()
        );
        // Of the pieces queried, two are asked for: sent; chunk 2 counts once.
        assert_eq!(
            s.take_pieces(&piece(1, 16, vec![33, 40])).unwrap(),
            [33, 40]
        );
        assert_eq!(s.repaired().collect::<Vec<_>>(), [(2, 2)]);
        assert_eq!(s.converging.unwrap().spent, 2 << 16);
        // A piece not queried, or a second request of the round: refused.
        s.take_query(&piece(2, 12, (528..544).collect())).unwrap();
        assert!(s
            .take_pieces(&piece(2, 12, vec![100]))
            .unwrap_err()
            .contains("had not queried"));
        assert!(
            s.take_pieces(&piece(2, 12, vec![530])).is_err(),
            "the query was used"
        );
        // A query must open a round of its own.
        assert!(s.take_query(&piece(2, 12, vec![530])).is_err());
        // Queries are bounded by the budget too: the whole transfer once, in all.
        let mut q = Requests::new(16, 64).converging(64 * MIB, MIB);
        q.take_query(&piece(1, 16, (0..1024).collect())).unwrap();
        assert!(q
            .take_query(&piece(2, 16, vec![0]))
            .unwrap_err()
            .contains("beyond the 64 MiB this sender checks again"));
    }
}
