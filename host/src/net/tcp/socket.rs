//! Socket set-up and the words for socket failures. Every socket gets read and write
//! timeouts, so no wait on the peer is unbounded.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Connect to `peer` within `timeout`, then bound every read and write by `timeout`.
pub fn connect(peer: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&peer, timeout)?;
    prepare(&stream, timeout)?;
    Ok(stream)
}

/// Timeouts on both directions; no Nagle delay (the control messages are small and
/// each is waited for).
pub fn prepare(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)
}

/// Read exactly `N` bytes.
pub fn read_array<const N: usize>(stream: &mut TcpStream) -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    stream.read_exact(&mut buf)?;
    Ok(buf)
}

/// Why a bounded read stopped.
#[derive(Debug)]
pub enum ReadStop {
    /// The whole deadline passed (not only one wait).
    Deadline,
    Io(io::Error),
}

/// Read exactly `buf.len()` bytes: no single wait longer than `timeout`, and with a
/// `deadline`, nothing past it however the bytes trickle in (each wait is shrunk to what
/// remains, so one byte now and then cannot stretch it).
pub fn read_exact_within(
    mut stream: &TcpStream,
    mut buf: &mut [u8],
    timeout: Duration,
    deadline: Option<Instant>,
) -> Result<(), ReadStop> {
    while !buf.is_empty() {
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadStop::Deadline);
            }
            // A zero timeout would mean "none": `left` is not zero here.
            stream
                .set_read_timeout(Some(left.min(timeout)))
                .map_err(ReadStop::Io)?;
        }
        match stream.read(buf) {
            Ok(0) => return Err(ReadStop::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) && deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(ReadStop::Deadline)
            }
            Err(e) => return Err(ReadStop::Io(e)),
        }
    }
    Ok(())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Write `message` without waiting on the peer (a non-blocking write of what fits,
/// which for a few dozen bytes on a fresh socket is all of it), then close: a refusal
/// never holds up the thread that makes it. Bytes the peer already sent are read off
/// first (without waiting), so that the close does not reset the connection and lose
/// the message.
pub fn write_and_close(stream: TcpStream, message: &[u8]) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    let written = (&stream).write(message);
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match (&stream).read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    match written {
        Ok(n) if n == message.len() => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "only {n} of {} bytes fit into the socket",
            message.len()
        ))),
        Err(e) => Err(e),
    }
}

/// A socket error in words: `what` is what was going on ("reading the ack").
pub fn why(e: &io::Error, timeout: Duration, what: &str) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
            "nothing moved for {} while {what} (--timeout)",
            crate::rdma::format_duration(timeout)
        ),
        io::ErrorKind::UnexpectedEof => format!("the peer closed the connection while {what}"),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            format!("the peer reset the connection while {what}")
        }
        _ => format!("{e} while {what}"),
    }
}

/// A per-connection token for the stream hellos: not secret, only distinct.
pub fn new_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}
