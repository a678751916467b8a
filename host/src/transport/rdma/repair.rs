//! The bookkeeping of `--verify checksum` over verbs, apart from the wire: which chunks
//! failed, the rounds of resends and their bound, how the checksum and resend lists are
//! cut into messages of a bounded size, and what a sender makes of the receiver's
//! requests. Pure functions and small state machines, tested here; the posting lives in
//! `sender.rs` and `checks.rs`.
//!
//! The protocol (version 2, verbs), after the data of a transfer:
//!
//! ```text
//! sender                                                    receiver
//!   |  SEND ChunkChecksums (chunks 0..252) ----------------->|  (receives posted for them
//!   |  SEND ChunkChecksums (chunks 252..504) --------------->|   behind the data's)
//!   |  ...                                                   |  CRC32C of each chunk where
//!   |                                                        |  it landed; compare
//!   |<---------------- SEND Resend{round 1, chunks 3, 97}    |  (send mode: receives posted
//!   |  chunk 3, chunk 97 again, into the same place -------->|   at those chunks' places)
//!   |  (WRITE_WITH_IMM / SEND_WITH_IMM, imm = index + 1)     |  check them again
//!   |<----------------------- SEND Ack{digest, repaired 2}   |
//! ```
//!
//! A round's list may take several `Resend` messages (at most [`LIST_PER_MESSAGE`]
//! chunks each); the sender sends each message's chunks again as it comes, and the
//! receiver waits for all of them before it checks again. After `max_resends` rounds
//! the receiver names the chunks that still fail in `Resend{last}` messages and acks
//! `ChecksumFailed`.

use crate::transfer::header::{ChunkChecksums, Op, Resend, CHECKSUMS_PREFIX_LEN, REPLY_PREFIX_LEN};
use std::collections::{BTreeMap, VecDeque};

/// Chunk indices or checksums per message: 16 + 4 × 252 = 1024 bytes, one control slot.
pub const LIST_PER_MESSAGE: usize = 252;
/// Bytes of one control message slot (a posted receive for a `ChunkChecksums`, or for
/// a `Resend` or an ack on the sender's side).
pub const CONTROL_SLOT: usize = CHECKSUMS_PREFIX_LEN + 4 * LIST_PER_MESSAGE;
const _: () = assert!(REPLY_PREFIX_LEN + 4 * LIST_PER_MESSAGE == CONTROL_SLOT);
/// Receives a sender keeps posted for the receiver's replies (resend requests and the
/// ack) when it sends checksums.
pub const REPLY_SLOTS: u32 = 4;
/// Chunks a receiver checks by checksum at most (its expected checksums and resend
/// lists take 8 bytes per chunk): 2^24, 128 MiB of bookkeeping.
pub const MAX_CHECKSUM_CHUNKS: u64 = 1 << 24;

/// What the `p`-th receive of the receiver's sequence takes (see `receiver::Receives`):
/// in send mode chunk `p` in its place, then (with `slots`, i.e. checksums) the checksum
/// messages in control slots; in write mode an immediate, in a control slot where there
/// are slots (a checksum message may land there too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    Chunk(u64),
    Slot(u64),
    Immediate,
}

pub fn receive_of(op: Op, p: u64, chunks: u64, slots: Option<u64>) -> Receive {
    match (op, slots) {
        (Op::Send, _) if p < chunks => Receive::Chunk(p),
        (_, Some(slots)) if slots > 0 => match op {
            Op::Send => Receive::Slot((p - chunks) % slots),
            Op::Write => Receive::Slot(p % slots),
        },
        _ => Receive::Immediate,
    }
}

/// How many `ChunkChecksums` messages a transfer of `chunks` chunks takes.
pub fn checksum_messages(chunks: u64) -> u64 {
    chunks.div_ceil(LIST_PER_MESSAGE as u64)
}

/// The `ChunkChecksums` messages of `crcs`, in order.
pub fn checksum_batches(crcs: &[u32]) -> impl Iterator<Item = ChunkChecksums> + '_ {
    crcs.chunks(LIST_PER_MESSAGE)
        .enumerate()
        .map(|(i, part)| ChunkChecksums {
            first: (i * LIST_PER_MESSAGE) as u32,
            crcs: part.to_vec(),
        })
}

/// The `Resend` messages of one round's list.
pub fn resend_batches(round: u32, last: bool, chunks: &[u32]) -> Vec<Resend> {
    chunks
        .chunks(LIST_PER_MESSAGE)
        .map(|part| Resend {
            round,
            last,
            missing: false, // chunks that failed their checksum (verbs loses none)
            chunks: part.to_vec(),
        })
        .collect()
}

