//! The receiving side: listen, and serve many senders at once.
//!
//! **A thread per connection.** The listener thread takes each connect request, decides
//! at once whether it may be served (`--max-connections`, `--max-memory`: if not, the
//! sender is told "receiver busy" and nothing waits), and hands it to a thread of its own
//! that runs the whole transfer with its own queue pair, buffer, deadlines and verdict.
//! Threads rather than one event loop over all the completion channels: each transfer
//! stays the straight sequence of steps below, with its own blocking waits and deadlines,
//! and a sender that stalls, trickles or sends garbage can only ever block its own
//! thread. The cost, a thread and a stack per connection, is bounded by
//! `--max-connections`. GPU objects are not `Send`, so each thread makes its own buffers
//! (and opens the GPU itself where the plan may put data there).
//!
//! **Deadlines a slow peer cannot stretch.** Besides `--timeout` for every wait (which
//! restarts on progress), a transfer of `n` bytes must be done within `--timeout` plus
//! `n / --min-rate`, and over a `--reuse-connection` the rate counts over the connection
//! (transfer `k` done `--timeout + (k + 1) × n / rate` after it was established); past
//! that the receiver sends a "too slow" ack and disconnects, and both sides say so.
//!
//! **Admission** is the TCP receiver's too ([`crate::server`]): `--allow`, then
//! connections, this address's share (`--max-per-peer`) and bytes, answered at once by
//! the listener; `--once` is used up only by a connection that was accepted.

use super::checks;
use super::conn::{
    is_data, tag, Connection, Resources, Waited, INDEX_MASK, TAG_DATA, TAG_NAME, WR_ACK, WR_REPLY,
};
use super::rails::Joins;
use super::receives::{recv_depth, Receives};
use super::repair::{self, CONTROL_SLOT, MAX_CHECKSUM_CHUNKS};
use super::serving::{
    choose_sink, internal, peer_label, receiver_caps, receiver_connection, register_sink,
    setup_failed, wait_established, Failure, RecvConfig, MIN_RNR_TIMER,
};
use crate::memory::{SinkFactory, Verification};
use crate::rdma::format_duration;
use crate::rdma::{
    self, CmEventKind, CmId, Completion, ConnParams, ConnectRequest, Deadline, EventChannel,
    MemoryRegion, MessageBuffer, QpCaps, RdmaError, SendOp, SendWr, SendableRequest,
};
use crate::server::admission::{Admission, Books, Lease, Limits, Want};
use crate::server::key::Nonces;
use crate::server::Key;
use crate::transfer::plan::ChunkPlan;
use crate::transfer::report::{Integrity, Repaired};
use crate::transfer::units::format_bytes;
use crate::transfer::{gigabytes_per_second, RecvOutcome, RecvReport, TransferError};
use crate::wire::{
    checked_name, decode_name_prefix, AcceptInfo, Ack, AckStatus, Header, Join, Op, Payload,
    RejectReason, VerbsProof, VerifyMode, WireError, ACK_LEN, HEADER_LEN, MAX_NAME_LEN,
    NAME_PREFIX_LEN, RAW_REPLY,
};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Makes the buffers of one connection, on the thread that serves it (GPU objects stay
/// on the thread that made them).
pub type SinkFactoryMaker = dyn Fn() -> anyhow::Result<SinkFactory> + Send + Sync;

/// A connection's thread, done: what happened, and whether the connection was accepted
/// (only an accepted one uses `--once` up).
struct Finished {
    outcome: RecvOutcome,
    accepted: bool,
}

/// Listen on `cfg.bind` and serve senders, many at once, telling `report` about each.
/// Returns only with `--once` (`Ok(true)` if that one transfer verified) or on an error
/// of the listener itself.
pub fn serve(
    cfg: &RecvConfig,
    make_sinks: Arc<SinkFactoryMaker>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let limits = Limits::receiver(
        cfg.once,
        cfg.max_connections,
        cfg.max_memory,
        cfg.max_per_peer,
    );
    serve_with(cfg, make_sinks, &Admission::new(limits), report)
}

/// [`serve`] under an admission shared with another receiver (`--transport auto` serves
/// verbs and TCP under one).
pub fn serve_with(
    cfg: &RecvConfig,
    make_sinks: Arc<SinkFactoryMaker>,
    admission: &Arc<Admission>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    rdma::ensure_device()?;
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel)?;
    listener.bind(cfg.bind)?;
    listener.listen(LISTEN_BACKLOG)?;
    let addr = listener
        .local_addr()
        .map_or_else(|| cfg.bind.to_string(), |a| a.to_string());
    report(&RecvOutcome::Listening { addr });
    // `--once` serves one transfer: one connection at a time, and only a transfer that
    // was accepted (not a refused or withdrawn request) uses it up.
    let (done_tx, done_rx) = mpsc::channel::<Finished>();
    // Nonces handed out with `--key-file`, each good once, for --timeout.
    let mut nonces = Nonces::new(cfg.timeout, MAX_NONCES);
    // The striped transfers being served, for their further rails' joins.
    let joins: Arc<Joins<SendableRequest>> = Arc::new(Joins::default());
    loop {
        for finished in done_rx.try_iter() {
            report(&finished.outcome);
            if cfg.once && finished.accepted {
                return Ok(matches!(&finished.outcome, RecvOutcome::Completed(r) if r.ok()));
            }
        }
        let Some(event) = channel.get_event_within(LISTENER_TICK)? else {
            continue;
        };
        match event.kind() {
            CmEventKind::ConnectRequest => {}
            CmEventKind::DeviceRemoval => {
                return Err(TransferError::Protocol(
                    "the RDMA device of the listener was removed".into(),
                ))
            }
            _ => continue, // nothing else concerns the listener
        }
        let request = match event.into_connect_request(&channel) {
            Ok(request) => request,
            Err(e) => {
                report(&RecvOutcome::Failed {
                    peer: "?".into(),
                    error: format!("taking a connection request: {e}"),
                });
                continue;
            }
        };
        let peer = peer_label(request.peer);
        if let Ok(join) = Join::decode(&request.private_data) {
            // A further rail of a striped transfer: it rides on that transfer's lease.
            if let Some(outcome) = route_join(cfg, &joins, request, join, peer) {
                report(&outcome);
            }
            continue;
        }
        let lease = match admit(cfg, admission, &mut nonces, &request) {
            Ok(lease) => lease,
            Err(reason) => {
                report(&conclude(
                    &request.id,
                    peer,
                    Err(Failure::Refuse(reason, None)),
                ));
                continue;
            }
        };
        let request = match request.into_sendable() {
            Ok(r) => r,
            Err(request) => {
                let e = internal("the connection request is still referenced elsewhere");
                report(&conclude(&request.id, peer, Err(e)));
                continue;
            }
        };
        let (cfg_for_thread, maker, done) = (cfg.clone(), make_sinks.clone(), done_tx.clone());
        let joins = joins.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("recv {peer}"))
            .spawn(move || {
                let request = request.into_inner();
                let accepted = Cell::new(false);
                let outcome =
                    serve_connection(&cfg_for_thread, request, maker.as_ref(), &accepted, &joins);
                // Its share is free before the listener hears of the end.
                drop(lease);
                // The listener may be gone (--once ended): nothing left to tell.
                let _ = done.send(Finished {
                    outcome,
                    accepted: accepted.get(),
                });
            });
        if let Err(e) = spawned {
            report(&RecvOutcome::Failed {
                peer,
                error: format!("starting a thread for the connection: {e}"),
            });
        }
    }
}

