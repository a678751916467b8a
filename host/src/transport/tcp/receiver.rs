//! The TCP receiver: accept sockets, tell transfer offers from extra streams by their
//! first bytes, serve each transfer on a thread of its own, verify, ack.
//!
//! **Admission** is the verbs receiver's, shared ([`crate::server`]): a peer outside
//! `--allow` is refused before anything is read; each socket then needs a handshake slot
//! (all peers together, and per address); an offer, once read (and, with `--key-file`,
//! proven over a fresh nonce), needs a [`Lease`] for its connection, its bytes (host
//! buffer, or GPU memory and its page-locked ring) and its descriptors, all before
//! anything is allocated for it. A refusal is one non-blocking write and a close.
//!
//! **Threads.** The accept loop only accepts, checks and hands off: it never reads from
//! or waits on a peer. Each accepted socket gets a short-lived handshake thread that reads
//! its first message within one deadline for the whole handshake (`--timeout` from the
//! accept, however the bytes trickle). Offers go to the serving loop (the calling
//! thread), which admits or refuses at once and starts a thread per transfer. Outcomes
//! come back over a channel and are reported there.
//!
//! **Deadlines.** Besides `--timeout` for every wait, with `--min-rate` transfer `k` (from
//! 0) of a connection must be done `--timeout + (k + 1) × size / rate` after the accept:
//! the rate counts over the connection, so a `--reuse-connection` peer cannot hold a
//! slot by sending one small transfer now and then. Past it the sender gets a "too slow"
//! ack and the connection is shut.
//!
//! **`--once`** is used up only by a transfer that was accepted (the accept sent):
//! junk, probes, rejects and busy refusals leave the receiver serving.
//!
//! GPU memory (`--mem device`): a GPU's objects are `Rc` and stay on the thread that made
//! them, so each transfer thread opens the GPU for itself (`Gpu::open`: the device's
//! primary context, which the calling thread keeps retained, and the embedded kernels),
//! with its own copy stream and upload ring; transfers into GPU memory run at once, each
//! counted by the same admission.

use super::landing::{
    ChunkChecks, HostLanding, Landing, LentLanding, ReadLimits, Reads, Stop, Which,
};
use super::routes::Routes;
use super::serving::{refuse, Event, Offer, Shared};
use super::socket;
use crate::memory::lent::{AskCaller, LentPlace, LentTarget, OfferSeen};
use crate::memory::select::AttemptLog;
use crate::server::admission::{Admission, Books, Lease, Limits, Want};
use crate::server::{AllowList, Key};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::repair::{Converge, Step, Unit};
use crate::transfer::report::{Integrity, Repaired};
use crate::transfer::store::Output;
use crate::transfer::{gigabytes_per_second, RecvOutcome, RecvReport, TransferError};
use crate::wire::pieces::PieceResend;
use crate::wire::{AcceptInfo, Ack, AckStatus, Header, RejectReason, Resend, WireError};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How often the accept loop looks whether the receiver is done.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// How long the accept loop stops when the process is out of descriptors.
const OUT_OF_DESCRIPTORS_PAUSE: Duration = Duration::from_millis(100);
/// A handshake thread's stack: it decodes a few dozen bytes and computes one HMAC.
const HANDSHAKE_STACK: usize = 256 << 10;

/// Everything the TCP receiver needs, built by the CLI.
#[derive(Debug, Clone)]
pub struct TcpRecvConfig {
    pub bind: SocketAddr,
    pub once: bool,
    pub max_bytes: u64,
    pub timeout: Duration,
    /// Transfers served at once at most.
    pub max_connections: usize,
    /// Bytes of buffers held at once (host buffers, GPU memory and its pinned ring).
    pub max_memory: u64,
    /// Bytes per second a connection must average (beyond its first `timeout`); 0: no
    /// limit.
    pub min_rate: u64,
    /// Transfers served at once for one address.
    pub max_per_peer: usize,
    /// Addresses served (empty: all).
    pub allow: AllowList,
    /// With a key, only senders that prove they hold it are served.
    pub key: Option<Key>,
    /// `--output`: where each verified transfer is written.
    pub output: Option<Output>,
}

/// Where received data goes.
pub enum RecvMemory {
    Host,
    /// GPU memory of this GPU, verified by the verify kernel.
    #[cfg(feature = "cuda")]
    Device(std::rc::Rc<crate::gpu::Gpu>),
    /// Memory a library caller lent (host or GPU), for one transfer of exactly its size:
    /// taken by the first offer admitted (`--once` receivers, the library's).
    Lent(std::sync::Mutex<Option<LentTarget>>),
    /// Memory the caller lends once it has seen the offer (the library's `accept`): the
    /// first offer admitted is shown to it, and the serve ends with that offer, taken
    /// into the memory the caller gives or declined.
    Ask(AskCaller),
}

impl RecvMemory {
    /// The bytes a transfer of `total` bytes in chunks of `chunk` on `streams` streams
    /// holds here.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn bytes_for(&self, total: u64, chunk: u64, streams: u16) -> u64 {
        match self {
            RecvMemory::Host => total,
            // Asked before admission, and then lent memory (see `serve_listener`).
            RecvMemory::Ask(_) => 0,
            // The caller's memory is there already; into GPU memory, the upload ring.
            RecvMemory::Lent(target) => {
                let on_gpu = target
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|t| !matches!(t.place, LentPlace::Host(_)));
                match on_gpu {
                    false => 0,
                    true => usize::try_from(chunk.min(total))
                        .ok()
                        .and_then(|c| upload_ring_bytes(streams as usize, c))
                        .map_or(u64::MAX, |r| r as u64),
                }
            }
            // The device buffer and the upload ring's page-locked slots.
            #[cfg(feature = "cuda")]
            RecvMemory::Device(_) => {
                let ring = usize::try_from(chunk.min(total))
                    .ok()
                    .and_then(|c| upload_ring_bytes(streams as usize, c))
                    .map_or(u64::MAX, |r| r as u64);
                total.saturating_add(ring)
            }
        }
    }

    /// Why an offer cannot be taken into this memory at all, before admission: a lent
    /// buffer takes one transfer of exactly its size.
    fn refuses(&self, header: &Header) -> Option<(RejectReason, Option<String>)> {
        let RecvMemory::Lent(target) = self else {
            return None;
        };
        let target = target.lock().unwrap_or_else(|p| p.into_inner());
        let Some(target) = target.as_ref() else {
            // Taken by a transfer in progress (admission allows one at a time).
            return Some((RejectReason::BusyConnections { active: 1, max: 1 }, None));
        };
        if header.total_bytes != target.len as u64 {
            let reason = RejectReason::SizeMismatch {
                offered: header.total_bytes,
                expected: target.len as u64,
            };
            return Some((reason, None));
        }
        if header.transfers > 1 {
            let reason = RejectReason::BadHeader(WireError::Inconsistent {
                what: "several transfers into one caller's buffer",
            });
            return Some((
                reason,
                Some("a --reuse-connection offer into one buffer".into()),
            ));
        }
        None
    }
}

