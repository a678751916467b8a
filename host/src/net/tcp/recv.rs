//! The receiver's end of a TCP connection: one reader thread per stream for the life of
//! the connection, each taking frames as they come: an item is placed by its offset in
//! the receive buffer the current transfer lent ([`TcpReceiver::with_landing`]), a
//! control message goes to the engine whole and checked, an end marker counts towards
//! its rail's end of the pass.
//!
//! A reader writes an item's place only after claiming it: the item must be one the
//! engine expects in this pass ([`RecvLink::expect`]), and not claimed or landed before
//! (a copy is read into scratch and dropped); anything else is a protocol error that
//! breaks the stream off. So nothing is ever written outside the expected places, each
//! at most once a pass, and a lending is taken back only once no reader holds a claim.
//!
//! Host memory is written in place straight from the socket, and each item's CRC32C
//! taken there while the bytes are in cache. GPU memory (the `cuda` feature) goes
//! through a page-locked ring: readers fill slots, the engine's thread (which owns the
//! GPU) queues each slot's copy into device memory in `poll` and reports the item once
//! its last copy landed; the checksum kernel then checks it where it lies.

use super::frames::{Frame, Unread};
use super::readers::{read_stream, Expected, Land, Place, Report, Shared, State};
use super::socket;
use crate::net::{Caps, LinkError, Rail, RecvEvent, RecvLink, Which, MAX_MESSAGE};
use crate::transfer::plan::ChunkPlan;
use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a taking-back of the receive buffer waits for readers still inside an item
/// (their sockets are shut first when the transfer failed, so they leave at once).
const TAKEBACK_WAIT: Duration = Duration::from_secs(30);

struct StreamSide {
    rail: Rail,
    /// The stream itself, shared with its reader (one descriptor a stream, as admission
    /// counts): shut to break the reader off.
    shutter: Arc<TcpStream>,
    ended: bool,
}

struct RailSide {
    streams: Vec<usize>,
    /// Where this side's messages go: the rail's first stream (none for a rail whose
    /// streams never came).
    control: Option<Arc<TcpStream>>,
    down: bool,
}

/// A slot's copy in flight (staged), in queue order.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct InFlight {
    slot: usize,
    index: u64,
    last: bool,
    rail: Rail,
    sent_crc: u32,
    epoch: u64,
}

/// A receiver's open TCP connection.
pub struct TcpReceiver {
    streams: Vec<StreamSide>,
    rails: Vec<RailSide>,
    readers: Vec<JoinHandle<()>>,
    reports: mpsc::Receiver<Report>,
    shared: Arc<Shared>,
    timeout: Duration,
    /// Rails that came without streams, not yet said down to the engine.
    unsaid: Vec<Rail>,
}

impl TcpReceiver {
    /// Start reading a connection whose streams are in: `rails[r]` is rail `r`'s streams,
    /// the first of each carrying this side's messages (an empty rail never came: it is
    /// down from the start). `timeout` bounds every write.
    pub fn start(rails: Vec<Vec<TcpStream>>, timeout: Duration) -> std::io::Result<TcpReceiver> {
        let shared = Arc::new(Shared {
            land: Mutex::new(Land {
                epoch: 0,
                place: Place::None,
                checksum: false,
                expected: Expected::Nothing,
                holders: 0,
                free_slots: VecDeque::new(),
                closing: false,
            }),
            changed: Condvar::new(),
            bytes_in: std::sync::atomic::AtomicU64::new(0),
            unread: Unread::default(),
        });
        let (tx, reports) = mpsc::channel();
        let mut conn = TcpReceiver {
            streams: Vec::new(),
            rails: Vec::new(),
            readers: Vec::new(),
            reports,
            shared,
            timeout,
            unsaid: Vec::new(),
        };
        for (r, streams) in rails.into_iter().enumerate() {
            let streams: Vec<Arc<TcpStream>> = streams.into_iter().map(Arc::new).collect();
            let control = streams.first().cloned();
            if control.is_none() {
                conn.unsaid.push(r);
            }
            let mut side = RailSide {
                streams: Vec::new(),
                down: control.is_none(),
                control,
            };
            for stream in streams {
                let s = conn.streams.len();
                // Readers wait as long as the connection lives; the engine bounds its
                // own waits and shuts the sockets to end them.
                stream.set_read_timeout(None)?;
                let shutter = stream.clone();
                let (tx, shared) = (tx.clone(), conn.shared.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("tcp-reader-{s}"))
                    .spawn(move || read_stream(s, &stream, &tx, &shared, timeout))?;
                conn.readers.push(thread);
                conn.streams.push(StreamSide {
                    rail: r,
                    shutter,
                    ended: false,
                });
                side.streams.push(s);
            }
            conn.rails.push(side);
        }
        Ok(conn)
    }

    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    /// Whether the connection can carry another transfer.
    pub fn usable(&self) -> bool {
        self.rails.iter().any(|r| !r.down)
    }

