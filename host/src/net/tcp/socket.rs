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

/// How long writing a message of `len` bytes may take in all: `timeout`, and a second
/// per MiB on top (the default `--min-rate`).
pub fn write_deadline(len: usize, timeout: Duration) -> Instant {
    let slack = Duration::from_secs_f64(len as f64 / (1u64 << 20) as f64);
    Instant::now() + timeout + slack
}

/// Write all of `bufs`, one after another: no single wait longer than `timeout`, and
/// nothing past `deadline` however slowly the peer reads (a peer that takes a few bytes
/// now and then would otherwise hold the writer, each partial write starting the
/// socket's timeout again). The socket's write timeout is `timeout` again after.
pub fn write_all_within(
    mut stream: &TcpStream,
    bufs: &[&[u8]],
    timeout: Duration,
    deadline: Instant,
) -> io::Result<()> {
    let deadline_passed = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer read too slowly to take the message in time",
        )
    };
    let mut written = Ok(());
    'all: for buf in bufs {
        let mut buf: &[u8] = buf;
        while !buf.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                written = Err(deadline_passed());
                break 'all;
            }
            // A zero timeout would mean "none": `left` is not zero here.
            if let Err(e) = stream.set_write_timeout(Some(left.min(timeout))) {
                written = Err(e);
                break 'all;
            }
            match stream.write(buf) {
                Ok(0) => {
                    written = Err(io::ErrorKind::WriteZero.into());
                    break 'all;
                }
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) && Instant::now() >= deadline => {
                    written = Err(deadline_passed());
                    break 'all;
                }
                Err(e) => {
                    written = Err(e);
                    break 'all;
                }
            }
        }
    }
    let _ = stream.set_write_timeout(Some(timeout));
    written
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that reads a little now and then cannot stretch a write past its deadline
    /// (with the socket's timeout alone, each partial write started it again: 32 MiB
    /// read 64 KiB every 50 ms would have taken half a minute).
    #[test]
    fn a_slow_reader_cannot_stretch_a_write_past_its_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(6) {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        let stream = connect(addr, Duration::from_millis(500)).unwrap();
        let message = vec![7u8; 32 << 20];
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(1);
        let e = write_all_within(&stream, &[&message], Duration::from_millis(500), deadline)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        // The reader ends by itself (its loop is bounded): not waited for.
        drop((stream, reader));
    }
}
