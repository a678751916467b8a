//! The sending side: connect with a header, post the chunks with `depth` in flight, wait
//! for the receiver's verdict.

use super::conn::{
    is_data, next_event, Connection, Resources, Waited, DISCONNECT_GRACE, INDEX_MASK, TAG_DATA,
    WR_ACK, WR_REPLY,
};
use crate::memory::select::{walk, AttemptLog};
use crate::memory::{SendMemory, SendSource};
use crate::rdma::{
    self, errno_message, CmEventKind, CmId, Completion, ConnParams, Deadline, EventChannel,
    MemoryRegion, MessageBuffer, QpCaps, SendOp, SendWr, POST_LIST_MAX,
};
use crate::transfer::header::{
    AcceptInfo, Ack, AckStatus, Header, Op, RejectReason, VerbsProof, WireError, ACK_LEN,
    HEADER_FLAG_REPEAT, RAW_IMM,
};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::Framed;
use crate::transfer::schedule::{self, ChunkWire, Posted, Schedule};
use crate::transfer::units::format_bytes;
use crate::transfer::{gigabytes_per_second, SendReport, TransferError};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Everything the sender needs to know, built by the CLI.
#[derive(Debug, Clone)]
pub struct SendConfig {
    pub peer: SocketAddr,
    pub op: Op,
    /// Bytes per transfer (the data's size).
    pub bytes: u64,
    /// The RDMA device the route must use (`--nic`), if one was named.
    pub nic: Option<String>,
    /// Bytes per work request (clamped to the transfer size).
    pub chunk: u64,
    /// Work requests kept in flight.
    pub depth: u32,
    /// Bound of every wait; while data flows it restarts on each completion.
    pub timeout: Duration,
    /// Spin on the CQ instead of sleeping on a completion channel.
    pub busy_poll: bool,
    /// Draw a progress bar on stderr (when the transfer takes more than a moment).
    pub progress: bool,
    /// The protocol version written into the header: `header::VERSION` except in tests
    /// of the receiver's version check.
    pub protocol_version: u16,
    /// `--key-file`: proves to a receiver with the same key that this sender may send.
    pub key: Option<crate::server::Key>,
}

/// Extra time given to the CM to report its own timeout.
const CM_GRACE: Duration = Duration::from_millis(500);

/// Resolve `peer`'s address and route on `id`, each step bounded by `timeout`.
fn resolve(id: &CmId, peer: SocketAddr, timeout: Duration) -> Result<(), TransferError> {
    let label = peer.to_string();
    id.resolve_addr(peer, timeout)?;
    // A little longer than the CM's own timeout, so that its ADDR_ERROR (with the
    // reason) comes first.
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("address resolution of {label}"))?;
    match event.kind() {
        CmEventKind::AddrResolved => {}
        CmEventKind::AddrError => {
            let errno = -event.status();
            let why = if errno == libc::ENODEV {
                "no RDMA device on the way to it (the route leaves through a network interface without RDMA)".to_string()
            } else {
                format!("address resolution failed: {}", errno_message(errno))
            };
            return Err(TransferError::Unreachable { peer: label, why });
        }
        _ => {
            return Err(rdma::RdmaError::UnexpectedEvent {
                expected: "RDMA_CM_EVENT_ADDR_RESOLVED",
                got: event.name(),
                status: event.status(),
            }
            .into())
        }
    }
    drop(event);
    id.resolve_route(timeout)?;
    let deadline = Deadline::after(timeout + CM_GRACE);
    let event = next_event(id, &deadline, &format!("route resolution to {label}"))?;
    match event.kind() {
        CmEventKind::RouteResolved => Ok(()),
        CmEventKind::RouteError => Err(TransferError::Unreachable {
            peer: label,
            why: format!(
                "route resolution failed: {}",
                errno_message(-event.status())
            ),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ROUTE_RESOLVED",
            got: event.name(),
            status: event.status(),
        }
        .into()),
    }
}

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

/// IB CM reject reason "invalid service ID": nobody listens on that port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;

