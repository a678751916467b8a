//! The sender's end of a TCP connection: its rails of streams, one writer thread per
//! stream and one reader per rail for the receiver's messages, for the life of the
//! connection (every transfer of a `--reuse-connection`, or of a library endpoint). A
//! transfer lends the connection its source for the while of one call
//! ([`TcpSender::with_source`]), which gives the engine a [`SendLink`]: the writers read
//! the items' bytes straight from the source's memory only while it is lent, and the
//! call returns only once no writer reads it.
//!
//! Each item goes to the next stream of the rail the engine chose (round-robin: the
//! receiver places frames by their offsets); with checksums its frame carries its
//! CRC32C, the one given (the GPU's) or the writer's own over the bytes it sends. The
//! test-only fault injector flips a bit in a copy after the checksum was taken.

use super::frames::{Frame, FrameKind, Unread, FRAME_LEN};
use super::socket;
use crate::memory::{Registrable, RegistrationTarget};
use crate::net::{Caps, Item, LinkError, Pass, Rail, SendEvent, SendLink, MAX_MESSAGE};
use crate::transfer::faults::FaultInjector;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How a TCP sender's connection writes and checks.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteChecks {
    /// Frames carry the CRC32C of their items.
    pub checksum: bool,
    /// TEST ONLY: flip a bit in a copy of every Nth item after its CRC32C was taken.
    pub faults: Option<FaultInjector>,
    /// TEST ONLY (`--test-silent-rail K`): rail K writes no end marker, as a rail whose
    /// link died silently right after its last item.
    pub silent_rail: Option<usize>,
}

/// The memory the writers read items from: lent by [`TcpSender::with_source`].
struct Lent {
    /// Base address and length of the lent memory; `None` between transfers.
    memory: Option<(usize, usize)>,
    /// Which lending this is: an item posted under another is refused.
    epoch: u64,
    /// Writers reading it right now.
    readers: u32,
}

