//! The receiver's transfers on one open link, the same over any link: each transfer is
//! a pass of the chunks (and, striped, rounds asking for the chunks that never came),
//! the checks (every chunk's CRC32C where it landed against the sender's: from the frames
//! where the link carries them, else from the sender's message after the data), rounds
//! of repair that converge ([`Converge`]: a failed chunk again in pieces, each checked
//! against the sender's CRC32C of it), the pattern, the ack, the output. The last ack is
//! handed back unsent ([`Received::last_ack`]): the caller sends it once the buffer and
//! its admission are given back, so a sender that offers its next transfer the moment it
//! hears the result finds the memory free.

use super::checked_out::CheckedOut;
use super::landed::Landed;
use super::receiving::{PassItems, Receiving, Stop};
use crate::memory::Verification;
use crate::memory_path::AttemptLog;
use crate::net::{Unit, Which};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::repair::{Converge, Step};
use crate::transfer::report::{Integrity, Repaired, StripedRecv};
use crate::transfer::store::Output;
use crate::transfer::{gigabytes_per_second, RecvReport, TransferError};
use crate::wire::pieces::{self, CRCS_MAGIC, PIECES_MAGIC, QUERY_MAGIC};
use crate::wire::{
    checked_name, decode_name_prefix, Ack, AckStatus, ChunkChecksums, Header, Payload, Resend,
    CHECKSUMS_MAGIC, CHECKSUMS_PREFIX_LEN, NAME_MAGIC, NAME_PREFIX_LEN, REPLY_PREFIX_LEN,
};
use std::time::{Duration, Instant};

/// Rounds of missing-item resends one pass may take (as the sender allows).
const MAX_MISSING_ROUNDS: u32 = super::send::MAX_MISSING_ROUNDS;

/// What the receive loop knows of the connection besides its link and memory.
pub struct Terms<'a> {
    /// The peer, in errors and reports.
    pub peer: &'a str,
    pub header: Header,
    /// The sender's name for the data, where it came with the offer (else, if the offer
    /// says one follows, it is the sender's first message).
    pub name: Option<String>,
    pub timeout: Duration,
    /// `--min-rate` (0: none), counted from `accepted_at` over the connection.
    pub min_rate: u64,
    pub accepted_at: Instant,
    pub output: Option<&'a Output>,
    /// The operation's name in reports ("tcp", "send", "write").
    pub op: &'static str,
    pub memory: AttemptLog,
    /// The sender's address on each rail, where known (reports).
    pub rails_from: Vec<Option<String>>,
}

/// What the receive loop ends with.
pub struct Received {
    /// The report, as it stands before the last ack is sent (the caller sets
    /// `reply_delivered`).
    pub report: RecvReport,
    /// The last transfer's ack, to send once the memory is given back; `None` when the
    /// connection failed (`error` says why).
    pub last_ack: Option<Ack>,
    pub error: Option<TransferError>,
    /// The last transfer's chunks' CRC32Cs as they passed (empty without checksums, or
    /// where a chunk failed), and its chunk size: for a check of the memory again once
    /// the peer can no longer write it ([`crate::net::Caps::peer_writes_in_place`]).
    pub passed: (Vec<u32>, u64),
}

/// What the repair rounds of one transfer did.
#[derive(Default)]
struct Repairs {
    /// Chunks that failed and then passed: (chunk, times sent in all), by chunk.
    repaired: Vec<(u32, u32)>,
    /// Chunks asked for again, all rounds together.
    resent: u64,
    /// Chunks that still failed when the rounds ended.
    failed: Vec<u32>,
    /// Every chunk's CRC32C as it passed, where all did (else, and without checksums,
    /// empty): what is handed on must still have them where the peer may write the
    /// buffer after its check ([`crate::net::Caps::peer_writes_in_place`]).
    passed: Vec<u32>,
}