/// Connect with `private_data` and wait for ESTABLISHED; returns the accept's private data.
fn connect(
    id: &CmId,
    peer: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
    raw: bool,
) -> Result<Vec<u8>, TransferError> {
    let label = peer.to_string();
    id.connect(&ConnParams::with_private_data(private_data))?;
    let deadline = Deadline::after(timeout);
    let event = next_event(id, &deadline, &format!("{label} to accept the connection"))?;
    let status = event.status();
    match event.kind() {
        CmEventKind::Established => Ok(event.private_data().to_vec()),
        CmEventKind::Rejected => match RejectReason::decode(event.private_data()) {
            Some(RejectReason::BadHeader(WireError::BadMagic { .. })) if raw => {
                Err(TransferError::Protocol(format!(
                    "receiver rejected the transfer: {label} expects framed transfers (it is `host recv` without --raw); drop --raw here or start it with --raw"
                )))
            }
            Some(reason) => Err(TransferError::Rejected(reason)),
            None if status == IB_CM_REJ_INVALID_SERVICE_ID || status == -libc::ECONNREFUSED => {
                Err(TransferError::NoReceiver {
                    peer: label,
                    why: "connection refused".into(),
                })
            }
            None => Err(TransferError::RejectedWithoutReason { peer: label, status }),
        },
        CmEventKind::Unreachable => Err(TransferError::NoReceiver {
            peer: label,
            why: format!("no answer: {}", errno_message(-status)),
        }),
        CmEventKind::ConnectError => Err(TransferError::Unreachable {
            peer: label,
            why: format!("connecting failed: {}", errno_message(-status)),
        }),
        _ => Err(rdma::RdmaError::UnexpectedEvent {
            expected: "RDMA_CM_EVENT_ESTABLISHED",
            got: event.name(),
            status,
        }
        .into()),
    }
}

/// The device's largest message, checked against what one work request carries.
fn check_message_size(id: &CmId, bytes: u64, what: &str) -> Result<(), TransferError> {
    let port = id.port_info()?;
    if bytes > port.max_msg_sz as u64 {
        return Err(TransferError::Protocol(format!(
            "{what} of {} exceeds the largest message of RDMA device {} ({})",
            format_bytes(bytes),
            id.device_name().unwrap_or_else(|| "?".into()),
            format_bytes(port.max_msg_sz as u64)
        )));
    }
    Ok(())
}

/// One framed transfer of `memory`'s data to `cfg.peer`.
pub fn send(cfg: &SendConfig, memory: &mut SendMemory) -> Result<SendReport, TransferError> {
    let mut reports = send_repeated(cfg, memory, 1)?;
    reports
        .pop()
        .ok_or_else(|| TransferError::Protocol("no transfer was made".into()))
}

/// `transfers` framed transfers of `source` on one connection (`--reuse-connection`).
/// The receiver verifies and acks each; the next starts only after the ack has arrived,
/// so each report's `round_trip_seconds` is one whole round trip (data out, verification,
/// ack back) without connection setup. The first report carries the setup time, the
/// others 0. With `transfers == 1` the wire traffic is exactly [`send`]'s.
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

