//! `listen` and `accept`: a listening socket on the device's address; `accept` takes
//! whatever connections are waiting, reads each one's hello, refuses a wrong token
//! (with a `Reject` frame on it) and groups the rest by connection id; a group with
//! its control socket and every data socket becomes a receive comm. Never blocks.
//!
//! What a listen comm holds is bounded, whoever connects: NCCL listens once per
//! connection, so a listen comm serves one comm of at most 17 sockets, and anything
//! beyond [`MAX_PENDING`] silent sockets or [`MAX_GROUPS`] unfinished comms is someone
//! else's flood. The longest-silent sockets go first (a real connector writes its hello
//! as soon as it is connected), and an unfinished comm goes once its connector would have
//! given up (`CONNECT_TIMEOUT`).

use super::connect::CONNECT_TIMEOUT;
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
/// Connections waiting for their hello, at most (beyond it the longest-waiting go).
pub const MAX_PENDING: usize = 64;
/// Comms with some but not all of their sockets in, at most (beyond it a new one is
/// refused).
pub const MAX_GROUPS: usize = 8;
/// The least time between two warnings about dropped connections (a flood is one line
/// every so often, with a count, not one per socket).
const DROP_WARN_EVERY: Duration = Duration::from_secs(10);

struct Pending {
    sock: Socket,
    hello: [u8; Hello::LEN],
    got: usize,
    since: Instant,
}

struct Group {
    ctrl: Option<Socket>,
    data: Vec<Option<Socket>>,
    since: Instant,
}

