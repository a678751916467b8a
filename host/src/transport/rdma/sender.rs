//! The sending side: connect with a header, post the chunks with `depth` in flight, wait
//! for the receiver's verdict.

use super::conn::{
    is_data, tag, Connection, Resources, Waited, DISCONNECT_GRACE, INDEX_MASK, TAG_DATA, WR_ACK,
    WR_CTRL, WR_REPLY,
};
use super::opening::{
    check_message_size, check_nic, choose_source, connect, offer, register_source, resolve,
    Replies, SendConfig,
};
use super::repair::{self, Subset, CONTROL_SLOT, REPLY_SLOTS};
use crate::memory::RegistrationTarget;
use crate::memory::{SendMemory, SendSource};
use crate::rdma::{
    self, CmId, Completion, Deadline, EventChannel, MemoryRegion, MessageBuffer, QpCaps, SendOp,
    SendWr, POST_LIST_MAX,
};
use crate::transfer::faults::FaultInjector;
use crate::transfer::plan::ChunkPlan;
use crate::transfer::repair::Requests;
use crate::transfer::report::{Framed, Integrity, Repaired};
use crate::transfer::schedule::{self, ChunkWire, Posted, Schedule};
use crate::transfer::units::format_bytes;
use crate::transfer::{gigabytes_per_second, SendReport, TransferError};
use crate::wire::{
    encode_name, AcceptInfo, Ack, AckStatus, Op, RejectReason, Resend, VerbsProof, WireError,
    ACK_LEN, HEADER_FLAG_REPEAT, RAW_IMM, REPLY_PREFIX_LEN, RESEND_MAGIC,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Whether the RDMA CM resolves `peer`'s address and route to an RDMA device, within
/// `timeout` (for `--transport auto`): the first steps of a connection, then dropped.
/// Returns the name of the device the route leaves through (whose facts decide the
/// memory path).
pub fn reachable(peer: SocketAddr, timeout: Duration) -> Result<Option<String>, TransferError> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, peer, timeout)?;
    // Resolution bound the id to the device the route leaves through.
    Ok(id.device_name())
}

/// One framed transfer of `memory`'s data to `cfg.peer`, over one connection (the
/// rails are [`super::send`]'s to choose).
pub(super) fn send(cfg: &SendConfig, memory: &mut SendMemory) -> Result<SendReport, TransferError> {
    let mut reports = send_repeated(cfg, memory, 1)?;
    reports
        .pop()
        .ok_or_else(|| TransferError::Protocol("no transfer was made".into()))
}

/// `transfers` framed transfers of `source` on one connection (`--reuse-connection`).
/// The receiver verifies and acks each; the next starts only after the ack has arrived,
/// so each report's `round_trip_seconds` is one whole round trip (data out, verification,
/// ack back) without connection setup. The first report carries the setup time, the
/// others 0. With `transfers == 1` the wire traffic is exactly [`send`](super::send)'s.
pub fn send_repeated(
    cfg: &SendConfig,
    memory: &mut SendMemory,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    match connect_and_send(cfg, memory, transfers, None) {
        // A receiver with a key answered the first request with a nonce: connect again,
        // proving the key over it (once; a second challenge is an error like any other).
        Err(TransferError::Rejected(RejectReason::KeyChallenge { nonce })) => {
            let Some(key) = &cfg.key else {
                return Err(TransferError::Rejected(RejectReason::KeyChallenge {
                    nonce,
                }));
            };
            let header = offer(cfg, transfers)?.encode_with_version(cfg.protocol_version);
            let proof = VerbsProof {
                nonce_id: VerbsProof::nonce_id(&nonce),
                tag: key.prove_truncated(&header, &nonce),
            };
            connect_and_send(cfg, memory, transfers, Some(proof))
        }
        other => other,
    }
}

