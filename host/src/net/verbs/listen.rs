//! A verbs receiver's listener: one thread takes the RDMA CM's connect requests, tells
//! offers from further rails by their private data, and hands the engine each offer
//! ([`Heard::Offer`] of a [`VerbsOffer`]) with what it needs to answer it. Nothing is
//! allocated before an offer passes the checks that need no memory: `--allow`, the
//! key's proof, the header, the size, the device's largest message. A further rail's
//! join goes to its transfer's thread through the joins book.
//!
//! **Keys.** The CM's private data carries the offer, so a key is proven there: a first
//! request without a proof is rejected with a fresh nonce, the second carries the first
//! bytes of HMAC-SHA256 over its header and that nonce (each nonce good once, for
//! `--timeout`). A join carries no proof, so a receiver with a key takes no striped
//! transfer (said to the sender at its offer).

use crate::net::joins::{Joins, Refused};
use crate::net::{Heard, ListenConfig};
use crate::rdma::{self, CmEventKind, CmId, ConnectRequest, EventChannel, SendableRequest};
use crate::server::key::Nonces;
use crate::server::Key;
use crate::transfer::RecvOutcome;
use crate::wire::{Header, Join, RejectReason, VerbsProof, WireError, HEADER_LEN};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Connection requests the CM queues for the listener before it takes them.
const LISTEN_BACKLOG: i32 = 64;
/// How often the listener looks whether it should stop or go on (a library's next
/// receive resumes it: a request held meanwhile waits this long at most).
const TICK: Duration = Duration::from_millis(5);
/// Nonces a receiver with a key keeps at once (each 16 bytes and an address).
const MAX_NONCES: usize = 4096;
/// Chunks a transfer checked by checksum may have (8 bytes of books each).
pub const MAX_CHECKSUM_CHUNKS: u64 = 1 << 24;

/// A connect request that offers a transfer: its words, and the request to answer.
pub struct VerbsOffer {
    pub peer: SocketAddr,
    /// `None`: a raw sender's request (no header), taken by a `--raw` receiver.
    pub header: Option<Header>,
    /// The device's largest message on the request's port.
    pub max_message: u64,
    pub(super) request: SendableRequest,
    pub(super) joins: Arc<Joins<SendableRequest>>,
}

impl VerbsOffer {
    /// Refuse, saying why; what to report.
    pub fn refuse(self, reason: RejectReason, detail: Option<String>) -> RecvOutcome {
        refuse(&self.request.into_inner(), self.peer, reason, detail)
    }
}

/// Reject `request` for `reason`; what to report.
pub(super) fn refuse(
    request: &ConnectRequest,
    peer: SocketAddr,
    reason: RejectReason,
    detail: Option<String>,
) -> RecvOutcome {
    let unsent = request.id.reject(&reason.encode()).err();
    crate::net::rejected(peer, &reason, detail, unsent.map(|e| e.to_string()))
}

/// Where a listener tells what it hears.
pub type Tell = Box<dyn Fn(Heard<VerbsOffer>) + Send + Sync>;

/// What the listener's owner changes while it runs.
struct Shared {
    tell: Tell,
    cfg: ListenConfig,
    /// Take no request; one taken meanwhile (the thread was waiting for one as the pause
    /// came) is held and told once resumed, to whatever `tell` is then: no offer is lost
    /// between a library's receives.
    paused: bool,
}

/// The listening CM id's thread.
pub struct VerbsListen {
    stop: Arc<AtomicBool>,
    /// Where what is heard goes, the checks it is heard under (both replaced for a
    /// library's next receive, [`retell`](Self::retell)), and whether it is paused.
    shared: Arc<Mutex<Shared>>,
    thread: Option<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
}

