//! The TCP sender: open the connection (`opening`: the offer on stream 0, the other
//! streams, over one rail or several), run the shared chunk schedule over a [`TcpWire`],
//! answer the receiver's resend requests (corrupt or, striped, missing chunks) and read
//! its ack after each transfer; what each rail carried, for the report.

use super::config::TcpSendConfig;
use super::frames::{MAX_MISSING_ROUNDS, MAX_STREAMS};
use super::rails::{Cooldowns, Rail};
use super::socket::{self, read_array};
use super::wire::{TcpWire, WireChecks, WireRails};
use crate::memory::select::{walk, AttemptLog, LeftOut, Method, Plan};
use crate::memory::{SendMemory, SendSource};
use crate::transfer::plan::{Chunk, ChunkPlan};
use crate::transfer::repair::Requests;
use crate::transfer::report::{Framed, Integrity, RailReport, Repaired};
use crate::transfer::schedule::{Schedule, WireError};
use crate::transfer::{SendReport, TransferError};
use crate::wire::pieces::{self, PieceResend, PIECES_MAGIC, QUERY_MAGIC};
use crate::wire::{
    encode_name, Ack, AckStatus, Header, Op, Resend, ACK_LEN, ACK_MAGIC, REPLY_PREFIX_LEN,
    RESEND_MAGIC,
};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes of chunks copied out of the source for one batch of resends at most.
const RESEND_BATCH_BYTES: u64 = 64 << 20;

/// The sender's memory plan over TCP: no NIC reads the memory, so GPUDirect methods
/// (which exist to let a NIC read GPU memory) are left out with that reason; what stays
/// is staged, mapped or host memory, tried in the plan's order.
pub fn tcp_plan(plan: &Plan) -> Plan {
    let mut out = plan.clone();
    for method in plan.attempts.iter().filter(|m| m.is_gpudirect()) {
        out.left_out.push(LeftOut {
            method: *method,
            why: "over TCP no NIC reads the memory; GPU memory goes through the staged ring".into(),
        });
    }
    out.attempts.retain(|m| !m.is_gpudirect());
    out
}

/// Make the first source of the plan that can be made (no registration to try over
/// TCP: a method fails only if its memory cannot be allocated or generated).
pub fn choose_source(
    memory: &mut SendMemory,
) -> Result<(&dyn SendSource, AttemptLog), TransferError> {
    let plan = memory.plan().clone();
    let walked = walk(&plan, |method: Method| {
        memory
            .source(method)
            .map(drop)
            .map_err(|e| format!("{e:#}"))
    })
    .map_err(|e| TransferError::Memory(e.into()))?;
    memory.settle(walked.method);
    let source = memory
        .source(walked.method)
        .map_err(TransferError::Memory)?;
    Ok((source, walked.log))
}