/// The page-locked ring an upload into GPU memory holds (none without the GPU).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn upload_ring_bytes(streams: usize, chunk: usize) -> Option<usize> {
    #[cfg(feature = "cuda")]
    return crate::gpu::upload::ring_bytes(streams, chunk);
    #[cfg(not(feature = "cuda"))]
    None
}

/// What a transfer thread makes its landing from: `Send`, unlike the GPU itself.
enum LandingKind {
    Host,
    /// A caller's memory; `None`: taken already (the transfer is refused).
    Lent {
        target: Option<LentTarget>,
        streams: usize,
    },
    #[cfg(feature = "cuda")]
    Device {
        ordinal: u32,
        streams: usize,
    },
}

impl RecvMemory {
    fn landing_for(&self, offer: &Offer) -> LandingKind {
        #[cfg(feature = "cuda")]
        if let RecvMemory::Device(gpu) = self {
            return LandingKind::Device {
                ordinal: gpu.ordinal(),
                streams: offer.hello.count as usize,
            };
        }
        if let RecvMemory::Lent(target) = self {
            return LandingKind::Lent {
                target: target.lock().unwrap_or_else(|p| p.into_inner()).take(),
                streams: offer.hello.count as usize,
            };
        }
        let _ = offer;
        LandingKind::Host
    }
}

impl LandingKind {
    /// The landing for a transfer of `len` bytes in chunks of `chunk`, on this thread.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn make(&mut self, len: usize, chunk: usize) -> anyhow::Result<Box<dyn Landing>> {
        match *self {
            LandingKind::Host => Ok(Box::new(HostLanding::new(len)?)),
            LandingKind::Lent {
                ref mut target,
                streams,
            } => {
                let target = target
                    .take()
                    .ok_or_else(|| anyhow::anyhow!("the caller's buffer is in use"))?;
                lent_landing(target, len, chunk, streams)
            }
            #[cfg(feature = "cuda")]
            LandingKind::Device { ordinal, streams } => {
                let gpu = crate::gpu::Gpu::open(ordinal)?;
                Ok(Box::new(super::landing::DeviceLanding::new(
                    &gpu, len, chunk, streams,
                )?))
            }
        }
    }
}

/// The landing in a caller's memory: its bytes as they are, in place.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn lent_landing(
    target: LentTarget,
    len: usize,
    chunk: usize,
    streams: usize,
) -> anyhow::Result<Box<dyn Landing>> {
    if target.len != len {
        anyhow::bail!("{len} bytes offered into a buffer of {}", target.len);
    }
    let in_use = target.in_use();
    let inner: Box<dyn Landing> = match target.place {
        LentPlace::Host(ptr) => {
            // SAFETY: LentTarget::new's caller promised `len` bytes at `ptr` for this
            // transfer alone until the last token (`in_use`, held by the landing below
            // and so dropped after this buffer) is gone.
            let buffer = unsafe { crate::memory::HostBuffer::borrowed(ptr, len) };
            Box::new(HostLanding::over(buffer)?)
        }
        #[cfg(feature = "cuda")]
        LentPlace::Device { ordinal, ptr } => {
            let gpu = crate::gpu::Gpu::open(ordinal)?;
            // The owner's own work queued on the memory (a tensor zeroed on a stream of
            // its) is done before the first byte lands.
            gpu.synchronize_context()?;
            // SAFETY: as above, device memory of that device's primary context, which
            // `Gpu::open` binds.
            let memory = unsafe { crate::gpu::allocations::DeviceBuffer::borrowed(&gpu, ptr, len) };
            Box::new(super::landing::DeviceLanding::over(
                &gpu, memory, chunk, streams,
            )?)
        }
        #[cfg(not(feature = "cuda"))]
        LentPlace::Device { .. } => {
            anyhow::bail!("this build has no GPU support (the cuda feature)")
        }
    };
    drop(target);
    Ok(Box::new(LentLanding::new(inner, in_use)))
}

/// Listen on `cfg.bind` and serve transfers, telling `report` about each. Returns only
/// with `--once` (`Ok(true)` if that transfer verified) or on an error of the listener.
pub fn serve(
    cfg: &TcpRecvConfig,
    memory: &RecvMemory,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    serve_with(cfg, memory, &admission_of(cfg), report)
}

/// The admission of a receiver on its own, from its limits.
fn admission_of(cfg: &TcpRecvConfig) -> Arc<Admission> {
    Admission::new(Limits::receiver(
        cfg.once,
        cfg.max_connections,
        cfg.max_memory,
        cfg.max_per_peer,
    ))
}

/// [`serve`] under an admission shared with another receiver (`--transport auto` serves
/// verbs and TCP under one).
pub fn serve_with(
    cfg: &TcpRecvConfig,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let listener = TcpListener::bind(cfg.bind).map_err(|e| {
        TransferError::Protocol(format!("cannot listen on {} (TCP): {e}", cfg.bind))
    })?;
    serve_listener(listener, cfg, memory, admission, None, report)
}

