//! The receiver of a transfer striped over several verbs rails (see `striped.rs` for the
//! sender and the protocol).
//!
//! Rail 0 is the connection the listener handed to this thread: its buffer is chosen
//! and registered as for any write-mode transfer, and its accept carries a token that
//! the listener's [`Joins`] knows. The listener routes each further rail's join to this
//! thread, which registers the SAME buffer on that rail's protection domain and accepts
//! with that rail's rkey. Every chunk is an RDMA WRITE_WITH_IMM (imm = index + 1), so
//! the receiver keeps receives posted on every rail and marks, per completion, which
//! chunk landed ([`Landed`]); a copy (a failover's resend) is counted and dropped. A
//! rail that breaks (its port goes down, its peer disconnects it) is noted and the
//! transfer goes on while another rail lives; rail 0 too, once a further rail has joined.
//! Once every chunk has landed the data is verified and the ack goes out on every rail
//! still up at once: the first that delivers it is enough, so a rail whose far end went
//! silent (no event here) cannot hold the verdict back.

use super::conn::{is_data, Connection, Resources, INDEX_MASK, TAG_DATA, WR_ACK};
use super::rails::{JoinSlot, Joins, Landed};
use super::receives::recv_depth;
use super::serving::{
    choose_sink, internal, peer_label, receiver_caps, receiver_connection, register_sink,
    setup_failed, wait_established, Failure, RecvConfig, MIN_RNR_TIMER,
};
use crate::memory::{RecvSink, SinkFactory};
use crate::rdma::{
    format_duration, CmId, Completion, CompletionQueue, ConnParams, ConnectRequest, Deadline,
    MemoryRegion, MessageBuffer, RdmaError, SendOp, SendWr, SendableRequest,
};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::{Integrity, RecvRail, StripedRecv};
use crate::transfer::{gigabytes_per_second, RecvReport, TransferError};
use crate::wire::{
    AcceptInfo, Ack, Header, Join, Op, Payload, RejectReason, StripedAccept, WireError, ACK_LEN,
};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a striped verbs offer must be: write mode, one transfer, a rail count, pattern
/// checks or none, no name (the sender's `why_not_striped` keeps to the same).
pub(super) fn check_offer(header: &Header) -> Result<(), Failure> {
    let fits = header.op == Op::Write
        && header.rails >= 2
        && !header.repeats()
        && !header.verify.checksum()
        && !header.named;
    if fits {
        return Ok(());
    }
    Err(Failure::Refuse(
        RejectReason::BadHeader(WireError::Inconsistent {
            what: "a striped verbs transfer is one write-mode transfer of 2..8 rails, unnamed, without checksums",
        }),
        None,
    ))
}

/// A further rail that joined: its queue pair (first: destroyed before the region), the
/// buffer registered on its PD, and its PD and CQ.
struct JoinedRail<'s> {
    /// No SGE is ever posted on it (its receives take only immediates), so it names no
    /// region: `'static`.
    conn: Connection<'static>,
    _mr: MemoryRegion<'s>,
    _res: Resources,
    rail: usize,
    from: String,
    stopped: Option<String>,
}