/// Hand a further rail's join to the thread serving its transfer: only from an address
/// the allow-list admits (no bytes reserved: the join shares its transfer's lease, and a
/// transfer takes at most 8 rails). A join with an unknown token, a rail past the count
/// or one that joined already is rejected by name; the outcome to report then.
fn route_join(
    cfg: &RecvConfig,
    joins: &Joins<SendableRequest>,
    request: ConnectRequest,
    join: Join,
    peer: String,
) -> Option<RecvOutcome> {
    let ip = request
        .peer
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip());
    if !cfg.allow.is_empty() && (request.peer.is_none() || !cfg.allow.permits(ip)) {
        return Some(conclude(
            &request.id,
            peer,
            Err(Failure::Refuse(RejectReason::NotAllowed, None)),
        ));
    }
    if cfg.key.is_some() {
        // A join holds a token, no proof of the key: with a key it joins nothing (the
        // token travelled in the clear, in rail 0's accept).
        let reason = RejectReason::BadHeader(WireError::KeyedVerbsStriping);
        let detail = Some(format!("rail {} of a striped transfer", join.rail));
        return Some(conclude(
            &request.id,
            peer,
            Err(Failure::Refuse(reason, detail)),
        ));
    }
    let sendable = match request.into_sendable() {
        Ok(s) => s,
        Err(request) => {
            let e = internal("the join request is still referenced elsewhere");
            return Some(conclude(&request.id, peer, Err(e)));
        }
    };
    match joins.route(&join, sendable) {
        Ok(()) => None,
        Err((reason, sendable)) => {
            let request = sendable.into_inner();
            Some(conclude(
                &request.id,
                peer,
                Err(Failure::Refuse(
                    reason,
                    Some(format!("rail {} of a striped transfer", join.rail)),
                )),
            ))
        }
    }
}

/// Connection requests the CM queues for the listener before it takes them.
const LISTEN_BACKLOG: i32 = 64;
/// How often the listener looks for finished connections when no request comes.
const LISTENER_TICK: Duration = Duration::from_millis(50);