/// [`serve`] on a listener bound already (the library's [`crate::api::Listener`], whose
/// port is known before anything is served). With `wait`, a receiver that has no
/// transfer in progress gives up once `wait` has passed since the call
/// ([`TransferError::NoSender`]); one that has waits for it to end.
pub fn serve_on(
    listener: TcpListener,
    cfg: &TcpRecvConfig,
    memory: &RecvMemory,
    wait: Option<Duration>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let call = LibraryCall {
        give_up: wait.map(|w| (Instant::now() + w, w)),
    };
    serve_listener(
        listener,
        cfg,
        memory,
        &admission_of(cfg),
        Some(call),
        report,
    )
}

/// A library call's serve ([`serve_on`]): one transfer per call on a listener that lives
/// on, and how long to wait for a sender.
struct LibraryCall {
    /// When to give up with no transfer in progress, and the wait it was.
    give_up: Option<(Instant, Duration)>,
}

fn serve_listener(
    listener: TcpListener,
    cfg: &TcpRecvConfig,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    library: Option<LibraryCall>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let give_up = library.as_ref().and_then(|c| c.give_up);
    let addr = listener
        .local_addr()
        .map_or_else(|_| cfg.bind.to_string(), |a| a.to_string());
    listener
        .set_nonblocking(true)
        .map_err(|e| TransferError::Protocol(format!("listener: {e}")))?;
    report(&RecvOutcome::Listening { addr });

    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        admission: admission.clone(),
        routes: Routes::default(),
        gate: Default::default(),
        one_per_call: library.is_some() && cfg.once,
    });
    let (events, rx) = mpsc::channel::<Event>();
    let stop = Arc::new(AtomicBool::new(false));
    let accepter = {
        let (events, shared, stop) = (events.clone(), shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn(move || accept_loop(listener, &shared, events, &stop))
            .map_err(|e| TransferError::Protocol(format!("cannot start the accept thread: {e}")))?
    };
    let _stop_on_return = StopOnDrop(stop, Some(accepter));

    // Transfer threads started and not yet served: a bounded wait ends only between them.
    let mut in_flight = 0usize;
    loop {
        let mut poll = Duration::from_secs(1);
        if let Some((at, waited)) = give_up {
            let now = Instant::now();
            if in_flight == 0 && now >= at {
                return Err(TransferError::NoSender { waited });
            }
            poll = poll.min(at.saturating_duration_since(now).max(ACCEPT_POLL));
        }
        let Ok(event) = rx.recv_timeout(poll) else {
            continue;
        };
        match event {
            Event::Offer(offer) => {
                // A caller that asked to see the offer first lends memory for it now, or
                // declines it, and the call ends with that offer either way.
                let lent_on_ask;
                let memory = match memory {
                    RecvMemory::Ask(caller) => {
                        let seen = OfferSeen {
                            peer: offer.peer,
                            bytes: offer.header.total_bytes,
                            chunk: offer.header.chunk_bytes as u64,
                            name: offer.name.clone(),
                        };
                        let Some(target) = caller.ask(seen) else {
                            let reason = RejectReason::Declined;
                            report(&refuse(offer.control, offer.peer, reason, None));
                            return Ok(false);
                        };
                        lent_on_ask = RecvMemory::Lent(std::sync::Mutex::new(Some(target)));
                        &lent_on_ask
                    }
                    memory => memory,
                };
                let want = Want {
                    bytes: memory.bytes_for(
                        offer.header.total_bytes,
                        offer.header.chunk_bytes as u64,
                        offer.hello.count,
                    ),
                    // The control socket, its clone, and the other streams.
                    descriptors: offer.hello.count as u64 + 1,
                };
                if let Some((reason, why)) = memory.refuses(&offer.header) {
                    report(&refuse(offer.control, offer.peer, reason, why));
                    continue;
                }
                // Chunks checked by checksum or striped keep books per chunk, counted
                // with the buffers: tiny chunks would cost many times their data.
                let books = Books::of(
                    offer.header.chunks(),
                    offer.header.verify.checksum(),
                    offer.header.striped,
                );
                let lease = match shared.admission.admit_offer(offer.peer.ip(), want, books) {
                    Ok(lease) => lease,
                    Err(reason) => {
                        report(&refuse(offer.control, offer.peer, reason, None));
                        continue;
                    }
                };
                // Every transfer is served on a thread of its own, into host or GPU
                // memory alike, so none waits for another's trickle.
                let mut landing = memory.landing_for(&offer);
                let (events, shared) = (events.clone(), shared.clone());
                let peer = offer.peer;
                let spawned = std::thread::Builder::new()
                    .name("tcp-transfer".into())
                    .spawn(move || {
                        let (outcome, accepted) =
                            serve_offer(&shared, offer, lease, &mut |len, chunk| {
                                landing.make(len, chunk)
                            });
                        let _ = events.send(Event::Served { outcome, accepted });
                    });
                match spawned {
                    Ok(_) => in_flight += 1,
                    Err(e) => report(&RecvOutcome::Failed {
                        peer: peer.to_string(),
                        error: format!("cannot start a transfer thread: {e}"),
                    }),
                }
            }
            Event::Outcome(outcome) => report(&outcome),
            Event::Served { outcome, accepted } => {
                in_flight = in_flight.saturating_sub(1);
                report(&outcome);
                if cfg.once && accepted {
                    return Ok(completed_ok(&outcome));
                }
            }
        }
    }
}

fn completed_ok(outcome: &RecvOutcome) -> bool {
    matches!(outcome, RecvOutcome::Completed(r) if r.ok())
}

