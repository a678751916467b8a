//! The receiver's end of a verbs link: one RC queue pair per rail, over the receive
//! buffer registered on each rail's protection domain. Three ways items land, by the
//! offer's operation and rail count:
//!
//! - **Write** (`--op write`): the sender's NIC writes each item in place; every receive
//!   is a slot that takes either a write's immediate (which item landed: over one rail
//!   it covers the items of the pass before it, RC being in order; over several each
//!   names its own) or a fragment of a control message.
//! - **Send in place** (`--op send`, one rail): receives are posted in the order the
//!   sender sends, each at its item's place in the buffer or, where the engine said a
//!   message comes next ([`RecvLink::expect_message`]), in a slot. Nothing is copied;
//!   what comes before its receive is posted waits in the sender's NIC ("receiver not
//!   ready", retried every 0.64 ms).
//! - **Send copied** (`--op send` over several rails, where no receive can know which
//!   item its rail brings): every receive is a slot of a chunk's size; a SEND with
//!   immediate is an item, copied into its place by the CPU (host memory only).
//!
//! Further rails join by the token of the offer's accept: the listener routes each join
//! here ([`Joining`]), where the buffer is registered on its device and the rail
//! accepted, while the transfer runs.

use super::conn::{tag, Connection, Waited, INDEX_MASK, TAG_FRAGMENT, TAG_SLOT};
use super::messages::{fragment_count, fragments, Reassembly};
use super::rail::{accept, prepare, Mode, RailSetup, RecvRail};
use super::trace;
use crate::memory::{RecvSink, Registrable, RegistrationTarget};
use crate::net::joins::JoinSlot;
use crate::net::{Caps, LinkError, Rail, RecvEvent, RecvLink, Which, MAX_MESSAGE};
use crate::rdma::{Completion, Deadline, MemoryRegion, RdmaError, SendableRequest};
use crate::transfer::plan::ChunkPlan;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Further rails of a striped transfer: where the listener routes them, and the buffer
/// they are registered over.
pub struct Joining<'r> {
    pub slot: JoinSlot<SendableRequest>,
    pub memory: &'r dyn Registrable,
    pub setup: RailSetup,
}

/// What each posted receive takes, in the order posted.
#[derive(Debug, Clone, Copy)]
enum Posted {
    Slot(usize),
    /// Item `index` of the pass, in place (send in place).
    Place {
        index: u64,
        len: u64,
    },
}

struct RailState<'r> {
    rail: RecvRail<'r>,
    posted: VecDeque<Posted>,
    free_slots: Vec<usize>,
    reassembly: Reassembly,
    outbox: VecDeque<Vec<u8>>,
    free_send: Vec<usize>,
    sends_out: usize,
    /// Delivered a message (a send completed well) since asked.
    delivered: bool,
    down: bool,
}

/// The pass expected.
struct Expecting {
    plan: ChunkPlan,
    only: Option<Vec<u32>>,
    count: usize,
    /// Several rails: which positions landed.
    landed: Option<Vec<bool>>,
    /// One rail: positions below this landed (items land in order).
    through: usize,
}

impl Expecting {
    fn position(&self, index: u64) -> Option<usize> {
        match &self.only {
            None => (index < self.count as u64).then_some(index as usize),
            Some(list) => u32::try_from(index)
                .ok()
                .and_then(|i| list.binary_search(&i).ok()),
        }
    }

    fn index(&self, position: usize) -> u64 {
        match &self.only {
            None => position as u64,
            Some(list) => list[position] as u64,
        }
    }
}

/// What the next receives of a send-in-place rail take, in order.
enum Next {
    /// The expected pass's items, from this position on.
    Items(usize),
    /// A message of this many fragments.
    Message(usize),
}

/// An item that came before its pass was expected (the sender answered first).
struct Early {
    rail: Rail,
    index: u64,
    /// Its bytes, where they came in a slot (send copied).
    bytes: Option<Vec<u8>>,
}

