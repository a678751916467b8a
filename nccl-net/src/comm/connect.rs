//! `connect`: opens the control socket and the data sockets to a handle's address,
//! each with a hello carrying the handle's token, without ever blocking. NCCL calls
//! again with the same handle until a comm comes back; the progress in between lives
//! in a `Connecting` whose address sits in the handle's last 8 bytes. A registry of
//! the live ones makes sure only an address this plugin put there is followed.

use super::random_u64;
use super::send::SendComm;
use crate::config::Config;
use crate::error::{io_err, NetError, Result};
use crate::sock::{self, Io};
use crate::wire::{Handle, Hello, HANDLE_PROGRESS_AT};
use socket2::Socket;
use std::collections::HashSet;
use std::ffi::c_void;
use std::io::IoSlice;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long all of a comm's sockets may take to connect before `connect` fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

struct Conn {
    sock: Socket,
    up: bool,
    hello: [u8; Hello::LEN],
    sent: usize,
}

pub struct Connecting {
    handle: Handle,
    conns: Vec<Conn>,
    started: Instant,
    cfg: Config,
}

impl Connecting {
    fn start(handle: Handle, cfg: Config) -> Result<Self> {
        let conn_id = random_u64();
        let mut conns = Vec::new();
        for index in 0..=handle.streams {
            let sock = sock::start_connect(&handle.addr)
                .map_err(|e| io_err(format!("connect to {}", handle.addr), e))?;
            let hello = Hello {
                index,
                streams: handle.streams,
                token: handle.token,
                conn_id,
            };
            conns.push(Conn {
                sock,
                up: false,
                hello: hello.encode(),
                sent: 0,
            });
        }
        Ok(Self {
            handle,
            conns,
            started: Instant::now(),
            cfg,
        })
    }

    /// One step; `true` when every socket is up and has sent its hello.
    fn step(&mut self) -> Result<bool> {
        let addr = self.handle.addr;
        let mut all = true;
        for (i, c) in self.conns.iter_mut().enumerate() {
            if !c.up {
                match sock::connect_done(&c.sock) {
                    Ok(true) => c.up = true,
                    Ok(false) => {
                        all = false;
                        continue;
                    }
                    Err(e) => return Err(io_err(format!("connect to {addr} (socket {i})"), e)),
                }
            }
            while c.sent < Hello::LEN {
                match sock::send(&c.sock, &[IoSlice::new(&c.hello[c.sent..])])
                    .map_err(|e| io_err(format!("hello to {addr}"), e))?
                {
                    Io::Moved(n) => c.sent += n,
                    _ => break,
                }
            }
            all &= c.sent == Hello::LEN;
        }
        if !all && self.started.elapsed() > CONNECT_TIMEOUT {
            return Err(NetError::remote(format!(
                "connect to {addr}: not connected after {} s",
                CONNECT_TIMEOUT.as_secs()
            )));
        }
        Ok(all)
    }
}

/// Where a connect stands: over TCP, its sockets; over verbs, the RDMA CM's steps.
enum Progress {
    Tcp(Connecting),
    Verbs(Box<crate::verbs::setup::Connecting>),
}

impl Progress {
    /// One step: the send comm (as NCCL holds it) once connected. Over TCP a null
    /// pointer says "connected": `connect` then makes the comm of the sockets.
    fn step(&mut self) -> Result<Option<*mut c_void>> {
        match self {
            Progress::Tcp(c) => Ok(c.step()?.then_some(std::ptr::null_mut())),
            Progress::Verbs(c) => Ok(c.step()?.map(|comm| Box::into_raw(comm) as *mut c_void)),
        }
    }
}

/// One `connect` call on NCCL's `handle` bytes: `Some(comm)` when connected, `None`
/// when NCCL must call again.
pub fn connect(handle_bytes: &mut [u8; 128]) -> Result<Option<*mut c_void>> {
    let handle = Handle::decode(handle_bytes)
        .map_err(|e| NetError::invalid(format!("connect: bad handle: {}", e.0)))?;
    let slot: [u8; 8] = handle_bytes[HANDLE_PROGRESS_AT..]
        .try_into()
        .unwrap_or([0; 8]);
    let mut addr = usize::from_le_bytes(slot);
    if addr != 0 && !live().as_ref().is_some_and(|s| s.contains(&addr)) {
        return Err(NetError::invalid(
            "connect: the handle's progress slot holds an address this plugin did not put there",
        ));
    }
    if addr == 0 {
        let cfg = Config::from_env()?;
        let c = Box::new(if handle.verbs {
            Progress::Verbs(Box::new(crate::verbs::setup::Connecting::start(
                handle, cfg,
            )?))
        } else {
            Progress::Tcp(Connecting::start(handle, cfg)?)
        });
        addr = Box::into_raw(c) as usize;
        live().get_or_insert_with(HashSet::new).insert(addr);
        handle_bytes[HANDLE_PROGRESS_AT..].copy_from_slice(&addr.to_le_bytes());
    }
    // SAFETY: `addr` is in LIVE, so it came from Box::into_raw above and is not yet
    // freed; NCCL calls connect for one handle from one thread.
    let c = unsafe { &mut *(addr as *mut Progress) };
    let r = c.step();
    if matches!(r, Ok(None)) {
        return Ok(None);
    }
    // Done or failed: this Connecting ends here.
    live().as_mut().map(|s| s.remove(&addr));
    handle_bytes[HANDLE_PROGRESS_AT..].fill(0);
    // SAFETY: removed from LIVE just above, so this is the one free of the Box.
    let c = unsafe { Box::from_raw(addr as *mut Progress) };
    let done = r?;
    let Progress::Tcp(c) = *c else {
        return Ok(done);
    };
    let Connecting {
        handle, conns, cfg, ..
    } = c;
    let mut socks = conns.into_iter().map(|c| c.sock);
    let ctrl = socks
        .next()
        .ok_or_else(|| NetError::internal("no control socket"))?;
    let comm = SendComm::new(ctrl, socks.collect(), handle, cfg)?;
    Ok(Some(Box::into_raw(comm) as *mut c_void))
}
