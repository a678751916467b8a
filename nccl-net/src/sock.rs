//! Thin non-blocking socket wrappers: every `unsafe` that touches NCCL's memory for a
//! socket call is here, each with the promise it relies on. Writes pass
//! `MSG_NOSIGNAL`, so a peer that went away is an `EPIPE` error and never a `SIGPIPE`
//! that would kill the process NCCL runs in.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::net::SocketAddr;

/// What one non-blocking call did.
#[derive(Debug, PartialEq, Eq)]
pub enum Io {
    /// Moved this many bytes (more than zero).
    Moved(usize),
    /// The socket would block: nothing moved, try again later.
    Blocked,
    /// The peer closed its end (a read returned 0).
    Closed,
}

fn nonblocking_stream(addr: &SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?; // socket2 sets SOCK_CLOEXEC itself
    Ok(s)
}

/// A listening socket on `ip`, port chosen by the kernel, non-blocking.
pub fn listen(ip: std::net::IpAddr) -> io::Result<(Socket, SocketAddr)> {
    let addr = SocketAddr::new(ip, 0);
    let s = nonblocking_stream(&addr)?;
    s.bind(&SockAddr::from(addr))?;
    // Each comm opens 1 + streams sockets at once; a deep backlog keeps many comms'
    // connects from being refused while NCCL has not called accept yet.
    s.listen(1024)?;
    let local = s
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("listening socket has no IP address"))?;
    Ok((s, local))
}

/// The next connection waiting on `l`, non-blocking with `TCP_NODELAY`; `None` if none.
pub fn accept(l: &Socket) -> io::Result<Option<Socket>> {
    match l.accept() {
        Ok((s, _)) => {
            s.set_nonblocking(true)?;
            s.set_nodelay(true)?;
            Ok(Some(s))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

/// Starts a connection to `addr` without waiting for it.
pub fn start_connect(addr: &SocketAddr) -> io::Result<Socket> {
    let s = nonblocking_stream(addr)?;
    s.set_nodelay(true)?;
    match s.connect(&SockAddr::from(*addr)) {
        Ok(()) => Ok(s),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(s),
        Err(e) => Err(e),
    }
}

/// Whether a connection `start_connect` began is up: `Ok(true)` once it is, the
/// connect's error if it failed (refused, unreachable).
pub fn connect_done(s: &Socket) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(s),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, timeout 0 (never blocks).
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        return Ok(false);
    }
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    // POLLHUP/POLLERR without SO_ERROR: still a failure.
    if pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "connection failed",
        ));
    }
    Ok(pfd.revents & libc::POLLOUT != 0)
}

fn sent(r: io::Result<usize>) -> io::Result<Io> {
    match r {
        Ok(0) => Ok(Io::Blocked),
        Ok(n) => Ok(Io::Moved(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Io::Blocked),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Io::Blocked),
        Err(e) => Err(e),
    }
}

/// Sends from the slices in order, as much as the socket takes now.
pub fn send(s: &Socket, bufs: &[IoSlice<'_>]) -> io::Result<Io> {
    sent(s.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL))
}

/// Receives into `buf` (owned memory).
pub fn recv(s: &Socket, buf: &mut [u8]) -> io::Result<Io> {
    // SAFETY: `[u8]` and `[MaybeUninit<u8>]` have the same layout; recv only writes
    // initialized bytes into it, so `buf` stays initialized.
    let raw = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
    received(s.recv(raw))
}

fn received(r: io::Result<usize>) -> io::Result<Io> {
    match r {
        Ok(0) => Ok(Io::Closed),
        Ok(n) => Ok(Io::Moved(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Io::Blocked),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Io::Blocked),
        Err(e) => Err(e),
    }
}

/// Receives into NCCL's memory at `dst`, at most `len` bytes.
///
/// # Safety
/// `dst..dst+len` must be writable memory that nothing else reads or writes until the
/// request it belongs to completes: NCCL's promise for an `irecv` buffer, which stays
/// ours from `irecv` until `test` reports the request done (or the comm is closed).
pub unsafe fn recv_raw(s: &Socket, dst: *mut u8, len: usize) -> io::Result<Io> {
    // SAFETY: the caller's promise; MaybeUninit because NCCL's buffer may never have
    // been written (recv does not read it). MSG_WAITALL: on a blocking socket (an I/O
    // thread's data socket) the kernel fills the whole range before waking us, one
    // system call per piece, returning less only at its timeout, a signal or EOF.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut MaybeUninit<u8>, len) };
    received(s.recv_with_flags(buf, libc::MSG_WAITALL))
}