/// May this request be served now? Its lease on the receiver's connections and bytes,
/// or why not: an address outside `--allow` first, before anything else. Offers the
/// connection's thread will reject anyway (a bad header, too large) reserve no bytes.
fn admit(
    cfg: &RecvConfig,
    admission: &Arc<Admission>,
    nonces: &mut Nonces,
    request: &ConnectRequest,
) -> Result<Lease, RejectReason> {
    let ip = request
        .peer
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |p| p.ip());
    if !cfg.allow.is_empty() && (request.peer.is_none() || !cfg.allow.permits(ip)) {
        return Err(RejectReason::NotAllowed);
    }
    if let Some(key) = &cfg.key {
        check_proof(key, nonces, ip, &request.private_data)?;
        // Its further rails could not join (see route_join): say so to the sender now,
        // rather than have it fail over from every rail but the first.
        if Header::decode(&request.private_data).is_ok_and(|h| h.striped) {
            return Err(RejectReason::BadHeader(WireError::KeyedVerbsStriping));
        }
    }
    let (wanted, books) = if cfg.raw {
        (cfg.max_bytes, Books::default())
    } else {
        match Header::decode(&request.private_data) {
            // Chunks checked by checksum or striped keep books per chunk (expected and
            // landed checksums, resend lists), counted with the buffer.
            Ok(h) if h.total_bytes <= cfg.max_bytes => (
                h.total_bytes,
                Books::of(h.chunks(), h.verify.checksum(), h.striped),
            ),
            _ => (0, Books::default()),
        }
    };
    let want = Want {
        bytes: wanted,
        descriptors: 0,
    };
    admission.admit_offer(ip, want, books)
}

/// Nonces a verbs receiver with a key keeps at once (each 16 bytes and an address).
const MAX_NONCES: usize = 4096;

/// With `--key-file`: a connect request without a proof is answered with a fresh nonce
/// (rejected with [`RejectReason::KeyChallenge`]); one with a proof must carry the first
/// bytes of HMAC-SHA256 over its header and a nonce this receiver gave its address, unused
/// and within --timeout. Nothing is allocated before this passes.
fn check_proof(
    key: &Key,
    nonces: &mut Nonces,
    ip: IpAddr,
    private_data: &[u8],
) -> Result<(), RejectReason> {
    let Some(proof) = VerbsProof::decode(private_data) else {
        return match nonces.issue(ip) {
            Some(nonce) => Err(RejectReason::KeyChallenge { nonce }),
            None => Err(RejectReason::BusyHandshakes {
                active: nonces.len() as u64,
                max: MAX_NONCES as u64,
            }),
        };
    };
    let header = private_data.get(..HEADER_LEN).unwrap_or_default();
    match nonces.take(proof.nonce_id, ip) {
        Some(nonce) if key.verify_truncated(header, &nonce, &proof.tag) => Ok(()),
        _ => Err(RejectReason::BadProof),
    }
}

/// Serve one connection on its own thread, with buffers made there, and tell the peer
/// (reject) or the log (outcome) how it ended.
fn serve_connection(
    cfg: &RecvConfig,
    request: ConnectRequest,
    make_sinks: &SinkFactoryMaker,
    accepted: &Cell<bool>,
    joins: &Arc<Joins<SendableRequest>>,
) -> RecvOutcome {
    let peer = peer_label(request.peer);
    let result = match make_sinks() {
        Ok(sinks) if cfg.raw => raw(cfg, &request, &peer, &sinks, accepted),
        Ok(sinks) => framed(cfg, &request, &peer, &sinks, accepted, joins),
        Err(e) => Err(internal(format!("{e:#}"))),
    };
    conclude(&request.id, peer, result)
}

fn conclude(id: &CmId, peer: String, result: Result<RecvReport, Failure>) -> RecvOutcome {
    match result {
        Ok(report) => RecvOutcome::Completed(report),
        Err(Failure::Refuse(reason, detail)) => {
            let reject = id.reject(&reason.encode());
            let mut text = reason.to_string();
            if let Some(detail) = detail {
                text = format!("{text}: {detail}");
            }
            if let Err(e) = reject {
                text = format!("{text} (and the reject failed: {e})");
            }
            RecvOutcome::Rejected { peer, reason: text }
        }
        Err(Failure::Broken(e) | Failure::TooSlow(e)) => RecvOutcome::Failed {
            peer,
            error: e.to_string(),
        },
    }
}

fn framed(
    cfg: &RecvConfig,
    request: &ConnectRequest,
    peer: &str,
    sinks: &SinkFactory,
    accepted: &Cell<bool>,
    joins: &Arc<Joins<SendableRequest>>,
) -> Result<RecvReport, Failure> {
    let header = Header::decode(&request.private_data)
        .map_err(|e| Failure::Refuse(RejectReason::BadHeader(e), None))?;
    if header.striped {
        super::striped_recv::check_offer(&header)?;
    }
    let total = header.total_bytes;
    if total > cfg.max_bytes {
        return Err(Failure::Refuse(
            RejectReason::TooLarge {
                requested: total,
                max: cfg.max_bytes,
            },
            None,
        ));
    }
    if header.verify.checksum() && header.chunks() > MAX_CHECKSUM_CHUNKS {
        // Its bookkeeping takes 8 bytes per chunk (checksums, resend lists).
        return Err(Failure::Refuse(
            RejectReason::NoMemory {
                bytes: header.chunks() * 8,
            },
            Some(format!(
                "{} chunks to check by checksum, more than {MAX_CHECKSUM_CHUNKS}: use a larger --chunk",
                header.chunks()
            )),
        ));
    }
    let port = request.id.port_info().map_err(internal)?;
    if header.chunk_bytes > port.max_msg_sz {
        return Err(Failure::Refuse(
            RejectReason::ChunkTooLarge {
                chunk: header.chunk_bytes as u64,
                max: port.max_msg_sz as u64,
            },
            None,
        ));
    }
    if header.striped {
        return super::striped_recv::receive(
            cfg,
            &request.id,
            peer,
            header,
            sinks,
            accepted,
            joins,
        );
    }
    receive_framed(cfg, &request.id, peer, header, sinks, accepted)
}

