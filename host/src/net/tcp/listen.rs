//! A TCP receiver's listener: accept sockets, tell transfer offers from further streams
//! by their first bytes, and hand the engine each offer ([`Heard::Offer`]) with what it
//! needs to answer it ([`TcpOffer`]: refuse, or accept and gather the connection's
//! streams).
//!
//! **Threads.** The accept loop only accepts, checks and hands off: it never reads from
//! or waits on a peer. A peer outside `--allow` is refused before anything is read; each
//! socket then needs a handshake slot (all peers together, and per address), and a
//! short-lived handshake thread reads its first message within one deadline for the
//! whole handshake (`--timeout` from the accept, however the bytes trickle): an offer
//! (with, for a named transfer, its name; with a key, proven over a fresh nonce) goes to
//! the engine; a further stream's hello (proven too) goes to its connection through the
//! joins book ([`crate::net::joins`]). A refusal is one non-blocking write and a close.

use super::frames::{Hello, HELLO_LEN, HELLO_MAGIC};
use super::kept::KeptConn;
use super::recv::TcpReceiver;
use super::socket::{self, ReadStop};
use crate::net::joins::{JoinSlot, Joins, Refused};
use crate::net::{Heard, ListenConfig};
use crate::rdma::Deadline;
use crate::server::admission::{Admission, HandshakeSlot};
use crate::server::Key;
use crate::transfer::RecvOutcome;
use crate::wire::{
    checked_name, decode_name_prefix, AcceptInfo, Challenge, Header, Proof, RejectReason,
    WireError, HEADER_LEN, HEADER_MAGIC, NAME_PREFIX_LEN, PROOF_LEN,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest the accept loop waits at once: a connection, a pause, a resume or the
/// end wake it earlier ([`Waker`]).
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// How long the accept loop stops when the process is out of descriptors.
const OUT_OF_DESCRIPTORS_PAUSE: Duration = Duration::from_millis(100);
/// A handshake thread's stack: it decodes a few dozen bytes and computes one HMAC.
const HANDSHAKE_STACK: usize = 256 << 10;
/// How long a striped transfer waits for its streams to join before it starts without
/// the late ones (a rail whose link died between its connection and its hello must not
/// hold the others up for all of --timeout: the sender fails it over).
const STRIPED_JOIN: Duration = Duration::from_secs(1);

/// Shared by the accept loop, the handshake threads and the offers.
struct Shared {
    cfg: ListenConfig,
    admission: Arc<Admission>,
    joins: Arc<Joins<(SocketAddr, TcpStream)>>,
    /// While closed, the accept loop takes no connection (they wait in the listen queue).
    paused: AtomicBool,
    /// The accept loop saw `paused` and is out of `accept`.
    idle: AtomicBool,
    /// Wakes the accept loop out of its wait.
    waker: Waker,
}

/// A self-pipe the accept loop waits on beside its listener: a byte written ends the
/// wait at once. Without it the loop slept out its poll: up to 2 ms before a new
/// connection was taken, before a resumed listener took the sender waiting in its queue,
/// and before a pause returned (every library receive waits for one between its accept
/// and its first byte).
struct Waker {
    tx: UnixStream,
    rx: UnixStream,
}

impl Waker {
    fn new() -> std::io::Result<Waker> {
        let (tx, rx) = UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Waker { tx, rx })
    }

    /// End the loop's current or next wait (a full pipe means it is woken already).
    fn wake(&self) {
        let _ = (&self.tx).write(&[1]);
    }

    /// Wait until `listener` (if given) has a connection, the waker was woken, or
    /// [`ACCEPT_POLL`] passed; the wakes are used up.
    fn wait(&self, listener: Option<&TcpListener>) {
        let mut fds = vec![self.rx.as_raw_fd()];
        fds.extend(listener.map(|l| l.as_raw_fd()));
        if crate::rdma::wait_readable(&fds, &Deadline::after(ACCEPT_POLL), None).is_err() {
            std::thread::sleep(ACCEPT_POLL);
        }
        let mut buf = [0u8; 64];
        while matches!((&self.rx).read(&mut buf), Ok(n) if n > 0) {}
    }
}

