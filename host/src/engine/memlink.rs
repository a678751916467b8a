//! The engine's tests without a network: an in-memory link of N rails between two
//! threads (the sender's end copies each item out of the source as it is posted, the
//! receiver's copies it into the landing buffer), with faults a test sets per rail: a
//! rail cut after some items (with items reported sent that never arrive, as a TCP
//! kernel buffer loses them), and bits flipped in some items after their CRC32C. The
//! engine runs over it exactly as over TCP or verbs: the sender's passes and
//! conversation ([`super::send`]), the receiver's passes, checks and repair
//! ([`super::recv`]).

use super::cooldown::Cooldowns;
use super::receiving::Receiving;
use super::recv::{self, Terms};
use super::send::{self, Facts, RailName, Shape};
use super::sending::Sending;
use crate::memory::{HostBuffer, RecvSink};
use crate::memory_path::AttemptLog;
use crate::net::{Caps, Item, LinkError, Rail, RecvEvent, RecvLink, SendEvent, SendLink, Which};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::{PayloadOptions, RecvReport, SendReport, TransferError};
use crate::wire::{Header, Op, Payload, VerifyMode};
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What travels to the receiver on a rail.
enum Frame {
    Item {
        index: u64,
        bytes: Vec<u8>,
        crc: u32,
    },
    Message(Vec<u8>),
    End {
        failed: u32,
    },
}

/// A rail's faults.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// The rail breaks after this many items; the next `lost` are reported sent and
    /// never arrive.
    cut_after: Option<(u64, u64)>,
    /// One item in this many (by index and attempt) arrives with a bit flipped.
    flip_one_in: Option<u64>,
}

struct RailWire {
    to_recv: Mutex<VecDeque<Frame>>,
    to_send: Mutex<VecDeque<Vec<u8>>>,
    down: AtomicBool,
    items: AtomicU64,
    faults: Faults,
}

/// Both ends' shared rails.
struct Wire {
    rails: Vec<RailWire>,
}

impl Wire {
    fn new(faults: &[Faults]) -> Arc<Wire> {
        Arc::new(Wire {
            rails: faults
                .iter()
                .map(|&faults| RailWire {
                    to_recv: Mutex::new(VecDeque::new()),
                    to_send: Mutex::new(VecDeque::new()),
                    down: AtomicBool::new(false),
                    items: AtomicU64::new(0),
                    faults,
                })
                .collect(),
        })
    }
}