fn receive_framed(
    cfg: &RecvConfig,
    id: &Rc<CmId>,
    peer: &str,
    header: Header,
    sinks: &SinkFactory,
    accepted: &Cell<bool>,
) -> Result<RecvReport, Failure> {
    let total = header.total_bytes;
    let plan = ChunkPlan::new(total, header.chunk_bytes as u64).map_err(internal)?;
    let n = plan.count();
    let transfers = header.transfers as u64;
    let recv_depth = recv_depth(&header, n);
    // One more receive, first of all, for the sender's name (header flag 0x02).
    let named = header.named as u32;
    let res = Resources::new(
        id,
        Resources::cq_entries(receiver_caps(recv_depth + named)),
        cfg.busy_poll,
    )
    .map_err(|e| setup_failed(peer, e))?;
    // Remote write only for write mode, only on this connection's buffer.
    let remote_write = header.op == Op::Write;
    let (sink, memory_log) = choose_sink(&res, sinks, total, remote_write)?;
    let sink = sink.as_ref();
    // SAFETY: `mr` is a local of this function, declared after `sink` and never moved out
    // or leaked, so it is dropped (deregistered) before the sink; the sink reads its
    // memory only by copies (RecvSink's contract).
    let mr = unsafe { register_sink(&res, sink, remote_write) }.map_err(|e| {
        Failure::Refuse(RejectReason::NoMemory { bytes: total }, Some(e.to_string()))
    })?;
    let ack_buf = MessageBuffer::new(&res.pd, ACK_LEN).map_err(internal)?;
    // With checksums: control slots for the sender's checksum messages (see Receives),
    // and a buffer for the resend requests.
    let checksums = header.verify.checksum();
    let slots = match header.op {
        Op::Send => (recv_depth as u64).min(repair::checksum_messages(n)),
        Op::Write => recv_depth as u64,
    };
    let ctrl = match checksums {
        true => Some(MessageBuffer::new(&res.pd, slots as usize * CONTROL_SLOT).map_err(internal)?),
        false => None,
    };
    let resend_buf =
        MessageBuffer::new(&res.pd, if checksums { CONTROL_SLOT } else { 1 }).map_err(internal)?;
    // The queue pair last: it may name only regions that outlive it.
    let name_buf = match header.named {
        true => {
            Some(MessageBuffer::new(&res.pd, NAME_PREFIX_LEN + MAX_NAME_LEN).map_err(internal)?)
        }
        false => None,
    };
    let conn = receiver_connection(&res, recv_depth + named).map_err(|e| setup_failed(peer, e))?;
    let inline_ack = conn.qp.caps().max_inline_data as usize >= ACK_LEN;
    let mut recvs = Receives {
        conn: &conn,
        mr: &mr,
        plan: &plan,
        op: header.op,
        ctrl: ctrl.as_ref(),
        slots: slots.max(1),
        posted: 0,
        limit: match (header.op, checksums) {
            (Op::Send, false) => n,
            (Op::Send, true) => n + repair::checksum_messages(n),
            (Op::Write, false) => n.saturating_mul(transfers),
            (Op::Write, true) => u64::MAX,
        },
    };
    if let Some(buf) = &name_buf {
        // SAFETY: the buffer is read only after this receive's completion was polled.
        unsafe { conn.qp.post_recv(TAG_NAME, Some(buf.sge(buf.len()))) }.map_err(internal)?;
    }
    while recvs.posted < recv_depth as u64 {
        recvs.post().map_err(internal)?;
    }
    let accept = match header.op {
        Op::Write => AcceptInfo {
            addr: mr.remote_base(),
            rkey: mr.rkey(),
            len: total,
        },
        Op::Send => AcceptInfo {
            addr: 0,
            rkey: 0,
            len: total,
        },
    };
    id.accept(&ConnParams::with_private_data(&accept.encode()))?;
    accepted.set(true);
    // Should the receives run out after all, the sender retries after 0.64 ms, not the
    // 655 ms the CM leaves configured. Only an optimisation: failure is not fatal.
    let _ = conn.qp.set_min_rnr_timer(MIN_RNR_TIMER);
    wait_established(id, peer, cfg.timeout)?;
    let start = Instant::now();

    let mut comps: Vec<Completion> = Vec::with_capacity(64);
    // Acks of earlier transfers (repeat mode) whose send completion is still to come.
    let mut acks_pending = 0u32;
    let mut acks_delivered = true;
    let mut seconds = 0.0;
    let mut verify_seconds = 0.0;
    let mut verification: Option<Verification> = None;
    let mut verify_error: Option<String> = None;
    let mut reply_delivered = false;
    let mut integrity = Integrity {
        verify: Some(header.verify),
        payload: Some(header.payload),
        ..Integrity::default()
    };
    let pattern_check = header.payload == Payload::Pattern && header.verify.pattern();
    let mut leftover = Vec::new();
    // The sender's name message: its completion comes before the first data.
    let mut name_came: Option<Completion> = None;
    for k in 0..transfers {
        // Words for errors: which transfer of several it was.
        let context = Context { k, transfers };
        // A sender that marks solicited events wakes us for one in a quarter window (and
        // for the last chunk); sleeping until then spares wake-ups (and Soft-RoCE the
        // notification work on the sender's CPU). Every completion is polled either way.
        conn.cq.set_solicited_only(header.solicited_events);
        let mut on_ack = |c: &Completion| {
            if tag(c.wr_id) == TAG_NAME {
                name_came = Some(*c);
                return;
            }
            acks_pending = acks_pending.saturating_sub(1);
            acks_delivered &= c.is_ok();
        };
        let received = receive_transfer(
            cfg,
            &conn,
            peer,
            header,
            &plan,
            &mut recvs,
            &mut comps,
            context,
            start,
            &mut on_ack,
            &mut leftover,
        );
        if let Err(Failure::TooSlow(TransferError::TooSlow { got, .. })) = &received {
            // Tell the sender why, as its ack, before the disconnect ends it: best effort,
            // and only where the ack buffer is free (inline acks, or none in flight).
            let buffer_free = inline_ack || acks_pending == 0;
            // The ack speaks of this transfer; the error of the connection.
            let this = got.saturating_sub(k * total);
            if buffer_free && ack_buf.write(&Ack::too_slow(this).encode()).is_ok() {
                let _ = send_and_wait(
                    &conn,
                    &ack_buf,
                    WR_ACK | (k & INDEX_MASK),
                    ACK_LEN,
                    inline_ack,
                    Duration::from_secs(1),
                    "the too-slow ack",
                );
            }
            conn.close(true, Duration::from_secs(1));
        }
        received?;
        if let (Some(c), Some(buf)) = (name_came.take(), &name_buf) {
            integrity.name = sender_name(buf, &c);
        }
        seconds = start.elapsed().as_secs_f64();
        conn.cq.set_solicited_only(false);

        // --- verify, and tell the sender -------------------------------------------------
        let verify_start = Instant::now();
        let checked = if checksums {
            let mut round = checks::Round {
                conn: &conn,
                recvs: &mut recvs,
                resend_buf: &resend_buf,
                sink,
                plan: &plan,
                peer,
                timeout: cfg.timeout,
                max_resends: header.max_resends,
                context: context.words(),
                queue: leftover.drain(..).collect(),
            };
            let mut on_ack = |c: &Completion| {
                acks_pending = acks_pending.saturating_sub(1);
                acks_delivered &= c.is_ok();
            };
            Some(round.check(&mut on_ack)?)
        } else {
            None
        };
        let (this, this_error) = match pattern_check.then(|| sink.verify(total as usize)) {
            Some(Ok(v)) => (Some(v), None),
            Some(Err(e)) => (None, Some(format!("{e:#}"))),
            None => (None, None),
        };
        let took = verify_start.elapsed();
        verify_seconds += took.as_secs_f64();
        verification = merge_verifications(k, verification, this);
        if verify_error.is_none() {
            verify_error = this_error.map(|e| format!("{e}{}", context.words()));
        }
        let mut ack = match &checked {
            _ if header.verify == VerifyMode::Pattern => Ack::new(total, this),
            None => Ack::checked(total, pattern_check.then_some(this), None, 0),
            Some(c) => {
                let repaired = c.repaired.len() as u32;
                let ack = Ack::checked(total, pattern_check.then_some(this), c.digest, repaired);
                if c.failed.is_empty() {
                    ack
                } else {
                    ack.with_status(AckStatus::ChecksumFailed)
                }
            }
        };
        if let Some(c) = &checked {
            integrity.digest = c.digest;
            integrity.chunks_checked += n + c.resent;
            integrity
                .repaired
                .extend(c.repaired.iter().map(|&(chunk, attempts)| Repaired {
                    chunk: chunk as u64,
                    attempts,
                }));
            integrity
                .failed_chunks
                .extend(c.failed.iter().map(|&chunk| chunk as u64));
        }
        if let (Some(output), AckStatus::Verified) = (&cfg.output, ack.status) {
            let name = integrity.name.clone();
            match output.store(name.as_deref(), peer, |w| sink.write_to(total as usize, w)) {
                Ok(at) => integrity.stored = Some(at),
                Err(e) => {
                    integrity.store_error = Some(format!("{e:#}{}", context.words()));
                    ack = ack.with_status(AckStatus::NotStored);
                }
            }
        }
        if header.repeats() {
            ack = ack.with_verify_time(took);
        }
        let ack_id = WR_ACK | (k & INDEX_MASK);
        if k + 1 == transfers {
            ack_buf.write(&ack.encode())?;
            let delivered = send_and_wait(
                &conn,
                &ack_buf,
                ack_id,
                ACK_LEN,
                inline_ack,
                cfg.timeout,
                "the ack",
            )?;
            reply_delivered = delivered && acks_delivered;
        } else {
            // The buffer is poisoned again, so the next transfer cannot verify on this
            // one's data; then its receives go in, before the ack that lets it start.
            sink.poison().map_err(internal)?;
            recvs
                .start_next_transfer(recv_depth as u64)
                .map_err(Failure::from)?;
            if !inline_ack {
                // The buffer may be rewritten only once the previous ack has left.
                wait_for_acks(&conn, &mut comps, cfg.timeout, &mut acks_pending)?;
            }
            ack_buf.write(&ack.encode())?;
            // SAFETY: `ack_buf` is registered and outlives the connection's use of it;
            // inline, its bytes are copied now; otherwise it is not rewritten before
            // this request's completion (wait_for_acks above).
            unsafe {
                conn.qp.post_send(&SendWr {
                    wr_id: ack_id,
                    sge: ack_buf.sge(ACK_LEN),
                    op: SendOp::Send,
                    signaled: true,
                    inline: inline_ack,
                    solicited: false,
                })?
            };
            acks_pending += 1;
        }
    }
    conn.close(false, cfg.timeout);
    let first_values = sink.first_values(5).unwrap_or_default();
    let bytes = total.saturating_mul(transfers);
    Ok(RecvReport {
        peer: peer.to_string(),
        op: header.op.name(),
        bytes,
        chunks: n.saturating_mul(transfers),
        seconds,
        gbps: gigabytes_per_second(bytes, seconds),
        path: sink.path(),
        verification,
        verify_error,
        first_values,
        imm: None,
        reply_delivered,
        transfers: header.transfers,
        offered: header.transfers,
        verify_seconds,
        memory: memory_log,
        integrity: Box::new(integrity),
        striped: None,
    })
}

