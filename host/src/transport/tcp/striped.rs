//! The receiver's side of a striped transfer (header flag `0x04`): any chunk on any
//! stream, placed by its offset, until every stream has ended its pass.
//!
//! One *round* reads the chunks it expects (all of the plan, or those asked for again)
//! from every stream still alive, one thread per stream, until each stream has sent its
//! end marker, broken, or belongs to a rail that an end marker names as failed (its
//! sockets are then shut here, which ends their readers at once). Each frame is checked
//! before a byte lands: its offset is a chunk boundary of the plan inside the transfer
//! and its length that chunk's. A chunk lands once: its place is handed out of a table
//! of slots to the first frame that brings it, so the borrow checker, not care, keeps
//! two readers off one place. A frame for a chunk that landed already (or is landing on
//! another stream, or is not expected in this round) is read and dropped: a striped
//! sender resends a failed rail's chunks in flight, and some of those may have arrived
//! after all; it carries the same bytes. Such copies are bounded (at most the
//! transfer's size per round, more is a protocol error). The chunks still missing when
//! the round ends (written into a rail that failed) are what the round returns: the
//! caller asks for them with a missing-chunk `Resend`.
//!
//! A rail can die after its last chunk and before its end marker. Broken (an error, an
//! EOF), its readers end at once. Silently (a link down, no FIN), nothing would end
//! them before `--timeout`, although nothing is missing. So once every chunk the round
//! expects has landed, a stream other than the control stream that brings no byte for
//! [`SILENT_AFTER_LANDED`] is shut and counted dead, and the round ends without it (the
//! sender, if its rail is alive after all, finds its next write refused and fails it
//! over). The control stream is never cut: the transfer's conversation goes on there.

use super::frames::{Frame, FRAME_LEN};
use super::landing::{ReadLimits, Reads, Stop, Which};
use super::socket::{self, ReadStop};
use crate::transfer::plan::ChunkPlan;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most chunks a striped transfer may have: the slot table is one entry per chunk.
pub const MAX_STRIPED_CHUNKS: u64 = 1 << 20;
/// The rail of a stream that never joined (its hello, which names it, did not come).
pub const UNKNOWN_RAIL: u16 = u16::MAX;
/// Once every chunk of a round has landed, how long a stream may bring nothing before
/// it is taken for dead (at most `--timeout`). Its end marker is 12 bytes behind its
/// last chunk, or behind copies that flow at the link's rate: a live link shows
/// progress well within this; the sender's own `--rail-timeout` is 0.5 s by default.
pub const SILENT_AFTER_LANDED: Duration = Duration::from_secs(1);

/// A chunk's place, as a round sees it.
enum Slot<'b> {
    /// Expected, not yet arrived: its bytes, for the first frame that brings it.
    Open(&'b mut [u8]),
    /// Being read from a stream now.
    Busy,
    Landed,
    /// Not expected in this round.
    Closed,
}

/// The streams of a striped connection: each one's rail, and those that ended for good.
pub struct Streams {
    /// Stream `s`, if it joined (one whose hello did not come in time is left out).
    sockets: Vec<Option<TcpStream>>,
    rails: Vec<u16>,
    /// Why each dead stream stopped (broken, never joined, or its rail given up by the
    /// sender).
    dead: Vec<Option<String>>,
    /// Per stream, over the connection: what landed from it, and copies it dropped.
    counts: Vec<Counts>,
    /// Each stream's peer address, read when it joined (a socket shut or reset later
    /// may no longer tell it, and the report names it then).
    from: Vec<Option<String>>,
    /// Chunks asked for again because they were missing after a pass.
    pub asked_again: u64,
}

/// What one stream brought.
#[derive(Debug, Default)]
struct Counts {
    bytes: AtomicU64,
    chunks: AtomicU64,
    dropped: AtomicU64,
}

impl Streams {
    /// `sockets[s]` and `rails[s]`: stream `s` and its rail (from its hello).
    pub fn new(sockets: Vec<Option<TcpStream>>, rails: Vec<u16>) -> Streams {
        let dead = sockets
            .iter()
            .map(|s| s.is_none().then(|| "it did not join in time".to_string()))
            .collect();
        let counts = (0..sockets.len()).map(|_| Counts::default()).collect();
        let from = sockets
            .iter()
            .map(|s| {
                let peer = s.as_ref()?.peer_addr().ok()?;
                Some(peer.ip().to_string())
            })
            .collect();
        Streams {
            from,
            sockets,
            rails,
            dead,
            counts,
            asked_again: 0,
        }
    }

