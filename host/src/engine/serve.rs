//! The serving loop, the same for every listener: hear an offer, admit it (or refuse it,
//! saying why) under one [`Admission`] before anything is allocated for it, serve each
//! admitted transfer on a thread of its own (its memory made there, its connection
//! accepted, the receive loop run, the last ack sent once its memory and lease are
//! given back), and report every outcome. Returns only with `--once` (whether that
//! transfer verified), at a library call's end, or on an error of the listener.
//!
//! `--once` is used up only by a transfer that was accepted: junk, probes, refusals and
//! busy answers leave the receiver serving.

use super::landed::Landed;
use super::options::RecvOptions;
use super::receiving::Receiving;
use super::recv::{self, Terms};
use crate::memory::lent::{AskCaller, LentPlace, LentTarget, OfferSeen};
use crate::memory::select::AttemptLog;
use crate::memory::HostBuffer;
use crate::net::tcp::listen::{Heard, ListenConfig, TcpListen, TcpOffer};
use crate::net::tcp::recv::Landing;
use crate::server::admission::{Admission, Books, Lease, Limits, Want};
use crate::transfer::{RecvOutcome, TransferError};
use crate::wire::{Header, RejectReason, WireError};
use std::net::TcpListener;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Where received data goes.
pub enum RecvMemory {
    Host,
    /// GPU memory of this GPU, verified by the verify kernel.
    #[cfg(feature = "cuda")]
    Device(std::rc::Rc<crate::gpu::Gpu>),
    /// Memory a library caller lent (host or GPU), for one transfer of exactly its size:
    /// taken by the first offer admitted.
    Lent(Mutex<Option<LentTarget>>),
    /// Memory the caller lends once it has seen the offer (the library's `accept`): the
    /// first offer admitted is shown to it, and the serve ends with that offer, taken
    /// into the memory the caller gives or declined.
    Ask(AskCaller),
}

/// What a transfer's thread makes its memory from: `Send`, unlike the GPU itself.
enum MemoryKind {
    Host,
    /// A caller's memory; `None`: taken already.
    Lent(Option<LentTarget>),
    #[cfg(feature = "cuda")]
    Device {
        ordinal: u32,
    },
}

