//! Answering an admitted verbs offer: the receive buffer chosen where the NIC registers
//! it, rail 0's queue pair made and its receives posted, the accept (the buffer's key
//! in write mode; a token for the further rails of a striped transfer), and the link
//! handed to the engine; after it, the last ack delivered and the connection closed.
//! A further rail is set up the same way when it joins ([`prepare`]).

use super::conn::{next_event, Connection, Resources, DISCONNECT_GRACE, SLOT};
use super::listen::{refuse, VerbsOffer};
use super::recv::{slots_for, Joining, Mode, RecvRail, VerbsReceiver};
use super::send::SEND_SLOTS;
use crate::memory::select::{walk, AttemptLog};
use crate::memory::{RecvSink, Registrable, SinkFactory};
use crate::rdma::{self, CmEventKind, ConnParams, ConnectRequest, Deadline, MemoryRegion, QpCaps};
use crate::transfer::RecvOutcome;
use crate::wire::{AcceptInfo, Header, Op, RejectReason, StripedAccept, ACK_LEN, MAX_DEPTH};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// "Receiver not ready" retry delay asked of senders: IB encoding 12 = 0.64 ms (the CM
/// leaves 655 ms).
const MIN_RNR_TIMER: u8 = 12;
/// Receives kept posted at least (if the transfer has that many chunks).
const MIN_RECEIVES: u64 = 64;
/// How long a further rail's close waits for the sender's disconnect.
const RAIL_CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Receives a receiver keeps posted per rail: more than the sender keeps in flight
/// (twice, and at least 64), since a receive is reposted only a moment after its
/// completion and a sender that finds none must back off; never more than the chunks
/// (and a few for messages), nor than twice the deepest offer.
pub fn recv_depth(header: &Header) -> usize {
    (header.depth as u64 * 2)
        .max(MIN_RECEIVES)
        .min(header.chunks().max(8))
        .min(2 * MAX_DEPTH as u64) as usize
}

/// How a rail of a transfer is set up, rail 0 and the joins alike.
#[derive(Debug, Clone, Copy)]
pub struct RailSetup {
    pub mode: Mode,
    pub recv_depth: usize,
    pub chunk: usize,
    pub total: u64,
    pub busy_poll: bool,
}

impl RailSetup {
    fn of(header: &Header, busy_poll: bool) -> RailSetup {
        let mode = match (header.op, header.rails > 1) {
            (Op::Write, _) => Mode::Write,
            (Op::Send, false) => Mode::SendInPlace,
            (Op::Send, true) => Mode::SendCopied,
        };
        RailSetup {
            mode,
            recv_depth: recv_depth(header),
            chunk: header.chunk_bytes as usize,
            total: header.total_bytes,
            busy_poll,
        }
    }

    fn caps(&self, inline: bool) -> QpCaps {
        let (slots, _) = slots_for(self.mode, self.recv_depth, self.chunk);
        QpCaps {
            max_send_wr: SEND_SLOTS as u32 + 8,
            max_recv_wr: self.recv_depth.max(slots) as u32 + 8,
            // The ack fragment goes inline, its buffer free at once.
            max_inline_data: if inline {
                (ACK_LEN + SLOT / 8) as u32
            } else {
                0
            },
        }
    }

    /// Bytes a rail holds beyond the buffer: its slots.
    pub fn rail_bytes(&self) -> u64 {
        let (slots, len) = slots_for(self.mode, self.recv_depth, self.chunk);
        (slots * len + SEND_SLOTS * SLOT) as u64
    }

    /// The connection of a rail over `res`, asking for inline sends (without them where
    /// the device refuses).
    fn connection<'r>(&self, res: &Resources) -> Result<Connection<'r>, rdma::RdmaError> {
        let slots = slots_for(self.mode, self.recv_depth, self.chunk);
        Connection::new(res, self.caps(true), slots, SEND_SLOTS)
            .or_else(|_| Connection::new(res, self.caps(false), slots, SEND_SLOTS))
    }
}

/// Register `memory` on `res`'s PD: for the peer's RDMA WRITEs too in write mode.
///
/// # Safety
/// In write mode, the region is dropped, not leaked, before `memory`'s borrow ends, and
/// `memory` is read only by copies while it lives
/// ([`MemoryRegion::register_remote_writable`]).
unsafe fn register<'m>(
    res: &Resources,
    memory: &'m dyn Registrable,
    mode: Mode,
) -> Result<MemoryRegion<'m>, rdma::RdmaError> {
    match mode {
        // SAFETY: the caller's promise.
        Mode::Write => unsafe { MemoryRegion::register_remote_writable(&res.pd, memory) },
        _ => MemoryRegion::register(&res.pd, memory),
    }
}

