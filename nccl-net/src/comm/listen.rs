//! `listen` and `accept`: a listening socket on the device's address; `accept` takes
//! whatever connections are waiting, reads each one's hello, refuses a wrong token
//! (with a `Reject` frame on it) and groups the rest by connection id; a group with
//! its control socket and every data socket becomes a receive comm. Never blocks.

use super::recv::RecvComm;
use super::{random_u64, LISTEN_MAGIC};
use crate::config::Config;
use crate::error::{io_err, Result};
use crate::log::{info, warn, NET};
use crate::props::{streams_for, Device};
use crate::sock::{self, Io};
use crate::wire::{Ctrl, Handle, Hello, REJECT_BAD_HELLO, REJECT_BAD_TOKEN};
use socket2::Socket;
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A connection that sent no complete hello in this long is dropped.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

struct Pending {
    sock: Socket,
    hello: [u8; Hello::LEN],
    got: usize,
    since: Instant,
}

struct Group {
    ctrl: Option<Socket>,
    data: Vec<Option<Socket>>,
}

#[repr(C)]
pub struct ListenComm {
    magic: u64,
    sock: Socket,
    addr: SocketAddr,
    token: u64,
    streams: u8,
    pending: Vec<Pending>,
    groups: HashMap<u64, Group>,
}

impl ListenComm {
    /// Listens on `ip`; the handle NCCL sends to the connecting rank comes back too.
    pub fn new(device: &Device, cfg: &Config) -> Result<(Box<Self>, Handle)> {
        let ip = device.addr;
        let (sock, addr) = sock::listen(ip).map_err(|e| io_err(format!("listen on {ip}"), e))?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (streams, why) = match cfg.streams {
            Some(n) => (n, "NCCL_GRDMA_STREAMS".to_string()),
            None => {
                let (n, why) = streams_for(device, cores);
                (n, format!("NCCL_GRDMA_STREAMS unset: {why}"))
            }
        };
        let handle = Handle {
            addr,
            streams: streams as u8,
            token: random_u64(),
            verbs: false,
        };
        info!(NET; "listening on {addr} for {streams} data sockets per comm ({why})");
        Ok((
            Box::new(Self {
                magic: LISTEN_MAGIC,
                sock,
                addr,
                token: handle.token,
                streams: handle.streams,
                pending: Vec::new(),
                groups: HashMap::new(),
            }),
            handle,
        ))
    }

    /// One `accept` call: a receive comm once one connection's sockets are all in.
    pub fn accept(&mut self) -> Result<Option<Box<RecvComm>>> {
        while let Some(s) =
            sock::accept(&self.sock).map_err(|e| io_err(format!("accept on {}", self.addr), e))?
        {
            self.pending.push(Pending {
                sock: s,
                hello: [0; Hello::LEN],
                got: 0,
                since: Instant::now(),
            });
        }
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let io = sock::recv(&p.sock, &mut p.hello[p.got..]);
            let drop_it = match io {
                Ok(Io::Moved(n)) => {
                    p.got += n;
                    false
                }
                Ok(Io::Blocked) => {
                    if p.since.elapsed() > HELLO_TIMEOUT {
                        warn!(
                            "a connection to {} sent no hello in {} s: dropped",
                            self.addr,
                            HELLO_TIMEOUT.as_secs()
                        );
                        true
                    } else {
                        false
                    }
                }
                // The connector gave up (closed, reset) before its hello: nothing to do.
                Ok(Io::Closed) | Err(_) => true,
            };
            if drop_it {
                self.pending.swap_remove(i);
                continue;
            }
            if self.pending[i].got < Hello::LEN {
                i += 1;
                continue;
            }
            let p = self.pending.swap_remove(i);
            self.place(p);
        }
        let full = self.groups.iter().find_map(|(id, g)| {
            (g.ctrl.is_some() && g.data.iter().all(Option::is_some)).then_some(*id)
        });
        let Some(id) = full else { return Ok(None) };
        let Some(g) = self.groups.remove(&id) else {
            return Ok(None);
        };
        let (Some(ctrl), data) = (g.ctrl, g.data.into_iter().flatten().collect()) else {
            return Ok(None);
        };
        Ok(Some(RecvComm::new(ctrl, data)?))
    }

    fn place(&mut self, p: Pending) {
        let reject = |s: &Socket, reason: u32| {
            let mut b = Vec::new();
            Ctrl::Reject { reason }.encode(&mut b);
            // Best effort: 16 bytes into an idle socket's buffer; the close follows.
            let _ = sock::send(s, &[IoSlice::new(&b)]);
        };
        let h = match Hello::decode(&p.hello) {
            Ok(h) => h,
            Err(e) => {
                warn!(
                    "a connection to {} is not a grdma comm ({}): refused",
                    self.addr, e.0
                );
                reject(&p.sock, REJECT_BAD_HELLO);
                return;
            }
        };
        if h.token != self.token || h.streams != self.streams {
            warn!(
                "a connection to {} carried another listener's handle (token or stream count differ): refused",
                self.addr
            );
            reject(&p.sock, REJECT_BAD_TOKEN);
            return;
        }
        let streams = self.streams as usize;
        let g = self.groups.entry(h.conn_id).or_insert_with(|| Group {
            ctrl: None,
            data: (0..streams).map(|_| None).collect(),
        });
        let place = if h.index == 0 {
            &mut g.ctrl
        } else {
            &mut g.data[h.index as usize - 1]
        };
        if place.is_some() {
            warn!(
                "a connection to {} repeated socket {} of one comm: refused",
                self.addr, h.index
            );
            reject(&p.sock, REJECT_BAD_HELLO);
            return;
        }
        *place = Some(p.sock);
    }

    /// `closeListen`: the listening socket and any connection not yet accepted close.
    pub fn close(self) {
        if !self.pending.is_empty() || !self.groups.is_empty() {
            info!(NET; "listen comm on {} closed with {} connections not accepted", self.addr,
                self.pending.len() + self.groups.len());
        }
    }
}