/// Every transfer the offer announced: receive, check, repair, verify, ack (all but the
/// last, which is returned), store.
pub fn transfers<L: Landed + ?Sized>(
    r: &mut Receiving<'_>,
    landed: &L,
    terms: &Terms<'_>,
) -> Received {
    let header = terms.header;
    let total = header.total_bytes;
    let transfers = header.transfers.max(1);
    let mut integrity = Integrity {
        verify: Some(header.verify),
        payload: Some(header.payload),
        name: terms.name.clone(),
        ..Integrity::default()
    };
    let mut seconds = 0.0;
    let mut verify_seconds = 0.0;
    let mut verification: Option<Verification> = None;
    let mut verify_error = None;
    let mut done = 0u32;
    let mut last_ack = None;
    let mut passed = Vec::new();
    let mut error = None;
    let mut reply_delivered = true;
    let plan = match ChunkPlan::new(total, header.chunk_bytes as u64) {
        Ok(p) => p,
        Err(e) => {
            error = Some(TransferError::Protocol(e));
            ChunkPlan::new(1, 1).expect("a plan of one byte")
        }
    };
    // The first transfer's pass is expected now; each later one before the ack that
    // lets the sender start it (a link whose sender writes in place must find the
    // buffer poisoned already, and its receives posted).
    let mut next = match r.begin(&plan, Which::All, header.verify.checksum()) {
        Ok(p) => Some(p),
        Err(stop) => {
            error = Some(TransferError::Incomplete {
                peer: terms.peer.to_string(),
                got: 0,
                total,
                why: stop_words(stop),
            });
            None
        }
    };
    for k in 0..transfers {
        let Some(items) = next.take() else {
            break;
        };
        let whole = crate::server::whole_deadline(
            terms.accepted_at,
            terms.timeout,
            terms.min_rate,
            total,
            k as u64,
        );
        let start = Instant::now();
        let received = receive_one(r, landed, terms, &plan, items, whole, &mut integrity);
        let repairs = match received {
            Ok(repairs) => repairs,
            Err(stop) => {
                let got = r.got.min(total);
                error = Some(match stop {
                    Stop::TooSlow => {
                        // Tell the sender why, as its ack, then break the connection off.
                        let _ = r.send_message(&Ack::too_slow(got).encode());
                        // Counted over the connection, as the rate is.
                        TransferError::TooSlow {
                            peer: terms.peer.to_string(),
                            got: total * done as u64 + got,
                            total: total * transfers as u64,
                            seconds: terms.accepted_at.elapsed().as_secs_f64(),
                            min_rate: terms.min_rate,
                        }
                    }
                    Stop::Broken(why) => TransferError::Incomplete {
                        peer: terms.peer.to_string(),
                        got,
                        total,
                        why,
                    },
                });
                r.close();
                break;
            }
        };
        seconds += start.elapsed().as_secs_f64();
        let t_verify = Instant::now();
        let pattern = (header.payload == Payload::Pattern && header.verify.pattern())
            .then(|| landed.verify(total as usize));
        let took = t_verify.elapsed();
        verify_seconds += took.as_secs_f64();
        let this = pattern.as_ref().map(|v| v.as_ref().ok().copied());
        if let Some(this) = this {
            verification = merge(verification, this, k);
        }
        if let Some(Err(e)) = &pattern {
            verify_error.get_or_insert_with(|| format!("{e:#}{}", context(k, transfers)));
        }
        integrity.chunks_checked += if header.verify.checksum() {
            plan.count() + repairs.resent
        } else {
            0
        };
        integrity
            .repaired
            .extend(repairs.repaired.iter().map(|&(chunk, attempts)| Repaired {
                chunk: chunk as u64,
                attempts,
            }));
        integrity
            .failed_chunks
            .extend(repairs.failed.iter().map(|&c| c as u64));
        let mut ack = match header.verify.checksum() {
            false if header.verify.pattern() => Ack::new(total, this.flatten()),
            _ => Ack::checked(total, this, integrity.digest, repairs.repaired.len() as u32),
        };
        if !repairs.failed.is_empty() {
            ack = ack.with_status(AckStatus::ChecksumFailed);
        } else if let (Some(out), AckStatus::Verified) = (terms.output, ack.status) {
            let name = integrity.name.clone();
            let peer_writes = r.caps().peer_writes_in_place && !repairs.passed.is_empty();
            match out.store(name.as_deref(), terms.peer, |w| match peer_writes {
                // What is stored is checked again as it is stored.
                true => {
                    let mut checked =
                        CheckedOut::new(w, plan.chunk_bytes() as usize, &repairs.passed);
                    landed.write_to(total as usize, &mut checked)?;
                    Ok(checked.finish()?)
                }
                false => landed.write_to(total as usize, w),
            }) {
                Ok(at) => integrity.stored = Some(at),
                Err(e) => {
                    integrity.store_error = Some(format!("{e:#}{}", context(k, transfers)));
                    ack = ack.with_status(AckStatus::NotStored);
                }
            }
        }
        if header.repeats() {
            ack = ack.with_verify_time(took);
        }
        done += 1;
        if k + 1 == transfers {
            last_ack = Some(ack);
            passed = repairs.passed;
            break;
        }
        // The next transfer: the buffer poisoned (data that never comes cannot pass)
        // and its pass expected, then the ack that lets the sender start it.
        if let Err(e) = landed.poison() {
            error = Some(TransferError::Memory(e));
            break;
        }
        r.next_transfer();
        match r.begin(&plan, Which::All, header.verify.checksum()) {
            Ok(p) => next = Some(p),
            Err(stop) => {
                error = Some(TransferError::Incomplete {
                    peer: terms.peer.to_string(),
                    got: 0,
                    total,
                    why: stop_words(stop),
                });
                break;
            }
        }
        if r.send_message(&ack.encode()).is_err() {
            reply_delivered = false;
            break;
        }
    }
    let bytes = total * done as u64;
    let report = RecvReport {
        peer: terms.peer.to_string(),
        op: terms.op,
        bytes,
        chunks: plan.count() * done as u64,
        seconds,
        gbps: gigabytes_per_second(bytes, seconds),
        path: landed.path(),
        verification: if verify_error.is_some() {
            None
        } else {
            verification
        },
        verify_error,
        first_values: landed.first_values(5).unwrap_or_default(),
        imm: None,
        reply_delivered,
        transfers: done,
        offered: transfers,
        verify_seconds,
        memory: terms.memory.clone(),
        integrity: Box::new(integrity),
        striped: r.striped().then(|| {
            Box::new(StripedRecv {
                rails: r.rail_report(&terms.rails_from),
                asked_again: r.asked_again,
            })
        }),
    };
    Received {
        report,
        last_ack: if error.is_none() { last_ack } else { None },
        error,
        passed: (passed, plan.chunk_bytes()),
    }
}

