//! The wire seam: what a transport is, as the engine ([`crate::engine`]) sees it, drawn
//! the way NCCL's net plugin interface (`net_v11.h`: `listen` / `connect` / `accept`,
//! `regMr`, `isend` / `irecv` / `test`) and NIXL's backend engines (capabilities asked,
//! not refused) draw it. A transport is two things:
//!
//! - **Opening** (its own code, as NCCL's `connect`/`accept` are each plugin's): dialing
//!   the receiver's rails with an offer and reading its answer
//!   ([`tcp::dial`], [`verbs`]'s), and a listener that hands the engine each offer with
//!   the peer's words ([`Heard`]) and routes further rails to their transfer
//!   ([`joins`]).
//! - **A link** once open: one connection's rails (1..=N), a TCP stream set or a verbs
//!   queue pair each. The sender's end ([`SendLink`]) posts items on a rail, sends and
//!   takes control messages, and reports what happened as [`SendEvent`]s; the
//!   receiver's end ([`RecvLink`]) is told which items to expect, lands them in the
//!   receive buffer at their offsets and reports [`RecvEvent`]s. Neither blocks except
//!   in `poll`, whose wait the caller bounds.
//!
//! Everything else is the engine's, written once over any link: the chunk plan and
//! window, which rail carries which chunk (fewest in flight, credit on completion),
//! failover and cooldowns, checksums and the digest, repair rounds in chunks and
//! pieces, the receive loop, the serving loop, reports. What differs between links is
//! asked through [`Caps`], never found out from an error.
//!
//! Layering (cudarc-like): [`crate::rdma`] wraps verbs thinly; the links here sit on it
//! and on sockets; the engine sits on the links; the faces (CLI, library, Python) on the
//! engine. Nothing here imports the engine.

pub mod joins;
pub mod tcp;
pub mod verbs;

use crate::server::{AllowList, Key};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::RecvOutcome;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Which rail of a link (0-based, in the order the link was opened with).
pub type Rail = usize;

/// The unit a pass moves: the transfer's chunks, or pieces of `1 << shift` bytes (a
/// repair round's, see [`crate::wire::pieces`]). Both ends know the unit of each pass,
/// so an item's index says where it lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Chunks,
    Pieces(u8),
}

impl Unit {
    /// The plan of this unit over a transfer of `total` bytes in `chunk`-byte chunks.
    pub fn plan(self, total: u64, chunk: u64) -> Result<ChunkPlan, String> {
        match self {
            Unit::Chunks => ChunkPlan::new(total, chunk),
            Unit::Pieces(shift) => {
                ChunkPlan::new(total, 1u64.checked_shl(shift as u32).ok_or("piece size")?)
            }
        }
    }
}

/// A pass's tag, which every item posted and every report of it names (opaque to links).
pub use crate::transfer::plan::Pass;

/// One item handed to a sender's link: a chunk, or a piece, of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub pass: Pass,
    /// Its index in its pass's unit plan (chunk `i`, or piece `i`).
    pub index: u64,
    /// Where it goes in the transfer.
    pub offset: u64,
    /// Where its bytes lie in the memory the link reads (the source's).
    pub bytes: Range<usize>,
    /// Its CRC32C, where known before it is sent (the GPU's); a link whose frames carry
    /// CRC32Cs computes the others itself.
    pub crc: Option<u32>,
    /// The link must report this one (a report covers the items posted before it on
    /// the same rail too, see [`SendEvent::Sent`]). The last item of a pass is always
    /// signaled.
    pub signaled: bool,
    /// 0 for a first sending, `r` in repair round `r` (the test-only fault injector
    /// flips by it).
    pub attempt: u32,
}

/// What a sender's link reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendEvent {
    /// On `rail`, items `items` of `pass` (indices, in the order they were posted) are
    /// done: nothing of the link reads their bytes any more. A link whose completions
    /// cover the requests before them (verbs' unsignaled ones) lists every item covered.
    /// `crcs`: the CRC32C the frame of each of `items` carried, in the same order, where
    /// the link computed them (frames that carry CRC32Cs, and none given); empty
    /// otherwise.
    Sent {
        rail: Rail,
        pass: Pass,
        items: Vec<u64>,
        crcs: Vec<u32>,
    },
    /// A control message from the receiver, whole, as it came on `rail`.
    Message { rail: Rail, bytes: Vec<u8> },
    /// `rail` is broken (a failed write or completion, the peer gone, a port down): it
    /// carries nothing more. Items posted there and not reported [`SendEvent::Sent`] may
    /// or may not have arrived; their bytes are still read until the link says
    /// [`SendEvent::Quiet`] for the rail.
    Down { rail: Rail, why: String },
    /// Nothing of `rail` reads any posted bytes any more (after it went down or was
    /// given up): its unreported items may be given back to their source.
    Quiet { rail: Rail },
}

