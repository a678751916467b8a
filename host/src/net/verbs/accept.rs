//! Answering an admitted verbs offer: the receive buffer chosen where the NIC registers
//! it, rail 0's queue pair made and its receives posted, the accept (the buffer's key
//! in write mode; a token for the further rails of a striped transfer), and the link
//! handed to the engine; after it, the last ack delivered and the connection closed.
//! A further rail is set up the same way when it joins.

use super::conn::{next_event, Resources, DISCONNECT_GRACE};
use super::listen::{refuse, VerbsOffer};
use super::rail::{register, Mode, RailSetup, RecvRail};
use super::recv::{Joining, VerbsReceiver};
use crate::memory::RecvSink;
use crate::memory_factory::SinkFactory;
use crate::memory_path::{walk, AttemptLog};
use crate::rdma::{self, CmEventKind, ConnectRequest, Deadline};
use crate::transfer::RecvOutcome;
use crate::wire::{AcceptInfo, RejectReason, StripedAccept};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a further rail's close waits for the sender's disconnect.
const RAIL_CLOSE_GRACE: Duration = Duration::from_millis(500);

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
        super::trace!("accept: protection domain, completion queue and buffer made");
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
        super::trace!("accept: buffer registered, queue pair made, receives posted");
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
        super::trace!("accept: established");
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