/// Where the listener tells what it hears (from its threads).
pub type Tell = Box<dyn Fn(Heard<TcpOffer>) + Send + Sync>;

/// A listening socket and its accept loop.
pub struct TcpListen {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
}

impl TcpListen {
    /// Listen on `listener` (bound already), admitting under `admission`; what is heard
    /// goes to `tell`, from the listener's threads.
    pub fn start(
        listener: TcpListener,
        cfg: ListenConfig,
        admission: Arc<Admission>,
        tell: Tell,
    ) -> std::io::Result<TcpListen> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            cfg,
            admission,
            joins: Arc::new(Joins::default()),
            paused: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            waker: Waker::new()?,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            let tell: Arc<dyn Fn(Heard<TcpOffer>) + Send + Sync> = Arc::from(tell);
            std::thread::Builder::new()
                .name("tcp-accept".into())
                .spawn(move || accept_loop(listener, &shared, &tell, &stop))?
        };
        Ok(TcpListen {
            shared,
            stop,
            thread: Some(thread),
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Take no more connections until [`resume`](Self::resume): the next sender waits in
    /// the listen queue (the library's one transfer per call). Returns once the accept
    /// loop is out of `accept` (or after `within`).
    pub fn pause(&self, within: Duration) {
        self.shared.idle.store(false, Ordering::SeqCst);
        self.shared.paused.store(true, Ordering::SeqCst);
        // Woken, the loop sees `paused` now, not after the rest of its wait. This wait is
        // on the path of every library receive, between its accept and its first byte
        // read: sleeping it out cost about 2 ms a transfer (a 1 MiB round trip 2.4 ms
        // against 0.7 without it).
        self.shared.waker.wake();
        let until = Instant::now() + within;
        while !self.shared.idle.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_micros(10));
        }
    }

    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
        // A sender waiting in the listen queue is taken now.
        self.shared.waker.wake();
    }
}

impl Drop for TcpListen {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.shared.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A transfer offered on a socket: its words, and the socket to answer on.
pub struct TcpOffer {
    pub peer: SocketAddr,
    pub header: Header,
    pub hello: Hello,
    pub name: Option<String>,
    from: OfferFrom,
    timeout: Duration,
}

/// Where an offer came from.
enum OfferFrom {
    /// A new connection: its first stream, and where its other streams join it.
    Opened {
        control: TcpStream,
        joins: Arc<Joins<(SocketAddr, TcpStream)>>,
    },
    /// A connection kept after its last transfer ([`super::kept`]).
    Kept(Box<KeptConn>),
}

impl TcpOffer {
    /// Descriptors the connection holds: its streams.
    pub fn descriptors(&self) -> u64 {
        self.hello.count as u64 + 1
    }

    /// The sender's next offer on `kept`, waited for up to `idle` (`None`: the session
    /// ended, see [`KeptConn::next_offer`]).
    pub fn next_on(kept: KeptConn, idle: Duration) -> Option<TcpOffer> {
        let (kept, next) = kept.next_offer(idle)?;
        Some(TcpOffer {
            peer: kept.peer,
            header: next.header,
            hello: kept.hello,
            name: next.name,
            timeout: kept.timeout,
            from: OfferFrom::Kept(Box::new(kept)),
        })
    }

    /// Refuse, saying why; what to report.
    pub fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        match self.from {
            OfferFrom::Opened { control, .. } => refuse(control, self.peer, reason, detail),
            OfferFrom::Kept(kept) => kept.refuse(reason, detail),
        }
    }

