//! The seed's wire behaviour (`--raw`), for rdma-core's `rdma_server`/`rdma_client` and
//! the like: no header; the sender connects without private data and SENDs the whole
//! buffer as one message with immediate `0x1234`, then waits a moment for an optional
//! 16-byte reply; the receiver posts one receive of up to `--max-bytes`, verifies what
//! came and replies. Nothing of the engine: one message has no chunks to stripe,
//! check or repair.

use super::accept::SinkChoice;
use super::conn::{Connection, Resources, Waited, DISCONNECT_GRACE, TAG_RAW};
use super::listen::{refuse, VerbsOffer};
use super::open::{
    check_device, check_message_size, choose_source, connect, register_source, resolve,
};
use crate::memory_factory::SendMemory;
use crate::memory_path::walk;
use crate::rdma::{
    self, format_duration, CmId, ConnParams, Deadline, EventChannel, MemoryRegion, MessageBuffer,
    QpCaps, RdmaError, SendOp, SendWr,
};
use crate::transfer::{gigabytes_per_second, RecvOutcome, RecvReport, SendReport, TransferError};
use crate::units::format_bytes;
use crate::wire::{RejectReason, RAW_IMM, RAW_REPLY};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a raw sender waits for the optional reply.
const RAW_REPLY_WAIT: Duration = Duration::from_secs(1);
const CAPS: QpCaps = QpCaps {
    max_send_wr: 2,
    max_recv_wr: 2,
    max_inline_data: 0,
};