/// `transfers` transfers of `source` on one TCP connection (`--reuse-connection`; 1 is a
/// plain transfer). As on verbs, each is verified and acked before the next starts, and
/// only the first report carries the connection setup time.
pub fn send_repeated(
    cfg: &TcpSendConfig,
    source: &dyn SendSource,
    memory_log: &AttemptLog,
    transfers: u32,
) -> Result<Vec<SendReport>, TransferError> {
    let t0 = Instant::now();
    let label = cfg.peer.to_string();
    let total = cfg.bytes;
    if !(1..=MAX_STREAMS).contains(&cfg.streams) {
        return Err(TransferError::Protocol(format!(
            "--streams {} is outside 1..={MAX_STREAMS}",
            cfg.streams
        )));
    }
    let plan = ChunkPlan::new(total, cfg.chunk).map_err(TransferError::Protocol)?;
    let opts = &cfg.payload;
    let cannot = |e: crate::wire::WireError| {
        TransferError::Protocol(format!("cannot offer this transfer: {e}"))
    };
    let mut header = Header::of(Op::Send, total, plan.chunk_bytes(), cfg.depth, opts.payload)
        .and_then(|h| h.with_transfers(transfers))
        .and_then(|h| h.with_payload(opts.payload, opts.verify, opts.max_resends))
        .map_err(cannot)?;
    if opts.verify.checksum() {
        // This sender answers piece requests (`settle`): a failed chunk comes again in
        // pieces, each with its own CRC32C, so repair converges on a lossy path.
        header = header.with_pieces();
    }
    let name_message = match &opts.name {
        Some(name) => {
            header = header.with_name();
            encode_name(name).map_err(cannot)?
        }
        None => Vec::new(),
    };
    let all_rails = match cfg.rails.is_empty() {
        true => vec![Rail {
            local: None,
            remote: cfg.peer,
        }],
        false => cfg.rails.clone(),
    };
    let striped = all_rails.len() > 1;
    if all_rails.len() * cfg.streams as usize > MAX_STREAMS as usize {
        return Err(TransferError::Protocol(format!(
            "{} rails of {} streams: at most {MAX_STREAMS} streams in all",
            all_rails.len(),
            cfg.streams
        )));
    }
    if striped {
        header = header.with_striped();
    }
    let opened = match striped {
        true => super::opening::open_striped(cfg, &all_rails, &header, &name_message, &label)?,
        false => {
            let rail = &all_rails[0];
            super::opening::open_single(cfg, rail, &header, &name_message, &label)?
        }
    };
    let super::opening::Opened {
        mut control,
        streams,
        rails: connected,
        left_out,
    } = opened;
    let connect_seconds = t0.elapsed().as_secs_f64();

    let mut schedule = Schedule::new(plan, cfg.depth, source, cfg.timeout);
    schedule.progress = cfg.progress;
    let checks = WireChecks {
        checksum: opts.verify.checksum(),
        faults: opts.faults,
        silent_rail: cfg.test_silent_rail,
    };
    let n = cfg.streams as usize;
    let wire_rails = WireRails {
        rails: (0..connected.len())
            .map(|r| (r * n..(r + 1) * n).collect())
            .collect(),
        rail_timeout: striped.then_some(cfg.rail_timeout),
    };
    let cooldowns = Cooldowns::global();
    TcpWire::scope(
        source.memory(),
        &streams,
        wire_rails,
        cfg.timeout,
        checks,
        |wire| {
            let mut reports = Vec::new();
            for k in 0..transfers {
                // Where the data is in GPU memory, the checksum kernel runs there first.
                let precomputed = match checks.checksum {
                    true => source
                        .chunk_checksums(plan.chunk_bytes() as usize)
                        .transpose()
                        .map_err(TransferError::Memory)?,
                    false => None,
                };
                wire.next_transfer(plan.count(), precomputed);
                let start = Instant::now();
                let ran = schedule.run(source, wire, &label).and_then(|took| {
                    wire.end_pass().map_err(|e| wire_error(e, &label, total))?;
                    Ok(took)
                });
                let seconds = match ran {
                    Ok(took) => took.as_secs_f64(),
                    // The receiver may have ended it on purpose, and said why.
                    Err(e) => return Err(ended_early(&mut control, &label, total).unwrap_or(e)),
                };
                if striped {
                    // A rail that died after its last chunk was written, before its end
                    // marker arrived, keeps the receiver waiting up to --timeout on its
                    // streams before it replies: the reply may take that much longer.
                    let _ = control.set_read_timeout(Some(cfg.timeout * 2));
                }
                let settled = settle(&mut control, wire, source, &plan, cfg, &label);
                let _ = control.set_read_timeout(Some(cfg.timeout));
                let (ack, integrity, missing_seconds) = settled?;
                let rails = striped.then(|| {
                    let args = (&all_rails[..], &connected[..], &left_out[..]);
                    rail_reports(
                        wire,
                        missing_seconds,
                        args.0,
                        args.1,
                        args.2,
                        start,
                        cooldowns,
                    )
                });
                ack.check_counts(total)
                    .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
                let round_trip_seconds = start.elapsed().as_secs_f64();
                let framed = Framed {
                    peer: &label,
                    device: None,
                    op: "tcp",
                    plan: &plan,
                    in_flight: schedule.window as u32,
                    connect_seconds,
                    path: source.path(),
                    memory: memory_log,
                };
                let mut report = framed.report(k, seconds, round_trip_seconds, &ack);
                report.integrity = integrity;
                report.rails = rails.unwrap_or_default();
                reports.push(report);
            }
            Ok(reports)
        },
    )
    .map_err(TransferError::Memory)?
}

