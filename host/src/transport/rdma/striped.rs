//! The sender of a transfer striped over several verbs rails (write mode).
//!
//! 1. Each rail gets its own event channel, CM id (resolved to its receiver address and
//!    checked against its `--nic`), PD and CQ; the source's memory is registered on
//!    every rail's PD (the same memory: for GPU memory the same dma-buf, which the source
//!    exports once and every registration borrows).
//! 2. The first rail that opened (rail 0, unless its route is down or it rests after a
//!    failure) connects with the header (striped flag, rail count) and gets a
//!    [`StripedAccept`]: the buffer, its rkey there, and a token. Every further rail
//!    connects with a [`Join`] (token, rail index) and gets that rail's [`AcceptInfo`]:
//!    the same buffer, registered on the receiver's device of that rail.
//! 3. The chunks go through the same [`Schedule`] as an unstriped transfer, over a wire
//!    that posts each chunk on the live rail with the fewest in flight ([`RailBook`]) as
//!    an RDMA WRITE_WITH_IMM (imm = chunk index + 1, signaled), so the receiver knows per
//!    chunk what landed, whichever rail carried it.
//! 4. A rail that fails (a failed completion, a port-down event of its device, or no
//!    completion for `--rail-timeout` while another rail completes) is disconnected, its
//!    chunks in flight are posted again on the others, and it rests ([`Cooldowns`], as
//!    TCP's rails). Rail 0 too, once the accept is in: the offer and the accept need it,
//!    the ack does not. Only when no rail is left (or the receiver has already acked and
//!    closed rail 0: it ended the transfer) does a failure end the transfer.
//! 5. The receiver verifies once every chunk has landed and sends the ack on every rail
//!    still up; the sender keeps a receive for it posted on every rail and takes the
//!    first.
//!
//! Only what the whole pass keeps in place may be striped: a staging ring reuses a
//! slot once its chunk is reported done, and a failed rail might still read the slot;
//! such a transfer goes over rail 0 alone, the other rails reported left out.
//! Only pattern checks (or none): the checksum rounds of `repair.rs` are not striped.