/// Makes `s` blocking with `POLL_MS` timeouts on reads and writes: for a socket that
/// only an I/O thread uses, so that a whole piece is one call, and a stuck peer still
/// hands control back to the thread (to look at its stop flag) every `POLL_MS`.
pub fn set_thread_io(s: &Socket) -> io::Result<()> {
    let t = Some(std::time::Duration::from_millis(POLL_MS as u64));
    s.set_nonblocking(false)?;
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)
}

/// NCCL's memory at `ptr` as bytes.
///
/// # Safety
/// `ptr..ptr+len` must be readable, initialized memory that nobody writes while the
/// slice lives: NCCL's promise for an `isend` buffer until `test` reports it done, and
/// for an `irecv` buffer's bytes this plugin itself received into it.
pub unsafe fn raw_bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// An address in NCCL's memory (an `isend` or `irecv` buffer), carried from NCCL's
/// call to the comm's I/O threads.
///
/// SAFETY contract, relied on wherever one is turned back into memory: NCCL keeps
/// the buffer allocated and leaves it alone from `isend`/`irecv` until `test` reports
/// the request done, or until the comm is closed. A request is reported done only
/// when no I/O thread holds a piece of it any more (the sender counts pieces in the
/// writers' hands, the receiver marks pieces being read); `close` joins the threads
/// before it returns. So a thread touches a `RawBuf` only while NCCL's promise holds.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf(pub *mut u8);

// SAFETY: a plain address; what may be done through it is the contract above.
unsafe impl Send for RawBuf {}
// SAFETY: as above; every access goes through the contract's checks.
unsafe impl Sync for RawBuf {}

/// How long an I/O thread waits in one `poll` before it looks at its stop flag again.
pub const POLL_MS: i32 = 100;

/// Waits until `s` is readable (`write` false) or writable, or `POLL_MS` passed. An
/// error or hang-up counts as ready: the next read or write reports it.
pub fn wait(s: &Socket, write: bool) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(s),
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    };
    // SAFETY: one valid pollfd, a bounded timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// How `read_full` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Fill {
    Done,
    /// The peer closed after this many bytes.
    Eof(usize),
    /// The stop flag was raised (the comm is closing).
    Stopped,
}

/// Reads exactly `len` bytes into `dst`, waiting as needed (an I/O thread's read).
///
/// # Safety
/// As `recv_raw`: `dst..dst+len` is writable and nobody else's until the request
/// completes (see [`RawBuf`]).
pub unsafe fn read_full(
    s: &Socket,
    dst: *mut u8,
    len: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> io::Result<Fill> {
    let mut got = 0;
    while got < len {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(Fill::Stopped);
        }
        // SAFETY: `got < len`: inside the caller's range.
        match unsafe { recv_raw(s, dst.add(got), len - got) }? {
            Io::Moved(n) => got += n,
            Io::Closed => return Ok(Fill::Eof(got)),
            Io::Blocked => wait(s, false)?,
        }
    }
    Ok(Fill::Done)
}

/// Writes every byte of `segs` in order, waiting as needed (an I/O thread's write);
/// `false` if the stop flag was raised first.
pub fn write_all(
    s: &Socket,
    segs: &[&[u8]],
    stop: &std::sync::atomic::AtomicBool,
) -> io::Result<bool> {
    let total: usize = segs.iter().map(|x| x.len()).sum();
    let mut sent = 0;
    while sent < total {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        let mut skip = sent;
        let mut left = Vec::with_capacity(segs.len());
        for x in segs {
            if skip >= x.len() {
                skip -= x.len();
                continue;
            }
            left.push(IoSlice::new(&x[skip..]));
            skip = 0;
        }
        match send(s, &left)? {
            Io::Moved(n) => sent += n,
            _ => wait(s, true)?,
        }
    }
    Ok(true)
}