/// After a failed write: the receiver's reason, if it ended the transfer with a "too
/// slow" ack (`--min-rate`) that is waiting on the control socket (looked for briefly).
fn ended_early(control: &mut TcpStream, label: &str, total: u64) -> Option<TransferError> {
    control
        .set_read_timeout(Some(Duration::from_millis(200)))
        .ok()?;
    let bytes: [u8; ACK_LEN] = read_array(control).ok()?;
    let ack = Ack::decode(&bytes).ok()?;
    (ack.status == AckStatus::TooSlow).then(|| TransferError::Broken {
        peer: label.to_string(),
        done: ack.received_bytes,
        total,
        why: format!(
            "the receiver ended the transfer: sender too slow ({} had arrived by its --min-rate deadline)",
            crate::transfer::units::format_bytes(ack.received_bytes)
        ),
    })
}

/// After the data: answer the receiver's resend requests (chunks whose CRC32C failed
/// where they landed, sent again from the source) until its ack; check the ack's digest
/// against this side's. What was repaired, and what failed, goes into the report.
fn settle(
    control: &mut TcpStream,
    wire: &mut TcpWire<'_>,
    source: &dyn SendSource,
    plan: &ChunkPlan,
    cfg: &TcpSendConfig,
    label: &str,
) -> Result<(Ack, Integrity, f64), TransferError> {
    let opts = &cfg.payload;
    let protocol = |what: String| TransferError::Protocol(format!("{label}: {what}"));
    let waiting = |e: io::Error| {
        TransferError::Protocol(format!(
            "no verification result from {label}: {}",
            socket::why(&e, cfg.timeout, "waiting for it")
        ))
    };
    // The receiver's requests, each checked against the ones before (and in the end its
    // ack against them all): the rules verbs senders keep too.
    let mut requests =
        Requests::new(opts.max_resends, plan.count()).converging(plan.total(), plan.chunk_bytes());
    let mut missing_rounds = 0u32;
    // From the first missing-chunk request to the reply after the last one.
    let mut missing_since: Option<Instant> = None;
    let mut missing_seconds = 0.0;
    let ack = loop {
        let prefix: [u8; REPLY_PREFIX_LEN] = read_array(control).map_err(waiting)?;
        let missing_reply = Resend::decode_head(&prefix, plan.count()).is_ok_and(|(_, f, _)| f.1);
        if let (Some(t), false) = (missing_since, missing_reply) {
            missing_seconds = t.elapsed().as_secs_f64();
            missing_since = None;
        }
        match [prefix[0], prefix[1], prefix[2], prefix[3]] {
            ACK_MAGIC => {
                let mut bytes = [0u8; ACK_LEN];
                bytes[..REPLY_PREFIX_LEN].copy_from_slice(&prefix);
                control
                    .read_exact(&mut bytes[REPLY_PREFIX_LEN..])
                    .map_err(waiting)?;
                break Ack::decode(&bytes).map_err(|e| {
                    TransferError::Protocol(format!("the receiver's ack is invalid: {e}"))
                })?;
            }
            RESEND_MAGIC if opts.verify.checksum() || wire.dispatch().striped() => {
                let invalid =
                    |e: crate::wire::WireError| protocol(format!("invalid resend request: {e}"));
                let (round, (last, missing), count) =
                    Resend::decode_head(&prefix, plan.count()).map_err(invalid)?;
                let mut body = vec![0u8; count as usize * 4];
                control.read_exact(&mut body).map_err(waiting)?;
                let resend = Resend::decode_chunks(round, last, count, &body, plan.count())
                    .map_err(invalid)?;
                if missing {
                    // Chunks written into a rail that failed, never arrived: sent again
                    // on the rails left (as first sendings, for the fault injector).
                    missing_since.get_or_insert_with(Instant::now);
                    missing_rounds += 1;
                    if !wire.dispatch().striped() || missing_rounds > MAX_MISSING_ROUNDS {
                        return Err(protocol(format!(
                            "missing-chunk round {missing_rounds} (at most {MAX_MISSING_ROUNDS}, striped transfers only)"
                        )));
                    }
                    send_again(wire, source, plan, &resend.chunks, 0, cfg.timeout, label)?;
                    wire.end_pass()
                        .map_err(|e| wire_error(e, label, plan.total()))?;
                    continue;
                }
                if !opts.verify.checksum() {
                    return Err(protocol(
                        "a resend of corrupt chunks, though this sender sent no checksums".into(),
                    ));
                }
                let chunks = requests.take(&resend).map_err(protocol)?;
                if chunks.is_empty() {
                    continue; // a final list, naming chunks that still fail: the ack is next
                }
                send_again(wire, source, plan, &chunks, round, cfg.timeout, label)?;
                wire.end_pass()
                    .map_err(|e| wire_error(e, label, plan.total()))?;
            }
            QUERY_MAGIC if opts.verify.checksum() => {
                let invalid =
                    |e: crate::wire::WireError| protocol(format!("invalid query of pieces: {e}"));
                let (round, shift, count) = PieceResend::decode_head_as(
                    &prefix,
                    QUERY_MAGIC,
                    plan.total(),
                    plan.chunk_bytes(),
                )
                .map_err(invalid)?;
                let mut body = vec![0u8; count as usize * 4];
                control.read_exact(&mut body).map_err(waiting)?;
                let query = PieceResend::decode_pieces(round, shift, count, &body, plan.total())
                    .map_err(invalid)?;
                let asked = requests.take_query(&query).map_err(protocol)?;
                let crcs = piece_crcs(source, plan, shift, &asked, label)?;
                control
                    .write_all(&pieces::encode_crcs(round, &crcs))
                    .map_err(|e| {
                        protocol(socket::why(&e, cfg.timeout, "answering a query of pieces"))
                    })?;
            }
            PIECES_MAGIC if opts.verify.checksum() => {
                let invalid = |e: crate::wire::WireError| {
                    protocol(format!("invalid request for pieces: {e}"))
                };
                let (round, shift, count) =
                    PieceResend::decode_head(&prefix, plan.total(), plan.chunk_bytes())
                        .map_err(invalid)?;
                let mut body = vec![0u8; count as usize * 4];
                control.read_exact(&mut body).map_err(waiting)?;
                let request = PieceResend::decode_pieces(round, shift, count, &body, plan.total())
                    .map_err(invalid)?;
                let asked = requests.take_pieces(&request).map_err(protocol)?;
                send_pieces(wire, source, plan, shift, &asked, round, cfg.timeout, label)?;
                wire.end_pass()
                    .map_err(|e| wire_error(e, label, plan.total()))?;
            }
            _ => {
                return Err(protocol(
                    "its reply after the data is neither an ack nor a resend request".into(),
                ))
            }
        }
    };
    let checksum = opts.verify.checksum();
    let digest = checksum
        .then(|| crate::integrity::digest(wire.checksums(), plan.chunk_bytes(), plan.total()));
    // An ack that does not fit the requests before it (verified after a final list of
    // chunks that still fail, say) is not believed.
    requests.check_ack(&ack, digest).map_err(protocol)?;
    if ack.status == AckStatus::ChecksumFailed {
        return Err(TransferError::ChecksumFailed {
            peer: label.to_string(),
            chunks: requests.given_up().to_vec(),
            rounds: requests.rounds(),
            bound: requests.bound(),
        });
    }
    let integrity = Integrity {
        verify: Some(opts.verify),
        payload: Some(opts.payload),
        digest,
        chunks_checked: if checksum {
            plan.count() + requests.repaired().map(|(_, a)| a as u64 - 1).sum::<u64>()
        } else {
            0
        },
        repaired: requests
            .repaired()
            .map(|(chunk, attempts)| Repaired { chunk, attempts })
            .collect(),
        failed_chunks: Vec::new(),
        name: opts.name.clone(),
        stored: None,
        store_error: None,
        fault_injection: opts.faults.map(|f| format!("1/{}", f.one_in)),
    };
    Ok((ack, integrity, missing_seconds))
}

