//! The TCP receiver: accept sockets, tell transfer offers from extra streams by their
//! first bytes, serve each transfer on a thread of its own (at most `--max-connections`
//! at once; beyond that a `Busy` reject), verify, ack.
//!
//! Threads: an accept loop; a short-lived handshake thread per accepted socket (it reads
//! the offer or the stream hello under `--timeout`, so a client that connects and sends
//! nothing, or junk, never holds up anyone else); a thread per transfer with host memory.
//! Outcomes come back to the calling thread over a channel and are reported there.
//!
//! GPU memory (`--mem device`): the GPU's objects are `Rc` and tied to the thread that
//! opened the context, so transfers into GPU memory are served one after another on the
//! calling thread, which owns the GPU. (Opening the GPU per connection thread would cost a
//! context, ~100 ms and hundreds of MiB of GPU memory, per transfer; queued offers wait at
//! most the sender's --timeout, as on verbs.)

use super::frames::{Hello, HELLO_LEN, HELLO_MAGIC};
use super::landing::{HostLanding, Landing};
use super::socket::{self, read_array};
use crate::memory::select::AttemptLog;
use crate::transfer::header::{
    AcceptInfo, Ack, Header, RejectReason, WireError, HEADER_LEN, HEADER_MAGIC,
};
use crate::transfer::plan::ChunkPlan;
use crate::transfer::{gigabytes_per_second, RecvOutcome, RecvReport, TransferError};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Sockets in their handshake at once at most; more are closed with a `Busy` reject.
const MAX_HANDSHAKES: usize = 64;
/// How often the accept loop looks whether the receiver is done.
const ACCEPT_POLL: Duration = Duration::from_millis(2);

/// Everything the TCP receiver needs, built by the CLI.
#[derive(Debug, Clone)]
pub struct TcpRecvConfig {
    pub bind: SocketAddr,
    pub once: bool,
    pub max_bytes: u64,
    pub timeout: Duration,
    /// Transfers served at once at most.
    pub max_connections: usize,
}

/// Where received data goes.
pub enum RecvMemory {
    Host,
    /// GPU memory of this GPU, verified by the verify kernel.
    #[cfg(feature = "cuda")]
    Device(std::rc::Rc<crate::gpu::Gpu>),
}

/// A transfer offer that passed its checks, for the serving loop.
struct Offer {
    control: TcpStream,
    peer: String,
    header: Header,
    hello: Hello,
}

enum Event {
    Offer(Offer),
    /// `transfer`: the outcome of a transfer (or of a socket that was to be one), which
    /// ends a `--once` receiver; `served`: a transfer thread finished.
    Outcome {
        outcome: RecvOutcome,
        transfer: bool,
        served: bool,
    },
}

/// Extra streams on their way to the transfer whose token they carry.
type Routes = Arc<Mutex<HashMap<u64, mpsc::Sender<(u16, TcpStream)>>>>;