impl RecvMemory {
    /// The bytes a transfer of `total` bytes in chunks of `chunk` over `streams` streams
    /// holds here.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn bytes_for(&self, total: u64, chunk: u64, streams: u16) -> u64 {
        let ring = || {
            usize::try_from(chunk.min(total))
                .ok()
                .and_then(|c| upload_ring_bytes(streams as usize, c))
                .map_or(u64::MAX, |r| r as u64)
        };
        match self {
            RecvMemory::Host => total,
            // Asked before admission, and then lent memory.
            RecvMemory::Ask(_) => 0,
            // The caller's memory is there already; into GPU memory, the upload ring.
            RecvMemory::Lent(target) => {
                let on_gpu = target
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .is_some_and(|t| !matches!(t.place, LentPlace::Host(_)));
                if on_gpu {
                    ring()
                } else {
                    0
                }
            }
            // The device buffer and the upload ring's page-locked slots.
            #[cfg(feature = "cuda")]
            RecvMemory::Device(_) => total.saturating_add(ring()),
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

    fn kind(&self) -> MemoryKind {
        match self {
            #[cfg(feature = "cuda")]
            RecvMemory::Device(gpu) => MemoryKind::Device {
                ordinal: gpu.ordinal(),
            },
            RecvMemory::Lent(target) => {
                MemoryKind::Lent(target.lock().unwrap_or_else(|p| p.into_inner()).take())
            }
            _ => MemoryKind::Host,
        }
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

/// What comes back from the listener and the transfers' threads.
enum Event {
    Heard(Heard),
    Served {
        outcome: RecvOutcome,
        accepted: bool,
    },
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
    let listen_cfg = ListenConfig {
        timeout: opts.timeout,
        max_bytes: opts.max_bytes,
        allow: opts.allow.clone(),
        key: opts.key.clone(),
    };
    let (events, rx) = mpsc::channel::<Event>();
    let heard = Mutex::new(events.clone());
    let tell = Box::new(move |h: Heard| {
        let _ = heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Event::Heard(h));
    });
    let listen = TcpListen::start(listener, listen_cfg, admission.clone(), tell)
        .map_err(|e| TransferError::Protocol(format!("cannot listen: {e}")))?;
    report(&RecvOutcome::Listening {
        addr: listen.local_addr().to_string(),
    });
    let give_up = library
        .as_ref()
        .and_then(|c| c.wait)
        .map(|w| (Instant::now() + w, w));
    let one_per_call = library.is_some() && opts.once;
    let listen = Arc::new(listen);
    // Transfer threads started and not yet served: a bounded wait ends only between them.
    let mut in_flight = 0usize;
    loop {
        let mut poll = Duration::from_secs(1);
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
            Event::Heard(Heard::Offer(offer)) => {
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
                            report(&offer.refuse(RejectReason::Declined, None));
                            return Ok(false);
                        };
                        lent_on_ask = RecvMemory::Lent(Mutex::new(Some(target)));
                        &lent_on_ask
                    }
                    memory => memory,
                };
                if let Some((reason, why)) = memory.refuses(&offer.header) {
                    report(&offer.refuse(reason, why));
                    continue;
                }
                let want = Want {
                    bytes: memory.bytes_for(
                        offer.header.total_bytes,
                        offer.header.chunk_bytes as u64,
                        offer.hello.count,
                    ),
                    descriptors: offer.descriptors(),
                };
                // Chunks checked by checksum or striped keep books per chunk, counted
                // with the buffers: tiny chunks would cost many times their data.
                let books = Books::of(
                    offer.header.chunks(),
                    offer.header.verify.checksum(),
                    offer.header.striped,
                );
                let lease = match admission.admit_offer(offer.peer.ip(), want, books) {
                    Ok(lease) => lease,
                    Err(reason) => {
                        report(&offer.refuse(reason, None));
                        continue;
                    }
                };
                let kind = memory.kind();
                let (events, listen, opts) = (events.clone(), listen.clone(), opts.clone());
                let peer = offer.peer;
                let spawned = std::thread::Builder::new()
                    .name("tcp-transfer".into())
                    .spawn(move || {
                        let (outcome, accepted) = serve_offer(
                            offer,
                            lease,
                            kind,
                            &opts,
                            one_per_call.then_some(&*listen),
                        );
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
            Event::Served { outcome, accepted } => {
                in_flight = in_flight.saturating_sub(1);
                report(&outcome);
                if one_per_call {
                    listen.resume();
                }
                if opts.once && accepted {
                    return Ok(matches!(&outcome, RecvOutcome::Completed(r) if r.ok()));
                }
            }
        }
    }
}

/// The memory one transfer lands in, made on its thread.
enum Memory {
    Host(HostBuffer),
    #[cfg(feature = "cuda")]
    Gpu(super::landed::StagedGpu),
}

impl Memory {
    fn landed(&self) -> &dyn Landed {
        match self {
            Memory::Host(b) => b,
            #[cfg(feature = "cuda")]
            Memory::Gpu(g) => g,
        }
    }

    fn landing(&self) -> Landing<'_> {
        match self {
            Memory::Host(b) => {
                let (ptr, len) = b.raw_parts();
                Landing::Host { ptr, len }
            }
            #[cfg(feature = "cuda")]
            Memory::Gpu(g) => Landing::Gpu(&g.upload),
        }
    }
}

