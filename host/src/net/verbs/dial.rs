//! A verbs sender's connection over 1..=N rails, opened and handed to the engine:
//!
//! 1. Each rail gets its own event channel, CM id (resolved to its receiver address,
//!    checked against its `--nic` and the chunk size), PD and CQ. A rail that does not
//!    open is left out (the first one's error ends the transfer only if none opens).
//! 2. The source's memory is chosen on the first rail's device (the first method of the
//!    plan whose memory the NIC registers) and registered on every rail's PD (for GPU
//!    memory, the same dma-buf each time).
//! 3. The first rail connects with the offer (and, after a receiver's challenge, the
//!    proof of the key); the accept names the buffer (write mode) and, striped, a token
//!    that every further rail joins with ([`Join`]), each within a moment: one that does
//!    not join is left out.
//! 4. The link ([`VerbsSender`]) runs the engine's transfers; then every rail closes.

use super::conn::{Connection, Resources, DISCONNECT_GRACE, SLOT};
use super::open::{
    check_device, check_message_size, choose_source, connect, register_source, resolve,
};
use super::send::{post_replies, SendRail, Target, VerbsSender, REPLY_SLOTS, SEND_SLOTS};
use crate::memory::SendSource;
use crate::memory_factory::SendMemory;
use crate::memory_path::AttemptLog;
use crate::rdma::{self, CmId, EventChannel, MemoryRegion, QpCaps};
use crate::server::key::NONCE_LEN;
use crate::server::Key;
use crate::transfer::faults::{FaultInjector, PeerLie};
use crate::transfer::TransferError;
use crate::wire::{
    AcceptInfo, Join, Op, RejectReason, StripedAccept, VerbsProof, WireError, HEADER_FLAG_REPEAT,
    HEADER_LEN,
};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// One rail: the receiver's address on it, and the local RDMA device the route must
/// leave through (`--nic`'s k-th), if named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailTarget {
    pub peer: SocketAddr,
    pub nic: Option<String>,
}

impl RailTarget {
    /// The name it rests under after a failure (its device, else its address).
    pub fn label(&self) -> String {
        format!(
            "rdma {}",
            self.nic
                .clone()
                .unwrap_or_else(|| self.peer.ip().to_string())
        )
    }
}

/// How to open the connection.
pub struct DialConfig<'a> {
    /// Every rail the sender has; `tried`: those to open now (indices into it).
    pub rails: &'a [RailTarget],
    pub tried: &'a [usize],
    pub op: Op,
    /// Bytes per chunk (the largest item).
    pub chunk: u64,
    pub depth: u32,
    pub timeout: Duration,
    pub busy_poll: bool,
    pub key: Option<&'a Key>,
    /// Test only: one bit flipped in a copy of some items.
    pub faults: Option<FaultInjector>,
    /// Test only: the protocol broken on purpose in items' first sending.
    pub lies: Option<PeerLie>,
    pub protocol_version: u16,
}

/// Where the sender's memory comes from.
pub enum Source<'a> {
    /// A plan, walked on the first rail's device until the NIC registers a method's
    /// memory (the command line's: GPUDirect RDMA, staged, mapped, host).
    Plan(&'a mut SendMemory),
    /// Memory the caller gives (the library's), registered as it is.
    Given(&'a dyn SendSource),
}

/// What the opening found, for the report.
pub struct Dialed<'s> {
    pub source: &'s dyn SendSource,
    pub memory: AttemptLog,
    /// The link's rails, as indices into the sender's rails.
    pub connected: Vec<usize>,
    /// Rails left out, and why.
    pub left_out: Vec<(usize, String)>,
    /// Each link rail's local device and port ("rxe0:1").
    pub locals: Vec<String>,
    pub device: Option<String>,
    /// From the start to the last rail joined, less making the data.
    pub connect_seconds: f64,
}

/// The longest a further rail's join may take (at most --timeout).
const JOIN_WAIT: Duration = Duration::from_secs(2);

/// A rail resolved, with its PD and CQ.
struct Opened {
    rail: usize,
    id: Rc<CmId>,
    res: Resources,
}