/// [`send_repeated`]'s one connection, with `proof` of the key after the header.
fn connect_and_send(
    cfg: &SendConfig,
    memory: &mut SendMemory,
    transfers: u32,
    proof: Option<VerbsProof>,
) -> Result<Vec<SendReport>, TransferError> {
    let t0 = Instant::now();
    let total = cfg.bytes;
    let plan = ChunkPlan::new(total, cfg.chunk).map_err(TransferError::Protocol)?;
    let n = plan.count();
    let header = offer(cfg, transfers)?;
    let label = cfg.peer.to_string();

    rdma::ensure_device()?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, cfg.peer, cfg.timeout)?;
    check_message_size(&id, plan.chunk_bytes(), "a chunk (--chunk)")?;
    check_nic(&id, cfg)?;

    // Memory is registered before the queue pair exists, so that the queue pair, which
    // may only name regions that outlive it, is torn down first. The CQ is sized for the
    // deepest window the queue pair may get.
    let checksums = header.verify.checksum();
    let reply_slots = if checksums { REPLY_SLOTS } else { 1 };
    let most = QpCaps {
        max_send_wr: cfg.depth + 1,
        max_recv_wr: reply_slots + 1,
        max_inline_data: 0,
    };
    let res = Resources::new(&id, Resources::cq_entries(most), cfg.busy_poll)?;
    let making_before = memory.making_time();
    let (source, memory_log, making) = choose_source(&res, memory, making_before)?;
    let data_mr = register_source(&res, source)?;
    let mut schedule = Schedule::new(plan, cfg.depth, source, cfg.timeout);
    schedule.progress = cfg.progress;
    let window = schedule.window as u32;
    let caps = QpCaps {
        max_send_wr: window + 1,
        ..most
    };
    let host = host_memory(source);
    let sums = Checksums::new(cfg, source, host.is_some(), &plan)?;
    // Copies of the chunks a fault is injected into, one per chunk in flight (test only).
    let scratch = match cfg.payload.faults {
        Some(_) => (0..window)
            .map(|_| MessageBuffer::new(&res.pd, plan.chunk_bytes() as usize))
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let replies = Replies::new(&res, reply_slots, checksums)?;
    let ctrl_buf = MessageBuffer::new(&res.pd, CONTROL_SLOT)?;
    let conn = Connection::new(&res, caps)?;
    for slot in 0..reply_slots {
        replies.post(&conn, slot)?;
    }
    if checksums {
        // The receiver's resend requests may come back to back: a receive not yet
        // reposted costs a 0.64 ms retry, not the CM's 655 ms.
        let _ = conn.qp.set_min_rnr_timer(12);
    }

    let header_bytes = header.encode_with_version(cfg.protocol_version);
    let with_proof = proof.map(|p| p.private_data(&header_bytes));
    let private_data: &[u8] = match &with_proof {
        Some(data) => data,
        None => &header_bytes,
    };
    let accept_data =
        connect(&id, cfg.peer, private_data, cfg.timeout, false).map_err(|e| match e {
            TransferError::Rejected(RejectReason::BadHeader(WireError::UnknownFlags { flags }))
                if header.repeats() && flags & HEADER_FLAG_REPEAT != 0 =>
            {
                TransferError::Protocol(format!(
                    "receiver rejected the transfer: it does not know --reuse-connection (unknown flags {flags:#04x}); update it, or drop --reuse-connection"
                ))
            }
            e => e,
        })?;
    let accept = match AcceptInfo::decode(&accept_data) {
        Ok(a) => a,
        Err(e) => {
            conn.close(true, DISCONNECT_GRACE);
            let why = match e {
                WireError::BadMagic {
                    got: [0, 0, 0, 0], ..
                }
                | WireError::Short { got: 0, .. } => "no accept data".to_string(),
                e => e.to_string(),
            };
            return Err(TransferError::NotFramed { peer: label, why });
        }
    };
    if cfg.op == Op::Write && accept.len < total {
        conn.close(true, DISCONNECT_GRACE);
        return Err(TransferError::Protocol(format!(
            "the receiver offered a {}-byte buffer for a {total}-byte transfer",
            accept.len
        )));
    }
    // Generating the data is not connection setup.
    let connect_seconds = t0.elapsed().saturating_sub(making).as_secs_f64();

    let device = id.device_name();
    let op = match cfg.op {
        Op::Send => WireOp::Send,
        Op::Write => WireOp::Write(accept),
    };
    let tamper = cfg.payload.faults.map(|faults| Tamper {
        faults,
        scratch: &scratch,
        attempt: 0,
        injected: 0,
    });
    let mut ends = WireEnds {
        conn: &conn,
        data_mr: &data_mr,
        replies: Some(&replies),
        op,
        chunks: n,
        label: &label,
        host,
        tamper,
    };
    let mut pending: VecDeque<Completion> = VecDeque::new();
    if let Some(name) = &cfg.payload.name {
        // The name goes first, into the receive the receiver posted before the data's
        // (header flag 0x02).
        let message = encode_name(name)
            .map_err(|e| TransferError::Protocol(format!("--name {name:?}: {e}")))?;
        let what = format!("the transfer's name to reach {label}");
        send_message(
            &conn,
            &ctrl_buf,
            WR_CTRL,
            &message,
            &mut pending,
            cfg.timeout,
            &what,
        )?;
    }
    let mut reports = Vec::new();
    for k in 0..transfers {
        let mut integrity = Integrity {
            verify: Some(cfg.payload.verify),
            payload: Some(cfg.payload.payload),
            fault_injection: cfg.payload.faults.map(|f| format!("1/{}", f.one_in)),
            name: cfg.payload.name.clone(),
            ..Integrity::default()
        };
        let mut wire = ends.wire(sums.on_the_way(), None);
        let start = Instant::now();
        let ran = schedule.run(source, &mut wire, &label);
        let (crcs, seen) = wire.finish(&mut ends);
        pending.extend(seen);
        let seconds = ran?.as_secs_f64();
        let ack = if checksums {
            let crcs = sums.of_this_transfer(crcs)?;
            let mut talk = Talk {
                ends: &mut ends,
                replies: &replies,
                ctrl_buf: &ctrl_buf,
                pending: &mut pending,
                timeout: cfg.timeout,
            };
            // The CRC32C of what was sent, by the combine rule over the chunks' CRC32Cs:
            // a verified ack must carry the same.
            let digest = crate::integrity::digest(&crcs, plan.chunk_bytes(), plan.total());
            let (ack, repaired) =
                talk.checked_transfer(&schedule, source, &crcs, digest, cfg.payload.max_resends)?;
            integrity.digest = Some(digest);
            integrity.chunks_checked =
                n + repaired.iter().map(|r| r.attempts as u64 - 1).sum::<u64>();
            integrity.repaired = repaired;
            ack
        } else {
            let ack = await_ack(&conn, &mut pending, &replies, cfg.timeout, &label)?;
            replies.repost(&conn, &ack.1)?;
            ack.0
        };
        ack.check_counts(total)
            .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
        let round_trip_seconds = start.elapsed().as_secs_f64();
        let framed = Framed {
            peer: &label,
            device: device.clone(),
            op: cfg.op.name(),
            plan: &plan,
            in_flight: window,
            connect_seconds,
            path: source.path(),
            memory: &memory_log,
        };
        let mut report = framed.report(k, seconds, round_trip_seconds, &ack);
        report.integrity = std::mem::take(&mut integrity);
        reports.push(report);
    }
    conn.close(true, DISCONNECT_GRACE);
    Ok(reports)
}

