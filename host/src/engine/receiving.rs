//! The receiver's side of one open link, whatever carries it: one pass at a time (the
//! transfer's chunks, or the items a repair round asked for), its items counted as they
//! land from any rail, the CRC32Cs the frames carried and those taken where the bytes
//! landed kept, rails that break or that the sender gave up noted, the sender's messages
//! kept for the conversation. A pass ends when every item it expects has landed; over
//! several rails of a link whose sends may be lost with a rail, also when every live rail
//! said the sender ended it: then the items that never came are missing.

use super::cancel::{bounded, cancelled, Cancel, CANCELLED};
use super::inbox::Inbox;
use crate::net::{Caps, Rail, RecvEvent, RecvLink, Which};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::RecvRail;
use std::time::{Duration, Instant};

/// Why a pass stopped short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The whole-transfer deadline passed: the sender is below `--min-rate`.
    TooSlow,
    /// Anything else, in words.
    Broken(String),
}

/// One pass's items: how many landed (which, where that is kept) and their CRC32Cs
/// (checksummed passes). What is kept per item is only what the pass needs: a transfer
/// of 2^28 tiny unchecked chunks over one rail keeps nothing per chunk.
#[derive(Debug)]
pub struct PassItems<'a> {
    plan: ChunkPlan,
    /// The items expected, increasing; `None`: all of the plan's.
    only: Option<&'a [u32]>,
    len: usize,
    /// Which have landed, where kept (several rails: items may be missing at the end,
    /// or come twice); else only the count, the link landing each item once.
    landed: Option<Vec<bool>>,
    count: u64,
    /// The CRC32C each item's frame carried (links that carry them), by position, and
    /// how many came.
    sent: Option<Vec<u32>>,
    sent_known: usize,
    /// The CRC32C each item had where it landed, where the link took it, and how many.
    landed_crc: Option<Vec<u32>>,
    landed_known: usize,
}