/// The items that came before their pass was expected, held until it is, within a
/// budget ([`early_budget`]): a peer that sends what nobody asked for cannot grow them
/// past it.
struct EarlyItems {
    items: Vec<Early>,
    /// What `items` hold ([`EARLY_COST`] an item besides its bytes).
    held: usize,
    budget: usize,
}

impl EarlyItems {
    fn new(buffer_len: usize) -> EarlyItems {
        EarlyItems {
            items: Vec::new(),
            held: 0,
            budget: early_budget(buffer_len),
        }
    }

    /// Hold item `index` of rail `r` (with its `bytes`, copied).
    ///
    /// # Errors
    /// It would take the items past the budget (nothing is held): the protocol error.
    fn hold(&mut self, rail: Rail, index: u64, bytes: Option<&[u8]>) -> Result<(), String> {
        let held = self
            .held
            .saturating_add(EARLY_COST + bytes.map_or(0, <[u8]>::len));
        if held > self.budget {
            return Err(format!(
                "protocol error: items that came before they were asked for would hold {held} bytes (at most {}): the sender sends what was not asked for",
                self.budget
            ));
        }
        self.held = held;
        self.items.push(Early {
            rail,
            index,
            bytes: bytes.map(<[u8]>::to_vec),
        });
        Ok(())
    }

    /// Every item held, in the order they came; none is held after.
    fn take(&mut self) -> Vec<Early> {
        self.held = 0;
        std::mem::take(&mut self.items)
    }
}

/// The receiver's end of a verbs link.
pub struct VerbsReceiver<'r> {
    rails: Vec<Option<RailState<'r>>>,
    mode: Mode,
    /// The buffer on rail 0's device (send in place: receives name it).
    sink: &'r MemoryRegion<'r>,
    /// The buffer in host memory (send copied: items are copied there).
    host: Option<(NonNull<u8>, usize)>,
    expecting: Option<Expecting>,
    next: VecDeque<Next>,
    early: EarlyItems,
    /// The most items a pass has named on this link (its finest unit plan so far, over
    /// every transfer of the connection): a late copy never names more.
    items_ever: u64,
    recv_depth: usize,
    joining: Option<Joining<'r>>,
    bytes_in: u64,
    comps: Vec<Completion>,
    /// Events of items that had come early, for the next poll.
    early_events: Vec<RecvEvent>,
}

/// What an early item costs besides its bytes (so items without bytes count too).
const EARLY_COST: usize = 64;

/// The most that items come before their pass may hold: twice what a whole pass of a
/// `buffer_len`-byte transfer brings (its bytes, and an item per 4 KiB of them), and
/// 64 MiB. An honest sender sends items only once they are asked for, and a pass is
/// expected before it is asked; items come early only where this side polls first (the
/// first pass, while its name message is read), so at most a pass's worth. A peer that
/// sends while no pass is expected would otherwise grow this list, and its bytes, until
/// the transfer's deadline.
fn early_budget(buffer_len: usize) -> usize {
    let per_pass = buffer_len.saturating_add(buffer_len / 4096 * EARLY_COST);
    per_pass.saturating_mul(2).saturating_add(64 << 20)
}

/// How long a poll over several rails sleeps when none had news.
const IDLE_NAP: Duration = Duration::from_micros(100);
/// How long [`VerbsReceiver::close`] lets this side's last messages leave.
const SEND_GRACE: Duration = Duration::from_secs(1);

