//! The reader threads of a TCP receiver and what they share with the engine's thread:
//! the pass expected (which items, where each lands), the claims that make an item's
//! place one reader's alone, the staging ring's free slots, and the reports the readers
//! send. `recv.rs` is the link over them.

use super::frames::{Frame, FrameKind, Unread, FRAME_LEN};
use super::socket;
use crate::net::MAX_MESSAGE;
use crate::transfer::plan::ChunkPlan;
use std::collections::VecDeque;
use std::io::Read;
use std::net::TcpStream;
use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// An item's state in the current pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    NotExpected,
    Expected,
    /// A reader is writing it.
    Claimed,
    Landed,
}

/// Where items land.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Place {
    /// Between transfers: no item may land.
    None,
    /// Host memory at this address and length.
    Host { base: usize, len: usize },
    /// Slots of a page-locked ring (base, length each), copied into GPU memory by the
    /// engine's thread.
    Staged { slots: Vec<(usize, usize)> },
}

/// What the current pass expects.
#[derive(Debug)]
pub(crate) enum Expected {
    /// Nothing (between passes): a frame waits for the next pass.
    Nothing,
    /// One rail: stream `s` of `n` carries the pass's items at positions `s`, `s + n`, ...
    /// in order (the sender deals them out so), so each reader knows what comes next and
    /// nothing per item is kept: a transfer of 2^28 tiny chunks costs its buffer.
    Fixed {
        plan: ChunkPlan,
        /// The items of the pass, increasing; `None`: all of the plan's.
        list: Option<Vec<u32>>,
        /// Each stream's next position.
        next: Vec<u64>,
    },
    /// Several rails: any item on any stream, placed by its offset, each once.
    Placed { plan: ChunkPlan, states: Vec<State> },
}

pub(crate) struct Land {
    /// Which lending, and which pass of it: a claim is of one.
    pub(crate) epoch: u64,
    pub(crate) place: Place,
    /// With checksums, readers in host memory take each item's CRC32C as it lands.
    pub(crate) checksum: bool,
    pub(crate) expected: Expected,
    /// Readers inside an item's place (host), or holding a slot (staged).
    pub(crate) holders: u32,
    pub(crate) free_slots: VecDeque<usize>,
    /// The connection is closing: no frame waits for a pass any more.
    pub(crate) closing: bool,
}

pub(crate) struct Shared {
    pub(crate) land: Mutex<Land>,
    /// Notified when a holder leaves, and when a slot comes free.
    pub(crate) changed: Condvar,
    /// Bytes taken off the sockets so far, all streams: progress however the bytes
    /// trickle, for the engine's waits.
    pub(crate) bytes_in: std::sync::atomic::AtomicU64,
    /// The sender's messages read and not yet taken by the link.
    pub(crate) unread: Unread,
}