/// What a receiver's link reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvEvent {
    /// Item `index` of the expected pass landed in place, from `rail`, whole. `sent_crc`:
    /// the CRC32C its frame carried (links whose frames carry them); `landed_crc`: the
    /// CRC32C of its bytes where they landed, where the link computed it on the way in
    /// (host memory, while the bytes are in cache); the engine computes the others.
    Landed {
        rail: Rail,
        index: u64,
        sent_crc: Option<u32>,
        landed_crc: Option<u32>,
    },
    /// An item of the pass arrived again after it had landed (a failover's second
    /// sending): dropped, nothing written.
    Copy { rail: Rail, index: u64 },
    /// A control message from the sender, whole.
    Message { rail: Rail, bytes: Vec<u8> },
    /// The sender ended the pass on `rail`, naming the rails it gave up on (bit `r`:
    /// rail `r`); links whose sender completions mean the bytes landed never say it.
    PassEnded { rail: Rail, failed: u32 },
    /// `rail` is broken: nothing more arrives on it.
    Down { rail: Rail, why: String },
}

/// What a receiver's listener hears, whichever transport: an offer (`O`, the
/// transport's, with what it needs to be answered), or something to report.
pub enum Heard<O> {
    Offer(O),
    /// A refusal at the handshake, a failed one, a notice.
    Said(RecvOutcome),
}

/// What to report of a refusal, whichever transport made it: the reason and its detail,
/// and why the reject did not reach the sender (`unsent`), where it did not.
pub fn rejected(
    peer: std::net::SocketAddr,
    reason: &crate::wire::RejectReason,
    detail: Option<String>,
    unsent: Option<String>,
) -> RecvOutcome {
    let mut text = reason.to_string();
    if let Some(detail) = detail {
        text = format!("{text}: {detail}");
    }
    if let Some(why) = unsent {
        text = format!("{text} (and the reject could not be sent: {why})");
    }
    RecvOutcome::Rejected {
        peer: peer.to_string(),
        reason: text,
    }
}

/// What a listener checks before it hands an offer on (nothing of it needs memory).
#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub timeout: Duration,
    pub max_bytes: u64,
    pub allow: AllowList,
    pub key: Option<Key>,
}

/// The longest control message a link carries, whole: a list of 2^24 CRC32Cs (the most
/// chunks a transfer checks) and its prefix. A link refuses to take in a longer one, so
/// a peer's lie about a message's length costs at most this.
pub const MAX_MESSAGE: usize = (64 << 20) + 64;

/// A link that cannot go on: every rail is down, or its own machinery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LinkError(pub String);

/// What a link can do, asked instead of refused (NIXL's capability queries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Each item travels with the CRC32C the sender computed (TCP frames); otherwise the
    /// engine sends the CRC32Cs after the data as control messages (verbs).
    pub crc_in_frames: bool,
    /// A sender's [`SendEvent::Sent`] means the bytes landed at the receiver (an RC
    /// completion is the far NIC's acknowledgment); otherwise only that the link let go
    /// of them (TCP: the kernel copied them), and a rail that fails may lose items it
    /// reported: the receiver then asks for the missing ones after the sender ends the
    /// pass ([`RecvEvent::PassEnded`]).
    pub sent_means_landed: bool,
    /// The receiver's link reads and writes GPU memory itself (verbs with GPUDirect
    /// RDMA); otherwise GPU memory is staged through host memory by the link.
    pub gpu_memory: bool,
    /// Items best handed to [`SendLink::post`] at once (verbs: one doorbell for a list of
    /// work requests, a system call under Soft-RoCE); 1 where each goes as it comes.
    pub post_batch: usize,
    /// The sender's NIC writes the receive buffer itself (verbs RDMA WRITE): it can write
    /// an item's place again after the item landed, up to the end of the buffer's
    /// registration, so what the engine checked may change before it is handed on. The
    /// engine checks again what it stores, as it stores it; the serving loop, what it
    /// hands to a caller, once the registration is gone.
    pub peer_writes_in_place: bool,
}

impl Caps {
    /// A byte stream's (TCP, and the engine's in-memory test links): a CRC32C in each
    /// frame, sent when the kernel took the bytes, host memory, items one at a time.
    pub const STREAM: Caps = Caps {
        crc_in_frames: true,
        sent_means_landed: false,
        gpu_memory: false,
        post_batch: 1,
        peer_writes_in_place: false,
    };
    /// A verbs queue pair's: CRC32Cs as control messages after the data, sent when the far
    /// NIC acknowledged, memory the NIC registers (GPU memory with GPUDirect RDMA).
    pub const QUEUE_PAIR: Caps = Caps {
        crc_in_frames: false,
        sent_means_landed: true,
        gpu_memory: true,
        post_batch: 1,
        peer_writes_in_place: false,
    };
}

/// The sender's end of one connection over 1..=N rails.
///
/// # Safety
/// The engine gives an item's bytes back to their source (a staging ring then overwrites
/// them) once the link reported the item [`SendEvent::Sent`], or, for an item of a rail
/// that went down, once the link said [`SendEvent::Quiet`] for it. So an implementation
/// reads an item's bytes only until it reports it one way or the other, reports an item
/// only under the pass it was posted with, and returns from
/// [`drain`](SendLink::drain) only once nothing of it reads any posted bytes.
pub unsafe trait SendLink {
    /// Rails the link was opened with (some may be down by now).
    fn rails(&self) -> usize;

