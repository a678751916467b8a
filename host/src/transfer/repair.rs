//! The bookkeeping of checks by checksum, the same over both transports: which chunks
//! failed, the receiver's rounds of resends within the sender's bound ([`Repair`]), and
//! the sender's view of the receiver's requests and its final ack ([`Requests`]), which
//! believes only what fits what came before. Pure state machines, tested here; each
//! transport carries the messages its own way (`transport::tcp`, `transport::rdma`).

use crate::wire::{Ack, AckStatus, Resend};
use std::collections::BTreeMap;

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
        if round == 0 || round > self.max_resends as u32 {
            return Err(format!(
                "the receiver asked for resend round {round} after {}, beyond this sender's --max-resends {}",
                self.rounds, self.max_resends
            ));
        }
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
}