/// Open the connection, run `run` on its link, close it. `offer(rails)`: the encoded
/// offer for a link of `rails` rails (1: not striped).
pub fn dial<R>(
    cfg: &DialConfig<'_>,
    memory: &mut Source<'_>,
    offer: &dyn Fn(u8) -> Result<Vec<u8>, TransferError>,
    run: &mut dyn FnMut(&mut VerbsSender<'_>, &Dialed<'_>) -> Result<R, TransferError>,
) -> Result<R, TransferError> {
    match attempt(cfg, memory, offer, None, run) {
        // A receiver with a key answered with a nonce: connect again, proving the key over
        // it (once; a second challenge is an error like any other).
        Err(TransferError::Rejected(RejectReason::KeyChallenge { nonce })) if cfg.key.is_some() => {
            attempt(cfg, memory, offer, Some(nonce), run)
        }
        other => other,
    }
}

fn attempt<R>(
    cfg: &DialConfig<'_>,
    memory: &mut Source<'_>,
    offer: &dyn Fn(u8) -> Result<Vec<u8>, TransferError>,
    nonce: Option<[u8; NONCE_LEN]>,
    run: &mut dyn FnMut(&mut VerbsSender<'_>, &Dialed<'_>) -> Result<R, TransferError>,
) -> Result<R, TransferError> {
    let t0 = Instant::now();
    rdma::ensure_device()?;
    let caps = QpCaps {
        max_send_wr: cfg.depth + SEND_SLOTS as u32 + 8,
        max_recv_wr: REPLY_SLOTS as u32 + 1,
        max_inline_data: 0,
    };
    // --- each rail: resolve, check its device, PD and CQ -----------------------------
    let mut opened: Vec<Opened> = Vec::new();
    let mut left_out: Vec<(usize, String)> = Vec::new();
    let mut first_error = None;
    for &k in cfg.tried {
        let target = &cfg.rails[k];
        let open = || -> Result<Opened, TransferError> {
            let channel = EventChannel::new()?;
            let id = CmId::new(&channel)?;
            super::trace!("dial rail {k}: resolving {}", target.peer);
            resolve(&id, target.peer, cfg.timeout)?;
            super::trace!("dial rail {k}: address and route resolved");
            check_message_size(&id, cfg.chunk, "a chunk (--chunk)")?;
            check_device(&id, target.nic.as_deref(), target.peer)?;
            let res = Resources::new(&id, Resources::cq_entries(caps), cfg.busy_poll)?;
            super::trace!("dial rail {k}: protection domain and completion queue made");
            Ok(Opened { rail: k, id, res })
        };
        match open() {
            Ok(o) => opened.push(o),
            Err(e) => {
                left_out.push((k, format!("not opened: {e}")));
                first_error.get_or_insert(e);
            }
        }
    }
    if opened.is_empty() {
        return Err(
            first_error.unwrap_or_else(|| TransferError::Protocol("no rail to open".into()))
        );
    }

    // --- the memory: chosen on the first rail's device, registered on every rail's ----
    let (source, memory_log, making): (&dyn SendSource, _, _) = match memory {
        Source::Plan(m) => {
            let making_before = m.making_time();
            choose_source(&opened[0].res, m, making_before)?
        }
        Source::Given(s) => (*s, AttemptLog::default(), Duration::ZERO),
    };
    let mut mrs: Vec<MemoryRegion> = Vec::new();
    let mut kept: Vec<Opened> = Vec::new();
    for (i, o) in opened.into_iter().enumerate() {
        match register_source(&o.res, source) {
            Ok(mr) => {
                mrs.push(mr);
                kept.push(o);
            }
            // The memory was chosen on this rail's device: it must register there.
            Err(e) if i == 0 => return Err(e),
            Err(e) => left_out.push((o.rail, format!("not registered: {e}"))),
        }
    }
    let opened = kept;
    super::trace!("dial: the source registered on {} rail(s)", opened.len());
    let mut conns: Vec<Option<Connection>> = Vec::new();
    for o in &opened {
        let conn = Connection::new(&o.res, caps, (REPLY_SLOTS, SLOT), SEND_SLOTS)?;
        post_replies(&conn)?;
        conns.push(Some(conn));
    }

    // --- the first rail: the offer; then the joins ------------------------------------
    let rails = opened.len();
    let header = offer(rails as u8)?;
    let private_data = match (
        nonce,
        cfg.key,
        <[u8; HEADER_LEN]>::try_from(header.as_slice()),
    ) {
        (Some(nonce), Some(key), Ok(h)) => VerbsProof {
            nonce_id: VerbsProof::nonce_id(&nonce),
            tag: key.prove_truncated(&h, &nonce),
        }
        .private_data(&h)
        .to_vec(),
        _ => header.clone(),
    };
    let first = &opened[0];
    super::trace!("dial: queue pairs made, receives posted; connecting with the offer");
    let answer = connect(&first.id, cfg.rails[first.rail].peer, &private_data, cfg.timeout, false)
        .map_err(|e| match e {
            TransferError::Rejected(RejectReason::BadHeader(WireError::UnknownFlags { flags }))
                if flags & HEADER_FLAG_REPEAT != 0 =>
            {
                TransferError::Protocol(format!(
                    "receiver rejected the transfer: it does not know --reuse-connection (unknown flags {flags:#04x}); update it, or drop --reuse-connection"
                ))
            }
            e => e,
        })?;
    let close_first = |why: String| {
        if let Some(c) = &conns[0] {
            c.close(true, DISCONNECT_GRACE);
        }
        why
    };
    let peer = cfg.rails[first.rail].peer;
    let (first_info, token) = match rails {
        1 => (
            AcceptInfo::decode(&answer).map_err(|e| not_framed(peer, e, &close_first))?,
            None,
        ),
        _ => {
            let s = StripedAccept::decode(&answer).map_err(|e| {
                TransferError::Protocol(close_first(format!(
                    "the receiver at {peer} did not accept a striped transfer as one ({e}); is it an older `host recv`?"
                )))
            })?;
            (s.info, Some(s.token))
        }
    };
    let mut infos: Vec<Option<AcceptInfo>> = vec![Some(first_info)];
    for (j, o) in opened.iter().enumerate().skip(1) {
        let join = Join {
            token: token.unwrap_or_default(),
            rail: j as u8,
            rails: rails as u8,
        };
        // Bounded apart from --timeout: a rail that cannot join is left out, not worth the
        // whole transfer.
        let wait = cfg.timeout.min(JOIN_WAIT);
        let target = &cfg.rails[o.rail];
        let joined = connect(&o.id, target.peer, &join.encode(), wait, false).and_then(|data| {
            AcceptInfo::decode(&data)
                .map_err(|e| TransferError::Protocol(format!("its accept: {e}")))
        });
        match joined {
            Ok(info) => infos.push(Some(info)),
            Err(e) => {
                infos.push(None);
                left_out.push((o.rail, format!("did not join: {e}")));
            }
        }
    }
    for info in infos.iter().flatten() {
        if info.len < memory_len(source) {
            return Err(TransferError::Protocol(close_first(format!(
                "the receiver offered a {}-byte buffer for a {}-byte transfer",
                info.len,
                memory_len(source)
            ))));
        }
    }
    let connect_seconds = t0.elapsed().saturating_sub(making).as_secs_f64();
    super::trace!("dial: accepted, every rail joined");

    // --- the link ------------------------------------------------------------------------
    let mut send_rails = Vec::new();
    let mut connected = Vec::new();
    let mut locals = Vec::new();
    for (j, o) in opened.iter().enumerate() {
        let (Some(info), Some(conn)) = (infos[j], conns[j].take()) else {
            continue;
        };
        let target = match cfg.op {
            Op::Write => Target::Write {
                addr: info.addr,
                rkey: info.rkey,
            },
            Op::Send => Target::Send,
        };
        let device = o.id.device_name().unwrap_or_else(|| "?".into());
        let port = o.id.port_info().map(|p| p.port_num).unwrap_or(1);
        locals.push(format!("{device}:{port}"));
        connected.push(o.rail);
        send_rails.push(SendRail {
            conn,
            mr: &mrs[j],
            target,
        });
    }
    let mut link = VerbsSender::new(
        send_rails,
        rails > 1,
        cfg.chunk as usize,
        source,
        cfg.faults,
        cfg.lies,
    )
    .map_err(|e| TransferError::Protocol(e.0))?;
    let dialed = Dialed {
        source,
        memory: memory_log,
        connected,
        left_out,
        locals,
        device: opened[0].id.device_name(),
        connect_seconds,
    };
    let ran = run(&mut link, &dialed);
    link.close(DISCONNECT_GRACE);
    ran
}

fn memory_len(source: &dyn SendSource) -> u64 {
    source.len() as u64
}

/// A first rail's accept that is no accept: the receiver is no framed `host recv`.
fn not_framed(peer: SocketAddr, e: WireError, close: &dyn Fn(String) -> String) -> TransferError {
    let why = match e {
        WireError::BadMagic {
            got: [0, 0, 0, 0], ..
        }
        | WireError::Short { got: 0, .. } => "no accept data".to_string(),
        e => e.to_string(),
    };
    TransferError::NotFramed {
        peer: peer.to_string(),
        why: close(why),
    }
}