/// Send `chunks` again from `source`, in batches of copies of at most
/// [`RESEND_BATCH_BYTES`].
fn send_again(
    wire: &mut TcpWire<'_>,
    source: &dyn SendSource,
    plan: &ChunkPlan,
    chunks: &[u32],
    round: u32,
    timeout: Duration,
    label: &str,
) -> Result<(), TransferError> {
    let spans = chunks.iter().map(|&c| {
        plan.get(c as u64)
            .ok_or_else(|| format!("chunk {c} is outside the transfer"))
    });
    let again = Again {
        what: "chunks",
        pieces: false,
        round,
        timeout,
    };
    resend_spans(wire, source, plan, spans, again, label)
}

/// Send pieces `asked` of `1 << shift` bytes again from `source`, each in a frame with
/// its own CRC32C (computed on the CPU over the bytes copied out for it: for a GPU
/// source, the staged bytes), in batches of copies of at most [`RESEND_BATCH_BYTES`].
#[allow(clippy::too_many_arguments)]
fn send_pieces(
    wire: &mut TcpWire<'_>,
    source: &dyn SendSource,
    plan: &ChunkPlan,
    shift: u8,
    asked: &[u32],
    round: u32,
    timeout: Duration,
    label: &str,
) -> Result<(), TransferError> {
    let spans = asked.iter().map(|&piece| {
        let (offset, len) = pieces::span(piece, shift, plan.total());
        // A piece travels as a chunk whose index counts pieces.
        Ok(Chunk {
            index: piece as u64,
            offset,
            len,
        })
    });
    let again = Again {
        what: "pieces",
        pieces: true,
        round,
        timeout,
    };
    resend_spans(wire, source, plan, spans, again, label)
}

