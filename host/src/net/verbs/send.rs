//! The sender's end of a verbs link: one RC queue pair per rail. An item becomes one work
//! request on its rail's send queue (an RDMA WRITE into the receiver's buffer, or a SEND
//! into its posted receives); a control message becomes SENDs of its fragments
//! ([`super::messages`]); the receiver's messages come into receive slots kept posted.
//!
//! What is essential to verbs and only here:
//! - **Completions cover what came before.** The send queue runs in order, so a signaled
//!   completion says every earlier request of the queue is done; items are reported
//!   [`SendEvent::Sent`] then, all those it covers. An RC completion is the far NIC's
//!   acknowledgment: the bytes landed ([`Caps::sent_means_landed`]).
//! - **Immediates say what landed.** Writes with immediate carry `index + 1`: over one
//!   rail only signaled items carry one, and it covers the items of the pass before it
//!   (in order on one queue pair); over several rails every item carries its own. SENDs
//!   carry one only over several rails, where the receiver copies each in from a slot;
//!   over one rail its receives are posted in the order the items come.
//! - **Nothing waits in a call.** Items are queued on their rail and posted at the next
//!   poll, as one list (one doorbell); whatever cannot be posted then (no room in the send
//!   queue, no free slot) waits in the rail's queue, in order, and goes as completions
//!   free room. A control message goes at once, after what is queued before it. The CPU touches the source only to copy an item whose bytes must differ
//!   on the wire (the test-only fault injector) into a bounce slot of the connection.
//! - **Quiet after down.** A rail that fails is disconnected: its queue pair goes to the
//!   error state, where nothing queued runs and each request completes as flushed; once
//!   the last one that reads the source has completed (or two seconds passed, see
//!   [`Connection::quiesce`]) the rail is [`SendEvent::Quiet`].

use super::conn::{tag, Connection, Waited, INDEX_MASK, TAG_FRAGMENT, TAG_ITEM, TAG_SLOT};
use super::messages::{fragments, Reassembly};
use super::trace;
use crate::memory::{RegistrationTarget, SendSource};
use crate::net::{Caps, Item, LinkError, Pass, Rail, SendEvent, SendLink, MAX_MESSAGE};
use crate::rdma::{Completion, Deadline, MemoryRegion, RdmaError, SendOp, SendWr, POST_LIST_MAX};
use crate::transfer::faults::{FaultInjector, PeerLie};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod lies;
use lies::Rewrites;

/// Where a rail's items go on the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// SENDs into the receiver's posted receives.
    Send,
    /// RDMA WRITEs into the receiver's buffer at `addr`, with this rail's `rkey`.
    Write { addr: u64, rkey: u32 },
}

/// One opened rail, handed to the link: its connection, the source's memory registered
/// on its protection domain, and where its items go.
pub struct SendRail<'r> {
    pub(crate) conn: Connection<'r>,
    pub mr: &'r MemoryRegion<'r>,
    pub target: Target,
}

/// Receive slots a sender keeps posted for the receiver's messages.
pub const REPLY_SLOTS: usize = 16;
/// Send slots for this side's message fragments.
pub const SEND_SLOTS: usize = 8;
/// Bounce slots for copies (each as large as the largest item).
const BOUNCE_SLOTS: usize = 8;
/// How long a rail that went down may take to flush its requests before it is taken for
/// quiet anyway (as [`Connection::quiesce`]).
const QUIET_WAIT: Duration = Duration::from_secs(2);
/// Work requests handed to the provider per call (one doorbell for all): Soft-RoCE does
/// its protocol work in the doorbell's system call, so at 4 KiB a call per request cost
/// about a third of the throughput (tests/softroce/BENCH.md); 16 takes most of the gain
/// and keeps the first requests of a window from waiting long for the rest.
const POST_BATCH: usize = 16;
/// How long a poll over several rails sleeps when none had news.
const IDLE_NAP: Duration = Duration::from_micros(100);

/// A request waiting for room to be posted.
enum Waiting {
    /// An item whose bytes are the source's.
    Source(Item),
    /// An item whose bytes are the link's own copy.
    Copy(Item, Arc<[u8]>),
    Fragment(Vec<u8>),
    /// TEST ONLY (`--test-peer-lies rewrite`): a WRITE of bounce slot `slot`'s `len`
    /// bytes at `offset` of the receiver's buffer, outside any pass.
    Lie {
        slot: usize,
        offset: u64,
        len: usize,
    },
}