fn stop_words(stop: Stop) -> String {
    match stop {
        Stop::TooSlow => "too slow".into(),
        Stop::Broken(why) => why,
    }
}

/// " in transfer k of n", or nothing for a connection of one transfer.
fn context(k: u32, transfers: u32) -> String {
    match transfers > 1 {
        true => format!(" in transfer {} of {transfers}", k + 1),
        false => String::new(),
    }
}

/// One transfer, its pass expected already: its data (and missing rounds), the sender's
/// name if it follows, the checks and their rounds.
fn receive_one<L: Landed + ?Sized>(
    r: &mut Receiving<'_>,
    landed: &L,
    terms: &Terms<'_>,
    plan: &ChunkPlan,
    items: PassItems<'_>,
    whole: Option<Instant>,
    integrity: &mut Integrity,
) -> Result<Repairs, Stop> {
    let header = &terms.header;
    let checksum = header.verify.checksum();
    if checksum && !r.caps().crc_in_frames {
        // The sender's CRC32Cs follow its chunks.
        r.expect_message(CHECKSUMS_PREFIX_LEN + 4 * plan.count() as usize);
    }
    let items = r.finish(items, whole, true)?;
    let items = match r.ends_marked() {
        true => r.fetch_missing(items, whole, MAX_MISSING_ROUNDS, &missing_request)?,
        false => items,
    };
    if header.named && integrity.name.is_none() {
        integrity.name = sender_name(r, terms.timeout)?;
    }
    if !checksum {
        return Ok(Repairs::default());
    }
    let checking = |e: anyhow::Error| Stop::Broken(format!("checking the chunks: {e:#}"));
    let mut expected = match (r.caps().crc_in_frames, items.sent_crcs()) {
        (true, Some(crcs)) => crcs.to_vec(),
        (true, None) => return Err(Stop::Broken("a chunk came without its CRC32C".into())),
        (false, _) => sender_crcs(r, plan, terms.timeout)?,
    };
    let failed = {
        let computed;
        let here = match items.landed_crcs() {
            Some(crcs) => crcs,
            None => {
                computed = landed
                    .crc32c_chunks(0..plan.total() as usize, plan.chunk_bytes() as usize)
                    .map_err(checking)?;
                &computed[..]
            }
        };
        if here.len() != expected.len() {
            return Err(Stop::Broken(format!(
                "{} checksums computed for {} chunks",
                here.len(),
                expected.len()
            )));
        }
        crate::transfer::repair::failed(&expected, here)
    };
    // The pass's books are not needed in the rounds: they go before them.
    drop(items);
    let repairs = repair(r, landed, terms, plan, whole, failed, &mut expected)?;
    // Every chunk passed: each one's CRC32C where it landed is `expected`'s (repaired
    // chunks' were set to it), so the digest is that of the bytes as they lie. With a
    // chunk that still fails there is none (the sender's claims are not the data here).
    integrity.digest = repairs
        .failed
        .is_empty()
        .then(|| crate::integrity::digest(&expected, plan.chunk_bytes(), plan.total()));
    Ok(Repairs {
        passed: match repairs.failed.is_empty() {
            true => expected,
            false => Vec::new(),
        },
        ..repairs
    })
}