/// The name in the sender's name message (`--name`), if it is one a receiver may use.
fn sender_name(buf: &MessageBuffer, c: &Completion) -> Option<String> {
    if !c.is_ok() {
        return None;
    }
    let bytes = buf.read(c.byte_len as usize);
    let len = decode_name_prefix(&bytes).ok()?;
    let name = bytes.get(NAME_PREFIX_LEN..NAME_PREFIX_LEN + len)?;
    (bytes.len() == NAME_PREFIX_LEN + len)
        .then(|| checked_name(name).ok().map(str::to_string))
        .flatten()
}

/// Which transfer of a connection's several an error concerns.
#[derive(Clone, Copy)]
struct Context {
    k: u64,
    transfers: u64,
}

impl Context {
    /// " in transfer 3 of 1000", or nothing for a connection of one transfer.
    fn words(self) -> String {
        if self.transfers > 1 {
            format!(" in transfer {} of {}", self.k + 1, self.transfers)
        } else {
            String::new()
        }
    }
}

/// The verification of several transfers as one: counts add up, the first mismatch is
/// the first transfer's that has one (its index within that transfer), the CRC is the
/// last transfer's. A transfer that could not be verified makes the whole unverified.
fn merge_verifications(
    k: u64,
    acc: Option<Verification>,
    this: Option<Verification>,
) -> Option<Verification> {
    if k == 0 {
        return this;
    }
    let (acc, this) = (acc?, this?);
    Some(Verification {
        elements: acc.elements + this.elements,
        mismatches: acc.mismatches + this.mismatches,
        first_mismatch: acc.first_mismatch.or(this.first_mismatch),
        crc32: this.crc32,
    })
}

