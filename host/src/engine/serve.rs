//! The serving loop, the same for every listener: hear an offer, admit it (or refuse it,
//! saying why) under one [`Admission`] before anything is allocated for it, serve each
//! admitted transfer on a thread of its own ([`super::serve_offer`]: its memory made
//! there, its connection accepted, the receive loop run, the last ack sent), and report
//! every outcome. Returns only with `--once` (whether that transfer verified), at a
//! library call's end, or on an error of the listener.
//!
//! `--once` is used up only by a transfer that was accepted: junk, probes, refusals and
//! busy answers leave the receiver serving.

use super::cancel::{bounded, cancelled, CANCELLED};
pub use super::kept_offers::KeptOffers;
use super::kept_offers::{AndKept, PauseOnDrop, MAX_HELD};
use super::options::RecvOptions;
pub use super::options::{SinkFactoryMaker, VerbsServe};
pub use super::recv_memory::{RecvMemory, LIBRARY_TRANSFERS_AT_ONCE};
pub use super::serve_offer::Pausable;
use super::serve_offer::{serve_tcp_offer, serve_verbs_offer, MemoryKind, Served};
use crate::memory::lent::OfferSeen;

use crate::net::tcp::listen::{TcpListen, TcpOffer};
use crate::net::verbs::listen::{VerbsListen, VerbsOffer};
use crate::net::{Heard, ListenConfig};
use crate::server::admission::{Admission, Books, Lease, Limits, Want};
use crate::transfer::{RecvOutcome, TransferError};
use crate::wire::{Header, RejectReason};
use std::net::{SocketAddr, TcpListener};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A library call's serve: one transfer per call on a listener that lives on, and how
/// long to wait for a sender.
pub struct LibraryCall {
    /// Give up with no transfer in progress once this has passed since the call.
    pub wait: Option<Duration>,
}

/// The admission of a receiver on its own, from its limits.
pub fn admission_of(opts: &RecvOptions) -> Arc<Admission> {
    Admission::new(Limits::receiver(
        opts.once,
        opts.max_connections,
        opts.max_memory,
        opts.max_per_peer,
    ))
}

/// An offer a listener heard, as the serving loop sees it whatever the transport.
pub trait Offer: Send + 'static {
    fn peer(&self) -> SocketAddr;
    /// `None`: a raw request (verbs `--raw`), of up to `--max-bytes`.
    fn header(&self) -> Option<&Header>;
    fn name(&self) -> Option<String>;
    /// Streams of the connection (a GPU upload ring's slots serve each).
    fn streams(&self) -> u16;
    /// Descriptors the connection holds.
    fn descriptors(&self) -> u64;
    /// Bytes the connection holds besides its buffer (a verbs rail's slots).
    fn link_bytes(&self) -> u64;
    fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome;
}

impl Offer for TcpOffer {
    fn peer(&self) -> SocketAddr {
        self.peer
    }
    fn header(&self) -> Option<&Header> {
        Some(&self.header)
    }
    fn name(&self) -> Option<String> {
        self.name.clone()
    }
    fn streams(&self) -> u16 {
        self.hello.count
    }
    fn descriptors(&self) -> u64 {
        TcpOffer::descriptors(self)
    }
    fn link_bytes(&self) -> u64 {
        0
    }
    fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        TcpOffer::refuse(self, reason, detail)
    }
}

impl Offer for VerbsOffer {
    fn peer(&self) -> SocketAddr {
        self.peer
    }
    fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }
    fn name(&self) -> Option<String> {
        None // it follows the accept, as the sender's first message
    }
    fn streams(&self) -> u16 {
        1
    }
    fn descriptors(&self) -> u64 {
        0
    }
    fn link_bytes(&self) -> u64 {
        VerbsOffer::link_bytes(self)
    }
    fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        VerbsOffer::refuse(self, reason, detail)
    }
}

impl Pausable for TcpListen {
    fn pause(&self) {
        TcpListen::pause(self, Duration::from_millis(100));
    }
    fn resume(&self) {
        TcpListen::resume(self);
    }
}

impl Pausable for VerbsListen {
    fn pause(&self) {
        VerbsListen::pause(self);
    }
    fn resume(&self) {
        VerbsListen::resume(self);
    }
}

/// What comes back from the listener and the transfers' threads.
enum Event<O> {
    Heard(Heard<O>),
    Served {
        outcome: RecvOutcome,
        accepted: bool,
    },
}