struct Shared {
    lent: Mutex<Lent>,
    returned: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Lent> {
        self.lent.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where an item's bytes are.
enum Bytes {
    /// In the lent memory: this range, under this lending.
    Lent {
        range: std::ops::Range<usize>,
        epoch: u64,
    },
    /// A copy of the engine's.
    Copy(Arc<[u8]>),
}

/// What a writer thread is given.
enum Work {
    Item {
        pass: Pass,
        index: u64,
        offset: u64,
        bytes: Bytes,
        crc: Option<u32>,
        attempt: u32,
    },
    Control(Arc<[u8]>),
    /// The end of a pass on this stream; `silent`: write nothing (tests).
    End {
        failed: u32,
        silent: bool,
    },
}

/// What the threads report.
enum Report {
    Written {
        stream: usize,
        pass: Pass,
        index: u64,
        crc: u32,
    },
    Failed {
        stream: usize,
        why: String,
    },
    /// A writer left: it reads nothing any more.
    Exited {
        stream: usize,
    },
    Message {
        rail: Rail,
        bytes: Vec<u8>,
    },
    /// A rail's reader stopped: the receiver's side of the rail is gone.
    ReaderEnded {
        rail: Rail,
        why: String,
    },
}

struct Writer {
    jobs: Option<mpsc::Sender<Work>>,
    /// The stream itself, shared with its writer (and, the first of a rail, with the
    /// rail's reader): shut to break a blocked write off.
    shutter: Arc<TcpStream>,
    rail: Rail,
    exited: bool,
    thread: Option<JoinHandle<()>>,
}

struct RailState {
    streams: Vec<usize>,
    /// The next stream (of `streams`) and the pass it counts for: a pass's items are
    /// dealt out from its first stream in posting order, so a receiver of one rail knows
    /// which item comes next on each stream.
    next: usize,
    pass: Option<Pass>,
    /// Given up, or found broken: carries nothing more.
    down: bool,
    /// Said Quiet already.
    quiet_said: bool,
    /// Why it went down, said to the engine once its writers have all left: every item
    /// they wrote is reported before the rail's end (a receiver that acked and closed
    /// must not have its last chunks taken for lost).
    why_down: Option<String>,
}

/// A sender's open TCP connection.
pub struct TcpSender {
    writers: Vec<Writer>,
    rails: Vec<RailState>,
    readers: Vec<JoinHandle<()>>,
    reports: mpsc::Receiver<Report>,
    /// The receiver's messages its readers read and this side has not yet taken.
    unread: Arc<Unread>,
    shared: Arc<Shared>,
    checks: WriteChecks,
    /// Set once the connection was broken off: nothing more is sent.
    broken: bool,
}

impl TcpSender {
    /// Start the threads of a connection whose streams are open: `rails[r]` is rail `r`'s
    /// streams, the first of each carrying the receiver's messages. `timeout` bounds
    /// every write and read.
    pub fn start(
        rails: Vec<Vec<TcpStream>>,
        checks: WriteChecks,
        timeout: Duration,
    ) -> std::io::Result<TcpSender> {
        let shared = Arc::new(Shared {
            lent: Mutex::new(Lent {
                memory: None,
                epoch: 0,
                readers: 0,
            }),
            returned: Condvar::new(),
        });
        let (tx, reports) = mpsc::channel();
        let mut sender = TcpSender {
            writers: Vec::new(),
            rails: Vec::new(),
            readers: Vec::new(),
            reports,
            unread: Arc::default(),
            shared,
            checks,
            broken: false,
        };
        for (r, streams) in rails.into_iter().enumerate() {
            let mut state = RailState {
                streams: Vec::new(),
                next: 0,
                pass: None,
                down: false,
                quiet_said: false,
                why_down: None,
            };
            for (k, stream) in streams.into_iter().enumerate() {
                let s = sender.writers.len();
                let stream = Arc::new(stream);
                if k == 0 {
                    let (reading, unread) = (stream.clone(), sender.unread.clone());
                    let tx = tx.clone();
                    let thread = std::thread::Builder::new()
                        .name(format!("tcp-replies-{r}"))
                        .spawn(move || read_messages(r, &reading, &tx, &unread))?;
                    sender.readers.push(thread);
                }
                let shutter = stream.clone();
                let (jobs, rx) = mpsc::channel::<Work>();
                let (tx, shared) = (tx.clone(), sender.shared.clone());
                let thread = std::thread::Builder::new()
                    .name(format!("tcp-writer-{s}"))
                    .spawn(move || {
                        // Sent however the writer leaves, a panic too.
                        let _exit = ExitReport { tx: &tx, stream: s };
                        write_stream(s, &stream, &rx, &tx, &shared, checks, timeout);
                    })?;
                sender.writers.push(Writer {
                    jobs: Some(jobs),
                    shutter,
                    rail: r,
                    exited: false,
                    thread: Some(thread),
                });
                state.streams.push(s);
            }
            sender.rails.push(state);
        }
        Ok(sender)
    }

    /// Rails the connection has.
    pub fn rails(&self) -> usize {
        self.rails.len()
    }

    /// Lend `source`'s memory (host memory) to the writers and run `f` with the link;
    /// returns once no writer reads the memory any more (every item reported, or the
    /// connection broken off).
    pub fn with_source<R>(
        &mut self,
        source: &dyn Registrable,
        f: impl FnOnce(&mut dyn SendLink) -> R,
    ) -> Result<R, LinkError> {
        let RegistrationTarget::Host { ptr, len } = source.target() else {
            return Err(LinkError(
                "the TCP sender reads host memory only (GPU memory goes through the staged ring)"
                    .into(),
            ));
        };
        let epoch = {
            let mut lent = self.shared.lock();
            lent.epoch += 1;
            lent.memory = Some((ptr.as_ptr() as usize, len));
            lent.epoch
        };
        // Taken back however `f` ends, a panic too, before `source`'s borrow ends.
        let guard = Takeback {
            shared: self.shared.clone(),
        };
        let mut link = TcpSendLink { conn: self, epoch };
        let result = f(&mut link);
        let broken = link.conn.broken;
        if broken {
            // Writers blocked on a stalled peer stop reading at once.
            self.shut_all(Shutdown::Write);
        }
        drop(guard);
        Ok(result)
    }

    /// Whether the connection can carry another transfer.
    pub fn usable(&self) -> bool {
        !self.broken && self.rails.iter().any(|r| !r.down)
    }

    fn shut_all(&self, how: Shutdown) {
        for w in &self.writers {
            let _ = w.shutter.shutdown(how);
        }
    }

    /// Stop rail `rail` for `why` (said once its writers have left), unless it is
    /// stopping already.
    fn stop_rail_for(&mut self, rail: Rail, why: String) {
        let Some(state) = self.rails.get_mut(rail) else {
            return;
        };
        if !state.down {
            state.why_down.get_or_insert(why);
            self.stop_rail(rail);
        }
    }

    /// Stop rail `rail`: its sockets shut (a blocked write returns at once), its writers
    /// told to leave.
    fn stop_rail(&mut self, rail: Rail) {
        let Some(state) = self.rails.get_mut(rail) else {
            return;
        };
        state.down = true;
        for &s in &state.streams {
            let _ = self.writers[s].shutter.shutdown(Shutdown::Both);
            self.writers[s].jobs = None;
        }
    }
}

/// Takes the lent memory back: waits until no writer reads it.
struct Takeback {
    shared: Arc<Shared>,
}

impl Drop for Takeback {
    fn drop(&mut self) {
        let mut lent = self.shared.lock();
        lent.memory = None;
        lent.epoch += 1;
        while lent.readers > 0 {
            lent = self
                .shared
                .returned
                .wait(lent)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for TcpSender {
    fn drop(&mut self) {
        self.shut_all(Shutdown::Both);
        for w in &mut self.writers {
            w.jobs = None;
        }
        for w in &mut self.writers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
        for t in self.readers.drain(..) {
            let _ = t.join();
        }
    }
}

/// The link of one lending.
struct TcpSendLink<'c> {
    conn: &'c mut TcpSender,
    epoch: u64,
}

impl TcpSendLink<'_> {
    /// Queue `work` on the next stream of `rail` (an item of `pass`), or on its first
    /// (a message: `None`).
    fn queue(&mut self, rail: Rail, work: Work, pass: Option<Pass>) -> Result<(), LinkError> {
        let conn = &mut *self.conn;
        let Some(state) = conn.rails.get_mut(rail).filter(|s| !s.down) else {
            return Err(LinkError(format!("rail {rail} is down")));
        };
        let s = match pass {
            None => state.streams[0],
            Some(pass) => {
                if state.pass != Some(pass) {
                    state.pass = Some(pass);
                    state.next = 0;
                }
                let s = state.streams[state.next % state.streams.len()];
                state.next = (state.next + 1) % state.streams.len();
                s
            }
        };
        let sent = conn.writers[s]
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(work).is_ok());
        if sent {
            return Ok(());
        }
        conn.stop_rail(rail);
        Err(LinkError(format!("the writer of stream {s} is gone")))
    }
}

/// The writers' work for `item`, whose `len` bytes are `bytes`: one frame, so at most
/// `u32::MAX` of them.
fn item_work(item: &Item, bytes: Bytes, len: usize) -> Result<Work, LinkError> {
    if len > u32::MAX as usize {
        return Err(LinkError(format!(
            "item {} is too long for a frame",
            item.index
        )));
    }
    Ok(Work::Item {
        pass: item.pass,
        index: item.index,
        offset: item.offset,
        bytes,
        crc: item.crc,
        attempt: item.attempt,
    })
}

// SAFETY: writers read an item's lent bytes only under the lending it was posted in
// (the epoch), counted as readers, and report it written after the last read; a rail
// that fails has its writers leave, and Quiet is said only once all of them have; the
// lending is taken back (with_source) only once no writer reads.
unsafe impl SendLink for TcpSendLink<'_> {
    fn rails(&self) -> usize {
        self.conn.rails.len()
    }

    fn caps(&self) -> Caps {
        Caps::STREAM
    }

    /// # Safety
    /// As [`SendLink::post`] says.
    unsafe fn post(&mut self, rail: Rail, items: &[Item]) -> Result<(), LinkError> {
        let len = self.conn.shared.lock().memory.map_or(0, |(_, len)| len);
        for item in items {
            if item.bytes.end > len || item.bytes.start > item.bytes.end {
                return Err(LinkError(format!(
                    "item {} ({:?}) is outside the source",
                    item.index, item.bytes
                )));
            }
            let bytes = Bytes::Lent {
                range: item.bytes.clone(),
                epoch: self.epoch,
            };
            self.queue(
                rail,
                item_work(item, bytes, item.bytes.len())?,
                Some(item.pass),
            )?;
        }
        Ok(())
    }

    fn post_copy(&mut self, rail: Rail, item: Item, bytes: Arc<[u8]>) -> Result<(), LinkError> {
        let len = bytes.len();
        self.queue(
            rail,
            item_work(&item, Bytes::Copy(bytes), len)?,
            Some(item.pass),
        )
    }

    fn send_message(&mut self, rail: Rail, bytes: &[u8]) -> Result<(), LinkError> {
        if bytes.len() > MAX_MESSAGE {
            return Err(LinkError(format!("a message of {} bytes", bytes.len())));
        }
        self.queue(rail, Work::Control(bytes.into()), None)
    }

    fn end_pass(&mut self, failed: u32) -> Result<(), LinkError> {
        // Over one rail the receiver knows the pass is over when every item is in.
        if self.conn.rails.len() < 2 {
            return Ok(());
        }
        for rail in 0..self.conn.rails.len() {
            if self.conn.rails[rail].down {
                continue;
            }
            let streams = self.conn.rails[rail].streams.clone();
            for s in streams {
                let silent = self.conn.checks.silent_rail == Some(rail);
                if let Some(jobs) = &self.conn.writers[s].jobs {
                    // A writer that is gone failed, and says so in its report.
                    let _ = jobs.send(Work::End { failed, silent });
                }
            }
        }
        Ok(())
    }

    fn poll(&mut self, wait: Duration, out: &mut Vec<SendEvent>) -> Result<(), LinkError> {
        let first = match self.conn.reports.recv_timeout(wait) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(LinkError("the connection's threads are gone".into()))
            }
        };
        let reports: Vec<Report> = std::iter::once(first)
            .chain(self.conn.reports.try_iter())
            .collect();
        for report in reports {
            match report {
                Report::Written {
                    stream,
                    pass,
                    index,
                    crc,
                } => {
                    let rail = self.conn.writers[stream].rail;
                    out.push(SendEvent::Sent {
                        rail,
                        pass,
                        items: vec![index],
                        crcs: vec![crc],
                    });
                }
                Report::Failed { stream, why } => {
                    let rail = self.conn.writers[stream].rail;
                    self.conn.stop_rail_for(rail, why);
                }
                Report::Exited { stream } => {
                    self.conn.writers[stream].exited = true;
                    let rail = self.conn.writers[stream].rail;
                    let state = &mut self.conn.rails[rail];
                    let all = state.streams.iter().all(|&s| self.conn.writers[s].exited);
                    if all && !state.quiet_said {
                        state.quiet_said = true;
                        state.down = true;
                        let why = state
                            .why_down
                            .take()
                            .unwrap_or_else(|| "its writers stopped".into());
                        out.push(SendEvent::Down { rail, why });
                        out.push(SendEvent::Quiet { rail });
                    }
                }
                Report::Message { rail, bytes } => {
                    self.conn.unread.taken(bytes.len());
                    out.push(SendEvent::Message { rail, bytes })
                }
                Report::ReaderEnded { rail, why } => self.conn.stop_rail_for(rail, why),
            }
        }
        Ok(())
    }

    fn give_up(&mut self, rail: Rail) {
        self.conn.stop_rail(rail);
    }

    fn drain(&mut self) {
        self.conn.broken = true;
        // Blocked writes return at once; the receiver's last word can still be read.
        self.conn.shut_all(Shutdown::Write);
        for w in &mut self.conn.writers {
            w.jobs = None;
        }
        let lent = self.conn.shared.clone();
        let mut lent = lent.lock();
        lent.memory = None;
        lent.epoch += 1;
        // Writers leave promptly once their sockets are shut: the wait needs no deadline
        // of its own, and must not end early (a writer in write_all reads the source).
        while lent.readers > 0 {
            lent = self
                .conn
                .shared
                .returned
                .wait(lent)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Tells the connection that a writer left, from its `Drop`: also when it panicked.
struct ExitReport<'a> {
    tx: &'a mpsc::Sender<Report>,
    stream: usize,
}

impl Drop for ExitReport<'_> {
    fn drop(&mut self) {
        let _ = self.tx.send(Report::Exited {
            stream: self.stream,
        });
    }
}