/// The source's bytes as the CPU can read them, where they lie in host memory (a host
/// buffer, a staging ring, mapped memory): the sender computes each chunk's CRC32C
/// there, and copies a chunk it injects a fault into.
fn host_memory(source: &dyn SendSource) -> Option<(NonNull<u8>, usize)> {
    match source.memory().target() {
        RegistrationTarget::Host { ptr, len } => Some((ptr, len)),
        _ => None,
    }
}

/// Where the chunks' CRC32Cs of a transfer come from.
enum Checksums {
    /// None are sent (`--verify pattern|off`).
    Off,
    /// The wire computes them from host memory as it posts each chunk.
    OnTheWay,
    /// Computed on the GPU before the data goes (GPU memory the NIC reads directly):
    /// the same for every transfer of the connection.
    Before(Vec<u32>),
}

impl Checksums {
    fn new(
        cfg: &SendConfig,
        source: &dyn SendSource,
        in_host_memory: bool,
        plan: &ChunkPlan,
    ) -> Result<Checksums, TransferError> {
        if cfg.payload.faults.is_some() && !in_host_memory {
            return Err(TransferError::Protocol(
                "--test-inject-faults needs the data in host memory (--mem host, staged or mapped): it corrupts a copy of the chunk made by the CPU".into(),
            ));
        }
        if !cfg.payload.verify.checksum() {
            return Ok(Checksums::Off);
        }
        // Data whose home is GPU memory (GPUDirect RDMA, or staged through a host ring) is
        // checksummed by the GPU kernel before it goes; host memory by the CPU as each
        // chunk is posted.
        match source.chunk_checksums(plan.chunk_bytes() as usize) {
            None if in_host_memory => Ok(Checksums::OnTheWay),
            Some(Ok(crcs)) if crcs.len() as u64 == plan.count() => Ok(Checksums::Before(crcs)),
            Some(Ok(crcs)) => Err(TransferError::Protocol(format!(
                "{} chunk checksums computed for {} chunks",
                crcs.len(),
                plan.count()
            ))),
            Some(Err(e)) => Err(TransferError::Memory(e.context("chunk checksums on the GPU"))),
            None => Err(TransferError::Protocol(
                "--verify checksum: this memory path offers no way to compute the chunks' checksums"
                    .into(),
            )),
        }
    }

    /// Whether the wire computes them as it posts.
    fn on_the_way(&self) -> bool {
        matches!(self, Checksums::OnTheWay)
    }

    /// This transfer's checksums: the wire's, or those computed before.
    fn of_this_transfer(&self, from_wire: Option<Vec<u32>>) -> Result<Vec<u32>, TransferError> {
        match (self, from_wire) {
            (Checksums::Before(crcs), _) => Ok(crcs.clone()),
            (Checksums::OnTheWay, Some(crcs)) => Ok(crcs),
            _ => Err(TransferError::Protocol(
                "no chunk checksums were computed".into(),
            )),
        }
    }
}

/// Wait for the receiver's ack (whose receive is posted; among `pending` if it already
/// came with the data's completions) and decode it; also its completion, whose slot the
/// caller posts again.
pub(super) fn await_ack(
    conn: &Connection,
    pending: &mut VecDeque<Completion>,
    replies: &Replies,
    timeout: Duration,
    label: &str,
) -> Result<(Ack, Completion), TransferError> {
    let c = next_reply(conn, pending, timeout, label)?;
    Ok((replies.ack(&c)?, c))
}