/// Serves one admitted offer on its thread: the outcome, whether it was accepted, and
/// for a connection kept after it, the wait for the sender's next offer on it.
type ServeOne<O> = dyn Fn(O, Lease, MemoryKind, Option<&dyn Pausable>) -> (RecvOutcome, bool, Option<NextOf<O>>)
    + Send
    + Sync;

/// Waits for the next offer on a kept connection (`None`: the session ended).
type NextOf<O> = Box<dyn FnOnce() -> Option<O> + Send>;

/// What a served TCP offer comes to in a loop over offers of kind `O`: a kept
/// connection waits up to `idle` for its next offer (wrapped by `wrap`).
fn tcp_served<O: 'static>(
    served: Served,
    idle: Duration,
    wrap: fn(TcpOffer) -> O,
) -> (RecvOutcome, bool, Option<NextOf<O>>) {
    let next = served
        .kept
        .map(|kept| -> NextOf<O> { Box::new(move || TcpOffer::next_on(kept, idle).map(wrap)) });
    (served.outcome, served.accepted, next)
}

/// Listen on `opts.bind` and serve TCP transfers under an admission of their own,
/// telling `report` about each. Returns only with `--once` (whether that transfer
/// verified) or on an error of the listener.
pub fn serve(
    opts: &RecvOptions,
    memory: &RecvMemory,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let listener = TcpListener::bind(opts.bind).map_err(|e| {
        TransferError::Protocol(format!("cannot listen on {} (TCP): {e}", opts.bind))
    })?;
    serve_tcp(listener, opts, memory, &admission_of(opts), None, report)
}

pub fn listen_config(opts: &RecvOptions) -> ListenConfig {
    ListenConfig {
        timeout: opts.timeout,
        max_bytes: opts.max_bytes,
        allow: opts.allow.clone(),
        key: opts.key.clone(),
    }
}

/// The listener's words, sent to the loop from its threads.
fn tell<O: Send + 'static>(events: &mpsc::Sender<Event<O>>) -> Box<dyn Fn(Heard<O>) + Send + Sync> {
    let heard = Mutex::new(events.clone());
    Box::new(move |h: Heard<O>| {
        let _ = heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Event::Heard(h));
    })
}

/// Serve TCP transfers on `listener` (bound already) under `admission`, telling
/// `report` about each.
pub fn serve_tcp(
    listener: TcpListener,
    opts: &RecvOptions,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    library: Option<LibraryCall>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let (events, rx) = mpsc::channel::<Event<TcpOffer>>();
    let listen = TcpListen::start(
        listener,
        listen_config(opts),
        admission.clone(),
        tell(&events),
    )
    .map_err(|e| TransferError::Protocol(format!("cannot listen: {e}")))?;
    report(&RecvOutcome::Listening {
        addr: listen.local_addr().to_string(),
    });
    let keep = keeps(opts, &library);
    let serve_one: Arc<ServeOne<TcpOffer>> = {
        let opts = opts.clone();
        Arc::new(move |offer, lease, kind, one| {
            let served = serve_tcp_offer(offer, lease, kind, &opts, one, keep);
            tcp_served(served, opts.timeout, |o| o)
        })
    };
    serve_offers(
        Arc::new(listen),
        KeptOffers::new(),
        rx,
        events,
        memory,
        admission,
        opts,
        library,
        report,
        serve_one,
    )
}

/// Whether connections are kept for their senders' next offers: not by a receiver that
/// ends with its one transfer (`--once` outside a library, whose listener lives on).
fn keeps(opts: &RecvOptions, library: &Option<LibraryCall>) -> bool {
    library.is_some() || !opts.once
}

/// Listen on `opts.bind` over verbs and serve its transfers under `admission`, telling
/// `report` about each.
pub fn serve_verbs(
    opts: &RecvOptions,
    how: VerbsServe,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    library: Option<LibraryCall>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let (events, rx) = mpsc::channel::<Event<VerbsOffer>>();
    let listen = VerbsListen::start(
        opts.bind,
        listen_config(opts),
        how.raw,
        tell(&events),
        false,
    )?;
    report(&RecvOutcome::Listening {
        addr: listen.local_addr().to_string(),
    });
    let serve_one: Arc<ServeOne<VerbsOffer>> = {
        let opts = opts.clone();
        Arc::new(move |offer, lease, kind, one| {
            let (outcome, accepted) = serve_verbs_offer(offer, lease, kind, &opts, how, one);
            (outcome, accepted, None)
        })
    };
    serve_offers(
        Arc::new(listen),
        KeptOffers::new(),
        rx,
        events,
        memory,
        admission,
        opts,
        library,
        report,
        serve_one,
    )
}