impl Shared {
    /// Read exactly `buf.len()` bytes from `stream`, counting each read as it comes.
    pub(crate) fn read(&self, mut stream: &TcpStream, mut buf: &mut [u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        while !buf.is_empty() {
            match stream.read(buf) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    buf = &mut buf[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Land> {
        self.land.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn leave(&self, land: &mut Land) {
        land.holders = land.holders.saturating_sub(1);
        self.changed.notify_all();
    }
}

/// A reader's claim on an item.
pub(crate) enum Claim {
    Host {
        index: u64,
        dest: usize,
        epoch: u64,
        checksum: bool,
    },
    Staged {
        index: u64,
        epoch: u64,
    },
    /// Landed or claimed already: read and dropped.
    Copy {
        index: u64,
    },
    Invalid(String),
}

impl Shared {
    /// Claim the item a frame of `len` bytes at `offset` is. A frame that comes while no
    /// pass is expected (its sender answered before the engine said what it expects:
    /// the first pass right after the accept, a round right after its request) waits for
    /// the next pass, up to `wait`.
    pub(crate) fn claim(&self, stream: usize, offset: u64, len: u32, wait: Duration) -> Claim {
        let mut land = self.lock();
        let until = Instant::now() + wait;
        while matches!(land.expected, Expected::Nothing) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || land.closing {
                return Claim::Invalid(format!(
                    "protocol error: {len} bytes at offset {offset} while no data was due"
                ));
            }
            land = self
                .changed
                .wait_timeout(land, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let index = match &mut land.expected {
            Expected::Nothing => return Claim::Invalid("no pass".into()),
            Expected::Fixed { plan, list, next } => {
                let n = next.len() as u64;
                let Some(p) = next.get(stream).copied() else {
                    return Claim::Invalid(format!("protocol error: data on stream {stream}"));
                };
                let count = list.as_ref().map_or(plan.count(), |l| l.len() as u64);
                let due = (p < count)
                    .then(|| list.as_ref().map_or(p, |l| l[p as usize] as u64))
                    .and_then(|i| plan.get(i));
                match due {
                    Some(c) if c.offset == offset && c.len == len as u64 => {
                        next[stream] = p + n;
                        c.index
                    }
                    Some(c) => {
                        return Claim::Invalid(format!(
                            "protocol error: a frame of {len} bytes at offset {offset} where chunk {} ({} bytes at {}) was due",
                            c.index, c.len, c.offset
                        ))
                    }
                    None => {
                        return Claim::Invalid(format!(
                            "protocol error: a frame of {len} bytes at offset {offset} after every item due on stream {stream}"
                        ))
                    }
                }
            }
            Expected::Placed { plan, states } => {
                let unit = plan.chunk_bytes();
                let index = offset / unit;
                let fits = offset.is_multiple_of(unit)
                    && plan.get(index).is_some_and(|c| c.len == len as u64);
                match states.get(index as usize).copied() {
                    Some(State::Expected) if fits => {
                        states[index as usize] = State::Claimed;
                        index
                    }
                    Some(State::Claimed | State::Landed) if fits => return Claim::Copy { index },
                    _ => {
                        return Claim::Invalid(format!(
                            "protocol error: a frame of {len} bytes at offset {offset}, which is no item due in this pass"
                        ))
                    }
                }
            }
        };
        let epoch = land.epoch;
        let claim = match land.place {
            Place::Host { base, len: size } if offset + len as u64 <= size as u64 => Claim::Host {
                index,
                dest: base + offset as usize,
                epoch,
                checksum: land.checksum,
            },
            Place::Staged { .. } => Claim::Staged { index, epoch },
            _ => {
                return Claim::Invalid(format!(
                    "protocol error: {len} bytes at offset {offset} outside the receive buffer"
                ))
            }
        };
        land.holders += 1;
        claim
    }

    /// Set item `index`'s state in the pass of `epoch` (items placed by offset only).
    pub(crate) fn set_state(land: &mut Land, index: u64, epoch: u64, state: State) {
        if land.epoch != epoch {
            return;
        }
        if let Expected::Placed { states, .. } = &mut land.expected {
            if let Some(s) = states.get_mut(index as usize) {
                *s = state;
            }
        }
    }

    /// A host claim ends: landed, or (a failed read) expected again.
    pub(crate) fn finish(&self, index: u64, epoch: u64, landed: bool) {
        let mut land = self.lock();
        let state = if landed {
            State::Landed
        } else {
            State::Expected
        };
        Self::set_state(&mut land, index, epoch, state);
        self.leave(&mut land);
    }

    /// A free slot of the ring of lending `epoch`, waiting for one; `None` once that
    /// lending is over. The caller is counted as a holder already (its claim).
    pub(crate) fn take_slot(&self, epoch: u64) -> Option<(usize, usize, usize)> {
        let mut land = self.lock();
        loop {
            if land.epoch != epoch {
                return None;
            }
            let Place::Staged { slots } = &land.place else {
                return None;
            };
            let slots = slots.clone();
            if let Some(slot) = land.free_slots.pop_front() {
                let (base, len) = slots[slot];
                return Some((slot, base, len));
            }
            land = self
                .changed
                .wait_timeout(land, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// What the threads report.
pub(crate) enum Report {
    Landed {
        stream: usize,
        index: u64,
        sent_crc: u32,
        landed_crc: Option<u32>,
    },
    /// A slot filled with `len` bytes for `offset` of item `index` (staged);
    /// `last`: the item's last.
    Filled {
        stream: usize,
        index: u64,
        slot: usize,
        offset: usize,
        len: usize,
        last: bool,
        sent_crc: u32,
        epoch: u64,
    },
    Copy {
        stream: usize,
        index: u64,
    },
    Message {
        stream: usize,
        bytes: Vec<u8>,
    },
    End {
        stream: usize,
        failed: u32,
    },
    Failed {
        stream: usize,
        why: String,
    },
}

/// A reader thread: take frames from stream `s` until it ends or breaks.
pub(crate) fn read_stream(
    s: usize,
    stream: &TcpStream,
    tx: &mpsc::Sender<Report>,
    shared: &Shared,
    timeout: Duration,
) {
    let fail = |why: String| {
        let _ = tx.send(Report::Failed { stream: s, why });
    };
    let mut scratch = Vec::new();
    loop {
        let mut head = [0u8; FRAME_LEN];
        if let Err(e) = shared.read(stream, &mut head) {
            return fail(socket::why(&e, Duration::ZERO, "waiting for data"));
        }
        let report = match Frame::decode(&head).kind() {
            FrameKind::Control { len, crc } => {
                if len as usize > MAX_MESSAGE {
                    return fail(format!("protocol error: a message of {len} bytes"));
                }
                if let Err(why) = shared.unread.hold(len as usize, "sender") {
                    return fail(why);
                }
                let mut bytes = vec![0u8; len as usize];
                if let Err(e) = shared.read(stream, &mut bytes) {
                    return fail(socket::why(&e, Duration::ZERO, "reading a message"));
                }
                if crate::integrity::crc32c(&bytes) != crc {
                    return fail("a message from the sender failed its CRC32C".into());
                }
                Report::Message { stream: s, bytes }
            }
            FrameKind::End { failed } => Report::End { stream: s, failed },
            FrameKind::Item { offset, len, crc } => match shared.claim(s, offset, len, timeout) {
                Claim::Invalid(why) => return fail(why),
                Claim::Copy { index } => {
                    let mut left = len as usize;
                    scratch.resize(left.min(1 << 20), 0);
                    while left > 0 {
                        let n = left.min(scratch.len());
                        if let Err(e) = shared.read(stream, &mut scratch[..n]) {
                            return fail(socket::why(&e, Duration::ZERO, "reading a copy"));
                        }
                        left -= n;
                    }
                    Report::Copy { stream: s, index }
                }
                Claim::Host {
                    index,
                    dest,
                    epoch,
                    checksum,
                } => {
                    // SAFETY: the claim makes [dest, dest + len) this reader's alone: it
                    // lies inside the lent host memory (checked in claim), no other reader
                    // claims the item this pass, and the lending is not taken back while
                    // this reader holds the claim (finish ends it).
                    let place =
                        unsafe { std::slice::from_raw_parts_mut(dest as *mut u8, len as usize) };
                    match shared.read(stream, place) {
                        Ok(()) => {
                            let landed_crc = checksum.then(|| crate::integrity::crc32c(place));
                            shared.finish(index, epoch, true);
                            Report::Landed {
                                stream: s,
                                index,
                                sent_crc: crc,
                                landed_crc,
                            }
                        }
                        Err(e) => {
                            shared.finish(index, epoch, false);
                            return fail(socket::why(
                                &e,
                                Duration::ZERO,
                                &format!("reading item {index}"),
                            ));
                        }
                    }
                }
                Claim::Staged { index, epoch } => {
                    match fill_slots(s, stream, tx, shared, index, offset, len, crc, epoch) {
                        Ok(()) => continue,
                        Err(why) => return fail(why),
                    }
                }
            },
        };
        if tx.send(report).is_err() {
            return;
        }
    }
}

/// Read item `index` (`len` bytes at `offset`) into slots of the ring, handing each to
/// the engine's thread as it fills; the claim ends (holder gone) when the last slot is
/// handed over, or on an error.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fill_slots(
    s: usize,
    stream: &TcpStream,
    tx: &mpsc::Sender<Report>,
    shared: &Shared,
    index: u64,
    offset: u64,
    len: u32,
    crc: u32,
    epoch: u64,
) -> Result<(), String> {
    let leave = |landed: bool| {
        let mut land = shared.lock();
        if !landed {
            Shared::set_state(&mut land, index, epoch, State::Expected);
        }
        shared.leave(&mut land);
    };
    let mut done = 0usize;
    let len = len as usize;
    while done < len {
        let Some((slot, base, slot_len)) = shared.take_slot(epoch) else {
            leave(false);
            return Err("the transfer ended while an item was arriving".into());
        };
        let n = (len - done).min(slot_len);
        // SAFETY: the slot came off the free list, so this reader alone holds it until it
        // hands it over below; [base, base + n) lies inside it (n <= its length), and the
        // ring is not freed while a holder is counted (the lending's takeback waits).
        let bytes = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, n) };
        if let Err(e) = shared.read(stream, bytes) {
            shared.lock().free_slots.push_back(slot);
            leave(false);
            return Err(socket::why(
                &e,
                Duration::ZERO,
                &format!("reading item {index}"),
            ));
        }
        let last = done + n == len;
        let report = Report::Filled {
            stream: s,
            index,
            slot,
            offset: offset as usize + done,
            len: n,
            last,
            sent_crc: crc,
            epoch,
        };
        if tx.send(report).is_err() {
            leave(false);
            return Err("the connection is closing".into());
        }
        done += n;
    }
    leave(true);
    Ok(())
}
