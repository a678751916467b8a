//! Socket set-up and the words for socket failures. Every socket gets read and write
//! timeouts, so no wait on the peer is unbounded.

use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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