/// Make the memory of a transfer of `len` bytes in chunks of `chunk` over `streams`.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn make_memory(
    kind: MemoryKind,
    len: usize,
    chunk: usize,
    streams: usize,
) -> anyhow::Result<(Memory, Option<std::sync::mpsc::Sender<()>>)> {
    match kind {
        MemoryKind::Host => Ok((Memory::Host(HostBuffer::poisoned(len)?), None)),
        MemoryKind::Lent(None) => anyhow::bail!("the caller's buffer is in use"),
        MemoryKind::Lent(Some(target)) => {
            if target.len != len {
                anyhow::bail!("{len} bytes offered into a buffer of {}", target.len);
            }
            let in_use = target.in_use();
            let memory = match target.place {
                LentPlace::Host(ptr) => {
                    // SAFETY: LentTarget::new's caller promised `len` bytes at `ptr` for
                    // this transfer alone until the last token (`in_use`, dropped after
                    // this buffer by the caller of make_memory) is gone.
                    let buffer = unsafe { HostBuffer::borrowed(ptr, len) };
                    crate::memory::RecvSink::poison(&buffer)?;
                    Memory::Host(buffer)
                }
                #[cfg(feature = "cuda")]
                LentPlace::Device { ordinal, ptr } => {
                    let gpu = crate::gpu::Gpu::open(ordinal)?;
                    // The owner's own work queued on the memory (a tensor zeroed on a
                    // stream of its) is done before the first byte lands.
                    gpu.synchronize_context()?;
                    // SAFETY: as above, device memory of that device's primary context,
                    // which `Gpu::open` binds.
                    let memory =
                        unsafe { crate::gpu::allocations::DeviceBuffer::borrowed(&gpu, ptr, len) };
                    let upload =
                        crate::gpu::upload::DeviceUpload::over(&gpu, memory, len, chunk, streams)?;
                    Memory::Gpu(super::landed::StagedGpu {
                        gpu,
                        upload: std::cell::RefCell::new(upload),
                        len,
                    })
                }
                #[cfg(not(feature = "cuda"))]
                LentPlace::Device { .. } => {
                    anyhow::bail!("this build has no GPU support (the cuda feature)")
                }
            };
            drop(target);
            Ok((memory, Some(in_use)))
        }
        #[cfg(feature = "cuda")]
        MemoryKind::Device { ordinal } => {
            let gpu = crate::gpu::Gpu::open(ordinal)?;
            let upload = crate::gpu::upload::DeviceUpload::new(&gpu, len, chunk, streams)?;
            Ok((
                Memory::Gpu(super::landed::StagedGpu {
                    gpu,
                    upload: std::cell::RefCell::new(upload),
                    len,
                }),
                None,
            ))
        }
    }
}

/// Serve one admitted offer: memory, accept, receive, verify, ack. Also whether the
/// accept was sent (the transfer used `--once` up).
fn serve_offer(
    offer: TcpOffer,
    lease: Lease,
    kind: MemoryKind,
    opts: &RecvOptions,
    one_per_call: Option<&TcpListen>,
) -> (RecvOutcome, bool) {
    let peer = offer.peer;
    let label = peer.to_string();
    let header = offer.header;
    let total = header.total_bytes;
    let (Ok(len), Ok(chunk)) = (usize::try_from(total), usize::try_from(header.chunk_bytes)) else {
        return (
            offer.refuse(RejectReason::NoMemory { bytes: total }, None),
            false,
        );
    };
    let (memory, in_use) = match make_memory(kind, len, chunk, offer.hello.count as usize) {
        Ok(m) => m,
        Err(e) => {
            let reason = RejectReason::NoMemory { bytes: total };
            return (offer.refuse(reason, Some(format!("{e:#}"))), false);
        }
    };
    let name = offer.name.clone();
    let accepted = match offer.accept() {
        Ok(a) => a,
        Err(outcome) => return (outcome, false),
    };
    if let Some(listen) = one_per_call {
        // Served alone and the call ends with it: whoever connects next waits in the
        // listen queue for the next call.
        listen.pause(Duration::from_millis(100));
    }
    let mut receiver = accepted.receiver;
    let terms = Terms {
        peer: &label,
        header,
        name,
        timeout: opts.timeout,
        min_rate: opts.min_rate,
        accepted_at: accepted.accepted_at,
        output: opts.output.as_ref(),
        op: "tcp",
        memory: AttemptLog::default(),
        rails_from: accepted.rails_from,
    };
    let checksum = header.verify.checksum();
    let received = receiver.with_landing(memory.landing(), checksum, |link| {
        let mut r = Receiving::new(link, opts.timeout);
        recv::transfers(&mut r, memory.landed(), &terms)
    });
    // The last ack goes out only after this transfer's memory and its admission lease
    // are given back: a sender that offers its next transfer the moment it hears the
    // result must find the memory free, not "busy".
    let recv::Received {
        mut report,
        last_ack,
        error,
    } = received;
    drop(memory);
    drop(in_use);
    drop(lease);
    if let Some(ack) = last_ack {
        report.reply_delivered &= receiver.send_last(&ack.encode());
    }
    drop(receiver);
    let outcome = match error {
        Some(e) => RecvOutcome::Failed {
            peer: label,
            error: failed_words(&e, report.transfers, report.offered),
        },
        None => RecvOutcome::Completed(report),
    };
    (outcome, true)
}

/// A failed connection's error, saying which transfer of several it was.
fn failed_words(e: &TransferError, done: u32, transfers: u32) -> String {
    match transfers > 1 {
        true => format!(
            "{e} (in transfer {} of {transfers}; {done} done before it)",
            done + 1
        ),
        false => e.to_string(),
    }
}