/// The request for the items a pass left missing (round `round`).
fn missing_request(round: u32, chunks: &[u32]) -> Vec<u8> {
    Resend::encode_list(round, false, true, chunks)
}

/// The sender's CRC32C of every chunk, from its message(s) after the data.
fn sender_crcs(
    r: &mut Receiving<'_>,
    plan: &ChunkPlan,
    timeout: Duration,
) -> Result<Vec<u32>, Stop> {
    let n = plan.count();
    let mut crcs = Vec::with_capacity(n.min(1 << 24) as usize);
    while (crcs.len() as u64) < n {
        let Some(m) = r.next_message(Instant::now() + timeout)? else {
            return Err(Stop::Broken(format!(
                "the chunk checksums did not come within {} (--timeout)",
                crate::rdma::format_duration(timeout)
            )));
        };
        if m.get(..4) != Some(&CHECKSUMS_MAGIC[..]) {
            return Err(Stop::Broken(
                "protocol error: another message where the chunk checksums were due".into(),
            ));
        }
        let part = ChunkChecksums::decode(&m, n).map_err(|e| {
            Stop::Broken(format!(
                "protocol error: a chunk checksum message is invalid: {e}"
            ))
        })?;
        if part.first as usize != crcs.len() || part.crcs.is_empty() {
            return Err(Stop::Broken(format!(
                "protocol error: chunk checksums from chunk {} where chunk {} was due",
                part.first,
                crcs.len()
            )));
        }
        crcs.extend_from_slice(&part.crcs);
    }
    Ok(crcs)
}

/// The sender's name, its first message (a named offer over a link whose opening
/// carries no name).
fn sender_name(r: &mut Receiving<'_>, timeout: Duration) -> Result<Option<String>, Stop> {
    let Some(m) = r.next_message(Instant::now() + timeout)? else {
        return Err(Stop::Broken(
            "the sender's name did not come (--timeout)".into(),
        ));
    };
    if m.get(..4) != Some(&NAME_MAGIC[..]) {
        return Err(Stop::Broken(
            "protocol error: another message where the sender's name was due".into(),
        ));
    }
    let bad = |e: crate::wire::WireError| Stop::Broken(format!("protocol error: the name: {e}"));
    let len = decode_name_prefix(&m).map_err(bad)?;
    let name = m
        .get(NAME_PREFIX_LEN..NAME_PREFIX_LEN + len)
        .filter(|_| m.len() == NAME_PREFIX_LEN + len)
        .ok_or_else(|| Stop::Broken("protocol error: a name of the wrong length".into()))?;
    Ok(Some(checked_name(name).map_err(bad)?.to_string()))
}