/// Receive one striped transfer on rail 0's connection `id`.
#[allow(clippy::too_many_arguments)]
pub(super) fn receive(
    cfg: &RecvConfig,
    id: &Rc<CmId>,
    peer: &str,
    header: Header,
    sinks: &SinkFactory,
    accepted: &Cell<bool>,
    joins: &Arc<Joins<SendableRequest>>,
) -> Result<RecvReport, Failure> {
    let total = header.total_bytes;
    let plan = ChunkPlan::new(total, header.chunk_bytes as u64).map_err(internal)?;
    let n = plan.count();
    let rails = header.rails as usize;
    // Every chunk consumes a receive on the rail it came on, and any rail may carry the
    // whole window: each rail posts as many as an unstriped receiver.
    let recv_depth = recv_depth(&header, n);
    let res = Resources::new(
        id,
        Resources::cq_entries(receiver_caps(recv_depth)),
        cfg.busy_poll,
    )
    .map_err(|e| setup_failed(peer, e))?;
    let (sink, memory_log) = choose_sink(&res, sinks, total, true)?;
    let sink = sink.as_ref();
    // SAFETY: `mr` is a local declared after `sink`, never moved out or leaked: it is
    // deregistered before the sink is dropped; the sink reads its memory only by copies.
    let mr = unsafe { register_sink(&res, sink, true) }.map_err(|e| {
        Failure::Refuse(RejectReason::NoMemory { bytes: total }, Some(e.to_string()))
    })?;
    let ack_buf = MessageBuffer::new(&res.pd, ACK_LEN).map_err(internal)?;
    let conn = receiver_connection(&res, recv_depth).map_err(|e| setup_failed(peer, e))?;
    let inline_ack = conn.qp.caps().max_inline_data as usize >= ACK_LEN;
    for p in 0..recv_depth as u64 {
        post_receive(&conn, p).map_err(internal)?;
    }
    let slot: JoinSlot<SendableRequest> = joins.open(header.rails).map_err(internal)?;
    let accept = StripedAccept {
        info: AcceptInfo {
            addr: mr.remote_base(),
            rkey: mr.rkey(),
            len: total,
        },
        token: slot.token,
    };
    id.accept(&ConnParams::with_private_data(&accept.encode()))?;
    accepted.set(true);
    let _ = conn.qp.set_min_rnr_timer(MIN_RNR_TIMER);
    wait_established(id, peer, cfg.timeout)?;
    let start = Instant::now();

    // --- the data, on every rail ---------------------------------------------------------
    let mut joined: Vec<JoinedRail> = Vec::new();
    let mut landed = Landed::new(n, rails);
    let mut bytes = vec![0u64; rails];
    let mut comps: Vec<Completion> = Vec::with_capacity(64);
    let mut deadline = Deadline::after(cfg.timeout);
    let mut rail0_stopped: Option<String> = None;
    let incomplete = |landed: &Landed, why: String| {
        Failure::Broken(TransferError::Incomplete {
            peer: peer.to_string(),
            got: landed.count() * plan.chunk_bytes(),
            total,
            why,
        })
    };
    while !landed.all() {
        let mut progress = false;
        while let Ok(request) = slot.rx.try_recv() {
            let request = request.into_inner();
            // The listener routed it by this join, decoded and checked there.
            let Ok(rail) = Join::decode(&request.private_data).map(|j| j.rail as usize) else {
                continue;
            };
            match join(cfg, &request, sink, recv_depth, total) {
                Ok((conn, mr, res)) => {
                    // A rail joining is progress: the data starts once all have.
                    progress = true;
                    joined.push(JoinedRail {
                        conn,
                        _mr: mr,
                        _res: res,
                        rail,
                        from: peer_label(request.peer),
                        stopped: None,
                    })
                }
                Err(reason) => {
                    let _ = request.id.reject(&reason.encode());
                }
            }
        }
        // Every rail, rail 0 first: a rail that breaks stops; the transfer goes on while
        // another lives.
        if rail0_stopped.is_none() {
            match poll_rail(&conn, 0, &mut landed, &mut bytes, &plan, &mut comps)? {
                Ok(news) => progress |= news,
                Err(why) => rail0_stopped = Some(why),
            }
        }
        for j in joined.iter_mut().filter(|j| j.stopped.is_none()) {
            match poll_rail(&j.conn, j.rail, &mut landed, &mut bytes, &plan, &mut comps)? {
                Ok(news) => progress |= news,
                Err(why) => j.stopped = Some(why),
            }
        }
        if let Some(why) = &rail0_stopped {
            if joined.iter().all(|j| j.stopped.is_some()) {
                let others = joined.iter().filter_map(|j| {
                    let why = j.stopped.as_deref()?;
                    Some(format!("; rail {}: {why}", j.rail))
                });
                let others: String = others.collect();
                return Err(incomplete(&landed, format!("rail 0: {why}{others}")));
            }
        }
        if progress {
            deadline = Deadline::after(cfg.timeout);
        } else if deadline.expired() {
            return Err(incomplete(
                &landed,
                format!(
                    "timed out: nothing arrived for {}",
                    format_duration(cfg.timeout)
                ),
            ));
        } else {
            std::thread::sleep(IDLE_NAP);
        }
    }
    let seconds = start.elapsed().as_secs_f64();

    // --- verify, ack on rail 0 -------------------------------------------------------------
    let verify_start = Instant::now();
    let pattern_check = header.payload == Payload::Pattern && header.verify.pattern();
    let (verification, verify_error) = match pattern_check.then(|| sink.verify(total as usize)) {
        Some(Ok(v)) => (Some(v), None),
        Some(Err(e)) => (None, Some(format!("{e:#}"))),
        None => (None, None),
    };
    let verify_seconds = verify_start.elapsed().as_secs_f64();
    let ack = match header.verify.pattern() {
        true => Ack::new(total, verification),
        false => Ack::checked(total, None, None, 0),
    };
    let rail0 = rail0_stopped
        .is_none()
        .then_some((&conn, &ack_buf, inline_ack));
    let others: Vec<&Connection<'static>> = joined
        .iter()
        .filter(|j| j.stopped.is_none())
        .map(|j| &j.conn)
        .collect();
    let delivered = deliver_ack(rail0, &others, &ack.encode(), cfg.timeout)?;
    let reply_delivered = delivered.is_some();
    for j in &joined {
        j.conn.close(false, RAIL_CLOSE_GRACE);
    }
    // Rail 0's close waits for the sender's disconnect, which follows its reading the ack
    // there; an ack delivered elsewhere says rail 0 may be gone without a word.
    conn.close(
        false,
        match delivered {
            Some(true) => cfg.timeout,
            _ => RAIL_CLOSE_GRACE,
        },
    );

    let mut report_rails = vec![RecvRail {
        rail: 0,
        from: Some(peer.to_string()),
        bytes: bytes[0],
        chunks: landed.chunks[0],
        copies_dropped: landed.copies[0],
        stopped: rail0_stopped.clone(),
    }];
    report_rails.extend(joined.iter().map(|j| RecvRail {
        rail: j.rail as u16,
        from: Some(j.from.clone()),
        bytes: bytes[j.rail],
        chunks: landed.chunks[j.rail],
        copies_dropped: landed.copies[j.rail],
        stopped: j.stopped.clone(),
    }));
    Ok(RecvReport {
        peer: peer.to_string(),
        op: header.op.name(),
        bytes: total,
        chunks: n,
        seconds,
        gbps: gigabytes_per_second(total, seconds),
        path: sink.path(),
        verification,
        verify_error,
        first_values: sink.first_values(5).unwrap_or_default(),
        imm: None,
        reply_delivered,
        transfers: 1,
        offered: 1,
        verify_seconds,
        memory: memory_log,
        integrity: Box::new(Integrity {
            verify: Some(header.verify),
            payload: Some(header.payload),
            ..Integrity::default()
        }),
        striped: Some(Box::new(StripedRecv {
            rails: report_rails,
            asked_again: 0,
        })),
    })
}

