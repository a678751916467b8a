//! The sending side: connect with a header, post the chunks with `depth` in flight, wait
//! for the receiver's verdict.

use super::conn::{
    is_data, next_event, Connection, Waited, DISCONNECT_GRACE, INDEX_MASK, TAG_DATA, WR_ACK,
    WR_REPLY,
};
use super::header::{
    AcceptInfo, Ack, AckStatus, Header, Op, RejectReason, WireError, ACK_LEN, HEADER_FLAG_REPEAT,
    RAW_IMM,
};
use super::plan::ChunkPlan;
use super::units::format_bytes;
use super::{gigabytes_per_second, TransferError};
use crate::memory::{Registration, SendSource, Verification};
use crate::rdma::{
    self, errno_message, Access, CmEventKind, CmId, Completion, ConnParams, Deadline, EventChannel,
    MemoryRegion, MessageBuffer, QpCaps, SendOp, SendWr, Sge, POST_LIST_MAX,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Everything the sender needs to know, built by the CLI.
#[derive(Debug, Clone)]
pub struct SendConfig {
    pub peer: SocketAddr,
    pub op: Op,
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
}

/// What the receiver said about the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReceiverVerdict {
    pub status: AckStatus,
    pub received_bytes: u64,
    pub verification: Option<Verification>,
}

impl ReceiverVerdict {
    pub fn ok(&self) -> bool {
        self.status == AckStatus::Verified
    }
}

/// The result of one transfer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SendReport {
    pub peer: String,
    /// The local RDMA device used ("rxe0").
    pub device: Option<String>,
    /// "send", "write" or "raw".
    pub op: &'static str,
    pub bytes: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    /// Work requests actually kept in flight (depth, limited by the source).
    pub in_flight: u32,
    /// Address and route resolution, setup, registration and connection.
    pub connect_seconds: f64,
    /// From the first work request posted to the last data completion.
    pub seconds: f64,
    /// `bytes / seconds`, in 10^9 bytes per second.
    pub gbps: f64,
    /// The receiver's verdict (framed transfers).
    pub receiver: Option<ReceiverVerdict>,
    /// Bytes of the reply a raw peer sent, if it sent one.
    pub raw_reply_bytes: Option<u32>,
    /// From the first work request posted to the receiver's ack: one round trip, data
    /// out and verdict back, including the receiver's verification (framed transfers).
    pub round_trip_seconds: Option<f64>,
    /// How long the receiver's verification took, as it reported (only receivers serving
    /// `--reuse-connection` report it).
    pub receiver_verify_seconds: Option<f64>,
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

/// A progress bar that appears only after the transfer has run for a moment.
struct Progress {
    enabled: bool,
    start: Instant,
    total: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    const DELAY: Duration = Duration::from_millis(500);

    fn new(enabled: bool, total: u64) -> Self {
        Progress {
            enabled,
            start: Instant::now(),
            total,
            bar: None,
        }
    }

    fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() && self.start.elapsed() >= Self::DELAY {
            // A few redraws a second: drawing happens on the transfer's thread.
            let bar = ProgressBar::with_draw_target(
                Some(self.total),
                ProgressDrawTarget::stderr_with_hz(4),
            );
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Map a failed data completion to an error that says how far the transfer got.
fn broken(peer: &str, done: u64, total: u64, c: &Completion, what: String) -> TransferError {
    let why = match c.check(|| what) {
        Err(e) => e.to_string(),
        Ok(()) => "unexpected completion".into(),
    };
    let hint = if c.is_connection_loss() {
        " (the receiver went away?)"
    } else {
        ""
    };
    TransferError::Broken {
        peer: peer.to_string(),
        done,
        total,
        why: format!("{why}{hint}"),
    }
}

/// One framed transfer of `source` to `cfg.peer`.
pub fn send(cfg: &SendConfig, source: &mut dyn SendSource) -> Result<SendReport, TransferError> {
    let mut reports = send_repeated(cfg, source, 1)?;
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
    source: &mut dyn SendSource,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    let t0 = Instant::now();
    let total = source.len() as u64;
    let plan = ChunkPlan::new(total, cfg.chunk).map_err(TransferError::Protocol)?;
    let n = plan.count();
    let header = Header::new(cfg.op, total, plan.chunk_bytes(), cfg.depth)
        .map(Header::with_solicited_events)
        .and_then(|h| h.with_transfers(transfers))
        .map_err(|e| TransferError::Protocol(format!("cannot offer this transfer: {e}")))?;
    let label = cfg.peer.to_string();

    rdma::ensure_device()?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, cfg.peer, cfg.timeout)?;
    check_message_size(&id, plan.chunk_bytes(), "a chunk (--chunk)")?;

    // Work requests in flight: --depth, limited by the source (a staging ring).
    let window = (cfg.depth as u64)
        .min(
            source
                .max_chunks_in_flight()
                .map_or(u64::MAX, |m| m.max(1) as u64),
        )
        .min(n) as u32;
    let conn = Connection::new(
        &id,
        QpCaps {
            max_send_wr: window + 1,
            max_recv_wr: 2,
            max_inline_data: 0,
        },
        cfg.busy_poll,
    )?;
    let data_mr = register_source(&conn, source)?;
    if (data_mr.len() as u64) < total {
        return Err(TransferError::Protocol(format!(
            "the source registered {} bytes for a {total}-byte transfer",
            data_mr.len()
        )));
    }
    let ack_buf = MessageBuffer::new(&conn.pd, 64)?;
    // SAFETY: the ack buffer is registered (its lkey is in the SGE), lives until after
    // the connection is closed, and is read only after the receive completed.
    unsafe {
        conn.qp
            .post_recv(WR_ACK, Some(ack_buf.sge(ack_buf.len())))?
    };

    let header_bytes = header.encode_with_version(cfg.protocol_version);
    let accept_data =
        connect(&id, cfg.peer, &header_bytes, cfg.timeout, false).map_err(|e| match e {
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
    let connect_seconds = t0.elapsed().as_secs_f64();

    let one = OneTransfer {
        cfg,
        conn: &conn,
        data_mr: &data_mr,
        accept,
        plan,
        window,
        label: &label,
    };
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
        let done = one.run(source, &ack_buf)?;
        let ack = done.ack;
        reports.push(SendReport {
            peer: label.clone(),
            device: device.clone(),
            op: cfg.op.name(),
            bytes: total,
            chunks: n,
            chunk_bytes: plan.chunk_bytes(),
            in_flight: window,
            connect_seconds: if k == 0 { connect_seconds } else { 0.0 },
            seconds: done.seconds,
            gbps: gigabytes_per_second(total, done.seconds),
            receiver: Some(ReceiverVerdict {
                status: ack.status,
                received_bytes: ack.received_bytes,
                verification: ack.verification,
            }),
            raw_reply_bytes: None,
            round_trip_seconds: Some(done.round_trip_seconds),
            receiver_verify_seconds: ack.verify_micros.map(|us| us as f64 * 1e-6),
        });
    }
    conn.close(true, DISCONNECT_GRACE);
    Ok(reports)
}

/// What one transfer on an established connection needs.
struct OneTransfer<'a> {
    cfg: &'a SendConfig,
    conn: &'a Connection,
    data_mr: &'a MemoryRegion,
    accept: AcceptInfo,
    plan: ChunkPlan,
    window: u32,
    label: &'a str,
}

/// How one transfer went.
struct TransferDone {
    /// First work request posted to the last data completion.
    seconds: f64,
    /// First work request posted to the receiver's ack.
    round_trip_seconds: f64,
    ack: Ack,
}

impl OneTransfer<'_> {
    /// Post the chunks with `window` in flight, then wait for the receiver's ack (whose
    /// receive must already be posted).
    fn run(
        &self,
        source: &mut dyn SendSource,
        ack_buf: &MessageBuffer,
    ) -> Result<TransferDone, TransferError> {
        let (cfg, conn, data_mr, plan, label) =
            (self.cfg, self.conn, self.data_mr, &self.plan, self.label);
        let accept = self.accept;
        let window = self.window as u64;
        let total = plan.total();
        let n = plan.count();
        // Signal every `sig_every`-th chunk (and the last): one completion then stands for
        // all chunks before it, and a window always holds a signaled chunk, so it drains.
        let sig_every = (window / 4).max(1);
        let waiting_for_data = format!("completions of chunks sent to {label}");
        let mut progress = Progress::new(cfg.progress, total);
        let mut comps: Vec<Completion> = Vec::with_capacity(64);
        let mut ack: Option<Completion> = None;
        let mut next = 0u64; // next chunk to post
        let mut done = 0u64; // chunks known complete
        let batch_max = post_batch(source);
        let mut batch: Vec<SendWr> = Vec::with_capacity(batch_max);
        let start = Instant::now();
        let mut deadline = Deadline::after(cfg.timeout);
        while done < n {
            while next < n && next - done < window {
                let Some(chunk) = plan.get(next) else { break };
                let addr = source
                    .prepare_chunk(chunk.offset as usize, chunk.len as usize, deadline.at())
                    .map_err(TransferError::Memory)?;
                if !data_mr.contains(addr, chunk.len) {
                    return Err(TransferError::Protocol(format!(
                        "the source put chunk {next} at {addr:#x}, outside its registered memory"
                    )));
                }
                let last = next + 1 == n;
                let signaled = last || (next + 1).is_multiple_of(sig_every);
                let imm = (next + 1) as u32; // chunks delivered through this one (n < 2^32)
                let op = match cfg.op {
                    Op::Send if last => SendOp::SendWithImm(imm),
                    Op::Send => SendOp::Send,
                    Op::Write => {
                        let remote_addr = accept.addr + chunk.offset;
                        if signaled {
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
                };
                batch.push(SendWr {
                    wr_id: TAG_DATA | next,
                    sge: Sge {
                        addr,
                        len: chunk.len as u32,
                        lkey: data_mr.lkey(),
                    },
                    op,
                    signaled,
                    inline: false,
                    // The receiver sleeps until one of these (header hint).
                    solicited: signaled,
                });
                next += 1;
                if batch.len() >= batch_max {
                    // SAFETY: every SGE lies in `data_mr` (checked above), which stays
                    // registered until after the last completion is polled; the source
                    // does not touch a chunk until release_chunk, called only after its
                    // completion.
                    unsafe { conn.qp.post_send_list(&batch)? };
                    batch.clear();
                }
            }
            if !batch.is_empty() {
                // SAFETY: as above.
                unsafe { conn.qp.post_send_list(&batch)? };
                batch.clear();
            }
            comps.clear();
            let waited = conn
                .wait(&mut comps, &deadline, &waiting_for_data)
                .map_err(|e| match e {
                    rdma::RdmaError::Timeout { .. } => TransferError::Broken {
                        peer: label.to_string(),
                        done: plan.bytes_through(done),
                        total,
                        why: e.to_string(),
                    },
                    e => e.into(),
                })?;
            if waited == Waited::Disconnected {
                return Err(TransferError::Broken {
                    peer: label.to_string(),
                    done: plan.bytes_through(done),
                    total,
                    why: "the receiver disconnected".into(),
                });
            }
            for c in &comps {
                if c.wr_id == WR_ACK {
                    // The receiver only acks after all data; keep it for below.
                    c.check(|| "the receive for the receiver's ack".into())?;
                    ack = Some(*c);
                    continue;
                }
                if !is_data(c.wr_id) {
                    continue;
                }
                let index = c.wr_id & INDEX_MASK;
                if !c.is_ok() {
                    let what = format!("{} of chunk {index}", op_name(cfg.op, index + 1 == n));
                    return Err(broken(label, plan.bytes_through(done), total, c, what));
                }
                // A signaled completion: every chunk up to `index` is done (RC, in order).
                while done <= index {
                    if let Some(chunk) = plan.get(done) {
                        source.release_chunk(chunk.offset as usize);
                    }
                    done += 1;
                }
                deadline = Deadline::after(cfg.timeout);
            }
            progress.update(plan.bytes_through(done));
        }
        let seconds = start.elapsed().as_secs_f64();
        progress.finish();

        // --- the receiver's verdict ---------------------------------------------------------
        let deadline = Deadline::after(cfg.timeout);
        let waiting_for_ack = format!("the verification result from {label}");
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
        let round_trip_seconds = start.elapsed().as_secs_f64();
        let ack_len = ack.map_or(0, |c| c.byte_len as usize);
        let ack = Ack::decode(ack_buf.read(ack_len.min(ACK_LEN)))
            .map_err(|e| TransferError::Protocol(format!("the receiver's ack is invalid: {e}")))?;
        Ok(TransferDone {
            seconds,
            round_trip_seconds,
            ack,
        })
    }
}

/// Work requests handed to the provider per call (one doorbell for all). Soft-RoCE does
/// its protocol work in the doorbell's system call, so at 4 KiB a call per request cost
/// about a third of the throughput (tests/softroce/BENCH.md); 16 takes most of the gain
/// and keeps the first requests of a window from waiting long for the rest.
const POST_BATCH: usize = 16;

/// Work requests per provider call for `source`: a source that produces chunks as it goes
/// (a staging ring) gets each posted as soon as it is ready.
fn post_batch(source: &dyn SendSource) -> usize {
    if source.max_chunks_in_flight().is_some() {
        1
    } else {
        POST_BATCH.min(POST_LIST_MAX)
    }
}

fn op_name(op: Op, last: bool) -> &'static str {
    match (op, last) {
        (Op::Send, true) => "SEND_WITH_IMM",
        (Op::Send, false) => "SEND",
        (Op::Write, _) => "RDMA_WRITE",
    }
}

/// Register the source's memory for the NIC to read. When the NIC refuses GPU memory
/// (no dma-buf support in its driver, no peermem), say what to use instead.
fn register_source(
    conn: &Connection,
    source: &dyn SendSource,
) -> Result<MemoryRegion, TransferError> {
    let registration = source.registration();
    // SAFETY: the caller borrows `source` for longer than it keeps the returned region
    // (both send functions drop the region, a local, before they return).
    unsafe { MemoryRegion::register(&conn.pd, registration, Access::LOCAL) }.map_err(|e| {
        match registration {
            Registration::Host { .. } => e.into(),
            Registration::DmaBuf { .. } | Registration::DeviceAddress { .. } => {
                TransferError::Protocol(format!(
                    "the NIC could not register GPU memory for GPUDirect RDMA ({e}); use --mem staged or --mem mapped"
                ))
            }
        }
    })
}

/// How long a raw sender waits for the optional reply.
const RAW_REPLY_WAIT: Duration = Duration::from_secs(1);

/// The seed's wire behaviour: connect without private data, one SEND_WITH_IMM (imm
/// 0x1234) of the whole buffer, then up to a second for an optional reply.
pub fn send_raw(
    cfg: &SendConfig,
    source: &mut dyn SendSource,
) -> Result<SendReport, TransferError> {
    let t0 = Instant::now();
    let total = source.len() as u64;
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
    let conn = Connection::new(
        &id,
        QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_inline_data: 0,
        },
        cfg.busy_poll,
    )?;
    let data_mr = register_source(&conn, source)?;
    let reply_buf = MessageBuffer::new(&conn.pd, 64)?;
    // SAFETY: registered buffer, alive until the connection is closed, read only after
    // its completion.
    unsafe {
        conn.qp
            .post_recv(WR_REPLY, Some(reply_buf.sge(reply_buf.len())))?
    };
    connect(&id, cfg.peer, &[], cfg.timeout, true)?;
    let connect_seconds = t0.elapsed().as_secs_f64();