#[repr(C)]
pub struct ListenComm {
    magic: u64,
    sock: Socket,
    addr: SocketAddr,
    token: u64,
    streams: u8,
    /// `NCCL_GRDMA_EAGER_BY_NUMBER` as it listened (the handle says it to the sender).
    by_number: bool,
    pending: Vec<Pending>,
    groups: HashMap<u64, Group>,
    hello_timeout: Duration,
    /// How long a comm may stay unfinished: as long as its connector tries.
    group_timeout: Duration,
    /// Connections dropped since the last warning about them, and when that was.
    dropped: usize,
    warned: Option<Instant>,
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
            by_number: cfg.eager_by_number,
        };
        info!(NET; "listening on {addr} for {streams} data sockets per comm ({why})");
        Ok((
            Box::new(Self {
                magic: LISTEN_MAGIC,
                sock,
                addr,
                token: handle.token,
                streams: handle.streams,
                by_number: handle.by_number,
                pending: Vec::new(),
                groups: HashMap::new(),
                hello_timeout: HELLO_TIMEOUT,
                group_timeout: CONNECT_TIMEOUT,
                dropped: 0,
                warned: None,
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
                    let late = p.since.elapsed() > self.hello_timeout;
                    self.dropped += usize::from(late);
                    late
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
        self.bound();
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
        Ok(Some(RecvComm::new(ctrl, data, self.by_number)?))
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
        if !self.groups.contains_key(&h.conn_id) && self.groups.len() >= MAX_GROUPS {
            warn!(
                "a connection to {} would be one more of {MAX_GROUPS} comms not yet complete: refused",
                self.addr
            );
            reject(&p.sock, REJECT_BAD_HELLO);
            return;
        }
        let streams = self.streams as usize;
        let g = self.groups.entry(h.conn_id).or_insert_with(|| Group {
            ctrl: None,
            data: (0..streams).map(|_| None).collect(),
            since: Instant::now(),
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

    /// Keeps what this comm holds within its bounds: the longest-waiting silent sockets
    /// beyond [`MAX_PENDING`] and comms unfinished after the connector's time are dropped
    /// (closed), with one warning every [`DROP_WARN_EVERY`] at most.
    fn bound(&mut self) {
        if self.pending.len() > MAX_PENDING {
            self.pending.sort_by_key(|p| p.since);
            let extra = self.pending.len() - MAX_PENDING;
            self.pending.drain(..extra);
            self.dropped += extra;
        }
        let limit = self.group_timeout;
        let before = self.groups.len();
        self.groups.retain(|_, g| g.since.elapsed() <= limit);
        if self.groups.len() < before {
            warn!(
                "{} comms connecting to {} did not bring all their sockets in {} s: dropped",
                before - self.groups.len(),
                self.addr,
                limit.as_secs()
            );
        }
        let quiet = self.warned.is_none_or(|t| t.elapsed() >= DROP_WARN_EVERY);
        if self.dropped > 0 && quiet {
            warn!(
                "{} connections to {} sent no hello in {} s, or waited beyond {MAX_PENDING} \
                 others that had not: dropped (not NCCL's; a scan or a flood?)",
                self.dropped,
                self.addr,
                self.hello_timeout.as_secs()
            );
            self.dropped = 0;
            self.warned = Some(Instant::now());
        }
    }

    /// `closeListen`: the listening socket and any connection not yet accepted close.
    pub fn close(self) {
        if !self.pending.is_empty() || !self.groups.is_empty() {
            info!(NET; "listen comm on {} closed with {} connections not accepted", self.addr,
                self.pending.len() + self.groups.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::io::Write;
    use std::net::{IpAddr, Ipv4Addr, TcpStream};

    /// A listen comm on loopback for comms of one data socket.
    fn listener() -> (Box<ListenComm>, Handle) {
        let device = Device {
            name: CString::new("lo").unwrap(),
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            pci_path: None,
            speed_mbps: 10_000,
            speed_from: crate::props::SpeedFrom::Default,
            rdma: None,
        };
        let cfg = Config::parse(|k| (k == "NCCL_GRDMA_STREAMS").then(|| "1".to_string())).unwrap();
        ListenComm::new(&device, &cfg).unwrap()
    }

    /// A socket of comm `conn_id` that has written its hello for socket `index`.
    fn hello(handle: &Handle, index: u8, conn_id: u64) -> TcpStream {
        let mut s = TcpStream::connect(handle.addr).unwrap();
        let h = Hello {
            index,
            streams: handle.streams,
            token: handle.token,
            conn_id,
        };
        s.write_all(&h.encode()).unwrap();
        s
    }

    /// `accept` until it gives a comm, within a few seconds.
    fn accept_one(l: &mut ListenComm) -> Box<RecvComm> {
        let t0 = Instant::now();
        loop {
            if let Some(r) = l.accept().unwrap() {
                return r;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no comm accepted");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_flood_of_silent_connections_is_bounded_and_a_real_comm_still_gets_in() {
        let (mut l, handle) = listener();
        let flood: Vec<TcpStream> = (0..3 * MAX_PENDING)
            .map(|_| TcpStream::connect(handle.addr).unwrap())
            .collect();
        for _ in 0..10 {
            l.accept().unwrap();
        }
        assert_eq!(
            l.pending.len(),
            MAX_PENDING,
            "the listener keeps at most this many"
        );
        // The longest-waiting went first: their sockets were closed, so a read there ends.
        let mut first = &flood[0];
        first
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut first, &mut b).unwrap(),
            0,
            "dropped and closed"
        );
        // A real comm connecting behind the flood is accepted.
        let _ctrl = hello(&handle, 0, 7);
        let _data = hello(&handle, 1, 7);
        let comm = accept_one(&mut l);
        drop(comm);
        assert!(l.pending.len() <= MAX_PENDING && l.groups.is_empty());
    }

    #[test]
    fn unfinished_comms_are_bounded_and_dropped_after_the_connectors_time() {
        let (mut l, handle) = listener();
        // Control sockets of MAX_GROUPS comms whose data sockets never come.
        let _ctrls: Vec<TcpStream> = (0..MAX_GROUPS as u64)
            .map(|id| hello(&handle, 0, id))
            .collect();
        let t0 = Instant::now();
        while l.groups.len() < MAX_GROUPS {
            assert!(l.accept().unwrap().is_none());
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the hellos never came"
            );
        }
        // One more comm is refused (a Reject frame, then the close).
        let mut extra = hello(&handle, 0, 1000);
        extra
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let t0 = Instant::now();
        while !l.pending.is_empty() || t0.elapsed() < Duration::from_millis(50) {
            l.accept().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(5));
        }
        assert_eq!(l.groups.len(), MAX_GROUPS);
        let mut frame = Vec::new();
        std::io::Read::read_to_end(&mut extra, &mut frame).unwrap();
        assert!(!frame.is_empty(), "refused with a frame");
        // Past the connector's time they are dropped, and a real comm gets in.
        l.group_timeout = Duration::ZERO;
        std::thread::sleep(Duration::from_millis(5));
        l.accept().unwrap();
        assert!(l.groups.is_empty(), "unfinished comms dropped");
        l.group_timeout = CONNECT_TIMEOUT;
        let _ctrl = hello(&handle, 0, 2000);
        let _data = hello(&handle, 1, 2000);
        drop(accept_one(&mut l));
    }
}