fn flips(one_in: u64, index: u64, attempt: u32) -> bool {
    let h = index.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (attempt as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    (h >> 17).is_multiple_of(one_in)
}

struct MemSender {
    wire: Arc<Wire>,
    source: (NonNull<u8>, usize),
    events: Vec<SendEvent>,
    told_down: Vec<bool>,
}

impl MemSender {
    fn send_item(&mut self, rail: Rail, item: &Item, bytes: &[u8]) -> Result<(), LinkError> {
        let w = &self.wire.rails[rail];
        if w.down.load(Ordering::SeqCst) {
            return Err(LinkError("down".into()));
        }
        let n = w.items.fetch_add(1, Ordering::SeqCst);
        let crc = item.crc.unwrap_or_else(|| crate::integrity::crc32c(bytes));
        let mut bytes = bytes.to_vec();
        if let Some(k) = w.faults.flip_one_in {
            if flips(k, item.index, item.attempt) && !bytes.is_empty() {
                bytes[0] ^= 1;
            }
        }
        match w.faults.cut_after {
            Some((after, lost)) if n >= after => {
                if n >= after + lost {
                    w.down.store(true, Ordering::SeqCst);
                    return Err(LinkError(format!("rail {rail} cut")));
                }
                // Reported sent, never arrives.
            }
            _ => w.to_recv.lock().unwrap().push_back(Frame::Item {
                index: item.index,
                bytes,
                crc,
            }),
        }
        self.events.push(SendEvent::Sent {
            rail,
            pass: item.pass,
            items: vec![item.index],
            crcs: vec![crc],
        });
        Ok(())
    }
}

// SAFETY: every item's bytes are copied out of the source in `post`, before it returns;
// nothing reads them later.
unsafe impl SendLink for MemSender {
    fn rails(&self) -> usize {
        self.wire.rails.len()
    }
    fn caps(&self) -> Caps {
        Caps::STREAM
    }
    /// # Safety
    /// As [`SendLink::post`] says.
    unsafe fn post(&mut self, rail: Rail, items: &[Item]) -> Result<(), LinkError> {
        for item in items {
            assert!(item.bytes.end <= self.source.1);
            // SAFETY: the range lies in the source (checked), valid until reported (the
            // caller's promise); copied at once.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    self.source.0.as_ptr().add(item.bytes.start),
                    item.bytes.len(),
                )
            };
            self.send_item(rail, item, bytes)?;
        }
        Ok(())
    }
    fn post_copy(&mut self, rail: Rail, item: Item, bytes: Arc<[u8]>) -> Result<(), LinkError> {
        self.send_item(rail, &item, &bytes)
    }
    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        let w = &self.wire.rails[rail];
        if w.down.load(Ordering::SeqCst) {
            return Err(LinkError("down".into()));
        }
        w.to_recv
            .lock()
            .unwrap()
            .push_back(Frame::Message(bytes.to_vec()));
        Ok(())
    }
    fn end_pass(&mut self, failed: u32) -> Result<(), LinkError> {
        for w in self
            .wire
            .rails
            .iter()
            .filter(|w| !w.down.load(Ordering::SeqCst))
        {
            w.to_recv.lock().unwrap().push_back(Frame::End { failed });
        }
        Ok(())
    }
    fn poll(&mut self, wait: Duration, out: &mut Vec<SendEvent>) -> Result<(), LinkError> {
        let deadline = Instant::now() + wait;
        loop {
            out.append(&mut self.events);
            for (r, w) in self.wire.rails.iter().enumerate() {
                if let Some(m) = w.to_send.lock().unwrap().pop_front() {
                    out.push(SendEvent::Message { rail: r, bytes: m });
                }
                if w.down.load(Ordering::SeqCst) && !self.told_down[r] {
                    self.told_down[r] = true;
                    out.push(SendEvent::Down {
                        rail: r,
                        why: format!("rail {r} cut"),
                    });
                    out.push(SendEvent::Quiet { rail: r });
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    fn give_up(&mut self, rail: Rail) {
        self.wire.rails[rail].down.store(true, Ordering::SeqCst);
    }
    fn drain(&mut self) {}
}

struct MemReceiver {
    wire: Arc<Wire>,
    /// Says [`Caps::peer_writes_in_place`], as a verbs WRITE link does.
    peer_writes: bool,
    landing: (NonNull<u8>, usize),
    expecting: Option<(ChunkPlan, Option<Vec<u32>>, Vec<bool>)>,
    held: Vec<(Rail, Frame)>,
    told_down: Vec<bool>,
    bytes_in: u64,
}

impl MemReceiver {
    fn take(&mut self, rail: Rail, frame: Frame, out: &mut Vec<RecvEvent>) {
        match frame {
            Frame::Message(bytes) => out.push(RecvEvent::Message { rail, bytes }),
            Frame::End { failed } => out.push(RecvEvent::PassEnded { rail, failed }),
            Frame::Item { index, bytes, crc } => {
                let Some((plan, only, landed)) = self.expecting.as_mut() else {
                    self.held.push((rail, Frame::Item { index, bytes, crc }));
                    return;
                };
                let position = match only {
                    None => Some(index as usize).filter(|&p| p < landed.len()),
                    Some(list) => list.binary_search(&(index as u32)).ok(),
                };
                let Some(p) = position else {
                    return;
                };
                if std::mem::replace(&mut landed[p], true) {
                    out.push(RecvEvent::Copy { rail, index });
                    return;
                }
                let chunk = plan.get(index).expect("in the plan");
                assert_eq!(chunk.len as usize, bytes.len());
                assert!(chunk.end() as usize <= self.landing.1);
                // SAFETY: the item's place lies in the landing buffer (checked); it is
                // expected and not landed, so the engine does not read it now.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr(),
                        self.landing.0.as_ptr().add(chunk.offset as usize),
                        bytes.len(),
                    )
                };
                self.bytes_in += bytes.len() as u64;
                out.push(RecvEvent::Landed {
                    rail,
                    index,
                    sent_crc: Some(crc),
                    landed_crc: None,
                });
            }
        }
    }
}

// SAFETY: an item is written only at its place, while expected and not landed.
unsafe impl RecvLink for MemReceiver {
    fn rails(&self) -> usize {
        self.wire.rails.len()
    }
    fn caps(&self) -> Caps {
        Caps {
            peer_writes_in_place: self.peer_writes,
            ..Caps::STREAM
        }
    }
    fn expect(&mut self, plan: &ChunkPlan, which: Which<'_>) -> Result<(), LinkError> {
        let only = match which {
            Which::All => None,
            Which::Only(l) => Some(l.to_vec()),
        };
        self.expecting = Some((*plan, only, vec![false; which.count(plan) as usize]));
        Ok(())
    }
    fn expect_none(&mut self) {
        self.expecting = None;
    }
    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        self.wire.rails[rail]
            .to_send
            .lock()
            .unwrap()
            .push_back(bytes.to_vec());
        Ok(())
    }
    fn poll(&mut self, wait: Duration, out: &mut Vec<RecvEvent>) -> Result<(), LinkError> {
        let deadline = Instant::now() + wait;
        loop {
            if self.expecting.is_some() {
                for (rail, frame) in std::mem::take(&mut self.held) {
                    self.take(rail, frame, out);
                }
            }
            for r in 0..self.wire.rails.len() {
                let frames: Vec<Frame> = self.wire.rails[r]
                    .to_recv
                    .lock()
                    .unwrap()
                    .drain(..)
                    .collect();
                for f in frames {
                    self.take(r, f, out);
                }
                if self.wire.rails[r].down.load(Ordering::SeqCst) && !self.told_down[r] {
                    self.told_down[r] = true;
                    out.push(RecvEvent::Down {
                        rail: r,
                        why: "cut".into(),
                    });
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    fn give_up(&mut self, _rail: Rail) {}
    fn bytes_in(&self) -> u64 {
        self.bytes_in
    }
    fn close(&mut self) {}
}

/// A transfer of `len` bytes in `chunk`-byte chunks over rails with `faults`, checked by
/// checksum (with pieces) or by the pattern: the sender's reports, and the receiver's
/// report or error.
fn run(
    len: usize,
    chunk: u64,
    faults: &[Faults],
    checksum: bool,
    max_resends: u8,
) -> (
    Result<Vec<SendReport>, TransferError>,
    Result<RecvReport, TransferError>,
) {
    run_with(len, chunk, faults, checksum, max_resends, Side::default())
}

/// The receiver's side of a [`run_with`]: what its link says of itself, a peer that
/// writes its buffer after the check, where it stores what it received.
#[derive(Default)]
struct Side {
    peer_writes: bool,
    /// Flip the byte at this offset of the receive buffer right after the engine
    /// computed its chunks' CRC32Cs (a lying sender's RDMA WRITE after its check).
    written_after_check: Option<usize>,
    output: Option<crate::transfer::store::Output>,
}

/// The receive buffer, written at one byte by the peer right after its first check.
struct WrittenAfterCheck<'a> {
    buffer: &'a HostBuffer,
    at: Option<usize>,
    written: std::cell::Cell<bool>,
}

impl super::landed::Landed for WrittenAfterCheck<'_> {
    fn len(&self) -> usize {
        RecvSink::len(self.buffer)
    }
    fn poison(&self) -> anyhow::Result<()> {
        RecvSink::poison(self.buffer)
    }
    fn verify(&self, len: usize) -> anyhow::Result<crate::memory::Verification> {
        RecvSink::verify(self.buffer, len)
    }
    fn crc32c_chunks(
        &self,
        range: std::ops::Range<usize>,
        chunk: usize,
    ) -> anyhow::Result<Vec<u32>> {
        let crcs = RecvSink::crc32c_chunks(self.buffer, range, chunk)?;
        if let Some(at) = self.at.filter(|_| !self.written.replace(true)) {
            let (ptr, len) = self.buffer.raw_parts();
            assert!(at < len);
            // SAFETY: `at` lies in the buffer (checked); nothing else reads or writes it
            // while the engine is in this call, on this thread.
            unsafe { *ptr.as_ptr().add(at) ^= 0x20 };
        }
        Ok(crcs)
    }
    fn write_to(&self, len: usize, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
        RecvSink::write_to(self.buffer, len, out)
    }
    fn first_values(&self, count: usize) -> anyhow::Result<Vec<i32>> {
        RecvSink::first_values(self.buffer, count)
    }
    fn path(&self) -> crate::memory::DataPath {
        RecvSink::path(self.buffer)
    }
}

/// [`run`] with the receiver's [`Side`].
fn run_with(
    len: usize,
    chunk: u64,
    faults: &[Faults],
    checksum: bool,
    max_resends: u8,
    side: Side,
) -> (
    Result<Vec<SendReport>, TransferError>,
    Result<RecvReport, TransferError>,
) {
    let wire = Wire::new(faults);
    let verify = if checksum {
        VerifyMode::Checksum
    } else {
        VerifyMode::Pattern
    };
    let payload = PayloadOptions {
        payload: Payload::Pattern,
        verify,
        max_resends,
        name: None,
        faults: None,
    };
    let plan = ChunkPlan::new(len as u64, chunk).unwrap();
    let mut header = Header::of(
        Op::Send,
        len as u64,
        plan.chunk_bytes(),
        8,
        Payload::Pattern,
    )
    .and_then(|h| h.with_payload(Payload::Pattern, verify, max_resends))
    .unwrap();
    if checksum {
        header = header.with_pieces();
    }
    if faults.len() > 1 {
        header = header.with_rails(faults.len() as u8).unwrap();
    }
    let timeout = Duration::from_secs(5);
    let receiver = {
        let wire = wire.clone();
        std::thread::spawn(move || {
            let landing = HostBuffer::poisoned(len).unwrap();
            let mut link = MemReceiver {
                told_down: vec![false; wire.rails.len()],
                peer_writes: side.peer_writes,
                wire,
                landing: landing.raw_parts(),
                expecting: None,
                held: Vec::new(),
                bytes_in: 0,
            };
            let terms = Terms {
                peer: "sender",
                header,
                name: None,
                timeout,
                min_rate: 0,
                accepted_at: Instant::now(),
                output: side.output.as_ref(),
                op: "mem",
                memory: AttemptLog::default(),
                rails_from: Vec::new(),
            };
            let landed = WrittenAfterCheck {
                buffer: &landing,
                at: side.written_after_check,
                written: std::cell::Cell::new(false),
            };
            let received = {
                let mut r = Receiving::new(&mut link, timeout);
                recv::transfers(&mut r, &landed, &terms)
            };
            if let Some(ack) = received.last_ack {
                link.send_message(0, &ack.encode()).unwrap();
            }
            match received.error {
                Some(e) => Err(e),
                None => Ok(received.report),
            }
        })
    };
    let source = HostBuffer::with_pattern(len).unwrap();
    let mut link = MemSender {
        told_down: vec![false; wire.rails.len()],
        wire: wire.clone(),
        source: source.raw_parts(),
        events: Vec::new(),
    };
    let names: Vec<RailName> = (0..faults.len())
        .map(|k| RailName {
            local: None,
            remote: format!("rail {k}"),
            label: format!("mem {k}"),
        })
        .collect();
    let connected: Vec<usize> = (0..faults.len()).collect();
    let facts = Facts {
        peer: "receiver",
        device: None,
        op: "mem",
        connect_seconds: 0.0,
        memory: &AttemptLog::default(),
        rails: &names,
        connected: &connected,
        left_out: &[],
        cooldowns: &Cooldowns::new(),
    };
    let shape = Shape {
        header: &header,
        plan,
        depth: 8,
        timeout,
        progress: false,
        payload: &payload,
        transfers: 1,
    };
    let sent = {
        let mut sending = Sending::new(&mut link, Duration::from_millis(300));
        send::transfers(&mut sending, &source, &shape, &facts)
    };
    // A sender that failed leaves the receiver to its timeout: close its rails.
    if sent.is_err() {
        for w in &wire.rails {
            w.down.store(true, Ordering::SeqCst);
        }
    }
    (sent, receiver.join().unwrap())
}

const MIB: usize = 1 << 20;

#[test]
fn three_clean_rails_carry_a_transfer_that_verifies() {
    let (sent, got) = run(8 * MIB + 12, 64 << 10, &[Faults::default(); 3], true, 3);
    let sent = sent.unwrap();
    let got = got.unwrap();
    assert!(got.ok(), "{got:?}");
    let carried: Vec<u64> = sent[0].rails.iter().map(|r| r.chunks).collect();
    assert!(
        carried.iter().all(|&c| c > 0),
        "every rail carried chunks: {carried:?}"
    );
    assert_eq!(carried.iter().sum::<u64>(), got.chunks);
}

#[test]
fn a_rail_cut_mid_pass_with_items_lost_is_failed_over_and_the_missing_asked_again() {
    let cut = Faults {
        cut_after: Some((20, 5)),
        ..Faults::default()
    };
    let (sent, got) = run(8 * MIB, 64 << 10, &[Faults::default(), cut], false, 3);
    let sent = sent.unwrap();
    let got = got.unwrap();
    assert!(got.ok(), "{got:?}");
    let failed = &sent[0].rails[1];
    assert_eq!(failed.failures, 1, "{failed:?}");
    let striped = got.striped.as_ref().unwrap();
    assert!(
        striped.asked_again >= 1,
        "the lost items were asked for again: {striped:?}"
    );
}

#[test]
fn repair_converges_when_one_item_in_three_arrives_corrupt() {
    let lossy = Faults {
        flip_one_in: Some(3),
        ..Faults::default()
    };
    let (sent, got) = run(4 * MIB + 20, 256 << 10, &[lossy, lossy], true, 16);
    let sent = sent.unwrap();
    let got = got.unwrap();
    assert!(got.ok(), "{got:?}");
    assert!(
        !sent[0].integrity.repaired.is_empty(),
        "chunks were repaired"
    );
    assert_eq!(
        got.integrity.repaired.len(),
        sent[0].integrity.repaired.len()
    );
}

#[test]
fn every_item_corrupt_fails_in_bounded_time_naming_the_chunks() {
    let broken = Faults {
        flip_one_in: Some(1),
        ..Faults::default()
    };
    let t = Instant::now();
    let (sent, got) = run(MIB, 256 << 10, &[broken], true, 3);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    match sent {
        Err(TransferError::ChecksumFailed { chunks, .. }) => assert!(!chunks.is_empty()),
        other => panic!("expected a checksum failure, got {other:?}"),
    }
    if let Ok(r) = got {
        assert!(
            !r.ok(),
            "the receiver's report says the chunks failed: {r:?}"
        );
    }
}

#[test]
fn every_rail_cut_ends_the_transfer_with_an_error_not_a_hang() {
    let cut = Faults {
        cut_after: Some((3, 0)),
        ..Faults::default()
    };
    let t = Instant::now();
    let (sent, got) = run(8 * MIB, 64 << 10, &[cut, cut], false, 3);
    assert!(sent.is_err(), "{sent:?}");
    assert!(got.is_err(), "{got:?}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// A peer whose NIC writes the buffer after its chunks passed (a lying RDMA WRITE): the
/// bytes stored must be those checked, so the store is refused, nothing of the changed
/// chunk is handed on, and the ack says not stored. Over a link whose peer cannot write
/// after landing the check is not made (nothing to fear there).
#[test]
fn a_buffer_written_after_its_check_is_not_stored() {
    let len = 4 * MIB + 8;
    let (tx, rx) = std::sync::mpsc::channel();
    let side = Side {
        peer_writes: true,
        written_after_check: Some(2 * MIB + 7),
        output: Some(crate::transfer::store::Output::Memory(tx)),
    };
    let (_sent, got) = run_with(len, 256 << 10, &[Faults::default()], true, 3, side);
    let got = got.unwrap();
    let why = got.integrity.store_error.clone().unwrap_or_default();
    assert!(
        why.contains("chunk 8 changed after its CRC32C passed"),
        "the store should have been refused: {got:?}"
    );
    assert!(got.integrity.stored.is_none(), "{got:?}");
    assert!(rx.try_recv().is_err(), "nothing was handed on");

    // The same peer, honest: stored, every byte the pattern's.
    let (tx, rx) = std::sync::mpsc::channel();
    let side = Side {
        peer_writes: true,
        written_after_check: None,
        output: Some(crate::transfer::store::Output::Memory(tx)),
    };
    let (sent, got) = run_with(len, 256 << 10, &[Faults::default()], true, 3, side);
    assert!(sent.unwrap()[0].verified());
    assert_eq!(got.unwrap().integrity.stored.as_deref(), Some("memory"));
    let (_, bytes) = rx.try_recv().unwrap();
    assert_eq!(
        bytes,
        HostBuffer::with_pattern(len).unwrap().read_prefix(len)
    );
}