    /// Shut every stream (the transfer is over: the sender's writes fail at once).
    pub fn shut_all(&self) {
        for s in self.sockets.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// What came over each rail, for the report.
    pub fn summary(&self) -> crate::transfer::report::StripedRecv {
        let mut rails: Vec<crate::transfer::report::RecvRail> = Vec::new();
        for (s, &rail) in self.rails.iter().enumerate() {
            if rail == UNKNOWN_RAIL {
                continue;
            }
            let at = match rails.iter().position(|r| r.rail == rail) {
                Some(at) => at,
                None => {
                    rails.push(crate::transfer::report::RecvRail {
                        rail,
                        ..Default::default()
                    });
                    rails.len() - 1
                }
            };
            let r = &mut rails[at];
            let c = &self.counts[s];
            r.bytes += c.bytes.load(Ordering::Relaxed);
            r.chunks += c.chunks.load(Ordering::Relaxed);
            r.copies_dropped += c.dropped.load(Ordering::Relaxed);
            if r.from.is_none() {
                r.from = self.from[s].clone();
            }
            if let (None, Some(why)) = (&r.stopped, &self.dead[s]) {
                r.stopped = Some(why.clone());
            }
        }
        rails.sort_by_key(|r| r.rail);
        crate::transfer::report::StripedRecv {
            rails,
            asked_again: self.asked_again,
        }
    }
}

/// What every reader of one round shares.
struct Round<'a, 'b> {
    streams: &'a [Option<TcpStream>],
    counts: &'a [Counts],
    rails: &'a [u16],
    plan: &'a ChunkPlan,
    slots: Vec<Mutex<Slot<'b>>>,
    limits: ReadLimits,
    got: &'a AtomicU64,
    checks: &'a super::landing::ChunkChecks,
    /// Bit `r`: rail `r` given up by the sender (from the end markers).
    failed_rails: AtomicU32,
    /// Bytes of copies dropped in this round.
    dropped: AtomicU64,
    /// The first error that ends the whole round (a protocol error, the deadline).
    fatal: Mutex<Option<Stop>>,
    /// Chunks this round expects that have not landed yet.
    open: AtomicU64,
    /// When each stream last brought bytes (ms since `start`), whether its reader has
    /// ended, and whether it was shut for silence after every chunk had landed.
    start: Instant,
    last_seen: Vec<AtomicU64>,
    ended: Vec<AtomicBool>,
    cut: Vec<AtomicBool>,
    /// Readers still running; the watcher waits on it (notified when a reader ends or
    /// the last chunk lands).
    running: Mutex<usize>,
    changed: Condvar,
}

/// How one stream's part of a round ended.
enum Ended {
    Marker,
    Dead(String),
}

/// Read one round of `which` chunks of `reads.plan` into `bytes` from the live streams
/// of `state`; the chunks of `which` that did not arrive.
pub fn receive_round(
    bytes: &mut [u8],
    state: &mut Streams,
    reads: Reads<'_>,
    which: Which<'_>,
) -> Result<Vec<u32>, Stop> {
    let Reads {
        plan,
        limits,
        got,
        checks,
    } = reads;
    let chunk = usize::try_from(plan.chunk_bytes()).map_err(|e| Stop::Broken(e.to_string()))?;
    let mut wanted = match which {
        Which::All => None,
        Which::Only(list) => Some(list.iter().peekable()),
    };
    let mut open = 0u64;
    let slots: Vec<Mutex<Slot<'_>>> = bytes
        .chunks_mut(chunk.max(1))
        .enumerate()
        .map(|(i, place)| {
            let is_open = match &mut wanted {
                None => true,
                Some(list) => list.next_if(|&&w| w as usize == i).is_some(),
            };
            Mutex::new(if is_open {
                open += 1;
                Slot::Open(place)
            } else {
                Slot::Closed
            })
        })
        .collect();
    let streams = &state.sockets;
    let live = state.dead.iter().filter(|d| d.is_none()).count();
    let flags = || (0..streams.len()).map(|_| AtomicBool::new(false)).collect();
    let round = Round {
        streams,
        counts: &state.counts,
        rails: &state.rails,
        plan,
        slots,
        limits,
        got,
        checks,
        failed_rails: AtomicU32::new(0),
        dropped: AtomicU64::new(0),
        fatal: Mutex::new(None),
        open: AtomicU64::new(open),
        start: Instant::now(),
        last_seen: (0..streams.len()).map(|_| AtomicU64::new(0)).collect(),
        ended: flags(),
        cut: flags(),
        running: Mutex::new(live),
        changed: Condvar::new(),
    };
    let ended: Vec<Option<Ended>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..streams.len())
            .map(|s| {
                let live = state.dead[s].is_none();
                let round = &round;
                live.then(|| {
                    scope.spawn(move || {
                        let ended = read_stream(round, s);
                        reader_ended(round, s);
                        ended
                    })
                })
            })
            .collect();
        let round = &round;
        scope.spawn(move || cut_silent_streams(round, SILENT_AFTER_LANDED.min(limits.timeout)));
        handles
            .into_iter()
            .map(|h| {
                h.map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Ended::Dead("its reader panicked".into()))
                })
            })
            .collect()
    });
    if let Some(stop) = round.fatal.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(stop);
    }
    for (s, end) in ended.into_iter().enumerate() {
        if let Some(Ended::Dead(why)) = end {
            state.dead[s] = Some(why);
        }
    }
    if let Some(why) = &state.dead[0] {
        return Err(Stop::Broken(format!(
            "the control stream (rail {}) broke: {why}",
            state.rails[0]
        )));
    }
    Ok(round
        .slots
        .into_iter()
        .enumerate()
        .filter(|(_, slot)| {
            matches!(
                *slot.lock().unwrap_or_else(|p| p.into_inner()),
                Slot::Open(_) | Slot::Busy
            )
        })
        .map(|(i, _)| i as u32)
        .collect())
}