/// Ask for the chunks whose CRC32C failed where they landed, in rounds that converge: a
/// failed chunk comes again as pieces (when the sender offers them), a failed piece as
/// smaller ones, each checked against the sender's CRC32C of it (asked for in a query
/// where the link's frames carry none or the pieces are new: only those that differ are
/// sent); the rounds end when all pass, when the next would send more again than the
/// transfer's size, after `--timeout` without a repair, or at the sender's
/// `--max-resends`. Then the chunks still failing are named in a final [`Resend`] (an
/// ack saying so follows). `expected` ends as the chunks' CRC32Cs where they landed.
/// The lists travel in the requests from where they lie, not copied: a round may name
/// every chunk of a million.
fn repair<L: Landed + ?Sized>(
    r: &mut Receiving<'_>,
    landed: &L,
    terms: &Terms<'_>,
    plan: &ChunkPlan,
    whole: Option<Instant>,
    first: Vec<u32>,
    expected: &mut [u32],
) -> Result<Repairs, Stop> {
    let header = &terms.header;
    let checking = |e: anyhow::Error| Stop::Broken(format!("checking the chunks: {e:#}"));
    let frames_carry = r.caps().crc_in_frames;
    let mut rounds = Converge::new(
        plan.total(),
        plan.chunk_bytes(),
        header.pieces,
        header.max_resends,
        terms.timeout,
        first,
        Instant::now(),
    );
    let failed = loop {
        let (round, unit, items, fresh) = match rounds.next(Instant::now()) {
            Step::Done => break Vec::new(),
            Step::GiveUp { round, chunks, .. } => {
                r.send_message(&Resend::encode_list(round, true, false, &chunks))?;
                break chunks;
            }
            Step::Ask {
                round,
                unit,
                items,
                fresh,
            } => (round, unit, items, fresh),
        };
        let unit = match unit {
            crate::transfer::repair::Unit::Chunks => Unit::Chunks,
            crate::transfer::repair::Unit::Pieces(s) => Unit::Pieces(s),
        };
        let unit_plan = unit
            .plan(plan.total(), plan.chunk_bytes())
            .map_err(|e| Stop::Broken(format!("cutting chunks into pieces: {e}")))?;
        // Pieces' CRC32Cs come from the sender, asked in a query, where the frames carry
        // none or the pieces are new: then only those that differ where they landed are
        // sent. Whole chunks' are known.
        let query = matches!(unit, Unit::Pieces(_)) && (fresh || !frames_carry);
        let theirs = match (query, unit) {
            (true, Unit::Pieces(shift)) => {
                r.expect_message(REPLY_PREFIX_LEN + 4 * items.len());
                r.send_message(&pieces::encode_list(QUERY_MAGIC, round, shift, &items))?;
                Some(read_crcs(r, round, items.len() as u32, terms.timeout)?)
            }
            _ => None,
        };
        let differ: Option<Vec<u32>> = match &theirs {
            Some(theirs) => {
                let here = piece_crcs(landed, &unit_plan, &items).map_err(checking)?;
                Some(
                    items
                        .iter()
                        .zip(theirs.iter().zip(&here))
                        .filter(|(_, (t, l))| t != l)
                        .map(|(&k, _)| k)
                        .collect(),
                )
            }
            None => None,
        };
        let sent: &[u32] = differ.as_deref().unwrap_or(&items);
        // The pass is expected before the request that makes the sender send it.
        let arrived = match sent.is_empty() {
            true => None,
            false => {
                let pending = r.begin(&unit_plan, Which::Only(sent), true)?;
                let request = match unit {
                    Unit::Chunks => Resend::encode_list(round, false, false, sent),
                    Unit::Pieces(shift) => pieces::encode_list(PIECES_MAGIC, round, shift, sent),
                };
                r.send_message(&request)?;
                drop(request);
                let got = r.finish(pending, whole, false).map_err(|stop| match stop {
                    // Every byte has arrived by now, so "got N of N bytes" alone would
                    // read as done: say that the transfer broke while items came again.
                    Stop::Broken(why) => Stop::Broken(format!(
                        "in resend round {round}, {} {} asked again: {why}",
                        sent.len(),
                        match unit {
                            Unit::Chunks => "chunk(s)",
                            Unit::Pieces(_) => "piece(s)",
                        }
                    )),
                    too_slow => too_slow,
                })?;
                let got = match r.ends_marked() {
                    true => r.fetch_missing(got, whole, MAX_MISSING_ROUNDS, &missing_request)?,
                    false => got,
                };
                Some(got)
            }
        };
        // Each item's CRC32C where it landed now, against what it must be: the sender's
        // (queried), or the one its new frame carried (links whose frames carry them),
        // else the chunk's from the sender's list.
        let passed: Vec<bool> = {
            let computed;
            let here: &[u32] = match arrived.as_ref().and_then(|g| g.landed_crcs()) {
                Some(crcs) if differ.is_none() => crcs,
                _ => {
                    computed = piece_crcs(landed, &unit_plan, &items).map_err(checking)?;
                    &computed
                }
            };
            let frames = arrived.as_ref().and_then(|g| g.sent_crcs());
            let musts: Vec<Option<u32>> = items
                .iter()
                .enumerate()
                .map(|(i, &k)| match (&theirs, unit) {
                    (Some(theirs), _) => Some(theirs[i]),
                    (None, Unit::Chunks) => frames.map(|f| f[i]).or(Some(expected[k as usize])),
                    (None, Unit::Pieces(_)) => frames.map(|f| f[i]),
                })
                .collect();
            let passed: Vec<bool> = musts
                .iter()
                .zip(here)
                .map(|(must, here)| *must == Some(*here))
                .collect();
            if unit == Unit::Chunks {
                // A chunk that passed is its new frame's (the sender's digest is over the
                // CRC32Cs it sent: a frame that lied is caught there).
                for ((&k, must), ok) in items.iter().zip(&musts).zip(&passed) {
                    if let (true, Some(crc)) = (*ok, must) {
                        expected[k as usize] = *crc;
                    }
                }
            }
            passed
        };
        drop(arrived);
        let completed = rounds.checked(&items, &passed, sent, Instant::now());
        if let (Unit::Pieces(_), false) = (unit, completed.is_empty()) {
            // Every piece of these chunks passed its own CRC32C: the chunk's CRC32C is
            // now that of its bytes where they landed (for the digest, which the sender
            // checks against its own), not its first frame's.
            let crcs = piece_crcs(landed, plan, &completed).map_err(checking)?;
            for (&c, crc) in completed.iter().zip(crcs) {
                expected[c as usize] = crc;
            }
        }
    };
    Ok(Repairs {
        repaired: rounds.repaired(),
        resent: rounds.resent(),
        failed,
        passed: Vec::new(),
    })
}