    /// Accept the offer: the connection's streams are gathered (within `--timeout`;
    /// striped, those that joined within a moment, the others are missing rails) and
    /// read. Errors are what to report.
    pub fn accept(self) -> Result<Accepted, RecvOutcome> {
        let TcpOffer {
            from,
            peer,
            header,
            hello,
            name: _,
            timeout,
        } = self;
        let (mut control, joins) = match from {
            OfferFrom::Opened { control, joins } => (control, joins),
            OfferFrom::Kept(kept) => {
                let (receiver, rails_from) = kept.accept(&header)?;
                return Ok(Accepted {
                    receiver,
                    rails_from,
                    missing_rails: Vec::new(),
                    accepted_at: Instant::now(),
                });
            }
        };
        let rails = header.rails.max(1) as u16;
        let striped = header.striped;
        if hello.count % rails != 0 {
            let reason = RejectReason::BadHeader(WireError::Inconsistent {
                what: "a stream count that does not divide among the rails",
            });
            return Err(refuse(control, peer, reason, None));
        }
        let per_rail = hello.count / rails;
        // Further streams of an unstriped transfer come from the offer's address; a
        // striped one's from any (each rail from its own interface).
        let only_from = (!striped).then_some(crate::server::allow::peer_key(peer.ip()));
        let slot: JoinSlot<(SocketAddr, TcpStream)> =
            match joins.open(Some(hello.token), hello.count, only_from) {
                Ok(slot) => slot,
                Err(refused) => {
                    let reason = RejectReason::BadHeader(WireError::Inconsistent {
                        what: refused.words(),
                    });
                    return Err(refuse(control, peer, reason, None));
                }
            };
        let accept = AcceptInfo {
            addr: 0,
            rkey: 0,
            len: header.total_bytes,
        };
        if let Err(e) = control.write_all(&accept.encode()) {
            let why = socket::why(&e, timeout, "accepting the offer");
            return Err(RecvOutcome::Failed {
                peer: peer.to_string(),
                error: format!("{peer}: {why}"),
            });
        }
        let accepted_at = Instant::now();
        // Stream 0 is the offer's socket.
        let mut slots: Vec<Option<(TcpStream, Option<String>)>> =
            (0..hello.count).map(|_| None).collect();
        slots[0] = Some((control, Some(peer.to_string())));
        let wait = match striped {
            true => timeout.min(STRIPED_JOIN),
            false => timeout,
        };
        let deadline = Instant::now() + wait;
        while slots.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            match slot.rx.recv_timeout(left) {
                Ok((index, (from, stream))) => {
                    slots[index as usize] = Some((stream, Some(from.to_string())));
                }
                Err(_) if striped => break,
                Err(_) => {
                    let have = slots.iter().filter(|s| s.is_some()).count();
                    return Err(RecvOutcome::Failed {
                        peer: peer.to_string(),
                        error: format!(
                            "{peer} opened {have} of its {} streams within {}",
                            hello.count,
                            crate::rdma::format_duration(timeout)
                        ),
                    });
                }
            }
        }
        drop(slot); // every stream is in (or late): nothing more may join
                    // Group by rail; a rail none of whose streams joined is missing (striped).
        let mut rails_streams: Vec<Vec<TcpStream>> = Vec::new();
        let mut from = Vec::new();
        let mut missing = Vec::new();
        let mut slots = slots.into_iter();
        for r in 0..rails {
            let mine: Vec<_> = slots.by_ref().take(per_rail as usize).collect();
            let first_from = mine.iter().flatten().find_map(|(_, f)| f.clone());
            if mine.iter().any(Option::is_none) {
                // A rail with a stream missing cannot be read in order: left out whole.
                missing.push(r as usize);
                rails_streams.push(Vec::new());
            } else {
                rails_streams.push(mine.into_iter().flatten().map(|(s, _)| s).collect());
            }
            from.push(first_from);
        }
        if rails_streams.iter().all(Vec::is_empty) {
            return Err(RecvOutcome::Failed {
                peer: peer.to_string(),
                error: format!("{peer}: none of its rails' streams came"),
            });
        }
        let receiver =
            TcpReceiver::start(rails_streams, timeout).map_err(|e| RecvOutcome::Failed {
                peer: peer.to_string(),
                error: format!("cannot start the connection's readers: {e}"),
            })?;
        Ok(Accepted {
            receiver,
            rails_from: from,
            missing_rails: missing,
            accepted_at,
        })
    }
}

