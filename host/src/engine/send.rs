//! The sender's transfers over an open link, the same over any link: each transfer is a
//! pass of the chunk schedule, the CRC32Cs sent after it where the link's frames carry
//! none, then the conversation with the receiver until its ack: chunks it found
//! corrupt (or, striped, never got) sent again, pieces of them, the CRC32Cs of pieces it
//! asks about; its ack checked against what was asked and sent (a [`Requests`] book),
//! and the digest against this side's. One report per transfer.

use super::cooldown::Cooldowns;
use super::sending::Sending;
use crate::memory::{RegistrationTarget, SendSource};
use crate::memory_path::AttemptLog;
use crate::net::{Item, Pass};
use crate::rdma::Deadline;
use crate::transfer::plan::{Chunk, ChunkPlan};
use crate::transfer::repair::Requests;
use crate::transfer::report::{Framed, Integrity, RailReport, Repaired};
use crate::transfer::schedule::{Schedule, WireError};
use crate::transfer::{PayloadOptions, SendReport, TransferError};
use crate::wire::pieces::{self, PieceResend, PIECES_MAGIC, QUERY_MAGIC};
use crate::wire::{
    Ack, AckStatus, ChunkChecksums, Header, Resend, ACK_MAGIC, REPLY_PREFIX_LEN, RESEND_MAGIC,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of items copied out of the source for one batch sent again, at most.
const RESEND_BATCH_BYTES: u64 = 64 << 20;
/// Rounds of missing-item resends one pass may take, on both ends (a round leaves items
/// missing only when another rail failed during it).
pub const MAX_MISSING_ROUNDS: u32 = 8;

/// One rail as the sender's report names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailName {
    /// Where its traffic starts (a local address, an RDMA device), if named.
    pub local: Option<String>,
    /// The receiver's address on it.
    pub remote: String,
    /// What its cooldown is kept under.
    pub label: String,
}

/// What the transfers on one link report besides what they measure.
pub struct Facts<'a> {
    /// The peer, in errors and reports.
    pub peer: &'a str,
    /// The local device ("rxe0"), where there is one.
    pub device: Option<String>,
    /// The operation's name in reports ("tcp", "send", "write").
    pub op: &'static str,
    pub connect_seconds: f64,
    pub memory: &'a AttemptLog,
    /// Every rail the sender had, in its order, and (for the link's rails, in the
    /// link's order) their places in it; why the others were left out.
    pub rails: &'a [RailName],
    pub connected: &'a [usize],
    pub left_out: &'a [(usize, String)],
    /// Where failed rails rest, and good ones are cleared.
    pub cooldowns: &'a Cooldowns,
}

/// How the transfers go, from the sender's options.
pub struct Shape<'a> {
    pub header: &'a Header,
    pub plan: ChunkPlan,
    pub depth: u32,
    pub timeout: Duration,
    pub progress: bool,
    pub payload: &'a PayloadOptions,
    /// Transfers of the same data on this link (`--reuse-connection`).
    pub transfers: u32,
}

impl<'a> Shape<'a> {
    /// `transfers` transfers offered by `header`, in `plan`'s chunks, as `opts` says.
    pub fn of(
        opts: &'a super::options::SendOptions,
        header: &'a Header,
        plan: ChunkPlan,
        transfers: u32,
    ) -> Shape<'a> {
        Shape {
            header,
            plan,
            depth: opts.depth,
            timeout: opts.timeout,
            progress: opts.progress,
            payload: &opts.payload,
            transfers,
        }
    }
}