/// How a batch of spans goes again: as whole chunks (their CRC32C is the offer's) or
/// as pieces (each frame with its own), in which round, within which timeout.
struct Again {
    what: &'static str,
    pieces: bool,
    round: u32,
    timeout: Duration,
}

/// Copy each span out of `source` and hand them to the wire in batches of at most
/// [`RESEND_BATCH_BYTES`]: what chunks and pieces sent again have in common.
fn resend_spans(
    wire: &mut TcpWire<'_>,
    source: &dyn SendSource,
    plan: &ChunkPlan,
    spans: impl ExactSizeIterator<Item = Result<Chunk, String>>,
    again: Again,
    label: &str,
) -> Result<(), TransferError> {
    let broken = |why: String| TransferError::Broken {
        peer: label.to_string(),
        done: plan.total(),
        total: plan.total(),
        why: format!("sending {} again: {why}", again.what),
    };
    let count = spans.len();
    let mut batch = Vec::new();
    let mut bytes = 0u64;
    for (k, span) in spans.enumerate() {
        let span = span.map_err(broken)?;
        let mut copy = vec![0u8; span.len as usize];
        source
            .copy_out(span.offset as usize, &mut copy)
            .map_err(|e| broken(format!("{e:#}")))?;
        bytes += span.len;
        batch.push((span, copy));
        if bytes >= RESEND_BATCH_BYTES || k + 1 == count {
            let batch = std::mem::take(&mut batch);
            let sent = match again.pieces {
                true => wire.resend_pieces(batch, again.round, again.timeout),
                false => wire.resend(batch, again.round, again.timeout),
            };
            sent.map_err(|e| match e {
                WireError::Broken(why) => broken(why),
                WireError::Other(e) => e,
            })?;
            bytes = 0;
        }
    }
    Ok(())
}