/// An accepted connection.
pub struct Accepted {
    pub receiver: TcpReceiver,
    /// The sender's address on each rail, where a stream of it came.
    pub rails_from: Vec<Option<String>>,
    /// Rails whose streams did not all join (striped): they carry nothing.
    pub missing_rails: Vec<usize>,
    pub accepted_at: Instant,
}

/// Refuse `stream`'s peer for `reason`: one non-blocking write and a close.
pub fn refuse(
    stream: TcpStream,
    peer: SocketAddr,
    reason: RejectReason,
    detail: Option<String>,
) -> RecvOutcome {
    let sent = socket::write_and_close(stream, &reason.encode());
    crate::net::rejected(peer, &reason, detail, sent.err().map(|e| e.to_string()))
}

fn refuse_hello(stream: TcpStream, peer: SocketAddr, what: &'static str) -> RecvOutcome {
    let reason = RejectReason::BadHeader(WireError::Inconsistent { what });
    refuse(stream, peer, reason, None)
}

/// Whether an `accept` error means this process (or the system) is out of descriptors.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

fn accept_loop(
    listener: TcpListener,
    shared: &Arc<Shared>,
    heard: &Arc<dyn Fn(Heard<TcpOffer>) + Send + Sync>,
    stop: &AtomicBool,
) {
    let tell = |outcome| heard(Heard::Said(outcome));
    let mut starved = false; // said "out of descriptors" already, until an accept works
    while !stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::SeqCst) {
            shared.idle.store(true, Ordering::SeqCst);
            shared.waker.wait(None);
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                shared.waker.wait(Some(&listener));
                continue;
            }
            Err(e) if out_of_descriptors(&e) => {
                if !starved {
                    starved = true;
                    tell(RecvOutcome::Notice {
                        text: format!(
                            "cannot accept connections ({e}): pausing {} ms at a time until descriptors are free",
                            OUT_OF_DESCRIPTORS_PAUSE.as_millis()
                        ),
                    });
                }
                std::thread::sleep(OUT_OF_DESCRIPTORS_PAUSE);
                continue;
            }
            // A connection reset before its accept, and the like: it concerns that peer only.
            Err(_) => continue,
        };
        starved = false;
        if !shared.cfg.allow.permits(peer.ip()) {
            tell(refuse(stream, peer, RejectReason::NotAllowed, None));
            continue;
        }
        let slot = match shared.admission.handshake(peer.ip()) {
            Ok(slot) => slot,
            Err(reason) => {
                tell(refuse(stream, peer, reason, None));
                continue;
            }
        };
        let deadline = Instant::now() + shared.cfg.timeout;
        if stream.set_nonblocking(false).is_err()
            || socket::prepare(&stream, shared.cfg.timeout).is_err()
        {
            continue;
        }
        let (heard, shared) = (heard.clone(), shared.clone());
        let spawned = std::thread::Builder::new()
            .name("tcp-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                if let Some(h) = handshake(&shared, stream, peer, deadline, slot) {
                    heard(h);
                }
            });
        if let Err(e) = spawned {
            tell(RecvOutcome::Failed {
                peer: peer.to_string(),
                error: format!("cannot start a handshake thread: {e}"),
            });
        }
    }
}

/// Read `N` bytes of a handshake within its deadline.
fn read_handshake<const N: usize>(
    stream: &TcpStream,
    timeout: Duration,
    deadline: Instant,
    what: &str,
) -> Result<[u8; N], String> {
    let mut buf = [0u8; N];
    socket::read_exact_within(stream, &mut buf, timeout, Some(deadline)).map_err(
        |stop| match stop {
            ReadStop::Deadline => format!(
                "the handshake took longer than {} while {what} (--timeout)",
                crate::rdma::format_duration(timeout)
            ),
            ReadStop::Io(e) => socket::why(&e, timeout, what),
        },
    )?;
    Ok(buf)
}