/// An offer heard by either listener of a receiver that serves both transports.
pub enum AnyOffer {
    Tcp(TcpOffer),
    Verbs(VerbsOffer),
}

impl Offer for AnyOffer {
    fn peer(&self) -> SocketAddr {
        match self {
            AnyOffer::Tcp(o) => Offer::peer(o),
            AnyOffer::Verbs(o) => Offer::peer(o),
        }
    }
    fn header(&self) -> Option<&Header> {
        match self {
            AnyOffer::Tcp(o) => Offer::header(o),
            AnyOffer::Verbs(o) => Offer::header(o),
        }
    }
    fn name(&self) -> Option<String> {
        match self {
            AnyOffer::Tcp(o) => Offer::name(o),
            AnyOffer::Verbs(o) => Offer::name(o),
        }
    }
    fn streams(&self) -> u16 {
        match self {
            AnyOffer::Tcp(o) => Offer::streams(o),
            AnyOffer::Verbs(o) => Offer::streams(o),
        }
    }
    fn descriptors(&self) -> u64 {
        match self {
            AnyOffer::Tcp(o) => Offer::descriptors(o),
            AnyOffer::Verbs(o) => Offer::descriptors(o),
        }
    }
    fn link_bytes(&self) -> u64 {
        match self {
            AnyOffer::Tcp(o) => Offer::link_bytes(o),
            AnyOffer::Verbs(o) => Offer::link_bytes(o),
        }
    }
    fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        match self {
            AnyOffer::Tcp(o) => Offer::refuse(o, reason, detail),
            AnyOffer::Verbs(o) => Offer::refuse(o, reason, detail),
        }
    }
}

/// Both listeners, paused and resumed together.
struct Both {
    tcp: Option<TcpListen>,
    verbs: Option<Arc<VerbsListen>>,
}

impl Pausable for Both {
    fn pause(&self) {
        self.tcp.iter().for_each(Pausable::pause);
        self.verbs.iter().for_each(|v| v.pause());
    }
    fn resume(&self) {
        self.tcp.iter().for_each(Pausable::resume);
        self.verbs.iter().for_each(|v| v.resume());
    }
}

/// A listener's words, as the offers of a receiver that serves both transports. An
/// offer heard once the loop has ended (a library call returned while a handshake was
/// finishing) is held in `kept` for the next call, not dropped with the call's channel
/// (its sender then got a closed connection instead of the next receive).
fn tell_as<O: Send + 'static>(
    events: &mpsc::Sender<Event<AnyOffer>>,
    kept: &Arc<KeptOffers<AnyOffer>>,
    wrap: fn(O) -> AnyOffer,
) -> Box<dyn Fn(Heard<O>) + Send + Sync> {
    let heard = Mutex::new(events.clone());
    let kept = kept.clone();
    Box::new(move |h: Heard<O>| {
        let h = match h {
            Heard::Offer(o) => Heard::Offer(wrap(o)),
            Heard::Said(s) => Heard::Said(s),
        };
        let sent = heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Event::Heard(h));
        if let Err(mpsc::SendError(Event::Heard(Heard::Offer(offer)))) = sent {
            if let Err(offer) = kept.pass_on(offer) {
                // No loop to report to: the refusal goes to the sender alone.
                drop(refuse_busy(offer));
            }
        }
    })
}

/// The verbs side of [`serve_any`]: a listener of its own, started for the call, or one
/// that lives across calls (a library's, paused between them: requests wait in the CM's
/// queue).
pub enum VerbsSide {
    Start(VerbsServe),
    Shared(Arc<VerbsListen>, VerbsServe),
}