/// Wait until the send completions of all `pending` acks are in (only data-free moments:
/// nothing else can complete then).
fn wait_for_acks(
    conn: &Connection,
    comps: &mut Vec<Completion>,
    timeout: Duration,
    pending: &mut u32,
) -> Result<(), Failure> {
    let deadline = Deadline::after(timeout);
    while *pending > 0 {
        comps.clear();
        match conn.wait(comps, &deadline, "the previous ack to be sent")? {
            Waited::Completions => {}
            Waited::Disconnected => return Ok(()),
        }
        for c in comps.iter() {
            if c.wr_id & !INDEX_MASK == WR_ACK {
                c.check(|| "the SEND of an ack".into())?;
                *pending -= 1;
            }
        }
    }
    Ok(())
}

/// Receive every chunk of one transfer, reposting receives as they are consumed, the
/// timeout restarting on progress. `on_ack` sees the send completions of earlier acks
/// and the receive of the sender's name.
#[allow(clippy::too_many_arguments)]
fn receive_transfer(
    cfg: &RecvConfig,
    conn: &Connection,
    peer: &str,
    header: Header,
    plan: &ChunkPlan,
    recvs: &mut Receives,
    comps: &mut Vec<Completion>,
    context: Context,
    established: Instant,
    on_ack: &mut dyn FnMut(&Completion),
    leftover: &mut Vec<Completion>,
) -> Result<(), Failure> {
    let (k, context_transfers) = (context.k, context.transfers);
    let context = || context.words();
    let total = header.total_bytes;
    let n = plan.count();
    let mut got = 0u64; // chunks known to have landed
    let incomplete = |got: u64, why: String| {
        Failure::Broken(TransferError::Incomplete {
            peer: peer.to_string(),
            got: plan.bytes_through(got),
            total,
            why: format!("{why}{}", context()),
        })
    };
    let mut deadline = Deadline::after(cfg.timeout);
    // The whole transfer's end: progress cannot push it back, and over a reused
    // connection the rate counts since its start (see the module docs).
    let whole = crate::server::whole_deadline(established, cfg.timeout, cfg.min_rate, total, k)
        .map(|at| Deadline::after(at.saturating_duration_since(Instant::now())));
    let mut gone = false;
    while got < n {
        if gone {
            return Err(incomplete(got, "peer disconnected".into()));
        }
        comps.clear();
        match conn.wait(comps, &deadline.earliest(whole), "data") {
            Ok(Waited::Completions) => {}
            Ok(Waited::Disconnected) => {
                // Take what landed before the disconnect, then give up.
                gone = true;
                conn.cq.poll(comps)?;
            }
            Err(RdmaError::Timeout { .. }) if whole.is_some_and(|w| w.expired()) => {
                // Counted over the connection, as the rate is.
                return Err(Failure::TooSlow(TransferError::TooSlow {
                    peer: peer.to_string(),
                    got: k * total + plan.bytes_through(got),
                    total: total * context_transfers,
                    seconds: established.elapsed().as_secs_f64(),
                    min_rate: cfg.min_rate,
                }));
            }
            Err(RdmaError::Timeout { after, .. }) => {
                return Err(incomplete(
                    got,
                    format!("timed out: nothing arrived for {}", format_duration(after)),
                ))
            }
            Err(RdmaError::DeviceFault(fault)) => return Err(incomplete(got, fault)),
            Err(e) => return Err(e.into()),
        }
        for (i, c) in comps.iter().enumerate() {
            if got == n {
                // What follows the data (chunk checksums) is the next step's.
                leftover.extend_from_slice(&comps[i..]);
                break;
            }
            if matches!(tag(c.wr_id), WR_ACK | TAG_NAME) {
                on_ack(c);
                continue;
            }
            if !is_data(c.wr_id) {
                continue;
            }
            if !c.is_ok() {
                if c.is_connection_loss() {
                    return Err(incomplete(
                        got,
                        format!("connection lost: {}", c.status_str()),
                    ));
                }
                c.check(|| format!("the receive of chunk {}", c.wr_id & INDEX_MASK))?;
            }
            match header.op {
                Op::Send => {
                    let index = c.wr_id & INDEX_MASK;
                    let Some(chunk) = plan.get(index).filter(|_| index == got) else {
                        return Err(TransferError::Protocol(format!(
                            "receive {index} completed out of order (expected {got}){}",
                            context()
                        ))
                        .into());
                    };
                    if c.byte_len as u64 != chunk.len {
                        return Err(TransferError::Protocol(format!(
                            "chunk {index} from {peer}: {} bytes arrived, {} expected{}",
                            c.byte_len,
                            chunk.len,
                            context()
                        ))
                        .into());
                    }
                    let last = index + 1 == n;
                    let imm_ok = match c.imm {
                        Some(imm) => last && imm as u64 == n,
                        None => !last,
                    };
                    if !imm_ok {
                        return Err(TransferError::Protocol(format!(
                            "chunk {index} of {n} from {peer} carried immediate data {:?}{}",
                            c.imm,
                            context()
                        ))
                        .into());
                    }
                    got += 1;
                }
                Op::Write => {
                    let imm = match c.imm {
                        Some(imm) if c.is_write_with_imm() => imm as u64,
                        _ => {
                            return Err(TransferError::Protocol(format!(
                                "expected an RDMA WRITE with immediate from {peer}, got a message of {} bytes{}",
                                c.byte_len,
                                context()
                            ))
                            .into())
                        }
                    };
                    if imm <= got || imm > n {
                        return Err(TransferError::Protocol(format!(
                            "immediate {imm} from {peer} does not follow {got} of {n} chunks{}",
                            context()
                        ))
                        .into());
                    }
                    got = imm;
                }
            }
            if !gone {
                recvs.replenish()?;
            }
            deadline = Deadline::after(cfg.timeout);
        }
    }
    Ok(())
}