/// How long a further rail's close waits for the sender's DISCONNECTED.
const RAIL_CLOSE_GRACE: Duration = Duration::from_millis(500);
/// How long the loop sleeps when no rail had news (it polls them in turn).
const IDLE_NAP: Duration = Duration::from_micros(100);

/// Take what rail `rail` has to say: chunks that landed (`Ok(true)`: some did), or why
/// it broke (the inner `Err`). The outer `Err` ends the transfer: an immediate that no
/// chunk of the plan has is a lying sender, not a broken rail.
fn poll_rail(
    conn: &Connection,
    rail: usize,
    landed: &mut Landed,
    bytes: &mut [u64],
    plan: &ChunkPlan,
    comps: &mut Vec<Completion>,
) -> Result<Result<bool, String>, Failure> {
    comps.clear();
    if let Err(e) = conn.cq.poll(comps) {
        return Ok(Err(e.to_string()));
    }
    let mut progress = false;
    let mut broke = None;
    for c in comps.iter() {
        match landing(c) {
            Ok(Some(index)) => {
                land(landed, bytes, plan, index, rail)
                    .map_err(|why| Failure::Broken(TransferError::Protocol(why)))?;
                progress = true;
                if broke.is_none() {
                    if let Err(e) = post_receive(conn, index as u64) {
                        broke = Some(format!("reposting a receive: {e}"));
                    }
                }
            }
            Ok(None) => {}
            Err(why) => broke = broke.or(Some(why)),
        }
    }
    if let Some(why) = broke {
        return Ok(Err(why));
    }
    match conn.poll_events() {
        Ok(false) => Ok(Ok(progress)),
        Ok(true) => Ok(Err("the sender disconnected it".into())),
        Err(RdmaError::DeviceFault(fault)) => Ok(Err(fault)),
        Err(e) => Ok(Err(e.to_string())),
    }
}