    let deadline = Deadline::after(cfg.timeout);
    let addr = source
        .prepare_chunk(0, total as usize, deadline.at())
        .map_err(TransferError::Memory)?;
    if !data_mr.contains(addr, total) {
        return Err(TransferError::Protocol(
            "the source's data lies outside its registered memory".into(),
        ));
    }
    let start = Instant::now();
    // SAFETY: the SGE lies in `data_mr`, registered until this function returns; the
    // source is not modified until after the completion below.
    unsafe {
        conn.qp.post_send(&SendWr {
            wr_id: TAG_DATA,
            sge: Sge {
                addr,
                len: total as u32,
                lkey: data_mr.lkey(),
            },
            op: SendOp::SendWithImm(RAW_IMM),
            signaled: true,
            inline: false,
            solicited: false,
        })?
    };
    let mut comps = Vec::new();
    let mut sent = false;
    let mut reply: Option<Completion> = None;
    while !sent {
        comps.clear();
        let waited = conn.wait(
            &mut comps,
            &deadline,
            &format!("the send to {label} to complete"),
        )?;
        for c in &comps {
            if c.wr_id == WR_REPLY {
                reply = Some(*c);
            } else if is_data(c.wr_id) {
                c.check(|| format!("SEND_WITH_IMM of the whole buffer ({})", format_bytes(total)))
                    .map_err(|e| {
                        let hint = if c.is_remote_invalid_request() || c.is_remote_operation_error() {
                            " (is the receiver's posted receive smaller than the message? rdma-core's rdma_server takes 16 bytes: try --size 16)"
                        } else {
                            ""
                        };
                        TransferError::Protocol(format!("{e}{hint}"))
                    })?;
                sent = true;
            }
        }
        if !sent && waited == Waited::Disconnected {
            return Err(TransferError::Broken {
                peer: label,
                done: 0,
                total,
                why: "the receiver disconnected".into(),
            });
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    source.release_chunk(0);

    // An optional reply (rdma-core's rdma_server sends 16 bytes; `host recv --raw` too).
    // Keep waiting after the peer's disconnect: rdma_server replies and disconnects at
    // once, and the CM's DISCONNECTED event can overtake the reply's completion (they
    // come through different channels), so stopping at the disconnect misses replies.
    let deadline = Deadline::after(RAW_REPLY_WAIT.min(cfg.timeout));
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
    })
}