/// The next reply from the receiver: the first of `pending`, or the next to complete.
fn next_reply(
    conn: &Connection,
    pending: &mut VecDeque<Completion>,
    timeout: Duration,
    label: &str,
) -> Result<Completion, TransferError> {
    let deadline = Deadline::after(timeout);
    let waiting_for_ack = format!("the verification result from {label}");
    let mut comps = Vec::new();
    loop {
        if let Some(c) = pending.pop_front() {
            c.check(|| "the receive for the receiver's reply".into())?;
            return Ok(c);
        }
        comps.clear();
        let waited = conn.wait(&mut comps, &deadline, &waiting_for_ack)?;
        for c in &comps {
            if tag(c.wr_id) == WR_ACK {
                pending.push_back(*c);
            } else if !c.is_ok() {
                c.check(|| "a work request after the data".into())?;
            }
        }
        if pending.is_empty() && waited == Waited::Disconnected {
            return Err(TransferError::Protocol(format!(
                "the receiver at {label} closed the connection without reporting its verification"
            )));
        }
    }
}

/// The sender's side of a transfer checked by checksums, after its data: the checksums
/// go out, then the receiver's requests are served until its ack.
struct Talk<'a, 'c, 'r> {
    ends: &'a mut WireEnds<'c, 'r>,
    replies: &'r Replies,
    ctrl_buf: &'r MessageBuffer,
    pending: &'a mut VecDeque<Completion>,
    timeout: Duration,
}

impl Talk<'_, '_, '_> {
    fn checked_transfer(
        &mut self,
        schedule: &Schedule,
        source: &dyn SendSource,
        crcs: &[u32],
        digest: u32,
        max_resends: u8,
    ) -> Result<(Ack, Vec<Repaired>), TransferError> {
        for (i, message) in repair::checksum_batches(crcs).enumerate() {
            self.send_control(i as u64, &message.encode())?;
        }
        let n = self.ends.chunks;
        let mut requests = Requests::new(max_resends, n);
        loop {
            let c = next_reply(self.ends.conn, self.pending, self.timeout, self.ends.label)?;
            let bytes = self.replies.read(&c);
            self.replies.repost(self.ends.conn, &c)?;
            if !bytes.starts_with(&RESEND_MAGIC) {
                let ack = Ack::decode(&bytes[..bytes.len().min(ACK_LEN)]).map_err(|e| {
                    TransferError::Protocol(format!("the receiver's ack is invalid: {e}"))
                })?;
                // An ack that does not fit the requests before it (verified after a
                // final list of chunks that still fail, say) is not believed.
                requests
                    .check_ack(&ack, Some(digest))
                    .map_err(|e| TransferError::Protocol(format!("{}: {e}", self.ends.label)))?;
                if ack.status == AckStatus::ChecksumFailed {
                    return Err(TransferError::ChecksumFailed {
                        peer: self.ends.label.to_string(),
                        chunks: requests.given_up().to_vec(),
                        rounds: requests.rounds(),
                        bound: requests.bound(),
                    });
                }
                let repaired = requests
                    .repaired()
                    .map(|(chunk, attempts)| Repaired { chunk, attempts })
                    .collect();
                return Ok((ack, repaired));
            }
            let invalid = |e: WireError| {
                TransferError::Protocol(format!("the receiver's resend request is invalid: {e}"))
            };
            let (round, last, count) = Resend::decode_prefix(&bytes, n).map_err(invalid)?;
            let body = bytes.get(REPLY_PREFIX_LEN..).unwrap_or_default();
            let resend = Resend::decode_chunks(round, last, count, body, n).map_err(invalid)?;
            let chunks = requests
                .take(&resend)
                .map_err(|e| TransferError::Protocol(format!("{}: {e}", self.ends.label)))?;
            if !chunks.is_empty() {
                if let Some(t) = &mut self.ends.tamper {
                    t.attempt = round;
                }
                let mut wire = self.ends.wire(false, Some(Subset::new(chunks)));
                let ran = schedule.run(source, &mut wire, self.ends.label);
                let (_, seen) = wire.finish(self.ends);
                self.pending.extend(seen);
                ran?;
            }
        }
    }

    /// SEND one control message and wait for its completion (replies that complete
    /// meanwhile are kept).
    fn send_control(&mut self, number: u64, message: &[u8]) -> Result<(), TransferError> {
        let what = format!("the chunk checksums to reach {}", self.ends.label);
        send_message(
            self.ends.conn,
            self.ctrl_buf,
            WR_CTRL | (number & INDEX_MASK),
            message,
            self.pending,
            self.timeout,
            &what,
        )
    }
}