/// Read the lent bytes of `range` under lending `epoch` into `f`: `None` if that lending
/// is over (the item's transfer ended).
fn with_lent<R>(
    shared: &Shared,
    range: &std::ops::Range<usize>,
    epoch: u64,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    let base = {
        let mut lent = shared.lock();
        let (base, len) = lent.memory.filter(|_| lent.epoch == epoch)?;
        if range.end > len || range.start > range.end {
            return None;
        }
        lent.readers += 1;
        base
    };
    // Counted as a reader: the lending cannot be taken back until the count drops.
    struct Done<'a>(&'a Shared);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            let mut lent = self.0.lock();
            lent.readers -= 1;
            self.0.returned.notify_all();
        }
    }
    let _done = Done(shared);
    // SAFETY: the range lies inside the lent memory (checked under the lock), which
    // stays valid and unmodified while it is lent and this thread is counted as its
    // reader (with_source takes it back only once no reader is left), and the poster
    // keeps the item's bytes unmodified until it is reported (SendLink::post).
    let bytes =
        unsafe { std::slice::from_raw_parts((base + range.start) as *const u8, range.len()) };
    Some(f(bytes))
}

/// A writer thread: write each frame given to stream `s`, report it, stop at the first
/// error.
fn write_stream(
    s: usize,
    mut stream: &TcpStream,
    rx: &mpsc::Receiver<Work>,
    tx: &mpsc::Sender<Report>,
    shared: &Shared,
    checks: WriteChecks,
    timeout: Duration,
) {
    let fail = |why: String| {
        let _ = tx.send(Report::Failed { stream: s, why });
    };
    for work in rx {
        match work {
            Work::End { silent: true, .. } => {}
            Work::End { failed, .. } => {
                if let Err(e) = stream.write_all(&Frame::end(failed).encode()) {
                    return fail(socket::why(&e, timeout, "ending a pass"));
                }
            }
            Work::Control(bytes) => {
                let frame = Frame::control(&bytes).encode();
                if let Err(e) = stream
                    .write_all(&frame)
                    .and_then(|()| stream.write_all(&bytes))
                {
                    return fail(socket::why(&e, timeout, "sending a message"));
                }
            }
            Work::Item {
                pass,
                index,
                offset,
                bytes,
                crc,
                attempt,
            } => {
                let write = |bytes: &[u8], mut stream: &TcpStream| {
                    let crc = match (crc, checks.checksum) {
                        (Some(crc), _) => crc,
                        (None, true) => crate::integrity::crc32c(bytes),
                        (None, false) => 0,
                    };
                    let corrupted = checks.faults.and_then(|f| {
                        let mut copy = bytes.to_vec();
                        f.corrupt(&mut copy, index, attempt).then_some(copy)
                    });
                    let bytes = corrupted.as_deref().unwrap_or(bytes);
                    let frame = Frame {
                        offset,
                        len: bytes.len() as u32,
                        crc,
                    };
                    stream
                        .write_all(&frame.encode())
                        .and_then(|()| stream.write_all(bytes))
                        .map(|()| crc)
                };
                let written = match &bytes {
                    Bytes::Lent { range, epoch } => {
                        match with_lent(shared, range, *epoch, |b| write(b, stream)) {
                            Some(w) => w,
                            // Its transfer is over: nothing of it is sent any more.
                            None => continue,
                        }
                    }
                    Bytes::Copy(copy) => write(copy, stream),
                };
                match written {
                    Ok(crc) => {
                        let report = Report::Written {
                            stream: s,
                            pass,
                            index,
                            crc,
                        };
                        if tx.send(report).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        return fail(socket::why(&e, timeout, &format!("writing item {index}")));
                    }
                }
            }
        }
    }
}