/// This sender's CRC32C of each of pieces `asked` of `1 << shift` bytes, over the bytes
/// copied out of `source` (for a GPU source, the staged bytes), for a query.
fn piece_crcs(
    source: &dyn SendSource,
    plan: &ChunkPlan,
    shift: u8,
    asked: &[u32],
    label: &str,
) -> Result<Vec<u32>, TransferError> {
    let mut copy = vec![0u8; 1 << shift];
    asked
        .iter()
        .map(|&piece| {
            let (offset, len) = pieces::span(piece, shift, plan.total());
            let bytes = &mut copy[..len as usize];
            source
                .copy_out(offset as usize, bytes)
                .map_err(|e| TransferError::Broken {
                    peer: label.to_string(),
                    done: plan.total(),
                    total: plan.total(),
                    why: format!("reading pieces for their CRC32C: {e:#}"),
                })?;
            Ok(crate::integrity::crc32c(bytes))
        })
        .collect()
}

/// A wire error as the transfer's.
fn wire_error(e: WireError, label: &str, total: u64) -> TransferError {
    match e {
        WireError::Broken(why) => TransferError::Broken {
            peer: label.to_string(),
            done: 0,
            total,
            why,
        },
        WireError::Other(e) => e,
    }
}

/// What each rail of a striped transfer carried, and the cooldown bookkeeping: a rail
/// that failed rests, one that carried the transfer to its end is cleared.
#[allow(clippy::too_many_arguments)]
fn rail_reports(
    wire: &TcpWire<'_>,
    missing_seconds: f64,
    all: &[Rail],
    connected: &[usize],
    left_out: &[(usize, String)],
    start: Instant,
    cooldowns: &Cooldowns,
) -> Vec<RailReport> {
    let dispatch = wire.dispatch();
    let mut out: Vec<RailReport> = all
        .iter()
        .enumerate()
        .map(|(k, rail)| {
            let why = left_out.iter().find(|(i, _)| *i == k);
            RailReport::idle(
                k,
                rail.local.map(|ip| ip.to_string()),
                rail.remote.to_string(),
                why.map(|(_, why)| why.clone()),
            )
        })
        .collect();
    for (r, &k) in connected.iter().enumerate() {
        let carried = dispatch.carried(r);
        let report = &mut out[k];
        report.bytes = carried.bytes;
        report.chunks = carried.chunks;
        report.resends = carried.resends;
        match wire.failures().iter().find(|f| f.rail == r) {
            Some(f) => {
                report.failures = 1;
                report.failed = Some(f.why.clone());
                report.failed_after_seconds =
                    Some(f.at.saturating_duration_since(start).as_secs_f64());
                report.moved_chunks = f.moved;
                let resumed = f.resumed.unwrap_or_default().as_secs_f64();
                report.stall_beyond_detection_seconds = Some(resumed + missing_seconds);
                cooldowns.failed(&all[k].label(), f.at);
            }
            None if dispatch.failure(r).is_none() => cooldowns.worked(&all[k].label()),
            // Failed in an earlier transfer of this connection: reported there.
            None => report.left_out = Some("failed earlier on this connection".into()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_plans_leave_gpudirect_out_with_the_reason() {
        let plan = Plan {
            attempts: vec![
                Method::DmaBuf,
                Method::PeerMem,
                Method::Staged,
                Method::Mapped,
            ],
            left_out: Vec::new(),
        };
        let tcp = tcp_plan(&plan);
        assert_eq!(tcp.attempts, [Method::Staged, Method::Mapped]);
        assert_eq!(tcp.left_out.len(), 2);
        assert!(tcp.left_out[0].why.contains("no NIC"));
    }
}