/// The header this sender offers for `transfers` transfers.
fn offer(cfg: &SendConfig, transfers: u32) -> Result<Header, TransferError> {
    let plan = ChunkPlan::new(cfg.bytes, cfg.chunk).map_err(TransferError::Protocol)?;
    Header::new(cfg.op, cfg.bytes, plan.chunk_bytes(), cfg.depth)
        .map(Header::with_solicited_events)
        .and_then(|h| h.with_transfers(transfers))
        .map_err(|e| TransferError::Protocol(format!("cannot offer this transfer: {e}")))
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
    let most = QpCaps {
        max_send_wr: cfg.depth + 1,
        max_recv_wr: 2,
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
    let ack_buf = MessageBuffer::new(&res.pd, 64)?;
    let conn = Connection::new(&res, caps)?;
    // SAFETY: nobody reads the ack buffer before this receive's completion is polled.
    unsafe {
        conn.qp
            .post_recv(WR_ACK, Some(ack_buf.sge(ack_buf.len())))?
    };

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
                WireError::BadMagic { got: [0, 0, 0, 0] } | WireError::Short { got: 0, .. } => {
                    "no accept data".to_string()
                }
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
    let mut reports = Vec::new();
    for k in 0..transfers {
        if k > 0 {
            // The previous ack has been read: the receive for the next one goes in before
            // any data of the next transfer, so the receiver never finds it missing.
            // SAFETY: as for the first ack receive above.
            unsafe {
                conn.qp
                    .post_recv(WR_ACK, Some(ack_buf.sge(ack_buf.len())))?
            };
        }
        let op = match cfg.op {
            Op::Send => WireOp::Send,
            Op::Write => WireOp::Write(accept),
        };
        let mut wire = VerbsWire::new(&conn, &data_mr, Some(&ack_buf), op, n, &label);
        let start = Instant::now();
        let seconds = schedule.run(source, &mut wire, &label)?.as_secs_f64();
        let ack = await_ack(&conn, wire.ack, &ack_buf, cfg.timeout, &label)?;
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
        reports.push(framed.report(k, seconds, round_trip_seconds, &ack));
    }
    conn.close(true, DISCONNECT_GRACE);
    Ok(reports)
}

/// Wait for the receiver's ack (whose receive is posted; `seen` if it already came with
/// the data's completions) and decode it.
fn await_ack(
    conn: &Connection,
    seen: Option<Completion>,
    ack_buf: &MessageBuffer,
    timeout: Duration,
    label: &str,
) -> Result<Ack, TransferError> {
    let deadline = Deadline::after(timeout);
    let waiting_for_ack = format!("the verification result from {label}");
    let mut ack = seen;
    let mut comps = Vec::new();
    while ack.is_none() {
        comps.clear();
        let waited = conn.wait(&mut comps, &deadline, &waiting_for_ack)?;
        for c in &comps {
            if c.wr_id == WR_ACK {
                c.check(|| "the receive for the receiver's ack".into())?;
                ack = Some(*c);
            }
        }
        if ack.is_none() && waited == Waited::Disconnected {
            return Err(TransferError::Protocol(format!(
                "the receiver at {label} closed the connection without reporting its verification"
            )));
        }
    }
    let ack_len = ack.map_or(0, |c| c.byte_len as usize);
    Ack::decode(&ack_buf.read(ack_len.min(ACK_LEN)))
        .map_err(|e| TransferError::Protocol(format!("the receiver's ack is invalid: {e}")))
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
    /// Where the receiver's ack lands (framed transfers).
    ack_buf: Option<&'c MessageBuffer>,
    /// The receiver's ack, if it came in with the data's completions.
    ack: Option<Completion>,
    /// A raw peer's reply, likewise.
    reply: Option<Completion>,
}

impl<'c, 'r> VerbsWire<'c, 'r> {
    fn new(
        conn: &'c Connection<'r>,
        data_mr: &'r MemoryRegion<'r>,
        ack_buf: Option<&'c MessageBuffer>,
        op: WireOp,
        chunks: u64,
        label: &str,
    ) -> Self {
        VerbsWire {
            conn,
            data_mr,
            ack_buf,
            op,
            chunks,
            waiting_for: format!("completions of chunks sent to {label}"),
            comps: Vec::with_capacity(64),
            wrs: Vec::with_capacity(POST_BATCH),
            ack: None,
            reply: None,
        }
    }

    fn send_op(&self, p: &Posted) -> SendOp {
        let imm = (p.chunk.index + 1) as u32; // chunks delivered through this one (n < 2^32)
        match self.op {
            WireOp::Raw { .. } => SendOp::SendWithImm(RAW_IMM),
            WireOp::Send if p.last => SendOp::SendWithImm(imm),
            WireOp::Send => SendOp::Send,
            WireOp::Write(accept) => {
                let remote_addr = accept.addr + p.chunk.offset;
                if p.signaled {
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

    /// The receiver's reason, if the ack in `c` ends the transfer before its data is in.
    fn ended_early(&self, c: &Completion) -> Option<String> {
        let buf = self.ack_buf?;
        let ack = Ack::decode(&buf.read((c.byte_len as usize).min(ACK_LEN))).ok()?;
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
            if let Some(c) = self.comps.iter().find(|c| c.wr_id == WR_ACK && c.is_ok()) {
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
}

// SAFETY: chunks are reported done only from polled completions: a signaled completion
// means the NIC finished every earlier request of the send queue (RC ordering), so it no
// longer reads their bytes.
unsafe impl ChunkWire for VerbsWire<'_, '_> {
    fn batch(&self) -> usize {
        POST_BATCH.min(POST_LIST_MAX)
    }

    /// # Safety
    /// As [`ChunkWire::post`] says.
    unsafe fn post(&mut self, chunks: &[Posted]) -> Result<(), schedule::WireError> {
        self.wrs.clear();
        for p in chunks {
            self.wrs.push(SendWr {
                wr_id: TAG_DATA | p.chunk.index,
                sge: self.data_mr.sge(p.bytes.clone())?,
                op: self.send_op(p),
                signaled: p.signaled,
                inline: false,
                // The receiver sleeps until one of these (header hint).
                solicited: p.signaled,
            });
        }
        // SAFETY: every SGE lies in the source's registered memory (the region checked
        // it), and the caller keeps those bytes unmodified until we report them done.
        unsafe { self.conn.qp.post_send_list(&self.wrs)? };
        Ok(())
    }

    fn wait(&mut self, deadline: &Deadline) -> Result<Option<u64>, schedule::WireError> {
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
        for c in &self.comps {
            match c.wr_id {
                WR_ACK => {
                    // The receiver acks after all data, or early to end a transfer that
                    // stayed below its --min-rate: say so rather than "disconnected".
                    c.check(|| "the receive for the receiver's ack".into())?;
                    self.ack = Some(*c);
                    if let Some(why) = self.ended_early(c) {
                        return Err(schedule::WireError::Broken(why));
                    }
                }
                WR_REPLY => self.reply = Some(*c),
                id if is_data(id) => {
                    if !c.is_ok() {
                        // A dead port fails the request before its event arrives.
                        let why = self
                            .conn
                            .device_fault_within(DEVICE_EVENT_GRACE)
                            .unwrap_or_else(|| self.failure(c));
                        return Err(schedule::WireError::Broken(why));
                    }
                    // A signaled completion: every chunk up to it is done (RC, in order).
                    highest = highest.max(Some(id & INDEX_MASK));
                }
                _ => {}
            }
        }
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

/// With `--nic`, the route to the peer must leave through that device.
fn check_nic(id: &CmId, cfg: &SendConfig) -> Result<(), TransferError> {
    let Some(wanted) = cfg.nic.as_deref() else {
        return Ok(());
    };
    match id.device_name() {
        Some(bound) if bound != wanted => Err(TransferError::Protocol(format!(
            "the route to {} leaves through RDMA device {bound}, not --nic {wanted}: give the receiver an address reached through {wanted}, or drop --nic",
            cfg.peer
        ))),
        _ => Ok(()),
    }
}

/// Walk the memory plan on this connection's protection domain: the first method whose
/// memory the NIC registers is the one the transfer uses (a trial registration, dropped
/// at once; the transfer registers the memory again for itself). A refusal (no dma-buf in
/// the NIC's driver, no peermem, a BAR1 too small) moves on to the next method.
/// Also returns the time spent making sources in the walk (since `making_before`).
fn choose_source<'m>(
    res: &Resources,
    memory: &'m mut SendMemory,
    making_before: Duration,
) -> Result<(&'m dyn SendSource, AttemptLog, Duration), TransferError> {
    let plan = memory.plan().clone();
    let walked = walk(&plan, |method| {
        let source = memory.source(method).map_err(|e| format!("{e:#}"))?;
        MemoryRegion::register(&res.pd, source.memory())
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .map_err(|e| TransferError::Memory(e.into()))?;
    memory.settle(walked.method);
    let making = memory.making_time().saturating_sub(making_before);
    let source = memory
        .source(walked.method)
        .map_err(TransferError::Memory)?;
    Ok((source, walked.log, making))
}

/// Register the source's memory for the NIC to read. When the NIC refuses GPU memory
/// (no dma-buf support in its driver, no peermem), say what to use instead.
fn register_source<'s>(
    res: &Resources,
    source: &'s dyn SendSource,
) -> Result<MemoryRegion<'s>, TransferError> {
    let memory = source.memory();
    MemoryRegion::register(&res.pd, memory).map_err(|e| {
        if memory.target().is_gpu_memory() {
            TransferError::Protocol(format!(
                "the NIC could not register GPU memory for GPUDirect RDMA ({e}); use --mem staged or --mem mapped"
            ))
        } else {
            e.into()
        }
    })
}

/// How long a failed work request waits for a device event that explains it.
const DEVICE_EVENT_GRACE: Duration = Duration::from_millis(200);

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