/// The receiver's expected checksums, gathered from the sender's messages in order.
/// Memory: 4 bytes per chunk of the offer the receiver admitted, never what a message
/// claims.
#[derive(Debug)]
pub struct Expected {
    crcs: Vec<u32>,
    chunks: u64,
}

impl Expected {
    pub fn new(chunks: u64) -> Expected {
        Expected {
            crcs: Vec::with_capacity(chunks.min(MAX_CHECKSUM_CHUNKS) as usize),
            chunks,
        }
    }

    /// Take one `ChunkChecksums` message: it must continue where the last one ended.
    pub fn take(&mut self, message: &[u8]) -> Result<(), String> {
        let m = ChunkChecksums::decode(message, self.chunks)
            .map_err(|e| format!("a chunk checksum message is invalid: {e}"))?;
        if m.first as usize != self.crcs.len() || m.crcs.is_empty() {
            return Err(format!(
                "chunk checksums from chunk {} ({} of them) where chunk {} was due",
                m.first,
                m.crcs.len(),
                self.crcs.len()
            ));
        }
        self.crcs.extend_from_slice(&m.crcs);
        Ok(())
    }

    pub fn complete(&self) -> bool {
        self.crcs.len() as u64 == self.chunks
    }

    pub fn crcs(&self) -> &[u32] {
        &self.crcs
    }
}

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
            // Each part continues above the one before: no chunk named twice.
            let above = self.given_up.last().is_none_or(|&g| first > g);
            if !above || (self.given_up.len() + r.chunks.len()) as u64 > self.chunks {
                return Err(
                    "the receiver gave up on chunks twice or on more than the transfer has".into(),
                );
            }
            self.given_up.extend(&r.chunks);
            return Ok(Vec::new());
        }
        let round = r.round;
        if round == 0 || round > self.max_resends as u32 {
            return Err(format!(
                "the receiver asked for round {round} of resends, beyond the {} this sender offered (--max-resends)",
                self.max_resends
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
        self.attempts
            .iter()
            .filter(|(c, _)| u32::try_from(**c).is_ok_and(|c| !self.given_up.contains(&c)))
            .map(|(&c, &a)| (c, a))
    }
}

/// A pass that sends only some chunks again (a resend round) through the schedule,
/// which hands every chunk of the plan to the wire in order: the wire posts the chosen
/// ones, each signaled, and counts the others done at once. This keeps the schedule's
/// promise (a chunk is reported done only when nothing reads it) with a completion per
/// posted chunk.
#[derive(Debug, Default)]
pub struct Subset {
    chosen: Vec<u32>,
    /// Posted chunks not yet completed, in order.
    outstanding: VecDeque<u64>,
    /// The highest chunk index handed to the wire (posted or passed over).
    handed: Option<u64>,
}

impl Subset {
    /// A pass over `chosen` (increasing chunk indices).
    pub fn new(chosen: Vec<u32>) -> Subset {
        Subset {
            chosen,
            ..Subset::default()
        }
    }

    /// Chunk `index` is handed to the wire: whether to post it.
    pub fn hand(&mut self, index: u64) -> bool {
        self.handed = Some(index);
        let post = u32::try_from(index).is_ok_and(|i| self.chosen.binary_search(&i).is_ok());
        if post {
            self.outstanding.push_back(index);
        }
        post
    }

    /// The completion of posted chunk `index` (they complete in order).
    pub fn completed(&mut self, index: u64) -> Result<(), String> {
        match self.outstanding.front() {
            Some(&first) if first == index => {
                self.outstanding.pop_front();
                Ok(())
            }
            other => Err(format!(
                "the completion of chunk {index} came where chunk {other:?} was due"
            )),
        }
    }

    /// Every chunk up to this one is done: posted ones completed, the others passed
    /// over.
    pub fn done_through(&self) -> Option<u64> {
        match self.outstanding.front() {
            None => self.handed,
            Some(&first) => first.checked_sub(1),
        }
    }

    /// Whether a posted chunk is still to complete.
    pub fn waiting(&self) -> bool {
        !self.outstanding.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::header::ChunkChecksums;

    #[test]
    fn checksums_go_in_bounded_messages_that_rebuild_the_list() {
        let crcs: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mut expected = Expected::new(1000);
        let mut messages = 0;
        for m in checksum_batches(&crcs) {
            let bytes = m.encode();
            assert!(bytes.len() <= CONTROL_SLOT);
            expected.take(&bytes).unwrap();
            messages += 1;
        }
        assert_eq!(messages, checksum_messages(1000));
        assert_eq!(messages, 4);
        assert!(expected.complete());
        assert_eq!(expected.crcs(), crcs);
        assert_eq!(checksum_messages(252), 1);
        assert_eq!(checksum_messages(253), 2);
    }

    #[test]
    fn a_checksum_message_out_of_order_or_beyond_the_transfer_is_refused() {
        let mut expected = Expected::new(10);
        let skip = ChunkChecksums {
            first: 3,
            crcs: vec![1, 2],
        };
        assert!(expected
            .take(&skip.encode())
            .unwrap_err()
            .contains("chunk 0 was due"));
        let beyond = ChunkChecksums {
            first: 0,
            crcs: vec![0; 11],
        };
        assert!(expected.take(&beyond.encode()).is_err());
        // A count that lies about the body: refused, nothing allocated for it.
        let mut lying = ChunkChecksums {
            first: 0,
            crcs: vec![7; 2],
        }
        .encode();
        lying[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(expected.take(&lying).is_err());
        assert!(expected.crcs().is_empty());
        let empty = ChunkChecksums {
            first: 0,
            crcs: vec![],
        };
        assert!(expected.take(&empty.encode()).is_err());
    }

    #[test]
    fn receives_take_chunks_then_slots_and_no_slot_is_reused_while_outstanding() {
        use Receive::*;
        assert_eq!(receive_of(Op::Send, 3, 10, None), Chunk(3));
        assert_eq!(receive_of(Op::Send, 10, 10, None), Immediate);
        assert_eq!(receive_of(Op::Send, 9, 10, Some(2)), Chunk(9));
        assert_eq!(receive_of(Op::Send, 10, 10, Some(2)), Slot(0));
        assert_eq!(receive_of(Op::Send, 13, 10, Some(2)), Slot(1));
        assert_eq!(receive_of(Op::Write, 13, 10, Some(4)), Slot(1));
        assert_eq!(receive_of(Op::Write, 13, 10, None), Immediate);
        // Receives complete in order, and at most `depth` are outstanding (one posted
        // for each completed); the receiver has `slots` = depth in write mode and
        // min(depth, messages) in send mode: no two outstanding ever share a slot.
        for (op, n, messages, depth) in [
            (Op::Send, 5u64, 4u64, 3u64),
            (Op::Send, 100, 1, 64),
            (Op::Send, 3, 9, 3),
            (Op::Write, 5, 0, 4),
        ] {
            let slots = match op {
                Op::Send => depth.min(messages),
                Op::Write => depth,
            };
            let limit = match op {
                Op::Send => n + messages,
                Op::Write => 200,
            };
            let mut outstanding = VecDeque::new();
            for p in 0..limit {
                if outstanding.len() as u64 == depth {
                    outstanding.pop_front();
                }
                let r = receive_of(op, p, n, Some(slots));
                assert!(
                    !matches!(r, Slot(_)) || !outstanding.contains(&r),
                    "{op:?}: receive {p} takes {r:?} while it is out"
                );
                outstanding.push_back(r);
            }
        }
    }

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
    fn a_long_list_takes_several_bounded_messages() {
        let chunks: Vec<u32> = (0..600).map(|i| i * 3).collect();
        let parts = resend_batches(2, false, &chunks);
        assert_eq!(parts.len(), 3);
        let mut again = Vec::new();
        for p in &parts {
            let bytes = p.encode();
            assert!(bytes.len() <= CONTROL_SLOT);
            let (round, last, count) = Resend::decode_prefix(&bytes, 2000).unwrap();
            let back = Resend::decode_chunks(round, last, count, &bytes[REPLY_PREFIX_LEN..], 2000)
                .unwrap();
            assert_eq!(back.chunks.len(), count as usize);
            again.extend(back.chunks);
        }
        assert_eq!(again, chunks);
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
            .contains("beyond the 2"));
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

    #[test]
    fn a_subset_pass_reports_chunks_done_only_behind_the_posted_ones() {
        let mut s = Subset::new(vec![2, 5]);
        assert_eq!(s.done_through(), None);
        assert!(!s.hand(0));
        assert!(!s.hand(1));
        assert_eq!(s.done_through(), Some(1));
        assert!(s.hand(2));
        assert!(!s.hand(3));
        assert_eq!(s.done_through(), Some(1), "chunk 2 is still out");
        assert!(s.waiting());
        assert!(s.hand(5));
        assert!(!s.hand(6));
        s.completed(2).unwrap();
        assert_eq!(s.done_through(), Some(4));
        assert!(s.completed(6).is_err());
        s.completed(5).unwrap();
        assert_eq!(s.done_through(), Some(6));
        assert!(!s.waiting());
        // A first chosen chunk at 0 still out: nothing done yet.
        let mut z = Subset::new(vec![0]);
        assert!(z.hand(0));
        assert_eq!(z.done_through(), None);
    }
}