    /// Lend `landing` to the readers and run `f` with the link; returns once no reader
    /// writes it any more.
    pub fn with_landing<R>(
        &mut self,
        landing: Landing<'_>,
        checksum: bool,
        f: impl FnOnce(&mut dyn RecvLink) -> R,
    ) -> R {
        let place = match &landing {
            Landing::Host { ptr, len } => Place::Host {
                base: ptr.as_ptr() as usize,
                len: *len,
            },
            #[cfg(feature = "cuda")]
            Landing::Gpu(upload) => Place::Staged {
                slots: upload.borrow().slot_addresses(),
            },
            #[cfg(not(feature = "cuda"))]
            Landing::_Never(_, never) => match *never {},
        };
        {
            let mut land = self.shared.lock();
            land.epoch += 1;
            land.free_slots = match &place {
                Place::Staged { slots } => (0..slots.len()).collect(),
                _ => VecDeque::new(),
            };
            land.place = place;
            land.checksum = checksum;
            land.expected = Expected::Nothing;
        }
        let guard = Takeback {
            shared: self.shared.clone(),
            streams: self.streams.iter().map(|s| s.shutter.clone()).collect(),
        };
        let mut link = TcpRecvLink {
            conn: self,
            landing,
            in_flight: VecDeque::new(),
            closed: false,
        };
        let result = f(&mut link);
        let closed = link.closed;
        link.finish_copies();
        drop(link);
        guard.take_back(closed);
        result
    }

    /// Send the last ack of a connection (its memory given back already): on every live
    /// rail where there are several (the first that arrives is enough, so a rail whose
    /// far end went silent cannot hold it back), else on the one; whether any took it.
    pub fn send_last(&mut self, bytes: &[u8]) -> bool {
        let frame = Frame::control(bytes).encode();
        // Every rail is tried: no short cut after the first that takes it.
        (0..self.rails.len()).fold(false, |any, r| self.write_control(r, &frame, bytes) | any)
    }

    /// Send `bytes` as one message on the lowest live rail (the next if that one
    /// fails): between transfers of a kept connection, where a copy on every rail would
    /// be read as the next transfer's; whether a rail took it.
    pub fn send_message(&mut self, bytes: &[u8]) -> bool {
        let frame = Frame::control(bytes).encode();
        (0..self.rails.len()).any(|r| self.write_control(r, &frame, bytes))
    }

    /// Write a control message (its `frame`, then `bytes`) on rail `r`'s first stream;
    /// a rail that is down or refuses it (then stopped) did not take it.
    fn write_control(&mut self, r: Rail, frame: &[u8], bytes: &[u8]) -> bool {
        let side = &self.rails[r];
        let Some(control) = side.control.as_deref().filter(|_| !side.down) else {
            return false;
        };
        let deadline = socket::write_deadline(frame.len() + bytes.len(), self.timeout);
        let written = socket::write_all_within(control, &[frame, bytes], self.timeout, deadline);
        if written.is_err() {
            self.stop_rail(r);
        }
        written.is_ok()
    }