/// Send `memory`'s data to `peer` as one SEND_WITH_IMM (imm 0x1234) of the whole buffer,
/// then wait up to a second for a reply.
pub fn send_raw(
    peer: SocketAddr,
    nic: Option<&str>,
    memory: &mut SendMemory,
    bytes: u64,
    timeout: Duration,
    busy_poll: bool,
) -> Result<SendReport, TransferError> {
    let t0 = Instant::now();
    let label = peer.to_string();
    if bytes == 0 || bytes > u32::MAX as u64 {
        return Err(TransferError::Protocol(format!(
            "--raw sends the buffer as one message; {bytes} bytes cannot be one"
        )));
    }
    rdma::ensure_device()?;
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    resolve(&id, peer, timeout)?;
    check_message_size(
        &id,
        bytes,
        "--raw sends the whole buffer as one message; a message",
    )?;
    check_device(&id, nic, peer)?;
    let res = Resources::new(&id, Resources::cq_entries(CAPS), busy_poll)?;
    let making_before = memory.making_time();
    let (source, memory_log, making) = choose_source(&res, memory, making_before)?;
    let data_mr = register_source(&res, source)?;
    let reply_buf = MessageBuffer::new(&res.pd, 64)?;
    let conn = Connection::new(&res, CAPS, (1, 0), 1)?;
    // SAFETY: nobody reads the reply buffer before this receive's completion is polled.
    unsafe {
        conn.qp
            .post_recv(TAG_RAW | 1, Some(reply_buf.sge(reply_buf.len())))?
    };
    connect(&id, peer, &[], timeout, true)?;
    // Generating the data is not connection setup.
    let connect_seconds = t0.elapsed().saturating_sub(making).as_secs_f64();

    // The one chunk: the staging ring, if any, fills its slot first.
    let deadline = Instant::now() + timeout;
    source.begin_pass().map_err(TransferError::Memory)?;
    let range = source
        .prepare_chunk(0, bytes as usize, deadline)
        .map_err(TransferError::Memory)?;
    let start = Instant::now();
    let sge = data_mr.sge(range)?;
    // SAFETY: the SGE lies in the source's registered memory, prepared above and released
    // only after the SEND's completion (or the queue pair's end) below.
    unsafe {
        conn.qp.post_send(&SendWr {
            wr_id: TAG_RAW,
            sge,
            op: SendOp::SendWithImm(RAW_IMM),
            signaled: true,
            inline: false,
            solicited: true,
        })?
    };
    let mut comps = Vec::new();
    let mut reply = None;
    let d = Deadline::after(timeout);
    let sent = loop {
        comps.clear();
        match conn.wait(
            &mut comps,
            &d,
            &format!("the SEND of the whole buffer to {label}"),
        ) {
            Ok(waited) => {
                reply = comps
                    .iter()
                    .find(|c| c.wr_id == TAG_RAW | 1)
                    .copied()
                    .or(reply);
                if let Some(c) = comps.iter().find(|c| c.wr_id == TAG_RAW) {
                    break Ok(*c);
                }
                if waited == Waited::Disconnected {
                    break Err(TransferError::Protocol(format!(
                        "{label} disconnected before the message was sent"
                    )));
                }
            }
            Err(e) => break Err(e.into()),
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let sent = sent.and_then(|c| {
        let hint = match c.is_remote_invalid_request() || c.is_remote_operation_error() {
            true => " (is the receiver's posted receive smaller than the message? rdma-core's rdma_server takes 16 bytes: try --size 16)",
            false => "",
        };
        c.check(|| format!("SEND_WITH_IMM of the whole buffer ({})", format_bytes(bytes)))
            .map_err(|e| TransferError::Protocol(format!("{e}{hint}")))
    });
    if sent.is_err() {
        // Nothing may read the source once this returns.
        conn.quiesce(TAG_RAW, &mut comps);
    }
    // SAFETY: the SEND completed (or its queue pair was quiesced): nothing reads the slot.
    unsafe { source.release_chunk(0) };
    sent?;
    // An optional reply (rdma-core's rdma_server sends 16 bytes). Keep waiting after the
    // peer's disconnect: its DISCONNECTED can overtake the reply's completion.
    let d = Deadline::after(RAW_REPLY_WAIT.min(timeout));
    while reply.is_none() {
        comps.clear();
        match conn.wait(&mut comps, &d, "a reply") {
            Ok(_) => reply = comps.iter().find(|c| c.wr_id == TAG_RAW | 1).copied(),
            Err(_) => break,
        }
    }
    conn.close(true, DISCONNECT_GRACE);
    Ok(SendReport {
        peer: label,
        device: id.device_name(),
        op: "raw",
        bytes,
        chunks: 1,
        chunk_bytes: bytes,
        in_flight: 1,
        connect_seconds,
        kept_connection: false,
        seconds,
        gbps: gigabytes_per_second(bytes, seconds),
        receiver: None,
        raw_reply_bytes: reply.filter(|c| c.is_ok()).map(|c| c.byte_len),
        round_trip_seconds: None,
        receiver_verify_seconds: None,
        path: source.path(),
        memory: memory_log,
        integrity: Default::default(),
        rails: Vec::new(),
    })
}

impl VerbsOffer {
    /// Serve a raw sender: one receive of up to `max_bytes` (and the device's largest
    /// message) in a buffer from `sinks`, verified, then the 16-byte reply. The outcome,
    /// and whether the request was accepted.
    pub fn serve_raw(
        self,
        sinks: SinkChoice<'_>,
        max_bytes: u64,
        timeout: Duration,
        busy_poll: bool,
    ) -> (RecvOutcome, bool) {
        let peer = self.peer.to_string();
        let request = self.request.into_inner();
        let len = max_bytes.min(self.max_message).max(1);
        let failed = |error: String| RecvOutcome::Failed {
            peer: peer.clone(),
            error,
        };
        let refused =
            |reason: RejectReason, why: String| refuse(&request, self.peer, reason, Some(why));
        let res = match Resources::new(&request.id, Resources::cq_entries(CAPS), busy_poll) {
            Ok(r) => r,
            Err(e) => return (refused(RejectReason::Internal, e.to_string()), false),
        };
        let made = match sinks {
            SinkChoice::Given(sink) => Ok((sink, Default::default())),
            SinkChoice::Plan(factory) => walk(&factory.plan(), |method| {
                let sink = factory
                    .make(method, len as usize)
                    .map_err(|e| format!("{e:#}"))?;
                MemoryRegion::register(&res.pd, sink.memory())
                    .map(drop)
                    .map_err(|e| e.to_string())?;
                Ok(sink)
            })
            .map(|w| (w.value, w.log))
            .map_err(|e| e.to_string()),
        };
        let (sink, memory_log) = match made {
            Ok(m) => m,
            Err(why) => {
                return (
                    refused(RejectReason::NotRegistrable { bytes: len }, why),
                    false,
                )
            }
        };
        let mr = match MemoryRegion::register(&res.pd, sink.memory()) {
            Ok(mr) => mr,
            Err(e) => {
                return (
                    refused(RejectReason::NoMemory { bytes: len }, e.to_string()),
                    false,
                )
            }
        };
        let reply_buf = match MessageBuffer::new(&res.pd, RAW_REPLY.len())
            .and_then(|b| b.write(&RAW_REPLY).map(|()| b))
        {
            Ok(b) => b,
            Err(e) => return (refused(RejectReason::Internal, e.to_string()), false),
        };
        let posted = Connection::new(&res, CAPS, (1, 0), 1).and_then(|conn| {
            let sge = mr.sge(0..len as usize)?;
            // SAFETY: the buffer is read (verified) only after the receive completed.
            unsafe { conn.qp.post_recv(TAG_RAW, Some(sge))? };
            request.id.accept(&ConnParams::with_private_data(&[]))?;
            Ok(conn)
        });
        let conn = match posted {
            Ok(c) => c,
            Err(e) => return (refused(RejectReason::Internal, e.to_string()), false),
        };
        let start = Instant::now();
        let d = Deadline::after(timeout);
        let mut comps = Vec::new();
        let message = loop {
            comps.clear();
            let waited = match conn.wait(&mut comps, &d, "the message") {
                Ok(w) => w,
                Err(RdmaError::Timeout { after, .. }) => {
                    return (
                        failed(format!(
                            "timed out: no message within {}",
                            format_duration(after)
                        )),
                        true,
                    )
                }
                Err(e) => return (failed(e.to_string()), true),
            };
            if waited == Waited::Disconnected {
                let _ = conn.cq.poll(&mut comps);
            }
            if let Some(c) = comps.iter().find(|c| c.wr_id == TAG_RAW) {
                break *c;
            }
            if waited == Waited::Disconnected {
                return (failed("peer disconnected before sending".into()), true);
            }
        };
        let seconds = start.elapsed().as_secs_f64();
        let checked = message.check(|| {
            format!(
                "the receive of up to {} (a larger message fails here: raise --max-bytes)",
                format_bytes(len)
            )
        });
        if let Err(e) = checked {
            return (failed(e.to_string()), true);
        }
        let bytes = message.byte_len as u64;
        let t = Instant::now();
        let (verification, verify_error) = match sink.verify(bytes as usize) {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let verify_seconds = t.elapsed().as_secs_f64();
        // rdma-core's rdma_client waits for a 16-byte reply before it disconnects.
        // SAFETY: the reply buffer is registered, outlives the queue pair's use of it and
        // is not written again.
        let replied = unsafe {
            conn.qp.post_send(&SendWr {
                wr_id: TAG_RAW | 1,
                sge: reply_buf.sge(RAW_REPLY.len()),
                op: SendOp::Send,
                signaled: true,
                inline: false,
                solicited: false,
            })
        };
        let mut reply_delivered = false;
        let d = Deadline::after(timeout);
        while replied.is_ok() && !reply_delivered {
            comps.clear();
            match conn.wait(&mut comps, &d, "the reply") {
                Ok(w) => {
                    if let Some(c) = comps.iter().find(|c| c.wr_id == TAG_RAW | 1) {
                        reply_delivered = c.is_ok();
                        break;
                    }
                    if w == Waited::Disconnected {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        conn.close(false, timeout);
        let report = RecvReport {
            peer: peer.clone(),
            op: "raw",
            bytes,
            chunks: 1,
            seconds,
            gbps: gigabytes_per_second(bytes, seconds),
            path: sink.path(),
            verification,
            verify_error,
            first_values: sink
                .first_values(5.min(bytes as usize / 4))
                .unwrap_or_default(),
            imm: message.imm,
            reply_delivered,
            transfers: 1,
            offered: 1,
            verify_seconds,
            memory: memory_log,
            integrity: Default::default(),
            striped: None,
        };
        (RecvOutcome::Completed(Box::new(report)), true)
    }
}