/// A posted request, in the order of the send queue.
struct Out {
    seq: u64,
    what: Posted,
}

enum Posted {
    Item {
        pass: Pass,
        index: u64,
        /// The NIC reads the source's memory for it (not a bounce slot).
        reads_source: bool,
        bounce: Option<usize>,
    },
    Fragment {
        /// The send slot it went from (`None`: inline).
        slot: Option<usize>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    /// Disconnected at `since`; requests may still read the source until flushed.
    Down {
        since: Instant,
    },
    Quiet,
}

struct RailState<'r> {
    /// First: the queue pair is destroyed before anything its requests name.
    conn: Connection<'r>,
    mr: &'r MemoryRegion<'r>,
    target: Target,
    state: State,
    waiting: VecDeque<Waiting>,
    out: VecDeque<Out>,
    next_seq: u64,
    /// Unsignaled requests posted since the last signaled one.
    unsignaled: usize,
    free_send_slots: Vec<usize>,
    free_bounce: Vec<usize>,
    reassembly: Reassembly,
}

/// The sender's end of a verbs link over 1..=N rails.
pub struct VerbsSender<'r> {
    rails: Vec<RailState<'r>>,
    /// Several rails: every item is signaled and carries its own immediate.
    striped: bool,
    /// Largest item (a bounce slot's size).
    item_len: usize,
    /// The source's bytes in host memory (from its registration target, valid while
    /// the source is borrowed), for the fault injector's copies.
    host: Option<(NonNull<u8>, usize)>,
    faults: Option<FaultInjector>,
    /// Test only (`--test-peer-lies`).
    lies: Option<PeerLie>,
    rewrites: Option<Rewrites>,
    comps: Vec<Completion>,
    wrs: Vec<SendWr<'r>>,
}