/// SEND `message` from `buf` and wait for its completion; replies from the receiver
/// that complete meanwhile go to `pending`.
fn send_message<'r>(
    conn: &Connection<'r>,
    buf: &'r MessageBuffer,
    wr_id: u64,
    message: &[u8],
    pending: &mut VecDeque<Completion>,
    timeout: Duration,
    what: &str,
) -> Result<(), TransferError> {
    buf.write(message)?;
    // SAFETY: the buffer is registered, outlives the connection's use of it, and is not
    // written again before this request's completion, waited for below.
    unsafe {
        conn.qp.post_send(&SendWr {
            wr_id,
            sge: buf.sge(message.len()),
            op: SendOp::Send,
            signaled: true,
            inline: false,
            solicited: true,
        })?
    };
    let deadline = Deadline::after(timeout);
    let mut comps = Vec::new();
    loop {
        comps.clear();
        let waited = conn.wait(&mut comps, &deadline, what)?;
        let mut sent = false;
        for c in &comps {
            if tag(c.wr_id) == WR_ACK {
                pending.push_back(*c);
            } else if c.wr_id == wr_id {
                c.check(|| format!("the SEND of {what}"))?;
                sent = true;
            }
        }
        if sent {
            return Ok(());
        }
        if waited == Waited::Disconnected {
            return Err(TransferError::Protocol(format!(
                "the receiver disconnected while waiting for {what}"
            )));
        }
    }
}

/// Chunks a fault is injected into (test only): a copy in a scratch buffer, one bit
/// flipped, is posted instead of the source's bytes.
struct Tamper<'r> {
    faults: FaultInjector,
    /// One buffer of a chunk per chunk in flight: chunk `i` uses `i % len`, which the
    /// schedule's window keeps free (chunk `i + window` is handed over only after chunk
    /// `i` is done).
    scratch: &'r [MessageBuffer],
    /// 0 for the first sending, the round for a resend.
    attempt: u32,
    injected: u64,
}

/// What every wire of a connection shares.
struct WireEnds<'c, 'r> {
    conn: &'c Connection<'r>,
    data_mr: &'r MemoryRegion<'r>,
    replies: Option<&'r Replies>,
    op: WireOp,
    chunks: u64,
    label: &'c str,
    host: Option<(NonNull<u8>, usize)>,
    tamper: Option<Tamper<'r>>,
}

impl<'c, 'r> WireEnds<'c, 'r> {
    /// A wire for one pass: computing the chunks' checksums (`crcs`), or sending only
    /// `subset` again.
    fn wire(&mut self, crcs: bool, subset: Option<Subset>) -> VerbsWire<'c, 'r> {
        let mut wire = VerbsWire::new(
            self.conn,
            self.data_mr,
            self.replies,
            self.op,
            self.chunks,
            self.label,
        );
        wire.host = self.host;
        wire.crcs = crcs.then(|| vec![0; self.chunks as usize]);
        wire.tamper = self.tamper.take();
        wire.subset = subset;
        wire
    }
}

/// What a chunk becomes on the wire.
#[derive(Debug, Clone, Copy)]
enum WireOp {
    /// SEND into the receiver's posted receives; the last SEND_WITH_IMM.
    Send,
    /// RDMA WRITE into the buffer the receiver advertised; signaled ones WITH_IMM.
    Write(AcceptInfo),
    /// `--raw`: the one chunk (of `bytes`) as SEND_WITH_IMM with the seed's immediate.
    Raw { bytes: u64 },
}

/// The verbs wire: chunks become work requests on the connection's queue pair. See the
/// module documentation of [`crate::transfer`] for the immediate-data convention.
struct VerbsWire<'c, 'r> {
    conn: &'c Connection<'r>,
    data_mr: &'r MemoryRegion<'r>,
    op: WireOp,
    chunks: u64,
    waiting_for: String,
    comps: Vec<Completion>,
    wrs: Vec<crate::rdma::SendWr<'r>>,
    /// Where the receiver's replies land (framed transfers).
    replies: Option<&'c Replies>,
    /// Replies that came in with the data's completions, in order.
    seen: Vec<Completion>,
    /// A raw peer's reply, likewise.
    reply: Option<Completion>,
    /// The source's bytes in host memory, if they lie there.
    host: Option<(NonNull<u8>, usize)>,
    /// The CRC32C of each chunk, computed as it is posted (first pass, with checksums).
    crcs: Option<Vec<u32>>,
    /// Faults to inject (test only).
    tamper: Option<Tamper<'r>>,
    /// A resend pass: only these chunks go, each signaled and with its immediate.
    subset: Option<Subset>,
    /// The pass of the chunks posted, for the reports.
    pass: Option<schedule::Pass>,
    /// The last data request posted, and whether its completion was seen.
    last_posted: Option<(u64, bool)>,
}

impl<'c, 'r> VerbsWire<'c, 'r> {
    fn new(
        conn: &'c Connection<'r>,
        data_mr: &'r MemoryRegion<'r>,
        replies: Option<&'c Replies>,
        op: WireOp,
        chunks: u64,
        label: &str,
    ) -> Self {
        VerbsWire {
            conn,
            data_mr,
            replies,
            op,
            chunks,
            waiting_for: format!("completions of chunks sent to {label}"),
            comps: Vec::with_capacity(64),
            wrs: Vec::with_capacity(POST_BATCH),
            seen: Vec::new(),
            reply: None,
            host: None,
            crcs: None,
            tamper: None,
            subset: None,
            pass: None,
            last_posted: None,
        }
    }

