//! The sender's side of one open link, whatever carries it: items go to the rail the
//! [`Stripes`] book picks, a rail that goes down or stalls hands its items to the others,
//! and the link's events are sorted into what the pass needs (items done, in order) and
//! what the conversation after it needs (the receiver's messages). [`Sending`] is the
//! [`ChunkWire`] the chunk schedule drives, and what the repair rounds send copies with.

use super::cancel::{bounded, cancelled, Cancel, CANCELLED};
use super::inbox::Inbox;
use super::stripe::{Key, Stripes};
use crate::net::{Caps, Item, LinkError, Pass, Rail, SendEvent, SendLink};
use crate::rdma::Deadline;
use crate::transfer::schedule::{ChunkWire, Done, Posted, WireError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A rail given up on, for the report.
#[derive(Debug, Clone)]
pub struct RailFailed {
    pub rail: Rail,
    pub why: String,
    pub at: Instant,
    /// Its items in flight, moved to the other rails.
    pub moved: u64,
    /// From `at` until the pass's items were done in order again (the stall beyond the
    /// detection); `None` if none was done after it in the pass.
    pub resumed: Option<Duration>,
}

/// An item posted and not yet done, kept to post again elsewhere if its rail fails.
#[derive(Debug, Clone)]
struct Out {
    item: Item,
    /// A copy's bytes (repair rounds); `None`: the item's bytes in the source.
    copy: Option<Arc<[u8]>>,
}

/// The sender's side of an open link.
pub struct Sending<'l> {
    link: &'l mut dyn SendLink,
    caps: Caps,
    stripes: Stripes,
    /// Items posted and not done, by key.
    out: BTreeMap<Key, Out>,
    /// The schedule's pass: its chunks reported done in order.
    pass: Option<Pass>,
    next_done: u64,
    /// CRC32C of every chunk of the transfer, as the frames carried them (links whose
    /// frames carry them) or as given (the GPU's).
    crcs: Vec<u32>,
    /// CRC32Cs given before the pass (the GPU's): frames carry them as they are.
    precomputed: bool,
    /// The receiver's messages, in order, not yet taken.
    messages: Inbox,
    failures: Vec<RailFailed>,
    events: Vec<SendEvent>,
    /// Set once the link was broken off: nothing more is sent.
    broken: bool,
    /// Every rail went down after messages came: they are read first, then this.
    ended: Option<WireError>,
    /// The caller's token: a cancelled one ends the transfer at the next poll.
    cancel: Option<Cancel>,
}

