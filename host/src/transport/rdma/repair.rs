//! The verbs side of `--verify checksum`, apart from the posting: how the checksum and
//! resend lists are cut into messages of a bounded size, which receive takes what, and
//! the subset passes of a resend round. The rounds themselves and what a sender believes
//! of them are the same over TCP: [`crate::transfer::repair`]. Pure functions and small
//! state machines, tested here; the posting lives in `sender.rs` and `checks.rs`.
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

use crate::wire::{ChunkChecksums, Op, Resend, CHECKSUMS_PREFIX_LEN, REPLY_PREFIX_LEN};
use std::collections::VecDeque;

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

/// What the `p`-th receive of the receiver's sequence takes (see `receives::Receives`):
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
    use crate::wire::ChunkChecksums;

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