/// A named offer's name message: its bytes (for the key's proof) and the name.
fn read_name(
    stream: &TcpStream,
    timeout: Duration,
    deadline: Instant,
) -> Result<(Vec<u8>, String), RejectReason> {
    let what = "reading the transfer's name";
    let bad = RejectReason::BadHeader;
    let broken = |_: String| {
        RejectReason::BadHeader(WireError::Inconsistent {
            what: "no name message after a named offer",
        })
    };
    let prefix: [u8; NAME_PREFIX_LEN] =
        read_handshake(stream, timeout, deadline, what).map_err(broken)?;
    let len = decode_name_prefix(&prefix).map_err(bad)?;
    let mut name = vec![0u8; len];
    socket::read_exact_within(stream, &mut name, timeout, Some(deadline))
        .map_err(|_| broken(String::new()))?;
    let text = checked_name(&name).map_err(bad)?.to_string();
    Ok(([&prefix[..], &name[..]].concat(), text))
}

/// A socket's first message: an offer (to the engine), a further stream (to its
/// connection), or neither (refused).
fn handshake(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    _slot: HandshakeSlot,
) -> Option<Heard<TcpOffer>> {
    let cfg = &shared.cfg;
    let said = |outcome| Some(Heard::Said(outcome));
    let failed = |why: String| RecvOutcome::Failed {
        peer: peer.to_string(),
        error: format!("{peer}: {why}"),
    };
    let magic: [u8; 4] =
        match read_handshake(&stream, cfg.timeout, deadline, "reading the transfer offer") {
            Ok(m) => m,
            Err(why) => return said(failed(why)),
        };
    match magic {
        HEADER_MAGIC => {
            let rest: [u8; HEADER_LEN + HELLO_LEN - 4] = match read_handshake(
                &stream,
                cfg.timeout,
                deadline,
                "reading the transfer offer",
            ) {
                Ok(r) => r,
                Err(why) => return said(failed(why)),
            };
            let mut offer = vec![0u8; HEADER_LEN + HELLO_LEN];
            offer[..4].copy_from_slice(&magic);
            offer[4..].copy_from_slice(&rest);
            let header = match Header::decode(&offer[..HEADER_LEN]) {
                Ok(h) => h,
                Err(e) => return said(refuse(stream, peer, RejectReason::BadHeader(e), None)),
            };
            let hello = match Hello::decode(&offer[HEADER_LEN..]) {
                Ok(h) if h.index == 0 => h,
                Ok(_) => {
                    return said(refuse_hello(
                        stream,
                        peer,
                        "the offer's stream hello is not stream 0",
                    ))
                }
                Err(e) => {
                    let reason = RejectReason::BadHeader(WireError::Inconsistent {
                        what: "bad stream hello after the header",
                    });
                    return said(refuse(stream, peer, reason, Some(e.to_string())));
                }
            };
            let mut name = None;
            if header.named {
                match read_name(&stream, cfg.timeout, deadline) {
                    Ok((bytes, text)) => {
                        offer.extend_from_slice(&bytes);
                        name = Some(text);
                    }
                    Err(reason) => return said(refuse(stream, peer, reason, None)),
                }
            }
            if let Some(key) = &cfg.key {
                if let Err(why) = prove(key, &stream, &offer, Proved::Offer, cfg.timeout, deadline)
                {
                    return said(refuse(stream, peer, RejectReason::BadProof, Some(why)));
                }
            }
            if header.total_bytes > cfg.max_bytes {
                let reason = RejectReason::TooLarge {
                    requested: header.total_bytes,
                    max: cfg.max_bytes,
                };
                return said(refuse(stream, peer, reason, None));
            }
            Some(Heard::Offer(TcpOffer {
                peer,
                header,
                hello,
                name,
                from: OfferFrom::Opened {
                    control: stream,
                    joins: shared.joins.clone(),
                },
                timeout: cfg.timeout,
            }))
        }
        HELLO_MAGIC => {
            let rest: [u8; HELLO_LEN - 4] =
                match read_handshake(&stream, cfg.timeout, deadline, "reading a stream hello") {
                    Ok(r) => r,
                    Err(why) => return said(failed(why)),
                };
            let mut bytes = [0u8; HELLO_LEN];
            bytes[..4].copy_from_slice(&magic);
            bytes[4..].copy_from_slice(&rest);
            let hello = match Hello::decode(&bytes) {
                Ok(h) => h,
                Err(e) => {
                    let reason = RejectReason::BadHeader(WireError::Inconsistent {
                        what: "bad stream hello",
                    });
                    return said(refuse(stream, peer, reason, Some(e.to_string())));
                }
            };
            if let Some(key) = &cfg.key {
                if let Err(why) = prove(key, &stream, &bytes, Proved::Stream, cfg.timeout, deadline)
                {
                    let why = format!("stream {} of a transfer: {why}", hello.index);
                    return said(refuse(stream, peer, RejectReason::BadProof, Some(why)));
                }
            }
            let from = crate::server::allow::peer_key(peer.ip());
            match shared
                .joins
                .route(hello.token, hello.index, hello.count, from, (peer, stream))
            {
                Ok(()) => None,
                Err((refused, (_, stream))) => {
                    said(refuse_hello(stream, peer, refused_words(refused)))
                }
            }
        }
        got => said(refuse(
            stream,
            peer,
            RejectReason::BadHeader(WireError::BadMagic {
                got,
                expected: HEADER_MAGIC,
            }),
            None,
        )),
    }
}