/// A further rail that joined: its queue pair over the buffer registered on its device,
/// and the accept that tells the sender where to write. Not accepted yet: its receives
/// go in first.
///
/// # Errors
/// What to reject it with.
pub fn prepare<'r>(
    request: &ConnectRequest,
    memory: &'r dyn Registrable,
    setup: &RailSetup,
) -> Result<(RecvRail<'r>, AcceptInfo), RejectReason> {
    let caps = setup.caps(true);
    let res = Resources::new(&request.id, Resources::cq_entries(caps), setup.busy_poll)
        .map_err(|_| RejectReason::Internal)?;
    let (mr, info) = match setup.mode {
        Mode::Write => {
            // SAFETY: the region goes into the rail, which the link owns; the link is a
            // local of `VerbsOffer::serve`, declared after the buffer and never leaked, so
            // the region is deregistered before the buffer goes; the buffer is a
            // RecvSink's, read only by copies.
            let mr = unsafe { register(&res, memory, setup.mode) }
                .map_err(|_| RejectReason::NotRegistrable { bytes: setup.total })?;
            let info = AcceptInfo {
                addr: mr.remote_base(),
                rkey: mr.rkey(),
                len: setup.total,
            };
            (Some(mr), info)
        }
        // SENDs land in this rail's own slots: nothing of the buffer is registered here.
        _ => (
            None,
            AcceptInfo {
                addr: 0,
                rkey: 0,
                len: setup.total,
            },
        ),
    };
    let conn = setup.connection(&res).map_err(|_| RejectReason::Internal)?;
    Ok((RecvRail { conn, mr }, info))
}

/// Accept `request` with `private_data`, once its receives are posted.
pub(crate) fn accept(
    request: &ConnectRequest,
    conn: &Connection,
    private_data: &[u8],
) -> Result<(), rdma::RdmaError> {
    request
        .id
        .accept(&ConnParams::with_private_data(private_data))?;
    // Should the receives run out, the sender retries after 0.64 ms, not 655 ms: only
    // an optimisation, not fatal.
    let _ = conn.qp.set_min_rnr_timer(MIN_RNR_TIMER);
    Ok(())
}