/// The CRC32C of each of `items` (increasing) of `plan` where it landed.
fn piece_crcs<L: Landed + ?Sized>(
    landed: &L,
    plan: &ChunkPlan,
    items: &[u32],
) -> anyhow::Result<Vec<u32>> {
    items
        .iter()
        .map(|&k| {
            let c = plan
                .get(k as u64)
                .ok_or_else(|| anyhow::anyhow!("item {k} is outside the transfer"))?;
            let crcs = landed.crc32c_chunks(c.offset as usize..c.end() as usize, c.len as usize)?;
            crcs.first()
                .copied()
                .ok_or_else(|| anyhow::anyhow!("no CRC32C of item {k}"))
        })
        .collect()
}

/// The sender's answer to the query of round `round` about `count` pieces: the CRC32C
/// of each.
fn read_crcs(
    r: &mut Receiving<'_>,
    round: u32,
    count: u32,
    timeout: Duration,
) -> Result<Vec<u32>, Stop> {
    let Some(m) = r.next_message(Instant::now() + timeout)? else {
        return Err(Stop::Broken(format!(
            "the sender's CRC32C of pieces did not come within {} (--timeout)",
            crate::rdma::format_duration(timeout)
        )));
    };
    if m.get(..4) != Some(&CRCS_MAGIC[..]) || m.len() < REPLY_PREFIX_LEN {
        return Err(Stop::Broken(
            "protocol error: another message where the sender's CRC32C of pieces was due".into(),
        ));
    }
    pieces::decode_crcs_head(&m, round, count).map_err(|e| {
        Stop::Broken(format!(
            "protocol error: the sender's CRC32C of pieces: {e}"
        ))
    })?;
    let body = &m[REPLY_PREFIX_LEN..];
    if body.len() != count as usize * 4 {
        return Err(Stop::Broken(
            "protocol error: the sender's CRC32C of pieces are of the wrong length".into(),
        ));
    }
    Ok(pieces::decode_crcs(body))
}

/// The verification of all transfers of a connection: counts add up, the first
/// mismatch is the first transfer's that has one (as an element index of that transfer).
fn merge(acc: Option<Verification>, this: Option<Verification>, k: u32) -> Option<Verification> {
    match (acc, this) {
        (_, None) => None,
        (None, Some(v)) if k == 0 => Some(v),
        (None, Some(_)) => None,
        (Some(a), Some(v)) => Some(Verification {
            elements: a.elements + v.elements,
            mismatches: a.mismatches + v.mismatches,
            first_mismatch: a.first_mismatch.or(v.first_mismatch),
            crc32: v.crc32,
        }),
    }
}