use super::conn::{
    is_data, tag, Connection, Resources, DISCONNECT_GRACE, INDEX_MASK, TAG_DATA, WR_ACK,
};
use super::opening::{
    check_device, check_message_size, choose_source, connect, offer, register_source, resolve,
    RailTarget, Replies, SendConfig,
};
use super::rails::RailBook;
use crate::memory::SendMemory;
use crate::rdma::{
    self, CmId, Completion, Deadline, EventChannel, MemoryRegion, QpCaps, RdmaError, SendOp, SendWr,
};
use crate::server::key::NONCE_LEN;
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::{Framed, Integrity, RailReport};
use crate::transfer::schedule::{self, ChunkWire, Posted, Schedule};
use crate::transfer::{SendReport, TransferError};
use crate::wire::{AcceptInfo, Join, Op, RejectReason, StripedAccept, VerbsProof, MAX_VERBS_RAILS};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Why a transfer with several rails cannot be striped, if it cannot (it then goes over
/// the first rail, and the CLI says so in one line).
pub fn why_not_striped(cfg: &SendConfig, reuse_connection: bool, raw: bool) -> Option<String> {
    let why = if cfg.op != Op::Write {
        "striping over verbs needs --op write"
    } else if raw {
        "--raw sends one message"
    } else if reuse_connection {
        "--reuse-connection is not striped over verbs"
    } else if cfg.payload.verify.checksum() || cfg.payload.faults.is_some() {
        "--verify checksum is not striped over verbs (pattern checks only)"
    } else if cfg.payload.name.is_some() {
        "--name/--input is not striped over verbs"
    } else if cfg.rails.len() > MAX_VERBS_RAILS as usize {
        "more than 8 rails"
    } else if cfg.key.is_some() {
        // A further rail's join carries no proof of the key, so a receiver with a key
        // refuses it (WireError::KeyedVerbsStriping): rail 0 alone proves it.
        "--key-file is not striped over verbs (a further rail's join cannot prove the key; TCP's streams can)"
    } else {
        return None;
    };
    Some(why.to_string())
}

/// One rail's objects before its queue pair: resolved and with its PD and CQ.
struct Opened {
    /// Its place in the sender's list.
    rail: usize,
    target: RailTarget,
    id: Rc<CmId>,
    res: Resources,
    label: String,
}

/// The name a rail rests under (its device, else its address).
fn cooldown_label(t: &RailTarget) -> String {
    format!(
        "rdma {}",
        t.nic.clone().unwrap_or_else(|| t.peer.ip().to_string())
    )
}

/// A striped transfer (write mode, one transfer): see the module documentation.
pub fn send(cfg: &SendConfig, memory: &mut SendMemory) -> Result<SendReport, TransferError> {
    let striped = match attempt(cfg, memory, None) {
        // A receiver with a key answered with a nonce: connect again, proving the key
        // over it (once), as an unstriped sender does.
        Err(TransferError::Rejected(RejectReason::KeyChallenge { nonce })) if cfg.key.is_some() => {
            attempt(cfg, memory, Some(nonce))?
        }
        other => other?,
    };
    match striped {
        Striped::Done(report) => Ok(report),
        Striped::OneRail { via, others } => one_rail(cfg, memory, via, others),
    }
}

/// How [`attempt`] ended: the transfer, or a reason to send over one rail alone.
// The report is much larger than the other variant, but there is one of it per transfer.
#[allow(clippy::large_enum_variant)]
enum Striped {
    Done(SendReport),
    /// Not striped: over rail `via` (the first that opened), with the report of every
    /// other rail (why it is left out). The source stages its data through a ring
    /// (`--mem staged`), or no other rail could be opened, registered or taken (resting
    /// after a failure). A striped offer names two rails at least; a receiver refuses
    /// one of one rail.
    OneRail {
        via: usize,
        others: Vec<RailReport>,
    },
}

/// Why a staging ring is not striped (see the module documentation).
const RING_WHY: &str =
    "not striped: the memory path stages the data through a ring (striping needs it in place)";

/// The transfer over rail `via` alone, unstriped; `others`: the other rails, left out.
fn one_rail(
    cfg: &SendConfig,
    memory: &mut SendMemory,
    via: usize,
    mut others: Vec<RailReport>,
) -> Result<SendReport, TransferError> {
    let mut single = cfg.clone();
    single.rails.clear();
    single.peer = cfg.rails[via].peer;
    single.nic = cfg.rails[via].nic.clone();
    let mut report = super::sender::send(&single, memory)?;
    let first = RailReport {
        bytes: report.bytes,
        chunks: report.chunks,
        left_out: None,
        local: report.device.clone(),
        ..left_out(via, &cfg.rails[via], String::new())
    };
    others.retain(|r| r.rail != via);
    others.push(first);
    others.sort_by_key(|r| r.rail);
    report.rails = others;
    Ok(report)
}

/// Every rail but rail `via`, left out for `why`.
fn all_but(cfg: &SendConfig, via: usize, why: &str) -> Vec<RailReport> {
    let rails = cfg.rails.iter().enumerate().filter(|(k, _)| *k != via);
    rails.map(|(k, t)| left_out(k, t, why.into())).collect()
}

fn striped_offer(cfg: &SendConfig, rails: usize) -> Result<crate::wire::Header, TransferError> {
    offer(cfg, 1)?
        .with_rails(rails as u8)
        .map_err(|e| TransferError::Protocol(format!("cannot offer this transfer: {e}")))
}

/// The rails that may carry chunks now, and the reports of those resting after a
/// failure; when every rail rests, all of them are tried (resting is a preference, not
/// a reason to send nothing).
fn rails_now(cfg: &SendConfig) -> (Vec<usize>, Vec<RailReport>) {
    let now = Instant::now();
    let mut usable = Vec::new();
    let mut resting = Vec::new();
    for (k, t) in cfg.rails.iter().enumerate() {
        match cfg.cooldowns.resting(&cooldown_label(t), now) {
            Some(left) => resting.push(left_out(
                k,
                t,
                format!("resting {:.1} s more after a failure", left.as_secs_f64()),
            )),
            None => usable.push(k),
        }
    }
    if usable.is_empty() {
        return ((0..cfg.rails.len()).collect(), Vec::new());
    }
    (usable, resting)
}

fn left_out(rail: usize, t: &RailTarget, why: String) -> RailReport {
    RailReport::idle(rail, t.nic.clone(), t.peer.to_string(), Some(why))
}

/// One striped attempt; with `nonce`, proving the key over it after rail 0's header.
fn attempt(
    cfg: &SendConfig,
    memory: &mut SendMemory,
    nonce: Option<[u8; NONCE_LEN]>,
) -> Result<Striped, TransferError> {
    let t0 = Instant::now();
    let plan = ChunkPlan::new(cfg.bytes, cfg.chunk).map_err(TransferError::Protocol)?;
    rdma::ensure_device()?;
    let (usable, mut reports) = rails_now(cfg);

    // --- each rail: resolve, check its device, PD and CQ ------------------------------
    let caps = QpCaps {
        max_send_wr: cfg.depth + 1,
        max_recv_wr: 2,
        max_inline_data: 0,
    };
    // The first rail that opens carries the offer (rail 0 unless it cannot).
    let mut opened: Vec<Opened> = Vec::new();
    let mut first_error: Option<TransferError> = None;
    for &k in &usable {
        let target = cfg.rails[k].clone();
        let open = || -> Result<(Rc<CmId>, Resources), TransferError> {
            let channel = EventChannel::new()?;
            let id = CmId::new(&channel)?;
            resolve(&id, target.peer, cfg.timeout)?;
            check_message_size(&id, plan.chunk_bytes(), "a chunk (--chunk)")?;
            check_device(&id, target.nic.as_deref(), target.peer)?;
            let res = Resources::new(&id, Resources::cq_entries(caps), cfg.busy_poll)?;
            Ok((id, res))
        };
        match open() {
            Ok((id, res)) => {
                let device = id.device_name().unwrap_or_else(|| "?".into());
                let port = id.port_info().map(|p| p.port_num).unwrap_or(1);
                opened.push(Opened {
                    rail: k,
                    target: target.clone(),
                    id,
                    res,
                    label: format!("{device}:{port}"),
                });
            }
            Err(e) => {
                reports.push(left_out(k, &target, format!("not opened: {e}")));
                first_error.get_or_insert(e);
            }
        }
    }
    match (opened.first(), first_error) {
        (None, Some(e)) => return Err(e),
        (None, None) => {
            return Err(TransferError::Protocol("no rail to open".into()));
        }
        // Nothing was connected yet: the one rail that opened carries it alone.
        (Some(o), _) if opened.len() < 2 => {
            return Ok(Striped::OneRail {
                via: o.rail,
                others: reports,
            })
        }
        _ => {}
    }

    // --- the memory: chosen on rail 0's device, registered on every rail's -----------
    let making_before = memory.making_time();
    let (source, memory_log, making) = choose_source(&opened[0].res, memory, making_before)?;
    if source.max_chunks_in_flight().is_some() {
        let via = opened[0].rail;
        return Ok(Striped::OneRail {
            via,
            others: all_but(cfg, via, RING_WHY),
        });
    }
    let mut mrs: Vec<MemoryRegion> = Vec::new();
    let mut kept: Vec<Opened> = Vec::new();
    let control = opened[0].rail;
    for o in opened {
        match register_source(&o.res, source) {
            Ok(mr) => {
                mrs.push(mr);
                kept.push(o);
            }
            // The memory was chosen on this rail's device: it must register there.
            Err(e) if o.rail == control => return Err(e),
            Err(e) => reports.push(left_out(o.rail, &o.target, format!("not registered: {e}"))),
        }
    }
    if kept.len() < 2 {
        return Ok(Striped::OneRail {
            via: control,
            others: reports,
        });
    }
    let opened = kept;
    let schedule = {
        let mut s = Schedule::new(plan, cfg.depth, source, cfg.timeout);
        s.progress = cfg.progress;
        s
    };
    // A receive for the ack on every rail: the receiver sends it on each rail still up.
    let replies: Vec<Replies> = opened
        .iter()
        .map(|o| Replies::new(&o.res, 1, false))
        .collect::<Result<_, _>>()?;
    let conns: Vec<Connection> = opened
        .iter()
        .map(|o| Connection::new(&o.res, caps))
        .collect::<Result<_, _>>()?;
    for (conn, replies) in conns.iter().zip(&replies) {
        replies.post(conn, 0)?;
    }

    // --- rail 0: the offer; then the joins --------------------------------------------
    let rails = opened.len();
    let header = striped_offer(cfg, rails)?;
    let header_bytes = header.encode_with_version(cfg.protocol_version);
    let with_proof = match (nonce, &cfg.key) {
        (Some(nonce), Some(key)) => Some(
            VerbsProof {
                nonce_id: VerbsProof::nonce_id(&nonce),
                tag: key.prove_truncated(&header_bytes, &nonce),
            }
            .private_data(&header_bytes),
        ),
        _ => None,
    };
    let private_data: &[u8] = match &with_proof {
        Some(data) => data,
        None => &header_bytes,
    };
    let accept_data = connect(
        &opened[0].id,
        opened[0].target.peer,
        private_data,
        cfg.timeout,
        false,
    )?;
    let first = StripedAccept::decode(&accept_data).map_err(|e| {
        conns[0].close(true, DISCONNECT_GRACE);
        TransferError::Protocol(format!(
            "the receiver at {} did not accept a striped transfer as one ({e}); is it an older `host recv`?",
            opened[0].target.peer
        ))
    })?;
    if first.info.len < cfg.bytes {
        return Err(TransferError::Protocol(format!(
            "the receiver offered a {}-byte buffer for a {}-byte transfer",
            first.info.len, cfg.bytes
        )));
    }
    // Rails that joined: their place among `opened`, and where they write.
    let mut accepts: Vec<Option<AcceptInfo>> = vec![Some(first.info)];
    for (j, o) in opened.iter().enumerate().skip(1) {
        let join = Join {
            token: first.token,
            rail: j as u8,
            rails: rails as u8,
        };
        // Bounded apart from --timeout: the receiver's wait for data runs meanwhile, and a
        // rail that cannot join is left out, not worth the whole transfer.
        let wait = cfg.timeout.min(JOIN_WAIT);
        let joined = connect(&o.id, o.target.peer, &join.encode(), wait, false).and_then(|data| {
            AcceptInfo::decode(&data)
                .map_err(|e| TransferError::Protocol(format!("its accept: {e}")))
        });
        match joined {
            Ok(a) if a.len >= cfg.bytes => accepts.push(Some(a)),
            Ok(a) => {
                accepts.push(None);
                reports.push(left_out(
                    o.rail,
                    &o.target,
                    format!("offered {} bytes", a.len),
                ));
            }
            Err(e) => {
                accepts.push(None);
                reports.push(left_out(o.rail, &o.target, format!("did not join: {e}")));
            }
        }
    }
    let connect_seconds = t0.elapsed().saturating_sub(making).as_secs_f64();

    // --- the data ----------------------------------------------------------------------
    let label = cfg.peer.to_string();
    let start = Instant::now();
    let mut wire = StripedWire {
        conns: &conns,
        mrs: &mrs,
        accepts: &accepts,
        book: RailBook::new(rails, plan.count(), start),
        posted: HashMap::new(),
        rail_timeout: cfg.rail_timeout,
        comps: Vec::new(),
        seen: VecDeque::new(),
        wrs: vec![Vec::new(); rails],
        pass: None,
        last_posted: vec![None; rails],
    };
    for (j, a) in accepts.iter().enumerate() {
        if a.is_none() {
            wire.book.fail(j, "did not join".into(), start);
        }
    }
    let ran = schedule.run(source, &mut wire, &label);
    let pending = std::mem::take(&mut wire.seen);
    let book = wire.book;
    let seconds = ran?.as_secs_f64();
    let live: Vec<bool> = (0..conns.len())
        .map(|j| accepts[j].is_some() && !book.is_failed(j))
        .collect();
    let ack = await_any_ack(&conns, &live, &replies, pending, cfg.timeout, &label)?;
    ack.check_counts(cfg.bytes)
        .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
    let round_trip_seconds = start.elapsed().as_secs_f64();
    for conn in conns.iter().skip(1) {
        conn.close(true, RAIL_CLOSE_GRACE);
    }
    conns[0].close(
        true,
        if live[0] {
            DISCONNECT_GRACE
        } else {
            RAIL_CLOSE_GRACE
        },
    );

    // --- the report --------------------------------------------------------------------
    for (j, o) in opened.iter().enumerate() {
        if accepts[j].is_none() {
            continue; // reported above
        }
        let c = book.carried(j);
        let name = cooldown_label(&o.target);
        match &c.failed {
            Some(f) => {
                cfg.cooldowns.failed(&name, f.at);
            }
            None => cfg.cooldowns.worked(&name),
        }
        reports.push(RailReport {
            rail: o.rail,
            local: Some(o.label.clone()),
            remote: o.target.peer.to_string(),
            bytes: c.bytes,
            chunks: c.chunks,
            resends: c.resends,
            failures: c.failed.is_some() as u32,
            failed_after_seconds: c
                .failed
                .as_ref()
                .map(|f| f.at.saturating_duration_since(start).as_secs_f64()),
            failed: c.failed.map(|f| f.why),
            moved_chunks: c.moved,
            stall_beyond_detection_seconds: c.stall.map(|d| d.as_secs_f64()),
            left_out: None,
        });
    }
    reports.sort_by_key(|r| r.rail);
    let framed = Framed {
        peer: &label,
        device: opened[0].id.device_name(),
        op: cfg.op.name(),
        plan: &plan,
        in_flight: schedule.window as u32,
        connect_seconds,
        path: source.path(),
        memory: &memory_log,
    };
    let mut report = framed.report(0, seconds, round_trip_seconds, &ack);
    report.integrity = Integrity {
        verify: Some(cfg.payload.verify),
        payload: Some(cfg.payload.payload),
        ..Integrity::default()
    };
    report.rails = reports;
    Ok(Striped::Done(report))
}

/// The longest a further rail's join may take (at most --timeout).
const JOIN_WAIT: Duration = Duration::from_secs(2);
/// How long a further rail's close waits for the receiver's DISCONNECTED.
/// The receiver's ack from whichever rail of `live` brings it first (`pending`: those
/// that came with the data's completions). A failed receive (a flushed rail) is skipped;
/// the end is the deadline, or every live rail closed with no ack.
fn await_any_ack(
    conns: &[Connection],
    live: &[bool],
    replies: &[Replies],
    mut pending: VecDeque<(usize, Completion)>,
    timeout: Duration,
    label: &str,
) -> Result<crate::wire::Ack, TransferError> {
    let deadline = Deadline::after(timeout);
    let mut comps = Vec::new();
    loop {
        while let Some((r, c)) = pending.pop_front() {
            if c.is_ok() {
                return replies[r].ack(&c);
            }
        }
        let mut open = 0;
        for (r, conn) in conns.iter().enumerate().filter(|(r, _)| live[*r]) {
            comps.clear();
            conn.cq.poll(&mut comps)?;
            pending.extend(
                comps
                    .iter()
                    .filter(|c| tag(c.wr_id) == WR_ACK)
                    .map(|c| (r, *c)),
            );
            if !matches!(conn.poll_events(), Ok(true) | Err(_)) {
                open += 1;
            }
        }
        if !pending.is_empty() {
            continue;
        }
        if open == 0 {
            return Err(TransferError::Protocol(format!(
                "the receiver at {label} closed every rail without reporting its verification"
            )));
        }
        if deadline.expired() {
            return Err(deadline
                .timeout_error(format!("the verification result from {label}"))
                .into());
        }
        std::thread::sleep(IDLE_NAP);
    }
}

const RAIL_CLOSE_GRACE: Duration = Duration::from_millis(500);
/// How long the wire sleeps when no rail had news (it polls them in turn).
const IDLE_NAP: Duration = Duration::from_micros(100);

/// The schedule's wire over several rails.
struct StripedWire<'a, 'r> {
    conns: &'a [Connection<'r>],
    mrs: &'r [MemoryRegion<'r>],
    /// Where each rail writes (`None`: it did not join).
    accepts: &'a [Option<AcceptInfo>],
    book: RailBook,
    /// Every chunk handed over and not yet done, to post again on a failover.
    posted: HashMap<u64, Posted>,
    rail_timeout: Duration,
    comps: Vec<Completion>,
    /// Replies (acks) that came with the data's completions, with their rail: the ack of
    /// a receiver that verified before the last completions came in, or an early one.
    seen: VecDeque<(usize, Completion)>,
    /// Work requests per rail, posted as one list each.
    wrs: Vec<Vec<SendWr<'r>>>,
    /// The pass of the chunks posted, for the reports.
    pass: Option<schedule::Pass>,
    /// Each rail's last data request posted, and whether its completion was seen.
    last_posted: Vec<Option<(u64, bool)>>,
}