/// A refused stream in the words the receiver's line and the reject give.
fn refused_words(refused: Refused) -> &'static str {
    match refused {
        Refused::Unknown => {
            "a stream of a connection this receiver does not serve (or that has all its streams)"
        }
        Refused::BadMember { .. } => "a stream index that repeats",
        Refused::OtherCount { .. } => "a stream whose count differs from its offer's",
        Refused::OtherAddress => "a stream from another address than its connection's offer",
        Refused::TokenInUse => "a connection token already in use",
    }
}

#[derive(Clone, Copy)]
enum Proved {
    Offer,
    Stream,
}

/// Ask `stream`'s peer to prove the key over `message` and a fresh nonce.
fn prove(
    key: &Key,
    stream: &TcpStream,
    message: &[u8],
    proved: Proved,
    timeout: Duration,
    deadline: Instant,
) -> Result<(), String> {
    let nonce =
        crate::server::key::fresh_nonce().map_err(|e| format!("no nonce could be drawn: {e}"))?;
    (&*stream)
        .write_all(&Challenge { nonce }.encode())
        .map_err(|e| socket::why(&e, timeout, "sending the key challenge"))?;
    let bytes: [u8; PROOF_LEN] = read_handshake(
        stream,
        timeout,
        deadline,
        "waiting for the proof of the key (has the sender the same --key-file?)",
    )?;
    let proof = Proof::decode(&bytes).map_err(|e| format!("no proof of the key: {e}"))?;
    let good = match proved {
        Proved::Offer => key.verify(message, &nonce, &proof.tag),
        Proved::Stream => key.verify_stream(message, &nonce, &proof.tag),
    };
    if good {
        Ok(())
    } else {
        Err("the proof does not match this receiver's key".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_descriptors_is_told_from_a_peers_error() {
        for errno in [libc::EMFILE, libc::ENFILE] {
            assert!(out_of_descriptors(&std::io::Error::from_raw_os_error(
                errno
            )));
        }
        for errno in [libc::ECONNABORTED, libc::EPERM] {
            assert!(!out_of_descriptors(&std::io::Error::from_raw_os_error(
                errno
            )));
        }
    }
}