/// Stream `s`'s part of a round: frames until its end marker, or until it breaks.
fn read_stream(round: &Round<'_, '_>, s: usize) -> Ended {
    match read_frames(round, s) {
        // Shut here because the sender gave its rail up: say that, not the read's error.
        Ended::Dead(_) if given_up(round, s) => {
            Ended::Dead("the sender gave its rail up (an end marker said so)".into())
        }
        // Shut here for its silence: say that.
        Ended::Dead(_) if round.cut[s].load(Ordering::Relaxed) => Ended::Dead(format!(
            "no end marker, nor any byte, for {} after every chunk had landed (its link may be down)",
            crate::rdma::format_duration(SILENT_AFTER_LANDED.min(round.limits.timeout))
        )),
        ended => ended,
    }
}

/// Whether an end marker named stream `s`'s rail as given up.
fn given_up(round: &Round<'_, '_>, s: usize) -> bool {
    let rail = round.rails[s];
    rail < 32 && round.failed_rails.load(Ordering::Relaxed) & (1 << rail) != 0
}

fn read_frames(round: &Round<'_, '_>, s: usize) -> Ended {
    let Some(stream) = &round.streams[s] else {
        return Ended::Dead("it did not join in time".into());
    };
    let limits = round.limits;
    loop {
        let mut head = [0u8; FRAME_LEN];
        if let Err(e) =
            socket::read_exact_within(stream, &mut head, limits.timeout, limits.deadline)
        {
            return ended_by(round, e, "reading a frame");
        }
        seen(round, s);
        let frame = Frame::decode(&head);
        if let Some(mask) = frame.end_mask() {
            give_up(round, mask);
            return Ended::Marker;
        }
        let Some(index) = chunk_of(round.plan, &frame) else {
            return fatal(
                round,
                Stop::Broken(format!(
                    "protocol error: a frame of {} bytes at offset {} is no chunk of this transfer",
                    frame.len, frame.offset
                )),
            );
        };
        let place = {
            let mut slot = round.slots[index].lock().unwrap_or_else(|p| p.into_inner());
            match std::mem::replace(&mut *slot, Slot::Busy) {
                Slot::Open(place) => Some(place),
                other => {
                    *slot = other;
                    None
                }
            }
        };
        let Some(place) = place else {
            if let Err(e) = drop_copy(round, s, frame.len as usize) {
                return e;
            }
            round.counts[s].dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match socket::read_exact_within(stream, place, limits.timeout, limits.deadline) {
            Ok(()) => {
                if round.checks.enabled() {
                    round.checks.expect(index as u64, frame.crc);
                    if crate::integrity::crc32c(place) != frame.crc {
                        round.checks.failed(index as u64);
                    }
                }
                round.got.fetch_add(frame.len as u64, Ordering::Relaxed);
                let counts = &round.counts[s];
                counts.bytes.fetch_add(frame.len as u64, Ordering::Relaxed);
                counts.chunks.fetch_add(1, Ordering::Relaxed);
                *round.slots[index].lock().unwrap_or_else(|p| p.into_inner()) = Slot::Landed;
                seen(round, s);
                if round.open.fetch_sub(1, Ordering::Relaxed) == 1 {
                    notify(round);
                }
            }
            Err(e) => {
                // Half a chunk: its place is open again for a copy on another stream.
                *round.slots[index].lock().unwrap_or_else(|p| p.into_inner()) = Slot::Open(place);
                return ended_by(round, e, &format!("reading chunk {index}"));
            }
        }
    }
}

/// The chunk a frame brings: its offset a chunk boundary inside the transfer, its length
/// that chunk's.
fn chunk_of(plan: &ChunkPlan, frame: &Frame) -> Option<usize> {
    let chunk = plan.chunk_bytes().max(1);
    if !frame.offset.is_multiple_of(chunk) {
        return None;
    }
    let c = plan.get(frame.offset / chunk)?;
    (c.len == frame.len as u64).then_some(c.index as usize)
}

/// Read and drop a copy of `len` bytes (a chunk that landed already), within the round's
/// bound on copies.
fn drop_copy(round: &Round<'_, '_>, s: usize, len: usize) -> Result<(), Ended> {
    let Some(stream) = &round.streams[s] else {
        return Err(Ended::Dead("it did not join in time".into()));
    };
    let dropped = round.dropped.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
    if dropped > round.plan.total() {
        return Err(fatal(
            round,
            Stop::Broken(format!(
                "protocol error: more than {} bytes of chunks that had arrived already",
                round.plan.total()
            )),
        ));
    }
    let mut scratch = vec![0u8; len.min(64 << 10)];
    let mut left = len;
    while left > 0 {
        let n = left.min(scratch.len());
        let limits = round.limits;
        socket::read_exact_within(stream, &mut scratch[..n], limits.timeout, limits.deadline)
            .map_err(|e| ended_by(round, e, "reading a chunk that had arrived already"))?;
        seen(round, s);
        left -= n;
    }
    Ok(())
}

/// Stream `s` brought bytes now.
fn seen(round: &Round<'_, '_>, s: usize) {
    let ms = round.start.elapsed().as_millis() as u64;
    round.last_seen[s].store(ms, Ordering::Relaxed);
}

/// Wake the watcher (under its lock, so that no wake-up falls between its check and its
/// wait).
fn notify(round: &Round<'_, '_>) {
    let _running = round.running.lock().unwrap_or_else(|p| p.into_inner());
    round.changed.notify_all();
}

/// Stream `s`'s reader is done with this round.
fn reader_ended(round: &Round<'_, '_>, s: usize) {
    round.ended[s].store(true, Ordering::Relaxed);
    let mut running = round.running.lock().unwrap_or_else(|p| p.into_inner());
    *running = running.saturating_sub(1);
    round.changed.notify_all();
}

/// The watcher of a round: once every expected chunk has landed, shut each stream but
/// the control stream that has brought nothing for `grace` (since the last chunk landed
/// or its own last bytes, whichever is later); its reader then ends, and the round with
/// it. Ends when every reader has ended, or when only the control stream's is left.
/// Every wait is bounded by `grace` (readers end within `--timeout` or the deadline).
fn cut_silent_streams(round: &Round<'_, '_>, grace: Duration) {
    let mut running = round.running.lock().unwrap_or_else(|p| p.into_inner());
    let mut landed_at: Option<u64> = None;
    loop {
        let others_left = (1..round.streams.len()).any(|s| {
            round.streams[s].is_some()
                && !round.ended[s].load(Ordering::Relaxed)
                && !round.cut[s].load(Ordering::Relaxed)
        });
        if *running == 0 || !others_left {
            return;
        }
        let now = round.start.elapsed().as_millis() as u64;
        if landed_at.is_none() && round.open.load(Ordering::Relaxed) == 0 {
            landed_at = Some(now);
        }
        let mut wait = grace;
        if let Some(landed) = landed_at {
            let grace_ms = grace.as_millis() as u64;
            for s in 1..round.streams.len() {
                let Some(stream) = &round.streams[s] else {
                    continue;
                };
                if round.ended[s].load(Ordering::Relaxed) || round.cut[s].load(Ordering::Relaxed) {
                    continue;
                }
                let quiet_since = landed.max(round.last_seen[s].load(Ordering::Relaxed));
                let quiet = now.saturating_sub(quiet_since);
                if quiet >= grace_ms {
                    round.cut[s].store(true, Ordering::Relaxed);
                    let _ = stream.shutdown(Shutdown::Both);
                } else {
                    wait = wait.min(Duration::from_millis(grace_ms - quiet));
                }
            }
        }
        running = round
            .changed
            .wait_timeout(running, wait.max(Duration::from_millis(1)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// The sender gave up the rails of `mask`: shut their streams here (their readers end
/// at once; what they still had in flight is asked for again).
fn give_up(round: &Round<'_, '_>, mask: u32) {
    let before = round.failed_rails.fetch_or(mask, Ordering::Relaxed);
    if before | mask == before {
        return;
    }
    for (s, &rail) in round.rails.iter().enumerate() {
        if rail < 32 && mask & (1 << rail) != 0 && s != 0 {
            if let Some(stream) = &round.streams[s] {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A stream that stopped: past the whole deadline ends the round for all; anything else
/// ends this stream only.
fn ended_by(round: &Round<'_, '_>, stop: ReadStop, what: &str) -> Ended {
    match stop {
        ReadStop::Deadline => fatal(round, Stop::TooSlow),
        ReadStop::Io(e) => Ended::Dead(socket::why(&e, round.limits.timeout, what)),
    }
}

/// End the round for every stream, keeping the first reason.
fn fatal(round: &Round<'_, '_>, stop: Stop) -> Ended {
    let mut first = round.fatal.lock().unwrap_or_else(|p| p.into_inner());
    let why = match &stop {
        Stop::TooSlow => "too slow".to_string(),
        Stop::Broken(why) => why.clone(),
    };
    if first.is_none() {
        *first = Some(stop);
        for s in round.streams.iter().flatten() {
            let _ = s.shutdown(Shutdown::Read);
        }
    }
    Ended::Dead(why)
}

#[cfg(test)]
mod tests {
    use super::super::landing::ChunkChecks;
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    #[test]
    fn a_chunks_slot_and_lists_fit_the_books_admission_charges() {
        // The slot, and 4 bytes each in the missing list, its request and its encoding.
        let per_chunk = std::mem::size_of::<Mutex<Slot<'_>>>() as u64 + 12;
        assert!(
            per_chunk <= crate::server::admission::STRIPED_CHUNK_BOOKS,
            "{per_chunk}"
        );
    }

    /// `n` connected pairs: (what the test writes to, what the round reads).
    fn pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        (0..n)
            .map(|_| {
                let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                (a, listener.accept().unwrap().0)
            })
            .unzip()
    }

    fn frame(plan: &ChunkPlan, i: u64, fill: u8) -> Vec<u8> {
        let c = plan.get(i).unwrap();
        let bytes = vec![fill; c.len as usize];
        let head = Frame {
            offset: c.offset,
            len: c.len as u32,
            crc: crate::integrity::crc32c(&bytes),
        };
        [&head.encode()[..], &bytes].concat()
    }

    fn limits() -> ReadLimits {
        ReadLimits {
            timeout: Duration::from_secs(5),
            deadline: None,
        }
    }

    #[test]
    fn any_chunk_on_any_stream_lands_once_and_a_dead_rail_leaves_its_chunks_missing() {
        let plan = ChunkPlan::new(4 * 100, 100).unwrap();
        let (mut senders, readers) = pairs(3);
        // Stream 0 (rail 0): chunks 3 and 0, then a copy of 3, then its end naming rail 1
        // as failed. Stream 1 (rail 0): chunk 1, end. Stream 2 (rail 1): half of chunk 2.
        senders[0]
            .write_all(&[frame(&plan, 3, 3), frame(&plan, 0, 0), frame(&plan, 3, 9)].concat())
            .unwrap();
        senders[1].write_all(&frame(&plan, 1, 1)).unwrap();
        senders[1].write_all(&Frame::end(0).encode()).unwrap();
        senders[2]
            .write_all(&frame(&plan, 2, 2)[..FRAME_LEN + 50])
            .unwrap();
        let writer = std::thread::spawn({
            let mut s0 = senders[0].try_clone().unwrap();
            move || {
                std::thread::sleep(Duration::from_millis(100));
                s0.write_all(&Frame::end(0b10).encode()).unwrap();
            }
        });
        let mut buf = vec![0xeeu8; 400];
        let mut state = Streams::new(readers.into_iter().map(Some).collect(), vec![0, 0, 1]);
        let checks = ChunkChecks::new(true, plan.count());
        let got = AtomicU64::new(0);
        let reads = Reads {
            plan: &plan,
            limits: limits(),
            got: &got,
            checks: &checks,
        };
        let missing = receive_round(&mut buf, &mut state, reads, Which::All).unwrap();
        writer.join().unwrap();
        assert_eq!(missing, [2]);
        assert_eq!(&buf[300..400], &[3u8; 100][..], "the first copy stays");
        // Half of chunk 2 was written into its place, which stays open for a copy.
        assert!(state.dead[2].is_some() && state.dead[0].is_none());
        assert!(checks.take_failed().is_empty());
        assert_eq!(got.load(Ordering::Relaxed), 300);

        // The next round asks for chunk 2 only, from the live streams; a frame of
        // chunk 1 there is a copy, dropped.
        senders[1]
            .write_all(&[frame(&plan, 1, 7), frame(&plan, 2, 2)].concat())
            .unwrap();
        senders[1].write_all(&Frame::end(0b10).encode()).unwrap();
        senders[0].write_all(&Frame::end(0b10).encode()).unwrap();
        let missing = receive_round(&mut buf, &mut state, reads, Which::Only(&[2])).unwrap();
        assert!(missing.is_empty());
        let summary = state.summary();
        assert_eq!(summary.rails.len(), 2);
        assert_eq!(
            (summary.rails[0].chunks, summary.rails[0].copies_dropped),
            (4, 2)
        );
        assert_eq!(summary.rails[1].chunks, 0);
        assert!(summary.rails[1].stopped.is_some());
        assert_eq!(&buf[100..200], &[1u8; 100][..]);
        assert_eq!(&buf[200..300], &[2u8; 100][..]);
    }

    #[test]
    fn a_stream_silent_after_every_chunk_landed_is_cut_after_the_grace_not_the_timeout() {
        let plan = ChunkPlan::new(2 * 100, 100).unwrap();
        let (mut senders, readers) = pairs(3);
        // Stream 0 (control, rail 0): chunk 0 and its end. Stream 1 (rail 1): chunk 1,
        // then nothing (its link died silently). Stream 2 (rail 1): its end only.
        senders[0].write_all(&frame(&plan, 0, 0)).unwrap();
        senders[0].write_all(&Frame::end(0).encode()).unwrap();
        senders[1].write_all(&frame(&plan, 1, 1)).unwrap();
        senders[2].write_all(&Frame::end(0).encode()).unwrap();
        let mut buf = vec![0xeeu8; 200];
        let mut state = Streams::new(readers.into_iter().map(Some).collect(), vec![0, 1, 1]);
        let t0 = Instant::now();
        let reads = Reads {
            plan: &plan,
            limits: ReadLimits {
                timeout: Duration::from_secs(20),
                deadline: None,
            },
            got: &AtomicU64::new(0),
            checks: &ChunkChecks::new(false, 2),
        };
        let missing = receive_round(&mut buf, &mut state, reads, Which::All).unwrap();
        let took = t0.elapsed();
        assert!(missing.is_empty());
        assert!(
            took >= SILENT_AFTER_LANDED && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert!(state.dead[1].as_deref().unwrap().contains("no end marker"));
        assert!(state.dead[0].is_none() && state.dead[2].is_none());
        assert_eq!(&buf[100..], &[1u8; 100][..]);
    }

    #[test]
    fn a_frame_that_is_no_chunk_of_the_plan_is_a_protocol_error() {
        let plan = ChunkPlan::new(4 * 100, 100).unwrap();
        for bad in [
            Frame {
                offset: 50,
                len: 100,
                crc: 0,
            },
            Frame {
                offset: 400,
                len: 100,
                crc: 0,
            },
            Frame {
                offset: 100,
                len: 99,
                crc: 0,
            },
        ] {
            let (mut senders, readers) = pairs(1);
            senders[0].write_all(&bad.encode()).unwrap();
            let mut buf = vec![0u8; 400];
            let reads = Reads {
                plan: &plan,
                limits: limits(),
                got: &AtomicU64::new(0),
                checks: &ChunkChecks::new(false, 4),
            };
            let mut state = Streams::new(readers.into_iter().map(Some).collect(), vec![0]);
            let e = receive_round(&mut buf, &mut state, reads, Which::All).unwrap_err();
            assert!(
                matches!(e, Stop::Broken(ref w) if w.contains("protocol error")),
                "{e:?}"
            );
        }
    }
}