/// A rail's reader: every frame the receiver sends on the rail's first stream is a
/// control message; each goes to the connection, whole and checked, until the stream
/// ends, or until the messages not yet taken would hold more than [`Unread`] allows (a
/// receiver that floods ends its rail, as a sender that floods does the other way).
fn read_messages(rail: Rail, stream: &TcpStream, tx: &mpsc::Sender<Report>, unread: &Unread) {
    let ended = |why: String| {
        let _ = tx.send(Report::ReaderEnded { rail, why });
    };
    // The receiver may take long between messages (verifying 1 GiB on a busy machine):
    // this reader waits as long as the connection lives; its writes have the timeouts.
    let _ = stream.set_read_timeout(None);
    let mut stream = stream;
    loop {
        let mut head = [0u8; FRAME_LEN];
        if let Err(e) = std::io::Read::read_exact(&mut stream, &mut head) {
            return ended(socket::why(
                &e,
                Duration::ZERO,
                "waiting for the receiver's reply",
            ));
        }
        let frame = Frame::decode(&head);
        let FrameKind::Control { len, crc } = frame.kind() else {
            return ended(
                "protocol error: the receiver sent something other than a message".into(),
            );
        };
        if len as usize > MAX_MESSAGE {
            return ended(format!(
                "protocol error: a message of {len} bytes from the receiver"
            ));
        }
        if let Err(why) = unread.hold(len as usize, "receiver") {
            return ended(why);
        }
        let mut bytes = vec![0u8; len as usize];
        if let Err(e) = std::io::Read::read_exact(&mut stream, &mut bytes) {
            return ended(socket::why(
                &e,
                Duration::ZERO,
                "reading the receiver's reply",
            ));
        }
        if crate::integrity::crc32c(&bytes) != crc {
            return ended("a message from the receiver failed its CRC32C".into());
        }
        if tx.send(Report::Message { rail, bytes }).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::host_buffer::HostBuffer;
    use crate::net::tcp::frames::MAX_UNREAD;
    use std::net::TcpListener;
    use std::time::Instant;

    /// A receiver (which the sender chose, but may be hostile) that sends messages
    /// nobody asked for while the sender does not poll: its rail ends once they would
    /// hold more than `MAX_UNREAD`, instead of the sender keeping them all (it kept
    /// every one: memory grew at line rate, between transfers on a kept connection too).
    #[test]
    fn a_receiver_that_floods_messages_ends_its_rail_before_they_pile_up() {
        const MIB: usize = 1 << 20;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let timeout = Duration::from_secs(10);
        let mut conn =
            TcpSender::start(vec![vec![stream]], WriteChecks::default(), timeout).unwrap();
        let message = vec![7u8; MIB];
        let mut framed = Frame::control(&message).encode().to_vec();
        framed.extend_from_slice(&message);
        // Three times what may wait; the sender stops reading before that, so the
        // peer's writes stall and time out.
        peer.set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        for _ in 0..3 * MAX_UNREAD / MIB {
            if peer.write_all(&framed).is_err() {
                break;
            }
        }
        let src = HostBuffer::with_pattern(4096).unwrap();
        let (messages, down) = conn
            .with_source(&src, |link| {
                let (mut messages, mut down) = (0, None);
                let mut out = Vec::new();
                let until = Instant::now() + Duration::from_secs(20);
                while down.is_none() && Instant::now() < until {
                    link.poll(Duration::from_millis(100), &mut out).unwrap();
                    for event in out.drain(..) {
                        match event {
                            SendEvent::Message { .. } => messages += 1,
                            SendEvent::Down { why, .. } => down = Some(why),
                            _ => {}
                        }
                    }
                }
                (messages, down)
            })
            .unwrap();
        let why = down.expect("the rail of a flooding receiver stays up");
        assert!(why.contains("not yet taken"), "{why}");
        assert!(
            messages * MIB <= MAX_UNREAD,
            "{messages} messages of 1 MiB kept"
        );
    }
}