/// Serve TCP transfers on `tcp` (bound already) and verbs transfers (`verbs`) at once,
/// under `admission`, on one loop: `--transport auto` with an RDMA device, where a
/// sender whose own choice fell back to TCP finds this receiver too. Either may be left
/// out. With both, the TCP listener is announced as a notice.
///
/// # Errors
/// Neither listener could start, or the verbs one could not and was asked for alone.
#[allow(clippy::too_many_arguments)]
pub fn serve_any(
    tcp: Option<TcpListener>,
    verbs: Option<VerbsSide>,
    kept: Option<Arc<KeptOffers<AnyOffer>>>,
    opts: &RecvOptions,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    library: Option<LibraryCall>,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let (events, rx) = mpsc::channel::<Event<AnyOffer>>();
    let kept = kept.unwrap_or_else(KeptOffers::new);
    let (verbs_listen, how, shared) = match verbs {
        Some(VerbsSide::Start(how)) => {
            let listen = VerbsListen::start(
                opts.bind,
                listen_config(opts),
                how.raw,
                tell_as(&events, &kept, AnyOffer::Verbs),
                false,
            )?;
            (Some(Arc::new(listen)), how, false)
        }
        Some(VerbsSide::Shared(listen, how)) => {
            listen.retell(
                tell_as(&events, &kept, AnyOffer::Verbs),
                listen_config(opts),
            );
            listen.resume();
            (Some(listen), how, true)
        }
        None => (None, VerbsServe::default(), false),
    };
    let tcp_listen = match tcp {
        Some(listener) => Some(
            TcpListen::start(
                listener,
                listen_config(opts),
                admission.clone(),
                tell_as(&events, &kept, AnyOffer::Tcp),
            )
            .map_err(|e| TransferError::Protocol(format!("cannot listen: {e}")))?,
        ),
        None => None,
    };
    if let Some(v) = &verbs_listen {
        report(&RecvOutcome::Listening {
            addr: v.local_addr().to_string(),
        });
    }
    if let Some(t) = &tcp_listen {
        let addr = t.local_addr().to_string();
        report(&match verbs_listen.is_some() {
            true => RecvOutcome::Notice {
                text: format!(
                    "also listening on {addr} (TCP, for senders without an RDMA route here)"
                ),
            },
            false => RecvOutcome::Listening { addr },
        });
    }
    let serve_one: Arc<ServeOne<AnyOffer>> = {
        let opts = opts.clone();
        let keep = keeps(&opts, &library);
        Arc::new(move |offer, lease, kind, one| match offer {
            AnyOffer::Tcp(o) => {
                let served = serve_tcp_offer(o, lease, kind, &opts, one, keep);
                tcp_served(served, opts.timeout, AnyOffer::Tcp)
            }
            AnyOffer::Verbs(o) => {
                let (outcome, accepted) = serve_verbs_offer(o, lease, kind, &opts, how, one);
                (outcome, accepted, None)
            }
        })
    };
    let both = Arc::new(Both {
        tcp: tcp_listen,
        verbs: verbs_listen,
    });
    let served = serve_offers(
        both.clone(),
        kept,
        rx,
        events,
        memory,
        admission,
        opts,
        library,
        report,
        serve_one,
    );
    if shared {
        // Until the next call: requests wait in the CM's queue.
        both.pause();
    }
    served
}

/// Hold `offer` for a library's next receive ([`KeptOffers::hold`]), or refuse it as
/// busy when too many wait already.
fn hold<O: Offer>(kept: &KeptOffers<O>, offer: O, report: &mut dyn FnMut(&RecvOutcome)) {
    if let Err(offer) = kept.hold(offer) {
        report(&refuse_busy(offer));
    }
}

/// Refuse an offer the held ones have no room for: a library call's admission takes one
/// transfer at a time, and [`MAX_HELD`] offers wait for the next calls already.
fn refuse_busy<O: Offer>(offer: O) -> RecvOutcome {
    let reason = RejectReason::BusyConnections {
        active: LIBRARY_TRANSFERS_AT_ONCE as u64,
        max: LIBRARY_TRANSFERS_AT_ONCE as u64,
    };
    let why = format!("{MAX_HELD} more senders wait for this receiver's next receives");
    offer.refuse(reason, Some(why))
}

/// At the end of a library call: offers already heard are the next call's, not dropped
/// with the call's channel.
fn hold_heard<O: Offer>(
    rx: &mpsc::Receiver<Event<O>>,
    kept: &KeptOffers<O>,
    report: &mut dyn FnMut(&RecvOutcome),
) {
    while let Ok(event) = rx.try_recv() {
        match event {
            Event::Heard(Heard::Offer(offer)) => hold(kept, offer, report),
            Event::Heard(Heard::Said(said)) => report(&said),
            Event::Served { outcome, .. } => report(&outcome),
        }
    }
}