    /// The pass is over: the fault injector goes back to `ends`; the checksums computed
    /// and the replies seen come out.
    fn finish(self, ends: &mut WireEnds<'c, 'r>) -> (Option<Vec<u32>>, Vec<Completion>) {
        ends.tamper = self.tamper;
        (self.crcs, self.seen)
    }

    fn send_op(&self, p: &Posted) -> SendOp {
        let imm = (p.chunk.index + 1) as u32; // chunks delivered through this one (n < 2^32)
                                              // A chunk sent again names itself in its immediate, in both modes.
        let again = self.subset.is_some();
        match self.op {
            WireOp::Raw { .. } => SendOp::SendWithImm(RAW_IMM),
            WireOp::Send if p.last || again => SendOp::SendWithImm(imm),
            WireOp::Send => SendOp::Send,
            WireOp::Write(accept) => {
                let remote_addr = accept.addr + p.chunk.offset;
                if p.signaled || again {
                    SendOp::WriteWithImm {
                        remote_addr,
                        rkey: accept.rkey,
                        imm,
                    }
                } else {
                    SendOp::Write {
                        remote_addr,
                        rkey: accept.rkey,
                    }
                }
            }
        }
    }

    /// The receiver's reason, if the reply in `c` is an ack that ends the transfer before
    /// its data is in.
    fn ended_early(&self, c: &Completion) -> Option<String> {
        let replies = self.replies?;
        let bytes = replies.read(c);
        let ack = Ack::decode(&bytes[..bytes.len().min(ACK_LEN)]).ok()?;
        (ack.status == AckStatus::TooSlow).then(|| {
            format!(
                "the receiver ended the transfer: sender too slow ({} had arrived by its --min-rate deadline)",
                format_bytes(ack.received_bytes)
            )
        })
    }