/// Stops the accept loop when the receiver returns.
struct StopOnDrop(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
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
    events: mpsc::Sender<Event>,
    stop: &AtomicBool,
) {
    let tell = |outcome| {
        let _ = events.send(Event::Outcome(outcome));
    };
    let mut starved = false; // said "out of descriptors" already, until an accept works
    while !stop.load(Ordering::Relaxed) {
        if !shared.gate.open() {
            std::thread::sleep(ACCEPT_POLL);
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
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
        let (events, shared) = (events.clone(), shared.clone());
        let spawned = std::thread::Builder::new()
            .name("tcp-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let event = super::handshake::handshake(&shared, stream, peer, deadline, slot);
                if let Some(event) = event {
                    let _ = events.send(event);
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

type MakeLanding<'a> = dyn FnMut(usize, usize) -> anyhow::Result<Box<dyn Landing>> + 'a;

/// Serve one admitted offer: buffer, accept, gather the streams, receive, verify, ack
/// (once per transfer of a `--reuse-connection`). Also whether the accept was sent.
fn serve_offer(
    shared: &Shared,
    offer: Offer,
    lease: Lease,
    make: &mut MakeLanding<'_>,
) -> (RecvOutcome, bool) {
    let cfg = &shared.cfg;
    let Offer {
        mut control,
        peer,
        header,
        hello,
        name,
    } = offer;
    let label = peer.to_string();
    let total = header.total_bytes;
    let failed = |e: TransferError| RecvOutcome::Failed {
        peer: label.clone(),
        error: e.to_string(),
    };
    let (Ok(len), Ok(chunk)) = (usize::try_from(total), usize::try_from(header.chunk_bytes)) else {
        return (
            refuse(control, peer, RejectReason::NoMemory { bytes: total }, None),
            false,
        );
    };
    let plan = match ChunkPlan::new(total, header.chunk_bytes as u64) {
        Ok(p) => p,
        Err(e) => {
            let reason = RejectReason::BadHeader(WireError::Inconsistent { what: "chunk plan" });
            return (refuse(control, peer, reason, Some(e)), false);
        }
    };
    let mut landing = match make(len, chunk) {
        Ok(l) => l,
        Err(e) => {
            let reason = RejectReason::NoMemory { bytes: total };
            return (refuse(control, peer, reason, Some(format!("{e:#}"))), false);
        }
    };
    if header.striped {
        let why = if plan.count() > super::striped::MAX_STRIPED_CHUNKS {
            Some(format!(
                "a striped transfer of {} chunks (at most {}): use bigger chunks",
                plan.count(),
                super::striped::MAX_STRIPED_CHUNKS
            ))
        } else if landing.host_bytes(len).is_none() {
            Some(
                "a striped transfer lands in host memory only (this receiver has --mem device)"
                    .into(),
            )
        } else {
            None
        };
        if let Some(why) = why {
            let reason = RejectReason::BadHeader(WireError::Inconsistent {
                what: "a striped transfer this receiver cannot take",
            });
            return (refuse(control, peer, reason, Some(why)), false);
        }
    }
    let Some((route, streams_in)) =
        shared
            .routes
            .open(hello.token, peer.ip(), hello.count, header.striped)
    else {
        let reason = RejectReason::BadHeader(WireError::Inconsistent {
            what: "a connection token already in use",
        });
        return (refuse(control, peer, reason, None), false);
    };
    let accept = AcceptInfo {
        addr: 0,
        rkey: 0,
        len: total,
    };
    if let Err(e) = control.write_all(&accept.encode()) {
        let why = socket::why(&e, cfg.timeout, "accepting the offer");
        return (
            failed(TransferError::Protocol(format!("{peer}: {why}"))),
            false,
        );
    }
    // From here on the transfer is served: its outcome uses `--once` up.
    let accepted_at = Instant::now();
    let gathered = gather(
        cfg,
        &control,
        hello.count,
        &streams_in,
        header.striped,
        &label,
    );
    let outcome = match gathered {
        Ok((sockets, rails)) => {
            drop(route); // every stream is in (or late): nothing more may join
            if shared.one_per_call {
                // Served alone and the call ends with it: whoever connects next waits
                // in the listen queue for the next call (a wait of a poll at most).
                shared.gate.close_and_wait(ACCEPT_POLL * 50);
            }
            // The sockets have one owner (no clones: the admission counted one
            // descriptor each): the fixed readers' list, or the striped rounds' state.
            let (streams, mode) = match header.striped {
                true => (
                    Vec::new(),
                    Mode::Striped(super::striped::Streams::new(sockets, rails)),
                ),
                false => (sockets.into_iter().flatten().collect(), Mode::Fixed),
            };
            receive_all(
                cfg,
                &mut control,
                &streams,
                mode,
                &label,
                header,
                &plan,
                len,
                Held { landing, lease },
                accepted_at,
                name,
            )
        }
        Err(e) => failed(e),
    };
    (outcome, true)
}

/// How a connection's chunks come: each on the stream its index says, or striped.
enum Mode {
    Fixed,
    Striped(super::striped::Streams),
}

/// Read the chunks `which` into place: on the fixed streams, the landing reads them;
/// striped, round after round, asking for the chunks that did not arrive (written into
/// a rail that failed) with a missing-chunk [`Resend`], until all are in or the rounds
/// are used up.
fn receive_which(
    mode: &mut Mode,
    control: &mut TcpStream,
    landing: &mut dyn Landing,
    streams: &[TcpStream],
    reads: Reads<'_>,
    which: Which<'_>,
) -> Result<(), Stop> {
    let state = match mode {
        Mode::Fixed => return landing.receive(streams, reads, which),
        Mode::Striped(state) => state,
    };
    let (plan, limits) = (reads.plan, reads.limits);
    let len = plan.total() as usize;
    let Some(bytes) = landing.host_bytes(len) else {
        return Err(Stop::Broken("a striped transfer needs host memory".into()));
    };
    let mut missing = super::striped::receive_round(bytes, state, reads, which)?;
    let mut round = 0u32;
    while !missing.is_empty() {
        round += 1;
        state.asked_again += missing.len() as u64;
        if round > super::frames::MAX_MISSING_ROUNDS {
            return Err(Stop::Broken(format!(
                "{} chunks still missing after {} rounds of asking for them again (first: {})",
                missing.len(),
                super::frames::MAX_MISSING_ROUNDS,
                missing[0]
            )));
        }
        let request = Resend {
            round,
            last: false,
            missing: true,
            chunks: missing.clone(),
        };
        control.write_all(&request.encode()).map_err(|e| {
            Stop::Broken(socket::why(&e, limits.timeout, "asking for missing chunks"))
        })?;
        missing = super::striped::receive_round(bytes, state, reads, Which::Only(&missing))?;
    }
    Ok(())
}

/// What a served transfer holds until its last ack: its buffers and its admission lease.
struct Held {
    landing: Box<dyn Landing>,
    lease: Lease,
}

/// Collect the transfer's streams (stream 0 is the control socket) within `--timeout`.
fn gather(
    cfg: &TcpRecvConfig,
    control: &TcpStream,
    count: u16,
    streams_in: &super::routes::Joined,
    striped: bool,
    peer: &str,
) -> Result<(Vec<Option<TcpStream>>, Vec<u16>), TransferError> {
    let clone = control
        .try_clone()
        .map_err(|e| TransferError::Protocol(format!("cannot clone the socket: {e}")))?;
    let mut slots: Vec<Option<TcpStream>> = (0..count).map(|_| None).collect();
    // A stream that never joins has no rail we know of.
    let mut rails = vec![super::striped::UNKNOWN_RAIL; count as usize];
    rails[0] = 0;
    slots[0] = Some(clone);
    // A striped transfer starts with the streams that joined within a moment: a rail
    // whose link died between its connection and its hello must not hold up the others
    // for all of --timeout (the sender fails that rail over; its chunks are asked for
    // again).
    let wait = match striped {
        true => cfg.timeout.min(STRIPED_JOIN),
        false => cfg.timeout,
    };
    let deadline = Instant::now() + wait;
    while slots.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match streams_in.recv_timeout(left) {
            // The route lets each index in once and below the count.
            Ok((index, rail, stream)) => {
                slots[index as usize] = Some(stream);
                rails[index as usize] = rail;
            }
            Err(_) if striped => break,
            Err(_) => {
                let have = slots.iter().filter(|s| s.is_some()).count();
                return Err(TransferError::Protocol(format!(
                    "{peer} opened {have} of its {count} streams within {}",
                    crate::rdma::format_duration(cfg.timeout)
                )));
            }
        }
    }
    Ok((slots, rails))
}

/// How long a striped transfer waits for its streams to join before it starts without
/// the late ones.
const STRIPED_JOIN: Duration = Duration::from_secs(1);

/// Every transfer of the connection: receive within its deadline, verify, ack. A
/// connection broken after `k` of `n` transfers reports `k`.
#[allow(clippy::too_many_arguments)]
fn receive_all(
    cfg: &TcpRecvConfig,
    control: &mut TcpStream,
    streams: &[TcpStream],
    mut mode: Mode,
    peer: &str,
    header: Header,
    plan: &ChunkPlan,
    len: usize,
    held: Held,
    accepted_at: Instant,
    name: Option<String>,
) -> RecvOutcome {
    let Held { landing, lease } = held;
    let path = landing.path();
    let (mut held_landing, mut held_lease) = (Some(landing), Some(lease));
    let mut first_values = Vec::new();
    let total = header.total_bytes;
    let transfers = header.transfers.max(1);
    let failed = |e: TransferError, done: u32| RecvOutcome::Failed {
        peer: peer.to_string(),
        error: if transfers > 1 {
            format!(
                "{e} (in transfer {} of {transfers}; {done} done before it)",
                done + 1
            )
        } else {
            e.to_string()
        },
    };
    let mut seconds = 0.0;
    let mut verify_seconds = 0.0;
    let mut verification = None;
    let mut verify_error = None;
    let mut reply_delivered = true;
    let mut done = 0u32;
    let mut integrity = Integrity {
        verify: Some(header.verify),
        payload: Some(header.payload),
        name: name.clone(),
        ..Integrity::default()
    };
    for k in 0..transfers {
        let Some(landing) = held_landing.as_mut() else {
            break;
        };
        if k > 0 {
            if let Err(e) = landing.poison() {
                return failed(TransferError::Memory(e), done);
            }
        }
        let limits = ReadLimits {
            timeout: cfg.timeout,
            deadline: crate::server::whole_deadline(
                accepted_at,
                cfg.timeout,
                cfg.min_rate,
                total,
                k as u64,
            ),
        };
        let got = AtomicU64::new(0);
        let start = Instant::now();
        let checks = ChunkChecks::new(header.verify.checksum(), plan.count());
        let reads = Reads {
            plan,
            limits,
            got: &got,
            checks: &checks,
        };
        let received = receive_which(
            &mut mode,
            control,
            landing.as_mut(),
            streams,
            reads,
            Which::All,
        )
        .and_then(|()| {
            repair(
                &mut mode,
                control,
                landing.as_mut(),
                streams,
                reads,
                &header,
            )
        });
        let repairs = match received {
            Ok(r) => r,
            Err(stop) => {
                // The bytes of this transfer that arrived: chunks and pieces sent again
                // are read only after the first pass has brought all `total`, and are
                // not more of the transfer.
                let got = got.load(Ordering::Relaxed).min(total);
                let e = match stop {
                    Stop::TooSlow => {
                        // Tell the sender why, as its ack, then shut the connection.
                        let _ = control.set_write_timeout(Some(Duration::from_secs(1)));
                        let _ = control.write_all(&Ack::too_slow(got).encode());
                        for s in streams {
                            let _ = s.shutdown(Shutdown::Both);
                        }
                        if let Mode::Striped(state) = &mode {
                            state.shut_all();
                        }
                        // Counted over the connection, as the rate is.
                        TransferError::TooSlow {
                            peer: peer.to_string(),
                            got: total * done as u64 + got,
                            total: total * transfers as u64,
                            seconds: accepted_at.elapsed().as_secs_f64(),
                            min_rate: cfg.min_rate,
                        }
                    }
                    Stop::Broken(why) => TransferError::Incomplete {
                        peer: peer.to_string(),
                        got,
                        total,
                        why,
                    },
                };
                return failed(e, done);
            }
        };
        seconds += start.elapsed().as_secs_f64();
        let t_verify = Instant::now();
        let pattern = header.verify.pattern().then(|| landing.verify(len));
        let took = t_verify.elapsed();
        verify_seconds += took.as_secs_f64();
        let this = pattern.as_ref().map(|r| r.as_ref().ok().copied());
        // A digest only of bytes that landed and passed their checks: with every chunk
        // passed, each one's CRC32C where it landed is its frame's, so the digest over
        // the frames' CRC32Cs is that of the bytes as they landed. With a chunk that
        // still fails there is none (the sender's claims are not the data here).
        let digest = (checks.enabled() && repairs.failed.is_empty())
            .then(|| crate::integrity::digest(&checks.all(), plan.chunk_bytes(), total));
        // Repaired: the chunks that failed and then passed, never those still failing.
        let mut ack = Ack::checked(total, this, digest, repairs.repaired.len() as u32);
        if header.repeats() {
            ack = ack.with_verify_time(took);
        }
        if let Some(this) = this {
            verification = merge(verification, this, k);
        }
        if let Some(Err(e)) = &pattern {
            verify_error = Some(format!("{e:#}"));
        }
        integrity.digest = digest;
        integrity.chunks_checked += if checks.enabled() {
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
        if !repairs.failed.is_empty() {
            ack = ack.with_status(AckStatus::ChecksumFailed);
        } else if let (Some(out), AckStatus::Verified) = (&cfg.output, ack.status) {
            match out.store(name.as_deref(), peer, |w| landing.write_out(len, w)) {
                Ok(at) => integrity.stored = Some(at),
                Err(e) => {
                    integrity.store_error = Some(format!("{e:#}"));
                    ack = ack.with_status(AckStatus::NotStored);
                }
            }
        }
        done += 1;
        if k + 1 == transfers {
            // The last ack goes out only after this transfer's buffers and its admission
            // lease are given back: a sender that offers its next transfer the moment it
            // hears this one's result must find the memory free, not "busy".
            first_values = landing.first_values(5).unwrap_or_default();
            held_landing = None;
            drop(held_lease.take());
        }
        if control.write_all(&ack.encode()).is_err() {
            reply_delivered = false;
            break;
        }
    }
    let bytes = total * done as u64;
    RecvOutcome::Completed(RecvReport {
        peer: peer.to_string(),
        op: "tcp",
        bytes,
        chunks: plan.count() * done as u64,
        seconds,
        gbps: gigabytes_per_second(bytes, seconds),
        path,
        verification: if verify_error.is_some() {
            None
        } else {
            verification
        },
        verify_error,
        first_values: match &held_landing {
            Some(landing) => landing.first_values(5).unwrap_or_default(),
            None => first_values,
        },
        imm: None,
        reply_delivered,
        transfers: done,
        offered: transfers,
        verify_seconds,
        memory: AttemptLog::default(),
        integrity: Box::new(integrity),
        striped: match &mode {
            Mode::Striped(state) => Some(Box::new(state.summary())),
            Mode::Fixed => None,
        },
    })
}

/// What the resend rounds of one transfer did.
#[derive(Default)]
struct Repairs {
    /// Chunks that failed and then passed: (chunk, times sent in all), by chunk.
    repaired: Vec<(u32, u32)>,
    /// Chunks asked for again, all rounds together.
    resent: u64,
    /// Chunks that still failed when the rounds were used up.
    failed: Vec<u32>,
}

/// Ask for the chunks whose CRC32C failed where they landed, in rounds that converge
/// ([`Converge`], as over verbs but in pieces): a failed chunk comes again as pieces,
/// each in a frame with its own CRC32C (when the sender offers them, and not striped,
/// where frames are placed by chunk), a failed piece as smaller ones, each round read
/// into place and checked; the rounds end when all pass, when the next would send more
/// again than the transfer's size, after `--timeout` without a repair, or at the
/// sender's `--max-resends`. Then the chunks still failing are named in a final
/// [`Resend`] (an ack saying so follows).
fn repair(
    mode: &mut Mode,
    control: &mut TcpStream,
    landing: &mut dyn Landing,
    streams: &[TcpStream],
    reads: Reads<'_>,
    header: &Header,
) -> Result<Repairs, Stop> {
    let Reads {
        plan,
        limits,
        checks,
        ..
    } = reads;
    let checking = |e: anyhow::Error| Stop::Broken(format!("checking the chunks: {e:#}"));
    let ask = |control: &mut TcpStream, request: &[u8]| -> Result<(), Stop> {
        control
            .write_all(request)
            .map_err(|e| Stop::Broken(socket::why(&e, limits.timeout, "asking for chunks again")))
    };
    let first = landing
        .failed_chunks(plan, Which::All, checks)
        .map_err(checking)?;
    let pieces = header.pieces && matches!(mode, Mode::Fixed);
    let mut rounds = Converge::new(
        plan.total(),
        plan.chunk_bytes(),
        pieces,
        header.max_resends,
        limits.timeout,
        first,
        Instant::now(),
    );
    let failed = loop {
        let (round, unit, items, fresh) = match rounds.next(Instant::now()) {
            Step::Done => break Vec::new(),
            Step::GiveUp { round, chunks, .. } => {
                let request = Resend {
                    round,
                    last: true,
                    missing: false,
                    chunks,
                };
                ask(control, &request.encode())?;
                break request.chunks;
            }
            Step::Ask {
                round,
                unit,
                items,
                fresh,
            } => (round, unit, items, fresh),
        };
        // The plan this round reads by: the chunks', or one of pieces (frames of pieces,
        // each checked against its own CRC32C, kept apart from the chunks').
        let piece_plan;
        let piece_checks;
        // The lists travel in the requests and come back out of them, not copied: a
        // round may name every chunk of a million. `sent`: what the sender sends of
        // `items` (`None`: all of them).
        let (round_reads, items, sent) = match unit {
            Unit::Chunks => {
                let request = Resend {
                    round,
                    last: false,
                    missing: false,
                    chunks: items,
                };
                ask(control, &request.encode())?;
                (reads, request.chunks, None)
            }
            Unit::Pieces(shift) => {
                piece_plan = ChunkPlan::new(plan.total(), 1 << shift)
                    .map_err(|e| Stop::Broken(format!("cutting chunks into pieces: {e}")))?;
                piece_checks = ChunkChecks::new(true, piece_plan.count());
                let reads = Reads {
                    plan: &piece_plan,
                    checks: &piece_checks,
                    ..reads
                };
                if fresh {
                    // New pieces of what failed: most are good where they landed (one
                    // bit flip spoils one piece of sixteen). The sender's CRC32C of each
                    // says which are not; only those come again.
                    let query = PieceResend {
                        round,
                        shift,
                        pieces: items,
                    };
                    ask(control, &query.encode_query())?;
                    let theirs = read_crcs(control, round, query.pieces.len() as u32, limits)?;
                    let landed = landing
                        .landed_crcs(&piece_plan, &query.pieces)
                        .map_err(checking)?;
                    let differ: Vec<u32> = query
                        .pieces
                        .iter()
                        .zip(theirs.iter().zip(&landed))
                        .filter(|(_, (t, l))| t != l)
                        .map(|(&k, _)| k)
                        .collect();
                    let request = PieceResend {
                        round,
                        shift,
                        pieces: differ,
                    };
                    if !request.pieces.is_empty() {
                        ask(control, &request.encode())?;
                    }
                    (reads, query.pieces, Some(request.pieces))
                } else {
                    let request = PieceResend {
                        round,
                        shift,
                        pieces: items,
                    };
                    ask(control, &request.encode())?;
                    (reads, request.pieces, None)
                }
            }
        };
        let sent_list: &[u32] = sent.as_deref().unwrap_or(&items);
        let which = Which::Only(sent_list);
        let still = if sent_list.is_empty() {
            Vec::new()
        } else {
            // Every byte has arrived by now, so "got N of N bytes" alone would read as
            // done: say that the transfer broke while chunks were being sent again.
            receive_which(mode, control, landing, streams, round_reads, which).map_err(|stop| {
                match stop {
                    Stop::Broken(why) => Stop::Broken(format!(
                        "in resend round {round}, {} {} asked again: {why}",
                        sent_list.len(),
                        match unit {
                            Unit::Chunks => "chunk(s)",
                            Unit::Pieces(_) => "piece(s)",
                        }
                    )),
                    too_slow => too_slow,
                }
            })?;
            // Increasing, among those sent: what still fails after this round.
            landing
                .failed_chunks(round_reads.plan, which, round_reads.checks)
                .map_err(checking)?
        };
        let passed: Vec<bool> = items
            .iter()
            .map(|c| still.binary_search(c).is_err())
            .collect();
        let completed = rounds.checked(&items, &passed, sent_list, Instant::now());
        if let (Unit::Pieces(_), false) = (unit, completed.is_empty()) {
            // Every piece of these chunks passed its own CRC32C: the chunk's CRC32C is
            // now that of its bytes where they landed (for the digest, which the sender
            // checks against its own), not its first frame's.
            let landed = landing.landed_crcs(plan, &completed).map_err(checking)?;
            for (&c, crc) in completed.iter().zip(landed) {
                checks.expect(c as u64, crc);
            }
        }
    };
    Ok(Repairs {
        repaired: rounds.repaired(),
        resent: rounds.resent(),
        failed,
    })
}

/// The sender's answer to the query of round `round` about `count` pieces, read from
/// `control` within the transfer's limits: the CRC32C of each.
fn read_crcs(
    control: &TcpStream,
    round: u32,
    count: u32,
    limits: ReadLimits,
) -> Result<Vec<u32>, Stop> {
    let stop = |e: socket::ReadStop| match e {
        socket::ReadStop::Deadline => Stop::TooSlow,
        socket::ReadStop::Io(e) => Stop::Broken(socket::why(
            &e,
            limits.timeout,
            "reading the sender's CRC32C of pieces",
        )),
    };
    let mut head = [0u8; crate::wire::REPLY_PREFIX_LEN];
    socket::read_exact_within(control, &mut head, limits.timeout, limits.deadline).map_err(stop)?;
    crate::wire::pieces::decode_crcs_head(&head, round, count).map_err(|e| {
        Stop::Broken(format!(
            "protocol error: the sender's CRC32C of pieces: {e}"
        ))
    })?;
    let mut body = vec![0u8; count as usize * 4];
    socket::read_exact_within(control, &mut body, limits.timeout, limits.deadline).map_err(stop)?;
    Ok(crate::wire::pieces::decode_crcs(&body))
}

/// The verification of all transfers of a connection: counts add up, the first
/// mismatch is the first transfer's that has one (as an element index of that transfer).
fn merge(
    acc: Option<crate::memory::Verification>,
    this: Option<crate::memory::Verification>,
    k: u32,
) -> Option<crate::memory::Verification> {
    match (acc, this) {
        (_, None) => None,
        (None, Some(v)) if k == 0 => Some(v),
        (None, Some(_)) => None,
        (Some(a), Some(v)) => Some(crate::memory::Verification {
            elements: a.elements + v.elements,
            mismatches: a.mismatches + v.mismatches,
            first_mismatch: a.first_mismatch.or(v.first_mismatch),
            crc32: v.crc32,
        }),
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

    /// Lands nothing, verifies everything: only the report logic around it is tested.
    struct Verifies;

    impl Landing for Verifies {
        fn poison(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
        fn receive(&mut self, _: &[TcpStream], reads: Reads<'_>, _: Which<'_>) -> Result<(), Stop> {
            reads.got.store(4096, Ordering::Relaxed);
            Ok(())
        }
        fn failed_chunks(
            &mut self,
            _: &ChunkPlan,
            _: Which<'_>,
            _: &ChunkChecks,
        ) -> anyhow::Result<Vec<u32>> {
            Ok(Vec::new())
        }
        fn landed_crcs(&mut self, _: &ChunkPlan, c: &[u32]) -> anyhow::Result<Vec<u32>> {
            Ok(vec![0; c.len()])
        }
        fn write_out(&mut self, _: usize, _: &mut dyn std::io::Write) -> anyhow::Result<()> {
            Ok(())
        }
        fn verify(&self, len: usize) -> anyhow::Result<crate::memory::Verification> {
            Ok(crate::memory::Verification {
                elements: len as u64 / 4,
                mismatches: 0,
                first_mismatch: None,
                crc32: None,
            })
        }
        fn first_values(&self, _: usize) -> anyhow::Result<Vec<i32>> {
            Ok(Vec::new())
        }
        fn path(&self) -> crate::memory::DataPath {
            crate::memory::DataPath::HostMemory
        }
    }

    /// A one-connection receiver's options for receive_all, 1 s deadlines.
    fn config(once: bool, max_memory: u64) -> TcpRecvConfig {
        TcpRecvConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            once,
            max_bytes: 1 << 30,
            timeout: Duration::from_secs(1),
            max_connections: 1,
            max_memory,
            min_rate: 0,
            max_per_peer: 1,
            allow: AllowList::default(),
            key: None,
            output: None,
        }
    }

    /// A landing that verifies, and the lease of an admission with room for exactly it.
    fn held_for(bytes: u64) -> Held {
        held_in(&admission_for(bytes), bytes)
    }

    fn admission_for(bytes: u64) -> Arc<Admission> {
        Admission::new(Limits::receiver(false, 1, bytes, 1))
    }

    fn held_in(admission: &Arc<Admission>, bytes: u64) -> Held {
        held_with(admission, bytes, Box::new(Verifies))
    }

    fn held_with(admission: &Arc<Admission>, bytes: u64, landing: Box<dyn Landing>) -> Held {
        let want = Want {
            bytes,
            descriptors: 1,
        };
        Held {
            landing,
            lease: admission.admit("127.0.0.1".parse().unwrap(), want).unwrap(),
        }
    }

    #[test]
    fn the_last_ack_comes_after_the_buffers_and_the_lease_are_given_back() {
        // A sender that offers its next transfer the moment it hears the last one's result
        // must find the receiver's memory free (it was told "busy" when the ack came
        // first and the buffers went after).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut control, _) = listener.accept().unwrap();
        let admission = admission_for(4096);
        // A landing that takes a while to give its memory back (a 1 GiB cuMemFree does).
        struct SlowToFree(Arc<AtomicBool>);
        impl Drop for SlowToFree {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(200));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        // The second field is only dropped: that is its job.
        struct Freed(Verifies, #[allow(dead_code)] SlowToFree);
        impl Landing for Freed {
            fn poison(&mut self) -> anyhow::Result<()> {
                self.0.poison()
            }
            fn receive(&mut self, s: &[TcpStream], r: Reads<'_>, w: Which<'_>) -> Result<(), Stop> {
                self.0.receive(s, r, w)
            }
            fn failed_chunks(
                &mut self,
                p: &ChunkPlan,
                w: Which<'_>,
                c: &ChunkChecks,
            ) -> anyhow::Result<Vec<u32>> {
                self.0.failed_chunks(p, w, c)
            }
            fn landed_crcs(&mut self, p: &ChunkPlan, c: &[u32]) -> anyhow::Result<Vec<u32>> {
                self.0.landed_crcs(p, c)
            }
            fn write_out(&mut self, n: usize, o: &mut dyn std::io::Write) -> anyhow::Result<()> {
                self.0.write_out(n, o)
            }
            fn verify(&self, len: usize) -> anyhow::Result<crate::memory::Verification> {
                self.0.verify(len)
            }
            fn first_values(&self, n: usize) -> anyhow::Result<Vec<i32>> {
                self.0.first_values(n)
            }
            fn path(&self) -> crate::memory::DataPath {
                self.0.path()
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let landing = Box::new(Freed(Verifies, SlowToFree(freed.clone())));
        let held = held_with(&admission, 4096, landing);
        let header = Header::new(crate::wire::Op::Send, 4096, 4096, 1).unwrap();
        let plan = ChunkPlan::new(4096, 4096).unwrap();
        let cfg = config(false, 4096);
        let next = std::thread::scope(|scope| {
            let sender = scope.spawn(|| {
                let mut ack = [0u8; crate::wire::ACK_LEN];
                std::io::Read::read_exact(&mut peer, &mut ack).unwrap();
                assert!(
                    freed.load(Ordering::SeqCst),
                    "the ack arrived before the buffers were given back"
                );
                // The next offer, at once: the whole memory again.
                let want = Want {
                    bytes: 4096,
                    descriptors: 1,
                };
                admission.admit("127.0.0.1".parse().unwrap(), want).is_ok()
            });
            let outcome = receive_all(
                &cfg,
                &mut control,
                &[],
                Mode::Fixed,
                "peer",
                header,
                &plan,
                4096,
                held,
                Instant::now(),
                None,
            );
            assert!(
                matches!(outcome, RecvOutcome::Completed(ref r) if r.ok()),
                "{outcome:?}"
            );
            sender.join().unwrap()
        });
        assert!(
            next,
            "the next transfer was refused: the lease outlived the ack"
        );
    }

    #[test]
    fn a_connection_whose_ack_cannot_be_sent_after_1_of_n_reports_1_and_not_ok() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut control, _) = listener.accept().unwrap();
        control.shutdown(Shutdown::Write).unwrap(); // every ack write fails
        let header = Header::new(crate::wire::Op::Send, 4096, 4096, 1)
            .and_then(|h| h.with_transfers(1 << 20))
            .unwrap();
        let plan = ChunkPlan::new(4096, 4096).unwrap();
        let cfg = config(true, 1 << 30);
        let outcome = receive_all(
            &cfg,
            &mut control,
            &[],
            Mode::Fixed,
            "peer",
            header,
            &plan,
            4096,
            held_for(4096),
            Instant::now(),
            None,
        );
        let RecvOutcome::Completed(r) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!((r.transfers, r.offered, r.bytes), (1, 1 << 20, 4096));
        assert!(!r.reply_delivered);
        assert!(!r.ok(), "1 of 2^20 transfers is not ok");
    }
}