/// Listen on `cfg.bind` and serve transfers, telling `report` about each. Returns only
/// with `--once` (`Ok(true)` if that transfer verified) or on an error of the listener.
pub fn serve(
    cfg: &TcpRecvConfig,
    memory: &RecvMemory,
    report: &mut dyn FnMut(&RecvOutcome),
) -> Result<bool, TransferError> {
    let listener = TcpListener::bind(cfg.bind).map_err(|e| {
        TransferError::Protocol(format!("cannot listen on {} (TCP): {e}", cfg.bind))
    })?;
    let addr = listener
        .local_addr()
        .map_or_else(|_| cfg.bind.to_string(), |a| a.to_string());
    listener
        .set_nonblocking(true)
        .map_err(|e| TransferError::Protocol(format!("listener: {e}")))?;
    report(&RecvOutcome::Listening { addr });

    let (events, rx) = mpsc::channel::<Event>();
    let routes: Routes = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let accepter = {
        let (events, routes, stop, cfg) =
            (events.clone(), routes.clone(), stop.clone(), cfg.clone());
        std::thread::Builder::new()
            .name("tcp-accept".into())
            .spawn(move || accept_loop(listener, &cfg, events, routes, &stop))
            .map_err(|e| TransferError::Protocol(format!("cannot start the accept thread: {e}")))?
    };
    let _stop_on_return = StopOnDrop(stop, Some(accepter));

    let mut active = 0usize;
    let mut taken = false; // --once: the one transfer has been taken
    loop {
        let Ok(event) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        match event {
            Event::Offer(offer) => {
                if (cfg.once && taken) || active >= cfg.max_connections {
                    let max = if cfg.once {
                        1
                    } else {
                        cfg.max_connections as u64
                    };
                    let busy = RejectReason::BusyConnections {
                        active: active as u64,
                        max,
                    };
                    let outcome = refuse(offer.control, offer.peer, busy, None);
                    report(&outcome);
                    continue;
                }
                taken = true;
                match memory {
                    RecvMemory::Host => {
                        active += 1;
                        let (events, routes, cfg) = (events.clone(), routes.clone(), cfg.clone());
                        let spawned = std::thread::Builder::new()
                            .name("tcp-transfer".into())
                            .spawn(move || {
                                let outcome = serve_offer(&cfg, offer, &routes, &mut |len, _| {
                                    Ok(Box::new(HostLanding::new(len)?))
                                });
                                let _ = events.send(Event::Outcome {
                                    outcome,
                                    transfer: true,
                                    served: true,
                                });
                            });
                        if let Err(e) = spawned {
                            active -= 1;
                            report(&RecvOutcome::Failed {
                                peer: "?".into(),
                                error: format!("cannot start a transfer thread: {e}"),
                            });
                        }
                    }
                    #[cfg(feature = "cuda")]
                    RecvMemory::Device(gpu) => {
                        let streams = offer.hello.count as usize;
                        let outcome = serve_offer(cfg, offer, &routes, &mut |len, chunk| {
                            Ok(Box::new(super::landing::DeviceLanding::new(
                                gpu, len, chunk, streams,
                            )?))
                        });
                        report(&outcome);
                        if cfg.once {
                            return Ok(completed_ok(&outcome));
                        }
                    }
                }
            }
            Event::Outcome {
                outcome,
                transfer,
                served,
            } => {
                report(&outcome);
                if served {
                    active = active.saturating_sub(1);
                }
                if cfg.once && transfer {
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

fn accept_loop(
    listener: TcpListener,
    cfg: &TcpRecvConfig,
    events: mpsc::Sender<Event>,
    routes: Routes,
    stop: &AtomicBool,
) {
    let handshakes = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_POLL);
                continue;
            }
            Err(_) => {
                // Out of descriptors or a connection reset before accept: keep serving.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let peer = peer.to_string();
        if stream.set_nonblocking(false).is_err() || socket::prepare(&stream, cfg.timeout).is_err()
        {
            continue;
        }
        if handshakes.load(Ordering::Relaxed) >= MAX_HANDSHAKES {
            let outcome = refuse(
                stream,
                peer,
                RejectReason::BusyConnections {
                    active: handshakes.load(Ordering::Relaxed) as u64,
                    max: cfg.max_connections as u64,
                },
                Some("too many connections in their handshake".into()),
            );
            let _ = events.send(Event::Outcome {
                outcome,
                transfer: false,
                served: false,
            });
            continue;
        }
        handshakes.fetch_add(1, Ordering::Relaxed);
        let (events, routes, count, cfg) = (
            events.clone(),
            routes.clone(),
            handshakes.clone(),
            cfg.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("tcp-handshake".into())
            .spawn(move || {
                if let Some(event) = handshake(&cfg, stream, peer, &routes) {
                    let _ = events.send(event);
                }
                count.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            // Not started: its count is ours to give back.
            handshakes.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Tell the peer why not (the sender prints it), and close.
fn refuse(
    mut stream: TcpStream,
    peer: String,
    reason: RejectReason,
    detail: Option<String>,
) -> RecvOutcome {
    let sent = stream.write_all(&reason.encode());
    let _ = stream.shutdown(Shutdown::Write);
    // Read what the peer still sends, briefly, so that closing with unread bytes does not
    // reset the connection before the reject is read.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    for _ in 0..64 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    let mut text = reason.to_string();
    if let Some(detail) = detail {
        text = format!("{text}: {detail}");
    }
    if let Err(e) = sent {
        text = format!("{text} (and the reject could not be sent: {e})");
    }
    RecvOutcome::Rejected { peer, reason: text }
}

/// Read a socket's first message: a transfer offer (header + hello) becomes an
/// [`Event::Offer`]; a stream hello goes to its transfer; anything else is refused.
fn handshake(
    cfg: &TcpRecvConfig,
    mut stream: TcpStream,
    peer: String,
    routes: &Routes,
) -> Option<Event> {
    let outcome = |outcome, transfer| {
        Some(Event::Outcome {
            outcome,
            transfer,
            served: false,
        })
    };
    let failed = |peer: String, why: String| RecvOutcome::Failed {
        peer: peer.clone(),
        error: format!("{peer}: {why}"),
    };
    let magic: [u8; 4] = match read_array(&mut stream) {
        Ok(m) => m,
        Err(e) => {
            return outcome(
                failed(
                    peer,
                    socket::why(&e, cfg.timeout, "reading the transfer offer"),
                ),
                true,
            )
        }
    };
    match magic {
        HEADER_MAGIC => {
            let rest: [u8; HEADER_LEN + HELLO_LEN - 4] = match read_array(&mut stream) {
                Ok(r) => r,
                Err(e) => {
                    return outcome(
                        failed(
                            peer,
                            socket::why(&e, cfg.timeout, "reading the transfer offer"),
                        ),
                        true,
                    )
                }
            };
            let mut offer = [0u8; HEADER_LEN + HELLO_LEN];
            offer[..4].copy_from_slice(&magic);
            offer[4..].copy_from_slice(&rest);
            let header = match Header::decode(&offer[..HEADER_LEN]) {
                Ok(h) => h,
                Err(e) => {
                    return outcome(refuse(stream, peer, RejectReason::BadHeader(e), None), true)
                }
            };
            let hello = match Hello::decode(&offer[HEADER_LEN..]) {
                Ok(h) if h.index == 0 => h,
                Ok(_) => {
                    return outcome(
                        refuse_hello(
                            stream,
                            peer,
                            "the offer's stream hello is not stream 0",
                            None,
                        ),
                        true,
                    )
                }
                Err(e) => {
                    return outcome(
                        refuse_hello(
                            stream,
                            peer,
                            "bad stream hello after the header",
                            Some(e.to_string()),
                        ),
                        true,
                    )
                }
            };
            if header.total_bytes > cfg.max_bytes {
                let reason = RejectReason::TooLarge {
                    requested: header.total_bytes,
                    max: cfg.max_bytes,
                };
                return outcome(refuse(stream, peer, reason, None), true);
            }
            Some(Event::Offer(Offer {
                control: stream,
                peer,
                header,
                hello,
            }))
        }
        HELLO_MAGIC => {
            let rest: [u8; HELLO_LEN - 4] = match read_array(&mut stream) {
                Ok(r) => r,
                Err(e) => {
                    return outcome(
                        failed(peer, socket::why(&e, cfg.timeout, "reading a stream hello")),
                        false,
                    )
                }
            };
            let mut bytes = [0u8; HELLO_LEN];
            bytes[..4].copy_from_slice(&magic);
            bytes[4..].copy_from_slice(&rest);
            let hello = match Hello::decode(&bytes) {
                Ok(h) => h,
                Err(e) => {
                    return outcome(
                        refuse_hello(stream, peer, "bad stream hello", Some(e.to_string())),
                        false,
                    )
                }
            };
            let route = routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&hello.token)
                .cloned();
            match route {
                Some(to) if to.send((hello.index, stream)).is_ok() => None,
                _ => outcome(
                    RecvOutcome::Rejected {
                        peer,
                        reason: format!(
                            "stream {} of a connection this receiver does not serve (token {:#x})",
                            hello.index, hello.token
                        ),
                    },
                    false,
                ),
            }
        }
        got => outcome(
            refuse(
                stream,
                peer,
                RejectReason::BadHeader(WireError::BadMagic { got }),
                None,
            ),
            true,
        ),
    }
}

/// Removes a transfer's route when it ends, however it ends.
struct RouteGuard<'a>(&'a Routes, u64);

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

type MakeLanding<'a> = dyn FnMut(usize, usize) -> anyhow::Result<Box<dyn Landing>> + 'a;

/// Serve one accepted offer: buffer, accept, gather the streams, receive, verify, ack
/// (once per transfer of a `--reuse-connection`).
fn serve_offer(
    cfg: &TcpRecvConfig,
    offer: Offer,
    routes: &Routes,
    make: &mut MakeLanding<'_>,
) -> RecvOutcome {
    let Offer {
        mut control,
        peer,
        header,
        hello,
    } = offer;
    let total = header.total_bytes;
    let failed = |peer: &str, e: TransferError| RecvOutcome::Failed {
        peer: peer.to_string(),
        error: e.to_string(),
    };
    let (Ok(len), Ok(chunk)) = (usize::try_from(total), usize::try_from(header.chunk_bytes)) else {
        return refuse(control, peer, RejectReason::NoMemory { bytes: total }, None);
    };
    let plan = match ChunkPlan::new(total, header.chunk_bytes as u64) {
        Ok(p) => p,
        Err(e) => {
            return refuse(
                control,
                peer,
                RejectReason::BadHeader(WireError::Inconsistent { what: "chunk plan" }),
                Some(e),
            )
        }
    };
    let mut landing = match make(len, chunk) {
        Ok(l) => l,
        Err(e) => {
            return refuse(
                control,
                peer,
                RejectReason::NoMemory { bytes: total },
                Some(format!("{e:#}")),
            )
        }
    };
    let (to_us, streams_in) = mpsc::channel();
    {
        let mut map = routes.lock().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(&hello.token) {
            drop(map);
            return refuse(
                control,
                peer,
                RejectReason::BadHeader(WireError::Inconsistent {
                    what: "a connection token already in use",
                }),
                None,
            );
        }
        map.insert(hello.token, to_us);
    }
    let _route = RouteGuard(routes, hello.token);
    let accept = AcceptInfo {
        addr: 0,
        rkey: 0,
        len: total,
    };
    if let Err(e) = control.write_all(&accept.encode()) {
        return failed(
            &peer,
            TransferError::Protocol(format!(
                "{peer}: {}",
                socket::why(&e, cfg.timeout, "accepting the offer")
            )),
        );
    }
    let Ok(clone) = control.try_clone() else {
        return failed(
            &peer,
            TransferError::Protocol("cannot clone the socket".into()),
        );
    };
    let mut slots: Vec<Option<TcpStream>> = (0..hello.count).map(|_| None).collect();
    slots[0] = Some(clone);
    let deadline = Instant::now() + cfg.timeout;
    while slots.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match streams_in.recv_timeout(left) {
            Ok((index, stream)) => match slots.get_mut(index as usize) {
                Some(slot @ None) => *slot = Some(stream),
                _ => {
                    return failed(
                        &peer,
                        TransferError::Protocol(format!(
                            "{peer} opened stream {index} twice or beyond its count"
                        )),
                    )
                }
            },
            Err(_) => {
                let have = slots.iter().filter(|s| s.is_some()).count();
                return failed(
                    &peer,
                    TransferError::Protocol(format!(
                        "{peer} opened {have} of its {} streams within {}",
                        hello.count,
                        crate::rdma::format_duration(cfg.timeout)
                    )),
                );
            }
        }
    }
    let streams: Vec<TcpStream> = slots.into_iter().flatten().collect();
    let transfers = header.transfers.max(1);
    let mut seconds = 0.0;
    let mut verify_seconds = 0.0;
    let mut verification = None;
    let mut verify_error = None;
    let mut reply_delivered = true;
    for k in 0..transfers {
        if k > 0 {
            if let Err(e) = landing.poison() {
                return failed(&peer, TransferError::Memory(e));
            }
        }
        let got = AtomicU64::new(0);
        let start = Instant::now();
        if let Err(why) = landing.receive(&streams, &plan, cfg.timeout, &got) {
            return failed(
                &peer,
                TransferError::Incomplete {
                    peer: peer.clone(),
                    got: got.load(Ordering::Relaxed),
                    total,
                    why,
                },
            );
        }
        seconds += start.elapsed().as_secs_f64();
        let t_verify = Instant::now();
        let result = landing.verify(len);
        let took = t_verify.elapsed();
        verify_seconds += took.as_secs_f64();
        let this = result.as_ref().ok().copied();
        let mut ack = Ack::new(total, this);
        if header.repeats() {
            ack = ack.with_verify_time(took);
        }
        verification = merge(verification, this, k);
        if let Err(e) = &result {
            verify_error = Some(format!("{e:#}"));
        }
        if control.write_all(&ack.encode()).is_err() {
            reply_delivered = false;
            break;
        }
    }
    let bytes = total * transfers as u64;
    RecvOutcome::Completed(RecvReport {
        peer,
        op: "tcp",
        bytes,
        chunks: plan.count() * transfers as u64,
        seconds,
        gbps: gigabytes_per_second(bytes, seconds),
        path: landing.path(),
        verification: if verify_error.is_some() {
            None
        } else {
            verification
        },
        verify_error,
        first_values: landing.first_values(5).unwrap_or_default(),
        imm: None,
        reply_delivered,
        transfers,
        verify_seconds,
        memory: AttemptLog::default(),
    })
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

/// Refuse a connection whose stream hello is wrong (`what`), telling the peer why.
fn refuse_hello(
    stream: TcpStream,
    peer: String,
    what: &'static str,
    detail: Option<String>,
) -> RecvOutcome {
    refuse(
        stream,
        peer,
        RejectReason::BadHeader(WireError::Inconsistent { what }),
        detail,
    )
}