/// `shape.transfers` transfers of `source` over `sending`'s link; each verified and
/// acked before the next starts.
pub fn transfers(
    sending: &mut Sending<'_>,
    source: &dyn SendSource,
    shape: &Shape<'_>,
    facts: &Facts<'_>,
) -> Result<Vec<SendReport>, TransferError> {
    let plan = shape.plan;
    let label = facts.peer;
    let checksum = shape.payload.verify.checksum();
    let striped = sending.stripes().striped();
    let mut schedule = Schedule::new(plan, shape.depth, source, shape.timeout);
    schedule.progress = shape.progress;
    let mut reports = Vec::new();
    for k in 0..shape.transfers {
        // Where the data is in GPU memory, the checksum kernel runs there first.
        let precomputed = match checksum {
            true => source
                .chunk_checksums(plan.chunk_bytes() as usize)
                .transpose()
                .map_err(TransferError::Memory)?,
            false => None,
        };
        sending.next_transfer(plan.count(), precomputed, checksum);
        let start = Instant::now();
        let ran = schedule.run(source, sending, label).and_then(|took| {
            sending
                .end_pass()
                .map_err(|e| wire_error(e, label, plan.total()))?;
            Ok(took)
        });
        let seconds = match ran {
            Ok(took) => took.as_secs_f64(),
            // The receiver may have ended it on purpose, and said why.
            Err(e) => return Err(ended_early(sending, label, plan.total()).unwrap_or(e)),
        };
        if checksum && !sending.caps().crc_in_frames {
            let crcs = match sending.checksums().len() as u64 == plan.count() {
                true => sending.checksums().to_vec(),
                false => chunk_crcs(source, &plan, label)?,
            };
            let message = ChunkChecksums {
                first: 0,
                crcs: crcs.clone(),
            };
            sending
                .send_message(&message.encode())
                .map_err(|e| wire_error(e, label, plan.total()))?;
            sending.set_checksums(crcs);
        }
        let (ack, integrity, missing_seconds) = settle(sending, source, shape, label, striped)?;
        ack.check_counts(plan.total())
            .map_err(|e| TransferError::Protocol(format!("{label}: {e}")))?;
        let framed = Framed {
            peer: label,
            device: facts.device.clone(),
            op: facts.op,
            plan: &plan,
            in_flight: schedule.window as u32,
            connect_seconds: facts.connect_seconds,
            path: source.path(),
            memory: facts.memory,
        };
        let mut report = framed.report(k, seconds, start.elapsed().as_secs_f64(), &ack);
        report.integrity = integrity;
        if striped || facts.rails.len() > 1 {
            report.rails = rail_reports(sending, facts, start, missing_seconds);
        }
        reports.push(report);
    }
    Ok(reports)
}

/// After a failed pass: the receiver's reason, if it ended the transfer with a "too
/// slow" ack (`--min-rate`) that came or comes within a moment.
fn ended_early(sending: &mut Sending<'_>, label: &str, total: u64) -> Option<TransferError> {
    sending.look_for_messages(Duration::from_millis(200));
    while let Some((_, bytes)) = sending.take_message() {
        let Ok(ack) = Ack::decode(&bytes) else {
            continue;
        };
        if ack.status == AckStatus::TooSlow {
            return Some(TransferError::Broken {
                peer: label.to_string(),
                done: ack.received_bytes,
                total,
                why: format!(
                    "the receiver ended the transfer: sender too slow ({} had arrived by its --min-rate deadline)",
                    crate::units::format_bytes(ack.received_bytes)
                ),
            });
        }
    }
    None
}

/// The CRC32C of every chunk of `source`, on the CPU: over its host memory where the
/// source is the data in host memory, else over copies.
fn chunk_crcs(
    source: &dyn SendSource,
    plan: &ChunkPlan,
    label: &str,
) -> Result<Vec<u32>, TransferError> {
    let whole = match source.memory().target() {
        RegistrationTarget::Host { ptr, len } if len == source.len() => Some((ptr, len)),
        _ => None,
    };
    if let Some((ptr, len)) = whole {
        // SAFETY: a source's memory is allocated, unmoved and holds its bytes for as
        // long as it is borrowed (Registrable's and SendSource's contracts); between
        // passes nothing writes it, and reads alongside a link's are fine.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
        return Ok(bytes
            .chunks(plan.chunk_bytes() as usize)
            .map(crate::integrity::crc32c)
            .collect());
    }
    let mut copy = vec![0u8; plan.chunk_bytes() as usize];
    plan.iter()
        .map(|c| {
            let bytes = &mut copy[..c.len as usize];
            source
                .copy_out(c.offset as usize, bytes)
                .map_err(|e| TransferError::Broken {
                    peer: label.to_string(),
                    done: plan.total(),
                    total: plan.total(),
                    why: format!("reading chunk {} for its CRC32C: {e:#}", c.index),
                })?;
            Ok(crate::integrity::crc32c(bytes))
        })
        .collect()
}