impl<'r> StripedWire<'_, 'r> {
    /// Post `chunks` (`again`: a failed rail's) on the live rails.
    ///
    /// # Safety
    /// As [`ChunkWire::post`] says for the chunks' bytes.
    unsafe fn post_on_rails(
        &mut self,
        chunks: &[Posted],
        again: bool,
    ) -> Result<(), schedule::WireError> {
        for p in chunks {
            let Some(r) = self.book.pick() else {
                return Err(schedule::WireError::Broken(format!(
                    "every rail failed (rail 0: {})",
                    self.book
                        .carried(0)
                        .failed
                        .map_or_else(|| "?".into(), |f| f.why)
                )));
            };
            let Some(accept) = self.accepts[r] else {
                continue; // not reached: a rail that did not join is failed
            };
            self.wrs[r].push(SendWr {
                wr_id: TAG_DATA | p.chunk.index,
                sge: self.mrs[r].sge(p.bytes.clone())?,
                op: SendOp::WriteWithImm {
                    remote_addr: accept.addr + p.chunk.offset,
                    rkey: accept.rkey,
                    // Chunks through this one, as every repair path does (n < 2^32).
                    imm: (p.chunk.index + 1) as u32,
                },
                // Each chunk's completion says which rail finished it.
                signaled: true,
                inline: false,
                solicited: false,
            });
            self.book.posted(
                r,
                p.chunk.index,
                p.bytes.len() as u64,
                again,
                Instant::now(),
            );
            self.posted.insert(p.chunk.index, p.clone());
        }
        self.pass = chunks.last().map(|p| p.pass).or(self.pass);
        for r in 0..self.wrs.len() {
            let wrs = std::mem::take(&mut self.wrs[r]);
            if wrs.is_empty() {
                continue;
            }
            self.last_posted[r] = wrs.last().map(|wr| (wr.wr_id, false));
            // SAFETY: every SGE lies in rail r's registration of the source's memory (the
            // region checked the range); the caller keeps those bytes unmodified until we
            // report them done, and the source is no staging ring (checked at the start),
            // so a failed rail's late read finds the same bytes.
            let posted = unsafe { self.conns[r].qp.post_send_list(&wrs) };
            if let Err(e) = posted {
                self.fail(r, format!("posting failed: {e}"))?;
            }
        }
        Ok(())
    }

    /// Rail `r` failed: disconnect it and post its chunks in flight on the others. The
    /// transfer ends when no other rail is left, and when rail 0 closes after an ack came
    /// (the receiver ended the transfer early: its ack says why).
    fn fail(&mut self, r: usize, why: String) -> Result<(), schedule::WireError> {
        if self.book.is_failed(r) {
            return Ok(());
        }
        let others_live = (0..self.conns.len())
            .any(|k| k != r && self.accepts[k].is_some() && !self.book.is_failed(k));
        if r == 0 && (!others_live || !self.seen.is_empty()) {
            return Err(schedule::WireError::Broken(format!("rail 0 failed: {why}")));
        }
        let now = Instant::now();
        let moved = self.book.fail(r, why, now);
        let _ = self.conns[r].id.disconnect();
        let again: Vec<Posted> = moved
            .iter()
            .filter_map(|i| self.posted.get(i).cloned())
            .collect();
        // SAFETY: these chunks were handed to us and are not reported done yet: the
        // schedule keeps their bytes.
        unsafe { self.post_on_rails(&again, true) }
    }

    /// Take what the rails have to say; true if a chunk completed.
    fn poll(&mut self) -> Result<bool, schedule::WireError> {
        let mut progress = false;
        let now = Instant::now();
        for r in 0..self.conns.len() {
            if self.accepts[r].is_none() {
                continue;
            }
            self.comps.clear();
            self.conns[r].cq.poll(&mut self.comps)?;
            let comps = std::mem::take(&mut self.comps);
            for c in &comps {
                if tag(c.wr_id) == WR_ACK {
                    // The receiver's ack (or an early one: too slow) with the data. A
                    // failed one is a failed rail's flushed receive: no ack came, and
                    // counting it would make rail 0's failure end the transfer.
                    if c.is_ok() {
                        self.seen.push_back((r, *c));
                    }
                    continue;
                }
                if !is_data(c.wr_id) {
                    continue;
                }
                let index = c.wr_id & INDEX_MASK;
                if let Some((last, seen)) = &mut self.last_posted[r] {
                    *seen |= *last == c.wr_id;
                }
                if !c.is_ok() {
                    if !self.book.is_failed(r) {
                        let why = self.conns[r]
                            .device_fault_within(Duration::ZERO)
                            .unwrap_or_else(|| {
                                format!("RDMA_WRITE_WITH_IMM of chunk {index}: {}", c.status_str())
                            });
                        self.fail(r, why)?;
                    }
                    continue;
                }
                if self.book.completed(r, index, now) {
                    self.posted.remove(&index);
                    progress = true;
                }
            }
            self.comps = comps;
            if self.book.is_failed(r) {
                continue;
            }
            match self.conns[r].poll_events() {
                Ok(false) => {}
                Ok(true) => self.fail(r, "the receiver closed this rail".into())?,
                Err(RdmaError::DeviceFault(fault)) => self.fail(r, fault)?,
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(r) = self.book.overdue(Instant::now(), self.rail_timeout) {
            let why = format!(
                "no completion for {} with {} chunks in flight while another rail completed",
                rdma::format_duration(self.rail_timeout),
                self.book.in_flight(r)
            );
            self.fail(r, why)?;
        }
        Ok(progress)
    }
}

// SAFETY: a chunk is reported done only once a completion for it came on some rail (the
// NIC of that rail finished reading it); a copy still in flight on a failed rail reads
// the same unchanged bytes (the source is no staging ring, see `attempt`), and the
// source's memory stays registered until every queue pair is destroyed; drain puts every
// queue pair with requests out into the error state, where none runs any more.
unsafe impl ChunkWire for StripedWire<'_, '_> {
    fn batch(&self) -> usize {
        16
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), schedule::WireError> {
        // SAFETY: the caller's promise.
        unsafe { self.post_on_rails(chunks, false) }
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<schedule::Done>, schedule::WireError> {
        loop {
            if self.poll()? {
                return Ok(self
                    .book
                    .done_through()
                    .zip(self.pass)
                    .map(|(through, pass)| schedule::Done { pass, through }));
            }
            // An ack seen here may have overtaken the last data completions of another
            // rail (the receiver acks once every chunk landed): those still come. One
            // that ends the transfer early comes with a disconnect, which ends it here.
            if deadline.expired() {
                return Err(schedule::WireError::Broken(
                    deadline.timeout_error("the data's completions").to_string(),
                ));
            }
            std::thread::sleep(IDLE_NAP);
        }
    }

    /// Every rail's queue pair whose last request is still out goes to the error state,
    /// which flushes what is queued ([`Connection::quiesce`]): a failed rail's too, whose
    /// late reads the source's unchanged bytes allowed until now.
    fn drain(&mut self, _deadline: &Deadline) {
        for (r, last) in self.last_posted.iter().enumerate() {
            if let Some((wr_id, false)) = *last {
                self.conns[r].quiesce(wr_id);
            }
        }
    }
}
