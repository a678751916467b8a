//! One admitted offer served on its own thread, per transport: its memory made there
//! (GPU objects stay on the thread that made them), the connection accepted, the
//! engine's receive loop run over the link ([`super::recv::transfers`]), the last ack
//! sent. Over TCP the last ack goes out only after the memory and the admission lease
//! are given back (a sender that offers its next transfer at once finds them free);
//! over verbs the link is the memory's registration, so it goes before them.

use super::landed::Landed;
use super::options::RecvOptions;
use super::options::{SinkFactoryMaker, VerbsServe};
use super::receiving::Receiving;
use super::recv::{self, Terms};
use crate::memory::lent::{LentPlace, LentTarget};
use crate::memory::{HostBuffer, RecvSink};
use crate::memory_factory::SinkFactory;
use crate::memory_path::AttemptLog;
use crate::net::tcp::kept::KeptConn;
use crate::net::tcp::listen::TcpOffer;
use crate::net::tcp::recv::Landing;
use crate::net::verbs::accept::SinkChoice;
use crate::net::verbs::listen::VerbsOffer;
use crate::net::RecvLink;
use crate::server::admission::Lease;
use crate::transfer::{RecvOutcome, TransferError};
use crate::wire::RejectReason;
use std::sync::Arc;

/// A listener the loop stops taking connections from while a library call's one
/// transfer runs.
pub trait Pausable: Send + Sync {
    fn pause(&self);
    fn resume(&self);
}

/// What a transfer's thread makes its memory from: `Send`, unlike the GPU itself.
pub enum MemoryKind {
    Host,
    /// A caller's memory; `None`: taken already.
    Lent(Option<LentTarget>),
    #[cfg(feature = "cuda")]
    Device {
        ordinal: u32,
    },
    Plan(Arc<SinkFactoryMaker>),
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

/// Make the memory of a TCP transfer of `len` bytes in chunks of `chunk` over `streams`.
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
        MemoryKind::Plan(_) => anyhow::bail!("a memory plan is walked over verbs only"),
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

/// What serving one TCP offer came to.
pub struct Served {
    pub outcome: RecvOutcome,
    /// Whether the accept was sent (the transfer used `--once` up).
    pub accepted: bool,
    /// The connection, kept for the sender's next offer.
    pub kept: Option<KeptConn>,
}

impl Served {
    fn ended(outcome: RecvOutcome, accepted: bool) -> Served {
        Served {
            outcome,
            accepted,
            kept: None,
        }
    }
}

/// Serve one admitted offer: memory, accept, receive, verify, ack. With `keep`, a
/// transfer that verified on a connection whose sender asked for a session
/// ([`HINT_SESSION`](crate::wire::HINT_SESSION)) leaves it open for the next offer.
pub fn serve_tcp_offer(
    offer: TcpOffer,
    lease: Lease,
    kind: MemoryKind,
    opts: &RecvOptions,
    one_per_call: Option<&dyn Pausable>,
    keep: bool,
) -> Served {
    let (hello, keep) = (offer.hello, keep && offer.header.session);
    let peer = offer.peer;
    let label = peer.to_string();
    let header = offer.header;
    let total = header.total_bytes;
    let (Ok(len), Ok(chunk)) = (usize::try_from(total), usize::try_from(header.chunk_bytes)) else {
        return Served::ended(
            offer.refuse(RejectReason::NoMemory { bytes: total }, None),
            false,
        );
    };
    let (memory, in_use) = match make_memory(kind, len, chunk, offer.hello.count as usize) {
        Ok(m) => m,
        Err(e) => {
            let reason = RejectReason::NoMemory { bytes: total };
            return Served::ended(offer.refuse(reason, Some(format!("{e:#}"))), false);
        }
    };
    let name = offer.name.clone();
    let accepted = match offer.accept() {
        Ok(a) => a,
        Err(outcome) => return Served::ended(outcome, false),
    };
    if let Some(listen) = one_per_call {
        // Served alone and the call ends with it: whoever connects next waits in the
        // listen queue for the next call.
        listen.pause();
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
        r.cancel_on(opts.cancel.clone());
        recv::transfers(&mut r, memory.landed(), &terms)
    });
    // The last ack goes out only after this transfer's memory and its admission lease
    // are given back: a sender that offers its next transfer the moment it hears the
    // result must find the memory free, not "busy".
    let recv::Received {
        mut report,
        last_ack,
        error,
        ..
    } = received;
    drop(memory);
    drop(in_use);
    // Kept only where admission has room for kept connections (the sender opens a new
    // connection for its next transfer otherwise).
    let slot = (keep && error.is_none() && report.ok())
        .then(|| lease.keep(hello.count as u64))
        .flatten();
    drop(lease);
    let mut kept = None;
    match (last_ack, slot) {
        // The ack on one rail only: a copy on another would be read as the next
        // transfer's answer.
        (Some(ack), Some(slot)) if receiver.usable() => {
            report.reply_delivered &= receiver.send_message(&ack.encode());
            if report.reply_delivered {
                let rails_from = terms.rails_from.clone();
                kept = Some(KeptConn::new(
                    receiver,
                    peer,
                    hello,
                    &header,
                    rails_from,
                    opts.timeout,
                    slot,
                ));
            }
        }
        (Some(ack), _) => report.reply_delivered &= receiver.send_last(&ack.encode()),
        (None, _) => {}
    }
    let outcome = match error {
        Some(e) => RecvOutcome::Failed {
            peer: label,
            error: failed_words(&e, report.transfers, report.offered),
        },
        None => RecvOutcome::Completed(Box::new(report)),
    };
    Served {
        outcome,
        accepted: true,
        kept,
    }
}