impl VerbsListen {
    /// Listen on `bind` (`raw`: for the seed's raw senders only); what is heard goes to
    /// `tell`, from the listener's thread; `paused`: take no request until
    /// [`resume`](Self::resume).
    ///
    /// # Errors
    /// No RDMA device, or the address cannot be bound.
    pub fn start(
        bind: SocketAddr,
        cfg: ListenConfig,
        raw: bool,
        tell: Tell,
        paused: bool,
    ) -> Result<VerbsListen, rdma::RdmaError> {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Mutex::new(Shared {
            tell,
            cfg: cfg.clone(),
            paused,
        }));
        let (ready, bound) = mpsc::channel();
        let thread = {
            let (stop, shared) = (stop.clone(), shared.clone());
            std::thread::Builder::new()
                .name("verbs-listen".into())
                .spawn(move || {
                    let opened = (|| {
                        rdma::ensure_device()?;
                        let channel = EventChannel::new()?;
                        let listener = CmId::new(&channel)?;
                        listener.bind(bind)?;
                        listener.listen(LISTEN_BACKLOG)?;
                        Ok((channel, listener))
                    })();
                    let (channel, listener) = match opened {
                        Ok(o) => o,
                        Err(e) => return drop(ready.send(Err(e))),
                    };
                    let _ = ready.send(Ok(listener.local_addr().unwrap_or(bind)));
                    let mut heard = Listener {
                        cfg,
                        raw,
                        nonces: Nonces::new(Duration::ZERO, MAX_NONCES),
                        joins: Arc::new(Joins::default()),
                    };
                    heard.nonces = Nonces::new(heard.cfg.timeout, MAX_NONCES);
                    heard.run(&channel, &shared, &stop);
                })
                .map_err(|e| rdma::RdmaError::InvalidArgument(format!("a listener thread: {e}")))?
        };
        let addr = bound
            .recv()
            .map_err(|_| rdma::RdmaError::InvalidArgument("the listener thread ended".into()))??;
        Ok(VerbsListen {
            stop,
            shared,
            thread: Some(thread),
            addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Take no more requests until [`resume`](Self::resume) (they wait in the CM's
    /// queue): the library's one transfer per call.
    pub fn pause(&self) {
        self.lock().paused = true;
    }

    pub fn resume(&self) {
        self.lock().paused = false;
    }

    /// Tell what is heard to `tell`, checked under `cfg`, from now on (a library's next
    /// receive).
    pub fn retell(&self, tell: Tell, cfg: ListenConfig) {
        let mut shared = self.lock();
        shared.tell = tell;
        shared.cfg = cfg;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for VerbsListen {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Listener {
    cfg: ListenConfig,
    raw: bool,
    nonces: Nonces,
    joins: Arc<Joins<SendableRequest>>,
}

impl Listener {
    fn run(
        &mut self,
        channel: &std::rc::Rc<EventChannel>,
        shared: &Mutex<Shared>,
        stop: &AtomicBool,
    ) {
        let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
        let mut held: Vec<Heard<VerbsOffer>> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            {
                let s = lock();
                if s.paused {
                    drop(s);
                    std::thread::sleep(TICK);
                    continue;
                }
                for h in held.drain(..) {
                    (s.tell)(h);
                }
                self.cfg = s.cfg.clone();
            }
            let event = match channel.get_event_within(TICK) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) => {
                    (lock().tell)(Heard::Said(RecvOutcome::Notice {
                        text: format!("the listener's events: {e}"),
                    }));
                    std::thread::sleep(TICK);
                    continue;
                }
            };
            match event.kind() {
                CmEventKind::ConnectRequest => {}
                CmEventKind::DeviceRemoval => {
                    (lock().tell)(Heard::Said(RecvOutcome::Notice {
                        text: "the RDMA device of the listener was removed".into(),
                    }));
                    return;
                }
                _ => continue, // nothing else concerns the listener
            }
            let heard = match event.into_connect_request(channel) {
                Ok(request) => {
                    super::trace!(
                        "listen: a connect request from {:?}, {} bytes",
                        request.peer,
                        request.private_data.len()
                    );
                    self.hear(request)
                }
                Err(e) => Some(Heard::Said(RecvOutcome::Failed {
                    peer: "?".into(),
                    error: format!("taking a connection request: {e}"),
                })),
            };
            if let Some(h) = heard {
                let s = lock();
                match s.paused {
                    true => held.push(h),
                    false => (s.tell)(h),
                }
            }
        }
    }

    /// What a request is: an offer for the engine, a join routed to its transfer (then
    /// nothing to say), or a refusal to report.
    fn hear(&mut self, request: ConnectRequest) -> Option<Heard<VerbsOffer>> {
        let peer = request
            .peer
            .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
        let said = |o: RecvOutcome| Some(Heard::Said(o));
        if !self.cfg.allow.is_empty()
            && (request.peer.is_none() || !self.cfg.allow.permits(peer.ip()))
        {
            return said(refuse(&request, peer, RejectReason::NotAllowed, None));
        }
        if let Ok(join) = Join::decode(&request.private_data) {
            return self.route(request, join, peer).map(Heard::Said);
        }
        let header = match Header::decode(&request.private_data) {
            Ok(h) if self.raw => {
                let _ = h;
                return said(refuse(&request, peer, RejectReason::RawOnly, None));
            }
            Ok(h) => Some(h),
            Err(_) if self.raw => None,
            Err(e) => return said(refuse(&request, peer, RejectReason::BadHeader(e), None)),
        };
        if let (Some(key), Some(h)) = (&self.cfg.key, &header) {
            if let Err(reason) =
                check_proof(key, &mut self.nonces, peer.ip(), &request.private_data)
            {
                return said(refuse(&request, peer, reason, None));
            }
            if h.striped {
                // Its further rails could not join: say so now, rather than have the
                // sender fail over from every rail but the first.
                let reason = RejectReason::BadHeader(WireError::KeyedVerbsStriping);
                return said(refuse(&request, peer, reason, None));
            }
        }
        let max_message = match request.id.port_info() {
            Ok(port) => port.max_msg_sz as u64,
            Err(e) => {
                let why = Some(e.to_string());
                return said(refuse(&request, peer, RejectReason::Internal, why));
            }
        };
        if let Some(h) = &header {
            if let Some((reason, why)) = self.unfit(h, max_message) {
                return said(refuse(&request, peer, reason, why));
            }
        }
        match request.into_sendable() {
            Ok(request) => Some(Heard::Offer(VerbsOffer {
                peer,
                header,
                max_message,
                request,
                joins: self.joins.clone(),
            })),
            Err(request) => {
                let why = Some("the connection request is still referenced elsewhere".into());
                said(refuse(&request, peer, RejectReason::Internal, why))
            }
        }
    }

    /// Why an offer cannot be served at all, whatever the memory.
    fn unfit(&self, h: &Header, max_message: u64) -> Option<(RejectReason, Option<String>)> {
        if h.total_bytes > self.cfg.max_bytes {
            let reason = RejectReason::TooLarge {
                requested: h.total_bytes,
                max: self.cfg.max_bytes,
            };
            return Some((reason, None));
        }
        if h.chunk_bytes as u64 > max_message {
            let reason = RejectReason::ChunkTooLarge {
                chunk: h.chunk_bytes as u64,
                max: max_message,
            };
            return Some((reason, None));
        }
        if h.verify.checksum() && h.chunks() > MAX_CHECKSUM_CHUNKS {
            let reason = RejectReason::NoMemory {
                bytes: h.chunks() * 8,
            };
            let why = format!(
                "{} chunks to check by checksum, more than {MAX_CHECKSUM_CHUNKS}: use a larger --chunk",
                h.chunks()
            );
            return Some((reason, Some(why)));
        }
        None
    }

    /// Hand a further rail's join to its transfer's thread (no bytes reserved: it rides
    /// on its transfer's lease); what to report if it is refused.
    fn route(&self, request: ConnectRequest, join: Join, peer: SocketAddr) -> Option<RecvOutcome> {
        let detail = Some(format!("rail {} of a striped transfer", join.rail));
        if self.cfg.key.is_some() {
            let reason = RejectReason::BadHeader(WireError::KeyedVerbsStriping);
            return Some(refuse(&request, peer, reason, detail));
        }
        let sendable = match request.into_sendable() {
            Ok(s) => s,
            Err(request) => return Some(refuse(&request, peer, RejectReason::Internal, detail)),
        };
        let routed = self.joins.route(
            join.token,
            join.rail as u16,
            join.rails as u16,
            peer.ip(),
            sendable,
        );
        match routed {
            Ok(()) => None,
            Err((refused, sendable)) => {
                let reason = match refused {
                    Refused::Unknown => RejectReason::UnknownJoin,
                    Refused::BadMember { member, members } => RejectReason::BadJoin {
                        rail: member as u64,
                        rails: members as u64,
                    },
                    other => RejectReason::BadHeader(WireError::Inconsistent {
                        what: other.words(),
                    }),
                };
                Some(refuse(&sendable.into_inner(), peer, reason, detail))
            }
        }
    }
}

/// With a key: a connect request without a proof is answered with a fresh nonce
/// ([`RejectReason::KeyChallenge`]); one with a proof must carry the first bytes of
/// HMAC-SHA256 over its header and a nonce this receiver gave its address, unused and
/// within --timeout. Nothing is allocated before this passes.
fn check_proof(
    key: &Key,
    nonces: &mut Nonces,
    ip: IpAddr,
    private_data: &[u8],
) -> Result<(), RejectReason> {
    let Some(proof) = VerbsProof::decode(private_data) else {
        return match nonces.issue(ip) {
            Some(nonce) => Err(RejectReason::KeyChallenge { nonce }),
            None => Err(RejectReason::BusyHandshakes {
                active: nonces.len() as u64,
                max: MAX_NONCES as u64,
            }),
        };
    };
    let header = private_data.get(..HEADER_LEN).unwrap_or_default();
    match nonces.take(proof.nonce_id, ip) {
        Some(nonce) if key.verify_truncated(header, &nonce, &proof.tag) => Ok(()),
        _ => Err(RejectReason::BadProof),
    }
}