/// Where a transfer's buffer comes from: a plan walked until the NIC registers a
/// method's buffer, or a buffer given (a library caller's).
pub enum SinkChoice<'a> {
    Plan(&'a SinkFactory),
    Given(Box<dyn RecvSink + 'a>),
}

/// What the engine is told of the connection it runs on.
pub struct Session {
    pub memory: AttemptLog,
    pub accepted_at: Instant,
}

/// How serving an admitted offer ended before the engine ran: the outcome to report,
/// and whether the offer was accepted (an accepted one uses `--once` up).
pub type NotServed = (RecvOutcome, bool);

impl VerbsOffer {
    /// Bytes the connection's rails hold besides the buffer (their slots), for admission.
    pub fn link_bytes(&self) -> u64 {
        self.header.map_or(0, |h| {
            RailSetup::of(&h, false).rail_bytes() * h.rails.max(1) as u64
        })
    }

    /// Serve this offer: the buffer from `sinks`, rail 0 accepted, further rails taken as
    /// they join; `run` gets the link and the buffer, and returns what it made and the
    /// connection's last message (the ack), delivered on every live rail before the
    /// connection closes. Also whether that last message was delivered.
    pub fn serve<R>(
        self,
        sinks: SinkChoice<'_>,
        timeout: Duration,
        busy_poll: bool,
        run: impl FnOnce(&mut VerbsReceiver<'_>, &dyn RecvSink, Session) -> (R, Option<Vec<u8>>),
    ) -> Result<(R, bool), NotServed> {
        let peer = self.peer;
        let Some(header) = self.header else {
            return Err((
                RecvOutcome::Failed {
                    peer: peer.to_string(),
                    error: "a raw request offered to a framed receiver".into(),
                },
                false,
            ));
        };
        let request = self.request.into_inner();
        super::trace!(
            "accept: serving an offer of {} bytes from {peer}",
            header.total_bytes
        );
        let setup = RailSetup::of(&header, busy_poll);
        let refused =
            |reason: RejectReason, why: String| (refuse(&request, peer, reason, Some(why)), false);
        let withdrawn = |e: rdma::RdmaError| {
            match e.errno() {
            // The request's id is no longer connectable: the sender gave up first.
            Some(libc::EINVAL) => (RecvOutcome::Failed {
                peer: peer.to_string(),
                error: format!("the connection request from {peer} was withdrawn before it could be accepted ({e})"),
            }, false),
            _ => (refuse(&request, peer, RejectReason::Internal, Some(e.to_string())), false),
        }
        };
        let caps = setup.caps(true);
        let res = Resources::new(&request.id, Resources::cq_entries(caps), busy_poll)
            .map_err(withdrawn)?;
        let (sink, memory) =
            choose_sink(&res, sinks, &setup).map_err(|(reason, why)| refused(reason, why))?;
        let sink = sink.as_ref();
        // SAFETY: `mr` is a local declared after `sink` and never moved out or leaked: it
        // is deregistered before the buffer goes; a RecvSink reads its memory only by
        // copies.
        let mr = unsafe { register(&res, sink.memory(), setup.mode) }
            .map_err(|e| refused(RejectReason::NoMemory { bytes: setup.total }, e.to_string()))?;
        let conn = setup.connection(&res).map_err(withdrawn)?;
        let striped = header.rails > 1;
        let joining = match striped {
            false => None,
            true => {
                let slot = self
                    .joins
                    .open(None, header.rails as u16, None)
                    .map_err(|r| refused(RejectReason::Internal, r.words().to_string()))?;
                Some(Joining {
                    slot,
                    memory: sink.memory(),
                    setup,
                })
            }
        };
        let token = joining.as_ref().map(|j| j.slot.token);
        let info = AcceptInfo {
            addr: if setup.mode == Mode::Write {
                mr.remote_base()
            } else {
                0
            },
            rkey: if setup.mode == Mode::Write {
                mr.rkey()
            } else {
                0
            },
            len: setup.total,
        };
        let mut link = VerbsReceiver::new(
            RecvRail { conn, mr: None },
            header.rails.max(1) as usize,
            setup.mode,
            sink,
            &mr,
            setup.recv_depth,
            header.named,
            joining,
        )
        .map_err(|e| refused(RejectReason::Internal, e.0))?;
        let private_data = match token {
            Some(token) => StripedAccept { info, token }.encode().to_vec(),
            None => info.encode().to_vec(),
        };
        link.accept_first(&request, &private_data)
            .map_err(withdrawn)?;
        wait_established(&request, peer, timeout).map_err(|why| {
            (
                RecvOutcome::Failed {
                    peer: peer.to_string(),
                    error: why,
                },
                true,
            )
        })?;
        let session = Session {
            memory,
            accepted_at: Instant::now(),
        };
        let (made, last) = run(&mut link, sink, session);
        let delivered = match last {
            Some(bytes) => link.deliver(&bytes, timeout),
            None => false,
        };
        // The sender disconnects once it has the ack: wait for that on rail 0 (a moment
        // only where the ack went another way).
        link.wait_closed(if delivered {
            timeout.min(DISCONNECT_GRACE * 2)
        } else {
            RAIL_CLOSE_GRACE
        });
        crate::net::RecvLink::close(&mut link);
        drop(link);
        Ok((made, delivered))
    }
}

/// Walk the memory plan on this connection's protection domain: make a buffer for the
/// first method and trial-register it; a refusal (the NIC takes no GPU memory, say)
/// moves on to the next. SENDs copied in by the CPU need host memory.
fn choose_sink<'a>(
    res: &Resources,
    sinks: SinkChoice<'a>,
    setup: &RailSetup,
) -> Result<(Box<dyn RecvSink + 'a>, AttemptLog), (RejectReason, String)> {
    let total = setup.total;
    let usable = |sink: &dyn RecvSink| -> Result<(), String> {
        if (sink.len() as u64) < total {
            return Err(format!("a {}-byte buffer for {total} bytes", sink.len()));
        }
        if setup.mode == Mode::SendCopied && sink.memory().target().is_gpu_memory() {
            return Err("SENDs over several rails are copied in by the CPU: not into GPU memory (use --op write)".into());
        }
        // SAFETY: the trial region is dropped at once, before the buffer it borrows;
        // nothing reads the buffer meanwhile.
        unsafe { register(res, sink.memory(), setup.mode) }
            .map(drop)
            .map_err(|e| e.to_string())
    };
    match sinks {
        SinkChoice::Given(sink) => {
            usable(sink.as_ref())
                .map_err(|why| (RejectReason::NotRegistrable { bytes: total }, why))?;
            Ok((sink, AttemptLog::default()))
        }
        SinkChoice::Plan(factory) => {
            let len = usize::try_from(total)
                .map_err(|e| (RejectReason::NoMemory { bytes: total }, e.to_string()))?;
            let walked = walk(&factory.plan(), |method| {
                let sink = factory.make(method, len).map_err(|e| format!("{e:#}"))?;
                usable(sink.as_ref())?;
                Ok(sink)
            })
            .map_err(|e| (RejectReason::NotRegistrable { bytes: total }, e.to_string()))?;
            factory.settle(walked.method);
            Ok((walked.value, walked.log))
        }
    }
}

/// Wait for ESTABLISHED on a connection this side accepted.
fn wait_established(
    request: &ConnectRequest,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Deadline::after(timeout);
    let what = format!("the connection from {peer} to be established");
    let event = next_event(&request.id, &deadline, &what).map_err(|e| e.to_string())?;
    if event.kind() != CmEventKind::Established {
        return Err(format!(
            "the connection from {peer} was not established: {}{}",
            event.name(),
            match event.status() {
                0 => String::new(),
                s if s < 0 => format!(" ({})", rdma::errno_message(-s)),
                s => format!(" (status {s})"),
            }
        ));
    }
    Ok(())
}