/// The loop itself, over any listener's offers.
#[allow(clippy::too_many_arguments)]
fn serve_offers<O: Offer, L: Pausable + 'static>(
    listen: Arc<L>,
    kept: Arc<KeptOffers<O>>,
    rx: mpsc::Receiver<Event<O>>,
    events: mpsc::Sender<Event<O>>,
    memory: &RecvMemory,
    admission: &Arc<Admission>,
    opts: &RecvOptions,
    library: Option<LibraryCall>,
    report: &mut dyn FnMut(&RecvOutcome),
    serve_one: Arc<ServeOne<O>>,
) -> Result<bool, TransferError> {
    let one_per_call = library.is_some() && opts.once;
    let tell = events.clone();
    let tell = Box::new(move |o| {
        let _ = tell.send(Event::Heard(Heard::Offer(o)));
    });
    kept.retell(tell, opts.timeout);
    kept.resume();
    // Until the next call (a library's listener): offers of kept connections are held
    // from the loop's end on, however it ends.
    let _held_after = PauseOnDrop(kept.clone());
    let listen = Arc::new(AndKept {
        listen,
        kept: kept.clone(),
    });
    let give_up = library
        .as_ref()
        .and_then(|c| c.wait)
        .map(|w| (Instant::now() + w, w));
    // Transfer threads started and not yet served: a bounded wait ends only between them.
    let mut in_flight = 0usize;
    // A caller asked about an offer lent memory for it: the call ends with that offer.
    let mut asked = false;
    loop {
        // A cancelled call ends between transfers; one under way ends itself (its
        // receive loop looks at the token too) and is reported first.
        if cancelled(&opts.cancel) && in_flight == 0 {
            return Err(TransferError::Protocol(CANCELLED.into()));
        }
        let mut poll = bounded(Duration::from_secs(1), &opts.cancel);
        if let Some((at, waited)) = give_up {
            let now = Instant::now();
            if in_flight == 0 && now >= at {
                return Err(TransferError::NoSender { waited });
            }
            poll = poll.min(
                at.saturating_duration_since(now)
                    .max(Duration::from_millis(2)),
            );
        }
        let Ok(event) = rx.recv_timeout(poll) else {
            continue;
        };
        match event {
            Event::Heard(Heard::Said(outcome)) => report(&outcome),
            Event::Heard(Heard::Offer(offer)) if one_per_call && in_flight > 0 => {
                // This call's one transfer runs: another sender heard before the listener
                // paused waits for the next call (refusing it as busy told it to go away
                // though the next receive would take it).
                hold(&kept, offer, report);
            }
            Event::Heard(Heard::Offer(offer)) => {
                // Every offer, however it came: a kept connection's next offer skips the
                // listener's handshake, where a new connection's size is checked first.
                if let Some(h) = offer.header().filter(|h| h.total_bytes > opts.max_bytes) {
                    let reason = RejectReason::TooLarge {
                        requested: h.total_bytes,
                        max: opts.max_bytes,
                    };
                    report(&offer.refuse(reason, None));
                    continue;
                }
                // A caller that asked to see the offer first lends memory for it now, or
                // declines it, and the call ends with that offer either way: refused
                // below or served, it is the call's outcome (going on would wait for
                // another sender the caller was never asked about).
                let lent_on_ask;
                let memory = match memory {
                    RecvMemory::Ask(caller) => {
                        let Some(header) = offer.header() else {
                            report(&offer.refuse(RejectReason::Declined, None));
                            continue;
                        };
                        let seen = OfferSeen {
                            peer: offer.peer(),
                            bytes: header.total_bytes,
                            chunk: header.chunk_bytes as u64,
                            name: offer.name(),
                        };
                        let Some(target) = caller.ask(seen) else {
                            report(&offer.refuse(RejectReason::Declined, None));
                            hold_heard(&rx, &kept, report);
                            return Ok(false);
                        };
                        lent_on_ask = RecvMemory::Lent(Mutex::new(Some(target)));
                        asked = true;
                        &lent_on_ask
                    }
                    memory => memory,
                };
                // Where the caller was asked, the refusal ends the call.
                let refused = |outcome: RecvOutcome, report: &mut dyn FnMut(&RecvOutcome)| {
                    report(&outcome);
                    if asked {
                        hold_heard(&rx, &kept, report);
                    }
                    asked
                };
                if let Some((reason, why)) = offer.header().and_then(|h| memory.refuses(h)) {
                    if refused(offer.refuse(reason, why), report) {
                        return Ok(false);
                    }
                    continue;
                }
                let (bytes, books) = match offer.header() {
                    Some(h) => (
                        memory.bytes_for(h.total_bytes, h.chunk_bytes as u64, offer.streams()),
                        // Chunks checked by checksum or striped keep books per chunk,
                        // counted with the buffers: tiny chunks would cost many times
                        // their data.
                        Books::of(h.chunks(), h.verify.checksum(), h.striped),
                    ),
                    None => (opts.max_bytes, Books::default()),
                };
                let want = Want {
                    bytes: bytes.saturating_add(offer.link_bytes()),
                    descriptors: offer.descriptors(),
                };
                let lease = match admission.admit_offer(offer.peer().ip(), want, books) {
                    Ok(lease) => lease,
                    Err(reason) => {
                        if refused(offer.refuse(reason, None), report) {
                            return Ok(false);
                        }
                        continue;
                    }
                };
                let kind = memory.kind();
                let (events, listen, serve_one, kept) = (
                    events.clone(),
                    listen.clone(),
                    serve_one.clone(),
                    kept.clone(),
                );
                let peer = offer.peer();
                let spawned =
                    std::thread::Builder::new()
                        .name("transfer".into())
                        .spawn(move || {
                            let one = one_per_call.then_some(&*listen as &dyn Pausable);
                            let (outcome, accepted, next) = serve_one(offer, lease, kind, one);
                            let _ = events.send(Event::Served { outcome, accepted });
                            // A kept connection waits here for its sender's next offer,
                            // which then goes round the loop as any offer does.
                            if let Some(offer) = next.and_then(|next| next()) {
                                kept.offer(offer);
                            }
                        });
                match spawned {
                    Ok(_) => in_flight += 1,
                    Err(e) => {
                        let failed = RecvOutcome::Failed {
                            peer: peer.to_string(),
                            error: format!("cannot start a transfer thread: {e}"),
                        };
                        if refused(failed, report) {
                            return Ok(false);
                        }
                    }
                }
            }
            Event::Served { outcome, accepted } => {
                in_flight = in_flight.saturating_sub(1);
                report(&outcome);
                // An asked offer's serve ends the call, accepted or not (its connection
                // failed before a byte, or its memory could not be made).
                let last = (opts.once && accepted) || asked;
                if one_per_call && !last {
                    // The call goes on: take the next offer. (After its last one, a
                    // listener that outlives the call stays paused: what comes next is the
                    // next call's.)
                    listen.resume();
                }
                if last {
                    hold_heard(&rx, &kept, report);
                    return Ok(matches!(&outcome, RecvOutcome::Completed(r) if r.ok()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::lent::AskCaller;

    /// A library receive of 1 MiB into GPU memory held a 4 MiB upload ring (one stream
    /// of 1 MiB chunks) against a limit of twice its data, and was refused ("4 MiB more
    /// would put its buffers over its --max-memory 2 MiB"; the H100 run of 2026-12-06).
    /// The limit now has room for the ring of the most streams a sender may open.
    #[test]
    fn memory_that_may_be_gpu_memory_has_room_for_the_upload_ring_of_any_sender() {
        let (offers, _) = std::sync::mpsc::channel();
        let ask = RecvMemory::Ask(AskCaller {
            offers,
            within: Duration::from_secs(1),
        });
        let mib = 1u64 << 20;
        if cfg!(feature = "cuda") {
            let allowance = ask.ring_allowance(mib);
            let streams = crate::net::tcp::frames::MAX_STREAMS;
            assert!(allowance >= u64::from(streams) * 4 * mib, "{allowance}");
            // Not more than the ring of 1 MiB slots, whatever the data's size.
            assert_eq!(ask.ring_allowance(1 << 40), allowance);
        } else {
            assert_eq!(ask.ring_allowance(mib), 0, "no GPU support: no ring");
        }
        assert_eq!(RecvMemory::Host.ring_allowance(mib), 0);
    }
}