/// Why a GPU buffer of the caller's is not received into over verbs.
const GPU_LENT_WHY: &str = "over verbs data lands in host memory or, where the NIC takes it, GPU memory of the receiver's own (GPUDirect RDMA): not in a caller's GPU buffer; receive it over TCP";

/// Serve one admitted verbs offer: its buffer (a plan walked where the NIC registers
/// it, or the caller's host memory), accept, receive, verify, ack. Also whether the
/// accept was sent.
pub fn serve_verbs_offer(
    offer: VerbsOffer,
    lease: Lease,
    kind: MemoryKind,
    opts: &RecvOptions,
    how: VerbsServe,
    one_per_call: Option<&dyn Pausable>,
) -> (RecvOutcome, bool) {
    let peer = offer.peer;
    let label = peer.to_string();
    let total = offer.header.map_or(opts.max_bytes, |h| h.total_bytes);
    let refuse = |offer: VerbsOffer, why: String| {
        (
            offer.refuse(RejectReason::NoMemory { bytes: total }, Some(why)),
            false,
        )
    };
    // The factory (a plan's GPU is opened on this thread), or a buffer of the caller's.
    let factory: SinkFactory;
    let mut in_use = None;
    let mut lent_at = None;
    let sinks = match kind {
        MemoryKind::Plan(maker) => match maker() {
            Ok(f) => {
                factory = f;
                SinkChoice::Plan(&factory)
            }
            Err(e) => return refuse(offer, format!("{e:#}")),
        },
        MemoryKind::Host => match usize::try_from(total)
            .map_err(anyhow::Error::from)
            .and_then(HostBuffer::poisoned)
        {
            Ok(b) => SinkChoice::Given(Box::new(b)),
            Err(e) => return refuse(offer, format!("{e:#}")),
        },
        MemoryKind::Lent(Some(target)) if target.len as u64 == total => {
            let LentPlace::Host(ptr) = target.place else {
                return refuse(offer, GPU_LENT_WHY.into());
            };
            let len = target.len;
            in_use = Some(target.in_use());
            lent_at = Some((ptr, len));
            drop(target);
            // SAFETY: LentTarget::new's caller promised `len` bytes at `ptr` for this
            // transfer alone until the last token (`in_use`, dropped after the serve
            // below, which drops the buffer before it returns) is gone.
            let buffer = unsafe { HostBuffer::borrowed(ptr, len) };
            if let Err(e) = RecvSink::poison(&buffer) {
                return refuse(offer, format!("{e:#}"));
            }
            SinkChoice::Given(Box::new(buffer))
        }
        _ => return refuse(offer, GPU_LENT_WHY.into()),
    };
    if let Some(listen) = one_per_call {
        listen.pause();
    }
    let header = offer.header;
    let Some(header) = header else {
        let (outcome, accepted) =
            offer.serve_raw(sinks, opts.max_bytes, opts.timeout, how.busy_poll);
        drop(lease);
        return (outcome, accepted);
    };
    let served = offer.serve(sinks, opts.timeout, how.busy_poll, |link, sink, session| {
        let rails_from = link.rails_from();
        let terms = Terms {
            peer: &label,
            header,
            name: None,
            timeout: opts.timeout,
            min_rate: opts.min_rate,
            accepted_at: session.accepted_at,
            output: opts.output.as_ref(),
            op: header.op.name(),
            memory: session.memory,
            rails_from,
        };
        let peer_writes = link.caps().peer_writes_in_place;
        let mut r = Receiving::new(link, opts.timeout);
        r.cancel_on(opts.cancel.clone());
        let received = recv::transfers(&mut r, sink, &terms);
        let last = received.last_ack.map(|a| a.encode().to_vec());
        ((received, peer_writes), last)
    });
    // A caller's memory that the sender's NIC could write until now (WRITE): its
    // registration is gone, so what lies there is what the caller gets: checked again.
    let served = served.map(|((mut received, peer_writes), delivered)| {
        if let (true, Some((ptr, len)), None) = (peer_writes, lent_at, &received.error) {
            // SAFETY: as above: the caller's `len` bytes at `ptr` are this transfer's
            // until `in_use` goes, below; nothing else writes them now.
            let lent = unsafe { HostBuffer::borrowed(ptr, len) };
            let (passed, chunk) = &received.passed;
            if let Err(why) = still_as_passed(&lent, passed, *chunk) {
                received.error = Some(TransferError::Protocol(format!("{label}: {why}")));
            }
        }
        (received, delivered)
    });
    drop(in_use.take());
    drop(lease);
    match served {
        Err((outcome, accepted)) => (outcome, accepted),
        Ok((received, delivered)) => {
            let recv::Received {
                mut report,
                error,
                last_ack,
                ..
            } = received;
            if last_ack.is_some() {
                report.reply_delivered &= delivered;
            }
            let outcome = match error {
                Some(e) => RecvOutcome::Failed {
                    peer: label,
                    error: failed_words(&e, report.transfers, report.offered),
                },
                None => RecvOutcome::Completed(Box::new(report)),
            };
            (outcome, true)
        }
    }
}