    /// An ack that ends the transfer early, if one completes within `grace`.
    fn late_ack_reason(&mut self, grace: Duration) -> Option<String> {
        let deadline = Deadline::after(grace);
        loop {
            self.comps.clear();
            self.conn.cq.poll(&mut self.comps).ok()?;
            if let Some(c) = self
                .comps
                .iter()
                .find(|c| tag(c.wr_id) == WR_ACK && c.is_ok())
            {
                return self.ended_early(c);
            }
            if deadline.expired() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Why a failed data completion broke the transfer, with a hint where one helps.
    fn failure(&self, c: &Completion) -> String {
        let index = c.wr_id & INDEX_MASK;
        let what = match (self.op, index + 1 == self.chunks) {
            (WireOp::Raw { bytes }, _) => {
                format!(
                    "SEND_WITH_IMM of the whole buffer ({})",
                    format_bytes(bytes)
                )
            }
            (WireOp::Send, true) => format!("SEND_WITH_IMM of chunk {index}"),
            (WireOp::Send, false) => format!("SEND of chunk {index}"),
            (WireOp::Write(_), _) => format!("RDMA_WRITE of chunk {index}"),
        };
        let why = match c.check(|| what) {
            Err(e) => e.to_string(),
            Ok(()) => "unexpected completion".into(),
        };
        let hint = if matches!(self.op, WireOp::Raw { .. })
            && (c.is_remote_invalid_request() || c.is_remote_operation_error())
        {
            " (is the receiver's posted receive smaller than the message? rdma-core's rdma_server takes 16 bytes: try --size 16)"
        } else if c.is_connection_loss() {
            " (the receiver went away?)"
        } else {
            ""
        };
        format!("{why}{hint}")
    }

    /// The SGE a chunk goes from: its bytes in the source, or (a fault injected) a
    /// corrupted copy; its CRC32C taken on the way, from the source's bytes.
    ///
    /// # Safety
    /// As [`ChunkWire::post`] says for `p`'s bytes.
    unsafe fn chunk_sge(
        &mut self,
        p: &Posted,
    ) -> Result<crate::rdma::Sge<'r>, schedule::WireError> {
        let sge = self.data_mr.sge(p.bytes.clone())?;
        let Some((base, len)) = self.host else {
            return Ok(sge);
        };
        if self.crcs.is_none() && self.tamper.is_none() {
            return Ok(sge);
        }
        if p.bytes.end > len {
            return Err(schedule::WireError::Broken(format!(
                "chunk {} lies outside the source's memory",
                p.chunk.index
            )));
        }
        // SAFETY: the range lies inside the source's host memory (checked above), whose
        // bytes the caller keeps valid and unmodified until the chunk is reported done;
        // the CPU only reads them, as the NIC does.
        let bytes =
            unsafe { std::slice::from_raw_parts(base.as_ptr().add(p.bytes.start), p.bytes.len()) };
        let index = p.chunk.index;
        if let Some(crcs) = &mut self.crcs {
            if let Some(slot) = crcs.get_mut(index as usize) {
                *slot = crate::integrity::crc32c(bytes);
            }
        }
        let Some(t) = &mut self.tamper else {
            return Ok(sge);
        };
        if !t.faults.hits(index, t.attempt) {
            return Ok(sge);
        }
        let scratch = &t.scratch[(index % t.scratch.len() as u64) as usize];
        let mut copy = bytes.to_vec();
        t.faults.corrupt(&mut copy, index, t.attempt);
        // Its last request completed: the window keeps chunk `index` and the previous
        // user of this slot apart (see `Tamper::scratch`).
        scratch.write(&copy)?;
        t.injected += 1;
        Ok(scratch.sge(copy.len()))
    }
}

// SAFETY: chunks are reported done only from polled completions: a signaled completion
// means the NIC finished every earlier request of the send queue (RC ordering), so it no
// longer reads their bytes. In a resend pass every posted chunk is signaled, and a chunk
// passed over is never read.
unsafe impl ChunkWire for VerbsWire<'_, '_> {
    fn batch(&self) -> usize {
        POST_BATCH.min(POST_LIST_MAX)
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), schedule::WireError> {
        self.wrs.clear();
        for p in chunks {
            if let Some(subset) = &mut self.subset {
                if !subset.hand(p.chunk.index) {
                    continue;
                }
            }
            // SAFETY: the caller's promise for `p`.
            let sge = unsafe { self.chunk_sge(p)? };
            let signaled = p.signaled || self.subset.is_some();
            self.wrs.push(SendWr {
                wr_id: TAG_DATA | p.chunk.index,
                sge,
                op: self.send_op(p),
                signaled,
                inline: false,
                // The receiver sleeps until one of these (header hint).
                solicited: signaled,
            });
        }
        self.pass = chunks.last().map(|p| p.pass).or(self.pass);
        if self.wrs.is_empty() {
            return Ok(());
        }
        // Counted as posted before posting: a list the provider took in part leaves
        // drain something to wait for.
        self.last_posted = self.wrs.last().map(|wr| (wr.wr_id, false));
        // SAFETY: every SGE lies in the source's registered memory (the region checked
        // it) or in a scratch buffer of ours; the caller keeps the source's bytes
        // unmodified until we report them done, and a scratch slot is not rewritten
        // before then (Tamper::scratch).
        unsafe { self.conn.qp.post_send_list(&self.wrs)? };
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<schedule::Done>, schedule::WireError> {
        let highest = self.wait_for_index(deadline)?;
        Ok(match (self.pass, highest) {
            (Some(pass), Some(through)) => Some(schedule::Done { pass, through }),
            _ => None,
        })
    }

    /// The queue pair goes to the error state unless its last request completed: every
    /// request still queued is flushed, not run ([`Connection::quiesce`]). The
    /// connection cannot carry another pass then: the transfer has failed.
    fn drain(&mut self, _deadline: &Deadline) {
        if let Some((last, false)) = self.last_posted {
            self.conn.quiesce(last);
        }
    }
}

impl VerbsWire<'_, '_> {
    /// [`ChunkWire::wait`]'s work: the highest chunk index known done.
    fn wait_for_index(&mut self, deadline: &Deadline) -> Result<Option<u64>, schedule::WireError> {
        if let Some(subset) = &self.subset {
            if !subset.waiting() {
                // Nothing posted is out: the chunks passed over are done at once.
                return Ok(subset.done_through());
            }
        }
        self.comps.clear();
        let waited = self
            .conn
            .wait(&mut self.comps, deadline, &self.waiting_for)
            .map_err(|e| match e {
                rdma::RdmaError::Timeout { .. } | rdma::RdmaError::DeviceFault(_) => {
                    schedule::WireError::Broken(e.to_string())
                }
                e => e.into(),
            })?;
        if waited == Waited::Disconnected {
            // The receiver's last word (a too-slow ack) can complete just behind its
            // disconnect: it is the better reason to give.
            let why = self
                .late_ack_reason(DEVICE_EVENT_GRACE)
                .unwrap_or_else(|| "the receiver disconnected".into());
            return Err(schedule::WireError::Broken(why));
        }
        let mut highest = None;
        let comps = std::mem::take(&mut self.comps);
        for c in &comps {
            match c.wr_id {
                id if tag(id) == WR_ACK => {
                    // The receiver acks after all data, or early to end a transfer that
                    // stayed below its --min-rate: say so rather than "disconnected".
                    // With checksums, its resend requests come here too.
                    c.check(|| "the receive for the receiver's reply".into())?;
                    self.seen.push(*c);
                    if let Some(why) = self.ended_early(c) {
                        return Err(schedule::WireError::Broken(why));
                    }
                }
                WR_REPLY => self.reply = Some(*c),
                id if is_data(id) => {
                    if let Some((last, seen)) = &mut self.last_posted {
                        *seen |= *last == id;
                    }
                    if !c.is_ok() {
                        // A dead port fails the request before its event arrives.
                        let why = self
                            .conn
                            .device_fault_within(DEVICE_EVENT_GRACE)
                            .unwrap_or_else(|| self.failure(c));
                        return Err(schedule::WireError::Broken(why));
                    }
                    let index = id & INDEX_MASK;
                    match &mut self.subset {
                        Some(subset) => {
                            subset
                                .completed(index)
                                .map_err(schedule::WireError::Broken)?;
                            highest = subset.done_through();
                        }
                        // A signaled completion: every chunk up to it is done (RC, in
                        // order).
                        None => highest = highest.max(Some(index)),
                    }
                }
                _ => {}
            }
        }
        self.comps = comps;
        Ok(highest)
    }
}

/// Work requests handed to the provider per call (one doorbell for all). Soft-RoCE does
/// its protocol work in the doorbell's system call, so at 4 KiB a call per request cost
/// about a third of the throughput (tests/softroce/BENCH.md); 16 takes most of the gain
/// and keeps the first requests of a window from waiting long for the rest. A staging
/// ring's chunks come one at a time anyway (each waits for its copy), and the schedule
/// posts what it has before it waits.
const POST_BATCH: usize = 16;

/// How long a failed work request waits for a device event that explains it.
pub(super) const DEVICE_EVENT_GRACE: Duration = Duration::from_millis(200);

/// How long a raw sender waits for the optional reply.
const RAW_REPLY_WAIT: Duration = Duration::from_secs(1);

/// The seed's wire behaviour: connect without private data, one SEND_WITH_IMM (imm
/// 0x1234) of the whole buffer, then up to a second for an optional reply.
pub fn send_raw(cfg: &SendConfig, memory: &mut SendMemory) -> Result<SendReport, TransferError> {
    let t0 = Instant::now();
    let total = cfg.bytes;
    let label = cfg.peer.to_string();
    if total == 0 || total > u32::MAX as u64 {
        return Err(TransferError::Protocol(format!(
            "--raw sends the buffer as one message; {total} bytes cannot be one"
        )));
    }
    rdma::ensure_device()?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, cfg.peer, cfg.timeout)?;
    check_message_size(
        &id,
        total,
        "--raw sends the whole buffer as one message; a message",
    )?;
    check_nic(&id, cfg)?;
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_inline_data: 0,
    };
    let res = Resources::new(&id, Resources::cq_entries(caps), cfg.busy_poll)?;
    let making_before = memory.making_time();
    let (source, memory_log, making) = choose_source(&res, memory, making_before)?;
    let data_mr = register_source(&res, source)?;
    // One chunk of the whole buffer, through the same schedule as framed transfers.
    let plan = ChunkPlan::new(total, total).map_err(TransferError::Protocol)?;
    let schedule = Schedule::new(plan, 1, source, cfg.timeout);
    let reply_buf = MessageBuffer::new(&res.pd, 64)?;
    let conn = Connection::new(&res, caps)?;
    // SAFETY: nobody reads the reply buffer before this receive's completion is polled.
    unsafe {
        conn.qp
            .post_recv(WR_REPLY, Some(reply_buf.sge(reply_buf.len())))?
    };
    connect(&id, cfg.peer, &[], cfg.timeout, true)?;
    // Generating the data is not connection setup.
    let connect_seconds = t0.elapsed().saturating_sub(making).as_secs_f64();