/// SEND the first `len` bytes of `buf` and wait for the completion. `Ok(false)` if the
/// peer disconnected first (the message may not have arrived).
pub(super) fn send_and_wait<'r>(
    conn: &Connection<'r>,
    buf: &'r MessageBuffer,
    wr_id: u64,
    len: usize,
    inline: bool,
    timeout: Duration,
    what: &str,
) -> Result<bool, Failure> {
    if conn.is_disconnected() {
        return Ok(false);
    }
    // SAFETY: `buf` is registered (lkey in the SGE), outlives the connection's use of
    // it (the caller keeps it until after close), and is not written until completion.
    unsafe {
        conn.qp.post_send(&SendWr {
            wr_id,
            sge: buf.sge(len),
            op: SendOp::Send,
            signaled: true,
            inline,
            solicited: false,
        })?
    };
    let deadline = Deadline::after(timeout);
    let mut comps = Vec::new();
    loop {
        comps.clear();
        let waited = match conn.wait(&mut comps, &deadline, what) {
            Ok(w) => w,
            Err(RdmaError::Timeout { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        if waited == Waited::Disconnected {
            conn.cq.poll(&mut comps)?;
        }
        if let Some(c) = comps.iter().find(|c| c.wr_id == wr_id) {
            return Ok(c.is_ok());
        }
        if waited == Waited::Disconnected {
            return Ok(false);
        }
    }
}

fn raw(
    cfg: &RecvConfig,
    request: &ConnectRequest,
    peer: &str,
    sinks: &SinkFactory,
    accepted: &Cell<bool>,
) -> Result<RecvReport, Failure> {
    if Header::decode(&request.private_data).is_ok() {
        // A framed sender would wait for an accept with a buffer offer we do not make.
        return Err(Failure::Refuse(RejectReason::RawOnly, None));
    }
    let id = &request.id;
    let port = id.port_info().map_err(internal)?;
    // One receive takes the whole message: --max-bytes, or the device's largest message.
    let len = cfg.max_bytes.min(port.max_msg_sz as u64).max(1);
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_inline_data: 0,
    };
    let res = Resources::new(id, Resources::cq_entries(caps), cfg.busy_poll)
        .map_err(|e| setup_failed(peer, e))?;
    let (sink, memory_log) = choose_sink(&res, sinks, len, false)?;
    let sink = sink.as_ref();
    let mr = MemoryRegion::register(&res.pd, sink.memory())
        .map_err(|e| Failure::Refuse(RejectReason::NoMemory { bytes: len }, Some(e.to_string())))?;
    let reply_buf = MessageBuffer::new(&res.pd, RAW_REPLY.len()).map_err(internal)?;
    reply_buf.write(&RAW_REPLY)?;
    let conn = Connection::new(&res, caps).map_err(|e| setup_failed(peer, e))?;
    let sge = mr.sge(0..len as usize).map_err(internal)?;
    // SAFETY: the sink is read (verified) only after the receive completed.
    unsafe { conn.qp.post_recv(TAG_DATA, Some(sge)).map_err(internal)? };
    id.accept(&ConnParams::with_private_data(&[]))?;
    accepted.set(true);
    wait_established(id, peer, cfg.timeout)?;
    let start = Instant::now();

    let deadline = Deadline::after(cfg.timeout);
    let mut comps = Vec::new();
    let message = loop {
        comps.clear();
        let waited = match conn.wait(&mut comps, &deadline, "the message") {
            Ok(w) => w,
            Err(RdmaError::Timeout { after, .. }) => {
                return Err(Failure::Broken(TransferError::Incomplete {
                    peer: peer.to_string(),
                    got: 0,
                    total: len,
                    why: format!("timed out: no message within {}", format_duration(after)),
                }))
            }
            Err(e) => return Err(e.into()),
        };
        if waited == Waited::Disconnected {
            conn.cq.poll(&mut comps)?;
        }
        if let Some(c) = comps.iter().find(|c| is_data(c.wr_id)) {
            break *c;
        }
        if waited == Waited::Disconnected {
            return Err(Failure::Broken(TransferError::Incomplete {
                peer: peer.to_string(),
                got: 0,
                total: len,
                why: "peer disconnected before sending".into(),
            }));
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    message.check(|| {
        format!(
            "the receive of up to {} (a larger message fails here: raise --max-bytes)",
            format_bytes(len)
        )
    })?;
    let bytes = message.byte_len as u64;
    let verify_start = Instant::now();
    let (verification, verify_error) = match sink.verify(bytes as usize) {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let verify_seconds = verify_start.elapsed().as_secs_f64();
    // rdma-core's rdma_client waits for a 16-byte reply before it disconnects.
    let reply_delivered = send_and_wait(
        &conn,
        &reply_buf,
        WR_REPLY,
        RAW_REPLY.len(),
        false,
        cfg.timeout,
        "the reply",
    )?;
    conn.close(false, cfg.timeout);
    Ok(RecvReport {
        peer: peer.to_string(),
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
    })
}
