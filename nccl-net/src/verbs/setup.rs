//! `listen`, `connect` and `accept` over verbs, never blocking: the RDMA CM's steps
//! (resolve the address, then the route, connect; on the other side a connect request,
//! accept) are driven one event at a time by NCCL's repeated calls. The connector's
//! private data carries the handle's token, which the listener checks before it
//! accepts (a wrong one is rejected).

use super::recv::VerbsRecv;
use super::send::VerbsSend;
use super::{rdma_err, Confined, Link};
use crate::config::Config;
use crate::error::{NetError, Result};
use crate::log::{info, NET};
use crate::wire::{Handle, VERSION};
use host::rdma::{CmEventKind, CmId, ConnParams, EventChannel};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long the address and route resolution may each take (the CM's own timeouts).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may take from the first `connect` call, and an accepted one to
/// become established.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// The connector's private data: the handle's token and this plugin's wire version.
fn private_data(token: u64) -> [u8; 10] {
    let mut b = [0u8; 10];
    b[..8].copy_from_slice(&token.to_le_bytes());
    b[8..].copy_from_slice(&VERSION.to_le_bytes());
    b
}

struct Listening {
    channel: Rc<EventChannel>,
    /// The listening id (kept: dropping it stops the listener).
    _id: Rc<CmId>,
    /// Accepted, not yet established.
    accepting: Vec<(Link, Instant)>,
}

/// A verbs listen comm (what NCCL holds between `listen` and `closeListen`).
#[repr(C)]
pub struct VerbsListen {
    magic: u64,
    token: u64,
    addr: SocketAddr,
    /// `NCCL_GRDMA_CHECKS` as it listened: its receive comms stage small receives only
    /// with the checks on (with them off nothing is checked that staging could hold back).
    checks: bool,
    inner: Confined<Listening>,
}

pub const VLISTEN_MAGIC: u64 = u64::from_le_bytes(*b"grdVList");

impl VerbsListen {
    /// Listens on `ip` (an address of an RDMA device's interface), port chosen by the CM.
    pub fn new(ip: IpAddr, cfg: &Config) -> Result<(Box<Self>, Handle)> {
        let channel = EventChannel::new().map_err(rdma_err)?;
        let id = CmId::new(&channel).map_err(rdma_err)?;
        id.bind(SocketAddr::new(ip, 0)).map_err(rdma_err)?;
        id.listen(64).map_err(rdma_err)?;
        let addr = id
            .local_addr()
            .ok_or_else(|| NetError::system("verbs: the listener has no address"))?;
        let handle = Handle {
            addr,
            streams: 1,
            token: crate::comm::random_u64(),
            verbs: true,
            by_number: false,
        };
        info!(NET; "listening on {addr} over verbs ({})", id.device_name().unwrap_or_default());
        Ok((
            Box::new(Self {
                magic: VLISTEN_MAGIC,
                token: handle.token,
                addr,
                checks: cfg.checks,
                inner: Confined(Listening {
                    channel,
                    _id: id,
                    accepting: Vec::new(),
                }),
            }),
            handle,
        ))
    }

    /// One `accept` call: take connect requests (accept those with the token, reject the
    /// rest), and hand back a receive comm once one is established.
    pub fn accept(&mut self) -> Result<Option<Box<VerbsRecv>>> {
        let l = &mut self.inner.0;
        while let Some(ev) = l.channel.try_get_event().map_err(rdma_err)? {
            if ev.kind() != CmEventKind::ConnectRequest {
                continue;
            }
            let req = ev.into_connect_request(&l.channel).map_err(rdma_err)?;
            let peer = req.peer.map_or_else(|| "?".to_string(), |p| p.to_string());
            if req.private_data.get(..10) != Some(&private_data(self.token)[..]) {
                let _ = req.id.reject(b"grdma: wrong token or version");
                crate::log::warn!("{}: refused a connection from {peer}: its handle's token or version is not this listener's", self.addr);
                continue;
            }
            let link = Link::new(&req.id, peer)?;
            link.conn
                .id
                .accept(&ConnParams::with_private_data(&[]))
                .map_err(rdma_err)?;
            l.accepting.push((link, Instant::now()));
        }
        let mut i = 0;
        while i < l.accepting.len() {
            let (link, since) = &l.accepting[i];
            let mut established = false;
            let mut failed = None;
            while let Some(ev) = link.conn.id.channel().try_get_event().map_err(rdma_err)? {
                match ev.kind() {
                    CmEventKind::Established => established = true,
                    CmEventKind::Disconnected
                    | CmEventKind::ConnectError
                    | CmEventKind::Unreachable
                    | CmEventKind::Rejected => failed = Some(ev.name()),
                    _ => {}
                }
            }
            if failed.is_none() && !established && since.elapsed() > CONNECT_TIMEOUT {
                failed = Some(format!(
                    "not established after {} s",
                    CONNECT_TIMEOUT.as_secs()
                ));
            }
            if let Some(why) = failed {
                let (link, _) = l.accepting.remove(i);
                crate::log::warn!(
                    "{}: a connection from {} failed before it was established: {why}",
                    self.addr,
                    link.peer
                );
                continue;
            }
            if established {
                let (link, _) = l.accepting.remove(i);
                return Ok(Some(VerbsRecv::new(link, self.checks)));
            }
            i += 1;
        }
        Ok(None)
    }
}

/// Where a `connect` stands between NCCL's calls.
pub struct Connecting {
    handle: Handle,
    inner: Confined<Stage>,
    started: Instant,
    cfg: Config,
}

enum Stage {
    Resolving(Rc<CmId>),
    Connecting(Box<Link>),
    Done,
}

impl Connecting {
    pub fn start(handle: Handle, cfg: Config) -> Result<Self> {
        let channel = EventChannel::new().map_err(rdma_err)?;
        let id = CmId::new(&channel).map_err(rdma_err)?;
        id.resolve_addr(handle.addr, RESOLVE_TIMEOUT)
            .map_err(rdma_err)?;
        Ok(Self {
            handle,
            inner: Confined(Stage::Resolving(id)),
            started: Instant::now(),
            cfg,
        })
    }

    /// One step; the send comm once established.
    pub fn step(&mut self) -> Result<Option<Box<VerbsSend>>> {
        let addr = self.handle.addr;
        let fail = |what: String| NetError::remote(format!("connect to {addr} over verbs: {what}"));
        loop {
            let stage = std::mem::replace(&mut self.inner.0, Stage::Done);
            let (next, progressed) = match stage {
                Stage::Resolving(id) => {
                    let Some(ev) = id.channel().try_get_event().map_err(rdma_err)? else {
                        self.inner.0 = Stage::Resolving(id);
                        break;
                    };
                    match ev.kind() {
                        CmEventKind::AddrResolved => {
                            drop(ev);
                            id.resolve_route(RESOLVE_TIMEOUT).map_err(rdma_err)?;
                            (Stage::Resolving(id), true)
                        }
                        CmEventKind::RouteResolved => {
                            drop(ev);
                            let link = Link::new(&id, addr.to_string())?;
                            link.conn
                                .id
                                .connect(&ConnParams::with_private_data(&private_data(
                                    self.handle.token,
                                )))
                                .map_err(rdma_err)?;
                            (Stage::Connecting(Box::new(link)), true)
                        }
                        k => return Err(fail(format!("{k:?} ({})", ev.name()))),
                    }
                }
                Stage::Connecting(link) => {
                    let event = link
                        .conn
                        .id
                        .channel()
                        .try_get_event()
                        .map_err(rdma_err)?
                        .map(|ev| (ev.kind(), ev.name(), ev.private_data().to_vec()));
                    let Some((kind, name, words)) = event else {
                        self.inner.0 = Stage::Connecting(link);
                        break;
                    };
                    match kind {
                        CmEventKind::Established => {
                            return Ok(Some(VerbsSend::new(*link, self.cfg)));
                        }
                        CmEventKind::Rejected => {
                            return Err(fail(format!(
                                "the listener refused the connection ({})",
                                String::from_utf8_lossy(&words).trim_end_matches('\0')
                            )))
                        }
                        CmEventKind::ConnectResponse => (Stage::Connecting(link), true),
                        k => return Err(fail(format!("{k:?} ({name})"))),
                    }
                }
                Stage::Done => return Err(NetError::internal("connect: stepped after the end")),
            };
            self.inner.0 = next;
            if !progressed {
                break;
            }
        }
        if self.started.elapsed() > CONNECT_TIMEOUT {
            return Err(fail(format!(
                "not connected after {} s",
                CONNECT_TIMEOUT.as_secs()
            )));
        }
        Ok(None)
    }
}