impl<'r> VerbsReceiver<'r> {
    /// A link over rail 0 (`first`, not accepted yet) of `rails`, landing items in
    /// `buffer` (registered on rail 0 as `sink`) by `mode`, with `recv_depth` receives
    /// posted per rail; `named`: the sender's first message is its name; `joining`:
    /// where further rails come from.
    ///
    /// # Errors
    /// Send copied needs the buffer in host memory; posting the first receives failed.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        first: RecvRail<'r>,
        rails: usize,
        mode: Mode,
        buffer: &'r dyn RecvSink,
        sink: &'r MemoryRegion<'r>,
        recv_depth: usize,
        named: bool,
        joining: Option<Joining<'r>>,
    ) -> Result<VerbsReceiver<'r>, LinkError> {
        // Where copies land: the buffer's memory, valid and in place while borrowed
        // ('r: Registrable), written only at an expected item's place (RecvLink).
        let host = match buffer.memory().target() {
            RegistrationTarget::Host { ptr, len } => Some((ptr, len)),
            _ => None,
        };
        if mode == Mode::SendCopied && host.is_none() {
            return Err(LinkError(
                "SENDs over several rails are copied in by the CPU: the buffer must be in host memory".into(),
            ));
        }
        let mut link = VerbsReceiver {
            rails: (0..rails.max(1)).map(|_| None).collect(),
            mode,
            sink,
            host,
            expecting: None,
            next: VecDeque::new(),
            early: EarlyItems::new(buffer.memory().target().len()),
            items_ever: 0,
            recv_depth,
            joining,
            bytes_in: 0,
            comps: Vec::with_capacity(64),
            early_events: Vec::new(),
        };
        if named && mode == Mode::SendInPlace {
            link.next.push_back(Next::Message(1));
        }
        link.add_rail(0, first)
            .map_err(|e| LinkError(e.to_string()))?;
        Ok(link)
    }

    fn add_rail(&mut self, r: Rail, rail: RecvRail<'r>) -> Result<(), RdmaError> {
        let (slots, _, send_slots) = rail.conn.slots();
        let mut state = RailState {
            rail,
            posted: VecDeque::new(),
            free_slots: (0..slots).rev().collect(),
            reassembly: Reassembly::default(),
            outbox: VecDeque::new(),
            free_send: (0..send_slots).rev().collect(),
            sends_out: 0,
            delivered: false,
            down: false,
        };
        if self.mode != Mode::SendInPlace {
            // Every receive a slot, kept posted.
            while let Some(slot) = state.free_slots.pop() {
                post_slot(&state.rail.conn, slot)?;
                state.posted.push_back(Posted::Slot(slot));
            }
        }
        self.rails[r] = Some(state);
        if self.mode == Mode::SendInPlace {
            self.refill()?;
        }
        Ok(())
    }

    /// Accept rail 0's request with `private_data` (its receives are posted).
    pub fn accept_first(
        &self,
        request: &crate::rdma::ConnectRequest,
        private_data: &[u8],
    ) -> Result<(), RdmaError> {
        let s = self.rails[0]
            .as_ref()
            .expect("rail 0 is there from the start");
        accept(request, &s.rail.conn, private_data)
    }

    /// The sender's address on each rail, where known.
    pub fn rails_from(&self) -> Vec<Option<String>> {
        self.rails
            .iter()
            .map(|r| {
                let r = r.as_ref()?;
                r.rail.conn.id.peer_addr().map(|a| a.to_string())
            })
            .collect()
    }

    /// Send `bytes` on every live rail and wait up to `timeout` until one delivered it
    /// (the connection's last ack); whether one did.
    pub fn deliver(&mut self, bytes: &[u8], timeout: Duration) -> bool {
        for r in 0..self.rails.len() {
            if let Some(s) = self.rails[r].as_mut() {
                s.delivered = false;
            }
            let _ = self.send_message(r, bytes);
        }
        let deadline = Instant::now() + timeout;
        let mut ignored = Vec::new();
        loop {
            let states = || self.rails.iter().flatten();
            if states().any(|s| s.delivered) {
                return true;
            }
            if states().all(|s| s.down || s.sends_out == 0 && s.outbox.is_empty())
                || Instant::now() >= deadline
            {
                return false;
            }
            ignored.clear();
            self.sweep(&mut ignored);
            std::thread::sleep(IDLE_NAP);
        }
    }

    /// After [`close`](RecvLink::close): wait up to `grace` for the sender's disconnect
    /// on rail 0.
    pub fn wait_closed(&self, grace: Duration) {
        if let Some(s) = self.rails.first().and_then(|r| r.as_ref()) {
            s.rail.conn.close(false, grace);
        }
    }

    /// Post the receives a send-in-place rail needs next, as far as its depth allows.
    fn refill(&mut self) -> Result<(), RdmaError> {
        let Some(state) = self.rails[0].as_mut() else {
            return Ok(());
        };
        while state.posted.len() < self.recv_depth {
            match self.next.front_mut() {
                Some(Next::Items(next)) => {
                    let Some(e) = self.expecting.as_ref().filter(|e| *next < e.count) else {
                        self.next.pop_front();
                        continue;
                    };
                    let index = e.index(*next);
                    let chunk = e.plan.get(index).ok_or_else(|| {
                        RdmaError::InvalidArgument(format!("item {index} outside the plan"))
                    })?;
                    let sge = self.sink.sge(chunk.offset as usize..chunk.end() as usize)?;
                    // SAFETY: the engine reads an item's place only once the item is
                    // reported landed, which happens only after this receive completed
                    // (RecvLink's contract); the region outlives the queue pair.
                    unsafe {
                        state
                            .rail
                            .conn
                            .qp
                            .post_recv(TAG_SLOT | INDEX_MASK, Some(sge))?
                    };
                    state.posted.push_back(Posted::Place {
                        index,
                        len: chunk.len,
                    });
                    *next += 1;
                }
                Some(Next::Message(left)) => {
                    let Some(slot) = state.free_slots.pop() else {
                        break;
                    };
                    post_slot(&state.rail.conn, slot)?;
                    state.posted.push_back(Posted::Slot(slot));
                    *left -= 1;
                    if *left == 0 {
                        self.next.pop_front();
                    }
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Item `index` of the pass expected came on rail `r` (`bytes`: its bytes, copied in
    /// here). Events for what landed.
    fn landed(&mut self, r: Rail, index: u64, bytes: Option<&[u8]>, out: &mut Vec<RecvEvent>) {
        let Some(e) = self.expecting.as_mut() else {
            if let Err(why) = self.early.hold(r, index, bytes) {
                self.down(r, why, out);
            }
            return;
        };
        let Some(p) = e.position(index) else {
            let items = self.items_ever;
            if index >= items {
                // No pass so far had it (a late copy is of an earlier pass, whose unit
                // plan was coarser or the same): a lie (or a bug), which would otherwise
                // leave this side waiting for items it was told nothing of until
                // --timeout.
                let why = format!(
                    "protocol error: an immediate names item {index}, outside the transfer's {items} items"
                );
                self.down(r, why, out);
                return;
            }
            // Not of this pass: a late copy of an earlier one (a failover's), dropped.
            out.push(RecvEvent::Copy { rail: r, index });
            return;
        };
        if let Some(bytes) = bytes {
            let landed_before = e.landed.as_ref().is_some_and(|l| l[p]);
            let place = e.plan.get(index);
            match (landed_before, place, self.host) {
                (false, Some(c), Some((base, len)))
                    if c.len as usize == bytes.len() && c.end() as usize <= len =>
                {
                    // SAFETY: the place of an expected item that has not landed lies in the
                    // host buffer (checked); the engine reads it only once the item is
                    // reported landed (RecvLink's contract), and nothing else writes it.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            base.as_ptr().add(c.offset as usize),
                            bytes.len(),
                        )
                    }
                }
                (false, _, _) => {
                    out.push(RecvEvent::Down {
                        rail: r,
                        why: format!(
                            "protocol error: item {index} of {} bytes does not fit its place",
                            bytes.len()
                        ),
                    });
                    return;
                }
                (true, _, _) => {}
            }
        }
        let land = |e: &Expecting, position: usize| RecvEvent::Landed {
            rail: r,
            index: e.index(position),
            sent_crc: None,
            landed_crc: None,
        };
        if let Some(landed) = e.landed.as_mut() {
            if std::mem::replace(&mut landed[p], true) {
                out.push(RecvEvent::Copy { rail: r, index });
            } else {
                out.push(land(e, p));
            }
        } else if p < e.through {
            out.push(RecvEvent::Copy { rail: r, index });
        } else {
            // One rail, in order: this one and every one before it.
            out.extend((e.through..=p).map(|q| land(e, q)));
            e.through = p + 1;
        }
    }

    fn down(&mut self, r: Rail, why: String, out: &mut Vec<RecvEvent>) {
        if let Some(s) = self.rails[r].as_mut() {
            if !s.down {
                s.down = true;
                let _ = s.rail.conn.id.disconnect();
                out.push(RecvEvent::Down { rail: r, why });
            }
        }
    }

    /// Take one completion of rail `r`.
    fn take(&mut self, r: Rail, c: &Completion, out: &mut Vec<RecvEvent>) {
        trace!(
            "recv rail {r}: completion tag {:#x} status {} bytes {} imm {:?}",
            tag(c.wr_id) >> 56,
            c.status_str(),
            c.byte_len,
            c.imm
        );
        let Some(s) = self.rails[r].as_mut() else {
            return;
        };
        if tag(c.wr_id) == TAG_FRAGMENT {
            s.sends_out = s.sends_out.saturating_sub(1);
            s.delivered |= c.is_ok();
            if let Some(slot) = slot_of(c.wr_id) {
                s.free_send.push(slot);
            }
            if !c.is_ok() {
                self.down(
                    r,
                    format!("a message's SEND failed: {}", c.status_str()),
                    out,
                );
            }
            return;
        }
        let Some(posted) = s.posted.pop_front() else {
            return;
        };
        if !c.is_ok() {
            let why = match posted {
                // A SEND longer than the place posted for it fails the receive (with a
                // local length or QP operation error, by provider), not by a flush.
                Posted::Place { index, len } if !c.is_connection_loss() => format!(
                    "the receive of item {index} ({len} bytes) failed: {} (a SEND longer than its item?)",
                    c.status_str()
                ),
                _ => format!("a receive failed: {}", c.status_str()),
            };
            self.down(r, why, out);
            return;
        }
        match posted {
            Posted::Place { index, len } => {
                self.bytes_in += c.byte_len as u64;
                let why = match (c.byte_len as u64 == len, c.imm) {
                    (true, None) => None,
                    (_, Some(imm)) => Some(format!(
                        "protocol error: item {index}'s SEND came with an immediate ({imm:#x}); over one rail they carry none"
                    )),
                    (false, None) => Some(format!(
                        "protocol error: item {index}'s receive took {} bytes ({len} expected)",
                        c.byte_len
                    )),
                };
                if let Some(why) = why {
                    self.down(r, why, out);
                    return;
                }
                self.landed(r, index, None, out);
            }
            Posted::Slot(slot) => {
                let bytes = match (c.imm, self.mode) {
                    (Some(_), Mode::Write) if c.is_write_with_imm() => None,
                    (Some(_), Mode::SendCopied) if !c.is_write_with_imm() => {
                        Some(s.rail.conn.read_slot(slot, c.byte_len as usize))
                    }
                    (None, _) if !c.is_write_with_imm() => {
                        Some(s.rail.conn.read_slot(slot, c.byte_len as usize))
                    }
                    _ => {
                        self.down(
                            r,
                            format!(
                                "protocol error: an unexpected {} byte(s) with immediate {:?}",
                                c.byte_len, c.imm
                            ),
                            out,
                        );
                        return;
                    }
                };
                // The slot's bytes are read: post it again (send in place: when a message
                // needs it).
                let reposted = match self.mode {
                    Mode::SendInPlace => {
                        s.free_slots.push(slot);
                        Ok(())
                    }
                    _ => post_slot(&s.rail.conn, slot)
                        .map(|()| s.posted.push_back(Posted::Slot(slot))),
                };
                if let Err(e) = reposted {
                    self.down(r, format!("reposting a receive: {e}"), out);
                    return;
                }
                match c.imm {
                    Some(imm) => {
                        let index = u64::from(imm).saturating_sub(1);
                        let len = self.expecting.as_ref().and_then(|e| e.plan.get(index));
                        self.bytes_in += len.map_or(c.byte_len as u64, |c| c.len);
                        self.landed(r, index, bytes.as_deref(), out);
                    }
                    None => {
                        let bytes = bytes.unwrap_or_default();
                        self.bytes_in += bytes.len() as u64;
                        let s = self.rails[r].as_mut().expect("this rail");
                        match s.reassembly.take(&bytes) {
                            Ok(Some(bytes)) => {
                                trace!(
                                    "recv rail {r}: message of {} bytes ({:?})",
                                    bytes.len(),
                                    String::from_utf8_lossy(&bytes[..bytes.len().min(4)])
                                );
                                out.push(RecvEvent::Message { rail: r, bytes })
                            }
                            Ok(None) => {}
                            Err(why) => self.down(r, why, out),
                        }
                    }
                }
            }
        }
    }

    /// Send what waits on rail `r` while send slots are free.
    fn pump(&mut self, r: Rail) -> Result<(), RdmaError> {
        let Some(s) = self.rails[r].as_mut().filter(|s| !s.down) else {
            return Ok(());
        };
        let inline_max = s.rail.conn.qp.caps().max_inline_data as usize;
        while let Some(bytes) = s.outbox.front() {
            if bytes.len() <= inline_max {
                s.rail
                    .conn
                    .qp
                    .post_send_inline(TAG_FRAGMENT | INDEX_MASK, bytes)?;
            } else {
                let Some(slot) = s.free_send.pop() else {
                    break;
                };
                // SAFETY: the slot was free: given back only when its send completed.
                unsafe {
                    s.rail
                        .conn
                        .send_slot(TAG_FRAGMENT | slot as u64, slot, bytes)?
                };
            }
            s.sends_out += 1;
            trace!("recv rail {r}: sent a fragment of {} bytes", bytes.len());
            s.outbox.pop_front();
        }
        Ok(())
    }

    /// Take further rails that joined: register the buffer on each one's device, post
    /// its receives, accept it.
    fn take_joins(&mut self) {
        let Some(joining) = self.joining.as_ref() else {
            return;
        };
        let mut came = Vec::new();
        while let Ok((member, request)) = joining.slot.rx.try_recv() {
            came.push((member as usize, request.into_inner()));
        }
        for (r, request) in came {
            let joining = self.joining.as_ref().expect("checked above");
            if r >= self.rails.len() || self.rails[r].is_some() {
                let _ = request
                    .id
                    .reject(&crate::wire::RejectReason::UnknownJoin.encode());
                continue;
            }
            let (rail, info) = match prepare(&request, joining.memory, &joining.setup) {
                Ok(p) => p,
                Err(reason) => {
                    let _ = request.id.reject(&reason.encode());
                    continue;
                }
            };
            if self.add_rail(r, rail).is_err() {
                self.rails[r] = None;
                let _ = request
                    .id
                    .reject(&crate::wire::RejectReason::Internal.encode());
                continue;
            }
            let s = self.rails[r].as_ref().expect("just added");
            if accept(&request, &s.rail.conn, &info.encode()).is_err() {
                self.rails[r] = None;
            }
        }
    }

    /// Take what every rail has now.
    fn sweep(&mut self, out: &mut Vec<RecvEvent>) {
        self.take_joins();
        for r in 0..self.rails.len() {
            if self.rails[r].as_ref().is_none_or(|s| s.down) {
                continue;
            }
            self.comps.clear();
            let s = self.rails[r].as_ref().expect("checked");
            let polled = s.rail.conn.cq.poll(&mut self.comps);
            let comps = std::mem::take(&mut self.comps);
            for c in &comps {
                self.take(r, c, out);
            }
            self.comps = comps;
            if let Err(e) = polled {
                self.down(r, e.to_string(), out);
                continue;
            }
            // Completions free send slots: what waits goes now.
            if let Err(e) = self.pump(r) {
                self.down(r, format!("sending a message: {e}"), out);
            }
            let s = self.rails[r].as_ref().expect("checked");
            if !s.down {
                match s.rail.conn.poll_events() {
                    Ok(false) => {}
                    Ok(true) => self.down(r, "the sender disconnected it".into(), out),
                    Err(e) => self.down(r, e.to_string(), out),
                }
            }
        }
        if self.mode == Mode::SendInPlace {
            if let Err(e) = self.refill() {
                self.down(0, format!("posting a receive: {e}"), out);
            }
        }
    }
}

fn post_slot(conn: &Connection, slot: usize) -> Result<(), RdmaError> {
    // SAFETY: a slot is read only after its receive completed, and posted again only after
    // that read (`take`).
    unsafe { conn.post_slot_recv(TAG_SLOT | slot as u64, slot) }
}

/// The send slot of a fragment's `wr_id` (none: it went inline).
fn slot_of(wr_id: u64) -> Option<usize> {
    let index = wr_id & INDEX_MASK;
    (index != INDEX_MASK).then_some(index as usize)
}

// SAFETY: items land only where the link expects them, but in write mode: there the
// sender's NIC writes the buffer through the keys of rail 0's accept and the joins'
// wherever and whenever it likes until the registration ends (an honest one: a copy of
// an item it moved off a failed rail, landing late with the same bytes; a lying one:
// anything), which `caps` says (`peer_writes_in_place`), as the trait asks; send in
// place posts a receive at an item's place only while the item is expected and not
// landed, and reports it landed only from that receive's completion;
// send copied writes an item's place only while it is expected and has not landed.
// `close` disconnects every rail: its queue pair then runs nothing more.
unsafe impl RecvLink for VerbsReceiver<'_> {
    fn rails(&self) -> usize {
        self.rails.len()
    }

    fn caps(&self) -> Caps {
        Caps {
            // WRITE: the sender's rkey stays good until the registration ends.
            peer_writes_in_place: self.mode == Mode::Write,
            ..Caps::QUEUE_PAIR
        }
    }

    fn expect(&mut self, plan: &ChunkPlan, which: Which<'_>) -> Result<(), LinkError> {
        trace!(
            "recv: expect {} items of {}-byte units",
            which.count(plan),
            plan.chunk_bytes()
        );
        let only = match which {
            Which::All => None,
            Which::Only(list) => Some(list.to_vec()),
        };
        let count = which.count(plan) as usize;
        self.items_ever = self.items_ever.max(plan.count());
        let per_item = self.rails.len() > 1;
        self.expecting = Some(Expecting {
            plan: *plan,
            only,
            count,
            landed: per_item.then(|| vec![false; count]),
            through: 0,
        });
        if self.mode == Mode::SendInPlace {
            self.next.push_back(Next::Items(0));
            self.refill().map_err(|e| LinkError(e.to_string()))?;
        }
        // Items that came before they were expected land now.
        let mut early = Vec::new();
        for e in self.early.take() {
            self.landed(e.rail, e.index, e.bytes.as_deref(), &mut early);
        }
        self.early_events = early;
        Ok(())
    }

    fn expect_none(&mut self) {
        self.expecting = None;
        self.next.retain(|n| !matches!(n, Next::Items(_)));
    }

    fn expect_message(&mut self, len: usize) {
        trace!("recv: expect a message of {len} bytes");
        if self.mode == Mode::SendInPlace {
            self.next.push_back(Next::Message(fragment_count(len)));
            let _ = self.refill();
        }
    }

    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(LinkError(format!("a message of {} bytes", bytes.len())));
        }
        match self.rails.get_mut(rail).and_then(|r| r.as_mut()) {
            Some(s) if !s.down => s.outbox.extend(fragments(bytes)),
            _ => return Err(LinkError(format!("rail {rail} is down"))),
        }
        self.pump(rail).map_err(|e| LinkError(e.to_string()))
    }

    fn poll(&mut self, wait: Duration, out: &mut Vec<RecvEvent>) -> Result<(), LinkError> {
        let before = out.len();
        out.append(&mut self.early_events);
        let deadline = Instant::now() + wait;
        loop {
            self.sweep(out);
            let now = Instant::now();
            if out.len() > before || now >= deadline {
                return Ok(());
            }
            let single = self.rails.len() == 1;
            match self.rails[0].as_ref().filter(|s| single && !s.down) {
                // One rail: sleep on its completion channel.
                Some(s) => {
                    self.comps.clear();
                    let d = Deadline::after(deadline - now);
                    let waited = s.rail.conn.wait(&mut self.comps, &d, "data");
                    let comps = std::mem::take(&mut self.comps);
                    for c in &comps {
                        self.take(0, c, out);
                    }
                    self.comps = comps;
                    match waited {
                        Ok(Waited::Completions) | Err(RdmaError::Timeout { .. }) => {}
                        Ok(Waited::Disconnected) => {
                            self.sweep(out);
                            self.down(0, "the sender disconnected".into(), out);
                        }
                        Err(e) => self.down(0, e.to_string(), out),
                    }
                }
                None => std::thread::sleep(IDLE_NAP.min(deadline - now)),
            }
        }
    }

    fn give_up(&mut self, rail: Rail) {
        let mut ignored = Vec::new();
        self.down(rail, String::new(), &mut ignored);
    }

    fn bytes_in(&self) -> u64 {
        self.bytes_in
    }

    fn close(&mut self) {
        // This side's last words (a too-slow ack) leave first, for a moment at most.
        let deadline = Instant::now() + SEND_GRACE;
        let mut ignored = Vec::new();
        while Instant::now() < deadline
            && self
                .rails
                .iter()
                .flatten()
                .any(|s| !s.down && (s.sends_out > 0 || !s.outbox.is_empty()))
        {
            self.sweep(&mut ignored);
            std::thread::sleep(IDLE_NAP);
        }
        for r in 0..self.rails.len() {
            self.down(r, String::new(), &mut ignored);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_first_pass_that_comes_early_is_held() {
        // 64 MiB + 3 B in 4 KiB items, every one with its bytes (send copied), twice over
        // (a pass and its copies): an honest sender's most.
        let len = (64 << 20) + 3;
        let mut early = EarlyItems::new(len);
        let item = vec![7u8; 4096];
        for round in 0..2 {
            for index in 0..(len / 4096) as u64 {
                early
                    .hold(0, index, Some(&item))
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
        }
        assert_eq!(early.take().len(), 2 * (len / 4096));
        assert_eq!(early.held, 0, "taking them gives their budget back");
    }

    #[test]
    fn a_peer_that_floods_items_nobody_asked_for_is_stopped_at_the_budget() {
        let len = 1 << 20;
        let mut early = EarlyItems::new(len);
        let item = vec![0u8; 1 << 16];
        let mut held = 0usize;
        let why = loop {
            match early.hold(0, held as u64, Some(&item)) {
                Ok(()) => held += 1,
                Err(why) => break why,
            }
            assert!(held < 100_000, "a flood of early items was never stopped");
        };
        assert!(why.starts_with("protocol error"), "{why}");
        assert!(early.held <= early_budget(len));
        assert_eq!(
            early.items.len(),
            held,
            "the item over the budget is not held"
        );
        // Items without bytes count too: a flood of bare immediates ends as well.
        let mut bare = EarlyItems::new(len);
        assert!((0..10_000_000u64).any(|i| bare.hold(1, i, None).is_err()));
    }
}