/// Send `ack` on rail 0 (`rail0`: its connection, a buffer registered on its PD, and
/// whether it sends inline; `None` when it stopped) and on every joined rail in `others`
/// (inline) at once. Returns which delivered it first (its send completed: the sender's
/// NIC has it): `Some(true)` rail 0, `Some(false)` another rail, `None` when none did
/// within `timeout` (every send failed, or nothing came back). The sender takes the
/// first ack on any rail.
fn deliver_ack<'r>(
    rail0: Option<(&Connection<'r>, &'r MessageBuffer, bool)>,
    others: &[&Connection<'static>],
    ack: &[u8],
    timeout: Duration,
) -> Result<Option<bool>, Failure> {
    // Each rail the ack went out on: whether it is rail 0, and its CQ.
    let mut waiting: Vec<(bool, &CompletionQueue)> = Vec::new();
    if let Some((conn, buf, inline)) = rail0 {
        if !conn.is_disconnected() {
            buf.write(ack)?;
            // SAFETY: the buffer is registered on rail 0's PD (lkey in the SGE), outlives
            // the connection's use of it (the caller keeps it until after close), and is
            // not written again.
            let posted = unsafe {
                conn.qp.post_send(&SendWr {
                    wr_id: WR_ACK,
                    sge: buf.sge(ack.len()),
                    op: SendOp::Send,
                    signaled: true,
                    inline,
                    solicited: false,
                })
            };
            if posted.is_ok() {
                waiting.push((true, &conn.cq));
            }
        }
    }
    for conn in others {
        // A rail that cannot send inline is left out: rail 0 or another rail carries it.
        if !conn.is_disconnected() && conn.qp.post_send_inline(WR_ACK, ack).is_ok() {
            waiting.push((false, &conn.cq));
        }
    }
    let deadline = Deadline::after(timeout);
    let mut comps = Vec::new();
    while !waiting.is_empty() && !deadline.expired() {
        let mut failed = Vec::new();
        for (k, (is_rail0, cq)) in waiting.iter().enumerate() {
            comps.clear();
            if cq.poll(&mut comps).is_err() {
                failed.push(k);
                continue;
            }
            match comps.iter().find(|c| c.wr_id == WR_ACK) {
                Some(c) if c.is_ok() => return Ok(Some(*is_rail0)),
                Some(_) => failed.push(k),
                None => {}
            }
        }
        for k in failed.into_iter().rev() {
            waiting.remove(k);
        }
        std::thread::sleep(IDLE_NAP);
    }
    Ok(None)
}

/// Post receive `p` (for an immediate only: no SGE).
fn post_receive(conn: &Connection, p: u64) -> Result<(), RdmaError> {
    // SAFETY: a receive without an SGE names no memory; it only takes an immediate.
    unsafe { conn.qp.post_recv(TAG_DATA | (p & INDEX_MASK), None) }
}

/// The chunk a data completion says landed (`Ok(None)`: not a data completion), or why
/// the rail broke.
fn landing(c: &Completion) -> Result<Option<u32>, String> {
    if !is_data(c.wr_id) {
        return Ok(None);
    }
    if !c.is_ok() {
        return Err(format!("its receive failed: {}", c.status_str()));
    }
    match c.imm {
        Some(imm) if c.is_write_with_imm() => Ok(Some(imm)),
        _ => Err(format!(
            "expected an RDMA WRITE with immediate, got a message of {} bytes",
            c.byte_len
        )),
    }
}

fn land(
    landed: &mut Landed,
    bytes: &mut [u64],
    plan: &ChunkPlan,
    imm: u32,
    rail: usize,
) -> Result<(), String> {
    if landed.land(imm, rail)? {
        bytes[rail] += plan.get(imm as u64 - 1).map_or(0, |c| c.len);
    }
    Ok(())
}

/// Take a further rail: the same buffer registered on its PD, receives posted, accepted
/// with its rkey. Why not, for its reject.
fn join<'s>(
    cfg: &RecvConfig,
    request: &ConnectRequest,
    sink: &'s dyn RecvSink,
    recv_depth: u32,
    total: u64,
) -> Result<(Connection<'static>, MemoryRegion<'s>, Resources), RejectReason> {
    let res = Resources::new(
        &request.id,
        Resources::cq_entries(receiver_caps(recv_depth)),
        cfg.busy_poll,
    )
    .map_err(|_| RejectReason::Internal)?;
    // SAFETY: the region goes into a JoinedRail, a local of `receive` declared after the
    // sink, never leaked: deregistered before the sink is dropped; the sink reads its
    // memory only by copies.
    let mr = unsafe { register_sink(&res, sink, true) }
        .map_err(|_| RejectReason::NotRegistrable { bytes: total })?;
    let conn: Connection<'static> =
        receiver_connection(&res, recv_depth).map_err(|_| RejectReason::Internal)?;
    for p in 0..recv_depth as u64 {
        post_receive(&conn, p).map_err(|_| RejectReason::Internal)?;
    }
    let accept = AcceptInfo {
        addr: mr.remote_base(),
        rkey: mr.rkey(),
        len: total,
    };
    request
        .id
        .accept(&ConnParams::with_private_data(&accept.encode()))
        .map_err(|_| RejectReason::Internal)?;
    let _ = conn.qp.set_min_rnr_timer(MIN_RNR_TIMER);
    Ok((conn, mr, res))
}