    fn caps(&self) -> Caps;

    /// Hand `items` to `rail`, in order. Must not block: a link queues them (TCP) or posts
    /// them (verbs). Fails only if the rail is down (the engine moves the items on).
    ///
    /// # Safety
    /// Each item's `bytes` must lie in the memory the link reads, and stay valid and
    /// unmodified until the link reports the item (see the trait's contract).
    unsafe fn post(&mut self, rail: Rail, items: &[Item]) -> Result<(), LinkError>;

    /// Post `item` on `rail` with bytes the link holds on to itself (`bytes`: a copy out
    /// of the source, for a repair round or a failover of one), reported like any other
    /// item; `item.bytes` is not read. Must not block.
    fn post_copy(&mut self, rail: Rail, item: Item, bytes: Arc<[u8]>) -> Result<(), LinkError>;

    /// Send control message `bytes` on `rail`, after what was posted there; at most
    /// [`MAX_MESSAGE`] bytes, whole (a link whose own messages are smaller cuts it and
    /// puts it back together). Must not block for more than a queue's worth.
    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError>;

    /// The end of a pass, on every live rail: what the receiver needs to know that the
    /// pass is over (TCP: an end marker naming the rails given up, bit `r` of `failed`).
    /// Nothing for links whose completions mean landed.
    fn end_pass(&mut self, failed: u32) -> Result<(), LinkError>;

    /// Wait up to `wait` for events and append them to `out`; returns at once if some
    /// are there. Never waits longer than `wait`.
    fn poll(&mut self, wait: Duration, out: &mut Vec<SendEvent>) -> Result<(), LinkError>;

    /// Give `rail` up (the engine found it stalled): break it off, so that it reports
    /// [`SendEvent::Quiet`] soon. Idempotent.
    fn give_up(&mut self, rail: Rail);

    /// Stop reading every posted item, on every rail: break the link off and wait until
    /// nothing reads; bounded by the link's own timeout. The link carries nothing after.
    fn drain(&mut self);
}

/// Which items of a pass a receive expects: all of its unit's plan, or some.
#[derive(Debug, Clone, Copy)]
pub enum Which<'a> {
    All,
    /// Increasing item indices.
    Only(&'a [u32]),
}

impl Which<'_> {
    pub fn count(&self, plan: &ChunkPlan) -> u64 {
        match self {
            Which::All => plan.count(),
            Which::Only(list) => list.len() as u64,
        }
    }
}

/// The receiver's end of one connection over 1..=N rails: it lands items in the receive
/// buffer it was opened over (host memory directly, GPU memory by the link's own staging,
/// or whatever its NIC writes) at their offsets.
///
/// # Safety
/// The engine reads the receive buffer (checks, verification, writing it out) between
/// passes and where items have landed. So an implementation writes an item's place only
/// while it is expected and not yet reported [`RecvEvent::Landed`]: a copy that comes
/// later is dropped ([`RecvEvent::Copy`]), and nothing is written outside the places of
/// the expected items. The one exception is a buffer the peer's NIC writes itself
/// (RDMA WRITE), which no receiver can stop short of its registration's end: the link
/// says so ([`Caps::peer_writes_in_place`]), only bytes (plain data, every value valid)
/// change, and the engine takes nothing it read there for final before checking it again.
pub unsafe trait RecvLink {
    fn rails(&self) -> usize;

    fn caps(&self) -> Caps;

    /// Expect `which` items of `plan` (the pass's unit over the transfer) from here on.
    /// Must not block for long. The items of the pass before are no longer expected.
    fn expect(&mut self, plan: &ChunkPlan, which: Which<'_>) -> Result<(), LinkError>;

    /// The pass is over: nothing is expected until the next [`expect`](Self::expect).
    /// An item that comes meanwhile (the sender answered before the engine said what it
    /// expects) waits for it, within the link's timeout, and is then checked against it.
    fn expect_none(&mut self);

    /// The sender's next message, after what is expected already, is `len` bytes long
    /// exactly: a link whose receives are laid out in advance (verbs SENDs into their
    /// places) makes room for it there. Nothing for others. Must not block.
    fn expect_message(&mut self, _len: usize) {}

    /// Send control message `bytes` on `rail` (at most [`MAX_MESSAGE`], whole).
    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError>;

    /// Wait up to `wait` for events and append them to `out`.
    fn poll(&mut self, wait: Duration, out: &mut Vec<RecvEvent>) -> Result<(), LinkError>;

    /// Stop reading `rail` (the sender gave it up).
    fn give_up(&mut self, rail: Rail);

    /// Bytes taken off the wire so far, all rails, however they trickle: progress the
    /// engine's "nothing arrived for --timeout" counts, below the items.
    fn bytes_in(&self) -> u64;

    /// Break every rail off: a transfer that ends in error. Returns once nothing of the
    /// link writes the buffer.
    fn close(&mut self);
}