    /// The sender's next message between transfers (no landing lent), waiting until
    /// `deadline`. `None`: nothing came, every rail closed, or the sender sent something
    /// other than a message (data with no transfer offered): the connection is done.
    pub fn next_message(&mut self, deadline: Instant) -> Option<Vec<u8>> {
        loop {
            if !self.usable() {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .reports
                .recv_timeout(left.max(Duration::from_millis(1)))
            {
                Ok(Report::Message { bytes, .. }) => {
                    self.shared.unread.taken(bytes.len());
                    return Some(bytes);
                }
                Ok(Report::Failed { stream, .. }) => {
                    let rail = self.streams[stream].rail;
                    self.stop_rail(rail);
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() >= deadline => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    fn stop_rail(&mut self, rail: Rail) {
        let Some(side) = self.rails.get_mut(rail) else {
            return;
        };
        side.down = true;
        for &s in &side.streams {
            let _ = self.streams[s].shutter.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for TcpReceiver {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.changed.notify_all();
        for s in &self.streams {
            let _ = s.shutter.shutdown(Shutdown::Both);
        }
        for t in self.readers.drain(..) {
            let _ = t.join();
        }
    }
}

/// Where a transfer's items land.
pub enum Landing<'a> {
    /// Host memory at `ptr`, `len` bytes.
    Host {
        ptr: std::ptr::NonNull<u8>,
        len: usize,
    },
    /// GPU memory, through its upload ring (borrowed by the link inside its calls only:
    /// the receive loop checks the memory between them).
    #[cfg(feature = "cuda")]
    Gpu(&'a std::cell::RefCell<crate::gpu::upload::DeviceUpload>),
    #[doc(hidden)]
    #[cfg(not(feature = "cuda"))]
    _Never(std::marker::PhantomData<&'a ()>, std::convert::Infallible),
}

/// Takes the landing back from the readers.
struct Takeback {
    shared: Arc<Shared>,
    streams: Vec<Arc<TcpStream>>,
}

impl Takeback {
    /// No item may land from now on; wait until no reader writes. After a failure
    /// (`shut`), readers inside an item are broken off first.
    fn take_back(self, shut: bool) {
        if shut {
            for s in &self.streams {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        drop(self);
    }
}

impl Drop for Takeback {
    fn drop(&mut self) {
        let mut land = self.shared.lock();
        land.place = Place::None;
        land.expected = Expected::Nothing;
        land.epoch += 1;
        let until = Instant::now() + TAKEBACK_WAIT;
        while land.holders > 0 {
            if Instant::now() >= until {
                // A reader stuck inside an item past every timeout: break its socket
                // off, then wait for it as long as it takes (it must not outlive the
                // memory it writes).
                for s in &self.streams {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
            land = self
                .shared
                .changed
                .wait_timeout(land, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        self.shared.changed.notify_all();
    }
}

/// The link of one lending.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct TcpRecvLink<'c, 'l> {
    conn: &'c mut TcpReceiver,
    landing: Landing<'l>,
    in_flight: VecDeque<InFlight>,
    closed: bool,
}

impl TcpRecvLink<'_, '_> {
    /// Wait for every slot's copy (staged): the device memory then holds what landed.
    fn finish_copies(&mut self) {
        #[cfg(feature = "cuda")]
        if let Landing::Gpu(upload) = &self.landing {
            let _ = upload.borrow_mut().finish();
        }
        self.in_flight.clear();
    }

    /// Give back the slots whose copies landed, in order; report items whose last copy
    /// landed.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables, clippy::ptr_arg))]
    fn land_copies(&mut self, out: &mut Vec<RecvEvent>) -> Result<(), LinkError> {
        #[cfg(feature = "cuda")]
        if let Landing::Gpu(upload) = &self.landing {
            let mut upload = upload.borrow_mut();
            while let Some(front) = self.in_flight.front() {
                if !upload.copy_landed(front.slot).map_err(LinkError)? {
                    break;
                }
                let done = self.in_flight.pop_front().expect("front exists");
                let mut land = self.conn.shared.lock();
                if land.epoch == done.epoch {
                    land.free_slots.push_back(done.slot);
                    if done.last {
                        Shared::set_state(&mut land, done.index, done.epoch, State::Landed);
                        out.push(RecvEvent::Landed {
                            rail: done.rail,
                            index: done.index,
                            sent_crc: Some(done.sent_crc),
                            landed_crc: None,
                        });
                    }
                }
                self.conn.shared.changed.notify_all();
            }
        }
        Ok(())
    }

    /// Queue the copy of a filled slot (staged).
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn queue_copy(&mut self, slot: usize, offset: usize, len: usize) -> Result<(), LinkError> {
        #[cfg(feature = "cuda")]
        if let Landing::Gpu(upload) = &self.landing {
            // SAFETY: the reader handed the slot over with this report and takes no slot
            // but from the free list, where it goes back only once land_copies saw this
            // copy landed.
            return unsafe { upload.borrow_mut().queue_copy(slot, offset, len) }.map_err(LinkError);
        }
        Err(LinkError("a slot was filled without an upload ring".into()))
    }
}

// SAFETY: readers write an item's place only under a claim of the current lending and
// pass (`Shared::claim`), which expect() renews only once no reader holds one, and
// with_landing takes back only once none does; a copy or an item not expected is never
// written.
unsafe impl RecvLink for TcpRecvLink<'_, '_> {
    fn rails(&self) -> usize {
        self.conn.rails.len()
    }

    fn caps(&self) -> Caps {
        Caps::STREAM
    }

    fn expect(&mut self, plan: &ChunkPlan, which: Which<'_>) -> Result<(), LinkError> {
        let shared = self.conn.shared.clone();
        let mut land = shared.lock();
        // A reader still inside an item of the pass before (a rail being given up)
        // finishes first: the states are renewed only then.
        let until = Instant::now() + self.conn.timeout;
        while land.holders > 0 {
            if Instant::now() >= until {
                return Err(LinkError(
                    "a stream was still inside an item of the pass before".into(),
                ));
            }
            land = shared
                .changed
                .wait_timeout(land, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let count = usize::try_from(plan.count())
            .map_err(|_| LinkError("a pass of more items than memory holds".into()))?;
        land.epoch += 1;
        let streams = self.conn.streams.len();
        land.expected = match (self.conn.rails.len(), which) {
            (1, which) => Expected::Fixed {
                plan: *plan,
                list: match which {
                    Which::All => None,
                    Which::Only(list) => Some(list.to_vec()),
                },
                next: (0..streams as u64).collect(),
            },
            (_, Which::All) => Expected::Placed {
                plan: *plan,
                states: vec![State::Expected; count],
            },
            (_, Which::Only(list)) => {
                let mut states = vec![State::NotExpected; count];
                for &i in list {
                    if let Some(s) = states.get_mut(i as usize) {
                        *s = State::Expected;
                    }
                }
                Expected::Placed {
                    plan: *plan,
                    states,
                }
            }
        };
        // Slots that went back to the ring while the epoch changed are the ring's again.
        if let Place::Staged { slots } = &land.place {
            let n = slots.len();
            let held: Vec<usize> = self.in_flight.iter().map(|f| f.slot).collect();
            land.free_slots = (0..n).filter(|s| !held.contains(s)).collect();
        }
        for s in &mut self.conn.streams {
            s.ended = false;
        }
        drop(land);
        shared.changed.notify_all();
        Ok(())
    }

    fn expect_none(&mut self) {
        let mut land = self.conn.shared.lock();
        land.expected = Expected::Nothing;
        land.epoch += 1;
    }

    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        let timeout = self.conn.timeout;
        let Some(side) = self.conn.rails.get_mut(rail).filter(|s| !s.down) else {
            return Err(LinkError(format!("rail {rail} is down")));
        };
        if bytes.len() > MAX_MESSAGE {
            return Err(LinkError(format!("a message of {} bytes", bytes.len())));
        }
        let frame = Frame::control(bytes).encode();
        let Some(control) = side.control.as_deref() else {
            return Err(LinkError(format!("rail {rail} never came")));
        };
        // Bounded as a whole: a sender that reads its answers slowly (a few bytes now
        // and then) must not hold this receiver's transfer slot for ever.
        let deadline = socket::write_deadline(frame.len() + bytes.len(), timeout);
        let written = socket::write_all_within(control, &[&frame, bytes], timeout, deadline);
        written.map_err(|e| {
            let why = socket::why(&e, timeout, "sending a message to the sender");
            self.conn.stop_rail(rail);
            LinkError(why)
        })
    }

    fn poll(&mut self, wait: Duration, out: &mut Vec<RecvEvent>) -> Result<(), LinkError> {
        for rail in std::mem::take(&mut self.conn.unsaid) {
            out.push(RecvEvent::Down {
                rail,
                why: "its streams did not join within a moment of the others".into(),
            });
        }
        self.land_copies(out)?;
        // Copies in flight are looked at every 50 us; otherwise the reports are awaited.
        let wait = match self.in_flight.is_empty() {
            true => wait,
            false => wait.min(Duration::from_micros(50)),
        };
        let first = match self.conn.reports.recv_timeout(wait) {
            Ok(r) => Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(LinkError("the connection's readers are gone".into()))
            }
        };
        let reports: Vec<Report> = first
            .into_iter()
            .chain(self.conn.reports.try_iter())
            .collect();
        for report in reports {
            match report {
                Report::Landed {
                    stream,
                    index,
                    sent_crc,
                    landed_crc,
                } => out.push(RecvEvent::Landed {
                    rail: self.conn.streams[stream].rail,
                    index,
                    sent_crc: Some(sent_crc),
                    landed_crc,
                }),
                Report::Filled {
                    stream,
                    index,
                    slot,
                    offset,
                    len,
                    last,
                    sent_crc,
                    epoch,
                } => {
                    self.queue_copy(slot, offset, len)?;
                    self.in_flight.push_back(InFlight {
                        slot,
                        index,
                        last,
                        rail: self.conn.streams[stream].rail,
                        sent_crc,
                        epoch,
                    });
                }
                Report::Copy { stream, index } => out.push(RecvEvent::Copy {
                    rail: self.conn.streams[stream].rail,
                    index,
                }),
                Report::Message { stream, bytes } => {
                    self.conn.shared.unread.taken(bytes.len());
                    out.push(RecvEvent::Message {
                        rail: self.conn.streams[stream].rail,
                        bytes,
                    })
                }
                Report::End { stream, failed } => {
                    let rail = self.conn.streams[stream].rail;
                    self.conn.streams[stream].ended = true;
                    let side = &self.conn.rails[rail];
                    let all = side.streams.iter().all(|&s| self.conn.streams[s].ended);
                    if all && !side.down {
                        for &s in &side.streams {
                            self.conn.streams[s].ended = false;
                        }
                        out.push(RecvEvent::PassEnded { rail, failed });
                    }
                }
                Report::Failed { stream, why } => {
                    let rail = self.conn.streams[stream].rail;
                    if !self.conn.rails[rail].down {
                        self.conn.stop_rail(rail);
                        out.push(RecvEvent::Down { rail, why });
                    }
                }
            }
        }
        self.land_copies(out)
    }

    fn give_up(&mut self, rail: Rail) {
        self.conn.stop_rail(rail);
    }

    fn bytes_in(&self) -> u64 {
        self.conn
            .shared
            .bytes_in
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn close(&mut self) {
        self.closed = true;
        for r in 0..self.conn.rails.len() {
            self.conn.stop_rail(r);
        }
    }
}