/// Whether `memory`'s chunks of `chunk` bytes still have the CRC32Cs that passed (none
/// passed: nothing to hold them to); else which one changed.
fn still_as_passed(memory: &dyn RecvSink, passed: &[u32], chunk: u64) -> Result<(), String> {
    if passed.is_empty() {
        return Ok(());
    }
    let now = memory
        .crc32c_chunks(0..memory.len(), chunk as usize)
        .map_err(|e| format!("checking the chunks again: {e:#}"))?;
    if now.len() != passed.len() {
        return Err(format!(
            "{} chunks checked again, {} passed",
            now.len(),
            passed.len()
        ));
    }
    match crate::transfer::repair::failed(passed, &now).first() {
        None => Ok(()),
        Some(k) => Err(format!(
            "chunk {k} changed after its CRC32C passed (the sender's NIC wrote it again, --op write): the received data is not what was checked"
        )),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_held_to_the_crcs_that_passed() {
        let len = 10_000;
        let mut memory = HostBuffer::with_pattern(len).unwrap();
        let passed = crate::integrity::chunk_crcs(memory.as_bytes(), 4096);
        assert_eq!(still_as_passed(&memory, &passed, 4096), Ok(()));
        // Nothing passed (no checksums, or a chunk failed): nothing to hold it to.
        assert_eq!(still_as_passed(&memory, &[], 4096), Ok(()));
        // A byte of chunk 2 written after the check.
        memory.as_bytes_mut()[9000] ^= 1;
        let why = still_as_passed(&memory, &passed, 4096).unwrap_err();
        assert!(
            why.starts_with("chunk 2 changed after its CRC32C passed"),
            "{why}"
        );
    }
}