    let mut wire = VerbsWire::new(
        &conn,
        &data_mr,
        None,
        WireOp::Raw { bytes: total },
        1,
        &label,
    );
    let seconds = schedule.run(source, &mut wire, &label)?.as_secs_f64();
    let mut reply = wire.reply;

    // An optional reply (rdma-core's rdma_server sends 16 bytes; `host recv --raw` too).
    // Keep waiting after the peer's disconnect: rdma_server replies and disconnects at
    // once, and the CM's DISCONNECTED event can overtake the reply's completion (they
    // come through different channels), so stopping at the disconnect misses replies.
    let deadline = Deadline::after(RAW_REPLY_WAIT.min(cfg.timeout));
    let mut comps = Vec::new();
    while reply.is_none() {
        comps.clear();
        match conn.wait(&mut comps, &deadline, "a reply") {
            Ok(_) => {
                reply = comps
                    .iter()
                    .find(|c| c.wr_id == WR_REPLY)
                    .copied()
                    .or(reply)
            }
            Err(_) => break,
        }
    }
    let raw_reply_bytes = reply.filter(|c| c.is_ok()).map(|c| c.byte_len);
    conn.close(true, DISCONNECT_GRACE);
    Ok(SendReport {
        peer: label,
        device: id.device_name(),
        op: "raw",
        bytes: total,
        chunks: 1,
        chunk_bytes: total,
        in_flight: 1,
        connect_seconds,
        seconds,
        gbps: gigabytes_per_second(total, seconds),
        receiver: None,
        raw_reply_bytes,
        round_trip_seconds: None,
        receiver_verify_seconds: None,
        path: source.path(),
        memory: memory_log,
        integrity: Default::default(),
        rails: Vec::new(),
    })
}