impl<'l> Sending<'l> {
    /// Over `link`, its rails striped when there are several (`rail_timeout`: how long a
    /// rail may go quiet with items in flight while another is well).
    pub fn new(link: &'l mut dyn SendLink, rail_timeout: Duration) -> Sending<'l> {
        let rails = link.rails();
        let caps = link.caps();
        let striped = (rails > 1).then_some(rail_timeout);
        Sending {
            link,
            caps,
            stripes: Stripes::new(rails, striped, Instant::now()),
            out: BTreeMap::new(),
            pass: None,
            next_done: 0,
            crcs: Vec::new(),
            precomputed: false,
            messages: Inbox::default(),
            failures: Vec::new(),
            events: Vec::new(),
            broken: false,
            ended: None,
            cancel: None,
        }
    }

    /// End the transfer as cancelled once `cancel` is (looked at every poll, at least
    /// every [`CANCEL_POLL`](super::cancel::CANCEL_POLL)).
    pub fn cancel_on(&mut self, cancel: Option<Cancel>) {
        self.cancel = cancel;
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    pub fn stripes(&self) -> &Stripes {
        &self.stripes
    }

    /// The rails given up on during this transfer.
    pub fn failures(&self) -> &[RailFailed] {
        &self.failures
    }

    /// Start the next transfer of `chunks` chunks on this link, with their CRC32Cs where
    /// they were computed already (the GPU's); with `checksums` and none given, the
    /// frames' (links that carry them) are collected as the chunks go.
    pub fn next_transfer(&mut self, chunks: u64, precomputed: Option<Vec<u32>>, checksums: bool) {
        self.stripes.next_transfer(Instant::now());
        self.out.clear();
        self.failures.clear();
        self.pass = None;
        self.next_done = 0;
        self.precomputed = precomputed.is_some();
        // Without CRC32Cs given, those of a link's frames are collected as its chunks go;
        // a link whose frames carry none leaves them to the engine (after the pass).
        let from_frames = checksums && self.caps.crc_in_frames;
        self.crcs = precomputed.unwrap_or_else(|| match from_frames {
            true => vec![0; chunks as usize],
            false => Vec::new(),
        });
    }

    /// The chunks' CRC32Cs (the frames' or the GPU's); empty without checksums or where
    /// the link's frames carry none and none were given.
    pub fn checksums(&self) -> &[u32] {
        &self.crcs
    }

    /// Replace the chunks' CRC32Cs (computed by the engine for a link whose frames carry
    /// none).
    pub fn set_checksums(&mut self, crcs: Vec<u32>) {
        self.crcs = crcs;
    }

    /// The rail control messages go on: the lowest live one.
    pub fn control_rail(&self) -> Option<Rail> {
        self.stripes.live().next()
    }

    /// Send `bytes` to the receiver on the control rail; a rail that fails meanwhile is
    /// given up and the next live one tried.
    pub fn send_message(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        loop {
            let Some(rail) = self.control_rail() else {
                return Err(self.no_rail_left("sending a message"));
            };
            match self.link.send_message(rail, bytes) {
                Ok(()) => return Ok(()),
                Err(LinkError(why)) => self.fail_rail(rail, why)?,
            }
        }
    }

    /// The next message from the receiver, waiting until `deadline`; `None` at the
    /// deadline. Rails that fail meanwhile are given up (the message may come on another).
    pub fn next_message(
        &mut self,
        deadline: &Deadline,
    ) -> Result<Option<(Rail, Vec<u8>)>, WireError> {
        loop {
            if let Some(m) = self.messages.pop() {
                return Ok(Some(m));
            }
            if deadline.expired() {
                return Ok(None);
            }
            self.poll(deadline.remaining())?;
        }
    }

    /// A message the receiver sent, if one came already (none waited for).
    pub fn take_message(&mut self) -> Option<(Rail, Vec<u8>)> {
        self.messages.pop()
    }

    /// Look for messages for up to `wait` (after a failed pass: the receiver may have
    /// said why it ended the transfer), until one came: a poll returns at the first
    /// news, which after a failure is often a writer's end, not the receiver's word.
    pub fn look_for_messages(&mut self, wait: Duration) {
        let until = Instant::now() + wait;
        while self.messages.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if self.poll(left).is_err() {
                // A link that is over answers at once: look again in a moment.
                std::thread::sleep(left.min(Duration::from_millis(5)));
            }
        }
    }

    /// The end of a pass on every live rail (TCP's end markers).
    pub fn end_pass(&mut self) -> Result<(), WireError> {
        let failed = self.stripes.failed_mask();
        self.link
            .end_pass(failed)
            .map_err(|LinkError(why)| self.broken(why))
    }

    /// Post `copies` (item, its bytes), each on the rail the book picks, and wait until
    /// every one is done, each within `timeout` of the last progress; a rail that fails
    /// meanwhile hands its copies to the others.
    pub fn send_copies(
        &mut self,
        copies: Vec<(Item, Arc<[u8]>)>,
        timeout: Duration,
    ) -> Result<(), WireError> {
        let keys: Vec<Key> = copies
            .iter()
            .map(|(i, _)| Key::new(i.pass, i.index))
            .collect();
        for (item, bytes) in copies {
            self.place(item, Some(bytes), false)?;
        }
        let mut deadline = Deadline::after(timeout);
        loop {
            if keys.iter().all(|k| self.stripes.is_done(*k)) {
                return Ok(());
            }
            if deadline.expired() {
                let e = deadline.timeout_error("items sent again to be written");
                return Err(self.broken(e.to_string()));
            }
            if self.poll(deadline.remaining())? {
                deadline = Deadline::after(timeout);
            }
        }
    }

    /// Post `item` on the rail the book picks (a rail that refuses it fails, and the
    /// next is tried).
    fn place(&mut self, item: Item, copy: Option<Arc<[u8]>>, again: bool) -> Result<(), WireError> {
        let key = Key::new(item.pass, item.index);
        loop {
            if self.broken {
                return Err(WireError::Broken("the link was broken off".into()));
            }
            let Some(rail) = self.stripes.pick() else {
                return Err(self.no_rail_left(&format!("item {}", item.index)));
            };
            let mut posted = item.clone();
            // Over several rails every item is reported: a rail's last item must not
            // wait for a later one that may go elsewhere.
            posted.signaled |= self.stripes.striped() || again;
            let result = match &copy {
                Some(bytes) => self.link.post_copy(rail, posted.clone(), bytes.clone()),
                // SAFETY: the item's bytes are the source's, prepared by the schedule
                // and released only once this item is done and held by no failed rail
                // (`wait`); or a pass that ends early drains the link first.
                None => unsafe { self.link.post(rail, std::slice::from_ref(&posted)) },
            };
            match result {
                Ok(()) => {
                    let len =
                        (item.bytes.len() as u64).max(copy.as_ref().map_or(0, |c| c.len() as u64));
                    self.stripes
                        .posted(rail, key, len, again || copy.is_some(), Instant::now());
                    self.out.insert(key, Out { item: posted, copy });
                    return Ok(());
                }
                Err(LinkError(why)) => self.fail_rail(rail, why)?,
            }
        }
    }

    /// Give `rail` up for `why`: the link breaks it off, its items in flight go to the
    /// other rails. An error only when no rail is left.
    fn fail_rail(&mut self, rail: Rail, why: String) -> Result<(), WireError> {
        let now = Instant::now();
        let was_live = self.stripes.is_live(rail);
        let moved = self.stripes.fail(rail, why.clone(), now);
        self.link.give_up(rail);
        if !was_live {
            return match self.stripes.pick() {
                Some(_) => Ok(()),
                None => Err(self.broken(why)),
            };
        }
        if self.stripes.pick().is_none() {
            return Err(self.broken(why));
        }
        self.failures.push(RailFailed {
            rail,
            why,
            at: now,
            moved: moved.len() as u64,
            resumed: None,
        });
        for key in moved {
            if let Some(out) = self.out.remove(&key) {
                self.place(out.item, out.copy, true)?;
            }
        }
        Ok(())
    }

    /// Take the link's events for up to `wait` and sort them; whether any item was done.
    fn poll(&mut self, wait: Duration) -> Result<bool, WireError> {
        if let Some(e) = self.ended.take() {
            return Err(e);
        }
        if cancelled(&self.cancel) {
            return Err(self.broken(CANCELLED.into()));
        }
        let wait = bounded(wait, &self.cancel);
        // A quiet rail must be noticed within a tenth of the rail timeout.
        let wait = match self.stripes.rail_timeout() {
            Some(t) => wait.min((t / 10).max(Duration::from_millis(1))),
            None => wait,
        };
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let polled = self.link.poll(wait, &mut events);
        let mut progress = false;
        let mut failed = Vec::new();
        for e in events.drain(..) {
            match e {
                SendEvent::Sent {
                    rail,
                    pass,
                    items,
                    crcs,
                } => {
                    let now = Instant::now();
                    for (k, index) in items.iter().enumerate() {
                        let key = Key::new(pass, *index);
                        if !self.stripes.sent(rail, key, now) {
                            continue;
                        }
                        progress = true;
                        if let Some(out) = self.out.remove(&key) {
                            // A chunk's frame CRC32C, for the digest (pieces carry their own).
                            let is_chunk = Some(pass) == self.pass || out.item.attempt == 0;
                            if let (Some(&crc), true, false) =
                                (crcs.get(k), is_chunk, self.precomputed)
                            {
                                if let Some(slot) = self.crcs.get_mut(*index as usize) {
                                    *slot = crc;
                                }
                            }
                        }
                    }
                }
                SendEvent::Message { rail, bytes } => {
                    if let Err(why) = self.messages.push(rail, bytes) {
                        failed.push((rail, why));
                    }
                }
                SendEvent::Down { rail, why } => failed.push((rail, why)),
                SendEvent::Quiet { rail } => self.stripes.quiet(rail),
            }
        }
        self.events = events;
        for (rail, why) in failed {
            if let Err(e) = self.fail_rail(rail, why) {
                // The receiver's last word may have come before its side closed: it is
                // read first, the link's end after it.
                if self.messages.is_empty() {
                    return Err(e);
                }
                self.ended = Some(e);
                return Ok(progress);
            }
        }
        let now = Instant::now();
        for (rail, quiet) in self.stripes.overdue(now) {
            let why = format!(
                "nothing sent for {} while it had items in flight (--rail-timeout)",
                crate::rdma::format_duration(quiet)
            );
            self.fail_rail(rail, why)?;
        }
        if let Err(LinkError(why)) = polled {
            return Err(self.broken(why));
        }
        Ok(progress)
    }

    fn no_rail_left(&mut self, what: &str) -> WireError {
        let why = self
            .failures
            .iter()
            .map(|f| format!("rail {}: {}", f.rail, f.why))
            .collect::<Vec<_>>()
            .join("; ");
        self.broken(match why.is_empty() {
            true => format!("no rail is left for {what}"),
            false => format!("no rail is left for {what} ({why})"),
        })
    }

    fn broken(&mut self, why: String) -> WireError {
        WireError::Broken(why)
    }
}

// SAFETY: a chunk is reported done only once its link reported it sent on some rail
// and no failed rail that had it may still read it (held until that rail is quiet);
// `drain` returns only once the link reads nothing (its contract).
unsafe impl ChunkWire for Sending<'_> {
    fn batch(&self) -> usize {
        self.caps.post_batch.max(1)
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), WireError> {
        for p in chunks {
            if self.pass != Some(p.pass) {
                self.pass = Some(p.pass);
                self.next_done = 0;
            }
            let item = Item {
                pass: p.pass,
                index: p.chunk.index,
                offset: p.chunk.offset,
                bytes: p.bytes.clone(),
                crc: match self.precomputed {
                    true => self.crcs.get(p.chunk.index as usize).copied(),
                    false => None,
                },
                signaled: p.signaled,
                attempt: 0,
            };
            self.place(item, None, false)?;
        }
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<Done>, WireError> {
        self.poll(deadline.remaining())?;
        let Some(pass) = self.pass else {
            return Ok(None);
        };
        let before = self.next_done;
        loop {
            let key = Key::new(pass, self.next_done);
            if !self.stripes.is_done(key) || self.stripes.held(key) {
                break;
            }
            self.next_done += 1;
        }
        if self.next_done == before {
            if deadline.expired() {
                let e = deadline.timeout_error("chunks to be sent to the receiver");
                return Err(self.broken(e.to_string()));
            }
            return Ok(None);
        }
        let now = Instant::now();
        for f in self.failures.iter_mut().filter(|f| f.resumed.is_none()) {
            f.resumed = Some(now.saturating_duration_since(f.at));
        }
        Ok(Some(Done {
            pass,
            through: self.next_done - 1,
        }))
    }

    fn drain(&mut self, _deadline: &Deadline) {
        self.broken = true;
        self.link.drain();
        self.out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{HostBuffer, RecvSink, POISON};
    use crate::net::tcp::frames::{Frame, FrameKind, FRAME_LEN};
    use crate::net::tcp::send::{TcpSender, WriteChecks};
    use crate::transfer::plan::ChunkPlan;
    use crate::transfer::schedule::Schedule;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    /// Every item's payload the peer received, in arrival order, until the sender's side
    /// closed or broke (read after the sender was done).
    fn payloads(mut peer: TcpStream) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut head = [0u8; FRAME_LEN];
        while peer.read_exact(&mut head).is_ok() {
            let frame = Frame::decode(&head);
            let FrameKind::Item { len, .. } = frame.kind() else {
                continue;
            };
            let mut bytes = vec![0u8; len as usize];
            if peer.read_exact(&mut bytes).is_err() {
                break; // cut off mid-frame: the link broke off
            }
            out.push(bytes);
        }
        out
    }

    /// Issue 24, items 8 and 9, over the engine and the TCP link: a pass that fails at
    /// once (`Schedule::timeout` zero) while 64 MiB of chunks sit queued on the writers,
    /// and a peer that reads nothing until later. The source's owner then writes it
    /// (poison) and runs the next pass on the same link. The first pass returns only once
    /// no writer reads the source, and the second is refused (the link was broken off),
    /// so no rewritten byte reaches the peer.
    #[test]
    fn a_failed_pass_leaves_no_writer_sending_the_source_and_the_next_pass_is_refused() {
        const CHUNK: usize = 1 << 20;
        let src = HostBuffer::with_pattern(64 * CHUNK).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (peer, _) = listener.accept().unwrap();
        let plan = ChunkPlan::new(src.len() as u64, CHUNK as u64).unwrap();
        let schedule = Schedule::new(plan, 64, &src, Duration::ZERO);
        let timeout = Duration::from_secs(10);
        let mut conn =
            TcpSender::start(vec![vec![stream]], WriteChecks::default(), timeout).unwrap();
        let (first, second) = conn
            .with_source(&src, |link| {
                let mut sending = Sending::new(link, Duration::from_millis(500));
                sending.next_transfer(plan.count(), None, false);
                let first = schedule.run(&src, &mut sending, "peer");
                RecvSink::poison(&src).unwrap();
                sending.next_transfer(plan.count(), None, false);
                let again = Schedule::new(plan, 64, &src, timeout);
                (first, again.run(&src, &mut sending, "peer"))
            })
            .unwrap();
        drop(conn);
        assert!(first.is_err(), "a zero timeout fails the pass");
        assert!(second.is_err(), "the link was broken off: {second:?}");
        let poison = POISON.to_ne_bytes();
        let received = payloads(peer);
        let rewritten = received
            .iter()
            .filter(|p| p.chunks(4).any(|w| w == poison))
            .count();
        assert_eq!(
            rewritten,
            0,
            "{rewritten} of {} chunks received carried bytes written after the pass",
            received.len()
        );
    }
}