/// After the data: answer the receiver's messages (chunks whose CRC32C failed, or that
/// never came; pieces; queries of pieces' CRC32Cs) until its ack; check the ack against
/// the requests and the digest against this side's. What was repaired, and what failed,
/// goes into the report; also how long the missing-item rounds took.
fn settle(
    sending: &mut Sending<'_>,
    source: &dyn SendSource,
    shape: &Shape<'_>,
    label: &str,
    striped: bool,
) -> Result<(Ack, Integrity, f64), TransferError> {
    let plan = shape.plan;
    let opts = shape.payload;
    let checksum = opts.verify.checksum();
    let protocol = |what: String| TransferError::Protocol(format!("{label}: {what}"));
    // A rail that died after its last item was sent, before its end of pass arrived,
    // keeps the receiver waiting up to --timeout on it before it replies.
    let wait = match striped {
        true => shape.timeout * 2,
        false => shape.timeout,
    };
    let mut requests = Requests::new(opts.max_resends, plan.count());
    if checksum && shape.header.pieces {
        requests = requests.converging(plan.total(), plan.chunk_bytes());
    }
    let mut missing_rounds = 0u32;
    let mut missing_since: Option<Instant> = None;
    let mut missing_seconds = 0.0;
    let ack = loop {
        let deadline = Deadline::after(wait);
        let message = sending
            .next_message(&deadline)
            .map_err(|e| wire_error(e, label, plan.total()))?;
        let Some((_, bytes)) = message else {
            return Err(TransferError::Protocol(format!(
                "no verification result from {label}: no answer within {} (--timeout)",
                crate::rdma::format_duration(wait)
            )));
        };
        if bytes.len() < 4 {
            return Err(protocol(
                "a message too short to be a reply after the data".into(),
            ));
        }
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        let missing_reply = magic == RESEND_MAGIC
            && Resend::decode_head(&bytes, plan.count()).is_ok_and(|(_, f, _)| f.1);
        if let (Some(t), false) = (missing_since, missing_reply) {
            missing_seconds = t.elapsed().as_secs_f64();
            missing_since = None;
        }
        match magic {
            ACK_MAGIC => {
                break Ack::decode(&bytes).map_err(|e| {
                    TransferError::Protocol(format!("the receiver's ack is invalid: {e}"))
                })?;
            }
            RESEND_MAGIC if checksum || striped => {
                let resend = decode_resend(&bytes, plan.count())
                    .map_err(|e| protocol(format!("invalid resend request: {e}")))?;
                if resend.missing {
                    // Items sent into a rail that failed and never arrived: sent again on
                    // the rails left, as first sendings (for the fault injector).
                    missing_since.get_or_insert_with(Instant::now);
                    missing_rounds += 1;
                    if !striped || missing_rounds > MAX_MISSING_ROUNDS {
                        return Err(protocol(format!(
                            "missing-chunk round {missing_rounds} (at most {MAX_MISSING_ROUNDS}, striped transfers only)"
                        )));
                    }
                    let spans = chunk_spans(&plan, &resend.chunks)?;
                    send_again(sending, source, &plan, spans, 0, shape.timeout, label)?;
                    continue;
                }
                if !checksum {
                    return Err(protocol(
                        "a resend of corrupt chunks, though this sender sent no checksums".into(),
                    ));
                }
                let chunks = requests.take(&resend).map_err(protocol)?;
                if chunks.is_empty() {
                    continue; // a final list, naming chunks that still fail: the ack is next
                }
                let spans = chunk_spans(&plan, &chunks)?;
                send_again(
                    sending,
                    source,
                    &plan,
                    spans,
                    resend.round,
                    shape.timeout,
                    label,
                )?;
            }
            QUERY_MAGIC if checksum => {
                let query = decode_pieces(&bytes, QUERY_MAGIC, &plan)
                    .map_err(|e| protocol(format!("invalid query of pieces: {e}")))?;
                let asked = requests.take_query(&query).map_err(protocol)?;
                let crcs = piece_crcs(source, &plan, query.shift, &asked, label)?;
                sending
                    .send_message(&pieces::encode_crcs(query.round, &crcs))
                    .map_err(|e| wire_error(e, label, plan.total()))?;
            }
            PIECES_MAGIC if checksum => {
                let request = decode_pieces(&bytes, PIECES_MAGIC, &plan)
                    .map_err(|e| protocol(format!("invalid request for pieces: {e}")))?;
                let asked = requests.take_pieces(&request).map_err(protocol)?;
                let spans = asked
                    .iter()
                    .map(|&k| {
                        let (offset, len) = pieces::span(k, request.shift, plan.total());
                        Chunk {
                            index: k as u64,
                            offset,
                            len,
                        }
                    })
                    .collect();
                send_again(
                    sending,
                    source,
                    &plan,
                    spans,
                    request.round,
                    shape.timeout,
                    label,
                )?;
            }
            _ => {
                return Err(protocol(
                    "its reply after the data is neither an ack nor a resend request".into(),
                ))
            }
        }
    };
    let digest = checksum
        .then(|| crate::integrity::digest(sending.checksums(), plan.chunk_bytes(), plan.total()));
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

/// A whole `Resend` message.
fn decode_resend(bytes: &[u8], chunks: u64) -> Result<Resend, crate::wire::WireError> {
    let (round, (last, missing), count) = Resend::decode_head(bytes, chunks)?;
    let body = &bytes[REPLY_PREFIX_LEN.min(bytes.len())..];
    let mut resend = Resend::decode_chunks(round, last, count, body, chunks)?;
    resend.missing = missing;
    Ok(resend)
}

/// A whole piece request or query (`magic`).
fn decode_pieces(
    bytes: &[u8],
    magic: [u8; 4],
    plan: &ChunkPlan,
) -> Result<PieceResend, crate::wire::WireError> {
    let (round, shift, count) =
        PieceResend::decode_head_as(bytes, magic, plan.total(), plan.chunk_bytes())?;
    let body = &bytes[REPLY_PREFIX_LEN.min(bytes.len())..];
    PieceResend::decode_pieces(round, shift, count, body, plan.total())
}

/// The spans of `chunks` of `plan`.
fn chunk_spans(plan: &ChunkPlan, chunks: &[u32]) -> Result<Vec<Chunk>, TransferError> {
    chunks
        .iter()
        .map(|&c| {
            plan.get(c as u64).ok_or_else(|| {
                TransferError::Protocol(format!("chunk {c} is outside the transfer"))
            })
        })
        .collect()
}

/// Send `spans` (chunks, or pieces: a [`Chunk`] whose index counts its unit) again as
/// round `round`: copied out of `source` in batches of at most [`RESEND_BATCH_BYTES`],
/// each batch sent and done before the next, then the end of the pass.
fn send_again(
    sending: &mut Sending<'_>,
    source: &dyn SendSource,
    plan: &ChunkPlan,
    spans: Vec<Chunk>,
    round: u32,
    timeout: Duration,
    label: &str,
) -> Result<(), TransferError> {
    let broken = |why: String| TransferError::Broken {
        peer: label.to_string(),
        done: plan.total(),
        total: plan.total(),
        why: format!("sending chunks again: {why}"),
    };
    let pass = Pass::fresh();
    let count = spans.len();
    let mut batch = Vec::new();
    let mut bytes = 0u64;
    for (k, span) in spans.into_iter().enumerate() {
        let mut copy = vec![0u8; span.len as usize];
        source
            .copy_out(span.offset as usize, &mut copy)
            .map_err(|e| broken(format!("{e:#}")))?;
        bytes += span.len;
        let item = Item {
            pass,
            index: span.index,
            offset: span.offset,
            bytes: 0..0,
            crc: None,
            signaled: true,
            attempt: round,
        };
        batch.push((item, Arc::<[u8]>::from(copy)));
        if bytes >= RESEND_BATCH_BYTES || k + 1 == count {
            sending
                .send_copies(std::mem::take(&mut batch), timeout)
                .map_err(|e| match e {
                    WireError::Broken(why) => broken(why),
                    WireError::Other(e) => e,
                })?;
            bytes = 0;
        }
    }
    sending
        .end_pass()
        .map_err(|e| wire_error(e, label, plan.total()))
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

/// A link's failure after the data's pass (its end, the conversation) as the
/// transfer's: every byte had been sent by then.
pub fn wire_error(e: WireError, label: &str, total: u64) -> TransferError {
    match e {
        WireError::Broken(why) => TransferError::Broken {
            peer: label.to_string(),
            done: total,
            total,
            why,
        },
        WireError::Other(e) => e,
    }
}

/// What each rail carried in this transfer, and the cooldowns: a rail that failed
/// rests, one that carried the transfer to its end is cleared.
fn rail_reports(
    sending: &Sending<'_>,
    facts: &Facts<'_>,
    start: Instant,
    missing_seconds: f64,
) -> Vec<RailReport> {
    let stripes = sending.stripes();
    let mut out: Vec<RailReport> = facts
        .rails
        .iter()
        .enumerate()
        .map(|(k, rail)| {
            let why = facts.left_out.iter().find(|(i, _)| *i == k);
            RailReport::idle(
                k,
                rail.local.clone(),
                rail.remote.clone(),
                why.map(|(_, why)| why.clone()),
            )
        })
        .collect();
    for (r, &k) in facts.connected.iter().enumerate() {
        let Some(report) = out.get_mut(k) else {
            continue;
        };
        let carried = stripes.carried(r);
        report.bytes = carried.bytes;
        report.chunks = carried.items;
        report.resends = carried.resends;
        let label = &facts.rails[k].label;
        match sending.failures().iter().find(|f| f.rail == r) {
            Some(f) => {
                report.failures = 1;
                report.failed = Some(f.why.clone());
                report.failed_after_seconds =
                    Some(f.at.saturating_duration_since(start).as_secs_f64());
                report.moved_chunks = f.moved;
                let stall = carried
                    .stall
                    .or(f.resumed)
                    .unwrap_or_default()
                    .as_secs_f64();
                report.stall_beyond_detection_seconds = Some(stall + missing_seconds);
                facts.cooldowns.failed(label, f.at);
            }
            None if stripes.failed_before(r) => {
                report.left_out = Some("failed earlier on this connection".into());
            }
            None => facts.cooldowns.worked(label),
        }
    }
    out
}