impl<'r> VerbsSender<'r> {
    /// A link over `rails` (receive slots posted on each already, see `post_replies`),
    /// items of at most `item_len` bytes of `source` (registered on each rail);
    /// `striped`: the offer named several rails (the receiver then takes every item by
    /// its own immediate, however many joined). `faults` (test only) needs the source in
    /// host memory; `lies` (test only) break the protocol in items' first sending.
    ///
    /// # Errors
    /// A fault injector without the source in host memory.
    pub fn new(
        rails: Vec<SendRail<'r>>,
        striped: bool,
        item_len: usize,
        source: &'r dyn SendSource,
        faults: Option<FaultInjector>,
        lies: Option<PeerLie>,
    ) -> Result<VerbsSender<'r>, LinkError> {
        // The CPU reads the source only to copy an item a fault is injected into; the
        // source's memory stays valid and in place while it is borrowed ('r: Registrable).
        let host = match source.memory().target() {
            RegistrationTarget::Host { ptr, len } => Some((ptr, len)),
            _ => None,
        };
        if lies == Some(PeerLie::Rewrite)
            && (host.is_none() || rails.iter().any(|r| r.target == Target::Send))
        {
            return Err(LinkError(
                "--test-peer-lies rewrite needs --op write and the data in host memory".into(),
            ));
        }
        if faults.is_some() && host.is_none() {
            return Err(LinkError(
                "--test-inject-faults needs the data in host memory (--mem host, staged or mapped): it corrupts a copy the CPU makes".into(),
            ));
        }
        let rails = rails
            .into_iter()
            .map(|r| RailState {
                free_send_slots: (0..r.conn.slots().2).rev().collect(),
                conn: r.conn,
                mr: r.mr,
                target: r.target,
                state: State::Live,
                waiting: VecDeque::new(),
                out: VecDeque::new(),
                next_seq: 0,
                unsignaled: 0,
                free_bounce: (0..BOUNCE_SLOTS).rev().collect(),
                reassembly: Reassembly::default(),
            })
            .collect();
        Ok(VerbsSender {
            rails,
            striped,
            item_len: item_len.max(1),
            host,
            faults,
            lies,
            rewrites: None,
            comps: Vec::with_capacity(64),
            wrs: Vec::with_capacity(POST_LIST_MAX),
        })
    }

    /// Disconnect every rail and wait up to `grace` for the receiver's side of each
    /// (the first rail's, the longest): the end of a connection that went well.
    pub fn close(&mut self, grace: Duration) {
        for (r, rail) in self.rails.iter().enumerate() {
            let wait = if r == 0 {
                grace
            } else {
                grace.min(RAIL_CLOSE_GRACE)
            };
            rail.conn.close(true, wait);
        }
    }

    /// The device of the first rail.
    pub fn device(&self) -> Option<String> {
        self.rails.first().and_then(|r| r.conn.id.device_name())
    }

    fn down(&mut self, r: Rail, why: String, events: &mut Vec<SendEvent>) {
        let rail = &mut self.rails[r];
        if rail.state != State::Live {
            return;
        }
        let _ = rail.conn.id.disconnect();
        rail.state = State::Down {
            since: Instant::now(),
        };
        rail.waiting.clear();
        events.push(SendEvent::Down { rail: r, why });
    }

    /// Poll rail `r`'s completion queue once and take what it held.
    fn take_completions(
        &mut self,
        r: Rail,
        events: &mut Vec<SendEvent>,
    ) -> Result<usize, RdmaError> {
        self.comps.clear();
        let polled = self.rails[r].conn.cq.poll(&mut self.comps);
        let comps = std::mem::take(&mut self.comps);
        for c in &comps {
            self.take(r, c, events);
        }
        self.comps = comps;
        polled
    }

    /// Rail `r`'s receiver disconnected: take the completions that land within
    /// [`LAST_WORDS`] first. Its last message (a too-slow ack, say) went before its
    /// disconnect, but the CM's event can overtake that message's completion (seen under
    /// Soft-RoCE: the sender said "the receiver disconnected" instead of the receiver's
    /// reason), and a rail that is down stops being polled once nothing of it reads the
    /// source. Ends early once a message came.
    fn last_words(&mut self, r: Rail, events: &mut Vec<SendEvent>) {
        let until = Instant::now() + LAST_WORDS;
        loop {
            let polled = self.take_completions(r, events);
            let heard = events
                .iter()
                .any(|e| matches!(e, SendEvent::Message { rail, .. } if *rail == r));
            if heard
                || polled.is_err()
                || self.rails[r].state != State::Live
                || Instant::now() >= until
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Post what waits on rail `r` while there is room, in order.
    fn pump(&mut self, r: Rail) -> Result<(), String> {
        let striped = self.striped;
        let (item_len, host, faults) = (self.item_len, self.host, self.faults);
        let lies = self.lies;
        let rail = &mut self.rails[r];
        if rail.state != State::Live {
            return Ok(());
        }
        let sq = rail.conn.qp.caps().max_send_wr as usize;
        let inline_max = rail.conn.qp.caps().max_inline_data as usize;
        self.wrs.clear();
        while let Some(next) = rail.waiting.front() {
            if rail.out.len() >= sq {
                break;
            }
            let seq = rail.next_seq;
            match next {
                Waiting::Fragment(bytes) => {
                    let inline = bytes.len() <= inline_max;
                    if !inline && rail.free_send_slots.is_empty() {
                        break;
                    }
                    // Fragments go after the items before them: post those first.
                    post_list(&rail.conn, &mut self.wrs)?;
                    let slot = match inline {
                        true => {
                            rail.conn
                                .qp
                                .post_send_inline(TAG_FRAGMENT | seq, bytes)
                                .map_err(|e| e.to_string())?;
                            None
                        }
                        false => {
                            let slot = rail.free_send_slots.pop().expect("checked above");
                            // SAFETY: the slot was free: its last request's completion was
                            // polled (it is given back only then).
                            unsafe { rail.conn.send_slot(TAG_FRAGMENT | seq, slot, bytes) }
                                .map_err(|e| e.to_string())?;
                            Some(slot)
                        }
                    };
                    rail.out.push_back(Out {
                        seq,
                        what: Posted::Fragment { slot },
                    });
                    rail.unsignaled = 0;
                }
                &Waiting::Lie { slot, offset, len } => {
                    post_list(&rail.conn, &mut self.wrs)?;
                    self.wrs
                        .push(lies::rewrite_wr(rail, slot, offset, len, seq)?);
                    post_list(&rail.conn, &mut self.wrs)?;
                    rail.out.push_back(Out {
                        seq,
                        what: Posted::Fragment { slot: None },
                    });
                    rail.unsignaled = 0;
                }
                Waiting::Source(item) | Waiting::Copy(item, _) => {
                    // The bytes that go: the source's, else a copy in a bounce slot (a
                    // repair round's, or a fault injected into a copy of the source's).
                    let copy: Option<Vec<u8>> = match next {
                        Waiting::Copy(item, bytes) => {
                            let mut copy = bytes.to_vec();
                            if let Some(f) = faults {
                                f.corrupt(&mut copy, item.index, item.attempt);
                            }
                            Some(copy)
                        }
                        _ => match faults {
                            Some(f) if f.hits(item.index, item.attempt) => {
                                let (base, len) = host.expect("checked in new");
                                if item.bytes.end > len {
                                    return Err(format!(
                                        "item {} lies outside the source",
                                        item.index
                                    ));
                                }
                                // SAFETY: the range lies in the source's host memory, which
                                // the engine keeps valid and unmodified until the item is
                                // reported (SendLink's contract); it is only read here.
                                let bytes = unsafe {
                                    std::slice::from_raw_parts(
                                        base.as_ptr().add(item.bytes.start),
                                        item.bytes.len(),
                                    )
                                };
                                let mut copy = bytes.to_vec();
                                f.corrupt(&mut copy, item.index, item.attempt);
                                Some(copy)
                            }
                            _ => None,
                        },
                    };
                    if copy.is_some() && rail.free_bounce.is_empty() {
                        break;
                    }
                    let bounce = copy
                        .as_ref()
                        .map(|_| rail.free_bounce.pop().expect("checked"));
                    let sge = match (&copy, bounce) {
                        (Some(bytes), Some(slot)) => {
                            // SAFETY: the slot was free (given back once its request's
                            // completion, or a later one covering it, was polled).
                            unsafe { rail.conn.bounce_sge((BOUNCE_SLOTS, item_len), slot, bytes) }
                        }
                        _ => match lies {
                            // TEST ONLY: a byte past the item (where the source has one).
                            Some(PeerLie::Oversize)
                                if item.index == 0
                                    && item.attempt == 0
                                    && rail.target == Target::Send =>
                            {
                                let longer = item.bytes.start..item.bytes.end + 1;
                                rail.mr
                                    .sge(longer)
                                    .or_else(|_| rail.mr.sge(item.bytes.clone()))
                            }
                            _ => rail.mr.sge(item.bytes.clone()),
                        },
                    }
                    .map_err(|e| e.to_string())?;
                    // A bounce slot is given back only on a completion: signaled. So is
                    // every item over several rails, and one in half a queue.
                    let signaled = item.signaled
                        || striped
                        || bounce.is_some()
                        || rail.unsignaled + 1 >= sq / 2;
                    // Items through this one (< 2^32).
                    let imm = (item.index + 1) as u32;
                    // TEST ONLY: an immediate that names no item of the transfer.
                    let lie_index = lies == Some(PeerLie::Index) && item.attempt == 0;
                    let imm = match lie_index {
                        true => imm.wrapping_add(1 << 31),
                        false => imm,
                    };
                    let op = match rail.target {
                        Target::Write { addr, rkey } => {
                            let remote_addr = addr + item.offset;
                            match signaled {
                                true => SendOp::WriteWithImm {
                                    remote_addr,
                                    rkey,
                                    imm,
                                },
                                false => SendOp::Write { remote_addr, rkey },
                            }
                        }
                        Target::Send if striped || lie_index => SendOp::SendWithImm(imm),
                        Target::Send => SendOp::Send,
                    };
                    self.wrs.push(SendWr {
                        wr_id: TAG_ITEM | seq,
                        sge,
                        op,
                        signaled,
                        inline: false,
                        // The receiver may sleep until one of these.
                        solicited: signaled,
                    });
                    rail.unsignaled = if signaled { 0 } else { rail.unsignaled + 1 };
                    rail.out.push_back(Out {
                        seq,
                        what: Posted::Item {
                            pass: item.pass,
                            index: item.index,
                            reads_source: copy.is_none(),
                            bounce,
                        },
                    });
                    if self.wrs.len() == POST_LIST_MAX {
                        post_list(&rail.conn, &mut self.wrs)?;
                    }
                }
            }
            trace!("send rail {r}: posted seq {seq} ({} out)", rail.out.len());
            rail.next_seq += 1;
            rail.waiting.pop_front();
        }
        post_list(&rail.conn, &mut self.wrs)
    }

    /// Take one completion of rail `r`.
    fn take(&mut self, r: Rail, c: &Completion, events: &mut Vec<SendEvent>) {
        let index = c.wr_id & INDEX_MASK;
        trace!(
            "send rail {r}: completion tag {:#x} index {index} status {} bytes {} imm {:?}",
            tag(c.wr_id) >> 56,
            c.status_str(),
            c.byte_len,
            c.imm
        );
        if tag(c.wr_id) == TAG_SLOT {
            if !c.is_ok() {
                self.down(
                    r,
                    format!(
                        "a receive for the receiver's messages failed: {}",
                        c.status_str()
                    ),
                    events,
                );
                return;
            }
            let rail = &mut self.rails[r];
            let bytes = rail.conn.read_slot(index as usize, c.byte_len as usize);
            // SAFETY: the slot was just read; nothing reads it again before this receive
            // completes.
            let reposted = unsafe { rail.conn.post_slot_recv(TAG_SLOT | index, index as usize) };
            let message = rail.reassembly.take(&bytes);
            match (reposted, message) {
                (Err(e), _) => self.down(r, format!("reposting a receive: {e}"), events),
                (_, Err(why)) => self.down(r, format!("the receiver's message: {why}"), events),
                (Ok(()), Ok(Some(bytes))) => {
                    trace!(
                        "send rail {r}: message of {} bytes ({:?})",
                        bytes.len(),
                        String::from_utf8_lossy(&bytes[..bytes.len().min(4)])
                    );
                    events.push(SendEvent::Message { rail: r, bytes })
                }
                (Ok(()), Ok(None)) => {}
            }
            return;
        }
        if !c.is_ok() && self.rails[r].state == State::Live {
            let why = self.rails[r]
                .conn
                .device_fault_within(DEVICE_EVENT_GRACE)
                .unwrap_or_else(|| self.failure(r, c));
            self.down(r, why, events);
        }
        let live = self.rails[r].state == State::Live;
        let rail = &mut self.rails[r];
        let mut sent: Option<(Pass, Vec<u64>)> = None;
        while rail.out.front().is_some_and(|o| o.seq <= index) {
            let out = rail.out.pop_front().expect("checked");
            match out.what {
                Posted::Fragment { slot } => rail.free_send_slots.extend(slot),
                Posted::Item {
                    pass,
                    index,
                    bounce,
                    ..
                } => {
                    rail.free_bounce.extend(bounce);
                    if !live {
                        continue; // a failed rail's items are the engine's to move
                    }
                    match &mut sent {
                        Some((p, items)) if *p == pass => items.push(index),
                        _ => {
                            if let Some((pass, items)) = sent.take() {
                                events.push(sent_event(r, pass, items));
                            }
                            sent = Some((pass, vec![index]));
                        }
                    }
                }
            }
        }
        if let Some((pass, items)) = sent {
            events.push(sent_event(r, pass, items));
        }
    }

    /// Why a failed completion broke its rail.
    fn failure(&self, r: Rail, c: &Completion) -> String {
        let what = match self.rails[r].out.front().map(|o| &o.what) {
            Some(Posted::Fragment { .. }) => "the SEND of a message".to_string(),
            Some(Posted::Item { index, .. }) => {
                let op = match self.rails[r].target {
                    Target::Write { .. } => "RDMA_WRITE",
                    Target::Send => "SEND",
                };
                format!("{op} of item {index}")
            }
            None => "a request".into(),
        };
        let hint = if c.is_connection_loss() {
            " (the receiver went away?)"
        } else {
            ""
        };
        format!("{what} failed: {}{hint}", c.status_str())
    }

    /// Take what every rail has now; down rails that broke, quiet ones that flushed.
    fn sweep(&mut self, events: &mut Vec<SendEvent>) {
        for r in 0..self.rails.len() {
            if self.rails[r].state == State::Quiet {
                continue;
            }
            let polled = self.take_completions(r, events);
            if let Err(e) = polled {
                self.down(r, e.to_string(), events);
            }
            // Completions free room: what waits goes now (nothing else would wake it).
            if let Err(why) = self.pump(r) {
                self.down(r, format!("posting failed: {why}"), events);
            }
            if self.rails[r].state == State::Live {
                match self.rails[r].conn.poll_events() {
                    Ok(false) => {}
                    Ok(true) => {
                        self.last_words(r, events);
                        self.down(r, "the receiver disconnected".into(), events)
                    }
                    Err(RdmaError::DeviceFault(f)) => self.down(r, f, events),
                    Err(e) => self.down(r, e.to_string(), events),
                }
            }
            let rail = &mut self.rails[r];
            if let State::Down { since } = rail.state {
                let reading = rail.out.iter().any(|o| {
                    matches!(
                        o.what,
                        Posted::Item {
                            reads_source: true,
                            ..
                        }
                    )
                });
                if !reading || since.elapsed() >= QUIET_WAIT {
                    rail.state = State::Quiet;
                    rail.out.clear();
                    events.push(SendEvent::Quiet { rail: r });
                }
            }
        }
    }
}

/// How long a disconnected receiver's last message may trail its disconnect event.
const LAST_WORDS: Duration = Duration::from_millis(20);
/// A rail's closing wait beyond the first.
const RAIL_CLOSE_GRACE: Duration = Duration::from_millis(500);
/// How long a failed request waits for a device event that explains it.
const DEVICE_EVENT_GRACE: Duration = Duration::from_millis(200);

fn sent_event(rail: Rail, pass: Pass, items: Vec<u64>) -> SendEvent {
    SendEvent::Sent {
        rail,
        pass,
        items,
        crcs: Vec::new(),
    }
}

/// Post `wrs` as one list (one doorbell) and empty it.
fn post_list<'r>(conn: &Connection<'r>, wrs: &mut Vec<SendWr<'r>>) -> Result<(), String> {
    if wrs.is_empty() {
        return Ok(());
    }
    // SAFETY: every SGE names the source's registered memory, whose bytes the engine keeps
    // unmodified until the item is reported (SendLink's contract, relayed by `post`), or a
    // bounce slot of the connection that no other outstanding request uses (but the
    // test-only rewrites', which many read and nothing writes after the first).
    let posted = unsafe { conn.qp.post_send_list(wrs) };
    wrs.clear();
    posted.map_err(|e| e.to_string())
}