impl<'a> PassItems<'a> {
    fn new(plan: ChunkPlan, which: Which<'a>, track: bool, crcs: bool) -> PassItems<'a> {
        let only = match which {
            Which::All => None,
            Which::Only(list) => Some(list),
        };
        let len = only.map_or(plan.count(), |l| l.len() as u64) as usize;
        PassItems {
            plan,
            only,
            len,
            landed: track.then(|| vec![false; len]),
            count: 0,
            sent: crcs.then(|| vec![0; len]),
            sent_known: 0,
            landed_crc: crcs.then(|| vec![0; len]),
            landed_known: 0,
        }
    }

    /// The position of item `index` in the pass.
    pub fn position(&self, index: u64) -> Option<usize> {
        match self.only {
            None => (index < self.plan.count()).then_some(index as usize),
            Some(list) => u32::try_from(index)
                .ok()
                .and_then(|i| list.binary_search(&i).ok()),
        }
    }

    /// The item at `position`.
    pub fn index(&self, position: usize) -> u64 {
        match self.only {
            None => position as u64,
            Some(list) => list[position] as u64,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn all_landed(&self) -> bool {
        self.count == self.len as u64
    }

    /// Item at `position` landed (`sent`, `here`: its CRC32Cs, where known); whether it
    /// is news (not landed before).
    fn land(&mut self, position: usize, sent: Option<u32>, here: Option<u32>) -> bool {
        if let Some(landed) = self.landed.as_mut() {
            if std::mem::replace(&mut landed[position], true) {
                return false;
            }
        }
        self.count += 1;
        if let (Some(v), Some(crc)) = (self.sent.as_mut(), sent) {
            v[position] = crc;
            self.sent_known += 1;
        }
        if let (Some(v), Some(crc)) = (self.landed_crc.as_mut(), here) {
            v[position] = crc;
            self.landed_known += 1;
        }
        true
    }

    /// The CRC32C every item's frame carried, once every item's came.
    pub fn sent_crcs(&self) -> Option<&[u32]> {
        self.sent.as_deref().filter(|_| self.sent_known == self.len)
    }

    /// The CRC32C every item had where it landed, once the link took every one.
    pub fn landed_crcs(&self) -> Option<&[u32]> {
        self.landed_crc
            .as_deref()
            .filter(|_| self.landed_known == self.len)
    }

    /// The items that have not landed, increasing (none where landings are only
    /// counted and all came).
    pub fn missing(&self) -> Vec<u32> {
        match &self.landed {
            Some(landed) => (0..self.len)
                .filter(|&p| !landed[p])
                .map(|p| self.index(p) as u32)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Take the items of `other` (a missing-items round of this pass) that landed.
    fn absorb(&mut self, other: &PassItems<'_>) {
        let Some(landed) = other.landed.as_ref() else {
            return;
        };
        for p in (0..other.len).filter(|&p| landed[p]) {
            if let Some(q) = self.position(other.index(p)) {
                let sent = other.sent.as_ref().map(|v| v[p]);
                let here = other.landed_crc.as_ref().map(|v| v[p]);
                self.land(q, sent, here);
            }
        }
    }
}

/// A rail as the receiver sees it.
#[derive(Debug, Clone, Default)]
struct RailSeen {
    items: u64,
    bytes: u64,
    copies: u64,
    stopped: Option<String>,
    /// Said the end of the current pass.
    ended: bool,
    /// When it last brought anything.
    last_news: Option<Instant>,
}

/// How long a rail that has not ended the pass may stay silent after every item landed
/// (and after its own last word) before it is taken for a link that died silently:
/// the pass then ends without it, instead of after all of --timeout.
const SILENT_AFTER_LANDED: Duration = Duration::from_secs(1);

/// The receiver's side of an open link.
pub struct Receiving<'l> {
    link: &'l mut dyn RecvLink,
    caps: Caps,
    rails: Vec<RailSeen>,
    /// Whether passes end by the sender's word on every rail (several rails whose sends
    /// may be lost with a rail).
    ends_marked: bool,
    messages: Inbox,
    timeout: Duration,
    /// Bytes of the current transfer that arrived (first sendings), for errors.
    pub got: u64,
    /// Items asked for again because they never came, all transfers.
    pub asked_again: u64,
    events: Vec<RecvEvent>,
    /// The caller's token: a cancelled one ends the transfer at the next poll.
    cancel: Option<Cancel>,
}

impl<'l> Receiving<'l> {
    /// Over `link`; every wait without news bounded by `timeout`.
    pub fn new(link: &'l mut dyn RecvLink, timeout: Duration) -> Receiving<'l> {
        let caps = link.caps();
        let rails = link.rails();
        Receiving {
            ends_marked: rails > 1 && !caps.sent_means_landed,
            caps,
            rails: vec![RailSeen::default(); rails],
            link,
            messages: Inbox::default(),
            timeout,
            got: 0,
            asked_again: 0,
            events: Vec::new(),
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

    /// Whether the link has several rails.
    pub fn striped(&self) -> bool {
        self.rails.len() > 1
    }

    /// Whether a pass ends by the sender's word on every live rail.
    pub fn ends_marked(&self) -> bool {
        self.ends_marked
    }

    /// The rail this side's messages go on: the lowest live one.
    pub fn control_rail(&self) -> Option<Rail> {
        self.rails.iter().position(|r| r.stopped.is_none())
    }

    /// Send `bytes` to the sender on the control rail; a rail that refuses it is stopped
    /// and the next tried.
    pub fn send_message(&mut self, bytes: &[u8]) -> Result<(), Stop> {
        loop {
            let Some(rail) = self.control_rail() else {
                return Err(Stop::Broken(self.no_rail_left()));
            };
            match self.link.send_message(rail, bytes) {
                Ok(()) => return Ok(()),
                Err(e) => self.stop_rail(rail, e.0),
            }
        }
    }

    /// Send `bytes` on every live rail (the last ack of a striped connection: the first
    /// that arrives is enough, so a rail whose far end went silent cannot hold it back);
    /// whether any rail took it.
    pub fn send_everywhere(&mut self, bytes: &[u8]) -> bool {
        let mut any = false;
        for rail in 0..self.rails.len() {
            if self.rails[rail].stopped.is_some() {
                continue;
            }
            match self.link.send_message(rail, bytes) {
                Ok(()) => any = true,
                Err(e) => self.stop_rail(rail, e.0),
            }
        }
        any
    }

    /// The next message from the sender, waiting until `deadline` (`None` at it).
    pub fn next_message(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>, Stop> {
        loop {
            if let Some((_, m)) = self.messages.pop() {
                return Ok(Some(m));
            }
            if self.rails.iter().all(|r| r.stopped.is_some()) {
                return Err(Stop::Broken(self.no_rail_left()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.poll(left, None)?;
        }
    }

    /// The sender's next message is `len` bytes long (see [`RecvLink::expect_message`]).
    pub fn expect_message(&mut self, len: usize) {
        self.link.expect_message(len);
    }

    /// Break every rail off (a transfer that ends in error).
    pub fn close(&mut self) {
        self.link.close();
    }

    fn stop_rail(&mut self, rail: Rail, why: String) {
        if let Some(r) = self.rails.get_mut(rail) {
            if r.stopped.is_none() {
                r.stopped = Some(why);
            }
        }
        self.link.give_up(rail);
    }

    fn no_rail_left(&self) -> String {
        let why: Vec<String> = self
            .rails
            .iter()
            .enumerate()
            .filter_map(|(r, s)| Some(format!("rail {r}: {}", s.stopped.as_deref()?)))
            .collect();
        match (self.rails.len(), why.as_slice()) {
            (1, [one]) => one.trim_start_matches("rail 0: ").to_string(),
            _ => why.join("; "),
        }
    }

    /// One pass of `which` items of `plan`: [`begin`](Self::begin), then
    /// [`finish`](Self::finish).
    pub fn pass<'w>(
        &mut self,
        plan: &ChunkPlan,
        which: Which<'w>,
        crcs: bool,
        whole: Option<Instant>,
        first_sending: bool,
    ) -> Result<PassItems<'w>, Stop> {
        let items = self.begin(plan, which, crcs)?;
        self.finish(items, whole, first_sending)
    }

    /// Tell the link to expect `which` items of `plan` from now on: before the request
    /// that makes the sender send them, so none comes before it is expected. `crcs`:
    /// keep the items' CRC32Cs.
    pub fn begin<'w>(
        &mut self,
        plan: &ChunkPlan,
        which: Which<'w>,
        crcs: bool,
    ) -> Result<PassItems<'w>, Stop> {
        self.link
            .expect(plan, which)
            .map_err(|e| Stop::Broken(e.0))?;
        for r in &mut self.rails {
            r.ended = false;
        }
        Ok(PassItems::new(*plan, which, self.ends_marked, crcs))
    }

    /// Take events until the pass's items are in (or, ends marked, every live rail ended
    /// the pass: the rest are missing). `whole`: the transfer's deadline
    /// (`--min-rate`); no wait without news beyond the timeout.
    pub fn finish<'w>(
        &mut self,
        mut items: PassItems<'w>,
        whole: Option<Instant>,
        first_sending: bool,
    ) -> Result<PassItems<'w>, Stop> {
        let result = self.collect(&mut items, whole, first_sending);
        // Whatever comes next waits for the next pass to be expected.
        self.link.expect_none();
        result.map(|()| items)
    }

    fn collect(
        &mut self,
        items: &mut PassItems<'_>,
        whole: Option<Instant>,
        first_sending: bool,
    ) -> Result<(), Stop> {
        let mut last_news = Instant::now();
        let mut bytes_in = self.link.bytes_in();
        let mut all_landed_at: Option<Instant> = None;
        loop {
            if items.all_landed() && !self.ends_marked {
                return Ok(());
            }
            if items.all_landed() && self.ends_marked {
                self.cut_silent_rails(*all_landed_at.get_or_insert_with(Instant::now));
            }
            if self.ends_marked && self.rails.iter().all(|r| r.ended || r.stopped.is_some()) {
                if self.rails.iter().all(|r| r.stopped.is_some()) && !items.all_landed() {
                    return Err(Stop::Broken(self.no_rail_left()));
                }
                return Ok(());
            }
            if !self.ends_marked && self.rails.iter().all(|r| r.stopped.is_some()) {
                return Err(Stop::Broken(self.no_rail_left()));
            }
            let now = Instant::now();
            if whole.is_some_and(|w| now >= w) {
                return Err(Stop::TooSlow);
            }
            let quiet = now.saturating_duration_since(last_news);
            if quiet >= self.timeout {
                return Err(Stop::Broken(format!(
                    "nothing arrived for {} ({} of {} items in; --timeout)",
                    crate::rdma::format_duration(self.timeout),
                    items.count,
                    items.len()
                )));
            }
            // Bytes that trickle in say nothing: they are looked at a few times a timeout.
            let mut wait = (self.timeout - quiet)
                .min(self.timeout / 4)
                .max(Duration::from_millis(1));
            if all_landed_at.is_some() {
                wait = wait.min(self.silent_grace() / 4);
            }
            if let Some(w) = whole {
                wait = wait.min(
                    w.saturating_duration_since(now)
                        .max(Duration::from_millis(1)),
                );
            }
            let news = self.poll(wait, Some((items, first_sending)))?;
            let now_in = self.link.bytes_in();
            if news || now_in != bytes_in {
                bytes_in = now_in;
                last_news = Instant::now();
            }
        }
    }

    /// How long a rail may stay silent after every item landed.
    fn silent_grace(&self) -> Duration {
        SILENT_AFTER_LANDED.min(self.timeout)
    }

    /// Every item landed: a live rail that has not ended the pass and has brought
    /// nothing for the grace since (since its own last word, if later) is stopped.
    fn cut_silent_rails(&mut self, landed_at: Instant) {
        let grace = self.silent_grace();
        let now = Instant::now();
        for r in 0..self.rails.len() {
            let rail = &self.rails[r];
            if rail.ended || rail.stopped.is_some() {
                continue;
            }
            let since = rail.last_news.map_or(landed_at, |n| n.max(landed_at));
            if now.saturating_duration_since(since) >= grace {
                let why = format!(
                    "no end marker, nor any byte, for {} after every chunk had landed (its link may be down)",
                    crate::rdma::format_duration(grace)
                );
                self.stop_rail(r, why);
            }
        }
    }

    /// The items a pass left missing, asked for again (`request`: the message that asks
    /// for round `round`) and taken in a pass of their own, until none is missing, at most
    /// `max_rounds` rounds. Returns the pass with them in.
    pub fn fetch_missing<'w>(
        &mut self,
        mut items: PassItems<'w>,
        whole: Option<Instant>,
        max_rounds: u32,
        request: &dyn Fn(u32, &[u32]) -> Vec<u8>,
    ) -> Result<PassItems<'w>, Stop> {
        let mut round = 0u32;
        loop {
            let missing = items.missing();
            if missing.is_empty() {
                return Ok(items);
            }
            round += 1;
            if round > max_rounds {
                return Err(Stop::Broken(format!(
                    "{} items still missing after {max_rounds} rounds of asking for them again (first: {})",
                    missing.len(),
                    missing[0]
                )));
            }
            self.asked_again += missing.len() as u64;
            let plan = items.plan;
            let crcs = items.sent.is_some();
            let again = self.begin(&plan, Which::Only(&missing), crcs)?;
            self.send_message(&request(round, &missing))?;
            let again = self.finish(again, whole, true)?;
            items.absorb(&again);
        }
    }

    /// Take the link's events for up to `wait`, into `items` where a pass runs; whether
    /// anything was news (an item, a message, a rail's word).
    fn poll(
        &mut self,
        wait: Duration,
        mut pass: Option<(&mut PassItems, bool)>,
    ) -> Result<bool, Stop> {
        if cancelled(&self.cancel) {
            return Err(Stop::Broken(CANCELLED.into()));
        }
        let wait = bounded(wait, &self.cancel);
        let mut events = std::mem::take(&mut self.events);
        events.clear();
        let polled = self.link.poll(wait, &mut events);
        let mut news = false;
        let now = Instant::now();
        for e in &events {
            let rail = match e {
                RecvEvent::Landed { rail, .. }
                | RecvEvent::Copy { rail, .. }
                | RecvEvent::Message { rail, .. }
                | RecvEvent::PassEnded { rail, .. }
                | RecvEvent::Down { rail, .. } => *rail,
            };
            if let Some(r) = self.rails.get_mut(rail) {
                r.last_news = Some(now);
            }
        }
        for e in events.drain(..) {
            match e {
                RecvEvent::Landed {
                    rail,
                    index,
                    sent_crc,
                    landed_crc,
                } => {
                    news = true;
                    let Some((items, first)) = pass.as_mut() else {
                        continue;
                    };
                    let Some(p) = items.position(index) else {
                        continue;
                    };
                    if !items.land(p, sent_crc, landed_crc) {
                        continue;
                    }
                    let len = items.plan.get(index).map_or(0, |c| c.len);
                    if *first {
                        self.got += len;
                    }
                    if let Some(r) = self.rails.get_mut(rail) {
                        r.items += 1;
                        r.bytes += len;
                    }
                }
                RecvEvent::Copy { rail, .. } => {
                    news = true;
                    if let Some(r) = self.rails.get_mut(rail) {
                        r.copies += 1;
                    }
                }
                RecvEvent::Message { rail, bytes } => {
                    news = true;
                    if let Err(why) = self.messages.push(rail, bytes) {
                        self.stop_rail(rail, why);
                    }
                }
                RecvEvent::PassEnded { rail, failed } => {
                    news = true;
                    if let Some(r) = self.rails.get_mut(rail) {
                        r.ended = true;
                    }
                    // The rails the sender gave up carry nothing more of this pass.
                    for g in 0..self.rails.len() {
                        if failed & 1u32.checked_shl(g as u32).unwrap_or(0) != 0 {
                            self.stop_rail(g, "the sender gave it up".into());
                        }
                    }
                }
                RecvEvent::Down { rail, why } => {
                    news = true;
                    if let Some(r) = self.rails.get_mut(rail) {
                        if r.stopped.is_none() {
                            r.stopped = Some(why);
                        }
                    }
                }
            }
        }
        self.events = events;
        if let Err(e) = polled {
            // Every rail's own reason (a reader's protocol error, say) says more than the
            // link's "gone".
            return Err(Stop::Broken(
                match self.rails.iter().all(|r| r.stopped.is_some()) {
                    true => self.no_rail_left(),
                    false => e.0,
                },
            ));
        }
        Ok(news)
    }

    /// What came over each rail, for the report; `from`: the sender's address on each,
    /// where known.
    pub fn rail_report(&self, from: &[Option<String>]) -> Vec<RecvRail> {
        self.rails
            .iter()
            .enumerate()
            .map(|(r, s)| RecvRail {
                rail: r as u16,
                from: from.get(r).cloned().flatten(),
                bytes: s.bytes,
                chunks: s.items,
                copies_dropped: s.copies,
                stopped: s.stopped.clone(),
            })
            .collect()
    }

    /// Start counting a new transfer's bytes.
    pub fn next_transfer(&mut self) {
        self.got = 0;
    }
}