/// Post every receive slot of `conn` for the receiver's messages (before the connect, so
/// none is missing when the first comes).
pub(crate) fn post_replies(conn: &Connection) -> Result<(), RdmaError> {
    for slot in 0..conn.slots().0 {
        // SAFETY: a slot is read only after its receive completed (`take`).
        unsafe { conn.post_slot_recv(TAG_SLOT | slot as u64, slot)? };
    }
    Ok(())
}

// SAFETY: an item is reported Sent only from a polled completion that covers its
// request (the send queue completes in order: nothing of the NIC reads it any more); a
// rail that went down reports nothing Sent and says Quiet only once no request that
// reads the source is outstanding (each completed, successful or flushed) or two seconds
// after its queue pair went to the error state, where none runs any more; `drain` does
// the same for every rail before it returns.
unsafe impl SendLink for VerbsSender<'_> {
    fn rails(&self) -> usize {
        self.rails.len()
    }

    fn caps(&self) -> Caps {
        Caps {
            post_batch: POST_BATCH,
            ..Caps::QUEUE_PAIR
        }
    }

    /// # Safety
    /// As [`SendLink::post`] says.
    unsafe fn post(&mut self, rail: Rail, items: &[Item]) -> Result<(), LinkError> {
        let item_len = self.item_len;
        let r = self.live(rail)?;
        for item in items {
            if item.bytes.len() > item_len || item.bytes.end > r.mr.len() {
                return Err(LinkError(format!(
                    "item {} ({} bytes at {}) does not fit the source",
                    item.index,
                    item.bytes.len(),
                    item.bytes.start
                )));
            }
            r.waiting.push_back(Waiting::Source(item.clone()));
        }
        // Posted at the next poll, with whatever else came meanwhile: one doorbell.
        Ok(())
    }

    fn post_copy(&mut self, rail: Rail, item: Item, bytes: Arc<[u8]>) -> Result<(), LinkError> {
        if bytes.len() > self.item_len {
            return Err(LinkError(format!(
                "a copy of {} bytes is larger than an item",
                bytes.len()
            )));
        }
        self.live(rail)?
            .waiting
            .push_back(Waiting::Copy(item, bytes));
        Ok(())
    }

    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(LinkError(format!(
                "a message of {} bytes (at most {MAX_MESSAGE})",
                bytes.len()
            )));
        }
        self.arm_rewrites(bytes);
        let r = self.live(rail)?;
        r.waiting.extend(fragments(bytes).map(Waiting::Fragment));
        self.pump(rail).map_err(LinkError)
    }

    fn end_pass(&mut self, _failed: u32) -> Result<(), LinkError> {
        // A completion says the bytes landed: the receiver needs no word.
        Ok(())
    }

    fn poll(&mut self, wait: Duration, out: &mut Vec<SendEvent>) -> Result<(), LinkError> {
        let deadline = Instant::now() + wait;
        let before = out.len();
        loop {
            self.rewrite_when_due()?;
            self.sweep(out);
            let now = Instant::now();
            if out.len() > before || now >= deadline {
                return Ok(());
            }
            // A rewrite due (test only) wakes the wait.
            let deadline = match self.rewrite_due() {
                Some(due) => deadline.min(due.max(now)),
                None => deadline,
            };
            let live: Vec<Rail> = (0..self.rails.len())
                .filter(|&r| self.rails[r].state != State::Quiet)
                .collect();
            match live.as_slice() {
                [] => return Ok(()),
                // One rail: sleep on its completion channel (or spin, busy-polling).
                [r] if self.rails[*r].state == State::Live => {
                    self.comps.clear();
                    let d = Deadline::after(deadline - now);
                    let waited = self.rails[*r].conn.wait(&mut self.comps, &d, "completions");
                    let comps = std::mem::take(&mut self.comps);
                    for c in &comps {
                        self.take(*r, c, out);
                    }
                    self.comps = comps;
                    match waited {
                        Ok(Waited::Completions) | Err(RdmaError::Timeout { .. }) => {}
                        Ok(Waited::Disconnected) => {
                            // The receiver's last words come before its disconnect.
                            self.last_words(*r, out);
                            self.sweep(out);
                            self.down(*r, "the receiver disconnected".into(), out);
                        }
                        Err(RdmaError::DeviceFault(f)) => self.down(*r, f, out),
                        Err(e) => self.down(*r, e.to_string(), out),
                    }
                }
                _ => std::thread::sleep(IDLE_NAP.min(deadline - now)),
            }
        }
    }

    fn give_up(&mut self, rail: Rail) {
        let mut ignored = Vec::new();
        self.down(rail, String::new(), &mut ignored);
    }

    fn drain(&mut self) {
        let mut ignored = Vec::new();
        for r in 0..self.rails.len() {
            self.down(r, String::new(), &mut ignored);
        }
        let deadline = Instant::now() + QUIET_WAIT + Duration::from_millis(100);
        while self.rails.iter().any(|r| r.state != State::Quiet) && Instant::now() < deadline {
            self.sweep(&mut ignored);
            std::thread::sleep(IDLE_NAP);
        }
    }
}

impl<'r> VerbsSender<'r> {
    fn live(&mut self, rail: Rail) -> Result<&mut RailState<'r>, LinkError> {
        match self.rails.get_mut(rail) {
            Some(r) if r.state == State::Live => Ok(r),
            Some(_) => Err(LinkError(format!("rail {rail} is down"))),
            None => Err(LinkError(format!("no rail {rail}"))),
        }
    }
}
